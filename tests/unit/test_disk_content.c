/* SPDX-License-Identifier: MIT */
/*
 * test_disk_content - prefix pages, chunks and sequences over the disk tier
 * (daemon/disk/share_disk.c): what device pressure evicts goes to disk,
 * and a lookup, an acquire, a register or a sequence build brings it back
 * byte for byte; the same after the disk tier is closed and opened again
 * (a warm restart: a new engine, nothing in memory).
 *
 * Each case runs twice: on the shm backend as is (the CPU reads the device
 * tier) and with its device tier marked not host-visible, as cuda's is (the
 * pages go through host frames and the backend's copies).
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
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "disk_engine.h"
#include "remote_engine.h"
#include "backend.h"
#include "disk_record.h"
#include "disk_tier.h"
#include "engine_helpers.h"
#include "errbuf.h"
#include "share_disk.h"
#include "share_helpers.h"

#define DEV 16u       /* device frames: a 16-page history fills them */
#define KEY 77u
#define USER 5u
#define HOG 9u        /* the user whose history pushes the rest out */
#define NOW 1000u

static char g_dir[64];
static struct disk_tier *g_disk;

static void disk_open(void)
{
	struct disk_tier_config dc = { .dir = g_dir, .size = 8u << 20 };
	struct errbuf e = { .msg = "" };
	char msg[128];

	test_layout(&dc.layout);
	assert_int_equal(disk_codec_parse("none", &dc.codec, msg, sizeof(msg)), 0);
	if (disk_tier_open(&g_disk, &dc, &e))
		fail_msg("disk_tier_open: %s", e.msg);
}

static struct engine *engine_on_disk(bool device_visible)
{
	struct engine_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.device_frames = DEV;
	cfg.host_frames = 32;
	cfg.backend = device_visible ? &backend_shm : shm_opaque_backend();
	cfg.disk = g_disk;
	return mk_engine_cfg(&cfg);
}

static struct engine *mk_disk_engine(bool device_visible)
{
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvpool-test-disk-content-XXXXXX");
	assert_non_null(mkdtemp(g_dir));
	disk_open();
	return engine_on_disk(device_visible);
}

/* kill -9 has no clean stop; a restart here is: every queued write
 * landed, the engine gone, the tier closed and opened on the same file. */
