/* SPDX-License-Identifier: MIT */
/*
 * share_chunk.c - chunk entries (kvpool.h "Chunks"): a name's tokens at one
 * place (a root at position 0, or a link after a parent entry), with their
 * KV pages, filled once by the client that registered them first. Names,
 * metadata, listing and deletion by name are share_chunk_name.c's.
 *
 * Life of an entry:
 *
 *   put / link (new id) ──▶ FILLING, held by its fill lease (a link also
 *        │                  holds its parent: fill_pin)
 *        │ commit(all tokens) / share_chunk_seal
 *        ▼
 *      READY ── unheld, no children ──▶ on the chunk LRU (evictable)
 *        │ delete / clear / evict_unused / evicted (limits, pressure)
 *        ▼
 *      dead: out of the table with every entry below it, so nobody finds
 *      them again; frames go back when the last holder lets go (a leased
 *      entry stays readable).
 *
 * A fill lease released (or its client dead) before the seal kills the
 * entry and lets its parent go: nobody ever sees half-written pages, and
 * the next registration creates it afresh. In a tensor-parallel pool the
 * fill lease is a group's (lease_group.c): every rank writes its slice of
 * heads and seals, and the entry is READY with the last seal.
 *
 * LIMITS (share_chunk_limits.c). Creating an entry first makes room under
 * the tenant's limits, after checking that room can be made (plan, then
 * commit): max_chunks evicts whole names, least recently accessed first,
 * among those whose entries and everything below them are unheld and
 * READY; the memory ratio evicts LRU leaves (a parent joins the LRU when
 * its last child goes). Device pressure takes LRU leaves too
 * (share_evict_oldest).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bug.h"
#include "share_internal.h"

/* ------------------------------------------------------------ ids */

void chunk_id_short(const struct kvp_chunk_id *id, char out[17])
{
	for (int i = 0; i < 8; i++)
		snprintf(out + 2 * i, 3, "%02x", id->b[i]);
}

/* ------------------------------------------------------------ table */

int chunk_table_init(struct share *s, uint32_t nframes)
{
	uint64_t nb = 2 * (uint64_t)nframes;

	/* Alive entries hold a frame each at least: never more than frames,
	 * so the table never grows and inserts need no reserve. */
	if (nb < 16)
		nb = 16;
	if (nb > (1u << 31))
		nb = 1u << 31;
	if (hashtab_init_fixed(&s->chunks, nb))
		return -ENOMEM;
	INIT_LIST_HEAD(&s->chunk_lru);
	INIT_LIST_HEAD(&s->dead);
	INIT_LIST_HEAD(&s->pub_chunks);
	s->cfg_memory_ratio = s->memory_ratio = 1.0;
	s->content_max = 1u << 20;
	return name_table_init(s, nframes);
}

struct chunk *chunk_find(struct engine *eng, const struct kvp_chunk_id *id)
{
	struct chunk *c;

	hashtab_for_each_possible(&eng->share->chunks, c, hnode,
				  hashtab_hash_digest(id->b))
		if (!memcmp(c->id.b, id->b, sizeof(id->b)))
			return c;
	return NULL;
}

struct chunk *chunk_resolve(struct engine *eng, const struct kvp_chunk_id *id)
{
	struct chunk *c = chunk_find(eng, id);
	struct chunk_name *n;

	if (c)
		return c;
	n = name_find(eng, id);
	return n ? name_root(n) : NULL;
}

static void chunk_table_remove(struct share *s, struct chunk *c)
{
	hashtab_remove(&s->chunks, &c->hnode);
}

/* ------------------------------------------------------------ LRU */

void chunk_lru_remove(struct engine *eng, struct chunk *c)
{
	struct share *s = eng->share;

	if (!c->on_lru)
		return;
	list_del(&c->lru);
	c->on_lru = false;
	s->chunk_lru_frames -= c->npages;
}

static void chunk_lru_push(struct engine *eng, struct chunk *c)
{
	struct share *s = eng->share;

	c->tick = engine_tick(eng);
	c->on_lru = true;
	list_add_tail(&c->lru, &s->chunk_lru);
	s->chunk_lru_frames += c->npages;
}

