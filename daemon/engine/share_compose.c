/* SPDX-License-Identifier: MIT */
/*
 * share_compose.c - cascade page tables for a batch of chunk compositions
 * (seeds 001/003), as FlashInfer's MultiLevelCascadeAttentionWrapper takes
 * them: per level one CSR set (qo_indptr, kv_indptr, kv_indices,
 * kv_last_page_len), the query rows split into groups that share that
 * level's KV.
 *
 *   level 0       the system entries;
 *   level 1..C    context k of each request (an empty group where a request
 *                 has fewer than k contexts);
 *   level C+1     each request's query entry.
 *
 * A request is a chain of entries (kvpool.h "Chunks"): the system a root,
 * each context linked after the entry before it, the query after the last
 * one; resolve() checks it. At every level one group per run of
 * consecutive requests with the same entry: because entries chain, the
 * same entry at level k means the same prefix, so a context shared by
 * several requests is one cascade node (its KV read once for all of them).
 *
 * Contexts get a level each, not one level together, because a CSR row may
 * end mid-page only at its last page and entries end wherever their tokens
 * do. Nothing is copied: every index names an entry's own frame.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "share_internal.h"

static const char *const role_name[] = { "system", "context", "query" };

/*
 * The entry of request r at position k of its chain (role want), whose
 * parent must be prev (NULL: a root). id may be a name for the system: its
 * root entry.
 */
static int resolve(struct engine *eng, const struct kvp_chunk_id *id,
		   uint32_t want, uint32_t r, uint32_t k, struct chunk *prev,
		   struct chunk **out, struct errbuf *e)
{
	struct chunk *c = want == KVP_CHUNK_SYSTEM ? chunk_resolve(eng, id) :
			  chunk_find(eng, id);
	const char *role = role_name[want - 1];
	char sid[17], spar[17], sprev[17], what[32];

	chunk_id_short(id, sid);
	if (want == KVP_CHUNK_CONTEXT)
		snprintf(what, sizeof(what), "context %" PRIu32, k);
	else
		snprintf(what, sizeof(what), "%s", role);
	eng->st.chunk_lookups++;
	if (!c)
		return errbuf_set(e, -ENOENT, "request %" PRIu32 ": %s entry %s"
				  " is not registered (never, or deleted, or "
				  "evicted); register it again", r, what, sid);
	if (c->state != KVP_CHUNK_READY)
		return errbuf_set(e, -EAGAIN, "request %" PRIu32 ": %s entry %s is "
				  "not ready (being filled); retry after it seals",
				  r, what, sid);
	if (c->type != want)
		return errbuf_set(e, -EINVAL, "request %" PRIu32 ": entry %s is a %s "
				  "chunk, given as the %s: incompatible chunks (each "
				  "request takes one system, its contexts and one "
				  "query)", r, sid, kvp_chunk_type_name(c->type), what);
	if (c->parent != prev) {
		if (c->parent)
			chunk_id_short(&c->parent->id, spar);
		if (prev)
			chunk_id_short(&prev->id, sprev);
		if (!prev)
			return errbuf_set(e, -EINVAL, "request %" PRIu32 ": system "
					  "entry %s follows entry %s; the system "
					  "must be a root entry (kvp_chunk_put)", r,
					  sid, spar);
		return errbuf_set(e, -EINVAL, "request %" PRIu32 ": %s entry %s "
				  "%s%s, not after %s: the chain is broken; link it "
				  "after %s (kvp_chunk_link(name, %s))", r, what,
				  sid, c->parent ? "follows entry " : "is a root "
				  "entry (position 0)", c->parent ? spar : "",
				  sprev, sprev, sprev);
	}
	*out = c;
	return 0;
}

static int cmp_ptr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;

	return x < y ? -1 : x > y;
}

