/* SPDX-License-Identifier: MIT */
/*
 * replay_cuda.c - `kvbench replay --backend cuda`: the GPU side of a
 * pipeline process, and the copy ceilings the offload is compared with.
 *
 * A PIPELINE (its own process, CUDA first touched after the fork) gets a
 * device buffer of batch x the largest request's tokens and a non-blocking
 * stream on the pool's GPU. For a batch it writes the K/V of every new
 * token into the buffer (a cudaMemsetAsync: this stands in for the model,
 * whose output is device memory) and appends them all with one
 * kvp_append_batch_async() on the stream; the queued commits wait for the
 * launch (libkvpool records an event per lease). Nothing here waits.
 *
 * THE CEILINGS are measured by the parent after the pipelines are gone (a
 * process that used CUDA must not fork pipelines that use it), on the same
 * GPU, timed the way the daemon times its device -> host copies (ns_d2h:
 * the wall clock around enqueueing the runs and cudaStreamSynchronize):
 *   d2h_pages  k copies of one page each, one sync: the shape of one
 *              demotion of k pages whose frames are not contiguous
 *   d2h_run    the same k pages as one copy (contiguous frames)
 *   d2h_bulk   1 GiB copies: the link's peak
 * k is the run's mean pages per demotion. The buffers: cudaMalloc and
 * cudaHostAlloc(portable), the kind of pinned memory of the host tier.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kvbench.h"
#include "replay.h"

#define CEIL_BUF_BYTES (1ull << 30)  /* each side */
#define CEIL_BYTES (4ull << 30)      /* moved per measurement */
#define CEIL_REPS 5                  /* the median counts */

struct rgpu {
	int device;
	cudaStream_t s;
	unsigned char *buf;
	uint64_t bytes;
	uint32_t gen;                /* the byte the next batch is filled with */
	struct kvp_append_item *items;
	uint32_t cap;
};

int rgpu_open(struct rgpu **out, struct kvp_client *c, uint64_t bytes, char *err,
	      size_t errlen)
{
	struct rgpu *g = calloc(1, sizeof(*g));
	cudaError_t e;

	if (!g) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	g->device = kvp_cuda_device(c);
	if (g->device < 0) {
		snprintf(err, errlen, "--backend cuda: the kvpoold serves its pool from host "
			 "memory (backend shm), not a GPU");
		free(g);
		return -EINVAL;
	}
	g->bytes = bytes;
	if ((e = cudaSetDevice(g->device)) != cudaSuccess ||
	    (e = cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking)) != cudaSuccess ||
	    (e = cudaMalloc((void **)&g->buf, bytes)) != cudaSuccess ||
	    (e = cudaMemset(g->buf, 0x5a, bytes)) != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: a stream and a K/V buffer of %" PRIu64 " bytes: %s",
			 g->device, bytes, cudaGetErrorString(e));
		rgpu_close(g);
		return -ENOMEM;
	}
	*out = g;
	return 0;
}

void rgpu_close(struct rgpu *g)
{
	if (!g)
		return;
	if (g->s)
		cudaStreamSynchronize(g->s);
	if (g->buf)
		cudaFree(g->buf);
	if (g->s)
		cudaStreamDestroy(g->s);
	free(g->items);
	free(g);
}

