/* SPDX-License-Identifier: MIT */
/*
 * replay_report.c - what `kvbench replay` prints and writes: the table, the
 * JSON object (kvbench(1) lists its members), the markdown summary and the
 * gnuplot input (hit rate per hour of the trace, prepare latency CDF).
 *
 * TARGETS (issue 6; benchmarks, reported met or not, never enforced):
 * prepare p99 <= 50 us for prepares that needed no onload; kvpool >= 10x
 * Redis in bytes of KV served per second; kvpool's prepare p50 <= 2x the
 * in-process engine's. With --backend cuda: offload (bytes_d2h / ns_d2h,
 * the daemon's own timing of its device -> host copies) >= 90% of the raw
 * pinned cudaMemcpyAsync ceiling of the same shape (the mean demotion's
 * pages per synchronisation, page by page or as one run: the higher).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvbench.h"
#include "replay.h"

#define TARGET_PREPARE_P99_NS 50000u
#define TARGET_VS_REDIS 10.0
#define TARGET_VS_INPROC_P50 2.0
#define CDF_POINTS 200
#define TARGET_OFFLOAD_RATIO 0.90

static const char *const sim_name[NSIM] = { "infinite", "best", "lru_sim" };

double rsys_bytes_per_s(const struct rrun *r, const struct rsys_result *s)
{
	return s->wall_s > 0 ? (double)(s->hit + s->appended) *
			       (double)r->o.layout.token_bytes / s->wall_s : 0;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static double onload_rate(const struct rrun *r, const struct rsys_result *s)
{
	return s->onload_ns ? (double)s->onload_pages * (double)r->o.layout.page_bytes /
			      ((double)s->onload_ns / 1e9) : 0;
}

/* The system kvpool is compared with is measured, and so is kvpool. */
static bool both(const struct rrun *r, enum rsys_id x)
{
	return r->sys[SYS_KVPOOL].ran && r->sys[x].ran;
}

struct targets {
	bool have_p99, have_redis, have_inproc;
	uint64_t p99;
	double vs_redis, vs_inproc_p50;
};

static void targets(const struct rrun *r, struct targets *t)
{
	const struct rsys_result *k = &r->sys[SYS_KVPOOL];

	memset(t, 0, sizeof(*t));
	t->have_p99 = k->ran;
	t->p99 = k->lat[OP_PREPARE].p99;
	t->have_redis = both(r, SYS_REDIS);
	t->vs_redis = ratio(rsys_bytes_per_s(r, k), rsys_bytes_per_s(r, &r->sys[SYS_REDIS]));
	t->have_inproc = both(r, SYS_INPROC);
	t->vs_inproc_p50 = ratio((double)k->lat[OP_PREPARE].p50,
				 (double)r->sys[SYS_INPROC].lat[OP_PREPARE].p50);
}

static double measured_hit_rate(const struct rrun *r)
{
	for (int k = 0; k < NSYS; k++)
		if (r->sys[k].ran)
			return sim_rate(r->sys[k].hit, r->sys[k].needed);
	return 0;
}

/* ---------------------------------------------------------------- GPU */

struct gpu_fig {
	bool have;                /* --backend cuda, kvpool ran */
	bool have_ceiling;
	double offload;           /* B/s: bytes_d2h / ns_d2h */
	double onload;            /* B/s: bytes_h2d / ns_h2d (0: not timed) */
	double ceiling;           /* B/s: the higher of d2h_pages, d2h_run */
	double ratio, ratio_bulk;
	double pages_per_demotion;
};

static void gpu_figures(const struct rrun *r, struct gpu_fig *g)
{
	const struct rsys_result *k = &r->sys[SYS_KVPOOL];

	memset(g, 0, sizeof(*g));
	g->have = r->o.backend == RB_CUDA && k->ran && k->have_stats;
	if (!g->have)
		return;
	g->offload = k->stats.ns_d2h ? (double)k->stats.bytes_d2h /
				       ((double)k->stats.ns_d2h / 1e9) : 0;
	g->onload = k->stats.ns_h2d ? (double)k->stats.bytes_h2d /
				      ((double)k->stats.ns_h2d / 1e9) : 0;
	g->pages_per_demotion = k->stats.demoted_users ?
		(double)k->stats.bytes_d2h / (double)r->o.layout.page_bytes /
		(double)k->stats.demoted_users : 0;
#if REPLAY_CUDA
	g->have_ceiling = r->have_ceiling;
	if (g->have_ceiling) {
		g->ceiling = r->ceil.d2h_pages > r->ceil.d2h_run ? r->ceil.d2h_pages :
			     r->ceil.d2h_run;
		g->ratio = ratio(g->offload, g->ceiling);
		g->ratio_bulk = ratio(g->offload, r->ceil.d2h_bulk);
	}
#endif
}

