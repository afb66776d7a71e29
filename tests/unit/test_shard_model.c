/* SPDX-License-Identifier: MIT */
/*
 * test_shard_model.c - one random trace of every engine operation, run step
 * by step against one engine (engine_create) and against a shard_set of
 * four shards with the same tiers (shard.h), the second driven by the
 * daemon's locking rules (ops.c). After every step the two must agree on
 * everything eviction's choice of victim cannot change.
 *
 * Why they may differ at all. A shard evicts its own oldest pages when its
 * cache, the pool and its own LRU cover a prepare, where the one engine
 * evicts the oldest of all; demotion makes room on the shard's own host
 * LRU. So the two sides may keep different victims, and after that their
 * idle prefix-cache pages differ, hence their prefix hits, hence how many
 * frames sequences hold. Everything else is deterministic.
 *
 * How the trace keeps them comparable. After every step, a user history or
 * a chunk one side evicted and the other kept is evicted from the other too
 * (a client's own evict / delete; counted as "reconciled"), so both sides
 * always hold the same users, tokens, leases, sequences and chunks: the
 * logical state below is one for both. Only where frames live (device or
 * host) and which idle prefix pages survive is per side. A sequence whose
 * alloc lease was rolled back with different prefix hits (so different
 * committed lengths) is freed on both; an op that succeeds on one side and
 * runs out of memory on the other is undone on the side it succeeded on.
 *
 * What must agree, after every operation:
 *  1. the result of every operation not decided by free memory: gaps,
 *     overlaps and a start before a trimmed head (-EINVAL, the same
 *     message), -EBUSY, -E2BIG, -ENOENT, -EEXIST, -EALREADY, -EPERM,
 *     -EAGAIN of a chunk being filled, compose's broken chain; a prepare's
 *     lease (start where tokens are cached, len, hit_tokens, n_new, npages,
 *     last_page_len); lease and sequence counts of a dead client;
 *     evict_all's skipped count; info and the user listing (user, start,
 *     len, leases); chunk ids, states, holders and listings;
 *  2. -ENOMEM, on each side on its own, exactly when the frames needed
 *     exceed that side's free + evictable frames (unpinned histories'
 *     device pages, idle prefix pages, ready chunks nobody holds), all read
 *     from that side's stats and infos before the op (for seq_alloc within
 *     the bracket its prefix hits leave: held or idle). So the two sides
 *     agree whenever they hold the same frames, and a prepare its shard
 *     cannot serve alone succeeds whenever the one engine would: the retry
 *     with every shard locked must find every free and evictable frame of
 *     the set. -ENOSPC of offload likewise against the host tier's free
 *     frames, wherever they sit (pool or any shard's cache);
 *  3. no history or chunk disappears in an op that may not evict, or while
 *     pinned or held; evicted_users and chunk_evicted count what vanished;
 *  4. committed lengths, starts and every committed token's bytes of every
 *     user, read back with engine_read_tokens on its owning shard; the
 *     bytes of every page a lease or a sequence hands out (prefix hits,
 *     borrowed history pages of any shard, chunk pages), read through its
 *     page table straight from the device tier; sequences and chunks read
 *     back; a sequence's partial last page copied before an extend writes
 *     it exactly when someone else sees it (borrowed, listed by another
 *     sequence, or published in the prefix cache);
 *  5. prefix lookups: hits never beyond what some committed sequence
 *     published, never short of what live sequences hold;
 *  6. gauges: users, leases, seqs, chunks, chunk_pages as the model says;
 *     seq_pages per side as its page tables say; host frames used == the
 *     histories' host pages; device frames used >= what histories, chunks
 *     and the prefix cache hold (== without sequences); engine_check() on
 *     the engine and on every shard, and shard_set_check(), pass;
 *  7. at the end, every client gone and everything evicted: no frame used
 *     but the idle prefix pages, in both.
 * The run must also have the sharded side retry prepares with every lock
 * and make sequences over users of every shard, or it proves little.
 *
 * Directed tests pin down global mode (a prepare its shard cannot serve
 * succeeds by evicting another shard's user, and reclaim_direct counts it;
 * one nothing can serve fails with -ENOMEM changing nothing) and the copy
 * of a published partial page that the random trace found missing.
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
#include "shard.h"
#include "share.h"

#define P 4u
#define NSHARDS 4u
#define NUSERS 16
#define NOWNERS 3
#define MAX_NEW 10          /* history n_new is 0..MAX_NEW */
#define MAXHL 8             /* history leases open */
#define NSEQS 10
#define NCONTENT 12         /* distinct chunk contents */
#define NCREC 40            /* chunk records (registered or deleted-held) */
#define MAXRD 6             /* chunk read leases open */
#define MAXTOK 64           /* tokens of a sequence */
#define MAXPG (MAXTOK / P)
#define MAXFR 64            /* device frames at most */
#define NSTALE 8
#define SWEEP_EVERY 50
#define PUBSET 8192         /* published prefix keys remembered */

enum { SA, SB, NSIDES };    /* the one engine, the shards */
static const char *const side_name[NSIDES] = { "one engine", "4 shards" };

struct model_cfg {
	const char *name;
	uint64_t seed;
	uint32_t steps;
	uint32_t device_frames;
	uint32_t host_frames;
	uint64_t max_tokens;    /* 0: unlimited */
	uint32_t hmax;          /* history tokens before the test evicts it */
};

/* ------------------------------------------------------------ the sides */

#define LOCK_NONE (-1)
#define LOCK_ALL (-2)

/*
 * One side: an engine alone, or a shard_set used as ops.c uses it: a user's
 * or a lease's shard locked for its operations, every shard for sharing,
 * a prepare its shard answers -EAGAIN retried with every lock held.
 */
struct side {
	struct engine *eng;       /* SA */
	struct shard_set *set;    /* SB */
	int32_t locked;
	uint64_t retries;         /* prepares retried in global mode */
	void *base;               /* the device tier */
};

static struct engine *lock_user(struct side *d, uint64_t user)
{
	if (!d->set)
		return d->eng;
	d->locked = (int32_t)shard_of_user(d->set, user);
	return shard_lock(d->set, (uint32_t)d->locked);
}

static struct engine *lock_lease(struct side *d, uint64_t lease)
{
	if (!d->set)
		return d->eng;
	d->locked = (int32_t)shard_of_lease(d->set, lease);
	return shard_lock(d->set, (uint32_t)d->locked);
}

static struct engine *lock_all(struct side *d)
{
	if (!d->set)
		return d->eng;
	d->locked = LOCK_ALL;
	return shard_lock_all(d->set);
}

/* op_lock_escalate: the shard's lock dropped, every lock taken. */
static struct engine *lock_escalate(struct side *d)
{
	uint32_t i = (uint32_t)d->locked;

	shard_unlock(d->set, i);
	shard_lock_all(d->set);
	d->locked = LOCK_ALL;
	return d->set->v[i].eng;
}

static void unlock(struct side *d)
{
	if (d->set && d->locked == LOCK_ALL)
		shard_unlock_all(d->set);
	else if (d->set && d->locked >= 0)
		shard_unlock(d->set, (uint32_t)d->locked);
	d->locked = LOCK_NONE;
}

/* A lease with its page table copied out (valid only until the next call
 * on its engine otherwise). */
struct tlease {
	struct engine_lease L;
	uint32_t frames[MAXFR];
};

static void tl_copy(struct tlease *t, const struct engine_lease *L)
{
	t->L = *L;
	if (L->npages) /* frames may be NULL without pages */
		memcpy(t->frames, L->frames, (L->npages < MAXFR ? L->npages : MAXFR) *
		       sizeof(uint32_t));
	t->L.frames = t->frames;
}

/* op_prepare: -EAGAIN from the user's shard, then again with every lock. */
static int sd_prepare(struct side *d, uint64_t user, uint64_t pos, uint32_t n,
		      uint32_t owner, struct tlease *out, struct errbuf *e)
{
	struct engine *eng = lock_user(d, user);
	struct engine_lease L;
	int rc = engine_prepare(eng, user, pos, n, owner, &L, e);

	if (rc == -EAGAIN && d->set) {
		d->retries++;
		eng = lock_escalate(d);
		e->msg[0] = '\0';
		rc = engine_prepare(eng, user, pos, n, owner, &L, e);
		if (rc == -EAGAIN)
			rc = -EPROTO; /* global mode must decide */
	}
	if (!rc)
		tl_copy(out, &L);
	unlock(d);
	return rc;
}

static int sd_commit(struct side *d, uint64_t id, uint32_t n, struct errbuf *e)
{
	int rc = engine_commit(lock_lease(d, id), id, n, e);

	unlock(d);
	return rc;
}

static int sd_release(struct side *d, uint64_t id, struct errbuf *e)
{
	int rc = engine_release(lock_lease(d, id), id, e);

	unlock(d);
	return rc;
}

static int sd_slots(struct side *d, uint64_t id, uint32_t first, uint32_t n,
		    struct kvp_slot *out, struct errbuf *e)
{
	int rc = engine_lease_slots(lock_lease(d, id), id, first, n, out, e);

	unlock(d);
	return rc;
}

static void sd_info(struct side *d, uint64_t user, struct engine_user_info *out)
{
	engine_info(lock_user(d, user), user, out);
	unlock(d);
}

static int sd_read(struct side *d, uint64_t user, uint64_t pos, uint32_t n,
		   void *out, struct errbuf *e)
{
	int rc = engine_read_tokens(lock_user(d, user), user, pos, n, out, e);

	unlock(d);
	return rc;
}

/* op_offload: -ENOSPC from the user's shard, then again with every lock
 * (free host frames may sit in other shards' caches). */
static int sd_offload(struct side *d, uint64_t user, struct errbuf *e)
{
	int rc = engine_offload(lock_user(d, user), user, e);

	if (rc == -ENOSPC && d->set && d->set->n > 1) {
		e->msg[0] = '\0';
		rc = engine_offload(lock_escalate(d), user, e);
	}
	unlock(d);
	return rc;
}

static int sd_evict(struct side *d, uint64_t user, uint32_t sel, struct errbuf *e)
{
	int rc = engine_evict(lock_user(d, user), user, sel, e);

	unlock(d);
	return rc;
}

/* ops.c offload_pool: every shard locked (free host frames may sit in any
 * shard's cache), shard by shard, stopping at the first error. */
static int sd_offload_all(struct side *d, struct errbuf *e)
{
	int64_t pages = 0;
	int rc = 0;

	if (!d->set)
		return engine_offload_all(d->eng, e);
	lock_all(d);
	for (uint32_t i = 0; i < d->set->n && rc >= 0; i++) {
		rc = engine_offload_all(d->set->v[i].eng, e);
		if (rc > 0)
			pages += rc;
	}
	unlock(d);
	return rc < 0 ? rc : (int)pages;
}

/* ops.c evict_pool: every shard, users and skipped summed. */
static int sd_evict_all(struct side *d, uint32_t sel, uint32_t *skipped)
{
	int users = 0;

	if (!d->set)
		return engine_evict_all(d->eng, sel, skipped);
	*skipped = 0;
	for (uint32_t i = 0; i < d->set->n; i++) {
		uint32_t sk = 0;
		int rc = engine_evict_all(shard_lock(d->set, i), sel, &sk);

		shard_unlock(d->set, i);
		if (rc < 0)
			return rc;
		users += rc;
		*skipped += sk;
	}
	return users;
}

static uint32_t sd_release_owner(struct side *d, uint32_t owner)
{
	return d->set ? shard_set_release_owner(d->set, owner)
		      : engine_release_owner(d->eng, owner);
}

static void sd_stats(struct side *d, struct kvp_stats *out)
{
	if (d->set)
		shard_set_stats(d->set, out);
	else
		engine_stats(d->eng, out);
}

/* engine_check on the engine or on every shard under its lock, then
 * shard_set_check (which checks every shard again and the frames across). */
static int sd_check(struct side *d, struct errbuf *e)
{
	int rc = 0;

	if (!d->set)
		return engine_check(d->eng, e);
	for (uint32_t i = 0; i < d->set->n && !rc; i++) {
		rc = engine_check(shard_lock(d->set, i), e);
		shard_unlock(d->set, i);
	}
	return rc ? rc : shard_set_check(d->set, e);
}

static int cmp_row(const void *a, const void *b)
{
	const struct kvp_user_info *x = a, *y = b;

	return x->user < y->user ? -1 : x->user > y->user;
}

/* Every user's row, ascending (ops_list.c merges the shards' pages). */
static int sd_list(struct side *d, struct kvp_user_info *rows, uint32_t max)
{
	uint64_t next;
	int n = 0;

	if (!d->set)
		return engine_list_users(d->eng, 0, rows, max, &next);
	for (uint32_t i = 0; i < d->set->n; i++) {
		int k = engine_list_users(shard_lock(d->set, i), 0, rows + n,
					  max - (uint32_t)n, &next);

		shard_unlock(d->set, i);
		if (k < 0)
			return k;
		n += k;
	}
	qsort(rows, (size_t)n, sizeof(*rows), cmp_row);
	return n;
}

/* ------------------------------------------------------------ the model */

struct muser {
	uint64_t key;
	uint32_t gen;             /* bumped when the history is dropped */
	uint64_t start, len;
	uint32_t leases;          /* history leases */
	uint64_t writer;          /* tag of the uncommitted write lease, 0 none */
};

struct mhl {                  /* a history lease, held on both sides */
	uint64_t tag;
	uint64_t id[NSIDES];
	int u;
	uint32_t owner, n_new, written;
	uint64_t len0, pos;
	bool committed;
	uint32_t frames[NSIDES][MAXFR];
};

struct mseq {
	bool live;
	uint64_t id;
	uint32_t owner;
	bool hashable;
	uint32_t len;             /* committed; both sides (but see from_alloc) */
	uint32_t toks[MAXTOK];
	uint64_t keys[MAXTOK];
	uint16_t upin[NUSERS];    /* histories pinned (USER sources) */
	uint16_t chold[NCREC];    /* chunks held (CHUNK sources) */
	bool wl;                  /* a write lease is open (never committed) */
	bool from_alloc;          /* it is seq_alloc's: base differs by side */
	bool wtoks;               /* its new tokens have ids: rolling keys */
	uint64_t wkey;
	uint64_t wid[NSIDES];
	uint32_t base[NSIDES];    /* committed when the lease was made */
	uint32_t end;             /* tokens once all of the lease's are in */
	/* each side's page table, and which pages are borrowed */
	uint32_t npg[NSIDES];
	uint32_t fr[NSIDES][MAXPG];
	bool bor[NSIDES][MAXPG];
};

struct mchunk {
	bool live, registered, ready;
	int content;
	uint32_t gen;
	struct kvp_chunk_id id;
	uint32_t ntok, npages;
	uint32_t frames[NSIDES][MAXPG];
	uint32_t filler;
	uint64_t fill[NSIDES];
};

struct mread {
	uint64_t id[NSIDES];
	int rec;
	uint32_t owner;
};

/* The tokens a frame was last published under (prefix cache page idx):
 * whether it still is, a lookup of them says. */
struct mpub {
	bool valid;
	uint32_t idx;
	uint32_t toks[MAXTOK];
};

struct outcomes {
	uint64_t prepares, nomem, div_nomem, gap_overlap, busy, big, commits,
		 rollbacks, misuse, offloads, nospc, evicts, evict_alls,
		 owner_deaths, drops[NSIDES], reconciled_users, reconciled_chunks,
		 seq_allocs, seq_hits, seq_creates, cross_creates, seq_extends,
		 seq_frees, diverged_seqs, registers, acquires, eagain, deletes,
		 lookups, lookup_hits, composes, sweeps, infos, lists;
	uint32_t create_shards;   /* bit i: a create borrowed a shard i user */
};

struct sim {
	const struct model_cfg *cfg;
	struct side d[NSIDES];
	const struct kvp_layout *l;
	uint32_t words;
	uint64_t rng, step, now, keyseq, tags;
	char op[320];
	struct muser u[NUSERS];
	uint32_t shard_of[NUSERS];
	struct mhl hl[MAXHL];
	uint32_t nhl;
	struct mseq q[NSEQS];
	struct mchunk c[NCREC];
	int reg[NCONTENT];        /* content -> registered record, -1 */
	uint32_t cgen[NCONTENT];
	struct mread rd[MAXRD];
	uint32_t nrd;
	uint64_t stale[NSTALE][NSIDES];
	uint32_t nstale;
	uint64_t *pubset;         /* prefix keys some commit published */
	struct mpub pub[NSIDES][MAXFR];
	/* each side as the previous step left it */
	struct kvp_stats st[NSIDES];
	struct engine_user_info info[NSIDES][NUSERS];
	/* this step */
	bool may_evict, touch_all;
	bool nochange[NSIDES];
	bool must_vanish[NSIDES][NUSERS];
	uint64_t unused_evicted;  /* chunks evict_unused took (both sides) */
	struct outcomes o;
	uint32_t *buf, *want;
	struct kvp_slot *slots;
};

/* ------------------------------------------------------------ failing */

#define sim_fail(s, line, ...)                                            \
	model_mismatch((s)->cfg->name, (s)->cfg->seed, (s)->step, (s)->op, \
		       (line), __VA_ARGS__)

#define EXPECT(s, cond, ...)                                      \
	do {                                                      \
		if (!(cond))                                      \
			sim_fail((s), __LINE__, __VA_ARGS__);     \
	} while (0)

