/* SPDX-License-Identifier: MIT */
/*
 * cuda.c - the client side of the cuda backend: map the daemon's GPU pool,
 * and run the append data ops on the caller's CUDA stream.
 *
 * NO DRIVER AT LINK TIME. libkvpool links the CUDA runtime statically and
 * never links libcuda: it loads and works on machines without a GPU driver
 * (CI, the shm backend). The driver functions the mapping needs
 * (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, ...) are
 * looked up when the first cuda welcome comes, by lib/cuda_driver.c, the
 * loader kvpoold uses too (same functions at the same ABI versions).
 *
 * WHICH GPU. welcome.cuda_uuid names the GPU (welcome.cuda_device is only
 * its ordinal in the daemon, which under another CUDA_VISIBLE_DEVICES is
 * another GPU or none). The attach reads the UUID of every device this
 * process sees and maps on the one that matches: its ordinal here is what
 * kvp_cuda_device() returns. When none matches, kvp_connect fails with
 * -ENODEV naming the GPU (kvpc_cuda_pick, built with or without CUDA so CI
 * tests the matching and the message).
 *
 * ATTACH. fds[1] is a cuMemCreate
 * allocation exported as a POSIX fd. It is imported, a virtual range of
 * tier_bytes[DEVICE] is reserved, the allocation is mapped there with read
 * and write access for that device, and the fd is closed (the handle holds
 * the memory). kvp_device_base() is the mapping's device pointer.
 *
 * CONTEXTS. Everything runs in the device's primary context, which is the
 * one the caller's runtime uses too, so device pointers and streams pass
 * both ways. The library makes that context current only for the duration
 * of a call and puts the caller's current context back before returning.
 *
 * STAGING RING. The kernels take one slot (frame, token slot) per token,
 * computed on the host from the lease's page table. Each append writes its
 * slots (and, for per-layer appends, the layer pointers) into the pinned
 * host buffer of the next of STAGES staging entries, copies them to the
 * entry's device buffer with cudaMemcpyAsync on the caller's stream,
 * launches the kernel on the same stream and records the entry's event
 * behind it. An entry is written again only after its event completed, so
 * slots of an append still in flight are never overwritten; with STAGES
 * appends in flight the next one waits for the oldest. Buffers grow (by
 * doubling) to the largest append seen.
 *
 * COMMIT ORDERING. The entry's (index, generation) is noted in the record
 * of each lease the append wrote (client_internal.h, THE LEASE RECORD: up
 * to KVPC_LEASE_GPU_NOTES of them; the generation is bumped at every
 * launch, so an entry that was reused since is known to have completed).
 * kvp_commit / kvp_queue_commit / kvp_release / kvp_queue_release of a
 * lease first wait for those events (kvpc_cuda_wait_lease), so no other
 * process can see the tokens, or get the pages back, before the bytes
 * landed.
 *
 * A LOWER LAYER. append.c checks an append once and hands over the records
 * it checked; this file only stages the slots (kvpc_lease_slots, lease.c),
 * copies and launches. It calls nothing above it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

/* ------------------------------------------------------------ which GPU */

void kvpc_uuid_format(const uint8_t u[16], char out[KVPC_UUID_STRLEN])
{
	/* nvidia-smi -L's form, which CUDA_VISIBLE_DEVICES accepts too. */
	snprintf(out, KVPC_UUID_STRLEN,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5],
		 u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

int kvpc_cuda_pick(struct kvp_client *c, const uint8_t want[16],
		   int32_t daemon_ordinal, const uint8_t (*seen)[16], int n)
{
	static const uint8_t zero[16];
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	char name[KVPC_UUID_STRLEN];

	if (!memcmp(want, zero, sizeof(zero)))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s did not say which GPU its pool is on "
				"(no device UUID in its welcome)", c->path);
	for (int i = 0; i < n; i++)
		if (!memcmp(seen[i], want, 16))
			return i;
	kvpc_uuid_format(want, name);
	if (!vis)
		return kvpc_err(c, -ENODEV,
				"kvpoold's pool is on %s (ordinal %" PRId32 " in the "
				"daemon), which is not visible to this process "
				"(CUDA_VISIBLE_DEVICES unset, %d device(s) visible); "
				"make it visible (same machine and container as "
				"kvpoold?)", name, daemon_ordinal, n);
	return kvpc_err(c, -ENODEV,
			"kvpoold's pool is on %s (ordinal %" PRId32 " in the daemon), "
			"which is not visible to this process "
			"(CUDA_VISIBLE_DEVICES=%s, %d device(s) visible); make it "
			"visible", name, daemon_ordinal, vis, n);
}

