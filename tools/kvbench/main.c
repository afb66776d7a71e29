/* SPDX-License-Identifier: MIT */
/*
 * main.c - kvbench: the subcommand table and what every subcommand shares.
 *
 * `kvbench <subcommand> [options]` runs one benchmark; each subcommand parses
 * its own options and prints a table, or with --json exactly one JSON object
 * on stdout. Adding a benchmark is one row in `cmds` and one cmd_<name>().
 *
 * This file also holds the helpers the subcommands share: the option loop and
 * count parsing with messages that name the option, CPU pinning, the machine
 * description and the parts every JSON report has (the writer itself is
 * tools/common/json.c). It does not measure anything itself.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

struct kvb_cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);
};

#if !KVBENCH_HAVE_HIREDIS
/* Without hiredis (libhiredis-dev) there is no client to the store. */
int cmd_remote(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "kvbench remote: this kvbench was built without hiredis; "
		"install libhiredis-dev (scripts/deps.sh) and rebuild\n");
	return KVB_EXIT_FAIL;
}
#endif

static const struct kvb_cmd cmds[] = {
	{ "engine", "in-process engine: metadata ops/s and latency, append vs memcpy",
	  cmd_engine },
	{ "rtt", "round trip of one request: shm ring vs Unix socket vs in-process",
	  cmd_rtt },
	{ "throughput", "ring operations/s of N client processes against one kvpoold",
	  cmd_throughput },
	{ "gpu", "GPU data path: append kernel, offload/onload, append latency vs ceilings",
	  cmd_gpu },
	{ "peer", "a history moved between two GPUs' pools vs the peer-copy ceiling",
	  cmd_peer },
	{ "trace", "generate (or read) a KuaiRand-1K-like recommender trace", cmd_trace },
	{ "replay", "recommender pipelines on a trace: kvpool vs in-process, uds, Redis",
	  cmd_replay },
	{ "prefix", "prefix cache and chunks: hit rate vs best, dedupe, compose latency",
	  cmd_prefix },
	{ "disk", "disk tier: demote and read-back GB/s vs the raw io_uring ceiling, zstd",
	  cmd_disk },
	{ "remote", "remote tier: a prompt's KV from a Redis Cluster vs raw pipelined GET/SET",
	  cmd_remote },
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static char command_line[4096];

/* ---------------------------------------------------------------- usage */

static void print_help(FILE *f)
{
	size_t i;

	fprintf(f,
		"Usage: kvbench <subcommand> [options]\n"
		"       kvbench help [<subcommand>]\n"
		"\n"
		"Benchmarks of kvpool. Each subcommand prints a table, or with --json\n"
		"one JSON object on stdout. Run 'kvbench <subcommand> --help' for its options.\n"
		"\n"
		"Subcommands:\n");
	for (i = 0; i < NCMDS; i++)
		fprintf(f, "  %-12s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f,
		"\n"
		"Options:\n"
		"  -h, --help     this help\n"
		"  -V, --version  print the version\n"
		"\n"
		"Exit status: 0 success, 1 a benchmark failed, 2 bad command line.\n");
}

static void list_cmds(FILE *f)
{
	size_t i;

	for (i = 0; i < NCMDS; i++)
		fprintf(f, "%s%s", i ? ", " : "", cmds[i].name);
}

static const struct kvb_cmd *find_cmd(const char *name)
{
	size_t i;

	for (i = 0; i < NCMDS; i++)
		if (strcmp(cmds[i].name, name) == 0)
			return &cmds[i];
	return NULL;
}

static int unknown_cmd(const char *name)
{
	fprintf(stderr, "kvbench: unknown subcommand '%s'; valid subcommands: ", name);
	list_cmds(stderr);
	fprintf(stderr, "\nTry 'kvbench --help'.\n");
	return KVB_EXIT_USAGE;
}

/* Quote one word for a shell when it holds anything but safe characters. */
static void append_word(char *buf, size_t len, const char *w)
{
	size_t n = strlen(buf);
	bool plain = *w != '\0';
	const char *p;

	for (p = w; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("-_=.,/:+@%", *p))
			plain = false;
	if (n && n + 1 < len)
		buf[n++] = ' ';
	if (plain) {
		snprintf(buf + n, len - n, "%s", w);
		return;
	}
	if (n + 1 < len)
		buf[n++] = '\'';
	for (p = w; *p && n + 5 < len; p++) {
		if (*p == '\'') {
			memcpy(buf + n, "'\\''", 4);
			n += 4;
		} else {
			buf[n++] = *p;
		}
	}
	if (n + 1 < len)
		buf[n++] = '\'';
	buf[n < len ? n : len - 1] = '\0';
}

int main(int argc, char **argv)
{
	const struct kvb_cmd *cmd;
	int i;

	command_line[0] = '\0';
	append_word(command_line, sizeof(command_line), "kvbench");
	for (i = 1; i < argc; i++)
		append_word(command_line, sizeof(command_line), argv[i]);

	if (argc < 2) {
		fprintf(stderr, "kvbench: no subcommand given; valid subcommands: ");
		list_cmds(stderr);
		fprintf(stderr, "\nTry 'kvbench --help'.\n");
		return KVB_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		print_help(stdout);
		return KVB_EXIT_OK;
	}
	if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
		printf("kvbench %d.%d\n", KVP_VERSION_MAJOR, KVP_VERSION_MINOR);
		return KVB_EXIT_OK;
	}
	if (!strcmp(argv[1], "help")) {
		char *sub_argv[3];

		if (argc == 2) {
			print_help(stdout);
			return KVB_EXIT_OK;
		}
		if (argc > 3) {
			fprintf(stderr, "kvbench help: takes at most one subcommand\n");
			return KVB_EXIT_USAGE;
		}
		cmd = find_cmd(argv[2]);
		if (!cmd)
			return unknown_cmd(argv[2]);
		sub_argv[0] = argv[2];
		sub_argv[1] = (char *)"--help";
		sub_argv[2] = NULL;
		return cmd->run(2, sub_argv);
	}
	if (argv[1][0] == '-') {
		fprintf(stderr, "kvbench: unknown option '%s'; options come after the subcommand\n"
			"Try 'kvbench --help'.\n", argv[1]);
		return KVB_EXIT_USAGE;
	}
	cmd = find_cmd(argv[1]);
	if (!cmd)
		return unknown_cmd(argv[1]);
	return cmd->run(argc - 1, argv + 1);
}

