/* SPDX-License-Identifier: MIT */
/*
 * prefix_workload.c - generate the multi-turn, RAG and multi-agent traces of
 * `kvbench prefix` from a seed, and compute the best hit rate of each
 * exactly (prefix_workload.h says what "best" means).
 *
 * Everything comes from one splitmix64 stream per workload, so a seed gives
 * the same trace on every machine. Nothing here touches a pool. The Belady
 * simulation of a trace (its best hit rate with a pool of a given size) is
 * at the end.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "prefix_workload.h"

/* Lengths in tokens (WORKLOADS.md section 2). */
#define SYS_MIN 250
#define SYS_MAX 350
#define CTX_MIN 200
#define CTX_MAX 2000
#define NCTX_MIN 3
#define NCTX_MAX 8
#define QUERY_MIN 20
#define QUERY_MAX 200
#define USER_MIN 20
#define USER_MAX 200
#define REPLY_MIN 50
#define REPLY_MAX 400
#define AGENT_SYS_MIN 200
#define AGENT_SYS_MAX 800
#define PROJECT_MIN 1000
#define PROJECT_MAX 4000
#define AGENTS_MIN 3
#define AGENTS_MAX 8

static uint64_t mix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint32_t uniform(uint64_t *rng, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(mix64(rng) % ((uint64_t)hi - lo + 1));
}

static double unit(uint64_t *rng)
{
	return (double)(mix64(rng) >> 11) * 0x1p-53;
}

static void random_tokens(uint64_t *rng, uint32_t *out, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		out[i] = (uint32_t)(mix64(rng) % PW_VOCAB);
}

/* ------------------------------------------------------------ page trie */

/*
 * The pages an unbounded prefix cache holds: node = (parent node, the P
 * token ids of the page), root 0. Open addressing; token ids are compared,
 * so the best hit rate does not depend on a hash being collision-free.
 */
struct trie_slot {
	uint32_t node;            /* 0: empty */
	uint32_t parent;
	const uint32_t *tok;
};

struct trie {
	struct trie_slot *slot;
	uint64_t mask;
	uint32_t nodes;
	uint32_t P;
};

static int trie_init(struct trie *t, uint64_t max_nodes, uint32_t P)
{
	uint64_t cap = 16;

	while (cap < 2 * max_nodes + 2)
		cap <<= 1;
	t->slot = calloc(cap, sizeof(*t->slot));
	t->mask = cap - 1;
	t->nodes = 0;
	t->P = P;
	return t->slot ? 0 : -ENOMEM;
}

static uint64_t trie_hash(uint32_t parent, const uint32_t *tok, uint32_t P)
{
	uint64_t h = parent * 0x9e3779b97f4a7c15ull + 1;

	for (uint32_t i = 0; i < P; i++) {
		h ^= tok[i];
		h *= 0x100000001b3ull;
		h ^= h >> 29;
	}
	return h;
}

/* The child of parent for page tok, inserted when insert; 0 when absent. */
static uint32_t trie_child(struct trie *t, uint32_t parent, const uint32_t *tok,
			   bool insert)
{
	uint64_t i = trie_hash(parent, tok, t->P) & t->mask;

	for (;; i = (i + 1) & t->mask) {
		struct trie_slot *s = &t->slot[i];

		if (!s->node)
			break;
		if (s->parent == parent && !memcmp(s->tok, tok, t->P * sizeof(*tok)))
			return s->node;
	}
	if (!insert)
		return 0;
	t->slot[i].node = ++t->nodes;
	t->slot[i].parent = parent;
	t->slot[i].tok = tok;
	return t->nodes;
}

/* ------------------------------------------------------------ multi-turn */

