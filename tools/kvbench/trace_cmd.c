/* SPDX-License-Identifier: MIT */
/*
 * trace_cmd.c - `kvbench trace`: generate a KuaiRand-1K-like trace and write
 * it as a kvtrace file, or read one (kvtrace or the HSTU CSVs), and print
 * its statistics next to the dataset's. Nothing is measured.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "hstu_csv.h"
#include "kvbench.h"
#include "trace.h"

#define SUB "trace"

struct topts {
	struct trace_gen_opts gen;
	const char *out;
	const char *in;
	const char *hstu;
	bool json;
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench trace [options]\n"
"\n"
"Generate a KuaiRand-1K-like recommender trace from a seed (history per user\n"
"log-normal, median 3379 and mean 5038 items, clipped to [10, 49332]; sessions\n"
"at random times; intervals cut at 60 s as the HSTU example cuts them) and\n"
"write it with -o; or read a trace and print its statistics.\n"
"\n"
"Options:\n"
"  --users N          users (default 1000)\n"
"  --days N           days the trace spans (default 31)\n"
"  --seed N           seed (default 1)\n"
"  --first-date D     first date, YYYYMMDD (default 20220408)\n"
"  -o, --output FILE  write the generated trace there (kvtrace 1, see kvbench(1))\n"
"  --trace FILE       read a kvtrace file instead of generating\n"
"  --hstu DIR         read the HSTU example's processed_*.csv in DIR instead\n"
KVB_USAGE_END_OPTS);
}

enum { OPT_FIRST_DATE = 256, OPT_OUT, OPT_IN, OPT_HSTU };

static const struct option long_opts[] = {
	TRACE_GEN_LONG_OPTS,
	{ "first-date", required_argument, NULL, OPT_FIRST_DATE },
	{ "output", required_argument, NULL, OPT_OUT },
	{ "trace", required_argument, NULL, OPT_IN },
	{ "hstu", required_argument, NULL, OPT_HSTU },
	KVB_LONG_OPTS_END,
};

int trace_gen_opt(const char *sub, struct trace_gen_opts *gen, int code,
		  const char *arg)
{
	uint64_t v;
	int rc;

	switch (code) {
	case TRACE_OPT_USERS:
		rc = kvb_opt_count(sub, "--users", arg, 1, TRACE_MAX_USER, &v);
		gen->users = (uint32_t)v;
		return rc;
	case TRACE_OPT_DAYS:
		rc = kvb_opt_count(sub, "--days", arg, 1, 3660, &v);
		gen->days = (uint32_t)v;
		return rc;
	case TRACE_OPT_SEED:
		return kvb_opt_count(sub, "--seed", arg, 0, UINT64_MAX, &gen->seed);
	default:
		return -2;
	}
}

static int one_opt(void *ctx, int c, const char *arg)
{
	struct topts *o = ctx;
	uint64_t v;
	int rc = trace_gen_opt(SUB, &o->gen, c, arg);

	if (rc != -2)
		return rc;
	switch (c) {
	case OPT_FIRST_DATE:
		rc = kvb_opt_count(SUB, "--first-date", arg, 19700101, 99991231, &v);
		if (rc < 0 && (v / 100 % 100 < 1 || v / 100 % 100 > 12 || v % 100 < 1 ||
			       v % 100 > 31))
			return kvb_usage_error(SUB, "--first-date: '%s' is not a date YYYYMMDD", arg);
		o->gen.first_date = (uint32_t)v;
		return rc;
	case OPT_OUT:
		o->out = arg;
		return -1;
	case OPT_IN:
		o->in = arg;
		return -1;
	case OPT_HSTU:
		o->hstu = arg;
		return -1;
	default:
		return kvb_usage_error(SUB, "unknown option");
	}
}

static void print_stats(const struct topts *o, const struct trace *t,
			const struct trace_stats *s)
{
	if (o->json) {
		struct json j;
		struct kvb_machine m;

		kvb_machine_info(&m, -1);
		kvb_json_begin(&j, "trace");
		json_str(&j, "source", o->in ? o->in : o->hstu ? o->hstu : "generated");
		if (t->gen_users) {
			json_u64(&j, "seed", t->seed);
			json_u64(&j, "gen_users", t->gen_users);
			json_u64(&j, "gen_days", t->gen_days);
		}
		json_u64(&j, "requests", s->requests);
		json_u64(&j, "users", s->users);
		json_u64(&j, "days", s->days);
		json_u64(&j, "user_days", s->keys);
		json_u64(&j, "items", s->items);
		json_u64(&j, "history_min", s->hist_min);
		json_u64(&j, "history_median", s->hist_median);
		json_f64(&j, "history_mean", s->hist_mean, 1);
		json_u64(&j, "history_max", s->hist_max);
		json_f64(&j, "items_per_request", s->items_per_request, 3);
		json_f64(&j, "requests_per_user_day", s->requests_per_key, 3);
		json_u64(&j, "tokens_needed", s->tokens_needed);
		json_u64(&j, "max_request_tokens", s->max_request_tokens);
		if (o->out)
			json_str(&j, "written", o->out);
		kvb_json_end(&j, &m);
		return;
	}
	printf("trace: %s\n", o->in ? o->in : o->hstu ? o->hstu : "generated");
	printf("  %zu requests (intervals), %u users, %u days, %u user-days, %llu items\n",
	       s->requests, s->users, s->days, s->keys, (unsigned long long)s->items);
	printf("  history per user:  min %u, median %u, mean %.0f, max %u items\n",
	       s->hist_min, s->hist_median, s->hist_mean, s->hist_max);
	printf("  KuaiRand-1K:       min %u, median %.0f, mean %.0f, max %u items\n",
	       TRACE_HIST_MIN, TRACE_HIST_MEDIAN, TRACE_HIST_MEAN, TRACE_HIST_MAX);
	printf("  %.2f new items per request, %.1f requests per user-day; %llu tokens needed "
	       "in all (6 + 2 x min(history, 4096) each), at most %llu in one request\n",
	       s->items_per_request, s->requests_per_key,
	       (unsigned long long)s->tokens_needed, (unsigned long long)s->max_request_tokens);
	if (o->out)
		printf("  written to %s\n", o->out);
}

int cmd_trace(int argc, char **argv)
{
	struct topts o = { .gen = { .users = 1000, .days = 31, .first_date = 20220408,
				    .seed = 1 } };
	struct trace t;
	struct trace_stats s;
	char err[1024] = "";
	int rc;

	/* -o is the one short option: map it to --output for kvb_parse_opts. */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "-o"))
			argv[i] = (char *)"--output";
	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, &o, &o.json);
	if (rc >= 0)
		return rc;
	if ((o.in || o.hstu) && o.out)
		return kvb_usage_error(SUB, "-o writes a generated trace; it does not convert "
				       "--trace or --hstu input");
	if (o.in && o.hstu)
		return kvb_usage_error(SUB, "--trace and --hstu both name a trace; give one");
	if (o.in) {
		FILE *f = fopen(o.in, "r");

		if (!f) {
			fprintf(stderr, "kvbench trace: --trace %s: %s\n", o.in, strerror(errno));
			return KVB_EXIT_FAIL;
		}
		rc = trace_read(&t, f, o.in, err, sizeof(err));
		fclose(f);
	} else if (o.hstu) {
		rc = hstu_load_dir(&t, o.hstu, err, sizeof(err));
	} else {
		rc = trace_generate(&t, &o.gen, err, sizeof(err));
	}
	if (rc) {
		fprintf(stderr, "kvbench trace: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	if (o.out) {
		FILE *f = fopen(o.out, "w");

		if (!f || trace_write(&t, f) || fclose(f)) {
			fprintf(stderr, "kvbench trace: -o %s: %s\n", o.out, strerror(errno));
			trace_free(&t);
			return KVB_EXIT_FAIL;
		}
	}
	if (trace_stats(&t, &s)) {
		fprintf(stderr, "kvbench trace: out of memory for the statistics\n");
		trace_free(&t);
		return KVB_EXIT_FAIL;
	}
	print_stats(&o, &t, &s);
	trace_free(&t);
	return KVB_EXIT_OK;
}
