/* SPDX-License-Identifier: MIT */
/*
 * replay.c - `kvbench replay`: the recommender pipeline workload against
 * kvpool and what users would use instead, on one trace, in one run.
 *
 * The trace (generated from --seed, or --trace FILE, or --hstu DIR) is
 * replayed in time order by --pipelines processes, each owning the users
 * whose id hashes to it (a user's requests stay in order, as one inference
 * instance per user shard does), against each system in turn:
 *
 *   kvpool  a private kvpoold (shm backend), the rings
 *   inproc  the engine in this process, one pipeline: no IPC at all
 *   uds     a fresh private kvpoold, the same calls over its Unix socket
 *   redis   a private redis-server on loopback (maxmemory = the pool);
 *           skipped, with the reason, where kvbench has no hiredis
 *
 * --backend cuda (CUDA builds): kvpool only, on a private kvpoold
 * --backend=cuda with HSTU's geometry unless --layout says otherwise; the
 * pipelines append from device memory on their own streams (replay_cuda.c)
 * and the report adds the offload bandwidth the daemon measured (bytes_d2h
 * / ns_d2h over the run) against the raw pinned cudaMemcpyAsync ceilings,
 * measured afterwards on the same GPU. The other systems are not run: the
 * in-process engine and the uds mode append with the CPU into a mapped
 * tier, which a GPU pool is not, and Redis holds host bytes, so none of
 * them is the same job.
 *
 * FORK BEFORE CUDA. The pipelines are forked before the parent starts the
 * daemon or attaches to it: on the cuda backend attaching initialises CUDA,
 * and a child forked after that cannot use it. They wait on a pipe for the
 * parent to say where the system is (struct target, in shared memory).
 *
 * Each system starts empty. The pool (device tier + host tier, in pages)
 * is sized from the replayed part's working set (the largest day's
 * histories at their longest, in pages): by default a quarter of it on the
 * device and a quarter on the host, so demotion, onload and eviction all
 * happen; Redis gets the same bytes. replay_sim.h says what the hit-rate
 * references are; replay_report.c prints them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon_proc.h"
#include "hstu_csv.h"
#include "kvbench.h"
#include "replay.h"

#define SUB "replay"
#define DEFAULT_LAYOUT "layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define BUCKET_MS 3600000ull   /* hit rate over time: per hour of the trace */

const char *const rsys_name[NSYS] = { "kvpool", "inproc", "uds", "redis" };
const char *const rop_name[NOP] = { "info", "prepare", "prepare_onload", "append",
				    "commit" };

/* ---------------------------------------------------------------- progress */

static void progress(const struct rrun *r, const char *label, uint64_t done,
		     uint64_t total, uint64_t t0, bool last)
{
	const int W = 30;
	double f = total ? (double)done / (double)total : 1;
	int k = (int)(f * W);

	if (!r->o.progress)
		return;
	fprintf(stderr, "\r%-7s [%.*s%*s] %5.1f%% %" PRIu64 "/%" PRIu64 " requests %6.1f s",
		label, k, "##############################", W - k, "", 100 * f, done, total,
		(double)(now_ns() - t0) / 1e9);
	if (last)
		fputc('\n', stderr);
}

/* ---------------------------------------------------------------- sizing */

