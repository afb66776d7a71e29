/* SPDX-License-Identifier: MIT */
/*
 * test_stale_lease - a lease is a handle the library checks (issue 11,
 * "Data that ends up wrong"), against a real kvpoold on a device tier of a
 * few frames, so that a frame given back is soon another user's:
 *
 *   a. prepare(0, 20), append 20, commit 10, then append tokens 0-9 (and
 *      10-19) again through the same lease: -ESTALE, the committed tokens
 *      unchanged; a second commit is -ESTALE too;
 *   b. A releases its lease, B prepares and gets the same frame, A appends
 *      through its released lease: -ESTALE, B's tokens unchanged;
 *   c. A commits, releases, the user is evicted, B's user takes the page,
 *      A's stale append: -ESTALE, B's tokens unchanged;
 *   d. two sync prepares, then appends through the first lease: they land
 *      in its own pages, not through the second lease's page table (which
 *      the arena now holds where the first one's was);
 *   e. kvp_seq_free under the sequence's held write lease is -EBUSY and
 *      the lease keeps its pages (another user's tokens written meanwhile
 *      stay intact when it appends); after a release the free passes and
 *      the lease is -ESTALE;
 *   f. another client's lease: append and commit -ESTALE, release -EPERM;
 *      an async commit ends the lease for writes at once;
 *   g. a randomized model: 3 clients, 8 users, thousands of prepares,
 *      appends (through good leases and through stale or foreign ones, with
 *      garbage bytes), commits (sync and async), releases and evictions,
 *      each result checked against a reference of which leases are open;
 *      every 200 steps everything is released and every user's committed
 *      bytes are read back and compared with what the good appends wrote.
 *
 * Each good token's bytes are h_tokens_fill(SALT, user, pos); garbage is
 * h_tokens_fill(GARBAGE, ...), so any stale write that landed shows up in
 * h_verify_user.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SALT 0x5a17ull
#define GARBAGE 0xbadbadull
#define MAX_TOKENS 64u

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

static unsigned char g_buf[MAX_TOKENS * 256];

/* Append tokens [first, first + n) of lease l with good or garbage bytes. */
static int put(struct kvp_client *c, const struct kvp_lease *l, uint32_t first,
	       uint32_t n, uint64_t salt)
{
	const struct kvp_layout *lay = kvp_client_layout(c);

	h_tokens_fill(lay, salt, l->user, l->start + l->len + first, n, g_buf);
	return kvp_append(c, l, first, n, g_buf);
}

/* A fresh history of n good tokens for user, committed and released. */
static int history(struct kvp_client *c, uint64_t user, uint32_t n,
		   int32_t *frame0)
{
	struct kvp_lease l;

	if (kvp_prepare(c, user, 0, n, &l) || put(c, &l, 0, n, SALT) ||
	    kvp_commit(c, l.id, n)) {
		h_fail("user %" PRIu64 ": history of %u tokens: %s", user, n,
		       kvp_last_error(c));
		g_bad++;
		return -1;
	}
	if (frame0)
		*frame0 = l.indices[0];
	return kvp_release(c, l.id);
}

static void expect_stale(struct kvp_client *c, int rc, const struct kvp_lease *l,
			 const char *what)
{
	char id[32];

	snprintf(id, sizeof(id), "%#" PRIx64, l->id);
	CHECK(rc == -ESTALE && strstr(kvp_last_error(c), id),
	      "%s: %d '%s'; want -ESTALE naming lease %s", what, rc,
	      kvp_last_error(c), id);
}

static void verify(struct kvp_client *c, uint64_t user, uint64_t len,
		   const char *what)
{
	if (h_verify_user(c, SALT, user, UINT64_MAX, len, NULL)) {
		h_fail("%s: user %" PRIu64 "'s committed tokens changed", what, user);
		g_bad++;
	}
}

