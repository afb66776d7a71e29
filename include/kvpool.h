/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: the one public header, the whole ABI (liburing.h). */
/*
 * kvpool.h - the public API of libkvpool, the client library of kvpoold.
 *
 * This is the only installed header. Everything here is prefixed kvp_ / KVP_
 * and every function returns 0 (or a count) on success and -errno on failure;
 * no function sets errno. Functions that can fail for a reason the caller can
 * act on also write a message naming what was wrong into the buffer they are
 * given (or, for connected calls, the client's last-error buffer).
 *
 * ABI: libkvpool.so.0 exports exactly the functions below, each under the
 * version node of the release that added it (libclient/kvpool.map:
 * KVPOOL_0.1, ...); abi/ holds the last release's ABI, which CI compares
 * the library with. Structs filled or read one at a time (kvp_stats,
 * kvp_latency, kvp_connect_opts) end in reserved words that later fields
 * take, so they never change size; zero them when you fill them.
 *
 * GROWING STRUCTS. The structs the library writes as rows or results
 * (kvp_user_info, kvp_client_info, kvp_chunk_info, kvp_chunk_entry_info,
 * kvp_completion, kvp_error_info, kvp_seq_info) grow by fields added at their end, and the caller tells
 * the library how big its copy is, as Linux's sched_getattr(2), openat2(2)
 * and clone3(2) do with their size arguments:
 *  - each such call has a _sz form taking the caller's sizeof (the array's
 *    stride), and the usual name is a macro that passes sizeof(*rows), so
 *    source code never spells a size and a rebuild picks up the new one
 *    (a void * there is a compile error: cast it to the struct's type);
 *  - the library writes min(the caller's size, its own) bytes of every row
 *    at the caller's stride and zeroes the rest of the caller's row: an
 *    older caller (smaller struct) gets the fields it knows and nothing past
 *    its rows; a newer caller (bigger struct) gets 0 in the fields this
 *    library does not know yet, 0 meaning "none / not reported";
 *  - a size below the struct's first release (KVP_..._SIZE_VER0) or not a
 *    multiple of 8 is -EINVAL;
 *  - the names without _sz stay exported under KVPOOL_0.1 for programs
 *    built against that release, and write that release's layout
 *    (..._SIZE_VER0), so such a binary keeps working with a newer library.
 *    A program built against a newer kvpool.h needs the KVPOOL_x.y node of
 *    the _sz calls; an older library without it is refused by the dynamic
 *    linker at start ("version KVPOOL_0.2 not found"), never mid-run.
 * Arrays the caller passes in (kvp_append_item, kvp_seq_src,
 * kvp_compose_req) grow the same way, read as Linux's
 * copy_struct_from_user() reads them: at the caller's stride, the fields
 * an older caller lacks taken as 0, and bytes a newer caller sets past
 * this library's struct refused (-E2BIG: it asks for something this
 * library cannot do); with no element the size is not looked at (NULL, 0
 * is fine).
 * Rules for the structs: fields are only appended; a struct embedded in a
 * growing one is its last member (kvp_completion.info), so it can grow too;
 * every field's 0 means "none" or "unknown", because that is what a newer
 * caller reads from an older library. Do not take the address of a macro'd
 * call (&kvp_users is the KVPOOL_0.1 entry point with the old stride): call
 * kvp_users_sz() through a pointer instead.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_VERSION_MAJOR 0
#define KVP_VERSION_MINOR 1

/* The library's version: major * 1000 + minor. */
int kvp_version(void);

/* sizeof(*p) for the growing structs' macros (GROWING STRUCTS above), and
 * a compile error when p is not a TYPE * (a void * would pass 1). */
#define KVP_ROW_SIZE_(p, type) (sizeof(*(p)) + 0 * sizeof((p) - (type *)0))

/* Room for any message the library writes, terminating NUL included. */
#define KVP_ERRLEN 256

/* ------------------------------------------------------------------------ */
/* Layout: the model geometry a pool serves.                                 */
/* ------------------------------------------------------------------------ */

enum kvp_dtype {
	KVP_DTYPE_BF16 = 1,
	KVP_DTYPE_FP16 = 2,
	KVP_DTYPE_FP8_E4M3 = 3,
	KVP_DTYPE_FP32 = 4,
};

/* Largest page kvpool accepts (all layers, K and V): 1 GiB. */
#define KVP_MAX_PAGE_BYTES (1ull << 30)
/* page_tokens must be a power of two in [1, KVP_MAX_PAGE_TOKENS]. */
#define KVP_MAX_PAGE_TOKENS 1024u

/*
 * One page holds page_tokens tokens of K and V for all layers, contiguous and
 * page-major:
 *
 *     page[layer][K|V][token][head][dim]
 *
 * so byte offset of element (layer l, kv, token t, head h, dim d) in frame f is
 *
 *     f * page_bytes + l * layer_stride + kv * kv_stride
 *       + t * token_stride + h * head_stride + d * elem_bytes
 *
 * Viewed per layer this is FlashInfer's NHD paged layout
 * [pages, 2, page_tokens, heads, dim] with page stride = page_bytes.
 */
struct kvp_layout {
	uint32_t layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t dtype;        /* enum kvp_dtype */
	uint32_t page_tokens;
	uint32_t elem_bytes;
	uint64_t head_stride;  /* head_dim * elem_bytes */
	uint64_t token_stride; /* kv_heads * head_stride: one token's K (or V) row of one layer */
	uint64_t kv_stride;    /* page_tokens * token_stride: from K block to V block */
	uint64_t layer_stride; /* 2 * kv_stride */
	uint64_t page_bytes;   /* layers * layer_stride */
	uint64_t token_bytes;  /* K and V of one token, all layers: 2 * layers * token_stride */
};

/*
 * Fill *l from the five geometry parameters and compute every stride.
 * Returns 0, or -EINVAL with a message in err (a zero, an unknown dtype, a
 * page_tokens that is not a power of two up to KVP_MAX_PAGE_TOKENS, a page
 * larger than KVP_MAX_PAGE_BYTES or a product that overflows). On error *l is
 * left untouched.
 */
int kvp_layout_init(struct kvp_layout *l, uint32_t layers, uint32_t kv_heads,
		    uint32_t head_dim, uint32_t dtype, uint32_t page_tokens,
		    char *err, size_t errlen);

/*
 * Parse "layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32" (all five
 * keys, any order) into *l. Returns 0 or -EINVAL with a message in err.
 */
int kvp_layout_parse(struct kvp_layout *l, const char *spec, char *err,
		     size_t errlen);

/* Write the spec string kvp_layout_parse() reads back; returns its length. */
int kvp_layout_format(const struct kvp_layout *l, char *buf, size_t len);

/* "bf16", "fp16", "fp8_e4m3", "fp32"; NULL for an unknown value. */
const char *kvp_dtype_name(uint32_t dtype);
/* The enum kvp_dtype for a name, or -EINVAL. */
int kvp_dtype_parse(const char *name);

/* ------------------------------------------------------------------------ */
/* Tiers and statistics.                                                     */
/* ------------------------------------------------------------------------ */

enum kvp_tier {
	KVP_TIER_DEVICE = 0, /* the GPU pool (a memfd on the shm backend) */
	KVP_TIER_HOST = 1,   /* pinned host memory for offload */
	KVP_TIERS = 2,
};

/* Which tiers an eviction applies to. */
enum kvp_tier_sel {
	KVP_SEL_DEVICE = 1 << KVP_TIER_DEVICE, /* demote: keep a host copy when it fits */
	KVP_SEL_HOST = 1 << KVP_TIER_HOST,
	KVP_SEL_ALL = KVP_SEL_DEVICE | KVP_SEL_HOST, /* with a disk tier: its copy too */
	/* The disk tier (kvpoold(8), Disk tier): alone, drop the disk copy;
	 * KVP_SEL_TO_DISK alone pushes a history down: written to disk, its
	 * device and host frames freed (kvctl offload --tier disk). */
	KVP_SEL_DISK = 1 << 2,
	KVP_SEL_TO_DISK = 1 << 3,
};
/* Every selection an evict may carry. */
#define KVP_SEL_VALID (KVP_SEL_ALL | KVP_SEL_DISK | KVP_SEL_TO_DISK)

const char *kvp_tier_name(uint32_t tier);

struct kvp_tier_stats {
	uint64_t frames_total;
	uint64_t frames_used;
	uint64_t frames_free;
	uint64_t bytes_total;
};

/*
 * Every field of struct kvp_stats after tier[], listed once, in struct order:
 * X(name, group, kind, unit, metric, help). The struct below is made from it,
 * and kvctl stats (table and JSON), kvpoold's Prometheus metrics and the man
 * pages' checks all walk the same list, so none of them can miss a field.
 *   group  CORE (users, leases, copies, reclaim) or SHARE (prefix cache,
 *          sequences, chunks);
 *   kind   COUNTER (monotonic), GAUGE, or TIME (a CLOCK_REALTIME instant);
 *   unit   "bytes", "ns" (exported in seconds) or "" (a count of what the
 *          name says);
 *   metric the Prometheus name after "kvpool_", before the unit's suffix and
 *          a counter's "_total".
 */
