/* SPDX-License-Identifier: MIT */
/*
 * test_fork_client - a client inherited across fork() (issue 25, item 5),
 * against a real kvpoold:
 *
 *   a. the parent prepares a lease and appends half of it, then forks; in
 *      the child every call through the inherited client (info, prepare,
 *      append, commit and release of the parent's lease, the async queue,
 *      submit, reap, a call with input in the arena, a seal) fails with
 *      -ECHILD and a message naming fork() and kvp_connect(); the shared
 *      ring indices and the tenant's counters do not move; the child's own
 *      client works; kvp_close() of the inherited one harms nothing. The
 *      parent then appends the rest, commits and reads back every byte:
 *      the child's garbage landed nowhere and the rings are intact;
 *   b. a child that merely holds a copy of the socket does not keep the
 *      parent's attach alive: once the parent closes its client, the
 *      daemon releases its lease at once while the child still runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"

#define SALT 0xf0f0ull
#define GARBAGE 0xdeadull
#define USER 7u
#define OTHER 8u
#define CHILD_USER 9u
#define N 8u

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

static unsigned char g_buf[N * 4096];

struct ring_snap {
	uint32_t sq_head, sq_tail, cq_head, cq_tail;
};

static void snap(const struct kvp_client *c, struct ring_snap *s)
{
	for (uint32_t k = 0; k < c->nlanes && k < 16; k++) {
		const struct kvp_ring_ctl *ctl = c->lanes[k].ctl;

		s[k].sq_head = __atomic_load_n(&ctl->sq_head, __ATOMIC_ACQUIRE);
		s[k].sq_tail = __atomic_load_n(&ctl->sq_tail, __ATOMIC_ACQUIRE);
		s[k].cq_head = __atomic_load_n(&ctl->cq_head, __ATOMIC_ACQUIRE);
		s[k].cq_tail = __atomic_load_n(&ctl->cq_tail, __ATOMIC_ACQUIRE);
	}
}

/* ret is -ECHILD and the message says what happened and what to do. */
static void expect_echild(struct kvp_client *c, int ret, const char *what)
{
	const char *msg = kvp_last_error(c);

	CHECK(ret == -ECHILD, "child: %s through the inherited client returned %d "
	      "(%s), expected -ECHILD", what, ret, msg);
	CHECK(strstr(msg, "fork()") && strstr(msg, "kvp_connect()"),
	      "child: %s: the message does not name fork() and kvp_connect(): %s",
	      what, msg);
}

/* Everything the child tries through the parent's client; its exit status
 * is the number of failed checks. */
static int child_main(struct kvp_client *a, const struct kvp_lease *l,
		      const char *sock, const struct kvp_stats *s0)
{
	const struct kvp_layout *lay = kvp_client_layout(a);
	struct ring_snap before[16], after[16];
	struct kvp_completion cq[4];
	struct kvp_user_info in;
	struct kvp_chunk_reg reg;
	struct kvp_lease l2;
	struct kvp_client *own;
	struct kvp_stats s1;
	uint32_t tok[4] = { 1, 2, 3, 4 };

	h_set_name("child");
	snap(a, before);
	h_tokens_fill(lay, GARBAGE, USER, N / 2, N / 2, g_buf);
	expect_echild(a, kvp_info(a, USER, &in), "kvp_info");
	expect_echild(a, kvp_prepare(a, OTHER, 0, 4, &l2), "kvp_prepare");
	expect_echild(a, kvp_append(a, l, N / 2, N / 2, g_buf), "kvp_append");
	expect_echild(a, kvp_append_async(a, l, 0, N / 2, g_buf, NULL),
		      "kvp_append_async");
	expect_echild(a, kvp_commit(a, l->id, N), "kvp_commit");
	expect_echild(a, kvp_release(a, l->id), "kvp_release");
	expect_echild(a, kvp_queue_info(a, USER, 1), "kvp_queue_info");
	expect_echild(a, kvp_queue_commit(a, l->id, N, 1, 2), "kvp_queue_commit");
	expect_echild(a, kvp_queue_release(a, l->id, 3), "kvp_queue_release");
	expect_echild(a, kvp_submit(a), "kvp_submit");
	expect_echild(a, kvp_reap(a, cq, 4, 0), "kvp_reap");
	expect_echild(a, kvp_seq_alloc(a, 99, tok, 4, &l2), "kvp_seq_alloc");
	memset(&reg, 0, sizeof(reg));
	reg.created = 1;
	reg.lease = *l;
	expect_echild(a, kvp_chunk_seal(a, &reg), "kvp_chunk_seal");
	snap(a, after);
	for (uint32_t k = 0; k < a->nlanes && k < 16; k++)
		CHECK(!memcmp(&before[k], &after[k], sizeof(before[k])),
		      "child: lane %u's shared ring indices moved (sq %u/%u -> %u/%u, "
		      "cq %u/%u -> %u/%u)", k, before[k].sq_head, before[k].sq_tail,
		      after[k].sq_head, after[k].sq_tail, before[k].cq_head,
		      before[k].cq_tail, after[k].cq_head, after[k].cq_tail);

	/* Its own client is fine, and closing the inherited one is too. */
	own = h_connect_or_fail(sock, "child-own", 5000);
	if (!own)
		return ++g_bad;
	/* Nothing the child tried reached the daemon. */
	CHECK(kvp_stats(own, 0, &s1) == 0, "child: stats: %s", kvp_last_error(own));
	CHECK(s1.prepares == s0->prepares && s1.commits == s0->commits &&
	      s1.releases == s0->releases && s1.leases == s0->leases,
	      "child: the tenant's counters moved: prepares %" PRIu64 " -> %" PRIu64
	      ", commits %" PRIu64 " -> %" PRIu64 ", releases %" PRIu64 " -> %"
	      PRIu64 ", leases %" PRIu64 " -> %" PRIu64, s0->prepares, s1.prepares,
	      s0->commits, s1.commits, s0->releases, s1.releases, s0->leases,
	      s1.leases);
	CHECK(h_append_cycle(own, SALT, CHILD_USER, 0, 4, 0) == 0,
	      "child: a cycle through its own client failed");
	kvp_close(own);
	kvp_close(a);
	return g_bad;
}

