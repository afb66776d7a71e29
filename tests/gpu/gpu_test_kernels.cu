/* SPDX-License-Identifier: MIT */
/*
 * gpu_test_kernels.cu - see gpu_test_kernels.h. Written for clarity, not
 * speed: one block per (request, query head), fp32 accumulation.
 */
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu_test_kernels.h"

#define THREADS 128

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }

/* Block-wide reduction (max or sum) of v; every thread gets the result. */
template <bool is_max>
__device__ float block_reduce(float v)
{
	__shared__ float part[THREADS / 32];
	__shared__ float result;
	const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int o = 16; o > 0; o >>= 1) {
		float w = __shfl_xor_sync(0xffffffffu, v, o);

		v = is_max ? fmaxf(v, w) : v + w;
	}
	if (!lane)
		part[warp] = v;
	__syncthreads();
	if (!threadIdx.x) {
		float r = part[0];

		for (unsigned i = 1; i < THREADS / 32; i++)
			r = is_max ? fmaxf(r, part[i]) : r + part[i];
		result = r;
	}
	__syncthreads();
	v = result;
	__syncthreads();
	return v;
}

struct attn_geom {
	uint64_t page_bytes, layer_stride, kv_stride, token_stride, head_stride;
	uint32_t page_tokens, head_dim, qo_heads, group, max_len, layer;
	float scale;
};

template <typename T>
__device__ __forceinline__ const T *kv_row(const unsigned char *pool,
					   const attn_geom &g, int32_t frame,
					   uint32_t slot, uint32_t kv, uint32_t h)
{
	return (const T *)(pool + (uint64_t)frame * g.page_bytes +
			   g.layer * g.layer_stride + kv * g.kv_stride +
			   slot * g.token_stride + h * g.head_stride);
}

template <typename T>
__global__ void __launch_bounds__(THREADS)
decode_attention(const unsigned char *__restrict__ pool, attn_geom g,
		 const int32_t *__restrict__ indptr,
		 const int32_t *__restrict__ indices,
		 const int32_t *__restrict__ last_page_len,
		 const float *__restrict__ q, float *__restrict__ out,
		 float *__restrict__ scratch)
{
	const uint32_t b = blockIdx.x / g.qo_heads, hq = blockIdx.x % g.qo_heads;
	const uint32_t h = hq / g.group;
	const int32_t p0 = indptr[b], np = indptr[b + 1] - p0;
	const uint32_t len = np > 0 ? (uint32_t)(np - 1) * g.page_tokens + last_page_len[b] : 0;
	const float *qv = q + ((uint64_t)b * g.qo_heads + hq) * g.head_dim;
	float *sc = scratch + (uint64_t)blockIdx.x * g.max_len;
	float m = -INFINITY, sum = 0.f;

	for (uint32_t s = threadIdx.x; s < len; s += THREADS) {
		const T *k = kv_row<T>(pool, g, indices[p0 + s / g.page_tokens],
				       s % g.page_tokens, 0, h);
		float acc = 0.f;

		for (uint32_t d = 0; d < g.head_dim; d++)
			acc = fmaf(qv[d], ld(k + d), acc);
		sc[s] = acc * g.scale;
		m = fmaxf(m, sc[s]);
	}
	m = block_reduce<true>(m);
	for (uint32_t s = threadIdx.x; s < len; s += THREADS) {
		sc[s] = expf(sc[s] - m);
		sum += sc[s];
	}
	sum = block_reduce<false>(sum);
	for (uint32_t d = threadIdx.x; d < g.head_dim; d += THREADS) {
		float acc = 0.f;

		for (uint32_t s = 0; s < len; s++) {
			const T *v = kv_row<T>(pool, g, indices[p0 + s / g.page_tokens],
					       s % g.page_tokens, 1, h);

			acc = fmaf(sc[s], ld(v + d), acc);
		}
		out[((uint64_t)b * g.qo_heads + hq) * g.head_dim + d] = acc / sum;
	}
}

extern "C" int gpu_test_decode_attention(const struct kvp_layout *l,
					 const void *pool, uint32_t layer,
					 const int32_t *indptr, const int32_t *indices,
					 const int32_t *last_page_len, uint32_t batch,
					 uint32_t qo_heads, const float *q, float *out,
					 float *scratch, uint32_t max_len, float scale)
{
	attn_geom g = { l->page_bytes, l->layer_stride, l->kv_stride,
			l->token_stride, l->head_stride, l->page_tokens, l->head_dim,
			qo_heads, qo_heads / l->kv_heads, max_len, layer, scale };
	const unsigned char *p = (const unsigned char *)pool;

	switch (l->dtype) {
	case KVP_DTYPE_FP32:
		decode_attention<float><<<batch * qo_heads, THREADS>>>(
			p, g, indptr, indices, last_page_len, q, out, scratch);
		break;
	case KVP_DTYPE_BF16:
		decode_attention<__nv_bfloat16><<<batch * qo_heads, THREADS>>>(
			p, g, indptr, indices, last_page_len, q, out, scratch);
		break;
	case KVP_DTYPE_FP16:
		decode_attention<__half><<<batch * qo_heads, THREADS>>>(
			p, g, indptr, indices, last_page_len, q, out, scratch);
		break;
	default:
		return (int)cudaErrorInvalidValue;
	}
	return (int)cudaGetLastError();
}

__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void st(__half *p, float v) { *p = __float2half(v); }

template <typename T>
__global__ void __launch_bounds__(THREADS)
softmax_cols(const float *__restrict__ s, uint32_t rows, T *__restrict__ p)
{
	const float *col = s + (uint64_t)blockIdx.x * rows;
	T *pc = p + (uint64_t)blockIdx.x * rows;
	float m = -INFINITY, sum = 0.f;

	for (uint32_t i = threadIdx.x; i < rows; i += THREADS)
		m = fmaxf(m, col[i]);
	m = block_reduce<true>(m);
	for (uint32_t i = threadIdx.x; i < rows; i += THREADS)
		sum += expf(col[i] - m);
	sum = block_reduce<false>(sum);
	for (uint32_t i = threadIdx.x; i < rows; i += THREADS)
		st(pc + i, expf(col[i] - m) / sum);
}

extern "C" int gpu_test_softmax_cols(const float *s, uint32_t rows, uint32_t cols,
				     void *p, uint32_t dtype)
{
	switch (dtype) {
	case KVP_DTYPE_FP32:
		softmax_cols<float><<<cols, THREADS>>>(s, rows, (float *)p);
		break;
	case KVP_DTYPE_BF16:
		softmax_cols<__nv_bfloat16><<<cols, THREADS>>>(s, rows, (__nv_bfloat16 *)p);
		break;
	case KVP_DTYPE_FP16:
		softmax_cols<__half><<<cols, THREADS>>>(s, rows, (__half *)p);
		break;
	default:
		return (int)cudaErrorInvalidValue;
	}
	return (int)cudaGetLastError();
}

__device__ __forceinline__ uint64_t now_ns(void)
{
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__global__ void spin(uint64_t ns)
{
	const uint64_t t0 = now_ns();

	while (now_ns() - t0 < ns)
		__nanosleep(1000);
}

extern "C" int gpu_test_spin(uint64_t ns, void *stream)
{
	spin<<<1, 1, 0, (cudaStream_t)stream>>>(ns);
	return (int)cudaGetLastError();
}
