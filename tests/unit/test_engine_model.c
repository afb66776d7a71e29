/* SPDX-License-Identifier: MIT */
/*
 * test_engine_model.c - 100,000 random engine operations per run, each
 * checked against a reference model the moment it returns.
 *
 * What it proves: under any interleaving of prepare, append, commit,
 * release, offload, evict, evict_all, offload_all and release_owner (a dead
 * client) on 64 users competing for a small pool,
 *  1. every history the engine keeps holds exactly what the model says:
 *     start, len (head trimming included) and every byte of every committed
 *     token, read through engine_read_tokens() and through a fresh lease's
 *     page table straight from the device tier;
 *  2. every error is the right one (gap / overlap with the seed's message and
 *     its A..B, -EBUSY, -E2BIG, -ENOMEM, -ENOSPC, -ENOENT, -EALREADY) and
 *     leaves the engine exactly as it was, counters included;
 *  3. a history disappears only when the operation may evict, never while a
 *     lease pins it, and victims leave in LRU order, no more than needed;
 *  4. frames, gauges and counters agree with the model, free + used == total
 *     in both tiers, and engine_check() passes after every operation;
 *  5. at the end, with every lease released and everything evicted, no
 *     frame is in use.
 *
 * How the model works: a token's bytes are a pure function of (user,
 * generation, position, element), so per user the model keeps only start,
 * len, a generation (bumped when the history is dropped, so a re-created
 * history has different bytes) and its open leases; per lease the reserved
 * range, the page table it returned, how many slots were written and whether
 * it committed. The engine decides on its own whom to evict; the model
 * learns of a drop from engine_info() (exists == false), checks that the
 * operation was allowed to drop that user, and checks evicted_users against
 * the drops it saw. LRU order is checked as "victims are the oldest": the
 * device LRU is ordered by when a user was last unpinned, the host LRU by
 * when it became host-only (ties, several in one step, are unordered).
 *
 * The async configuration runs the same on fake_async_backend, whose onloads
 * land only when the test says (a random prefix of the fences, now and
 * then): a lease that comes back with a fence is used as a client would
 * (its page table read, its slots written) only after the test waited for
 * the fence, but released, committed or lost with its owner at any time;
 * the fake must never see a frame reused or read under a copy in flight,
 * and new pages are never frames a copy still writes.
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
#include "fake_async_backend.h"

#define NUSERS 64
#define NHOT 8             /* users 0..NHOT-1 are picked most: they grow long */
#define NOWNERS 4          /* clients owning leases, for release_owner */
#define MAX_OPEN 8         /* leases the test holds at once */
#define MAX_NEW 12         /* n_new is 0..MAX_NEW */
#define MAX_DEV_FRAMES 64
#define NSTALE 8           /* released lease ids kept to try again */
#define SWEEP_EVERY 100    /* read back every history this often */

struct model_cfg {
	const char *name;
	uint64_t seed;
	uint32_t steps;
	uint32_t device_frames;
	uint32_t host_frames;
	uint64_t max_tokens;   /* 0: unlimited */
	bool expect_too_big;   /* a hot history outgrows the device tier */
	bool async;            /* onloads land when the test says */
};

struct mlease {
	uint64_t id;
	int user;
	uint32_t owner;
	uint64_t pos;          /* position of the first new token */
	uint64_t len0;         /* committed tokens when prepared */
	uint32_t n_new;
	uint32_t written;      /* new slots appended so far */
	bool committed;
	uint64_t fence;        /* onload not yet waited for: page table unread */
	uint32_t npages;
	uint32_t frames[MAX_DEV_FRAMES];
};

struct muser {
	uint64_t key;
	uint64_t start, len;
	uint32_t gen;
	uint32_t leases;
	uint64_t writer;       /* id of the uncommitted write lease, 0: none */
	uint64_t unpinned_at;  /* device LRU order */
	uint64_t host_since;   /* host LRU order */
};

/* Expected change of a counter in one step; UNKNOWN: not checked. */
#define UNKNOWN UINT64_MAX
struct deltas {
	uint64_t prepares, commits, releases, hit_tokens, committed_tokens,
		 onloaded_pages, offloaded_pages, trimmed_pages;
};

struct outcomes {
	uint64_t prep_ok, gap, overlap, busy, nomem, big, onloads, read_leases,
		 commits, partial_commits, rollbacks, releases, trims,
		 owner_releases, drops_pressure, drops_explicit, demotions,
		 offload_ok, offload_nospc, evicts, evict_alls, offload_alls,
		 misuse, sweeps, late_leases, early_ends,
		 before_head; /* of overlap: the input starts before a trimmed head */
};