static void case_a_append_after_commit(struct kvp_client *c)
{
	struct kvp_lease l;

	CHECK(kvp_prepare(c, 1, 0, 20, &l) == 0, "a: prepare: %s", kvp_last_error(c));
	CHECK(put(c, &l, 0, 20, SALT) == 0, "a: append: %s", kvp_last_error(c));
	CHECK(kvp_commit(c, l.id, 10) == 0, "a: commit: %s", kvp_last_error(c));
	expect_stale(c, put(c, &l, 0, 10, GARBAGE), &l, "a: append 0-9 after commit");
	expect_stale(c, put(c, &l, 10, 10, GARBAGE), &l, "a: append 10-19 after commit");
	CHECK(strstr(kvp_last_error(c), "committed 10 of its 20"),
	      "a: the message says what was committed: '%s'", kvp_last_error(c));
	expect_stale(c, kvp_commit(c, l.id, 20), &l, "a: a second commit");
	CHECK(kvp_release(c, l.id) == 0, "a: release: %s", kvp_last_error(c));
	verify(c, 1, 10, "a");
}

static void case_b_released_lease(struct kvp_client *a, struct kvp_client *b)
{
	struct kvp_lease la, lb;
	int32_t fa;

	CHECK(kvp_prepare(a, 2, 0, 16, &la) == 0, "b: prepare A: %s", kvp_last_error(a));
	fa = la.indices[0];
	CHECK(kvp_release(a, la.id) == 0, "b: release A: %s", kvp_last_error(a));
	CHECK(kvp_prepare(b, 3, 0, 16, &lb) == 0, "b: prepare B: %s", kvp_last_error(b));
	if (lb.indices[0] != fa)
		h_log("b: B got frame %d, not A's %d (the test still holds)",
		      lb.indices[0], fa);
	CHECK(put(b, &lb, 0, 16, SALT) == 0 && kvp_commit(b, lb.id, 16) == 0 &&
	      kvp_release(b, lb.id) == 0, "b: B's history: %s", kvp_last_error(b));
	expect_stale(a, put(a, &la, 0, 16, GARBAGE), &la, "b: append after release");
	CHECK(strstr(kvp_last_error(a), "not held by this client"),
	      "b: '%s'", kvp_last_error(a));
	verify(b, 3, 16, "b");
}

static void case_c_evicted(struct kvp_client *a, struct kvp_client *b)
{
	struct kvp_lease la;
	int rc;

	CHECK(kvp_prepare(a, 4, 0, 16, &la) == 0, "c: prepare: %s", kvp_last_error(a));
	CHECK(put(a, &la, 0, 8, SALT) == 0 && kvp_commit(a, la.id, 8) == 0 &&
	      kvp_release(a, la.id) == 0, "c: A's history: %s", kvp_last_error(a));
	rc = kvp_evict(a, 4, KVP_SEL_ALL);
	CHECK(rc >= 0, "c: evict: %d %s", rc, kvp_last_error(a));
	history(b, 5, 16, NULL);
	expect_stale(a, put(a, &la, 8, 8, GARBAGE), &la, "c: append after evict");
	verify(b, 5, 16, "c");
}

static void case_d_two_sync_prepares(struct kvp_client *c)
{
	struct kvp_lease l1, l2;

	CHECK(kvp_prepare(c, 6, 0, 16, &l1) == 0, "d: prepare 1: %s", kvp_last_error(c));
	CHECK(kvp_prepare(c, 7, 0, 16, &l2) == 0, "d: prepare 2: %s", kvp_last_error(c));
	CHECK(l1.indices[0] != l2.indices[0], "d: both leases name frame %d",
	      l1.indices[0]);
	CHECK(put(c, &l2, 0, 16, SALT) == 0, "d: append 2: %s", kvp_last_error(c));
	CHECK(put(c, &l1, 0, 16, SALT) == 0, "d: append 1: %s", kvp_last_error(c));
	CHECK(kvp_commit(c, l1.id, 16) == 0 && kvp_commit(c, l2.id, 16) == 0 &&
	      kvp_release(c, l1.id) == 0 && kvp_release(c, l2.id) == 0,
	      "d: commit/release: %s", kvp_last_error(c));
	verify(c, 6, 16, "d (first lease)");
	verify(c, 7, 16, "d (second lease)");
}

