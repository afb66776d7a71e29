/* SPDX-License-Identifier: MIT */
/*
 * test_trace.c - the recommender trace (tools/kvbench/trace*.c): the
 * generator reproduces KuaiRand-1K's history statistics (median 3379, mean
 * 5038, max 49332 items per user, clipped to [10, 49332]) within 5% for
 * several seeds, is the same for the same seed and different for another,
 * cuts intervals at 60 s as the HSTU example does; a kvtrace file written
 * and read back is the same trace; the reader rejects bad files with a
 * message naming the line; the token model is 6 + 2 x min(items, 4096).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trace.h"

static void generate(struct trace *t, uint32_t users, uint32_t days, uint64_t seed)
{
	struct trace_gen_opts o = { .users = users, .days = days, .first_date = 20220408,
				    .seed = seed };
	char err[256] = "";

	if (trace_generate(t, &o, err, sizeof(err)))
		fail_msg("trace_generate: %s", err);
}

static void within(double got, double want, double tol, const char *what, uint64_t seed)
{
	if (got < want * (1 - tol) || got > want * (1 + tol))
		fail_msg("seed %llu: %s %.1f is not within %.0f%% of %.1f",
			 (unsigned long long)seed, what, got, tol * 100, want);
}

static void test_generator_reproduces_kuairand_history_statistics_within_5_percent(void **st)
{
	static const uint64_t seeds[] = { 1, 2, 42, 20221121 };

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		struct trace t;
		struct trace_stats s;

		generate(&t, 1000, 31, seeds[i]);
		assert_int_equal(trace_stats(&t, &s), 0);
		assert_int_equal(s.users, 1000);
		assert_int_equal(s.days, 31);
		within(s.hist_median, TRACE_HIST_MEDIAN, 0.05, "median history", seeds[i]);
		within(s.hist_mean, TRACE_HIST_MEAN, 0.05, "mean history", seeds[i]);
		within(s.hist_max, TRACE_HIST_MAX, 0.05, "max history", seeds[i]);
		assert_true(s.hist_max <= TRACE_HIST_MAX);
		assert_true(s.hist_min >= TRACE_HIST_MIN);
		/* Two tokens per interaction, 6 of context, capped at 4096 items. */
		assert_int_equal(s.max_request_tokens, 6 + 2 * 4096);
		trace_free(&t);
	}
}

static void test_same_seed_same_trace_other_seed_other_trace(void **st)
{
	struct trace a, b, c;

	generate(&a, 40, 5, 9);
	generate(&b, 40, 5, 9);
	generate(&c, 40, 5, 10);
	assert_int_equal(a.n, b.n);
	assert_memory_equal(a.req, b.req, a.n * sizeof(*a.req));
	assert_true(a.n != c.n || memcmp(a.req, c.req, a.n * sizeof(*a.req)));
	trace_free(&a);
	trace_free(&b);
	trace_free(&c);
}

/* Replay order, begin = previous end of the key, and intervals of < 60 s. */
static void test_requests_are_in_replay_order_and_intervals_span_under_60s(void **st)
{
	struct trace t;
	uint64_t *last_ts;

	generate(&t, 100, 4, 3);
	last_ts = calloc(t.nkeys, sizeof(*last_ts));
	assert_non_null(last_ts);
	for (size_t i = 0; i < t.n; i++) {
		const struct trace_req *r = &t.req[i];

		if (i) {
			const struct trace_req *p = &t.req[i - 1];

			assert_true(p->date < r->date || (p->date == r->date && p->ts_ms <= r->ts_ms));
		}
		assert_true(r->end > r->begin);
		assert_true(r->kid < t.nkeys);
		if (r->begin)
			assert_true(r->ts_ms > last_ts[r->kid]);
		last_ts[r->kid] = r->ts_ms;
	}
	free(last_ts);
	trace_free(&t);
}

static void test_token_model_is_6_plus_2_per_item_capped_at_4096_items(void **st)
{
	assert_int_equal(trace_tokens(0), 6);
	assert_int_equal(trace_tokens(10), 26);
	assert_int_equal(trace_tokens(4096), 6 + 8192);
	assert_int_equal(trace_tokens(49332), 6 + 8192);
	assert_true(trace_key(1, 20220408) != trace_key(1, 20220409));
}

static void test_kvtrace_written_and_read_back_is_the_same_trace(void **st)
{
	struct trace a, b;
	char err[256] = "";
	FILE *f = tmpfile();

	assert_non_null(f);
	generate(&a, 30, 3, 5);
	assert_int_equal(trace_write(&a, f), 0);
	rewind(f);
	if (trace_read(&b, f, "tmp", err, sizeof(err)))
		fail_msg("trace_read: %s", err);
	assert_int_equal(a.n, b.n);
	assert_int_equal(a.nkeys, b.nkeys);
	for (size_t i = 0; i < a.n; i++) {
		assert_int_equal(a.req[i].ts_ms, b.req[i].ts_ms);
		assert_int_equal(a.req[i].user, b.req[i].user);
		assert_int_equal(a.req[i].date, b.req[i].date);
		assert_int_equal(a.req[i].end, b.req[i].end);
		assert_int_equal(a.req[i].begin, b.req[i].begin);
	}
	fclose(f);
	trace_free(&a);
	trace_free(&b);
}

static void expect_bad(const char *text, const char *want)
{
	struct trace t;
	char err[256] = "";
	FILE *f = tmpfile();

	assert_non_null(f);
	fputs(text, f);
	rewind(f);
	assert_int_equal(trace_read(&t, f, "bad.kvtrace", err, sizeof(err)), -EINVAL);
	if (!strstr(err, want))
		fail_msg("message '%s' does not say '%s'", err, want);
	fclose(f);
}

static void test_reader_rejects_bad_files_naming_the_line(void **st)
{
	expect_bad("date ts user end\n", "not a kvtrace 1 file");
	expect_bad("# kvtrace 1\n20220408 1000 1\n", "bad.kvtrace:2:");
	expect_bad("# kvtrace 1\n20220408 1000 1 2 5:1\n", "1 events listed");
	expect_bad("# kvtrace 1\n20220408 1000 1 2 5:1 6:999\n", "bad.kvtrace:2:");
	expect_bad("# kvtrace 1\n20220408 1000 1 3\n20220408 2000 1 3\n", "not past the previous end");
	expect_bad("# kvtrace 1\n# only comments\n", "no requests");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_generator_reproduces_kuairand_history_statistics_within_5_percent),
		cmocka_unit_test(test_same_seed_same_trace_other_seed_other_trace),
		cmocka_unit_test(test_requests_are_in_replay_order_and_intervals_span_under_60s),
		cmocka_unit_test(test_token_model_is_6_plus_2_per_item_capped_at_4096_items),
		cmocka_unit_test(test_kvtrace_written_and_read_back_is_the_same_trace),
		cmocka_unit_test(test_reader_rejects_bad_files_naming_the_line),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
