/* SPDX-License-Identifier: MIT */
/*
 * harness.h - what the integration tests share: a real kvpoold started on a
 * socket in a fresh temp dir, forked client processes, a deterministic PRNG,
 * the token bytes every test writes and reads back, and a raw ring client
 * that speaks proto.h itself (for tests that must send what libkvpool never
 * would).
 *
 * Exit codes of the test programs: 0 pass, 1 fail, 77 skip.
 */
#ifndef KVPOOL_TEST_HARNESS_H
#define KVPOOL_TEST_HARNESS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvpool.h"
#include "proto.h"

#define H_PASS 0
#define H_FAIL 1
#define H_SKIP 77

/* The layout every test uses unless it needs another: 256 bytes a token,
 * 4 KiB a page. */
#define H_LAYOUT "layers=2,kv_heads=2,head_dim=8,dtype=fp32,page_tokens=16"
#define H_PAGE_TOKENS 16u

/* ------------------------------------------------------------ messages */

/* "[test pid] ..." on stderr; h_fail also marks the process failed. */
void h_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void h_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Set the name shown in messages (the program's, or a child's role). */
void h_set_name(const char *name);

/* Monotonic milliseconds. */
uint64_t h_now_ms(void);
void h_sleep_ms(unsigned ms);
void h_sleep_us(unsigned us);

/* ------------------------------------------------------------ PRNG */

struct h_rng {
	uint64_t s;
};
/* splitmix64: fast, deterministic, every seed is a good one. */
void h_rng_seed(struct h_rng *r, uint64_t seed);
uint64_t h_rng_next(struct h_rng *r);
/* Uniform in [0, n); n > 0. */
uint64_t h_rng_below(struct h_rng *r, uint64_t n);
uint64_t h_mix64(uint64_t x);

/* ------------------------------------------------------------ token bytes */

/*
 * The bytes of token pos of user, all layers, K and V, in the
 * [layers][2][heads][dim] order kvp_append() reads: a pure function of
 * (user, pos, salt) filled with 32-bit words that are finite as fp32, bf16
 * and fp16 (so no layout can quieten a NaN on the way).
 */
void h_token_fill(const struct kvp_layout *l, uint64_t salt, uint64_t user,
		  uint64_t pos, void *out);
/* Fill n consecutive tokens from pos into out (n * token_bytes). */
void h_tokens_fill(const struct kvp_layout *l, uint64_t salt, uint64_t user,
		   uint64_t pos, uint32_t n, void *out);

/* Token ids base, base + 7, base + 14, ... into t[0, n): prompts for the
 * sharing tests (distinct bases make distinct prompts). */
void h_token_ids(uint32_t *t, uint32_t n, uint32_t base);
/* Append tokens [0, n) of h_tokens_fill(salt, user 0) through lease l (a
 * fill or write lease). 0, or the append's -errno with a message. */
int h_fill_lease(struct kvp_client *c, const struct kvp_lease *l, uint64_t salt,
		 uint32_t n);
/* Tokens [0, n) through the page table indices hold h_tokens_fill(salt,
 * user) (kvp_read_cpu from kvp_device_base). 0, or -1 with a message
 * naming what and the first token that differs. */
int h_same_bytes(struct kvp_client *c, const int32_t *indices, uint64_t salt,
		 uint64_t user, uint32_t n, const char *what);

/*
 * Read back the committed tokens of user through a read-only lease
 * (prepare n_new = 0 returns the page table) and kvp_read_cpu() from
 * kvp_device_base(), and compare them with h_tokens_fill(salt). Also checks
 * the page table's shape (npages, last_page_len). Retries -EBUSY until
 * deadline_ms. Returns 0 when every byte matches, -1 (with a message) when
 * not; *len_out gets the history length when not NULL.
 */
int h_verify_user(struct kvp_client *c, uint64_t salt, uint64_t user,
		  uint64_t expect_start, uint64_t expect_len, uint64_t *len_out);

/*
 * One write cycle: prepare(user, start+len, n), kvp_append the tokens of
 * h_tokens_fill(salt) for positions [start+len, start+len+n), commit n,
 * release. expect_pos (UINT64_MAX: don't check) is where the history must
 * end before. Returns 0 or the failing call's -errno (message logged unless
 * quiet).
 */
int h_append_cycle(struct kvp_client *c, uint64_t salt, uint64_t user,
		   uint64_t expect_pos, uint32_t n, int quiet);

/*
 * The frame accounting of the client's tenant adds up: per tier
 * frames_used + frames_free == frames_total and frames_used == the pages
 * kvp_users() reports over every user; stats count as many users as it
 * lists; no user has a lease. *st_out (may be
 * NULL) gets the stats. Returns 0, or -1 with messages.
 */
int h_check_accounting(struct kvp_client *c, struct kvp_stats *st_out);

/* kvp_connect to sock with a deadline, retrying while the daemon is not
 * there yet. Returns 0 or the last -errno (err filled). */