static void case_e_seq_free(struct kvp_client *a, struct kvp_client *b)
{
	uint32_t t[32];
	struct kvp_lease ls;
	int rc;

	for (uint32_t i = 0; i < 32; i++)
		t[i] = 7000 + i;
	CHECK(kvp_seq_alloc(a, 77, t, 32, &ls) == 0, "e: seq_alloc: %s",
	      kvp_last_error(a));
	rc = kvp_seq_free(a, 77);
	CHECK(rc == -EBUSY && strstr(kvp_last_error(a), "write lease"),
	      "e: seq_free under its write lease: %d '%s'; want -EBUSY", rc,
	      kvp_last_error(a));
	/* Were the free let through, these frames would be B's now. */
	history(b, 8, 32, NULL);
	CHECK(kvp_append(a, &ls, 0, 32, g_buf) == 0,
	      "e: the lease is still held: append: %s", kvp_last_error(a));
	verify(b, 8, 32, "e");
	CHECK(kvp_commit(a, ls.id, 32) == 0 && kvp_release(a, ls.id) == 0,
	      "e: commit/release: %s", kvp_last_error(a));
	CHECK(kvp_seq_free(a, 77) == 0, "e: seq_free after release: %s",
	      kvp_last_error(a));
	expect_stale(a, kvp_append(a, &ls, 0, 1, g_buf), &ls, "e: append after free");
}

static void case_f_foreign_and_async(struct kvp_client *a, struct kvp_client *b)
{
	struct kvp_completion cq;
	struct kvp_lease la;
	int rc;

	CHECK(kvp_prepare(a, 9, 0, 16, &la) == 0, "f: prepare: %s", kvp_last_error(a));
	expect_stale(b, put(b, &la, 0, 16, GARBAGE), &la, "f: B appends through A's lease");
	expect_stale(b, kvp_commit(b, la.id, 16), &la, "f: B commits A's lease");
	rc = kvp_release(b, la.id);
	CHECK(rc == -EPERM, "f: B releases A's lease: %d '%s'", rc, kvp_last_error(b));
	CHECK(put(a, &la, 0, 16, SALT) == 0, "f: A's append: %s", kvp_last_error(a));
	CHECK(kvp_queue_commit(a, la.id, 16, 1, 1) == 0, "f: queue_commit: %s",
	      kvp_last_error(a));
	expect_stale(a, put(a, &la, 0, 16, GARBAGE), &la, "f: append with a commit queued");
	CHECK(kvp_submit(a) == 1 && kvp_reap(a, &cq, 1, 1) == 1 && cq.res == 0,
	      "f: reap: %s", kvp_last_error(a));
	expect_stale(a, put(a, &la, 0, 16, GARBAGE), &la, "f: append after commit+release");
	verify(a, 9, 16, "f");
}

/* ------------------------------------------------------------ model */

#define M_CLIENTS 3
#define M_USERS 8
#define M_LEASES 48
#define M_STEPS 6000

enum { L_OPEN = 1, L_CLOSED, L_GONE };

struct m_lease {
	int used;
	int owner;               /* client index */
	int state;
	uint32_t written;        /* good tokens appended from 0 */
	struct kvp_lease l;      /* as the library handed it out */
};

struct model {
	struct kvp_client *c[M_CLIENTS];
	struct m_lease ls[M_LEASES];
	struct h_rng rng;
	uint64_t step;
	char op[160];
	/* what the run did: a model that did nothing proves nothing */
	uint64_t prepared, busy, appended, stale_appends, committed,
		 stale_commits, released, evicted, readbacks;
};

#define MCHECK(m, cond, ...) do { if (!(cond)) { \
	h_fail("model step %" PRIu64 " (%s):", (m)->step, (m)->op); \
	h_fail(__VA_ARGS__); g_bad++; } } while (0)

static uint64_t below(struct model *m, uint64_t n)
{
	return h_rng_below(&m->rng, n);
}

