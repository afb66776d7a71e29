/* SPDX-License-Identifier: MIT */
/*
 * throughput_client.c - one client process of `kvbench throughput`: attach,
 * wait at the barrier, then step through its users until the shared
 * timeline's window closes, counting only the steps whose last completion
 * falls inside the window (see bench_throughput.c for the whole picture).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvpool_bench.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"
#include "throughput.h"

struct child {
	const struct opts *o;
	struct child_result *r;
	uint64_t *lat[NLAT];     /* SAMPLES_CAP each, in shared memory */
	struct kvp_client *c;
	uint64_t *id;            /* user ids */
	uint64_t *pos;           /* start + len of each user's history */
	uint32_t cursor;
	uint32_t *batch_users;
	struct kvp_lease *leases;
	struct kvp_completion *comp;
	void *kv;                /* one token of K and V */
};

__attribute__((format(printf, 3, 4)))
static int child_fail(struct child *ch, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ch->r->err, sizeof(ch->r->err), fmt, ap);
	va_end(ap);
	ch->r->status = rc ? rc : -EIO;
	return ch->r->status;
}

/* Submit what is queued and reap all n completions into ch->comp. */
static int submit_reap(struct child *ch, uint32_t n, const char *what)
{
	uint32_t got = 0;
	int rc;

	rc = kvp_submit(ch->c);
	if (rc < 0)
		return child_fail(ch, rc, "kvp_submit (%s): %s", what, kvp_last_error(ch->c));
	while (got < n) {
		rc = kvp_reap(ch->c, ch->comp + got, n - got, n - got);
		if (rc < 0)
			return child_fail(ch, rc, "kvp_reap (%s): %s", what,
					  kvp_last_error(ch->c));
		got += (uint32_t)rc;
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct kvp_completion *k = &ch->comp[i];

		if (k->res < 0)
			return child_fail(ch, k->res, "%s of user %#" PRIx64 " failed (%d): %s",
					  what, ch->id[ch->batch_users[k->tag]], k->res,
					  k->error ? k->error : "?");
	}
	return 0;
}

/* One step over the next batch of users; times into t[4]. */
static int step(struct child *ch, uint64_t t[4])
{
	const uint32_t B = (uint32_t)ch->o->batch, U = (uint32_t)ch->o->users;
	uint32_t i;
	int rc;

	for (i = 0; i < B; i++) {
		ch->batch_users[i] = ch->cursor;
		if (++ch->cursor == U)
			ch->cursor = 0;
	}
	t[0] = now_ns();
	for (i = 0; i < B; i++) {
		uint32_t u = ch->batch_users[i];

		rc = kvp_queue_prepare(ch->c, ch->id[u], ch->pos[u], 1, i);
		if (rc < 0)
			return child_fail(ch, rc, "kvp_queue_prepare: %s", kvp_last_error(ch->c));
	}
	rc = submit_reap(ch, B, "prepare");
	if (rc)
		return rc;
	t[1] = now_ns();
	/* The leases' page tables are valid until the next submit: append
	 * now, then queue the commits. */
	for (i = 0; i < B; i++) {
		const struct kvp_completion *k = &ch->comp[i];

		ch->leases[k->tag] = k->lease;
		rc = kvp_append(ch->c, &k->lease, 0, 1, ch->kv);
		if (rc < 0)
			return child_fail(ch, rc, "kvp_append: %s", kvp_last_error(ch->c));
	}
	t[2] = now_ns();
	for (i = 0; i < B; i++) {
		rc = kvp_queue_commit(ch->c, ch->leases[i].id, 1, 1, i);
		if (rc < 0)
			return child_fail(ch, rc, "kvp_queue_commit: %s", kvp_last_error(ch->c));
	}
	rc = submit_reap(ch, B, "commit+release");
	if (rc)
		return rc;
	t[3] = now_ns();
	for (i = 0; i < B; i++)
		ch->pos[ch->batch_users[i]]++;
	return 0;
}

static uint64_t rusage_cpu_ns(const struct rusage *u)
{
	return ((uint64_t)u->ru_utime.tv_sec + (uint64_t)u->ru_stime.tv_sec) * 1000000000ull +
	       ((uint64_t)u->ru_utime.tv_usec + (uint64_t)u->ru_stime.tv_usec) * 1000ull;
}

