/* SPDX-License-Identifier: MIT */
/*
 * backend_cuda_internal.h - the cuda backend's context, shared by
 * backend_cuda.c (open/close, copies, fences) and backend_cuda_tier.c
 * (the device and host tiers). See backend_cuda.c's top comment.
 */
#ifndef KVPOOL_BACKEND_CUDA_INTERNAL_H
#define KVPOOL_BACKEND_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "backend.h"
#include "cuda_driver.h"
#include "list.h"

/* One device-tier allocation, so tier_free can find its handle. */
struct cuda_alloc {
	CUdeviceptr ptr;
	size_t size;
	CUmemGenericAllocationHandle handle;
	uint64_t peers;              /* bit d: GPU d may map it (copy_peer) */
	struct list_head link;       /* on cuda_ctx.allocs */
};

#define FENCE_RING 64
#define OUT_RING 64   /* copy_start tickets in flight at most */

struct cuda_ctx {
	int device;
	uint8_t uuid[16];            /* cuDeviceGetUuid of device: what clients match */
	cudaStream_t stream[2];      /* [COPY_D2H], [COPY_H2D] */
	pthread_mutex_t lock;        /* guards allocs */
	struct list_head allocs;     /* struct cuda_alloc */
	pthread_mutex_t fence_lock;  /* guards the fields below */
	cudaEvent_t ev[FENCE_RING];  /* fence f is ev[f % FENCE_RING] */
	/* Recorded before fence f's runs (both timed: fence_ns is the GPU
	 * time between them), and which fence a slot holds now. */
	cudaEvent_t ev_t0[FENCE_RING];
	uint64_t slot_fence[FENCE_RING];
	uint64_t issued;             /* the last fence handed out */
	uint64_t landed;             /* every fence <= landed has landed */
	const struct cuda_driver *cu; /* the process's driver functions */
	/* copy_start tickets: events on the device -> host stream, ticket t
	 * is out_ev[t % OUT_RING], handed out and waited for like fences. */
	pthread_mutex_t out_lock;
	cudaEvent_t out_ev[OUT_RING];
	uint64_t out_issued, out_landed;
};

/* -errno for a runtime / driver error. */
int cuda_errno(cudaError_t err);
int cu_errno(CUresult r);
/* Make x's device current on this thread (the runtime keeps it per thread). */
int cuda_use(struct cuda_ctx *x, struct errbuf *e);

/* backend_cuda_tier.c: backend_ops.tier_alloc / tier_free. */
int cuda_tier_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
		    struct tier_mem *out, struct errbuf *e);
void cuda_tier_free(void *ctx, struct tier_mem *m);
/* backend_cuda_peer.c: backend_ops.copy_peer. */
int cuda_copy_peer(void *ctx, const struct tier_mem *dst, void *src_ctx,
		   const struct tier_mem *src, const struct copy_run *runs,
		   uint32_t n, struct errbuf *e);
/* The registered device allocation at base (NULL: a host tier), unlinked
 * when take. */
struct cuda_alloc *alloc_find(struct cuda_ctx *x, const void *base, bool take);

#endif /* KVPOOL_BACKEND_CUDA_INTERNAL_H */
