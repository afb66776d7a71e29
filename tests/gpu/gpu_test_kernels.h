/* SPDX-License-Identifier: MIT */
/*
 * gpu_test_kernels.h - small CUDA kernels the gpu tests need and kvpool does
 * not ship: a decode-attention kernel that reads K/V through a FlashInfer
 * CSR page table straight from the page-major pool, a column softmax for
 * the cuBLAS reference, and a kernel that just waits (to hold a stream busy
 * while a test checks what waits for it). Plain C declarations; each returns
 * 0 or the cudaError_t of the launch.
 */
#ifndef KVPOOL_GPU_TEST_KERNELS_H
#define KVPOOL_GPU_TEST_KERNELS_H

#include <stdint.h>

#include "kvpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Decode attention of layer `layer` for batch requests, one query token
 * each: out[b][hq][:] = softmax(scale * q[b][hq] . K[b][h]^T) V[b][h] with
 * h = hq / (qo_heads / kv_heads) (grouped-query attention). Request b's
 * pages are indices[indptr[b] .. indptr[b+1]), its last page holding
 * last_page_len[b] tokens; K and V are read from pool (page-major, l's
 * strides, dtype fp32, bf16 or fp16). q and out are float
 * [batch][qo_heads][head_dim]; scratch holds batch * qo_heads * max_len
 * floats (no request may be longer than max_len). All device pointers.
 */
int gpu_test_decode_attention(const struct kvp_layout *l, const void *pool,
			      uint32_t layer, const int32_t *indptr,
			      const int32_t *indices, const int32_t *last_page_len,
			      uint32_t batch, uint32_t qo_heads, const float *q,
			      float *out, float *scratch, uint32_t max_len,
			      float scale);

/*
 * Softmax over each of cols columns of rows floats (column-major, column j
 * at s + j * rows), written to p in dtype (KVP_DTYPE_FP32, _BF16 or _FP16),
 * same shape.
 */
int gpu_test_softmax_cols(const float *s, uint32_t rows, uint32_t cols,
			  void *p, uint32_t dtype);

/* Keep stream (a cudaStream_t) busy for about ns nanoseconds. */
int gpu_test_spin(uint64_t ns, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_GPU_TEST_KERNELS_H */
