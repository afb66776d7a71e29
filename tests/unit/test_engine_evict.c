/* SPDX-License-Identifier: MIT */
/*
 * test_engine_evict.c - where device frames come from when the tier is full,
 * and offload/onload: eviction takes the least recently used unpinned user,
 * never a leased one (-ENOMEM when only pinned users remain, nothing
 * changed); an evicted user is demoted to the host tier when it has room
 * (the host tier dropping its oldest demoted users to make room) and dropped
 * otherwise; a later prepare onloads the very same bytes; engine_offload
 * keeps both copies valid, engine_evict / engine_evict_all drop per tier;
 * and a host copy never goes stale after new tokens land in its page.
 * engine_check() must pass after every step.
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
#include "frames.h"
#include "kvpool.h"

/* ------------------------------------------------------------- helpers */

static uint64_t host_used(struct engine *eng)
{
	return stats_of(eng).tier[KVP_TIER_HOST].frames_used;
}

static bool exists(struct engine *eng, uint64_t user)
{
	return info_of(eng, user).exists;
}

static int evict_rc(struct engine *eng, uint64_t user, uint32_t sel)
{
	struct errbuf e;
	int rc;

	e.msg[0] = '\0';
	rc = engine_evict(eng, user, sel, &e);
	if (rc < 0 && e.msg[0] == '\0')
		fail_msg("engine_evict(%" PRIu64 ", %u) = %d without a message",
			 user, sel, rc);
	CHECK(eng);
	return rc;
}

static int offload_rc(struct engine *eng, uint64_t user)
{
	struct errbuf e;
	int rc;

	e.msg[0] = '\0';
	rc = engine_offload(eng, user, &e);
	if (rc < 0 && e.msg[0] == '\0')
		fail_msg("engine_offload(%" PRIu64 ") = %d without a message", user, rc);
	CHECK(eng);
	return rc;
}

/* The device frames a lease lists hold the user's committed tokens. */
static void verify_lease_frames(struct engine *eng, const struct engine_lease *L,
				uint64_t user)
{
	const struct kvp_layout *l = engine_layout(eng);
	uint32_t n = (uint32_t)L->len;
	struct kvp_slot *s = calloc(n ? n : 1, sizeof(*s));
	uint8_t *got = malloc((size_t)(n ? n : 1) * l->token_bytes);
	uint8_t *want = malloc((size_t)(n ? n : 1) * l->token_bytes);

	assert_non_null(s);
	assert_non_null(got);
	assert_non_null(want);
	assert_true(L->npages >= (n + PT - 1) / PT);
	for (uint32_t i = 0; i < n; i++)
		s[i] = (struct kvp_slot){ .frame = L->frames[i / PT], .slot = i % PT };
	kvp_read_cpu(l, engine_tier(eng, KVP_TIER_DEVICE)->base, s, n, got);
	pattern(l, user, L->start, n, want);
	for (uint32_t i = 0; i < n; i++)
		if (memcmp(got + (size_t)i * l->token_bytes,
			   want + (size_t)i * l->token_bytes, l->token_bytes))
			fail_msg("user %" PRIu64 " token %" PRIu64 " in device frame %u "
				 "slot %u: bytes differ", user, L->start + i,
				 s[i].frame, s[i].slot);
	free(want);
	free(got);
	free(s);
}

/* --------------------------------------------------------------- tests */

static void test_lru_evicts_least_recently_used(void **state)
{
	struct engine *eng = mk_engine(4, 0, 0);

	(void)state;
	for (uint64_t u = 1; u <= 4; u++)
		put(eng, u, 0, 2); /* one half-full page each */
	assert_int_equal(dev_used(eng), 4);
	/* touch 1 then 2: LRU order is now 3, 4, 1, 2 */
	put(eng, 1, 2, 1);
	put(eng, 2, 2, 1);
	assert_int_equal(dev_used(eng), 4);

	put(eng, 5, 0, 1);
	assert_false(exists(eng, 3));
	assert_true(exists(eng, 1));
	assert_true(exists(eng, 2));
	assert_true(exists(eng, 4));
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.evicted_users, 1);
	assert_int_equal(s.evicted_pages, 1);
	assert_int_equal(s.demoted_users, 0);
	assert_int_equal(s.users, 4);

	put(eng, 6, 0, 1);
	assert_false(exists(eng, 4));
	put(eng, 7, 0, 1);
	assert_false(exists(eng, 1));
	assert_true(exists(eng, 2));
	assert_int_equal(stats_of(eng).evicted_users, 3);
	verify(eng, 2, 0, 3);
	verify(eng, 5, 0, 1);
	verify(eng, 6, 0, 1);
	verify(eng, 7, 0, 1);

	/* a dropped user starts over anywhere */
	struct engine_user_info i = info_of(eng, 3);
	assert_int_equal(i.len, 0);
	assert_int_equal(i.pages, 0);
	put(eng, 3, 500, 1);
	assert_int_equal(info_of(eng, 3).start, 500);
	drop_engine();
}

