/* SPDX-License-Identifier: MIT */
/*
 * append.c - the data ops: write a lease's new tokens straight into the
 * mapped device tier, with no round trip to the daemon.
 *
 * New token i of a lease sits at history position q = len + i (counted from
 * the history's start): page q / page_tokens of the lease's page table, slot
 * q % page_tokens of that page's frame. The caller's struct kvp_lease is
 * trusted for nothing but its id: the lease's record (lease.c,
 * client_internal.h THE LEASE RECORD) says whether this client holds that
 * lease open, how many new tokens it has, and its page table (a private
 * copy made when the lease was granted). Each frame is checked against the
 * device tier's frame count before it is used.
 *
 * ONE CHECK PER APPEND. Each public call below looks every lease up and
 * checks it once (check_range), here, and keeps the record it found; the
 * slots then come from that record (kvpc_lease_slots), and on the cuda
 * backend cuda.c gets the records with the job: it checks nothing again
 * and never calls back into this file. Every call checks all of its
 * ranges and frames before it writes or enqueues anything, so a failed
 * call leaves the tier as it was.
 *
 * shm backend: the tier is host memory and the copies are the CPU
 * reference's (kvp_append_cpu, kvp_append_layers_cpu). cuda backend: the
 * slots are computed here, on the host, into a staging buffer and cuda.c
 * copies them to the device and launches the kernel, all on the caller's
 * stream.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "client_internal.h"
#include "kvp_kernels.h"

#define APPEND_BATCH 256u /* slots computed per kvp_append_cpu() call */

/* A device tier to write into, or why not. */
static int need_tier(struct kvp_client *c, const char *what)
{
	int ret = kvpc_check_dead(c);

	if (ret)
		return ret;
	if (!c->device)
		return kvpc_err(c, -ENODEV,
				"%s: this client has no device tier (no tenant: an "
				"admin-only client)", what);
	return 0;
}

/* The shm backend takes no stream: its copies are the CPU's. */
static int shm_stream(struct kvp_client *c, void *stream, const char *what)
{
	if (stream)
		return kvpc_err(c, -EOPNOTSUPP,
				"%s: kvpoold at %s serves a %s pool in host memory; the "
				"copy is the CPU's, pass a NULL stream", what, c->path,
				c->backend);
	return 0;
}

/*
 * Tokens [first, first + n) of lease l: l must name a lease this client
 * holds open (lease.c: not released, committed, ended by the daemon or
 * another client's), and the range must lie within its own new tokens.
 * Only l->id is read from the caller's struct; the record says the rest.
 */
static int check_range(struct kvp_client *c, const struct kvp_lease *l,
		       uint32_t first, uint32_t n, const char *what,
		       struct kvpc_lease **out)
{
	struct kvpc_lease *r = NULL;
	int ret;

	if (!l)
		return kvpc_err(c, -EINVAL, "%s: NULL lease", what);
	if ((ret = kvpc_lease_open(c, l->id, what, &r)))
		return ret;
	if (first > r->n_new || n > r->n_new - first)
		return kvpc_err(c, -EINVAL,
				"%s: tokens [%" PRIu32 ", %" PRIu64 ") are outside the "
				"%" PRIu32 " new tokens of lease %#" PRIx64, what, first,
				(uint64_t)first + n, r->n_new, r->id);
	*out = r;
	return 0;
}

/* Host slots for n tokens (shm). */
static struct kvp_slot *scratch(struct kvp_client *c, uint32_t n)
{
	if (n > c->scratch_cap) {
		uint32_t cap = n < 1024 ? 1024 : n;
		struct kvp_slot *p = realloc(c->scratch, (size_t)cap * sizeof(*p));

		if (!p) {
			kvpc_err(c, -ENOMEM, "append: out of memory for %" PRIu32 " slots", n);
			return NULL;
		}
		c->scratch = p;
		c->scratch_cap = cap;
	}
	return c->scratch;
}

/* The checked records of a batch's count items (grown on demand). */
static struct kvpc_lease **recs(struct kvp_client *c, uint32_t count)
{
	if (count > c->recs_cap) {
		uint32_t cap = count < 64 ? 64 : count;
		struct kvpc_lease **p = realloc(c->recs, (size_t)cap * sizeof(*p));

		if (!p) {
			kvpc_err(c, -ENOMEM, "append_batch: out of memory for %" PRIu32
				 " items", count);
			return NULL;
		}
		c->recs = p;
		c->recs_cap = cap;
	}
	return c->recs;
}

