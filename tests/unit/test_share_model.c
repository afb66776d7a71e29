/* SPDX-License-Identifier: MIT */
/*
 * test_share_model.c - random operations over everything that shares device
 * frames (user histories, token-list sequences, virtual sequences, chunks,
 * compositions, dead clients), each checked against a reference model the
 * moment it returns.
 *
 * What it proves, after every operation:
 *  1. engine_check() passes (frames, refcounts, lists: share.h's invariants);
 *  2. the device tier's frames_used is exactly what the model says is held:
 *     history pages (engine_info) + reserved history pages + chunk pages
 *     (registered, or deleted and still held) + the distinct refcounted
 *     pages (sequence pages, prefix-cache pages held or idle); and the
 *     gauges (seqs, chunks, prefix_pages, prefix_idle_pages, leases) agree;
 *  3. every frame the model knows belongs to one object only, and page
 *     tables hand out the frames the model expects (prefix hits, shared
 *     pages of a SEQ source, chunk pages), with copy on write exactly where
 *     a partial last page is visible to someone else;
 *  4. every error is the one the model predicts (-ENOMEM exactly when free +
 *     evictable frames cannot cover the need, -EAGAIN for a chunk being
 *     filled, -ENOENT, -EBUSY, -EEXIST, -EINVAL for a middle source ending
 *     mid-page) and changes no gauge and no frame;
 *  5. nothing disappears unless the operation may evict, nothing held is
 *     ever evicted, idle prefix pages leave leaves first, and an eviction
 *     frees at least what the operation needed;
 *  6. bytes: every token's K/V is a pure function of a 64-bit key the model
 *     keeps per token (histories: (user, generation, position); chunks:
 *     (content, generation, position); prefix-publishing sequences: a
 *     rolling hash of the token ids up to that token, so two sequences of
 *     the same prefix write the same bytes and a shared page must agree with
 *     both; other new tokens: a key per write lease). Every few steps every
 *     history, sequence, chunk (also through its frames) and idle prefix
 *     page is read back.
 * The engine aborts on a frame freed twice (frames.c) and on a chunk or
 * page reference dropped below zero; either kills this test.
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

#include "kvp_kernels.h"
#include "model_util.h"

#include "engine.h"
#include "share.h"

#define P 4u
#define NUSERS 6
#define NSEQS 12
#define NCONTENT 14         /* distinct chunk contents */
#define NCREC 48            /* chunk records (registered or dead-held) */
#define NSP 512             /* refcounted page records */
#define NOWNERS 3
#define MAXTOK 64           /* tokens of a sequence */
#define MAXPG (MAXTOK / P)
#define HMAX 32             /* history tokens before the test evicts it */
#define MAXHL 6             /* history leases open */
#define MAXRD 6             /* chunk read leases open */
#define MAXCOMP 4
#define SWEEP_EVERY 64
#define MAXFRAMES 64

struct model_cfg {
	const char *name;
	uint64_t seed;
	uint32_t steps;
	uint32_t device_frames;
};

enum { PK_HIST = 1, PK_CHUNK, PK_REF };

struct pref {
	int kind;
	int obj;                 /* user, chunk record or spage */
	uint32_t frame;
};

struct spage {               /* a refcounted page */
	bool live;
	uint32_t frame;
	uint32_t refs;           /* page-table entries + anchors */
	bool pub;
	uint64_t hash;           /* pub: rolling key of its last token */
	uint32_t idx;            /* pub: page index in its chain */
	uint32_t toks[MAXTOK];   /* pub: tokens [0, (idx+1)P) */
	uint64_t keys[P];        /* pub: its tokens' keys */
};

struct mchunk {
	bool live, registered, ready;
	int content;
	uint32_t gen;
	struct kvp_chunk_id id;
	uint32_t ntok, npages;
	uint32_t frames[MAXPG];
	uint32_t filler;
	uint64_t fill_lease;
	uint32_t written;
	uint32_t holders;        /* read leases + compositions + sequences */
};

struct mseq {
	bool live;
	uint64_t id;
	uint32_t owner;
	bool hashable;
	uint32_t published;
	uint32_t len;
	uint32_t toks[MAXTOK];
	uint64_t keys[MAXTOK];
	uint32_t npg;
	struct pref pg[MAXPG];
	int anchors[3 * MAXPG];
	uint32_t nanchors;
	uint16_t upin[NUSERS];   /* histories pinned: one per USER source, */
	uint16_t chold[NCREC];   /* chunks held: one per CHUNK source (SEQ
				  * sources pass theirs on) */
	uint64_t wl;             /* write lease, 0: none */
	uint32_t n_new, written;
	uint64_t wkey;           /* key base of the lease's new tokens */
	bool wtoks;              /* the lease's new tokens have ids (publish) */
};

struct muser {
	uint64_t key;
	uint32_t gen, len;
	uint32_t leases;
	uint64_t writer;
};

struct mhl {                 /* a history lease */
	uint64_t id;
	int u;
	uint32_t owner, n_new, written, len0;
	bool committed;
};

struct mread {
	uint64_t id;
	int rec;
	uint32_t owner;
};

struct mcomp {
	uint64_t lease;
	uint32_t owner;
	int recs[16];
	uint32_t nrecs;
};

struct outcomes {
	uint64_t allocs, hits, creates, cows, extends, commits, rollbacks, frees,
		 dedupes, registers, reg_hits, seals, abandons, acquires, eagain,
		 deletes, zombies, commit_seal_left_open, clears, evict_unused, composes, nomem,
		 errors, owner_deaths, drops, chunk_evictions, prefix_evictions,
		 prepares, sweeps, whole_hits;
};

struct sim {
	const struct model_cfg *cfg;
	struct engine *eng;
	const struct kvp_layout *l;
	uint32_t words;
	uint64_t rng, step, now, keyseq;
	char op[256];
	struct muser u[NUSERS];
	struct mhl hl[MAXHL];
	uint32_t nhl;
	struct mseq q[NSEQS];
	struct mchunk c[NCREC];
	int reg[NCONTENT];       /* content -> registered record, -1 */
	uint32_t cgen[NCONTENT];
	struct mread rd[MAXRD];
	uint32_t nrd;
	struct mcomp comp[MAXCOMP];
	uint32_t ncomp;
	struct spage *sp;
	struct kvp_stats st;
	struct engine_user_info info[NUSERS];
	/* this step */
	bool nochange, may_evict, touch_all;
	uint32_t need;           /* frames the op had to find beyond free */
	uint64_t chunk_evicted_expect, prefix_evicted_expect;
	struct outcomes o;
	uint32_t *buf, *want;
	struct kvp_slot *slots;
};

/* ------------------------------------------------------------ failing */

/* A mismatch, reported with where the run was (model_util.h). */
#define sim_fail(s, line, ...)                                            \
	model_mismatch((s)->cfg->name, (s)->cfg->seed, (s)->step, (s)->op, \
		       (line), __VA_ARGS__)

#define EXPECT(s, cond, ...)                                      \
	do {                                                      \
		if (!(cond))                                      \
			sim_fail((s), __LINE__, __VA_ARGS__);     \
	} while (0)

/* ------------------------------------------------------------ randomness */

static uint64_t rng_next(struct sim *s)
{
	return mix64(s->rng += 0x9e3779b97f4a7c15ull);
}

static uint32_t rnd(struct sim *s, uint32_t n)
{
	return n ? (uint32_t)(rng_next(s) % n) : 0;
}

static bool chance(struct sim *s, uint32_t percent)
{
	return rnd(s, 100) < percent;
}

static uint32_t pages_for(uint64_t tokens)
{
	return (uint32_t)((tokens + P - 1) / P);
}

/* ------------------------------------------------------------ keys and bytes */

static uint64_t hist_key(const struct sim *s, int u, uint64_t pos)
{
	return mix64(mix64(s->u[u].key + 0x51ed27ull * s->u[u].gen) ^ pos) | 1;
}

static uint64_t chunk_key(int content, uint32_t gen, uint64_t pos)
{
	return mix64(mix64(0xc4u + 7919ull * (uint64_t)content + 0x10001ull * gen) ^ pos) | 1;
}

/* The rolling key of a token-list prefix: the bytes of token p of every
 * publishing sequence with these ids up to p. */
static uint64_t roll(uint64_t prev, uint32_t tok)
{
	return mix64(prev ^ (tok + 0x1234567ull)) | 1;
}

static void key_words(const struct sim *s, uint64_t key, uint32_t *out)
{
	for (uint32_t w = 0; w < s->words; w++)
		out[w] = (uint32_t)mix64(key + w) & 0x3fffffffu;
}

/* Write keys[0, n) into lease slots [first, first+n). */
static void lease_write(struct sim *s, uint64_t lease, uint32_t first, uint32_t n,
			const uint64_t *keys)
{
	struct errbuf e = { .msg = "" };
	int rc;

	if (!n)
		return;
	rc = engine_lease_slots(s->eng, lease, first, n, s->slots, &e);
	EXPECT(s, rc == 0, "engine_lease_slots(%#" PRIx64 ", %u, %u) = %d: %s",
	       lease, first, n, rc, e.msg);
	for (uint32_t i = 0; i < n; i++)
		key_words(s, keys[i], s->buf + (size_t)i * s->words);
	kvp_append_cpu(s->l, engine_tier(s->eng, KVP_TIER_DEVICE)->base, s->slots,
		       n, s->buf);
}

