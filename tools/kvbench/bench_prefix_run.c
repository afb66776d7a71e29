/* SPDX-License-Identifier: MIT */
/*
 * bench_prefix_run.c - replay the `kvbench prefix` traces against a target
 * (the engine in-process, or kvpoold through the client library): one
 * driver, so both are measured the same way.
 *
 * Every workload runs on a fresh pool of pb_pool_pages() pages (and Belady's
 * MIN is simulated on the same trace with as many pages, prefix_workload.h):
 *
 *  - multi-turn, per turn: seq_alloc(prompt) (the prefix cache serves the
 *    leading full pages it holds), append the KV of the uncached tokens,
 *    commit, release; then the reply as decode would write it:
 *    seq_extend(reply tokens), append, commit, release; seq_free. The hit is
 *    the lease's len.
 *  - chunk requests (RAG, multi-agent), per request: register the system
 *    chunk, each context and the query (a chunk that exists is a hit: no
 *    pages; a new one is filled and sealed), compose(system, contexts,
 *    query), release the composition, delete the query (queries are never
 *    reused).
 *  - then (RAG) the compose-latency loop: system + 6 contexts + query, the
 *    contexts drawn from the 16 most popular, the query from 8 ready ones,
 *    nothing allocated meanwhile: compose timed, release timed apart.
 *
 * The KV written for token id x at position p (of its conversation or
 * chunk) is a pattern of (x, p), so any page served from cache can be
 * checked: with --verify (the default) the first token of every page a hit
 * or a composition hands out is read back and compared.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "prefix_bench.h"
#include "stats.h"

struct driver {
	const struct prefix_opts *o;
	const struct pw_trace *trace;
	struct pb_target *t;
	struct pb_workload *w;
	struct pb_run *run;
	const struct kvp_layout *l;
	unsigned char *kv;        /* [max tokens][token_bytes] */
	unsigned char *row;       /* one token, for read-back */
	unsigned char *want;
	uint32_t **tok;           /* a request's chunk tokens, [NCTX_MAX + 2] */
	uint32_t max_tokens;
	struct samples op[4];
};

#define REQ_CHUNKS (8 + 2)

