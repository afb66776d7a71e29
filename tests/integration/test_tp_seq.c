/* SPDX-License-Identifier: MIT */
/*
 * test_tp_seq - sequences in a tensor-parallel pool (issue 31) on shm:
 * kvpoold with devices = 0,1 and tp = 2. This process is rank 0, a child
 * ("s1") rank 1:
 *
 *   a. s1's kvp_seq_alloc, kvp_seq_extend and kvp_seq_create are refused
 *      (rank 0 allocates, creates and extends; the others join);
 *   b. rank 0 allocates a sequence, s1 joins its write lease and gets the
 *      same page table (rank 0's own join, s1's second join and its
 *      kvp_chunk_seal of it are refused); each rank writes its
 *      own bytes; rank 0's commit is pending (the sequence has not grown),
 *      s1's makes it grow; seq_info, seq_pages and a prefix lookup give s1
 *      rank 0's frames, and each rank reads its own bytes back through them;
 *   c. an extend filled and committed the same way;
 *   d. s1 releases a joined write lease before committing: rank 0's commit
 *      is -ESTALE saying so, the sequence keeps its 28 tokens;
 *   e. s1 killed (SIGKILL) mid-write: rank 0's commit is -ESTALE saying rank
 *      1's client died; the sequence is as before, no frame is leaked and
 *      no lease left; freed, only the prefix cache's idle pages stay.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define SALT0 0x7030ull     /* rank 0's bytes */
#define SALT1 0x7031ull     /* rank 1's bytes */
#define SEQ 7u
#define N1 20u              /* the prompt */
#define N2 8u               /* the extend */
#define BASE 100u           /* the prompt's token ids */
#define MAXP 16u

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

/* What the parent asks s1 to do and what it answers. */
struct cmd {
	uint64_t lease, salt;
	uint32_t n;
	int ret;
	char msg[KVP_ERRLEN];
	uint32_t npages;
	int32_t idx[MAXP];
};

struct peer {
	struct h_chan ch;
	struct cmd *cmd;
	pid_t pid;
};

static const char *g_sock;
static struct peer *g_self; /* in s1's process */

/* Write tokens [l->len, l->len + l->n_new) of h_tokens_fill(salt). */
static int write_new(struct kvp_client *c, const struct kvp_lease *l,
		     uint64_t salt)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	void *kv = malloc((size_t)l->n_new * lay->token_bytes);
	int ret;

	if (!kv)
		return -ENOMEM;
	h_tokens_fill(lay, salt, 0, l->len, l->n_new, kv);
	ret = kvp_append(c, l, 0, l->n_new, kv);
	free(kv);
	return ret;
}

static void save_idx(struct cmd *m, const int32_t *idx, uint32_t n)
{
	m->npages = n;
	memcpy(m->idx, idx, (n < MAXP ? n : MAXP) * sizeof(int32_t));
}

/* seq_info and seq_pages: the page table into m->idx, the tokens into
 * m->n; the committed ones must hold salt's bytes. */
static int peer_info(struct kvp_client *c, struct cmd *m)
{
	struct kvp_seq_info si;
	int32_t f[MAXP];
	int ret = kvp_seq_info(c, SEQ, &si);

	if (ret)
		return ret;
	ret = kvp_seq_pages(c, SEQ, f, MAXP);
	if (ret < 0)
		return ret;
	save_idx(m, f, (uint32_t)ret);
	m->n = (uint32_t)si.computed;
	m->lease = si.write_lease;
	return h_same_bytes(c, f, m->salt, 0, (uint32_t)si.computed,
			    "s1's sequence pages") ? -EIO : 0;
}

