/* SPDX-License-Identifier: MIT */
/*
 * test_disk_engine - pushing a history down to the disk tier from an engine
 * whose device tier the CPU cannot read (daemon/disk/disk_engine.c).
 *
 * On the cuda backend the device tier's tier_mem.base is a device pointer:
 * `kvctl offload --tier disk` of a history only on the device once made
 * the disk code memcpy from it, and kvpoold died of SIGSEGV (seen on the
 * H100, 2026-11-27). The engine here runs on the shm backend with its
 * device tier marked not host-visible, as cuda's is: the pages must go
 * device -> host through the backend's copy (a demotion: bytes_d2h grows
 * by the history's pages), then to disk, and come back byte for byte. On a
 * host-visible device tier (shm as is) the disk tier reads the device
 * frames directly and copies nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "disk_engine.h"
#include "remote_engine.h"
#include "backend.h"
#include "disk_tier.h"
#include "engine_helpers.h"
#include "errbuf.h"

#define USER 5u
#define TOKENS (6 * PT + 1)

static char g_dir[64];
static struct disk_tier *g_disk;
static struct backend_ops g_be; /* shm, its device tier not host-visible */

static int shm_device_opaque_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
				   struct tier_mem *out, struct errbuf *e)
{
	int ret = backend_shm.tier_alloc(ctx, tier, bytes, out, e);

	if (!ret && tier == KVP_TIER_DEVICE)
		out->host_visible = false;
	return ret;
}

static struct engine *mk_disk_engine(bool device_visible)
{
	struct disk_tier_config dc = { .dir = g_dir, .size = 8u << 20 };
	struct engine_config cfg;
	struct errbuf e = { .msg = "" };
	char msg[128];

	snprintf(g_dir, sizeof(g_dir), "/tmp/kvpool-test-disk-engine-XXXXXX");
	assert_non_null(mkdtemp(g_dir));
	test_layout(&dc.layout);
	assert_int_equal(disk_codec_parse("none", &dc.codec, msg, sizeof(msg)), 0);
	if (disk_tier_open(&g_disk, &dc, &e))
		fail_msg("disk_tier_open: %s", e.msg);
	g_be = backend_shm;
	if (!device_visible)
		g_be.tier_alloc = shm_device_opaque_alloc;
	memset(&cfg, 0, sizeof(cfg));
	cfg.device_frames = 32;
	cfg.host_frames = 32;
	cfg.backend = &g_be;
	cfg.disk = g_disk;
	return mk_engine_cfg(&cfg);
}

static int teardown_all(void **state)
{
	char path[128];

	drop_engine();
	if (g_disk)
		disk_tier_close(g_disk);
	g_disk = NULL;
	snprintf(path, sizeof(path), "%s/kvpool.disk", g_dir);
	unlink(path);
	rmdir(g_dir);
	return teardown(state);
}

/* Push USER to disk, check where it is, bring it back, read every byte. */
static void to_disk_and_back(bool device_visible, uint64_t want_d2h)
{
	struct engine *eng = mk_disk_engine(device_visible);
	const uint64_t pages = (TOKENS + PT - 1) / PT;
	struct errbuf e = { .msg = "" };
	struct kvp_stats before, after;
	struct engine_user_info in;
	struct engine_lease L;
	int rc;

	put(eng, USER, 0, TOKENS);
	in = info_of(eng, USER);
	assert_int_equal(in.pages_device, pages);
	assert_int_equal(in.pages_host, 0);
	before = stats_of(eng);
	rc = engine_evict(eng, USER, KVP_SEL_TO_DISK, &e);
	if (rc < 0)
		fail_msg("offload --tier disk: %d %s", rc, e.msg);
	after = stats_of(eng);
	assert_int_equal(after.bytes_d2h - before.bytes_d2h,
			 want_d2h * engine_layout(eng)->page_bytes);
	/* Only on disk now: nothing in memory, still known to info. */
	in = info_of(eng, USER);
	assert_true(in.exists);
	assert_int_equal(in.pages_device, 0);
	assert_int_equal(in.pages_host, 0);
	assert_int_equal(in.len, TOKENS);
	CHECK(eng);

	/* Back disk -> host -> device (this caller waits for the read). */
	rc = engine_prepare(eng, USER, TOKENS, 0, OWNER, &L, &e);
	if (rc)
		fail_msg("prepare after disk: %d %s", rc, e.msg);
	assert_int_equal(L.len, TOKENS);
	assert_int_equal(L.onloaded_pages, pages);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	verify(eng, USER, 0, TOKENS);
	CHECK(eng);
}

static void device_not_host_visible_demotes_first(void **state)
{
	(void)state;
	to_disk_and_back(false, (TOKENS + PT - 1) / PT);
}

static void device_host_visible_is_read_in_place(void **state)
{
	(void)state;
	to_disk_and_back(true, 0);
}

/* An engine of 8 KiB pages (4K blocks) on shm with a disk tier: its
 * histories on disk come back straight into host frames. */
static struct engine *mk_4k_engine(void)
{
	struct disk_tier_config dc = { .size = 8u << 20 };
	struct engine_config cfg = { .device_frames = 32, .host_frames = 32 };
	struct errbuf e = { .msg = "" };
	struct engine *eng = NULL;
	char msg[128];

