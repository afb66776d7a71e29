/* SPDX-License-Identifier: MIT */
/*
 * test_kill_during_demotion - kill -9 of clients while a device tier far
 * smaller than the working set is continuously demoted to the host tier
 * loses no committed token, leaves no lease of a dead client behind and
 * keeps the frame accounting exact (issue 14: "kill -9 of clients during
 * background demotion").
 *
 * kvpoold gets a device tier of 64 pages, a host tier of 1024 and
 * max_tokens_per_user = 64; four client processes ("slots") own 32 users
 * each and append to them without end (their heads are trimmed), about
 * 4.5 pages a user, 600 pages in all: the device tier is demoted to the
 * host all the time and nearly every user a client comes back to is
 * onloaded.
 * Each slot loops: write cycles (prepare, append in two halves with
 * pauses, commit, release), ring batches of two users' prepares (each
 * followed by an INFO of its user, which must complete after it) left in
 * flight before they are reaped and committed, read-only leases whose
 * bytes are read through the page table twice with a pause between (a
 * pinned page must not move or change while the pool demotes around it),
 * and now and then an offload. Token bytes are a pure function of (user,
 * position) (h_tokens_fill), and each slot keeps in shared memory, per
 * user, the length the daemon acknowledged and the commit it has in
 * flight.
 *
 * The parent kills two slots with SIGKILL at random moments (every other
 * kill waits for the victim to hold a lease or have operations in flight),
 * waits until the daemon has detached them (kvp_clients) and no user of
 * theirs is still leased, and starts them again; the new incarnation first
 * checks that each user's history ends where the acknowledged commits end,
 * or past it by exactly the commit that was in flight, and carries on from
 * there. 20 rounds, then everyone stops.
 *
 * At the end (one client left, the checker): no lease (stats, kvp_users,
 * kvp_clients, and kvctl stats --json when kvctl is built); every user
 * ends exactly where its acknowledged commits end, holds at most
 * max_tokens_per_user tokens from a page boundary, and reads back byte for
 * byte after its onload; per tier frames used = the users' pages and used
 * + free = total (h_check_accounting); every page of a history has a frame
 * in some tier; pages were demoted, onloaded and trimmed, and no user was
 * dropped (the host tier had room for all of them).
 *
 * Two runs: --reclaim=yes (the background reclaimer demotes ahead of need,
 * copying without the shard's lock) and --reclaim=no (the prepare that
 * needs the room demotes).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "pool_state.h"

#define SLOTS 4
#define USERS_PER_SLOT 32
#define CAP_TOKENS 64u    /* max_tokens_per_user: 4 pages, 5 while appending */
#define MAX_READ 256u     /* tokens the reading buffers take */
#define MAX_NEW 12u
#define ROUNDS 20         /* two kills each */
#define DEVICE_PAGES 64u
#define SALT 0x64656d6f7465ull /* "demote" */

enum state {
	ST_IDLE,
	ST_CONNECTING,
	ST_WRITE_LEASE, /* holds a write lease, appending */
	ST_COMMITTING,  /* commit on its way */
	ST_ASYNC,       /* ring operations in flight */
	ST_READ_LEASE,  /* holds a read-only lease */
	ST_COUNT,
};

static const char *state_name[ST_COUNT] = {
	"idle", "connecting", "holding a write lease", "committing",
	"ring operations in flight", "holding a read lease",
};

struct slot {
	uint64_t len[USERS_PER_SLOT];     /* acknowledged: the history ends here */
	uint64_t fly_pos[USERS_PER_SLOT]; /* a commit in flight: [pos, pos + n) */
	uint32_t fly_n[USERS_PER_SLOT];
	int state;
	int ready;
	uint32_t client_id;               /* the incarnation's, for kvp_clients */
	int incarnation;
	uint64_t writes, reads, asyncs, offloads, nomem, busy;
};

struct shared {
	int stop;
	struct slot s[SLOTS];
};

static struct shared *g;
static const char *g_sock;

static uint64_t user_of(int s, int i)
{
	return 30000ull + 100ull * (uint64_t)s + (uint64_t)i;
}

static uint64_t pages_of(uint64_t len)
{
	return (len + H_PAGE_TOKENS - 1) / H_PAGE_TOKENS;
}

/* Shared words a SIGKILL may interrupt between: stored one at a time, in
 * an order the next incarnation can read back (see reconcile()). */