/* Both sides returned what the model says (want[x]); either[x]: 0 or
 * -ENOMEM both allowed there (a bracket the model cannot narrow). */
#define EXPECT_RC(s, rc, want, either, e)                                    \
	do {                                                                 \
		for (int x_ = 0; x_ < NSIDES; x_++)                          \
			EXPECT(s, (rc)[x_] == (want)[x_] || ((either)[x_] && \
			       ((rc)[x_] == 0 || (rc)[x_] == -ENOMEM)),      \
			       "%s: %d (%s), model %d%s; the other side: %d", \
			       side_name[x_], (rc)[x_], (e)[x_].msg,          \
			       (want)[x_], (either)[x_] ? " or -ENOMEM" : "", \
			       (rc)[1 - x_]);                                 \
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

static int pick_user(struct sim *s)
{
	return (int)(chance(s, 50) ? rnd(s, 6) : rnd(s, NUSERS));
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

/* The rolling key of a token-list prefix: the bytes of its last token in
 * every publishing sequence with these ids. */
static uint64_t roll(uint64_t prev, uint32_t tok)
{
	return mix64(prev ^ (tok + 0x1234567ull)) | 1;
}

static void key_words(const struct sim *s, uint64_t key, uint32_t *out)
{
	for (uint32_t w = 0; w < s->words; w++)
		out[w] = (uint32_t)mix64(key + w) & 0x3fffffffu;
}

static void expect_keys(struct sim *s, int x, const uint32_t *got,
			const uint64_t *keys, uint32_t n, const char *what)
{
	for (uint32_t t = 0; t < n; t++) {
		key_words(s, keys[t], s->want);
		EXPECT(s, !memcmp(got + (size_t)t * s->words, s->want, s->words * 4),
		       "%s: %s token %u holds other bytes", side_name[x], what, t);
	}
}

/* Tokens [0, n) through a page table, straight from x's device tier. */
static void read_frames(struct sim *s, int x, const uint32_t *frames, uint32_t n)
{
	for (uint32_t t = 0; t < n; t++)
		s->slots[t] = (struct kvp_slot){ frames[t / P], t % P };
	kvp_read_cpu(s->l, s->d[x].base, s->slots, n, s->buf);
}

/* Write keys[0, n) into x's lease slots [first, first+n); the slots must be
 * where the page table (frames, lease token `at` first) says. */
static void write_lease(struct sim *s, int x, uint64_t lease, uint32_t first,
			uint32_t n, const uint64_t *keys, const uint32_t *frames,
			uint32_t at)
{
	struct errbuf e = { .msg = "" };
	int rc;

	if (!n)
		return;
	rc = sd_slots(&s->d[x], lease, first, n, s->slots, &e);
	EXPECT(s, rc == 0, "%s: slots(%#" PRIx64 ", %u, %u) = %d: %s", side_name[x],
	       lease, first, n, rc, e.msg);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t q = at + first + i;

		EXPECT(s, !frames || (s->slots[i].frame == frames[q / P] &&
		       s->slots[i].slot == q % P), "%s: slot of token %u is frame %u "
		       "slot %u, the page table says frame %u", side_name[x], q,
		       s->slots[i].frame, s->slots[i].slot, frames[q / P]);
		key_words(s, keys[i], s->buf + (size_t)i * s->words);
	}
	kvp_append_cpu(s->l, s->d[x].base, s->slots, n, s->buf);
}

/* ------------------------------------------------------------ model helpers */

static bool user_pinned(const struct sim *s, int u)
{
	if (s->u[u].leases)
		return true;
	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live && s->q[i].upin[u])
			return true;
	return false;
}

static uint32_t user_pins(const struct sim *s, int u)
{
	uint32_t n = s->u[u].leases;

	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live)
			n += s->q[i].upin[u];
	return n;
}

static struct mhl *hl_of(struct sim *s, uint64_t tag)
{
	for (uint32_t i = 0; i < s->nhl; i++)
		if (s->hl[i].tag == tag)
			return &s->hl[i];
	return NULL;
}

/* Device pages reserved by u's write lease beyond its committed ones. */
static uint32_t reserved(struct sim *s, int u)
{
	struct mhl *w = s->u[u].writer ? hl_of(s, s->u[u].writer) : NULL;

	return w ? pages_for(s->u[u].len + w->n_new) - pages_for(s->u[u].len) : 0;
}

static uint32_t chunk_holders(const struct sim *s, int r)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nrd; i++)
		n += s->rd[i].rec == r;
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

static bool chunk_on_lru(const struct sim *s, int r)
{
	return s->c[r].live && s->c[r].registered && s->c[r].ready &&
	       !chunk_holders(s, r);
}

/*
 * Frames side x could have for an op now: free, plus what eviction can
 * take (unpinned histories' device pages, idle prefix pages, ready chunks
 * nobody holds), all read from x's stats and infos (the step's start).
 */
static uint64_t avail_of(struct sim *s, int x)
{
	uint64_t n = s->st[x].tier[KVP_TIER_DEVICE].frames_free +
		     s->st[x].prefix_idle_pages;

	for (int u = 0; u < NUSERS; u++)
		if (s->info[x][u].exists && !user_pinned(s, u))
			n += s->info[x][u].pages_device;
	for (int r = 0; r < NCREC; r++)
		if (chunk_on_lru(s, r))
			n += s->c[r].npages;
	return n;
}

static void stale_push(struct sim *s, const uint64_t id[NSIDES])
{
	uint32_t i = s->nstale < NSTALE ? s->nstale++ : rnd(s, NSTALE);

	memcpy(s->stale[i], id, sizeof(s->stale[i]));
}

/* Pins dropped: an unpinned history over max_tokens loses head pages. */
static void user_unpinned(struct sim *s, int u)
{
	struct muser *m = &s->u[u];
	uint64_t max = s->cfg->max_tokens;

	if (user_pinned(s, u) || !max || m->len <= max)
		return;
	uint32_t k = pages_for(m->len - max);
	m->start += (uint64_t)k * P;
	m->len -= (uint64_t)k * P;
}

static void hl_release(struct sim *s, uint32_t i)
{
	struct mhl *h = &s->hl[i];
	struct muser *m = &s->u[h->u];
	int u = h->u;

	if (m->writer == h->tag)
		m->writer = 0;
	m->leases--;
	stale_push(s, h->id);
	s->hl[i] = s->hl[--s->nhl];
	user_unpinned(s, u);
}

static void seq_destroy(struct sim *s, struct mseq *q)
{
	q->live = false;
	for (int r = 0; r < NCREC; r++)
		if (q->chold[r]) {
			q->chold[r] = 0;
			chunk_maybe_free(s, r);
		}
	for (int u = 0; u < NUSERS; u++)
		if (q->upin[u]) {
			q->upin[u] = 0;
			user_unpinned(s, u);
		}
}

static struct mseq *seq_pick_live(struct sim *s)
{
	int i = (int)rnd(s, NSEQS);

	for (int k = 0; k < NSEQS; k++, i = (i + 1) % NSEQS)
		if (s->q[i].live)
			return &s->q[i];
	return NULL;
}

/* Frame f is a page of a live sequence on side x other than q (whose
 * pages are shared by refcount, not borrowed). */
static bool seq_frame_listed(const struct sim *s, int x, uint32_t f,
			     const struct mseq *q)
{
	for (int i = 0; i < NSEQS; i++) {
		const struct mseq *o = &s->q[i];

		if (!o->live || o == q)
			continue;
		for (uint32_t p = 0; p < o->npg[x]; p++)
			if (o->fr[x][p] == f && !o->bor[x][p])
				return true;
	}
	return false;
}

static void seq_truncate(struct mseq *q, uint32_t npg)
{
	for (int x = 0; x < NSIDES; x++)
		if (q->npg[x] > npg)
			q->npg[x] = npg;
}

/* ------------------------------------------------------------ published keys */

static uint64_t pub_key(uint64_t key, uint32_t idx)
{
	return mix64(key + idx) | 1;
}

static void pub_add(struct sim *s, uint64_t key, uint32_t idx)
{
	uint64_t k = pub_key(key, idx);

	for (uint32_t i = (uint32_t)k % PUBSET, n = 0; n < PUBSET; n++, i = (i + 1) % PUBSET) {
		if (s->pubset[i] == k)
			return;
		if (!s->pubset[i]) {
			s->pubset[i] = k;
			return;
		}
	}
	sim_fail(s, __LINE__, "model: the published-key set is full");
}

static bool pub_has(const struct sim *s, uint64_t key, uint32_t idx)
{
	uint64_t k = pub_key(key, idx);

	for (uint32_t i = (uint32_t)k % PUBSET, n = 0; n < PUBSET && s->pubset[i];
	     n++, i = (i + 1) % PUBSET)
		if (s->pubset[i] == k)
			return true;
	return false;
}

/* The full pages of q's committed tokens, published by its commit. */
static void seq_published(struct sim *s, const struct mseq *q)
{
	if (!q->hashable)
		return;
	for (uint32_t i = 0; i < q->len / P; i++)
		pub_add(s, q->keys[(i + 1) * P - 1], i);
}

/* Side x's prefix cache maps tokens [0, (idx+1)P) to frame f now. */
static bool frame_published(struct sim *s, int x, uint32_t f)
{
	const struct mpub *m = &s->pub[x][f];
	struct share_prefix_hit h;
	bool yes;

	if (!m->valid)
		return false;
	share_prefix_lookup(lock_all(&s->d[x]), m->toks, (m->idx + 1) * P, &h);
	yes = h.npages > m->idx && h.frames[m->idx] == f;
	unlock(&s->d[x]);
	return yes;
}

/* After q's commit: which of its full pages the cache now has in q's own
 * frames (the others were published first by another sequence). */
static void note_published(struct sim *s, const struct mseq *q)
{
	for (int x = 0; x < NSIDES && q->hashable; x++)
		for (uint32_t i = 0; i < q->len / P; i++) {
			struct share_prefix_hit h;
			uint32_t f = q->fr[x][i];

			share_prefix_lookup(lock_all(&s->d[x]), q->toks, (i + 1) * P, &h);
			if (h.npages > i && h.frames[i] == f) {
				s->pub[x][f].valid = true;
				s->pub[x][f].idx = i;
				memcpy(s->pub[x][f].toks, q->toks, (i + 1) * P * sizeof(uint32_t));
			}
			unlock(&s->d[x]);
		}
}

/* The vocabulary: four token streams; a list follows stream a up to div,
 * then stream b, so prefixes repeat across sequences. */
static uint32_t vocab(uint32_t stream, uint32_t i)
{
	return 10 + (uint32_t)(mix64(stream * 1000ull + i) % 40);
}

static uint32_t token_list(struct sim *s, uint32_t *toks, uint64_t *keys)
{
	uint32_t a = rnd(s, 4), b = rnd(s, 4), div = rnd(s, 5) * P + rnd(s, 2);
	uint32_t n = 1 + rnd(s, 24);
	uint64_t r = 0xfeed;

	for (uint32_t i = 0; i < n; i++) {
		toks[i] = vocab(i < div ? a : b, i);
		keys[i] = r = roll(r, toks[i]);
	}
	return n;
}

/* ------------------------------------------------------------ histories */

/* Explicit drop of a user that grew past hmax (both sides). */
static void evict_long(struct sim *s, int u)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	bool pinned = user_pinned(s, u);

	snprintf(s->op, sizeof(s->op), "evict(user %d, all): len %" PRIu64
		 ", pinned %d", u, s->u[u].len, pinned);
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = sd_evict(&s->d[x], s->u[u].key, KVP_SEL_ALL, &e[x]);
		want[x] = pinned ? -EBUSY : (int)s->info[x][u].pages;
		s->must_vanish[x][u] = !pinned;
		s->nochange[x] = pinned;
	}
	EXPECT_RC(s, rc, want, either, e);
}

/* The committed tokens through a fresh lease's page table, on side x. */
static void check_lease_bytes(struct sim *s, int x, int u, const uint32_t *frames,
			      uint64_t len)
{
	uint64_t keys[MAXFR * P];

	for (uint64_t t = 0; t < len; t++)
		keys[t] = hist_key(s, u, s->u[u].start + t);
	read_frames(s, x, frames, (uint32_t)len);
	expect_keys(s, x, s->buf, keys, (uint32_t)len, "history through a lease");
}

/* Mostly where the history ends; now and then a gap, an overlap or a
 * start before a trimmed head; anywhere when nothing is cached. */
static uint64_t prepare_pos(struct sim *s, const struct muser *m)
{
	uint64_t end = m->start + m->len;

	if (!m->len)
		return chance(s, 70) ? 0 : rnd(s, 1000);
	if (!chance(s, 10))
		return end;
	if (chance(s, 50))
		return end + 1 + rnd(s, 20);
	if (m->start && chance(s, 30))
		return m->start - 1 - rnd(s, (uint32_t)(m->start < 8 ? m->start : 8));
	return end - 1 - rnd(s, (uint32_t)(m->len < 16 ? m->len : 16));
}

/* engine_prepare's checks in its order: busy, continuity, too big, then
 * memory: side x's free + evictable frames (its own pages not its
 * victims) against its host-only pages and the new ones. */
static int prepare_want(struct sim *s, int x, int u, uint64_t pos, uint32_t n_new)
{
	const struct muser *m = &s->u[u];
	const struct engine_user_info *pi = &s->info[x][u];
	uint64_t av = avail_of(s, x), need;

	if (n_new && m->writer)
		return -EBUSY;
	if (m->len && pos != m->start + m->len)
		return -EINVAL;
	if (pages_for(m->len + n_new) > s->cfg->device_frames)
		return -E2BIG;
	if (pi->exists && !user_pinned(s, u))
		av -= pi->pages_device;
	need = (pi->exists ? pi->pages - pi->pages_device : 0) +
	       (n_new ? pages_for(m->len + n_new) - pages_for(m->len) : 0);
	return need > av ? -ENOMEM : 0;
}

/* Both sides leased: the same lease but for where its pages are; pages
 * on the device, distinct, holding the committed tokens; the sharded
 * lease naming its user's shard. Then the model holds it. */
static void prepare_record(struct sim *s, int u, uint32_t owner, uint64_t pos,
			   uint32_t n_new, const struct tlease t[NSIDES])
{
	struct muser *m = &s->u[u];
	uint32_t np = pages_for(m->len + n_new);

	for (int x = 0; x < NSIDES; x++) {
		const struct engine_lease *L = &t[x].L;
		const struct engine_user_info *pi = &s->info[x][u];
		uint64_t seen = 0;

		EXPECT(s, L->len == m->len && L->hit_tokens == m->len &&
		       L->n_new == n_new && L->npages == np &&
		       (!np || L->last_page_len == (m->len + n_new - 1) % P + 1),
		       "%s: lease len %" PRIu64 " hit %" PRIu64 " n_new %u npages %u "
		       "last %u; model len %" PRIu64, side_name[x], L->len,
		       L->hit_tokens, L->n_new, L->npages, L->last_page_len, m->len);
		EXPECT(s, m->len ? L->start == m->start : !n_new || L->start == pos,
		       "%s: lease start %" PRIu64 ", model %" PRIu64 " (len %" PRIu64
		       ", from %" PRIu64 ")", side_name[x], L->start, m->start, m->len, pos);
		EXPECT(s, L->onloaded_pages == (pi->exists ? pi->pages - pi->pages_device : 0),
		       "%s: onloaded %u pages, %u were host-only", side_name[x],
		       L->onloaded_pages, pi->pages - pi->pages_device);
		for (uint32_t i = 0; i < np; i++) {
			uint32_t f = L->frames[i];

			EXPECT(s, f < s->cfg->device_frames && !(seen >> f & 1), "%s: page "
			       "%u is frame %u (out of range or twice)", side_name[x], i, f);
			seen |= 1ull << f;
		}
		check_lease_bytes(s, x, u, L->frames, m->len);
	}
	EXPECT(s, !(t[SB].L.id & (1ull << 31)) &&
	       shard_of_lease(s->d[SB].set, t[SB].L.id) == s->shard_of[u],
	       "lease %#" PRIx64 " routes to shard %u, user %d is shard %u's",
	       t[SB].L.id, shard_of_lease(s->d[SB].set, t[SB].L.id), u, s->shard_of[u]);

	struct mhl *h = &s->hl[s->nhl++];
	*h = (struct mhl){ .tag = ++s->tags, .u = u, .owner = owner, .n_new = n_new,
			   .len0 = m->len, .pos = m->len ? m->start + m->len : pos };
	for (int x = 0; x < NSIDES; x++) {
		h->id[x] = t[x].L.id;
		memcpy(h->frames[x], t[x].frames, sizeof(h->frames[x]));
	}
	m->leases++;
	if (n_new)
		m->writer = h->tag;
	s->o.prepares++;
}