static int gen_multiturn(struct pw_multiturn *mt, const struct pw_params *p,
			 char *err, size_t errlen)
{
	uint64_t rng = p->seed ^ 0x6d756c74692d7475ull; /* "multi-tu" */
	uint32_t nsys = p->mt_systems ? p->mt_systems : 1;
	uint32_t **sys = calloc(nsys, sizeof(*sys)), *syslen = calloc(nsys, sizeof(*syslen));
	uint32_t *active = NULL, *next_turn = NULL, nactive, started;
	uint64_t total_pages = 0, k = 0;
	struct trie trie = { 0 };
	int rc = -ENOMEM;

	memset(mt, 0, sizeof(*mt));
	mt->nconv = p->conversations;
	mt->conv = calloc(mt->nconv, sizeof(*mt->conv));
	if (!sys || !syslen || !mt->conv)
		goto out;
	for (uint32_t s = 0; s < nsys; s++) {
		syslen[s] = uniform(&rng, SYS_MIN, SYS_MAX);
		sys[s] = malloc(syslen[s] * sizeof(**sys));
		if (!sys[s])
			goto out;
		random_tokens(&rng, sys[s], syslen[s]);
	}
	for (uint32_t c = 0; c < mt->nconv; c++) {
		struct pw_conv *cv = &mt->conv[c];
		uint32_t s = uniform(&rng, 0, nsys - 1), cap;

		cv->nturns = uniform(&rng, p->turns_min, p->turns_max);
		cap = syslen[s] + cv->nturns * (USER_MAX + REPLY_MAX);
		cv->tokens = malloc(cap * sizeof(*cv->tokens));
		cv->prompt_end = malloc(cv->nturns * sizeof(*cv->prompt_end));
		cv->reply_end = malloc(cv->nturns * sizeof(*cv->reply_end));
		cv->page_node = calloc(cap / p->page_tokens + 1, sizeof(*cv->page_node));
		if (!cv->tokens || !cv->prompt_end || !cv->reply_end || !cv->page_node)
			goto out;
		memcpy(cv->tokens, sys[s], syslen[s] * sizeof(*cv->tokens));
		cv->len = syslen[s];
		for (uint32_t t = 0; t < cv->nturns; t++) {
			uint32_t u = uniform(&rng, USER_MIN, USER_MAX);
			uint32_t r = uniform(&rng, REPLY_MIN, REPLY_MAX);

			random_tokens(&rng, cv->tokens + cv->len, u + r);
			cv->prompt_end[t] = cv->len + u;
			cv->reply_end[t] = cv->len + u + r;
			cv->len += u + r;
		}
		mt->nturns += cv->nturns;
		total_pages += cv->len / p->page_tokens;
		if (pw_pages(cv->len, p->page_tokens) > mt->max_pages)
			mt->max_pages = (uint32_t)pw_pages(cv->len, p->page_tokens);
	}

	/* Replay order: `active` conversations in flight, the next turn from
	 * one of them at random; a finished one makes room for the next. */
	mt->order = malloc((mt->nturns ? mt->nturns : 1) * sizeof(*mt->order));
	nactive = mt->nconv < p->active ? mt->nconv : p->active;
	active = malloc((nactive ? nactive : 1) * sizeof(*active));
	next_turn = calloc(mt->nconv ? mt->nconv : 1, sizeof(*next_turn));
	if (!mt->order || !active || !next_turn || trie_init(&trie, total_pages, p->page_tokens))
		goto out;
	for (started = 0; started < nactive; started++)
		active[started] = started;
	while (nactive) {
		uint32_t a = uniform(&rng, 0, nactive - 1), c = active[a];

		mt->order[k].conv = c;
		mt->order[k++].turn = next_turn[c]++;
		if (next_turn[c] == mt->conv[c].nturns)
			active[a] = started < mt->nconv ? started++ : active[--nactive];
	}

	/* The best hit of each turn against every page published before it. */
	for (k = 0; k < mt->nturns; k++) {
		struct pw_turn *tu = &mt->order[k];
		const struct pw_conv *cv = &mt->conv[tu->conv];
		uint32_t n = cv->prompt_end[tu->turn], P = p->page_tokens;
		uint32_t cap_pages = n / P, node = 0, j;

		for (j = 0; j < cap_pages; j++) {
			node = trie_child(&trie, node, cv->tokens + (uint64_t)j * P, false);
			if (!node)
				break;
		}
		/* Seed 004, as kvpool reports it: a prompt cached whole
		 * counts n - 1 (its last token is computed for the logits). */
		tu->best = j * P < n ? j * P : n - 1;
		mt->best_tokens += tu->best;
		mt->tokens_needed += n;
		node = 0;
		for (j = 0; j < cv->reply_end[tu->turn] / P; j++) {
			node = trie_child(&trie, node, cv->tokens + (uint64_t)j * P, true);
			cv->page_node[j] = node;
		}
	}
	mt->footprint_pages = trie.nodes;
	rc = 0;
out:
	if (rc)
		snprintf(err, errlen, "multi-turn trace: out of memory");
	for (uint32_t s = 0; sys && s < nsys; s++)
		free(sys[s]);
	free(sys);
	free(syslen);
	free(active);
	free(next_turn);
	free(trie.slot);
	return rc;
}

