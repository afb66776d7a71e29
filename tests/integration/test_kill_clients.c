/* SPDX-License-Identifier: MIT */
/*
 * test_kill_clients - SIGKILL of clients at random points under load loses
 * nothing but the dead clients' leases and uncommitted reservations.
 *
 * 6 "mortal" client processes and 2 "survivors" loop over users of their
 * own: prepare / append / commit / release, holding write leases across
 * sleeps, appending in two halves, keeping async prepares in flight, holding
 * read-only leases, offloading users to the host tier. Each publishes what it is doing in a shared page. A
 * killer SIGKILLs a random mortal 50 times (every other time it waits until
 * the victim holds a lease or has operations in flight) and starts it again;
 * the new incarnation carries on from start+len (retrying while the daemon
 * has not yet rolled back its predecessor's reservation).
 *
 * Afterwards (every mortal killed, survivors finished, the daemon given a
 * moment to notice): stats show leases == 0 and one client; per tier
 * frames_used + frames_free == frames_total and frames_used == the sum of
 * pages over kvp_users; every survivor's user reads back byte for byte with
 * exactly the tokens it committed; every mortal's user reads back byte for
 * byte too (committed data is never lost, whoever died).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MORTALS 6
#define SURVIVORS 2
#define WORKERS (MORTALS + SURVIVORS)
#define USERS_PER_WORKER 16
#define KILLS 50
#define SALT 0x6b696c6c6b696c6cull /* "killkill" */

enum state {
	ST_IDLE,
	ST_CONNECTING,
	ST_WRITE_LEASE, /* holds a write lease, nothing appended yet */
	ST_APPENDING,   /* half of the tokens appended */
	ST_COMMITTING,  /* commit / release on its way */
	ST_ASYNC,       /* async prepares submitted, not reaped */
	ST_READ_LEASES, /* holds read-only leases */
	ST_COUNT,
};

static const char *state_name[ST_COUNT] = {
	"idle", "connecting", "holding a write lease", "mid-append",
	"committing", "async prepares in flight", "holding read leases",
};

struct shared {
	volatile int stop;
	volatile int state[WORKERS];
	volatile int ready[WORKERS];   /* connected at least once */
	uint64_t survivor_len[SURVIVORS][USERS_PER_WORKER];
	uint64_t survivor_cycles[SURVIVORS];
};

static struct shared *g;
static const char *g_sock;

struct worker {
	int idx;
	int incarnation;
};

static uint64_t user_of(int w, int i)
{
	return 1000ull * (uint64_t)(w + 1) + (uint64_t)i;
}

static void set_state(int w, enum state s)
{
	__atomic_store_n(&g->state[w], (int)s, __ATOMIC_SEQ_CST);
}

/* Prepare, retrying -EBUSY: a killed predecessor's reservation may not be
 * rolled back yet. */
static int prepare_retry(struct kvp_client *c, uint64_t u, uint64_t pos,
			 uint32_t n, struct kvp_lease *ls)
{
	uint64_t deadline = h_now_ms() + 5000;
	for (;;) {
		int rc = kvp_prepare(c, u, pos, n, ls);
		if (rc != -EBUSY)
			return rc;
		if (h_now_ms() > deadline) {
			h_fail("user %" PRIu64 ": prepare still -EBUSY after 5 s (%s):"
			       " a dead client's reservation was not rolled back",
			       u, kvp_last_error(c));
			return rc;
		}
		h_sleep_ms(1);
	}
}

/* Write n tokens to u with the lease held across sleeps and the append in
 * two halves, announcing each phase. Returns the tokens committed or -1. */
