/* SPDX-License-Identifier: MIT */
/*
 * test_move - a user's history moved between pools (issue 31, kvp_move,
 * kvctl move) on a real kvpoold with devices = 0,1 on the shm backend: two
 * pools, each its own device memfd, one host tier for both, 16 frames a
 * tier.
 *
 *  - bytes appended through pool 0 read back identical through pool 1's
 *    mapping after the move, the same start and length; pool 0 no longer
 *    has the user (info: nothing cached), pool 1 goes on appending from
 *    there; no frame leaked in either
 *    pool (each pool's frames used == the pages its users hold);
 *  - pages only in pool 0's host tier land in pool 1's host tier, and back;
 *  - the two pools share one host tier (host_mem is the tenant's, not each
 *    pool's): offloads of both take its frames, and when they are all
 *    taken an offload is refused with the reason;
 *  - errors change nothing: the same pool, a pool that does not exist
 *    (-EINVAL), an unknown user (-ENOENT), a prepared and uncommitted
 *    lease (-EBUSY "commit or release first"), a user pool 1 has already
 *    (-EEXIST), pool 1 full of leased pages (-ENOSPC, pool 0 unchanged);
 *  - moves back and forth while a reader in each pool reads the history:
 *    no reader sees part of it or other bytes, and at the end one pool has
 *    it whole;
 *  - a chunk entry copied from pool 0 into pool 1 (kvp_chunk_copy) with
 *    the entries it hangs under and its name's root: the same ids, the
 *    same bytes through pool 1's mapping, pool 0 unchanged; a second copy
 *    copies nothing; errors (unknown, same pool, no such pool, filling)
 *    change nothing;
 *  - a tenant's own client (not an admin) moves its users; another
 *    tenant's client naming the same id reaches only its own (-ENOENT);
 *  - kvctl move --user U --from A --to B does it from the shell; a bad
 *    command line is exit 2 before connecting.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SALT 0x3107ull
#define FRAMES 16u          /* device_mem = host_mem = 64K of 4 KiB pages */

struct world {
	struct h_daemon d;
	struct kvp_client *c[2];  /* attached to pool 0 and pool 1 */
};

static struct kvp_client *attach(const char *sock, uint32_t pool)
{
	struct kvp_connect_opts o = { .socket = sock, .name = "test_move",
				      .pool = pool };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN];
	int rc = kvp_connect(&c, &o, err, sizeof(err));

	if (rc)
		fail_msg("attach to pool %u: %s", pool, err);
	return c;
}

static int setup(void **state)
{
	const char *extra[] = { "--devices=0,1", "--device_mem=64K", "--host_mem=64K",
				"--workers=2", "--layout=" H_LAYOUT, NULL };
	struct world *w = calloc(1, sizeof(*w));

	if (!w || h_daemon_dir(&w->d, 0) || h_daemon_startv(&w->d, 10000, extra))
		return -1;
	w->c[0] = attach(w->d.sock, 0);
	w->c[1] = attach(w->d.sock, 1);
	*state = w;
	return 0;
}

static int teardown(void **state)
{
	struct world *w = *state;
	int fail;

	kvp_close(w->c[0]);
	kvp_close(w->c[1]);
	fail = h_daemon_stop(&w->d, 10000) != 0;
	h_daemon_end(&w->d, fail);
	free(w);
	return fail ? -1 : 0;
}

static struct kvp_user_info info(struct kvp_client *c, uint64_t user)
{
	struct kvp_user_info u;

	memset(&u, 0, sizeof(u));
	assert_int_equal(kvp_info(c, user, &u), 0);
	return u;
}

/*
 * Each pool's frames add up and the frames used are exactly the pages its
 * users hold (the test's users are 1 to USERS_MAX), with no lease left:
 * nothing leaked in either pool. The device tier is each pool's own (used
 * + free == total); the host tier is one, shared by both (shard.h): each
 * pool counts its own pages as used and both show the shared tier's free
 * frames, FRAMES less what both pools use. kvp_info of a client answers
 * for its own pool (kvp_users of an admin spans both).
 */
