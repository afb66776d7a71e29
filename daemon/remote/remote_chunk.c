/* SPDX-License-Identifier: MIT */
/*
 * remote_chunk.c - sealed root chunks in the remote tier (remote_engine.h
 * says how they are keyed; share_disk.c rebuilds a chunk from what comes
 * back, as it does from the disk tier).
 *
 * Put: ahead of eviction a piece at a time (remote_publish.c), or at
 * eviction the rest (share_demote_chunk), under the engine's lock: the
 * chunk's pages first (c->pub_next counts them), its records only once
 * every page is queued: a record is never queued for pages that were not.
 * Pages and records go to different nodes, so a reader may still find a
 * record before its pages land: its fetch comes back short, which is a
 * miss (share_disk.c's record check wants every page).
 *
 * Fetch: one remote_tier_fetch_rec() names the chunk's record; the remote
 * thread gets it, learns from it how many pages follow and under which
 * name (chunk_expand), and gets them in a second round, while the ring
 * worker holds the acquire's entry and retries.
 */
#include <errno.h>
#include <string.h>

#include "engine.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "share_disk.h"
#include "tier_services.h"

static void chunk_key(const struct engine *eng, const uint8_t id[32], uint32_t page,
		      struct remote_key *k)
{
	remote_key_of(eng, DISK_KIND_CHUNK, id, page, k);
}

bool remote_chunk_type_kept(const struct engine *eng, uint32_t type)
{
	return tier_remote(eng) &&
	       (type >= 32 || !(tier_remote_chunk_skip(eng) & 1u << type));
}

uint32_t remote_chunk_put(struct engine *eng, struct chunk *c,
			  const void *const *pages, uint32_t m, const void *rec,
			  uint64_t rec_len)
{
	uint64_t pb = engine_layout(eng)->page_bytes;
	struct remote_tier *rt = tier_remote(eng);
	const uint8_t *name_id;
	struct remote_key k;
	uint32_t done = 0;

	if (!remote_chunk_type_kept(eng, tier_chunk_type(c)) || tier_chunk_in_store(c) ||
	    !remote_tier_has_room(rt, m * pb + 2 * rec_len))
		return 0; /* dropped, counted there; it can be recomputed */
	name_id = tier_chunk_name_id(c);
	for (; done < m; done++, tier_chunk_pub_advance(c)) {
		chunk_key(eng, name_id, tier_chunk_pub_next(c), &k);
		if (remote_tier_put(rt, &k, pages[done]))
			return done; /* another engine filled the queue meanwhile */
	}
	if (tier_chunk_pub_next(c) < tier_chunk_npages(c))
		return done;
	/* Every page queued: the records, found by its name and by its root
	 * entry's id. */
	chunk_key(eng, name_id, REMOTE_PAGE_REC, &k);
	if (remote_tier_put_rec(rt, &k, rec, rec_len))
		return done;
	chunk_key(eng, tier_chunk_id(c), REMOTE_PAGE_REC, &k);
	tier_chunk_set_in_store(c, !remote_tier_put_rec(rt, &k, rec, rec_len));
	return done;
}

/* remote_expand_fn: a chunk's record names its data pages under its name
 * id. share_disk.c checks the record whole once it is back. */
static uint32_t chunk_expand(const struct remote_key *key, const void *val,
			     uint64_t page_bytes, uint8_t hash[32])
{
	struct chunk_rec r;

	(void)key;
	if (page_bytes < sizeof(r))
		return 0; /* no record of ours fits such a page */
	memcpy(&r, val, sizeof(r));
	if (r.magic != CHUNK_REC_MAGIC || !r.npages || !r.ntokens ||
	    sizeof(r) + (uint64_t)r.ntokens * 4 + r.content_len + r.meta_len > page_bytes)
		return 0;
	memcpy(hash, r.name_id, 32);
	return r.npages;
}

int remote_chunk_fetch(struct engine *eng, const struct kvp_chunk_id *id,
		       uint32_t type, bool wait, struct share_fetch *f, uint8_t nid[32])
{
	struct remote_fetch *rf;
	struct remote_key k;
	int ret;

	/* A record longer than a page is never written (share_disk.c): what
	 * the store holds under its key then is not ours to read. */
	if (!remote_chunk_type_kept(eng, type) ||
	    engine_layout(eng)->page_bytes < sizeof(struct chunk_rec))
		return -ENOENT;
	chunk_key(eng, id->b, REMOTE_PAGE_REC, &k);
	f->src = SHARE_FETCH_REMOTE;
	while ((ret = remote_tier_fetch_rec(tier_remote(eng), &k, chunk_expand,
					    tier_share_frames(eng), &rf)) == -EINPROGRESS &&
	       wait)
		remote_tier_wait(tier_remote(eng), &k);
	if (ret)
		return ret == -EINPROGRESS ? engine_wait_set(ENGINE_WAIT_REMOTE) :
		       -ENOENT; /* -ENOMEM: a miss */
	if (!remote_fetch_pages(rf)) { /* not in the store, or it did not check */
		remote_fetch_done(tier_remote(eng), rf, 0);
		return -ENOENT;
	}
	memcpy(nid, ((const struct chunk_rec *)remote_fetch_page(rf, 0))->name_id, 32);
	f->rf = rf;
	f->npages = remote_fetch_pages(rf);
	return 0;
}

/* The disk tier's order: data pages 0..n-1, then the record (the fetch's
 * page 0). */
const void *remote_chunk_fetch_page(const struct share_fetch *f, uint32_t i)
{
	return remote_fetch_page(f->rf, i + 1 < f->npages ? i + 1 : 0);
}

void remote_chunk_fetch_end(struct engine *eng, const struct share_fetch *f,
			    bool taken)
{
	remote_fetch_done(tier_remote(eng), f->rf, taken ? f->npages - 1 : 0);
}

/* The records that name the chunk go (nothing finds its pages then), and
 * its page 0 (a record written again later by another node would name a
 * chunk without it: a miss). */
static void drop_one(struct engine *eng, const uint8_t id[32])
{
	struct remote_key k;

	chunk_key(eng, id, REMOTE_PAGE_REC, &k);
	remote_tier_del(tier_remote(eng), &k);
	chunk_key(eng, id, 0, &k);
	remote_tier_del(tier_remote(eng), &k);
}

void remote_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id)
{
	if (!tier_remote(eng))
		return;
	drop_one(eng, id->b);
	/* Known here: its name and every root entry of it, so the chunk is
	 * gone from the store by either id. Known only to the store: what
	 * the id names (a name id: its pages too; an entry id: that way in).
	 */
	tier_chunk_aliases(eng, id, drop_one);
}
