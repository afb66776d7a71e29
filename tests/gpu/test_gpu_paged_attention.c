/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_paged_attention.c - the page layout kvpool publishes is the one
 * an attention kernel can use: decode attention of a query over a batch of
 * histories read through the CSR page table (indptr, indices,
 * last_page_len: FlashInfer's convention) straight from the page-major pool
 * equals attention over the same K/V stored contiguously, computed with
 * cuBLAS (QK^T and PV as GEMMs, a column softmax in between).
 *
 * The pages are written by the CPU reference (kvp_append_cpu) from token
 * buffers in the [tokens][layers][2][heads][dim] order of kvp_append; the
 * contiguous K and V of the reference are cut out of the same buffers. The
 * histories have random lengths (one token, exactly full pages, a partial
 * last page) in shuffled frames, with grouped-query attention.
 *
 * Relative error = max |paged - reference| / max |reference| per (request,
 * KV head) must stay within 1e-5 for fp32 (cuBLAS in pedantic fp32 math:
 * no TF32) and 1e-2 for bf16 and fp16 (the reference's GEMMs take the
 * softmax in that dtype, as flash-attention kernels do; the paged kernel
 * keeps it in fp32).
 *
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu_test_kernels.h"
#include "gpu_test_util.h"
#include "kvp_kernels.h"
#include "kvpool.h"

#define BATCH 7u

/* Uniform in [-1, 1). */
static float uniform(void)
{
	return (float)((double)(gpu_rng() >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static uint16_t to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaNs here) */
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Store f as one element of dtype at p; return the value stored. */
static float put(void *p, uint32_t dtype, float f)
{
	if (dtype == KVP_DTYPE_FP32) {
		memcpy(p, &f, 4);
		return f;
	}
	if (dtype == KVP_DTYPE_BF16) {
		uint16_t h = to_bf16(f);

		memcpy(p, &h, 2);
		return from_bf16(h);
	}
	_Float16 h = (_Float16)f;

	memcpy(p, &h, 2);
	return (float)h;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

static void *to_device(const void *h, size_t n)
{
	void *d = NULL;

	assert_int_equal(cudaMalloc(&d, n ? n : 1), cudaSuccess);
	assert_int_equal(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
	return d;
}

static cudaDataType_t cuda_type(uint32_t dtype)
{
	return dtype == KVP_DTYPE_BF16 ? CUDA_R_16BF :
	       dtype == KVP_DTYPE_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* C (m x n, ldc) = alpha op(A) op(B), column-major, fp32 accumulation. */
static void gemm(cublasHandle_t h, uint32_t dtype, cublasOperation_t ta,
		 int m, int n, int k, float alpha, const void *a, int lda,
		 const void *b, int ldb, float *c, int ldc)
{
	const float beta = 0.f;

	if (dtype == KVP_DTYPE_FP32)
		assert_int_equal(cublasSgemm(h, ta, CUBLAS_OP_N, m, n, k, &alpha, a, lda,
					     b, ldb, &beta, c, ldc), CUBLAS_STATUS_SUCCESS);
	else
		assert_int_equal(cublasGemmEx(h, ta, CUBLAS_OP_N, m, n, k, &alpha,
					      a, cuda_type(dtype), lda, b,
					      cuda_type(dtype), ldb, &beta, c,
					      CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
					      CUBLAS_GEMM_DEFAULT),
				 CUBLAS_STATUS_SUCCESS);
}

static void check_attention(uint32_t dtype, uint32_t layers, uint32_t kv_heads,
			    uint32_t group, uint32_t dim, uint32_t ptok, double tol)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN];
	const uint32_t qo_heads = kv_heads * group, layer = layers - 1;
	const float scale = 1.0f / sqrtf((float)dim);
	uint32_t len[BATCH], max_len = 0, total_pages = 0, frames;
	int32_t indptr[BATCH + 1], last_page_len[BATCH], *indices;
	unsigned char *pool, *tok[BATCH];
	uint32_t *perm;
	float *q, *out;
	void *d_pool, *d_indptr, *d_indices, *d_lpl, *d_q, *d_out, *d_scratch;
	cublasHandle_t blas;
	double worst = 0;

	assert_int_equal(kvp_layout_init(&l, layers, kv_heads, dim, dtype, ptok, err,
					 sizeof(err)), 0);
	/* One token, exactly full pages, then random lengths. */
	for (uint32_t b = 0; b < BATCH; b++) {
		len[b] = b == 0 ? 1 : b == 1 ? 3 * ptok : b == 2 ? ptok : 1 + gpu_below(40 * ptok);
		max_len = len[b] > max_len ? len[b] : max_len;
		indptr[b] = (int32_t)total_pages;
		total_pages += (len[b] + ptok - 1) / ptok;
		last_page_len[b] = (int32_t)(len[b] - ((len[b] + ptok - 1) / ptok - 1) * ptok);
	}
	indptr[BATCH] = (int32_t)total_pages;
	frames = total_pages + 13; /* some frames nobody uses */

	/* Pages in shuffled frames; tokens written by the CPU reference. */
	pool = calloc(frames, l.page_bytes);
	assert_non_null(pool);
	perm = xmalloc(frames * sizeof(*perm));
	for (uint32_t i = 0; i < frames; i++)
		perm[i] = i;
	for (uint32_t i = frames - 1; i > 0; i--) {
		uint32_t j = gpu_below(i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	indices = xmalloc(total_pages * sizeof(*indices));
	for (uint32_t i = 0; i < total_pages; i++)
		indices[i] = (int32_t)perm[i];
	for (uint32_t b = 0; b < BATCH; b++) {
		struct kvp_slot *slots = xmalloc(len[b] * sizeof(*slots));
		const uint64_t elems = (uint64_t)len[b] * l.token_bytes / l.elem_bytes;

		tok[b] = xmalloc(len[b] * l.token_bytes);
		for (uint64_t e = 0; e < elems; e++)
			put(tok[b] + e * l.elem_bytes, dtype, uniform());
		for (uint32_t s = 0; s < len[b]; s++)
			slots[s] = (struct kvp_slot){ (uint32_t)indices[indptr[b] + s / ptok],
						      s % ptok };
		kvp_append_cpu(&l, pool, slots, len[b], tok[b]);
		free(slots);
	}
	q = xmalloc((size_t)BATCH * qo_heads * dim * sizeof(float));
	for (uint32_t i = 0; i < BATCH * qo_heads * dim; i++) {
		unsigned char tmp[4];

		q[i] = put(tmp, dtype, uniform()); /* representable in dtype */
	}

	/* The paged kernel. */
	d_pool = to_device(pool, (size_t)frames * l.page_bytes);
	d_indptr = to_device(indptr, sizeof(indptr));
	d_indices = to_device(indices, total_pages * sizeof(*indices));
	d_lpl = to_device(last_page_len, sizeof(last_page_len));
	d_q = to_device(q, (size_t)BATCH * qo_heads * dim * sizeof(float));
	assert_int_equal(cudaMalloc(&d_out, (size_t)BATCH * qo_heads * dim * sizeof(float)),
			 cudaSuccess);
	assert_int_equal(cudaMalloc(&d_scratch, (size_t)BATCH * qo_heads * max_len *
				    sizeof(float)), cudaSuccess);
	assert_int_equal(gpu_test_decode_attention(&l, d_pool, layer, d_indptr, d_indices,
						   d_lpl, BATCH, qo_heads, d_q, d_out,
						   d_scratch, max_len, scale), 0);
	out = xmalloc((size_t)BATCH * qo_heads * dim * sizeof(float));
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	assert_int_equal(cudaMemcpy(out, d_out, (size_t)BATCH * qo_heads * dim * sizeof(float),
				    cudaMemcpyDeviceToHost), cudaSuccess);

	/* The reference: per (request, KV head), contiguous K [len][dim] and V
	 * [len][dim] (column-major: dim x len), the group's queries Q
	 * (dim x group); S = K^T Q (len x group), P = softmax(S) per column,
	 * O = V P (dim x group) = out[b][h * group .. +group][dim]. */
	assert_int_equal(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
	assert_int_equal(cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH), CUBLAS_STATUS_SUCCESS);
	for (uint32_t b = 0; b < BATCH; b++) {
		for (uint32_t h = 0; h < kv_heads; h++) {
			const uint64_t rowb = (uint64_t)dim * l.elem_bytes;
			unsigned char *kc = xmalloc(len[b] * rowb), *vc = xmalloc(len[b] * rowb);
			unsigned char *qc = xmalloc((size_t)group * rowb);
			float *o = xmalloc((size_t)group * dim * sizeof(float));
			void *d_k, *d_v, *d_qc, *d_s, *d_p, *d_o;
			double maxdiff = 0, maxref = 0;

			for (uint32_t s = 0; s < len[b]; s++) {
				const unsigned char *t = tok[b] + s * l.token_bytes +
							 2 * layer * l.token_stride +
							 h * l.head_stride;

				memcpy(kc + s * rowb, t, rowb);
				memcpy(vc + s * rowb, t + l.token_stride, rowb);
			}
			for (uint32_t g = 0; g < group; g++)
				for (uint32_t d = 0; d < dim; d++)
					put(qc + (g * dim + d) * l.elem_bytes, dtype,
					    q[((size_t)b * qo_heads + h * group + g) * dim + d]);
			d_k = to_device(kc, len[b] * rowb);
			d_v = to_device(vc, len[b] * rowb);
			d_qc = to_device(qc, group * rowb);
			assert_int_equal(cudaMalloc(&d_s, (size_t)len[b] * group * sizeof(float)),
					 cudaSuccess);
			assert_int_equal(cudaMalloc(&d_p, (size_t)len[b] * group * l.elem_bytes),
					 cudaSuccess);
			assert_int_equal(cudaMalloc(&d_o, (size_t)group * dim * sizeof(float)),
					 cudaSuccess);
			gemm(blas, dtype, CUBLAS_OP_T, (int)len[b], (int)group, (int)dim, scale,
			     d_k, (int)dim, d_qc, (int)dim, d_s, (int)len[b]);
			assert_int_equal(gpu_test_softmax_cols(d_s, len[b], group, d_p, dtype), 0);
			gemm(blas, dtype, CUBLAS_OP_N, (int)dim, (int)group, (int)len[b], 1.0f,
			     d_v, (int)dim, d_p, (int)len[b], d_o, (int)dim);
			assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
			assert_int_equal(cudaMemcpy(o, d_o, (size_t)group * dim * sizeof(float),
						    cudaMemcpyDeviceToHost), cudaSuccess);
			for (uint32_t i = 0; i < group * dim; i++) {
				double ref = o[i];
				double got = out[((size_t)b * qo_heads + h * group) * dim + i];

				maxdiff = fmax(maxdiff, fabs(got - ref));
				maxref = fmax(maxref, fabs(ref));
			}
			assert_true(maxref > 0);
			if (maxdiff / maxref > tol)
				fail_msg("%s request %u (%u tokens) kv head %u: relative error "
					 "%.3g > %.0e", kvp_dtype_name(dtype), b, len[b], h,
					 maxdiff / maxref, tol);
			worst = fmax(worst, maxdiff / maxref);
			cudaFree(d_k);
			cudaFree(d_v);
			cudaFree(d_qc);
			cudaFree(d_s);
			cudaFree(d_p);
			cudaFree(d_o);
			free(kc);
			free(vc);
			free(qc);
			free(o);
		}
	}
	printf("%s: %u requests (max %u tokens), %u/%u heads, dim %u: worst relative "
	       "error %.3g (tolerance %.0e)\n", kvp_dtype_name(dtype), BATCH, max_len,
	       qo_heads, kv_heads, dim, worst, tol);
	cublasDestroy(blas);
	cudaFree(d_pool);
	cudaFree(d_indptr);
	cudaFree(d_indices);
	cudaFree(d_lpl);
	cudaFree(d_q);
	cudaFree(d_out);
	cudaFree(d_scratch);
	for (uint32_t b = 0; b < BATCH; b++)
		free(tok[b]);
	free(pool);
	free(perm);
	free(indices);
	free(q);
	free(out);
}

static void test_paged_attention_fp32(void **state)
{
	check_attention(KVP_DTYPE_FP32, 3, 2, 4, 128, 16, 1e-5);
	check_attention(KVP_DTYPE_FP32, 2, 4, 1, 64, 32, 1e-5);
}

static void test_paged_attention_bf16(void **state)
{
	check_attention(KVP_DTYPE_BF16, 3, 2, 4, 128, 16, 1e-2);
	check_attention(KVP_DTYPE_BF16, 2, 8, 2, 64, 64, 1e-2);
}

static void test_paged_attention_fp16(void **state)
{
	check_attention(KVP_DTYPE_FP16, 2, 4, 4, 128, 32, 1e-2);
}

int main(void)
{
	gpu_rng_seed(0x2545f4914f6cdd1dull);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_paged_attention_fp32),
		cmocka_unit_test(test_paged_attention_bf16),
		cmocka_unit_test(test_paged_attention_fp16),
	};

	if (gpu_test_no_device())
		return 77;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