#define USERS_MAX 64
static void no_frame_leaked(struct world *w)
{
	struct kvp_stats st[2];
	uint64_t host_used = 0;

	for (int p = 0; p < 2; p++) {
		assert_int_equal(kvp_stats_pool(w->c[p], 0, (uint32_t)p, &st[p]), 0);
		host_used += st[p].tier[KVP_TIER_HOST].frames_used;
	}
	for (int p = 0; p < 2; p++) {
		uint64_t held[KVP_TIERS] = { 0 }, users = 0;

		for (uint64_t u = 1; u <= USERS_MAX; u++) {
			struct kvp_user_info ui = info(w->c[p], u);

			held[KVP_TIER_DEVICE] += ui.pages_device;
			held[KVP_TIER_HOST] += ui.pages_host;
			users += ui.len > 0;
		}
		for (int t = 0; t < KVP_TIERS; t++) {
			const struct kvp_tier_stats *x = &st[p].tier[t];
			uint64_t free = t == KVP_TIER_HOST ? FRAMES - host_used :
					x->frames_total - x->frames_used;

			if (x->frames_free != free || x->frames_total != FRAMES ||
			    x->frames_used != held[t])
				fail_msg("pool %d, %s tier: %" PRIu64 " used, %" PRIu64
					 " free of %" PRIu64 " (want %u, %" PRIu64 " free); "
					 "its users hold %" PRIu64 " pages", p,
					 kvp_tier_name(t), x->frames_used, x->frames_free,
					 x->frames_total, FRAMES, free, held[t]);
		}
		if (st[p].users != users || st[p].leases)
			fail_msg("pool %d: stats count %" PRIu64 " users and %" PRIu64
				 " leases; %" PRIu64 " users have tokens, no lease "
				 "should be left", p, st[p].users, st[p].leases, users);
	}
}

static void expect_move_error(struct world *w, uint64_t user, uint32_t from,
			      uint32_t to, int want, const char *words)
{
	int rc = kvp_move(w->c[0], user, from, to);

	if (rc != want || !strstr(kvp_last_error(w->c[0]), words))
		fail_msg("move of user %" PRIu64 " from %u to %u: %d '%s'; want %d "
			 "and '%s'", user, from, to, rc, kvp_last_error(w->c[0]),
			 want, words);
}

/* Appended through pool 0, read back through pool 1's mapping. */
static void device_history_moves(void **state)
{
	struct world *w = *state;
	uint64_t len = 0;

	assert_int_equal(h_append_cycle(w->c[0], SALT, 1, 0, 40, 0), 0);
	assert_int_equal(info(w->c[0], 1).pages_device, 3);
	assert_int_equal(kvp_move(w->c[0], 1, 0, 1), 3);
	assert_int_equal(h_verify_user(w->c[1], SALT, 1, 0, 40, &len), 0);
	assert_int_equal(len, 40);
	assert_int_equal(info(w->c[1], 1).pages_device, 3);
	assert_int_equal(info(w->c[0], 1).len, 0);
	assert_int_equal(info(w->c[0], 1).pages_device, 0);
	/* Pool 1 goes on from its end. */
	assert_int_equal(h_append_cycle(w->c[1], SALT, 1, 40, 10, 0), 0);
	assert_int_equal(h_verify_user(w->c[1], SALT, 1, 0, 50, &len), 0);
	no_frame_leaked(w);
}

/* A history only in the host tier moves to the host tier, and back. */
static void host_pages_move(void **state)
{
	struct world *w = *state;
	struct kvp_user_info u;

	assert_int_equal(h_append_cycle(w->c[0], SALT, 2, 0, 20, 0), 0);
	assert_int_equal(kvp_offload(w->c[0], 2), 2);
	assert_true(kvp_evict(w->c[0], 2, KVP_SEL_DEVICE) >= 0);
	u = info(w->c[0], 2);
	assert_int_equal(u.pages_device, 0);
	assert_int_equal(u.pages_host, 2);
	assert_int_equal(kvp_move(w->c[0], 2, 0, 1), 2);
	u = info(w->c[1], 2);
	assert_int_equal(u.len, 20);
	assert_int_equal(u.pages_device, 0);
	assert_int_equal(u.pages_host, 2);
	assert_int_equal(info(w->c[0], 2).len, 0);
	no_frame_leaked(w);
	/* Back, the higher pool first this time (the locks go in pool order). */
	assert_int_equal(kvp_move(w->c[1], 2, 1, 0), 2);
	assert_int_equal(info(w->c[1], 2).len, 0);
	assert_int_equal(h_verify_user(w->c[0], SALT, 2, 0, 20, NULL), 0);
	no_frame_leaked(w);
}

