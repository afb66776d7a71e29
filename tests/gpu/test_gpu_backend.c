/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_backend.c - the engine on the cuda backend (daemon/engine/backend_cuda*.c)
 * on CUDA device 0:
 *
 *  - the device tier is a cuMemCreate allocation exported as a POSIX fd
 *    (a valid fd, granularity-aligned size, zeroed), the host tier pinned;
 *  - bytes written into device pages survive offload -> evict(device) ->
 *    onload, and demotion under pressure -> onload, read back through
 *    engine_read_tokens (the backend's read op), with bytes_d2h / bytes_h2d
 *    counting exactly the pages moved;
 *  - onload is asynchronous: a prepare of a user with 1 GiB on the host tier
 *    returns with a fence long before the copy lands, and other users'
 *    prepares, commits and releases on the same pool complete meanwhile
 *    (their engine calls return before the fence has landed); then the
 *    bytes are exact;
 *  - a second process (this binary re-executed with --child, so it never
 *    inherits an initialised CUDA) receives the exported fd over a Unix
 *    socket, imports and maps it, reads the parent's bytes and writes its
 *    own, which the parent then reads;
 *  - figures, printed and not asserted: engine_offload_all and onload
 *    (prepare of offloaded users) of 1 MiB pages of the HSTU layout
 *    (layers=8,kv_heads=4,head_dim=256,bf16,page_tokens=32) next to raw
 *    pinned cudaMemcpyAsync of the same bytes between the same buffers.
 *
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "backend.h"
#include "clock.h"
#include "copy.h"
#include "cuda_driver.h"
#include "engine.h"
#include "gpu_test_util.h"
#include "kvp_kernels.h"
#include "kvpool.h"

#define DEVICE 0
#define CK(x) assert_int_equal((x), cudaSuccess)

static struct kvp_layout L; /* HSTU: 1 MiB pages */

static void fill_random(unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t r = gpu_rng();

		memcpy(p + i, &r, n - i < 8 ? n - i : 8);
	}
}

static unsigned char pattern(uint64_t i, uint32_t seed)
{
	return (unsigned char)((i * 2654435761u + seed) >> 7 ^ (i >> 20));
}

static double now_s(void)
{
	return (double)mono_ns() * 1e-9;
}

/* ------------------------------------------------------------ driver API */

/* The driver functions as kvpoold and libkvpool have them: the one loader,
 * lib/cuda_driver.c (looked up through the runtime, no -lcuda). */
static const struct cuda_driver *drv_load(void)
{
	struct cuda_driver_error why;
	const struct cuda_driver *d = cuda_driver_get(&why);

	if (!d)
		fprintf(stderr, "cannot resolve %s\n", why.sym);
	return d;
}

static size_t granularity(void)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = DEVICE },
	};
	const struct cuda_driver *d = drv_load();
	size_t g = 0;

	assert_non_null(d);
	assert_int_equal(d->granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
			 CUDA_SUCCESS);
	assert_true(g > 0);
	return g;
}

/* ------------------------------------------------------------ fixtures */

struct fx {
	void *ctx;
	struct engine *eng;
};

static void fx_open(struct fx *f, uint32_t dev_frames, uint32_t host_frames)
{
	struct engine_config ec = {
		.layout = L,
		.device_frames = dev_frames,
		.host_frames = host_frames,
		.backend = &backend_cuda,
	};
	struct errbuf e = { .msg = "" };
	int ret = backend_cuda_open(DEVICE, &f->ctx, &e);

	if (ret)
		fail_msg("backend_cuda_open(%d) = %d: %s", DEVICE, ret, e.msg);
	ec.backend_ctx = f->ctx;
	ret = engine_create(&f->eng, &ec, &e);
	if (ret)
		fail_msg("engine_create on cuda = %d: %s", ret, e.msg);
}

static void fx_close(struct fx *f)
{
	struct errbuf e = { .msg = "" };

	if (engine_check(f->eng, &e))
		fail_msg("engine_check: %s", e.msg);
	engine_destroy(f->eng);
	backend_cuda_close(f->ctx);
}

/*
 * Write kv ([n][layers][2][heads][dim]) into the lease's first n slots the
 * way a client's kernel would: straight into the device tier, here through
 * a host image of the tier and the CPU reference.
 */
