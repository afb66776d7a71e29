/* SPDX-License-Identifier: MIT */
/*
 * test_share.c - the sharing contract of daemon/engine/include/share.h on the shm backend:
 *  - the prefix cache: commits publish full pages, lookups report whole
 *    pages but never the last token (a prompt cached whole reports n - 1,
 *    its last page copied on write; test_share_full_prompt.c has more),
 *    salts separate tenants, the hashes are
 *    the SHA-256 chain of kvpool.h (checked against OpenSSL by hand), freed
 *    sequences leave their pages cached, eviction takes leaves first, and
 *    two sequences that computed the same page keep one copy (dedupe);
 *  - chunks: register / fill / seal (by seal and by commit), dedupe by id,
 *    "not ready" while filling, "not found" naming the id, delete while
 *    leased (bytes intact until release), a filler that gives up or dies,
 *    list by type and metadata with paging, clear, evict_unused, LRU
 *    eviction under pressure that spares held chunks;
 *  - virtual sequences: page tables made of borrowed history and chunk
 *    pages, refcounted pages of another sequence, the history pinned, the
 *    mid-page rule, copy on write keeping both sides' bytes;
 *  - compositions: the CSR of every cascade level as kvpool.h describes it,
 *    preview equal to compose and holding nothing, the error cases, chunks
 *    held by a composition through a delete.
 * engine_check() passes after every step that changes the engine.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "engine.h"
#include "engine_helpers.h"
#include "kvpool.h"
#include "share.h"
#include "share_helpers.h"

#define OTHER 2u              /* a second client */
#define SEC 1000000000ull

static const uint64_t KT = 0x7e57;   /* key of the token list T */

/* ------------------------------------------------------------ helpers */

static struct share_prefix_hit lookup(struct engine *eng, const uint32_t *tokens,
				      uint32_t n)
{
	struct share_prefix_hit h;

	memset(&h, 0, sizeof(h));
	share_prefix_lookup(eng, tokens, n, &h);
	CHECK(eng);
	return h;
}

/* A refused call changed no gauge, frame or eviction counter (lookup and
 * hit counters may count the attempt). */
static void assert_gauges_same(const struct kvp_stats *a, const struct kvp_stats *b)
{
#define SAME(f) if (a->f != b->f) fail_msg(#f " changed: %" PRIu64 " -> %" PRIu64, \
					    (uint64_t)a->f, (uint64_t)b->f)
	for (int t = 0; t < KVP_TIERS; t++) {
		SAME(tier[t].frames_used);
		SAME(tier[t].frames_free);
	}
	SAME(users); SAME(leases); SAME(evicted_users); SAME(evicted_pages);
	SAME(demoted_users); SAME(prefix_pages); SAME(prefix_idle_pages);
	SAME(prefix_evicted_pages); SAME(prefix_dedupe_pages); SAME(seqs);
	SAME(seq_pages); SAME(cow_pages); SAME(chunks); SAME(chunk_pages);
	SAME(chunk_bytes); SAME(chunk_evicted); SAME(compositions);
#undef SAME
}

static struct kvp_chunk_info chunk_info_ok(struct engine *eng,
					   const struct kvp_chunk_id *id)
{
	struct kvp_chunk_info ci;
	struct errbuf e = { .msg = "" };
	int rc;

	memset(&ci, 0, sizeof(ci));
	rc = share_chunk_info(eng, id, &ci, &e);
	if (rc)
		fail_msg("share_chunk_info = %d: %s", rc, e.msg);
	return ci;
}

static bool chunk_exists(struct engine *eng, const struct kvp_chunk_id *id)
{
	struct kvp_chunk_info ci;
	struct errbuf e = { .msg = "" };
	int rc = share_chunk_info(eng, id, &ci, &e);

	if (rc != 0 && rc != -ENOENT)
		fail_msg("share_chunk_info = %d: %s", rc, e.msg);
	return rc == 0;
}

static struct share_chunk_reg chunk_reg(struct engine *eng, const uint32_t *tokens,
					uint32_t n, uint32_t type, const char *meta,
					uint32_t owner, uint64_t now, int want)
{
	struct share_chunk_reg r;
	struct errbuf e = { .msg = "" };
	int rc;

	memset(&r, 0, sizeof(r));
	rc = share_chunk_register(eng, tokens, n, type, meta, owner, now, &r, &e);
	if (rc != want)
		fail_msg("share_chunk_register(n %u, type %u, meta \"%s\") = %d (%s), "
			 "want %d", n, type, meta ? meta : "(null)", rc, e.msg, want);
	CHECK(eng);
	return r;
}

/* A ready chunk of n tokens base, base+1, ... with key = base: its name
 * (which acquire, delete, info and seq sources take for the root entry). */
static struct kvp_chunk_id chunk_make(struct engine *eng, uint32_t base, uint32_t n,
				      uint32_t type, const char *meta, uint64_t now,
				      struct tlease *fill)
{
	uint32_t tok[64];
	struct kvp_chunk_id id;
	struct tlease t;

	assert_true(n <= 64);
	tokens_seq(tok, n, base);
	t = chunk_put(eng, tok, n, type, meta, OWNER, now, base, false, &id);
	if (fill)
		*fill = t;
	return chunk_info_ok(eng, &id).id; /* the name: its root entry's */
}

/* Read a chunk's tokens through a (copied) page table. */
static void expect_chunk_frames(struct engine *eng, const uint32_t *frames,
				uint32_t base, uint32_t n)
{
	expect_frames_bytes(eng, frames, 0, n, base, 0);
}

/* A sequence made with n_new 0 has no write lease (id 0). */
static void release_if(struct engine *eng, uint64_t id)
{
	if (id)
		release_ok(eng, id);
}

static bool frames_equal(const uint32_t *a, const uint32_t *b, uint32_t n)
{
	return memcmp(a, b, n * sizeof(uint32_t)) == 0;
}

static void sha256_chain(const uint8_t prev[32], const uint8_t salt[32],
			 const uint32_t *tok, uint32_t n, uint8_t out[32])
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	unsigned int len = 0;

	assert_non_null(c);
	assert_int_equal(EVP_DigestInit_ex(c, EVP_sha256(), NULL), 1);
	assert_int_equal(EVP_DigestUpdate(c, prev, 32), 1);
	assert_int_equal(EVP_DigestUpdate(c, salt, 32), 1);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t le[4] = { (uint8_t)tok[i], (uint8_t)(tok[i] >> 8),
				  (uint8_t)(tok[i] >> 16), (uint8_t)(tok[i] >> 24) };

		assert_int_equal(EVP_DigestUpdate(c, le, 4), 1);
	}
	assert_int_equal(EVP_DigestFinal_ex(c, out, &len), 1);
	assert_int_equal(len, 32);
	EVP_MD_CTX_free(c);
}

/* ------------------------------------------------------------ prefix cache */

/* Commit publishes full pages only; lookups report whole pages and never the
 * last token (seed 004: a prompt cached whole reports n - 1); a second
 * seq_alloc of the prefix shares the cached pages. */
static void test_prefix_commit_publishes_full_pages_lookup_caps_last_token(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[10], T2[10];
	struct share_prefix_hit h;
	struct kvp_stats s0, s1;

	(void)state;
	tokens_seq(T, 10, 100);
	struct tlease a = seq_alloc_ok(eng, 1, T, 10, OWNER);
	assert_int_equal(a.L.len, 0);
	assert_int_equal(a.L.n_new, 10);
	assert_int_equal(a.L.npages, 3);
	assert_int_equal(a.L.last_page_len, 2);
	assert_int_equal(stats_of(eng).seqs, 1);
	/* nothing is published before the commit */
	assert_int_equal(lookup(eng, T, 10).tokens, 0);
	assert_int_equal(stats_of(eng).prefix_pages, 0);
	write_key(eng, &a, KT, 0, 10);
	commit_ok(eng, a.L.id, 10);
	release_ok(eng, a.L.id);
	assert_int_equal(stats_of(eng).prefix_pages, 2);  /* the third is partial */
	assert_int_equal(stats_of(eng).prefix_idle_pages, 0);
	expect_seq_bytes(eng, 1, 0, 10, KT, 0);

	s0 = stats_of(eng);
	h = lookup(eng, T, 10);
	assert_int_equal(h.tokens, 8);
	assert_int_equal(h.npages, 2);
	assert_non_null(h.frames);
	assert_true(frames_equal(h.frames, a.frames, 2));
	s1 = stats_of(eng);
	assert_int_equal(s1.prefix_lookups - s0.prefix_lookups, 1);
	assert_int_equal(s1.prefix_lookup_tokens - s0.prefix_lookup_tokens, 10);
	assert_int_equal(s1.prefix_hit_tokens - s0.prefix_hit_tokens, 8);
	assert_int_equal(s1.tier[KVP_TIER_DEVICE].frames_used,
			 s0.tier[KVP_TIER_DEVICE].frames_used);

	assert_int_equal(lookup(eng, T, 9).tokens, 8);
	assert_int_equal(lookup(eng, T, 8).tokens, 7);   /* n = 2P: all but the last token */
	assert_int_equal(lookup(eng, T, 8).npages, 2);
	assert_int_equal(lookup(eng, T, 5).tokens, 4);
	assert_int_equal(lookup(eng, T, 4).tokens, 3);   /* n = P */
	assert_int_equal(lookup(eng, T, 1).tokens, 0);
	assert_int_equal(lookup(eng, T, 0).tokens, 0);
	memcpy(T2, T, sizeof(T));
	T2[5] = 9999;                                    /* page 1 differs */
	h = lookup(eng, T2, 10);
	assert_int_equal(h.tokens, 4);
	assert_int_equal(h.npages, 1);
	T2[0] = 9999;                                    /* page 0 differs */
	assert_int_equal(lookup(eng, T2, 10).tokens, 0);

	/* n = 2P exactly, cached whole: 2P - 1 cached, page 0 shared, page 1
	 * copied on write for the last token */
	uint64_t used = dev_used(eng);
	struct tlease b = seq_alloc_ok(eng, 2, T, 8, OWNER);
	assert_int_equal(b.L.len, 7);
	assert_int_equal(b.L.hit_tokens, 7);
	assert_int_equal(b.L.n_new, 1);
	assert_int_equal(b.L.npages, 2);
	assert_int_equal(b.L.last_page_len, 4);
	assert_int_equal(b.frames[0], a.frames[0]);
	assert_int_not_equal(b.frames[1], a.frames[1]); /* never writes a shared page */
	assert_int_equal(dev_used(eng), used + 1);
	/* its page 1 is the same content: committing finds it published by
	 * another sequence and keeps its copy private (kvpool.h) */
	s0 = stats_of(eng);
	write_key(eng, &b, KT, 0, 1);
	commit_ok(eng, b.L.id, 1);
	release_ok(eng, b.L.id);
	s1 = stats_of(eng);
	assert_int_equal(s1.prefix_dedupe_pages - s0.prefix_dedupe_pages, 1);
	assert_int_equal(dev_used(eng), used + 1);
	assert_int_equal(s1.prefix_pages, 2);
	expect_seq_bytes(eng, 2, 0, 8, KT, 0);
	assert_int_equal(s1.seqs, 2);
	seq_free_ok(eng, 2, OWNER);                      /* the private copy goes */
	assert_int_equal(dev_used(eng), used);
	assert_int_equal(lookup(eng, T, 10).tokens, 8);
	drop_engine();
}

