/* SPDX-License-Identifier: MIT */
/*
 * bench_prefix.c - `kvbench prefix`: sharing KV between requests on the
 * workloads of WORKLOADS.md section 2 (multi-turn, RAG, multi-agent).
 *
 * The traces come from --seed (prefix_workload.c), with the best hit rate
 * each allows computed exactly from the trace. They are replayed twice:
 * in-process against the engine ("inproc": share_* called directly) and
 * through a private kvpoold with the client library ("kvpoold"); each
 * workload on a fresh pool smaller than its working set by default, so
 * eviction matters (bench_prefix_run.c). The report's top-level figures
 * come from the kvpoold run when it ran, else from inproc ("source").
 *
 * --gpu measures something else (bench_prefix_gpu.c, CUDA builds only):
 * recomputing a 4,000-token context with cuBLAS GEMMs of Llama-3-8B's
 * shapes against getting its KV from the cache.
 *
 * This file parses the options, runs the parts and prints the report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"
#include "prefix_bench.h"
#include "stats.h"

#define SUB "prefix"

static const char *const best_definition =
	"the hit rate of an unbounded cache on the same trace: multi-turn, each "
	"prompt's longest run of leading full pages published by an earlier turn "
	"(prompt and reply), a prompt cached whole counting n-1 tokens; chunk workloads, "
	"every use of a system or context chunk after its first (queries are fresh)";

static const char *const belady_definition =
	"the hit rate of Belady's MIN on the same trace with the run's pool_pages: "
	"page granularity, on a miss evict the page used farthest in the future "
	"(ties: the deeper page of its chain first), a request's pages pinned while "
	"it is served; hits counted as the run counts them: multi-turn, a page only "
	"when every page before it in the prompt hit too (the hash chain), capped at "
	"n-1 tokens; chunk workloads, a chunk only when all of its pages are cached";

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench prefix [options]\n"
"       kvbench prefix --gpu [options]\n"
"\n"
"Replay the multi-turn, RAG and multi-agent workloads (generated from --seed)\n"
"against the prefix cache and chunks, in-process and through a private kvpoold,\n"
"each on a pool smaller than its working set; report the hit rate against the\n"
"best possible for the trace (unbounded, and Belady's MIN with the same pool),\n"
"pages saved by dedupe and compose latency.\n"
"\n"
"Workloads (0 requests skips one):\n"
"  --seed N             trace seed (default 1)\n"
"  --conversations N    multi-turn conversations (default 200)\n"
"  --active N           conversations in flight at once (default 32)\n"
"  --turns N            most turns of a conversation, at least 2 (default 12)\n"
"  --systems N          system prompts the conversations share (default 4)\n"
"  --rag-requests N     RAG requests (default 2000)\n"
"  --library N          RAG context chunks (default 10000)\n"
"  --zipf S             their popularity exponent (default 1.0)\n"
"  --agent-requests N   multi-agent requests (default 1000)\n"
"  --projects N         multi-agent projects (default 8)\n"
"Pool and measurement:\n"
"  --layout SPEC        (default " PREFIX_DEFAULT_LAYOUT ")\n"
"  --pool-pages N       device pages of every workload's pool (default: see --pool-frac)\n"
"  --pool-frac F        pool = F x the workload's footprint (its distinct cached pages\n"
"                       in an unbounded cache), at least two requests' worth (default 0.25)\n"
"  --compose-samples N  timed compose calls of 8 chunks (default 10000)\n"
"  --target T           inproc, kvpoold or both (default both)\n"
"  --kvpoold PATH       the kvpoold binary (default: next to kvbench)\n"
"  --no-verify          do not read back the pages hits hand out\n"
"GPU (CUDA builds):\n"
"  --gpu                recompute vs cache hit for one context instead (Llama-3-8B)\n"
"  --gpu-tokens N       the context's tokens (default 4000)\n"
"  --gpu-reps N         repetitions; medians count (default 10)\n"
"  --device N           CUDA device ordinal (default 0)\n"
KVB_USAGE_END_OPTS
"\n"
"JSON: hit_rate, best_hit_rate, belady_hit_rate, hit_ratio_vs_belady,\n"
"dedupe_pages_saved, compose_p50_ns, compose_p99_ns\n"
"(from the kvpoold run when it ran, else inproc: see \"source\"), then both runs\n"
"per workload; with --gpu, reuse_speedup and reuse_speedup_host. See kvbench(1).\n");
}

enum {
	OPT_SEED = 256, OPT_CONV, OPT_ACTIVE, OPT_TURNS, OPT_SYSTEMS, OPT_RAG, OPT_LIBRARY,
	OPT_ZIPF, OPT_AGENTS, OPT_PROJECTS, OPT_LAYOUT, OPT_POOL_PAGES, OPT_POOL_FRAC,
	OPT_COMPOSE, OPT_TARGET, OPT_KVPOOLD, OPT_NO_VERIFY, OPT_GPU, OPT_GPU_TOKENS,
	OPT_GPU_REPS, OPT_DEVICE,
};

static const struct option long_opts[] = {
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "conversations", required_argument, NULL, OPT_CONV },
	{ "active", required_argument, NULL, OPT_ACTIVE },
	{ "turns", required_argument, NULL, OPT_TURNS },
	{ "systems", required_argument, NULL, OPT_SYSTEMS },
	{ "rag-requests", required_argument, NULL, OPT_RAG },
	{ "library", required_argument, NULL, OPT_LIBRARY },
	{ "zipf", required_argument, NULL, OPT_ZIPF },
	{ "agent-requests", required_argument, NULL, OPT_AGENTS },
	{ "projects", required_argument, NULL, OPT_PROJECTS },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "pool-pages", required_argument, NULL, OPT_POOL_PAGES },
	{ "pool-frac", required_argument, NULL, OPT_POOL_FRAC },
	{ "compose-samples", required_argument, NULL, OPT_COMPOSE },
	{ "target", required_argument, NULL, OPT_TARGET },
	{ "kvpoold", required_argument, NULL, OPT_KVPOOLD },
	{ "no-verify", no_argument, NULL, OPT_NO_VERIFY },
	{ "gpu", no_argument, NULL, OPT_GPU },
	{ "gpu-tokens", required_argument, NULL, OPT_GPU_TOKENS },
	{ "gpu-reps", required_argument, NULL, OPT_GPU_REPS },
	{ "device", required_argument, NULL, OPT_DEVICE },
	KVB_LONG_OPTS_END,
};

static int opt_u32(const char *name, const char *arg, uint64_t min, uint64_t max,
		   uint32_t *out)
{
	uint64_t v;
	int rc = kvb_opt_count(SUB, name, arg, min, max, &v);

	if (rc < 0)
		*out = (uint32_t)v;
	return rc;
}

static int opt_real(const char *name, const char *arg, double min, double max,
		    double *out)
{
	char *end;
	double v = strtod(arg, &end);

	if (end == arg || *end || !isfinite(v) || v < min || v > max)
		return kvb_usage_error(SUB, "%s: '%s' is not a number in [%g, %g]", name,
				       arg, min, max);
	*out = v;
	return -1;
}

static int one_opt(void *ctx, int c, const char *arg)
{
	struct prefix_opts *o = ctx;
	char err[KVP_ERRLEN] = "";

	switch (c) {
	case OPT_SEED:
		return kvb_opt_count(SUB, "--seed", arg, 0, UINT64_MAX, &o->w.seed);
	case OPT_CONV:
		return opt_u32("--conversations", arg, 0, 1000000, &o->w.conversations);
	case OPT_ACTIVE:
		return opt_u32("--active", arg, 1, 1000000, &o->w.active);
	case OPT_TURNS:
		return opt_u32("--turns", arg, 2, 1000, &o->w.turns_max);
	case OPT_SYSTEMS:
		return opt_u32("--systems", arg, 1, 1000, &o->w.mt_systems);
	case OPT_RAG:
		return opt_u32("--rag-requests", arg, 0, 10000000, &o->w.rag_requests);
	case OPT_LIBRARY:
		return opt_u32("--library", arg, 1, 10000000, &o->w.library);
	case OPT_ZIPF:
		return opt_real("--zipf", arg, 0, 10, &o->w.zipf_s);
	case OPT_AGENTS:
		return opt_u32("--agent-requests", arg, 0, 10000000, &o->w.agent_requests);
	case OPT_PROJECTS:
		return opt_u32("--projects", arg, 1, 100000, &o->w.projects);
	case OPT_LAYOUT:
		if (kvp_layout_parse(&o->layout, arg, err, sizeof(err)) < 0)
			return kvb_usage_error(SUB, "--layout: %s", err[0] ? err : "bad layout");
		return -1;
	case OPT_POOL_PAGES:
		return kvb_opt_count(SUB, "--pool-pages", arg, 1, UINT32_MAX, &o->pool_pages);
	case OPT_POOL_FRAC:
		return opt_real("--pool-frac", arg, 0.001, 100, &o->pool_frac);
	case OPT_COMPOSE:
		return kvb_opt_count(SUB, "--compose-samples", arg, 0, 10000000,
				     &o->compose_samples);
	case OPT_TARGET:
		if (strcmp(arg, "both") && strcmp(arg, "inproc") && strcmp(arg, "kvpoold"))
			return kvb_usage_error(SUB, "--target: '%s' is not inproc, kvpoold "
					       "or both", arg);
		o->target = arg;
		return -1;
	case OPT_KVPOOLD:
		o->kvpoold = arg;
		return -1;
	case OPT_NO_VERIFY:
		o->verify = false;
		return -1;
	case OPT_GPU:
		o->gpu = true;
		return -1;
	case OPT_GPU_TOKENS:
		return kvb_opt_count(SUB, "--gpu-tokens", arg, 16, 131072, &o->gpu_tokens);
	case OPT_GPU_REPS:
		return kvb_opt_count(SUB, "--gpu-reps", arg, 1, 1000, &o->gpu_reps);
	case OPT_DEVICE:
		return kvb_opt_count(SUB, "--device", arg, 0, 1023, &o->gpu_device);
	}
	return -1;
}

static int parse_opts(int argc, char **argv, struct prefix_opts *o)
{
	char err[KVP_ERRLEN] = "";
	int rc;

	memset(o, 0, sizeof(*o));
	o->w.seed = 1;
	o->w.conversations = 200;
	o->w.active = 32;
	o->w.turns_min = 2;
	o->w.turns_max = 12;
	o->w.mt_systems = 4;
	o->w.rag_requests = 2000;
	o->w.library = 10000;
	o->w.zipf_s = 1.0;
	o->w.agent_requests = 1000;
	o->w.projects = 8;
	o->pool_frac = 0.25;
	o->compose_samples = 10000;
	o->target = "both";
	o->verify = true;
	o->gpu_tokens = 4000;
	o->gpu_reps = 10;
	if (kvp_layout_parse(&o->layout, PREFIX_DEFAULT_LAYOUT, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvbench prefix: the built-in layout does not parse: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, o, &o->json);
	if (rc >= 0)
		return rc;
	o->w.page_tokens = o->layout.page_tokens;
	kvp_layout_format(&o->layout, o->layout_spec, sizeof(o->layout_spec));
	if (o->kvpoold && strcmp(o->target, "inproc")) {
		char path[PATH_MAX];

		if (kvb_daemon_find(o->kvpoold, path, sizeof(path), err, sizeof(err)))
			return kvb_usage_error(SUB, "%s", err);
	}
	return -1;
}

/* ---------------------------------------------------------------- totals */