static struct engine *restart(bool device_visible)
{
	disk_tier_flush(g_disk);
	drop_engine();
	disk_tier_close(g_disk);
	disk_open();
	return engine_on_disk(device_visible);
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

/* Fill the device tier with HOG's history: whatever the shared world had
 * idle is evicted (to disk), then HOG goes to the host tier. */
static void push_out(struct engine *eng)
{
	static uint64_t hog = HOG;

	hog++; /* a new one each time: the last went down the tiers */
	put(eng, hog, 0, DEV * PT);
	assert_true(engine_evict(eng, hog, KVP_SEL_DEVICE, &(struct errbuf){ .msg = "" }) >= 0);
	disk_tier_flush(g_disk);
	CHECK(eng);
}

/* ------------------------------------------------------------ prefix */

#define PROMPT (4 * PT + 1) /* 4 full pages published, the last one not */

static void prefix_cached_again(struct engine *eng, const uint32_t *toks)
{
	struct share_prefix_hit h;

	share_prefix_lookup(eng, toks, PROMPT, &h);
	assert_int_equal(h.npages, 4);
	assert_int_equal(h.tokens, 4 * PT);
	expect_frames_bytes(eng, h.frames, 0, 4 * PT, KEY, 0);
	assert_int_equal(stats_of(eng).prefix_pages, 4);
	assert_int_equal(stats_of(eng).disk_prefix_pages, 0);
	CHECK(eng);
}

static void prefix_to_disk_and_back(bool device_visible)
{
	struct engine *eng = mk_disk_engine(device_visible);
	uint32_t toks[PROMPT];
	struct share_prefix_hit h;
	struct share_disk_wait *w;
	struct kvp_stats before;
	struct tlease t;
	uint64_t pb;
	int rc;

	tokens_seq(toks, PROMPT, 100);
	seq_put(eng, 1, toks, PROMPT, KEY, OWNER);
	seq_free_ok(eng, 1, OWNER);
	assert_int_equal(stats_of(eng).prefix_pages, 4);
	before = stats_of(eng);
	push_out(eng);
	assert_int_equal(stats_of(eng).prefix_pages, 0);
	assert_int_equal(stats_of(eng).disk_prefix_pages, 4);
	/* A device tier the CPU cannot read: each page went device -> host
	 * first (the hog's 16 pages are demoted to the host tier too). */
	pb = engine_layout(eng)->page_bytes;
	assert_int_equal(stats_of(eng).bytes_d2h - before.bytes_d2h,
			 (device_visible ? 0 : 4 * pb) + DEV * pb);
	/* Without waiting: -EINPROGRESS while the disk thread reads, the wait
	 * typed and recorded in the disk tier's own state of the engine (here
	 * too where its reads cannot go straight into host frames), cleared
	 * once the walk comes back whole. */
	w = share_disk_wait_of(eng);
	assert_non_null(w);
	while ((rc = share_prefix_find(eng, toks, PROMPT, &h)) == -EINPROGRESS) {
		assert_int_equal(engine_wait_take(), ENGINE_WAIT_DISK);
		assert_true(w->waiting);
		disk_tier_flush(g_disk);
	}
	assert_int_equal(rc, 0);
	assert_false(w->waiting);
	prefix_cached_again(eng, toks);
	/* And a sequence over the prompt hits them. */
	t = seq_alloc_ok(eng, 2, toks, PROMPT, OWNER);
	assert_int_equal(t.L.len, 4 * PT);
	expect_frames_bytes(eng, t.frames, 0, 4 * PT, KEY, 0);
	release_ok(eng, t.L.id);
	seq_free_ok(eng, 2, OWNER);

	/* A warm restart: on disk again, then served from there. */
	push_out(eng);
	assert_int_equal(stats_of(eng).disk_prefix_pages, 4);
	eng = restart(device_visible);
	assert_int_equal(stats_of(eng).prefix_pages, 0);
	assert_int_equal(stats_of(eng).disk_prefix_pages, 4);
	prefix_cached_again(eng, toks);
}

static void prefix_device_visible(void **state)
{
	(void)state;
	prefix_to_disk_and_back(true);
}

static void prefix_device_opaque(void **state)
{
	(void)state;
	prefix_to_disk_and_back(false);
}

/* ------------------------------------------------------------ chunks */

#define CTOK (3 * PT + 2)
#define META "{\"doc\":\"a.pdf\",\"page\":3}"

/* Acquire (by entry id or name) of a chunk only on disk, retried while it
 * is read; its bytes and name are all back. */
static void chunk_back(struct engine *eng, const struct kvp_chunk_id *id,
		       const struct kvp_chunk_id *entry)
{
	struct engine_lease L;
	struct kvp_chunk_info info;
	struct errbuf e = { .msg = "" };
	int rc;

	while ((rc = share_chunk_acquire(eng, id, OWNER, NOW, &L, &e)) == -EINPROGRESS)
		disk_tier_flush(g_disk);
	if (rc)
		fail_msg("acquire of a chunk on disk = %d: %s", rc, e.msg);
	assert_int_equal(L.len, CTOK);
	release_ok(eng, L.id);
	expect_chunk_bytes(eng, entry, KEY, CTOK);
	assert_int_equal(share_chunk_info(eng, id, &info, &e), 0);
	assert_string_equal(info.meta, META);
	assert_int_equal(info.tokens, CTOK);
	assert_int_equal(stats_of(eng).disk_chunks, 0);
	assert_int_equal(stats_of(eng).chunks, 1);
	CHECK(eng);
}

static void chunk_to_disk_and_back(bool device_visible)
{
	struct engine *eng = mk_disk_engine(device_visible);
	struct share_chunk_reg r;
	struct kvp_chunk_id id, name;
	struct errbuf e = { .msg = "" };
	uint32_t toks[CTOK];
	int rc;

	tokens_seq(toks, CTOK, 500);
	chunk_put(eng, toks, CTOK, KVP_CHUNK_CONTEXT, META, OWNER, NOW, KEY, false,
		  &id);
	assert_int_equal(share_chunk_register(eng, toks, CTOK, KVP_CHUNK_CONTEXT,
					      NULL, OWNER, NOW, &r, &e), 0);
	name = r.name;
	push_out(eng);
	assert_int_equal(stats_of(eng).chunks, 0);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	assert_int_equal(stats_of(eng).disk_chunk_pages, 4 + 1);
	chunk_back(eng, &id, &id);     /* by its entry id */

	push_out(eng);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	chunk_back(eng, &name, &id);   /* by its name */

	/* A register of the same tokens finds it: a hit, nothing to fill. */
	push_out(eng);
	while ((rc = share_chunk_register(eng, toks, CTOK, KVP_CHUNK_CONTEXT, NULL,
					  OWNER, NOW, &r, &e)) == -EINPROGRESS)
		disk_tier_flush(g_disk);
	assert_int_equal(rc, 0);
	assert_false(r.created);
	assert_int_equal(r.state, KVP_CHUNK_READY);
	expect_chunk_bytes(eng, &id, KEY, CTOK);

	/* A warm restart keeps it, with its name and metadata. */
	push_out(eng);
	eng = restart(device_visible);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	chunk_back(eng, &name, &id);
}

static void chunk_device_visible(void **state)
{
	(void)state;
	chunk_to_disk_and_back(true);
}

static void chunk_device_opaque(void **state)
{
	(void)state;
	chunk_to_disk_and_back(false);
}

/* Deleted or cleared while on disk: gone there too, never back. */
static void chunk_deleted_on_disk_stays_deleted(void **state)
{
	struct engine *eng = mk_disk_engine(true);
	struct kvp_chunk_id id, id2;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint32_t toks[CTOK], toks2[CTOK];

	(void)state;
	tokens_seq(toks, CTOK, 500);
	tokens_seq(toks2, CTOK, 900);
	chunk_put(eng, toks, CTOK, KVP_CHUNK_CONTEXT, META, OWNER, NOW, KEY, false,
		  &id);
	chunk_put(eng, toks2, CTOK, KVP_CHUNK_SYSTEM, NULL, OWNER, NOW, KEY + 1,
		  false, &id2);
	push_out(eng);
	assert_int_equal(stats_of(eng).disk_chunks, 2);
	/* By its entry id: one entry deleted, the disk copy with it. */
	assert_int_equal(share_chunk_delete(eng, &id, &e), 1);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	assert_int_equal(share_chunk_acquire(eng, &id, OWNER, NOW, &L, &e), -ENOENT);
	assert_int_equal(share_chunk_delete(eng, &id, &e), -ENOENT);
	/* A clear of another type leaves it; of its type drops it. */
	assert_int_equal(share_chunk_clear(eng, KVP_CHUNK_QUERY), 0);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	assert_int_equal(share_chunk_clear(eng, KVP_CHUNK_SYSTEM), 1);
	assert_int_equal(stats_of(eng).disk_chunks, 0);
	assert_int_equal(share_chunk_acquire(eng, &id2, OWNER, NOW, &L, &e), -ENOENT);
	CHECK(eng);
}

/* Overwrite 16 bytes of the disk file's slot s at offset off. */
static void damage_slot(uint32_t s, uint64_t off)
{
	struct kvp_layout l;
	uint8_t junk[16];
	char path[128];
	int fd;

	test_layout(&l);
	memset(junk, 0x5a, sizeof(junk));
	snprintf(path, sizeof(path), "%s/kvpool.disk", g_dir);
	fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, junk, sizeof(junk),
				(off_t)(s * disk_slot_bytes(l.page_bytes) + off)),
			 sizeof(junk));
	close(fd);
}

