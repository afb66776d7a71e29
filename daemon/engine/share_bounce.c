// SPDX-License-Identifier: MIT
/*
 * share_bounce.c - the bytes of shared pages (prefix pages, chunks) to and
 * from memory the CPU can read, for the tiers below the device tier that
 * keep them (the disk tier: share_disk.c; the remote tier:
 * daemon/remote/remote_engine.c).
 *
 * On shm the device tier is host memory and a page is read or written in
 * place. On a GPU (tier_mem.host_visible false) a page goes through host
 * frames taken for the copy ("bounce" frames, the host LRU's oldest
 * histories making room for them, as a demotion would) and one batched
 * copy of the backend each way. The caller holds the engine lock; the
 * copies are synchronous, so the bounce frames are free again on return.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "share_internal.h"

static void *host_frame_ptr(struct engine *eng, uint32_t f)
{
	return (char *)eng->mem[KVP_TIER_HOST].base +
	       (uint64_t)f * eng->layout.page_bytes;
}

void share_bounce_free(struct engine *eng, uint32_t *bounce, uint32_t n)
{
	for (uint32_t i = n; i-- > 0;)
		frames_free(&eng->frames[KVP_TIER_HOST], bounce[i]);
}

/* n host frames for a copy through the host tier, the host LRU's oldest
 * histories going down to disk for them; false: the host tier is all
 * pinned (the caller drops, as without a disk tier). */
static bool bounce_alloc(struct engine *eng, uint32_t *bounce, uint32_t n)
{
	if (!host_make_room(eng, n, NULL))
		return false;
	for (uint32_t i = 0; i < n; i++) {
		bounce[i] = frames_alloc(&eng->frames[KVP_TIER_HOST]);
		if (bounce[i] == FRAME_NONE) {
			share_bounce_free(eng, bounce, i);
			return false;
		}
	}
	return true;
}

/* One copy of n pages between device frames dev[] and host frames host[]. */
static int copy_pages(struct engine *eng, enum copy_dir dir, const uint32_t *dev,
		      const uint32_t *host, uint32_t n)
{
	uint64_t pb = eng->layout.page_bytes;
	struct copy_run *runs = malloc(n * sizeof(*runs));
	struct errbuf e = { .msg = "" };
	uint64_t t0;
	int ret;

	if (!runs)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t d = (uint64_t)dev[i] * pb, h = (uint64_t)host[i] * pb;

		runs[i] = (struct copy_run){ .dst_off = dir == COPY_D2H ? h : d,
					     .src_off = dir == COPY_D2H ? d : h,
					     .bytes = pb };
	}
	t0 = mono_ns();
	ret = eng->be->copy(eng->be_ctx, dir,
			    &eng->mem[dir == COPY_D2H ? KVP_TIER_HOST : KVP_TIER_DEVICE],
			    &eng->mem[dir == COPY_D2H ? KVP_TIER_DEVICE : KVP_TIER_HOST],
			    runs, n, &e);
	free(runs);
	if (ret)
		return ret;
	/* Counted as every copy between the tiers is (stats). */
	if (dir == COPY_D2H) {
		eng->st.bytes_d2h += (uint64_t)n * pb;
		eng->st.ns_d2h += mono_ns() - t0;
	} else {
		eng->st.bytes_h2d += (uint64_t)n * pb;
		eng->st.ns_h2d += mono_ns() - t0; /* a copy that landed at once */
	}
	return 0;
}

bool share_pages_out(struct engine *eng, const uint32_t *dev, uint32_t n,
		      void **out, uint32_t *bounce, bool *bounced)
{
	uint64_t pb = eng->layout.page_bytes;

	*bounced = !eng->mem[KVP_TIER_DEVICE].host_visible;
	if (!*bounced) {
		for (uint32_t i = 0; i < n; i++)
			out[i] = (char *)eng->mem[KVP_TIER_DEVICE].base +
				 (uint64_t)dev[i] * pb;
		return true;
	}
	if (!bounce_alloc(eng, bounce, n))
		return false;
	if (copy_pages(eng, COPY_D2H, dev, bounce, n)) {
		share_bounce_free(eng, bounce, n);
		return false;
	}
	for (uint32_t i = 0; i < n; i++)
		out[i] = host_frame_ptr(eng, bounce[i]);
	return true;
}

/* Pages a copy into the device tier bounces at once: a run longer than
 * the host tier (4,000 Llama-3-8B tokens are 500 MB) goes in pieces. */
#define BOUNCE_BATCH 64u

int share_pages_in(struct engine *eng, const void *const *src, const uint32_t *dev,
		   uint32_t n)
{
	uint64_t pb = eng->layout.page_bytes;
	uint32_t bounce[BOUNCE_BATCH];
	int ret = 0;

	if (eng->mem[KVP_TIER_DEVICE].host_visible) {
		for (uint32_t i = 0; i < n; i++)
			memcpy((char *)eng->mem[KVP_TIER_DEVICE].base +
			       (uint64_t)dev[i] * pb, src[i], pb);
		return 0;
	}
	for (uint32_t done = 0, k; !ret && done < n; done += k) {
		k = n - done < BOUNCE_BATCH ? n - done : BOUNCE_BATCH;
		if (!bounce_alloc(eng, bounce, k))
			return -ENOMEM;
		for (uint32_t i = 0; i < k; i++)
			memcpy(host_frame_ptr(eng, bounce[i]), src[done + i], pb);
		ret = copy_pages(eng, COPY_H2D, dev + done, bounce, k);
		share_bounce_free(eng, bounce, k);
	}
	return ret;
}