static void expect_keys(struct sim *s, const uint32_t *got, const uint64_t *keys,
			uint32_t n, const char *what)
{
	for (uint32_t t = 0; t < n; t++) {
		key_words(s, keys[t], s->want);
		EXPECT(s, !memcmp(got + (size_t)t * s->words, s->want, s->words * 4),
		       "%s: token %u holds other bytes", what, t);
	}
}

/* Tokens [0, n) through a page table, straight from the device tier. */
static void read_frames(struct sim *s, const uint32_t *frames, uint32_t n)
{
	for (uint32_t t = 0; t < n; t++)
		s->slots[t] = (struct kvp_slot){ frames[t / P], t % P };
	kvp_read_cpu(s->l, engine_tier(s->eng, KVP_TIER_DEVICE)->base, s->slots, n,
		     s->buf);
}

/* ------------------------------------------------------------ model helpers */

static int sp_new(struct sim *s, uint32_t frame)
{
	for (int i = 0; i < NSP; i++)
		if (!s->sp[i].live) {
			memset(&s->sp[i], 0, sizeof(s->sp[i]));
			s->sp[i].live = true;
			s->sp[i].frame = frame;
			s->sp[i].refs = 1;
			return i;
		}
	sim_fail(s, __LINE__, "model: out of page records");
}

static void sp_unref(struct sim *s, int i)
{
	EXPECT(s, s->sp[i].refs > 0, "model: page record %d unreferenced twice", i);
	if (!--s->sp[i].refs && !s->sp[i].pub)
		s->sp[i].live = false;
}

static int pub_find(struct sim *s, uint64_t hash, uint32_t idx)
{
	for (int i = 0; i < NSP; i++)
		if (s->sp[i].live && s->sp[i].pub && s->sp[i].hash == hash &&
		    s->sp[i].idx == idx)
			return i;
	return -1;
}

static bool user_pinned(const struct sim *s, int u)
{
	if (s->u[u].leases)
		return true;
	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live && s->q[i].upin[u])
			return true;
	return false;
}

static uint32_t chunk_holders(const struct sim *s, int r)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nrd; i++)
		n += s->rd[i].rec == r;
	for (uint32_t i = 0; i < s->ncomp; i++)
		for (uint32_t k = 0; k < s->comp[i].nrecs; k++)
			n += s->comp[i].recs[k] == r;
	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live)
			n += s->q[i].chold[r];
	return n;
}

static void chunk_maybe_free(struct sim *s, int r)
{
	if (!s->c[r].registered && !chunk_holders(s, r))
		s->c[r].live = false;
}

/* Frames eviction may take now; excl_* are what the op pins first. */
static uint64_t evictable(struct sim *s, int excl_user, const bool *excl_users,
			  const bool *excl_sp)
{
	uint64_t n = 0;

	for (int u = 0; u < NUSERS; u++)
		if (u != excl_user && !(excl_users && excl_users[u]) &&
		    s->info[u].exists && !user_pinned(s, u))
			n += s->info[u].pages_device;
	for (int r = 0; r < NCREC; r++)
		if (s->c[r].live && s->c[r].registered && s->c[r].ready &&
		    !chunk_holders(s, r))
			n += s->c[r].npages;
	for (int i = 0; i < NSP; i++)
		if (s->sp[i].live && s->sp[i].pub && !s->sp[i].refs &&
		    !(excl_sp && excl_sp[i]))
			n++;
	return n;
}

/* An op that needs `need` new frames: true when the model says it fits;
 * sets what the step may evict. */
static bool plan(struct sim *s, uint64_t need, uint64_t ev)
{
	uint64_t free0 = s->st.tier[KVP_TIER_DEVICE].frames_free;

	if (need <= free0)
		return true;
	if (free0 + ev < need)
		return false;
	s->may_evict = true;
	s->need = (uint32_t)(need - free0);
	return true;
}

/* ------------------------------------------------------------ sequences */

static struct mseq *seq_pick_live(struct sim *s)
{
	int i = (int)rnd(s, NSEQS);

	for (int k = 0; k < NSEQS; k++, i = (i + 1) % NSEQS)
		if (s->q[i].live)
			return &s->q[i];
	return NULL;
}

static void seq_drop_page(struct sim *s, struct mseq *q, uint32_t p)
{
	struct pref *r = &q->pg[p];

	if (r->kind == PK_REF)
		sp_unref(s, r->obj);
	r->kind = 0;
}

static void seq_truncate(struct sim *s, struct mseq *q, uint32_t npg)
{
	while (q->npg > npg)
		seq_drop_page(s, q, --q->npg);
}

static void seq_destroy(struct sim *s, struct mseq *q)
{
	seq_truncate(s, q, 0);
	while (q->nanchors)
		sp_unref(s, q->anchors[--q->nanchors]);
	q->live = false;
	q->wl = 0;
	for (int r = 0; r < NCREC; r++)
		if (q->chold[r]) {
			q->chold[r] = 0;
			chunk_maybe_free(s, r);
		}
	memset(q->upin, 0, sizeof(q->upin));
}

/* Publish full committed pages (share.h): a page already published by
 * another sequence is anchored, ours stays private. */
static uint32_t seq_publish(struct sim *s, struct mseq *q)
{
	uint32_t dedupes = 0;

	while (q->hashable && q->published < q->len / P) {
		uint32_t i = q->published;
		uint64_t h = q->keys[(i + 1) * P - 1];
		int e = pub_find(s, h, i);
		struct pref *r = &q->pg[i];

		EXPECT(s, r->kind == PK_REF, "model: publishing a borrowed page");
		if (e < 0) {
			struct spage *sp = &s->sp[r->obj];

			sp->pub = true;
			sp->hash = h;
			sp->idx = i;
			memcpy(sp->toks, q->toks, (i + 1) * P * sizeof(uint32_t));
			memcpy(sp->keys, q->keys + i * P, sizeof(sp->keys));
		} else if (e != r->obj) {
			s->sp[e].refs++;
			q->anchors[q->nanchors++] = e;
			dedupes++;
		}
		q->published++;
	}
	return dedupes;
}

/* The vocabulary: four token streams; a list follows stream a up to div,
 * then stream b, so prefixes repeat across sequences. */
static uint32_t vocab(uint32_t stream, uint32_t i)
{
	return 10 + (uint32_t)(mix64(stream * 1000ull + i) % 40);
}

static void check_lease_shape(struct sim *s, const struct engine_lease *L,
			      uint32_t len, uint32_t n_new)
{
	EXPECT(s, L->len == len && L->n_new == n_new && L->npages == pages_for(len + n_new) &&
	       (!L->npages || L->last_page_len == (len + n_new - 1) % P + 1),
	       "lease len %" PRIu64 " n_new %u npages %u last %u; model len %u n_new %u",
	       L->len, L->n_new, L->npages, L->last_page_len, len, n_new);
	for (uint32_t i = 0; i < L->npages; i++)
		EXPECT(s, L->frames[i] < s->cfg->device_frames, "page %u: frame %u", i,
		       L->frames[i]);
}

static void op_seq_alloc(struct sim *s)
{
	int slot = (int)rnd(s, NSEQS);
	struct mseq *q = &s->q[slot];
	uint32_t a = rnd(s, 4), b = rnd(s, 4), div = rnd(s, 5) * P + rnd(s, 2);
	uint32_t n = 1 + rnd(s, 24), toks[MAXTOK], hit = 0, owner = 1 + rnd(s, NOWNERS);
	uint64_t keys[MAXTOK], r = 0xfeed;
	int hits[MAXPG];
	bool excl[NSP] = { false };
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		toks[i] = vocab(i < div ? a : b, i);
		keys[i] = r = roll(r, toks[i]);
	}
	while ((hit + 1) * P <= n && (hits[hit] = pub_find(s, keys[(hit + 1) * P - 1], hit)) >= 0)
		hit++;
	/* Seed 004: a prompt cached whole reports n - 1 (the last token is
	 * left to compute); its last page is copied on write, unpublished:
	 * the commit finds the cached one (an anchor) or publishes the copy. */
	bool whole = hit && hit * P == n;
	uint32_t cached = whole ? n - 1 : hit * P;
	for (uint32_t i = 0; i < hit; i++)
		excl[hits[i]] = true;
	snprintf(s->op, sizeof(s->op), "seq_alloc(seq %" PRIu64 ", n %u, streams %u/%u div %u, "
		 "owner %u): model hit %u pages", (uint64_t)slot + 1, n, a, b, div, owner, hit);
	uint32_t need = pages_for(n) - hit + whole;
	uint64_t ev = evictable(s, -1, NULL, excl);
	rc = share_seq_alloc(s->eng, (uint64_t)slot + 1, toks, n, owner, &L, &e);
	if (q->live) {
		EXPECT(s, rc == -EEXIST, "seq_alloc of a live seq = %d (%s)", rc, e.msg);
		s->nochange = true;
		s->o.errors++;
		return;
	}
	if (!plan(s, need, ev)) {
		EXPECT(s, rc == -ENOMEM, "seq_alloc needing %u frames, %" PRIu64 " free + %"
		       PRIu64 " evictable = %d (%s)", need,
		       s->st.tier[KVP_TIER_DEVICE].frames_free, ev, rc, e.msg);
		s->nochange = true;
		s->o.nomem++;
		return;
	}
	EXPECT(s, rc == 0, "seq_alloc = %d (%s); model: fits (%u needed, %" PRIu64
	       " free, %" PRIu64 " evictable)", rc, e.msg, need,
	       s->st.tier[KVP_TIER_DEVICE].frames_free, ev);
	check_lease_shape(s, &L, cached, n - cached);
	EXPECT(s, L.hit_tokens == cached, "hit_tokens %" PRIu64 ", model %u", L.hit_tokens,
	       cached);
	memset(q, 0, sizeof(*q));
	q->live = true;
	q->id = (uint64_t)slot + 1;
	q->owner = owner;
	q->hashable = true;
	q->published = hit - whole;
	q->len = cached;
	memcpy(q->toks, toks, n * sizeof(uint32_t));
	memcpy(q->keys, keys, n * sizeof(uint64_t));
	for (uint32_t i = 0; i < L.npages; i++) {
		if (whole && i == hit - 1) {
			EXPECT(s, L.frames[i] != s->sp[hits[i]].frame, "prompt cached whole: "
			       "its last page %u is the cached frame %u, not a copy", i,
			       L.frames[i]);
			q->pg[i] = (struct pref){ PK_REF, sp_new(s, L.frames[i]), L.frames[i] };
			s->o.cows++;
			s->o.whole_hits++;
		} else if (i < hit) {
			EXPECT(s, L.frames[i] == s->sp[hits[i]].frame, "hit page %u is frame %u, "
			       "the prefix cache has it in %u", i, L.frames[i], s->sp[hits[i]].frame);
			s->sp[hits[i]].refs++;
			q->pg[i] = (struct pref){ PK_REF, hits[i], L.frames[i] };
		} else {
			q->pg[i] = (struct pref){ PK_REF, sp_new(s, L.frames[i]), L.frames[i] };
		}
	}
	q->npg = L.npages;
	q->wl = L.id;
	q->n_new = L.n_new;
	q->wtoks = true;
	s->o.allocs++;
	s->o.hits += hit > 0;
}