static void write_lease(struct engine *eng, uint64_t lease, uint32_t n,
			const void *kv)
{
	const struct tier_mem *d = engine_tier(eng, KVP_TIER_DEVICE);
	struct kvp_slot *slots = malloc(n * sizeof(*slots));
	unsigned char *img = malloc(d->bytes);
	struct errbuf e = { .msg = "" };

	assert_non_null(slots);
	assert_non_null(img);
	if (engine_lease_slots(eng, lease, 0, n, slots, &e))
		fail_msg("engine_lease_slots: %s", e.msg);
	CK(cudaMemcpy(img, d->base, d->bytes, cudaMemcpyDeviceToHost));
	kvp_append_cpu(&L, img, slots, n, kv);
	CK(cudaMemcpy(d->base, img, d->bytes, cudaMemcpyHostToDevice));
	/* A pageable copy may return before its DMA lands; the backend's
	 * streams do not wait for the legacy stream. */
	CK(cudaDeviceSynchronize());
	free(img);
	free(slots);
}

/* prepare + write + commit + release of n tokens from pos. */
static void put_tokens(struct engine *eng, uint64_t user, uint64_t pos,
		       uint32_t n, const void *kv, struct engine_lease *out)
{
	struct errbuf e = { .msg = "" };
	struct engine_lease l;
	int ret = engine_prepare(eng, user, pos, n, 1, &l, &e);

	if (ret)
		fail_msg("prepare(user %" PRIu64 ", %" PRIu64 ", %u) = %d: %s",
			 user, pos, n, ret, e.msg);
	if (out)
		*out = l;
	write_lease(eng, l.id, n, kv);
	assert_int_equal(engine_commit(eng, l.id, n, &e), 0);
	assert_int_equal(engine_release(eng, l.id, &e), 0);
}

static void expect_tokens(struct engine *eng, uint64_t user, uint64_t pos,
			  uint32_t n, const unsigned char *want, const char *when)
{
	size_t bytes = (size_t)n * L.token_bytes;
	unsigned char *got = malloc(bytes);
	struct errbuf e = { .msg = "" };
	int ret;

	assert_non_null(got);
	ret = engine_read_tokens(eng, user, pos, n, got, &e);
	if (ret)
		fail_msg("%s: engine_read_tokens(user %" PRIu64 ", %" PRIu64 ", %u) "
			 "= %d: %s", when, user, pos, n, ret, e.msg);
	for (size_t i = 0; i < bytes; i++)
		if (got[i] != want[i])
			fail_msg("%s: user %" PRIu64 " byte %zu (token %zu) is %#x, "
				 "wrote %#x", when, user, i, i / L.token_bytes,
				 got[i], want[i]);
	free(got);
}

static struct kvp_stats stats(struct engine *eng)
{
	struct kvp_stats s;

	engine_stats(eng, &s);
	return s;
}

/* ------------------------------------------------------------ tiers */

static void test_cuda_tiers_are_exported_aligned_and_zeroed(void **state)
{
	const size_t g = granularity();
	const struct tier_mem *d, *h;
	struct cudaPointerAttributes pa;
	unsigned char *img;
	struct stat st;
	struct fx f;

	fx_open(&f, 5, 3);
	d = engine_tier(f.eng, KVP_TIER_DEVICE);
	h = engine_tier(f.eng, KVP_TIER_HOST);
	printf("# granularity %zu bytes; device tier %" PRIu64 " bytes for 5 pages "
	       "of %" PRIu64 "\n", g, d->bytes, L.page_bytes);

	assert_true(d->fd >= 0);
	assert_int_equal(fstat(d->fd, &st), 0);
	assert_int_equal(d->bytes % g, 0);
	assert_true(d->bytes >= 5 * L.page_bytes);
	assert_true(d->bytes < 5 * L.page_bytes + g);
	/* Informative: how the runtime classifies a cuMem mapping. */
	if (cudaPointerGetAttributes(&pa, d->base) == cudaSuccess)
		printf("# device tier pointer: memory type %d, device %d\n",
		       (int)pa.type, pa.device);
	cudaGetLastError();

	assert_int_equal(h->fd, -1);
	assert_int_equal(h->bytes, 3 * L.page_bytes);
	assert_non_null(h->base);
	CK(cudaPointerGetAttributes(&pa, h->base));
	assert_int_equal(pa.type, cudaMemoryTypeHost); /* pinned, not pageable */

	img = malloc(d->bytes);
	assert_non_null(img);
	CK(cudaMemcpy(img, d->base, d->bytes, cudaMemcpyDeviceToHost));
	for (uint64_t i = 0; i < d->bytes; i++)
		if (img[i])
			fail_msg("device tier byte %" PRIu64 " is %#x, not zero", i, img[i]);
	for (uint64_t i = 0; i < h->bytes; i++)
		if (((unsigned char *)h->base)[i])
			fail_msg("host tier byte %" PRIu64 " is not zero", i);
	free(img);
	fx_close(&f);
}

