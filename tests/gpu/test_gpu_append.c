/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_append.c - the CUDA kernels write exactly the bytes the CPU
 * reference writes:
 *   - append of random tokens into shuffled slots, every dtype;
 *   - random append batches shaped like a step of a server: many users, each
 *     a random number of new tokens after a random history, into its own
 *     pages, all in one launch; from the contiguous buffer and from
 *     per-layer buffers; rows aligned (vector path) and not (byte path);
 *   - gather of frames into a contiguous buffer and scatter back, against
 *     kvp_gather_cpu / kvp_scatter_cpu, and the round trip.
 * Exits 77 (skip) with a message where no CUDA device is present.
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

#include "gpu_test_util.h"
#include "kvp_kernels.h"
#include "kvpool.h"

static void fill_random(unsigned char *p, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = (unsigned char)gpu_rng();
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

static void *dmalloc(size_t n)
{
	void *p = NULL;

	assert_int_equal(cudaMalloc(&p, n ? n : 1), cudaSuccess);
	return p;
}

static void *to_device(const void *h, size_t n)
{
	void *d = dmalloc(n);

	assert_int_equal(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
	return d;
}

static void from_device(void *h, const void *d, size_t n)
{
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	assert_int_equal(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
}

static struct kvp_layout layout(uint32_t layers, uint32_t heads, uint32_t dim,
				uint32_t dtype, uint32_t ptok)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN];

	assert_int_equal(kvp_layout_init(&l, layers, heads, dim, dtype, ptok, err,
					 sizeof(err)), 0);
	return l;
}

/* Frame indices 0..frames-1 in random order. */
static uint32_t *shuffled(uint32_t frames)
{
	uint32_t *p = xmalloc(frames * sizeof(*p));

	for (uint32_t i = 0; i < frames; i++)
		p[i] = i;
	for (uint32_t i = frames - 1; i > 0; i--) {
		uint32_t j = gpu_below(i + 1), t = p[i];

		p[i] = p[j];
		p[j] = t;
	}
	return p;
}

/* ------------------------------------------------------------ single batch */

static void check_append_matches_cpu(uint32_t layers, uint32_t heads,
				     uint32_t dim, uint32_t dtype, uint32_t ptok)
{
	struct kvp_layout l = layout(layers, heads, dim, dtype, ptok);
	const uint32_t frames = 64, n = 300;
	uint64_t pool_bytes = frames * l.page_bytes, kv_bytes = n * l.token_bytes;
	unsigned char *host_pool, *gpu_pool, *kv;
	struct kvp_slot *slots;
	void *d_pool, *d_kv, *d_slots;
	uint32_t *perm;

	host_pool = calloc(1, pool_bytes);
	assert_non_null(host_pool);
	gpu_pool = xmalloc(pool_bytes);
	kv = xmalloc(kv_bytes);
	slots = xmalloc(n * sizeof(*slots));
	fill_random(kv, kv_bytes);
	/* Distinct slots in shuffled order: a permutation of all of them. */
	perm = shuffled(frames * ptok);
	for (uint32_t i = 0; i < n; i++)
		slots[i] = (struct kvp_slot){ perm[i] / ptok, perm[i] % ptok };

	kvp_append_cpu(&l, host_pool, slots, n, kv);

	d_pool = dmalloc(pool_bytes);
	assert_int_equal(cudaMemset(d_pool, 0, pool_bytes), cudaSuccess);
	d_kv = to_device(kv, kv_bytes);
	d_slots = to_device(slots, n * sizeof(*slots));
	assert_int_equal(kvp_append_cuda(&l, d_pool, d_slots, n, d_kv, NULL), 0);
	from_device(gpu_pool, d_pool, pool_bytes);
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

/* ------------------------------------------------------------ server steps */

/*
 * One step of a server: users, each with a history of random length and a
 * random number of new tokens, in pages of its own (frames drawn without
 * replacement); the new tokens' slots follow from (history length, page
 * table) the way libkvpool computes them. Returns the total tokens.
 */
static uint32_t random_step(const struct kvp_layout *l, uint32_t frames,
			    uint32_t max_users, struct kvp_slot **slots_out,
			    uint32_t *users_out)
{
	const uint32_t P = l->page_tokens;
	uint32_t *perm = shuffled(frames), used = 0, n = 0, users = 0;
	struct kvp_slot *slots = xmalloc((size_t)frames * P * sizeof(*slots));

	for (uint32_t u = 0; u < max_users; u++) {
		uint32_t hist = gpu_below(3 * P), add = 1 + gpu_below(2 * P + 3), pages;

		if (gpu_below(8) == 0)
			add = 1; /* decode: one token */
		pages = (hist + add + P - 1) / P;
		if (used + pages > frames)
			break;
		for (uint32_t i = 0; i < add; i++) {
			uint32_t q = hist + i;

			slots[n + i].frame = perm[used + q / P];
			slots[n + i].slot = q % P;
		}
		used += pages;
		n += add;
		users++;
	}
	free(perm);
	*slots_out = slots;
	*users_out = users;
	return n;
}

/*
 * Several steps into one pool, each one launch, from the contiguous buffer
 * (misaligned by src_skew bytes when set, to force the byte path) and from
 * per-layer buffers; after every step the GPU pool equals the CPU pool.
 */
static void check_random_steps(uint32_t layers, uint32_t heads, uint32_t dim,
			       uint32_t dtype, uint32_t ptok, uint32_t src_skew)
{
	struct kvp_layout l = layout(layers, heads, dim, dtype, ptok);
	const uint32_t frames = 256, steps = 4;
	const uint64_t pool_bytes = frames * l.page_bytes, row = l.token_stride;
	unsigned char *host_pool = calloc(1, pool_bytes), *host_pool2 = calloc(1, pool_bytes);
	unsigned char *gpu_pool = xmalloc(pool_bytes);
	unsigned char *d_pool = dmalloc(pool_bytes), *d_pool2 = dmalloc(pool_bytes);

	assert_non_null(host_pool);
	assert_non_null(host_pool2);
	assert_int_equal(cudaMemset(d_pool, 0, pool_bytes), cudaSuccess);
	assert_int_equal(cudaMemset(d_pool2, 0, pool_bytes), cudaSuccess);
	for (uint32_t step = 0; step < steps; step++) {
		struct kvp_slot *slots;
		uint32_t users, n = random_step(&l, frames, 64, &slots, &users);
		uint64_t kv_bytes = n * l.token_bytes;
		unsigned char *kv = xmalloc(kv_bytes + src_skew), *d_kv;
		const void **k = xmalloc(layers * sizeof(void *));
		const void **v = xmalloc(layers * sizeof(void *));
		void **dk = xmalloc(layers * sizeof(void *)), **dv = xmalloc(layers * sizeof(void *));
		void *d_slots, *d_k, *d_v;

		assert_true(users > 4);
		fill_random(kv, kv_bytes + src_skew);
		kvp_append_cpu(&l, host_pool, slots, n, kv + src_skew);
		d_kv = to_device(kv, kv_bytes + src_skew);
		d_slots = to_device(slots, n * sizeof(*slots));
		assert_int_equal(kvp_append_cuda(&l, d_pool, d_slots, n, d_kv + src_skew,
						 NULL), 0);
		from_device(gpu_pool, d_pool, pool_bytes);
		assert_memory_equal(gpu_pool, host_pool, pool_bytes);

		/* Per-layer buffers holding the same rows: both references
		 * and the kernel agree. */
		for (uint32_t ly = 0; ly < layers; ly++) {
			unsigned char *kb = xmalloc(n * row), *vb = xmalloc(n * row);

			for (uint32_t t = 0; t < n; t++) {
				const unsigned char *src = kv + src_skew + t * l.token_bytes +
							   2 * ly * row;

				memcpy(kb + t * row, src, row);
				memcpy(vb + t * row, src + row, row);
			}
			k[ly] = kb;
			v[ly] = vb;
			dk[ly] = to_device(kb, n * row);
			dv[ly] = to_device(vb, n * row);
		}
		kvp_append_layers_cpu(&l, host_pool2, slots, n, k, v);
		assert_memory_equal(host_pool2, host_pool, pool_bytes);
		d_k = to_device(dk, layers * sizeof(void *));
		d_v = to_device(dv, layers * sizeof(void *));
		assert_int_equal(kvp_append_layers_cuda(&l, d_pool2, d_slots, n,
							d_k, d_v, NULL), 0);
		from_device(gpu_pool, d_pool2, pool_bytes);
		assert_memory_equal(gpu_pool, host_pool, pool_bytes);

		for (uint32_t ly = 0; ly < layers; ly++) {
			free((void *)k[ly]);
			free((void *)v[ly]);
			cudaFree(dk[ly]);
			cudaFree(dv[ly]);
		}
		free(k);
		free(v);
		free(dk);
		free(dv);
		cudaFree(d_k);
		cudaFree(d_v);
		cudaFree(d_kv);
		cudaFree(d_slots);
		free(kv);
		free(slots);
	}
	cudaFree(d_pool);
	cudaFree(d_pool2);
	free(host_pool);
	free(host_pool2);
	free(gpu_pool);
}

static void test_gpu_random_steps_bf16(void **state)
{
	check_random_steps(3, 4, 128, KVP_DTYPE_BF16, 16, 0);
}

static void test_gpu_random_steps_fp16_misaligned_source(void **state)
{
	/* A source one byte off 16-byte alignment: aligned rows, byte path. */
	check_random_steps(2, 2, 64, KVP_DTYPE_FP16, 32, 1);
}

static void test_gpu_random_steps_fp8(void **state)
{
	check_random_steps(4, 2, 64, KVP_DTYPE_FP8_E4M3, 16, 0);
	check_random_steps(2, 3, 5, KVP_DTYPE_FP8_E4M3, 8, 0);
}

static void test_gpu_random_steps_fp32(void **state)
{
	check_random_steps(2, 8, 128, KVP_DTYPE_FP32, 64, 0);
}

/* ------------------------------------------------------------ gather/scatter */

static void check_gather_scatter(uint32_t layers, uint32_t heads, uint32_t dim,
				 uint32_t dtype, uint32_t ptok)
{
	struct kvp_layout l = layout(layers, heads, dim, dtype, ptok);
	enum { n = 20 };
	const uint32_t frames = 48;
	const uint64_t pool_bytes = frames * l.page_bytes, buf_bytes = n * l.page_bytes;
	unsigned char *pool = xmalloc(pool_bytes), *out_pool = xmalloc(pool_bytes);
	unsigned char *buf = xmalloc(buf_bytes), *out = xmalloc(buf_bytes);
	uint32_t *perm = shuffled(frames);
	int32_t src[n], dst[n];
	void *d_pool, *d_buf, *d_src, *d_dst;

	fill_random(pool, pool_bytes);
	/* Gather: any frames, repeats allowed. Scatter: distinct frames. */
	for (uint32_t i = 0; i < n; i++) {
		src[i] = (int32_t)gpu_below(frames);
		dst[i] = (int32_t)perm[i];
	}
	d_pool = to_device(pool, pool_bytes);
	d_buf = dmalloc(buf_bytes);
	d_src = to_device(src, sizeof(src));
	d_dst = to_device(dst, sizeof(dst));

	kvp_gather_cpu(&l, pool, src, n, buf);
	assert_int_equal(kvp_gather_cuda(&l, d_pool, d_src, n, d_buf, NULL), 0);
	from_device(out, d_buf, buf_bytes);
	assert_memory_equal(out, buf, buf_bytes);

	/* Scatter those pages to other frames: the CPU and the GPU agree, and
	 * gathering the new frames gives the pages back. */
	kvp_scatter_cpu(&l, pool, dst, n, buf);
	assert_int_equal(kvp_scatter_cuda(&l, d_pool, d_dst, n, d_buf, NULL), 0);
	from_device(out_pool, d_pool, pool_bytes);
	assert_memory_equal(out_pool, pool, pool_bytes);
	assert_int_equal(cudaMemset(d_buf, 0, buf_bytes), cudaSuccess);
	assert_int_equal(kvp_gather_cuda(&l, d_pool, d_dst, n, d_buf, NULL), 0);
	from_device(out, d_buf, buf_bytes);
	assert_memory_equal(out, buf, buf_bytes);

	cudaFree(d_pool);
	cudaFree(d_buf);
	cudaFree(d_src);
	cudaFree(d_dst);
	free(pool);
	free(out_pool);
	free(buf);
	free(out);
	free(perm);
}

static void test_gpu_gather_scatter_round_trip(void **state)
{
	/* 256 KiB pages: several chunks a page. */
	check_gather_scatter(4, 8, 128, KVP_DTYPE_BF16, 16);
	check_gather_scatter(2, 2, 64, KVP_DTYPE_FP32, 32);
	check_gather_scatter(2, 8, 64, KVP_DTYPE_FP16, 16);
	/* 6-byte pages: the byte path. */
	check_gather_scatter(1, 1, 3, KVP_DTYPE_FP8_E4M3, 1);
	check_gather_scatter(3, 3, 5, KVP_DTYPE_FP8_E4M3, 4);
}

int main(void)
{
	gpu_rng_seed(0x9e3779b97f4a7c15ull);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpu_append_bf16_matches_cpu_reference),
		cmocka_unit_test(test_gpu_append_fp16_matches_cpu_reference),
		cmocka_unit_test(test_gpu_append_fp8_unaligned_rows_match_cpu_reference),
		cmocka_unit_test(test_gpu_append_fp32_matches_cpu_reference),
		cmocka_unit_test(test_gpu_random_steps_bf16),
		cmocka_unit_test(test_gpu_random_steps_fp16_misaligned_source),
		cmocka_unit_test(test_gpu_random_steps_fp8),
		cmocka_unit_test(test_gpu_random_steps_fp32),
		cmocka_unit_test(test_gpu_gather_scatter_round_trip),
	};

	if (gpu_test_no_device())
		return 77;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
