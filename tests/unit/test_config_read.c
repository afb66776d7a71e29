/* SPDX-License-Identifier: MIT */
/*
 * test_config_read - kvpool.conf read through config_read() from a stream
 * that fails when the test says (fopencookie): a read error at the start,
 * part-way through a line, or where the end of the file would be, is a
 * startup error naming the file and the reason, never taken for the end of
 * the file (which would start kvpoold on a truncated configuration: the
 * tenants after the error missing, the socket open to anyone). The clean
 * read of the same text is the control.
 *
 * The integration test test_config_errors covers what a real kvpoold does
 * with a directory, a missing, an unreadable file and /proc/self/mem.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"

#define PATH "/etc/kvpool/test.conf"

static const char text[] =
	"device_mem = 4M\n"
	"[tenant a]\n"
	"uids = 1001\n"
	"[tenant b]\n"
	"uids = 1002\n";

/* A stream of text that fails with err once fail_at bytes were read. */
struct failing {
	size_t off, fail_at;
	int err;
};

static ssize_t failing_read(void *cookie, char *buf, size_t size)
{
	struct failing *s = cookie;
	size_t left = sizeof(text) - 1 - s->off, n;

	if (s->off >= s->fail_at) {
		errno = s->err;
		return -1;
	}
	if (s->fail_at - s->off < left)
		left = s->fail_at - s->off;
	n = size < left ? size : left;
	memcpy(buf, text + s->off, n);
	s->off += n;
	return (ssize_t)n;
}

/*
 * config_read of f (closed here); its return value, what it printed to
 * stderr in msg, the config in *c (the caller frees it).
 */
static int read_stream(FILE *f, struct config *c, char *msg, size_t len)
{
	int saved = dup(2), mfd = memfd_create("stderr", 0), ret;
	ssize_t n;

	assert_non_null(f);
	assert_true(saved >= 0 && mfd >= 0);
	*c = (struct config){ 0 };
	fflush(stderr);
	dup2(mfd, 2);
	ret = config_read(c, f, PATH);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	fclose(f);
	n = pread(mfd, msg, len - 1, 0);
	msg[n > 0 ? n : 0] = '\0';
	close(mfd);
	return ret;
}

/* read_stream of text failing at fail_at (SIZE_MAX: never) with err. */
static int read_text(size_t fail_at, int err, struct config *c, char *msg,
		     size_t len)
{
	struct failing s = { .fail_at = fail_at, .err = err };
	cookie_io_functions_t io = { .read = failing_read };

	return read_stream(fopencookie(&s, "r", io), c, msg, len);
}

static void clean_read_applies_every_line(void **state)
{
	struct config c;
	char msg[1024];

	assert_int_equal(read_text(SIZE_MAX, 0, &c, msg, sizeof(msg)), 0);
	assert_string_equal(msg, "");
	assert_int_equal(c.device_mem, 4u << 20);
	assert_int_equal(c.ntenants, 2);
	assert_string_equal(c.tenants[1].name, "b");
	config_free(&c);
}

/* The error names the file and the reason, and is not a complaint about a
 * truncated line. */
static void assert_read_error(size_t fail_at, int err)
{
	struct config c;
	char msg[1024];
	int ret = read_text(fail_at, err, &c, msg, sizeof(msg));

	config_free(&c);
	if (ret != EXIT_USAGE || !strstr(msg, PATH) || !strstr(msg, strerror(err)) ||
	    strstr(msg, "expected") || strstr(msg, "section"))
		fail_msg("read error %d after %zu bytes: config_read returned %d "
			 "(want %d) and said: '%s'", err, fail_at, ret, EXIT_USAGE,
			 msg);
}

static void error_on_first_read_is_a_startup_error(void **state)
{
	assert_read_error(0, EIO);
	assert_read_error(0, EISDIR);
}

static void error_mid_line_is_a_startup_error(void **state)
{
	/* "[tenant b" read, then the error: not a bad section, a bad read. */
	assert_read_error(strstr(text, "[tenant b") - text + 9, EIO);
	/* "uids = 10" of the first tenant: the rest of it and b would be lost */
	assert_read_error(strstr(text, "uids = 1001") - text + 9, EIO);
}

static void error_where_the_file_would_end_is_a_startup_error(void **state)
{
	assert_read_error(sizeof(text) - 1, EIO);
	assert_read_error(sizeof(text) - 1, ESTALE);
}

/* config_read of a string; what it printed to stderr in msg. */
static int read_string(const char *str, struct config *c, char *msg, size_t len)
{
	return read_stream(fmemopen((void *)str, strlen(str), "r"), c, msg, len);
}

