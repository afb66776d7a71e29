/* SPDX-License-Identifier: MIT */
/*
 * share_disk.c - prefix pages and sealed chunks below the device tier
 * (share_disk.h says what and why; disk_tier.h how the disk tier works).
 *
 * On disk a prefix page is one record of kind DISK_KIND_PREFIX keyed by
 * its block hash (tenant-salted already: share_prefix.c); a chunk is the
 * records of kind DISK_KIND_CHUNK keyed by its name id: its pages 0..n-1,
 * then one record that holds its name (struct chunk_rec: type, tokens,
 * content, metadata, entry id), so a warm restart serves it with all it
 * had. Only roots are kept (a link needs its parent entry, which may have
 * moved on); a chunk whose name does not fit one page is dropped as before.
 *
 * Demotion copies the pages into the disk tier's staging under the engine
 * lock (a memcpy; on a GPU first one device -> host copy through host
 * frames, as user histories go through the host tier); the disk thread
 * writes them. Coming back is the reverse: staging -> (host frame ->)
 * device frame, after the disk thread read them.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "remote_engine.h"
#include "share_disk.h"
#include "share_internal.h"

/* ------------------------------------------------------------ the hook */

struct disk_key share_disk_key(const struct engine *eng, uint8_t kind,
			       const uint8_t hash[32])
{
	struct disk_key k = { .tenant = eng->disk_tenant, .pool = eng->disk_pool,
			      .kind = kind };

	memcpy(k.hash, hash, sizeof(k.hash));
	return k;
}

int share_tier_fetch(struct engine *eng, const struct disk_key *k, bool wait,
		     struct share_fetch *f)
{
	int ret;

	if (!eng->disk)
		return -ENOENT; /* the next tier below chains here */
	while ((ret = disk_tier_get(eng->disk, k, &f->hh)) == -EINPROGRESS && wait)
		disk_tier_wait(eng->disk, k);
	if (ret == -EINPROGRESS)
		return engine_wait_set(ENGINE_WAIT_DISK);
	if (ret)
		return ret;
	f->src = SHARE_FETCH_DISK;
	f->npages = f->hh.npages;
	return 0;
}

const void *share_fetch_page(struct engine *eng, const struct share_fetch *f,
			     uint32_t i)
{
	if (f->src == SHARE_FETCH_REMOTE)
		return remote_chunk_fetch_page(f, i);
	return disk_tier_page(eng->disk, &f->hh, i);
}

void share_fetch_take(struct engine *eng, const struct share_fetch *f)
{
	if (f->src == SHARE_FETCH_REMOTE)
		remote_chunk_fetch_end(eng, f, true);
	else
		disk_tier_take(eng->disk, &f->hh);
}

void share_fetch_leave(struct engine *eng, const struct share_fetch *f)
{
	/* The disk tier keeps its copy (its staging is reclaimed); what the
	 * store sent is freed, and the store keeps its copy. */
	if (f->src == SHARE_FETCH_REMOTE)
		remote_chunk_fetch_end(eng, f, false);
}

/* ------------------------------------------------------------ bytes */

/* Pages 0..n-1 of f into device frames dev[]: 0 or -errno. */
static int pages_in(struct engine *eng, const struct share_fetch *f,
		    const uint32_t *dev, uint32_t n)
{
	const void **src = calloc(n ? n : 1, sizeof(*src));
	int ret;

	if (!src)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		src[i] = share_fetch_page(eng, f, i);
	ret = share_pages_in(eng, src, dev, n);
	free(src);
	return ret;
}

/* ------------------------------------------------------------ prefix pages */