/* Whether some lease of user holds an uncommitted reservation. */
static int user_writer(const struct model *m, uint64_t user)
{
	for (int i = 0; i < M_LEASES; i++)
		if (m->ls[i].used && m->ls[i].l.user == user &&
		    m->ls[i].state == L_OPEN && m->ls[i].l.n_new)
			return 1;
	return 0;
}

static int user_leased(const struct model *m, uint64_t user)
{
	for (int i = 0; i < M_LEASES; i++)
		if (m->ls[i].used && m->ls[i].l.user == user &&
		    m->ls[i].state != L_GONE)
			return 1;
	return 0;
}

static struct m_lease *slot_for_new(struct model *m)
{
	for (int i = 0; i < M_LEASES; i++)
		if (!m->ls[i].used)
			return &m->ls[i];
	/* Full: forget a released one (its stale handle has served). */
	for (int i = 0; i < M_LEASES; i++)
		if (m->ls[i].state == L_GONE)
			return &m->ls[i];
	return NULL;
}

static struct m_lease *pick(struct model *m)
{
	/* Mostly a held lease (the good paths), else any (the stale ones). */
	if (below(m, 4)) {
		uint32_t at = (uint32_t)below(m, M_LEASES);

		for (uint32_t i = 0; i < M_LEASES; i++) {
			struct m_lease *x = &m->ls[(at + i) % M_LEASES];

			if (x->used && x->state != L_GONE)
				return x;
		}
	}
	for (int tries = 0; tries < 8; tries++) {
		struct m_lease *x = &m->ls[below(m, M_LEASES)];

		if (x->used)
			return x;
	}
	return NULL;
}

static void m_prepare(struct model *m)
{
	int ci = (int)below(m, M_CLIENTS);
	uint64_t user = 100 + below(m, M_USERS);
	uint32_t n = (uint32_t)below(m, 40); /* 0: a read lease */
	struct kvp_client *c = m->c[ci];
	struct m_lease *x = slot_for_new(m);
	struct kvp_user_info ui;
	struct kvp_lease l;
	int writer, rc;

	if (!x)
		return;
	snprintf(m->op, sizeof(m->op), "client %d prepare user %" PRIu64 " n %u",
		 ci, user, n);
	rc = kvp_info(c, user, &ui);
	MCHECK(m, rc == 0, "info: %s", kvp_last_error(c));
	writer = user_writer(m, user);
	rc = kvp_prepare(c, user, ui.start + ui.len, n, &l);
	if (n && writer) {
		MCHECK(m, rc == -EBUSY, "a second writer of user %" PRIu64 ": %d '%s'",
		       user, rc, kvp_last_error(c));
		m->busy++;
		return;
	}
	MCHECK(m, rc == 0 || rc == -ENOMEM, "prepare: %d '%s'", rc, kvp_last_error(c));
	if (rc)
		return;
	m->prepared++;
	*x = (struct m_lease){ .used = 1, .owner = ci, .state = L_OPEN, .l = l };
}

static void m_append(struct model *m)
{
	struct m_lease *x = pick(m);
	int ci, good, rc;
	uint32_t first, n;

	if (!x)
		return;
	ci = below(m, 5) ? x->owner : (int)below(m, M_CLIENTS);
	good = ci == x->owner && x->state == L_OPEN;
	if (good && x->written < x->l.n_new && below(m, 4)) {
		first = x->written;
		n = 1 + (uint32_t)below(m, x->l.n_new - first);
	} else {
		good = good && !x->l.n_new; /* nothing left to write: n 0 */
		first = x->l.n_new ? (uint32_t)below(m, x->l.n_new) : 0;
		n = x->l.n_new ? 1 + (uint32_t)below(m, x->l.n_new - first) : 0;
		if (ci == x->owner && x->state == L_OPEN && n) {
			/* Rewriting written slots of an open lease is allowed
			 * (they are its own); write the good bytes again. */
			rc = put(m->c[ci], &x->l, first, n, SALT);
			snprintf(m->op, sizeof(m->op), "client %d rewrite lease %#" PRIx64
				 " [%u, %u)", ci, x->l.id, first, first + n);
			MCHECK(m, rc == 0, "rewrite: %d '%s'", rc, kvp_last_error(m->c[ci]));
			if (!rc && first <= x->written && first + n > x->written)
				x->written = first + n;
			return;
		}
	}
	snprintf(m->op, sizeof(m->op), "client %d append lease %#" PRIx64 " (owner %d, "
		 "state %d) [%u, %u)", ci, x->l.id, x->owner, x->state, first, first + n);
	rc = put(m->c[ci], &x->l, first, n, good ? SALT : GARBAGE);
	if (good) {
		MCHECK(m, rc == 0, "append: %d '%s'", rc, kvp_last_error(m->c[ci]));
		if (!rc && first + n > x->written)
			x->written = first + n;
		m->appended++;
	} else {
		MCHECK(m, rc == -ESTALE || (n == 0 && rc == 0),
		       "stale append: %d '%s'; want -ESTALE", rc,
		       kvp_last_error(m->c[ci]));
		m->stale_appends += n > 0;
	}
}

