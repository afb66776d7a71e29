/* SPDX-License-Identifier: MIT */
/*
 * test_disk_restart (ctest disk_restart) - the disk tier under a real
 * kvpoold: histories the host tier evicts go to disk and come back byte
 * for byte; a restart with the same disk_dir serves them (warm restart);
 * kill -9 during heavy demotion leaves every history intact up to some
 * point or absent; a disk tier far smaller than the working set drops
 * whole histories (the oldest) and corrupts nothing.
 *
 * The layout's page is 4 KiB; the device tier holds 16 pages, the host
 * tier 64, and USERS users of TOKENS tokens (3 pages) are 180 pages: most
 * histories live only on disk at any moment. Token bytes are a pure
 * function of (user, position) (h_tokens_fill), so any prefix a restart
 * keeps can be checked.
 *
 *  1. tier:     write every user, read every user back (each read brings
 *               it disk -> host -> device), twice.
 *  2. restart:  SIGTERM (kvpoold writes what is in memory to disk as it
 *               stops), start again on the same disk_dir: every user
 *               comes back whole.
 *  3. kill -9:  a writer process appends to every user without end (the
 *               pool demotes to disk all the time); SIGKILL of kvpoold at
 *               a random moment, then a restart: every user absent or a
 *               prefix of what was written, bytes matching; then a
 *               second round of writes continues where each history ends.
 *  4. full:     disk_size of 24 pages: everything is written and read
 *               back or absent; the daemon drops the oldest, and logs it.
 * Run with --workers=2 and the reclaimer on (its host eviction is the
 * other path to disk).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define USERS 60u
#define TOKENS 40u            /* 3 pages of 16 */
#define SALT 0x6469736bull    /* "disk" */
#define DISK_PAGES ((TOKENS + H_PAGE_TOKENS - 1) / H_PAGE_TOKENS)
/* The device tier's 16 pages: the longest history a prepare can take. */
#define DEVICE_TOKENS 256u

static char g_disk[256], g_adisk[300];
/* The kill -9 writer's acknowledged lengths (shared with the parent). */
static uint64_t *g_acked;
static const char *g_sock;
static int g_bad;

static const char *slurp(const char *path)
{
	static char buf[1 << 16];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = '\0';
	return buf;
}

static uint64_t user_of(uint32_t i)
{
	return 50000ull + i;
}

static int start(struct h_daemon *d, const char *disk_size, const char *reclaim)
{
	char a_size[64];

	snprintf(a_size, sizeof(a_size), "--disk_size=%s", disk_size);
	return h_daemon_start(d, 10000, "--device_mem=64K", "--host_mem=256K",
			      g_adisk, a_size, reclaim, "--workers=2", NULL);
}

/* Append n tokens to user in cycles of at most 16, from where it ends. */
static int grow(struct kvp_client *c, uint64_t u, uint32_t n)
{
	while (n) {
		uint32_t k = n < 16 ? n : 16;
		int rc = h_append_cycle(c, SALT, u, UINT64_MAX, k, 0);

		if (rc)
			return rc;
		n -= k;
	}
	return 0;
}

/* Every user reads back: exactly want tokens (UINT64_MAX: any prefix from
 * 0, 0 allowed when may_be_absent). Returns how many were present. */
static uint32_t verify_all(struct kvp_client *c, uint64_t want, bool may_be_absent)
{
	uint32_t present = 0;

	for (uint32_t i = 0; i < USERS; i++) {
		uint64_t len = 0;

		if (h_verify_user(c, SALT, user_of(i), 0, want, &len)) {
			g_bad++;
			continue;
		}
		if (!len && !may_be_absent) {
			h_fail("user %" PRIu64 ": absent, expected %" PRIu64 " tokens",
			       user_of(i), want);
			g_bad++;
		}
		present += len > 0;
	}
	return present;
}

/* kvp_users (kvctl users) lists u with its tokens and no page in memory,
 * its pages and tokens on disk. */
