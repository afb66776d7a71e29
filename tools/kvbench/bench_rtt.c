/* SPDX-License-Identifier: MIT */
/*
 * bench_rtt.c - `kvbench rtt`: the round trip of one INFO request, three ways.
 *
 *   ring    kvp_info(): one SQE through the client's shared-memory ring, the
 *           daemon's worker polls it, one CQE back (the client spins, then
 *           sleeps, for it);
 *   uds     the same kvp_sqe sent as one message on the client's attach
 *           socket (proto.h, the "uds" request mode), answered by one
 *           message kvp_cqe + result bytes from the daemon's main thread;
 *   inproc  engine_info() on an engine in this process with the daemon's
 *           layout and the same history: the floor, no IPC at all.
 *
 * One user is seeded with a few committed tokens first (the daemon's and the
 * in-process engine's histories have the same shape). After an untimed
 * warm-up of each path, the three run interleaved: --rounds rounds, each
 * doing --iters / rounds timed round trips of every path, the order of the
 * paths rotating from one round to the next, so drift (frequency, the other
 * processes of a small machine) hits all three alike. Each round starts with
 * a short untimed burst of the path (ROUND_WARM calls), so what is timed is
 * back-to-back requests, not the first one after the other paths ran (when
 * the daemon's worker may have gone to sleep).
 *
 * Besides the latencies it counts, over the timed ring calls, how often the
 * client rang the daemon's doorbell (the worker was asleep: a FUTEX_WAKE)
 * and how often the client itself went to sleep for its completion (the
 * daemon bumped cq_seq to wake it): the ring's fast path does neither.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvpool_bench.h"
#include "proto.h"
#include "daemon_proc.h"
#include "kvpool_engine.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

#define SUB "rtt"

#define SEED_TOKENS 40u      /* committed tokens of the measured user */
#define ROUND_WARM 200u      /* untimed calls of a path at the start of a round */
#define TARGET_RING_P50_NS 5000u
#define TARGET_UDS_VS_RING 5.0

enum path { P_RING, P_UDS, P_INPROC, NPATHS };

static const char *const path_name[NPATHS] = { "ring", "uds", "inproc" };

struct opts {
	struct kvb_daemon_opts d;
	uint64_t iters;          /* timed round trips per path */
	uint64_t rounds;
	uint64_t warmup;         /* untimed round trips per path before round 1 */
	int cpu;
	bool json;
};

/* What the timed ring rounds cost in wake-ups and sleeps. */
struct wakeups {
	uint64_t doorbells;      /* client -> worker FUTEX_WAKEs (sq_doorbell) */
	uint64_t client_sleeps;  /* worker -> client wakes (cq_seq) */
	uint64_t client_vcsw;    /* the client's voluntary context switches */
	uint64_t daemon_main_vcsw, daemon_worker_vcsw;
	uint64_t daemon_main_cpu_ns, daemon_worker_cpu_ns;
	uint64_t wall_ns;        /* time spent in the timed calls, summed */
	uint32_t rounds;
	uint32_t shared_cpu_rounds;  /* rounds that ended with the client and the
				      * daemon's serving thread on one CPU */
	bool daemon_seen;        /* the daemon's /proc could be read */
};

struct rtt {
	struct kvp_client *c;
	struct engine *eng;
	pid_t daemon_pid;
	uint64_t user;
	struct kvp_user_info want;   /* the seeded history, as INFO reports it */
	uint32_t pages;
	unsigned char *reply;        /* uds: one kvp_cqe + result bytes */
	size_t reply_len;
	uint64_t uds_tag;
	struct samples s[NPATHS];
	struct wakeups w[NPATHS];
	char err[512];
};

/* ---------------------------------------------------------------- paths */

/* What path's INFO said must be the seeded history; -EPROTO with r->err if not. */
static int check_info(struct rtt *r, const char *path, const struct kvp_user_info *i)
{
	if (i->len == r->want.len && i->start == r->want.start)
		return 0;
	snprintf(r->err, sizeof(r->err), "%s: INFO says %" PRIu64 "+%" PRIu64
		 " tokens, seeded %" PRIu64 "+%" PRIu64, path, i->start, i->len,
		 r->want.start, r->want.len);
	return -EPROTO;
}

static int ring_once(struct rtt *r)
{
	struct kvp_user_info i;
	int rc = kvp_info(r->c, r->user, &i);

	if (rc < 0) {
		snprintf(r->err, sizeof(r->err), "ring: kvp_info: %s", kvp_last_error(r->c));
		return rc;
	}
	return check_info(r, "ring", &i);
}

