/* SPDX-License-Identifier: MIT */
/*
 * kvp_kernels.h - the data ops on the GPU, with the same contract as the CPU
 * reference in kvpool.h (kvp_append_cpu / kvp_read_cpu), which is their
 * oracle. Plain C declarations: callers need no CUDA headers.
 */
#ifndef KVPOOL_KERNELS_H
#define KVPOOL_KERNELS_H

#include "kvpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Enqueue the append of n tokens on stream (a cudaStream_t; NULL: the legacy
 * default stream). pool, slots and kv are device pointers: the device tier's
 * base, n slots, and [n][layers][2][kv_heads][head_dim] elements.
 * Returns 0 or -EINVAL (a launch error, e.g. no device).
 */
int kvp_append_cuda(const struct kvp_layout *l, void *pool,
		    const struct kvp_slot *slots, uint32_t n, const void *kv,
		    void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_KERNELS_H */
