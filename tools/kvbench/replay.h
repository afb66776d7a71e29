/* SPDX-License-Identifier: MIT */
/*
 * replay.h - what the parts of `kvbench replay` share.
 *
 *   replay.c           the trace, the pool's size, the systems run one
 *                      after the other, the report
 *   replay_opts.c      the options and their errors
 *   replay_run.c       one system from start to stop: its server, its
 *                      counters, the cuda copy ceilings; the in-process run
 *   replay_procs.c     the parent's side of the pipeline processes, the
 *                      progress bar, the results collected
 *   replay_pipeline.c  one pipeline's loop over its requests, the same for
 *                      every system (struct rsys_ops is the system)
 *   replay_sys.c       the systems: kvpool (ring), uds, inproc
 *   replay_redis.c     the Redis system and its redis-server (a stub that
 *                      says how to get it where kvbench was built without
 *                      hiredis)
 *   replay_cuda.c      --backend cuda: the pipelines' device buffer, stream
 *                      and appends, and the copy ceilings (CUDA builds)
 *   replay_report.c    table, JSON, markdown and plot data
 *
 * A PIPELINE takes its requests (its users' requests, in trace order) in
 * batches of up to --batch and does what the HSTU example does for a batch:
 * info for each request, prepare from start+len for the new tokens, append
 * them, commit and release. A batch ends early where a key would come twice.
 */
#ifndef KVBENCH_REPLAY_H
#define KVBENCH_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"
#include "replay_sim.h"
#include "stats.h"
#include "trace.h"

enum rsys_id { SYS_KVPOOL, SYS_INPROC, SYS_UDS, SYS_REDIS, NSYS };

/* The timed operations; a prepare that onloaded pages is counted apart. */
enum rop { OP_INFO, OP_PREPARE, OP_PREPARE_ONLOAD, OP_APPEND, OP_COMMIT, NOP };

#define REPLAY_SAMPLES_CAP (1u << 18) /* per operation per pipeline */

/* A lease as a pipeline keeps it across the phases of its batch. */
struct rlease {
	uint64_t key;
	uint64_t id;
	uint64_t start, len;      /* the history before this lease */
	uint32_t n_new;
	uint32_t npages;
	uint32_t last_page_len;
	uint32_t onloaded_pages;
	int32_t *idx;             /* page table copy, max_pages entries */
	struct kvp_lease kl;      /* kvpool: the lease as libkvpool returned it
				   * (its page table in the arena, valid until
				   * the next call or submit): what the GPU
				   * appends take */
	unsigned char *tail;      /* redis: the cached partial last page */
	uint32_t tail_bytes;
};

/* One request of a batched call (info_batch, prepare_batch, commit_batch). */
struct rbatch_item {
	uint64_t key;
	uint64_t pos;             /* prepare: start position */
	uint32_t n_new;           /* prepare: new tokens */
	int rc;                   /* 0 or -errno */
	uint64_t len;             /* info: cached start + len */
	uint64_t lat_ns;          /* submit to this item's completion */
	struct rlease *l;         /* prepare: filled; commit: committed */
};

/* One system, as a pipeline drives it. Each returns 0 or -errno; error()
 * says what went wrong in the last failed call. */
struct rsys_ops {
	const char *name;
	int (*info)(void *ctx, uint64_t key, uint64_t *len);
	int (*prepare)(void *ctx, uint64_t key, uint64_t pos, uint32_t n_new,
		       struct rlease *l);
	int (*append)(void *ctx, struct rlease *l, const void *kv);
	int (*commit)(void *ctx, struct rlease *l);   /* commit n_new, release;
							* NULL: nothing to do */
	int (*release)(void *ctx, struct rlease *l);  /* release, commit nothing */
	const char *(*error)(void *ctx);
	/* Optional: the whole batch with one submission each (kvpool's rings:
	 * queue, one kvp_submit, reap). Per-item errors are in items[i].rc;
	 * the return value is for the batch as a whole. */
	int (*info_batch)(void *ctx, struct rbatch_item *it, uint32_t n);
	int (*prepare_batch)(void *ctx, struct rbatch_item *it, uint32_t n);
	int (*commit_batch)(void *ctx, struct rbatch_item *it, uint32_t n);
	/* Optional: every prepared lease's new tokens in one call, made right
	 * after prepare_batch (nothing submitted in between, so the leases'
	 * page tables are still the arena's): the cuda backend's one
	 * kvp_append_batch_async() launch. */
	int (*append_batch)(void *ctx, struct rlease *const *l, uint32_t n);
};