static void expect_error(const char *str, const char *want)
{
	struct config c;
	char msg[1024];
	int ret = read_string(str, &c, msg, sizeof(msg));

	config_free(&c);
	if (ret != EXIT_USAGE || !strstr(msg, want))
		fail_msg("'%s': returned %d, said '%s'; want %d and '%s'", str, ret, msg,
			 EXIT_USAGE, want);
}

/* remote_user_histories is taken (it was refused until they were built). */
static void remote_user_histories_is_read(void **state)
{
	struct config c;
	char msg[1024];

	(void)state;
	assert_int_equal(read_string("remote_user_histories = yes\n", &c, msg,
				     sizeof(msg)), 0);
	assert_true(c.remote_user_histories);
	config_free(&c);
}

/* libinih parses; every error still names its line (libinih's handler
 * does not know it: config.c's reader counts). */
static void errors_name_their_line(void **state)
{
	expect_error("device_mem = 4M\n\n# c\n[tenant a]\nuids = 1\nbogus\n",
		     PATH ":6: expected 'key = value' or '[tenant NAME]'");
	expect_error("device_mem = 4M\n[tenant a\nuids = 1\n",
		     PATH ":2: expected 'key = value'");
	expect_error("device_mem = 4M\n[tenantx]\nuids = 1\n",
		     PATH ":2: '[tenantx]': the only section is [tenant NAME]");
	expect_error("[tenant a]\nuids = 1\n[tenant a]\nuids = 2\n",
		     PATH ":3: [tenant a] is defined twice");
	expect_error("[tenant a]\nuids = 1\nspin_us = 3\n",
		     PATH ":3: spin_us is a global setting");
	expect_error("device_mem = 4X\n", PATH ":1: device_mem = '4X'");
	expect_error("remote_user_histories = maybe\n",
		     PATH ":1: remote_user_histories = 'maybe'");
}

/* remote_chunk_types: a list of type names (all, none); a wrong name says
 * which and what is accepted. */
static void remote_chunk_types_list(void **state)
{
	struct config c;
	char msg[1024];

	assert_int_equal(read_string("remote_chunk_types = query,system\n", &c, msg,
				     sizeof(msg)), 0);
	assert_int_equal(c.remote_chunk_types,
			 1u << KVP_CHUNK_SYSTEM | 1u << KVP_CHUNK_QUERY);
	config_free(&c);
	assert_int_equal(read_string("remote_chunk_types = none\n", &c, msg,
				     sizeof(msg)), 0);
	assert_int_equal(c.remote_chunk_types, 0);
	config_free(&c);
	assert_int_equal(read_string("remote_chunk_types = all\n", &c, msg,
				     sizeof(msg)), 0);
	assert_int_equal(c.remote_chunk_types, 1u << KVP_CHUNK_SYSTEM |
			 1u << KVP_CHUNK_CONTEXT | 1u << KVP_CHUNK_QUERY);
	config_free(&c);
	expect_error("remote_chunk_types = system,docs\n",
		     PATH ":1: remote_chunk_types = 'system,docs': unknown chunk type "
		     "'docs' (system, context, query, all or none");
}

/* devices: a list, or all (resolved when the backend opens: until then one
 * pool on device 0 and devices_all set); a later list replaces all; a
 * wrong word says all is one of the choices. */
static void devices_all_is_read(void **state)
{
	struct config c;
	char msg[1024];

	(void)state;
	assert_int_equal(read_string("devices = all\n", &c, msg, sizeof(msg)), 0);
	assert_true(c.devices_all);
	assert_int_equal(c.ndevices, 1);
	assert_int_equal(c.devices[0], 0);
	config_free(&c);
	assert_int_equal(read_string("devices = all\ndevices = 0,1\n", &c, msg,
				     sizeof(msg)), 0);
	assert_false(c.devices_all);
	assert_int_equal(c.ndevices, 2);
	assert_int_equal(c.devices[1], 1);
	config_free(&c);
	assert_int_equal(read_string("devices = 3\n", &c, msg, sizeof(msg)), 0);
	assert_false(c.devices_all);
	config_free(&c);
	expect_error("devices = al\n", "'al' is not a GPU ordinal");
	expect_error("devices = al\n", "or all");
	expect_error("devices = all,1\n", "'all' is not a GPU ordinal");
}

/* Comments ('#' or ';' first, '#' after a blank), quotes, blanks, a line
 * of 8 KB, a section title with blanks around its name. */
