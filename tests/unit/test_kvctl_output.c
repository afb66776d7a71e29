/* SPDX-License-Identifier: MIT */
/*
 * test_kvctl_output.c - what kvctl prints and how it reads its arguments,
 * without a daemon: user ids parse strictly (no sign, space, suffix or
 * overflow); tier names map both ways; JSON strings are valid JSON for any
 * bytes (escapes, UTF-8 kept, invalid UTF-8 as U+FFFD); sizes and
 * percentages round as documented; client names are made safe for a
 * terminal; tables align; and every command's JSON and table come out byte
 * for byte as kvctl(1) documents them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvctl.h"

/* ---------------------------------------------------------------- capture */

struct capture {
	char *buf;
	size_t len;
	FILE *f;
};

static FILE *capture_open(struct capture *c)
{
	c->buf = NULL;
	c->len = 0;
	c->f = open_memstream(&c->buf, &c->len);
	assert_non_null(c->f);
	return c->f;
}

/* Close the stream and compare everything written with want. */
static void capture_expect(struct capture *c, const char *want)
{
	assert_int_equal(fclose(c->f), 0);
	if (strcmp(c->buf, want) != 0)
		fail_msg("output differs\n--- got:\n%s\n--- want:\n%s", c->buf, want);
	free(c->buf);
}

/* Close the stream; what was written starts with want. */
static void capture_expect_prefix(struct capture *c, const char *want)
{
	assert_int_equal(fclose(c->f), 0);
	if (strncmp(c->buf, want, strlen(want)) != 0)
		fail_msg("output starts otherwise\n--- got:\n%s\n--- want:\n%s",
			 c->buf, want);
	free(c->buf);
}

static void expect_json_string(const char *in, size_t len, const char *want)
{
	struct capture c;

	json_write_string(capture_open(&c), in, len);
	capture_expect(&c, want);
}

/* ---------------------------------------------------------------- parse */

static void parse_u64_accepts_decimal_up_to_max(void **state)
{
	uint64_t v;

	assert_int_equal(parse_u64("0", &v), 0);
	assert_true(v == 0);
	assert_int_equal(parse_u64("42", &v), 0);
	assert_true(v == 42);
	assert_int_equal(parse_u64("007", &v), 0);
	assert_true(v == 7);
	assert_int_equal(parse_u64("18446744073709551615", &v), 0);
	assert_true(v == UINT64_MAX);
}

static void parse_u64_rejects_signs_spaces_suffixes_and_overflow(void **state)
{
	static const char *const bad[] = {
		"", "12x", "-1", "+1", " 1", "1 ", "0x10", "1e3", "1.0", "1_000", "x",
		"99999999999999999999x",
	};
	uint64_t v = 77;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (parse_u64(bad[i], &v) != -EINVAL)
			fail_msg("parse_u64(\"%s\") did not return -EINVAL", bad[i]);
	assert_int_equal(parse_u64(NULL, &v), -EINVAL);
	assert_int_equal(parse_u64("18446744073709551616", &v), -ERANGE);
	assert_int_equal(parse_u64("99999999999999999999", &v), -ERANGE);
	assert_true(v == 77); /* untouched on failure */
}

static void tier_names_map_both_ways_and_reject_others(void **state)
{
	uint32_t sel = 0;

	assert_int_equal(parse_tier_sel("device", &sel), 0);
	assert_int_equal(sel, KVP_SEL_DEVICE);
	assert_int_equal(parse_tier_sel("host", &sel), 0);
	assert_int_equal(sel, KVP_SEL_HOST);
	assert_int_equal(parse_tier_sel("all", &sel), 0);
	assert_int_equal(sel, KVP_SEL_ALL);
	assert_int_equal(parse_tier_sel("gpu", &sel), -EINVAL);
	assert_int_equal(parse_tier_sel("Device", &sel), -EINVAL);
	assert_int_equal(parse_tier_sel("", &sel), -EINVAL);
	assert_int_equal(parse_tier_sel(NULL, &sel), -EINVAL);
	assert_string_equal(tier_sel_name(KVP_SEL_DEVICE), "device");
	assert_string_equal(tier_sel_name(KVP_SEL_HOST), "host");
	assert_string_equal(tier_sel_name(KVP_SEL_ALL), "all");
	assert_string_equal(tier_sel_name(0), "?");
}

/* ---------------------------------------------------------------- JSON strings */