/* Hand a checked append to the cuda backend: rs[i] is items[i]'s record. */
static int cuda_job(struct kvp_client *c, const struct kvp_append_item *items,
		    struct kvpc_lease *const *rs, uint32_t count, uint32_t n,
		    const void *kv, const void *const *k, const void *const *v,
		    int32_t layer, void *stream, int sync)
{
	const struct kvpc_cuda_job j = { .items = items, .recs = rs,
					 .count = count, .n = n, .kv = kv, .k = k,
					 .v = v, .layer = layer, .stream = stream,
					 .sync = sync };
	int ret;

	if (!n) {
		c->err[0] = '\0';
		return 0;
	}
	ret = kvpc_cuda_append(c, &j);
	if (!ret)
		c->err[0] = '\0';
	return ret;
}

KVP_PUBLIC
int kvp_append(struct kvp_client *c, const struct kvp_lease *l, uint32_t first,
	       uint32_t n, const void *kv)
{
	const unsigned char *src = kv;
	struct kvp_slot slots[APPEND_BATCH];
	struct kvpc_lease *r = NULL;
	int ret;

	if ((ret = need_tier(c, "append")) ||
	    (ret = check_range(c, l, first, n, "append", &r)))
		return ret;
	if (n && !kv)
		return kvpc_err(c, -EINVAL, "append: NULL data for %" PRIu32 " tokens", n);
	if (c->cuda) {
		const struct kvp_append_item item = { l, first, n };

		return cuda_job(c, &item, &r, 1, n, kv, NULL, NULL, -1, NULL, 1);
	}

	for (uint32_t done = 0; done < n;) {
		uint32_t m = n - done < APPEND_BATCH ? n - done : APPEND_BATCH;

		ret = kvpc_lease_slots(c, r, first + done, m, slots);
		if (ret)
			return ret;
		kvp_append_cpu(&c->layout, c->device, slots, m,
			       src + (size_t)done * c->layout.token_bytes);
		done += m;
	}
	c->err[0] = '\0';
	return 0;
}

KVP_PUBLIC
int kvp_append_async(struct kvp_client *c, const struct kvp_lease *l,
		     uint32_t first, uint32_t n, const void *kv, void *stream)
{
	const struct kvp_append_item item = { l, first, n };
	struct kvpc_lease *r = NULL;
	int ret;

	if ((ret = need_tier(c, "append_async")))
		return ret;
	if (!c->cuda)
		return (ret = shm_stream(c, stream, "append_async")) ? ret :
		       kvp_append(c, l, first, n, kv);
	if ((ret = check_range(c, l, first, n, "append_async", &r)))
		return ret;
	if (n && !kv)
		return kvpc_err(c, -EINVAL, "append_async: NULL data for %" PRIu32
				" tokens", n);
	return cuda_job(c, &item, &r, 1, n, kv, NULL, NULL, -1, stream, 0);
}

KVP_PUBLIC
int kvp_append_layers_async(struct kvp_client *c, const struct kvp_lease *l,
			    uint32_t first, uint32_t n, const void *const *k,
			    const void *const *v, void *stream)
{
	const struct kvp_append_item item = { l, first, n };
	struct kvp_slot *slots;
	struct kvpc_lease *r = NULL;
	int ret;

	if ((ret = need_tier(c, "append_layers")) ||
	    (ret = check_range(c, l, first, n, "append_layers", &r)) ||
	    (!c->cuda && (ret = shm_stream(c, stream, "append_layers"))))
		return ret;
	if (!n) {
		c->err[0] = '\0';
		return 0;
	}
	if (!k || !v)
		return kvpc_err(c, -EINVAL, "append_layers: NULL k or v array");
	for (uint32_t i = 0; i < c->layout.layers; i++)
		if (!k[i] || !v[i])
			return kvpc_err(c, -EINVAL,
					"append_layers: NULL %s buffer of layer %" PRIu32,
					k[i] ? "v" : "k", i);
	if (c->cuda)
		return cuda_job(c, &item, &r, 1, n, NULL, k, v, -1, stream, 0);

	if (!(slots = scratch(c, n)))
		return -ENOMEM;
	ret = kvpc_lease_slots(c, r, first, n, slots);
	if (ret)
		return ret;
	kvp_append_layers_cpu(&c->layout, c->device, slots, n, k, v);
	c->err[0] = '\0';
	return 0;
}