#define KVP_STATS_FIELDS(X) \
	X(users, CORE, GAUGE, "", "users", \
	  "User histories holding tokens or leases.") \
	X(leases, CORE, GAUGE, "", "leases", "Leases not yet released.") \
	X(prepares, CORE, COUNTER, "", "prepares", "Prepares served.") \
	X(commits, CORE, COUNTER, "", "commits", "Commits served.") \
	X(releases, CORE, COUNTER, "", "releases", "Leases released without a commit.") \
	X(hit_tokens, CORE, COUNTER, "", "hit_tokens", \
	  "Cached tokens a prepare reused instead of recomputing them.") \
	X(committed_tokens, CORE, COUNTER, "", "committed_tokens", "Tokens committed.") \
	X(evicted_users, CORE, COUNTER, "", "evicted_users", \
	  "User histories dropped (their data lost).") \
	X(evicted_pages, CORE, COUNTER, "", "evicted_pages", "Pages dropped by eviction.") \
	X(demoted_users, CORE, COUNTER, "", "demoted_users", \
	  "User histories moved device to host under pressure or by evict.") \
	X(demoted_pages, CORE, COUNTER, "", "demoted_pages", "Pages moved device to host.") \
	X(offloaded_pages, CORE, COUNTER, "", "offloaded_pages", \
	  "Device to host page copies made by offload.") \
	X(onloaded_pages, CORE, COUNTER, "", "onloaded_pages", \
	  "Host to device page copies made by prepare.") \
	X(trimmed_pages, CORE, COUNTER, "", "trimmed_pages", \
	  "Head pages dropped by max_tokens_per_user.") \
	X(bytes_d2h, CORE, COUNTER, "bytes", "copy_d2h", \
	  "Bytes copied device to host (offload, demotion).") \
	X(bytes_h2d, CORE, COUNTER, "bytes", "copy_h2d", \
	  "Bytes copied host to device (onload).") \
	X(clients, CORE, GAUGE, "", "clients", "Attached clients (daemon only).") \
	X(tenants, CORE, GAUGE, "", "tenants", "Tenants summed over (daemon only).") \
	X(prefix_pages, SHARE, GAUGE, "", "prefix_pages", \
	  "Pages published in the prefix cache.") \
	X(prefix_idle_pages, SHARE, GAUGE, "", "prefix_idle_pages", \
	  "Prefix cache pages held by no sequence (evictable).") \
	X(prefix_lookups, SHARE, COUNTER, "", "prefix_lookups", \
	  "Prefix lookups and seq_alloc calls.") \
	X(prefix_lookup_tokens, SHARE, COUNTER, "", "prefix_lookup_tokens", \
	  "Tokens prefix lookups asked about.") \
	X(prefix_hit_tokens, SHARE, COUNTER, "", "prefix_hit_tokens", \
	  "Tokens prefix lookups found cached.") \
	X(prefix_evicted_pages, SHARE, COUNTER, "", "prefix_evicted_pages", \
	  "Prefix cache pages evicted.") \
	X(prefix_dedupe_pages, SHARE, COUNTER, "", "prefix_dedupe_pages", \
	  "Pages a commit found published by another sequence meanwhile.") \
	X(seqs, SHARE, GAUGE, "", "seqs", "Sequences alive.") \
	X(seq_pages, SHARE, GAUGE, "", "seq_pages", \
	  "Device pages sequences own (not borrowed).") \
	X(cow_pages, SHARE, COUNTER, "", "cow_pages", "Partial pages copied on write.") \
	X(chunks, SHARE, GAUGE, "", "chunks", "Chunk names registered.") \
	X(chunk_pages, SHARE, GAUGE, "", "chunk_pages", \
	  "Pages of chunk entries (deleted but held ones too).") \
	X(chunk_bytes, SHARE, GAUGE, "bytes", "chunk", "Bytes of chunk entries' pages.") \
	X(chunk_lookups, SHARE, COUNTER, "", "chunk_lookups", \
	  "Chunk registers, links, acquires and compose entries.") \
	X(chunk_hits, SHARE, COUNTER, "", "chunk_hits", \
	  "Chunk lookups that found the entry already there.") \
	X(chunk_evicted, SHARE, COUNTER, "", "chunk_evicted", \
	  "Chunks evicted under pressure or by evict_unused.") \
	X(chunk_last_access_ns, SHARE, TIME, "ns", "chunk_last_access_timestamp", \
	  "When a chunk was last hit or registered (Unix time, 0 for never).") \
	X(compositions, SHARE, COUNTER, "", "compositions", \
	  "Compose calls that returned page tables.") \
	X(ns_d2h, CORE, COUNTER, "ns", "copy_d2h", \
	  "Wall time of device to host copies: copy_d2h_bytes / this is their bandwidth.") \
	X(reclaim_stalls, CORE, COUNTER, "", "reclaim_stalls", \
	  "Prepares that waited for the reclaimer to free device frames (held back, others passed).") \
	X(reclaimed_pages, CORE, COUNTER, "", "reclaimed_pages", \
	  "Pages the background reclaimer freed.") \
	X(shards, CORE, GAUGE, "", "shards", "Engine shards summed over (daemon only).") \
	X(reclaim_onload_stalls, CORE, COUNTER, "", "reclaim_onload_stalls", \
	  "Of reclaim_stalls, prepares with an onload (held back to keep the low watermark for the others).") \
	X(reclaim_direct, CORE, COUNTER, "", "reclaim_direct", \
	  "Prepares that evicted for room themselves (the reclaimer was off, had nothing to evict, or 5 ms had passed).") \
	X(disk_users, CORE, GAUGE, "", "disk_users", \
	  "Histories only on the disk tier (kvpoold(8), Disk tier).") \
	X(disk_pages, CORE, GAUGE, "", "disk_pages", "Pages of those histories.") \
	X(disk_demoted_pages, CORE, COUNTER, "", "disk_demoted_pages", \
	  "Pages written to the disk tier.") \
	X(disk_read_pages, CORE, COUNTER, "", "disk_read_pages", \
	  "Pages read back from the disk tier.") \
	X(disk_dropped_pages, CORE, COUNTER, "", "disk_dropped_pages", \
	  "Pages the disk tier dropped: full, over quota, a failed write or read.") \
	X(disk_stored_bytes, CORE, COUNTER, "bytes", "disk_stored", \
	  "Bytes the disk tier stored for the pages it wrote (less with disk_compress).") \
	X(disk_prefix_pages, SHARE, GAUGE, "", "disk_prefix_pages", \
	  "Prefix cache pages only on the disk tier (a lookup brings them back).") \
	X(disk_chunks, SHARE, GAUGE, "", "disk_chunks", \
	  "Chunks only on the disk tier (an acquire or register brings them back).") \
	X(disk_chunk_pages, SHARE, GAUGE, "", "disk_chunk_pages", \
	  "Pages of those chunks, their name records included.") \
	X(ns_h2d, CORE, COUNTER, "ns", "copy_h2d", \
	  "Time of host to device copies (onload; the GPU's on cuda): copy_h2d_bytes / this is their bandwidth.")

#define KVP_STATS_ONE_(name, group, kind, unit, metric, help) + 1
/* How many fields KVP_STATS_FIELDS lists, and the words they may grow to. */
enum { KVP_STATS_NFIELDS = 0 KVP_STATS_FIELDS(KVP_STATS_ONE_), KVP_STATS_WORDS = 64 };
#undef KVP_STATS_ONE_

/*
 * Counters of one pool, one uint64_t per KVP_STATS_FIELDS entry. Each
 * pool's counters are monotonic except the gauges and times. The struct
 * keeps its size as fields are added: a new field takes a reserved word,
 * so a program built against an older kvpool.h passes a struct that is
 * still big enough, and a daemon that does not know a field sends 0.
 */
struct kvp_stats {
	struct kvp_tier_stats tier[KVP_TIERS]; /* gauges */
#define KVP_STATS_MEMBER_(name, group, kind, unit, metric, help) uint64_t name;
	KVP_STATS_FIELDS(KVP_STATS_MEMBER_)
#undef KVP_STATS_MEMBER_
	uint64_t reserved[KVP_STATS_WORDS - KVP_STATS_NFIELDS]; /* 0 */
};

/* ------------------------------------------------------------------------ */
/* Data op: where new tokens go.                                             */
/* ------------------------------------------------------------------------ */

/* One token's destination: a device-tier frame and the token slot in it. */
struct kvp_slot {
	uint32_t frame;
	uint32_t slot;
};

