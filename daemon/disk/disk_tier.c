/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: index, staging and thread share one lock, dt->mu. */
/*
 * disk_tier.c - the disk tier's index, its staging memory and its thread
 * (disk_tier.h says what it is for; disk_scan.c rebuilds it on start).
 *
 * Locking: dt->mu guards everything but the bytes of staging slots and
 * disk slots an entry owns while the thread works on it (WRITING,
 * READING): the thread encodes, writes, reads and decodes those unlocked.
 * A caller copies pages into staging slots it reserved, unlocked too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

#include "clock.h"
#include "disk_tier_internal.h"

void disk_logf(struct disk_tier *dt, int prio, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (dt->log)
		dt->log(prio, msg);
	else
		fprintf(stderr, "kvpoold: %s\n", msg);
}

/* ------------------------------------------------------------ bookkeeping */

void disk_key_name(const struct disk_key *k, char *out, size_t n)
{
	static const char *const kinds[] = { [DISK_KIND_CHUNK] = "chunk",
					     [DISK_KIND_PREFIX] = "prefix page" };

	if (!k->kind || k->kind > DISK_KIND_PREFIX || !kinds[k->kind]) {
		snprintf(out, n, "user %" PRIu64, k->user);
		return;
	}
	snprintf(out, n, "%s %02x%02x%02x%02x%02x%02x%02x%02x", kinds[k->kind],
		 k->hash[0], k->hash[1], k->hash[2], k->hash[3], k->hash[4],
		 k->hash[5], k->hash[6], k->hash[7]);
}

struct disk_use *disk_use_of(struct disk_tier *dt, uint64_t tenant)
{
	for (uint32_t i = 0; i < dt->nuse; i++)
		if (dt->use[i].tenant == tenant)
			return &dt->use[i];
	if (dt->nuse == DISK_TENANTS_MAX)
		return &dt->use[DISK_TENANTS_MAX - 1]; /* shared past the cap */
	dt->use[dt->nuse].tenant = tenant;
	return &dt->use[dt->nuse++];
}

static uint32_t key_hash(const struct disk_tier *dt, const struct disk_key *k)
{
	uint64_t u = k->kind ? 0 : k->user; /* kind != 0: user is an alias */
	uint64_t x = k->tenant ^ (u * 0x9e3779b97f4a7c15ull) ^ k->pool, h;

	/* A block hash or chunk id is uniform already: 8 of its bytes. */
	memcpy(&h, k->hash, sizeof(h));
	x ^= h + k->kind;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 32;
	return (uint32_t)(x % dt->nbucket);
}

static bool key_eq(const struct disk_key *a, const struct disk_key *b)
{
	return a->tenant == b->tenant && a->pool == b->pool && a->kind == b->kind &&
	       (a->kind || a->user == b->user) &&
	       !memcmp(a->hash, b->hash, sizeof(a->hash));
}

static struct disk_entry *index_find(struct disk_tier *dt, const struct disk_key *k)
{
	struct disk_entry *e = dt->bucket[key_hash(dt, k)];

	while (e && !key_eq(&e->k, k))
		e = e->hnext;
	return e;
}

void disk_index_insert(struct disk_tier *dt, struct disk_entry *e)
{
	uint32_t b = key_hash(dt, &e->k);
	struct disk_use *u = disk_use_of(dt, e->k.tenant);

	e->hnext = dt->bucket[b];
	dt->bucket[b] = e;
	disk_use_count(u, e, 1);
}

void disk_index_remove(struct disk_tier *dt, struct disk_entry *e)
{
	struct disk_entry **p = &dt->bucket[key_hash(dt, &e->k)];
	struct disk_use *u = disk_use_of(dt, e->k.tenant);

	while (*p && *p != e)
		p = &(*p)->hnext;
	if (*p)
		*p = e->hnext;
	disk_use_count(u, e, -1);
}

void disk_lru_push(struct disk_tier *dt, struct disk_entry *e)
{
	list_add_tail(&e->lru, &dt->lru);
}

