/* SPDX-License-Identifier: MIT */
/*
 * cpu_busy.h - is every core taken? The one test the spinning waits of the
 * daemon's workers and the library's completion waits ask before they spin.
 *
 * A spin is only cheaper than a futex sleep while the peer it waits for is
 * running on another core. When runnable threads outnumber the cores this
 * process may use, the peer is as likely preempted as running, and every
 * spinning thread takes a core the peer needs: 14 clients and 8 workers on
 * 16 cores fell from 15M to 3.7M ops/s that way (bench/results/
 * scaling-2026-11-27.md). Yielding inside every spin instead cost 30% where
 * cores were free, so the spin must depend on the load.
 *
 * The runnable count is /proc/loadavg's fourth field (nr_running/nr_threads,
 * the whole machine's, this thread included), read at most once per
 * CPU_BUSY_PERIOD_NS per process and shared by its threads, against the
 * machine's online cores, read once.
 */
#ifndef KVPOOL_LIB_CPU_BUSY_H
#define KVPOOL_LIB_CPU_BUSY_H

#include <stdbool.h>
#include <stdint.h>

#define CPU_BUSY_PERIOD_NS 2000000ull /* 2 ms: a /proc read costs ~3 us */

/* Whether runnable threads outnumbered usable cores at the last look (at
 * most CPU_BUSY_PERIOD_NS before now_ns, a CLOCK_MONOTONIC reading the
 * caller already has). KVPOOL_SPIN=always disables the test (false). */
bool cpu_busy(uint64_t now_ns);

/* Parse /proc/loadavg's text: the runnable count, or 0 if unreadable. */
uint32_t cpu_busy_parse_running(const char *loadavg);

#endif /* KVPOOL_LIB_CPU_BUSY_H */
