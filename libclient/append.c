/* SPDX-License-Identifier: MIT */
/*
 * append.c - the data op: write a lease's new tokens straight into the
 * mapped device tier, with no round trip to the daemon.
 *
 * New token i of a lease sits at history position q = len + i (counted from
 * the history's start): page q / page_tokens of the lease's page table, slot
 * q % page_tokens of that page's frame. The page table lives in the arena,
 * which the daemon can write, so each frame index is read once, checked
 * against the device tier's frame count and only then used; the lease
 * itself is the caller's memory and is checked against the arena too.
 *
 * The shm backend only: on the cuda backend the tier is GPU memory and the
 * caller's own kernel (kvp_append_cuda) writes it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>

#include "client_internal.h"

#define APPEND_BATCH 256u /* slots computed per kvp_append_cpu() call */

/* The lease's page table must be one the daemon wrote into our arena. */
static int table_in_arena(const struct kvp_client *c, const struct kvp_lease *l)
{
	const unsigned char *p = (const unsigned char *)l->indices;
	const uint64_t bytes = (uint64_t)l->npages * sizeof(int32_t);

	return p >= c->arena && bytes <= c->arena_bytes &&
	       (uint64_t)(p - c->arena) <= c->arena_bytes - bytes;
}

KVP_PUBLIC
int kvp_append(struct kvp_client *c, const struct kvp_lease *l, uint32_t first,
	       uint32_t n, const void *kv)
{
	const uint32_t P = c->layout.page_tokens;
	const uint32_t frames = c->tier_frames[KVP_TIER_DEVICE];
	const unsigned char *src = kv;
	struct kvp_slot slots[APPEND_BATCH];
	uint64_t q0;
	int ret;

	ret = kvpc_check_dead(c);
	if (ret)
		return ret;
	if (!c->device)
		return c->device_fd >= 0 ?
		       kvpc_err(c, -EOPNOTSUPP,
				"append: the %s backend's device tier is not host "
				"memory; write it with your own kernel (kvp_append_cuda)",
				c->backend) :
		       kvpc_err(c, -ENODEV,
				"append: this client has no device tier (no tenant: an "
				"admin-only client)");
	if (!l || !l->indices || (n && !kv))
		return kvpc_err(c, -EINVAL, "append: NULL lease, page table or data");
	if (first > l->n_new || n > l->n_new - first)
		return kvpc_err(c, -EINVAL,
				"append: tokens [%" PRIu32 ", %" PRIu64 ") are outside the "
				"%" PRIu32 " new tokens of lease %" PRIu64, first,
				(uint64_t)first + n, l->n_new, l->id);
	if (!table_in_arena(c, l) || l->len > UINT64_MAX / 2 ||
	    (l->len + l->n_new + P - 1) / P > l->npages)
		return kvpc_err(c, -EINVAL,
				"append: lease %" PRIu64 " is not one kvp_prepare() or "
				"kvp_reap() filled in (or no longer valid)", l->id);

	q0 = l->len + first;
	for (uint32_t done = 0; done < n;) {
		uint32_t m = n - done < APPEND_BATCH ? n - done : APPEND_BATCH;

		for (uint32_t i = 0; i < m; i++) {
			uint64_t q = q0 + done + i;
			/* Read once from the arena, checked, then used. Relaxed:
			 * the acquire of cq_tail (A1) that delivered the lease
			 * already ordered the daemon's write of it. */
			int32_t f = __atomic_load_n(&l->indices[q / P], __ATOMIC_RELAXED);

			if (f < 0 || (uint32_t)f >= frames)
				return kvpc_err(c, -EINVAL,
						"append: lease %" PRIu64 " page %" PRIu64
						" names frame %" PRId32 ", outside the %" PRIu32
						" frames of the device tier", l->id, q / P, f,
						frames);
			slots[i].frame = (uint32_t)f;
			slots[i].slot = (uint32_t)(q % P);
		}
		kvp_append_cpu(&c->layout, c->device, slots, m,
			       src + (size_t)done * c->layout.token_bytes);
		done += m;
	}
	c->err[0] = '\0';
	return 0;
}