/* Requests to replay, the working set, the page table bound, the pool. */
static int size_run(struct rrun *r)
{
	const struct trace *t = &r->t;
	const uint32_t P = r->o.layout.page_tokens;
	uint64_t *key_pages = calloc(t->nkeys + 1, sizeof(uint64_t));
	uint32_t *key_day = calloc(t->nkeys + 1, sizeof(uint32_t));
	uint64_t *day_pages = NULL;
	uint32_t days = 0, cur = 0;

	if (!key_pages || !key_day)
		goto nomem;
	r->nreq = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct trace_req *q = &t->req[i];
		uint64_t pages = (trace_tokens(q->end) + P - 1) / P;

		if (!days || q->date != cur) {
			if (r->o.first_days && days == r->o.first_days)
				break;
			days++;
			cur = q->date;
		}
		if (r->o.max_requests && r->nreq == r->o.max_requests)
			break;
		key_pages[q->kid] = pages;
		key_day[q->kid] = days - 1;
		if (pages + 1 > r->max_pages)
			r->max_pages = (uint32_t)pages + 1;
		r->nreq++;
	}
	day_pages = calloc(days + 1, sizeof(*day_pages));
	if (!day_pages)
		goto nomem;
	for (uint32_t k = 0; k < t->nkeys; k++)
		day_pages[key_day[k]] += key_pages[k];
	for (uint32_t d = 0; d < days; d++)
		if (day_pages[d] > r->working_set_pages)
			r->working_set_pages = day_pages[d];
	r->device_pages = r->o.device_pages ? r->o.device_pages :
			  (uint64_t)ceil(r->working_set_pages * r->o.device_frac);
	r->host_pages = r->o.host_pages ? r->o.host_pages :
			(uint64_t)ceil(r->working_set_pages * r->o.host_frac);
	/* Every pipeline must be able to hold its largest lease at once. */
	if (!r->o.device_pages && r->device_pages < (r->o.pipelines + 1) * r->max_pages)
		r->device_pages = (r->o.pipelines + 1) * r->max_pages;
	r->t0_ms = t->req[0].ts_ms / 86400000ull * 86400000ull;
	r->bucket_ms = BUCKET_MS;
	r->nbuckets = (uint32_t)((t->req[r->nreq - 1].ts_ms - r->t0_ms) / BUCKET_MS + 1);
	free(key_pages);
	free(key_day);
	free(day_pages);
	return 0;
nomem:
	free(key_pages);
	free(key_day);
	free(day_pages);
	fprintf(stderr, "kvbench replay: out of memory sizing the run\n");
	return -ENOMEM;
}

static double memcpy_rate(void)
{
	const size_t n = 64u << 20;
	char *a = malloc(n), *b = malloc(n);
	double best[5];

	if (!a || !b) {
		free(a);
		free(b);
		return 0;
	}
	memset(a, 1, n);
	memset(b, 2, n);
	for (int i = 0; i < 5; i++) {
		uint64_t t0 = now_ns();

		memcpy(b, a, n);
		__asm__ volatile("" ::: "memory");
		best[i] = (double)n / ((double)(now_ns() - t0) / 1e9);
	}
	free(a);
	free(b);
	return median_f64(best, 5);
}

/* ---------------------------------------------------------------- results */

static int collect(struct rrun *r, struct rsys_result *res, struct rpipe_out *outs,
		   uint64_t **samples, uint64_t *buckets, uint32_t np)
{
	uint64_t t_start = UINT64_MAX, t_end = 0;

	res->bucket_needed = calloc(r->nbuckets, sizeof(uint64_t));
	res->bucket_hit = calloc(r->nbuckets, sizeof(uint64_t));
	if (!res->bucket_needed || !res->bucket_hit)
		return -ENOMEM;
	for (uint32_t k = 0; k < np; k++) {
		const struct rpipe_out *o = &outs[k];

		res->requests += o->requests;
		res->batches += o->batches;
		res->needed += o->needed;
		res->hit += o->hit;
		res->appended += o->appended;
		res->onload_pages += o->onload_pages;
		res->onload_ns += o->onload_ns;
		res->reprepares += o->reprepares;
		res->pinned_waits += o->pinned_waits;
		if (o->t_start < t_start)
			t_start = o->t_start;
		if (o->t_end > t_end)
			t_end = o->t_end;
		for (uint32_t b = 0; b < r->nbuckets; b++) {
			res->bucket_needed[b] += buckets[(2 * k) * r->nbuckets + b];
			res->bucket_hit[b] += buckets[(2 * k + 1) * r->nbuckets + b];
		}
	}
	res->wall_s = t_end > t_start ? (double)(t_end - t_start) / 1e9 : 0;
	for (int op = 0; op < NOP; op++) {
		struct samples all = { 0 };
		size_t total = 0;

		for (uint32_t k = 0; k < np; k++)
			total += outs[k].nsamples[op];
		if (samples_init(&all, total ? total : 1))
			return -ENOMEM;
		for (uint32_t k = 0; k < np; k++) {
			struct samples one = { .v = samples[k * NOP + op],
					       .n = outs[k].nsamples[op],
					       .cap = REPLAY_SAMPLES_CAP };

			samples_append(&all, &one);
		}
		samples_summarize(&all, &res->lat[op]);
		if (op == OP_PREPARE) {
			res->prepare_sorted = all.v;
			res->nprepare = all.n;
		} else {
			samples_free(&all);
		}
	}
	res->ran = true;
	return 0;
}

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

/* ---------------------------------------------------------------- processes */

