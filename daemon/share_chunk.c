/* SPDX-License-Identifier: MIT */
/*
 * share_chunk.c - chunks (seed 001): immutable token spans with their KV,
 * content-addressed, filled once by the client that registered them first.
 *
 * Life of a chunk:
 *
 *   register (new id) ──▶ FILLING, held by its fill lease
 *        │ commit(all tokens) / share_chunk_seal
 *        ▼
 *      READY ── holders 0 ──▶ on the chunk LRU (evictable)
 *        │ delete / clear / evict_unused / evicted under pressure
 *        ▼
 *      dead: out of the table, so nobody finds it again; its frames go
 *      back when the last holder lets go (a leased chunk stays readable).
 *
 * A fill lease released (or its client dead) before the seal deletes the
 * chunk: nobody ever sees half-written pages, and the next register of
 * the content creates it afresh.
 */
#include <errno.h>
#include <inttypes.h>
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

/* SHA-256(layout spec || salt || tokens as LE uint32). */
static void chunk_id_of(const struct engine *eng, const uint32_t *tokens,
			uint32_t n, struct kvp_chunk_id *id)
{
	EVP_MD_CTX *ctx = share_digest_begin(eng);
	char spec[160];
	int len = kvp_layout_format(&eng->layout, spec, sizeof(spec));

	EVP_DigestUpdate(ctx, spec, (size_t)len);
	EVP_DigestUpdate(ctx, eng->share->salt, SHARE_SALT_BYTES);
	share_digest_tokens(ctx, tokens, n);
	EVP_DigestFinal_ex(ctx, id->b, NULL);
}

/* ------------------------------------------------------------ table */

static uint32_t chunk_bucket(const struct share *s, const struct kvp_chunk_id *id)
{
	uint32_t b;

	memcpy(&b, id->b, sizeof(b));
	return b & s->chunk_mask;
}

int chunk_table_init(struct share *s, uint32_t nframes)
{
	uint32_t nb = 16;

	/* Alive chunks hold a frame each at least: they never outnumber frames. */
	while (nb < 2 * (uint64_t)nframes && nb < (1u << 31))
		nb <<= 1;
	s->chunk_buckets = calloc(nb, sizeof(*s->chunk_buckets));
	if (!s->chunk_buckets)
		return -ENOMEM;
	s->chunk_mask = nb - 1;
	return 0;
}

struct chunk *chunk_find(struct engine *eng, const struct kvp_chunk_id *id)
{
	struct share *s = eng->share;

	for (struct chunk *c = s->chunk_buckets[chunk_bucket(s, id)]; c; c = c->hnext)
		if (!memcmp(c->id.b, id->b, sizeof(id->b)))
			return c;
	return NULL;
}

static void chunk_table_remove(struct share *s, struct chunk *c)
{
	struct chunk **p = &s->chunk_buckets[chunk_bucket(s, &c->id)];

	while (*p != c)
		p = &(*p)->hnext;
	*p = c->hnext;
	c->hnext = NULL;
	s->chunk_count--;
}

/* ------------------------------------------------------------ LRU */

void chunk_lru_remove(struct engine *eng, struct chunk *c)
{
	struct share *s = eng->share;

	if (!c->on_lru)
		return;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->chunk_head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		s->chunk_tail = c->prev;
	c->prev = c->next = NULL;
	c->on_lru = false;
	s->chunk_lru_frames -= c->npages;
}

static void chunk_lru_push(struct engine *eng, struct chunk *c)
{
	struct share *s = eng->share;

	c->tick = ++eng->tick;
	c->on_lru = true;
	c->next = NULL;
	c->prev = s->chunk_tail;
	if (s->chunk_tail)
		s->chunk_tail->next = c;
	else
		s->chunk_head = c;
	s->chunk_tail = c;
	s->chunk_lru_frames += c->npages;
}

/* ------------------------------------------------------------ life */

