/* SPDX-License-Identifier: MIT */
/*
 * cuda_driver.c - the one CUDA driver loader of kvpoold and libkvpool
 * (cuda_driver.h says why the driver is looked up and never linked).
 *
 * Every function is looked up, in one pthread_once, through the runtime's
 * cudaGetDriverEntryPointByVersion at CUDA_DRIVER_ABI (runtimes before 12.5
 * have only cudaGetDriverEntryPoint, which answers at the runtime's own
 * version: at 12.x the same functions). The table is published only whole:
 * cuda_driver_get() hands it out when every entry was found, so callers
 * never meet a NULL function pointer.
 */
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "cuda_driver.h"

static struct cuda_driver drv;
static struct cuda_driver_error drv_error;   /* drv_error.sym: the first miss */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* Look up one function into *slot (a function pointer's storage). */
static void lookup(const char *sym, void *slot)
{
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	void *fn = NULL;
	cudaError_t err;

#if CUDART_VERSION >= 12050
	err = cudaGetDriverEntryPointByVersion(sym, &fn, CUDA_DRIVER_ABI,
					       cudaEnableDefault, &q);
#else
	err = cudaGetDriverEntryPoint(sym, &fn, cudaEnableDefault, &q);
#endif
	if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
		if (!drv_error.sym)
			drv_error = (struct cuda_driver_error){
				.sym = sym, .err = err, .query = q };
		fn = NULL;
	}
	/* A function pointer stored through its bytes: no cast between
	 * function and object pointer types. */
	memcpy(slot, &fn, sizeof(fn));
}

static void resolve(void)
{
	static const struct {
		const char *sym;
		size_t off;
	} t[] = {
#define ENTRY(sym, field) { sym, offsetof(struct cuda_driver, field) }
		/* The order kvpoold always looked them up in, so a driver
		 * lacking several is reported as before; the context calls,
		 * which only libkvpool makes, last. */
		ENTRY("cuMemCreate", create),
		ENTRY("cuMemRelease", release),
		ENTRY("cuMemExportToShareableHandle", export_fd),
		ENTRY("cuMemImportFromShareableHandle", import),
		ENTRY("cuMemGetAllocationGranularity", granularity),
		ENTRY("cuMemAddressReserve", reserve),
		ENTRY("cuMemAddressFree", addr_free),
		ENTRY("cuMemMap", map),
		ENTRY("cuMemUnmap", unmap),
		ENTRY("cuMemSetAccess", set_access),
		ENTRY("cuGetErrorString", error_string),
		ENTRY("cuDeviceGet", device_get),
		/* cuDeviceGetUuid_v2 at CUDA_DRIVER_ABI (cuda_driver.h). */
		ENTRY("cuDeviceGetUuid", device_uuid),
		ENTRY("cuCtxGetCurrent", ctx_get),
		ENTRY("cuCtxSetCurrent", ctx_set),
#undef ENTRY
	};
	_Static_assert(sizeof(void *) == sizeof(drv.create),
		       "a driver function pointer is stored as a void *");

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		lookup(t[i].sym, (char *)&drv + t[i].off);
}

const struct cuda_driver *cuda_driver_get(struct cuda_driver_error *why)
{
	/* pthread_once orders resolve()'s writes before every caller's reads. */
	pthread_once(&drv_once, resolve);
	if (drv_error.sym) {
		if (why)
			*why = drv_error;
		return NULL;
	}
	return &drv;
}

const char *cuda_driver_strerror(const struct cuda_driver *d, CUresult r)
{
	const char *s = NULL;

	if (d && d->error_string && d->error_string(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA driver error";
}
