/* SPDX-License-Identifier: MIT */
/*
 * backend.h - where a tier's frames live and how bytes move between tiers.
 *
 * The engine above this line is the same for every backend. A backend
 * allocates a tier's memory (something a client can map: an fd) and copies
 * runs of bytes between the device and host tiers. The `shm` backend keeps
 * both tiers in sealed memfds and copies with memcpy; the `cuda` backend
 * keeps the device tier in cuMemCreate allocations and copies with
 * cudaMemcpyAsync on its own streams.
 *
 * Three ways to copy (the third, copy_start/copy_wait, below with the ops).
 * copy() returns once every byte has landed: the engine
 * uses it for device -> host copies (offload, demotion), because a demoted
 * history's device frames go back on the free list at once and may be handed
 * to the next prepare, so the copy out of them must be over by then.
 * copy_async() only enqueues and returns a fence: the engine uses it for
 * onload (host -> device), so a prepare that needs an onload returns at once
 * and the daemon completes it when fence_done() says the bytes are there;
 * the engine keeps every frame the copy reads or writes allocated and
 * untouched until then (engine_internal.h: the onload fence).
 *
 * Fences are numbers a backend context hands out in increasing order, and
 * they land in that order: when fence f has landed, so has every fence the
 * same context issued before f. 0 means "already landed". fence_done and
 * fence_wait are thread-safe and touch no engine state, so the daemon may
 * poll them without the engine's mutex; one context may serve several
 * engines (one per tenant on a GPU) on several threads.
 */
#ifndef KVPOOL_BACKEND_H
#define KVPOOL_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "errbuf.h"
#include "kvpool.h"

struct tier_mem {
	void *base;     /* the tier's address in the daemon: a CPU address when
			 * host_visible, else the backend's own (the cuda
			 * device tier's is a device pointer: never
			 * dereference it, read through the read op) */
	bool host_visible; /* the CPU may read and write base directly */
	uint64_t bytes;
	int fd;         /* what clients map; -1 if none */
};

/* One contiguous copy: bytes from src_off of one tier to dst_off of the other. */
struct copy_run {
	uint64_t dst_off;
	uint64_t src_off;
	uint64_t bytes;
};

enum copy_dir {
	COPY_D2H = 0, /* device tier -> host tier (offload, demotion) */
	COPY_H2D = 1, /* host tier -> device tier (onload) */
	COPY_D2D = 2, /* device tier -> device tier (copy on write; sync only) */
};

struct backend_ops {
	const char *name;
	/* Allocate a zeroed tier of bytes (> 0); -errno with a message. */
	int (*tier_alloc)(void *ctx, enum kvp_tier tier, uint64_t bytes,
			  struct tier_mem *out, struct errbuf *e);
	void (*tier_free)(void *ctx, struct tier_mem *m);
	/* Copy n runs; returns once every byte has landed. */
	int (*copy)(void *ctx, enum copy_dir dir, const struct tier_mem *dst,
		    const struct tier_mem *src, const struct copy_run *runs,
		    uint32_t n, struct errbuf *e);
	/* Enqueue n runs and return: *fence gets the fence the bytes land
	 * with (0: landed already). On an error nothing is in flight and
	 * *fence is 0. */
	int (*copy_async)(void *ctx, enum copy_dir dir, const struct tier_mem *dst,
			  const struct tier_mem *src, const struct copy_run *runs,
			  uint32_t n, uint64_t *fence, struct errbuf *e);
	/* Device -> host copies in a pipeline (the reclaimer's demotions):
	 * enqueue n runs and return a ticket (0: landed already); tickets of
	 * one context land in the order they were handed out, after every
	 * copy() enqueued before them. copy_wait() returns once the ticket's
	 * runs have landed: 0, or -EIO when they failed in flight. A
	 * demotion enqueues its next histories while the first land, so the
	 * link never idles between them and each history is finished (its
	 * device frames freed) as soon as its own copies are over. */
	int (*copy_start)(void *ctx, const struct tier_mem *dst,
			  const struct tier_mem *src, const struct copy_run *runs,
			  uint32_t n, uint64_t *ticket, struct errbuf *e);
	int (*copy_wait)(void *ctx, uint64_t ticket);
	/* Nonzero once fence has landed (at once for 0); never blocks. A copy
	 * that failed in flight counts as landed (the backend reports it). */
	int (*fence_done)(void *ctx, uint64_t fence);
	/* Return once fence has landed. */
	void (*fence_wait)(void *ctx, uint64_t fence);
	/* Optional (NULL: copy_async lands before it returns, and its wall
	 * time is the copy's). The device time of the copies of fences first
	 * .. last (first <= last, both landed): from the start of first's
	 * runs to the end of last's, which includes another caller's copies
	 * enqueued between them. 0 when it is no longer known (the fence's
	 * record was reused). Each fence's time is asked for once. */
	uint64_t (*fence_ns)(void *ctx, uint64_t first, uint64_t last);
	/* Read bytes at off of a tier into host memory at dst: the tier need
	 * not be host-visible (the cuda device tier is not). */
	int (*read)(void *ctx, const struct tier_mem *m, uint64_t off, void *dst,
		    uint64_t bytes, struct errbuf *e);
	/* Optional (NULL: only host-visible tiers, copied with memcpy). Copy
	 * n runs from src, a tier of another context of this backend (another
	 * GPU's pool: engine_move.h), into dst, a tier of ctx; returns once
	 * every byte has landed. The cuda backend copies peer to peer where
	 * the GPUs can (cudaMemcpyPeerAsync), else through pinned host memory. */
	int (*copy_peer)(void *ctx, const struct tier_mem *dst, void *src_ctx,
			 const struct tier_mem *src, const struct copy_run *runs,
			 uint32_t n, struct errbuf *e);
};