static void test_lru_takes_several_oldest_for_a_big_prepare(void **state)
{
	struct engine *eng = mk_engine(4, 0, 0);

	(void)state;
	for (uint64_t u = 1; u <= 4; u++)
		put(eng, u, 0, 4);
	put(eng, 9, 0, 8); /* two pages: users 1 and 2 go */
	assert_false(exists(eng, 1));
	assert_false(exists(eng, 2));
	assert_true(exists(eng, 3));
	assert_true(exists(eng, 4));
	assert_int_equal(stats_of(eng).evicted_users, 2);
	verify(eng, 3, 0, 4);
	verify(eng, 4, 0, 4);
	verify(eng, 9, 0, 8);
	/* the growing user itself is never its own victim */
	put(eng, 9, 8, 4); /* needs one more page: user 3 goes */
	assert_false(exists(eng, 3));
	assert_true(exists(eng, 4));
	verify(eng, 9, 0, 12);
	drop_engine();
}

static void test_pinned_user_is_never_evicted(void **state)
{
	struct engine *eng = mk_engine(4, 0, 0);
	struct errbuf e;

	(void)state;
	for (uint64_t u = 1; u <= 4; u++)
		put(eng, u, 0, 4);
	struct engine_lease R1 = prep_ok(eng, 1, 4, 0, OWNER); /* oldest, pinned */
	put(eng, 5, 0, 1);
	assert_true(exists(eng, 1));
	assert_false(exists(eng, 2));
	verify(eng, 1, 0, 4);

	struct engine_lease R3 = prep_ok(eng, 3, 4, 0, OWNER);
	struct engine_lease R4 = prep_ok(eng, 4, 4, 0, OWNER);
	struct engine_lease R5 = prep_ok(eng, 5, 1, 0, OWNER);
	/* only pinned users remain */
	struct kvp_stats sb = stats_of(eng);
	struct engine_user_info ib[6];
	for (uint64_t u = 1; u <= 5; u++)
		ib[u] = info_of(eng, u);
	assert_int_equal(prep_err(eng, 6, 0, 1, &e), -ENOMEM);
	assert_true(e.msg[0] != '\0');
	/* a pinned user cannot grow either */
	assert_int_equal(prep_err(eng, 5, 1, 4, &e), -ENOMEM);
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	for (uint64_t u = 1; u <= 5; u++) {
		struct engine_user_info ia = info_of(eng, u);

		assert_info_same(&ib[u], &ia);
	}
	assert_false(exists(eng, 6));

	release_ok(eng, R3.id);
	put(eng, 6, 0, 1);
	assert_false(exists(eng, 3));
	assert_true(exists(eng, 1));
	assert_true(exists(eng, 4));
	assert_true(exists(eng, 5));
	release_ok(eng, R1.id);
	release_ok(eng, R4.id);
	release_ok(eng, R5.id);
	verify(eng, 1, 0, 4);
	verify(eng, 4, 0, 4);
	verify(eng, 5, 0, 1);
	verify(eng, 6, 0, 1);
	drop_engine();
}