static int uds_once(struct rtt *r)
{
	struct kvp_sqe q = {
		.opcode = KVP_OP_INFO,
		.user = r->user,
		.tag = ++r->uds_tag,
		.out_len = sizeof(struct kvp_user_info),
	};
	struct kvp_user_info i;
	struct kvp_cqe cqe;
	ssize_t n;

	n = send(kvpb_socket(r->c), &q, sizeof(q), MSG_NOSIGNAL);
	if (n != (ssize_t)sizeof(q)) {
		snprintf(r->err, sizeof(r->err), "uds: send: %s",
			 n < 0 ? strerror(errno) : "short");
		return n < 0 ? -errno : -EIO;
	}
	do
		n = recv(kvpb_socket(r->c), r->reply, r->reply_len, 0);
	while (n < 0 && errno == EINTR);
	if (n < (ssize_t)sizeof(cqe)) {
		snprintf(r->err, sizeof(r->err), "uds: recv: %s",
			 n < 0 ? strerror(errno) : n == 0 ? "kvpoold hung up" :
			 "reply shorter than a kvp_cqe");
		return n < 0 ? -errno : -EPROTO;
	}
	memcpy(&cqe, r->reply, sizeof(cqe));
	if (cqe.res < 0) {
		snprintf(r->err, sizeof(r->err), "uds: INFO failed (%d): %.*s", cqe.res,
			 (int)(n - (ssize_t)sizeof(cqe)), (const char *)r->reply + sizeof(cqe));
		return cqe.res;
	}
	if (cqe.tag != q.tag || cqe.out_bytes != sizeof(i) ||
	    (size_t)n != sizeof(cqe) + sizeof(i)) {
		snprintf(r->err, sizeof(r->err), "uds: malformed reply: %zd bytes, tag %"
			 PRIu64 " (sent %" PRIu64 "), out_bytes %" PRIu32, n, cqe.tag,
			 q.tag, cqe.out_bytes);
		return -EPROTO;
	}
	memcpy(&i, r->reply + sizeof(cqe), sizeof(i));
	return check_info(r, "uds", &i);
}

static int inproc_once(struct rtt *r)
{
	struct engine_user_info i;

	engine_info(r->eng, r->user, &i);
	if (!i.exists || i.len != r->want.len) {
		snprintf(r->err, sizeof(r->err), "inproc: engine_info says %" PRIu64
			 " tokens, seeded %" PRIu64, i.len, r->want.len);
		return -EPROTO;
	}
	return 0;
}

/* n round trips of path p; timed into r->s[p] when timed. */
static int run_path(struct rtt *r, enum path p, uint64_t n, bool timed)
{
	struct samples *s = &r->s[p];
	uint64_t i, t0, t1, sum = 0;
	int rc = 0;

	/* One loop per path: no indirect call inside the timed region. */
#define LOOP(call)						\
	for (i = 0; i < n; i++) {				\
		t0 = now_ns();					\
		rc = call(r);					\
		t1 = now_ns();					\
		if (rc)						\
			return rc;				\
		if (timed) {					\
			samples_add(s, t1 - t0);		\
			sum += t1 - t0;				\
		}						\
	}
	switch (p) {
	case P_RING: LOOP(ring_once); break;
	case P_UDS: LOOP(uds_once); break;
	default: LOOP(inproc_once); break;
	}
#undef LOOP
	r->w[p].wall_ns += sum;
	return 0;
}

