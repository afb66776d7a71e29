/* SPDX-License-Identifier: MIT */
/*
 * test_ring_fuzz - whatever a client writes into its rings, the daemon
 * answers bad entries with error completions, keeps serving everyone else
 * and does not grow.
 *
 * A raw client (its own attach, per proto.h) submits:
 *   1. for every opcode (and unknown ones): result ranges past the arena,
 *      longer than the arena, wrapping around 2^32, nonzero reserved fields,
 *      unknown flag bits, huge counts and positions, results that do not fit,
 *      forged, foreign and released lease ids, bad tier selections. Each must
 *      complete with res < 0, and none may touch the leases it names: the
 *      leases the bad COMMITs / RELEASEs aimed at commit and release fine
 *      afterwards, the foreign one included;
 *   2. a seeded fuzz of 100,000 entries: random bytes; valid opcodes with
 *      bad result ranges; valid opcodes with unknown flag bits. Each must
 *      complete with res < 0, matched to its submission by tag.
 * Meanwhile a well-behaved client in another process runs real prepare /
 * append / commit / release cycles and verifies the bytes it reads back.
 * The daemon's VmRSS after a warm-up and at the end differ by < 2 MiB.
 * A client that never reaps stalls only itself: its CQ fills, its further
 * entries wait in the SQ, the daemon does not spin, and all complete once
 * it reaps. A client whose ring and arena a second thread scribbles over
 * while the
 * daemon reads them gets one completion per entry and is not detached.
 * Then a client that publishes sq_tail - sq_head > entries, and one that
 * publishes cq_head ahead of cq_tail, are detached (socket hang-up) while
 * the well-behaved client carries on and new clients attach.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define FUZZ_ENTRIES 100000
#define WARMUP_ENTRIES 10000
#define FUZZ_SEED 0xf022f022ull
/* ASan's quarantine and shadow grow the daemon of a sanitizer build (the
 * test is built the same way): the tight bound is the normal build's. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_SLACK_KB (32 * 1024)
#else
#define RSS_SLACK_KB 2048
#endif
#define GOOD_USERS 8
#define GOOD_SALT 0x676f6f64ull
#define TAG_TABLE (1ull << 62)
#define TAG_FUZZ (1ull << 61)

static const char *g_sock;

struct good_state {
	volatile int stop;
	volatile uint64_t cycles;
	volatile uint64_t verified;
};
static struct good_state *g_good;

/* ------------------------------------------------------------ the good client */

static int good_main(void *arg)
{
	(void)arg;
	h_set_name("good-client");
	char err[KVP_ERRLEN];
	struct kvp_client *c;
	struct kvp_connect_opts o = { .socket = g_sock, .name = "good",
				      .sq_entries = 64, .arena_bytes = 65536 };
	int rc = kvp_connect(&c, &o, err, sizeof(err));
	if (rc < 0) {
		h_fail("connect: %d (%s)", rc, err);
		return H_FAIL;
	}
	int result = H_FAIL;
	uint64_t len[GOOD_USERS] = { 0 };
	struct h_rng r;
	h_rng_seed(&r, 7);
	while (!g_good->stop) {
		int i = (int)h_rng_below(&r, GOOD_USERS);
		uint64_t u = 555000 + (uint64_t)i;
		uint32_t n = 1 + (uint32_t)h_rng_below(&r, 20);
		if (h_append_cycle(c, GOOD_SALT, u, len[i], n, 0))
			goto fail;
		len[i] += n;
		if (h_verify_user(c, GOOD_SALT, u, 0, len[i], NULL))
			goto fail;
		g_good->verified++;
		/* Keep the daemon's metadata bounded: start the user over. */
		if (len[i] > 256) {
			rc = kvp_evict(c, u, KVP_SEL_ALL);
			if (rc < 0) {
				h_fail("evict %" PRIu64 ": %d (%s)", u, rc,
				       kvp_last_error(c));
				goto fail;
			}
			len[i] = 0;
		}
		g_good->cycles++;
	}
	result = H_PASS;
fail:
	kvp_close(c);
	return result;
}

/* ------------------------------------------------------------ the table */

enum expect { MUST_FAIL, MUST_PASS, ANY };

struct tcase {
	struct kvp_sqe e;
	enum expect x;
	char what[80];
};

static struct tcase *g_cases;
static int g_ncases, g_capcases;

static struct tcase *add(const struct kvp_sqe *e, enum expect x,
			 const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static struct tcase *add(const struct kvp_sqe *e, enum expect x,
			 const char *fmt, ...)
{
	if (g_ncases == g_capcases) {
		g_capcases = g_capcases ? 2 * g_capcases : 256;
		g_cases = realloc(g_cases, (size_t)g_capcases * sizeof(*g_cases));
		if (!g_cases)
			abort();
	}
	struct tcase *t = &g_cases[g_ncases++];
	t->e = *e;
	t->x = x;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->what, sizeof(t->what), fmt, ap);
	va_end(ap);
	return t;
}

