/* SPDX-License-Identifier: MIT */
/*
 * backend_cuda.c - the cuda backend: the device tier is one cuMemCreate
 * allocation on one GPU, exported as a POSIX fd; the host tier is pinned host
 * memory; copies are cudaMemcpyAsync on the backend's own streams.
 *
 * Files. This one: open/close, copies, fences and tickets; the tiers
 * (device_alloc, host_alloc) are backend_cuda_tier.c; struct cuda_ctx,
 * which both use, is backend_cuda_internal.h.
 *
 * Linking. This file is plain C and links the static CUDA runtime
 * (cudart_static), which loads libcuda.so.1 only on the first CUDA call. The
 * driver API functions it needs (cuMemCreate and friends) come from
 * lib/cuda_driver.c, the loader libkvpool uses too, in backend_cuda_open();
 * they are looked up, never linked, so kvpoold and the engine start and
 * serve the shm backend on a machine with no GPU driver at all.
 *
 * The device tier. cuMemCreate(PINNED, on `device`, requestedHandleTypes =
 * POSIX_FILE_DESCRIPTOR) of the requested size rounded up to the recommended
 * allocation granularity; exported once with cuMemExportToShareableHandle
 * (the fd clients receive over SCM_RIGHTS and import with
 * cuMemImportFromShareableHandle), and mapped here with cuMemAddressReserve +
 * cuMemMap + cuMemSetAccess(read-write on `device`). tier_mem.base is that
 * device pointer: not host-visible, which is why the engine reads through
 * the backend's read op. tier_mem.bytes is the rounded size (the client maps
 * all of it; the engine's frames are the first device_frames * page_bytes).
 *
 * The host tier. cudaHostAlloc(portable) pinned memory: host-visible (base is
 * a host pointer) and DMA-able at full PCIe/NVLink-C2C speed, which pageable
 * memory is not (README: 8.7 vs 55 GB/s). It is the daemon's own: fd -1.
 *
 * Copies. One stream per direction (non-blocking, so they never serialise
 * with the legacy default stream); a batch of runs is one
 * cudaMemcpyBatchAsync (one cudaMemcpyAsync per run where the runtime
 * refuses it: measured on an H100, 1 MiB pages moved device to host 16%
 * faster batched, within 4% of one contiguous copy of the same bytes).
 * copy_start() enqueues device -> host runs and an event (a ticket) on the
 * device -> host stream; copy_wait() waits for it, so the reclaimer keeps
 * the link busy while it finishes the pieces that landed.
 * copy() waits (cudaStreamSynchronize): the engine uses it for
 * device -> host copies, whose source frames it frees right after.
 * copy_async() (onload) does not wait: it records an event after the runs
 * on the host -> device stream and returns its fence. Fences are numbered
 * in record order on that one stream, so they land in order; the events
 * live in a ring of FENCE_RING, slot fence % FENCE_RING, and a slot is
 * recorded again only once its previous fence has landed (copy_async waits
 * for the oldest when FENCE_RING are in flight). `landed` is the highest
 * fence known to have landed; fence_done() queries the fence's own event
 * (non-blocking) and fence_wait() synchronises on it outside the lock, so
 * one tenant waiting never stalls another's polling. Each fence also has a
 * start event recorded before its runs (both events timed): fence_ns() is
 * the GPU time between them, the onload's copy time without its wait in
 * the stream's queue (ns_h2d). A copy_async of
 * device -> host runs (the engine makes none) is copied synchronously and
 * gets fence 0, so the one stream keeps the order.
 *
 * Onloads are enqueued by the context's issuer thread, not the caller
 * (backend_cuda_issue.c, issue 32): copy_async queues the runs and
 * returns the fence; fences still land in number order.
 *
 * Threads. One context (backend_cuda_open) serves every engine on its
 * device; engines are called from several daemon threads (one tenant mutex
 * each), and the CUDA runtime's current device is per thread, so every entry
 * point sets it first. Two threads syncing the same stream at once is
 * correct (each waits for at least its own copies), at worst slower.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "backend_cuda_internal.h"
#include "clock.h"

static void d2h_prof_dump(void); /* the KVPOOL_COPY_PROFILE diagnostic */

