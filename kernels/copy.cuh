/* SPDX-License-Identifier: MIT */
/*
 * copy.cuh - what the byte-copy kernels share: a block-wide copy of one
 * contiguous run (16-byte vectors when both ends and the length allow, bytes
 * otherwise), the block size that suits a run, and the launch-error plumbing
 * behind kvp_kernels_error().
 */
#ifndef KVPOOL_COPY_CUH
#define KVPOOL_COPY_CUH

#include <errno.h>
#include <stdint.h>

#include <cuda_runtime.h>

/* Most blocks a launch is given; the kernels stride over the rest. */
#define KVPK_MAX_BLOCKS (1u << 30)

/* The threads of one block copy bytes [0, len) from sp to dp. */
__device__ __forceinline__ void kvpk_copy_run(unsigned char *__restrict__ dp,
					      const unsigned char *__restrict__ sp,
					      uint64_t len)
{
	if ((((uintptr_t)sp | (uintptr_t)dp | len) & 15) == 0) {
		const uint4 *s4 = (const uint4 *)sp;
		uint4 *d4 = (uint4 *)dp;
		const uint64_t n4 = len >> 4;
		uint64_t i = threadIdx.x;

		/* Two vectors in flight per thread where the run is long. */
		for (; i + blockDim.x < n4; i += 2 * (uint64_t)blockDim.x) {
			uint4 a = s4[i], b = s4[i + blockDim.x];

			d4[i] = a;
			d4[i + blockDim.x] = b;
		}
		if (i < n4)
			d4[i] = s4[i];
	} else {
		for (uint64_t i = threadIdx.x; i < len; i += blockDim.x)
			dp[i] = sp[i];
	}
}

/* A block size for runs of len bytes: one thread per vector (or byte), a
 * whole number of warps, 32 to 256. */
static inline unsigned kvpk_threads(uint64_t len)
{
	uint64_t units = (len & 15) ? len : len >> 4;
	uint64_t t = (units + 31) & ~31ull;

	return t < 32 ? 32u : t > 256 ? 256u : (unsigned)t;
}

static inline cudaStream_t kvpk_stream(void *stream)
{
	return stream ? (cudaStream_t)stream : cudaStreamLegacy;
}

/* After a launch: 0, or -EIO with the error kept for kvp_kernels_error(). */
int kvpk_launched(void);

#endif /* KVPOOL_COPY_CUH */