static void m_commit(struct model *m)
{
	struct m_lease *x = pick(m);
	int ci, good, async, release, rc;
	uint32_t k;

	if (!x)
		return;
	ci = below(m, 6) ? x->owner : (int)below(m, M_CLIENTS);
	good = ci == x->owner && x->state == L_OPEN;
	k = below(m, 4) ? x->written : (uint32_t)below(m, x->written + 1);
	async = (int)below(m, 2);
	release = async && below(m, 2);
	snprintf(m->op, sizeof(m->op), "client %d %scommit%s lease %#" PRIx64
		 " (owner %d, state %d) k %u", ci, async ? "async " : "",
		 release ? "+release" : "", x->l.id, x->owner, x->state, k);
	if (async) {
		struct kvp_completion cq;

		rc = kvp_queue_commit(m->c[ci], x->l.id, k, release, 1);
		if (!rc) {
			MCHECK(m, kvp_submit(m->c[ci]) == 1, "submit");
			MCHECK(m, kvp_reap(m->c[ci], &cq, 1, 1) == 1, "reap: %s",
			       kvp_last_error(m->c[ci]));
			rc = cq.res;
		}
	} else {
		rc = kvp_commit(m->c[ci], x->l.id, k);
	}
	if (!good) {
		MCHECK(m, rc == -ESTALE, "stale commit: %d '%s'; want -ESTALE", rc,
		       kvp_last_error(m->c[ci]));
		m->stale_commits++;
		return;
	}
	MCHECK(m, rc == 0, "commit: %d '%s'", rc, kvp_last_error(m->c[ci]));
	if (!rc)
		x->state = release ? L_GONE : L_CLOSED;
	m->committed += k;
}

static void m_release(struct model *m, struct m_lease *x, int ci)
{
	int rc;

	snprintf(m->op, sizeof(m->op), "client %d release lease %#" PRIx64
		 " (owner %d, state %d)", ci, x->l.id, x->owner, x->state);
	rc = kvp_release(m->c[ci], x->l.id);
	if (ci != x->owner && x->state != L_GONE)
		MCHECK(m, rc == -EPERM, "foreign release: %d '%s'", rc,
		       kvp_last_error(m->c[ci]));
	else if (x->state == L_GONE)
		MCHECK(m, rc == -ENOENT || rc == -EPERM, "release of a released "
		       "lease: %d '%s'", rc, kvp_last_error(m->c[ci]));
	else
		MCHECK(m, rc == 0, "release: %d '%s'", rc, kvp_last_error(m->c[ci]));
	if (ci == x->owner && x->state != L_GONE)
		m->released++;
	if (ci == x->owner)
		x->state = L_GONE;
}

static void m_evict(struct model *m)
{
	int ci = (int)below(m, M_CLIENTS);
	uint64_t user = 100 + below(m, M_USERS);
	int rc;

	snprintf(m->op, sizeof(m->op), "client %d evict user %" PRIu64, ci, user);
	rc = kvp_evict(m->c[ci], user, KVP_SEL_ALL);
	if (user_leased(m, user))
		MCHECK(m, rc == -EBUSY, "evict of a leased user: %d '%s'", rc,
		       kvp_last_error(m->c[ci]));
	else
		MCHECK(m, rc >= 0 || rc == -ENOENT, "evict: %d '%s'", rc,
		       kvp_last_error(m->c[ci]));
	m->evicted += rc > 0;
}