static void put64(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

static void put32(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

static void set_state(struct slot *sl, enum state st)
{
	__atomic_store_n(&sl->state, (int)st, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------------ reading */

/*
 * prepare(u, pos, n), retried for what a kill or the pressure leaves for a
 * moment: -EBUSY (a dead predecessor's reservation not yet rolled back)
 * and -ENOMEM (every device frame pinned right now: leases, pages being
 * demoted). The lease must continue the history at pos. Returns 0 or the
 * last -errno (message logged).
 */
static int prepare_retry(struct kvp_client *c, struct slot *sl, uint64_t u,
			 uint64_t pos, uint32_t n, struct kvp_lease *ls)
{
	uint64_t deadline = h_now_ms() + 5000;
	for (;;) {
		int rc = kvp_prepare(c, u, pos, n, ls);
		if (rc == 0 && (ls->start + ls->len != pos || ls->n_new != n)) {
			h_fail("user %" PRIu64 ": a lease for %u tokens from %" PRIu64
			       " covers start %" PRIu64 " len %" PRIu64 " n_new %u",
			       u, n, pos, ls->start, ls->len, ls->n_new);
			return -EPROTO;
		}
		if (rc != -ENOMEM && rc != -EBUSY) {
			if (rc < 0)
				h_fail("user %" PRIu64 ": prepare(%" PRIu64 ", %u) at the"
				       " acknowledged end: %d (%s)", u, pos, n, rc,
				       kvp_last_error(c));
			return rc;
		}
		if (sl) {
			sl->nomem += rc == -ENOMEM;
			sl->busy += rc == -EBUSY;
		}
		if (h_now_ms() > deadline) {
			h_fail("user %" PRIu64 ": prepare(%" PRIu64 ", %u) still %d"
			       " after 5 s (%s)", u, pos, n, rc, kvp_last_error(c));
			return rc;
		}
		h_sleep_us(500);
	}
}

/* Compare the len tokens the lease's page table points at with the
 * pattern; a message per differing token (at most 3). Returns 0 or -1. */
static int lease_bytes_ok(struct kvp_client *c, uint64_t u,
			  const struct kvp_lease *ls, const int32_t *frames,
			  uint64_t len, const char *when)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	uint32_t P = l->page_tokens;
	uint64_t tb = l->token_bytes;
	static uint8_t got[MAX_READ * 256], want[MAX_READ * 256];
	static struct kvp_slot slots[MAX_READ];
	int bad = 0;

	if (len > MAX_READ || tb > 256) {
		h_fail("user %" PRIu64 ": %" PRIu64 " tokens of %" PRIu64 " bytes"
		       " do not fit the test's buffers", u, len, tb);
		return -1;
	}
	for (uint64_t i = 0; i < len; i++) {
		if (frames[i / P] < 0 ||
		    (uint32_t)frames[i / P] >= kvp_device_frames(c)) {
			h_fail("user %" PRIu64 ": page %" PRIu64 " has device frame %d"
			       " (the tier has %u)", u, i / P, frames[i / P],
			       kvp_device_frames(c));
			return -1;
		}
		slots[i] = (struct kvp_slot){ (uint32_t)frames[i / P],
					      (uint32_t)(i % P) };
	}
	kvp_read_cpu(l, kvp_device_base(c), slots, (uint32_t)len, got);
	h_tokens_fill(l, SALT, u, ls->start, (uint32_t)len, want);
	for (uint64_t i = 0; i < len && bad < 3; i++) {
		if (memcmp(got + i * tb, want + i * tb, tb) == 0)
			continue;
		uint64_t b = 0;
		while (got[i * tb + b] == want[i * tb + b])
			b++;
		h_fail("user %" PRIu64 " position %" PRIu64 " (page %" PRIu64
		       ", frame %u slot %u), %s: byte %" PRIu64 " is 0x%02x,"
		       " the pattern's 0x%02x", u, ls->start + i, i / P,
		       slots[i].frame, slots[i].slot, when, b, got[i * tb + b],
		       want[i * tb + b]);
		bad++;
	}
	return bad ? -1 : 0;
}

/*
 * What user u may hold when the acknowledged commits end at end: [start,
 * end) with start a page boundary and, once end is past CAP_TOKENS, at
 * least CAP_TOKENS - P + 1 tokens (trimming takes whole head pages only
 * until len <= CAP_TOKENS); quiet: also len <= CAP_TOKENS (a history
 * pinned while it grew is trimmed when it is unpinned, so not before).
 */
static int history_ok(uint64_t u, uint64_t start, uint64_t len, uint64_t end,
		      int quiet)
{
	uint64_t least = end < CAP_TOKENS ? end : CAP_TOKENS - H_PAGE_TOKENS + 1;
	if (start + len == end && start % H_PAGE_TOKENS == 0 && len >= least &&
	    (!quiet || len <= CAP_TOKENS))
		return 0;
	h_fail("user %" PRIu64 ": holds [%" PRIu64 ", %" PRIu64 "); the"
	       " acknowledged commits end at %" PRIu64 ", so it should hold"
	       " [S, %" PRIu64 ") with S a page boundary and %" PRIu64 " to %u"
	       " tokens%s", u, start, start + len, end, end, least,
	       quiet ? CAP_TOKENS : MAX_READ,
	       start + len != end ? " (a commit was lost or applied twice)" : "");
	return -1;
}

/*
 * User u must end exactly at end (history_ok): info, then a read-only
 * lease (which onloads what was demoted), its shape, then every byte.
 * hold_us > 0: read again after holding the lease that long (pinned pages
 * must not move). quiet: nothing else runs (the final check).
 */
static int verify_user(struct kvp_client *c, struct slot *sl, uint64_t u,
		       uint64_t end, unsigned hold_us, int quiet)
{
	struct kvp_user_info ui;
	struct kvp_lease ls;
	int32_t frames[MAX_READ / H_PAGE_TOKENS + 1];
	int rc = kvp_info(c, u, &ui);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": info: %d (%s)", u, rc, kvp_last_error(c));
		return -1;
	}
	if (!end && !ui.len)
		return 0;
	if (history_ok(u, ui.start, ui.len, end, quiet))
		return -1;
	if (prepare_retry(c, sl, u, end, 0, &ls))
		return -1;
	int ret = 0;
	uint64_t len = ls.len;
	if (ls.start + ls.len != end || ls.n_new || ls.npages != pages_of(len) ||
	    ls.last_page_len != len - (pages_of(len) - 1) * H_PAGE_TOKENS ||
	    history_ok(u, ls.start, ls.len, end, quiet)) {
		h_fail("user %" PRIu64 ": read-only lease at %" PRIu64 ": start %"
		       PRIu64 " len %" PRIu64 " n_new %u npages %u last_page_len"
		       " %u", u, end, ls.start, ls.len, ls.n_new, ls.npages,
		       ls.last_page_len);
		ret = -1;
		goto out;
	}
	/* indices point into the arena until the next call: keep a copy. */
	memcpy(frames, ls.indices, ls.npages * sizeof(int32_t));
	if (sl)
		set_state(sl, ST_READ_LEASE);
	if (lease_bytes_ok(c, u, &ls, frames, len, "read under the lease")) {
		ret = -1;
		goto out;
	}
	if (hold_us) {
		h_sleep_us(hold_us);
		if (lease_bytes_ok(c, u, &ls, frames, len, "read again after"
				   " holding the lease (a pinned page moved or"
				   " was reused)"))
			ret = -1;
	}
out:
	rc = kvp_release(c, ls.id);
	if (sl)
		set_state(sl, ST_IDLE);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": release of a read-only lease: %d (%s)", u,
		       rc, kvp_last_error(c));
		ret = -1;
	}
	return ret;
}

