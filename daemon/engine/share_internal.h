/* SPDX-License-Identifier: MIT */
/*
 * share_internal.h - the data structures behind share.h, shared by
 * share.c (frames, leases, eviction hooks, check), share_prefix.c,
 * share_chunk.c, share_seq.c and share_compose.c.
 *
 * Invariants (share_check() verifies them):
 *  - a device frame is owned by a history, a chunk, or the shared-page
 *    world (share.h); in the last case sp[f].refs counts the sequence pages
 *    listing f (and sp[f].pc != PC_NONE when it is published);
 *  - sp[f].refs == 0 && sp[f].pc == PC_NONE never holds for a frame in use
 *    by the shared-page world: such a frame is freed at once;
 *  - a published entry with refs > 0 has a parent with refs > 0 (whoever
 *    holds page i of a chain holds pages 0..i-1): so every idle entry's
 *    subtree is idle and pc_idle entries can all be evicted, leaves first;
 *  - pc LRU = the idle leaves (refs == 0, nchildren == 0);
 *  - chunk LRU = the ready entries in the table with holders == 0 and no
 *    live children (leaves: an entry's children need it);
 *  - an entry's holders = its read leases + compositions holding it +
 *    sequence pins + 1 while a fill lease is open + 1 per FILLING child
 *    (fill_pin);
 *  - every entry in the table has its name, its name lists it, and its
 *    parent (if any) is in the table and lists it as a child; a name is in
 *    the name table exactly while it has entries;
 *  - a dead entry (deleted or evicted: out of the table) lives only while
 *    holders > 0, then its frames are freed; it has no name and no parent.
 */
#ifndef KVPOOL_SHARE_INTERNAL_H
#define KVPOOL_SHARE_INTERNAL_H

#include "engine_internal.h"
#include "engine_share.h"
#include "hashtab.h"
#include "share.h"

#define PC_NONE UINT32_MAX

/* ------------------------------------------------------------ shared pages */

struct spage {
	uint32_t refs;           /* sequence pages listing this frame */
	uint32_t pc;             /* prefix entry, or PC_NONE */
};

struct pc_entry {
	uint8_t hash[32];
	uint32_t frame;          /* FRAME_NONE: entry slot free */
	uint32_t parent;         /* PC_NONE for page 0 of a chain */
	uint32_t nchildren;      /* entries whose parent this is */
	struct hnode hnode;      /* share.pcs, while published */
	struct list_head link;   /* pc LRU (idle leaves) or the free list */
	bool on_lru;
	bool in_store;           /* queued for the remote tier, or onloaded
				  * from it: not written again */
	uint64_t tick;
	struct list_head pub;    /* on share.pub_pcs until queued for the store */
};

/* ------------------------------------------------------------ chunks */

struct chunk_name;
struct json_t;

/* An entry (kvpool.h "Chunks"): a name's tokens at one place, with pages. */
struct chunk {
	struct kvp_chunk_id id;
	struct chunk_name *name; /* NULL once dead */
	struct chunk *parent;    /* NULL for a root, and once dead */
	struct chunk *fill_pin;  /* FILLING link: its parent, held meanwhile */
	uint32_t type;           /* the name's */
	uint32_t state;          /* enum kvp_chunk_state */
	uint32_t start;          /* parent->start + parent->tokens; 0: a root */
	uint32_t tokens;
	uint32_t npages;
	uint32_t *frames;        /* device frames the entry owns */
	uint32_t holders;
	uint32_t filler;         /* owner of the fill lease while FILLING */
	uint64_t fill_lease;     /* 0 once sealed */
	bool dead;               /* out of the table (deleted or evicted) */
	bool on_lru;
	uint64_t tick;
	uint64_t mark;           /* == share.mark: busy (chunk_plan_limits) */
	struct list_head children; /* live entries whose parent this is */
	struct list_head sib;    /* on parent->children */
	uint32_t nchildren;
	struct list_head name_link; /* on name->entries */
	struct hnode hnode;      /* share.chunks */
	struct list_head lru;    /* chunk LRU, or the dead list */
	struct list_head pub;    /* on share.pub_chunks until queued for the store */
	uint32_t pub_next;       /* its pages queued for the store so far */
	bool in_store;           /* all queued (pages, records), or from the store */
};

/* A name record: what was registered, shared by its entries. */
struct chunk_name {
	struct kvp_chunk_id id;
	uint32_t type;
	uint32_t ntokens;
	uint32_t *tokens;
	unsigned char *content;  /* NULL: none */
	uint32_t content_len;
	char *meta;              /* compact JSON, sorted keys; NULL: none */
	struct json_t *meta_json;
	uint64_t created_ns;
	uint64_t last_access_ns;
	uint64_t hits;
	struct list_head entries; /* through chunk.name_link, newest first */
	uint32_t nentries;
	/* A registration under way holds the name while it makes room:
	 * the eviction it starts may take the name's last entry, which
	 * would free it (name_unlink); a held name stays, and is no
	 * candidate for max_chunks eviction (name_freeable). */
	bool held;
	struct hnode hnode;      /* share.names */
};
/* ------------------------------------------------------------ sequences */

