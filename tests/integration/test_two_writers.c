/* SPDX-License-Identifier: MIT */
/*
 * test_two_writers - two processes taking turns appending to the same users
 * leave histories with no gap, no overlap and every byte as written.
 *
 * 8 client processes in 4 pairs; each pair shares 500 users. Turn t of a
 * user is written by process A of the pair when t is even and by B when it
 * is odd: a process does its turn for a chunk of 50 users (prepare from
 * start+len, append tokens whose bytes are a function of (user, position),
 * commit, release), then passes that chunk to its partner through a pipe
 * and goes on with its next chunk while the partner continues this one.
 * 8 turns of 1..40 tokens, many crossing page boundaries; some users
 * start mid-stream (start > 0). Pairs 0 and 1 use the synchronous calls,
 * pairs 2 and 3 the asynchronous batch (prepare 25 users, submit, append,
 * commit+release 25, submit).
 *
 * Afterwards a fresh client checks every user: info says start and
 * len == the tokens appended, the read-only page table has the right shape,
 * the bytes read through it are the bytes written, a prepare past the end
 * fails with "missing tokens", one before it with "overlapping tokens", and
 * the pool holds no lease.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PAIRS 4
#define USERS_PER_PAIR 500
#define TURNS 8
#define CHUNK 50 /* users a turn is passed for at once */
#define CHUNKS (USERS_PER_PAIR / CHUNK)
#define BATCH 25
#define SALT 0x7477307772697465ull /* "tw0write" */

static const char *g_sock;

/* Tokens turn t appends to user u: 1..40, with page-sized and
 * page-straddling counts over-represented. */
static uint32_t turn_tokens(uint64_t u, int t)
{
	static const uint32_t special[] = { 1, 15, 16, 17, 31, 32, 33, 40 };
	uint64_t h = h_mix64(u * 131 + (uint64_t)t);
	if (h % 3 == 0)
		return special[(h >> 8) % 8];
	return 1 + (uint32_t)((h >> 16) % 40);
}

/* Where user u's history starts: some users start mid-stream. */
static uint64_t user_start(uint64_t u)
{
	return u % 3 == 0 ? 1000 + u : 0;
}

static uint64_t pos_before_turn(uint64_t u, int t)
{
	uint64_t p = user_start(u);
	for (int i = 0; i < t; i++)
		p += turn_tokens(u, i);
	return p;
}

static uint64_t user_id(int pair, int i)
{
	return 100000ull * (uint64_t)(pair + 1) + (uint64_t)i;
}

struct writer {
	int pair;
	int role;   /* 0: A (even turns), 1: B (odd turns) */
	int fd_in;  /* the partner's "your turn" */
	int fd_out; /* ours to the partner */
	int other[2]; /* the partner's ends: closed so its death is an EOF */
};

/* Wait for the partner's "turn t of chunk k is done" (in the order the
 * partner writes them, which is the order we need them). */
static int wait_turn(int fd, int t, int k)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int n = poll(&p, 1, 60000);
	if (n <= 0) {
		h_fail("partner did not pass turn %d of chunk %d within 60 s", t, k);
		return -1;
	}
	int32_t msg;
	if (read(fd, &msg, sizeof(msg)) != (ssize_t)sizeof(msg)) {
		h_fail("partner hung up instead of passing turn %d of chunk %d",
		       t, k);
		return -1;
	}
	if (msg != t * CHUNKS + k) {
		h_fail("partner passed turn %d of chunk %d, expected turn %d of"
		       " chunk %d", msg / CHUNKS, msg % CHUNKS, t, k);
		return -1;
	}
	return 0;
}

static int pass_turn(int fd, int t, int k)
{
	int32_t msg = t * CHUNKS + k;
	return write(fd, &msg, sizeof(msg)) == (ssize_t)sizeof(msg) ? 0 : -1;
}

