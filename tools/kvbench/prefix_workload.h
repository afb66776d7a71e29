/* SPDX-License-Identifier: MIT */
/*
 * prefix_workload.h - the traces `kvbench prefix` replays (WORKLOADS.md
 * section 2), generated from a seed, and the best hit rate each allows.
 *
 * Two shapes of trace:
 *
 *  - multi-turn: conversations that grow turn by turn. A conversation starts
 *    with one of a few shared system prompts; turn t's prompt is everything
 *    before it (system, earlier user messages and replies) plus a new user
 *    message; its reply follows. A bounded number of conversations is in
 *    flight at once and the next turn is drawn from one of them at random,
 *    so turns of one conversation are interleaved with others' (what makes
 *    eviction matter).
 *
 *  - chunk requests (RAG and multi-agent): a table of chunks (system,
 *    context, query) and requests that each name one system chunk, some
 *    contexts and one query. RAG: one system prompt of 250-350 tokens, a
 *    library of contexts of 200-2,000 tokens drawn with Zipf popularity,
 *    3-8 distinct contexts and a fresh query of 20-200 tokens per request.
 *    Multi-agent: projects, each one context chunk of 1,000-4,000 tokens
 *    shared by 3-8 agents with system prompts of 200-800 tokens; a request
 *    is one agent of one project asking a fresh query.
 *
 * Token ids are in [0, 128256) (Llama-3's vocabulary). Every chunk begins
 * with two tokens that encode its index in the table, so no two chunks have
 * the same content: a chunk is reused exactly when its index recurs.
 *
 * THE BEST HIT RATE (exact, from the trace alone; an unbounded cache):
 *  - multi-turn: a turn's prompt of n tokens can be served at most the
 *    longest run of leading full pages that an earlier turn published (its
 *    prompt and reply, full pages only: what its sequence commits), capped
 *    at floor((n - 1) / P) pages (the last token is always computed).
 *    Computed with a trie of pages that compares token ids, not hashes.
 *  - chunk requests: every use of a system or context chunk after its first
 *    is served entirely; first uses and queries (all fresh) are not.
 * best_tokens / tokens_needed is the best hit rate.
 *
 * THE BELADY HIT RATE (the offline optimum for the pool's capacity;
 * pw_belady_*): an unbounded cache is out of reach for any policy with a
 * pool of C pages, so the trace is also replayed against Belady's MIN at
 * page granularity with the same C: on a miss with a full cache, evict the
 * page whose next use is farthest in the future (never: first), ties going
 * to the deeper page of its chain (a child before its parent, as the prefix
 * cache evicts leaves first). Pages are what the kvpool run keeps: a turn
 * touches its conversation's full pages up to the end of its reply (equal
 * content, equal page) and one page of its own for the partial last one; a
 * request touches every page of its chunks. A request's pages are pinned
 * while it is served (a sequence or a composition holds them), so they are
 * never the victim of its own misses. Hits are counted by the rule the
 * kvpool run counts them with:
 *  - multi-turn: a page is a hit only when it and every page before it in
 *    the prompt are cached (a hash chain: the lookup stops at the first
 *    miss); every full page of the prompt may hit, and a prompt cached
 *    whole counts n - 1 tokens (seed 004: its last token is computed), as
 *    for the best hit rate and as kvpool reports it;
 *  - chunk requests: a chunk is a hit only when every one of its pages is
 *    cached (it is served whole or filled again), all of its tokens then.
 * The leaves-first tie break keeps the cache closed under "parent of", so
 * the chain rule never throws away a cached page; for chunks, which are
 * the chain rule never throws away a cached page; for chunks, which are
 * units of several pages, page-granular MIN is the offline optimum's
 * standard stand-in (variable-size optimal caching is NP-hard), a very good
 * policy rather than a proven bound.
 * 0 <= belady_tokens <= best_tokens.
 */
#ifndef KVBENCH_PREFIX_WORKLOAD_H
#define KVBENCH_PREFIX_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#define PW_VOCAB 128256u

struct pw_params {
	uint64_t seed;
	uint32_t page_tokens;
	/* multi-turn (conversations 0: none) */
	uint32_t conversations;
	uint32_t active;          /* conversations in flight at once */
	uint32_t turns_min, turns_max;
	uint32_t mt_systems;      /* distinct system prompts they start with */
	/* RAG (rag_requests 0: none) */
	uint32_t rag_requests;
	uint32_t library;         /* context chunks */
	double zipf_s;
	/* multi-agent (agent_requests 0: none) */
	uint32_t agent_requests;
	uint32_t projects;
};

/* ------------------------------------------------------------ multi-turn */