/* Another salt (tenant) neither finds nor produces the same hashes. */
static void test_prefix_other_salt_misses(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint8_t salt[SHARE_SALT_BYTES], zero[SHARE_SALT_BYTES] = { 0 };
	uint8_t h0[2][32], h1[2][32];
	uint32_t T[10];

	(void)state;
	tokens_seq(T, 10, 100);
	seq_put(eng, 1, T, 10, KT, OWNER);
	assert_int_equal(lookup(eng, T, 10).tokens, 8);
	share_prefix_hashes(eng, T, 10, h0);

	memset(salt, 0xa5, sizeof(salt));
	share_set_salt(eng, salt);
	share_prefix_hashes(eng, T, 10, h1);
	assert_memory_not_equal(h0[0], h1[0], 32);
	assert_memory_not_equal(h0[1], h1[1], 32);
	assert_int_equal(lookup(eng, T, 10).tokens, 0);
	struct tlease b = seq_alloc_ok(eng, 2, T, 10, OWNER);
	assert_int_equal(b.L.len, 0);
	release_ok(eng, b.L.id);

	share_set_salt(eng, zero);
	assert_int_equal(lookup(eng, T, 10).tokens, 8);
	drop_engine();
}

/* h_i = SHA-256(h_{i-1} || salt || tokens of page i as LE uint32),
 * h_{-1} = 0^32: the same in every engine (process, restart). */
static void test_prefix_hashes_are_the_documented_sha256_chain(void **state)
{
	uint8_t salt[SHARE_SALT_BYTES], want[3][32], got[3][32], again[3][32];
	uint8_t prev[32] = { 0 };
	uint32_t T[14];

	(void)state;
	for (uint32_t i = 0; i < 14; i++)
		T[i] = 0x01020304u * (i + 1) + (i << 28); /* all four bytes vary */
	for (int i = 0; i < SHARE_SALT_BYTES; i++)
		salt[i] = (uint8_t)(3 * i + 1);
	for (int p = 0; p < 3; p++) {
		sha256_chain(prev, salt, T + p * PT, PT, want[p]);
		memcpy(prev, want[p], 32);
	}

	struct engine *eng = mk_engine(16, 0, 0);
	share_set_salt(eng, salt);
	memset(got, 0, sizeof(got));
	share_prefix_hashes(eng, T, 14, got);   /* 3 full pages, 2 tokens over */
	assert_memory_equal(got, want, sizeof(want));
	share_prefix_hashes(eng, T, 14, again);
	assert_memory_equal(again, want, sizeof(want));

	/* a fresh engine (a restart, another process) with the same salt */
	eng = mk_engine(8, 0, 0);
	share_set_salt(eng, salt);
	memset(again, 0, sizeof(again));
	share_prefix_hashes(eng, T, 12, again);
	assert_memory_equal(again, want, sizeof(want));

	/* the default salt is zero */
	eng = mk_engine(8, 0, 0);
	memset(prev, 0, sizeof(prev));
	uint8_t zsalt[32] = { 0 }, zwant[32];
	sha256_chain(prev, zsalt, T, PT, zwant);
	share_prefix_hashes(eng, T, 4, got);
	assert_memory_equal(got[0], zwant, 32);
	drop_engine();
}

/* Freed sequences leave their full pages cached and idle; a later seq_alloc
 * takes them back without allocating. */
static void test_prefix_freed_seq_pages_stay_cached_idle(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[10];

	(void)state;
	tokens_seq(T, 10, 100);
	struct tlease a = seq_put(eng, 1, T, 10, KT, OWNER);
	assert_int_equal(dev_used(eng), 3);
	seq_free_ok(eng, 1, OWNER);
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.seqs, 0);
	assert_int_equal(s.prefix_pages, 2);
	assert_int_equal(s.prefix_idle_pages, 2);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 2); /* partial page freed */
	struct share_prefix_hit h = lookup(eng, T, 10);
	assert_int_equal(h.tokens, 8);
	assert_true(frames_equal(h.frames, a.frames, 2));
	expect_frames_bytes(eng, a.frames, 0, 8, KT, 0);

	struct tlease b = seq_alloc_ok(eng, 2, T, 10, OWNER);
	assert_int_equal(b.L.len, 8);
	assert_int_equal(b.L.n_new, 2);
	assert_true(frames_equal(b.frames, a.frames, 2));
	s = stats_of(eng);
	assert_int_equal(s.prefix_idle_pages, 0);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 3);
	write_key(eng, &b, KT, 0, 2);
	commit_ok(eng, b.L.id, 2);
	release_ok(eng, b.L.id);
	expect_seq_bytes(eng, 2, 0, 10, KT, 0);

	/* the wrong owner cannot free it: "-ENOENT unknown or not owner's" */
	struct errbuf e = { .msg = "" };
	assert_int_equal(share_seq_free(eng, 99, OWNER, &e), -ENOENT);
	int wrong = share_seq_free(eng, 2, OTHER, &e);
	CHECK(eng);
	assert_int_equal(stats_of(eng).seqs, 1);
	/* a dead owner's sequences go with it */
	engine_release_owner(eng, OWNER);
	CHECK(eng);
	s = stats_of(eng);
	assert_int_equal(s.seqs, 0);
	assert_int_equal(s.prefix_idle_pages, 2);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 2);
	if (wrong != -EPERM)
		fail_msg("share_seq_free by another owner = %d (%s); share.h: -EPERM",
			 wrong, e.msg);
	drop_engine();
}

/* A chain of 3 idle pages under pressure loses page 2, then 1, then 0. */
static void test_prefix_eviction_takes_leaves_first(void **state)
{
	struct engine *eng = mk_engine(6, 0, 0);
	uint32_t T[13], C[16];
	struct kvp_stats s;

	(void)state;
	tokens_seq(T, 13, 100);
	seq_put(eng, 1, T, 13, KT, OWNER);
	seq_free_ok(eng, 1, OWNER);
	assert_int_equal(dev_used(eng), 3);
	assert_int_equal(stats_of(eng).prefix_idle_pages, 3);
	assert_int_equal(lookup(eng, T, 13).tokens, 12);

	/* chunks being filled are not evictable: each takes frames for good */
	tokens_seq(C, 16, 5000);
	chunk_reg(eng, C, 16, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, 0); /* 4 pages, 3 free */
	s = stats_of(eng);
	assert_int_equal(s.prefix_evicted_pages, 1);
	assert_int_equal(s.prefix_idle_pages, 2);
	assert_int_equal(lookup(eng, T, 13).tokens, 8);
	tokens_seq(C, 4, 6000);
	chunk_reg(eng, C, 4, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, 0);
	assert_int_equal(lookup(eng, T, 13).tokens, 4);
	tokens_seq(C, 4, 7000);
	chunk_reg(eng, C, 4, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, 0);
	assert_int_equal(lookup(eng, T, 13).tokens, 0);
	s = stats_of(eng);
	assert_int_equal(s.prefix_evicted_pages, 3);
	assert_int_equal(s.prefix_pages, 0);
	assert_int_equal(s.prefix_idle_pages, 0);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 6);

	/* nothing left to evict: -ENOMEM, nothing changed */
	struct kvp_stats before = stats_of(eng);
	tokens_seq(C, 4, 8000);
	chunk_reg(eng, C, 4, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, -ENOMEM);
	struct kvp_stats after = stats_of(eng);
	assert_gauges_same(&before, &after);
	struct errbuf e = { .msg = "" };
	struct engine_lease L;
	assert_int_equal(share_seq_alloc(eng, 3, T, 4, OWNER, &L, &e), -ENOMEM);
	CHECK(eng);
	after = stats_of(eng);
	assert_gauges_same(&before, &after);
	drop_engine();
}

/* Two sequences allocated before either commits compute the same pages; the
 * second commit finds them published and gives its copies back. */
static void test_prefix_concurrent_allocs_dedupe_on_commit(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[8];

	(void)state;
	tokens_seq(T, 8, 100);
	struct tlease a = seq_alloc_ok(eng, 1, T, 8, OWNER);
	struct tlease b = seq_alloc_ok(eng, 2, T, 8, OTHER);
	assert_int_equal(a.L.len, 0);
	assert_int_equal(b.L.len, 0);
	assert_int_equal(dev_used(eng), 4);
	write_key(eng, &a, KT, 0, 8);
	write_key(eng, &b, KT, 0, 8);
	commit_ok(eng, a.L.id, 8);
	assert_int_equal(stats_of(eng).prefix_pages, 2);
	struct kvp_stats s0 = stats_of(eng);
	commit_ok(eng, b.L.id, 8);
	struct kvp_stats s1 = stats_of(eng);
	assert_int_equal(s1.prefix_dedupe_pages - s0.prefix_dedupe_pages, 2);
	assert_int_equal(s1.prefix_pages, 2);
	/* the second copy stays private (its page table was handed out) */
	assert_int_equal(s1.tier[KVP_TIER_DEVICE].frames_used, 4);
	struct share_prefix_hit h = lookup(eng, T, 8);
	assert_int_equal(h.frames[0], a.frames[0]);
	release_ok(eng, a.L.id);
	release_ok(eng, b.L.id);
	expect_seq_bytes(eng, 1, 0, 8, KT, 0);
	expect_seq_bytes(eng, 2, 0, 8, KT, 0);
	seq_free_ok(eng, 1, OWNER);
	expect_seq_bytes(eng, 2, 0, 8, KT, 0);
	/* seq 2 holds the published pages too: its later pages chain on them */
	assert_int_equal(stats_of(eng).prefix_idle_pages, 0);
	assert_int_equal(dev_used(eng), 4);
	/* a later allocation shares the published pages, not the copies */
	struct tlease c = seq_alloc_ok(eng, 3, T, 8, OWNER);
	assert_int_equal(c.L.len, 7);        /* cached whole: page 1 copied */
	assert_int_equal(c.frames[0], a.frames[0]);
	assert_int_equal(dev_used(eng), 5);
	release_ok(eng, c.L.id);
	seq_free_ok(eng, 3, OWNER);
	seq_free_ok(eng, 2, OTHER);
	assert_int_equal(stats_of(eng).prefix_idle_pages, 2);
	assert_int_equal(dev_used(eng), 2);
	drop_engine();
}