/* One host tier for both pools (kvpool.conf(5), host_mem): pages offloaded
 * from pool 0 and from pool 1 take frames of the same FRAMES, and once
 * they are all taken an offload from either pool is refused with the
 * reason, changing nothing. */
static void pools_share_the_host_tier(void **state)
{
	struct world *w = *state;
	struct kvp_stats st;

	/* Host copies of the earlier tests' users dropped (their device
	 * copies stay): the tier starts empty. */
	for (uint32_t p = 0; p < 2; p++)
		for (uint64_t u = 1; u <= USERS_MAX; u++)
			if (info(w->c[p], u).pages_device && info(w->c[p], u).pages_host)
				assert_true(kvp_evict(w->c[p], u, KVP_SEL_HOST) >= 0);
	assert_int_equal(kvp_stats_pool(w->c[0], 0, 0, &st), 0);
	assert_int_equal(st.tier[KVP_TIER_HOST].frames_free, FRAMES);
	/* 3 + 3 + 2 pages of each pool's users: 16 host frames in all. */
	for (uint64_t u = 45; u <= 47; u++) {
		uint32_t n = u == 47 ? 20 : 40;

		assert_int_equal(h_append_cycle(w->c[0], SALT, u, 0, n, 0), 0);
		assert_int_equal(h_append_cycle(w->c[1], SALT, u, 0, n, 0), 0);
		assert_int_equal(kvp_offload(w->c[0], u), u == 47 ? 2 : 3);
		assert_int_equal(kvp_offload(w->c[1], u), u == 47 ? 2 : 3);
	}
	assert_int_equal(kvp_stats_pool(w->c[1], 0, 1, &st), 0);
	assert_int_equal(st.tier[KVP_TIER_HOST].frames_used, 8);
	assert_int_equal(st.tier[KVP_TIER_HOST].frames_free, 0);
	no_frame_leaked(w);
	/* Full: pool 1's next offload finds no frame pool 1 may drop. */
	assert_int_equal(h_append_cycle(w->c[1], SALT, 48, 0, 10, 0), 0);
	assert_true(kvp_offload(w->c[1], 48) < 0);
	assert_non_null(strstr(kvp_last_error(w->c[1]), "host_mem"));
	assert_int_equal(info(w->c[1], 48).pages_host, 0);
	/* Dropping pool 0's copies gives both pools the frames back. */
	for (uint64_t u = 45; u <= 47; u++)
		assert_true(kvp_evict(w->c[0], u, KVP_SEL_HOST) >= 0);
	assert_int_equal(kvp_offload(w->c[1], 48), 1);
	for (uint64_t u = 45; u <= 47; u++) {
		assert_int_equal(h_verify_user(w->c[1], SALT, u, 0, u == 47 ? 20 : 40,
					       NULL), 0);
		assert_int_equal(h_verify_user(w->c[0], SALT, u, 0, u == 47 ? 20 : 40,
					       NULL), 0);
	}
	no_frame_leaked(w);
	/* Gone from both pools, for the tests after this one. */
	for (uint32_t p = 0; p < 2; p++)
		for (uint64_t u = 45; u <= 47u + p; u++)
			assert_true(kvp_evict(w->c[p], u, KVP_SEL_ALL) >= 0);
	no_frame_leaked(w);
}

/* ------------------------------------------------------------ chunks */

/* The fill lease's tokens from h_tokens_fill(salt) (h_fill_lease), sealed. */
static void fill_seal(struct kvp_client *c, struct kvp_chunk_reg *reg, uint64_t salt)
{
	if (h_fill_lease(c, &reg->lease, salt, reg->tokens) || kvp_chunk_seal(c, reg))
		fail_msg("fill and seal: %s", kvp_last_error(c));
}

