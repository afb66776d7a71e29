/* SPDX-License-Identifier: MIT */
/*
 * share_chunk_copy.c - a chunk entry copied into another pool of its tenant
 * (issue 31: a group on other GPUs uses a chunk registered on these).
 *
 * Unlike a history, a chunk is not moved: it stays where its users are,
 * and the destination gets a copy registered under the same ids (the
 * tenant's salt, the tokens and the parent make the id, and both pools'
 * engines share the salt). An entry hangs under its parent, and a linked
 * entry's name must be known where it is linked, so the copy walks the
 * entry's chain from its root:
 *
 *   for each entry E of root .. id that dst lacks:
 *     E a root:        share_chunk_put of E's name (tokens, type, content,
 *                      metadata), its pages filled from E's frames, sealed;
 *     E under a parent: the name first when dst lacks it (its root entry,
 *                      copied the same way, must be READY in src), then
 *                      share_chunk_link(name, parent), filled, sealed.
 *
 * The fill is the backend's peer copy between the two pools' device tiers
 * (copy_begin_peer: cudaMemcpyPeerAsync between GPUs, memcpy on shm, each
 * rank's slice with tp > 1), landed before the seal. A tensor-parallel
 * pool's fill lease is a group: ranks 1 .. tp-1 join it and every rank
 * seals, as the ranks' clients would (lease_group.c).
 *
 * Locks: the caller holds shard 0 of both pools (chunks live there), in
 * pool order, as op_move does for a history; src's entries are READY and
 * immutable, and stay while the lock is held.
 *
 * Errors leave the entries copied before the failing one (each complete
 * and sealed: a later copy finds them) and nothing of the failing one.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_move.h"
#include "share_internal.h"

/* Chains longer than this are refused (a chain is a prompt's chunks one
 * after the other: system, contexts, a query). */
#define COPY_CHAIN_MAX 256

/* dst's fill lease of reg: ranks 1 .. tp-1 join it, then every rank
 * seals (tp 1: share_chunk_seal). */
static int fill_seal(struct engine *dst, const struct share_chunk_reg *reg,
		     uint32_t owner, struct errbuf *e)
{
	uint64_t lid = reg->lease.id;
	struct engine_lease j;
	int ret = 0;

	if (engine_tp(dst) <= 1)
		return share_chunk_seal(dst, lid, owner, e);
	for (uint32_t r = 1; r < engine_tp(dst) && !ret; r++)
		ret = engine_lease_join(dst, lid, r, owner, UINT64_MAX, &j, e);
	for (uint32_t r = 0; r < engine_tp(dst) && ret >= 0; r++)
		ret = engine_chunk_seal_rank(dst, lid, r, owner, UINT32_MAX, e);
	return ret < 0 ? ret : 0;
}

/* A fill that failed: its lease ends, which deletes the FILLING entry. */
static void fill_abort(struct engine *dst, const struct share_chunk_reg *reg,
		       uint32_t owner)
{
	struct errbuf e2 = { .msg = "" };
	bool left;

	if (engine_tp(dst) <= 1) {
		engine_release(dst, reg->lease.id, &e2);
		return;
	}
	for (uint32_t r = 0; r < engine_tp(dst); r++)
		engine_release_rank(dst, reg->lease.id, r, owner, &left, &e2);
}

/* reg (a new entry of dst, FILLING) gets src entry s's pages, sealed. */
static int fill_from(struct engine *src, struct engine *dst, const struct chunk *s,
		     const struct share_chunk_reg *reg, uint32_t owner,
		     struct engine_chunk_copy_out *out, struct errbuf *e)
{
	struct chunk *d = chunk_find(dst, &reg->id);
	struct copy_batch *b;
	char sid[17];
	int ret;

	chunk_id_short(&s->id, sid);
	if (!d || d->npages != s->npages || memcmp(&reg->id, &s->id, sizeof(s->id))) {
		fill_abort(dst, reg, owner);
		return errbuf_set(e, -EINVAL, "chunk entry %s: the destination pool "
				  "made another entry of it (its tenant's salt "
				  "differs?); nothing copied", sid);
	}
	b = malloc(sizeof(*b)); /* a batch of runs: too big for a stack */
	if (!b) {
		fill_abort(dst, reg, owner);
		return errbuf_set(e, -ENOMEM, "out of memory for a copy");
	}
	copy_begin_peer(b, dst->be, dst->be_ctx, src->be_ctx,
			engine_tier(dst, KVP_TIER_DEVICE),
			engine_tier(src, KVP_TIER_DEVICE), dst->layout.page_bytes);
	for (uint32_t i = 0; i < s->npages; i++)
		copy_page(b, d->frames[i], s->frames[i]);
	ret = copy_end(b, e);
	out->bytes += b->bytes;
	free(b);
	if (!ret)
		ret = fill_seal(dst, reg, owner, e);
	if (ret) {
		fill_abort(dst, reg, owner);
		return ret;
	}
	out->entries++;
	out->pages += s->npages;
	return 0;
}

/* -EINPROGRESS from a registration (the name being read from a lower
 * tier of dst) as a retry the caller can act on. */
