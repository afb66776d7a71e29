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

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_H */
