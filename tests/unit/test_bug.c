/* SPDX-License-Identifier: MIT */
/*
 * test_bug - a broken invariant (lib/bug.h) says where and which: a child
 * that trips KVP_ASSERT, KVP_BUG_ON or KVP_BUG dies by SIGABRT, and its
 * standard error names the program, this file, the line of the check, the
 * invariant in words and the condition's text; where kvpoold's log goes to
 * a file (daemon/server/log.c), the file gets the same line. A check that holds
 * does nothing: each trip_* function called with a sound state returns the
 * line of its check, which is how the parent knows the line to expect.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bug.h"
#include "log.h"

static int trip_assert(int frames)
{
	int line = __LINE__ + 1;
	KVP_ASSERT(frames > 0, "a pool has at least one frame");
	return line;
}

static int trip_bug_on(int refs)
{
	int line = __LINE__ + 1;
	KVP_BUG_ON(refs == 0, "a reference is dropped once, never twice");
	return line;
}

static int trip_bug(int reachable)
{
	int line = __LINE__ + 2;
	if (!reachable)
		KVP_BUG("every option code has a case");
	return line;
}

struct death {
	int status;
	char err[2048];         /* what the child wrote to stderr */
};

/* Run trip(0) in a child, its stderr on a pipe, its log (when log is not
 * NULL) to that file; collect its stderr and how it ended. */
static void run_child(int (*trip)(int), const char *log, struct death *d)
{
	size_t len = 0;
	ssize_t n;
	int fds[2];
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit no_core = { 0, 0 };
		char err[256];

		setrlimit(RLIMIT_CORE, &no_core);
		dup2(fds[1], STDERR_FILENO);
		close(fds[0]);
		close(fds[1]);
		if (log && log_open(log, false, err, sizeof(err)) < 0)
			_exit(2);
		trip(0);
		_exit(0);
	}
	close(fds[1]);
	for (;;) {
		size_t room = sizeof(d->err) - 1 - len;

		if (!room)
			break; /* the rest of the child's stderr is not needed */
		n = read(fds[0], d->err + len, room);
		if (!n)
			break;
		if (n < 0 && errno == EINTR)
			continue;
		assert_true(n > 0);
		len += (size_t)n;
	}
	d->err[len] = '\0';
	close(fds[0]);
	assert_int_equal(waitpid(pid, &d->status, 0), pid);
}

static void want_line(char *buf, size_t len, int line, const char *what,
		      const char *cond)
{
	if (cond)
		snprintf(buf, len, "test_bug: BUG at tests/unit/test_bug.c:%d: %s (%s)\n",
			 line, what, cond);
	else
		snprintf(buf, len, "test_bug: BUG at tests/unit/test_bug.c:%d: %s\n",
			 line, what);
}

static void assert_died_of_bug(const struct death *d, const char *want)
{
	assert_true(WIFSIGNALED(d->status));
	assert_int_equal(WTERMSIG(d->status), SIGABRT);
	assert_string_equal(d->err, want);
}

static void test_assert_names_file_line_and_invariant(void **state)
{
	char want[512];
	struct death d;

	want_line(want, sizeof(want), trip_assert(1), "a pool has at least one frame",
		  "!(frames > 0)");
	run_child(trip_assert, NULL, &d);
	assert_died_of_bug(&d, want);
}

static void test_bug_on_names_file_line_and_invariant(void **state)
{
	char want[512];
	struct death d;

	want_line(want, sizeof(want), trip_bug_on(1),
		  "a reference is dropped once, never twice", "refs == 0");
	run_child(trip_bug_on, NULL, &d);
	assert_died_of_bug(&d, want);
}

static void test_bug_names_file_line_and_invariant(void **state)
{
	char want[512];
	struct death d;

	want_line(want, sizeof(want), trip_bug(1), "every option code has a case", NULL);
	run_child(trip_bug, NULL, &d);
	assert_died_of_bug(&d, want);
}

/* kvpoold with log = FILE: the line is on stderr and in the file, at
 * priority crit, as the log's last line. */
static void test_bug_goes_to_the_daemon_log_file(void **state)
{
	char path[] = "/tmp/kvpool-test-bug-XXXXXX";
	char want[512], text[2048];
	struct death d;
	ssize_t n;
	int fd;

	fd = mkstemp(path);
	assert_true(fd >= 0);
	want_line(want, sizeof(want), trip_bug_on(1),
		  "a reference is dropped once, never twice", "refs == 0");
	run_child(trip_bug_on, path, &d);
	assert_died_of_bug(&d, want);

	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	unlink(path);
	assert_true(n > 0);
	text[n] = '\0';
	assert_non_null(strstr(text, ": crit: "));
	/* The line without its newline ends the file's one line. */
	want[strlen(want) - 1] = '\0';
	assert_non_null(strstr(text, want));
	assert_int_equal(text[n - 1], '\n');
	assert_ptr_equal(strchr(text, '\n'), text + n - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_assert_names_file_line_and_invariant),
		cmocka_unit_test(test_bug_on_names_file_line_and_invariant),
		cmocka_unit_test(test_bug_names_file_line_and_invariant),
		cmocka_unit_test(test_bug_goes_to_the_daemon_log_file),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
