/* SPDX-License-Identifier: MIT */
/*
 * test_security - who may attach, what one tenant can see of another, quota
 * isolation, one daemon per socket, admin-only operations.
 *
 * The tests that need other uids fork children that setuid() to 1001, 1002
 * or 4242 before they connect; they skip when the test does not run as root
 * (or setuid is not permitted). Each test starts its own kvpoold.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define UID_A 1001
#define UID_B 1002
#define UID_OK 4242
#define SALT_A 0xaaaaull
#define SALT_B 0xbbbbull

static const char *g_sock;

static int need_root(void)
{
	if (geteuid() != 0) {
		print_message("skipped: needs root to setuid() client processes\n");
		return 0;
	}
	return 1;
}

/* Start a daemon for one test, in a world-enterable dir with a socket any
 * uid may connect to (so the daemon, not the file system, decides). */
static struct h_daemon *start(void **state, const char *const *extra)
{
	struct h_daemon *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	*state = d;
	assert_int_equal(h_daemon_dir(d, 1), 0);
	assert_int_equal(h_daemon_startv(d, 10000, extra), 0);
	g_sock = d->sock;
	return d;
}

/* Run fn as uid in a child; skip the test when the child could not become
 * uid, fail it when fn failed. */
static void run_as(uid_t uid, int (*fn)(void *), void *arg, const char *what)
{
	pid_t p = h_fork_as(uid, uid, fn, arg);
	assert_true(p > 0);
	int rc = h_wait(p, 60000);
	if (rc == H_SKIP) {
		print_message("skipped: cannot setuid(%u)\n", (unsigned)uid);
		skip();
	}
	if (rc != 0)
		fail_msg("%s (uid %u) failed: exit %d (see its messages above)",
			 what, (unsigned)uid, rc);
}

/* In a child: call it tenant-T and attach to the test's daemon as T;
 * NULL (reported) when it cannot. */
static struct kvp_client *connect_as_tenant(const char *t)
{
	char name[32];
	snprintf(name, sizeof(name), "tenant-%s", t);
	h_set_name(name);
	return h_connect_or_fail(g_sock, t, 5000);
}

/* ------------------------------------------------------------ (a) */

static int refused_child(void *arg)
{
	(void)arg;
	h_set_name("uid1001");
	struct kvp_client *c = NULL;
	struct kvp_connect_opts o = { .socket = g_sock, .name = "intruder" };
	char err[KVP_ERRLEN] = "";
	int rc = kvp_connect(&c, &o, err, sizeof(err));
	if (rc == 0) {
		h_fail("uid 1001 attached to a daemon with allow_uids=4242");
		kvp_close(c);
		return H_FAIL;
	}
	h_log("refused as expected: %d: %s", rc, err);
	if (rc != -EACCES && rc != -EPERM) {
		h_fail("refusal returned %d, expected -EACCES or -EPERM", rc);
		return H_FAIL;
	}
	if (!strstr(err, "1001") || !strstr(err, "allow")) {
		h_fail("the refusal does not say which uid and why: \"%s\"", err);
		return H_FAIL;
	}
	/* The raw handshake gets the same answer, and no fds. */
	struct h_raw r;
	rc = h_raw_attach(&r, g_sock, 0, 0, err, sizeof(err));
	if (rc == 0 || !strstr(err, "1001")) {
		h_fail("raw attach as uid 1001: %d (%s)", rc, err);
		if (rc == 0)
			h_raw_detach(&r);
		return H_FAIL;
	}
	return H_PASS;
}

static int allowed_child(void *arg)
{
	(void)arg;
	h_set_name("uid4242");
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	int rc = h_connect(&c, g_sock, "allowed", 5000, err, sizeof(err));
	if (rc < 0) {
		h_fail("uid 4242 (in allow_uids) refused: %d (%s)", rc, err);
		return H_FAIL;
	}
	int ok = !h_append_cycle(c, 1, 42, 0, 20, 0) &&
		 !h_verify_user(c, 1, 42, 0, 20, NULL);
	if (!kvp_client_is_admin(c)) {
		h_fail("uid 4242 is in admin_uids but was not granted admin");
		ok = 0;
	}
	kvp_close(c);
	return ok ? H_PASS : H_FAIL;
}

