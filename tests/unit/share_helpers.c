/* SPDX-License-Identifier: MIT */
/*
 * share_helpers.c - sequences and chunks for the sharing unit tests (see
 * share_helpers.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine_helpers.h"
#include "kvp_kernels.h"
#include "share_helpers.h"

void tlease_copy(struct tlease *t, const struct engine_lease *L)
{
	memset(t, 0, sizeof(*t));
	t->L = *L;
	if (L->npages > TL_MAX_PAGES)
		fail_msg("lease of %" PRIu32 " pages: the test keeps %d", L->npages,
			 TL_MAX_PAGES);
	if (L->npages)
		memcpy(t->frames, L->frames, L->npages * sizeof(uint32_t));
	t->L.frames = NULL;
}

void write_key(struct engine *eng, const struct tlease *t, uint64_t key,
	       uint32_t first, uint32_t n)
{
	const struct kvp_layout *l = engine_layout(eng);
	struct kvp_slot *slots = calloc(n ? n : 1, sizeof(*slots));
	uint8_t *buf = malloc((size_t)(n ? n : 1) * l->token_bytes);
	struct errbuf e = { .msg = "" };
	int rc;

	assert_non_null(slots);
	assert_non_null(buf);
	rc = engine_lease_slots(eng, t->L.id, first, n, slots, &e);
	if (rc)
		fail_msg("engine_lease_slots(%#" PRIx64 ", %u, %u) = %d: %s", t->L.id,
			 first, n, rc, e.msg);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t q = t->L.len + first + i;

		if (slots[i].frame != t->frames[q / l->page_tokens] ||
		    slots[i].slot != q % l->page_tokens)
			fail_msg("slot of token %" PRIu64 " is frame %u slot %u, the page "
				 "table says frame %u slot %" PRIu64, q, slots[i].frame,
				 slots[i].slot, t->frames[q / l->page_tokens],
				 q % l->page_tokens);
	}
	pattern(l, key, t->L.len + first, n, buf);
	kvp_append_cpu(l, engine_tier(eng, KVP_TIER_DEVICE)->base, slots, n, buf);
	free(buf);
	free(slots);
}

struct tlease seq_alloc_ok(struct engine *eng, uint64_t seq,
			   const uint32_t *tokens, uint32_t n, uint32_t owner)
{
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc;

	memset(&L, 0, sizeof(L));
	rc = share_seq_alloc(eng, seq, tokens, n, owner, &L, &e);
	if (rc)
		fail_msg("share_seq_alloc(seq %" PRIu64 ", n %u) = %d: %s", seq, n, rc,
			 e.msg);
	tlease_copy(&t, &L);
	CHECK(eng);
	return t;
}

struct tlease seq_create_ok(struct engine *eng, uint64_t seq,
			    const struct kvp_seq_src *src, uint32_t nsrc,
			    uint32_t n_new, uint32_t owner)
{
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc;

	memset(&L, 0, sizeof(L));
	rc = share_seq_create(eng, seq, src, nsrc, n_new, owner, &L, &e);
	if (rc)
		fail_msg("share_seq_create(seq %" PRIu64 ", %u sources, n_new %u) = %d: %s",
			 seq, nsrc, n_new, rc, e.msg);
	tlease_copy(&t, &L);
	CHECK(eng);
	return t;
}

struct tlease seq_extend_ok(struct engine *eng, uint64_t seq, uint32_t n_new,
			    const uint32_t *tokens, uint32_t owner)
{
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc;

	memset(&L, 0, sizeof(L));
	rc = share_seq_extend(eng, seq, n_new, tokens, owner, &L, &e);
	if (rc)
		fail_msg("share_seq_extend(seq %" PRIu64 ", n_new %u) = %d: %s", seq,
			 n_new, rc, e.msg);
	tlease_copy(&t, &L);
	CHECK(eng);
	return t;
}

void seq_free_ok(struct engine *eng, uint64_t seq, uint32_t owner)
{
	struct errbuf e = { .msg = "" };
	int rc = share_seq_free(eng, seq, owner, &e);

	if (rc)
		fail_msg("share_seq_free(seq %" PRIu64 ") = %d: %s", seq, rc, e.msg);
	CHECK(eng);
}

struct tlease seq_put(struct engine *eng, uint64_t seq, const uint32_t *tokens,
		      uint32_t n, uint64_t key, uint32_t owner)
{
	struct tlease t = seq_alloc_ok(eng, seq, tokens, n, owner);

	write_key(eng, &t, key, 0, t.L.n_new);
	commit_ok(eng, t.L.id, t.L.n_new);
	release_ok(eng, t.L.id);
	return t;
}

static void expect_bytes(const struct kvp_layout *l, const uint8_t *got,
			 uint64_t key, uint64_t kpos, uint32_t n, const char *what)
{
	uint8_t *want = malloc((size_t)(n ? n : 1) * l->token_bytes);

	assert_non_null(want);
	pattern(l, key, kpos, n, want);
	for (uint32_t i = 0; i < n; i++)
		if (memcmp(got + (size_t)i * l->token_bytes,
			   want + (size_t)i * l->token_bytes, l->token_bytes))
			fail_msg("%s: token %u (key %#" PRIx64 " position %" PRIu64
				 ") holds other bytes", what, i, key, kpos + i);
	free(want);
}

void expect_seq_bytes(struct engine *eng, uint64_t seq, uint64_t pos,
		      uint32_t n, uint64_t key, uint64_t kpos)
{
	const struct kvp_layout *l = engine_layout(eng);
	uint8_t *got = malloc((size_t)(n ? n : 1) * l->token_bytes);
	struct errbuf e = { .msg = "" };
	char what[96];
	int rc;

	assert_non_null(got);
	rc = share_seq_read_tokens(eng, seq, pos, n, got, &e);
	if (rc)
		fail_msg("share_seq_read_tokens(seq %" PRIu64 ", %" PRIu64 ", %u) = %d: %s",
			 seq, pos, n, rc, e.msg);
	snprintf(what, sizeof(what), "seq %" PRIu64 " from %" PRIu64, seq, pos);
	expect_bytes(l, got, key, kpos, n, what);
	free(got);
}

void expect_frames_bytes(struct engine *eng, const uint32_t *frames,
			 uint32_t pos, uint32_t n, uint64_t key, uint64_t kpos)
{
	const struct kvp_layout *l = engine_layout(eng);
	struct kvp_slot *slots = calloc(n ? n : 1, sizeof(*slots));
	uint8_t *got = malloc((size_t)(n ? n : 1) * l->token_bytes);

	assert_non_null(slots);
	assert_non_null(got);
	for (uint32_t i = 0; i < n; i++)
		slots[i] = (struct kvp_slot){ frames[(pos + i) / l->page_tokens],
					      (pos + i) % l->page_tokens };
	kvp_read_cpu(l, engine_tier(eng, KVP_TIER_DEVICE)->base, slots, n, got);
	expect_bytes(l, got, key, kpos, n, "through the page table");
	free(got);
	free(slots);
}

struct tlease chunk_put(struct engine *eng, const uint32_t *tokens, uint32_t n,
			uint32_t type, const char *meta, uint32_t owner,
			uint64_t now_ns, uint64_t key, bool by_commit,
			struct kvp_chunk_id *id)
{
	struct share_chunk_reg r;
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc;

	memset(&r, 0, sizeof(r));
	/* With a remote tier a new name is asked of the store first: held
	 * (-EINPROGRESS) for one round, as a ring worker holds the entry. */
	for (int tries = 0; (rc = share_chunk_register(eng, tokens, n, type, meta,
						       owner, now_ns, &r, &e)) ==
			    -EINPROGRESS && tries < 5000; tries++)
		usleep(1000);
	if (rc)
		fail_msg("share_chunk_register(n %u, type %u) = %d: %s", n, type, rc,
			 e.msg);
	if (!r.created)
		fail_msg("share_chunk_register(n %u): found an existing chunk", n);
	assert_int_equal(r.state, KVP_CHUNK_FILLING);
	tlease_copy(&t, &r.lease);
	assert_int_equal(t.L.len, 0);
	assert_int_equal(t.L.n_new, n);
	assert_int_equal(t.L.npages, (n + PT - 1) / PT);
	CHECK(eng);
	write_key(eng, &t, key, 0, n);
	if (by_commit) {
		commit_ok(eng, t.L.id, n);
	} else {
		rc = share_chunk_seal(eng, t.L.id, owner, &e);
		if (rc)
			fail_msg("share_chunk_seal = %d: %s", rc, e.msg);
		CHECK(eng);
	}
	*id = r.id;
	return t;
}