/* On the LRU exactly when evictable: alive, READY, unheld, a leaf. */
void chunk_lru_update(struct engine *eng, struct chunk *c)
{
	bool want = !c->dead && c->state == KVP_CHUNK_READY && !c->holders &&
		    !c->nchildren;

	if (want && !c->on_lru)
		chunk_lru_push(eng, c);
	else if (!want)
		chunk_lru_remove(eng, c);
}

/* ------------------------------------------------------------ life */

static uint32_t chunk_free(struct engine *eng, struct chunk *c)
{
	uint32_t n = c->npages;

	if (c->dead) /* off the dead list */
		list_del(&c->lru);
	/* Last page first: the next allocation gets them back ascending. */
	while (c->npages)
		frames_free(&eng->frames[KVP_TIER_DEVICE], c->frames[--c->npages]);
	eng->share->chunk_pages -= n;
	free(c->frames);
	free(c);
	return n;
}

static void child_unlink(struct engine *eng, struct chunk *c)
{
	struct chunk *p = c->parent;

	if (!p)
		return;
	list_del(&c->sib);
	c->parent = NULL;
	p->nchildren--;
	chunk_lru_update(eng, p); /* a leaf now, perhaps */
}

static void name_unlink(struct engine *eng, struct chunk *c)
{
	struct chunk_name *n = c->name;

	list_del(&c->name_link);
	c->name = NULL;
	if (!--n->nentries && !n->held)
		name_free(eng, n);
}

/* One entry without children out of the table; freed now or when its
 * last holder lets go. */
static uint32_t chunk_kill_one(struct engine *eng, struct chunk *c)
{
	list_del(&c->pub);
	chunk_lru_remove(eng, c);
	chunk_table_remove(eng->share, c);
	child_unlink(eng, c);
	name_unlink(eng, c);
	if (!c->holders) /* before dead is set: it is on no dead list */
		return chunk_free(eng, c);
	c->dead = true;
	/* Held: on the dead list, so its frames stay accounted for. */
	list_add(&c->lru, &eng->share->dead);
	return 0;
}

/* Deepest first, without recursion: a chain may be as long as the device
 * tier has frames. */
uint32_t chunk_kill_tree(struct engine *eng, struct chunk *c, uint32_t *nkilled)
{
	uint32_t freed = 0;

	if (c->dead)
		return 0;
	for (;;) {
		struct chunk *x = c;

		while (!list_empty(&x->children))
			x = list_first_entry(&x->children, struct chunk, sib);
		freed += chunk_kill_one(eng, x);
		(*nkilled)++;
		if (x == c)
			return freed;
	}
}

void chunk_hold(struct engine *eng, struct chunk *c)
{
	chunk_lru_remove(eng, c);
	c->holders++;
}

void chunk_unhold(struct engine *eng, struct chunk *c)
{
	KVP_BUG_ON(!c->holders, "a chunk is released once per hold, never twice");
	if (--c->holders)
		return;
	if (c->dead)
		chunk_free(eng, c);
	else
		chunk_lru_update(eng, c);
}

uint32_t chunk_evict(struct engine *eng, struct chunk *c)
{
	uint32_t n = 0;

	eng->st.chunk_evicted++;
	tier_demote_chunk(eng, c); /* a sealed root: to disk and the store, if any */
	return chunk_kill_tree(eng, c, &n);
}

void chunk_fill_end(struct engine *eng, struct chunk *c, bool sealed)
{
	struct chunk *pin = c->fill_pin;
	uint32_t n = 0;

	c->fill_lease = 0;
	c->filler = 0;
	c->fill_pin = NULL;
	if (sealed) {
		c->state = KVP_CHUNK_READY;
		/* A root is immutable now: to the store ahead of eviction. */
		if (tier_chunk_kept(eng, c->type) && !c->parent && !c->in_store)
			list_add_tail(&c->pub, &eng->share->pub_chunks);
	} else
		chunk_kill_tree(eng, c, &n); /* its fill lease still holds it */
	if (pin)
		chunk_unhold(eng, pin);
}

