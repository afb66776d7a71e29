/* SPDX-License-Identifier: MIT */
/*
 * devices.c - `devices = all` (devices.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#if KVPOOL_HAVE_CUDA
#include "cuda_driver.h"
#endif

#include "devices.h"
#include "log.h"

/* On shm "all" is one pool: device 0, or devices 0 .. tp-1 (one memfd
 * per rank) with tp > 1. */
static void shm_one_pool(struct config *cfg, const char *why)
{
	uint32_t n = cfg->tp > 1 ? cfg->tp : 1;

	for (uint32_t i = 0; i < n; i++)
		cfg->devices[i] = (int)i;
	cfg->ndevices = n;
	log_info("devices = all: %s; one pool (device%s 0%s)", why,
		 n > 1 ? "s" : "", n > 1 ? " to tp-1" : "");
}

#if KVPOOL_HAVE_CUDA
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it. */
static void uuid_format(const CUuuid *u, char *buf, size_t len)
{
	const unsigned char *b = (const unsigned char *)u->bytes;

	snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5],
		 b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* Every GPU the driver counts, ordinals and UUIDs logged. */
static int cuda_all(struct config *cfg, int n, struct errbuf *e)
{
	struct cuda_driver_error why = { 0 };
	const struct cuda_driver *cu = cuda_driver_get(&why);
	char line[DEVICES_MAX * 56] = "";
	size_t off = 0;

	if (!cu)
		return errbuf_set(e, -ENODEV, "devices = all: the CUDA driver has "
				  "no %s; list the devices instead (devices = 0,1)",
				  why.sym ? why.sym : "entry points");
	if (n > DEVICES_MAX) {
		log_warn("devices = all: %d GPUs, kvpoold serves at most %d; the "
			 "first %d get a pool", n, DEVICES_MAX, DEVICES_MAX);
		n = DEVICES_MAX;
	}
	for (int i = 0; i < n; i++) {
		char uuid[48] = "GPU-?";
		CUdevice dev;
		CUuuid u;

		if (cu->device_get(&dev, i) == CUDA_SUCCESS &&
		    cu->device_uuid(&u, dev) == CUDA_SUCCESS)
			uuid_format(&u, uuid, sizeof(uuid));
		cfg->devices[i] = i;
		if (off < sizeof(line))
			off += (size_t)snprintf(line + off, sizeof(line) - off,
						"%s%d (%s)", i ? ", " : "", i, uuid);
	}
	cfg->ndevices = (uint32_t)n;
	log_info("devices = all: %d GPU(s): %s", n, line);
	return 0;
}
#endif

static int resolve(struct config *cfg, struct errbuf *e);

/*
 * With tp > 1 the GPUs go tp at a time (config.h): "all" keeps the largest
 * multiple of tp and says which GPUs it leaves out; fewer than tp GPUs is
 * an error naming both settings.
 */
int devices_resolve(struct config *cfg, struct errbuf *e)
{
	uint32_t tp = cfg->tp > 1 ? cfg->tp : 1, keep;
	int ret;

	if (!cfg->devices_all)
		return 0;
	ret = resolve(cfg, e);
	if (ret || tp == 1)
		return ret;
	if (cfg->ndevices < tp)
		return errbuf_set(e, -EINVAL, "devices = all found %" PRIu32 " GPU(s) "
				  "but tp = %" PRIu32 " needs %" PRIu32 " per pool; "
				  "lower tp or run on a host with more GPUs",
				  cfg->ndevices, tp, tp);
	keep = cfg->ndevices - cfg->ndevices % tp;
	if (keep != cfg->ndevices)
		log_warn("devices = all: %" PRIu32 " GPUs, tp = %" PRIu32 ": GPUs %"
			 PRIu32 " to %" PRIu32 " get no pool (pools take %" PRIu32
			 " GPUs each)", cfg->ndevices, tp, keep, cfg->ndevices - 1, tp);
	cfg->ndevices = keep;
	return 0;
}

static int resolve(struct config *cfg, struct errbuf *e)
{
	if (!strcmp(cfg->backend, "shm")) {
		shm_one_pool(cfg, "the shm backend has no GPUs");
		return 0;
	}
#if KVPOOL_HAVE_CUDA
	{
		int n = 0;
		cudaError_t err = cudaGetDeviceCount(&n);

		if (err != cudaSuccess || n <= 0) {
			if (!strcmp(cfg->backend, "auto")) {
				shm_one_pool(cfg, "no CUDA device, backend auto "
					     "uses shm");
				return 0;
			}
			return errbuf_set(e, -ENODEV, "devices = all: no CUDA device "
					  "(%s); check the driver (nvidia-smi) or "
					  "use backend = shm",
					  err != cudaSuccess ? cudaGetErrorString(err) :
					  "the driver counts 0");
		}
		return cuda_all(cfg, n, e);
	}
#else
	shm_one_pool(cfg, "kvpoold was built without CUDA (backend shm)");
	return 0;
#endif
}