static void lru_unlink(struct disk_entry *e)
{
	list_del(&e->lru);
}

static void queue_push(struct disk_queue *q, struct disk_entry *e)
{
	e->qnext = NULL;
	if (q->tail)
		q->tail->qnext = e;
	else
		q->head = e;
	q->tail = e;
}

static void queue_unlink(struct disk_queue *q, struct disk_entry *e)
{
	struct disk_entry **p = &q->head, *prev = NULL;

	while (*p && *p != e) {
		prev = *p;
		p = &(*p)->qnext;
	}
	if (!*p)
		return;
	*p = e->qnext;
	if (q->tail == e)
		q->tail = prev;
}

struct disk_entry *disk_entry_new(uint32_t npages)
{
	struct disk_entry *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	INIT_LIST_HEAD(&e->lru);
	e->npages = npages;
	e->slot = malloc(npages * sizeof(*e->slot));
	e->stage = malloc(npages * sizeof(*e->stage));
	if (!e->slot || !e->stage) {
		free(e->slot);
		free(e->stage);
		free(e);
		return NULL;
	}
	for (uint32_t i = 0; i < npages; i++)
		e->slot[i] = e->stage[i] = DISK_NONE;
	return e;
}

static void stage_release(struct disk_tier *dt, struct disk_entry *e)
{
	/* Pushed in reverse so the lowest comes back on top. */
	for (uint32_t i = e->npages; i-- > 0;)
		if (e->stage[i] != DISK_NONE) {
			dt->stage_free[dt->nstage_free++] = e->stage[i];
			e->stage[i] = DISK_NONE;
		}
}

static bool stage_reserve(struct disk_tier *dt, struct disk_entry *e)
{
	if (dt->nstage_free < e->npages)
		return false;
	for (uint32_t i = 0; i < e->npages; i++)
		e->stage[i] = dt->stage_free[--dt->nstage_free];
	return true;
}

static char *stage_ptr(const struct disk_tier *dt, uint32_t s)
{
	return dt->stage_base + (uint64_t)s * dt->slot_bytes;
}

/*
 * Give e's disk slots back. With invalidate, page 0's slot is first marked
 * free on disk (by the thread) so a restart does not bring the history back:
 * without its page 0 a snapshot has no prefix to serve.
 */
static void slots_release(struct disk_tier *dt, struct disk_entry *e,
			  bool invalidate)
{
	struct disk_use *u = disk_use_of(dt, e->k.tenant);

	for (uint32_t i = e->npages; i-- > 0;) {
		if (e->slot[i] == DISK_NONE)
			continue;
		u->slots--;
		if (i == 0 && invalidate && dt->ninval < dt->inval_cap)
			dt->inval[dt->ninval++] = e->slot[i];
		else
			dt->free_slots[dt->nfree++] = e->slot[i];
		e->slot[i] = DISK_NONE;
	}
	if (invalidate)
		pthread_cond_signal(&dt->work);
}

static void entry_free(struct disk_entry *e)
{
	free(e->slot);
	free(e->stage);
	free(e->dst);
	free(e->hblk);
	free(e);
}

void disk_hblk_release(struct disk_tier *dt, struct disk_entry *e)
{
	for (uint32_t i = e->npages; e->hblk && i-- > 0;)
		if (e->hblk[i] != DISK_NONE) {
			dt->hblk_free[dt->nhblk_free++] = e->hblk[i];
			e->hblk[i] = DISK_NONE;
		}
}

/* Forget e entirely (it is no longer in the index or on a list). */
void disk_entry_destroy(struct disk_tier *dt, struct disk_entry *e,
			  bool invalidate)
{
	stage_release(dt, e);
	disk_hblk_release(dt, e);
	slots_release(dt, e, invalidate);
	entry_free(e);
}

void disk_lru_unlink_drop(struct disk_tier *dt, struct disk_entry *e)
{
	lru_unlink(e);
	disk_index_remove(dt, e);
	disk_entry_destroy(dt, e, false);
}

