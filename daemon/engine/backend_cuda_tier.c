/* SPDX-License-Identifier: MIT */
/*
 * backend_cuda_tier.c - the cuda backend's tiers: the device tier is one
 * cuMemCreate allocation exported as a POSIX fd and mapped here; the host
 * tier is pinned host memory (backend_cuda.c's top comment says why).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cuda_internal.h"

/*
 * Past 80 lines on purpose: six driver steps in a row (granularity,
 * create, export, reserve, map, access) and the zeroing, each undone in
 * reverse by one exit path; split, the undo order would be spread over
 * functions.
 */
static int device_alloc(struct cuda_ctx *x, uint64_t bytes, struct tier_mem *out,
			struct errbuf *e)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = x->device },
	};
	CUmemAccessDesc access = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = x->device },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	struct cuda_alloc *a = NULL;
	CUdeviceptr ptr = 0;
	size_t gran = 0, size = 0;
	bool created = false, reserved = false, mapped = false;
	const char *step;
	cudaError_t err;
	CUresult r;
	int fd = -1, ret;

	step = "cuMemGetAllocationGranularity";
	r = x->cu->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS || !gran)
		goto cu_fail;
	if (bytes > SIZE_MAX - (gran - 1))
		return errbuf_set(e, -EINVAL, "cuda device %d: a device tier of %"
				  PRIu64 " bytes is too large", x->device, bytes);
	size = (size_t)(bytes + gran - 1) / gran * gran;
	a = calloc(1, sizeof(*a));
	if (!a)
		return errbuf_set(e, -ENOMEM, "cuda device %d: out of memory", x->device);

	step = "cuMemCreate";
	r = x->cu->create(&a->handle, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		goto cu_fail_free;
	created = true;
	step = "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)";
	r = x->cu->export_fd(&fd, a->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS)
		goto cu_fail_free;
	step = "cuMemAddressReserve";
	r = x->cu->reserve(&ptr, size, gran, 0, 0);
	if (r != CUDA_SUCCESS)
		goto cu_fail_free;
	reserved = true;
	step = "cuMemMap";
	r = x->cu->map(ptr, size, 0, a->handle, 0);
	if (r != CUDA_SUCCESS)
		goto cu_fail_free;
	mapped = true;
	step = "cuMemSetAccess";
	r = x->cu->set_access(ptr, size, &access, 1);
	if (r != CUDA_SUCCESS)
		goto cu_fail_free;

	/* Zeroed, and landed before any copy stream touches it. */
	err = cudaMemsetAsync((void *)(uintptr_t)ptr, 0, size, x->stream[COPY_H2D]);
	if (err == cudaSuccess)
		err = cudaStreamSynchronize(x->stream[COPY_H2D]);
	if (err != cudaSuccess) {
		ret = errbuf_set(e, cuda_errno(err), "cuda device %d: zeroing the "
				 "%zu-byte device tier: %s", x->device, size,
				 cudaGetErrorString(err));
		goto undo;
	}

	a->ptr = ptr;
	a->size = size;
	pthread_mutex_lock(&x->lock);
	list_add(&a->link, &x->allocs);
	pthread_mutex_unlock(&x->lock);
	out->base = (void *)(uintptr_t)ptr;
	out->host_visible = false; /* a device pointer */
	out->bytes = size;
	out->fd = fd;
	return 0;

cu_fail:
	return errbuf_set(e, cu_errno(r), "cuda device %d: %s for a device tier of "
			  "%" PRIu64 " bytes: %s", x->device, step, bytes,
			  cuda_driver_strerror(x->cu, r));
cu_fail_free:
	ret = errbuf_set(e, cu_errno(r), "cuda device %d: %s for a device tier of "
			 "%zu bytes: %s%s", x->device, step, size,
			 cuda_driver_strerror(x->cu, r),
			 r == CUDA_ERROR_OUT_OF_MEMORY ? "; lower device_mem" : "");
undo:
	if (mapped)
		x->cu->unmap(ptr, size);
	if (reserved)
		x->cu->addr_free(ptr, size);
	if (fd >= 0)
		close(fd);
	if (created)
		x->cu->release(a->handle);
	free(a);
	return ret;
}

static int host_alloc(struct cuda_ctx *x, uint64_t bytes, struct tier_mem *out,
		      struct errbuf *e)
{
	void *p = NULL;
	cudaError_t err;

	if (bytes > SIZE_MAX)
		return errbuf_set(e, -EINVAL, "host tier of %" PRIu64 " bytes is too "
				  "large", bytes);
	err = cudaHostAlloc(&p, (size_t)bytes, cudaHostAllocPortable);
	if (err != cudaSuccess)
		return errbuf_set(e, cuda_errno(err), "cuda device %d: cannot pin a "
				  "host tier of %" PRIu64 " bytes (cudaHostAlloc): %s; "
				  "lower host_mem or raise the memlock limit",
				  x->device, bytes, cudaGetErrorString(err));
	memset(p, 0, (size_t)bytes);
	out->base = p;
	out->host_visible = true; /* pinned host memory */
	out->bytes = bytes;
	out->fd = -1;
	return 0;
}

int cuda_tier_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
		    struct tier_mem *out, struct errbuf *e)
{
	struct cuda_ctx *x = ctx;
	int ret;

	*out = (struct tier_mem){ .fd = -1 };
	if (!x)
		return errbuf_set(e, -EINVAL, "the cuda backend needs the context "
				  "of backend_cuda_open() (engine_config.backend_ctx)");
	ret = cuda_use(x, e);
	if (ret)
		return ret;
	return tier == KVP_TIER_DEVICE ? device_alloc(x, bytes, out, e)
				       : host_alloc(x, bytes, out, e);
}

/* The registered device allocation at base, unlinked when take. */
struct cuda_alloc *alloc_find(struct cuda_ctx *x, const void *base, bool take)
{
	struct cuda_alloc *a;

	pthread_mutex_lock(&x->lock);
	list_for_each_entry(a, &x->allocs, link) {
		if ((const void *)(uintptr_t)a->ptr == base) {
			if (take)
				list_del(&a->link);
			pthread_mutex_unlock(&x->lock);
			return a;
		}
	}
	pthread_mutex_unlock(&x->lock);
	return NULL;
}

void cuda_tier_free(void *ctx, struct tier_mem *m)
{
	struct cuda_ctx *x = ctx;
	struct cuda_alloc *a;

	if (!x || !m->base)
		goto out;
	cudaSetDevice(x->device);
	/* No copy of this context may still read or write the tier: the
	 * onloads the issuer holds go on the stream first, then both streams
	 * finish (backend_cuda_issue.c). */
	pthread_mutex_lock(&x->fence_lock);
	cuda_issue_drain_locked(x, x->issued);
	pthread_mutex_unlock(&x->fence_lock);
	for (int d = 0; d < 2; d++)
		cudaStreamSynchronize(x->stream[d]);
	a = alloc_find(x, m->base, true);
	if (a) {
		/* Clients hold their own imports; the memory lives on until
		 * the last of them unmaps and closes its fd. */
		x->cu->unmap(a->ptr, a->size);
		x->cu->addr_free(a->ptr, a->size);
		x->cu->release(a->handle);
		free(a);
	} else {
		cudaFreeHost(m->base);
	}
out:
	if (m->fd >= 0)
		close(m->fd);
	m->base = NULL;
	m->fd = -1;
}