static void json_string_escapes_quotes_backslashes_and_controls(void **state)
{
	expect_json_string("plain", 5, "\"plain\"");
	expect_json_string("", 0, "\"\"");
	expect_json_string("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
	expect_json_string("\b\f\n\r\t", 5, "\"\\b\\f\\n\\r\\t\"");
	expect_json_string("\x01\x1b[0m\x7f", 6, "\"\\u0001\\u001b[0m\\u007f\"");
	/* len, not the NUL, ends the string: a NUL inside is escaped. */
	expect_json_string("a\0b", 3, "\"a\\u0000b\"");
}

static void json_string_keeps_valid_utf8(void **state)
{
	expect_json_string("caf\xc3\xa9", 5, "\"caf\xc3\xa9\"");                   /* U+00E9 */
	expect_json_string("\xe2\x82\xac", 3, "\"\xe2\x82\xac\"");                 /* U+20AC */
	expect_json_string("\xf0\x9f\x98\x80", 4, "\"\xf0\x9f\x98\x80\"");         /* U+1F600 */
	expect_json_string("\xf4\x8f\xbf\xbf", 4, "\"\xf4\x8f\xbf\xbf\"");         /* U+10FFFF */
	expect_json_string("\xed\x9f\xbf", 3, "\"\xed\x9f\xbf\"");                 /* U+D7FF */
}

static void json_string_replaces_invalid_utf8_byte_by_byte(void **state)
{
	expect_json_string("\xff", 1, "\"\\ufffd\"");
	expect_json_string("\x80x", 2, "\"\\ufffdx\"");               /* lone continuation */
	expect_json_string("\xc0\x80", 2, "\"\\ufffd\\ufffd\"");      /* overlong NUL */
	expect_json_string("\xe0\x80\xaf", 3, "\"\\ufffd\\ufffd\\ufffd\""); /* overlong '/' */
	expect_json_string("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\""); /* surrogate */
	expect_json_string("\xf4\x90\x80\x80", 4,
			   "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");         /* > U+10FFFF */
	expect_json_string("\xe2\x82", 2, "\"\\ufffd\\ufffd\"");      /* cut short at the end */
	expect_json_string("\xe2\x82" "a", 3, "\"\\ufffd\\ufffda\""); /* cut short by ASCII */
}

static void json_writer_nests_and_separates_members(void **state)
{
	struct capture c;
	struct json j;

	json_begin(&j, capture_open(&c));
	json_u64(&j, "n", UINT64_MAX);
	json_obj_begin(&j, "o");
	json_bool(&j, "t", true);
	json_null(&j, "z");
	json_obj_end(&j);
	json_arr_begin(&j, "empty");
	json_arr_end(&j);
	json_arr_begin(&j, "a");
	json_str(&j, NULL, "x\"y");
	json_str(&j, NULL, NULL);
	json_arr_end(&j);
	json_strn(&j, "name", "abcdef", 3);
	json_end(&j);
	capture_expect(&c,
		       "{\n"
		       "  \"n\": 18446744073709551615,\n"
		       "  \"o\": {\n"
		       "    \"t\": true,\n"
		       "    \"z\": null\n"
		       "  },\n"
		       "  \"empty\": [],\n"
		       "  \"a\": [\n"
		       "    \"x\\\"y\",\n"
		       "    null\n"
		       "  ],\n"
		       "  \"name\": \"abc\"\n"
		       "}\n");
}

/* ---------------------------------------------------------------- numbers, text */

static void fmt_bytes_uses_binary_units_with_one_decimal(void **state)
{
	static const struct {
		uint64_t v;
		const char *want;
	} cases[] = {
		{ 0, "0 B" },
		{ 1023, "1023 B" },
		{ 1024, "1.0 KiB" },
		{ 1536, "1.5 KiB" },
		{ 1048575, "1.0 MiB" },      /* 1023.999 KiB must not print as 1024.0 KiB */
		{ 1610612736ull, "1.5 GiB" },
		{ 3ull << 40, "3.0 TiB" },
		{ UINT64_MAX, "16.0 EiB" },
	};
	char buf[32];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fmt_bytes(buf, sizeof(buf), cases[i].v);
		if (strcmp(buf, cases[i].want) != 0)
			fail_msg("fmt_bytes(%llu) = \"%s\", want \"%s\"",
				 (unsigned long long)cases[i].v, buf, cases[i].want);
	}
}

static void fmt_percent_rounds_down_and_handles_empty_tiers(void **state)
{
	static const struct {
		uint64_t part, whole;
		const char *want;
	} cases[] = {
		{ 0, 0, "-" },
		{ 0, 10, "0.0%" },
		{ 1, 4, "25.0%" },
		{ 1, 3, "33.3%" },
		{ 2, 3, "66.6%" },
		{ 9999, 10000, "99.9%" },        /* not 100.0% while a frame is free */
		{ 10000, 10000, "100.0%" },
		{ UINT64_MAX - 1, UINT64_MAX, "99.9%" },
		{ UINT64_MAX, UINT64_MAX, "100.0%" },
	};
	char buf[32];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fmt_percent(buf, sizeof(buf), cases[i].part, cases[i].whole);
		if (strcmp(buf, cases[i].want) != 0)
			fail_msg("fmt_percent(%llu, %llu) = \"%s\", want \"%s\"",
				 (unsigned long long)cases[i].part,
				 (unsigned long long)cases[i].whole, buf, cases[i].want);
	}
}

static void text_sanitize_keeps_printable_ascii_only(void **state)
{
	char name[32], out[64];

	assert_int_equal(text_sanitize(out, sizeof(out), "\x1b[31mred\xc3\xa9", 32), 10);
	assert_string_equal(out, "?[31mred??");
	assert_int_equal(text_sanitize(out, sizeof(out), "", 32), 1);
	assert_string_equal(out, "-");
	/* A full 32-byte field with no NUL is read to its end and no further. */
	memset(name, 'n', sizeof(name));
	assert_int_equal(text_sanitize(out, sizeof(out), name, sizeof(name)), 32);
	assert_int_equal(strlen(out), 32);
	/* A short destination cuts and still terminates. */
	assert_int_equal(text_sanitize(out, 4, "abcdef", 6), 3);
	assert_string_equal(out, "abc");
}

static const struct table_col demo_cols[] = { { "NAME", true }, { "N", false } };

static void demo_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	static const char *const cells[][2] = { { "a", "1" }, { "longer", "12345" } };

	snprintf(buf, len, "%s", cells[row][col]);
}

static void table_sizes_columns_to_widest_cell(void **state)
{
	struct capture c;

	table_print(capture_open(&c), demo_cols, 2, 2, demo_cell, NULL);
	capture_expect(&c,
		       "NAME        N\n"
		       "a           1\n"
		       "longer  12345\n");
	table_print(capture_open(&c), demo_cols, 2, 0, demo_cell, NULL);
	capture_expect(&c, "NAME  N\n");
}

/* ---------------------------------------------------------------- commands */

/* The clock the renderers count ages from in these tests. */
#define SEC 1000000000ull
#define DEMO_NOW (1795000000ull * SEC)

