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
 * the next registration creates it afresh.
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
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "share_internal.h"

/* ------------------------------------------------------------ ids */

void chunk_id_short(const struct kvp_chunk_id *id, char out[17])
{
	for (int i = 0; i < 8; i++)
		snprintf(out + 2 * i, 3, "%02x", id->b[i]);
}

/* SHA-256(layout spec || salt || parent id (0^32: root) || tokens LE). */
static void entry_id_of(const struct engine *eng, const struct chunk *parent,
			const uint32_t *tokens, uint32_t n, struct kvp_chunk_id *id)
{
	static const struct kvp_chunk_id root;
	EVP_MD_CTX *ctx = share_digest_begin(eng);
	char spec[160];
	int len = kvp_layout_format(&eng->layout, spec, sizeof(spec));

	EVP_DigestUpdate(ctx, spec, (size_t)len);
	EVP_DigestUpdate(ctx, eng->share->salt, SHARE_SALT_BYTES);
	EVP_DigestUpdate(ctx, parent ? parent->id.b : root.b, KVP_CHUNK_ID_BYTES);
	share_digest_tokens(ctx, tokens, n);
	EVP_DigestFinal_ex(ctx, id->b, NULL);
}

/* The name: SHA-256 of the content, or of the tokens (LE) without one. */
static void name_id_of(const struct engine *eng, const struct share_chunk_root *r,
		       struct kvp_chunk_id *id)
{
	EVP_MD_CTX *ctx = share_digest_begin(eng);

	if (r->content_len)
		EVP_DigestUpdate(ctx, r->content, r->content_len);
	else
		share_digest_tokens(ctx, r->tokens, r->n);
	EVP_DigestFinal_ex(ctx, id->b, NULL);
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
static void chunk_lru_update(struct engine *eng, struct chunk *c)
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
	if (!--n->nentries)
		name_free(eng, n);
}

/* One entry without children out of the table; freed now or when its
 * last holder lets go. */
static uint32_t chunk_kill_one(struct engine *eng, struct chunk *c)
{
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
	if (!c->holders)
		abort(); /* released twice: an engine bug */
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
	return chunk_kill_tree(eng, c, &n);
}

void chunk_fill_end(struct engine *eng, struct chunk *c, bool sealed)
{
	struct chunk *pin = c->fill_pin;
	uint32_t n = 0;

	c->fill_lease = 0;
	c->filler = 0;
	c->fill_pin = NULL;
	if (sealed)
		c->state = KVP_CHUNK_READY;
	else
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

/* ------------------------------------------------------------ creation */

static void chunk_lease_out(struct engine *eng, const struct chunk *c,
			    uint64_t id, uint32_t n_new, struct engine_lease *out)
{
	memcpy(eng->view, c->frames, (size_t)c->npages * sizeof(*c->frames));
	*out = (struct engine_lease){
		.id = id,
		.start = c->start,
		.len = n_new ? 0 : c->tokens,
		.n_new = n_new,
		.npages = c->npages,
		.frames = eng->view,
		.last_page_len = (uint32_t)((c->tokens - 1) % eng->P) + 1,
		.hit_tokens = n_new ? 0 : c->tokens,
	};
}

static void reg_out(const struct chunk *c, bool created,
		    struct share_chunk_reg *out)
{
	out->id = c->id;
	out->name = c->name->id;
	out->created = created;
	out->state = c->state;
	out->start = c->start;
	out->tokens = c->tokens;
}

/* What a new entry needs before the commit point. */
struct entry_plan {
	uint64_t pages;
	struct chunk *c;
};

static int entry_plan(struct engine *eng, uint32_t n, bool new_name,
		      const char *sid, struct entry_plan *p, struct errbuf *e)
{
	uint64_t avail;
	int ret;

	p->pages = pages_for(eng, n);
	if (p->pages > eng->frames[KVP_TIER_DEVICE].total)
		return errbuf_set(e, -E2BIG, "chunk %s: %" PRIu32 " tokens need %"
				  PRIu64 " pages but the device tier holds only %"
				  PRIu32 "; split it or raise device_mem", sid, n,
				  p->pages, eng->frames[KVP_TIER_DEVICE].total);
	ret = chunk_limits_plan(eng, p->pages, new_name, sid, e);
	if (ret)
		return ret;
	avail = engine_device_avail(eng, NULL, (uint32_t)p->pages); /* <= total */
	if (avail < p->pages)
		return errbuf_set(e, -ENOMEM, "chunk %s: device tier out of memory: "
				  "%" PRIu64 " pages needed, %" PRIu64 " free or "
				  "evictable, the rest held; release leases, delete "
				  "chunks (kvctl chunks) or raise device_mem", sid,
				  p->pages, avail);
	ret = lease_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, (uint32_t)p->pages, e);
	if (ret)
		return ret;
	p->c = calloc(1, sizeof(*p->c));
	if (p->c)
		p->c->frames = malloc(p->pages * sizeof(*p->c->frames));
	if (!p->c || !p->c->frames) {
		free(p->c);
		return errbuf_set(e, -ENOMEM, "chunk %s: out of memory", sid);
	}
	INIT_LIST_HEAD(&p->c->children);
	INIT_LIST_HEAD(&p->c->sib);
	INIT_LIST_HEAD(&p->c->name_link);
	INIT_LIST_HEAD(&p->c->lru);
	return 0;
}

