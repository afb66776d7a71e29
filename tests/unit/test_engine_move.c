/* SPDX-License-Identifier: MIT */
/*
 * test_engine_move.c - engine_history_move (engine_move.h) between two
 * engines, as kvpoold's two pools of one tenant: the destination gets the
 * history with the same tokens (device pages in device frames, host pages
 * in host frames), the source none; engine_check() passes on both after
 * every step; every refusal (same engine, unknown user, a lease, a history
 * already there, no room, a backend that cannot copy between the two
 * device tiers) changes nothing in the source. A device tier that is not
 * host-visible (the cuda backend's) goes through the backend's copy_peer,
 * in runs of contiguous frames.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "engine_helpers.h"
#include "engine_move.h"
#include "kvpool.h"

static struct engine *g_dst;   /* the second pool; g_eng is the first */

static struct engine *mk_dst(uint32_t dev, uint32_t host,
			     const struct backend_ops *be)
{
	struct engine_config cfg = { .device_frames = dev, .host_frames = host,
				     .backend = be };
	struct errbuf e = { .msg = "" };

	test_layout(&cfg.layout);
	if (g_dst)
		engine_destroy(g_dst);
	g_dst = NULL;
	if (engine_create(&g_dst, &cfg, &e))
		fail_msg("engine_create: %s", e.msg);
	return g_dst;
}

static int teardown_both(void **state)
{
	if (g_dst)
		engine_destroy(g_dst);
	g_dst = NULL;
	return teardown(state);
}

static int move_rc(struct engine *src, struct engine *dst, uint64_t user,
		   struct engine_move_out *out, struct errbuf *e)
{
	struct engine_move_out o;
	int rc;

	e->msg[0] = '\0';
	rc = engine_history_move(src, dst, user, out ? out : &o, e);
	if (rc < 0 && !e->msg[0])
		fail_msg("engine_history_move(%" PRIu64 ") = %d without a message",
			 user, rc);
	CHECK(src);
	CHECK(dst);
	return rc;
}

/* Device pages to device frames, host-only pages to host frames. */
static void moves_both_tiers(void **state)
{
	struct engine *a = mk_engine(16, 16, 0), *b = mk_dst(16, 16, NULL);
	struct engine_move_out o;
	struct engine_user_info u;
	struct errbuf e;

	(void)state;
	put(a, 1, 0, 10);                              /* 3 device pages */
	put(a, 2, 0, 6);                               /* 2 pages ... */
	assert_int_equal(engine_offload(a, 2, &e), 2);
	assert_true(engine_evict(a, 2, KVP_SEL_DEVICE, &e) >= 0); /* ... host only */
	put(b, 9, 0, 5);                               /* b's own user stays */
	assert_int_equal(move_rc(a, b, 1, &o, &e), 0);
	assert_int_equal(o.len, 10);
	assert_int_equal(o.pages, 3);
	assert_int_equal(o.pages_device, 3);
	assert_int_equal(o.pages_host, 0);
	assert_int_equal(move_rc(a, b, 2, &o, &e), 0);
	assert_int_equal(o.pages_device, 0);
	assert_int_equal(o.pages_host, 2);
	verify(b, 1, 0, 10);
	verify(b, 2, 0, 6);
	verify(b, 9, 0, 5);
	u = info_of(b, 2);
	assert_int_equal(u.pages_device, 0);           /* read where it is */
	assert_int_equal(u.pages_host, 2);
	assert_false(info_of(a, 1).exists);
	assert_false(info_of(a, 2).exists);
	assert_int_equal(stats_of(a).tier[KVP_TIER_DEVICE].frames_used, 0);
	assert_int_equal(stats_of(a).tier[KVP_TIER_HOST].frames_used, 0);
	/* And it goes on growing where it is now. */
	put(b, 1, 10, 7);
	verify(b, 1, 0, 17);
}

