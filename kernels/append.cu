/* SPDX-License-Identifier: MIT */
/*
 * append.cu - the append data op on the GPU: scatter new tokens' K and V rows
 * into their page slots, all layers, many tokens (of many users) per launch.
 *
 * A row is the K or V of one token for one layer: token_stride contiguous
 * bytes on both sides (see kvpool.h for the page layout). A launch is a flat
 * array of copy units, the rows cut into units of W bytes, W the widest of
 * 16, 8, 4 and 1 that divides the row length and both base addresses (so
 * every unit is W-aligned on both sides: all pool strides are multiples of
 * the row). Units are numbered in source order, so the loads of a warp are
 * always 32 consecutive units of the source and its stores 32 consecutive
 * units of one or more destination rows: a 512-byte row of 16-byte units is
 * exactly one warp-wide store.
 *
 * A block of THREADS threads takes a tile of U * THREADS consecutive units;
 * thread j copies units j, j + THREADS, ... of the tile, and issues all its
 * U loads before it works out where the first store goes (the slot lookup
 * and the stride arithmetic), so each thread has U * W bytes in flight:
 * 64 bytes for 16-byte units, 8 KiB per block and, at 32 registers a
 * thread, 128 KiB per SM, enough to keep HBM busy whatever the row length.
 * (The first version moved one row per block with one thread per 16 bytes:
 * a 512-byte row was a 32-thread block with 512 bytes in flight, and
 * reached 0.40 of a device-to-device cudaMemcpy on an H200; this one 0.93
 * to 0.94 with 512-byte and 2 KiB rows into shuffled slots. 128, 256, 512
 * or 1024 threads and 2, 4 or 8 units a thread are all within 2% of each
 * other there; 128 x 4 was the best by a little.) Unit to
 * (token, layer, K|V, offset) is two or three divisions by numbers fixed
 * for the launch, done as a multiply-high (struct fdiv); unit indices are
 * 32-bit, so a launch takes at most 2^31 units and a larger append is cut
 * into launches of whole tokens.
 *
 * The per-layer variant numbers its units (layer, K|V, token, unit), token
 * fastest, so a warp reads consecutive rows of one source buffer. Its
 * source pointers live in device memory and cannot be checked on the host:
 * W comes from the pool and the row, and a unit whose source buffer is not
 * W-aligned is copied a byte at a time.
 *
 * The CPU reference (append_cpu.c) is the oracle.
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

#define THREADS 128u
/* Units one launch may hold: indices and dividends stay below 2^31. */
#define MAX_UNITS (1u << 31)

/* Units in flight per thread: 64 bytes of 16- and 8-byte units, more of the
 * narrow ones (their loads are cheap, latency is what they wait on). */
template <typename T> struct unroll {
	static const unsigned U = sizeof(T) >= 16 ? 4 : sizeof(T) >= 4 ? 8 : 16;
};

/*
 * n / d for n < 2^31 and a d fixed for the launch, as a multiply-high and a
 * shift (Granlund-Montgomery, as CUTLASS's FastDivmod): with l = ceil(log2
 * d), mul = ceil(2^(31+l) / d) and shr = l - 1.
 */
struct fdiv {
	uint32_t d;
	uint32_t mul;
	uint32_t shr;
};

static struct fdiv fdiv_make(uint32_t d)
{
	struct fdiv f = { d, 0, 0 };
	uint32_t l = 0;

	if (d > 1) {
		while ((1ull << l) < d)
			l++;
		f.mul = (uint32_t)(((1ull << (31 + l)) + d - 1) / d);
		f.shr = l - 1;
	}
	return f;
}

__device__ __forceinline__ uint32_t fdiv_q(const struct fdiv &f, uint32_t n)
{
	return f.d == 1 ? n : __umulhi(n, f.mul) >> f.shr;
}

struct plan {
	uint64_t row;          /* token_stride */
	uint64_t page_bytes;
	uint64_t layer_stride;
	uint64_t kv_stride;
	struct fdiv vpr;       /* units per row */
	struct fdiv layers;
	struct fdiv n;         /* tokens in the launch (per-layer order) */
	uint32_t units;        /* in the launch */
	uint32_t t0;           /* per-layer: the launch's first token */
};

__device__ __forceinline__ unsigned char *
slot_row(unsigned char *pool, const struct plan &p, struct kvp_slot s,
	 uint32_t layer, uint32_t kv)
{
	return pool + (uint64_t)s.frame * p.page_bytes + layer * p.layer_stride +
	       kv * p.kv_stride + (uint64_t)s.slot * p.row;
}