static int peer_do(struct kvp_client *c, char op, struct kvp_lease *cur)
{
	struct cmd *m = g_self->cmd;
	struct kvp_prefix_hit hit;
	struct kvp_seq_src src = { .kind = KVP_SRC_SEQ, .id = SEQ, .tokens = 1 };
	struct kvp_lease tmp;
	uint32_t tok[64];
	int ret;

	h_token_ids(tok, N1, BASE);
	switch (op) {
	case 'a':
		return kvp_seq_alloc(c, SEQ + 1, tok, N1, &tmp);
	case 'e':
		return kvp_seq_extend(c, SEQ, 4, NULL, &tmp);
	case 'c':
		return kvp_seq_create(c, SEQ + 2, &src, 1, 4, &tmp);
	case 'j':
		ret = kvp_lease_join(c, m->lease, &tmp);
		if (!ret) {
			*cur = tmp;
			save_idx(m, cur->indices, cur->npages);
			m->n = (uint32_t)cur->len;
		}
		return ret;
	case 'w':
		return write_new(c, cur, m->salt);
	case 'm':
		return kvp_commit(c, cur->id, cur->n_new);
	case 'S': {
		struct kvp_chunk_reg reg = { .created = 1, .lease = *cur };

		return kvp_chunk_seal(c, &reg);
	}
	case 'r':
		return kvp_release(c, cur->id);
	case 'i':
		return peer_info(c, m);
	case 'p':
		ret = kvp_prefix_lookup(c, tok, N1, &hit);
		if (ret >= 0)
			save_idx(m, hit.indices, hit.npages);
		return ret;
	}
	return -ENOSYS;
}

static int peer_main(void *arg)
{
	struct peer *p = arg;
	struct kvp_connect_opts o = { .socket = g_sock, .name = "s1", .rank = 1 };
	struct kvp_lease cur = { 0 };
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	int op;

	g_self = p;
	h_set_name("s1");
	h_chan_child_side(&p->ch);
	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("s1 attach: %s", err);
		return 1;
	}
	while ((op = h_chan_wait(p->ch.to_child[0], 30000)) > 0 && op != 'q') {
		p->cmd->msg[0] = '\0';
		p->cmd->ret = peer_do(c, (char)op, &cur);
		snprintf(p->cmd->msg, sizeof(p->cmd->msg), "%s", kvp_last_error(c));
		if (h_chan_say(p->ch.to_parent[1], 'k'))
			break;
	}
	kvp_close(c);
	return 0;
}

static int peer_start(struct peer *p)
{
	p->cmd = h_shared_zalloc(sizeof(*p->cmd));
	if (!p->cmd || h_chan_open(&p->ch))
		return -1;
	p->pid = h_fork(peer_main, p);
	h_chan_parent_side(&p->ch);
	return p->pid < 0 ? -1 : 0;
}

/* Ask s1 to do op; its return value. */
static int ask(struct peer *p, char op)
{
	p->cmd->ret = -EIO;
	if (h_chan_say(p->ch.to_child[1], op) ||
	    h_chan_wait(p->ch.to_parent[0], 10000) != 'k') {
		h_fail("s1 did not answer '%c'", op);
		g_bad++;
		return -EIO;
	}
	return p->cmd->ret;
}

/* ------------------------------------------------------------ rank 0 */

static struct kvp_seq_info info(struct kvp_client *c)
{
	struct kvp_seq_info si = { 0 };
	int ret = kvp_seq_info(c, SEQ, &si);

	CHECK(ret == 0, "rank 0's seq_info: %d %s", ret, kvp_last_error(c));
	return si;
}

/* s1 joins l: the same page table, 0 or -1. */
static int join(struct peer *s1, const struct kvp_lease *l)
{
	int ret;

	s1->cmd->lease = l->id;
	ret = ask(s1, 'j');
	CHECK(ret == 0, "s1's join of write lease %#" PRIx64 ": %d %s", l->id,
	      ret, s1->cmd->msg);
	CHECK(!ret && s1->cmd->npages == l->npages && s1->cmd->n == l->len &&
	      !memcmp(s1->cmd->idx, l->indices, l->npages * sizeof(int32_t)),
	      "s1's page table (%u pages) is not rank 0's (%u)", s1->cmd->npages,
	      l->npages);
	return ret ? -1 : 0;
}

