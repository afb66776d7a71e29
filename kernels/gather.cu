/* SPDX-License-Identifier: MIT */
/*
 * gather.cu - whole pages between the pool and a contiguous buffer: gather
 * copies a list of frames (device int32 indices) into [n][page_bytes],
 * scatter copies such a buffer back into the frames. Pages are cut into
 * chunks of CHUNK bytes, one block per chunk at a time, so one launch keeps
 * the whole GPU busy for a handful of large pages as well as for many small
 * ones. The CPU reference is kvp_gather_cpu / kvp_scatter_cpu.
 */
#include <errno.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "copy.cuh"
#include "kvp_kernels.h"

#define CHUNK (32u << 10)

struct page_geom {
	uint64_t page_bytes;
	uint64_t chunk;        /* bytes per chunk (<= page_bytes) */
	uint64_t per_page;     /* chunks per page */
	uint64_t chunks;       /* n * per_page */
};

template <bool to_pool>
__global__ void page_copy(unsigned char *__restrict__ pool,
			  unsigned char *__restrict__ buf,
			  const int32_t *__restrict__ frames, struct page_geom g)
{
	for (uint64_t c = blockIdx.x; c < g.chunks; c += gridDim.x) {
		const uint64_t i = c / g.per_page;
		const uint64_t off = (c % g.per_page) * g.chunk;
		const uint64_t len = g.page_bytes - off < g.chunk ? g.page_bytes - off
								   : g.chunk;
		unsigned char *pp = pool + (uint64_t)(uint32_t)frames[i] * g.page_bytes + off;
		unsigned char *bp = buf + i * g.page_bytes + off;

		if (to_pool)
			kvpk_copy_run(pp, bp, len);
		else
			kvpk_copy_run(bp, pp, len);
	}
}

static int launch(const struct kvp_layout *l, unsigned char *pool,
		  const int32_t *frames, uint32_t n, unsigned char *buf,
		  void *stream, bool to_pool)
{
	struct page_geom g;
	unsigned blocks;

	if (!n)
		return 0;
	if (!l->page_bytes)
		return -EINVAL;
	g.page_bytes = l->page_bytes;
	g.chunk = l->page_bytes < CHUNK ? l->page_bytes : CHUNK;
	g.per_page = (l->page_bytes + g.chunk - 1) / g.chunk;
	g.chunks = (uint64_t)n * g.per_page;
	blocks = g.chunks < KVPK_MAX_BLOCKS ? (unsigned)g.chunks : KVPK_MAX_BLOCKS;
	if (to_pool)
		page_copy<true><<<blocks, kvpk_threads(g.chunk), 0,
				  kvpk_stream(stream)>>>(pool, buf, frames, g);
	else
		page_copy<false><<<blocks, kvpk_threads(g.chunk), 0,
				   kvpk_stream(stream)>>>(pool, buf, frames, g);
	return kvpk_launched();
}

extern "C" int kvp_gather_cuda(const struct kvp_layout *l, const void *pool,
			       const int32_t *frames, uint32_t n, void *out,
			       void *stream)
{
	return launch(l, (unsigned char *)pool, frames, n, (unsigned char *)out,
		      stream, false);
}

extern "C" int kvp_scatter_cuda(const struct kvp_layout *l, void *pool,
				const int32_t *frames, uint32_t n, const void *in,
				void *stream)
{
	return launch(l, (unsigned char *)pool, frames, n, (unsigned char *)in,
		      stream, true);
}