/*
 * After entry_plan() and the name's insertion: make room, take the frames,
 * put the entry in the tables, open its fill lease. Cannot fail.
 */
static void entry_commit(struct engine *eng, struct entry_plan *p,
			 struct chunk_name *name, struct chunk *parent,
			 const struct kvp_chunk_id *id, bool new_name,
			 uint32_t owner, uint64_t now_ns,
			 struct share_chunk_reg *out)
{
	struct share *s = eng->share;
	struct chunk *c = p->c;
	struct lease *l;
	uint64_t lid;

	chunk_limits_make_room(eng, p->pages, new_name);
	evict_for_device(eng, (uint32_t)p->pages);
	c->id = *id;
	c->type = name->type;
	c->state = KVP_CHUNK_FILLING;
	c->tokens = name->ntokens;
	c->start = parent ? parent->start + parent->tokens : 0;
	for (c->npages = 0; c->npages < p->pages; c->npages++)
		c->frames[c->npages] = frames_alloc(&eng->frames[KVP_TIER_DEVICE]);
	hashtab_insert(&s->chunks, &c->hnode, hashtab_hash_digest(id->b));
	s->chunk_pages += p->pages;
	s->chunk_last_access_ns = now_ns;
	/* Into the name's list and the parent's children. */
	c->name = name;
	list_add(&c->name_link, &name->entries);
	name->nentries++;
	name->last_access_ns = now_ns;
	if (parent) {
		c->parent = parent;
		list_add(&c->sib, &parent->children);
		parent->nchildren++;
		c->fill_pin = parent; /* the caller's hold becomes the pin */
	}
	l = lease_new(eng, LEASE_CHUNK_FILL, owner, &lid);
	l->chunk = c;
	c->holders = 1;
	c->filler = owner;
	c->fill_lease = lid;
	reg_out(c, true, out);
	chunk_lease_out(eng, c, lid, c->tokens, &out->lease);
	eng->st.prepares++;
}

/* A found entry: a hit. */
static void entry_hit(struct engine *eng, struct chunk *c, uint64_t now_ns,
		      struct share_chunk_reg *out)
{
	chunk_touch(eng, c, now_ns);
	*out = (struct share_chunk_reg){ 0 };
	reg_out(c, false, out);
}

/* A new name record from r (its tokens, content and metadata copied). */
static int name_make(const struct share_chunk_root *r,
		     const struct kvp_chunk_id *id, struct json_t *meta,
		     char *canon, uint64_t now_ns, const char *sid,
		     struct chunk_name **out, struct errbuf *e)
{
	struct chunk_name *n = calloc(1, sizeof(*n));

	if (n) {
		INIT_LIST_HEAD(&n->entries);
		n->tokens = malloc((size_t)r->n * sizeof(*n->tokens));
		n->content = r->content_len ? malloc(r->content_len) : NULL;
	}
	if (!n || !n->tokens || (r->content_len && !n->content)) {
		if (n) {
			free(n->tokens);
			free(n->content);
		}
		free(n);
		return errbuf_set(e, -ENOMEM, "chunk %s: out of memory for its "
				  "record", sid);
	}
	n->id = *id;
	n->type = r->type;
	n->ntokens = r->n;
	memcpy(n->tokens, r->tokens, (size_t)r->n * sizeof(*n->tokens));
	if (r->content_len)
		memcpy(n->content, r->content, r->content_len);
	n->content_len = r->content_len;
	n->meta = canon;
	n->meta_json = meta;
	n->created_ns = n->last_access_ns = now_ns;
	*out = n;
	return 0;
}

/* Free a name_make() record that never went into the table. */
static void name_unmake(struct chunk_name *n)
{
	json_decref(n->meta_json);
	free(n->meta);
	free(n->tokens);
	free(n->content);
	free(n);
}