static uint32_t chunk_free(struct engine *eng, struct chunk *c)
{
	struct share *s = eng->share;
	uint32_t n = c->npages;

	if (c->dead) { /* off the dead list */
		if (c->prev)
			c->prev->next = c->next;
		else
			s->dead_head = c->next;
		if (c->next)
			c->next->prev = c->prev;
	}
	/* Last page first: the next allocation gets them back ascending. */
	while (c->npages)
		frames_free(&eng->frames[KVP_TIER_DEVICE], c->frames[--c->npages]);
	eng->share->chunk_pages -= n;
	free(c->frames);
	free(c);
	return n;
}

/* Out of the table; freed now or when its last holder lets go. */
static uint32_t chunk_kill(struct engine *eng, struct chunk *c)
{
	if (c->dead)
		return 0;
	chunk_lru_remove(eng, c);
	chunk_table_remove(eng->share, c);
	if (!c->holders) /* before dead is set: it is on no dead list */
		return chunk_free(eng, c);
	c->dead = true;
	/* Held: on the dead list, so its frames stay accounted for. */
	c->prev = NULL;
	c->next = eng->share->dead_head;
	if (c->next)
		c->next->prev = c;
	eng->share->dead_head = c;
	return 0;
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
	else if (c->state == KVP_CHUNK_READY)
		chunk_lru_push(eng, c);
}

uint32_t chunk_evict(struct engine *eng, struct chunk *c)
{
	eng->st.chunk_evicted++;
	return chunk_kill(eng, c);
}

void chunk_fill_end(struct engine *eng, struct chunk *c, bool sealed)
{
	c->fill_lease = 0;
	c->filler = 0;
	if (sealed)
		c->state = KVP_CHUNK_READY;
	else
		chunk_kill(eng, c); /* its fill lease still holds it */
}

void chunk_table_fini(struct engine *eng)
{
	struct share *s = eng->share;

	if (!s->chunk_buckets)
		return;
	for (uint32_t b = 0; b <= s->chunk_mask; b++)
		while (s->chunk_buckets[b]) {
			struct chunk *c = s->chunk_buckets[b];

			c->holders = 0; /* the engine goes: nobody holds anything */
			chunk_kill(eng, c);
		}
	while (s->dead_head) { /* only after a fault: holders are gone */
		struct chunk *c = s->dead_head;

		c->holders = 0;
		chunk_free(eng, c);
	}
	free(s->chunk_buckets);
	s->chunk_buckets = NULL;
}

/* A hit: count it and make the chunk the most recently used. */
static void chunk_touch(struct engine *eng, struct chunk *c, uint64_t now_ns)
{
	if (c->on_lru) {
		chunk_lru_remove(eng, c);
		chunk_lru_push(eng, c);
	}
	c->hits++;
	c->last_access_ns = now_ns;
	eng->share->chunk_last_access_ns = now_ns;
	eng->st.chunk_hits++;
}

/* ------------------------------------------------------------ metadata */

/* "k=v,k2=v2": printable, no ',' or '=' inside a key or value, keys
 * non-empty. */
static int meta_check(const char *meta, struct errbuf *e)
{
	size_t len = strnlen(meta, KVP_CHUNK_META_MAX);
	const char *p = meta;

	if (len >= KVP_CHUNK_META_MAX)
		return errbuf_set(e, -EINVAL, "chunk metadata is longer than %d "
				  "bytes; keep it short (ids, names, versions)",
				  KVP_CHUNK_META_MAX - 1);
	while (*p) {
		const char *end = strchr(p, ','), *eq;
		size_t n = end ? (size_t)(end - p) : strlen(p);

		eq = memchr(p, '=', n);
		if (!eq || eq == p || memchr(eq + 1, '=', n - (size_t)(eq + 1 - p)))
			return errbuf_set(e, -EINVAL, "chunk metadata '%.*s': each "
					  "pair must be key=value with a non-empty key "
					  "(pairs separated by ',')", (int)n, p);
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
				return errbuf_set(e, -EINVAL, "chunk metadata holds a "
						  "control character at byte %zu",
						  (size_t)(p - meta) + i);
		p += n + (end ? 1 : 0);
		if (end && !*p)
			return errbuf_set(e, -EINVAL, "chunk metadata ends with ','");
	}
	return 0;
}

