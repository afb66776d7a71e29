/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: one run, one device pool; builds only with CUDA. */
/*
 * bench_gpu.c - `kvbench gpu`: the data path on one GPU, every figure next
 * to a ceiling measured in the same run, on the same buffers.
 *
 *  1. Append bandwidth. A device pool of --mib MiB (the cuda backend's own
 *     device tier: a cuMemCreate allocation) gets every one of its token
 *     slots written by one kvp_append_cuda() launch, the slots in a random
 *     order (a batch of many users' tokens lands all over the pool), from a
 *     contiguous [tokens][layers][2][kv_heads][head_dim] device buffer of
 *     the same size; the same with kvp_append_layers_cuda() from per-layer
 *     views of that buffer. The ceiling is a device-to-device
 *     cudaMemcpyAsync of the same bytes from the same source into the same
 *     pool. Each is timed with CUDA events on one stream, --reps times,
 *     their order rotating; the median counts. Bandwidth counts every byte
 *     read and every byte written, 2 * tokens * token_bytes per append and
 *     2 * bytes per copy, the convention of shared/gpu/README.md's 4.2 TB/s.
 *     Then each kernel runs once more and the pool is read back and
 *     compared with the C reference (kvp_read_cpu). Run for --layout and
 *     for a geometry of 512-byte rows.
 *
 *  2. Offload and onload through the engine on the cuda backend: --mib MiB
 *     of pages held by 32 users; engine_offload_all() copies them to the
 *     pinned host tier, engine_evict_all(device) drops the device copies
 *     and a read-only prepare of every user onloads them. Each timed with
 *     the wall clock around the engine calls (the engine's copies are
 *     synchronous). Ceilings, timed the same way between the same two tier
 *     buffers: one cudaMemcpyAsync of all the bytes each way, one per page,
 *     and both directions at once (half the bytes each way on two streams).
 *     The engine cannot offload and onload at once (its copies complete
 *     synchronously), so its "bidirectional" figure is offload then onload.
 *
 *  3. Latency of a batched one-token append: kvp_append_cuda() of 1, 8, 64
 *     and 512 tokens (one per user, each into a random slot), slots and
 *     source already on the device, timed with a CUDA event pair around
 *     the launch, synchronised each time; the median of --samples. The same
 *     for a cudaMemcpyAsync of the same bytes.
 *
 * gpu_report.c parses the options and prints the report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kvpool_engine.h"
#include "gpu_report.h"
#include "kvbench.h"
#include "kvp_kernels.h"
#include "kvpool.h"
#include "stats.h"

#define SUB "gpu"

/* Users of the offload/onload part (fewer when the pages are fewer). */
#define XFER_USERS 32
/* Untimed launches before each latency series. */
#define LAT_WARMUP 50

struct gctx {
	int device;
	void *bctx;               /* backend_cuda_open() */
	cudaStream_t s[2];
	cudaEvent_t ev[2];
};

static int cuda_fail(const char *what, cudaError_t e)
{
	fprintf(stderr, "kvbench gpu: %s: %s\n", what, cudaGetErrorString(e));
	return -1;
}

