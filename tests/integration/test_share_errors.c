/* SPDX-License-Identifier: MIT */
/*
 * test_share_errors - the sharing calls' errors, through libkvpool and
 * straight on the ring, against a real kvpoold:
 *
 *   1. through the client: a chunk that is not registered is -ENOENT and
 *      the message names its id; a context chunk given as a composition's
 *      system chunk is -EINVAL naming it; 65 contexts in one request is
 *      -EINVAL; a chunk larger than the device tier is -E2BIG and one larger
 *      than what is free while the rest is leased is -ENOMEM, each with a
 *      message; sealing a chunk one did not create, or twice, fails; a
 *      sequence id used twice is -EEXIST; a composition preview holds
 *      nothing and a real one holds its chunks until released;
 *   2. on the ring (a raw client): every sharing opcode with an input range
 *      outside the arena, lengths that disagree with the counts in the
 *      input, metadata and filters that are not NUL-terminated (or hold a
 *      NUL early), compose counts that exceed the input, unknown chunk
 *      types and source kinds, nonzero reserved words, input on an opcode
 *      that takes none: each gets an error completion, and the daemon then
 *      serves a good register from the same raw client and a stats call
 *      from the library client.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

static void ids(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
}

/* Register and seal (bytes: zero) n tokens from base; the id in *id. */
static int make_chunk(struct kvp_client *c, uint32_t base, uint32_t n,
		      uint32_t type, struct kvp_chunk_id *id)
{
	uint32_t *t = malloc(n * sizeof(*t));
	struct kvp_chunk_reg reg;
	int rc;

	ids(t, n, base);
	rc = kvp_chunk_register(c, t, n, type, NULL, &reg);
	free(t);
	if (!rc && reg.created)
		rc = kvp_chunk_seal(c, &reg);
	if (rc)
		h_fail("make_chunk: %s", kvp_last_error(c));
	*id = reg.id;
	return rc;
}

/* Link the name of root entry *id after parent and seal it: *id becomes
 * the link entry's id. */
static int link_chunk(struct kvp_client *c, const struct kvp_chunk_id *parent,
		      struct kvp_chunk_id *id)
{
	struct kvp_chunk_info ci;
	struct kvp_chunk_reg reg;
	int rc = kvp_chunk_get(c, id, &ci);

	if (!rc)
		rc = kvp_chunk_link(c, &ci.id, parent, 1000, &reg);
	if (!rc && reg.created)
		rc = kvp_chunk_seal(c, &reg);
	if (rc)
		h_fail("link_chunk: %s", kvp_last_error(c));
	*id = reg.id;
	return rc;
}

static int names(const char *msg, const struct kvp_chunk_id *id)
{
	char hex[65];

	kvp_chunk_id_format(id, hex);
	hex[16] = '\0';
	return strstr(msg, hex) != NULL;
}