struct totals {
	uint64_t needed, hit, best, belady, dedupe;
};

static struct totals run_totals(const struct pb_run *r)
{
	struct totals t = { 0 };

	for (int k = 0; k < PB_NWL; k++) {
		const struct pb_workload *w = &r->wl[k];

		if (!w->ran)
			continue;
		t.needed += w->tokens_needed;
		t.hit += w->tokens_hit;
		t.best += w->best_tokens;
		t.belady += w->belady_tokens;
		t.dedupe += w->dedupe_pages_saved;
	}
	return t;
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0;
}

static uint64_t verify_failures(const struct pb_run *r)
{
	uint64_t n = 0;

	for (int k = 0; k < PB_NWL; k++)
		n += r->wl[k].verify_failures;
	return n;
}

/* ---------------------------------------------------------------- JSON */

static const char *const op_names[2][4] = {
	{ "seq_alloc", "seq_extend", "commit", "seq_free" },
	{ "register_hit", "register_new", "compose", "release" },
};

static void json_workload(struct json *j, const struct pb_workload *w, int which,
			  uint64_t page_bytes)
{
	const struct kvp_stats *s = &w->stats;

	json_obj_begin(j, w->name);
	json_u64(j, "requests", w->requests);
	json_u64(j, "tokens_needed", w->tokens_needed);
	json_u64(j, "tokens_hit", w->tokens_hit);
	json_u64(j, "best_tokens", w->best_tokens);
	json_f64(j, "hit_rate", ratio(w->tokens_hit, w->tokens_needed), 6);
	json_f64(j, "best_hit_rate", ratio(w->best_tokens, w->tokens_needed), 6);
	json_f64(j, "hit_rate_of_best", ratio(w->tokens_hit, w->best_tokens), 6);
	json_u64(j, "belady_tokens", w->belady_tokens);
	json_f64(j, "belady_hit_rate", ratio(w->belady_tokens, w->tokens_needed), 6);
	json_f64(j, "hit_ratio_vs_belady", ratio(w->tokens_hit, w->belady_tokens), 6);
	json_u64(j, "dedupe_pages_saved", w->dedupe_pages_saved);
	json_u64(j, "footprint_pages", w->footprint_pages);
	json_u64(j, "pool_pages", w->pool_pages);
	json_u64(j, "pool_bytes", w->pool_pages * page_bytes);
	json_u64(j, "appended_tokens", w->appended_tokens);
	json_u64(j, "lookups", w->lookups);
	if (which == PB_WL_MT) {
		json_u64(j, "prefix_lookup_tokens", s->prefix_lookup_tokens);
		json_u64(j, "prefix_hit_tokens", s->prefix_hit_tokens);
		json_u64(j, "prefix_dedupe_pages", s->prefix_dedupe_pages);
		json_u64(j, "prefix_pages", s->prefix_pages);
		json_u64(j, "prefix_evicted_pages", s->prefix_evicted_pages);
		json_u64(j, "cow_pages", s->cow_pages);
	} else {
		json_u64(j, "chunk_hits", w->hits);
		json_u64(j, "chunks", s->chunks);
		json_u64(j, "chunk_pages", s->chunk_pages);
		json_u64(j, "compositions", s->compositions);
		json_u64(j, "compose_retries", w->compose_retries);
	}
	json_u64(j, "evicted_pages", w->evicted_pages);
	json_u64(j, "evicted_chunks", w->evicted_chunks);
	json_u64(j, "verified_pages", w->verified_pages);
	json_u64(j, "verify_failures", w->verify_failures);
	json_f64(j, "seconds", w->seconds, 6);
	json_obj_begin(j, "latency");
	for (int k = 0; k < 4; k++)
		json_summary(j, op_names[which != PB_WL_MT][k], &w->op[k]);
	json_obj_end(j);
	json_str(j, "engine_check", w->check);
	json_obj_end(j);
}