/* One round's timed calls of path p, with the wake-up counters around it. */
static int run_round(struct rtt *r, enum path p, uint64_t n)
{
	struct kvb_proc_sample d0, d1;
	struct rusage u0, u1;
	uint32_t bell0, seq0;
	struct wakeups *w = &r->w[p];
	int rc;

	rc = run_path(r, p, n < ROUND_WARM ? n : ROUND_WARM, false);
	if (rc)
		return rc;
	kvb_proc_sample(r->daemon_pid, &d0);
	getrusage(RUSAGE_THREAD, &u0);
	bell0 = kvpb_doorbells(r->c);
	seq0 = kvpb_client_wakeups(r->c);
	rc = run_path(r, p, n, true);
	w->doorbells += (uint32_t)(kvpb_doorbells(r->c) - bell0);
	w->client_sleeps += (uint32_t)(kvpb_client_wakeups(r->c) - seq0);
	getrusage(RUSAGE_THREAD, &u1);
	kvb_proc_sample(r->daemon_pid, &d1);
	w->client_vcsw += (uint64_t)(u1.ru_nvcsw - u0.ru_nvcsw);
	w->rounds++;
	if (d0.ok && d1.ok) {
		int serving = p == P_UDS ? d1.main_last_cpu : d1.other_last_cpu;

		if (serving >= 0 && serving == sched_getcpu())
			w->shared_cpu_rounds++;
		w->daemon_seen = true;
		w->daemon_main_vcsw += d1.main_vcsw - d0.main_vcsw;
		w->daemon_worker_vcsw += d1.other_vcsw - d0.other_vcsw;
		w->daemon_main_cpu_ns += d1.main_cpu_ns - d0.main_cpu_ns;
		w->daemon_worker_cpu_ns += d1.other_cpu_ns - d0.other_cpu_ns;
	}
	return rc;
}

/* ---------------------------------------------------------------- set-up */

/* Give the user SEED_TOKENS committed tokens in the daemon and the engine. */
static int seed(struct rtt *r)
{
	const struct kvp_layout *l = kvp_client_layout(r->c);
	struct engine_config cfg = { .layout = *l, .device_frames = 64 };
	struct engine_lease el;
	struct kvp_lease lease;
	struct kvp_user_info i;
	struct errbuf e = { .msg = "" };
	void *kv;
	int rc;

	rc = kvp_info(r->c, r->user, &i);
	if (rc < 0) {
		snprintf(r->err, sizeof(r->err), "kvp_info: %s", kvp_last_error(r->c));
		return rc;
	}
	kv = calloc(SEED_TOKENS, l->token_bytes);
	if (!kv) {
		snprintf(r->err, sizeof(r->err), "no memory for %u tokens", SEED_TOKENS);
		return -ENOMEM;
	}
	rc = kvp_prepare(r->c, r->user, i.start + i.len, SEED_TOKENS, &lease);
	if (rc == 0) {
		rc = kvp_append(r->c, &lease, 0, SEED_TOKENS, kv);
		if (rc == 0)
			rc = kvp_commit(r->c, lease.id, SEED_TOKENS);
		if (rc == 0)
			rc = kvp_release(r->c, lease.id);
	}
	free(kv);
	if (rc < 0) {
		snprintf(r->err, sizeof(r->err), "seeding user %#" PRIx64 ": %s", r->user,
			 kvp_last_error(r->c));
		return rc;
	}
	rc = kvp_info(r->c, r->user, &r->want);
	if (rc < 0) {
		snprintf(r->err, sizeof(r->err), "kvp_info: %s", kvp_last_error(r->c));
		return rc;
	}
	r->pages = r->want.pages_device;

	/* The in-process engine: same layout, a history of the same length. */
	rc = engine_create(&r->eng, &cfg, &e);
	if (rc == 0)
		rc = engine_prepare(r->eng, r->user, r->want.start, (uint32_t)r->want.len,
				    0, &el, &e);
	if (rc == 0)
		rc = engine_commit(r->eng, el.id, (uint32_t)r->want.len, &e);
	if (rc == 0)
		rc = engine_release(r->eng, el.id, &e);
	if (rc < 0) {
		snprintf(r->err, sizeof(r->err), "in-process engine: %s", e.msg);
		return rc;
	}
	return 0;
}