/* A root of n tokens (ids from base), type, filled with salt base. */
static struct kvp_chunk_reg chunk_root(struct kvp_client *c, uint32_t base,
				       uint32_t n, uint32_t type, bool fill)
{
	struct kvp_chunk_reg reg;
	uint32_t t[64];

	assert_true(n <= 64);
	h_token_ids(t, n, base);
	if (kvp_chunk_register(c, t, n, type, "{\"source\":\"test_move\"}", &reg))
		fail_msg("register %u tokens from %u: %s", n, base, kvp_last_error(c));
	assert_true(reg.created);
	if (fill)
		fill_seal(c, &reg, base);
	return reg;
}

/* Entry id read through c's pool (a read lease, its pages through c's
 * mapping: h_same_bytes) holds what fill_seal(salt) wrote. */
static void chunk_reads(struct kvp_client *c, const struct kvp_chunk_id *id,
			uint64_t salt, const char *what)
{
	struct kvp_lease l;

	if (kvp_chunk_acquire(c, id, 0, &l))
		fail_msg("%s: acquire: %s", what, kvp_last_error(c));
	assert_int_equal(h_same_bytes(c, l.indices, salt, 0, (uint32_t)l.len, what), 0);
	assert_int_equal(kvp_release(c, l.id), 0);
}

static void expect_copy_error(struct kvp_client *c, const struct kvp_chunk_id *id,
			      uint32_t from, uint32_t to, int want, const char *words)
{
	int rc = kvp_chunk_copy(c, id, from, to);

	if (rc != want || !strstr(kvp_last_error(c), words))
		fail_msg("chunk copy from %u to %u: %d '%s'; want %d and '%s'", from,
			 to, rc, kvp_last_error(c), want, words);
}

/*
 * A chunk registered through pool 0 is copied into pool 1 (kvp_chunk_copy,
 * issue 31): a system prompt (40 tokens: 3 pages), a document's name (its
 * root entry, 20 tokens: 2 pages) and the document linked after the
 * prompt (2 pages). Copying the link brings the chain it hangs under and
 * its name's root: 7 pages, read back through pool 1's mapping byte for
 * byte under the same ids; pool 0 keeps them; a second copy copies
 * nothing. Errors change nothing: an unknown id, the same pool, a pool
 * that does not exist, an entry still being filled.
 */
static void chunks_copy_between_pools(void **state)
{
	struct world *w = *state;
	struct kvp_chunk_reg sys, doc, link, filling;
	struct kvp_chunk_id nobody;
	struct kvp_chunk_entry_info ei;

	sys = chunk_root(w->c[0], 3000, 40, KVP_CHUNK_SYSTEM, true);
	doc = chunk_root(w->c[0], 4000, 20, KVP_CHUNK_CONTEXT, true);
	if (kvp_chunk_link(w->c[0], &doc.name, &sys.id, 0, &link) || !link.created)
		fail_msg("link: %s", kvp_last_error(w->c[0]));
	fill_seal(w->c[0], &link, 0x31);
	assert_int_equal(kvp_chunk_acquire(w->c[1], &link.id, 0, &(struct kvp_lease){ 0 }),
			 -ENOENT);

	assert_int_equal(kvp_chunk_copy(w->c[0], &link.id, 0, 1), 7);
	chunk_reads(w->c[1], &sys.id, 3000, "the prompt in pool 1");
	chunk_reads(w->c[1], &doc.id, 4000, "the document's root in pool 1");
	chunk_reads(w->c[1], &link.id, 0x31, "the linked document in pool 1");
	assert_int_equal(kvp_chunk_entry(w->c[1], &link.id, &ei), 0);
	assert_int_equal(ei.start, 40);
	assert_int_equal(ei.tokens, 20);
	chunk_reads(w->c[0], &link.id, 0x31, "the linked document in pool 0");
	/* There already: nothing to copy, either way round. */
	assert_int_equal(kvp_chunk_copy(w->c[1], &link.id, 0, 1), 0);
	assert_int_equal(kvp_chunk_copy(w->c[1], &sys.name, 1, 0), 0);

	memset(&nobody, 0x5a, sizeof(nobody));
	expect_copy_error(w->c[0], &nobody, 0, 1, -ENOENT, "not registered");
	expect_copy_error(w->c[0], &sys.id, 0, 0, -EINVAL, "both pool 0");
	expect_copy_error(w->c[0], &sys.id, 0, 5, -EINVAL, "does not exist");
	filling = chunk_root(w->c[0], 5000, 20, KVP_CHUNK_QUERY, false);
	expect_copy_error(w->c[0], &filling.id, 0, 1, -EAGAIN, "filling");
	assert_int_equal(kvp_chunk_acquire(w->c[1], &filling.id, 0, &(struct kvp_lease){ 0 }),
			 -ENOENT);
	fill_seal(w->c[0], &filling, 5000);

	/* Gone from both pools, for the tests after this one. */
	for (int p = 0; p < 2; p++)
		assert_true(kvp_chunk_clear(w->c[p], 0) >= 2);
	no_frame_leaked(w);
}