/*
 * CPU read-back of n tokens from their slots into out, in the order
 * kvp_append() reads its kv buffer: [n][layers][2][kv_heads][head_dim].
 * (The CPU append it mirrors is not exported: it wrote wherever its slots
 * said, with no lease check. Write through kvp_append() and its kin, which
 * check the lease; on the shm backend they make the same copy.)
 */
void kvp_read_cpu(const struct kvp_layout *l, const void *tier_base,
		  const struct kvp_slot *slots, uint32_t n, void *out);

/* ------------------------------------------------------------------------ */
/* Client: attach to kvpoold.                                                */
/* ------------------------------------------------------------------------ */

/* Where kvpoold listens unless told otherwise ($KVPOOL_SOCKET overrides). */
#define KVP_DEFAULT_SOCKET "/run/kvpool/kvpoold.sock"

struct kvp_client;

struct kvp_connect_opts {
	const char *socket;    /* NULL: $KVPOOL_SOCKET, else KVP_DEFAULT_SOCKET */
	const char *name;      /* shown by `kvctl clients`; NULL: program name */
	uint32_t sq_entries;   /* 0: daemon default (256) */
	uint32_t arena_bytes;  /* 0: daemon default (4 MiB) */
	uint32_t spin_us;      /* how long a wait spins before it sleeps; 0: 20 us */
	uint32_t pool;         /* the daemon's pool to attach to: 0 its first (with
				* kvpoold --devices=0,1 pool i is on the i-th GPU) */
	uint32_t rank;         /* 0.3: this process's rank in a tensor-parallel
				* pool (kvpool.conf tp = N: 0 to N-1; it maps
				* its rank's GPU and pages, kvp_lease_join); 0
				* for every other pool (was reserved[0]) */
	uint32_t reserved[5];  /* 0 (zero the struct): options to come take
				* these words, 0 meaning their default */
};

/*
 * Attach to the daemon: connect, check versions, map the rings and the
 * tenant's device tier. opts may be NULL. Returns 0, or -errno with the reason
 * in err (e.g. -ECONNREFUSED "no kvpoold at PATH", -EACCES "uid 1001 is not
 * in allow_uids of kvpoold at PATH", -EPROTO version mismatch).
 */
int kvp_connect(struct kvp_client **out, const struct kvp_connect_opts *opts,
		char *err, size_t errlen);
/* Detach: the daemon releases every lease the client still holds. */
void kvp_close(struct kvp_client *c);

/* The message of the client's last failed call ("" after a success). */
const char *kvp_last_error(const struct kvp_client *c);

/*
 * What an error is about, as data: a program acts on these fields, never on
 * the message's words (which may change from one release to the next).
 * kind NONE: the errno says all there is (most errors). The ranges come
 * from kvpoold in the completion (proto.h, struct kvp_cqe); a library error
 * (a bad argument, a dead connection) has kind NONE.
 */
enum kvp_error_kind {
	KVP_ERROR_NONE = 0,
	/* -EINVAL from a prepare: start_pos is past the cached end; tokens
	 * first .. last (both inclusive) are missing, first being the cached
	 * end, where the input should start (seed 002's "missing tokens from
	 * first to last (both inclusive)"). */
	KVP_ERROR_GAP = 1,
	/* -EINVAL from a prepare: the input's tokens first .. last (both
	 * inclusive) are cached already (seed 002's "overlapping tokens");
	 * first is start_pos. */
	KVP_ERROR_OVERLAP = 2,
	/* -EINVAL from a prepare: the input starts at first, before the first
	 * cached token last + 1 (max_tokens_per_user trimmed the head): its
	 * tokens first .. last can never be cached again; the history goes on
	 * from its cached end (kvp_info: start + len). */
	KVP_ERROR_TRIMMED = 3,
};

/* A growing struct (GROWING STRUCTS above). */
struct kvp_error_info {
	uint32_t kind;           /* enum kvp_error_kind */
	uint32_t rsv;            /* 0 */
	uint64_t first;          /* token positions, both inclusive; 0 for NONE */
	uint64_t last;
};
#define KVP_ERROR_INFO_SIZE_VER0 24

/*
 * The kvp_error_info of the client's last failed call (as kvp_last_error()
 * is its message: read it after a call returned -errno, before the next
 * call). Returns 0, or -EINVAL for a NULL out or a size below
 * KVP_ERROR_INFO_SIZE_VER0.
 */
int kvp_last_error_info_sz(const struct kvp_client *c, struct kvp_error_info *out,
			   size_t size);
#define kvp_last_error_info(c, out) \
	kvp_last_error_info_sz((c), (out), KVP_ROW_SIZE_(out, struct kvp_error_info))
const struct kvp_layout *kvp_client_layout(const struct kvp_client *c);
/* The device tier as mapped in this process: a host pointer on the shm
 * backend, a CUDA device pointer (valid on kvp_cuda_device()) on cuda. */
void *kvp_device_base(const struct kvp_client *c);
/* Frames of the device tier mapped at kvp_device_base() (0: none): the
 * mapping is kvp_device_frames() * page_bytes bytes. */
uint32_t kvp_device_frames(const struct kvp_client *c);
/* The CUDA device ordinal, in this process, of the GPU the pool lives on
 * (found by UUID: it may differ from the daemon's ordinal under another
 * CUDA_VISIBLE_DEVICES), or -1 on the shm backend. */
int kvp_cuda_device(const struct kvp_client *c);
uint32_t kvp_client_id(const struct kvp_client *c);
/* A tensor-parallel pool (kvpool.conf tp): its ranks (1 for any other
 * pool) and this client's rank (kvp_connect_opts.rank). A rank's layout
 * (kvp_client_layout) has kv_heads / tp of the model's heads, and its
 * device tier holds its rank's page of every frame. */
uint32_t kvp_client_tp(const struct kvp_client *c);
uint32_t kvp_client_rank(const struct kvp_client *c);
/* 1 when the daemon granted admin rights (kvctl evict --all, ...). */
int kvp_client_is_admin(const struct kvp_client *c);

/* ------------------------------------------------------------------------ */
/* Client: synchronous calls. Each returns >= 0 or -errno; on failure         */
/* kvp_last_error() says what was wrong. They return -EBUSY while            */
/* asynchronous operations are in flight (reap them first).                   */
/* ------------------------------------------------------------------------ */

/* A growing struct (GROWING STRUCTS above). */
struct kvp_user_info {
	uint64_t user;
	uint64_t start;        /* first cached token position */
	uint64_t len;          /* committed tokens cached (0: nothing cached) */
	uint32_t pages_device;
	uint32_t pages_host;
	uint32_t leases;
	uint32_t tenant;       /* tenant index (for admins listing all) */
	/* 0.2: the copy of the history on the disk tier (kvpoold(8), Disk
	 * tier), 0 without one: its pages and its committed tokens. */
	uint32_t pages_disk;
	uint32_t rsv;          /* 0 */
	uint64_t tokens_disk;
};
/* Its size in release 0.1 (through tenant), and in 0.2. */
#define KVP_USER_INFO_SIZE_VER0 40
#define KVP_USER_INFO_SIZE_VER1 56

/* What prepare returns: the pinned page table and where the new tokens go. */
struct kvp_lease {
	uint64_t id;
	uint64_t user;
	uint64_t start;          /* history start */
	uint64_t len;            /* committed tokens before this lease */
	uint32_t n_new;          /* reserved new tokens: positions [start+len, start+len+n_new) */
	uint32_t npages;         /* page table entries (history + new pages) */
	uint32_t last_page_len;  /* tokens in the last page once n_new are written */
	uint32_t onloaded_pages; /* pages brought back from the host tier */
	/* Device frame of each page: FlashInfer's kv_indices with kv_indptr
	 * {0, npages} and kv_last_page_len last_page_len. Points at the
	 * library's copy: valid until the lease is released. */
	const int32_t *indices;
};

/* size: sizeof(*out) (GROWING STRUCTS); kvp_info() passes it. */
int kvp_info_sz(struct kvp_client *c, uint64_t user, struct kvp_user_info *out,
		size_t size);
#define kvp_info(c, user, out) kvp_info_sz((c), (user), (out), KVP_ROW_SIZE_(out, struct kvp_user_info))
/* See DESIGN.md: start_pos must be start + len of the cached history. */
int kvp_prepare(struct kvp_client *c, uint64_t user, uint64_t start_pos,
		uint32_t n_new, struct kvp_lease *out);
/*
 * Data op, no round trip: write new tokens [first, first + n) of the lease
 * from kv ([n][layers][2][kv_heads][head_dim]) into their page slots.
 * Only l->id is read: the library keeps each granted lease's n_new and page
 * table itself. -ESTALE (message names the lease) when this client does not
 * hold the lease open: released, ended by the daemon, another client's,
 * committed, or a commit/release queued. -EINVAL when the range is outside
 * the lease's n_new.
 */
