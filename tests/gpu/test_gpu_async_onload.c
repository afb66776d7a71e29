/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_async_onload.c - onload is asynchronous with respect to the ring
 * (issue 4, item 2), through a real kvpoold --backend=cuda:
 *
 *   test_gpu_async_onload KVPOOLD
 *
 * User 1 holds 1 GiB (1024 pages of 1 MiB, random bytes) on the host tier
 * only; its device frames are zeroed. Then, on one client:
 *
 *   1. prepare(1) [onloads 1 GiB], prepare(2), info(2) in one submit: the
 *      two operations on user 2 complete before user 1's prepare (they do
 *      not wait for the copy), and user 1's completion comes only once the
 *      copy has landed: its page table, read at once, holds every byte;
 *   2. prepare(1), info(1), prepare(2): info(1) is held back behind
 *      prepare(1) (same user, same client: submission order), while
 *      prepare(2), another user's, passes both (the worker defers the held
 *      entries and goes on with the ring, kvpoold(8) "Workers and order"):
 *      completions 2, 1, info;
 *   3. a second client's synchronous prepare of user 1, made while the
 *      first client's is in flight, returns only once the bytes are there.
 *
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "clock.h"
#include "gpu_test_util.h"
#include "kvpool.h"

/* HSTU: 1 MiB pages. */
#define LAYOUT "layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32"
#define BIG_PAGES 1024u
#define DEVICE_PAGES 1100u /* --device_mem=1100M */

static int failed;

#define say(...) gpu_test_say("async-onload", __VA_ARGS__)

#define CHECK(cond, ...)                                                \
	do {                                                            \
		if (!(cond)) {                                          \
			say(__VA_ARGS__);                               \
			failed = 1;                                     \
			return -1;                                      \
		}                                                       \
	} while (0)
#define KVP(c, call)                                                    \
	do {                                                            \
		int r_ = (call);                                        \
		CHECK(r_ >= 0, "%s = %d: %s", #call, r_, kvp_last_error(c)); \
	} while (0)
#define CU(call)                                                        \
	do {                                                            \
		cudaError_t e_ = (call);                                \
		CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); \
	} while (0)

static double now_ms(void)
{
	return (double)mono_ns() * 1e-6;
}

struct run {
	struct kvp_client *c, *c2;
	const struct kvp_layout *l;
	unsigned char *dev;      /* kvp_device_base() */
	unsigned char *want;     /* user 1's bytes, page by page */
	unsigned char *got;
	uint32_t frames[BIG_PAGES];
	uint32_t ntok;
};

/* The pages named by frames hold want, read now. */
static int pages_hold(struct run *r, const int32_t *idx, uint32_t n,
		      const char *when)
{
	uint64_t pb = r->l->page_bytes;

	CHECK(n == BIG_PAGES, "%s: %u pages", when, n);
	for (uint32_t i = 0; i < n; i++)
		CU(cudaMemcpy(r->got + i * pb, r->dev + (uint64_t)idx[i] * pb, pb,
			      cudaMemcpyDeviceToHost));
	for (uint32_t i = 0; i < n; i++)
		CHECK(!memcmp(r->got + i * pb, r->want + i * pb, pb),
		      "%s: page %u (device frame %d) does not hold the onloaded "
		      "bytes: the completion came before the copy landed", when, i,
		      idx[i]);
	return 0;
}

/* User 1 off the device again, every device frame zeroed (users 2's
 * bytes too: nobody reads them). */
static int to_host(struct run *r)
{
	KVP(r->c, kvp_evict(r->c, 1, KVP_SEL_DEVICE));
	CU(cudaMemset(r->dev, 0, (uint64_t)DEVICE_PAGES * r->l->page_bytes));
	CU(cudaDeviceSynchronize());
	return 0;
}