/* Every field a different value, so a field printed under another's name shows. */
static struct kvp_stats demo_stats(void)
{
	struct kvp_stats s = {
		.tier = {
			[KVP_TIER_DEVICE] = { 4096, 1024, 3072, 2ull << 30 },
			[KVP_TIER_HOST] = { 0, 0, 0, 0 },
		},
		.users = 1, .leases = 2, .prepares = 3, .commits = 4, .releases = 5,
		.hit_tokens = 6, .committed_tokens = 7, .evicted_users = 8,
		.evicted_pages = 9, .demoted_users = 10, .demoted_pages = 11,
		.offloaded_pages = 12, .onloaded_pages = 13, .trimmed_pages = 14,
		.bytes_d2h = 3ull << 20, .bytes_h2d = 16, .clients = 17, .tenants = 18,
		.prefix_pages = 19, .prefix_idle_pages = 20, .prefix_lookups = 21,
		.prefix_lookup_tokens = 400, .prefix_hit_tokens = 100,
		.prefix_evicted_pages = 22, .prefix_dedupe_pages = 23, .seqs = 24,
		.seq_pages = 25, .cow_pages = 26, .chunks = 27, .chunk_pages = 28,
		.chunk_bytes = 5ull << 20, .chunk_lookups = 8, .chunk_hits = 6,
		.chunk_evicted = 29, .chunk_last_access_ns = DEMO_NOW - 90 * SEC,
		.compositions = 30, .ns_d2h = 31, .reclaim_stalls = 32,
		.reclaimed_pages = 33, .shards = 4, .reclaim_onload_stalls = 34,
		.reclaim_direct = 35, .disk_users = 36, .disk_pages = 37,
		.disk_demoted_pages = 38, .disk_read_pages = 39,
		.disk_dropped_pages = 40, .disk_stored_bytes = 41,
		.disk_prefix_pages = 42, .disk_chunks = 43, .disk_chunk_pages = 44,
		.ns_h2d = 45,
	};

	return s;
}

static void stats_json_has_tiers_gauges_and_every_counter(void **state)
{
	static const char want_all[] = "{\n  \"scope\": \"all_tenants\",\n  \"tiers\": {\n";
	struct kvp_stats s = demo_stats();
	struct capture c;

	/* One tenant's own client: the scope is that tenant. */
	s.tenants = 1;
	render_stats(capture_open(&c), true, &s, NULL, false, DEMO_NOW);
	capture_expect(&c,
		       "{\n"
		       "  \"scope\": \"tenant\",\n"
		       "  \"tiers\": {\n"
		       "    \"device\": {\n"
		       "      \"frames_total\": 4096,\n"
		       "      \"frames_used\": 1024,\n"
		       "      \"frames_free\": 3072,\n"
		       "      \"bytes_total\": 2147483648\n"
		       "    },\n"
		       "    \"host\": {\n"
		       "      \"frames_total\": 0,\n"
		       "      \"frames_used\": 0,\n"
		       "      \"frames_free\": 0,\n"
		       "      \"bytes_total\": 0\n"
		       "    }\n"
		       "  },\n"
		       "  \"users\": 1,\n"
		       "  \"leases\": 2,\n"
		       "  \"clients\": 17,\n"
		       "  \"tenants\": 1,\n"
		       "  \"shards\": 4,\n"
		       "  \"disk_users\": 36,\n"
		       "  \"disk_pages\": 37,\n"
		       "  \"prepares\": 3,\n"
		       "  \"commits\": 4,\n"
		       "  \"releases\": 5,\n"
		       "  \"hit_tokens\": 6,\n"
		       "  \"committed_tokens\": 7,\n"
		       "  \"evicted_users\": 8,\n"
		       "  \"evicted_pages\": 9,\n"
		       "  \"demoted_users\": 10,\n"
		       "  \"demoted_pages\": 11,\n"
		       "  \"offloaded_pages\": 12,\n"
		       "  \"onloaded_pages\": 13,\n"
		       "  \"trimmed_pages\": 14,\n"
		       "  \"bytes_d2h\": 3145728,\n"
		       "  \"bytes_h2d\": 16,\n"
		       "  \"ns_d2h\": 31,\n"
		       "  \"reclaim_stalls\": 32,\n"
		       "  \"reclaimed_pages\": 33,\n"
		       "  \"reclaim_onload_stalls\": 34,\n"
		       "  \"reclaim_direct\": 35,\n"
		       "  \"disk_demoted_pages\": 38,\n"
		       "  \"disk_read_pages\": 39,\n"
		       "  \"disk_dropped_pages\": 40,\n"
		       "  \"disk_stored_bytes\": 41,\n"
		       "  \"ns_h2d\": 45,\n"
		       "  \"prefix_pages\": 19,\n"
		       "  \"prefix_idle_pages\": 20,\n"
		       "  \"prefix_lookups\": 21,\n"
		       "  \"prefix_lookup_tokens\": 400,\n"
		       "  \"prefix_hit_tokens\": 100,\n"
		       "  \"prefix_evicted_pages\": 22,\n"
		       "  \"prefix_dedupe_pages\": 23,\n"
		       "  \"seqs\": 24,\n"
		       "  \"seq_pages\": 25,\n"
		       "  \"cow_pages\": 26,\n"
		       "  \"chunks\": 27,\n"
		       "  \"chunk_pages\": 28,\n"
		       "  \"chunk_bytes\": 5242880,\n"
		       "  \"chunk_lookups\": 8,\n"
		       "  \"chunk_hits\": 6,\n"
		       "  \"chunk_evicted\": 29,\n"
		       "  \"compositions\": 30,\n"
		       "  \"disk_prefix_pages\": 42,\n"
		       "  \"disk_chunks\": 43,\n"
		       "  \"disk_chunk_pages\": 44,\n"
		       "  \"chunk_last_access_ns\": 1794999910000000000,\n"
		       "  \"chunk_last_access_age_s\": 90,\n"
		       "  \"prefix_hit_rate\": 0.2500,\n"
		       "  \"chunk_hit_rate\": 0.7500\n"
		       "}\n");
	render_stats(capture_open(&c), true, &s, NULL, true, DEMO_NOW);
	capture_expect_prefix(&c, want_all);
	/* Sums over several tenants are all tenants' (a tenantless admin). */
	s.tenants = 2;
	render_stats(capture_open(&c), true, &s, NULL, false, DEMO_NOW);
	capture_expect_prefix(&c, want_all);
}

/* The man page's stats object (JSON OUTPUT) between ".B stats" and ".fi". */
static char *man_stats_block(void)
{
	static char page[1 << 17];
	FILE *f = fopen(KVPOOL_SOURCE_DIR "/man/kvctl.1", "r");
	size_t n;
	char *b, *e;

	assert_non_null(f);
	n = fread(page, 1, sizeof(page) - 1, f);
	fclose(f);
	page[n] = '\0';
	b = strstr(page, "\n.SH JSON OUTPUT\n");
	assert_non_null(b);
	b = strstr(b, "\n.B stats\n.nf\n");
	assert_non_null(b);
	e = strstr(b, "\n.fi\n");
	assert_non_null(e);
	*e = '\0';
	return b;
}