struct pw_conv {
	uint32_t *tokens;         /* the whole conversation, every turn */
	uint32_t len;
	uint32_t nturns;
	uint32_t *prompt_end;     /* turn t's prompt: tokens [0, prompt_end[t]) */
	uint32_t *reply_end;      /* its reply: [prompt_end[t], reply_end[t]) */
	uint32_t *page_node;      /* full page j's id in the page trie (equal
				   * content and prefix, equal id: 1..nodes) */
};

struct pw_turn {
	uint32_t conv;
	uint32_t turn;
	uint32_t best;            /* tokens of this prompt an unbounded cache serves */
};

struct pw_multiturn {
	struct pw_conv *conv;
	uint32_t nconv;
	struct pw_turn *order;    /* the trace, in replay order */
	uint64_t nturns;
	uint64_t tokens_needed;   /* sum of prompt lengths */
	uint64_t best_tokens;     /* sum of order[].best */
	uint64_t footprint_pages; /* distinct full pages published over the trace */
	uint32_t max_pages;       /* the longest conversation's pages */
};

/* ------------------------------------------------------------ chunks */

struct pw_chunk {
	uint64_t seed;            /* the tokens after the two index tokens */
	uint32_t tokens;
	uint32_t type;            /* enum kvp_chunk_type */
};

struct pw_creq {
	uint32_t system;          /* chunk indices */
	uint32_t query;
	uint32_t ctx_off;         /* contexts: ctx[ctx_off, ctx_off + nctx) */
	uint32_t nctx;
	uint64_t tokens;          /* system + contexts + query */
	uint64_t best;            /* of those, what an unbounded cache serves */
};

struct pw_chunks {
	const char *name;         /* "rag", "agents" */
	struct pw_chunk *chunk;
	uint32_t nchunks;
	struct pw_creq *req;
	uint32_t nreq;
	uint32_t *ctx;
	uint64_t nctx;
	uint64_t tokens_needed;
	uint64_t best_tokens;
	uint64_t footprint_pages; /* pages of the distinct system and context chunks */
	uint64_t max_request_pages;
	uint32_t max_chunk_tokens;
	/* The compose-latency set (RAG only; ncompose 0 elsewhere): one system
	 * chunk, contexts and fresh queries that the timed compose calls draw
	 * from. */
	uint32_t compose_system;
	uint32_t compose_ctx[16];
	uint32_t compose_query[8];
	uint32_t ncompose_ctx;
	uint32_t ncompose_query;
	uint64_t compose_pages;   /* their pages together */
};

struct pw_trace {
	struct pw_params p;
	struct pw_multiturn mt;   /* nturns 0: not generated */
	struct pw_chunks rag;     /* nreq 0: not generated */
	struct pw_chunks agents;
};

/* Generate every workload p asks for (and its best hit rate). Returns 0 or
 * -ENOMEM / -EINVAL with a message in err. */
int pw_generate(struct pw_trace *t, const struct pw_params *p, char *err,
		size_t errlen);
void pw_free(struct pw_trace *t);

/* The tokens of chunk i of cs into out[cs->chunk[i].tokens]. */
void pw_chunk_tokens(const struct pw_chunks *cs, uint32_t i, uint32_t *out);

/* ------------------------------------------------------------ Belady */

/* One chain of pages a request touches (a conversation's prefix, a chunk). */
struct pw_bel_use {
	uint32_t request;         /* uses of one request are consecutive, in order */
	uint32_t npages;
	const uint32_t *page;     /* page ids in chain order, each < npage_ids */
	uint32_t lookup;          /* the leading pages that may count as hits */
	uint32_t whole;           /* 1: a hit only when all lookup pages are
				   * cached, worth tokens; 0: the leading
				   * cached run, tokens per page */
	uint64_t tokens;
	uint64_t limit;           /* !whole: the prompt's length n; hits of
				   * n or more tokens count n - 1. 0: none */
};

/*
 * Belady's MIN over uses[0, n) with room for capacity pages (the rules
 * above): *hit_tokens gets the tokens served from cache. A page appears at
 * most once per request. -ENOSPC when one request's pages exceed capacity,
 * -ENOMEM.
 */
int pw_belady(const struct pw_bel_use *uses, uint64_t n, uint32_t npage_ids,
	      uint64_t capacity, uint64_t *hit_tokens);
/* The multi-turn and chunk traces as uses, through pw_belady(). */
int pw_belady_multiturn(const struct pw_multiturn *mt, uint32_t page_tokens,
			uint64_t capacity, uint64_t *hit_tokens);
int pw_belady_chunks(const struct pw_chunks *cs, uint32_t page_tokens,
		     uint64_t capacity, uint64_t *hit_tokens);

/* Pages of n tokens (the last one partial). */
static inline uint64_t pw_pages(uint64_t n, uint32_t page_tokens)
{
	return (n + page_tokens - 1) / page_tokens;
}

#endif /* KVBENCH_PREFIX_WORKLOAD_H */
