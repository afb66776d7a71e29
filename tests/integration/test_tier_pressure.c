/* SPDX-License-Identifier: MIT */
/*
 * test_tier_pressure - with more data than the device tier holds, pages
 * move device -> host -> device under many clients and no byte changes;
 * pages under a lease never move.
 *
 * The device tier holds 512 pages, the host tier 8192. Three writer
 * processes append to 40 users each until every user has >= 256 tokens
 * (about 2000 pages in all), reading a random user of theirs back now and
 * then, so the pool demotes least recently used users to the host tier and
 * onloads them again when their writer comes back;
 * appends land in partial last pages whose older host copies must not
 * come back stale. Meanwhile a pinner process holds read-only leases on
 * its own users and keeps reading their bytes through the page tables it
 * was given: pinned frames must neither move nor be overwritten. At the end
 * every user reads back byte for byte with exactly the tokens written (each
 * check onloads), nothing was dropped (the host tier had room), pages were
 * demoted and onloaded, and the frame accounting adds up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define WRITERS 3
#define USERS_PER_WRITER 40
#define MIN_TOKENS 256
#define PIN_USERS 4
#define PIN_TOKENS 64
#define SALT 0x7469657273ull /* "tiers" */

struct shared {
	volatile int stop;
	uint64_t len[WRITERS][USERS_PER_WRITER];
	volatile uint64_t pin_checks;
};
static struct shared *g;
static const char *g_sock;

static uint64_t user_of(int w, int i)
{
	return 10000ull * (uint64_t)(w + 1) + (uint64_t)i;
}

static int writer_main(void *arg)
{
	int w = (int)(intptr_t)arg;
	char name[32];
	snprintf(name, sizeof(name), "writer-%d", w);
	h_set_name(name);
	struct kvp_client *c = h_connect_or_fail(g_sock, name, 5000);
	if (!c)
		return H_FAIL;
	int result = H_FAIL;
	struct h_rng r;
	h_rng_seed(&r, 0x77000 + (uint64_t)w);
	uint64_t *len = g->len[w];
	for (;;) {
		int done = 1;
		for (int k = 0; k < USERS_PER_WRITER; k++) {
			int i = (int)h_rng_below(&r, USERS_PER_WRITER);
			if (len[i] >= MIN_TOKENS)
				continue;
			done = 0;
			uint32_t n = 1 + (uint32_t)h_rng_below(&r, 40);
			if (h_append_cycle(c, SALT, user_of(w, i), len[i], n, 0))
				goto fail;
			len[i] += n;
			/* Read another user back now and then: more onloads. */
			if (h_rng_below(&r, 4) == 0) {
				int j = (int)h_rng_below(&r, USERS_PER_WRITER);
				if (h_verify_user(c, SALT, user_of(w, j), 0, len[j], NULL))
					goto fail;
			}
		}
		if (done) {
			int all = 1;
			for (int i = 0; i < USERS_PER_WRITER; i++)
				all &= len[i] >= MIN_TOKENS;
			if (all)
				break;
		}
	}
	result = H_PASS;
fail:
	kvp_close(c);
	return result;
}

struct pinned {
	uint64_t id;
	uint32_t npages;
	int32_t frames[16];
};

/* Read the held users' bytes through the frames their leases gave. */
static int check_pinned(struct kvp_client *c, const struct pinned *p, int n)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	uint8_t got[PIN_TOKENS * 256], want[PIN_TOKENS * 256];
	struct kvp_slot slots[PIN_TOKENS];
	if (PIN_TOKENS * l->token_bytes > sizeof(got))
		return -1;
	for (int u = 0; u < n; u++) {
		for (uint32_t t = 0; t < PIN_TOKENS; t++) {
			slots[t].frame = (uint32_t)p[u].frames[t / l->page_tokens];
			slots[t].slot = t % l->page_tokens;
		}
		kvp_read_cpu(l, kvp_device_base(c), slots, PIN_TOKENS, got);
		h_tokens_fill(l, SALT, 900 + (uint64_t)u, 0, PIN_TOKENS, want);
		if (memcmp(got, want, PIN_TOKENS * l->token_bytes)) {
			h_fail("user %d: bytes under a held lease changed (its pages"
			       " were moved or reused while pinned)", 900 + u);
			return -1;
		}
	}
	return 0;
}