/* Where a system is: filled by the parent after the fork, in memory it
 * shares with the pipelines. */
struct target {
	char socket[256];     /* kvpool, uds */
	char host[128];       /* redis */
	int port;
	int ok;               /* 0: the parent could not set the system up */
	uint64_t salt;
};

/* The parent's side of starting a system: fill *tg (and *stat_c, a client
 * for the pool's counters, where there is a pool). 0 or -errno. */
typedef int (*setup_fn)(struct rrun *r, enum rsys_id id, struct target *tg,
			struct kvp_client **stat_c);

/* A pipeline's device buffer: a batch of the largest requests' tokens. */
static uint64_t gpu_buffer_bytes(const struct rrun *r)
{
	return r->o.batch * (uint64_t)r->max_pages * r->o.layout.page_bytes;
}

static int open_sys(enum rsys_id id, const struct rrun *r, const struct target *tg,
		    void **ctx, char *err, size_t errlen)
{
	switch (id) {
	case SYS_KVPOOL:
	case SYS_UDS:
		return rsys_kvpool_open(ctx, tg->socket, id == SYS_UDS, r->max_pages,
					(uint32_t)r->o.d.client_spin_us,
					r->o.backend == RB_CUDA ? gpu_buffer_bytes(r) : 0,
					err, errlen);
	case SYS_REDIS:
		return rsys_redis_open(ctx, tg->host, tg->port, r->o.layout.page_tokens,
				       r->o.layout.token_bytes, r->max_pages, err, errlen);
	default:
		return -EINVAL;
	}
}

static void close_sys(enum rsys_id id, void *ctx)
{
	if (id == SYS_REDIS)
		rsys_redis_close(ctx);
	else
		rsys_kvpool_close(ctx);
}

static const struct rsys_ops *sys_ops(const struct rrun *r, enum rsys_id id)
{
#if REPLAY_CUDA
	if (id == SYS_KVPOOL && r->o.backend == RB_CUDA)
		return &rsys_kvpool_cuda_ops;
#endif
	return id == SYS_KVPOOL ? &rsys_kvpool_ops : id == SYS_UDS ? &rsys_uds_ops :
	       id == SYS_REDIS ? &rsys_redis_ops : &rsys_inproc_ops;
}

/* Which pipeline serves a user: a hash, so heavy users spread. */
static uint32_t pipeline_of(uint32_t user, uint32_t np)
{
	return (uint32_t)(((uint64_t)user * 0x9e3779b97f4a7c15ull) >> 40) % np;
}

static void fill_pipe(struct rpipe *p, const struct rrun *r, const void *kv,
		      uint64_t salt)
{
	p->t = &r->t;
	p->batch = (uint32_t)r->o.batch;
	p->page_tokens = r->o.layout.page_tokens;
	p->token_bytes = r->o.layout.token_bytes;
	p->key_salt = salt;
	p->max_pages = r->max_pages;
	p->kv = kv;
	p->t0_ms = r->t0_ms;
	p->bucket_ms = r->bucket_ms;
	p->nbuckets = r->nbuckets;
}

