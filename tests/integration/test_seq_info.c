/* SPDX-License-Identifier: MIT */
/*
 * test_seq_info - seed 004's request manager against a real kvpoold
 * (kvpool.h kvp_seq_info, kvp_seq_pages, kvp_seq_tokens; kvpool.conf
 * prefix_caching, max_seq_tokens, max_seqs):
 *
 *   1. one client makes request 1 (40 tokens), computes and commits 35 of
 *      them; another process reads it back: tokens, computed (35), cached
 *      (0), its page table (the lease's), its token ids, the owner; it then
 *      makes request 2 of the same prompt, finds 32 tokens cached, and its
 *      computed pages (GetComputedBlocks) are request 1's frames, holding
 *      request 1's bytes;
 *   2. the limits: a 65-token request over max_seq_tokens = 64 is -E2BIG, an
 *      extend past it too, a third request over max_seqs = 2 -ENOSPC, each
 *      naming its setting, and nothing is made; an unknown sequence is
 *      -ENOENT;
 *   3. kvpoold's log has seed 004's line for both requests (log_level=debug);
 *      on the ring, SEQ_INFO and SEQ_TOKENS windows at any offset (past the
 *      end: the row alone, no ids), a result range too small for the row,
 *      input given, an unknown sequence: answered or refused, never more
 *      than asked;
 *   4. a kvpoold with prefix_caching = no in kvpool.conf: the same prompt
 *      twice is computed twice (cached 0, lookups find nothing); after the
 *      file says yes and kvp_reload(), the third finds the pages; the file's
 *      max_seqs = 1 refuses a second request until the reload raises it;
 *   5. bad values (--max_seqs=-1, --prefix_caching=maybe, max_seq_tokens
 *      past 2^40 in a tenant section): kvpoold exits 2 naming the key.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

#define SALT 0x5eed004u
#define N 40u

struct shared {
	const char *sock;
	uint32_t owner;
	int32_t frames[3];
};

static uint32_t T[N + 32];

static int request(struct kvp_client *c, uint64_t seq, uint32_t n,
		   struct kvp_lease *l)
{
	int rc = kvp_seq_alloc(c, seq, T, n, l);

	if (rc)
		h_fail("seq_alloc(%" PRIu64 "): %s", seq, kvp_last_error(c));
	return rc;
}

/* Request 2 in another process: request 1 read back, then the same prompt. */
static int reader(void *arg)
{
	const struct shared *sh = arg;
	struct kvp_client *c = h_connect_or_fail(sh->sock, "seq-reader", 5000);
	struct kvp_seq_info si;
	int32_t pages[8] = { 0 };
	uint32_t ids[N + 8], n = 0;
	struct kvp_lease l;
	int rc;

	if (!c)
		return 1;
	rc = kvp_seq_info(c, 1, &si);
	CHECK(rc == 0, "seq_info(1): %d %s", rc, kvp_last_error(c));
	CHECK(si.seq == 1 && si.tokens == 35 && si.computed == 35 && si.cached == 0 &&
	      si.n_new == 0 && si.npages == 3 && si.computed_pages == 2 &&
	      si.published == 2 && si.owner == sh->owner && si.borrowed == 0 &&
	      si.flags == (KVP_SEQ_TOKEN_IDS | KVP_SEQ_CACHING) && si.ntoken_ids == 35,
	      "request 1 read back: tokens %" PRIu64 " computed %" PRIu64 " cached %"
	      PRIu64 " n_new %" PRIu32 " pages %" PRIu32 " computed_pages %" PRIu32
	      " published %" PRIu32 " owner %" PRIu32 " flags %#x ids %" PRIu32,
	      si.tokens, si.computed, si.cached, si.n_new, si.npages,
	      si.computed_pages, si.published, si.owner, si.flags, si.ntoken_ids);
	rc = kvp_seq_pages(c, 1, pages, 8);
	CHECK(rc == 3 && !memcmp(pages, sh->frames, sizeof(sh->frames)),
	      "seq_pages(1): %d, frames %d %d %d, the lease had %d %d %d", rc,
	      pages[0], pages[1], pages[2], sh->frames[0], sh->frames[1],
	      sh->frames[2]);
	rc = kvp_seq_pages(c, 1, pages, 1); /* a short buffer: the count */
	CHECK(rc == 3 && pages[0] == sh->frames[0], "seq_pages(1, max 1): %d", rc);
	rc = kvp_seq_tokens(c, 1, ids, N + 8, &n);
	CHECK(rc == 35 && n == 35 && !memcmp(ids, T, 35 * sizeof(uint32_t)),
	      "seq_tokens(1): %d of %" PRIu32, rc, n);
	if (h_same_bytes(c, pages, SALT, 0, 35, "request 1's pages"))
		g_bad++;

	/* Request 2: the two full computed pages are request 1's. */
	if (request(c, 2, N, &l))
		return 1;
	CHECK(l.len == 32 && l.n_new == 8, "request 2: %" PRIu64 " cached + %"
	      PRIu32, l.len, l.n_new);
	rc = kvp_seq_info(c, 2, &si);
	CHECK(rc == 0 && si.cached == 32 && si.computed == 32 &&
	      si.computed_pages == 2 && si.write_lease == l.id &&
	      si.owner == kvp_client_id(c),
	      "request 2 read back: %d cached %" PRIu64 " computed %" PRIu64, rc,
	      si.cached, si.computed);
	rc = kvp_seq_pages(c, 2, pages, 8);
	CHECK(rc == 3 && pages[0] == sh->frames[0] && pages[1] == sh->frames[1] &&
	      pages[2] == l.indices[2] && pages[2] != sh->frames[2],
	      "request 2's computed pages are not request 1's (%d %d)", pages[0],
	      pages[1]);
	if (h_same_bytes(c, pages, SALT, 0, 32, "request 2's computed pages"))
		g_bad++;
	kvp_release(c, l.id);
	CHECK(kvp_seq_free(c, 2) == 0, "seq_free(2): %s", kvp_last_error(c));
	kvp_close(c);
	return g_bad ? 1 : 0;
}