bool share_pc_down(struct engine *eng, struct pc_entry *pe, bool disk, bool remote)
{
	uint32_t bounce = FRAME_NONE; /* set by share_pages_out when it bounces */
	struct disk_key k;
	void *page = NULL;
	bool bounced = false;

	disk = disk && eng->disk;
	/* Once queued for the store, or onloaded from it, never again: the
	 * store has it (a page it lost since is written again by whoever
	 * computes it next). */
	remote = remote && eng->remote && !pe->in_store;
	if (!disk && !remote)
		return false;
	/* One device -> host copy on a GPU feeds both tiers. */
	if (!share_pages_out(eng, &pe->frame, 1, &page, &bounce, &bounced))
		return false; /* no host frame for the copy: dropped as before */
	if (disk) {
		k = share_disk_key(eng, DISK_KIND_PREFIX, pe->hash);
		/* -ENOSPC (no staging room): dropped as before, counted there. */
		disk_tier_put(eng->disk, &k, 0, eng->P, 1, &page);
	}
	if (remote)
		pe->in_store = !remote_prefix_put(eng, pe->hash, page);
	if (bounced)
		share_bounce_free(eng, &bounce, 1);
	return remote && pe->in_store;
}

/*
 * The page of hash from below, into a fresh device frame published under
 * parent, held (refs 1) by the caller's walk. 0, -ENOENT (not there, or no
 * room for it now), -EINPROGRESS.
 */
static int pc_restore(struct engine *eng, const uint8_t hash[32],
		      uint32_t parent, bool wait, uint32_t *frame)
{
	struct disk_key k = share_disk_key(eng, DISK_KIND_PREFIX, hash);
	uint32_t fr, e = pc_find(eng, hash);
	struct share_fetch f;
	int ret;

	if (e != PC_NONE) { /* published meanwhile: it is the page */
		*frame = eng->share->pc[e].frame;
		sp_ref(eng, *frame);
		return 0;
	}
	ret = share_tier_fetch(eng, &k, wait, &f);
	if (ret)
		return ret;
	/* Not taken: the disk tier keeps it (staging is reclaimed). */
	if (f.npages != 1 || engine_device_avail(eng, NULL, 1) < 1)
		return -ENOENT;
	evict_for_device(eng, 1);
	fr = share_frame_alloc(eng);
	if (pages_in(eng, &f, &fr, 1)) {
		frames_free(&eng->frames[KVP_TIER_DEVICE], fr);
		return -ENOENT;
	}
	share_fetch_take(eng, &f);
	sp_ref(eng, fr);
	pc_publish(eng, fr, hash, parent);
	*frame = fr;
	return 0;
}

/*
 * Hash the chain on from prev (tokens: its next pages, n of them) while the
 * tiers below have its pages, queueing their reads without waiting: they
 * come back together while the walk restores them in order. Returns how
 * many are there (hashes[0, that)); a miss costs one hash.
 */
static uint32_t pc_prefetch(struct engine *eng, const uint8_t prev[32],
			    const uint32_t *tokens, uint32_t n,
			    uint8_t (*hashes)[32])
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		struct disk_key k;
		struct share_fetch f;

		pc_hash_page(eng, i ? hashes[i - 1] : prev,
			     tokens + (uint64_t)i * eng->P, hashes[i]);
		k = share_disk_key(eng, DISK_KIND_PREFIX, hashes[i]);
		if (share_tier_fetch(eng, &k, false, &f) == -ENOENT)
			break;
	}
	return i;
}