static const char *op_name(unsigned op)
{
	static const char *n[] = { "NOP", "INFO", "PREPARE", "COMMIT", "RELEASE",
				   "OFFLOAD", "EVICT", "STATS", "USERS", "CLIENTS" };
	/* The sharing opcodes and later have no name here: their number. */
	static char num[24];

	if (op < sizeof(n) / sizeof(n[0]))
		return n[op];
	snprintf(num, sizeof(num), "opcode %u", op);
	return num;
}

/* Run cases [from, g_ncases) in chunks that fit the rings, each with an
 * arena slice of its own; returns how many broke their expectation. */
static int run_cases(struct h_raw *r, int from, int *ok_out)
{
	int bad = 0;
	uint32_t chunk = r->hdr.sq_entries < 64 ? r->hdr.sq_entries : 64;
	uint32_t slice = r->hdr.arena_bytes / chunk;
	struct kvp_sqe in[64];
	struct kvp_cqe out[64];
	for (int b = from; b < g_ncases; b += (int)chunk) {
		int n = g_ncases - b < (int)chunk ? g_ncases - b : (int)chunk;
		for (int i = 0; i < n; i++) {
			in[i] = g_cases[b + i].e;
			in[i].tag = TAG_TABLE + (uint64_t)(b + i);
			/* out_len == UINT32_MAX - 1 marks "give me a slice". */
			if (in[i].out_len == UINT32_MAX - 1) {
				in[i].out_off = (uint32_t)i * slice;
				in[i].out_len = slice;
			}
			g_cases[b + i].e = in[i];
		}
		int rc = h_raw_call(r, in, out, (uint32_t)n, 10000);
		if (rc) {
			h_fail("table chunk at case %d: %d (daemon stopped answering?)",
			       b, rc);
			return bad + n;
		}
		for (int i = 0; i < n; i++) {
			struct tcase *t = &g_cases[b + i];
			int res = out[i].res;
			int broke = (t->x == MUST_FAIL && res >= 0) ||
				    (t->x == MUST_PASS && res < 0);
			if (broke) {
				char msg[160] = "";
				if (res < 0 && out[i].out_bytes &&
				    t->e.out_len <= r->hdr.arena_bytes &&
				    t->e.out_off <= r->hdr.arena_bytes - t->e.out_len)
					snprintf(msg, sizeof(msg), "%.*s",
						 (int)(out[i].out_bytes < 150 ? out[i].out_bytes : 150),
						 (const char *)r->arena + t->e.out_off);
				h_fail("%s %s: res %d, expected %s %s", op_name(t->e.opcode),
				       t->what, res,
				       t->x == MUST_FAIL ? "an error" : "success", msg);
				bad++;
			}
			if (ok_out)
				ok_out[b + i] = res;
		}
	}
	return bad;
}

static struct kvp_sqe base_entry(unsigned op, uint64_t user, uint64_t arg,
				 uint32_t n)
{
	struct kvp_sqe e = { 0 };
	e.opcode = (uint8_t)op;
	e.user = user;
	e.arg = arg;
	e.n = n;
	e.out_len = UINT32_MAX - 1; /* a slice of its own */
	if (op == KVP_OP_EVICT || op == KVP_OP_EVICT_TENANT)
		e.sel = KVP_SEL_DEVICE;
	return e;
}

/* Raw PREPARE that must succeed; returns the lease id (0 on failure). */
static uint64_t raw_prepare(struct h_raw *r, uint64_t user, uint32_t n)
{
	struct kvp_sqe e = { .opcode = KVP_OP_PREPARE, .user = user, .n = n,
			     .tag = 1, .out_off = 0, .out_len = 4096 };
	struct kvp_cqe c;
	if (h_raw_call(r, &e, &c, 1, 10000) || c.res < 0) {
		h_fail("raw prepare of user %" PRIu64 ": res %d (%s)", user, c.res,
		       c.res < 0 && c.out_bytes ? (const char *)r->arena : "");
		return 0;
	}
	struct kvp_prepare_out po;
	memcpy(&po, r->arena, sizeof(po));
	if (c.out_bytes < sizeof(po) + 4u * po.npages || po.n_new != n) {
		h_fail("raw prepare of user %" PRIu64 ": %u result bytes, %u pages,"
		       " n_new %u", user, c.out_bytes, po.npages, po.n_new);
		return 0;
	}
	return po.lease;
}