static int turn_sync(struct kvp_client *c, int pair, int t, int k)
{
	for (int i = k * CHUNK; i < (k + 1) * CHUNK; i++) {
		uint64_t u = user_id(pair, i);
		/* The partner's commit must be visible: the history ends where
		 * the previous turn left it. */
		if (h_append_cycle(c, SALT, u, pos_before_turn(u, t),
				   turn_tokens(u, t), 0))
			return -1;
	}
	return 0;
}

static int turn_async(struct kvp_client *c, int pair, int t, int k)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	struct kvp_completion comp[BATCH];
	uint8_t *kv = malloc(40 * l->token_bytes);
	if (!kv)
		return -1;
	int ret = -1;
	for (int b = k * CHUNK; b < (k + 1) * CHUNK; b += BATCH) {
		int nb = (k + 1) * CHUNK - b < BATCH ? (k + 1) * CHUNK - b : BATCH;
		for (int i = 0; i < nb; i++) {
			uint64_t u = user_id(pair, b + i);
			int rc = kvp_queue_prepare(c, u, pos_before_turn(u, t),
						   turn_tokens(u, t), u);
			if (rc < 0) {
				h_fail("queue prepare user %" PRIu64 ": %d (%s)", u,
				       rc, kvp_last_error(c));
				goto out;
			}
		}
		int rc = kvp_submit(c);
		if (rc != nb) {
			h_fail("submit of %d prepares returned %d (%s)", nb, rc,
			       kvp_last_error(c));
			goto out;
		}
		int got = 0;
		uint64_t leases[BATCH];
		while (got < nb) {
			int n = kvp_reap(c, comp + got, (uint32_t)(nb - got), 1);
			if (n <= 0) {
				h_fail("reap: %d (%s)", n, kvp_last_error(c));
				goto out;
			}
			got += n;
		}
		/* Leases point into the arena until the next submit: append
		 * every one of them before queueing the commits. */
		for (int i = 0; i < nb; i++) {
			struct kvp_completion *cp = &comp[i];
			uint64_t u = cp->tag;
			if (cp->op != KVP_ASYNC_PREPARE || cp->res < 0) {
				h_fail("async prepare user %" PRIu64 " turn %d: op %u"
				       " res %d (%s)", u, t, cp->op, cp->res,
				       cp->error ? cp->error : "");
				goto out;
			}
			uint32_t n = turn_tokens(u, t);
			uint64_t pos = pos_before_turn(u, t);
			if (cp->lease.user != u || cp->lease.n_new != n ||
			    cp->lease.start + cp->lease.len != pos) {
				h_fail("async lease for user %" PRIu64 ": user %" PRIu64
				       " start %" PRIu64 " len %" PRIu64 " n_new %u;"
				       " expected end %" PRIu64 " n_new %u", u,
				       cp->lease.user, cp->lease.start,
				       cp->lease.len, cp->lease.n_new, pos, n);
				goto out;
			}
			h_tokens_fill(l, SALT, u, pos, n, kv);
			rc = kvp_append(c, &cp->lease, 0, n, kv);
			if (rc < 0) {
				h_fail("append user %" PRIu64 ": %d (%s)", u, rc,
				       kvp_last_error(c));
				goto out;
			}
			leases[i] = cp->lease.id;
		}
		for (int i = 0; i < nb; i++) {
			uint64_t u = comp[i].tag;
			rc = kvp_queue_commit(c, leases[i], turn_tokens(u, t), 1, u);
			if (rc < 0) {
				h_fail("queue commit: %d (%s)", rc, kvp_last_error(c));
				goto out;
			}
		}
		rc = kvp_submit(c);
		if (rc != nb) {
			h_fail("submit of %d commits returned %d", nb, rc);
			goto out;
		}
		got = 0;
		while (got < nb) {
			int n = kvp_reap(c, comp + got, (uint32_t)(nb - got), 1);
			if (n <= 0) {
				h_fail("reap commits: %d (%s)", n, kvp_last_error(c));
				goto out;
			}
			got += n;
		}
		for (int i = 0; i < nb; i++) {
			if (comp[i].op != KVP_ASYNC_COMMIT || comp[i].res < 0) {
				h_fail("async commit+release user %" PRIu64 ": op %u"
				       " res %d (%s)", comp[i].tag, comp[i].op,
				       comp[i].res, comp[i].error ? comp[i].error : "");
				goto out;
			}
		}
	}
	ret = 0;
