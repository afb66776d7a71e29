/* SPDX-License-Identifier: MIT */
/*
 * log.c - kvpoold's log sink. Not a logging framework: three sinks, one
 * line format ("2025-01-02T03:04:05.678 kvpoold[pid]: level: text"), and a
 * reopen for logrotate. Workers log only on rare events (a broken client),
 * never per operation, so the write(2) per line costs nothing that matters.
 *
 * What a peer can trigger at will (a refused or dropped connection) goes
 * through a per-call-site token bucket (log.h), so a flood of them costs a
 * few lines and a count, not a line each: 60,000 refused connections wrote
 * 25,700 lines before it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bug.h"
#include "clock.h"
#include "log.h"

enum sink { SINK_STDERR, SINK_FILE, SINK_SYSLOG };

static enum sink sink = SINK_STDERR;
static int log_fd = STDERR_FILENO;
static char log_path[4096];
/* stderr is systemd's journal (JOURNAL_STREAM names it): lines start with
 * their syslog priority ("<3>") so `journalctl -p warning` can select them,
 * and carry no time or pid, which the journal records itself. */
static bool journal;
static int max_prio = LOG_INFO; /* log_level: less severe lines are dropped */

/* JOURNAL_STREAM is "DEVICE:INODE" of the journal's stream; stderr is the
 * journal only if it is that very file (a child's stderr may be another). */
static bool stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!env || sscanf(env, "%llu:%llu", &dev, &ino) != 2 ||
	    fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev &&
	       (unsigned long long)st.st_ino == ino;
}

/* A broken invariant (lib/bug.h) is on stderr already; where the log goes
 * elsewhere (a file, syslog), it is the log's last line too. */
