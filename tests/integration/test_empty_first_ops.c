/* SPDX-License-Identifier: MIT */
/*
 * test_empty_first_ops - operations whose answer is an empty page table, as
 * the very first page-table operation a fresh kvpoold serves (issue 25, item
 * 11): before anything grew the engine's page-table view it is NULL, and
 * copying 0 bytes from it is undefined (the sanitizer build aborts the whole
 * daemon, every tenant's cache with it). Each case runs on a daemon of its
 * own, so each is the first such operation:
 *
 *   a. kvp_prepare(user, 0, 0) on an empty user: a read lease with no pages;
 *   b. kvp_seq_create with no sources and no new tokens, where the daemon
 *      allows it (an error naming the arguments is fine too);
 *   c. kvp_prefix_lookup of tokens nobody cached: 0 tokens, no pages.
 *
 * After each, the daemon is alive, serves a normal append cycle, and its log
 * has no sanitizer report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SALT 0xe9e1ull

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

/* The daemon still serves, and said nothing a sanitizer says. */
static void check_daemon_fine(struct h_daemon *d, struct kvp_client *c,
			      const char *what)
{
	char line[512];
	FILE *f;

	CHECK(h_daemon_alive(d), "%s: kvpoold died", what);
	if (!h_daemon_alive(d))
		return;
	CHECK(h_append_cycle(c, SALT, 9, 0, 20, 0) == 0,
	      "%s: an append cycle after it failed", what);
	CHECK(h_verify_user(c, SALT, 9, 0, 20, NULL) == 0,
	      "%s: user 9's bytes after it", what);
	f = fopen(d->log, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		CHECK(!strstr(line, "runtime error") && !strstr(line, "Sanitizer"),
		      "%s: kvpoold's log: %s", what, line);
	fclose(f);
}

static void case_a_empty_prepare(struct kvp_client *c)
{
	struct kvp_lease l;
	int rc;

	memset(&l, 0, sizeof(l));
	rc = kvp_prepare(c, 7, 0, 0, &l);
	CHECK(rc == 0, "a: prepare(7, 0, 0) on an empty user = %d: %s", rc,
	      kvp_last_error(c));
	if (!rc) {
		CHECK(l.npages == 0 && l.len == 0 && l.n_new == 0,
		      "a: the empty read lease has %u pages, len %llu, n_new %u",
		      l.npages, (unsigned long long)l.len, l.n_new);
		CHECK(kvp_release(c, l.id) == 0, "a: release: %s", kvp_last_error(c));
	}
}

static void case_b_empty_seq(struct kvp_client *c)
{
	struct kvp_seq_src src;
	struct kvp_lease l;
	int rc;

	memset(&src, 0, sizeof(src));
	memset(&l, 0, sizeof(l));
	rc = kvp_seq_create(c, 5, &src, 0, 0, &l);
	if (!rc) {
		CHECK(l.npages == 0, "b: an empty sequence has %u pages", l.npages);
		kvp_seq_free(c, 5);
	} else {
		CHECK(rc == -EINVAL && kvp_last_error(c)[0],
		      "b: seq_create of nothing = %d: %s", rc, kvp_last_error(c));
	}
}

static void case_c_prefix_miss(struct kvp_client *c)
{
	struct kvp_prefix_hit hit;
	uint32_t t[64];
	int rc;

	h_token_ids(t, 64, 11);
	memset(&hit, 0, sizeof(hit));
	rc = kvp_prefix_lookup(c, t, 64, &hit);
	CHECK(rc == 0 && hit.tokens == 0 && hit.npages == 0,
	      "c: prefix lookup on an empty cache = %d, %u tokens, %u pages: %s",
	      rc, (unsigned)hit.tokens, (unsigned)hit.npages, kvp_last_error(c));
}

/* One case as the first operation of a daemon of its own, then the checks. */
static void on_fresh_daemon(void (*run)(struct kvp_client *), const char *name)
{
	struct kvp_client *c;
	struct h_daemon d;

	if (h_daemon_up(&d, "--device_mem=64K", "--host_mem=64K", (char *)NULL)) {
		g_bad++;
		return;
	}
	c = h_connect_or_fail(d.sock, name, 5000);
	if (!c) {
		g_bad++;
		h_daemon_end(&d, 1);
		return;
	}
	run(c);
	check_daemon_fine(&d, c, name);
	kvp_close(c);
	g_bad += h_daemon_stop(&d, 5000) != 0;
	h_daemon_end(&d, 0);
}

int main(int argc, char **argv)
{
	uint64_t t0;

	h_init(argc, argv, "test_empty_first_ops");
	t0 = h_now_ms();
	on_fresh_daemon(case_a_empty_prepare, "a");
	on_fresh_daemon(case_b_empty_seq, "b");
	on_fresh_daemon(case_c_prefix_miss, "c");
	h_log("%s in %llu ms", g_bad ? "FAIL" : "PASS",
	      (unsigned long long)(h_now_ms() - t0));
	return g_bad ? H_FAIL : H_PASS;
}
