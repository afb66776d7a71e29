/* SPDX-License-Identifier: MIT */
/*
 * test_worker_idle - a worker with nothing it can do burns no CPU (issue
 * 32, item 2: workers that never cost a client). kvpoold runs with 4
 * workers and a long spin_us (5 ms) so that any spin after a wake-up that
 * brought no work shows; the daemon's CPU time (utime + stime of
 * /proc/PID/stat) is read over one second while
 *
 *   idle_client   one libkvpool client is attached and made a call on
 *                 every lane, then nothing: no worker has work;
 *   stalled_ring  a raw client filled its lane 0 (SQ and CQ) with INFOs
 *                 and reaps nothing: worker 0 has entries it cannot take
 *                 and polls for CQ room every millisecond. It used to spin
 *                 spin_us after each of those polls (5 ms of every 6).
 *
 * The bound, 30% of one core for the whole daemon, is far above a sleeping
 * daemon's (about 0) and far below one spinning worker's, so a loaded
 * 2-core box does not make it flaky either way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MAX_CORE 0.30
#define SQ_ENTRIES 64u

/* utime + stime of pid in clock ticks, or -1. */
static long long proc_cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut, st;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may hold spaces: fields are counted after its ')'. */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
			 &ut, &st) != 2)
		return -1;
	return (long long)(ut + st);
}

/* The daemon's CPU use over one second, in cores; < 0 on error. */
static double daemon_cores(pid_t pid)
{
	long hz = sysconf(_SC_CLK_TCK);
	uint64_t t0 = h_now_ms(), t1;
	long long c0 = proc_cpu_ticks(pid), c1;

	h_sleep_ms(1000);
	c1 = proc_cpu_ticks(pid);
	t1 = h_now_ms();
	if (c0 < 0 || c1 < 0 || hz <= 0 || t1 <= t0)
		return -1;
	return (double)(c1 - c0) / (double)hz / ((double)(t1 - t0) / 1000.0);
}

static int check_cores(pid_t pid, const char *what)
{
	double cores = daemon_cores(pid);

	if (cores < 0) {
		h_fail("%s: cannot read /proc/%d/stat", what, (int)pid);
		return -1;
	}
	h_log("%s: the daemon used %.3f of a core over 1 s (bound %.2f)",
	      what, cores, MAX_CORE);
	if (cores >= MAX_CORE) {
		h_fail("%s: kvpoold used %.2f of a core with nothing it could do; "
		       "an idle worker must sleep, not spin", what, cores);
		return -1;
	}
	return 0;
}

static int idle_client(struct h_daemon *d)
{
	struct kvp_client *c = h_connect_or_fail(d->sock, "idle", 5000);
	struct kvp_user_info ui;
	int ret;

	if (!c)
		return -1;
	/* Users of every shard: each worker runs one call, then has none. */
	for (uint64_t u = 1; u <= 32; u++)
		if (kvp_info(c, u, &ui) < 0) {
			h_fail("idle: kvp_info: %s", kvp_last_error(c));
			kvp_close(c);
			return -1;
		}
	h_sleep_ms(100); /* well past spin_us */
	ret = check_cores(d->pid, "idle client");
	kvp_close(c);
	return ret;
}

/* Publish INFOs on lane 0 until the SQ stays full: the CQ is full too
 * (the worker takes an entry only when its completion has room). */
static int fill_lane(struct h_raw *r)
{
	uint64_t tag = 1;

	for (int round = 0; round < 200; round++) {
		uint32_t space = h_raw_sq_space(r);

		if (!space && round > 2)
			return 0;
		while (space--) {
			struct kvp_sqe e = { .opcode = KVP_OP_INFO, .user = 42,
					     .tag = tag++, .out_off = 0,
					     .out_len = sizeof(struct kvp_user_info) };

			h_raw_put(r, &e);
		}
		h_raw_publish(r);
		h_sleep_ms(20);
	}
	h_fail("stalled ring: the SQ never stayed full");
	return -1;
}

static int stalled_ring(struct h_daemon *d)
{
	struct h_raw r;
	char err[256];
	int ret;

	if (h_raw_attach(&r, d->sock, SQ_ENTRIES, 0, err, sizeof(err))) {
		h_fail("stalled ring: attach: %s", err);
		return -1;
	}
	ret = fill_lane(&r);
	if (!ret) {
		h_sleep_ms(100);
		ret = check_cores(d->pid, "stalled ring");
	}
	h_raw_detach(&r);
	return ret;
}

int main(int argc, char **argv)
{
	struct h_daemon d;
	uint64_t t0;
	int fail;

	h_init(argc, argv, "test_worker_idle");
	t0 = h_now_ms();
	if (h_daemon_up(&d, "--workers=4", "--spin_us=5000", (char *)NULL))
		return H_FAIL;
	fail = idle_client(&d) != 0;
	fail |= stalled_ring(&d) != 0;
	if (!fail)
		fail = idle_client(&d) != 0; /* and asleep again after it */
	return h_daemon_finish(&d, fail, t0);
}
