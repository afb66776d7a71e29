/* SPDX-License-Identifier: MIT */
/*
 * prefix_bench.h - what the parts of `kvbench prefix` share.
 *
 *   bench_prefix.c         options, the two runs, the report (table / JSON)
 *   bench_prefix_run.c     replays a trace against a target, one driver for
 *                          both targets: seq_alloc/append/commit/extend/free
 *                          for multi-turn, register/fill/seal/compose/release
 *                          for chunk requests, then the compose-latency loop
 *   bench_prefix_engine.c  the "inproc" target: the engine, share_* called
 *                          directly (no IPC)
 *   bench_prefix_client.c  the "kvpoold" target: a private kvpoold and the
 *                          client library (kvp_seq_alloc, kvp_compose, ...)
 *   bench_prefix_gpu.c     `--gpu`: recompute with cuBLAS vs a cache hit
 *   prefix_workload.[ch]   the traces, their best hit rates (unbounded
 *                          cache) and Belady's MIN for a pool's size
 *
 * A target is a table of operations over an opaque context; the driver
 * times each call with the wall clock around it, so both targets are
 * measured the same way.
 */
#ifndef KVBENCH_PREFIX_BENCH_H
#define KVBENCH_PREFIX_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbench.h"
#include "kvpool.h"
#include "prefix_workload.h"
#include "stats.h"

#define PREFIX_DEFAULT_LAYOUT \
	"layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"

/* ------------------------------------------------------------ target */

/* A write or read lease as the driver sees it (engine or client). */
struct pb_lease {
	uint64_t id;
	uint64_t len;            /* tokens already there (cached / committed) */
	uint32_t n_new;
	uint32_t npages;
	const uint32_t *frames;  /* device frame of each page; valid until the next call */
	struct kvp_lease klease; /* the client's lease (kvpoold target) */
};

struct pb_chunk_reg {
	struct kvp_chunk_id id;  /* the entry */
	struct kvp_chunk_id name;
	bool created;
	struct pb_lease lease;   /* created: the fill lease */
	/* What the target needs back at seal (the client's kvp_chunk_reg). */
	struct kvp_chunk_reg creg;
};

