// SPDX-License-Identifier: MIT
/*
 * cpu_busy.c - the runnable-threads-vs-cores test (cpu_busy.h).
 *
 * Lock-free: the threads of a process share one cached answer and the time
 * it was taken. Two threads may both see it stale and both read /proc; the
 * later store wins, which is as good as either.
 */
#define _GNU_SOURCE
#include "cpu_busy.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t busy_at;     /* CLOCK_MONOTONIC ns of the last look; 0 none */
static bool busy_last;       /* its answer */
static uint32_t busy_cores;  /* usable cores; 0 not read yet */
static int busy_mode = -1;   /* -1 unread, 0 test, 1 KVPOOL_SPIN=always */

uint32_t cpu_busy_parse_running(const char *s)
{
	/* "0.50 0.40 0.30 3/456 12345": skip three fields. */
	for (int f = 0; f < 3; f++) {
		s = strchr(s, ' ');
		if (!s)
			return 0;
		s++;
	}
	return (uint32_t)strtoul(s, NULL, 10);
}

/* The machine's cores, as nr_running is the machine's: a process pinned to
 * a few cores still shares them with whatever else runs. */
static uint32_t usable_cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? (uint32_t)n : 1;
}

static bool look(void)
{
	char buf[128];
	ssize_t got;
	int fd;

	fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false; /* no /proc: spin as before */
	got = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (got <= 0)
		return false;
	buf[got] = '\0';
	return cpu_busy_parse_running(buf) > __atomic_load_n(&busy_cores, __ATOMIC_RELAXED);
}

bool cpu_busy(uint64_t now_ns)
{
	int mode = __atomic_load_n(&busy_mode, __ATOMIC_RELAXED);
	uint64_t at = __atomic_load_n(&busy_at, __ATOMIC_ACQUIRE);
	bool b;

	if (mode < 0) {
		const char *v = getenv("KVPOOL_SPIN");

		mode = v && !strcmp(v, "always");
		__atomic_store_n(&busy_cores, usable_cores(), __ATOMIC_RELAXED);
		__atomic_store_n(&busy_mode, mode, __ATOMIC_RELAXED);
	}
	if (mode)
		return false;
	if (at && now_ns - at < CPU_BUSY_PERIOD_NS)
		return __atomic_load_n(&busy_last, __ATOMIC_RELAXED);
	b = look();
	__atomic_store_n(&busy_last, b, __ATOMIC_RELAXED);
	__atomic_store_n(&busy_at, now_ns ? now_ns : 1, __ATOMIC_RELEASE);
	return b;
}