static void format_as_kvpool_conf_5_says(void **state)
{
	static char text2[16384];
	struct config c;
	char msg[1024];
	size_t n;

	n = (size_t)snprintf(text2, sizeof(text2), "; kvpool.conf\n# comment\n"
			     "  device_mem = \"8M\"   # eight\nadmin_uids = 0");
	for (unsigned i = 1; i < 2000; i++)
		n += (size_t)snprintf(text2 + n, sizeof(text2) - n, ",%u", i);
	snprintf(text2 + n, sizeof(text2) - n, "\n\n[tenant  b ]\nuids = 7\n");
	assert_true(strlen(text2) > 8000); /* libinih's default line: 200 */
	assert_int_equal(read_string(text2, &c, msg, sizeof(msg)), 0);
	assert_string_equal(msg, "");
	assert_int_equal(c.device_mem, 8u << 20);
	assert_int_equal(c.admin_uids.n, 2000);
	assert_int_equal(c.admin_uids.v[1999], 1999);
	assert_int_equal(c.ntenants, 1);
	assert_string_equal(c.tenants[0].name, "b");
	assert_int_equal(c.tenants[0].uids.v[0], 7);
	config_free(&c);
}

/* config_load of flags (no file): its status and last error. */
static int load_flags(struct config *c, const char *a, const char *b,
		      const char *d)
{
	char *argv[] = { "kvpoold", (char *)a, (char *)b, (char *)d, NULL };
	int argc = 1 + !!a + !!b + !!d;

	return config_load(c, argc, argv);
}

static void expect_load_error(const char *a, const char *b, const char *d,
			      const char *want)
{
	struct config c;
	int ret = load_flags(&c, a, b, d);

	config_free(&c);
	if (ret != EXIT_USAGE || !strstr(config_last_error(), want))
		fail_msg("%s %s %s: returned %d, said '%s'; want %d and '%s'", a,
			 b ? b : "", d ? d : "", ret, config_last_error(),
			 EXIT_USAGE, want);
}

/* tp (issue 31): 1..8; the devices taken tp at a time, the layout's
 * kv_heads split among the ranks; each error names what to change. */
static void tp_setting(void **state)
{
	struct config c;

	(void)state;
	assert_int_equal(load_flags(&c, "--devices=0,1,2,3", "--tp=2", NULL), 0);
	assert_int_equal(c.tp, 2);
	assert_int_equal(config_npools(&c), 2);
	config_free(&c);
	assert_int_equal(load_flags(&c, "--devices=0,1", NULL, NULL), 0);
	assert_int_equal(c.tp, 1);
	assert_int_equal(config_npools(&c), 2);
	config_free(&c);
	expect_load_error("--tp=0", NULL, NULL, "tp = '0'");
	expect_load_error("--tp=9", NULL, NULL, "tp = '9'");
	expect_load_error("--tp=two", NULL, NULL, "tp = 'two'");
	expect_load_error("--devices=0,1,2", "--tp=2", NULL,
			  "tp: tp = 2 takes the devices 2 at a time (one pool per 2 "
			  "GPUs) but devices = 0,1,2 lists 3; list a multiple of 2 "
			  "devices or change tp");
	expect_load_error("--devices=0,1,2", "--tp=2",
			  "--layout=layers=2,kv_heads=3,head_dim=64,dtype=bf16,"
			  "page_tokens=16", "devices = 0,1,2 lists 3");
	expect_load_error("--devices=0,1", "--tp=2",
			  "--layout=layers=2,kv_heads=3,head_dim=64,dtype=bf16,"
			  "page_tokens=16",
			  "tp: tp = 2 splits each page's kv_heads among 2 ranks but "
			  "layout has kv_heads=3; use a tp that divides kv_heads");
	/* tp = 1 with any devices and kv_heads is as before. */
	assert_int_equal(load_flags(&c, "--devices=0,1,2", "--tp=1",
				    "--layout=layers=2,kv_heads=3,head_dim=64,"
				    "dtype=bf16,page_tokens=16"), 0);
	config_free(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(clean_read_applies_every_line),
		cmocka_unit_test(error_on_first_read_is_a_startup_error),
		cmocka_unit_test(error_mid_line_is_a_startup_error),
		cmocka_unit_test(error_where_the_file_would_end_is_a_startup_error),
		cmocka_unit_test(errors_name_their_line),
		cmocka_unit_test(remote_user_histories_is_read),
		cmocka_unit_test(format_as_kvpool_conf_5_says),
		cmocka_unit_test(remote_chunk_types_list),
		cmocka_unit_test(tp_setting),
		cmocka_unit_test(devices_all_is_read),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
