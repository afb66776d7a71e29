/* SPDX-License-Identifier: MIT */
/*
 * tier_services_chunk.c - tier_services.h's chunks: what a tier may read of
 * a chunk entry, and the one way a chunk a tier kept comes back into the
 * engine (tier_chunk_adopt). The engine builds its own entries and names
 * here, from a struct tier_chunk_desc; the tier decodes its own record
 * into one (and encodes one from tier_chunk_describe) and never sees
 * struct chunk or struct chunk_name.
 * Every function runs under the engine's lock (tier_services.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "share_internal.h"
#include "tier_services.h"

/* ------------------------------------------------------------ reading */

uint32_t tier_chunk_type(const struct chunk *c)
{
	return c->type;
}

uint32_t tier_chunk_npages(const struct chunk *c)
{
	return c->npages;
}

const uint8_t *tier_chunk_id(const struct chunk *c)
{
	return c->id.b;
}

const uint8_t *tier_chunk_name_id(const struct chunk *c)
{
	return c->name->id.b;
}

bool tier_chunk_in_store(const struct chunk *c)
{
	return c->in_store;
}

void tier_chunk_set_in_store(struct chunk *c, bool in_store)
{
	c->in_store = in_store;
}

uint32_t tier_chunk_pub_next(const struct chunk *c)
{
	return c->pub_next;
}

void tier_chunk_pub_advance(struct chunk *c)
{
	c->pub_next++;
}

void tier_chunk_aliases(struct engine *eng, const struct kvp_chunk_id *id,
			void (*fn)(struct engine *eng, const uint8_t id[32]))
{
	struct chunk_name *n;
	struct chunk *c, *e;

	n = name_find(eng, id);
	if (!n && (c = chunk_find(eng, id)))
		n = c->name;
	if (!n)
		return;
	if (memcmp(n->id.b, id->b, 32))
		fn(eng, n->id.b);
	list_for_each_entry(e, &n->entries, name_link)
		if (!e->parent && memcmp(e->id.b, id->b, 32))
			fn(eng, e->id.b);
}

void tier_chunk_describe(const struct chunk *c, struct tier_chunk_desc *d)
{
	const struct chunk_name *n = c->name;

	*d = (struct tier_chunk_desc){
		.type = c->type, .state = c->state, .tokens = c->tokens,
		.npages = c->npages, .frames = c->frames,
		.root = !c->dead && !c->parent && n,
	};
	memcpy(d->id, c->id.b, sizeof(d->id));
	if (!n)
		return;
	memcpy(d->name_id, n->id.b, sizeof(d->name_id));
	d->ntokens = n->ntokens;
	d->name_tokens = n->tokens;
	d->content = n->content;
	d->content_len = n->content_len;
	d->meta = n->meta;
	d->meta_len = n->meta ? (uint32_t)strlen(n->meta) : 0;
	d->created_ns = n->created_ns;
}

bool tier_chunk_known(struct engine *eng, const struct kvp_chunk_id *id)
{
	return chunk_find(eng, id);
}

bool tier_chunk_name_known(struct engine *eng, const struct kvp_chunk_id *id)
{
	return name_find(eng, id);
}

/* ------------------------------------------------------------ coming back */

/* Room for an entry of pages coming back from `from` (and its name when
 * new): the chunk limits, then the device tier, evicting. */
static int chunk_room(struct engine *eng, uint64_t pages, bool new_name,
		      const char *sid, const char *from, struct errbuf *e)
{
	uint64_t avail;
	int ret = chunk_limits_plan(eng, pages, new_name, sid, e);

	if (ret)
		return ret;
	avail = engine_device_avail(eng, NULL, (uint32_t)pages);
	if (avail < pages)
		return errbuf_set(e, -ENOMEM, "chunk %s: on the %s tier, and the "
				  "device tier has %" PRIu64 " of its %" PRIu64
				  " pages free or evictable; release leases or raise "
				  "device_mem", sid, from, avail, pages);
	chunk_limits_make_room(eng, pages, new_name);
	evict_for_device(eng, (uint32_t)pages);
	return 0;
}

/* A name record from d (metadata parsed again: its canonical form). */
static struct chunk_name *name_from_desc(const struct tier_chunk_desc *d,
					 struct errbuf *e)
{
	struct chunk_name *n = calloc(1, sizeof(*n));
	char *meta = NULL;