/* A write lease released before its commit gives its slots back; the
 * sequence stays; extend with tokens keeps publishing. */
static void test_seq_release_rolls_back_extend_publishes(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[12];
	struct errbuf e = { .msg = "" };
	struct engine_lease L;

	(void)state;
	tokens_seq(T, 12, 100);
	struct tlease a = seq_alloc_ok(eng, 1, T, 6, OWNER);
	assert_int_equal(dev_used(eng), 2);
	write_key(eng, &a, KT, 0, 6);
	/* -EBUSY while the write lease has not committed */
	assert_int_equal(share_seq_extend(eng, 1, 2, T + 6, OWNER, &L, &e), -EBUSY);
	CHECK(eng);
	assert_int_equal(share_seq_alloc(eng, 1, T, 6, OWNER, &L, &e), -EEXIST);
	CHECK(eng);
	commit_ok(eng, a.L.id, 3);                       /* 3 of 6 */
	release_ok(eng, a.L.id);
	assert_int_equal(dev_used(eng), 1);
	assert_int_equal(stats_of(eng).prefix_pages, 0);
	expect_seq_bytes(eng, 1, 0, 3, KT, 0);

	struct tlease x = seq_extend_ok(eng, 1, 9, T + 3, OWNER);
	assert_int_equal(x.L.len, 3);
	assert_int_equal(x.L.n_new, 9);
	assert_int_equal(x.L.npages, 3);
	assert_int_equal(x.frames[0], a.frames[0]);      /* its own page, kept */
	write_key(eng, &x, KT, 0, 9);
	commit_ok(eng, x.L.id, 9);
	release_ok(eng, x.L.id);
	expect_seq_bytes(eng, 1, 0, 12, KT, 0);
	assert_int_equal(stats_of(eng).prefix_pages, 3);
	uint32_t probe[13];
	memcpy(probe, T, sizeof(T));
	probe[12] = 1;
	assert_int_equal(lookup(eng, probe, 13).tokens, 12);
	drop_engine();
}

/* ------------------------------------------------------------ chunks */

static void test_chunk_register_fill_seal_then_register_again_is_a_hit(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t C[10], D[5];
	struct kvp_chunk_id id, id2;
	struct kvp_chunk_info ci;
	struct share_chunk_reg r;
	struct errbuf e = { .msg = "" };

	(void)state;
	tokens_seq(C, 10, 300);
	r = chunk_reg(eng, C, 10, KVP_CHUNK_CONTEXT, "{\"src\": \"a\", \"lang\": \"en\"}",
		      OWNER, 5 * SEC, 0);
	assert_true(r.created);
	assert_int_equal(r.state, KVP_CHUNK_FILLING);
	assert_int_equal(r.lease.n_new, 10);
	assert_int_equal(r.lease.npages, 3);
	struct tlease fill;
	tlease_copy(&fill, &r.lease);
	id = r.id;
	ci = chunk_info_ok(eng, &id);
	assert_memory_equal(ci.id.b, r.name.b, 32);  /* the entry's name's row */
	assert_memory_equal(ci.root.b, id.b, 32);
	assert_memory_not_equal(r.name.b, id.b, 32);
	assert_int_equal(ci.entries, 1);
	assert_int_equal(r.start, 0);
	assert_int_equal(r.lease.start, 0);
	assert_int_equal(ci.state, KVP_CHUNK_FILLING);
	assert_int_equal(ci.type, KVP_CHUNK_CONTEXT);
	assert_int_equal(ci.tokens, 10);
	assert_int_equal(ci.pages, 3);
	assert_int_equal(ci.bytes, 3 * engine_layout(eng)->page_bytes);
	assert_int_equal(ci.filler, OWNER);
	assert_int_equal(ci.created_ns, 5 * SEC);
	assert_string_equal(ci.meta, "{\"lang\":\"en\",\"src\":\"a\"}"); /* canonical */
	assert_int_equal(dev_used(eng), 3);

	/* only the filler seals */
	assert_int_equal(share_chunk_seal(eng, fill.L.id, OTHER, &e), -EPERM);
	CHECK(eng);
	write_key(eng, &fill, 300, 0, 10);
	assert_int_equal(share_chunk_seal(eng, fill.L.id, OWNER, &e), 0);
	CHECK(eng);
	ci = chunk_info_ok(eng, &id);
	assert_int_equal(ci.state, KVP_CHUNK_READY);
	assert_int_equal(ci.filler, 0);
	assert_int_equal(ci.holders, 0);
	expect_chunk_bytes(eng, &id, 300, 10);
	int rc = share_chunk_seal(eng, fill.L.id, OWNER, &e);
	assert_true(rc == -EALREADY || rc == -ENOENT);
	CHECK(eng);

	struct kvp_stats s0 = stats_of(eng);
	r = chunk_reg(eng, C, 10, KVP_CHUNK_CONTEXT, NULL, OTHER, 9 * SEC, 0);
	assert_false(r.created);
	assert_memory_equal(r.id.b, id.b, 32);
	assert_int_equal(r.state, KVP_CHUNK_READY);
	assert_int_equal(r.lease.id, 0);
	struct kvp_stats s1 = stats_of(eng);
	assert_int_equal(s1.tier[KVP_TIER_DEVICE].frames_used, 3);
	assert_int_equal(s1.chunks, 1);
	assert_int_equal(s1.chunk_pages, 3);
	assert_int_equal(s1.chunk_bytes, 3 * engine_layout(eng)->page_bytes);
	assert_int_equal(s1.chunk_lookups - s0.chunk_lookups, 1);
	assert_int_equal(s1.chunk_hits - s0.chunk_hits, 1);
	assert_int_equal(s1.chunk_last_access_ns, 9 * SEC);
	ci = chunk_info_ok(eng, &id);
	assert_int_equal(ci.hits, 1);
	assert_int_equal(ci.last_access_ns, 9 * SEC);

	/* the commit path seals too */
	tokens_seq(D, 5, 400);
	chunk_put(eng, D, 5, KVP_CHUNK_QUERY, NULL, OWNER, 10 * SEC, 400, true, &id2);
	assert_memory_not_equal(id.b, id2.b, 32);
	ci = chunk_info_ok(eng, &id2);
	assert_int_equal(ci.state, KVP_CHUNK_READY);
	assert_int_equal(ci.type, KVP_CHUNK_QUERY);
	expect_chunk_bytes(eng, &id2, 400, 5);
	assert_int_equal(stats_of(eng).chunks, 2);
	drop_engine();
}

static void test_chunk_register_rejects_bad_arguments(void **state)
{
	struct engine *eng = mk_engine(4, 0, 0);
	uint32_t C[20];
	struct kvp_stats after;

	(void)state;
	tokens_seq(C, 20, 1);
	chunk_reg(eng, C, 0, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, -EINVAL);
	chunk_reg(eng, C, 4, 0, NULL, OWNER, 1, -EINVAL);
	chunk_reg(eng, C, 4, 4, NULL, OWNER, 1, -EINVAL);
	chunk_reg(eng, C, 4, KVP_CHUNK_CONTEXT, "novalue", OWNER, 1, -EINVAL);
	chunk_reg(eng, C, 4, KVP_CHUNK_CONTEXT, "a=b=c", OWNER, 1, -EINVAL);
	char big[KVP_CHUNK_META_MAX + 8];
	memset(big, 'x', sizeof(big) - 1);
	big[0] = 'k';
	big[1] = '=';
	big[sizeof(big) - 1] = '\0';
	chunk_reg(eng, C, 4, KVP_CHUNK_CONTEXT, big, OWNER, 1, -EINVAL);
	chunk_reg(eng, C, 20, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, -E2BIG); /* 5 pages > 4 */
	after = stats_of(eng);
	assert_int_equal(after.chunks, 0);
	assert_int_equal(after.tier[KVP_TIER_DEVICE].frames_used, 0);
	drop_engine();
}

static void test_chunk_acquire_filling_is_eagain_unknown_is_enoent_named(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t C[6];
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct kvp_chunk_id unknown;
	char hex[65];

	(void)state;
	tokens_seq(C, 6, 300);
	struct share_chunk_reg r = chunk_reg(eng, C, 6, KVP_CHUNK_SYSTEM, NULL, OWNER, 1, 0);
	struct tlease fill;
	tlease_copy(&fill, &r.lease);
	struct kvp_stats before = stats_of(eng);
	assert_int_equal(share_chunk_acquire(eng, &r.id, OTHER, 2, &L, &e), -EAGAIN);
	CHECK(eng);
	assert_int_equal(stats_of(eng).leases, before.leases);
	/* registering it again while filling: a hit, nothing to fill */
	struct share_chunk_reg r2 = chunk_reg(eng, C, 6, KVP_CHUNK_SYSTEM, NULL, OTHER, 2, 0);
	assert_false(r2.created);
	assert_int_equal(r2.state, KVP_CHUNK_FILLING);
	assert_int_equal(dev_used(eng), 2);

	memset(&unknown, 0x5c, sizeof(unknown));
	id_hex(&unknown, hex);
	e.msg[0] = '\0';
	assert_int_equal(share_chunk_acquire(eng, &unknown, OTHER, 3, &L, &e), -ENOENT);
	hex[16] = '\0';           /* the message names the id (at least its start) */
	assert_msg_has(&e, hex);
	struct kvp_chunk_info ci;
	assert_int_equal(share_chunk_info(eng, &unknown, &ci, &e), -ENOENT);
	assert_int_equal(share_chunk_delete(eng, &unknown, &e), -ENOENT);
	CHECK(eng);

	write_key(eng, &fill, 300, 0, 6);
	assert_int_equal(share_chunk_seal(eng, fill.L.id, OWNER, &e), 0);
	struct tlease a = chunk_acquire_ok(eng, &r.id, OTHER, 4);
	assert_int_equal(a.L.len, 6);
	assert_int_equal(a.L.n_new, 0);
	assert_int_equal(a.L.npages, 2);
	assert_int_equal(a.L.last_page_len, 2);
	assert_true(frames_equal(a.frames, fill.frames, 2));
	expect_chunk_frames(eng, a.frames, 300, 6);
	assert_int_equal(chunk_info_ok(eng, &r.id).holders, 1);
	/* a read lease does not commit */
	assert_int_equal(engine_commit(eng, a.L.id, 0, &e), -EINVAL);
	CHECK(eng);
	release_ok(eng, a.L.id);
	assert_int_equal(chunk_info_ok(eng, &r.id).holders, 0);
	assert_int_equal(engine_release(eng, a.L.id, &e), -ENOENT);
	drop_engine();
}

