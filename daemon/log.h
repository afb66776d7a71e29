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

__attribute__((format(printf, 2, 3)))
void log_msg(int prio, const char *fmt, ...);

#define log_err(...)   log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARNING, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)

#endif /* KVPOOLD_LOG_H */