/* ------------------------------------------------------------ round trips */

static void test_cuda_offload_evict_onload_keeps_bytes(void **state)
{
	const uint32_t n = 3 * 32 - 5; /* 3 pages, the last partly filled */
	const uint64_t pb = L.page_bytes, user = 7, pos = 100;
	size_t bytes = (size_t)n * L.token_bytes;
	unsigned char *kv = malloc(bytes);
	const struct tier_mem *d;
	struct errbuf e = { .msg = "" };
	struct engine_user_info in;
	struct engine_lease l;
	struct fx f;

	assert_non_null(kv);
	fill_random(kv, bytes);
	fx_open(&f, 8, 8);
	d = engine_tier(f.eng, KVP_TIER_DEVICE);
	put_tokens(f.eng, user, pos, n, kv, NULL);
	expect_tokens(f.eng, user, pos, n, kv, "written");
	/* A range that starts and ends inside pages. */
	expect_tokens(f.eng, user, pos + 40, 30, kv + 40 * L.token_bytes,
		      "mid-page range");

	assert_int_equal(engine_offload(f.eng, user, &e), 3);
	assert_int_equal(stats(f.eng).bytes_d2h, 3 * pb);
	assert_int_equal(stats(f.eng).offloaded_pages, 3);
	assert_int_equal(engine_evict(f.eng, user, KVP_SEL_DEVICE, &e), 3);
	engine_info(f.eng, user, &in);
	assert_int_equal(in.pages_device, 0);
	assert_int_equal(in.pages_host, 3);
	assert_int_equal(stats(f.eng).bytes_d2h, 3 * pb); /* had its copies */
	expect_tokens(f.eng, user, pos, n, kv, "on the host tier");

	/* Scribble over the device tier: the onload must bring the bytes. */
	CK(cudaMemset(d->base, 0xab, d->bytes));
	CK(cudaDeviceSynchronize());
	assert_int_equal(engine_prepare(f.eng, user, pos + n, 0, 1, &l, &e), 0);
	assert_int_equal(l.onloaded_pages, 3);
	assert_int_equal(stats(f.eng).bytes_h2d, 3 * pb);
	assert_int_equal(stats(f.eng).onloaded_pages, 3);
	engine_info(f.eng, user, &in);
	assert_int_equal(in.pages_device, 3);
	expect_tokens(f.eng, user, pos, n, kv, "onloaded");
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	/* ns_h2d: the GPU's time of that copy (the backend's events around
	 * it), counted once the engine saw it landed; under 1 TB/s. */
	assert_true(stats(f.eng).ns_h2d > 0);
	assert_true(stats(f.eng).ns_h2d * 1000 > 3 * pb);

	/* Evicting everything of a user, then reading, is an error. */
	assert_int_equal(engine_evict(f.eng, user, KVP_SEL_ALL, &e), 3);
	assert_true(engine_read_tokens(f.eng, user, pos, 1, kv, &e) < 0);
	free(kv);
	fx_close(&f);
}