KVP_PUBLIC
int kvp_append_layer_async(struct kvp_client *c, const struct kvp_lease *l,
			   uint32_t layer, uint32_t first, uint32_t n,
			   const void *k, const void *v, void *stream)
{
	const struct kvp_append_item item = { l, first, n };
	struct kvpc_lease *r = NULL;
	struct kvp_layout sub;
	struct kvp_slot *slots;
	void *base;
	int ret;

	if ((ret = need_tier(c, "append_layer")) ||
	    (ret = check_range(c, l, first, n, "append_layer", &r)) ||
	    (!c->cuda && (ret = shm_stream(c, stream, "append_layer"))))
		return ret;
	if (layer >= c->layout.layers)
		return kvpc_err(c, -EINVAL, "append_layer: layer %" PRIu32 " of a "
				"layout of %" PRIu32 " layers", layer, c->layout.layers);
	if (!n) {
		c->err[0] = '\0';
		return 0;
	}
	if (!k || !v)
		return kvpc_err(c, -EINVAL, "append_layer: NULL %s buffer of layer %"
				PRIu32, k ? "v" : "k", layer);
	if (c->cuda)
		return cuda_job(c, &item, &r, 1, n, NULL, &k, &v, (int32_t)layer,
				stream, 0);

	if (!(slots = scratch(c, n)))
		return -ENOMEM;
	ret = kvpc_lease_slots(c, r, first, n, slots);
	if (ret)
		return ret;
	base = kvpc_one_layer(&c->layout, layer, c->device, &sub);
	kvp_append_layers_cpu(&sub, base, slots, n, &k, &v);
	c->err[0] = '\0';
	return 0;
}

/* The items at this library's size (kvpool.h, GROWING STRUCTS); a caller
 * built with another one pays for a copy (append_batch_sz below). */
static int append_batch(struct kvp_client *c,
			const struct kvp_append_item *items, uint32_t count,
			const void *kv, void *stream)
{
	struct kvp_slot *slots;
	struct kvpc_lease **rs;
	uint64_t total = 0;
	char what[48];
	int ret;

	if ((ret = need_tier(c, "append_batch")) ||
	    (!c->cuda && (ret = shm_stream(c, stream, "append_batch"))))
		return ret;
	if (count && !items)
		return kvpc_err(c, -EINVAL, "append_batch: NULL items");
	if (count && !(rs = recs(c, count)))
		return -ENOMEM;
	/* The one check of each item: its record is kept for the copy. */
	for (uint32_t i = 0; i < count; i++) {
		snprintf(what, sizeof(what), "append_batch item %" PRIu32, i);
		ret = check_range(c, items[i].lease, items[i].first, items[i].n, what,
				  &rs[i]);
		if (ret)
			return ret;
		total += items[i].n;
	}
	if (total > UINT32_MAX)
		return kvpc_err(c, -EINVAL, "append_batch: %" PRIu64 " tokens in one "
				"batch; at most %" PRIu32, total, UINT32_MAX);
	if (!total) {
		c->err[0] = '\0';
		return 0;
	}
	if (!kv)
		return kvpc_err(c, -EINVAL, "append_batch: NULL data for %" PRIu64
				" tokens", total);
	if (c->cuda)
		return cuda_job(c, items, rs, count, (uint32_t)total, kv, NULL, NULL,
				-1, stream, 0);

	if (!(slots = scratch(c, (uint32_t)total)))
		return -ENOMEM;
	for (uint32_t i = 0, at = 0; i < count; at += items[i].n, i++)
		if ((ret = kvpc_lease_slots(c, rs[i], items[i].first, items[i].n,
					    slots + at)))
			return ret;
	kvp_append_cpu(&c->layout, c->device, slots, (uint32_t)total, kv);
	c->err[0] = '\0';
	return 0;
}

KVP_PUBLIC
int kvp_append_batch_async_sz(struct kvp_client *c,
			      const struct kvp_append_item *items, size_t size,
			      uint32_t count, const void *kv, void *stream)
{
	const struct kvp_append_item *own;
	void *tmp;
	int ret = kvpc_rows_in(c, items, size, sizeof(*items),
			       KVP_APPEND_ITEM_SIZE_VER0, count,
			       (const void **)&own, &tmp, "append_batch");

	if (ret)
		return ret;
	ret = append_batch(c, own, count, kv, stream);
	free(tmp);
	return ret;
}