int rgpu_append(struct rgpu *g, struct kvp_client *c, struct rlease *const *l,
		uint32_t n, char *err, size_t errlen)
{
	const uint64_t tb = kvp_client_layout(c)->token_bytes;
	uint64_t tokens = 0;
	cudaError_t e;
	int rc;

	if (n > g->cap) {
		struct kvp_append_item *p = realloc(g->items, n * sizeof(*p));

		if (!p) {
			snprintf(err, errlen, "out of memory for %u append items", n);
			return -ENOMEM;
		}
		g->items = p;
		g->cap = n;
	}
	for (uint32_t i = 0; i < n; i++) {
		g->items[i] = (struct kvp_append_item){ .lease = &l[i]->kl, .first = 0,
							.n = l[i]->n_new };
		tokens += l[i]->n_new;
	}
	if (tokens * tb > g->bytes) {
		snprintf(err, errlen, "%" PRIu64 " new tokens in a batch, more than the "
			 "%" PRIu64 " of the K/V buffer", tokens, g->bytes / tb);
		return -E2BIG;
	}
	/* The model's output for this batch. */
	e = cudaMemsetAsync(g->buf, (int)(++g->gen & 0xff), tokens * tb, g->s);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "cudaMemsetAsync: %s", cudaGetErrorString(e));
		return -EIO;
	}
	rc = n == 1 ? kvp_append_async(c, g->items[0].lease, 0, g->items[0].n, g->buf, g->s) :
	     kvp_append_batch_async(c, g->items, n, g->buf, g->s);
	if (rc < 0) {
		snprintf(err, errlen, "%s", kvp_last_error(c));
		return rc;
	}
	return 0;
}

/* ---------------------------------------------------------------- ceilings */

/* Bytes per second of `bytes` moved as batches of k copies of `chunk` each,
 * a sync after each batch; offsets walk the buffers. */
static int timed_copies(cudaStream_t s, void *dst, const void *src, uint64_t buf,
			uint64_t chunk, uint32_t k, uint64_t bytes,
			enum cudaMemcpyKind kind, double *out)
{
	uint64_t off = 0, moved = 0, t0 = now_ns();
	cudaError_t e = cudaSuccess;

	while (moved < bytes && e == cudaSuccess) {
		for (uint32_t i = 0; i < k && e == cudaSuccess; i++) {
			if (off + chunk > buf)
				off = 0;
			e = cudaMemcpyAsync((char *)dst + off, (const char *)src + off, chunk,
					    kind, s);
			off += chunk;
			moved += chunk;
		}
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(s);
	}
	*out = (double)moved / ((double)(now_ns() - t0) / 1e9);
	return e == cudaSuccess ? 0 : -EIO;
}

/* DUPLEX_BYTES of host -> device copies queued on s2 (about twice what the
 * measured copies take at the link's speed), then timed_copies() on s, then
 * s2 drained: the measured copies run against a busy opposite direction. */
#define DUPLEX_BUF (256ull << 20)
#define DUPLEX_COPIES 32
static int timed_duplex(cudaStream_t s, cudaStream_t s2, void *d2, void *h2, void *dst,
			const void *src, uint64_t chunk, uint32_t k, double *out)
{
	cudaError_t e = cudaSuccess;
	int rc;

	for (int i = 0; i < DUPLEX_COPIES && e == cudaSuccess; i++)
		e = cudaMemcpyAsync(d2, h2, DUPLEX_BUF, cudaMemcpyHostToDevice, s2);
	rc = e == cudaSuccess ? timed_copies(s, dst, src, CEIL_BUF_BYTES, chunk, k, CEIL_BYTES,
					      cudaMemcpyDeviceToHost, out) : -EIO;
	if (cudaStreamSynchronize(s2) != cudaSuccess)
		rc = -EIO;
	return rc;
}

static double median5(double *v)
{
	return median_f64(v, CEIL_REPS);
}

int rgpu_measure_ceiling(int device, uint64_t page_bytes, uint32_t k,
			 struct rgpu_ceiling *c, char *err, size_t errlen)
{
	double v[7][CEIL_REPS];
	struct cudaDeviceProp prop;
	cudaStream_t s = NULL, s2 = NULL;
	void *d = NULL, *h = NULL, *d2 = NULL, *h2 = NULL;
	uint32_t kmax = (uint32_t)(CEIL_BUF_BYTES / page_bytes);
	cudaError_t e;
	int rc = 0;

