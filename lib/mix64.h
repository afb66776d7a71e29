/* SPDX-License-Identifier: MIT */
/*
 * mix64.h - splitmix64's finaliser: a 64-bit id to 64 well-mixed bits.
 *
 * User ids are often small and sequential; everything that spreads them
 * (the user table's buckets, the shards) mixes them through this first.
 * Two users of it must not both take the low bits: the shards take the
 * high ones (shard.c), the user table the low ones (user_table.c), so the
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

#endif /* KVPOOL_LIB_MIX64_H */