/*
 * Every field of KVP_STATS_FIELDS is in kvctl stats' table (a line of its
 * own, by its name), in its JSON (a key with its value), and in the man
 * page's JSON listing: adding a field to the struct cannot leave any of
 * them behind (ns_d2h once was missing from the table).
 */
static void stats_every_field_in_table_json_and_man_page(void **state)
{
	static const struct { const char *name; size_t off; bool time; } fields[] = {
#define IS_TIME_COUNTER false
#define IS_TIME_GAUGE false
#define IS_TIME_TIME true
#define F(n, group, kind, unit, metric, help)					\
		{ #n, offsetof(struct kvp_stats, n), IS_TIME_##kind },
		KVP_STATS_FIELDS(F)
#undef F
	};
	struct kvp_stats s = { 0 };
	char *man = man_stats_block(), key[64];
	struct capture table, json;

	/* Every uint64_t after tier[] is listed (a struct made from the list
	 * cannot be otherwise; this guards against a field added by hand). */
	assert_int_equal((sizeof(fields) / sizeof(fields[0])) * sizeof(uint64_t) +
			 sizeof(s.tier) + sizeof(s.reserved), sizeof(s));
	assert_int_equal(sizeof(s), sizeof(s.tier) + KVP_STATS_WORDS * sizeof(uint64_t));
	for (size_t i = 0; i < (sizeof(fields) / sizeof(fields[0])); i++) {
		uint64_t v = 1000 + i;

		memcpy((char *)&s + fields[i].off, &v, sizeof(v));
	}
	render_stats(capture_open(&table), false, &s, NULL, false, DEMO_NOW);
	fclose(table.f);
	render_stats(capture_open(&json), true, &s, NULL, false, DEMO_NOW);
	fclose(json.f);
	for (size_t i = 0; i < (sizeof(fields) / sizeof(fields[0])); i++) {
		char line[96], member[96];

		snprintf(key, sizeof(key), "\"%s\"", fields[i].name);
		if (!strstr(man, key))
			fail_msg("man/kvctl.1 JSON OUTPUT stats lacks %s", key);
		snprintf(member, sizeof(member), "\"%s\": %zu,", fields[i].name, 1000 + i);
		if (!strstr(json.buf, member))
			fail_msg("kvctl stats --json lacks %s", member);
		if (fields[i].time)
			continue; /* shown as an age: chunk_last_access */
		snprintf(line, sizeof(line), "\n%-17s %zu", fields[i].name, 1000 + i);
		if (!strstr(table.buf, line))
			fail_msg("kvctl stats lacks the line \"%s\"", line + 1);
	}
	free(table.buf);
	free(json.buf);
}

/* What the daemon serves comes first (issue 26: no layout, version,
 * uptime, backend, disk or remote status in kvctl stats): an admin's view
 * with a disk and a remote tier, as text and as JSON. */
static void stats_show_what_the_daemon_serves(void **state)
{
	struct kvp_stats s = demo_stats();
	struct kvp_server_info si = {
		.version = 1, .proto = 10, .pid = 4242,
		.flags = KVP_SERVER_DISK | KVP_SERVER_REMOTE | KVP_SERVER_ADMIN,
		.started_ns = DEMO_NOW - 3723 * SEC, .uptime_ns = 3723 * SEC,
		.workers = 4, .shards = 4, .pools = 1, .tenants = 2,
		.disk_size = 64ull << 30, .remote_nodes = 3, .remote_nodes_up = 2,
		.backend = "shm",
		.layout = "layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32",
		.disk_compress = "zstd:3", .disk_dir = "/var/lib/kvpool/disk",
		.remote = "redis-cluster://10.0.0.1:7000",
	};
	struct capture c;

	(void)state;
	render_stats(capture_open(&c), false, &s, &si, true, DEMO_NOW);
	capture_expect_prefix(&c,
		"kvpoold 0.1 (protocol 10), pid 4242, up 1h 2m\n"
		"backend   shm, 1 pool, 4 workers, 4 shards, 2 tenants\n"
		"layout    layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32\n"
		"disk      /var/lib/kvpool/disk, 64.0 GiB, zstd:3\n"
		"remote    redis-cluster://10.0.0.1:7000, 2 of 3 nodes up\n"
		"\n"
		"scope: all tenants\n");
	render_stats(capture_open(&c), true, &s, &si, true, DEMO_NOW);
	capture_expect_prefix(&c,
		"{\n"
		"  \"server\": {\n"
		"    \"version\": \"0.1\",\n"
		"    \"protocol\": 10,\n"
		"    \"pid\": 4242,\n"
		"    \"uptime_s\": 3723,\n"
		"    \"started_ns\": 1794996277000000000,\n"
		"    \"backend\": \"shm\",\n"
		"    \"pools\": 1,\n"
		"    \"workers\": 4,\n"
		"    \"shards\": 4,\n"
		"    \"tenants\": 2,\n"
		"    \"layout\": \"layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32\",\n"
		"    \"disk\": {\n"
		"      \"dir\": \"/var/lib/kvpool/disk\",\n"
		"      \"size\": 68719476736,\n"
		"      \"compress\": \"zstd:3\"\n"
		"    },\n"
		"    \"remote\": {\n"
		"      \"url\": \"redis-cluster://10.0.0.1:7000\",\n"
		"      \"nodes\": 3,\n"
		"      \"nodes_up\": 2\n"
		"    }\n"
		"  },\n"
		"  \"scope\": \"all_tenants\",\n");
	/* Not an admin, no tiers below the host: no paths, "none". */
	si.flags = 0;
	render_stats(capture_open(&c), false, &s, &si, true, DEMO_NOW);
	capture_expect_prefix(&c,
		"kvpoold 0.1 (protocol 10), pid 4242, up 1h 2m\n"
		"backend   shm, 1 pool, 4 workers, 4 shards, 2 tenants\n"
		"layout    layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32\n"
		"disk      none\n"
		"remote    none\n"
		"\n");
}

static void stats_table_shows_sizes_and_percent_used(void **state)
{
	struct kvp_stats s = demo_stats();
	struct capture c;

	render_stats(capture_open(&c), false, &s, NULL, true, DEMO_NOW);
	capture_expect(&c,
		       "scope: all tenants\n"
		       "\n"
		       "TIER    FRAMES  USED  FREE  USED%     SIZE\n"
		       "device    4096  1024  3072  25.0%  2.0 GiB\n"
		       "host         0     0     0      -      0 B\n"
		       "\n"
		       "users             1\n"
		       "leases            2\n"
		       "clients           17\n"
		       "tenants           18\n"
		       "shards            4\n"
		       "disk_users        36\n"
		       "disk_pages        37\n"
		       "\n"
		       "prepares          3\n"
		       "commits           4\n"
		       "releases          5\n"
		       "hit_tokens        6\n"
		       "committed_tokens  7\n"
		       "evicted_users     8\n"
		       "evicted_pages     9\n"
		       "demoted_users     10\n"
		       "demoted_pages     11\n"
		       "offloaded_pages   12\n"
		       "onloaded_pages    13\n"
		       "trimmed_pages     14\n"
		       "bytes_d2h         3145728 (3.0 MiB)\n"
		       "bytes_h2d         16\n"
		       "ns_d2h            31\n"
		       "reclaim_stalls    32\n"
		       "reclaimed_pages   33\n"
		       "reclaim_onload_stalls 34\n"
		       "reclaim_direct    35\n"
		       "disk_demoted_pages 38\n"
		       "disk_read_pages   39\n"
		       "disk_dropped_pages 40\n"
		       "disk_stored_bytes 41\n"
		       "ns_h2d            45\n"
		       "\n"
		       "prefix_pages      19\n"
		       "prefix_idle_pages 20\n"
		       "prefix_lookups    21\n"
		       "prefix_lookup_tokens 400\n"
		       "prefix_hit_tokens 100\n"
		       "prefix_evicted_pages 22\n"
		       "prefix_dedupe_pages 23\n"
		       "seqs              24\n"
		       "seq_pages         25\n"
		       "cow_pages         26\n"
		       "chunks            27\n"
		       "chunk_pages       28\n"
		       "chunk_bytes       5242880 (5.0 MiB)\n"
		       "chunk_lookups     8\n"
		       "chunk_hits        6\n"
		       "chunk_evicted     29\n"
		       "compositions      30\n"
		       "disk_prefix_pages 42\n"
		       "disk_chunks       43\n"
		       "disk_chunk_pages  44\n"
		       "chunk_last_access 90s ago\n"
		       "prefix_hit_rate   25.0%\n"
		       "chunk_hit_rate    75.0%\n");
}

static const struct kvp_user_info demo_users[] = {
	{ .user = 7, .start = 0, .len = 128, .pages_device = 4, .pages_host = 0,
	  .leases = 1, .tenant = 0 },
	{ .user = UINT64_MAX, .start = 32, .len = 64, .pages_device = 0,
	  .pages_host = 2, .leases = 0, .tenant = 3, .pages_disk = 2,
	  .tokens_disk = 64 },
};

/* render_users of the first n demo_users prints exactly want. */
static void expect_users(bool json, size_t n, bool with_tenant, bool truncated,
			 const char *want)
{
	struct capture c;

	render_users(capture_open(&c), json, demo_users, n, with_tenant, truncated);
	capture_expect(&c, want);
}

static void users_json_lists_every_field(void **state)
{
	expect_users(true, 2, false, true,
		     "{\n"
		     "  \"users\": [\n"
		     "    {\n"
		     "      \"user\": 7,\n"
		     "      \"start\": 0,\n"
		     "      \"len\": 128,\n"
		     "      \"pages_device\": 4,\n"
		     "      \"pages_host\": 0,\n"
		     "      \"leases\": 1,\n"
		     "      \"tenant\": 0,\n"
		     "      \"pages_disk\": 0,\n"
		     "      \"tokens_disk\": 0\n"
		     "    },\n"
		     "    {\n"
		     "      \"user\": 18446744073709551615,\n"
		     "      \"start\": 32,\n"
		     "      \"len\": 64,\n"
		     "      \"pages_device\": 0,\n"
		     "      \"pages_host\": 2,\n"
		     "      \"leases\": 0,\n"
		     "      \"tenant\": 3,\n"
		     "      \"pages_disk\": 2,\n"
		     "      \"tokens_disk\": 64\n"
		     "    }\n"
		     "  ],\n"
		     "  \"count\": 2,\n"
		     "  \"truncated\": true\n"
		     "}\n");
	expect_users(true, 0, false, false,
		     "{\n  \"users\": [],\n  \"count\": 0,\n  \"truncated\": false\n}\n");
}

static void users_table_adds_tenant_column_for_admins(void **state)
{
	expect_users(false, 2, false, false,
		     "                USER  START  LEN  PAGES_DEV  PAGES_HOST  PAGES_DISK  TOKENS_DISK  LEASES\n"
		     "                   7      0  128          4           0           0            0       1\n"
		     "18446744073709551615     32   64          0           2           2           64       0\n");
	expect_users(false, 1, true, false,
		     "USER  START  LEN  PAGES_DEV  PAGES_HOST  PAGES_DISK  TOKENS_DISK  LEASES  TENANT\n"
		     "   7      0  128          4           0           0            0       1       0\n");
}

static void user_shows_len_zero_as_nothing_cached(void **state)
{
	struct kvp_user_info u = { .user = 9 };
	struct capture c;

	render_user(capture_open(&c), false, &u);
	capture_expect(&c,
		       "user           9\n"
		       "start          0\n"
		       "len            0 (nothing cached)\n"
		       "next_start_pos 0\n"
		       "pages_device   0\n"
		       "pages_host     0\n"
		       "pages_disk     0\n"
		       "tokens_disk    0\n"
		       "leases         0\n"
		       "tenant         0\n");
	render_user(capture_open(&c), true, &demo_users[1]);
	capture_expect(&c,
		       "{\n"
		       "  \"user\": 18446744073709551615,\n"
		       "  \"start\": 32,\n"
		       "  \"len\": 64,\n"
		       "  \"pages_device\": 0,\n"
		       "  \"pages_host\": 2,\n"
		       "  \"leases\": 0,\n"
		       "  \"tenant\": 3,\n"
		       "  \"pages_disk\": 2,\n"
		       "  \"tokens_disk\": 64\n"
		       "}\n");
}

static void clients_escape_hostile_names(void **state)
{
	struct kvp_client_info rows[2];
	struct capture c;

	memset(rows, 0, sizeof(rows));
	rows[0] = (struct kvp_client_info){ .client_id = 1, .pid = 100, .uid = 0,
		.gid = 0, .tenant = UINT32_MAX, .flags = 1, .ops = 5, .leases = 0 };
	memcpy(rows[0].name, "kvctl", 6);
	rows[1] = (struct kvp_client_info){ .client_id = 2, .pid = 200, .uid = 1001,
		.gid = 1001, .tenant = 0, .flags = 0, .ops = 12345, .leases = 3 };
	/* Quote, escape sequence, invalid UTF-8, and no NUL in 32 bytes. */
	memset(rows[1].name, 'w', sizeof(rows[1].name));
	memcpy(rows[1].name, "\"x\x1b[2J\xff", 7);

	render_clients(capture_open(&c), true, rows, 2);
	capture_expect(&c,
		       "{\n"
		       "  \"clients\": [\n"
		       "    {\n"
		       "      \"client_id\": 1,\n"
		       "      \"pid\": 100,\n"
		       "      \"uid\": 0,\n"
		       "      \"gid\": 0,\n"
		       "      \"tenant\": null,\n"
		       "      \"admin\": true,\n"
		       "      \"name\": \"kvctl\",\n"
		       "      \"ops\": 5,\n"
		       "      \"leases\": 0\n"
		       "    },\n"
		       "    {\n"
		       "      \"client_id\": 2,\n"
		       "      \"pid\": 200,\n"
		       "      \"uid\": 1001,\n"
		       "      \"gid\": 1001,\n"
		       "      \"tenant\": 0,\n"
		       "      \"admin\": false,\n"
		       "      \"name\": \"\\\"x\\u001b[2J\\ufffdwwwwwwwwwwwwwwwwwwwwwwwww\",\n"
		       "      \"ops\": 12345,\n"
		       "      \"leases\": 3\n"
		       "    }\n"
		       "  ],\n"
		       "  \"count\": 2\n"
		       "}\n");

	render_clients(capture_open(&c), false, rows, 2);
	capture_expect(&c,
		       "ID  PID   UID   GID  TENANT  NAME                                OPS  LEASES  ADMIN\n"
		       " 1  100     0     0       -  kvctl                                 5       0  yes\n"
		       " 2  200  1001  1001       0  \"x?[2J?wwwwwwwwwwwwwwwwwwwwwwwww  12345       3  no\n");
}

static void evict_and_offload_say_what_was_freed(void **state)
{
	struct op_result user = { .all = false, .user = 7, .sel = KVP_SEL_DEVICE, .count = 12 };
	struct op_result all = { .all = true, .sel = KVP_SEL_ALL, .count = 1 };
	struct capture c;

	render_evict(capture_open(&c), false, &user);
	capture_expect(&c, "evict user 7 (tier device): 12 pages freed\n");
	render_evict(capture_open(&c), false, &all);
	capture_expect(&c, "evict all (tier all): 1 user affected\n");
	render_evict(capture_open(&c), true, &user);
	capture_expect(&c,
		       "{\n  \"all\": false,\n  \"user\": 7,\n  \"tier\": \"device\",\n"
		       "  \"pages_freed\": 12\n}\n");
	render_evict(capture_open(&c), true, &all);
	capture_expect(&c,
		       "{\n  \"all\": true,\n  \"user\": null,\n  \"scope\": \"all_tenants\",\n"
		       "  \"tier\": \"all\",\n  \"users_affected\": 1\n}\n");
	/* a non-admin's --all: its own tenant (seed 002's evict_kv_cache) */
	struct op_result own = { .all = true, .tenant = true, .sel = KVP_SEL_ALL, .count = 3 };
	render_evict(capture_open(&c), false, &own);
	capture_expect(&c, "evict all of this client's tenant (tier all): evicted 3 users "
		       "(leased users are skipped)\n");
	render_evict(capture_open(&c), true, &own);
	capture_expect(&c,
		       "{\n  \"all\": true,\n  \"user\": null,\n  \"scope\": \"tenant\",\n"
		       "  \"tier\": \"all\",\n  \"users_affected\": 3\n}\n");

	user.count = 1;
	render_offload(capture_open(&c), false, &user);
	capture_expect(&c, "offload user 7: 1 page copied to the host tier\n");
	all.count = 40;
	render_offload(capture_open(&c), false, &all);
	capture_expect(&c, "offload all: 40 pages copied to the host tier\n");
	render_offload(capture_open(&c), true, &user);
	capture_expect(&c, "{\n  \"all\": false,\n  \"user\": 7,\n  \"pages_copied\": 1\n}\n");
}

/* ---------------------------------------------------------------- chunks */

static void chunk_ids_parse_as_prefixes_and_format_back(void **state)
{
	struct kvp_chunk_id id;
	char out[65], hex[65];

	assert_int_equal(parse_chunk_prefix("0123ABCDef", out), 10);
	assert_string_equal(out, "0123abcdef");
	assert_int_equal(parse_chunk_prefix("", out), -EINVAL);
	assert_int_equal(parse_chunk_prefix("12g4", out), -EINVAL);
	assert_int_equal(parse_chunk_prefix("0x12", out), -EINVAL);
	memset(hex, 'a', 65);
	hex[64] = '\0';
	assert_int_equal(parse_chunk_prefix(hex, out), 64);
	{
		char longer[66];

		memset(longer, 'b', 65);
		longer[65] = '\0';
		assert_int_equal(parse_chunk_prefix(longer, out), -EINVAL);
	}
	for (int i = 0; i < KVP_CHUNK_ID_BYTES; i++)
		id.b[i] = (uint8_t)(i * 9 + 1);
	kvp_chunk_id_format(&id, hex);
	assert_int_equal(strlen(hex), 64);
	assert_memory_equal(hex, "01", 2);
	{
		struct kvp_chunk_id back;

		assert_int_equal(kvp_chunk_id_parse(&back, hex), 0);
		assert_memory_equal(&back, &id, sizeof(id));
		assert_int_equal(kvp_chunk_id_parse(&back, "abc"), -EINVAL);
	}
	assert_string_equal(kvp_chunk_type_name(KVP_CHUNK_CONTEXT), "context");
	assert_int_equal(kvp_chunk_type_parse("query"), KVP_CHUNK_QUERY);
	assert_int_equal(kvp_chunk_type_parse("Query"), -EINVAL);
	assert_null(kvp_chunk_type_name(0));
	assert_null(kvp_chunk_type_name(4));
}

static void fmt_age_counts_in_the_largest_sensible_unit(void **state)
{
	char buf[16];

	fmt_age(buf, sizeof(buf), DEMO_NOW, 0);
	assert_string_equal(buf, "-");
	fmt_age(buf, sizeof(buf), DEMO_NOW, DEMO_NOW + SEC);
	assert_string_equal(buf, "0s");
	fmt_age(buf, sizeof(buf), DEMO_NOW, DEMO_NOW - 119 * SEC);
	assert_string_equal(buf, "119s");
	fmt_age(buf, sizeof(buf), DEMO_NOW, DEMO_NOW - 120 * SEC);
	assert_string_equal(buf, "2m");
	fmt_age(buf, sizeof(buf), DEMO_NOW, DEMO_NOW - 3 * 3600 * SEC);
	assert_string_equal(buf, "3h");
	fmt_age(buf, sizeof(buf), DEMO_NOW, DEMO_NOW - 50 * 3600 * SEC);
	assert_string_equal(buf, "2d");
}

static struct kvp_chunk_info demo_chunk(uint8_t first, uint32_t type,
					uint32_t state, const char *meta)
{
	struct kvp_chunk_info ci = {
		.type = type, .state = state, .tokens = 100, .pages = 7,
		.bytes = 7 * 4096, .holders = 2, .filler = state == KVP_CHUNK_FILLING ? 5 : 0,
		.created_ns = DEMO_NOW - 7200 * SEC, .last_access_ns = DEMO_NOW - 5 * SEC,
		.hits = 3, .entries = 2, .content_len = 5000,
	};

	for (int i = 0; i < KVP_CHUNK_ID_BYTES; i++) {
		ci.id.b[i] = (uint8_t)(first + i);
		ci.root.b[i] = (uint8_t)(0x40 + i);
	}
	snprintf(ci.meta, sizeof(ci.meta), "%s", meta);
	snprintf(ci.preview, sizeof(ci.preview), "%s", "Doc \x1b one");
	return ci;
}

static void chunks_table_cuts_ids_and_sanitizes_metadata(void **state)
{
	struct kvp_chunk_info rows[2] = {
		demo_chunk(0x10, KVP_CHUNK_SYSTEM, KVP_CHUNK_READY, "{\"doc\":\"a\",\"n\":1}"),
		demo_chunk(0xa0, KVP_CHUNK_CONTEXT, KVP_CHUNK_FILLING, "evil=\x1b[31m"),
	};
	struct capture c;

	rows[1].last_access_ns = 0;
	render_chunks(capture_open(&c), false, rows, 2, DEMO_NOW, NULL);
	capture_expect(&c,
		       "NAME              TYPE     STATE    TOKENS  ENTRIES  PAGES  HOLDERS  HITS  LAST  META               PREVIEW\n"
		       "1011121314151617  system   ready       100        2      7        2     3    5s  {\"doc\":\"a\",\"n\":1}  Doc ? one\n"
		       "a0a1a2a3a4a5a6a7  context  filling     100        2      7        2     3     -  evil=?[31m         Doc ? one\n");
	render_chunks(capture_open(&c), false, rows, 0, DEMO_NOW, NULL);
	capture_expect(&c, "NAME  TYPE  STATE  TOKENS  ENTRIES  PAGES  HOLDERS  HITS  LAST  META  PREVIEW\n");
}

/* Chunks only on the disk tier: counted after the table and in JSON. */
static void chunks_count_those_on_disk(void **state)
{
	const struct chunks_disk disk = { 3, 22 };
	struct capture c;

	(void)state;
	render_chunks(capture_open(&c), false, NULL, 0, DEMO_NOW, &disk);
	capture_expect(&c, "NAME  TYPE  STATE  TOKENS  ENTRIES  PAGES  HOLDERS  HITS  LAST  META  PREVIEW\n"
		       "and 3 chunks (22 pages) only on the disk tier: an acquire or a "
		       "register of one brings it back\n");
	render_chunks(capture_open(&c), true, NULL, 0, DEMO_NOW, &disk);
	capture_expect(&c, "{\n"
		       "  \"chunks\": [],\n"
		       "  \"count\": 0,\n"
		       "  \"disk_chunks\": 3,\n"
		       "  \"disk_chunk_pages\": 22\n"
		       "}\n");
}

static void chunks_json_has_every_field_and_the_full_id(void **state)
{
	struct kvp_chunk_info row = demo_chunk(0x00, KVP_CHUNK_QUERY, KVP_CHUNK_READY,
					       "q=\"1\"");
	struct capture c;

	render_chunks(capture_open(&c), true, &row, 1, DEMO_NOW, NULL);
	capture_expect(&c,
		       "{\n"
		       "  \"chunks\": [\n"
		       "    {\n"
		       "      \"id\": \"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\",\n"
		       "      \"root\": \"404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f\",\n"
		       "      \"type\": \"query\",\n"
		       "      \"state\": \"ready\",\n"
		       "      \"tokens\": 100,\n"
		       "      \"entries\": 2,\n"
		       "      \"pages\": 7,\n"
		       "      \"bytes\": 28672,\n"
		       "      \"holders\": 2,\n"
		       "      \"filler\": 0,\n"
		       "      \"hits\": 3,\n"
		       "      \"created_ns\": 1794992800000000000,\n"
		       "      \"last_access_ns\": 1794999995000000000,\n"
		       "      \"last_access_age_s\": 5,\n"
		       "      \"content_len\": 5000,\n"
		       "      \"preview\": \"Doc \\u001b one\",\n"
		       "      \"meta\": \"q=\\\"1\\\"\"\n"
		       "    }\n"
		       "  ],\n"
		       "  \"count\": 1\n"
		       "}\n");
}

static void chunk_shows_one_chunk_in_full(void **state)
{
	struct kvp_chunk_info ci = demo_chunk(0xf0, KVP_CHUNK_CONTEXT,
					      KVP_CHUNK_FILLING, "");
	struct capture c;

	render_chunk(capture_open(&c), false, &ci, DEMO_NOW);
	capture_expect(&c,
		       "name         f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f\n"
		       "root         404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f\n"
		       "type         context\n"
		       "state        filling\n"
		       "tokens       100\n"
		       "entries      2\n"
		       "pages        7\n"
		       "bytes        28672 (28.0 KiB)\n"
		       "holders      2\n"
		       "filler       client 5\n"
		       "hits         3\n"
		       "created      2h ago\n"
		       "last_access  5s ago\n"
		       "content      5000 bytes\n"
		       "preview      Doc ? one\n"
		       "meta         -\n");
}

static void chunk_entries_show_parent_and_start(void **state)
{
	struct kvp_chunk_entry_info rows[2] = {
		{ .start = 0, .tokens = 20, .pages = 2, .state = KVP_CHUNK_READY,
		  .children = 1 },
		{ .start = 35, .tokens = 20, .pages = 2, .state = KVP_CHUNK_FILLING,
		  .holders = 1 },
	};
	struct capture c;

	for (int i = 0; i < KVP_CHUNK_ID_BYTES; i++) {
		rows[0].id.b[i] = (uint8_t)(0x10 + i);
		rows[1].id.b[i] = (uint8_t)(0x20 + i);
		rows[1].parent.b[i] = (uint8_t)(0x30 + i);
		rows[0].name.b[i] = rows[1].name.b[i] = (uint8_t)(0x50 + i);
	}
	render_chunk_entries(capture_open(&c), false, rows, 2);
	capture_expect(&c,
		       "ENTRY             PARENT            START  TOKENS  PAGES  STATE    HOLDERS  CHILDREN\n"
		       "1011121314151617  - (root)              0      20      2  ready          0         1\n"
		       "2021222324252627  3031323334353637     35      20      2  filling        1         0\n");
	render_chunk_entries(capture_open(&c), true, rows + 1, 1);
	capture_expect(&c,
		       "{\n"
		       "  \"entries\": [\n"
		       "    {\n"
		       "      \"id\": \"202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f\",\n"
		       "      \"name\": \"505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f\",\n"
		       "      \"parent\": \"303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f\",\n"
		       "      \"start\": 35,\n"
		       "      \"tokens\": 20,\n"
		       "      \"pages\": 2,\n"
		       "      \"state\": \"filling\",\n"
		       "      \"holders\": 1,\n"
		       "      \"children\": 0\n"
		       "    }\n"
		       "  ],\n"
		       "  \"count\": 1\n"
		       "}\n");
}

static void chunk_ops_say_how_many_were_deleted(void **state)
{
	struct chunk_op_result r = { .op = "clear", .type = KVP_CHUNK_CONTEXT, .count = 3 };
	struct capture c;

	render_chunk_op(capture_open(&c), false, &r);
	capture_expect(&c, "clear chunks (type context): 3 chunks deleted\n");
	r.type = 0;
	r.count = 1;
	render_chunk_op(capture_open(&c), true, &r);
	capture_expect(&c, "{\n  \"op\": \"clear\",\n  \"type\": \"all\",\n"
		       "  \"chunks_deleted\": 1\n}\n");
	r = (struct chunk_op_result){ .op = "evict_unused", .max_age_s = 60 };
	render_chunk_op(capture_open(&c), false, &r);
	capture_expect(&c, "evict unused chunks (idle 60 s or more): 0 chunks deleted\n");
	r = (struct chunk_op_result){ .op = "delete", .count = 1 };
	memset(r.id, 'c', 64);
	render_chunk_op(capture_open(&c), true, &r);
	capture_expect(&c, "{\n  \"op\": \"delete\",\n  \"id\": \"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc\",\n"
		       "  \"chunks_deleted\": 1\n}\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parse_u64_accepts_decimal_up_to_max),
		cmocka_unit_test(parse_u64_rejects_signs_spaces_suffixes_and_overflow),
		cmocka_unit_test(tier_names_map_both_ways_and_reject_others),
		cmocka_unit_test(json_string_escapes_quotes_backslashes_and_controls),
		cmocka_unit_test(json_string_keeps_valid_utf8),
		cmocka_unit_test(json_string_replaces_invalid_utf8_byte_by_byte),
		cmocka_unit_test(json_writer_nests_and_separates_members),
		cmocka_unit_test(fmt_bytes_uses_binary_units_with_one_decimal),
		cmocka_unit_test(fmt_percent_rounds_down_and_handles_empty_tiers),
		cmocka_unit_test(text_sanitize_keeps_printable_ascii_only),
		cmocka_unit_test(table_sizes_columns_to_widest_cell),
		cmocka_unit_test(stats_json_has_tiers_gauges_and_every_counter),
		cmocka_unit_test(stats_show_what_the_daemon_serves),
		cmocka_unit_test(stats_table_shows_sizes_and_percent_used),
		cmocka_unit_test(stats_every_field_in_table_json_and_man_page),
		cmocka_unit_test(users_json_lists_every_field),
		cmocka_unit_test(users_table_adds_tenant_column_for_admins),
		cmocka_unit_test(user_shows_len_zero_as_nothing_cached),
		cmocka_unit_test(clients_escape_hostile_names),
		cmocka_unit_test(evict_and_offload_say_what_was_freed),
		cmocka_unit_test(chunk_ids_parse_as_prefixes_and_format_back),
		cmocka_unit_test(fmt_age_counts_in_the_largest_sensible_unit),
		cmocka_unit_test(chunks_table_cuts_ids_and_sanitizes_metadata),
		cmocka_unit_test(chunks_count_those_on_disk),
		cmocka_unit_test(chunks_json_has_every_field_and_the_full_id),
		cmocka_unit_test(chunk_shows_one_chunk_in_full),
		cmocka_unit_test(chunk_entries_show_parent_and_start),
		cmocka_unit_test(chunk_ops_say_how_many_were_deleted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