struct pb_comp {
	uint64_t lease;
	uint32_t nlevels;
	uint64_t tokens;
	uint64_t pages;
	uint32_t ngroups[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *kv_indptr[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *kv_indices[KVP_COMPOSE_MAX_LEVELS];
	const int32_t *kv_last_page_len[KVP_COMPOSE_MAX_LEVELS];
};

struct pb_target {
	const char *name;        /* "inproc", "kvpoold" */
	void *ctx;
	const struct kvp_layout *layout;
	void *tier_base;         /* the device tier, host-visible (shm) */
	int (*seq_alloc)(void *ctx, uint64_t seq, const uint32_t *tokens, uint32_t n,
			 struct pb_lease *out);
	int (*seq_extend)(void *ctx, uint64_t seq, const uint32_t *tokens, uint32_t n,
			  struct pb_lease *out);
	int (*seq_free)(void *ctx, uint64_t seq);
	/* Write new tokens [0, n) of the lease from kv ([n][token_bytes]). */
	int (*append)(void *ctx, const struct pb_lease *l, uint32_t n, const void *kv);
	int (*commit)(void *ctx, uint64_t lease, uint32_t n);
	int (*release)(void *ctx, uint64_t lease);
	int (*chunk_register)(void *ctx, const uint32_t *tokens, uint32_t n,
			      uint32_t type, const char *meta, struct pb_chunk_reg *out);
	/* The name's tokens after entry parent (kvp_chunk_link). */
	int (*chunk_link)(void *ctx, const struct kvp_chunk_id *name,
			  const struct kvp_chunk_id *parent, struct pb_chunk_reg *out);
	int (*chunk_seal)(void *ctx, const struct pb_chunk_reg *reg);
	int (*chunk_delete)(void *ctx, const struct kvp_chunk_id *id);
	int (*compose)(void *ctx, const struct kvp_compose_req *req, struct pb_comp *out);
	int (*stats)(void *ctx, struct kvp_stats *out);
	/* Consistency check after a workload ("ok" or what disagreed); NULL: none. */
	int (*check)(void *ctx, char *msg, size_t len);
	const char *(*error)(void *ctx);
};

/* Make a target for one workload with a device tier of pool_pages pages
 * (bench_prefix_engine.c / bench_prefix_client.c). */
struct prefix_opts;
int pb_engine_open(struct pb_target *t, const struct prefix_opts *o,
		   uint32_t pool_pages, char *err, size_t errlen);
void pb_engine_close(struct pb_target *t);
int pb_client_open(struct pb_target *t, const struct prefix_opts *o,
		   uint32_t pool_pages, char *err, size_t errlen);
void pb_client_close(struct pb_target *t);

/* ------------------------------------------------------------ results */

struct prefix_opts {
	struct pw_params w;
	struct kvp_layout layout;
	char layout_spec[256];
	uint64_t pool_pages;     /* 0: pool_frac of each workload's footprint */
	double pool_frac;
	uint64_t compose_samples;
	const char *target;      /* "both", "inproc", "kvpoold" */
	const char *kvpoold;     /* --kvpoold PATH */
	bool verify;
	bool json;
	/* --gpu */
	bool gpu;
	uint64_t gpu_tokens;
	uint64_t gpu_reps;
	uint64_t gpu_device;
};

/* One workload replayed on one target. */
struct pb_workload {
	const char *name;        /* "multi_turn", "rag", "agents" */
	bool ran;
	uint64_t requests;
	uint64_t tokens_needed;
	uint64_t tokens_hit;     /* served from cache */
	uint64_t best_tokens;
	uint64_t belady_tokens;  /* Belady's MIN with pool_pages (prefix_workload.h) */
	uint64_t footprint_pages;
	uint64_t pool_pages;
	uint64_t appended_tokens; /* KV tokens written (the misses) */
	uint64_t dedupe_pages_saved; /* pages not allocated: a cached page / chunk existed */
	uint64_t lookups;        /* prefix lookups or chunk lookups */
	uint64_t hits;           /* chunk registers that found it (chunks) */
	uint64_t evicted_pages;  /* prefix pages or chunk pages evicted */
	uint64_t evicted_chunks;
	uint64_t compose_retries; /* a chunk of the request evicted before compose */
	uint64_t verified_pages; /* pages whose first token was read back */
	uint64_t verify_failures;
	double seconds;
	struct summary op[4];    /* multi-turn: seq_alloc, extend, commit, free;
				  * chunks: register (hit), register (new), compose, release */
	struct kvp_stats stats;  /* the pool's counters at the end */
	char check[160];
};

enum { PB_WL_MT, PB_WL_RAG, PB_WL_AGENTS, PB_NWL };

struct pb_run {
	bool ran;
	char error[512];
	struct pb_workload wl[PB_NWL];
	struct summary compose8; /* system + 6 contexts + query */
	struct summary compose8_release;
	uint64_t compose8_pages; /* per call */
	uint64_t compose8_tokens;
};

/* Replay every workload of trace on fresh targets made by open(). Returns
 * 0, or -1 with the reason in run->error. */
typedef int (*pb_open_fn)(struct pb_target *t, const struct prefix_opts *o,
			  uint32_t pool_pages, char *err, size_t errlen);
int pb_run_trace(const struct pw_trace *trace, const struct prefix_opts *o,
		 pb_open_fn open, void (*close)(struct pb_target *), struct pb_run *run);

/* The pool a workload gets: --pool-pages, else pool_frac of its footprint,
 * never less than what one request and the compose set need. */
uint32_t pb_pool_pages(const struct prefix_opts *o, uint64_t footprint,
		       uint64_t min_pages);

/* ------------------------------------------------------------ GPU */

struct pb_gpu_result {
	char gpu_name[256];
	uint64_t tokens;
	uint64_t pages;
	uint64_t page_bytes;
	uint64_t reps;
	double linear_flops;     /* per prefill */
	double attn_flops;
	double recompute_linear_ms; /* medians */
	double recompute_attn_ms;
	double recompute_ms;     /* one prefill, linear + attention, timed as one */
	double recompute_tflops;
	double device_hit_us;    /* share_seq_alloc returning the cached pages */
	double device_hit_p99_us;
	double chunk_hit_us;     /* share_chunk_acquire of a 4,000-token chunk */
	double host_hit_ms;      /* engine_prepare onloading + fence */
	double host_hit_gbps;
	double h2d_ceiling_gbps; /* one pinned cudaMemcpyAsync of the same bytes */
	uint64_t device_hit_tokens;
	uint64_t host_onloaded_pages;
	double reuse_speedup;
	double reuse_speedup_host;
	double reuse_speedup_linear_only;
	bool verified;           /* hit pages read back == what was written */
};

int pb_gpu_measure(const struct prefix_opts *o, struct pb_gpu_result *r,
		   char *err, size_t errlen);

#endif /* KVBENCH_PREFIX_BENCH_H */
