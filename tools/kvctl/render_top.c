/* SPDX-License-Identifier: MIT */
/*
 * render_top.c - one screen of `kvctl top` from two samples (kvctl.h).
 *
 * Like redis-cli --stat and kvcached's kvtop: what is changing now. Rates
 * are the counters' differences over the refresh interval; latency
 * percentiles come from the difference of the daemon's histograms over the
 * same interval, so a slow minute an hour ago does not stay on screen. A
 * percentile is shown as the upper bound of its bucket ("<=25us"): that is
 * all a histogram knows.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"

#define TOP_USERS 10
#define TOP_TENANTS 5

/* A counter's rate per second between two samples. */
static double rate(uint64_t now, uint64_t was, double dt)
{
	return dt > 0 && now >= was ? (double)(now - was) / dt : 0;
}

static void fmt_ns(char *buf, size_t len, uint64_t ns)
{
	if (ns == UINT64_MAX)
		snprintf(buf, len, ">1s");
	else if (ns >= 1000000000ull)
		snprintf(buf, len, "<=%" PRIu64 "s", ns / UINT64_C(1000000000));
	else if (ns >= 1000000)
		snprintf(buf, len, "<=%gms", (double)ns / 1e6);
	else
		snprintf(buf, len, "<=%gus", (double)ns / 1e3);
}

/* The bucket bound under which a fraction q of the interval's n fell. */
static uint64_t quantile(const uint64_t *d, const uint64_t *bound, uint64_t n, double q)
{
	uint64_t want = (uint64_t)((double)n * q + 0.999999), cum = 0;

	for (uint32_t b = 0; b < KVP_LAT_BUCKETS; b++) {
		cum += d[b];
		if (cum >= want)
			return bound[b];
	}
	return UINT64_MAX;
}

static void latency_lines(FILE *f, const struct top_sample *cur,
			  const struct top_sample *prev)
{
	static const char *const names[KVP_LAT_OPS] = {
		"prepare", "commit", "offload", "onload",
	};

	if (!cur->have_lat) {
		fprintf(f, "latency: admins only (kvp_latency)\n");
		return;
	}
	fprintf(f, "%-8s %10s %10s %10s %10s\n", "LATENCY", "OPS/S", "P50", "P99", "P99.9");
	for (uint32_t k = 0; k < KVP_LAT_OPS; k++) {
		uint64_t d[KVP_LAT_BUCKETS], n = 0;
		double dt = (double)(cur->mono_ns - prev->mono_ns) / 1e9;
		char p50[32] = "-", p99[32] = "-", p999[32] = "-";

		for (uint32_t b = 0; b < KVP_LAT_BUCKETS; b++) {
			uint64_t was = prev->mono_ns && prev->have_lat ?
				       prev->lat.op[k].buckets[b] : 0;

			d[b] = cur->lat.op[k].buckets[b] - was;
			n += d[b];
		}
		if (n) {
			fmt_ns(p50, sizeof(p50), quantile(d, cur->lat.bucket_ns, n, 0.5));
			fmt_ns(p99, sizeof(p99), quantile(d, cur->lat.bucket_ns, n, 0.99));
			fmt_ns(p999, sizeof(p999), quantile(d, cur->lat.bucket_ns, n, 0.999));
		}
		fprintf(f, "%-8s %10.0f %10s %10s %10s\n", names[k],
			prev->mono_ns ? rate(n, 0, dt) : 0.0, p50, p99, p999);
	}
}

/* Bytes over the copies' own time (ns_d2h, ns_h2d) in the interval: the
 * link's speed while it copied, "-" when it did not. */
static void copy_bandwidth(char *buf, size_t len, uint64_t bytes, uint64_t ns)
{
	char b[24];

	if (!bytes || !ns) {
		snprintf(buf, len, "-");
		return;
	}
	fmt_bytes(b, sizeof(b), (uint64_t)((double)bytes / ((double)ns / 1e9)));
	snprintf(buf, len, "%s/s", b);
}

static void rate_lines(FILE *f, const struct kvp_stats *c, const struct kvp_stats *p,
		       double dt)
{
	char d2h[32], h2d[32];

	fmt_bytes(d2h, sizeof(d2h), (uint64_t)rate(c->bytes_d2h, p->bytes_d2h, dt));
	fmt_bytes(h2d, sizeof(h2d), (uint64_t)rate(c->bytes_h2d, p->bytes_h2d, dt));
	fprintf(f, "per second: prepares %.0f  commits %.0f  releases %.0f  hit_tokens %.0f"
		"  committed_tokens %.0f\n", rate(c->prepares, p->prepares, dt),
		rate(c->commits, p->commits, dt), rate(c->releases, p->releases, dt),
		rate(c->hit_tokens, p->hit_tokens, dt),
		rate(c->committed_tokens, p->committed_tokens, dt));
	fprintf(f, "pages/s: onloaded %.0f  offloaded %.0f  demoted %.0f  evicted %.0f"
		"  reclaimed %.0f  reclaim_stalls/s %.0f\n",
		rate(c->onloaded_pages, p->onloaded_pages, dt),
		rate(c->offloaded_pages, p->offloaded_pages, dt),
		rate(c->demoted_pages, p->demoted_pages, dt),
		rate(c->evicted_pages, p->evicted_pages, dt),
		rate(c->reclaimed_pages, p->reclaimed_pages, dt),
		rate(c->reclaim_stalls, p->reclaim_stalls, dt));
	fprintf(f, "copies/s: device->host %s  host->device %s  prefix lookups %.0f"
		"  chunk lookups %.0f\n", d2h, h2d,
		rate(c->prefix_lookups, p->prefix_lookups, dt),
		rate(c->chunk_lookups, p->chunk_lookups, dt));
	copy_bandwidth(d2h, sizeof(d2h), c->bytes_d2h - p->bytes_d2h,
		       c->ns_d2h - p->ns_d2h);
	copy_bandwidth(h2d, sizeof(h2d), c->bytes_h2d - p->bytes_h2d,
		       c->ns_h2d - p->ns_h2d);
	fprintf(f, "while copying: device->host %s  host->device %s\n", d2h, h2d);
}