static bool listed_on_disk(struct kvp_client *c, uint64_t u)
{
	struct kvp_user_info rows[256];
	uint64_t cursor = 0, next;
	int n;

	do {
		n = kvp_users(c, cursor, rows, 256, &next);
		for (int i = 0; i < n; i++)
			if (rows[i].user == u)
				return rows[i].len == TOKENS && !rows[i].pages_device &&
				       !rows[i].pages_host &&
				       rows[i].pages_disk == DISK_PAGES &&
				       rows[i].tokens_disk == TOKENS;
		cursor = next;
	} while (n > 0 && next);
	return false;
}

/* offload --tier disk (KVP_SEL_TO_DISK) and evict --tier disk on user 0. */
static void phase_tier_ops(struct kvp_client *c)
{
	uint64_t u = user_of(0);
	struct kvp_user_info ui;
	int rc;

	if (h_verify_user(c, SALT, u, 0, TOKENS, NULL)) /* in memory now */
		g_bad++;
	rc = kvp_evict(c, u, KVP_SEL_TO_DISK);
	if (rc != (int)DISK_PAGES ||
	    kvp_info(c, u, &ui) || ui.len != TOKENS || ui.pages_device ||
	    ui.pages_host || ui.pages_disk != DISK_PAGES || ui.tokens_disk != TOKENS) {
		h_fail("push to disk: %d (%s); then len %" PRIu64 ", %u device, "
		       "%u host and %u disk pages, %" PRIu64 " tokens on disk (want "
		       "%u pages, %u tokens)", rc, rc < 0 ? kvp_last_error(c) : "",
		       ui.len, ui.pages_device, ui.pages_host, ui.pages_disk,
		       ui.tokens_disk, DISK_PAGES, TOKENS);
		g_bad++;
	}
	if (!listed_on_disk(c, u)) {
		h_fail("kvp_users does not list user %" PRIu64 " (only on disk) "
		       "with %u tokens and no device or host page", u, TOKENS);
		g_bad++;
	}
	if (h_verify_user(c, SALT, u, 0, TOKENS, NULL)) /* back from disk */
		g_bad++;
	if (kvp_evict(c, u, KVP_SEL_TO_DISK) < 0 || kvp_evict(c, u, KVP_SEL_DISK) < 1 ||
	    kvp_info(c, u, &ui) || ui.len || ui.pages_disk || ui.tokens_disk) {
		h_fail("evict --tier disk: user %" PRIu64 " still has %" PRIu64
		       " tokens, %u pages on disk (%s)", u, ui.len, ui.pages_disk,
		       kvp_last_error(c));
		g_bad++;
	}
	if (kvp_evict(c, u, KVP_SEL_DISK) != -ENOENT) {
		h_fail("evict --tier disk of nothing: not -ENOENT");
		g_bad++;
	}
	if (grow(c, u, TOKENS)) /* a fresh history again, for what follows */
		g_bad++;
}

static void phase_tier(void)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "tier", 5000);
	struct kvp_stats st;

	if (!c) {
		g_bad++;
		return;
	}
	for (uint32_t i = 0; i < USERS; i++)
		if (grow(c, user_of(i), TOKENS))
			g_bad++;
	verify_all(c, TOKENS, false);
	verify_all(c, TOKENS, false); /* each came back and left again */
	if (kvp_stats(c, 0, &st) || !st.disk_demoted_pages || !st.disk_read_pages ||
	    !st.disk_users || st.disk_dropped_pages) {
		h_fail("tier: stats say %" PRIu64 " pages written to disk, %" PRIu64
		       " read back, %" PRIu64 " users there, %" PRIu64 " dropped",
		       st.disk_demoted_pages, st.disk_read_pages, st.disk_users,
		       st.disk_dropped_pages);
		g_bad++;
	}
	phase_tier_ops(c);
	kvp_close(c);
	h_log("tier: %u users of %u tokens read back twice", USERS, TOKENS);
}