static void errors_change_nothing(void **state)
{
	struct world *w = *state;
	struct kvp_lease l, big;
	uint64_t len = 0;

	assert_int_equal(h_append_cycle(w->c[0], SALT, 3, 0, 16, 0), 0);
	expect_move_error(w, 3, 0, 0, -EINVAL, "name two pools");
	expect_move_error(w, 3, 0, 2, -EINVAL, "pools 0 to 1");
	expect_move_error(w, 999, 0, 1, -ENOENT, "user 999");
	/* A lease prepared and not committed: the history is in use. */
	assert_int_equal(kvp_prepare(w->c[0], 3, 16, 4, &l), 0);
	expect_move_error(w, 3, 0, 1, -EBUSY, "commit or release first");
	assert_int_equal(kvp_release(w->c[0], l.id), 0);
	assert_int_equal(h_verify_user(w->c[0], SALT, 3, 0, 16, &len), 0);
	/* Pool 1 has a history of the user already. */
	assert_int_equal(h_append_cycle(w->c[1], SALT, 4, 0, 16, 0), 0);
	assert_int_equal(h_append_cycle(w->c[0], SALT, 4, 0, 16, 0), 0);
	expect_move_error(w, 4, 0, 1, -EEXIST, "already");
	assert_int_equal(h_verify_user(w->c[0], SALT, 4, 0, 16, NULL), 0);
	assert_int_equal(h_verify_user(w->c[1], SALT, 4, 0, 16, NULL), 0);
	/* Pool 1's device tier leased but for two frames: four pages do not
	 * fit, and pool 0 keeps them. */
	assert_int_equal(h_append_cycle(w->c[0], SALT, 5, 0, 64, 0), 0);
	assert_int_equal(kvp_prepare(w->c[1], 50, 0, (FRAMES - 2) * H_PAGE_TOKENS,
				     &big), 0);
	expect_move_error(w, 5, 0, 1, -ENOSPC, "device tier");
	assert_int_equal(h_verify_user(w->c[0], SALT, 5, 0, 64, &len), 0);
	assert_int_equal(info(w->c[0], 5).pages_device, 4);
	assert_int_equal(kvp_release(w->c[1], big.id), 0);
	no_frame_leaked(w);
	/* With the room back it goes. */
	assert_int_equal(kvp_move(w->c[0], 5, 0, 1), 4);
	assert_int_equal(h_verify_user(w->c[1], SALT, 5, 0, 64, NULL), 0);
	no_frame_leaked(w);
}

/* A reader of user U in one pool: whenever it finds the history there, its
 * read-only lease shows all of it, byte for byte; never a part. */
#define RACE_USER 40
#define RACE_TOKENS 48
struct race {
	const char *sock;
	volatile int stop;
	int reads[2];
};

static struct race *g_race;