int share_disk_prefix_more(struct engine *eng, const uint32_t *tokens,
			   uint32_t full, uint32_t *frames, uint32_t *hit,
			   uint32_t *idle, bool wait)
{
	static const uint8_t zero[32];
	struct share *s = eng->share;
	uint32_t h0 = *hit, n = full - *hit, parent = PC_NONE, fr;
	uint8_t (*hashes)[32];
	uint64_t prog;
	int ret = 0;

	if (!eng->disk || *hit >= full)
		return 0;
	prog = disk_tier_progress(eng->disk); /* before any read is looked at */
	hashes = malloc((size_t)n * sizeof(*hashes));
	if (!hashes)
		return 0; /* a shorter hit, never a wrong one */
	if (h0)
		parent = s->sp[frames[h0 - 1]].pc;
	n = pc_prefetch(eng, h0 ? s->pc[parent].hash : zero,
			tokens + (uint64_t)h0 * eng->P, n, hashes);
	if (!n) { /* the usual miss: nothing below either */
		free(hashes);
		return 0;
	}
	/* Held while frames are made: eviction must not take what matched. */
	for (uint32_t i = 0; i < h0; i++)
		sp_ref(eng, frames[i]);
	for (uint32_t i = 0; i < n; i++) {
		ret = pc_restore(eng, hashes[i], parent, wait, &fr);
		if (ret)
			break;
		frames[(*hit)++] = fr;
		parent = s->sp[fr].pc;
	}
	/* Leaves first, so a parent is never idle below a held child. */
	for (uint32_t i = *hit; i-- > 0;) {
		sp_unref(eng, frames[i]);
		*idle += !s->sp[frames[i]].refs && i >= h0;
	}
	free(hashes);
	s->disk_waiting = ret == -EINPROGRESS;
	if (ret != -EINPROGRESS)
		return 0;
	s->disk_wait_progress = prog;
	s->disk_wait_ns = mono_ns();
	return engine_wait_set(ENGINE_WAIT_DISK);
}

/* A retry sooner than this re-walks even when the disk thread did not
 * move (staging another caller freed, READY pages to reclaim). */
#define DISK_RETRY_NS 1000000ull

bool share_disk_prefix_wait(struct engine *eng)
{
	struct share *s = eng->share;

	if (!s->disk_waiting)
		return false;
	if (disk_tier_progress(eng->disk) != s->disk_wait_progress ||
	    mono_ns() - s->disk_wait_ns > DISK_RETRY_NS) {
		s->disk_waiting = false;
		return false;
	}
	return true;
}

/* ------------------------------------------------------------ chunks */

/*
 * The alias (disk_key.user) a chunk on disk is found by: 62 bits of its
 * entry id, so an acquire by entry id finds it, and its type in the low 2
 * bits, so a clear by type drops it (KVP_CHUNK_SYSTEM..QUERY are 1..3).
 */
#define ALIAS_TYPE_MASK 3ull

static uint64_t chunk_alias(const struct kvp_chunk_id *id, uint32_t type)
{
	uint64_t a;

	memcpy(&a, id->b, sizeof(a));
	return (a & ~ALIAS_TYPE_MASK) | (type & ALIAS_TYPE_MASK);
}

static struct disk_alias alias_of(const struct engine *eng, uint64_t mask,
				  uint64_t value)
{
	return (struct disk_alias){ .tenant = eng->disk_tenant, .pool = eng->disk_pool,
				    .kind = DISK_KIND_CHUNK, .mask = mask,
				    .value = value };
}

static size_t chunk_rec_bytes(const struct chunk_name *n)
{
	return sizeof(struct chunk_rec) + (size_t)n->ntokens * 4 + n->content_len +
	       (n->meta ? strlen(n->meta) : 0);
}

static void chunk_rec_fill(const struct chunk *c, void *page)
{
	const struct chunk_name *n = c->name;
	struct chunk_rec r = {
		.magic = CHUNK_REC_MAGIC, .type = n->type, .ntokens = n->ntokens,
		.content_len = n->content_len,
		.meta_len = n->meta ? (uint32_t)strlen(n->meta) : 0,
		.npages = c->npages, .created_ns = n->created_ns,
	};
	unsigned char *p = page;

	memcpy(r.entry_id, c->id.b, 32);
	memcpy(r.name_id, n->id.b, 32);
	memcpy(p, &r, sizeof(r));
	p += sizeof(r);
	for (uint32_t i = 0; i < n->ntokens; i++, p += 4) {
		uint32_t t = n->tokens[i];

		p[0] = (uint8_t)t;
		p[1] = (uint8_t)(t >> 8);
		p[2] = (uint8_t)(t >> 16);
		p[3] = (uint8_t)(t >> 24);
	}
	if (n->content_len)
		memcpy(p, n->content, n->content_len);
	if (r.meta_len)
		memcpy(p + n->content_len, n->meta, r.meta_len);
}