enum seq_page_kind {
	SP_REF = 0,              /* refcounted shared-world frame (sp[].refs) */
	SP_BORROWED = 1,         /* a history's or chunk's frame, kept by a pin */
};

struct seq_page {
	uint32_t frame;
	uint32_t kind;           /* enum seq_page_kind */
};

struct seq_pin {
	uint32_t kind;           /* KVP_SRC_USER or KVP_SRC_CHUNK */
	void *obj;               /* struct history * / struct chunk * */
};

struct seq {
	uint64_t id;
	uint32_t owner;
	uint64_t len;            /* committed tokens */
	uint32_t npages;         /* committed + reserved */
	uint32_t cap;
	struct seq_page *pages;
	struct seq_pin *pins;
	uint32_t npins;
	uint64_t write_lease;    /* open write lease, or 0 */
	uint32_t n_new;          /* its reserved tokens */
	/* Publishing: the token ids of [0, len + n_new) while hashable. */
	bool hashable;
	uint32_t *tokens;
	uint64_t tokens_cap;
	uint32_t published;      /* leading pages published (or found) */
	uint64_t cached;         /* tokens it did not compute: seq_alloc's
				  * prefix hit, seq_create's source tokens */
	/* Pages found published by someone else when this one committed the
	 * same tokens: it keeps its own copy (clients hold its page table)
	 * and holds theirs, so the chain it publishes after them has held
	 * parents (the invariant above). */
	uint32_t *anchors;
	uint32_t nanchors;
	struct hnode hnode;      /* share.seqs */
};

struct seq_table {
	struct hashtab ht;       /* by id (hashtab_hash_u64) */
};

/* Leases: the engine's one table (engine_internal.h, lease.c). */

/* ------------------------------------------------------------ the whole */

struct evp_md_ctx_st;
struct evp_md_st;

struct share {
	uint8_t salt[SHARE_SALT_BYTES];
	/* SHA-256, fetched once: a fetch and a context per page cost more than
	 * hashing the page (OpenSSL 3). */
	struct evp_md_st *sha256;
	struct evp_md_ctx_st *md;
	uint32_t nframes;        /* device frames */
	struct spage *sp;        /* [nframes] */

	/* prefix cache: entries[nframes], hash buckets, free list, LRU */
	struct pc_entry *pc;
	struct hashtab pcs;      /* published entries by hash */
	struct list_head pc_free_list;
	struct list_head pc_lru; /* idle leaves, oldest first */
	uint64_t pc_count;       /* published entries */
	uint64_t pc_idle;        /* of those with refs == 0 */

	/* chunks: entries by id (alive ones), LRU of unheld ready leaves */
	struct hashtab chunks;   /* by id (hashtab_hash_digest); .count: alive */
	uint64_t chunk_pages;    /* pages of alive and dead entries */
	struct list_head chunk_lru; /* oldest first, through chunk.lru */
	struct list_head dead;   /* dead entries still held (chunk.lru) */
	uint64_t chunk_lru_frames;
	uint64_t chunk_last_access_ns;
	uint64_t mark;           /* epoch of chunk.mark */
	/* names by id */
	struct hashtab names;    /* by id (hashtab_hash_digest) */
	/* limits (kvpool.h kvp_chunk_limits): configured and in force */
	uint64_t cfg_max_chunks, max_chunks;
	double cfg_memory_ratio, memory_ratio;
	uint64_t content_max;    /* bytes of content a name may have */

	/* What the remote tier does not have yet, oldest first: published
	 * prefix pages and sealed root chunks, queued ahead of eviction by
	 * remote_publish() (remote_engine.h). Empty without a remote tier. */
	struct list_head pub_pcs, pub_chunks;

	struct seq_table seqs;
	uint64_t seq_pages;      /* SP_REF pages summed over sequences */
	/* The tenant's settings (share_seq_configure): 0 is the default,
	 * caching on and no limit. */
	bool no_caching;
	uint64_t max_seq_tokens, max_seqs;

	/* scratch for results (compose arrays, hit lists) */
	int32_t *scratch;
	uint64_t scratch_cap;
	struct kvp_chunk_id *ids; /* list scratch */
	uint64_t ids_cap;
};

/* share.c (and engine_share.h, what the engine core calls) */
/* Make `need` device frames free, evicting across every LRU; the caller
 * checked engine_device_avail(). */
