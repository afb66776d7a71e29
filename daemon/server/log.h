/* SPDX-License-Identifier: MIT */
/*
 * log.h - kvpoold's log: one line per event, to stderr, a file or syslog.
 *
 * Every thread may log; a line is formatted into one buffer and written
 * with one write(2), so lines from different threads never interleave.
 * Priorities are syslog's (LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG).
 */
#ifndef KVPOOLD_LOG_H
#define KVPOOLD_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <syslog.h>

/*
 * Send the log to target: "stderr", "syslog" or a file path (appended to).
 * NULL picks the default: stderr in the foreground, syslog when daemonized.
 * Returns 0 or -errno with a message in err.
 */
int log_open(const char *target, bool daemonized, char *err, size_t errlen);
/* Reopen a log file (SIGHUP, after logrotate moved it); no-op otherwise. */
void log_reopen(void);
void log_close(void);
/* True while lines go to stderr (start-up errors need not be doubled). */
bool log_to_stderr(void);
/* Write lines of priority prio and more severe only (LOG_INFO at start;
 * kvpoold sets log_level's); the name of a level ("warning"). */
void log_set_level(int prio);
const char *log_level_name(int prio);
/* True while stderr is systemd's journal (JOURNAL_STREAM): lines carry
 * syslog priority prefixes ("<3>error: ...") and no time or pid. */
bool log_to_journal(void);
/* Whether standard error is the journal's stream now, before or whatever
 * log_open() chose: errors written there straight start with "<3>". */
bool log_stderr_is_journal(void);

/* One line, never rate-limited (start-up, shutdown, the limiter's own). */
__attribute__((format(printf, 2, 3)))
void log_msg(int prio, const char *fmt, ...);

/*
 * The rate limit (issue 11: a flood of refused connections wrote one line
 * each). Every log_err/log_warn/log_info call site has a token bucket of its
 * own: LOG_BURST lines at once, then one more every LOG_REFILL_MS. A line
 * over the limit is counted, not written; the site's next line that gets
 * through, or log_flush_suppressed() once LOG_SUMMARY_MS have passed, first
 * writes one line saying how many similar lines were suppressed and what the
 * first of them said. Lines of one site are "similar" whatever their values.
 */
#define LOG_BURST 10
#define LOG_REFILL_MS 5000u
#define LOG_SUMMARY_MS 5000u

struct log_limit {
	uint64_t refill_ms;         /* when tokens were last topped up; 0: new */
	uint32_t tokens;
	int prio;
	uint64_t suppressed;        /* lines dropped since the last summary */
	uint64_t since_ms;          /* when the first of them came */
	char first[160];            /* what it said */
	struct log_limit *next;     /* on the list log_flush_suppressed walks */
	bool listed;
};

/* The bucket alone (no lock, no output), at time now_ms: true when a line
 * may go out now (a token is taken), false when it is to be suppressed. */
bool log_limit_take(struct log_limit *l, uint64_t now_ms);

/* log_msg through l's bucket (thread-safe). */
__attribute__((format(printf, 3, 4)))
void log_msg_limited(struct log_limit *l, int prio, const char *fmt, ...);

/*
 * Write the summary of every site whose suppressed lines are LOG_SUMMARY_MS
 * old at now_ms (log_now_ms()). Returns the ms until the next summary is due,
 * or -1 when none is pending: the main loop's epoll timeout.
 */
int log_flush_suppressed(uint64_t now_ms);
/* Every pending summary now, due or not (at shutdown). */
void log_flush_all(void);

/* CLOCK_MONOTONIC in ms, as the limiter reads it; tests may replace the
 * clock (NULL restores it). */
uint64_t log_now_ms(void);
void log_set_clock(uint64_t (*now_ms)(void));

#define log_limited(prio, ...) do {					\
		static struct log_limit log_site_;			\
		log_msg_limited(&log_site_, prio, __VA_ARGS__);		\
	} while (0)

#define log_err(...)   log_limited(LOG_ERR, __VA_ARGS__)
#define log_warn(...)  log_limited(LOG_WARNING, __VA_ARGS__)
#define log_info(...)  log_limited(LOG_INFO, __VA_ARGS__)
/* True when lines of prio are written (log_level): a debug line's site
 * costs nothing, not even the limiter's lock, below it. */
bool log_enabled(int prio);
/* Per-request lines (log_level=debug): rate-limited per site like the
 * others, looked at only when debug lines are written. */
#define log_debug(...) do {						\
		if (log_enabled(LOG_DEBUG))				\
			log_limited(LOG_DEBUG, __VA_ARGS__);		\
	} while (0)

#endif /* KVPOOLD_LOG_H */