static void json_run(struct json *j, const char *key, const struct pb_run *r, bool asked,
		     uint64_t page_bytes)
{
	struct totals t = run_totals(r);

	if (!asked) {
		json_null(j, key);
		return;
	}
	json_obj_begin(j, key);
	json_bool(j, "ok", r->ran);
	if (r->error[0])
		json_str(j, "error", r->error);
	json_f64(j, "hit_rate", ratio(t.hit, t.needed), 6);
	json_f64(j, "best_hit_rate", ratio(t.best, t.needed), 6);
	json_f64(j, "belady_hit_rate", ratio(t.belady, t.needed), 6);
	json_f64(j, "hit_ratio_vs_belady", ratio(t.hit, t.belady), 6);
	json_u64(j, "dedupe_pages_saved", t.dedupe);
	json_u64(j, "compose_p50_ns", r->compose8.p50);
	json_u64(j, "compose_p99_ns", r->compose8.p99);
	json_u64(j, "tokens_needed", t.needed);
	json_u64(j, "tokens_hit", t.hit);
	json_u64(j, "best_tokens", t.best);
	json_u64(j, "belady_tokens", t.belady);
	json_obj_begin(j, "compose8");
	json_u64(j, "chunks", 8);
	json_u64(j, "pages", r->compose8_pages);
	json_u64(j, "tokens", r->compose8_tokens);
	json_summary(j, "compose", &r->compose8);
	json_summary(j, "release", &r->compose8_release);
	json_obj_end(j);
	json_obj_begin(j, "workloads");
	for (int k = 0; k < PB_NWL; k++)
		if (r->wl[k].ran)
			json_workload(j, &r->wl[k], k, page_bytes);
	json_obj_end(j);
	json_obj_end(j);
}