/*
 * A warm restart over damaged records: a chunk whose name record is torn
 * is skipped whole, a prefix chain keeps the pages before its damaged one;
 * nothing damaged is served. Slots go lowest first: the chunk (evicted
 * first, 4 pages and its name) holds 0..4, the prefix pages (leaves first)
 * 5..8, page 2 of the chain in slot 6.
 */
static void damaged_records_are_skipped(void **state)
{
	struct engine *eng = mk_disk_engine(true);
	struct kvp_chunk_id id;
	struct share_prefix_hit h;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint32_t toks[PROMPT], ctoks[CTOK];

	(void)state;
	tokens_seq(ctoks, CTOK, 500);
	chunk_put(eng, ctoks, CTOK, KVP_CHUNK_CONTEXT, META, OWNER, NOW, KEY, false,
		  &id);
	tokens_seq(toks, PROMPT, 100);
	seq_put(eng, 1, toks, PROMPT, KEY, OWNER);
	seq_free_ok(eng, 1, OWNER);
	push_out(eng);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	assert_int_equal(stats_of(eng).disk_prefix_pages, 4);
	disk_tier_flush(g_disk);
	drop_engine();
	disk_tier_close(g_disk);
	damage_slot(4, DISK_PAYLOAD_OFF + 8); /* the chunk's name record */
	damage_slot(6, DISK_PAYLOAD_OFF + 8); /* prefix page 2 */
	disk_open();
	eng = engine_on_disk(true);
	assert_int_equal(stats_of(eng).disk_chunks, 0);
	assert_int_equal(stats_of(eng).disk_prefix_pages, 3);
	assert_int_equal(share_chunk_acquire(eng, &id, OWNER, NOW, &L, &e), -ENOENT);
	share_prefix_lookup(eng, toks, PROMPT, &h);
	assert_int_equal(h.npages, 2);
	expect_frames_bytes(eng, h.frames, 0, 2 * PT, KEY, 0);
	CHECK(eng);
}

