/* SPDX-License-Identifier: MIT */
/*
 * share.h - sharing inside one engine (one tenant's pool): the prefix cache,
 * chunks, sequences (request-scoped and virtual) and cascade compositions.
 * DESIGN.md "Sharing"; the public shapes are kvpool.h's.
 *
 * Like the rest of the engine this is not thread-safe (the caller holds the
 * pool's mutex), every call that can fail changes nothing when it does, and
 * every pointer an out-struct carries points into engine memory valid until
 * the next call on the engine.
 *
 * WHO OWNS A DEVICE FRAME. Exactly one of:
 *   - a user history (engine_internal.h; unchanged by sharing);
 *   - a chunk (its pages; freed when the chunk is gone and nobody holds it);
 *   - the shared-page world: a frame with a reference count, held by the
 *     sequences whose page tables list it, and possibly published in the
 *     prefix cache under its chained hash. A published frame nobody holds
 *     stays cached (evictable); an unpublished one is freed at refcount 0.
 * A sequence's page table mixes three kinds of page: borrowed (a user
 * history's or a chunk's frame; the sequence pins the history / holds the
 * chunk, which keeps the frame), shared (refcounted: prefix hits, pages of
 * another sequence) and its own (refcount 1 from itself, shared when a
 * later sequence borrows them).
 *
 * LEASE HANDLES. Leases of sequences and chunks live in the engine's lease
 * id space beside history leases (bit 31 of the low word marks them), so
 * engine_commit / engine_release / engine_lease_slots take every kind:
 *   - a sequence write lease: commit(n) makes n tokens part of the sequence
 *     and publishes the pages they fill; release ends the write lease (the
 *     uncommitted slots go back) but not the sequence;
 *   - a chunk fill lease: commit(n == tokens) seals the chunk, release
 *     ends the lease (share_chunk_seal does both); release before the seal
 *     deletes the chunk;
 *   - a chunk read lease and a composition: commit is -EINVAL, release lets
 *     the chunks go.
 * A sequence that commits a page someone else published meanwhile keeps
 * its own copy (its client holds the page table) and holds the published
 * one as an anchor until it is freed: correctness over memory. Dedupe that
 * saves pages happens at seq_alloc (hits) and chunk register (same id).
 * A sequence made with n_new == 0 has no write lease (lease id 0).
 *
 * engine_release_owner() also frees the owner's sequences and ends its
 * chunk leases (unsealed chunks it was filling are deleted).
 *
 * EVICTION. Device pressure (a prepare, a seq_alloc, a chunk register)
 * takes frames from three LRU lists, oldest first across them: user
 * histories (demoted or dropped, as before), ready chunks nobody holds
 * (dropped: chunks are not demoted to the host tier), and idle prefix-cache
 * pages, leaves of the hash chain first. A published page's parent is held
 * by whoever holds the page, so every idle page is eventually a leaf: the
 * idle count is exactly what eviction can free.
 */
#ifndef KVPOOL_SHARE_H
#define KVPOOL_SHARE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

#define SHARE_SALT_BYTES 32

/* Set the tenant's hash salt (engine_create zeroes it). */
void share_set_salt(struct engine *eng, const uint8_t salt[SHARE_SALT_BYTES]);

/* ------------------------------------------------------------ prefix cache */

struct share_prefix_hit {
	uint32_t tokens;         /* npages * P, or n - 1 when the npages pages
				  * hold all n tokens (never n) */
	uint32_t npages;
	const uint32_t *frames;  /* device frames, not pinned */
};

/* Count it in prefix_lookups; never fails. Pages on the disk tier count
 * as cached: they come back to the device first (this waits for them). */
void share_prefix_lookup(struct engine *eng, const uint32_t *tokens, uint32_t n,
			 struct share_prefix_hit *out);
/* The same without waiting: -EINPROGRESS while pages of the chain are read
 * back from the disk tier (those before them are back), or while the
 * remote tier's round for the rest of the chain is out; call it again.
 * (share_prefix_lookup never waits on the remote tier: it answers with what
 * is here and the round goes on for a later lookup.) */
int share_prefix_find(struct engine *eng, const uint32_t *tokens, uint32_t n,
		      struct share_prefix_hit *out);

/* Chained page hashes of tokens (full pages only) into out[n / P][32]:
 * what the prefix cache keys on (for tests and tools). */
void share_prefix_hashes(const struct engine *eng, const uint32_t *tokens,
			 uint32_t n, uint8_t (*out)[32]);

/* ------------------------------------------------------------ sequences */

/*
 * seed 004 allocate(request, tokens): see kvp_seq_alloc. Errors:
 *   -EEXIST  seq exists in this engine
 *   -E2BIG   more pages than the device tier
 *   -ENOMEM  not enough unpinned frames
 *   -ENOSPC  lease table full
 */