static void client_errors(struct kvp_client *c)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	struct kvp_chunk_id sys, ctx, q, ctx_l, q_l, missing, ctx65[65];
	struct kvp_composition comp;
	struct kvp_chunk_reg reg;
	struct kvp_lease l, hold;
	struct kvp_stats st;
	uint32_t *big;
	uint32_t frames;
	int rc;

	if (make_chunk(c, 100, 40, KVP_CHUNK_SYSTEM, &sys) ||
	    make_chunk(c, 200, 33, KVP_CHUNK_CONTEXT, &ctx) ||
	    make_chunk(c, 300, 5, KVP_CHUNK_QUERY, &q)) {
		g_bad++;
		return;
	}
	/* The chain sys -> ctx_l -> q_l (contexts and queries follow). */
	ctx_l = ctx;
	if (link_chunk(c, &sys, &ctx_l) || (q_l = q, link_chunk(c, &ctx_l, &q_l))) {
		g_bad++;
		return;
	}
	memset(&missing, 0xab, sizeof(missing));
	rc = kvp_chunk_acquire(c, &missing, 0, &l);
	CHECK(rc == -ENOENT && names(kvp_last_error(c), &missing),
	      "acquire of an unknown id: %d '%s'", rc, kvp_last_error(c));
	rc = kvp_chunk_delete(c, &missing);
	CHECK(rc == -ENOENT && names(kvp_last_error(c), &missing),
	      "delete of an unknown id: %d '%s'", rc, kvp_last_error(c));

	/* Incompatible: a context chunk as the system chunk. */
	struct kvp_compose_req rq = { .system = ctx, .contexts = &ctx, .ncontexts = 1,
				      .query = q };
	rc = kvp_compose(c, &rq, 1, &comp);
	CHECK(rc == -EINVAL && names(kvp_last_error(c), &ctx),
	      "compose with a context as system: %d '%s'", rc, kvp_last_error(c));
	rq.system = missing;
	rc = kvp_compose(c, &rq, 1, &comp);
	CHECK(rc == -ENOENT && names(kvp_last_error(c), &missing),
	      "compose with an unknown system: %d '%s'", rc, kvp_last_error(c));
	for (int i = 0; i < 65; i++)
		ctx65[i] = ctx;
	rq = (struct kvp_compose_req){ .system = sys, .contexts = ctx65,
				       .ncontexts = 65, .query = q_l };
	rc = kvp_compose(c, &rq, 1, &comp);
	CHECK(rc == -EINVAL && strstr(kvp_last_error(c), "65"),
	      "compose with 65 contexts: %d '%s'", rc, kvp_last_error(c));

	/* A broken chain: the query's parent is ctx_l, not the system. */
	rq = (struct kvp_compose_req){ .system = sys, .query = q_l };
	rc = kvp_compose(c, &rq, 1, &comp);
	CHECK(rc == -EINVAL && names(kvp_last_error(c), &q_l) &&
	      names(kvp_last_error(c), &ctx_l) && strstr(kvp_last_error(c), "chain"),
	      "compose of a broken chain: %d '%s'", rc, kvp_last_error(c));
	/* A good composition: preview holds nothing, compose holds. */
	rq = (struct kvp_compose_req){ .system = sys, .contexts = &ctx_l,
				       .ncontexts = 1, .query = q_l };
	rc = kvp_compose_preview(c, &rq, 1, &comp);
	CHECK(rc == 0 && comp.lease == 0 && comp.nlevels == 3 && comp.tokens == 40 + 33 + 5,
	      "preview: %d lease %" PRIu64 " levels %u tokens %" PRIu64 " (%s)", rc,
	      comp.lease, comp.nlevels, comp.tokens, kvp_last_error(c));
	rc = kvp_compose(c, &rq, 1, &comp);
	CHECK(rc == 0 && comp.lease && comp.level[0].ngroups == 1 &&
	      comp.level[0].kv_indptr[1] == 3 && comp.level[0].kv_last_page_len[0] == 8,
	      "compose: %d (%s)", rc, kvp_last_error(c));
	if (rc == 0) {
		struct kvp_chunk_info ci;

		CHECK(kvp_chunk_get(c, &sys, &ci) == 0 && ci.holders == 1,
		      "a composed chunk has %u holders, want 1", ci.holders);
		CHECK(kvp_release(c, comp.lease) == 0, "release of a composition: %s",
		      kvp_last_error(c));
	}

	/* Sealing what one did not create; twice. */
	uint32_t t5[5];
	ids(t5, 5, 300);
	rc = kvp_chunk_register(c, t5, 5, KVP_CHUNK_QUERY, NULL, &reg);
	CHECK(rc == 0 && !reg.created && reg.state == KVP_CHUNK_READY,
	      "register of an existing chunk: %d created %d", rc, reg.created);
	CHECK(kvp_chunk_seal(c, &reg) == -EINVAL, "seal with created = 0 passed");
	ids(t5, 5, 900);
	rc = kvp_chunk_register(c, t5, 5, KVP_CHUNK_QUERY, "a=1", &reg);
	CHECK(rc == 0 && reg.created, "register: %s", kvp_last_error(c));
	CHECK(kvp_chunk_seal(c, &reg) == 0, "seal: %s", kvp_last_error(c));
	rc = kvp_chunk_seal(c, &reg);
	CHECK(rc < 0, "a second seal passed");
	rc = kvp_chunk_register(c, t5, 5, KVP_CHUNK_CONTEXT, NULL, &reg);
	CHECK(rc == -EINVAL, "same tokens as another type: %d (%s)", rc, kvp_last_error(c));
	rc = kvp_chunk_register(c, t5, 5, 9, NULL, &reg);
	CHECK(rc == -EINVAL && strstr(kvp_last_error(c), "type"),
	      "type 9: %d '%s'", rc, kvp_last_error(c));

	/* Sequences: an id twice. */
	rc = kvp_seq_alloc(c, 5, t5, 5, &l);
	CHECK(rc == 0, "seq_alloc: %s", kvp_last_error(c));
	rc = kvp_seq_alloc(c, 5, t5, 5, &hold);
	CHECK(rc == -EEXIST, "seq_alloc of an existing id: %d", rc);
	/* Never freed under its held write lease (the lease's page table names
	 * its pages): -EBUSY, then a release lets it go. */
	rc = kvp_seq_free(c, 5);
	CHECK(rc == -EBUSY && strstr(kvp_last_error(c), "write lease"),
	      "seq_free under its lease: %d '%s'", rc, kvp_last_error(c));
	CHECK(kvp_release(c, l.id) == 0, "release: %s", kvp_last_error(c));
	CHECK(kvp_seq_free(c, 5) == 0, "seq_free: %s", kvp_last_error(c));
	CHECK(kvp_seq_free(c, 5) == -ENOENT, "seq_free twice passed");

	/* Out of memory: more pages than the tier, then more than is free. */
	if (kvp_stats(c, 0, &st)) {
		g_bad++;
		return;
	}
	frames = (uint32_t)st.tier[KVP_TIER_DEVICE].frames_total;
	big = malloc(((size_t)frames + 2) * lay->page_tokens * sizeof(*big));
	ids(big, (frames + 2) * lay->page_tokens, 5000);
	rc = kvp_chunk_register(c, big, (frames + 1) * lay->page_tokens,
				KVP_CHUNK_CONTEXT, NULL, &reg);
	CHECK((rc == -E2BIG || rc == -ENOMEM) && strlen(kvp_last_error(c)) > 10,
	      "a chunk bigger than the tier: %d '%s'", rc, kvp_last_error(c));
	/* Hold half the tier in a filling chunk: the other half cannot take
	 * 3/4 of it. */
	rc = kvp_chunk_register(c, big, frames / 2 * lay->page_tokens,
				KVP_CHUNK_CONTEXT, NULL, &reg);
	CHECK(rc == 0 && reg.created, "half the tier: %d (%s)", rc, kvp_last_error(c));
	if (rc == 0) {
		struct kvp_chunk_reg r2;

		rc = kvp_chunk_register(c, big + 7, frames * 3 / 4 * lay->page_tokens,
					KVP_CHUNK_CONTEXT, NULL, &r2);
		CHECK(rc == -ENOMEM && strlen(kvp_last_error(c)) > 10,
		      "3/4 of the tier with half held: %d '%s'", rc, kvp_last_error(c));
		CHECK(kvp_release(c, reg.lease.id) == 0,
		      "release of a fill lease (deletes the chunk): %s", kvp_last_error(c));
		CHECK(kvp_chunk_get(c, &reg.id, &(struct kvp_chunk_info){ 0 }) == -ENOENT,
		      "a fill lease released unsealed left its chunk");
	}
	free(big);
	h_log("client errors: %d failed", g_bad);
}