static void limits(struct kvp_client *c)
{
	struct kvp_seq_info si;
	struct kvp_stats st0, st1;
	struct kvp_lease l, l3;
	int rc;

	kvp_stats(c, 0, &st0);
	rc = kvp_seq_alloc(c, 9, T, 65, &l);
	CHECK(rc == -E2BIG && strstr(kvp_last_error(c), "max_seq_tokens is 64"),
	      "a 65-token request: %d %s", rc, kvp_last_error(c));
	rc = kvp_seq_info(c, 9, &si);
	CHECK(rc == -ENOENT && strstr(kvp_last_error(c), "sequence 9"),
	      "the refused request exists: %d %s", rc, kvp_last_error(c));
	/* Request 1 holds 35: 30 more is 65. */
	rc = kvp_seq_extend(c, 1, 30, NULL, &l);
	CHECK(rc == -E2BIG && strstr(kvp_last_error(c), "max_seq_tokens"),
	      "an extend to 65 tokens: %d %s", rc, kvp_last_error(c));
	if (request(c, 3, 8, &l3))
		return;
	rc = kvp_seq_alloc(c, 4, T, 8, &l);
	CHECK(rc == -ENOSPC && strstr(kvp_last_error(c), "max_seqs is 2"),
	      "a third request: %d %s", rc, kvp_last_error(c));
	kvp_release(c, l3.id);
	kvp_seq_free(c, 3);
	kvp_stats(c, 0, &st1);
	CHECK(st1.seqs == st0.seqs, "sequences %" PRIu64 " then %" PRIu64,
	      st0.seqs, st1.seqs);
}

static struct kvp_cqe raw1(struct h_raw *r, uint8_t op, uint64_t seq,
			   uint64_t at, uint32_t out_len, uint32_t in_len)
{
	struct kvp_sqe e = { .opcode = op, .tag = 1, .arg = seq, .user = at,
			     .out_len = out_len, .in_len = in_len };
	struct kvp_cqe cqe = { .res = -ETIMEDOUT };

	if (h_raw_call(r, &e, &cqe, 1, 5000))
		cqe.res = -ETIMEDOUT;
	return cqe;
}