/* Where kvbench was built without hiredis: what the Redis system says. */
#ifndef KVBENCH_HAVE_HIREDIS
#define KVBENCH_HAVE_HIREDIS 0
#endif
#define REPLAY_NO_HIREDIS "kvbench was built without hiredis: install libhiredis-dev " \
			  "(scripts/deps.sh) and rebuild"

/* 1 where kvbench links the cuda backend (it defines KVPOOL_HAVE_CUDA=1). */
#ifdef KVPOOL_HAVE_CUDA
#define REPLAY_CUDA 1
#else
#define REPLAY_CUDA 0
#endif

enum rbackend { RB_SHM, RB_CUDA };
#define REPLAY_HSTU_LAYOUT "layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32"

struct ropts {
	struct kvb_daemon_opts d;
	/* the trace */
	const char *trace_path;   /* --trace FILE */
	const char *hstu_dir;     /* --hstu DIR */
	struct trace_gen_opts gen;
	uint64_t first_days;      /* replay only these first days; 0 all */
	uint64_t max_requests;    /* 0 all */
	/* the run */
	uint64_t pipelines;
	uint64_t batch;
	double device_frac, host_frac;   /* of the working set */
	uint64_t device_pages, host_pages; /* explicit; 0: from the fractions */
	char layout_spec[256];
	struct kvp_layout layout;
	uint32_t systems;         /* bit per enum rsys_id */
	enum rbackend backend;    /* --backend: the kvpoold's (kvpool system) */
	bool layout_given;
	const char *redis;        /* --redis HOST:PORT: a running one */
	const char *redis_server; /* the binary to start */
	/* output */
	const char *md_path;
	const char *plot_dir;
	bool no_targets;          /* --no-targets: a demo, not a measurement */
	bool json;
	bool progress;            /* stderr is a terminal */
};

/* What one pipeline leaves in memory shared with the parent. */
struct rpipe_out {
	int status;               /* 0, else -errno */
	char err[512];
	uint64_t done;            /* requests finished (progress; relaxed) */
	uint64_t requests, batches;
	uint64_t needed, hit, appended;      /* tokens */
	uint64_t onload_pages, onload_ns;    /* prepares that onloaded */
	uint64_t reprepares;      /* the history went between info and prepare */
	uint64_t pinned_waits;    /* prepares retried: the pool was all pinned */
	uint64_t t_start, t_end;  /* CLOCK_MONOTONIC ns */
	uint32_t nsamples[NOP];
};

/* A pipeline's view of the run: its requests and where its results go. */
struct rpipe {
	const struct trace *t;
	const uint32_t *reqs;     /* indices into t->req, in order */
	size_t nreqs;
	uint32_t batch;
	uint32_t page_tokens;
	uint64_t token_bytes;
	uint64_t key_salt;        /* or'ed into every key */
	uint32_t max_pages;       /* page table entries a lease may have */
	const void *kv;           /* source of appended tokens (max request) */
	uint64_t t0_ms, bucket_ms;
	uint32_t nbuckets;
	uint64_t *bucket_needed, *bucket_hit;   /* nbuckets each */
	uint64_t *samples[NOP];                 /* REPLAY_SAMPLES_CAP each */
	struct rpipe_out *out;
};

/* Run p's requests through ops/ctx. Returns 0 or -errno (in p->out too). */
int rpipe_run(struct rpipe *p, const struct rsys_ops *ops, void *ctx);

