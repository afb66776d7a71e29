/* SPDX-License-Identifier: MIT */
/*
 * test_user_order_workers - 8 client processes appending to the same 4
 * users through a kvpoold with 4 workers (and so, by default, 4 shards)
 * see every user's operations take effect in one order: no commit lost,
 * none applied twice, no token torn or written by the wrong lease
 * (DESIGN.md, "Order"; issue 14, "per-user order with 8 clients on 4
 * workers hitting the same users").
 *
 * Every client loops until it has WINS commits. Most rounds go through the
 * ring in two batches: PREPARE of all four users from the end it last saw,
 * each followed by an INFO of the same user; then, for the users it won,
 * COMMIT (with the release flag, or COMMIT then RELEASE) followed by an
 * INFO of the same user, and an INFO of each user it lost. Other rounds are synchronous: info, prepare, append, commit,
 * release. A prepare loses with -EBUSY (another client's reservation) or
 * -EINVAL "overlapping tokens" (another client committed meanwhile); a gap
 * ("missing tokens") is never right, since a client only asks for the end
 * it saw and histories here never shrink. A winner commits 1..n of its n
 * reserved tokens, so the next writer often appends into a page whose
 * later slots an earlier lease wrote and gave back.
 *
 * The bytes of each token name the client, its commit number, the user
 * and the position (token_fill), so whoever reads a token can say whose
 * write it is. Each client logs its commits (user, position, tokens) in
 * shared memory, and checks as it goes:
 *  - a won lease starts exactly at the asked position;
 *  - within one submission a user's completions come back in queue order;
 *  - the INFO queued after a PREPARE it won sees the history end where the
 *    lease starts (nobody commits under its reservation);
 *  - the INFO queued after its own COMMIT sees that commit (the history
 *    ends at or past it): the ring's order held for that user, across
 *    whichever worker and shard ran them;
 *  - the end it sees of a user never goes back.
 * At the end the parent checks that:
 *  - each client's positions per user strictly increase;
 *  - per user the logged commits tile [0, len) exactly, len being what
 *    kvp_info reports (none lost, none overlapping);
 *  - every token, read through a read-only lease's page table from the
 *    mapped device tier, is the one its commit wrote (on a mismatch: user,
 *    position, frame and slot, the write expected and the write found);
 *  - stats: no lease left, commits and committed tokens as logged, device
 *    frames used = the histories' pages (h_check_accounting), nothing
 *    demoted or dropped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "pool_state.h"

#define CLIENTS 8
#define USERS 4
#define WORKERS "4"
#define WINS 1500         /* commits each client makes */
#define MAX_NEW 24u       /* tokens a prepare reserves at most */
#define USER0 5000u
#define MAGIC 0x4f524452u /* "ORDR" */

/* Op codes of the tags, in the order a round queues them for a user. */
enum { OP_PREP = 1, OP_INFO_PREP, OP_COMMIT, OP_RELEASE, OP_INFO };

/* One successful commit: positions [pos, pos + n) of user USER0 + u. */
struct commit_rec {
	uint32_t u;
	uint32_t n;
	uint64_t pos;
};

struct client_log {
	uint32_t ncommits;
	uint32_t rounds_async, rounds_sync;
	uint64_t lost_busy, lost_overlap;
	struct commit_rec rec[WINS];
};

struct shared {
	volatile int go;
	struct client_log log[CLIENTS];
};

static struct shared *g;
static const char *g_sock;

/* ------------------------------------------------------------ token bytes */

/* The header of every token: who wrote it, for messages. */
struct token_hdr {
	uint32_t magic, client, seq, user, pos_lo, pos_hi;
};

/*
 * The bytes of token pos of user as client's commit number seq writes them,
 * in kvp_append()'s [layers][2][heads][dim] order: a header naming the
 * write, then words that are a function of all four (so a token of another
 * write, or half of one, never passes).
 */