static void test_demote_then_onload_returns_same_bytes(void **state)
{
	struct engine *eng = mk_engine(4, 16, 0);
	const uint64_t A = 1, B = 2, C = 3;
	const uint64_t pb = 1024;

	(void)state;
	assert_int_equal(engine_layout(eng)->page_bytes, pb);
	put(eng, A, 0, 8);  /* 2 pages */
	put(eng, B, 0, 8);  /* 2 pages: device full */
	put(eng, C, 0, 4);  /* A is the oldest: demoted */

	struct engine_user_info i = info_of(eng, A);
	assert_true(i.exists);
	assert_int_equal(i.start, 0);
	assert_int_equal(i.len, 8);
	assert_int_equal(i.pages, 2);
	assert_int_equal(i.pages_device, 0);
	assert_int_equal(i.pages_host, 2);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.demoted_users, 1);
	assert_int_equal(s.demoted_pages, 2);
	assert_int_equal(s.evicted_users, 0);
	assert_int_equal(s.bytes_d2h, 2 * pb);
	assert_int_equal(s.bytes_h2d, 0);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, 2);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 3);
	assert_int_equal(s.users, 3);
	/* readable from the host tier while there */
	verify(eng, A, 0, 8);

	/* prepare brings A back: 1 free frame + B (oldest) demoted */
	struct engine_lease L = prep_ok(eng, A, 8, 0, OWNER);
	assert_int_equal(L.onloaded_pages, 2);
	assert_int_equal(L.len, 8);
	assert_int_equal(L.hit_tokens, 8);
	assert_int_equal(L.npages, 2);
	verify_lease_frames(eng, &L, A);
	verify(eng, A, 0, 8);
	i = info_of(eng, A);
	assert_int_equal(i.pages_device, 2);
	assert_int_equal(i.leases, 1);
	s = stats_of(eng);
	assert_int_equal(s.onloaded_pages, 2);
	assert_int_equal(s.bytes_h2d, 2 * pb);
	assert_int_equal(s.demoted_users, 2);
	assert_int_equal(s.demoted_pages, 4);
	assert_int_equal(s.bytes_d2h, 4 * pb);
	assert_int_equal(info_of(eng, B).pages_device, 0);
	assert_int_equal(info_of(eng, B).pages_host, 2);
	release_ok(eng, L.id);

	/* keep writing to A; everyone's bytes intact */
	put(eng, A, 8, 3);
	verify(eng, A, 0, 11);
	verify(eng, B, 0, 8);
	verify(eng, C, 0, 4);

	/* a write prepare onloads too */
	struct engine_lease W = prep_ok(eng, B, 8, 1, OWNER);
	assert_int_equal(W.onloaded_pages, 2);
	assert_int_equal(W.npages, 3);
	verify_lease_frames(eng, &W, B);
	write_commit_release(eng, &W, B, 1);
	verify(eng, B, 0, 9);
	drop_engine();
}

static void test_onload_with_device_pinned_is_enomem(void **state)
{
	struct engine *eng = mk_engine(2, 8, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 4);
	put(eng, 2, 0, 4);
	put(eng, 3, 0, 4); /* 1 demoted */
	assert_int_equal(info_of(eng, 1).pages_host, 1);
	assert_int_equal(info_of(eng, 1).pages_device, 0);
	struct engine_lease R2 = prep_ok(eng, 2, 4, 0, OWNER);
	struct engine_lease R3 = prep_ok(eng, 3, 4, 0, OWNER);
	struct engine_snap before = snap_of(eng, 1);
	assert_int_equal(prep_err(eng, 1, 4, 0, &e), -ENOMEM);
	assert_true(e.msg[0] != '\0');
	assert_unchanged(eng, &before);
	verify(eng, 1, 0, 4);
	release_ok(eng, R2.id);
	struct engine_lease L = prep_ok(eng, 1, 4, 0, OWNER);
	assert_int_equal(L.onloaded_pages, 1);
	verify_lease_frames(eng, &L, 1);
	release_ok(eng, L.id);
	release_ok(eng, R3.id);
	drop_engine();
}

static void test_demote_without_host_room_drops(void **state)
{
	struct engine *eng = mk_engine(2, 0, 0);

	(void)state;
	/* no host tier at all */
	put(eng, 1, 0, 4);
	put(eng, 2, 0, 4);
	put(eng, 3, 0, 4);
	assert_false(exists(eng, 1));
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.evicted_users, 1);
	assert_int_equal(s.demoted_users, 0);
	assert_int_equal(s.bytes_d2h, 0);
	drop_engine();

	/* a host tier smaller than the victim: dropped, host untouched */
	eng = mk_engine(3, 1, 0);
	put(eng, 1, 0, 8); /* 2 pages, cannot fit 1 host frame */
	put(eng, 2, 0, 4);
	put(eng, 3, 0, 4); /* needs 1: victim 1 */
	assert_false(exists(eng, 1));
	s = stats_of(eng);
	assert_int_equal(s.evicted_users, 1);
	assert_int_equal(s.demoted_users, 0);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, 0);
	verify(eng, 2, 0, 4);
	verify(eng, 3, 0, 4);
	/* but a one-page victim fits */
	put(eng, 4, 0, 4); /* the free frame */
	assert_int_equal(stats_of(eng).evicted_users, 1);
	put(eng, 5, 0, 4); /* victim 2: demoted into the one host frame */
	assert_true(exists(eng, 2));
	assert_int_equal(info_of(eng, 2).pages_host, 1);
	assert_int_equal(stats_of(eng).demoted_users, 1);
	verify(eng, 2, 0, 4);
	drop_engine();
}