out:
	free(kv);
	return ret;
}

static int writer_main(void *arg)
{
	struct writer *w = arg;
	char name[32];
	snprintf(name, sizeof(name), "writer-%d%c", w->pair, w->role ? 'B' : 'A');
	h_set_name(name);
	close(w->other[0]);
	close(w->other[1]);
	struct kvp_client *c = h_connect_or_fail(g_sock, name, 10000);
	if (!c)
		return H_FAIL;
	int result = H_FAIL;
	int rc;
	int async = w->pair >= 2;
	/* Turn t of chunk k waits only for turn t - 1 of chunk k, so both
	 * processes of the pair run at once, on different chunks. */
	for (int t = 0; t < TURNS; t++) {
		if (t % 2 != w->role)
			continue;
		for (int k = 0; k < CHUNKS; k++) {
			if (t > 0 && wait_turn(w->fd_in, t - 1, k))
				goto fail;
			rc = async ? turn_async(c, w->pair, t, k)
				   : turn_sync(c, w->pair, t, k);
			if (rc)
				goto fail;
			if (t + 1 < TURNS && pass_turn(w->fd_out, t, k)) {
				h_fail("cannot pass the turn: partner gone");
				goto fail;
			}
		}
	}
	result = H_PASS;
fail:
	kvp_close(c);
	return result;
}

/* The continuity check refuses a gap and an overlap, and changes nothing. */
static int check_continuity(struct kvp_client *c, uint64_t u, uint64_t start,
			    uint64_t len)
{
	struct kvp_lease ls;
	uint64_t end = start + len;
	char want[128];
	int rc = kvp_prepare(c, u, end + 5, 1, &ls);
	/* seed 002's sentence, verbatim, first */
	snprintf(want, sizeof(want), "The input sequence has missing tokens from "
		 "%" PRIu64 " to %" PRIu64 " (both inclusive). ", end, end + 4);
	if (rc != -EINVAL || strncmp(kvp_last_error(c), want, strlen(want))) {
		h_fail("user %" PRIu64 ": prepare with a gap returned %d (%s);"
		       " expected -EINVAL with \"%s\"", u, rc, kvp_last_error(c),
		       want);
		if (rc >= 0)
			kvp_release(c, ls.id);
		return -1;
	}
	/* The overlap is where input and cache intersect (the seed's rule):
	 * 10 tokens from end - 3 overlap end - 3 .. end - 1. */
	rc = kvp_prepare(c, u, end - 3, 10, &ls);
	snprintf(want, sizeof(want), "The input sequence has overlapping tokens "
		 "from %" PRIu64 " to %" PRIu64 " (both inclusive). ", end - 3,
		 end - 1);
	if (rc != -EINVAL || strncmp(kvp_last_error(c), want, strlen(want))) {
		h_fail("user %" PRIu64 ": prepare with an overlap returned %d (%s);"
		       " expected -EINVAL with \"%s\"", u, rc, kvp_last_error(c),
		       want);
		if (rc >= 0)
			kvp_release(c, ls.id);
		return -1;
	}
	struct kvp_user_info ui;
	rc = kvp_info(c, u, &ui);
	if (rc < 0 || ui.start != start || ui.len != len) {
		h_fail("user %" PRIu64 ": refused prepares changed the history:"
		       " start %" PRIu64 " len %" PRIu64, u, ui.start, ui.len);
		return -1;
	}
	return 0;
}