/* ------------------------------------------------------------ errors */

int cuda_errno(cudaError_t err)
{
	switch (err) {
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidDevice:
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	case cudaErrorInvalidValue:
		return -EINVAL;
	default:
		return -EIO;
	}
}

int cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Make x's device current on this thread (the runtime keeps it per thread). */
int cuda_use(struct cuda_ctx *x, struct errbuf *e)
{
	cudaError_t err = cudaSetDevice(x->device);

	if (err != cudaSuccess)
		return errbuf_set(e, cuda_errno(err), "cuda device %d: cudaSetDevice: %s",
				  x->device, cudaGetErrorString(err));
	return 0;
}

/* ------------------------------------------------------------ open / close */

/* The driver functions (lib/cuda_driver.c), or why not, naming the device. */
static int driver_get(struct cuda_ctx *x, struct errbuf *e)
{
	struct cuda_driver_error why;

	x->cu = cuda_driver_get(&why);
	if (x->cu)
		return 0;
	if (why.err != cudaSuccess)
		return errbuf_set(e, cuda_errno(why.err), "cuda device %d: cannot "
				  "look up %s in the CUDA driver: %s", x->device,
				  why.sym, cudaGetErrorString(why.err));
	return errbuf_set(e, -ENOSYS, "cuda device %d: the CUDA driver has no %s "
			  "(%s); kvpoold needs a driver for " CUDA_DRIVER_ABI_NAME
			  " or newer", x->device, why.sym,
			  why.query == cudaDriverEntryPointVersionNotSufficent ?
			  "driver too old" : "symbol not found");
}

/*
 * The device's UUID. Clients find the pool's GPU by it, not by the ordinal:
 * an ordinal only means something under the CUDA_VISIBLE_DEVICES of the
 * process that counted it, the UUID names one GPU everywhere.
 */
static int device_uuid(struct cuda_ctx *x, struct errbuf *e)
{
	CUdevice dev;
	CUuuid u;
	CUresult r;

	r = x->cu->device_get(&dev, x->device);
	if (r == CUDA_SUCCESS)
		r = x->cu->device_uuid(&u, dev);
	if (r != CUDA_SUCCESS)
		return errbuf_set(e, cu_errno(r), "cuda device %d: cannot read its "
				  "UUID (cuDeviceGetUuid): %s", x->device,
				  cuda_driver_strerror(x->cu, r));
	_Static_assert(sizeof(u.bytes) == sizeof(x->uuid), "CUuuid is 16 bytes");
	memcpy(x->uuid, u.bytes, sizeof(x->uuid));
	return 0;
}

void backend_cuda_uuid(const void *ctx, uint8_t uuid[16])
{
	const struct cuda_ctx *x = ctx;

	memcpy(uuid, x->uuid, sizeof(x->uuid));
}