/* Deleted while leased: gone from the registry, bytes intact until the
 * last holder releases, then the frames come back. */
static void test_chunk_deleted_while_leased_stays_readable_until_release(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e = { .msg = "" };
	struct kvp_chunk_info ci;
	uint8_t buf[6 * 256];

	(void)state;
	uint64_t free0 = dev_free(eng);
	struct kvp_chunk_id id = chunk_make(eng, 300, 6, KVP_CHUNK_CONTEXT, NULL, 1, NULL);
	struct tlease a = chunk_acquire_ok(eng, &id, OTHER, 2);
	assert_true(share_chunk_delete(eng, &id, &e) >= 0);
	CHECK(eng);
	assert_int_equal(share_chunk_info(eng, &id, &ci, &e), -ENOENT);
	assert_int_equal(stats_of(eng).chunks, 0);
	assert_int_equal(dev_free(eng), free0 - 2);
	expect_chunk_frames(eng, a.frames, 300, 6);
	/* (read_tokens by id may or may not see a deleted chunk; if it does,
	 * the bytes must be right) */
	if (share_chunk_read_tokens(eng, &id, 0, 6, buf, &e) == 0) {
		uint8_t want[6 * 256];
		pattern(engine_layout(eng), 300, 0, 6, want);
		assert_memory_equal(buf, want, sizeof(want));
	}
	/* the same content registers anew meanwhile: not the dying copy */
	uint32_t C[6];
	tokens_seq(C, 6, 300);
	struct share_chunk_reg r = chunk_reg(eng, C, 6, KVP_CHUNK_CONTEXT, NULL, OWNER, 3, 0);
	assert_true(r.created);
	struct tlease fill;
	tlease_copy(&fill, &r.lease);
	assert_false(frames_equal(fill.frames, a.frames, 1));
	assert_int_equal(dev_free(eng), free0 - 4);
	write_key(eng, &fill, 301, 0, 6);    /* other bytes: must not reach a's */
	expect_chunk_frames(eng, a.frames, 300, 6);

	release_ok(eng, a.L.id);
	assert_int_equal(dev_free(eng), free0 - 2);
	assert_int_equal(share_chunk_seal(eng, fill.L.id, OWNER, &e), 0);
	assert_true(share_chunk_delete(eng, &r.id, &e) >= 0);
	CHECK(eng);
	assert_int_equal(dev_free(eng), free0);
	assert_int_equal(share_chunk_delete(eng, &r.id, &e), -ENOENT);
	drop_engine();
}

static void test_chunk_filler_giving_up_or_dying_deletes_it(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t C[6];
	struct errbuf e = { .msg = "" };
	struct share_chunk_reg r;

	(void)state;
	tokens_seq(C, 6, 300);
	uint64_t free0 = dev_free(eng);
	r = chunk_reg(eng, C, 6, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, 0);
	release_ok(eng, r.lease.id);               /* released before the seal */
	assert_false(chunk_exists(eng, &r.id));
	assert_int_equal(dev_free(eng), free0);
	assert_int_equal(stats_of(eng).chunks, 0);
	assert_int_equal(share_chunk_seal(eng, r.lease.id, OWNER, &e), -ENOENT);

	r = chunk_reg(eng, C, 6, KVP_CHUNK_CONTEXT, NULL, OWNER, 2, 0);
	assert_true(r.created);
	assert_true(engine_release_owner(eng, OWNER) >= 1);  /* the filler died */
	CHECK(eng);
	assert_false(chunk_exists(eng, &r.id));
	assert_int_equal(dev_free(eng), free0);

	/* a sealed chunk outlives its filler */
	struct kvp_chunk_id id = chunk_make(eng, 300, 6, KVP_CHUNK_CONTEXT, NULL, 3, NULL);
	engine_release_owner(eng, OWNER);
	CHECK(eng);
	assert_true(chunk_exists(eng, &id));
	drop_engine();
}

static void test_chunk_list_by_type_and_metadata_with_paging(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct kvp_chunk_id ids[6];
	struct kvp_chunk_info rows[8];
	struct errbuf e = { .msg = "" };
	bool more = true;
	int n;

	(void)state;
	ids[0] = chunk_make(eng, 100, 4, KVP_CHUNK_SYSTEM, "{\"name\": \"py\"}", 1, NULL);
	ids[1] = chunk_make(eng, 200, 4, KVP_CHUNK_CONTEXT, "{\"src\": \"docs\", \"sec\": \"intro\"}", 1, NULL);
	ids[2] = chunk_make(eng, 300, 4, KVP_CHUNK_CONTEXT, "{\"src\": \"docs\", \"sec\": \"api\"}", 1, NULL);
	ids[3] = chunk_make(eng, 400, 4, KVP_CHUNK_CONTEXT, "{\"src\": \"web\"}", 1, NULL);
	ids[4] = chunk_make(eng, 500, 4, KVP_CHUNK_QUERY, NULL, 1, NULL);
	ids[5] = chunk_make(eng, 600, 4, KVP_CHUNK_CONTEXT, "{\"sec\": \"api\", \"src\": \"docs\", \"x\": 1}", 1, NULL);

	n = share_chunk_list(eng, 0, NULL, NULL, rows, 8, &more, &e);
	assert_int_equal(n, 6);
	assert_false(more);
	for (int i = 1; i < n; i++)
		assert_true(memcmp(rows[i - 1].id.b, rows[i].id.b, 32) < 0); /* ascending */

	n = share_chunk_list(eng, KVP_CHUNK_CONTEXT, NULL, NULL, rows, 8, &more, &e);
	assert_int_equal(n, 4);
	n = share_chunk_list(eng, KVP_CHUNK_CONTEXT, "", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 4);
	n = share_chunk_list(eng, KVP_CHUNK_SYSTEM, NULL, NULL, rows, 8, &more, &e);
	assert_int_equal(n, 1);
	assert_memory_equal(rows[0].id.b, ids[0].b, 32);
	assert_string_equal(rows[0].meta, "{\"name\":\"py\"}");

	n = share_chunk_list(eng, 0, "{\"src\": \"docs\"}", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 3);
	n = share_chunk_list(eng, 0, "{\"sec\": \"api\", \"src\": \"docs\"}", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 2);
	for (int i = 0; i < n; i++)
		assert_true(!memcmp(rows[i].id.b, ids[2].b, 32) ||
			    !memcmp(rows[i].id.b, ids[5].b, 32));
	n = share_chunk_list(eng, KVP_CHUNK_QUERY, "{\"src\": \"docs\"}", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 0);
	n = share_chunk_list(eng, 0, "{\"src\": \"doc\"}", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 0);           /* values match whole, not as prefixes */
	/* non-string values compare as JSON: 1 is not "1" nor 1.5 */
	n = share_chunk_list(eng, 0, "{\"x\": 1}", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 1);
	assert_memory_equal(rows[0].id.b, ids[5].b, 32);
	n = share_chunk_list(eng, 0, "{\"x\": \"1\"}", NULL, rows, 8, &more, &e);
	assert_int_equal(n, 0);
	n = share_chunk_list(eng, 0, "{\"x\": 1, \"src\": \"docs\"}", NULL, rows, 8,
			     &more, &e);
	assert_int_equal(n, 1);
	/* a bad filter names what is wrong */
	assert_int_equal(share_chunk_list(eng, 0, "{\"x\": ", NULL, rows, 8, &more, &e),
			 -EINVAL);
	assert_non_null(strstr(e.msg, "not valid JSON"));
	assert_int_equal(share_chunk_list(eng, 0, "[1]", NULL, rows, 8, &more, &e),
			 -EINVAL);
	assert_non_null(strstr(e.msg, "an array, not a JSON object"));

	/* paging: 2 at a time, each page after the last id of the previous */
	struct kvp_chunk_info all[6];
	int got = 0;
	const struct kvp_chunk_id *cursor = NULL;
	struct kvp_chunk_id cur;
	for (int page = 0; page < 4; page++) {
		n = share_chunk_list(eng, 0, NULL, cursor, rows, 2, &more, &e);
		assert_true(n >= 0 && n <= 2);
		memcpy(all + got, rows, (size_t)n * sizeof(rows[0]));
		got += n;
		if (!more)
			break;
		assert_int_equal(n, 2);
		cur = rows[n - 1].id;
		cursor = &cur;
	}
	assert_int_equal(got, 6);
	assert_false(more);
	for (int i = 1; i < got; i++)
		assert_true(memcmp(all[i - 1].id.b, all[i].id.b, 32) < 0);
	drop_engine();
}