/* ---------------------------------------------------------------- options */

const char *kvb_command_line(void)
{
	return command_line;
}

int kvb_usage_error(const char *sub, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvbench %s: ", sub);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'kvbench %s --help'.\n", sub);
	return KVB_EXIT_USAGE;
}

/* getopt_long()'s '?' or ':': name the unknown option or the one missing its value. */
static int getopt_error(const char *sub, int c, int argc, char **argv)
{
	/* getopt_long has advanced optind past the offending word. */
	const char *word = optind > 0 && optind <= argc ? argv[optind - 1] : "?";

	if (c == ':')
		return kvb_usage_error(sub, "option '%s' needs a value", word);
	if (optopt && word[0] == '-' && word[1] == '-' && strchr(word, '='))
		return kvb_usage_error(sub, "option '%.*s' takes no value",
				       (int)(strchr(word, '=') - word), word);
	if (optopt && !(word[0] == '-' && word[1] == '-'))
		return kvb_usage_error(sub, "unknown option '-%c'", optopt);
	return kvb_usage_error(sub, "unknown option '%s'", word);
}

/* kvb_opt_count()'s count: 0, or -EINVAL with the message in err. */
static int parse_count(const char *opt, const char *arg, uint64_t min,
		       uint64_t max, uint64_t *out, char *err, size_t errlen)
{
	uint64_t v = 0, mult = 1;
	bool digits = false;
	const char *p;

	for (p = arg; *p; p++) {
		if (isdigit((unsigned char)*p)) {
			unsigned d = (unsigned)(*p - '0');

			if (v > (UINT64_MAX - d) / 10)
				goto range;
			v = v * 10 + d;
			digits = true;
		} else if ((*p == '_' || *p == ',') && digits && isdigit((unsigned char)p[1])) {
			continue;
		} else {
			break;
		}
	}
	if (digits && *p && !p[1]) {
		switch (*p) {
		case 'k': case 'K': mult = 1000; p++; break;
		case 'm': case 'M': mult = 1000000; p++; break;
		case 'g': case 'G': mult = 1000000000; p++; break;
		}
	}
	if (!digits || *p) {
		snprintf(err, errlen, "%s: '%s' is not a count (digits with an optional k, M or G suffix)",
			 opt, arg);
		return -EINVAL;
	}
	if (v > UINT64_MAX / mult)
		goto range;
	v *= mult;
	if (v < min || v > max)
		goto range;
	*out = v;
	return 0;
range:
	snprintf(err, errlen, "%s: '%s' is out of range [%llu, %llu]", opt, arg,
		 (unsigned long long)min, (unsigned long long)max);
	return -EINVAL;
}

