/* SPDX-License-Identifier: MIT */
/*
 * test_engine_continuity.c - the words of a refused prepare. Seed 002's
 * errors come first, verbatim ("The input sequence has missing tokens from
 * 10 to 19 (both inclusive)."), and only then kvpool's context: the user,
 * what the cache holds, what to send. After the head was trimmed
 * (max_tokens_per_user), positions that are no longer cached are not called
 * overlapping: the overlap named is the part of the input the cache holds,
 * and an input that starts before the first cached token is told so. A
 * refused prepare changes nothing.
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
#include "kvpool.h"

/* The message starts with want, character for character. */
static void assert_msg_starts(const struct errbuf *e, const char *want)
{
	if (strncmp(e->msg, want, strlen(want)))
		fail_msg("message \"%s\" does not start with \"%s\"", e->msg, want);
}

static void assert_msg_lacks(const struct errbuf *e, const char *not)
{
	if (strstr(e->msg, not))
		fail_msg("message \"%s\" has \"%s\"", e->msg, not);
}

/* Seed 002, example 2: cached [0,10), input at 20 -> missing 10 to 19. */
static void test_gap_starts_with_the_seed_sentence(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 0, 0, 10);
	struct engine_snap before = snap_of(eng, 0);

	assert_int_equal(prep_err(eng, 0, 20, 10, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence has missing tokens from 10 to 19 "
			  "(both inclusive). ");
	/* then kvpool's context: who, what is cached, what to send */
	assert_msg_has(&e, "user 0");
	assert_msg_has(&e, "[0, 10)");
	assert_msg_has(&e, "send the input from position 10");
	assert_unchanged(eng, &before);

	assert_int_equal(prep_err(eng, 0, 11, 0, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence has missing tokens from 10 to 10 "
			  "(both inclusive). ");
	assert_unchanged(eng, &before);
	drop_engine();
}

/* Seed 002, example 3: cached [0,10), input at 5 len 20 -> overlapping 5 to 9. */
static void test_overlap_starts_with_the_seed_sentence(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 0, 0, 10);
	struct engine_snap before = snap_of(eng, 0);

	assert_int_equal(prep_err(eng, 0, 5, 20, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence has overlapping tokens from 5 to 9 "
			  "(both inclusive). ");
	assert_msg_has(&e, "user 0");
	assert_msg_has(&e, "[0, 10)");
	assert_msg_has(&e, "send from position 10");
	/* an input that ends inside the cache overlaps only where it is */
	assert_int_equal(prep_err(eng, 0, 2, 3, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence has overlapping tokens from 2 to 4 "
			  "(both inclusive). ");
	assert_unchanged(eng, &before);
	drop_engine();
}

/*
 * max_tokens_per_user 8, pages of 4: 10 tokens keep [4, 10) (the first page
 * was trimmed). Tokens 0 to 3 are not cached, so they cannot overlap.
 */
static void test_overlap_after_head_trim_names_only_cached_tokens(void **state)
{
	struct engine *eng = mk_engine(16, 0, 8);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 10);
	assert_int_equal(info_of(eng, 1).start, 4);
	assert_int_equal(info_of(eng, 1).len, 6);
	struct engine_snap before = snap_of(eng, 1);

	/* from the first cached token: an overlap, as before the trim */
	assert_int_equal(prep_err(eng, 1, 4, 10, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence has overlapping tokens from 4 to 9 "
			  "(both inclusive). ");

	/* from before it: its own message, no overlap claimed for 3 */
	assert_int_equal(prep_err(eng, 1, 3, 10, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence starts at token 3, before the "
			  "first cached token 4 (tokens before it were trimmed)");
	assert_msg_lacks(&e, "overlapping tokens from 3");
	assert_msg_has(&e, "user 1");
	assert_msg_has(&e, "[4, 10)");
	assert_msg_has(&e, "send from position 10");

	/* wholly before the head: nothing of it is cached */
	assert_int_equal(prep_err(eng, 1, 0, 2, &e), -EINVAL);
	assert_msg_starts(&e, "The input sequence starts at token 0, before the "
			  "first cached token 4 (tokens before it were trimmed)");
	assert_msg_lacks(&e, "overlapping");
	assert_unchanged(eng, &before);

	/* the continuation is still accepted */
	put(eng, 1, 10, 2);
	verify(eng, 1, 4, 8);
	drop_engine();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_gap_starts_with_the_seed_sentence, teardown),
		cmocka_unit_test_teardown(test_overlap_starts_with_the_seed_sentence, teardown),
		cmocka_unit_test_teardown(test_overlap_after_head_trim_names_only_cached_tokens,
					  teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