static int child_loop(struct child *ch, const struct shared *sh)
{
	const uint64_t B = ch->o->batch;
	struct child_result *r = ch->r;
	struct rusage u0 = { 0 }, u1;
	uint32_t bell0 = 0, seq0 = 0;
	bool in_window = false;
	uint64_t t[4] = { 0 };
	int rc;

	for (;;) {
		uint64_t now = now_ns();

		if (now >= sh->t_end)
			break;
		if (!in_window && now >= sh->t_window) {
			in_window = true;
			getrusage(RUSAGE_SELF, &u0);
			bell0 = kvpb_doorbells(ch->c);
			seq0 = kvpb_client_wakeups(ch->c);
		}
		rc = step(ch, t);
		if (rc)
			return rc;
		if (t[3] <= sh->t_window || t[3] > sh->t_end) {
			if (t[3] <= sh->t_window)
				r->warm_steps++;
			continue;
		}
		r->steps++;
		r->ops += 3 * B;
		r->sqes += 2 * B;
		if (r->nsamples[LAT_STEP] < SAMPLES_CAP) {
			uint32_t n = r->nsamples[LAT_STEP];

			ch->lat[LAT_PREPARE][n] = t[1] - t[0];
			ch->lat[LAT_COMMIT][n] = t[3] - t[2];
			ch->lat[LAT_STEP][n] = t[3] - t[0];
			r->nsamples[LAT_PREPARE] = r->nsamples[LAT_COMMIT] =
				r->nsamples[LAT_STEP] = n + 1;
		}
	}
	getrusage(RUSAGE_SELF, &u1);
	if (in_window) {
		r->cpu_ns = rusage_cpu_ns(&u1) - rusage_cpu_ns(&u0);
		r->vcsw = (uint64_t)(u1.ru_nvcsw - u0.ru_nvcsw);
		r->ivcsw = (uint64_t)(u1.ru_nivcsw - u0.ru_nivcsw);
		r->doorbells = (uint32_t)(kvpb_doorbells(ch->c) - bell0);
		r->client_sleeps = (uint32_t)(kvpb_client_wakeups(ch->c) - seq0);
	}
	return 0;
}

int tput_client_main(const struct opts *o, struct shared *sh, uint64_t *lat_base,
		     uint32_t k, const char *socket, int ready_fd, int go_fd)
{
	struct kvp_connect_opts co = { .socket = socket, .name = "kvbench-tput",
				       .spin_us = (uint32_t)o->d.client_spin_us };
	struct child ch = { .o = o, .r = &sh->res[k] };
	const uint32_t U = (uint32_t)o->users, B = (uint32_t)o->batch;
	const uint64_t salt = ((uint64_t)getpid() & 0xffff) << 32;
	char err[KVP_ERRLEN] = "", byte = 1;
	uint32_t sq = 256;
	int rc;

	for (int i = 0; i < NLAT; i++)
		ch.lat[i] = lat_base + ((size_t)k * NLAT + (size_t)i) * SAMPLES_CAP;
	while (sq < B)
		sq *= 2;
	co.sq_entries = sq;
	rc = kvp_connect(&ch.c, &co, err, sizeof(err));
	if (rc < 0) {
		child_fail(&ch, rc, "%s", err);
		goto ready;
	}
	if (kvp_client_layout(ch.c)->token_bytes != o->layout.token_bytes && !o->d.socket) {
		child_fail(&ch, -EPROTO, "kvpoold serves another layout than asked for");
		goto ready;
	}
	ch.id = calloc(U, sizeof(*ch.id));
	ch.pos = calloc(U, sizeof(*ch.pos));
	ch.batch_users = calloc(B, sizeof(*ch.batch_users));
	ch.leases = calloc(B, sizeof(*ch.leases));
	ch.comp = calloc(B, sizeof(*ch.comp));
	ch.kv = calloc(1, kvp_client_layout(ch.c)->token_bytes);
	if (!ch.id || !ch.pos || !ch.batch_users || !ch.leases || !ch.comp || !ch.kv) {
		child_fail(&ch, -ENOMEM, "out of memory for %u users", U);
		goto ready;
	}
	/* Ids unique to this process: a shared daemon may hold others. */
	for (uint32_t u = 0; u < U; u++)
		ch.id[u] = (0x7470ull << 48) | salt | u; /* "tp" */
	/* Fault the sample arrays in before anything is timed. */
	for (int i = 0; i < NLAT; i++)
		memset(ch.lat[i], 0, SAMPLES_CAP * sizeof(uint64_t));
ready:
	if (write(ready_fd, &byte, 1) != 1 || ch.r->status) {
		if (!ch.r->status)
			child_fail(&ch, -EPIPE, "the parent went away before the start");
		goto out;
	}
	close(ready_fd);
	/* The barrier: read returns 0 when the parent closes its end. */
	while (read(go_fd, &byte, 1) < 0 && errno == EINTR)
		;
	/* The users stay in the daemon (a --socket one shows them in
	 * `kvctl users`); a daemon started here goes away with them. */
	child_loop(&ch, sh);
out:
	if (ch.c)
		kvp_close(ch.c);
	free(ch.id);
	free(ch.pos);
	free(ch.batch_users);
	free(ch.leases);
	free(ch.comp);
	free(ch.kv);
	return ch.r->status ? KVB_EXIT_FAIL : KVB_EXIT_OK;
}
