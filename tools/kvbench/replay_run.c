/* SPDX-License-Identifier: MIT */
/*
 * replay_run.c - one system of `kvbench replay`, from start to stop: the
 * parent's setup (a private kvpoold, shm or cuda, or a running one; a
 * private redis-server or a running Redis), the pipelines run against it
 * (replay_procs.c), the pool's counters over the run, the copy ceilings of
 * a cuda run, and the stop. The in-process engine runs here too, in this
 * process, as one pipeline.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_proc.h"
#include "kvbench.h"
#include "replay.h"

static void stats_delta(struct kvp_stats *d, const struct kvp_stats *a,
			const struct kvp_stats *b)
{
	*d = *b;
#define D(f) d->f = b->f - a->f
	D(prepares); D(commits); D(releases); D(hit_tokens); D(committed_tokens);
	D(evicted_users); D(evicted_pages); D(demoted_users); D(demoted_pages);
	D(offloaded_pages); D(onloaded_pages); D(trimmed_pages); D(bytes_d2h); D(bytes_h2d);
	D(ns_d2h); D(reclaim_stalls); D(reclaimed_pages);
	D(reclaim_onload_stalls); D(reclaim_direct);
#undef D
}

/* kvpoold --backend=cuda with the run's tiers: kvb_daemon_open() starts
 * only shm daemons, so the flags are made here (the later --backend wins). */
static int cuda_daemon_start(struct rrun *r, struct kvb_daemon *d, char *err, size_t errlen)
{
	const struct kvb_daemon_opts *o = &r->o.d;
	char path[PATH_MAX], f[8 + KVB_DAEMON_EXTRA][320];
	const char *flags[9 + KVB_DAEMON_EXTRA];
	int n = 0, rc;

	rc = kvb_daemon_find(o->kvpoold, path, sizeof(path), err, errlen);
	if (rc)
		return rc;
	snprintf(f[n++], sizeof(f[0]), "--backend=cuda");
	snprintf(f[n++], sizeof(f[0]), "--device_mem=%lluK",
		 (unsigned long long)((o->device_mem + 1023) / 1024));
	snprintf(f[n++], sizeof(f[0]), "--host_mem=%lluK",
		 (unsigned long long)((o->host_mem + 1023) / 1024));
	snprintf(f[n++], sizeof(f[0]), "--layout=%s", o->layout);
	if (o->spin_us >= 0)
		snprintf(f[n++], sizeof(f[0]), "--spin_us=%lld", (long long)o->spin_us);
	if (o->workers)
		snprintf(f[n++], sizeof(f[0]), "--workers=%llu", (unsigned long long)o->workers);
	n += kvb_daemon_tail_flags(o, f + n);
	for (int i = 0; i < n; i++)
		flags[i] = f[i];
	flags[n] = NULL;
	/* A GPU pool takes longer to set up than a memfd. */
	return kvb_daemon_start(d, path, flags, o->cpu, 60000, err, errlen);
}

static int daemon_setup(struct rrun *r, enum rsys_id id, struct rtarget *tg,
			struct kvp_client **stat_c)
{
	struct kvp_connect_opts co = { .name = "kvbench-replay-stats" };
	struct kvb_daemon *d = &r->daemon;
	const char *sock = NULL;
	char err[1024];
	int rc;

