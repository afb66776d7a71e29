/* SPDX-License-Identifier: MIT */
/*
 * daemon_proc.h - a private kvpoold for one benchmark run, and a look at a
 * running daemon's threads through /proc.
 *
 * kvb_daemon_start() forks and execs kvpoold in the foreground on a socket
 * in a fresh temporary directory (mkdtemp under $TMPDIR, else /tmp), with
 * its standard output and error in a log file next to the socket, and waits
 * until kvp_connect() succeeds on it. kvb_daemon_stop() sends SIGTERM, waits
 * for the exit and removes the directory. The daemon gets SIGTERM by itself
 * if kvbench dies first (PR_SET_PDEATHSIG), so no benchmark leaves one
 * behind.
 *
 * The binary is --kvpoold PATH when given, else "kvpoold" in the directory
 * of the running kvbench (/proc/self/exe): the build tree and an install put
 * them side by side.
 */
#ifndef KVBENCH_DAEMON_PROC_H
#define KVBENCH_DAEMON_PROC_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KVB_DAEMON_MAX_FLAGS 16
#define KVB_DAEMON_EXTRA 4 /* --daemon-flag, at most */

struct kvb_daemon {
	pid_t pid;                 /* 0: not running */
	char path[PATH_MAX];       /* the kvpoold binary */
	char dir[96];              /* the temporary directory */
	char sock[128];            /* dir/kvpoold.sock (fits sun_path) */
	char log[128];             /* dir/kvpoold.log */
	char command[2048];        /* the command line it was started with */
	int exit_status;           /* wait status once it is gone */
};

/*
 * Where kvpoold is: override when not NULL (checked to be executable), else
 * next to this executable. Returns 0 with the path in out, or -ENOENT /
 * -EACCES with a message in err that says how to point at it.
 */
int kvb_daemon_find(const char *override, char *out, size_t outlen,
		    char *err, size_t errlen);

/*
 * Start kvpoold at path with --socket, --backend=shm, --foreground and the
 * given extra flags ("--key=value", NULL-terminated, at most
 * KVB_DAEMON_MAX_FLAGS), and wait up to timeout_ms for it to serve. Returns
 * 0, or -errno with a message in err (the log's last lines go to stderr when
 * the daemon exited or did not answer); on failure nothing is left running.
 * cpu >= 0 pins the daemon (every thread it will have) to that CPU.
 */
int kvb_daemon_start(struct kvb_daemon *d, const char *path,
		     const char *const *flags, int cpu, int timeout_ms, char *err,
		     size_t errlen);

/*
 * SIGTERM, wait up to timeout_ms (then SIGKILL), remove the directory.
 * Returns 0 when the daemon exited with status 0, else -1 with what
 * happened in err. Safe to call on a daemon that was never started.
 */
int kvb_daemon_stop(struct kvb_daemon *d, int timeout_ms, char *err,
		    size_t errlen);

/*
 * What a benchmark asks of the daemon it runs against: --socket names a
 * running one (nothing is started and the settings below are not used),
 * else kvpoold is started with these settings. Zero / NULL / -1 leave a
 * setting at the daemon's default.
 */
struct kvb_daemon_opts {
	const char *socket;      /* --socket: a running kvpoold */
	const char *kvpoold;     /* --kvpoold: the binary to start */
	int64_t spin_us;         /* --spin_us; -1: default */
	uint64_t workers;        /* --workers */
	uint64_t device_mem;     /* --device_mem, bytes */
	uint64_t host_mem;       /* --host_mem, bytes (0 is passed: no host tier) */
	uint64_t max_tokens;     /* --max_tokens_per_user */
	const char *layout;      /* --layout */
	int cpu;                 /* pin every daemon thread to this CPU; -1: no */
	uint64_t client_spin_us; /* kvp_connect_opts.spin_us of the benchmark's
				  * clients; 0: libkvpool's default */
	const char *disk_dir;    /* --disk-dir: a disk tier there; NULL: none */
	uint64_t disk_size;      /* --disk-size, bytes (with disk_dir) */
	const char *flag[KVB_DAEMON_EXTRA]; /* --daemon-flag: passed as they are */
	int nflag;
};