	memset(c, 0, sizeof(*c));
	c->device = device;
	c->page_bytes = page_bytes;
	if (!kmax) {
		snprintf(err, errlen, "pages of %" PRIu64 " bytes are larger than the 1 GiB "
			 "ceiling buffers", page_bytes);
		return -E2BIG;
	}
	c->pages_per_sync = k < 1 ? 1 : k > kmax ? kmax : k;
	if ((e = cudaSetDevice(device)) != cudaSuccess ||
	    (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
	    (e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess ||
	    (e = cudaMalloc(&d, CEIL_BUF_BYTES)) != cudaSuccess ||
	    (e = cudaHostAlloc(&h, CEIL_BUF_BYTES, cudaHostAllocPortable)) != cudaSuccess ||
	    (e = cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking)) != cudaSuccess ||
	    (e = cudaMalloc(&d2, DUPLEX_BUF)) != cudaSuccess ||
	    (e = cudaHostAlloc(&h2, DUPLEX_BUF, cudaHostAllocPortable)) != cudaSuccess ||
	    (e = cudaMemset(d, 1, CEIL_BUF_BYTES)) != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: buffers for the copy ceilings: %s", device,
			 cudaGetErrorString(e));
		rc = -EIO;
		goto out;
	}
	memset(h, 2, CEIL_BUF_BYTES);
	snprintf(c->gpu, sizeof(c->gpu), "%s", prop.name);
	/* Warm-up: both directions once. */
	if (timed_copies(s, h, d, CEIL_BUF_BYTES, CEIL_BUF_BYTES, 1, CEIL_BUF_BYTES,
			 cudaMemcpyDeviceToHost, &v[0][0]) ||
	    timed_copies(s, d, h, CEIL_BUF_BYTES, CEIL_BUF_BYTES, 1, CEIL_BUF_BYTES,
			 cudaMemcpyHostToDevice, &v[0][0]))
		goto fail;
	for (int r = 0; r < CEIL_REPS; r++) {
		const uint32_t kk = c->pages_per_sync;

		if (timed_copies(s, h, d, CEIL_BUF_BYTES, page_bytes, kk, CEIL_BYTES,
				 cudaMemcpyDeviceToHost, &v[0][r]) ||
		    timed_copies(s, h, d, CEIL_BUF_BYTES, page_bytes * kk, 1, CEIL_BYTES,
				 cudaMemcpyDeviceToHost, &v[1][r]) ||
		    timed_copies(s, h, d, CEIL_BUF_BYTES, CEIL_BUF_BYTES, 1, CEIL_BYTES,
				 cudaMemcpyDeviceToHost, &v[2][r]) ||
		    timed_copies(s, d, h, CEIL_BUF_BYTES, page_bytes, kk, CEIL_BYTES,
				 cudaMemcpyHostToDevice, &v[3][r]) ||
		    timed_copies(s, d, h, CEIL_BUF_BYTES, CEIL_BUF_BYTES, 1, CEIL_BYTES,
				 cudaMemcpyHostToDevice, &v[4][r]) ||
		    timed_duplex(s, s2, d2, h2, h, d, page_bytes, kk, &v[5][r]) ||
		    timed_duplex(s, s2, d2, h2, h, d, page_bytes * kk, 1, &v[6][r]))
			goto fail;
	}
	c->d2h_pages = median5(v[0]);
	c->d2h_run = median5(v[1]);
	c->d2h_bulk = median5(v[2]);
	c->h2d_pages = median5(v[3]);
	c->h2d_bulk = median5(v[4]);
	c->d2h_pages_duplex = median5(v[5]);
	c->d2h_run_duplex = median5(v[6]);
out:
	if (s)
		cudaStreamDestroy(s);
	if (s2)
		cudaStreamDestroy(s2);
	if (d2)
		cudaFree(d2);
	if (h2)
		cudaFreeHost(h2);
	if (d)
		cudaFree(d);
	if (h)
		cudaFreeHost(h);
	return rc;
fail:
	snprintf(err, errlen, "GPU %d: cudaMemcpyAsync for the ceilings: %s", device,
		 cudaGetErrorString(cudaGetLastError()));
	rc = -EIO;
	goto out;
}