static void test_host_full_drops_oldest_demoted(void **state)
{
	struct engine *eng = mk_engine(2, 2, 0);

	(void)state;
	put(eng, 1, 0, 4);
	put(eng, 2, 0, 4);
	put(eng, 3, 0, 4); /* 1 -> host */
	put(eng, 4, 0, 4); /* 2 -> host: host full */
	assert_int_equal(host_used(eng), 2);
	assert_int_equal(info_of(eng, 1).pages_host, 1);
	assert_int_equal(info_of(eng, 2).pages_host, 1);
	put(eng, 5, 0, 4); /* 3 -> host, 1 (oldest demoted) dropped */
	assert_false(exists(eng, 1));
	assert_true(exists(eng, 2));
	assert_true(exists(eng, 3));
	assert_int_equal(info_of(eng, 3).pages_host, 1);
	assert_int_equal(info_of(eng, 3).pages_device, 0);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.demoted_users, 3);
	assert_int_equal(s.evicted_users, 1);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, 2);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 2);
	assert_int_equal(s.users, 4);
	verify(eng, 2, 0, 4);
	verify(eng, 3, 0, 4);
	verify(eng, 4, 0, 4);
	verify(eng, 5, 0, 4);

	/* next in line on the host is 2 */
	put(eng, 6, 0, 4); /* 4 -> host, 2 dropped */
	assert_false(exists(eng, 2));
	assert_true(exists(eng, 3));
	assert_int_equal(info_of(eng, 4).pages_host, 1);
	assert_int_equal(stats_of(eng).evicted_users, 2);
	verify(eng, 3, 0, 4);
	verify(eng, 4, 0, 4);
	drop_engine();
}

static void test_offload_keeps_both_copies_and_evict_by_tier(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	const uint64_t pb = 1024;
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 8);
	assert_int_equal(offload_rc(eng, 1), 2);
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.pages, 2);
	assert_int_equal(i.pages_device, 2);
	assert_int_equal(i.pages_host, 2);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.offloaded_pages, 2);
	assert_int_equal(s.bytes_d2h, 2 * pb);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 2);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, 2);
	assert_int_equal(s.demoted_users, 0);
	/* nothing new to copy */
	assert_int_equal(offload_rc(eng, 1), 0);
	assert_int_equal(stats_of(eng).bytes_d2h, 2 * pb);
	assert_int_equal(stats_of(eng).offloaded_pages, 2);
	verify(eng, 1, 0, 8);

	/* evict from device: host copy is already valid, no data moves */
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	i = info_of(eng, 1);
	assert_true(i.exists);
	assert_int_equal(i.len, 8);
	assert_int_equal(i.pages_device, 0);
	assert_int_equal(i.pages_host, 2);
	s = stats_of(eng);
	assert_int_equal(s.bytes_d2h, 2 * pb);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 0);
	assert_int_equal(s.demoted_users, 1);
	assert_int_equal(s.evicted_users, 0);
	verify(eng, 1, 0, 8);

	/* evict from host on a host-only user: dropped */
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_HOST), 2);
	assert_false(exists(eng, 1));
	s = stats_of(eng);
	assert_int_equal(s.evicted_users, 1);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, 0);
	assert_int_equal(s.users, 0);

	/* unknown user */
	e.msg[0] = '\0';
	assert_int_equal(engine_evict(eng, 1, KVP_SEL_ALL, &e), -ENOENT);
	assert_int_equal(engine_evict(eng, 77, KVP_SEL_DEVICE, &e), -ENOENT);
	assert_int_equal(engine_offload(eng, 77, &e), -ENOENT);
	CHECK(eng);

	/* evict host copy of a user on both tiers: device copy stays */
	put(eng, 2, 0, 5);
	assert_int_equal(offload_rc(eng, 2), 2);
	assert_int_equal(evict_rc(eng, 2, KVP_SEL_HOST), 2);
	i = info_of(eng, 2);
	assert_true(i.exists);
	assert_int_equal(i.pages_device, 2);
	assert_int_equal(i.pages_host, 0);
	verify(eng, 2, 0, 5);
	/* evict all tiers */
	assert_int_equal(evict_rc(eng, 2, KVP_SEL_ALL), 2);
	assert_false(exists(eng, 2));
	assert_int_equal(dev_used(eng), 0);
	assert_int_equal(host_used(eng), 0);

	/* a bad tier selection */
	put(eng, 3, 0, 1);
	assert_int_equal(engine_evict(eng, 3, 0, &e), -EINVAL);
	assert_int_equal(engine_evict(eng, 3, 1u << 5, &e), -EINVAL);
	CHECK(eng);
	assert_true(exists(eng, 3));
	drop_engine();
}

static void test_evict_device_demotes_with_copy(void **state)
{
	/* KVP_SEL_DEVICE without an earlier offload copies the pages over */
	struct engine *eng = mk_engine(8, 8, 0);

	(void)state;
	put(eng, 1, 0, 6);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.pages_device, 0);
	assert_int_equal(i.pages_host, 2);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.demoted_users, 1);
	assert_int_equal(s.demoted_pages, 2);
	assert_int_equal(s.bytes_d2h, 2048);
	verify(eng, 1, 0, 6);
	/* evicting the device tier of a host-only user frees nothing */
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 0);
	assert_true(exists(eng, 1));
	drop_engine();

	/* with no host tier, demoting drops */
	eng = mk_engine(8, 0, 0);
	put(eng, 1, 0, 6);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	assert_false(exists(eng, 1));
	assert_int_equal(stats_of(eng).evicted_users, 1);
	drop_engine();
}