/* Sources for seq_create: mostly valid; now and then one planted error. */
static void op_seq_create(struct sim *s)
{
	int slot = (int)rnd(s, NSEQS);
	struct mseq *q = &s->q[slot], nq;
	struct kvp_seq_src src[3];
	uint32_t nsrc = 1 + rnd(s, 3), n_new = rnd(s, 7), owner = 1 + rnd(s, NOWNERS);
	int want = 0, kinds[3], objs[3];
	uint32_t toks[3];
	bool excl_u[NUSERS] = { false };
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	char what[160] = "";
	int rc;

	memset(src, 0, sizeof(src));
	memset(&nq, 0, sizeof(nq));
	uint32_t total = 0;
	for (uint32_t i = 0; i < nsrc; i++) {
		bool last = i + 1 == nsrc;
		int tries = 8, kind = 0, obj = -1;
		uint32_t t = 0;

		while (tries-- && obj < 0) {
			kind = 1 + (int)rnd(s, 3);
			if (kind == KVP_SRC_USER) {
				int u = (int)rnd(s, NUSERS);

				if (!s->u[u].len || (!last && s->u[u].len < P))
					continue;
				obj = u;
				t = last ? (chance(s, 30) ? s->u[u].len : 1 + rnd(s, s->u[u].len))
					 : P * (1 + rnd(s, s->u[u].len / P));
			} else if (kind == KVP_SRC_CHUNK) {
				int r = (int)rnd(s, NCREC);

				for (int k = 0; k < NCREC && obj < 0; k++, r = (r + 1) % NCREC)
					if (s->c[r].live && s->c[r].registered && s->c[r].ready &&
					    (last || s->c[r].ntok % P == 0))
						obj = r;
				t = obj >= 0 ? s->c[obj].ntok : 0;
			} else {
				struct mseq *x = seq_pick_live(s);

				if (!x || !x->len || (!last && x->len % P))
					continue;
				obj = (int)(x - s->q);
				t = x->len;
			}
		}
		if (obj < 0) {
			nsrc = i;
			break;
		}
		kinds[i] = kind;
		objs[i] = obj;
		toks[i] = t;
		total += t;
	}
	if (total + n_new > MAXTOK || (!nsrc && !n_new))
		return;
	for (uint32_t i = 0; i < nsrc; i++) {
		src[i].kind = (uint32_t)kinds[i];
		if (kinds[i] == KVP_SRC_USER) {
			src[i].id = s->u[objs[i]].key;
			src[i].tokens = toks[i] == s->u[objs[i]].len && chance(s, 50) ? 0 : toks[i];
			excl_u[objs[i]] = true;
		} else if (kinds[i] == KVP_SRC_CHUNK) {
			src[i].chunk = s->c[objs[i]].id;
		} else {
			src[i].id = s->q[objs[i]].id;
		}
	}
	/* a planted error */
	if (nsrc && chance(s, 12)) {
		uint32_t i = rnd(s, nsrc);

		switch (rnd(s, 3)) {
		case 0:
			src[i].kind = KVP_SRC_CHUNK;
			memset(&src[i].chunk, 0xee, sizeof(src[i].chunk));
			want = -ENOENT;
			break;
		case 1:
			src[i].kind = KVP_SRC_SEQ;
			src[i].id = 999;
			want = -ENOENT;
			break;
		default:
			if (nsrc > 1 && i + 1 < nsrc && kinds[i] == KVP_SRC_USER &&
			    toks[i] >= P && s->u[objs[i]].len > toks[i]) {
				src[i].tokens = toks[i] + 1;   /* ends mid-page */
				want = -EINVAL;
			}
			break;
		}
	}
	if (q->live)
		want = -EEXIST;   /* checked before the sources */
	uint32_t cow = n_new && total % P, need = pages_for(total + n_new) - pages_for(total) + cow;
	uint64_t ev = 0;
	if (!want) {
		bool excl_c[NCREC] = { false };
		uint64_t n = 0;

		for (uint32_t i = 0; i < nsrc; i++)
			if (kinds[i] == KVP_SRC_CHUNK)
				excl_c[objs[i]] = true;
		ev = evictable(s, -1, excl_u, NULL);
		for (int r = 0; r < NCREC; r++)
			if (excl_c[r] && !chunk_holders(s, r))
				n += s->c[r].npages;
		ev -= n;
		if (!plan(s, need, ev))
			want = -ENOMEM;
	}
	for (uint32_t i = 0; i < nsrc; i++)
		snprintf(what + strlen(what), sizeof(what) - strlen(what), " %s:%d/%u",
			 kinds[i] == 1 ? "user" : kinds[i] == 2 ? "chunk" : "seq", objs[i], toks[i]);
	snprintf(s->op, sizeof(s->op), "seq_create(seq %d, [%s ], n_new %u, owner %u), want %d",
		 slot + 1, what, n_new, owner, want);
	rc = share_seq_create(s->eng, (uint64_t)slot + 1, src, nsrc, n_new, owner, &L, &e);
	if (want) {
		EXPECT(s, rc == want, "seq_create = %d (%s), model %d (need %u, %" PRIu64
		       " free, %" PRIu64 " evictable)", rc, e.msg, want, need,
		       s->st.tier[KVP_TIER_DEVICE].frames_free, ev);
		if (want == -ENOMEM)
			s->o.nomem++;
		else
			s->o.errors++;
		s->may_evict = false;
		s->need = 0;
		s->nochange = true;
		return;
	}
	EXPECT(s, rc == 0, "seq_create = %d (%s); model: fits (need %u, %" PRIu64 " free, %"
	       PRIu64 " evictable)", rc, e.msg, need, s->st.tier[KVP_TIER_DEVICE].frames_free, ev);
	check_lease_shape(s, &L, total, n_new);
	EXPECT(s, !n_new == !L.id, "lease id %#" PRIx64 " with n_new %u", L.id, n_new);
	nq.live = true;
	nq.id = (uint64_t)slot + 1;
	nq.owner = owner;
	uint32_t p = 0, pos = 0;
	for (uint32_t i = 0; i < nsrc; i++) {
		uint32_t np = pages_for(toks[i]);

		for (uint32_t k = 0; k < np; k++, p++) {
			struct pref r;

			if (kinds[i] == KVP_SRC_USER) {
				r = (struct pref){ PK_HIST, objs[i], L.frames[p] };
			} else if (kinds[i] == KVP_SRC_CHUNK) {
				r = (struct pref){ PK_CHUNK, objs[i], s->c[objs[i]].frames[k] };
			} else {
				r = s->q[objs[i]].pg[k];
				if (r.kind == PK_REF)
					s->sp[r.obj].refs++;
			}
			EXPECT(s, kinds[i] == KVP_SRC_USER || L.frames[p] == r.frame ||
			       (cow && p + 1 == pages_for(total)),
			       "page %u (source %u page %u) is frame %u, the source has %u",
			       p, i, k, L.frames[p], r.frame);
			nq.pg[p] = r;
		}
		if (kinds[i] == KVP_SRC_USER) {
			nq.upin[objs[i]]++;
		} else if (kinds[i] == KVP_SRC_CHUNK) {
			nq.chold[objs[i]]++;
		} else {
			for (int u = 0; u < NUSERS; u++)
				nq.upin[u] += s->q[objs[i]].upin[u];
			for (int r = 0; r < NCREC; r++)
				nq.chold[r] += s->q[objs[i]].chold[r];
			/* the parents of the published pages it takes over */
			for (uint32_t k = 0; k < s->q[objs[i]].nanchors; k++) {
				int a = s->q[objs[i]].anchors[k];

				s->sp[a].refs++;
				nq.anchors[nq.nanchors++] = a;
			}
		}
		for (uint32_t t = 0; t < toks[i]; t++, pos++)
			nq.keys[pos] = kinds[i] == KVP_SRC_USER ? hist_key(s, objs[i], t) :
				       kinds[i] == KVP_SRC_CHUNK ?
				       chunk_key(s->c[objs[i]].content, s->c[objs[i]].gen, t) :
				       s->q[objs[i]].keys[t];
	}
	if (cow) {
		struct pref *r = &nq.pg[p - 1];

		/* (a history's frames are not known here: its COW shows in the
		 * frame count instead) */
		EXPECT(s, r->kind == PK_HIST || L.frames[p - 1] != r->frame, "the last "
		       "source ends mid-page and n_new %u > 0, but page %u is still the "
		       "source's frame %u", n_new, p - 1, r->frame);
		if (r->kind == PK_REF)
			sp_unref(s, r->obj);
		*r = (struct pref){ PK_REF, sp_new(s, L.frames[p - 1]), L.frames[p - 1] };
		s->o.cows++;
	}
	for (; p < L.npages; p++)
		nq.pg[p] = (struct pref){ PK_REF, sp_new(s, L.frames[p]), L.frames[p] };
	nq.npg = L.npages;
	nq.len = total;
	nq.wl = L.id;
	nq.n_new = n_new;
	nq.wkey = ++s->keyseq * 0x100000001ull;
	*q = nq;
	/* chunks held by this sequence */
	for (uint32_t i = 0; i < nsrc; i++)
		if (kinds[i] == KVP_SRC_CHUNK)
			s->c[objs[i]].holders = chunk_holders(s, objs[i]);
	s->o.creates++;
}