#define ONLOAD_IS "bytes_h2d / ns_h2d over the run: the GPU's time between " \
		  "events recorded around each onload's copies on the host -> device " \
		  "stream (not their wait behind other copies)"
#define ONLOAD_NOTE "not measured: the daemon timed no host -> device copy " \
		    "(ns_h2d 0: a daemon before protocol 10, or no onload)"

static void json_gpu(struct json *j, const struct rrun *r)
{
	const struct rsys_result *k = &r->sys[SYS_KVPOOL];
	struct gpu_fig g;

	gpu_figures(r, &g);
	if (!g.have) {
		json_null(j, "gpu");
		return;
	}
	json_obj_begin(j, "gpu");
	json_u64(j, "bytes_offloaded", k->stats.bytes_d2h);
	json_u64(j, "bytes_onloaded", k->stats.bytes_h2d);
	json_u64(j, "ns_d2h", k->stats.ns_d2h);
	json_f64(j, "pages_per_demotion", g.pages_per_demotion, 2);
	json_f64(j, "offload_gbps", g.offload / 1e9, 3);
	json_str(j, "offload_is", "bytes_d2h / ns_d2h over the run: the daemon's wall time "
		 "of its device -> host copies (enqueue + cudaStreamSynchronize)");
#if REPLAY_CUDA
	if (g.have_ceiling) {
		const struct rgpu_ceiling *c = &r->ceil;

		json_obj_begin(j, "ceiling");
		json_str(j, "gpu", c->gpu);
		json_i64(j, "device", c->device);
		json_u64(j, "page_bytes", c->page_bytes);
		json_u64(j, "pages_per_sync", c->pages_per_sync);
		json_f64(j, "d2h_pages_gbps", c->d2h_pages / 1e9, 3);
		json_f64(j, "d2h_run_gbps", c->d2h_run / 1e9, 3);
		json_f64(j, "d2h_bulk_gbps", c->d2h_bulk / 1e9, 3);
		json_f64(j, "h2d_pages_gbps", c->h2d_pages / 1e9, 3);
		json_f64(j, "h2d_bulk_gbps", c->h2d_bulk / 1e9, 3);
		json_f64(j, "d2h_pages_duplex_gbps", c->d2h_pages_duplex / 1e9, 3);
		json_f64(j, "d2h_run_duplex_gbps", c->d2h_run_duplex / 1e9, 3);
		json_str(j, "duplex_is", "the pages and run shapes while another stream "
			 "keeps host -> device copies of 256 MiB going, as onloads share the "
			 "link during the replay; not part of offload_vs_ceiling");
		json_str(j, "is", "raw cudaMemcpyAsync between cudaMalloc and "
			 "cudaHostAlloc(portable) memory on the pool's GPU after the run, timed "
			 "like ns_d2h: pages: pages_per_sync one-page copies then a sync; run: "
			 "the same bytes as one copy then a sync; bulk: 1 GiB copies; medians of 5 "
			 "x 4 GiB");
		json_obj_end(j);
		json_f64(j, "offload_vs_ceiling", g.ratio, 4);
		json_f64(j, "offload_vs_bulk", g.ratio_bulk, 4);
		json_f64(j, "offload_vs_duplex", ratio(g.offload, c->d2h_pages_duplex >
			 c->d2h_run_duplex ? c->d2h_pages_duplex : c->d2h_run_duplex), 4);
		json_f64(j, "offload_vs_ceiling_min", TARGET_OFFLOAD_RATIO, 2);
		json_bool(j, "offload_target_met", g.ratio >= TARGET_OFFLOAD_RATIO);
	} else {
		json_null(j, "ceiling");
		json_str(j, "ceiling_error", r->ceiling_err);
	}
#endif
	json_u64(j, "ns_h2d", k->stats.ns_h2d);
	if (g.onload > 0) {
		json_f64(j, "onload_gbps", g.onload / 1e9, 3);
		json_str(j, "onload_is", ONLOAD_IS);
	} else {
		json_null(j, "onload_gbps");
		json_str(j, "onload_note", ONLOAD_NOTE);
	}
	json_obj_end(j);
}

/* ---------------------------------------------------------------- JSON */