int kvp_append(struct kvp_client *c, const struct kvp_lease *l, uint32_t first,
	       uint32_t n, const void *kv);

/*
 * The data ops where the pool is on a GPU (cuda backend). kv is then device
 * memory; kvp_append() above enqueues on the legacy default stream and waits.
 *
 * kvp_append_async() enqueues the same copy on stream (a cudaStream_t; NULL:
 * the legacy default stream) and returns at once. Ordering with commit: the
 * library records an event on the stream after every async append of a
 * lease, and kvp_commit()/kvp_queue_commit() of that lease wait for those
 * events before the commit is sent, so tokens never become visible to other
 * processes before their bytes have landed. -EOPNOTSUPP on the shm backend
 * with a non-NULL stream.
 */
int kvp_append_async(struct kvp_client *c, const struct kvp_lease *l,
		     uint32_t first, uint32_t n, const void *kv, void *stream);
/* The same from per-layer buffers: k[layer] and v[layer] each hold
 * [n][kv_heads][head_dim] elements (layers pointers each, device memory on
 * cuda, host memory on shm). */
int kvp_append_layers_async(struct kvp_client *c, const struct kvp_lease *l,
			    uint32_t first, uint32_t n, const void *const *k,
			    const void *const *v, void *stream);

/*
 * One layer only: k and v each hold [n][kv_heads][head_dim] elements of
 * layer `layer` (device memory on cuda, host memory on shm), written into
 * the slots of new tokens [first, first + n). For models that produce K/V
 * layer by layer (HSTU, a transformers Cache): each layer lands as it is
 * computed, under the same lease checks and commit ordering as the other
 * appends. -EINVAL for a layer past the layout's.
 */
int kvp_append_layer_async(struct kvp_client *c, const struct kvp_lease *l,
			   uint32_t layer, uint32_t first, uint32_t n,
			   const void *k, const void *v, void *stream);

/* One lease's share of a batched append. A growing struct, read
 * (GROWING STRUCTS, input arrays). */
struct kvp_append_item {
	const struct kvp_lease *lease;
	uint32_t first;        /* first new token of the lease to write */
	uint32_t n;            /* tokens */
};
#define KVP_APPEND_ITEM_SIZE_VER0 16

/*
 * Many users in one launch: kv holds the items' tokens back to back, item
 * order, [sum n][layers][2][kv_heads][head_dim]. stream as above (NULL on
 * shm, where this is a CPU copy).
 */
int kvp_append_batch_async_sz(struct kvp_client *c,
			      const struct kvp_append_item *items, size_t size,
			      uint32_t count, const void *kv, void *stream);
#define kvp_append_batch_async(c, items, count, kv, stream) \
	kvp_append_batch_async_sz((c), (items), sizeof(*(items)), (count), (kv), \
				  (stream))
/* -ESTALE as for kvp_append (a lease commits once: its uncommitted slots
 * are given back, so a committed lease takes no writes either). */
int kvp_commit(struct kvp_client *c, uint64_t lease, uint32_t n);
int kvp_release(struct kvp_client *c, uint64_t lease);

/*
 * Group leases (tensor-parallel pools, kvpool.conf tp = N; kvp_lease_join(3)).
 * Rank 0 prepares (kvp_prepare; a rank > 0 gets -EINVAL) and hands the
 * lease id to the other ranks (torch.distributed, say); rank r > 0 joins
 * it: *out is as a prepare's (the same page table: frame indices valid in
 * every rank's pool), and the rank appends its own heads into its own
 * pool. Every rank commits the lease with the same n: kvp_commit returns
 * KVP_COMMIT_PENDING (1) until the last rank's, which returns 0 when the
 * history grows. A release by any rank before that (or the death of its
 * process) releases the lease for every rank and changes nothing; the
 * others' commits and joins then fail with -ESTALE saying which rank ended
 * it. Errors of join: -EINVAL not a tensor-parallel pool, rank 0, a sharing
 * lease other than a chunk fill lease; -ESTALE no such lease or released;
 * -EALREADY joined already.
 *
 * Chunk fills are group leases too: rank 0 registers or links the chunk
 * (ranks > 0 get -EINVAL), rank r > 0 joins reg.lease.id with
 * kvp_lease_join (the entry's page table; recorded as a fill lease), and
 * every rank seals it (kvp_chunk_seal with created = 1 and lease = the
 * joined one): KVP_COMMIT_PENDING until the last rank's, which makes it
 * ready. A release or death of a rank that has not sealed abandons the
 * chunk for all (-ESTALE to the others' seals). Reads (kvp_chunk_acquire,
 * kvp_compose) are each rank's own: the same frames in every rank's pool.
 *
 * Sequence writes are group leases too: rank 0 allocates, creates and
 * extends sequences (kvp_seq_alloc, kvp_seq_create, kvp_seq_extend by a
 * rank > 0: -EINVAL), rank r > 0 joins the write lease with
 * kvp_lease_join (the sequence's page table), and every rank commits it:
 * KVP_COMMIT_PENDING until the last rank's, which grows the sequence. A
 * release or death before that drops the new tokens for all (the sequence
 * keeps what it had committed; -ESTALE to the others' commits). Reads
 * (kvp_seq_info, kvp_seq_pages, kvp_seq_tokens, kvp_prefix_lookup) by any
 * rank name the same frames.
 */
#define KVP_COMMIT_PENDING 1
int kvp_lease_join(struct kvp_client *c, uint64_t lease, struct kvp_lease *out);
/* Returns pages copied to the host tier. */
int kvp_offload(struct kvp_client *c, uint64_t user);
/* Admin: every user of every tenant. */
int kvp_offload_all(struct kvp_client *c);
/* sel: enum kvp_tier_sel. Returns pages freed. */
int kvp_evict(struct kvp_client *c, uint64_t user, uint32_t sel);
/* Admin: every unleased user of every tenant. Returns users affected. */
int kvp_evict_all(struct kvp_client *c, uint32_t sel);
/* Any client: every unleased user of its own tenant (every pool of it),
 * seed 002's evict_kv_cache; leased users are skipped. Returns users
 * affected. -EPERM for a client without a tenant. */
int kvp_evict_tenant(struct kvp_client *c, uint32_t sel);
/* Move user's committed history from pool `from` to pool `to` of the
 * client's tenant (kvpoold --devices=0,1: from one GPU to another), in one
 * step ordered with the user's other operations: its device pages to fresh
 * device frames of `to` (a peer copy between GPUs), its host pages to its
 * host tier; then `from` has none. Returns the pages moved. -ENOENT no
 * history there, -EBUSY a lease holds it (commit or release first),
 * -EEXIST `to` has one, -ENOSPC `to` has no room (nothing changed in
 * `from`), -EINVAL the same pool or one the daemon does not serve. */
int kvp_move(struct kvp_client *c, uint64_t user, uint32_t from, uint32_t to);
/* Admin: kvpoold re-reads its settings as on SIGHUP (kvpoold(8), SIGNALS);
 * returns 0 once asked, before it has; its log says what changed and
 * which keys it refused. */
int kvp_reload(struct kvp_client *c);
/* The daemon's operation latencies (kvp_latency), by operation. */
enum kvp_lat_op {
	KVP_LAT_PREPARE = 0,  /* submission to completion, in the daemon */
	KVP_LAT_COMMIT = 1,
	KVP_LAT_OFFLOAD = 2,
	KVP_LAT_ONLOAD = 3,   /* a prepare's return to its copy's landing (cuda) */
	KVP_LAT_OPS = 4,
};
#define KVP_LAT_BUCKETS 19 /* 1 us .. 1 s, about three a decade, then the rest */

/* Histograms over every worker and tenant: since kvpoold started with
 * --metrics, else since the first kvp_latency() call turned them on. */
struct kvp_latency {
	uint64_t bucket_ns[KVP_LAT_BUCKETS]; /* upper bounds; the last UINT64_MAX */
	struct {
		uint64_t count;
		uint64_t sum_ns;
		uint64_t buckets[KVP_LAT_BUCKETS]; /* per bucket, not cumulative */
	} op[KVP_LAT_OPS];
	uint64_t reserved[8];                /* 0; room to grow */
};
/* Admin: fill *out (kvctl top's percentiles; kvpoold --metrics serves the
 * same histograms). */
int kvp_latency(struct kvp_client *c, struct kvp_latency *out);
/*
 * Where a ring prepare's time goes (issue 32): four histograms with
 * kvp_latency's buckets, over every worker, since timing was turned on
 * (kvpoold --metrics, or the first kvp_latency() or kvp_ring_phases()).
 * A sample is one ring entry that carries a prepare (a PREPARE, or a
 * batch with one) answered in the worker's pass that took it (one that
 * waited or onloaded is in kvp_latency's prepare and onload histograms):
 *   QUEUE    the client's kvp_submit() to the worker's taking the entry
 *            (to the latest submit before it, when several came between)
 *   EXECUTE  taken to executed: checks, locks, the engine
 *   PUBLISH  executed to its completion's publication (the rest of the
 *            worker's pass over that client's lane)
 *   WAKE     published to the client's kvp_reap() handing it back: its
 *            spin or sleep, and the wake-up
 * Growing struct (GROWING STRUCTS): kvp_ring_phases() is a macro for
 * kvp_ring_phases_sz().
 */
