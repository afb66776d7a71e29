/* SPDX-License-Identifier: MIT */
/*
 * lease_group.c - group leases of a tensor-parallel pool (engine.h, "Group
 * leases"; engine_internal.h, struct lease_group).
 *
 * One history lease serves every rank: rank 0's prepare made it (and its
 * frames, the same indices in every rank's slice of the device tier,
 * backend_stripe.c), ranks 1..tp-1 join it and get the same page table,
 * and it commits once every rank has committed: before that a commit is
 * only recorded, so no rank's pages become part of the history while
 * another rank's may still be unwritten.
 *
 * Ending before the group committed. A member's release, or its client's
 * death, rolls the lease back for everyone at once (history_lease_end: the
 * reservation is given back, the history unpinned, nothing changes, as for
 * a dead client), and the slot turns into a LEASE_GROUP_ENDED record that
 * holds nothing but who ended it. Each remaining member learns it from its
 * commits (-ESTALE, with the message; a rank that had not joined, from its
 * join) and leaves it by its release (0), as it would a lease it holds;
 * the record goes with the last member's release, or its death.
 * The record is needed only for the message: the id itself is stale at
 * once for every other operation (lease_lookup misses a GROUP_ENDED slot).
 *
 * Once the group committed, each member's release only ends its own hold;
 * the last one releases the lease (the pin) as a tp = 1 release does. A
 * rank that has committed and releases before the others committed (a
 * commit with KVP_SQE_RELEASE, or kvp_commit then kvp_release) leaves once
 * the group commits: its part is done, and the group goes on without it.
 *
 * Chunk fill leases (grp->of == LEASE_CHUNK_FILL, a sharing id) are groups
 * the same way: rank 0's registration made the lease (share_chunk_put.c,
 * entry_commit), ranks 1..tp-1 join it for the entry's page table, and the
 * entry seals when every rank sealed (engine_chunk_seal_rank). A seal ends
 * the lease for that rank at once, as a tp = 1 seal does: the rank leaves
 * the members, so only a rank that has not sealed can end the group, by
 * its release or death, which kills the FILLING entry (share_lease_end:
 * nothing published) and leaves the same ended record. Reads (chunk read
 * leases, compositions) are no groups: a sealed entry is immutable and
 * found by its id, so each rank takes its own lease on the same frames.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "engine_internal.h"
#include "engine_share.h"
#include "share_internal.h" /* struct chunk: a fill lease's tokens */

static uint32_t all_ranks(const struct engine *eng)
{
	return (1u << eng->tp) - 1;
}

int lease_group_reserve(struct engine *eng, struct errbuf *e)
{
	if (eng->tp > 1 && !eng->grp_spare &&
	    !(eng->grp_spare = calloc(1, sizeof(*eng->grp_spare))))
		return errbuf_set(e, -ENOMEM, "out of memory for a group lease");
	return 0;
}

void lease_group_attach(struct engine *eng, struct lease *l, uint32_t owner)
{
	if (eng->tp <= 1)
		return;
	l->grp = eng->grp_spare;
	eng->grp_spare = NULL;
	*l->grp = (struct lease_group){ .members = 1, .joined = 1,
					.of = l->kind };
	l->grp->owner[0] = owner;
}

/* A group lease of this engine (a history lease for an id without the
 * sharing bit, a chunk fill or sequence write lease for one with it) or
 * its ended record; NULL otherwise. */
static struct lease *group_lookup(struct engine *eng, uint64_t id)
{
	uint32_t idx = (uint32_t)id & (LEASE_MAX - 1);
	bool shared = id & SHARE_LEASE_BIT;
	struct lease *l;
	uint32_t of;

	if ((((uint32_t)id >> LEASE_SHARD_SHIFT) & 0x7f) != eng->shard ||
	    idx >= eng->leases_cap)
		return NULL;
	l = &eng->leases[idx];
	of = l->grp ? l->grp->of : LEASE_FREE;
	if (!l->grp || shared != (of != LEASE_HISTORY) ||
	    (l->kind != of && l->kind != LEASE_GROUP_ENDED) ||
	    l->gen != (uint32_t)(id >> 32))
		return NULL;
	return l;
}

bool engine_lease_grouped(struct engine *eng, uint64_t id)
{
	return group_lookup(eng, id) != NULL;
}