static void json_trace(struct json *j, const struct pw_trace *t)
{
	const struct pw_chunks *cs[2] = { &t->rag, &t->agents };

	json_obj_begin(j, "trace");
	json_str(j, "best_hit_rate_definition", best_definition);
	json_str(j, "belady_hit_rate_definition", belady_definition);
	if (t->mt.nturns) {
		json_obj_begin(j, "multi_turn");
		json_u64(j, "conversations", t->mt.nconv);
		json_u64(j, "turns", t->mt.nturns);
		json_u64(j, "tokens_needed", t->mt.tokens_needed);
		json_u64(j, "best_tokens", t->mt.best_tokens);
		json_f64(j, "best_hit_rate", ratio(t->mt.best_tokens, t->mt.tokens_needed), 6);
		json_u64(j, "footprint_pages", t->mt.footprint_pages);
		json_obj_end(j);
	}
	for (int k = 0; k < 2; k++) {
		if (!cs[k]->nreq)
			continue;
		json_obj_begin(j, cs[k]->name);
		json_u64(j, "requests", cs[k]->nreq);
		json_u64(j, "chunks", cs[k]->nchunks);
		json_u64(j, "context_uses", cs[k]->nctx);
		json_u64(j, "tokens_needed", cs[k]->tokens_needed);
		json_u64(j, "best_tokens", cs[k]->best_tokens);
		json_f64(j, "best_hit_rate", ratio(cs[k]->best_tokens, cs[k]->tokens_needed), 6);
		json_u64(j, "footprint_pages", cs[k]->footprint_pages);
		json_u64(j, "max_request_pages", cs[k]->max_request_pages);
		json_obj_end(j);
	}
	json_obj_end(j);
}

