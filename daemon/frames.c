/* SPDX-License-Identifier: MIT */
/*
 * frames.c - O(1) frame allocator of one tier (see frames.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "frames.h"

int frames_init(struct frames *f, uint32_t total)
{
	size_t words = ((size_t)total + 63) / 64;

	f->total = total;
	f->nfree = total;
	f->stack = malloc(((size_t)total ? total : 1) * sizeof(*f->stack));
	f->used = calloc(words ? words : 1, sizeof(*f->used));
	if (!f->stack || !f->used) {
		frames_fini(f);
		return -ENOMEM;
	}
	/* Top of the stack is frame 0, so a fresh tier hands out 0, 1, 2, ... */
	for (uint32_t i = 0; i < total; i++)
		f->stack[i] = total - 1 - i;
	return 0;
}

void frames_fini(struct frames *f)
{
	free(f->stack);
	free(f->used);
	f->stack = NULL;
	f->used = NULL;
	f->total = f->nfree = 0;
}

bool frames_in_use(const struct frames *f, uint32_t frame)
{
	return frame < f->total && (f->used[frame / 64] >> (frame % 64) & 1);
}

uint32_t frames_alloc(struct frames *f)
{
	uint32_t frame;

	if (!f->nfree)
		return FRAME_NONE;
	frame = f->stack[--f->nfree];
	f->used[frame / 64] |= 1ull << (frame % 64);
	return frame;
}

void frames_free(struct frames *f, uint32_t frame)
{
	if (!frames_in_use(f, frame)) {
		/* An engine bug: continuing would hand one frame to two pages. */
		fprintf(stderr, "kvpool: BUG: free of frame %u not in use (total %u)\n",
			frame, f->total);
		abort();
	}
	f->used[frame / 64] &= ~(1ull << (frame % 64));
	f->stack[f->nfree++] = frame;
}