struct sim {
	const struct model_cfg *cfg;
	struct engine *eng;
	struct fake_async fake;
	const struct kvp_layout *l;
	uint32_t P;
	uint32_t words;        /* 32-bit words per token */
	uint64_t rng;
	uint64_t step;
	char op[320];
	struct muser u[NUSERS];
	struct mlease open[MAX_OPEN];
	uint32_t nopen;
	uint64_t stale[NSTALE];
	uint32_t nstale;
	/* The engine as the previous step left it. */
	struct engine_user_info info[NUSERS];
	struct kvp_stats st;
	/* What this step may do and must show. */
	int target;
	bool nochange;
	bool drop_dev_ok, drop_host_ok; /* unpinned device / host-only users may go */
	bool must_vanish[NUSERS], touched[NUSERS];
	bool touch_all;
	uint32_t dev_need;     /* prepare: device frames it had to find, 0: none */
	uint32_t host_need;    /* evict device: host frames it had to find, 0: none */
	struct deltas d;
	struct outcomes o;
	uint32_t *want, *got;
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

/* splitmix64: deterministic for a seed, on every platform. */
static uint64_t rng_next(struct sim *s)
{
	return mix64(s->rng += 0x9e3779b97f4a7c15ull);
}

static uint32_t rnd(struct sim *s, uint32_t n)
{
	return (uint32_t)(rng_next(s) % n);
}

static bool chance(struct sim *s, uint32_t percent)
{
	return rnd(s, 100) < percent;
}

/* Skewed like real traffic: a few hot users grow long histories (trimmed,
 * too big, pinning the pool), the cold ones churn through the LRU. */
static int pick_user(struct sim *s)
{
	return (int)(chance(s, 55) ? rnd(s, NHOT) : rnd(s, NUSERS));
}

/* ------------------------------------------------------------ token bytes */

/* Token bytes as a function of (user, generation, position). Words stay
 * below 2^30 so that, read as fp32, none is a NaN a copy might rewrite. */
static void token_words(const struct sim *s, int u, uint64_t pos, uint32_t *out)
{
	uint64_t base = mix64(mix64(s->u[u].key + 0x51ed27ull * s->u[u].gen) ^ pos);

	for (uint32_t w = 0; w < s->words; w++)
		out[w] = (uint32_t)mix64(base + w) & 0x3fffffffu;
}

static void expect_tokens(struct sim *s, int u, uint64_t pos, uint32_t n,
			  const uint32_t *got, const char *how)
{
	for (uint32_t t = 0; t < n; t++) {
		const uint32_t *g = got + (size_t)t * s->words;

		token_words(s, u, pos + t, s->want);
		for (uint32_t w = 0; w < s->words; w++)
			EXPECT(s, g[w] == s->want[w], "user %d (gen %" PRIu32 ") token %"
			       PRIu64 " word %" PRIu32 " read %s: got %#" PRIx32
			       ", want %#" PRIx32 " (history [%" PRIu64 ", %" PRIu64 "))",
			       u, s->u[u].gen, pos + t, w, how, g[w], s->want[w],
			       s->u[u].start, s->u[u].start + s->u[u].len);
	}
}

static void read_and_expect(struct sim *s, int u, uint64_t pos, uint32_t n)
{
	struct errbuf e = { .msg = "" };
	int rc = engine_read_tokens(s->eng, s->u[u].key, pos, n, s->got, &e);

	EXPECT(s, rc == 0, "engine_read_tokens(user %d, %" PRIu64 ", %" PRIu32
	       ") = %d: %s", u, pos, n, rc, e.msg);
	expect_tokens(s, u, pos, n, s->got, "by engine_read_tokens");
}

/* Read the user's whole history back, and now and then a random part. */
/* An open lease of u whose onload the test has not waited for. */
static bool in_flight(struct sim *s, int u)
{
	for (uint32_t i = 0; i < s->nopen; i++)
		if (s->open[i].user == u && s->open[i].fence)
			return true;
	return false;
}

static void check_history_bytes(struct sim *s, int u)
{
	const struct muser *m = &s->u[u];
	uint32_t skip;

	if (!m->len)
		return;
	/* Reading waits for the copy: mostly leave it in flight. */
	if (s->cfg->async && in_flight(s, u) && chance(s, 90))
		return;
	read_and_expect(s, u, m->start, (uint32_t)m->len);
	if (chance(s, 80))
		return;
	skip = rnd(s, (uint32_t)m->len);
	read_and_expect(s, u, m->start + skip, 1 + rnd(s, (uint32_t)m->len - skip));
}

/* ------------------------------------------------------------ model helpers */

static uint32_t pages_for(const struct sim *s, uint64_t tokens)
{
	return (uint32_t)((tokens + s->P - 1) / s->P);
}

static struct mlease *lease_find(struct sim *s, uint64_t id)
{
	for (uint32_t i = 0; i < s->nopen; i++)
		if (s->open[i].id == id)
			return &s->open[i];
	return NULL;
}

static struct mlease *writer_of(struct sim *s, int u)
{
	return s->u[u].writer ? lease_find(s, s->u[u].writer) : NULL;
}

/* Device pages held for a pending write beyond the committed ones. */
static uint32_t reserved_pages(struct sim *s, int u)
{
	struct mlease *w = writer_of(s, u);

	return w ? pages_for(s, s->u[u].len + w->n_new) - pages_for(s, s->u[u].len) : 0;
}

/* Device frames a user's leases keep out of eviction's reach. */
static uint32_t pinned_frames(struct sim *s, int u)
{
	if (!s->u[u].leases)
		return 0;
	return pages_for(s, s->u[u].len) + reserved_pages(s, u);
}

/*
 * Pages an offload of u copies now: device pages without a host copy, all
 * of them. While a write is pending the partly filled last page may be left
 * out (its bytes are about to change) or copied: *lo and *hi bound the count.
 */
static void offload_need(struct sim *s, int u, uint32_t *lo, uint32_t *hi)
{
	const struct engine_user_info *pi = &s->info[u];

	*lo = *hi = 0;
	if (!pi->exists || !pi->pages_device)
		return;
	*lo = *hi = pi->pages - pi->pages_host;
	if (writer_of(s, u) && s->u[u].len % s->P && *hi)
		*lo = *hi - 1;
}

static bool host_only(const struct engine_user_info *pi)
{
	return pi->exists && pi->pages && !pi->pages_device;
}

static void stale_push(struct sim *s, uint64_t id)
{
	if (s->nstale < NSTALE)
		s->stale[s->nstale++] = id;
	else
		s->stale[rnd(s, NSTALE)] = id;
}

/* The model's side of a release: roll back, unpin, trim the head. */
static void model_release(struct sim *s, uint32_t i)
{
	struct mlease *L = &s->open[i];
	struct muser *m = &s->u[L->user];

	if (!L->committed && L->n_new) {
		m->writer = 0;
		s->o.rollbacks++;
	}
	m->leases--;
	if (!m->leases) {
		uint64_t max = s->cfg->max_tokens;

		if (max && m->len > max) {
			uint32_t k = pages_for(s, m->len - max);

			m->start += (uint64_t)k * s->P;
			m->len -= (uint64_t)k * s->P;
			s->d.trimmed_pages += k;
			s->o.trims++;
		}
		m->unpinned_at = s->step;
	}
	s->touched[L->user] = true;
	stale_push(s, L->id);
	s->open[i] = s->open[--s->nopen];
}

/* ------------------------------------------------------------ the check */

static bool info_equal(const struct engine_user_info *a,
		       const struct engine_user_info *b)
{
	return a->exists == b->exists && a->start == b->start && a->len == b->len &&
	       a->pages == b->pages && a->pages_device == b->pages_device &&
	       a->pages_host == b->pages_host && a->leases == b->leases;
}

/* Every counter of struct kvp_stats; none may go back. */
#define KVP_COUNTERS(X)                                                   \
	X(prepares) X(commits) X(releases) X(hit_tokens)                  \
	X(committed_tokens) X(evicted_users) X(evicted_pages)             \
	X(demoted_users) X(demoted_pages) X(offloaded_pages)              \
	X(onloaded_pages) X(trimmed_pages) X(bytes_d2h) X(bytes_h2d)

#define CHECK_MONOTONIC(field)                                            \
	EXPECT(s, st->field >= s->st.field, #field " went back from %"    \
	       PRIu64 " to %" PRIu64, s->st.field, st->field);

#define CHECK_DELTA(field)                                                \
	EXPECT(s, s->d.field == UNKNOWN ||                                \
		  st->field - s->st.field == s->d.field,                  \
	       #field " grew by %" PRIu64 ", model says %" PRIu64,       \
	       st->field - s->st.field, s->d.field)

static void check_counters(struct sim *s, const struct kvp_stats *st)
{
	KVP_COUNTERS(CHECK_MONOTONIC)
	CHECK_DELTA(prepares);
	CHECK_DELTA(commits);
	CHECK_DELTA(releases);
	CHECK_DELTA(hit_tokens);
	CHECK_DELTA(committed_tokens);
	CHECK_DELTA(onloaded_pages);
	CHECK_DELTA(offloaded_pages);
	CHECK_DELTA(trimmed_pages);
}

/* Oldest victim and survivor of one LRU list in one step. */
struct lru_tally {
	bool any;
	uint64_t newest_victim;  /* latest time among victims */
	uint64_t oldest_kept;    /* earliest time among survivors */
	uint64_t freed;          /* frames the victims held */
	uint64_t last;           /* most frames a victim of newest_victim held */
};

static void tally(struct lru_tally *t, bool victim, uint64_t when, uint64_t frames)
{
	if (!victim) {
		if (when < t->oldest_kept)
			t->oldest_kept = when;
		return;
	}
	if (!t->any || when > t->newest_victim) {
		t->newest_victim = when;
		t->last = frames;
	} else if (when == t->newest_victim && frames > t->last) {
		t->last = frames;
	}
	t->any = true;
	t->freed += frames;
}

/*
 * Victims leave in LRU order: every user of a list that lost its place this
 * step is at least as old as every user that kept it; and an eviction that
 * had to find n frames stopped as soon as it had them.
 */
static void check_lru_order(struct sim *s, const struct engine_user_info *now)
{
	struct lru_tally dev = { .oldest_kept = UINT64_MAX };
	struct lru_tally host = { .oldest_kept = UINT64_MAX };

	for (int u = 0; u < NUSERS; u++) {
		const struct engine_user_info *pi = &s->info[u];

		if (u == s->target || s->must_vanish[u] || !pi->exists || pi->leases)
			continue;
		if (pi->pages_device)
			tally(&dev, !now[u].exists || !now[u].pages_device,
			      s->u[u].unpinned_at, pi->pages_device);
		else if (pi->pages)
			tally(&host, !now[u].exists, s->u[u].host_since, pi->pages_host);
	}
	EXPECT(s, !dev.any || dev.newest_victim <= dev.oldest_kept, "device LRU "
	       "order: a user unpinned at step %" PRIu64 " was evicted while one "
	       "unpinned at step %" PRIu64 " stayed", dev.newest_victim,
	       dev.oldest_kept);
	EXPECT(s, !host.any || host.newest_victim <= host.oldest_kept, "host LRU "
	       "order: a user host-only since step %" PRIu64 " was dropped while "
	       "one host-only since step %" PRIu64 " stayed", host.newest_victim,
	       host.oldest_kept);
	EXPECT(s, !dev.any || s->dev_need || s->drop_dev_ok, "%" PRIu64 " device "
	       "frames of other users went in an op that may not evict them",
	       dev.freed);
	if (s->dev_need) {
		uint64_t free0 = s->st.tier[KVP_TIER_DEVICE].frames_free;

		EXPECT(s, dev.any && free0 + dev.freed >= s->dev_need, "prepare "
		       "needed %" PRIu32 " device frames, had %" PRIu64 " free and "
		       "evicted users holding %" PRIu64, s->dev_need, free0, dev.freed);
		EXPECT(s, free0 + dev.freed - dev.last < s->dev_need, "prepare "
		       "evicted more than it needed: %" PRIu64 " free + %" PRIu64
		       " freed, %" PRIu32 " needed", free0, dev.freed, s->dev_need);
	}
	if (s->host_need && host.any) {
		uint64_t free0 = s->st.tier[KVP_TIER_HOST].frames_free;

		EXPECT(s, free0 + host.freed >= s->host_need &&
		       free0 + host.freed - host.last < s->host_need,
		       "demotion dropped %" PRIu64 " host frames of others with %"
		       PRIu64 " free for %" PRIu32 " needed", host.freed, free0,
		       s->host_need);
	}
}

static void check_step(struct sim *s)
{
	const struct kvp_layout *l = s->l;
	struct engine_user_info now[NUSERS];
	uint64_t drops = 0, dropped_pages = 0, users = 0, dev_used = 0, host_used = 0;
	uint64_t demoted = 0, lost_from_device = 0;
	uint32_t totals[KVP_TIERS] = { s->cfg->device_frames, s->cfg->host_frames };
	struct kvp_stats st;
	struct errbuf e = { .msg = "" };
	int rc;

	rc = engine_check(s->eng, &e);
	EXPECT(s, rc == 0, "engine_check = %d: %s", rc, e.msg);
	engine_stats(s->eng, &st);
	for (int t = 0; t < KVP_TIERS; t++) {
		const struct kvp_tier_stats *ts = &st.tier[t];

		EXPECT(s, ts->frames_total == totals[t] &&
		       ts->frames_free + ts->frames_used == ts->frames_total &&
		       ts->bytes_total == ts->frames_total * l->page_bytes,
		       "%s tier: %" PRIu64 " free + %" PRIu64 " used of %" PRIu64,
		       kvp_tier_name(t), ts->frames_free, ts->frames_used,
		       ts->frames_total);
	}

	for (int u = 0; u < NUSERS; u++) {
		struct muser *m = &s->u[u];
		const struct engine_user_info *pi = &s->info[u], *ni = &now[u];
		bool want = m->len || m->leases;

		engine_info(s->eng, m->key, &now[u]);
		if (!ni->exists) {
			if (!want)
				continue;
			EXPECT(s, !m->leases, "user %d vanished while %" PRIu32
			       " lease(s) pin it", u, m->leases);
			EXPECT(s, s->must_vanish[u] ||
			       (pi->pages_device ? s->drop_dev_ok : s->drop_host_ok),
			       "user %d (start %" PRIu64 " len %" PRIu64 ", %" PRIu32
			       " device / %" PRIu32 " host pages) was dropped by an op "
			       "that may not drop it", u, m->start, m->len,
			       pi->pages_device, pi->pages_host);
			drops++;
			dropped_pages += pi->pages;
			lost_from_device += pi->pages_device > 0;
			if (s->must_vanish[u])
				s->o.drops_explicit++;
			else
				s->o.drops_pressure++;
			m->len = 0;
			m->gen++;
			continue;
		}
		EXPECT(s, !s->must_vanish[u], "user %d should be gone but holds start %"
		       PRIu64 " len %" PRIu64, u, ni->start, ni->len);
		EXPECT(s, want, "user %d exists (start %" PRIu64 " len %" PRIu64
		       " leases %" PRIu32 ") but the model holds nothing", u,
		       ni->start, ni->len, ni->leases);
		EXPECT(s, ni->len == m->len && (!m->len || ni->start == m->start),
		       "user %d holds [%" PRIu64 ", +%" PRIu64 "), model [%" PRIu64
		       ", +%" PRIu64 ")", u, ni->start, ni->len, m->start, m->len);
		EXPECT(s, ni->leases == m->leases, "user %d: %" PRIu32 " leases, model %"
		       PRIu32, u, ni->leases, m->leases);
		EXPECT(s, ni->pages == pages_for(s, m->len) &&
		       ni->pages_device <= ni->pages && ni->pages_host <= ni->pages &&
		       ni->pages_device + ni->pages_host >= ni->pages,
		       "user %d: len %" PRIu64 " in %" PRIu32 " pages, %" PRIu32
		       " on device, %" PRIu32 " on host", u, ni->len, ni->pages,
		       ni->pages_device, ni->pages_host);
		EXPECT(s, !m->leases || ni->pages_device == ni->pages,
		       "user %d is leased but %" PRIu32 " of %" PRIu32 " pages are "
		       "off the device", u, ni->pages - ni->pages_device, ni->pages);
		if (pi->exists && pi->pages_device && !pi->leases && !ni->pages_device) {
			demoted++;
			m->host_since = s->step;
		}
		users++;
		dev_used += ni->pages_device + reserved_pages(s, u);
		host_used += ni->pages_host;
	}

	if (s->nochange) {
		for (int u = 0; u < NUSERS; u++)
			EXPECT(s, info_equal(&now[u], &s->info[u]), "a failed op changed "
			       "user %d: start %" PRIu64 "->%" PRIu64 " len %" PRIu64 "->%"
			       PRIu64 " device %" PRIu32 "->%" PRIu32 " host %" PRIu32
			       "->%" PRIu32, u, s->info[u].start, now[u].start,
			       s->info[u].len, now[u].len, s->info[u].pages_device,
			       now[u].pages_device, s->info[u].pages_host,
			       now[u].pages_host);
		/* Except ns_h2d: a failed op may be the first to see an earlier
		 * onload landed, and its copy time is counted then (engine.c,
		 * history_landed). */
		struct kvp_stats st_cmp = st;

		st_cmp.ns_h2d = s->st.ns_h2d;
		EXPECT(s, memcmp(&st_cmp, &s->st, sizeof(st)) == 0,
		       "a failed op changed the stats (device used %" PRIu64 "->%"
		       PRIu64 ", host used %" PRIu64 "->%" PRIu64 ")",
		       s->st.tier[0].frames_used, st.tier[0].frames_used,
		       s->st.tier[1].frames_used, st.tier[1].frames_used);
	}
	EXPECT(s, st.users == users && st.leases == s->nopen, "stats count %"
	       PRIu64 " users and %" PRIu64 " leases, model %" PRIu64 " and %"
	       PRIu32, st.users, st.leases, users, s->nopen);
	EXPECT(s, st.tier[KVP_TIER_DEVICE].frames_used == dev_used &&
	       st.tier[KVP_TIER_HOST].frames_used == host_used,
	       "frames used: device %" PRIu64 " host %" PRIu64 ", but histories "
	       "and reservations hold %" PRIu64 " and %" PRIu64,
	       st.tier[KVP_TIER_DEVICE].frames_used,
	       st.tier[KVP_TIER_HOST].frames_used, dev_used, host_used);
	check_counters(s, &st);
	EXPECT(s, st.evicted_users - s->st.evicted_users == drops,
	       "evicted_users grew by %" PRIu64 ", %" PRIu64 " histories vanished",
	       st.evicted_users - s->st.evicted_users, drops);
	EXPECT(s, st.evicted_pages - s->st.evicted_pages == dropped_pages,
	       "evicted_pages grew by %" PRIu64 ", vanished histories held %" PRIu64,
	       st.evicted_pages - s->st.evicted_pages, dropped_pages);
	EXPECT(s, st.demoted_users - s->st.demoted_users >= demoted &&
	       st.demoted_users - s->st.demoted_users <= demoted + lost_from_device,
	       "demoted_users grew by %" PRIu64 "; %" PRIu64 " users went host-only, "
	       "%" PRIu64 " more left the device by a drop",
	       st.demoted_users - s->st.demoted_users, demoted, lost_from_device);
	s->o.demotions += demoted;
	check_lru_order(s, now);

	for (int u = 0; u < NUSERS; u++)
		if (s->touch_all || s->touched[u] || s->step % SWEEP_EVERY == 0)
			check_history_bytes(s, u);
	EXPECT(s, !s->fake.conflicts, "%" PRIu32 " access(es) clashed with an "
	       "onload in flight; the first: %s", s->fake.conflicts,
	       s->fake.conflict);
	if (s->touch_all || s->step % SWEEP_EVERY == 0)
		s->o.sweeps++;

	memcpy(s->info, now, sizeof(now));
	s->st = st;
}

static void step_begin(struct sim *s, const char *what)
{
	snprintf(s->op, sizeof(s->op), "%s", what);
	s->target = -1;
	s->nochange = false;
	s->drop_dev_ok = s->drop_host_ok = false;
	s->touch_all = false;
	s->dev_need = s->host_need = 0;
	memset(s->must_vanish, 0, sizeof(s->must_vanish));
	memset(s->touched, 0, sizeof(s->touched));
	memset(&s->d, 0, sizeof(s->d));
}

/* A failed op: the error is the only effect. */
static void expect_nochange(struct sim *s)
{
	s->nochange = true;
}

/* ------------------------------------------------------------ prepare */

/* Read the committed tokens through the lease's page table, as a client's
 * attention kernel would, straight from the device tier. */
static void check_lease_view(struct sim *s, const struct mlease *L)
{
	const struct muser *m = &s->u[L->user];

	for (uint32_t t = 0; t < L->len0; t++)
		s->slots[t] = (struct kvp_slot){ L->frames[t / s->P], t % s->P };
	kvp_read_cpu(s->l, engine_tier(s->eng, KVP_TIER_DEVICE)->base, s->slots,
		     (uint32_t)L->len0, s->got);
	expect_tokens(s, L->user, m->start, (uint32_t)L->len0, s->got,
		      "through the lease's page table");
}

static void check_new_lease(struct sim *s, const struct engine_lease *el,
			    struct mlease *L, uint64_t pos)
{
	const struct muser *m = &s->u[L->user];
	const struct engine_user_info *pi = &s->info[L->user];
	uint32_t npages = pages_for(s, m->len + L->n_new);
	uint64_t seen = 0;