static int table_phase(struct h_raw *r, struct kvp_client *owner)
{
	uint32_t A = r->hdr.arena_bytes;
	int bad = 0;
	/* Leases the bad entries aim at: two of ours and a foreign one. */
	uint64_t L1 = raw_prepare(r, 777001, 4);
	uint64_t L2 = raw_prepare(r, 777002, 4);
	struct kvp_lease lf;
	int rc = kvp_prepare(owner, 888001, 0, 4, &lf);
	if (!L1 || !L2 || rc < 0) {
		h_fail("cannot set up the leases: %d (%s)", rc, kvp_last_error(owner));
		return 1;
	}
	uint64_t LF = lf.id;
	uint8_t kv[4 * 256];
	h_tokens_fill(kvp_client_layout(owner), 99, 888001, 0, 4, kv);
	if (kvp_append(owner, &lf, 0, 4, kv) < 0) {
		h_fail("owner append: %s", kvp_last_error(owner));
		return 1;
	}

	for (unsigned op = 0; op < KVP_OP_MAX + 2; op++) {
		unsigned code = op < KVP_OP_MAX ? op : (op == KVP_OP_MAX ? KVP_OP_MAX : 0xff);
		uint64_t user = 777001, arg = 0;
		uint32_t n = 0;
		switch (code) {
		case KVP_OP_PREPARE: user = 777100 + op; n = 1; break;
		case KVP_OP_COMMIT: arg = L1; n = 4; break;
		case KVP_OP_RELEASE: arg = L2; break;
		case KVP_OP_USERS: case KVP_OP_CLIENTS: n = 4; break;
		default: break;
		}
		struct kvp_sqe b = base_entry(code, user, arg, n), e;
		const char *nm = code < KVP_OP_MAX ? "" : "(unknown opcode)";
		if (code >= KVP_OP_MAX) {
			add(&b, MUST_FAIL, "opcode %u %s", code, nm);
			continue;
		}
#define MUT(expr, fmt, ...) do { e = b; if (code == KVP_OP_PREPARE) e.user = 777200 + (uint64_t)g_ncases; \
		expr; add(&e, MUST_FAIL, fmt, ##__VA_ARGS__); } while (0)
		MUT((e.out_off = 0, e.out_len = A + 1), "out_len %u > arena %u", A + 1, A);
		MUT((e.out_off = A + 64, e.out_len = 16), "out_off %u past the arena", A + 64);
		MUT((e.out_off = A - 8, e.out_len = 64), "range [%u, +64) ends past the arena", A - 8);
		MUT((e.out_off = 0xffffffc0u, e.out_len = 0x80), "out_off+out_len wraps 2^32");
		MUT((e.out_off = 64, e.out_len = UINT32_MAX), "out_len 2^32-1");
		MUT((e.rsv0 = 1), "rsv0 = 1");
		MUT((e.rsv1 = 1), "rsv1 = 1");
		MUT((e.rsv1 = 1ull << 63), "rsv1 = 2^63");
		MUT((e.flags = 0x80), "flags 0x80 (unknown)");
		MUT((e.flags = 0x08), "flags 0x08 (unknown)");
		MUT((e.tenant = 5), "tenant 5 without flag ALL");
		if (code != KVP_OP_EVICT && code != KVP_OP_EVICT_TENANT)
			MUT((e.sel = KVP_SEL_DEVICE), "sel set (only EVICT and "
			    "EVICT_TENANT have one)");
		switch (code) {
		case KVP_OP_PREPARE:
			MUT((e.n = UINT32_MAX), "n_new 2^32-1");
			MUT((e.n = 1u << 31), "n_new 2^31");
			MUT((e.arg = UINT64_MAX), "start_pos 2^64-1");
			MUT((e.arg = 1ull << 63, e.n = 16), "start_pos 2^63");
			MUT((e.out_off = 0, e.out_len = sizeof(struct kvp_prepare_out) - 1),
			    "result range of %zu bytes (too small)",
			    sizeof(struct kvp_prepare_out) - 1);
			MUT((e.out_off = 0, e.out_len = 0), "empty result range");
			MUT((e.flags = KVP_SQE_ALL), "flag ALL");
			MUT((e.flags = KVP_SQE_RELEASE), "flag RELEASE");
			break;
		case KVP_OP_COMMIT:
			MUT((e.n = UINT32_MAX), "n 2^32-1 > n_new");
			MUT((e.n = 5), "n 5 > n_new 4");
			MUT((e.arg = L1 ^ 0x5a5a5a5a00000000ull), "forged lease");
			MUT((e.arg = L1 + 1000003), "forged lease (near)");
			MUT((e.arg = 0), "lease 0");
			MUT((e.arg = UINT64_MAX), "lease 2^64-1");
			MUT((e.arg = LF), "foreign lease (another client's)");
			MUT((e.arg = LF, e.flags = KVP_SQE_RELEASE), "foreign lease, with RELEASE");
			MUT((e.flags = KVP_SQE_ALL), "flag ALL");
			break;
		case KVP_OP_RELEASE:
			MUT((e.arg = L2 ^ 0x5a5a5a5a00000000ull), "forged lease");
			MUT((e.arg = 0), "lease 0");
			MUT((e.arg = UINT64_MAX), "lease 2^64-1");
			MUT((e.arg = LF), "foreign lease (another client's)");
			MUT((e.flags = KVP_SQE_ALL), "flag ALL");
			break;
		case KVP_OP_EVICT:
			MUT((e.sel = 0), "sel 0");
			MUT((e.sel = 0x10), "sel 0x10 (no such tier)");
			MUT((e.sel = 0xffff), "sel 0xffff");
			MUT((e.user = 999999999), "unknown user");
			break;
		case KVP_OP_EVICT_TENANT:
			MUT((e.sel = 0), "sel 0");
			MUT((e.sel = 0x10), "sel 0x10 (no such tier)");
			MUT((e.sel = 0xffff), "sel 0xffff");
			MUT((e.flags = KVP_SQE_ALL), "flag ALL");
			break;
		case KVP_OP_OFFLOAD:
			MUT((e.user = 999999999), "unknown user");
			break;
		case KVP_OP_STATS:
			MUT((e.out_off = 0, e.out_len = 16), "result range of 16 bytes (too small)");
			break;
		case KVP_OP_INFO:
		case KVP_OP_NOP:
		case KVP_OP_USERS:
		case KVP_OP_CLIENTS:
			break;
		}
#undef MUT
		/* Huge row counts may be clamped to what fits: any answer. */
		if (code == KVP_OP_USERS || code == KVP_OP_CLIENTS) {
			e = b;
			e.n = UINT32_MAX;
			add(&e, ANY, "max rows 2^32-1");
		}
	}
	int from = 0;
	bad += run_cases(r, from, NULL);
	h_log("table: %d bad entries over every opcode, %d broke expectations",
	      g_ncases, bad);

	/* The aimed-at leases are untouched: they commit and release now. */
	from = g_ncases;
	struct kvp_sqe e;
	e = base_entry(KVP_OP_COMMIT, 0, L1, 4);
	e.flags = KVP_SQE_RELEASE;
	add(&e, MUST_PASS, "commit+release of the lease the bad commits aimed at");
	e = base_entry(KVP_OP_RELEASE, 0, L2, 0);
	add(&e, MUST_PASS, "release of the lease the bad releases aimed at");
	e = base_entry(KVP_OP_NOP, 0, 0, 0);
	add(&e, MUST_PASS, "plain NOP");
	e = base_entry(KVP_OP_INFO, 777001, 0, 0);
	add(&e, MUST_PASS, "plain INFO");
	e = base_entry(KVP_OP_STATS, 0, 0, 0);
	add(&e, MUST_PASS, "plain STATS");
	bad += run_cases(r, from, NULL);
	from = g_ncases;
	e = base_entry(KVP_OP_COMMIT, 0, L1, 4);
	add(&e, MUST_FAIL, "commit of a released lease");
	e = base_entry(KVP_OP_RELEASE, 0, L2, 0);
	add(&e, MUST_FAIL, "release of a released lease");
	bad += run_cases(r, from, NULL);

	rc = kvp_commit(owner, LF, 4);
	if (rc == 0)
		rc = kvp_release(owner, LF);
	if (rc < 0) {
		h_fail("the foreign lease no longer commits/releases for its owner:"
		       " %d (%s)", rc, kvp_last_error(owner));
		bad++;
	} else if (h_verify_user(owner, 99, 888001, 0, 4, NULL)) {
		bad++;
	}
	return bad;
}

/* ------------------------------------------------------------ the fuzz */

/* Entry i of the fuzz, a pure function of (FUZZ_SEED, i). */
static void fuzz_entry(uint64_t i, uint32_t arena, struct kvp_sqe *e)
{
	struct h_rng r;
	h_rng_seed(&r, h_mix64(FUZZ_SEED ^ i));
	uint64_t w[8];
	for (int k = 0; k < 8; k++)
		w[k] = h_rng_next(&r);
	memcpy(e, w, sizeof(*e));
	switch (i % 4) {
	case 0:
	case 1:
		/* Random bytes. Reserved fields nonzero with certainty: */
		if (!e->rsv1 && !e->rsv0)
			e->rsv0 = 1;
		break;
	case 2:
		/* A valid opcode, clean reserved fields, a bad range. */
		e->opcode = (uint8_t)(w[0] % KVP_OP_MAX);
		e->flags = 0;
		e->rsv0 = 0;
		e->rsv1 = 0;
		e->in_off = e->in_len = 0;
		e->tenant = 0;
		switch (w[1] % 3) {
		case 0: e->out_len = arena + 1 + (uint32_t)(w[2] % 1000); break;
		case 1: e->out_off = arena + 1 + (uint32_t)(w[2] % 100000); e->out_len %= 512; break;
		default: e->out_off = UINT32_MAX - (uint32_t)(w[2] % 64); e->out_len = 65 + (uint32_t)(w[3] % 4096); break;
		}
		break;
	default:
		/* A valid opcode and range, an unknown flag bit (0x04 is
		 * COMPOSE's PREVIEW since protocol 3). */
		e->opcode = (uint8_t)(w[0] % KVP_OP_MAX);
		e->flags = (uint8_t)(0x08u << (w[1] % 5));
		e->rsv0 = 0;
		e->rsv1 = 0;
		e->in_off = e->in_len = 0;
		e->tenant = 0;
		e->out_off = (uint32_t)(w[2] % (arena / 2));
		e->out_len = 256;
		break;
	}
	e->tag = TAG_FUZZ + i;
}

static int fuzz_run(struct h_raw *r, uint64_t from, uint64_t to, uint8_t *seen,
		    uint64_t *accepted)
{
	struct kvp_cqe buf[128];
	uint64_t sent = from, done = from;
	uint32_t cq_room_max = r->hdr.cq_entries;
	int reported = 0;
	while (done < to) {
		uint32_t space = h_raw_sq_space(r);
		uint64_t inflight = sent - done;
		if (space > cq_room_max - inflight)
			space = (uint32_t)(cq_room_max - inflight);
		uint32_t k = 0;
		while (sent < to && k < space) {
			struct kvp_sqe e;
			fuzz_entry(sent++, r->hdr.arena_bytes, &e);
			h_raw_put(r, &e);
			k++;
		}
		if (k)
			h_raw_publish(r);
		int got = h_raw_reap(r, buf, 128, 1, 10000);
		if (got < 0) {
			h_fail("fuzz: no completion within 10 s (%" PRIu64 " of %"
			       PRIu64 " answered)", done, to);
			return -1;
		}
		for (int j = 0; j < got; j++) {
			uint64_t t = buf[j].tag;
			if (t < TAG_FUZZ || t - TAG_FUZZ >= to || seen[t - TAG_FUZZ]) {
				h_fail("fuzz: completion with unknown or repeated tag %#"
				       PRIx64, t);
				return -1;
			}
			uint64_t i = t - TAG_FUZZ;
			seen[i] = 1;
			done++;
			if (buf[j].res >= 0) {
				(*accepted)++;
				if (reported++ < 10) {
					struct kvp_sqe e;
					fuzz_entry(i, r->hdr.arena_bytes, &e);
					h_fail("fuzz entry %" PRIu64 " (kind %d) accepted with"
					       " res %d: opcode %u flags %#x sel %#x n %u"
					       " user %#" PRIx64 " arg %#" PRIx64 " out %u+%u"
					       " tenant %u rsv0 %u in %u+%u rsv1 %#" PRIx64,
					       i, (int)(i % 4), buf[j].res, e.opcode, e.flags,
					       e.sel, e.n, e.user, e.arg, e.out_off, e.out_len,
					       e.tenant, e.rsv0, e.in_off, e.in_len, e.rsv1);
				}
			}
		}
	}
	return 0;
}

/* ------------------------------------------------------------ scribbling */

struct scribble {
	struct h_raw *r;
	volatile int stop;
	uint64_t flips;
};

/* Flip bytes of the SQ entries and the arena while the daemon reads them:
 * an entry may change between publish and copy-out, or during it. */
static void *scribbler(void *arg)
{
	struct scribble *s = arg;
	struct h_rng rng;
	h_rng_seed(&rng, 0x5c21bb1e);
	uint8_t *sq = (uint8_t *)s->r->sq;
	size_t sq_bytes = (size_t)s->r->hdr.sq_entries * sizeof(struct kvp_sqe);
	size_t arena = s->r->hdr.arena_bytes;
	while (!s->stop) {
		uint64_t x = h_rng_next(&rng);
		if (x & 1)
			__atomic_store_n(&sq[(x >> 8) % sq_bytes], (uint8_t)(x >> 40),
					 __ATOMIC_RELAXED);
		else
			__atomic_store_n(&s->r->arena[(x >> 8) % arena],
					 (uint8_t)(x >> 40), __ATOMIC_RELAXED);
		s->flips++;
	}
	return NULL;
}

/*
 * Valid entries (NOP, INFO of users nobody has, STATS) published while a
 * thread scribbles over the ring: every consumed entry still gets exactly
 * one completion (counted, since tags may be scribbled too), the client is
 * not detached (entries are data; only impossible indices detach), and the
 * daemon survives.
 */
static int scribble_phase(struct h_daemon *d, int ms)
{
	struct h_raw r;
	char err[KVP_ERRLEN];
	int rc = h_raw_attach(&r, g_sock, 64, 65536, err, sizeof(err));
	if (rc < 0) {
		h_fail("attach for scribbling: %d (%s)", rc, err);
		return 1;
	}
	struct scribble s = { .r = &r };
	pthread_t th;
	if (pthread_create(&th, NULL, scribbler, &s)) {
		h_raw_detach(&r);
		return 1;
	}
	uint32_t slice = r.hdr.arena_bytes / r.hdr.sq_entries;
	uint64_t sent = 0, reaped = 0, errors = 0;
	uint64_t until = h_now_ms() + (uint64_t)ms;
	struct kvp_cqe buf[128];
	int ret = 0;
	while (h_now_ms() < until) {
		uint32_t space = h_raw_sq_space(&r);
		uint64_t inflight = sent - reaped;
		if (space > r.hdr.cq_entries - inflight)
			space = (uint32_t)(r.hdr.cq_entries - inflight);
		for (uint32_t k = 0; k < space; k++) {
			struct kvp_sqe e = { 0 };
			static const uint8_t ops[] = { KVP_OP_NOP, KVP_OP_INFO,
						       KVP_OP_STATS };
			e.opcode = ops[sent % 3];
			e.user = 0xdead0000ull + sent % 64;
			e.tag = sent;
			e.out_off = (uint32_t)(sent % r.hdr.sq_entries) * slice;
			e.out_len = slice;
			h_raw_put(&r, &e);
			sent++;
		}
		if (space)
			h_raw_publish(&r);
		int got = h_raw_reap(&r, buf, 128, 0, 0);
		for (int j = 0; j < got; j++)
			errors += buf[j].res < 0;
		reaped += got > 0 ? (uint64_t)got : 0;
	}
	s.stop = 1;
	pthread_join(th, NULL);
	uint64_t wait_until = h_now_ms() + 5000;
	while (reaped < sent && h_now_ms() < wait_until) {
		int got = h_raw_reap(&r, buf, 128, 1, 100);
		if (got > 0)
			reaped += (uint64_t)got;
	}
	h_log("scribbling: %" PRIu64 " byte flips over %" PRIu64 " entries,"
	      " %" PRIu64 " completions (%" PRIu64 " errors)", s.flips, sent,
	      reaped, errors);
	if (reaped != sent) {
		h_fail("%" PRIu64 " entries published while scribbling got %" PRIu64
		       " completions", sent, reaped);
		ret = 1;
	}
	if (h_raw_hung_up(&r, 0)) {
		h_fail("the daemon detached a client for scribbled entries (not"
		       " indices)");
		ret = 1;
	}
	if (!h_daemon_alive(d)) {
		h_fail("kvpoold died while a client scribbled over its ring");
		ret = 1;
	}
	h_raw_detach(&r);
	return ret;
}

/* ------------------------------------------------------------ a full CQ */

/* The daemon's CPU time (all threads) in ms, or -1. */
static long daemon_cpu_ms(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* Fields after the command name, which ends with the last ')'. */
	char *p = strrchr(buf, ')');
	unsigned long ut, st;
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
			 &ut, &st) != 2)
		return -1;
	return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/*
 * A client that never reaps fills its CQ: the daemon then leaves its
 * further entries in the SQ (a completion is never dropped or overwritten),
 * does not spin on it, and takes them as soon as the client reaps; every
 * entry completes exactly once.
 */