/* ------------------------------------------------------------ the ring */

struct rawcase {
	struct kvp_sqe e;
	uint32_t in_bytes;            /* what to write at IN_OFF */
	unsigned char in[512];
	const char *what;
};

#define IN_OFF 65536u
#define OUT_OFF 0u
#define OUT_LEN 65536u

static struct rawcase *g_cases;
static int g_n;

static struct rawcase *add(unsigned op, const char *what)
{
	struct rawcase *rc = &g_cases[g_n++];

	memset(rc, 0, sizeof(*rc));
	rc->e.opcode = (uint8_t)op;
	rc->e.tag = (uint64_t)g_n;
	rc->e.out_off = OUT_OFF;
	rc->e.out_len = OUT_LEN;
	rc->e.in_off = IN_OFF;
	rc->what = what;
	return rc;
}

/* Input bytes and a matching in_len (the case may change in_len after). */
static void put(struct rawcase *rc, const void *p, uint32_t n)
{
	memcpy(rc->in + rc->in_bytes, p, n);
	rc->in_bytes += n;
	rc->e.in_len = rc->in_bytes;
}

static void build_cases(uint32_t arena)
{
	struct kvp_chunk_register_in rh = { .type = KVP_CHUNK_CONTEXT, .ntokens = 4 };
	struct kvp_chunk_list_in lh = { 0 };
	struct kvp_compose_in ch = { .nreq = 1, .nctx = 2 };
	struct kvp_compose_req_in rq = { .ncontexts = 3 };
	struct kvp_seq_create_in sh = { .nsrc = 3 };
	struct kvp_seq_src src = { .kind = KVP_SRC_CHUNK };
	uint32_t tok[4] = { 1, 2, 3, 4 };
	struct rawcase *c;

	for (unsigned op = KVP_OP_PREFIX_LOOKUP; op < KVP_OP_MAX; op++) {
		c = add(op, "input range past the arena");
		c->e.in_off = arena - 8;
		c->e.in_len = 16;
		c->e.n = 4;
		c = add(op, "input range wrapping 2^32");
		c->e.in_off = 0xfffffff0u;
		c->e.in_len = 0x20;
		c = add(op, "rsv1 nonzero");
		c->e.rsv1 = 1;
	}
	c = add(KVP_OP_PREFIX_LOOKUP, "n 4 with 3 ids of input");
	c->e.n = 4;
	put(c, tok, 12);
	c = add(KVP_OP_PREFIX_LOOKUP, "n 2^31 tokens");
	c->e.n = 1u << 31;
	put(c, tok, 16);
	c = add(KVP_OP_SEQ_ALLOC, "n 5 with 4 ids of input");
	c->e.n = 5;
	c->e.arg = 1;
	put(c, tok, 16);
	c = add(KVP_OP_SEQ_EXTEND, "extend with 3 ids for n 4");
	c->e.n = 4;
	put(c, tok, 12);
	c = add(KVP_OP_SEQ_CREATE, "3 sources, 1 in the input");
	put(c, &sh, sizeof(sh));
	put(c, &src, sizeof(src));
	c = add(KVP_OP_SEQ_CREATE, "source kind 9");
	sh.nsrc = 1;
	src.kind = 9;
	put(c, &sh, sizeof(sh));
	put(c, &src, sizeof(src));
	c = add(KVP_OP_SEQ_CREATE, "nsrc 2^32-1");
	sh.nsrc = UINT32_MAX;
	put(c, &sh, sizeof(sh));
	c = add(KVP_OP_CHUNK_REGISTER, "ntokens 4, 3 in the input");
	put(c, &rh, sizeof(rh));
	put(c, tok, 12);
	c = add(KVP_OP_CHUNK_REGISTER, "ntokens 2^30 (length overflow bait)");
	rh.ntokens = 1u << 30;
	put(c, &rh, sizeof(rh));
	put(c, tok, 16);
	rh.ntokens = 4;
	c = add(KVP_OP_CHUNK_REGISTER, "metadata not NUL-terminated");
	rh.meta_len = 3;
	put(c, &rh, sizeof(rh));
	put(c, tok, 16);
	put(c, "a=b", 3);
	c = add(KVP_OP_CHUNK_REGISTER, "metadata with a NUL inside");
	rh.meta_len = 4;
	put(c, &rh, sizeof(rh));
	put(c, tok, 16);
	put(c, "a\0b", 4);
	c = add(KVP_OP_CHUNK_REGISTER, "meta_len 2^32-1");
	rh.meta_len = UINT32_MAX;
	put(c, &rh, sizeof(rh));
	put(c, tok, 16);
	rh.meta_len = 0;
	c = add(KVP_OP_CHUNK_REGISTER, "chunk type 7");
	rh.type = 7;
	put(c, &rh, sizeof(rh));
	put(c, tok, 16);
	rh.type = KVP_CHUNK_CONTEXT;
	c = add(KVP_OP_CHUNK_REGISTER, "content_len past the input");
	rh.content_len = 1;
	put(c, &rh, sizeof(rh));
	put(c, tok, 16);
	rh.content_len = 0;
	c = add(KVP_OP_CHUNK_REGISTER, "header cut short");
	put(c, &rh, 8);
	c = add(KVP_OP_CHUNK_ACQUIRE, "an id of 31 bytes");
	put(c, tok, 16);
	put(c, tok, 15);
	c = add(KVP_OP_CHUNK_GET, "an id of 33 bytes");
	put(c, tok, 16);
	put(c, tok, 16);
	put(c, tok, 1);
	c = add(KVP_OP_CHUNK_LIST, "filter not NUL-terminated");
	c->e.n = 4;
	lh.filter_len = 3;
	put(c, &lh, sizeof(lh));
	put(c, "a=b", 3);
	c = add(KVP_OP_CHUNK_LIST, "filter_len longer than the input");
	c->e.n = 4;
	lh.filter_len = 40;
	put(c, &lh, sizeof(lh));
	put(c, "a=b", 4);
	c = add(KVP_OP_CHUNK_LIST, "has_after 2");
	c->e.n = 4;
	lh.filter_len = 0;
	lh.has_after = 2;
	put(c, &lh, sizeof(lh));
	c = add(KVP_OP_COMPOSE, "a request's 3 contexts past nctx 2");
	put(c, &ch, sizeof(ch));
	put(c, &rq, sizeof(rq));
	put(c, tok, 16);
	put(c, tok, 16);
	put(c, tok, 16);
	put(c, tok, 16);
	c = add(KVP_OP_COMPOSE, "nreq 0");
	ch.nreq = 0;
	put(c, &ch, sizeof(ch));
	c = add(KVP_OP_COMPOSE, "nreq 2^32-1 (length overflow bait)");
	ch.nreq = UINT32_MAX;
	ch.nctx = UINT32_MAX;
	put(c, &ch, sizeof(ch));
	c = add(KVP_OP_COMPOSE, "flag 0x08");
	c->e.flags = 0x08;
	c = add(KVP_OP_SEQ_FREE, "input on an opcode that takes none");
	c->e.in_len = 8;
	c = add(KVP_OP_CHUNK_CLEAR, "type 4");
	c->e.in_off = 0;
	c->e.n = 4;
	c = add(KVP_OP_CHUNK_EVICT_UNUSED, "max age 2^40 s");
	c->e.in_off = 0;
	c->e.arg = 1ull << 40;
	c = add(KVP_OP_STATS, "input on STATS");
	c->e.in_len = 4;
}

