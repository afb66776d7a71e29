/* SPDX-License-Identifier: MIT */
/*
 * throughput.h - what the two halves of `kvbench throughput` share:
 * bench_throughput.c (options, the daemon, the parent's timeline and the
 * report) and throughput_client.c (one client process's loop). The parent
 * and the children share struct shared (and the latency arrays) through an
 * anonymous MAP_SHARED mapping made before the fork.
 */
#ifndef KVBENCH_THROUGHPUT_H
#define KVBENCH_THROUGHPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon_proc.h"
#include "kvpool.h"

#define SAMPLES_CAP (1u << 18)  /* latency samples kept per kind per client */

enum lat { LAT_PREPARE, LAT_COMMIT, LAT_STEP, NLAT };

struct opts {
	struct kvb_daemon_opts d;
	uint64_t clients;
	uint64_t users;          /* per client */
	uint64_t batch;
	uint64_t max_pages;
	double seconds;
	double warmup;
	struct kvp_layout layout;
	char layout_spec[256];
	bool json;
};

/* One child's results, in memory shared with the parent. */
struct child_result {
	int status;              /* 0 ok, else -errno */
	char err[512];
	uint64_t steps;          /* counted (in the window) */
	uint64_t ops;
	uint64_t sqes;
	uint64_t warm_steps;     /* before the window */
	uint64_t doorbells;      /* over the window */
	uint64_t client_sleeps;
	uint64_t cpu_ns;         /* user + system, over the window */
	uint64_t vcsw, ivcsw;
	uint32_t nsamples[NLAT];
};

struct shared {
	uint64_t t_window;       /* CLOCK_MONOTONIC ns: the window opens */
	uint64_t t_end;          /* and closes */
	struct child_result res[];
};

/*
 * Client process k: attach to socket, set up its users, write one byte to
 * ready_fd, wait until go_fd reads end-of-file, step until sh->t_end, and
 * leave its results in sh->res[k] and its latency samples at lat_base +
 * (k * NLAT + kind) * SAMPLES_CAP. Returns the process's exit status.
 */
int tput_client_main(const struct opts *o, struct shared *sh, uint64_t *lat_base,
		     uint32_t k, const char *socket, int ready_fd, int go_fd);

#endif /* KVBENCH_THROUGHPUT_H */