#ifndef KVPOOL_HAVE_CUDA

int kvpc_cuda_attach(struct kvp_client *c, int *fd, int32_t device,
		     const uint8_t uuid[16])
{
	return kvpc_err(c, -EOPNOTSUPP,
			"kvpoold at %s serves its pool from CUDA device %" PRId32
			"; this libkvpool was built without CUDA (build kvpool with "
			"-DKVPOOL_CUDA=ON where the CUDA toolkit is)", c->path, device);
}

void kvpc_cuda_detach(struct kvp_client *c)
{
}

int kvpc_cuda_append(struct kvp_client *c, const struct kvpc_cuda_job *j)
{
	return kvpc_err(c, -EOPNOTSUPP, "append: this libkvpool was built without CUDA");
}

int kvpc_cuda_wait_lease(struct kvp_client *c, uint64_t lease)
{
	return 0;
}

#else /* KVPOOL_HAVE_CUDA */

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_driver.h"
#include "kvp_kernels.h"

#define STAGES 32u             /* appends in flight before the host waits */
#define STAGE_MIN (4u << 10)   /* a staging buffer's first size: 512 slots */
/* A record notes a staging entry's index in a byte. */
_Static_assert(STAGES <= 256, "staging entries must fit in kvpc_lease.gpu_stage");

struct stage {
	unsigned char *host;   /* pinned */
	void *dev;
	size_t cap;            /* bytes of each */
	cudaEvent_t done;      /* recorded behind the launch that read dev */
	uint32_t gen;          /* bumped at each launch */
	int pending;           /* done recorded and not yet seen complete */
};

struct kvpc_cuda {
	int device;
	const struct cuda_driver *drv; /* the process's driver functions */
	CUcontext ctx;                 /* the device's primary context */
	CUmemGenericAllocationHandle handle;
	CUdeviceptr base;
	size_t bytes;
	int have_handle, reserved, mapped;
	struct stage stage[STAGES];
	uint32_t next;                 /* the staging entry to take next */
};

/* ------------------------------------------------------------ contexts */

/* Make the pool's context current; *prev gets the caller's. */
static int enter(struct kvp_client *c, CUcontext *prev)
{
	const struct kvpc_cuda *cu = c->cuda;
	CUresult r;

	if (cu->drv->ctx_get(prev) != CUDA_SUCCESS)
		*prev = NULL;
	if (*prev == cu->ctx)
		return 0;
	r = cu->drv->ctx_set(cu->ctx);
	if (r != CUDA_SUCCESS)
		return kvpc_err(c, -EIO, "cannot make the context of CUDA device %d "
				"current: %s", cu->device,
				cuda_driver_strerror(cu->drv, r));
	return 0;
}

static void leave(struct kvp_client *c, CUcontext prev)
{
	if (prev != c->cuda->ctx)
		c->cuda->drv->ctx_set(prev);
}

/* ------------------------------------------------------------ attach */

