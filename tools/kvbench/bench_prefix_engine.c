/* SPDX-License-Identifier: MIT */
/*
 * bench_prefix_engine.c - the "inproc" target of `kvbench prefix`: one
 * engine on the shm backend in this process, the sharing calls made
 * directly (share_* of daemon/engine/include/share.h), no daemon, no ring, no socket. What
 * it measures is the engine's own cost; the kvpoold target adds the IPC.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "kvp_kernels.h"
#include "kvpool_engine.h"
#include "prefix_bench.h"

#define OWNER 1

struct eng_ctx {
	struct engine *eng;
	struct errbuf e;
	const struct kvp_layout *l;
	void *base;
	struct kvp_slot *slots;
	uint32_t nslots;
};

static void lease_out(const struct engine_lease *el, struct pb_lease *out)
{
	out->id = el->id;
	out->len = el->len;
	out->n_new = el->n_new;
	out->npages = el->npages;
	out->frames = el->frames;
}

static int e_seq_alloc(void *ctx, uint64_t seq, const uint32_t *tokens, uint32_t n,
		       struct pb_lease *out)
{
	struct eng_ctx *x = ctx;
	struct engine_lease el;
	int rc = share_seq_alloc(x->eng, seq, tokens, n, OWNER, &el, &x->e);

	if (rc >= 0)
		lease_out(&el, out);
	return rc;
}

static int e_seq_extend(void *ctx, uint64_t seq, const uint32_t *tokens, uint32_t n,
			struct pb_lease *out)
{
	struct eng_ctx *x = ctx;
	struct engine_lease el;
	int rc = share_seq_extend(x->eng, seq, n, tokens, OWNER, &el, &x->e);

	if (rc >= 0)
		lease_out(&el, out);
	return rc;
}

static int e_seq_free(void *ctx, uint64_t seq)
{
	struct eng_ctx *x = ctx;

	return share_seq_free(x->eng, seq, OWNER, &x->e);
}

static int e_append(void *ctx, const struct pb_lease *l, uint32_t n, const void *kv)
{
	struct eng_ctx *x = ctx;
	int rc;

	if (n > x->nslots) {
		struct kvp_slot *s = realloc(x->slots, n * sizeof(*s));

		if (!s)
			return errbuf_set(&x->e, -ENOMEM, "no memory for %u slots", n);
		x->slots = s;
		x->nslots = n;
	}
	rc = engine_lease_slots(x->eng, l->id, 0, n, x->slots, &x->e);
	if (rc < 0)
		return rc;
	kvp_append_cpu(x->l, x->base, x->slots, n, kv);
	return 0;
}

static int e_commit(void *ctx, uint64_t lease, uint32_t n)
{
	struct eng_ctx *x = ctx;

	return engine_commit(x->eng, lease, n, &x->e);
}

static int e_release(void *ctx, uint64_t lease)
{
	struct eng_ctx *x = ctx;

	return engine_release(x->eng, lease, &x->e);
}

static int e_chunk_register(void *ctx, const uint32_t *tokens, uint32_t n, uint32_t type,
			    const char *meta, struct pb_chunk_reg *out)
{
	struct eng_ctx *x = ctx;
	struct share_chunk_reg reg;
	int rc = share_chunk_register(x->eng, tokens, n, type, meta, OWNER, real_ns(),
				      &reg, &x->e);

	if (rc < 0)
		return rc;
	memset(out, 0, sizeof(*out));
	out->id = reg.id;
	out->name = reg.name;
	out->created = reg.created;
	if (reg.created)
		lease_out(&reg.lease, &out->lease);
	return rc;
}

static int e_chunk_link(void *ctx, const struct kvp_chunk_id *name,
			const struct kvp_chunk_id *parent, struct pb_chunk_reg *out)
{
	struct eng_ctx *x = ctx;
	struct share_chunk_reg reg;
	int rc = share_chunk_link(x->eng, name, parent, OWNER, real_ns(), &reg,
				  &x->e);

	if (rc < 0)
		return rc;
	memset(out, 0, sizeof(*out));
	out->id = reg.id;
	out->name = reg.name;
	out->created = reg.created;
	if (reg.created)
		lease_out(&reg.lease, &out->lease);
	return rc;
}

static int e_chunk_seal(void *ctx, const struct pb_chunk_reg *reg)
{
	struct eng_ctx *x = ctx;

	return share_chunk_seal(x->eng, reg->lease.id, OWNER, &x->e);
}

static int e_chunk_delete(void *ctx, const struct kvp_chunk_id *id)
{
	struct eng_ctx *x = ctx;

	return share_chunk_delete(x->eng, id, &x->e);
}

static int e_compose(void *ctx, const struct kvp_compose_req *req, struct pb_comp *out)
{
	struct eng_ctx *x = ctx;
	struct share_composition c;
	int rc = share_compose(x->eng, req, 1, false, OWNER, real_ns(), &c, &x->e);

	if (rc < 0)
		return rc;
	out->lease = c.lease;
	out->nlevels = c.nlevels;
	out->tokens = c.tokens;
	out->pages = c.pages;
	for (uint32_t l = 0; l < c.nlevels && l < KVP_COMPOSE_MAX_LEVELS; l++) {
		out->ngroups[l] = c.ngroups[l];
		out->kv_indptr[l] = c.kv_indptr[l];
		out->kv_indices[l] = c.kv_indices[l];
		out->kv_last_page_len[l] = c.kv_last_page_len[l];
	}
	return rc;
}

static int e_stats(void *ctx, struct kvp_stats *out)
{
	struct eng_ctx *x = ctx;

	engine_stats(x->eng, out);
	return 0;
}

static int e_check(void *ctx, char *msg, size_t len)
{
	struct eng_ctx *x = ctx;
	int rc = engine_check(x->eng, &x->e);

	snprintf(msg, len, "%s", rc ? x->e.msg : "ok");
	return rc;
}

static const char *e_error(void *ctx)
{
	struct eng_ctx *x = ctx;

	return x->e.msg;
}

int pb_engine_open(struct pb_target *t, const struct prefix_opts *o,
		   uint32_t pool_pages, char *err, size_t errlen)
{
	struct engine_config ec = { .layout = o->layout };
	struct eng_ctx *x = calloc(1, sizeof(*x));
	int rc;

	if (!x) {
		snprintf(err, errlen, "inproc: out of memory");
		return -ENOMEM;
	}
	ec.device_frames = pool_pages;
	ec.host_frames = 0;
	rc = engine_create(&x->eng, &ec, &x->e);
	if (rc) {
		snprintf(err, errlen, "inproc: engine_create (%u pages of %llu B): %s",
			 pool_pages, (unsigned long long)o->layout.page_bytes, x->e.msg);
		free(x);
		return rc;
	}
	x->l = engine_layout(x->eng);
	x->base = engine_tier(x->eng, KVP_TIER_DEVICE)->base;
	memset(t, 0, sizeof(*t));
	t->name = "inproc";
	t->ctx = x;
	t->layout = x->l;
	t->tier_base = x->base;
	t->seq_alloc = e_seq_alloc;
	t->seq_extend = e_seq_extend;
	t->seq_free = e_seq_free;
	t->append = e_append;
	t->commit = e_commit;
	t->release = e_release;
	t->chunk_register = e_chunk_register;
	t->chunk_link = e_chunk_link;
	t->chunk_seal = e_chunk_seal;
	t->chunk_delete = e_chunk_delete;
	t->compose = e_compose;
	t->stats = e_stats;
	t->check = e_check;
	t->error = e_error;
	return 0;
}

void pb_engine_close(struct pb_target *t)
{
	struct eng_ctx *x = t->ctx;

	if (!x)
		return;
	engine_destroy(x->eng);
	free(x->slots);
	free(x);
	t->ctx = NULL;
}