static int run_procs(struct rrun *r, enum rsys_id id, setup_fn setup, const void *kv,
		     struct kvp_stats *s0, struct kvp_stats *s1, struct kvp_client **stat_cp)
{
	const uint32_t np = (uint32_t)r->o.pipelines;
	const size_t out_b = np * sizeof(struct rpipe_out);
	const size_t bk_b = (size_t)np * 2 * r->nbuckets * sizeof(uint64_t);
	const size_t sm_b = (size_t)np * NOP * REPLAY_SAMPLES_CAP * sizeof(uint64_t);
	struct rpipe_out *outs = mmap(NULL, out_b, PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t *bk = mmap(NULL, bk_b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t *sm = mmap(NULL, sm_b, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint32_t **reqs = calloc(np, sizeof(*reqs));
	size_t *nreqs = calloc(np, sizeof(*nreqs));
	pid_t *pids = calloc(np, sizeof(*pids)), parent = getpid();
	struct target *tg = mmap(NULL, sizeof(*tg), PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct kvp_client *stat_c = NULL;
	uint64_t *smp[NOP * 256];
	int ready[2] = { -1, -1 }, go[2] = { -1, -1 }, start[2] = { -1, -1 }, status = 0;
	uint32_t started = 0, nready = 0, alive;
	uint64_t t0;
	char byte = 1;

	if (outs == MAP_FAILED || bk == MAP_FAILED || sm == MAP_FAILED || tg == MAP_FAILED ||
	    !reqs || !nreqs || !pids || pipe2(ready, O_CLOEXEC) || pipe2(go, O_CLOEXEC) ||
	    pipe2(start, O_CLOEXEC)) {
		fprintf(stderr, "kvbench replay: out of memory (or pipes) for %u pipelines\n", np);
		status = -ENOMEM;
		goto out;
	}
	for (uint32_t k = 0; k < np; k++) {
		reqs[k] = malloc((r->nreq + 1) * sizeof(uint32_t));
		if (!reqs[k]) {
			status = -ENOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < r->nreq; i++) {
		uint32_t k = pipeline_of(r->t.req[i].user, np);

		reqs[k][nreqs[k]++] = (uint32_t)i;
	}
	for (uint32_t k = 0; k < np; k++)
		for (int op = 0; op < NOP; op++)
			smp[k * NOP + op] = sm + ((size_t)k * NOP + op) * REPLAY_SAMPLES_CAP;
	fflush(NULL);
	for (uint32_t k = 0; k < np; k++) {
		pid_t pid = fork();

		if (pid < 0) {
			fprintf(stderr, "kvbench replay: fork: %s\n", strerror(errno));
			status = -errno;
			break;
		}
		if (pid == 0) {
			struct rpipe p = { .reqs = reqs[k], .nreqs = nreqs[k], .out = &outs[k],
					   .bucket_needed = bk + 2 * k * r->nbuckets,
					   .bucket_hit = bk + (2 * k + 1) * r->nbuckets };
			void *ctx = NULL;
			int rc;

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(KVB_EXIT_FAIL);
			close(ready[0]);
			close(go[1]);
			close(start[1]);
			/* EOF once the parent has set the system up (or failed to). */
			while (read(start[0], &byte, 1) < 0 && errno == EINTR)
				;
			if (!__atomic_load_n(&tg->ok, __ATOMIC_ACQUIRE))
				_exit(KVB_EXIT_FAIL);
			fill_pipe(&p, r, kv, tg->salt);
			for (int op = 0; op < NOP; op++)
				p.samples[op] = smp[k * NOP + op];
			rc = open_sys(id, r, tg, &ctx, outs[k].err, sizeof(outs[k].err));
			if (rc)
				outs[k].status = rc;
			if (write(ready[1], &byte, 1) != 1 || rc)
				_exit(KVB_EXIT_FAIL);
			close(ready[1]);
			while (read(go[0], &byte, 1) < 0 && errno == EINTR)
				;
			rc = rpipe_run(&p, sys_ops(r, id), ctx);
			close_sys(id, ctx);
			_exit(rc ? KVB_EXIT_FAIL : KVB_EXIT_OK);
		}
		pids[k] = pid;
		started++;
	}
	close(ready[1]);
	ready[1] = -1;
	close(go[0]);
	go[0] = -1;
	close(start[0]);
	start[0] = -1;
	/* The pipelines exist: now the parent may start and attach (CUDA).
	 * The pipes are O_CLOEXEC: a daemon started here must not hold start[1]
	 * open, or the pipelines would never see its EOF. */
	status = started == np ? setup(r, id, tg, &stat_c) : -EIO;
	__atomic_store_n(&tg->ok, status == 0, __ATOMIC_RELEASE);
	close(start[1]);
	start[1] = -1;
	if (status) {
		for (uint32_t k = 0; k < started; k++)
			waitpid(pids[k], NULL, 0);
		goto out;
	}
	while (nready < started && read(ready[0], &byte, 1) == 1)
		nready++;
	bool counters = stat_c && kvp_stats(stat_c, 0, s0) >= 0;

	t0 = now_ns();
	close(go[1]);
	go[1] = -1;
	alive = started;
	while (alive) {
		uint64_t done = 0;
		struct timespec ts = { 0, 100000000 };

		for (uint32_t k = 0; k < started; k++) {
			int st;

			if (pids[k] > 0 && waitpid(pids[k], &st, WNOHANG) == pids[k]) {
				pids[k] = -pids[k];
				alive--;
				if (!WIFEXITED(st) || WEXITSTATUS(st)) {
					status = -EIO;
					fprintf(stderr, "%skvbench replay: %s pipeline %u: %s\n",
						r->o.progress ? "\n" : "", rsys_name[id], k,
						outs[k].err[0] ? outs[k].err : WIFSIGNALED(st) ?
						strsignal(WTERMSIG(st)) : "failed");
				}
			}
			done += __atomic_load_n(&outs[k].done, __ATOMIC_RELAXED);
		}
		progress(r, rsys_name[id], done, r->nreq, t0, !alive);
		if (alive)
			nanosleep(&ts, NULL);
	}
	if (counters && kvp_stats(stat_c, 0, s1) < 0)
		memset(s1, 0, sizeof(*s1));
	if (!status && started == np)
		status = collect(r, &r->sys[id], outs, smp, bk, np);
	else if (!status)
		status = -EIO;
out:
	if (ready[0] >= 0)
		close(ready[0]);
	if (ready[1] >= 0)
		close(ready[1]);
	if (go[0] >= 0)
		close(go[0]);
	if (go[1] >= 0)
		close(go[1]);
	if (start[0] >= 0)
		close(start[0]);
	if (start[1] >= 0)
		close(start[1]);
	if (tg != MAP_FAILED)
		munmap(tg, sizeof(*tg));
	*stat_cp = stat_c;
	for (uint32_t k = 0; reqs && k < np; k++)
		free(reqs[k]);
	free(reqs);
	free(nreqs);
	free(pids);
	if (outs != MAP_FAILED)
		munmap(outs, out_b);
	if (bk != MAP_FAILED)
		munmap(bk, bk_b);
	if (sm != MAP_FAILED)
		munmap(sm, sm_b);
	return status;
}

/* ---------------------------------------------------------------- systems */

/* kvpoold --backend=cuda with the run's tiers: kvb_daemon_open() starts
 * only shm daemons, so the flags are made here (the later --backend wins). */
static int cuda_daemon_start(struct rrun *r, struct kvb_daemon *d, char *err, size_t errlen)
{
	const struct kvb_daemon_opts *o = &r->o.d;
	char path[PATH_MAX], f[8][320];
	const char *flags[9];
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
	n += kvb_daemon_disk_flags(o, f + n);
	for (int i = 0; i < n; i++)
		flags[i] = f[i];
	flags[n] = NULL;
	/* A GPU pool takes longer to set up than a memfd. */
	return kvb_daemon_start(d, path, flags, o->cpu, 60000, err, errlen);
}

static int daemon_setup(struct rrun *r, enum rsys_id id, struct target *tg,
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

static int run_daemon_sys(struct rrun *r, enum rsys_id id, const void *kv)
{
	struct rsys_result *res = &r->sys[id];
	struct kvp_stats s0 = { 0 }, s1 = { 0 };
	struct kvp_client *stat_c = NULL;
	char err[1024];
	int rc, device = -1;

	rc = run_procs(r, id, daemon_setup, kv, &s0, &s1, &stat_c);
	if (!rc) {
		stats_delta(&res->stats, &s0, &s1);
		res->have_stats = s1.prepares > 0;
		res->device_frames = s1.tier[KVP_TIER_DEVICE].frames_total;
		res->host_frames = s1.tier[KVP_TIER_HOST].frames_total;
	}
	if (stat_c) {
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

static int run_inproc(struct rrun *r, const void *kv)
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
	fill_pipe(&p, r, kv, 0);
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
	progress(r, "inproc", 0, r->nreq, now_ns(), false);
	rc = rpipe_run(&p, &rsys_inproc_ops, ctx);
	progress(r, "inproc", out.requests, r->nreq, out.t_start, true);
	if (rc) {
		fprintf(stderr, "kvbench replay: inproc: %s\n", out.err);
		goto out;
	}
	rsys_inproc_stats(ctx, &r->sys[SYS_INPROC].stats);
	r->sys[SYS_INPROC].have_stats = true;
	r->sys[SYS_INPROC].device_frames = r->device_pages;
	r->sys[SYS_INPROC].host_frames = r->host_pages;
	rc = collect(r, &r->sys[SYS_INPROC], &out, smp, bk, 1);
out:
	if (ctx)
		rsys_inproc_close(ctx);
	for (int op = 0; op < NOP; op++)
		free(smp[op]);
	free(bk);
	free(reqs);
	return rc;
}

static int redis_setup(struct rrun *r, enum rsys_id id, struct target *tg,
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

static int run_redis(struct rrun *r, const void *kv)
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
	rc = run_procs(r, SYS_REDIS, redis_setup, kv, NULL, NULL, &none);
	snprintf(r->sys[SYS_REDIS].note, sizeof(r->sys[SYS_REDIS].note), "%s", r->redis_where);
	if (!r->o.redis && redis_server_stop(&r->redis, err, sizeof(err))) {
		fprintf(stderr, "kvbench replay: %s\n", err);
		rc = rc ? rc : -EIO;
	}
	return rc;
}

/* ---------------------------------------------------------------- options */

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

static int parse_opts(int argc, char **argv, struct ropts *o)
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

/* ---------------------------------------------------------------- main */

static int load_trace(struct rrun *r)
{
	char err[1024] = "";
	int rc;

	if (r->o.trace_path) {
		FILE *f = fopen(r->o.trace_path, "r");

		if (!f) {
			fprintf(stderr, "kvbench replay: --trace %s: %s\n", r->o.trace_path,
				strerror(errno));
			return -errno;
		}
		rc = trace_read(&r->t, f, r->o.trace_path, err, sizeof(err));
		fclose(f);
	} else if (r->o.hstu_dir) {
		rc = hstu_load_dir(&r->t, r->o.hstu_dir, err, sizeof(err));
	} else {
		rc = trace_generate(&r->t, &r->o.gen, err, sizeof(err));
	}
	if (rc)
		fprintf(stderr, "kvbench replay: %s\n", err);
	return rc;
}

static void free_run(struct rrun *r)
{
	for (int k = 0; k < NSYS; k++) {
		free(r->sys[k].prepare_sorted);
		free(r->sys[k].bucket_needed);
		free(r->sys[k].bucket_hit);
	}
	free(r->sim.bucket_needed);
	for (int s = 0; s < NSIM; s++)
		free(r->sim.bucket_hit[s]);
	trace_free(&r->t);
}

int cmd_replay(int argc, char **argv)
{
	static struct rrun r;
	void *kv = NULL;
	int rc, status = KVB_EXIT_FAIL;

	memset(&r, 0, sizeof(r));
	rc = parse_opts(argc, argv, &r.o);
	if (rc >= 0)
		return rc;
	kvb_machine_info(&r.m, -1);
	if (load_trace(&r) || trace_stats(&r.t, &r.ts) || size_run(&r))
		goto out;
	r.o.d.device_mem = r.device_pages * r.o.layout.page_bytes;
	r.o.d.host_mem = r.host_pages * r.o.layout.page_bytes;
	r.o.d.layout = r.o.layout_spec;
	r.sim.bucket_needed = calloc(r.nbuckets, sizeof(uint64_t));
	for (int s = 0; s < NSIM; s++)
		r.sim.bucket_hit[s] = calloc(r.nbuckets, sizeof(uint64_t));
	kv = malloc((size_t)r.max_pages * r.o.layout.page_bytes);
	if (!kv || !r.sim.bucket_needed || !r.sim.bucket_hit[NSIM - 1] ||
	    sim_run(&r.t, r.nreq, r.o.layout.page_tokens, r.device_pages + r.host_pages,
		    r.t0_ms, r.bucket_ms, r.nbuckets, &r.sim)) {
		fprintf(stderr, "kvbench replay: out of memory for the simulation\n");
		goto out;
	}
	memset(kv, 0x5a, (size_t)r.max_pages * r.o.layout.page_bytes);
	r.memcpy_bytes_per_s = memcpy_rate();

	rc = 0;
	if (r.o.systems & (1u << SYS_KVPOOL))
		rc = run_daemon_sys(&r, SYS_KVPOOL, kv);
	if (!rc && (r.o.systems & (1u << SYS_INPROC)))
		rc = run_inproc(&r, kv);
	if (!rc && (r.o.systems & (1u << SYS_UDS)))
		rc = run_daemon_sys(&r, SYS_UDS, kv);
	if (!rc && (r.o.systems & (1u << SYS_REDIS)))
		rc = run_redis(&r, kv);
	if (rc)
		goto out;
	if (r.o.json)
		replay_print_json(&r);
	else
		replay_print_table(&r);
	status = KVB_EXIT_OK;
	if (r.o.md_path && replay_write_md(&r, r.o.md_path))
		status = KVB_EXIT_FAIL;
	if (r.o.plot_dir && replay_write_plot_data(&r, r.o.plot_dir))
		status = KVB_EXIT_FAIL;
out:
	free(kv);
	free_run(&r);
	return status;
}