/* ------------------------------------------------------------ callers */

void disk_tier_set_quota(struct disk_tier *dt, uint64_t tenant, uint64_t slots)
{
	pthread_mutex_lock(&dt->mu);
	disk_use_of(dt, tenant)->quota = slots;
	pthread_mutex_unlock(&dt->mu);
}

/* Drop e wherever it is; the thread frees what it holds when done. */
static void entry_drop(struct disk_tier *dt, struct disk_entry *e)
{
	disk_index_remove(dt, e);
	if (e->held) {
		/* Its holder may have I/O into its memory on: the holder's
		 * poll frees it (disk_tier_get_into). Held, it is on no
		 * queue but the thread's and on no LRU. */
		e->gone = true;
		return;
	}
	switch (e->state) {
	case DS_WRITING:
	case DS_READING:
		e->gone = true;
		return;
	case DS_STAGED:
		queue_unlink(&dt->wq, e);
		break;
	case DS_ONDISK:
		lru_unlink(e);
		break;
	case DS_READY:
		break;
	}
	disk_entry_destroy(dt, e, true);
}

/*
 * READY entries nobody took for a second (their prepare's client died, or
 * gave up) give their staging back: those read from disk go back to ONDISK
 * (their slots still hold them). true when n staging slots are free now.
 */
static bool stage_reclaim_ready(struct disk_tier *dt, uint32_t n)
{
	uint64_t old = disk_now_ns() - 1000000000ull;

	for (uint32_t b = 0; b < dt->nbucket && dt->nstage_free < n; b++)
		for (struct disk_entry *e = dt->bucket[b]; e; e = e->hnext)
			if (e->state == DS_READY && !e->held && e->ready_ns < old &&
			    e->slot[0] != DISK_NONE) {
				stage_release(dt, e);
				e->state = DS_ONDISK;
				disk_lru_push(dt, e);
			}
	return dt->nstage_free >= n;
}

/*
 * Locked: say why a demotion was refused, once a second at most (eviction
 * can refuse thousands a second): the history is bigger than the disk
 * tier or its tenant's quota, or staging is full because the disk writes
 * slower than eviction demotes. Before this line such drops were counted
 * (disk_dropped_pages) and never logged.
 */
static void put_drop_log(struct disk_tier *dt, const struct disk_key *k, uint32_t npages)
{
	struct disk_use *u = disk_use_of(dt, k->tenant);
	uint64_t now = mono_ns();
	char what[80];

	if (dt->put_drop_logged_ns && now - dt->put_drop_logged_ns < 1000000000ull) {
		dt->put_drops_quiet++;
		return;
	}
	disk_key_name(k, what, sizeof(what));
	if (npages > disk_store_slots(dt->st) || (u->quota && npages > u->quota))
		disk_logf(dt, LOG_WARNING, "disk tier full: the %" PRIu32 " pages of %s "
			  "are more than disk_size%s holds; dropped (%" PRIu64
			  " more refused since the last line); raise disk_size",
			  npages, what, u->quota ? " or the tenant's quota" : "",
			  dt->put_drops_quiet);
	else
		disk_logf(dt, LOG_WARNING, "disk tier staging full: the %" PRIu32
			  " pages of %s dropped (%" PRIu64 " more refused since the "
			  "last line); the disk writes slower than eviction demotes",
			  npages, what, dt->put_drops_quiet);
	dt->put_drop_logged_ns = now;
	dt->put_drops_quiet = 0;
}

