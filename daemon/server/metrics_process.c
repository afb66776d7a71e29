/* SPDX-License-Identifier: MIT */
/*
 * metrics_process.c - the process_* families every Prometheus client
 * library serves (CPU seconds, resident and virtual memory, descriptors
 * open and allowed, start time), read from /proc/self, so a dashboard's
 * usual panels work on kvpoold as on any other target.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "metrics.h"
#include "server.h"

/* Fields 14-15 (utime, stime, clock ticks) and 23-24 (vsize bytes, rss
 * pages) of /proc/self/stat; the name (field 2) may hold spaces, so the
 * count starts after its closing parenthesis. */
static int proc_stat(uint64_t *ticks, uint64_t *vsize, uint64_t *rss_pages)
{
	char buf[1024], *p;
	unsigned long long ut, st, vs, rs;
	FILE *f = fopen("/proc/self/stat", "re");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	/* After ")": state (3), then fields 4..13 skipped, 14 utime, 15 stime,
	 * 16..22 skipped, 23 vsize, 24 rss. */
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu "
			 "%*d %*d %*d %*d %*d %*d %*u %llu %llu", &ut, &st, &vs, &rs) != 4)
		return -1;
	*ticks = ut + st;
	*vsize = vs;
	*rss_pages = rs;
	return 0;
}

static uint64_t open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	uint64_t n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n ? n - 1 : 0; /* not the one opendir holds */
}

void metrics_write_process(const struct server *s, FILE *f)
{
	uint64_t ticks, vsize, rss;
	long hz = sysconf(_SC_CLK_TCK), psz = sysconf(_SC_PAGESIZE);
	struct rlimit rl;

	if (!proc_stat(&ticks, &vsize, &rss) && hz > 0 && psz > 0) {
		fputs("# HELP process_cpu_seconds_total User and system CPU time spent, "
		      "in seconds.\n# TYPE process_cpu_seconds_total counter\n", f);
		fprintf(f, "process_cpu_seconds_total %.2f\n", (double)ticks / (double)hz);
		fputs("# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
		      "# TYPE process_resident_memory_bytes gauge\n", f);
		fprintf(f, "process_resident_memory_bytes %" PRIu64 "\n", rss * (uint64_t)psz);
		fputs("# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
		      "# TYPE process_virtual_memory_bytes gauge\n", f);
		fprintf(f, "process_virtual_memory_bytes %" PRIu64 "\n", vsize);
	}
	fputs("# HELP process_open_fds Number of open file descriptors.\n"
	      "# TYPE process_open_fds gauge\n", f);
	fprintf(f, "process_open_fds %" PRIu64 "\n", open_fds());
	if (!getrlimit(RLIMIT_NOFILE, &rl)) {
		fputs("# HELP process_max_fds Maximum number of open file descriptors.\n"
		      "# TYPE process_max_fds gauge\n", f);
		fprintf(f, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
	}
	fputs("# HELP process_start_time_seconds Start time of the process since "
	      "unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\n", f);
	fprintf(f, "process_start_time_seconds %.3f\n", (double)s->started_real_ns / 1e9);
}