static int measure(struct rtt *r, const struct opts *o)
{
	uint64_t per = o->iters / o->rounds, k;
	int rc;

	for (k = 0; k < NPATHS; k++) {
		if (samples_init(&r->s[k], per * o->rounds)) {
			snprintf(r->err, sizeof(r->err), "no memory for %" PRIu64 " samples",
				 o->iters);
			return -ENOMEM;
		}
	}
	for (k = 0; k < NPATHS; k++) {
		rc = run_path(r, (enum path)k, o->warmup, false);
		if (rc)
			return rc;
	}
	for (k = 0; k < o->rounds; k++) {
		for (uint64_t i = 0; i < NPATHS; i++) {
			rc = run_round(r, (enum path)((i + k) % NPATHS), per);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* ---------------------------------------------------------------- report */

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0;
}

static void json_wakeups(struct json *j, const char *key, const struct wakeups *w,
			 uint64_t n)
{
	json_obj_begin(j, key);
	json_u64(j, "round_trips", n);
	json_u64(j, "doorbell_rings", w->doorbells);
	json_u64(j, "client_sleeps", w->client_sleeps);
	json_u64(j, "client_voluntary_switches", w->client_vcsw);
	if (w->daemon_seen) {
		json_u64(j, "daemon_worker_voluntary_switches", w->daemon_worker_vcsw);
		json_u64(j, "daemon_main_voluntary_switches", w->daemon_main_vcsw);
		json_f64(j, "daemon_worker_cpu_share", ratio(w->daemon_worker_cpu_ns, w->wall_ns), 3);
		json_f64(j, "daemon_main_cpu_share", ratio(w->daemon_main_cpu_ns, w->wall_ns), 3);
		json_u64(j, "rounds", w->rounds);
		json_u64(j, "rounds_on_one_cpu", w->shared_cpu_rounds);
	} else {
		json_null(j, "daemon_worker_voluntary_switches");
		json_null(j, "daemon_main_voluntary_switches");
		json_null(j, "daemon_worker_cpu_share");
		json_null(j, "daemon_main_cpu_share");
		json_null(j, "rounds");
		json_null(j, "rounds_on_one_cpu");
	}
	json_obj_end(j);
}

static void print_json(const struct rtt *r, const struct opts *o,
		       const struct kvb_machine *m, const struct summary *sum,
		       const struct summary *tov, const struct kvb_daemon *d,
		       const char *socket)
{
	char layout[256];
	struct json j;

	kvp_layout_format(kvp_client_layout(r->c), layout, sizeof(layout));
	kvb_json_begin(&j, "rtt");
	json_summary(&j, "ring", &sum[P_RING]);
	json_summary(&j, "uds", &sum[P_UDS]);
	json_summary(&j, "inproc", &sum[P_INPROC]);
	json_f64(&j, "ratio_uds_vs_ring_p50", ratio(sum[P_UDS].p50, sum[P_RING].p50), 2);
	json_f64(&j, "ratio_ring_vs_inproc_p50", ratio(sum[P_RING].p50, sum[P_INPROC].p50), 2);
	json_obj_begin(&j, "targets");
	json_u64(&j, "ring_p50_max_ns", TARGET_RING_P50_NS);
	json_bool(&j, "ring_p50_met", sum[P_RING].p50 <= TARGET_RING_P50_NS);
	json_f64(&j, "uds_vs_ring_min", TARGET_UDS_VS_RING, 1);
	json_bool(&j, "uds_vs_ring_met",
		  ratio(sum[P_UDS].p50, sum[P_RING].p50) >= TARGET_UDS_VS_RING);
	json_obj_end(&j);
	json_obj_begin(&j, "wakeups");
	json_wakeups(&j, "ring", &r->w[P_RING], sum[P_RING].n);
	json_wakeups(&j, "uds", &r->w[P_UDS], sum[P_UDS].n);
	json_obj_end(&j);
	json_obj_begin(&j, "timer");
	json_str(&j, "clock", "CLOCK_MONOTONIC");
	json_u64(&j, "overhead_p50_ns", tov->p50);
	json_u64(&j, "overhead_p99_ns", tov->p99);
	json_obj_end(&j);
	json_obj_begin(&j, "config");
	json_u64(&j, "iters", o->iters);
	json_u64(&j, "rounds", o->rounds);
	json_u64(&j, "warmup", o->warmup);
	json_u64(&j, "round_warmup", ROUND_WARM);
	json_u64(&j, "user", r->user);
	json_u64(&j, "user_tokens", r->want.len);
	json_u64(&j, "user_pages", r->pages);
	json_str(&j, "layout", layout);
	if (o->d.client_spin_us)
		json_u64(&j, "client_spin_us", o->d.client_spin_us);
	else
		json_null(&j, "client_spin_us");
	json_obj_end(&j);
	json_daemon(&j, d, &o->d, socket, r->daemon_pid);
	kvb_json_end(&j, m);
}

static void print_wakeups(const char *name, const struct wakeups *w, uint64_t n)
{
	printf("  %-6s %" PRIu64 " round trips: %" PRIu64 " doorbell rings, %" PRIu64
	       " client sleeps, %" PRIu64 " client context switches", name, n,
	       w->doorbells, w->client_sleeps, w->client_vcsw);
	if (w->daemon_seen)
		printf("; kvpoold: worker %" PRIu64 " / main %" PRIu64
		       " switches, busy %.0f%% / %.0f%% of the time; %u of %u rounds ended with"
		       " the client on the serving thread's CPU", w->daemon_worker_vcsw,
		       w->daemon_main_vcsw, 100 * ratio(w->daemon_worker_cpu_ns, w->wall_ns),
		       100 * ratio(w->daemon_main_cpu_ns, w->wall_ns), w->shared_cpu_rounds,
		       w->rounds);
	printf("\n");
}

static void print_table(const struct rtt *r, const struct opts *o,
			const struct kvb_machine *m, const struct summary *sum,
			const struct summary *tov, const struct kvb_daemon *d,
			const char *socket)
{
	double uds_ring = ratio(sum[P_UDS].p50, sum[P_RING].p50);
	char layout[256];
	int k;

	kvp_layout_format(kvp_client_layout(r->c), layout, sizeof(layout));
	printf("kvbench rtt on %s (%ld CPUs), clocksource %s\n", m->cpu_model, m->nproc,
	       m->clocksource[0] ? m->clocksource : "?");
	kvb_print_daemon(d, &o->d, socket);
	printf("INFO of one user (%" PRIu64 " tokens, %u pages; %s)\n", r->want.len,
	       r->pages, layout);
	printf("%" PRIu64 " timed round trips per path in %" PRIu64 " interleaved rounds, "
	       "after %" PRIu64 " untimed; timer overhead p50 %" PRIu64 " ns (included)\n",
	       sum[P_RING].n, o->rounds, o->warmup, tov->p50);
	printf("\n%-8s %9s %9s %9s %9s %9s\n", "path", "p50 ns", "p90 ns", "p99 ns",
	       "mean ns", "max ns");
	for (k = 0; k < NPATHS; k++)
		printf("%-8s %9" PRIu64 " %9" PRIu64 " %9" PRIu64 " %9.0f %9" PRIu64 "\n",
		       path_name[k], sum[k].p50, sum[k].p90, sum[k].p99, sum[k].mean,
		       sum[k].max);
	printf("\nuds / ring p50:    %6.2fx  (target >= %.0fx: %s)\n", uds_ring,
	       TARGET_UDS_VS_RING, uds_ring >= TARGET_UDS_VS_RING ? "met" : "MISSED");
	printf("ring / inproc p50: %6.2fx\n", ratio(sum[P_RING].p50, sum[P_INPROC].p50));
	printf("ring p50:          %6.2f us (target <= %.0f us: %s)\n",
	       sum[P_RING].p50 / 1000.0, TARGET_RING_P50_NS / 1000.0,
	       sum[P_RING].p50 <= TARGET_RING_P50_NS ? "met" : "MISSED");
	printf("\nwake-ups during the timed calls:\n");
	print_wakeups("ring", &r->w[P_RING], sum[P_RING].n);
	print_wakeups("uds", &r->w[P_UDS], sum[P_UDS].n);
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench rtt [options]\n"
"\n"
"Round trip of an INFO request for one user, three ways in the same run:\n"
"through the shared-memory ring (kvp_info), as one message on the Unix\n"
"socket of the same daemon (uds mode), and engine_info() in-process.\n"
"\n"
"Options:\n"
"  --socket PATH      use the kvpoold at PATH (default: start one here)\n"
"  --iters N          timed round trips per path (default 100k)\n"
"  --rounds N         interleaved rounds the round trips are split in (default 10)\n"
"  --warmup N         untimed round trips per path first (default 10k)\n"
"  --kvpoold PATH     the kvpoold to start (default: next to kvbench)\n"
"  --spin-us US       spin_us of the kvpoold started here (default: its own, 50)\n"
"  --client-spin-us US\n"
"                     how long the client spins for a completion before it\n"
"                     sleeps (default: libkvpool's, 20)\n"
"  --cpu N|none       pin kvbench to CPU N (default none)\n"
"  --daemon-cpu N|none\n"
"                     pin the kvpoold started here to CPU N (default none)\n"
"  --daemon-flag --KEY=VALUE\n"
"                     one more kvpoold flag for the daemon started here\n"
KVB_USAGE_END_OPTS
"\n"
"Counts take k, M or G suffixes. See kvbench(1).\n");
}

enum { OPT_ITERS = 256, OPT_ROUNDS, OPT_WARMUP, OPT_CPU };

static const struct option long_opts[] = {
	KVB_DAEMON_LONG_OPTS,
	{ "iters", required_argument, NULL, OPT_ITERS },
	{ "rounds", required_argument, NULL, OPT_ROUNDS },
	{ "warmup", required_argument, NULL, OPT_WARMUP },
	{ "cpu", required_argument, NULL, OPT_CPU },
	KVB_LONG_OPTS_END,
};

static int one_opt(void *ctx, int c, const char *arg)
{
	struct opts *o = ctx;

	switch (c) {
	case OPT_ITERS:
		return kvb_opt_count(SUB, "--iters", arg, 1, 100000000, &o->iters);
	case OPT_ROUNDS:
		return kvb_opt_count(SUB, "--rounds", arg, 1, 1000, &o->rounds);
	case OPT_WARMUP:
		return kvb_opt_count(SUB, "--warmup", arg, 0, 100000000, &o->warmup);
	case OPT_CPU:
		return kvb_opt_cpu(SUB, arg, &o->cpu);
	default:
		return kvb_daemon_opt(SUB, c, arg, &o->d);
	}
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	int rc;

	memset(o, 0, sizeof(*o));
	o->d.spin_us = -1;
	o->d.device_mem = 16ull << 20;
	o->iters = 100000;
	o->rounds = 10;
	o->warmup = 10000;
	o->cpu = KVB_CPU_NONE;
	o->d.cpu = -1;

	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, o, &o->json);
	if (rc >= 0)
		return rc;
	if (o->iters < o->rounds)
		return kvb_usage_error(SUB, "--iters %" PRIu64 " is fewer than --rounds %" PRIu64
				       "; each round needs at least one round trip",
				       o->iters, o->rounds);
	if (o->d.socket && (o->d.kvpoold || o->d.spin_us >= 0 || o->d.cpu >= 0))
		return kvb_usage_error(SUB, "--socket uses a running kvpoold; --kvpoold, "
				       "--spin-us and --daemon-cpu only apply to one started here");
	return -1;
}

