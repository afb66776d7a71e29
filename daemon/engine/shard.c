/* SPDX-License-Identifier: MIT */
/*
 * shard.c - a (tenant, pool)'s shards: creation, routing, the lock order,
 * whole-set walks and the reclaimer (see shard.h for the design).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bug.h"
#include "clock.h"
#include "mix64.h"
#include "engine_internal.h"
#include "shard.h"

/* Pages one reclaim round copies at most: the oldest histories', planned
 * under one hold of the shard's lock, copied without it in pieces that
 * are finished as they land (engine.h). Rounds of 32 pages left the link
 * idle between them (a sync, a finish and a plan each time) and synced
 * once per 32 copies; pieces keep the first frames coming back as soon. */
#define RECLAIM_BATCH 128u

/* ------------------------------------------------------------ routing */


uint32_t shard_of_user(const struct shard_set *s, uint64_t user)
{
	return mix64_shard(user, s->n); /* libkvpool's lanes agree (mix64.h) */
}

uint32_t shard_of_lease(const struct shard_set *s, uint64_t lease)
{
	uint32_t i;

	if (lease & (1ull << 31))
		return 0; /* sequences' and chunks' (share.h): shard 0's */
	i = ((uint32_t)lease >> LEASE_SHARD_SHIFT) & 0x7f;
	return i < s->n ? i : 0; /* a forged id then misses in shard 0 */
}

uint32_t shard_cache_cap(const struct shard_set *s, int t)
{
	/* Small: frames idle in one shard's cache are invisible to the
	 * others (and to the reclaimer's watermarks), so a few dozen, enough
	 * to batch the pool's lock, not a share of the tier. */
	uint64_t cap = s->pool[t]->total / (64ull * s->n);

	return cap < 1 ? 1 : cap > 32 ? 32 : (uint32_t)cap;
}

/* ------------------------------------------------------------ locks */

struct engine *shard_lock(struct shard_set *s, uint32_t i)
{
	pthread_mutex_lock(&s->v[i].lock);
	return s->v[i].eng;
}

/* What a shard freed beyond its cache's cap goes back to the pool before
 * its lock is dropped, for the other shards. */
static void shard_trim(struct shard *sh)
{
	for (int t = 0; t < KVP_TIERS; t++)
		frames_trim(&sh->eng->frames[t]);
}

void shard_unlock(struct shard_set *s, uint32_t i)
{
	shard_trim(&s->v[i]);
	pthread_mutex_unlock(&s->v[i].lock);
}

struct engine *shard_lock_all(struct shard_set *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		pthread_mutex_lock(&s->v[i].lock);
	s->global = true;
	return s->v[0].eng;
}

void shard_unlock_all(struct shard_set *s)
{
	s->global = false;
	for (uint32_t i = s->n; i-- > 0;) {
		shard_trim(&s->v[i]);
		pthread_mutex_unlock(&s->v[i].lock);
	}
}

/* ------------------------------------------------------------ reclaimer */

/* After a pass that found nothing to evict, neither hints nor waiting
 * prepares wake the reclaimer for this long. */
#define RECLAIM_DRY_NS 1000000ull

static void reclaim_wake(struct reclaimer *rc)
{
	pthread_mutex_lock(&rc->lock);
	/* Read without the lock by the hints: atomic, like every access. */
	__atomic_store_n(&rc->wake, true, __ATOMIC_RELAXED);
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
}

/* Its last device pass found nothing to evict, less than RECLAIM_DRY_NS
 * ago: waking it again now would be in vain. */
static bool reclaim_dry_recently(const struct reclaimer *rc)
{
	return __atomic_load_n(&rc->dry, __ATOMIC_RELAXED) &&
	       mono_ns() - __atomic_load_n(&rc->dry_ns, __ATOMIC_RELAXED) <
	       RECLAIM_DRY_NS;
}

/* A pass with no stall for this long halves the boost (shard.h). */
#define RECLAIM_BOOST_DECAY_NS 200000000ull

static uint32_t reclaim_boost(const struct reclaimer *rc, int t)
{
	return t == KVP_TIER_DEVICE ? __atomic_load_n(&rc->boost, __ATOMIC_RELAXED) : 0;
}

