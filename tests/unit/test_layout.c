/* SPDX-License-Identifier: MIT */
/*
 * test_layout.c - the layout descriptor: kvp_layout_init() computes every
 * stride of the page-major [layer][K|V][token][head][dim] page, rejects bad
 * geometry (zeros, unknown dtypes, page_tokens not a power of two up to 1024,
 * pages over 1 GiB, products that overflow 64 bits) with -EINVAL, a message
 * and *l untouched; kvp_layout_parse()/kvp_layout_format() round-trip and
 * name the offending key on error; dtype names map both ways.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvpool.h"

/* Calls kvp_layout_init on a canary-filled struct and expects -EINVAL, a
 * non-empty message and the struct left byte-for-byte untouched. */
static void expect_init_einval(uint32_t layers, uint32_t heads, uint32_t dim,
			       uint32_t dtype, uint32_t pt, const char *what)
{
	struct kvp_layout l, canary;
	char err[KVP_ERRLEN];
	int rc;

	memset(&l, 0xA5, sizeof(l));
	memcpy(&canary, &l, sizeof(l));
	err[0] = '\0';
	rc = kvp_layout_init(&l, layers, heads, dim, dtype, pt, err, sizeof(err));
	if (rc != -EINVAL)
		fail_msg("%s: kvp_layout_init(%u,%u,%u,%u,%u) = %d, want -EINVAL",
			 what, layers, heads, dim, dtype, pt, rc);
	if (err[0] == '\0')
		fail_msg("%s: -EINVAL without a message", what);
	if (memchr(err, '\0', sizeof(err)) == NULL)
		fail_msg("%s: message not NUL-terminated", what);
	if (memcmp(&l, &canary, sizeof(l)) != 0)
		fail_msg("%s: *l was modified on error", what);
}

static void test_init_strides_bf16_example(void **state)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN] = "";

	(void)state;
	assert_int_equal(kvp_layout_init(&l, 2, 2, 64, KVP_DTYPE_BF16, 16, err,
					 sizeof(err)), 0);
	assert_int_equal(l.layers, 2);
	assert_int_equal(l.kv_heads, 2);
	assert_int_equal(l.head_dim, 64);
	assert_int_equal(l.dtype, KVP_DTYPE_BF16);
	assert_int_equal(l.page_tokens, 16);
	assert_int_equal(l.elem_bytes, 2);
	assert_int_equal(l.head_stride, 128);
	assert_int_equal(l.token_stride, 256);
	assert_int_equal(l.kv_stride, 4096);
	assert_int_equal(l.layer_stride, 8192);
	assert_int_equal(l.page_bytes, 16384);
	assert_int_equal(l.token_bytes, 1024);
}

static void test_init_strides_follow_formulas(void **state)
{
	static const uint32_t dt[] = { KVP_DTYPE_BF16, KVP_DTYPE_FP16,
				       KVP_DTYPE_FP8_E4M3, KVP_DTYPE_FP32 };
	static const uint32_t pts[] = { 1, 2, 16, 32, 64, 128, 1024 };
	struct kvp_layout l;
	char err[KVP_ERRLEN] = "";

	(void)state;
	for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); i++) {
		for (size_t j = 0; j < sizeof(pts) / sizeof(pts[0]); j++) {
			assert_int_equal(kvp_layout_init(&l, 3, 5, 96, dt[i], pts[j],
							 err, sizeof(err)), 0);
			assert_int_equal(l.head_stride, 96ull * l.elem_bytes);
			assert_int_equal(l.token_stride, 5ull * l.head_stride);
			assert_int_equal(l.kv_stride, (uint64_t)pts[j] * l.token_stride);
			assert_int_equal(l.layer_stride, 2ull * l.kv_stride);
			assert_int_equal(l.page_bytes, 3ull * l.layer_stride);
			assert_int_equal(l.token_bytes, 2ull * 3 * l.token_stride);
			assert_int_equal(l.page_bytes, (uint64_t)pts[j] * l.token_bytes);
		}
	}
}

static void test_init_elem_bytes_per_dtype(void **state)
{
	static const struct {
		uint32_t dtype;
		uint32_t bytes;
	} cases[] = {
		{ KVP_DTYPE_BF16, 2 },
		{ KVP_DTYPE_FP16, 2 },
		{ KVP_DTYPE_FP8_E4M3, 1 },
		{ KVP_DTYPE_FP32, 4 },
	};
	struct kvp_layout l;
	char err[KVP_ERRLEN] = "";

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(kvp_layout_init(&l, 1, 1, 8, cases[i].dtype, 16,
						 err, sizeof(err)), 0);
		assert_int_equal(l.elem_bytes, cases[i].bytes);
		assert_int_equal(l.head_stride, 8ull * cases[i].bytes);
	}
}

