/* SPDX-License-Identifier: MIT */
/*
 * test_park.c - the worker's parked completions (daemon/server/park.c): a fixed
 * capacity that refuses rather than grows, "is this user parked" for the
 * worker's hold-back rule, and reaping that hands over exactly the entries
 * whose fence landed, in the order they were parked, never more than the
 * CQ room it is given, keeping the rest in order.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "park.h"

/* Fences <= landed have landed; emitted tags are recorded in order. */
struct reap_ctx {
	uint64_t landed;
	uint64_t tags[16];
	uint32_t n;
};

static bool landed_fn(void *arg, const struct park *e)
{
	return e->fence <= ((struct reap_ctx *)arg)->landed;
}

static void emit_fn(void *arg, const struct kvp_cqe *cqe)
{
	struct reap_ctx *x = arg;

	assert_true(x->n < 16);
	x->tags[x->n++] = cqe->tag;
}

static struct park entry(uint64_t tag, uint64_t user, uint64_t fence)
{
	return (struct park){ .cqe = { .tag = tag, .val0 = tag * 10 },
			      .fence = fence, .user = user };
}

static void test_uninitialised_list_parks_nothing(void **state)
{
	struct park_list p = { 0 };
	struct park e = entry(1, 1, 1);
	struct reap_ctx x = { .landed = 99 };

	(void)state;
	assert_false(park_add(&p, &e));
	assert_false(park_has_user(&p, 1));
	assert_int_equal(park_reap(&p, 8, landed_fn, emit_fn, &x), 0);
	park_fini(&p);
}

static void test_capacity_is_fixed(void **state)
{
	struct park_list p;

	(void)state;
	assert_int_equal(park_init(&p, 3), 0);
	for (uint64_t i = 0; i < 3; i++) {
		struct park e = entry(i, 100 + i, i + 1);

		assert_true(park_add(&p, &e));
	}
	struct park e = entry(9, 9, 9);
	assert_false(park_add(&p, &e));
	assert_int_equal(p.n, 3);
	assert_true(park_has_user(&p, 100));
	assert_true(park_has_user(&p, 102));
	assert_false(park_has_user(&p, 9));
	park_fini(&p);
	assert_null(p.v);
	assert_int_equal(p.cap, 0);
}

static void test_reap_hands_over_landed_in_order(void **state)
{
	struct park_list p;
	/* tag, user, fence: fences need not be parked in order (two pools). */
	const uint64_t t[][3] = { { 1, 10, 5 }, { 2, 11, 2 }, { 3, 12, 7 },
				  { 4, 13, 1 }, { 5, 14, 6 } };
	struct reap_ctx x = { .landed = 5 };

	(void)state;
	assert_int_equal(park_init(&p, 8), 0);
	for (size_t i = 0; i < 5; i++) {
		struct park e = entry(t[i][0], t[i][1], t[i][2]);

		assert_true(park_add(&p, &e));
	}
	assert_int_equal(park_reap(&p, 8, landed_fn, emit_fn, &x), 3);
	assert_int_equal(x.n, 3);
	assert_int_equal(x.tags[0], 1);
	assert_int_equal(x.tags[1], 2);
	assert_int_equal(x.tags[2], 4);
	/* The rest stay, in order, with their CQEs intact. */
	assert_int_equal(p.n, 2);
	assert_int_equal(p.v[0].cqe.tag, 3);
	assert_int_equal(p.v[0].cqe.val0, 30);
	assert_int_equal(p.v[1].cqe.tag, 5);
	assert_false(park_has_user(&p, 10));
	assert_true(park_has_user(&p, 12));
	/* Nothing new landed: nothing handed over. */
	x.n = 0;
	assert_int_equal(park_reap(&p, 8, landed_fn, emit_fn, &x), 0);
	assert_int_equal(p.n, 2);
	/* Room for more again after reaping. */
	struct park e = entry(6, 15, 3);
	assert_true(park_add(&p, &e));
	x.landed = 100;
	assert_int_equal(park_reap(&p, 8, landed_fn, emit_fn, &x), 3);
	assert_int_equal(x.tags[0], 3);
	assert_int_equal(x.tags[1], 5);
	assert_int_equal(x.tags[2], 6);
	assert_int_equal(p.n, 0);
	park_fini(&p);
}

/* The CQ has room for max more: the rest wait, order kept. */
static void test_reap_respects_cq_room(void **state)
{
	struct park_list p;
	struct reap_ctx x = { .landed = 100 };

	(void)state;
	assert_int_equal(park_init(&p, 8), 0);
	for (uint64_t i = 1; i <= 4; i++) {
		struct park e = entry(i, i, i);

		assert_true(park_add(&p, &e));
	}
	assert_int_equal(park_reap(&p, 0, landed_fn, emit_fn, &x), 0);
	assert_int_equal(p.n, 4);
	assert_int_equal(park_reap(&p, 3, landed_fn, emit_fn, &x), 3);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.v[0].cqe.tag, 4);
	assert_int_equal(park_reap(&p, 3, landed_fn, emit_fn, &x), 1);
	assert_int_equal(x.n, 4);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(x.tags[i], i + 1);
	park_fini(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uninitialised_list_parks_nothing),
		cmocka_unit_test(test_capacity_is_fixed),
		cmocka_unit_test(test_reap_hands_over_landed_in_order),
		cmocka_unit_test(test_reap_respects_cq_room),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