static void test_chunk_clear_by_type(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct kvp_chunk_id a, b, c;

	(void)state;
	a = chunk_make(eng, 100, 4, KVP_CHUNK_SYSTEM, NULL, 1, NULL);
	b = chunk_make(eng, 200, 4, KVP_CHUNK_CONTEXT, NULL, 1, NULL);
	c = chunk_make(eng, 300, 4, KVP_CHUNK_CONTEXT, NULL, 1, NULL);
	struct tlease held = chunk_acquire_ok(eng, &c, OTHER, 2);
	assert_int_equal(share_chunk_clear(eng, KVP_CHUNK_CONTEXT), 2);
	CHECK(eng);
	assert_true(chunk_exists(eng, &a));
	assert_false(chunk_exists(eng, &b));
	assert_false(chunk_exists(eng, &c));
	assert_int_equal(dev_used(eng), 2);     /* a, and c while held */
	expect_chunk_frames(eng, held.frames, 300, 4);
	release_ok(eng, held.L.id);
	assert_int_equal(dev_used(eng), 1);
	assert_int_equal(share_chunk_clear(eng, KVP_CHUNK_CONTEXT), 0);
	assert_int_equal(share_chunk_clear(eng, 0), 1);
	CHECK(eng);
	assert_int_equal(dev_used(eng), 0);
	assert_int_equal(stats_of(eng).chunks, 0);
	drop_engine();
}

static void test_chunk_evict_unused_by_age_spares_held_and_recent(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct kvp_chunk_id a, b, c, d;

	(void)state;
	a = chunk_make(eng, 100, 4, KVP_CHUNK_CONTEXT, NULL, 10 * SEC, NULL);
	b = chunk_make(eng, 200, 4, KVP_CHUNK_CONTEXT, NULL, 20 * SEC, NULL);
	c = chunk_make(eng, 300, 4, KVP_CHUNK_CONTEXT, NULL, 100 * SEC, NULL);
	d = chunk_make(eng, 400, 4, KVP_CHUNK_CONTEXT, NULL, 10 * SEC, NULL);
	struct tlease held = chunk_acquire_ok(eng, &d, OTHER, 15 * SEC);
	/* a register hit is an access: b is recent again */
	uint32_t B[4];
	tokens_seq(B, 4, 200);
	assert_false(chunk_reg(eng, B, 4, KVP_CHUNK_CONTEXT, NULL, OTHER, 95 * SEC, 0).created);

	assert_int_equal(share_chunk_evict_unused(eng, 50 * SEC, 120 * SEC), 1);
	CHECK(eng);
	assert_false(chunk_exists(eng, &a));
	assert_true(chunk_exists(eng, &b));
	assert_true(chunk_exists(eng, &c));
	assert_true(chunk_exists(eng, &d));            /* old but held */
	assert_int_equal(stats_of(eng).chunk_evicted, 1);
	release_ok(eng, held.L.id);
	assert_int_equal(share_chunk_evict_unused(eng, 50 * SEC, 120 * SEC), 1);
	assert_false(chunk_exists(eng, &d));
	assert_int_equal(share_chunk_evict_unused(eng, 0, 1000 * SEC), 2);
	CHECK(eng);
	assert_int_equal(dev_used(eng), 0);
	assert_int_equal(stats_of(eng).chunk_evicted, 4);
	drop_engine();
}

/* A register that needs frames evicts the least recently used ready chunk
 * nobody holds; held and filling chunks stay; with everything held it fails
 * and changes nothing. */
static void test_chunk_lru_eviction_under_pressure_spares_held(void **state)
{
	struct engine *eng = mk_engine(8, 0, 0);
	struct kvp_chunk_id a, b, c, d;
	uint32_t T[16];

	(void)state;
	a = chunk_make(eng, 100, 8, KVP_CHUNK_CONTEXT, NULL, 1 * SEC, NULL);
	b = chunk_make(eng, 200, 8, KVP_CHUNK_CONTEXT, NULL, 2 * SEC, NULL);
	c = chunk_make(eng, 300, 8, KVP_CHUNK_CONTEXT, NULL, 3 * SEC, NULL);
	struct tlease hc = chunk_acquire_ok(eng, &c, OTHER, 4 * SEC);
	assert_int_equal(dev_used(eng), 6);
	/* 4 pages, 2 free: the oldest (a) goes, b stays */
	d = chunk_make(eng, 400, 16, KVP_CHUNK_CONTEXT, NULL, 5 * SEC, NULL);
	assert_false(chunk_exists(eng, &a));
	assert_true(chunk_exists(eng, &b));
	assert_true(chunk_exists(eng, &c));
	assert_int_equal(stats_of(eng).chunk_evicted, 1);
	struct tlease hd = chunk_acquire_ok(eng, &d, OTHER, 6 * SEC);
	struct tlease hb = chunk_acquire_ok(eng, &b, OTHER, 6 * SEC);
	assert_int_equal(dev_used(eng), 8);

	struct kvp_stats before = stats_of(eng);
	tokens_seq(T, 4, 900);
	chunk_reg(eng, T, 4, KVP_CHUNK_CONTEXT, NULL, OWNER, 7 * SEC, -ENOMEM);
	struct kvp_stats after = stats_of(eng);
	assert_gauges_same(&before, &after);
	assert_true(chunk_exists(eng, &b));
	expect_chunk_frames(eng, hb.frames, 200, 8);
	expect_chunk_frames(eng, hc.frames, 300, 8);
	expect_chunk_frames(eng, hd.frames, 400, 16);

	release_ok(eng, hb.L.id);
	chunk_make(eng, 900, 4, KVP_CHUNK_CONTEXT, NULL, 8 * SEC, NULL);
	assert_false(chunk_exists(eng, &b));
	assert_true(chunk_exists(eng, &c));
	assert_true(chunk_exists(eng, &d));
	release_ok(eng, hc.L.id);
	release_ok(eng, hd.L.id);
	drop_engine();
}

/* ------------------------------------------------------------ virtual sequences */

static struct kvp_seq_src src_user(uint64_t user, uint64_t tokens)
{
	struct kvp_seq_src s;

	memset(&s, 0, sizeof(s));
	s.kind = KVP_SRC_USER;
	s.id = user;
	s.tokens = tokens;
	return s;
}

static struct kvp_seq_src src_chunk(const struct kvp_chunk_id *id)
{
	struct kvp_seq_src s;

	memset(&s, 0, sizeof(s));
	s.kind = KVP_SRC_CHUNK;
	s.chunk = *id;
	return s;
}

static struct kvp_seq_src src_seq(uint64_t seq)
{
	struct kvp_seq_src s;

	memset(&s, 0, sizeof(s));
	s.kind = KVP_SRC_SEQ;
	s.id = seq;
	return s;
}

/* history prefix (8 of 10 tokens) + chunk (8) + 3 new: borrowed pages plus
 * one new; the history is pinned and the chunk held until seq_free. */
static void test_vseq_borrows_history_and_chunk_pages(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct tlease cf;

	(void)state;
	put(eng, 7, 0, 10);
	struct engine_lease H = prep_ok(eng, 7, 10, 0, OWNER);  /* to see its frames */
	uint32_t hframes[3];
	memcpy(hframes, H.frames, sizeof(hframes));
	release_ok(eng, H.id);
	struct kvp_chunk_id c = chunk_make(eng, 300, 8, KVP_CHUNK_CONTEXT, NULL, 1, &cf);
	uint64_t used = dev_used(eng);

	struct kvp_seq_src src[2] = { src_user(7, 8), src_chunk(&c) };
	struct tlease v = seq_create_ok(eng, 50, src, 2, 3, OTHER);
	assert_int_equal(v.L.len, 16);
	assert_int_equal(v.L.n_new, 3);
	assert_int_equal(v.L.npages, 5);
	assert_int_equal(v.L.last_page_len, 3);
	assert_int_equal(v.frames[0], hframes[0]);
	assert_int_equal(v.frames[1], hframes[1]);
	assert_int_equal(v.frames[2], cf.frames[0]);
	assert_int_equal(v.frames[3], cf.frames[1]);
	assert_int_equal(dev_used(eng), used + 1);        /* only the new page */
	assert_true(info_of(eng, 7).leases >= 1);         /* pinned */
	assert_int_equal(chunk_info_ok(eng, &c).holders, 1);
	write_key(eng, &v, 0xabc, 0, 3);
	commit_ok(eng, v.L.id, 3);
	release_ok(eng, v.L.id);
	assert_true(info_of(eng, 7).leases >= 1);         /* the sequence still pins */
	expect_seq_bytes(eng, 50, 0, 8, 7, 0);
	expect_seq_bytes(eng, 50, 8, 8, 300, 0);
	expect_seq_bytes(eng, 50, 16, 3, 0xabc, 16);

	/* pinned: the history cannot be evicted */
	struct errbuf e = { .msg = "" };
	assert_int_equal(engine_evict(eng, 7, KVP_SEL_ALL, &e), -EBUSY);
	seq_free_ok(eng, 50, OTHER);
	assert_int_equal(info_of(eng, 7).leases, 0);
	assert_int_equal(chunk_info_ok(eng, &c).holders, 0);
	assert_int_equal(dev_used(eng), used);
	verify(eng, 7, 0, 10);
	expect_chunk_bytes(eng, &c, 300, 8);

	/* USER tokens 0: all of them (10: the last page partial, n_new 0 ok) */
	struct kvp_seq_src all = src_user(7, 0);
	struct tlease w = seq_create_ok(eng, 51, &all, 1, 0, OTHER);
	assert_int_equal(w.L.len, 10);
	assert_int_equal(w.L.npages, 3);
	release_if(eng, w.L.id);
	expect_seq_bytes(eng, 51, 0, 10, 7, 0);
	engine_release_owner(eng, OTHER);                 /* frees seq 51 */
	CHECK(eng);
	assert_int_equal(info_of(eng, 7).leases, 0);
	assert_int_equal(stats_of(eng).seqs, 0);
	drop_engine();
}

