/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_lifecycle - starting over a stale socket, clean shutdown on
 * SIGTERM and SIGINT (with clients attached), kvp_close() giving back every
 * lease the client held, bad handshakes refused without holding anyone up,
 * and hundreds of attaches (closing, dying, refused) leaking nothing.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *g_sock;

/* ASan's quarantine grows a sanitizer build's daemon (the test is built
 * the same way): the tight bound is the normal build's. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_SLACK_KB (32 * 1024)
#else
#define RSS_SLACK_KB 2048
#endif

static struct h_daemon *start(void **state)
{
	struct h_daemon *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	*state = d;
	assert_int_equal(h_daemon_dir(d, 0), 0);
	assert_int_equal(h_daemon_start(d, 10000, "--device_mem=4M",
					"--host_mem=4M", (char *)NULL), 0);
	g_sock = d->sock;
	return d;
}

/* A client works against the daemon: one cycle, read back. */
static void assert_serves(const char *sock, uint64_t user)
{
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	if (h_connect(&c, sock, "probe", 5000, err, sizeof(err)) < 0)
		fail_msg("cannot attach to %s: %s", sock, err);
	int bad = h_append_cycle(c, 11, user, 0, 21, 0) ||
		  h_verify_user(c, 11, user, 0, 21, NULL);
	kvp_close(c);
	assert_false(bad);
}

/* ------------------------------------------------------------ stale socket */