/* Each rank writes l's new tokens; rank 0 commits first (pending). */
static void write_commit(struct kvp_client *c, struct peer *s1,
			 const struct kvp_lease *l, uint64_t len0)
{
	int ret = write_new(c, l, SALT0);

	CHECK(!ret, "rank 0's append: %d %s", ret, kvp_last_error(c));
	s1->cmd->salt = SALT1;
	ret = ask(s1, 'w');
	CHECK(!ret, "s1's append: %d %s", ret, s1->cmd->msg);
	ret = kvp_commit(c, l->id, l->n_new);
	CHECK(ret == KVP_COMMIT_PENDING, "rank 0's commit: %d (want %d, pending) "
	      "%s", ret, KVP_COMMIT_PENDING, kvp_last_error(c));
	CHECK(info(c).computed == len0, "after rank 0's commit alone the "
	      "sequence has %" PRIu64 " tokens computed, want %" PRIu64,
	      info(c).computed, len0);
	ret = ask(s1, 'm');
	CHECK(ret == 0, "s1's commit (the last): %d %s", ret, s1->cmd->msg);
	CHECK(info(c).computed == l->len + l->n_new, "after both commits the "
	      "sequence has %" PRIu64 " tokens computed, want %" PRIu64,
	      info(c).computed, l->len + l->n_new);
}

/* Both ranks see the same frames, each its own bytes in them. */
static void same_frames(struct kvp_client *c, struct peer *s1, uint32_t n)
{
	int32_t f[MAXP];
	int np = kvp_seq_pages(c, SEQ, f, MAXP);
	int ret;

	CHECK(np > 0, "rank 0's seq_pages: %d %s", np, kvp_last_error(c));
	if (np <= 0)
		return;
	s1->cmd->salt = SALT1;
	ret = ask(s1, 'i');
	CHECK(ret == 0 && s1->cmd->n == n, "s1's seq_info: %d '%s', %u tokens "
	      "computed (want %u)", ret, s1->cmd->msg, s1->cmd->n, n);
	CHECK(s1->cmd->npages == (uint32_t)np &&
	      !memcmp(s1->cmd->idx, f, (size_t)np * sizeof(int32_t)),
	      "s1's seq_pages (%u) name other frames than rank 0's (%d)",
	      s1->cmd->npages, np);
	CHECK(!h_same_bytes(c, f, SALT0, 0, n, "rank 0's sequence pages"),
	      "rank 0's bytes");
}

static void step_refusals(struct peer *s1)
{
	static const char want[] = "rank 1 of a tensor-parallel pool: rank 0 "
		"allocates, creates and extends sequences; join its write lease "
		"with kvp_lease_join";
	static const char ops[] = "aec";

	for (const char *op = ops; *op; op++) {
		int ret = ask(s1, *op);

		CHECK(ret == -EINVAL && strstr(s1->cmd->msg, want),
		      "s1's '%c' (alloc, extend, create): %d '%s'", *op, ret,
		      s1->cmd->msg);
	}
}