void shard_reclaim_stalled(struct shard_set *s, uint32_t need)
{
	struct reclaimer *rc = &s->rc;
	uint32_t low = rc->low[KVP_TIER_DEVICE], max = 3 * low;
	uint32_t b = __atomic_load_n(&rc->boost, __ATOMIC_RELAXED), to;

	if (!rc->boost_on)
		return;
	__atomic_store_n(&rc->stall_ns, mono_ns(), __ATOMIC_RELAXED);
	do {
		uint32_t step = need > low / 4 ? need : low / 4;

		to = b + step > max ? max : b + step;
	} while (to != b && !__atomic_compare_exchange_n(&rc->boost, &b, to, false,
							 __ATOMIC_RELAXED,
							 __ATOMIC_RELAXED));
}

/* After a pass: no stall for RECLAIM_BOOST_DECAY_NS, half the boost. */
static void reclaim_boost_decay(struct reclaimer *rc)
{
	uint64_t now = mono_ns();
	uint32_t b = __atomic_load_n(&rc->boost, __ATOMIC_RELAXED);

	if (!b || now - __atomic_load_n(&rc->stall_ns, __ATOMIC_RELAXED) <
		  RECLAIM_BOOST_DECAY_NS)
		return;
	/* A stall racing this keeps its raise or loses half: either is fine. */
	__atomic_store_n(&rc->boost, b / 2, __ATOMIC_RELAXED);
	__atomic_store_n(&rc->stall_ns, now, __ATOMIC_RELAXED);
}

void shard_reclaim_hint(struct shard_set *s)
{
	struct reclaimer *rc = &s->rc;
	bool low = false;

	if (!rc->started)
		return;
	for (int t = 0; t < KVP_TIERS; t++)
		low |= frame_pool_free(s->pool[t]) < rc->low[t] + reclaim_boost(rc, t);
	if (!low || __atomic_load_n(&rc->wake, __ATOMIC_RELAXED))
		return;
	/* Found nothing to evict a moment ago (all pinned): not again at
	 * every request; a millisecond later. */
	if (reclaim_dry_recently(rc))
		return;
	reclaim_wake(rc);
}

bool shard_reclaim_kick(struct shard_set *s, uint32_t need)
{
	struct reclaimer *rc = &s->rc;
	uint32_t want = __atomic_load_n(&rc->want, __ATOMIC_RELAXED);

	if (!rc->started || !rc->high[KVP_TIER_DEVICE])
		return false;
	/* Found nothing to evict a moment ago: the waiting would be in vain.
	 * Later, a release may have made something evictable: wake it (as the
	 * hint does), or every prepare after one dry pass would evict for
	 * itself until something else woke the reclaimer. */
	if (reclaim_dry_recently(rc))
		return false;
	/* Free this much beyond the high watermark on the next pass: the
	 * waiting prepare's pages come on top of the usual reserve. */
	while (want < need && !__atomic_compare_exchange_n(&rc->want, &want, need,
							   false, __ATOMIC_RELAXED,
							   __ATOMIC_RELAXED))
		;
	if (!__atomic_load_n(&rc->wake, __ATOMIC_RELAXED))
		reclaim_wake(rc);
	return true;
}

/* The sets sharing s's host tier: s alone unless pools share it. */
static struct host_sharers *host_sharers_of(struct shard_set *s)
{
	return s->host_of ? &s->host_of->sharers : &s->sharers;
}

/* Of sets[0 .. n), the shard whose oldest evictable page of tier t is the
 * oldest: false when no shard has one. */
static bool reclaim_victim(struct shard_set *const *sets, uint32_t n,
			   enum kvp_tier t, struct shard_set **vset,
			   uint32_t *vshard)
{
	uint64_t best = UINT64_MAX;

	for (uint32_t k = 0; k < n; k++) {
		struct shard_set *s = sets[k];

		for (uint32_t i = 0; i < s->n; i++) {
			uint64_t tick = engine_oldest_tick(shard_lock(s, i), t);

			shard_unlock(s, i);
			if (tick < best) {
				best = tick;
				*vset = s;
				*vshard = i;
			}
		}
	}
	return best != UINT64_MAX;
}

static void reclaim_dry(struct shard_set *s, enum kvp_tier t)
{
	if (t != KVP_TIER_DEVICE)
		return;
	__atomic_store_n(&s->rc.dry_ns, mono_ns(), __ATOMIC_RELAXED);
	__atomic_store_n(&s->rc.dry, true, __ATOMIC_RELAXED);
}