int h_connect(struct kvp_client **out, const char *sock, const char *name,
	      int timeout_ms, char *err, size_t errlen);
/* h_connect, or NULL with the failure reported (h_fail). */
struct kvp_client *h_connect_or_fail(const char *sock, const char *name,
				     int timeout_ms);

/* ------------------------------------------------------------ daemon */

struct h_daemon {
	pid_t pid;               /* 0: not running */
	char dir[128];           /* the temp dir (owned by the harness) */
	char sock[192];          /* dir/kvpoold.sock */
	char log[192];           /* dir/kvpoold.N.log: the daemon's stdout+stderr */
	int exit_status;         /* wait status once reaped */
	int runs;
};

/* Where kvpoold is: set by h_init() from argv. */
extern const char *h_daemon_path;
/* kvctl, when the test was given one (else NULL). */
extern const char *h_kvctl_path;

/*
 * Parse "PROGRAM DAEMON [KVCTL]", name the program, make signals and exit
 * kill whatever daemons and children the harness started and remove its temp
 * dirs. Exits 77 when the daemon binary is missing.
 */
void h_init(int argc, char **argv, const char *name);

/* Make a fresh temp dir for a daemon (mode 0700, or 0777 when world is
 * set, for tests whose clients drop root). Returns 0 or -1. */
int h_daemon_dir(struct h_daemon *d, int world);

/*
 * Start kvpoold in d's dir (h_daemon_dir first) with
 *   --socket=DIR/kvpoold.sock --backend=shm --foreground --layout=H_LAYOUT
 * then the NULL-terminated extra flags (which may override any of those:
 * later flags win), and wait until it answers a connect (kvp_connect
 * succeeds or is refused by the daemon itself) within timeout_ms.
 * Returns 0, or -1 with a message (the daemon's log is printed) and the
 * daemon killed.
 */
int h_daemon_start(struct h_daemon *d, int timeout_ms, ...)
	__attribute__((sentinel));
int h_daemon_startv(struct h_daemon *d, int timeout_ms,
		    const char *const *extra);
/* The usual daemon of a test program: h_daemon_dir (mode 0700), then
 * h_daemon_start with a 10 s timeout and the NULL-terminated extra flags.
 * Returns 0 or -1 (with a message). */
int h_daemon_up(struct h_daemon *d, ...) __attribute__((sentinel));

/*
 * Start kvpoold like h_daemon_start but do not wait for it to serve; for a
 * daemon that is expected to refuse to start. Returns the pid or -1.
 */
pid_t h_daemon_spawn(struct h_daemon *d, const char *const *extra);

/* SIGTERM, wait up to timeout_ms for it to exit; checks it exited 0 and
 * removed its socket. Returns 0 or -1 with a message (and then kills it). */
int h_daemon_stop(struct h_daemon *d, int timeout_ms);
/* SIGKILL and reap (for failure paths and stale-socket tests). */
void h_daemon_kill(struct h_daemon *d);
/* Remove the temp dir and everything in it. */
void h_daemon_cleanup(struct h_daemon *d);
/* Print the daemon's log to stderr (after a failure). */
void h_daemon_dump_log(const struct h_daemon *d);
/* Whether the daemon is still running (reaps it when it exited). */
int h_daemon_alive(struct h_daemon *d);
/* A cmocka teardown for a test that keeps a calloc'ed h_daemon in *state:
 * h_daemon_cleanup, free, *state = NULL. */
int h_daemon_teardown(void **state);

/*
 * The end of a test program's run against d, failed or not: h_daemon_end
 * after stopping the daemon (a failed stop fails the run) and logging
 * "PASS in N ms" or "FAIL in N ms", N counted from t0_ms.
 */
int h_daemon_finish(struct h_daemon *d, int fail, uint64_t t0_ms);
/* Print the daemon's log when fail, remove its dir; returns H_FAIL when
 * fail, else H_PASS. */
int h_daemon_end(struct h_daemon *d, int fail);
/* A program that runs its test once against a daemon with one worker
 * thread (which serialises the rings) and, when that passed, once with
 * two (which run clients in parallel): returns the exit code. */
int h_run_with_1_then_2_workers(int (*run)(int workers));

/* A field of /proc/PID/status in KiB (e.g. "VmRSS"), or -1. */
long h_proc_status_kb(pid_t pid, const char *field);

/* ------------------------------------------------------------ children */

/*
 * Fork a child that runs fn(arg) and _exits with its return value. The child
 * dies with its parent (PR_SET_PDEATHSIG) and is remembered so the harness
 * kills it on exit. Returns the pid or -1.
 */
pid_t h_fork(int (*fn)(void *), void *arg);
/* Like h_fork, but the child drops to uid/gid (setgroups, setgid, setuid)
 * before fn; exits 77 when that fails. */
pid_t h_fork_as(uid_t uid, gid_t gid, int (*fn)(void *), void *arg);