static int race_reader(void *arg)
{
	uint32_t pool = (uint32_t)(uintptr_t)arg;
	struct kvp_connect_opts o = { .socket = g_race->sock, .pool = pool };
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	int bad = 0;

	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("reader of pool %u: %s", pool, err);
		return 1;
	}
	while (!__atomic_load_n(&g_race->stop, __ATOMIC_ACQUIRE) && !bad) {
		struct kvp_user_info u;
		struct kvp_lease l;
		int rc;

		memset(&u, 0, sizeof(u));
		if (kvp_info(c, RACE_USER, &u) || !u.len)
			continue;
		rc = kvp_prepare(c, RACE_USER, u.len, 0, &l);
		if (rc == -EBUSY)
			continue;
		if (rc) {
			h_fail("reader of pool %u: prepare: %d (%s)", pool, rc,
			       kvp_last_error(c));
			bad = 1;
			break;
		}
		/* Moved away between the info and the prepare: nothing here. */
		if (l.len && (l.len != RACE_TOKENS ||
			      h_same_bytes(c, l.indices, SALT, RACE_USER,
					   RACE_TOKENS, "a reader during moves"))) {
			h_fail("reader of pool %u: a lease of %" PRIu64 " tokens, want "
			       "%u, or other bytes", pool, l.len, RACE_TOKENS);
			bad = 1;
		}
		if (l.len)
			__atomic_add_fetch(&g_race->reads[pool], 1, __ATOMIC_RELAXED);
		if (kvp_release(c, l.id))
			bad = 1;
	}
	kvp_close(c);
	return bad;
}

/* Moves back and forth while a reader in each pool reads the history:
 * each move waits for the readers' leases (-EBUSY) and is one step, so no
 * reader ever sees half a history or the wrong bytes, and at the end one
 * pool has it whole and neither leaked a frame. */
static void moves_race_readers(void **state)
{
	struct world *w = *state;
	uint32_t at = 0, moved = 0;
	uint64_t deadline;
	pid_t pid[2];

	g_race = h_shared_zalloc(sizeof(*g_race));
	assert_non_null(g_race);
	g_race->sock = w->d.sock;
	assert_int_equal(h_append_cycle(w->c[0], SALT, RACE_USER, 0, RACE_TOKENS, 0), 0);
	for (uintptr_t p = 0; p < 2; p++) {
		pid[p] = h_fork(race_reader, (void *)p);
		assert_true(pid[p] > 0);
	}
	deadline = h_now_ms() + 5000;
	while (moved < 20 && h_now_ms() < deadline) {
		int seen = __atomic_load_n(&g_race->reads[at], __ATOMIC_RELAXED), rc;

		/* The reader where it is now reads it, then it moves under the
		 * readers' feet (a reader's lease makes it wait: -EBUSY). */
		while (__atomic_load_n(&g_race->reads[at], __ATOMIC_RELAXED) < seen + 2 &&
		       h_now_ms() < deadline)
			h_sleep_us(100);
		do
			rc = kvp_move(w->c[0], RACE_USER, at, !at);
		while (rc == -EBUSY && h_now_ms() < deadline);
		if (rc != 3)
			fail_msg("move %u -> %u: %d (%s)", at, !at, rc,
				 kvp_last_error(w->c[0]));
		at = !at;
		moved++;
	}
	__atomic_store_n(&g_race->stop, 1, __ATOMIC_RELEASE);
	assert_int_equal(h_wait_all(pid, 2, 10000), 0);
	print_message("%u moves; the readers saw it whole %d times in pool 0, %d "
		      "in pool 1\n", moved, g_race->reads[0], g_race->reads[1]);
	assert_int_equal(moved, 20);
	assert_true(g_race->reads[0] >= 20 && g_race->reads[1] >= 20);
	assert_int_equal(h_verify_user(w->c[at], SALT, RACE_USER, 0, RACE_TOKENS,
				       NULL), 0);
	assert_int_equal(info(w->c[!at], RACE_USER).len, 0);
	no_frame_leaked(w);
}

/* ------------------------------------------------------------ tenants */

/* Tenant a (uid 1001) and b (uid 1002), no admin among them. */
#define UID_A 1001
#define UID_B 1002
static const char *g_tsock;

static struct kvp_client *attach_quiet(const char *sock, uint32_t pool)
{
	struct kvp_connect_opts o = { .socket = sock, .pool = pool };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN];

	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("attach to pool %u: %s", pool, err);
		return NULL;
	}
	return c;
}