static int map_pool(struct kvp_client *c, int *fd)
{
	struct kvpc_cuda *cu = c->cuda;
	const struct cuda_driver *drv = cu->drv;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	size_t gran = 0;
	cudaError_t e;
	CUresult r;

	e = cudaSetDevice(cu->device);
	if (e == cudaSuccess)
		e = cudaFree(NULL); /* the primary context exists from here */
	if (e != cudaSuccess)
		return kvpc_err(c, -ENODEV,
				"kvpoold at %s serves its pool from CUDA device %d "
				"of this process, which cannot be used here: %s "
				"(in use exclusively by another process?)", c->path,
				cu->device, cudaGetErrorString(e));
	r = drv->ctx_get(&cu->ctx);
	if (r != CUDA_SUCCESS || !cu->ctx)
		return kvpc_err(c, -EIO, "no CUDA context on device %d: %s",
				cu->device, cuda_driver_strerror(drv, r));

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = cu->device;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	r = drv->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || !gran)
		return kvpc_err(c, -EIO, "cuMemGetAllocationGranularity on device %d: %s",
				cu->device, cuda_driver_strerror(drv, r));
	if (!cu->bytes || cu->bytes % gran)
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a device tier of %zu bytes, not a "
				"multiple of the allocation granularity (%zu)", c->path,
				cu->bytes, gran);

	r = drv->import(&cu->handle, (void *)(intptr_t)*fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return kvpc_err(c, -EPROTO,
				"cannot import the device tier kvpoold at %s sent "
				"(cuMemImportFromShareableHandle: %s)", c->path,
				cuda_driver_strerror(drv, r));
	cu->have_handle = 1;
	close(*fd); /* the handle keeps the memory */
	*fd = -1;
	r = drv->reserve(&cu->base, cu->bytes, gran, 0, 0);
	if (r != CUDA_SUCCESS)
		return kvpc_err(c, -ENOMEM, "cannot reserve %zu bytes of GPU address "
				"space: %s", cu->bytes, cuda_driver_strerror(drv, r));
	cu->reserved = 1;
	r = drv->map(cu->base, cu->bytes, 0, cu->handle, 0);
	if (r != CUDA_SUCCESS)
		return kvpc_err(c, -EPROTO, "cannot map kvpoold's %zu-byte device tier: "
				"%s", cu->bytes, cuda_driver_strerror(drv, r));
	cu->mapped = 1;
	memset(&acc, 0, sizeof(acc));
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = drv->set_access(cu->base, cu->bytes, &acc, 1);
	if (r != CUDA_SUCCESS)
		return kvpc_err(c, -EACCES, "cannot get read-write access to the device "
				"tier on device %d: %s", cu->device,
				cuda_driver_strerror(drv, r));
	c->device = (void *)(uintptr_t)cu->base;
	c->device_bytes = cu->bytes;
	return 0;
}

/*
 * This process's ordinal of the GPU whose UUID is want (the daemon's
 * `device`), or -errno; *out gets the driver functions it read them with
 * (lib/cuda_driver.c). Every visible device's UUID is read (a few
 * microseconds each, once per attach): ordinals here and in the daemon
 * need not agree.
 */
static int find_device(struct kvp_client *c, int32_t device, const uint8_t want[16],
		       const struct cuda_driver **out)
{
	const struct cuda_driver *drv;
	struct cuda_driver_error why;
	uint8_t (*seen)[16];
	cudaError_t e;
	CUresult r;
	int n = 0, ret;

	/* Seeing no device at all (CUDA_VISIBLE_DEVICES empty, or naming only
	 * GPUs that do not exist) is the same mistake as not seeing this one:
	 * say which GPU to make visible, before the driver lookups below,
	 * which may fail for the same reason and say less. */
	e = cudaGetDeviceCount(&n);
	if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0))
		return kvpc_cuda_pick(c, want, device, NULL, 0);
	if (e != cudaSuccess)
		return kvpc_err(c, -ENODEV,
				"kvpoold at %s serves its pool from a GPU, but CUDA "
				"cannot be used in this process: %s", c->path,
				cudaGetErrorString(e));
	drv = cuda_driver_get(&why);
	if (!drv)
		return kvpc_err(c, -ENODEV,
				"kvpoold at %s serves its pool from CUDA device %" PRId32
				", but the CUDA driver cannot be used here (%s: %s)",
				c->path, device, why.sym,
				why.err == cudaSuccess ? "not found" :
				cudaGetErrorString(why.err));
	*out = drv;
	seen = calloc((size_t)n, sizeof(*seen));
	if (!seen)
		return kvpc_err(c, -ENOMEM, "out of memory");
	for (int i = 0; i < n; i++) {
		CUdevice dev;
		CUuuid u;

		r = drv->device_get(&dev, i);
		if (r == CUDA_SUCCESS)
			r = drv->device_uuid(&u, dev);
		if (r != CUDA_SUCCESS) {
			free(seen);
			return kvpc_err(c, -EIO, "cannot read the UUID of CUDA device "
					"%d (cuDeviceGetUuid): %s", i,
					cuda_driver_strerror(drv, r));
		}
		memcpy(seen[i], u.bytes, sizeof(seen[i]));
	}
	ret = kvpc_cuda_pick(c, want, device, (const uint8_t (*)[16])seen, n);
	free(seen);
	return ret;
}

