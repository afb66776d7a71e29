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
#define ISSUE_RING 32 /* onloads queued for the issuer at most */
#define ISSUE_RUNS 256 /* runs of one queued onload (copy.h's batch holds as
			* many); a longer one is enqueued inline */

/* An onload queued for the issuer (backend_cuda_issue.c): fence f's runs,
 * in jobs[f % ISSUE_RING] from copy_async until the issuer recorded f. */
struct onload_job {
	struct tier_mem dst, src;    /* copies: the engine's may go first */
	uint32_t n;
	struct copy_run runs[ISSUE_RUNS];
};

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
	uint64_t recorded;           /* every fence <= recorded is on the stream
				      * (its runs and event enqueued) */
	uint64_t landed;             /* every fence <= landed has landed */
	/* The onload issuer (backend_cuda_issue.c), under fence_lock. */
	struct onload_job *jobs;     /* [ISSUE_RING]; NULL: onloads inline */
	pthread_t issuer;
	pthread_cond_t issue_work;   /* a job queued, or stop */
	pthread_cond_t issue_done;   /* a job recorded: room, and fence waits */
	bool issuer_idle, issuer_stop;
	const struct cuda_driver *cu; /* the process's driver functions */
	/* copy_start tickets: events on the device -> host stream, ticket t
	 * is out_ev[t % OUT_RING], handed out and waited for like fences. */
	pthread_mutex_t out_lock;
	cudaEvent_t out_ev[OUT_RING];
	uint64_t out_issued, out_landed;
};

/* backend_cuda_issue.c: the onload issuer's thread (none with
 * KVPOOL_ONLOAD_INLINE=1: jobs stays NULL), stopped after draining; the
 * queue, and the wait until every queued onload is on the stream (other
 * copies on the host -> device stream keep the order they had). All but
 * start and stop are called with fence_lock held. */
int cuda_issuer_start(struct cuda_ctx *x, struct errbuf *e);
void cuda_issuer_stop(struct cuda_ctx *x);
uint64_t cuda_issue_queue(struct cuda_ctx *x, const struct tier_mem *dst,
			  const struct tier_mem *src, const struct copy_run *runs,
			  uint32_t n);
void cuda_issue_drain_locked(struct cuda_ctx *x, uint64_t upto);
/* backend_cuda.c: enqueue fence f's runs and events on the host -> device
 * stream (fence_lock not held; only one thread records at a time). */
cudaError_t cuda_record_onload(struct cuda_ctx *x, uint64_t f,
			       const struct tier_mem *dst,
			       const struct tier_mem *src,
			       const struct copy_run *runs, uint32_t n);

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