int disk_tier_put(struct disk_tier *dt, const struct disk_key *k, uint64_t start,
		  uint64_t len, uint32_t npages, void *const *pages)
{
	struct disk_entry *e, *old;
	struct disk_use *u;

	if (!npages)
		return 0;
	e = disk_entry_new(npages);
	if (!e)
		return -ENOMEM;
	e->k = *k;
	e->start = start;
	e->len = len;
	pthread_mutex_lock(&dt->mu);
	u = disk_use_of(dt, k->tenant);
	if (npages > disk_store_slots(dt->st) || (u->quota && npages > u->quota) ||
	    (!stage_reserve(dt, e) &&
	     (!stage_reclaim_ready(dt, npages) || !stage_reserve(dt, e)))) {
		u->dropped_pages += npages;
		put_drop_log(dt, k, npages);
		pthread_mutex_unlock(&dt->mu);
		entry_free(e);
		return -ENOSPC;
	}
	pthread_mutex_unlock(&dt->mu);
	/* The staging slots are ours: copy without the lock. */
	for (uint32_t i = 0; i < npages; i++)
		memcpy(stage_ptr(dt, e->stage[i]) + DISK_PAYLOAD_OFF, pages[i],
		       dt->page_bytes);
	pthread_mutex_lock(&dt->mu);
	old = index_find(dt, k);
	if (old)
		entry_drop(dt, old); /* an older copy: the new one replaces it */
	e->snap = dt->next_snap++;
	e->state = DS_STAGED;
	disk_index_insert(dt, e);
	queue_push(&dt->wq, e);
	pthread_cond_signal(&dt->work);
	pthread_mutex_unlock(&dt->mu);
	return 0;
}

static void hist_fill(struct disk_hist *out, struct disk_entry *e)
{
	*out = (struct disk_hist){ .entry = e, .start = e->start, .len = e->len,
				   .npages = e->npages };
}

int disk_tier_get(struct disk_tier *dt, const struct disk_key *k,
		  struct disk_hist *out)
{
	struct disk_entry *e;
	int ret = -EINPROGRESS;

	pthread_mutex_lock(&dt->mu);
	e = index_find(dt, k);
	if (!e) {
		ret = -ENOENT;
		goto out;
	}
	switch (e->state) {
	case DS_STAGED:
		/* Not written yet: the staging copy is the page. */
		queue_unlink(&dt->wq, e);
		e->state = DS_READY;
		e->ready_ns = disk_now_ns();
		/* fall through */
	case DS_READY:
		/* Fresh again: staging is not reclaimed under the caller,
		 * who copies out of it next. */
		e->ready_ns = disk_now_ns();
		hist_fill(out, e);
		ret = 0;
		break;
	case DS_WRITING:
		e->want = true;
		break;
	case DS_ONDISK:
		if (e->npages > dt->nstage) {
			/* Written by a daemon with more staging (a larger
			 * host_mem): it can never come back through this one. */
			char what[80];

			disk_key_name(&e->k, what, sizeof(what));
			disk_logf(dt, LOG_WARNING, "disk tier: %s: its %"
				  PRIu32 " pages on disk exceed the staging memory (%"
				  PRIu32 " pages, a quarter of host_mem); dropped; "
				  "raise host_mem to keep such histories", what,
				  e->npages, dt->nstage);
			entry_drop(dt, e);
			ret = -ENOENT;
			break;
		}
		if (!stage_reserve(dt, e) &&
		    (!stage_reclaim_ready(dt, e->npages) || !stage_reserve(dt, e)))
			break; /* staging is busy: the retry tries again */
		lru_unlink(e);
		e->state = DS_READING;
		queue_push(&dt->rq, e);
		pthread_cond_signal(&dt->work);
		break;
	case DS_READING:
		break;
	}
out:
	pthread_mutex_unlock(&dt->mu);
	return ret;
}

void disk_tier_wait(struct disk_tier *dt, const struct disk_key *k)
{
	struct disk_entry *e;

	pthread_mutex_lock(&dt->mu);
	while ((e = index_find(dt, k)) &&
	       (e->state == DS_WRITING || e->state == DS_READING))
		pthread_cond_wait(&dt->done, &dt->mu);
	pthread_mutex_unlock(&dt->mu);
}

/* ------------------------------------------------------------ into */