static void token_fill(const struct kvp_layout *l, uint32_t client,
		       uint32_t seq, uint64_t user, uint64_t pos, uint8_t *out)
{
	struct token_hdr h = { MAGIC, client, seq, (uint32_t)user,
			       (uint32_t)pos, (uint32_t)(pos >> 32) };
	uint64_t base = h_mix64(((uint64_t)client << 40) ^ ((uint64_t)seq << 20) ^
				h_mix64(user ^ h_mix64(pos)));
	uint64_t words = l->token_bytes / 4;

	for (uint64_t i = 0; i < words; i++) {
		uint32_t w = (uint32_t)h_mix64(base + i) & 0xbfbfbfbfu;
		memcpy(out + i * 4, &w, 4);
	}
	memcpy(out, &h, sizeof(h) < l->token_bytes ? sizeof(h) : l->token_bytes);
}

/* "client 3 commit #17 of user 5001 position 40", or what the bytes are. */
static void token_describe(const struct kvp_layout *l, const uint8_t *tok,
			   char *buf, size_t len)
{
	struct token_hdr h;
	uint8_t *again;

	memcpy(&h, tok, sizeof(h));
	if (h.magic != MAGIC) {
		snprintf(buf, len, "no write of this test (first word 0x%08x)",
			 h.magic);
		return;
	}
	again = malloc(l->token_bytes);
	if (!again) {
		snprintf(buf, len, "?");
		return;
	}
	uint64_t pos = h.pos_lo | ((uint64_t)h.pos_hi << 32);
	token_fill(l, h.client, h.seq, h.user, pos, again);
	snprintf(buf, len, "client %u commit #%u of user %u position %" PRIu64
		 "%s", h.client, h.seq, h.user, pos,
		 memcmp(again, tok, l->token_bytes) ? " (header only: the rest"
		 " is torn)" : "");
	free(again);
}

/* ------------------------------------------------------------ a client */

struct client {
	int id;
	struct kvp_client *c;
	const struct kvp_layout *l;
	struct client_log *log;
	struct h_rng r;
	uint64_t end[USERS];   /* where each history ended when last seen */
	uint8_t *kv;           /* MAX_NEW tokens */
};

static uint64_t tag_of(int op, int u)
{
	return ((uint64_t)op << 8) | (uint64_t)u;
}

/* A new end seen for user u; it must not go back. */
static int saw_end(struct client *cl, int u, uint64_t end, const char *how)
{
	if (end < cl->end[u]) {
		h_fail("user %u: %s says the history ends at %" PRIu64 ", but it"
		       " ended at %" PRIu64 " before (histories only grow here)",
		       USER0 + u, how, end, cl->end[u]);
		return -1;
	}
	cl->end[u] = end;
	return 0;
}

/* A lost prepare: -EBUSY or an overlap are the race; anything else fails. */
static int prepare_lost(struct client *cl, int u, uint64_t pos, uint32_t n,
			int res, const char *msg)
{
	if (res == -EBUSY) {
		cl->log->lost_busy++;
		return 0;
	}
	if (res == -EINVAL && strstr(msg, "overlapping tokens")) {
		cl->log->lost_overlap++;
		return 0;
	}
	h_fail("user %u: prepare(%" PRIu64 ", %u) from the end last seen: %d"
	       " (%s)%s", USER0 + u, pos, n, res, msg,
	       strstr(msg, "missing tokens") ? " - the history ended past this"
	       " before, so it went back" : "");
	return -1;
}

/* Write all n reserved tokens, though only the first k will be committed:
 * the slots a partial commit gives back then hold this client's bytes,
 * which the next writer of those positions must overwrite. */
static int write_tokens(struct client *cl, const struct kvp_lease *ls, int u,
			uint64_t pos, uint32_t n)
{
	uint32_t seq = cl->log->ncommits;
	for (uint32_t i = 0; i < n; i++)
		token_fill(cl->l, (uint32_t)cl->id, seq, USER0 + u, pos + i,
			   cl->kv + (size_t)i * cl->l->token_bytes);
	uint32_t half = (uint32_t)h_rng_below(&cl->r, n + 1);
	int rc = kvp_append(cl->c, ls, 0, half, cl->kv);
	if (rc == 0)
		rc = kvp_append(cl->c, ls, half, n - half,
				cl->kv + (size_t)half * cl->l->token_bytes);
	if (rc < 0)
		h_fail("user %u: append of %u tokens at %" PRIu64 ": %d (%s)",
		       USER0 + u, n, pos, rc, kvp_last_error(cl->c));
	return rc;
}