/*
 * Source rows in [n][layers][2] order: unit i of the launch is unit i of
 * the source, so the source side is a plain array of units.
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
append_units(const T *__restrict__ src, unsigned char *__restrict__ pool,
	     const struct kvp_slot *__restrict__ slots, struct plan p)
{
	const unsigned U = unroll<T>::U;
	const uint32_t base = blockIdx.x * (U * THREADS) + threadIdx.x;
	T v[U];

#pragma unroll
	for (unsigned k = 0; k < U; k++) {
		const uint32_t i = base + k * THREADS;

		if (i < p.units)
			v[k] = src[i];
	}
#pragma unroll
	for (unsigned k = 0; k < U; k++) {
		const uint32_t i = base + k * THREADS;

		if (i < p.units) {
			const uint32_t r = fdiv_q(p.vpr, i);
			const uint32_t off = i - r * p.vpr.d;
			const uint32_t tl = r >> 1;
			const uint32_t t = fdiv_q(p.layers, tl);
			const uint32_t layer = tl - t * p.layers.d;

			((T *)slot_row(pool, p, slots[t], layer, r & 1))[off] = v[k];
		}
	}
}

/* One unit from a source that may not be W-aligned. */
template <typename T>
__device__ __forceinline__ T load_unit(const unsigned char *sp)
{
	if (sizeof(T) == 1 || ((uintptr_t)sp & (sizeof(T) - 1)) == 0)
		return *(const T *)sp;
	T x;
	unsigned char *xp = (unsigned char *)&x;

	for (unsigned b = 0; b < sizeof(T); b++)
		xp[b] = sp[b];
	return x;
}

/*
 * Per-layer sources: unit i is (layer, K|V, token, unit) with the token
 * fastest; the launch's tokens are t0 .. t0 + n - 1 of the buffers, and
 * slots points at the launch's first.
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
append_layer_units(const unsigned char *const *__restrict__ k,
		   const unsigned char *const *__restrict__ v,
		   unsigned char *__restrict__ pool,
		   const struct kvp_slot *__restrict__ slots, struct plan p)
{
	const unsigned U = unroll<T>::U;
	const uint32_t base = blockIdx.x * (U * THREADS) + threadIdx.x;
	T x[U];

#pragma unroll
	for (unsigned j = 0; j < U; j++) {
		const uint32_t i = base + j * THREADS;

		if (i < p.units) {
			const uint32_t r = fdiv_q(p.vpr, i);
			const uint32_t off = i - r * p.vpr.d;
			const uint32_t lk = fdiv_q(p.n, r);
			const uint32_t t = r - lk * p.n.d;
			const unsigned char *s = ((lk & 1) ? v : k)[lk >> 1];

			x[j] = load_unit<T>(s + (uint64_t)(p.t0 + t) * p.row +
					    (uint64_t)off * sizeof(T));
		}
	}
#pragma unroll
	for (unsigned j = 0; j < U; j++) {
		const uint32_t i = base + j * THREADS;

		if (i < p.units) {
			const uint32_t r = fdiv_q(p.vpr, i);
			const uint32_t off = i - r * p.vpr.d;
			const uint32_t lk = fdiv_q(p.n, r);
			const uint32_t t = r - lk * p.n.d;

			((T *)slot_row(pool, p, slots[t], lk >> 1, lk & 1))[off] = x[j];
		}
	}
}

/* ------------------------------------------------------------ launches */

/* The widest unit that divides every address and length in mask. */
static unsigned unit_bytes(uint64_t mask)
{
	return !(mask & 15) ? 16 : !(mask & 7) ? 8 : !(mask & 3) ? 4 : 1;
}

static struct plan make_plan(const struct kvp_layout *l, unsigned w)
{
	struct plan p;

	p.row = l->token_stride;
	p.page_bytes = l->page_bytes;
	p.layer_stride = l->layer_stride;
	p.kv_stride = l->kv_stride;
	p.vpr = fdiv_make((uint32_t)(l->token_stride / w));
	p.layers = fdiv_make(l->layers);
	p.n = fdiv_make(1);
	p.units = 0;
	p.t0 = 0;
	return p;
}

