/* SPDX-License-Identifier: MIT */
/*
 * share_chunk_put.c - making chunk entries: a root registered by its tokens
 * (share_chunk_put, share_chunk_register), an entry linked under a parent
 * (share_chunk_link), the fill lease sealed (share_chunk_seal), and a
 * ready entry acquired for reading (share_chunk_acquire). The model, ids
 * and lifetimes are share_chunk.c's (its top comment); limits are
 * share_chunk_limits.c's.
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

void share_chunk_join_out(struct engine *eng, struct lease *l, uint64_t id,
			  struct engine_lease *out)
{
	chunk_lease_out(eng, l->chunk, id, l->chunk->tokens, out);
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
	/* A tensor-parallel pool's fill lease has a group (lease_group.c):
	 * allocated first, kept for the next one when this one fails. */
	if (lease_group_reserve(eng, e))
		return errbuf_set(e, -ENOMEM, "chunk %s: out of memory for a "
				  "group lease", sid);
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
	INIT_LIST_HEAD(&p->c->pub);
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

	/* The room may be made by evicting the name's own last entry
	 * (another parent's link, say): held, the name outlives it. */
	name->held = true;
	chunk_limits_make_room(eng, p->pages, new_name);
	evict_for_device(eng, (uint32_t)p->pages);
	name->held = false;
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
	lease_group_attach(eng, l, owner); /* tp > 1: ranks join it */
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

/* A root's registration checked against itself and the name it has
 * (*namep, NULL when new); nothing changes. */
static int put_check(struct engine *eng, const struct share_chunk_root *r,
		     struct kvp_chunk_id *nid, struct chunk_name **namep,
		     char sid[17], struct errbuf *e)
{
	struct share *s = eng->share;
	struct chunk_name *name;

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
	name_id_of(eng, r, nid);
	chunk_id_short(nid, sid);
	name = name_find(eng, nid);
	if (name && (name->type != r->type || name->ntokens != r->n ||
		     memcmp(name->tokens, r->tokens, (size_t)r->n * 4)))
		return errbuf_set(e, -EINVAL, "chunk %s is registered as %s with %"
				  PRIu32 " tokens; this registration is %s with %"
				  PRIu32 " tokens%s: delete it first (kvctl chunks "
				  "--delete)", sid, kvp_chunk_type_name(name->type),
				  name->ntokens, kvp_chunk_type_name(r->type), r->n,
				  name->type == r->type ? " (other tokens: a different "
				  "tokenizer?)" : "");
	*namep = name;
	return 0;
}

int share_chunk_put(struct engine *eng, const struct share_chunk_root *r,
		    uint32_t owner, uint64_t now_ns, struct share_chunk_reg *out,
		    struct errbuf *e)
{
	struct kvp_chunk_id nid, id;
	struct json_t *meta = NULL;
	struct chunk_name *name = NULL, *fresh = NULL;
	struct entry_plan p;
	struct chunk *c;
	char sid[17], *canon = NULL;
	int ret = put_check(eng, r, &nid, &name, sid, e);

	if (!ret && !name && (eng->disk || tier_chunk_kept(eng, r->type))) {
		/* The name on the disk tier or in the store: back first, then
		 * a hit (a name nobody had costs a store round, for the types
		 * kept there). */
		ret = tier_chunk_restore(eng, &nid, r->type, false, e);
		if (ret == -EINPROGRESS)
			return ret;
		e->msg[0] = '\0'; /* no room for it: registered afresh */
		ret = put_check(eng, r, &nid, &name, sid, e);
	}
	if (ret)
		return ret;
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
		return chunk_not_found("chunk", nid, e);
	if (!parent)
		return chunk_not_found("parent entry", pid, e);
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
	if (l->grp) /* every rank seals a group's: engine_chunk_seal_rank */
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 " is a tensor-parallel "
				  "group's fill lease: each rank seals it", lease);
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

	if (!c) { /* a name on the disk tier comes back first */
		ret = tier_chunk_restore(eng, id, 0, false, e);
		if (ret && ret != -ENOENT)
			return ret; /* -EINPROGRESS: retried; or no room */
		c = chunk_resolve(eng, id);
	}
	eng->st.chunk_lookups++;
	if (!c)
		return chunk_not_found("chunk", id, e);
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