static void log_commit(struct client *cl, int u, uint64_t pos, uint32_t k)
{
	struct client_log *lg = cl->log;
	lg->rec[lg->ncommits] = (struct commit_rec){ (uint32_t)u, k, pos };
	__atomic_store_n(&lg->ncommits, lg->ncommits + 1, __ATOMIC_RELEASE);
}

/* Reap exactly n completions into out. */
static int reap_n(struct client *cl, struct kvp_completion *out, int n)
{
	for (int got = 0; got < n;) {
		int k = kvp_reap(cl->c, out + got, (uint32_t)(n - got), 1);
		if (k <= 0) {
			h_fail("reap: %d (%s)", k, kvp_last_error(cl->c));
			return -1;
		}
		got += k;
	}
	return 0;
}

static int queue_ok(struct client *cl, int rc, const char *what)
{
	if (rc < 0)
		h_fail("queue %s: %d (%s)", what, rc, kvp_last_error(cl->c));
	return rc < 0 ? -1 : 0;
}

/* One round through the ring, what it asked and won per user. */
struct round {
	int order[USERS];      /* the users in the order their entries go */
	uint64_t pos[USERS];
	uint32_t n[USERS];     /* reserved */
	uint32_t k[USERS];     /* committed */
	int won[USERS];
	uint64_t lease[USERS];
};

/*
 * Per user, completions must come back in queue order (op codes rise in
 * the order they are queued within a batch). Returns the op, or -1.
 */
static int check_op_order(const struct kvp_completion *cp, int *last_op)
{
	int u = (int)(cp->tag & 0xff), op = (int)(cp->tag >> 8);
	if (u >= USERS || op < OP_PREP || op > OP_INFO) {
		h_fail("a completion with a tag never queued: %#" PRIx64, cp->tag);
		return -1;
	}
	if (op <= last_op[u]) {
		h_fail("user %u: the completion of op %d came after that of op %d,"
		       " queued later (1 prepare, 2 info after it, 3 commit, 4"
		       " release, 5 info after them)", USER0 + u, op, last_op[u]);
		return -1;
	}
	last_op[u] = op;
	return op;
}

/* Submit what was queued and reap all of it. */
static int submit_reap(struct client *cl, struct kvp_completion *comp, int n)
{
	if (kvp_submit(cl->c) != n) {
		h_fail("submit of %d: %s", n, kvp_last_error(cl->c));
		return -1;
	}
	return reap_n(cl, comp, n);
}

/*
 * First batch: PREPARE of every user from the end last seen, each followed
 * by an INFO of the same user. A won prepare holds the user's reservation,
 * so that INFO must say the history still ends where the lease starts.
 */
static int batch_prepare(struct client *cl, struct round *rd)
{
	struct kvp_completion comp[2 * USERS];
	int last_op[USERS] = { 0 };
	for (int i = 0; i < USERS; i++) {
		int u = rd->order[i];
		rd->pos[u] = cl->end[u];
		rd->n[u] = 1 + (uint32_t)h_rng_below(&cl->r, MAX_NEW);
		rd->won[u] = 0;
		if (queue_ok(cl, kvp_queue_prepare(cl->c, USER0 + u, rd->pos[u],
				rd->n[u], tag_of(OP_PREP, u)), "prepare") ||
		    queue_ok(cl, kvp_queue_info(cl->c, USER0 + u,
				tag_of(OP_INFO_PREP, u)), "info"))
			return -1;
	}
	if (submit_reap(cl, comp, 2 * USERS))
		return -1;
	for (int i = 0; i < 2 * USERS; i++) {
		const struct kvp_completion *cp = &comp[i];
		int u = (int)(cp->tag & 0xff), op = check_op_order(cp, last_op);
		const char *msg = cp->error ? cp->error : "";
		if (op < 0)
			return -1;
		if (op == OP_INFO_PREP) {
			uint64_t end = cp->info.len ? cp->info.start + cp->info.len : 0;
			if (cp->res < 0 || (rd->won[u] && end != rd->pos[u])) {
				h_fail("user %u: the INFO queued after our won prepare"
				       " from %" PRIu64 ": %d (%s), history ends at %"
				       PRIu64 " - someone committed under our"
				       " reservation", USER0 + u, rd->pos[u], cp->res,
				       msg, end);
				return -1;
			}
			if (saw_end(cl, u, end, "an INFO"))
				return -1;
			continue;
		}
		if (cp->res < 0) {
			if (prepare_lost(cl, u, rd->pos[u], rd->n[u], cp->res, msg))
				return -1;
			continue;
		}
		const struct kvp_lease *ls = &cp->lease;
		if (ls->start + ls->len != rd->pos[u] || ls->n_new != rd->n[u]) {
			h_fail("user %u: won a lease for %u tokens from %" PRIu64
			       " but it covers start %" PRIu64 " len %" PRIu64
			       " n_new %u", USER0 + u, rd->n[u], rd->pos[u],
			       ls->start, ls->len, ls->n_new);
			return -1;
		}
		if (write_tokens(cl, ls, u, rd->pos[u], rd->n[u]))
			return -1;
		rd->won[u] = 1;
		rd->lease[u] = ls->id;
		rd->k[u] = 1 + (uint32_t)h_rng_below(&cl->r, rd->n[u]);
		/* Commits are logged in the order they are made, so the
		 * next commit's number is fixed here: one at a time. */
		log_commit(cl, u, rd->pos[u], rd->k[u]);
	}
	return 0;
}