/* The q-quantile of one phase's histogram over the run (ph1 - ph0), ns:
 * linear inside the bucket it falls in (the daemon's buckets are coarse:
 * about three a decade), the +Inf bucket read as its lower bound. */
static uint64_t phase_quantile(const struct rsys_result *s, int k, double q,
			       uint64_t *count)
{
	const uint64_t *b0 = s->ph0.phase[k].buckets, *b1 = s->ph1.phase[k].buckets;
	uint64_t n = 0, cum = 0, lo = 0;

	for (int b = 0; b < KVP_LAT_BUCKETS; b++)
		n += b1[b] - b0[b];
	*count = n;
	if (!n)
		return 0;
	for (int b = 0; b < KVP_LAT_BUCKETS; b++) {
		uint64_t in = b1[b] - b0[b], hi = s->ph1.bucket_ns[b];

		if (in && cum + in >= q * n) {
			double f = (q * n - cum) / in;

			return hi == UINT64_MAX ? lo : lo + (uint64_t)(f * (hi - lo));
		}
		cum += in;
		lo = hi;
	}
	return lo;
}

static void json_phases(struct json *j, const struct rsys_result *s)
{
	static const char *const name[KVP_PHASES] = {
		"queue", "execute", "publish", "wake",
	};

	if (!s->have_phases) {
		json_null(j, "phases");
		return;
	}
	json_obj_begin(j, "phases");
	for (int k = 0; k < KVP_PHASES; k++) {
		uint64_t n, sum = s->ph1.phase[k].sum_ns - s->ph0.phase[k].sum_ns;
		uint64_t p99 = phase_quantile(s, k, 0.99, &n);
		uint64_t p50 = phase_quantile(s, k, 0.50, &n);

		json_obj_begin(j, name[k]);
		json_u64(j, "samples", n);
		json_u64(j, "p50_ns", p50);
		json_u64(j, "p99_ns", p99);
		json_u64(j, "mean_ns", n ? sum / n : 0);
		json_obj_end(j);
	}
	json_str(j, "phases_are", "kvp_ring_phases over the run (kvpool.h): ring "
		 "entries carrying a prepare answered in the worker's pass that took "
		 "them; queue = client submit to worker pickup, execute, publish = to "
		 "the completion's publication, wake = to the client's reap; "
		 "percentiles interpolated in the daemon's buckets (1 us .. 1 s, "
		 "about three a decade)");
	json_obj_end(j);
}

static void json_sys(struct json *j, const struct rrun *r, enum rsys_id id)
{
	const struct rsys_result *s = &r->sys[id];
	const struct kvp_stats *st = &s->stats;

	json_obj_begin(j, rsys_name[id]);
	json_f64(j, "bytes_per_s", rsys_bytes_per_s(r, s), 0);
	json_u64(j, "prepare_p50_ns", s->lat[OP_PREPARE].p50);
	json_u64(j, "prepare_p99_ns", s->lat[OP_PREPARE].p99);
	json_f64(j, "hit_rate", sim_rate(s->hit, s->needed), 6);
	json_f64(j, "wall_s", s->wall_s, 6);
	json_u64(j, "requests", s->requests);
	json_f64(j, "requests_per_s", s->wall_s > 0 ? s->requests / s->wall_s : 0, 1);
	json_u64(j, "batches", s->batches);
	json_f64(j, "batches_per_s", s->wall_s > 0 ? s->batches / s->wall_s : 0, 1);
	json_u64(j, "needed_tokens", s->needed);
	json_u64(j, "hit_tokens", s->hit);
	json_u64(j, "appended_tokens", s->appended);
	json_obj_begin(j, "latency");
	for (int op = 0; op < NOP; op++)
		if (id != SYS_REDIS || op != OP_COMMIT)
			json_summary(j, rop_name[op], &s->lat[op]);
	json_obj_end(j);
	if (id == SYS_KVPOOL)
		json_phases(j, s);
	json_obj_begin(j, "onload");
	json_u64(j, "prepares", s->lat[OP_PREPARE_ONLOAD].n);
	json_u64(j, "pages", s->onload_pages);
	json_f64(j, "bytes_per_s", onload_rate(r, s), 0);
	json_obj_end(j);
	json_u64(j, "reprepares", s->reprepares);
	json_u64(j, "pinned_waits", s->pinned_waits);
	if (s->have_stats) {
		json_obj_begin(j, "pool");
		json_u64(j, "device_frames", s->device_frames);
		json_u64(j, "host_frames", s->host_frames);
		json_u64(j, "bytes_offloaded", st->bytes_d2h);
		json_u64(j, "bytes_onloaded", st->bytes_h2d);
		json_u64(j, "demoted_users", st->demoted_users);
		json_u64(j, "demoted_pages", st->demoted_pages);
		json_u64(j, "evicted_users", st->evicted_users);
		json_u64(j, "evicted_pages", st->evicted_pages);
		json_u64(j, "onloaded_pages", st->onloaded_pages);
		/* The disk tier's (0 without --disk-dir). */
		json_u64(j, "disk_demoted_pages", st->disk_demoted_pages);
		json_u64(j, "disk_read_pages", st->disk_read_pages);
		json_u64(j, "disk_dropped_pages", st->disk_dropped_pages);
		json_u64(j, "hit_tokens", st->hit_tokens);
		json_u64(j, "reclaim_stalls", st->reclaim_stalls);
		json_u64(j, "reclaimed_pages", st->reclaimed_pages);
		json_u64(j, "reclaim_onload_stalls", st->reclaim_onload_stalls);
		json_u64(j, "reclaim_direct", st->reclaim_direct);
		json_obj_end(j);
	} else {
		json_null(j, "pool");
	}
	if (s->note[0])
		json_str(j, "server", s->note);
	json_obj_end(j);
}

