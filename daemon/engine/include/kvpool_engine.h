/* SPDX-License-Identifier: MIT */
/*
 * kvpool_engine.h - the engine's whole interface, for the server (kvpoold)
 * and for kvbench's in-process runs: include this and nothing else of
 * daemon/engine/.
 *
 *   engine.h   one engine: histories, leases, tiers, eviction, statistics
 *   share.h    sharing on top: prefix cache, chunks, sequences, compose
 *   shard.h    a tenant's pool as shards that own users, and its reclaimer
 *   backend.h  where tiers live (shm, cuda) and how pages are copied
 *   errbuf.h   the message an error carries back
 *   frames.h, copy.h   the frame pool and copy batch shard.h's structs hold
 *
 * Everything else in daemon/engine/ (engine_internal.h, share_internal.h,
 * engine_share.h, user_table.h) is the engine's own; the CMake target
 * kvpool_engine exports only daemon/engine/include.
 */
#ifndef KVPOOL_ENGINE_PUBLIC_H
#define KVPOOL_ENGINE_PUBLIC_H

#include "backend.h"
#include "copy.h"
#include "engine.h"
#include "engine_move.h"
#include "errbuf.h"
#include "frames.h"
#include "shard.h"
#include "share.h"
#include "tier.h"

#endif /* KVPOOL_ENGINE_PUBLIC_H */
