/* SPDX-License-Identifier: MIT */
/*
 * test_remote_hostile.c - the Redis Cluster client (daemon/remote/
 * redis_cluster.c) against store nodes that attack it: two fake nodes on
 * loopback, forked by the test, that speak just enough RESP (CLUSTER SLOTS:
 * the first owns slots 0-8191, the second 8192-16383); the second answers
 * every GET with a small value, the first with the attack of the test:
 *
 *  - a bulk of a valid length whose bytes trickle in, one every 100 ms;
 *  - "$65536" then a trickle (issue 25's node);
 *  - a header line that trickles in, one digit every 100 ms;
 *  - a 4 GiB bulk, then bytes streamed as fast as the socket takes them;
 *  - an array of 2147483647 elements, then 100k of them;
 *  - that array as its CLUSTER SLOTS answer (the second node then gives
 *    the map).
 *
 * Each batch must end within the timeout (and some slack; a reply past the
 * limits at once), the test's peak RSS must not grow past 100 MB, the
 * hostile node's keys come back RC_DOWN and the node is marked down and
 * counted (a timeout or a bad reply), while the good node's keys still
 * hit, in the same batch; the next batch does not wait on the node.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "redis_cluster.h"

#define TIMEOUT_MS 300
#define SLACK_MS 700          /* a loaded 2-core CI machine */
#define NKEYS 64
#define VALUE "hello"

enum attack {
	A_TRICKLE_VALUE,  /* "$100\r\n", then one byte each 100 ms */
	A_TRICKLE_64K,    /* "$65536\r\n", then one byte each 100 ms */
	A_TRICKLE_HEADER, /* "$", then one digit each 100 ms */
	A_HUGE_BULK,      /* "$4294967296\r\n", then bytes as fast as they go */
	A_HUGE_ARRAY,     /* "*2147483647\r\n", then 100k ":1\r\n" */
	A_SLOTS,          /* the map itself: CLUSTER SLOTS gets A_HUGE_ARRAY */
};

struct fake {
	int fd;
	int port;
	pid_t pid;
};

static struct fake g_node[2];

static int listen_any(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 16), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* Write all of p; false: the client went away. */
static bool put(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w <= 0)
			return false;
		p = (const char *)p + w;
		n -= (size_t)w;
	}
	return true;
}

/* One byte each 100 ms, for at most 10 s: far past any timeout. */
static void trickle(int fd, const char *bytes)
{
	for (int i = 0; i < 100; i++) {
		if (!put(fd, &bytes[i % strlen(bytes)], 1))
			return;
		usleep(100000);
	}
}

static void attack(int fd, enum attack a)
{
	static char junk[1 << 16];

	switch (a) {
	case A_TRICKLE_VALUE:
		if (put(fd, "$100\r\n", 6))
			trickle(fd, "x");
		break;
	case A_TRICKLE_64K:
		if (put(fd, "$65536\r\n", 8))
			trickle(fd, "x");
		break;
	case A_TRICKLE_HEADER:
		trickle(fd, "$1111111111111111");
		break;
	case A_HUGE_BULK:
		memset(junk, 'x', sizeof(junk));
		if (!put(fd, "$4294967296\r\n", 13))
			break;
		/* 1.5 GiB at most, until the client closes. */
		for (int i = 0; i < 24576 && put(fd, junk, sizeof(junk)); i++)
			;
		break;
	case A_HUGE_ARRAY:
	case A_SLOTS:
		if (!put(fd, "*2147483647\r\n", 13))
			break;
		for (int i = 0; i < 100000 && put(fd, ":1\r\n", 4); i++)
			;
		break;
	}
}

/* The map: node 0 slots 0-8191, node 1 the rest, both on 127.0.0.1. */
static void answer_slots(int fd)
{
	char map[256];
	int n = snprintf(map, sizeof(map),
			 "*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
			 "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
			 g_node[0].port, g_node[1].port);

	put(fd, map, (size_t)n);
}

/* A fake node: one connection at a time; each read that holds commands
 * is answered: CLUSTER SLOTS with the map, each GET with the attack
 * (hostile) or a value (good). */