static void op_prepare(struct sim *s)
{
	int u = pick_user(s);
	struct muser *m = &s->u[u];
	uint32_t n_new = rnd(s, MAX_NEW + 1), owner = 1 + rnd(s, NOWNERS);
	struct tlease t[NSIDES];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	uint64_t pos;

	if (s->nhl == MAXHL)
		return;
	if (m->len + n_new > s->cfg->hmax && chance(s, 70)) {
		evict_long(s, u);
		return;
	}
	pos = prepare_pos(s, m);
	snprintf(s->op, sizeof(s->op), "prepare(user %d (shard %u), pos %" PRIu64
		 ", n_new %u, owner %u): model start %" PRIu64 " len %" PRIu64
		 " pins %u writer %d", u, s->shard_of[u], pos, n_new, owner, m->start,
		 m->len, user_pins(s, u), m->writer != 0);
	for (int x = 0; x < NSIDES; x++) {
		want[x] = prepare_want(s, x, u, pos, n_new);
		rc[x] = sd_prepare(&s->d[x], m->key, pos, n_new, owner, &t[x], &e[x]);
	}
	EXPECT_RC(s, rc, want, either, e);
	if (rc[SA] && rc[SB]) {
		s->nochange[SA] = s->nochange[SB] = true;
		s->o.nomem += rc[SA] == -ENOMEM;
		s->o.gap_overlap += rc[SA] == -EINVAL;
		s->o.busy += rc[SA] == -EBUSY;
		s->o.big += rc[SA] == -E2BIG;
		EXPECT(s, !strcmp(e[SA].msg, e[SB].msg) || rc[SA] == -ENOMEM,
		       "messages differ:\n    \"%s\"\n    \"%s\"", e[SA].msg, e[SB].msg);
		return;
	}
	s->may_evict = true;
	if (rc[SA] || rc[SB]) {
		/* One side short of frames the other had: undo where it worked. */
		int x = rc[SA] ? SB : SA;

		EXPECT(s, sd_release(&s->d[x], t[x].L.id, &e[x]) == 0, "undo: %s",
		       e[x].msg);
		s->nochange[1 - x] = true;
		s->o.div_nomem++;
		return;
	}
	prepare_record(s, u, owner, pos, n_new, t);
}

/* Write, commit, release, or get it wrong; one history lease. */
static void op_hist_lease(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	uint64_t keys[MAX_NEW];

	if (!s->nhl)
		return;
	uint32_t i = rnd(s, s->nhl), r = rnd(s, 100);
	struct mhl *h = &s->hl[i];
	struct muser *m = &s->u[h->u];

	if (!h->committed && h->n_new && r < 60) {
		uint32_t k = chance(s, 70) ? h->n_new : rnd(s, h->n_new + 1);

		snprintf(s->op, sizeof(s->op), "lease %#" PRIx64 "/%#" PRIx64 " (user %d): "
			 "write %u, commit %u", h->id[SA], h->id[SB], h->u, h->n_new, k);
		for (uint32_t t = 0; t < h->n_new; t++)
			keys[t] = hist_key(s, h->u, h->pos + t);
		for (int x = 0; x < NSIDES; x++) {
			write_lease(s, x, h->id[x], 0, h->n_new, keys, h->frames[x],
				    (uint32_t)h->len0);
			rc[x] = sd_commit(&s->d[x], h->id[x], k, &e[x]);
			want[x] = 0;
		}
		EXPECT_RC(s, rc, want, either, e);
		if (k && !m->len)
			m->start = h->pos;
		m->len += k;
		m->writer = 0;
		h->committed = true;
		s->o.commits++;
		if (chance(s, 50))
			return;
	} else if (r >= 85) {
		s->o.misuse++;
		if (!h->committed && !h->n_new) {
			snprintf(s->op, sizeof(s->op), "commit(read-only lease of user %d, 0)",
				 h->u);
			for (int x = 0; x < NSIDES; x++) {
				rc[x] = sd_commit(&s->d[x], h->id[x], 0, &e[x]);
				want[x] = 0;
			}
			h->committed = true;
		} else if (h->committed) {
			snprintf(s->op, sizeof(s->op), "commit again (lease of user %d)", h->u);
			for (int x = 0; x < NSIDES; x++) {
				rc[x] = sd_commit(&s->d[x], h->id[x], 0, &e[x]);
				want[x] = -EALREADY;
				s->nochange[x] = true;
			}
		} else {
			uint32_t n = h->n_new + 1 + rnd(s, 3);
			bool slots = chance(s, 50);

			snprintf(s->op, sizeof(s->op), "%s %u past n_new %u (user %d)",
				 slots ? "slots" : "commit", n, h->n_new, h->u);
			for (int x = 0; x < NSIDES; x++) {
				rc[x] = slots ? sd_slots(&s->d[x], h->id[x], 0, n, s->slots, &e[x])
					      : sd_commit(&s->d[x], h->id[x], n, &e[x]);
				want[x] = -EINVAL;
				s->nochange[x] = true;
			}
		}
		EXPECT_RC(s, rc, want, either, e);
		return;
	}
	snprintf(s->op, sizeof(s->op), "release(lease %#" PRIx64 "/%#" PRIx64 " of "
		 "user %d, %s)", h->id[SA], h->id[SB], h->u,
		 h->committed ? "committed" : "not committed");
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = sd_release(&s->d[x], h->id[x], &e[x]);
		want[x] = 0;
	}
	EXPECT_RC(s, rc, want, either, e);
	s->o.rollbacks += !h->committed && h->n_new;
	hl_release(s, i);
}

/* A released lease id must miss on both sides. */
static void op_stale_lease(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES] = { -ENOENT, -ENOENT };
	bool either[NSIDES] = { false, false };
	uint32_t i, how;

	if (!s->nstale)
		return;
	i = rnd(s, s->nstale);
	how = rnd(s, 3);
	snprintf(s->op, sizeof(s->op), "%s of released lease %#" PRIx64 "/%#" PRIx64,
		 how == 0 ? "release" : how == 1 ? "commit" : "slots",
		 s->stale[i][SA], s->stale[i][SB]);
	for (int x = 0; x < NSIDES; x++) {
		uint64_t id = s->stale[i][x];

		rc[x] = how == 0 ? sd_release(&s->d[x], id, &e[x]) :
			how == 1 ? sd_commit(&s->d[x], id, 0, &e[x]) :
			sd_slots(&s->d[x], id, 0, 1, s->slots, &e[x]);
		s->nochange[x] = true;
	}
	EXPECT_RC(s, rc, want, either, e);
	s->o.misuse++;
}

/* ------------------------------------------------------------ tiers */

/* Pages an offload of u copies on side x: lo..hi (a pending write may keep
 * its partly filled last page back). */
static void offload_need(struct sim *s, int x, int u, uint32_t *lo, uint32_t *hi)
{
	const struct engine_user_info *pi = &s->info[x][u];

	*lo = *hi = 0;
	if (!pi->exists || !pi->pages_device)
		return;
	*lo = *hi = pi->pages - pi->pages_host;
	if (s->u[u].writer && s->u[u].len % P && *hi)
		*lo = *hi - 1;
}

static void op_offload(struct sim *s)
{
	int u = pick_user(s);
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	uint32_t lo[NSIDES], hi[NSIDES];
	int rc[NSIDES];

	for (int x = 0; x < NSIDES; x++)
		offload_need(s, x, u, &lo[x], &hi[x]);
	snprintf(s->op, sizeof(s->op), "offload(user %d (shard %u)): %u..%u / %u..%u "
		 "pages to copy, %" PRIu64 " / %" PRIu64 " host frames free", u,
		 s->shard_of[u], lo[SA], hi[SA], lo[SB], hi[SB],
		 s->st[SA].tier[KVP_TIER_HOST].frames_free,
		 s->st[SB].tier[KVP_TIER_HOST].frames_free);
	for (int x = 0; x < NSIDES; x++) {
		const struct engine_user_info *pi = &s->info[x][u];
		uint64_t free_host = s->st[x].tier[KVP_TIER_HOST].frames_free;
		struct engine_user_info ni;

		rc[x] = sd_offload(&s->d[x], s->u[u].key, &e[x]);
		if (!pi->exists || !(pi->pages + reserved(s, u))) {
			EXPECT(s, rc[x] == -ENOENT, "%s: offload of a user with nothing "
			       "cached = %d (%s)", side_name[x], rc[x], e[x].msg);
			s->nochange[x] = true;
			continue;
		}
		/* -ENOSPC exactly when the pages to copy (lo..hi: a pending
		 * write may keep its partial page back) exceed the free ones. */
		if (rc[x] == -ENOSPC) {
			EXPECT(s, hi[x] > free_host, "%s: offload of %u..%u pages = "
			       "-ENOSPC (%s) with %" PRIu64 " host frames free",
			       side_name[x], lo[x], hi[x], e[x].msg, free_host);
			s->nochange[x] = true;
			s->o.nospc++;
			continue;
		}
		EXPECT(s, rc[x] >= (int)lo[x] && rc[x] <= (int)hi[x] &&
		       (uint64_t)rc[x] <= free_host, "%s: offload = %d (%s), model %u..%u "
		       "pages, %" PRIu64 " host frames free", side_name[x], rc[x],
		       e[x].msg, lo[x], hi[x], free_host);
		sd_info(&s->d[x], s->u[u].key, &ni);
		EXPECT(s, ni.pages_device == pi->pages_device &&
		       ni.pages_host == pi->pages_host + (uint32_t)rc[x],
		       "%s: after offloading %d pages: %u device / %u host, before %u / %u",
		       side_name[x], rc[x], ni.pages_device, ni.pages_host,
		       pi->pages_device, pi->pages_host);
	}
	s->o.offloads++;
}

static void op_offload_all(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES];

	snprintf(s->op, sizeof(s->op), "offload_all");
	for (int x = 0; x < NSIDES; x++) {
		uint64_t free_host = s->st[x].tier[KVP_TIER_HOST].frames_free, lo = 0, hi = 0;

		for (int u = 0; u < NUSERS; u++) {
			uint32_t a, b;

			offload_need(s, x, u, &a, &b);
			lo += a;
			hi += b;
		}
		rc[x] = sd_offload_all(&s->d[x], &e[x]);
		EXPECT(s, rc[x] == -ENOSPC ? hi > free_host :
		       rc[x] >= 0 && (uint64_t)rc[x] >= lo && (uint64_t)rc[x] <= hi &&
		       lo <= free_host, "%s: offload_all = %d (%s), model %" PRIu64 "..%"
		       PRIu64 " pages, %" PRIu64 " host frames free", side_name[x], rc[x],
		       e[x].msg, lo, hi, free_host);
	}
	s->touch_all = true;
	s->o.offloads++;
}

static bool host_only(const struct engine_user_info *pi)
{
	return pi->exists && pi->pages && !pi->pages_device;
}

static void op_evict(struct sim *s)
{
	static const uint32_t sels[] = { KVP_SEL_DEVICE, KVP_SEL_DEVICE, KVP_SEL_HOST,
					 KVP_SEL_ALL, 0, 1u << KVP_TIERS };
	int u = pick_user(s);
	uint32_t sel = sels[rnd(s, sizeof(sels) / sizeof(sels[0]))];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };

	snprintf(s->op, sizeof(s->op), "evict(user %d (shard %u), sel %#x): len %"
		 PRIu64 ", pins %u", u, s->shard_of[u], sel, s->u[u].len,
		 user_pins(s, u));
	for (int x = 0; x < NSIDES; x++) {
		const struct engine_user_info *pi = &s->info[x][u];

		rc[x] = sd_evict(&s->d[x], s->u[u].key, sel, &e[x]);
		if (!sel || sel & ~(uint32_t)KVP_SEL_ALL)
			want[x] = -EINVAL;
		else if (!pi->exists)
			want[x] = -ENOENT;
		else if (user_pinned(s, u))
			want[x] = -EBUSY;
		else if (sel == KVP_SEL_ALL || (sel == KVP_SEL_HOST && host_only(pi)))
			want[x] = (int)pi->pages;
		else if (sel == KVP_SEL_HOST)
			want[x] = (int)pi->pages_host;
		else
			want[x] = (int)pi->pages_device;
		s->nochange[x] = want[x] < 0;
		s->must_vanish[x][u] = want[x] >= 0 && (sel == KVP_SEL_ALL ||
				       (sel == KVP_SEL_HOST && host_only(pi)));
	}
	EXPECT_RC(s, rc, want, either, e);
	/* Demotion makes room on the host LRU, or drops u. */
	s->may_evict = sel == KVP_SEL_DEVICE;
	s->o.evicts++;
}

static void op_evict_all(struct sim *s)
{
	static const uint32_t sels[] = { KVP_SEL_DEVICE, KVP_SEL_HOST, KVP_SEL_ALL };
	uint32_t sel = sels[rnd(s, 3)], skipped[NSIDES], pinned = 0;
	int rc[NSIDES], want[NSIDES] = { 0, 0 };

	for (int u = 0; u < NUSERS; u++)
		pinned += s->info[SA][u].exists && user_pinned(s, u);
	snprintf(s->op, sizeof(s->op), "evict_all(sel %#x), %u users pinned", sel, pinned);
	for (int x = 0; x < NSIDES; x++) {
		for (int u = 0; u < NUSERS; u++) {
			const struct engine_user_info *pi = &s->info[x][u];

			if (!pi->exists || user_pinned(s, u))
				continue;
			if (sel == KVP_SEL_ALL) {
				want[x]++;
				s->must_vanish[x][u] = true;
			} else if (sel == KVP_SEL_HOST) {
				want[x] += host_only(pi) || pi->pages_host;
				s->must_vanish[x][u] = host_only(pi);
			} else {
				want[x] += pi->pages_device > 0;
			}
		}
		rc[x] = sd_evict_all(&s->d[x], sel, &skipped[x]);
		EXPECT(s, rc[x] == want[x] && skipped[x] == pinned, "%s: evict_all = %d, "
		       "skipped %u; model %d affected, %u pinned", side_name[x], rc[x],
		       skipped[x], want[x], pinned);
		for (int u = 0; u < NUSERS; u++) {
			struct engine_user_info ni;

			sd_info(&s->d[x], s->u[u].key, &ni);
			if (!ni.exists || user_pinned(s, u))
				continue;
			EXPECT(s, sel == KVP_SEL_HOST ? !ni.pages_host : !ni.pages_device,
			       "%s: user %d kept %u device / %u host pages through "
			       "evict_all(%#x)", side_name[x], u, ni.pages_device,
			       ni.pages_host, sel);
		}
	}
	s->may_evict = sel == KVP_SEL_DEVICE;
	s->touch_all = true;
	s->o.evict_alls++;
}

/* ------------------------------------------------------------ info, listings, clients */

static void op_info(struct sim *s)
{
	int u = (int)rnd(s, NUSERS);
	struct engine_user_info in[NSIDES];

	snprintf(s->op, sizeof(s->op), "info(user %d)", u);
	for (int x = 0; x < NSIDES; x++) {
		sd_info(&s->d[x], s->u[u].key, &in[x]);
		s->nochange[x] = true;
	}
	EXPECT(s, in[SA].exists == in[SB].exists &&
	       (!in[SA].len || in[SA].start == in[SB].start) && in[SA].len == in[SB].len && in[SA].pages == in[SB].pages &&
	       in[SA].leases == in[SB].leases, "info differs: exists %d/%d start %"
	       PRIu64 "/%" PRIu64 " len %" PRIu64 "/%" PRIu64 " pages %u/%u leases "
	       "%u/%u", in[SA].exists, in[SB].exists, in[SA].start, in[SB].start,
	       in[SA].len, in[SB].len, in[SA].pages, in[SB].pages, in[SA].leases,
	       in[SB].leases);
	s->o.infos++;
}

static void op_list(struct sim *s)
{
	struct kvp_user_info rows[NSIDES][NUSERS + 1];
	int n[NSIDES];

	snprintf(s->op, sizeof(s->op), "list users");
	for (int x = 0; x < NSIDES; x++) {
		n[x] = sd_list(&s->d[x], rows[x], NUSERS + 1);
		s->nochange[x] = true;
	}
	EXPECT(s, n[SA] == n[SB] && n[SA] >= 0, "%d rows vs %d", n[SA], n[SB]);
	for (int i = 0; i < n[SA]; i++) {
		const struct kvp_user_info *a = &rows[SA][i], *b = &rows[SB][i];

		EXPECT(s, a->user == b->user && (!a->len || a->start == b->start) &&
		       a->len == b->len &&
		       a->leases == b->leases, "row %d: user %#" PRIx64 "/%#" PRIx64
		       " start %" PRIu64 "/%" PRIu64 " len %" PRIu64 "/%" PRIu64
		       " leases %u/%u", i, a->user, b->user, a->start, b->start,
		       a->len, b->len, a->leases, b->leases);
	}
	s->o.lists++;
}

/* A client dies: its leases, chunk fills and sequences go, in every shard. */
static void owner_dies(struct sim *s, uint32_t owner)
{
	uint32_t n[NSIDES], want = 0;

	for (uint32_t i = 0; i < s->nhl; i++)
		want += s->hl[i].owner == owner;
	for (uint32_t i = 0; i < s->nrd; i++)
		want += s->rd[i].owner == owner;
	for (int r = 0; r < NCREC; r++)
		want += s->c[r].live && s->c[r].registered && !s->c[r].ready &&
			s->c[r].filler == owner;
	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live && s->q[i].owner == owner)
			want += 1 + s->q[i].wl;
	snprintf(s->op, sizeof(s->op), "release_owner(%u): %u leases and sequences",
		 owner, want);
	for (int x = 0; x < NSIDES; x++)
		n[x] = sd_release_owner(&s->d[x], owner);
	EXPECT(s, n[SA] == want && n[SB] == want, "released %u / %u, model %u",
	       n[SA], n[SB], want);
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
	s->touch_all = true;
	s->o.owner_deaths++;
}

static void op_release_owner(struct sim *s)
{
	owner_dies(s, 1 + rnd(s, NOWNERS));
}

/* ------------------------------------------------------------ sequences */

