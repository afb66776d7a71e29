/* SPDX-License-Identifier: MIT */
/*
 * test_uds_order - a user's operations take effect in submission order
 * whichever transport each client uses (DESIGN.md, "Order"): an operation
 * sent in the "uds" request mode (one kvp_sqe on the attach socket) never
 * overtakes ring entries published before it.
 *
 * The ring client publishes a long batch (INFOs, then a PREPARE of user U
 * at the very end) and, without waiting for any of it, the uds client sends
 * its own PREPARE of U. The ring's PREPARE was submitted first, so it holds
 * U's write reservation and the uds one must come back -EBUSY. A daemon that
 * runs uds requests on its listener thread, beside the worker that is still
 * going through the batch, lets the uds PREPARE win instead.
 *
 *   two_clients   one ring client, one uds client, same user;
 *   one_client    one client, its ring then its own socket;
 *   pipelined     uds requests sent back to back are all answered, in order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define BATCH 4096u     /* ring entries per round: BATCH - 1 INFOs + PREPARE */
#define ROUNDS 5
#define N_NEW 16u
#define OUT_INFO 0u     /* the INFOs all write here (nobody reads them) */
#define OUT_PREP 4096u  /* the ring PREPARE's result */

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad = 1; \
	return -1; } } while (0)

/* Publish BATCH - 1 INFOs of user and then PREPARE(user, 0, N_NEW) in one
 * store of sq_tail, and return without waiting for any of it. */
static void ring_publish_batch(struct h_raw *r, uint64_t user, uint64_t tag0)
{
	for (uint32_t i = 0; i + 1 < BATCH; i++) {
		struct kvp_sqe e = { .opcode = KVP_OP_INFO, .user = user,
				     .tag = tag0 + i, .out_off = OUT_INFO,
				     .out_len = sizeof(struct kvp_user_info) };
		h_raw_put(r, &e);
	}
	struct kvp_sqe p = { .opcode = KVP_OP_PREPARE, .user = user, .arg = 0,
			     .n = N_NEW, .tag = tag0 + BATCH - 1,
			     .out_off = OUT_PREP, .out_len = 4096 };
	h_raw_put(r, &p);
	h_raw_publish(r);
}

/* Reap the batch; the PREPARE (last tag) must have won. Then commit and
 * release its lease so the next round starts clean. */
static int ring_finish_batch(struct h_raw *r, uint64_t user, uint64_t tag0)
{
	static struct kvp_cqe cq[BATCH];
	struct kvp_prepare_out po;
	int got = 0;

	while (got < (int)BATCH) {
		int n = h_raw_reap(r, cq + got, BATCH - (uint32_t)got, 1, 20000);

		CHECK(n > 0, "user %" PRIu64 ": ring batch: only %d of %u "
		      "completions in 20 s", user, got, BATCH);
		got += n;
	}
	for (uint32_t i = 0; i < BATCH; i++) {
		if (cq[i].tag != tag0 + BATCH - 1)
			continue;
		memcpy(&po, r->arena + OUT_PREP, sizeof(po));
		CHECK(cq[i].res >= 0, "user %" PRIu64 ": the ring PREPARE, submitted "
		      "before the uds one, failed: res %d (%s)", user, cq[i].res,
		      (const char *)r->arena + OUT_PREP);
		struct kvp_sqe c = { .opcode = KVP_OP_COMMIT, .arg = po.lease,
				     .n = N_NEW, .tag = 1, .out_len = 256,
				     .out_off = OUT_PREP };
		struct kvp_sqe rl = { .opcode = KVP_OP_RELEASE, .arg = po.lease,
				      .tag = 2, .out_len = 256, .out_off = OUT_PREP };
		struct kvp_cqe cc = { 0 };
		CHECK(h_raw_call(r, &c, &cc, 1, 10000) == 0 && cc.res >= 0,
		      "user %" PRIu64 ": commit: res %d", user, cc.res);
		CHECK(h_raw_call(r, &rl, &cc, 1, 10000) == 0 && cc.res >= 0,
		      "user %" PRIu64 ": release: res %d", user, cc.res);
		return 0;
	}
	h_fail("user %" PRIu64 ": no completion for the ring PREPARE", user);
	g_bad = 1;
	return -1;
}

/* The uds PREPARE of user after the ring batch: -EBUSY, and nothing held. */
static int uds_prepare_loses(int sock, uint64_t user, const char *who)
{
	struct kvp_sqe q = { .opcode = KVP_OP_PREPARE, .user = user, .arg = 0,
			     .n = N_NEW, .tag = 0x5ed, .out_len = 4096 };
	char msg[4096] = "";
	struct kvp_cqe cqe = { 0 };
	int ret = h_uds_call(sock, &q, &cqe, msg, sizeof(msg) - 1);

	CHECK(ret == 0, "%s: uds PREPARE of user %" PRIu64 ": %s", who, user,
	      strerror(-ret));
	CHECK(cqe.tag == q.tag, "%s: uds reply with tag %#" PRIx64 ", sent %#"
	      PRIx64, who, cqe.tag, q.tag);
	CHECK(cqe.res == -EBUSY, "%s: uds PREPARE of user %" PRIu64 " sent after "
	      "the ring's came back %d (%s), expected -EBUSY: it overtook the "
	      "ring entries submitted before it", who, user, cqe.res,
	      cqe.res < 0 ? msg : "it won the reservation");
	return 0;
}