int share_chunk_put(struct engine *eng, const struct share_chunk_root *r,
		    uint32_t owner, uint64_t now_ns, struct share_chunk_reg *out,
		    struct errbuf *e)
{
	struct share *s = eng->share;
	struct kvp_chunk_id nid, id;
	struct json_t *meta = NULL;
	struct chunk_name *name, *fresh = NULL;
	struct entry_plan p;
	struct chunk *c;
	char sid[17], *canon = NULL;
	int ret;

	if (!r->n)
		return errbuf_set(e, -EINVAL, "a chunk needs at least one token");
	if (!kvp_chunk_type_name(r->type))
		return errbuf_set(e, -EINVAL, "chunk type %" PRIu32 " is not system "
				  "(1), context (2) or query (3)", r->type);
	if (r->content_len > s->content_max)
		return errbuf_set(e, -E2BIG, "chunk content of %" PRIu32 " bytes is "
				  "over kvpoold's chunk_content_max (%" PRIu64 " bytes);"
				  " store less (a digest, a URL) or raise "
				  "chunk_content_max", r->content_len, s->content_max);
	name_id_of(eng, r, &nid);
	chunk_id_short(&nid, sid);
	name = name_find(eng, &nid);
	if (name && (name->type != r->type || name->ntokens != r->n ||
		     memcmp(name->tokens, r->tokens, (size_t)r->n * 4)))
		return errbuf_set(e, -EINVAL, "chunk %s is registered as %s with %"
				  PRIu32 " tokens; this registration is %s with %"
				  PRIu32 " tokens%s: delete it first (kvctl chunks "
				  "--delete)", sid, kvp_chunk_type_name(name->type),
				  name->ntokens, kvp_chunk_type_name(r->type), r->n,
				  name->type == r->type ? " (other tokens: a different "
				  "tokenizer?)" : "");
	ret = meta_parse(r->meta, "chunk metadata", &meta, &canon, e);
	if (ret)
		return ret;
	entry_id_of(eng, NULL, r->tokens, r->n, &id);
	eng->st.chunk_lookups++;
	c = chunk_find(eng, &id);
	if (c && c->type != r->type) {
		json_decref(meta);
		free(canon);
		chunk_id_short(&c->name->id, sid);
		return errbuf_set(e, -EINVAL, "these %" PRIu32 " tokens are registered "
				  "as %s chunk %s; the same tokens cannot be a %s "
				  "too: delete it first", r->n,
				  kvp_chunk_type_name(c->type), sid,
				  kvp_chunk_type_name(r->type));
	}
	/* Metadata given to a known name is merged into its own (checked
	 * first: the merge may not fit). The entry found belongs to the name
	 * that registered these tokens first, should two contents share
	 * tokens. */
	if (meta && (c || name)) {
		struct chunk_name *into = c ? c->name : name;
		struct json_t *merged;
		char *mtext;

		ret = name_meta_merge(into, meta, &merged, &mtext, e);
		json_decref(meta);
		free(canon);
		if (ret)
			return ret;
		name_meta_set(into, merged, mtext);
		meta = NULL;
		canon = NULL;
	}
	if (c) {
		entry_hit(eng, c, now_ns, out);
		return 0;
	}
	if (!name) {
		ret = name_make(r, &nid, meta, canon, now_ns, sid, &fresh, e);
		if (ret) {
			json_decref(meta);
			free(canon);
			return ret;
		}
	}
	ret = entry_plan(eng, r->n, !name, sid, &p, e);
	if (ret) {
		if (fresh)
			name_unmake(fresh);
		return ret;
	}
	/* Commit point: nothing fails from here on. */
	if (fresh) {
		chunk_limits_make_room(eng, 0, true); /* before it counts itself */
		name_insert(eng, fresh);
		name = fresh;
	}
	entry_commit(eng, &p, name, NULL, &id, false, owner, now_ns, out);
	return 0;
}

int share_chunk_register(struct engine *eng, const uint32_t *tokens, uint32_t n,
			 uint32_t type, const char *meta, uint32_t owner,
			 uint64_t now_ns, struct share_chunk_reg *out,
			 struct errbuf *e)
{
	struct share_chunk_root r = { .tokens = tokens, .n = n, .type = type,
				      .meta = meta };

	return share_chunk_put(eng, &r, owner, now_ns, out, e);
}

static int entry_not_found(const char *what, const struct kvp_chunk_id *id,
			   struct errbuf *e)
{
	char hex[65];