enum kvp_phase {
	KVP_PHASE_QUEUE = 0,
	KVP_PHASE_EXECUTE = 1,
	KVP_PHASE_PUBLISH = 2,
	KVP_PHASE_WAKE = 3,
	KVP_PHASES = 4,
};
struct kvp_ring_phases {
	uint64_t bucket_ns[KVP_LAT_BUCKETS]; /* upper bounds; the last UINT64_MAX */
	struct {
		uint64_t count;
		uint64_t sum_ns;
		uint64_t buckets[KVP_LAT_BUCKETS]; /* per bucket, not cumulative */
	} phase[KVP_PHASES];
};
#define KVP_RING_PHASES_SIZE_VER0 824
/* Admin: fill *out (size: sizeof(*out) as the caller was built). */
int kvp_ring_phases_sz(struct kvp_client *c, struct kvp_ring_phases *out,
		       size_t size);
#define kvp_ring_phases(c, out) \
	kvp_ring_phases_sz((c), (out), KVP_ROW_SIZE_(out, struct kvp_ring_phases))
/* all_tenants (admin): sum over every tenant; else the client's tenant. */
int kvp_stats(struct kvp_client *c, int all_tenants, struct kvp_stats *out);
/* kvp_stats of one pool (kvp_server_info: pools, pool_device) whichever
 * the client attached to: the client's tenant there, or with all_tenants
 * (admin) every tenant's. -EINVAL for a pool the daemon does not serve;
 * -EOPNOTSUPP from a kvpoold without KVP_SERVER_POOL_DEVICES. */
int kvp_stats_pool(struct kvp_client *c, int all_tenants, uint32_t pool,
		   struct kvp_stats *out);

/*
 * What kvpoold serves, as an operator asks before anything else (kvctl
 * stats prints it first, like Redis' INFO server): its version, how long it
 * has run, the backend and the layout every client must match, and which
 * tiers below the host tier it has. Filled whole; the reserved words are
 * 0 and later fields take them, so the size never changes.
 */
enum kvp_server_flag {
	KVP_SERVER_DISK = 1 << 0,   /* a disk tier (disk_dir) */
	KVP_SERVER_REMOTE = 1 << 1, /* a remote tier (--remote) */
	KVP_SERVER_ADMIN = 1 << 2,  /* the asking client is an admin: the
				     * paths and the store's address are filled */
	KVP_SERVER_POOL_DEVICES = 1 << 3, /* pool_device[] is filled, and
				     * kvp_stats_pool() answers per pool */
};
struct kvp_server_info {
	uint32_t version;           /* kvpoold's, as kvp_version(): major * 1000 + minor */
	uint32_t proto;             /* its wire protocol version */
	uint32_t pid;
	uint32_t flags;             /* enum kvp_server_flag */
	uint64_t started_ns;        /* CLOCK_REALTIME when it started */
	uint64_t uptime_ns;
	uint32_t workers;           /* ring worker threads */
	uint32_t shards;            /* shards per (tenant, pool) */
	uint32_t pools;             /* device pools (one per GPU; 1 on shm) */
	uint32_t tenants;
	uint64_t disk_size;         /* the disk tier's size, bytes (0: none) */
	uint32_t remote_nodes;      /* store nodes kvpoold knows */
	uint32_t remote_nodes_up;   /* of them, answering now */
	char backend[16];           /* "shm" or "cuda" */
	char layout[128];           /* what kvp_layout_format() writes */
	char disk_compress[16];     /* "none", "zstd:3", ... ("" without a disk tier) */
	char disk_dir[256];         /* admins only ("" for others, or none) */
	char remote[256];           /* the --remote URL: admins only */
	/* Pool p's device (p < pools, at most KVP_POOLS_MAX): its GPU ordinal
	 * in kvpoold on cuda, the `devices` entry on shm; only with
	 * KVP_SERVER_POOL_DEVICES in flags (an older kvpoold leaves 0). */
	int32_t pool_device[16];
	uint64_t reserved[8];
};
#define KVP_POOLS_MAX 16
int kvp_server_info(struct kvp_client *c, struct kvp_server_info *out);
/*
 * List users, max rows at a time from cursor (start with 0); *next is the
 * cursor for the next call, 0 when the list is done. Admins see every
 * tenant's users; others their tenant's. Returns rows written.
 */
int kvp_users_sz(struct kvp_client *c, uint64_t cursor,
		 struct kvp_user_info *rows, size_t size, uint32_t max,
		 uint64_t *next);
#define kvp_users(c, cursor, rows, max, next) \
	kvp_users_sz((c), (cursor), (rows), \
		     KVP_ROW_SIZE_(rows, struct kvp_user_info), (max), (next))

struct kvp_client_info {
	uint32_t client_id;
	uint32_t pid;
	uint32_t uid;
	uint32_t gid;
	uint32_t tenant;       /* UINT32_MAX: none (admin-only client) */
	uint32_t flags;        /* 1: admin */
	uint64_t ops;          /* operations completed */
	uint64_t leases;       /* leases held now */
	char name[32];
};
#define KVP_CLIENT_INFO_SIZE_VER0 72

/* Admin: list attached clients, like kvp_users. */
int kvp_clients_sz(struct kvp_client *c, uint64_t cursor,
		   struct kvp_client_info *rows, size_t size, uint32_t max,
		   uint64_t *next);
#define kvp_clients(c, cursor, rows, max, next) \
	kvp_clients_sz((c), (cursor), (rows), \
		       KVP_ROW_SIZE_(rows, struct kvp_client_info), (max), (next))

/* ------------------------------------------------------------------------ */
/* Client: asynchronous batches. Queue many operations (many users), submit  */
/* them with one wake-up, reap the completions. Operations on one user take  */
/* effect in queue order; completions of one user come back in queue order,  */
/* those of different users in any order (a prepare waiting on an onload    */
/* completes when its bytes have landed; other users' ops pass it).         */
/* At most sq_entries operations may be queued or unreaped at once (-EBUSY). */
/* ------------------------------------------------------------------------ */

enum kvp_async_op {
	KVP_ASYNC_INFO = 1,
	KVP_ASYNC_PREPARE = 2,
	KVP_ASYNC_COMMIT = 3,
	KVP_ASYNC_RELEASE = 4,
};

/* A growing struct; info, which grows too, is last (0.1 had it after op:
 * KVPOOL_0.1's kvp_reap writes that layout). */
struct kvp_completion {
	uint64_t tag;          /* the caller's */
	int32_t res;           /* >= 0 or -errno */
	uint32_t op;           /* enum kvp_async_op */
	struct kvp_lease lease;      /* PREPARE: its indices valid until released */
	const char *error;           /* on failure: the message; valid likewise */
	struct kvp_user_info info;   /* INFO */
};
#define KVP_COMPLETION_SIZE_VER0 120 /* 0.1: info after op */
#define KVP_COMPLETION_SIZE_VER1 136 /* 0.2: info last, 56 bytes */

int kvp_queue_info(struct kvp_client *c, uint64_t user, uint64_t tag);
int kvp_queue_prepare(struct kvp_client *c, uint64_t user, uint64_t start_pos,
		      uint32_t n_new, uint64_t tag);
/* release != 0: release the lease in the same operation. */
int kvp_queue_commit(struct kvp_client *c, uint64_t lease, uint32_t n,
		     int release, uint64_t tag);
int kvp_queue_release(struct kvp_client *c, uint64_t lease, uint64_t tag);
/* Publish everything queued; wakes the daemon only if it sleeps. Returns
 * how many operations were submitted. */
int kvp_submit(struct kvp_client *c);
/* Reap up to max completions, waiting until at least min_complete are there
 * (spin, then sleep). Returns how many were written to out. */
int kvp_reap_sz(struct kvp_client *c, struct kvp_completion *out, size_t size,
		uint32_t max, uint32_t min_complete);
#define kvp_reap(c, out, max, min_complete) \
	kvp_reap_sz((c), (out), KVP_ROW_SIZE_(out, struct kvp_completion), \
		    (max), (min_complete))
/*
 * The kvp_error_info (kvp_last_error_info() above) of a failed completion
 * kvp_reap() returned, while its error message is valid (until the next
 * kvp_queue_*() call). -EINVAL when cq->error is not such a message, for a
 * NULL out or a size below KVP_ERROR_INFO_SIZE_VER0.
 */
