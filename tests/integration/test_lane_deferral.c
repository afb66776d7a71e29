/* SPDX-License-Identifier: MIT */
/*
 * test_lane_deferral - a prepare that waits for the reclaimer does not hold
 * the operations queued behind it on other users (issue 14: "never blocks
 * requests of other users while it waits"), and still holds those of its
 * own user (worker.c, DEFERRAL).
 *
 * kvpoold with one worker (so one lane: every entry of the client is on
 * the same ring) and the reclaimer on. The device tier is filled with
 * committed, unleased histories; the reclaimer then frees only up to its
 * high watermark (an eighth of the tier). One submission queues, in this
 * order:
 *     PREPARE of user A for half the tier   (must wait for the reclaimer)
 *     INFO of user B, INFO of user C        (other users: pass it)
 *     INFO of user A                        (its own user: waits behind it)
 * and the completions must come back with B's and C's before A's prepare,
 * and A's INFO after A's prepare.
 * Repeated ROUNDS times, each on a fresh user A, refilling the tier.
 * Whether a prepare has to wait is the reclaimer's timing, so stats tell
 * which rounds stalled (reclaim_stalls counts only prepares held back for
 * the reclaimer; one that evicted for itself counts reclaim_direct); at
 * least one must, and every one that did must show the order above.
 */
#define _GNU_SOURCE
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

#include "harness.h"

#define ROUNDS 8
#define FILL_USER0 1000u
#define USER_B 7u
#define USER_C 8u
#define USER_A0 500u

enum { T_PREP = 1, T_INFO_B, T_INFO_C, T_INFO_A };

/* Commit histories of `pages` pages each until the device tier is full. */
static uint64_t fill_device(struct kvp_client *c, uint64_t next, uint32_t frames)
{
	const uint32_t P = kvp_client_layout(c)->page_tokens;
	struct kvp_lease l;

	for (uint32_t used = 0; used + 4 <= frames; used += 4, next++) {
		assert_int_equal(kvp_prepare(c, next, 0, 4 * P, &l), 0);
		assert_int_equal(kvp_commit(c, l.id, 4 * P), 0);
		assert_int_equal(kvp_release(c, l.id), 0);
	}
	return next;
}

static void waiting_prepare_lets_other_users_pass(void **state)
{
	struct h_daemon *d = calloc(1, sizeof(*d));
	struct kvp_completion out[4];
	struct kvp_client *c;
	struct kvp_stats st;
	uint64_t next = FILL_USER0;
	uint32_t frames, P, stalled = 0;
	uint64_t stalls0;

	assert_non_null(d);
	*state = d;
	assert_int_equal(h_daemon_dir(d, 0), 0);
	assert_int_equal(h_daemon_start(d, 10000, "--device_mem=4M", "--host_mem=64M",
					"--workers=1", "--reclaim=yes", (char *)NULL), 0);
	c = h_connect_or_fail(d->sock, "deferral", 5000);
	assert_non_null(c);
	frames = kvp_device_frames(c);
	P = kvp_client_layout(c)->page_tokens;
	assert_true(frames >= 32);
	for (uint32_t r = 0; r < ROUNDS; r++) {
		uint64_t a = USER_A0 + r;
		uint32_t got = 0, pos[5] = { 0 };
		int32_t prep_res = 0;

		next = fill_device(c, next, frames);
		assert_int_equal(kvp_stats(c, 0, &st), 0);
		stalls0 = st.reclaim_stalls;
		assert_int_equal(kvp_queue_prepare(c, a, 0, frames / 2 * P, T_PREP), 0);
		assert_int_equal(kvp_queue_info(c, USER_B, T_INFO_B), 0);
		assert_int_equal(kvp_queue_info(c, USER_C, T_INFO_C), 0);
		assert_int_equal(kvp_queue_info(c, a, T_INFO_A), 0);
		assert_int_equal(kvp_submit(c), 4);
		while (got < 4) {
			int n = kvp_reap(c, out + got, 4 - got, 1);

			assert_true(n > 0);
			got += (uint32_t)n;
		}
		for (uint32_t i = 0; i < 4; i++) {
			pos[out[i].tag] = i;
			if (out[i].tag == T_PREP)
				prep_res = out[i].res;
			else
				assert_int_equal(out[i].res, 0);
		}
		assert_int_equal(prep_res, 0);
		if (pos[T_INFO_A] < pos[T_PREP])
			fail_msg("round %u: user A's INFO passed its own prepare", r);
		assert_int_equal(kvp_release(c, out[pos[T_PREP]].lease.id), 0);
		/* Whether the prepare had to wait is the reclaimer's timing
		 * (it may have freed enough already): only a round whose
		 * prepare stalled says anything about passing it. */
		assert_int_equal(kvp_stats(c, 0, &st), 0);
		if (st.reclaim_stalls == stalls0)
			continue;
		stalled++;
		if (pos[T_INFO_B] > pos[T_PREP] || pos[T_INFO_C] > pos[T_PREP])
			fail_msg("round %u: another user's INFO completed after the "
				 "waiting prepare (order: prepare %u, B %u, C %u)", r,
				 pos[T_PREP], pos[T_INFO_B], pos[T_INFO_C]);
	}
	print_message("%u of %u prepares waited for the reclaimer\n", stalled, ROUNDS);
	if (!stalled)
		fail_msg("no prepare of %u for half the device tier waited for the "
			 "reclaimer: the test proved nothing", ROUNDS);
	kvp_close(c);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_lane_deferral");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(waiting_prepare_lets_other_users_pass,
					  h_daemon_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL) ? H_FAIL : H_PASS;
}