/* Sharing calls run on shard 0 with every shard locked (ops_share.c). */
#define SHARE_CALL(s, x, call)                                         \
	({                                                             \
		struct engine *eng_ = lock_all(&(s)->d[x]);            \
		int r_ = (call);                                       \
		unlock(&(s)->d[x]);                                    \
		r_;                                                    \
	})

static void seq_discard(struct sim *s, int x, uint64_t id, uint32_t owner)
{
	share_seq_discard(lock_all(&s->d[x]), id, owner);
	unlock(&s->d[x]);
}

static void seq_lease_shape(struct sim *s, int x, const struct engine_lease *L,
			    uint32_t len, uint32_t n_new)
{
	EXPECT(s, L->len == len && L->n_new == n_new &&
	       L->npages == pages_for(len + n_new) &&
	       (!L->npages || L->last_page_len == (len + n_new - 1) % P + 1),
	       "%s: lease len %" PRIu64 " n_new %u npages %u last %u; model len %u "
	       "n_new %u", side_name[x], L->len, L->n_new, L->npages,
	       L->last_page_len, len, n_new);
	for (uint32_t i = 0; i < L->npages; i++)
		EXPECT(s, L->frames[i] < s->cfg->device_frames, "%s: page %u: frame %u",
		       side_name[x], i, L->frames[i]);
	EXPECT(s, !L->id || ((L->id & (1ull << 31)) &&
	       (!s->d[x].set || shard_of_lease(s->d[x].set, L->id) == 0)),
	       "%s: sequence lease %#" PRIx64 " is not a shard-0 share lease",
	       side_name[x], L->id);
}

/* Both sides allocated: each lease starts after that side's prefix hits
 * (a prompt cached whole: the last token left, its page copied), its hit
 * pages the cache's and holding those tokens' bytes. Then the model. */
static void alloc_record(struct sim *s, struct mseq *q, int slot, uint32_t owner,
			 const uint32_t *toks, const uint64_t *keys, uint32_t n,
			 const uint32_t hits[NSIDES], uint32_t hf[NSIDES][MAXPG],
			 const struct tlease t[NSIDES])
{
	memset(q, 0, sizeof(*q));
	for (int x = 0; x < NSIDES; x++) {
		const struct engine_lease *L = &t[x].L;
		uint32_t h = hits[x], cached = h && h * P >= n ? n - 1 : h * P;
		bool whole = h && h * P == n;

		seq_lease_shape(s, x, L, cached, n - cached);
		EXPECT(s, L->hit_tokens == cached, "%s: hit_tokens %" PRIu64 ", %u pages "
		       "hit", side_name[x], L->hit_tokens, h);
		for (uint32_t i = 0; i < h; i++)
			EXPECT(s, (L->frames[i] == hf[x][i]) == !(whole && i == h - 1),
			       "%s: page %u is frame %u, the prefix cache has %u (whole "
			       "prompt %d)", side_name[x], i, L->frames[i], hf[x][i], whole);
		read_frames(s, x, L->frames, cached);
		expect_keys(s, x, s->buf, keys, cached, "prefix hit");
		q->wid[x] = L->id;
		q->base[x] = cached;
		q->npg[x] = L->npages;
		memcpy(q->fr[x], L->frames, L->npages * sizeof(uint32_t));
	}
	q->live = true;
	q->id = (uint64_t)slot + 1;
	q->owner = owner;
	q->hashable = q->wl = q->from_alloc = q->wtoks = true;
	q->end = n;
	memcpy(q->toks, toks, n * sizeof(uint32_t));
	memcpy(q->keys, keys, n * sizeof(uint64_t));
	s->o.seq_allocs++;
	s->o.seq_hits += hits[SA] || hits[SB];
}

static void op_seq_alloc(struct sim *s)
{
	int slot = (int)rnd(s, NSEQS);
	struct mseq *q = &s->q[slot];
	uint32_t toks[MAXTOK], owner = 1 + rnd(s, NOWNERS), hits[NSIDES];
	uint32_t hf[NSIDES][MAXPG];
	uint64_t keys[MAXTOK];
	uint32_t n = token_list(s, toks, keys), pages = pages_for(n);
	struct tlease t[NSIDES];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	uint64_t av[NSIDES];

	for (int x = 0; x < NSIDES; x++) {
		struct share_prefix_hit h;
		uint32_t held = 0;
		bool whole;

		share_prefix_lookup(lock_all(&s->d[x]), toks, n, &h);
		hits[x] = h.npages;
		if (h.npages)
			memcpy(hf[x], h.frames, h.npages * sizeof(uint32_t));
		unlock(&s->d[x]);
		sd_stats(&s->d[x], &s->st[x]); /* the lookup counted itself */
		/* Hits listed by a live sequence are held; the others idle
		 * (or held by an anchor: the bracket). */
		for (uint32_t i = 0; i < hits[x]; i++)
			held += seq_frame_listed(s, x, hf[x][i], NULL);
		whole = hits[x] && hits[x] * P == n;
		av[x] = avail_of(s, x);
		if (q->live) {
			want[x] = -EEXIST;
		} else if (pages - hits[x] + whole > av[x]) {
			want[x] = -ENOMEM;
		} else {
			want[x] = 0;
			either[x] = pages - held + whole > av[x];
		}
	}
	snprintf(s->op, sizeof(s->op), "seq_alloc(seq %d, %u tokens, owner %u): hits "
		 "%u / %u pages, %" PRIu64 " / %" PRIu64 " frames free or evictable",
		 slot + 1, n, owner, hits[SA], hits[SB], av[SA], av[SB]);
	for (int x = 0; x < NSIDES; x++) {
		struct engine *eng = lock_all(&s->d[x]);
		struct engine_lease L;

		rc[x] = share_seq_alloc(eng, (uint64_t)slot + 1, toks, n, owner, &L, &e[x]);
		if (!rc[x])
			tl_copy(&t[x], &L);
		unlock(&s->d[x]);
	}
	EXPECT_RC(s, rc, want, either, e);
	if (rc[SA] && rc[SB]) {
		s->nochange[SA] = s->nochange[SB] = true;
		s->o.nomem += rc[SA] == -ENOMEM;
		return;
	}
	s->may_evict = true;
	if (rc[SA] || rc[SB]) {
		int x = rc[SA] ? SB : SA;

		seq_discard(s, x, (uint64_t)slot + 1, owner);
		s->o.div_nomem++;
		return;
	}
	alloc_record(s, q, slot, owner, toks, keys, n, hits, hf, t);
}

/* The open write lease: write, commit (or roll back), release. */
static void op_seq_lease(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES] = { 0, 0 };
	bool either[NSIDES] = { false, false };
	struct mseq *q = NULL;
	int i0 = (int)rnd(s, NSEQS);

	for (int k = 0; k < NSEQS && !q; k++)
		if (s->q[(i0 + k) % NSEQS].live && s->q[(i0 + k) % NSEQS].wl)
			q = &s->q[(i0 + k) % NSEQS];
	if (!q)
		return;
	uint32_t mb = q->base[SA] > q->base[SB] ? q->base[SA] : q->base[SB];
	bool commit = chance(s, 85);
	uint32_t lf = chance(s, 75) ? q->end : mb + rnd(s, q->end - mb + 1);
	uint32_t w = chance(s, 50) ? q->end : lf;

	snprintf(s->op, sizeof(s->op), "seq %" PRIu64 ": lease from %u / %u to %u: write "
		 "to %u, %s %u, release", q->id, q->base[SA], q->base[SB], q->end, w,
		 commit ? "commit to" : "roll back", lf);
	for (int x = 0; x < NSIDES; x++) {
		write_lease(s, x, q->wid[x], 0, w - q->base[x], q->keys + q->base[x],
			    q->fr[x], q->base[x]);
		if (commit) {
			rc[x] = sd_commit(&s->d[x], q->wid[x], lf - q->base[x], &e[x]);
			EXPECT(s, rc[x] == 0, "%s: commit = %d (%s)", side_name[x], rc[x],
			       e[x].msg);
		}
		rc[x] = sd_release(&s->d[x], q->wid[x], &e[x]);
	}
	EXPECT_RC(s, rc, want, either, e);
	q->wl = false;
	if (commit) {
		q->len = lf;
		s->o.commits++;
	} else if (q->base[SA] != q->base[SB]) {
		/* Rolled back to different prefix hits: the sides' sequences
		 * differ now; the client frees it on both. */
		for (int x = 0; x < NSIDES; x++) {
			rc[x] = SHARE_CALL(s, x, share_seq_free(eng_, q->id, q->owner, &e[x]));
			want[x] = 0;
		}
		EXPECT_RC(s, rc, want, either, e);
		seq_destroy(s, q);
		s->o.diverged_seqs++;
		return;
	} else {
		q->len = q->base[SA];
		s->o.rollbacks++;
	}
	q->from_alloc = false;
	seq_truncate(q, pages_for(q->len));
	seq_published(s, q);
	note_published(s, q);
}

static void op_seq_extend(struct sim *s)
{
	struct mseq *q = seq_pick_live(s);
	uint32_t n_new, toks[MAXTOK], stream = rnd(s, 4);
	struct tlease t[NSIDES];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false }, cow[NSIDES], with_toks;

	if (!q)
		return;
	n_new = 1 + rnd(s, 8);
	if (q->len + n_new > MAXTOK)
		return;
	for (uint32_t i = 0; i < n_new; i++)
		toks[i] = vocab(stream, q->len + i);
	with_toks = q->hashable && chance(s, 80);
	for (int x = 0; x < NSIDES; x++) {
		uint32_t last = q->npg[x] - 1, need;

		/* A partial last page someone else sees is copied first: one
		 * borrowed, listed by another sequence, or published (its
		 * writer filled it, committed, and went). */
		cow[x] = !q->wl && q->len % P && q->npg[x] &&
			 (q->bor[x][last] || seq_frame_listed(s, x, q->fr[x][last], q) ||
			  frame_published(s, x, q->fr[x][last]));
		need = pages_for(q->len + n_new) - q->npg[x] + cow[x];
		want[x] = q->wl ? -EBUSY : pages_for(q->len + n_new) > s->cfg->device_frames ?
			  -E2BIG : need > avail_of(s, x) ? -ENOMEM : 0;
	}
	snprintf(s->op, sizeof(s->op), "seq_extend(seq %" PRIu64 ", n_new %u, %s): len "
		 "%u, %s, cow %d / %d", q->id, n_new, with_toks ? "tokens" : "no tokens",
		 q->len, q->wl ? "write lease open" : "no lease", cow[SA], cow[SB]);
	for (int x = 0; x < NSIDES; x++) {
		struct engine *eng = lock_all(&s->d[x]);
		struct engine_lease L;

		rc[x] = share_seq_extend(eng, q->id, n_new, with_toks ? toks : NULL,
					 q->owner, &L, &e[x]);
		if (!rc[x])
			tl_copy(&t[x], &L);
		unlock(&s->d[x]);
	}
	EXPECT_RC(s, rc, want, either, e);
	if (rc[SA] && rc[SB]) {
		s->nochange[SA] = s->nochange[SB] = true;
		s->o.nomem += rc[SA] == -ENOMEM;
		return;
	}
	s->may_evict = true;
	for (int x = 0; x < NSIDES; x++) {
		const struct engine_lease *L = &t[x].L;
		uint32_t last = q->npg[x] - 1;

		if (rc[x])
			continue;
		seq_lease_shape(s, x, L, q->len, n_new);
		for (uint32_t i = 0; i + 1 < q->npg[x]; i++)
			EXPECT(s, L->frames[i] == q->fr[x][i], "%s: extend moved page %u: "
			       "%u -> %u", side_name[x], i, q->fr[x][i], L->frames[i]);
		if (q->npg[x]) {
			EXPECT(s, (L->frames[last] != q->fr[x][last]) == cow[x], "%s: last "
			       "page %u: frame %u -> %u, model cow %d", side_name[x], last,
			       q->fr[x][last], L->frames[last], cow[x]);
			q->fr[x][last] = L->frames[last];
			q->bor[x][last] &= !cow[x];
		}
		for (uint32_t i = q->npg[x]; i < L->npages; i++) {
			q->fr[x][i] = L->frames[i];
			q->bor[x][i] = false;
		}
		if (rc[1 - x]) {
			/* The other side had no room: give the new pages back. */
			EXPECT(s, sd_release(&s->d[x], L->id, &e[x]) == 0, "undo: %s",
			       e[x].msg);
			s->o.div_nomem++;
			continue;
		}
		q->npg[x] = L->npages;
		q->wid[x] = L->id;
		q->base[x] = q->len;
	}
	if (rc[SA] || rc[SB])
		return;
	for (uint32_t i = 0; i < n_new; i++) {
		uint32_t pos = q->len + i;

		if (with_toks) {
			q->toks[pos] = toks[i];
			q->keys[pos] = roll(pos ? q->keys[pos - 1] : 0xfeed, toks[i]);
		} else {
			q->keys[pos] = mix64(q->wkey + pos) | 1;
		}
	}
	q->hashable &= with_toks;
	q->wtoks = with_toks;
	q->wl = true;
	q->end = q->len + n_new;
	s->o.seq_extends++;
}

static void op_seq_free(struct sim *s)
{
	struct mseq *q = seq_pick_live(s);
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	uint32_t owner;

	if (!q)
		return;
	owner = chance(s, 10) ? q->owner % NOWNERS + 1 : q->owner;
	snprintf(s->op, sizeof(s->op), "seq_free(seq %" PRIu64 ", owner %u of %u)%s",
		 q->id, owner, q->owner, q->wl ? ": write lease held" : "");
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = SHARE_CALL(s, x, share_seq_free(eng_, q->id, owner, &e[x]));
		want[x] = owner != q->owner ? -EPERM : q->wl ? -EBUSY : 0;
		s->nochange[x] = want[x] != 0;
	}
	EXPECT_RC(s, rc, want, either, e);
	if (!rc[SA]) {
		seq_destroy(s, q);
		s->o.seq_frees++;
	}
}

static int user_of_key(const struct sim *s, uint64_t key)
{
	for (int u = 0; u < NUSERS; u++)
		if (s->u[u].key == key)
			return u;
	return -1;
}

static int chunk_of_id(const struct sim *s, const struct kvp_chunk_id *id)
{
	for (int r = 0; r < NCREC; r++)
		if (s->c[r].live && s->c[r].registered && !memcmp(id, &s->c[r].id, sizeof(*id)))
			return r;
	return -1;
}

static struct mseq *seq_of_id(struct sim *s, uint64_t id)
{
	for (int i = 0; i < NSEQS; i++)
		if (s->q[i].live && s->q[i].id == id)
			return &s->q[i];
	return NULL;
}

/* share_seq_create's checks in its order: source by source (found, ready,
 * head not trimmed, not more than committed), and every source but the
 * last ending on a page boundary. */
static int create_want(struct sim *s, const struct kvp_seq_src *src, uint32_t nsrc,
		       uint32_t *total)
{
	*total = 0;
	for (uint32_t i = 0; i < nsrc; i++) {
		uint64_t t = 0;
		int u, r;
		struct mseq *o;

		switch (src[i].kind) {
		case KVP_SRC_USER:
			u = user_of_key(s, src[i].id);
			if (u < 0 || !s->u[u].len)
				return -ENOENT;
			if (s->u[u].start)
				return -EINVAL;
			t = src[i].tokens ? src[i].tokens : s->u[u].len;
			if (t > s->u[u].len)
				return -EINVAL;
			break;
		case KVP_SRC_CHUNK:
			r = chunk_of_id(s, &src[i].chunk);
			if (r < 0)
				return -ENOENT;
			if (!s->c[r].ready)
				return -EAGAIN;
			t = s->c[r].ntok;
			break;
		default:
			o = seq_of_id(s, src[i].id);
			if (!o || !o->len)
				return -ENOENT;
			t = o->len;
			break;
		}
		if (i + 1 < nsrc && t % P)
			return -EINVAL;
		*total += (uint32_t)t;
	}
	return 0;
}

/* A seq_create's sources: users of any shard, chunks, sequences. */
struct create_plan {
	struct kvp_seq_src src[3];
	uint32_t nsrc, n_new;
	int kinds[3], objs[3];
	uint32_t toks[3], total;
};

/* Valid sources, mostly; false when there is nothing to make. */
static bool create_sources(struct sim *s, struct create_plan *c)
{
	memset(c, 0, sizeof(*c));
	c->nsrc = 1 + rnd(s, 3);
	c->n_new = rnd(s, 7);
	for (uint32_t i = 0; i < c->nsrc; i++) {
		bool last = i + 1 == c->nsrc;
		int tries = 8, kind = 0, obj = -1;
		uint32_t tk = 0;

		while (tries-- && obj < 0) {
			kind = 1 + (int)rnd(s, 3);
			if (kind == KVP_SRC_USER) {
				int u = (int)rnd(s, NUSERS);
				uint32_t len = (uint32_t)s->u[u].len;

				/* A trimmed head is an error: rarely. */
				if (!len || (!last && len < P) ||
				    (s->u[u].start && !chance(s, 10)))
					continue;
				obj = u;
				tk = last ? (chance(s, 30) ? len : 1 + rnd(s, len))
					  : P * (1 + rnd(s, len / P));
			} else if (kind == KVP_SRC_CHUNK) {
				int r = (int)rnd(s, NCREC);

				for (int k = 0; k < NCREC && obj < 0; k++, r = (r + 1) % NCREC)
					if (s->c[r].live && s->c[r].registered && s->c[r].ready &&
					    (last || s->c[r].ntok % P == 0))
						obj = r;
				tk = obj >= 0 ? s->c[obj].ntok : 0;
			} else {
				struct mseq *o = seq_pick_live(s);

				/* An alloc's open lease: its length is per side. */
				if (!o || !o->len || (o->wl && o->from_alloc) ||
				    (!last && o->len % P))
					continue;
				obj = (int)(o - s->q);
				tk = o->len;
			}
		}
		if (obj < 0) {
			c->nsrc = i;
			break;
		}
		c->kinds[i] = kind;
		c->objs[i] = obj;
		c->toks[i] = tk;
		c->total += tk;
		c->src[i].kind = (uint32_t)kind;
		if (kind == KVP_SRC_USER) {
			c->src[i].id = s->u[obj].key;
			c->src[i].tokens = tk == s->u[obj].len && chance(s, 50) ? 0 : tk;
		} else if (kind == KVP_SRC_CHUNK) {
			c->src[i].chunk = s->c[obj].id;
		} else {
			c->src[i].id = s->q[obj].id;
		}
	}
	return c->total + c->n_new <= MAXTOK && (c->nsrc || c->n_new);
}

