/* SPDX-License-Identifier: MIT */
/*
 * test_engine_async.c - onload is asynchronous (engine.h): on a backend
 * whose host -> device copies land only when the test says so
 * (fake_async_backend), a prepare that onloads returns at once with a fence
 * and the bytes are not on the device until it lands; every prepare of that
 * user meanwhile gets the same fence; other users' prepares, demotions and
 * evictions go on without waiting and never touch a frame the copy uses;
 * whatever would free or read such a frame (the release that unpins the
 * user, release_owner of a dead client, a commit that drops a host copy,
 * offload, read_tokens, destroy) waits for the fence first. The fake counts
 * those waits and every access that clashes with a queued copy; engine_check
 * passes after every step.
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
#include "fake_async_backend.h"
#include "kvpool.h"

static struct fake_async F;

/* A lease's page table is valid until the next engine call: kept here. */
#define KEEP_MAX 16
static uint32_t kept[KEEP_MAX][64];
static uint32_t nkept;

static struct engine *mk(uint32_t dev, uint32_t host)
{
	fake_fini(&F);
	memset(&F, 0, sizeof(F));
	nkept = 0;
	return mk_engine_on(dev, host, 0, &fake_async_backend, &F);
}

/* prep_ok, with the page table copied out. */
static struct engine_lease prep_keep(struct engine *eng, uint64_t user,
				     uint64_t pos, uint32_t n, uint32_t owner)
{
	struct engine_lease L = prep_ok(eng, user, pos, n, owner);

	assert_true(nkept < KEEP_MAX && L.npages <= 64);
	memcpy(kept[nkept], L.frames, L.npages * sizeof(*L.frames));
	L.frames = kept[nkept++];
	return L;
}

static int teardown_async(void **state)
{
	(void)state;
	drop_engine();
	fake_fini(&F);
	return 0;
}

/* No access clashed with a queued copy. */
static void assert_no_conflict(void)
{
	if (F.conflicts)
		fail_msg("%u access(es) clashed with an onload in flight; the "
			 "first: %s", F.conflicts, F.conflict);
}

static void demote(struct engine *eng, uint64_t user)
{
	struct errbuf e = { .msg = "" };
	int rc = engine_evict(eng, user, KVP_SEL_DEVICE, &e);

	if (rc < 0)
		fail_msg("evict(user %" PRIu64 ", device) = %d: %s", user, rc, e.msg);
	assert_int_equal(info_of(eng, user).pages_device, 0);
	CHECK(eng);
}

/* Whether the lease's committed tokens hold the pattern in the device
 * tier, read through its page table as a client's kernel would. */
static bool lease_bytes_landed(struct engine *eng, const struct engine_lease *L,
			       uint64_t user)
{
	const struct kvp_layout *l = engine_layout(eng);
	uint32_t n = (uint32_t)L->len;
	struct kvp_slot *s = calloc(n ? n : 1, sizeof(*s));
	uint8_t *got = malloc((size_t)(n ? n : 1) * l->token_bytes);
	uint8_t *want = malloc((size_t)(n ? n : 1) * l->token_bytes);
	bool same;

	assert_non_null(s);
	assert_non_null(got);
	assert_non_null(want);
	for (uint32_t i = 0; i < n; i++)
		s[i] = (struct kvp_slot){ .frame = L->frames[i / PT], .slot = i % PT };
	kvp_read_cpu(l, engine_tier(eng, KVP_TIER_DEVICE)->base, s, n, got);
	pattern(l, user, L->start, n, want);
	same = !memcmp(got, want, (size_t)n * l->token_bytes);
	free(want);
	free(got);
	free(s);
	return same;
}

/* Every page of the lease is (or is not) the target of a queued copy. */
static void assert_frames_busy(struct engine *eng, const struct engine_lease *L,
			       uint32_t pages, bool busy)
{
	const struct tier_mem *d = engine_tier(eng, KVP_TIER_DEVICE);
	uint64_t pb = engine_layout(eng)->page_bytes;

	for (uint32_t i = 0; i < pages; i++)
		if (fake_busy(&F, d, (uint64_t)L->frames[i] * pb, pb) != busy)
			fail_msg("device frame %u (page %u) is %sunder a queued copy",
				 L->frames[i], i, busy ? "not " : "");
}

/* A history of n tokens of user, demoted to the host tier. */
static void host_only_user(struct engine *eng, uint64_t user, uint32_t n)
{
	put(eng, user, 0, n);
	demote(eng, user);
}

