/* SPDX-License-Identifier: MIT */
/*
 * bench_disk.h - kvbench disk's parts: the end-to-end prepare path
 * (bench_disk_prepare.c) beside the tier measurements (bench_disk.c).
 */
#ifndef KVBENCH_BENCH_DISK_H
#define KVBENCH_BENCH_DISK_H

#include <stddef.h>
#include <stdint.h>

struct disk_prepare_opts {
	const char *dir;      /* the disk tier's directory (kvpool.disk there) */
	const char *layout;
	const char *kvpoold;  /* NULL: next to kvbench */
	uint64_t bytes;       /* history size */
	uint64_t rounds;
};

struct disk_prepare_result {
	uint64_t bytes, tokens;
	double seconds;       /* the best reader prepare from disk */
};

/*
 * Start a kvpoold with a disk tier in o->dir, write one history, push it to
 * disk and time reader prepares bringing it back (best of o->rounds), every
 * byte compared. Returns 0 or -errno with a message in err.
 */
int disk_measure_prepare(const struct disk_prepare_opts *o,
			 struct disk_prepare_result *r, char *err, size_t len);

#endif /* KVBENCH_BENCH_DISK_H */