static void phase_restart(struct h_daemon *d)
{
	struct kvp_client *c;
	uint32_t present;

	if (h_daemon_stop(d, 10000) || start(d, "8M", "--reclaim=yes")) {
		g_bad++;
		return;
	}
	c = h_connect_or_fail(g_sock, "restart", 5000);
	if (!c) {
		g_bad++;
		return;
	}
	present = verify_all(c, UINT64_MAX, true);
	/* A clean stop wrote what was in memory to disk too: all come back. */
	if (present != USERS) {
		h_fail("restart: only %u of %u users came back from disk", present,
		       USERS);
		g_bad++;
	}
	for (uint32_t i = 0; i < USERS; i++) {
		struct kvp_user_info ui;

		if (kvp_info(c, user_of(i), &ui) == 0 && ui.len &&
		    ui.len != TOKENS) {
			h_fail("restart: user %" PRIu64 " came back with %" PRIu64
			       " tokens, not %u", user_of(i), ui.len, TOKENS);
			g_bad++;
		}
	}
	kvp_close(c);
	h_log("restart: %u of %u users served from disk", present, USERS);
}

static int writer_main(void *arg)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "writer", 5000);

	(void)arg;
	if (!c)
		return H_FAIL;
	for (uint32_t round = 0;; round++) {
		bool room = false;

		for (uint32_t i = 0; i < USERS; i++) {
			/* A history the device tier cannot take whole is
			 * left as it is (a fast disk gets there before the
			 * kill); the others go on. */
			if (g_acked[i] + 8 + 20 > DEVICE_TOKENS)
				continue;
			room = true;
			if (h_append_cycle(c, SALT, user_of(i), UINT64_MAX, 8, 1))
				return H_PASS; /* the daemon died under us */
			__atomic_add_fetch(&g_acked[i], 8, __ATOMIC_SEQ_CST);
		}
		if (!room) { /* every history is full: wait for the kill */
			struct kvp_user_info ui;

			if (kvp_info(c, user_of(0), &ui))
				return H_PASS;
			h_sleep_ms(10);
		}
	}
}

static void phase_kill(struct h_daemon *d)
{
	struct kvp_client *c;
	uint64_t written = 0;
	uint32_t present;
	pid_t w;

	g_acked = mmap(NULL, USERS * sizeof(*g_acked), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (g_acked == MAP_FAILED) {
		g_bad++;
		return;
	}
	for (uint32_t i = 0; i < USERS; i++)
		g_acked[i] = TOKENS;
	w = h_fork(writer_main, NULL);
	if (w < 0) {
		g_bad++;
		return;
	}
	h_sleep_ms(300 + (unsigned)(h_mix64((uint64_t)getpid()) % 700));
	h_daemon_kill(d); /* SIGKILL: the disk thread mid-write */
	h_wait(w, 10000);
	if (start(d, "8M", "--reclaim=no")) {
		g_bad++;
		return;
	}
	c = h_connect_or_fail(g_sock, "after-kill", 5000);
	if (!c) {
		g_bad++;
		return;
	}
	present = verify_all(c, UINT64_MAX, true);
	/* Never more than was written: the bytes of a longer history would
	 * match the pattern too. One commit of 8 may have been in flight. */
	for (uint32_t i = 0; i < USERS; i++) {
		struct kvp_user_info ui;

		if (kvp_info(c, user_of(i), &ui) == 0 && ui.len > g_acked[i] + 8) {
			h_fail("kill -9: user %" PRIu64 " has %" PRIu64 " tokens but "
			       "only %" PRIu64 " were acknowledged", user_of(i),
			       ui.len, g_acked[i]);
			g_bad++;
		}
		written += g_acked[i];
	}
	/* Carry on from where each history ends: continuity holds. */
	for (uint32_t i = 0; i < USERS; i++)
		if (grow(c, user_of(i), 20))
			g_bad++;
	verify_all(c, UINT64_MAX, false);
	kvp_close(c);
	h_log("kill -9: %u of %u users came back, each a checked prefix (%"
	      PRIu64 " tokens had been written)", present, USERS, written);
	munmap(g_acked, USERS * sizeof(*g_acked));
}

/*
 * Read user u back through a read-only lease at pos (info first would race
 * with the disk tier dropping it for room): absent (0) or exactly pos
 * tokens from 0 with the bytes written. Returns the tokens, -1 on a fault.
 */
static int64_t read_back(struct kvp_client *c, uint64_t u, uint64_t pos)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	uint32_t P = l->page_tokens;
	struct kvp_slot *slots = calloc(pos, sizeof(*slots));
	uint8_t *got = malloc(pos * l->token_bytes);
	uint8_t *want = malloc(pos * l->token_bytes);
	struct kvp_lease ls;
	int64_t ret = -1;
	int rc;

	if (!slots || !got || !want)
		goto out;
	rc = kvp_prepare(c, u, pos, 0, &ls);
	if (rc) {
		h_fail("user %" PRIu64 ": read-only prepare at %" PRIu64 ": %d (%s)",
		       u, pos, rc, kvp_last_error(c));
		goto out;
	}
	if (ls.len && (ls.start != 0 || ls.len != pos)) {
		h_fail("user %" PRIu64 ": lease of [%" PRIu64 ", +%" PRIu64 "), "
		       "wrote [0, %" PRIu64 ")", u, ls.start, ls.len, pos);
	} else if (ls.len) {
		for (uint64_t i = 0; i < pos; i++)
			slots[i] = (struct kvp_slot){ .frame = (uint32_t)ls.indices[i / P],
						      .slot = (uint32_t)(i % P) };
		kvp_read_cpu(l, kvp_device_base(c), slots, (uint32_t)pos, got);
		h_tokens_fill(l, SALT, u, 0, (uint32_t)pos, want);
		if (memcmp(got, want, pos * l->token_bytes))
			h_fail("user %" PRIu64 ": bytes differ from what was written", u);
		else
			ret = (int64_t)pos;
	} else {
		ret = 0;
	}
	kvp_release(c, ls.id);
out:
	free(slots);
	free(got);
	free(want);
	return ret;
}

