/* SPDX-License-Identifier: MIT */
/*
 * replay_procs.c - the parent's side of `kvbench replay`'s pipeline
 * processes: share out the requests by user, fork the pipelines before the
 * system is set up (FORK BEFORE CUDA, replay.c), tell them where it is
 * (struct rtarget, in shared memory), start them together, draw the
 * progress bar while they run, and collect what they measured into the
 * system's result. What one pipeline does is replay_pipeline.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvbench.h"
#include "replay.h"

/* ---------------------------------------------------------------- progress */

void replay_progress(const struct rrun *r, const char *label, uint64_t done,
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

/* ---------------------------------------------------------------- results */

int replay_collect(struct rrun *r, struct rsys_result *res, struct rpipe_out *outs,
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

/* ---------------------------------------------------------------- processes */

/* A pipeline's device buffer: a batch of the largest requests' tokens. */
static uint64_t gpu_buffer_bytes(const struct rrun *r)
{
	return r->o.batch * (uint64_t)r->max_pages * r->o.layout.page_bytes;
}

static int open_sys(enum rsys_id id, const struct rrun *r, const struct rtarget *tg,
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

void replay_fill_pipe(struct rpipe *p, const struct rrun *r, const void *kv, uint64_t salt)
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

int replay_run_procs(struct rrun *r, enum rsys_id id, replay_setup_fn setup,
		     const void *kv, struct kvp_stats *s0, struct kvp_stats *s1,
		     struct kvp_client **stat_cp)
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
	struct rtarget *tg = mmap(NULL, sizeof(*tg), PROT_READ | PROT_WRITE,
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
			replay_fill_pipe(&p, r, kv, tg->salt);
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
		replay_progress(r, rsys_name[id], done, r->nreq, t0, !alive);
		if (alive)
			nanosleep(&ts, NULL);
	}
	if (counters && kvp_stats(stat_c, 0, s1) < 0)
		memset(s1, 0, sizeof(*s1));
	if (!status && started == np)
		status = replay_collect(r, &r->sys[id], outs, smp, bk, np);
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
