/* SPDX-License-Identifier: MIT */
/*
 * bench_prefix_client.c - the "kvpoold" target of `kvbench prefix`: a
 * private kvpoold per workload (daemon_proc.h: fresh socket, shm backend,
 * the workload's pool size and layout, no host tier) and one client of it
 * making the public sharing calls (kvp_seq_alloc, kvp_chunk_register,
 * kvp_compose, ...). The KV is written with kvp_append into the device tier
 * the client maps, exactly as an application on the shm backend would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_proc.h"
#include "prefix_bench.h"

struct cli_ctx {
	struct kvb_daemon d;
	struct kvp_client *c;
	char err[KVP_ERRLEN];
};

static void lease_out(const struct kvp_lease *kl, struct pb_lease *out)
{
	out->id = kl->id;
	out->len = kl->len;
	out->n_new = kl->n_new;
	out->npages = kl->npages;
	/* int32 and uint32 frames: the same object representation. */
	out->frames = (const uint32_t *)kl->indices;
	out->klease = *kl;
}

static int c_seq_alloc(void *ctx, uint64_t seq, const uint32_t *tokens, uint32_t n,
		       struct pb_lease *out)
{
	struct cli_ctx *x = ctx;
	struct kvp_lease kl;
	int rc = kvp_seq_alloc(x->c, seq, tokens, n, &kl);

	if (rc >= 0)
		lease_out(&kl, out);
	return rc;
}

static int c_seq_extend(void *ctx, uint64_t seq, const uint32_t *tokens, uint32_t n,
			struct pb_lease *out)
{
	struct cli_ctx *x = ctx;
	struct kvp_lease kl;
	int rc = kvp_seq_extend(x->c, seq, n, tokens, &kl);

	if (rc >= 0)
		lease_out(&kl, out);
	return rc;
}

static int c_seq_free(void *ctx, uint64_t seq)
{
	struct cli_ctx *x = ctx;

	return kvp_seq_free(x->c, seq);
}

static int c_append(void *ctx, const struct pb_lease *l, uint32_t n, const void *kv)
{
	struct cli_ctx *x = ctx;

	return kvp_append(x->c, &l->klease, 0, n, kv);
}

static int c_commit(void *ctx, uint64_t lease, uint32_t n)
{
	struct cli_ctx *x = ctx;

	return kvp_commit(x->c, lease, n);
}

static int c_release(void *ctx, uint64_t lease)
{
	struct cli_ctx *x = ctx;

	return kvp_release(x->c, lease);
}

static int c_chunk_register(void *ctx, const uint32_t *tokens, uint32_t n, uint32_t type,
			    const char *meta, struct pb_chunk_reg *out)
{
	struct cli_ctx *x = ctx;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = kvp_chunk_register(x->c, tokens, n, type, meta, &out->creg);
	if (rc < 0)
		return rc;
	out->id = out->creg.id;
	out->name = out->creg.name;
	out->created = out->creg.created != 0;
	if (out->created)
		lease_out(&out->creg.lease, &out->lease);
	return rc;
}

static int c_chunk_link(void *ctx, const struct kvp_chunk_id *name,
			const struct kvp_chunk_id *parent, struct pb_chunk_reg *out)
{
	struct cli_ctx *x = ctx;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = kvp_chunk_link(x->c, name, parent, 1000, &out->creg);
	if (rc < 0)
		return rc;
	out->id = out->creg.id;
	out->name = out->creg.name;
	out->created = out->creg.created != 0;
	if (out->created)
		lease_out(&out->creg.lease, &out->lease);
	return rc;
}

static int c_chunk_seal(void *ctx, const struct pb_chunk_reg *reg)
{
	struct cli_ctx *x = ctx;

	return kvp_chunk_seal(x->c, &reg->creg);
}

static int c_chunk_delete(void *ctx, const struct kvp_chunk_id *id)
{
	struct cli_ctx *x = ctx;

	return kvp_chunk_delete(x->c, id);
}

static int c_compose(void *ctx, const struct kvp_compose_req *req, struct pb_comp *out)
{
	struct cli_ctx *x = ctx;
	struct kvp_composition c;
	int rc = kvp_compose(x->c, req, 1, &c);

	if (rc < 0)
		return rc;
	out->lease = c.lease;
	out->nlevels = c.nlevels;
	out->tokens = c.tokens;
	out->pages = c.pages;
	for (uint32_t l = 0; l < c.nlevels && l < KVP_COMPOSE_MAX_LEVELS; l++) {
		out->ngroups[l] = c.level[l].ngroups;
		out->kv_indptr[l] = c.level[l].kv_indptr;
		out->kv_indices[l] = c.level[l].kv_indices;
		out->kv_last_page_len[l] = c.level[l].kv_last_page_len;
	}
	return rc;
}

static int c_stats(void *ctx, struct kvp_stats *out)
{
	struct cli_ctx *x = ctx;

	return kvp_stats(x->c, 0, out);
}

static const char *c_error(void *ctx)
{
	struct cli_ctx *x = ctx;

	return kvp_last_error(x->c);
}

int pb_client_open(struct pb_target *t, const struct prefix_opts *o,
		   uint32_t pool_pages, char *err, size_t errlen)
{
	struct kvb_daemon_opts dopts = {
		.kvpoold = o->kvpoold,
		.spin_us = -1,
		.device_mem = (uint64_t)pool_pages * o->layout.page_bytes,
		.host_mem = 0,
		.layout = o->layout_spec,
		.cpu = -1,
	};
	struct kvp_connect_opts copts = { .name = "kvbench-prefix" };
	struct cli_ctx *x = calloc(1, sizeof(*x));
	char derr[KVP_ERRLEN];
	int rc;

	if (!x) {
		snprintf(err, errlen, "kvpoold: out of memory");
		return -ENOMEM;
	}
	rc = kvb_daemon_open(&x->d, &dopts, &copts.socket, derr, sizeof(derr));
	if (rc) {
		snprintf(err, errlen, "kvpoold: %s", derr);
		free(x);
		return rc;
	}
	rc = kvp_connect(&x->c, &copts, derr, sizeof(derr));
	if (rc) {
		snprintf(err, errlen, "kvpoold: connect: %s", derr);
		kvb_daemon_stop(&x->d, 5000, derr, sizeof(derr));
		free(x);
		return rc;
	}
	memset(t, 0, sizeof(*t));
	t->name = "kvpoold";
	t->ctx = x;
	t->layout = kvp_client_layout(x->c);
	t->tier_base = kvp_device_base(x->c);
	t->seq_alloc = c_seq_alloc;
	t->seq_extend = c_seq_extend;
	t->seq_free = c_seq_free;
	t->append = c_append;
	t->commit = c_commit;
	t->release = c_release;
	t->chunk_register = c_chunk_register;
	t->chunk_link = c_chunk_link;
	t->chunk_seal = c_chunk_seal;
	t->chunk_delete = c_chunk_delete;
	t->compose = c_compose;
	t->stats = c_stats;
	t->check = NULL;
	t->error = c_error;
	return 0;
}

void pb_client_close(struct pb_target *t)
{
	struct cli_ctx *x = t->ctx;
	char err[KVP_ERRLEN];

	if (!x)
		return;
	kvp_close(x->c);
	if (kvb_daemon_stop(&x->d, 5000, err, sizeof(err)))
		fprintf(stderr, "kvbench prefix: kvpoold: %s\n", err);
	free(x);
	t->ctx = NULL;
}