static void op_seq_extend(struct sim *s)
{
	struct mseq *q = seq_pick_live(s);
	uint32_t n_new, toks[MAXTOK], stream = rnd(s, 4);
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	bool with_toks;
	int rc;

	if (!q)
		return;
	n_new = 1 + rnd(s, 8);
	if (q->len + n_new > MAXTOK)
		return;
	for (uint32_t i = 0; i < n_new; i++)
		toks[i] = vocab(stream, q->len + i);
	struct pref *last = q->npg ? &q->pg[q->npg - 1] : NULL;
	bool cow = q->len % P && last &&
		   (last->kind != PK_REF || s->sp[last->obj].refs > 1 ||
		    s->sp[last->obj].pub);
	with_toks = q->hashable && chance(s, 80);
	uint32_t need = pages_for(q->len + n_new) - q->npg + cow;
	uint64_t ev = evictable(s, -1, NULL, NULL);
	bool busy = q->wl != 0;
	snprintf(s->op, sizeof(s->op), "seq_extend(seq %" PRIu64 ", n_new %u, %s): len %u, %s, "
		 "cow %d, need %u", q->id, n_new, with_toks ? "tokens" : "no tokens", q->len,
		 busy ? "write lease open" : "no lease", cow, need);
	rc = share_seq_extend(s->eng, q->id, n_new, with_toks ? toks : NULL, q->owner, &L, &e);
	if (busy) {
		EXPECT(s, rc == -EBUSY, "extend with an uncommitted lease = %d (%s)", rc, e.msg);
		s->nochange = true;
		s->o.errors++;
		return;
	}
	if (!plan(s, need, ev)) {
		EXPECT(s, rc == -ENOMEM, "extend needing %u = %d (%s)", need, rc, e.msg);
		s->nochange = true;
		s->o.nomem++;
		return;
	}
	EXPECT(s, rc == 0, "extend = %d (%s); model: fits (%" PRIu64 " free, %" PRIu64
	       " evictable)", rc, e.msg, s->st.tier[KVP_TIER_DEVICE].frames_free, ev);
	check_lease_shape(s, &L, q->len, n_new);
	for (uint32_t i = 0; i + 1 < q->npg; i++)
		EXPECT(s, L.frames[i] == q->pg[i].frame, "extend moved page %u: %u -> %u", i,
		       q->pg[i].frame, L.frames[i]);
	if (q->npg) {
		uint32_t i = q->npg - 1;

		EXPECT(s, (L.frames[i] != q->pg[i].frame) == cow, "last page %u: frame %u -> %u, "
		       "model cow %d", i, q->pg[i].frame, L.frames[i], cow);
		if (cow) {
			seq_drop_page(s, q, i);
			q->pg[i] = (struct pref){ PK_REF, sp_new(s, L.frames[i]), L.frames[i] };
			s->o.cows++;
		}
	}
	for (uint32_t i = q->npg; i < L.npages; i++)
		q->pg[i] = (struct pref){ PK_REF, sp_new(s, L.frames[i]), L.frames[i] };
	q->npg = L.npages;
	if (with_toks) {
		memcpy(q->toks + q->len, toks, n_new * sizeof(uint32_t));
	} else {
		q->hashable = false;
	}
	q->wtoks = with_toks;
	q->wkey = ++s->keyseq * 0x100000001ull;
	q->wl = L.id;
	q->n_new = n_new;
	q->written = 0;
	s->o.extends++;
}

/* New token keys of q's open lease: rolling keys when it publishes. */
static uint64_t new_key(struct sim *s, struct mseq *q, uint32_t i)
{
	uint32_t pos = q->len + i;

	if (q->wtoks)
		return roll(pos ? q->keys[pos - 1] : 0xfeed, q->toks[pos]);
	return mix64(q->wkey + pos) | 1;
}

/* Write, commit k of the written tokens (or roll back), release. */
static void op_seq_lease(struct sim *s)
{
	struct mseq *q = seq_pick_live(s);
	uint64_t keys[MAXTOK];
	struct errbuf e = { .msg = "" };
	int rc;

	if (!q || !q->wl)
		return;
	uint32_t w = chance(s, 80) ? q->n_new : rnd(s, q->n_new + 1);
	/* keys must chain: compute them in order */
	for (uint32_t i = 0; i < q->n_new; i++) {
		keys[i] = new_key(s, q, i);
		q->keys[q->len + i] = keys[i];
	}
	lease_write(s, q->wl, 0, w, keys);
	bool commit = chance(s, 85);
	uint32_t k = commit ? (chance(s, 75) ? w : rnd(s, w + 1)) : 0;
	uint32_t newfull = 0;
	snprintf(s->op, sizeof(s->op), "seq %" PRIu64 ": wrote %u of %u new, %s %u, release",
		 q->id, w, q->n_new, commit ? "commit" : "roll back", k);
	if (commit) {
		struct kvp_stats before = s->st;

		rc = engine_commit(s->eng, q->wl, k, &e);
		EXPECT(s, rc == 0, "commit = %d (%s)", rc, e.msg);
		q->len += k;
		seq_truncate(s, q, pages_for(q->len));
		newfull = seq_publish(s, q);
		engine_stats(s->eng, &s->st);
		EXPECT(s, s->st.prefix_dedupe_pages - before.prefix_dedupe_pages == newfull,
		       "prefix_dedupe_pages grew by %" PRIu64 ", model %u",
		       s->st.prefix_dedupe_pages - before.prefix_dedupe_pages, newfull);
		s->st = before;
		s->o.commits++;
		s->o.dedupes += newfull;
	}
	rc = engine_release(s->eng, q->wl, &e);
	EXPECT(s, rc == 0, "release of a seq write lease = %d (%s)", rc, e.msg);
	if (!commit) {
		seq_truncate(s, q, pages_for(q->len));
		s->o.rollbacks++;
	}
	q->wl = 0;
	q->n_new = 0;
}

static void op_seq_free(struct sim *s)
{
	struct mseq *q = seq_pick_live(s);
	struct errbuf e = { .msg = "" };
	int rc;

	if (!q)
		return;
	snprintf(s->op, sizeof(s->op), "seq_free(seq %" PRIu64 ")", q->id);
	rc = share_seq_free(s->eng, q->id, q->owner, &e);
	if (q->wl) {
		/* Its write lease is held: refused, nothing changes (share.h). */
		EXPECT(s, rc == -EBUSY, "seq_free under a held write lease = %d (%s); "
		       "want -EBUSY", rc, e.msg);
		return;
	}
	EXPECT(s, rc == 0, "seq_free = %d (%s)", rc, e.msg);
	seq_destroy(s, q);
	s->o.frees++;
}

/* ------------------------------------------------------------ histories */

static struct mhl *hl_find_user_writer(struct sim *s, int u)
{
	for (uint32_t i = 0; i < s->nhl; i++)
		if (s->hl[i].u == u && s->hl[i].id == s->u[u].writer)
			return &s->hl[i];
	return NULL;
}

static uint32_t hist_reserved(struct sim *s, int u)
{
	struct mhl *w = s->u[u].writer ? hl_find_user_writer(s, u) : NULL;

	return w ? pages_for(s->u[u].len + w->n_new) - pages_for(s->u[u].len) : 0;
}

static void hl_release(struct sim *s, uint32_t i)
{
	struct mhl *h = &s->hl[i];
	struct muser *m = &s->u[h->u];

	if (m->writer == h->id)
		m->writer = 0;
	m->leases--;
	s->hl[i] = s->hl[--s->nhl];
}

