/* SPDX-License-Identifier: MIT */
/*
 * engine_report.c - `kvbench engine`'s options and report: the command line
 * into struct opts (with the size checks that need the machine's memory),
 * and the results as a table or as one JSON object. The measurements are in
 * bench_engine.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_report.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

#define SUB "engine"

static uint64_t phys_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);

	return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
}

/* ---------------------------------------------------------------- report */

static void json_scenario(struct json *j, const char *key, const struct scenario *sc,
			  const struct opts *o)
{
	const struct kvp_stats *d = &sc->delta;

	json_obj_begin(j, key);
	json_u64(j, "device_frames", sc->device_frames);
	json_u64(j, "host_frames", sc->host_frames);
	json_u64(j, "warmup_ops", 3 * sc->warm_steps);
	json_u64(j, "ops", 3 * sc->steps);
	json_f64(j, "seconds", sc->seconds, 6);
	json_f64(j, "ops_per_s", sc->rate, 0);
	json_f64(j, "ops_per_s_overall", ops_per_s(3 * sc->steps, sc->seconds), 0);
	json_f64(j, "ops_per_s_min", sc->rate_min, 0);
	json_f64(j, "ops_per_s_max", sc->rate_max, 0);
	json_u64(j, "slices", sc->slices);
	json_u64(j, "timed_ops", 3 * sc->timed_steps);
	json_f64(j, "timed_ops_per_s", ops_per_s(3 * sc->timed_steps, sc->timed_seconds), 0);
	json_u64(j, "p50_ns", sc->all.p50);
	json_u64(j, "p99_ns", sc->all.p99);
	json_summary(j, "all", &sc->all);
	json_summary(j, "prepare", &sc->prepare);
	json_summary(j, "commit", &sc->commit);
	json_summary(j, "release", &sc->release);
	json_u64(j, "evicted_users", d->evicted_users);
	json_u64(j, "evicted_pages", d->evicted_pages);
	json_u64(j, "demoted_users", d->demoted_users);
	json_u64(j, "demoted_pages", d->demoted_pages);
	json_u64(j, "onloaded_pages", d->onloaded_pages);
	json_u64(j, "trimmed_pages", d->trimmed_pages);
	json_u64(j, "bytes_d2h", d->bytes_d2h);
	json_u64(j, "bytes_h2d", d->bytes_h2d);
	json_u64(j, "hit_tokens", d->hit_tokens);
	json_u64(j, "prepares", d->prepares);
	json_u64(j, "users_resident", d->users);
	json_str(j, "engine_check", sc->check_msg);
	json_obj_end(j);
	(void)o;
}

void engine_print_json(const struct opts *o, const struct kvb_machine *m,
		       const struct summary *tov, const struct scenario *sc,
		       const struct append_result *ar)
{
	char meta[256], app[256];
	struct json j;
	uint64_t i;

	kvp_layout_format(&o->meta, meta, sizeof(meta));
	kvp_layout_format(&o->append, app, sizeof(app));
	kvb_json_begin(&j, "engine");
	if (o->do_meta) {
		json_f64(&j, "ops_per_s", sc[0].rate, 0);
		json_u64(&j, "p50_ns", sc[0].all.p50);
		json_u64(&j, "p99_ns", sc[0].all.p99);
	} else {
		json_null(&j, "ops_per_s");
		json_null(&j, "p50_ns");
		json_null(&j, "p99_ns");
	}
	if (o->do_append)
		json_f64(&j, "append_ratio_vs_memcpy", ar->gbps[COPY_APPEND] / ar->gbps[COPY_MEMCPY], 4);
	else
		json_null(&j, "append_ratio_vs_memcpy");
	json_obj_begin(&j, "timer");
	json_str(&j, "clock", "CLOCK_MONOTONIC");
	json_u64(&j, "overhead_p50_ns", tov->p50);
	json_u64(&j, "overhead_p99_ns", tov->p99);
	json_f64(&j, "overhead_mean_ns", tov->mean, 1);
	json_obj_end(&j);
	json_obj_begin(&j, "config");
	json_u64(&j, "users", o->users);
	if (o->seconds > 0)
		json_f64(&j, "seconds", o->seconds, 3);
	else
		json_u64(&j, "ops", o->ops);
	json_u64(&j, "max_pages", o->max_pages);
	json_str(&j, "layout", meta);
	json_u64(&j, "page_bytes", o->meta.page_bytes);
	json_str(&j, "append_layout", app);
	json_u64(&j, "append_mib", o->append_mib);
	json_u64(&j, "reps", o->reps);
	json_u64(&j, "seed", o->seed);
	json_obj_end(&j);
	if (o->do_meta) {
		json_scenario(&j, "no_eviction", &sc[0], o);
		json_scenario(&j, "eviction", &sc[1], o);
	}
	if (o->do_append) {
		json_obj_begin(&j, "append");
		json_str(&j, "layout", app);
		json_u64(&j, "bytes", ar->bytes);
		json_u64(&j, "tokens", ar->tokens);
		json_u64(&j, "pages", ar->pages);
		json_u64(&j, "row_bytes", o->append.token_stride);
		json_u64(&j, "reps", o->reps);
		json_f64(&j, "gbps", ar->gbps[COPY_APPEND], 3);
		json_f64(&j, "sequential_gbps", ar->gbps[COPY_APPEND_SEQ], 3);
		json_f64(&j, "memcpy_gbps", ar->gbps[COPY_MEMCPY], 3);
		json_f64(&j, "rows_memcpy_gbps", ar->gbps[COPY_ROWS], 3);
		json_f64(&j, "ratio", ar->gbps[COPY_APPEND] / ar->gbps[COPY_MEMCPY], 4);
		json_bool(&j, "verified", ar->verified);
		json_arr_begin(&j, "gbps_all");
		for (i = 0; i < o->reps; i++)
			json_f64(&j, NULL, ar->gbps_all[COPY_APPEND][i], 3);
		json_arr_end(&j);
		json_arr_begin(&j, "memcpy_gbps_all");
		for (i = 0; i < o->reps; i++)
			json_f64(&j, NULL, ar->gbps_all[COPY_MEMCPY][i], 3);
		json_arr_end(&j);
		json_obj_end(&j);
	}
	kvb_json_end(&j, m);
}