static void test_cuda_demotion_under_pressure_and_onload_keep_bytes(void **state)
{
	const uint32_t n = 96; /* 3 full pages */
	const uint64_t pb = L.page_bytes;
	size_t bytes = (size_t)n * L.token_bytes;
	unsigned char *a = malloc(bytes), *b = malloc(bytes);
	struct errbuf e = { .msg = "" };
	struct engine_user_info in;
	struct engine_lease l;
	struct kvp_stats s;
	struct fx f;

	assert_non_null(a);
	assert_non_null(b);
	fill_random(a, bytes);
	fill_random(b, bytes);
	fx_open(&f, 4, 8);
	put_tokens(f.eng, 1, 0, n, a, NULL);
	/* 3 more pages with 1 free: user 1 is demoted to the host tier. */
	put_tokens(f.eng, 2, 0, n, b, NULL);
	s = stats(f.eng);
	assert_int_equal(s.demoted_users, 1);
	assert_int_equal(s.demoted_pages, 3);
	assert_int_equal(s.bytes_d2h, 3 * pb);
	assert_int_equal(s.bytes_h2d, 0);
	engine_info(f.eng, 1, &in);
	assert_int_equal(in.pages_device, 0);
	assert_int_equal(in.pages_host, 3);
	expect_tokens(f.eng, 1, 0, n, a, "user 1 demoted");
	expect_tokens(f.eng, 2, 0, n, b, "user 2 on the device");

	/* Onload user 1: user 2 is demoted to make room. */
	assert_int_equal(engine_prepare(f.eng, 1, n, 0, 1, &l, &e), 0);
	assert_int_equal(l.onloaded_pages, 3);
	s = stats(f.eng);
	assert_int_equal(s.demoted_pages, 6);
	assert_int_equal(s.bytes_d2h, 6 * pb);
	assert_int_equal(s.bytes_h2d, 3 * pb);
	expect_tokens(f.eng, 1, 0, n, a, "user 1 onloaded");
	expect_tokens(f.eng, 2, 0, n, b, "user 2 demoted");
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);

	/* And back: user 2 onloaded; user 1 already has host copies of its
	 * pages, so its demotion copies nothing. */
	assert_int_equal(engine_prepare(f.eng, 2, n, 0, 1, &l, &e), 0);
	assert_int_equal(l.onloaded_pages, 3);
	s = stats(f.eng);
	assert_int_equal(s.bytes_d2h, 6 * pb);
	assert_int_equal(s.bytes_h2d, 6 * pb);
	expect_tokens(f.eng, 1, 0, n, a, "user 1 demoted again");
	expect_tokens(f.eng, 2, 0, n, b, "user 2 onloaded");
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	free(a);
	free(b);
	fx_close(&f);
}

/*
 * The reclaimer's demotion on the GPU: one round of six histories (42
 * pages) copied in two pieces through copy_start/copy_wait, each finished
 * as it lands; every byte is read back from the host tier afterwards.
 */
static void test_cuda_pipelined_demotion_keeps_bytes(void **state)
{
	enum { USERS = 6, TOKENS = 7 * 32 };
	const uint64_t pb = L.page_bytes;
	size_t bytes = (size_t)TOKENS * L.token_bytes;
	static struct engine_demotion d;
	static struct copy_batch cb;
	unsigned char *kv[USERS];
	struct engine_user_info in;
	uint32_t freed = 0;
	struct fx f;

	fx_open(&f, 48, 64);
	for (int u = 0; u < USERS; u++) {
		kv[u] = malloc(bytes);
		assert_non_null(kv[u]);
		fill_random(kv[u], bytes);
		put_tokens(f.eng, 100 + u, 0, TOKENS, kv[u], NULL);
	}
	freed = engine_demote_plan(f.eng, &d, DEMOTE_MAX_PAGES);
	assert_int_equal(freed, 0);
	assert_int_equal(d.nh, USERS);
	assert_int_equal(d.n, USERS * 7);
	assert_int_equal(engine_demote_copy(f.eng, &d, &cb), 0);
	/* Pieces of whole histories, DEMOTE_PIECE_PAGES (32) or more: 35 + 7. */
	assert_int_equal(d.npiece, 2);
	for (uint32_t p = 0, n = d.npiece; p < n; p++) {
		engine_demote_wait(f.eng, &d, p);
		freed += engine_demote_finish(f.eng, &d, p);
	}
	assert_int_equal(freed, USERS * 7);
	assert_int_equal(d.nh, 0);
	assert_int_equal(stats(f.eng).bytes_d2h, USERS * 7 * pb);
	assert_true(stats(f.eng).ns_d2h > 0);
	for (int u = 0; u < USERS; u++) {
		engine_info(f.eng, 100 + u, &in);
		assert_int_equal(in.pages_device, 0);
		assert_int_equal(in.pages_host, 7);
		expect_tokens(f.eng, 100 + u, 0, TOKENS, kv[u], "demoted in pieces");
		free(kv[u]);
	}
	fx_close(&f);
}

/* ------------------------------------------------------------ async onload */

#define BIG_PAGES 1024 /* 1 GiB of 1 MiB pages: ~20 ms of DMA at 55 GB/s */

static double gbps(uint64_t bytes, double s);

