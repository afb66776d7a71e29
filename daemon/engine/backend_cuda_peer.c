/* SPDX-License-Identifier: MIT */
/*
 * backend_cuda_peer.c - backend_ops.copy_peer of the cuda backend: device
 * tier to device tier between two GPUs' contexts (a history moved from one
 * pool to another, engine_move.h).
 *
 * Where the two GPUs can reach each other (cudaDeviceCanAccessPeer, both
 * ways: NVLink or PCIe P2P), each run is one cudaMemcpyPeerAsync on the
 * source GPU's device -> host stream. The tiers are cuMemCreate mappings,
 * which a peer may use only once cuMemSetAccess granted it (done once per
 * allocation and peer, both ways). Elsewhere the bytes go through pinned
 * host memory: device -> host on the source GPU, host -> device on the
 * destination's, a bounded piece at a time. Either way the call returns
 * once every byte has landed. NVLink multicast is not used.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>

#include "backend_cuda_internal.h"

#define STAGE_BYTES (64ull << 20) /* pinned bounce buffer, at most */

/* Give device `peer` read/write access to a's mapping, once (a->peers). */
static int grant(struct cuda_ctx *x, struct cuda_alloc *a, int peer,
		 struct errbuf *e)
{
	CUmemAccessDesc d = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = peer },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	uint64_t bit = peer >= 0 && peer < 64 ? 1ull << peer : 0;
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&x->lock);
	if (!bit || !(a->peers & bit)) {
		r = x->cu->set_access(a->ptr, a->size, &d, 1);
		if (r == CUDA_SUCCESS)
			a->peers |= bit;
	}
	pthread_mutex_unlock(&x->lock);
	if (r != CUDA_SUCCESS)
		return errbuf_set(e, cu_errno(r), "cuda device %d: giving GPU %d "
				  "access to its device tier (cuMemSetAccess): %s",
				  x->device, peer, cuda_driver_strerror(x->cu, r));
	return 0;
}

/* Whether src and dst reach each other, both ways. */
static bool can_peer(int a, int b)
{
	int ab = 0, ba = 0;

	return cudaDeviceCanAccessPeer(&ab, a, b) == cudaSuccess &&
	       cudaDeviceCanAccessPeer(&ba, b, a) == cudaSuccess && ab && ba;
}

static int fail(struct cuda_ctx *x, cudaError_t err, const char *what,
		struct errbuf *e)
{
	return errbuf_set(e, cuda_errno(err), "cuda device %d: %s: %s", x->device,
			  what, cudaGetErrorString(err));
}

static int peer_runs(struct cuda_ctx *d, const struct tier_mem *dst,
		     struct cuda_ctx *s, const struct tier_mem *src,
		     const struct copy_run *runs, uint32_t n, struct errbuf *e)
{
	struct cuda_alloc *ad = alloc_find(d, dst->base, false);
	struct cuda_alloc *as = alloc_find(s, src->base, false);
	cudaStream_t st = s->stream[COPY_D2H];
	cudaError_t err = cudaSuccess, serr;
	int ret;

	if (!ad || !as)
		return errbuf_set(e, -EINVAL, "cuda peer copy: a tier that is not "
				  "a device tier of its context");
	/* Each grant with its owner's context current. */
	ret = cuda_use(d, e);
	if (!ret)
		ret = grant(d, ad, s->device, e);
	if (!ret)
		ret = cuda_use(s, e);
	if (!ret)
		ret = grant(s, as, d->device, e);
	if (ret)
		return ret;
	for (uint32_t i = 0; i < n && err == cudaSuccess; i++)
		err = cudaMemcpyPeerAsync((char *)dst->base + runs[i].dst_off, d->device,
					  (const char *)src->base + runs[i].src_off,
					  s->device, runs[i].bytes, st);
	serr = cudaStreamSynchronize(st); /* nothing in flight on return */
	if (err != cudaSuccess)
		return fail(s, err, "cudaMemcpyPeerAsync", e);
	if (serr != cudaSuccess)
		return fail(s, serr, "cudaStreamSynchronize after a peer copy", e);
	return 0;
}

/* One piece through the bounce buffer: src GPU -> host -> dst GPU. */
static int staged_piece(struct cuda_ctx *d, char *dp, struct cuda_ctx *s,
			const char *sp, void *bounce, uint64_t len,
			struct errbuf *e)
{
	cudaError_t err;
	int ret = cuda_use(s, e);

	if (ret)
		return ret;
	err = cudaMemcpyAsync(bounce, sp, len, cudaMemcpyDeviceToHost,
			      s->stream[COPY_D2H]);
	if (err == cudaSuccess)
		err = cudaStreamSynchronize(s->stream[COPY_D2H]);
	if (err != cudaSuccess)
		return fail(s, err, "staging a peer copy to host memory", e);
	ret = cuda_use(d, e);
	if (ret)
		return ret;
	err = cudaMemcpyAsync(dp, bounce, len, cudaMemcpyHostToDevice,
			      d->stream[COPY_H2D]);
	if (err == cudaSuccess)
		err = cudaStreamSynchronize(d->stream[COPY_H2D]);
	if (err != cudaSuccess)
		return fail(d, err, "a staged peer copy from host memory", e);
	return 0;
}

static int staged_runs(struct cuda_ctx *d, const struct tier_mem *dst,
		       struct cuda_ctx *s, const struct tier_mem *src,
		       const struct copy_run *runs, uint32_t n, struct errbuf *e)
{
	uint64_t total = 0, cap;
	void *bounce = NULL;
	cudaError_t err;
	int ret = 0;

	for (uint32_t i = 0; i < n; i++)
		total += runs[i].bytes;
	cap = total < STAGE_BYTES ? total : STAGE_BYTES;
	if (!cap)
		return 0;
	err = cudaHostAlloc(&bounce, cap, cudaHostAllocPortable);
	if (err != cudaSuccess)
		return fail(s, err, "cudaHostAlloc of the peer copy's bounce buffer", e);
	for (uint32_t i = 0; i < n && !ret; i++)
		for (uint64_t off = 0; off < runs[i].bytes && !ret; off += cap) {
			uint64_t len = runs[i].bytes - off < cap ?
				       runs[i].bytes - off : cap;

			ret = staged_piece(d, (char *)dst->base + runs[i].dst_off + off,
					   s, (const char *)src->base +
					   runs[i].src_off + off, bounce, len, e);
		}
	err = cudaFreeHost(bounce);
	if (!ret && err != cudaSuccess)
		ret = fail(s, err, "cudaFreeHost of the bounce buffer", e);
	return ret;
}

int cuda_copy_peer(void *ctx, const struct tier_mem *dst, void *src_ctx,
		   const struct tier_mem *src, const struct copy_run *runs,
		   uint32_t n, struct errbuf *e)
{
	struct cuda_ctx *d = ctx, *s = src_ctx;

	if (!n)
		return 0;
	if (d->device == s->device || can_peer(s->device, d->device))
		return peer_runs(d, dst, s, src, runs, n, e);
	return staged_runs(d, dst, s, src, runs, n, e);
}

bool backend_cuda_peer_access(int a, int b)
{
	return a == b || can_peer(a, b);
}
