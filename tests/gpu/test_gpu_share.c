/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_share.c - sharing on the cuda backend (daemon/share*.c over
 * daemon/engine/backend_cuda*.c) on CUDA device 0, in-process:
 *
 *  - copy on write is a device-to-device copy: a virtual sequence built on a
 *    user history whose last page is partial gets its own copy of that page
 *    when it has new tokens; both sides then write their next tokens into
 *    the same slot positions and each reads back only its own bytes;
 *  - a virtual sequence on a history that was demoted to the host tier
 *    onloads it first and reads the history's bytes;
 *  - a chunk filled through its lease slots, sealed, composed: the cascade's
 *    kv_indices are the chunk's frames and read back the chunk's bytes;
 *  - the prefix cache hands a second sequence the first one's frames.
 * Bytes are written as a client kernel would (straight into the device tier,
 * cudaMemcpy of each K/V row) and read through the backend's read op.
 *
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "backend.h"
#include "engine.h"
#include "gpu_test_util.h"
#include "share.h"

#define DEVICE 0
#define P 16

static struct kvp_layout L;

struct fx {
	void *ctx;
	struct engine *eng;
};

static void fx_open(struct fx *f, uint32_t dev_frames, uint32_t host_frames)
{
	struct engine_config ec = { .layout = L, .device_frames = dev_frames,
				    .host_frames = host_frames,
				    .backend = &backend_cuda };
	struct errbuf e = { .msg = "" };

	if (backend_cuda_open(DEVICE, &f->ctx, &e))
		fail_msg("backend_cuda_open: %s", e.msg);
	ec.backend_ctx = f->ctx;
	if (engine_create(&f->eng, &ec, &e))
		fail_msg("engine_create on cuda: %s", e.msg);
}

static void fx_check(struct fx *f)
{
	struct errbuf e = { .msg = "" };

	if (engine_check(f->eng, &e))
		fail_msg("engine_check: %s", e.msg);
}

static void fx_close(struct fx *f)
{
	fx_check(f);
	engine_destroy(f->eng);
	backend_cuda_close(f->ctx);
}

/* One token's K and V, all layers, [layers][2][heads][dim], from a seed. */
static void token_bytes(uint64_t seed, uint64_t pos, unsigned char *out)
{
	for (uint64_t i = 0; i < L.token_bytes; i++)
		out[i] = (unsigned char)((seed * 131 + pos * 31 + i * 7) ^ (i >> 8));
}

/* Write it into (frame, slot) of the device tier as a client kernel would. */
static void write_token(struct engine *eng, struct kvp_slot s,
			const unsigned char *row)
{
	unsigned char *base = engine_tier(eng, KVP_TIER_DEVICE)->base;

	for (uint32_t l = 0; l < L.layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			uint64_t off = (uint64_t)s.frame * L.page_bytes +
				       l * L.layer_stride + kv * L.kv_stride +
				       s.slot * L.token_stride;

			assert_int_equal(cudaMemcpy(base + off, row, L.token_stride,
						    cudaMemcpyHostToDevice),
					 cudaSuccess);
			row += L.token_stride;
		}
}

/* Fill the lease's new tokens [0, n) with seed's pattern from position pos0. */
static void fill_lease(struct engine *eng, uint64_t lease, uint32_t n,
		       uint64_t seed, uint64_t pos0)
{
	struct kvp_slot *s = calloc(n, sizeof(*s));
	unsigned char *row = malloc(L.token_bytes);
	struct errbuf e = { .msg = "" };

	assert_non_null(s);
	assert_non_null(row);
	if (engine_lease_slots(eng, lease, 0, n, s, &e))
		fail_msg("slots: %s", e.msg);
	for (uint32_t i = 0; i < n; i++) {
		token_bytes(seed, pos0 + i, row);
		write_token(eng, s[i], row);
	}
	/* A pageable copy may return before its DMA lands, and the backend's
	 * streams do not wait for the legacy stream. */
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	free(s);
	free(row);
}