static void print_json(const struct prefix_opts *o, const struct pw_trace *t,
		       const struct pb_run *inproc, const struct pb_run *kvpd,
		       bool ask_in, bool ask_kv, const struct kvb_machine *m)
{
	const struct pb_run *top = ask_kv && kvpd->ran ? kvpd : inproc;
	struct totals tt = run_totals(top);
	struct json j;

	kvb_json_begin(&j, "prefix");
	json_str(&j, "source", top == kvpd ? "kvpoold" : "inproc");
	json_f64(&j, "hit_rate", ratio(tt.hit, tt.needed), 6);
	json_f64(&j, "best_hit_rate", ratio(tt.best, tt.needed), 6);
	json_f64(&j, "belady_hit_rate", ratio(tt.belady, tt.needed), 6);
	json_f64(&j, "hit_ratio_vs_belady", ratio(tt.hit, tt.belady), 6);
	json_u64(&j, "dedupe_pages_saved", tt.dedupe);
	json_u64(&j, "compose_p50_ns", top->compose8.p50);
	json_u64(&j, "compose_p99_ns", top->compose8.p99);
	json_obj_begin(&j, "config");
	json_u64(&j, "seed", o->w.seed);
	json_str(&j, "layout", o->layout_spec);
	json_u64(&j, "page_bytes", o->layout.page_bytes);
	json_u64(&j, "conversations", o->w.conversations);
	json_u64(&j, "active", o->w.active);
	json_u64(&j, "turns_min", o->w.turns_min);
	json_u64(&j, "turns_max", o->w.turns_max);
	json_u64(&j, "systems", o->w.mt_systems);
	json_u64(&j, "rag_requests", o->w.rag_requests);
	json_u64(&j, "library", o->w.library);
	json_f64(&j, "zipf_s", o->w.zipf_s, 3);
	json_u64(&j, "agent_requests", o->w.agent_requests);
	json_u64(&j, "projects", o->w.projects);
	if (o->pool_pages)
		json_u64(&j, "pool_pages", o->pool_pages);
	else
		json_null(&j, "pool_pages");
	json_f64(&j, "pool_frac", o->pool_frac, 4);
	json_u64(&j, "compose_samples", o->compose_samples);
	json_str(&j, "target", o->target);
	json_bool(&j, "verify", o->verify);
	json_obj_end(&j);
	json_trace(&j, t);
	json_run(&j, "inproc", inproc, ask_in, o->layout.page_bytes);
	json_run(&j, "kvpoold", kvpd, ask_kv, o->layout.page_bytes);
	kvb_json_end(&j, m);
}

