/* SPDX-License-Identifier: MIT */
/*
 * client.c - the client life cycle: pending, registered, detaching, retired,
 * finalized, freed. See client.h for who may do what in which state.
 *
 * Freeing is deferred to the end of the epoll batch (client_bury): one batch
 * may carry several events for one client (its socket, its pidfd, the
 * retire eventfd), and an event after the one that finalized it must still
 * find the struct, marked freed, rather than freed memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "client.h"
#include "log.h"

struct client *client_new(struct server *s, int sock)
{
	struct client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->sock_w.kind = WATCH_CLIENT_SOCK;
	c->pid_w.kind = WATCH_CLIENT_PID;
	c->sock = sock;
	c->pidfd = -1;
	c->shm.fd = -1;
	c->state = CLIENT_HELLO;
	c->next = s->pending;
	if (s->pending)
		s->pending->prev = c;
	s->pending = c;
	s->npending++;
	return c;
}

static void pending_unlink(struct server *s, struct client *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		s->pending = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	s->npending--;
}

void client_register(struct server *s, struct client *c)
{
	struct registry *r = &s->reg;

	pending_unlink(s, c);
	pthread_mutex_lock(&r->lock);
	c->prev = r->tail;
	if (r->tail)
		r->tail->next = c;
	else
		r->head = c;
	r->tail = c;
	__atomic_store_n(&c->state, CLIENT_LIVE, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&r->lock);
	__atomic_add_fetch(&r->live, 1, __ATOMIC_RELAXED);
	if (c->tenant)
		__atomic_add_fetch(&c->tenant->clients, 1, __ATOMIC_RELAXED);
	tenant_uid_count(&s->tenants, c->uid, 1); /* max_clients_per_uid */
}

static void registry_unlink(struct server *s, struct client *c)
{
	struct registry *r = &s->reg;

	pthread_mutex_lock(&r->lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		r->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		r->tail = c->prev;
	pthread_mutex_unlock(&r->lock);
	c->prev = c->next = NULL;
	__atomic_sub_fetch(&r->live, 1, __ATOMIC_RELAXED);
	if (c->tenant)
		__atomic_sub_fetch(&c->tenant->clients, 1, __ATOMIC_RELAXED);
	tenant_uid_count(&s->tenants, c->uid, -1);
}

void client_unwatch(struct server *s, struct client *c)
{
	if (!c->watched)
		return;
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->sock, NULL);
	if (c->pidfd >= 0)
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->pidfd, NULL);
	c->watched = false;
}

bool client_begin_detach(struct client *c, const char *why)
{
	uint32_t live = CLIENT_LIVE;

	if (!__atomic_compare_exchange_n(&c->state, &live, CLIENT_DETACHING, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return false;
	c->why = why;
	return true;
}

void client_finalize(struct server *s, struct client *c)
{
	uint32_t released = 0;

	if (c->freed)
		return;
	bool hello = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == CLIENT_HELLO;

	client_unwatch(s, c);
	/* Onloads still landing for completions it never got: wait for them
	 * here, without the pool's mutex, so releasing the leases below does
	 * not hold every other client of the pool while they land. */
	for (uint32_t k = 0; c->lanes && k < c->nlanes; k++) {
		struct park_list *p = &c->lanes[k].park;

		for (uint32_t i = 0; i < p->n; i++)
			engine_fence_wait(p->v[i].eng, p->v[i].fence);
		park_fini(p);
	}
	free(c->lanes);
	c->lanes = NULL;
	if (__atomic_load_n(&c->uds_state, __ATOMIC_ACQUIRE) == UDS_PARKED)
		engine_fence_wait(c->uds_park.eng, c->uds_park.fence);
	free(c->uds_out);
	c->uds_out = NULL;
	if (!hello && c->tenant) {
		released = shard_set_release_owner(c->tenant->pools[c->pool].set,
						   c->id);
	}
	shm_destroy(&c->shm);
	close(c->sock);
	if (c->pidfd >= 0)
		close(c->pidfd);
	c->sock = c->pidfd = -1;
	/* Unlink last: a client counts in stats until nothing of it is left,
	 * so "clients == 1" never shows while its fds are still open. */
	if (hello) {
		pending_unlink(s, c);
	} else {
		registry_unlink(s, c);
		log_info("client %" PRIu32 " detached (%s): uid %" PRIu32 " pid %"
			 PRIu32 " '%s'; released %" PRIu32 " leases after %" PRIu64
			 " operations", c->id, c->why ? c->why : "shutdown", c->uid,
			 c->pid, c->name, released,
			 __atomic_load_n(&c->ops, __ATOMIC_RELAXED));
	}
	c->freed = true;
	c->qnext = s->graveyard;
	s->graveyard = c;
}

void client_bury(struct server *s)
{
	while (s->graveyard) {
		struct client *c = s->graveyard;

		s->graveyard = c->qnext;
		free(c);
	}
}

int client_lanes_init(struct client *c)
{
	c->lanes = calloc(c->shm.lanes, sizeof(*c->lanes));
	if (!c->lanes)
		return -ENOMEM;
	c->nlanes = c->shm.lanes;
	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct lane *l = &c->lanes[k];

		l->c = c;
		l->index = k;
		l->ctl = shm_lane_ctl(&c->shm, k);
		l->sqes = shm_lane_sqes(&c->shm, k);
		l->cqes = shm_lane_cqes(&c->shm, k);
	}
	c->lanes_live = c->nlanes;
	return 0;
}

void client_retire(struct server *s, struct client *c)
{
	uint64_t one = 1;

	__atomic_store_n(&c->state, CLIENT_RETIRED, __ATOMIC_RELEASE);
	pthread_mutex_lock(&s->retire_lock);
	c->qnext = s->retired;
	s->retired = c;
	pthread_mutex_unlock(&s->retire_lock);
	if (write(s->retire_fd, &one, sizeof(one)) < 0) {
		/* The counter cannot overflow at one write per client. */
	}
}

void client_reap_retired(struct server *s)
{
	struct client *list;
	uint64_t n;

	if (read(s->retire_fd, &n, sizeof(n)) < 0) {
		/* EAGAIN: a previous read took this wake-up's count. */
	}
	pthread_mutex_lock(&s->retire_lock);
	list = s->retired;
	s->retired = NULL;
	pthread_mutex_unlock(&s->retire_lock);
	while (list) {
		struct client *c = list;

		list = c->qnext;
		client_finalize(s, c);
	}
}