/* ------------------------------------------------------------ a slot */

struct ctx {
	int s;
	struct slot *sl;
	struct kvp_client *c;
	const struct kvp_layout *l;
	struct h_rng r;
	uint8_t kv[MAX_NEW * 256];
};

/* A new incarnation: what was in flight when the last one died either
 * landed whole or not at all. */
static int reconcile(struct ctx *x)
{
	for (int i = 0; i < USERS_PER_SLOT; i++) {
		uint64_t u = user_of(x->s, i);
		struct kvp_user_info ui;
		int rc = kvp_info(x->c, u, &ui);
		if (rc < 0) {
			h_fail("user %" PRIu64 ": info: %d (%s)", u, rc,
			       kvp_last_error(x->c));
			return -1;
		}
		uint64_t end = ui.len ? ui.start + ui.len : 0;
		uint64_t len = x->sl->len[i];
		uint32_t n = x->sl->fly_n[i];
		uint64_t pos = x->sl->fly_pos[i];
		if (n && (end == pos || end == pos + n)) {
			put64(&x->sl->len[i], end);
			put32(&x->sl->fly_n[i], 0);
			continue;
		}
		if (!n && end == len)
			continue;
		if (n)
			h_fail("user %" PRIu64 ": the history ends at %" PRIu64 "; the"
			       " commit that was in flight when incarnation %d died"
			       " makes it %" PRIu64 " if it landed, %" PRIu64 " if not",
			       u, end, x->sl->incarnation - 1, pos + n, pos);
		else
			h_fail("user %" PRIu64 ": the history ends at %" PRIu64 " but"
			       " the commits acknowledged to incarnation %d end at %"
			       PRIu64, u, end, x->sl->incarnation - 1, len);
		return -1;
	}
	return 0;
}

