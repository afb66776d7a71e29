/* SPDX-License-Identifier: MIT */
/*
 * pool_state.h - what test_user_order_workers and test_kill_during_demotion
 * ask of a daemon once their clients are gone: who is still attached, a
 * pool that has stopped moving (the reclaimer may be finishing a round),
 * and the operator's view of the same numbers through kvctl.
 */
#ifndef KVPOOL_TEST_POOL_STATE_H
#define KVPOOL_TEST_POOL_STATE_H

#include <stdint.h>

#include "harness.h"

/* Whether client id is attached (kvp_clients, so c must be an admin):
 * 1, 0, or -1 with a message. */
int ps_client_attached(struct kvp_client *c, uint32_t id);

/*
 * Wait up to 5 s until c is the only client, no lease is held and the
 * tiers and the demotion counters read the same twice in a row 20 ms
 * apart. *st gets the last stats. Returns 0, or -1 with a message.
 */
int ps_settle(struct kvp_client *c, struct kvp_stats *st);

/*
 * `kvctl stats --json` (when the test was given kvctl) must say what
 * kvp_stats said in *st: no lease, the same frames used per tier.
 * Returns 0, or -1 with a message and kvctl's output.
 */
int ps_check_kvctl(const struct h_daemon *d, const struct kvp_stats *st);

#endif /* KVPOOL_TEST_POOL_STATE_H */