/*
 * Wait for pid up to timeout_ms (< 0: forever). Returns its exit code
 * (0..255), 128 + signal when it was killed, or -1 on timeout (then it is
 * SIGKILLed and reaped).
 */
int h_wait(pid_t pid, int timeout_ms);
/* Wait for n children; returns how many did not exit 0 (each logged). */
int h_wait_all(const pid_t *pids, int n, int timeout_ms);
/* Forget a child that was reaped by other means. */
void h_forget(pid_t pid);

/* Zeroed memory shared with the children forked after (MAP_SHARED), or
 * NULL with a message. */
void *h_shared_zalloc(size_t bytes);

/*
 * Two pipes between the test and one child it forks, for the two to wait
 * on each other: the child writes to_parent[1], the parent to_child[1].
 * Each side closes the other's ends (h_chan_child_side first thing in the
 * child, h_chan_parent_side right after the fork); closing one's write end
 * is an EOF the other can wait for.
 */
struct h_chan {
	int to_parent[2];
	int to_child[2];
};
/* Both pipes. Returns 0, or -1 with a message. */
int h_chan_open(struct h_chan *ch);
void h_chan_child_side(struct h_chan *ch);
void h_chan_parent_side(struct h_chan *ch);
/* Write the byte b to fd. Returns 0, or -1 with a message. */
int h_chan_say(int fd, char b);
/* The next byte from fd, waiting up to timeout_ms; -1 on a timeout or
 * EOF. */
int h_chan_wait(int fd, int timeout_ms);

/* ------------------------------------------------------------ raw ring */

/*
 * A client that attaches per proto.h by itself and drives the rings by
 * hand, so a test can put anything into the submission ring.
 */
struct h_raw {
	int sock;
	struct kvp_welcome w;
	int fds[4];
	int nfds;
	uint8_t *shm;
	size_t shm_bytes;
	struct kvp_shm_hdr hdr;   /* copied once */
	struct kvp_ring_ctl *ctl;
	struct kvp_sqe *sq;
	struct kvp_cqe *cq;
	uint8_t *arena;
	uint32_t sq_tail;         /* ours */
	uint32_t cq_head;         /* ours */
};

/*
 * Attach to sock asking for sq_entries / arena_bytes (0: defaults). Returns
 * 0; the welcome's -errno when the daemon refused (message in err and
 * r->w.msg); or another -errno when the handshake failed.
 */
int h_raw_attach(struct h_raw *r, const char *sock, uint32_t sq_entries,
		 uint32_t arena_bytes, char *err, size_t errlen);
void h_raw_detach(struct h_raw *r);
/* Free submission slots now. */
uint32_t h_raw_sq_space(const struct h_raw *r);
/* Copy e into the ring (no publish). Caller checked space. */
void h_raw_put(struct h_raw *r, const struct kvp_sqe *e);
/* One request of the uds mode (no rings) on a connected socket: send the
 * sqe, wait up to 10 s for its reply, the cqe and up to out_cap result
 * bytes into out. 0, or -errno / -ETIMEDOUT / -EPROTO. */
int h_uds_call(int sock, const struct kvp_sqe *q, struct kvp_cqe *cqe,
	       void *out, size_t out_cap);
/* Publish everything put: store-release sq_tail, wake the daemon if it
 * asked for it. */
void h_raw_publish(struct h_raw *r);
/* Ring the doorbell whether or not NEED_WAKEUP is set (harmless). */
void h_raw_kick(struct h_raw *r);
/* Take up to max completions; waits up to timeout_ms for at least min.
 * Returns how many, or -ETIMEDOUT when fewer than min came. */
int h_raw_reap(struct h_raw *r, struct kvp_cqe *out, uint32_t max,
	       uint32_t min, int timeout_ms);
/*
 * Submit n entries and collect their n completions, in whatever order they
 * come (out[i] is the completion of the entry whose tag is in[i].tag; tags
 * must be unique in the batch). Returns 0, -ETIMEDOUT, or -EPROTO on a
 * completion with an unknown or repeated tag.
 */
int h_raw_call(struct h_raw *r, const struct kvp_sqe *in, struct kvp_cqe *out,
	       uint32_t n, int timeout_ms);
/*
 * Send len bytes of *hello (len may be short) on a fresh connection and
 * read the answer. Returns 1 with *w filled when a welcome came (the fds it
 * carried are closed, *nfds says how many), 0 when the daemon hung up
 * without one, -errno otherwise (-ETIMEDOUT: no answer in timeout_ms).
 */
int h_raw_hello(const char *sock, const void *hello, size_t len,
		struct kvp_welcome *w, int *nfds, int timeout_ms);
/* Count the daemon's open fds (/proc/PID/fd), or -1. */
int h_proc_fds(pid_t pid);

/* Whether the daemon hung up the socket (the client was detached). */
int h_raw_hung_up(struct h_raw *r, int timeout_ms);

#endif /* KVPOOL_TEST_HARNESS_H */