/* The pause a cycle takes between its steps: often none. */
static void pause_maybe(struct ctx *x)
{
	if (h_rng_below(&x->r, 3) == 0)
		h_sleep_us((unsigned)h_rng_below(&x->r, 1000));
}

static int write_cycle(struct ctx *x, int i)
{
	uint64_t u = user_of(x->s, i);
	uint64_t pos = x->sl->len[i];
	uint32_t n = 1 + (uint32_t)h_rng_below(&x->r, MAX_NEW);
	struct kvp_lease ls;

	if (prepare_retry(x->c, x->sl, u, pos, n, &ls))
		return -1;
	set_state(x->sl, ST_WRITE_LEASE);
	h_tokens_fill(x->l, SALT, u, pos, n, x->kv);
	uint32_t half = n / 2;
	pause_maybe(x);
	int rc = kvp_append(x->c, &ls, 0, half, x->kv);
	pause_maybe(x);
	if (rc == 0)
		rc = kvp_append(x->c, &ls, half, n - half,
				x->kv + (size_t)half * x->l->token_bytes);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": append: %d (%s)", u, rc,
		       kvp_last_error(x->c));
		return -1;
	}
	put64(&x->sl->fly_pos[i], pos);
	put32(&x->sl->fly_n[i], n);
	set_state(x->sl, ST_COMMITTING);
	rc = kvp_commit(x->c, ls.id, n);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": commit of %u tokens at %" PRIu64 ": %d (%s)",
		       u, n, pos, rc, kvp_last_error(x->c));
		return -1;
	}
	put64(&x->sl->len[i], pos + n);
	put32(&x->sl->fly_n[i], 0);
	rc = kvp_release(x->c, ls.id);
	set_state(x->sl, ST_IDLE);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": release: %d (%s)", u, rc,
		       kvp_last_error(x->c));
		return -1;
	}
	x->sl->writes++;
	return 0;
}

/* Reap exactly n completions into out. */
static int reap_n(struct ctx *x, struct kvp_completion *out, int n)
{
	for (int got = 0; got < n;) {
		int k = kvp_reap(x->c, out + got, (uint32_t)(n - got), 1);
		if (k <= 0) {
			h_fail("reap: %d (%s)", k, kvp_last_error(x->c));
			return -1;
		}
		got += k;
	}
	return 0;
}

/* A ring batch over two users of the slot. */
struct batch {
	int idx[2];
	uint64_t pos[2], lease[2];
	uint32_t n[2];
	int ok[2];
};

/*
 * PREPARE of both users, each followed by an INFO of the same user, left
 * in flight for a while, then reaped and appended to. A prepare waiting
 * for the reclaimer holds the client's ring: the INFO behind it must still
 * complete after it, and see the history end where the slot left it.
 */
