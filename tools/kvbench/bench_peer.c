/* SPDX-License-Identifier: MIT */
/*
 * bench_peer.c - kvbench peer: a history moved between two GPUs' pools of
 * one kvpoold (kvp_move, issue 31) against the peer-copy ceiling.
 *
 * One run measures both, on the same two GPUs and the same bytes:
 *  - peer_ceiling_gbps: the raw cudaMemcpyPeerAsync of S bytes between
 *    two cudaMalloc buffers (peer access enabled where the GPUs have it),
 *    timed with events, alternating directions;
 *  - move_gbps: kvpoold --backend=cuda --devices=A,B started here, one
 *    user's history of S bytes committed in pool 0, then kvp_move from pool
 *    0 to pool 1 and back, each timed from the call to its completion (the
 *    daemon's locks, bookkeeping and its peer copy: what a client waits).
 * move_ratio = move_gbps / peer_ceiling_gbps, the median of each. Whether
 * the GPUs reach each other (cudaDeviceCanAccessPeer) is reported: without
 * it both paths go through host memory.
 *
 * Fewer than 2 GPUs, or a kvbench built without CUDA: exit 77 with a
 * message saying so (ctest's skip).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"

#define SUB "peer"
#define PEER_SKIP 77

enum { OPT_BYTES = 256, OPT_REPS, OPT_QUICK, OPT_GPUS };

struct peer_opts {
	uint64_t bytes;        /* S: the history's and the raw copy's size */
	uint64_t reps;         /* timed copies / moves of each */
	int gpu[2];            /* the two GPUs (ordinals) */
	const char *kvpoold;
	bool json;
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench peer [options]\n"
"\n"
"A user's history moved between two GPUs' pools of one kvpoold (kvp_move)\n"
"vs the raw cudaMemcpyPeerAsync of the same bytes between the same GPUs, in\n"
"one run: move_gbps, peer_ceiling_gbps, move_ratio, and whether peer access\n"
"is enabled. Needs 2 GPUs and a CUDA build; else exits 77 saying why.\n"
"\n"
"Options:\n"
"  --bytes SIZE       the history's size, e.g. 256M (default 256M)\n"
"  --reps N           timed moves and raw copies each (default 6)\n"
"  --quick            --bytes 32M --reps 2 (the gpu2 ctest)\n"
"  --gpus A,B         the two GPUs (default 0,1)\n"
"  --kvpoold PATH     the kvpoold to start (default: next to kvbench)\n"
KVB_USAGE_END_OPTS);
}

static int parse_gpus(const char *arg, int gpu[2])
{
	char *end;
	long a = strtol(arg, &end, 10), b;

	if (end == arg || *end != ',')
		return -1;
	arg = end + 1;
	b = strtol(arg, &end, 10);
	if (end == arg || *end || a < 0 || b < 0 || a > 1023 || b > 1023 || a == b)
		return -1;
	gpu[0] = (int)a;
	gpu[1] = (int)b;
	return 0;
}

static int peer_opt(void *ctx, int code, const char *arg)
{
	struct peer_opts *o = ctx;

	switch (code) {
	case OPT_BYTES:
		if (kvb_opt_bytes(arg, &o->bytes) || o->bytes < (1u << 20))
			return kvb_usage_error(SUB, "--bytes: '%s' is not a size of "
					       "1M or more (e.g. 256M)", arg);
		return -1;
	case OPT_REPS:
		return kvb_opt_count(SUB, "--reps", arg, 1, 1000, &o->reps);
	case OPT_QUICK:
		o->bytes = 32ull << 20;
		o->reps = 2;
		return -1;
	case OPT_GPUS:
		if (parse_gpus(arg, o->gpu))
			return kvb_usage_error(SUB, "--gpus: '%s' is not two different "
					       "GPU ordinals such as 0,1", arg);
		return -1;
	case KVB_OPT_KVPOOLD:
		o->kvpoold = arg;
		return -1;
	}
	return kvb_usage_error(SUB, "unknown option");
}

static int parse(int argc, char **argv, struct peer_opts *o)
{
	static const struct option long_opts[] = {
		{ "bytes", required_argument, NULL, OPT_BYTES },
		{ "reps", required_argument, NULL, OPT_REPS },
		{ "quick", no_argument, NULL, OPT_QUICK },
		{ "gpus", required_argument, NULL, OPT_GPUS },
		{ "kvpoold", required_argument, NULL, KVB_OPT_KVPOOLD },
		KVB_LONG_OPTS_END
	};

	*o = (struct peer_opts){ .bytes = 256ull << 20, .reps = 6, .gpu = { 0, 1 } };
	return kvb_parse_opts(SUB, argc, argv, long_opts, usage, peer_opt, o, &o->json);
}