static int slow_cycle(struct kvp_client *c, int w, struct h_rng *r, uint64_t u,
		      uint64_t expect_pos)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	struct kvp_user_info ui;
	if (kvp_info(c, u, &ui) < 0) {
		h_fail("info %" PRIu64 ": %s", u, kvp_last_error(c));
		return -1;
	}
	uint64_t pos = ui.len ? ui.start + ui.len : 0;
	if (expect_pos != UINT64_MAX && pos != expect_pos) {
		h_fail("user %" PRIu64 " ends at %" PRIu64 ", expected %" PRIu64,
		       u, pos, expect_pos);
		return -1;
	}
	uint32_t n = 1 + (uint32_t)h_rng_below(r, 24);
	struct kvp_lease ls;
	int rc = prepare_retry(c, u, pos, n, &ls);
	if (rc < 0) {
		h_fail("prepare %" PRIu64 " at %" PRIu64 ": %d (%s)", u, pos, rc,
		       kvp_last_error(c));
		return -1;
	}
	set_state(w, ST_WRITE_LEASE);
	uint8_t kv[24 * 256 * 4];
	if (n * l->token_bytes > sizeof(kv)) {
		h_fail("token too large for the test buffer");
		return -1;
	}
	h_tokens_fill(l, SALT, u, pos, n, kv);
	/* ls.indices points into the arena until the next call: no call
	 * comes between the prepare and the appends. */
	h_sleep_us((unsigned)h_rng_below(r, 1500));
	uint32_t half = n / 2;
	rc = kvp_append(c, &ls, 0, half, kv);
	set_state(w, ST_APPENDING);
	h_sleep_us((unsigned)h_rng_below(r, 1500));
	if (rc == 0)
		rc = kvp_append(c, &ls, half, n - half,
				kv + (size_t)half * l->token_bytes);
	if (rc < 0) {
		h_fail("append %" PRIu64 ": %d (%s)", u, rc, kvp_last_error(c));
		return -1;
	}
	set_state(w, ST_COMMITTING);
	rc = kvp_commit(c, ls.id, n);
	if (rc == 0)
		rc = kvp_release(c, ls.id);
	if (rc < 0) {
		h_fail("commit/release %" PRIu64 ": %d (%s)", u, rc,
		       kvp_last_error(c));
		return -1;
	}
	set_state(w, ST_IDLE);
	return (int)n;
}

/* Six users at once through the async batch, the prepares left in flight
 * for a while before they are reaped. */
static int async_cycle(struct kvp_client *c, int w, struct h_rng *r)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	enum { NB = 6 };
	struct kvp_completion comp[NB];
	uint64_t users[NB], pos[NB], leases[NB];
	uint32_t n[NB];
	int ok[NB];
	uint8_t kv[16 * 256 * 4];
	int first = (int)h_rng_below(r, USERS_PER_WORKER - NB + 1);
	for (int i = 0; i < NB; i++) {
		struct kvp_user_info ui;
		users[i] = user_of(w, first + i);
		if (kvp_info(c, users[i], &ui) < 0) {
			h_fail("info: %s", kvp_last_error(c));
			return -1;
		}
		pos[i] = ui.len ? ui.start + ui.len : 0;
		n[i] = 1 + (uint32_t)h_rng_below(r, 16);
	}
	/* No synchronous call while async operations are queued. */
	for (int i = 0; i < NB; i++) {
		if (kvp_queue_prepare(c, users[i], pos[i], n[i], (uint64_t)i) < 0) {
			h_fail("queue prepare: %s", kvp_last_error(c));
			return -1;
		}
	}
	if (kvp_submit(c) != NB) {
		h_fail("submit: %s", kvp_last_error(c));
		return -1;
	}
	set_state(w, ST_ASYNC);
	h_sleep_us((unsigned)h_rng_below(r, 1500));
	int got = 0;
	while (got < NB) {
		int k = kvp_reap(c, comp + got, NB - got, 1);
		if (k <= 0) {
			h_fail("reap: %d (%s)", k, kvp_last_error(c));
			return -1;
		}
		got += k;
	}
	int nq = 0;
	for (int i = 0; i < NB; i++) {
		int t = (int)comp[i].tag;
		if (t < 0 || t >= NB) {
			h_fail("completion with tag %" PRIu64, comp[i].tag);
			return -1;
		}
		ok[t] = comp[i].res >= 0;
		if (!ok[t]) {
			/* A predecessor's reservation still there: next time. */
			if (comp[i].res != -EBUSY) {
				h_fail("async prepare user %" PRIu64 ": %d (%s)",
				       users[t], comp[i].res,
				       comp[i].error ? comp[i].error : "");
				return -1;
			}
			continue;
		}
		h_tokens_fill(l, SALT, users[t], pos[t], n[t], kv);
		if (kvp_append(c, &comp[i].lease, 0, n[t], kv) < 0) {
			h_fail("append: %s", kvp_last_error(c));
			return -1;
		}
		leases[t] = comp[i].lease.id;
	}
	set_state(w, ST_COMMITTING);
	for (int t = 0; t < NB; t++) {
		if (!ok[t])
			continue;
		if (kvp_queue_commit(c, leases[t], n[t], 1, (uint64_t)t) < 0) {
			h_fail("queue commit: %s", kvp_last_error(c));
			return -1;
		}
		nq++;
	}
	if (nq && kvp_submit(c) != nq) {
		h_fail("submit commits: %s", kvp_last_error(c));
		return -1;
	}
	got = 0;
	while (got < nq) {
		int k = kvp_reap(c, comp + got, (uint32_t)(nq - got), 1);
		if (k <= 0) {
			h_fail("reap commits: %d (%s)", k, kvp_last_error(c));
			return -1;
		}
		for (int i = got; i < got + k; i++)
			if (comp[i].res < 0) {
				h_fail("async commit: %d (%s)", comp[i].res,
				       comp[i].error ? comp[i].error : "");
				return -1;
			}
		got += k;
	}
	set_state(w, ST_IDLE);
	return 0;
}