#define CK(call)							\
	do {								\
		cudaError_t e_ = (call);				\
		if (e_ != cudaSuccess) {				\
			rc = cuda_fail(#call, e_);			\
			goto out;					\
		}							\
	} while (0)

static uint64_t mix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill_random(unsigned char *p, uint64_t n, uint64_t seed)
{
	for (uint64_t i = 0; i < n; i += 8) {
		uint64_t r = mix64(&seed);

		memcpy(p + i, &r, n - i < 8 ? n - i : 8);
	}
}

/* The median of n values, v left as it was. */
static double median_of(const double *v, size_t n)
{
	double *t = malloc((n ? n : 1) * sizeof(*t));
	double m;

	if (!t)
		return 0;
	memcpy(t, v, n * sizeof(*t));
	m = median_f64(t, n);
	free(t);
	return m;
}

static double secs_since(uint64_t t0)
{
	return (double)(now_ns() - t0) * 1e-9;
}

/* ---------------------------------------------------------------- append */

enum append_op { OP_APPEND, OP_LAYERS, OP_PAGES, OP_D2D, NOPS };

struct append_bufs {
	const struct kvp_layout *l;
	struct tier_mem pool;
	unsigned char *src;       /* device: [tokens][layers][2][heads][dim] */
	struct kvp_slot *d_slots; /* device: every slot, in a random order */
	struct kvp_slot *d_pslots; /* device: pages in a random order, the
				    * slots of a page in order */
	void **d_k, **d_v;        /* device arrays of per-layer views of src */
	uint64_t tokens, bytes;
};

static int enqueue(struct gctx *g, const struct append_bufs *b, enum append_op op,
		   uint64_t tokens)
{
	int rc = 0;

	switch (op) {
	case OP_APPEND:
		rc = kvp_append_cuda(b->l, b->pool.base, b->d_slots, (uint32_t)tokens,
				     b->src, g->s[0]);
		break;
	case OP_PAGES:
		rc = kvp_append_cuda(b->l, b->pool.base, b->d_pslots, (uint32_t)tokens,
				     b->src, g->s[0]);
		break;
	case OP_LAYERS:
		rc = kvp_append_layers_cuda(b->l, b->pool.base, b->d_slots,
					    (uint32_t)tokens,
					    (const void *const *)b->d_k,
					    (const void *const *)b->d_v, g->s[0]);
		break;
	case OP_D2D: {
		cudaError_t e = cudaMemcpyAsync(b->pool.base, b->src,
						tokens * b->l->token_bytes,
						cudaMemcpyDeviceToDevice, g->s[0]);

		if (e != cudaSuccess)
			return cuda_fail("cudaMemcpyAsync(device to device)", e);
		return 0;
	}
	default:
		break;
	}
	if (rc) {
		fprintf(stderr, "kvbench gpu: %s of %" PRIu64 " tokens: %d (%s)\n",
			op == OP_LAYERS ? "kvp_append_layers_cuda" : "kvp_append_cuda",
			tokens, rc, kvp_kernels_error());
		return -1;
	}
	return 0;
}

/* One op between two events; its time in seconds into *t. */
static int timed(struct gctx *g, const struct append_bufs *b, enum append_op op,
		 uint64_t tokens, double *t)
{
	float ms = 0;
	int rc = 0;

	CK(cudaEventRecord(g->ev[0], g->s[0]));
	if (enqueue(g, b, op, tokens))
		return -1;
	CK(cudaEventRecord(g->ev[1], g->s[0]));
	CK(cudaEventSynchronize(g->ev[1]));
	CK(cudaEventElapsedTime(&ms, g->ev[0], g->ev[1]));
	*t = ms * 1e-3;
out:
	return rc;
}

/* The pool as the contiguous append left it vs the C reference. */
static bool check_append(const struct kvp_layout *l, const unsigned char *img,
			 const struct kvp_slot *slots, uint64_t tokens,
			 const unsigned char *src)
{
	enum { CHUNK = 64 };
	unsigned char *tmp = malloc(CHUNK * l->token_bytes);
	bool ok = tmp != NULL;

	for (uint64_t t = 0; ok && t < tokens; t += CHUNK) {
		uint32_t c = tokens - t < CHUNK ? (uint32_t)(tokens - t) : CHUNK;

		kvp_read_cpu(l, img, slots + t, c, tmp);
		if (memcmp(tmp, src + t * l->token_bytes, c * l->token_bytes)) {
			fprintf(stderr, "kvbench gpu: kvp_append_cuda: tokens %" PRIu64
				" to %" PRIu64 " differ from the C reference\n", t,
				t + c - 1);
			ok = false;
		}
	}
	free(tmp);
	return ok;
}

/* The pool as the per-layer append left it: row (t, layer, kv) is row t of
 * view 2 * layer + kv of the source. */
static bool check_layers(const struct kvp_layout *l, const unsigned char *img,
			 const struct kvp_slot *slots, uint64_t tokens,
			 const unsigned char *src)
{
	const uint64_t row = l->token_stride;

	for (uint64_t t = 0; t < tokens; t++) {
		for (uint32_t layer = 0; layer < l->layers; layer++) {
			for (uint32_t kv = 0; kv < 2; kv++) {
				const unsigned char *d = img + slots[t].frame * l->page_bytes +
							 layer * l->layer_stride +
							 kv * l->kv_stride +
							 slots[t].slot * row;
				const unsigned char *s = src +
							 ((2ull * layer + kv) * tokens + t) * row;

				if (memcmp(d, s, row)) {
					fprintf(stderr, "kvbench gpu: kvp_append_layers_cuda: "
						"token %" PRIu64 " layer %u %s differs from "
						"the C reference\n", t, layer, kv ? "V" : "K");
					return false;
				}
			}
		}
	}
	return true;
}

static int run_latency(struct gctx *g, const struct gpu_opts *o,
		       const struct append_bufs *b, struct gpu_latency *lat)
{
	double *t_app = malloc(o->samples * sizeof(double));
	double *t_cpy = malloc(o->samples * sizeof(double));
	int rc = 0;

	lat->samples = o->samples;
	if (!t_app || !t_cpy) {
		fprintf(stderr, "kvbench gpu: out of memory\n");
		rc = -1;
		goto out;
	}
	for (int k = 0; k < GPU_LAT_BATCHES; k++) {
		uint64_t n = gpu_lat_users[k] < b->tokens ? gpu_lat_users[k] : b->tokens;
		double t;

		for (int w = 0; w < LAT_WARMUP; w++)
			if (timed(g, b, OP_APPEND, n, &t) || timed(g, b, OP_D2D, n, &t))
				goto fail;
		for (uint64_t i = 0; i < o->samples; i++) {
			if (timed(g, b, OP_APPEND, n, &t_app[i]) ||
			    timed(g, b, OP_D2D, n, &t_cpy[i]))
				goto fail;
			t_app[i] *= 1e6;
			t_cpy[i] *= 1e6;
		}
		lat->d2d_p50_us[k] = median_f64(t_cpy, o->samples);
		lat->p50_us[k] = median_f64(t_app, o->samples); /* sorts t_app */
		/* Nearest rank, as stats.c. */
		lat->p99_us[k] = t_app[(o->samples * 99 + 99) / 100 - 1];
	}
out:
	free(t_app);
	free(t_cpy);
	return rc;
fail:
	rc = -1;
	goto out;
}

/*
 * Append bandwidth for one layout (see the top of the file); with lat, the
 * latency part too, on the same pool.
 */
static int run_append(struct gctx *g, const struct gpu_opts *o,
		      const struct kvp_layout *l, struct gpu_append *a,
		      struct gpu_latency *lat)
{
	struct append_bufs b = { .l = l, .pool = { .fd = -1 } };
	struct errbuf e = { .msg = "" };
	unsigned char *h_src = NULL, *h_img = NULL;
	struct kvp_slot *slots = NULL, *pslots = NULL;
	uint32_t *perm = NULL;
	void **h_ptrs = NULL;
	double *all[NOPS] = { NULL };
	uint64_t seed = 0x6b7670656e636821ull, nslots;
	int rc = 0;

	memset(a, 0, sizeof(*a));
	a->l = *l;
	a->pages = (o->mib << 20) / l->page_bytes;
	a->tokens = nslots = a->pages * l->page_tokens;
	a->bytes = b.bytes = a->pages * l->page_bytes;
	b.tokens = a->tokens;
	/* gpu_results_free() frees these. */
	a->gbps_all = all[OP_APPEND] = calloc(o->reps, sizeof(double));
	a->layers_gbps_all = all[OP_LAYERS] = calloc(o->reps, sizeof(double));
	a->pages_gbps_all = all[OP_PAGES] = calloc(o->reps, sizeof(double));
	a->d2d_gbps_all = all[OP_D2D] = calloc(o->reps, sizeof(double));
	if (!all[OP_APPEND] || !all[OP_LAYERS] || !all[OP_PAGES] || !all[OP_D2D])
		goto nomem;

	rc = backend_cuda.tier_alloc(g->bctx, KVP_TIER_DEVICE, b.bytes, &b.pool, &e);
	if (rc) {
		fprintf(stderr, "kvbench gpu: the device pool: %s\n", e.msg);
		goto fail;
	}
	CK(cudaMalloc((void **)&b.src, b.bytes));
	CK(cudaMalloc((void **)&b.d_slots, nslots * sizeof(struct kvp_slot)));
	CK(cudaMalloc((void **)&b.d_pslots, nslots * sizeof(struct kvp_slot)));
	CK(cudaMalloc((void **)&b.d_k, 2 * l->layers * sizeof(void *)));
	b.d_v = b.d_k + l->layers;

	/* Source bytes, a random permutation of every slot of the pool, and
	 * the per-layer views: view 2 * layer + kv is [tokens][heads][dim]. */
	h_src = malloc(b.bytes);
	h_img = malloc(b.bytes);
	slots = malloc(nslots * sizeof(*slots));
	pslots = malloc(nslots * sizeof(*pslots));
	perm = malloc(nslots * sizeof(*perm));
	h_ptrs = malloc(2 * l->layers * sizeof(void *));
	if (!h_src || !h_img || !slots || !pslots || !perm || !h_ptrs)
		goto nomem;
	fill_random(h_src, b.bytes, seed);
	for (uint64_t i = 0; i < nslots; i++)
		perm[i] = (uint32_t)i;
	for (uint64_t i = nslots; i > 1; i--) {
		uint64_t j = mix64(&seed) % i;
		uint32_t t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
	for (uint64_t i = 0; i < nslots; i++)
		slots[i] = (struct kvp_slot){ perm[i] / l->page_tokens,
					      perm[i] % l->page_tokens };
	for (uint32_t ly = 0; ly < l->layers; ly++) {
		h_ptrs[ly] = b.src + 2ull * ly * b.tokens * l->token_stride;
		h_ptrs[l->layers + ly] = b.src + (2ull * ly + 1) * b.tokens * l->token_stride;
	}
	CK(cudaMemcpy(b.src, h_src, b.bytes, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(b.d_slots, slots, nslots * sizeof(*slots), cudaMemcpyHostToDevice));
	/* The other order: pages shuffled, each page's slots in order. */
	for (uint64_t i = 0; i < a->pages; i++)
		perm[i] = (uint32_t)i;
	for (uint64_t i = a->pages; i > 1; i--) {
		uint64_t j = mix64(&seed) % i;
		uint32_t t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
	for (uint64_t i = 0; i < nslots; i++)
		pslots[i] = (struct kvp_slot){ perm[i / l->page_tokens],
					       (uint32_t)(i % l->page_tokens) };
	CK(cudaMemcpy(b.d_pslots, pslots, nslots * sizeof(*pslots),
		      cudaMemcpyHostToDevice));
	CK(cudaMemcpy(b.d_k, h_ptrs, 2 * l->layers * sizeof(void *),
		      cudaMemcpyHostToDevice));
	/* A pageable cudaMemcpy may return before its DMA lands, and our
	 * stream does not wait for the legacy one. */
	CK(cudaDeviceSynchronize());

	/* Warm up every path, then the repetitions, the order rotating. */
	for (int k = 0; k < NOPS; k++) {
		double t;

		if (timed(g, &b, (enum append_op)k, b.tokens, &t))
			goto fail;
	}
	for (uint64_t r = 0; r < o->reps; r++) {
		for (int k = 0; k < NOPS; k++) {
			enum append_op op = (enum append_op)((k + r) % NOPS);
			double t;

			if (timed(g, &b, op, b.tokens, &t))
				goto fail;
			all[op][r] = kvb_gbps(2 * b.bytes, t);
		}
	}
	a->gbps = median_of(all[OP_APPEND], o->reps);
	a->layers_gbps = median_of(all[OP_LAYERS], o->reps);
	a->pages_gbps = median_of(all[OP_PAGES], o->reps);
	a->d2d_gbps = median_of(all[OP_D2D], o->reps);

	/* The bytes: each kernel once more, then the pool against the C
	 * reference. */
	if (enqueue(g, &b, OP_APPEND, b.tokens))
		goto fail;
	CK(cudaStreamSynchronize(g->s[0]));
	CK(cudaMemcpy(h_img, b.pool.base, b.bytes, cudaMemcpyDeviceToHost));
	a->verified = check_append(l, h_img, slots, b.tokens, h_src);
	if (enqueue(g, &b, OP_LAYERS, b.tokens))
		goto fail;
	CK(cudaStreamSynchronize(g->s[0]));
	CK(cudaMemcpy(h_img, b.pool.base, b.bytes, cudaMemcpyDeviceToHost));
	a->layers_verified = check_layers(l, h_img, slots, b.tokens, h_src);

	if (lat && run_latency(g, o, &b, lat))
		goto fail;
out:
	if (b.pool.base || b.pool.fd >= 0)
		backend_cuda.tier_free(g->bctx, &b.pool);
	cudaFree(b.src);
	cudaFree(b.d_slots);
	cudaFree(b.d_pslots);
	cudaFree(b.d_k);
	free(h_src);
	free(h_img);
	free(slots);
	free(pslots);
	free(perm);
	free(h_ptrs);
	return rc;
nomem:
	fprintf(stderr, "kvbench gpu: out of memory\n");
fail:
	rc = -1;
	goto out;
}

/* ---------------------------------------------------------------- offload */

/* Raw pinned copies of bytes between the tiers, chunk bytes per call. */
static int raw_copy(struct gctx *g, void *dst, const void *src, uint64_t bytes,
		    uint64_t chunk, enum cudaMemcpyKind kind, double *out)
{
	uint64_t t0 = now_ns();
	int rc = 0;

	for (uint64_t off = 0; off < bytes; off += chunk)
		CK(cudaMemcpyAsync((char *)dst + off, (const char *)src + off,
				   chunk < bytes - off ? chunk : bytes - off, kind,
				   g->s[0]));
	CK(cudaStreamSynchronize(g->s[0]));
	*out = kvb_gbps(bytes, secs_since(t0));
out:
	return rc;
}

/* Half the bytes each way at once, on two streams. */
static int raw_bidir(struct gctx *g, const struct tier_mem *d,
		     const struct tier_mem *h, uint64_t bytes, double *out)
{
	uint64_t half = bytes / 2, t0 = now_ns();
	int rc = 0;

	CK(cudaMemcpyAsync(h->base, d->base, half, cudaMemcpyDeviceToHost, g->s[0]));
	CK(cudaMemcpyAsync((char *)d->base + half, (char *)h->base + half, half,
			   cudaMemcpyHostToDevice, g->s[1]));
	CK(cudaStreamSynchronize(g->s[0]));
	CK(cudaStreamSynchronize(g->s[1]));
	*out = kvb_gbps(2 * half, secs_since(t0));
out:
	return rc;
}

static struct kvp_stats engine_counters(struct engine *eng)
{
	struct kvp_stats s;

	engine_stats(eng, &s);
	return s;
}

/*
 * Both directions through the engine: users A (the first half) are moved to
 * the host tier only, users B (the rest) stay on the device only; then, on
 * the clock, a read-only prepare of every A (onload) and engine_offload_all
 * (which copies B: A's pages have host copies) back to back, until every
 * copy has landed. Where the engine's onload is asynchronous the two
 * directions overlap; where it is not, this is one after the other. Leaves
 * every user on the device only, as it found them.
 */
static int run_bidir(struct engine *eng, struct gpu_xfer *x,
		     uint64_t ppu, uint32_t ntok, uint64_t *leases, double *out)
{
	const uint64_t half = x->users / 2, page_bytes = x->bytes / x->pages;
	struct errbuf e = { .msg = "" };
	struct kvp_stats s0, s1;
	uint32_t skipped;
	uint64_t t0;
	double t;
	int rc = 0, n;

	*out = 0;
	if (!half)
		return 0;
	for (uint64_t u = 0; u < half; u++)
		if (engine_offload(eng, u + 1, &e) != (int)ppu ||
		    engine_evict(eng, u + 1, KVP_SEL_DEVICE, &e) != (int)ppu) {
			fprintf(stderr, "kvbench gpu: moving user %" PRIu64 " to the "
				"host tier: %s\n", u + 1, e.msg);
			return -1;
		}
	s0 = engine_counters(eng);
	t0 = now_ns();
	for (uint64_t u = 0; u < half; u++) {
		struct engine_lease lease;

		rc = engine_prepare(eng, u + 1, ntok, 0, 1, &lease, &e);
		if (rc < 0) {
			fprintf(stderr, "kvbench gpu: onload of user %" PRIu64 ": %s\n",
				u + 1, e.msg);
			return -1;
		}
		leases[u] = lease.id;
	}
	n = engine_offload_all(eng, &e);
	if (n < 0) {
		fprintf(stderr, "kvbench gpu: engine_offload_all: %s\n", e.msg);
		return -1;
	}
	CK(cudaDeviceSynchronize());
	t = secs_since(t0);
	s1 = engine_counters(eng);
	for (uint64_t u = 0; u < half; u++) {
		rc = engine_release(eng, leases[u], &e);
		if (rc < 0) {
			fprintf(stderr, "kvbench gpu: release: %s\n", e.msg);
			return -1;
		}
	}
	if ((uint64_t)n != (x->users - half) * ppu ||
	    s1.bytes_h2d - s0.bytes_h2d != half * ppu * page_bytes ||
	    s1.bytes_d2h - s0.bytes_d2h != (x->users - half) * ppu * page_bytes)
		x->counters_ok = false;
	*out = kvb_gbps(x->bytes, t);
	engine_evict_all(eng, KVP_SEL_HOST, &skipped);
out:
	return rc;
}

static int run_xfer(struct gctx *g, const struct gpu_opts *o, struct gpu_xfer *x)
{
	const struct kvp_layout *l = &o->layout;
	uint64_t total = (o->mib << 20) / l->page_bytes, ppu;
	double *raw[5] = { NULL }, *seq = NULL, *bidir = NULL;
	uint64_t *leases = NULL;
	struct engine_config ec = { .layout = *l };
	struct errbuf e = { .msg = "" };
	const struct tier_mem *d, *h;
	struct engine *eng = NULL;
	uint32_t ntok;
	int rc = 0;

	memset(x, 0, sizeof(*x));
	x->users = total < XFER_USERS ? total : XFER_USERS;
	ppu = total / x->users;
	x->pages = x->users * ppu;
	x->bytes = x->pages * l->page_bytes;
	ntok = (uint32_t)(ppu * l->page_tokens);
	x->offload_all = calloc(o->reps, sizeof(double));
	x->onload_all = calloc(o->reps, sizeof(double));
	seq = calloc(o->reps, sizeof(double));
	bidir = calloc(o->reps, sizeof(double));
	leases = calloc(XFER_USERS, sizeof(*leases));
	for (int k = 0; k < 5; k++)
		raw[k] = calloc(o->reps, sizeof(double));
	if (!x->offload_all || !x->onload_all || !seq || !bidir || !leases || !raw[0] || !raw[1] ||
	    !raw[2] || !raw[3] || !raw[4]) {
		fprintf(stderr, "kvbench gpu: out of memory\n");
		goto fail;
	}

	ec.device_frames = (uint32_t)x->pages;
	ec.host_frames = (uint32_t)x->pages;
	ec.backend = &backend_cuda;
	ec.backend_ctx = g->bctx;
	rc = engine_create(&eng, &ec, &e);
	if (rc) {
		fprintf(stderr, "kvbench gpu: engine_create on the cuda backend: %s\n",
			e.msg);
		goto fail;
	}
	d = engine_tier(eng, KVP_TIER_DEVICE);
	h = engine_tier(eng, KVP_TIER_HOST);
	for (uint64_t u = 0; u < x->users; u++) {
		struct engine_lease lease;

		if ((rc = engine_prepare(eng, u + 1, 0, ntok, 1, &lease, &e)) < 0 ||
		    (rc = engine_commit(eng, lease.id, ntok, &e)) < 0 ||
		    (rc = engine_release(eng, lease.id, &e)) < 0) {
			fprintf(stderr, "kvbench gpu: filling user %" PRIu64 ": %s\n",
				u + 1, e.msg);
			goto fail;
		}
	}

	x->counters_ok = true;
	if (raw_copy(g, h->base, d->base, x->bytes, x->bytes, cudaMemcpyDeviceToHost,
		     &raw[0][0])) /* warm-up */
		goto fail;
	for (uint64_t r = 0; r < o->reps; r++) {
		struct kvp_stats s0, s1;
		uint32_t skipped;
		uint64_t t0;
		double toff, ton;
		int n;

		if (raw_copy(g, h->base, d->base, x->bytes, x->bytes,
			     cudaMemcpyDeviceToHost, &raw[0][r]) ||
		    raw_copy(g, d->base, h->base, x->bytes, x->bytes,
			     cudaMemcpyHostToDevice, &raw[1][r]) ||
		    raw_copy(g, h->base, d->base, x->bytes, l->page_bytes,
			     cudaMemcpyDeviceToHost, &raw[2][r]) ||
		    raw_copy(g, d->base, h->base, x->bytes, l->page_bytes,
			     cudaMemcpyHostToDevice, &raw[3][r]) ||
		    raw_bidir(g, d, h, x->bytes, &raw[4][r]))
			goto fail;

		/* Offload: every device page to the host tier. */
		s0 = engine_counters(eng);
		t0 = now_ns();
		n = engine_offload_all(eng, &e);
		toff = secs_since(t0);
		if (n < 0) {
			fprintf(stderr, "kvbench gpu: engine_offload_all: %s\n", e.msg);
			goto fail;
		}
		s1 = engine_counters(eng);
		if ((uint64_t)n != x->pages || s1.bytes_d2h - s0.bytes_d2h != x->bytes)
			x->counters_ok = false;

		/* Drop the device copies (the host has them: nothing copied). */
		if (engine_evict_all(eng, KVP_SEL_DEVICE, &skipped) != (int)x->users ||
		    engine_counters(eng).bytes_d2h != s1.bytes_d2h)
			x->counters_ok = false;

		/* Onload: a read-only prepare of every user, then wait until
		 * the copies have landed (where the engine onloads
		 * asynchronously, a prepare only enqueues its copy: the
		 * backend's stream is idle once every one has landed), then
		 * release them all, untimed. */
		t0 = now_ns();
		for (uint64_t u = 0; u < x->users; u++) {
			struct engine_lease lease;

			rc = engine_prepare(eng, u + 1, ntok, 0, 1, &lease, &e);
			if (rc < 0) {
				fprintf(stderr, "kvbench gpu: onload of user %" PRIu64
					": %s\n", u + 1, e.msg);
				goto fail;
			}
			if (lease.onloaded_pages != ppu)
				x->counters_ok = false;
			leases[u] = lease.id;
		}
		CK(cudaDeviceSynchronize());
		ton = secs_since(t0);
		for (uint64_t u = 0; u < x->users; u++) {
			rc = engine_release(eng, leases[u], &e);
			if (rc < 0) {
				fprintf(stderr, "kvbench gpu: release: %s\n", e.msg);
				goto fail;
			}
		}
		if (engine_counters(eng).bytes_h2d - s1.bytes_h2d != x->bytes)
			x->counters_ok = false;
		x->offload_all[r] = kvb_gbps(x->bytes, toff);
		x->onload_all[r] = kvb_gbps(x->bytes, ton);
		seq[r] = kvb_gbps(2 * x->bytes, toff + ton);

		/* Free the host copies for the next step. */
		engine_evict_all(eng, KVP_SEL_HOST, &skipped);

		if (run_bidir(eng, x, ppu, ntok, leases, &bidir[r]))
			goto fail;
	}
	rc = 0;
	x->raw_d2h_gbps = median_of(raw[0], o->reps);
	x->raw_h2d_gbps = median_of(raw[1], o->reps);
	x->raw_d2h_page_gbps = median_of(raw[2], o->reps);
	x->raw_h2d_page_gbps = median_of(raw[3], o->reps);
	x->raw_bidir_gbps = median_of(raw[4], o->reps);
	x->offload_gbps = median_of(x->offload_all, o->reps);
	x->onload_gbps = median_of(x->onload_all, o->reps);
	x->seq_gbps = median_of(seq, o->reps);
	x->bidir_gbps = median_of(bidir, o->reps);
	if (engine_check(eng, &e)) {
		fprintf(stderr, "kvbench gpu: engine_check: %s\n", e.msg);
		x->counters_ok = false;
	}
	if (!x->counters_ok)
		fprintf(stderr, "kvbench gpu: the engine's counters do not match the "
			"pages offloaded and onloaded\n");
out:
	if (eng)
		engine_destroy(eng);
	free(seq);
	free(bidir);
	free(leases);
	for (int k = 0; k < 5; k++)
		free(raw[k]);
	return rc;
fail:
	rc = -1;
	goto out;
}

/* ---------------------------------------------------------------- machine */

/*
 * The kernel module's version from /proc/driver/nvidia/version: the first
 * word after "Kernel Module" that is digits and dots ("NVRM version: NVIDIA
 * UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...").
 */
static void driver_version(char *buf, size_t len)
{
	char line[512], *p, *save = NULL;
	FILE *f = fopen("/proc/driver/nvidia/version", "r");

	buf[0] = '\0';
	if (!f)
		return;
	if (fgets(line, sizeof(line), f) && (p = strstr(line, "Kernel Module"))) {
		for (p = strtok_r(p, " \t\n", &save); p; p = strtok_r(NULL, " \t\n", &save)) {
			if (p[0] >= '0' && p[0] <= '9' && strchr(p, '.') &&
			    strspn(p, "0123456789.") == strlen(p)) {
				snprintf(buf, len, "%s", p);
				break;
			}
		}
	}
	fclose(f);
}

static int gpu_info(int dev, struct gpu_machine *m)
{
	struct cudaDeviceProp p;
	int rc = 0;

	memset(m, 0, sizeof(*m));
	CK(cudaGetDeviceProperties(&p, dev));
	snprintf(m->name, sizeof(m->name), "%s", p.name);
	m->cc_major = p.major;
	m->cc_minor = p.minor;
	m->sms = p.multiProcessorCount;
	m->memory_bytes = p.totalGlobalMem;
	CK(cudaDeviceGetPCIBusId(m->pci_bus_id, sizeof(m->pci_bus_id), dev));
	CK(cudaDriverGetVersion(&m->cuda_driver));
	CK(cudaRuntimeGetVersion(&m->cuda_runtime));
	driver_version(m->driver, sizeof(m->driver));
out:
	return rc;
}

/* ---------------------------------------------------------------- run */

static void gctx_close(struct gctx *g)
{
	for (int k = 0; k < 2; k++) {
		if (g->ev[k])
			cudaEventDestroy(g->ev[k]);
		if (g->s[k])
			cudaStreamDestroy(g->s[k]);
	}
	if (g->bctx)
		backend_cuda_close(g->bctx);
}

int gpu_measure(const struct gpu_opts *o, struct gpu_results *r, bool *measured)
{
	struct gctx g = { .device = (int)o->device };
	struct errbuf e = { .msg = "" };
	size_t free_b = 0, total_b = 0;
	uint64_t need;
	cudaError_t ce;
	int n = 0, rc = 0, status = KVB_EXIT_OK;

	*measured = false;
	memset(r, 0, sizeof(*r));
	kvb_machine_info(&r->host, -1);
	ce = cudaGetDeviceCount(&n);
	if (ce != cudaSuccess || n == 0) {
		fprintf(stderr, "kvbench gpu: no CUDA device on this machine (%s)\n",
			ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
		return KVB_EXIT_FAIL;
	}
	if (o->device >= (uint64_t)n)
		return kvb_usage_error(SUB, "--device %" PRIu64 ": this machine has %d "
				       "CUDA device(s), 0 to %d", o->device, n, n - 1);
	CK(cudaSetDevice(g.device));
	if (gpu_info(g.device, &r->gpu))
		goto fail;
	CK(cudaMemGetInfo(&free_b, &total_b));
	/* The append part holds a pool and a source of --mib each. */
	need = 2 * (o->mib << 20) + (256ull << 20);
	if (need > free_b)
		return kvb_usage_error(SUB, "--mib %" PRIu64 " needs %" PRIu64 " MiB of "
				       "GPU memory and device %d has %zu MiB free; "
				       "lower --mib", o->mib, need >> 20, g.device,
				       free_b >> 20);
	if (backend_cuda_open(g.device, &g.bctx, &e)) {
		fprintf(stderr, "kvbench gpu: %s\n", e.msg);
		goto fail;
	}
	for (int k = 0; k < 2; k++) {
		CK(cudaStreamCreateWithFlags(&g.s[k], cudaStreamNonBlocking));
		CK(cudaEventCreate(&g.ev[k]));
	}

	if (run_append(&g, o, &o->layout, &r->append, &r->lat) ||
	    run_append(&g, o, &o->small, &r->small, NULL) ||
	    run_xfer(&g, o, &r->xfer))
		goto fail;
	*measured = true;
	if (!r->append.verified || !r->append.layers_verified ||
	    !r->small.verified || !r->small.layers_verified || !r->xfer.counters_ok)
		status = KVB_EXIT_FAIL;
out:
	gctx_close(&g);
	return rc ? KVB_EXIT_FAIL : status;
fail:
	rc = -1;
	goto out;
}

void gpu_results_free(struct gpu_results *r)
{
	struct gpu_append *a[2] = { &r->append, &r->small };

	for (int k = 0; k < 2; k++) {
		free(a[k]->gbps_all);
		free(a[k]->layers_gbps_all);
		free(a[k]->pages_gbps_all);
		free(a[k]->d2d_gbps_all);
	}
	free(r->xfer.offload_all);
	free(r->xfer.onload_all);
}
