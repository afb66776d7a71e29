/* SPDX-License-Identifier: MIT */
/*
 * kvbench.h - what the kvbench subcommands share: exit codes, option parsing,
 * CPU pinning, the machine description and the JSON report writer.
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

#define KVB_EXIT_OK 0
#define KVB_EXIT_FAIL 1  /* the benchmark ran and something failed */
#define KVB_EXIT_USAGE 2 /* bad command line: nothing was measured */

/* Subcommands. */
int cmd_engine(int argc, char **argv);
int cmd_rtt(int argc, char **argv);
int cmd_throughput(int argc, char **argv);

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
 * Parse an unsigned count for option opt: decimal digits with an optional
 * k, M or G suffix (x1e3, x1e6, x1e9) and '_' or ',' as digit separators
 * ("2M", "2,000,000"). Returns 0, or -EINVAL with a message in err naming the
 * option and the accepted range [min, max].
 */
int kvb_parse_count(const char *opt, const char *arg, uint64_t min,
		    uint64_t max, uint64_t *out, char *err, size_t errlen);

/* A positive finite number of seconds ("2", "0.5"); -EINVAL with a message. */
int kvb_parse_seconds(const char *opt, const char *arg, double *out,
		      char *err, size_t errlen);

/*
 * Handle getopt_long()'s '?' or ':' return for subcommand sub: names the
 * unknown option or the option missing its value. Returns KVB_EXIT_USAGE.
 */
int kvb_getopt_error(const char *sub, int c, int argc, char **argv);

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

/* ---------------------------------------------------------------- JSON */

#define JSON_MAX_DEPTH 16

/*
 * A streaming writer for one pretty-printed JSON object. key is NULL for an
 * element of an array. Non-finite doubles are written as null. Nesting
 * deeper than JSON_MAX_DEPTH is a programming error and aborts.
 */
struct json {
	FILE *f;
	int depth;
	bool first[JSON_MAX_DEPTH];
};

void json_open(struct json *j, FILE *f);
void json_close(struct json *j);
void json_obj_begin(struct json *j, const char *key);
void json_obj_end(struct json *j);
void json_arr_begin(struct json *j, const char *key);
void json_arr_end(struct json *j);
void json_u64(struct json *j, const char *key, uint64_t v);
void json_i64(struct json *j, const char *key, int64_t v);
/* v with the given digits after the point ("%.*f"). */
void json_f64(struct json *j, const char *key, double v, int decimals);
void json_str(struct json *j, const char *key, const char *v);
void json_bool(struct json *j, const char *key, bool v);
void json_null(struct json *j, const char *key);

struct summary;
/* A latency summary as {"samples", "mean_ns", "min_ns", "p50_ns", "p90_ns",
 * "p99_ns", "p999_ns", "max_ns"}. */
void json_summary(struct json *j, const char *key, const struct summary *s);

/* The fields every kvbench report carries: "machine", "date", "command". */
void json_machine(struct json *j, const struct kvb_machine *m);

#endif /* KVBENCH_H */