static int pinner_main(void *arg)
{
	(void)arg;
	h_set_name("pinner");
	struct kvp_client *c = h_connect_or_fail(g_sock, "pinner", 5000);
	if (!c)
		return H_FAIL;
	int result = H_FAIL;
	for (int u = 0; u < PIN_USERS; u++)
		if (h_append_cycle(c, SALT, 900 + (uint64_t)u, 0, PIN_TOKENS, 0))
			goto fail;
	while (!g->stop) {
		struct pinned p[PIN_USERS];
		for (int u = 0; u < PIN_USERS; u++) {
			struct kvp_lease ls;
			int rc = kvp_prepare(c, 900 + (uint64_t)u, PIN_TOKENS, 0, &ls);
			if (rc < 0 || ls.npages > 16) {
				h_fail("read-only prepare of user %d: %d (%s)", 900 + u,
				       rc, kvp_last_error(c));
				goto fail;
			}
			/* indices live in the arena until the next call: copy. */
			p[u].id = ls.id;
			p[u].npages = ls.npages;
			memcpy(p[u].frames, ls.indices, ls.npages * sizeof(int32_t));
		}
		/* Hold them while the writers push everything else around. */
		for (int k = 0; k < 20 && !g->stop; k++) {
			if (check_pinned(c, p, PIN_USERS))
				goto fail;
			g->pin_checks++;
			h_sleep_us(200);
		}
		for (int u = 0; u < PIN_USERS; u++)
			if (kvp_release(c, p[u].id) < 0) {
				h_fail("release: %s", kvp_last_error(c));
				goto fail;
			}
		/* Unpinned for a while: they may be demoted, then onloaded. */
		h_sleep_ms(5);
		for (int u = 0; u < PIN_USERS; u++)
			if (h_verify_user(c, SALT, 900 + (uint64_t)u, 0, PIN_TOKENS,
					  NULL))
				goto fail;
	}
	result = H_PASS;
fail:
	kvp_close(c);
	return result;
}

/* One run against a daemon with `workers` worker threads. */
static int run(int workers)
{
	char wflag[32];
	snprintf(wflag, sizeof(wflag), "--workers=%d", workers);
	h_log("---- kvpoold with %d worker thread(s)", workers);
	uint64_t t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	struct h_daemon d;
	if (h_daemon_up(&d, "--device_mem=2M", "--host_mem=32M", wflag,
			(char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	int fail = 0;

	pid_t pinner = h_fork(pinner_main, NULL);
	pid_t pids[WRITERS];
	for (int w = 0; w < WRITERS; w++)
		pids[w] = h_fork(writer_main, (void *)(intptr_t)w);
	if (h_wait_all(pids, WRITERS, 90000)) {
		h_fail("a writer failed");
		fail = 1;
	}
	g->stop = 1;
	if (h_wait(pinner, 20000) != 0) {
		h_fail("the pinner failed");
		fail = 1;
	}
	h_log("pinned pages read back %" PRIu64 " times under pressure",
	      g->pin_checks);

	struct kvp_client *c = h_connect_or_fail(d.sock, "checker", 5000);
	if (!c) {
		h_daemon_kill(&d);
		return H_FAIL;
	}
	int bad = 0;
	uint64_t tokens = 0;
	for (int w = 0; w < WRITERS && !fail; w++)
		for (int i = 0; i < USERS_PER_WRITER && bad < 5; i++) {
			tokens += g->len[w][i];
			if (h_verify_user(c, SALT, user_of(w, i), 0, g->len[w][i], NULL))
				bad++;
		}
	if (bad) {
		h_fail("%d users did not read back as written after moving between"
		       " tiers", bad);
		fail = 1;
	}
	struct kvp_stats st;
	if (h_check_accounting(c, &st))
		fail = 1;
	h_log("%" PRIu64 " tokens in %d users; demoted %" PRIu64 " pages (%" PRIu64
	      " users), onloaded %" PRIu64 ", evicted %" PRIu64 " users", tokens,
	      WRITERS * USERS_PER_WRITER, st.demoted_pages, st.demoted_users,
	      st.onloaded_pages, st.evicted_users);
	if (!fail && (st.demoted_pages == 0 || st.onloaded_pages == 0)) {
		h_fail("no pressure: %" PRIu64 " pages demoted, %" PRIu64 " onloaded",
		       st.demoted_pages, st.onloaded_pages);
		fail = 1;
	}
	if (st.evicted_users) {
		h_fail("%" PRIu64 " users were dropped although the host tier had"
		       " room for everything", st.evicted_users);
		fail = 1;
	}
	kvp_close(c);
	return h_daemon_finish(&d, fail, t0);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_tier_pressure");
	return h_run_with_1_then_2_workers(run);
}