int backend_cuda_open(int device, void **out, struct errbuf *e)
{
	struct cuda_ctx *x;
	cudaError_t err;
	int n = 0, ret;

	*out = NULL;
	err = cudaGetDeviceCount(&n);
	if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
		int drv = 0;

		/* The runtime's words ("driver version is insufficient") say
		 * the same when there is no driver at all: say which. */
		cudaDriverGetVersion(&drv);
		return errbuf_set(e, -ENODEV, "backend cuda: %s (this kvpoold "
				  "was built with CUDA %d.%d); install or update the "
				  "NVIDIA driver (nvidia-smi must list the GPU), or "
				  "run with backend=shm", !drv ? "no NVIDIA driver is "
				  "loaded on this machine" : err == cudaErrorNoDevice ?
				  "the NVIDIA driver sees no GPU" : "the NVIDIA driver "
				  "is older than this build needs", CUDART_VERSION / 1000,
				  CUDART_VERSION % 1000 / 10);
	}
	if (err != cudaSuccess)
		return errbuf_set(e, -ENODEV, "cuda device %d: no usable CUDA driver "
				  "or device: %s; use backend=shm", device,
				  cudaGetErrorString(err));
	if (!n)
		return errbuf_set(e, -ENODEV, "cuda device %d does not exist: this "
				  "machine has 0 CUDA devices; use backend=shm",
				  device);
	if (device < 0 || device >= n)
		return errbuf_set(e, -ENODEV, "cuda device %d does not exist: this "
				  "machine has %d CUDA device(s), ordinals 0 to %d; "
				  "fix devices=", device, n, n - 1);
	x = calloc(1, sizeof(*x));
	if (!x)
		return errbuf_set(e, -ENOMEM, "cuda device %d: out of memory", device);
	x->device = device;
	INIT_LIST_HEAD(&x->allocs);
	pthread_mutex_init(&x->lock, NULL);
	pthread_mutex_init(&x->fence_lock, NULL);
	pthread_mutex_init(&x->out_lock, NULL);
	pthread_cond_init(&x->issue_work, NULL);
	pthread_cond_init(&x->issue_done, NULL);
	ret = cuda_use(x, e);
	if (ret)
		goto fail;
	for (int i = 0; i < 2 * FENCE_RING + OUT_RING; i++) {
		cudaEvent_t *ev = i < FENCE_RING ? &x->ev[i] :
				  i < 2 * FENCE_RING ? &x->ev_t0[i - FENCE_RING] :
				  &x->out_ev[i - 2 * FENCE_RING];

		/* The onload fences are timed (ns_h2d, cuda_fence_ns); the
		 * tickets only synchronise. */
		err = cudaEventCreateWithFlags(ev, i < 2 * FENCE_RING ?
					       cudaEventDefault : cudaEventDisableTiming);
		if (err != cudaSuccess) {
			ret = errbuf_set(e, cuda_errno(err), "cuda device %d: cannot "
					 "create a copy event: %s", device,
					 cudaGetErrorString(err));
			goto fail;
		}
	}
	for (int d = 0; d < 2; d++) {
		err = cudaStreamCreateWithFlags(&x->stream[d], cudaStreamNonBlocking);
		if (err != cudaSuccess) {
			ret = errbuf_set(e, cuda_errno(err), "cuda device %d: cannot "
					 "create a copy stream: %s", device,
					 cudaGetErrorString(err));
			goto fail;
		}
	}
	ret = driver_get(x, e);
	if (ret)
		goto fail;
	ret = device_uuid(x, e);
	if (ret)
		goto fail;
	ret = cuda_issuer_start(x, e);
	if (ret)
		goto fail;
	*out = x;
	return 0;
fail:
	backend_cuda_close(x);
	return ret;
}

void backend_cuda_close(void *ctx)
{
	struct cuda_ctx *x = ctx;

	if (!x)
		return;
	if (getenv("KVPOOL_COPY_PROFILE"))
		d2h_prof_dump();
	cuda_issuer_stop(x); /* everything queued on the stream first */
	cudaSetDevice(x->device);
	for (int d = 0; d < 2; d++)
		if (x->stream[d])
			cudaStreamSynchronize(x->stream[d]);
	for (int i = 0; i < FENCE_RING; i++) {
		if (x->ev[i])
			cudaEventDestroy(x->ev[i]);
		if (x->ev_t0[i])
			cudaEventDestroy(x->ev_t0[i]);
	}
	for (int i = 0; i < OUT_RING; i++)
		if (x->out_ev[i])
			cudaEventDestroy(x->out_ev[i]);
	for (int d = 0; d < 2; d++)
		if (x->stream[d])
			cudaStreamDestroy(x->stream[d]);
	/* Engines free their tiers before the context goes; anything left is
	 * a caller's leak, reclaimed by the driver at exit. */
	while (!list_empty(&x->allocs)) {
		struct cuda_alloc *a = list_first_entry(&x->allocs,
							struct cuda_alloc, link);

		list_del(&a->link);
		free(a);
	}
	pthread_mutex_destroy(&x->lock);
	pthread_mutex_destroy(&x->fence_lock);
	pthread_mutex_destroy(&x->out_lock);
	pthread_cond_destroy(&x->issue_work);
	pthread_cond_destroy(&x->issue_done);
	free(x);
}

