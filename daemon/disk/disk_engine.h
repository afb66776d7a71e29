/* SPDX-License-Identifier: MIT */
/*
 * disk_engine.h - the engine's hooks into the disk tier (disk_engine.c).
 * Each is a no-op on an engine without one (engine_config.disk NULL).
 */
#ifndef KVPOOL_DISK_ENGINE_H
#define KVPOOL_DISK_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

struct history;

/* h, unpinned, is about to be dropped by eviction: put it on disk if its
 * pages are all host-readable. */
void engine_disk_demote(struct engine *eng, struct history *h);
/*
 * Before a prepare of a user with no history in memory: bring one on disk
 * back into the host tier. 0 (back, or none on disk); -EINPROGRESS with
 * ENGINE_PREPARE_DISK_DEFER while it is read; -ENOMEM nothing changed.
 */
int engine_disk_onload(struct engine *eng, uint64_t user, unsigned flags,
		       struct errbuf *e);
/* Fill out (exists, start, len, pages) for a user only on disk. */
bool engine_disk_info(struct engine *eng, uint64_t user,
		      struct engine_user_info *out);

#endif /* KVPOOL_DISK_ENGINE_H */
