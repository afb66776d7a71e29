/* SPDX-License-Identifier: MIT */
/*
 * kvpool.h - the public API of libkvpool, the client library of kvpoold.
 *
 * This is the only installed header. Everything here is prefixed kvp_ / KVP_
 * and every function returns 0 (or a count) on success and -errno on failure;
 * no function sets errno. Functions that can fail for a reason the caller can
 * act on also write a message naming what was wrong into the buffer they are
 * given (or, for connected calls, the client's last-error buffer).
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
	KVP_SEL_ALL = KVP_SEL_DEVICE | KVP_SEL_HOST,
};

const char *kvp_tier_name(uint32_t tier);

struct kvp_tier_stats {
	uint64_t frames_total;
	uint64_t frames_used;
	uint64_t frames_free;
	uint64_t bytes_total;
};

/* Counters of one pool. All monotonic except the gauges marked so. */
struct kvp_stats {
	struct kvp_tier_stats tier[KVP_TIERS]; /* gauges */
	uint64_t users;           /* gauge: user histories holding tokens or leases */
	uint64_t leases;          /* gauge: leases not yet released */
	uint64_t prepares;
	uint64_t commits;
	uint64_t releases;
	uint64_t hit_tokens;      /* cached tokens a prepare reused instead of recompute */
	uint64_t committed_tokens;
	uint64_t evicted_users;   /* histories dropped (data lost) */
	uint64_t evicted_pages;
	uint64_t demoted_users;   /* histories moved device -> host under pressure or by evict */
	uint64_t demoted_pages;
	uint64_t offloaded_pages; /* device -> host copies made by offload */
	uint64_t onloaded_pages;  /* host -> device copies made by prepare */
	uint64_t trimmed_pages;   /* head pages dropped by max_tokens_per_user */
	uint64_t bytes_d2h;
	uint64_t bytes_h2d;
	uint64_t clients;         /* gauge: attached clients (daemon only) */
	uint64_t tenants;         /* gauge: tenants summed over (daemon only) */
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
 * CPU append: write K and V of n tokens, all layers, into their slots of the
 * device tier mapped at tier_base. kv is the caller's contiguous buffer
 * [n][layers][2][kv_heads][head_dim] of layout elements. The slots must come
 * from a lease (they are not checked here: this is the data path).
 */
void kvp_append_cpu(const struct kvp_layout *l, void *tier_base,
		    const struct kvp_slot *slots, uint32_t n, const void *kv);

/*
 * CPU read-back of n tokens from their slots into out, in the same
 * [n][layers][2][kv_heads][head_dim] order kvp_append_cpu() reads.
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
const struct kvp_layout *kvp_client_layout(const struct kvp_client *c);
/* The device tier as mapped in this process: a host pointer on the shm
 * backend, a CUDA device pointer (valid on kvp_cuda_device()) on cuda. */
void *kvp_device_base(const struct kvp_client *c);
/* The CUDA device ordinal the pool lives on, or -1 on the shm backend. */
int kvp_cuda_device(const struct kvp_client *c);
uint32_t kvp_client_id(const struct kvp_client *c);
/* 1 when the daemon granted admin rights (kvctl evict --all, ...). */
int kvp_client_is_admin(const struct kvp_client *c);

/* ------------------------------------------------------------------------ */
/* Client: synchronous calls. Each returns >= 0 or -errno; on failure         */
/* kvp_last_error() says what was wrong. They return -EBUSY while            */
/* asynchronous operations are in flight (reap them first).                   */
/* ------------------------------------------------------------------------ */

struct kvp_user_info {
	uint64_t user;
	uint64_t start;        /* first cached token position */
	uint64_t len;          /* committed tokens cached (0: nothing cached) */
	uint32_t pages_device;
	uint32_t pages_host;
	uint32_t leases;
	uint32_t tenant;       /* tenant index (for admins listing all) */
};

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
	 * {0, npages} and kv_last_page_len last_page_len. Points into the
	 * client's arena: valid until the next call (sync) or submit (async). */
	const int32_t *indices;
};

int kvp_info(struct kvp_client *c, uint64_t user, struct kvp_user_info *out);
/* See DESIGN.md: start_pos must be start + len of the cached history. */
int kvp_prepare(struct kvp_client *c, uint64_t user, uint64_t start_pos,
		uint32_t n_new, struct kvp_lease *out);
/*
 * Data op, no round trip: write new tokens [first, first + n) of the lease
 * from kv ([n][layers][2][kv_heads][head_dim]) into their page slots.
 * -EINVAL when the range is outside the lease's n_new.
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

/* One lease's share of a batched append. */
struct kvp_append_item {
	const struct kvp_lease *lease;
	uint32_t first;        /* first new token of the lease to write */
	uint32_t n;            /* tokens */
};

/*
 * Many users in one launch: kv holds the items' tokens back to back, item
 * order, [sum n][layers][2][kv_heads][head_dim]. stream as above (NULL on
 * shm, where this is a CPU copy).
 */
int kvp_append_batch_async(struct kvp_client *c,
			   const struct kvp_append_item *items, uint32_t count,
			   const void *kv, void *stream);
int kvp_commit(struct kvp_client *c, uint64_t lease, uint32_t n);
int kvp_release(struct kvp_client *c, uint64_t lease);
/* Returns pages copied to the host tier. */
int kvp_offload(struct kvp_client *c, uint64_t user);
/* Admin: every user of every tenant. */
int kvp_offload_all(struct kvp_client *c);
/* sel: enum kvp_tier_sel. Returns pages freed. */
int kvp_evict(struct kvp_client *c, uint64_t user, uint32_t sel);
/* Admin: every unleased user of every tenant. Returns users affected. */
int kvp_evict_all(struct kvp_client *c, uint32_t sel);
/* all_tenants (admin): sum over every tenant; else the client's tenant. */
int kvp_stats(struct kvp_client *c, int all_tenants, struct kvp_stats *out);
/*
 * List users, max rows at a time from cursor (start with 0); *next is the
 * cursor for the next call, 0 when the list is done. Admins see every
 * tenant's users; others their tenant's. Returns rows written.
 */
int kvp_users(struct kvp_client *c, uint64_t cursor, struct kvp_user_info *rows,
	      uint32_t max, uint64_t *next);

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

/* Admin: list attached clients, like kvp_users. */
int kvp_clients(struct kvp_client *c, uint64_t cursor,
		struct kvp_client_info *rows, uint32_t max, uint64_t *next);

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

struct kvp_completion {
	uint64_t tag;          /* the caller's */
	int32_t res;           /* >= 0 or -errno */
	uint32_t op;           /* enum kvp_async_op */
	struct kvp_user_info info;   /* INFO */
	struct kvp_lease lease;      /* PREPARE: valid until the next kvp_submit */
	const char *error;           /* on failure: the message; valid likewise */
};

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
int kvp_reap(struct kvp_client *c, struct kvp_completion *out, uint32_t max,
	     uint32_t min_complete);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_H */