int disk_tier_register_host(struct disk_tier *dt, void *base, uint64_t bytes)
{
	if (!disk_tier_into_ok(dt))
		return -EINVAL;
	pthread_mutex_lock(&dt->mu);
	if (dt->nreg_q == DISK_REG_Q) {
		pthread_mutex_unlock(&dt->mu);
		return disk_store_register(dt->st, base, bytes, dt->page_bytes);
	}
	/* The disk thread registers it; reads before that go unfixed. */
	dt->reg_q[dt->nreg_q].base = base;
	dt->reg_q[dt->nreg_q++].bytes = bytes;
	pthread_cond_signal(&dt->work);
	pthread_mutex_unlock(&dt->mu);
	return 0;
}

void disk_tier_unregister_host(struct disk_tier *dt, void *base)
{
	pthread_mutex_lock(&dt->mu);
	for (uint32_t i = 0; i < dt->nreg_q; i++)
		if (dt->reg_q[i].base == base) {
			/* Never registered: forget the request. */
			dt->reg_q[i] = dt->reg_q[--dt->nreg_q];
			pthread_mutex_unlock(&dt->mu);
			return;
		}
	/* Being registered: wait, or the kernel would keep pages the
	 * caller is about to free under an address reused later. */
	while (dt->registering == base)
		pthread_cond_wait(&dt->done, &dt->mu);
	pthread_mutex_unlock(&dt->mu);
	disk_store_unregister(dt->st, base);
}

bool disk_tier_into_ok(const struct disk_tier *dt)
{
	/* The page alone fills the blocks after the header's (no padding to
	 * write past a frame's end). */
	return dt->page_bytes % DISK_ALIGN == 0 &&
	       dt->slot_bytes == DISK_PAYLOAD_OFF + dt->page_bytes;
}

/*
 * Locked: start reading held e (ONDISK) into its dst, its headers into
 * header blocks; where there are not enough of those, into staging (the
 * caller copies). false: neither has room now (the poll tries again).
 */
static bool read_start(struct disk_tier *dt, struct disk_entry *e)
{
	if (e->dst && !e->hblk) {
		e->hblk = malloc(e->npages * sizeof(*e->hblk));
		/* DISK_NONE until taken: a staging read never gives any back */
		for (uint32_t i = 0; e->hblk && i < e->npages; i++)
			e->hblk[i] = DISK_NONE;
	}
	if (e->dst && e->hblk && dt->nhblk_free >= e->npages) {
		for (uint32_t i = 0; i < e->npages; i++)
			e->hblk[i] = dt->hblk_free[--dt->nhblk_free];
		e->into = true;
	} else if (!stage_reserve(dt, e) &&
		   (!stage_reclaim_ready(dt, e->npages) || !stage_reserve(dt, e))) {
		return false;
	}
	e->state = DS_READING;
	queue_push(&dt->rq, e);
	pthread_cond_signal(&dt->work);
	return true;
}

int disk_tier_get_into(struct disk_tier *dt, const struct disk_key *k,
		       uint32_t n, void *const *dst, struct disk_hist *out)
{
	struct disk_entry *e;
	int ret = -EINPROGRESS;

	pthread_mutex_lock(&dt->mu);
	e = index_find(dt, k);
	if (!e || e->held || e->npages != n || e->npages > dt->nstage) {
		/* None; another holder; another snapshot than the caller
		 * sized (or one too long for staging): disk_tier_get. */
		ret = !e ? -ENOENT : e->held ? -EBUSY : -ESTALE;
		goto out;
	}
	e->dst = malloc(n * sizeof(*e->dst));
	if (!e->dst) {
		ret = -ENOMEM;
		goto out;
	}
	memcpy(e->dst, dst, n * sizeof(*e->dst));
	e->held = true;
	hist_fill(out, e);
	switch (e->state) {
	case DS_STAGED:
		queue_unlink(&dt->wq, e);
		e->state = DS_READY;
		e->ready_ns = disk_now_ns();
		/* fall through */
	case DS_READY:
		ret = 0; /* in staging: the caller copies */
		break;
	case DS_WRITING:
		e->want = true;
		break;
	case DS_ONDISK:
		lru_unlink(e); /* held: no victim for room */
		read_start(dt, e);
		break;
	case DS_READING:
		break;
	}
out:
	pthread_mutex_unlock(&dt->mu);
	return ret;
}