static int setup(struct run *r)
{
	uint64_t pb = r->l->page_bytes, bytes = BIG_PAGES * pb;
	struct kvp_lease l;

	r->want = malloc(bytes);
	r->got = malloc(bytes);
	CHECK(r->want && r->got, "out of memory");
	for (uint64_t i = 0; i < bytes; i += 8) {
		uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;

		x ^= x >> 31;
		memcpy(r->want + i, &x, 8);
	}
	r->ntok = BIG_PAGES * r->l->page_tokens;
	KVP(r->c, kvp_prepare(r->c, 1, 0, r->ntok, &l));
	CHECK(l.npages == BIG_PAGES, "%u pages", l.npages);
	for (uint32_t i = 0; i < BIG_PAGES; i++) {
		r->frames[i] = (uint32_t)l.indices[i];
		CU(cudaMemcpy(r->dev + (uint64_t)r->frames[i] * pb, r->want + i * pb,
			      pb, cudaMemcpyHostToDevice));
	}
	CU(cudaDeviceSynchronize());
	KVP(r->c, kvp_commit(r->c, l.id, r->ntok));
	KVP(r->c, kvp_release(r->c, l.id));
	KVP(r->c, kvp_offload(r->c, 1));
	KVP(r->c, kvp_prepare(r->c, 2, 0, 64, &l));
	KVP(r->c, kvp_commit(r->c, l.id, 64));
	KVP(r->c, kvp_release(r->c, l.id));
	return to_host(r);
}

/* Reap n completions: tags in arrival order and when each batch arrived;
 * user 1's page table is checked once the batch it came in is timed (the
 * check reads 1 GiB: it must not delay the next timestamp's meaning). */
static int reap_all(struct run *r, uint32_t n, uint64_t *tags, double *at,
		    uint64_t *leases, double t0)
{
	struct kvp_completion cp[4];

	CHECK(n <= 4, "at most 4");
	for (uint32_t got = 0; got < n;) {
		int k = kvp_reap(r->c, cp, n - got, 1);
		double t = now_ms() - t0;

		KVP(r->c, k);
		for (int j = 0; j < k; j++, got++) {
			CHECK(cp[j].res >= 0, "tag %" PRIu64 ": %s", cp[j].tag,
			      cp[j].error);
			at[got] = t;
			tags[got] = cp[j].tag;
			leases[got] = cp[j].op == KVP_ASYNC_PREPARE ? cp[j].lease.id : 0;
		}
		for (int j = 0; j < k; j++) {
			if (cp[j].op != KVP_ASYNC_PREPARE || cp[j].lease.user != 1)
				continue;
			CHECK(cp[j].lease.onloaded_pages == BIG_PAGES,
			      "onloaded %u pages", cp[j].lease.onloaded_pages);
			if (pages_hold(r, cp[j].lease.indices, cp[j].lease.npages,
				       "completion of prepare(1)"))
				return -1;
		}
	}
	return 0;
}

static int release_all(struct run *r, const uint64_t *leases, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (leases[i])
			KVP(r->c, kvp_release(r->c, leases[i]));
	return 0;
}

