/* SPDX-License-Identifier: MIT */
/*
 * backend_cuda_issue.c - the onload issuer: a thread per cuda context that
 * enqueues onloads (host -> device copies) on the stream, so the daemon
 * thread that asked for one does not (issue 32).
 *
 * Why. An onload is asked for by a worker serving a prepare, under the
 * shard's lock. Enqueuing it (two event records and a batch of copies on
 * the stream) costs that worker, and every prepare behind it in its lane
 * or on its shard, several microseconds of CUDA runtime calls; plain
 * prepares, which copy nothing, waited for them in their p99. Now the
 * worker only copies the runs into a queue slot and takes the next fence
 * number; the issuer makes the CUDA calls.
 *
 * Layout (all under cuda_ctx.fence_lock):
 *
 *   fences  ... landed ... recorded ... issued
 *                  |          |           |
 *     on the GPU --+          |           +-- handed to the engine last
 *     and done                +-- runs and event on the stream
 *   jobs[f % ISSUE_RING] holds fence f's runs for recorded < f <= issued.
 *
 * Order. Fences are numbered when queued (copy_async) and the one issuer
 * records them in number order, so they still land in number order: the
 * promise of backend.h that fence f landed means every earlier one has.
 * A queued fence has not landed (fence_done says no without asking CUDA);
 * fence_wait first waits for the issuer to record it. The host -> device
 * stream also carries synchronous copies (copy(): host -> device and
 * device -> device, e.g. a copy on write of a page an onload just filled);
 * they used to run after every onload asked for before them by stream
 * order, and still do: copy() waits until the issuer has recorded every
 * fence queued before it (cuda_issue_drain_locked) before it enqueues.
 *
 * Room. ISSUE_RING jobs queue at most; copy_async with the ring full waits
 * for the issuer (rare: it records one job in a few microseconds).
 *
 * Errors. A failed enqueue in the issuer is reported on stderr, like a copy
 * that fails in flight (backend_cuda.c), and the stream is synchronised so
 * nothing of it stays in flight; its fence then reads as landed. CUDA
 * errors on a copy stream are fatal to the context anyway.
 *
 * KVPOOL_ONLOAD_INLINE=1 (a diagnostic, kvpoold(8)) starts no issuer:
 * copy_async enqueues in the caller's thread, as before, for an A/B.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_internal.h"

static void *issuer_main(void *arg)
{
	struct cuda_ctx *x = arg;

	cudaSetDevice(x->device);
	pthread_mutex_lock(&x->fence_lock);
	for (;;) {
		struct onload_job *j;
		cudaError_t err;
		uint64_t f;

		while (x->recorded == x->issued && !x->issuer_stop) {
			x->issuer_idle = true;
			pthread_cond_wait(&x->issue_work, &x->fence_lock);
		}
		x->issuer_idle = false;
		if (x->recorded == x->issued)
			break; /* stopping, with nothing queued */
		f = x->recorded + 1;
		j = &x->jobs[f % ISSUE_RING];
		/* The event slot's previous fence (f - FENCE_RING) must have
		 * landed before the slot is recorded again. */
		if (f - x->landed > FENCE_RING) {
			pthread_mutex_unlock(&x->fence_lock);
			cudaEventSynchronize(x->ev[f % FENCE_RING]);
			pthread_mutex_lock(&x->fence_lock);
			if (x->landed < f - FENCE_RING)
				x->landed = f - FENCE_RING;
		}
		/* The slot is ours until recorded moves past f: copy_async
		 * writes slot f % ISSUE_RING again only for fence f + ISSUE_RING. */
		pthread_mutex_unlock(&x->fence_lock);
		err = cuda_record_onload(x, f, &j->dst, &j->src, j->runs, j->n);
		if (err != cudaSuccess) {
			fprintf(stderr, "kvpool: cuda device %d: an onload of %u runs "
				"could not be enqueued: %s\n", x->device, j->n,
				cudaGetErrorString(err));
			cudaStreamSynchronize(x->stream[COPY_H2D]);
		}
		pthread_mutex_lock(&x->fence_lock);
		x->slot_fence[f % FENCE_RING] = f;
		x->recorded = f;
		pthread_cond_broadcast(&x->issue_done);
	}
	pthread_mutex_unlock(&x->fence_lock);
	return NULL;
}

int cuda_issuer_start(struct cuda_ctx *x, struct errbuf *e)
{
	const char *inl = getenv("KVPOOL_ONLOAD_INLINE");
	int ret;

	if (inl && strcmp(inl, "0"))
		return 0;
	x->jobs = calloc(ISSUE_RING, sizeof(*x->jobs));
	if (!x->jobs)
		return errbuf_set(e, -ENOMEM, "cuda device %d: out of memory for the "
				  "onload queue", x->device);
	ret = pthread_create(&x->issuer, NULL, issuer_main, x);
	if (ret) {
		free(x->jobs);
		x->jobs = NULL;
		return errbuf_set(e, -ret, "cuda device %d: cannot start the onload "
				  "thread: %s", x->device, strerror(ret));
	}
	return 0;
}

void cuda_issuer_stop(struct cuda_ctx *x)
{
	if (!x->jobs)
		return;
	pthread_mutex_lock(&x->fence_lock);
	x->issuer_stop = true;
	pthread_cond_signal(&x->issue_work);
	pthread_mutex_unlock(&x->fence_lock);
	pthread_join(x->issuer, NULL); /* after it recorded everything queued */
	free(x->jobs);
	x->jobs = NULL;
}

uint64_t cuda_issue_queue(struct cuda_ctx *x, const struct tier_mem *dst,
			  const struct tier_mem *src, const struct copy_run *runs,
			  uint32_t n)
{
	struct onload_job *j;
	uint64_t f;

	while (x->issued - x->recorded >= ISSUE_RING)
		pthread_cond_wait(&x->issue_done, &x->fence_lock);
	f = ++x->issued;
	j = &x->jobs[f % ISSUE_RING];
	j->dst = *dst;
	j->src = *src;
	j->n = n;
	memcpy(j->runs, runs, (size_t)n * sizeof(*runs));
	/* A wake-up only where it sleeps: a busy issuer finds f itself. */
	if (x->issuer_idle)
		pthread_cond_signal(&x->issue_work);
	return f;
}

void cuda_issue_drain_locked(struct cuda_ctx *x, uint64_t upto)
{
	while (x->recorded < upto)
		pthread_cond_wait(&x->issue_done, &x->fence_lock);
}