/* ------------------------------------------------------------ copies */

/* The engine treats a failed copy as a hardware fault and does not look at
 * the message: say it here, where someone may read it. */
static int copy_failed(struct cuda_ctx *x, enum copy_dir dir, uint32_t n,
		       const char *step, cudaError_t err, struct errbuf *e)
{
	int ret = errbuf_set(e, cuda_errno(err), "cuda device %d: %s copy of %"
			     PRIu32 " run(s): %s: %s", x->device,
			     dir == COPY_D2H ? "device-to-host" : "host-to-device",
			     n, step, cudaGetErrorString(err));

	fprintf(stderr, "kvpool: %s\n", e ? e->msg : "cuda copy failed");
	return ret;
}

/*
 * cudaMemcpyBatchAsync (CUDA 12.8+): a batch of runs in one call, which the
 * driver may hand to the copy engine as one piece of work instead of one per
 * page. Off with KVPOOL_CUDA_COPY_BATCH=0 (to compare), and from the first
 * call the runtime refuses on.
 */
#define COPY_BATCH_MAX 256
static int batch_api = -1;

static bool use_batch_api(void)
{
	int on = __atomic_load_n(&batch_api, __ATOMIC_RELAXED);

	if (on < 0) {
		const char *v = getenv("KVPOOL_CUDA_COPY_BATCH");

		on = !(v && v[0] == '0');
		__atomic_store_n(&batch_api, on, __ATOMIC_RELAXED);
	}
	return on;
}

/* Enqueue the runs on the direction's stream; the first error, if any. */
static cudaError_t enqueue_runs(struct cuda_ctx *x, enum copy_dir dir,
				const struct tier_mem *dst,
				const struct tier_mem *src,
				const struct copy_run *runs, uint32_t n)
{
	enum cudaMemcpyKind kind = dir == COPY_D2H ? cudaMemcpyDeviceToHost :
				   dir == COPY_D2D ? cudaMemcpyDeviceToDevice :
						     cudaMemcpyHostToDevice;
	cudaStream_t s = x->stream[dir == COPY_D2H ? COPY_D2H : COPY_H2D];
	cudaError_t err = cudaSuccess;

	if (n > 1 && n <= COPY_BATCH_MAX && use_batch_api()) {
		void *dsts[COPY_BATCH_MAX];
		const void *srcs[COPY_BATCH_MAX];
		size_t sizes[COPY_BATCH_MAX], idx = 0;
		struct cudaMemcpyAttributes attr = {
			.srcAccessOrder = cudaMemcpySrcAccessOrderStream,
		};

		for (uint32_t i = 0; i < n; i++) {
			dsts[i] = (char *)dst->base + runs[i].dst_off;
			srcs[i] = (const char *)src->base + runs[i].src_off;
			sizes[i] = runs[i].bytes;
		}
		err = cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, s);
		if (err == cudaSuccess)
			return err;
		/* Not taken (nothing enqueued): the runs one by one, from now on. */
		cudaGetLastError();
		__atomic_store_n(&batch_api, 0, __ATOMIC_RELAXED);
		err = cudaSuccess;
	}
	for (uint32_t i = 0; i < n && err == cudaSuccess; i++)
		err = cudaMemcpyAsync((char *)dst->base + runs[i].dst_off,
				      (const char *)src->base + runs[i].src_off,
				      runs[i].bytes, kind, s);
	return err;
}