/* ---------------------------------------------------------------- table */

static void print_run(const char *name, const struct pb_run *r)
{
	struct totals t = run_totals(r);

	printf("\n%s%s%s\n", name, r->ran ? "" : ": FAILED: ", r->ran ? "" : r->error);
	printf("  %-11s %8s %11s %11s %7s %7s %7s %6s %9s %9s %9s %9s %11s %11s\n",
	       "workload", "requests", "needed", "hit", "hit%", "MIN%", "best%", "/MIN",
	       "pool pg", "footprint", "evicted", "dedupe pg", "op0 p50/p99",
	       "op2 p50/p99");
	for (int k = 0; k < PB_NWL; k++) {
		const struct pb_workload *w = &r->wl[k];
		char a[32], b[32];

		if (!w->ran)
			continue;
		snprintf(a, sizeof(a), "%" PRIu64 "/%" PRIu64, w->op[0].p50, w->op[0].p99);
		snprintf(b, sizeof(b), "%" PRIu64 "/%" PRIu64, w->op[2].p50, w->op[2].p99);
		printf("  %-11s %8" PRIu64 " %11" PRIu64 " %11" PRIu64 " %6.1f%% %6.1f%% "
		       "%6.1f%% %6.3f %9" PRIu64 " %9" PRIu64 " %9" PRIu64 " %9" PRIu64
		       " %11s %11s\n",
		       w->name, w->requests, w->tokens_needed, w->tokens_hit,
		       100 * ratio(w->tokens_hit, w->tokens_needed),
		       100 * ratio(w->belady_tokens, w->tokens_needed),
		       100 * ratio(w->best_tokens, w->tokens_needed),
		       ratio(w->tokens_hit, w->belady_tokens), w->pool_pages,
		       w->footprint_pages, k == PB_WL_MT ? w->evicted_pages : w->evicted_chunks,
		       w->dedupe_pages_saved, a, b);
	}
	printf("  %-11s %8s %11" PRIu64 " %11" PRIu64 " %6.1f%% %6.1f%% %6.1f%% %6.3f %9s "
	       "%9s %9s %9" PRIu64 "\n", "all", "", t.needed, t.hit,
	       100 * ratio(t.hit, t.needed), 100 * ratio(t.belady, t.needed),
	       100 * ratio(t.best, t.needed), ratio(t.hit, t.belady), "", "", "",
	       t.dedupe);
	printf("  compose of 8 chunks (system + 6 contexts + query, %" PRIu64 " pages): "
	       "p50 %" PRIu64 " ns, p99 %" PRIu64 " ns (%zu samples); release p50 %" PRIu64
	       " ns\n", r->compose8_pages, r->compose8.p50, r->compose8.p99, r->compose8.n,
	       r->compose8_release.p50);
	for (int k = 0; k < PB_NWL; k++)
		if (r->wl[k].ran)
			printf("  %s: %" PRIu64 " pages read back, %" PRIu64
			       " differed; engine_check: %s\n", r->wl[k].name,
			       r->wl[k].verified_pages, r->wl[k].verify_failures,
			       r->wl[k].check);
}