/* Now and then a source that is not there, or ends mid-page. */
static void create_plant_error(struct sim *s, struct create_plan *c)
{
	uint32_t i = rnd(s, c->nsrc);

	if (!c->nsrc || !chance(s, 12))
		return;
	switch (rnd(s, 4)) {
	case 0:
		c->src[i].kind = KVP_SRC_CHUNK;
		memset(&c->src[i].chunk, 0xee, sizeof(c->src[i].chunk));
		break;
	case 1:
		c->src[i].kind = KVP_SRC_SEQ;
		c->src[i].id = 999;
		break;
	case 2:
		c->src[i].kind = KVP_SRC_USER;
		c->src[i].id = 12345; /* nobody's: -ENOENT */
		break;
	default:
		if (c->kinds[i] == KVP_SRC_USER && i + 1 < c->nsrc)
			c->src[i].tokens = c->toks[i] + 1; /* mid-page, or past len */
		break;
	}
}

/* Side x's result: frames to onload, for new pages and a copied partial
 * page, against its free + evictable frames less the sources it pins. */
static int create_want_side(struct sim *s, int x, const struct create_plan *c)
{
	uint64_t av = avail_of(s, x), unav = 0, need;
	uint32_t onload = 0, cow = c->n_new && c->total % P;
	bool seen_u[NUSERS] = { false }, seen_c[NCREC] = { false };

	for (uint32_t i = 0; i < c->nsrc; i++) {
		if (c->src[i].kind == KVP_SRC_USER) {
			int u = user_of_key(s, c->src[i].id);
			const struct engine_user_info *pi = &s->info[x][u];

			if (seen_u[u])
				continue;
			seen_u[u] = true;
			onload += pi->pages - pi->pages_device;
			if (!user_pinned(s, u))
				unav += pi->pages_device;
		} else if (c->src[i].kind == KVP_SRC_CHUNK) {
			int r = chunk_of_id(s, &c->src[i].chunk);

			if (seen_c[r])
				continue;
			seen_c[r] = true;
			if (chunk_on_lru(s, r))
				unav += s->c[r].npages;
		}
	}
	need = onload + pages_for(c->total + c->n_new) - pages_for(c->total) + cow;
	av = av > unav ? av - unav : 0;
	return pages_for(c->total + c->n_new) > s->cfg->device_frames ? -E2BIG :
	       need > av ? -ENOMEM : 0;
}

static void create_describe(struct sim *s, int slot, uint32_t owner,
			    const struct create_plan *c, const int want[NSIDES])
{
	char what[160] = "";

	for (uint32_t i = 0; i < c->nsrc; i++) {
		int u = c->src[i].kind == KVP_SRC_USER ? user_of_key(s, c->src[i].id) : -1;

		snprintf(what + strlen(what), sizeof(what) - strlen(what), " %s:%d/%" PRIu64,
			 c->src[i].kind == 1 ? "user" : c->src[i].kind == 2 ? "chunk" : "seq",
			 c->src[i].kind == 1 ? u : c->objs[i], c->src[i].tokens);
		if (u >= 0)
			snprintf(what + strlen(what), sizeof(what) - strlen(what),
				 "(shard %u)", s->shard_of[u]);
	}
	snprintf(s->op, sizeof(s->op), "seq_create(seq %d, [%s ], n_new %u, owner %u): "
		 "model %d / %d", slot + 1, what, c->n_new, owner, want[SA], want[SB]);
}

/* Both sides made it: every page where its source has it (but a copied
 * partial page), every byte its source's, on each side; then the model. */
static void create_record(struct sim *s, int slot, uint32_t owner,
			  const struct create_plan *c, const struct tlease t[NSIDES])
{
	uint32_t cow = c->n_new && c->total % P, pos = 0;
	struct mseq nq;

	memset(&nq, 0, sizeof(nq));
	for (uint32_t i = 0; i < c->nsrc; i++) {
		int o = c->objs[i];

		for (uint32_t tk = 0; tk < c->toks[i]; tk++, pos++)
			nq.keys[pos] = c->kinds[i] == KVP_SRC_USER ? hist_key(s, o, tk) :
				       c->kinds[i] == KVP_SRC_CHUNK ?
				       chunk_key(s->c[o].content, s->c[o].gen, tk) :
				       s->q[o].keys[tk];
		if (c->kinds[i] == KVP_SRC_USER) {
			nq.upin[o]++;
			s->o.create_shards |= 1u << s->shard_of[o];
			s->o.cross_creates += s->shard_of[o] != 0;
		} else if (c->kinds[i] == KVP_SRC_CHUNK) {
			nq.chold[o]++;
		} else {
			for (int u = 0; u < NUSERS; u++)
				nq.upin[u] += s->q[o].upin[u];
			for (int r = 0; r < NCREC; r++)
				nq.chold[r] += s->q[o].chold[r];
		}
	}
	for (int x = 0; x < NSIDES; x++) {
		const struct engine_lease *L = &t[x].L;
		uint32_t p = 0;

		seq_lease_shape(s, x, L, c->total, c->n_new);
		EXPECT(s, !c->n_new == !L->id, "%s: lease id %#" PRIx64 " with n_new %u",
		       side_name[x], L->id, c->n_new);
		for (uint32_t i = 0; i < c->nsrc; i++)
			for (uint32_t k = 0; k < pages_for(c->toks[i]); k++, p++) {
				bool copied = cow && p + 1 == pages_for(c->total);
				bool seq = c->kinds[i] == KVP_SRC_SEQ;
				uint32_t f = L->frames[p], want_f;

				nq.bor[x][p] = !copied && (!seq || s->q[c->objs[i]].bor[x][k]);
				if (c->kinds[i] == KVP_SRC_USER)
					continue; /* its bytes are checked below */
				want_f = seq ? s->q[c->objs[i]].fr[x][k] :
					 s->c[c->objs[i]].frames[x][k];
				EXPECT(s, (f == want_f) != copied, "%s: page %u (source %u "
				       "page %u) is frame %u, the source's %u, copied %d",
				       side_name[x], p, i, k, f, want_f, copied);
			}
		/* Every borrowed page, whatever shard owns it, holds its
		 * source's bytes. */
		read_frames(s, x, L->frames, c->total);
		expect_keys(s, x, s->buf, nq.keys, c->total, "virtual sequence");
		nq.npg[x] = L->npages;
		memcpy(nq.fr[x], L->frames, L->npages * sizeof(uint32_t));
		nq.wid[x] = L->id;
		nq.base[x] = c->total;
	}
	nq.live = true;
	nq.id = (uint64_t)slot + 1;
	nq.owner = owner;
	nq.len = c->total;
	nq.wl = c->n_new > 0;
	nq.end = c->total + c->n_new;
	nq.wkey = ++s->keyseq * 0x100000001ull;
	for (uint32_t p = c->total; p < nq.end; p++)
		nq.keys[p] = mix64(nq.wkey + p) | 1;
	s->q[slot] = nq;
	s->o.seq_creates++;
}

/* A virtual sequence over users of any shard, chunks and sequences. */
static void op_seq_create(struct sim *s)
{
	int slot = (int)rnd(s, NSEQS), base;
	uint32_t owner = 1 + rnd(s, NOWNERS);
	struct create_plan c;
	struct tlease t[NSIDES];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };

	if (!create_sources(s, &c))
		return;
	create_plant_error(s, &c);
	base = s->q[slot].live ? -EEXIST : create_want(s, c.src, c.nsrc, &c.total);
	if (c.total + c.n_new > MAXTOK)
		return;
	for (int x = 0; x < NSIDES; x++)
		want[x] = base ? base : create_want_side(s, x, &c);
	create_describe(s, slot, owner, &c, want);
	for (int x = 0; x < NSIDES; x++) {
		struct engine *eng = lock_all(&s->d[x]);
		struct engine_lease L;

		rc[x] = share_seq_create(eng, (uint64_t)slot + 1, c.src, c.nsrc, c.n_new,
					 owner, &L, &e[x]);
		if (!rc[x])
			tl_copy(&t[x], &L);
		unlock(&s->d[x]);
	}
	EXPECT_RC(s, rc, want, either, e);
	if (rc[SA] && rc[SB]) {
		s->nochange[SA] = s->nochange[SB] = true;
		s->o.nomem += rc[SA] == -ENOMEM;
		return;
	}
	s->may_evict = true;
	if (rc[SA] || rc[SB]) {
		seq_discard(s, rc[SA] ? SB : SA, (uint64_t)slot + 1, owner);
		s->o.div_nomem++;
		return;
	}
	create_record(s, slot, owner, &c, t);
}

/* Lookups: never a hit past what commits published, never short of what
 * live sequences hold; the hit pages hold those tokens' bytes. */
static void op_lookup(struct sim *s)
{
	uint32_t toks[MAXTOK], ub = 0, lb = 0;
	uint64_t keys[MAXTOK];
	uint32_t n = token_list(s, toks, keys), full = n / P;

	while (ub < full && pub_has(s, keys[(ub + 1) * P - 1], ub))
		ub++;
	for (int i = 0; i < NSEQS; i++) {
		const struct mseq *q = &s->q[i];
		uint32_t j = 0;

		if (!q->live || !q->hashable || (q->wl && q->from_alloc))
			continue;
		while (j < q->len / P && j < full && q->keys[(j + 1) * P - 1] ==
		       keys[(j + 1) * P - 1])
			j++;
		lb = j > lb ? j : lb;
	}
	snprintf(s->op, sizeof(s->op), "prefix_lookup(%u tokens): model %u..%u pages",
		 n, lb, ub);
	for (int x = 0; x < NSIDES; x++) {
		struct share_prefix_hit h;
		uint32_t fr[MAXPG], cached;

		share_prefix_lookup(lock_all(&s->d[x]), toks, n, &h);
		if (h.npages)
			memcpy(fr, h.frames, h.npages * sizeof(uint32_t));
		unlock(&s->d[x]);
		cached = h.npages && h.npages * P >= n ? n - 1 : h.npages * P;
		EXPECT(s, h.npages >= lb && h.npages <= ub && h.tokens == cached,
		       "%s: %u pages, %u tokens hit; model %u..%u pages", side_name[x],
		       h.npages, h.tokens, lb, ub);
		read_frames(s, x, fr, h.npages * P);
		expect_keys(s, x, s->buf, keys, h.npages * P, "prefix lookup hit");
		s->o.lookup_hits += h.npages > 0;
	}
	s->o.lookups++;
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

static int crec_new(struct sim *s)
{
	for (int r = 0; r < NCREC; r++)
		if (!s->c[r].live)
			return r;
	return -1;
}

static void op_chunk_register(struct sim *s)
{
	int c = (int)rnd(s, NCONTENT), r = s->reg[c], nr = crec_new(s);
	uint32_t toks[16], n = content_len(c), owner = 1 + rnd(s, NOWNERS);
	struct share_chunk_reg out[NSIDES];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	char meta[32];

	if (nr < 0)
		return;
	for (uint32_t i = 0; i < n; i++)
		toks[i] = 5000 + (uint32_t)c * 100 + i;
	snprintf(meta, sizeof(meta), "{\"c\":%d,\"t\":%u}", c, content_type(c));
	snprintf(s->op, sizeof(s->op), "chunk_register(content %d, %u tokens, owner %u): %s",
		 c, n, owner, r < 0 ? "new" : s->c[r].ready ? "ready" : "filling");
	for (int x = 0; x < NSIDES; x++) {
		want[x] = r >= 0 || pages_for(n) <= avail_of(s, x) ? 0 : -ENOMEM;
		rc[x] = SHARE_CALL(s, x, share_chunk_register(eng_, toks, n, content_type(c),
				   meta, owner, s->now, &out[x], &e[x]));
		/* The page table is engine memory until the next call. */
		if (!rc[x] && out[x].created)
			memcpy(s->c[nr].frames[x], out[x].lease.frames,
			       pages_for(n) * sizeof(uint32_t));
	}
	EXPECT_RC(s, rc, want, either, e);
	if (r >= 0) {
		for (int x = 0; x < NSIDES; x++)
			EXPECT(s, !out[x].created && !memcmp(&out[x].id, &s->c[r].id,
			       sizeof(out[x].id)) && out[x].state == (s->c[r].ready ?
			       KVP_CHUNK_READY : KVP_CHUNK_FILLING), "%s: register of an "
			       "existing chunk: created %d state %u", side_name[x],
			       out[x].created, out[x].state);
		return;
	}
	if (rc[SA] && rc[SB]) {
		s->nochange[SA] = s->nochange[SB] = true;
		s->o.nomem++;
		return;
	}
	s->may_evict = true;
	if (rc[SA] || rc[SB]) {
		int x = rc[SA] ? SB : SA;

		/* Released before its seal: the chunk is deleted. */
		EXPECT(s, sd_release(&s->d[x], out[x].lease.id, &e[x]) == 0, "undo: %s",
		       e[x].msg);
		s->o.div_nomem++;
		return;
	}
	EXPECT(s, out[SA].created && out[SB].created &&
	       out[SA].state == KVP_CHUNK_FILLING && out[SB].state == KVP_CHUNK_FILLING &&
	       !memcmp(&out[SA].id, &out[SB].id, sizeof(out[SA].id)),
	       "register: created %d / %d, state %u / %u, ids %s", out[SA].created,
	       out[SB].created, out[SA].state, out[SB].state,
	       memcmp(&out[SA].id, &out[SB].id, sizeof(out[SA].id)) ? "differ" : "equal");
	struct mchunk *k = &s->c[nr];
	uint32_t fr[NSIDES][MAXPG];

	memcpy(fr, k->frames, sizeof(fr));
	memset(k, 0, sizeof(*k));
	memcpy(k->frames, fr, sizeof(fr));
	k->live = k->registered = true;
	k->content = c;
	k->gen = ++s->cgen[c];
	k->id = out[SA].id;
	k->ntok = n;
	k->npages = pages_for(n);
	k->filler = owner;
	for (int x = 0; x < NSIDES; x++)
		k->fill[x] = out[x].lease.id;
	s->reg[c] = nr;
	s->o.registers++;
}

/* Fill a chunk being filled, then seal, commit-seal, seal as another
 * client, or abandon it. */
static void op_chunk_fill(struct sim *s)
{
	uint64_t keys[16];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES] = { 0, 0 };
	bool either[NSIDES] = { false, false };
	int r = (int)rnd(s, NCREC);

	for (int k = 0; k < NCREC; k++, r = (r + 1) % NCREC)
		if (s->c[r].live && s->c[r].registered && !s->c[r].ready)
			break;
	struct mchunk *k = &s->c[r];
	if (!k->live || !k->registered || k->ready)
		return;
	for (uint32_t t = 0; t < k->ntok; t++)
		keys[t] = chunk_key(k->content, k->gen, t);
	uint32_t what = rnd(s, 100);
	snprintf(s->op, sizeof(s->op), "chunk rec %d (content %d): %s", r, k->content,
		 what < 55 ? "seal" : what < 75 ? "commit-seal" : what < 85 ?
		 "seal by another client" : "abandon");
	for (int x = 0; x < NSIDES; x++) {
		write_lease(s, x, k->fill[x], 0, k->ntok, keys, k->frames[x], 0);
		if (what < 55) {
			rc[x] = SHARE_CALL(s, x, share_chunk_seal(eng_, k->fill[x], k->filler,
								  &e[x]));
		} else if (what < 75) {
			rc[x] = sd_commit(&s->d[x], k->fill[x], k->ntok, &e[x]);
			EXPECT(s, rc[x] == 0, "%s: commit-seal = %d (%s)", side_name[x],
			       rc[x], e[x].msg);
			rc[x] = sd_release(&s->d[x], k->fill[x], &e[x]);
			want[x] = rc[SA]; /* 0 or -ENOENT, the same on both */
		} else if (what < 85) {
			rc[x] = SHARE_CALL(s, x, share_chunk_seal(eng_, k->fill[x],
					   k->filler % NOWNERS + 1, &e[x]));
			want[x] = -EPERM;
			s->nochange[x] = true;
		} else {
			rc[x] = sd_release(&s->d[x], k->fill[x], &e[x]);
		}
	}
	/* A commit that seals ends the fill lease, or leaves it to release. */
	EXPECT(s, !(what >= 55 && what < 75) || rc[SA] == 0 || rc[SA] == -ENOENT,
	       "release after a commit-seal = %d (%s)", rc[SA], e[SA].msg);
	EXPECT_RC(s, rc, want, either, e);
	if (what >= 75 && what < 85)
		return;
	if (what >= 85) {
		k->live = false;
		s->reg[k->content] = -1;
		return;
	}
	k->ready = true;
	k->fill[SA] = k->fill[SB] = 0;
	k->filler = 0;
}