static int run_steps(struct run *r)
{
	uint64_t tags[4], leases[4];
	double at[4], t0;

	/* 1: user 2's operations overtake user 1's onload. */
	KVP(r->c, kvp_queue_prepare(r->c, 1, r->ntok, 0, 1));
	KVP(r->c, kvp_queue_prepare(r->c, 2, 64, 0, 2));
	KVP(r->c, kvp_queue_info(r->c, 2, 3));
	t0 = now_ms();
	KVP(r->c, kvp_submit(r->c));
	if (reap_all(r, 3, tags, at, leases, t0))
		return -1;
	say("step 1: completions in order %" PRIu64 ", %" PRIu64 ", %" PRIu64
	    " at %.3f, %.3f, %.3f ms", tags[0], tags[1], tags[2], at[0], at[1],
	    at[2]);
	CHECK(tags[2] == 1, "prepare(1), onloading 1 GiB, completed before "
	      "user 2's operations: they waited for the copy");
	if (release_all(r, leases, 3) || to_host(r))
		return -1;

	/* 2: info(1) waits for prepare(1); prepare(2), behind both on the
	 * ring, passes them. */
	KVP(r->c, kvp_queue_prepare(r->c, 1, r->ntok, 0, 10));
	KVP(r->c, kvp_queue_info(r->c, 1, 11));
	KVP(r->c, kvp_queue_prepare(r->c, 2, 64, 0, 12));
	t0 = now_ms();
	KVP(r->c, kvp_submit(r->c));
	if (reap_all(r, 3, tags, at, leases, t0))
		return -1;
	say("step 2: completions in order %" PRIu64 ", %" PRIu64 ", %" PRIu64
	    " at %.3f, %.3f, %.3f ms", tags[0], tags[1], tags[2], at[0], at[1],
	    at[2]);
	CHECK(tags[0] == 12 && tags[1] == 10 && tags[2] == 11,
	      "info(1) completed before the prepare(1) submitted ahead of it, "
	      "or prepare(2) waited behind user 1's held entries");
	if (release_all(r, leases, 3) || to_host(r))
		return -1;

	/* 3: another client's prepare of user 1 during the onload. */
	{
		struct kvp_completion cp;
		struct kvp_lease l2;
		int k;

		KVP(r->c, kvp_queue_prepare(r->c, 1, r->ntok, 0, 20));
		KVP(r->c, kvp_submit(r->c));
		KVP(r->c2, kvp_prepare(r->c2, 1, r->ntok, 0, &l2));
		if (pages_hold(r, l2.indices, l2.npages, "second client's prepare(1)"))
			return -1;
		KVP(r->c2, kvp_release(r->c2, l2.id));
		k = kvp_reap(r->c, &cp, 1, 1);
		KVP(r->c, k);
		CHECK(k == 1 && cp.res >= 0 && cp.tag == 20, "prepare(1): %d %s",
		      cp.res, cp.error ? cp.error : "");
		if (pages_hold(r, cp.lease.indices, cp.lease.npages,
			       "first client's prepare(1)"))
			return -1;
		KVP(r->c, kvp_release(r->c, cp.lease.id));
		say("step 3: a second client's prepare of user 1 returned the "
		    "landed bytes");
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct kvp_connect_opts o = { .name = "async-onload" };
	struct run r = { 0 };
	static const char *const args[] = {
		"--layout=" LAYOUT, "--device_mem=1100M", "--host_mem=1100M", NULL,
	};
	struct gpu_daemon d;
	char err[KVP_ERRLEN];

	signal(SIGPIPE, SIG_IGN);
	if (argc < 2) {
		fprintf(stderr, "usage: %s KVPOOLD\n", argv[0]);
		return 1;
	}
	if (gpu_test_no_device())
		return 77;
	if (access(argv[1], X_OK)) {
		printf("SKIP: no kvpoold at %s\n", argv[1]);
		return 77;
	}
	if (gpu_daemon_start(&d, "async-onload", "/tmp/kvpool-gpu-async-XXXXXX",
			     argv[1], args))
		return 1;
	o.socket = d.sock;
	if (kvp_connect(&r.c, &o, err, sizeof(err)) ||
	    kvp_connect(&r.c2, &o, err, sizeof(err))) {
		say("kvp_connect: %s", err);
		failed = 1;
	}
	if (!failed) {
		r.l = kvp_client_layout(r.c);
		r.dev = kvp_device_base(r.c);
		if (cudaSetDevice(kvp_cuda_device(r.c)) != cudaSuccess) {
			say("cudaSetDevice(%d) failed", kvp_cuda_device(r.c));
			failed = 1;
		}
	}
	if (!failed && !setup(&r))
		run_steps(&r);
	if (r.c2)
		kvp_close(r.c2);
	if (r.c)
		kvp_close(r.c);
	if (gpu_daemon_stop(&d, 20000)) {
		say("kvpoold did not exit cleanly");
		failed = 1;
	}
	if (failed)
		gpu_daemon_dump_log(&d);
	gpu_daemon_cleanup(&d);
	free(r.want);
	free(r.got);
	if (!failed)
		say("onload completions came after the copy landed; other users' "
		    "operations did not wait for it");
	return failed;
}