static void test_init_rejects_each_zero_param(void **state)
{
	(void)state;
	expect_init_einval(0, 2, 64, KVP_DTYPE_BF16, 16, "layers=0");
	expect_init_einval(2, 0, 64, KVP_DTYPE_BF16, 16, "kv_heads=0");
	expect_init_einval(2, 2, 0, KVP_DTYPE_BF16, 16, "head_dim=0");
	expect_init_einval(2, 2, 64, 0, 16, "dtype=0");
	expect_init_einval(2, 2, 64, KVP_DTYPE_BF16, 0, "page_tokens=0");
}

static void test_init_rejects_unknown_dtype(void **state)
{
	(void)state;
	expect_init_einval(2, 2, 64, 0, 16, "dtype 0");
	expect_init_einval(2, 2, 64, 5, 16, "dtype 5");
	expect_init_einval(2, 2, 64, 99, 16, "dtype 99");
	expect_init_einval(2, 2, 64, UINT32_MAX, 16, "dtype UINT32_MAX");
}

static void test_init_rejects_page_tokens_not_power_of_two(void **state)
{
	(void)state;
	expect_init_einval(2, 2, 64, KVP_DTYPE_BF16, 3, "page_tokens=3");
	expect_init_einval(2, 2, 64, KVP_DTYPE_BF16, 48, "page_tokens=48");
	expect_init_einval(2, 2, 64, KVP_DTYPE_BF16, 1000, "page_tokens=1000");
	expect_init_einval(2, 2, 64, KVP_DTYPE_BF16, UINT32_MAX,
			   "page_tokens=UINT32_MAX");
}

static void test_init_rejects_page_tokens_over_1024(void **state)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN] = "";

	(void)state;
	/* the limit itself is fine */
	assert_int_equal(kvp_layout_init(&l, 1, 1, 1, KVP_DTYPE_FP8_E4M3,
					 KVP_MAX_PAGE_TOKENS, err, sizeof(err)), 0);
	assert_int_equal(l.page_tokens, 1024);
	expect_init_einval(1, 1, 1, KVP_DTYPE_FP8_E4M3, 2048, "page_tokens=2048");
	expect_init_einval(1, 1, 1, KVP_DTYPE_FP8_E4M3, 1u << 31,
			   "page_tokens=2^31");
}

static void test_init_rejects_page_over_1gib(void **state)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN] = "";

	(void)state;
	/* 1 layer * 2 * 128 tokens * 1 head * 2^20 dim * 4 bytes = exactly 1 GiB */
	assert_int_equal(kvp_layout_init(&l, 1, 1, 1u << 20, KVP_DTYPE_FP32, 128,
					 err, sizeof(err)), 0);
	assert_int_equal(l.page_bytes, KVP_MAX_PAGE_BYTES);
	/* twice that */
	expect_init_einval(2, 1, 1u << 20, KVP_DTYPE_FP32, 128, "2 GiB page");
	/* just past it: (2^20 + 2) dims -> 1 GiB + 2 KiB */
	expect_init_einval(1, 1, (1u << 20) + 2, KVP_DTYPE_FP32, 128,
			   "1 GiB + 2 KiB page");
	/* big model: 80 layers x 2 x 1024 tokens x 8 heads x 256 dim x 4 = 1280 MiB */
	expect_init_einval(80, 8, 256, KVP_DTYPE_FP32, 1024, "80-layer page");
}

static void test_init_rejects_overflowing_product(void **state)
{
	(void)state;
	/* 2^96-ish: every 64-bit product overflows */
	expect_init_einval(UINT32_MAX, UINT32_MAX, UINT32_MAX, KVP_DTYPE_FP32,
			   1024, "all max");
	/*
	 * 17 * 858001 * 308761441 = 2^52 + 1, so with bf16 and 1024 tokens the
	 * page is 2 * 1024 * 2 * (2^52 + 1) = 2^64 + 4096 bytes: a product that
	 * wraps to a tiny, "valid" 4096 when multiplied without overflow checks.
	 */
	expect_init_einval(17, 858001, 308761441, KVP_DTYPE_BF16, 1024,
			   "wraps to 4096");
	/* token_stride = 2^32-1 heads * 2^32-1 dims * 4 wraps 64 bits */
	expect_init_einval(1, UINT32_MAX, UINT32_MAX, KVP_DTYPE_FP32, 1024,
			   "heads * dim wraps");
	/* 2^31 layers * 2^31 heads * 2^2 dims * 2 * 1 token * 1 byte = 2^65 -> 0 */
	expect_init_einval(1u << 31, 1u << 31, 4, KVP_DTYPE_FP8_E4M3, 1,
			   "wraps to 0");
}