static void print_scenario_row(const struct scenario *sc)
{
	char frames[32];

	snprintf(frames, sizeof(frames), "%u/%u", sc->device_frames, sc->host_frames);
	printf("%-12s %13s %10" PRIu64 " %11.0f  %6" PRIu64 " %6" PRIu64
	       "  %6" PRIu64 " %6" PRIu64 "  %6" PRIu64 " %6" PRIu64 "  %6" PRIu64 " %6" PRIu64 "\n",
	       sc->name, frames, 3 * sc->steps, sc->rate,
	       sc->all.p50, sc->all.p99, sc->prepare.p50, sc->prepare.p99,
	       sc->commit.p50, sc->commit.p99, sc->release.p50, sc->release.p99);
}

void engine_print_table(const struct opts *o, const struct kvb_machine *m,
			const struct summary *tov, const struct scenario *sc,
			const struct append_result *ar)
{
	char spec[256];
	int k;

	printf("kvbench engine on %s (%ld CPUs), ", m->cpu_model, m->nproc);
	if (m->cpu >= 0)
		printf("pinned to CPU %d", m->cpu);
	else
		printf("not pinned");
	printf(", clocksource %s\n", m->clocksource[0] ? m->clocksource : "?");
	printf("timer: an empty timed region costs p50 %" PRIu64 " ns, p99 %" PRIu64
	       " ns (included in every latency below)\n", tov->p50, tov->p99);

	if (o->do_meta) {
		kvp_layout_format(&o->meta, spec, sizeof(spec));
		printf("\nmetadata path: %s (%" PRIu64 " B/page)\n", spec, o->meta.page_bytes);
		printf("  users: %" PRIu64 " round-robin; a page (%u tokens) per prepare; "
		       "history cap: %" PRIu64 " pages\n"
		       "  ops/s: the median of %u slices of an untimed pass; latencies: a timed pass\n",
		       o->users, o->meta.page_tokens, o->max_pages, sc[0].slices);
		printf("%-12s %13s %10s %11s  %13s  %13s  %13s  %13s\n", "", "frames", "",
		       "", "all ops, ns", "prepare, ns", "commit, ns", "release, ns");
		printf("%-12s %13s %10s %11s  %6s %6s  %6s %6s  %6s %6s  %6s %6s\n", "scenario",
		       "device/host", "ops", "ops/s", "p50", "p99", "p50", "p99", "p50", "p99",
		       "p50", "p99");
		print_scenario_row(&sc[0]);
		print_scenario_row(&sc[1]);
		for (k = 0; k < 2; k++) {
			const struct kvp_stats *d = &sc[k].delta;
			double steps = (double)(sc[k].steps + sc[k].timed_steps);

			printf("  %s: %" PRIu64 " users evicted (%.3f/prepare), %" PRIu64
			       " demoted (%.3f/prepare), %" PRIu64 " pages onloaded, %" PRIu64
			       " trimmed; engine_check: %s\n", sc[k].name,
			       d->evicted_users, d->evicted_users / steps, d->demoted_users,
			       d->demoted_users / steps, d->onloaded_pages, d->trimmed_pages,
			       sc[k].check_msg);
		}
	}
	if (o->do_append) {
		kvp_layout_format(&o->append, spec, sizeof(spec));
		printf("\nappend: %s\n", spec);
		printf("  %" PRIu64 " tokens into %" PRIu64 " pages (%.1f MiB), rows of %" PRIu64
		       " B, median of %" PRIu64 " run(s); read-back check: %s\n",
		       ar->tokens, ar->pages, ar->bytes / 1048576.0, o->append.token_stride,
		       o->reps, ar->verified ? "ok" : "FAILED");
		printf("  %-36s %8.2f GB/s\n", "kvp_append_cpu, shuffled pages", ar->gbps[COPY_APPEND]);
		printf("  %-36s %8.2f GB/s\n", "kvp_append_cpu, pages in order",
		       ar->gbps[COPY_APPEND_SEQ]);
		printf("  %-36s %8.2f GB/s\n", "memcpy, same bytes and buffers", ar->gbps[COPY_MEMCPY]);
		printf("  %-36s %8.2f GB/s\n", "memcpy, one row at a time", ar->gbps[COPY_ROWS]);
		printf("  %-36s %8.3f\n", "append / memcpy", ar->gbps[COPY_APPEND] / ar->gbps[COPY_MEMCPY]);
	}
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench engine [options]\n"
"\n"
"Measure the engine in-process on one core: the metadata path (prepare +\n"
"commit + release, no data written) without and with eviction pressure, and\n"
"kvp_append_cpu() against memcpy() of the same bytes.\n"
"\n"
"Options:\n"
"  --users N          users served round-robin (default 10000)\n"
"  --ops N            ops per pass and scenario; a step is 3 ops\n"
"                     (default 2M; suffixes k, M, G multiply by 10^3, 10^6, 10^9)\n"
"  --seconds S        run the untimed pass for S seconds instead of --ops\n"
"  --max-pages N      history cap in pages per user (default 4)\n"
"  --layout SPEC      layout of both parts (default for the metadata path:\n"
"                     " DEFAULT_META_LAYOUT ")\n"
"  --append-layout SPEC\n"
"                     layout of the append part only (default, unless --layout:\n"
"                     " DEFAULT_APPEND_LAYOUT ")\n"
"  --append-mib N     device tier the append fills, MiB (default 256)\n"
"  --reps N           append repetitions, the median counts (default 7)\n"
"  --only PART        run only 'metadata' or only 'append'\n"
"  --seed N           seed for user ids and the page shuffle (default 1)\n"
"  --cpu N|none       pin to CPU N (default: the CPU kvbench starts on)\n"
KVB_USAGE_END_OPTS
"\n"
"A layout SPEC is layers=L,kv_heads=H,head_dim=D,dtype=bf16|fp16|fp8_e4m3|fp32,\n"
"page_tokens=P (all five keys). See kvbench(1).\n");
}