/* ------------------------------------------------------------ chunks */

static uint32_t add_chunk(struct pw_chunks *cs, uint64_t *rng, uint32_t type,
			  uint32_t lo, uint32_t hi)
{
	struct pw_chunk *c = &cs->chunk[cs->nchunks];

	c->seed = mix64(rng);
	c->tokens = uniform(rng, lo, hi);
	c->type = type;
	if (c->tokens > cs->max_chunk_tokens)
		cs->max_chunk_tokens = c->tokens;
	return cs->nchunks++;
}

void pw_chunk_tokens(const struct pw_chunks *cs, uint32_t i, uint32_t *out)
{
	const struct pw_chunk *c = &cs->chunk[i];
	uint64_t rng = c->seed;

	/* Two index tokens first: distinct chunks never have equal content. */
	out[0] = i % PW_VOCAB;
	out[1] = (i / PW_VOCAB) % PW_VOCAB;
	random_tokens(&rng, out + 2, c->tokens - 2);
}

/* Account request r: its tokens, its best hit (chunks seen before) and its
 * pages; seen[] marks chunks used so far. */
static void account_request(struct pw_chunks *cs, struct pw_creq *r, uint8_t *seen,
			    uint32_t P)
{
	uint64_t pages = 0;

	for (uint32_t k = 0; k < r->nctx + 2; k++) {
		uint32_t i = k == 0 ? r->system : k == 1 ? r->query : cs->ctx[r->ctx_off + k - 2];
		const struct pw_chunk *c = &cs->chunk[i];

		r->tokens += c->tokens;
		pages += pw_pages(c->tokens, P);
		if (seen[i])
			r->best += c->tokens;
		else if (c->type != KVP_CHUNK_QUERY)
			cs->footprint_pages += pw_pages(c->tokens, P);
		seen[i] = 1;
	}
	cs->tokens_needed += r->tokens;
	cs->best_tokens += r->best;
	if (pages > cs->max_request_pages)
		cs->max_request_pages = pages;
}

static int chunks_alloc(struct pw_chunks *cs, uint64_t nchunks, uint64_t nreq,
			uint64_t nctx)
{
	cs->chunk = calloc(nchunks, sizeof(*cs->chunk));
	cs->req = calloc(nreq ? nreq : 1, sizeof(*cs->req));
	cs->ctx = calloc(nctx ? nctx : 1, sizeof(*cs->ctx));
	return cs->chunk && cs->req && cs->ctx ? 0 : -ENOMEM;
}