static int batch_prepare(struct ctx *x, struct batch *b)
{
	struct kvp_completion comp[4];
	int seen[2] = { 0, 0 };

	for (int k = 0; k < 2; k++) {
		uint64_t u = user_of(x->s, b->idx[k]);
		b->pos[k] = x->sl->len[b->idx[k]];
		b->n[k] = 1 + (uint32_t)h_rng_below(&x->r, MAX_NEW / 2);
		b->ok[k] = 0;
		if (kvp_queue_prepare(x->c, u, b->pos[k], b->n[k], (uint64_t)k) < 0 ||
		    kvp_queue_info(x->c, u, 2 + (uint64_t)k) < 0) {
			h_fail("queue: %s", kvp_last_error(x->c));
			return -1;
		}
	}
	if (kvp_submit(x->c) != 4) {
		h_fail("submit: %s", kvp_last_error(x->c));
		return -1;
	}
	set_state(x->sl, ST_ASYNC);
	pause_maybe(x);
	if (reap_n(x, comp, 4))
		return -1;
	for (int j = 0; j < 4; j++) {
		const struct kvp_completion *cp = &comp[j];
		int k = (int)(cp->tag & 1);
		uint64_t u = user_of(x->s, b->idx[k]);
		const char *msg = cp->error ? cp->error : "";
		if (cp->tag >= 2) {
			uint64_t end = cp->info.len ? cp->info.start + cp->info.len : 0;
			if (!seen[k] || cp->res < 0 || end != b->pos[k]) {
				h_fail("user %" PRIu64 ": the INFO queued after a PREPARE"
				       " from %" PRIu64 ": %d (%s), history ends at %"
				       PRIu64 "%s", u, b->pos[k], cp->res, msg, end,
				       seen[k] ? "" : "; it completed before the PREPARE");
				return -1;
			}
			continue;
		}
		seen[k] = 1;
		if (cp->res == -ENOMEM || cp->res == -EBUSY) {
			x->sl->nomem += cp->res == -ENOMEM;
			x->sl->busy += cp->res == -EBUSY;
			continue; /* a later cycle */
		}
		if (cp->res < 0 || cp->lease.start + cp->lease.len != b->pos[k] ||
		    cp->lease.n_new != b->n[k]) {
			h_fail("user %" PRIu64 ": ring prepare(%" PRIu64 ", %u): %d"
			       " (%s), lease from %" PRIu64 " + %" PRIu64, u,
			       b->pos[k], b->n[k], cp->res, msg, cp->lease.start,
			       cp->lease.len);
			return -1;
		}
		h_tokens_fill(x->l, SALT, u, b->pos[k], b->n[k], x->kv);
		if (kvp_append(x->c, &cp->lease, 0, b->n[k], x->kv) < 0) {
			h_fail("user %" PRIu64 ": append: %s", u, kvp_last_error(x->c));
			return -1;
		}
		b->lease[k] = cp->lease.id;
		b->ok[k] = 1;
	}
	return 0;
}

/* COMMIT with the release flag of what batch_prepare won, in one batch. */
static int batch_commit(struct ctx *x, struct batch *b)
{
	struct kvp_completion comp[2];
	int nq = 0;

	for (int k = 0; k < 2; k++) {
		if (!b->ok[k])
			continue;
		put64(&x->sl->fly_pos[b->idx[k]], b->pos[k]);
		put32(&x->sl->fly_n[b->idx[k]], b->n[k]);
		if (kvp_queue_commit(x->c, b->lease[k], b->n[k], 1, (uint64_t)k) < 0) {
			h_fail("queue commit: %s", kvp_last_error(x->c));
			return -1;
		}
		nq++;
	}
	if (nq && kvp_submit(x->c) != nq) {
		h_fail("submit commits: %s", kvp_last_error(x->c));
		return -1;
	}
	if (reap_n(x, comp, nq))
		return -1;
	for (int j = 0; j < nq; j++) {
		int k = (int)comp[j].tag;
		if (comp[j].res < 0) {
			h_fail("user %" PRIu64 ": ring commit of %u tokens at %" PRIu64
			       ": %d (%s)", user_of(x->s, b->idx[k]), b->n[k],
			       b->pos[k], comp[j].res,
			       comp[j].error ? comp[j].error : "");
			return -1;
		}
		put64(&x->sl->len[b->idx[k]], b->pos[k] + b->n[k]);
		put32(&x->sl->fly_n[b->idx[k]], 0);
	}
	return 0;
}

/* Two users through the ring. */
static int async_cycle(struct ctx *x, int i0, int i1)
{
	struct batch b = { .idx = { i0, i1 } };

	if (batch_prepare(x, &b) || batch_commit(x, &b))
		return -1;
	set_state(x->sl, ST_IDLE);
	x->sl->asyncs++;
	return 0;
}