/* Tenant a, not an admin, moves its user 7 from pool 0 to pool 1. */
static int tenant_a_moves(void *arg)
{
	struct kvp_client *c0 = attach_quiet(g_tsock, 0), *c1 = attach_quiet(g_tsock, 1);
	int rc = H_FAIL;

	(void)arg;
	h_set_name("tenant-a");
	if (!c0 || !c1 || kvp_client_is_admin(c0))
		goto out;
	if (h_append_cycle(c0, SALT, 7, 0, 20, 0))
		goto out;
	if (kvp_move(c0, 7, 0, 1) != 2) {
		h_fail("move as tenant a: %s", kvp_last_error(c0));
		goto out;
	}
	if (!h_verify_user(c1, SALT, 7, 0, 20, NULL))
		rc = H_PASS;
out:
	if (c0)
		kvp_close(c0);
	if (c1)
		kvp_close(c1);
	return rc;
}

/* Tenant b names user 7 too: its own (none), never tenant a's. */
static int tenant_b_cannot_reach_it(void *arg)
{
	struct kvp_client *c = attach_quiet(g_tsock, 1);
	struct kvp_user_info u;
	int rc;

	(void)arg;
	h_set_name("tenant-b");
	if (!c)
		return H_FAIL;
	rc = kvp_move(c, 7, 1, 0);
	memset(&u, 0, sizeof(u));
	if (rc != -ENOENT || kvp_info(c, 7, &u) || u.len) {
		h_fail("tenant b's move of user 7: %d (%s), its user 7 has %" PRIu64
		       " tokens; want -ENOENT and none", rc, kvp_last_error(c), u.len);
		kvp_close(c);
		return H_FAIL;
	}
	kvp_close(c);
	return H_PASS;
}

/* Tenant a's user 7 is still whole in pool 1. */
static int tenant_a_still_has_it(void *arg)
{
	struct kvp_client *c = attach_quiet(g_tsock, 1);
	int rc;

	(void)arg;
	h_set_name("tenant-a");
	if (!c)
		return H_FAIL;
	rc = h_verify_user(c, SALT, 7, 0, 20, NULL);
	kvp_close(c);
	return rc ? H_FAIL : H_PASS;
}

static void run_as(uid_t uid, int (*fn)(void *), const char *what)
{
	pid_t p = h_fork_as(uid, uid, fn, NULL);
	int rc;

	assert_true(p > 0);
	rc = h_wait(p, 20000);
	if (rc == H_SKIP) {
		print_message("skipped: cannot setuid(%u)\n", (unsigned)uid);
		skip();
	}
	if (rc)
		fail_msg("%s (uid %u) failed: exit %d", what, (unsigned)uid, rc);
}

/* A tenant's own client, not an admin, moves its users; another tenant's
 * client naming the same user id reaches only its own (nothing). */
static void tenants_move_their_own(void **state)
{
	const char *extra[] = { "--devices=0,1", "--socket_mode=0666",
				"--tenant=a:uids=1001:device_mem=64K:host_mem=64K",
				"--tenant=b:uids=1002:device_mem=64K:host_mem=64K", NULL };
	struct h_daemon d = { 0 };
	int fail;

	(void)state;
	if (geteuid() != 0) {
		print_message("skipped: needs root to setuid() client processes\n");
		skip();
	}
	assert_int_equal(h_daemon_dir(&d, 1), 0);
	assert_int_equal(h_daemon_startv(&d, 10000, extra), 0);
	g_tsock = d.sock;
	run_as(UID_A, tenant_a_moves, "tenant a's move");
	run_as(UID_B, tenant_b_cannot_reach_it, "tenant b's move of the same id");
	run_as(UID_A, tenant_a_still_has_it, "tenant a's read back");
	fail = h_daemon_stop(&d, 10000) != 0;
	h_daemon_end(&d, fail);
	assert_false(fail);
}

