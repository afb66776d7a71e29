/* SPDX-License-Identifier: MIT */
/*
 * test_racing_writers - processes racing to append to the same users never
 * write the same positions twice and never leave a gap: the continuity
 * check and the one-writer-per-user rule hold across processes.
 *
 * 4 processes append to the same 4 users with no coordination at all:
 * info, then prepare from start+len. A prepare either wins (append,
 * commit, release), or loses with -EBUSY (another process holds the user's
 * write reservation) or -EINVAL "overlapping tokens" (another process
 * committed in between); a loser retries from the new end. The token bytes
 * depend only on (user, position), so whoever wins writes the same bytes.
 * Afterwards each user's length equals the sum of what every process
 * committed to it, every byte reads back, and nothing is leased.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PROCS 4
#define USERS 4
#define WINS 1500 /* successful appends each process makes */
#define SALT 0x72616365ull /* "race" */

struct shared {
	volatile int go;
	uint64_t committed[PROCS][USERS];
	uint64_t busy[PROCS], overlap[PROCS];
};
static struct shared *g;
static const char *g_sock;

static int racer_main(void *arg)
{
	int p = (int)(intptr_t)arg;
	char name[32];
	snprintf(name, sizeof(name), "racer-%d", p);
	h_set_name(name);
	struct kvp_client *c = h_connect_or_fail(g_sock, name, 5000);
	if (!c)
		return H_FAIL;
	int result = H_FAIL;
	const struct kvp_layout *l = kvp_client_layout(c);
	uint8_t kv[24 * 256];
	struct h_rng r;
	h_rng_seed(&r, 0xace0 + (uint64_t)p);
	while (!__atomic_load_n(&g->go, __ATOMIC_ACQUIRE))
		h_sleep_us(100);
	uint64_t deadline = h_now_ms() + 60000;
	for (int wins = 0; wins < WINS;) {
		if (h_now_ms() > deadline) {
			h_fail("only %d wins in 60 s", wins);
			goto fail;
		}
		int i = (int)h_rng_below(&r, USERS);
		uint64_t u = 700 + (uint64_t)i;
		struct kvp_user_info ui;
		if (kvp_info(c, u, &ui) < 0) {
			h_fail("info: %s", kvp_last_error(c));
			goto fail;
		}
		uint64_t pos = ui.len ? ui.start + ui.len : 0;
		uint32_t n = 1 + (uint32_t)h_rng_below(&r, 24);
		struct kvp_lease ls;
		int rc = kvp_prepare(c, u, pos, n, &ls);
		if (rc == -EBUSY) {
			g->busy[p]++;
			continue;
		}
		if (rc == -EINVAL && strstr(kvp_last_error(c), "overlapping tokens")) {
			g->overlap[p]++;
			continue;
		}
		if (rc < 0) {
			h_fail("prepare(%" PRIu64 ", %" PRIu64 ", %u): %d (%s)", u, pos,
			       n, rc, kvp_last_error(c));
			goto fail;
		}
		if (ls.start + ls.len != pos) {
			h_fail("user %" PRIu64 ": won a lease from %" PRIu64 " but the"
			       " history ends at %" PRIu64, u, pos, ls.start + ls.len);
			goto fail;
		}
		h_tokens_fill(l, SALT, u, pos, n, kv);
		if (kvp_append(c, &ls, 0, n, kv) < 0 ||
		    kvp_commit(c, ls.id, n) < 0 || kvp_release(c, ls.id) < 0) {
			h_fail("user %" PRIu64 ": append/commit/release: %s", u,
			       kvp_last_error(c));
			goto fail;
		}
		g->committed[p][i] += n;
		wins++;
	}
	result = H_PASS;
fail:
	kvp_close(c);
	return result;
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_racing_writers");
	uint64_t t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	struct h_daemon d;
	if (h_daemon_up(&d, "--device_mem=64M", "--host_mem=16M", "--workers=2",
			(char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	int fail = 0;
	pid_t pids[PROCS];
	for (int p = 0; p < PROCS; p++)
		pids[p] = h_fork(racer_main, (void *)(intptr_t)p);
	__atomic_store_n(&g->go, 1, __ATOMIC_RELEASE);
	if (h_wait_all(pids, PROCS, 90000)) {
		h_fail("a racer failed");
		fail = 1;
	}
	uint64_t busy = 0, overlap = 0;
	for (int p = 0; p < PROCS; p++) {
		busy += g->busy[p];
		overlap += g->overlap[p];
	}
	h_log("%d wins, %" PRIu64 " prepares lost with -EBUSY, %" PRIu64
	      " with an overlap", PROCS * WINS, busy, overlap);

	struct kvp_client *c = h_connect_or_fail(d.sock, "checker", 5000);
	if (!c) {
		h_daemon_kill(&d);
		return H_FAIL;
	}
	for (int i = 0; i < USERS && !fail; i++) {
		uint64_t want = 0;
		for (int p = 0; p < PROCS; p++)
			want += g->committed[p][i];
		if (h_verify_user(c, SALT, 700 + (uint64_t)i, 0, want, NULL))
			fail = 1;
	}
	struct kvp_stats st;
	if (h_check_accounting(c, &st) || st.leases) {
		h_fail("after the race: accounting off or %" PRIu64 " leases",
		       st.leases);
		fail = 1;
	}
	kvp_close(c);
	return h_daemon_finish(&d, fail, t0);
}