static int two_clients(const char *sock)
{
	struct h_raw ring, uds;
	char err[256];
	int ret = 0;

	if (h_raw_attach(&ring, sock, BATCH, 0, err, sizeof(err))) {
		h_fail("ring client: %s", err);
		return -1;
	}
	if (h_raw_attach(&uds, sock, 0, 0, err, sizeof(err))) {
		h_fail("uds client: %s", err);
		h_raw_detach(&ring);
		return -1;
	}
	for (int k = 0; k < ROUNDS && !ret; k++) {
		uint64_t user = 7000 + (uint64_t)k, tag0 = (uint64_t)k << 32;

		ring_publish_batch(&ring, user, tag0);
		ret = uds_prepare_loses(uds.sock, user, "two clients");
		ret |= ring_finish_batch(&ring, user, tag0);
	}
	h_raw_detach(&uds);
	h_raw_detach(&ring);
	if (!ret)
		h_log("two clients: %d rounds, the uds PREPARE came after the ring's "
		      "each time", ROUNDS);
	return ret;
}

static int one_client(const char *sock)
{
	struct h_raw r;
	char err[256];
	int ret = 0;

	if (h_raw_attach(&r, sock, BATCH, 0, err, sizeof(err))) {
		h_fail("client: %s", err);
		return -1;
	}
	for (int k = 0; k < ROUNDS && !ret; k++) {
		uint64_t user = 8000 + (uint64_t)k, tag0 = (uint64_t)k << 32;

		ring_publish_batch(&r, user, tag0);
		ret = uds_prepare_loses(r.sock, user, "one client");
		ret |= ring_finish_batch(&r, user, tag0);
	}
	h_raw_detach(&r);
	if (!ret)
		h_log("one client: %d rounds, its uds PREPARE came after its ring's "
		      "each time", ROUNDS);
	return ret;
}

/* 64 INFOs of user 7000 (two_clients committed N_NEW tokens to it) sent
 * without reading a reply: 64 replies, in the order sent. */
static int pipelined(const char *sock)
{
	struct h_raw r;
	char err[256];
	int ret = 0;

	if (h_raw_attach(&r, sock, 0, 0, err, sizeof(err))) {
		h_fail("client: %s", err);
		return -1;
	}
	for (uint64_t i = 0; i < 64; i++) {
		struct kvp_sqe q = { .opcode = KVP_OP_INFO, .user = 7000, .tag = 100 + i,
				     .out_len = sizeof(struct kvp_user_info) };

		if (send(r.sock, &q, sizeof(q), MSG_NOSIGNAL) != (ssize_t)sizeof(q)) {
			h_fail("pipelined: send %" PRIu64 ": %s", i, strerror(errno));
			ret = -1;
			goto out;
		}
	}
	for (uint64_t i = 0; i < 64; i++) {
		unsigned char buf[sizeof(struct kvp_cqe) + sizeof(struct kvp_user_info)];
		struct pollfd p = { .fd = r.sock, .events = POLLIN };
		struct kvp_user_info in;
		struct kvp_cqe cqe;

		if (poll(&p, 1, 10000) != 1 ||
		    recv(r.sock, buf, sizeof(buf), 0) != (ssize_t)sizeof(buf)) {
			h_fail("pipelined: reply %" PRIu64 " of 64 missing or short", i);
			ret = -1;
			goto out;
		}
		memcpy(&cqe, buf, sizeof(cqe));
		memcpy(&in, buf + sizeof(cqe), sizeof(in));
		if (cqe.tag != 100 + i || cqe.res < 0 || in.len != N_NEW) {
			h_fail("pipelined: reply %" PRIu64 ": tag %" PRIu64 " res %d len %"
			       PRIu64 " (expected tag %" PRIu64 ", len %u)", i, cqe.tag,
			       cqe.res, in.len, 100 + i, N_NEW);
			ret = -1;
			goto out;
		}
	}
	h_log("pipelined: 64 uds replies in order");
out:
	h_raw_detach(&r);
	return ret;
}

int main(int argc, char **argv)
{
	struct h_daemon d;
	uint64_t t0;
	int fail;

	h_init(argc, argv, "test_uds_order");
	t0 = h_now_ms();
	/* One worker (the default): every ring and uds client on it. */
	if (h_daemon_up(&d, "--workers=1", (char *)NULL))
		return H_FAIL;
	fail = two_clients(d.sock) != 0;
	if (!fail)
		fail = one_client(d.sock) != 0;
	if (!fail)
		fail = pipelined(d.sock) != 0;
	return h_daemon_finish(&d, fail || g_bad, t0);
}
