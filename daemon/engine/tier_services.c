/* SPDX-License-Identifier: MIT */
/*
 * tier_services.c - the engine's side of tier_services.h: what a tier may
 * ask of the engine, over its private structures (the engine, histories,
 * prefix pages, publishing; chunks are tier_services_chunk.c's). Every
 * function runs under the engine's lock (tier_services.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"
#include "share_internal.h"
#include "tier_services.h"

struct disk_tier *tier_disk(const struct engine *eng)
{
	return eng->disk;
}

struct remote_tier *tier_remote(const struct engine *eng)
{
	return eng->remote;
}

uint64_t tier_disk_tenant(const struct engine *eng)
{
	return eng->disk_tenant;
}

uint32_t tier_disk_pool(const struct engine *eng)
{
	return eng->disk_pool;
}

uint32_t tier_remote_chunk_skip(const struct engine *eng)
{
	return eng->remote_chunk_skip;
}

uint32_t tier_page_tokens(const struct engine *eng)
{
	return eng->P;
}

uint32_t tier_shard(const struct engine *eng)
{
	return eng->shard;
}

struct frames *tier_device_frames(struct engine *eng)
{
	return &eng->frames[KVP_TIER_DEVICE];
}

struct frames *tier_host_frames(struct engine *eng)
{
	return &eng->frames[KVP_TIER_HOST];
}

uint32_t tier_host_reserve(struct engine *eng, uint32_t n)
{
	return frames_reserve(&eng->frames[KVP_TIER_HOST], n);
}

uint64_t tier_device_avail(struct engine *eng, uint32_t need)
{
	return engine_device_avail(eng, NULL, need);
}

void tier_evict_for_device(struct engine *eng, uint32_t need)
{
	evict_for_device(eng, need);
}

uint32_t tier_frames_total(const struct engine *eng, enum kvp_tier t)
{
	return eng->frames[t].total;
}

uint64_t tier_max_tokens(const struct engine *eng)
{
	return eng->max_tokens;
}

/* ------------------------------------------------------------ histories */

struct history *tier_history_find(struct engine *eng, uint64_t user)
{
	return user_table_find(&eng->users, user);
}

uint64_t tier_user_count(const struct engine *eng)
{
	return user_table_count(&eng->users);
}

int tier_user_foreach(struct engine *eng,
		      int (*fn)(struct history *h, void *arg), void *arg)
{
	return user_table_foreach(&eng->users, fn, arg);
}

uint64_t tier_history_user(const struct history *h)
{
	return h->user;
}

uint64_t tier_history_start(const struct history *h)
{
	return h->start;
}

uint64_t tier_history_len(const struct history *h)
{
	return h->len;
}

uint32_t tier_history_pages(const struct engine *eng, const struct history *h)
{
	return (uint32_t)pages_for(eng, h->len);
}

uint32_t tier_history_npages(const struct history *h)
{
	return h->npages;
}

struct history *tier_lru_oldest(const struct engine *eng, enum kvp_tier t)
{
	return lru_head(&eng->lru[t]);
}

uint32_t tier_history_drop(struct engine *eng, struct history *h)
{
	return history_drop(eng, h);
}

uint32_t tier_history_pins(const struct history *h)
{
	return h->pins;
}

void tier_history_mark_stored(struct history *h)
{
	h->in_store = true;
	h->store_wgen = h->wgen;
	h->store_start = h->start;
	h->store_len = h->len;
}

bool tier_history_stored(const struct history *h)
{
	return h->in_store && h->store_wgen == h->wgen &&
	       h->store_start == h->start && h->store_len == h->len;
}

void tier_history_demote(struct engine *eng, struct history *h)
{
	demote_or_drop(eng, h);
}

void *tier_history_page_cpu(struct engine *eng, struct history *h, uint32_t i)
{
	const struct page_ref *p = &h->pages[i];
	uint64_t pb = eng->layout.page_bytes;

	if (p->frame[KVP_TIER_HOST] != FRAME_NONE)
		return (char *)eng->mem[KVP_TIER_HOST].base +
		       (uint64_t)p->frame[KVP_TIER_HOST] * pb;
	if (p->frame[KVP_TIER_DEVICE] != FRAME_NONE &&
	    eng->mem[KVP_TIER_DEVICE].host_visible)
		return (char *)eng->mem[KVP_TIER_DEVICE].base +
		       (uint64_t)p->frame[KVP_TIER_DEVICE] * pb;
	return NULL;
}

/*
 * Host room for n pages: the host LRU's oldest go (to disk), and when that
 * is not enough, the host copies of unpinned histories on the device LRU,
 * oldest first: they are copies of pages the device holds.
 */