int disk_tier_poll(struct disk_tier *dt, const struct disk_hist *hh,
		   struct disk_hist *out)
{
	struct disk_entry *e = hh->entry;
	int ret = -EINPROGRESS;

	pthread_mutex_lock(&dt->mu);
	if (e->state == DS_WRITING || e->state == DS_READING) {
		/* the thread has it */
	} else if (e->gone) {
		disk_entry_destroy(dt, e, true);
		ret = -ENOENT;
	} else if (e->state == DS_ONDISK) {
		read_start(dt, e);
	} else {
		hist_fill(out, e);
		ret = 0;
	}
	pthread_mutex_unlock(&dt->mu);
	return ret;
}

void disk_tier_wait_held(struct disk_tier *dt, const struct disk_hist *hh)
{
	struct disk_entry *e = hh->entry;

	pthread_mutex_lock(&dt->mu);
	while (e->state == DS_WRITING || e->state == DS_READING)
		pthread_cond_wait(&dt->done, &dt->mu);
	pthread_mutex_unlock(&dt->mu);
}

void disk_tier_unhold(struct disk_tier *dt, const struct disk_hist *hh)
{
	struct disk_entry *e = hh->entry;

	disk_tier_wait_held(dt, hh); /* no I/O into the caller's memory after */
	pthread_mutex_lock(&dt->mu);
	e->held = false;
	if (e->gone) {
		disk_entry_destroy(dt, e, true);
	} else if (e->state == DS_ONDISK || (e->state == DS_READY && e->into)) {
		/* Its slots still hold it: back on disk, as it was. */
		free(e->dst);
		e->dst = NULL;
		e->into = false;
		e->state = DS_ONDISK;
		disk_lru_push(dt, e);
	} else {
		/* READY in staging: stage_reclaim_ready's, as a get's */
		free(e->dst);
		e->dst = NULL;
	}
	pthread_mutex_unlock(&dt->mu);
}

const void *disk_tier_page(struct disk_tier *dt, const struct disk_hist *hh,
			   uint32_t i)
{
	return disk_payload_of(dt, hh->entry, i);
}

void disk_tier_take(struct disk_tier *dt, const struct disk_hist *hh)
{
	struct disk_entry *e = hh->entry;

	pthread_mutex_lock(&dt->mu);
	if (!e->gone) /* held and dropped since its poll: unindexed already */
		disk_index_remove(dt, e);
	disk_use_of(dt, e->k.tenant)->read_pages += e->npages;
	disk_entry_destroy(dt, e, true);
	pthread_mutex_unlock(&dt->mu);
}

int disk_tier_drop(struct disk_tier *dt, const struct disk_key *k)
{
	struct disk_entry *e;
	int ret = -ENOENT;

	pthread_mutex_lock(&dt->mu);
	e = index_find(dt, k);
	if (e) {
		ret = (int)e->npages;
		entry_drop(dt, e);
	}
	pthread_mutex_unlock(&dt->mu);
	return ret;
}

uint32_t disk_tier_drop_all(struct disk_tier *dt, uint64_t tenant, uint32_t pool)
{
	uint32_t n = 0;

	pthread_mutex_lock(&dt->mu);
	for (uint32_t b = 0; b < dt->nbucket; b++) {
		struct disk_entry *e = dt->bucket[b], *next;

		for (; e; e = next) {
			next = e->hnext;
			if (e->k.tenant == tenant && e->k.pool == pool) {
				n += !e->k.kind; /* histories are what it counts */
				entry_drop(dt, e);
			}
		}
	}
	pthread_mutex_unlock(&dt->mu);
	return n;
}