/* Every pair of filter is one of meta's pairs. */
static bool meta_match(const char *meta, const char *filter)
{
	const char *f = filter;

	while (f && *f) {
		const char *fe = strchr(f, ',');
		size_t fn = fe ? (size_t)(fe - f) : strlen(f);
		const char *m = meta;
		bool found = false;

		while (*m && !found) {
			const char *me = strchr(m, ',');
			size_t mn = me ? (size_t)(me - m) : strlen(m);

			found = mn == fn && !memcmp(m, f, fn);
			m += mn + (me ? 1 : 0);
		}
		if (!found)
			return false;
		f += fn + (fe ? 1 : 0);
	}
	return true;
}

/* ------------------------------------------------------------ operations */

static void chunk_lease_out(struct engine *eng, const struct chunk *c,
			    uint64_t id, uint32_t n_new, struct engine_lease *out)
{
	memcpy(eng->view, c->frames, (size_t)c->npages * sizeof(*c->frames));
	*out = (struct engine_lease){
		.id = id,
		.len = n_new ? 0 : c->tokens,
		.n_new = n_new,
		.npages = c->npages,
		.frames = eng->view,
		.last_page_len = (uint32_t)((c->tokens - 1) % eng->P) + 1,
		.hit_tokens = n_new ? 0 : c->tokens,
	};
}

int share_chunk_register(struct engine *eng, const uint32_t *tokens, uint32_t n,
			 uint32_t type, const char *meta, uint32_t owner,
			 uint64_t now_ns, struct share_chunk_reg *out,
			 struct errbuf *e)
{
	struct share *s = eng->share;
	struct share_lease *l;
	struct kvp_chunk_id id;
	struct chunk *c;
	uint64_t pages, lid;
	char sid[17];
	int ret;

	if (!n)
		return errbuf_set(e, -EINVAL, "a chunk needs at least one token");
	if (!kvp_chunk_type_name(type))
		return errbuf_set(e, -EINVAL, "chunk type %" PRIu32 " is not system "
				  "(1), context (2) or query (3)", type);
	ret = meta_check(meta ? meta : "", e);
	if (ret)
		return ret;
	chunk_id_of(eng, tokens, n, &id);
	chunk_id_short(&id, sid);
	eng->st.chunk_lookups++;
	c = chunk_find(eng, &id);
	if (c) {
		if (c->type != type)
			return errbuf_set(e, -EINVAL, "chunk %s is registered as %s, "
					  "not %s: the same tokens cannot be two "
					  "types", sid, kvp_chunk_type_name(c->type),
					  kvp_chunk_type_name(type));
		chunk_touch(eng, c, now_ns);
		*out = (struct share_chunk_reg){ .id = id, .created = false,
						 .state = c->state };
		return 0;
	}
	pages = pages_for(eng, n);
	if (pages > eng->frames[KVP_TIER_DEVICE].total)
		return errbuf_set(e, -E2BIG, "chunk %s: %" PRIu32 " tokens need %"
				  PRIu64 " pages but the device tier holds only %"
				  PRIu32 "; split it or raise device_mem", sid, n,
				  pages, eng->frames[KVP_TIER_DEVICE].total);
	if (engine_device_avail(eng, NULL) < pages)
		return errbuf_set(e, -ENOMEM, "chunk %s: device tier out of memory: "
				  "%" PRIu64 " pages needed, %" PRIu64 " free or "
				  "evictable, the rest held; release leases, delete "
				  "chunks (kvctl chunks) or raise device_mem", sid,
				  pages, engine_device_avail(eng, NULL));
	ret = slease_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, (uint32_t)pages, e);
	if (ret)
		return ret;
	c = calloc(1, sizeof(*c));
	if (c)
		c->frames = malloc(pages * sizeof(*c->frames));
	if (!c || !c->frames) {
		free(c);
		return errbuf_set(e, -ENOMEM, "chunk %s: out of memory", sid);
	}

	/* Commit point: nothing fails from here on. */
	evict_for_device(eng, (uint32_t)pages);
	c->id = id;
	c->type = type;
	c->state = KVP_CHUNK_FILLING;
	c->tokens = n;
	for (c->npages = 0; c->npages < pages; c->npages++)
		c->frames[c->npages] = frames_alloc(&eng->frames[KVP_TIER_DEVICE]);
	c->created_ns = c->last_access_ns = now_ns;
	snprintf(c->meta, sizeof(c->meta), "%s", meta ? meta : "");
	c->hnext = s->chunk_buckets[chunk_bucket(s, &id)];
	s->chunk_buckets[chunk_bucket(s, &id)] = c;
	s->chunk_count++;
	s->chunk_pages += pages;
	s->chunk_last_access_ns = now_ns;
	slease_new(eng, SL_CHUNK_FILL, owner, &lid, &l, NULL);
	l->chunk = c;
	c->holders = 1;
	c->filler = owner;
	c->fill_lease = lid;
	out->id = id;
	out->created = true;
	out->state = c->state;
	chunk_lease_out(eng, c, lid, n, &out->lease);
	eng->st.prepares++;
	return 0;
}

