/* SPDX-License-Identifier: MIT */
/*
 * test_remote_cluster.c - the remote tier's Redis Cluster client and values
 * (daemon/remote/) against a real cluster of three redis-server processes
 * on loopback: CRC16 slots as the cluster spec computes them, URLs that
 * are refused with the fix, a batch spread over every node and back byte
 * for byte, a MOVED slot and an ASK (migrating) slot followed, a killed
 * node and a stopped node answering misses within the timeout while the
 * other nodes still hit, and values that are dropped when damaged or when
 * they name another key or layout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hiredis/hiredis.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "redis_cluster.h"
#include "redis_local.h"
#include "remote_value.h"

static struct redis_local g_redis;

static int setup_cluster(void **state)
{
	int ret = redis_local_start(&g_redis, 3);

	(void)state;
	if (ret == 77)
		exit(77);
	if (ret)
		fprintf(stderr, "redis_local_start: %d (logs in %s)\n", ret, g_redis.dir);
	return ret;
}

static int teardown_cluster(void **state)
{
	(void)state;
	redis_local_stop(&g_redis);
	return 0;
}

static void test_slot_is_the_cluster_specs_crc16(void **state)
{
	(void)state;
	/* The spec's check value: CRC16/XMODEM("123456789") = 0x31c3. */
	assert_int_equal(redis_cluster_slot("123456789", 9), 0x31c3);
	assert_int_equal(redis_cluster_slot("foo", 3), 12182);
	assert_int_equal(redis_cluster_slot("bar", 3), 5061);
	/* A hash tag decides alone; an empty one does not count. */
	assert_int_equal(redis_cluster_slot("{user1000}.following", 20),
			 redis_cluster_slot("user1000", 8));
	assert_int_equal(redis_cluster_slot("foo{}{bar}", 10),
			 redis_cluster_slot("foo{}{bar}", 10));
	assert_int_not_equal(redis_cluster_slot("foo{}{bar}", 10),
			     redis_cluster_slot("bar", 3));
}

static void test_bad_urls_are_refused_with_the_fix(void **state)
{
	static const char *bad[] = { "redis://h:1", "redis-cluster://", "redis-cluster://h",
				     "redis-cluster://h:0", "redis-cluster://h:70000",
				     "redis-cluster://h:1,", "redis-cluster://:5" };
	struct errbuf e;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		e.msg[0] = '\0';
		assert_int_equal(redis_cluster_check_url(bad[i], &e), -EINVAL);
		assert_non_null(strstr(e.msg, "redis-cluster://host:port"));
	}
	assert_int_equal(redis_cluster_check_url("redis-cluster://10.0.0.1:7000,a.b:7001", &e), 0);
}

#define NKEYS 300

struct got {
	char val[NKEYS][32];
	uint32_t calls;
};

static void on_value(void *arg, uint32_t i, char **val, size_t len)
{
	struct got *g = arg;

	assert_true(len < sizeof(g->val[i]));
	memcpy(g->val[i], *val, len);
	g->val[i][len] = '\0';
	g->calls++;
}

static void fill(char (*keys)[32], char (*vals)[32], struct rc_item *it, const char *tag)
{
	for (int i = 0; i < NKEYS; i++) {
		snprintf(keys[i], 32, "%s-key-%d", tag, i);
		snprintf(vals[i], 32, "%s-val-%d", tag, i);
		it[i] = (struct rc_item){ .key = keys[i], .klen = strlen(keys[i]),
					  .val = vals[i], .vlen = strlen(vals[i]) };
	}
}

static void test_batch_spreads_over_every_node_and_comes_back(void **state)
{
	static char keys[NKEYS][32], vals[NKEYS][32];
	static struct rc_item it[NKEYS];
	static struct got g;
	struct redis_cluster *rc;
	struct rc_node_stats st;
	struct errbuf e;
	char one[64];

	(void)state;
	/* One seed is enough: the rest of the map comes from CLUSTER SLOTS. */
	snprintf(one, sizeof(one), "redis-cluster://127.0.0.1:%d", g_redis.port[1]);
	assert_int_equal(redis_cluster_open(&rc, one, 1000, &e), 0);
	assert_int_equal(redis_cluster_mapped_slots(rc), RC_SLOTS);
	assert_int_equal(redis_cluster_nodes(rc), 3);
	fill(keys, vals, it, "spread");
	assert_int_equal(redis_cluster_set(rc, it, NKEYS), NKEYS);
	memset(&g, 0, sizeof(g));
	assert_int_equal(redis_cluster_get(rc, it, NKEYS, on_value, &g), NKEYS);
	assert_int_equal(g.calls, NKEYS);
	for (int i = 0; i < NKEYS; i++) {
		assert_int_equal(it[i].status, RC_HIT);
		assert_string_equal(g.val[i], vals[i]);
	}
	/* One pipelined round per node per batch, each node some of the keys. */
	for (uint32_t k = 0; k < 3; k++) {
		redis_cluster_node_stats(rc, k, &st);
		assert_true(st.up);
		assert_true(st.hits > NKEYS / 6);
		assert_int_equal(st.rounds, 2);
		assert_int_equal(st.errors, 0);
	}
	/* A key nobody set is a miss. */
	it[0].key = "never-set";
	it[0].klen = 9;
	assert_int_equal(redis_cluster_get(rc, it, 1, on_value, &g), 0);
	assert_int_equal(it[0].status, RC_MISS);
	redis_cluster_close(rc);
}