#ifndef KVPOOL_HAVE_CUDA

int cmd_peer(int argc, char **argv)
{
	struct peer_opts o;
	int rc = parse(argc, argv, &o);

	if (rc >= 0)
		return rc;
	fprintf(stderr, "kvbench peer: SKIP: kvbench was built without CUDA; it needs "
		"2 GPUs and a build with -DKVPOOL_CUDA=ON\n");
	return PEER_SKIP;
}

#else /* KVPOOL_HAVE_CUDA */

#include <cuda_runtime_api.h>

#include "backend.h" /* backend_cuda_peer_access: what kvpoold's copy_peer does */

/* The layout of the history moved: 2 MiB pages (a 70B-class model's
 * 32 layers x 8 kv_heads x 128 dims in bf16, 16 tokens a page). */
#define PEER_LAYOUT "layers=32,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=16"
#define PEER_PAGE_BYTES ((uint64_t)2 << 20)
#define PEER_PAGE_TOKENS 16u

struct peer_result {
	bool peer_access;
	char name[2][256];
	double ceiling_s[1000], move_s[1000];
	double ceiling_gbps, move_gbps;
	uint64_t pages;
	struct kvb_daemon d;
};

#define CK(call, what) do {						\
	cudaError_t err_ = (call);					\
	if (err_ != cudaSuccess) {					\
		fprintf(stderr, "kvbench peer: %s: %s\n", what,		\
			cudaGetErrorString(err_));			\
		goto out;						\
	}								\
} while (0)

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, uint64_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Peer access on from a to b; already on is fine. */
static cudaError_t enable_peer(int a, int b)
{
	cudaError_t err = cudaSetDevice(a);

	if (err == cudaSuccess)
		err = cudaDeviceEnablePeerAccess(b, 0);
	if (err == cudaErrorPeerAccessAlreadyEnabled) {
		(void)cudaGetLastError(); /* clear it */
		err = cudaSuccess;
	}
	return err;
}

/* The raw cudaMemcpyPeerAsync of o->bytes, alternating directions. */
static int ceiling(const struct peer_opts *o, struct peer_result *r)
{
	void *buf[2] = { NULL, NULL };
	cudaStream_t st[2] = { NULL, NULL };
	cudaEvent_t ev[2][2] = { { NULL, NULL }, { NULL, NULL } };
	int rc = -1;

	for (int i = 0; i < 2; i++) {
		CK(cudaSetDevice(o->gpu[i]), "cudaSetDevice");
		CK(cudaMalloc(&buf[i], o->bytes), "cudaMalloc of the copy's buffer");
		CK(cudaMemset(buf[i], i + 1, o->bytes), "cudaMemset");
		CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking),
		   "cudaStreamCreate");
		CK(cudaEventCreate(&ev[i][0]), "cudaEventCreate");
		CK(cudaEventCreate(&ev[i][1]), "cudaEventCreate");
		CK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	}
	if (r->peer_access) {
		CK(enable_peer(o->gpu[0], o->gpu[1]), "cudaDeviceEnablePeerAccess");
		CK(enable_peer(o->gpu[1], o->gpu[0]), "cudaDeviceEnablePeerAccess");
	}
	/* One untimed copy each way, then the timed ones. */
	for (uint64_t k = 0; k < o->reps + 2; k++) {
		int s = (int)(k % 2), d = !s;
		float ms = 0;

		CK(cudaSetDevice(o->gpu[s]), "cudaSetDevice");
		CK(cudaEventRecord(ev[s][0], st[s]), "cudaEventRecord");
		CK(cudaMemcpyPeerAsync(buf[d], o->gpu[d], buf[s], o->gpu[s], o->bytes,
				       st[s]), "cudaMemcpyPeerAsync");
		CK(cudaEventRecord(ev[s][1], st[s]), "cudaEventRecord");
		CK(cudaEventSynchronize(ev[s][1]), "cudaEventSynchronize");
		CK(cudaEventElapsedTime(&ms, ev[s][0], ev[s][1]), "cudaEventElapsedTime");
		if (k >= 2)
			r->ceiling_s[k - 2] = ms / 1e3;
	}
	r->ceiling_gbps = (double)o->bytes / median(r->ceiling_s, o->reps) / 1e9;
	rc = 0;