enum {
	OPT_USERS = 256, OPT_OPS, OPT_SECONDS, OPT_MAX_PAGES, OPT_LAYOUT,
	OPT_APPEND_LAYOUT, OPT_APPEND_MIB, OPT_REPS, OPT_ONLY, OPT_SEED, OPT_CPU,
};

static const struct option long_opts[] = {
	{ "users", required_argument, NULL, OPT_USERS },
	{ "ops", required_argument, NULL, OPT_OPS },
	{ "seconds", required_argument, NULL, OPT_SECONDS },
	{ "max-pages", required_argument, NULL, OPT_MAX_PAGES },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "append-layout", required_argument, NULL, OPT_APPEND_LAYOUT },
	{ "append-mib", required_argument, NULL, OPT_APPEND_MIB },
	{ "reps", required_argument, NULL, OPT_REPS },
	{ "only", required_argument, NULL, OPT_ONLY },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "cpu", required_argument, NULL, OPT_CPU },
	KVB_LONG_OPTS_END,
};

/* A layout SPEC into *l: -1 to go on, else KVB_EXIT_USAGE (kvb_opt_fn). */
static int layout_opt(const char *opt, const char *arg, struct kvp_layout *l)
{
	char err[KVP_ERRLEN] = "";

	if (kvp_layout_parse(l, arg, err, sizeof(err)) < 0)
		return kvb_usage_error(SUB, "%s: %s", opt, err[0] ? err : "bad layout");
	return -1;
}

/*
 * Sizes the engine would reject later with a less direct message, or that
 * this machine cannot hold. Returns -1 to go on, else the exit status.
 */
