/* SPDX-License-Identifier: MIT */
/*
 * fuzz_cluster_reply - what Redis Cluster nodes answer, through hiredis's
 * reader into the remote tier's cluster client (daemon/remote/
 * redis_cluster.c): the CLUSTER SLOTS reply (map_read), the replies to a
 * pipelined batch of GETs, SETs and a DEL (reply_one; MOVED and ASK
 * redirects, which dial the nodes they name), and DBSIZE.
 *
 * No network: this program defines redisConnectWithTimeout(), so the
 * cluster client's dials (seeds, the nodes a map or a redirect names) get
 * a loopback TCP connection whose peer has already written the next
 * segment of the input: a node that stops short is waited for until the
 * batch's deadline (TIMEOUT_MS), as a silent one is. A segment that starts
 * with "#fin\n" also closes its side after its bytes (EOF). Segments are
 * separated by "\n#node\n"; the first answers the first seed. LLVMFuzzerInitialize checks a valid map lands,
 * so a cluster client that stops dialling through redisConnectWithTimeout
 * fails here loudly instead of fuzzing nothing. FUZZ_TRACE=1 prints the
 * map's size and each item's status (what a reproducer did).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "fuzz.h"
#include "redis_cluster.h"

#define SEP "\n#node\n"
#define FIN "#fin\n"
#define TIMEOUT_MS 5 /* what a node that stops short costs a round */
#define MAX_CONNS 1024
#define NKEYS 16

static int lfd = -1;
static struct sockaddr_in laddr;
static const uint8_t *in_data;
static size_t in_size, in_off;
static int peers[MAX_CONNS];
static uint32_t npeers;

/* The next segment of the input: [*seg, *seg + *len). */
static bool next_segment(const uint8_t **seg, size_t *len)
{
	const uint8_t *p, *end;

	if (in_off > in_size)
		return false;
	p = in_data + in_off;
	end = memmem(p, in_size - in_off, SEP, strlen(SEP));
	*seg = p;
	*len = end ? (size_t)(end - p) : in_size - in_off;
	in_off += *len + strlen(SEP);
	return true;
}

/* A node that answers with the next segment. */
redisContext *redisConnectWithTimeout(const char *ip, int port, const struct timeval tv)
{
	/* Closed with a reset, not into TIME_WAIT: a thousand connections a
	 * second would use up the loopback's ports within a minute. */
	static const struct linger rst = { .l_onoff = 1, .l_linger = 0 };
	const uint8_t *seg = NULL;
	sigset_t all, old;
	size_t len = 0;
	int cfd, sfd;
	bool fin;

	(void)ip;
	(void)port;
	(void)tv;
	/* libFuzzer's -timeout is a SIGALRM every second: a connect() or an
	 * accept() it interrupts fails with EINTR, which is the harness's
	 * problem, not a finding. Signals wait until the node is set up. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (cfd < 0 || setsockopt(cfd, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst)) ||
	    connect(cfd, (struct sockaddr *)&laddr, sizeof(laddr)) ||
	    (sfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
		perror("fuzz_cluster_reply: loopback connection");
		abort();
	}
	setsockopt(sfd, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst));
	if (npeers == MAX_CONNS) {
		close(sfd); /* past what one input may dial: a node gone */
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return redisConnectFd(cfd);
	}
	peers[npeers++] = sfd;
	/* No segment left: a node that closes at once. */
	fin = !next_segment(&seg, &len);

	/* "#fin\n" first: it closes its side after its bytes. */
	if (len >= strlen(FIN) && !memcmp(seg, FIN, strlen(FIN))) {
		fin = true;
		seg += strlen(FIN);
		len -= strlen(FIN);
	}
	for (size_t off = 0; off < len;) {
		ssize_t n = write(sfd, seg + off, len - off);

		if (n <= 0)
			abort();
		off += (size_t)n;
	}
	if (fin)
		shutdown(sfd, SHUT_WR);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return redisConnectFd(cfd);
}

static uint64_t got_bytes;
static bool trace; /* FUZZ_TRACE=1: the map and each item's status */