static void stale_socket_of_killed_daemon_is_replaced(void **state)
{
	struct h_daemon *d = start(state);
	assert_serves(d->sock, 1);
	h_daemon_kill(d);
	struct stat st;
	if (lstat(d->sock, &st) < 0 || !S_ISSOCK(st.st_mode))
		fail_msg("expected the SIGKILLed daemon's socket %s to be left behind",
			 d->sock);
	/* Nobody listens on it now. */
	int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	assert_true(strlen(d->sock) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
	assert_int_equal(connect(s, (struct sockaddr *)&sa, sizeof(sa)), -1);
	assert_int_equal(errno, ECONNREFUSED);
	close(s);

	assert_int_equal(h_daemon_start(d, 10000, "--device_mem=4M",
					"--host_mem=4M", (char *)NULL), 0);
	assert_serves(d->sock, 2);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/* ------------------------------------------------------------ shutdown */

/* Attach, hold a write lease and a read lease, tell the parent, wait for it
 * to stop the daemon, then check the next call fails instead of hanging. */
static int attached_client(void *arg)
{
	struct h_chan *a = arg;
	h_set_name("attached");
	h_chan_child_side(a);
	struct kvp_client *c = h_connect_or_fail(g_sock, "attached", 5000);
	if (!c)
		return H_FAIL;
	struct kvp_lease ls;
	if (h_append_cycle(c, 5, 10, 0, 16, 0) ||
	    kvp_prepare(c, 10, 16, 0, &ls) < 0 ||
	    kvp_prepare(c, 11, 0, 5, &ls) < 0) {
		h_fail("setup: %s", kvp_last_error(c));
		return H_FAIL;
	}
	h_chan_say(a->to_parent[1], 'r');
	if (h_chan_wait(a->to_child[0], 30000) != 's') {
		h_fail("no word from the parent");
		return H_FAIL;
	}
	struct kvp_user_info ui;
	uint64_t t0 = h_now_ms();
	int rc = kvp_info(c, 10, &ui);
	if (rc >= 0) {
		h_fail("info succeeded after the daemon exited");
		kvp_close(c);
		return H_FAIL;
	}
	h_log("after the daemon exited, info returned %d in %" PRIu64 " ms (%s)",
	      rc, h_now_ms() - t0, kvp_last_error(c));
	kvp_close(c);
	return H_PASS;
}

static void shutdown_with_client_attached(void **state, int sig)
{
	struct h_daemon *d = start(state);
	struct h_chan a;
	assert_int_equal(h_chan_open(&a), 0);
	pid_t p = h_fork(attached_client, &a);
	h_chan_parent_side(&a);
	assert_int_equal(h_chan_wait(a.to_parent[0], 10000), 'r');
	if (sig == SIGTERM) {
		assert_int_equal(h_daemon_stop(d, 10000), 0);
	} else {
		kill(d->pid, sig);
		uint64_t until = h_now_ms() + 10000;
		while (h_daemon_alive(d) && h_now_ms() < until)
			h_sleep_ms(2);
		if (h_daemon_alive(d))
			fail_msg("kvpoold still running 10 s after signal %d", sig);
		if (!WIFEXITED(d->exit_status) || WEXITSTATUS(d->exit_status))
			fail_msg("kvpoold ended with status 0x%x on signal %d,"
				 " expected exit 0", d->exit_status, sig);
		if (access(d->sock, F_OK) == 0)
			fail_msg("kvpoold left %s behind after signal %d", d->sock, sig);
	}
	h_chan_say(a.to_child[1], 's');
	int rc = h_wait(p, 15000);
	close(a.to_parent[0]);
	close(a.to_child[1]);
	if (rc != 0)
		fail_msg("the attached client did not see the daemon go (exit %d)", rc);
}

static void sigterm_exits_0_and_removes_socket(void **state)
{
	shutdown_with_client_attached(state, SIGTERM);
}

static void sigint_exits_0_and_removes_socket(void **state)
{
	shutdown_with_client_attached(state, SIGINT);
}

/* ------------------------------------------------------------ close */

#define HELD_WRITE 3
#define HELD_READ 2

static int closing_client(void *arg)
{
	struct h_chan *a = arg;
	h_set_name("closer");
	h_chan_child_side(a);
	struct kvp_client *c = h_connect_or_fail(g_sock, "closer", 5000);
	if (!c)
		return H_FAIL;
	struct kvp_lease ls;
	const struct kvp_layout *l = kvp_client_layout(c);
	uint8_t kv[20 * 256];
	for (int i = 0; i < HELD_READ; i++) {
		uint64_t u = 20 + (uint64_t)i;
		if (h_append_cycle(c, 6, u, 0, 20, 0) ||
		    kvp_prepare(c, u, 20, 0, &ls) < 0) {
			h_fail("read lease: %s", kvp_last_error(c));
			return H_FAIL;
		}
	}
	for (int i = 0; i < HELD_WRITE; i++) {
		uint64_t u = 30 + (uint64_t)i;
		if (h_append_cycle(c, 6, u, 0, 7, 0) ||
		    kvp_prepare(c, u, 7, 20, &ls) < 0) {
			h_fail("write lease: %s", kvp_last_error(c));
			return H_FAIL;
		}
		/* Written but never committed: must not become history. */
		h_tokens_fill(l, 77, u, 7, 20, kv);
		kvp_append(c, &ls, 0, 20, kv);
	}
	h_chan_say(a->to_parent[1], 'h');
	if (h_chan_wait(a->to_child[0], 30000) != 'c')
		return H_FAIL;
	kvp_close(c);
	h_chan_say(a->to_parent[1], 'c');
	/* Stay alive: the leases must go with the close, not the process. */
	h_chan_wait(a->to_child[0], 30000);
	return H_PASS;
}

static void close_releases_every_lease(void **state)
{
	struct h_daemon *d = start(state);
	struct h_chan a;
	assert_int_equal(h_chan_open(&a), 0);
	pid_t p = h_fork(closing_client, &a);
	h_chan_parent_side(&a);
	assert_int_equal(h_chan_wait(a.to_parent[0], 10000), 'h');

	struct kvp_client *c;
	char err[KVP_ERRLEN];
	assert_int_equal(h_connect(&c, d->sock, "observer", 5000, err, sizeof(err)), 0);
	struct kvp_stats st;
	assert_int_equal(kvp_stats(c, 0, &st), 0);
	if (st.leases != HELD_WRITE + HELD_READ)
		fail_msg("%" PRIu64 " leases while the client holds %d",
			 st.leases, HELD_WRITE + HELD_READ);
	uint64_t used_before = st.tier[KVP_TIER_DEVICE].frames_used;

	h_chan_say(a.to_child[1], 'c');
	assert_int_equal(h_chan_wait(a.to_parent[0], 10000), 'c');
	uint64_t until = h_now_ms() + 2000;
	do {
		assert_int_equal(kvp_stats(c, 0, &st), 0);
		if (st.leases == 0)
			break;
		h_sleep_ms(2);
	} while (h_now_ms() < until);
	if (st.leases != 0)
		fail_msg("%" PRIu64 " leases 2 s after kvp_close (client still alive)",
			 st.leases);
	/* The uncommitted reservations are rolled back: their pages are free,
	 * the histories end where they did, and a new writer may continue. */
	print_message("device frames used: %" PRIu64 " with the leases, %" PRIu64
		      " after close\n", used_before,
		      st.tier[KVP_TIER_DEVICE].frames_used);
	if (h_check_accounting(c, NULL))
		fail_msg("the frame accounting does not add up after kvp_close");
	if (st.tier[KVP_TIER_DEVICE].frames_used >= used_before)
		fail_msg("the uncommitted reservations' pages were not freed");
	for (int i = 0; i < HELD_WRITE; i++) {
		uint64_t u = 30 + (uint64_t)i;
		if (h_verify_user(c, 6, u, 0, 7, NULL))
			fail_msg("user %" PRIu64 " changed by an uncommitted lease", u);
		if (h_append_cycle(c, 6, u, 7, 9, 0))
			fail_msg("user %" PRIu64 " cannot be continued after the close", u);
		if (h_verify_user(c, 6, u, 0, 16, NULL))
			fail_msg("user %" PRIu64 " reads back wrong", u);
	}
	for (int i = 0; i < HELD_READ; i++)
		if (h_verify_user(c, 6, 20 + (uint64_t)i, 0, 20, NULL))
			fail_msg("user %d reads back wrong", 20 + i);
	kvp_close(c);
	close(a.to_child[1]);
	assert_int_equal(h_wait(p, 10000), 0);
	close(a.to_parent[0]);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/* ------------------------------------------------------------ handshakes */

/* A hello the daemon must refuse: a welcome with status < 0 and no fds, or
 * a hang-up. Returns the welcome's message ("" for a hang-up). */
static void expect_refused(const char *sock, const void *hello, size_t len,
			   const char *what, const char *must_say)
{
	struct kvp_welcome w;
	int nfds;
	int r = h_raw_hello(sock, hello, len, &w, &nfds, 5000);
	if (r < 0)
		fail_msg("hello with %s: no answer (%d)", what, r);
	if (r == 1 && (w.status >= 0 || nfds))
		fail_msg("hello with %s was accepted (status %d, %d fds)", what,
			 w.status, nfds);
	print_message("hello with %s: %s\n", what,
		      r == 0 ? "hung up" : w.msg);
	if (r == 1 && must_say && !strstr(w.msg, must_say))
		fail_msg("the refusal of a hello with %s does not say \"%s\": %s",
			 what, must_say, w.msg);
}

static void bad_hellos_are_refused_and_stall_no_one(void **state)
{
	struct h_daemon *d = start(state);
	/* A peer that connects and says nothing must not hold up others. */
	int silent = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	assert_true(strlen(d->sock) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
	assert_int_equal(connect(silent, (struct sockaddr *)&sa, sizeof(sa)), 0);
	uint64_t t0 = h_now_ms();
	assert_serves(d->sock, 1);
	print_message("attach + cycle with a silent peer connected: %" PRIu64
		      " ms\n", h_now_ms() - t0);

	const struct kvp_hello good = { .magic = KVP_PROTO_MAGIC,
					.version = KVP_PROTO_VERSION };
	struct kvp_hello h;
	h = good;
	h.magic ^= 1;
	expect_refused(d->sock, &h, sizeof(h), "a wrong magic", NULL);
	h = good;
	h.version = 999;
	expect_refused(d->sock, &h, sizeof(h), "version 999", "999");
	h = good;
	h.sq_entries = 100;
	expect_refused(d->sock, &h, sizeof(h), "sq_entries 100 (no power of two)",
		       NULL);
	h = good;
	h.sq_entries = KVP_RING_MAX_ENTRIES * 2;
	expect_refused(d->sock, &h, sizeof(h), "sq_entries past the maximum", NULL);
	h = good;
	h.sq_entries = 4;
	expect_refused(d->sock, &h, sizeof(h), "sq_entries 4 (under the minimum)",
		       NULL);
	h = good;
	h.sq_entries = 64;
	h.cq_entries = 16;
	expect_refused(d->sock, &h, sizeof(h), "cq_entries < sq_entries", NULL);
	h = good;
	h.arena_bytes = 1;
	expect_refused(d->sock, &h, sizeof(h), "arena_bytes 1", NULL);
	h = good;
	h.arena_bytes = 0xffffffffu;
	expect_refused(d->sock, &h, sizeof(h), "arena_bytes 4 GiB", NULL);
	expect_refused(d->sock, &good, 8, "a hello of 8 bytes", NULL);
	expect_refused(d->sock, &good, 1, "a hello of 1 byte", NULL);
	char big[sizeof(good) + 64] = { 0 };
	memcpy(big, &good, sizeof(good));
	expect_refused(d->sock, big, sizeof(big), "a hello with trailing bytes",
		       NULL);

	assert_serves(d->sock, 2);
	close(silent);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/*
 * Every worker gives each client a lane of rings (proto.h, LANES): the
 * largest rings the hello may ask for, times 16 workers, are 128 MiB per
 * client. Refused with a message saying what to do; rings that fit still
 * attach, and the daemon goes on serving.
 */
static void rings_over_all_lanes_are_bounded(void **state)
{
	struct h_daemon *d = calloc(1, sizeof(*d));
	const struct kvp_hello good = { .magic = KVP_PROTO_MAGIC,
					.version = KVP_PROTO_VERSION };
	struct kvp_hello h = good;
	struct kvp_connect_opts o = { .sq_entries = 4096 };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN];

	assert_non_null(d);
	*state = d;
	assert_int_equal(h_daemon_dir(d, 0), 0);
	assert_int_equal(h_daemon_start(d, 10000, "--device_mem=4M", "--host_mem=4M",
					"--workers=16", (char *)NULL), 0);
	g_sock = d->sock;
	h.sq_entries = KVP_RING_MAX_ENTRIES;
	expect_refused(d->sock, &h, sizeof(h), "the largest rings on 16 lanes",
		       "fewer entries");
	o.socket = d->sock;
	assert_int_equal(kvp_connect(&c, &o, err, sizeof(err)), 0);
	kvp_close(c);
	assert_serves(d->sock, 3);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/* ------------------------------------------------------------ churn */

static int dying_client(void *arg)
{
	uint64_t user = (uint64_t)(uintptr_t)arg;
	h_set_name("dying");
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	struct kvp_lease ls;
	if (h_connect(&c, g_sock, "dying", 5000, err, sizeof(err)) < 0 ||
	    kvp_prepare(c, user, 0, 40, &ls) < 0)
		return H_FAIL;
	return H_PASS; /* _exit without kvp_close: the kernel closes the fds */
}

static int churn_once(const char *sock, int i)
{
	char err[KVP_ERRLEN];
	if (i % 10 == 0) {
		pid_t p = h_fork(dying_client, (void *)(uintptr_t)(100000 + i));
		return h_wait(p, 10000) == 0 ? 0 : -1;
	}
	if (i % 7 == 0) {
		struct h_raw r;
		if (h_raw_attach(&r, sock, 0, 0, err, sizeof(err)) < 0)
			return -1;
		h_raw_detach(&r);
		return 0;
	}
	if (i % 13 == 0) {
		struct kvp_hello h = { .magic = KVP_PROTO_MAGIC, .version = 77 };
		struct kvp_welcome w;
		int nfds;
		return h_raw_hello(sock, &h, sizeof(h), &w, &nfds, 5000) < 0 ? -1 : 0;
	}
	struct kvp_client *c;
	if (h_connect(&c, sock, "churn", 5000, err, sizeof(err)) < 0) {
		h_log("churn connect: %s", err);
		return -1;
	}
	int rc = 0;
	if (i % 3 == 0) {
		/* Close with a write lease held (never committed). */
		struct kvp_lease ls;
		rc = kvp_prepare(c, 200000 + (uint64_t)i, 0, 20, &ls);
	} else {
		struct kvp_user_info ui;
		rc = kvp_info(c, 5, &ui);
	}
	kvp_close(c);
	return rc < 0 ? -1 : 0;
}

/* Wait until only the observer is attached and nothing is leased. */
static void wait_quiet(struct kvp_client *c, struct kvp_stats *st)
{
	uint64_t until = h_now_ms() + 5000;
	for (;;) {
		assert_int_equal(kvp_stats(c, 0, st), 0);
		if ((st->clients <= 1 && st->leases == 0) || h_now_ms() > until)
			break;
		h_sleep_ms(2);
	}
	if (st->clients > 1 || st->leases)
		fail_msg("5 s after the churn: %" PRIu64 " clients, %" PRIu64
			 " leases (expected 1 and 0)", st->clients, st->leases);
}

static void attach_churn_leaks_no_fds_memory_or_users(void **state)
{
	struct h_daemon *d = start(state);
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	assert_int_equal(h_connect(&c, d->sock, "observer", 5000, err, sizeof(err)), 0);
	struct kvp_stats st;
	for (int i = 0; i < 30; i++)
		if (churn_once(d->sock, i))
			fail_msg("churn warm-up step %d failed", i);
	wait_quiet(c, &st);
	int fds0 = h_proc_fds(d->pid);
	long rss0 = h_proc_status_kb(d->pid, "VmRSS");
	for (int i = 30; i < 400; i++)
		if (churn_once(d->sock, i))
			fail_msg("churn step %d failed", i);
	wait_quiet(c, &st);
	/* Detaching finishes on the daemon's main thread a moment after the
	 * stats say so: a leak is an fd that never goes, so give it 2 s. */
	int fds1 = h_proc_fds(d->pid);
	for (uint64_t until = h_now_ms() + 2000; fds1 > fds0 && h_now_ms() < until;) {
		h_sleep_ms(5);
		fds1 = h_proc_fds(d->pid);
	}
	long rss1 = h_proc_status_kb(d->pid, "VmRSS");
	print_message("daemon fds %d -> %d, VmRSS %ld -> %ld KiB over 370 attaches\n",
		      fds0, fds1, rss0, rss1);
	if (fds1 > fds0)
		fail_msg("the daemon holds %d fds after the churn, %d before", fds1,
			 fds0);
	if (rss1 - rss0 >= RSS_SLACK_KB)
		fail_msg("the daemon grew by %ld KiB over the churn", rss1 - rss0);
	/* Nothing was ever committed: every rolled-back user is gone. */
	if (st.users != 0)
		fail_msg("%" PRIu64 " users left although nothing was committed",
			 st.users);
	if (h_check_accounting(c, NULL))
		fail_msg("the frame accounting does not add up after the churn");
	kvp_close(c);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_daemon_lifecycle");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(stale_socket_of_killed_daemon_is_replaced,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(sigterm_exits_0_and_removes_socket,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(sigint_exits_0_and_removes_socket,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(close_releases_every_lease,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(rings_over_all_lanes_are_bounded,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(bad_hellos_are_refused_and_stall_no_one,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(attach_churn_leaks_no_fds_memory_or_users,
					  h_daemon_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL) ? H_FAIL : H_PASS;
}