/*
 * The device -> host profile (KVPOOL_COPY_PROFILE=FILE, a diagnostic; see
 * copy.c): wall time and GPU time (events around the runs) of each copy(),
 * split by whether an onload was running on the other stream when it
 * started, appended to FILE when the context closes. Whether offload is
 * slow on the link or around it (issue 14).
 */
struct d2h_prof {
	uint64_t calls, bytes, wall_ns, gpu_ns, enq_ns;
};
static struct d2h_prof d2h_prof[2]; /* [onload running at the start] */
static pthread_mutex_t d2h_prof_lock = PTHREAD_MUTEX_INITIALIZER;

static void d2h_prof_dump(void)
{
	const char *path = getenv("KVPOOL_COPY_PROFILE");
	FILE *f = path ? fopen(path, "a") : NULL;

	if (!f)
		return;
	for (int b = 0; b < 2; b++) {
		const struct d2h_prof *p = &d2h_prof[b];

		fprintf(f, "cuda d2h onload_running %d calls %llu bytes %llu wall_ns %llu "
			"gpu_ns %llu enqueue_ns %llu\n", b, (unsigned long long)p->calls,
			(unsigned long long)p->bytes, (unsigned long long)p->wall_ns,
			(unsigned long long)p->gpu_ns, (unsigned long long)p->enq_ns);
	}
	fclose(f);
}

static uint64_t prof_now(void)
{
	return mono_ns();
}

static int cuda_copy(void *ctx, enum copy_dir dir, const struct tier_mem *dst,
		     const struct tier_mem *src, const struct copy_run *runs,
		     uint32_t n, struct errbuf *e)
{
	struct cuda_ctx *x = ctx;
	cudaStream_t s = x->stream[dir == COPY_D2H ? COPY_D2H : COPY_H2D];
	static int prof_env = -1;
	bool prof;
	cudaEvent_t ev[2] = { NULL, NULL };
	uint64_t t0 = 0, t1 = 0, bytes = 0;
	int busy = 0;
	cudaError_t err, serr;
	int ret = cuda_use(x, e);

	if (ret) {
		fprintf(stderr, "kvpool: %s\n", e ? e->msg : "cuda copy failed");
		return ret;
	}
	if (dir != COPY_D2H && x->jobs) {
		/* After every onload asked for before it, as by stream order
		 * when onloads were enqueued inline (backend_cuda_issue.c). */
		pthread_mutex_lock(&x->fence_lock);
		cuda_issue_drain_locked(x, x->issued);
		pthread_mutex_unlock(&x->fence_lock);
	}
	if (__atomic_load_n(&prof_env, __ATOMIC_RELAXED) < 0)
		__atomic_store_n(&prof_env, getenv("KVPOOL_COPY_PROFILE") != NULL,
				 __ATOMIC_RELAXED);
	prof = dir == COPY_D2H && __atomic_load_n(&prof_env, __ATOMIC_RELAXED);
	if (prof) {
		cudaEventCreate(&ev[0]);
		cudaEventCreate(&ev[1]);
		busy = cudaStreamQuery(x->stream[COPY_H2D]) == cudaErrorNotReady;
		t0 = prof_now();
		cudaEventRecord(ev[0], s);
	}
	err = enqueue_runs(x, dir, dst, src, runs, n);
	if (prof) {
		cudaEventRecord(ev[1], s);
		t1 = prof_now();
	}
	/* Wait even after a failed enqueue, so nothing is in flight when we
	 * return. */
	serr = cudaStreamSynchronize(s);
	if (prof) {
		uint64_t t2 = prof_now();
		float ms = 0;

		cudaEventElapsedTime(&ms, ev[0], ev[1]);
		for (uint32_t i = 0; i < n; i++)
			bytes += runs[i].bytes;
		pthread_mutex_lock(&d2h_prof_lock);
		d2h_prof[busy].calls++;
		d2h_prof[busy].bytes += bytes;
		d2h_prof[busy].wall_ns += t2 - t0;
		d2h_prof[busy].enq_ns += t1 - t0;
		d2h_prof[busy].gpu_ns += (uint64_t)(ms * 1e6);
		pthread_mutex_unlock(&d2h_prof_lock);
		cudaEventDestroy(ev[0]);
		cudaEventDestroy(ev[1]);
	}
	if (err == cudaSuccess)
		err = serr;
	return err == cudaSuccess ? 0 : copy_failed(x, dir, n, "cudaMemcpyAsync",
						    err, e);
}

