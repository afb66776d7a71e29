/* SPDX-License-Identifier: MIT */
/*
 * remote_user.c - user histories in the remote tier (remote_user_histories
 * = yes; remote_engine.h): written behind when eviction drops them, read
 * back on a prepare of a user with nothing in memory or on disk, deleted
 * when the user's copies are thrown away.
 *
 * In the store a history is its pages, then its record (struct ruser_rec,
 * written last): keys kvp1:u:<layout>:<tenant>:<user>:<page> and ...:r.
 * Every page's key hash holds the user id and the write id of the snapshot
 * it belongs to (remote_value.h: checked in the value, not in the key), so
 * a history written again overwrites its keys in place. The record's key
 * has write id 0 (a reader knows only the user); the record names the
 * write id, and its pages are fetched under that: a page of another
 * snapshot (a writer elsewhere, a write a store node failed) fails its
 * check and the history is a miss, never mixed bytes. Last writer wins
 * across nodes: meant for sticky routing and failover, not two nodes
 * serving one user at once.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "disk_record.h"
#include "engine.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "tier_services.h"

#define RUSER_MAGIC 0x3152455355505656ull /* "VVPUSER1" little-endian */

/* A history's record in the store, stored as is (little-endian hosts). */
struct ruser_rec {
	uint64_t magic;
	uint64_t user;
	uint64_t write_id;       /* its pages' snapshot: never 0 */
	uint64_t start, len;     /* the history's tokens [start, start + len) */
	uint32_t npages;         /* pages_for(len) */
	uint32_t page_tokens;
};

/* Write ids: a random base per daemon, then a counter, so that two nodes
 * (or two runs of one) never write two snapshots of one user under one id. */
static uint64_t g_write_next;

static uint64_t next_write_id(void)
{
	uint64_t id = __atomic_load_n(&g_write_next, __ATOMIC_RELAXED);

	if (!id) {
		uint64_t base = 0;

		if (getrandom(&base, sizeof(base), 0) != sizeof(base))
			base = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid() << 32;
		/* Whoever sets it first: the others' bases are thrown away. */
		__atomic_compare_exchange_n(&g_write_next, &id, base | 1, false,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED);
	}
	do
		id = __atomic_fetch_add(&g_write_next, 1, __ATOMIC_RELAXED);
	while (!id);
	return id;
}

static void user_key(const struct engine *eng, uint64_t user, uint64_t write_id,
		     uint32_t page, struct remote_key *k)
{
	memset(k, 0, sizeof(*k));
	k->kind = DISK_KIND_USER;
	k->layout_id = disk_layout_id_tp(engine_layout(eng), engine_tp(eng));
	k->tenant = tier_disk_tenant(eng);
	memcpy(k->hash, &user, 8);
	memcpy(k->hash + 8, &write_id, 8);
	k->page = page;
}

static bool enabled(const struct engine *eng)
{
	return tier_remote(eng) && remote_tier_user_histories(tier_remote(eng));
}

/* h's pages, then its record, queued: 1; 0 nothing to write (off, empty,
 * pinned, the store has it as it is); -ENOSPC the queue is full; -EAGAIN
 * a page only in a GPU's memory; -ENOMEM. */
static int user_out(struct engine *eng, struct history *h)
{
	uint32_t n = tier_history_pages(eng, h);
	struct ruser_rec rec;
	struct remote_key k;
	uint64_t user;
	void **pages;
	uint32_t i;
	int ret = -EAGAIN;

	/* Unpinned: no onload in flight, no reserved pages past len. */
	if (!enabled(eng) || !n || tier_history_pins(h))
		return 0;
	/* As it came from the store (no write since, no trim): the store has
	 * it. Not writing it again also keeps a newer snapshot another node
	 * wrote meanwhile. */
	if (tier_history_stored(h))
		return 0;
	pages = malloc(n * sizeof(*pages));
	if (!pages)
		return -ENOMEM; /* dropped, as without a remote tier */
	/*
	 * The pages where the CPU reads them: host frames (what the host LRU
	 * drops is there), or device frames on shm. A page only in a GPU's
	 * memory would need share_bounce.c's copy: such a history is skipped
	 * (dropped as without a remote tier), as the disk tier skips it.
	 */
	for (i = 0; i < n; i++)
		if (!(pages[i] = tier_history_page_cpu(eng, h, i)))
			goto out;
	/* All of it or nothing: a history cut short by a full queue would
	 * only overwrite (tear) the snapshot the store has. */
	if (remote_tier_free_bytes(tier_remote(eng)) <
	    (uint64_t)n * engine_layout(eng)->page_bytes + sizeof(rec)) {
		ret = -ENOSPC;
		goto out;
	}
	user = tier_history_user(h);
	rec = (struct ruser_rec){ .magic = RUSER_MAGIC, .user = user,
				  .write_id = next_write_id(),
				  .start = tier_history_start(h),
				  .len = tier_history_len(h), .npages = n,
				  .page_tokens = tier_page_tokens(eng) };
	/* Pages first, the record last: a reader never finds a record before
	 * its pages are queued (one queue, written in order). A put refused
	 * (queue full) ends it without the record: the previous snapshot's,
	 * if any, now names pages partly overwritten, and is a miss. */
	for (i = 0; i < n; i++) {
		user_key(eng, user, rec.write_id, i, &k);
		if ((ret = remote_tier_put(tier_remote(eng), &k, pages[i])))
			goto out;
	}
	user_key(eng, user, 0, REMOTE_PAGE_REC, &k);
	ret = remote_tier_put_rec(tier_remote(eng), &k, &rec, sizeof(rec));
	if (!ret) {
		remote_tier_count_user(tier_remote(eng), RU_PUT);
		ret = 1;
	}
out:
	free(pages);
	return ret;
}