int share_chunk_seal(struct engine *eng, uint64_t lease, uint32_t owner,
		     struct errbuf *e)
{
	struct share_lease *l = slease_lookup(eng, lease);
	int ret;

	if (!l || l->kind != SL_CHUNK_FILL)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not a chunk "
				  "fill lease held now (sealed and released "
				  "already, or never registered)", lease);
	if (l->owner != owner)
		return errbuf_set(e, -EPERM, "lease %#" PRIx64 " belongs to client "
				  "%" PRIu32 "; only the client that registered the "
				  "chunk may seal it", lease, l->owner);
	ret = share_lease_commit(eng, lease, l->chunk->tokens, e);
	if (ret)
		return ret;
	return share_lease_release(eng, lease, e);
}

static int chunk_not_found(const struct kvp_chunk_id *id, struct errbuf *e)
{
	char hex[65];

	kvp_chunk_id_format(id, hex);
	return errbuf_set(e, -ENOENT, "chunk %s is not registered (never, or "
			  "deleted, or evicted); register it again", hex);
}

int share_chunk_acquire(struct engine *eng, const struct kvp_chunk_id *id,
			uint32_t owner, uint64_t now_ns, struct engine_lease *out,
			struct errbuf *e)
{
	struct chunk *c = chunk_find(eng, id);
	struct share_lease *l;
	uint64_t lid;
	char sid[17];
	int ret;

	eng->st.chunk_lookups++;
	if (!c)
		return chunk_not_found(id, e);
	chunk_id_short(id, sid);
	if (c->state != KVP_CHUNK_READY)
		return errbuf_set(e, -EAGAIN, "chunk %s is not ready: client %"
				  PRIu32 " is filling it; retry after it seals",
				  sid, c->filler);
	ret = slease_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, c->npages, e);
	if (ret)
		return ret;
	slease_new(eng, SL_CHUNK_READ, owner, &lid, &l, NULL);
	l->chunk = c;
	chunk_hold(eng, c);
	chunk_touch(eng, c, now_ns);
	chunk_lease_out(eng, c, lid, 0, out);
	eng->st.prepares++;
	eng->st.hit_tokens += c->tokens;
	return 0;
}