/* ------------------------------------------------------------- tests */

static void test_onload_lands_only_when_its_fence_lands(void **state)
{
	struct engine *eng = mk(8, 8);
	const struct tier_mem *d = engine_tier(eng, KVP_TIER_DEVICE);

	(void)state;
	host_only_user(eng, 1, 10); /* 3 pages, the last half full */
	memset(d->base, 0, d->bytes); /* what an early reader would see */

	struct engine_lease L = prep_ok(eng, 1, 10, 0, OWNER);
	assert_int_equal(L.onloaded_pages, 3);
	assert_int_equal(L.npages, 3);
	assert_true(L.fence != 0);
	assert_int_equal(engine_fence_done(eng, L.fence), 0);
	assert_int_equal(F.async_calls, 1);
	assert_frames_busy(eng, &L, 3, true);
	assert_false(lease_bytes_landed(eng, &L, 1)); /* still the zeros */
	assert_int_equal(info_of(eng, 1).pages_device, 3);
	CHECK(eng);

	fake_land(&F, L.fence);
	assert_int_equal(engine_fence_done(eng, L.fence), 1);
	assert_true(lease_bytes_landed(eng, &L, 1));
	release_ok(eng, L.id);
	assert_int_equal(F.waits, 0); /* landed before the release */
	verify(eng, 1, 0, 10);
	assert_int_equal(engine_fence_done(eng, 0), 1);
	assert_no_conflict();
}

static void test_prepares_during_the_onload_share_its_fence(void **state)
{
	struct engine *eng = mk(8, 8);

	(void)state;
	host_only_user(eng, 1, 10);
	host_only_user(eng, 2, 4);
	struct engine_lease R1 = prep_keep(eng, 1, 10, 0, 1);
	struct engine_lease R2 = prep_ok(eng, 1, 10, 0, 2);
	struct engine_lease W = prep_ok(eng, 1, 10, 3, 3);
	assert_true(R1.fence != 0);
	assert_int_equal(R2.fence, R1.fence); /* the same pages, the same copy */
	assert_int_equal(W.fence, R1.fence);  /* a writer too: its page 2 lands */
	assert_int_equal(R2.onloaded_pages, 0);
	assert_int_equal(W.onloaded_pages, 0);
	assert_int_equal(info_of(eng, 1).leases, 3);

	/* Another user's onload gets a later fence; landing it lands both. */
	struct engine_lease O = prep_keep(eng, 2, 4, 0, 1);
	assert_true(O.fence > R1.fence);
	fake_land(&F, O.fence);
	assert_int_equal(engine_fence_done(eng, R1.fence), 1);
	assert_int_equal(engine_fence_done(eng, O.fence), 1);
	assert_true(lease_bytes_landed(eng, &R1, 1));
	assert_true(lease_bytes_landed(eng, &O, 2));

	/* Once landed, a prepare is ready at once. */
	struct engine_lease R3 = prep_ok(eng, 1, 10, 0, 4);
	assert_int_equal(R3.fence, 0);
	write_lease(eng, &W, 1, 0, 3);
	commit_ok(eng, W.id, 3);
	release_ok(eng, W.id);
	release_ok(eng, R1.id);
	release_ok(eng, R2.id);
	release_ok(eng, R3.id);
	release_ok(eng, O.id);
	assert_int_equal(F.waits, 0);
	verify(eng, 1, 0, 13);
	verify(eng, 2, 0, 4);
	assert_no_conflict();
}

static void test_release_before_landing_waits_for_the_copy(void **state)
{
	struct engine *eng = mk(8, 8);

	(void)state;
	host_only_user(eng, 1, 10);
	struct engine_lease A = prep_ok(eng, 1, 10, 0, 1);
	struct engine_lease B = prep_ok(eng, 1, 10, 0, 2);
	assert_true(A.fence != 0);
	release_ok(eng, A.id); /* still pinned by B: nothing to wait for */
	assert_int_equal(F.waits, 0);
	assert_int_equal(engine_fence_done(eng, A.fence), 0);
	release_ok(eng, B.id); /* unpins: the copy must be over first */
	assert_int_equal(F.waits, 1);
	assert_int_equal(F.nq, 0);
	assert_int_equal(info_of(eng, 1).leases, 0);
	verify(eng, 1, 0, 10);
	/* Unpinned, it can be demoted again and comes back intact. */
	demote(eng, 1);
	struct engine_lease C = prep_ok(eng, 1, 10, 0, 1);
	assert_true(C.fence > A.fence);
	fake_land_all(&F);
	assert_true(lease_bytes_landed(eng, &C, 1));
	release_ok(eng, C.id);
	assert_int_equal(F.waits, 1);
	assert_no_conflict();
}