/*
 * Second batch, in the same user order: COMMIT with the release flag (or
 * COMMIT then RELEASE) of each user won, and an INFO of every user, which
 * must see our commit where there was one.
 */
static int batch_commit(struct client *cl, struct round *rd)
{
	struct kvp_completion comp[3 * USERS];
	int last_op[USERS] = { 0 }, queued = 0;
	for (int i = 0; i < USERS; i++) {
		int u = rd->order[i];
		int split = (int)h_rng_below(&cl->r, 2);
		if (rd->won[u]) {
			if (queue_ok(cl, kvp_queue_commit(cl->c, rd->lease[u], rd->k[u],
					!split, tag_of(OP_COMMIT, u)), "commit"))
				return -1;
			queued++;
		}
		if (rd->won[u] && split) {
			if (queue_ok(cl, kvp_queue_release(cl->c, rd->lease[u],
					tag_of(OP_RELEASE, u)), "release"))
				return -1;
			queued++;
		}
		if (queue_ok(cl, kvp_queue_info(cl->c, USER0 + u,
						tag_of(OP_INFO, u)), "info"))
			return -1;
		queued++;
	}
	if (submit_reap(cl, comp, queued))
		return -1;
	for (int i = 0; i < queued; i++) {
		const struct kvp_completion *cp = &comp[i];
		int u = (int)(cp->tag & 0xff), op = check_op_order(cp, last_op);
		const char *msg = cp->error ? cp->error : "";
		if (op < 0)
			return -1;
		if (cp->res < 0) {
			h_fail("user %u: %s (lease %#" PRIx64 ", %u tokens at %" PRIu64
			       "): %d (%s)", USER0 + u, op == OP_COMMIT ? "commit" :
			       op == OP_RELEASE ? "release" : "info", rd->lease[u],
			       rd->k[u], rd->pos[u], cp->res, msg);
			return -1;
		}
		if (op != OP_INFO)
			continue;
		uint64_t end = cp->info.len ? cp->info.start + cp->info.len : 0;
		if (rd->won[u] && end < rd->pos[u] + rd->k[u]) {
			h_fail("user %u: the INFO queued right after our commit of [%"
			       PRIu64 ", %" PRIu64 ") says the history ends at %"
			       PRIu64 ": it ran before the commit", USER0 + u,
			       rd->pos[u], rd->pos[u] + rd->k[u], end);
			return -1;
		}
		if (saw_end(cl, u, end, "an INFO"))
			return -1;
	}
	return 0;
}

/* One round through the ring: the two batches, users in a random order
 * so that their entries interleave differently each time. */
static int round_async(struct client *cl)
{
	struct round rd;
	for (int i = 0; i < USERS; i++)
		rd.order[i] = i;
	for (int i = USERS - 1; i > 0; i--) {
		int j = (int)h_rng_below(&cl->r, (uint64_t)i + 1);
		int t = rd.order[i];
		rd.order[i] = rd.order[j];
		rd.order[j] = t;
	}
	if (batch_prepare(cl, &rd) || batch_commit(cl, &rd))
		return -1;
	cl->log->rounds_async++;
	return 0;
}

