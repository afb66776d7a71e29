/* SPDX-License-Identifier: MIT */
/*
 * test_lease_one_table - the engine's one lease table (daemon/engine/
 * lease.c): a history's lease, a sequence's write lease and a chunk's
 * fill lease come from one slot space (no two live leases share a slot),
 * sharing's ids carry bit 31 and histories' do not, and the one stale-id
 * check refuses an id with that bit flipped, a released id and a slot's
 * old generation alike; kvp_stats.leases counts every kind; a dead
 * client's leases of every kind go through the one release path.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine_helpers.h"
#include "engine_share.h" /* SHARE_LEASE_BIT */
#include "errbuf.h"
#include "share.h"

#define SLOT(id) ((id) & 0xffffffu)

static uint32_t toks[3 * PT];

static uint64_t seq_lease(struct engine *eng, uint64_t seq, uint32_t owner)
{
	struct engine_lease L;
	struct errbuf e = { 0 };

	for (uint32_t i = 0; i < 3 * PT; i++)
		toks[i] = 100 + i;
	assert_int_equal(share_seq_alloc(eng, seq, toks, 2 * PT, owner, &L, &e), 0);
	return L.id;
}

static uint64_t chunk_fill_lease(struct engine *eng, uint32_t first,
				 uint32_t owner)
{
	struct share_chunk_reg reg;
	struct errbuf e = { 0 };
	uint32_t t[PT];

	for (uint32_t i = 0; i < PT; i++)
		t[i] = first + i;
	assert_int_equal(share_chunk_register(eng, t, PT, KVP_CHUNK_CONTEXT, NULL,
					      owner, 1, &reg, &e), 0);
	assert_true(reg.created);
	return reg.lease.id;
}

static void test_every_kind_shares_one_slot_space(void **state)
{
	struct engine *eng = mk_engine(64, 64, 0);
	uint64_t h, q, c;

	(void)state;
	h = prep_ok(eng, 7, 0, PT, OWNER).id;
	q = seq_lease(eng, 1, OWNER);
	c = chunk_fill_lease(eng, 5000, OWNER);
	assert_false(h & SHARE_LEASE_BIT);
	assert_true(q & SHARE_LEASE_BIT);
	assert_true(c & SHARE_LEASE_BIT);
	assert_int_not_equal(SLOT(h), SLOT(q));
	assert_int_not_equal(SLOT(h), SLOT(c));
	assert_int_not_equal(SLOT(q), SLOT(c));
	assert_int_equal(stats_of(eng).leases, 3);
	assert_int_equal(engine_lease_owner(eng, q), OWNER);
	CHECK(eng);
	release_ok(eng, h);
	release_ok(eng, q);
	release_ok(eng, c);
	assert_int_equal(stats_of(eng).leases, 0);
	CHECK(eng);
}

static void test_one_stale_check_for_every_kind(void **state)
{
	struct engine *eng = mk_engine(64, 64, 0);
	struct errbuf e = { 0 };
	uint64_t h, q, h2;

	(void)state;
	h = prep_ok(eng, 7, 0, PT, OWNER).id;
	q = seq_lease(eng, 1, OWNER);
	/* the kind bit flipped: the slot is live, the id names nothing */
	assert_int_equal(engine_commit(eng, h | SHARE_LEASE_BIT, PT, &e), -ENOENT);
	assert_int_equal(engine_commit(eng, q & ~SHARE_LEASE_BIT, PT, &e), -ENOENT);
	assert_int_equal(engine_lease_owner(eng, h | SHARE_LEASE_BIT), -ENOENT);
	/* released: stale, whatever its kind */
	release_ok(eng, h);
	release_ok(eng, q);
	assert_int_equal(engine_release(eng, h, &e), -ENOENT);
	assert_msg_has(&e, "is not held");
	assert_int_equal(engine_release(eng, q, &e), -ENOENT);
	/* the slot comes back with a new generation: the old id still misses */
	h2 = prep_ok(eng, 8, 0, PT, OWNER).id;
	assert_true(SLOT(h2) == SLOT(h) || SLOT(h2) == SLOT(q));
	assert_int_not_equal(h2, h);
	assert_int_equal(engine_commit(eng, h, PT, &e), -ENOENT);
	assert_int_equal(engine_commit(eng, q, PT, &e), -ENOENT);
	assert_int_equal(stats_of(eng).leases, 1);
	release_ok(eng, h2);
	CHECK(eng);
}

static void test_dead_client_releases_every_kind(void **state)
{
	struct engine *eng = mk_engine(64, 64, 0);
	struct errbuf e = { 0 };
	uint64_t h, q, c, other;

	(void)state;
	h = prep_ok(eng, 7, 0, PT, 2).id;
	q = seq_lease(eng, 1, 2);
	c = chunk_fill_lease(eng, 6000, 2);
	other = prep_ok(eng, 9, 0, PT, 3).id;
	/* leases of every kind, and the sequence: 3 + 1 */
	assert_int_equal(engine_release_owner(eng, 2), 4);
	assert_int_equal(engine_release(eng, h, &e), -ENOENT);
	assert_int_equal(engine_release(eng, q, &e), -ENOENT);
	assert_int_equal(engine_release(eng, c, &e), -ENOENT);
	assert_int_equal(stats_of(eng).leases, 1);
	assert_int_equal(stats_of(eng).seqs, 0);
	/* the unsealed chunk went with its fill lease */
	assert_int_equal(stats_of(eng).chunks, 0);
	CHECK(eng);
	release_ok(eng, other);
	CHECK(eng);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_every_kind_shares_one_slot_space,
					  teardown),
		cmocka_unit_test_teardown(test_one_stale_check_for_every_kind,
					  teardown),
		cmocka_unit_test_teardown(test_dead_client_releases_every_kind,
					  teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