/* One demotion of shard i's oldest device pages, the copy unlocked and
 * finished piece by piece as it lands (engine.h); device frames freed. */
static uint32_t reclaim_demote(struct shard_set *s, uint32_t i)
{
	struct reclaimer *rc = &s->rc;
	struct engine *eng = shard_lock(s, i);
	uint32_t freed = engine_demote_plan(eng, &rc->dem, RECLAIM_BATCH);

	shard_unlock(s, i);
	if (!rc->dem.nh)
		return freed;
	engine_demote_copy(eng, &rc->dem, &rc->copy); /* no lock */
	for (uint32_t p = 0, n = rc->dem.npiece; p < n; p++) {
		engine_demote_wait(eng, &rc->dem, p); /* no lock */
		shard_lock(s, i);
		freed += engine_demote_finish(eng, &rc->dem, p);
		shard_unlock(s, i);
	}
	return freed;
}

/* Free tier t's frames until `high` are free in the pool or nothing is
 * evictable; one shard's lock at a time, RECLAIM_BATCH pages per round.
 * A host tier shared by several pools' sets is freed of the oldest
 * host-only histories of all of them (shard.h), under the sharers' lock. */
static void reclaim_tier(struct shard_set *s, enum kvp_tier t)
{
	struct host_sharers *hs = t == KVP_TIER_HOST ? host_sharers_of(s) : NULL;
	struct shard_set *const *sets = hs ? hs->v : &s;
	uint32_t idle = 0, nsets = 1, target = s->rc.high[t];

	if (t == KVP_TIER_DEVICE)
		target += reclaim_boost(&s->rc, t) +
			  __atomic_exchange_n(&s->rc.want, 0, __ATOMIC_RELAXED);
	if (target > s->pool[t]->total)
		target = s->pool[t]->total;
	if (hs) {
		pthread_mutex_lock(&hs->lock);
		nsets = hs->n;
	}
	for (;;) {
		uint32_t nfree = frame_pool_free(s->pool[t]), i = 0, freed;
		struct shard_set *vs = s;

		if (nfree >= target)
			break;
		if (!reclaim_victim(sets, nsets, t, &vs, &i)) {
			reclaim_dry(s, t);
			break;
		}
		if (t == KVP_TIER_DEVICE) {
			freed = reclaim_demote(s, i);
		} else {
			/* Dropping loses data: no more than the watermark
			 * asks, and each round from the oldest set's shard. */
			freed = engine_reclaim_host(shard_lock(vs, i),
						    target - nfree < RECLAIM_BATCH ?
						    target - nfree : RECLAIM_BATCH);
			shard_unlock(vs, i);
		}
		if (!freed && ++idle >= 8) {
			reclaim_dry(s, t); /* the oldest keep getting pinned */
			break;
		}
	}
	if (hs)
		pthread_mutex_unlock(&hs->lock);
}

/* With a remote tier, every RECLAIM_PUBLISH_MS the reclaimer queues for
 * the store what it lacks (remote_publish.c), PUBLISH_BATCH pages per hold
 * of the lock of shard 0 (the shared world's), PUBLISH_ROUNDS of them. */
#define RECLAIM_PUBLISH_MS 20
#define PUBLISH_BATCH 4u       /* 8 MiB of Llama-3-8B pages: ~1 ms held */
#define PUBLISH_ROUNDS 32

static void reclaim_publish(struct shard_set *s)
{
	bool more = true;

	for (int i = 0; i < PUBLISH_ROUNDS && more; i++) {
		uint32_t n = tier_publish(shard_lock(s, 0), PUBLISH_BATCH, &more);

		shard_unlock(s, 0);
		if (!n)
			break; /* the queue is full: the next tick */
	}
}