/* Wait for fence f (<= issued) outside the lock; called with it held,
 * returns with it held. Its slot is not recorded again before f has landed
 * (then a new record only makes the wait longer, never wrong). */
static void fence_sync_locked(struct cuda_ctx *x, uint64_t f)
{
	cudaEvent_t ev = x->ev[f % FENCE_RING];
	cudaError_t err;

	pthread_mutex_unlock(&x->fence_lock);
	cudaSetDevice(x->device);
	err = cudaEventSynchronize(ev);
	if (err != cudaSuccess)
		fprintf(stderr, "kvpool: cuda device %d: waiting for an onload: "
			"%s\n", x->device, cudaGetErrorString(err));
	pthread_mutex_lock(&x->fence_lock);
	if (f > x->landed)
		x->landed = f; /* in order: every fence before f has too */
}

cudaError_t cuda_record_onload(struct cuda_ctx *x, uint64_t f,
			       const struct tier_mem *dst,
			       const struct tier_mem *src,
			       const struct copy_run *runs, uint32_t n)
{
	cudaError_t err = cudaEventRecord(x->ev_t0[f % FENCE_RING],
					  x->stream[COPY_H2D]);

	if (err == cudaSuccess)
		err = enqueue_runs(x, COPY_H2D, dst, src, runs, n);
	if (err == cudaSuccess)
		err = cudaEventRecord(x->ev[f % FENCE_RING], x->stream[COPY_H2D]);
	return err;
}

static int cuda_copy_async(void *ctx, enum copy_dir dir,
			   const struct tier_mem *dst, const struct tier_mem *src,
			   const struct copy_run *runs, uint32_t n,
			   uint64_t *fence, struct errbuf *e)
{
	struct cuda_ctx *x = ctx;
	cudaError_t err;
	uint64_t f;
	int ret;

	*fence = 0;
	if (dir != COPY_H2D)
		return cuda_copy(ctx, dir, dst, src, runs, n, e);
	/* The issuer's (backend_cuda_issue.c): queued, enqueued by it. */
	if (x->jobs && n <= ISSUE_RUNS) {
		pthread_mutex_lock(&x->fence_lock);
		*fence = cuda_issue_queue(x, dst, src, runs, n);
		pthread_mutex_unlock(&x->fence_lock);
		return 0;
	}
	ret = cuda_use(x, e);
	if (ret) {
		fprintf(stderr, "kvpool: %s\n", e ? e->msg : "cuda copy failed");
		return ret;
	}
	/* Inline. Under the lock: fences are numbered in the order their
	 * events are recorded on the stream, which is the order they land in;
	 * fences the issuer holds go first. */
	pthread_mutex_lock(&x->fence_lock);
	cuda_issue_drain_locked(x, x->issued);
	f = x->issued + 1;
	/* The slot's previous fence is f - FENCE_RING: it must have landed.
	 * Waited for with the lock held (rare: FENCE_RING onloads in flight),
	 * so no other copy_async takes fence f meanwhile. */
	if (f - x->landed > FENCE_RING) {
		err = cudaEventSynchronize(x->ev[f % FENCE_RING]);
		if (err != cudaSuccess)
			fprintf(stderr, "kvpool: cuda device %d: waiting for an "
				"onload: %s\n", x->device, cudaGetErrorString(err));
		x->landed = f - FENCE_RING;
	}
	err = cuda_record_onload(x, f, dst, src, runs, n);
	if (err != cudaSuccess) {
		/* Nothing may stay in flight behind an error: wait it out. */
		cudaStreamSynchronize(x->stream[COPY_H2D]);
		pthread_mutex_unlock(&x->fence_lock);
		return copy_failed(x, dir, n, "cudaMemcpyAsync", err, e);
	}
	x->issued = f;
	x->recorded = f;
	x->slot_fence[f % FENCE_RING] = f;
	pthread_mutex_unlock(&x->fence_lock);
	*fence = f;
	return 0;
}