static int slot_main(void *arg)
{
	struct ctx x = { .s = (int)(intptr_t)arg };
	char name[32];
	x.sl = &g->s[x.s];
	snprintf(name, sizeof(name), "slot-%d.%d", x.s, x.sl->incarnation);
	h_set_name(name);
	set_state(x.sl, ST_CONNECTING);
	x.c = h_connect_or_fail(g_sock, name, 10000);
	if (!x.c)
		return H_FAIL;
	int result = H_FAIL;
	x.l = kvp_client_layout(x.c);
	if (x.l->token_bytes > 256) {
		h_fail("the layout's tokens are larger than the test's buffers");
		goto out;
	}
	put32(&x.sl->client_id, kvp_client_id(x.c));
	h_rng_seed(&x.r, 0xde307e00ull + 1000ull * (uint64_t)x.s +
			 (uint64_t)x.sl->incarnation);
	if (reconcile(&x))
		goto out;
	set_state(x.sl, ST_IDLE);
	__atomic_store_n(&x.sl->ready, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&g->stop, __ATOMIC_SEQ_CST)) {
		int i = (int)h_rng_below(&x.r, USERS_PER_SLOT);
		int pick = (int)h_rng_below(&x.r, 20);
		int rc;
		if (pick < 10) {
			rc = write_cycle(&x, i);
		} else if (pick < 13) {
			int j = (int)h_rng_below(&x.r, USERS_PER_SLOT);
			if (j == i)
				continue;
			rc = async_cycle(&x, i, j);
		} else if (pick == 19) {
			rc = kvp_offload(x.c, user_of(x.s, i));
			if (rc < 0 && rc != -ENOENT && rc != -ENOSPC) {
				h_fail("offload of user %" PRIu64 ": %d (%s)",
				       user_of(x.s, i), rc, kvp_last_error(x.c));
				goto out;
			}
			rc = 0;
			x.sl->offloads++;
		} else {
			unsigned hold = h_rng_below(&x.r, 2) ?
				(unsigned)h_rng_below(&x.r, 1500) : 0;
			rc = verify_user(x.c, x.sl, user_of(x.s, i), x.sl->len[i],
					 hold, 0);
			x.sl->reads++;
		}
		if (rc)
			goto out;
	}
	result = H_PASS;
out:
	kvp_close(x.c);
	return result;
}

/* ------------------------------------------------------------ the parent */

/*
 * Detached, the dead client holds nothing: no user of slot v (nobody else
 * touches them, and its next incarnation has not started) is pinned for
 * long. kvp_user_info.leases counts every pin of the history, the
 * reclaimer's demotion pin too, so a user gets a moment to come back to 0.
 */
static int dead_leases_gone(struct kvp_client *w, int v, uint32_t id)
{
	uint64_t deadline = h_now_ms() + 2000;
	for (int i = 0; i < USERS_PER_SLOT; i++) {
		uint64_t u = user_of(v, i);
		struct kvp_user_info ui;
		for (;;) {
			int rc = kvp_info(w, u, &ui);
			if (rc < 0) {
				h_fail("user %" PRIu64 ": info: %d (%s)", u, rc,
				       kvp_last_error(w));
				return -1;
			}
			if (!ui.leases)
				break;
			if (h_now_ms() > deadline) {
				h_fail("user %" PRIu64 " still has %u leases 2 s after"
				       " client %u (slot %d), the only one using it,"
				       " was killed and detached", u, ui.leases, id, v);
				return -1;
			}
			h_sleep_ms(1);
		}
	}
	return 0;
}

/* Kill slot v (its state when the kill landed in *st), reap it, wait
 * until the daemon has detached it and check it left no lease. */
static int kill_slot(struct kvp_client *w, pid_t *pids, int v, int aim,
		     int *st)
{
	struct slot *sl = &g->s[v];
	if (aim) {
		uint64_t until = h_now_ms() + 150;
		while (h_now_ms() < until) {
			int s = __atomic_load_n(&sl->state, __ATOMIC_SEQ_CST);
			if (s >= ST_WRITE_LEASE)
				break;
			sched_yield();
		}
	}
	*st = __atomic_load_n(&sl->state, __ATOMIC_SEQ_CST);
	if (*st < 0 || *st >= ST_COUNT)
		*st = ST_IDLE;
	kill(pids[v], SIGKILL);
	int rc = h_wait(pids[v], 10000);
	pids[v] = -1;
	if (rc != 128 + SIGKILL) {
		h_fail("slot %d exited %d before the kill landed", v, rc);
		return -1;
	}
	uint32_t id = __atomic_load_n(&sl->client_id, __ATOMIC_SEQ_CST);
	uint64_t deadline = h_now_ms() + 5000;
	for (;;) {
		int a = ps_client_attached(w, id);
		if (a < 0)
			return -1;
		if (!a)
			break;
		if (h_now_ms() > deadline) {
			h_fail("client %u (slot %d) still attached 5 s after kill -9",
			       id, v);
			return -1;
		}
		h_sleep_ms(1);
	}
	return dead_leases_gone(w, v, id);
}

/* Every user is listed, and every page of its history has a frame in
 * some tier. */
