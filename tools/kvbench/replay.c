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
 *
 * This file is the run from the top: the trace, the pool's size, the
 * reference simulation, the systems one after the other, the report.
 * replay_opts.c parses the options, replay_run.c runs one system (starts
 * its server, stops it, keeps its counters), replay_procs.c forks the
 * pipelines and collects what they measured.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hstu_csv.h"
#include "kvbench.h"
#include "replay.h"

#define BUCKET_MS 3600000ull   /* hit rate over time: per hour of the trace */

const char *const rsys_name[NSYS] = { "kvpool", "inproc", "uds", "redis" };
const char *const rop_name[NOP] = { "info", "prepare", "prepare_onload", "append",
				    "commit" };

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
	rc = replay_parse_opts(argc, argv, &r.o);
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
		rc = replay_run_daemon(&r, SYS_KVPOOL, kv);
	if (!rc && (r.o.systems & (1u << SYS_INPROC)))
		rc = replay_run_inproc(&r, kv);
	if (!rc && (r.o.systems & (1u << SYS_UDS)))
		rc = replay_run_daemon(&r, SYS_UDS, kv);
	if (!rc && (r.o.systems & (1u << SYS_REDIS)))
		rc = replay_run_redis(&r, kv);
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
