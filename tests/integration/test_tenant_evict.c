/* SPDX-License-Identifier: MIT */
/*
 * test_tenant_evict - seed 002's evict_kv_cache ("evict all the KV data")
 * for a client that is not an admin: kvp_evict_tenant() evicts every
 * unleased user of the caller's own tenant in one call and returns how many;
 * a leased user is skipped; another tenant's users are untouched; the
 * all-tenants form (kvp_evict_all) stays admin-only. And from the shell:
 * `kvctl evict --all` as a tenant's uid evicts that tenant, `kvctl evict
 * --all-tenants` as that uid is refused saying admin, and as root (an admin
 * with no tenant) `kvctl evict --all` still evicts every tenant.
 *
 * The clients setuid() to 1001 (tenant a) and 1002 (tenant b); the test
 * skips when it does not run as root.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define UID_A 1001
#define UID_B 1002
#define SALT_A 0xa11ull
#define SALT_B 0xb22ull
#define A_USERS 4           /* 100 .. 103; 103 stays leased */
#define B_USERS 3           /* 500 .. 502 */

static const char *g_sock;

static int need_root(void)
{
	if (geteuid() != 0) {
		print_message("skipped: needs root to setuid() client processes\n");
		return 0;
	}
	return 1;
}

static struct h_daemon *start(void **state)
{
	const char *extra[] = { "--tenant=a:uids=1001:device_mem=1M:host_mem=1M",
				"--tenant=b:uids=1002:device_mem=1M:host_mem=1M",
				"--socket_mode=0666", NULL };
	struct h_daemon *d = calloc(1, sizeof(*d));

	assert_non_null(d);
	*state = d;
	assert_int_equal(h_daemon_dir(d, 1), 0);
	assert_int_equal(h_daemon_startv(d, 10000, extra), 0);
	g_sock = d->sock;
	return d;
}

/* Run fn as uid in a child: skip when it cannot become uid, fail when fn
 * failed. */
static void run_as(uid_t uid, int (*fn)(void *), void *arg, const char *what)
{
	pid_t p = h_fork_as(uid, uid, fn, arg);
	int rc;

	assert_true(p > 0);
	rc = h_wait(p, 20000);
	if (rc == H_SKIP) {
		print_message("skipped: cannot setuid(%u)\n", (unsigned)uid);
		skip();
	}
	if (rc != 0)
		fail_msg("%s (uid %u) failed: exit %d (see its messages above)",
			 what, (unsigned)uid, rc);
}

/* Users first .. first + n - 1 hold 40 committed tokens each. */
static int write_users(struct kvp_client *c, uint64_t salt, uint64_t first, int n)
{
	for (int i = 0; i < n; i++)
		if (h_append_cycle(c, salt, first + (uint64_t)i, 0, 40, 0))
			return -1;
	return 0;
}

/* How many of users first .. first + n - 1 have tokens cached. */
static int cached_users(struct kvp_client *c, uint64_t first, int n)
{
	int k = 0;

	for (int i = 0; i < n; i++) {
		struct kvp_user_info ui;
		int rc = kvp_info(c, first + (uint64_t)i, &ui);

		k += rc == 0 && ui.len > 0;
	}
	return k;
}

static int tenant_b_writes(void *arg)
{
	struct kvp_client *c;
	int rc;

	(void)arg;
	h_set_name("tenant-b");
	c = h_connect_or_fail(g_sock, "b", 5000);
	if (!c)
		return H_FAIL;
	rc = write_users(c, SALT_B, 500, B_USERS);
	kvp_close(c);
	return rc ? H_FAIL : H_PASS;
}

/* Tenant b's users are all there, or (arg non-NULL) all gone. */
static int tenant_b_counts(void *arg)
{
	int want = arg ? 0 : B_USERS, got;
	struct kvp_client *c;

	h_set_name("tenant-b");
	c = h_connect_or_fail(g_sock, "b", 5000);
	if (!c)
		return H_FAIL;
	got = cached_users(c, 500, B_USERS);
	kvp_close(c);
	if (got != want) {
		h_fail("tenant b has %d of its %d users cached, want %d", got,
		       B_USERS, want);
		return H_FAIL;
	}
	return H_PASS;
}