static int full_cq_phase(struct h_daemon *d)
{
	struct h_raw r;
	char err[KVP_ERRLEN];
	int rc = h_raw_attach(&r, g_sock, 16, 0, err, sizeof(err));
	if (rc < 0) {
		h_fail("attach: %d (%s)", rc, err);
		return 1;
	}
	uint32_t sqn = r.hdr.sq_entries, cqn = r.hdr.cq_entries;
	uint32_t total = cqn + sqn, sent = 0;
	int ret = 0;
	/* Fill the CQ, then the SQ, never reaping. */
	uint64_t until = h_now_ms() + 5000;
	while (sent < total && h_now_ms() < until) {
		uint32_t space = h_raw_sq_space(&r);
		for (uint32_t k = 0; k < space && sent < total; k++) {
			struct kvp_sqe e = { .opcode = KVP_OP_NOP, .tag = sent,
					     .out_off = 0, .out_len = 256 };
			h_raw_put(&r, &e);
			sent++;
		}
		h_raw_publish(&r);
		h_sleep_ms(1);
	}
	h_sleep_ms(50);
	long cpu0 = daemon_cpu_ms(d->pid);
	h_sleep_ms(500);
	long cpu1 = daemon_cpu_ms(d->pid);
	uint32_t head = __atomic_load_n(&r.ctl->sq_head, __ATOMIC_ACQUIRE);
	uint32_t tail = __atomic_load_n(&r.ctl->cq_tail, __ATOMIC_ACQUIRE);
	h_log("full CQ: %u of %u entries published, daemon took %u, posted %u"
	      " completions; daemon CPU %ld ms in 500 ms while stalled", sent,
	      total, head, tail, cpu1 - cpu0);
	if (sent != total || head != cqn || tail != cqn) {
		h_fail("with a CQ of %u never reaped the daemon took %u entries and"
		       " posted %u completions (expected %u and %u)", cqn, head,
		       tail, cqn, cqn);
		ret = 1;
	}
	if (cpu0 >= 0 && cpu1 - cpu0 > 250) {
		h_fail("kvpoold burned %ld ms of CPU in 500 ms with one stalled"
		       " client and nothing else to do", cpu1 - cpu0);
		ret = 1;
	}
	/* Reap: the rest flows. */
	uint8_t *seen = calloc(total, 1);
	struct kvp_cqe buf[64];
	uint32_t got = 0;
	until = h_now_ms() + 5000;
	while (got < total && h_now_ms() < until) {
		int n = h_raw_reap(&r, buf, 64, 1, 500);
		for (int j = 0; j < n; j++) {
			if (buf[j].tag >= total || seen[buf[j].tag] || buf[j].res < 0) {
				h_fail("completion tag %" PRIu64 " res %d: unknown, repeated"
				       " or failed", buf[j].tag, buf[j].res);
				ret = 1;
				continue;
			}
			seen[buf[j].tag] = 1;
			got++;
		}
	}
	free(seen);
	if (got != total) {
		h_fail("after reaping, %u of %u entries completed", got, total);
		ret = 1;
	}
	h_raw_detach(&r);
	return ret;
}