static void chunk_info_of(const struct engine *eng, const struct chunk *c,
			  struct kvp_chunk_info *out)
{
	*out = (struct kvp_chunk_info){
		.id = c->id,
		.type = c->type,
		.state = c->state,
		.tokens = c->tokens,
		.pages = c->npages,
		.bytes = (uint64_t)c->npages * eng->layout.page_bytes,
		/* the fill lease is the filler's, not a reader's */
		.holders = c->holders - (c->fill_lease ? 1 : 0),
		.filler = c->filler,
		.created_ns = c->created_ns,
		.last_access_ns = c->last_access_ns,
		.hits = c->hits,
	};
	memcpy(out->meta, c->meta, sizeof(out->meta));
}

int share_chunk_info(struct engine *eng, const struct kvp_chunk_id *id,
		     struct kvp_chunk_info *out, struct errbuf *e)
{
	struct chunk *c = chunk_find(eng, id);

	if (!c)
		return chunk_not_found(id, e);
	chunk_info_of(eng, c, out);
	return 0;
}

static int cmp_id(const void *a, const void *b)
{
	return memcmp(a, b, sizeof(struct kvp_chunk_id));
}

int share_chunk_list(struct engine *eng, uint32_t type, const char *filter,
		     const struct kvp_chunk_id *cursor, struct kvp_chunk_info *rows,
		     uint32_t max, bool *more, struct errbuf *e)
{
	struct share *s = eng->share;
	uint64_t n = 0, from = 0;
	uint32_t w = 0;
	int ret;

	*more = false;
	if (type && !kvp_chunk_type_name(type))
		return errbuf_set(e, -EINVAL, "chunk type %" PRIu32 " is not system "
				  "(1), context (2) or query (3)", type);
	ret = meta_check(filter ? filter : "", e);
	if (ret)
		return ret;
	if (s->chunk_count > s->ids_cap) {
		struct kvp_chunk_id *p = realloc(s->ids, s->chunk_count * sizeof(*p));

		if (!p)
			return errbuf_set(e, -ENOMEM, "out of memory listing %" PRIu64
					  " chunks", s->chunk_count);
		s->ids = p;
		s->ids_cap = s->chunk_count;
	}
	for (uint32_t b = 0; b <= s->chunk_mask; b++)
		for (struct chunk *c = s->chunk_buckets[b]; c; c = c->hnext)
			if ((!type || c->type == type) &&
			    (!cursor || memcmp(c->id.b, cursor->b, 32) > 0) &&
			    meta_match(c->meta, filter))
				s->ids[n++] = c->id;
	/* A tenant that never had a chunk has no ids array yet, and qsort's
	 * base must not be NULL even for 0 elements (glibc declares it
	 * nonnull; UBSan aborts the daemon on it). */
	if (n > 1)
		qsort(s->ids, n, sizeof(*s->ids), cmp_id);
	for (; from < n && w < max; from++)
		chunk_info_of(eng, chunk_find(eng, &s->ids[from]), &rows[w++]);
	*more = from < n;
	return (int)w;
}

int share_chunk_delete(struct engine *eng, const struct kvp_chunk_id *id,
		       struct errbuf *e)
{
	struct chunk *c = chunk_find(eng, id);

	if (!c)
		return chunk_not_found(id, e);
	return (int)chunk_kill(eng, c);
}

/* Kill every alive chunk matching pred; returns how many. */
static int chunk_kill_matching(struct engine *eng,
			       bool (*pred)(const struct chunk *, const void *),
			       const void *arg, bool evicted)
{
	struct share *s = eng->share;
	int n = 0;

	for (uint32_t b = 0; b <= s->chunk_mask; b++) {
		struct chunk *c = s->chunk_buckets[b], *next;

		for (; c; c = next) {
			next = c->hnext;
			if (!pred(c, arg))
				continue;
			if (evicted)
				eng->st.chunk_evicted++;
			chunk_kill(eng, c);
			n++;
		}
	}
	return n;
}

static bool of_type(const struct chunk *c, const void *arg)
{
	uint32_t type = *(const uint32_t *)arg;

	return !type || c->type == type;
}

int share_chunk_clear(struct engine *eng, uint32_t type)
{
	if (type && !kvp_chunk_type_name(type))
		return -EINVAL;
	return chunk_kill_matching(eng, of_type, &type, false);
}