uint32_t share_chunk_down(struct engine *eng, struct chunk *c, bool disk,
			  uint32_t remote_max)
{
	uint64_t pb = eng->layout.page_bytes;
	uint32_t n = c->npages, from = 0, m = 0, queued = 0, *bounce = NULL;
	void **pages = NULL, *rec = NULL;
	struct disk_key k;
	bool bounced = false, out = false, remote;

	disk = disk && eng->disk;
	/* Once all queued, or from the store: never again (as a prefix page). */
	remote = remote_max && remote_chunk_type_kept(eng, c->type) && !c->in_store;
	/* Roots that are sealed and whose name fits one record. */
	if ((!disk && !remote) || c->dead || c->parent || !c->name ||
	    c->state != KVP_CHUNK_READY || chunk_rec_bytes(c->name) > pb)
		return 0;
	if (remote) /* the store's piece: from what it lacks on */
		m = c->npages - c->pub_next < remote_max ? c->npages - c->pub_next
							 : remote_max;
	if (!disk) { /* only the store's piece leaves the device */
		from = c->pub_next;
		n = m;
	}
	pages = malloc((n + 1) * sizeof(*pages));
	bounce = calloc(n + 1, sizeof(*bounce)); /* zeroed: gcc 13 -O3 cannot see bounce_alloc fill it */
	rec = calloc(1, pb);
	if (!pages || !bounce || !rec)
		goto done;
	/* None: the store lacks only the records. */
	out = !n || share_pages_out(eng, c->frames + from, n, pages, bounce, &bounced);
	if (!out)
		goto done;
	chunk_rec_fill(c, rec);
	pages[n] = rec;
	if (disk) {
		k = share_disk_key(eng, DISK_KIND_CHUNK, c->name->id.b);
		k.user = chunk_alias(&c->id, c->type); /* found by its entry id too */
		disk_tier_put(eng->disk, &k, 0, c->tokens, n + 1, pages);
	}
	/* The same bytes (one bounce on a GPU) to the remote tier, if any. */
	if (remote)
		queued = remote_chunk_put(eng, c, (const void *const *)pages +
					  (disk ? c->pub_next : 0), m, rec,
					  chunk_rec_bytes(c->name));
done:
	if (out && bounced)
		share_bounce_free(eng, bounce, n);
	free(pages);
	free(bounce);
	free(rec);
	return queued;
}

/* The name record of f (its last page) checked: NULL when damaged. */
static const struct chunk_rec *chunk_rec_check(struct engine *eng,
					       const struct share_fetch *f,
					       const uint8_t nid[32])
{
	const struct chunk_rec *r;
	uint64_t bytes;

	if (!f->npages)
		return NULL;
	r = share_fetch_page(eng, f, f->npages - 1);
	bytes = sizeof(*r) + (uint64_t)r->ntokens * 4 + r->content_len + r->meta_len;
	if (r->magic != CHUNK_REC_MAGIC || bytes > eng->layout.page_bytes ||
	    !r->ntokens || r->npages != f->npages - 1 ||
	    r->npages != pages_for(eng, r->ntokens) || memcmp(r->name_id, nid, 32) ||
	    !kvp_chunk_type_name(r->type))
		return NULL;
	return r;
}

/* A name record from r (metadata parsed again: its canonical form). */
static struct chunk_name *name_from_rec(const struct chunk_rec *r,
					struct errbuf *e)
{
	const unsigned char *p = (const unsigned char *)(r + 1);
	struct chunk_name *n = calloc(1, sizeof(*n));
	char *meta = NULL;

