/* SPDX-License-Identifier: MIT */
/*
 * share_chunk_limits.c - a tenant's chunk limits (kvpool.h
 * kvp_chunk_limits): max_chunks names and chunk_memory_ratio of the device
 * tier, configured per tenant and lowered (never raised) by its clients;
 * the room a new entry or name needs, planned before anything changes and
 * made after; and the consistency walk over entries and names.
 *
 * Room is made by eviction of what nobody holds: for max_chunks whole
 * names, least recently accessed first, among those whose entries and
 * everything below them are READY and unheld (chunk_mark_busy); for the
 * ratio, LRU leaves (an entry with children is not on the LRU; it joins it
 * when its last child goes).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "share_internal.h"

/* ------------------------------------------------------------ limits */

void share_chunk_configure(struct engine *eng, uint64_t max_chunks,
			   double memory_ratio, uint64_t content_max)
{
	struct share *s = eng->share;

	s->cfg_max_chunks = s->max_chunks = max_chunks;
	s->cfg_memory_ratio = s->memory_ratio = memory_ratio;
	s->content_max = content_max;
}

static uint64_t limit_pages(const struct engine *eng)
{
	return (uint64_t)(eng->share->memory_ratio * eng->share->nframes);
}

int share_chunk_limits(struct engine *eng, int64_t max_chunks,
		       double memory_ratio, struct kvp_chunk_limits *out,
		       struct errbuf *e)
{
	struct share *s = eng->share;

	if (memory_ratio != memory_ratio || memory_ratio == 0)
		return errbuf_set(e, -EINVAL, "chunk memory ratio %g: give a "
				  "fraction of the device tier in (0, %g], or a "
				  "negative number to keep %g", memory_ratio,
				  s->cfg_memory_ratio, s->memory_ratio);
	if (max_chunks >= 0)
		s->max_chunks = s->cfg_max_chunks && (!max_chunks ||
			(uint64_t)max_chunks > s->cfg_max_chunks) ?
			s->cfg_max_chunks : (uint64_t)max_chunks;
	if (memory_ratio > 0)
		s->memory_ratio = memory_ratio > s->cfg_memory_ratio ?
				  s->cfg_memory_ratio : memory_ratio;
	if (out)
		*out = (struct kvp_chunk_limits){
			.max_chunks = s->max_chunks,
			.config_max_chunks = s->cfg_max_chunks,
			.memory_ratio = s->memory_ratio,
			.config_memory_ratio = s->cfg_memory_ratio,
			.names = s->names.count,
			.pages = s->chunk_pages,
			.limit_pages = limit_pages(eng),
		};
	return 0;
}

/* A name whose entries are all unmarked (chunk_mark_busy), the least
 * recently accessed one; NULL when none. */
static struct chunk_name *name_freeable(struct engine *eng)
{
	struct share *s = eng->share;
	struct chunk_name *best = NULL;

	struct chunk_name *n;
	struct chunk *c;

	hashtab_for_each_safe(&s->names, n, hnode) {
		bool busy = n->held;

		list_for_each_entry(c, &n->entries, name_link)
			busy |= c->mark == s->mark;
		if (!busy && (!best || n->last_access_ns < best->last_access_ns))
			best = n;
	}
	return best;
}

/*
 * Plan room for an entry of pages (and a new name when new_name): -ENOMEM
 * naming the limit when it cannot be made; nothing changes. The caller
 * holds what it must keep (a link's parent) before.
 */
int chunk_limits_plan(struct engine *eng, uint64_t pages, bool new_name,
		       const char *sid, struct errbuf *e)
{
	struct share *s = eng->share;
	uint64_t lim = limit_pages(eng), free_pages;
	bool names_full = new_name && s->max_chunks && s->names.count >= s->max_chunks;

	if (!names_full && s->chunk_pages + pages <= lim)
		return 0;
	free_pages = chunk_mark_busy(eng);
	if (names_full && !name_freeable(eng))
		return errbuf_set(e, -ENOMEM, "chunk %s: the tenant has %" PRIu64
				  " chunks, its max_chunks, and every one of them "
				  "has entries held (leases, compositions, sequences) "
				  "or being filled, or under such; release some or "
				  "delete chunks (kvctl chunks), or raise max_chunks",
				  sid, s->names.count);
	if (s->chunk_pages + pages > lim + free_pages)
		return errbuf_set(e, -ENOMEM, "chunk %s: %" PRIu64 " more pages "
				  "would pass chunk_memory_ratio %.3g (%" PRIu64
				  " of %" PRIu32 " device pages); chunks have %"
				  PRIu64 ", %" PRIu64 " of them held, being filled "
				  "or under such entries; release some, delete "
				  "chunks or raise chunk_memory_ratio", sid, pages,
				  s->memory_ratio, lim, s->nframes, s->chunk_pages,
				  s->chunk_pages - free_pages);
	return 0;
}

/* Make the room limits_plan() found: cannot fail. */
void chunk_limits_make_room(struct engine *eng, uint64_t pages, bool new_name)
{
	struct share *s = eng->share;
	uint64_t lim = limit_pages(eng);

	if (new_name && s->max_chunks && s->names.count >= s->max_chunks) {
		struct chunk_name *n;

		chunk_mark_busy(eng);
		n = name_freeable(eng);
		while (n && s->names.count >= s->max_chunks) {
			const struct kvp_chunk_id id = n->id;

			/* The last entry's kill frees the name. */
			while ((n = name_find(eng, &id)))
				chunk_evict(eng, name_first_entry(n));
			n = name_freeable(eng);
		}
	}
	while (s->chunk_pages + pages > lim && chunk_lru_head(s))
		chunk_evict(eng, chunk_lru_head(s));
}