/*
 * The options that say which daemon to run against and how, for the long_opts
 * table (<getopt.h>) of a subcommand that runs against one; their codes are
 * above any subcommand's own. --workers (KVB_OPT_WORKERS) is not in
 * KVB_DAEMON_LONG_OPTS: a subcommand that takes it lists it itself.
 */
enum {
	KVB_OPT_SOCKET = 1024, KVB_OPT_KVPOOLD, KVB_OPT_SPIN, KVB_OPT_CLIENT_SPIN,
	KVB_OPT_DAEMON_CPU, KVB_OPT_WORKERS, KVB_OPT_DISK_DIR, KVB_OPT_DISK_SIZE,
	KVB_OPT_DAEMON_FLAG,
};

#define KVB_DAEMON_LONG_OPTS						\
	{ "socket", required_argument, NULL, KVB_OPT_SOCKET },		\
	{ "kvpoold", required_argument, NULL, KVB_OPT_KVPOOLD },	\
	{ "spin-us", required_argument, NULL, KVB_OPT_SPIN },		\
	{ "client-spin-us", required_argument, NULL, KVB_OPT_CLIENT_SPIN }, \
	{ "daemon-cpu", required_argument, NULL, KVB_OPT_DAEMON_CPU },	\
	{ "disk-dir", required_argument, NULL, KVB_OPT_DISK_DIR },	\
	{ "disk-size", required_argument, NULL, KVB_OPT_DISK_SIZE },	\
	{ "daemon-flag", required_argument, NULL, KVB_OPT_DAEMON_FLAG }

/*
 * Read one of those options of subcommand sub into *o: --socket PATH,
 * --kvpoold PATH (must be executable), --spin-us US, --client-spin-us US,
 * --daemon-cpu N|none (a CPU this process may run on), --workers N,
 * --disk-dir DIR and --disk-size SIZE (the daemon's disk tier),
 * --daemon-flag --KEY=VALUE (any kvpoold flag, up to KVB_DAEMON_EXTRA; an
 * A/B of one setting in one run, e.g. --reclaim_boost=no). Returns
 * -1 to go on, else KVB_EXIT_USAGE after reporting the error (kvb_opt_fn).
 */
int kvb_daemon_opt(const char *sub, int code, const char *arg,
		   struct kvb_daemon_opts *o);

/*
 * Start the daemon o asks for (or none, with --socket) and set *socket to
 * where to connect. Returns 0, or -errno with a message in err.
 */
int kvb_daemon_open(struct kvb_daemon *d, const struct kvb_daemon_opts *o,
		    const char **socket, char *err, size_t errlen);

/* The --disk_dir and --disk_size flags o asks for into f[0..1], then its
 * --daemon-flag flags: how many (at most 2 + KVB_DAEMON_EXTRA). */
int kvb_daemon_tail_flags(const struct kvb_daemon_opts *o, char (*f)[320]);

struct json;
/* "daemon": {"started", "socket", "pid", "path", "command", "spin_us",
 * "workers", "cpu"} ("spin_us" / "workers" / "cpu" null when the daemon's
 * default / not pinned; only "started", "socket", "pid" for --socket). */
void json_daemon(struct json *j, const struct kvb_daemon *d,
		 const struct kvb_daemon_opts *o, const char *socket, pid_t pid);

/* The table's line saying which kvpoold ran: the one at socket, or d started. */
void kvb_print_daemon(const struct kvb_daemon *d, const struct kvb_daemon_opts *o,
		      const char *socket);

/* CPU time and context switches of one process's threads, from /proc. */
struct kvb_proc_sample {
	int main_last_cpu;         /* the CPU each last ran on; -1 unknown */
	int other_last_cpu;        /* the first other thread's */
	uint64_t main_cpu_ns;      /* the thread whose tid is the pid */
	uint64_t other_cpu_ns;     /* every other thread (kvpoold: the workers) */
	uint64_t main_vcsw, main_ivcsw;   /* voluntary / involuntary switches */
	uint64_t other_vcsw, other_ivcsw;
	uint32_t threads;
	int ok;                    /* 0: /proc could not be read */
};

/* Sample pid's threads (user + system CPU time, context switches). */
void kvb_proc_sample(pid_t pid, struct kvb_proc_sample *out);

/* The pid at the other end of a connected Unix socket, or -1. */
pid_t kvb_peer_pid(int sock);

#endif /* KVBENCH_DAEMON_PROC_H */