static void step_alloc(struct kvp_client *c, struct peer *s1)
{
	struct kvp_prefix_hit hit;
	struct kvp_lease l, tmp;
	uint32_t tok[N1];
	int32_t f0[MAXP];
	int ret;

	h_token_ids(tok, N1, BASE);
	ret = kvp_seq_alloc(c, SEQ, tok, N1, &l);
	CHECK(!ret && l.len == 0 && l.n_new == N1, "rank 0's seq_alloc: %d %s",
	      ret, kvp_last_error(c));
	if (ret)
		return;
	if (join(s1, &l))
		return;
	ret = ask(s1, 'j');
	CHECK(ret == -EALREADY, "s1's second join: %d '%s'", ret, s1->cmd->msg);
	ret = kvp_lease_join(c, l.id, &tmp);
	CHECK(ret == -EINVAL && strstr(kvp_last_error(c), "rank 0 of a "
				       "tensor-parallel pool"),
	      "rank 0's join: %d '%s'", ret, kvp_last_error(c));
	write_commit(c, s1, &l, 0);
	same_frames(c, s1, N1);
	/* A sequence's write lease is no chunk to seal (the library drops
	 * its record of the lease: s1 is done with it). */
	ret = ask(s1, 'S');
	CHECK(ret == -ENOENT && strstr(s1->cmd->msg, "is not a chunk fill lease"),
	      "s1's seal of the write lease: %d '%s'", ret, s1->cmd->msg);
	/* The published prompt: a lookup by either rank, the same frames. */
	ret = kvp_prefix_lookup(c, tok, N1, &hit);
	CHECK(ret > 0 && hit.npages > 0, "rank 0's prefix lookup: %d %s", ret,
	      kvp_last_error(c));
	if (ret <= 0)
		return;
	memcpy(f0, hit.indices, hit.npages * sizeof(int32_t));
	ret = ask(s1, 'p');
	CHECK(ret > 0 && s1->cmd->npages == hit.npages &&
	      !memcmp(s1->cmd->idx, f0, hit.npages * sizeof(int32_t)),
	      "s1's prefix lookup: %d '%s', %u pages (rank 0 found %u)", ret,
	      s1->cmd->msg, s1->cmd->npages, hit.npages);
}

static void step_extend(struct kvp_client *c, struct peer *s1)
{
	struct kvp_lease l;
	int ret = kvp_seq_extend(c, SEQ, N2, NULL, &l);

	CHECK(!ret && l.len == N1 && l.n_new == N2, "rank 0's extend: %d %s",
	      ret, kvp_last_error(c));
	if (ret || join(s1, &l))
		return;
	write_commit(c, s1, &l, N1);
	same_frames(c, s1, N1 + N2);
	ret = ask(s1, 'r');
	CHECK(ret == 0, "s1's release after the group committed: %d %s", ret,
	      s1->cmd->msg);
}

/* Rank 0 extends by 4, s1 joins; then end is done to s1 ('r' or a kill). */
static int extend_joined(struct kvp_client *c, struct peer *s1,
			 struct kvp_lease *l)
{
	int ret = kvp_seq_extend(c, SEQ, 4, NULL, l);

	CHECK(!ret, "rank 0's extend: %d %s", ret, kvp_last_error(c));
	if (ret || join(s1, l))
		return -1;
	CHECK(!write_new(c, l, SALT0), "rank 0's append: %s", kvp_last_error(c));
	s1->cmd->salt = SALT1;
	CHECK(ask(s1, 'w') == 0, "s1's append: %s", s1->cmd->msg);
	return 0;
}

/* After the group ended: rank 0's commit says why, the sequence is as
 * before, rank 0's release leaves the record. */
static void after_end(struct kvp_client *c, const struct kvp_lease *l,
		      const char *why)
{
	struct kvp_seq_info si;
	char want[160];
	int ret = kvp_commit(c, l->id, l->n_new);

	snprintf(want, sizeof(want), "released (rank 1's client %s) before every "
		 "rank committed; the sequence kept only the tokens committed "
		 "before it", why);
	CHECK(ret == -ESTALE && strstr(kvp_last_error(c), want),
	      "rank 0's commit after s1's end: %d '%s'", ret, kvp_last_error(c));
	si = info(c);
	CHECK(si.tokens == N1 + N2 && si.computed == N1 + N2 && !si.write_lease &&
	      si.n_new == 0, "the sequence after the group ended: %" PRIu64
	      " tokens, %" PRIu64 " computed, lease %#" PRIx64 "; want %u, %u, 0",
	      si.tokens, si.computed, si.write_lease, N1 + N2, N1 + N2);
	ret = kvp_release(c, l->id);
	CHECK(ret == 0, "rank 0's release of the ended lease: %d %s", ret,
	      kvp_last_error(c));
}

static void step_release(struct kvp_client *c, struct peer *s1)
{
	struct kvp_lease l;
	int ret;

	if (extend_joined(c, s1, &l))
		return;
	ret = ask(s1, 'r');
	CHECK(ret == 0, "s1's release before committing: %d %s", ret,
	      s1->cmd->msg);
	ret = ask(s1, 'm');
	CHECK(ret < 0, "s1's commit after its release: %d, want an error", ret);
	after_end(c, &l, "released it");
}