extern const struct backend_ops backend_shm;

/*
 * The cuda backend (built where CUDA is: KVPOOL_HAVE_CUDA): the device tier
 * is one cuMemCreate allocation on GPU `device`, exported as a POSIX fd for
 * clients; the host tier is pinned host memory; copies are cudaMemcpyAsync
 * on the backend's own streams (one per direction), batched over runs;
 * fences are CUDA events recorded on the host -> device stream. ctx comes from
 * backend_cuda_open() and goes to engine_config.backend_ctx.
 */
extern const struct backend_ops backend_cuda;
int backend_cuda_open(int device, void **ctx, struct errbuf *e);
void backend_cuda_close(void *ctx);
/* The 16-byte UUID (cuDeviceGetUuid) of ctx's device: what names that GPU in
 * every process, whatever its CUDA_VISIBLE_DEVICES (the ordinal does not). */
void backend_cuda_uuid(const void *ctx, uint8_t uuid[16]);
/* Whether GPUs a and b reach each other both ways (cudaDeviceCanAccessPeer):
 * copy_peer goes peer to peer, else through pinned host memory. */
bool backend_cuda_peer_access(int a, int b);

/*
 * The striped backend (backend_stripe.c): a tensor-parallel pool over n
 * rank backends of one kind (rank_ops; rank_ctx[r] each: on cuda
 * backend_cuda_open() of rank r's GPU, on shm NULL, rank_ctx itself may be
 * NULL then). The engine's page_bytes is n * rank_page_bytes: a frame is
 * every rank's page, rank after rank, in the host tier (rank 0's backend
 * allocates it); the device tier is striped, rank r's allocation holding
 * rank r's page of frame f at f * rank_page_bytes. Its device tier_mem is
 * not host-visible, base an opaque handle, fd rank 0's.
 */
#define BACKEND_STRIPE_MAX 8u
extern const struct backend_ops backend_stripe;
int backend_stripe_open(const struct backend_ops *rank_ops,
			void *const *rank_ctx, uint32_t n,
			uint64_t rank_page_bytes, void **ctx, struct errbuf *e);
/* After every tier of ctx was freed; the rank contexts stay the caller's. */
void backend_stripe_close(void *ctx);
/* Rank r's device fd and mapped size of a striped device tier m (for the
 * welcome of rank r's client); -EINVAL when m is not ctx's or r >= n. */
int backend_stripe_fd(void *ctx, const struct tier_mem *m, uint32_t rank,
		      uint64_t *bytes);

#endif /* KVPOOL_BACKEND_H */