static bool host_room_for_below(struct engine *eng, uint32_t n)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	struct history *h;

	if (host_make_room(eng, n, NULL))
		return true;
	list_for_each_entry(h, &eng->lru[LRU_DEVICE].list, lru_link) {
		if (frames_reserve(host, n) >= n)
			break;
		if (h->nres[KVP_TIER_HOST] && h->nres[KVP_TIER_DEVICE] == h->npages)
			pages_free_frames(eng, h, 0, h->npages, KVP_TIER_HOST);
	}
	if (host_make_room(eng, n, NULL))
		return true;
	if (!eng->set || !eng->set->global)
		return false;
	/* Every lock held: the other shards' host LRUs give frames back to
	 * the pool, where ours takes them. */
	for (uint32_t i = 0; i < eng->set->n && frames_reserve(host, n) < n; i++) {
		struct engine *o = eng->set->v[i].eng;

		if (o == eng)
			continue;
		while (lru_head(&o->lru[LRU_HOST]) && o->frames[KVP_TIER_HOST].nfree < n) {
			/* the tiers' store (disk, then remote), as eviction */
			tier_store(o, lru_head(&o->lru[LRU_HOST]));
			history_drop(o, lru_head(&o->lru[LRU_HOST]));
		}
		frames_flush(&o->frames[KVP_TIER_HOST]);
	}
	return host_make_room(eng, n, NULL);
}

int tier_host_room(struct engine *eng, uint64_t user, uint32_t n,
		   const char *from, struct errbuf *e)
{
	if (host_room_for_below(eng, n))
		return 0;
	/* A shard's host LRU is its own: retried with every lock held, where
	 * the other shards make room too. */
	if (eng->set && !eng->set->global)
		return errbuf_set(e, -EAGAIN, "user %" PRIu64 ": shard %" PRIu32
				  " has no host room for its %" PRIu32 " pages on "
				  "the %s tier; retried with every shard", user,
				  eng->shard, n, from);
	return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": its %" PRIu32 " pages on "
			  "the %s tier need host frames and the host tier has %"
			  PRIu32 " free and nothing to evict (pinned); release "
			  "leases or raise host_mem", user, n, from,
			  eng->frames[KVP_TIER_HOST].nfree);
}

static char *host_frame(struct engine *eng, uint32_t f)
{
	return (char *)eng->mem[KVP_TIER_HOST].base +
	       (uint64_t)f * eng->layout.page_bytes;
}

/*
 * A history of n pages (page i's bytes at src[i]) for [start, start + len),
 * in host frames, on the host LRU: the disk tier's and the remote tier's
 * one rebuild. With frames, the frames are taken already (a read straight
 * into them: src[i] may be the frame itself, then nothing is copied);
 * without, host room is made here (tier_host_room) and frames taken. `from`
 * names the tier in the messages. 0, -ENOMEM or -EAGAIN (tier_host_room):
 * nothing changed.
 */
int tier_history_from_pages(struct engine *eng, uint64_t user, uint64_t start,
			    uint64_t len, uint32_t n, const void *const *src,
			    const uint32_t *frames, const char *from,
			    struct errbuf *e)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	uint64_t pb = eng->layout.page_bytes;
	struct history *h;
	int ret;

	if (user_table_reserve(&eng->users) || !(h = calloc(1, sizeof(*h))))
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory for "
				  "its history coming back from the %s tier", user, from);
	h->pages = calloc(n ? n : 1, sizeof(*h->pages));
	if (!h->pages) {
		free(h);
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory for "
				  "its history coming back from the %s tier", user, from);
	}
	ret = frames ? 0 : tier_host_room(eng, user, n, from, e);
	if (ret) {
		free(h->pages);
		free(h);
		return ret;
	}
	h->owner = eng;
	h->user = user;
	h->lru = LRU_NONE;
	INIT_LIST_HEAD(&h->lru_link);
	h->cap = n ? n : 1;
	h->start = start;
	h->len = len < (uint64_t)n * eng->P ? len : (uint64_t)n * eng->P;
	h->npages = n;
	for (uint32_t i = 0; i < n; i++) {
		char *dst;

		h->pages[i].frame[KVP_TIER_DEVICE] = FRAME_NONE;
		h->pages[i].frame[KVP_TIER_HOST] = FRAME_NONE;
		page_set_frame(eng, h, i, KVP_TIER_HOST,
			       frames ? frames[i] : frames_alloc(host));
		dst = host_frame(eng, h->pages[i].frame[KVP_TIER_HOST]);
		if (src[i] != dst) /* read elsewhere: not straight here */
			memcpy(dst, src[i], pb);
	}
	user_table_insert(&eng->users, h);
	lru_insert(eng, h); /* host-only: the host LRU's newest */
	return 0;
}