uint32_t share_frame_alloc(struct engine *eng); /* a free device frame (sp reset) */
void sp_ref(struct engine *eng, uint32_t frame);
void sp_unref(struct engine *eng, uint32_t frame);
int share_scratch(struct engine *eng, uint64_t n, struct errbuf *e);
/* Read one token's K and V (all layers) of a device frame through the
 * backend into out ([layers][2][heads][dim]). */
int share_read_token(struct engine *eng, uint32_t frame, uint32_t slot,
		     void *out, struct errbuf *e);


/* Start a SHA-256 on the shared context (share_prefix.c). */
struct evp_md_ctx_st *share_digest_begin(const struct engine *eng);

/* share_prefix.c */
/* Hash n token ids into ctx as little-endian uint32 (any host order). */
void share_digest_tokens(struct evp_md_ctx_st *ctx, const uint32_t *tokens,
			 uint64_t n);
/* Walk the chain of tokens' first `full` pages while it is published:
 * their frames into frames[], how many of them are idle into *idle. */
uint32_t pc_match(struct engine *eng, const uint32_t *tokens, uint32_t full,
		  uint32_t *frames, uint32_t *idle);
/* Tokens of an n-token list reported cached when its first hit pages are:
 * hit * P, or n - 1 when that is all n (seed 004: the last token is left
 * to compute). */
uint32_t share_prefix_cached(const struct engine *eng, uint32_t n, uint32_t hit);
void pc_hash_page(const struct engine *eng, const uint8_t prev[32],
		  const uint32_t *tokens, uint8_t out[32]);
uint32_t pc_find(const struct engine *eng, const uint8_t hash[32]);
/* Publish frame under hash with parent (PC_NONE for page 0). The frame is
 * held (refs > 0) and unpublished; the hash is not in the table. */
void pc_publish(struct engine *eng, uint32_t frame, const uint8_t hash[32],
		uint32_t parent);
/* Publish a filled frame nobody holds (sp reset: refs 0) under hash with
 * parent as an idle leaf: a page onloaded from the remote tier
 * (daemon/remote/remote_engine.c). */
void pc_adopt(struct engine *eng, uint32_t frame, const uint8_t hash[32],
	      uint32_t parent);
/* The oldest idle leaf, NULL when none. */
static inline struct pc_entry *pc_lru_head(const struct share *s)
{
	return list_first_entry_or_null(&s->pc_lru, struct pc_entry, link);
}
/* Idle-state transitions, called by sp_ref/sp_unref. */
void pc_became_busy(struct engine *eng, uint32_t e);
void pc_became_idle(struct engine *eng, uint32_t e);
/* Evict the pc LRU head (an idle leaf): frees its frame. */
void pc_evict_head(struct engine *eng);
int pc_init(struct share *s, uint32_t nframes);
void pc_fini(struct share *s);

/* share_chunk.c: entries */
/* The least recently used evictable entry, NULL when none. */
static inline struct chunk *chunk_lru_head(const struct share *s)
{
	return list_first_entry_or_null(&s->chunk_lru, struct chunk, lru);
}
void chunk_hold(struct engine *eng, struct chunk *c);
void chunk_unhold(struct engine *eng, struct chunk *c);
struct chunk *chunk_find(struct engine *eng, const struct kvp_chunk_id *id);
/* An entry by id, else a name's root entry; NULL when neither. */
struct chunk *chunk_resolve(struct engine *eng, const struct kvp_chunk_id *id);
uint32_t chunk_evict(struct engine *eng, struct chunk *c); /* drop from LRU: frees */
/* Kill c and every entry below it; frames freed, *nkilled += entries. */
uint32_t chunk_kill_tree(struct engine *eng, struct chunk *c, uint32_t *nkilled);
void chunk_lru_remove(struct engine *eng, struct chunk *c);
/* On the LRU exactly when evictable: alive, READY, unheld, a leaf. */
void chunk_lru_update(struct engine *eng, struct chunk *c);
void chunk_fill_end(struct engine *eng, struct chunk *c, bool sealed);
/* A use of entry c (hit, acquire, compose): LRU, its name's statistics. */
void chunk_touch(struct engine *eng, struct chunk *c, uint64_t now_ns);
int chunk_table_init(struct share *s, uint32_t nframes);
void chunk_table_fini(struct engine *eng);
/* -ENOENT: "<what> <id> is not registered (never, or deleted, or
 * evicted); register it again". */
int chunk_not_found(const char *what, const struct kvp_chunk_id *id,
		    struct errbuf *e);
/* Format an id for messages: first 16 hex digits. */
void chunk_id_short(const struct kvp_chunk_id *id, char out[17]);
int chunk_check(struct engine *eng, uint8_t *owner, uint64_t *frames,
		struct errbuf *e);

/* share_chunk_limits.c */
/* Plan room for an entry of pages (and a new name when new_name): -ENOMEM
 * naming the limit when it cannot be made; nothing changes. The caller
 * holds what it must keep (a link's parent) first. */