void chunk_table_fini(struct engine *eng)
{
	struct share *s = eng->share;
	struct chunk *c;

	if (!s->chunks.buckets)
		return;
	/* A tree's kill takes entries of other buckets with it: each bucket
	 * is read again after every kill. */
	for (uint64_t b = 0; b < hashtab_nbuckets(&s->chunks); b++)
		while (hashtab_bucket(&s->chunks, b)) {
			uint32_t n = 0;

			c = hashtab_entry(hashtab_bucket(&s->chunks, b),
					  struct chunk, hnode);
			while (c->parent)
				c = c->parent;
			chunk_kill_tree(eng, c, &n); /* held ones: dead list */
		}
	/* the engine goes: nobody holds anything */
	while ((c = list_first_entry_or_null(&s->dead, struct chunk, lru))) {
		c->holders = 0;
		chunk_free(eng, c);
	}
	hashtab_fini(&s->chunks);
	name_table_fini(eng);
}

void chunk_touch(struct engine *eng, struct chunk *c, uint64_t now_ns)
{
	if (c->on_lru) {
		chunk_lru_remove(eng, c);
		chunk_lru_push(eng, c);
	}
	if (c->name) {
		c->name->hits++;
		c->name->last_access_ns = now_ns;
	}
	eng->share->chunk_last_access_ns = now_ns;
	eng->st.chunk_hits++;
}

/* ------------------------------------------------------------ queries */

int chunk_not_found(const char *what, const struct kvp_chunk_id *id,
		    struct errbuf *e)
{
	char hex[65];

	kvp_chunk_id_format(id, hex);
	return errbuf_set(e, -ENOENT, "%s %s is not registered (never, or "
			  "deleted, or evicted); register it again", what, hex);
}

static void entry_info_of(const struct engine *eng, const struct chunk *c,
			  struct kvp_chunk_entry_info *out)
{
	const struct chunk *k;

	*out = (struct kvp_chunk_entry_info){
		.id = c->id,
		.name = c->name->id,
		.start = c->start,
		.tokens = c->tokens,
		.pages = c->npages,
		.state = c->state,
		/* the fill lease is the filler's, not a reader's; a FILLING
		 * child's pin is its fill, not a reader either */
		.holders = c->holders - (c->fill_lease ? 1 : 0),
		.children = c->nchildren,
	};
	list_for_each_entry(k, &c->children, sib)
		if (k->fill_pin == c)
			out->holders--;
	if (c->parent)
		out->parent = c->parent->id;
}

int share_chunk_entry(struct engine *eng, const struct kvp_chunk_id *id,
		      struct kvp_chunk_entry_info *out, struct errbuf *e)
{
	struct chunk *c = chunk_find(eng, id);

	if (!c)
		return chunk_not_found("chunk entry", id, e);
	entry_info_of(eng, c, out);
	return 0;
}

int share_chunk_entries(struct engine *eng, const struct kvp_chunk_id *nid,
			struct kvp_chunk_entry_info *rows, uint32_t max,
			struct errbuf *e)
{
	struct chunk_name *n = name_find(eng, nid);
	struct chunk *c;
	uint32_t i = 0;

	if (!n)
		return chunk_not_found("chunk", nid, e);
	/* Oldest first: the list is newest first. */
	list_for_each_entry(c, &n->entries, name_link) {
		if (n->nentries - 1 - i < max)
			entry_info_of(eng, c, &rows[n->nentries - 1 - i]);
		i++;
	}
	return (int)n->nentries;
}

int share_chunk_read_tokens(struct engine *eng, const struct kvp_chunk_id *id,
			    uint32_t pos, uint32_t n, void *out, struct errbuf *e)
{
	struct chunk *c = chunk_resolve(eng, id);
	unsigned char *dst = out;
	int ret = 0;

	if (!c)
		return chunk_not_found("chunk", id, e);
	if (pos > c->tokens || n > c->tokens - pos)
		return errbuf_set(e, -ERANGE, "tokens [%" PRIu32 ", %" PRIu32 ") are "
				  "past the chunk's %" PRIu32, pos, pos + n,
				  c->tokens);
	for (uint32_t i = 0; i < n && !ret; i++, dst += eng->layout.token_bytes)
		ret = share_read_token(eng, c->frames[(pos + i) / eng->P],
				       (pos + i) % eng->P, dst, e);
	return ret;
}
