/* SPDX-License-Identifier: MIT */
/*
 * test_chunk_copy - engine_chunk_copy (daemon/engine/share_chunk_copy.c)
 * between two tensor-parallel engines, tp = 2, each on the striped backend
 * over two shm ranks: two pools of two GPUs each, as kvpoold makes them
 * with devices = 0,1,2,3 and tp = 2. (test_move covers tp = 1 pools and
 * chains of entries through a real kvpoold.)
 *
 *  - pool A's group fills a root: rank 0 registers, rank 1 joins, each
 *    writes its own slice of every page through its rank's mapping (the
 *    fd a rank's client maps), rank 0's seal pending, rank 1's the last;
 *  - the copy into pool B registers the entry there under the same id,
 *    copies every rank's slice (the striped copy_peer), and seals it for
 *    both ranks (they join and seal in the copy): READY in B, and a read
 *    lease in B finds each rank's bytes in its own rank's mapping;
 *  - A keeps the entry; a second copy copies nothing; engine_check passes
 *    on both after every step.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "engine_helpers.h"
#include "engine_move.h"
#include "errbuf.h"
#include "share.h"

#define R0 11u      /* rank 0's client */
#define R1 12u      /* rank 1's client */
#define NTOK (3 * PT) /* 3 pages */

struct pool {
	void *stripe;
	struct engine *eng;
	uint64_t rank_page;
};

static struct pool g_pool[2];

static void pool_open(struct pool *p)
{
	struct engine_config cfg = { .device_frames = 8, .host_frames = 8,
				     .backend = &backend_stripe, .tp = 2 };
	struct errbuf e = { .msg = "" };

	test_layout(&cfg.layout);
	p->rank_page = cfg.layout.page_bytes / 2;
	if (backend_stripe_open(&backend_shm, NULL, 2, p->rank_page, &p->stripe, &e))
		fail_msg("backend_stripe_open: %s", e.msg);
	cfg.backend_ctx = p->stripe;
	if (engine_create(&p->eng, &cfg, &e))
		fail_msg("engine_create: %s", e.msg);
}

static int pools_teardown(void **state)
{
	(void)state;
	for (int i = 0; i < 2; i++) {
		engine_destroy(g_pool[i].eng);
		if (g_pool[i].stripe)
			backend_stripe_close(g_pool[i].stripe);
		g_pool[i] = (struct pool){ 0 };
	}
	return 0;
}

/* Rank r's device tier of p, mapped as that rank's client maps it. */
static unsigned char *rank_map(struct pool *p, uint32_t r, uint64_t *bytes)
{
	const struct tier_mem *dev = engine_tier(p->eng, KVP_TIER_DEVICE);
	int fd = backend_stripe_fd(p->stripe, dev, r, bytes);
	void *m;

	assert_true(fd >= 0);
	m = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	return m;
}

static unsigned char byte_of(uint32_t r, uint32_t page, uint64_t i)
{
	return (unsigned char)(0x40 + 17 * r + 5 * page + i % 251);
}

/* Every rank's slice of frames[0 .. n): written (fill) or checked. */
static void rank_bytes(struct pool *p, const uint32_t *frames, uint32_t n,
		       bool fill, const char *what)
{
	for (uint32_t r = 0; r < 2; r++) {
		uint64_t bytes;
		unsigned char *m = rank_map(p, r, &bytes);

		for (uint32_t pg = 0; pg < n; pg++) {
			unsigned char *s = m + (uint64_t)frames[pg] * p->rank_page;

			for (uint64_t i = 0; i < p->rank_page; i++) {
				if (fill)
					s[i] = byte_of(r, pg, i);
				else if (s[i] != byte_of(r, pg, i))
					fail_msg("%s: rank %u, page %u, byte %" PRIu64
						 " differs", what, r, pg, i);
			}
		}
		munmap(m, bytes);
	}
}

static void check_both(void)
{
	for (int i = 0; i < 2; i++)
		CHECK(g_pool[i].eng);
}

static void a_group_filled_chunk_copies_to_another_tp_pool(void **state)
{
	struct engine *a, *b;
	struct share_chunk_reg reg;
	struct engine_chunk_copy_out out;
	struct engine_lease join, rd;
	struct errbuf e = { .msg = "" };
	uint32_t tok[NTOK];

	(void)state;
	pool_open(&g_pool[0]);
	pool_open(&g_pool[1]);
	a = g_pool[0].eng;
	b = g_pool[1].eng;
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 900 + 7 * i;

	/* Pool A's group fills a root. */
	if (share_chunk_register(a, tok, NTOK, KVP_CHUNK_SYSTEM, NULL, R0, 1, &reg, &e))
		fail_msg("register: %s", e.msg);
	assert_true(reg.created);
	assert_int_equal(reg.lease.npages, 3);
	if (engine_lease_join(a, reg.lease.id, 1, R1, 1024, &join, &e))
		fail_msg("join: %s", e.msg);
	assert_memory_equal(join.frames, reg.lease.frames, 3 * sizeof(uint32_t));
	rank_bytes(&g_pool[0], reg.lease.frames, 3, true, "fill");
	assert_int_equal(engine_chunk_seal_rank(a, reg.lease.id, 0, R0, UINT32_MAX, &e),
			 ENGINE_COMMIT_PENDING);
	/* Still filling: a copy now is refused and changes nothing. */
	assert_int_equal(engine_chunk_copy(a, b, &reg.id, 99, 2, &out, &e), -EAGAIN);
	assert_non_null(strstr(e.msg, "filling"));
	assert_int_equal(out.entries, 0);
	assert_int_equal(share_chunk_acquire(b, &reg.id, 7, 3, &rd, &e), -ENOENT);
	assert_int_equal(engine_chunk_seal_rank(a, reg.lease.id, 1, R1, UINT32_MAX, &e), 0);
	check_both();

	/* The copy: the same id in B, every rank's bytes, READY. */
	if (engine_chunk_copy(a, b, &reg.id, 99, 4, &out, &e))
		fail_msg("copy: %s", e.msg);
	assert_int_equal(out.entries, 1);
	assert_int_equal(out.pages, 3);
	assert_memory_equal(&out.id, &reg.id, sizeof(reg.id));
	check_both();
	if (share_chunk_acquire(b, &reg.id, 7, 5, &rd, &e))
		fail_msg("acquire in B: %s", e.msg);
	assert_int_equal(rd.len, NTOK);
	rank_bytes(&g_pool[1], rd.frames, rd.npages, false, "pool B");
	assert_int_equal(engine_release(b, rd.id, &e), 0);

	/* A keeps it, bytes and all; a second copy copies nothing. */
	if (share_chunk_acquire(a, &reg.id, 7, 6, &rd, &e))
		fail_msg("acquire in A: %s", e.msg);
	rank_bytes(&g_pool[0], rd.frames, rd.npages, false, "pool A after the copy");
	assert_int_equal(engine_release(a, rd.id, &e), 0);
	assert_int_equal(engine_chunk_copy(a, b, &reg.id, 99, 7, &out, &e), 0);
	assert_int_equal(out.entries, 0);
	assert_int_equal(out.pages, 0);
	/* Nothing of the copy's fill leases is left in B. */
	assert_int_equal(engine_release_owner(b, 99), 0);
	check_both();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(a_group_filled_chunk_copies_to_another_tp_pool,
					  pools_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