static uint64_t kv_key(uint32_t token, uint64_t pos)
{
	uint64_t z = ((uint64_t)token << 32 ^ pos) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The KV pattern of one token into row[token_bytes]. */
static void kv_row(const struct kvp_layout *l, uint32_t token, uint64_t pos,
		   unsigned char *row)
{
	uint64_t v = kv_key(token, pos);

	for (uint64_t i = 0; i + 8 <= l->token_bytes; i += 8) {
		uint64_t w = v + i * 0x2545f4914f6cdd1dull;

		memcpy(row + i, &w, 8);
	}
}

/* KV of tokens[0, n) at positions pos0.. into d->kv. */
static void kv_fill(struct driver *d, const uint32_t *tokens, uint64_t pos0, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		kv_row(d->l, tokens[i], pos0 + i, d->kv + (uint64_t)i * d->l->token_bytes);
}

/* Page j of a token list is in frame f: its first token must read back. */
static void verify_page(struct driver *d, uint32_t frame, const uint32_t *tokens,
			uint64_t j)
{
	struct kvp_slot s = { .frame = frame, .slot = 0 };
	uint64_t pos = j * d->l->page_tokens;

	if (!d->o->verify)
		return;
	kvp_read_cpu(d->l, d->t->tier_base, &s, 1, d->row);
	kv_row(d->l, tokens[pos], pos, d->want);
	d->w->verified_pages++;
	if (memcmp(d->row, d->want, d->l->token_bytes))
		d->w->verify_failures++;
}

static int fail(struct driver *d, const char *what, int rc)
{
	snprintf(d->run->error, sizeof(d->run->error), "%s: %s: %s (%d)", d->w->name,
		 what, d->t->error(d->t->ctx), rc);
	return -1;
}

/* Write the lease's n_new tokens (tokens[pos0, pos0 + n_new)), commit, release. */
static int write_commit(struct driver *d, const struct pb_lease *l, const uint32_t *tokens,
			uint64_t pos0, struct samples *commit_s)
{
	uint64_t t0;
	int rc;

	if (l->n_new) {
		kv_fill(d, tokens + pos0, pos0, l->n_new);
		rc = d->t->append(d->t->ctx, l, l->n_new, d->kv);
		if (rc < 0)
			return fail(d, "append", rc);
		d->w->appended_tokens += l->n_new;
	}
	t0 = now_ns();
	rc = d->t->commit(d->t->ctx, l->id, l->n_new);
	if (commit_s)
		samples_add(commit_s, now_ns() - t0);
	if (rc < 0)
		return fail(d, "commit", rc);
	rc = d->t->release(d->t->ctx, l->id);
	if (rc < 0)
		return fail(d, "release", rc);
	return 0;
}

/* ------------------------------------------------------------ multi-turn */

static int run_multiturn(struct driver *d)
{
	const struct pw_multiturn *mt = &d->trace->mt;
	const uint32_t P = d->l->page_tokens;
	struct pb_workload *w = d->w;
	uint64_t seq = 0;

	for (uint64_t k = 0; k < mt->nturns; k++) {
		const struct pw_conv *cv = &mt->conv[mt->order[k].conv];
		uint32_t t = mt->order[k].turn, n = cv->prompt_end[t];
		uint32_t r = cv->reply_end[t] - n;
		struct pb_lease l;
		uint64_t t0;
		int rc;

		seq++;
		t0 = now_ns();
		rc = d->t->seq_alloc(d->t->ctx, seq, cv->tokens, n, &l);
		samples_add(&d->op[0], now_ns() - t0);
		if (rc < 0)
			return fail(d, "seq_alloc", rc);
		if (l.len + l.n_new != n || l.len % P) {
			snprintf(d->run->error, sizeof(d->run->error), "%s: seq_alloc of %u "
				 "tokens returned %" PRIu64 " cached + %u new", w->name, n,
				 l.len, l.n_new);
			return -1;
		}
		w->tokens_hit += l.len;
		w->dedupe_pages_saved += l.len / P;
		for (uint64_t j = 0; j < l.len / P; j++)
			verify_page(d, l.frames[j], cv->tokens, j);
		if (write_commit(d, &l, cv->tokens, l.len, &d->op[2]))
			return -1;

		t0 = now_ns();
		rc = d->t->seq_extend(d->t->ctx, seq, cv->tokens + n, r, &l);
		samples_add(&d->op[1], now_ns() - t0);
		if (rc < 0)
			return fail(d, "seq_extend", rc);
		if (write_commit(d, &l, cv->tokens, n, NULL))
			return -1;

		t0 = now_ns();
		rc = d->t->seq_free(d->t->ctx, seq);
		samples_add(&d->op[3], now_ns() - t0);
		if (rc < 0)
			return fail(d, "seq_free", rc);
		w->requests++;
	}
	return 0;
}

/* ------------------------------------------------------------ chunks */

/* Fill and seal what a register or link created (n tokens tok). */
static int fill_chunk(struct driver *d, uint32_t i, const uint32_t *tok, uint32_t n,
		      struct pb_chunk_reg *reg)
{
	int rc;

	if (reg->lease.n_new != n) {
		snprintf(d->run->error, sizeof(d->run->error), "%s: chunk %u of %u tokens: "
			 "fill lease of %u", d->w->name, i, n, reg->lease.n_new);
		return -1;
	}
	kv_fill(d, tok, 0, n);
	rc = d->t->append(d->t->ctx, &reg->lease, n, d->kv);
	if (rc < 0)
		return fail(d, "append (chunk fill)", rc);
	d->w->appended_tokens += n;
	rc = d->t->chunk_seal(d->t->ctx, reg);
	if (rc < 0)
		return fail(d, "chunk_seal", rc);
	return 0;
}

/*
 * Register chunk i (its tokens in tok) as a root, or, after entry parent,
 * as a link of it (a chunk's KV depends on what precedes it, so a context
 * or query is an entry after its request's chain; the root makes the name
 * and is a hit after the first time). Fill and seal what is new. *id gets
 * the entry, *name the name, *hit whether the entry was there. timed: the
 * last step's time goes to the register samples. Returns 0, 1 when the
 * parent was evicted meanwhile (the caller starts the chain again), -1.
 */
static int register_chunk(struct driver *d, const struct pw_chunks *cs, uint32_t i,
			  const uint32_t *tok, const struct kvp_chunk_id *parent,
			  struct kvp_chunk_id *id, struct kvp_chunk_id *name,
			  bool *hit, bool timed)
{
	const struct pw_chunk *c = &cs->chunk[i];
	struct pb_chunk_reg reg;
	char meta[64];
	uint64_t t0, dt;
	int rc;

	snprintf(meta, sizeof(meta), "{\"workload\":\"%s\",\"index\":%u}", cs->name, i);
	t0 = now_ns();
	rc = d->t->chunk_register(d->t->ctx, tok, c->tokens, c->type, meta, &reg);
	dt = now_ns() - t0;
	if (rc < 0)
		return fail(d, "chunk_register", rc);
	if (reg.created && fill_chunk(d, i, tok, c->tokens, &reg))
		return -1;
	if (parent) {
		struct kvp_chunk_id nm = reg.name;

		t0 = now_ns();
		rc = d->t->chunk_link(d->t->ctx, &nm, parent, &reg);
		dt = now_ns() - t0;
		if (rc == -ENOENT)
			return 1;
		if (rc < 0)
			return fail(d, "chunk_link", rc);
		if (reg.created && fill_chunk(d, i, tok, c->tokens, &reg))
			return -1;
	}
	if (timed)
		samples_add(&d->op[reg.created ? 1 : 0], dt);
	*id = reg.id;
	if (name)
		*name = reg.name;
	*hit = !reg.created;
	return 0;
}

/* The chunk indices of request r in composition order: system, contexts,
 * query. Returns how many. */
static uint32_t request_chunks(const struct pw_chunks *cs, const struct pw_creq *r,
			       uint32_t *idx)
{
	uint32_t n = 0;

	idx[n++] = r->system;
	for (uint32_t k = 0; k < r->nctx; k++)
		idx[n++] = cs->ctx[r->ctx_off + k];
	idx[n++] = r->query;
	return n;
}

/* Every page of level l's first group must hold chunk tokens tok. */
static void verify_level(struct driver *d, const struct pb_comp *c, uint32_t l,
			 const uint32_t *tok, uint32_t ntok)
{
	const int32_t *ip = c->kv_indptr[l];
	int32_t npages = ip[1] - ip[0];

	if (npages != (int32_t)pw_pages(ntok, d->l->page_tokens)) {
		d->w->verify_failures++;
		return;
	}
	for (int32_t j = 0; j < npages; j++)
		verify_page(d, (uint32_t)c->kv_indices[l][ip[0] + j], tok, (uint64_t)j);
}

static int run_chunks(struct driver *d, const struct pw_chunks *cs)
{
	struct pb_workload *w = d->w;
	const uint32_t P = d->l->page_tokens;
	struct kvp_chunk_id ids[REQ_CHUNKS], qname;
	uint32_t idx[REQ_CHUNKS];
	bool filled[REQ_CHUNKS];

	for (uint32_t q = 0; q < cs->nreq; q++) {
		const struct pw_creq *r = &cs->req[q];
		uint32_t n = request_chunks(cs, r, idx);
		struct kvp_compose_req req;
		struct pb_comp comp = { 0 };
		uint64_t t0 = 0, req_hit = 0;
		int rc = 0;

		for (uint32_t k = 0; k < n; k++)
			pw_chunk_tokens(cs, idx[k], d->tok[k]);
		/* A chunk of this request evicted before the compose (by the
		 * request's own later registers) is registered again and the
		 * compose retried; a chunk counts as served from cache only
		 * when no attempt had to fill it. */
		memset(filled, 0, sizeof(filled));
		for (int attempt = 0; attempt < 3; attempt++) {
			rc = 0;
			for (uint32_t k = 0; k < n && !rc; k++) {
				bool hit;

				rc = register_chunk(d, cs, idx[k], d->tok[k],
						    k ? &ids[k - 1] : NULL, &ids[k],
						    k == n - 1 ? &qname : NULL, &hit,
						    attempt == 0);
				if (rc < 0)
					return -1;
				if (rc)
					break; /* a parent evicted meanwhile */
				if (!hit)
					filled[k] = true;
				else if (attempt == 0)
					w->dedupe_pages_saved +=
						pw_pages(cs->chunk[idx[k]].tokens, P);
			}
			if (rc) {
				w->compose_retries++;
				rc = -ENOENT;
				continue;
			}
			memset(&req, 0, sizeof(req));
			req.system = ids[0];
			req.contexts = ids + 1;
			req.ncontexts = n - 2;
			req.qo_len = 1;
			req.query = ids[n - 1];
			t0 = now_ns();
			rc = d->t->compose(d->t->ctx, &req, &comp);
			if (rc != -ENOENT)
				break;
			w->compose_retries++;
		}
		samples_add(&d->op[2], now_ns() - t0);
		if (rc < 0)
			return fail(d, "compose", rc);
		for (uint32_t k = 0; k < n; k++)
			if (!filled[k])
				req_hit += cs->chunk[idx[k]].tokens;
		w->tokens_hit += req_hit;
		if (comp.nlevels != n) {
			snprintf(d->run->error, sizeof(d->run->error), "%s: request %u: compose "
				 "of %u chunks returned %u levels", w->name, q, n, comp.nlevels);
			return -1;
		}
		for (uint32_t k = 0; k < n; k++)
			verify_level(d, &comp, k, d->tok[k], cs->chunk[idx[k]].tokens);
		t0 = now_ns();
		rc = d->t->release(d->t->ctx, comp.lease);
		samples_add(&d->op[3], now_ns() - t0);
		if (rc < 0)
			return fail(d, "release (composition)", rc);
		/* The query's name: its link and its root. */
		rc = d->t->chunk_delete(d->t->ctx, &qname);
		if (rc < 0)
			return fail(d, "chunk_delete (query)", rc);
		w->requests++;
	}
	return 0;
}

/* ------------------------------------------------------------ compose 8 */

/*
 * Compositions of 8 chunks: a system, 6 contexts drawn from the compose set
 * and a query. A context's KV depends on what precedes it, so each draw is
 * its own chain of entries (system root, each context linked after the
 * one before, the query after the last): COMPOSE8_CHAINS distinct draws
 * are registered and filled untimed, then composed in turn, timed.
 */
#define COMPOSE8_CHAINS 2

struct chain8 {
	struct kvp_chunk_id e[8]; /* system, 6 contexts, query: entries */
};

/* Register every chain and compose each once (untimed: it makes them
 * recent): 0, 1 when an entry was evicted meanwhile (try again), -1. */
static int compose8_setup(struct driver *d, const struct pw_chunks *cs,
			  const uint8_t *choice, struct chain8 *ch)
{
	bool hit;
	int rc;

	for (uint32_t c = 0; c < COMPOSE8_CHAINS; c++) {
		uint32_t idx[8];

		idx[0] = cs->compose_system;
		for (uint32_t i = 0; i < 6; i++)
			idx[1 + i] = cs->compose_ctx[choice[c * 6 + i]];
		idx[7] = cs->compose_query[c % cs->ncompose_query];
		for (uint32_t k = 0; k < 8; k++) {
			pw_chunk_tokens(cs, idx[k], d->tok[0]);
			rc = register_chunk(d, cs, idx[k], d->tok[0],
					    k ? &ch[c].e[k - 1] : NULL, &ch[c].e[k], NULL,
					    &hit, false);
			if (rc)
				return rc;
		}
	}
	for (uint32_t c = 0; c < COMPOSE8_CHAINS; c++) {
		struct kvp_compose_req req = {
			.system = ch[c].e[0], .contexts = &ch[c].e[1], .ncontexts = 6,
			.qo_len = 1, .query = ch[c].e[7],
		};
		struct pb_comp comp;

		rc = d->t->compose(d->t->ctx, &req, &comp);
		if (rc == -ENOENT)
			return 1;
		if (rc < 0)
			return fail(d, "compose (the 8-chunk set)", rc);
		rc = d->t->release(d->t->ctx, comp.lease);
		if (rc < 0)
			return fail(d, "release (the 8-chunk set)", rc);
	}
	return 0;
}

static int run_compose8(struct driver *d, const struct pw_chunks *cs)
{
	const uint64_t n = d->o->compose_samples, warm = n < 100 ? n : 100;
	struct chain8 ch[COMPOSE8_CHAINS];
	struct samples sc = { 0 }, sr = { 0 };
	uint8_t choice[COMPOSE8_CHAINS * 6];
	uint64_t rng = d->o->w.seed ^ 0x636f6d706f736538ull;
	int rc = -1;

	if (cs->ncompose_ctx < 6 || n == 0)
		return 0;
	/* The draws: 6 distinct of the contexts per chain. */
	for (uint32_t c = 0; c < COMPOSE8_CHAINS; c++) {
		uint8_t perm[16];

		for (uint32_t i = 0; i < cs->ncompose_ctx; i++)
			perm[i] = (uint8_t)i;
		for (uint32_t i = 0; i < 6; i++) {
			uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
			uint32_t j;
			uint8_t tmp;

			z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
			j = i + (uint32_t)((z >> 17) % (cs->ncompose_ctx - i));
			tmp = perm[i];
			perm[i] = perm[j];
			perm[j] = tmp;
			choice[c * 6 + i] = perm[i];
		}
	}
	/* Register the chains, compose each once, again until every compose
	 * found its entries (a later register may evict an earlier one). */
	for (int attempt = 0;; attempt++) {
		rc = compose8_setup(d, cs, choice, ch);
		if (rc < 0)
			return -1;
		if (rc == 0)
			break;
		if (attempt == 3) {
			snprintf(d->run->error, sizeof(d->run->error), "compose: the 8-chunk "
				 "chains keep being evicted; give the daemon more memory");
			return -1;
		}
	}
	if (samples_init(&sc, n) || samples_init(&sr, n)) {
		snprintf(d->run->error, sizeof(d->run->error), "compose: out of memory");
		goto out;
	}
	for (uint64_t s = 0; s < warm + n; s++) {
		const struct chain8 *c = &ch[s % COMPOSE8_CHAINS];
		struct kvp_compose_req req = {
			.system = c->e[0], .contexts = &c->e[1], .ncontexts = 6,
			.qo_len = 1, .query = c->e[7],
		};
		struct pb_comp comp;
		uint64_t t0, t1, t2;

		t0 = now_ns();
		rc = d->t->compose(d->t->ctx, &req, &comp);
		t1 = now_ns();
		if (rc < 0) {
			fail(d, "compose (8 chunks)", rc);
			rc = -1;
			goto out;
		}
		rc = d->t->release(d->t->ctx, comp.lease);
		t2 = now_ns();
		if (rc < 0) {
			fail(d, "release (8-chunk composition)", rc);
			rc = -1;
			goto out;
		}
		if (s >= warm) {
			samples_add(&sc, t1 - t0);
			samples_add(&sr, t2 - t1);
		}
		d->run->compose8_pages = comp.pages;
		d->run->compose8_tokens = comp.tokens;
	}
	samples_summarize(&sc, &d->run->compose8);
	samples_summarize(&sr, &d->run->compose8_release);
	rc = 0;
out:
	samples_free(&sc);
	samples_free(&sr);
	return rc;
}

/* ------------------------------------------------------------ workloads */

uint32_t pb_pool_pages(const struct prefix_opts *o, uint64_t footprint,
		       uint64_t min_pages)
{
	uint64_t p = o->pool_pages ? o->pool_pages : (uint64_t)((double)footprint * o->pool_frac);

	if (!o->pool_pages && p < min_pages)
		p = min_pages;
	if (p < 1)
		p = 1;
	return p > UINT32_MAX ? UINT32_MAX : (uint32_t)p;
}

static int run_workload(struct driver *d, int which, pb_open_fn open,
			void (*close)(struct pb_target *))
{
	static const char *const names[PB_NWL] = { "multi_turn", "rag", "agents" };
	const struct pw_trace *tr = d->trace;
	const struct pw_chunks *cs = which == PB_WL_RAG ? &tr->rag : &tr->agents;
	struct pb_workload *w = &d->run->wl[which];
	struct pb_target t = { 0 };
	uint64_t footprint, minp, cap, t0;
	int rc = -1, bel;

	if (which == PB_WL_MT ? !tr->mt.nturns : !cs->nreq)
		return 0;
	memset(w, 0, sizeof(*w));
	w->name = names[which];
	if (which == PB_WL_MT) {
		footprint = tr->mt.footprint_pages;
		/* A sequence holds its pages while it lives: room for one whole
		 * conversation twice over. */
		minp = 2ull * tr->mt.max_pages + 2;
		cap = tr->mt.nturns;
		w->tokens_needed = tr->mt.tokens_needed;
		w->best_tokens = tr->mt.best_tokens;
	} else {
		footprint = cs->footprint_pages;
		minp = 2 * cs->max_request_pages;
		if (cs->compose_pages + cs->max_request_pages > minp)
			minp = cs->compose_pages + cs->max_request_pages;
		cap = (uint64_t)cs->nreq * REQ_CHUNKS;
		w->tokens_needed = cs->tokens_needed;
		w->best_tokens = cs->best_tokens;
	}
	w->footprint_pages = footprint;
	w->pool_pages = pb_pool_pages(d->o, footprint, minp);
	/* The offline optimum for the same pool, trace and hit rule. */
	bel = which == PB_WL_MT ?
	      pw_belady_multiturn(&tr->mt, d->l->page_tokens, w->pool_pages,
				  &w->belady_tokens) :
	      pw_belady_chunks(cs, d->l->page_tokens, w->pool_pages, &w->belady_tokens);
	if (bel) {
		snprintf(d->run->error, sizeof(d->run->error), "%s: Belady simulation "
			 "with %" PRIu64 " pages: %s", w->name, w->pool_pages,
			 bel == -ENOSPC ? "a request needs more pages than the pool has "
			 "(raise --pool-pages)" : strerror(-bel));
		return -1;
	}
	for (int k = 0; k < 4; k++) {
		if (samples_init(&d->op[k], cap)) {
			snprintf(d->run->error, sizeof(d->run->error), "%s: out of memory",
				 w->name);
			goto out;
		}
	}
	if (open(&t, d->o, (uint32_t)w->pool_pages, d->run->error, sizeof(d->run->error)))
		goto out;
	d->t = &t;
	d->w = w;
	t0 = now_ns();
	if (which == PB_WL_MT)
		rc = run_multiturn(d);
	else
		rc = run_chunks(d, cs);
	w->seconds = (double)(now_ns() - t0) * 1e-9;
	if (!rc && t.stats(t.ctx, &w->stats) < 0)
		rc = fail(d, "stats", -EIO);
	if (!rc && which == PB_WL_RAG)
		rc = run_compose8(d, cs);
	if (!rc) {
		const struct kvp_stats *s = &w->stats;

		if (which == PB_WL_MT) {
			w->lookups = s->prefix_lookups;
			w->hits = 0;
		} else {
			w->lookups = s->chunk_lookups;
			w->hits = s->chunk_hits;
		}
		w->evicted_pages = s->prefix_evicted_pages + s->evicted_pages;
		w->evicted_chunks = s->chunk_evicted;
		snprintf(w->check, sizeof(w->check), "not checked");
		if (t.check)
			t.check(t.ctx, w->check, sizeof(w->check));
		for (int k = 0; k < 4; k++)
			samples_summarize(&d->op[k], &w->op[k]);
		w->ran = true;
	}
	close(&t);
	d->t = NULL;
out:
	for (int k = 0; k < 4; k++)
		samples_free(&d->op[k]);
	return rc;
}

int pb_run_trace(const struct pw_trace *trace, const struct prefix_opts *o,
		 pb_open_fn open, void (*close)(struct pb_target *), struct pb_run *run)
{
	struct driver d = { .o = o, .trace = trace, .run = run, .l = &o->layout };
	uint32_t max = 0;
	int rc = -1;

	memset(run, 0, sizeof(*run));
	for (uint32_t c = 0; c < trace->mt.nconv; c++)
		if (trace->mt.conv[c].len > max)
			max = trace->mt.conv[c].len;
	if (trace->rag.max_chunk_tokens > max)
		max = trace->rag.max_chunk_tokens;
	if (trace->agents.max_chunk_tokens > max)
		max = trace->agents.max_chunk_tokens;
	d.max_tokens = max ? max : 1;
	d.kv = malloc((uint64_t)d.max_tokens * o->layout.token_bytes);
	d.row = malloc(o->layout.token_bytes);
	d.want = malloc(o->layout.token_bytes);
	d.tok = calloc(REQ_CHUNKS, sizeof(*d.tok));
	if (!d.kv || !d.row || !d.want || !d.tok)
		goto nomem;
	for (int k = 0; k < REQ_CHUNKS; k++)
		if (!(d.tok[k] = malloc(d.max_tokens * sizeof(**d.tok))))
			goto nomem;
	rc = 0;
	for (int wl = 0; wl < PB_NWL && !rc; wl++)
		rc = run_workload(&d, wl, open, close);
	run->ran = !rc;
	goto out;
nomem:
	snprintf(run->error, sizeof(run->error), "out of memory for %u tokens of KV",
		 d.max_tokens);
out:
	for (int k = 0; d.tok && k < REQ_CHUNKS; k++)
		free(d.tok[k]);
	free(d.tok);
	free(d.kv);
	free(d.row);
	free(d.want);
	return rc;
}