void replay_print_json(const struct rrun *r)
{
	const struct trace_stats *ts = &r->ts;
	struct targets tg;
	char layout[256];
	struct json j;

	targets(r, &tg);
	kvp_layout_format(&r->o.layout, layout, sizeof(layout));
	kvb_json_begin(&j, "replay");
	json_f64(&j, "hit_rate", measured_hit_rate(r), 6);
	json_f64(&j, "best_hit_rate", sim_rate(r->sim.hit[SIM_BEST], r->sim.needed), 6);
	json_f64(&j, "infinite_hit_rate", sim_rate(r->sim.hit[SIM_INFINITE], r->sim.needed), 6);
	json_f64(&j, "lru_sim_hit_rate", sim_rate(r->sim.hit[SIM_LRU], r->sim.needed), 6);
	json_str(&j, "hit_rate_is", "kvpool's tokens not recomputed / tokens needed; "
		 "best_hit_rate: Belady MIN on tokens with room for (device + host) pages x "
		 "page_tokens, an upper bound for any cache of that size on this trace order; "
		 "infinite: no eviction; lru_sim: whole-history LRU over the same pages");
	json_obj_begin(&j, "systems");
	for (int k = 0; k < NSYS; k++) {
		if (r->sys[k].ran) {
			json_sys(&j, r, (enum rsys_id)k);
		} else if (r->sys[k].skipped[0]) {
			json_obj_begin(&j, rsys_name[k]);
			json_str(&j, "skipped", r->sys[k].skipped);
			json_obj_end(&j);
		}
	}
	json_obj_end(&j);
	json_str(&j, "backend", r->o.backend == RB_CUDA ? "cuda" : "shm");
	json_gpu(&j, r);
	json_obj_begin(&j, "ratios");
	for (int k = 1; k < NSYS; k++) {
		const struct rsys_result *a = &r->sys[SYS_KVPOOL], *b = &r->sys[k];
		char key[32];

		if (!both(r, (enum rsys_id)k))
			continue;
		snprintf(key, sizeof(key), "kvpool_vs_%s", rsys_name[k]);
		json_obj_begin(&j, key);
		json_f64(&j, "bytes_per_s", ratio(rsys_bytes_per_s(r, a), rsys_bytes_per_s(r, b)), 3);
		json_f64(&j, "prepare_p50", ratio((double)a->lat[OP_PREPARE].p50,
						  (double)b->lat[OP_PREPARE].p50), 3);
		json_f64(&j, "prepare_p99", ratio((double)a->lat[OP_PREPARE].p99,
						  (double)b->lat[OP_PREPARE].p99), 3);
		json_obj_end(&j);
	}
	json_str(&j, "ratios_are", "bytes_per_s: kvpool / other (above 1: kvpool serves more); "
		 "prepare_p50/p99: kvpool / other (below 1: kvpool is faster)");
	json_obj_end(&j);
	json_obj_begin(&j, "targets");
	json_u64(&j, "prepare_p99_max_ns", TARGET_PREPARE_P99_NS);
	if (tg.have_p99)
		json_bool(&j, "prepare_p99_met", tg.p99 <= TARGET_PREPARE_P99_NS);
	else
		json_null(&j, "prepare_p99_met");
	json_f64(&j, "vs_redis_bytes_per_s_min", TARGET_VS_REDIS, 1);
	if (tg.have_redis)
		json_bool(&j, "vs_redis_met", tg.vs_redis >= TARGET_VS_REDIS);
	else
		json_null(&j, "vs_redis_met");
	json_f64(&j, "vs_inproc_prepare_p50_max", TARGET_VS_INPROC_P50, 1);
	if (tg.have_inproc)
		json_bool(&j, "vs_inproc_met", tg.vs_inproc_p50 <= TARGET_VS_INPROC_P50);
	else
		json_null(&j, "vs_inproc_met");
	json_obj_end(&j);
	json_f64(&j, "memcpy_bytes_per_s", r->memcpy_bytes_per_s, 0);
	json_obj_begin(&j, "trace");
	json_str(&j, "source", r->o.trace_path ? r->o.trace_path : r->o.hstu_dir ?
		 r->o.hstu_dir : "generated");
	if (!r->o.trace_path && !r->o.hstu_dir) {
		json_u64(&j, "seed", r->o.gen.seed);
		json_u64(&j, "gen_users", r->o.gen.users);
		json_u64(&j, "gen_days", r->o.gen.days);
	}
	json_u64(&j, "requests", ts->requests);
	json_u64(&j, "requests_replayed", r->nreq);
	json_u64(&j, "users", ts->users);
	json_u64(&j, "days", ts->days);
	json_u64(&j, "history_min", ts->hist_min);
	json_u64(&j, "history_median", ts->hist_median);
	json_f64(&j, "history_mean", ts->hist_mean, 1);
	json_u64(&j, "history_max", ts->hist_max);
	json_f64(&j, "items_per_request", ts->items_per_request, 2);
	json_u64(&j, "needed_tokens_replayed", r->sim.needed);
	json_obj_end(&j);
	json_obj_begin(&j, "pool");
	json_str(&j, "layout", layout);
	json_u64(&j, "page_bytes", r->o.layout.page_bytes);
	json_u64(&j, "token_bytes", r->o.layout.token_bytes);
	json_u64(&j, "working_set_pages", r->working_set_pages);
	json_u64(&j, "device_pages", r->device_pages);
	json_u64(&j, "host_pages", r->host_pages);
	json_u64(&j, "max_lease_pages", r->max_pages);
	json_obj_end(&j);
	json_obj_begin(&j, "config");
	json_u64(&j, "pipelines", r->o.pipelines);
	json_u64(&j, "batch", r->o.batch);
	json_u64(&j, "bucket_ms", r->bucket_ms);
	json_obj_end(&j);
	kvb_json_end(&j, &r->m);
}