static void op_chunk_acquire(struct sim *s)
{
	int c = (int)rnd(s, NCONTENT), r = s->reg[c];
	uint32_t owner = 1 + rnd(s, NOWNERS);
	struct kvp_chunk_id id;
	struct tlease t[NSIDES];
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };

	if (s->nrd == MAXRD)
		return;
	memset(&id, 0, sizeof(id));
	id.b[0] = (uint8_t)c;
	id.b[31] = 0x5a;
	if (r >= 0)
		id = s->c[r].id;
	snprintf(s->op, sizeof(s->op), "chunk_acquire(content %d): %s", c,
		 r < 0 ? "absent" : s->c[r].ready ? "ready" : "filling");
	for (int x = 0; x < NSIDES; x++) {
		struct engine *eng = lock_all(&s->d[x]);
		struct engine_lease L;

		rc[x] = share_chunk_acquire(eng, &id, owner, s->now, &L, &e[x]);
		if (!rc[x])
			tl_copy(&t[x], &L);
		unlock(&s->d[x]);
		want[x] = r < 0 ? -ENOENT : !s->c[r].ready ? -EAGAIN : 0;
		s->nochange[x] = want[x] != 0;
	}
	EXPECT_RC(s, rc, want, either, e);
	if (rc[SA])
		return;
	struct mread *m = &s->rd[s->nrd++];
	m->rec = r;
	m->owner = owner;
	for (int x = 0; x < NSIDES; x++) {
		seq_lease_shape(s, x, &t[x].L, s->c[r].ntok, 0);
		for (uint32_t i = 0; i < t[x].L.npages; i++)
			EXPECT(s, t[x].frames[i] == s->c[r].frames[x][i], "%s: acquire page "
			       "%u: frame %u, the chunk's is %u", side_name[x], i,
			       t[x].frames[i], s->c[r].frames[x][i]);
		m->id[x] = t[x].L.id;
	}
	s->o.acquires++;
}

static void op_read_release(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], want[NSIDES] = { 0, 0 };
	bool either[NSIDES] = { false, false };

	if (!s->nrd)
		return;
	uint32_t i = rnd(s, s->nrd);
	int r = s->rd[i].rec;

	snprintf(s->op, sizeof(s->op), "release chunk read lease %#" PRIx64 "/%#" PRIx64,
		 s->rd[i].id[SA], s->rd[i].id[SB]);
	for (int x = 0; x < NSIDES; x++)
		rc[x] = sd_release(&s->d[x], s->rd[i].id[x], &e[x]);
	EXPECT_RC(s, rc, want, either, e);
	s->rd[i] = s->rd[--s->nrd];
	chunk_maybe_free(s, r);
}

static void chunk_unregister(struct sim *s, int r)
{
	s->reg[s->c[r].content] = -1;
	s->c[r].registered = false;
	chunk_maybe_free(s, r);
}

static void chunk_delete_one(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int c = (int)rnd(s, NCONTENT), r = s->reg[c], rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };
	struct kvp_chunk_id id;

	if (r >= 0 && !s->c[r].ready)
		return; /* deleting a chunk being filled: not specified */
	memset(&id, 0x44, sizeof(id));
	if (r >= 0)
		id = s->c[r].id;
	snprintf(s->op, sizeof(s->op), "chunk_delete(content %d)%s", c,
		 r < 0 ? ": absent" : "");
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = SHARE_CALL(s, x, share_chunk_delete(eng_, &id, &e[x]));
		want[x] = r < 0 ? -ENOENT : 1;
		s->nochange[x] = r < 0;
	}
	EXPECT_RC(s, rc, want, either, e);
	if (r >= 0) {
		chunk_unregister(s, r);
		s->o.deletes++;
	}
}

static void chunk_clear_type(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	uint32_t type = rnd(s, 4), n = 0;
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false };

	for (int c = 0; c < NCONTENT; c++)
		if (s->reg[c] >= 0 && (!type || content_type(c) == type)) {
			if (!s->c[s->reg[c]].ready)
				return; /* clear of a chunk being filled: not specified */
			n++;
		}
	snprintf(s->op, sizeof(s->op), "chunk_clear(type %u): model %u", type, n);
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = SHARE_CALL(s, x, share_chunk_clear(eng_, type));
		want[x] = (int)n;
	}
	EXPECT_RC(s, rc, want, either, e);
	for (int c = 0; c < NCONTENT; c++)
		if (s->reg[c] >= 0 && (!type || content_type(c) == type))
			chunk_unregister(s, s->reg[c]);
}

/* Chunks nobody held for max_age: the same on both (the same clock). */
static void chunk_evict_unused(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	uint64_t max_age = (rnd(s, 200) * 1000 + 500) * 1000ull;
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false }, go[NCREC] = { false };
	uint32_t n = 0;

	for (int r = 0; r < NCREC; r++) {
		struct kvp_chunk_info ci;

		if (!chunk_on_lru(s, r))
			continue;
		rc[SA] = SHARE_CALL(s, SA, share_chunk_info(eng_, &s->c[r].id, &ci, &e[SA]));
		EXPECT(s, rc[SA] == 0, "info of a registered chunk = %d (%s)", rc[SA],
		       e[SA].msg);
		if (s->now - ci.last_access_ns >= max_age) {
			go[r] = true;
			n++;
		}
	}
	snprintf(s->op, sizeof(s->op), "evict_unused(%" PRIu64 " ns): model %u",
		 max_age, n);
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = SHARE_CALL(s, x, share_chunk_evict_unused(eng_, max_age, s->now));
		want[x] = (int)n;
	}
	EXPECT_RC(s, rc, want, either, e);
	for (int r = 0; r < NCREC; r++)
		if (go[r])
			chunk_unregister(s, r);
	s->unused_evicted += n;
}

static void chunk_list_rows(struct sim *s)
{
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	struct kvp_chunk_info rows[NSIDES][NCONTENT];
	uint32_t type = rnd(s, 4), n = 0;
	int rc[NSIDES], want[NSIDES];
	bool either[NSIDES] = { false, false }, more[NSIDES];

	for (int c = 0; c < NCONTENT; c++)
		n += s->reg[c] >= 0 && (!type || content_type(c) == type);
	snprintf(s->op, sizeof(s->op), "chunk_list(type %u): model %u", type, n);
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = SHARE_CALL(s, x, share_chunk_list(eng_, type, NULL, NULL, rows[x],
				   NCONTENT, &more[x], &e[x]));
		want[x] = (int)n;
		s->nochange[x] = true;
	}
	EXPECT_RC(s, rc, want, either, e);
	for (int i = 0; i < rc[SA]; i++) {
		const struct kvp_chunk_info *a = &rows[SA][i], *b = &rows[SB][i];
		int c = atoi(a->meta + 5), r = c >= 0 && c < NCONTENT ? s->reg[c] : -1;

		EXPECT(s, !more[SA] && !more[SB] && !memcmp(&a->id, &b->id, sizeof(a->id)) &&
		       !memcmp(&a->root, &b->root, sizeof(a->root)) &&
		       a->tokens == b->tokens && a->state == b->state &&
		       a->holders == b->holders && a->pages == b->pages &&
		       !strcmp(a->meta, b->meta), "list row %d differs (meta \"%s\" / "
		       "\"%s\")", i, a->meta, b->meta);
		EXPECT(s, r >= 0 && !memcmp(&a->root, &s->c[r].id, sizeof(a->root)) &&
		       a->tokens == s->c[r].ntok && a->holders == chunk_holders(s, r) &&
		       a->state == (s->c[r].ready ? KVP_CHUNK_READY : KVP_CHUNK_FILLING),
		       "list row %d (meta \"%s\") disagrees with the model", i, a->meta);
	}
}

static void op_chunk_admin(struct sim *s)
{
	uint32_t what = rnd(s, 100);

	if (what < 40)
		chunk_delete_one(s);
	else if (what < 55)
		chunk_clear_type(s);
	else if (what < 75)
		chunk_evict_unused(s);
	else
		chunk_list_rows(s);
}

/* The model registers roots only: a query root does not follow its
 * request's system, so compose refuses the chain on both sides and holds
 * nothing (as test_share_model; chains are test_share's). */
static void op_compose(struct sim *s)
{
	struct kvp_compose_req req;
	struct share_composition out;
	struct errbuf e[NSIDES] = { { .msg = "" }, { .msg = "" } };
	int rc[NSIDES], sys = -1, qry = -1;

	for (int c = 0; c < NCONTENT; c++) {
		int r = s->reg[c];

		if (r < 0 || !s->c[r].ready)
			continue;
		if (content_type(c) == KVP_CHUNK_SYSTEM)
			sys = r;
		else if (content_type(c) == KVP_CHUNK_QUERY)
			qry = r;
	}
	if (sys < 0 || qry < 0)
		return;
	memset(&req, 0, sizeof(req));
	req.system = s->c[sys].id;
	req.query = s->c[qry].id;
	req.qo_len = 1;
	snprintf(s->op, sizeof(s->op), "compose(system rec %d, query rec %d)", sys, qry);
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = SHARE_CALL(s, x, share_compose(eng_, &req, 1, chance(s, 30), 1,
						       s->now, &out, &e[x]));
		EXPECT(s, rc[x] == -EINVAL && strstr(e[x].msg, "chain is broken"),
		       "%s: compose of root chunks = %d (%s)", side_name[x], rc[x], e[x].msg);
		s->nochange[x] = true;
	}
	s->o.composes++;
}

/* ------------------------------------------------------------ the check */

static void sweep(struct sim *s)
{
	struct errbuf e = { .msg = "" };
	uint64_t keys[MAXFR * P];
	int rc;

	for (int x = 0; x < NSIDES; x++) {
		for (int u = 0; u < NUSERS; u++) {
			const struct muser *m = &s->u[u];

			if (!m->len)
				continue;
			rc = sd_read(&s->d[x], m->key, m->start, (uint32_t)m->len, s->buf, &e);
			EXPECT(s, rc == 0, "%s: read user %d = %d (%s)", side_name[x], u, rc,
			       e.msg);
			for (uint64_t t = 0; t < m->len; t++)
				keys[t] = hist_key(s, u, m->start + t);
			expect_keys(s, x, s->buf, keys, (uint32_t)m->len, "history");
		}
		for (int i = 0; i < NSEQS; i++) {
			const struct mseq *q = &s->q[i];

			if (!q->live || !q->len || (q->wl && q->from_alloc))
				continue;
			rc = SHARE_CALL(s, x, share_seq_read_tokens(eng_, q->id, 0, q->len,
								    s->buf, &e));
			EXPECT(s, rc == 0, "%s: read seq %" PRIu64 " = %d (%s)", side_name[x],
			       q->id, rc, e.msg);
			expect_keys(s, x, s->buf, q->keys, q->len, "sequence");
			read_frames(s, x, q->fr[x], q->len);
			expect_keys(s, x, s->buf, q->keys, q->len, "sequence page table");
		}
		for (int r = 0; r < NCREC; r++) {
			const struct mchunk *k = &s->c[r];

			if (!k->live || !k->ready)
				continue;
			for (uint32_t t = 0; t < k->ntok; t++)
				keys[t] = chunk_key(k->content, k->gen, t);
			read_frames(s, x, k->frames[x], k->ntok);
			expect_keys(s, x, s->buf, keys, k->ntok, "chunk pages");
			if (!k->registered)
				continue;
			rc = SHARE_CALL(s, x, share_chunk_read_tokens(eng_, &k->id, 0, k->ntok,
								      s->buf, &e));
			EXPECT(s, rc == 0, "%s: read chunk = %d (%s)", side_name[x], rc, e.msg);
			expect_keys(s, x, s->buf, keys, k->ntok, "chunk");
		}
	}
	s->o.sweeps++;
}

static void stats_same(struct sim *s, int x, const struct kvp_stats *a,
		       const struct kvp_stats *b)
{
	const uint64_t *p = (const uint64_t *)a, *q = (const uint64_t *)b;

	/* Lookups count themselves, found or not. */
	static const size_t counted[] = {
		offsetof(struct kvp_stats, prefix_lookups),
		offsetof(struct kvp_stats, prefix_lookup_tokens),
		offsetof(struct kvp_stats, prefix_hit_tokens),
		offsetof(struct kvp_stats, chunk_lookups),
		offsetof(struct kvp_stats, chunk_hits),
		offsetof(struct kvp_stats, chunk_last_access_ns),
	};

	for (size_t i = 0; i < sizeof(*a) / sizeof(uint64_t); i++) {
		bool lookup = false;

		for (size_t k = 0; k < sizeof(counted) / sizeof(counted[0]); k++)
			lookup |= counted[k] == i * sizeof(uint64_t);
		EXPECT(s, lookup || p[i] == q[i], "%s: a refused op changed kvp_stats "
		       "word %zu: %" PRIu64 " -> %" PRIu64, side_name[x], i, p[i], q[i]);
	}
}

/* Users: what vanished where, legal or not; one side's leftovers evicted. */
static void check_users(struct sim *s, uint64_t drops[NSIDES])
{
	struct errbuf e = { .msg = "" };

	for (int u = 0; u < NUSERS; u++) {
		struct muser *m = &s->u[u];
		struct engine_user_info ni[NSIDES];
		bool want = m->len || user_pinned(s, u), gone = false;

		for (int x = 0; x < NSIDES; x++) {
			sd_info(&s->d[x], m->key, &ni[x]);
			if (!want) {
				EXPECT(s, !ni[x].exists, "%s: user %d exists (len %" PRIu64
				       ", leases %u) but the model holds nothing",
				       side_name[x], u, ni[x].len, ni[x].leases);
				continue;
			}
			if (ni[x].exists) {
				EXPECT(s, !s->must_vanish[x][u], "%s: user %d should be gone",
				       side_name[x], u);
				continue;
			}
			EXPECT(s, !user_pinned(s, u) && (s->may_evict || s->must_vanish[x][u]),
			       "%s: user %d (len %" PRIu64 ", %u pins) vanished in an op "
			       "that may not drop it", side_name[x], u, m->len, user_pins(s, u));
			drops[x]++;
			s->o.drops[x] += !s->must_vanish[x][u];
			gone = true;
		}
		if (!want)
			continue;
		if (gone) {
			/* Evicted on one side: the client evicts it on the other. */
			for (int x = 0; x < NSIDES; x++) {
				if (!ni[x].exists)
					continue;
				int rc = sd_evict(&s->d[x], m->key, KVP_SEL_ALL, &e);

				EXPECT(s, rc == (int)ni[x].pages, "%s: reconciling evict of "
				       "user %d = %d (%s)", side_name[x], u, rc, e.msg);
				drops[x]++;
				s->o.reconciled_users++;
			}
			m->len = m->start = 0;
			m->gen++;
			continue;
		}
		for (int x = 0; x < NSIDES; x++) {
			const struct engine_user_info *n = &ni[x];

			/* (An empty history's start is where a write last began.) */
			EXPECT(s, n->len == m->len && (!m->len || (n->start == m->start &&
			       n->start == ni[SA].start)) && n->leases == user_pins(s, u) &&
			       n->pages == pages_for(m->len) && n->pages_device <= n->pages &&
			       n->pages_host <= n->pages &&
			       n->pages_device + n->pages_host >= n->pages,
			       "%s: user %d holds [%" PRIu64 ", +%" PRIu64 ") in %u pages "
			       "(%u device, %u host), %u leases; model [%" PRIu64 ", +%"
			       PRIu64 "), %u pins", side_name[x], u, n->start, n->len,
			       n->pages, n->pages_device, n->pages_host, n->leases,
			       m->start, m->len, user_pins(s, u));
			EXPECT(s, !user_pinned(s, u) || n->pages_device == n->pages,
			       "%s: user %d is pinned with %u of %u pages off the device",
			       side_name[x], u, n->pages - n->pages_device, n->pages);
		}
	}
}

/* Chunks nobody holds may go under pressure; one side's leftover deleted. */
static void check_chunks(struct sim *s, uint64_t gone[NSIDES])
{
	struct errbuf e = { .msg = "" };

	for (int r = 0; r < NCREC; r++) {
		struct mchunk *k = &s->c[r];
		struct kvp_chunk_info ci[NSIDES];
		bool present[NSIDES], any_gone = false;

		if (!k->live || !k->registered)
			continue;
		for (int x = 0; x < NSIDES; x++) {
			int rc = SHARE_CALL(s, x, share_chunk_info(eng_, &k->id, &ci[x], &e));

			present[x] = rc == 0;
			if (present[x]) {
				EXPECT(s, ci[x].holders == chunk_holders(s, r) &&
				       ci[x].state == (k->ready ? KVP_CHUNK_READY :
						       KVP_CHUNK_FILLING) &&
				       ci[x].tokens == k->ntok, "%s: chunk rec %d: %u holders, "
				       "state %u; model %u, ready %d", side_name[x], r,
				       ci[x].holders, ci[x].state, chunk_holders(s, r), k->ready);
				continue;
			}
			EXPECT(s, rc == -ENOENT && s->may_evict && chunk_on_lru(s, r),
			       "%s: chunk rec %d (ready %d, %u holders) vanished (%d: %s)",
			       side_name[x], r, k->ready, chunk_holders(s, r), rc, e.msg);
			gone[x]++;
			any_gone = true;
		}
		if (!any_gone)
			continue;
		for (int x = 0; x < NSIDES; x++) {
			if (!present[x])
				continue;
			int rc = SHARE_CALL(s, x, share_chunk_delete(eng_, &k->id, &e));

			EXPECT(s, rc == 1, "%s: reconciling delete = %d (%s)", side_name[x],
			       rc, e.msg);
			s->o.reconciled_chunks++;
		}
		chunk_unregister(s, r);
	}
}