void engine_remote_user_out(struct engine *eng, struct history *h)
{
	/* Failed: dropped as without a remote tier; no room: counted. */
	if (user_out(eng, h) == -ENOSPC)
		remote_tier_count_user(tier_remote(eng), RU_DROPPED);
}

static int collect_cb(struct history *h, void *arg)
{
	uint64_t **p = arg;

	*(*p)++ = tier_history_user(h);
	return 0;
}

int engine_remote_user_flush_all(struct engine *eng)
{
	uint64_t n = tier_user_count(eng), *ids, *end;
	int written = 0;

	if (!enabled(eng) || !n || !(ids = malloc(n * sizeof(*ids))))
		return 0;
	end = ids;
	tier_user_foreach(eng, collect_cb, &end);
	/* By id, looked up each time: a demotion below may drop others (to
	 * the store, through the hook). */
	for (uint64_t *u = ids; u < end; u++) {
		struct history *h = tier_history_find(eng, *u);
		int ret;

		if (!h || tier_history_pins(h))
			continue;
		ret = user_out(eng, h);
		if (ret == -EAGAIN) { /* pages only on the GPU: the host's first */
			tier_history_demote(eng, h);
			h = tier_history_find(eng, *u);
			ret = h ? user_out(eng, h) : 0;
		}
		if (ret == -ENOSPC) { /* the queue full: let the thread drain it */
			remote_tier_flush(tier_remote(eng));
			ret = user_out(eng, h);
		}
		if (ret == -ENOSPC) /* longer than the whole queue */
			remote_tier_count_user(tier_remote(eng), RU_DROPPED);
		written += ret > 0;
	}
	free(ids);
	return written;
}

void engine_remote_user_del(struct engine *eng, uint64_t user)
{
	struct remote_key k;

	if (!enabled(eng))
		return;
	user_key(eng, user, 0, REMOTE_PAGE_REC, &k);
	/* Behind any put of it queued before: the DEL is the last word. Its
	 * pages stay until overwritten: without the record nobody reads them. */
	if (!remote_tier_del(tier_remote(eng), &k))
		remote_tier_count_user(tier_remote(eng), RU_DEL);
}

/* The record in val, when it is one of ours for the user of rec's key,
 * npages sane for len; false otherwise. */
static bool rec_parse(const struct remote_key *rk, const void *val,
		      struct ruser_rec *out)
{
	uint64_t user;

	memcpy(out, val, sizeof(*out));
	memcpy(&user, rk->hash, 8);
	return out->magic == RUSER_MAGIC && out->user == user && out->write_id &&
	       out->page_tokens && out->npages && out->len &&
	       out->start < (1ull << 62) && out->len < (1ull << 62) &&
	       out->npages == (out->len + out->page_tokens - 1) / out->page_tokens;
}

/* remote_expand_fn: the pages a record names (remote thread). */
static uint32_t rec_expand(const struct remote_key *rk, const void *val,
			   uint64_t page_bytes, uint8_t hash[32])
{
	struct ruser_rec rec;

	if (page_bytes < sizeof(rec) || !rec_parse(rk, val, &rec))
		return 0;
	memcpy(hash, rk->hash, 32);
	memcpy(hash + 8, &rec.write_id, 8);
	return rec.npages;
}

/*
 * The fetched history into host frames: 1 when whole (the record, then
 * every page it names, each checked), 0 when not (a miss, counted), or an
 * error from the rebuild (nothing changed).
 */