/* Release every held lease, then read every user back. */
static void m_quiesce(struct model *m)
{
	for (int i = 0; i < M_LEASES; i++)
		if (m->ls[i].used && m->ls[i].state != L_GONE)
			m_release(m, &m->ls[i], m->ls[i].owner);
	snprintf(m->op, sizeof(m->op), "read back every user");
	for (uint64_t u = 100; u < 100 + M_USERS; u++) {
		struct kvp_user_info ui;

		verify(m->c[0], u, UINT64_MAX, "model");
		if (!kvp_info(m->c[0], u, &ui))
			m->readbacks += ui.len;
	}
}

static void run_model(const char *sock)
{
	struct model *m = calloc(1, sizeof(*m));
	char name[16];

	h_rng_seed(&m->rng, 0x57a1e1ea5eull);
	for (int i = 0; i < M_CLIENTS; i++) {
		snprintf(name, sizeof(name), "model-%d", i);
		m->c[i] = h_connect_or_fail(sock, name, 5000);
		if (!m->c[i]) {
			g_bad++;
			goto out;
		}
	}
	for (m->step = 0; m->step < M_STEPS && g_bad < 5; m->step++) {
		uint64_t r = below(m, 100);
		struct m_lease *x;

		if (r < 22)
			m_prepare(m);
		else if (r < 62)
			m_append(m);
		else if (r < 80)
			m_commit(m);
		else if (r < 93) {
			if ((x = pick(m)))
				m_release(m, x, below(m, 5) ? x->owner :
					  (int)below(m, M_CLIENTS));
		} else {
			m_evict(m);
		}
		if (m->step % 200 == 199)
			m_quiesce(m);
	}
	m_quiesce(m);
	h_log("model: %" PRIu64 " steps: %" PRIu64 " prepares (%" PRIu64 " -EBUSY), %"
	      PRIu64 " good appends, %" PRIu64 " stale appends refused, %" PRIu64
	      " tokens committed, %" PRIu64 " stale commits refused, %" PRIu64
	      " releases, %" PRIu64 " evictions, %" PRIu64 " tokens read back",
	      m->step, m->prepared, m->busy, m->appended, m->stale_appends,
	      m->committed, m->stale_commits, m->released, m->evicted, m->readbacks);
	CHECK(m->prepared > 500 && m->stale_appends > 500 && m->committed > 2000 &&
	      m->stale_commits > 200 && m->evicted > 20 && m->readbacks > 1000,
	      "the model run was too thin to prove anything (see the counts)");
out:
	for (int i = 0; i < M_CLIENTS; i++)
		kvp_close(m->c[i]);
	free(m);
}

int main(int argc, char **argv)
{
	struct kvp_client *a, *b;
	struct h_daemon d;
	uint64_t t0;

	h_init(argc, argv, "test_stale_lease");
	t0 = h_now_ms();
	/* 24 frames of 4 KiB and no host tier: a frame given back is reused
	 * soon, and an evicted history is gone. */
	if (h_daemon_up(&d, "--device_mem=96K", "--host_mem=0", (char *)NULL))
		return H_FAIL;
	a = h_connect_or_fail(d.sock, "A", 5000);
	b = h_connect_or_fail(d.sock, "B", 5000);
	if (!a || !b)
		return h_daemon_finish(&d, 1, t0);
	case_a_append_after_commit(a);
	case_b_released_lease(a, b);
	case_c_evicted(a, b);
	case_d_two_sync_prepares(a);
	case_e_seq_free(a, b);
	case_f_foreign_and_async(a, b);
	kvp_close(a);
	kvp_close(b);
	run_model(d.sock);
	return h_daemon_finish(&d, g_bad, t0);
}