/* One synchronous cycle on one user. */
static int round_sync(struct client *cl)
{
	int u = (int)h_rng_below(&cl->r, USERS);
	struct kvp_user_info ui;
	struct kvp_lease ls;
	int rc = kvp_info(cl->c, USER0 + u, &ui);
	if (rc < 0) {
		h_fail("user %u: info: %d (%s)", USER0 + u, rc, kvp_last_error(cl->c));
		return -1;
	}
	if (saw_end(cl, u, ui.len ? ui.start + ui.len : 0, "kvp_info"))
		return -1;
	uint64_t pos = cl->end[u];
	uint32_t n = 1 + (uint32_t)h_rng_below(&cl->r, MAX_NEW);
	rc = kvp_prepare(cl->c, USER0 + u, pos, n, &ls);
	if (rc < 0)
		return prepare_lost(cl, u, pos, n, rc, kvp_last_error(cl->c));
	if (ls.start + ls.len != pos || ls.n_new != n) {
		h_fail("user %u: won a lease for %u tokens from %" PRIu64 " but it"
		       " covers start %" PRIu64 " len %" PRIu64 " n_new %u",
		       USER0 + u, n, pos, ls.start, ls.len, ls.n_new);
		return -1;
	}
	if (write_tokens(cl, &ls, u, pos, n))
		return -1;
	uint32_t k = 1 + (uint32_t)h_rng_below(&cl->r, n);
	log_commit(cl, u, pos, k);
	rc = kvp_commit(cl->c, ls.id, k);
	if (rc == 0)
		rc = kvp_release(cl->c, ls.id);
	if (rc < 0) {
		h_fail("user %u: commit of %u tokens at %" PRIu64 " / release: %d"
		       " (%s)", USER0 + u, k, pos, rc, kvp_last_error(cl->c));
		return -1;
	}
	/* Our commit is in: the end is at least past it. */
	if (saw_end(cl, u, pos + k, "our own commit"))
		return -1;
	cl->log->rounds_sync++;
	return 0;
}

static int client_main(void *arg)
{
	struct client cl = { .id = (int)(intptr_t)arg };
	char name[32];
	snprintf(name, sizeof(name), "client-%d", cl.id);
	h_set_name(name);
	cl.log = &g->log[cl.id];
	cl.c = h_connect_or_fail(g_sock, name, 5000);
	if (!cl.c)
		return H_FAIL;
	cl.l = kvp_client_layout(cl.c);
	cl.kv = malloc((size_t)MAX_NEW * cl.l->token_bytes);
	int result = H_FAIL;
	if (!cl.kv) {
		h_fail("out of memory");
		goto out;
	}
	h_rng_seed(&cl.r, 0x0bde7000ull + (uint64_t)cl.id);
	while (!__atomic_load_n(&g->go, __ATOMIC_ACQUIRE))
		h_sleep_us(100);
	uint64_t deadline = h_now_ms() + 60000;
	while (cl.log->ncommits < WINS) {
		if (h_now_ms() > deadline) {
			h_fail("only %u commits in 60 s", cl.log->ncommits);
			goto out;
		}
		/* The async round can win up to USERS commits. */
		int rc = WINS - cl.log->ncommits >= USERS &&
			 h_rng_below(&cl.r, 4) ? round_async(&cl) : round_sync(&cl);
		if (rc)
			goto out;
	}
	result = H_PASS;
out:
	free(cl.kv);
	kvp_close(cl.c);
	return result;
}

/* ------------------------------------------------------------ the checks */

struct owner {
	uint32_t client, seq, n;
	uint64_t pos;
};