static void test_init_error_with_tiny_errbuf_is_terminated(void **state)
{
	struct kvp_layout l;
	char err[8];

	(void)state;
	memset(err, 'x', sizeof(err));
	assert_int_equal(kvp_layout_init(&l, 0, 1, 1, KVP_DTYPE_FP32, 16, err,
					 sizeof(err)), -EINVAL);
	assert_non_null(memchr(err, '\0', sizeof(err)));
}

static void test_parse_reads_all_keys(void **state)
{
	struct kvp_layout l, want;
	char err[KVP_ERRLEN] = "";

	(void)state;
	assert_int_equal(kvp_layout_parse(&l,
		"layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
		err, sizeof(err)), 0);
	assert_int_equal(kvp_layout_init(&want, 8, 4, 256, KVP_DTYPE_BF16, 32,
					 err, sizeof(err)), 0);
	assert_memory_equal(&l, &want, sizeof(l));

	/* any order */
	memset(&l, 0, sizeof(l));
	assert_int_equal(kvp_layout_parse(&l,
		"page_tokens=32,dtype=bf16,head_dim=256,kv_heads=4,layers=8",
		err, sizeof(err)), 0);
	assert_memory_equal(&l, &want, sizeof(l));
}

static void test_format_parse_round_trip(void **state)
{
	static const uint32_t dt[] = { KVP_DTYPE_BF16, KVP_DTYPE_FP16,
				       KVP_DTYPE_FP8_E4M3, KVP_DTYPE_FP32 };
	struct kvp_layout l, back;
	char err[KVP_ERRLEN] = "";
	char buf[256];

	(void)state;
	for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); i++) {
		int n;

		assert_int_equal(kvp_layout_init(&l, 61, 7, 192, dt[i], 64, err,
						 sizeof(err)), 0);
		memset(buf, 0, sizeof(buf));
		n = kvp_layout_format(&l, buf, sizeof(buf));
		assert_true(n > 0);
		assert_int_equal((size_t)n, strlen(buf));
		assert_non_null(strstr(buf, kvp_dtype_name(dt[i])));
		memset(&back, 0x5A, sizeof(back));
		if (kvp_layout_parse(&back, buf, err, sizeof(err)) != 0)
			fail_msg("parse of formatted '%s' failed: %s", buf, err);
		assert_memory_equal(&l, &back, sizeof(l));
	}
}

static void test_format_writes_documented_spec(void **state)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN] = "";
	char buf[256];

	(void)state;
	assert_int_equal(kvp_layout_init(&l, 8, 4, 256, KVP_DTYPE_BF16, 32, err,
					 sizeof(err)), 0);
	int n = kvp_layout_format(&l, buf, sizeof(buf));
	assert_int_equal(n, (int)strlen(buf));
	assert_non_null(strstr(buf, "layers=8"));
	assert_non_null(strstr(buf, "kv_heads=4"));
	assert_non_null(strstr(buf, "head_dim=256"));
	assert_non_null(strstr(buf, "dtype=bf16"));
	assert_non_null(strstr(buf, "page_tokens=32"));
}

static void expect_parse_einval(const char *spec, const char *must_name)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN];
	int rc;

	err[0] = '\0';
	rc = kvp_layout_parse(&l, spec, err, sizeof(err));
	if (rc != -EINVAL)
		fail_msg("kvp_layout_parse(\"%s\") = %d, want -EINVAL", spec, rc);
	if (err[0] == '\0')
		fail_msg("kvp_layout_parse(\"%s\"): no message", spec);
	if (must_name && !strstr(err, must_name))
		fail_msg("kvp_layout_parse(\"%s\"): message \"%s\" does not name \"%s\"",
			 spec, err, must_name);
}