	memset(d, 0, sizeof(*d));
	if (r->o.backend == RB_CUDA && !r->o.d.socket) {
		rc = cuda_daemon_start(r, d, err, sizeof(err));
		sock = d->sock;
	} else {
		rc = kvb_daemon_open(d, &r->o.d, &sock, err, sizeof(err));
	}
	if (rc) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		return -EIO;
	}
	snprintf(tg->socket, sizeof(tg->socket), "%s", sock);
	/* A running daemon keeps what the systems before left: other keys. */
	if (r->o.d.socket)
		tg->salt = (uint64_t)(id + 1) << 56;
	co.socket = tg->socket;
	rc = kvp_connect(stat_c, &co, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		return rc;
	}
	if (kvp_client_layout(*stat_c)->token_bytes != r->o.layout.token_bytes ||
	    kvp_client_layout(*stat_c)->page_tokens != r->o.layout.page_tokens) {
		char have[256];

		kvp_layout_format(kvp_client_layout(*stat_c), have, sizeof(have));
		fprintf(stderr, "kvbench replay: the kvpoold at %s serves %s, not %s; pass "
			"--layout %s\n", tg->socket, have, r->o.layout_spec, have);
		return -EINVAL;
	}
	/* Where a ring prepare's time goes (kvp_ring_phases; admin: turns
	 * the daemon's timing on). Without the right, the report has none. */
	r->sys[id].have_phases = kvp_ring_phases(*stat_c, &r->sys[id].ph0) == 0;
	if (r->o.backend == RB_CUDA && kvp_cuda_device(*stat_c) < 0) {
		fprintf(stderr, "kvbench replay: --backend cuda: the kvpoold at %s serves its "
			"pool from host memory (backend shm)\n", tg->socket);
		return -EINVAL;
	}
	return 0;
}

#if REPLAY_CUDA
/* The raw copy ceilings on the pool's GPU, k = the mean demotion's pages. */
static void measure_ceiling(struct rrun *r, int device)
{
	const struct kvp_stats *st = &r->sys[SYS_KVPOOL].stats;
	const uint64_t pb = r->o.layout.page_bytes;
	uint64_t dem = st->demoted_users ? st->demoted_users : 1;
	uint64_t k = (st->bytes_d2h / pb + dem / 2) / dem;

	if (r->o.progress)
		fprintf(stderr, "ceiling: raw pinned cudaMemcpyAsync on GPU %d ...\n", device);
	if (rgpu_measure_ceiling(device, pb, k > UINT32_MAX ? UINT32_MAX : (uint32_t)k,
				 &r->ceil, r->ceiling_err, sizeof(r->ceiling_err)))
		fprintf(stderr, "kvbench replay: %s\n", r->ceiling_err);
	else
		r->have_ceiling = true;
}
#endif

int replay_run_daemon(struct rrun *r, enum rsys_id id, const void *kv)
{
	struct rsys_result *res = &r->sys[id];
	struct kvp_stats s0 = { 0 }, s1 = { 0 };
	struct kvp_client *stat_c = NULL;
	char err[1024];
	int rc, device = -1;

	rc = replay_run_procs(r, id, daemon_setup, kv, &s0, &s1, &stat_c);
	if (!rc) {
		stats_delta(&res->stats, &s0, &s1);
		res->have_stats = s1.prepares > 0;
		res->device_frames = s1.tier[KVP_TIER_DEVICE].frames_total;
		res->host_frames = s1.tier[KVP_TIER_HOST].frames_total;
	}
	if (stat_c) {
		if (res->have_phases)
			res->have_phases = kvp_ring_phases(stat_c, &res->ph1) == 0;
		device = kvp_cuda_device(stat_c);
		kvp_close(stat_c);
	}
	if (kvb_daemon_stop(&r->daemon, 10000, err, sizeof(err))) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		rc = rc ? rc : -EIO;
	}
#if REPLAY_CUDA
	if (!rc && r->o.backend == RB_CUDA && device >= 0)
		measure_ceiling(r, device);
#else
	(void)device;
#endif
	return rc;
}