static void on_value(void *arg, uint32_t i, char **val, size_t len)
{
	fuzz_assert(i < NKEYS);
	/* Every byte of the value is readable, the NUL after it too. */
	for (size_t b = 0; b < len; b++)
		got_bytes += (uint8_t)(*val)[b];
	fuzz_assert((*val)[len] == '\0');
	/* Taken, as the remote tier takes a page stored as is. */
	if (i & 1) {
		free(*val);
		*val = NULL;
	}
}

static void run(const uint8_t *data, size_t size, uint32_t *mapped)
{
	struct rc_item it[NKEYS], set[5];
	char keys[NKEYS][16], vals[4][8];
	struct redis_cluster *rc;
	struct errbuf e = { .msg = "" };

	in_data = data;
	in_size = size;
	in_off = 0;
	npeers = 0;
	if (redis_cluster_open(&rc, "redis-cluster://127.0.0.1:7000,127.0.0.1:7001",
			       TIMEOUT_MS, &e)) {
		fprintf(stderr, "fuzz_cluster_reply: %s\n", e.msg);
		abort();
	}
	*mapped = redis_cluster_mapped_slots(rc);
	fuzz_assert(*mapped <= RC_SLOTS);
	for (uint32_t i = 0; i < NKEYS; i++) {
		int n = snprintf(keys[i], sizeof(keys[i]), "key%u", i);

		it[i] = (struct rc_item){ .key = keys[i], .klen = (size_t)n };
	}
	redis_cluster_get(rc, it, NKEYS, on_value, NULL);
	for (uint32_t i = 0; i < NKEYS; i++)
		fuzz_assert(it[i].status <= RC_ERROR);
	for (uint32_t i = 0; i < 5; i++) {
		set[i] = (struct rc_item){ .key = keys[i], .klen = strlen(keys[i]) };
		if (i < 4) {
			snprintf(vals[i], sizeof(vals[i]), "v%u", i);
			set[i].val = vals[i];
			set[i].vlen = strlen(vals[i]);
		}
	}
	redis_cluster_set(rc, set, 5);
	if (trace) {
		fprintf(stderr, "fuzz_cluster_reply: %u slots mapped; get:", *mapped);
		for (uint32_t i = 0; i < NKEYS; i++)
			fprintf(stderr, " %u", it[i].status);
		fprintf(stderr, "; set:");
		for (uint32_t i = 0; i < 5; i++)
			fprintf(stderr, " %u", set[i].status);
		fprintf(stderr, "; dbsize %lld\n", (long long)redis_cluster_dbsize(rc));
	}
	redis_cluster_dbsize(rc);
	fuzz_assert(redis_cluster_nodes(rc) <= RC_MAX_NODES);
	for (uint32_t i = 0; i < redis_cluster_nodes(rc); i++) {
		struct rc_node_stats st;

		redis_cluster_node_stats(rc, i, &st);
		fuzz_assert(memchr(st.addr, '\0', sizeof(st.addr)));
		if (trace)
			fprintf(stderr, "fuzz_cluster_reply: node %s: %s, %llu errors, "
				"%llu timeouts, %llu bad replies\n", st.addr,
				st.up ? "up" : "down", (unsigned long long)st.errors,
				(unsigned long long)st.timeouts,
				(unsigned long long)st.bad_replies);
	}
	redis_cluster_close(rc);
	for (uint32_t i = 0; i < npeers; i++)
		close(peers[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const char map[] = "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n"
				  ":7000\r\n";
	socklen_t alen = sizeof(laddr);
	uint32_t mapped;

	signal(SIGPIPE, SIG_IGN);
	trace = getenv("FUZZ_TRACE") != NULL;
	laddr = (struct sockaddr_in){ .sin_family = AF_INET,
				      .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&laddr, sizeof(laddr)) ||
	    listen(lfd, MAX_CONNS) || getsockname(lfd, (struct sockaddr *)&laddr, &alen)) {
		perror("fuzz_cluster_reply: loopback listener");
		abort();
	}
	run((const uint8_t *)map, sizeof(map) - 1, &mapped);
	if (mapped != RC_SLOTS) {
		fprintf(stderr, "fuzz_cluster_reply: a valid CLUSTER SLOTS reply mapped "
			"%u slots, not %u: does daemon/remote/redis_cluster.c still dial "
			"through redisConnectWithTimeout()? Update this harness.\n",
			mapped, RC_SLOTS);
		abort();
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t mapped;

	run(data, size, &mapped);
	return 0;
}
