/* SPDX-License-Identifier: MIT */
/*
 * bench_prefix_gpu.c - `kvbench prefix --gpu`: what a cache hit saves for
 * one context of --gpu-tokens tokens (default 4,000) in Llama-3-8B's
 * geometry (32 layers, 8 KV heads, head_dim 128, bf16, 16 tokens a page:
 * 2 MiB pages). Built only with CUDA.
 *
 *  1. Recompute: the prefill of those tokens, run for real with cuBLAS on
 *     the model's shapes: per layer the QKV projection 4096 -> 6144, the
 *     O projection 4096 -> 4096, gate+up 4096 -> 2 x 14336 and down
 *     14336 -> 4096 (cublasGemmEx, bf16 in and out, fp32 accumulate,
 *     weights [out][in] as a Linear stores them, distinct per layer), and
 *     causal attention as GEMMs: for each block of 512 query rows, S = Q K^T
 *     against the keys up to the block's end, then S V (strided-batched
 *     over the 32 query heads, GQA's 8 KV heads expanded). Not run, so the
 *     recompute is cheaper than a real one: softmax, RoPE, norms, the SiLU,
 *     residuals, embedding, the LM head, and writing the new KV into the
 *     pool. Linear-only, attention-only and the whole prefill are each
 *     timed with CUDA events around all 32 layers, --gpu-reps times after
 *     two warm-ups; medians.
 *
 *  2. Device-tier hit: the engine on the cuda backend (backend_cuda_open,
 *     as `kvbench gpu`); a sequence of the context's tokens is allocated,
 *     its KV appended with kvp_append_cuda, committed and freed, so its
 *     pages stay in the prefix cache. Then share_seq_alloc(context + 1 new
 *     token) is timed with the wall clock: the KV of the context is ready
 *     when the page table is back. Also share_chunk_acquire of the same
 *     tokens registered as a chunk. Pages read back and compared.
 *
 *  3. Host-tier hit: a user history of the same tokens, offloaded to the
 *     pinned host tier and evicted from the device; then engine_prepare
 *     (one new token) and engine_fence_wait until its onload has landed,
 *     timed with the wall clock. A raw pinned cudaMemcpyAsync of the same
 *     bytes (separate buffers) is the ceiling.
 *
 * reuse_speedup = recompute / device-tier hit; reuse_speedup_host =
 * recompute / host-tier hit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kvpool_engine.h"
#include "kvp_kernels.h"
#include "prefix_bench.h"
#include "stats.h"

#define LLAMA_LAYOUT "layers=32,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=16"
#define HIDDEN 4096
#define QKV_OUT (4096 + 2 * 1024)
#define MLP 14336
#define LAYERS 32
#define Q_HEADS 32
#define HEAD_DIM 128
#define ATT_BLOCK 512
#define WARMUP 2
#define HIT_SAMPLES 200
#define OWNER 1

struct gpu {
	cublasHandle_t h;
	cudaStream_t s;
	cudaEvent_t ev[2];
	uint32_t T;
	/* Weights, per layer: [out][in] bf16. */
	void *wqkv[LAYERS], *wo[LAYERS], *wgu[LAYERS], *wd[LAYERS];
	/* Activations (random, not chained: only the shapes matter here). */
	void *x, *attn_in, *mlp_in, *y_qkv, *y_o, *y_gu, *y_d;
	void *q, *k, *v, *scores, *att_out;
	double linear_flops, attn_flops;
	char *err;
	size_t errlen;
};

static int cuda_err(struct gpu *g, const char *what, cudaError_t e)
{
	snprintf(g->err, g->errlen, "%s: %s", what, cudaGetErrorString(e));
	return -1;
}

static int blas_err(struct gpu *g, const char *what, cublasStatus_t st)
{
	snprintf(g->err, g->errlen, "%s: cuBLAS status %d", what, (int)st);
	return -1;
}

