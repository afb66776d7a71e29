/* SPDX-License-Identifier: MIT */
/*
 * version.c - what libkvpool reports about itself.
 *
 * The library also carries the layout arithmetic and the CPU data ops
 * (layout.c, kernels/append_cpu.c, linked in from kvpool_common) so that a
 * client computes strides and offsets with the daemon's own code.
 */
#include "client_internal.h"

KVP_PUBLIC
int kvp_version(void)
{
	return KVP_VERSION_MAJOR * 1000 + KVP_VERSION_MINOR;
}