/* GPU time from the start of fence first's runs to fence last's landing;
 * 0 once either slot was recorded again (FENCE_RING onloads later) or for
 * a fence not landed (the engine asks only for landed ones). */
static uint64_t cuda_fence_ns(void *ctx, uint64_t first, uint64_t last)
{
	struct cuda_ctx *x = ctx;
	float ms = 0;
	cudaError_t err = cudaErrorNotReady;

	pthread_mutex_lock(&x->fence_lock);
	if (first && first <= last && last <= x->landed &&
	    x->slot_fence[first % FENCE_RING] == first &&
	    x->slot_fence[last % FENCE_RING] == last) {
		cudaSetDevice(x->device);
		err = cudaEventElapsedTime(&ms, x->ev_t0[first % FENCE_RING],
					   x->ev[last % FENCE_RING]);
	}
	pthread_mutex_unlock(&x->fence_lock);
	return err == cudaSuccess && ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
}

/*
 * Pipelined device -> host copies: the runs, then the ticket's event, on
 * the device -> host stream (after every copy() enqueued before). A slot
 * is recorded again only once its previous ticket has landed, as fences.
 */
static int cuda_copy_start(void *ctx, const struct tier_mem *dst,
			   const struct tier_mem *src, const struct copy_run *runs,
			   uint32_t n, uint64_t *ticket, struct errbuf *e)
{
	struct cuda_ctx *x = ctx;
	cudaStream_t s = x->stream[COPY_D2H];
	cudaError_t err;
	uint64_t t;
	int ret = cuda_use(x, e);

	*ticket = 0;
	if (ret) {
		fprintf(stderr, "kvpool: %s\n", e ? e->msg : "cuda copy failed");
		return ret;
	}
	pthread_mutex_lock(&x->out_lock);
	t = x->out_issued + 1;
	if (t - x->out_landed > OUT_RING) {
		cudaEventSynchronize(x->out_ev[t % OUT_RING]);
		x->out_landed = t - OUT_RING;
	}
	err = enqueue_runs(x, COPY_D2H, dst, src, runs, n);
	if (err == cudaSuccess)
		err = cudaEventRecord(x->out_ev[t % OUT_RING], s);
	if (err != cudaSuccess) {
		/* Nothing may stay in flight behind an error: wait it out. */
		cudaStreamSynchronize(s);
		pthread_mutex_unlock(&x->out_lock);
		return copy_failed(x, COPY_D2H, n, "cudaMemcpyAsync", err, e);
	}
	x->out_issued = t;
	pthread_mutex_unlock(&x->out_lock);
	*ticket = t;
	return 0;
}

