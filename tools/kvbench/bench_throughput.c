/* SPDX-License-Identifier: MIT */
/*
 * bench_throughput.c - `kvbench throughput`: ring operations per second of N
 * client processes against one kvpoold.
 *
 * Each of --clients processes (fork) attaches on its own and owns --users
 * users. A step serves the next --batch of its users, round-robin:
 *
 *   1. kvp_queue_prepare(user, start+len, 1) for each, one kvp_submit, reap
 *      all B completions;
 *   2. kvp_append() one token into each lease (a memcpy into the mapped
 *      device tier, no round trip);
 *   3. kvp_queue_commit(lease, 1, release=1) for each, one kvp_submit, reap
 *      all B.
 *
 * OPERATIONS. A prepare, a commit and a release count one operation each, so
 * a step is 3 * B operations queued as 2 * B (the commit carries the
 * release: one queued operation, two done, as kvp_queue_commit's release
 * flag makes the daemon do both). Both figures are reported: "ops_per_s"
 * (operations) and "sqes_per_s" (queued operations: what went out as ring
 * entries one each before libkvpool sent a lane's as one BATCH entry, and
 * does again with KVPOOL_BATCH=0).
 *
 * TIMING. The processes attach and set up, then wait on a pipe; the parent
 * closes it, and all start at once. A shared timeline follows: --warmup
 * seconds of steps that are not counted, then the measured window of
 * --seconds seconds. A step counts when its last completion is reaped
 * inside the window; the aggregate rate is the operations of all processes'
 * counted steps over the window's length. Every process keeps stepping
 * until the window closes, so the load is the same all through it.
 * Latencies of the counted steps: a prepare batch (first queue to last
 * reap), a commit batch (likewise), a whole step.
 *
 * The daemon started here gets device_mem for every history at its cap
 * (--max-pages, through max_tokens_per_user) plus the page a step adds, and
 * no host tier, so nothing is evicted: what is measured is the metadata
 * path through the rings. The parent samples the daemon's counters and its
 * threads' CPU time (/proc) at the window's edges; each child counts its
 * doorbell rings and sleeps from the ring's shared words.
 *
 * This file holds the options, the parent's side and the report; a client
 * process's loop is in throughput_client.c (throughput.h between them).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvpool_bench.h"
#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"
#include "throughput.h"

#define SUB "throughput"

#define DEFAULT_LAYOUT "layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define MAX_CLIENTS 256
#define MAX_BATCH 4096
#define TARGET_OPS_PER_S 1000000.0

static const char *const lat_name[NLAT] = { "prepare_batch", "commit_batch", "step" };

/* ---------------------------------------------------------------- parent */

struct result {
	double window_s;
	uint64_t ops, sqes, steps, warm_steps;
	double ops_per_s, sqes_per_s;
	struct summary lat[NLAT];
	uint64_t doorbells, client_sleeps, client_vcsw, client_ivcsw;
	uint64_t client_cpu_ns;
	struct kvb_proc_sample d0, d1;  /* the daemon at the window's edges */
	struct kvp_stats s0, s1;
	bool have_stats;
};

/* KVPOOL_BATCH=0: libkvpool sends every queued operation alone. */
static bool batch_env_off(void)
{
	const char *v = getenv("KVPOOL_BATCH");

	return v && !strcmp(v, "0");
}

static void sleep_until(uint64_t t)
{
	uint64_t now;

	while ((now = now_ns()) < t) {
		uint64_t ns = t - now;
		struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };

		nanosleep(&ts, NULL);
	}
}

static double share(uint64_t ns, double s)
{
	return s > 0 ? (double)ns / 1e9 / s : 0;
}

static void json_lat(struct json *j, const struct result *res)
{
	for (int i = 0; i < NLAT; i++)
		json_summary(j, lat_name[i], &res->lat[i]);
}