static int cmp_owner(const void *a, const void *b)
{
	const struct owner *x = a, *y = b;
	return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Each client's positions per user strictly increase. */
static int check_client_order(void)
{
	int bad = 0;
	for (int c = 0; c < CLIENTS; c++) {
		const struct client_log *lg = &g->log[c];
		uint64_t next[USERS] = { 0 };
		int seen[USERS] = { 0 };
		for (uint32_t i = 0; i < lg->ncommits; i++) {
			const struct commit_rec *r = &lg->rec[i];
			if (seen[r->u] && r->pos < next[r->u]) {
				h_fail("client %d: commit #%u of user %u at %" PRIu64
				       " is not past its commit before it, which ended"
				       " at %" PRIu64, c, i, USER0 + r->u, r->pos,
				       next[r->u]);
				bad = 1;
			}
			seen[r->u] = 1;
			next[r->u] = r->pos + r->n;
		}
	}
	return bad ? -1 : 0;
}

/* The logged commits of user u, sorted, must tile [0, len). */
static int check_tiling(int u, struct owner *own, uint32_t nown, uint64_t len,
			uint64_t start)
{
	uint64_t at = 0;
	if (start != 0 && len) {
		h_fail("user %u: history starts at %" PRIu64 ", expected 0",
		       USER0 + u, start);
		return -1;
	}
	for (uint32_t i = 0; i < nown; i++) {
		const struct owner *o = &own[i];
		if (o->pos != at) {
			h_fail("user %u: client %u commit #%u covers [%" PRIu64 ", %"
			       PRIu64 ") but the commits before it end at %" PRIu64
			       " (%s)", USER0 + u, o->client, o->seq, o->pos,
			       o->pos + o->n, at, o->pos < at ? "two commits of the"
			       " same positions" : "a gap no commit filled");
			return -1;
		}
		at += o->n;
	}
	if (at != len) {
		h_fail("user %u: the history holds %" PRIu64 " tokens but the %u"
		       " commits the clients logged add up to %" PRIu64,
		       USER0 + u, len, nown, at);
		return -1;
	}
	return 0;
}

/* Read every token of user u through a read-only lease and compare it
 * with the write of the commit that covers it. */
static int check_bytes(struct kvp_client *c, int u, const struct owner *own,
		       uint32_t nown, uint64_t len)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	uint32_t P = l->page_tokens;
	struct kvp_lease ls;
	int rc = kvp_prepare(c, USER0 + u, len, 0, &ls);
	if (rc < 0) {
		h_fail("user %u: read-only prepare at %" PRIu64 ": %d (%s)",
		       USER0 + u, len, rc, kvp_last_error(c));
		return -1;
	}
	int ret = 0, bad = 0;
	uint64_t want_pages = (len + P - 1) / P;
	uint8_t *got = malloc(l->token_bytes), *want = malloc(l->token_bytes);
	if (!got || !want) {
		h_fail("out of memory");
		ret = -1;
		goto out;
	}
	if (ls.npages != want_pages || ls.len != len) {
		h_fail("user %u: the read-only lease has %u pages and len %" PRIu64
		       "; %" PRIu64 " tokens need %" PRIu64 " pages", USER0 + u,
		       ls.npages, ls.len, len, want_pages);
		ret = -1;
		goto out;
	}
	for (uint32_t i = 0; i < nown && bad < 5; i++) {
		const struct owner *o = &own[i];
		for (uint32_t t = 0; t < o->n && bad < 5; t++) {
			uint64_t p = o->pos + t;
			struct kvp_slot s = { (uint32_t)ls.indices[p / P],
					      (uint32_t)(p % P) };
			kvp_read_cpu(l, kvp_device_base(c), &s, 1, got);
			token_fill(l, o->client, o->seq, USER0 + u, p, want);
			if (memcmp(got, want, l->token_bytes) == 0)
				continue;
			char gotd[160];
			uint64_t b = 0;
			while (got[b] == want[b])
				b++;
			token_describe(l, got, gotd, sizeof(gotd));
			h_fail("user %u position %" PRIu64 " (page %" PRIu64 ", frame"
			       " %u slot %u): expected client %u commit #%u (of [%"
			       PRIu64 ", %" PRIu64 ")), got %s; first difference at"
			       " byte %" PRIu64 ": 0x%02x, expected 0x%02x",
			       USER0 + u, p, p / P, s.frame, s.slot, o->client,
			       o->seq, o->pos, o->pos + o->n, gotd, b, got[b],
			       want[b]);
			bad++;
			ret = -1;
		}
	}
out:
	free(got);
	free(want);
	rc = kvp_release(c, ls.id);
	if (rc < 0) {
		h_fail("user %u: release of the read-only lease: %d (%s)",
		       USER0 + u, rc, kvp_last_error(c));
		ret = -1;
	}
	return ret;
}

