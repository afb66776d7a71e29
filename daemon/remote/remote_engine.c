/* SPDX-License-Identifier: MIT */
/*
 * remote_engine.c - the engine's two remote tier hooks (remote_engine.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "disk_record.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "share_internal.h"

static void prefix_key(const struct engine *eng, const uint8_t hash[32],
		       struct remote_key *k)
{
	memset(k, 0, sizeof(*k));
	k->kind = DISK_KIND_PREFIX;
	k->layout_id = disk_layout_id(&eng->layout);
	k->tenant = eng->disk_tenant;
	memcpy(k->hash, hash, 32);
}

struct frame_src {
	struct engine *eng;
	uint32_t frame;
};

/* A device frame the CPU cannot read (cuda's) into the queue: the backend's read. */
static int read_frame(void *arg, void *dst)
{
	struct frame_src *f = arg;
	struct engine *eng = f->eng;
	uint64_t pb = eng->layout.page_bytes;

	return eng->be->read(eng->be_ctx, &eng->mem[KVP_TIER_DEVICE],
			     (uint64_t)f->frame * pb, dst, pb, NULL);
}

void engine_remote_evicted(struct engine *eng, uint32_t frame, const uint8_t hash[32])
{
	const struct tier_mem *dev = &eng->mem[KVP_TIER_DEVICE];
	struct frame_src src = { eng, frame };
	struct remote_key k;

	if (!eng->remote)
		return;
	prefix_key(eng, hash, &k);
	/* -ENOSPC (queue full): dropped and counted there; it can be recomputed. */
	if (dev->host_visible)
		remote_tier_put(eng->remote, &k, (const char *)dev->base +
				(uint64_t)frame * eng->layout.page_bytes);
	else
		remote_tier_put_fill(eng->remote, &k, read_frame, &src);
}

/*
 * A fetched page into device frame `frame`: a memcpy where the CPU can
 * write the device tier (shm), else through a free host frame and the
 * backend's host -> device copy (cuda). 0, or -ENOMEM (no host frame free)
 * / the copy's error: the page is not onloaded.
 */
static int fill_frame(struct engine *eng, uint32_t frame, const void *page)
{
	const struct tier_mem *dev = &eng->mem[KVP_TIER_DEVICE];
	const struct tier_mem *host = &eng->mem[KVP_TIER_HOST];
	uint64_t pb = eng->layout.page_bytes;
	struct copy_run run;
	uint32_t hf;
	int ret;

	if (dev->host_visible) {
		memcpy((char *)dev->base + (uint64_t)frame * pb, page, pb);
		return 0;
	}
	hf = frames_alloc(&eng->frames[KVP_TIER_HOST]);
	if (hf == FRAME_NONE)
		return -ENOMEM;
	memcpy((char *)host->base + (uint64_t)hf * pb, page, pb);
	run = (struct copy_run){ .dst_off = (uint64_t)frame * pb,
				 .src_off = (uint64_t)hf * pb, .bytes = pb };
	ret = eng->be->copy(eng->be_ctx, COPY_H2D, dev, host, &run, 1, NULL);
	frames_free(&eng->frames[KVP_TIER_HOST], hf);
	return ret;
}

/* The keys of pages [hit, hit + m) of tokens' chain. */
static void missing_keys(struct engine *eng, const uint32_t *tokens, uint32_t hit,
			 uint32_t m, const uint32_t *frames, struct remote_key *keys)
{
	static const uint8_t zero[32];
	struct share *s = eng->share;
	const uint8_t *prev = hit ? s->pc[s->sp[frames[hit - 1]].pc].hash : zero;
	uint8_t h[32];

	for (uint32_t i = 0; i < m; i++) {
		pc_hash_page(eng, prev, tokens + (uint64_t)(hit + i) * eng->P, h);
		prefix_key(eng, h, &keys[i]);
		prev = keys[i].hash;
	}
}

/*
 * Onload the fetched run after the local chain's last page `last` (or
 * from the root, FRAME_NONE): device frames (evicting to make room; the
 * chain is held meanwhile so eviction cannot take its parent), the bytes
 * copied in, each page published as an idle entry. Returns pages onloaded.
 */
static uint32_t onload_run(struct engine *eng, uint32_t last,
			   const struct remote_fetch *f)
{
	struct share *s = eng->share;
	uint32_t got = remote_fetch_pages(f), parent, done = 0;
	uint64_t avail;

	if (!got)
		return 0;
	if (last != FRAME_NONE)
		sp_ref(eng, last);
	avail = engine_device_avail(eng, NULL, got);
	if (avail < got)
		got = (uint32_t)avail;
	if (got)
		evict_for_device(eng, got);
	parent = last != FRAME_NONE ? s->sp[last].pc : PC_NONE;
	for (uint32_t i = 0; i < got; i++) {
		const uint8_t *hash = remote_fetch_hash(f, i);
		uint32_t e = pc_find(eng, hash), frame;

		if (e != PC_NONE) { /* published meanwhile (another lookup, a commit) */
			parent = e;
			continue;
		}
		frame = frames_alloc(&eng->frames[KVP_TIER_DEVICE]);
		if (frame == FRAME_NONE)
			break;
		if (fill_frame(eng, frame, remote_fetch_page(f, i))) {
			frames_free(&eng->frames[KVP_TIER_DEVICE], frame);
			break;
		}
		s->sp[frame] = (struct spage){ .refs = 0, .pc = PC_NONE };
		pc_adopt(eng, frame, hash, parent);
		parent = s->sp[frame].pc;
		done++;
	}
	if (last != FRAME_NONE)
		sp_unref(eng, last);
	return done;
}

int remote_prefix_more(struct engine *eng, const uint32_t *tokens, uint32_t full,
		       uint32_t *frames, uint32_t *hit, bool defer)
{
	uint32_t m = full - *hit, last, done, idle;
	struct remote_fetch *f = NULL;
	struct remote_key *keys;
	int ret;

	if (!eng->remote || *hit >= full)
		return 0;
	if (m > eng->share->nframes)
		m = eng->share->nframes;
	keys = malloc(m * sizeof(*keys));
	if (!keys)
		return 0; /* the local answer */
	last = *hit ? frames[*hit - 1] : FRAME_NONE;
	/* A held lookup is retried every few microseconds while its round is
	 * out: one hash tells whether it still is, before hashing the run. */
	missing_keys(eng, tokens, *hit, 1, frames, keys);
	if (defer && remote_tier_pending(eng->remote, &keys[0])) {
		free(keys);
		return -EINPROGRESS;
	}
	missing_keys(eng, tokens, *hit, m, frames, keys);
	ret = remote_tier_fetch(eng->remote, keys, m, &f);
	free(keys);
	if (ret == -EINPROGRESS && defer)
		return -EINPROGRESS;
	if (ret)
		return 0; /* queued for a later lookup, or no memory: local */
	done = onload_run(eng, last, f);
	remote_fetch_done(eng->remote, f, done);
	if (done)
		*hit = pc_match(eng, tokens, full, frames, &idle);
	return 0;
}
