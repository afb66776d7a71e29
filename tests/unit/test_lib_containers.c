/* SPDX-License-Identifier: MIT */
/*
 * test_lib_containers - lib/list.h and lib/hashtab.[ch] against reference
 * models: a list driven by random adds at either end and deletions must
 * hold exactly an array's order, forwards and (through prev) backwards;
 * hash tables keyed by uint64 (ids chosen to collide in their low bits)
 * and by 32-byte keys, through random inserts, removals and growths, must
 * hold exactly a reference set; a reserve of n makes the next n inserts
 * keep the bucket array (no allocation); a fixed table never grows.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hashtab.h"
#include "list.h"

static uint64_t rng = 0x5eedf00dull;

static uint64_t next_rand(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	return mix64(z);
}

/* ------------------------------------------------------------ list */

#define NODES 64

struct item {
	int id;
	struct list_head link;
};

static void check_list(struct list_head *head, const int *ref, int n)
{
	struct item *it;
	int i = 0;

	list_for_each_entry(it, head, link) {
		assert_true(i < n);
		assert_int_equal(it->id, ref[i]);
		i++;
	}
	assert_int_equal(i, n);
	/* backwards through prev */
	i = n;
	for (struct list_head *p = head->prev; p != head; p = p->prev)
		assert_int_equal(list_entry(p, struct item, link)->id, ref[--i]);
	assert_int_equal(i, 0);
	assert_int_equal(list_empty(head), n == 0);
}

static void test_list_matches_array_model(void **state)
{
	struct item items[NODES];
	struct list_head head = LIST_HEAD_INIT(head);
	int ref[NODES], n = 0;

	(void)state;
	for (int i = 0; i < NODES; i++) {
		items[i].id = i;
		INIT_LIST_HEAD(&items[i].link);
	}
	for (int step = 0; step < 20000; step++) {
		int i = (int)(next_rand() % NODES);
		struct item *it = &items[i];

		if (list_empty(&it->link)) {
			if (next_rand() & 1) {
				list_add(&it->link, &head);
				memmove(ref + 1, ref, (size_t)n * sizeof(*ref));
				ref[0] = i;
			} else {
				list_add_tail(&it->link, &head);
				ref[n] = i;
			}
			n++;
		} else {
			int k = 0;

			while (ref[k] != i)
				k++;
			list_del(&it->link);
			assert_true(list_empty(&it->link));
			memmove(ref + k, ref + k + 1,
				(size_t)(n - k - 1) * sizeof(*ref));
			n--;
		}
		check_list(&head, ref, n);
	}
}

static void test_list_safe_iteration_deletes_every_other(void **state)
{
	struct item items[10], *it, *tmp;
	struct list_head head = LIST_HEAD_INIT(head);
	int ref[5] = { 1, 3, 5, 7, 9 };

	(void)state;
	for (int i = 0; i < 10; i++) {
		items[i].id = i;
		list_add_tail(&items[i].link, &head);
	}
	list_for_each_entry_safe(it, tmp, &head, link)
		if (it->id % 2 == 0)
			list_del(&it->link);
	check_list(&head, ref, 5);
	assert_ptr_equal(list_first_entry_or_null(&head, struct item, link),
			 &items[1]);
	assert_ptr_equal(list_next_entry_or_null(&items[9], &head, link), NULL);
	assert_ptr_equal(list_next_entry_or_null(&items[1], &head, link),
			 &items[3]);
}

/* ------------------------------------------------------------ hashtab */

#define KEYS 3000

struct u64_elem {
	uint64_t key;
	bool in;
	struct hnode node;
};

static int count_all_u64(struct hashtab *t)
{
	struct u64_elem *e;
	int n = 0;

	hashtab_for_each_safe(t, e, node) {
		assert_true(e->in);
		n++;
	}
	return n;
}

