/* SPDX-License-Identifier: MIT */
/*
 * disk_engine.h - the disk tier's side of the engine's tier interface
 * (tier.h): the functions behind disk_tier_ops, which kvpoold.c registers;
 * the engine calls them only through that table. Each is a no-op on an
 * engine without a disk tier (engine_config.disk NULL).
 */
#ifndef KVPOOL_DISK_ENGINE_H
#define KVPOOL_DISK_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "tier.h"

struct history;

/* h, unpinned, is about to be dropped by eviction: put it on disk if its
 * pages are all host-readable. 0, or why not (the caller drops it anyway). */
int engine_disk_demote(struct engine *eng, struct history *h);
/*
 * engine_evict's disk selections (kvpool.h): KVP_SEL_DISK drops the user's
 * disk copy (pages, or -ENOENT); KVP_SEL_TO_DISK writes its history to disk
 * and frees its frames (pages; -EBUSY leased, -ENOENT, -EINVAL no disk
 * tier, -ENOSPC no room).
 */
int engine_disk_evict(struct engine *eng, uint64_t user, uint32_t sel,
		      struct errbuf *e);
/* The same for every unpinned user of the engine; returns users affected. */
int engine_disk_evict_all(struct engine *eng, uint32_t sel);
/*
 * A clean stop: every unpinned history of the engine written to the disk
 * tier (waiting for staging room when it runs out), so that the next start
 * on the same disk_dir serves it; then the idle prefix pages and unheld
 * chunks. Returns histories written.
 */
int engine_disk_flush_all(struct engine *eng);
/*
 * Before a prepare of a user with no history in memory: bring one on disk
 * back into the host tier. 0 (back, or none on disk); -EINPROGRESS with
 * ENGINE_PREPARE_DEFER while it is read; -ENOMEM nothing changed.
 */
/* At engine_create: register the host tier with the disk tier (reads
 * straight into host frames); at engine_destroy: wait for those reads,
 * unregister. */
void engine_disk_attach(struct engine *eng);
void engine_disk_detach(struct engine *eng);
int engine_disk_onload(struct engine *eng, uint64_t user, unsigned flags,
		       struct errbuf *e);
/* engine_list_users: append to ids[0, *n) (room for cap) the users only on
 * disk with id >= cursor, from shard 0 of each pool (as many as fit). */
void engine_disk_list(struct engine *eng, uint64_t cursor, uint64_t *ids,
		      uint64_t *n, uint64_t cap);
/* How many users only on disk engine_disk_list may add. */
uint64_t engine_disk_list_count(struct engine *eng, uint64_t cursor);
/* Fill out's disk figures (pages_disk, tokens_disk) for a user with a copy
 * on disk, and exists, start, len, pages as if only on disk (engine_info
 * sets them again for a history in memory); false: no copy on disk. */
bool engine_disk_info(struct engine *eng, uint64_t user,
		      struct engine_user_info *out);

/* The tenant's disk figures into out, from the engine of shard 0 of pool 0
 * only (the disk tier counts per tenant; stats add up over shards). */
void engine_disk_stats(const struct engine *eng, struct kvp_stats *out);

/* The disk tier's operations (tier.h), for engine_tier_register. */
extern const struct tier_ops disk_tier_ops;

#endif /* KVPOOL_DISK_ENGINE_H */
