/* SPDX-License-Identifier: MIT */
/*
 * append.cu - the append data op on the GPU: scatter new tokens' K and V rows
 * into their page slots, all layers, many tokens (of many users) per launch.
 *
 * One thread block moves one row at a time: the K or V of one token for one
 * layer, token_stride contiguous bytes on both sides (see kvpool.h for the
 * page layout); blocks stride over the rows when there are more than a
 * launch takes. Rows whose size and addresses are 16-byte aligned move as
 * uint4, the rest byte by byte. The CPU reference (append_cpu.c) is the
 * oracle.
 */
#include <errno.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "copy.cuh"
#include "kvp_kernels.h"

static __thread cudaError_t last_error = cudaSuccess;

int kvpk_launched(void)
{
	cudaError_t e = cudaGetLastError();

	if (e == cudaSuccess)
		return 0;
	last_error = e;
	return -EIO;
}

extern "C" const char *kvp_kernels_error(void)
{
	return last_error == cudaSuccess ? "" : cudaGetErrorString(last_error);
}

struct row_geom {
	uint64_t row;          /* token_stride */
	uint64_t page_bytes;
	uint64_t layer_stride;
	uint64_t kv_stride;
	uint64_t rows;         /* n * layers * 2 */
	uint32_t layers;
	uint32_t n;
};

__device__ __forceinline__ unsigned char *
slot_row(unsigned char *pool, const struct row_geom &g, struct kvp_slot s,
	 uint32_t layer, uint32_t kv)
{
	return pool + (uint64_t)s.frame * g.page_bytes + layer * g.layer_stride +
	       kv * g.kv_stride + (uint64_t)s.slot * g.row;
}

/* Source rows in [n][layers][2] order: row r is one contiguous source run. */
__global__ void append_rows(const unsigned char *__restrict__ src,
			    unsigned char *__restrict__ pool,
			    const struct kvp_slot *__restrict__ slots,
			    struct row_geom g)
{
	for (uint64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
		const uint32_t kv = (uint32_t)(r & 1);
		const uint64_t tl = r >> 1;
		const uint32_t layer = (uint32_t)(tl % g.layers);
		const uint64_t t = tl / g.layers;

		kvpk_copy_run(slot_row(pool, g, slots[t], layer, kv),
			      src + r * g.row, g.row);
	}
}

/*
 * Per-layer sources: row r is (layer, kv, token) with the token fastest, so
 * neighbouring blocks read neighbouring rows of one source buffer.
 */
__global__ void append_layer_rows(const unsigned char *const *__restrict__ k,
				  const unsigned char *const *__restrict__ v,
				  unsigned char *__restrict__ pool,
				  const struct kvp_slot *__restrict__ slots,
				  struct row_geom g)
{
	for (uint64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
		const uint64_t t = r % g.n;
		const uint64_t lk = r / g.n;
		const uint32_t layer = (uint32_t)(lk >> 1), kv = (uint32_t)(lk & 1);
		const unsigned char *src = (kv ? v : k)[layer];

		kvpk_copy_run(slot_row(pool, g, slots[t], layer, kv),
			      src + t * g.row, g.row);
	}
}

static struct row_geom geom(const struct kvp_layout *l, uint32_t n)
{
	struct row_geom g = { l->token_stride, l->page_bytes, l->layer_stride,
			      l->kv_stride, (uint64_t)n * l->layers * 2, l->layers, n };

	return g;
}

static unsigned blocks_for(uint64_t units)
{
	return units < KVPK_MAX_BLOCKS ? (unsigned)units : KVPK_MAX_BLOCKS;
}

extern "C" int kvp_append_cuda(const struct kvp_layout *l, void *pool,
			       const struct kvp_slot *slots, uint32_t n,
			       const void *kv, void *stream)
{
	struct row_geom g = geom(l, n);

	if (!n)
		return 0;
	if (!l->layers || !g.row)
		return -EINVAL;
	append_rows<<<blocks_for(g.rows), kvpk_threads(g.row), 0,
		      kvpk_stream(stream)>>>((const unsigned char *)kv,
					     (unsigned char *)pool, slots, g);
	return kvpk_launched();
}

extern "C" int kvp_append_layers_cuda(const struct kvp_layout *l, void *pool,
				      const struct kvp_slot *slots, uint32_t n,
				      const void *const *k, const void *const *v,
				      void *stream)
{
	struct row_geom g = geom(l, n);

	if (!n)
		return 0;
	if (!l->layers || !g.row)
		return -EINVAL;
	append_layer_rows<<<blocks_for(g.rows), kvpk_threads(g.row), 0,
			    kvpk_stream(stream)>>>(
		(const unsigned char *const *)k, (const unsigned char *const *)v,
		(unsigned char *)pool, slots, g);
	return kvpk_launched();
}