static int by_pages(const void *a, const void *b)
{
	const struct kvp_user_info *x = a, *y = b;
	uint64_t px = (uint64_t)x->pages_device + x->pages_host;
	uint64_t py = (uint64_t)y->pages_device + y->pages_host;

	if (px != py)
		return px > py ? -1 : 1;
	return x->user < y->user ? -1 : x->user > y->user;
}

struct tenant_sum {
	uint32_t tenant;
	uint64_t users, dev, host;
};

static int tenant_by_pages(const void *a, const void *b)
{
	const struct tenant_sum *x = a, *y = b;

	if (x->dev + x->host != y->dev + y->host)
		return x->dev + x->host > y->dev + y->host ? -1 : 1;
	return x->tenant < y->tenant ? -1 : x->tenant > y->tenant;
}

static void top_lists(FILE *f, struct top_sample *cur)
{
	struct tenant_sum t[64] = { { 0 } };
	size_t nt = 0;

	qsort(cur->users, cur->nusers, sizeof(*cur->users), by_pages);
	fprintf(f, "%-20s %6s %9s %10s %10s %6s\n", "TOP USERS", "TENANT", "PAGES_DEV",
		"PAGES_HOST", "LEN", "LEASES");
	for (size_t i = 0; i < cur->nusers && i < TOP_USERS; i++) {
		const struct kvp_user_info *u = &cur->users[i];

		fprintf(f, "%-20" PRIu64 " %6" PRIu32 " %9" PRIu32 " %10" PRIu32 " %10"
			PRIu64 " %6" PRIu32 "\n", u->user, u->tenant, u->pages_device,
			u->pages_host, u->len, u->leases);
	}
	if (cur->users_truncated)
		fprintf(f, "(the first %zu users by id only)\n", cur->nusers);
	for (size_t i = 0; i < cur->nusers; i++) {
		const struct kvp_user_info *u = &cur->users[i];
		size_t k = 0;

		while (k < nt && t[k].tenant != u->tenant)
			k++;
		if (k == nt) {
			if (nt == sizeof(t) / sizeof(t[0]))
				continue; /* more tenants than kvpoold allows */
			t[nt++].tenant = u->tenant;
		}
		t[k].users++;
		t[k].dev += u->pages_device;
		t[k].host += u->pages_host;
	}
	qsort(t, nt, sizeof(t[0]), tenant_by_pages);
	fprintf(f, "%-20s %6s %9s %10s\n", "TOP TENANTS", "USERS", "PAGES_DEV", "PAGES_HOST");
	for (size_t i = 0; i < nt && i < TOP_TENANTS; i++)
		fprintf(f, "tenant %-13" PRIu32 " %6" PRIu64 " %9" PRIu64 " %10" PRIu64 "\n",
			t[i].tenant, t[i].users, t[i].dev, t[i].host);
}

void render_top(FILE *f, const char *socket, struct top_sample *cur,
		const struct top_sample *prev)
{
	const struct kvp_stats *c = &cur->st;
	double dt = prev->mono_ns ? (double)(cur->mono_ns - prev->mono_ns) / 1e9 : 0;
	char used[32], size[32];

	fprintf(f, "kvpool top: %s  clients %" PRIu64 "  tenants %" PRIu64 "  users %"
		PRIu64 "  leases %" PRIu64 "  (%s)\n", socket, c->clients, c->tenants,
		c->users, c->leases, dt > 0 ? "rates over the last interval" :
		"first sample: rates next");
	for (uint32_t t = 0; t < KVP_TIERS; t++) {
		const struct kvp_tier_stats *ts = &c->tier[t];

		fmt_percent(used, sizeof(used), ts->frames_used, ts->frames_total);
		fmt_bytes(size, sizeof(size), ts->bytes_total);
		fprintf(f, "%-7s %9" PRIu64 " / %-9" PRIu64 " frames used %7s of %s\n",
			kvp_tier_name(t), ts->frames_used, ts->frames_total, used, size);
	}
	if (cur->npools) {
		fputc('\n', f);
		render_pools_table(f, cur->pools, cur->npools);
	}
	fputc('\n', f);
	rate_lines(f, c, &prev->st, dt);
	fputc('\n', f);
	latency_lines(f, cur, prev);
	fputc('\n', f);
	top_lists(f, cur);
}