static int check_all(const struct h_daemon *d, struct kvp_client *c)
{
	int fail = check_client_order() ? 1 : 0;
	uint64_t commits = 0, tokens = 0, pages = 0;
	struct owner *own = calloc((size_t)CLIENTS * WINS, sizeof(*own));
	if (!own) {
		h_fail("out of memory");
		return 1;
	}
	for (int u = 0; u < USERS; u++) {
		uint32_t nown = 0;
		for (int cl = 0; cl < CLIENTS; cl++)
			for (uint32_t i = 0; i < g->log[cl].ncommits; i++) {
				const struct commit_rec *r = &g->log[cl].rec[i];
				if (r->u != (uint32_t)u)
					continue;
				own[nown++] = (struct owner){ (uint32_t)cl, i, r->n,
							      r->pos };
				tokens += r->n;
			}
		commits += nown;
		qsort(own, nown, sizeof(*own), cmp_owner);
		struct kvp_user_info ui;
		int rc = kvp_info(c, USER0 + u, &ui);
		if (rc < 0) {
			h_fail("user %u: info: %d (%s)", USER0 + u, rc,
			       kvp_last_error(c));
			fail = 1;
			continue;
		}
		h_log("user %u: %" PRIu64 " tokens from %u commits, %u pages on the"
		      " device, %u on the host", USER0 + u, ui.len, nown,
		      ui.pages_device, ui.pages_host);
		pages += (ui.len + H_PAGE_TOKENS - 1) / H_PAGE_TOKENS;
		if (check_tiling(u, own, nown, ui.len, ui.start) ||
		    check_bytes(c, u, own, nown, ui.len))
			fail = 1;
	}
	free(own);

	struct kvp_stats st = { 0 };
	if (ps_settle(c, &st) || h_check_accounting(c, &st) ||
	    ps_check_kvctl(d, &st))
		fail = 1;
	if (kvp_client_is_admin(c) &&
	    ps_client_attached(c, kvp_client_id(c)) != 1) {
		h_fail("kvp_clients does not list the checker itself");
		fail = 1;
	}
	if (st.tier[KVP_TIER_DEVICE].frames_used != pages) {
		h_fail("device tier: %" PRIu64 " frames used, the %d histories need"
		       " %" PRIu64 " pages", st.tier[KVP_TIER_DEVICE].frames_used,
		       USERS, pages);
		fail = 1;
	}
	if (st.commits != commits || st.committed_tokens != tokens) {
		h_fail("stats count %" PRIu64 " commits of %" PRIu64 " tokens; the"
		       " clients logged %" PRIu64 " of %" PRIu64, st.commits,
		       st.committed_tokens, commits, tokens);
		fail = 1;
	}
	if (st.demoted_pages || st.evicted_pages) {
		h_fail("%" PRIu64 " pages demoted and %" PRIu64 " dropped in a device"
		       " tier that holds everything", st.demoted_pages,
		       st.evicted_pages);
		fail = 1;
	}
	return fail;
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_user_order_workers");
	uint64_t t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	struct h_daemon d;
	if (h_daemon_up(&d, "--device_mem=64M", "--host_mem=16M",
			"--workers=" WORKERS, (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	int fail = 0;
	pid_t pids[CLIENTS];
	for (int i = 0; i < CLIENTS; i++)
		pids[i] = h_fork(client_main, (void *)(intptr_t)i);
	__atomic_store_n(&g->go, 1, __ATOMIC_RELEASE);
	if (h_wait_all(pids, CLIENTS, 90000)) {
		h_fail("a client failed");
		fail = 1;
	}
	uint64_t busy = 0, overlap = 0, ra = 0, rs = 0;
	for (int i = 0; i < CLIENTS; i++) {
		busy += g->log[i].lost_busy;
		overlap += g->log[i].lost_overlap;
		ra += g->log[i].rounds_async;
		rs += g->log[i].rounds_sync;
	}
	h_log("%d clients x %d commits in %" PRIu64 " ring rounds and %" PRIu64
	      " synchronous cycles; prepares lost: %" PRIu64 " -EBUSY, %" PRIu64
	      " overlapping", CLIENTS, WINS, ra, rs, busy, overlap);
	if (!fail && busy + overlap == 0) {
		h_fail("no prepare ever lost: the clients did not race");
		fail = 1;
	}

	struct kvp_client *c = h_connect_or_fail(d.sock, "checker", 5000);
	if (!c) {
		h_daemon_kill(&d);
		return H_FAIL;
	}
	if (check_all(&d, c))
		fail = 1;
	kvp_close(c);
	return h_daemon_finish(&d, fail, t0);
}
