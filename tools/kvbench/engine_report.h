/* SPDX-License-Identifier: MIT */
/*
 * engine_report.h - what the two halves of `kvbench engine` share:
 * bench_engine.c runs the measurements, engine_report.c parses the options
 * and prints the results (a table, or one JSON object).
 */
#ifndef KVBENCH_ENGINE_REPORT_H
#define KVBENCH_ENGINE_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

#define DEFAULT_META_LAYOUT \
	"layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define DEFAULT_APPEND_LAYOUT \
	"layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32"

struct opts {
	uint64_t users;
	uint64_t ops;       /* per pass and scenario; 0 when --seconds is used */
	double seconds;     /* untimed pass length; 0 when --ops is used */
	uint64_t max_pages;
	struct kvp_layout meta;
	struct kvp_layout append;
	uint64_t append_mib;
	uint64_t reps;
	uint64_t seed;
	bool json;
	bool do_meta;
	bool do_append;
	int cpu;
};

/* One scenario of the metadata path. */
struct scenario {
	const char *name;
	uint32_t device_frames;
	uint32_t host_frames;
	uint64_t warm_steps;
	uint64_t steps;          /* untimed pass */
	double seconds;          /* untimed pass */
	uint32_t slices;         /* the untimed pass's slices */
	double rate;             /* ops/s: the median slice's */
	double rate_min, rate_max;
	uint64_t timed_steps;
	double timed_seconds;
	struct summary prepare, commit, release, all;
	struct kvp_stats delta;  /* counters over both measured passes */
	bool check_ok;
	char check_msg[KVP_ERRLEN];
};

/* The copies the append part times, in the order they first run. */
enum copy_kind {
	COPY_APPEND,     /* kvp_append_cpu, pages shuffled: the figure */
	COPY_APPEND_SEQ, /* kvp_append_cpu, pages in frame order */
	COPY_MEMCPY,     /* one memcpy of all the bytes: the reference */
	COPY_ROWS,       /* memcpy one row at a time, in order: no scatter */
	NCOPY,
};

struct append_result {
	uint64_t pages;
	uint64_t tokens;
	uint64_t bytes;
	double gbps[NCOPY];      /* medians */
	double *gbps_all[NCOPY]; /* every repetition, in run order */
	bool verified;
};

static inline double ops_per_s(uint64_t ops, double s)
{
	return s > 0 ? (double)ops / s : 0;
}

/* Parse argv into *o; returns -1 to go on, else the exit status (after
 * --help, or a usage error already reported). */
int engine_parse_opts(int argc, char **argv, struct opts *o);

/* The report: sc[0] no eviction, sc[1] eviction; tov the timer's overhead. */
void engine_print_json(const struct opts *o, const struct kvb_machine *m,
		       const struct summary *tov, const struct scenario *sc,
		       const struct append_result *ar);
void engine_print_table(const struct opts *o, const struct kvb_machine *m,
			const struct summary *tov, const struct scenario *sc,
			const struct append_result *ar);

#endif /* KVBENCH_ENGINE_REPORT_H */