static int ended_err(struct engine *eng, const struct lease *l, uint64_t id,
		     struct errbuf *e)
{
	if (l->grp->of == LEASE_CHUNK_FILL)
		return errbuf_set(e, -ESTALE, "lease %#" PRIx64 ": released (rank %"
				  PRIu32 "'s client %s) before every rank sealed; "
				  "the chunk was not published; register it again",
				  id, l->grp->ended_rank,
				  l->grp->ended_died ? "died" : "released it");
	if (l->grp->of == LEASE_SEQ_WRITE)
		return errbuf_set(e, -ESTALE, "lease %#" PRIx64 ": released (rank %"
				  PRIu32 "'s client %s) before every rank "
				  "committed; the sequence kept only the tokens "
				  "committed before it; rank 0 extends it again",
				  id, l->grp->ended_rank,
				  l->grp->ended_died ? "died" : "released it");
	return errbuf_set(e, -ESTALE, "lease %#" PRIx64 ": released (rank %" PRIu32
			  "'s client %s) before every rank committed; nothing "
			  "changed; prepare again", id, l->grp->ended_rank,
			  l->grp->ended_died ? "died" : "released it");
}

static bool is_member(const struct lease *l, uint32_t rank, uint32_t owner)
{
	return (l->grp->members >> rank & 1) && l->grp->owner[rank] == owner;
}

/* rank no longer holds l; the slot goes with the last member. */
static void member_leave(struct engine *eng, struct lease *l, uint32_t rank)
{
	l->grp->members &= ~(1u << rank);
	if (l->grp->members)
		return;
	if (l->kind == LEASE_GROUP_ENDED)
		lease_put(eng, l);
	else
		lease_release(eng, l);
}

/*
 * The group ends before it committed, by rank's release or death: rolled
 * back and unpinned for every rank at once; an ended record stays while
 * other members have yet to hear. Members that asked to leave with their
 * commit are not waited for: they hold nothing.
 */
static void group_end(struct engine *eng, struct lease *l, uint32_t rank,
		      bool died)
{
	struct lease_group *g = l->grp;

	g->members &= ~(1u << rank) & ~g->leave;
	g->ended_rank = rank;
	g->ended_died = died;
	if (!g->members) {
		lease_release(eng, l);
		return;
	}
	if (l->kind == LEASE_HISTORY) {
		history_lease_end(eng, l);
		eng->history_leases--; /* its pin is gone; a record now */
		l->h = NULL;
	} else {
		/* The unsealed entry dies; a sequence drops the new tokens. */
		share_lease_end(eng, l);
		l->chunk = NULL;
		l->seq = NULL;
	}
	eng->st.releases++;
	l->kind = LEASE_GROUP_ENDED;
}

/* The pages of the page table a joining rank gets: the history's (its
 * committed tokens and the new ones), the entry's or the sequence's. */
static uint32_t join_pages(const struct engine *eng, const struct lease *l)
{
	if (l->kind == LEASE_CHUNK_FILL)
		return l->chunk->npages;
	if (l->kind == LEASE_SEQ_WRITE)
		return l->seq->npages;
	return (uint32_t)pages_for(eng, l->len0 + l->n_new);
}

/* *out for a rank joining history lease l: what rank 0's prepare answered
 * (npages of the history's page table, into eng->view, reserved). */
static void history_join_out(struct engine *eng, const struct lease *l,
			     uint64_t id, uint32_t npages,
			     struct engine_lease *out)
{
	const struct history *h = l->h;

	for (uint32_t i = 0; i < npages; i++)
		eng->view[i] = h->pages[i].frame[KVP_TIER_DEVICE];
	*out = (struct engine_lease){
		.id = id,
		.start = h->start,
		.len = l->len0,
		.n_new = l->n_new,
		.npages = npages,
		.frames = eng->view,
		.last_page_len = npages ?
			(uint32_t)((l->len0 + l->n_new - 1) % eng->P) + 1 : 0,
		.hit_tokens = l->len0,
		.fence = h->onload_fence,
	};
}

int engine_lease_join(struct engine *eng, uint64_t id, uint32_t rank,
		      uint32_t owner, uint64_t max_pages, struct engine_lease *out,
		      struct errbuf *e)
{
	struct lease *l;
	uint32_t npages;
	int ret;