	EXPECT(s, el->len == m->len && el->hit_tokens == m->len &&
	       el->n_new == L->n_new, "lease says len %" PRIu64 " hit %" PRIu64
	       " n_new %" PRIu32 ", model len %" PRIu64, el->len, (uint64_t)el->hit_tokens,
	       el->n_new, m->len);
	EXPECT(s, !(m->len || L->n_new) || el->start == (m->len ? m->start : pos),
	       "lease start %" PRIu64 ", model %" PRIu64, el->start,
	       m->len ? m->start : pos);
	EXPECT(s, el->npages == npages, "lease has %" PRIu32 " pages for %" PRIu64
	       " + %" PRIu32 " tokens", el->npages, m->len, L->n_new);
	EXPECT(s, !npages || el->last_page_len == (m->len + L->n_new - 1) % s->P + 1,
	       "last_page_len %" PRIu32 " for %" PRIu64 " tokens", el->last_page_len,
	       m->len + L->n_new);
	EXPECT(s, el->onloaded_pages == (pi->exists ? pi->pages - pi->pages_device : 0),
	       "prepare onloaded %" PRIu32 " pages, %" PRIu32 " were host-only",
	       el->onloaded_pages, pi->pages - pi->pages_device);
	EXPECT(s, !s->cfg->async || !el->onloaded_pages || el->fence,
	       "an onload of %" PRIu32 " pages came back landed", el->onloaded_pages);
	for (uint32_t i = 0; i < npages; i++) {
		uint32_t f = el->frames[i];
		uint64_t pb = s->l->page_bytes;

		EXPECT(s, f < s->cfg->device_frames && !(seen & (1ull << f)),
		       "page %" PRIu32 " of the lease names device frame %" PRIu32
		       " (out of range or twice)", i, f);
		EXPECT(s, i < pages_for(s, m->len) ||
		       !fake_busy(&s->fake, engine_tier(s->eng, KVP_TIER_DEVICE),
				  f * pb, pb), "new page %" PRIu32 " is device frame %"
		       PRIu32 ", which an onload in flight still writes", i, f);
		seen |= 1ull << f;
		L->frames[i] = f;
	}
	L->npages = npages;
	L->fence = el->fence;
	s->o.late_leases += el->fence != 0;
	if (!L->fence)
		check_lease_view(s, L);
}

/* What a client does before it touches the pages: wait for the completion,
 * i.e. the fence; then the page table shows the committed tokens. */
static void lease_ready(struct sim *s, struct mlease *L)
{
	if (!L->fence)
		return;
	engine_fence_wait(s->eng, L->fence);
	L->fence = 0;
	check_lease_view(s, L);
}

/* Land a random prefix of the copies in flight; leases whose fence landed
 * show their bytes at once. */
static void land_some(struct sim *s)
{
	struct fake_async *f = &s->fake;

	if (!s->cfg->async || f->landed == f->issued || chance(s, 60))
		return;
	fake_land(f, chance(s, 50) ? f->issued
				   : f->landed + 1 + rnd(s, (uint32_t)(f->issued - f->landed)));
	for (uint32_t i = 0; i < s->nopen; i++) {
		struct mlease *L = &s->open[i];

		if (L->fence && engine_fence_done(s->eng, L->fence)) {
			L->fence = 0;
			check_lease_view(s, L);
		}
	}
}

static void op_prepare(struct sim *s)
{
	int u = s->nopen && chance(s, 15) ? s->open[rnd(s, s->nopen)].user
					  : pick_user(s);
	struct muser *m = &s->u[u];
	const struct engine_user_info *pi = &s->info[u];
	struct mlease *w = writer_of(s, u);
	uint32_t n_new = rnd(s, MAX_NEW + 1), owner = 1 + rnd(s, NOWNERS);
	uint32_t dev = s->cfg->device_frames, need, held, resv = w ? w->n_new : 0;
	uint64_t end = m->start + m->len, pos = end, others = 0;
	bool gap, overlap, busy, big, nomem;
	struct engine_lease el;
	struct errbuf e = { .msg = "" };
	char msg[192] = "";
	int rc;

	if (!m->len) {
		pos = rng_next(s) & 0xfffff; /* nothing cached: any start goes */
	} else if (chance(s, 10)) {
		if (chance(s, 50))
			pos = end + 1 + rnd(s, 20);
		else if (m->start && chance(s, 30)) /* before the trimmed head */
			pos = m->start - 1 - rnd(s, (uint32_t)(m->start < 8 ? m->start : 8));
		else
			pos = end - 1 - rnd(s, (uint32_t)(m->len < 16 ? m->len : 16));
	}
	for (int v = 0; v < NUSERS; v++)
		if (v != u)
			others += pinned_frames(s, v);
	gap = m->len && pos > end;
	overlap = m->len && pos < end;
	/* engine.h: only a writer waits for a writer; readers never wait. */
	busy = w && n_new;
	need = pages_for(s, m->len + n_new + resv);
	big = pages_for(s, m->len + n_new) > dev;
	nomem = !big && need + others > dev;

	snprintf(s->op, sizeof(s->op), "prepare(user %d, start_pos %" PRIu64
		 ", n_new %" PRIu32 ", owner %" PRIu32 "); model start %" PRIu64
		 " len %" PRIu64 " leases %" PRIu32 " writer %s, %" PRIu64
		 " frames pinned by others", u, pos, n_new, owner, m->start, m->len,
		 m->leases, w ? "yes" : "no", others);
	rc = engine_prepare(s->eng, m->key, pos, n_new, owner, &el, &e);
	if (rc) {
		EXPECT(s, (rc == -EINVAL && (gap || overlap)) ||
		       (rc == -EBUSY && busy) || (rc == -E2BIG && big) ||
		       (rc == -ENOMEM && nomem), "prepare = %d (%s); model: gap %d "
		       "overlap %d busy %d too-big %d no-memory %d", rc, e.msg, gap,
		       overlap, busy, big, nomem);
		/* Seed 002's sentence first, verbatim (then kvpool's context);
		 * tokens before the trimmed head are not cached, so not
		 * "overlapping": such an input gets its own sentence. */
		if (rc == -EINVAL && gap) {
			snprintf(msg, sizeof(msg), "The input sequence has missing tokens "
				 "from %" PRIu64 " to %" PRIu64 " (both inclusive). ",
				 end, pos - 1);
			s->o.gap++;
		} else if (rc == -EINVAL && pos < m->start) {
			snprintf(msg, sizeof(msg), "The input sequence starts at token %"
				 PRIu64 ", before the first cached token %" PRIu64
				 " (tokens before it were trimmed). ", pos, m->start);
			s->o.overlap++;
			s->o.before_head++;
		} else if (rc == -EINVAL) {
			uint64_t last = end - 1;

			if (n_new && pos + n_new - 1 < last)
				last = pos + n_new - 1;
			snprintf(msg, sizeof(msg), "The input sequence has overlapping "
				 "tokens from %" PRIu64 " to %" PRIu64 " (both inclusive). ",
				 pos, last);
			s->o.overlap++;
		}
		EXPECT(s, !strncmp(e.msg, msg, strlen(msg)), "message \"%s\" does not "
		       "start with \"%s\"", e.msg, msg);
		s->o.busy += rc == -EBUSY;
		s->o.nomem += rc == -ENOMEM;
		s->o.big += rc == -E2BIG;
		expect_nochange(s);
		return;
	}
	EXPECT(s, !gap && !overlap && !busy && !big && !nomem, "prepare succeeded "
	       "(lease %#" PRIx64 "); model expected gap %d overlap %d busy %d "
	       "too-big %d no-memory %d", el.id, gap, overlap, busy, big, nomem);
	EXPECT(s, !lease_find(s, el.id), "lease id %#" PRIx64 " is already held",
	       el.id);

	struct mlease *L = &s->open[s->nopen++];
	*L = (struct mlease){ .id = el.id, .user = u, .owner = owner,
			      .pos = m->len ? end : pos, .len0 = m->len,
			      .n_new = n_new };
	check_new_lease(s, &el, L, pos);

	/* Device frames the prepare had to find beyond what u holds. */
	held = pi->pages_device + reserved_pages(s, u);
	if (need > held && s->st.tier[KVP_TIER_DEVICE].frames_free < need - held) {
		s->dev_need = need - held;
		s->drop_dev_ok = s->drop_host_ok = true;
	}
	s->o.onloads += el.onloaded_pages > 0;
	s->o.read_leases += !n_new;
	s->o.prep_ok++;
	m->leases++;
	if (n_new)
		m->writer = el.id;
	s->target = u;
	s->touched[u] = true;
	s->d = (struct deltas){ .prepares = 1, .hit_tokens = L->len0,
				.onloaded_pages = el.onloaded_pages };
}

/* ------------------------------------------------------------ lease ops */

/* Append new tokens [L->written, upto) into the lease's slots, in one or
 * two calls, checking every slot against the page table. */
static void lease_write(struct sim *s, struct mlease *L, uint32_t upto)
{
	if (L->written < upto)
		lease_ready(s, L); /* never write into pages still landing */
	while (L->written < upto) {
		uint32_t n = upto - L->written;
		struct errbuf e = { .msg = "" };
		int rc;

		if (n > 1 && chance(s, 40))
			n = 1 + rnd(s, n - 1);
		rc = engine_lease_slots(s->eng, L->id, L->written, n, s->slots, &e);
		EXPECT(s, rc == 0, "engine_lease_slots(%#" PRIx64 ", %" PRIu32 ", %"
		       PRIu32 ") = %d: %s", L->id, L->written, n, rc, e.msg);
		for (uint32_t i = 0; i < n; i++) {
			uint64_t q = L->len0 + L->written + i;

			EXPECT(s, s->slots[i].frame == L->frames[q / s->P] &&
			       s->slots[i].slot == q % s->P, "slot of new token %" PRIu64
			       " is frame %" PRIu32 " slot %" PRIu32 ", page table says "
			       "frame %" PRIu32 " slot %" PRIu64, q, s->slots[i].frame,
			       s->slots[i].slot, L->frames[q / s->P], q % s->P);
			token_words(s, L->user, L->pos + L->written + i,
				    s->got + (size_t)i * s->words);
		}
		kvp_append_cpu(s->l, engine_tier(s->eng, KVP_TIER_DEVICE)->base,
			       s->slots, n, s->got);
		L->written += n;
	}
}

static void lease_commit(struct sim *s, uint32_t i)
{
	struct mlease *L = &s->open[i];
	struct muser *m = &s->u[L->user];
	uint32_t upto = chance(s, 75) ? L->n_new
				      : L->written + rnd(s, L->n_new - L->written + 1);
	struct errbuf e = { .msg = "" };
	uint32_t n;
	int rc;

	snprintf(s->op, sizeof(s->op), "append to lease %#" PRIx64 " (user %d)",
		 L->id, L->user);
	if (chance(s, 80))
		lease_ready(s, L);
	else if (L->fence)
		s->o.early_ends++; /* a client that did not wait for it */
	lease_write(s, L, upto);
	n = chance(s, 70) ? L->written : rnd(s, L->written + 1);
	snprintf(s->op, sizeof(s->op), "commit(lease %#" PRIx64 " of user %d, n %"
		 PRIu32 " of %" PRIu32 " new, %" PRIu32 " written)", L->id, L->user,
		 n, L->n_new, L->written);
	rc = engine_commit(s->eng, L->id, n, &e);
	EXPECT(s, rc == 0, "commit = %d: %s", rc, e.msg);
	EXPECT(s, m->len == L->len0, "model: user %d grew under a write lease", L->user);
	if (n && !m->len)
		m->start = L->pos;
	m->len += n;
	m->writer = 0;
	L->committed = true;
	s->o.commits++;
	s->o.partial_commits += n < L->n_new;
	s->target = L->user;
	s->touched[L->user] = true;
	s->d.commits = 1;
	s->d.committed_tokens = n;
}

static void lease_release(struct sim *s, uint32_t i)
{
	struct mlease *L = &s->open[i];
	struct errbuf e = { .msg = "" };
	int rc;

	snprintf(s->op, sizeof(s->op), "release(lease %#" PRIx64 " of user %d, %s, "
		 "n_new %" PRIu32 ", %" PRIu32 " written)", L->id, L->user,
		 L->committed ? "committed" : "not committed", L->n_new, L->written);
	s->target = L->user;
	if (chance(s, 70))
		lease_ready(s, L);
	else if (L->fence)
		s->o.early_ends++;
	rc = engine_release(s->eng, L->id, &e);
	EXPECT(s, rc == 0, "release = %d: %s", rc, e.msg);
	model_release(s, i);
	s->o.releases++;
	s->d.releases = 1;
}

/* Calls a client may get wrong; each must fail and change nothing, except a
 * read-only lease's commit of 0, which is allowed. */
static void lease_misuse(struct sim *s, uint32_t i)
{
	struct mlease *L = &s->open[i];
	struct errbuf e = { .msg = "" };
	int rc, want;

	s->o.misuse++;
	if (!L->committed && !L->n_new) {
		snprintf(s->op, sizeof(s->op), "commit(read-only lease %#" PRIx64
			 " of user %d, 0)", L->id, L->user);
		rc = engine_commit(s->eng, L->id, 0, &e);
		EXPECT(s, rc == 0, "commit of 0 on a read-only lease = %d: %s", rc, e.msg);
		L->committed = true;
		s->d.commits = 1;
		return;
	}
	if (L->committed && chance(s, 50)) {
		snprintf(s->op, sizeof(s->op), "commit again (lease %#" PRIx64 ")", L->id);
		rc = engine_commit(s->eng, L->id, 0, &e);
		want = -EALREADY;
	} else if (L->committed) {
		snprintf(s->op, sizeof(s->op), "slots of committed lease %#" PRIx64, L->id);
		rc = engine_lease_slots(s->eng, L->id, 0, 1, s->slots, &e);
		want = -EALREADY;
	} else if (chance(s, 50)) {
		uint32_t n = L->n_new + 1 + rnd(s, 3);

		snprintf(s->op, sizeof(s->op), "commit(lease %#" PRIx64 ", %" PRIu32
			 ") past n_new %" PRIu32, L->id, n, L->n_new);
		rc = engine_commit(s->eng, L->id, n, &e);
		want = -EINVAL;
	} else {
		uint32_t first = rnd(s, L->n_new + 1);

		snprintf(s->op, sizeof(s->op), "slots(lease %#" PRIx64 ", %" PRIu32
			 ", %" PRIu32 ") past n_new %" PRIu32, L->id, first,
			 L->n_new - first + 1, L->n_new);
		rc = engine_lease_slots(s->eng, L->id, first, L->n_new - first + 1,
					s->slots, &e);
		want = -EINVAL;
	}
	EXPECT(s, rc == want, "got %d (%s), want %d", rc, e.msg, want);
	expect_nochange(s);
}

static void op_lease(struct sim *s)
{
	uint32_t i = rnd(s, s->nopen), r = rnd(s, 100);
	struct mlease *L = &s->open[i];

	if (!L->committed && L->n_new) {
		if (r < 60) {
			lease_commit(s, i);
		} else if (r < 72) {
			snprintf(s->op, sizeof(s->op), "append part of lease %#" PRIx64,
				 L->id);
			lease_write(s, L, L->written + rnd(s, L->n_new - L->written + 1));
		} else if (r < 92) {
			lease_release(s, i); /* rolls the reservation back */
		} else {
			lease_misuse(s, i);
		}
	} else if (r < 88) {
		lease_release(s, i);
	} else {
		lease_misuse(s, i);
	}
}

/* A released lease id must not work again (unless the engine reused it for
 * a lease the model holds). */
static void op_stale_lease(struct sim *s)
{
	uint64_t id = s->stale[rnd(s, s->nstale)];
	struct errbuf e = { .msg = "" };
	int rc;

	if (lease_find(s, id))
		return;
	snprintf(s->op, sizeof(s->op), "use released lease %#" PRIx64, id);
	switch (rnd(s, 3)) {
	case 0:
		rc = engine_release(s->eng, id, &e);
		break;
	case 1:
		rc = engine_commit(s->eng, id, 0, &e);
		break;
	default:
		rc = engine_lease_slots(s->eng, id, 0, 1, s->slots, &e);
		break;
	}
	EXPECT(s, rc == -ENOENT, "got %d (%s), want -ENOENT", rc, e.msg);
	s->o.misuse++;
	expect_nochange(s);
}

/* A client died: every lease it owned goes at once, writes rolled back. */
static void op_release_owner(struct sim *s)
{
	uint32_t owner = 1 + rnd(s, NOWNERS), want = 0, n;

	for (uint32_t i = 0; i < s->nopen; i++)
		want += s->open[i].owner == owner;
	snprintf(s->op, sizeof(s->op), "release_owner(%" PRIu32 "), %" PRIu32
		 " leases", owner, want);
	n = engine_release_owner(s->eng, owner);
	EXPECT(s, n == want, "released %" PRIu32 " leases, owner held %" PRIu32, n, want);
	for (uint32_t i = s->nopen; i-- > 0;)
		if (s->open[i].owner == owner) {
			s->o.early_ends += s->open[i].fence != 0;
			model_release(s, i);
		}
	s->o.owner_releases += want;
	s->d.releases = want;
}

/* ------------------------------------------------------------ tiers */

static void op_offload(struct sim *s)
{
	int u = pick_user(s);
	struct muser *m = &s->u[u];
	const struct engine_user_info *pi = &s->info[u];
	uint64_t free_host = s->st.tier[KVP_TIER_HOST].frames_free;
	struct engine_user_info ni;
	struct errbuf e = { .msg = "" };
	uint32_t lo, hi;
	int rc;

	offload_need(s, u, &lo, &hi);
	snprintf(s->op, sizeof(s->op), "offload(user %d): len %" PRIu64 ", %" PRIu32
		 " device / %" PRIu32 " host pages, writer %s, %" PRIu64 " host free",
		 u, m->len, pi->pages_device, pi->pages_host,
		 writer_of(s, u) ? "yes" : "no", free_host);
	rc = engine_offload(s->eng, m->key, &e);
	if (!pi->exists) {
		EXPECT(s, rc == -ENOENT, "offload of an unknown user = %d", rc);
		expect_nochange(s);
		return;
	}
	if (!(pages_for(s, m->len) + reserved_pages(s, u))) {
		/* Only a read-only lease on nothing: no pages, nothing to copy. */
		EXPECT(s, rc == -ENOENT || rc == 0, "offload of a user with no "
		       "pages = %d (%s)", rc, e.msg);
		expect_nochange(s);
		return;
	}
	if (rc == -ENOSPC) {
		EXPECT(s, hi > free_host, "offload of %" PRIu32 "..%" PRIu32 " pages "
		       "with %" PRIu64 " host free = -ENOSPC (%s)", lo, hi, free_host,
		       e.msg);
		s->o.offload_nospc++;
		expect_nochange(s);
		return;
	}
	EXPECT(s, rc >= (int)lo && rc <= (int)hi && (uint64_t)rc <= free_host,
	       "offload = %d (%s), model: %" PRIu32 "..%" PRIu32 " pages, %" PRIu64
	       " host free", rc, e.msg, lo, hi, free_host);
	engine_info(s->eng, m->key, &ni);
	EXPECT(s, ni.pages_device == pi->pages_device &&
	       ni.pages_host == pi->pages_host + (uint32_t)rc, "after offload of %d "
	       "pages: %" PRIu32 " device / %" PRIu32 " host pages", rc,
	       ni.pages_device, ni.pages_host);
	s->o.offload_ok++;
	s->target = u;
	s->touched[u] = true;
	s->d.offloaded_pages = (uint64_t)rc;
}

static void op_offload_all(struct sim *s)
{
	uint64_t free_host = s->st.tier[KVP_TIER_HOST].frames_free, lo = 0, hi = 0;
	struct errbuf e = { .msg = "" };
	int rc;

	for (int u = 0; u < NUSERS; u++) {
		uint32_t a, b;

		offload_need(s, u, &a, &b);
		lo += a;
		hi += b;
	}
	snprintf(s->op, sizeof(s->op), "offload_all: %" PRIu64 "..%" PRIu64
		 " pages to copy, %" PRIu64 " host free", lo, hi, free_host);
	rc = engine_offload_all(s->eng, &e);
	s->o.offload_alls++;
	s->touch_all = true;
	EXPECT(s, rc == -ENOSPC ? hi > free_host :
	       rc >= 0 && (uint64_t)rc >= lo && (uint64_t)rc <= hi && lo <= free_host,
	       "offload_all = %d (%s), model: %" PRIu64 "..%" PRIu64 " pages, %"
	       PRIu64 " host free", rc, e.msg, lo, hi, free_host);
	/* -ENOSPC stops where the host filled: what was copied stays. */
	s->d.offloaded_pages = rc < 0 ? UNKNOWN : (uint64_t)rc;
	for (int u = 0; u < NUSERS; u++) {
		const struct engine_user_info *pi = &s->info[u];
		struct engine_user_info ni;
		uint32_t a, b;

		offload_need(s, u, &a, &b);
		engine_info(s->eng, s->u[u].key, &ni);
		EXPECT(s, ni.pages_device == pi->pages_device &&
		       ni.pages_host >= pi->pages_host + (rc < 0 ? 0 : a) &&
		       ni.pages_host <= pi->pages_host + b, "user %d has %" PRIu32
		       " device / %" PRIu32 " host pages after offload_all, before %"
		       PRIu32 " / %" PRIu32, u, ni.pages_device, ni.pages_host,
		       pi->pages_device, pi->pages_host);
	}
}

static void op_evict(struct sim *s)
{
	static const uint32_t sels[] = { KVP_SEL_DEVICE, KVP_SEL_DEVICE, KVP_SEL_DEVICE,
					 KVP_SEL_HOST, KVP_SEL_HOST, KVP_SEL_ALL,
					 KVP_SEL_ALL, 0, 1u << KVP_TIERS };
	int u = pick_user(s);
	uint32_t sel = sels[rnd(s, sizeof(sels) / sizeof(sels[0]))];
	struct muser *m = &s->u[u];
	const struct engine_user_info *pi = &s->info[u];
	uint64_t free_host = s->st.tier[KVP_TIER_HOST].frames_free, droppable = 0;
	struct engine_user_info ni;
	struct errbuf e = { .msg = "" };
	int rc, want;

	snprintf(s->op, sizeof(s->op), "evict(user %d, sel %#" PRIx32 "): len %"
		 PRIu64 ", %" PRIu32 " device / %" PRIu32 " host pages, %" PRIu32
		 " leases, %" PRIu64 " host free", u, sel, m->len, pi->pages_device,
		 pi->pages_host, m->leases, free_host);
	rc = engine_evict(s->eng, m->key, sel, &e);
	s->o.evicts++;
	want = !sel || sel & ~(uint32_t)KVP_SEL_ALL ? -EINVAL :
	       !pi->exists ? -ENOENT : m->leases ? -EBUSY : 1;
	if (want < 0) {
		EXPECT(s, rc == want, "evict = %d (%s), want %d", rc, e.msg, want);
		expect_nochange(s);
		return;
	}
	s->target = u;
	s->touched[u] = true;
	if (sel == KVP_SEL_ALL || (sel == KVP_SEL_HOST && host_only(pi))) {
		EXPECT(s, rc == (int)pi->pages, "evict = %d (%s), user held %" PRIu32
		       " pages", rc, e.msg, pi->pages);
		s->must_vanish[u] = true;
		return;
	}
	if (sel == KVP_SEL_HOST) {
		EXPECT(s, rc == (int)pi->pages_host, "evict host = %d (%s), user had %"
		       PRIu32 " host pages", rc, e.msg, pi->pages_host);
		engine_info(s->eng, m->key, &ni);
		EXPECT(s, ni.pages_host == 0 && ni.pages_device == pi->pages_device,
		       "after evict host: %" PRIu32 " device / %" PRIu32 " host pages",
		       ni.pages_device, ni.pages_host);
		return;
	}
	/* Device only: demote, making room on the host LRU, or drop. */
	EXPECT(s, rc == (int)pi->pages_device, "evict device = %d (%s), user had %"
	       PRIu32 " device pages", rc, e.msg, pi->pages_device);
	if (!pi->pages_device) {
		expect_nochange(s);
		return;
	}
	for (int v = 0; v < NUSERS; v++)
		if (v != u && host_only(&s->info[v]) && !s->u[v].leases)
			droppable += s->info[v].pages_host;
	s->host_need = pi->pages - pi->pages_host;
	if (free_host + droppable < s->host_need) {
		s->must_vanish[u] = true;
		s->host_need = 0;
		return;
	}
	engine_info(s->eng, m->key, &ni);
	EXPECT(s, ni.exists && !ni.pages_device && ni.pages_host == ni.pages,
	       "evict device with room on the host: %s, %" PRIu32 " device / %"
	       PRIu32 " host pages", ni.exists ? "kept" : "dropped",
	       ni.pages_device, ni.pages_host);
	if (free_host < s->host_need)
		s->drop_host_ok = true;
	else
		s->host_need = 0;
}

static void op_evict_all(struct sim *s)
{
	static const uint32_t sels[] = { KVP_SEL_DEVICE, KVP_SEL_HOST, KVP_SEL_ALL };
	uint32_t sel = sels[rnd(s, 3)], skipped = UINT32_MAX, pinned = 0;
	int rc, want = 0;

	for (int u = 0; u < NUSERS; u++) {
		const struct engine_user_info *pi = &s->info[u];

		if (s->u[u].leases) {
			pinned++;
			continue;
		}
		if (!pi->exists)
			continue;
		if (sel == KVP_SEL_ALL) {
			want++;
			s->must_vanish[u] = true;
		} else if (sel == KVP_SEL_HOST) {
			want += host_only(pi) || pi->pages_host;
			s->must_vanish[u] = host_only(pi);
		} else {
			want += pi->pages_device > 0;
		}
	}
	snprintf(s->op, sizeof(s->op), "evict_all(sel %#" PRIx32 "), %" PRIu32
		 " users pinned", sel, pinned);
	rc = engine_evict_all(s->eng, sel, &skipped);
	EXPECT(s, rc == want && skipped == pinned, "evict_all = %d, skipped %" PRIu32
	       "; model: %d affected, %" PRIu32 " pinned", rc, skipped, want, pinned);
	s->drop_dev_ok = s->drop_host_ok = sel == KVP_SEL_DEVICE;
	s->touch_all = true;
	s->o.evict_alls++;
	for (int u = 0; u < NUSERS; u++) {
		const struct engine_user_info *pi = &s->info[u];
		struct engine_user_info ni;

		engine_info(s->eng, s->u[u].key, &ni);
		if (s->u[u].leases)
			EXPECT(s, info_equal(&ni, pi), "evict_all changed pinned user %d", u);
		else if (ni.exists && sel == KVP_SEL_DEVICE)
			EXPECT(s, !ni.pages_device, "user %d kept %" PRIu32 " device "
			       "pages through evict_all(device)", u, ni.pages_device);
		else if (ni.exists && sel == KVP_SEL_HOST)
			EXPECT(s, !ni.pages_host && ni.pages_device == pi->pages_device,
			       "user %d kept %" PRIu32 " host pages through "
			       "evict_all(host)", u, ni.pages_host);
	}
}

/* ------------------------------------------------------------ driver */

static void random_op(struct sim *s)
{
	uint32_t r = rnd(s, 1000);

	land_some(s);
	if (s->nopen == MAX_OPEN || (s->nopen && r < 330))
		op_lease(s);
	else if (r < 760)
		op_prepare(s);
	else if (r < 820)
		op_offload(s);
	else if (r < 900)
		op_evict(s);
	else if (r < 904)
		op_evict_all(s);
	else if (r < 910)
		op_offload_all(s);
	else if (r < 925)
		op_release_owner(s);
	else if (r < 935 && s->nstale)
		op_stale_lease(s);
	else
		op_prepare(s);
}

static void sim_init(struct sim *s, const struct model_cfg *cfg)
{
	struct engine_config ec = { .device_frames = cfg->device_frames,
				    .host_frames = cfg->host_frames,
				    .max_tokens_per_user = cfg->max_tokens,
				    .backend = cfg->async ? &fake_async_backend : NULL,
				    .backend_ctx = cfg->async ? &s->fake : NULL };
	struct errbuf e = { .msg = "" };
	size_t tokens;
	int rc;

	assert_true(cfg->device_frames <= MAX_DEV_FRAMES);
	assert_int_equal(kvp_layout_init(&ec.layout, 2, 2, 4, KVP_DTYPE_FP32, 4,
					 e.msg, sizeof(e.msg)), 0);
	rc = engine_create(&s->eng, &ec, &e);
	if (rc)
		print_error("engine_create: %s\n", e.msg);
	assert_int_equal(rc, 0);
	s->cfg = cfg;
	s->l = engine_layout(s->eng);
	s->P = s->l->page_tokens;
	s->words = (uint32_t)(s->l->token_bytes / 4);
	s->rng = cfg->seed;
	for (int u = 0; u < NUSERS; u++)
		s->u[u].key = mix64(0x6b76706f6f6cull + (uint64_t)u) | 1;
	/* A history never outgrows the device tier: it has to fit to be leased. */
	tokens = (size_t)cfg->device_frames * s->P + MAX_NEW;
	s->want = calloc(s->words, sizeof(uint32_t));
	s->got = calloc(tokens * s->words, sizeof(uint32_t));
	s->slots = calloc(tokens, sizeof(struct kvp_slot));
	assert_non_null(s->want);
	assert_non_null(s->got);
	assert_non_null(s->slots);
	engine_stats(s->eng, &s->st);
}

/* Release what is held, read everything back, evict all: no frame stays. */
static void sim_finish(struct sim *s)
{
	uint32_t skipped = UINT32_MAX;
	int rc, want = 0;

	while (s->nopen) {
		s->step++;
		step_begin(s, "final release");
		lease_release(s, s->nopen - 1);
		check_step(s);
	}
	s->step++;
	step_begin(s, "final evict_all(all)");
	for (int u = 0; u < NUSERS; u++) {
		check_history_bytes(s, u);
		want += s->info[u].exists;
		s->must_vanish[u] = s->info[u].exists;
	}
	rc = engine_evict_all(s->eng, KVP_SEL_ALL, &skipped);
	EXPECT(s, rc == want && skipped == 0, "evict_all(all) = %d skipped %" PRIu32
	       ", %d users held", rc, skipped, want);
	check_step(s);
	EXPECT(s, s->st.tier[KVP_TIER_DEVICE].frames_used == 0 &&
	       s->st.tier[KVP_TIER_HOST].frames_used == 0 && s->st.users == 0 &&
	       s->st.leases == 0, "after evicting everything: %" PRIu64 " device, %"
	       PRIu64 " host frames used, %" PRIu64 " users, %" PRIu64 " leases",
	       s->st.tier[KVP_TIER_DEVICE].frames_used,
	       s->st.tier[KVP_TIER_HOST].frames_used, s->st.users, s->st.leases);
}

static void run_model(const struct model_cfg *cfg)
{
	struct sim *s = calloc(1, sizeof(*s));
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
	print_message("%s: %" PRIu32 " ops, %" PRIu64 " prepares (%" PRIu64 " read-only, %"
		      PRIu64 " onloading), %" PRIu64 " commits (%" PRIu64 " partial), %"
		      PRIu64 " releases, %" PRIu64 " rolled back, %" PRIu64 " trims, %"
		      PRIu64 " leases of dead owners; errors: %" PRIu64 " gap, %" PRIu64
		      " overlap, %" PRIu64 " busy, %" PRIu64 " no-memory, %" PRIu64
		      " too-big, %" PRIu64 " misuse; %" PRIu64 " dropped under "
		      "pressure, %" PRIu64 " evicted, %" PRIu64 " demoted; offload %"
		      PRIu64 " ok / %" PRIu64 " no space; %" PRIu64 " evicts, %"
		      PRIu64 " evict_alls, %" PRIu64 " offload_alls, %" PRIu64 " sweeps\n",
		      cfg->name, cfg->steps, o->prep_ok, o->read_leases, o->onloads,
		      o->commits, o->partial_commits, o->releases, o->rollbacks,
		      o->trims, o->owner_releases, o->gap, o->overlap, o->busy,
		      o->nomem, o->big, o->misuse, o->drops_pressure,
		      o->drops_explicit, o->demotions, o->offload_ok,
		      o->offload_nospc, o->evicts, o->evict_alls, o->offload_alls,
		      o->sweeps);
	/* The run proves little unless every path was taken. */
	EXPECT(s, o->gap && o->overlap && o->busy && o->nomem &&
	       o->partial_commits && o->rollbacks && o->owner_releases &&
	       o->drops_pressure && o->drops_explicit && o->offload_nospc &&
	       o->read_leases && o->misuse,
	       "the random mix missed a path (see the counts above)");
	EXPECT(s, !cfg->host_frames || (o->onloads && o->demotions && o->offload_ok),
	       "nothing went through the host tier");
	EXPECT(s, !cfg->max_tokens || o->trims, "no history was ever trimmed");
	EXPECT(s, !cfg->max_tokens || o->before_head,
	       "no prepare started before a trimmed head");
	EXPECT(s, !cfg->expect_too_big || o->big, "no prepare was too big");
	if (cfg->async)
		print_message("%s: %" PRIu64 " leases came back with a copy in "
			      "flight, %" PRIu64 " ended before it landed; the "
			      "engine waited %" PRIu32 " times\n", cfg->name,
			      o->late_leases, o->early_ends, s->fake.waits);
	EXPECT(s, !cfg->async || (o->late_leases && o->early_ends && s->fake.waits),
	       "the async run never left a copy in flight across operations");

	engine_destroy(s->eng);
	EXPECT(s, !s->fake.conflicts, "destroy: %s", s->fake.conflict);
	fake_fini(&s->fake);
	free(s->want);
	free(s->got);
	free(s->slots);
	free(s);
}

static void test_model_capped_histories_match_reference(void **state)
{
	static const struct model_cfg cfg = {
		.name = "capped (max_tokens_per_user 64)", .seed = 0x6b76706f6f6c0001ull,
		.steps = 100000, .device_frames = 48, .host_frames = 32,
		.max_tokens = 64,
	};

	(void)state;
	run_model(&cfg);
}

static void test_model_unlimited_histories_match_reference(void **state)
{
	static const struct model_cfg cfg = {
		.name = "unlimited (max_tokens_per_user 0)", .seed = 0x6b76706f6f6c0002ull,
		.steps = 100000, .device_frames = 48, .host_frames = 32,
		.max_tokens = 0,
	};

	(void)state;
	run_model(&cfg);
}

/* No host tier: pressure drops instead of demoting, offload has no room. */
static void test_model_without_host_tier_matches_reference(void **state)
{
	static const struct model_cfg cfg = {
		.name = "no host tier, 24 device pages", .seed = 0x6b76706f6f6c0003ull,
		.steps = 100000, .device_frames = 24, .host_frames = 0,
		.max_tokens = 0,
	};

	(void)state;
	run_model(&cfg);
}

/* A pool of 3 + 2 pages: a history of 12 tokens fills the device tier, so
 * prepares are too big, out of memory or evict on nearly every call. */
static void test_model_tiny_pool_matches_reference(void **state)
{
	static const struct model_cfg cfg = {
		.name = "tiny pool, 3 device + 2 host pages, max 8 tokens",
		.seed = 0x6b76706f6f6c0004ull, .steps = 100000, .device_frames = 3,
		.host_frames = 2, .max_tokens = 8, .expect_too_big = true,
	};

	(void)state;
	run_model(&cfg);
}

/* Onloads land when the test says; clients wait for them, or do not. */
static void test_model_async_onload_matches_reference(void **state)
{
	static const struct model_cfg cfg = {
		.name = "async onload (copies land at random)",
		.seed = 0x6b76706f6f6c0005ull, .steps = 100000, .device_frames = 48,
		.host_frames = 32, .max_tokens = 64, .async = true,
	};

	(void)state;
	run_model(&cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model_capped_histories_match_reference),
		cmocka_unit_test(test_model_async_onload_matches_reference),
		cmocka_unit_test(test_model_unlimited_histories_match_reference),
		cmocka_unit_test(test_model_without_host_tier_matches_reference),
		cmocka_unit_test(test_model_tiny_pool_matches_reference),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