struct tlease chunk_acquire_ok(struct engine *eng, const struct kvp_chunk_id *id,
			       uint32_t owner, uint64_t now_ns)
{
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc;

	memset(&L, 0, sizeof(L));
	rc = share_chunk_acquire(eng, id, owner, now_ns, &L, &e);
	if (rc)
		fail_msg("share_chunk_acquire = %d: %s", rc, e.msg);
	tlease_copy(&t, &L);
	CHECK(eng);
	return t;
}

void expect_chunk_bytes(struct engine *eng, const struct kvp_chunk_id *id,
			uint64_t key, uint32_t n)
{
	const struct kvp_layout *l = engine_layout(eng);
	uint8_t *got = malloc((size_t)(n ? n : 1) * l->token_bytes);
	struct errbuf e = { .msg = "" };
	int rc;

	assert_non_null(got);
	rc = share_chunk_read_tokens(eng, id, 0, n, got, &e);
	if (rc)
		fail_msg("share_chunk_read_tokens(0, %u) = %d: %s", n, rc, e.msg);
	expect_bytes(l, got, key, 0, n, "chunk");
	free(got);
}

void tokens_seq(uint32_t *out, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		out[i] = base + i;
}

void id_hex(const struct kvp_chunk_id *id, char hex[65])
{
	for (int i = 0; i < KVP_CHUNK_ID_BYTES; i++)
		snprintf(hex + 2 * i, 3, "%02x", id->b[i]);
}

uint64_t dev_free(struct engine *eng)
{
	return stats_of(eng).tier[KVP_TIER_DEVICE].frames_free;
}
