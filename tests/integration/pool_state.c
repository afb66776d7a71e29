/* SPDX-License-Identifier: MIT */
/*
 * pool_state.c - a daemon's state once a test's clients are gone, as
 * kvp_clients, kvp_stats and kvctl show it (pool_state.h).
 */
#define _GNU_SOURCE
#include "pool_state.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_client_attached(struct kvp_client *c, uint32_t id)
{
	struct kvp_client_info rows[16];
	uint64_t cursor = 0, next = 0;
	do {
		int n = kvp_clients(c, cursor, rows, 16, &next);
		if (n < 0) {
			h_fail("clients: %d (%s)", n, kvp_last_error(c));
			return -1;
		}
		for (int i = 0; i < n; i++)
			if (rows[i].client_id == id)
				return 1;
		if (next && next <= cursor) {
			h_fail("clients: the cursor went from %" PRIu64 " to %" PRIu64,
			       cursor, next);
			return -1;
		}
		cursor = next;
	} while (next);
	return 0;
}

int ps_settle(struct kvp_client *c, struct kvp_stats *st)
{
	struct kvp_stats prev;
	memset(&prev, 0xff, sizeof(prev));
	uint64_t deadline = h_now_ms() + 5000;
	for (;;) {
		int rc = kvp_stats(c, 0, st);
		if (rc < 0) {
			h_fail("stats: %d (%s)", rc, kvp_last_error(c));
			return -1;
		}
		if (st->leases == 0 && st->clients == 1 &&
		    memcmp(&prev.tier, &st->tier, sizeof(st->tier)) == 0 &&
		    prev.reclaimed_pages == st->reclaimed_pages &&
		    prev.demoted_pages == st->demoted_pages &&
		    prev.evicted_pages == st->evicted_pages)
			return 0;
		if (h_now_ms() > deadline) {
			h_fail("5 s after every client left: %" PRIu64 " leases, %"
			       PRIu64 " clients (expected 0 and 1), or the tiers"
			       " and demotion counters still changing", st->leases,
			       st->clients);
			return -1;
		}
		prev = *st;
		h_sleep_ms(20);
	}
}

/* The first number after "key": at or after from in json, or -1. */
static long long json_num(const char *json, const char *from, const char *key)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *p = strstr(from ? from : json, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

int ps_check_kvctl(const struct h_daemon *d, const struct kvp_stats *st)
{
	if (!h_kvctl_path)
		return 0;
	char cmd[512], json[8192];
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' stats --json", h_kvctl_path,
		 d->sock);
	FILE *f = popen(cmd, "r");
	if (!f) {
		h_fail("popen %s: %s", cmd, strerror(errno));
		return -1;
	}
	size_t n = fread(json, 1, sizeof(json) - 1, f);
	json[n] = 0;
	int status = pclose(f);
	if (status != 0) {
		h_fail("%s exited with status %d:\n%s", cmd, status, json);
		return -1;
	}
	const char *dev = strstr(json, "\"device\""), *host = strstr(json, "\"host\"");
	long long leases = json_num(json, NULL, "leases");
	long long dused = dev ? json_num(json, dev, "frames_used") : -1;
	long long hused = host ? json_num(json, host, "frames_used") : -1;
	if (leases != 0 || dused != (long long)st->tier[KVP_TIER_DEVICE].frames_used ||
	    hused != (long long)st->tier[KVP_TIER_HOST].frames_used) {
		h_fail("kvctl stats --json: leases %lld, device frames_used %lld,"
		       " host %lld; kvp_stats: 0 leases, %" PRIu64 " and %" PRIu64
		       "\n%s", leases, dused, hused,
		       st->tier[KVP_TIER_DEVICE].frames_used,
		       st->tier[KVP_TIER_HOST].frames_used, json);
		return -1;
	}
	return 0;
}