int kvpc_cuda_attach(struct kvp_client *c, int *fd, int32_t device,
		     const uint8_t uuid[16])
{
	const struct cuda_driver *drv = NULL;
	struct kvpc_cuda *cu;
	CUcontext prev = NULL;
	int ret, ordinal;

	ordinal = find_device(c, device, uuid, &drv);
	if (ordinal < 0)
		return ordinal;
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return kvpc_err(c, -ENOMEM, "out of memory");
	cu->device = ordinal;
	cu->drv = drv;
	cu->bytes = c->tier_bytes[KVP_TIER_DEVICE];
	c->cuda = cu;
	c->cuda_device = ordinal;

	if (drv->ctx_get(&prev) != CUDA_SUCCESS)
		prev = NULL;
	ret = map_pool(c, fd);
	/* Back to whatever was current (maybe nothing) before the attach. */
	if (cu->ctx != prev)
		drv->ctx_set(prev);
	return ret;
}

void kvpc_cuda_detach(struct kvp_client *c)
{
	struct kvpc_cuda *cu = c->cuda;
	CUcontext prev = NULL;

	if (!cu)
		return;
	if (cu->ctx && !enter(c, &prev)) {
		/* Nothing may still write the pages once the daemon hands
		 * them to someone else: wait for every append first. */
		for (uint32_t i = 0; i < STAGES; i++) {
			struct stage *s = &cu->stage[i];

			if (s->pending)
				cudaEventSynchronize(s->done);
			if (s->done)
				cudaEventDestroy(s->done);
			if (s->host)
				cudaFreeHost(s->host);
			if (s->dev)
				cudaFree(s->dev);
		}
		leave(c, prev);
	}
	if (cu->mapped)
		cu->drv->unmap(cu->base, cu->bytes);
	if (cu->reserved)
		cu->drv->addr_free(cu->base, cu->bytes);
	if (cu->have_handle)
		cu->drv->release(cu->handle);
	free(cu);
	c->cuda = NULL;
	c->device = NULL;
}

/* ------------------------------------------------------------ lease notes */

/* Is staging entry (s, gen) of a note still in flight (as far as we know)? */
static int note_live(const struct kvpc_cuda *cu, uint32_t s, uint32_t gen)
{
	return cu->stage[s].gen == gen && cu->stage[s].pending;
}

/* Drop the notes whose appends completed. */
static void notes_compact(struct kvpc_cuda *cu, struct kvpc_lease *r)
{
	uint8_t k = 0;

	for (uint8_t i = 0; i < r->gpu_n; i++) {
		if (!note_live(cu, r->gpu_stage[i], r->gpu_gen[i]))
			continue;
		r->gpu_stage[k] = r->gpu_stage[i];
		r->gpu_gen[k] = r->gpu_gen[i];
		k++;
	}
	r->gpu_n = k;
}

/* Wait for staging entry s (error: the append failed on the GPU). */
static cudaError_t stage_wait(struct stage *s)
{
	cudaError_t e = cudaSuccess;

	if (s->pending) {
		e = cudaEventSynchronize(s->done);
		s->pending = 0;
	}
	return e;
}

/* Note in r that its lease has an append in staging entry s (generation
 * gen), after the entry's event was recorded (THE LEASE RECORD, 2). */