static void uid_not_in_allow_list_is_refused_with_message(void **state)
{
	if (!need_root())
		skip();
	const char *extra[] = { "--allow_uids=4242", "--admin_uids=4242",
				"--socket_mode=0666", NULL };
	start(state, extra);
	run_as(UID_A, refused_child, NULL, "the refused uid's check");
	/* The daemon still serves the uid it allows. */
	run_as(UID_OK, allowed_child, NULL, "the allowed uid");
}

/* ------------------------------------------------------------ (b) */

#define B_USERS 5
#define A_USERS 3

static int tenant_b_writes(void *arg)
{
	(void)arg;
	struct kvp_client *c = connect_as_tenant("b");
	if (!c)
		return H_FAIL;
	for (int i = 0; i < B_USERS; i++)
		if (h_append_cycle(c, SALT_B, 5000 + (uint64_t)i, 0, 40, 0)) {
			kvp_close(c);
			return H_FAIL;
		}
	kvp_close(c);
	return H_PASS;
}

static int tenant_b_checks(void *arg)
{
	(void)arg;
	struct kvp_client *c = connect_as_tenant("b");
	if (!c)
		return H_FAIL;
	int ok = 1;
	for (int i = 0; i < B_USERS; i++)
		if (h_verify_user(c, SALT_B, 5000 + (uint64_t)i, 0, 40, NULL))
			ok = 0;
	struct kvp_user_info rows[64];
	uint64_t next;
	int n = kvp_users(c, 0, rows, 64, &next);
	if (n != B_USERS) {
		h_fail("tenant b lists %d users, expected its %d", n, B_USERS);
		ok = 0;
	}
	kvp_close(c);
	return ok ? H_PASS : H_FAIL;
}

static int tenant_a_pries(void *arg)
{
	(void)arg;
	struct kvp_client *c = connect_as_tenant("a");
	if (!c)
		return H_FAIL;
	int ok = 1;
	for (int i = 0; i < A_USERS; i++)
		if (h_append_cycle(c, SALT_A, 7000 + (uint64_t)i, 0, 8, 0))
			ok = 0;

	int rc;
	/* List: only its own. */
	struct kvp_user_info rows[64];
	uint64_t next = 0;
	int n = kvp_users(c, 0, rows, 64, &next);
	if (n != A_USERS) {
		h_fail("tenant a lists %d users, expected its own %d", n, A_USERS);
		ok = 0;
	}
	for (int i = 0; i < n; i++)
		if (rows[i].user < 7000 || rows[i].user >= 7000 + A_USERS) {
			h_fail("tenant a lists user %" PRIu64 " (not its own)",
			       rows[i].user);
			ok = 0;
		}
	struct kvp_stats st;
	rc = kvp_stats(c, 0, &st);
	if (rc < 0 || st.users != A_USERS) {
		h_fail("tenant a's stats: %d, %" PRIu64 " users (expected %d)", rc,
		       rc < 0 ? 0 : st.users, A_USERS);
		ok = 0;
	}
	/* Read: b's users do not exist here. */
	for (int i = 0; i < B_USERS; i++) {
		uint64_t u = 5000 + (uint64_t)i;
		struct kvp_user_info ui;
		rc = kvp_info(c, u, &ui);
		if (rc == 0 && (ui.len || ui.pages_device || ui.pages_host)) {
			h_fail("tenant a sees tenant b's user %" PRIu64 ": len %" PRIu64
			       " pages %u+%u", u, ui.len, ui.pages_device, ui.pages_host);
			ok = 0;
		} else if (rc < 0 && rc != -ENOENT) {
			h_fail("info of another tenant's user: %d (%s)", rc,
			       kvp_last_error(c));
			ok = 0;
		}
		struct kvp_lease ls;
		rc = kvp_prepare(c, u, 40, 0, &ls);
		if (rc >= 0) {
			if (ls.npages || ls.len) {
				h_fail("a read-only prepare of tenant b's user %" PRIu64
				       " returned %u pages, len %" PRIu64, u, ls.npages,
				       ls.len);
				ok = 0;
			}
			kvp_release(c, ls.id);
		}
	}
	/* Evict / offload: nothing of b's to act on. */
	for (int i = 0; i < B_USERS; i++) {
		uint64_t u = 5000 + (uint64_t)i;
		rc = kvp_evict(c, u, KVP_SEL_ALL);
		if (rc > 0 || (rc < 0 && rc != -ENOENT)) {
			h_fail("evict of tenant b's user %" PRIu64 " from tenant a: %d"
			       " (%s); expected -ENOENT", u, rc, kvp_last_error(c));
			ok = 0;
		}
		rc = kvp_offload(c, u);
		if (rc > 0 || (rc < 0 && rc != -ENOENT)) {
			h_fail("offload of tenant b's user %" PRIu64 " from tenant a:"
			       " %d (%s)", u, rc, kvp_last_error(c));
			ok = 0;
		}
	}
	/* Admin operations: refused with a message. */
	rc = kvp_evict_all(c, KVP_SEL_ALL);
	if (rc != -EPERM && rc != -EACCES) {
		h_fail("evict --all as a tenant: %d (%s), expected -EPERM", rc,
		       kvp_last_error(c));
		ok = 0;
	} else if (!strstr(kvp_last_error(c), "admin")) {
		h_fail("the refusal of evict_all does not say admin is needed: \"%s\"",
		       kvp_last_error(c));
		ok = 0;
	}
	rc = kvp_stats(c, 1, &st);
	if (rc != -EPERM && rc != -EACCES) {
		h_fail("stats of all tenants as a tenant: %d, expected -EPERM", rc);
		ok = 0;
	}
	struct kvp_client_info ci[8];
	rc = kvp_clients(c, 0, ci, 8, &next);
	if (rc != -EPERM && rc != -EACCES) {
		h_fail("clients as a tenant: %d, expected -EPERM", rc);
		ok = 0;
	}
	kvp_close(c);

	/* Raw memory: the welcome names tenant a and a's tier only. */
	struct h_raw r;
	char err[KVP_ERRLEN];
	rc = h_raw_attach(&r, g_sock, 0, 0, err, sizeof(err));
	if (rc < 0) {
		h_fail("raw attach: %d (%s)", rc, err);
		return H_FAIL;
	}
	if (strcmp(r.w.tenant, "a") || r.w.tier_bytes[KVP_TIER_DEVICE] > (1u << 20)) {
		h_fail("tenant a's welcome: tenant \"%s\", device tier %" PRIu64
		       " bytes (quota 1 MiB)", r.w.tenant,
		       r.w.tier_bytes[KVP_TIER_DEVICE]);
		ok = 0;
	}
	h_raw_detach(&r);
	return ok ? H_PASS : H_FAIL;
}