struct age_arg {
	uint64_t max_age_ns;
	uint64_t now_ns;
};

static bool unused_for(const struct chunk *c, const void *arg)
{
	const struct age_arg *a = arg;

	return c->state == KVP_CHUNK_READY && !c->holders &&
	       a->now_ns >= c->last_access_ns &&
	       a->now_ns - c->last_access_ns >= a->max_age_ns;
}

int share_chunk_evict_unused(struct engine *eng, uint64_t max_age_ns,
			     uint64_t now_ns)
{
	struct age_arg a = { max_age_ns, now_ns };

	return chunk_kill_matching(eng, unused_for, &a, true);
}

int share_chunk_read_tokens(struct engine *eng, const struct kvp_chunk_id *id,
			    uint32_t pos, uint32_t n, void *out, struct errbuf *e)
{
	struct chunk *c = chunk_find(eng, id);
	unsigned char *dst = out;
	int ret = 0;

	if (!c)
		return chunk_not_found(id, e);
	if (pos > c->tokens || n > c->tokens - pos)
		return errbuf_set(e, -ERANGE, "tokens [%" PRIu32 ", %" PRIu32 ") are "
				  "past the chunk's %" PRIu32, pos, pos + n,
				  c->tokens);
	for (uint32_t i = 0; i < n && !ret; i++, dst += eng->layout.token_bytes)
		ret = share_read_token(eng, c->frames[(pos + i) / eng->P],
				       (pos + i) % eng->P, dst, e);
	return ret;
}

int chunk_check(struct engine *eng, uint8_t *owner, uint64_t *frames,
		struct errbuf *e)
{
	struct share *s = eng->share;
	uint64_t alive = 0, lru = 0, lru_frames = 0;

	for (uint32_t b = 0; b <= s->chunk_mask; b++)
		for (struct chunk *c = s->chunk_buckets[b]; c; c = c->hnext) {
			char sid[17];
			bool want_lru = c->state == KVP_CHUNK_READY && !c->holders;

			chunk_id_short(&c->id, sid);
			alive++;
			if (c->dead || c->on_lru != want_lru)
				return errbuf_set(e, -EFAULT, "chunk %s: dead %d, on "
						  "LRU %d, holders %" PRIu32, sid,
						  c->dead, c->on_lru, c->holders);
			if ((c->state == KVP_CHUNK_FILLING) != !!c->fill_lease ||
			    (c->fill_lease && !c->holders))
				return errbuf_set(e, -EFAULT, "chunk %s: state %"
						  PRIu32 " with fill lease %#" PRIx64,
						  sid, c->state, c->fill_lease);
			for (uint32_t i = 0; i < c->npages; i++) {
				uint32_t f = c->frames[i];

				if (!frames_in_use(&eng->frames[KVP_TIER_DEVICE], f) ||
				    owner[f])
					return errbuf_set(e, -EFAULT, "chunk %s page %"
							  PRIu32 ": frame %" PRIu32
							  " free or owned twice", sid,
							  i, f);
				owner[f] = 1;
				(*frames)++;
			}
		}
	for (struct chunk *c = s->chunk_head; c; c = c->next) {
		lru_frames += c->npages;
		if (++lru > alive)
			return errbuf_set(e, -EFAULT, "chunk LRU has a cycle");
	}
	if (alive != s->chunk_count || lru_frames != s->chunk_lru_frames)
		return errbuf_set(e, -EFAULT, "chunk table counts %" PRIu64 " (found %"
				  PRIu64 "), LRU frames %" PRIu64 " (found %" PRIu64
				  ")", s->chunk_count, alive, s->chunk_lru_frames,
				  lru_frames);
	/* Dead chunks still held own their frames too. */
	for (struct chunk *c = s->dead_head; c; c = c->next) {
		if (!c->dead || !c->holders)
			return errbuf_set(e, -EFAULT, "dead chunk list holds a chunk "
					  "alive or unheld");
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