static void test_release_owner_of_a_dead_client_waits(void **state)
{
	struct engine *eng = mk(8, 8);

	(void)state;
	host_only_user(eng, 1, 10);
	host_only_user(eng, 2, 8);
	struct engine_lease A = prep_ok(eng, 1, 10, 0, 7);
	struct engine_lease B = prep_ok(eng, 1, 10, 2, 7); /* uncommitted write */
	struct engine_lease C = prep_keep(eng, 2, 8, 0, 8); /* another client */
	assert_true(A.fence && C.fence > A.fence);
	assert_int_equal(B.fence, A.fence);
	assert_int_equal(engine_release_owner(eng, 7), 2);
	CHECK(eng);
	/* Waited for user 1's copy only: user 2's, issued later, may still
	 * be on its way (fences land in order, so not the other way round). */
	assert_int_equal(F.waits, 1);
	assert_int_equal(engine_fence_done(eng, A.fence), 1);
	assert_int_equal(engine_fence_done(eng, C.fence), 0);
	assert_int_equal(info_of(eng, 1).leases, 0);
	assert_int_equal(info_of(eng, 1).len, 10); /* the write rolled back */
	verify(eng, 1, 0, 10);
	fake_land(&F, C.fence);
	assert_true(lease_bytes_landed(eng, &C, 2));
	release_ok(eng, C.id);
	assert_no_conflict();
}

/* The point of it all: while user 1's copy is in flight, other users'
 * prepares (with evictions), commits, offloads and evictions go on without
 * waiting, and none of them is handed a frame the copy uses. */
static void test_other_users_proceed_while_an_onload_is_in_flight(void **state)
{
	struct engine *eng = mk(6, 8);
	struct errbuf e = { .msg = "" };

	(void)state;
	host_only_user(eng, 1, 8); /* 2 pages, host only */
	put(eng, 2, 0, 8);         /* 2 device pages: the LRU's oldest */
	put(eng, 3, 0, 8);         /* 2 device pages */
	struct engine_lease L = prep_keep(eng, 1, 8, 0, 1); /* the 2 free frames */
	assert_true(L.fence != 0);
	assert_int_equal(dev_used(eng), 6);

	/* A new user needs 2 pages: user 2 is demoted to make room. */
	struct engine_lease N = prep_ok(eng, 4, 0, 8, 2);
	assert_int_equal(N.fence, 0);
	assert_int_equal(info_of(eng, 2).pages_device, 0);
	assert_frames_busy(eng, &N, 2, false);
	write_commit_release(eng, &N, 4, 8);
	/* More traffic: offload, evict, info, a read of another user. */
	assert_int_equal(engine_offload(eng, 3, &e), 2);
	demote(eng, 3);
	verify(eng, 4, 0, 8);
	verify(eng, 2, 0, 8);
	put(eng, 5, 0, 3);
	/* User 1 itself cannot be evicted while its lease holds it. */
	assert_int_equal(engine_evict(eng, 1, KVP_SEL_ALL, &e), -EBUSY);
	assert_int_equal(F.waits, 0); /* nobody waited for the copy */
	assert_int_equal(engine_fence_done(eng, L.fence), 0);
	assert_no_conflict();

	fake_land(&F, L.fence);
	assert_true(lease_bytes_landed(eng, &L, 1));
	release_ok(eng, L.id);
	assert_int_equal(F.waits, 0);
	for (uint64_t u = 1; u <= 4; u++)
		verify(eng, u, 0, 8);
	assert_no_conflict();
}

/*
 * A writer appending to a host-only user's half-full last page: its onload
 * reads the host copy of that page, so the copy stays until tokens are
 * committed into the page. Freed at prepare, demotion pressure would reuse
 * that host frame while the onload still reads it.
 */