/* ---------------------------------------------------------------- systems */

/* kvpool through the rings (sync calls) or the uds request mode. gpu_bytes
 * > 0 (cuda backend, CUDA builds): a device buffer of that many bytes and a
 * stream for the appends (rsys_kvpool_cuda_ops). */
int rsys_kvpool_open(void **ctx, const char *socket, bool uds, uint32_t max_pages,
		     uint32_t spin_us, uint64_t gpu_bytes, char *err, size_t errlen);
void rsys_kvpool_close(void *ctx);
extern const struct rsys_ops rsys_kvpool_ops, rsys_uds_ops;
#if REPLAY_CUDA
extern const struct rsys_ops rsys_kvpool_cuda_ops;

/* replay_cuda.c: a pipeline's side of the GPU (its own stream and buffer). */
struct rgpu;
int rgpu_open(struct rgpu **g, struct kvp_client *c, uint64_t bytes, char *err,
	      size_t errlen);
void rgpu_close(struct rgpu *g);
/* "Compute" the K/V of n leases' new tokens into the buffer (a memset on
 * the stream: the model's output) and append them with one
 * kvp_append_batch_async() (n == 1: kvp_append_async()). Commit waits. */
int rgpu_append(struct rgpu *g, struct kvp_client *c, struct rlease *const *l,
		uint32_t n, char *err, size_t errlen);

/* The raw pinned cudaMemcpyAsync ceilings, timed like the daemon's copies
 * (wall clock around enqueue + cudaStreamSynchronize), between a
 * cudaMalloc buffer and a cudaHostAlloc(portable) one on device. */
struct rgpu_ceiling {
	int device;
	char gpu[256];
	uint32_t pages_per_sync;  /* the mean demotion's pages */
	uint64_t page_bytes;
	double d2h_pages;         /* B/s: k one-page copies, then a sync */
	double d2h_run;           /* k pages as one copy, then a sync */
	double d2h_bulk;          /* 1 GiB copies */
	double h2d_pages, h2d_bulk;
	/* The pages and run shapes again while another stream keeps host ->
	 * device copies going: the link as the replay shares it with onloads
	 * (reported beside the ceiling, not instead of it). */
	double d2h_pages_duplex, d2h_run_duplex;
};
int rgpu_measure_ceiling(int device, uint64_t page_bytes, uint32_t pages_per_sync,
			 struct rgpu_ceiling *out, char *err, size_t errlen);
#endif

/* The engine in this process, with the daemon's geometry. */
int rsys_inproc_open(void **ctx, const struct kvp_layout *l, uint32_t device_pages,
		     uint32_t host_pages, uint32_t max_pages, char *err, size_t errlen);
void rsys_inproc_close(void *ctx);
void rsys_inproc_stats(void *ctx, struct kvp_stats *out);
extern const struct rsys_ops rsys_inproc_ops;

/* Redis: a connection to host:port holding pages of page_tokens tokens. */
int rsys_redis_open(void **ctx, const char *host, int port, uint32_t page_tokens,
		    uint64_t token_bytes, uint32_t max_pages, char *err, size_t errlen);
void rsys_redis_close(void *ctx);
extern const struct rsys_ops rsys_redis_ops;

/* A private redis-server on a free loopback port (killed if kvbench dies). */
struct redis_server {
	pid_t pid;
	int port;
	char dir[96];
	char log[128];
	char command[1024];
};

int redis_server_start(struct redis_server *r, const char *binary,
		       uint64_t maxmemory, char *err, size_t errlen);
int redis_server_stop(struct redis_server *r, char *err, size_t errlen);

/* ---------------------------------------------------------------- report */