int share_seq_alloc(struct engine *eng, uint64_t seq, const uint32_t *tokens,
		    uint32_t n, uint32_t owner, struct engine_lease *out,
		    struct errbuf *e);

/*
 * seed 000 virtual sequence: see kvp_seq_create. Errors as share_seq_alloc
 * plus -ENOENT (a source not found: named), -EAGAIN (a chunk not ready),
 * -EINVAL (a source other than the last ends mid-page; bad kind; nsrc 0 and
 * n_new 0; a USER source asking for more tokens than committed, or whose
 * head was trimmed).
 * A USER source whose pages are on the host tier is onloaded first.
 */
int share_seq_create(struct engine *eng, uint64_t seq,
		     const struct kvp_seq_src *src, uint32_t nsrc, uint32_t n_new,
		     uint32_t owner, struct engine_lease *out, struct errbuf *e);

/* -ENOENT unknown seq, -EPERM another client's, -EBUSY write lease open
 * (uncommitted; a committed one still open is released by the extend), else
 * as above. */
int share_seq_extend(struct engine *eng, uint64_t seq, uint32_t n_new,
		     const uint32_t *tokens, uint32_t owner,
		     struct engine_lease *out, struct errbuf *e);

/*
 * -ENOENT unknown, -EPERM another client's, -EBUSY while its write lease is
 * held (committed or not: until the client releases it, that lease's page
 * table names the sequence's pages, and its client may still write through
 * it; a leased user history is not evicted either).
 */
int share_seq_free(struct engine *eng, uint64_t seq, uint32_t owner,
		   struct errbuf *e);
/* Free seq and end its write lease, held or not: for its owner's detach and
 * for undoing a create whose result could not be sent. No-op when unknown. */
void share_seq_discard(struct engine *eng, uint64_t seq, uint32_t owner);

/*
 * The tenant's sequence settings (kvpool.conf prefix_caching, max_seq_tokens,
 * max_seqs; tenant.c and reload.c). caching false: seq_alloc and prefix
 * lookups find nothing and commits publish nothing (seed 004's
 * EnableCaching); pages already published stay until evicted. max_tokens:
 * tokens one sequence may hold (committed and reserved), max_seqs:
 * sequences alive at once in this pool; 0 means no limit. A limit lowered
 * below what exists ends nothing: the next alloc, create or extend past it
 * fails.
 */
void share_seq_configure(struct engine *eng, bool caching, uint64_t max_tokens,
			 uint64_t max_seqs);

/* What share_seq_info() reads: the public row and the page table and token
 * ids, in engine memory valid until the next call. */
struct share_seq_state {
	struct kvp_seq_info info;
	const uint32_t *frames;  /* [info.npages] */
	const uint32_t *tokens;  /* [info.ntoken_ids] */
};

/* A sequence's state (kvp_seq_info): any client of the tenant may read it.
 * -ENOENT unknown; -ENOMEM no room for the page table copy. */
int share_seq_info(struct engine *eng, uint64_t seq,
		   struct share_seq_state *out, struct errbuf *e);

/* For tests: read committed tokens [pos, pos+n) of seq (format as
 * engine_read_tokens). */
int share_seq_read_tokens(struct engine *eng, uint64_t seq, uint64_t pos,
			  uint32_t n, void *out, struct errbuf *e);

/* ------------------------------------------------------------ chunks */

/* See kvpool.h "Chunks": names, entries, limits. */
struct share_chunk_reg {
	struct kvp_chunk_id id;    /* the entry */
	struct kvp_chunk_id name;
	bool created;
	uint32_t state;
	uint32_t start;
	uint32_t tokens;
	struct engine_lease lease; /* created: the fill lease */
};

struct share_chunk_root {
	const uint32_t *tokens;
	uint32_t n;
	uint32_t type;
	const void *content;       /* NULL: none */
	uint32_t content_len;
	const char *meta;          /* JSON object text or NULL */
};

/* Configured limits of the tenant (tenant.c after engine_create): max
 * names (0: unlimited), chunk pages / device frames, content bytes. */
void share_chunk_configure(struct engine *eng, uint64_t max_chunks,
			   double memory_ratio, uint64_t content_max);

/*
 * A root entry (kvp_chunk_put). Errors: -EINVAL (n == 0, bad type,
 * metadata not a JSON object or too long, the name registered with other
 * tokens or another type), -E2BIG (content over content_max, more pages
 * than the device tier), -ENOMEM (limits or device tier full of held
 * pages), -ENOSPC as share_seq_alloc. now_ns: CLOCK_REALTIME.
 */
int share_chunk_put(struct engine *eng, const struct share_chunk_root *root,
		    uint32_t owner, uint64_t now_ns, struct share_chunk_reg *out,
		    struct errbuf *e);