static int check_rows(struct kvp_client *c)
{
	struct kvp_user_info rows[64];
	uint64_t cursor = 0, next = 0, listed = 0;
	int ret = 0;
	do {
		int n = kvp_users(c, cursor, rows, 64, &next);
		if (n < 0) {
			h_fail("users: %d (%s)", n, kvp_last_error(c));
			return -1;
		}
		for (int i = 0; i < n; i++) {
			const struct kvp_user_info *r = &rows[i];
			uint64_t np = pages_of(r->len);
			if (r->pages_device + r->pages_host < np ||
			    r->pages_device > np || r->pages_host > np) {
				h_fail("user %" PRIu64 ": %" PRIu64 " tokens in %" PRIu64
				       " pages, but %u device and %u host frames",
				       r->user, r->len, np, r->pages_device,
				       r->pages_host);
				ret = -1;
			}
		}
		listed += (uint64_t)n;
		cursor = next;
	} while (next);
	if (listed != SLOTS * USERS_PER_SLOT) {
		h_fail("kvp_users lists %" PRIu64 " users; the slots wrote %d",
		       listed, SLOTS * USERS_PER_SLOT);
		ret = -1;
	}
	return ret;
}

/* Everything the daemon holds once every slot is gone. */
static int check_end(const struct h_daemon *d, struct kvp_client *c,
		     int reclaim)
{
	int fail = 0;
	struct kvp_stats st = { 0 };
	if (ps_settle(c, &st))
		return 1;
	if (ps_client_attached(c, kvp_client_id(c)) != 1) {
		h_fail("kvp_clients does not list the checker itself");
		fail = 1;
	}
	if (ps_check_kvctl(d, &st))
		fail = 1;
	/* Every user: exactly the acknowledged tokens, byte for byte (the
	 * read-only prepare onloads what is on the host). */
	int bad = 0;
	uint64_t tokens = 0;
	for (int s = 0; s < SLOTS && bad < 5; s++)
		for (int i = 0; i < USERS_PER_SLOT && bad < 5; i++) {
			if (g->s[s].fly_n[i]) {
				h_fail("slot %d user %d: a commit still marked in flight"
				       " after the slot stopped", s, i);
				bad++;
				continue;
			}
			tokens += g->s[s].len[i];
			if (verify_user(c, NULL, user_of(s, i), g->s[s].len[i], 0,
					1))
				bad++;
		}
	if (bad)
		fail = 1;
	if (ps_settle(c, &st) || h_check_accounting(c, &st) || check_rows(c))
		fail = 1;
	h_log("%" PRIu64 " tokens written to %d users; demoted %" PRIu64 " pages"
	      " (%" PRIu64 " by the reclaimer; %" PRIu64 " prepares waited for it, %"
	      PRIu64 " evicted for room themselves), onloaded %" PRIu64 ", trimmed %" PRIu64
	      ", dropped %" PRIu64 " users", tokens, SLOTS * USERS_PER_SLOT,
	      st.demoted_pages, st.reclaimed_pages, st.reclaim_stalls, st.reclaim_direct,
	      st.onloaded_pages, st.trimmed_pages, st.evicted_users);
	if (st.evicted_users) {
		h_fail("%" PRIu64 " users dropped although the host tier had room"
		       " for all of them", st.evicted_users);
		fail = 1;
	}
	if (!st.demoted_pages || !st.onloaded_pages || !st.trimmed_pages) {
		h_fail("no pressure: %" PRIu64 " pages demoted, %" PRIu64
		       " onloaded, %" PRIu64 " trimmed", st.demoted_pages,
		       st.onloaded_pages, st.trimmed_pages);
		fail = 1;
	}
	if (reclaim && !st.reclaimed_pages) {
		h_fail("--reclaim=yes but the background reclaimer freed no page");
		fail = 1;
	}
	return fail;
}

/* Start slot v (again) and wait until it has reconciled and is ready. */
static int slot_start(pid_t *pids, int v)
{
	__atomic_store_n(&g->s[v].ready, 0, __ATOMIC_SEQ_CST);
	pids[v] = h_fork(slot_main, (void *)(intptr_t)v);
	uint64_t deadline = h_now_ms() + 10000;
	while (!__atomic_load_n(&g->s[v].ready, __ATOMIC_SEQ_CST)) {
		int ws;
		if (waitpid(pids[v], &ws, WNOHANG) == pids[v]) {
			h_forget(pids[v]);
			pids[v] = -1;
			h_fail("slot %d exited (status %#x) before it was ready", v,
			       ws);
			return -1;
		}
		if (h_now_ms() > deadline) {
			h_fail("slot %d not ready 10 s after it started", v);
			return -1;
		}
		h_sleep_ms(1);
	}
	return 0;
}