int kvb_parse_opts(const char *sub, int argc, char **argv,
		   const struct option *long_opts, void (*usage)(FILE *f),
		   kvb_opt_fn opt, void *ctx, bool *json)
{
	int c, rc;

	optind = 0; /* glibc: reinitialise for this argv */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:h", long_opts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return KVB_EXIT_OK;
		}
		if (c == '?' || c == ':')
			return getopt_error(sub, c, argc, argv);
		if (c == KVB_OPT_JSON) {
			*json = true;
			continue;
		}
		rc = opt(ctx, c, optarg);
		if (rc >= 0)
			return rc;
	}
	if (optind < argc)
		return kvb_usage_error(sub, "unexpected argument '%s'", argv[optind]);
	return -1;
}

int kvb_opt_count(const char *sub, const char *opt, const char *arg,
		  uint64_t min, uint64_t max, uint64_t *out)
{
	char err[KVP_ERRLEN];

	if (parse_count(opt, arg, min, max, out, err, sizeof(err)))
		return kvb_usage_error(sub, "%s", err);
	return -1;
}

int kvb_opt_bytes(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (end == s || errno)
		return -1;
	switch (*end) {
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	}
	if (*end || !v || v > (UINT64_MAX >> shift))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

int kvb_opt_seconds(const char *sub, const char *opt, const char *arg,
		    double *out)
{
	char err[KVP_ERRLEN], *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (end == arg || *end || errno || !isfinite(v) || v <= 0 || v > 86400) {
		/* Through err, so a long value is cut where it always was. */
		snprintf(err, sizeof(err), "%s: '%s' is not a number of seconds in (0, 86400]",
			 opt, arg);
		return kvb_usage_error(sub, "%s", err);
	}
	*out = v;
	return -1;
}

int kvb_opt_cpu(const char *sub, const char *arg, int *cpu)
{
	char err[KVP_ERRLEN];
	uint64_t v;

	if (!strcmp(arg, "none")) {
		*cpu = KVB_CPU_NONE;
		return -1;
	}
	if (parse_count("--cpu", arg, 0, 65535, &v, err, sizeof(err)))
		return kvb_usage_error(sub, "--cpu: '%s' is not a CPU number or 'none'", arg);
	*cpu = (int)v;
	return -1;
}

int kvb_pin_cpu(int cpu, char *err, size_t errlen)
{
	cpu_set_t allowed, one;

	if (cpu == KVB_CPU_NONE)
		return -1;
	if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0) {
		int rc = -errno;

		snprintf(err, errlen, "sched_getaffinity: %s", strerror(errno));
		return rc;
	}
	if (cpu == KVB_CPU_CURRENT) {
		cpu = sched_getcpu();
		if (cpu < 0) {
			int rc = -errno;

			snprintf(err, errlen, "sched_getcpu: %s", strerror(errno));
			return rc;
		}
	}
	if (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
		int i, n = 0;
		size_t len;

		snprintf(err, errlen, "--cpu: CPU %d is not one this process may run on (allowed:", cpu);
		for (i = 0; i < CPU_SETSIZE && n < 16; i++) {
			if (!CPU_ISSET(i, &allowed))
				continue;
			len = strlen(err);
			snprintf(err + len, errlen - len, " %d", i);
			n++;
		}
		len = strlen(err);
		snprintf(err + len, errlen - len, "%s)", n == 16 ? " ..." : "");
		return -EINVAL;
	}
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one) < 0) {
		int rc = -errno;

		snprintf(err, errlen, "sched_setaffinity(CPU %d): %s", cpu, strerror(errno));
		return rc;
	}
	return cpu;
}

