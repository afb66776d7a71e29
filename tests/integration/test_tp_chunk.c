/* SPDX-License-Identifier: MIT */
/*
 * test_tp_chunk - chunks in a tensor-parallel pool (issue 31, item 5) on
 * shm: kvpoold with devices = 0,1 and tp = 2. The filling group is this
 * process (rank 0) and a child (rank 1, "f1"); a second group of two more
 * processes ("r0" rank 0, "r1" rank 1) reads what the first one filled:
 *
 *   a. rank 0 registers a system root; f1's registration and link are
 *      refused (rank 0 registers, the others join); f1 joins the fill
 *      lease and gets the same page table; rank 0's join, a double join
 *      and a stale id are refused;
 *   b. each rank appends its own bytes; rank 0's seal is pending (the entry
 *      stays FILLING, a reader gets -EAGAIN), f1's seal makes it READY;
 *      then a query linked after it, filled the same way;
 *   c. the second group: r0 and r1 compose the same request and get the
 *      same frames; each acquires the system root and finds its own rank's
 *      bytes in its own pool; releases;
 *   d. f1 releases a fill lease after rank 0 sealed: the entry is gone
 *      for everybody (nothing published);
 *   e. f1 killed (SIGKILL) mid-fill: rank 0's seal is -ESTALE saying rank
 *      1's client died; the entry is gone, no frame leaked and no lease
 *      left (h_check_accounting).
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

#define SALT0 0x7020ull     /* rank 0's bytes */
#define SALT1 0x7021ull     /* rank 1's bytes */
#define NSYS 32u
#define NQ 5u
#define MAXP 16u

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

/* What the parent asks a peer to do and what it answers. */
struct cmd {
	uint64_t lease, salt;
	uint32_t n, base, type;
	struct kvp_chunk_id id, qid;
	int ret;
	char msg[KVP_ERRLEN];
	uint32_t npages;
	int32_t idx[MAXP];
};

struct peer {
	const char *name;
	uint32_t rank;
	struct h_chan ch;
	struct cmd *cmd;
	pid_t pid;
};

static const char *g_sock;
/* The system root's page table as rank 0's registration had it (the
 * lease's own is freed by the seal). */
static int32_t g_sys_idx[MAXP];
static struct peer *g_self; /* in a peer's process */

/* ------------------------------------------------------------ peers */

static void save_idx(struct cmd *m, const int32_t *idx, uint32_t n)
{
	m->npages = n;
	memcpy(m->idx, idx, (n < MAXP ? n : MAXP) * sizeof(int32_t));
}

static int peer_compose(struct kvp_client *c, struct cmd *m)
{
	struct kvp_compose_req r = { .system = m->id, .query = m->qid,
				     .qo_len = NQ };
	struct kvp_composition comp;
	int ret = kvp_compose(c, &r, 1, &comp);

	if (ret)
		return ret;
	m->lease = comp.lease;
	/* Level 0: the system root's pages. */
	save_idx(m, comp.level[0].kv_indices, (uint32_t)comp.level[0].kv_indptr[1]);
	return h_same_bytes(c, comp.level[0].kv_indices, m->salt, 0, NSYS,
			    "the composition's system pages") ? -EIO : 0;
}

static int peer_do(struct kvp_client *c, char op, struct kvp_lease *cur)
{
	struct cmd *m = g_self->cmd;
	struct kvp_chunk_reg reg = { 0 };
	struct kvp_lease tmp;
	uint32_t tok[64];
	int ret;

	switch (op) {
	case 'R':
		h_token_ids(tok, m->n, m->base);
		return kvp_chunk_register(c, tok, m->n, m->type, NULL, &reg);
	case 'L':
		return kvp_chunk_link(c, &m->qid, &m->id, 0, &reg);
	case 'j':
		ret = kvp_lease_join(c, m->lease, &tmp);
		if (!ret) {
			*cur = tmp;
			save_idx(m, cur->indices, cur->npages);
		}
		return ret;
	case 'a':
		return h_fill_lease(c, cur, m->salt, cur->n_new);
	case 's':
		reg.created = 1;
		reg.lease = *cur;
		return kvp_chunk_seal(c, &reg);
	case 'r':
		return kvp_release(c, m->lease);
	case 'A':
		ret = kvp_chunk_acquire(c, &m->id, 0, cur);
		if (ret)
			return ret;
		m->lease = cur->id;
		save_idx(m, cur->indices, cur->npages);
		return h_same_bytes(c, cur->indices, m->salt, 0, m->n,
				    "the acquired chunk") ? -EIO : 0;
	case 'C':
		return peer_compose(c, m);
	}
	return -ENOSYS;
}