static void op_prepare(struct sim *s)
{
	int u = (int)rnd(s, NUSERS);
	struct muser *m = &s->u[u];
	uint32_t n_new = rnd(s, 9), owner = 1 + rnd(s, NOWNERS);
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	int rc;

	if (s->nhl == MAXHL)
		return;
	if (m->len + n_new > HMAX) {
		/* keep histories short: drop it when nothing pins it */
		snprintf(s->op, sizeof(s->op), "evict(user %d), len %u, pinned %d", u, m->len,
			 user_pinned(s, u));
		rc = engine_evict(s->eng, m->key, KVP_SEL_ALL, &e);
		if (user_pinned(s, u)) {
			EXPECT(s, rc == -EBUSY, "evict of a pinned user = %d (%s)", rc, e.msg);
			s->nochange = true;
			return;
		}
		EXPECT(s, rc >= 0, "evict = %d (%s)", rc, e.msg);
		m->len = 0;
		m->gen++;
		return;
	}
	bool busy = m->writer && n_new;
	uint32_t need = busy ? 0 : pages_for(m->len + n_new) - pages_for(m->len);
	uint64_t ev = evictable(s, u, NULL, NULL);
	snprintf(s->op, sizeof(s->op), "prepare(user %d, %u, n_new %u, owner %u): need %u",
		 u, m->len, n_new, owner, need);
	rc = engine_prepare(s->eng, m->key, m->len, n_new, owner, &L, &e);
	if (busy) {
		EXPECT(s, rc == -EBUSY, "prepare with a writer = %d (%s)", rc, e.msg);
		s->nochange = true;
		return;
	}
	if (!plan(s, need, ev)) {
		EXPECT(s, rc == -ENOMEM, "prepare needing %u = %d (%s)", need, rc, e.msg);
		s->nochange = true;
		s->o.nomem++;
		return;
	}
	EXPECT(s, rc == 0, "prepare = %d (%s); model: fits (%" PRIu64 " free, %" PRIu64
	       " evictable)", rc, e.msg, s->st.tier[KVP_TIER_DEVICE].frames_free, ev);
	EXPECT(s, L.len == m->len, "prepare: len %" PRIu64 ", model %u", L.len, m->len);
	s->hl[s->nhl++] = (struct mhl){ L.id, u, owner, n_new, 0, m->len, false };
	m->leases++;
	if (n_new)
		m->writer = L.id;
	s->o.prepares++;
}

static void op_hist_lease(struct sim *s)
{
	uint64_t keys[16];
	struct errbuf e = { .msg = "" };
	int rc;

	if (!s->nhl)
		return;
	uint32_t i = rnd(s, s->nhl);
	struct mhl *h = &s->hl[i];
	struct muser *m = &s->u[h->u];

	snprintf(s->op, sizeof(s->op), "history lease %#" PRIx64 " (user %d, n_new %u): "
		 "write, commit, release", h->id, h->u, h->n_new);
	if (h->n_new && !h->committed && chance(s, 80)) {
		for (uint32_t t = 0; t < h->n_new; t++)
			keys[t] = hist_key(s, h->u, m->len + t);
		lease_write(s, h->id, 0, h->n_new, keys);
		uint32_t k = rnd(s, h->n_new + 1);
		rc = engine_commit(s->eng, h->id, k, &e);
		EXPECT(s, rc == 0, "commit = %d (%s)", rc, e.msg);
		m->len += k;
		m->writer = 0;
		h->committed = true;
	}
	rc = engine_release(s->eng, h->id, &e);
	EXPECT(s, rc == 0, "release = %d (%s)", rc, e.msg);
	hl_release(s, i);
}

/* ------------------------------------------------------------ chunks */

static uint32_t content_len(int c)
{
	return 1 + (uint32_t)(c * 7 % 12);
}

static uint32_t content_type(int c)
{
	return (uint32_t)(c % 3) + 1;
}

static void content_tokens(int c, uint32_t *out)
{
	for (uint32_t i = 0; i < content_len(c); i++)
		out[i] = 5000 + (uint32_t)c * 100 + i;
}

static int crec_new(struct sim *s)
{
	for (int r = 0; r < NCREC; r++)
		if (!s->c[r].live)
			return r;
	return -1;
}

static void op_chunk_register(struct sim *s)
{
	int c = (int)rnd(s, NCONTENT), r = s->reg[c];
	uint32_t toks[16], n = content_len(c), owner = 1 + rnd(s, NOWNERS);
	char meta[32];
	struct share_chunk_reg out;
	struct errbuf e = { .msg = "" };
	int rc, nr = crec_new(s);

	if (nr < 0)
		return;
	content_tokens(c, toks);
	snprintf(meta, sizeof(meta), "{\"c\":%d,\"t\":%u}", c, content_type(c));
	uint64_t ev = evictable(s, -1, NULL, NULL);
	snprintf(s->op, sizeof(s->op), "chunk_register(content %d, %u tokens, owner %u): %s",
		 c, n, owner, r < 0 ? "new" : s->c[r].ready ? "ready" : "filling");
	rc = share_chunk_register(s->eng, toks, n, content_type(c), meta, owner, s->now,
				  &out, &e);
	s->o.registers++;
	if (r >= 0) {
		EXPECT(s, rc == 0 && !out.created && !memcmp(out.id.b, s->c[r].id.b, 32) &&
		       out.state == (s->c[r].ready ? KVP_CHUNK_READY : KVP_CHUNK_FILLING),
		       "register of an existing chunk = %d (%s), created %d state %u", rc,
		       e.msg, out.created, out.state);
		s->o.reg_hits++;
		return;
	}
	if (!plan(s, pages_for(n), ev)) {
		EXPECT(s, rc == -ENOMEM, "register needing %u = %d (%s)", pages_for(n), rc, e.msg);
		s->nochange = true;
		s->o.nomem++;
		return;
	}
	EXPECT(s, rc == 0 && out.created && out.state == KVP_CHUNK_FILLING,
	       "register = %d (%s) created %d; model: fits", rc, e.msg, out.created);
	check_lease_shape(s, &out.lease, 0, n);
	struct mchunk *k = &s->c[nr];
	memset(k, 0, sizeof(*k));
	k->live = k->registered = true;
	k->content = c;
	k->gen = ++s->cgen[c];
	k->id = out.id;
	k->ntok = n;
	k->npages = pages_for(n);
	memcpy(k->frames, out.lease.frames, k->npages * sizeof(uint32_t));
	k->filler = owner;
	k->fill_lease = out.lease.id;
	s->reg[c] = nr;
}

/* Fill (part of) a chunk being filled, then seal, abandon, or wait. */
static void op_chunk_fill(struct sim *s)
{
	uint64_t keys[16];
	struct errbuf e = { .msg = "" };
	int r = (int)rnd(s, NCREC), rc;

	for (int k = 0; k < NCREC; k++, r = (r + 1) % NCREC)
		if (s->c[r].live && s->c[r].registered && !s->c[r].ready)
			break;
	struct mchunk *k = &s->c[r];
	if (!k->live || !k->registered || k->ready)
		return;
	uint32_t w = k->ntok;
	for (uint32_t t = 0; t < w; t++)
		keys[t] = chunk_key(k->content, k->gen, t);
	uint32_t what = rnd(s, 100);
	snprintf(s->op, sizeof(s->op), "chunk rec %d (content %d): %s", r, k->content,
		 what < 55 ? "seal" : what < 75 ? "commit-seal" : what < 85 ? "wrong owner seal"
		 : "abandon (release the fill lease)");
	lease_write(s, k->fill_lease, 0, w, keys);
	if (what < 55) {
		rc = share_chunk_seal(s->eng, k->fill_lease, k->filler, &e);
	} else if (what < 75) {
		rc = engine_commit(s->eng, k->fill_lease, k->ntok, &e);
		EXPECT(s, rc == 0, "commit-seal = %d (%s)", rc, e.msg);
		/* share.h: "commit(n == tokens) seals the chunk (same as
		 * share_chunk_seal)", and a seal ends the lease; a lease that
		 * stays open is released like any committed lease */
		rc = engine_release(s->eng, k->fill_lease, &e);
		EXPECT(s, rc == 0 || rc == -ENOENT, "release after commit-seal = %d (%s)",
		       rc, e.msg);
		s->o.commit_seal_left_open += rc == 0;
		rc = 0;
	} else if (what < 85) {
		rc = share_chunk_seal(s->eng, k->fill_lease, k->filler % NOWNERS + 1, &e);
		EXPECT(s, rc == -EPERM, "seal by another client = %d (%s)", rc, e.msg);
		s->nochange = true;
		return;
	} else {
		rc = engine_release(s->eng, k->fill_lease, &e);
		EXPECT(s, rc == 0, "release of a fill lease = %d (%s)", rc, e.msg);
		k->live = false;
		s->reg[k->content] = -1;
		s->o.abandons++;
		return;
	}
	EXPECT(s, rc == 0, "seal = %d (%s)", rc, e.msg);
	k->ready = true;
	k->fill_lease = 0;
	k->filler = 0;
	s->o.seals++;
}

static void op_chunk_acquire(struct sim *s)
{
	int c = (int)rnd(s, NCONTENT), r = s->reg[c];
	uint32_t owner = 1 + rnd(s, NOWNERS);
	struct kvp_chunk_id id;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	int rc;

	if (s->nrd == MAXRD)
		return;
	if (r >= 0) {
		id = s->c[r].id;
	} else {
		memset(&id, 0, sizeof(id));
		id.b[0] = (uint8_t)c;
		id.b[31] = 0x5a;
	}
	snprintf(s->op, sizeof(s->op), "chunk_acquire(content %d): %s", c,
		 r < 0 ? "absent" : s->c[r].ready ? "ready" : "filling");
	rc = share_chunk_acquire(s->eng, &id, owner, s->now, &L, &e);
	if (r < 0 || !s->c[r].ready) {
		EXPECT(s, rc == (r < 0 ? -ENOENT : -EAGAIN), "acquire = %d (%s)", rc, e.msg);
		s->nochange = true;
		s->o.eagain += r >= 0;
		return;
	}
	EXPECT(s, rc == 0, "acquire of a ready chunk = %d (%s)", rc, e.msg);
	check_lease_shape(s, &L, s->c[r].ntok, 0);
	for (uint32_t i = 0; i < L.npages; i++)
		EXPECT(s, L.frames[i] == s->c[r].frames[i], "acquire page %u: frame %u, the "
		       "chunk's is %u", i, L.frames[i], s->c[r].frames[i]);
	s->rd[s->nrd++] = (struct mread){ L.id, r, owner };
	s->o.acquires++;
}