static int tenant_a_evicts_its_own(void *arg)
{
	struct kvp_client *c;
	struct kvp_lease ls;
	struct kvp_stats st;
	int ok = 1, rc;

	(void)arg;
	h_set_name("tenant-a");
	c = h_connect_or_fail(g_sock, "a", 5000);
	if (!c)
		return H_FAIL;
	if (kvp_client_is_admin(c)) {
		h_fail("uid 1001 is an admin: the test needs a non-admin");
		kvp_close(c);
		return H_FAIL;
	}
	if (write_users(c, SALT_A, 100, A_USERS)) {
		kvp_close(c);
		return H_FAIL;
	}
	/* A read lease on the last user: eviction must pass it over. */
	rc = kvp_prepare(c, 100 + A_USERS - 1, 40, 0, &ls);
	if (rc) {
		h_fail("read lease: %d (%s)", rc, kvp_last_error(c));
		kvp_close(c);
		return H_FAIL;
	}

	/* The all-tenants form is still an admin's. */
	rc = kvp_evict_all(c, KVP_SEL_ALL);
	if (rc != -EPERM || !strstr(kvp_last_error(c), "admin")) {
		h_fail("kvp_evict_all as a tenant: %d (%s); want -EPERM saying admin",
		       rc, kvp_last_error(c));
		ok = 0;
	}
	/* Bad tiers are refused before anything is sent. */
	rc = kvp_evict_tenant(c, 0);
	if (rc != -EINVAL) {
		h_fail("kvp_evict_tenant(sel 0): %d, want -EINVAL", rc);
		ok = 0;
	}

	rc = kvp_evict_tenant(c, KVP_SEL_ALL);
	if (rc != A_USERS - 1) {
		h_fail("kvp_evict_tenant: %d (%s); want %d (the leased user skipped)",
		       rc, kvp_last_error(c), A_USERS - 1);
		ok = 0;
	}
	if (cached_users(c, 100, A_USERS - 1) != 0) {
		h_fail("users 100..%d still cached after kvp_evict_tenant",
		       100 + A_USERS - 2);
		ok = 0;
	}
	if (h_verify_user(c, SALT_A, 100 + A_USERS - 1, 0, 40, NULL))
		ok = 0; /* the leased one kept every byte */
	if (kvp_stats(c, 0, &st) < 0 || st.users != 1) {
		h_fail("tenant a's stats count %" PRIu64 " users after the evict, "
		       "want 1 (%s)", st.users, kvp_last_error(c));
		ok = 0;
	}
	kvp_release(c, ls.id);
	/* Unleased now: a second call takes it too, and then there is none. */
	rc = kvp_evict_tenant(c, KVP_SEL_ALL);
	if (rc != 1) {
		h_fail("second kvp_evict_tenant: %d (%s), want 1", rc,
		       kvp_last_error(c));
		ok = 0;
	}
	rc = kvp_evict_tenant(c, KVP_SEL_ALL);
	if (rc != 0) {
		h_fail("kvp_evict_tenant of an empty tenant: %d (%s), want 0", rc,
		       kvp_last_error(c));
		ok = 0;
	}
	/* And the tenant writes again afterwards. */
	if (write_users(c, SALT_A, 100, 1))
		ok = 0;
	kvp_close(c);
	return ok ? H_PASS : H_FAIL;
}