static void ring_errors(const char *sock, struct kvp_client *lib)
{
	struct h_raw r;
	char err[KVP_ERRLEN];
	struct kvp_cqe cqe;
	struct kvp_stats st;
	int rc, failed = 0;

	g_cases = calloc(512, sizeof(*g_cases));
	rc = h_raw_attach(&r, sock, 0, 0, err, sizeof(err));
	if (rc || !g_cases) {
		h_fail("raw attach: %s", err);
		g_bad++;
		return;
	}
	build_cases(r.hdr.arena_bytes);
	for (int i = 0; i < g_n; i++) {
		struct rawcase *c = &g_cases[i];

		memcpy(r.arena + IN_OFF, c->in, c->in_bytes);
		if (h_raw_call(&r, &c->e, &cqe, 1, 5000)) {
			h_fail("ring: no completion for opcode %u '%s'", c->e.opcode, c->what);
			g_bad++;
			break;
		}
		if (cqe.res >= 0) {
			h_fail("ring: opcode %u '%s' was accepted (res %d)", c->e.opcode,
			       c->what, cqe.res);
			g_bad++;
		} else {
			failed++;
		}
	}
	/* Still serving: a good register from the raw client... */
	struct rawcase *c = add(KVP_OP_CHUNK_REGISTER, "good");
	struct kvp_chunk_register_in rh = { .type = KVP_CHUNK_QUERY, .ntokens = 3,
					    .meta_len = 8 };
	uint32_t tok[3] = { 11, 12, 13 };
	put(c, &rh, sizeof(rh));
	put(c, tok, sizeof(tok));
	put(c, "{\"x\":1}", 8);
	memcpy(r.arena + IN_OFF, c->in, c->in_bytes);
	rc = h_raw_call(&r, &c->e, &cqe, 1, 5000);
	CHECK(rc == 0 && cqe.res == 1 &&
	      cqe.out_bytes >= sizeof(struct kvp_chunk_reg_out) + sizeof(struct kvp_prepare_out),
	      "ring: a good register after the bad ones: rc %d res %d (%s)", rc, cqe.res,
	      cqe.res < 0 ? (const char *)r.arena : "");
	h_raw_detach(&r);
	/* ...and the library client. */
	CHECK(kvp_stats(lib, 0, &st) == 0, "stats after the ring cases: %s",
	      kvp_last_error(lib));
	h_log("ring: %d malformed sharing entries, %d got error completions", g_n - 1,
	      failed);
	free(g_cases);
}

int main(int argc, char **argv)
{
	struct kvp_client *c;
	struct h_daemon d;
	uint64_t t0;

	h_init(argc, argv, "test_share_errors");
	t0 = h_now_ms();
	if (h_daemon_up(&d, "--device_mem=1M", "--host_mem=0", (char *)NULL))
		return H_FAIL;
	c = h_connect_or_fail(d.sock, "errors", 5000);
	if (!c)
		return h_daemon_finish(&d, 1, t0);
	client_errors(c);
	ring_errors(d.sock, c);
	kvp_close(c);
	return h_daemon_finish(&d, g_bad, t0);
}