static void op_read_release(struct sim *s)
{
	struct errbuf e = { .msg = "" };

	if (!s->nrd)
		return;
	uint32_t i = rnd(s, s->nrd);
	int r = s->rd[i].rec;
	snprintf(s->op, sizeof(s->op), "release chunk read lease %#" PRIx64, s->rd[i].id);
	int rc = engine_release(s->eng, s->rd[i].id, &e);
	EXPECT(s, rc == 0, "release = %d (%s)", rc, e.msg);
	s->rd[i] = s->rd[--s->nrd];
	chunk_maybe_free(s, r);
}

static void chunk_unregister(struct sim *s, int r)
{
	s->reg[s->c[r].content] = -1;
	s->c[r].registered = false;
	if (chunk_holders(s, r))
		s->o.zombies++;
	chunk_maybe_free(s, r);
}

static void op_chunk_admin(struct sim *s)
{
	struct errbuf e = { .msg = "" };
	uint32_t what = rnd(s, 100);
	int rc;

	if (what < 45) {
		int c = (int)rnd(s, NCONTENT), r = s->reg[c];
		struct kvp_chunk_id id;

		if (r >= 0 && !s->c[r].ready)
			return;   /* deleting a chunk being filled: not specified */
		memset(&id, 0x44, sizeof(id));
		if (r >= 0)
			id = s->c[r].id;
		snprintf(s->op, sizeof(s->op), "chunk_delete(content %d)%s", c,
			 r < 0 ? ": absent" : "");
		rc = share_chunk_delete(s->eng, &id, &e);
		if (r < 0) {
			EXPECT(s, rc == -ENOENT, "delete of an absent chunk = %d", rc);
			s->nochange = true;
			return;
		}
		EXPECT(s, rc >= 0, "delete = %d (%s)", rc, e.msg);
		chunk_unregister(s, r);
		s->o.deletes++;
	} else if (what < 65) {
		uint32_t type = rnd(s, 4), want = 0;

		for (int c = 0; c < NCONTENT; c++)
			if (s->reg[c] >= 0 && (!type || content_type(c) == type)) {
				if (!s->c[s->reg[c]].ready)
					return; /* clear of a chunk being filled: not specified */
				want++;
			}
		snprintf(s->op, sizeof(s->op), "chunk_clear(type %u): model %u", type, want);
		rc = share_chunk_clear(s->eng, type);
		EXPECT(s, rc == (int)want, "clear = %d, model %u", rc, want);
		for (int c = 0; c < NCONTENT; c++)
			if (s->reg[c] >= 0 && (!type || content_type(c) == type))
				chunk_unregister(s, s->reg[c]);
		s->o.clears++;
	} else if (what < 85) {
		uint64_t max_age = (rnd(s, 200) * 1000 + 500) * 1000ull;
		uint32_t want = 0;
		bool go[NCREC] = { false };

		for (int r = 0; r < NCREC; r++) {
			struct kvp_chunk_info ci;

			if (!s->c[r].live || !s->c[r].registered || !s->c[r].ready ||
			    chunk_holders(s, r))
				continue;
			rc = share_chunk_info(s->eng, &s->c[r].id, &ci, &e);
			EXPECT(s, rc == 0, "info of a registered chunk = %d (%s)", rc, e.msg);
			if (s->now - ci.last_access_ns >= max_age) {
				go[r] = true;
				want++;
			}
		}
		snprintf(s->op, sizeof(s->op), "evict_unused(%" PRIu64 " ns): model %u", max_age,
			 want);
		rc = share_chunk_evict_unused(s->eng, max_age, s->now);
		EXPECT(s, rc == (int)want, "evict_unused = %d, model %u", rc, want);
		for (int r = 0; r < NCREC; r++)
			if (go[r])
				chunk_unregister(s, r);
		s->chunk_evicted_expect += want;
		s->o.evict_unused++;
	} else {
		uint32_t type = rnd(s, 4), want = 0;
		struct kvp_chunk_info rows[NCONTENT];
		bool more = true;

		for (int c = 0; c < NCONTENT; c++)
			want += s->reg[c] >= 0 && (!type || content_type(c) == type);
		snprintf(s->op, sizeof(s->op), "chunk_list(type %u): model %u", type, want);
		rc = share_chunk_list(s->eng, type, NULL, NULL, rows, NCONTENT, &more, &e);
		EXPECT(s, rc == (int)want && !more, "list = %d more %d (%s), model %u", rc, more,
		       e.msg, want);
		for (int i = 0; i < rc; i++) {
			/* meta is {"c":N,"t":T}; rows are names, the model's
			 * ids the root entries'. */
			int c = atoi(rows[i].meta + 5);
			int r = c >= 0 && c < NCONTENT ? s->reg[c] : -1;

			EXPECT(s, r >= 0 && !memcmp(rows[i].root.b, s->c[r].id.b, 32) &&
			       rows[i].tokens == s->c[r].ntok &&
			       rows[i].state == (s->c[r].ready ? KVP_CHUNK_READY : KVP_CHUNK_FILLING) &&
			       (rows[i].holders > 0) == (chunk_holders(s, r) > 0),
			       "list row %d (meta \"%s\") disagrees with the model", i, rows[i].meta);
		}
		s->nochange = true;
	}
}

/* ------------------------------------------------------------ compositions */

static int ready_of_type(struct sim *s, uint32_t type)
{
	int c = (int)rnd(s, NCONTENT);

	for (int k = 0; k < NCONTENT; k++, c = (c + 1) % NCONTENT)
		if (content_type(c) == type && s->reg[c] >= 0 && s->c[s->reg[c]].ready)
			return s->reg[c];
	return -1;
}

static void op_compose(struct sim *s)
{
	struct kvp_compose_req reqs[3];
	struct kvp_chunk_id ctx[3][2];
	int recs[16], nrecs = 0, qrec[3];
	uint32_t nreq = 1 + rnd(s, 3), cmax = 0, owner = 1 + rnd(s, NOWNERS);
	bool preview = chance(s, 30);
	struct share_composition out;
	struct errbuf e = { .msg = "" };
	uint64_t tokens = 0;
	int rc;

	if (s->ncomp == MAXCOMP && !preview)
		return;
	memset(reqs, 0, sizeof(reqs));
	for (uint32_t i = 0; i < nreq; i++) {
		int sys = ready_of_type(s, KVP_CHUNK_SYSTEM), q = ready_of_type(s, KVP_CHUNK_QUERY);
		uint32_t nc = rnd(s, 3);

		if (sys < 0 || q < 0)
			return;
		reqs[i].system = s->c[sys].id;
		reqs[i].query = s->c[q].id;
		reqs[i].qo_len = rnd(s, 3);
		recs[nrecs++] = sys;
		recs[nrecs++] = q;
		qrec[i] = q;
		tokens += s->c[sys].ntok + s->c[q].ntok;
		for (uint32_t k = 0; k < nc; k++) {
			int cx = ready_of_type(s, KVP_CHUNK_CONTEXT);

			if (cx < 0)
				return;
			ctx[i][k] = s->c[cx].id;
			recs[nrecs++] = cx;
			tokens += s->c[cx].ntok;
		}
		reqs[i].contexts = nc ? ctx[i] : NULL;
		reqs[i].ncontexts = nc;
		cmax = nc > cmax ? nc : cmax;
	}
	snprintf(s->op, sizeof(s->op), "compose(%u requests, %u levels%s)", nreq, cmax + 2,
		 preview ? ", preview" : "");
	rc = share_compose(s->eng, reqs, nreq, preview, owner, s->now, &out, &e);
	/* The model registers roots only: a query root does not follow its
	 * request's system, so compose refuses the chain and holds nothing
	 * (chains are test_share's compose tests). */
	EXPECT(s, rc == -EINVAL && strstr(e.msg, "chain is broken") &&
	       strstr(e.msg, "request 0"), "compose of root chunks = %d (%s)", rc, e.msg);
	(void)tokens;
	(void)qrec;
	(void)recs;
	(void)nrecs;
	s->nochange = true;
	s->o.composes++;
}

static void op_comp_release(struct sim *s)
{
	struct errbuf e = { .msg = "" };

	if (!s->ncomp)
		return;
	uint32_t i = rnd(s, s->ncomp);
	struct mcomp m = s->comp[i];
	snprintf(s->op, sizeof(s->op), "release composition %#" PRIx64, m.lease);
	int rc = engine_release(s->eng, m.lease, &e);
	EXPECT(s, rc == 0, "release = %d (%s)", rc, e.msg);
	s->comp[i] = s->comp[--s->ncomp];
	for (uint32_t k = 0; k < m.nrecs; k++)
		chunk_maybe_free(s, m.recs[k]);
}

/* ------------------------------------------------------------ a client dies */