static void test_partial_page_host_copy_stays_until_commit(void **state)
{
	struct engine *eng = mk(4, 3);

	(void)state;
	host_only_user(eng, 1, 5); /* 2 host pages, the last with 1 token */
	put(eng, 2, 0, 4);         /* 1 device page */
	struct engine_lease W = prep_ok(eng, 1, 5, 2, 1);
	assert_true(W.fence != 0);
	assert_int_equal(W.npages, 2);
	assert_int_equal(info_of(eng, 1).pages_host, 2); /* kept for the copy */

	/* 2 pages for user 3 with 1 free: user 2 is demoted into the one
	 * free host frame, nowhere near the onload's sources. */
	put(eng, 3, 0, 8);
	assert_int_equal(info_of(eng, 2).pages_host, 1);
	assert_int_equal(F.waits, 0);
	assert_no_conflict();

	fake_land(&F, W.fence);
	write_lease(eng, &W, 1, 0, 2);
	commit_ok(eng, W.id, 2);
	/* Committed into the page: its host copy was stale and is gone. */
	assert_int_equal(info_of(eng, 1).pages_host, 1);
	release_ok(eng, W.id);
	verify(eng, 1, 0, 7);
	/* Demote and onload again: the newest bytes come back. */
	demote(eng, 1);
	struct engine_lease R = prep_ok(eng, 1, 7, 0, 1);
	fake_land_all(&F);
	R.len = 7;
	assert_true(lease_bytes_landed(eng, &R, 1));
	release_ok(eng, R.id);
	assert_int_equal(F.waits, 0);
	assert_no_conflict();
}

/* A rolled-back write keeps the host copy of the half-full page: the
 * committed tokens in it did not change. */
static void test_rolled_back_write_keeps_the_host_copy(void **state)
{
	struct engine *eng = mk(4, 4);

	(void)state;
	put(eng, 1, 0, 5);
	struct errbuf e = { .msg = "" };
	assert_int_equal(engine_offload(eng, 1, &e), 2);
	struct engine_lease W = prep_ok(eng, 1, 5, 2, 1);
	assert_int_equal(W.fence, 0); /* nothing to onload */
	write_lease(eng, &W, 1, 0, 2);
	release_ok(eng, W.id); /* no commit: rolled back */
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.len, 5);
	assert_int_equal(i.pages_host, 2);
	demote(eng, 1);
	verify(eng, 1, 0, 5);
	assert_int_equal(F.waits, 0);
	assert_no_conflict();
}

/* A client that commits before its completion arrived (it guessed the
 * lease id): dropping the stale host copy waits for the copy reading it. */
static void test_commit_before_landing_waits(void **state)
{
	struct engine *eng = mk(4, 4);

	(void)state;
	host_only_user(eng, 1, 5);
	struct engine_lease W = prep_ok(eng, 1, 5, 2, 1);
	assert_true(W.fence != 0);
	commit_ok(eng, W.id, 0); /* frees nothing: no wait */
	assert_int_equal(F.waits, 0);
	release_ok(eng, W.id);   /* unpins: waits */
	assert_int_equal(F.waits, 1);

	demote(eng, 1);
	W = prep_ok(eng, 1, 5, 2, 1);
	assert_true(W.fence != 0);
	commit_ok(eng, W.id, 2); /* the half-full page's host copy goes */
	assert_int_equal(F.waits, 2);
	release_ok(eng, W.id);
	verify(eng, 1, 0, 5);
	assert_no_conflict();
}

static void test_offload_and_read_of_a_user_in_flight_wait(void **state)
{
	struct engine *eng = mk(8, 8);
	struct errbuf e = { .msg = "" };

	(void)state;
	host_only_user(eng, 1, 8);
	struct engine_lease L = prep_ok(eng, 1, 8, 0, 1);
	assert_true(L.fence != 0);
	/* Every onloaded page has its host copy: nothing to copy, no wait. */
	assert_int_equal(engine_offload(eng, 1, &e), 0);
	assert_int_equal(engine_offload_all(eng, &e), 0);
	assert_int_equal(F.waits, 0);
	verify(eng, 1, 0, 8); /* engine_read_tokens reads the device frames */
	assert_int_equal(F.waits, 1);
	release_ok(eng, L.id);
	assert_int_equal(F.waits, 1);

	/* A page with no host copy next to pages in flight: copying it out
	 * waits for the onload first. */
	demote(eng, 1);
	struct engine_lease W = prep_ok(eng, 1, 8, 4, 1);
	assert_true(W.fence != 0);
	commit_ok(eng, W.id, 4); /* (without waiting: frees nothing) */
	assert_int_equal(F.waits, 1);
	assert_int_equal(engine_offload(eng, 1, &e), 1);
	assert_int_equal(F.waits, 2);
	release_ok(eng, W.id);
	verify(eng, 1, 0, 8);
	assert_no_conflict();
}