static void phase_full(struct h_daemon *d)
{
	struct kvp_client *c;
	uint32_t present;
	const char *log;

	if (h_daemon_stop(d, 10000) || start(d, "192K", "--reclaim=no")) {
		g_bad++;
		return;
	}
	c = h_connect_or_fail(g_sock, "full", 5000);
	if (!c) {
		g_bad++;
		return;
	}
	for (uint32_t i = 0; i < USERS; i++)
		if (grow(c, user_of(i) + 1000, TOKENS))
			g_bad++;
	present = 0;
	for (uint32_t i = 0; i < USERS; i++) {
		int64_t len = read_back(c, user_of(i) + 1000, TOKENS);

		if (len < 0)
			g_bad++;
		present += len == TOKENS;
	}
	if (present == USERS) {
		h_fail("full: a disk tier of 24 pages kept all %u users", USERS);
		g_bad++;
	}
	kvp_close(c);
	log = slurp(d->log);
	/* The disk thread drops the oldest for room ("disk tier full"), or,
	 * when it lags behind eviction (a loaded machine), demotion finds
	 * staging full first: either is logged. */
	if (!strstr(log, "disk tier full") && !strstr(log, "disk tier staging full")) {
		h_fail("full: the daemon did not log that the disk tier is full");
		g_bad++;
	}
	h_log("full: %u of %u users kept, the rest dropped whole", present, USERS);
}

int main(int argc, char **argv)
{
	uint64_t t0 = h_now_ms();
	struct h_daemon d;

	h_init(argc, argv, "disk_restart");
	if (h_daemon_dir(&d, 0))
		return H_FAIL;
	snprintf(g_disk, sizeof(g_disk), "%s/disk", d.dir);
	snprintf(g_adisk, sizeof(g_adisk), "--disk_dir=%s", g_disk);
	if (mkdir(g_disk, 0700)) {
		h_fail("mkdir %s: %m", g_disk);
		return H_FAIL;
	}
	g_sock = d.sock;
	if (start(&d, "8M", "--reclaim=yes"))
		return h_daemon_end(&d, 1);
	phase_tier();
	phase_restart(&d);
	phase_kill(&d);
	phase_full(&d);
	return h_daemon_finish(&d, g_bad, t0);
}