int chunk_limits_plan(struct engine *eng, uint64_t pages, bool new_name,
		      const char *sid, struct errbuf *e);
/* Make the room chunk_limits_plan() found: cannot fail. */
void chunk_limits_make_room(struct engine *eng, uint64_t pages, bool new_name);

/* share_chunk_name.c: names */
struct chunk_name *name_find(struct engine *eng, const struct kvp_chunk_id *id);
/* The name's newest entry (a name in the table has one at least). */
static inline struct chunk *name_first_entry(const struct chunk_name *n)
{
	return list_first_entry(&n->entries, struct chunk, name_link);
}
/* The name's root entry, NULL when it has none. */
struct chunk *name_root(const struct chunk_name *n);
void name_insert(struct engine *eng, struct chunk_name *n);
/* Out of the table and freed (its last entry went). */
void name_free(struct engine *eng, struct chunk_name *n);
/* Parse and check metadata text (NULL or "": none) into *out (NULL: none)
 * and its canonical text; what names the input in messages. */
int meta_parse(const char *text, const char *what, struct json_t **out,
	       char **canon, struct errbuf *e);
/* n's metadata with meta's keys put in (a copy, and its canonical text):
 * -EINVAL when the text would not fit. name_meta_set() installs them. */
int name_meta_merge(const struct chunk_name *n, struct json_t *meta,
		    struct json_t **merged, char **canon, struct errbuf *e);
void name_meta_set(struct chunk_name *n, struct json_t *meta, char *canon);
/* Busy marks: every entry that is held or FILLING, and its ancestors
 * (so an unmarked entry's whole subtree can be evicted); returns the pages
 * of the unmarked. */
uint64_t chunk_mark_busy(struct engine *eng);
int name_table_init(struct share *s, uint32_t nframes);
void name_table_fini(struct engine *eng);

/* share_seq.c */
/* Its helpers share_seq_create.c uses too. */
struct seq *seq_find(struct engine *eng, uint64_t id);
int seq_table_reserve(struct seq_table *t);
void seq_table_insert(struct seq_table *t, struct seq *q);
struct seq *seq_new(uint64_t id, uint32_t owner);
/* A sequence that never went into the table. */
void seq_free_mem(struct seq *q);
int seq_reserve_pages(struct seq *q, uint64_t n);
/* A new page of its own (refcounted) at the end of q. */
void seq_push_ref(struct engine *eng, struct seq *q, uint32_t frame);
/* Copy q's partial last page to a frame of its own (copy on write). */
void seq_cow(struct engine *eng, struct seq *q);
void seq_lease_out(struct engine *eng, const struct seq *q, uint64_t lid,
		   uint64_t hit, struct engine_lease *out);
int seq_exists(uint64_t id, struct errbuf *e);
/* -E2BIG past max_seq_tokens, -ENOSPC at max_seqs (when adding one):
 * both name the setting. */
int seq_check_limits(struct engine *eng, uint64_t id, uint64_t tokens,
		     bool adding, struct errbuf *e);
/* -E2BIG / -ENOMEM unless need device frames can be had with unavailable
 * more about to be pinned. */
int seq_plan_frames(struct engine *eng, uint64_t id, uint64_t pages_total,
		    uint64_t need, uint64_t unavailable, struct errbuf *e);
void seq_commit(struct engine *eng, struct seq *q, uint32_t n);
void seq_end_write(struct engine *eng, struct seq *q);
void seq_destroy(struct engine *eng, struct seq *q);
int seq_table_init(struct seq_table *t);
void seq_table_fini(struct engine *eng);
uint32_t seq_release_owner(struct engine *eng, uint32_t owner);
/* Count each frame's SP_REF listings into refs[]; check pins. */
int seq_check(struct engine *eng, uint32_t *refs, struct errbuf *e);

/* share_bounce.c: shared pages' bytes to and from CPU-readable memory. */
/*
 * CPU-readable copies of device frames dev[0, n) into out[]: the device
 * tier itself where the CPU can read it (shm), else host frames bounce[]
 * filled by one device -> host copy (share_bounce_free them after, when
 * *bounced). false: no host frames or the copy failed.
 */
bool share_pages_out(struct engine *eng, const uint32_t *dev, uint32_t n,
		     void **out, uint32_t *bounce, bool *bounced);
void share_bounce_free(struct engine *eng, uint32_t *bounce, uint32_t n);
/* src[0, n) (page_bytes each, CPU memory) into device frames dev[]: in
 * place on shm, through host frames and one copy per 64 pages on a GPU. 0 or -errno
 * (-ENOMEM: no host frames for the copy). */
int share_pages_in(struct engine *eng, const void *const *src, const uint32_t *dev,
		   uint32_t n);

#endif /* KVPOOL_SHARE_INTERNAL_H */