static void test_destroy_waits_for_copies_in_flight(void **state)
{
	struct engine *eng = mk(8, 8);

	(void)state;
	host_only_user(eng, 1, 8);
	host_only_user(eng, 2, 8);
	struct engine_lease A = prep_ok(eng, 1, 8, 0, 1);
	struct engine_lease B = prep_ok(eng, 2, 8, 0, 1);
	assert_true(A.fence && B.fence);
	drop_engine(); /* leases held, copies in flight */
	assert_int_equal(F.nq, 0);
	assert_true(F.waits >= 1);
	assert_no_conflict();
}

/* On the shm backend a copy lands before prepare returns: fence 0. */
static void test_shm_onload_is_ready_at_once(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	struct kvp_stats s;

	(void)state;
	put(eng, 1, 0, 10);
	demote(eng, 1);
	struct engine_lease L = prep_ok(eng, 1, 10, 0, OWNER);
	assert_int_equal(L.onloaded_pages, 3);
	assert_int_equal(L.fence, 0);
	assert_int_equal(engine_fence_done(eng, L.fence), 1);
	assert_true(lease_bytes_landed(eng, &L, 1));
	/* A copy that landed before copy_async returned: its wall time. */
	engine_stats(eng, &s);
	assert_int_equal(s.bytes_h2d, 3 * engine_layout(eng)->page_bytes);
	assert_true(s.ns_h2d > 0);
	release_ok(eng, L.id);
}

/*
 * ns_h2d of an asynchronous onload is the backend's device time of its
 * fence (fence_ns), counted once, when the engine first sees it landed:
 * at a later prepare's poll or at the wait of a release before landing.
 */
static void test_onload_time_counted_once_when_it_lands(void **state)
{
	struct engine *eng = mk(8, 8);
	struct kvp_stats s;

	(void)state;
	host_only_user(eng, 1, 10);
	host_only_user(eng, 2, 4);
	struct engine_lease L = prep_keep(eng, 1, 10, 0, 1);
	struct engine_lease R = prep_keep(eng, 1, 10, 0, 2); /* in flight still */
	engine_stats(eng, &s);
	assert_int_equal(s.bytes_h2d, 3 * engine_layout(eng)->page_bytes);
	assert_int_equal(s.ns_h2d, 0);

	fake_land(&F, L.fence);
	struct engine_lease R2 = prep_ok(eng, 1, 10, 0, 3); /* sees it landed */
	engine_stats(eng, &s);
	assert_int_equal(s.ns_h2d, FAKE_FENCE_NS);
	release_ok(eng, R2.id);
	release_ok(eng, R.id);
	release_ok(eng, L.id);
	engine_stats(eng, &s);
	assert_int_equal(s.ns_h2d, FAKE_FENCE_NS);
	assert_int_equal(F.ns_fences, 1);

	/* User 2's fence lands at its release's wait. */
	struct engine_lease O = prep_keep(eng, 2, 4, 0, 1);
	assert_true(O.fence > L.fence);
	release_ok(eng, O.id);
	assert_int_equal(F.waits, 1);
	engine_stats(eng, &s);
	assert_int_equal(s.ns_h2d, 2 * FAKE_FENCE_NS);
	assert_int_equal(F.ns_fences, 2);
	assert_no_conflict();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_onload_lands_only_when_its_fence_lands,
					  teardown_async),
		cmocka_unit_test_teardown(test_prepares_during_the_onload_share_its_fence,
					  teardown_async),
		cmocka_unit_test_teardown(test_release_before_landing_waits_for_the_copy,
					  teardown_async),
		cmocka_unit_test_teardown(test_release_owner_of_a_dead_client_waits,
					  teardown_async),
		cmocka_unit_test_teardown(test_other_users_proceed_while_an_onload_is_in_flight,
					  teardown_async),
		cmocka_unit_test_teardown(test_partial_page_host_copy_stays_until_commit,
					  teardown_async),
		cmocka_unit_test_teardown(test_rolled_back_write_keeps_the_host_copy,
					  teardown_async),
		cmocka_unit_test_teardown(test_commit_before_landing_waits,
					  teardown_async),
		cmocka_unit_test_teardown(test_offload_and_read_of_a_user_in_flight_wait,
					  teardown_async),
		cmocka_unit_test_teardown(test_destroy_waits_for_copies_in_flight,
					  teardown_async),
		cmocka_unit_test_teardown(test_shm_onload_is_ready_at_once,
					  teardown_async),
		cmocka_unit_test_teardown(test_onload_time_counted_once_when_it_lands,
					  teardown_async),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
