/* SPDX-License-Identifier: MIT */
/*
 * test_lease_table - libclient/lease.c, the client's lease table, against a
 * reference: random adds (new ids, and ids already held, which replace),
 * drops (held and unknown ids), per-sequence drops and lookups, over ids
 * chosen to collide (kvpoold's ids are (generation << 32) | slot: many
 * share their low bits), page tables small enough for the record cache
 * and larger ones, through several table growths. After every operation
 * the table holds exactly the reference's ids, each with its own page
 * table; a drop never loses a neighbour.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_internal.h"

#define IDS 600u       /* distinct ids the run draws from */
#define STEPS 40000u
#define MAX_PAGES 80u  /* above the 32-frame record cache size */

struct ref {
	int held;
	uint64_t seq;
	uint32_t npages;
	int32_t frames[MAX_PAGES];
};

static uint64_t rng = 0x1ea5e7ab1eull;

static uint64_t next(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Id i: a few slots, many generations, as kvpoold hands them out. */
static uint64_t id_of(uint32_t i)
{
	return ((uint64_t)(i / 8 + 1) << 32) | (i % 8);
}

static void check_all(struct kvp_client *c, const struct ref *ref)
{
	uint32_t held = 0;

	for (uint32_t i = 0; i < IDS; i++) {
		struct kvpc_lease *r = kvpc_lease_find(c, id_of(i));

		if (!ref[i].held) {
			assert_null(r);
			continue;
		}
		held++;
		assert_non_null(r);
		assert_int_equal(r->id, id_of(i));
		assert_int_equal(r->npages, ref[i].npages);
		assert_int_equal(r->seq, ref[i].seq);
		assert_memory_equal(r->frames, ref[i].frames,
				    ref[i].npages * sizeof(int32_t));
	}
	assert_int_equal(kvpc_lease_count(c), held);
	assert_null(kvpc_lease_find(c, 0)); /* id 0: never a lease */
}

static void test_lease_table_matches_a_reference(void **state)
{
	struct kvp_client *c = calloc(1, sizeof(*c));
	struct ref *ref = calloc(IDS, sizeof(*ref));
	uint32_t adds = 0, drops = 0, seq_drops = 0, replaced = 0;

	(void)state;
	assert_non_null(c);
	assert_non_null(ref);
	for (uint32_t step = 0; step < STEPS; step++) {
		uint32_t i = (uint32_t)(next() % IDS), op = (uint32_t)(next() % 10);

		if (op < 5) {
			int32_t frames[MAX_PAGES];
			struct kvp_lease l = { .id = id_of(i), .len = i, .n_new = 3 };

			l.npages = (uint32_t)(next() % (next() % 4 ? 33 : MAX_PAGES + 1));
			for (uint32_t p = 0; p < l.npages; p++)
				frames[p] = (int32_t)(next() % 100000);
			l.indices = frames;
			replaced += ref[i].held;
			assert_int_equal(kvpc_lease_add(c, &l, KVPC_LEASE_SEQ, i % 7), 0);
			/* The caller's struct now points at the library's copy. */
			assert_ptr_equal(l.indices, kvpc_lease_find(c, l.id)->frames);
			ref[i].held = 1;
			ref[i].seq = i % 7;
			ref[i].npages = l.npages;
			memcpy(ref[i].frames, frames, sizeof(frames[0]) * l.npages);
			adds++;
		} else if (op < 9) {
			kvpc_lease_drop(c, id_of(i)); /* held or not */
			drops += ref[i].held;
			ref[i].held = 0;
		} else if (next() % 50 == 0) {
			uint64_t seq = next() % 7, keep = id_of(i);

			kvpc_lease_drop_seq(c, seq, keep);
			for (uint32_t j = 0; j < IDS; j++)
				if (ref[j].held && ref[j].seq == seq && id_of(j) != keep) {
					ref[j].held = 0;
					seq_drops++;
				}
		}
		if (step % 97 == 0 || op >= 5)
			check_all(c, ref);
	}
	check_all(c, ref);
	/* The run did what it claims: growth, replacement, every kind of drop. */
	assert_true(adds > 10000 && drops > 5000 && replaced > 1000 && seq_drops > 20);
	assert_true(hashtab_nbuckets(&c->leases) >= 256);
	kvpc_lease_table_free(c);
	assert_null(c->leases.buckets);
	assert_null(c->lease_cache);
	free(ref);
	free(c);
}

/* The -ESTALE messages name the lease and why. */
static void test_lease_open_says_why_not(void **state)
{
	struct kvp_client *c = calloc(1, sizeof(*c));
	struct kvp_lease l = { .id = 0x500000007ull, .npages = 1, .n_new = 8 };
	int32_t frame = 3;
	struct kvpc_lease *r = NULL;

	(void)state;
	l.indices = &frame;
	assert_int_equal(kvpc_lease_open(c, 0x42, "append", &r), -ESTALE);
	assert_non_null(strstr(c->err, "append: lease 0x42 is not held by this client"));
	assert_int_equal(kvpc_lease_add(c, &l, KVPC_LEASE_HISTORY, 0), 0);
	assert_int_equal(kvpc_lease_open(c, l.id, "append", &r), 0);
	r->state = KVPC_LEASE_CLOSED;
	r->committed = 5;
	assert_int_equal(kvpc_lease_open(c, l.id, "commit", &r), -ESTALE);
	assert_non_null(strstr(c->err, "commit: lease 0x500000007 has committed 5 of its 8"));
	r->state = KVPC_LEASE_COMMITTING;
	assert_int_equal(kvpc_lease_open(c, l.id, "append", &r), -ESTALE);
	assert_non_null(strstr(c->err, "has a commit queued"));
	r->state = KVPC_LEASE_RELEASING;
	assert_int_equal(kvpc_lease_open(c, l.id, "append", &r), -ESTALE);
	assert_non_null(strstr(c->err, "has a release queued"));
	kvpc_lease_table_free(c);
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lease_table_matches_a_reference),
		cmocka_unit_test(test_lease_open_says_why_not),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
