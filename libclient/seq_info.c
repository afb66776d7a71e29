/* SPDX-License-Identifier: MIT */
/*
 * seq_info.c - a sequence's state read back (kvpool.h kvp_seq_info,
 * kvp_seq_pages, kvp_seq_tokens; proto.h SEQ_INFO, SEQ_TOKENS): seed 004's
 * GetRequest, NumComputedTokens and GetComputedBlocks. The page table and
 * the token ids come in windows of what the sync range holds: a long
 * sequence takes more than one call, each starting where the last ended
 * (sqe.user), and the daemon's counts are checked against every window.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "client_internal.h"

_Static_assert(sizeof(struct kvp_seq_info) == KVP_SEQ_INFO_SIZE_VER0,
	       "kvp_seq_info 0.2 layout");

/* One SEQ_INFO call from page `first`: the row into *si, the frames that
 * came into frames[first, max); returns how many came. */
static int seq_info_call(struct kvp_client *c, uint64_t seq, uint64_t first,
			 struct kvp_seq_info *si, int32_t *frames, uint64_t max)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_SEQ_INFO, .arg = seq, .user = first };
	const unsigned char *src;
	struct kvp_cqe cqe;
	uint32_t idx = 0, len, n;
	int ret = kvpc_call(c, &sqe, &cqe, &idx);

	if (ret < 0)
		return ret;
	n = cqe.out_bytes >= sizeof(*si) ?
	    (uint32_t)((cqe.out_bytes - sizeof(*si)) / 4) : 0;
	src = kvpc_slot_out(c, idx, &len);
	if (cqe.out_bytes < sizeof(*si) || (cqe.out_bytes - sizeof(*si)) % 4)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent a %" PRIu32 "-byte "
				"sequence row", c->path, cqe.out_bytes);
	memcpy(si, src, sizeof(*si));
	if (si->seq != seq || cqe.val0 != si->npages ||
	    (n && (first >= si->npages || n > si->npages - first)) ||
	    (!n && first < si->npages) || si->computed > si->tokens)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent an inconsistent row "
				"for sequence %" PRIu64 " (%" PRIu32 " pages, %" PRIu32
				" from %" PRIu64 ")", c->path, seq, si->npages, n, first);
	if (frames && first < max)
		memcpy(frames + first, src + sizeof(*si),
		       (size_t)(max - first < n ? max - first : n) * 4);
	return (int)n;
}

KVP_PUBLIC
int kvp_seq_info_sz(struct kvp_client *c, uint64_t seq,
		    struct kvp_seq_info *out, size_t size)
{
	struct kvp_seq_info si;
	int ret = kvpc_row_size(c, size, KVP_SEQ_INFO_SIZE_VER0, "seq_info");

	if (!ret && !out)
		ret = kvpc_null_arg(c, "seq_info", "the result pointer");
	if (!ret)
		ret = seq_info_call(c, seq, UINT64_MAX, &si, NULL, 0);
	if (ret < 0)
		return ret;
	kvpc_rows_put(out, size, &si, sizeof(si), 1);
	return 0;
}

KVP_PUBLIC
int kvp_seq_pages(struct kvp_client *c, uint64_t seq, int32_t *frames,
		  uint32_t max)
{
	struct kvp_seq_info si;
	uint64_t at = 0;
	int ret;

	if (max && !frames)
		return kvpc_null_arg(c, "seq_pages", "the frames buffer");
	do {
		ret = seq_info_call(c, seq, at, &si, frames, max);
		if (ret < 0)
			return ret;
		at += (uint64_t)ret;
	} while (at < si.npages && at < max);
	return (int)si.npages;
}

KVP_PUBLIC
int kvp_seq_tokens(struct kvp_client *c, uint64_t seq, uint32_t *buf,
		   uint32_t cap, uint32_t *n)
{
	uint64_t at = 0, total = 0;

	if (cap && !buf)
		return kvpc_null_arg(c, "seq_tokens", "the buffer");
	do {
		struct kvp_sqe sqe = { .opcode = KVP_OP_SEQ_TOKENS, .arg = seq,
				       .user = at };
		struct kvp_cqe cqe;
		uint32_t idx = 0, len;
		int ret = kvpc_call(c, &sqe, &cqe, &idx);

		if (ret < 0)
			return ret;
		if ((uint64_t)ret * 4 != cqe.out_bytes || at + (uint64_t)ret >
		    cqe.val0 || (!ret && at < cqe.val0))
			return kvpc_err(c, -EPROTO, "kvpoold at %s sent %d token ids "
					"of sequence %" PRIu64 " at %" PRIu64 " of %"
					PRIu64, c->path, ret, seq, at,
					(uint64_t)cqe.val0);
		total = cqe.val0;
		if (at < cap)
			memcpy(buf + at, kvpc_slot_out(c, idx, &len),
			       (size_t)(cap - at < (uint64_t)ret ? cap - at :
					(uint64_t)ret) * 4);
		at += (uint64_t)ret;
	} while (at < total && at < cap);
	if (n)
		*n = (uint32_t)total;
	return (int)(at < cap ? at : cap);
}