/* The chunk of request r at level lv (NULL: none there). */
static struct chunk *at_level(struct chunk **ch, const uint32_t *first,
			      const struct kvp_compose_req *reqs, uint32_t r,
			      uint32_t lv, uint32_t nlevels)
{
	if (lv == 0)
		return ch[first[r]];
	if (lv == nlevels - 1)
		return ch[first[r] + 1 + reqs[r].ncontexts];
	return lv - 1 < reqs[r].ncontexts ? ch[first[r] + lv] : NULL;
}

/* Resolve every request's chain into ch (first[r]: where request r's
 * system entry is). */
static int resolve_all(struct engine *eng, const struct kvp_compose_req *reqs,
		       uint32_t nreq, struct chunk **ch, uint32_t *first,
		       struct errbuf *e)
{
	int ret = 0;

	for (uint32_t r = 0, i = 0; r < nreq && !ret; r++) {
		first[r] = i;
		ret = resolve(eng, &reqs[r].system, KVP_CHUNK_SYSTEM, r, 0, NULL,
			      &ch[i], e);
		i++;
		for (uint32_t k = 0; k < reqs[r].ncontexts && !ret; k++, i++)
			ret = resolve(eng, &reqs[r].contexts[k], KVP_CHUNK_CONTEXT, r,
				      k, ch[i - 1], &ch[i], e);
		if (!ret)
			ret = resolve(eng, &reqs[r].query, KVP_CHUNK_QUERY, r, 0,
				      ch[i - 1], &ch[i], e);
		i++;
	}
	return ret;
}

/* Groups per level into out->ngroups; returns the ints the CSR sets take
 * (per level 3 * groups + 2, plus its indices). */
static uint64_t compose_sizes(struct chunk **ch, const uint32_t *first,
			      const struct kvp_compose_req *reqs, uint32_t nreq,
			      uint32_t nlevels, struct share_composition *out)
{
	uint64_t ints = 0;

	for (uint32_t lv = 0; lv < nlevels; lv++) {
		uint32_t g = 0;

		for (uint32_t r = 0; r < nreq; r++) {
			struct chunk *c = at_level(ch, first, reqs, r, lv, nlevels);

			if (c && r && c == at_level(ch, first, reqs, r - 1, lv,
						    nlevels))
				continue; /* same entry as the request before */
			g++;
			ints += c ? c->npages : 0;
		}
		out->ngroups[lv] = g;
		ints += 3 * (uint64_t)g + 2;
	}
	return ints;
}

/* The CSR sets of every level, in the scratch compose_sizes() sized. */
static void compose_fill(struct engine *eng, struct chunk **ch,
			 const uint32_t *first, const struct kvp_compose_req *reqs,
			 uint32_t nreq, uint32_t nlevels,
			 struct share_composition *out)
{
	uint64_t off = 0;

	for (uint32_t lv = 0; lv < nlevels; lv++) {
		int32_t *qo = eng->share->scratch + off, *kv = qo + out->ngroups[lv] + 1;
		int32_t *last = kv + out->ngroups[lv] + 1, *idx = last + out->ngroups[lv];
		uint32_t g = 0, rows = 0, pages = 0;

		qo[0] = kv[0] = 0;
		for (uint32_t r = 0; r < nreq; r++) {
			struct chunk *c = at_level(ch, first, reqs, r, lv, nlevels);
			uint32_t q = reqs[r].qo_len ? reqs[r].qo_len : 1;

			rows += q;
			if (c && r + 1 < nreq &&
			    at_level(ch, first, reqs, r + 1, lv, nlevels) == c)
				continue; /* the group goes on */
			for (uint32_t p = 0; c && p < c->npages; p++)
				idx[pages++] = (int32_t)c->frames[p];
			last[g] = c ? (int32_t)((c->tokens - 1) % eng->P) + 1 : 0;
			qo[++g] = (int32_t)rows;
			kv[g] = (int32_t)pages;
		}
		out->qo_indptr[lv] = qo;
		out->kv_indptr[lv] = kv;
		out->kv_last_page_len[lv] = last;
		out->kv_indices[lv] = idx;
		off += 3 * (uint64_t)out->ngroups[lv] + 2 + pages;
	}
}