	if (eng->tp <= 1)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": this pool is not "
				  "tensor-parallel (tp = 1 in kvpool.conf); only "
				  "ranks > 0 of a tensor-parallel pool join leases",
				  id);
	if (!rank || rank >= eng->tp)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": rank %" PRIu32
				  " cannot join: rank 0 prepares, ranks 1 to %" PRIu32
				  " join", id, rank, eng->tp - 1);
	l = group_lookup(eng, id);
	if (!l && (id & SHARE_LEASE_BIT) && lease_lookup(eng, id))
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 " is not a history "
				  "lease nor a chunk fill lease nor a sequence's "
				  "write lease (a chunk read's or a composition's: "
				  "each rank takes its own); join the lease rank "
				  "0's kvp_prepare, kvp_chunk_register or "
				  "kvp_seq_alloc / create / extend returned", id);
	if (!l)
		return errbuf_set(e, -ESTALE, "lease %#" PRIx64 " is not held "
				  "(released, sealed, or never prepared); join rank "
				  "0's current lease", id);
	if (l->kind == LEASE_GROUP_ENDED)
		return ended_err(eng, l, id, e);
	if (l->grp->joined >> rank & 1)
		return errbuf_set(e, -EALREADY, "lease %#" PRIx64 ": rank %" PRIu32
				  " joined it already; a rank joins a lease once",
				  id, rank);
	if (!(l->grp->joined & 1) || l->grp->owner[0] != l->owner)
		return errbuf_set(e, -EPERM, "lease %#" PRIx64 " was not prepared "
				  "by rank 0 of this pool", id);
	npages = join_pages(eng, l);
	if (npages > max_pages)
		return errbuf_set(e, -EMSGSIZE, "lease %#" PRIx64 ": its page table "
				  "of %" PRIu32 " pages needs %zu bytes past the "
				  "header; raise out_len (and arena_bytes)", id,
				  npages, (size_t)npages * sizeof(int32_t));
	ret = engine_view_reserve(eng, npages, e);
	if (ret)
		return ret;
	if (l->kind == LEASE_CHUNK_FILL)
		share_chunk_join_out(eng, l, id, out);
	else if (l->kind == LEASE_SEQ_WRITE)
		share_seq_join_out(eng, l, id, out);
	else
		history_join_out(eng, l, id, npages, out);
	l->grp->joined |= 1u << rank;
	l->grp->members |= 1u << rank;
	l->grp->owner[rank] = owner;
	return 0;
}

int engine_commit_rank(struct engine *eng, uint64_t id, uint32_t rank,
		       uint32_t owner, uint32_t n, bool release, bool *left,
		       struct errbuf *e)
{
	struct lease *l = group_lookup(eng, id);
	struct lease_group *g;
	uint32_t of, n_new;

	*left = false;
	if (!l)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not held "
				  "(released, or never prepared)", id);
	g = l->grp;
	of = g->of;
	if (g->of == LEASE_CHUNK_FILL)
		return engine_chunk_seal_rank(eng, id, rank, owner, n, e);
	if (!is_member(l, rank, owner))
		return errbuf_set(e, -EPERM, "lease %#" PRIx64 ": this client (rank %"
				  PRIu32 ") does not hold it; rank 0 prepares, the "
				  "other ranks join it (kvp_lease_join) before they "
				  "commit", id, rank);
	if (l->kind == LEASE_GROUP_ENDED)
		return ended_err(eng, l, id, e); /* it leaves by its release */
	if ((g->committed >> rank & 1) || l->committed)
		return errbuf_set(e, -EALREADY, "lease %#" PRIx64 ": rank %" PRIu32
				  " has already committed it; prepare again for "
				  "more tokens", id, rank);
	n_new = of == LEASE_HISTORY ? l->n_new : l->seq->n_new;
	if (n > n_new)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": commit of %"
				  PRIu32 " tokens but only %" PRIu32 " were prepared",
				  id, n, n_new);
	if (g->committed && n != g->n)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": rank %" PRIu32
				  " commits %" PRIu32 " tokens but another rank "
				  "committed %" PRIu32 "; every rank commits the same "
				  "count", id, rank, n, g->n);
	g->committed |= 1u << rank;
	g->n = n;
	if (release)
		g->leave |= 1u << rank;
	*left = release;
	if (g->committed != all_ranks(eng))
		return ENGINE_COMMIT_PENDING;
	/* The last rank: the group's commit takes effect, as engine_commit
	 * (a sequence's as a tp = 1 commit of its write lease). */
	if (of == LEASE_HISTORY)
		engine_commit(eng, id, n, NULL);
	else
		share_lease_commit(eng, l, id, n, NULL);
	for (uint32_t r = 0; r < eng->tp && l->kind == of; r++)
		if ((g->leave >> r & 1) && (g->members >> r & 1))
			member_leave(eng, l, r); /* the last frees l */
	return 0;
}