static void node_serve(int lfd, bool hostile, enum attack a)
{
	static char buf[1 << 16];

	signal(SIGPIPE, SIG_IGN);
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		ssize_t n;

		if (fd < 0)
			continue;
		while ((n = recv(fd, buf, sizeof(buf) - 1, 0)) > 0) {
			const char *p = buf;
			bool gone = false;

			buf[n] = '\0';
			if (memmem(buf, (size_t)n, "SLOTS", 5)) {
				if (hostile && a == A_SLOTS) {
					attack(fd, a);
					break;
				}
				answer_slots(fd);
				continue;
			}
			/* One answer per GET in the read (pipelined). */
			while (!gone && (p = memmem(p, (size_t)(buf + n - p), "GET", 3))) {
				p += 3;
				if (hostile) {
					attack(fd, a);
					gone = true;
				} else {
					gone = !put(fd, "$5\r\n" VALUE "\r\n", 11);
				}
			}
			if (gone && hostile)
				break;
		}
		close(fd);
	}
}

static void nodes_start(enum attack a)
{
	for (int k = 0; k < 2; k++)
		g_node[k].fd = listen_any(&g_node[k].port);
	for (int k = 0; k < 2; k++) {
		g_node[k].pid = fork();
		assert_true(g_node[k].pid >= 0);
		if (!g_node[k].pid) {
			close(g_node[!k].fd);
			node_serve(g_node[k].fd, k == 0, a);
			_exit(0);
		}
	}
	for (int k = 0; k < 2; k++)
		close(g_node[k].fd);
}

static int nodes_stop(void **state)
{
	(void)state;
	for (int k = 0; k < 2; k++) {
		if (g_node[k].pid > 0) {
			kill(g_node[k].pid, SIGKILL);
			waitpid(g_node[k].pid, NULL, 0);
		}
		g_node[k].pid = 0;
	}
	return 0;
}

/* This process's peak resident set (VmHWM), in bytes. */
static uint64_t peak_rss(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	uint64_t kb = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %" SCNu64, &kb) == 1)
			break;
	fclose(f);
	return kb << 10;
}

static void on_value(void *arg, uint32_t i, char **val, size_t len)
{
	uint32_t *hits = arg;

	(void)i;
	assert_int_equal(len, strlen(VALUE));
	assert_memory_equal(*val, VALUE, len);
	(*hits)++;
}

/* One batch against the attack (limit: the longest value, 0: the
 * default): bounded in time and memory, the hostile node's keys down, the
 * good node's hit, the hostile node marked down and counted once: a
 * timeout, or a bad reply (then at once, not at the timeout). */
static void run_attack(enum attack a, uint64_t limit, bool timeout)
{
	static char keys[NKEYS][32];
	static struct rc_item it[NKEYS];
	struct redis_cluster *rc;
	struct rc_node_stats st;
	uint32_t hits = 0, got, down = 0;
	uint64_t t0, ms, rss0;
	char url[96];
	struct errbuf e;

	nodes_start(a);
	snprintf(url, sizeof(url), "redis-cluster://127.0.0.1:%d", g_node[1].port);
	assert_int_equal(redis_cluster_open(&rc, url, TIMEOUT_MS, &e), 0);
	assert_int_equal(redis_cluster_mapped_slots(rc), RC_SLOTS);
	if (limit)
		redis_cluster_limit_values(rc, limit);
	for (int i = 0; i < NKEYS; i++) {
		snprintf(keys[i], sizeof(keys[i]), "hostile-key-%d", i);
		it[i] = (struct rc_item){ .key = keys[i], .klen = strlen(keys[i]) };
	}
	rss0 = peak_rss();
	t0 = mono_ns();
	got = redis_cluster_get(rc, it, NKEYS, on_value, &hits);
	ms = (mono_ns() - t0) / 1000000;
	if (ms > TIMEOUT_MS + SLACK_MS)
		fail_msg("attack %d held the batch %" PRIu64 " ms (timeout %d ms)",
			 a, ms, TIMEOUT_MS);
	if (peak_rss() - rss0 > (100ull << 20))
		fail_msg("attack %d grew the client by %" PRIu64 " MB", a,
			 (peak_rss() - rss0) >> 20);
	if (!timeout && ms >= TIMEOUT_MS)
		fail_msg("attack %d: a reply past the limits refused after %" PRIu64
			 " ms, not at its header", a, ms);
	for (int i = 0; i < NKEYS; i++) {
		bool hostile = redis_cluster_slot(keys[i], strlen(keys[i])) < 8192;

		assert_int_equal(it[i].status, hostile ? RC_DOWN : RC_HIT);
		down += hostile;
	}
	assert_true(down > 0 && down < NKEYS);
	assert_int_equal(got, NKEYS - down);
	assert_int_equal(hits, got);
	/* The hostile node is down for a while: the next batch does not wait. */
	for (uint32_t k = 0; k < redis_cluster_nodes(rc); k++) {
		redis_cluster_node_stats(rc, k, &st);
		if (atoi(strrchr(st.addr, ':') + 1) == g_node[0].port) {
			assert_false(st.up);
			assert_int_equal(st.timeouts, timeout);
			assert_int_equal(st.bad_replies, !timeout);
			assert_int_equal(st.errors, down);
		} else {
			assert_true(st.up);
			assert_int_equal(st.timeouts + st.bad_replies + st.errors, 0);
		}
	}
	t0 = mono_ns();
	got = redis_cluster_get(rc, it, NKEYS, on_value, &hits);
	assert_true(mono_ns() - t0 < 100000000ull);
	assert_int_equal(got, NKEYS - down);
	redis_cluster_close(rc);
}