out:
	for (int i = 0; i < 2; i++) {
		cudaSetDevice(o->gpu[i]);
		if (ev[i][0])
			cudaEventDestroy(ev[i][0]);
		if (ev[i][1])
			cudaEventDestroy(ev[i][1]);
		if (st[i])
			cudaStreamDestroy(st[i]);
		if (buf[i])
			cudaFree(buf[i]);
	}
	return rc;
}

static int daemon_start(const struct peer_opts *o, struct peer_result *r)
{
	char path[PATH_MAX], err[1024], f[5][320];
	const char *flags[6];
	uint64_t mem = o->bytes + 8 * PEER_PAGE_BYTES;
	int rc;

	rc = kvb_daemon_find(o->kvpoold, path, sizeof(path), err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvbench peer: %s\n", err);
		return rc;
	}
	snprintf(f[0], sizeof(f[0]), "--backend=cuda");
	snprintf(f[1], sizeof(f[1]), "--devices=%d,%d", o->gpu[0], o->gpu[1]);
	snprintf(f[2], sizeof(f[2]), "--device_mem=%lluK",
		 (unsigned long long)(mem >> 10));
	snprintf(f[3], sizeof(f[3]), "--host_mem=%lluK",
		 (unsigned long long)((8 * PEER_PAGE_BYTES) >> 10));
	snprintf(f[4], sizeof(f[4]), "--layout=%s", PEER_LAYOUT);
	for (int i = 0; i < 5; i++)
		flags[i] = f[i];
	flags[5] = NULL;
	rc = kvb_daemon_start(&r->d, path, flags, -1, 120000, err, sizeof(err));
	if (rc)
		fprintf(stderr, "kvbench peer: %s\n", err);
	return rc;
}

static struct kvp_client *attach(const char *sock, uint32_t pool)
{
	struct kvp_connect_opts co = { .socket = sock, .name = "kvbench-peer",
				       .pool = pool };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN];

	if (kvp_connect(&c, &co, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvbench peer: attach to pool %u: %s\n", pool, err);
		return NULL;
	}
	return c;
}

/* User 1's history of r->pages pages in pool 0: prepared and committed a
 * piece at a time (what the pages hold does not change a copy's speed). */
static int history_build(struct kvp_client *c, struct peer_result *r)
{
	uint64_t tokens = r->pages * PEER_PAGE_TOKENS, pos = 0;

	while (pos < tokens) {
		uint32_t n = tokens - pos < 4096 ? (uint32_t)(tokens - pos) : 4096;
		struct kvp_lease l;
		int rc = kvp_prepare(c, 1, pos, n, &l);

		if (!rc)
			rc = kvp_commit(c, l.id, n);
		if (!rc)
			rc = kvp_release(c, l.id);
		if (rc) {
			fprintf(stderr, "kvbench peer: building the history at token %"
				PRIu64 ": %s\n", pos, kvp_last_error(c));
			return rc;
		}
		pos += n;
	}
	return 0;
}

/* Moves 0 -> 1 and back, timed from the call to its completion. */
static int moves(const struct peer_opts *o, struct peer_result *r)
{
	struct kvp_client *c[2] = { attach(r->d.sock, 0), attach(r->d.sock, 1) };
	int rc = -1;

	if (!c[0] || !c[1] || history_build(c[0], r))
		goto out;
	for (uint64_t k = 0; k < o->reps + 2; k++) {
		uint32_t from = (uint32_t)(k % 2), to = !from;
		struct kvp_user_info u;
		double t0 = kvb_now_s(), dt;
		int n = kvp_move(c[from], 1, from, to);

		dt = kvb_now_s() - t0;
		if (n < 0 || (uint64_t)n != r->pages) {
			fprintf(stderr, "kvbench peer: move %u -> %u: %d (%s), want %"
				PRIu64 " pages\n", from, to, n, kvp_last_error(c[from]),
				r->pages);
			goto out;
		}
		memset(&u, 0, sizeof(u));
		if (kvp_info(c[to], 1, &u) || u.pages_device != r->pages) {
			fprintf(stderr, "kvbench peer: after the move pool %u holds %u "
				"device pages of the user, want %" PRIu64 "\n", to,
				u.pages_device, r->pages);
			goto out;
		}
		if (k >= 2) /* the first each way grants the peer mappings */
			r->move_s[k - 2] = dt;
	}
	r->move_gbps = (double)(r->pages * PEER_PAGE_BYTES) /
		       median(r->move_s, o->reps) / 1e9;
	rc = 0;
out:
	for (int i = 0; i < 2; i++)
		if (c[i])
			kvp_close(c[i]);
	return rc;
}