static void test_vseq_rejects_bad_sources(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct kvp_chunk_id unknown;

	(void)state;
	put(eng, 7, 0, 10);
	struct kvp_chunk_id c = chunk_make(eng, 300, 8, KVP_CHUNK_CONTEXT, NULL, 1, NULL);
	struct kvp_stats before = stats_of(eng);

	/* a source other than the last ends mid-page: named */
	struct kvp_seq_src mid[2] = { src_user(7, 10), src_chunk(&c) };
	e.msg[0] = '\0';
	assert_int_equal(share_seq_create(eng, 1, mid, 2, 0, OWNER, &L, &e), -EINVAL);
	assert_msg_has(&e, "source 0");
	CHECK(eng);
	/* ... the chunk in the middle, 6 tokens */
	struct kvp_chunk_id c6 = chunk_make(eng, 400, 6, KVP_CHUNK_CONTEXT, NULL, 1, NULL);
	before = stats_of(eng);
	struct kvp_seq_src mid2[3] = { src_user(7, 8), src_chunk(&c6), src_chunk(&c) };
	e.msg[0] = '\0';
	assert_int_equal(share_seq_create(eng, 1, mid2, 3, 2, OWNER, &L, &e), -EINVAL);
	char h6[65];
	id_hex(&c6, h6);
	h6[16] = '\0';
	if (!strstr(e.msg, h6) && !strstr(e.msg, "source 1"))
		fail_msg("message \"%s\" names neither source 1 nor chunk %s", e.msg, h6);
	CHECK(eng);

	memset(&unknown, 0x33, sizeof(unknown));
	struct kvp_seq_src bad[1] = { src_chunk(&unknown) };
	assert_int_equal(share_seq_create(eng, 1, bad, 1, 2, OWNER, &L, &e), -ENOENT);
	struct kvp_seq_src nouser[1] = { src_user(99, 0) };
	assert_int_equal(share_seq_create(eng, 1, nouser, 1, 2, OWNER, &L, &e), -ENOENT);
	assert_msg_has(&e, "99");
	struct kvp_seq_src noseq[1] = { src_seq(12345) };
	assert_int_equal(share_seq_create(eng, 1, noseq, 1, 2, OWNER, &L, &e), -ENOENT);
	struct kvp_seq_src more[1] = { src_user(7, 11) };
	int more_rc = share_seq_create(eng, 1, more, 1, 2, OWNER, &L, &e);
	char more_msg[KVP_ERRLEN];
	snprintf(more_msg, sizeof(more_msg), "%s", e.msg);
	assert_int_equal(share_seq_create(eng, 1, NULL, 0, 0, OWNER, &L, &e), -EINVAL);
	struct kvp_seq_src kind[1] = { src_user(7, 4) };
	kind[0].kind = 9;
	assert_int_equal(share_seq_create(eng, 1, kind, 1, 2, OWNER, &L, &e), -EINVAL);
	CHECK(eng);
	struct kvp_stats after = stats_of(eng);
	assert_gauges_same(&before, &after);
	assert_int_equal(info_of(eng, 7).leases, 0);

	/* a chunk being filled is not ready */
	uint32_t F[4];
	tokens_seq(F, 4, 777);
	struct share_chunk_reg r = chunk_reg(eng, F, 4, KVP_CHUNK_CONTEXT, NULL, OWNER, 1, 0);
	struct kvp_seq_src filling[1] = { src_chunk(&r.id) };
	assert_int_equal(share_seq_create(eng, 1, filling, 1, 2, OWNER, &L, &e), -EAGAIN);
	CHECK(eng);

	/* only new tokens: a sequence of its own pages */
	struct tlease n = seq_create_ok(eng, 1, NULL, 0, 5, OWNER);
	assert_int_equal(n.L.len, 0);
	assert_int_equal(n.L.npages, 2);
	assert_int_equal(share_seq_create(eng, 1, NULL, 0, 5, OWNER, &L, &e), -EEXIST);
	struct kvp_seq_src big[1] = { src_user(7, 8) };
	assert_int_equal(share_seq_create(eng, 2, big, 1, 100, OWNER, &L, &e), -E2BIG);
	CHECK(eng);
	if (more_rc != -EINVAL)
		fail_msg("a USER source asking for 11 of 10 committed tokens = %d (%s); "
			 "share.h: -EINVAL", more_rc, more_msg);
	drop_engine();
}

/* The last source ends mid-page and n_new > 0: the vseq's last page is a
 * copy; writes on either side never reach the other. */
static void test_vseq_copy_on_write_keeps_both_sides_bytes(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);

	(void)state;
	put(eng, 7, 0, 10);
	struct engine_lease H = prep_ok(eng, 7, 10, 0, OWNER);
	uint32_t hframes[3];
	memcpy(hframes, H.frames, sizeof(hframes));
	release_ok(eng, H.id);
	uint64_t cow0 = stats_of(eng).cow_pages, used = dev_used(eng);

	struct kvp_seq_src src[1] = { src_user(7, 0) };
	struct tlease v = seq_create_ok(eng, 50, src, 1, 3, OTHER);
	assert_int_equal(v.L.len, 10);
	assert_int_equal(v.L.npages, 4);
	assert_int_equal(v.frames[0], hframes[0]);
	assert_int_equal(v.frames[1], hframes[1]);
	assert_int_not_equal(v.frames[2], hframes[2]);   /* copied */
	assert_int_equal(stats_of(eng).cow_pages - cow0, 1);
	assert_int_equal(dev_used(eng), used + 2);
	expect_frames_bytes(eng, v.frames, 8, 2, 7, 8);  /* the copy's tokens */
	write_key(eng, &v, 0xabc, 0, 3);                  /* positions 10..12 */
	commit_ok(eng, v.L.id, 3);
	release_ok(eng, v.L.id);
	verify(eng, 7, 0, 10);                            /* the source unchanged */

	/* the history appends into its own partial page */
	put(eng, 7, 10, 4);
	verify(eng, 7, 0, 14);
	expect_seq_bytes(eng, 50, 0, 10, 7, 0);
	expect_seq_bytes(eng, 50, 10, 3, 0xabc, 10);

	/* seq source ending mid-page: the same */
	uint32_t T[6];
	tokens_seq(T, 6, 100);
	struct tlease a = seq_put(eng, 60, T, 6, KT, OWNER);
	struct kvp_seq_src s2[1] = { src_seq(60) };
	struct tlease b = seq_create_ok(eng, 61, s2, 1, 2, OTHER);
	assert_int_equal(b.frames[0], a.frames[0]);
	assert_int_not_equal(b.frames[1], a.frames[1]);
	write_key(eng, &b, 0xbbb, 0, 2);
	commit_ok(eng, b.L.id, 2);
	release_ok(eng, b.L.id);
	struct tlease x = seq_extend_ok(eng, 60, 2, T, OWNER);
	write_key(eng, &x, KT, 0, 2);
	commit_ok(eng, x.L.id, 2);
	release_ok(eng, x.L.id);
	expect_seq_bytes(eng, 60, 0, 8, KT, 0);
	expect_seq_bytes(eng, 61, 0, 6, KT, 0);
	expect_seq_bytes(eng, 61, 6, 2, 0xbbb, 6);

	/* shared partial page with n_new 0, then extended: copied then */
	struct kvp_seq_src s3[1] = { src_user(7, 14) };
	struct tlease r = seq_create_ok(eng, 70, s3, 1, 0, OTHER);
	release_if(eng, r.L.id);
	struct tlease y = seq_extend_ok(eng, 70, 1, NULL, OTHER);
	assert_int_not_equal(y.frames[3], r.frames[3]);
	write_key(eng, &y, 0xccc, 0, 1);
	commit_ok(eng, y.L.id, 1);
	release_ok(eng, y.L.id);
	verify(eng, 7, 0, 14);
	expect_seq_bytes(eng, 70, 0, 14, 7, 0);
	expect_seq_bytes(eng, 70, 14, 1, 0xccc, 14);
	drop_engine();
}

/* A SEQ source's pages are shared by refcount: freeing either side keeps
 * the pages for the other. */
static void test_vseq_from_seq_shares_refcounted_pages(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[8];

	(void)state;
	tokens_seq(T, 8, 100);
	struct tlease a = seq_put(eng, 1, T, 8, KT, OWNER);
	uint64_t used = dev_used(eng);
	struct kvp_seq_src src[1] = { src_seq(1) };
	struct tlease b = seq_create_ok(eng, 2, src, 1, 4, OTHER);
	assert_int_equal(b.L.len, 8);
	assert_int_equal(b.L.npages, 3);
	assert_true(frames_equal(b.frames, a.frames, 2));
	assert_int_equal(dev_used(eng), used + 1);
	write_key(eng, &b, 0xb, 0, 4);
	commit_ok(eng, b.L.id, 4);
	release_ok(eng, b.L.id);
	seq_free_ok(eng, 1, OWNER);
	assert_int_equal(dev_used(eng), used + 1);
	expect_seq_bytes(eng, 2, 0, 8, KT, 0);
	expect_seq_bytes(eng, 2, 8, 4, 0xb, 8);
	/* a third from the second: three owners of page 0 over time */
	struct kvp_seq_src src2[1] = { src_seq(2) };
	struct tlease c = seq_create_ok(eng, 3, src2, 1, 0, OTHER);
	assert_true(frames_equal(c.frames, b.frames, 3));
	release_if(eng, c.L.id);
	seq_free_ok(eng, 2, OTHER);
	expect_seq_bytes(eng, 3, 0, 8, KT, 0);
	expect_seq_bytes(eng, 3, 8, 4, 0xb, 8);
	seq_free_ok(eng, 3, OTHER);
	/* the published pages stay cached, the own one is freed */
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 2);
	assert_int_equal(s.prefix_idle_pages, 2);
	assert_int_equal(s.seqs, 0);
	drop_engine();
}

/* A sequence whose first pages were found published by another (dedupe:
 * it anchors those) publishes its next page as their child; a virtual
 * sequence made from it holds that child, so it must keep the parents
 * held too after both sequences are gone (share.h: "A published page's
 * parent is held by whoever holds the page"). */
static void test_vseq_from_deduped_seq_keeps_prefix_parents_held(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[12];

	(void)state;
	tokens_seq(T, 12, 100);
	struct tlease a = seq_alloc_ok(eng, 1, T, 8, OWNER);
	struct tlease b = seq_alloc_ok(eng, 2, T, 12, OWNER);
	write_key(eng, &a, KT, 0, 8);
	write_key(eng, &b, KT, 0, 12);
	commit_ok(eng, a.L.id, 8);                 /* publishes pages 0, 1 */
	commit_ok(eng, b.L.id, 12);                /* anchors 0, 1; publishes 2 */
	release_ok(eng, a.L.id);
	release_ok(eng, b.L.id);
	struct kvp_seq_src src[1] = { src_seq(2) };
	struct tlease v = seq_create_ok(eng, 3, src, 1, 0, OWNER);
	release_if(eng, v.L.id);
	seq_free_ok(eng, 1, OWNER);
	seq_free_ok(eng, 2, OWNER);                /* engine_check runs here */
	expect_seq_bytes(eng, 3, 0, 12, KT, 0);
	seq_free_ok(eng, 3, OWNER);
	drop_engine();
}