struct rsys_result {
	bool ran;
	double wall_s;
	uint64_t requests, batches, needed, hit, appended;
	uint64_t onload_pages, onload_ns, reprepares, pinned_waits;
	struct summary lat[NOP];
	uint64_t *prepare_sorted; /* prepare (no onload) samples, sorted */
	size_t nprepare;
	uint64_t *bucket_needed, *bucket_hit;
	bool have_stats;
	struct kvp_stats stats;   /* the pool's counters over the run */
	bool have_phases;         /* kvp_ring_phases before and after the run */
	struct kvp_ring_phases ph0, ph1;
	uint64_t device_frames, host_frames;
	char note[256];           /* e.g. the redis-server's maxmemory */
	char skipped[256];        /* not run, and why (e.g. no hiredis) */
};

struct rrun {
	struct ropts o;
	struct trace t;
	size_t nreq;              /* requests replayed */
	struct trace_stats ts;
	uint64_t working_set_pages;
	uint64_t device_pages, host_pages;
	uint32_t max_pages;
	uint64_t t0_ms, bucket_ms;
	uint32_t nbuckets;
	struct sim_result sim;
	double memcpy_bytes_per_s;
	struct rsys_result sys[NSYS];
	struct kvb_daemon daemon;
	struct redis_server redis;
	char redis_where[128];
	struct kvb_machine m;
	bool have_ceiling;        /* --backend cuda */
#if REPLAY_CUDA
	struct rgpu_ceiling ceil;
#endif
	char ceiling_err[256];
};

extern const char *const rsys_name[NSYS];
extern const char *const rop_name[NOP];

/* ---------------------------------------------------------------- the run */

/* replay_opts.c: argv into *o; -1 to go on, else the exit status. */
int replay_parse_opts(int argc, char **argv, struct ropts *o);

/* Where a system is: filled by the parent after the fork, in memory it
 * shares with the pipelines. */
struct rtarget {
	char socket[256];     /* kvpool, uds */
	char host[128];       /* redis */
	int port;
	int ok;               /* 0: the parent could not set the system up */
	uint64_t salt;
};

/* The parent's side of starting a system: fill *tg (and *stat_c, a client
 * for the pool's counters, where there is a pool). 0 or -errno. */
typedef int (*replay_setup_fn)(struct rrun *r, enum rsys_id id, struct rtarget *tg,
			       struct kvp_client **stat_c);

/* replay_procs.c: fork r->o.pipelines pipelines, set the system up with
 * setup, run them, collect into r->sys[id]; the pool's counters before and
 * after in *s0, *s1 where setup gave a client (left in *stat_cp). */
int replay_run_procs(struct rrun *r, enum rsys_id id, replay_setup_fn setup, const void *kv,
		     struct kvp_stats *s0, struct kvp_stats *s1, struct kvp_client **stat_cp);
/* A pipeline's fixed inputs from the run (its requests and outputs aside). */
void replay_fill_pipe(struct rpipe *p, const struct rrun *r, const void *kv, uint64_t salt);
/* What np pipelines measured, summed into *res. 0 or -ENOMEM. */
int replay_collect(struct rrun *r, struct rsys_result *res, struct rpipe_out *outs,
		   uint64_t **samples, uint64_t *buckets, uint32_t np);
/* The progress bar on stderr (when it is a terminal). */
void replay_progress(const struct rrun *r, const char *label, uint64_t done,
		     uint64_t total, uint64_t t0, bool last);

/* replay_run.c: one system each, from empty; 0 or -errno. */
int replay_run_daemon(struct rrun *r, enum rsys_id id, const void *kv);
int replay_run_inproc(struct rrun *r, const void *kv);
int replay_run_redis(struct rrun *r, const void *kv);

void replay_print_table(const struct rrun *r);
void replay_print_json(const struct rrun *r);
int replay_write_md(const struct rrun *r, const char *path);
int replay_write_plot_data(const struct rrun *r, const char *dir);

/* Throughput in bytes of KV served per second: (hit + appended) tokens. */
double rsys_bytes_per_s(const struct rrun *r, const struct rsys_result *s);

#endif /* KVBENCH_REPLAY_H */
