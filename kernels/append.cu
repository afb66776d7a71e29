/* SPDX-License-Identifier: MIT */
/*
 * append.cu - the append data op on the GPU: scatter new tokens' K and V rows
 * into their page slots, all layers, many tokens (of many users) per launch.
 *
 * One thread block moves one row: the K or V of one token for one layer,
 * token_stride contiguous bytes on both sides (see kvpool.h for the page
 * layout). Rows whose size and addresses are 16-byte aligned move as uint4,
 * the rest byte by byte. The CPU reference (append_cpu.c) is the oracle.
 */
#include <errno.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kvp_kernels.h"

struct row_geom {
	uint64_t row;          /* token_stride */
	uint64_t page_bytes;
	uint64_t layer_stride;
	uint64_t kv_stride;
	uint32_t layers;
};

__global__ void append_rows(const unsigned char *__restrict__ src,
			    unsigned char *__restrict__ pool,
			    const struct kvp_slot *__restrict__ slots,
			    struct row_geom g)
{
	/* Row r of the source is (token, layer, kv) in [n][layers][2] order. */
	const uint64_t r = blockIdx.x;
	const uint32_t kv = (uint32_t)(r & 1);
	const uint64_t tl = r >> 1;
	const uint32_t layer = (uint32_t)(tl % g.layers);
	const uint64_t t = tl / g.layers;
	const struct kvp_slot s = slots[t];
	const unsigned char *sp = src + r * g.row;
	unsigned char *dp = pool + (uint64_t)s.frame * g.page_bytes +
			    layer * g.layer_stride + kv * g.kv_stride +
			    (uint64_t)s.slot * g.row;

	if (((uintptr_t)sp | (uintptr_t)dp | g.row) % 16 == 0) {
		const uint4 *s4 = (const uint4 *)sp;
		uint4 *d4 = (uint4 *)dp;

		for (uint64_t i = threadIdx.x; i < g.row / 16; i += blockDim.x)
			d4[i] = s4[i];
	} else {
		for (uint64_t i = threadIdx.x; i < g.row; i += blockDim.x)
			dp[i] = sp[i];
	}
}

extern "C" int kvp_append_cuda(const struct kvp_layout *l, void *pool,
			       const struct kvp_slot *slots, uint32_t n,
			       const void *kv, void *stream)
{
	struct row_geom g = { l->token_stride, l->page_bytes, l->layer_stride,
			      l->kv_stride, l->layers };
	uint64_t rows = (uint64_t)n * l->layers * 2;
	unsigned threads = g.row >= 2048 ? 128 : 64;

	if (!n)
		return 0;
	if (rows > 0x7fffffffull)
		return -EINVAL;
	append_rows<<<(unsigned)rows, threads, 0, (cudaStream_t)stream>>>(
		(const unsigned char *)kv, (unsigned char *)pool, slots, g);
	return cudaGetLastError() == cudaSuccess ? 0 : -EINVAL;
}