static void test_evict_pinned_is_ebusy(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 6);
	struct engine_lease R = prep_ok(eng, 1, 6, 0, OWNER);
	struct engine_snap before = snap_of(eng, 1);
	e.msg[0] = '\0';
	assert_int_equal(engine_evict(eng, 1, KVP_SEL_DEVICE, &e), -EBUSY);
	assert_true(e.msg[0] != '\0');
	assert_int_equal(engine_evict(eng, 1, KVP_SEL_HOST, &e), -EBUSY);
	assert_int_equal(engine_evict(eng, 1, KVP_SEL_ALL, &e), -EBUSY);
	CHECK(eng);
	assert_unchanged(eng, &before);
	release_ok(eng, R.id);

	/* a new user with only an uncommitted reservation is pinned too */
	struct engine_lease W = prep_ok(eng, 2, 0, 3, OWNER);
	assert_int_equal(engine_evict(eng, 2, KVP_SEL_ALL, &e), -EBUSY);
	CHECK(eng);
	release_ok(eng, W.id);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_ALL), 2);
	drop_engine();
}

static void test_offload_without_host_room_is_enospc(void **state)
{
	struct engine *eng = mk_engine(8, 2, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 8);
	assert_int_equal(offload_rc(eng, 1), 2); /* host full */
	struct engine_lease R = prep_ok(eng, 1, 8, 0, OWNER);
	put(eng, 2, 0, 4);
	struct kvp_stats sb = stats_of(eng);
	struct engine_user_info ib1 = info_of(eng, 1), ib2 = info_of(eng, 2);
	e.msg[0] = '\0';
	assert_int_equal(engine_offload(eng, 2, &e), -ENOSPC);
	assert_true(e.msg[0] != '\0');
	CHECK(eng);
	struct kvp_stats sa = stats_of(eng);
	struct engine_user_info ia1 = info_of(eng, 1), ia2 = info_of(eng, 2);
	assert_stats_same(&sb, &sa);
	assert_info_same(&ib1, &ia1);
	assert_info_same(&ib2, &ia2);
	release_ok(eng, R.id);
	drop_engine();

	/* partial room is no room: all pages or none */
	eng = mk_engine(8, 3, 0);
	put(eng, 1, 0, 8);
	assert_int_equal(offload_rc(eng, 1), 2);
	R = prep_ok(eng, 1, 8, 0, OWNER);
	put(eng, 2, 0, 8);
	sb = stats_of(eng);
	assert_int_equal(engine_offload(eng, 2, &e), -ENOSPC);
	CHECK(eng);
	sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	assert_int_equal(info_of(eng, 2).pages_host, 0);
	release_ok(eng, R.id);
	drop_engine();

	/* no host tier at all */
	eng = mk_engine(8, 0, 0);
	put(eng, 1, 0, 1);
	sb = stats_of(eng);
	assert_int_equal(engine_offload(eng, 1, &e), -ENOSPC);
	CHECK(eng);
	sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	drop_engine();
}

static void test_offload_all_and_evict_all(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	struct errbuf e;
	uint32_t skipped = 99;

	(void)state;
	put(eng, 1, 0, 8); /* 2 pages */
	put(eng, 2, 0, 3); /* 1 */
	put(eng, 3, 0, 4); /* 1 */
	e.msg[0] = '\0';
	assert_int_equal(engine_offload_all(eng, &e), 4);
	CHECK(eng);
	for (uint64_t u = 1; u <= 3; u++) {
		struct engine_user_info i = info_of(eng, u);

		assert_int_equal(i.pages_host, i.pages);
		assert_int_equal(i.pages_device, i.pages);
	}
	assert_int_equal(stats_of(eng).offloaded_pages, 4);
	assert_int_equal(engine_offload_all(eng, &e), 0);
	CHECK(eng);

	struct engine_lease R = prep_ok(eng, 2, 3, 0, OWNER);
	assert_int_equal(engine_evict_all(eng, KVP_SEL_DEVICE, &skipped), 2);
	CHECK(eng);
	assert_int_equal(skipped, 1);
	assert_int_equal(dev_used(eng), 1);
	assert_int_equal(info_of(eng, 1).pages_device, 0);
	assert_int_equal(info_of(eng, 3).pages_device, 0);
	assert_int_equal(info_of(eng, 2).pages_device, 1);
	verify(eng, 1, 0, 8);
	verify(eng, 2, 0, 3);
	verify(eng, 3, 0, 4);

	skipped = 99;
	assert_int_equal(engine_evict_all(eng, KVP_SEL_ALL, &skipped), 2);
	CHECK(eng);
	assert_int_equal(skipped, 1);
	assert_false(exists(eng, 1));
	assert_false(exists(eng, 3));
	assert_true(exists(eng, 2));
	verify(eng, 2, 0, 3);
	release_ok(eng, R.id);
	skipped = 99;
	assert_int_equal(engine_evict_all(eng, KVP_SEL_ALL, &skipped), 1);
	CHECK(eng);
	assert_int_equal(skipped, 0);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.users, 0);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 0);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, 0);
	/* on an empty pool */
	assert_int_equal(engine_evict_all(eng, KVP_SEL_ALL, &skipped), 0);
	assert_int_equal(engine_offload_all(eng, &e), 0);
	CHECK(eng);
	drop_engine();
}

