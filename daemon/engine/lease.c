/* SPDX-License-Identifier: MIT */
/*
 * lease.c - the engine's one lease table (engine_internal.h): histories'
 * leases (prepare) and sharing's (sequence writes, chunk fills and reads,
 * compositions) in one array, one id space, one stale-id check
 * (lease_lookup) and one release path (lease_release).
 *
 * An id is gen << 32 | sharing << 31 | shard << 24 | slot. The slot's
 * generation is bumped on every reuse, so an id released (or never made)
 * misses; the shard bits route a commit or release to its shard (shard.h,
 * libkvpool's lanes); bit 31 marks sharing's leases, which live in shard
 * 0 with the shared world (proto.h KVP_LEASE_SHARED) and is checked
 * against the slot's kind, so a history id never names a sharing lease.
 */
#include <errno.h>
#include <stdlib.h>

#include "engine_internal.h"
#include "engine_share.h"

uint64_t lease_id(const struct engine *eng, const struct lease *l)
{
	uint32_t idx = (uint32_t)(l - eng->leases);

	return (uint64_t)l->gen << 32 |
	       (l->kind != LEASE_HISTORY ? SHARE_LEASE_BIT : 0) |
	       (uint64_t)eng->shard << LEASE_SHARD_SHIFT | idx;
}

struct lease *lease_lookup(struct engine *eng, uint64_t id)
{
	uint32_t idx = (uint32_t)id & (LEASE_MAX - 1);
	struct lease *l;

	if ((((uint32_t)id >> LEASE_SHARD_SHIFT) & 0x7f) != eng->shard ||
	    idx >= eng->leases_cap)
		return NULL;
	l = &eng->leases[idx];
	if (l->kind == LEASE_FREE || l->kind == LEASE_GROUP_ENDED ||
	    l->gen != (uint32_t)(id >> 32) ||
	    !!(id & SHARE_LEASE_BIT) != (l->kind != LEASE_HISTORY))
		return NULL;
	return l;
}

int lease_reserve(struct engine *eng, struct errbuf *e)
{
	uint32_t cap, old = eng->leases_cap;
	struct lease *l;

	if (eng->lease_free != UINT32_MAX)
		return 0;
	if (old >= LEASE_MAX)
		return errbuf_set(e, -ENOSPC, "%u leases are outstanding; release "
				  "leases before preparing more", LEASE_MAX);
	cap = old ? old * 2 : 64;
	l = realloc(eng->leases, (size_t)cap * sizeof(*l));
	if (!l)
		return errbuf_set(e, -ENOMEM, "out of memory for the lease table");
	eng->leases = l;
	for (uint32_t i = old; i < cap; i++)
		l[i] = (struct lease){ .kind = LEASE_FREE, .gen = 1,
				       .next_free = i + 1 };
	l[cap - 1].next_free = UINT32_MAX;
	eng->lease_free = old;
	eng->leases_cap = cap;
	return 0;
}

struct lease *lease_new(struct engine *eng, uint32_t kind, uint32_t owner,
			uint64_t *id)
{
	struct lease *l = &eng->leases[eng->lease_free];

	eng->lease_free = l->next_free;
	eng->leases_live++;
	if (kind == LEASE_HISTORY)
		eng->history_leases++;
	l->kind = kind;
	l->owner = owner;
	l->committed = false;
	l->grp = NULL; /* prepare_lease_out, a chunk fill and a sequence
			 * write (lease_group_attach) set a group's */
	*id = lease_id(eng, l);
	return l;
}

void lease_put(struct engine *eng, struct lease *l)
{
	free(l->grp);
	l->grp = NULL;
	if (l->kind == LEASE_HISTORY)
		eng->history_leases--;
	l->kind = LEASE_FREE;
	l->gen = l->gen + 1 ? l->gen + 1 : 1;
	l->next_free = eng->lease_free;
	eng->lease_free = (uint32_t)(l - eng->leases);
	eng->leases_live--;
}

void lease_release(struct engine *eng, struct lease *l)
{
	if (l->kind == LEASE_HISTORY)
		history_lease_end(eng, l);
	else
		share_lease_end(eng, l);
	lease_put(eng, l);
	eng->st.releases++;
}

uint32_t lease_release_owner(struct engine *eng, uint32_t owner)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < eng->leases_cap; i++) {
		struct lease *l = &eng->leases[i];

		if (l->grp) /* a group lease, or an ended one's record */
			n += lease_group_owner_gone(eng, l, owner);
		else if (l->kind != LEASE_FREE && l->owner == owner) {
			lease_release(eng, l);
			n++;
		}
	}
	return n;
}

void lease_release_sharing(struct engine *eng)
{
	for (uint32_t i = 0; i < eng->leases_cap; i++) {
		struct lease *l = &eng->leases[i];

		if (l->kind != LEASE_FREE && l->kind != LEASE_HISTORY &&
		    l->kind != LEASE_GROUP_ENDED)
			lease_release(eng, l);
	}
}