	snprintf(g_dir, sizeof(g_dir), "/tmp/kvpool-test-disk-engine-XXXXXX");
	assert_non_null(mkdtemp(g_dir));
	/* 2 layers x K,V x 4 tokens x 2 heads x 64 x fp32: 8 KiB pages */
	assert_int_equal(kvp_layout_init(&dc.layout, 2, 2, 64, KVP_DTYPE_FP32, PT,
					 msg, sizeof(msg)), 0);
	dc.dir = g_dir;
	assert_int_equal(disk_codec_parse("none", &dc.codec, msg, sizeof(msg)), 0);
	if (disk_tier_open(&g_disk, &dc, &e))
		fail_msg("disk_tier_open: %s", e.msg);
	assert_true(disk_tier_into_ok(g_disk));
	cfg.layout = dc.layout;
	cfg.backend = &backend_shm;
	cfg.disk = g_disk;
	if (engine_create(&eng, &cfg, &e))
		fail_msg("engine_create: %s", e.msg);
	return eng;
}

/*
 * Pages of 4 KiB blocks, a host tier the CPU reads: a history written to
 * disk comes back straight into host frames (no staging, no copy), byte
 * for byte, and the frames it was not given stay free.
 */
static void history_on_disk_is_read_straight_into_host_frames(void **state)
{
	struct engine *eng = mk_4k_engine();
	struct disk_tier_stats ds;
	struct engine_user_info in;
	struct errbuf e = { .msg = "" };
	struct engine_lease L;
	int rc;

	(void)state;
	put(eng, USER, 0, TOKENS);
	rc = engine_evict(eng, USER, KVP_SEL_TO_DISK, &e);
	if (rc < 0)
		fail_msg("offload --tier disk: %d %s", rc, e.msg);
	disk_tier_flush(g_disk); /* on disk, not in staging any more */
	rc = engine_prepare(eng, USER, TOKENS, 0, OWNER, &L, &e);
	if (rc)
		fail_msg("prepare after disk: %d %s", rc, e.msg);
	assert_int_equal(L.len, TOKENS);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	verify(eng, USER, 0, TOKENS);
	disk_tier_stats(g_disk, 0, &ds);
	assert_int_equal(ds.into_pages, (TOKENS + PT - 1) / PT);
	in = info_of(eng, USER);
	assert_int_equal(in.pages_host, (TOKENS + PT - 1) / PT);
	assert_int_equal(stats_of(eng).tier[KVP_TIER_HOST].frames_used,
			 (TOKENS + PT - 1) / PT);
	CHECK(eng);
	engine_destroy(eng); /* unregisters its host tier from the disk tier */
}

/*
 * A ring prepare that started a read into host frames and never came back
 * (its client died): 2 s after, the next read from disk gives the frames
 * back and the history stays on disk, whole.
 */
static void abandoned_read_gives_its_frames_back(void **state)
{
	struct engine *eng = mk_4k_engine();
	const uint32_t pages = (TOKENS + PT - 1) / PT;
	struct errbuf e = { .msg = "" };
	struct engine_lease L;
	bool abandoned;
	int rc;

	(void)state;
	put(eng, USER, 0, TOKENS);
	put(eng, USER + 1, 0, TOKENS);
	assert_true(engine_evict(eng, USER, KVP_SEL_TO_DISK, &e) > 0);
	assert_true(engine_evict(eng, USER + 1, KVP_SEL_TO_DISK, &e) > 0);
	disk_tier_flush(g_disk);
	assert_int_equal(stats_of(eng).tier[KVP_TIER_HOST].frames_used, 0);
	rc = engine_prepare_flags(eng, USER, TOKENS, 0, OWNER,
				  ENGINE_PREPARE_DEFER, &L, &e);
	assert_true(rc == -EINPROGRESS || rc == 0);
	/* A wait says whose it is (tier.h); an answer leaves none. */
	assert_int_equal(engine_wait_take(),
			 rc ? ENGINE_WAIT_DISK : ENGINE_DONE);
	abandoned = rc == -EINPROGRESS;
	if (!abandoned) /* the read was quicker than the call */
		release_ok(eng, L.id);
	else
		assert_int_equal(stats_of(eng).tier[KVP_TIER_HOST].frames_used, pages);
	disk_tier_flush(g_disk);
	usleep(2100 * 1000);
	rc = engine_prepare(eng, USER + 1, TOKENS, 0, OWNER, &L, &e);
	if (rc)
		fail_msg("prepare of another user: %d %s", rc, e.msg);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	verify(eng, USER + 1, 0, TOKENS);
	if (abandoned) {
		/* Only USER + 1's frames are held now, and USER is on disk. */
		assert_int_equal(stats_of(eng).tier[KVP_TIER_HOST].frames_used, pages);
		assert_true(info_of(eng, USER).exists);
		assert_int_equal(info_of(eng, USER).pages_host, 0);
	}
	rc = engine_prepare(eng, USER, TOKENS, 0, OWNER, &L, &e);
	if (rc)
		fail_msg("prepare after the abandoned read: %d %s", rc, e.msg);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	verify(eng, USER, 0, TOKENS);
	CHECK(eng);
	engine_destroy(eng);
}

int main(void)
{
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(device_not_host_visible_demotes_first,
					  teardown_all),
		cmocka_unit_test_teardown(device_host_visible_is_read_in_place,
					  teardown_all),
		cmocka_unit_test_teardown(history_on_disk_is_read_straight_into_host_frames,
					  teardown_all),
		cmocka_unit_test_teardown(abandoned_read_gives_its_frames_back,
					  teardown_all),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