int replay_run_inproc(struct rrun *r, const void *kv)
{
	struct rpipe_out out = { 0 };
	struct rpipe p = { .out = &out, .nreqs = r->nreq };
	uint64_t *bk = calloc(2 * (size_t)r->nbuckets, sizeof(uint64_t));
	uint32_t *reqs = malloc((r->nreq + 1) * sizeof(uint32_t));
	uint64_t *smp[NOP] = { 0 };
	void *ctx = NULL;
	char err[512];
	int rc = -ENOMEM;

	if (!bk || !reqs)
		goto out;
	for (int op = 0; op < NOP; op++)
		if (!(smp[op] = malloc(REPLAY_SAMPLES_CAP * sizeof(uint64_t))))
			goto out;
	for (size_t i = 0; i < r->nreq; i++)
		reqs[i] = (uint32_t)i;
	replay_fill_pipe(&p, r, kv, 0);
	p.reqs = reqs;
	p.bucket_needed = bk;
	p.bucket_hit = bk + r->nbuckets;
	for (int op = 0; op < NOP; op++)
		p.samples[op] = smp[op];
	rc = rsys_inproc_open(&ctx, &r->o.layout, (uint32_t)r->device_pages,
			      (uint32_t)r->host_pages, r->max_pages, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		goto out;
	}
	replay_progress(r, "inproc", 0, r->nreq, now_ns(), false);
	rc = rpipe_run(&p, &rsys_inproc_ops, ctx);
	replay_progress(r, "inproc", out.requests, r->nreq, out.t_start, true);
	if (rc) {
		fprintf(stderr, "kvbench replay: inproc: %s\n", out.err);
		goto out;
	}
	rsys_inproc_stats(ctx, &r->sys[SYS_INPROC].stats);
	r->sys[SYS_INPROC].have_stats = true;
	r->sys[SYS_INPROC].device_frames = r->device_pages;
	r->sys[SYS_INPROC].host_frames = r->host_pages;
	rc = replay_collect(r, &r->sys[SYS_INPROC], &out, smp, bk, 1);
out:
	if (ctx)
		rsys_inproc_close(ctx);
	for (int op = 0; op < NOP; op++)
		free(smp[op]);
	free(bk);
	free(reqs);
	return rc;
}

static int redis_setup(struct rrun *r, enum rsys_id id, struct rtarget *tg,
		       struct kvp_client **stat_c)
{
	const uint64_t bytes = (r->device_pages + r->host_pages) * r->o.layout.page_bytes;
	char err[1024];
	int rc;

	if (r->o.redis) {
		const char *colon = strrchr(r->o.redis, ':');

		snprintf(tg->host, sizeof(tg->host), "%.*s", (int)(colon - r->o.redis), r->o.redis);
		tg->port = atoi(colon + 1);
		tg->salt = (uint64_t)getpid() << 40;
		snprintf(r->redis_where, sizeof(r->redis_where), "%s (running; its own maxmemory)",
			 r->o.redis);
		return 0;
	}
	rc = redis_server_start(&r->redis, r->o.redis_server, bytes, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		return rc;
	}
	snprintf(tg->host, sizeof(tg->host), "127.0.0.1");
	tg->port = r->redis.port;
	snprintf(r->redis_where, sizeof(r->redis_where), "127.0.0.1:%d, maxmemory %" PRIu64
		 " B allkeys-lru, no persistence", tg->port, bytes);
	return 0;
}

int replay_run_redis(struct rrun *r, const void *kv)
{
	struct kvp_client *none = NULL;
	char err[1024];
	int rc;

	if (!KVBENCH_HAVE_HIREDIS) {
		void *ctx = NULL;

		/* The stub says why: reported as skipped, the run goes on. */
		char *why = r->sys[SYS_REDIS].skipped;
		const size_t whylen = sizeof(r->sys[SYS_REDIS].skipped);

		rc = rsys_redis_open(&ctx, "127.0.0.1", 0, r->o.layout.page_tokens,
				     r->o.layout.token_bytes, r->max_pages, why, whylen);
		if (rc == -ENOSYS) {
			fprintf(stderr, "kvbench replay: redis skipped: %s\n", why);
			return 0;
		}
		why[0] = '\0';
		if (!rc)
			rsys_redis_close(ctx);
	}
	rc = replay_run_procs(r, SYS_REDIS, redis_setup, kv, NULL, NULL, &none);
	snprintf(r->sys[SYS_REDIS].note, sizeof(r->sys[SYS_REDIS].note), "%s", r->redis_where);
	if (!r->o.redis && redis_server_stop(&r->redis, err, sizeof(err))) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		rc = rc ? rc : -EIO;
	}
	return rc;
}