static int wait_child(pid_t pid)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void case_a_child_uses_parent_client(const char *sock)
{
	struct kvp_client *a = h_connect_or_fail(sock, "parent", 5000);
	const struct kvp_layout *lay;
	struct kvp_stats s0;
	struct kvp_lease l;
	int ret, st;
	pid_t pid;

	if (!a) {
		g_bad++;
		return;
	}
	lay = kvp_client_layout(a);
	ret = kvp_prepare(a, USER, 0, N, &l);
	CHECK(ret == 0, "prepare: %d %s", ret, kvp_last_error(a));
	if (ret) {
		kvp_close(a);
		return;
	}
	h_tokens_fill(lay, SALT, USER, 0, N / 2, g_buf);
	CHECK(kvp_append(a, &l, 0, N / 2, g_buf) == 0, "append: %s", kvp_last_error(a));
	CHECK(kvp_stats(a, 0, &s0) == 0, "stats: %s", kvp_last_error(a));
	fflush(NULL);
	pid = fork();
	if (pid == 0)
		_exit(child_main(a, &l, sock, &s0) ? 1 : 0);
	CHECK(pid > 0, "fork: %s", strerror(errno));
	st = pid > 0 ? wait_child(pid) : -1;
	CHECK(st == 0, "the child's checks failed (exit %d)", st);

	/* The parent goes on. */
	h_tokens_fill(lay, SALT, USER, N / 2, N / 2, g_buf);
	ret = kvp_append(a, &l, N / 2, N / 2, g_buf);
	CHECK(ret == 0, "parent: append after the fork: %d %s", ret, kvp_last_error(a));
	ret = kvp_commit(a, l.id, N);
	CHECK(ret >= 0, "parent: commit after the fork: %d %s", ret, kvp_last_error(a));
	ret = kvp_release(a, l.id);
	CHECK(ret >= 0, "parent: release after the fork: %d %s", ret, kvp_last_error(a));
	CHECK(h_verify_user(a, SALT, USER, 0, N, NULL) == 0,
	      "parent: user %u's bytes are not the parent's", USER);
	CHECK(h_verify_user(a, SALT, CHILD_USER, 0, 4, NULL) == 0,
	      "the child's own history is wrong");
	CHECK(h_append_cycle(a, SALT, OTHER, 0, 4, 0) == 0,
	      "parent: a fresh cycle after the fork failed");
	kvp_close(a);
}

/* The parent closes; a child holding a copy of the socket must not keep
 * the attach (and the lease) alive. */
static void case_b_close_with_child_alive(const char *sock)
{
	struct kvp_client *a = h_connect_or_fail(sock, "closer", 5000);
	struct kvp_client *w = h_connect_or_fail(sock, "watcher", 5000);
	struct kvp_user_info in;
	struct kvp_lease l;
	uint64_t deadline;
	int p[2], ret, leased = 1;
	pid_t pid;

	if (!a || !w || pipe(p)) {
		g_bad++;
		kvp_close(a);
		kvp_close(w);
		return;
	}
	ret = kvp_prepare(a, OTHER + 100, 0, 4, &l);
	CHECK(ret == 0, "prepare: %s", kvp_last_error(a));
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		char ch;

		close(p[1]);
		(void)!read(p[0], &ch, 1); /* hold the inherited socket until told */
		_exit(0);
	}
	close(p[0]);
	kvp_close(a);
	deadline = h_now_ms() + 3000;
	while (h_now_ms() < deadline) {
		ret = kvp_info(w, OTHER + 100, &in);
		if (ret == 0 && !in.leases) {
			leased = 0;
			break;
		}
		h_sleep_ms(10);
	}
	CHECK(!leased, "the closed client's lease is still held while a forked "
	      "child keeps a copy of its socket");
	close(p[1]);
	CHECK(pid > 0 && wait_child(pid) == 0, "the holding child failed");
	kvp_close(w);
}

int main(int argc, char **argv)
{
	struct h_daemon d;
	uint64_t t0;

	h_init(argc, argv, "test_fork_client");
	t0 = h_now_ms();
	if (h_daemon_up(&d, "--device_mem=1M", (char *)NULL))
		return H_FAIL;
	case_a_child_uses_parent_client(d.sock);
	case_b_close_with_child_alive(d.sock);
	return h_daemon_finish(&d, g_bad, t0);
}