static void print_json(const struct opts *o, const struct result *res,
		       const struct shared *sh, const struct kvb_machine *m,
		       const struct kvb_daemon *d, const char *socket, pid_t dpid)
{
	const struct kvp_stats *a = &res->s0, *b = &res->s1;
	struct json j;

	kvb_json_begin(&j, "throughput");
	json_f64(&j, "ops_per_s", res->ops_per_s, 0);
	json_f64(&j, "sqes_per_s", res->sqes_per_s, 0);
	json_str(&j, "ops_counting", "prepare, commit and release count one operation each: "
		 "3 per user per step, queued as 2 (commit with release); sqes_per_s "
		 "counts queued operations, which libkvpool sends as one batch entry "
		 "per lane (KVPOOL_BATCH=0: one entry each)");
	json_u64(&j, "clients", o->clients);
	json_u64(&j, "users_per_client", o->users);
	json_u64(&j, "batch", o->batch);
	json_f64(&j, "seconds", res->window_s, 6);
	json_f64(&j, "warmup_seconds", o->warmup, 3);
	json_u64(&j, "ops", res->ops);
	json_u64(&j, "sqes", res->sqes);
	json_u64(&j, "steps", res->steps);
	json_u64(&j, "warmup_steps", res->warm_steps);
	json_arr_begin(&j, "per_client_ops_per_s");
	for (uint64_t k = 0; k < o->clients; k++)
		json_f64(&j, NULL, (double)sh->res[k].ops / res->window_s, 0);
	json_arr_end(&j);
	json_obj_begin(&j, "latency");
	json_lat(&j, res);
	json_obj_end(&j);
	json_obj_begin(&j, "target");
	json_f64(&j, "ops_per_s", TARGET_OPS_PER_S, 0);
	json_bool(&j, "met", res->ops_per_s >= TARGET_OPS_PER_S);
	json_obj_end(&j);
	json_obj_begin(&j, "cpu");
	json_f64(&j, "clients", share(res->client_cpu_ns, res->window_s), 3);
	if (res->d0.ok && res->d1.ok) {
		json_f64(&j, "daemon_workers", share(res->d1.other_cpu_ns - res->d0.other_cpu_ns,
						    res->window_s), 3);
		json_f64(&j, "daemon_main", share(res->d1.main_cpu_ns - res->d0.main_cpu_ns,
						 res->window_s), 3);
	} else {
		json_null(&j, "daemon_workers");
		json_null(&j, "daemon_main");
	}
	json_obj_end(&j);
	json_obj_begin(&j, "wakeups");
	json_u64(&j, "doorbell_rings", res->doorbells);
	json_u64(&j, "client_sleeps", res->client_sleeps);
	json_u64(&j, "client_voluntary_switches", res->client_vcsw);
	json_u64(&j, "client_involuntary_switches", res->client_ivcsw);
	if (res->d0.ok && res->d1.ok) {
		json_u64(&j, "daemon_worker_voluntary_switches",
			 res->d1.other_vcsw - res->d0.other_vcsw);
		json_u64(&j, "daemon_worker_involuntary_switches",
			 res->d1.other_ivcsw - res->d0.other_ivcsw);
	} else {
		json_null(&j, "daemon_worker_voluntary_switches");
		json_null(&j, "daemon_worker_involuntary_switches");
	}
	json_obj_end(&j);
	if (res->have_stats) {
		json_obj_begin(&j, "daemon_stats");
		json_u64(&j, "prepares", b->prepares - a->prepares);
		json_u64(&j, "commits", b->commits - a->commits);
		json_u64(&j, "releases", b->releases - a->releases);
		json_u64(&j, "trimmed_pages", b->trimmed_pages - a->trimmed_pages);
		json_u64(&j, "evicted_users", b->evicted_users - a->evicted_users);
		json_u64(&j, "demoted_users", b->demoted_users - a->demoted_users);
		json_u64(&j, "onloaded_pages", b->onloaded_pages - a->onloaded_pages);
		json_u64(&j, "users", b->users);
		json_u64(&j, "device_frames_used", b->tier[KVP_TIER_DEVICE].frames_used);
		json_u64(&j, "device_frames_total", b->tier[KVP_TIER_DEVICE].frames_total);
		json_obj_end(&j);
	} else {
		json_null(&j, "daemon_stats");
	}
	json_obj_begin(&j, "config");
	json_str(&j, "layout", o->layout_spec);
	json_u64(&j, "max_pages", o->max_pages);
	if (o->d.client_spin_us)
		json_u64(&j, "client_spin_us", o->d.client_spin_us);
	else
		json_null(&j, "client_spin_us");
	json_obj_end(&j);
	json_daemon(&j, d, &o->d, socket, dpid);
	kvb_json_end(&j, m);
}