/* ------------------------------------------------------------ broken rings */

static int expect_detached(const char *how, void (*breakit)(struct h_raw *))
{
	struct h_raw b;
	char err[KVP_ERRLEN];
	int rc = h_raw_attach(&b, g_sock, 16, 0, err, sizeof(err));
	if (rc < 0) {
		h_fail("attach for the %s client: %d (%s)", how, rc, err);
		return 1;
	}
	breakit(&b);
	int hung = h_raw_hung_up(&b, 5000);
	h_raw_detach(&b);
	if (!hung) {
		h_fail("a client that %s was not detached within 5 s", how);
		return 1;
	}
	h_log("a client that %s was detached", how);
	return 0;
}

static void bogus_sq_tail(struct h_raw *b)
{
	/* Claim more entries than the ring holds. */
	__atomic_store_n(&b->ctl->sq_tail, b->hdr.sq_entries + 7, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	h_raw_kick(b);
}

static void bogus_cq_head(struct h_raw *b)
{
	/* Claim to have consumed completions never produced, then ask for one. */
	__atomic_store_n(&b->ctl->cq_head, 1000, __ATOMIC_RELEASE);
	struct kvp_sqe e = { .opcode = KVP_OP_NOP, .tag = 1, .out_len = 256 };
	h_raw_put(b, &e);
	h_raw_publish(b);
	h_raw_kick(b);
}

int main(int argc, char **argv)
{
	h_init(argc, argv, "test_ring_fuzz");
	uint64_t t0 = h_now_ms();
	g_good = h_shared_zalloc(sizeof(*g_good));
	if (!g_good)
		return H_FAIL;
	struct h_daemon d;
	if (h_daemon_up(&d, "--device_mem=16M", "--host_mem=8M", (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	int fail = 0;

	pid_t good = h_fork(good_main, NULL);
	char err[KVP_ERRLEN];
	struct h_raw r;
	int rc = h_raw_attach(&r, d.sock, 64, 65536, err, sizeof(err));
	struct kvp_client *owner = NULL;
	if (rc == 0)
		rc = h_connect(&owner, d.sock, "owner", 5000, err, sizeof(err));
	if (rc < 0) {
		h_fail("attach: %d (%s)", rc, err);
		h_daemon_kill(&d);
		return H_FAIL;
	}
	h_log("raw client: %u sq entries, %u cq entries, arena %u bytes",
	      r.hdr.sq_entries, r.hdr.cq_entries, r.hdr.arena_bytes);

	if (table_phase(&r, owner))
		fail = 1;

	uint8_t *seen = calloc(FUZZ_ENTRIES, 1);
	uint64_t accepted = 0;
	uint64_t t_fuzz = h_now_ms();
	if (fuzz_run(&r, 0, WARMUP_ENTRIES, seen, &accepted))
		fail = 1;
	long rss0 = h_proc_status_kb(d.pid, "VmRSS");
	uint64_t good0 = g_good->cycles;
	if (!fail && fuzz_run(&r, WARMUP_ENTRIES, FUZZ_ENTRIES, seen, &accepted))
		fail = 1;
	/*
	 * The fuzz must not starve the well-behaved client. On a fast machine
	 * it is over in ~15 ms, less than a loaded one may take to schedule
	 * the client at all: send the same (all-rejected) entries again until
	 * the client has made 3 cycles while they run, 3 s at most.
	 */
	for (uint64_t rep = 0; !fail && g_good->cycles - good0 < 3 &&
	     h_now_ms() - t_fuzz < 3000; rep++) {
		uint8_t *again = calloc(FUZZ_ENTRIES, 1);

		if (!again || fuzz_run(&r, WARMUP_ENTRIES, FUZZ_ENTRIES, again,
				       &accepted))
			fail = 1;
		free(again);
	}
	uint64_t t_fuzz_end = h_now_ms();
	uint64_t good1 = g_good->cycles;
	if (accepted) {
		h_fail("%" PRIu64 " of %d fuzz entries were accepted", accepted,
		       FUZZ_ENTRIES);
		fail = 1;
	}
	for (uint64_t i = 0; i < FUZZ_ENTRIES && !fail; i++)
		if (!seen[i]) {
			h_fail("fuzz entry %" PRIu64 " never completed", i);
			fail = 1;
		}
	free(seen);
	h_log("fuzz: %d entries (repeated until the good client had 3 cycles)"
	      " in %" PRIu64 " ms; the good client ran %" PRIu64
	      " verified cycles meanwhile", FUZZ_ENTRIES, t_fuzz_end - t_fuzz,
	      good1 - good0);
	if (good1 - good0 < 3 && !fail) {
		h_fail("the well-behaved client made only %" PRIu64 " cycles while"
		       " the fuzz ran", good1 - good0);
		fail = 1;
	}

	uint64_t good_s = g_good->cycles;
	if (scribble_phase(&d, 300))
		fail = 1;
	if (g_good->cycles == good_s) {
		h_fail("the well-behaved client made no progress while another"
		       " client scribbled over its ring");
		fail = 1;
	}

	/* Broken rings: detached, everyone else served. */
	fail |= expect_detached("published sq_tail - sq_head > entries",
				bogus_sq_tail);
	fail |= expect_detached("published cq_head ahead of cq_tail",
				bogus_cq_head);
	uint64_t good2 = g_good->cycles;
	uint64_t until = h_now_ms() + 5000;
	while (g_good->cycles < good2 + 5 && h_now_ms() < until)
		h_sleep_ms(1);
	if (g_good->cycles < good2 + 5) {
		h_fail("the well-behaved client stalled after the broken clients"
		       " were detached");
		fail = 1;
	}
	struct kvp_client *late;
	rc = h_connect(&late, d.sock, "late", 5000, err, sizeof(err));
	if (rc < 0) {
		h_fail("a new client cannot attach after the fuzz: %d (%s)", rc, err);
		fail = 1;
	} else {
		if (h_append_cycle(late, 5, 424242, 0, 17, 0) ||
		    h_verify_user(late, 5, 424242, 0, 17, NULL))
			fail = 1;
		kvp_close(late);
	}

	long rss1 = h_proc_status_kb(d.pid, "VmRSS");
	h_log("daemon VmRSS: %ld KiB after the warm-up, %ld KiB at the end"
	      " (RssAnon %ld KiB, RssShmem %ld KiB)", rss0, rss1,
	      h_proc_status_kb(d.pid, "RssAnon"), h_proc_status_kb(d.pid, "RssShmem"));
	if (rss0 < 0 || rss1 < 0) {
		h_fail("cannot read the daemon's VmRSS");
		fail = 1;
	} else if (rss1 - rss0 >= RSS_SLACK_KB) {
		h_fail("the daemon grew by %ld KiB (limit %d KiB)", rss1 - rss0,
		       RSS_SLACK_KB);
		fail = 1;
	}

	g_good->stop = 1;
	rc = h_wait(good, 20000);
	if (rc != 0) {
		h_fail("the well-behaved client exited %d", rc);
		fail = 1;
	}
	h_raw_detach(&r);
	/* Nobody else busy now: a stalled client must not make it spin. */
	if (full_cq_phase(&d))
		fail = 1;
	/* Every lease, the fuzzer's included, is gone once its owner left. */
	struct kvp_stats st;
	until = h_now_ms() + 5000;
	for (;;) {
		rc = kvp_stats(owner, 0, &st);
		if (rc < 0 || st.leases == 0 || h_now_ms() > until)
			break;
		h_sleep_ms(5);
	}
	if (rc < 0 || st.leases != 0) {
		h_fail("after the fuzz: stats %d, %" PRIu64 " leases (expected 0)",
		       rc, rc < 0 ? 0 : st.leases);
		fail = 1;
	}
	kvp_close(owner);
	return h_daemon_finish(&d, fail, t0);
}