/* ------------------------------------------------------------ sequences */

/* A sequence built over a chunk only on disk: it comes back first. */
static void seq_over_chunk_on_disk(void **state)
{
	struct engine *eng = mk_disk_engine(false);
	struct kvp_seq_src src = { .kind = KVP_SRC_CHUNK };
	struct errbuf e = { .msg = "" };
	struct engine_lease L;
	uint32_t toks[2 * PT];
	int rc;

	(void)state;
	tokens_seq(toks, 2 * PT, 700);
	chunk_put(eng, toks, 2 * PT, KVP_CHUNK_SYSTEM, NULL, OWNER, NOW, KEY, false,
		  &src.chunk);
	push_out(eng);
	assert_int_equal(stats_of(eng).disk_chunks, 1);
	while ((rc = share_seq_create(eng, 1, &src, 1, 1, OWNER, &L, &e)) ==
	       -EINPROGRESS)
		disk_tier_flush(g_disk);
	if (rc)
		fail_msg("seq_create over a chunk on disk = %d: %s", rc, e.msg);
	assert_int_equal(L.len, 2 * PT);
	release_ok(eng, L.id);
	expect_seq_bytes(eng, 1, 0, 2 * PT, KEY, 0);
	CHECK(eng);
}

/* A sequence built over a user only on disk: the user comes back first. */
static void seq_over_user_on_disk(void **state)
{
	struct engine *eng = mk_disk_engine(true);
	struct kvp_seq_src src = { .kind = KVP_SRC_USER, .id = USER };
	struct errbuf e = { .msg = "" };
	struct engine_lease L;
	struct engine_user_info in;
	int rc;

	(void)state;
	put(eng, USER, 0, 3 * PT);
	assert_true(engine_evict(eng, USER, KVP_SEL_TO_DISK, &e) > 0);
	disk_tier_flush(g_disk);
	in = info_of(eng, USER);
	assert_int_equal(in.pages_device + in.pages_host, 0);
	while ((rc = share_seq_create(eng, 1, &src, 1, 2, OWNER, &L, &e)) ==
	       -EINPROGRESS)
		disk_tier_flush(g_disk);
	if (rc)
		fail_msg("seq_create over a user on disk = %d: %s", rc, e.msg);
	assert_int_equal(L.len, 3 * PT);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	expect_seq_bytes(eng, 1, 0, 3 * PT, USER, 0);
	CHECK(eng);
}

int main(void)
{
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(prefix_device_visible, teardown_all),
		cmocka_unit_test_teardown(prefix_device_opaque, teardown_all),
		cmocka_unit_test_teardown(chunk_device_visible, teardown_all),
		cmocka_unit_test_teardown(chunk_device_opaque, teardown_all),
		cmocka_unit_test_teardown(chunk_deleted_on_disk_stays_deleted,
					  teardown_all),
		cmocka_unit_test_teardown(damaged_records_are_skipped, teardown_all),
		cmocka_unit_test_teardown(seq_over_user_on_disk, teardown_all),
		cmocka_unit_test_teardown(seq_over_chunk_on_disk, teardown_all),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