static void test_cuda_other_users_proceed_during_an_onload(void **state)
{
	const uint32_t ntok = BIG_PAGES * L.page_tokens;
	const uint64_t pb = L.page_bytes, bytes = (uint64_t)BIG_PAGES * pb;
	const struct tier_mem *d;
	struct errbuf e = { .msg = "" };
	unsigned char *want = malloc(bytes), *got = malloc(bytes);
	uint32_t *frames = malloc(BIG_PAGES * sizeof(*frames));
	struct engine_lease a, l;
	double t0, t_prep, t_others, t_land;
	int landed_early;
	struct fx f;

	assert_non_null(want);
	assert_non_null(got);
	assert_non_null(frames);
	fill_random(want, bytes);
	fx_open(&f, BIG_PAGES + 16, BIG_PAGES + 16);
	d = engine_tier(f.eng, KVP_TIER_DEVICE);

	/* User 1: 1 GiB of known bytes, offloaded, then off the device. */
	assert_int_equal(engine_prepare(f.eng, 1, 0, ntok, 1, &l, &e), 0);
	for (uint32_t i = 0; i < BIG_PAGES; i++)
		CK(cudaMemcpy((char *)d->base + (uint64_t)l.frames[i] * pb,
			      want + (uint64_t)i * pb, pb, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
	assert_int_equal(engine_commit(f.eng, l.id, ntok, &e), 0);
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	assert_int_equal(engine_offload(f.eng, 1, &e), BIG_PAGES);
	assert_int_equal(engine_evict(f.eng, 1, KVP_SEL_DEVICE, &e), BIG_PAGES);
	/* Users 2 and 3 live on the device. */
	for (uint64_t u = 2; u <= 3; u++) {
		assert_int_equal(engine_prepare(f.eng, u, 0, 64, 1, &l, &e), 0);
		assert_int_equal(engine_commit(f.eng, l.id, 64, &e), 0);
		assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	}
	CK(cudaMemset(d->base, 0, d->bytes)); /* what an early reader sees */
	CK(cudaDeviceSynchronize());

	t0 = now_s();
	assert_int_equal(engine_prepare(f.eng, 1, ntok, 0, 1, &a, &e), 0);
	t_prep = now_s() - t0;
	assert_int_equal(a.onloaded_pages, BIG_PAGES);
	assert_true(a.fence != 0);
	memcpy(frames, a.frames, BIG_PAGES * sizeof(*frames));

	/* Other users' work on the same pool, while the copy is in flight. */
	t0 = now_s();
	assert_int_equal(engine_prepare(f.eng, 2, 64, 32, 2, &l, &e), 0);
	assert_int_equal(l.fence, 0);
	assert_int_equal(engine_commit(f.eng, l.id, 32, &e), 0);
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	assert_int_equal(engine_prepare(f.eng, 3, 64, 0, 3, &l, &e), 0);
	assert_int_equal(l.fence, 0);
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	assert_int_equal(engine_prepare(f.eng, 4, 0, 100, 3, &l, &e), 0);
	assert_int_equal(engine_commit(f.eng, l.id, 100, &e), 0);
	assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	t_others = now_s() - t0;
	landed_early = engine_fence_done(f.eng, a.fence);

	t0 = now_s();
	engine_fence_wait(f.eng, a.fence);
	t_land = now_s() - t0;
	assert_int_equal(engine_fence_done(f.eng, a.fence), 1);
	printf("# async onload of %u MiB: prepare returned in %.1f us; 3 other "
	       "users' prepare/commit/release took %.1f us, done %s the copy "
	       "landed; it landed %.2f ms after that (%.1f GB/s end to end)\n",
	       BIG_PAGES, t_prep * 1e6, t_others * 1e6,
	       landed_early ? "AFTER" : "before", t_land * 1e3,
	       gbps(bytes, t_prep + t_others + t_land));
	assert_false(landed_early);
	/* The bytes, through the page table the prepare returned. */
	for (uint32_t i = 0; i < BIG_PAGES; i++)
		CK(cudaMemcpy(got + (uint64_t)i * pb,
			      (char *)d->base + (uint64_t)frames[i] * pb, pb,
			      cudaMemcpyDeviceToHost));
	if (memcmp(got, want, bytes))
		fail_msg("the onloaded bytes differ from what was offloaded");
	assert_int_equal(engine_release(f.eng, a.id, &e), 0);
	free(frames);
	free(got);
	free(want);
	fx_close(&f);
}

/* ------------------------------------------------------------ two processes */

struct xmsg {
	uint64_t bytes;     /* the exported allocation's size */
	uint64_t p_off, p_len; /* the parent's pattern: the child checks it */
	uint64_t q_off, q_len; /* the child writes its pattern here */
	uint32_t p_seed, q_seed;
	int32_t device;
};

static int send_fd(int sock, const struct xmsg *m, int fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;

	memset(&u, 0, sizeof(u));
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -1;
}

static int recv_fd(int sock, struct xmsg *m, int *fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;

	if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(*m))
		return -1;
	cm = CMSG_FIRSTHDR(&mh);
	if (!cm || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(fd, CMSG_DATA(cm), sizeof(int));
	return 0;
}

/*
 * The child: what a kvpool client does with the device tier fd (the recipe
 * of shared/gpu/README.md). Exit 0 when the parent's bytes read back and its
 * own were written.
 */
static int child_main(int sock)
{
	CUmemAccessDesc acc = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUmemGenericAllocationHandle h;
	CUdeviceptr ptr = 0;
	struct xmsg m;
	const struct cuda_driver *d;
	unsigned char *buf;
	CUresult r;
	int fd;

	if (recv_fd(sock, &m, &fd)) {
		fprintf(stderr, "child: no fd from the parent\n");
		return 2;
	}
	if (cudaSetDevice(m.device) != cudaSuccess || !(d = drv_load())) {
		fprintf(stderr, "child: CUDA device %d unusable\n", m.device);
		return 3;
	}
	r = d->import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "child: cuMemImportFromShareableHandle: %d\n", r);
		return 4;
	}
	acc.location.id = m.device;
	if ((r = d->reserve(&ptr, m.bytes, 0, 0, 0)) != CUDA_SUCCESS ||
	    (r = d->map(ptr, m.bytes, 0, h, 0)) != CUDA_SUCCESS ||
	    (r = d->set_access(ptr, m.bytes, &acc, 1)) != CUDA_SUCCESS) {
		fprintf(stderr, "child: reserve/map/set_access of %" PRIu64 " bytes: %d\n",
			m.bytes, r);
		return 5;
	}
	buf = malloc(m.p_len > m.q_len ? m.p_len : m.q_len);
	if (!buf)
		return 6;
	if (cudaMemcpy(buf, (void *)(uintptr_t)(ptr + m.p_off), m.p_len,
		       cudaMemcpyDeviceToHost) != cudaSuccess)
		return 7;
	for (uint64_t i = 0; i < m.p_len; i++) {
		if (buf[i] != pattern(i, m.p_seed)) {
			fprintf(stderr, "child: byte %" PRIu64 " of the parent's is "
				"%#x, expected %#x\n", i, buf[i], pattern(i, m.p_seed));
			return 8;
		}
	}
	for (uint64_t i = 0; i < m.q_len; i++)
		buf[i] = pattern(i, m.q_seed);
	if (cudaMemcpy((void *)(uintptr_t)(ptr + m.q_off), buf, m.q_len,
		       cudaMemcpyHostToDevice) != cudaSuccess ||
	    cudaDeviceSynchronize() != cudaSuccess)
		return 9;
	d->unmap(ptr, m.bytes);
	d->addr_free(ptr, m.bytes);
	d->release(h);
	close(fd);
	free(buf);
	printf("# child %d: read %" PRIu64 " bytes of the parent's, wrote %" PRIu64
	       "\n", (int)getpid(), m.p_len, m.q_len);
	return 0;
}