/* ------------------------------------------------------------ prefix pages */

uint32_t tier_share_frames(const struct engine *eng)
{
	return eng->share ? eng->share->nframes : 0;
}

void tier_frame_ref(struct engine *eng, uint32_t frame)
{
	sp_ref(eng, frame);
}

void tier_frame_unref(struct engine *eng, uint32_t frame)
{
	sp_unref(eng, frame);
}

uint32_t tier_frame_pc(const struct engine *eng, uint32_t frame)
{
	return eng->share->sp[frame].pc;
}

const uint8_t *tier_frame_hash(const struct engine *eng, uint32_t frame)
{
	const struct share *s = eng->share;

	return s->pc[s->sp[frame].pc].hash;
}

void tier_pc_hash_page(const struct engine *eng, const uint8_t prev[32],
		       const uint32_t *tokens, uint8_t out[32])
{
	pc_hash_page(eng, prev, tokens, out);
}

uint32_t tier_pc_find(const struct engine *eng, const uint8_t hash[32])
{
	return pc_find(eng, hash);
}

uint32_t tier_pc_match(struct engine *eng, const uint32_t *tokens,
		       uint32_t full, uint32_t *frames, uint32_t *idle)
{
	return pc_match(eng, tokens, full, frames, idle);
}

uint32_t tier_pc_adopt_stored(struct engine *eng, uint32_t frame,
			      const uint8_t hash[32], uint32_t parent)
{
	struct share *s = eng->share;
	uint32_t e;

	s->sp[frame] = (struct spage){ .refs = 0, .pc = PC_NONE };
	pc_adopt(eng, frame, hash, parent);
	e = s->sp[frame].pc;
	s->pc[e].in_store = true; /* not written back on eviction */
	list_del(&s->pc[e].pub);
	return e;
}

int tier_pages_in(struct engine *eng, const void *const *src,
		  const uint32_t *dev, uint32_t n)
{
	return share_pages_in(eng, src, dev, n);
}

bool tier_pages_out(struct engine *eng, const uint32_t *dev, uint32_t n,
		    void **out, uint32_t *bounce, bool *bounced)
{
	return share_pages_out(eng, dev, n, out, bounce, bounced);
}

void tier_bounce_free(struct engine *eng, uint32_t *bounce, uint32_t n)
{
	share_bounce_free(eng, bounce, n);
}

uint32_t tier_frame_refs(const struct engine *eng, uint32_t frame)
{
	return eng->share->sp[frame].refs;
}

uint32_t tier_pc_frame(const struct engine *eng, uint32_t e)
{
	return eng->share->pc[e].frame;
}

uint32_t tier_share_frame_alloc(struct engine *eng)
{
	return share_frame_alloc(eng);
}

void tier_pc_publish(struct engine *eng, uint32_t frame, const uint8_t hash[32],
		     uint32_t parent)
{
	pc_publish(eng, frame, hash, parent);
}

uint32_t tier_pc_entry_frame(const struct pc_entry *pe)
{
	return pe->frame;
}

const uint8_t *tier_pc_entry_hash(const struct pc_entry *pe)
{
	return pe->hash;
}

bool tier_pc_in_store(const struct pc_entry *pe)
{
	return pe->in_store;
}

void tier_pc_set_in_store(struct pc_entry *pe, bool in_store)
{
	pe->in_store = in_store;
}

/* ------------------------------------------------------------ the shared world */

uint64_t tier_shared_evictable(const struct engine *eng)
{
	return share_evictable(eng);
}

uint32_t tier_shared_evict_oldest(struct engine *eng)
{
	return share_evict_oldest(eng);
}

/* ------------------------------------------------------------ publishing */

struct pc_entry *tier_pub_pc_first(struct engine *eng)
{
	return list_first_entry_or_null(&eng->share->pub_pcs, struct pc_entry, pub);
}

void tier_pub_pc_take(struct pc_entry *pe)
{
	list_del(&pe->pub);
}

struct chunk *tier_pub_chunk_first(struct engine *eng)
{
	return list_first_entry_or_null(&eng->share->pub_chunks, struct chunk, pub);
}

void tier_pub_chunk_take(struct chunk *c)
{
	list_del(&c->pub);
}

bool tier_pub_pending(const struct engine *eng)
{
	const struct share *s = eng->share;

	return !list_empty(&s->pub_pcs) || !list_empty(&s->pub_chunks);
}