static void step_kill(struct kvp_client *c, struct peer *s1)
{
	struct kvp_stats st0, st;
	struct kvp_lease l;
	int32_t f[MAXP];
	uint64_t t0;
	int ret;

	CHECK(kvp_stats(c, 0, &st0) == 0, "stats: %s", kvp_last_error(c));
	if (extend_joined(c, s1, &l))
		return;
	kill(s1->pid, SIGKILL);
	CHECK(h_wait(s1->pid, 5000) == 128 + SIGKILL, "s1 did not die of SIGKILL");
	for (t0 = h_now_ms(); h_now_ms() - t0 < 5000; h_sleep_ms(5))
		if (!info(c).write_lease)
			break;
	after_end(c, &l, "died");
	ret = kvp_seq_pages(c, SEQ, f, MAXP);
	CHECK(ret > 0 && !h_same_bytes(c, f, SALT0, 0, N1 + N2, "rank 0's pages"),
	      "rank 0's committed bytes after s1 died (%d pages)", ret);
	CHECK(kvp_stats(c, 0, &st) == 0, "stats: %s", kvp_last_error(c));
	CHECK(st.leases == 0 && st.seq_pages == st0.seq_pages &&
	      st.tier[KVP_TIER_DEVICE].frames_used ==
	      st0.tier[KVP_TIER_DEVICE].frames_used,
	      "after s1 died: %" PRIu64 " leases (want 0), %" PRIu64 " sequence "
	      "pages and %" PRIu64 " frames used (want %" PRIu64 " and %" PRIu64
	      ")", (uint64_t)st.leases, (uint64_t)st.seq_pages,
	      st.tier[KVP_TIER_DEVICE].frames_used, (uint64_t)st0.seq_pages,
	      st0.tier[KVP_TIER_DEVICE].frames_used);
	ret = kvp_seq_free(c, SEQ);
	CHECK(ret == 0, "rank 0's seq_free: %d %s", ret, kvp_last_error(c));
	CHECK(kvp_stats(c, 0, &st) == 0, "stats: %s", kvp_last_error(c));
	/* Only the published prompt pages stay, idle in the prefix cache. */
	CHECK(st.seqs == 0 && st.seq_pages == 0 && st.leases == 0 &&
	      st.tier[KVP_TIER_DEVICE].frames_used == st.prefix_idle_pages,
	      "after the free: %" PRIu64 " sequences, %" PRIu64 " pages, %" PRIu64
	      " leases, %" PRIu64 " frames used for %" PRIu64 " idle prefix pages",
	      (uint64_t)st.seqs, (uint64_t)st.seq_pages, (uint64_t)st.leases,
	      st.tier[KVP_TIER_DEVICE].frames_used, (uint64_t)st.prefix_idle_pages);
}

int main(int argc, char **argv)
{
	struct h_daemon d = { 0 };
	struct kvp_client *c = NULL;
	struct kvp_connect_opts o = { .name = "rank0" };
	struct peer s1 = { 0 };
	char err[KVP_ERRLEN];
	uint64_t t0 = h_now_ms();

	h_init(argc, argv, "test_tp_seq");
	if (h_daemon_dir(&d, 0) ||
	    h_daemon_start(&d, 10000, "--devices=0,1", "--tp=2",
			   "--device_mem=32K", "--host_mem=64K", (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	o.socket = d.sock;
	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("rank 0 attach: %s", err);
		return h_daemon_end(&d, 1);
	}
	if (peer_start(&s1))
		return h_daemon_end(&d, 1);

	step_refusals(&s1);
	step_alloc(c, &s1);
	step_extend(c, &s1);
	step_release(c, &s1);
	step_kill(c, &s1);

	kvp_close(c);
	return h_daemon_finish(&d, g_bad, t0);
}