static void print_table(const struct opts *o, const struct result *res,
			const struct shared *sh, const struct kvb_machine *m,
			const struct kvb_daemon *d, const char *socket)
{
	const struct kvp_stats *a = &res->s0, *b = &res->s1;

	printf("kvbench throughput on %s (%ld CPUs)\n", m->cpu_model, m->nproc);
	kvb_print_daemon(d, &o->d, socket);
	printf("%" PRIu64 " client processes x %" PRIu64 " users, batches of %" PRIu64
	       "; %.1f s warm-up, %.3f s measured\n", o->clients, o->users, o->batch,
	       o->warmup, res->window_s);
	printf("a step per batch: prepare x B, submit, reap; append 1 token each; "
	       "commit+release x B, submit, reap\n");
	printf("operations count prepare, commit and release one each (3 per user, "
	       "2 queued; %s)\n\n", batch_env_off() ? "one ring entry each, "
	       "KVPOOL_BATCH=0" : "one batch entry per lane and submit");
	printf("  operations/s   %12.0f   (target >= %.0f: %s)\n", res->ops_per_s,
	       TARGET_OPS_PER_S, res->ops_per_s >= TARGET_OPS_PER_S ? "met" : "MISSED");
	printf("  queued ops/s   %12.0f\n", res->sqes_per_s);
	printf("  per client    ");
	for (uint64_t k = 0; k < o->clients; k++)
		printf(" %.0f", (double)sh->res[k].ops / res->window_s);
	printf("\n\n  %-14s %10s %10s %10s %10s\n", "latency, ns", "p50", "p90", "p99", "max");
	for (int i = 0; i < NLAT; i++)
		printf("  %-14s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 "\n",
		       lat_name[i], res->lat[i].p50, res->lat[i].p90, res->lat[i].p99,
		       res->lat[i].max);
	printf("\n  CPU over the window (1.0 = one core): clients %.2f",
	       share(res->client_cpu_ns, res->window_s));
	if (res->d0.ok && res->d1.ok)
		printf(", kvpoold workers %.2f, kvpoold main %.2f",
		       share(res->d1.other_cpu_ns - res->d0.other_cpu_ns, res->window_s),
		       share(res->d1.main_cpu_ns - res->d0.main_cpu_ns, res->window_s));
	printf("\n  wake-ups: %" PRIu64 " doorbell rings (worker asleep), %" PRIu64
	       " client sleeps; client context switches %" PRIu64 " voluntary, %" PRIu64
	       " involuntary", res->doorbells, res->client_sleeps, res->client_vcsw,
	       res->client_ivcsw);
	if (res->d0.ok && res->d1.ok)
		printf("; worker %" PRIu64 " / %" PRIu64, res->d1.other_vcsw - res->d0.other_vcsw,
		       res->d1.other_ivcsw - res->d0.other_ivcsw);
	printf("\n");
	if (res->have_stats)
		printf("  kvpoold counters over the window: %" PRIu64 " prepares, %" PRIu64
		       " commits, %" PRIu64 " releases, %" PRIu64 " pages trimmed, %" PRIu64
		       " users evicted, %" PRIu64 " demoted, %" PRIu64 " pages onloaded\n",
		       b->prepares - a->prepares, b->commits - a->commits,
		       b->releases - a->releases, b->trimmed_pages - a->trimmed_pages,
		       b->evicted_users - a->evicted_users, b->demoted_users - a->demoted_users,
		       b->onloaded_pages - a->onloaded_pages);
}

/* ---------------------------------------------------------------- run */

