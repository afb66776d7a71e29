/* SPDX-License-Identifier: MIT */
/*
 * share_helpers.h - what test_share.c needs on top of engine_helpers.h:
 * sequences and chunks made, filled and read back in one call each, page
 * tables copied out of engine memory (an engine_lease's frames are valid only
 * until the next call), and chunk ids as hex.
 *
 * Bytes: token pos of an object written under key k holds pattern(l, k, pos)
 * (engine_helpers.h). A sequence made from a token list uses the key of the
 * list, so two sequences of the same tokens write the same bytes, as two
 * requests computing the same prefix would.
 *
 * Include after <cmocka.h> and engine_helpers.h.
 */
#ifndef KVPOOL_TEST_SHARE_HELPERS_H
#define KVPOOL_TEST_SHARE_HELPERS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "kvpool.h"
#include "share.h"

#define TL_MAX_PAGES 64

/* An engine_lease with its page table copied out. */
struct tlease {
	struct engine_lease L;
	uint32_t frames[TL_MAX_PAGES];
};

void tlease_copy(struct tlease *t, const struct engine_lease *L);

/* Write pattern(key) into lease tokens [first, first+n): positions
 * L.len + first ... of the lease's object. */
void write_key(struct engine *eng, const struct tlease *t, uint64_t key,
	       uint32_t first, uint32_t n);

/* share_seq_alloc that must succeed (engine_check after). */
struct tlease seq_alloc_ok(struct engine *eng, uint64_t seq,
			   const uint32_t *tokens, uint32_t n, uint32_t owner);
/* share_seq_create that must succeed. */
struct tlease seq_create_ok(struct engine *eng, uint64_t seq,
			    const struct kvp_seq_src *src, uint32_t nsrc,
			    uint32_t n_new, uint32_t owner);
struct tlease seq_extend_ok(struct engine *eng, uint64_t seq, uint32_t n_new,
			    const uint32_t *tokens, uint32_t owner);
void seq_free_ok(struct engine *eng, uint64_t seq, uint32_t owner);
/* seq_alloc, write the new tokens with key, commit them all, release. */
struct tlease seq_put(struct engine *eng, uint64_t seq, const uint32_t *tokens,
		      uint32_t n, uint64_t key, uint32_t owner);

/* Committed tokens [pos, pos+n) of seq hold pattern(key, kpos...). */
void expect_seq_bytes(struct engine *eng, uint64_t seq, uint64_t pos,
		      uint32_t n, uint64_t key, uint64_t kpos);
/* Tokens [pos, pos+n) read straight from the device tier through a page
 * table (token t is in frames[t / P] slot t % P) hold pattern(key, kpos...). */
void expect_frames_bytes(struct engine *eng, const uint32_t *frames,
			 uint32_t pos, uint32_t n, uint64_t key, uint64_t kpos);

/* Register (must create), fill with pattern(key) and seal with
 * share_chunk_seal (or commit when by_commit). Returns the fill lease. */
struct tlease chunk_put(struct engine *eng, const uint32_t *tokens, uint32_t n,
			uint32_t type, const char *meta, uint32_t owner,
			uint64_t now_ns, uint64_t key, bool by_commit,
			struct kvp_chunk_id *id);
/* share_chunk_acquire that must succeed. */
struct tlease chunk_acquire_ok(struct engine *eng, const struct kvp_chunk_id *id,
			       uint32_t owner, uint64_t now_ns);
/* Chunk tokens [0, n) hold pattern(key) (share_chunk_read_tokens). */
void expect_chunk_bytes(struct engine *eng, const struct kvp_chunk_id *id,
			uint64_t key, uint32_t n);

/* n tokens: base, base+1, ... */
void tokens_seq(uint32_t *out, uint32_t n, uint32_t base);
/* 64 lowercase hex digits of id. */
void id_hex(const struct kvp_chunk_id *id, char hex[65]);
uint64_t dev_free(struct engine *eng);

#endif /* KVPOOL_TEST_SHARE_HELPERS_H */