/* ------------------------------------------------------------ compositions */

struct comp_fix {
	struct kvp_chunk_id sys, sys2, ctx[3], q[3];
	struct tlease fsys, fsys2, fctx[3], fq[3];
};

/*
 * A link entry of n tokens base.. after parent, its pages written with
 * key = base; the name's root entry (made to create the name) is deleted
 * again, so the link's pages are the only ones. Returns the entry id.
 */
static struct kvp_chunk_id link_make(struct engine *eng, uint32_t base, uint32_t n,
				     uint32_t type, const struct kvp_chunk_id *parent,
				     struct tlease *fill)
{
	struct kvp_chunk_id name = chunk_make(eng, base, n, type, NULL, 1, NULL);
	struct share_chunk_reg r;
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc;

	rc = share_chunk_link(eng, &name, parent, OWNER, 1, &r, &e);
	if (rc || !r.created)
		fail_msg("share_chunk_link = %d (created %d): %s", rc, r.created, e.msg);
	assert_memory_equal(r.name.b, name.b, 32);
	tlease_copy(&t, &r.lease);
	write_key(eng, &t, base, 0, n);
	assert_int_equal(share_chunk_seal(eng, t.L.id, OWNER, &e), 0);
	/* the root entry: the name's row still names it */
	struct kvp_chunk_info ci = chunk_info_ok(eng, &name);
	assert_int_equal(ci.entries, 2);
	assert_int_equal(share_chunk_delete(eng, &ci.root, &e), 1);
	CHECK(eng);
	if (fill)
		*fill = t;
	return r.id;
}

/*
 * Chains (tokens): sys (6) -> ctx0 (8) -> ctx1 (5) -> q0 (3);
 * sys -> ctx2 (3) -> q1 (2); sys2 (4) -> q2 (1). sys / sys2 are names
 * (their roots), the rest link entries.
 */
static void comp_fixture(struct engine *eng, struct comp_fix *f)
{
	f->sys = chunk_make(eng, 1000, 6, KVP_CHUNK_SYSTEM, NULL, 1, &f->fsys);
	f->sys2 = chunk_make(eng, 1100, 4, KVP_CHUNK_SYSTEM, NULL, 1, &f->fsys2);
	f->ctx[0] = link_make(eng, 2000, 8, KVP_CHUNK_CONTEXT, &f->sys, &f->fctx[0]);
	f->ctx[1] = link_make(eng, 2100, 5, KVP_CHUNK_CONTEXT, &f->ctx[0], &f->fctx[1]);
	f->q[0] = link_make(eng, 3000, 3, KVP_CHUNK_QUERY, &f->ctx[1], &f->fq[0]);
	f->ctx[2] = link_make(eng, 2200, 3, KVP_CHUNK_CONTEXT, &f->sys, &f->fctx[2]);
	f->q[1] = link_make(eng, 3100, 2, KVP_CHUNK_QUERY, &f->ctx[2], &f->fq[1]);
	f->q[2] = link_make(eng, 3200, 1, KVP_CHUNK_QUERY, &f->sys2, &f->fq[2]);
}

/* Group g of level l holds exactly the pages of a chunk of ntok tokens. */
static void assert_group(const struct share_composition *c, uint32_t l, uint32_t g,
			 const struct tlease *fill, uint32_t ntok)
{
	uint32_t np = (ntok + PT - 1) / PT;
	int32_t a = c->kv_indptr[l][g], b = c->kv_indptr[l][g + 1];

	assert_int_equal(b - a, (int32_t)np);
	for (uint32_t i = 0; i < np; i++)
		assert_int_equal(c->kv_indices[l][a + (int32_t)i], (int32_t)fill->frames[i]);
	assert_int_equal(c->kv_last_page_len[l][g], ntok ? (ntok - 1) % PT + 1 : 0);
}

static void assert_empty_group(const struct share_composition *c, uint32_t l,
			       uint32_t g)
{
	assert_int_equal(c->kv_indptr[l][g + 1], c->kv_indptr[l][g]);
	assert_int_equal(c->kv_last_page_len[l][g], 0);
}

static int compose(struct engine *eng, const struct kvp_compose_req *reqs,
		   uint32_t n, bool preview, struct share_composition *out,
		   struct errbuf *e)
{
	int rc;

	memset(out, 0, sizeof(*out));
	e->msg[0] = '\0';
	rc = share_compose(eng, reqs, n, preview, OTHER, 50 * SEC, out, e);
	CHECK(eng);
	return rc;
}

/*
 * The room a registration makes may evict the last entry of the very name
 * it registers under (issue 25, item 1): name X lives only in a link entry
 * under P, the LRU's oldest leaf; registering X's root on a full tier
 * evicts that entry. The name must survive (kept by the registration),
 * the new root read back its bytes, and the tables stay consistent.
 */
static void test_chunk_register_evicting_its_names_last_entry_keeps_the_name(void **state)
{
	struct engine *eng = mk_engine(8, 0, 0);
	struct kvp_chunk_id p, x, root;
	struct tlease lx, fill;
	uint32_t T[PT];

	(void)state;
	p = chunk_make(eng, 100, PT, KVP_CHUNK_SYSTEM, NULL, 1, NULL);
	x = link_make(eng, 200, PT, KVP_CHUNK_CONTEXT, &p, &lx);
	(void)x;
	chunk_make(eng, 300, 2 * PT, KVP_CHUNK_CONTEXT, NULL, 5 * SEC, NULL);
	chunk_make(eng, 400, 2 * PT, KVP_CHUNK_CONTEXT, NULL, 6 * SEC, NULL);
	chunk_make(eng, 500, 2 * PT, KVP_CHUNK_CONTEXT, NULL, 7 * SEC, NULL);
	assert_int_equal(dev_used(eng), 8);

	/* X's root again: one page, the tier full, X's link the oldest leaf. */
	tokens_seq(T, PT, 200);
	fill = chunk_put(eng, T, PT, KVP_CHUNK_CONTEXT, NULL, OWNER, 10 * SEC,
			 777, false, &root);
	(void)fill;
	CHECK(eng);
	struct kvp_chunk_info ci = chunk_info_ok(eng, &root);
	assert_int_equal(ci.tokens, PT);
	assert_int_equal(ci.type, KVP_CHUNK_CONTEXT);
	expect_chunk_bytes(eng, &root, 777, PT);
	assert_true(stats_of(eng).chunk_evicted >= 1);
	drop_engine();
}

/* One request, system + 2 contexts + query: 4 levels, one group each. */
static void test_compose_one_request_gives_one_csr_per_level(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct comp_fix f;
	struct share_composition c;
	struct errbuf e;

	(void)state;
	comp_fixture(eng, &f);
	struct kvp_chunk_id ctx[2] = { f.ctx[0], f.ctx[1] };
	struct kvp_compose_req r = { .system = f.sys, .contexts = ctx, .ncontexts = 2,
				     .qo_len = 0, .query = f.q[0] };
	uint64_t leases0 = stats_of(eng).leases, comps0 = stats_of(eng).compositions;
	int rc = compose(eng, &r, 1, false, &c, &e);
	if (rc)
		fail_msg("share_compose = %d: %s", rc, e.msg);
	assert_int_not_equal(c.lease, 0);
	assert_int_equal(c.nlevels, 4);
	assert_int_equal(c.nrequests, 1);
	assert_int_equal(c.tokens, 6 + 8 + 5 + 3);
	assert_int_equal(c.pages, 2 + 2 + 2 + 1);
	assert_int_equal(c.bytes, c.pages * engine_layout(eng)->page_bytes);
	for (uint32_t l = 0; l < 4; l++) {
		assert_int_equal(c.ngroups[l], 1);
		assert_int_equal(c.qo_indptr[l][0], 0);
		assert_int_equal(c.qo_indptr[l][1], 1);   /* qo_len 0 means 1 */
		assert_int_equal(c.kv_indptr[l][0], 0);
	}
	assert_group(&c, 0, 0, &f.fsys, 6);
	assert_group(&c, 1, 0, &f.fctx[0], 8);
	assert_group(&c, 2, 0, &f.fctx[1], 5);
	assert_group(&c, 3, 0, &f.fq[0], 3);
	uint64_t lease = c.lease;
	struct kvp_stats s = stats_of(eng);
	assert_int_equal(s.leases, leases0 + 1);
	assert_int_equal(s.compositions, comps0 + 1);
	assert_true(chunk_info_ok(eng, &f.sys).holders >= 1);
	assert_true(chunk_info_ok(eng, &f.q[0]).holders >= 1);
	assert_int_equal(chunk_info_ok(eng, &f.ctx[2]).holders, 0);
	assert_int_equal(engine_commit(eng, lease, 0, &e), -EINVAL);
	release_ok(eng, lease);
	assert_int_equal(chunk_info_ok(eng, &f.sys).holders, 0);
	assert_int_equal(stats_of(eng).leases, leases0);
	drop_engine();
}

/* Three requests: the first two share a system (one level-0 group), the
 * third has another; contexts 2 / 1 / 0 give empty groups on levels 1-2. */