static void owner_dies(struct sim *s, uint32_t owner)
{
	snprintf(s->op, sizeof(s->op), "release_owner(%u)", owner);
	engine_release_owner(s->eng, owner);
	for (uint32_t i = s->ncomp; i-- > 0;)
		if (s->comp[i].owner == owner) {
			struct mcomp m = s->comp[i];

			s->comp[i] = s->comp[--s->ncomp];
			for (uint32_t k = 0; k < m.nrecs; k++)
				chunk_maybe_free(s, m.recs[k]);
		}
	for (uint32_t i = s->nhl; i-- > 0;)
		if (s->hl[i].owner == owner)
			hl_release(s, i);
	for (uint32_t i = s->nrd; i-- > 0;)
		if (s->rd[i].owner == owner) {
			int r = s->rd[i].rec;

			s->rd[i] = s->rd[--s->nrd];
			chunk_maybe_free(s, r);
		}
	for (int r = 0; r < NCREC; r++)
		if (s->c[r].live && s->c[r].registered && !s->c[r].ready &&
		    s->c[r].filler == owner) {
			s->c[r].live = false;
			s->reg[s->c[r].content] = -1;
		}
	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live && s->q[i].owner == owner)
			seq_destroy(s, &s->q[i]);
	s->o.owner_deaths++;
}

static void op_release_owner(struct sim *s)
{
	owner_dies(s, 1 + rnd(s, NOWNERS));
}

/* ------------------------------------------------------------ the check */

static void sweep_bytes(struct sim *s)
{
	struct errbuf e = { .msg = "" };
	uint64_t keys[MAXTOK];
	int rc;

	for (int u = 0; u < NUSERS; u++) {
		uint32_t n = s->u[u].len;

		if (!n)
			continue;
		rc = engine_read_tokens(s->eng, s->u[u].key, 0, n, s->buf, &e);
		EXPECT(s, rc == 0, "read user %d = %d (%s)", u, rc, e.msg);
		for (uint32_t t = 0; t < n; t++)
			keys[t] = hist_key(s, u, t);
		expect_keys(s, s->buf, keys, n, "history");
	}
	for (int i = 0; i < NSEQS; i++) {
		struct mseq *q = &s->q[i];
		uint32_t fr[MAXPG];
		char what[64];

		if (!q->live || !q->len)
			continue;
		rc = share_seq_read_tokens(s->eng, q->id, 0, q->len, s->buf, &e);
		EXPECT(s, rc == 0, "read seq %" PRIu64 " = %d (%s)", q->id, rc, e.msg);
		snprintf(what, sizeof(what), "seq %" PRIu64 " (share_seq_read_tokens)", q->id);
		expect_keys(s, s->buf, q->keys, q->len, what);
		for (uint32_t p = 0; p < q->npg; p++)
			fr[p] = q->pg[p].frame;
		read_frames(s, fr, q->len);
		snprintf(what, sizeof(what), "seq %" PRIu64 " (its page table)", q->id);
		expect_keys(s, s->buf, q->keys, q->len, what);
	}
	for (int r = 0; r < NCREC; r++) {
		struct mchunk *k = &s->c[r];

		if (!k->live || !k->ready)
			continue;
		for (uint32_t t = 0; t < k->ntok; t++)
			keys[t] = chunk_key(k->content, k->gen, t);
		read_frames(s, k->frames, k->ntok);
		expect_keys(s, s->buf, keys, k->ntok, k->registered ? "chunk" : "deleted chunk");
		if (k->registered) {
			rc = share_chunk_read_tokens(s->eng, &k->id, 0, k->ntok, s->buf, &e);
			EXPECT(s, rc == 0, "chunk_read_tokens = %d (%s)", rc, e.msg);
			expect_keys(s, s->buf, keys, k->ntok, "chunk (read_tokens)");
		}
	}
	for (int i = 0; i < NSP; i++)
		if (s->sp[i].live && s->sp[i].pub && !s->sp[i].refs) {
			uint32_t fr[1] = { s->sp[i].frame };

			read_frames(s, fr, P);
			expect_keys(s, s->buf, s->sp[i].keys, P, "idle prefix page");
		}
	s->o.sweeps++;
}

/* Which idle prefix pages are still cached: a probe per page. */
static uint32_t sync_prefix(struct sim *s)
{
	uint32_t gone = 0, toks[MAXTOK + 1];

	for (int i = 0; i < NSP; i++) {
		struct spage *sp = &s->sp[i];
		struct share_prefix_hit h;
		uint32_t n = (sp->idx + 1) * P;

		if (!sp->live || !sp->pub || sp->refs)
			continue;
		memcpy(toks, sp->toks, n * sizeof(uint32_t));
		toks[n] = 1;
		share_prefix_lookup(s->eng, toks, n + 1, &h);
		if (h.tokens >= n && h.frames[sp->idx] == sp->frame)
			continue;
		sp->live = false;
		gone++;
	}
	/* leaves first: no cached page may have lost its parent */
	for (int i = 0; i < NSP; i++) {
		struct spage *sp = &s->sp[i];
		struct share_prefix_hit h;
		uint32_t n = (sp->idx + 1) * P;

		if (!sp->live || !sp->pub)
			continue;
		memcpy(toks, sp->toks, n * sizeof(uint32_t));
		toks[n] = 1;
		share_prefix_lookup(s->eng, toks, n + 1, &h);
		EXPECT(s, h.tokens >= n && h.frames[sp->idx] == sp->frame,
		       "prefix page %u (frame %u, %u refs) is not found by its own tokens: "
		       "%u found", sp->idx, sp->frame, sp->refs, h.tokens);
	}
	return gone;
}

static void check_step(struct sim *s)
{
	struct errbuf e = { .msg = "" };
	struct kvp_stats st;
	uint64_t used = 0, pub = 0, idle = 0, chunks = 0, leases = 0, seqs = 0;
	uint64_t freed = 0, dropped = 0, chunk_gone = 0;
	int rc = engine_check(s->eng, &e);

	EXPECT(s, rc == 0, "engine_check = %d: %s", rc, e.msg);
	engine_stats(s->eng, &st);
	/* histories */
	for (int u = 0; u < NUSERS; u++) {
		struct engine_user_info ni;

		engine_info(s->eng, s->u[u].key, &ni);
		if (s->u[u].len && !ni.exists) {
			EXPECT(s, s->may_evict && !user_pinned(s, u), "user %d (len %u, pinned %d) "
			       "vanished in an op that may not drop it", u, s->u[u].len,
			       user_pinned(s, u));
			freed += s->info[u].pages_device;
			s->u[u].len = 0;
			s->u[u].gen++;
			dropped++;
			s->o.drops++;
		} else if (ni.exists) {
			EXPECT(s, ni.len == s->u[u].len, "user %d len %" PRIu64 ", model %u", u,
			       ni.len, s->u[u].len);
			EXPECT(s, (ni.leases > 0) == user_pinned(s, u), "user %d: %u leases, model "
			       "pinned %d", u, ni.leases, user_pinned(s, u));
			used += ni.pages_device + hist_reserved(s, u);
		}
		s->info[u] = ni;
	}
	/* chunks evicted under pressure */
	if (s->may_evict)
		for (int r = 0; r < NCREC; r++) {
			struct kvp_chunk_info ci;

			if (!s->c[r].live || !s->c[r].registered || !s->c[r].ready ||
			    chunk_holders(s, r))
				continue;
			if (share_chunk_info(s->eng, &s->c[r].id, &ci, &e) == -ENOENT) {
				freed += s->c[r].npages;
				s->reg[s->c[r].content] = -1;
				s->c[r].live = false;
				chunk_gone++;
				s->o.chunk_evictions++;
			}
		}
	s->chunk_evicted_expect += chunk_gone;
	EXPECT(s, st.chunk_evicted - s->st.chunk_evicted == s->chunk_evicted_expect,
	       "chunk_evicted grew by %" PRIu64 ", model %" PRIu64,
	       st.chunk_evicted - s->st.chunk_evicted, s->chunk_evicted_expect);
	/* idle prefix pages evicted */
	if (s->may_evict || st.prefix_evicted_pages != s->st.prefix_evicted_pages) {
		uint32_t gone = sync_prefix(s);

		EXPECT(s, s->may_evict || !gone, "%u prefix pages vanished", gone);
		EXPECT(s, st.prefix_evicted_pages - s->st.prefix_evicted_pages == gone,
		       "prefix_evicted_pages grew by %" PRIu64 ", %u idle pages vanished",
		       st.prefix_evicted_pages - s->st.prefix_evicted_pages, gone);
		freed += gone;
		s->o.prefix_evictions += gone;
	}
	if (s->need)
		EXPECT(s, freed >= s->need, "the op needed %u frames beyond the free ones, "
		       "eviction freed %" PRIu64, s->need, freed);
	/* frames, gauges */
	for (int r = 0; r < NCREC; r++)
		if (s->c[r].live) {
			used += s->c[r].npages;
			chunks += s->c[r].registered;
			leases += s->c[r].registered && !s->c[r].ready;
		}
	for (int i = 0; i < NSP; i++)
		if (s->sp[i].live) {
			used++;
			pub += s->sp[i].pub;
			idle += s->sp[i].pub && !s->sp[i].refs;
		}
	for (int i = 0; i < NSEQS; i++) {
		seqs += s->q[i].live;
		leases += s->q[i].live && s->q[i].wl;
	}
	leases += s->nhl + s->nrd + s->ncomp;
	EXPECT(s, st.tier[KVP_TIER_DEVICE].frames_used == used &&
	       st.tier[KVP_TIER_DEVICE].frames_used + st.tier[KVP_TIER_DEVICE].frames_free ==
	       s->cfg->device_frames, "device frames used %" PRIu64 " (free %" PRIu64
	       "), model holds %" PRIu64, st.tier[KVP_TIER_DEVICE].frames_used,
	       st.tier[KVP_TIER_DEVICE].frames_free, used);
	EXPECT(s, st.seqs == seqs && st.chunks == chunks && st.prefix_pages == pub &&
	       st.prefix_idle_pages == idle && st.leases == leases,
	       "gauges: seqs %" PRIu64 "/%" PRIu64 " chunks %" PRIu64 "/%" PRIu64
	       " prefix %" PRIu64 "/%" PRIu64 " idle %" PRIu64 "/%" PRIu64 " leases %"
	       PRIu64 "/%" PRIu64 " (engine/model)", st.seqs, seqs, st.chunks, chunks,
	       st.prefix_pages, pub, st.prefix_idle_pages, idle, st.leases, leases);
	if (s->nochange)
		EXPECT(s, st.tier[KVP_TIER_DEVICE].frames_used ==
		       s->st.tier[KVP_TIER_DEVICE].frames_used && st.leases == s->st.leases &&
		       st.seqs == s->st.seqs && st.chunks == s->st.chunks &&
		       st.prefix_pages == s->st.prefix_pages && !dropped && !chunk_gone,
		       "a refused op changed the engine");
	/* every frame the model knows has one owner */
	{
		int16_t owner[MAXFRAMES];

		for (int f = 0; f < MAXFRAMES; f++)
			owner[f] = -1;
		for (int i = 0; i < NSP; i++)
			if (s->sp[i].live) {
				uint32_t f = s->sp[i].frame;

				EXPECT(s, owner[f] < 0, "frame %u: page record %d and owner %d", f, i,
				       owner[f]);
				owner[f] = (int16_t)i;
			}
		for (int r = 0; r < NCREC; r++)
			if (s->c[r].live)
				for (uint32_t p = 0; p < s->c[r].npages; p++) {
					uint32_t f = s->c[r].frames[p];

					EXPECT(s, owner[f] < 0, "frame %u: chunk record %d and owner %d",
					       f, r, owner[f]);
					owner[f] = (int16_t)(1000 + r);
				}
	}
	if (s->touch_all || s->step % SWEEP_EVERY == 0)
		sweep_bytes(s);
	s->st = st;
}