static int cuda_copy_wait(void *ctx, uint64_t t)
{
	struct cuda_ctx *x = ctx;
	cudaError_t err = cudaSuccess;

	pthread_mutex_lock(&x->out_lock);
	if (t > x->out_landed && t <= x->out_issued) {
		cudaEvent_t ev = x->out_ev[t % OUT_RING];

		/* Outside the lock: a later start may record this slot again
		 * only after t landed (above), which makes this wait longer,
		 * never wrong. */
		pthread_mutex_unlock(&x->out_lock);
		cudaSetDevice(x->device);
		err = cudaEventSynchronize(ev);
		pthread_mutex_lock(&x->out_lock);
		if (t > x->out_landed)
			x->out_landed = t;
	}
	pthread_mutex_unlock(&x->out_lock);
	if (err != cudaSuccess) {
		fprintf(stderr, "kvpool: cuda device %d: a device-to-host copy failed "
			"in flight: %s\n", x->device, cudaGetErrorString(err));
		return -EIO;
	}
	return 0;
}

static int cuda_fence_done(void *ctx, uint64_t f)
{
	struct cuda_ctx *x = ctx;
	cudaError_t err;
	int done;

	pthread_mutex_lock(&x->fence_lock);
	if (f <= x->landed || f > x->issued) {
		/* landed, or not one of ours: nothing to wait for */
		pthread_mutex_unlock(&x->fence_lock);
		return 1;
	}
	if (f > x->recorded) {
		/* still queued for the issuer: not on the GPU yet */
		pthread_mutex_unlock(&x->fence_lock);
		return 0;
	}
	cudaSetDevice(x->device);
	err = cudaEventQuery(x->ev[f % FENCE_RING]);
	done = err != cudaErrorNotReady;
	if (done && err != cudaSuccess)
		fprintf(stderr, "kvpool: cuda device %d: an onload failed in "
			"flight: %s\n", x->device, cudaGetErrorString(err));
	if (done)
		x->landed = f;
	pthread_mutex_unlock(&x->fence_lock);
	return done;
}

static void cuda_fence_wait(void *ctx, uint64_t f)
{
	struct cuda_ctx *x = ctx;

	pthread_mutex_lock(&x->fence_lock);
	if (f > x->landed && f <= x->issued) {
		cuda_issue_drain_locked(x, f); /* on the stream first */
		if (f > x->landed)
			fence_sync_locked(x, f);
	}
	pthread_mutex_unlock(&x->fence_lock);
}

static int cuda_read(void *ctx, const struct tier_mem *m, uint64_t off,
		     void *dst, uint64_t bytes, struct errbuf *e)
{
	struct cuda_ctx *x = ctx;
	cudaError_t err;
	int ret;

	if (off > m->bytes || bytes > m->bytes - off)
		return errbuf_set(e, -ERANGE, "read of %" PRIu64 " bytes at %" PRIu64
				  " is outside the %" PRIu64 "-byte tier", bytes,
				  off, m->bytes);
	if (!bytes)
		return 0;
	if (!alloc_find(x, m->base, false)) {
		memcpy(dst, (const char *)m->base + off, bytes); /* pinned host */
		return 0;
	}
	ret = cuda_use(x, e);
	if (ret)
		return ret;
	/* The legacy stream does not order with the copy streams; the engine
	 * waits for an onload's fence before it reads what it wrote, and
	 * device -> host copies are waited for, so only landed bytes are read. */
	err = cudaMemcpy(dst, (const char *)m->base + off, bytes,
			 cudaMemcpyDeviceToHost);
	if (err != cudaSuccess)
		return errbuf_set(e, cuda_errno(err), "cuda device %d: reading %"
				  PRIu64 " bytes of the device tier: %s", x->device,
				  bytes, cudaGetErrorString(err));
	return 0;
}

const struct backend_ops backend_cuda = {
	.name = "cuda",
	.tier_alloc = cuda_tier_alloc,
	.tier_free = cuda_tier_free,
	.copy = cuda_copy,
	.copy_async = cuda_copy_async,
	.copy_start = cuda_copy_start,
	.copy_wait = cuda_copy_wait,
	.fence_done = cuda_fence_done,
	.fence_ns = cuda_fence_ns,
	.fence_wait = cuda_fence_wait,
	.read = cuda_read,
	.copy_peer = cuda_copy_peer,
};
