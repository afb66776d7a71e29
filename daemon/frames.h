/* SPDX-License-Identifier: MIT */
/*
 * frames.h - the frame allocator of one tier: O(1) alloc and free.
 *
 * A tier is an array of equal frames (one page each). Free frames sit on a
 * stack; a fresh allocator hands them out in ascending order so a burst of
 * allocations on an empty tier is contiguous and copies coalesce into runs.
 * A bitmap of used frames catches a double free or a free of a frame never
 * handed out: those are engine bugs and abort loudly.
 */
#ifndef KVPOOL_FRAMES_H
#define KVPOOL_FRAMES_H

#include <stdbool.h>
#include <stdint.h>

#define FRAME_NONE UINT32_MAX

struct frames {
	uint32_t total;
	uint32_t nfree;
	uint32_t *stack; /* stack[0 .. nfree) are free */
	uint64_t *used;  /* bitmap, one bit per frame */
};

/* total may be 0 (an empty tier). Returns 0 or -ENOMEM. */
int frames_init(struct frames *f, uint32_t total);
void frames_fini(struct frames *f);

/* A free frame, or FRAME_NONE when the tier is full. */
uint32_t frames_alloc(struct frames *f);
/* Give frame back; aborts on a frame not in use. */
void frames_free(struct frames *f, uint32_t frame);
bool frames_in_use(const struct frames *f, uint32_t frame);

static inline uint32_t frames_used(const struct frames *f)
{
	return f->total - f->nfree;
}

#endif /* KVPOOL_FRAMES_H */