static int run(const struct opts *o, const char *socket, struct kvb_machine *m,
	       const struct kvb_daemon *d)
{
	const size_t sh_bytes = sizeof(struct shared) + o->clients * sizeof(struct child_result);
	const size_t lat_bytes = o->clients * NLAT * (size_t)SAMPLES_CAP * sizeof(uint64_t);
	struct kvp_connect_opts co = { .socket = socket, .name = "kvbench-tput-stats" };
	struct kvp_client *stat_c = NULL;
	struct result res = { 0 };
	struct samples s[NLAT];
	int ready[2] = { -1, -1 }, go[2] = { -1, -1 };
	pid_t *pids = NULL, dpid = -1, parent = getpid();
	struct shared *sh;
	uint64_t *lat;
	uint64_t k, started = 0, nready = 0;
	char err[KVP_ERRLEN], byte;
	int status = KVB_EXIT_OK, rc;

	sh = mmap(NULL, sh_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	lat = mmap(NULL, lat_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pids = calloc(o->clients, sizeof(*pids));
	memset(s, 0, sizeof(s));
	if (sh == MAP_FAILED || lat == MAP_FAILED || !pids) {
		fprintf(stderr, "kvbench throughput: out of memory for the shared results\n");
		status = KVB_EXIT_FAIL;
		goto out;
	}
	sh->t_window = sh->t_end = UINT64_MAX;
	if (pipe(ready) < 0 || pipe(go) < 0) {
		fprintf(stderr, "kvbench throughput: pipe: %s\n", strerror(errno));
		status = KVB_EXIT_FAIL;
		goto out;
	}
	fflush(NULL);
	for (k = 0; k < o->clients; k++) {
		pid_t pid = fork();

		if (pid < 0) {
			fprintf(stderr, "kvbench throughput: fork: %s\n", strerror(errno));
			status = KVB_EXIT_FAIL;
			break;
		}
		if (pid == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(KVB_EXIT_FAIL);
			close(ready[0]);
			close(go[1]);
			_exit(tput_client_main(o, sh, lat, (uint32_t)k, socket, ready[1], go[0]));
		}
		pids[k] = pid;
		started++;
	}
	close(ready[1]);
	ready[1] = -1;
	close(go[0]);
	go[0] = -1;
	/* Every child reports ready (or fails); a dead one closes its end. */
	while (nready < started) {
		ssize_t n = read(ready[0], &byte, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		nready++;
	}
	for (k = 0; k < started; k++)
		if (sh->res[k].status)
			status = KVB_EXIT_FAIL;
	if (status == KVB_EXIT_OK && nready == started) {
		rc = kvp_connect(&stat_c, &co, err, sizeof(err));
		if (rc == 0)
			dpid = kvb_peer_pid(kvpb_socket(stat_c));
		sh->t_window = now_ns() + (uint64_t)(o->warmup * 1e9);
		sh->t_end = sh->t_window + (uint64_t)(o->seconds * 1e9);
	} else {
		status = KVB_EXIT_FAIL;
		sh->t_window = sh->t_end = 0; /* the children stop at once */
	}
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	close(go[1]); /* go */
	go[1] = -1;
	if (status == KVB_EXIT_OK) {
		sleep_until(sh->t_window);
		kvb_proc_sample(dpid, &res.d0);
		res.have_stats = stat_c && kvp_stats(stat_c, 0, &res.s0) == 0;
		sleep_until(sh->t_end);
		kvb_proc_sample(dpid, &res.d1);
		res.have_stats = res.have_stats && kvp_stats(stat_c, 0, &res.s1) == 0;
	}
	for (k = 0; k < started; k++) {
		int st;

		while (waitpid(pids[k], &st, 0) < 0 && errno == EINTR)
			;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			struct child_result *r = &sh->res[k];

			status = KVB_EXIT_FAIL;
			if (r->err[0])
				fprintf(stderr, "kvbench throughput: client %" PRIu64 ": %s\n", k, r->err);
			else if (WIFSIGNALED(st))
				fprintf(stderr, "kvbench throughput: client %" PRIu64 " was killed "
					"by signal %d (%s)\n", k, WTERMSIG(st), strsignal(WTERMSIG(st)));
			else
				fprintf(stderr, "kvbench throughput: client %" PRIu64 " exited with "
					"status %d\n", k, WEXITSTATUS(st));
		}
	}
	if (status != KVB_EXIT_OK)
		goto out;

	res.window_s = (double)(sh->t_end - sh->t_window) / 1e9;
	for (int i = 0; i < NLAT; i++) {
		size_t total = 0;

		for (k = 0; k < o->clients; k++)
			total += sh->res[k].nsamples[i];
		if (samples_init(&s[i], total)) {
			fprintf(stderr, "kvbench throughput: out of memory for the samples\n");
			status = KVB_EXIT_FAIL;
			goto out;
		}
		for (k = 0; k < o->clients; k++) {
			struct samples one = {
				.v = lat + (k * NLAT + (uint64_t)i) * SAMPLES_CAP,
				.n = sh->res[k].nsamples[i], .cap = SAMPLES_CAP,
			};

			samples_append(&s[i], &one);
		}
		samples_summarize(&s[i], &res.lat[i]);
	}
	for (k = 0; k < o->clients; k++) {
		const struct child_result *r = &sh->res[k];

		res.ops += r->ops;
		res.sqes += r->sqes;
		res.steps += r->steps;
		res.warm_steps += r->warm_steps;
		res.doorbells += r->doorbells;
		res.client_sleeps += r->client_sleeps;
		res.client_vcsw += r->vcsw;
		res.client_ivcsw += r->ivcsw;
		res.client_cpu_ns += r->cpu_ns;
	}
	res.ops_per_s = (double)res.ops / res.window_s;
	if (res.have_stats && (res.s1.evicted_users != res.s0.evicted_users ||
			       res.s1.demoted_users != res.s0.demoted_users ||
			       res.s1.onloaded_pages != res.s0.onloaded_pages))
		fprintf(stderr, "kvbench throughput: note: kvpoold evicted %" PRIu64 " and demoted %"
			PRIu64 " users and onloaded %" PRIu64 " pages during the window: its device"
			" tier cannot hold %" PRIu64 " x %" PRIu64 " histories at its"
			" max_tokens_per_user, and the figure includes that work\n",
			res.s1.evicted_users - res.s0.evicted_users,
			res.s1.demoted_users - res.s0.demoted_users,
			res.s1.onloaded_pages - res.s0.onloaded_pages, o->clients, o->users);
	res.sqes_per_s = (double)res.sqes / res.window_s;
	if (o->json)
		print_json(o, &res, sh, m, d, socket, dpid);
	else
		print_table(o, &res, sh, m, d, socket);
out:
	if (stat_c)
		kvp_close(stat_c);
	for (int i = 0; i < 2; i++) {
		if (ready[i] >= 0)
			close(ready[i]);
		if (go[i] >= 0)
			close(go[i]);
	}
	for (int i = 0; i < NLAT; i++)
		samples_free(&s[i]);
	if (sh != MAP_FAILED && sh)
		munmap(sh, sh_bytes);
	if (lat != MAP_FAILED && lat)
		munmap(lat, lat_bytes);
	free(pids);
	return status;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench throughput --clients N [options]\n"
"\n"
"Ring operations per second of N client processes against one kvpoold. Each\n"
"step over a batch of B users: queue a prepare of one token for each, submit,\n"
"reap; append the token; queue commit+release for each, submit, reap.\n"
"prepare, commit and release count one operation each (3 per user and step).\n"
"\n"
"Options:\n"
"  --clients N        client processes (required)\n"
"  --users U          users per client (default 256)\n"
"  --batch B          users per step, at most U (default 32)\n"
"  --seconds S        length of the measured window (default 5)\n"
"  --warmup S         steps before the window, not counted (default 1)\n"
"  --max-pages N      history cap per user in pages (default 4)\n"
"  --layout SPEC      layout of the kvpoold started here (default\n"
"                     " DEFAULT_LAYOUT ")\n"
"  --socket PATH      use the kvpoold at PATH (default: start one here)\n"
"  --kvpoold PATH     the kvpoold to start (default: next to kvbench)\n"
"  --workers N        workers of the kvpoold started here (default: its own, 1)\n"
"  --spin-us US       spin_us of the kvpoold started here (default: its own, 50)\n"
"  --client-spin-us US\n"
"                     how long a client spins for completions before it\n"
"                     sleeps (default: libkvpool's, 20)\n"
"  --daemon-cpu N|none\n"
"                     pin the kvpoold started here to CPU N (default none)\n"
"  --daemon-flag --KEY=VALUE\n"
"                     one more kvpoold flag for the daemon started here\n"
KVB_USAGE_END_OPTS
"\n"
"Counts take k, M or G suffixes. See kvbench(1).\n");
}

enum {
	OPT_CLIENTS = 256, OPT_USERS, OPT_BATCH, OPT_SECONDS, OPT_WARMUP, OPT_MAX_PAGES,
	OPT_LAYOUT,
};

static const struct option long_opts[] = {
	{ "clients", required_argument, NULL, OPT_CLIENTS },
	{ "users", required_argument, NULL, OPT_USERS },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "seconds", required_argument, NULL, OPT_SECONDS },
	{ "warmup", required_argument, NULL, OPT_WARMUP },
	{ "max-pages", required_argument, NULL, OPT_MAX_PAGES },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	KVB_DAEMON_LONG_OPTS,
	{ "workers", required_argument, NULL, KVB_OPT_WORKERS },
	KVB_LONG_OPTS_END,
};