static void step_begin(struct sim *s)
{
	snprintf(s->op, sizeof(s->op), "?");
	s->nochange = s->may_evict = s->touch_all = false;
	s->need = 0;
	s->chunk_evicted_expect = 0;
	s->now += 1000000; /* 1 ms a step */
}

static void random_op(struct sim *s)
{
	uint32_t r = rnd(s, 1000);

	if (r < 130)
		op_prepare(s);
	else if (r < 230)
		op_hist_lease(s);
	else if (r < 360)
		op_seq_alloc(s);
	else if (r < 460)
		op_seq_create(s);
	else if (r < 530)
		op_seq_extend(s);
	else if (r < 650)
		op_seq_lease(s);
	else if (r < 700)
		op_seq_free(s);
	else if (r < 780)
		op_chunk_register(s);
	else if (r < 830)
		op_chunk_fill(s);
	else if (r < 870)
		op_chunk_acquire(s);
	else if (r < 900)
		op_read_release(s);
	else if (r < 930)
		op_chunk_admin(s);
	else if (r < 960)
		op_compose(s);
	else if (r < 990)
		op_comp_release(s);
	else
		op_release_owner(s);
}

static void run_model(const struct model_cfg *cfg)
{
	struct sim *s = calloc(1, sizeof(*s));
	struct engine_config ec = { .device_frames = cfg->device_frames };
	struct errbuf e = { .msg = "" };
	uint8_t salt[SHARE_SALT_BYTES];
	int rc;

	assert_non_null(s);
	assert_true(cfg->device_frames <= MAXFRAMES);
	assert_int_equal(kvp_layout_init(&ec.layout, 2, 2, 4, KVP_DTYPE_FP32, P, e.msg,
					 sizeof(e.msg)), 0);
	rc = engine_create(&s->eng, &ec, &e);
	if (rc)
		print_error("engine_create: %s\n", e.msg);
	assert_int_equal(rc, 0);
	s->cfg = cfg;
	s->l = engine_layout(s->eng);
	s->words = (uint32_t)(s->l->token_bytes / 4);
	s->rng = cfg->seed;
	s->now = 1000ull * 1000000000ull;
	s->sp = calloc(NSP, sizeof(*s->sp));
	s->buf = calloc((size_t)MAXTOK * 2 * s->words, sizeof(uint32_t));
	s->want = calloc(s->words, sizeof(uint32_t));
	s->slots = calloc(MAXTOK * 2, sizeof(*s->slots));
	assert_non_null(s->sp);
	assert_non_null(s->buf);
	assert_non_null(s->want);
	assert_non_null(s->slots);
	for (int i = 0; i < SHARE_SALT_BYTES; i++)
		salt[i] = (uint8_t)mix64(cfg->seed + (uint64_t)i);
	share_set_salt(s->eng, salt);
	for (int u = 0; u < NUSERS; u++)
		s->u[u].key = mix64(0x6b76ull + (uint64_t)u) | 1;
	for (int c = 0; c < NCONTENT; c++)
		s->reg[c] = -1;
	engine_stats(s->eng, &s->st);

	for (s->step = 1; s->step <= cfg->steps; s->step++) {
		step_begin(s);
		random_op(s);
		check_step(s);
	}
	/* the end: every client dies, everything unheld is dropped */
	s->step++;
	step_begin(s);
	for (uint32_t i = s->ncomp; i-- > 0;) {
		s->step++;
		step_begin(s);
		op_comp_release(s);
		check_step(s);
	}
	for (uint32_t o = 1; o <= NOWNERS; o++) {
		s->step++;
		step_begin(s);
		s->touch_all = true;
		owner_dies(s, o);
		check_step(s);
	}
	EXPECT(s, s->st.leases == 0 && s->st.seqs == 0, "after every client died: %" PRIu64
	       " leases, %" PRIu64 " seqs", s->st.leases, s->st.seqs);
	print_message("%s: %u ops; seqs: %" PRIu64 " allocs (%" PRIu64 " with hits), %" PRIu64
		      " creates, %" PRIu64 " cows, %" PRIu64 " extends, %" PRIu64 " commits, %"
		      PRIu64 " rollbacks, %" PRIu64 " frees, %" PRIu64 " dedupes; chunks: %"
		      PRIu64 " registers (%" PRIu64 " hits), %" PRIu64 " seals, %" PRIu64
		      " abandoned, %" PRIu64 " acquires, %" PRIu64 " not ready, %" PRIu64
		      " deletes, %" PRIu64 " held when deleted, %" PRIu64 " clears, %" PRIu64
		      " evict_unused; %" PRIu64 " composes, %" PRIu64 " prepares, %" PRIu64
		      " no-memory, %" PRIu64 " other errors, %" PRIu64 " deaths; evicted: %"
		      PRIu64 " histories, %" PRIu64 " chunks, %" PRIu64 " prefix pages; %"
		      PRIu64 " sweeps\n", cfg->name, cfg->steps, s->o.allocs, s->o.hits,
		      s->o.creates, s->o.cows, s->o.extends, s->o.commits, s->o.rollbacks,
		      s->o.frees, s->o.dedupes, s->o.registers, s->o.reg_hits, s->o.seals,
		      s->o.abandons, s->o.acquires, s->o.eagain, s->o.deletes, s->o.zombies,
		      s->o.clears, s->o.evict_unused, s->o.composes, s->o.prepares,
		      s->o.nomem, s->o.errors, s->o.owner_deaths, s->o.drops,
		      s->o.chunk_evictions, s->o.prefix_evictions, s->o.sweeps);
	if (s->o.commit_seal_left_open)
		print_message("%s: a commit that sealed a chunk left its fill lease open "
			      "%" PRIu64 " times (released after)\n", cfg->name,
			      s->o.commit_seal_left_open);
	EXPECT(s, s->o.hits && s->o.cows && s->o.dedupes && s->o.reg_hits && s->o.eagain &&
	       s->o.zombies && s->o.nomem && s->o.drops && s->o.chunk_evictions &&
	       s->o.prefix_evictions && s->o.composes && s->o.abandons && s->o.whole_hits,
	       "the random mix missed a path (see the counts above; whole-prompt "
	       "hits %" PRIu64 ")", s->o.whole_hits);
	engine_destroy(s->eng);
	free(s->sp);
	free(s->buf);
	free(s->want);
	free(s->slots);
	free(s);
}

static void test_share_model_small_pool(void **state)
{
	/* Compositions are rare this tight, and any change to the engine moves
	 * the random mix: the seed is one whose steps take every path. */
	static const struct model_cfg cfg = { .name = "16 device pages",
		.seed = 0x5ea7e0011ull, .steps = 50000, .device_frames = 16 };

	(void)state;
	run_model(&cfg);
}

static void test_share_model_medium_pool(void **state)
{
	static const struct model_cfg cfg = { .name = "24 device pages",
		.seed = 0x5ea7e0002ull, .steps = 50000, .device_frames = 24 };

	(void)state;
	run_model(&cfg);
}

static void test_share_model_large_pool(void **state)
{
	static const struct model_cfg cfg = { .name = "48 device pages",
		.seed = 0x5ea7e0003ull, .steps = 50000, .device_frames = 48 };

	(void)state;
	run_model(&cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_share_model_small_pool),
		cmocka_unit_test(test_share_model_medium_pool),
		cmocka_unit_test(test_share_model_large_pool),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