	kvp_chunk_id_format(id, hex);
	return errbuf_set(e, -ENOENT, "%s %s is not registered (never, or "
			  "deleted, or evicted); register it again", what, hex);
}

int share_chunk_link(struct engine *eng, const struct kvp_chunk_id *nid,
		     const struct kvp_chunk_id *pid, uint32_t owner,
		     uint64_t now_ns, struct share_chunk_reg *out,
		     struct errbuf *e)
{
	struct chunk_name *name = name_find(eng, nid);
	struct chunk *parent = chunk_resolve(eng, pid), *c;
	struct kvp_chunk_id id;
	struct entry_plan p;
	char sid[17], spid[17];
	int ret;

	chunk_id_short(nid, sid);
	chunk_id_short(pid, spid);
	eng->st.chunk_lookups++;
	if (!name)
		return entry_not_found("chunk", nid, e);
	if (!parent)
		return entry_not_found("parent entry", pid, e);
	if (parent->state != KVP_CHUNK_READY)
		return errbuf_set(e, -EAGAIN, "chunk %s: parent entry %s is not "
				  "ready: client %" PRIu32 " is filling it; retry "
				  "after it seals", sid, spid, parent->filler);
	if ((uint64_t)parent->start + parent->tokens + name->ntokens > UINT32_MAX)
		return errbuf_set(e, -EINVAL, "chunk %s after entry %s would end "
				  "past position %" PRIu32, sid, spid, UINT32_MAX);
	entry_id_of(eng, parent, name->tokens, name->ntokens, &id);
	c = chunk_find(eng, &id);
	if (c) {
		entry_hit(eng, c, now_ns, out);
		return 0;
	}
	/* Held across the plan: the room made for the link must not be the
	 * parent's. On success the hold becomes the fill pin. */
	chunk_hold(eng, parent);
	ret = entry_plan(eng, name->ntokens, false, sid, &p, e);
	if (ret) {
		chunk_unhold(eng, parent);
		return ret;
	}
	entry_commit(eng, &p, name, parent, &id, false, owner, now_ns, out);
	return 0;
}

int share_chunk_seal(struct engine *eng, uint64_t lease, uint32_t owner,
		     struct errbuf *e)
{
	struct lease *l = lease_lookup(eng, lease);
	int ret;

	if (!l || l->kind != LEASE_CHUNK_FILL)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not a chunk "
				  "fill lease held now (sealed and released "
				  "already, or never registered)", lease);
	if (l->owner != owner)
		return errbuf_set(e, -EPERM, "lease %#" PRIx64 " belongs to client "
				  "%" PRIu32 "; only the client that registered the "
				  "chunk may seal it", lease, l->owner);
	ret = share_lease_commit(eng, l, lease, l->chunk->tokens, e);
	if (ret)
		return ret;
	lease_release(eng, l);
	return 0;
}

int share_chunk_acquire(struct engine *eng, const struct kvp_chunk_id *id,
			uint32_t owner, uint64_t now_ns, struct engine_lease *out,
			struct errbuf *e)
{
	struct chunk *c = chunk_resolve(eng, id);
	struct lease *l;
	uint64_t lid;
	char sid[17];
	int ret;

	eng->st.chunk_lookups++;
	if (!c)
		return entry_not_found("chunk", id, e);
	chunk_id_short(id, sid);
	if (c->state != KVP_CHUNK_READY)
		return errbuf_set(e, -EAGAIN, "chunk %s is not ready: client %"
				  PRIu32 " is filling it; retry after it seals",
				  sid, c->filler);
	ret = lease_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, c->npages, e);
	if (ret)
		return ret;
	l = lease_new(eng, LEASE_CHUNK_READ, owner, &lid);
	l->chunk = c;
	chunk_hold(eng, c);
	chunk_touch(eng, c, now_ns);
	chunk_lease_out(eng, c, lid, 0, out);
	eng->st.prepares++;
	eng->st.hit_tokens += c->tokens;
	return 0;
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
		return entry_not_found("chunk entry", id, e);
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
		return entry_not_found("chunk", nid, e);
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
		return entry_not_found("chunk", id, e);
	if (pos > c->tokens || n > c->tokens - pos)
		return errbuf_set(e, -ERANGE, "tokens [%" PRIu32 ", %" PRIu32 ") are "
				  "past the chunk's %" PRIu32, pos, pos + n,
				  c->tokens);
	for (uint32_t i = 0; i < n && !ret; i++, dst += eng->layout.token_bytes)
		ret = share_read_token(eng, c->frames[(pos + i) / eng->P],
				       (pos + i) % eng->P, dst, e);
	return ret;
}
