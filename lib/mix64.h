/* SPDX-License-Identifier: MIT */
/*
 * mix64.h - splitmix64's finaliser: a 64-bit id to 64 well-mixed bits.
 *
 * User ids are often small and sequential; everything that spreads them
 * (the user table's buckets, the shards) mixes them through this first.
 * Two users of it must not both take the low bits: the shards take the
 * high ones (mix64_shard), the user table the low ones (user_table.c), so the
 * users of one shard still spread over all of its table's buckets.
 */
#ifndef KVPOOL_LIB_MIX64_H
#define KVPOOL_LIB_MIX64_H

#include <stdint.h>

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/*
 * The shard of id among n shards (0 when n <= 1): the high 32 bits of its
 * mix, as the user table takes the low ones. Written once, here, because
 * both sides must agree on it: the daemon's shard_of_user (shard.c) owns
 * users by it, and libkvpool sends a user's entries to its shard's lane by
 * it (proto.h, kvp_lane_of_user).
 */
static inline uint32_t mix64_shard(uint64_t id, uint32_t n)
{
	return n <= 1 ? 0 : (uint32_t)((mix64(id) >> 32) % n);
}

#endif /* KVPOOL_LIB_MIX64_H */