/* One run against a daemon with `workers` worker threads. */
static int run(int workers)
{
	char wflag[32];
	snprintf(wflag, sizeof(wflag), "--workers=%d", workers);
	h_log("---- kvpoold with %d worker thread(s)", workers);
	uint64_t t0 = h_now_ms();
	struct h_daemon d;
	/* 2000 users of at most 320 tokens (21 pages of 4 KiB): 164 MiB
	 * at worst; give the device tier room so nothing is evicted. */
	if (h_daemon_up(&d, "--device_mem=256M", wflag, "--host_mem=16777216",
			(char *)NULL))
		return H_FAIL;
	g_sock = d.sock;

	int fail = 0;
	pid_t pids[2 * PAIRS];
	struct writer w[2 * PAIRS];
	for (int p = 0; p < PAIRS; p++) {
		int a2b[2], b2a[2];
		if (pipe(a2b) || pipe(b2a)) {
			h_fail("pipe");
			return H_FAIL;
		}
		w[2 * p] = (struct writer){ p, 0, b2a[0], a2b[1],
					    { a2b[0], b2a[1] } };
		w[2 * p + 1] = (struct writer){ p, 1, a2b[0], b2a[1],
						{ b2a[0], a2b[1] } };
		pids[2 * p] = h_fork(writer_main, &w[2 * p]);
		pids[2 * p + 1] = h_fork(writer_main, &w[2 * p + 1]);
		/* The parent keeps no end: a dead partner shows as EOF. */
		close(a2b[0]);
		close(a2b[1]);
		close(b2a[0]);
		close(b2a[1]);
	}
	int bad = h_wait_all(pids, 2 * PAIRS, 150000);
	if (bad) {
		h_fail("%d of %d writer processes failed", bad, 2 * PAIRS);
		fail = 1;
	}
	uint64_t t_write = h_now_ms();

	struct kvp_client *c = h_connect_or_fail(d.sock, "checker", 5000);
	if (!c) {
		h_daemon_kill(&d);
		return H_FAIL;
	}
	int rc;
	uint64_t total = 0;
	int bad_users = 0;
	for (int p = 0; p < PAIRS && !fail; p++) {
		for (int i = 0; i < USERS_PER_PAIR; i++) {
			uint64_t u = user_id(p, i);
			uint64_t len = pos_before_turn(u, TURNS) - user_start(u);
			total += len;
			if (h_verify_user(c, SALT, u, user_start(u), len, NULL)) {
				if (++bad_users >= 10)
					break;
				continue;
			}
			if (i % 50 == 0 &&
			    check_continuity(c, u, user_start(u), len))
				bad_users++;
		}
	}
	if (bad_users) {
		h_fail("%d users did not read back as written", bad_users);
		fail = 1;
	}
	struct kvp_stats st;
	rc = kvp_stats(c, 0, &st);
	if (rc < 0) {
		h_fail("stats: %d (%s)", rc, kvp_last_error(c));
		fail = 1;
	} else if (!fail) {
		if (st.leases != 0) {
			h_fail("%" PRIu64 " leases outstanding after every writer"
			       " released and exited", st.leases);
			fail = 1;
		}
		if (st.users != PAIRS * USERS_PER_PAIR) {
			h_fail("stats count %" PRIu64 " users, expected %d",
			       st.users, PAIRS * USERS_PER_PAIR);
			fail = 1;
		}
		if (st.committed_tokens != total) {
			h_fail("stats count %" PRIu64 " committed tokens, expected %"
			       PRIu64, st.committed_tokens, total);
			fail = 1;
		}
		if (st.evicted_users || st.demoted_users) {
			h_fail("the pool evicted %" PRIu64 " / demoted %" PRIu64
			       " users although everything fits", st.evicted_users,
			       st.demoted_users);
			fail = 1;
		}
	}
	kvp_close(c);
	if (h_daemon_stop(&d, 10000))
		fail = 1;
	h_log("%s: %d users, %" PRIu64 " tokens; writing %" PRIu64 " ms,"
	      " checking %" PRIu64 " ms", fail ? "FAIL" : "PASS",
	      PAIRS * USERS_PER_PAIR, total, t_write - t0, h_now_ms() - t_write);
	return h_daemon_end(&d, fail);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_two_writers");
	return h_run_with_1_then_2_workers(run);
}
