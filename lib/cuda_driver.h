/* SPDX-License-Identifier: MIT */
/*
 * cuda_driver.h - the CUDA driver API functions kvpoold's cuda backend and
 * libkvpool call, looked up once per process.
 *
 * Neither side links libcuda (-lcuda): both link the static CUDA runtime,
 * which loads libcuda.so.1 only at the first CUDA call, so kvpoold and
 * libkvpool start and serve shm pools where there is no GPU driver at all.
 * The driver functions (cuMemCreate and the rest of the virtual memory API,
 * cuDeviceGetUuid, the context calls) are looked up through the runtime at
 * ABI CUDA_DRIVER_ABI, the first time cuda_driver_get() is called.
 *
 * The ABI version is part of each function's meaning: at 12000,
 * cuDeviceGetUuid is cuDeviceGetUuid_v2 (a MIG instance's own UUID), and
 * the daemon and the library must read the same one, or a client would not
 * find the daemon's GPU.
 *
 * Internal: compiled only where CUDA is (KVPOOL_HAVE_CUDA), and hidden in
 * libkvpool.so (C_VISIBILITY_PRESET hidden, kvpool.map exports kvp_* only).
 */
#ifndef KVPOOL_LIB_CUDA_DRIVER_H
#define KVPOOL_LIB_CUDA_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#if CUDART_VERSION < 12000
#error "kvpool needs CUDA 12 or later"
#endif

/* The driver ABI asked for, and the driver it takes, for messages. */
#define CUDA_DRIVER_ABI 12000
#define CUDA_DRIVER_ABI_NAME "CUDA 12.0"

/* Every driver function kvpool calls, at the ABI version it relies on. */
struct cuda_driver {
	/* contexts: libkvpool runs in the device's primary context */
	PFN_cuCtxGetCurrent_v4000 ctx_get;
	PFN_cuCtxSetCurrent_v4000 ctx_set;
	/* devices */
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetUuid_v11040 device_uuid;       /* cuDeviceGetUuid_v2 */
	/* the device tier: created and exported by kvpoold, imported by clients */
	PFN_cuMemCreate_v10020 create;
	PFN_cuMemRelease_v10020 release;
	PFN_cuMemExportToShareableHandle_v10020 export_fd;
	PFN_cuMemImportFromShareableHandle_v10020 import;
	PFN_cuMemGetAllocationGranularity_v10020 granularity;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemAddressFree_v10020 addr_free;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemUnmap_v10020 unmap;
	PFN_cuMemSetAccess_v10020 set_access;
	/* messages */
	PFN_cuGetErrorString_v6000 error_string;
};

/* Why there is no table: the first function that could not be had. */
struct cuda_driver_error {
	const char *sym;        /* its name, e.g. "cuMemCreate" */
	cudaError_t err;        /* the lookup's own failure (no driver, ...), or
				 * cudaSuccess */
	/* err == cudaSuccess: the driver has no sym at CUDA_DRIVER_ABI;
	 * cudaDriverEntryPointVersionNotSufficent: it is older than that */
	enum cudaDriverEntryPointQueryResult query;
};

/*
 * The table, every function in it resolved; or NULL, *why saying which
 * function is missing and why (why may be NULL). Looked up once per
 * process (pthread_once): a failure is not retried.
 */
const struct cuda_driver *cuda_driver_get(struct cuda_driver_error *why);

/* cuGetErrorString of r, or "unknown CUDA driver error" (drv may be NULL). */
const char *cuda_driver_strerror(const struct cuda_driver *drv, CUresult r);

#endif /* KVPOOL_LIB_CUDA_DRIVER_H */