int kvp_completion_error_info_sz(const struct kvp_client *c,
				 const struct kvp_completion *cq,
				 struct kvp_error_info *out, size_t size);
#define kvp_completion_error_info(c, cq, out) \
	kvp_completion_error_info_sz((c), (cq), (out), \
				     KVP_ROW_SIZE_(out, struct kvp_error_info))

/* ------------------------------------------------------------------------ */
/* Sharing: prefix cache, chunks, sequences, compositions (DESIGN.md,        */
/* "Sharing"). Token ids are uint32; every hash is SHA-256 over the ids as    */
/* little-endian uint32, so every process and every restart computes the     */
/* same hashes. Hashes are salted per tenant (kvpool.conf hash_salt).         */
/* ------------------------------------------------------------------------ */

/*
 * Prefix cache. Page i of a token list has the chained hash
 *     h_i = SHA-256(h_{i-1} || salt || tokens[i*P, (i+1)*P))   (h_{-1} = 0^32)
 * Full pages only. Sequences made from token lists (kvp_seq_alloc) publish
 * their full pages when they commit; a page no sequence holds stays cached
 * in an evictable LRU (leaves of the hash chain first).
 */
struct kvp_prefix_hit {
	uint32_t tokens;       /* leading tokens cached, never all n (the last
				* token is left to compute): npages * page_tokens,
				* or n - 1 when the npages pages hold all n tokens
				* (n a multiple of page_tokens, seed 004) */
	uint32_t npages;       /* cached pages: tokens / page_tokens, or n /
				* page_tokens when tokens is n - 1 (then the last
				* page counts though its last token does not) */
	/* Device frames of those pages (arena; valid until the next call).
	 * NOT pinned: kvp_seq_alloc() is what holds them. */
	const int32_t *indices;
};

/* How many leading tokens of tokens[0, n) are cached. Pins nothing. */
int kvp_prefix_lookup(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
		      struct kvp_prefix_hit *out);

/*
 * Sequences: request-scoped page lists (seed 004 allocate/free) and virtual
 * sequences (seed 000), keyed by a caller-chosen id unique in the tenant.
 * A sequence belongs to the client that made it and is freed when that
 * client detaches. Its pages are pinned while it lives.
 *
 * kvp_seq_alloc: the leading full pages of tokens found in the prefix cache
 * are shared (refcount), pages are allocated for the rest; the lease says
 * len = cached tokens and n_new = n - cached. When all n tokens are cached
 * (seed 004), len = n - 1 and n_new = 1: the pages before the last are
 * shared and the last is a private copy of the cached one (copy on write),
 * its slot n - 1 left to compute. Write the n_new tokens with kvp_append*()
 * and kvp_commit(lease.id, k) them (k <= n_new), which publishes the pages
 * they fill. kvp_release(lease.id) ends the write lease (uncommitted slots
 * are given back) but not the sequence: kvp_seq_free() does that.
 */
int kvp_seq_alloc(struct kvp_client *c, uint64_t seq, const uint32_t *tokens,
		  uint32_t n, struct kvp_lease *out);

enum kvp_src_kind {
	KVP_SRC_USER = 1,  /* the first `tokens` committed tokens of a user history
			    * (0: all of them); the history is pinned meanwhile */
	KVP_SRC_CHUNK = 2, /* a ready chunk entry (or a name: its root), all of
			    * its tokens */
	KVP_SRC_SEQ = 3,   /* the committed tokens of another sequence */
};

#define KVP_CHUNK_ID_BYTES 32

struct kvp_chunk_id {
	uint8_t b[KVP_CHUNK_ID_BYTES]; /* SHA-256: shown as 64 hex digits */
};

/* A growing struct, read (GROWING STRUCTS, input arrays). */
struct kvp_seq_src {
	uint32_t kind;         /* enum kvp_src_kind */
	uint32_t rsv;          /* zero */
	uint64_t id;           /* USER: user id; SEQ: sequence id */
	uint64_t tokens;       /* USER: leading tokens to take (0: all) */
	struct kvp_chunk_id chunk; /* CHUNK */
};
#define KVP_SEQ_SRC_SIZE_VER0 56

/*
 * A virtual sequence: the pages of the sources, in order, shared by
 * refcount, plus n_new tokens of its own (pages allocated only for those).
 * Every source but the last must end on a page boundary (a page table has
 * one partial page, the last): -EINVAL names the one that does not. When
 * the last source ends mid-page and n_new > 0, that page is copied on write
 * (the source keeps its bytes). The lease: len = source tokens, n_new.
 */
int kvp_seq_create_sz(struct kvp_client *c, uint64_t seq,
		      const struct kvp_seq_src *src, size_t size, uint32_t nsrc,
		      uint32_t n_new, struct kvp_lease *out);
#define kvp_seq_create(c, seq, src, nsrc, n_new, out) \
	kvp_seq_create_sz((c), (seq), (src), sizeof(*(src)), (nsrc), (n_new), (out))
/*
 * Grow a sequence by n_new tokens (decode): a new write lease as above.
 * tokens (n_new ids, or NULL) keep the sequence's pages publishable in the
 * prefix cache; without them it stops publishing. -EBUSY while its previous
 * write lease has not committed; a committed one still held ends with the
 * extend (its handle and page table go).
 */
int kvp_seq_extend(struct kvp_client *c, uint64_t seq, uint32_t n_new,
		   const uint32_t *tokens, struct kvp_lease *out);
/* Drop the sequence's references; pages no one else holds are freed (or stay
 * in the prefix cache when published). -EBUSY while its write lease is held
 * (committed or not): kvp_release() it first. */
int kvp_seq_free(struct kvp_client *c, uint64_t seq);

/*
 * A sequence's state (seed 004's GetRequest / NumComputedTokens /
 * GetComputedBlocks). Any client of the tenant may read any of its
 * sequences. A growing struct (GROWING STRUCTS above).
 */
enum kvp_seq_flag {
	KVP_SEQ_TOKEN_IDS = 1 << 0, /* kvpoold has its token ids (kvp_seq_tokens):
				     * made by kvp_seq_alloc and extended with
				     * ids; such a sequence publishes its pages */
	KVP_SEQ_CACHING = 1 << 1,   /* the tenant's prefix_caching is on */
};
struct kvp_seq_info {
	uint64_t seq;
	uint64_t tokens;         /* computed + n_new: the tokens it has room for */
	uint64_t computed;       /* committed tokens (NumComputedTokens) */
	uint64_t cached;         /* of them, not computed by it: kvp_seq_alloc's
				  * prefix hit (the lease's len), or
				  * kvp_seq_create's source tokens */
	uint64_t write_lease;    /* its open write lease, 0: none */
	uint32_t n_new;          /* reserved by that lease, not committed */
	uint32_t npages;         /* page table entries (kvp_seq_pages) */
	uint32_t computed_pages; /* leading pages full of committed tokens:
				  * computed / page_tokens (GetComputedBlocks) */
	uint32_t published;      /* leading pages in the prefix cache */
	uint32_t borrowed;       /* pages read from a history's or a chunk's */
	uint32_t owner;          /* the client id that made it (and may change it) */
	uint32_t flags;          /* enum kvp_seq_flag */
	uint32_t ntoken_ids;     /* token ids kvpoold holds: tokens with
				  * KVP_SEQ_TOKEN_IDS, else 0 */
};
#define KVP_SEQ_INFO_SIZE_VER0 72

/* -ENOENT: no such sequence (freed, or its client detached). */
int kvp_seq_info_sz(struct kvp_client *c, uint64_t seq,
		    struct kvp_seq_info *out, size_t size);
#define kvp_seq_info(c, seq, out) \
	kvp_seq_info_sz((c), (seq), (out), KVP_ROW_SIZE_(out, struct kvp_seq_info))
/*
 * Its page table (device frames, FlashInfer's kv_indices) into
 * frames[0, max); returns npages (more than max: only max were written).
 * Pages [0, computed_pages) hold committed tokens only; a page past them
 * is the one the write lease writes into.
 */
int kvp_seq_pages(struct kvp_client *c, uint64_t seq, int32_t *frames,
		  uint32_t max);
/* Its token ids into buf[0, cap); *n gets ntoken_ids (more than cap: only
 * cap were written). Returns how many were written. */
int kvp_seq_tokens(struct kvp_client *c, uint64_t seq, uint32_t *buf,
		   uint32_t cap, uint32_t *n);