/* Woken, stopping, or (with a remote tier) a publishing tick gone by. */
static void reclaimer_wait(struct reclaimer *rc, bool tick)
{
	struct timespec ts;

	if (!tick) {
		pthread_cond_wait(&rc->cond, &rc->lock);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += RECLAIM_PUBLISH_MS * 1000000l;
	ts.tv_sec += ts.tv_nsec / 1000000000l;
	ts.tv_nsec %= 1000000000l;
	pthread_cond_timedwait(&rc->cond, &rc->lock, &ts);
}

static void *reclaimer_main(void *arg)
{
	struct shard_set *s = arg;
	struct reclaimer *rc = &s->rc;
	bool publish = s->v[0].eng->remote != NULL;
	uint64_t published_ns = 0;

	pthread_mutex_lock(&rc->lock);
	for (;;) {
		if (!__atomic_load_n(&rc->wake, __ATOMIC_RELAXED) && !rc->stop)
			reclaimer_wait(rc, publish);
		if (rc->stop)
			break;
		/* A publishing tick, also between passes when woken all the
		 * time. */
		if (publish && mono_ns() - published_ns >= RECLAIM_PUBLISH_MS * 1000000ull) {
			pthread_mutex_unlock(&rc->lock);
			reclaim_publish(s);
			published_ns = mono_ns();
			pthread_mutex_lock(&rc->lock);
		}
		if (!__atomic_load_n(&rc->wake, __ATOMIC_RELAXED))
			continue;
		rc->runs++;
		/* Woken: a release may have made something evictable. */
		__atomic_store_n(&rc->dry, false, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&rc->lock);
		/* Device first: its demotions need host frames, which the
		 * host pass then makes up for. */
		reclaim_tier(s, KVP_TIER_DEVICE);
		reclaim_tier(s, KVP_TIER_HOST);
		reclaim_boost_decay(rc);
		pthread_mutex_lock(&rc->lock);
		__atomic_store_n(&rc->wake, false, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&rc->lock);
	return NULL;
}

/*
 * Watermarks: the device tier keeps 1/16 of its frames free (at least 2,
 * at most 4096 pages and a quarter of the tier), refilled to twice that;
 * the host tier, whose reclaim drops data, 1/64 refilled to 1/32. In
 * RECLAIM_AUTO a tier of fewer than RECLAIM_MIN_FRAMES gets none.
 */
static void reclaimer_marks(struct shard_set *s, enum reclaim_mode mode)
{
	for (int t = 0; t < KVP_TIERS; t++) {
		uint32_t total = s->pool[t]->total;
		uint32_t low = total / (t == KVP_TIER_DEVICE ? 16 : 64);

		if (!total || (mode == RECLAIM_AUTO && total < RECLAIM_MIN_FRAMES)) {
			s->rc.low[t] = s->rc.high[t] = 0;
			continue;
		}
		low = low < 2 ? 2 : low > 4096 ? 4096 : low;
		if (low > total / 4)
			low = total / 4 ? total / 4 : 1;
		s->rc.low[t] = low;
		s->rc.high[t] = 2 * low;
	}
}

static int reclaimer_start(struct shard_set *s, enum reclaim_mode mode,
			   bool boost, struct errbuf *e)
{
	struct reclaimer *rc = &s->rc;
	int ret;

	pthread_mutex_init(&rc->lock, NULL);
	pthread_cond_init(&rc->cond, NULL);
	reclaimer_marks(s, mode);
	rc->boost_on = boost;
	ret = pthread_create(&rc->thread, NULL, reclaimer_main, s);
	if (ret) {
		pthread_cond_destroy(&rc->cond);
		pthread_mutex_destroy(&rc->lock);
		return errbuf_set(e, -ret, "cannot start the reclaim thread: %s",
				  strerror(ret));
	}
	rc->started = true;
	return 0;
}

static void reclaimer_stop(struct shard_set *s)
{
	struct reclaimer *rc = &s->rc;

	if (!rc->started)
		return;
	pthread_mutex_lock(&rc->lock);
	rc->stop = true;
	pthread_cond_signal(&rc->cond);
	pthread_mutex_unlock(&rc->lock);
	pthread_join(rc->thread, NULL);
	pthread_cond_destroy(&rc->cond);
	pthread_mutex_destroy(&rc->lock);
	rc->started = false;
}

/* ------------------------------------------------------------ life cycle */

/* Take the host tier of cfg->host_of instead of allocating one. */
static int host_share_take(struct shard_set *s, const struct shard_set_config *cfg,
			   struct errbuf *e)
{
	const struct shard_set *o = cfg->host_of;

	if (o->host_of)
		return errbuf_set(e, -EINVAL, "a shared host tier is shared from "
				  "the set that owns it, not a sharer");
	if (o->own_pool[KVP_TIER_HOST].total != cfg->ec.host_frames ||
	    o->v[0].eng->layout.page_bytes != cfg->ec.layout.page_bytes ||
	    o->be != s->be)
		return errbuf_set(e, -EINVAL, "a shared host tier needs the same "
				  "backend, page size and host_frames in every pool");
	if (o->sharers.n >= KVP_POOLS_MAX)
		return errbuf_set(e, -EINVAL, "a host tier is shared by %u pools "
				  "at most", KVP_POOLS_MAX);
	s->host_of = cfg->host_of;
	s->pool[KVP_TIER_HOST] = &s->host_of->own_pool[KVP_TIER_HOST];
	s->mem[KVP_TIER_HOST] = s->host_of->mem[KVP_TIER_HOST]; /* not freed here */
	return 0;
}

/* Listed, or no longer, among the sets the host reclaim walks. */
static void host_share_join(struct shard_set *s)
{
	struct host_sharers *hs = host_sharers_of(s);

	if (!s->host_of)
		return; /* the owner is v[0] from the start */
	pthread_mutex_lock(&hs->lock);
	hs->v[hs->n++] = s;
	pthread_mutex_unlock(&hs->lock);
}

static void host_share_leave(struct shard_set *s)
{
	struct host_sharers *hs = host_sharers_of(s);

	if (!s->host_of)
		return;
	pthread_mutex_lock(&hs->lock);
	for (uint32_t k = 1; k < hs->n; k++) {
		if (hs->v[k] != s)
			continue;
		memmove(&hs->v[k], &hs->v[k + 1], (hs->n - k - 1) * sizeof(hs->v[0]));
		hs->n--;
		break;
	}
	pthread_mutex_unlock(&hs->lock);
}

int shard_set_create(struct shard_set **out, const struct shard_set_config *cfg,
		     struct errbuf *e)
{
	const struct engine_config *ec = &cfg->ec;
	uint32_t nframes[KVP_TIERS] = { ec->device_frames, ec->host_frames };
	struct shard_set *s;
	int ret;

	if (!cfg->shards || cfg->shards > SHARDS_MAX)
		return errbuf_set(e, -EINVAL, "shards = %" PRIu32 ": use 1 to %u",
				  cfg->shards, SHARDS_MAX);
	s = calloc(1, sizeof(*s));
	/* struct shard is cache-line aligned (no false sharing of two shards'
	 * locks): calloc does not promise 64. */
	if (s && posix_memalign((void **)&s->v, 64, cfg->shards * sizeof(*s->v)))
		s->v = NULL;
	if (s && s->v)
		memset(s->v, 0, cfg->shards * sizeof(*s->v));
	if (!s || !s->v) {
		free(s);
		return errbuf_set(e, -ENOMEM, "out of memory for %" PRIu32 " shards",
				  cfg->shards);
	}
	s->be = ec->backend ? ec->backend : &backend_shm;
	s->be_ctx = ec->backend_ctx;
	pthread_mutex_init(&s->sharers.lock, NULL);
	s->sharers.v[s->sharers.n++] = s;
	for (int t = 0; t < KVP_TIERS; t++) {
		s->mem[t].fd = -1;
		s->pool[t] = &s->own_pool[t];
	}
	for (int t = 0; t < KVP_TIERS; t++) {
		bool shared = t == KVP_TIER_HOST && cfg->host_of;
		uint64_t bytes;

		if (__builtin_mul_overflow((uint64_t)nframes[t], ec->layout.page_bytes,
					   &bytes)) {
			ret = errbuf_set(e, -EINVAL, "%s tier of %" PRIu32 " pages "
					 "overflows", kvp_tier_name(t), nframes[t]);
			goto err;
		}
		if (frame_pool_init(&s->own_pool[t], shared ? 0 : nframes[t])) {
			ret = errbuf_set(e, -ENOMEM, "out of memory for the frame pools");
			goto err;
		}
		if (shared) {
			ret = host_share_take(s, cfg, e);
			if (ret)
				goto err;
			continue;
		}
		if (!nframes[t] || !ec->device_frames)
			continue; /* engine_create says what is wrong with 0 */
		ret = s->be->tier_alloc(s->be_ctx, t, bytes, &s->mem[t], e);
		if (ret)
			goto err;
	}
	s->n = cfg->shards;
	for (uint32_t i = 0; i < s->n; i++) {
		struct engine_config c = *ec;

		c.set = s;
		c.shard = i;
		pthread_mutex_init(&s->v[i].lock, NULL);
		ret = engine_create(&s->v[i].eng, &c, e);
		if (ret)
			goto err;
	}
	host_share_join(s);
	if (cfg->reclaim != RECLAIM_OFF) {
		ret = reclaimer_start(s, cfg->reclaim, cfg->boost, e);
		if (ret)
			goto err;
	}
	*out = s;
	return 0;
err:
	shard_set_destroy(s);
	return ret;
}

void shard_set_destroy(struct shard_set *s)
{
	if (!s)
		return;
	reclaimer_stop(s);
	host_share_leave(s);
	KVP_BUG_ON(s->sharers.n > 1, "a host tier destroyed while another pool "
		   "shares it");
	/* Shard 0 first: its sequences pin other shards' histories. */
	for (uint32_t i = 0; i < s->n; i++) {
		if (s->v[i].eng) {
			s->global = true;
			engine_destroy(s->v[i].eng);
			pthread_mutex_destroy(&s->v[i].lock);
		}
	}
	for (int t = 0; t < KVP_TIERS; t++) {
		bool shared = t == KVP_TIER_HOST && s->host_of;

		if (!shared && (s->mem[t].base || s->mem[t].fd >= 0))
			s->be->tier_free(s->be_ctx, &s->mem[t]);
		frame_pool_fini(&s->own_pool[t]);
	}
	pthread_mutex_destroy(&s->sharers.lock);
	free(s->v);
	free(s);
}

const struct tier_mem *shard_set_tier(const struct shard_set *s, enum kvp_tier t)
{
	return &s->mem[t];
}

/* ------------------------------------------------------------ walks */

/* Host frames holding pages of any set sharing s's host tier: each shard
 * read under its lock, one at a time, the sharers' lock held first (the
 * reclaimer's order). */
static uint64_t host_used_by_all(struct shard_set *s)
{
	struct host_sharers *hs = host_sharers_of(s);
	uint64_t used = 0;

	pthread_mutex_lock(&hs->lock);
	for (uint32_t k = 0; k < hs->n; k++) {
		for (uint32_t i = 0; i < hs->v[k]->n; i++) {
			used += frames_used(&shard_lock(hs->v[k], i)->frames[KVP_TIER_HOST]);
			shard_unlock(hs->v[k], i);
		}
	}
	pthread_mutex_unlock(&hs->lock);
	return used;
}

void shard_set_stats(struct shard_set *s, struct kvp_stats *out)
{
	/* Everything after the tiers is a uint64_t that adds up over shards,
	 * but for the time of the last chunk access (the latest). */
	const size_t first = offsetof(struct kvp_stats, users) / sizeof(uint64_t);
	const size_t last = sizeof(*out) / sizeof(uint64_t);
	uint64_t cached[KVP_TIERS] = { 0 }, used[KVP_TIERS] = { 0 };

	memset(out, 0, sizeof(*out));
	for (uint32_t i = 0; i < s->n; i++) {
		struct engine *eng = shard_lock(s, i);
		struct kvp_stats one;
		uint64_t acc = out->chunk_last_access_ns;

		engine_stats(eng, &one);
		for (int t = 0; t < KVP_TIERS; t++) {
			cached[t] += eng->frames[t].nfree;
			used[t] += frames_used(&eng->frames[t]);
		}
		shard_unlock(s, i);
		for (size_t k = first; k < last; k++)
			((uint64_t *)out)[k] += ((const uint64_t *)&one)[k];
		out->chunk_last_access_ns = one.chunk_last_access_ns > acc ?
					    one.chunk_last_access_ns : acc;
	}
	/* Used: this set's pages. Free: what its shards may take, the pool's
	 * and their caches; with a host tier shared by several pools' sets,
	 * the frames none of them holds pages in (kvctl(1)). */
	for (int t = 0; t < KVP_TIERS; t++) {
		uint64_t total = s->pool[t]->total;
		uint64_t nfree = frame_pool_free(s->pool[t]) + cached[t];

		if (t == KVP_TIER_HOST && host_sharers_of(s)->n > 1)
			nfree = total - host_used_by_all(s);

		if (used[t] > total)
			used[t] = total; /* the walk is not a snapshot */
		if (nfree > total - used[t])
			nfree = total - used[t];
		out->tier[t] = (struct kvp_tier_stats){
			.frames_total = total,
			.frames_used = used[t],
			.frames_free = nfree,
			.bytes_total = total * s->v[0].eng->layout.page_bytes,
		};
	}
	out->shards = s->n;
}

uint32_t shard_set_release_owner(struct shard_set *s, uint32_t owner)
{
	uint32_t n = 0;

	shard_lock_all(s);
	/* Histories first (their leases), then shard 0's sequences and chunks
	 * (engine_release_owner of shard 0 ends those too). */
	for (uint32_t i = s->n; i-- > 0;)
		n += engine_release_owner(s->v[i].eng, owner);
	shard_unlock_all(s);
	return n;
}

/* The first frame both caches' bitmaps mark as handed out (a bug: a frame
 * has one owner), or FRAME_NONE. */
static uint32_t frames_overlap(const struct frames *x, const struct frames *y)
{
	for (uint32_t w = 0; w < (x->total + 63) / 64; w++)
		if (x->used[w] & y->used[w])
			return w * 64 + (uint32_t)__builtin_ctzll(x->used[w] & y->used[w]);
	return FRAME_NONE;
}

/* Shard i of sets[a] shares no frame of tier t with a later shard of any
 * of sets[a .. n). */
static int frames_disjoint(struct shard_set *const *sets, uint32_t n, int t,
			   uint32_t a, uint32_t i, struct errbuf *e)
{
	const struct frames *f = &sets[a]->v[i].eng->frames[t];

	for (uint32_t b = a; b < n; b++) {
		for (uint32_t j = b == a ? i + 1 : 0; j < sets[b]->n; j++) {
			uint32_t x = frames_overlap(f, &sets[b]->v[j].eng->frames[t]);

			if (x != FRAME_NONE)
				return errbuf_set(e, -EFAULT, "%s tier: frame %" PRIu32
						  " is held by shard %" PRIu32 " of set %"
						  PRIu32 " and shard %" PRIu32 " of set %"
						  PRIu32, kvp_tier_name(t), x, i, a, j, b);
		}
	}
	return 0;
}

/* Tier t's frames across sets[0 .. n) (every shard of each locked): each
 * frame handed out by at most one shard of one set, and pool + caches +
 * handed out == total. */
static int frames_check(struct shard_set *const *sets, uint32_t n, int t,
			struct errbuf *e)
{
	const struct frame_pool *pool = sets[0]->pool[t];
	uint64_t sum = pool->nfree;
	int ret;

	for (uint32_t a = 0; a < n; a++) {
		for (uint32_t i = 0; i < sets[a]->n; i++) {
			const struct frames *f = &sets[a]->v[i].eng->frames[t];

			sum += f->nfree + frames_used(f);
			ret = frames_disjoint(sets, n, t, a, i, e);
			if (ret)
				return ret;
		}
	}
	if (sum != pool->total)
		return errbuf_set(e, -EFAULT, "%s tier: pool, caches and pages "
				  "hold %" PRIu64 " frames of %" PRIu32,
				  kvp_tier_name(t), sum, pool->total);
	return 0;
}

/* Every shard's own check, then the frames across them. A host tier shared
 * by several pools' sets is checked whole by its owner's check, with every
 * sharing set locked (the sharers' lock first, as the reclaimer takes it;
 * then the sets in pool order, as moves do); a sharer checks its device
 * tier only. */
int shard_set_check(struct shard_set *s, struct errbuf *e)
{
	struct host_sharers *hs = &s->sharers;
	uint32_t nsets = 1;
	int ret = 0;

	if (!s->host_of) {
		pthread_mutex_lock(&hs->lock);
		nsets = hs->n;
	}
	for (uint32_t k = 0; k < nsets; k++)
		shard_lock_all(s->host_of ? s : hs->v[k]);
	for (uint32_t i = 0; i < s->n && !ret; i++)
		ret = engine_check(s->v[i].eng, e);
	if (!ret)
		ret = frames_check(&s, 1, KVP_TIER_DEVICE, e);
	if (!ret && !s->host_of)
		ret = frames_check(hs->v, nsets, KVP_TIER_HOST, e);
	for (uint32_t k = nsets; k-- > 0;)
		shard_unlock_all(s->host_of ? s : hs->v[k]);
	if (!s->host_of)
		pthread_mutex_unlock(&hs->lock);
	return ret;
}