static void tenant_cannot_read_list_or_evict_another_tenant(void **state)
{
	if (!need_root())
		skip();
	const char *extra[] = { "--tenant=a:uids=1001:device_mem=1M:host_mem=1M",
				"--tenant=b:uids=1002:device_mem=1M:host_mem=1M",
				"--socket_mode=0666", NULL };
	struct h_daemon *d = start(state, extra);
	run_as(UID_B, tenant_b_writes, NULL, "tenant b writing");
	run_as(UID_A, tenant_a_pries, NULL, "tenant a prying");
	run_as(UID_B, tenant_b_checks, NULL, "tenant b checking its data");
	/* The admin sees both tenants. */
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	assert_int_equal(h_connect(&c, d->sock, "admin", 5000, err, sizeof(err)), 0);
	struct kvp_user_info rows[64];
	uint64_t next;
	int n = kvp_users(c, 0, rows, 64, &next);
	kvp_close(c);
	if (n != A_USERS + B_USERS)
		fail_msg("the admin lists %d users, expected %d over both tenants",
			 n, A_USERS + B_USERS);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/* ------------------------------------------------------------ (c) */

static int tenant_a_fills(void *arg)
{
	struct h_chan *s = arg;
	h_chan_child_side(s);
	struct kvp_client *c = connect_as_tenant("a");
	if (!c)
		return H_FAIL;
	struct kvp_stats st;
	if (kvp_stats(c, 0, &st) < 0) {
		h_fail("stats: %s", kvp_last_error(c));
		return H_FAIL;
	}
	uint64_t frames = st.tier[KVP_TIER_DEVICE].frames_total;
	/* One page a user, every lease held: nothing can be evicted. */
	uint64_t i;
	int rc = 0;
	struct kvp_lease ls;
	for (i = 0; i <= frames; i++) {
		rc = kvp_prepare(c, 9000 + i, 0, H_PAGE_TOKENS, &ls);
		if (rc < 0)
			break;
	}
	int ok = 1;
	h_log("prepare %" PRIu64 " of a %" PRIu64 "-frame quota: %d (%s)", i + 1,
	      frames, rc, kvp_last_error(c));
	if (rc != -ENOMEM) {
		h_fail("a tenant over its device quota got %d, expected -ENOMEM", rc);
		ok = 0;
	} else if (!kvp_last_error(c)[0]) {
		h_fail("-ENOMEM without a message");
		ok = 0;
	}
	if (i != frames) {
		h_fail("-ENOMEM after %" PRIu64 " one-page leases; the quota holds %"
		       PRIu64, i, frames);
		ok = 0;
	}
	if (h_chan_say(s->to_parent[1], ok ? 'y' : 'n'))
		ok = 0;
	/* Hold every lease until the other tenant has been served. */
	h_chan_wait(s->to_child[0], 60000);
	kvp_close(c);
	return ok ? H_PASS : H_FAIL;
}

static int tenant_b_unaffected(void *arg)
{
	(void)arg;
	struct kvp_client *c = connect_as_tenant("b");
	if (!c)
		return H_FAIL;
	int ok = 1;
	for (int i = 0; i < 20 && ok; i++) {
		uint64_t u = 6000 + (uint64_t)i;
		if (h_append_cycle(c, SALT_B, u, 0, 20, 0) ||
		    h_verify_user(c, SALT_B, u, 0, 20, NULL))
			ok = 0;
	}
	kvp_close(c);
	return ok ? H_PASS : H_FAIL;
}

static void tenant_over_quota_gets_enomem_others_unaffected(void **state)
{
	if (!need_root())
		skip();
	/* Tenant a: 16 pages of 4 KiB and no host tier. */
	const char *extra[] = { "--tenant=a:uids=1001:device_mem=64K:host_mem=0",
				"--tenant=b:uids=1002:device_mem=1M:host_mem=1M",
				"--socket_mode=0666", NULL };
	start(state, extra);
	struct h_chan s;
	assert_int_equal(h_chan_open(&s), 0);
	pid_t a = h_fork_as(UID_A, UID_A, tenant_a_fills, &s);
	assert_true(a > 0);
	h_chan_parent_side(&s);
	int b = h_chan_wait(s.to_parent[0], 30000);
	if (b < 0) {
		int rc = h_wait(a, 5000);
		if (rc == H_SKIP)
			skip();
		fail_msg("tenant a's child did not report (exit %d)", rc);
	}
	/* While a sits at its quota with every page pinned, b works. */
	run_as(UID_B, tenant_b_unaffected, NULL, "tenant b preparing");
	close(s.to_child[1]);
	int rc = h_wait(a, 10000);
	close(s.to_parent[0]);
	if (b != 'y' || rc != 0)
		fail_msg("tenant a over its quota did not get -ENOMEM as it should"
			 " (see above; exit %d)", rc);
}

/* ------------------------------------------------------------ (d) */

static void second_daemon_on_same_socket_refuses_to_start(void **state)
{
	struct h_daemon *d = start(state, NULL);
	struct h_daemon d2 = *d; /* same dir and socket; its own log */
	d2.pid = h_daemon_spawn(&d2, NULL);
	assert_true(d2.pid > 0);
	uint64_t until = h_now_ms() + 10000;
	while (h_daemon_alive(&d2) && h_now_ms() < until)
		h_sleep_ms(5);
	if (h_daemon_alive(&d2)) {
		h_daemon_kill(&d2);
		fail_msg("a second kvpoold on %s was still running after 10 s",
			 d->sock);
	}
	int st = d2.exit_status;
	char log[4096] = "";
	FILE *f = fopen(d2.log, "r");
	if (f) {
		size_t n = fread(log, 1, sizeof(log) - 1, f);
		log[n] = 0;
		fclose(f);
	}
	print_message("second daemon: status 0x%x, said: %s", st, log);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 0)
		fail_msg("a second kvpoold on a live socket exited with status 0x%x,"
			 " expected a non-zero exit", st);
	if (!strstr(log, d->sock))
		fail_msg("the second kvpoold's message does not name the socket %s:"
			 " \"%s\"", d->sock, log);
	/* The first one still owns the socket and serves. */
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	if (h_connect(&c, d->sock, "after", 5000, err, sizeof(err)) < 0)
		fail_msg("the first daemon stopped serving: %s", err);
	int bad = h_append_cycle(c, 3, 1, 0, 33, 0) ||
		  h_verify_user(c, 3, 1, 0, 33, NULL);
	kvp_close(c);
	assert_false(bad);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/* ------------------------------------------------------------ (e) */

struct kvctl_run {
	int out[2];
	const char *flag;       /* --all or --all-tenants */
};

static int kvctl_child(void *arg)
{
	struct kvctl_run *k = arg;
	close(k->out[0]);
	dup2(k->out[1], 1);
	dup2(k->out[1], 2);
	setenv("KVPOOL_SOCKET", g_sock, 1);
	execl(h_kvctl_path, "kvctl", "evict", k->flag, (char *)NULL);
	dprintf(2, "exec %s: %s\n", h_kvctl_path, strerror(errno));
	return 126;
}

/* Run kvctl evict FLAG as uid; returns its exit code, output in buf. */
static int kvctl_evict_all(uid_t uid, const char *flag, char *buf, size_t len)
{
	struct kvctl_run k = { .flag = flag };
	assert_int_equal(pipe(k.out), 0);
	pid_t p = uid ? h_fork_as(uid, uid, kvctl_child, &k)
		      : h_fork(kvctl_child, &k);
	assert_true(p > 0);
	close(k.out[1]);
	size_t n = 0;
	ssize_t g;
	while (n < len - 1 && (g = read(k.out[0], buf + n, len - 1 - n)) > 0)
		n += (size_t)g;
	buf[n] = 0;
	close(k.out[0]);
	return h_wait(p, 10000);
}

/* Every tenant's users are an admin's to evict (--all-tenants, and an
 * admin's --all); a non-admin's --all is its own tenant's
 * (test_tenant_evict has the tenants). */
static void kvctl_evict_all_tenants_as_non_admin_exits_1_saying_admin(void **state)
{
	if (!h_kvctl_path) {
		print_message("skipped: no kvctl given\n");
		skip();
	}
	if (!need_root())
		skip();
	const char *extra[] = { "--socket_mode=0666", NULL };
	struct h_daemon *d = start(state, extra);
	char out[2048];
	int rc = kvctl_evict_all(UID_A, "--all-tenants", out, sizeof(out));
	print_message("kvctl evict --all-tenants as uid 1001: exit %d: %s", rc, out);
	if (rc == H_SKIP)
		skip();
	if (rc != 1)
		fail_msg("kvctl evict --all-tenants as a non-admin exited %d, expected 1",
			 rc);
	if (!strcasestr(out, "admin"))
		fail_msg("kvctl's refusal does not say admin is needed: \"%s\"", out);
	/* --all as a non-admin: its own (here the default) tenant. */
	rc = kvctl_evict_all(UID_A, "--all", out, sizeof(out));
	print_message("kvctl evict --all as uid 1001: exit %d: %s", rc, out);
	if (rc != 0 || !strstr(out, "tenant"))
		fail_msg("kvctl evict --all as a non-admin exited %d, expected 0 "
			 "evicting its tenant: \"%s\"", rc, out);
	/* Root is an admin by default: both forms work, over every tenant. */
	rc = kvctl_evict_all(0, "--all", out, sizeof(out));
	if (rc != 0)
		fail_msg("kvctl evict --all as root (admin) exited %d: %s", rc, out);
	rc = kvctl_evict_all(0, "--all-tenants", out, sizeof(out));
	if (rc != 0)
		fail_msg("kvctl evict --all-tenants as root (admin) exited %d: %s", rc,
			 out);
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_security");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(uid_not_in_allow_list_is_refused_with_message,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(tenant_cannot_read_list_or_evict_another_tenant,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(tenant_over_quota_gets_enomem_others_unaffected,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(second_daemon_on_same_socket_refuses_to_start,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(
			kvctl_evict_all_tenants_as_non_admin_exits_1_saying_admin,
			h_daemon_teardown),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	if (failed)
		return H_FAIL;
	if (geteuid() != 0) {
		fprintf(stderr, "test_security: SKIP: the uid tests need root\n");
		return H_SKIP;
	}
	return H_PASS;
}