/* ---------------------------------------------------------------- main */

int cmd_rtt(int argc, char **argv)
{
	struct kvp_connect_opts co = { .name = "kvbench-rtt" };
	struct summary sum[NPATHS], tov;
	struct kvb_daemon d = { 0 };
	struct kvb_machine m;
	struct rtt r = { 0 };
	char err[1024] = "";
	const char *socket = NULL;
	struct opts o;
	int rc, status = KVB_EXIT_FAIL, k;

	rc = parse_opts(argc, argv, &o);
	if (rc < 0)
		rc = kvb_begin_run(SUB, o.cpu, &m, &tov);
	if (rc >= 0)
		return rc;

	if (kvb_daemon_open(&d, &o.d, &socket, err, sizeof(err))) {
		fprintf(stderr, "kvbench rtt: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	co.socket = socket;
	co.spin_us = (uint32_t)o.d.client_spin_us;
	rc = kvp_connect(&r.c, &co, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "kvbench rtt: %s\n", err);
		goto out;
	}
	r.daemon_pid = kvb_peer_pid(kvpb_socket(r.c));
	r.user = 0x7274740000000000ull | ((uint64_t)getpid() << 8); /* "rtt" */
	r.reply_len = sizeof(struct kvp_cqe) + (64u << 10);
	r.reply = malloc(r.reply_len);
	if (!r.reply) {
		fprintf(stderr, "kvbench rtt: out of memory\n");
		goto out;
	}
	rc = seed(&r);
	if (rc == 0)
		rc = measure(&r, &o);
	if (rc) {
		fprintf(stderr, "kvbench rtt: %s\n", r.err);
		goto out;
	}
	for (k = 0; k < NPATHS; k++)
		samples_summarize(&r.s[k], &sum[k]);
	if (o.json)
		print_json(&r, &o, &m, sum, &tov, &d, socket);
	else
		print_table(&r, &o, &m, sum, &tov, &d, socket);
	status = KVB_EXIT_OK;
out:
	if (r.c) {
		/* Leave nothing behind in a daemon we did not start. */
		if (o.d.socket && r.want.len)
			kvp_evict(r.c, r.user, KVP_SEL_ALL);
		kvp_close(r.c);
	}
	if (kvb_daemon_stop(&d, 10000, err, sizeof(err))) {
		fprintf(stderr, "kvbench rtt: %s\n", err);
		status = KVB_EXIT_FAIL;
	}
	if (r.eng)
		engine_destroy(r.eng);
	for (k = 0; k < NPATHS; k++)
		samples_free(&r.s[k]);
	free(r.reply);
	return status;
}