/* Read-only leases on three users, held for a while. */
static int read_cycle(struct kvp_client *c, int w, struct h_rng *r)
{
	uint64_t held[3];
	int nh = 0;
	for (int i = 0; i < 3; i++) {
		uint64_t u = user_of(w, (int)h_rng_below(r, USERS_PER_WORKER));
		struct kvp_user_info ui;
		struct kvp_lease ls;
		if (kvp_info(c, u, &ui) < 0 || ui.len == 0)
			continue;
		int rc = prepare_retry(c, u, ui.start + ui.len, 0, &ls);
		if (rc < 0) {
			h_fail("read-only prepare %" PRIu64 ": %d (%s)", u, rc,
			       kvp_last_error(c));
			return -1;
		}
		held[nh++] = ls.id;
		set_state(w, ST_READ_LEASES);
	}
	h_sleep_us((unsigned)h_rng_below(r, 1500));
	for (int i = 0; i < nh; i++)
		if (kvp_release(c, held[i]) < 0) {
			h_fail("release: %s", kvp_last_error(c));
			return -1;
		}
	set_state(w, ST_IDLE);
	return 0;
}

static int worker_main(void *arg)
{
	struct worker *wk = arg;
	int w = wk->idx;
	int survivor = w >= MORTALS;
	char name[32];
	snprintf(name, sizeof(name), "%s-%d.%d", survivor ? "survivor" : "mortal",
		 w, wk->incarnation);
	h_set_name(name);
	set_state(w, ST_CONNECTING);
	struct kvp_client *c = h_connect_or_fail(g_sock, name, 10000);
	if (!c)
		return H_FAIL;
	int result = H_FAIL;
	int rc;
	set_state(w, ST_IDLE);
	g->ready[w] = 1;
	struct h_rng r;
	h_rng_seed(&r, 0x5eed0000ull + (uint64_t)w * 1000 + (uint64_t)wk->incarnation);
	uint64_t *lens = survivor ? g->survivor_len[w - MORTALS] : NULL;
	while (!__atomic_load_n(&g->stop, __ATOMIC_SEQ_CST)) {
		int pick = (int)h_rng_below(&r, 10);
		int mode = pick == 9 ? 4 : pick % (survivor ? 2 : 4);
		int ui = (int)h_rng_below(&r, USERS_PER_WORKER);
		uint64_t u = user_of(w, ui);
		if (mode == 0) {
			uint32_t n = 1 + (uint32_t)h_rng_below(&r, 24);
			uint64_t want = UINT64_MAX;
			if (lens)
				want = lens[ui];
			rc = h_append_cycle(c, SALT, u, want, n, 1);
			if (rc == -EBUSY && !survivor)
				continue;
			if (rc < 0) {
				h_fail("cycle on user %" PRIu64 ": %d (%s)", u, rc,
				       kvp_last_error(c));
				goto fail;
			}
			if (lens)
				lens[ui] += n;
		} else if (mode == 1) {
			rc = slow_cycle(c, w, &r, u, lens ? lens[ui] : UINT64_MAX);
			if (rc < 0)
				goto fail;
			if (lens)
				lens[ui] += (uint64_t)rc;
		} else if (mode == 2) {
			if (async_cycle(c, w, &r))
				goto fail;
		} else if (mode == 3) {
			if (read_cycle(c, w, &r))
				goto fail;
		} else {
			/* Host copies too, so both tiers' accounting is tested. */
			rc = kvp_offload(c, u);
			if (rc < 0 && rc != -ENOENT && rc != -ENOSPC) {
				h_fail("offload %" PRIu64 ": %d (%s)", u, rc,
				       kvp_last_error(c));
				goto fail;
			}
		}
		if (survivor)
			g->survivor_cycles[w - MORTALS]++;
	}
	if (survivor) {
		for (int i = 0; i < USERS_PER_WORKER; i++)
			if (h_verify_user(c, SALT, user_of(w, i), 0, lens[i], NULL))
				goto fail;
	}
	result = H_PASS;
fail:
	kvp_close(c);
	return result;
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_kill_clients");
	uint64_t t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	struct h_daemon d;
	/* Two workers: deaths are noticed while the other worker serves. */
	if (h_daemon_up(&d, "--device_mem=256M", "--host_mem=64M", "--workers=2",
			(char *)NULL))
		return H_FAIL;
	g_sock = d.sock;

	int fail = 0;
	pid_t pids[WORKERS];
	struct worker wk[WORKERS];
	for (int i = 0; i < WORKERS; i++) {
		wk[i] = (struct worker){ i, 0 };
		pids[i] = h_fork(worker_main, &wk[i]);
	}
	/* Let everyone connect and get going. */
	uint64_t deadline = h_now_ms() + 10000;
	for (int i = 0; i < WORKERS; i++)
		while (!g->ready[i] && h_now_ms() < deadline)
			h_sleep_ms(1);

	struct h_rng r;
	h_rng_seed(&r, 0x4b494c4cull);
	int hits[ST_COUNT] = { 0 };
	for (int k = 0; k < KILLS && !fail; k++) {
		int v = (int)h_rng_below(&r, MORTALS);
		h_sleep_us(2000 + (unsigned)h_rng_below(&r, 20000));
		if (k % 2) {
			/* Aim: wait (bounded) for a lease or ops in flight. */
			uint64_t until = h_now_ms() + 200;
			while (h_now_ms() < until) {
				int s = __atomic_load_n(&g->state[v], __ATOMIC_SEQ_CST);
				if (s >= ST_WRITE_LEASE && s != ST_COMMITTING)
					break;
				sched_yield();
			}
		}
		int s = __atomic_load_n(&g->state[v], __ATOMIC_SEQ_CST);
		kill(pids[v], SIGKILL);
		int rc = h_wait(pids[v], 10000);
		if (rc != 128 + SIGKILL) {
			/* It failed by itself before the kill landed. */
			h_fail("mortal %d exited %d before it was killed", v, rc);
			pids[v] = -1;
			fail = 1;
			break;
		}
		hits[s]++;
		wk[v].incarnation++;
		g->ready[v] = 0;
		g->state[v] = ST_CONNECTING;
		pids[v] = h_fork(worker_main, &wk[v]);
	}
	char cov[512];
	size_t off = 0;
	for (int s = 0; s < ST_COUNT; s++)
		off += (size_t)snprintf(cov + off, sizeof(cov) - off, "%s%d %s",
					s ? ", " : "", hits[s], state_name[s]);
	h_log("kills by the victim's state: %s", cov);
	int leased = hits[ST_WRITE_LEASE] + hits[ST_APPENDING] + hits[ST_ASYNC] +
		     hits[ST_READ_LEASES];
	if (!fail && leased < KILLS / 5) {
		h_fail("only %d of %d kills hit a client holding leases or"
		       " operations in flight", leased, KILLS);
		fail = 1;
	}

	/* Every mortal dies for good; the survivors finish and verify. */
	for (int v = 0; v < MORTALS; v++) {
		if (pids[v] <= 0)
			continue;
		kill(pids[v], SIGKILL);
		int rc = h_wait(pids[v], 10000);
		if (rc != 128 + SIGKILL && !fail) {
			h_fail("mortal %d exited %d before the final kill", v, rc);
			fail = 1;
		}
	}
	__atomic_store_n(&g->stop, 1, __ATOMIC_SEQ_CST);
	if (h_wait_all(pids + MORTALS, SURVIVORS, 60000)) {
		h_fail("a survivor failed");
		fail = 1;
	}
	for (int s = 0; s < SURVIVORS; s++)
		h_log("survivor %d ran %" PRIu64 " cycles", s, g->survivor_cycles[s]);

	struct kvp_client *c = h_connect_or_fail(d.sock, "checker", 5000);
	if (!c) {
		h_daemon_kill(&d);
		return H_FAIL;
	}
	int rc;
	/* The daemon learns of deaths by socket hang-up: give it a moment. */
	struct kvp_stats st;
	deadline = h_now_ms() + 5000;
	for (;;) {
		rc = kvp_stats(c, 0, &st);
		if (rc < 0) {
			h_fail("stats: %d (%s)", rc, kvp_last_error(c));
			fail = 1;
			break;
		}
		if (st.leases == 0 && st.clients <= 1)
			break;
		if (h_now_ms() > deadline) {
			h_fail("5 s after every client died or left: %" PRIu64
			       " leases, %" PRIu64 " clients (expected 0 and 1)",
			       st.leases, st.clients);
			fail = 1;
			break;
		}
		h_sleep_ms(5);
	}
	if (rc >= 0 && h_check_accounting(c, NULL))
		fail = 1;
	/* Committed data survives every death. */
	int bad = 0;
	for (int w = 0; w < WORKERS && bad < 5; w++) {
		for (int i = 0; i < USERS_PER_WORKER && bad < 5; i++) {
			uint64_t want = w >= MORTALS ? g->survivor_len[w - MORTALS][i]
						     : UINT64_MAX;
			if (h_verify_user(c, SALT, user_of(w, i), UINT64_MAX, want,
					  NULL))
				bad++;
		}
	}
	if (bad) {
		h_fail("%d users did not read back as committed", bad);
		fail = 1;
	}
	kvp_close(c);
	return h_daemon_finish(&d, fail, t0);
}