static void test_hashtab_u64_matches_set_through_growths(void **state)
{
	struct u64_elem *el = calloc(KEYS, sizeof(*el));
	struct hashtab t;
	int live = 0;

	(void)state;
	assert_non_null(el);
	assert_int_equal(hashtab_init(&t, 4), 0);
	for (int i = 0; i < KEYS; i++)
		el[i].key = (uint64_t)i << 32; /* equal low bits everywhere */
	for (int step = 0; step < 60000; step++) {
		int i = (int)(next_rand() % KEYS);
		struct hnode *n = hashtab_find_u64(&t, el[i].key);

		assert_ptr_equal(n, el[i].in ? &el[i].node : NULL);
		if (el[i].in) {
			if (next_rand() % 3 == 0) {
				hashtab_remove(&t, &el[i].node);
				el[i].in = false;
				live--;
			}
		} else {
			struct hnode **b;

			assert_int_equal(hashtab_reserve(&t, 1), 0);
			b = t.buckets;
			hashtab_insert(&t, &el[i].node,
				       hashtab_hash_u64(el[i].key));
			assert_ptr_equal(t.buckets, b); /* no growth after reserve */
			el[i].in = true;
			live++;
		}
		assert_int_equal(t.count, live);
		assert_true(t.count <= t.mask + 1);
	}
	assert_int_equal(count_all_u64(&t), live);
	/* remove everything while iterating */
	{
		struct u64_elem *e;

		hashtab_for_each_safe(&t, e, node) {
			hashtab_remove(&t, &e->node);
			e->in = false;
		}
	}
	assert_int_equal(t.count, 0);
	hashtab_fini(&t);
	free(el);
}

struct key_elem {
	uint8_t key[32];
	struct hnode node;
};

static bool key_eq(const struct hnode *n, const void *key)
{
	return !memcmp(hashtab_entry(n, struct key_elem, node)->key, key, 32);
}

static void test_hashtab_byte_keys_and_reserve_many(void **state)
{
	struct key_elem *el = calloc(KEYS, sizeof(*el));
	struct hashtab t;
	struct hnode **b;

	(void)state;
	assert_non_null(el);
	assert_int_equal(hashtab_init(&t, 1), 0);
	for (int i = 0; i < KEYS; i++) {
		for (int k = 0; k < 32; k += 8) {
			uint64_t r = next_rand();

			memcpy(el[i].key + k, &r, 8);
		}
		el[i].key[0] = 7; /* keys that share a byte still spread */
	}
	/* One reserve for all: none of the inserts grows the table. */
	assert_int_equal(hashtab_reserve(&t, KEYS), 0);
	b = t.buckets;
	for (int i = 0; i < KEYS; i++)
		hashtab_insert(&t, &el[i].node, hashtab_hash_bytes(el[i].key, 32));
	assert_ptr_equal(t.buckets, b);
	for (int i = 0; i < KEYS; i++) {
		uint64_t h = hashtab_hash_bytes(el[i].key, 32);
		struct key_elem *pos, *found = NULL;

		assert_ptr_equal(hashtab_find(&t, h, key_eq, el[i].key),
				 &el[i].node);
		hashtab_for_each_possible(&t, pos, node, h)
			if (!memcmp(pos->key, el[i].key, 32))
				found = pos;
		assert_ptr_equal(found, &el[i]);
	}
	for (int i = 0; i < KEYS; i += 2)
		hashtab_remove(&t, &el[i].node);
	for (int i = 0; i < KEYS; i++)
		assert_ptr_equal(hashtab_find(&t, hashtab_hash_bytes(el[i].key, 32),
					      key_eq, el[i].key),
				 i % 2 ? &el[i].node : NULL);
	assert_int_equal(t.count, KEYS / 2);
	hashtab_fini(&t);
	free(el);
}

static void test_hashtab_fixed_never_grows(void **state)
{
	struct key_elem el[100];
	struct hashtab t;
	struct hnode **b;

	(void)state;
	assert_int_equal(hashtab_init_fixed(&t, 10), 0);
	assert_int_equal(t.mask + 1, 16); /* rounded up to a power of two */
	b = t.buckets;
	for (int i = 0; i < 100; i++) {
		memset(el[i].key, 0, 32);
		memcpy(el[i].key, &i, sizeof(i));
		assert_int_equal(hashtab_reserve(&t, 1), 0);
		hashtab_insert(&t, &el[i].node, hashtab_hash_digest(el[i].key));
	}
	assert_ptr_equal(t.buckets, b);
	for (int i = 0; i < 100; i++)
		assert_ptr_equal(hashtab_find(&t, hashtab_hash_digest(el[i].key),
					      key_eq, el[i].key),
				 &el[i].node);
	hashtab_fini(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_list_matches_array_model),
		cmocka_unit_test(test_list_safe_iteration_deletes_every_other),
		cmocka_unit_test(test_hashtab_u64_matches_set_through_growths),
		cmocka_unit_test(test_hashtab_byte_keys_and_reserve_many),
		cmocka_unit_test(test_hashtab_fixed_never_grows),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