static void test_trickled_value_ends_at_the_timeout(void **state)
{
	(void)state;
	run_attack(A_TRICKLE_VALUE, 0, true);
}

static void test_trickled_64k_value_ends_at_the_timeout(void **state)
{
	(void)state;
	run_attack(A_TRICKLE_64K, 0, true);
}

/* The same node where the longest valid value is 16 KiB: refused at once. */
static void test_64k_value_past_the_limit_is_refused_at_its_header(void **state)
{
	(void)state;
	run_attack(A_TRICKLE_64K, 16384, false);
}

static void test_trickled_header_ends_at_the_timeout(void **state)
{
	(void)state;
	run_attack(A_TRICKLE_HEADER, 0, true);
}

static void test_4gib_bulk_is_refused_at_its_header(void **state)
{
	(void)state;
	run_attack(A_HUGE_BULK, 0, false);
}

static void test_2g_element_array_is_refused_at_its_header(void **state)
{
	(void)state;
	run_attack(A_HUGE_ARRAY, 0, false);
}

/* A seed that answers CLUSTER SLOTS with a 2G-element array: refused at
 * its header, counted, and the map read from the next seed at once. */
static void test_hostile_map_is_refused_and_the_next_seed_read(void **state)
{
	struct redis_cluster *rc;
	struct rc_node_stats st;
	struct errbuf e;
	char url[96];
	uint64_t t0, rss0;

	(void)state;
	nodes_start(A_SLOTS);
	snprintf(url, sizeof(url), "redis-cluster://127.0.0.1:%d,127.0.0.1:%d",
		 g_node[0].port, g_node[1].port);
	rss0 = peak_rss();
	t0 = mono_ns();
	assert_int_equal(redis_cluster_open(&rc, url, TIMEOUT_MS, &e), 0);
	assert_true(mono_ns() - t0 < TIMEOUT_MS * 1000000ull);
	assert_true(peak_rss() - rss0 < (100ull << 20));
	assert_int_equal(redis_cluster_mapped_slots(rc), RC_SLOTS);
	redis_cluster_node_stats(rc, 0, &st);
	assert_int_equal(atoi(strrchr(st.addr, ':') + 1), g_node[0].port);
	assert_false(st.up);
	assert_int_equal(st.bad_replies, 1);
	assert_int_equal(st.timeouts, 0);
	redis_cluster_node_stats(rc, 1, &st);
	assert_true(st.up);
	assert_int_equal(st.bad_replies + st.timeouts, 0);
	redis_cluster_close(rc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_trickled_value_ends_at_the_timeout, nodes_stop),
		cmocka_unit_test_teardown(test_trickled_64k_value_ends_at_the_timeout, nodes_stop),
		cmocka_unit_test_teardown(test_64k_value_past_the_limit_is_refused_at_its_header,
					  nodes_stop),
		cmocka_unit_test_teardown(test_trickled_header_ends_at_the_timeout, nodes_stop),
		cmocka_unit_test_teardown(test_4gib_bulk_is_refused_at_its_header, nodes_stop),
		cmocka_unit_test_teardown(test_2g_element_array_is_refused_at_its_header, nodes_stop),
		cmocka_unit_test_teardown(test_hostile_map_is_refused_and_the_next_seed_read,
					  nodes_stop),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