static void print_table(const struct prefix_opts *o, const struct pb_run *inproc,
			const struct pb_run *kvpd, bool ask_in, bool ask_kv,
			const struct kvb_machine *m)
{
	printf("kvbench prefix on %s (%ld CPUs); layout %s (%" PRIu64 " B/page); seed %"
	       PRIu64 "\n", m->cpu_model, m->nproc, o->layout_spec, o->layout.page_bytes,
	       o->w.seed);
	printf("hit%% = tokens served from cache / tokens needed; MIN%% = the same for\n"
	       "Belady's MIN with the same pool pages, best%% for an unbounded cache, on\n"
	       "this trace (see kvbench(1)); /MIN = hit / MIN; op0/op2 latency in ns:\n"
	       "multi_turn seq_alloc/commit, rag and agents register(hit)/compose\n");
	if (ask_in)
		print_run("inproc (engine, share_* in this process)", inproc);
	if (ask_kv)
		print_run("kvpoold (client library, private daemon)", kvpd);
}

/* ---------------------------------------------------------------- GPU */

static void gpu_print(const struct prefix_opts *o, const struct pb_gpu_result *g,
		      const struct kvb_machine *m)
{
	if (o->json) {
		struct json j;

		kvb_json_begin(&j, "prefix-gpu");
		json_f64(&j, "reuse_speedup", g->reuse_speedup, 1);
		json_f64(&j, "reuse_speedup_host", g->reuse_speedup_host, 2);
		json_f64(&j, "reuse_speedup_linear_only", g->reuse_speedup_linear_only, 1);
		json_str(&j, "gpu", g->gpu_name);
		json_str(&j, "model", "Llama-3-8B: 32 layers, hidden 4096, 32 q heads, 8 kv "
			 "heads, head_dim 128, MLP 14336, bf16");
		json_u64(&j, "tokens", g->tokens);
		json_u64(&j, "pages", g->pages);
		json_u64(&j, "page_bytes", g->page_bytes);
		json_u64(&j, "reps", g->reps);
		json_obj_begin(&j, "recompute");
		json_str(&j, "what", "prefill GEMMs per layer: QKV 4096->6144, O 4096->4096, "
			 "gate+up 4096->28672, down 14336->4096; causal attention QK^T and "
			 "PV as blocked strided-batched GEMMs; cublasGemmEx bf16 in/out, "
			 "fp32 accumulate; softmax, RoPE, norms, activations, embedding, LM "
			 "head and the KV write excluded (recompute is cheaper than real)");
		json_f64(&j, "ms", g->recompute_ms, 3);
		json_f64(&j, "linear_ms", g->recompute_linear_ms, 3);
		json_f64(&j, "attention_ms", g->recompute_attn_ms, 3);
		json_f64(&j, "linear_tflop", g->linear_flops * 1e-12, 3);
		json_f64(&j, "attention_tflop", g->attn_flops * 1e-12, 3);
		json_f64(&j, "tflops", g->recompute_tflops, 1);
		json_obj_end(&j);
		json_obj_begin(&j, "device_hit");
		json_str(&j, "what", "share_seq_alloc of the context + 1 token on the cuda "
			 "backend: the cached pages' table returned (KV ready)");
		json_f64(&j, "us", g->device_hit_us, 3);
		json_f64(&j, "p99_us", g->device_hit_p99_us, 3);
		json_u64(&j, "hit_tokens", g->device_hit_tokens);
		json_f64(&j, "chunk_acquire_us", g->chunk_hit_us, 3);
		json_obj_end(&j);
		json_obj_begin(&j, "host_hit");
		json_str(&j, "what", "engine_prepare of a history demoted to the pinned host "
			 "tier, until its onload fence has landed (KV ready on the device)");
		json_f64(&j, "ms", g->host_hit_ms, 3);
		json_u64(&j, "onloaded_pages", g->host_onloaded_pages);
		json_f64(&j, "gbps", g->host_hit_gbps, 2);
		json_f64(&j, "h2d_ceiling_gbps", g->h2d_ceiling_gbps, 2);
		json_obj_end(&j);
		json_bool(&j, "verified", g->verified);
		kvb_json_end(&j, m);
		return;
	}
	printf("kvbench prefix --gpu on %s: a %" PRIu64 "-token context, Llama-3-8B "
	       "geometry (%" PRIu64 " pages of %" PRIu64 " B)\n", g->gpu_name, g->tokens,
	       g->pages, g->page_bytes);
	printf("  recompute (cuBLAS prefill GEMMs)  %10.3f ms  (linear %.3f + attention %.3f"
	       " ms, %.1f TFLOP/s)\n", g->recompute_ms, g->recompute_linear_ms,
	       g->recompute_attn_ms, g->recompute_tflops);
	printf("  device-tier hit (seq_alloc)        %10.3f us  (p99 %.3f us; chunk acquire "
	       "%.3f us)\n", g->device_hit_us, g->device_hit_p99_us, g->chunk_hit_us);
	printf("  host-tier hit (prepare + onload)   %10.3f ms  (%.1f GB/s; raw H2D %.1f GB/s)\n",
	       g->host_hit_ms, g->host_hit_gbps, g->h2d_ceiling_gbps);
	printf("  reuse_speedup %.0fx (device tier), %.2fx (host tier), %.0fx linear-only;"
	       " read back: %s\n", g->reuse_speedup, g->reuse_speedup_host,
	       g->reuse_speedup_linear_only, g->verified ? "ok" : "MISMATCH");
}

