/* SPDX-License-Identifier: MIT */
/*
 * version.c - what libkvpool reports about itself.
 *
 * The connected calls (attach, rings, operations) join this library with the
 * daemon; until then it carries the layout arithmetic and the CPU data ops
 * (linked in from kvpool_common) and this version query.
 */
#include "kvpool.h"

__attribute__((visibility("default")))
int kvp_version(void)
{
	return KVP_VERSION_MAJOR * 1000 + KVP_VERSION_MINOR;
}
