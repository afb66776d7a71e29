/* SPDX-License-Identifier: MIT */
/*
 * test_abi_compat - the growing structs (kvpool.h, GROWING STRUCTS) against
 * a real kvpoold, as three kinds of caller see them:
 *
 *  old     a program built against release 0.1: its own copies of the 0.1
 *          structs (struct user_info_v0 ... below, written out as that
 *          kvpool.h had them), calling the KVPOOL_0.1 entry points
 *          ("(kvp_users)(...)": what its binary links to) and the _sz calls
 *          with the 0.1 sizes. Every field it knows matches what a current
 *          caller reads, and nothing is written past its rows (guard bytes
 *          after them stay as they were);
 *  current the kvpool.h macros (sizeof of this tree's structs);
 *  newer   a program built against a later kvpool.h whose structs have
 *          more fields at the end: those read 0, the rest match.
 * And a size no kvpool.h ever had is -EINVAL naming it. The arrays a
 * caller passes in (kvp_seq_src, kvp_append_item) are read at its stride:
 * a newer caller's extra fields left 0 work, set ones are -E2BIG.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SALT 0x616269ull /* "abi" */
#define NUSERS 3u
#define GUARD 0xa5

static int g_bad;

#define CHECK(cond, ...) do { \
	if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } \
} while (0)

/* kvpool.h 0.1's structs, copied as a caller built against it has them. */
struct user_info_v0 {
	uint64_t user, start, len;
	uint32_t pages_device, pages_host, leases, tenant;
};
_Static_assert(sizeof(struct user_info_v0) == KVP_USER_INFO_SIZE_VER0, "0.1 size");

struct completion_v0 {
	uint64_t tag;
	int32_t res;
	uint32_t op;
	struct user_info_v0 info;
	struct kvp_lease lease;
	const char *error;
};
_Static_assert(sizeof(struct completion_v0) == KVP_COMPLETION_SIZE_VER0, "0.1 size");

/* A later kvpool.h's: this one's and more at the end. */
struct user_info_next {
	struct kvp_user_info now;
	uint64_t later[3];
};

struct client_info_next {
	struct kvp_client_info now;
	uint64_t later[2];
};

static bool all_bytes(const void *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (((const unsigned char *)p)[i] != v)
			return false;
	return true;
}

static bool same_v0(const struct user_info_v0 *o, const struct kvp_user_info *u)
{
	return o->user == u->user && o->start == u->start && o->len == u->len &&
	       o->pages_device == u->pages_device && o->pages_host == u->pages_host &&
	       o->leases == u->leases && o->tenant == u->tenant;
}

/* kvp_users: 0.1 entry point, _sz with 0.1's size, a later size. */
static void check_users(struct kvp_client *c, const struct kvp_user_info *cur,
			int n)
{
	struct user_info_v0 old[NUSERS + 1];
	struct user_info_next next[NUSERS];
	uint64_t nx = 1;
	int k;

	memset(old, GUARD, sizeof(old));
	k = (kvp_users)(c, 0, (struct kvp_user_info *)old, NUSERS, &nx);
	CHECK(k == n && !nx, "0.1 kvp_users: %d rows (%s), want %d", k,
	      kvp_last_error(c), n);
	for (int i = 0; i < n && i < k; i++)
		CHECK(same_v0(&old[i], &cur[i]), "0.1 kvp_users: row %d differs", i);
	CHECK(all_bytes(&old[NUSERS], sizeof(old[0]), GUARD),
	      "0.1 kvp_users wrote past the caller's %u rows of %zu bytes",
	      NUSERS, sizeof(old[0]));

	memset(old, GUARD, sizeof(old));
	k = kvp_users_sz(c, 0, (struct kvp_user_info *)old, sizeof(old[0]),
			 NUSERS, &nx);
	CHECK(k == n, "kvp_users_sz(40): %d (%s)", k, kvp_last_error(c));
	for (int i = 0; i < n && i < k; i++)
		CHECK(same_v0(&old[i], &cur[i]), "kvp_users_sz(40): row %d differs", i);
	CHECK(all_bytes(&old[NUSERS], sizeof(old[0]), GUARD),
	      "kvp_users_sz(40) wrote past the caller's rows");

	memset(next, GUARD, sizeof(next));
	k = kvp_users_sz(c, 0, &next[0].now, sizeof(next[0]), NUSERS, &nx);
	CHECK(k == n, "kvp_users_sz(%zu): %d (%s)", sizeof(next[0]), k,
	      kvp_last_error(c));
	for (int i = 0; i < n && i < k; i++) {
		CHECK(!memcmp(&next[i].now, &cur[i], sizeof(cur[i])),
		      "newer caller: row %d differs", i);
		CHECK(all_bytes(next[i].later, sizeof(next[i].later), 0),
		      "newer caller: row %d's fields this library lacks are not 0", i);
	}

	for (size_t bad = 0; bad < 3; bad++) {
		static const size_t sizes[] = { 32, 44, 0 };

		k = kvp_users_sz(c, 0, &next[0].now, sizes[bad], NUSERS, &nx);
		CHECK(k == -EINVAL && strstr(kvp_last_error(c), "struct size"),
		      "kvp_users_sz(%zu): %d (%s), want -EINVAL naming the size",
		      sizes[bad], k, kvp_last_error(c));
	}
}