/* What the model says every side holds now. */
struct gauges {
	uint64_t users, leases, seqs, chunks, chunk_pages;
};

static struct gauges model_gauges(const struct sim *s)
{
	struct gauges g = { .leases = s->nhl + s->nrd };

	for (int r = 0; r < NCREC; r++)
		if (s->c[r].live) {
			g.chunk_pages += s->c[r].npages;
			g.chunks += s->c[r].registered;
			g.leases += s->c[r].registered && !s->c[r].ready; /* filling */
		}
	for (int i = 0; i < NSEQS; i++) {
		g.seqs += s->q[i].live;
		g.leases += s->q[i].live && s->q[i].wl;
	}
	for (int u = 0; u < NUSERS; u++)
		g.users += s->u[u].len || user_pinned(s, u);
	return g;
}

/* Side x after the step (reconciled): counters, gauges and frames. */
static void check_side(struct sim *s, int x, const struct gauges *g,
		       uint64_t drops, uint64_t cgone)
{
	const struct kvp_stats *b = &s->st[x];
	uint64_t held = g->chunk_pages, host = 0, seq_pages = 0;
	struct kvp_stats a;

	sd_stats(&s->d[x], &a);
	for (int u = 0; u < NUSERS; u++) {
		sd_info(&s->d[x], s->u[u].key, &s->info[x][u]);
		held += s->info[x][u].pages_device + reserved(s, u);
		host += s->info[x][u].pages_host;
	}
	for (int i = 0; i < NSEQS; i++)
		for (uint32_t p = 0; s->q[i].live && p < s->q[i].npg[x]; p++)
			seq_pages += !s->q[i].bor[x][p];
	EXPECT(s, a.evicted_users - b->evicted_users == drops, "%s: evicted_users "
	       "grew by %" PRIu64 ", %" PRIu64 " histories were evicted", side_name[x],
	       a.evicted_users - b->evicted_users, drops);
	EXPECT(s, a.chunk_evicted - b->chunk_evicted == cgone + s->unused_evicted,
	       "%s: chunk_evicted grew by %" PRIu64 ", %" PRIu64 " went under "
	       "pressure, %" PRIu64 " unused", side_name[x],
	       a.chunk_evicted - b->chunk_evicted, cgone, s->unused_evicted);
	EXPECT(s, a.users == g->users && a.leases == g->leases && a.seqs == g->seqs &&
	       a.chunks == g->chunks && a.chunk_pages == g->chunk_pages &&
	       a.seq_pages == seq_pages, "%s: gauges users %" PRIu64 "/%" PRIu64
	       " leases %" PRIu64 "/%" PRIu64 " seqs %" PRIu64 "/%" PRIu64 " chunks %"
	       PRIu64 "/%" PRIu64 " chunk_pages %" PRIu64 "/%" PRIu64 " seq_pages %"
	       PRIu64 "/%" PRIu64 " (engine/model)", side_name[x], a.users, g->users,
	       a.leases, g->leases, a.seqs, g->seqs, a.chunks, g->chunks,
	       a.chunk_pages, g->chunk_pages, a.seq_pages, seq_pages);
	for (int t = 0; t < KVP_TIERS; t++)
		EXPECT(s, a.tier[t].frames_total == (t ? s->cfg->host_frames :
		       s->cfg->device_frames) && a.tier[t].frames_free +
		       a.tier[t].frames_used == a.tier[t].frames_total,
		       "%s: %s tier %" PRIu64 " free + %" PRIu64 " used of %" PRIu64,
		       side_name[x], kvp_tier_name(t), a.tier[t].frames_free,
		       a.tier[t].frames_used, a.tier[t].frames_total);
	/* No frame leaked: the host holds history pages only; the device at
	 * least histories, chunks and the prefix cache, exactly those when no
	 * sequence holds pages of its own. */
	EXPECT(s, a.tier[KVP_TIER_HOST].frames_used == host, "%s: %" PRIu64 " host "
	       "frames used, histories hold %" PRIu64, side_name[x],
	       a.tier[KVP_TIER_HOST].frames_used, host);
	held += a.prefix_pages;
	EXPECT(s, a.tier[KVP_TIER_DEVICE].frames_used >= held &&
	       (g->seqs || a.tier[KVP_TIER_DEVICE].frames_used == held),
	       "%s: %" PRIu64 " device frames used; histories, chunks and %" PRIu64
	       " prefix pages hold %" PRIu64 " (%" PRIu64 " sequences)", side_name[x],
	       a.tier[KVP_TIER_DEVICE].frames_used, a.prefix_pages, held, g->seqs);
	s->st[x] = a;
}

static void check_step(struct sim *s)
{
	uint64_t drops[NSIDES] = { 0, 0 }, cgone[NSIDES] = { 0, 0 };
	struct errbuf e = { .msg = "" };
	struct gauges g;

	for (int x = 0; x < NSIDES; x++) {
		struct kvp_stats st;
		int rc;

		EXPECT(s, s->d[x].locked == LOCK_NONE, "%s: a lock is still held",
		       side_name[x]);
		rc = sd_check(&s->d[x], &e);
		EXPECT(s, rc == 0, "%s: %s = %d: %s", side_name[x],
		       x == SA ? "engine_check" : "engine_check / shard_set_check", rc, e.msg);
		sd_stats(&s->d[x], &st);
		if (s->nochange[x])
			stats_same(s, x, &s->st[x], &st);
		EXPECT(s, s->may_evict || st.prefix_evicted_pages ==
		       s->st[x].prefix_evicted_pages, "%s: %" PRIu64 " prefix pages evicted "
		       "by an op that may not evict", side_name[x],
		       st.prefix_evicted_pages - s->st[x].prefix_evicted_pages);
	}
	check_users(s, drops);
	check_chunks(s, cgone);
	g = model_gauges(s);
	for (int x = 0; x < NSIDES; x++)
		check_side(s, x, &g, drops[x], cgone[x]);
	if (s->touch_all || s->step % SWEEP_EVERY == 0)
		sweep(s);
}

static void step_begin(struct sim *s, const char *what)
{
	snprintf(s->op, sizeof(s->op), "%s", what);
	s->may_evict = s->touch_all = false;
	s->nochange[SA] = s->nochange[SB] = false;
	memset(s->must_vanish, 0, sizeof(s->must_vanish));
	s->unused_evicted = 0;
	s->now += 1000000; /* 1 ms a step */
}

/* ------------------------------------------------------------ driver */

static void random_op(struct sim *s)
{
	uint32_t r = rnd(s, 1000);

	if (r < 190)
		op_prepare(s);
	else if (r < 320)
		op_hist_lease(s);
	else if (r < 335)
		op_stale_lease(s);
	else if (r < 375)
		op_offload(s);
	else if (r < 380)
		op_offload_all(s);
	else if (r < 420)
		op_evict(s);
	else if (r < 425)
		op_evict_all(s);
	else if (r < 440)
		op_info(s);
	else if (r < 445)
		op_list(s);
	else if (r < 455)
		op_release_owner(s);
	else if (r < 515)
		op_seq_alloc(s);
	else if (r < 590)
		op_seq_create(s);
	else if (r < 630)
		op_seq_extend(s);
	else if (r < 700)
		op_seq_lease(s);
	else if (r < 725)
		op_seq_free(s);
	else if (r < 775)
		op_chunk_register(s);
	else if (r < 805)
		op_chunk_fill(s);
	else if (r < 835)
		op_chunk_acquire(s);
	else if (r < 860)
		op_read_release(s);
	else if (r < 880)
		op_chunk_admin(s);
	else if (r < 890)
		op_compose(s);
	else if (r < 930)
		op_lookup(s);
	else
		op_prepare(s);
}

static void layout_of(struct kvp_layout *l)
{
	char msg[KVP_ERRLEN];

	assert_int_equal(kvp_layout_init(l, 2, 2, 4, KVP_DTYPE_FP32, P, msg,
					 sizeof(msg)), 0);
}

/* One engine and a set of NSHARDS with the same tiers (no reclaimer: a
 * prepare evicts exactly when it needs to, as the one engine does). */
static void sides_create(struct side d[NSIDES], uint32_t dev, uint32_t host,
			 uint64_t max_tokens, uint64_t seed)
{
	struct engine_config ec = { .device_frames = dev, .host_frames = host,
				    .max_tokens_per_user = max_tokens };
	struct shard_set_config sc = { .shards = NSHARDS, .reclaim = RECLAIM_OFF };
	uint8_t salt[SHARE_SALT_BYTES];
	struct errbuf e = { .msg = "" };
	int rc;

	layout_of(&ec.layout);
	memset(d, 0, NSIDES * sizeof(*d));
	rc = engine_create(&d[SA].eng, &ec, &e);
	if (rc)
		fail_msg("engine_create: %s", e.msg);
	sc.ec = ec;
	rc = shard_set_create(&d[SB].set, &sc, &e);
	if (rc)
		fail_msg("shard_set_create: %s", e.msg);
	/* As tenant.c: the same salt in every shard. */
	for (int i = 0; i < SHARE_SALT_BYTES; i++)
		salt[i] = (uint8_t)mix64(seed + (uint64_t)i);
	share_set_salt(d[SA].eng, salt);
	for (uint32_t i = 0; i < NSHARDS; i++)
		share_set_salt(d[SB].set->v[i].eng, salt);
	d[SA].base = engine_tier(d[SA].eng, KVP_TIER_DEVICE)->base;
	d[SB].base = shard_set_tier(d[SB].set, KVP_TIER_DEVICE)->base;
	for (int x = 0; x < NSIDES; x++)
		d[x].locked = LOCK_NONE;
}

static void sides_destroy(struct side d[NSIDES])
{
	for (int x = 0; x < NSIDES; x++)
		unlock(&d[x]); /* a mismatch may end a test with a lock held */
	engine_destroy(d[SA].eng);
	shard_set_destroy(d[SB].set);
	memset(d, 0, NSIDES * sizeof(*d));
}

/* What a test holds, freed by the teardown even when a mismatch ends it
 * early, so the sanitizer build reports only real leaks. */
static struct sim *g_sim;
static struct side g_sides[NSIDES];

static void sim_free(struct sim *s)
{
	sides_destroy(s->d);
	free(s->pubset);
	free(s->buf);
	free(s->want);
	free(s->slots);
	free(s);
}

static int teardown(void **state)
{
	(void)state;
	if (g_sim)
		sim_free(g_sim);
	g_sim = NULL;
	sides_destroy(g_sides);
	return 0;
}

static void sim_init(struct sim *s, const struct model_cfg *cfg)
{
	uint32_t per_shard[NSHARDS] = { 0 };

	s->cfg = cfg;
	assert_true(cfg->device_frames <= MAXFR);
	sides_create(s->d, cfg->device_frames, cfg->host_frames, cfg->max_tokens,
		     cfg->seed);
	s->l = engine_layout(s->d[SA].eng);
	s->words = (uint32_t)(s->l->token_bytes / 4);
	s->rng = cfg->seed;
	s->now = 1000ull * 1000000000ull;
	for (int u = 0; u < NUSERS; u++) {
		s->u[u].key = mix64(0x5a4d0000ull + (uint64_t)u) | 1;
		s->shard_of[u] = shard_of_user(s->d[SB].set, s->u[u].key);
		per_shard[s->shard_of[u]]++;
	}
	/* Every shard owns users, hot ones (0..5) in more than one shard. */
	for (uint32_t i = 0; i < NSHARDS; i++)
		assert_true(per_shard[i] >= 2);
	for (int c = 0; c < NCONTENT; c++)
		s->reg[c] = -1;
	s->pubset = calloc(PUBSET, sizeof(*s->pubset));
	s->buf = calloc((size_t)MAXFR * P * s->words, sizeof(uint32_t));
	s->want = calloc(s->words, sizeof(uint32_t));
	s->slots = calloc((size_t)MAXFR * P, sizeof(*s->slots));
	assert_non_null(s->pubset);
	assert_non_null(s->buf);
	assert_non_null(s->want);
	assert_non_null(s->slots);
	for (int x = 0; x < NSIDES; x++)
		sd_stats(&s->d[x], &s->st[x]);
}

/* Every client dies, every chunk and user goes: only idle prefix pages
 * may hold frames then, in both. */
static void sim_finish(struct sim *s)
{
	int rc[NSIDES];
	uint32_t skipped;

	for (uint32_t o = 1; o <= NOWNERS; o++) {
		s->step++;
		step_begin(s, "final release_owner");
		owner_dies(s, o);
		check_step(s);
	}
	s->step++;
	step_begin(s, "final chunk_clear");
	for (int x = 0; x < NSIDES; x++)
		rc[x] = SHARE_CALL(s, x, share_chunk_clear(eng_, 0));
	EXPECT(s, rc[SA] == rc[SB], "chunk_clear = %d / %d", rc[SA], rc[SB]);
	for (int c = 0; c < NCONTENT; c++)
		if (s->reg[c] >= 0)
			chunk_unregister(s, s->reg[c]);
	check_step(s);
	s->step++;
	step_begin(s, "final evict_all(all)");
	for (int x = 0; x < NSIDES; x++) {
		rc[x] = sd_evict_all(&s->d[x], KVP_SEL_ALL, &skipped);
		EXPECT(s, rc[x] >= 0 && skipped == 0, "%s: evict_all = %d, skipped %u",
		       side_name[x], rc[x], skipped);
		for (int u = 0; u < NUSERS; u++)
			s->must_vanish[x][u] = s->info[x][u].exists;
	}
	check_step(s);
	for (int x = 0; x < NSIDES; x++) {
		const struct kvp_stats *a = &s->st[x];

		EXPECT(s, !a->users && !a->leases && !a->seqs && !a->chunks &&
		       !a->chunk_pages && !a->tier[KVP_TIER_HOST].frames_used &&
		       a->tier[KVP_TIER_DEVICE].frames_used == a->prefix_idle_pages &&
		       a->prefix_idle_pages == a->prefix_pages, "%s: at the end %" PRIu64
		       " users, %" PRIu64 " leases, %" PRIu64 " seqs, %" PRIu64 " chunks; "
		       "frames used: %" PRIu64 " device (%" PRIu64 " idle prefix pages), %"
		       PRIu64 " host", side_name[x], a->users, a->leases, a->seqs,
		       a->chunks, a->tier[KVP_TIER_DEVICE].frames_used,
		       a->prefix_idle_pages, a->tier[KVP_TIER_HOST].frames_used);
	}
}

static void run_model(const struct model_cfg *cfg)
{
	struct sim *s = g_sim = calloc(1, sizeof(*s));
	const struct outcomes *o;

	assert_non_null(s);
	sim_init(s, cfg);
	for (s->step = 1; s->step <= cfg->steps; s->step++) {
		step_begin(s, "?");
		random_op(s);
		check_step(s);
	}
	s->step = cfg->steps;
	sim_finish(s);
	o = &s->o;
	print_message("%s: %u ops; histories: %" PRIu64 " prepares, %" PRIu64
		      " commits, %" PRIu64 " rollbacks, %" PRIu64 " misuse; errors %"
		      PRIu64 " gap/overlap, %" PRIu64 " busy, %" PRIu64 " too big, %"
		      PRIu64 " no memory (%" PRIu64 " on one side only), %" PRIu64
		      " no host space; %" PRIu64 " offloads, %" PRIu64 " evicts, %" PRIu64
		      " evict_alls, %" PRIu64 " deaths; dropped under pressure %" PRIu64
		      " / %" PRIu64 ", reconciled %" PRIu64 " users, %" PRIu64 " chunks; "
		      "shards retried %" PRIu64 " prepares with every lock\n", cfg->name,
		      cfg->steps, o->prepares, o->commits, o->rollbacks, o->misuse,
		      o->gap_overlap, o->busy, o->big, o->nomem, o->div_nomem, o->nospc,
		      o->offloads, o->evicts, o->evict_alls, o->owner_deaths, o->drops[SA],
		      o->drops[SB], o->reconciled_users, o->reconciled_chunks,
		      s->d[SB].retries);
	print_message("%s: sequences: %" PRIu64 " allocs (%" PRIu64 " with hits), %"
		      PRIu64 " creates (%" PRIu64 " user sources outside shard 0, shards "
		      "%#x), %" PRIu64 " extends, %" PRIu64 " frees, %" PRIu64 " freed "
		      "after diverging; chunks: %" PRIu64 " registers, %" PRIu64
		      " acquires, %" PRIu64 " deletes; %" PRIu64 " lookups (%" PRIu64
		      " hit), %" PRIu64 " composes, %" PRIu64 " infos, %" PRIu64 " lists, %"
		      PRIu64 " sweeps\n", cfg->name, o->seq_allocs, o->seq_hits,
		      o->seq_creates, o->cross_creates, o->create_shards, o->seq_extends,
		      o->seq_frees, o->diverged_seqs, o->registers, o->acquires,
		      o->deletes, o->lookups, o->lookup_hits, o->composes, o->infos,
		      o->lists, o->sweeps);
	/* The run proves little unless the sharded side had to retry with
	 * every lock, lost different victims and ran sequences over users of
	 * every shard. */
	EXPECT(s, s->d[SB].retries && o->nomem && o->drops[SA] && o->drops[SB] &&
	       o->reconciled_users && o->create_shards == (1u << NSHARDS) - 1 &&
	       o->seq_hits && o->lookup_hits && o->registers && o->acquires &&
	       o->gap_overlap && o->busy, "the random mix missed a path (see the "
	       "counts above)");
	EXPECT(s, !cfg->host_frames || o->nospc, "offload never ran out of host space");
	sim_free(s);
	g_sim = NULL;
}