/* ROUNDS times: kill two slots at random moments, start them again. */
static int kill_rounds(struct kvp_client *w, pid_t *pids, int reclaim)
{
	struct h_rng r;
	int hits[ST_COUNT] = { 0 }, kills = 0, fail = 0;
	struct kvp_stats st0, st1;

	h_rng_seed(&r, 0x6b696c6cull + (uint64_t)reclaim);
	kvp_stats(w, 0, &st0);
	for (int k = 0; k < ROUNDS && !fail; k++) {
		int v[2];
		v[0] = (int)h_rng_below(&r, SLOTS);
		v[1] = (v[0] + 1 + (int)h_rng_below(&r, SLOTS - 1)) % SLOTS;
		for (int j = 0; j < 2 && !fail; j++) {
			int st;
			h_sleep_us(5000 + (unsigned)h_rng_below(&r, 60000));
			fail = kill_slot(w, pids, v[j], (k + j) % 2, &st) != 0;
			hits[st]++;
			kills++;
		}
		for (int j = 0; j < 2 && !fail; j++) {
			g->s[v[j]].incarnation++;
			fail = slot_start(pids, v[j]) != 0;
		}
	}
	kvp_stats(w, 0, &st1);
	char cov[512];
	size_t off = 0;
	for (int s = 0; s < ST_COUNT; s++)
		off += (size_t)snprintf(cov + off, sizeof(cov) - off, "%s%d %s",
					s ? ", " : "", hits[s], state_name[s]);
	h_log("%d kills by the victim's state: %s; meanwhile %" PRIu64 " pages"
	      " demoted (%" PRIu64 " by the reclaimer) and %" PRIu64 " onloaded",
	      kills, cov, st1.demoted_pages - st0.demoted_pages,
	      st1.reclaimed_pages - st0.reclaimed_pages,
	      st1.onloaded_pages - st0.onloaded_pages);
	int leased = hits[ST_WRITE_LEASE] + hits[ST_ASYNC] + hits[ST_READ_LEASE] +
		     hits[ST_COMMITTING];
	if (!fail && leased < kills / 4) {
		h_fail("only %d of %d kills hit a client holding a lease or with"
		       " operations in flight", leased, kills);
		fail = 1;
	}
	return fail;
}

static int run(int reclaim)
{
	const char *flag = reclaim ? "--reclaim=yes" : "--reclaim=no";
	h_log("---- kvpoold %s, a device tier of %u pages", flag, DEVICE_PAGES);
	uint64_t t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	struct h_daemon d;
	char dev[32];
	snprintf(dev, sizeof(dev), "--device_mem=%uK", DEVICE_PAGES * 4);
	char cap[48];
	snprintf(cap, sizeof(cap), "--max_tokens_per_user=%u", CAP_TOKENS);
	if (h_daemon_up(&d, dev, "--host_mem=4M", "--workers=2", cap, flag,
			(char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	struct kvp_client *w = h_connect_or_fail(d.sock, "watcher", 5000);
	if (!w) {
		h_daemon_kill(&d);
		return H_FAIL;
	}
	if (!kvp_client_is_admin(w)) {
		h_log("SKIP: kvp_clients needs an admin client");
		kvp_close(w);
		h_daemon_stop(&d, 5000);
		h_daemon_cleanup(&d);
		return H_SKIP;
	}

	int fail = 0;
	pid_t pids[SLOTS];
	for (int s = 0; s < SLOTS; s++)
		pids[s] = -1;
	for (int s = 0; s < SLOTS && !fail; s++)
		fail = slot_start(pids, s) != 0;
	if (!fail)
		fail = kill_rounds(w, pids, reclaim) != 0;

	__atomic_store_n(&g->stop, 1, __ATOMIC_SEQ_CST);
	for (int s = 0; s < SLOTS; s++) {
		if (pids[s] <= 0)
			continue;
		if (h_wait(pids[s], 20000) != 0) {
			h_fail("slot %d failed", s);
			fail = 1;
		}
	}
	for (int s = 0; s < SLOTS; s++)
		h_log("slot %d (%d incarnations): %" PRIu64 " writes, %" PRIu64
		      " ring batches, %" PRIu64 " reads, %" PRIu64 " offloads; %"
		      PRIu64 " prepares retried on -ENOMEM, %" PRIu64 " on -EBUSY",
		      s, g->s[s].incarnation + 1, g->s[s].writes, g->s[s].asyncs,
		      g->s[s].reads, g->s[s].offloads, g->s[s].nomem,
		      g->s[s].busy);
	if (!fail && check_end(&d, w, reclaim))
		fail = 1;
	kvp_close(w);
	return h_daemon_finish(&d, fail, t0);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_kill_during_demotion");
	int rc = run(1);
	if (rc == H_PASS)
		rc = run(0);
	return rc;
}