/* kvp_info, one struct: the same three ways. */
static void check_info(struct kvp_client *c, const struct kvp_user_info *cur)
{
	struct user_info_v0 old[2];
	struct user_info_next next;
	int rc;

	memset(old, GUARD, sizeof(old));
	rc = (kvp_info)(c, cur->user, (struct kvp_user_info *)old);
	CHECK(!rc && same_v0(&old[0], cur) &&
	      all_bytes(&old[1], sizeof(old[1]), GUARD),
	      "0.1 kvp_info: %d (%s), fields %s, guard %s", rc, kvp_last_error(c),
	      same_v0(&old[0], cur) ? "ok" : "differ",
	      all_bytes(&old[1], sizeof(old[1]), GUARD) ? "intact" : "overwritten");
	memset(&next, GUARD, sizeof(next));
	rc = kvp_info_sz(c, cur->user, &next.now, sizeof(next));
	CHECK(!rc && !memcmp(&next.now, cur, sizeof(*cur)) &&
	      all_bytes(next.later, sizeof(next.later), 0),
	      "newer kvp_info: %d (%s)", rc, kvp_last_error(c));
}

/* kvp_reap: 0.1's completion had info (40 bytes) before the lease. */
static void check_reap(struct kvp_client *c, const struct kvp_user_info *u)
{
	struct completion_v0 old[3];
	uint64_t lease = 0;
	int n;

	memset(old, GUARD, sizeof(old));
	if (kvp_queue_info(c, u->user, 11) ||
	    kvp_queue_prepare(c, u->user, u->start + u->len, 0, 12) ||
	    kvp_submit(c) != 2) {
		h_fail("queue info + prepare: %s", kvp_last_error(c));
		g_bad++;
		return;
	}
	n = (kvp_reap)(c, (struct kvp_completion *)old, 2, 2);
	CHECK(n == 2, "0.1 kvp_reap: %d (%s)", n, kvp_last_error(c));
	for (int i = 0; i < n && i < 2; i++) {
		const struct completion_v0 *k = &old[i];

		CHECK(k->res == 0, "0.1 kvp_reap: tag %" PRIu64 " res %d", k->tag, k->res);
		if (k->tag == 11)
			CHECK(k->op == KVP_ASYNC_INFO && same_v0(&k->info, u) &&
			      !k->lease.id,
			      "0.1 kvp_reap: the INFO completion is not in 0.1's layout "
			      "(op %u, len %" PRIu64 ", want %" PRIu64 ")", k->op,
			      k->info.len, u->len);
		else if (k->tag == 12) {
			CHECK(k->op == KVP_ASYNC_PREPARE && k->lease.id &&
			      k->lease.user == u->user && k->lease.len == u->len,
			      "0.1 kvp_reap: the PREPARE completion is not in 0.1's "
			      "layout (op %u, lease %" PRIu64 " user %" PRIu64 ")",
			      k->op, k->lease.id, k->lease.user);
			lease = k->lease.id;
		} else {
			CHECK(0, "0.1 kvp_reap: unknown tag %" PRIu64, k->tag);
		}
	}
	CHECK(all_bytes(&old[2], sizeof(old[2]), GUARD),
	      "0.1 kvp_reap wrote past the caller's 2 completions");
	if (lease)
		CHECK(!kvp_release(c, lease), "release: %s", kvp_last_error(c));
	n = kvp_reap_sz(c, (struct kvp_completion *)old, 128, 1, 0);
	CHECK(n == -EINVAL, "kvp_reap_sz(128): %d, want -EINVAL (no kvpool.h "
	      "had a 128-byte kvp_completion)", n);
}