static void test_cuda_device_tier_maps_in_a_second_process(void **state)
{
	const uint64_t pb = L.page_bytes;
	const struct tier_mem *d;
	struct xmsg m;
	unsigned char *buf;
	int sv[2], status;
	pid_t pid;
	struct fx f;

	fx_open(&f, 4, 0);
	d = engine_tier(f.eng, KVP_TIER_DEVICE);
	m = (struct xmsg){ .bytes = d->bytes, .p_off = 0, .p_len = 2 * pb,
			   .q_off = 2 * pb, .q_len = pb, .p_seed = 11,
			   .q_seed = 97, .device = DEVICE };
	buf = malloc(2 * pb);
	assert_non_null(buf);
	for (uint64_t i = 0; i < m.p_len; i++)
		buf[i] = pattern(i, m.p_seed);
	CK(cudaMemcpy(d->base, buf, m.p_len, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	fflush(stdout);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Nothing CUDA here: exec a fresh image that starts its own. */
		char arg[16];
		int s = dup(sv[1]); /* without CLOEXEC */

		snprintf(arg, sizeof(arg), "%d", s);
		execl("/proc/self/exe", "test_gpu_backend", "--child", arg, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	assert_int_equal(send_fd(sv[0], &m, d->fd), 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	close(sv[0]);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fail_msg("the child failed: %s %d", WIFEXITED(status) ? "exit" : "signal",
			 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));

	CK(cudaMemcpy(buf, (char *)d->base + m.q_off, m.q_len, cudaMemcpyDeviceToHost));
	for (uint64_t i = 0; i < m.q_len; i++)
		if (buf[i] != pattern(i, m.q_seed))
			fail_msg("byte %" PRIu64 " the child wrote reads %#x, expected "
				 "%#x", i, buf[i], pattern(i, m.q_seed));
	free(buf);
	fx_close(&f);
}

/* ------------------------------------------------------------ figures */

#define BENCH_USERS 32
#define BENCH_PAGES_PER_USER 64 /* 64 MiB per user */
#define BENCH_REPS 3

static double gbps(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : 0;
}

/* Raw pinned copies between the tiers' own buffers: chunk bytes per call. */
static double raw_copy(void *dst, const void *src, uint64_t bytes, uint64_t chunk,
		       enum cudaMemcpyKind kind, cudaStream_t s)
{
	double t0 = now_s();

	for (uint64_t off = 0; off < bytes; off += chunk)
		CK(cudaMemcpyAsync((char *)dst + off, (const char *)src + off,
				   chunk < bytes - off ? chunk : bytes - off, kind, s));
	CK(cudaStreamSynchronize(s));
	return gbps(bytes, now_s() - t0);
}

static double raw_bidir(const struct tier_mem *d, const struct tier_mem *h,
			uint64_t bytes, cudaStream_t s1, cudaStream_t s2)
{
	uint64_t half = bytes / 2;
	double t0 = now_s();

	CK(cudaMemcpyAsync(h->base, d->base, half, cudaMemcpyDeviceToHost, s1));
	CK(cudaMemcpyAsync((char *)d->base + half, (char *)h->base + half, half,
			   cudaMemcpyHostToDevice, s2));
	CK(cudaStreamSynchronize(s1));
	CK(cudaStreamSynchronize(s2));
	return gbps(2 * half, now_s() - t0);
}

static void test_cuda_offload_onload_bandwidth(void **state)
{
	const uint32_t pages = BENCH_USERS * BENCH_PAGES_PER_USER;
	const uint32_t ntok = BENCH_PAGES_PER_USER * L.page_tokens;
	const uint64_t bytes = (uint64_t)pages * L.page_bytes;
	double raw_d2h = 0, raw_h2d = 0, raw_d2h_1m = 0, raw_h2d_1m = 0, bidir = 0;
	double off_best = 0, on_best = 0;
	struct errbuf e = { .msg = "" };
	const struct tier_mem *d, *h;
	cudaStream_t s1, s2;
	struct fx f;
	double t0;

	t0 = now_s();
	fx_open(&f, pages, pages);
	printf("# bench: layout %s, page %" PRIu64 " bytes, %u users x %u pages = "
	       "%" PRIu64 " MiB per direction (tiers set up in %.2f s)\n",
	       "layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
	       L.page_bytes, BENCH_USERS, BENCH_PAGES_PER_USER, bytes >> 20,
	       now_s() - t0);
	d = engine_tier(f.eng, KVP_TIER_DEVICE);
	h = engine_tier(f.eng, KVP_TIER_HOST);
	for (uint64_t u = 0; u < BENCH_USERS; u++) {
		struct engine_lease l;

		assert_int_equal(engine_prepare(f.eng, u, 0, ntok, 1, &l, &e), 0);
		assert_int_equal(engine_commit(f.eng, l.id, ntok, &e), 0);
		assert_int_equal(engine_release(f.eng, l.id, &e), 0);
	}

	/* Ceilings, measured now, between the same two buffers. */
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	raw_copy(h->base, d->base, bytes, bytes, cudaMemcpyDeviceToHost, s1); /* warm */
	for (int r = 0; r < BENCH_REPS; r++) {
		double x;

		x = raw_copy(h->base, d->base, bytes, bytes, cudaMemcpyDeviceToHost, s1);
		raw_d2h = x > raw_d2h ? x : raw_d2h;
		x = raw_copy(d->base, h->base, bytes, bytes, cudaMemcpyHostToDevice, s1);
		raw_h2d = x > raw_h2d ? x : raw_h2d;
		x = raw_copy(h->base, d->base, bytes, L.page_bytes,
			     cudaMemcpyDeviceToHost, s1);
		raw_d2h_1m = x > raw_d2h_1m ? x : raw_d2h_1m;
		x = raw_copy(d->base, h->base, bytes, L.page_bytes,
			     cudaMemcpyHostToDevice, s1);
		raw_h2d_1m = x > raw_h2d_1m ? x : raw_h2d_1m;
		x = raw_bidir(d, h, bytes, s1, s2);
		bidir = x > bidir ? x : bidir;
	}
	printf("# raw pinned cudaMemcpyAsync, one copy of %" PRIu64 " MiB: D2H %.1f "
	       "GB/s, H2D %.1f GB/s\n", bytes >> 20, raw_d2h, raw_h2d);
	printf("# raw pinned cudaMemcpyAsync, 1 MiB per call:   D2H %.1f GB/s, H2D "
	       "%.1f GB/s\n", raw_d2h_1m, raw_h2d_1m);
	printf("# raw pinned both directions at once (2 streams): %.1f GB/s\n", bidir);

	for (int r = 0; r < BENCH_REPS; r++) {
		struct kvp_stats s0 = stats(f.eng), s1st;
		uint32_t skipped;
		double t, x;
		int n;

		/* Offload: every user's device pages to the host tier. */
		t = now_s();
		n = engine_offload_all(f.eng, &e);
		t = now_s() - t;
		if (n < 0)
			fail_msg("engine_offload_all: %s", e.msg);
		assert_int_equal(n, pages);
		s1st = stats(f.eng);
		assert_int_equal(s1st.bytes_d2h - s0.bytes_d2h, bytes);
		x = gbps(bytes, t);
		off_best = x > off_best ? x : off_best;
		printf("# rep %d offload  engine_offload_all: %u pages in %.1f ms = "
		       "%.1f GB/s (%.0f%% of raw D2H)\n", r, n, t * 1e3, x,
		       100 * x / raw_d2h);

		/* Drop the device copies (they have host copies: no copy). */
		assert_int_equal(engine_evict_all(f.eng, KVP_SEL_DEVICE, &skipped),
				 BENCH_USERS);
		assert_int_equal(stats(f.eng).bytes_d2h, s1st.bytes_d2h);

		/* Onload: a read-only prepare of every user. */
		t = now_s();
		for (uint64_t u = 0; u < BENCH_USERS; u++) {
			struct engine_lease l;

			assert_int_equal(engine_prepare(f.eng, u, ntok, 0, 1, &l, &e), 0);
			assert_int_equal(l.onloaded_pages, BENCH_PAGES_PER_USER);
			assert_int_equal(engine_release(f.eng, l.id, &e), 0);
		}
		t = now_s() - t;
		assert_int_equal(stats(f.eng).bytes_h2d - s1st.bytes_h2d, bytes);
		x = gbps(bytes, t);
		on_best = x > on_best ? x : on_best;
		printf("# rep %d onload   prepare x %u users:  %u pages in %.1f ms = "
		       "%.1f GB/s (%.0f%% of raw H2D); bytes_h2d / ns_h2d %.1f GB/s\n",
		       r, BENCH_USERS, pages, t * 1e3, x, 100 * x / raw_h2d,
		       gbps(bytes, (double)(stats(f.eng).ns_h2d - s1st.ns_h2d) / 1e9));

		/* Free the host copies for the next offload. */
		engine_evict_all(f.eng, KVP_SEL_HOST, &skipped);
	}
	printf("# RESULT offload %.1f GB/s vs raw D2H %.1f GB/s (ratio %.2f); "
	       "onload %.1f GB/s vs raw H2D %.1f GB/s (ratio %.2f); raw "
	       "bidirectional %.1f GB/s\n", off_best, raw_d2h, off_best / raw_d2h,
	       on_best, raw_h2d, on_best / raw_h2d, bidir);
	fflush(stdout);
	CK(cudaStreamDestroy(s1));
	CK(cudaStreamDestroy(s2));
	fx_close(&f);
}

int main(int argc, char **argv)
{
	gpu_rng_seed(0x243f6a8885a308d3ull);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cuda_tiers_are_exported_aligned_and_zeroed),
		cmocka_unit_test(test_cuda_offload_evict_onload_keeps_bytes),
		cmocka_unit_test(test_cuda_demotion_under_pressure_and_onload_keep_bytes),
		cmocka_unit_test(test_cuda_pipelined_demotion_keeps_bytes),
		cmocka_unit_test(test_cuda_other_users_proceed_during_an_onload),
		cmocka_unit_test(test_cuda_device_tier_maps_in_a_second_process),
		cmocka_unit_test(test_cuda_offload_onload_bandwidth),
	};
	char err[KVP_ERRLEN];

	if (argc == 3 && !strcmp(argv[1], "--child"))
		return child_main(atoi(argv[2]));
	if (gpu_test_no_device())
		return 77;
	if (kvp_layout_init(&L, 8, 4, 256, KVP_DTYPE_BF16, 32, err, sizeof(err))) {
		fprintf(stderr, "layout: %s\n", err);
		return 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
