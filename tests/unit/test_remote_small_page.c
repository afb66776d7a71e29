/* SPDX-License-Identifier: MIT */
/*
 * test_remote_small_page.c - a chunk fetched from the store by an engine
 * whose pages are smaller than a chunk record (struct chunk_rec, 88
 * bytes). Such an engine never writes a chunk record (share_disk.c: the
 * record must fit a page), but a hostile or mistaken store can still hold
 * one under the chunk's key: a value that checks (its own key, sealed, a
 * page long) whose page is the first bytes of a record. The fetch must be
 * a miss that reads nothing past the value; before, chunk_expand and
 * remote_chunk_fetch read the whole struct chunk_rec out of the 32-byte
 * page (a heap read past hiredis's reply: ASan's heap-buffer-overflow).
 *
 * Against three redis-server processes on loopback (skips, 77, where
 * redis-server is not installed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hiredis/hiredis.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "disk_engine.h"
#include "remote_engine.h"
#include "engine_helpers.h"
#include "kvpool_engine.h"
#include "redis_cluster.h"
#include "redis_local.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "share_disk.h"

#define TENANT 7

static struct redis_local g_redis;
static struct remote_tier *g_rt;
static struct kvp_layout g_layout;

static int setup(void **state)
{
	struct remote_tier_config c = { .timeout_ms = 300 };
	char msg[KVP_ERRLEN];
	struct errbuf e;
	int ret;

	(void)state;
	/* 1 layer, 1 head of 8 bf16, 1 token: 32-byte pages. */
	if (kvp_layout_init(&g_layout, 1, 1, 8, KVP_DTYPE_BF16, 1, msg, sizeof(msg)))
		fail_msg("kvp_layout_init: %s", msg);
	assert_true(g_layout.page_bytes < sizeof(struct chunk_rec));
	ret = redis_local_start(&g_redis, 3);
	if (ret == 77)
		exit(77);
	if (ret)
		return ret;
	c.layout = g_layout;
	c.url = g_redis.url;
	return remote_tier_open(&g_rt, &c, &e);
}

static int teardown_all(void **state)
{
	(void)state;
	remote_tier_close(g_rt);
	redis_local_stop(&g_redis);
	return 0;
}

/* SET key = val on the node that owns the key. */
static void store_set(const struct remote_key *k, const void *val, size_t len)
{
	char key[REMOTE_KEY_MAX];
	redisReply *r;
	size_t kl = remote_key_format(k, key);
	int node = (int)(redis_cluster_slot(key, kl) * 3 / RC_SLOTS);

	r = redis_local_cmd(&g_redis, node, "SET %b %b", key, kl, val, len);
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STATUS);
	freeReplyObject(r);
}

static void test_chunk_record_longer_than_a_page_is_a_miss(void **state)
{
	struct engine_config cfg = { .device_frames = 32, .host_frames = 16,
				     .disk_tenant = TENANT, .remote = g_rt,
				     .layout = g_layout };
	struct remote_key k = { .kind = DISK_KIND_CHUNK, .tenant = TENANT,
				.page = REMOTE_PAGE_REC };
	struct chunk_rec rec = { .magic = CHUNK_REC_MAGIC, .type = KVP_CHUNK_CONTEXT,
				 .ntokens = 1, .npages = 1 };
	struct disk_codec none = { .id = DISK_CODEC_NONE };
	struct kvp_chunk_id id;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct engine *eng = NULL;
	uint8_t *val = malloc(remote_value_max(g_layout.page_bytes));
	size_t len;
	int rc, rounds = 0;

	(void)state;
	assert_non_null(val);
	memset(id.b, 0x5a, sizeof(id.b));
	memcpy(rec.name_id, id.b, 32);
	memcpy(rec.entry_id, id.b, 32);
	k.layout_id = disk_layout_id(&g_layout);
	memcpy(k.hash, id.b, 32);
	/* The record's first page_bytes: a value that checks, a page long. */
	len = remote_value_encode(NULL, &none, &k, &rec, g_layout.page_bytes, val);
	assert_int_equal(len, DISK_HDR_BYTES + g_layout.page_bytes);
	store_set(&k, val, len);
	if (engine_create(&eng, &cfg, &e))
		fail_msg("engine_create: %s", e.msg);
	while ((rc = share_chunk_acquire(eng, &id, OWNER, 1, &L, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 3000); /* bounded: the timeout is 300 ms */
	}
	assert_int_equal(rc, -ENOENT);
	engine_destroy(eng);
	free(val);
}

int main(void)
{
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chunk_record_longer_than_a_page_is_a_miss),
	};

	return cmocka_run_group_tests(tests, setup, teardown_all);
}
