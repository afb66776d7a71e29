/* SPDX-License-Identifier: MIT */
/*
 * kvp_kernels.h - the data ops on the GPU, with the same contract as the CPU
 * reference (below: kvp_append_cpu, the per-layer append, gather and
 * scatter; kvpool.h: kvp_read_cpu), which is their oracle. Plain C declarations:
 * callers need no CUDA headers. Not installed: libkvpool calls these for the
 * cuda backend; the gpu tests and kvbench call them directly.
 *
 * Every kernel is a byte copy, so one kernel serves every dtype; rows (or
 * pages) whose size and both addresses are 16-byte aligned move as 16-byte
 * vectors, the rest byte by byte.
 *
 * None of these is exported from libkvpool.so (hidden visibility): only
 * what kvpool.h declares is.
 */
#ifndef KVPOOL_KERNELS_H
#define KVPOOL_KERNELS_H

#include <stdint.h>

#include "kvpool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVPK_HIDDEN __attribute__((visibility("hidden")))

/* ---------------------------------------------------------------- CPU */

/*
 * CPU append: write K and V of n tokens, all layers, into their slots of the
 * device tier mapped at tier_base. kv is the caller's contiguous buffer
 * [n][layers][2][kv_heads][head_dim] of layout elements. The slots are not
 * checked here: this is the data path under libkvpool's checked appends
 * (libclient/append.c: lease, range and frames checked first), the engine
 * tests' writer and kvbench's copy. Not exported from libkvpool.so.
 */
KVPK_HIDDEN
void kvp_append_cpu(const struct kvp_layout *l, void *tier_base,
		    const struct kvp_slot *slots, uint32_t n, const void *kv);

/*
 * Per-layer append: k[layer] and v[layer] (layers pointers each) hold
 * [n][kv_heads][head_dim] elements; token t's K row of layer l goes where
 * kvp_append_cpu() puts it. Host memory.
 */
KVPK_HIDDEN
void kvp_append_layers_cpu(const struct kvp_layout *l, void *tier_base,
			   const struct kvp_slot *slots, uint32_t n,
			   const void *const *k, const void *const *v);

/* Gather: page i of out ([n][page_bytes]) is frame frames[i] of the tier. */
KVPK_HIDDEN
void kvp_gather_cpu(const struct kvp_layout *l, const void *tier_base,
		    const int32_t *frames, uint32_t n, void *out);
/* Scatter, the way back: frame frames[i] of the tier gets page i of in. */
KVPK_HIDDEN
void kvp_scatter_cpu(const struct kvp_layout *l, void *tier_base,
		     const int32_t *frames, uint32_t n, const void *in);

/* ---------------------------------------------------------------- CUDA */

/*
 * Each function enqueues one kernel on stream (a cudaStream_t; NULL: the
 * legacy default stream) on the calling thread's current device and
 * returns at once. Every pointer is device memory (or memory the device can
 * read). Nothing is checked on the device: slots and frames must be in the
 * tier (libkvpool checks them on the host before it copies them over).
 * Returns 0, -EINVAL (a geometry a launch cannot take) or -EIO when the
 * launch failed; kvp_kernels_error() then says why (the CUDA error).
 */

/*
 * Append n tokens (of any number of users: the slots say where each goes):
 * kv is [n][layers][2][kv_heads][head_dim], slots n entries.
 */
KVPK_HIDDEN
int kvp_append_cuda(const struct kvp_layout *l, void *pool,
		    const struct kvp_slot *slots, uint32_t n, const void *kv,
		    void *stream);

/*
 * The same from per-layer buffers: k and v are device arrays of layers
 * device pointers, k[layer] / v[layer] each [n][kv_heads][head_dim].
 */
KVPK_HIDDEN
int kvp_append_layers_cuda(const struct kvp_layout *l, void *pool,
			   const struct kvp_slot *slots, uint32_t n,
			   const void *const *k, const void *const *v,
			   void *stream);

/*
 * Gather n whole pages: out ([n][page_bytes]) gets frame frames[i] (a
 * device int32 array) of the pool as page i. Scatter copies them back.
 */
KVPK_HIDDEN
int kvp_gather_cuda(const struct kvp_layout *l, const void *pool,
		    const int32_t *frames, uint32_t n, void *out, void *stream);
KVPK_HIDDEN
int kvp_scatter_cuda(const struct kvp_layout *l, void *pool,
		     const int32_t *frames, uint32_t n, const void *in,
		     void *stream);

/* The CUDA error of the calling thread's last failed launch ("" if none). */
KVPK_HIDDEN
const char *kvp_kernels_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_KERNELS_H */
