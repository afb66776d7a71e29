/* SPDX-License-Identifier: MIT */
/*
 * test_hstu_csv.c - the loader of the HSTU example's files
 * (tools/kvbench/hstu_csv.c) on a small hand-made pair in their layout
 * (tests/data/hstu/: quoted Python lists, a one-element list unquoted, the
 * user feature columns): the batches file, the seqs file alone (requests
 * from interval_indptr and time_ms) and both together give the same six
 * requests in replay order; bad files are refused naming file, line and
 * column.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "hstu_csv.h"

#define DIR KVPOOL_TEST_DATA "/hstu"

/* date, ts_ms, user, end, begin of the fixture's requests in replay order. */
static const struct { uint32_t date; uint64_t ts; uint32_t user, end, begin; } want[] = {
	{ 20220408, 1649376010000ull, 7, 2, 0 },
	{ 20220408, 1649376020000ull, 3, 2, 0 },
	{ 20220408, 1649376100000ull, 7, 3, 2 },
	{ 20220408, 1649376200000ull, 3, 3, 2 },
	{ 20220408, 1649376300000ull, 3, 4, 3 },
	{ 20220409, 1649462400000ull, 7, 1, 0 },
};

static void check(const struct trace *t)
{
	assert_int_equal(t->n, 6);
	assert_int_equal(t->nkeys, 3);
	assert_int_equal(t->users, 2);
	assert_int_equal(t->days, 2);
	for (size_t i = 0; i < 6; i++) {
		assert_int_equal(t->req[i].date, want[i].date);
		assert_int_equal(t->req[i].ts_ms, want[i].ts);
		assert_int_equal(t->req[i].user, want[i].user);
		assert_int_equal(t->req[i].end, want[i].end);
		assert_int_equal(t->req[i].begin, want[i].begin);
	}
}

static void load(const char *seqs, const char *batches)
{
	struct trace t;
	char err[512] = "";

	if (hstu_load(&t, seqs, batches, err, sizeof(err)))
		fail_msg("hstu_load: %s", err);
	check(&t);
	trace_free(&t);
}

static void test_batches_file_gives_its_rows_in_replay_order(void **st)
{
	load(NULL, DIR "/" HSTU_BATCHES_CSV);
}

static void test_seqs_file_alone_gives_the_same_requests(void **st)
{
	load(DIR "/" HSTU_SEQS_CSV, NULL);
}

static void test_both_files_are_checked_against_each_other(void **st)
{
	struct trace t;
	char err[512] = "";

	load(DIR "/" HSTU_SEQS_CSV, DIR "/" HSTU_BATCHES_CSV);
	assert_int_equal(hstu_load_dir(&t, DIR, err, sizeof(err)), 0);
	check(&t);
	trace_free(&t);
}

static void expect_bad(const char *text, const char *want_msg)
{
	char path[] = "/tmp/kvpool-hstu-XXXXXX";
	int fd = mkstemp(path);
	struct trace t;
	char err[512] = "";
	FILE *f;

	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	fputs(text, f);
	fclose(f);
	assert_true(hstu_load(&t, path, NULL, err, sizeof(err)) < 0);
	unlink(path);
	if (!strstr(err, want_msg))
		fail_msg("message '%s' does not say '%s'", err, want_msg);
}

static void test_bad_files_are_refused_naming_line_and_column(void **st)
{
	static const char head[] = "user_id,date,video_id,time_ms,interval_indptr\n";
	char buf[512];

	expect_bad("user_id,date\n1,20220408\n", "no 'video_id' column");
	snprintf(buf, sizeof(buf), "%s1,20220408,\"[1, 2\",\"[5, 6]\",\"[0, 2]\"\n", head);
	expect_bad(buf, ":2: column video_id");
	snprintf(buf, sizeof(buf), "%s1,20220408,\"[1, 2]\",\"[5, 6]\",\"[0, 1]\"\n", head);
	expect_bad(buf, "interval_indptr must run from 0");
	snprintf(buf, sizeof(buf), "%sx,20220408,[1],[5],\"[0, 1]\"\n", head);
	expect_bad(buf, "column user_id");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batches_file_gives_its_rows_in_replay_order),
		cmocka_unit_test(test_seqs_file_alone_gives_the_same_requests),
		cmocka_unit_test(test_both_files_are_checked_against_each_other),
		cmocka_unit_test(test_bad_files_are_refused_naming_line_and_column),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
