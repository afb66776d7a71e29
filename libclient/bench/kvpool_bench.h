/* SPDX-License-Identifier: MIT */
/*
 * kvpool_bench.h - what kvbench reads of a client beyond kvpool.h: not a
 * public interface, not installed, and not exported by libkvpool.so (the
 * functions are hidden there, kvpool.map); link kvpool_client_static.
 *
 * kvbench's baselines and counters need three things the calls do not
 * show: the attach socket (its UDS request/response baseline sends
 * proto.h messages on it), and two counters that live in the rings'
 * shared memory (so the daemon sees the same values): doorbells rung (the
 * client woke a sleeping worker) and client wake-ups (a worker woke this
 * client, lane 0's cq_seq).
 */
#ifndef KVPOOL_BENCH_H
#define KVPOOL_BENCH_H

#include <stdint.h>

#include "kvpool.h"

/* The attach socket (a Unix stream socket to kvpoold), or -1. */
int kvpb_socket(const struct kvp_client *c);
/* Doorbells rung so far, summed over every lane. */
uint32_t kvpb_doorbells(const struct kvp_client *c);
/* Times a worker woke this client so far. */
uint32_t kvpb_client_wakeups(const struct kvp_client *c);

#endif /* KVPOOL_BENCH_H */