/* Tokens [pos, pos+n) of buf (read back) hold seed's pattern. */
static void expect_tokens(const unsigned char *buf, uint32_t n, uint64_t seed,
			  uint64_t pos, const char *what)
{
	unsigned char *want = malloc(L.token_bytes);

	assert_non_null(want);
	for (uint32_t i = 0; i < n; i++) {
		token_bytes(seed, pos + i, want);
		if (memcmp(buf + (uint64_t)i * L.token_bytes, want, L.token_bytes))
			fail_msg("%s: token %" PRIu64 " differs", what, pos + i);
	}
	free(want);
}

static void history(struct fx *f, uint64_t user, uint32_t n, uint64_t seed)
{
	struct engine_lease l;
	struct errbuf e = { .msg = "" };

	if (engine_prepare(f->eng, user, 0, n, 1, &l, &e))
		fail_msg("prepare: %s", e.msg);
	fill_lease(f->eng, l.id, n, seed, 0);
	assert_int_equal(engine_commit(f->eng, l.id, n, &e), 0);
	assert_int_equal(engine_release(f->eng, l.id, &e), 0);
}

static void test_cow_is_a_device_copy_and_keeps_both_sides(void **state)
{
	struct kvp_seq_src src = { .kind = KVP_SRC_USER, .id = 7 };
	struct errbuf e = { .msg = "" };
	struct engine_lease v, h;
	uint32_t vframes[2];
	unsigned char *buf = malloc(40 * L.token_bytes);
	struct fx f;

	(void)state;
	assert_non_null(buf);
	fx_open(&f, 16, 0);
	history(&f, 7, 20, 1); /* pages: 16 + 4 tokens */
	if (share_seq_create(f.eng, 100, &src, 1, 6, 2, &v, &e))
		fail_msg("seq_create: %s", e.msg);
	assert_int_equal(v.len, 20);
	assert_int_equal(v.npages, 2);
	memcpy(vframes, v.frames, sizeof(vframes)); /* engine memory: copy it */
	fill_lease(f.eng, v.id, 6, 2, 20); /* the vseq's tokens 20..25 */
	assert_int_equal(engine_commit(f.eng, v.id, 6, &e), 0);
	/* The history writes its own tokens 20..25 into the same slots. */
	if (engine_prepare(f.eng, 7, 20, 6, 1, &h, &e))
		fail_msg("prepare: %s", e.msg);
	assert_int_not_equal(h.frames[1], vframes[1]); /* copied on write */
	assert_int_equal(h.frames[0], vframes[0]);     /* full page shared */
	fill_lease(f.eng, h.id, 6, 3, 20);
	assert_int_equal(engine_commit(f.eng, h.id, 6, &e), 0);
	assert_int_equal(engine_release(f.eng, h.id, &e), 0);

	assert_int_equal(share_seq_read_tokens(f.eng, 100, 0, 26, buf, &e), 0);
	expect_tokens(buf, 20, 1, 0, "vseq: the history's tokens");
	expect_tokens(buf + 20 * L.token_bytes, 6, 2, 20, "vseq: its own tokens");
	assert_int_equal(engine_read_tokens(f.eng, 7, 0, 26, buf, &e), 0);
	expect_tokens(buf, 20, 1, 0, "history: first tokens");
	expect_tokens(buf + 20 * L.token_bytes, 6, 3, 20, "history: its new tokens");
	fx_check(&f);
	/* A sequence is not freed under its held write lease (share.h). */
	assert_int_equal(share_seq_free(f.eng, 100, 2, &e), -EBUSY);
	assert_int_equal(engine_release(f.eng, v.id, &e), 0);
	assert_int_equal(share_seq_free(f.eng, 100, 2, &e), 0);
	fx_close(&f);
	free(buf);
}

static void test_vseq_onloads_a_demoted_history(void **state)
{
	struct kvp_seq_src src = { .kind = KVP_SRC_USER, .id = 9 };
	struct errbuf e = { .msg = "" };
	unsigned char *buf = malloc(48 * L.token_bytes);
	struct engine_lease v;
	struct fx f;

	(void)state;
	assert_non_null(buf);
	fx_open(&f, 8, 8);
	history(&f, 9, 48, 5);
	assert_true(engine_evict(f.eng, 9, KVP_SEL_DEVICE, &e) > 0); /* demote */
	if (share_seq_create(f.eng, 1, &src, 1, 0, 2, &v, &e))
		fail_msg("seq_create: %s", e.msg);
	assert_int_equal(v.npages, 3);
	assert_int_equal(share_seq_read_tokens(f.eng, 1, 0, 48, buf, &e), 0);
	expect_tokens(buf, 48, 5, 0, "vseq over an onloaded history");
	fx_check(&f);
	engine_release_owner(f.eng, 2);
	fx_close(&f);
	free(buf);
}

