/* SPDX-License-Identifier: MIT */
/*
 * share_prefix.c - the prefix cache: full pages published under chained
 * hashes, found again by later token lists, evicted leaves first.
 *
 *     h_i = SHA-256(h_{i-1} || salt || tokens[iP, (i+1)P) as LE uint32)
 *     h_{-1} = 32 zero bytes
 *
 * Token ids are hashed as little-endian uint32 whatever the host's byte
 * order, and the salt is the tenant's (derived from the config, not from
 * anything random), so every process and every restart computes the same
 * hashes. The table has one entry per published frame, so it is sized once
 * from the device tier and never grows: publishing cannot fail.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "bug.h"
#include "remote_engine.h"
#include "share_disk.h"
#include "share_internal.h"

/* ------------------------------------------------------------ hashing */

EVP_MD_CTX *share_digest_begin(const struct engine *eng)
{
	struct share *s = eng->share;

	if (!EVP_DigestInit_ex2(s->md, s->sha256, NULL))
		KVP_BUG("a SHA-256 fetched at start must start a digest (libcrypto broken)");
	return s->md;
}

void share_digest_tokens(EVP_MD_CTX *ctx, const uint32_t *tokens, uint64_t n)
{
	uint8_t le[4 * 256];

	for (uint64_t done = 0; done < n;) {
		uint64_t k = n - done < 256 ? n - done : 256;

		for (uint64_t i = 0; i < k; i++) {
			uint32_t t = tokens[done + i];

			le[4 * i] = (uint8_t)t;
			le[4 * i + 1] = (uint8_t)(t >> 8);
			le[4 * i + 2] = (uint8_t)(t >> 16);
			le[4 * i + 3] = (uint8_t)(t >> 24);
		}
		EVP_DigestUpdate(ctx, le, 4 * k);
		done += k;
	}
}

void pc_hash_page(const struct engine *eng, const uint8_t prev[32],
		  const uint32_t *tokens, uint8_t out[32])
{
	EVP_MD_CTX *ctx = share_digest_begin(eng);

	EVP_DigestUpdate(ctx, prev, 32);
	EVP_DigestUpdate(ctx, eng->share->salt, SHARE_SALT_BYTES);
	share_digest_tokens(ctx, tokens, eng->P);
	EVP_DigestFinal_ex(ctx, out, NULL);
}

void share_prefix_hashes(const struct engine *eng, const uint32_t *tokens,
			 uint32_t n, uint8_t (*out)[32])
{
	static const uint8_t zero[32];

	for (uint32_t i = 0; i < n / eng->P; i++)
		pc_hash_page(eng, i ? out[i - 1] : zero, tokens + (uint64_t)i * eng->P,
			     out[i]);
}

/* ------------------------------------------------------------ table */

/*
 * Entries live in s->pc[nframes] (one per device frame: the table never
 * grows and needs no reserve) and are named by index (sp[].pc, parent).
 * Free entries are on s->pc_free_list, published ones in s->pcs by the
 * hash (SHA-256 bytes are uniform already: hashtab_hash_digest), idle
 * leaves on s->pc_lru; free and LRU share the entry's list link.
 */
int pc_init(struct share *s, uint32_t nframes)
{
	uint64_t nb = 2 * (uint64_t)nframes;

	if (nb < 16)
		nb = 16;
	if (nb > (1u << 31))
		nb = 1u << 31;
	INIT_LIST_HEAD(&s->pc_lru);
	INIT_LIST_HEAD(&s->pc_free_list);
	INIT_LIST_HEAD(&s->pub_pcs);
	s->pc = calloc(nframes ? nframes : 1, sizeof(*s->pc));
	if (!s->pc || hashtab_init_fixed(&s->pcs, nb))
		return -ENOMEM;
	for (uint32_t i = 0; i < nframes; i++) {
		s->pc[i].frame = FRAME_NONE;
		list_add_tail(&s->pc[i].link, &s->pc_free_list);
	}
	return 0;
}

void pc_fini(struct share *s)
{
	free(s->pc);
	hashtab_fini(&s->pcs);
}

uint32_t pc_find(const struct engine *eng, const uint8_t hash[32])
{
	const struct share *s = eng->share;
	struct pc_entry *pe;

	hashtab_for_each_possible(&s->pcs, pe, hnode, hashtab_hash_digest(hash))
		if (!memcmp(pe->hash, hash, 32))
			return (uint32_t)(pe - s->pc);
	return PC_NONE;
}

void pc_publish(struct engine *eng, uint32_t frame, const uint8_t hash[32],
		uint32_t parent)
{
	struct share *s = eng->share;
	struct pc_entry *pe;
	uint32_t e;

	pe = list_first_entry_or_null(&s->pc_free_list, struct pc_entry, link);
	KVP_BUG_ON(!pe, "the prefix cache has one entry per frame: its free list cannot run out");
	e = (uint32_t)(pe - s->pc);
	list_del(&pe->link);
	memcpy(pe->hash, hash, 32);
	pe->frame = frame;
	pe->parent = parent;
	pe->nchildren = 0;
	pe->on_lru = false;
	pe->in_store = false;
	INIT_LIST_HEAD(&pe->pub);
	if (eng->remote) /* immutable now: to the store ahead of eviction */
		list_add_tail(&pe->pub, &s->pub_pcs);
	hashtab_insert(&s->pcs, &pe->hnode, hashtab_hash_digest(hash));
	s->sp[frame].pc = e;
	if (parent != PC_NONE)
		s->pc[parent].nchildren++; /* held by the publisher: not on the LRU */
	s->pc_count++;
}

/* ------------------------------------------------------------ LRU */