static cudaError_t note_lease(struct kvpc_cuda *cu, struct kvpc_lease *r,
			      uint32_t s, uint32_t gen)
{
	for (uint8_t i = 0; i < r->gpu_n; i++)
		if (r->gpu_stage[i] == s && r->gpu_gen[i] == gen)
			return cudaSuccess; /* two items of one batch */
	notes_compact(cu, r);
	if (r->gpu_n == KVPC_LEASE_GPU_NOTES) {
		/* Many appends of one lease in flight on different streams:
		 * the oldest must be done before one more is noted. */
		cudaError_t e = stage_wait(&cu->stage[r->gpu_stage[0]]);

		memmove(r->gpu_stage, r->gpu_stage + 1,
			(KVPC_LEASE_GPU_NOTES - 1) * sizeof(r->gpu_stage[0]));
		memmove(r->gpu_gen, r->gpu_gen + 1,
			(KVPC_LEASE_GPU_NOTES - 1) * sizeof(r->gpu_gen[0]));
		r->gpu_n--;
		if (e != cudaSuccess)
			return e;
	}
	r->gpu_stage[r->gpu_n] = (uint8_t)s;
	r->gpu_gen[r->gpu_n] = gen;
	r->gpu_n++;
	return cudaSuccess;
}

int kvpc_cuda_wait_lease(struct kvp_client *c, uint64_t lease)
{
	struct kvpc_cuda *cu = c->cuda;
	struct kvpc_lease *r;
	cudaError_t e = cudaSuccess;
	CUcontext prev;
	int ret;

	if (!cu || !(r = kvpc_lease_find(c, lease)) || !r->gpu_n)
		return 0;
	ret = enter(c, &prev);
	if (ret)
		return ret;
	for (uint8_t i = 0; i < r->gpu_n; i++) {
		cudaError_t ei = cudaSuccess;

		if (note_live(cu, r->gpu_stage[i], r->gpu_gen[i]))
			ei = stage_wait(&cu->stage[r->gpu_stage[i]]);
		if (e == cudaSuccess)
			e = ei;
	}
	r->gpu_n = 0;
	leave(c, prev);
	if (e != cudaSuccess)
		return kvpc_err(c, -EIO,
				"lease %" PRIu64 ": an append of it failed on the GPU (%s); "
				"its tokens are not committed", lease, cudaGetErrorString(e));
	return 0;
}

/* ------------------------------------------------------------ append */

/* The next staging entry, free and at least bytes large, into *out; 0, or
 * -errno (error set) when waiting for it or growing it failed. */
static int take_stage(struct kvp_client *c, size_t bytes, struct stage **out,
		      uint32_t *idx)
{
	struct kvpc_cuda *cu = c->cuda;
	struct stage *s = &cu->stage[cu->next];
	cudaError_t e;

	e = stage_wait(s);
	if (e != cudaSuccess)
		return kvpc_err(c, -EIO, "append: an earlier append failed on the "
				"GPU: %s", cudaGetErrorString(e));
	if (!s->done &&
	    (e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming)) != cudaSuccess) {
		s->done = NULL;
		return kvpc_err(c, -EIO, "append: cudaEventCreate: %s",
				cudaGetErrorString(e));
	}
	if (bytes > s->cap) {
		size_t cap = s->cap ? s->cap : STAGE_MIN;

		while (cap < bytes)
			cap *= 2;
		if (s->host)
			cudaFreeHost(s->host);
		if (s->dev)
			cudaFree(s->dev);
		s->host = NULL;
		s->dev = NULL;
		s->cap = 0;
		e = cudaHostAlloc((void **)&s->host, cap, cudaHostAllocDefault);
		if (e == cudaSuccess)
			e = cudaMalloc(&s->dev, cap);
		if (e != cudaSuccess)
			return kvpc_err(c, -ENOMEM, "append: %zu bytes of staging for "
					"slots: %s", cap, cudaGetErrorString(e));
		s->cap = cap;
	}
	*out = s;
	*idx = cu->next;
	cu->next = (cu->next + 1) % STAGES;
	return 0;
}