/* ---------------------------------------------------------------- table */

static void row(FILE *f, bool md, const struct rrun *r, enum rsys_id id)
{
	const struct rsys_result *s = &r->sys[id];
	double v[9] = {
		sim_rate(s->hit, s->needed), rsys_bytes_per_s(r, s) / 1048576.0,
		s->wall_s > 0 ? s->requests / s->wall_s : 0,
		s->wall_s > 0 ? s->batches / s->wall_s : 0,
		s->lat[OP_INFO].p50 / 1000.0, s->lat[OP_PREPARE].p50 / 1000.0,
		s->lat[OP_PREPARE].p99 / 1000.0, s->lat[OP_APPEND].p50 / 1000.0,
		id == SYS_REDIS ? NAN : s->lat[OP_COMMIT].p50 / 1000.0,
	};

	if (md)
		fprintf(f, "| %s | %.4f | %.1f | %.0f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
			rsys_name[id], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]);
	else
		fprintf(f, "  %-7s %8.4f %10.1f %9.0f %8.1f %9.2f %9.2f %9.2f %9.2f %9.2f\n",
			rsys_name[id], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]);
}

/* The GPU section: offload against the raw copies, onload's caveat. */
static void report_gpu(FILE *f, const struct rrun *r, bool md)
{
	const struct rsys_result *k = &r->sys[SYS_KVPOOL];
	const char *b = md ? "- " : "  ";
	struct gpu_fig g;

	gpu_figures(r, &g);
	if (!g.have)
		return;
	fprintf(f, "%sGPU (kvpoold --backend=cuda)%s\n", md ? "\n## " : "\n", md ? "\n" : "");
	fprintf(f, "%soffloaded %.2f GiB in %.3f s of device -> host copies (%.1f pages per "
		"demotion): %.2f GB/s\n", b, k->stats.bytes_d2h / 1073741824.0,
		k->stats.ns_d2h / 1e9, g.pages_per_demotion, g.offload / 1e9);
	if (g.onload > 0)
		fprintf(f, "%sonloaded %.2f GiB in %.3f s of host -> device copies: "
			"%.2f GB/s\n", b, k->stats.bytes_h2d / 1073741824.0,
			k->stats.ns_h2d / 1e9, g.onload / 1e9);
	else
		fprintf(f, "%sonloaded %.2f GiB: bandwidth %s\n", b,
			k->stats.bytes_h2d / 1073741824.0, ONLOAD_NOTE);
#if REPLAY_CUDA
	if (g.have_ceiling) {
		const struct rgpu_ceiling *c = &r->ceil;

		fprintf(f, "%sraw pinned cudaMemcpyAsync on %s (GPU %d), device -> host: %u "
			"one-page copies per sync %.2f GB/s, as one run %.2f GB/s, 1 GiB copies "
			"%.2f GB/s; host -> device: page copies %.2f GB/s, 1 GiB %.2f GB/s\n", b,
			c->gpu, c->device, c->pages_per_sync, c->d2h_pages / 1e9, c->d2h_run / 1e9,
			c->d2h_bulk / 1e9, c->h2d_pages / 1e9, c->h2d_bulk / 1e9);
		fprintf(f, "%sdevice -> host while host -> device copies run: pages %.2f GB/s, "
			"run %.2f GB/s\n", b, c->d2h_pages_duplex / 1e9, c->d2h_run_duplex / 1e9);
		fprintf(f, "%soffload / ceiling of the same shape %.3f (target >= %.2f: %s); "
			"/ 1 GiB copies %.3f\n", b, g.ratio, TARGET_OFFLOAD_RATIO,
			g.ratio >= TARGET_OFFLOAD_RATIO ? "met" : "NOT MET", g.ratio_bulk);
	} else {
		fprintf(f, "%sno ceiling: %s\n", b, r->ceiling_err);
	}
#endif
}