/* Tokens one launch may take: whole tokens, at most MAX_UNITS units. */
static uint32_t chunk_tokens(const struct kvp_layout *l, unsigned w)
{
	uint64_t per_token = l->token_bytes / w;
	uint64_t c = MAX_UNITS / per_token;

	return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

template <typename T>
static int launch_units(const unsigned char *kv, unsigned char *pool,
			 const struct kvp_slot *slots, uint32_t n,
			 struct plan p, uint32_t chunk, const struct kvp_layout *l,
			 cudaStream_t s)
{
	const unsigned tile = unroll<T>::U * THREADS;

	for (uint32_t t0 = 0; t0 < n; t0 += chunk) {
		uint32_t c = n - t0 < chunk ? n - t0 : chunk;

		p.units = (uint32_t)(c * (l->token_bytes / sizeof(T)));
		append_units<T><<<(p.units + tile - 1) / tile, THREADS, 0, s>>>(
			(const T *)(kv + (uint64_t)t0 * l->token_bytes), pool,
			slots + t0, p);
		if (kvpk_launched())
			return -EIO;
	}
	return 0;
}

template <typename T>
static int launch_layer_units(const unsigned char *const *k,
			       const unsigned char *const *v, unsigned char *pool,
			       const struct kvp_slot *slots, uint32_t n,
			       struct plan p, uint32_t chunk,
			       const struct kvp_layout *l, cudaStream_t s)
{
	const unsigned tile = unroll<T>::U * THREADS;

	for (uint32_t t0 = 0; t0 < n; t0 += chunk) {
		uint32_t c = n - t0 < chunk ? n - t0 : chunk;

		p.units = (uint32_t)(c * (l->token_bytes / sizeof(T)));
		p.n = fdiv_make(c);
		p.t0 = t0;
		append_layer_units<T><<<(p.units + tile - 1) / tile, THREADS, 0, s>>>(
			k, v, pool, slots + t0, p);
		if (kvpk_launched())
			return -EIO;
	}
	return 0;
}

extern "C" int kvp_append_cuda(const struct kvp_layout *l, void *pool,
			       const struct kvp_slot *slots, uint32_t n,
			       const void *kv, void *stream)
{
	const unsigned char *src = (const unsigned char *)kv;
	unsigned char *dst = (unsigned char *)pool;
	cudaStream_t s = kvpk_stream(stream);
	unsigned w;

	if (!n)
		return 0;
	if (!l->layers || !l->token_stride || l->token_bytes > KVP_MAX_PAGE_BYTES)
		return -EINVAL;
	w = unit_bytes((uintptr_t)kv | (uintptr_t)pool | l->token_stride);
	struct plan p = make_plan(l, w);
	uint32_t chunk = chunk_tokens(l, w);

	switch (w) {
	case 16:
		return launch_units<uint4>(src, dst, slots, n, p, chunk, l, s);
	case 8:
		return launch_units<uint2>(src, dst, slots, n, p, chunk, l, s);
	case 4:
		return launch_units<uint32_t>(src, dst, slots, n, p, chunk, l, s);
	default:
		return launch_units<unsigned char>(src, dst, slots, n, p, chunk, l, s);
	}
}

extern "C" int kvp_append_layers_cuda(const struct kvp_layout *l, void *pool,
				      const struct kvp_slot *slots, uint32_t n,
				      const void *const *k, const void *const *v,
				      void *stream)
{
	const unsigned char *const *kk = (const unsigned char *const *)k;
	const unsigned char *const *vv = (const unsigned char *const *)v;
	unsigned char *dst = (unsigned char *)pool;
	cudaStream_t s = kvpk_stream(stream);
	unsigned w;

	if (!n)
		return 0;
	if (!l->layers || !l->token_stride || l->token_bytes > KVP_MAX_PAGE_BYTES)
		return -EINVAL;
	w = unit_bytes((uintptr_t)pool | l->token_stride);
	struct plan p = make_plan(l, w);
	uint32_t chunk = chunk_tokens(l, w);

	switch (w) {
	case 16:
		return launch_layer_units<uint4>(kk, vv, dst, slots, n, p, chunk, l, s);
	case 8:
		return launch_layer_units<uint2>(kk, vv, dst, slots, n, p, chunk, l, s);
	case 4:
		return launch_layer_units<uint32_t>(kk, vv, dst, slots, n, p, chunk, l, s);
	default:
		return launch_layer_units<unsigned char>(kk, vv, dst, slots, n, p, chunk, l, s);
	}
}
