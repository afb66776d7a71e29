/* SPDX-License-Identifier: MIT */
/*
 * gpu_test_util.h - what the gpu tests share: the skip where no CUDA device
 * is present, and a kvpoold --backend=cuda of their own in a fresh temp dir
 * (started, waited for, stopped, its log shown on a failure).
 */
#ifndef KVPOOL_GPU_TEST_UTIL_H
#define KVPOOL_GPU_TEST_UTIL_H

#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>

/* True where no CUDA device is present, after printing the SKIP line:
 * main returns 77 then (the tests' SKIP_RETURN_CODE). */
bool gpu_test_no_device(void);

/* Messages go to stderr as "[tag] ...". */
__attribute__((format(printf, 2, 3)))
void gpu_test_say(const char *tag, const char *fmt, ...);

/* Wait up to wait_ms for pid to exit; 0 when it exited with status 0. On a
 * timeout it is killed. Says what went wrong, naming it who. */
int gpu_test_reap(const char *tag, pid_t pid, const char *who, unsigned wait_ms);

struct gpu_daemon {
	const char *tag;     /* for messages */
	char dir[64];        /* the temp dir */
	char sock[160];      /* dir/kvpoold.sock */
	char log[160];       /* dir/kvpoold.log: its stdout and stderr */
	pid_t pid;
};

/*
 * A fresh temp dir from dir_template (mkdtemp's XXXXXX) and in it
 *
 *   kvpoold --socket=SOCK --backend=cuda --foreground ARGS... --log=stderr
 *
 * (args: NULL-terminated), waited for until its socket is there (30 s).
 * Returns 0; or 1 with a message (and the daemon's log where it got that
 * far), nothing left running.
 */
int gpu_daemon_start(struct gpu_daemon *d, const char *tag,
		     const char *dir_template, const char *kvpoold,
		     const char *const *args);

/* SIGTERM, then gpu_test_reap() for wait_ms: 0 when it exited cleanly. */
int gpu_daemon_stop(const struct gpu_daemon *d, unsigned wait_ms);

/* Copy the daemon's log to stderr, between marker lines. */
void gpu_daemon_dump_log(const struct gpu_daemon *d);

/* Remove the log, the socket and the temp dir. */
void gpu_daemon_cleanup(const struct gpu_daemon *d);

/*
 * The tests' deterministic random numbers (splitmix64). Each test seeds it
 * once, first thing in main, so a failure reproduces with the same data.
 */
void gpu_rng_seed(uint64_t seed);
uint64_t gpu_rng(void);
/* Uniform in [0, n), n > 0. */
uint32_t gpu_below(uint32_t n);

#endif /* KVPOOL_GPU_TEST_UTIL_H */