static void report(FILE *f, const struct rrun *r, bool md)
{
	const struct trace_stats *ts = &r->ts;
	const char *h = md ? "\n## " : "\n";
	struct targets tg;
	char layout[256];

	targets(r, &tg);
	kvp_layout_format(&r->o.layout, layout, sizeof(layout));
	if (md)
		fprintf(f, "Measured with `%s` on %s (%ld CPUs), %s.\n", kvb_command_line(),
			r->m.cpu_model, r->m.nproc, r->m.date);
	else
		printf("kvbench replay on %s (%ld CPUs)\n", r->m.cpu_model, r->m.nproc);
	fprintf(f, "%sTrace\n", h);
	fprintf(f, "%s%s: %zu requests (%zu replayed), %u users, %u days; history per user "
		"min %u, median %u, mean %.0f, max %u items; %.2f new items per request\n",
		md ? "" : "  ", r->o.trace_path ? r->o.trace_path : r->o.hstu_dir ?
		r->o.hstu_dir : "generated (KuaiRand-1K-like)", ts->requests, r->nreq, ts->users,
		ts->days, ts->hist_min, ts->hist_median, ts->hist_mean, ts->hist_max,
		ts->items_per_request);
	fprintf(f, "%sPool\n", h);
	fprintf(f, "%s%s, %" PRIu64 " B per page: device tier %" PRIu64 " pages + host tier %"
		PRIu64 " pages, against a working set of %" PRIu64 " pages (the largest day's "
		"histories); %" PRIu64 " pipelines, batches of %" PRIu64 "\n", md ? "" : "  ",
		layout, r->o.layout.page_bytes, r->device_pages, r->host_pages,
		r->working_set_pages, r->o.pipelines, r->o.batch);
	fprintf(f, "%sToken hit rate (tokens not recomputed / tokens needed)\n", h);
	for (int k = 0; k < NSYS; k++)
		if (r->sys[k].ran)
			fprintf(f, "%s%-8s measured %.4f\n", md ? "- " : "  ", rsys_name[k],
				sim_rate(r->sys[k].hit, r->sys[k].needed));
	for (int s = NSIM - 1; s >= 0; s--)
		fprintf(f, "%s%-8s %s %.4f\n", md ? "- " : "  ", sim_name[s],
			s == SIM_BEST ? "bound   " : "reference", sim_rate(r->sim.hit[s], r->sim.needed));
	fprintf(f, "%sbest = Belady's MIN on tokens with room for (device + host) pages x "
		"page tokens: no cache of that size does better on this trace; infinite = no "
		"eviction; lru_sim = whole-history LRU over the same pages\n", md ? "\n" : "  ");
	fprintf(f, "%sSystems (latencies in us; KV served = (hit + appended tokens) x token "
		"bytes / wall time)\n", h);
	if (md)
		fprintf(f, "\n| system | hit rate | KV served MiB/s | requests/s | batches/s | info p50 "
			"| prepare p50 | prepare p99 | append p50 | commit p50 |\n"
			"|---|---|---|---|---|---|---|---|---|---|\n");
	else
		fprintf(f, "  %-7s %8s %10s %9s %8s %9s %9s %9s %9s %9s\n", "system", "hit",
			"MiB/s", "req/s", "batch/s", "info p50", "prep p50", "prep p99",
			"app p50", "comm p50");
	for (int k = 0; k < NSYS; k++)
		if (r->sys[k].ran)
			row(f, md, r, (enum rsys_id)k);
	for (int k = 0; k < NSYS; k++)
		if (r->sys[k].skipped[0])
			fprintf(f, "%s%s skipped: %s\n", md ? "\n" : "  ", rsys_name[k],
				r->sys[k].skipped);
	fprintf(f, "%sPrepares that onloaded pages (reported apart)%s\n", h, md ? "\n" : "");
	for (int k = 0; k < NSYS; k++) {
		const struct rsys_result *s = &r->sys[k];

		if (!s->ran || k == SYS_REDIS)
			continue;
		fprintf(f, "%s%-7s %zu prepares, %" PRIu64 " pages, p50 %.1f us, p99 %.1f us, %.2f GiB/s "
			"(memcpy on this machine: %.2f GiB/s)\n", md ? "- " : "  ", rsys_name[k],
			s->lat[OP_PREPARE_ONLOAD].n, s->onload_pages,
			s->lat[OP_PREPARE_ONLOAD].p50 / 1000.0, s->lat[OP_PREPARE_ONLOAD].p99 / 1000.0,
			onload_rate(r, s) / 1073741824.0, r->memcpy_bytes_per_s / 1073741824.0);
	}
	fprintf(f, "%sPool counters over each run%s\n", h, md ? "\n" : "");
	for (int k = 0; k < NSYS; k++) {
		const struct rsys_result *s = &r->sys[k];

		if (!s->ran)
			continue;
		if (!s->have_stats) {
			fprintf(f, "%s%-7s %s\n", md ? "- " : "  ", rsys_name[k],
				s->note[0] ? s->note : "no counters");
			continue;
		}
		fprintf(f, "%s%-7s offloaded %.1f MiB, onloaded %.1f MiB; %" PRIu64 " users demoted "
			"(%" PRIu64 " pages), %" PRIu64 " evicted (%" PRIu64 " pages); %" PRIu64
			" re-prepares, %" PRIu64 " waits for pinned frames\n", md ? "- " : "  ",
			rsys_name[k], s->stats.bytes_d2h / 1048576.0, s->stats.bytes_h2d / 1048576.0,
			s->stats.demoted_users, s->stats.demoted_pages, s->stats.evicted_users,
			s->stats.evicted_pages, s->reprepares, s->pinned_waits);
	}
	fprintf(f, "%skvpool against each%s\n", h, md ? "\n" : "");
	for (int k = 1; k < NSYS; k++) {
		const struct rsys_result *a = &r->sys[SYS_KVPOOL], *b = &r->sys[k];

		if (!both(r, (enum rsys_id)k))
			continue;
		fprintf(f, "%svs %-7s KV served %.2fx, prepare p50 %.2fx, p99 %.2fx (latency: "
			"kvpool / %s)\n", md ? "- " : "  ", rsys_name[k],
			ratio(rsys_bytes_per_s(r, a), rsys_bytes_per_s(r, b)),
			ratio((double)a->lat[OP_PREPARE].p50, (double)b->lat[OP_PREPARE].p50),
			ratio((double)a->lat[OP_PREPARE].p99, (double)b->lat[OP_PREPARE].p99),
			rsys_name[k]);
	}
	report_gpu(f, r, md);
	if (r->o.no_targets)
		return;
	fprintf(f, "%sTargets%s\n", h, md ? "\n" : "");
	if (tg.have_p99)
		fprintf(f, "%sprepare p99 (no onload) %.1f us <= %.0f us: %s\n", md ? "- " : "  ",
			tg.p99 / 1000.0, TARGET_PREPARE_P99_NS / 1000.0,
			tg.p99 <= TARGET_PREPARE_P99_NS ? "met" : "NOT MET");
	if (tg.have_redis)
		fprintf(f, "%sKV served vs Redis %.2fx >= %.0fx: %s\n", md ? "- " : "  ",
			tg.vs_redis, TARGET_VS_REDIS, tg.vs_redis >= TARGET_VS_REDIS ? "met" : "NOT MET");
	if (tg.have_inproc)
		fprintf(f, "%sprepare p50 vs in-process %.2fx <= %.0fx: %s\n", md ? "- " : "  ",
			tg.vs_inproc_p50, TARGET_VS_INPROC_P50,
			tg.vs_inproc_p50 <= TARGET_VS_INPROC_P50 ? "met" : "NOT MET");
	{
		struct gpu_fig g;

		gpu_figures(r, &g);
		if (g.have_ceiling)
			fprintf(f, "%soffload %.2f GB/s vs the raw ceiling %.2f GB/s: %.3f >= %.2f: "
				"%s\n", md ? "- " : "  ", g.offload / 1e9, g.ceiling / 1e9, g.ratio,
				TARGET_OFFLOAD_RATIO, g.ratio >= TARGET_OFFLOAD_RATIO ? "met" :
				"NOT MET");
	}
}