struct parse {
	struct opts *o;
	bool have_layout;
};

static int one_opt(void *ctx, int c, const char *arg)
{
	struct parse *p = ctx;
	struct opts *o = p->o;
	char err[KVP_ERRLEN], *end;

	switch (c) {
	case OPT_CLIENTS:
		return kvb_opt_count(SUB, "--clients", arg, 1, MAX_CLIENTS, &o->clients);
	case OPT_USERS:
		return kvb_opt_count(SUB, "--users", arg, 1, 1u << 24, &o->users);
	case OPT_BATCH:
		return kvb_opt_count(SUB, "--batch", arg, 1, MAX_BATCH, &o->batch);
	case OPT_SECONDS:
		return kvb_opt_seconds(SUB, "--seconds", arg, &o->seconds);
	case OPT_WARMUP:
		/* Like --seconds, but 0 (no warm-up) is allowed. */
		o->warmup = strtod(arg, &end);
		if (end == arg || *end || !(o->warmup >= 0 && o->warmup <= 86400))
			return kvb_usage_error(SUB, "--warmup: '%s' is not a number of "
					       "seconds in [0, 86400]", arg);
		return -1;
	case OPT_MAX_PAGES:
		return kvb_opt_count(SUB, "--max-pages", arg, 1, 1024, &o->max_pages);
	case OPT_LAYOUT:
		if (kvp_layout_parse(&o->layout, arg, err, sizeof(err)) < 0)
			return kvb_usage_error(SUB, "--layout: %s", err);
		snprintf(o->layout_spec, sizeof(o->layout_spec), "%s", arg);
		p->have_layout = true;
		return -1;
	default:
		return kvb_daemon_opt(SUB, c, arg, &o->d);
	}
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	struct parse p = { .o = o };
	char err[KVP_ERRLEN];
	int rc;

	memset(o, 0, sizeof(*o));
	o->d.spin_us = -1;
	o->d.cpu = -1;
	o->users = 256;
	o->batch = 32;
	o->seconds = 5;
	o->warmup = 1;
	o->max_pages = 4;
	snprintf(o->layout_spec, sizeof(o->layout_spec), "%s", DEFAULT_LAYOUT);

	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, &p, &o->json);
	if (rc >= 0)
		return rc;
	if (!o->clients)
		return kvb_usage_error(SUB, "--clients N is required (client processes, e.g. "
				       "--clients 4)");
	if (o->batch > o->users)
		return kvb_usage_error(SUB, "--batch %" PRIu64 " is more than --users %" PRIu64
				       ": a batch serves distinct users", o->batch, o->users);
	if (o->d.socket && (o->d.kvpoold || o->d.spin_us >= 0 || o->d.workers ||
			    o->d.cpu >= 0 || p.have_layout))
		return kvb_usage_error(SUB, "--socket uses a running kvpoold; --kvpoold, "
				       "--workers, --spin-us, --daemon-cpu and --layout only "
				       "apply to one started here");
	if (!p.have_layout && kvp_layout_parse(&o->layout, o->layout_spec, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvbench throughput: the default layout does not parse: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	if (!o->d.socket) {
		/* Every history at its cap plus the page a step adds, and slack. */
		uint64_t frames = o->clients * o->users * (o->max_pages + 2);
		uint64_t bytes = frames * o->layout.page_bytes;
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

		if (pages > 0 && psz > 0 && bytes > (uint64_t)pages * (uint64_t)psz / 2)
			return kvb_usage_error(SUB, "%" PRIu64 " clients x %" PRIu64 " users x %" PRIu64
					       " pages of %" PRIu64 " B need %" PRIu64 " MiB of device"
					       " tier, more than half this machine's memory; lower"
					       " --users or --max-pages", o->clients, o->users,
					       o->max_pages + 2, o->layout.page_bytes, bytes >> 20);
		o->d.device_mem = bytes;
		o->d.max_tokens = o->max_pages * o->layout.page_tokens;
		o->d.layout = o->layout_spec;
	}
	return -1;
}

/* ---------------------------------------------------------------- main */

int cmd_throughput(int argc, char **argv)
{
	struct kvb_daemon d = { 0 };
	struct kvb_machine m;
	const char *socket = NULL;
	char err[1024] = "";
	struct opts o;
	int rc, status;

	rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		return rc;
	kvb_machine_info(&m, -1);
	if (kvb_daemon_open(&d, &o.d, &socket, err, sizeof(err))) {
		fprintf(stderr, "kvbench throughput: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	status = run(&o, socket, &m, &d);
	if (kvb_daemon_stop(&d, 10000, err, sizeof(err))) {
		fprintf(stderr, "kvbench throughput: %s\n", err);
		status = KVB_EXIT_FAIL;
	}
	return status;
}
