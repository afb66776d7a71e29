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
 *
 * Who owns what. This file is the disk tier's (kvpool_tiers) and sees the
 * engine only through its interface: tier.h (the operations it implements
 * for disk_tier_ops, the typed wait) and tier_services.h (what it asks of
 * the engine, always under the engine's lock). The engine owns the prefix
 * entries, chunks, names and frames, and every change to them: this file
 * publishes a page it brought back with tier_pc_publish, and hands a chunk
 * back as a struct tier_chunk_desc to tier_chunk_adopt, which makes the
 * room, the name and the entry. It owns what is below the device tier: the
 * keys and aliases, struct chunk_rec (encoded from tier_chunk_describe,
 * decoded and checked here before the engine sees a byte of it), and the
 * record of the last prefix walk that waited for the disk (struct
 * share_disk_wait, in the disk tier's state of the engine, disk_engine.c).
 * The remote tier's chunks come through here too (remote_chunk_fetch,
 * laid out as the disk's), so both are rebuilt by one path.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "errbuf.h"
#include "frames.h"
#include "remote_engine.h"
#include "share.h"
#include "share_disk.h"
#include "tier_services.h"

/* ------------------------------------------------------------ the hook */

struct disk_key share_disk_key(const struct engine *eng, uint8_t kind,
			       const uint8_t hash[32])
{
	struct disk_key k = { .tenant = tier_disk_tenant(eng),
			      .pool = tier_disk_pool(eng), .kind = kind };

	memcpy(k.hash, hash, sizeof(k.hash));
	return k;
}

int share_tier_fetch(struct engine *eng, const struct disk_key *k, bool wait,
		     struct share_fetch *f)
{
	struct disk_tier *dt = tier_disk(eng);
	int ret;

	if (!dt)
		return -ENOENT; /* the next tier below chains here */
	while ((ret = disk_tier_get(dt, k, &f->hh)) == -EINPROGRESS && wait)
		disk_tier_wait(dt, k);
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
	return disk_tier_page(tier_disk(eng), &f->hh, i);
}

void share_fetch_take(struct engine *eng, const struct share_fetch *f)
{
	if (f->src == SHARE_FETCH_REMOTE)
		remote_chunk_fetch_end(eng, f, true);
	else
		disk_tier_take(tier_disk(eng), &f->hh);
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
	ret = tier_pages_in(eng, src, dev, n);
	free(src);
	return ret;
}

/* ------------------------------------------------------------ prefix pages */

bool share_pc_down(struct engine *eng, struct pc_entry *pe, bool disk, bool remote)
{
	uint32_t bounce = FRAME_NONE; /* set by tier_pages_out when it bounces */
	uint32_t frame = tier_pc_entry_frame(pe);
	const uint8_t *hash = tier_pc_entry_hash(pe);
	struct disk_key k;
	void *page = NULL;
	bool bounced = false;

	disk = disk && tier_disk(eng);
	/* Once queued for the store, or onloaded from it, never again: the
	 * store has it (a page it lost since is written again by whoever
	 * computes it next). */
	remote = remote && tier_remote(eng) && !tier_pc_in_store(pe);
	if (!disk && !remote)
		return false;
	/* One device -> host copy on a GPU feeds both tiers. */
	if (!tier_pages_out(eng, &frame, 1, &page, &bounce, &bounced))
		return false; /* no host frame for the copy: dropped as before */
	if (disk) {
		k = share_disk_key(eng, DISK_KIND_PREFIX, hash);
		/* -ENOSPC (no staging room): dropped as before, counted there. */
		disk_tier_put(tier_disk(eng), &k, 0, tier_page_tokens(eng), 1, &page);
	}
	if (remote)
		tier_pc_set_in_store(pe, !remote_prefix_put(eng, hash, page));
	if (bounced)
		tier_bounce_free(eng, &bounce, 1);
	return remote && tier_pc_in_store(pe);
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
	uint32_t fr, e = tier_pc_find(eng, hash);
	struct share_fetch f;
	int ret;

	if (e != TIER_PC_NONE) { /* published meanwhile: it is the page */
		*frame = tier_pc_frame(eng, e);
		tier_frame_ref(eng, *frame);
		return 0;
	}
	ret = share_tier_fetch(eng, &k, wait, &f);
	if (ret)
		return ret;
	/* Not taken: the disk tier keeps it (staging is reclaimed). */
	if (f.npages != 1 || tier_device_avail(eng, 1) < 1)
		return -ENOENT;
	tier_evict_for_device(eng, 1);
	fr = tier_share_frame_alloc(eng);
	if (pages_in(eng, &f, &fr, 1)) {
		frames_free(tier_device_frames(eng), fr);
		return -ENOENT;
	}
	share_fetch_take(eng, &f);
	tier_frame_ref(eng, fr);
	tier_pc_publish(eng, fr, hash, parent);
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
	uint32_t i, P = tier_page_tokens(eng);

	for (i = 0; i < n; i++) {
		struct disk_key k;
		struct share_fetch f;

		tier_pc_hash_page(eng, i ? hashes[i - 1] : prev,
				  tokens + (uint64_t)i * P, hashes[i]);
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
	struct share_disk_wait *w = share_disk_wait_of(eng);
	uint32_t h0 = *hit, n = full - *hit, parent = TIER_PC_NONE, fr;
	uint8_t (*hashes)[32];
	uint64_t prog;
	int ret = 0;

	if (!tier_disk(eng) || *hit >= full)
		return 0;
	prog = disk_tier_progress(tier_disk(eng)); /* before any read is looked at */
	hashes = malloc((size_t)n * sizeof(*hashes));
	if (!hashes)
		return 0; /* a shorter hit, never a wrong one */
	if (h0)
		parent = tier_frame_pc(eng, frames[h0 - 1]);
	n = pc_prefetch(eng, h0 ? tier_frame_hash(eng, frames[h0 - 1]) : zero,
			tokens + (uint64_t)h0 * tier_page_tokens(eng), n, hashes);
	if (!n) { /* the usual miss: nothing below either */
		free(hashes);
		return 0;
	}
	/* Held while frames are made: eviction must not take what matched. */
	for (uint32_t i = 0; i < h0; i++)
		tier_frame_ref(eng, frames[i]);
	for (uint32_t i = 0; i < n; i++) {
		ret = pc_restore(eng, hashes[i], parent, wait, &fr);
		if (ret)
			break;
		frames[(*hit)++] = fr;
		parent = tier_frame_pc(eng, fr);
	}
	/* Leaves first, so a parent is never idle below a held child. */
	for (uint32_t i = *hit; i-- > 0;) {
		tier_frame_unref(eng, frames[i]);
		*idle += !tier_frame_refs(eng, frames[i]) && i >= h0;
	}
	free(hashes);
	if (w) /* none (no memory at attach): every retry walks again */
		w->waiting = ret == -EINPROGRESS;
	if (ret != -EINPROGRESS)
		return 0;
	if (w) {
		w->progress = prog;
		w->since_ns = mono_ns();
	}
	return engine_wait_set(ENGINE_WAIT_DISK);
}

/* A retry sooner than this re-walks even when the disk thread did not
 * move (staging another caller freed, READY pages to reclaim). */
#define DISK_RETRY_NS 1000000ull

bool share_disk_prefix_wait(struct engine *eng)
{
	struct share_disk_wait *w = share_disk_wait_of(eng);

	if (!w || !w->waiting)
		return false;
	if (disk_tier_progress(tier_disk(eng)) != w->progress ||
	    mono_ns() - w->since_ns > DISK_RETRY_NS) {
		w->waiting = false;
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

static uint64_t chunk_alias(const uint8_t id[32], uint32_t type)
{
	uint64_t a;

	memcpy(&a, id, sizeof(a));
	return (a & ~ALIAS_TYPE_MASK) | (type & ALIAS_TYPE_MASK);
}

static struct disk_alias alias_of(const struct engine *eng, uint64_t mask,
				  uint64_t value)
{
	return (struct disk_alias){ .tenant = tier_disk_tenant(eng),
				    .pool = tier_disk_pool(eng),
				    .kind = DISK_KIND_CHUNK, .mask = mask,
				    .value = value };
}

/* The bytes of d's record: struct chunk_rec, then its name's tokens,
 * content and metadata. */
static size_t chunk_rec_bytes(const struct tier_chunk_desc *d)
{
	return sizeof(struct chunk_rec) + (size_t)d->ntokens * 4 +
	       d->content_len + d->meta_len;
}

static void chunk_rec_fill(const struct tier_chunk_desc *d, void *page)
{
	struct chunk_rec r = {
		.magic = CHUNK_REC_MAGIC, .type = d->type, .ntokens = d->ntokens,
		.content_len = d->content_len, .meta_len = d->meta_len,
		.npages = d->npages, .created_ns = d->created_ns,
	};
	unsigned char *p = page;

	memcpy(r.entry_id, d->id, 32);
	memcpy(r.name_id, d->name_id, 32);
	memcpy(p, &r, sizeof(r));
	p += sizeof(r);
	for (uint32_t i = 0; i < d->ntokens; i++, p += 4) {
		uint32_t t = d->name_tokens[i];

		p[0] = (uint8_t)t;
		p[1] = (uint8_t)(t >> 8);
		p[2] = (uint8_t)(t >> 16);
		p[3] = (uint8_t)(t >> 24);
	}
	if (d->content_len)
		memcpy(p, d->content, d->content_len);
	if (d->meta_len)
		memcpy(p + d->content_len, d->meta, d->meta_len);
}

uint32_t share_chunk_down(struct engine *eng, struct chunk *c, bool disk,
			  uint32_t remote_max)
{
	uint64_t pb = engine_layout(eng)->page_bytes;
	uint32_t n, from = 0, m = 0, queued = 0, *bounce = NULL, pub_next;
	void **pages = NULL, *rec = NULL;
	struct tier_chunk_desc d;
	struct disk_key k;
	bool bounced = false, out = false, remote;

	disk = disk && tier_disk(eng);
	/* Once all queued, or from the store: never again (as a prefix page). */
	remote = remote_max && remote_chunk_type_kept(eng, tier_chunk_type(c)) &&
		 !tier_chunk_in_store(c);
	if (!disk && !remote)
		return 0;
	/* Roots that are sealed and whose name fits one record. */
	tier_chunk_describe(c, &d);
	if (!d.root || d.state != KVP_CHUNK_READY || chunk_rec_bytes(&d) > pb)
		return 0;
	n = d.npages;
	pub_next = tier_chunk_pub_next(c);
	if (remote) /* the store's piece: from what it lacks on */
		m = d.npages - pub_next < remote_max ? d.npages - pub_next
						     : remote_max;
	if (!disk) { /* only the store's piece leaves the device */
		from = pub_next;
		n = m;
	}
	pages = malloc((n + 1) * sizeof(*pages));
	bounce = calloc(n + 1, sizeof(*bounce)); /* zeroed: gcc 13 -O3 cannot see bounce_alloc fill it */
	rec = calloc(1, pb);
	if (!pages || !bounce || !rec)
		goto done;
	/* None: the store lacks only the records. */
	out = !n || tier_pages_out(eng, d.frames + from, n, pages, bounce, &bounced);
	if (!out)
		goto done;
	chunk_rec_fill(&d, rec);
	pages[n] = rec;
	if (disk) {
		k = share_disk_key(eng, DISK_KIND_CHUNK, d.name_id);
		k.user = chunk_alias(d.id, d.type); /* found by its entry id too */
		disk_tier_put(tier_disk(eng), &k, 0, d.tokens, n + 1, pages);
	}
	/* The same bytes (one bounce on a GPU) to the remote tier, if any. */
	if (remote)
		queued = remote_chunk_put(eng, c, (const void *const *)pages +
					  (disk ? pub_next : 0), m, rec,
					  chunk_rec_bytes(&d));
done:
	if (out && bounced)
		tier_bounce_free(eng, bounce, n);
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
	uint32_t P = tier_page_tokens(eng);
	const struct chunk_rec *r;
	uint64_t bytes;

	if (!f->npages)
		return NULL;
	r = share_fetch_page(eng, f, f->npages - 1);
	bytes = sizeof(*r) + (uint64_t)r->ntokens * 4 + r->content_len + r->meta_len;
	if (r->magic != CHUNK_REC_MAGIC || bytes > engine_layout(eng)->page_bytes ||
	    !r->ntokens || r->npages != f->npages - 1 ||
	    r->npages != ((uint64_t)r->ntokens + P - 1) / P ||
	    memcmp(r->name_id, nid, 32) || !kvp_chunk_type_name(r->type))
		return NULL;
	return r;
}

/*
 * The description of the chunk r (checked) holds, its pages f's 0..npages-1
 * into src[] and its name's tokens decoded into *tokens (the caller frees
 * both): -ENOMEM when there is no memory for them.
 */
static int desc_from_rec(struct engine *eng, const struct chunk_rec *r,
			 const struct share_fetch *f, struct tier_chunk_desc *d,
			 const void ***src, uint32_t **tokens)
{
	const unsigned char *p = (const unsigned char *)(r + 1);

	*src = calloc(r->npages ? r->npages : 1, sizeof(**src));
	*tokens = malloc((size_t)r->ntokens * 4);
	if (!*src || !*tokens)
		return -ENOMEM;
	for (uint32_t i = 0; i < r->npages; i++)
		(*src)[i] = share_fetch_page(eng, f, i);
	for (uint32_t i = 0; i < r->ntokens; i++, p += 4)
		(*tokens)[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
			       (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
	*d = (struct tier_chunk_desc){
		.type = r->type, .state = KVP_CHUNK_READY, .root = true,
		.tokens = r->ntokens, .npages = r->npages,
		.ntokens = r->ntokens, .name_tokens = *tokens,
		.content = r->content_len ? p : NULL, .content_len = r->content_len,
		.meta = r->meta_len ? (const char *)p + r->content_len : NULL,
		.meta_len = r->meta_len, .created_ns = r->created_ns,
	};
	memcpy(d->id, r->entry_id, 32);
	memcpy(d->name_id, r->name_id, 32);
	return 0;
}

static const char *src_name(const struct share_fetch *f)
{
	return f->src == SHARE_FETCH_REMOTE ? "remote" : "disk";
}

/* id is a name id, or the entry id of a root: the key of the chunk. */
static bool chunk_key_of(struct engine *eng, const struct kvp_chunk_id *id,
			 struct disk_key *k)
{
	struct disk_alias a = alias_of(eng, ~ALIAS_TYPE_MASK,
				       chunk_alias(id->b, 0));

	*k = share_disk_key(eng, DISK_KIND_CHUNK, id->b);
	if (!tier_disk(eng) ||
	    disk_tier_info(tier_disk(eng), k, &(uint64_t){ 0 },
			   &(uint64_t){ 0 }, &(uint32_t){ 0 }))
		return true;
	return disk_tier_find_alias(tier_disk(eng), &a, k->hash);
}

int share_chunk_from_below(struct engine *eng, const struct kvp_chunk_id *id,
			   struct errbuf *e)
{
	int ret;

	if ((!tier_disk(eng) && !tier_remote(eng)) ||
	    tier_chunk_name_known(eng, id) || tier_chunk_known(eng, id))
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
	if (!tier_disk(eng) || !chunk_key_of(eng, id, &k))
		return 0;
	return disk_tier_drop(tier_disk(eng), &k) > 0;
}

uint32_t share_disk_chunk_clear(struct engine *eng, uint32_t type)
{
	struct disk_alias a = alias_of(eng, type ? ALIAS_TYPE_MASK : 0, type);

	return tier_disk(eng) ? disk_tier_drop_alias(tier_disk(eng), &a) : 0;
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
	if (tier_disk(eng) && chunk_key_of(eng, id, &k)) {
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
	struct share_fetch f = { .src = 0 };
	struct tier_chunk_desc d;
	const void **src = NULL;
	uint32_t *tokens = NULL;
	uint8_t nid[32];
	char sid[65];
	int ret;

	ret = chunk_fetch(eng, id, type, wait, &f, nid);
	kvp_chunk_id_format(id, sid);
	sid[16] = '\0'; /* the first 16 digits, as the engine's messages */
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
	if (tier_chunk_known(eng, (const struct kvp_chunk_id *)r->entry_id)) {
		share_fetch_take(eng, &f); /* registered again meanwhile */
		return 0;
	}
	ret = desc_from_rec(eng, r, &f, &d, &src, &tokens);
	if (ret)
		ret = errbuf_set(e, ret, "chunk %s: out of memory for its record "
				 "coming back from the %s tier", sid, src_name(&f));
	else
		ret = tier_chunk_adopt(eng, &d, src, f.src == SHARE_FETCH_REMOTE,
				       id, src_name(&f), e);
	free(src);
	free(tokens);
	if (ret) {
		share_fetch_leave(eng, &f);
		return ret; /* stays below */
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
