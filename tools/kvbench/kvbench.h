/* SPDX-License-Identifier: MIT */
/*
 * kvbench.h - what the kvbench subcommands share: exit codes, option parsing,
 * CPU pinning, the machine description and the pieces of every report (the
 * JSON writer itself is tools/common/json.c).
 *
 * Every subcommand is `int cmd_<name>(int argc, char **argv)` with argv[0]
 * the subcommand's name; it returns the process exit status. The shared
 * helpers live in main.c next to the subcommand table.
 */
#ifndef KVBENCH_H
#define KVBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "json.h" /* tools/common: the JSON writer kvctl prints with too */

#define KVB_EXIT_OK 0
#define KVB_EXIT_FAIL 1  /* the benchmark ran and something failed */
#define KVB_EXIT_USAGE 2 /* bad command line: nothing was measured */

/* Subcommands. */
int cmd_engine(int argc, char **argv);
int cmd_rtt(int argc, char **argv);
int cmd_throughput(int argc, char **argv);
int cmd_gpu(int argc, char **argv); /* gpu_report.c */
int cmd_peer(int argc, char **argv); /* bench_peer.c */
int cmd_trace(int argc, char **argv);  /* trace_cmd.c */
int cmd_replay(int argc, char **argv); /* replay.c */
int cmd_prefix(int argc, char **argv); /* bench_prefix.c */
int cmd_disk(int argc, char **argv);   /* bench_disk.c */
int cmd_remote(int argc, char **argv); /* bench_remote.c */

/* ---------------------------------------------------------------- options */

/* The whole command line as the user typed it (shell-quoted where needed). */
const char *kvb_command_line(void);

/*
 * Report a usage error of subcommand sub ("kvbench sub: <message>" and a
 * pointer to --help on stderr) and return KVB_EXIT_USAGE.
 */
__attribute__((format(printf, 2, 3)))
int kvb_usage_error(const char *sub, const char *fmt, ...);

/*
 * A subcommand's options are read by kvb_parse_opts() and handed one by one
 * to its kvb_opt_fn, whose handlers, like the kvb_opt_*() helpers below,
 * return -1 to go on, else the exit status (KVB_EXIT_USAGE after reporting
 * the error). code is the option's getopt_long value, arg its value or NULL.
 */
typedef int (*kvb_opt_fn)(void *ctx, int code, const char *arg);

/*
 * getopt_long codes: a subcommand's own options count from 256, kvbench's
 * shared ones from 512 (below) and 1024 (the daemon's, daemon_proc.h).
 */
#define KVB_OPT_JSON 512

/* The options every subcommand takes, to end its long_opts table (<getopt.h>)
 * with: --json and -h/--help. */
#define KVB_LONG_OPTS_END					\
	{ "json", no_argument, NULL, KVB_OPT_JSON },		\
	{ "help", no_argument, NULL, 'h' },			\
	{ NULL, 0, NULL, 0 }

/* Their lines in a subcommand's --help, after its own options. */
#define KVB_USAGE_END_OPTS						\
	"  --json             print one JSON object on stdout instead of a table\n" \
	"  -h, --help         this help\n"

struct option;
/*
 * Read argv (argv[0] the subcommand) with getopt_long and long_opts, giving
 * each of the subcommand's options to opt(ctx, ...) in order. --json sets
 * *json; -h/--help prints usage on stdout and returns KVB_EXIT_OK; an unknown
 * option, an option missing its value or one given a value it does not take,
 * and any operand, are usage errors. Returns -1 when the whole command line
 * was read, else the exit status.
 */
int kvb_parse_opts(const char *sub, int argc, char **argv,
		   const struct option *long_opts, void (*usage)(FILE *f),
		   kvb_opt_fn opt, void *ctx, bool *json);

/*
 * A count for option opt into *out: decimal digits with an optional k, M or
 * G suffix (x1e3, x1e6, x1e9) and '_' or ',' as digit separators ("2M",
 * "2,000,000"), in [min, max]; else a usage error that names the option and
 * the range.
 */
/* Bytes with an optional K, M or G (binary) suffix into *out: 0, or -1 for
 * 0 or junk (the caller says what is wrong). */
int kvb_opt_bytes(const char *s, uint64_t *out);
int kvb_opt_count(const char *sub, const char *opt, const char *arg,
		  uint64_t min, uint64_t max, uint64_t *out);

/* A positive finite number of seconds, at most a day ("2", "0.5"). */
int kvb_opt_seconds(const char *sub, const char *opt, const char *arg,
		    double *out);

/* --cpu N|none: a CPU number into *cpu, or KVB_CPU_NONE for "none". */
int kvb_opt_cpu(const char *sub, const char *arg, int *cpu);

/*
 * Pin the calling thread to one CPU: cpu >= 0 that CPU, KVB_CPU_CURRENT the
 * one it runs on now, KVB_CPU_NONE leaves the affinity alone. Returns the CPU
 * pinned to (or -1 for none), or -EINVAL / -errno with a message in err.
 */
#define KVB_CPU_CURRENT (-1)
#define KVB_CPU_NONE (-2)
int kvb_pin_cpu(int cpu, char *err, size_t errlen);

/* ---------------------------------------------------------------- machine */

struct kvb_machine {
	char cpu_model[128];  /* /proc/cpuinfo "model name" */
	long nproc;           /* online CPUs */
	int cpu;              /* pinned to, or -1 */
	char kernel[128];     /* uname -r */
	char clocksource[32]; /* the kernel's current clocksource */
	char date[32];        /* UTC, ISO 8601 */
};

void kvb_machine_info(struct kvb_machine *m, int pinned_cpu);

/* ---------------------------------------------------------------- report */

struct summary;

/*
 * What a measurement starts with: pin to cpu (a --cpu value), describe the
 * machine into *m and measure the timer's overhead into *tov. Returns -1 to
 * go on, else the exit status, the error reported (a --cpu N this process may
 * not run on is a usage error).
 */
int kvb_begin_run(const char *sub, int cpu, struct kvb_machine *m,
		  struct summary *tov);

/* Open the JSON report on stdout with its first member, "benchmark". */
void kvb_json_begin(struct json *j, const char *benchmark);

/*
 * End the report with the members every kvbench report carries: "machine",
 * "date", "command". Closes the object and flushes stdout.
 */
void kvb_json_end(struct json *j, const struct kvb_machine *m);

/* A latency summary as {"samples", "mean_ns", "min_ns", "p50_ns", "p90_ns",
 * "p99_ns", "p999_ns", "max_ns"}. */
void json_summary(struct json *j, const char *key, const struct summary *s);

/* ---------------------------------------------------------------- timing */

/* CLOCK_MONOTONIC in seconds, for the timed passes. */
static inline double kvb_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* bytes moved in s seconds as GB/s (10^9 bytes); 0 for no time. */
static inline double kvb_gbps(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : 0;
}

#endif /* KVBENCH_H */