/* ---------------------------------------------------------------- machine */

static void read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	buf[0] = '\0';
	if (!f)
		return;
	if (fgets(buf, (int)len, f))
		buf[strcspn(buf, "\n")] = '\0';
	fclose(f);
}

void kvb_machine_info(struct kvb_machine *m, int pinned_cpu)
{
	struct utsname u;
	char line[512];
	struct tm tm;
	time_t t;
	FILE *f;

	memset(m, 0, sizeof(*m));
	snprintf(m->cpu_model, sizeof(m->cpu_model), "unknown");
	f = fopen("/proc/cpuinfo", "r");
	if (f) {
		while (fgets(line, sizeof(line), f)) {
			char *colon = strchr(line, ':');

			if (strncmp(line, "model name", 10) || !colon)
				continue;
			colon++;
			while (*colon == ' ' || *colon == '\t')
				colon++;
			colon[strcspn(colon, "\n")] = '\0';
			snprintf(m->cpu_model, sizeof(m->cpu_model), "%s", colon);
			break;
		}
		fclose(f);
	}
	m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
	m->cpu = pinned_cpu;
	if (uname(&u) == 0)
		snprintf(m->kernel, sizeof(m->kernel), "%s", u.release);
	read_line("/sys/devices/system/clocksource/clocksource0/current_clocksource",
		  m->clocksource, sizeof(m->clocksource));
	t = time(NULL);
	gmtime_r(&t, &tm);
	strftime(m->date, sizeof(m->date), "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---------------------------------------------------------------- report */

int kvb_begin_run(const char *sub, int cpu, struct kvb_machine *m,
		  struct summary *tov)
{
	char err[KVP_ERRLEN] = "";
	int pinned = kvb_pin_cpu(cpu, err, sizeof(err));

	if (pinned < -1) {
		if (cpu >= 0)
			return kvb_usage_error(sub, "%s", err);
		fprintf(stderr, "kvbench %s: %s\n", sub, err);
		return KVB_EXIT_FAIL;
	}
	kvb_machine_info(m, pinned);
	if (timer_overhead(1000000, tov)) {
		fprintf(stderr, "kvbench %s: no memory for the timer samples\n", sub);
		return KVB_EXIT_FAIL;
	}
	return -1;
}

void kvb_json_begin(struct json *j, const char *benchmark)
{
	json_begin(j, stdout);
	json_str(j, "benchmark", benchmark);
}

void kvb_json_end(struct json *j, const struct kvb_machine *m)
{
	json_obj_begin(j, "machine");
	json_str(j, "cpu_model", m->cpu_model);
	json_i64(j, "nproc", m->nproc);
	json_i64(j, "pinned_cpu", m->cpu);
	json_str(j, "kernel", m->kernel);
	json_str(j, "clocksource", m->clocksource);
	json_obj_end(j);
	json_str(j, "date", m->date);
	json_str(j, "command", kvb_command_line());
	json_end(j);
	fflush(j->f);
}

void json_summary(struct json *j, const char *key, const struct summary *s)
{
	json_obj_begin(j, key);
	json_u64(j, "samples", s->n);
	json_f64(j, "mean_ns", s->mean, 1);
	json_u64(j, "min_ns", s->min);
	json_u64(j, "p50_ns", s->p50);
	json_u64(j, "p90_ns", s->p90);
	json_u64(j, "p99_ns", s->p99);
	json_u64(j, "p999_ns", s->p999);
	json_u64(j, "max_ns", s->max);
	json_obj_end(j);
}