	if (!n)
		return NULL;
	INIT_LIST_HEAD(&n->entries);
	n->tokens = malloc((size_t)r->ntokens * 4);
	n->content = r->content_len ? malloc(r->content_len) : NULL;
	meta = r->meta_len ? strndup((const char *)p + r->ntokens * 4 +
				     r->content_len, r->meta_len) : NULL;
	if (!n->tokens || (r->content_len && !n->content) ||
	    (r->meta_len && !meta) ||
	    (meta && meta_parse(meta, "chunk metadata on disk", &n->meta_json,
				&n->meta, e))) {
		free(meta);
		free(n->tokens);
		free(n->content);
		free(n);
		return NULL;
	}
	free(meta);
	memcpy(n->id.b, r->name_id, 32);
	n->type = r->type;
	n->ntokens = r->ntokens;
	for (uint32_t i = 0; i < r->ntokens; i++, p += 4)
		n->tokens[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
			       (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
	if (r->content_len)
		memcpy(n->content, p, r->content_len);
	n->content_len = r->content_len;
	n->created_ns = n->last_access_ns = r->created_ns;
	return n;
}

/* The root entry of r under name n, its pages from f: READY, unheld. */
static int root_from_rec(struct engine *eng, const struct chunk_rec *r,
			 struct chunk_name *n, const struct share_fetch *f)
{
	struct share *s = eng->share;
	struct chunk *c = calloc(1, sizeof(*c));

	if (c)
		c->frames = malloc((r->npages ? r->npages : 1) * sizeof(*c->frames));
	if (!c || !c->frames) {
		free(c);
		return -ENOMEM;
	}
	INIT_LIST_HEAD(&c->children);
	INIT_LIST_HEAD(&c->sib);
	INIT_LIST_HEAD(&c->lru);
	INIT_LIST_HEAD(&c->pub);
	memcpy(c->id.b, r->entry_id, 32);
	c->type = r->type;
	c->state = KVP_CHUNK_READY;
	c->tokens = r->ntokens;
	for (c->npages = 0; c->npages < r->npages; c->npages++)
		c->frames[c->npages] = share_frame_alloc(eng);
	if (pages_in(eng, f, c->frames, c->npages)) {
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
	 * eviction, as a chunk sealed here. */
	c->in_store = f->src == SHARE_FETCH_REMOTE;
	if (remote_chunk_type_kept(eng, c->type) && !c->in_store)
		list_add_tail(&c->pub, &s->pub_chunks);
	return 0;
}

static const char *src_name(const struct share_fetch *f)
{
	return f->src == SHARE_FETCH_REMOTE ? "remote" : "disk";
}

/* Room for a chunk of pages coming back (and its name when new). */
static int chunk_room(struct engine *eng, const struct share_fetch *f,
		      uint64_t pages, bool new_name, const char *sid,
		      struct errbuf *e)
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
				  "device_mem", sid, src_name(f), avail, pages);
	chunk_limits_make_room(eng, pages, new_name);
	evict_for_device(eng, (uint32_t)pages);
	return 0;
}

/* id is a name id, or the entry id of a root: the key of the chunk. */
static bool chunk_key_of(struct engine *eng, const struct kvp_chunk_id *id,
			 struct disk_key *k)
{
	struct disk_alias a = alias_of(eng, ~ALIAS_TYPE_MASK,
				       chunk_alias(id, 0));

	*k = share_disk_key(eng, DISK_KIND_CHUNK, id->b);
	if (!eng->disk || disk_tier_info(eng->disk, k, &(uint64_t){ 0 },
					 &(uint64_t){ 0 }, &(uint32_t){ 0 }))
		return true;
	return disk_tier_find_alias(eng->disk, &a, k->hash);
}

int share_chunk_from_below(struct engine *eng, const struct kvp_chunk_id *id,
			   struct errbuf *e)
{
	int ret;

	if ((!eng->disk && !eng->remote) || name_find(eng, id) || chunk_find(eng, id))
		return 0;
	ret = share_disk_chunk_restore(eng, id, 0, false, e);
	if (ret == -ENOENT) {
		e->msg[0] = '\0';
		return 0; /* the lookup says what is not there */
	}
	return ret;
}

int share_disk_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id)
{
	struct disk_key k;

	remote_chunk_drop(eng, id); /* the store's copy too, if any */
	if (!eng->disk || !chunk_key_of(eng, id, &k))
		return 0;
	return disk_tier_drop(eng->disk, &k) > 0;
}