/*
 * Chunks (seed 001). A chunk's KV depends on every token before it and on
 * its positions, so a chunk is kept as ENTRIES under a NAME:
 *
 *   name   what the registrant calls the chunk (seed 001's chunk_id):
 *          SHA-256 of its content bytes, or with no content of its tokens as
 *          LE uint32. One record per name and tenant: type, token ids,
 *          content (bounded by kvpoold's chunk_content_max), a JSON object of
 *          metadata, access statistics. It lives while it has entries.
 *   entry  the KV of the name's tokens at one place: at position 0 (a root)
 *          or right after a parent entry (a link),
 *              id    = SHA-256(layout spec || salt || parent id (0^32 for a
 *                      root) || tokens as LE uint32)
 *              start = parent.start + parent.tokens (0 for a root).
 *          Entries have the pages, the states (FILLING, READY), the holders
 *          and the fill lease; the same tokens under another parent are
 *          another entry with other pages.
 *
 * Register a root with kvp_chunk_put(), then a link per parent with
 * kvp_chunk_link(); fill what was created (created = 1) at positions
 * start .. start + tokens - 1 and kvp_chunk_seal() it. Deleting a name or an
 * entry deletes every entry below it (unusable without its ancestor).
 *
 * Limits per tenant (kvpool.conf max_chunks, chunk_memory_ratio;
 * kvp_chunk_limits()): creating an entry or a name evicts unheld READY
 * entries, least recently used first and leaves first, until they fit;
 * -ENOMEM names the limit and what is held when they cannot.
 */
enum kvp_chunk_type {
	KVP_CHUNK_SYSTEM = 1,  /* "system": a system prompt (cascade level 0) */
	KVP_CHUNK_CONTEXT = 2, /* "context": documents, history, examples */
	KVP_CHUNK_QUERY = 3,   /* "query": the request itself (the last level) */
};

enum kvp_chunk_state {
	KVP_CHUNK_FILLING = 1, /* registered; its filler is writing the pages */
	KVP_CHUNK_READY = 2,   /* sealed: immutable, readable by everyone */
};

/* Metadata: a JSON object as text (its NUL included, at most this many
 * bytes once kvpoold wrote it compactly with sorted keys). The library also
 * takes the old "key=value,key2=value2" and sends {"key":"value",...}. */
#define KVP_CHUNK_META_MAX 2048
/* The first bytes of a name's content in a kvp_chunk_info, NUL-terminated,
 * cut on a UTF-8 character boundary. */
#define KVP_CHUNK_PREVIEW_MAX 64

const char *kvp_chunk_type_name(uint32_t type); /* NULL when unknown */
int kvp_chunk_type_parse(const char *name);     /* enum, or -EINVAL */
/* 64 lowercase hex digits and a NUL into hex[65]. */
void kvp_chunk_id_format(const struct kvp_chunk_id *id, char hex[65]);
/* Exactly 64 hex digits; -EINVAL otherwise. */
int kvp_chunk_id_parse(struct kvp_chunk_id *id, const char *hex);

/* One row per NAME. */
struct kvp_chunk_info {
	struct kvp_chunk_id id;  /* the name */
	struct kvp_chunk_id root; /* its root entry (all zero: none) */
	uint32_t type;           /* enum kvp_chunk_type */
	uint32_t state;          /* the root entry's (READY when it has none) */
	uint32_t tokens;
	uint32_t pages;          /* over all of its entries */
	uint64_t bytes;          /* pages * page_bytes */
	uint32_t holders;        /* leases, sequences and compositions holding
				  * its entries, summed */
	uint32_t entries;        /* its live entries (root and links) */
	uint32_t filler;         /* the root FILLING: the client id writing it */
	uint32_t content_len;    /* bytes of content (kvp_chunk_content) */
	uint64_t created_ns;     /* CLOCK_REALTIME */
	uint64_t last_access_ns;
	uint64_t hits;           /* registers that found it, acquires, compositions */
	char preview[KVP_CHUNK_PREVIEW_MAX]; /* content's first bytes */
	char meta[KVP_CHUNK_META_MAX]; /* JSON object text ("" none) */
};
#define KVP_CHUNK_INFO_SIZE_VER0 2240

/* One entry. */
struct kvp_chunk_entry_info {
	struct kvp_chunk_id id;
	struct kvp_chunk_id name;
	struct kvp_chunk_id parent; /* all zero for a root */
	uint32_t start;          /* position of its first token */
	uint32_t tokens;
	uint32_t pages;
	uint32_t state;          /* enum kvp_chunk_state */
	uint32_t holders;        /* as kvp_chunk_info's, this entry's */
	uint32_t children;       /* live entries whose parent it is */
};
#define KVP_CHUNK_ENTRY_INFO_SIZE_VER0 120

struct kvp_chunk_reg {
	struct kvp_chunk_id id;  /* the entry */
	struct kvp_chunk_id name;
	int created;             /* 1: this call made the entry; fill it, seal */
	uint32_t state;          /* enum kvp_chunk_state */
	uint32_t start;          /* position of the entry's first token */
	uint32_t tokens;
	/* created: the write lease (len 0, n_new = tokens, start = start): write
	 * with kvp_append*(), then kvp_chunk_seal(). Otherwise zero. */
	struct kvp_lease lease;
};

/* A root registration (kvp_chunk_put). */
struct kvp_chunk_root {
	const uint32_t *tokens;
	uint32_t n;
	uint32_t type;           /* enum kvp_chunk_type */
	const void *content;     /* NULL: none; the name is then the tokens' hash */
	uint32_t content_len;
	const char *meta;        /* JSON object, "k=v,..." or NULL */
};

struct kvp_chunk_limits {
	uint64_t max_chunks;     /* names the tenant may have (0: unlimited) */
	uint64_t config_max_chunks; /* kvpool.conf's: the ceiling */
	double memory_ratio;     /* chunk pages <= ratio * device frames */
	double config_memory_ratio;
	uint64_t names;          /* now */
	uint64_t pages;          /* chunk entry pages now (deleted but held too) */
	uint64_t limit_pages;    /* memory_ratio * device frames */
};

/*
 * Register a root entry: tokens at positions 0 .. n - 1, of type, named by
 * the content's hash (or the tokens' when content is NULL), with metadata.
 * The same tokens give the same entry: a hit (created = 0, nothing
 * allocated, the name's access count goes up; metadata given on a hit is
 * merged into the name's). The same name with other tokens or another
 * type is -EINVAL (delete it first). -E2BIG content over chunk_content_max
 * or more pages than the device tier; -ENOMEM the limits or the device tier
 * cannot take it even after eviction.
 */
int kvp_chunk_put(struct kvp_client *c, const struct kvp_chunk_root *root,
		  struct kvp_chunk_reg *out);
/* kvp_chunk_put() without content. */
int kvp_chunk_register(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
		       uint32_t type, const char *meta, struct kvp_chunk_reg *out);
/*
 * Register the name's tokens after entry parent (a link): a hit, or a new
 * entry FILLING at start = parent.start + parent.tokens with a fill lease
 * (the parent is pinned until the seal or the abort). A parent still being
 * filled: waits up to wait_ms for its seal, then -EAGAIN. -ENOENT: the name
 * or the parent is not registered.
 */
int kvp_chunk_link(struct kvp_client *c, const struct kvp_chunk_id *name,
		   const struct kvp_chunk_id *parent, uint32_t wait_ms,
		   struct kvp_chunk_reg *out);
/* The filler's: waits for the lease's GPU appends, makes the entry ready
 * and ends the write lease. A filler that detaches unsealed deletes it.
 * In a tensor-parallel pool every rank seals (kvp_lease_join above):
 * KVP_COMMIT_PENDING (1) until the last rank's. */
int kvp_chunk_seal(struct kvp_client *c, const struct kvp_chunk_reg *reg);
/*
 * A read lease on a ready entry (id: an entry id, or a name for its root
 * entry): its page table (len = tokens, n_new = 0, start), pinned until
 * kvp_release(out->id). An entry being filled: waits up to wait_ms for the
 * seal, then -EAGAIN "not ready". -ENOENT: not registered (or evicted, or
 * deleted).
 */
int kvp_chunk_acquire(struct kvp_client *c, const struct kvp_chunk_id *id,
		      uint32_t wait_ms, struct kvp_lease *out);
/* A name's row (id: the name, or one of its entries). */
int kvp_chunk_get_sz(struct kvp_client *c, const struct kvp_chunk_id *id,
		     struct kvp_chunk_info *out, size_t size);
#define kvp_chunk_get(c, id, out) kvp_chunk_get_sz((c), (id), (out), \
			 KVP_ROW_SIZE_(out, struct kvp_chunk_info))
/* One entry. */
int kvp_chunk_entry_sz(struct kvp_client *c, const struct kvp_chunk_id *id,
		       struct kvp_chunk_entry_info *out, size_t size);
#define kvp_chunk_entry(c, id, out) \
	kvp_chunk_entry_sz((c), (id), (out), \
			   KVP_ROW_SIZE_(out, struct kvp_chunk_entry_info))
/* A name's entries into rows[0, max); returns how many it has (more than
 * max: call again with more room). */
int kvp_chunk_entries_sz(struct kvp_client *c, const struct kvp_chunk_id *name,
			 struct kvp_chunk_entry_info *rows, size_t size,
			 uint32_t max);
