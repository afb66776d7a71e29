/* SPDX-License-Identifier: MIT */
/*
 * test_error_info - what an error is about comes as data (issue 25 item
 * 10): kvpoold puts a prepare's gap, overlap or trimmed-head range in the
 * completion (proto.h FAILURE DETAIL) and libkvpool hands it out as a
 * struct kvp_error_info, for the synchronous call (kvp_last_error_info)
 * and for a reaped completion (kvp_completion_error_info), so a client
 * never parses the message's words:
 *
 *   a. a gap: tokens cached end .. start_pos - 1, kind GAP;
 *   b. an overlap: start_pos .. min(cached end, start_pos + n_new) - 1;
 *   c. a head trimmed by max_tokens_per_user: start_pos .. first cached - 1;
 *   d. errors without a range (a library error, -ENOENT from the daemon, a
 *      start_pos past 2^63) have kind NONE, and a success in between leaves
 *      no stale detail behind the next library error;
 *   e. the async path: a queued prepare's gap, next to a good prepare;
 *   f. bad arguments to the calls: -EINVAL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

/* n tokens more for user from position start (nothing else cached after). */
static int grow(struct kvp_client *c, uint64_t user, uint64_t start, uint32_t n)
{
	struct kvp_lease l;
	int ret = kvp_prepare(c, user, start, n, &l);

	if (!ret)
		ret = kvp_commit(c, l.id, n);
	if (!ret)
		ret = kvp_release(c, l.id);
	CHECK(!ret, "user %" PRIu64 ": %u tokens from %" PRIu64 ": %s", user, n,
	      start, kvp_last_error(c));
	return ret;
}

/* A prepare that must fail with -EINVAL and the detail (kind, first, last). */
static void expect(struct kvp_client *c, uint64_t user, uint64_t start,
		   uint32_t n, uint32_t kind, uint64_t first, uint64_t last)
{
	struct kvp_error_info info;
	struct kvp_lease l;
	int ret = kvp_prepare(c, user, start, n, &l);

	CHECK(ret == -EINVAL, "prepare(%" PRIu64 ", %" PRIu64 ", %u): %d, not "
	      "-EINVAL (%s)", user, start, n, ret, kvp_last_error(c));
	memset(&info, 0xa5, sizeof(info));
	CHECK(!kvp_last_error_info(c, &info), "kvp_last_error_info failed");
	CHECK(info.kind == kind && info.first == first && info.last == last &&
	      !info.rsv, "prepare(%" PRIu64 ", %" PRIu64 ", %u): kind %u range %"
	      PRIu64 "..%" PRIu64 ", want kind %u range %" PRIu64 "..%" PRIu64
	      " (%s)", user, start, n, info.kind, info.first, info.last, kind,
	      first, last, kvp_last_error(c));
}

static uint32_t last_kind(struct kvp_client *c)
{
	struct kvp_error_info info = { .kind = 99 };

	kvp_last_error_info(c, &info);
	return info.kind;
}