static void test_offload_all_stops_at_full_host(void **state)
{
	struct engine *eng = mk_engine(8, 2, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 8);
	put(eng, 2, 0, 8);
	e.msg[0] = '\0';
	assert_int_equal(engine_offload_all(eng, &e), -ENOSPC);
	assert_true(e.msg[0] != '\0');
	CHECK(eng);
	/* the first user fit whole, the second not at all; no partial copy */
	assert_int_equal(host_used(eng), 2);
	uint32_t full = 0;
	for (uint64_t u = 1; u <= 2; u++) {
		struct engine_user_info i = info_of(eng, u);

		assert_int_equal(i.pages_device, 2);
		assert_true(i.pages_host == 0 || i.pages_host == 2);
		full += i.pages_host == 2;
	}
	assert_int_equal(full, 1);
	assert_int_equal(stats_of(eng).offloaded_pages, 2);
	for (uint64_t u = 1; u <= 2; u++)
		if (info_of(eng, u).pages_host == 2) {
			assert_int_equal(evict_rc(eng, u, KVP_SEL_DEVICE), 2);
			verify(eng, u, 0, 8);
		}
	drop_engine();
}

/* Write into the partial last page after it was offloaded, then demote by
 * the given means and onload: the newest bytes must come back. */
static void stale_host_copy_case(int how)
{
	struct engine *eng = mk_engine(how == 1 ? 3 : 8, 8, 0);

	put(eng, 1, 0, 6); /* page 1 holds tokens 4, 5 */
	assert_int_equal(offload_rc(eng, 1), 2);
	put(eng, 1, 6, 1); /* token 6 lands in page 1 slot 2 */
	verify(eng, 1, 0, 7);
	if (how == 0) {
		/* operator demotes */
		assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	} else if (how == 1) {
		/* pressure demotes: 2 pages wanted, 1 free */
		put(eng, 2, 0, 8);
		assert_true(exists(eng, 1));
	} else {
		/* a second offload refreshes just the stale page */
		assert_int_equal(offload_rc(eng, 1), 1);
		assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	}
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.len, 7);
	assert_int_equal(i.pages_device, 0);
	assert_int_equal(i.pages_host, 2);
	verify(eng, 1, 0, 7); /* from the host tier */
	struct engine_lease L = prep_ok(eng, 1, 7, 0, OWNER);
	assert_int_equal(L.onloaded_pages, 2);
	verify_lease_frames(eng, &L, 1);
	release_ok(eng, L.id);
	verify(eng, 1, 0, 7);

	/* once more, now spilling into a new page after onload */
	put(eng, 1, 7, 3);
	if (how == 1)
		put(eng, 3, 0, 4); /* pressure: the only device user, 1, goes */
	assert_true(evict_rc(eng, 1, KVP_SEL_DEVICE) >= 0);
	i = info_of(eng, 1);
	assert_int_equal(i.len, 10);
	assert_int_equal(i.pages_device, 0);
	assert_int_equal(i.pages_host, 3);
	verify(eng, 1, 0, 10);
	L = prep_ok(eng, 1, 10, 0, OWNER);
	verify_lease_frames(eng, &L, 1);
	release_ok(eng, L.id);
	drop_engine();
}

static void test_host_copy_not_stale_after_write_evict(void **state)
{
	(void)state;
	stale_host_copy_case(0);
}

static void test_host_copy_not_stale_after_write_pressure(void **state)
{
	(void)state;
	stale_host_copy_case(1);
}

static void test_host_copy_not_stale_after_write_reoffload(void **state)
{
	(void)state;
	stale_host_copy_case(2);
}

