/* SPDX-License-Identifier: MIT */
/*
 * log.c - kvpoold's log sink. Not a logging framework: three sinks, one
 * line format ("2025-01-02T03:04:05.678 kvpoold[pid]: level: text"), and a
 * reopen for logrotate. Workers log only on rare events (a broken client),
 * never per operation, so the write(2) per line costs nothing that matters.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

enum sink { SINK_STDERR, SINK_FILE, SINK_SYSLOG };

static enum sink sink = SINK_STDERR;
static int log_fd = STDERR_FILENO;
static char log_path[4096];

static int open_file(const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);

	if (fd < 0) {
		int ret = -errno;

		snprintf(err, errlen, "log = %.160s: cannot open: %s", path, strerror(errno));
		return ret;
	}
	return fd;
}

int log_open(const char *target, bool daemonized, char *err, size_t errlen)
{
	int fd;

	if (!target)
		target = daemonized ? "syslog" : "stderr";
	if (strcmp(target, "stderr") == 0) {
		sink = SINK_STDERR;
		log_fd = STDERR_FILENO;
		return 0;
	}
	if (strcmp(target, "syslog") == 0) {
		openlog("kvpoold", LOG_PID | LOG_NDELAY, LOG_DAEMON);
		sink = SINK_SYSLOG;
		return 0;
	}
	if (strlen(target) >= sizeof(log_path)) {
		snprintf(err, errlen, "log = %.64s...: path too long", target);
		return -ENAMETOOLONG;
	}
	fd = open_file(target, err, errlen);
	if (fd < 0)
		return fd;
	if (sink == SINK_FILE && log_fd >= 0)
		close(log_fd);
	snprintf(log_path, sizeof(log_path), "%s", target);
	sink = SINK_FILE;
	log_fd = fd;
	return 0;
}

void log_reopen(void)
{
	char err[256];
	int fd;

	if (sink != SINK_FILE)
		return;
	fd = open_file(log_path, err, sizeof(err));
	if (fd < 0) {
		log_err("%s; keeping the old file open", err);
		return;
	}
	/* dup2 swaps the file under concurrent writers atomically. */
	dup2(fd, log_fd);
	close(fd);
}

void log_close(void)
{
	if (sink == SINK_SYSLOG)
		closelog();
	else if (sink == SINK_FILE)
		close(log_fd);
	sink = SINK_STDERR;
	log_fd = STDERR_FILENO;
}

bool log_to_stderr(void)
{
	return sink == SINK_STDERR;
}

static const char *prio_name(int prio)
{
	switch (prio) {
	case LOG_ERR: return "error";
	case LOG_WARNING: return "warning";
	case LOG_DEBUG: return "debug";
	default: return "info";
	}
}

void log_msg(int prio, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n, m;

	va_start(ap, fmt);
	if (sink == SINK_SYSLOG) {
		vsyslog(prio, fmt, ap);
		va_end(ap);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	n = (int)strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += snprintf(line + n, sizeof(line) - (size_t)n, ".%03ld kvpoold[%d]: %s: ",
		      ts.tv_nsec / 1000000, (int)getpid(), prio_name(prio));
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	n += m;
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line: lines of different threads do not interleave. */
	if (write(log_fd, line, (size_t)n) < 0) {
		/* Nowhere left to report it. */
	}
}