/* Input arrays at a newer caller's stride: seq_create, append_batch. */
static void check_inputs(struct kvp_client *c, const struct kvp_user_info *u)
{
	struct { struct kvp_seq_src now; uint64_t later[2]; } src;
	struct { struct kvp_append_item now; uint64_t later; } it[2];
	const struct kvp_layout *l = kvp_client_layout(c);
	struct kvp_lease lease;
	void *kv;
	int rc;

	memset(&src, 0, sizeof(src));
	src.now.kind = KVP_SRC_USER;
	src.now.id = u->user;
	rc = kvp_seq_create_sz(c, 900, &src.now, sizeof(src), 1, 1, &lease);
	CHECK(!rc && lease.len == u->len && lease.n_new == 1,
	      "seq_create from a newer caller: %d (%s), len %" PRIu64, rc,
	      kvp_last_error(c), lease.len);
	if (!rc) {
		CHECK(!kvp_release(c, lease.id) && !kvp_seq_free(c, 900),
		      "seq release/free: %s", kvp_last_error(c));
	}
	src.later[1] = 7; /* a field this library does not have, set */
	rc = kvp_seq_create_sz(c, 901, &src.now, sizeof(src), 1, 1, &lease);
	CHECK(rc == -E2BIG && strstr(kvp_last_error(c), "does not know"),
	      "seq_create with an unknown field set: %d (%s), want -E2BIG", rc,
	      kvp_last_error(c));
	rc = kvp_seq_create_sz(c, 902, NULL, 1, 0, 1, &lease); /* no element */
	CHECK(!rc, "seq_create of no source, size not looked at: %d (%s)", rc,
	      kvp_last_error(c));
	if (!rc) {
		kvp_release(c, lease.id);
		kvp_seq_free(c, 902);
	}

	/* Two tokens through a newer caller's two items (the second one read
	 * at its stride), read back byte for byte. */
	kv = malloc(2 * l->token_bytes);
	rc = kv ? kvp_prepare(c, u->user, u->start + u->len, 2, &lease) : -ENOMEM;
	CHECK(!rc, "prepare: %d (%s)", rc, kvp_last_error(c));
	if (rc) {
		free(kv);
		return;
	}
	h_tokens_fill(l, SALT, u->user, u->start + u->len, 2, kv);
	memset(it, 0, sizeof(it));
	it[0].now = (struct kvp_append_item){ .lease = &lease, .first = 0, .n = 1 };
	it[1].now = (struct kvp_append_item){ .lease = &lease, .first = 1, .n = 1 };
	rc = kvp_append_batch_async_sz(c, &it[0].now, sizeof(it[0]), 2, kv, NULL);
	CHECK(!rc, "append_batch from a newer caller: %d (%s)", rc, kvp_last_error(c));
	CHECK(!kvp_commit(c, lease.id, 2) && !kvp_release(c, lease.id),
	      "commit: %s", kvp_last_error(c));
	CHECK(!h_verify_user(c, SALT, u->user, u->start, u->len + 2, NULL),
	      "the newer caller's batch append did not land");
	free(kv);
}

/* kvp_clients (admin): 0.1's size is this one's; a newer caller's. */
static void check_clients(struct kvp_client *c)
{
	struct kvp_client_info cur[4];
	struct client_info_next next[4];
	uint64_t nx;
	int n, k;

	if (!kvp_client_is_admin(c)) {
		h_log("not an admin: kvp_clients not checked");
		return;
	}
	n = kvp_clients(c, 0, cur, 4, &nx);
	memset(next, GUARD, sizeof(next));
	k = kvp_clients_sz(c, 0, &next[0].now, sizeof(next[0]), 4, &nx);
	CHECK(n >= 1 && k == n, "kvp_clients: %d, newer caller %d (%s)", n, k,
	      kvp_last_error(c));
	for (int i = 0; i < n && i < k; i++)
		CHECK(next[i].now.client_id == cur[i].client_id &&
		      next[i].now.pid == cur[i].pid &&
		      !strcmp(next[i].now.name, cur[i].name) &&
		      all_bytes(next[i].later, sizeof(next[i].later), 0),
		      "kvp_clients, newer caller: row %d", i);
}

int main(int argc, char **argv)
{
	struct kvp_user_info cur[NUSERS + 1];
	struct h_daemon d;
	struct kvp_client *c;
	uint64_t nx;
	int n;

	h_init(argc, argv, "test_abi_compat");
	if (h_daemon_up(&d, NULL))
		return H_FAIL;
	c = h_connect_or_fail(d.sock, "abi", 5000);
	if (!c)
		return H_FAIL;
	for (uint32_t i = 0; i < NUSERS; i++)
		if (h_append_cycle(c, SALT, 100 + i, 0, 5 + 20 * i, 0))
			return H_FAIL;
	n = kvp_users(c, 0, cur, NUSERS + 1, &nx);
	if (n != (int)NUSERS) {
		h_fail("kvp_users: %d (%s), want %u", n, kvp_last_error(c), NUSERS);
		return H_FAIL;
	}
	check_users(c, cur, n);
	check_info(c, &cur[1]);
	check_reap(c, &cur[2]);
	check_clients(c);
	check_inputs(c, &cur[0]);
	kvp_close(c);
	if (g_bad)
		return H_FAIL;
	h_log("PASS: 0.1 callers, current and newer ones read the same rows");
	return H_PASS;
}