static int run_gpu(const struct prefix_opts *o)
{
#ifdef KVPOOL_HAVE_CUDA
	struct pb_gpu_result g;
	struct kvb_machine m;
	struct summary tov;
	char err[512] = "";
	int rc = kvb_begin_run(SUB, KVB_CPU_NONE, &m, &tov);

	if (rc >= 0)
		return rc;
	memset(&g, 0, sizeof(g));
	if (pb_gpu_measure(o, &g, err, sizeof(err))) {
		fprintf(stderr, "kvbench prefix --gpu: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	gpu_print(o, &g, &m);
	return g.verified ? KVB_EXIT_OK : KVB_EXIT_FAIL;
#else
	(void)gpu_print;
	fprintf(stderr, "kvbench prefix --gpu: this kvbench was built without CUDA "
		"(configure with -DKVPOOL_CUDA=ON where nvcc is)\n");
	(void)o;
	return KVB_EXIT_FAIL;
#endif
}

/* ---------------------------------------------------------------- main */

int cmd_prefix(int argc, char **argv)
{
	struct prefix_opts o;
	struct pw_trace trace;
	struct pb_run *inproc = NULL, *kvpd = NULL;
	struct kvb_machine m;
	struct summary tov;
	char err[KVP_ERRLEN];
	bool ask_in, ask_kv;
	int rc = parse_opts(argc, argv, &o);

	if (rc >= 0)
		return rc;
	if (o.gpu)
		return run_gpu(&o);
	ask_in = strcmp(o.target, "kvpoold") != 0;
	ask_kv = strcmp(o.target, "inproc") != 0;
	rc = kvb_begin_run(SUB, KVB_CPU_NONE, &m, &tov);
	if (rc >= 0)
		return rc;
	if (pw_generate(&trace, &o.w, err, sizeof(err))) {
		fprintf(stderr, "kvbench prefix: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	inproc = calloc(1, sizeof(*inproc));
	kvpd = calloc(1, sizeof(*kvpd));
	if (!inproc || !kvpd) {
		fprintf(stderr, "kvbench prefix: out of memory\n");
		rc = KVB_EXIT_FAIL;
		goto out;
	}
	rc = KVB_EXIT_OK;
	if (ask_in && pb_run_trace(&trace, &o, pb_engine_open, pb_engine_close, inproc)) {
		fprintf(stderr, "kvbench prefix: inproc: %s\n", inproc->error);
		rc = KVB_EXIT_FAIL;
	}
	if (ask_kv && pb_run_trace(&trace, &o, pb_client_open, pb_client_close, kvpd)) {
		fprintf(stderr, "kvbench prefix: kvpoold: %s\n", kvpd->error);
		rc = KVB_EXIT_FAIL;
	}
	if (verify_failures(inproc) || verify_failures(kvpd)) {
		fprintf(stderr, "kvbench prefix: pages served from cache did not hold the "
			"KV written for their tokens\n");
		rc = KVB_EXIT_FAIL;
	}
	if (o.json)
		print_json(&o, &trace, inproc, kvpd, ask_in, ask_kv, &m);
	else
		print_table(&o, inproc, kvpd, ask_in, ask_kv, &m);
out:
	free(inproc);
	free(kvpd);
	pw_free(&trace);
	return rc;
}