static void log_bug(const char *line)
{
	if (!log_to_stderr())
		log_msg(LOG_CRIT, "%s", line);
}

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

	kvp_bug_set_sink(log_bug);
	if (!target)
		target = daemonized ? "syslog" : "stderr";
	if (strcmp(target, "stderr") == 0) {
		sink = SINK_STDERR;
		log_fd = STDERR_FILENO;
		journal = stderr_is_journal();
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

bool log_stderr_is_journal(void)
{
	return stderr_is_journal();
}

bool log_to_journal(void)
{
	return sink == SINK_STDERR && journal;
}

static const char *prio_name(int prio)
{
	switch (prio) {
	case LOG_CRIT: return "crit";
	case LOG_ERR: return "error";
	case LOG_WARNING: return "warning";
	case LOG_DEBUG: return "debug";
	default: return "info";
	}
}

void log_set_level(int prio)
{
	__atomic_store_n(&max_prio, prio, __ATOMIC_RELAXED);
}

bool log_enabled(int prio)
{
	return prio <= __atomic_load_n(&max_prio, __ATOMIC_RELAXED);
}

const char *log_level_name(int prio)
{
	return prio_name(prio);
}

static void log_vmsg(int prio, const char *fmt, va_list ap)
{
	char line[1024];
	struct tm tm;
	int n, m;

	if (prio > __atomic_load_n(&max_prio, __ATOMIC_RELAXED))
		return;

	if (sink == SINK_SYSLOG) {
		vsyslog(prio, fmt, ap);
		return;
	}
	if (log_to_journal()) {
		n = snprintf(line, sizeof(line), "<%d>%s: ", prio, prio_name(prio));
	} else {
		uint64_t now = real_ns();
		time_t sec = (time_t)(now / 1000000000ull);

		localtime_r(&sec, &tm);
		n = (int)strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
		n += snprintf(line + n, sizeof(line) - (size_t)n,
			      ".%03u kvpoold[%d]: %s: ",
			      (unsigned)(now / 1000000u % 1000u), (int)getpid(),
			      prio_name(prio));
	}
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
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

void log_msg(int prio, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vmsg(prio, fmt, ap);
	va_end(ap);
}

/* ------------------------------------------------------------ rate limit */

/* Guards every struct log_limit and the list of those that suppressed. */
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_limit *limited;

static uint64_t limit_ms(void)
{
	/* + 1: 0 means "never used" in a log_limit. */
	return mono_ms() + 1;
}

static uint64_t (*clock_fn)(void) = limit_ms;

uint64_t log_now_ms(void)
{
	return clock_fn();
}

void log_set_clock(uint64_t (*now_ms)(void))
{
	clock_fn = now_ms ? now_ms : limit_ms;
}

bool log_limit_take(struct log_limit *l, uint64_t now_ms)
{
	if (!l->refill_ms) {
		l->refill_ms = now_ms;
		l->tokens = LOG_BURST;
	} else if (now_ms > l->refill_ms && now_ms - l->refill_ms >= LOG_REFILL_MS) {
		uint64_t add = (now_ms - l->refill_ms) / LOG_REFILL_MS;

		l->tokens = add >= LOG_BURST - l->tokens ? LOG_BURST :
			    l->tokens + (uint32_t)add;
		/* Keep the remainder: a token every LOG_REFILL_MS, not every
		 * LOG_REFILL_MS after the last line. */
		l->refill_ms += add * LOG_REFILL_MS;
	}
	if (!l->tokens)
		return false;
	l->tokens--;
	return true;
}

/* Under limit_lock: hand over l's count and first line, and reset them. */
static uint64_t summary_take(struct log_limit *l, uint64_t now_ms, char *first,
			     size_t len, uint64_t *age_ms)
{
	uint64_t n = l->suppressed;

	snprintf(first, len, "%s", l->first);
	*age_ms = now_ms > l->since_ms ? now_ms - l->since_ms : 0;
	l->suppressed = 0;
	l->first[0] = '\0';
	return n;
}

static void summary_write(int prio, uint64_t n, uint64_t age_ms, const char *first)
{
	log_msg(prio, "%" PRIu64 " similar line%s suppressed in the last %" PRIu64
		".%" PRIu64 " s (rate limit: %d, then one per %u s); the first: %s",
		n, n == 1 ? "" : "s", age_ms / 1000, age_ms % 1000 / 100, LOG_BURST,
		LOG_REFILL_MS / 1000, first);
}

void log_msg_limited(struct log_limit *l, int prio, const char *fmt, ...)
{
	char first[sizeof(l->first)];
	uint64_t now, n = 0, age = 0;
	va_list ap;
	bool pass;

	va_start(ap, fmt);
	pthread_mutex_lock(&limit_lock);
	now = log_now_ms(); /* under the lock: never older than since_ms */
	pass = log_limit_take(l, now);
	if (pass && l->suppressed) {
		n = summary_take(l, now, first, sizeof(first), &age);
	} else if (!pass && !l->suppressed++) {
		l->prio = prio;
		l->since_ms = now;
		vsnprintf(l->first, sizeof(l->first), fmt, ap);
		if (!l->listed) {
			l->listed = true;
			l->next = limited;
			limited = l;
		}
	}
	pthread_mutex_unlock(&limit_lock);
	if (n)
		summary_write(prio, n, age, first);
	if (pass)
		log_vmsg(prio, fmt, ap);
	va_end(ap);
}

static int flush(uint64_t now_ms, bool all)
{
	uint64_t next = UINT64_MAX;

	pthread_mutex_lock(&limit_lock);
	for (struct log_limit *l = limited; l; l = l->next) {
		char first[sizeof(l->first)];
		uint64_t n, age = now_ms > l->since_ms ? now_ms - l->since_ms : 0;
		int prio = l->prio;

		if (!l->suppressed)
			continue;
		if (!all && age < LOG_SUMMARY_MS) {
			uint64_t due = LOG_SUMMARY_MS - age;

			next = due < next ? due : next;
			continue;
		}
		n = summary_take(l, now_ms, first, sizeof(first), &age);
		/* Written under the lock: rare, and keeps the walk simple. */
		summary_write(prio, n, age, first);
	}
	pthread_mutex_unlock(&limit_lock);
	return next == UINT64_MAX ? -1 : (int)next;
}

int log_flush_suppressed(uint64_t now_ms)
{
	return flush(now_ms, false);
}

void log_flush_all(void)
{
	flush(log_now_ms(), true);
}