/* The distinct entries of ch[total] into dist (sorted); their count. The
 * tokens, pages and bytes of the composition into out. */
static uint32_t compose_distinct(const struct engine *eng, struct chunk **ch,
				 uint32_t total, struct chunk **dist,
				 struct share_composition *out)
{
	uint32_t ndist = 0;

	for (uint32_t i = 0; i < total; i++)
		out->tokens += ch[i]->tokens;
	memcpy(dist, ch, total * sizeof(*ch));
	qsort(dist, total, sizeof(*dist), cmp_ptr);
	for (uint32_t i = 0; i < total; i++)
		if (!i || dist[i] != dist[i - 1]) {
			dist[ndist++] = dist[i];
			out->pages += dist[i]->npages;
		}
	out->bytes = out->pages * eng->layout.page_bytes;
	return ndist;
}

int share_compose(struct engine *eng, const struct kvp_compose_req *reqs,
		  uint32_t nreq, bool preview, uint32_t owner, uint64_t now_ns,
		  struct share_composition *out, struct errbuf *e)
{
	uint32_t maxc = 0, nlevels, total = 0, *first = NULL, ndist;
	struct chunk **ch = NULL, **dist = NULL;
	int ret = 0;

	if (!nreq || nreq > KVP_COMPOSE_MAX_REQUESTS)
		return errbuf_set(e, -EINVAL, "compose: %" PRIu32 " requests; give "
				  "1 to %d", nreq, KVP_COMPOSE_MAX_REQUESTS);
	for (uint32_t r = 0; r < nreq; r++) {
		if (reqs[r].ncontexts > KVP_COMPOSE_MAX_CONTEXTS)
			return errbuf_set(e, -EINVAL, "compose: request %" PRIu32
					  " has %" PRIu32 " contexts, at most %d", r,
					  reqs[r].ncontexts, KVP_COMPOSE_MAX_CONTEXTS);
		if (reqs[r].ncontexts > maxc)
			maxc = reqs[r].ncontexts;
		total += reqs[r].ncontexts + 2;
	}
	nlevels = maxc + 2;
	ch = malloc(total * sizeof(*ch));
	dist = malloc(total * sizeof(*dist));
	first = malloc(nreq * sizeof(*first));
	if (!ch || !dist || !first) {
		ret = errbuf_set(e, -ENOMEM, "compose: out of memory");
		goto out;
	}
	ret = resolve_all(eng, reqs, nreq, ch, first, e);
	if (ret)
		goto out;

	memset(out, 0, sizeof(*out));
	ret = share_scratch(eng, compose_sizes(ch, first, reqs, nreq, nlevels,
					       out), e);
	if (!ret && !preview)
		ret = lease_reserve(eng, e);
	if (ret)
		goto out;

	/* Nothing fails from here on. */
	compose_fill(eng, ch, first, reqs, nreq, nlevels, out);
	ndist = compose_distinct(eng, ch, total, dist, out);
	out->nlevels = nlevels;
	out->nrequests = nreq;
	for (uint32_t i = 0; i < total; i++)
		chunk_touch(eng, ch[i], now_ns);
	if (!preview) {
		struct lease *l;
		struct chunk **held = realloc(dist, ndist * sizeof(*held));

		if (held)
			dist = held;
		l = lease_new(eng, LEASE_COMPOSE, owner, &out->lease);
		l->comp.chunks = dist;
		l->comp.n = ndist;
		for (uint32_t i = 0; i < ndist; i++)
			chunk_hold(eng, dist[i]);
		dist = NULL; /* the lease owns it */
		eng->st.compositions++;
	}
out:
	free(ch);
	free(dist);
	free(first);
	return ret;
}