void replay_print_table(const struct rrun *r)
{
	report(stdout, r, false);
}

int replay_write_md(const struct rrun *r, const char *path)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "kvbench replay: --md %s: %s\n", path, strerror(errno));
		return -errno;
	}
	report(f, r, true);
	if (fclose(f)) {
		fprintf(stderr, "kvbench replay: --md %s: %s\n", path, strerror(errno));
		return -errno;
	}
	return 0;
}

/* ---------------------------------------------------------------- plots */

static void put_rate(FILE *f, uint64_t hit, uint64_t needed)
{
	if (needed)
		fprintf(f, " %.6f", (double)hit / (double)needed);
	else
		fprintf(f, " NaN");
}

int replay_write_plot_data(const struct rrun *r, const char *dir)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/hitrate.dat", dir);
	f = fopen(path, "w");
	if (!f)
		goto fail;
	fprintf(f, "# hour of the trace, token hit rate in that hour:");
	for (int k = 0; k < NSYS; k++)
		fprintf(f, " %s", rsys_name[k]);
	fprintf(f, " best infinite lru_sim (NaN: not run or no request)\n");
	for (uint32_t b = 0; b < r->nbuckets; b++) {
		fprintf(f, "%.3f", (double)b * r->bucket_ms / 3600000.0);
		for (int k = 0; k < NSYS; k++)
			if (r->sys[k].ran)
				put_rate(f, r->sys[k].bucket_hit[b], r->sys[k].bucket_needed[b]);
			else
				fprintf(f, " NaN");
		put_rate(f, r->sim.bucket_hit[SIM_BEST][b], r->sim.bucket_needed[b]);
		put_rate(f, r->sim.bucket_hit[SIM_INFINITE][b], r->sim.bucket_needed[b]);
		put_rate(f, r->sim.bucket_hit[SIM_LRU][b], r->sim.bucket_needed[b]);
		fputc('\n', f);
	}
	if (fclose(f))
		goto fail;

	snprintf(path, sizeof(path), "%s/cdf.dat", dir);
	f = fopen(path, "w");
	if (!f)
		goto fail;
	fprintf(f, "# fraction of prepares (no onload), latency in us:");
	for (int k = 0; k < NSYS; k++)
		fprintf(f, " %s", rsys_name[k]);
	fprintf(f, " (NaN: not run)\n");
	for (int i = 0; i <= CDF_POINTS; i++) {
		double p = i < CDF_POINTS ? 100.0 * (i + 0.5) / CDF_POINTS : 99.9;

		fprintf(f, "%.4f", p / 100.0);
		for (int k = 0; k < NSYS; k++) {
			const struct rsys_result *s = &r->sys[k];

			if (s->ran && s->nprepare)
				fprintf(f, " %.3f", percentile_sorted(s->prepare_sorted, s->nprepare,
								      p) / 1000.0);
			else
				fprintf(f, " NaN");
		}
		fputc('\n', f);
	}
	if (fclose(f))
		goto fail;
	return 0;
fail:
	fprintf(stderr, "kvbench replay: --plot-dir: %s: %s\n", path, strerror(errno));
	return -errno;
}