static int owner_of(uint16_t slot)
{
	for (int i = 0; i < 3; i++)
		if (slot >= 16384 * i / 3 && slot <= 16384 * (i + 1) / 3 - 1)
			return i;
	return -1;
}

/* A command on a node that must not answer an error. */
#define cmd_ok(node, ...)                                                    \
	do {                                                                 \
		redisReply *r_ = redis_local_cmd(&g_redis, node, __VA_ARGS__); \
		assert_non_null(r_);                                         \
		if (r_->type == REDIS_REPLY_ERROR)                           \
			fail_msg("node %d: %s", node, r_->str);              \
		freeReplyObject(r_);                                         \
	} while (0)

static void test_moved_and_ask_are_followed(void **state)
{
	struct rc_item it = { .key = "moved-key", .klen = 9, .val = "m", .vlen = 1 };
	uint16_t slot = redis_cluster_slot("moved-key", 9);
	int from = owner_of(slot), to = (from + 1) % 3;
	struct redis_cluster *rc;
	static struct got g;
	struct errbuf e;
	redisReply *r;

	(void)state;
	assert_int_equal(redis_cluster_open(&rc, g_redis.url, 1000, &e), 0);
	/* MOVED: the (empty) slot now belongs to another node; the client's
	 * map still says the old one. */
	for (int i = 0; i < 3; i++)
		cmd_ok(i, "CLUSTER SETSLOT %u NODE %s", slot, g_redis.id[to]);
	assert_int_equal(redis_cluster_set(rc, &it, 1), 1);
	r = redis_local_cmd(&g_redis, to, "GET moved-key");
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	freeReplyObject(r);
	/* ASK: the slot migrates back; a key already moved answers ASK at
	 * the old owner, and the client asks the new one once. */
	cmd_ok(from, "CLUSTER SETSLOT %u IMPORTING %s", slot, g_redis.id[to]);
	cmd_ok(to, "CLUSTER SETSLOT %u MIGRATING %s", slot, g_redis.id[from]);
	cmd_ok(to, "MIGRATE 127.0.0.1 %d moved-key 0 2000", g_redis.port[from]);
	memset(&g, 0, sizeof(g));
	it.key = "moved-key";
	assert_int_equal(redis_cluster_get(rc, &it, 1, on_value, &g), 1);
	assert_string_equal(g.val[0], "m");
	for (int i = 0; i < 3; i++)
		cmd_ok(i, "CLUSTER SETSLOT %u NODE %s", slot, g_redis.id[from]);
	redis_cluster_close(rc);
}

static void test_stopped_node_is_a_miss_within_the_timeout(void **state)
{
	static char keys[NKEYS][32], vals[NKEYS][32];
	static struct rc_item it[NKEYS];
	static struct got g;
	struct redis_cluster *rc;
	struct errbuf e;
	uint32_t hits, down = 0;
	uint64_t t0, ms;

	(void)state;
	assert_int_equal(redis_cluster_open(&rc, g_redis.url, 200, &e), 0);
	fill(keys, vals, it, "stop");
	assert_int_equal(redis_cluster_set(rc, it, NKEYS), NKEYS);
	/* A node that accepts but never answers (SIGSTOP): the batch ends at
	 * the timeout, its keys misses, every other key served. */
	kill(g_redis.pid[2], SIGSTOP);
	t0 = mono_ns();
	memset(&g, 0, sizeof(g));
	hits = redis_cluster_get(rc, it, NKEYS, on_value, &g);
	ms = (mono_ns() - t0) / 1000000;
	kill(g_redis.pid[2], SIGCONT);
	assert_true(ms < 1500);
	for (int i = 0; i < NKEYS; i++) {
		if (owner_of(redis_cluster_slot(keys[i], strlen(keys[i]))) == 2) {
			assert_int_equal(it[i].status, RC_DOWN);
			down++;
		} else {
			assert_int_equal(it[i].status, RC_HIT);
			assert_string_equal(g.val[i], vals[i]);
		}
	}
	assert_true(down > 0);
	assert_int_equal(hits, NKEYS - down);
	redis_cluster_close(rc);
}