static int reg_err(int ret, const char *sid, struct errbuf *e)
{
	if (ret != -EINPROGRESS)
		return ret;
	return errbuf_set(e, -EAGAIN, "chunk %s: the destination pool is "
			  "reading it from its disk or remote tier; try again "
			  "in a moment", sid);
}

/* Root entry s of src into dst (s->name registered there with it). */
static int copy_root(struct engine *src, struct engine *dst, const struct chunk *s,
		     uint32_t owner, uint64_t now_ns,
		     struct engine_chunk_copy_out *out, struct errbuf *e)
{
	const struct chunk_name *n = s->name;
	struct share_chunk_root r = {
		.tokens = n->tokens, .n = n->ntokens, .type = n->type,
		.content = n->content, .content_len = n->content_len,
		.meta = n->meta,
	};
	struct share_chunk_reg reg;
	char sid[17];
	int ret;

	chunk_id_short(&s->id, sid);
	ret = share_chunk_put(dst, &r, owner, now_ns, &reg, e);
	if (ret)
		return reg_err(ret, sid, e);
	if (!reg.created)
		return 0; /* there already (a READY entry: checked before) */
	return fill_from(src, dst, s, &reg, owner, out, e);
}

/* Whether dst holds entry s ready (0), lacks it (1), or has it filling. */
static int dst_has(struct engine *dst, const struct chunk *s, struct errbuf *e)
{
	struct chunk *d = chunk_find(dst, &s->id);
	char sid[17];

	if (!d || d->dead)
		return 1;
	if (d->state == KVP_CHUNK_READY)
		return 0;
	chunk_id_short(&s->id, sid);
	return errbuf_set(e, -EAGAIN, "chunk entry %s: client %" PRIu32 " is "
			  "filling it in the destination pool; retry after it "
			  "seals", sid, d->filler);
}

/* Entry s (its parent copied already) into dst. */
static int copy_entry(struct engine *src, struct engine *dst, const struct chunk *s,
		      uint32_t owner, uint64_t now_ns,
		      struct engine_chunk_copy_out *out, struct errbuf *e)
{
	struct share_chunk_reg reg;
	const struct chunk *root;
	char sid[17];
	int ret = dst_has(dst, s, e);

	if (ret <= 0)
		return ret;
	if (!s->parent)
		return copy_root(src, dst, s, owner, now_ns, out, e);
	chunk_id_short(&s->id, sid);
	if (!name_find(dst, &s->name->id)) {
		root = name_root(s->name);
		if (!root || root->dead || root->state != KVP_CHUNK_READY)
			return errbuf_set(e, -ENOENT, "chunk entry %s: its name has "
					  "no ready root entry in this pool to copy "
					  "with it; register the name in the "
					  "destination pool first (kvp_chunk_put)", sid);
		ret = dst_has(dst, root, e);
		if (ret > 0)
			ret = copy_root(src, dst, root, owner, now_ns, out, e);
		if (ret)
			return ret;
	}
	ret = share_chunk_link(dst, &s->name->id, &s->parent->id, owner, now_ns,
			       &reg, e);
	if (ret)
		return reg_err(ret, sid, e);
	if (!reg.created)
		return 0;
	return fill_from(src, dst, s, &reg, owner, out, e);
}

int engine_chunk_copy(struct engine *src, struct engine *dst,
		      const struct kvp_chunk_id *id, uint32_t owner, uint64_t now_ns,
		      struct engine_chunk_copy_out *out, struct errbuf *e)
{
	const struct chunk *chain[COPY_CHAIN_MAX];
	struct chunk *c = chunk_resolve(src, id);
	uint32_t n = 0;
	char sid[17];
	int ret;

	*out = (struct engine_chunk_copy_out){ 0 };
	if (src == dst)
		return errbuf_set(e, -EINVAL, "chunk copy: source and destination "
				  "are the same pool");
	if (memcmp(&src->layout, &dst->layout, sizeof(src->layout)) ||
	    engine_tp(src) != engine_tp(dst))
		return errbuf_set(e, -EINVAL, "the two pools serve different "
				  "layouts");
	if (!c || c->dead || !c->name)
		return chunk_not_found("chunk", id, e);
	chunk_id_short(&c->id, sid);
	for (const struct chunk *x = c; x; x = x->parent) {
		if (x->state != KVP_CHUNK_READY)
			return errbuf_set(e, -EAGAIN, "chunk entry %s: client %"
					  PRIu32 " is filling %s; retry after it "
					  "seals", sid, x->filler, x == c ? "it" :
					  "an entry it hangs under");
		if (n == COPY_CHAIN_MAX)
			return errbuf_set(e, -E2BIG, "chunk entry %s hangs under more "
					  "than %d entries; copy a shorter chain",
					  sid, COPY_CHAIN_MAX);
		chain[n++] = x;
	}
	out->id = c->id;
	ret = 0;
	while (n-- > 0 && !ret) /* root first */
		ret = copy_entry(src, dst, chain[n], owner, now_ns, out, e);
	return ret;
}