static void test_shards_match_one_engine(void **state)
{
	static const struct model_cfg cfg = {
		.name = "24 device + 16 host pages", .seed = 0x5a4d0001ull,
		.steps = 30000, .device_frames = 24, .host_frames = 16, .hmax = 40,
	};

	(void)state;
	run_model(&cfg);
}

static void test_shards_match_one_engine_tight(void **state)
{
	static const struct model_cfg cfg = {
		.name = "12 device + 8 host pages", .seed = 0x5a4d0002ull,
		.steps = 30000, .device_frames = 12, .host_frames = 8, .hmax = 32,
	};

	(void)state;
	run_model(&cfg);
}

static void test_shards_match_one_engine_no_host(void **state)
{
	static const struct model_cfg cfg = {
		.name = "16 device pages, no host tier", .seed = 0x5a4d0003ull,
		.steps = 30000, .device_frames = 16, .host_frames = 0, .hmax = 40,
	};

	(void)state;
	run_model(&cfg);
}

static void test_shards_match_one_engine_trimmed(void **state)
{
	static const struct model_cfg cfg = {
		.name = "32 device + 16 host pages, max 24 tokens a user",
		.seed = 0x5a4d0004ull, .steps = 30000, .device_frames = 32,
		.host_frames = 16, .max_tokens = 24, .hmax = 40,
	};

	(void)state;
	run_model(&cfg);
}

/* The first configuration again, on other seeds. */
static void test_shards_match_one_engine_more_seeds(void **state)
{
	static const uint64_t seeds[] = { 0x5a4d0011ull, 0x5a4d0012ull, 0x5a4d0013ull,
					  0x5a4d0014ull };

	(void)state;
	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		struct model_cfg cfg = {
			.name = "24 device + 16 host pages, another seed", .seed = seeds[i],
			.steps = 12000, .device_frames = 24, .host_frames = 16, .hmax = 40,
		};

		run_model(&cfg);
	}
}

/* ------------------------------------------------------------ global mode, directed */

/* The first n user ids of shard `want`. */
static void users_of_shard(struct shard_set *set, uint32_t want, uint64_t *out, int n)
{
	for (uint64_t k = 1; n; k++)
		if (shard_of_user(set, k) == want) {
			*out++ = k;
			n--;
		}
}

static void fill_words(const struct kvp_layout *l, uint64_t user, uint32_t first,
		       uint32_t n, uint32_t *out)
{
	uint32_t words = (uint32_t)(l->token_bytes / 4);

	for (uint32_t t = 0; t < n; t++)
		for (uint32_t w = 0; w < words; w++)
			out[(size_t)t * words + w] =
				(uint32_t)mix64(mix64(user) + (first + t) * 131ull + w) & 0x3fffffffu;
}

/* prepare n tokens from 0 (the daemon's way), write, commit; release unless
 * keep. Returns the lease id. */
static uint64_t put_user(struct side *d, uint64_t user, uint32_t n, bool keep)
{
	const struct kvp_layout *l = engine_layout(d->set ? d->set->v[0].eng : d->eng);
	struct kvp_slot slots[64];
	uint32_t buf[64 * 32];
	struct errbuf e = { .msg = "" };
	struct tlease t;
	int rc = sd_prepare(d, user, 0, n, 1, &t, &e);

	if (rc)
		fail_msg("prepare(user %" PRIu64 ", %u) = %d: %s", user, n, rc, e.msg);
	assert_true(n <= 64 && l->token_bytes / 4 <= 32);
	assert_int_equal(sd_slots(d, t.L.id, 0, n, slots, &e), 0);
	fill_words(l, user, 0, n, buf);
	kvp_append_cpu(l, d->base, slots, n, buf);
	assert_int_equal(sd_commit(d, t.L.id, n, &e), 0);
	if (!keep)
		assert_int_equal(sd_release(d, t.L.id, &e), 0);
	return t.L.id;
}

static void expect_user(struct side *d, uint64_t user, uint32_t n)
{
	const struct kvp_layout *l = engine_layout(d->set ? d->set->v[0].eng : d->eng);
	uint32_t got[64 * 32], want[64 * 32];
	struct errbuf e = { .msg = "" };
	int rc = sd_read(d, user, 0, n, got, &e);

	if (rc)
		fail_msg("read(user %" PRIu64 ", %u) = %d: %s", user, n, rc, e.msg);
	fill_words(l, user, 0, n, want);
	assert_memory_equal(got, want, (size_t)n * l->token_bytes);
}

static void expect_checked(struct side d[NSIDES])
{
	struct errbuf e = { .msg = "" };

	for (int x = 0; x < NSIDES; x++)
		if (sd_check(&d[x], &e))
			fail_msg("%s: %s", side_name[x], e.msg);
}

static struct engine_user_info info_at(struct side *d, uint64_t user)
{
	struct engine_user_info in;

	sd_info(d, user, &in);
	return in;
}

/* Field by field: a struct returned by value need not keep its padding
 * bytes (a Release build's copies leave garbage there), so memcmp lies. */
static void assert_same_info(const struct engine_user_info *a,
			     const struct engine_user_info *b)
{
	assert_int_equal(a->start, b->start);
	assert_int_equal(a->len, b->len);
	assert_int_equal(a->pages, b->pages);
	assert_int_equal(a->pages_device, b->pages_device);
	assert_int_equal(a->pages_host, b->pages_host);
	assert_int_equal(a->leases, b->leases);
	assert_int_equal(a->pages_disk, b->pages_disk);
	assert_int_equal(a->tokens_disk, b->tokens_disk);
	assert_int_equal(a->exists, b->exists);
}

/*
 * One shard's users fill the device tier; a user of another shard that
 * has no frame and nothing to evict is told -EAGAIN (nothing changed), and
 * with every shard locked gets its pages by evicting the oldest user of
 * the first shard, as the one engine does; reclaim_direct counts it.
 */
static void test_short_shard_prepares_in_global_mode(void **state)
{
	struct side *d = g_sides;
	struct kvp_stats s0, s1;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint64_t a[2], c;
	struct tlease t;
	int rc;

	(void)state;
	sides_create(d, 8, 0, 0, 1);
	struct shard_set *set = d[SB].set;

	users_of_shard(set, 1, a, 2);
	users_of_shard(set, 2, &c, 1);
	for (int x = 0; x < NSIDES; x++) {
		put_user(&d[x], a[0], 16, false);
		put_user(&d[x], a[1], 16, false);
	}
	shard_set_stats(set, &s0);
	assert_int_equal(s0.tier[KVP_TIER_DEVICE].frames_free, 0);

	rc = engine_prepare(shard_lock(set, 2), c, 0, 8, 1, &L, &e);
	shard_unlock(set, 2);
	assert_int_equal(rc, -EAGAIN);
	if (!strstr(e.msg, "shard 2"))
		fail_msg("-EAGAIN message \"%s\" does not name shard 2", e.msg);
	shard_set_stats(set, &s1);
	assert_memory_equal(&s0, &s1, sizeof(s0));

	e.msg[0] = '\0';
	rc = engine_prepare(shard_lock_all(set) ? set->v[2].eng : NULL, c, 0, 8, 1, &L, &e);
	if (!rc)
		tl_copy(&t, &L);
	shard_unlock_all(set);
	if (rc)
		fail_msg("prepare with every shard locked = %d: %s", rc, e.msg);
	shard_set_stats(set, &s1);
	assert_int_equal(s1.reclaim_direct, s0.reclaim_direct + 1);
	assert_int_equal(s1.evicted_users, s0.evicted_users + 1);
	assert_int_equal(shard_of_lease(set, t.L.id), 2);

	/* The one engine serves it the same way. */
	rc = sd_prepare(&d[SA], c, 0, 8, 1, &t, &e);
	if (rc)
		fail_msg("one engine: prepare = %d: %s", rc, e.msg);
	for (int x = 0; x < NSIDES; x++) {
		assert_false(info_at(&d[x], a[0]).exists); /* the oldest went */
		assert_true(info_at(&d[x], a[1]).exists);
		expect_user(&d[x], a[1], 16);
		assert_int_equal(info_at(&d[x], c).leases, 1);
	}
	expect_checked(d);
}

/*
 * Everything pinned by leases in two shards: a prepare in a third fails
 * with -EAGAIN, then -ENOMEM with every shard locked, on both sides, and
 * nothing changes; released, the frames serve it.
 */
static void test_all_pinned_prepare_fails_changing_nothing(void **state)
{
	struct side *d = g_sides;
	struct kvp_stats before[NSIDES], after;
	struct engine_user_info ia[NSIDES], ib[NSIDES];
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint64_t a, b, c, a2[2], la[NSIDES];
	struct tlease t;
	int rc;

	(void)state;
	sides_create(d, 8, 4, 0, 2);
	struct shard_set *set = d[SB].set;

	users_of_shard(set, 1, a2, 2);
	a = a2[0];
	users_of_shard(set, 3, &b, 1);
	users_of_shard(set, 2, &c, 1);
	for (int x = 0; x < NSIDES; x++) {
		la[x] = put_user(&d[x], a, 16, true);
		put_user(&d[x], b, 16, true);
		sd_stats(&d[x], &before[x]);
		ia[x] = info_at(&d[x], a);
		ib[x] = info_at(&d[x], b);
	}
	assert_int_equal(before[SB].tier[KVP_TIER_DEVICE].frames_free, 0);

	rc = engine_prepare(shard_lock(set, 2), c, 0, 1, 1, &L, &e);
	shard_unlock(set, 2);
	assert_int_equal(rc, -EAGAIN);
	rc = engine_prepare(shard_lock_all(set) ? set->v[2].eng : NULL, c, 0, 1, 1, &L, &e);
	shard_unlock_all(set);
	assert_int_equal(rc, -ENOMEM);
	if (!strstr(e.msg, "device tier out of memory"))
		fail_msg("-ENOMEM message \"%s\"", e.msg);
	for (int x = 0; x < NSIDES; x++) {
		/* The daemon's way, and a user of a pinned user's shard. */
		assert_int_equal(sd_prepare(&d[x], c, 0, 1, 1, &t, &e), -ENOMEM);
		assert_int_equal(sd_prepare(&d[x], a2[1], 0, 4, 1, &t, &e), -ENOMEM);
		sd_stats(&d[x], &after);
		assert_memory_equal(&before[x], &after, sizeof(after));
		assert_false(info_at(&d[x], c).exists);
		assert_false(info_at(&d[x], a2[1]).exists);
		struct engine_user_info na = info_at(&d[x], a), nb = info_at(&d[x], b);
		assert_same_info(&na, &ia[x]);
		assert_same_info(&nb, &ib[x]);
		expect_user(&d[x], a, 16);
		expect_user(&d[x], b, 16);
	}
	expect_checked(d);

	/* a let go: c's page comes from demoting it, a's tokens kept. */
	for (int x = 0; x < NSIDES; x++) {
		assert_int_equal(sd_release(&d[x], la[x], &e), 0);
		rc = sd_prepare(&d[x], c, 0, 1, 1, &t, &e);
		if (rc)
			fail_msg("%s: prepare after the release = %d: %s", side_name[x], rc,
				 e.msg);
		assert_int_equal(info_at(&d[x], a).pages_device, 0);
		expect_user(&d[x], a, 16);
		expect_user(&d[x], b, 16);
	}
	assert_true(d[SB].retries >= 3);
	expect_checked(d);
}

/* Write tokens [first, first+n) of a lease: fill_words(key) of positions
 * pos0 + first ... */
static void write_tokens(struct side *d, uint64_t lease, uint32_t first, uint32_t n,
			 uint64_t key, uint32_t pos0)
{
	const struct kvp_layout *l = engine_layout(d->set ? d->set->v[0].eng : d->eng);
	struct kvp_slot slots[16];
	uint32_t buf[16 * 32];
	struct errbuf e = { .msg = "" };

	assert_true(n <= 16 && l->token_bytes / 4 <= 32);
	if (sd_slots(d, lease, first, n, slots, &e))
		fail_msg("slots of %#" PRIx64 ": %s", lease, e.msg);
	fill_words(l, key, pos0 + first, n, buf);
	kvp_append_cpu(l, d->base, slots, n, buf);
}

/*
 * Sequence 2 is made over sequence 1 while 1's extend lease is filling the
 * page 2 ends in (one committed token). Sequence 1 commits: the page is
 * full and published; 1 goes. The page is the prefix cache's now, so when
 * sequence 2 extends, its partial last page must be copied before it is
 * written: else 2's tokens land in the cached page and every later hit on
 * those tokens reads them. On both sides.
 */
static void test_extend_copies_a_published_partial_page(void **state)
{
	static const uint32_t toks[8] = { 11, 12, 13, 14, 15, 16, 17, 1 };
	const struct kvp_seq_src src = { .kind = KVP_SRC_SEQ, .id = 1 };
	struct side *d = g_sides;

	(void)state;
	sides_create(d, 16, 0, 0, 3);
	const struct kvp_layout *l = engine_layout(d[SA].eng);
	uint32_t got[4 * 32], want[4 * 32];
	struct kvp_slot slots[4];

	for (int x = 0; x < NSIDES; x++) {
		struct share_prefix_hit h;
		struct tlease w, t;
		struct errbuf e = { .msg = "" };
		uint32_t page;
		int rc;

		rc = share_seq_alloc(lock_all(&d[x]), 1, toks, 1, 1, &t.L, &e);
		if (!rc)
			tl_copy(&t, &t.L);
		unlock(&d[x]);
		assert_int_equal(rc, 0);
		write_tokens(&d[x], t.L.id, 0, 1, 1000, 0);
		assert_int_equal(sd_commit(&d[x], t.L.id, 1, &e), 0);
		assert_int_equal(sd_release(&d[x], t.L.id, &e), 0);

		rc = share_seq_extend(lock_all(&d[x]), 1, 6, toks + 1, 1, &w.L, &e);
		if (!rc)
			tl_copy(&w, &w.L);
		unlock(&d[x]);
		assert_int_equal(rc, 0);
		page = w.frames[0];
		rc = share_seq_create(lock_all(&d[x]), 2, &src, 1, 0, 1, &t.L, &e);
		if (!rc)
			tl_copy(&t, &t.L);
		unlock(&d[x]);
		assert_int_equal(rc, 0);
		assert_int_equal(t.frames[0], page); /* shared, not copied */

		write_tokens(&d[x], w.L.id, 0, 6, 1000, 1);
		assert_int_equal(sd_commit(&d[x], w.L.id, 6, &e), 0);
		assert_int_equal(sd_release(&d[x], w.L.id, &e), 0);
		rc = share_seq_free(lock_all(&d[x]), 1, 1, &e);
		share_prefix_lookup(d[x].set ? d[x].set->v[0].eng : d[x].eng, toks, 5, &h);
		unlock(&d[x]);
		assert_int_equal(rc, 0);
		assert_int_equal(h.npages, 1); /* the page is the cache's */
		assert_int_equal(h.frames[0], page);

		rc = share_seq_extend(lock_all(&d[x]), 2, 3, NULL, 1, &t.L, &e);
		if (!rc)
			tl_copy(&t, &t.L);
		unlock(&d[x]);
		assert_int_equal(rc, 0);
		if (t.frames[0] == page)
			fail_msg("%s: sequence 2's extend writes into frame %u, the prefix "
				 "cache's page of tokens 11 12 13 14 (not copied)",
				 side_name[x], page);
		write_tokens(&d[x], t.L.id, 0, 3, 2000, 1);
		assert_int_equal(sd_commit(&d[x], t.L.id, 3, &e), 0);
		assert_int_equal(sd_release(&d[x], t.L.id, &e), 0);

		/* The cached page still holds sequence 1's tokens. */
		for (uint32_t i = 0; i < 4; i++)
			slots[i] = (struct kvp_slot){ page, i };
		kvp_read_cpu(l, d[x].base, slots, 4, got);
		fill_words(l, 1000, 0, 4, want);
		assert_memory_equal(got, want, 4 * l->token_bytes);
	}
	expect_checked(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_short_shard_prepares_in_global_mode, teardown),
		cmocka_unit_test_teardown(test_all_pinned_prepare_fails_changing_nothing, teardown),
		cmocka_unit_test_teardown(test_extend_copies_a_published_partial_page, teardown),
		cmocka_unit_test_teardown(test_shards_match_one_engine, teardown),
		cmocka_unit_test_teardown(test_shards_match_one_engine_tight, teardown),
		cmocka_unit_test_teardown(test_shards_match_one_engine_no_host, teardown),
		cmocka_unit_test_teardown(test_shards_match_one_engine_trimmed, teardown),
		cmocka_unit_test_teardown(test_shards_match_one_engine_more_seeds, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