/* ------------------------------------------------------------ check */

static int entry_check(struct engine *eng, const struct chunk *c,
		       struct errbuf *e)
{
	bool want_lru = c->state == KVP_CHUNK_READY && !c->holders &&
			!c->nchildren;
	uint32_t kids = 0, pins = 0;
	const struct chunk *k;
	char sid[17];

	chunk_id_short(&c->id, sid);
	if (c->dead || c->on_lru != want_lru)
		return errbuf_set(e, -EFAULT, "chunk entry %s: dead %d, on LRU %d, "
				  "holders %" PRIu32 ", children %" PRIu32, sid,
				  c->dead, c->on_lru, c->holders, c->nchildren);
	if ((c->state == KVP_CHUNK_FILLING) != !!c->fill_lease ||
	    (c->fill_lease && !c->holders) ||
	    (c->fill_pin && c->fill_pin != c->parent) ||
	    (c->parent && c->state == KVP_CHUNK_FILLING && !c->fill_pin))
		return errbuf_set(e, -EFAULT, "chunk entry %s: state %" PRIu32
				  " with fill lease %#" PRIx64 ", pin %p", sid,
				  c->state, c->fill_lease, (void *)c->fill_pin);
	if (!c->name || name_find(eng, &c->name->id) != c->name ||
	    c->type != c->name->type || c->tokens != c->name->ntokens)
		return errbuf_set(e, -EFAULT, "chunk entry %s: its name is not "
				  "in the table or does not match", sid);
	if (c->parent && (c->parent->dead || chunk_find(eng, &c->parent->id) !=
			  c->parent || c->start != c->parent->start +
			  c->parent->tokens))
		return errbuf_set(e, -EFAULT, "chunk entry %s: parent gone or "
				  "start %" PRIu32 " wrong", sid, c->start);
	if (!c->parent && c->start)
		return errbuf_set(e, -EFAULT, "chunk root %s starts at %" PRIu32,
				  sid, c->start);
	list_for_each_entry(k, &c->children, sib) {
		if (k->parent != c || ++kids > c->nchildren)
			return errbuf_set(e, -EFAULT, "chunk entry %s: child list "
					  "holds %u+ entries, counts %" PRIu32, sid,
					  kids, c->nchildren);
		pins += k->fill_pin == c;
	}
	if (kids != c->nchildren || pins + (c->fill_lease ? 1 : 0) > c->holders)
		return errbuf_set(e, -EFAULT, "chunk entry %s: %u children listed, "
				  "%" PRIu32 " counted; %u pins, %" PRIu32
				  " holders", sid, kids, c->nchildren, pins,
				  c->holders);
	return 0;
}

int chunk_check(struct engine *eng, uint8_t *owner, uint64_t *frames,
		struct errbuf *e)
{
	struct share *s = eng->share;
	uint64_t alive = 0, lru = 0, lru_frames = 0, named = 0, names = 0;
	int ret;

	struct chunk_name *n;
	struct chunk *c;

	hashtab_for_each_safe(&s->chunks, c, hnode) {
		alive++;
		ret = entry_check(eng, c, e);
		if (ret)
			return ret;
		for (uint32_t i = 0; i < c->npages; i++) {
			uint32_t f = c->frames[i];

			if (!frames_in_use(&eng->frames[KVP_TIER_DEVICE], f) ||
			    owner[f])
				return errbuf_set(e, -EFAULT, "chunk page %"
						  PRIu32 ": frame %" PRIu32
						  " free or owned twice", i, f);
			owner[f] = 1;
			(*frames)++;
		}
	}
	hashtab_for_each_safe(&s->names, n, hnode) {
		uint32_t k = 0;

		names++;
		list_for_each_entry(c, &n->entries, name_link)
			if (c->name != n || ++k > n->nentries)
				return errbuf_set(e, -EFAULT, "chunk name "
						  "list broken");
		if (!k || k != n->nentries)
			return errbuf_set(e, -EFAULT, "chunk name with %u "
					  "entries listed, %" PRIu32
					  " counted", k, n->nentries);
		named += k;
	}
	list_for_each_entry(c, &s->chunk_lru, lru) {
		lru_frames += c->npages;
		if (++lru > alive)
			return errbuf_set(e, -EFAULT, "chunk LRU has a cycle");
	}
	if (alive != s->chunks.count || lru_frames != s->chunk_lru_frames ||
	    named != alive || names != s->names.count)
		return errbuf_set(e, -EFAULT, "chunk table counts %" PRIu64 " (found %"
				  PRIu64 ", %" PRIu64 " through names), LRU frames %"
				  PRIu64 " (found %" PRIu64 "), names %" PRIu64
				  " (found %" PRIu64 ")", s->chunks.count, alive,
				  named, s->chunk_lru_frames, lru_frames,
				  s->names.count, names);
	/* Dead entries still held own their frames too. */
	list_for_each_entry(c, &s->dead, lru) {
		if (!c->dead || !c->holders || c->name || c->parent)
			return errbuf_set(e, -EFAULT, "dead chunk list holds an entry "
					  "alive, unheld or linked");
		for (uint32_t i = 0; i < c->npages; i++) {
			if (owner[c->frames[i]])
				return errbuf_set(e, -EFAULT, "dead chunk frame %"
						  PRIu32 " owned twice", c->frames[i]);
			owner[c->frames[i]] = 1;
			(*frames)++;
		}
	}
	return 0;
}