static void test_chunk_compose_and_prefix_on_the_device(void **state)
{
	struct errbuf e = { .msg = "" };
	uint32_t tok[40];
	unsigned char *buf = malloc(40 * L.token_bytes);
	struct share_chunk_reg sys, q, ql;
	struct share_composition c;
	struct engine_lease a, b;
	uint32_t aframes[2];
	struct kvp_compose_req r;
	struct fx f;

	(void)state;
	assert_non_null(buf);
	for (int i = 0; i < 40; i++)
		tok[i] = 1000u + (uint32_t)i;
	fx_open(&f, 32, 0);
	assert_int_equal(share_chunk_register(f.eng, tok, 35, KVP_CHUNK_SYSTEM,
					      "{\"name\": \"sys\"}", 1, 1, &sys, &e), 0);
	fill_lease(f.eng, sys.lease.id, 35, 11, 0);
	assert_int_equal(share_chunk_seal(f.eng, sys.lease.id, 1, &e), 0);
	assert_int_equal(share_chunk_register(f.eng, tok + 1, 3, KVP_CHUNK_QUERY,
					      NULL, 1, 1, &q, &e), 0);
	fill_lease(f.eng, q.lease.id, 3, 12, 0);
	assert_int_equal(share_chunk_seal(f.eng, q.lease.id, 1, &e), 0);
	/* The query's KV after the system prompt: its link, at 35..37. */
	assert_int_equal(share_chunk_link(f.eng, &q.name, &sys.id, 1, 1, &ql, &e), 0);
	assert_true(ql.created);
	assert_int_equal(ql.start, 35);
	fill_lease(f.eng, ql.lease.id, 3, 13, 0);
	assert_int_equal(share_chunk_seal(f.eng, ql.lease.id, 1, &e), 0);
	r = (struct kvp_compose_req){ .system = sys.id, .query = ql.id };
	if (share_compose(f.eng, &r, 1, false, 2, 2, &c, &e))
		fail_msg("compose: %s", e.msg);
	assert_int_equal(c.nlevels, 2);
	assert_int_equal(c.kv_indptr[0][1], 3);
	assert_int_equal(c.kv_last_page_len[0][0], 35 - 2 * P);
	assert_int_equal(share_chunk_read_tokens(f.eng, &sys.id, 0, 35, buf, &e), 0);
	expect_tokens(buf, 35, 11, 0, "system chunk");
	assert_int_equal(engine_release(f.eng, c.lease, &e), 0);

	/* Prefix cache: the second sequence gets the first one's full pages. */
	assert_int_equal(share_seq_alloc(f.eng, 1, tok, 40, 3, &a, &e), 0);
	memcpy(aframes, a.frames, sizeof(aframes));
	fill_lease(f.eng, a.id, 40, 21, 0);
	assert_int_equal(engine_commit(f.eng, a.id, 40, &e), 0);
	assert_int_equal(share_seq_alloc(f.eng, 2, tok, 40, 3, &b, &e), 0);
	assert_int_equal(b.len, 2 * P);
	assert_memory_equal(aframes, b.frames, sizeof(aframes));
	engine_release_owner(f.eng, 3);
	fx_close(&f);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cow_is_a_device_copy_and_keeps_both_sides),
		cmocka_unit_test(test_vseq_onloads_a_demoted_history),
		cmocka_unit_test(test_chunk_compose_and_prefix_on_the_device),
	};
	char err[KVP_ERRLEN];

	if (gpu_test_no_device())
		return 77;
	if (kvp_layout_init(&L, 4, 2, 64, KVP_DTYPE_BF16, P, err, sizeof(err))) {
		fprintf(stderr, "layout: %s\n", err);
		return 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