#define CK(g, call)							\
	do {								\
		cudaError_t e_ = (call);				\
		if (e_ != cudaSuccess)					\
			return cuda_err(g, #call, e_);			\
	} while (0)

#define BK(g, call)							\
	do {								\
		cublasStatus_t s_ = (call);				\
		if (s_ != CUBLAS_STATUS_SUCCESS)			\
			return blas_err(g, #call, s_);			\
	} while (0)

static uint64_t mix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ------------------------------------------------------------ buffers */

#define SRC_BYTES (256ull << 20)

/* A device buffer of n bf16 values in [-0.05, 0.05), copied from src. */
static int alloc_random(struct gpu *g, void **out, uint64_t n, const void *src)
{
	uint64_t bytes = n * 2;

	CK(g, cudaMalloc(out, bytes));
	for (uint64_t off = 0; off < bytes; off += SRC_BYTES) {
		uint64_t c = bytes - off < SRC_BYTES ? bytes - off : SRC_BYTES;

		CK(g, cudaMemcpyAsync((char *)*out + off, src, c, cudaMemcpyDeviceToDevice, g->s));
	}
	return 0;
}

static int gpu_setup(struct gpu *g)
{
	const uint64_t T = g->T;
	uint16_t *host = malloc(SRC_BYTES);
	uint64_t rng = 0x7072656669782d67ull;
	void *src = NULL;
	int rc = -1;

	if (!host) {
		snprintf(g->err, g->errlen, "out of host memory");
		return -1;
	}
	for (uint64_t i = 0; i < SRC_BYTES / 2; i++) {
		float f = (float)((double)(mix64(&rng) >> 11) * 0x1p-53 - 0.5) * 0.1f;
		uint32_t bits;

		memcpy(&bits, &f, 4);
		host[i] = (uint16_t)(bits >> 16);
	}
	if (cudaMalloc(&src, SRC_BYTES) != cudaSuccess ||
	    cudaMemcpy(src, host, SRC_BYTES, cudaMemcpyHostToDevice) != cudaSuccess) {
		snprintf(g->err, g->errlen, "cudaMalloc/cudaMemcpy of the random source failed");
		goto out;
	}
	for (int l = 0; l < LAYERS; l++) {
		if (alloc_random(g, &g->wqkv[l], (uint64_t)QKV_OUT * HIDDEN, src) ||
		    alloc_random(g, &g->wo[l], (uint64_t)HIDDEN * HIDDEN, src) ||
		    alloc_random(g, &g->wgu[l], 2ull * MLP * HIDDEN, src) ||
		    alloc_random(g, &g->wd[l], (uint64_t)HIDDEN * MLP, src))
			goto out;
	}
	if (alloc_random(g, &g->x, T * HIDDEN, src) ||
	    alloc_random(g, &g->attn_in, T * HIDDEN, src) ||
	    alloc_random(g, &g->mlp_in, T * MLP, src) ||
	    alloc_random(g, &g->y_qkv, T * QKV_OUT, src) ||
	    alloc_random(g, &g->y_o, T * HIDDEN, src) ||
	    alloc_random(g, &g->y_gu, T * 2 * MLP, src) ||
	    alloc_random(g, &g->y_d, T * HIDDEN, src) ||
	    alloc_random(g, &g->q, (uint64_t)Q_HEADS * T * HEAD_DIM, src) ||
	    alloc_random(g, &g->k, (uint64_t)Q_HEADS * T * HEAD_DIM, src) ||
	    alloc_random(g, &g->v, (uint64_t)Q_HEADS * T * HEAD_DIM, src) ||
	    alloc_random(g, &g->scores, (uint64_t)Q_HEADS * ATT_BLOCK * T, src) ||
	    alloc_random(g, &g->att_out, (uint64_t)Q_HEADS * T * HEAD_DIM, src))
		goto out;
	if (cudaStreamSynchronize(g->s) != cudaSuccess) {
		snprintf(g->err, g->errlen, "filling the GEMM buffers failed");
		goto out;
	}
	g->linear_flops = 2.0 * T * LAYERS *
			  ((double)HIDDEN * QKV_OUT + (double)HIDDEN * HIDDEN +
			   (double)HIDDEN * 2 * MLP + (double)MLP * HIDDEN);
	g->attn_flops = 0;
	for (uint64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
		uint64_t rb = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, c = r0 + rb;

		g->attn_flops += 2.0 * 2.0 * Q_HEADS * (double)rb * (double)c * HEAD_DIM;
	}
	g->attn_flops *= LAYERS;
	rc = 0;
out:
	free(host);
	if (src)
		cudaFree(src);
	return rc;
}

static void gpu_teardown(struct gpu *g)
{
	void *bufs[] = { g->x, g->attn_in, g->mlp_in, g->y_qkv, g->y_o, g->y_gu, g->y_d,
			 g->q, g->k, g->v, g->scores, g->att_out };

	for (int l = 0; l < LAYERS; l++) {
		cudaFree(g->wqkv[l]);
		cudaFree(g->wo[l]);
		cudaFree(g->wgu[l]);
		cudaFree(g->wd[l]);
	}
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		cudaFree(bufs[i]);
}

/* ------------------------------------------------------------ recompute */

/* y[T][out] = x[T][in] . w[out][in]^T (column-major: y^T = w^T' x^T). */
static int linear(struct gpu *g, const void *w, const void *x, void *y, int in, int out)
{
	const float one = 1.0f, zero = 0.0f;

	BK(g, cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, out, (int)g->T, in, &one,
			   w, CUDA_R_16BF, in, x, CUDA_R_16BF, in, &zero, y, CUDA_R_16BF,
			   out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	return 0;
}

static int layer_linear(struct gpu *g, int l)
{
	if (linear(g, g->wqkv[l], g->x, g->y_qkv, HIDDEN, QKV_OUT) ||
	    linear(g, g->wo[l], g->attn_in, g->y_o, HIDDEN, HIDDEN) ||
	    linear(g, g->wgu[l], g->x, g->y_gu, HIDDEN, 2 * MLP) ||
	    linear(g, g->wd[l], g->mlp_in, g->y_d, MLP, HIDDEN))
		return -1;
	return 0;
}

/*
 * Causal attention of one layer as GEMMs, per block of query rows [r0,
 * r0 + rb) against keys [0, c): S^T[c][rb] = K[0,c) Q[r0..]^T, then
 * O^T[128][rb] = V^T S^T, batched over the heads ([head][T][128] buffers).
 */
static int layer_attention(struct gpu *g)
{
	const float one = 1.0f, zero = 0.0f;
	const long long hs = (long long)g->T * HEAD_DIM, ss = (long long)ATT_BLOCK * g->T;

	for (uint32_t r0 = 0; r0 < g->T; r0 += ATT_BLOCK) {
		int rb = (int)(g->T - r0 < ATT_BLOCK ? g->T - r0 : ATT_BLOCK);
		int c = (int)r0 + rb;

		BK(g, cublasGemmStridedBatchedEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, c, rb,
						 HEAD_DIM, &one, g->k, CUDA_R_16BF, HEAD_DIM,
						 hs, (char *)g->q + (uint64_t)r0 * HEAD_DIM * 2,
						 CUDA_R_16BF, HEAD_DIM, hs, &zero, g->scores,
						 CUDA_R_16BF, c, ss, Q_HEADS,
						 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		BK(g, cublasGemmStridedBatchedEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, HEAD_DIM,
						 rb, c, &one, g->v, CUDA_R_16BF, HEAD_DIM, hs,
						 g->scores, CUDA_R_16BF, c, ss, &zero,
						 (char *)g->att_out + (uint64_t)r0 * HEAD_DIM * 2,
						 CUDA_R_16BF, HEAD_DIM, hs, Q_HEADS,
						 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	}
	return 0;
}

enum pass { PASS_LINEAR, PASS_ATTN, PASS_ALL };

/* One prefill pass of all layers between two events; ms into *ms. */
static int timed_pass(struct gpu *g, enum pass p, double *ms)
{
	float f = 0;

	CK(g, cudaEventRecord(g->ev[0], g->s));
	for (int l = 0; l < LAYERS; l++) {
		if (p != PASS_ATTN && layer_linear(g, l))
			return -1;
		if (p != PASS_LINEAR && layer_attention(g))
			return -1;
	}
	CK(g, cudaEventRecord(g->ev[1], g->s));
	CK(g, cudaEventSynchronize(g->ev[1]));
	CK(g, cudaEventElapsedTime(&f, g->ev[0], g->ev[1]));
	*ms = f;
	return 0;
}

static int measure_recompute(struct gpu *g, uint64_t reps, struct pb_gpu_result *r)
{
	double *t[3];
	double med[3];
	int rc = -1;

	for (int k = 0; k < 3; k++)
		t[k] = calloc(reps + WARMUP, sizeof(double));
	if (!t[0] || !t[1] || !t[2]) {
		snprintf(g->err, g->errlen, "out of memory");
		goto out;
	}
	/* Passes interleaved so drift hits all three alike. */
	for (uint64_t i = 0; i < reps + WARMUP; i++)
		for (int k = 0; k < 3; k++)
			if (timed_pass(g, (enum pass)k, &t[k][i]))
				goto out;
	for (int k = 0; k < 3; k++)
		med[k] = median_f64(t[k] + WARMUP, reps);
	r->recompute_linear_ms = med[PASS_LINEAR];
	r->recompute_attn_ms = med[PASS_ATTN];
	r->recompute_ms = med[PASS_ALL];
	r->linear_flops = g->linear_flops;
	r->attn_flops = g->attn_flops;
	r->recompute_tflops = (g->linear_flops + g->attn_flops) / (r->recompute_ms * 1e-3) * 1e-12;
	rc = 0;
out:
	for (int k = 0; k < 3; k++)
		free(t[k]);
	return rc;
}

/* ------------------------------------------------------------ cache hits */

struct hitctx {
	struct engine *eng;
	const struct kvp_layout *l;
	void *dev_base;
	void *d_kv;               /* [T][token_bytes] device, random */
	struct kvp_slot *slots;
	struct kvp_slot *d_slots;
	uint32_t *tokens;         /* T + 1 */
	uint32_t T;
	struct errbuf e;
	char *err;
	size_t errlen;
};

static int eng_fail(struct hitctx *h, const char *what)
{
	snprintf(h->err, h->errlen, "%s: %s", what, h->e.msg);
	return -1;
}

/* Write the lease's T new tokens from d_kv (token i = row i). */
static int fill_lease(struct hitctx *h, uint64_t lease)
{
	cudaError_t ce;

	if (engine_lease_slots(h->eng, lease, 0, h->T, h->slots, &h->e) < 0)
		return eng_fail(h, "engine_lease_slots");
	ce = cudaMemcpy(h->d_slots, h->slots, h->T * sizeof(*h->slots), cudaMemcpyHostToDevice);
	if (ce != cudaSuccess) {
		snprintf(h->err, h->errlen, "cudaMemcpy(slots): %s", cudaGetErrorString(ce));
		return -1;
	}
	if (kvp_append_cuda(h->l, h->dev_base, h->d_slots, h->T, h->d_kv, NULL) ||
	    cudaDeviceSynchronize() != cudaSuccess) {
		snprintf(h->err, h->errlen, "kvp_append_cuda: %s", kvp_kernels_error());
		return -1;
	}
	return 0;
}

/* Page j of frames[] must hold tokens [16 j, 16 j + 16) of d_kv. */
static bool check_page(struct hitctx *h, uint32_t frame, uint32_t j)
{
	const struct kvp_layout *l = h->l;
	uint32_t P = l->page_tokens, n = h->T - j * P < P ? h->T - j * P : P;
	unsigned char *page = malloc(l->page_bytes), *want = malloc(P * l->token_bytes);
	unsigned char *got = malloc(P * l->token_bytes);
	struct kvp_slot s[64];
	bool ok = page && want && got && P <= 64;

	if (ok)
		ok = cudaMemcpy(page, (char *)h->dev_base + (uint64_t)frame * l->page_bytes,
				l->page_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
		     cudaMemcpy(want, (char *)h->d_kv + (uint64_t)j * P * l->token_bytes,
				n * l->token_bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
	if (ok) {
		for (uint32_t i = 0; i < n; i++)
			s[i] = (struct kvp_slot){ .frame = 0, .slot = i };
		kvp_read_cpu(l, page, s, n, got);
		ok = !memcmp(got, want, n * l->token_bytes);
	}
	free(page);
	free(want);
	free(got);
	return ok;
}

static int device_hit(struct hitctx *h, struct pb_gpu_result *r)
{
	struct samples sa = { 0 }, sc = { 0 };
	struct share_chunk_reg reg;
	struct engine_lease el;
	struct summary sum;
	int rc = -1;

	/* The context's pages into the prefix cache. */
	if (share_seq_alloc(h->eng, 1, h->tokens, h->T, OWNER, &el, &h->e) < 0)
		return eng_fail(h, "share_seq_alloc (fill)");
	if (fill_lease(h, el.id))
		return -1;
	if (engine_commit(h->eng, el.id, h->T, &h->e) < 0 ||
	    engine_release(h->eng, el.id, &h->e) < 0 ||
	    share_seq_free(h->eng, 1, OWNER, &h->e) < 0)
		return eng_fail(h, "commit/release/free (fill)");
	/* The same tokens as a chunk. */
	if (share_chunk_register(h->eng, h->tokens, h->T, KVP_CHUNK_CONTEXT, NULL, OWNER, 0,
				 &reg, &h->e) < 0 || !reg.created)
		return eng_fail(h, "share_chunk_register");
	if (fill_lease(h, reg.lease.id))
		return -1;
	if (share_chunk_seal(h->eng, reg.lease.id, OWNER, &h->e) < 0)
		return eng_fail(h, "share_chunk_seal");

	if (samples_init(&sa, HIT_SAMPLES) || samples_init(&sc, HIT_SAMPLES)) {
		snprintf(h->err, h->errlen, "out of memory");
		goto out;
	}
	r->verified = true;
	for (uint32_t i = 0; i < HIT_SAMPLES + 10; i++) {
		uint64_t seq = 100 + i, t0, t1;

		t0 = now_ns();
		rc = share_seq_alloc(h->eng, seq, h->tokens, h->T + 1, OWNER, &el, &h->e);
		t1 = now_ns();
		if (rc < 0) {
			rc = eng_fail(h, "share_seq_alloc (hit)");
			goto out;
		}
		if (i >= 10)
			samples_add(&sa, t1 - t0);
		r->device_hit_tokens = el.len;
		if (i == 0) {
			uint32_t np = (uint32_t)(el.len / h->l->page_tokens);

			if (np == 0 || !check_page(h, el.frames[0], 0) ||
			    !check_page(h, el.frames[np / 2], np / 2) ||
			    !check_page(h, el.frames[np - 1], np - 1))
				r->verified = false;
		}
		if (engine_release(h->eng, el.id, &h->e) < 0 ||
		    share_seq_free(h->eng, seq, OWNER, &h->e) < 0) {
			rc = eng_fail(h, "release/free (hit)");
			goto out;
		}

		t0 = now_ns();
		rc = share_chunk_acquire(h->eng, &reg.id, OWNER, 0, &el, &h->e);
		t1 = now_ns();
		if (rc < 0) {
			rc = eng_fail(h, "share_chunk_acquire");
			goto out;
		}
		if (i >= 10)
			samples_add(&sc, t1 - t0);
		if (i == 0 && !check_page(h, el.frames[0], 0))
			r->verified = false;
		if (engine_release(h->eng, el.id, &h->e) < 0) {
			rc = eng_fail(h, "release (chunk)");
			goto out;
		}
	}
	if (r->device_hit_tokens != (h->T / h->l->page_tokens) * h->l->page_tokens)
		r->verified = false;
	samples_summarize(&sa, &sum);
	r->device_hit_us = sum.p50 * 1e-3;
	r->device_hit_p99_us = sum.p99 * 1e-3;
	samples_summarize(&sc, &sum);
	r->chunk_hit_us = sum.p50 * 1e-3;
	rc = 0;
out:
	samples_free(&sa);
	samples_free(&sc);
	return rc;
}

static int host_hit(struct hitctx *h, uint64_t reps, struct pb_gpu_result *r)
{
	const uint64_t user = 7;
	double *t = calloc(reps, sizeof(double));
	struct engine_lease el;
	uint32_t onloaded = 0;
	int rc = -1;

	if (!t) {
		snprintf(h->err, h->errlen, "out of memory");
		return -1;
	}
	if (engine_prepare(h->eng, user, 0, h->T, OWNER, &el, &h->e) < 0) {
		eng_fail(h, "engine_prepare (fill)");
		goto out;
	}
	if (fill_lease(h, el.id))
		goto out;
	if (engine_commit(h->eng, el.id, h->T, &h->e) < 0 ||
	    engine_release(h->eng, el.id, &h->e) < 0 ||
	    engine_offload(h->eng, user, &h->e) < 0) {
		eng_fail(h, "commit/release/offload");
		goto out;
	}
	for (uint64_t i = 0; i < reps; i++) {
		uint64_t t0;

		if (engine_evict(h->eng, user, KVP_SEL_DEVICE, &h->e) < 0) {
			eng_fail(h, "engine_evict (device)");
			goto out;
		}
		t0 = now_ns();
		if (engine_prepare(h->eng, user, h->T, 1, OWNER, &el, &h->e) < 0) {
			eng_fail(h, "engine_prepare (onload)");
			goto out;
		}
		engine_fence_wait(h->eng, el.fence);
		t[i] = (double)(now_ns() - t0) * 1e-6;
		onloaded = el.onloaded_pages;
		if (i == 0 && (!check_page(h, el.frames[0], 0) ||
			       !check_page(h, el.frames[el.npages - 2], el.npages - 2)))
			r->verified = false;
		if (engine_release(h->eng, el.id, &h->e) < 0) {
			eng_fail(h, "engine_release (onload)");
			goto out;
		}
	}
	r->host_hit_ms = median_f64(t, reps);
	r->host_onloaded_pages = onloaded;
	r->host_hit_gbps = (double)onloaded * h->l->page_bytes / (r->host_hit_ms * 1e-3) * 1e-9;
	rc = 0;
out:
	free(t);
	return rc;
}

/* One pinned H2D cudaMemcpyAsync of bytes, median of reps, in GB/s. */
static double h2d_ceiling(uint64_t bytes, uint64_t reps)
{
	void *hbuf = NULL, *dbuf = NULL;
	double *t = calloc(reps, sizeof(double)), gbps = 0;
	cudaEvent_t ev[2] = { NULL, NULL };

	if (!t || cudaHostAlloc(&hbuf, bytes, cudaHostAllocDefault) != cudaSuccess ||
	    cudaMalloc(&dbuf, bytes) != cudaSuccess || cudaEventCreate(&ev[0]) != cudaSuccess ||
	    cudaEventCreate(&ev[1]) != cudaSuccess)
		goto out;
	memset(hbuf, 0x5a, bytes);
	for (uint64_t i = 0; i < reps; i++) {
		float ms = 0;

		if (cudaEventRecord(ev[0], NULL) != cudaSuccess ||
		    cudaMemcpyAsync(dbuf, hbuf, bytes, cudaMemcpyHostToDevice, NULL) != cudaSuccess ||
		    cudaEventRecord(ev[1], NULL) != cudaSuccess ||
		    cudaEventSynchronize(ev[1]) != cudaSuccess ||
		    cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess)
			goto out;
		t[i] = ms;
	}
	gbps = (double)bytes / (median_f64(t, reps) * 1e-3) * 1e-9;
out:
	if (ev[0])
		cudaEventDestroy(ev[0]);
	if (ev[1])
		cudaEventDestroy(ev[1]);
	cudaFreeHost(hbuf);
	cudaFree(dbuf);
	free(t);
	return gbps;
}

static int measure_hits(const struct prefix_opts *o, struct pb_gpu_result *r,
			char *err, size_t errlen)
{
	struct hitctx h = { .T = (uint32_t)o->gpu_tokens, .err = err, .errlen = errlen };
	struct kvp_layout layout;
	struct engine_config ec;
	void *bctx = NULL;
	uint64_t rng = o->w.seed ^ 0x6770752d68697473ull, pages;
	int rc = -1;

	if (kvp_layout_parse(&layout, LLAMA_LAYOUT, err, errlen) < 0)
		return -1;
	pages = pw_pages(h.T + 1, layout.page_tokens);
	r->pages = h.T / layout.page_tokens;
	r->page_bytes = layout.page_bytes;
	if (backend_cuda_open((int)o->gpu_device, &bctx, &h.e)) {
		snprintf(err, errlen, "backend_cuda_open: %s", h.e.msg);
		return -1;
	}
	memset(&ec, 0, sizeof(ec));
	ec.layout = layout;
	/* The sequence's pages, the chunk's, the history's and a hit's new page. */
	ec.device_frames = (uint32_t)(4 * pages + 16);
	ec.host_frames = (uint32_t)(pages + 16);
	ec.backend = &backend_cuda;
	ec.backend_ctx = bctx;
	if (engine_create(&h.eng, &ec, &h.e)) {
		snprintf(err, errlen, "engine_create on the cuda backend: %s", h.e.msg);
		goto out;
	}
	h.l = engine_layout(h.eng);
	h.dev_base = engine_tier(h.eng, KVP_TIER_DEVICE)->base;
	h.tokens = malloc((h.T + 1) * sizeof(*h.tokens));
	h.slots = malloc(h.T * sizeof(*h.slots));
	if (!h.tokens || !h.slots || cudaMalloc((void **)&h.d_slots, h.T * sizeof(*h.slots)) ||
	    cudaMalloc(&h.d_kv, (uint64_t)h.T * h.l->token_bytes)) {
		snprintf(err, errlen, "out of memory for %u tokens of KV", h.T);
		goto out;
	}
	for (uint32_t i = 0; i <= h.T; i++)
		h.tokens[i] = (uint32_t)(mix64(&rng) % PW_VOCAB);
	{
		unsigned char *tmp = malloc(h.l->token_bytes);

		if (!tmp)
			goto out;
		for (uint32_t i = 0; i < h.T; i++) {
			for (uint64_t b = 0; b < h.l->token_bytes; b += 8) {
				uint64_t v = mix64(&rng);

				memcpy(tmp + b, &v, 8);
			}
			if (cudaMemcpy((char *)h.d_kv + (uint64_t)i * h.l->token_bytes, tmp,
				       h.l->token_bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
				free(tmp);
				snprintf(err, errlen, "cudaMemcpy of the context's KV failed");
				goto out;
			}
		}
		free(tmp);
	}
	if (device_hit(&h, r) || host_hit(&h, o->gpu_reps, r))
		goto out;
	r->h2d_ceiling_gbps = h2d_ceiling(r->host_onloaded_pages * h.l->page_bytes, o->gpu_reps);
	rc = 0;
out:
	if (h.eng)
		engine_destroy(h.eng);
	cudaFree(h.d_slots);
	cudaFree(h.d_kv);
	free(h.tokens);
	free(h.slots);
	backend_cuda_close(bctx);
	return rc;
}

/* ------------------------------------------------------------ entry */

int pb_gpu_measure(const struct prefix_opts *o, struct pb_gpu_result *r,
		   char *err, size_t errlen)
{
	struct gpu g = { .T = (uint32_t)o->gpu_tokens, .err = err, .errlen = errlen };
	struct cudaDeviceProp prop;
	int rc = -1, n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || (int)o->gpu_device >= n) {
		snprintf(err, errlen, "no CUDA device %" PRIu64 " (%d found)", o->gpu_device, n);
		return -1;
	}
	if (cudaSetDevice((int)o->gpu_device) != cudaSuccess ||
	    cudaGetDeviceProperties(&prop, (int)o->gpu_device) != cudaSuccess) {
		snprintf(err, errlen, "cudaSetDevice(%" PRIu64 ") failed", o->gpu_device);
		return -1;
	}
	snprintf(r->gpu_name, sizeof(r->gpu_name), "%s", prop.name);
	r->tokens = g.T;
	r->reps = o->gpu_reps;
	if (cudaStreamCreate(&g.s) != cudaSuccess || cudaEventCreate(&g.ev[0]) != cudaSuccess ||
	    cudaEventCreate(&g.ev[1]) != cudaSuccess ||
	    cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetStream(g.h, g.s) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "CUDA stream/event or cuBLAS handle creation failed");
		goto out;
	}
	/* The GEMM buffers (about 15 GB) are freed before the pool is made. */
	if (gpu_setup(&g) || measure_recompute(&g, o->gpu_reps, r)) {
		gpu_teardown(&g);
		goto out;
	}
	gpu_teardown(&g);
	if (measure_hits(o, r, err, errlen))
		goto out;
	r->reuse_speedup = r->recompute_ms / (r->device_hit_us * 1e-3);
	r->reuse_speedup_linear_only = r->recompute_linear_ms / (r->device_hit_us * 1e-3);
	r->reuse_speedup_host = r->recompute_ms / r->host_hit_ms;
	rc = 0;
out:
	if (g.h)
		cublasDestroy(g.h);
	if (g.s)
		cudaStreamDestroy(g.s);
	return rc;
}