int kvpc_cuda_append(struct kvp_client *c, const struct kvpc_cuda_job *j)
{
	struct kvpc_cuda *cu = c->cuda;
	const size_t slot_bytes = (size_t)j->n * sizeof(struct kvp_slot);
	const size_t ptr_bytes = j->kv ? 0 :
		(size_t)(j->layer >= 0 ? 1 : c->layout.layers) * sizeof(void *);
	struct kvp_layout one;
	void *pool = c->device;
	cudaStream_t stream = j->stream ? (cudaStream_t)j->stream : cudaStreamLegacy;
	struct stage *s = NULL;
	CUcontext prev;
	cudaError_t e;
	uint32_t idx = 0;
	int ret;

	ret = enter(c, &prev);
	if (ret)
		return ret;
	ret = take_stage(c, slot_bytes + 2 * ptr_bytes, &s, &idx);
	if (ret)
		goto out;
	/* The ranges were checked by append.c (the records in j->recs); the
	 * frames are checked as the slots are written, before anything is
	 * enqueued. */
	for (uint32_t i = 0, at = 0; i < j->count; at += j->items[i].n, i++) {
		ret = kvpc_lease_slots(c, j->recs[i], j->items[i].first, j->items[i].n,
				       (struct kvp_slot *)s->host + at);
		if (ret)
			goto out;
	}
	if (!j->kv) {
		memcpy(s->host + slot_bytes, j->k, ptr_bytes);
		memcpy(s->host + slot_bytes + ptr_bytes, j->v, ptr_bytes);
	}
	e = cudaMemcpyAsync(s->dev, s->host, slot_bytes + 2 * ptr_bytes,
			    cudaMemcpyHostToDevice, stream);
	if (e != cudaSuccess) {
		ret = kvpc_err(c, -EIO, "append: copying %" PRIu32 " slots to the GPU: %s",
			       j->n, cudaGetErrorString(e));
		goto out;
	}
	if (j->layer >= 0)
		pool = kvpc_one_layer(&c->layout, (uint32_t)j->layer, c->device, &one);
	if (j->kv)
		ret = kvp_append_cuda(&c->layout, c->device, s->dev, j->n, j->kv, stream);
	else
		ret = kvp_append_layers_cuda(j->layer >= 0 ? &one : &c->layout, pool,
					     s->dev, j->n,
					     (const void *const *)((unsigned char *)s->dev + slot_bytes),
					     (const void *const *)((unsigned char *)s->dev + slot_bytes +
								   ptr_bytes),
					     stream);
	if (ret)
		ret = kvpc_err(c, ret, "append: launching the kernel for %" PRIu32
			       " tokens: %s", j->n, kvp_kernels_error());
	/* Even after a failed launch the copy reads the pinned buffer: the
	 * entry is in use until the event says otherwise. */
	e = cudaEventRecord(s->done, stream);
	if (e != cudaSuccess) {
		/* No event to wait on: wait for the stream itself. */
		cudaStreamSynchronize(stream);
		if (!ret)
			ret = kvpc_err(c, -EIO, "append: cudaEventRecord: %s",
				       cudaGetErrorString(e));
		goto out;
	}
	s->gen++;
	s->pending = 1;
	if (ret)
		goto out;
	if (j->sync) {
		e = stage_wait(s);
		if (e != cudaSuccess)
			ret = kvpc_err(c, -EIO, "append: the kernel failed on the GPU: %s",
				       cudaGetErrorString(e));
		goto out;
	}
	for (uint32_t i = 0; i < j->count; i++) {
		if (!j->items[i].n)
			continue;
		e = note_lease(cu, j->recs[i], idx, s->gen);
		if (e != cudaSuccess) {
			ret = kvpc_err(c, -EIO, "append: an earlier append failed on the "
				       "GPU: %s", cudaGetErrorString(e));
			goto out;
		}
	}
out:
	leave(c, prev);
	return ret;
}

#endif /* KVPOOL_HAVE_CUDA */