static int check_sizes(const struct opts *o)
{
	double phys_mib = (double)phys_bytes() / 1048576.0;

	if (o->do_meta) {
		uint64_t frames = o->users * (o->max_pages + 1);
		/* Both tiers of the eviction scenario get written: they must fit. */
		double evict_mib = 2.0 * (double)((o->users * o->max_pages + 3) / 4) *
				   (double)o->meta.page_bytes / 1048576.0;

		if (frames > UINT32_MAX)
			return kvb_usage_error(SUB, "--users %" PRIu64 " x (--max-pages %" PRIu64
					       " + 1) = %" PRIu64 " frames: more than a tier"
					       " holds (2^32 - 1)",
					       o->users, o->max_pages, frames);
		if (evict_mib > phys_mib * 0.75)
			return kvb_usage_error(SUB, "the eviction scenario needs %.0f MiB of tier"
					       " memory (pages of %" PRIu64 " B) and this machine"
					       " has %.0f MiB; lower --users or --max-pages",
					       evict_mib, o->meta.page_bytes, phys_mib);
	}
	if (o->do_append) {
		uint64_t pages = o->append_mib * (1ull << 20) / o->append.page_bytes;

		if (pages == 0)
			return kvb_usage_error(SUB, "--append-mib %" PRIu64 " holds no page of %"
					       PRIu64 " B; raise it",
					       o->append_mib, o->append.page_bytes);
		if (pages * o->append.page_tokens > UINT32_MAX)
			return kvb_usage_error(SUB, "--append-mib %" PRIu64 ": more tokens than one"
					       " append takes (2^32 - 1)", o->append_mib);
		if (2.0 * (double)o->append_mib > phys_mib * 0.75)
			return kvb_usage_error(SUB, "--append-mib %" PRIu64 " needs twice that in"
					       " memory and this machine has %.0f MiB",
					       o->append_mib, phys_mib);
	}
	return -1;
}

struct parse {
	struct opts *o;
	bool have_ops, have_append_layout;
};

static int one_opt(void *ctx, int c, const char *arg)
{
	struct parse *p = ctx;
	struct opts *o = p->o;
	int rc;

	switch (c) {
	case OPT_USERS:
		return kvb_opt_count(SUB, "--users", arg, 1, 1u << 26, &o->users);
	case OPT_OPS:
		p->have_ops = true;
		return kvb_opt_count(SUB, "--ops", arg, 3, 1ull << 40, &o->ops);
	case OPT_SECONDS:
		return kvb_opt_seconds(SUB, "--seconds", arg, &o->seconds);
	case OPT_MAX_PAGES:
		return kvb_opt_count(SUB, "--max-pages", arg, 1, 1024, &o->max_pages);
	case OPT_LAYOUT:
		rc = layout_opt("--layout", arg, &o->meta);
		if (rc < 0 && !p->have_append_layout)
			o->append = o->meta;
		return rc;
	case OPT_APPEND_LAYOUT:
		p->have_append_layout = true;
		return layout_opt("--append-layout", arg, &o->append);
	case OPT_APPEND_MIB:
		return kvb_opt_count(SUB, "--append-mib", arg, 1, 1u << 20, &o->append_mib);
	case OPT_REPS:
		return kvb_opt_count(SUB, "--reps", arg, 1, 1000, &o->reps);
	case OPT_ONLY:
		if (!strcmp(arg, "metadata"))
			o->do_append = false;
		else if (!strcmp(arg, "append"))
			o->do_meta = false;
		else
			return kvb_usage_error(SUB, "--only: '%s' is not a part; use 'metadata' or 'append'",
					       arg);
		return -1;
	case OPT_SEED:
		return kvb_opt_count(SUB, "--seed", arg, 0, UINT64_MAX, &o->seed);
	case OPT_CPU:
		return kvb_opt_cpu(SUB, arg, &o->cpu);
	}
	return -1;
}

/* Parse argv into *o; returns -1 to go on, else the exit status. */
int engine_parse_opts(int argc, char **argv, struct opts *o)
{
	struct parse p = { .o = o };
	char layout_err[KVP_ERRLEN] = "";
	int rc;

	memset(o, 0, sizeof(*o));
	o->users = 10000;
	o->ops = 2000000;
	o->max_pages = 4;
	o->append_mib = 256;
	o->reps = 7;
	o->seed = 1;
	o->cpu = KVB_CPU_CURRENT;
	o->do_meta = o->do_append = true;
	if (kvp_layout_parse(&o->meta, DEFAULT_META_LAYOUT, layout_err, sizeof(layout_err)) < 0 ||
	    kvp_layout_parse(&o->append, DEFAULT_APPEND_LAYOUT, layout_err, sizeof(layout_err)) < 0) {
		fprintf(stderr, "kvbench engine: the default layout does not parse: %s\n", layout_err);
		return KVB_EXIT_FAIL;
	}

	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, &p, &o->json);
	if (rc >= 0)
		return rc;
	if (p.have_ops && o->seconds > 0)
		return kvb_usage_error(SUB, "--ops and --seconds both given; pick one");
	if (o->seconds > 0)
		o->ops = 0;

	return check_sizes(o);
}
