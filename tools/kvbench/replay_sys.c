/* SPDX-License-Identifier: MIT */
/*
 * replay_sys.c - the kvpool systems of `kvbench replay` behind struct
 * rsys_ops: kvpoold through the shared-memory rings (libkvpool's sync
 * calls; commit and release are one ring entry), the same daemon driven
 * over its Unix socket (the uds request mode: one kvp_sqe per message, one
 * kvp_cqe + result back, what a team would build by hand), and the engine
 * in this process (no IPC: the floor). Appends are the same in all three:
 * kvp_append_cpu() into the device tier the lease's page table names.
 *
 * With --backend cuda (rsys_kvpool_cuda_ops) the ring calls are the same and
 * the appends are the GPU's: replay_cuda.c fills the pipeline's device
 * buffer and appends the batch with one kvp_append_batch_async() on the
 * pipeline's stream; the queued commit waits for it (libkvpool's events).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kvp_kernels.h"
#include "kvpool_bench.h"
#include "proto.h"
#include "kvpool_engine.h"
#include "replay.h"
#include "stats.h"

/* ---------------------------------------------------------------- kvpool */

struct kv {
	struct kvp_client *c;
	unsigned char *reply;     /* uds: kvp_cqe + result */
	size_t reply_len;
	uint64_t tag;
	struct rgpu *gpu;         /* cuda backend: stream and device buffer */
	char err[KVP_ERRLEN + 64];
};