static void test_rolled_back_write_keeps_host_copy_valid(void **state)
{
	/* garbage written into reserved slots of an offloaded page and then
	 * rolled back must not leak into the committed tokens */
	struct engine *eng = mk_engine(8, 8, 0);

	(void)state;
	put(eng, 1, 0, 5);
	assert_int_equal(offload_rc(eng, 1), 2);
	struct engine_lease W = prep_ok(eng, 1, 5, 3, OWNER);
	write_lease(eng, &W, 99, 0, 3);
	release_ok(eng, W.id);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	verify(eng, 1, 0, 5);
	put(eng, 1, 5, 3);
	verify(eng, 1, 0, 8);
	assert_true(evict_rc(eng, 1, KVP_SEL_DEVICE) >= 0);
	verify(eng, 1, 0, 8);
	drop_engine();
}

static void test_trim_frees_host_frames_too(void **state)
{
	/* an offloaded history trimmed at the head gives back both copies */
	struct engine *eng = mk_engine(8, 8, 8);

	(void)state;
	put(eng, 1, 0, 8);
	assert_int_equal(offload_rc(eng, 1), 2);
	put(eng, 1, 8, 2); /* 10 > 8: page 0 trimmed */
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.start, 4);
	assert_int_equal(i.len, 6);
	assert_int_equal(i.pages, 2);
	assert_true(i.pages_host <= 2);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 2);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_used, i.pages_host);
	assert_true(evict_rc(eng, 1, KVP_SEL_DEVICE) >= 0);
	verify(eng, 1, 4, 6);
	drop_engine();
}

static void test_demoted_user_continues_from_its_end(void **state)
{
	/* continuity holds across demotion: gap/overlap still reported */
	struct engine *eng = mk_engine(2, 8, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 100, 6);
	put(eng, 2, 0, 4);
	assert_int_equal(info_of(eng, 1).pages_device, 0);
	struct kvp_stats sb = stats_of(eng);
	assert_int_equal(prep_err(eng, 1, 110, 1, &e), -EINVAL);
	assert_msg_has(&e, "missing tokens from 106 to 109 (both inclusive)");
	assert_int_equal(prep_err(eng, 1, 100, 20, &e), -EINVAL);
	assert_msg_has(&e, "overlapping tokens from 100 to 105 (both inclusive)");
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	assert_int_equal(info_of(eng, 1).pages_device, 0);
	put(eng, 1, 106, 2);
	verify(eng, 1, 100, 8);
	drop_engine();
}

/* Offload while a write is pending copies only pages the writer cannot
 * touch; what it skipped is copied when the user is demoted later. */
static void test_offload_during_pending_write_skips_open_page(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);

	(void)state;
	put(eng, 1, 0, 6); /* page 1 half full */
	struct engine_lease W = prep_ok(eng, 1, 6, 4, OWNER); /* pages 1, 2 open */
	assert_int_equal(offload_rc(eng, 1), 1); /* page 0 only */
	assert_int_equal(info_of(eng, 1).pages_host, 1);
	write_commit_release(eng, &W, 1, 4);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 3);
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.len, 10);
	assert_int_equal(i.pages_host, 3);
	assert_int_equal(i.pages_device, 0);
	verify(eng, 1, 0, 10);
	struct engine_lease L = prep_ok(eng, 1, 10, 0, OWNER);
	verify_lease_frames(eng, &L, 1);
	release_ok(eng, L.id);
	drop_engine();

	/* pending write on a page boundary: every committed page is closed */
	eng = mk_engine(8, 8, 0);
	put(eng, 1, 0, 8);
	W = prep_ok(eng, 1, 8, 2, OWNER);
	assert_int_equal(offload_rc(eng, 1), 2);
	write_commit_release(eng, &W, 1, 2);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 3);
	verify(eng, 1, 0, 10);
	drop_engine();
}

/* Offload between commit and release copies the freshly committed page. */
static void test_offload_after_commit_before_release(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);

	(void)state;
	put(eng, 1, 0, 6);
	struct engine_lease W = prep_ok(eng, 1, 6, 1, OWNER);
	write_lease(eng, &W, 1, 0, 1);
	commit_ok(eng, W.id, 1);
	assert_int_equal(offload_rc(eng, 1), 2);
	release_ok(eng, W.id);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	assert_int_equal(stats_of(eng).bytes_d2h, 2 * 1024);
	verify(eng, 1, 0, 7);
	drop_engine();
}

/* A host-only user with a half-full last page takes a write directly:
 * onload, write into that page, demote again, bytes are the newest. */