	if (!n)
		return NULL;
	INIT_LIST_HEAD(&n->entries);
	n->tokens = malloc((size_t)d->ntokens * 4);
	n->content = d->content_len ? malloc(d->content_len) : NULL;
	meta = d->meta_len ? strndup(d->meta, d->meta_len) : NULL;
	if (!n->tokens || (d->content_len && !n->content) ||
	    (d->meta_len && !meta) ||
	    (meta && meta_parse(meta, "chunk metadata on disk", &n->meta_json,
				&n->meta, e))) {
		free(meta);
		free(n->tokens);
		free(n->content);
		free(n);
		return NULL;
	}
	free(meta);
	memcpy(n->id.b, d->name_id, 32);
	n->type = d->type;
	n->ntokens = d->ntokens;
	memcpy(n->tokens, d->name_tokens, (size_t)d->ntokens * 4);
	if (d->content_len)
		memcpy(n->content, d->content, d->content_len);
	n->content_len = d->content_len;
	n->created_ns = n->last_access_ns = d->created_ns;
	return n;
}

/* The root entry of d under name n, its pages from src[]: READY, unheld. */
static int root_from_desc(struct engine *eng, const struct tier_chunk_desc *d,
			  struct chunk_name *n, const void *const *src,
			  bool from_store)
{
	struct share *s = eng->share;
	struct chunk *c = calloc(1, sizeof(*c));

	if (c)
		c->frames = malloc((d->npages ? d->npages : 1) * sizeof(*c->frames));
	if (!c || !c->frames) {
		free(c);
		return -ENOMEM;
	}
	INIT_LIST_HEAD(&c->children);
	INIT_LIST_HEAD(&c->sib);
	INIT_LIST_HEAD(&c->lru);
	INIT_LIST_HEAD(&c->pub);
	memcpy(c->id.b, d->id, 32);
	c->type = d->type;
	c->state = KVP_CHUNK_READY;
	c->tokens = d->tokens;
	for (c->npages = 0; c->npages < d->npages; c->npages++)
		c->frames[c->npages] = share_frame_alloc(eng);
	if (share_pages_in(eng, src, c->frames, c->npages)) {
		while (c->npages)
			frames_free(&eng->frames[KVP_TIER_DEVICE], c->frames[--c->npages]);
		free(c->frames);
		free(c);
		return -EIO;
	}
	hashtab_insert(&s->chunks, &c->hnode, hashtab_hash_digest(c->id.b));
	s->chunk_pages += c->npages;
	c->name = n;
	list_add(&c->name_link, &n->entries);
	n->nentries++;
	chunk_lru_update(eng, c);
	/* From the store: it has it. From disk: to the store ahead of
	 * eviction, as a chunk sealed here (chunk_fill_end). */
	c->in_store = from_store;
	if (tier_chunk_kept(eng, c->type) && !c->in_store)
		list_add_tail(&c->pub, &s->pub_chunks);
	return 0;
}

int tier_chunk_adopt(struct engine *eng, const struct tier_chunk_desc *d,
		     const void *const *src, bool from_store,
		     const struct kvp_chunk_id *id, const char *from,
		     struct errbuf *e)
{
	const struct kvp_chunk_id *nid = (const struct kvp_chunk_id *)d->name_id;
	struct chunk_name *n, *fresh = NULL;
	char sid[17];
	int ret;

	chunk_id_short(id, sid);
	ret = chunk_room(eng, d->npages, !name_find(eng, nid), sid, from, e);
	if (ret)
		return ret; /* stays below */
	/* The name is looked up after the room is made: making it may have
	 * evicted the name's other entries, and the name with them. */
	n = name_find(eng, nid);
	if (!n) {
		fresh = n = name_from_desc(d, e);
		if (!n)
			return errbuf_set(e, -ENOMEM, "chunk %s: out of memory for "
					  "its record coming back from the %s tier",
					  sid, from);
		name_insert(eng, n);
	}
	ret = root_from_desc(eng, d, n, src, from_store);
	if (ret) {
		if (fresh)
			name_free(eng, fresh);
		return errbuf_set(e, ret, "chunk %s: could not bring its pages back "
				  "from the %s tier (%s)", sid, from, strerror(-ret));
	}
	return 0;
}