static int from_fetch(struct engine *eng, uint64_t user, const struct remote_key *rk,
		      const struct remote_fetch *f, struct errbuf *e)
{
	uint32_t got = remote_fetch_pages(f);
	struct ruser_rec rec;
	const void **src;
	int ret;

	if (!got) {
		remote_tier_count_user(tier_remote(eng), RU_MISSED);
		return 0;
	}
	/* Whole, of this engine's page size, and able to fit the device at
	 * once (a prepare needs that): else a miss, as torn. */
	if (!rec_parse(rk, remote_fetch_page(f, 0), &rec) ||
	    got != 1 + rec.npages || rec.page_tokens != tier_page_tokens(eng) ||
	    rec.npages > tier_frames_total(eng, KVP_TIER_DEVICE) ||
	    (tier_max_tokens(eng) && rec.len > tier_max_tokens(eng))) {
		remote_tier_count_user(tier_remote(eng), RU_TORN);
		return 0;
	}
	src = malloc(rec.npages * sizeof(*src));
	if (!src)
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory for "
				  "its history coming back from the remote tier", user);
	for (uint32_t i = 0; i < rec.npages; i++)
		src[i] = remote_fetch_page(f, i + 1);
	ret = tier_history_from_pages(eng, user, rec.start, rec.len, rec.npages, src,
				      NULL, "remote", e);
	free(src);
	if (ret)
		return ret;
	tier_history_mark_stored(tier_history_find(eng, user));
	remote_tier_count_user(tier_remote(eng), RU_FETCHED);
	return 1;
}

/* The remote tier's state of one engine (tier.h's engine_tier_priv): a
 * user's history fetched that the shard had no host room for, kept for the
 * retry with every shard. Made at the first such fetch. */
struct remote_held {
	struct remote_fetch *f;
	uint64_t user, ns;
};

void engine_remote_user_detach(struct engine *eng)
{
	void **priv = engine_tier_priv(eng, ENGINE_TIER_REMOTE);
	struct remote_held *rh = *priv;

	if (!rh)
		return;
	if (rh->f)
		remote_fetch_done(tier_remote(eng), rh->f, 0);
	free(rh);
	*priv = NULL;
}

int engine_remote_user_onload(struct engine *eng, uint64_t user, unsigned flags,
			      struct errbuf *e)
{
	bool defer = flags & ENGINE_PREPARE_DEFER;
	struct remote_held *rh;
	struct remote_fetch *f;
	struct remote_key rk;
	int ret;

	if (!enabled(eng))
		return 0;
	user_key(eng, user, 0, REMOTE_PAGE_REC, &rk);
	/* Fetched before, for a shard short of host room: its retry with
	 * every shard locked takes it, no second round (and no wait on the
	 * network under every lock). Another user's, or one nobody came back
	 * for at once (the retry follows the refusal), is dropped. */
	rh = *engine_tier_priv(eng, ENGINE_TIER_REMOTE);
	f = rh ? rh->f : NULL;
	if (rh)
		rh->f = NULL;
	if (f && rh->user == user && mono_ns() - rh->ns < 1000000000ull)
		goto got;
	if (f)
		remote_fetch_done(tier_remote(eng), f, 0);
	for (;;) {
		/* Our own write of it (or DEL) still queued: the store has an
		 * older snapshot or none yet (and a fetch of it is stale:
		 * remote_tier_put_rec). Once it is written, ask. */
		if (!remote_tier_pending(tier_remote(eng), &rk) &&
		    remote_tier_put_pending(tier_remote(eng), &rk)) {
			if (defer)
				return errbuf_set(e, engine_wait_set(ENGINE_WAIT_REMOTE),
						  "user %" PRIu64 ": its history is being written "
						  "to the remote tier", user);
			remote_tier_flush(tier_remote(eng));
			continue;
		}
		ret = remote_tier_fetch_rec(tier_remote(eng), &rk, rec_expand,
					    tier_frames_total(eng, KVP_TIER_HOST), &f);
		if (ret != -EINPROGRESS)
			break;
		if (defer)
			return errbuf_set(e, engine_wait_set(ENGINE_WAIT_REMOTE),
					  "user %" PRIu64 ": asking "
					  "the remote tier for its history", user);
		remote_tier_wait(tier_remote(eng), &rk);
	}
	if (ret)
		return 0; /* no memory for the fetch: a miss */
got:
	ret = from_fetch(eng, user, &rk, f, e);
	if (ret == -EAGAIN) {
		if (!rh)
			rh = *engine_tier_priv(eng, ENGINE_TIER_REMOTE) =
				calloc(1, sizeof(*rh));
		if (!rh) { /* no memory to keep it: the retry asks again */
			remote_fetch_done(tier_remote(eng), f, 0);
			return ret;
		}
		*rh = (struct remote_held){ .f = f, .user = user, .ns = mono_ns() };
		return ret;
	}
	remote_fetch_done(tier_remote(eng), f, ret > 0 ? remote_fetch_pages(f) - 1 : 0);
	return ret < 0 ? ret : 0;
}