static void ring(const char *sock, const int32_t frames[3])
{
	const size_t row = sizeof(struct kvp_seq_info);
	struct kvp_seq_info si;
	char err[KVP_ERRLEN];
	struct kvp_cqe q;
	struct h_raw r;
	int32_t f;

	if (h_raw_attach(&r, sock, 0, 0, err, sizeof(err))) {
		CHECK(0, "raw attach: %s", err);
		return;
	}
	q = raw1(&r, KVP_OP_SEQ_INFO, 1, 0, 16, 0);
	CHECK(q.res == -EMSGSIZE, "SEQ_INFO into 16 bytes: %d", q.res);
	q = raw1(&r, KVP_OP_SEQ_INFO, 1, UINT64_MAX, 4096, 0);
	memcpy(&si, r.arena, row);
	CHECK(q.res == 0 && q.out_bytes == row && q.val0 == 3 && si.npages == 3 &&
	      si.computed == 35, "SEQ_INFO from page 2^64-1: %d, %" PRIu32 " bytes",
	      q.res, q.out_bytes);
	q = raw1(&r, KVP_OP_SEQ_INFO, 1, 1, (uint32_t)row + 6, 0);
	memcpy(&f, r.arena + row, 4);
	CHECK(q.res == 0 && q.out_bytes == row + 4 && f == frames[1],
	      "SEQ_INFO from page 1, room for one and a half: %d, %" PRIu32
	      " bytes, frame %d", q.res, q.out_bytes, f);
	q = raw1(&r, KVP_OP_SEQ_TOKENS, 1, 30, 4096, 0);
	CHECK(q.res == 5 && q.out_bytes == 20 && q.val0 == 35 &&
	      !memcmp(r.arena, T + 30, 20), "SEQ_TOKENS from 30: %d", q.res);
	q = raw1(&r, KVP_OP_SEQ_TOKENS, 1, 1ull << 62, 4096, 0);
	CHECK(q.res == 0 && q.out_bytes == 0 && q.val0 == 35,
	      "SEQ_TOKENS from 2^62: %d", q.res);
	q = raw1(&r, KVP_OP_SEQ_TOKENS, 1, 0, 7, 0);
	CHECK(q.res == 1 && q.out_bytes == 4, "SEQ_TOKENS into 7 bytes: %d", q.res);
	q = raw1(&r, KVP_OP_SEQ_INFO, 1, 0, 4096, 8);
	CHECK(q.res < 0, "SEQ_INFO with an input: %d", q.res);
	q = raw1(&r, KVP_OP_SEQ_TOKENS, 12345, 0, 4096, 0);
	CHECK(q.res == -ENOENT, "SEQ_TOKENS of an unknown sequence: %d", q.res);
	h_raw_detach(&r);
}

/* The daemon's log holds line (it is written before the call returns). */
static bool log_has(const struct h_daemon *d, const char *line)
{
	char *buf = NULL;
	size_t len = 0;
	bool found;
	FILE *f = fopen(d->log, "r");

	if (!f)
		return false;
	if (getdelim(&buf, &len, '\0', f) < 0) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	found = buf && strstr(buf, line);
	free(buf);
	return found;
}

static int part_one(void)
{
	struct shared sh;
	struct kvp_client *c;
	struct kvp_lease l;
	struct h_daemon d;
	pid_t pid;
	int rc;

	if (h_daemon_up(&d, "--device_mem=1M", "--host_mem=0", "--log_level=debug",
			"--max_seq_tokens=64", "--max_seqs=2", (char *)NULL))
		return 1;
	c = h_connect_or_fail(d.sock, "seq-writer", 5000);
	if (!c)
		return h_daemon_end(&d, 1);
	if (request(c, 1, N, &l))
		return h_daemon_end(&d, 1);
	CHECK(l.len == 0 && l.n_new == N && l.npages == 3, "request 1's lease");
	if (h_fill_lease(c, &l, SALT, N))
		g_bad++;
	rc = kvp_commit(c, l.id, 35);
	CHECK(rc == 0, "commit 35: %s", kvp_last_error(c));
	kvp_release(c, l.id);
	sh = (struct shared){ .sock = d.sock, .owner = kvp_client_id(c) };
	memcpy(sh.frames, l.indices, sizeof(sh.frames));
	pid = h_fork(reader, &sh);
	rc = pid > 0 ? h_wait(pid, 20000) : -1;
	CHECK(rc == 0, "the reader process: %d", rc);
	limits(c);
	ring(d.sock, sh.frames);
	CHECK(log_has(&d, "kv_cache request=1 prompt_tokens=40 cached_tokens=0 "
		      "new_tokens=40 blocks=3"), "no kv_cache line for request 1");
	CHECK(log_has(&d, "kv_cache request=2 prompt_tokens=40 cached_tokens=32 "
		      "new_tokens=8 blocks=3"), "no kv_cache line for request 2");
	CHECK(kvp_seq_free(c, 1) == 0, "seq_free(1): %s", kvp_last_error(c));
	kvp_close(c);
	return h_daemon_finish(&d, g_bad, h_now_ms());
}

static int write_conf(const char *path, const char *caching, int max_seqs)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fprintf(f, "prefix_caching = %s\nmax_seqs = %d\n", caching, max_seqs);
	return fclose(f);
}

/* seq_put: a request of n tokens of T computed whole; its cached tokens. */
static int64_t put(struct kvp_client *c, uint64_t seq, uint32_t n)
{
	struct kvp_lease l;
	int rc = kvp_seq_alloc(c, seq, T, n, &l);

	if (rc)
		return rc;
	if (h_fill_lease(c, &l, SALT, l.n_new) || kvp_commit(c, l.id, l.n_new))
		g_bad++;
	kvp_release(c, l.id);
	return (int64_t)l.len;
}