/*
 * A chunk fill lease's group seals (kvp_chunk_seal, or a commit of all its
 * tokens): a rank's seal is its last word on the entry, so it leaves the
 * group at once (its release or death after that ends nothing); the last
 * rank's seal makes the entry READY and ends the lease, as a tp = 1 seal.
 */
int engine_chunk_seal_rank(struct engine *eng, uint64_t id, uint32_t rank,
			   uint32_t owner, uint32_t n, struct errbuf *e)
{
	struct lease *l = group_lookup(eng, id);
	struct lease_group *g;
	int ret;

	/* Not a sequence's write lease either: l->seq is no chunk. */
	if (!l || l->grp->of != LEASE_CHUNK_FILL)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not a chunk "
				  "fill lease held now (sealed and released "
				  "already, never registered, or a sequence's: "
				  "commit that)", id);
	g = l->grp;
	if ((g->committed >> rank & 1) && g->owner[rank] == owner)
		return errbuf_set(e, -EALREADY, "lease %#" PRIx64 ": rank %" PRIu32
				  " has sealed it already; the entry is ready once "
				  "every rank has sealed", id, rank);
	if (!is_member(l, rank, owner))
		return errbuf_set(e, -EPERM, "lease %#" PRIx64 ": this client (rank %"
				  PRIu32 ") does not hold it; rank 0 registers the "
				  "chunk, the other ranks join its fill lease "
				  "(kvp_lease_join) before they seal", id, rank);
	if (l->kind == LEASE_GROUP_ENDED)
		return ended_err(eng, l, id, e); /* it leaves by its release */
	if (n != UINT32_MAX && n != l->chunk->tokens)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": a chunk seals "
				  "whole: commit all %" PRIu32 " tokens, not %" PRIu32,
				  id, l->chunk->tokens, n);
	g->committed |= 1u << rank;
	if (g->committed != all_ranks(eng)) {
		g->members &= ~(1u << rank);
		return ENGINE_COMMIT_PENDING;
	}
	/* The last rank: sealed and ended as share_chunk_seal does. */
	ret = share_lease_commit(eng, l, id, l->chunk->tokens, e);
	if (ret)
		return ret;
	lease_release(eng, l);
	return 0;
}

int engine_release_rank(struct engine *eng, uint64_t id, uint32_t rank,
			uint32_t owner, bool *left, struct errbuf *e)
{
	struct lease *l = group_lookup(eng, id);

	*left = false;
	if (!l)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not held "
				  "(released already, or never prepared)", id);
	if (!is_member(l, rank, owner))
		return errbuf_set(e, -EPERM, "lease %#" PRIx64 ": this client (rank %"
				  PRIu32 ") does not hold it; only a rank that "
				  "prepared or joined a lease may end it", id, rank);
	*left = true;
	if (l->kind == LEASE_GROUP_ENDED || l->committed)
		member_leave(eng, l, rank);
	else if (l->grp->committed >> rank & 1)
		l->grp->leave |= 1u << rank; /* its part is done: the group goes on */
	else
		group_end(eng, l, rank, false);
	return 0;
}

bool lease_group_owner_gone(struct engine *eng, struct lease *l, uint32_t owner)
{
	for (uint32_t r = 0; r < eng->tp; r++) {
		if (!is_member(l, r, owner))
			continue;
		if (l->kind == LEASE_GROUP_ENDED || l->committed)
			member_leave(eng, l, r);
		else
			group_end(eng, l, r, true);
		return true; /* a client is one rank */
	}
	return false;
}