/* The next Zipf(s) rank in [0, n) by the cumulative weights cdf[]. */
static uint32_t zipf_draw(const double *cdf, uint32_t n, uint64_t *rng)
{
	double u = unit(rng) * cdf[n - 1];
	uint32_t lo = 0, hi = n - 1;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int gen_rag(struct pw_chunks *cs, const struct pw_params *p, char *err,
		   size_t errlen)
{
	uint64_t rng = p->seed ^ 0x7261672d6c696272ull; /* "rag-libr" */
	uint32_t L = p->library, nq = p->rag_requests;
	double *cdf = malloc(L * sizeof(*cdf)), acc = 0;
	uint8_t *seen = NULL;
	int rc = -ENOMEM;

	memset(cs, 0, sizeof(*cs));
	cs->name = "rag";
	if (!cdf || chunks_alloc(cs, 1 + (uint64_t)L + nq + 8, nq, (uint64_t)nq * NCTX_MAX))
		goto out;
	add_chunk(cs, &rng, KVP_CHUNK_SYSTEM, SYS_MIN, SYS_MAX);
	for (uint32_t i = 0; i < L; i++) {
		add_chunk(cs, &rng, KVP_CHUNK_CONTEXT, CTX_MIN, CTX_MAX);
		acc += 1.0 / pow((double)i + 1, p->zipf_s);
		cdf[i] = acc;
	}
	for (uint32_t q = 0; q < nq; q++) {
		struct pw_creq *r = &cs->req[q];
		uint32_t want = uniform(&rng, NCTX_MIN, NCTX_MAX);

		if (want > L)
			want = L;
		r->system = 0;
		r->ctx_off = (uint32_t)cs->nctx;
		while (r->nctx < want) {
			uint32_t c = 1 + zipf_draw(cdf, L, &rng), k;

			for (k = 0; k < r->nctx && cs->ctx[r->ctx_off + k] != c; k++)
				;
			if (k == r->nctx)
				cs->ctx[r->ctx_off + r->nctx++] = c;
		}
		cs->nctx += r->nctx;
		r->query = add_chunk(cs, &rng, KVP_CHUNK_QUERY, QUERY_MIN, QUERY_MAX);
	}
	cs->nreq = nq;
	seen = calloc(cs->nchunks + 8, 1);
	if (!seen)
		goto out;
	for (uint32_t q = 0; q < nq; q++)
		account_request(cs, &cs->req[q], seen, p->page_tokens);

	/* The compose-latency set: the system, the most popular contexts and
	 * fresh queries (made after the trace's, so the trace is unchanged). */
	cs->compose_system = 0;
	cs->compose_pages = pw_pages(cs->chunk[0].tokens, p->page_tokens);
	cs->ncompose_ctx = L < 16 ? L : 16;
	for (uint32_t i = 0; i < cs->ncompose_ctx; i++) {
		cs->compose_ctx[i] = 1 + i;
		cs->compose_pages += pw_pages(cs->chunk[1 + i].tokens, p->page_tokens);
	}
	cs->ncompose_query = 8;
	for (uint32_t i = 0; i < cs->ncompose_query; i++) {
		cs->compose_query[i] = add_chunk(cs, &rng, KVP_CHUNK_QUERY, QUERY_MIN, QUERY_MAX);
		cs->compose_pages += pw_pages(cs->chunk[cs->compose_query[i]].tokens,
					      p->page_tokens);
	}
	rc = 0;
out:
	if (rc)
		snprintf(err, errlen, "RAG trace: out of memory");
	free(cdf);
	free(seen);
	return rc;
}

static int gen_agents(struct pw_chunks *cs, const struct pw_params *p, char *err,
		      size_t errlen)
{
	uint64_t rng = p->seed ^ 0x6167656e74732d2dull; /* "agents--" */
	uint32_t P = p->projects, nq = p->agent_requests;
	uint32_t *first = malloc(P * sizeof(*first)), *nag = malloc(P * sizeof(*nag));
	uint8_t *seen = NULL;
	int rc = -ENOMEM;

	memset(cs, 0, sizeof(*cs));
	cs->name = "agents";
	if (!first || !nag ||
	    chunks_alloc(cs, (uint64_t)P * (1 + AGENTS_MAX) + nq, nq, nq))
		goto out;
	/* Project p: its context chunk at first[p], its agents after it. */
	for (uint32_t j = 0; j < P; j++) {
		first[j] = add_chunk(cs, &rng, KVP_CHUNK_CONTEXT, PROJECT_MIN, PROJECT_MAX);
		nag[j] = uniform(&rng, AGENTS_MIN, AGENTS_MAX);
		for (uint32_t a = 0; a < nag[j]; a++)
			add_chunk(cs, &rng, KVP_CHUNK_SYSTEM, AGENT_SYS_MIN, AGENT_SYS_MAX);
	}
	for (uint32_t q = 0; q < nq; q++) {
		struct pw_creq *r = &cs->req[q];
		uint32_t j = uniform(&rng, 0, P - 1);

		r->system = first[j] + 1 + uniform(&rng, 0, nag[j] - 1);
		r->ctx_off = (uint32_t)cs->nctx;
		r->nctx = 1;
		cs->ctx[cs->nctx++] = first[j];
		r->query = add_chunk(cs, &rng, KVP_CHUNK_QUERY, QUERY_MIN, QUERY_MAX);
	}
	cs->nreq = nq;
	seen = calloc(cs->nchunks, 1);
	if (!seen)
		goto out;
	for (uint32_t q = 0; q < nq; q++)
		account_request(cs, &cs->req[q], seen, p->page_tokens);
	rc = 0;
out:
	if (rc)
		snprintf(err, errlen, "multi-agent trace: out of memory");
	free(first);
	free(nag);
	free(seen);
	return rc;
}

/* ------------------------------------------------------------ trace */

int pw_generate(struct pw_trace *t, const struct pw_params *p, char *err,
		size_t errlen)
{
	int rc = 0;

	memset(t, 0, sizeof(*t));
	t->p = *p;
	if (!p->page_tokens || (p->conversations && (!p->active || !p->turns_min ||
						       p->turns_min > p->turns_max)) ||
	    (p->rag_requests && (!p->library || !(p->zipf_s >= 0))) ||
	    (p->agent_requests && !p->projects)) {
		snprintf(err, errlen, "workload parameters out of range");
		return -EINVAL;
	}
	if (p->conversations)
		rc = gen_multiturn(&t->mt, p, err, errlen);
	if (!rc && p->rag_requests)
		rc = gen_rag(&t->rag, p, err, errlen);
	if (!rc && p->agent_requests)
		rc = gen_agents(&t->agents, p, err, errlen);
	if (rc)
		pw_free(t);
	return rc;
}

static void chunks_free(struct pw_chunks *cs)
{
	free(cs->chunk);
	free(cs->req);
	free(cs->ctx);
	memset(cs, 0, sizeof(*cs));
}

void pw_free(struct pw_trace *t)
{
	for (uint32_t c = 0; t->mt.conv && c < t->mt.nconv; c++) {
		free(t->mt.conv[c].tokens);
		free(t->mt.conv[c].prompt_end);
		free(t->mt.conv[c].reply_end);
		free(t->mt.conv[c].page_node);
	}
	free(t->mt.conv);
	free(t->mt.order);
	memset(&t->mt, 0, sizeof(t->mt));
	chunks_free(&t->rag);
	chunks_free(&t->agents);
}

/* ------------------------------------------------------------ Belady */

/*
 * MIN with a lazy max-heap of (next use, depth, page): an entry is live
 * while its page is cached, not pinned by the request being served, and
 * its next use is still the page's (every touch pushes a fresh entry with a
 * later next use, so older entries of the page go stale by themselves).
 */
#define NEVER UINT32_MAX

struct bel_entry {
	uint32_t next;            /* the request that touches the page next */
	uint32_t depth;           /* its position in its chain */
	uint32_t page;
};

struct bel {
	struct bel_entry *heap;
	uint64_t nheap;
	uint32_t *next;           /* per page: the next use of its live entry */
	uint32_t *pin;            /* per page: request + 1 while it is served */
	uint8_t *cached;
	uint64_t ncached;
};

static bool bel_above(const struct bel_entry *a, const struct bel_entry *b)
{
	if (a->next != b->next)
		return a->next > b->next;
	if (a->depth != b->depth)
		return a->depth > b->depth;
	return a->page > b->page;
}

static void bel_push(struct bel *b, uint32_t next, uint32_t depth, uint32_t page)
{
	uint64_t i = b->nheap++;

	while (i) {
		uint64_t up = (i - 1) / 2;
		struct bel_entry e = { next, depth, page };

		if (!bel_above(&e, &b->heap[up]))
			break;
		b->heap[i] = b->heap[up];
		i = up;
	}
	b->heap[i] = (struct bel_entry){ next, depth, page };
}

static struct bel_entry bel_pop(struct bel *b)
{
	struct bel_entry top = b->heap[0], last = b->heap[--b->nheap];
	uint64_t i = 0;

	for (;;) {
		uint64_t c = 2 * i + 1;

		if (c >= b->nheap)
			break;
		if (c + 1 < b->nheap && bel_above(&b->heap[c + 1], &b->heap[c]))
			c++;
		if (!bel_above(&b->heap[c], &last))
			break;
		b->heap[i] = b->heap[c];
		i = c;
	}
	if (b->nheap)
		b->heap[i] = last;
	return top;
}

/* Drop the page used farthest in the future; -ENOSPC when every cached
 * page is pinned by the request being served (stamp). */
static int bel_evict(struct bel *b, uint32_t stamp)
{
	while (b->nheap) {
		struct bel_entry e = bel_pop(b);

		if (b->cached[e.page] && b->pin[e.page] != stamp &&
		    b->next[e.page] == e.next) {
			b->cached[e.page] = 0;
			b->ncached--;
			return 0;
		}
	}
	return -ENOSPC;
}

/* Hits of request r's uses [u0, u1), against the cache before it. */
static uint64_t bel_hits(const struct bel *b, const struct pw_bel_use *u,
			 uint64_t u0, uint64_t u1)
{
	uint64_t hit = 0;

	for (uint64_t k = u0; k < u1; k++) {
		uint32_t j = 0;

		while (j < u[k].lookup && b->cached[u[k].page[j]])
			j++;
		if (!u[k].whole) {
			uint64_t h = (uint64_t)j * u[k].tokens;

			/* The prompt cached whole: its last token is computed. */
			hit += u[k].limit && h >= u[k].limit ? u[k].limit - 1 : h;
		}
		else if (j && j == u[k].lookup)
			hit += u[k].tokens;
	}
	return hit;
}

int pw_belady(const struct pw_bel_use *u, uint64_t n, uint32_t npage_ids,
	      uint64_t capacity, uint64_t *hit_tokens)
{
	struct bel b = { 0 };
	uint32_t *next_use = NULL, *last = NULL;
	uint64_t touches = 0, pos, u0, u1;
	int rc = -ENOMEM;

	*hit_tokens = 0;
	for (uint64_t k = 0; k < n; k++)
		touches += u[k].npages;
	next_use = malloc((touches ? touches : 1) * sizeof(*next_use));
	last = malloc((npage_ids ? npage_ids : 1) * sizeof(*last));
	b.heap = malloc((touches ? touches : 1) * sizeof(*b.heap));
	b.next = calloc(npage_ids ? npage_ids : 1, sizeof(*b.next));
	b.pin = calloc(npage_ids ? npage_ids : 1, sizeof(*b.pin));
	b.cached = calloc(npage_ids ? npage_ids : 1, 1);
	if (!next_use || !last || !b.heap || !b.next || !b.pin || !b.cached)
		goto out;

	/* Backwards: each touch's next use is the request that touches the
	 * page after it. */
	for (uint32_t p = 0; p < npage_ids; p++)
		last[p] = NEVER;
	pos = touches;
	for (uint64_t k = n; k-- > 0;) {
		pos -= u[k].npages;
		for (uint32_t j = 0; j < u[k].npages; j++) {
			next_use[pos + j] = last[u[k].page[j]];
			last[u[k].page[j]] = u[k].request;
		}
	}

	pos = 0;
	for (u0 = 0; u0 < n; u0 = u1) {
		const uint32_t r = u[u0].request, stamp = r + 1;

		for (u1 = u0; u1 < n && u[u1].request == r; u1++)
			;
		*hit_tokens += bel_hits(&b, u, u0, u1);
		for (uint64_t k = u0; k < u1; k++)
			for (uint32_t j = 0; j < u[k].npages; j++)
				b.pin[u[k].page[j]] = stamp;
		/* Demand paging: every page of the request is brought in, each
		 * miss evicting the farthest-used unpinned page. */
		for (uint64_t k = u0; k < u1; k++) {
			for (uint32_t j = 0; j < u[k].npages; j++) {
				uint32_t pg = u[k].page[j];

				if (b.cached[pg])
					continue;
				if (b.ncached >= capacity && (rc = bel_evict(&b, stamp)))
					goto out;
				b.cached[pg] = 1;
				b.ncached++;
			}
		}
		for (uint64_t k = u0; k < u1; k++) {
			for (uint32_t j = 0; j < u[k].npages; j++, pos++) {
				b.next[u[k].page[j]] = next_use[pos];
				bel_push(&b, next_use[pos], j, u[k].page[j]);
			}
		}
	}
	rc = 0;
out:
	free(next_use);
	free(last);
	free(b.heap);
	free(b.next);
	free(b.pin);
	free(b.cached);
	return rc;
}

int pw_belady_multiturn(const struct pw_multiturn *mt, uint32_t P,
			uint64_t capacity, uint64_t *hit_tokens)
{
	struct pw_bel_use *u = malloc((2 * mt->nturns + 1) * sizeof(*u));
	uint32_t *tail = malloc((mt->nturns + 1) * sizeof(*tail));
	uint32_t nodes = 0;
	uint64_t n = 0;
	int rc = -ENOMEM;

	*hit_tokens = 0;
	if (!u || !tail)
		goto out;
	for (uint32_t c = 0; c < mt->nconv; c++)
		for (uint32_t j = 0; j < mt->conv[c].len / P; j++)
			if (mt->conv[c].page_node[j] > nodes)
				nodes = mt->conv[c].page_node[j];
	for (uint64_t k = 0; k < mt->nturns; k++) {
		const struct pw_conv *cv = &mt->conv[mt->order[k].conv];
		uint32_t t = mt->order[k].turn, np = cv->prompt_end[t];

		/* The conversation's full pages to the end of the reply... */
		u[n++] = (struct pw_bel_use){
			.request = (uint32_t)k, .npages = cv->reply_end[t] / P,
			.page = cv->page_node, .lookup = np / P,
			.tokens = P, .limit = np,
		};
		/* ...and the partial last page the sequence holds meanwhile
		 * (its own, never seen again). */
		if (cv->reply_end[t] % P) {
			tail[k] = nodes + 1 + (uint32_t)k;
			u[n++] = (struct pw_bel_use){
				.request = (uint32_t)k, .npages = 1, .page = &tail[k],
			};
		}
	}
	rc = pw_belady(u, n, nodes + 1 + (uint32_t)mt->nturns, capacity, hit_tokens);
out:
	free(u);
	free(tail);
	return rc;
}

int pw_belady_chunks(const struct pw_chunks *cs, uint32_t P, uint64_t capacity,
		     uint64_t *hit_tokens)
{
	uint64_t *first = malloc((cs->nchunks + 1) * sizeof(*first));
	struct pw_bel_use *u = malloc((cs->nctx + 2 * (uint64_t)cs->nreq + 1) * sizeof(*u));
	uint32_t *ids = NULL;
	uint64_t npages = 0, n = 0;
	int rc = -ENOMEM;

	*hit_tokens = 0;
	if (!first || !u)
		goto out;
	/* Chunk i's pages are ids first[i] .. first[i] + pages - 1. */
	for (uint32_t i = 0; i < cs->nchunks; i++) {
		first[i] = npages;
		npages += pw_pages(cs->chunk[i].tokens, P);
	}
	if (npages >= UINT32_MAX) {
		rc = -E2BIG;
		goto out;
	}
	ids = malloc((npages ? npages : 1) * sizeof(*ids));
	if (!ids)
		goto out;
	for (uint64_t p = 0; p < npages; p++)
		ids[p] = (uint32_t)p;
	for (uint32_t q = 0; q < cs->nreq; q++) {
		const struct pw_creq *r = &cs->req[q];

		for (uint32_t k = 0; k < r->nctx + 2; k++) {
			uint32_t i = k == 0 ? r->system : k == r->nctx + 1 ? r->query :
				     cs->ctx[r->ctx_off + k - 1];
			uint32_t pages = (uint32_t)pw_pages(cs->chunk[i].tokens, P);

			u[n++] = (struct pw_bel_use){
				.request = q, .npages = pages, .page = ids + first[i],
				.lookup = pages, .whole = 1, .tokens = cs->chunk[i].tokens,
			};
		}
	}
	rc = pw_belady(u, n, (uint32_t)npages, capacity, hit_tokens);
out:
	free(first);
	free(u);
	free(ids);
	return rc;
}