static void lru_unlink(struct share *s, uint32_t e);
static void lru_push_tail(struct engine *eng, uint32_t e);

void pc_adopt(struct engine *eng, uint32_t frame, const uint8_t hash[32],
	      uint32_t parent)
{
	struct share *s = eng->share;

	/* An idle parent stops being a leaf: off the LRU (it stays idle). */
	if (parent != PC_NONE && s->pc[parent].on_lru)
		lru_unlink(s, parent);
	pc_publish(eng, frame, hash, parent);
	s->pc_idle++;
	lru_push_tail(eng, s->sp[frame].pc);
}

static void lru_unlink(struct share *s, uint32_t e)
{
	struct pc_entry *pe = &s->pc[e];

	list_del(&pe->link);
	pe->on_lru = false;
}

static void lru_push_tail(struct engine *eng, uint32_t e)
{
	struct share *s = eng->share;
	struct pc_entry *pe = &s->pc[e];

	pe->tick = engine_tick(eng);
	pe->on_lru = true;
	list_add_tail(&pe->link, &s->pc_lru);
}

/* A parent becomes a leaf when its last child goes: it is at least as old
 * as that child, so it goes to the head, next in line. */
static void lru_push_head(struct share *s, uint32_t e, uint64_t tick)
{
	struct pc_entry *pe = &s->pc[e];

	pe->tick = tick;
	pe->on_lru = true;
	list_add(&pe->link, &s->pc_lru);
}

void pc_became_busy(struct engine *eng, uint32_t e)
{
	struct share *s = eng->share;

	s->pc_idle--;
	if (s->pc[e].on_lru)
		lru_unlink(s, e);
}

void pc_became_idle(struct engine *eng, uint32_t e)
{
	struct share *s = eng->share;

	s->pc_idle++;
	if (!s->pc[e].nchildren)
		lru_push_tail(eng, e);
}

void pc_evict_head(struct engine *eng)
{
	struct share *s = eng->share;
	struct pc_entry *pe = pc_lru_head(s);
	uint32_t e = (uint32_t)(pe - s->pc), parent = pe->parent;

	share_demote_pc(eng, pe); /* to the disk and remote tiers, if any */
	list_del(&pe->pub);
	lru_unlink(s, e);
	hashtab_remove(&s->pcs, &pe->hnode);
	s->sp[pe->frame].pc = PC_NONE;
	frames_free(&eng->frames[KVP_TIER_DEVICE], pe->frame);
	pe->frame = FRAME_NONE;
	list_add(&pe->link, &s->pc_free_list);
	s->pc_count--;
	s->pc_idle--;
	eng->st.prefix_evicted_pages++;
	if (parent != PC_NONE && !--s->pc[parent].nchildren &&
	    !s->sp[s->pc[parent].frame].refs)
		lru_push_head(s, parent, pe->tick);
}

/* ------------------------------------------------------------ lookup */

uint32_t pc_match(struct engine *eng, const uint32_t *tokens, uint32_t full,
		  uint32_t *frames, uint32_t *idle)
{
	static const uint8_t zero[32];
	const struct share *s = eng->share;
	uint32_t hit = 0;
	uint8_t h[32];

	*idle = 0;
	while (hit < full) {
		uint32_t e;

		pc_hash_page(eng, hit ? h : zero, tokens + (uint64_t)hit * eng->P, h);
		e = pc_find(eng, h);
		if (e == PC_NONE)
			break;
		*idle += !s->sp[s->pc[e].frame].refs;
		frames[hit++] = s->pc[e].frame;
	}
	return hit;
}

/* Pages the disk tier holds count as cached: they come back first (with
 * wait, or over the caller's retries). */
static int prefix_lookup(struct engine *eng, const uint32_t *tokens, uint32_t n,
			 bool wait, struct share_prefix_hit *out)
{
	uint32_t full = n / eng->P, hit = 0, idle;

	*out = (struct share_prefix_hit){ 0 };
	if (!wait && share_disk_prefix_wait(eng))
		return -EINPROGRESS; /* nothing read since the last try */
	if (eng->share->no_caching)
		full = 0; /* prefix_caching off: nothing is found */
	if (full && !engine_view_reserve(eng, full, NULL)) {
		hit = pc_match(eng, tokens, full, eng->view, &idle);
		if (share_disk_prefix_more(eng, tokens, full, eng->view, &hit,
					   &idle, wait))
			return -EINPROGRESS; /* counted once, when it is served */
		/* remote tier hook, after the disk tier's: never waits on the
		 * network (a caller that cannot retry gets the local answer) */
		if (remote_prefix_more(eng, tokens, full, eng->view, &hit, !wait))
			return -EINPROGRESS;
	}
	eng->st.prefix_lookups++;
	eng->st.prefix_lookup_tokens += n;
	out->tokens = share_prefix_cached(eng, n, hit);
	out->npages = hit;
	out->frames = eng->view;
	eng->st.prefix_hit_tokens += out->tokens;
	return 0;
}

void share_prefix_lookup(struct engine *eng, const uint32_t *tokens, uint32_t n,
			 struct share_prefix_hit *out)
{
	prefix_lookup(eng, tokens, n, true, out);
}

int share_prefix_find(struct engine *eng, const uint32_t *tokens, uint32_t n,
		      struct share_prefix_hit *out)
{
	return prefix_lookup(eng, tokens, n, false, out);
}

uint32_t share_prefix_cached(const struct engine *eng, uint32_t n, uint32_t hit)
{
	uint64_t t = (uint64_t)hit * eng->P;

	/* Seed 004: never the whole prompt; the last token is left to compute
	 * (its logits come out of the model), and only that token. */
	return hit && t >= n ? n - 1 : (uint32_t)t;
}