static void test_killed_node_is_a_miss_and_the_rest_hit(void **state)
{
	static char keys[NKEYS][32], vals[NKEYS][32];
	static struct rc_item it[NKEYS];
	static struct got g;
	struct redis_cluster *rc;
	struct rc_node_stats st;
	struct errbuf e;
	uint32_t hits, down = 0;
	uint64_t t0;

	(void)state;
	assert_int_equal(redis_cluster_open(&rc, g_redis.url, 500, &e), 0);
	fill(keys, vals, it, "kill");
	assert_int_equal(redis_cluster_set(rc, it, NKEYS), NKEYS);
	kill(g_redis.pid[1], SIGKILL);
	assert_int_equal(waitpid(g_redis.pid[1], NULL, 0), g_redis.pid[1]);
	g_redis.pid[1] = 0;
	for (int round = 0; round < 2; round++) {
		t0 = mono_ns();
		memset(&g, 0, sizeof(g));
		hits = redis_cluster_get(rc, it, NKEYS, on_value, &g);
		assert_true(mono_ns() - t0 < 1000000000ull);
		down = 0;
		for (int i = 0; i < NKEYS; i++) {
			bool gone = owner_of(redis_cluster_slot(keys[i], strlen(keys[i]))) == 1;

			assert_int_equal(it[i].status, gone ? RC_DOWN : RC_HIT);
			down += gone;
			if (!gone)
				assert_string_equal(g.val[i], vals[i]);
		}
		assert_int_equal(hits, NKEYS - down);
	}
	for (uint32_t k = 0; k < redis_cluster_nodes(rc); k++) {
		redis_cluster_node_stats(rc, k, &st);
		if (strstr(st.addr, "127.0.0.1") && st.errors) {
			assert_false(st.up);
			assert_true(st.errors >= down);
		}
	}
	redis_cluster_close(rc);
}

static void test_value_round_trip_and_damage_is_dropped(void **state)
{
	struct kvp_layout l;
	struct disk_codec none = { DISK_CODEC_NONE, 0, 2 }, z = { DISK_CODEC_ZSTD_SHUFFLE2, 3, 2 };
	struct remote_key k = { .kind = DISK_KIND_PREFIX, .tenant = 7 }, k2;
	struct disk_codec_ctx *x;
	uint8_t *page, *val, *back;
	char err[128], key[REMOTE_KEY_MAX];
	size_t len;

	(void)state;
	assert_int_equal(kvp_layout_init(&l, 2, 2, 64, KVP_DTYPE_BF16, 16, err, sizeof(err)), 0);
	k.layout_id = disk_layout_id(&l);
	for (int i = 0; i < 32; i++)
		k.hash[i] = (uint8_t)(i * 7);
	page = malloc(l.page_bytes);
	back = malloc(l.page_bytes);
	val = malloc(remote_value_max(l.page_bytes));
	x = disk_codec_ctx_new(l.page_bytes);
	assert_non_null(x);
	for (uint64_t i = 0; i < l.page_bytes; i++)
		page[i] = (uint8_t)(i & 1 ? 0x3f : i * 31); /* bf16-like: compressible */
	len = remote_key_format(&k, key);
	assert_int_equal(len, strlen(key));
	assert_memory_equal(key, "kvp1:p:", 7);
	assert_null(strchr(key, '{'));
	for (int c = 0; c < 2; c++) {
		len = remote_value_encode(x, c ? &z : &none, &k, page, l.page_bytes, val);
		assert_true(c ? len < DISK_HDR_BYTES + l.page_bytes : len == DISK_HDR_BYTES + l.page_bytes);
		memset(back, 0, l.page_bytes);
		assert_int_equal(remote_value_decode(x, &k, val, len, back, l.page_bytes), 0);
		assert_memory_equal(back, page, l.page_bytes);
		/* Another key's value, a flipped byte, a short value: dropped. */
		k2 = k;
		k2.hash[5] ^= 1;
		assert_int_equal(remote_value_decode(x, &k2, val, len, back, l.page_bytes), -EBADMSG);
		k2 = k;
		k2.layout_id++;
		assert_int_equal(remote_value_decode(x, &k2, val, len, back, l.page_bytes), -EBADMSG);
		val[len - 3] ^= 0x10;
		assert_int_equal(remote_value_decode(x, &k, val, len, back, l.page_bytes), -EBADMSG);
		val[len - 3] ^= 0x10;
		assert_int_equal(remote_value_decode(x, &k, val, len - 1, back, l.page_bytes), -EBADMSG);
		assert_int_equal(remote_value_decode(x, &k, val, 10, back, l.page_bytes), -EBADMSG);
	}
	disk_codec_ctx_free(x);
	free(page);
	free(back);
	free(val);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slot_is_the_cluster_specs_crc16),
		cmocka_unit_test(test_bad_urls_are_refused_with_the_fix),
		cmocka_unit_test(test_value_round_trip_and_damage_is_dropped),
		cmocka_unit_test(test_batch_spreads_over_every_node_and_comes_back),
		cmocka_unit_test(test_moved_and_ask_are_followed),
		cmocka_unit_test(test_stopped_node_is_a_miss_within_the_timeout),
		/* Last: it kills a node for good. */
		cmocka_unit_test(test_killed_node_is_a_miss_and_the_rest_hit),
	};

	return cmocka_run_group_tests(tests, setup_cluster, teardown_cluster);
}