static void test_write_into_onloaded_partial_page(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);

	(void)state;
	put(eng, 1, 0, 5);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	assert_int_equal(info_of(eng, 1).pages_device, 0);
	struct engine_lease W = prep_ok(eng, 1, 5, 2, OWNER);
	assert_int_equal(W.onloaded_pages, 2);
	assert_int_equal(W.npages, 2);
	assert_int_equal(W.last_page_len, 3);
	verify_lease_frames(eng, &W, 1);
	write_commit_release(eng, &W, 1, 2);
	verify(eng, 1, 0, 7);
	assert_int_equal(evict_rc(eng, 1, KVP_SEL_DEVICE), 2);
	verify(eng, 1, 0, 7);
	struct engine_lease L = prep_ok(eng, 1, 7, 0, OWNER);
	verify_lease_frames(eng, &L, 1);
	release_ok(eng, L.id);
	drop_engine();
}

static void test_evict_all_host_tier_only(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	uint32_t skipped = 99;

	(void)state;
	put(eng, 1, 0, 4); /* will be on both tiers */
	put(eng, 2, 0, 4); /* will be host-only */
	put(eng, 3, 0, 4); /* device only */
	assert_int_equal(offload_rc(eng, 1), 1);
	assert_int_equal(evict_rc(eng, 2, KVP_SEL_DEVICE), 1);
	assert_int_equal(engine_evict_all(eng, KVP_SEL_HOST, &skipped), 2);
	CHECK(eng);
	assert_int_equal(skipped, 0);
	struct engine_user_info i = info_of(eng, 1);
	assert_true(i.exists);
	assert_int_equal(i.pages_device, 1);
	assert_int_equal(i.pages_host, 0);
	assert_false(exists(eng, 2));
	i = info_of(eng, 3);
	assert_int_equal(i.pages_device, 1);
	assert_int_equal(host_used(eng), 0);
	verify(eng, 1, 0, 4);
	verify(eng, 3, 0, 4);
	drop_engine();
}

/*
 * Frames freed by a demotion come back first page first: the next history
 * gets them ascending and contiguous, so its copies coalesce into one run.
 */
static void test_demoted_frames_come_back_ascending_and_contiguous(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	struct engine_lease L;
	uint32_t first;

	(void)state;
	put(eng, 1, 0, 4 * PT);
	put(eng, 2, 0, 4 * PT); /* the device tier is full */
	assert_true(engine_evict(eng, 1, KVP_SEL_DEVICE, NULL) == 4);
	CHECK(eng);
	L = prep_ok(eng, 3, 0, 4 * PT, OWNER);
	assert_int_equal(L.npages, 4);
	first = L.frames[0];
	for (uint32_t i = 1; i < L.npages; i++)
		assert_int_equal(L.frames[i], first + i);
	release_ok(eng, L.id);
	CHECK(eng);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_lru_evicts_least_recently_used, teardown),
		cmocka_unit_test_teardown(test_lru_takes_several_oldest_for_a_big_prepare, teardown),
		cmocka_unit_test_teardown(test_pinned_user_is_never_evicted, teardown),
		cmocka_unit_test_teardown(test_demote_then_onload_returns_same_bytes, teardown),
		cmocka_unit_test_teardown(test_onload_with_device_pinned_is_enomem, teardown),
		cmocka_unit_test_teardown(test_demote_without_host_room_drops, teardown),
		cmocka_unit_test_teardown(test_host_full_drops_oldest_demoted, teardown),
		cmocka_unit_test_teardown(test_offload_keeps_both_copies_and_evict_by_tier, teardown),
		cmocka_unit_test_teardown(test_evict_device_demotes_with_copy, teardown),
		cmocka_unit_test_teardown(test_evict_pinned_is_ebusy, teardown),
		cmocka_unit_test_teardown(test_offload_without_host_room_is_enospc, teardown),
		cmocka_unit_test_teardown(test_offload_all_and_evict_all, teardown),
		cmocka_unit_test_teardown(test_offload_all_stops_at_full_host, teardown),
		cmocka_unit_test_teardown(test_host_copy_not_stale_after_write_evict, teardown),
		cmocka_unit_test_teardown(test_host_copy_not_stale_after_write_pressure, teardown),
		cmocka_unit_test_teardown(test_host_copy_not_stale_after_write_reoffload, teardown),
		cmocka_unit_test_teardown(test_rolled_back_write_keeps_host_copy_valid, teardown),
		cmocka_unit_test_teardown(test_trim_frees_host_frames_too, teardown),
		cmocka_unit_test_teardown(test_demoted_user_continues_from_its_end, teardown),
		cmocka_unit_test_teardown(test_offload_during_pending_write_skips_open_page, teardown),
		cmocka_unit_test_teardown(test_offload_after_commit_before_release, teardown),
		cmocka_unit_test_teardown(test_write_into_onloaded_partial_page, teardown),
		cmocka_unit_test_teardown(test_evict_all_host_tier_only, teardown),
		cmocka_unit_test_teardown(test_demoted_frames_come_back_ascending_and_contiguous,
					  teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