uint64_t disk_tier_list(struct disk_tier *dt, uint64_t tenant, uint32_t pool,
			uint64_t cursor, uint64_t *ids, uint64_t max)
{
	uint64_t n = 0;

	pthread_mutex_lock(&dt->mu);
	for (uint32_t b = 0; b < dt->nbucket; b++)
		for (struct disk_entry *e = dt->bucket[b]; e; e = e->hnext)
			if (e->k.tenant == tenant && e->k.pool == pool &&
			    !e->k.kind && e->k.user >= cursor) {
				if (n < max)
					ids[n] = e->k.user;
				n++;
			}
	pthread_mutex_unlock(&dt->mu);
	return n;
}

static bool alias_match(const struct disk_entry *e, const struct disk_alias *a)
{
	return e->k.kind == a->kind && (e->k.user & a->mask) == a->value &&
	       e->k.tenant == a->tenant && e->k.pool == a->pool;
}

bool disk_tier_find_alias(struct disk_tier *dt, const struct disk_alias *a,
			  uint8_t hash[32])
{
	bool found = false;

	pthread_mutex_lock(&dt->mu);
	for (uint32_t b = 0; b < dt->nbucket && !found; b++)
		for (struct disk_entry *e = dt->bucket[b]; e && !found; e = e->hnext)
			if (alias_match(e, a)) {
				memcpy(hash, e->k.hash, sizeof(e->k.hash));
				found = true;
			}
	pthread_mutex_unlock(&dt->mu);
	return found;
}

uint32_t disk_tier_drop_alias(struct disk_tier *dt, const struct disk_alias *a)
{
	uint32_t n = 0;

	pthread_mutex_lock(&dt->mu);
	for (uint32_t b = 0; b < dt->nbucket; b++) {
		struct disk_entry *e = dt->bucket[b], *next;

		for (; e; e = next) {
			next = e->hnext;
			if (alias_match(e, a)) {
				entry_drop(dt, e);
				n++;
			}
		}
	}
	pthread_mutex_unlock(&dt->mu);
	return n;
}

bool disk_tier_info(struct disk_tier *dt, const struct disk_key *k,
		    uint64_t *start, uint64_t *len, uint32_t *npages)
{
	struct disk_entry *e;

	pthread_mutex_lock(&dt->mu);
	e = index_find(dt, k);
	if (e) {
		*start = e->start;
		*len = e->len;
		*npages = e->npages;
	}
	pthread_mutex_unlock(&dt->mu);
	return e != NULL;
}

void disk_tier_stats(struct disk_tier *dt, uint64_t tenant,
		     struct disk_tier_stats *out)
{
	struct disk_use *u;

	pthread_mutex_lock(&dt->mu);
	u = disk_use_of(dt, tenant);
	*out = (struct disk_tier_stats){
		.slots = disk_store_slots(dt->st),
		.slots_used = disk_store_slots(dt->st) - dt->nfree,
		.users = u->users, .pages = u->pages,
		.prefix_pages = u->prefix_pages, .chunks = u->chunks,
		.chunk_pages = u->chunk_pages,
		.demoted_pages = u->demoted_pages,
		.dropped_pages = u->dropped_pages, .read_pages = u->read_pages,
		.bytes_raw = u->bytes_raw, .bytes_stored = u->bytes_stored,
		.write_ns = dt->write_ns, .read_ns = dt->read_ns,
		.codec_ns = dt->codec_ns, .bad_records = dt->bad_records,
		.other_records = dt->other_records,
		.into_pages = dt->into_pages, .hblk_free = dt->nhblk_free,
		.direct = disk_store_direct(dt->st),
	};
	pthread_mutex_unlock(&dt->mu);
}

void disk_tier_flush(struct disk_tier *dt)
{
	pthread_mutex_lock(&dt->mu);
	while (dt->wq.head || dt->rq.head || dt->ninval || dt->nreg_q || !dt->idle)
		pthread_cond_wait(&dt->done, &dt->mu);
	pthread_mutex_unlock(&dt->mu);
}

uint64_t disk_tier_progress(struct disk_tier *dt)
{
	return __atomic_load_n(&dt->progress, __ATOMIC_ACQUIRE);
}

struct disk_store *disk_tier_store(struct disk_tier *dt)
{
	return dt->st;
}