static void report(const struct peer_opts *o, const struct peer_result *r,
		   const struct kvb_machine *m)
{
	double ratio = r->ceiling_gbps > 0 ? r->move_gbps / r->ceiling_gbps : 0;
	struct json j;

	if (!o->json) {
		printf("kvbench peer: GPU %d (%s) <-> GPU %d (%s), peer access %s\n",
		       o->gpu[0], r->name[0], o->gpu[1], r->name[1],
		       r->peer_access ? "enabled" : "not available (through host memory)");
		printf("history of %" PRIu64 " bytes (%" PRIu64 " pages of 2 MiB), %"
		       PRIu64 " moves and copies each\n", r->pages * PEER_PAGE_BYTES,
		       r->pages, o->reps);
		printf("move_gbps          %.2f\n", r->move_gbps);
		printf("peer_ceiling_gbps  %.2f\n", r->ceiling_gbps);
		printf("move_ratio         %.3f\n", ratio);
		return;
	}
	kvb_json_begin(&j, "peer");
	json_arr_begin(&j, "gpus");
	for (int i = 0; i < 2; i++) {
		json_obj_begin(&j, NULL);
		json_i64(&j, "ordinal", o->gpu[i]);
		json_str(&j, "name", r->name[i]);
		json_obj_end(&j);
	}
	json_arr_end(&j);
	json_bool(&j, "peer_access", r->peer_access);
	json_u64(&j, "bytes", r->pages * PEER_PAGE_BYTES);
	json_u64(&j, "reps", o->reps);
	json_str(&j, "layout", PEER_LAYOUT);
	json_f64(&j, "move_gbps", r->move_gbps, 3);
	json_f64(&j, "peer_ceiling_gbps", r->ceiling_gbps, 3);
	json_f64(&j, "move_ratio", ratio, 4);
	json_f64(&j, "move_s_median", (double)(r->pages * PEER_PAGE_BYTES) /
		 (r->move_gbps * 1e9), 6);
	json_f64(&j, "ceiling_s_median", (double)(r->pages * PEER_PAGE_BYTES) /
		 (r->ceiling_gbps * 1e9), 6);
	json_str(&j, "kvpoold_command", r->d.command);
	kvb_json_end(&j, m);
}

int cmd_peer(int argc, char **argv)
{
	struct peer_result *r;
	struct kvb_machine m;
	struct peer_opts o;
	char err[256];
	int rc = parse(argc, argv, &o), n = 0;
	cudaError_t cerr;

	if (rc >= 0)
		return rc;
	cerr = cudaGetDeviceCount(&n);
	if (cerr != cudaSuccess || n < 2) {
		fprintf(stderr, "kvbench peer: SKIP: needs 2 GPUs; CUDA sees %d (%s)\n",
			cerr == cudaSuccess ? n : 0, cerr == cudaSuccess ?
			"CUDA_VISIBLE_DEVICES or the machine" : cudaGetErrorString(cerr));
		return PEER_SKIP;
	}
	if (o.gpu[0] >= n || o.gpu[1] >= n)
		return kvb_usage_error(SUB, "--gpus %d,%d: CUDA sees GPUs 0 to %d",
				       o.gpu[0], o.gpu[1], n - 1);
	r = calloc(1, sizeof(*r));
	if (!r) {
		fprintf(stderr, "kvbench peer: out of memory\n");
		return KVB_EXIT_FAIL;
	}
	kvb_machine_info(&m, -1);
	for (int i = 0; i < 2; i++) {
		struct cudaDeviceProp p;

		if (cudaGetDeviceProperties(&p, o.gpu[i]) == cudaSuccess)
			snprintf(r->name[i], sizeof(r->name[i]), "%s", p.name);
	}
	r->peer_access = backend_cuda_peer_access(o.gpu[0], o.gpu[1]);
	r->pages = (o.bytes + PEER_PAGE_BYTES - 1) / PEER_PAGE_BYTES;
	o.bytes = r->pages * PEER_PAGE_BYTES;
	rc = KVB_EXIT_FAIL;
	if (ceiling(&o, r) == 0 && daemon_start(&o, r) == 0) {
		if (moves(&o, r) == 0) {
			report(&o, r, &m);
			rc = KVB_EXIT_OK;
		}
		if (kvb_daemon_stop(&r->d, 10000, err, sizeof(err))) {
			fprintf(stderr, "kvbench peer: kvpoold: %s\n", err);
			rc = KVB_EXIT_FAIL;
		}
	}
	free(r);
	return rc;
}

#endif /* KVPOOL_HAVE_CUDA */