static void test_parse_missing_key_names_it(void **state)
{
	(void)state;
	expect_parse_einval("kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
			    "layers");
	expect_parse_einval("layers=8,head_dim=256,dtype=bf16,page_tokens=32",
			    "kv_heads");
	expect_parse_einval("layers=8,kv_heads=4,dtype=bf16,page_tokens=32",
			    "head_dim");
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,page_tokens=32",
			    "dtype");
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,dtype=bf16",
			    "page_tokens");
	expect_parse_einval("", NULL);
}

static void test_parse_unknown_key_names_it(void **state)
{
	(void)state;
	expect_parse_einval(
		"layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32,bogus=1",
		"bogus");
	expect_parse_einval(
		"layers=8,kv_heads=4,heads=4,head_dim=256,dtype=bf16,page_tokens=32",
		"heads");
}

static void test_parse_bad_number_names_key(void **state)
{
	(void)state;
	expect_parse_einval("layers=abc,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
			    "layers");
	expect_parse_einval("layers=8,kv_heads=,head_dim=256,dtype=bf16,page_tokens=32",
			    "kv_heads");
	expect_parse_einval("layers=8,kv_heads=4,head_dim=-1,dtype=bf16,page_tokens=32",
			    "head_dim");
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=99999999999999999999",
			    "page_tokens");
	expect_parse_einval("layers=4294967296,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
			    "layers");
}

static void test_parse_trailing_garbage_names_key(void **state)
{
	(void)state;
	expect_parse_einval("layers=8x,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
			    "layers");
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32 junk",
			    "page_tokens");
}

static void test_parse_unknown_dtype_names_key(void **state)
{
	(void)state;
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,dtype=int4,page_tokens=32",
			    "dtype");
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,dtype=,page_tokens=32",
			    "dtype");
}

static void test_parse_rejects_bad_geometry(void **state)
{
	(void)state;
	expect_parse_einval("layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=48",
			    NULL);
	expect_parse_einval("layers=0,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
			    NULL);
}

static void test_dtype_names_both_ways(void **state)
{
	static const struct {
		uint32_t dtype;
		const char *name;
	} cases[] = {
		{ KVP_DTYPE_BF16, "bf16" },
		{ KVP_DTYPE_FP16, "fp16" },
		{ KVP_DTYPE_FP8_E4M3, "fp8_e4m3" },
		{ KVP_DTYPE_FP32, "fp32" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_non_null(kvp_dtype_name(cases[i].dtype));
		assert_string_equal(kvp_dtype_name(cases[i].dtype), cases[i].name);
		assert_int_equal(kvp_dtype_parse(cases[i].name), cases[i].dtype);
	}
	assert_null(kvp_dtype_name(0));
	assert_null(kvp_dtype_name(5));
	assert_null(kvp_dtype_name(99));
	assert_int_equal(kvp_dtype_parse("int4"), -EINVAL);
	assert_int_equal(kvp_dtype_parse(""), -EINVAL);
	assert_int_equal(kvp_dtype_parse("bf16x"), -EINVAL);
	assert_int_equal(kvp_dtype_parse("bf1"), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_strides_bf16_example),
		cmocka_unit_test(test_init_strides_follow_formulas),
		cmocka_unit_test(test_init_elem_bytes_per_dtype),
		cmocka_unit_test(test_init_rejects_each_zero_param),
		cmocka_unit_test(test_init_rejects_unknown_dtype),
		cmocka_unit_test(test_init_rejects_page_tokens_not_power_of_two),
		cmocka_unit_test(test_init_rejects_page_tokens_over_1024),
		cmocka_unit_test(test_init_rejects_page_over_1gib),
		cmocka_unit_test(test_init_rejects_overflowing_product),
		cmocka_unit_test(test_init_error_with_tiny_errbuf_is_terminated),
		cmocka_unit_test(test_parse_reads_all_keys),
		cmocka_unit_test(test_format_parse_round_trip),
		cmocka_unit_test(test_format_writes_documented_spec),
		cmocka_unit_test(test_parse_missing_key_names_it),
		cmocka_unit_test(test_parse_unknown_key_names_it),
		cmocka_unit_test(test_parse_bad_number_names_key),
		cmocka_unit_test(test_parse_trailing_garbage_names_key),
		cmocka_unit_test(test_parse_unknown_dtype_names_key),
		cmocka_unit_test(test_parse_rejects_bad_geometry),
		cmocka_unit_test(test_dtype_names_both_ways),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
