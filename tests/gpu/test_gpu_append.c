/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_append.c - the CUDA append kernel writes exactly the bytes the CPU
 * reference writes: random batches of tokens into shuffled slots, for every
 * dtype. Exits 77 (skip) with a message where no CUDA device is present.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime.h>

#include "kvp_kernels.h"
#include "kvpool.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void check_append_matches_cpu(uint32_t layers, uint32_t heads,
				     uint32_t dim, uint32_t dtype, uint32_t ptok)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN];
	const uint32_t frames = 64, n = 300;
	uint64_t pool_bytes, kv_bytes;
	unsigned char *host_pool, *gpu_pool, *kv;
	struct kvp_slot *slots;
	void *d_pool, *d_kv, *d_slots;
	uint32_t *perm;

	assert_int_equal(kvp_layout_init(&l, layers, heads, dim, dtype, ptok, err,
					 sizeof(err)), 0);
	pool_bytes = frames * l.page_bytes;
	kv_bytes = n * l.token_bytes;
	host_pool = calloc(1, pool_bytes);
	gpu_pool = malloc(pool_bytes);
	kv = malloc(kv_bytes);
	slots = malloc(n * sizeof(*slots));
	perm = malloc(frames * ptok * sizeof(*perm));
	assert_non_null(host_pool);
	assert_non_null(gpu_pool);
	assert_non_null(kv);
	assert_non_null(slots);
	assert_non_null(perm);
	for (uint64_t i = 0; i < kv_bytes; i++)
		kv[i] = (unsigned char)rng();
	/* Distinct slots in shuffled order: a permutation of all of them. */
	for (uint32_t i = 0; i < frames * ptok; i++)
		perm[i] = i;
	for (uint32_t i = frames * ptok - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rng() % (i + 1)), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (uint32_t i = 0; i < n; i++)
		slots[i] = (struct kvp_slot){ perm[i] / ptok, perm[i] % ptok };

	kvp_append_cpu(&l, host_pool, slots, n, kv);

	assert_int_equal(cudaMalloc(&d_pool, pool_bytes), cudaSuccess);
	assert_int_equal(cudaMalloc(&d_kv, kv_bytes), cudaSuccess);
	assert_int_equal(cudaMalloc(&d_slots, n * sizeof(*slots)), cudaSuccess);
	assert_int_equal(cudaMemset(d_pool, 0, pool_bytes), cudaSuccess);
	assert_int_equal(cudaMemcpy(d_kv, kv, kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(cudaMemcpy(d_slots, slots, n * sizeof(*slots),
				    cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(kvp_append_cuda(&l, d_pool, d_slots, n, d_kv, NULL), 0);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	assert_int_equal(cudaMemcpy(gpu_pool, d_pool, pool_bytes, cudaMemcpyDeviceToHost),
			 cudaSuccess);
	assert_memory_equal(gpu_pool, host_pool, pool_bytes);

	cudaFree(d_pool);
	cudaFree(d_kv);
	cudaFree(d_slots);
	free(host_pool);
	free(gpu_pool);
	free(kv);
	free(slots);
	free(perm);
}

static void test_gpu_append_bf16_matches_cpu_reference(void **state)
{
	check_append_matches_cpu(3, 4, 128, KVP_DTYPE_BF16, 32);
}

static void test_gpu_append_fp16_matches_cpu_reference(void **state)
{
	check_append_matches_cpu(2, 2, 64, KVP_DTYPE_FP16, 16);
}

static void test_gpu_append_fp8_unaligned_rows_match_cpu_reference(void **state)
{
	/* 3 heads x 5 dims x 1 byte: 15-byte rows take the byte path. */
	check_append_matches_cpu(2, 3, 5, KVP_DTYPE_FP8_E4M3, 16);
}

static void test_gpu_append_fp32_matches_cpu_reference(void **state)
{
	check_append_matches_cpu(2, 8, 128, KVP_DTYPE_FP32, 64);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpu_append_bf16_matches_cpu_reference),
		cmocka_unit_test(test_gpu_append_fp16_matches_cpu_reference),
		cmocka_unit_test(test_gpu_append_fp8_unaligned_rows_match_cpu_reference),
		cmocka_unit_test(test_gpu_append_fp32_matches_cpu_reference),
	};
	int ndev = 0;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("SKIP: no CUDA device present (%s); run the gpu tests on a "
		       "GPU machine: ctest -L gpu\n",
		       cudaGetErrorString(cudaGetDeviceCount(&ndev)));
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