#define kvp_chunk_entries(c, name, rows, max) \
	kvp_chunk_entries_sz((c), (name), (rows), \
			     KVP_ROW_SIZE_(rows, struct kvp_chunk_entry_info), (max))
/* The content of a name into buf[0, cap); *len gets its whole length
 * (larger than cap: only cap bytes were written). Returns bytes written. */
int kvp_chunk_content(struct kvp_client *c, const struct kvp_chunk_id *name,
		      void *buf, size_t cap, size_t *len);
/* The token ids of a name, the same way. */
int kvp_chunk_tokens(struct kvp_client *c, const struct kvp_chunk_id *name,
		     uint32_t *buf, uint32_t cap, uint32_t *n);
/*
 * List names of type (0: all) whose metadata holds every key of filter with
 * an equal value (a JSON object, or "k=v,k2=v2" for string values; NULL or
 * "": no filter), in ascending name order, those greater than *after (NULL:
 * from the first). Returns rows written; *more is 1 when more rows follow
 * the last one (list again with after = its id).
 */
int kvp_chunk_list_sz(struct kvp_client *c, uint32_t type, const char *filter,
		      const struct kvp_chunk_id *after,
		      struct kvp_chunk_info *rows, size_t size, uint32_t max,
		      int *more);
#define kvp_chunk_list(c, type, filter, after, rows, max, more) \
	kvp_chunk_list_sz((c), (type), (filter), (after), (rows), \
			  KVP_ROW_SIZE_(rows, struct kvp_chunk_info), (max), (more))
/* Delete a name (every entry of it) or one entry, and every entry below
 * them; returns entries deleted. Their pages are freed once no one holds
 * them (a leased entry stays readable until released). */
int kvp_chunk_delete(struct kvp_client *c, const struct kvp_chunk_id *id);
/* Delete every name of type (0: all); returns how many. */
int kvp_chunk_clear(struct kvp_client *c, uint32_t type);
/* Delete names not accessed for max_age_s seconds whose entries (and the
 * entries below them) are ready and unheld; returns how many. */
int kvp_chunk_evict_unused(struct kvp_client *c, uint32_t max_age_s);
/* Copy chunk id (an entry, or a name for its root entry) from pool `from`
 * to pool `to` of the client's tenant, for a group that runs on `to`'s
 * GPUs: the entry and every entry it hangs under that `to` lacks are
 * registered there under the same ids with their pages copied (a peer
 * copy between GPUs) and sealed; `from` keeps them. Returns the pages
 * copied (0: `to` had them all). -ENOENT `from` does not hold it (or a
 * linked entry's name has no ready root there), -EAGAIN an entry of the
 * chain is being filled, -EINVAL the same pool or one the daemon does not
 * serve, -ENOMEM / -ENOSPC no room in `to`. Entries copied before an
 * error stay, each whole. */
int kvp_chunk_copy(struct kvp_client *c, const struct kvp_chunk_id *id,
		   uint32_t from, uint32_t to);
/*
 * Set the tenant's chunk limits in the client's pool, clamped to the
 * configured ones (max_chunks < 0, memory_ratio < 0: keep), and read them
 * with the usage into *out (may be NULL). Lowering them evicts nothing at
 * once; the next creation does.
 */
int kvp_chunk_limits(struct kvp_client *c, int64_t max_chunks,
		     double memory_ratio, struct kvp_chunk_limits *out);

/*
 * Compositions (seeds 001/003): cascade page tables for FlashInfer's
 * MultiLevelCascadeAttentionWrapper. A request is a chain of ENTRY ids: a
 * system root, contexts each linked after the one before it (the first
 * after the system), and a query linked after the last context (or the
 * system). Level 0 holds the system entries, levels 1..C the k-th context
 * (C = most contexts in the batch), level C+1 the queries. At every level
 * consecutive requests with the same entry form one group (put requests
 * sharing a prefix next to each other): a system or a context shared by
 * several requests is one cascade node. A request with fewer than k
 * contexts has an empty group at level k (kv_indptr unchanged,
 * last_page_len 0). (Contexts get a level each because a page table row may
 * end mid-page only at its last page.) qo_indptr counts qo_len query rows
 * per request.
 */
#define KVP_COMPOSE_MAX_CONTEXTS 64
#define KVP_COMPOSE_MAX_LEVELS (KVP_COMPOSE_MAX_CONTEXTS + 2)
#define KVP_COMPOSE_MAX_REQUESTS 1024

/* A growing struct, read (GROWING STRUCTS, input arrays). */
struct kvp_compose_req {
	struct kvp_chunk_id system;
	const struct kvp_chunk_id *contexts;
	uint32_t ncontexts;
	uint32_t qo_len;         /* query rows of this request (0: 1) */
	struct kvp_chunk_id query;
};
#define KVP_COMPOSE_REQ_SIZE_VER0 80

struct kvp_cascade_level {
	uint32_t ngroups;
	const int32_t *qo_indptr;        /* [ngroups + 1] */
	const int32_t *kv_indptr;        /* [ngroups + 1] */
	const int32_t *kv_indices;       /* [kv_indptr[ngroups]] */
	const int32_t *kv_last_page_len; /* [ngroups] */
};

struct kvp_composition {
	uint64_t lease;          /* holds every chunk: kvp_release() it (0: preview) */
	uint32_t nlevels;
	uint32_t nrequests;
	uint64_t tokens;         /* KV tokens attended, summed over requests */
	uint64_t pages;          /* distinct pages referenced */
	uint64_t bytes;          /* their bytes */
	struct kvp_cascade_level level[KVP_COMPOSE_MAX_LEVELS]; /* arena */
};

/*
 * Build the cascade for nreq requests and hold their entries (they are not
 * evicted or freed) until kvp_release(out->lease). Errors (nothing held):
 * -ENOENT an entry not found (named), -EAGAIN an entry not ready,
 * -EINVAL a broken chain (named with its actual parent) or a wrong type (a
 * system that is not a system root, a context that is not a context, a
 * query that is not a query), too many contexts or requests.
 */
int kvp_compose_sz(struct kvp_client *c, const struct kvp_compose_req *reqs,
		   size_t size, uint32_t nreq, struct kvp_composition *out);
#define kvp_compose(c, reqs, nreq, out) \
	kvp_compose_sz((c), (reqs), sizeof(*(reqs)), (nreq), (out))
/* The same without holding anything (out->lease = 0): tokens, levels, bytes. */
int kvp_compose_preview_sz(struct kvp_client *c,
			   const struct kvp_compose_req *reqs, size_t size,
			   uint32_t nreq, struct kvp_composition *out);
#define kvp_compose_preview(c, reqs, nreq, out) \
	kvp_compose_preview_sz((c), (reqs), sizeof(*(reqs)), (nreq), (out))

/*
 * The KVPOOL_0.1 entry points of the calls above (GROWING STRUCTS): they
 * write release 0.1's layouts (..._SIZE_VER0) for programs built against
 * it. The parentheses keep the macros of the same names out; new code
 * calls the macros.
 */
int (kvp_info)(struct kvp_client *c, uint64_t user, struct kvp_user_info *out);
int (kvp_users)(struct kvp_client *c, uint64_t cursor,
		struct kvp_user_info *rows, uint32_t max, uint64_t *next);
int (kvp_clients)(struct kvp_client *c, uint64_t cursor,
		  struct kvp_client_info *rows, uint32_t max, uint64_t *next);
int (kvp_reap)(struct kvp_client *c, struct kvp_completion *out, uint32_t max,
	       uint32_t min_complete);
int (kvp_chunk_get)(struct kvp_client *c, const struct kvp_chunk_id *id,
		    struct kvp_chunk_info *out);
int (kvp_chunk_entry)(struct kvp_client *c, const struct kvp_chunk_id *id,
		      struct kvp_chunk_entry_info *out);
int (kvp_chunk_entries)(struct kvp_client *c, const struct kvp_chunk_id *name,
			struct kvp_chunk_entry_info *rows, uint32_t max);
int (kvp_chunk_list)(struct kvp_client *c, uint32_t type, const char *filter,
		     const struct kvp_chunk_id *after,
		     struct kvp_chunk_info *rows, uint32_t max, int *more);
int (kvp_append_batch_async)(struct kvp_client *c,
			     const struct kvp_append_item *items, uint32_t count,
			     const void *kv, void *stream);
int (kvp_seq_create)(struct kvp_client *c, uint64_t seq,
		     const struct kvp_seq_src *src, uint32_t nsrc, uint32_t n_new,
		     struct kvp_lease *out);
int (kvp_compose)(struct kvp_client *c, const struct kvp_compose_req *reqs,
		  uint32_t nreq, struct kvp_composition *out);
int (kvp_compose_preview)(struct kvp_client *c,
			  const struct kvp_compose_req *reqs, uint32_t nreq,
			  struct kvp_composition *out);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_H */
