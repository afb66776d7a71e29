/* SPDX-License-Identifier: MIT */
/*
 * worker_uds.c - requests on the attach socket, served by the worker of
 * the client's lane 0 in order with its rings (worker.c's top comment,
 * "uds requests", says how and why).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "client.h"
#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "worker.h"
#include "worker_internal.h"

void worker_uds_submit(struct client *c)
{
	struct worker *w = c->worker;

	/* U1: publishes c->uds_sqe and c->uds_out; pairs with the load-acquire
	 * of uds_state at U2 (after the one of uds_gen at U3). */
	__atomic_store_n(&c->uds_state, UDS_QUEUED, __ATOMIC_RELEASE);
	__atomic_fetch_add(&w->uds_gen, 1, __ATOMIC_RELEASE);
	worker_kick(w);
}

/* Before any ring of this pass: which clients have a request handed over. */
bool uds_note(struct worker *w)
{
	/* U3: pairs with the fetch_add at U1. */
	uint32_t gen = __atomic_load_n(&w->uds_gen, __ATOMIC_ACQUIRE);

	if (gen == w->uds_gen_seen && !w->uds_busy && !w->uds_rescan)
		return false;
	w->uds_gen_seen = gen;
	w->uds_rescan = false;
	for (uint32_t i = 0; i < w->n; i++) {
		struct client *c = w->lanes[i]->c;

		if (w->lanes[i]->index)
			continue; /* uds requests go to lane 0's worker */
		/* U2 */
		if (__atomic_load_n(&c->uds_state, __ATOMIC_ACQUIRE) == UDS_QUEUED)
			c->uds_seen = true;
	}
	return true;
}

/* Whether c's request must wait: for ring entries c published before it
 * (as this pass read sq_tail, after uds_note), or for c's parked
 * completion of the same user. */
static bool uds_waits(struct worker *w, struct client *c)
{
	const struct lane *l = &c->lanes[0];
	uint64_t user;

	/* Lane 0's entries only: libkvpool sends a uds request, like any
	 * synchronous call, with nothing in flight on any lane. */
	if (l->ndq || l->sq_head != l->sq_tail_seen)
		return true;
	return l->park.n && ops_sqe_user(w->s, c, &c->uds_sqe, &user) &&
	       park_has_user(&l->park, user);
}

int worker_uds_reply(int sock, const struct kvp_cqe *cqe, const void *out)
{
	struct iovec iov[2] = {
		{ .iov_base = (void *)cqe, .iov_len = sizeof(*cqe) },
		{ .iov_base = (void *)out, .iov_len = cqe->out_bytes },
	};
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };

	return sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 ? -errno : 0;
}

/* Send the reply and read the socket again; -errno when c must go. */
static int uds_answer(struct worker *w, struct client *c,
		      const struct kvp_cqe *cqe)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP,
				  .data.ptr = &c->sock_w };
	int ret = worker_uds_reply(c->sock, cqe, c->uds_out);

	/* Idle before EPOLLIN is back: the main thread reads the next request
	 * only once it sees this. */
	__atomic_store_n(&c->uds_state, UDS_IDLE, __ATOMIC_RELEASE);
	/* ENOENT when the main thread has let go of the socket: nothing to do. */
	if (!ret)
		epoll_ctl(w->s->epfd, EPOLL_CTL_MOD, c->sock, &ev);
	return ret;
}

/* Run c's noted request, or publish its parked reply; -errno when c must
 * go (*why says why), 1 when something was done, 0 when it still waits. */
static int uds_serve(struct worker *w, struct client *c, const char **why)
{
	struct kvp_sqe sqe;
	struct kvp_cqe cqe;
	/* No retry for the reclaimer: a uds request is not held for it. */
	struct op_wait wt = { 0 };
	int ret;

	if (__atomic_load_n(&c->uds_state, __ATOMIC_RELAXED) == UDS_PARKED) {
		if (!engine_fence_done(c->uds_park.eng, c->uds_park.fence))
			return 0;
		w->parked--;
		cqe = c->uds_park.cqe;
	} else {
		if (!c->uds_seen || uds_waits(w, c))
			return 0;
		c->uds_seen = false;
		sqe = c->uds_sqe;
		sqe.out_off = 0;
		if (sqe.out_len > UDS_RESULT_MAX)
			sqe.out_len = UDS_RESULT_MAX;
		/* No arena: operations with input are refused (proto.h). */
		ops_execute(w->s, c, &sqe, NULL, 0, c->uds_out, UDS_RESULT_MAX,
			    &w->scratch, &cqe, &wt);
		if (wt.retry) {
			/* Nothing done: the disk thread reads what it needs
			 * (a prepare of a user only on disk). Noted again, run
			 * on a later pass; it was answered with nothing once. */
			c->uds_seen = true;
			return 0;
		}
		if (wt.fence) {
			c->uds_park = (struct park){ .cqe = cqe, .eng = wt.eng,
						     .fence = wt.fence,
						     .user = sqe.user };
			__atomic_store_n(&c->uds_state, UDS_PARKED, __ATOMIC_RELAXED);
			w->parked++;
			return 1;
		}
	}
	ret = uds_answer(w, c, &cqe);
	if (ret == -EAGAIN)
		*why = "does not read its uds replies";
	else if (ret)
		*why = NULL; /* hung up: the main thread sees it too */
	return ret ? ret : 1;
}

/* After the rings of this pass: the uds requests noted before them. */
uint32_t uds_pass(struct worker *w)
{
	uint32_t done = 0, i = 0;

	w->uds_busy = 0;
	while (i < w->n) {
		struct client *c = w->lanes[i]->c;
		const char *why = NULL;
		int ret;

		if (w->lanes[i]->index) {
			i++;
			continue;
		}
		ret = uds_serve(w, c, &why);
		if (ret < 0) {
			drop_lane(w, i, why ? why : "hung up");
			continue;
		}
		done += (uint32_t)ret;
		w->uds_busy += c->uds_seen ||
			__atomic_load_n(&c->uds_state, __ATOMIC_RELAXED) == UDS_PARKED;
		i++;
	}
	return done;
}
