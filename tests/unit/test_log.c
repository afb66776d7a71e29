/* SPDX-License-Identifier: MIT */
/*
 * test_log - kvpoold's log rate limit (daemon/server/log.c): a call site writes a
 * burst, then one line per refill period; what it drops is counted and
 * reported in one summary line; call sites do not share a bucket. The clock
 * is the test's, so no test sleeps.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static uint64_t fake_now = 1000;

static uint64_t fake_clock(void)
{
	return fake_now;
}

static char g_path[] = "/tmp/kvpool-test-log-XXXXXX";

static int setup(void **state)
{
	char err[256];
	int fd = mkstemp(g_path);

	if (fd < 0)
		return -1;
	close(fd);
	/* Far enough on that every call site's bucket is full again. */
	fake_now += 1000 * LOG_REFILL_MS;
	log_set_clock(fake_clock);
	return log_open(g_path, false, err, sizeof(err));
}

static int teardown(void **state)
{
	/* Leave no count behind for the next test. */
	log_flush_suppressed(fake_now + LOG_SUMMARY_MS);
	log_close();
	log_set_clock(NULL);
	unlink(g_path);
	strcpy(g_path, "/tmp/kvpool-test-log-XXXXXX");
	return 0;
}

/* The lines written so far; *n gets how many. Caller frees. */
static char **read_lines(int *n)
{
	FILE *f = fopen(g_path, "r");
	char buf[2048], **v = NULL;

	*n = 0;
	assert_non_null(f);
	while (fgets(buf, sizeof(buf), f)) {
		v = realloc(v, (size_t)(*n + 1) * sizeof(*v));
		assert_non_null(v);
		v[(*n)++] = strdup(buf);
	}
	fclose(f);
	return v;
}

static void free_lines(char **v, int n)
{
	for (int i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static int count_lines(void)
{
	int n;
	char **v = read_lines(&n);

	free_lines(v, n);
	return n;
}

/* One call site, so one bucket, whatever the arguments. */
static void refused(int i)
{
	log_warn("refused uid %d: not allowed", i);
}

static void other_site(int i)
{
	log_warn("client %d: something else", i);
}

static void test_bucket_burst_then_one_per_refill(void **state)
{
	struct log_limit l = { 0 };

	for (int i = 0; i < LOG_BURST; i++)
		assert_true(log_limit_take(&l, 5000));
	assert_false(log_limit_take(&l, 5000));
	assert_false(log_limit_take(&l, 5000 + LOG_REFILL_MS - 1));
	assert_true(log_limit_take(&l, 5000 + LOG_REFILL_MS));
	assert_false(log_limit_take(&l, 5000 + LOG_REFILL_MS));
	/* A long quiet spell refills to the burst, not beyond it. */
	for (int i = 0; i < LOG_BURST; i++)
		assert_true(log_limit_take(&l, 5000 + 1000 * LOG_REFILL_MS));
	assert_false(log_limit_take(&l, 5000 + 1000 * LOG_REFILL_MS));
}

static void test_bucket_keeps_the_refill_remainder(void **state)
{
	struct log_limit l = { 0 };

	for (int i = 0; i < LOG_BURST; i++)
		assert_true(log_limit_take(&l, 100));
	/* 1.5 periods: one token now, the next one half a period later. */
	assert_true(log_limit_take(&l, 100 + LOG_REFILL_MS * 3 / 2));
	assert_false(log_limit_take(&l, 100 + LOG_REFILL_MS * 3 / 2));
	assert_true(log_limit_take(&l, 100 + LOG_REFILL_MS * 2));
}

static void test_flood_writes_the_burst_and_one_summary(void **state)
{
	char **v;
	int n;

	for (int i = 0; i < 60000; i++)
		refused(i);
	assert_int_equal(count_lines(), LOG_BURST);
	/* Due LOG_SUMMARY_MS after the first suppressed line, not before. */
	assert_int_equal(log_flush_suppressed(fake_now), (int)LOG_SUMMARY_MS);
	fake_now += LOG_SUMMARY_MS - 1;
	assert_int_equal(log_flush_suppressed(fake_now), 1);
	assert_int_equal(count_lines(), LOG_BURST);
	fake_now += 1;
	assert_int_equal(log_flush_suppressed(fake_now), -1);
	v = read_lines(&n);
	assert_int_equal(n, LOG_BURST + 1);
	assert_non_null(strstr(v[0], "warning: refused uid 0: not allowed"));
	assert_non_null(strstr(v[LOG_BURST - 1], "refused uid 9: not allowed"));
	assert_non_null(strstr(v[LOG_BURST], "59990 similar lines suppressed in the last 5.0 s"));
	/* The first line dropped, as it was. */
	assert_non_null(strstr(v[LOG_BURST], "the first: refused uid 10: not allowed"));
	free_lines(v, n);
	/* Nothing left to report. */
	assert_int_equal(log_flush_suppressed(fake_now + 10 * LOG_SUMMARY_MS), -1);
}

static void test_summary_comes_before_the_sites_next_line(void **state)
{
	char **v;
	int n;

	for (int i = 0; i < LOG_BURST + 3; i++)
		refused(i);
	fake_now += LOG_REFILL_MS;
	refused(99);
	v = read_lines(&n);
	assert_int_equal(n, LOG_BURST + 2);
	assert_non_null(strstr(v[LOG_BURST], "3 similar lines suppressed"));
	assert_non_null(strstr(v[LOG_BURST + 1], "refused uid 99"));
	free_lines(v, n);
	assert_int_equal(log_flush_suppressed(fake_now), -1);
}

static void test_sites_have_buckets_of_their_own(void **state)
{
	char **v;
	int n;

	for (int i = 0; i < 1000; i++)
		refused(i);
	other_site(1);
	other_site(2);
	v = read_lines(&n);
	assert_int_equal(n, LOG_BURST + 2);
	assert_non_null(strstr(v[LOG_BURST], "client 1: something else"));
	assert_non_null(strstr(v[LOG_BURST + 1], "client 2: something else"));
	free_lines(v, n);
}

static void test_one_suppressed_line_is_singular(void **state)
{
	char **v;
	int n;

	for (int i = 0; i < LOG_BURST + 1; i++)
		refused(i);
	fake_now += LOG_SUMMARY_MS;
	log_flush_suppressed(fake_now);
	v = read_lines(&n);
	assert_int_equal(n, LOG_BURST + 1);
	assert_non_null(strstr(v[LOG_BURST], "1 similar line suppressed"));
	free_lines(v, n);
}

static void test_flush_all_reports_what_is_not_due_yet(void **state)
{
	char **v;
	int n;

	for (int i = 0; i < LOG_BURST + 5; i++)
		refused(i);
	fake_now += 1200;
	log_flush_all();
	v = read_lines(&n);
	assert_int_equal(n, LOG_BURST + 1);
	assert_non_null(strstr(v[LOG_BURST], "5 similar lines suppressed in the last 1.2 s"));
	free_lines(v, n);
	assert_int_equal(log_flush_suppressed(fake_now), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bucket_burst_then_one_per_refill),
		cmocka_unit_test(test_bucket_keeps_the_refill_remainder),
		cmocka_unit_test_setup_teardown(test_flood_writes_the_burst_and_one_summary,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_summary_comes_before_the_sites_next_line,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_sites_have_buckets_of_their_own,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_one_suppressed_line_is_singular,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_flush_all_reports_what_is_not_due_yet,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