int rsys_kvpool_open(void **ctx, const char *socket, bool uds, uint32_t max_pages,
		     uint32_t spin_us, uint64_t gpu_bytes, char *err, size_t errlen)
{
	struct kvp_connect_opts co = { .socket = socket, .spin_us = spin_us,
				       .name = uds ? "kvbench-replay-uds" : "kvbench-replay" };
	struct kv *k = calloc(1, sizeof(*k));
	int rc;

	if (!k) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* The default arena's sync range (2 MiB) holds any page table a
	 * request of the trace asks for (max_pages, at most ~520 entries). */
	(void)max_pages;
	rc = kvp_connect(&k->c, &co, err, errlen);
	if (rc < 0) {
		free(k);
		return rc;
	}
	k->reply_len = sizeof(struct kvp_cqe) + (64u << 10);
	k->reply = malloc(k->reply_len);
	if (!k->reply) {
		rsys_kvpool_close(k);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (gpu_bytes) {
#if REPLAY_CUDA
		rc = rgpu_open(&k->gpu, k->c, gpu_bytes, err, errlen);
#else
		snprintf(err, errlen, "--backend cuda: this kvbench was built without CUDA");
		rc = -EOPNOTSUPP;
#endif
		if (rc) {
			rsys_kvpool_close(k);
			return rc;
		}
	}
	*ctx = k;
	return 0;
}

void rsys_kvpool_close(void *ctx)
{
	struct kv *k = ctx;

	if (!k)
		return;
#if REPLAY_CUDA
	/* Before the detach: the buffer and stream live in the pool's context. */
	if (k->gpu)
		rgpu_close(k->gpu);
#endif
	if (k->c)
		kvp_close(k->c);
	free(k->reply);
	free(k);
}

static const char *kv_error(void *ctx)
{
	struct kv *k = ctx;

	return k->err[0] ? k->err : kvp_last_error(k->c);
}

static int ring_info(void *ctx, uint64_t key, uint64_t *len)
{
	struct kv *k = ctx;
	struct kvp_user_info i;
	int rc = kvp_info(k->c, key, &i);

	k->err[0] = '\0';
	*len = i.start + i.len;
	return rc < 0 ? rc : 0;
}

static void lease_from(struct rlease *l, const struct kvp_lease *kl)
{
	l->id = kl->id;
	l->start = kl->start;
	l->len = kl->len;
	l->n_new = kl->n_new;
	l->npages = kl->npages;
	l->last_page_len = kl->last_page_len;
	l->onloaded_pages = kl->onloaded_pages;
	l->kl = *kl;
}

static int ring_prepare(void *ctx, uint64_t key, uint64_t pos, uint32_t n_new,
			struct rlease *l)
{
	struct kv *k = ctx;
	struct kvp_lease kl;
	int rc = kvp_prepare(k->c, key, pos, n_new, &kl);

	k->err[0] = '\0';
	if (rc < 0)
		return rc;
	lease_from(l, &kl);
	l->key = key;
	/* The page table lives in the arena until the next call: keep a copy. */
	memcpy(l->idx, kl.indices, kl.npages * sizeof(int32_t));
	return 0;
}

/*
 * The append of both kvpool paths: the slots from the lease's page table
 * (our copy: the ring's arena copy is gone after the next call, and uds has
 * none), then kvp_append_cpu() into the mapped device tier, exactly what
 * kvp_append() does after its checks.
 */
static int kv_append(void *ctx, struct rlease *l, const void *kv)
{
	struct kv *k = ctx;
	const struct kvp_layout *lay = kvp_client_layout(k->c);
	const uint32_t P = lay->page_tokens;
	uint32_t done = 0;

	k->err[0] = '\0';
	while (done < l->n_new) {
		struct kvp_slot slots[256];
		uint32_t n = l->n_new - done < 256 ? l->n_new - done : 256;

		for (uint32_t i = 0; i < n; i++) {
			uint64_t q = l->len + done + i;

			if (q / P >= l->npages) {
				snprintf(k->err, sizeof(k->err), "token %" PRIu64 " past the lease's "
					 "%u pages", q, l->npages);
				return -EINVAL;
			}
			slots[i].frame = (uint32_t)l->idx[q / P];
			slots[i].slot = (uint32_t)(q % P);
		}
		kvp_append_cpu(lay, kvp_device_base(k->c), slots, n,
			       (const unsigned char *)kv + (uint64_t)done * lay->token_bytes);
		done += n;
	}
	return 0;
}

/* Commit and release in one ring entry (the commit's release flag). */
static int ring_commit(void *ctx, struct rlease *l)
{
	struct kv *k = ctx;
	struct kvp_completion cq;
	int rc;

	k->err[0] = '\0';
	rc = kvp_queue_commit(k->c, l->id, l->n_new, 1, 0);
	if (rc >= 0)
		rc = kvp_submit(k->c);
	if (rc >= 0)
		rc = kvp_reap(k->c, &cq, 1, 1);
	if (rc < 0)
		return rc;
	if (cq.res < 0) {
		snprintf(k->err, sizeof(k->err), "%s", cq.error ? cq.error : "?");
		return cq.res;
	}
	return 0;
}

static int ring_release(void *ctx, struct rlease *l)
{
	struct kv *k = ctx;

	k->err[0] = '\0';
	return kvp_release(k->c, l->id) < 0 ? -EIO : 0;
}

/*
 * The batched calls: queue every item, one kvp_submit (one wake-up of the
 * daemon at most), then reap; an item's latency runs from the submit to the
 * reap that returned its completion.
 */
static int ring_submit_reap(struct kv *k, struct rbatch_item *it, uint32_t n)
{
	struct kvp_completion cq[64];
	uint64_t t0;
	uint32_t got = 0;
	int rc;

	t0 = now_ns();
	rc = kvp_submit(k->c);
	if (rc < 0)
		return rc;
	while (got < n) {
		rc = kvp_reap(k->c, cq, 64, 1);
		if (rc < 0)
			return rc;
		for (int i = 0; i < rc; i++) {
			struct rbatch_item *x = &it[cq[i].tag];

			x->lat_ns = now_ns() - t0;
			x->rc = cq[i].res < 0 ? cq[i].res : 0;
			if (cq[i].res < 0)
				snprintf(k->err, sizeof(k->err), "%s", cq[i].error ? cq[i].error : "?");
			else if (cq[i].op == KVP_ASYNC_INFO)
				x->len = cq[i].info.start + cq[i].info.len;
			else if (cq[i].op == KVP_ASYNC_PREPARE) {
				/* Valid until the next submit: copy the page table now. */
				lease_from(x->l, &cq[i].lease);
				x->l->key = x->key;
				memcpy(x->l->idx, cq[i].lease.indices,
				       cq[i].lease.npages * sizeof(int32_t));
			}
		}
		got += (uint32_t)rc;
	}
	return 0;
}

static int ring_info_batch(void *ctx, struct rbatch_item *it, uint32_t n)
{
	struct kv *k = ctx;

	k->err[0] = '\0';
	for (uint32_t i = 0; i < n; i++) {
		int rc = kvp_queue_info(k->c, it[i].key, i);

		if (rc < 0)
			return rc;
	}
	return ring_submit_reap(k, it, n);
}

static int ring_prepare_batch(void *ctx, struct rbatch_item *it, uint32_t n)
{
	struct kv *k = ctx;

	k->err[0] = '\0';
	for (uint32_t i = 0; i < n; i++) {
		int rc = kvp_queue_prepare(k->c, it[i].key, it[i].pos, it[i].n_new, i);

		if (rc < 0)
			return rc;
	}
	return ring_submit_reap(k, it, n);
}

static int ring_commit_batch(void *ctx, struct rbatch_item *it, uint32_t n)
{
	struct kv *k = ctx;

	k->err[0] = '\0';
	for (uint32_t i = 0; i < n; i++) {
		int rc = kvp_queue_commit(k->c, it[i].l->id, it[i].l->n_new, 1, i);

		if (rc < 0)
			return rc;
	}
	return ring_submit_reap(k, it, n);
}

const struct rsys_ops rsys_kvpool_ops = {
	.name = "kvpool", .info = ring_info, .prepare = ring_prepare,
	.append = kv_append, .commit = ring_commit, .release = ring_release,
	.error = kv_error, .info_batch = ring_info_batch,
	.prepare_batch = ring_prepare_batch, .commit_batch = ring_commit_batch,
};

#if REPLAY_CUDA
/* The GPU appends: the leases as libkvpool returned them (l->kl). */
static int gpu_append(void *ctx, struct rlease *l, const void *kv)
{
	struct kv *k = ctx;

	k->err[0] = '\0';
	return rgpu_append(k->gpu, k->c, &l, 1, k->err, sizeof(k->err));
}

static int gpu_append_batch(void *ctx, struct rlease *const *l, uint32_t n)
{
	struct kv *k = ctx;

	k->err[0] = '\0';
	return rgpu_append(k->gpu, k->c, l, n, k->err, sizeof(k->err));
}

const struct rsys_ops rsys_kvpool_cuda_ops = {
	.name = "kvpool", .info = ring_info, .prepare = ring_prepare,
	.append = gpu_append, .commit = ring_commit, .release = ring_release,
	.error = kv_error, .info_batch = ring_info_batch,
	.prepare_batch = ring_prepare_batch, .commit_batch = ring_commit_batch,
	.append_batch = gpu_append_batch,
};
#endif

/* ---------------------------------------------------------------- uds */

/* One request on the attach socket; the reply's result bytes in k->reply. */
static int uds_call(struct kv *k, struct kvp_sqe *q, struct kvp_cqe *cqe,
		    const void **out)
{
	ssize_t n;

	q->tag = ++k->tag;
	k->err[0] = '\0';
	n = send(kvpb_socket(k->c), q, sizeof(*q), MSG_NOSIGNAL);
	if (n != (ssize_t)sizeof(*q)) {
		snprintf(k->err, sizeof(k->err), "uds send: %s", n < 0 ? strerror(errno) : "short");
		return n < 0 ? -errno : -EIO;
	}
	do
		n = recv(kvpb_socket(k->c), k->reply, k->reply_len, 0);
	while (n < 0 && errno == EINTR);
	if (n < (ssize_t)sizeof(*cqe)) {
		snprintf(k->err, sizeof(k->err), "uds recv: %s", n < 0 ? strerror(errno) :
			 n == 0 ? "kvpoold hung up" : "reply shorter than a kvp_cqe");
		return n < 0 ? -errno : -EPROTO;
	}
	memcpy(cqe, k->reply, sizeof(*cqe));
	if (cqe->tag != q->tag || (size_t)n != sizeof(*cqe) + cqe->out_bytes) {
		snprintf(k->err, sizeof(k->err), "uds: malformed reply (%zd bytes, tag %" PRIu64
			 ", sent %" PRIu64 ")", n, cqe->tag, q->tag);
		return -EPROTO;
	}
	*out = k->reply + sizeof(*cqe);
	if (cqe->res < 0) {
		snprintf(k->err, sizeof(k->err), "%.*s", (int)cqe->out_bytes, (const char *)*out);
		return cqe->res;
	}
	return 0;
}

static int uds_info(void *ctx, uint64_t key, uint64_t *len)
{
	struct kvp_sqe q = { .opcode = KVP_OP_INFO, .user = key,
			     .out_len = sizeof(struct kvp_user_info) };
	struct kvp_user_info i;
	struct kvp_cqe cqe;
	const void *out;
	int rc = uds_call(ctx, &q, &cqe, &out);

	if (rc)
		return rc;
	memcpy(&i, out, sizeof(i));
	*len = i.start + i.len;
	return 0;
}

static int uds_prepare(void *ctx, uint64_t key, uint64_t pos, uint32_t n_new,
		       struct rlease *l)
{
	struct kv *k = ctx;
	struct kvp_sqe q = { .opcode = KVP_OP_PREPARE, .user = key, .arg = pos, .n = n_new,
			     .out_len = 64u << 10 };
	struct kvp_prepare_out po;
	struct kvp_cqe cqe;
	const void *out;
	int rc = uds_call(k, &q, &cqe, &out);

	if (rc)
		return rc;
	memcpy(&po, out, sizeof(po));
	if (cqe.out_bytes < sizeof(po) + po.npages * sizeof(int32_t)) {
		snprintf(k->err, sizeof(k->err), "uds: prepare reply of %u bytes for %u pages",
			 cqe.out_bytes, po.npages);
		return -EPROTO;
	}
	*l = (struct rlease){ .key = key, .id = po.lease, .start = po.start, .len = po.len,
			      .n_new = po.n_new, .npages = po.npages,
			      .last_page_len = po.last_page_len,
			      .onloaded_pages = po.onloaded_pages, .idx = l->idx, .tail = l->tail };
	memcpy(l->idx, (const unsigned char *)out + sizeof(po), po.npages * sizeof(int32_t));
	return 0;
}

static int uds_commit(void *ctx, struct rlease *l)
{
	struct kvp_sqe q = { .opcode = KVP_OP_COMMIT, .flags = KVP_SQE_RELEASE,
			     .arg = l->id, .n = l->n_new, .out_len = KVP_ERRLEN };
	struct kvp_cqe cqe;
	const void *out;

	return uds_call(ctx, &q, &cqe, &out);
}

static int uds_release(void *ctx, struct rlease *l)
{
	struct kvp_sqe q = { .opcode = KVP_OP_RELEASE, .arg = l->id, .out_len = KVP_ERRLEN };
	struct kvp_cqe cqe;
	const void *out;

	return uds_call(ctx, &q, &cqe, &out);
}

const struct rsys_ops rsys_uds_ops = {
	.name = "uds", .info = uds_info, .prepare = uds_prepare,
	.append = kv_append, .commit = uds_commit, .release = uds_release,
	.error = kv_error,
};

/* ---------------------------------------------------------------- inproc */

struct inproc {
	struct engine *eng;
	struct kvp_slot *slots;
	uint32_t max_tokens;
	void *tier;
	struct errbuf e;
};

int rsys_inproc_open(void **ctx, const struct kvp_layout *l, uint32_t device_pages,
		     uint32_t host_pages, uint32_t max_pages, char *err, size_t errlen)
{
	struct engine_config cfg = { .layout = *l, .device_frames = device_pages,
				     .host_frames = host_pages };
	struct inproc *ip = calloc(1, sizeof(*ip));
	int rc;

	if (!ip) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ip->max_tokens = max_pages * l->page_tokens;
	ip->slots = calloc(ip->max_tokens, sizeof(*ip->slots));
	rc = ip->slots ? engine_create(&ip->eng, &cfg, &ip->e) : -ENOMEM;
	if (rc) {
		snprintf(err, errlen, "in-process engine of %u + %u pages: %s", device_pages,
			 host_pages, ip->slots ? ip->e.msg : "out of memory");
		free(ip->slots);
		free(ip);
		return rc;
	}
	ip->tier = engine_tier(ip->eng, KVP_TIER_DEVICE)->base;
	*ctx = ip;
	return 0;
}

void rsys_inproc_close(void *ctx)
{
	struct inproc *ip = ctx;

	if (!ip)
		return;
	engine_destroy(ip->eng);
	free(ip->slots);
	free(ip);
}

void rsys_inproc_stats(void *ctx, struct kvp_stats *out)
{
	engine_stats(((struct inproc *)ctx)->eng, out);
}

static const char *ip_error(void *ctx)
{
	return ((struct inproc *)ctx)->e.msg;
}

static int ip_info(void *ctx, uint64_t key, uint64_t *len)
{
	struct inproc *ip = ctx;
	struct engine_user_info i;

	engine_info(ip->eng, key, &i);
	*len = i.start + i.len;
	return 0;
}

static int ip_prepare(void *ctx, uint64_t key, uint64_t pos, uint32_t n_new,
		      struct rlease *l)
{
	struct inproc *ip = ctx;
	struct engine_lease el;
	int rc;

	ip->e.msg[0] = '\0';
	rc = engine_prepare(ip->eng, key, pos, n_new, 0, &el, &ip->e);
	if (rc)
		return rc;
	/* The shm backend's onload lands at once; a fence would be waited for. */
	if (el.fence)
		engine_fence_wait(ip->eng, el.fence);
	*l = (struct rlease){ .key = key, .id = el.id, .start = el.start, .len = el.len,
			      .n_new = el.n_new, .npages = el.npages,
			      .last_page_len = el.last_page_len,
			      .onloaded_pages = el.onloaded_pages, .idx = l->idx, .tail = l->tail };
	for (uint32_t i = 0; i < el.npages; i++)
		l->idx[i] = (int32_t)el.frames[i];
	return 0;
}

static int ip_append(void *ctx, struct rlease *l, const void *kv)
{
	struct inproc *ip = ctx;
	int rc;

	if (l->n_new > ip->max_tokens) {
		snprintf(ip->e.msg, sizeof(ip->e.msg), "%u new tokens, more than the %u "
			 "planned for", l->n_new, ip->max_tokens);
		return -E2BIG;
	}
	rc = engine_lease_slots(ip->eng, l->id, 0, l->n_new, ip->slots, &ip->e);
	if (rc)
		return rc;
	kvp_append_cpu(engine_layout(ip->eng), ip->tier, ip->slots, l->n_new, kv);
	return 0;
}

static int ip_commit(void *ctx, struct rlease *l)
{
	struct inproc *ip = ctx;
	int rc = l->n_new ? engine_commit(ip->eng, l->id, l->n_new, &ip->e) : 0;

	return rc ? rc : engine_release(ip->eng, l->id, &ip->e);
}

static int ip_release(void *ctx, struct rlease *l)
{
	struct inproc *ip = ctx;

	return engine_release(ip->eng, l->id, &ip->e);
}

const struct rsys_ops rsys_inproc_ops = {
	.name = "inproc", .info = ip_info, .prepare = ip_prepare,
	.append = ip_append, .commit = ip_commit, .release = ip_release,
	.error = ip_error,
};