static void refusals_change_nothing(void **state)
{
	struct engine *a = mk_engine(16, 16, 0), *b = mk_dst(8, 0, NULL);
	struct engine_snap before;
	struct engine_lease l, big;
	struct errbuf e;

	(void)state;
	put(a, 1, 0, 12);
	before = snap_of(a, 1);
	assert_int_equal(move_rc(a, a, 1, NULL, &e), -EINVAL);
	assert_int_equal(move_rc(a, b, 77, NULL, &e), -ENOENT);
	l = prep_ok(a, 1, 12, 2, OWNER);
	assert_int_equal(move_rc(a, b, 1, NULL, &e), -EBUSY);
	assert_msg_has(&e, "commit or release first");
	release_ok(a, l.id);
	/* A read-only lease pins it too. */
	l = prep_ok(a, 1, 12, 0, OWNER);
	assert_int_equal(move_rc(a, b, 1, NULL, &e), -EBUSY);
	release_ok(a, l.id);
	before = snap_of(a, 1);
	/* b has the user already. */
	put(b, 1, 0, 4);
	assert_int_equal(move_rc(a, b, 1, NULL, &e), -EEXIST);
	assert_unchanged(a, &before);
	assert_int_equal(engine_evict(b, 1, KVP_SEL_ALL, &e), 1);
	/* b's device tier leased but for one frame; no host tier. */
	big = prep_ok(b, 5, 0, 7 * PT, OWNER);
	assert_int_equal(move_rc(a, b, 1, NULL, &e), -ENOSPC);
	assert_unchanged(a, &before);
	verify(a, 1, 0, 12);
	release_ok(b, big.id);
	/* Host pages need b's host tier: it has none. */
	assert_int_equal(engine_offload(a, 1, &e), 3);
	assert_true(engine_evict(a, 1, KVP_SEL_DEVICE, &e) >= 0);
	before = snap_of(a, 1);
	assert_int_equal(move_rc(a, b, 1, NULL, &e), -ENOSPC);
	assert_msg_has(&e, "host tier");
	assert_unchanged(a, &before);
}

/* A test copy_peer: counts calls and runs, then copies (shm memory is the
 * daemon's whatever host_visible says). */
static uint32_t g_peer_calls, g_peer_runs;

static int test_copy_peer(void *ctx, const struct tier_mem *dst, void *src_ctx,
			  const struct tier_mem *src, const struct copy_run *runs,
			  uint32_t n, struct errbuf *e)
{
	(void)ctx;
	(void)src_ctx;
	(void)e;
	g_peer_calls++;
	g_peer_runs += n;
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)dst->base + runs[i].dst_off,
		       (const char *)src->base + runs[i].src_off, runs[i].bytes);
	return 0;
}

/* Not host-visible: without copy_peer refused, with it the runs go there. */
static void opaque_device_tier_uses_copy_peer(void **state)
{
	static struct backend_ops peer;
	struct engine *a, *b;
	struct engine_snap before;
	struct engine_move_out o;
	struct errbuf e;

	(void)state;
	a = mk_engine_on(16, 16, 0, shm_opaque_backend(), NULL);
	b = mk_dst(16, 16, shm_opaque_backend());
	put(a, 1, 0, 4 * PT);                          /* 4 contiguous frames */
	before = snap_of(a, 1);
	assert_int_equal(move_rc(a, b, 1, NULL, &e), -EOPNOTSUPP);
	assert_unchanged(a, &before);
	assert_int_equal(stats_of(b).tier[KVP_TIER_DEVICE].frames_used, 0);
	peer = *shm_opaque_backend();
	peer.copy_peer = test_copy_peer;
	a = mk_engine_on(16, 16, 0, &peer, NULL);
	b = mk_dst(16, 16, &peer);
	put(a, 1, 0, 4 * PT);
	g_peer_calls = g_peer_runs = 0;
	assert_int_equal(move_rc(a, b, 1, &o, &e), 0);
	assert_int_equal(o.pages_device, 4);
	assert_int_equal(o.bytes, 4 * engine_layout(a)->page_bytes);
	assert_int_equal(g_peer_calls, 1);
	assert_int_equal(g_peer_runs, 1);              /* one run of 4 frames */
	verify(b, 1, 0, 4 * PT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(moves_both_tiers, teardown_both),
		cmocka_unit_test_teardown(refusals_change_nothing, teardown_both),
		cmocka_unit_test_teardown(opaque_device_tier_uses_copy_peer, teardown_both),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