static int part_two(void)
{
	struct kvp_prefix_hit hit;
	struct kvp_seq_info si;
	struct kvp_client *c;
	struct h_daemon d;
	char conf[256], flag[300];
	int64_t got;
	int rc;

	if (h_daemon_dir(&d, 0))
		return 1;
	snprintf(conf, sizeof(conf), "%s/kvpool.conf", d.dir);
	snprintf(flag, sizeof(flag), "--config=%s", conf);
	if (write_conf(conf, "no", 1) ||
	    h_daemon_start(&d, 10000, flag, "--device_mem=1M", "--host_mem=0",
			   (char *)NULL))
		return h_daemon_end(&d, 1);
	c = h_connect_or_fail(d.sock, "seq-nocache", 5000);
	if (!c)
		return h_daemon_end(&d, 1);
	got = put(c, 1, 32);
	CHECK(got == 0, "request 1: %" PRId64, got);
	rc = kvp_seq_alloc(c, 2, T, 32, &(struct kvp_lease){ 0 });
	CHECK(rc == -ENOSPC && strstr(kvp_last_error(c), "max_seqs is 1"),
	      "a second request under max_seqs = 1: %d %s", rc, kvp_last_error(c));
	rc = kvp_seq_info(c, 1, &si);
	CHECK(rc == 0 && !(si.flags & KVP_SEQ_CACHING) && si.published == 0,
	      "request 1 with caching off: flags %#x published %" PRIu32, si.flags,
	      si.published);
	kvp_seq_free(c, 1);
	got = put(c, 2, 32);
	CHECK(got == 0, "the same prompt again with caching off: %" PRId64
	      " cached", got);
	kvp_seq_free(c, 2);
	rc = kvp_prefix_lookup(c, T, 32, &hit);
	CHECK(rc == 0, "prefix_lookup with caching off: %d", rc);

	/* prefix_caching = yes, max_seqs = 4, reloaded. */
	if (write_conf(conf, "yes", 4) || (rc = kvp_reload(c)))
		CHECK(0, "reload: %s", kvp_last_error(c));
	for (int i = 0; i < 100 && !log_has(&d, "max_seqs 4"); i++)
		h_sleep_ms(20);
	got = put(c, 3, 32);
	CHECK(got == 0, "request 3 after the reload: %" PRId64, got);
	got = put(c, 4, 32);
	CHECK(got == 31, "request 4, the same prompt, caching on: %" PRId64
	      " cached (31: the whole prompt)", got);
	CHECK(kvp_seq_info(c, 4, &si) == 0 && si.cached == 31 &&
	      (si.flags & KVP_SEQ_CACHING), "request 4 read back: cached %" PRIu64,
	      si.cached);
	kvp_seq_free(c, 3);
	kvp_seq_free(c, 4);
	kvp_close(c);
	return h_daemon_finish(&d, g_bad, h_now_ms());
}

/* kvpoold refuses extra: exit 2, its message naming want. */
static void refused(const char *want, const char *const *extra)
{
	struct h_daemon d;
	char buf[4096] = "";
	pid_t pid;
	FILE *f;
	int rc;

	if (h_daemon_dir(&d, 0)) {
		g_bad++;
		return;
	}
	pid = h_daemon_spawn(&d, extra);
	rc = pid > 0 ? h_wait(pid, 5000) : -1;
	f = fopen(d.log, "r");
	if (f) {
		buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
		fclose(f);
	}
	CHECK(rc == 2 && strstr(buf, want), "%s: exit %d, said: %s", extra[0], rc, buf);
	h_daemon_cleanup(&d);
}

static int part_three(void)
{
	char conf[256], flag[300];
	struct h_daemon d;
	FILE *f;

	refused("max_seqs", (const char *[]){ "--max_seqs=-1", NULL });
	refused("prefix_caching", (const char *[]){ "--prefix_caching=maybe", NULL });
	if (h_daemon_dir(&d, 0))
		return 1;
	snprintf(conf, sizeof(conf), "%s/bad.conf", d.dir);
	snprintf(flag, sizeof(flag), "--config=%s", conf);
	f = fopen(conf, "w");
	if (f) {
		fprintf(f, "[tenant t]\nuids = 0\nmax_seq_tokens = 2000000000000\n");
		fclose(f);
	}
	refused("max_seq_tokens", (const char *[]){ flag, NULL });
	h_daemon_cleanup(&d);
	return g_bad;
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_seq_info");
	h_token_ids(T, N + 32, 1000);
	if (part_one())
		return H_FAIL;
	if (part_two())
		return H_FAIL;
	return part_three() ? H_FAIL : H_PASS;
}