uint32_t share_disk_chunk_clear(struct engine *eng, uint32_t type)
{
	struct disk_alias a = alias_of(eng, type ? ALIAS_TYPE_MASK : 0, type);

	return eng->disk ? disk_tier_drop_alias(eng->disk, &a) : 0;
}

/*
 * The chunk id (a name, or a root entry) from the tiers below: the disk
 * tier's, else the remote tier's, laid out alike (its pages, then its
 * record), nid its name id. 0, -ENOENT, -EINPROGRESS.
 */
static int chunk_fetch(struct engine *eng, const struct kvp_chunk_id *id,
		       uint32_t type, bool wait, struct share_fetch *f, uint8_t nid[32])
{
	struct disk_key k;
	int ret = -ENOENT;

	f->src = SHARE_FETCH_DISK; /* the tier asked: the messages name it */
	if (eng->disk && chunk_key_of(eng, id, &k)) {
		ret = share_tier_fetch(eng, &k, wait, f);
		memcpy(nid, k.hash, 32);
	}
	if (ret == -ENOENT)
		ret = remote_chunk_fetch(eng, id, type, wait, f, nid);
	return ret;
}

int share_disk_chunk_restore(struct engine *eng, const struct kvp_chunk_id *id,
			     uint32_t type, bool wait, struct errbuf *e)
{
	const struct chunk_rec *r;
	struct chunk_name *n, *fresh = NULL;
	struct share_fetch f = { .src = 0 };
	uint8_t nid[32];
	char sid[17];
	int ret;

	ret = chunk_fetch(eng, id, type, wait, &f, nid);
	chunk_id_short(id, sid);
	if (ret == -EINPROGRESS)
		return errbuf_set(e, ret, "chunk %s: being read back from the %s "
				  "tier", sid, src_name(&f));
	if (ret)
		return ret;
	r = chunk_rec_check(eng, &f, nid);
	if (!r) {
		share_fetch_take(eng, &f); /* damaged or partial: never served */
		return -ENOENT;
	}
	if (memcmp(id->b, nid, 32) && memcmp(id->b, r->entry_id, 32)) {
		share_fetch_leave(eng, &f);
		return -ENOENT; /* another entry's alias: left where it is */
	}
	if (chunk_find(eng, (const struct kvp_chunk_id *)r->entry_id)) {
		share_fetch_take(eng, &f); /* registered again meanwhile */
		return 0;
	}
	ret = chunk_room(eng, &f, r->npages, !name_find(eng, (const void *)nid), sid, e);
	if (ret) {
		share_fetch_leave(eng, &f);
		return ret; /* stays below */
	}
	/* The name is looked up after the room is made: making it may have
	 * evicted the name's other entries, and the name with them. */
	n = name_find(eng, (const struct kvp_chunk_id *)nid);
	if (!n) {
		fresh = n = name_from_rec(r, e);
		if (!n) {
			share_fetch_leave(eng, &f);
			return errbuf_set(e, -ENOMEM, "chunk %s: out of memory for "
					  "its record coming back from the %s tier",
					  sid, src_name(&f));
		}
		name_insert(eng, n);
	}
	ret = root_from_rec(eng, r, n, &f);
	if (ret) {
		if (fresh)
			name_free(eng, fresh);
		share_fetch_leave(eng, &f);
		return errbuf_set(e, ret, "chunk %s: could not bring its pages back "
				  "from the %s tier (%s)", sid, src_name(&f),
				  strerror(-ret));
	}
	share_fetch_take(eng, &f);
	return 0;
}

/* ------------------------------------------------------------ tier.h */

void share_disk_demote_pc(struct engine *eng, struct pc_entry *pe)
{
	share_demote_pc(eng, pe);
}

void share_disk_demote_chunk(struct engine *eng, struct chunk *c)
{
	share_demote_chunk(eng, c);
}

bool share_disk_prefix_waiting(struct engine *eng)
{
	if (!share_disk_prefix_wait(eng))
		return false;
	engine_wait_set(ENGINE_WAIT_DISK);
	return true;
}
