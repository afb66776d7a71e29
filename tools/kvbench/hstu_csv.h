/* SPDX-License-Identifier: MIT */
/*
 * hstu_csv.h - read the HSTU ranking example's preprocessed KuaiRand files
 * into a trace (../shared/WORKLOADS.md, "The HSTU example's file layout").
 *
 *   processed_seqs_inference.csv  one row per (user_id, date) with the day's
 *       lists (video_id, time_ms, ..., interval_indptr [0, i1, ..., n]);
 *   processed_batches.csv         one row per interval: user_id, date,
 *       interval_end_ts, interval_indptr (the exclusive end index).
 *
 * Both are pandas CSV with a header; columns are found by name, so extra or
 * reordered columns are fine. List columns are Python-list text, quoted
 * ("[1, 2, 3]") or, with one element, not ([5]).
 *
 * With the batches file the requests are its rows; with only the seqs file
 * they are derived from each row's interval_indptr and time_ms (an interval
 * ends at its last event); with both, every batch row is checked against its
 * day's list lengths.
 */
#ifndef KVBENCH_HSTU_CSV_H
#define KVBENCH_HSTU_CSV_H

#include <stddef.h>

#include "trace.h"

#define HSTU_SEQS_CSV "processed_seqs_inference.csv"
#define HSTU_BATCHES_CSV "processed_batches.csv"

/*
 * Load either file or both (a NULL path is skipped, not both NULL). Returns 0,
 * or -errno with a message in err that names the file, the line and the
 * column that was wrong.
 */
int hstu_load(struct trace *t, const char *seqs_path, const char *batches_path,
	      char *err, size_t errlen);

/* The same from a directory holding one or both files by their usual names. */
int hstu_load_dir(struct trace *t, const char *dir, char *err, size_t errlen);

#endif /* KVBENCH_HSTU_CSV_H */
