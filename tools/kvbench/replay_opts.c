/* SPDX-License-Identifier: MIT */
/*
 * replay_opts.c - `kvbench replay`'s options: the usage text, each
 * option checked with an error naming it, and the combinations that do not
 * go together (--backend cuda with other systems, --trace with --hstu,
 * --socket with the flags of a kvpoold started here).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvbench.h"
#include "replay.h"

#define SUB "replay"
#define DEFAULT_LAYOUT "layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench replay [options]\n"
"\n"
"Replay a recommender trace (KuaiRand-1K-like, generated from --seed unless\n"
"--trace or --hstu names one) the way the HSTU example drives its KV cache:\n"
"per batch info, prepare from start+len, append, commit, release. Runs kvpool\n"
"(rings), the engine in-process, the same kvpoold over its Unix socket, and\n"
"Redis, each from empty on the same trace, and reports token hit rates\n"
"against their bounds, latencies, KV bytes served per second and ratios.\n"
"\n"
"Trace:\n"
"  --users N          users of the generated trace (default 1000)\n"
"  --days N           days it spans (default 31)\n"
"  --seed N           its seed (default 1)\n"
"  --trace FILE       read a kvtrace file instead (kvbench trace -o FILE)\n"
"  --hstu DIR         read the HSTU example's processed_*.csv in DIR instead\n"
"  --first-days N     replay only the first N days (default all)\n"
"  --requests N       replay at most N requests (default all)\n"
"Run:\n"
"  --pipelines N      pipeline processes (default 4)\n"
"  --batch N          requests per batch (default 8)\n"
"  --device-frac F    device tier as a share of the working set (default 0.25)\n"
"  --host-frac F      host tier likewise (default 0.25; 0: none)\n"
"  --device-pages N, --host-pages N\n"
"                     the tiers in pages instead\n"
"  --layout SPEC      geometry (default " DEFAULT_LAYOUT ";\n"
"                     with --backend cuda HSTU's " REPLAY_HSTU_LAYOUT ")\n"
"  --systems LIST     of kvpool,inproc,uds,redis (default all)\n"
"  --backend NAME     shm (default) or cuda: kvpool alone on a kvpoold\n"
"                     --backend=cuda, appends from device memory on a stream per\n"
"                     pipeline, offload GB/s against raw pinned cudaMemcpyAsync%s\n"
"  --socket PATH      use the kvpoold at PATH instead of starting one per system\n"
"                     (its tiers and layout are used as they are)\n"
"  --kvpoold PATH     the kvpoold to start (default: next to kvbench)\n"
"  --workers N        workers (and shards) of the kvpoold started here\n"
"                     (default: its own, 1)\n"
"  --daemon-flag --KEY=VALUE\n"
"                     one more kvpoold flag for it (up to 4; e.g.\n"
"                     --daemon-flag=--reclaim_boost=yes)\n"
"  --redis HOST:PORT  use a running Redis instead of starting redis-server\n"
"  --redis-server PATH\n"
"                     the redis-server to start (default: redis-server on PATH)\n"
"Output:\n"
"  --md FILE          also write a markdown summary to FILE\n"
"  --plot-dir DIR     also write hitrate.dat and cdf.dat (gnuplot input) to DIR\n"
"  --no-targets       leave out the Targets section (they are set for the GPU\n"
"                     machine's 16 cores; scripts/demo.sh runs anywhere)\n"
KVB_USAGE_END_OPTS
"\n"
"A progress bar goes to stderr when it is a terminal. Counts take k, M or G\n"
"suffixes. See kvbench(1), REPLAY.%s\n",
		REPLAY_CUDA ? "" : "\n                     (not in this build: built without CUDA)",
		KVBENCH_HAVE_HIREDIS ? "" : "\nRedis: " REPLAY_NO_HIREDIS "; it is skipped.");
}

enum {
	OPT_TRACE = 256, OPT_HSTU, OPT_FIRST_DAYS,
	OPT_REQUESTS, OPT_PIPELINES, OPT_BATCH, OPT_DEVICE_FRAC, OPT_HOST_FRAC,
	OPT_DEVICE_PAGES, OPT_HOST_PAGES, OPT_LAYOUT, OPT_SYSTEMS, OPT_REDIS,
	OPT_REDIS_SERVER, OPT_MD, OPT_PLOT_DIR, OPT_BACKEND, OPT_NO_TARGETS,
};

static const struct option long_opts[] = {
	TRACE_GEN_LONG_OPTS,
	{ "trace", required_argument, NULL, OPT_TRACE },
	{ "hstu", required_argument, NULL, OPT_HSTU },
	{ "first-days", required_argument, NULL, OPT_FIRST_DAYS },
	{ "requests", required_argument, NULL, OPT_REQUESTS },
	{ "pipelines", required_argument, NULL, OPT_PIPELINES },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "device-frac", required_argument, NULL, OPT_DEVICE_FRAC },
	{ "host-frac", required_argument, NULL, OPT_HOST_FRAC },
	{ "device-pages", required_argument, NULL, OPT_DEVICE_PAGES },
	{ "host-pages", required_argument, NULL, OPT_HOST_PAGES },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "systems", required_argument, NULL, OPT_SYSTEMS },
	{ "redis", required_argument, NULL, OPT_REDIS },
	{ "redis-server", required_argument, NULL, OPT_REDIS_SERVER },
	{ "md", required_argument, NULL, OPT_MD },
	{ "plot-dir", required_argument, NULL, OPT_PLOT_DIR },
	{ "no-targets", no_argument, NULL, OPT_NO_TARGETS },
	{ "backend", required_argument, NULL, OPT_BACKEND },
	{ "workers", required_argument, NULL, KVB_OPT_WORKERS },
	KVB_DAEMON_LONG_OPTS,
	KVB_LONG_OPTS_END,
};

static int opt_frac(const char *opt, const char *arg, double *out)
{
	char *end;
	double v = strtod(arg, &end);

	if (end == arg || *end || !(v >= 0 && v <= 16))
		return kvb_usage_error(SUB, "%s: '%s' is not a share in [0, 16]", opt, arg);
	*out = v;
	return -1;
}

static int opt_systems(const char *arg, uint32_t *out)
{
	char buf[256], *save = NULL, *w;

	snprintf(buf, sizeof(buf), "%s", arg);
	*out = 0;
	for (w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		int k;

		for (k = 0; k < NSYS && strcmp(w, rsys_name[k]); k++)
			;
		if (k == NSYS)
			return kvb_usage_error(SUB, "--systems: unknown system '%s'; valid: "
					       "kvpool, inproc, uds, redis", w);
		*out |= 1u << k;
	}
	if (!*out)
		return kvb_usage_error(SUB, "--systems: name at least one system");
	return -1;
}

static int one_opt(void *ctx, int c, const char *arg)
{
	struct ropts *o = ctx;
	char err[KVP_ERRLEN];
	int rc = trace_gen_opt(SUB, &o->gen, c, arg);

	if (rc != -2)
		return rc;
	switch (c) {
	case OPT_TRACE:
		o->trace_path = arg;
		return -1;
	case OPT_HSTU:
		o->hstu_dir = arg;
		return -1;
	case OPT_FIRST_DAYS:
		return kvb_opt_count(SUB, "--first-days", arg, 1, 3660, &o->first_days);
	case OPT_REQUESTS:
		return kvb_opt_count(SUB, "--requests", arg, 1, UINT32_MAX, &o->max_requests);
	case OPT_PIPELINES:
		return kvb_opt_count(SUB, "--pipelines", arg, 1, 256, &o->pipelines);
	case OPT_BATCH:
		return kvb_opt_count(SUB, "--batch", arg, 1, 4096, &o->batch);
	case OPT_DEVICE_FRAC:
		return opt_frac("--device-frac", arg, &o->device_frac);
	case OPT_HOST_FRAC:
		return opt_frac("--host-frac", arg, &o->host_frac);
	case OPT_DEVICE_PAGES:
		return kvb_opt_count(SUB, "--device-pages", arg, 1, UINT32_MAX, &o->device_pages);
	case OPT_HOST_PAGES:
		return kvb_opt_count(SUB, "--host-pages", arg, 0, UINT32_MAX, &o->host_pages);
	case OPT_LAYOUT:
		if (kvp_layout_parse(&o->layout, arg, err, sizeof(err)) < 0)
			return kvb_usage_error(SUB, "--layout: %s", err);
		snprintf(o->layout_spec, sizeof(o->layout_spec), "%s", arg);
		o->layout_given = true;
		return -1;
	case OPT_BACKEND:
		if (!strcmp(arg, "shm")) {
			o->backend = RB_SHM;
		} else if (!strcmp(arg, "cuda")) {
			if (!REPLAY_CUDA)
				return kvb_usage_error(SUB, "--backend cuda: this kvbench was built "
						       "without CUDA (build with -DKVPOOL_CUDA=ON "
						       "where the CUDA toolkit is)");
			o->backend = RB_CUDA;
		} else {
			return kvb_usage_error(SUB, "--backend: '%s'; use shm or cuda", arg);
		}
		return -1;
	case OPT_SYSTEMS:
		return opt_systems(arg, &o->systems);
	case OPT_REDIS:
		if (!strchr(arg, ':') || atoi(strrchr(arg, ':') + 1) <= 0)
			return kvb_usage_error(SUB, "--redis: '%s' is not HOST:PORT", arg);
		o->redis = arg;
		return -1;
	case OPT_REDIS_SERVER:
		o->redis_server = arg;
		return -1;
	case OPT_MD:
		o->md_path = arg;
		return -1;
	case OPT_PLOT_DIR:
		o->plot_dir = arg;
		return -1;
	case OPT_NO_TARGETS:
		o->no_targets = true;
		return -1;
	default:
		return kvb_daemon_opt(SUB, c, arg, &o->d);
	}
}

int replay_parse_opts(int argc, char **argv, struct ropts *o)
{
	char err[KVP_ERRLEN];
	int rc;

	memset(o, 0, sizeof(*o));
	o->d.spin_us = -1;
	o->d.cpu = -1;
	o->gen = (struct trace_gen_opts){ .users = 1000, .days = 31, .first_date = 20220408,
					  .seed = 1 };
	o->pipelines = 4;
	o->batch = 8;
	o->device_frac = 0.25;
	o->host_frac = 0.25;
	o->systems = 0;
	o->redis_server = "redis-server";
	snprintf(o->layout_spec, sizeof(o->layout_spec), "%s", DEFAULT_LAYOUT);
	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, o, &o->json);
	if (rc >= 0)
		return rc;
	if (o->backend == RB_CUDA) {
		if (o->systems & ~(1u << SYS_KVPOOL))
			return kvb_usage_error(SUB, "--backend cuda runs the kvpool system alone "
					       "(inproc and uds append with the CPU into a mapped "
					       "tier, Redis holds host bytes); --systems kvpool or "
					       "leave it out");
		o->systems = 1u << SYS_KVPOOL;
		if (!o->layout_given)
			snprintf(o->layout_spec, sizeof(o->layout_spec), "%s", REPLAY_HSTU_LAYOUT);
	} else if (!o->systems) {
		o->systems = (1u << NSYS) - 1;
	}
	if (o->trace_path && o->hstu_dir)
		return kvb_usage_error(SUB, "--trace and --hstu both name a trace; give one");
	if (!o->layout.page_tokens &&
	    kvp_layout_parse(&o->layout, o->layout_spec, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvbench replay: the default layout does not parse: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	if (o->d.socket && (o->d.kvpoold || o->device_pages || o->host_pages))
		return kvb_usage_error(SUB, "--socket uses a running kvpoold; --kvpoold, "
				       "--device-pages and --host-pages only apply to one started here");
	o->progress = isatty(2);
	return -1;
}