static int peer_main(void *arg)
{
	struct peer *p = arg;
	struct kvp_connect_opts o = { .socket = g_sock, .name = p->name,
				      .rank = p->rank };
	struct kvp_lease cur = { 0 };
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	int op;

	g_self = p;
	h_set_name(p->name);
	h_chan_child_side(&p->ch);
	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("%s attach: %s", p->name, err);
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

static int peer_start(struct peer *p, const char *name, uint32_t rank)
{
	p->name = name;
	p->rank = rank;
	p->cmd = h_shared_zalloc(sizeof(*p->cmd));
	if (!p->cmd || h_chan_open(&p->ch))
		return -1;
	p->pid = h_fork(peer_main, p);
	h_chan_parent_side(&p->ch);
	return p->pid < 0 ? -1 : 0;
}

/* Ask p to do op; its return value. */
static int ask(struct peer *p, char op)
{
	p->cmd->ret = -EIO;
	if (h_chan_say(p->ch.to_child[1], op) ||
	    h_chan_wait(p->ch.to_parent[0], 10000) != 'k') {
		h_fail("%s did not answer '%c'", p->name, op);
		g_bad++;
		return -EIO;
	}
	return p->cmd->ret;
}

static void peer_stop(struct peer *p)
{
	h_chan_say(p->ch.to_child[1], 'q');
	CHECK(h_wait(p->pid, 5000) == 0, "%s did not exit cleanly", p->name);
}

/* ------------------------------------------------------------ rank 0 */

static int entry_state(struct kvp_client *c, const struct kvp_chunk_id *id)
{
	struct kvp_chunk_entry_info e;
	int ret = kvp_chunk_entry(c, id, &e);

	return ret ? ret : (int)e.state;
}

/* Rank 0 registers base's n tokens, f1 joins: the registration, 0 or -1. */
static int group_register(struct kvp_client *c, struct peer *f1, uint32_t base,
			  uint32_t n, uint32_t type, struct kvp_chunk_reg *reg)
{
	uint32_t tok[64];
	int ret;

	h_token_ids(tok, n, base);
	ret = kvp_chunk_register(c, tok, n, type, NULL, reg);
	CHECK(!ret && reg->created, "register %u tokens: %d created %d %s", n,
	      ret, reg->created, kvp_last_error(c));
	if (ret || !reg->created)
		return -1;
	f1->cmd->lease = reg->lease.id;
	ret = ask(f1, 'j');
	CHECK(!ret, "f1's join of fill lease %#" PRIx64 ": %d %s", reg->lease.id,
	      ret, f1->cmd->msg);
	CHECK(!ret && f1->cmd->npages == reg->lease.npages &&
	      !memcmp(f1->cmd->idx, reg->lease.indices,
		      reg->lease.npages * sizeof(int32_t)),
	      "f1's page table (%u pages) is not rank 0's (%u)", f1->cmd->npages,
	      reg->lease.npages);
	return ret ? -1 : 0;
}

/* Both ranks fill reg's entry with their bytes; rank 0 seals first. */
static void group_fill_seal(struct kvp_client *c, struct peer *f1,
			    struct peer *r0, struct kvp_chunk_reg *reg)
{
	int ret = h_fill_lease(c, &reg->lease, SALT0, reg->tokens);

	CHECK(!ret, "rank 0's append: %d %s", ret, kvp_last_error(c));
	f1->cmd->salt = SALT1;
	ret = ask(f1, 'a');
	CHECK(!ret, "f1's append: %d %s", ret, f1->cmd->msg);
	ret = kvp_chunk_seal(c, reg);
	CHECK(ret == KVP_COMMIT_PENDING, "rank 0's seal: %d (want %d, pending) %s",
	      ret, KVP_COMMIT_PENDING, kvp_last_error(c));
	CHECK(entry_state(c, &reg->id) == KVP_CHUNK_FILLING, "after rank 0's seal "
	      "alone the entry is in state %d, want FILLING",
	      entry_state(c, &reg->id));
	r0->cmd->id = reg->id;
	r0->cmd->n = reg->tokens;
	r0->cmd->salt = SALT0;
	ret = ask(r0, 'A');
	CHECK(ret == -EAGAIN, "a reader's acquire before every rank sealed: %d "
	      "'%s', want -EAGAIN", ret, r0->cmd->msg);
	ret = ask(f1, 's');
	CHECK(ret == 0, "f1's seal (the last): %d %s", ret, f1->cmd->msg);
	CHECK(entry_state(c, &reg->id) == KVP_CHUNK_READY, "after both seals the "
	      "entry is in state %d, want READY", entry_state(c, &reg->id));
}

static void step_refusals(struct kvp_client *c, struct peer *f1,
			  struct kvp_chunk_reg *sys)
{
	struct kvp_lease l;
	uint32_t tok[NSYS];
	int ret;

	h_token_ids(tok, NSYS, 1000);
	ret = kvp_chunk_register(c, tok, NSYS, KVP_CHUNK_SYSTEM, NULL, sys);
	CHECK(!ret && sys->created && sys->lease.npages <= MAXP,
	      "rank 0's register: %d %s", ret, kvp_last_error(c));
	if (!ret)
		memcpy(g_sys_idx, sys->lease.indices,
		       sys->lease.npages * sizeof(int32_t));
	f1->cmd->n = NSYS;
	f1->cmd->base = 1000;
	f1->cmd->type = KVP_CHUNK_SYSTEM;
	ret = ask(f1, 'R');
	CHECK(ret == -EINVAL && strstr(f1->cmd->msg, "rank 1 of a tensor-parallel "
				       "pool: rank 0 registers chunks; join its "
				       "fill lease with kvp_lease_join"),
	      "f1's register: %d '%s'", ret, f1->cmd->msg);
	f1->cmd->id = sys->id;
	f1->cmd->qid = sys->name;
	ret = ask(f1, 'L');
	CHECK(ret == -EINVAL && strstr(f1->cmd->msg, "rank 0 registers chunks"),
	      "f1's link: %d '%s'", ret, f1->cmd->msg);
	ret = kvp_lease_join(c, sys->lease.id, &l);
	CHECK(ret == -EINVAL && strstr(kvp_last_error(c), "rank 0 of a "
				       "tensor-parallel pool"),
	      "rank 0's join: %d '%s'", ret, kvp_last_error(c));
	f1->cmd->lease = sys->lease.id;
	ret = ask(f1, 'j');
	CHECK(ret == 0 && f1->cmd->npages == sys->lease.npages &&
	      !memcmp(f1->cmd->idx, sys->lease.indices,
		      sys->lease.npages * sizeof(int32_t)),
	      "f1's join: %d '%s', %u pages (rank 0 has %u)", ret, f1->cmd->msg,
	      f1->cmd->npages, sys->lease.npages);
	ret = ask(f1, 'j');
	CHECK(ret == -EALREADY && strstr(f1->cmd->msg, "rank 1 joined it already"),
	      "f1's second join: %d '%s'", ret, f1->cmd->msg);
	f1->cmd->lease = sys->lease.id + (1ull << 32);
	ret = ask(f1, 'j');
	CHECK(ret == -ESTALE && strstr(f1->cmd->msg, "is not held"),
	      "a stale id's join: %d '%s'", ret, f1->cmd->msg);
}

/* c. The second group reads what the first filled. */
static void step_read(struct kvp_client *c, struct peer *r0, struct peer *r1,
		      const struct kvp_chunk_reg *sys,
		      const struct kvp_chunk_reg *q)
{
	const uint32_t np = sys->lease.npages;
	int ret;

	r0->cmd->id = r1->cmd->id = sys->id;
	r0->cmd->qid = r1->cmd->qid = q->id;
	r0->cmd->salt = SALT0;
	r1->cmd->salt = SALT1;
	ret = ask(r0, 'C');
	CHECK(ret == 0, "r0's compose: %d %s", ret, r0->cmd->msg);
	ret = ask(r1, 'C');
	CHECK(ret == 0, "r1's compose: %d %s", ret, r1->cmd->msg);
	CHECK(r0->cmd->npages == np && r1->cmd->npages == np &&
	      !memcmp(r0->cmd->idx, r1->cmd->idx, np * sizeof(int32_t)) &&
	      !memcmp(r0->cmd->idx, g_sys_idx, np * sizeof(int32_t)),
	      "the ranks' compositions name other frames (%u, %u pages)",
	      r0->cmd->npages, r1->cmd->npages);
	CHECK(ask(r0, 'r') == 0, "r0's release of its composition: %s", r0->cmd->msg);
	CHECK(ask(r1, 'r') == 0, "r1's release of its composition: %s", r1->cmd->msg);
	r0->cmd->n = r1->cmd->n = NSYS;
	ret = ask(r0, 'A');
	CHECK(ret == 0, "r0's acquire: %d %s", ret, r0->cmd->msg);
	ret = ask(r1, 'A');
	CHECK(ret == 0, "r1's acquire: %d %s", ret, r1->cmd->msg);
	CHECK(!memcmp(r0->cmd->idx, r1->cmd->idx, np * sizeof(int32_t)),
	      "the ranks' read leases name other frames");
	/* A read lease is each rank's own: not joined. */
	{
		uint64_t own = r1->cmd->lease;

		r1->cmd->lease = r0->cmd->lease;
		ret = ask(r1, 'j');
		CHECK(ret == -EINVAL && strstr(r1->cmd->msg, "is not a history "
					       "lease nor a chunk fill lease"),
		      "r1's join of r0's read lease: %d '%s'", ret, r1->cmd->msg);
		r1->cmd->lease = own;
	}
	/* The pages are the same frames in rank 0's pool as in f1's. */
	CHECK(!h_same_bytes(c, r0->cmd->idx, SALT0, 0, NSYS, "rank 0's pool"),
	      "rank 0's bytes through r0's read lease");
	CHECK(ask(r0, 'r') == 0, "r0's release: %s", r0->cmd->msg);
	CHECK(ask(r1, 'r') == 0, "r1's release: %s", r1->cmd->msg);
}

/* d. f1 releases its fill lease after rank 0 sealed. */
static void step_release(struct kvp_client *c, struct peer *f1)
{
	struct kvp_chunk_reg reg;
	int ret;

	if (group_register(c, f1, 5000, 20, KVP_CHUNK_CONTEXT, &reg))
		return;
	CHECK(!h_fill_lease(c, &reg.lease, SALT0, reg.tokens), "rank 0's append");
	ret = kvp_chunk_seal(c, &reg);
	CHECK(ret == KVP_COMMIT_PENDING, "rank 0's seal: %d %s", ret,
	      kvp_last_error(c));
	f1->cmd->lease = reg.lease.id;
	ret = ask(f1, 'r');
	CHECK(ret == 0, "f1's release of the fill lease: %d %s", ret, f1->cmd->msg);
	ret = entry_state(c, &reg.id);
	CHECK(ret == -ENOENT, "the entry after f1's release: %d, want -ENOENT "
	      "(abandoned)", ret);
	ret = ask(f1, 's');
	CHECK(ret < 0, "f1's seal after its release: %d, want an error", ret);
}

/* e. f1 dies mid-fill. */
static void step_kill(struct kvp_client *c, struct peer *f1)
{
	struct kvp_chunk_reg reg;
	struct kvp_stats st;
	uint64_t t0;
	int ret;

	if (group_register(c, f1, 6000, 20, KVP_CHUNK_CONTEXT, &reg))
		return;
	CHECK(!h_fill_lease(c, &reg.lease, SALT0, reg.tokens), "rank 0's append");
	f1->cmd->salt = SALT1;
	CHECK(ask(f1, 'a') == 0, "f1's append: %s", f1->cmd->msg);
	kill(f1->pid, SIGKILL);
	CHECK(h_wait(f1->pid, 5000) == 128 + SIGKILL, "f1 did not die of SIGKILL");
	for (t0 = h_now_ms(); h_now_ms() - t0 < 5000; h_sleep_ms(5))
		if (entry_state(c, &reg.id) == -ENOENT)
			break;
	CHECK(entry_state(c, &reg.id) == -ENOENT, "the entry 5 s after f1 died: "
	      "%d, want -ENOENT (abandoned)", entry_state(c, &reg.id));
	ret = kvp_chunk_seal(c, &reg);
	CHECK(ret == -ESTALE && strstr(kvp_last_error(c), "released (rank 1's "
				       "client died) before every rank sealed; "
				       "the chunk was not published"),
	      "rank 0's seal after f1 died: %d '%s'", ret, kvp_last_error(c));
	ret = kvp_release(c, reg.lease.id);
	CHECK(ret == 0 || ret == -ENOENT, "rank 0's release of the ended lease: %d",
	      ret);
	/* The registered chunks go too: every frame is then free. */
	ret = kvp_chunk_clear(c, 0);
	CHECK(ret >= 0, "chunk clear: %d %s", ret, kvp_last_error(c));
	CHECK(!h_check_accounting(c, &st), "frames or leases leaked after the death");
	CHECK(st.leases == 0, "%" PRIu64 " leases left, want 0", (uint64_t)st.leases);
}

int main(int argc, char **argv)
{
	struct h_daemon d = { 0 };
	struct kvp_client *c = NULL;
	struct kvp_connect_opts o = { .name = "rank0" };
	struct peer f1 = { 0 }, r0 = { 0 }, r1 = { 0 };
	struct kvp_chunk_reg sys, q;
	char err[KVP_ERRLEN];
	uint64_t t0 = h_now_ms();

	h_init(argc, argv, "test_tp_chunk");
	if (h_daemon_dir(&d, 0) || h_daemon_start(&d, 10000, "--devices=0,1", "--tp=2", "--device_mem=32K",
			   "--host_mem=64K", (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	o.socket = d.sock;
	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("rank 0 attach: %s", err);
		return h_daemon_end(&d, 1);
	}
	if (peer_start(&f1, "f1", 1) || peer_start(&r0, "r0", 0) ||
	    peer_start(&r1, "r1", 1))
		return h_daemon_end(&d, 1);

	step_refusals(c, &f1, &sys);
	group_fill_seal(c, &f1, &r0, &sys);
	/* A query root, and the query linked after the system root: filled by
	 * the group too. */
	{
		uint32_t tok[NQ];
		struct kvp_chunk_reg qn;
		int ret;

		h_token_ids(tok, NQ, 3000);
		ret = kvp_chunk_register(c, tok, NQ, KVP_CHUNK_QUERY, NULL, &qn);
		CHECK(!ret, "the query's root: %d %s", ret, kvp_last_error(c));
		if (!ret && qn.created) {
			CHECK(!h_fill_lease(c, &qn.lease, SALT0, NQ), "query root fill");
			f1.cmd->lease = qn.lease.id;
			CHECK(ask(&f1, 'j') == 0, "f1's join of the query root: %s",
			      f1.cmd->msg);
			f1.cmd->salt = SALT1;
			CHECK(ask(&f1, 'a') == 0, "f1's append: %s", f1.cmd->msg);
			CHECK(kvp_chunk_seal(c, &qn) == KVP_COMMIT_PENDING,
			      "query root, rank 0's seal");
			CHECK(ask(&f1, 's') == 0, "query root, f1's seal: %s",
			      f1.cmd->msg);
		}
		ret = kvp_chunk_link(c, &qn.name, &sys.id, 0, &q);
		CHECK(!ret && q.created, "link of the query: %d %s", ret,
		      kvp_last_error(c));
		if (!ret && q.created) {
			f1.cmd->lease = q.lease.id;
			CHECK(ask(&f1, 'j') == 0, "f1's join of the link: %s",
			      f1.cmd->msg);
			group_fill_seal(c, &f1, &r0, &q);
		}
	}
	step_read(c, &r0, &r1, &sys, &q);
	step_release(c, &f1);
	step_kill(c, &f1);

	peer_stop(&r0);
	peer_stop(&r1);
	kvp_close(c);
	return h_daemon_finish(&d, g_bad, t0);
}
