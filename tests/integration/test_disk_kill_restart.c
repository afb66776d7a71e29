/* SPDX-License-Identifier: MIT */
/*
 * test_disk_kill_restart - a supervisor that restarts kvpoold at once after
 * a kill -9 during disk I/O gets a daemon, every time; a second kvpoold on
 * the same disk_dir while the first lives is still refused (issue 25,
 * item 8).
 *
 * The dead daemon's io_uring may still hold its disk file for a moment
 * after the process is gone (requests in flight keep their file, and the
 * ring is torn down by a kernel worker): an flock on that file said "in use
 * by another kvpoold" to 2 of 10 such restarts.
 *
 * ROUNDS times: a writer appends to USERS users without end (the device
 * and host tiers are tiny, so the pool demotes to disk all the time), the
 * daemon is killed with SIGKILL at a random moment and reaped, and a new
 * one is started on the same disk_dir right away: it must serve. Then,
 * while that one lives, a second kvpoold on another socket and the same
 * disk_dir must exit at once, naming the disk_dir's lock and the daemon
 * that holds it.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define ROUNDS 10
#define USERS 24u
#define SALT 0x6b696c6cull /* "kill" */
#define DEVICE_TOKENS 256u /* the device tier's 16 pages */

static char g_adisk[300];
static const char *g_sock;

static int start(struct h_daemon *d)
{
	return h_daemon_start(d, 10000, "--device_mem=64K", "--host_mem=128K",
			      g_adisk, "--disk_size=8M", "--reclaim=yes",
			      "--workers=2", NULL);
}

/* Append to every user and push it down to disk, so the next append reads
 * it back: writes and reads in flight all the time, until the daemon dies
 * under us. */
static int writer_main(void *arg)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "writer", 5000);
	uint64_t len[USERS] = { 0 };

	(void)arg;
	if (!c)
		return H_FAIL;
	for (;;)
		for (uint32_t i = 0; i < USERS; i++) {
			if (len[i] + 16 > DEVICE_TOKENS) {
				/* Full: start the user over (a new snapshot). */
				if (kvp_evict(c, 1000 + i, KVP_SEL_ALL) < 0)
					return H_PASS;
				len[i] = 0;
			}
			if (h_append_cycle(c, SALT, 1000 + i, UINT64_MAX, 16, 1))
				return H_PASS;
			len[i] += 16;
			if (kvp_evict(c, 1000 + i, KVP_SEL_TO_DISK) < 0)
				return H_PASS;
		}
}

/* The line of the log of d's last run that holds s, or NULL. */
static const char *log_line(const struct h_daemon *d, const char *s)
{
	static char line[1024];
	FILE *f = fopen(d->log, "r");
	const char *found = NULL;

	while (f && !found && fgets(line, sizeof(line), f))
		if (strstr(line, s)) {
			line[strcspn(line, "\n")] = '\0';
			found = line;
		}
	if (f)
		fclose(f);
	return found;
}

static int log_has(const struct h_daemon *d, const char *s)
{
	return log_line(d, s) != NULL;
}

/* A second daemon on the same disk_dir, while d serves: refused. */
static int second_refused(const struct h_daemon *d)
{
	const char *extra[] = { "--device_mem=64K", "--host_mem=128K", g_adisk,
				"--disk_size=8M", NULL };
	struct h_daemon two;
	char pid[32];
	int rc, bad = 0;
	pid_t p;

	if (h_daemon_dir(&two, 0))
		return -1;
	p = h_daemon_spawn(&two, extra);
	rc = p > 0 ? h_wait(p, 10000) : -1;
	snprintf(pid, sizeof(pid), "pid %d", (int)d->pid);
	if (rc == 0 || rc == -1 || rc >= 128) {
		h_fail("a second kvpoold on the same disk_dir: exit %d, expected "
		       "a refusal", rc);
		bad = 1;
	} else if (!log_has(&two, "in use by another kvpoold") ||
		   !log_has(&two, pid)) {
		h_fail("a second kvpoold on the same disk_dir was refused without "
		       "saying it is in use by %s:", pid);
		bad = 1;
	}
	if (bad)
		h_daemon_dump_log(&two);
	else
		h_log("a second kvpoold on the same disk_dir is refused (exit %d)",
		      rc);
	h_daemon_cleanup(&two);
	return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
	uint64_t t0 = h_now_ms();
	char disk[256];
	struct h_daemon d;
	int bad = 0;

	h_init(argc, argv, "test_disk_kill_restart");
	if (h_daemon_dir(&d, 0))
		return H_FAIL;
	snprintf(disk, sizeof(disk), "%s/disk", d.dir);
	snprintf(g_adisk, sizeof(g_adisk), "--disk_dir=%s", disk);
	if (mkdir(disk, 0700)) {
		h_fail("mkdir %s: %m", disk);
		return H_FAIL;
	}
	g_sock = d.sock;
	if (start(&d))
		return h_daemon_end(&d, 1);
	for (int r = 0; r < ROUNDS && !bad; r++) {
		pid_t w = h_fork(writer_main, NULL);
		uint64_t t;

		if (w < 0)
			return h_daemon_end(&d, 1);
		h_sleep_ms(150 + (unsigned)(h_mix64(t0 + (uint64_t)r) % 250));
		h_daemon_kill(&d); /* SIGKILL and reap: mid-write */
		t = h_now_ms();
		if (start(&d)) {
			h_fail("round %d: kvpoold started right after the kill -9 "
			       "of the last one did not serve", r);
			bad = 1;
		} else {
			const char *l = log_line(&d, "waited");

			h_log("round %d: restarted in %" PRIu64 " ms%s%s", r,
			      h_now_ms() - t, l ? "; " : "", l ? strstr(l, "disk") : "");
		}
		if (h_wait(w, 10000) != 0)
			bad = 1;
	}
	if (!bad && second_refused(&d))
		bad = 1;
	return h_daemon_finish(&d, bad, t0);
}