static void test_compose_batch_groups_systems_and_pads_contexts(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct comp_fix f;
	struct share_composition c, p;
	struct errbuf e;

	(void)state;
	comp_fixture(eng, &f);
	struct kvp_chunk_id c0[2] = { f.ctx[0], f.ctx[1] }, c1[1] = { f.ctx[2] };
	struct kvp_compose_req r[3] = {
		{ .system = f.sys, .contexts = c0, .ncontexts = 2, .qo_len = 3, .query = f.q[0] },
		{ .system = f.sys, .contexts = c1, .ncontexts = 1, .qo_len = 2, .query = f.q[1] },
		{ .system = f.sys2, .contexts = NULL, .ncontexts = 0, .qo_len = 1, .query = f.q[2] },
	};
	int rc = compose(eng, r, 3, false, &c, &e);
	if (rc)
		fail_msg("share_compose = %d: %s", rc, e.msg);
	assert_int_equal(c.nlevels, 4);
	assert_int_equal(c.nrequests, 3);
	/* level 0: {r0, r1} on sys, {r2} on sys2 */
	assert_int_equal(c.ngroups[0], 2);
	assert_int_equal(c.qo_indptr[0][0], 0);
	assert_int_equal(c.qo_indptr[0][1], 5);
	assert_int_equal(c.qo_indptr[0][2], 6);
	assert_int_equal(c.kv_indptr[0][0], 0);
	assert_group(&c, 0, 0, &f.fsys, 6);
	assert_group(&c, 0, 1, &f.fsys2, 4);
	for (uint32_t l = 1; l < 4; l++) {
		assert_int_equal(c.ngroups[l], 3);
		assert_int_equal(c.qo_indptr[l][0], 0);
		assert_int_equal(c.qo_indptr[l][1], 3);
		assert_int_equal(c.qo_indptr[l][2], 5);
		assert_int_equal(c.qo_indptr[l][3], 6);
		assert_int_equal(c.kv_indptr[l][0], 0);
	}
	assert_group(&c, 1, 0, &f.fctx[0], 8);
	assert_group(&c, 1, 1, &f.fctx[2], 3);
	assert_empty_group(&c, 1, 2);
	assert_group(&c, 2, 0, &f.fctx[1], 5);
	assert_empty_group(&c, 2, 1);
	assert_empty_group(&c, 2, 2);
	assert_group(&c, 3, 0, &f.fq[0], 3);
	assert_group(&c, 3, 1, &f.fq[1], 2);
	assert_group(&c, 3, 2, &f.fq[2], 1);
	assert_int_equal(c.tokens, (6 + 8 + 5 + 3) + (6 + 3 + 2) + (4 + 1));
	/* distinct pages: sys 2, sys2 1, ctx 2+2+1, q 1+1+1 */
	assert_int_equal(c.pages, 11);
	assert_int_equal(c.bytes, 11 * engine_layout(eng)->page_bytes);
	uint64_t lease = c.lease;
	struct share_composition keep = c;

	/* preview: the same numbers, nothing held */
	struct kvp_stats s0 = stats_of(eng);
	rc = compose(eng, r, 3, true, &p, &e);
	if (rc)
		fail_msg("share_compose(preview) = %d: %s", rc, e.msg);
	assert_int_equal(p.lease, 0);
	assert_int_equal(p.nlevels, keep.nlevels);
	assert_int_equal(p.nrequests, keep.nrequests);
	assert_int_equal(p.tokens, keep.tokens);
	assert_int_equal(p.pages, keep.pages);
	assert_int_equal(p.bytes, keep.bytes);
	struct kvp_stats s1 = stats_of(eng);
	assert_int_equal(s1.leases, s0.leases);
	assert_int_equal(s1.tier[KVP_TIER_DEVICE].frames_used,
			 s0.tier[KVP_TIER_DEVICE].frames_used);
	release_ok(eng, lease);
	rc = compose(eng, r, 3, true, &p, &e);
	assert_int_equal(rc, 0);
	assert_int_equal(chunk_info_ok(eng, &f.sys).holders, 0);
	assert_int_equal(chunk_info_ok(eng, &f.ctx[0]).holders, 0);
	assert_int_equal(stats_of(eng).leases, s0.leases - 1);
	drop_engine();
}

static void test_compose_errors_name_the_chunk_and_hold_nothing(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct comp_fix f;
	struct share_composition c;
	struct errbuf e;
	struct kvp_chunk_id unknown, many[KVP_COMPOSE_MAX_CONTEXTS + 1];
	char hex[65];

	(void)state;
	comp_fixture(eng, &f);
	struct kvp_stats before = stats_of(eng);
	struct kvp_compose_req r = { .system = f.sys, .contexts = f.ctx, .ncontexts = 3,
				     .query = f.q[0] };

	memset(&unknown, 0x77, sizeof(unknown));
	id_hex(&unknown, hex);
	hex[16] = '\0';
	struct kvp_chunk_id ctx[2] = { f.ctx[0], unknown };
	r.contexts = ctx;
	r.ncontexts = 2;
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -ENOENT);
	assert_msg_has(&e, hex);
	assert_int_equal(compose(eng, &r, 1, true, &c, &e), -ENOENT);
	r.ncontexts = 1;
	r.system = unknown;
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -ENOENT);
	assert_msg_has(&e, hex);

	r.system = f.ctx[1];                 /* a context as system */
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -EINVAL);
	r.system = f.sys;
	r.query = f.ctx[1];                  /* a context as query */
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -EINVAL);
	r.query = f.q[0];
	ctx[1] = f.q[1];                     /* a query as context */
	r.ncontexts = 2;
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -EINVAL);
	for (int i = 0; i <= KVP_COMPOSE_MAX_CONTEXTS; i++)
		many[i] = f.ctx[i % 3];
	r.contexts = many;
	r.ncontexts = KVP_COMPOSE_MAX_CONTEXTS + 1;
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -EINVAL);
	r.ncontexts = 1;
	assert_true(compose(eng, &r, 0, false, &c, &e) < 0);

	/* a chunk being filled */
	uint32_t F[4];
	tokens_seq(F, 4, 4444);
	struct share_chunk_reg fr = chunk_reg(eng, F, 4, KVP_CHUNK_QUERY, NULL, OWNER, 1, 0);
	before = stats_of(eng);
	r.query = fr.id;
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), -EAGAIN);
	struct kvp_stats after = stats_of(eng);
	assert_int_equal(after.leases, before.leases);
	assert_int_equal(after.compositions, before.compositions);
	assert_int_equal(chunk_info_ok(eng, &f.sys).holders, 0);
	assert_int_equal(chunk_info_ok(eng, &f.ctx[0]).holders, 0);
	drop_engine();
}

/* A composition holds its chunks: deleted meanwhile, their pages keep their
 * bytes until the composition is released. */
static void test_compose_holds_chunks_through_delete(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct comp_fix f;
	struct share_composition c;
	struct errbuf e;

	(void)state;
	comp_fixture(eng, &f);
	uint64_t used = dev_used(eng);
	struct kvp_chunk_id ctx[2] = { f.ctx[0], f.ctx[1] };
	struct kvp_compose_req r = { .system = f.sys, .contexts = ctx,
				     .ncontexts = 2, .query = f.q[0] };
	assert_int_equal(compose(eng, &r, 1, false, &c, &e), 0);
	uint64_t lease = c.lease;
	/* ctx[0] and everything below it (ctx[1], q[0]) */
	assert_int_equal(share_chunk_delete(eng, &f.ctx[0], &e), 3);
	CHECK(eng);
	assert_false(chunk_exists(eng, &f.ctx[1]));
	assert_false(chunk_exists(eng, &f.q[0]));
	/* both systems, with ctx[2], q[1] and q[2] below them */
	assert_int_equal(share_chunk_clear(eng, KVP_CHUNK_SYSTEM), 2);
	CHECK(eng);
	assert_false(chunk_exists(eng, &f.sys));
	assert_false(chunk_exists(eng, &f.q[2]));
	/* held ones stay: sys 2 + ctx0 2 + ctx1 2 + q0 1 pages */
	assert_int_equal(dev_used(eng), 7);
	assert_true(used > 7);
	assert_int_equal(stats_of(eng).chunks, 0);
	assert_int_equal(share_chunk_evict_unused(eng, 0, 1000 * SEC), 0);
	expect_chunk_frames(eng, f.fsys.frames, 1000, 6);
	expect_chunk_frames(eng, f.fctx[0].frames, 2000, 8);
	expect_chunk_frames(eng, f.fctx[1].frames, 2100, 5);
	expect_chunk_frames(eng, f.fq[0].frames, 3000, 3);
	release_ok(eng, lease);
	assert_int_equal(dev_used(eng), 0);
	CHECK(eng);
	drop_engine();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_prefix_commit_publishes_full_pages_lookup_caps_last_token, teardown),
		cmocka_unit_test_teardown(test_prefix_other_salt_misses, teardown),
		cmocka_unit_test_teardown(test_prefix_hashes_are_the_documented_sha256_chain, teardown),
		cmocka_unit_test_teardown(test_prefix_freed_seq_pages_stay_cached_idle, teardown),
		cmocka_unit_test_teardown(test_prefix_eviction_takes_leaves_first, teardown),
		cmocka_unit_test_teardown(test_prefix_concurrent_allocs_dedupe_on_commit, teardown),
		cmocka_unit_test_teardown(test_seq_release_rolls_back_extend_publishes, teardown),
		cmocka_unit_test_teardown(test_chunk_register_fill_seal_then_register_again_is_a_hit, teardown),
		cmocka_unit_test_teardown(test_chunk_register_rejects_bad_arguments, teardown),
		cmocka_unit_test_teardown(test_chunk_acquire_filling_is_eagain_unknown_is_enoent_named, teardown),
		cmocka_unit_test_teardown(test_chunk_deleted_while_leased_stays_readable_until_release, teardown),
		cmocka_unit_test_teardown(test_chunk_filler_giving_up_or_dying_deletes_it, teardown),
		cmocka_unit_test_teardown(test_chunk_list_by_type_and_metadata_with_paging, teardown),
		cmocka_unit_test_teardown(test_chunk_clear_by_type, teardown),
		cmocka_unit_test_teardown(test_chunk_evict_unused_by_age_spares_held_and_recent, teardown),
		cmocka_unit_test_teardown(test_chunk_lru_eviction_under_pressure_spares_held, teardown),
		cmocka_unit_test_teardown(test_vseq_borrows_history_and_chunk_pages, teardown),
		cmocka_unit_test_teardown(test_vseq_rejects_bad_sources, teardown),
		cmocka_unit_test_teardown(test_vseq_copy_on_write_keeps_both_sides_bytes, teardown),
		cmocka_unit_test_teardown(test_vseq_from_seq_shares_refcounted_pages, teardown),
		cmocka_unit_test_teardown(test_vseq_from_deduped_seq_keeps_prefix_parents_held, teardown),
		cmocka_unit_test_teardown(test_chunk_register_evicting_its_names_last_entry_keeps_the_name, teardown),
		cmocka_unit_test_teardown(test_compose_one_request_gives_one_csr_per_level, teardown),
		cmocka_unit_test_teardown(test_compose_batch_groups_systems_and_pads_contexts, teardown),
		cmocka_unit_test_teardown(test_compose_errors_name_the_chunk_and_hold_nothing, teardown),
		cmocka_unit_test_teardown(test_compose_holds_chunks_through_delete, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