/* share_chunk_put without content. */
int share_chunk_register(struct engine *eng, const uint32_t *tokens, uint32_t n,
			 uint32_t type, const char *meta, uint32_t owner,
			 uint64_t now_ns, struct share_chunk_reg *out,
			 struct errbuf *e);
/* A link (kvp_chunk_link): -ENOENT name or parent unknown, -EAGAIN parent
 * FILLING, else as share_chunk_put. */
int share_chunk_link(struct engine *eng, const struct kvp_chunk_id *name,
		     const struct kvp_chunk_id *parent, uint32_t owner,
		     uint64_t now_ns, struct share_chunk_reg *out,
		     struct errbuf *e);
/* The fill lease's owner only: -ENOENT / -EPERM / -EALREADY (sealed). */
int share_chunk_seal(struct engine *eng, uint64_t lease, uint32_t owner,
		     struct errbuf *e);
/* id: an entry, or a name for its root. -ENOENT not found, -EAGAIN filling. */
int share_chunk_acquire(struct engine *eng, const struct kvp_chunk_id *id,
			uint32_t owner, uint64_t now_ns, struct engine_lease *out,
			struct errbuf *e);
/*
 * A chunk id (a name, or an entry) this pool does not hold: its root
 * brought back from the disk tier or the remote tier, as an acquire does,
 * so that a get or an entry row of a chunk another node computed answers.
 * 0 (held now, or nowhere: the lookup says -ENOENT), -EINPROGRESS (being
 * read: retry, the ring worker holding the entry), -ENOMEM (no room).
 */
int share_chunk_from_below(struct engine *eng, const struct kvp_chunk_id *id,
			   struct errbuf *e);
/* A name's row; id: the name or one of its entries. */
int share_chunk_info(struct engine *eng, const struct kvp_chunk_id *id,
		     struct kvp_chunk_info *out, struct errbuf *e);
int share_chunk_entry(struct engine *eng, const struct kvp_chunk_id *id,
		      struct kvp_chunk_entry_info *out, struct errbuf *e);
/* Rows of a name's entries (at most max); returns how many it has. */
int share_chunk_entries(struct engine *eng, const struct kvp_chunk_id *name,
			struct kvp_chunk_entry_info *rows, uint32_t max,
			struct errbuf *e);
/* A name's content from byte off: *data / *len point into engine memory
 * (the rest after off), *total its length. */
int share_chunk_content(struct engine *eng, const struct kvp_chunk_id *name,
			const void **data, uint32_t *total, struct errbuf *e);
int share_chunk_tokens(struct engine *eng, const struct kvp_chunk_id *name,
		       const uint32_t **tokens, uint32_t *n, struct errbuf *e);
/* Names > cursor (NULL: from the start), ascending; *more set when rows
 * remain after the last one written. filter: JSON object text or NULL.
 * Returns rows or -ENOMEM/-EINVAL. */
int share_chunk_list(struct engine *eng, uint32_t type, const char *filter,
		     const struct kvp_chunk_id *cursor, struct kvp_chunk_info *rows,
		     uint32_t max, bool *more, struct errbuf *e);
/* A name or an entry, and everything below: returns entries deleted. */
int share_chunk_delete(struct engine *eng, const struct kvp_chunk_id *id,
		       struct errbuf *e);
/* Names deleted. */
int share_chunk_clear(struct engine *eng, uint32_t type);
int share_chunk_evict_unused(struct engine *eng, uint64_t max_age_ns,
			     uint64_t now_ns);
/* Set (max_chunks < 0 / memory_ratio < 0: keep; clamped to the configured
 * ones) and read the limits. -EINVAL a ratio of 0 or not a number. */
int share_chunk_limits(struct engine *eng, int64_t max_chunks,
		       double memory_ratio, struct kvp_chunk_limits *out,
		       struct errbuf *e);
/* For tests: read tokens [pos, pos+n) of an entry (any state). */
int share_chunk_read_tokens(struct engine *eng, const struct kvp_chunk_id *id,
			    uint32_t pos, uint32_t n, void *out,
			    struct errbuf *e);

/* ------------------------------------------------------------ compositions */

struct share_composition {
	uint64_t lease;          /* 0 for a preview */
	uint32_t nlevels;
	uint32_t nrequests;
	uint64_t tokens;
	uint64_t pages;
	uint64_t bytes;
	/* Per level l, arrays in engine memory: */
	uint32_t ngroups[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *qo_indptr[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *kv_indptr[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *kv_indices[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *kv_last_page_len[KVP_COMPOSE_MAX_LEVELS];
};

/* See kvp_compose. preview: hold nothing, lease 0. */
int share_compose(struct engine *eng, const struct kvp_compose_req *reqs,
		  uint32_t nreq, bool preview, uint32_t owner, uint64_t now_ns,
		  struct share_composition *out, struct errbuf *e);

#endif /* KVPOOL_SHARE_H */
