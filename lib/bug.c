/* SPDX-License-Identifier: MIT */
/*
 * bug.c - the cold path of KVP_ASSERT/KVP_BUG_ON/KVP_BUG (bug.h): one line
 * naming the program, the file and line, the invariant and the condition,
 * then abort() (SIGABRT: a core dump where they are enabled).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bug.h"

static void (*bug_sink)(const char *line);

void kvp_bug_set_sink(void (*sink)(const char *line))
{
	__atomic_store_n(&bug_sink, sink, __ATOMIC_RELEASE);
}

void kvp_bug_at(const char *file, int line, const char *what, const char *cond)
{
	void (*sink)(const char *) = __atomic_load_n(&bug_sink, __ATOMIC_ACQUIRE);
	char buf[512];
	int n;

	if (cond)
		n = snprintf(buf, sizeof(buf), "%s: BUG at %s:%d: %s (%s)",
			     program_invocation_short_name, file, line, what, cond);
	else
		n = snprintf(buf, sizeof(buf), "%s: BUG at %s:%d: %s",
			     program_invocation_short_name, file, line, what);
	if (n < 0)
		n = 0;
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	/* One write, no stdio: the line is out even if stdio's locks are
	 * what broke, and lines of other threads do not split it. */
	buf[n] = '\n';
	if (write(STDERR_FILENO, buf, (size_t)n + 1) < 0) {
		/* Nowhere left to say it; the abort still says something. */
	}
	buf[n] = '\0';
	if (sink)
		sink(buf);
	abort();
}
