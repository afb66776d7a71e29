/* SPDX-License-Identifier: MIT */
/*
 * remote_engine.c - the engine's two remote tier hooks (remote_engine.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "disk_record.h"
#include "engine.h"
#include "frames.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "tier_services.h"

void remote_key_of(const struct engine *eng, uint8_t kind, const uint8_t hash[32],
		   uint32_t page, struct remote_key *k)
{
	memset(k, 0, sizeof(*k));
	k->kind = kind;
	k->layout_id = disk_layout_id_tp(engine_layout(eng), engine_tp(eng));
	k->tenant = tier_disk_tenant(eng);
	memcpy(k->hash, hash, 32);
	k->page = page;
}

static void prefix_key(const struct engine *eng, const uint8_t hash[32],
		       struct remote_key *k)
{
	remote_key_of(eng, DISK_KIND_PREFIX, hash, 0, k);
}

int remote_prefix_put(struct engine *eng, const uint8_t hash[32], const void *page)
{
	struct remote_key k;

	if (!tier_remote(eng))
		return -ENOENT;
	prefix_key(eng, hash, &k);
	/* -ENOSPC (queue full): dropped and counted there; it can be recomputed. */
	return remote_tier_put(tier_remote(eng), &k, page);
}

/* The keys of pages [hit, hit + m) of tokens' chain. */
static void missing_keys(struct engine *eng, const uint32_t *tokens, uint32_t hit,
			 uint32_t m, const uint32_t *frames, struct remote_key *keys)
{
	static const uint8_t zero[32];
	const uint8_t *prev = hit ? tier_frame_hash(eng, frames[hit - 1]) : zero;
	uint32_t P = tier_page_tokens(eng);
	uint8_t h[32];

	for (uint32_t i = 0; i < m; i++) {
		tier_pc_hash_page(eng, prev, tokens + (uint64_t)(hit + i) * P, h);
		prefix_key(eng, h, &keys[i]);
		prev = keys[i].hash;
	}
}

/*
 * Onload the fetched run after the local chain's last page `last` (or
 * from the root, FRAME_NONE): device frames (evicting to make room; the
 * chain is held meanwhile so eviction cannot take its parent), the bytes
 * copied in (in place on shm; on a GPU through host frames, one copy for
 * the run: share_pages_in), then each page published as an idle entry in
 * chain order. Returns pages onloaded.
 */
static uint32_t onload_run(struct engine *eng, uint32_t last,
			   const struct remote_fetch *f)
{
	struct frames *dev = tier_device_frames(eng);
	uint32_t got = remote_fetch_pages(f), parent, done = 0, n = 0;
	uint32_t *frame = NULL, *idx = NULL;
	const void **src = NULL;
	uint64_t avail;

	if (!got)
		return 0;
	if (last != FRAME_NONE)
		tier_frame_ref(eng, last);
	avail = tier_device_avail(eng, got);
	if (avail < got)
		got = (uint32_t)avail;
	frame = malloc((got ? got : 1) * sizeof(*frame));
	idx = malloc((got ? got : 1) * sizeof(*idx));
	src = malloc((got ? got : 1) * sizeof(*src));
	if (!frame || !idx || !src)
		got = 0;
	if (got)
		tier_evict_for_device(eng, got);
	/* Frames for the pages not published meanwhile (another lookup, a
	 * commit), which keep theirs. */
	for (uint32_t i = 0; i < got; i++) {
		if (tier_pc_find(eng, remote_fetch_hash(f, i)) != TIER_PC_NONE)
			continue;
		frame[n] = frames_alloc(dev);
		if (frame[n] == FRAME_NONE)
			break;
		idx[n] = i;
		src[n] = remote_fetch_page(f, idx[n]);
		n++;
	}
	if (n && tier_pages_in(eng, src, frame, n)) {
		while (n) /* no host frames for the copy: a miss */
			frames_free(dev, frame[--n]);
		got = 0;
	}
	parent = last != FRAME_NONE ? tier_frame_pc(eng, last) : TIER_PC_NONE;
	for (uint32_t i = 0, k = 0; i < got; i++) {
		const uint8_t *hash = remote_fetch_hash(f, i);
		uint32_t e = tier_pc_find(eng, hash);

		if (e != TIER_PC_NONE) {
			parent = e;
			continue;
		}
		if (k == n || idx[k] != i)
			break; /* ran out of frames before page i */
		/* not written back on eviction */
		parent = tier_pc_adopt_stored(eng, frame[k], hash, parent);
		k++;
		done++;
	}
	if (last != FRAME_NONE)
		tier_frame_unref(eng, last);
	free(frame);
	free(idx);
	free(src);
	return done;
}

int remote_prefix_more(struct engine *eng, const uint32_t *tokens, uint32_t full,
		       uint32_t *frames, uint32_t *hit, bool defer)
{
	uint32_t m = full - *hit, last, done, idle;
	struct remote_fetch *f = NULL;
	struct remote_key *keys;
	int ret;

	if (!tier_remote(eng) || *hit >= full)
		return 0;
	if (m > tier_share_frames(eng))
		m = tier_share_frames(eng);
	keys = malloc(m * sizeof(*keys));
	if (!keys)
		return 0; /* the local answer */
	last = *hit ? frames[*hit - 1] : FRAME_NONE;
	/* A held lookup is retried every few microseconds while its round is
	 * out: one hash tells whether it still is, before hashing the run. */
	missing_keys(eng, tokens, *hit, 1, frames, keys);
	if (defer && remote_tier_pending(tier_remote(eng), &keys[0])) {
		free(keys);
		return engine_wait_set(ENGINE_WAIT_REMOTE);
	}
	missing_keys(eng, tokens, *hit, m, frames, keys);
	ret = remote_tier_fetch(tier_remote(eng), keys, m, &f);
	free(keys);
	if (ret == -EINPROGRESS && defer)
		return engine_wait_set(ENGINE_WAIT_REMOTE);
	if (ret)
		return 0; /* queued for a later lookup, or no memory: local */
	done = onload_run(eng, last, f);
	remote_fetch_done(tier_remote(eng), f, done);
	if (done)
		*hit = tier_pc_match(eng, tokens, full, frames, &idle);
	return 0;
}

/* ------------------------------------------------------------ tier.h */

static int remote_forget(struct engine *eng, uint64_t user, uint32_t sel,
			 struct errbuf *e)
{
	(void)sel;
	(void)e;
	engine_remote_user_del(eng, user);
	return 0;
}

/* After the disk tier's pass; never waits on the network (a caller that
 * cannot retry gets the local answer). What comes back is counted idle by
 * the engine's next match. */
static int remote_prefix_more_op(struct engine *eng, const uint32_t *tokens,
				 uint32_t full, uint32_t *frames, uint32_t *hit,
				 uint32_t *idle, bool wait)
{
	(void)idle;
	return remote_prefix_more(eng, tokens, full, frames, hit, !wait);
}

/* The remote tier as the engine sees it (tier.h); kvpoold.c registers it.
 * Its chunk fetches go through share_disk.c, beside the disk tier's. */
const struct tier_ops remote_tier_ops = {
	.name = "remote",
	.detach = engine_remote_user_detach,
	.fetch = engine_remote_user_onload,
	.store = engine_remote_user_out,
	.forget = remote_forget,
	.prefix_more = remote_prefix_more_op,
	.publish = remote_publish,
	.chunk_kept = remote_chunk_type_kept,
	.flush = engine_remote_user_flush_all,
};
