/* SPDX-License-Identifier: MIT */
/*
 * devices.h - `devices = all` made into a list when the backend opens.
 *
 * The configuration reads `all` as one pool on device 0 with devices_all
 * set (config.h); what "all" is depends on the backend, which is only known
 * where the pools are made (after the fork that detaches: CUDA does not
 * survive fork). devices_resolve() is called right before tenants_create():
 * on cuda every GPU the runtime counts (cudaGetDeviceCount, the same count
 * as the driver's cuDeviceGetCount), ordinals 0 to
 * N-1, with a log line naming each one's ordinal and UUID; on shm one pool,
 * device 0, and a log line saying so.
 */
#ifndef KVPOOLD_DEVICES_H
#define KVPOOLD_DEVICES_H

#include "config.h"
#include "errbuf.h"

/* cfg->devices / ndevices from devices_all (nothing to do without it);
 * -errno with e (no GPU on backend=cuda, the driver failing). */
int devices_resolve(struct config *cfg, struct errbuf *e);

#endif /* KVPOOLD_DEVICES_H */