/* kvctl ARGS... against the daemon; its exit status, stdout in out. */
static int kvctl(struct world *w, char *out, size_t len, const char *const *args)
{
	char cmd[1024];
	size_t off;
	FILE *p;
	int st;

	off = (size_t)snprintf(cmd, sizeof(cmd), "%s --socket %s", h_kvctl_path,
			       w->d.sock);
	for (int i = 0; args[i]; i++)
		off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, " %s", args[i]);
	snprintf(cmd + off, sizeof(cmd) - off, " 2>&1");
	p = popen(cmd, "r");
	assert_non_null(p);
	len = fread(out, 1, len - 1, p);
	out[len] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void kvctl_move(void **state)
{
	struct world *w = *state;
	char out[4096];

	if (!h_kvctl_path) {
		print_message("skipped: no kvctl given\n");
		skip();
	}
	assert_int_equal(h_append_cycle(w->c[0], SALT, 6, 0, 30, 0), 0);
	assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "move", "--user",
			 "6", "--from", "0", "--to", "1", NULL }), 0);
	if (!strstr(out, "user 6") || !strstr(out, "pool 1"))
		fail_msg("kvctl move said '%s'", out);
	assert_int_equal(h_verify_user(w->c[1], SALT, 6, 0, 30, NULL), 0);
	assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "--json", "move",
			 "--user", "6", "--from", "1", "--to", "0", NULL }), 0);
	if (!strstr(out, "\"pages\": 2") || !strstr(out, "\"to\": 0"))
		fail_msg("kvctl --json move said '%s'", out);
	/* Refused by the daemon: exit 1 with its reason. */
	assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "move", "--user",
			 "6", "--from", "1", "--to", "0", NULL }), 1);
	if (!strstr(out, "has no history"))
		fail_msg("kvctl move of a user pool 1 lacks said '%s'", out);
	/* Usage errors: exit 2, naming what is wrong. */
	assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "move", "--user",
			 "6", "--from", "0", NULL }), 2);
	if (!strstr(out, "--to"))
		fail_msg("kvctl move without --to said '%s'", out);
	assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "move", "--user",
			 "6", "--from", "x", "--to", "1", NULL }), 2);
	/* A chunk: copied, then there already. */
	{
		struct kvp_chunk_reg r = chunk_root(w->c[0], 6000, 20,
						    KVP_CHUNK_SYSTEM, true);
		char hex[65], pre[17];

		/* The prefix of its name (kvctl chunks lists names: a name
		 * copies its root entry), then the entry's full id. */
		kvp_chunk_id_format(&r.name, hex);
		snprintf(pre, sizeof(pre), "%.16s", hex);
		kvp_chunk_id_format(&r.id, hex);
		if (kvctl(w, out, sizeof(out), (const char *[]){ "move", "--chunk", pre,
			  "--from", "0", "--to", "1", NULL }) != 0 ||
		    !strstr(out, "2 pages copied"))
			fail_msg("kvctl move --chunk said '%s'", out);
		chunk_reads(w->c[1], &r.id, 6000, "the chunk kvctl copied");
		assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "--json",
				 "move", "--chunk", hex, "--from", "0", "--to", "1",
				 NULL }), 0);
		if (!strstr(out, "\"pages\": 0"))
			fail_msg("kvctl --json move --chunk again said '%s'", out);
		assert_int_equal(kvctl(w, out, sizeof(out), (const char *[]){ "move",
				 "--chunk", hex, "--user", "6", "--from", "0", "--to",
				 "1", NULL }), 2);
		if (!strstr(out, "name one"))
			fail_msg("kvctl move --chunk --user said '%s'", out);
		for (int p = 0; p < 2; p++)
			assert_true(kvp_chunk_clear(w->c[p], 0) >= 1);
	}
	no_frame_leaked(w);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(device_history_moves),
		cmocka_unit_test(host_pages_move),
		cmocka_unit_test(pools_share_the_host_tier),
		cmocka_unit_test(chunks_copy_between_pools),
		cmocka_unit_test(errors_change_nothing),
		cmocka_unit_test(moves_race_readers),
		cmocka_unit_test(tenants_move_their_own),
		cmocka_unit_test(kvctl_move),
	};

	h_init(argc, argv, "test_move");
	return cmocka_run_group_tests(tests, setup, teardown);
}
