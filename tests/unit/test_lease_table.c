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
#include <unistd.h>

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

/*
 * The data path on an shm client with no daemon (the tier is host memory):
 * an append is checked once, at its entry, against the records, and a
 * batch in which any item is stale, out of its range or names a frame
 * outside the tier writes nothing at all; a good batch writes exactly its
 * tokens, where the records' page tables say.
 */
#define T_PAGE 4u
#define T_FRAMES 8u

static struct kvp_client *shm_client(void)
{
	struct kvp_client *c = calloc(1, sizeof(*c));
	char err[128];

	assert_non_null(c);
	assert_int_equal(kvp_layout_init(&c->layout, 2, 1, 4, KVP_DTYPE_BF16, T_PAGE,
					 err, sizeof(err)), 0);
	c->tier_frames[KVP_TIER_DEVICE] = T_FRAMES;
	c->device_bytes = (size_t)T_FRAMES * c->layout.page_bytes;
	c->device = calloc(1, c->device_bytes);
	assert_non_null(c->device);
	c->fork_gen = kvpc_fork_gen;
	c->pid = getpid();
	c->device_fd = -1;
	c->cuda_device = -1;
	return c;
}

static void shm_client_free(struct kvp_client *c)
{
	kvpc_lease_table_free(c);
	free(c->scratch);
	free(c->recs);
	free(c->device);
	free(c);
}

static void test_append_batch_checks_every_item_before_writing(void **state)
{
	struct kvp_client *c = shm_client();
	int32_t fa[2] = { 5, 2 }, fb[1] = { 7 }, fbad[2] = { 1, 99 };
	struct kvp_lease a = { .id = 0x100000001ull, .len = 2, .n_new = 5,
			       .npages = 2, .indices = fa };
	struct kvp_lease b = { .id = 0x100000002ull, .len = 0, .n_new = 3,
			       .npages = 1, .indices = fb };
	struct kvp_lease bad = { .id = 0x100000003ull, .len = 0, .n_new = 8,
				 .npages = 2, .indices = fbad };
	struct kvp_lease gone = { .id = 0x100000004ull };
	const size_t tb = c->layout.token_bytes;
	unsigned char *kv = malloc(8 * tb), *before = malloc(c->device_bytes);
	unsigned char *back = malloc(8 * tb);
	struct kvp_slot slots[8];
	struct kvpc_lease *r = NULL;

	(void)state;
	for (size_t i = 0; i < 8 * tb; i++)
		kv[i] = (unsigned char)(i * 7 + 1);
	assert_int_equal(kvpc_lease_add(c, &a, KVPC_LEASE_HISTORY, 0), 0);
	assert_int_equal(kvpc_lease_add(c, &b, KVPC_LEASE_HISTORY, 0), 0);
	assert_int_equal(kvpc_lease_add(c, &bad, KVPC_LEASE_HISTORY, 0), 0);

	/* A good batch: a's tokens 1..3 (positions 3..5: frame 5 slot 3, frame
	 * 2 slots 0, 1), then b's tokens 0..1 (frame 7 slots 0, 1). */
	{
		const struct kvp_append_item it[2] = { { &a, 1, 3 }, { &b, 0, 2 } };

		assert_int_equal(kvp_append_batch_async(c, it, 2, kv, NULL), 0);
	}
	slots[0] = (struct kvp_slot){ 5, 3 };
	slots[1] = (struct kvp_slot){ 2, 0 };
	slots[2] = (struct kvp_slot){ 2, 1 };
	slots[3] = (struct kvp_slot){ 7, 0 };
	slots[4] = (struct kvp_slot){ 7, 1 };
	kvp_read_cpu(&c->layout, c->device, slots, 5, back);
	assert_memory_equal(back, kv, 5 * tb);
	memcpy(before, c->device, c->device_bytes);

	/* Each bad batch fails naming its item, and the tier is untouched:
	 * the first item is good every time. */
	{
		const struct kvp_append_item stale[2] = { { &a, 0, 2 }, { &gone, 0, 1 } };
		const struct kvp_append_item range[2] = { { &a, 0, 2 }, { &b, 2, 2 } };
		const struct kvp_append_item frame[2] = { { &a, 0, 2 }, { &bad, 0, 6 } };

		assert_int_equal(kvp_append_batch_async(c, stale, 2, kv, NULL), -ESTALE);
		assert_non_null(strstr(kvp_last_error(c), "append_batch item 1: lease 0x100000004"));
		assert_int_equal(kvp_append_batch_async(c, range, 2, kv, NULL), -EINVAL);
		assert_non_null(strstr(kvp_last_error(c), "append_batch item 1: tokens [2, 4)"));
		assert_int_equal(kvp_append_batch_async(c, frame, 2, kv, NULL), -EINVAL);
		assert_non_null(strstr(kvp_last_error(c), "names frame 99"));
		assert_memory_equal(c->device, before, c->device_bytes);
	}

	/* A lease with a commit queued takes no write, single or batched. */
	assert_int_equal(kvpc_lease_open(c, b.id, "test", &r), 0);
	r->state = KVPC_LEASE_COMMITTING;
	assert_int_equal(kvp_append(c, &b, 2, 1, kv), -ESTALE);
	assert_non_null(strstr(kvp_last_error(c), "has a commit queued"));
	assert_memory_equal(c->device, before, c->device_bytes);

	/* kvp_append of a good lease writes its slots (a's token 4: frame 2
	 * slot 2). */
	assert_int_equal(kvp_append(c, &a, 4, 1, kv + tb), 0);
	slots[0] = (struct kvp_slot){ 2, 2 };
	kvp_read_cpu(&c->layout, c->device, slots, 1, back);
	assert_memory_equal(back, kv + tb, tb);

	free(kv);
	free(before);
	free(back);
	shm_client_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lease_table_matches_a_reference),
		cmocka_unit_test(test_append_batch_checks_every_item_before_writing),
		cmocka_unit_test(test_lease_open_says_why_not),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