static void cases_sync(struct kvp_client *c)
{
	struct kvp_user_info u;
	struct kvp_lease l;

	/* a, b: user 1 holds [0, 10). */
	if (grow(c, 1, 0, 10))
		return;
	expect(c, 1, 20, 5, KVP_ERROR_GAP, 10, 19);
	expect(c, 1, 11, 1, KVP_ERROR_GAP, 10, 10);
	expect(c, 1, 5, 20, KVP_ERROR_OVERLAP, 5, 9);
	expect(c, 1, 5, 3, KVP_ERROR_OVERLAP, 5, 7);
	expect(c, 1, 0, 0, KVP_ERROR_OVERLAP, 0, 9); /* a read names all */
	/* c: user 2 over max_tokens_per_user (16): its head goes. */
	if (grow(c, 2, 0, 16) || grow(c, 2, 16, 16))
		return;
	CHECK(!kvp_info(c, 2, &u) && u.start > 4, "user 2: head not trimmed "
	      "(start %" PRIu64 ", len %" PRIu64 ")", u.start, u.len);
	if (u.start > 4)
		expect(c, 2, 4, 1, KVP_ERROR_TRIMMED, 4, u.start - 1);
	/* d: no range. */
	CHECK(kvp_prepare(c, 1, 10, 1, NULL) == -EINVAL && last_kind(c) == 0,
	      "a library error after a gap: kind %u, want NONE", last_kind(c));
	expect(c, 1, 20, 5, KVP_ERROR_GAP, 10, 19);
	CHECK(kvp_release(c, 0x12345) < 0 && last_kind(c) == 0,
	      "the daemon's -ENOENT after a gap: kind %u, want NONE",
	      last_kind(c));
	expect(c, 1, (1ull << 63) + 5, 1, KVP_ERROR_NONE, 0, 0);
	expect(c, 1, 20, 5, KVP_ERROR_GAP, 10, 19);
	if (!kvp_prepare(c, 1, 10, 1, &l))
		kvp_release(c, l.id);
	CHECK(kvp_prepare(c, 1, 10, 1, NULL) == -EINVAL && last_kind(c) == 0,
	      "a library error after a success: kind %u, want NONE",
	      last_kind(c));
}

static void case_async(struct kvp_client *c)
{
	struct kvp_completion cq[2];
	struct kvp_error_info info;
	int got = 0, ret;

	CHECK(!kvp_queue_prepare(c, 1, 30, 2, 7) && !kvp_queue_prepare(c, 3, 0, 2, 8) &&
	      kvp_submit(c) >= 0, "queue: %s", kvp_last_error(c));
	while (got < 2 && (ret = kvp_reap(c, cq + got, 2 - got, 1)) > 0)
		got += ret;
	CHECK(got == 2, "reaped %d of 2: %s", got, kvp_last_error(c));
	for (int i = 0; i < got; i++) {
		memset(&info, 0xa5, sizeof(info));
		if (cq[i].tag == 7) {
			CHECK(cq[i].res == -EINVAL && cq[i].error,
			      "async gap: res %d", cq[i].res);
			CHECK(!kvp_completion_error_info(c, &cq[i], &info) &&
			      info.kind == KVP_ERROR_GAP && info.first == 10 &&
			      info.last == 29, "async gap: kind %u range %" PRIu64
			      "..%" PRIu64 ", want GAP 10..29", info.kind,
			      info.first, info.last);
		} else {
			CHECK(cq[i].res >= 0, "async prepare: %s", cq[i].error);
			/* no message: not a failed completion's */
			CHECK(kvp_completion_error_info(c, &cq[i], &info) == -EINVAL,
			      "a good completion has no error info");
			kvp_release(c, cq[i].lease.id);
		}
	}
}

static void case_args(struct kvp_client *c)
{
	struct kvp_error_info info;
	struct kvp_completion cq = { .error = "not the library's" };

	CHECK(kvp_last_error_info_sz(c, &info, 16) == -EINVAL, "size 16 taken");
	CHECK(kvp_last_error_info_sz(c, NULL, sizeof(info)) == -EINVAL, "NULL taken");
	CHECK(kvp_completion_error_info(c, &cq, &info) == -EINVAL,
	      "a message outside the arena taken");
}

int main(int argc, char **argv)
{
	struct kvp_client *c;
	struct h_daemon d;
	uint64_t t0;

	h_init(argc, argv, "test_error_info");
	t0 = h_now_ms();
	if (h_daemon_up(&d, "--max_tokens_per_user=16", (char *)NULL))
		return H_FAIL;
	c = h_connect_or_fail(d.sock, "E", 5000);
	if (!c)
		return h_daemon_finish(&d, 1, t0);
	cases_sync(c);
	case_async(c);
	case_args(c);
	kvp_close(c);
	return h_daemon_finish(&d, g_bad, t0);
}