static void non_admin_evicts_its_tenant_only(void **state)
{
	if (!need_root())
		skip();
	struct h_daemon *d = start(state);

	run_as(UID_B, tenant_b_writes, NULL, "tenant b writing");
	run_as(UID_A, tenant_a_evicts_its_own, NULL, "tenant a evicting");
	run_as(UID_B, tenant_b_counts, NULL, "tenant b, untouched");
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

/* ------------------------------------------------------------ kvctl */

struct kvctl_run {
	int out[2];
	const char *flag;
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

/* Run `kvctl evict FLAG` as uid (0: as the test); exit code, output in buf. */
static int kvctl_evict(uid_t uid, const char *flag, char *buf, size_t len)
{
	struct kvctl_run k = { .flag = flag };
	size_t n = 0;
	ssize_t g;
	pid_t p;

	assert_int_equal(pipe(k.out), 0);
	p = uid ? h_fork_as(uid, uid, kvctl_child, &k) : h_fork(kvctl_child, &k);
	assert_true(p > 0);
	close(k.out[1]);
	while (n < len - 1 && (g = read(k.out[0], buf + n, len - 1 - n)) > 0)
		n += (size_t)g;
	buf[n] = 0;
	close(k.out[0]);
	return h_wait(p, 10000);
}

static int tenant_a_writes(void *arg)
{
	struct kvp_client *c;
	int rc;

	(void)arg;
	h_set_name("tenant-a");
	c = h_connect_or_fail(g_sock, "a", 5000);
	if (!c)
		return H_FAIL;
	rc = write_users(c, SALT_A, 100, A_USERS);
	kvp_close(c);
	return rc ? H_FAIL : H_PASS;
}

static int tenant_a_is_empty(void *arg)
{
	struct kvp_client *c;
	int got;

	(void)arg;
	h_set_name("tenant-a");
	c = h_connect_or_fail(g_sock, "a", 5000);
	if (!c)
		return H_FAIL;
	got = cached_users(c, 100, A_USERS);
	kvp_close(c);
	if (got) {
		h_fail("tenant a still has %d users cached", got);
		return H_FAIL;
	}
	return H_PASS;
}

static void kvctl_evict_all_as_a_tenant_evicts_that_tenant(void **state)
{
	char out[2048];
	int rc;

	if (!h_kvctl_path) {
		print_message("skipped: no kvctl given\n");
		skip();
	}
	if (!need_root())
		skip();
	struct h_daemon *d = start(state);

	run_as(UID_A, tenant_a_writes, NULL, "tenant a writing");
	run_as(UID_B, tenant_b_writes, NULL, "tenant b writing");

	rc = kvctl_evict(UID_A, "--all-tenants", out, sizeof(out));
	print_message("kvctl evict --all-tenants as uid 1001: exit %d: %s", rc, out);
	if (rc == H_SKIP)
		skip();
	if (rc != 1 || !strcasestr(out, "admin"))
		fail_msg("kvctl evict --all-tenants as a non-admin: exit %d, want 1 "
			 "saying admin: \"%s\"", rc, out);

	rc = kvctl_evict(UID_A, "--all", out, sizeof(out));
	print_message("kvctl evict --all as uid 1001: exit %d: %s", rc, out);
	if (rc != 0)
		fail_msg("kvctl evict --all as tenant a's uid exited %d: %s", rc, out);
	if (!strstr(out, "evicted 4 users") || !strstr(out, "tenant"))
		fail_msg("kvctl evict --all as tenant a does not say it evicted its "
			 "tenant's 4 users: \"%s\"", out);
	run_as(UID_A, tenant_a_is_empty, NULL, "tenant a, evicted");
	run_as(UID_B, tenant_b_counts, NULL, "tenant b, untouched");

	/* Root: an admin without a tenant; --all is every tenant, as before. */
	rc = kvctl_evict(0, "--all", out, sizeof(out));
	print_message("kvctl evict --all as root: exit %d: %s", rc, out);
	if (rc != 0)
		fail_msg("kvctl evict --all as root (admin) exited %d: %s", rc, out);
	run_as(UID_B, tenant_b_counts, (void *)1, "tenant b, evicted by the admin");
	assert_int_equal(h_daemon_stop(d, 10000), 0);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_tenant_evict");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(non_admin_evicts_its_tenant_only,
					  h_daemon_teardown),
		cmocka_unit_test_teardown(kvctl_evict_all_as_a_tenant_evicts_that_tenant,
					  h_daemon_teardown),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);

	if (failed)
		return H_FAIL;
	if (geteuid() != 0) {
		fprintf(stderr, "test_tenant_evict: SKIP: the uid tests need root\n");
		return H_SKIP;
	}
	return H_PASS;
}
