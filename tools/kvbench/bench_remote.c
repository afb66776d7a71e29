/* SPDX-License-Identifier: MIT */
/*
 * bench_remote.c - kvbench remote: how long one node takes to get a
 * prompt's KV from the remote tier (issue 17), against raw pipelined
 * GET/SET of the same value sizes through hiredis, in one run.
 *
 *   store   a Redis Cluster: --remote URL, else three redis-server
 *           processes this run starts on loopback (tools/common/redis_local);
 *   A       a kvpoold with --remote: computes --tokens tokens of each
 *           round's prompt (seq_alloc, append, commit, free), and the next
 *           prompt evicts the last one's pages, written behind to the store;
 *   B       another kvpoold with --remote: kvp_prefix_lookup of the prompt
 *           misses locally, one batched round fetches it, checks and
 *           onloads it into B's device tier (the client's mapped pages); the
 *           lookup's wall time is the figure, then every byte is compared
 *           with what A computed;
 *   raw     the same number of values of the same size (header + page) SET
 *           in one pipelined batch and GET in another, through the same
 *           slot-routing hiredis client the tier uses, with no codec, no
 *           checksum and no copy into a pool: the store's ceiling here.
 *
 * The best of --rounds rounds of each is reported, B's lookup split by B's
 * own /metrics (kvpool_remote_{fetch,fetch_wait,onload}_seconds_total):
 * the remote thread's rounds (GETs, checks, decoding), the fetch waiting
 * for the held lookup's retry, the engine's copy into the pool; the rest
 * is the request's way in and out and the lookup's own work.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"
#include "redis_cluster.h"
#include "redis_local.h"
#include "stats.h"

#define SUB "remote"
#define DEFAULT_LAYOUT "layers=32,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=16"
#define HDR_BYTES 128 /* the remote value's record header (remote_value.h) */

struct opts {
	const char *url, *layout, *kvpoold;
	uint64_t tokens, rounds;
	bool json;
};

struct result {
	struct kvp_layout l;
	uint64_t pages, bytes;
	double fetch_s, raw_get_s, raw_set_s; /* best of the rounds */
	double fetch_s_all[16];
	/* The best round's lookup split by B's /metrics (seconds; -1: not read). */
	double split_fetch_s, split_wait_s, split_onload_s;
	uint64_t cached_tokens;
	char url[256];
	bool own_cluster;
};

/* Token pos of round r: a cheap deterministic pattern, never all zero. */
static void token_bytes(const struct kvp_layout *l, uint64_t r, uint64_t pos, uint8_t *out)
{
	uint64_t x = (r + 1) * 0x9e3779b97f4a7c15ull ^ (pos + 1) * 0xbf58476d1ce4e5b9ull;

	for (uint64_t i = 0; i < l->token_bytes; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(out + i, &x, l->token_bytes - i < 8 ? l->token_bytes - i : 8);
	}
}

static uint32_t *prompt(uint64_t r, uint32_t n)
{
	uint32_t *t = malloc((size_t)n * sizeof(*t));

	for (uint32_t i = 0; t && i < n; i++)
		t[i] = (uint32_t)(r * 1000003u + i + 7);
	return t;
}

/* A computes prompt r (n tokens) and frees it: its pages stay cached until
 * the next prompt evicts them. */
static int compute(struct kvp_client *c, uint64_t r, uint32_t n, char *err, size_t len)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	uint32_t *t = prompt(r, n);
	uint8_t *kv = malloc(64 * l->token_bytes);
	struct kvp_lease ls = { 0 };
	int rc = !t || !kv ? -ENOMEM : kvp_seq_alloc(c, r + 1, t, n, &ls);

	for (uint32_t done = 0; !rc && done < ls.n_new;) {
		uint32_t k = ls.n_new - done < 64 ? ls.n_new - done : 64;

		for (uint32_t i = 0; i < k; i++)
			token_bytes(l, r, ls.len + done + i, kv + (size_t)i * l->token_bytes);
		rc = kvp_append(c, &ls, done, k, kv);
		done += k;
	}
	if (!rc)
		rc = kvp_commit(c, ls.id, ls.n_new);
	if (!rc)
		rc = kvp_release(c, ls.id);
	if (!rc)
		rc = kvp_seq_free(c, r + 1);
	if (rc)
		snprintf(err, len, "A: computing prompt %" PRIu64 ": %s", r, kvp_last_error(c));
	free(t);
	free(kv);
	return rc;
}

/* Keys in the store now (DBSIZE summed over the nodes), or -1. */
static int64_t store_keys(const struct result *r)
{
	struct redis_cluster *rc;
	struct errbuf e;
	int64_t n;

	if (redis_cluster_open(&rc, r->url, 5000, &e))
		return -1;
	n = redis_cluster_dbsize(rc);
	redis_cluster_close(rc);
	return n;
}

/* B: look prompt r up (timed), then compare every cached byte with A's. */
static int fetch(struct kvp_client *c, uint64_t r, uint32_t n, double *secs,
		 uint64_t *cached, char *err, size_t len)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	uint32_t *t = prompt(r, n), P = l->page_tokens;
	uint8_t *got = malloc(l->token_bytes), *want = malloc(l->token_bytes);
	struct kvp_prefix_hit hit = { 0 };
	struct kvp_lease ls = { 0 };
	double t0;
	int rc = -ENOMEM;

	if (!t || !got || !want)
		goto out;
	t0 = kvb_now_s();
	rc = kvp_prefix_lookup(c, t, n, &hit);
	*secs = kvb_now_s() - t0;
	if (rc < 0) {
		snprintf(err, len, "B: prefix_lookup: %s", kvp_last_error(c));
		goto out;
	}
	*cached = hit.tokens;
	rc = kvp_seq_alloc(c, r + 1, t, n, &ls);
	if (rc) {
		snprintf(err, len, "B: seq_alloc: %s", kvp_last_error(c));
		goto out;
	}
	for (uint64_t i = 0; i < ls.len && !rc; i++) {
		struct kvp_slot s = { (uint32_t)ls.indices[i / P], (uint32_t)(i % P) };

		kvp_read_cpu(l, kvp_device_base(c), &s, 1, got);
		token_bytes(l, r, i, want);
		if (memcmp(got, want, l->token_bytes)) {
			snprintf(err, len, "B: token %" PRIu64 " of prompt %" PRIu64
				 " differs from what A computed", i, r);
			rc = -EBADMSG;
		}
	}
	if (kvp_release(c, ls.id) || kvp_seq_free(c, r + 1)) {
		snprintf(err, len, "B: release: %s", kvp_last_error(c));
		rc = -EIO;
	}
out:
	free(t);
	free(got);
	free(want);
	return rc;
}

static void on_raw(void *arg, uint32_t i, char **val, size_t len)
{
	uint64_t *bytes = arg;

	(void)i;
	(void)val;
	*bytes += len;
}

/* Raw: the same number of values of the same size, SET then GET, each one
 * pipelined batch, through the tier's own slot-routing hiredis client. */
static int raw_round(struct result *r, uint64_t round, char *err, size_t len)
{
	size_t vlen = HDR_BYTES + r->l.page_bytes;
	struct rc_item *it = calloc(r->pages, sizeof(*it));
	char (*keys)[64] = calloc(r->pages, 64);
	uint8_t *val = malloc(vlen);
	struct redis_cluster *rc = NULL;
	struct errbuf e;
	uint64_t bytes = 0;
	double t0;
	int ret = -ENOMEM;

	if (!it || !keys || !val)
		goto out;
	memset(val, 0x5a, vlen);
	if ((ret = redis_cluster_open(&rc, r->url, 5000, &e))) {
		snprintf(err, len, "raw: %s", e.msg);
		goto out;
	}
	for (uint64_t i = 0; i < r->pages; i++) {
		snprintf(keys[i], 64, "kvbench-raw:%" PRIu64 ":%" PRIu64, round, i);
		it[i] = (struct rc_item){ .key = keys[i], .klen = strlen(keys[i]),
					  .val = val, .vlen = vlen };
	}
	t0 = kvb_now_s();
	if (redis_cluster_set(rc, it, (uint32_t)r->pages) != r->pages) {
		snprintf(err, len, "raw: not every SET was taken (is the store full? "
			 "maxmemory)");
		ret = -EIO;
		goto out;
	}
	r->raw_set_s = kvb_now_s() - t0;
	t0 = kvb_now_s();
	if (redis_cluster_get(rc, it, (uint32_t)r->pages, on_raw, &bytes) != r->pages ||
	    bytes != r->pages * vlen) {
		snprintf(err, len, "raw: not every GET came back");
		ret = -EIO;
		goto out;
	}
	r->raw_get_s = kvb_now_s() - t0;
	ret = 0;
out:
	redis_cluster_close(rc);
	free(it);
	free(keys);
	free(val);
	return ret;
}

/* B's /metrics (the port from its log's "metrics: serving" line): the
 * remote tier's three timers, seconds, into v[3]. 0, or -1 unread. */
static int b_timers(const struct kvb_daemon *d, double v[3])
{
	static const char *const names[3] = { "kvpool_remote_fetch_seconds_total",
					      "kvpool_remote_fetch_wait_seconds_total",
					      "kvpool_remote_onload_seconds_total" };
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	struct sockaddr_in a = { .sin_family = AF_INET };
	char line[512], *body = NULL;
	size_t cap = 0, n = 0;
	FILE *f = fopen(d->log, "r");
	int port = 0, fd, got = 0;
	ssize_t k;

	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, "metrics: serving http://127.0.0.1:"))
			port = atoi(strstr(line, "127.0.0.1:") + 10);
	if (f)
		fclose(f);
	if (!port || (fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		return -1;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    write(fd, req, sizeof(req) - 1) != (ssize_t)sizeof(req) - 1) {
		close(fd);
		return -1;
	}
	do {
		if (n + 4096 > cap) {
			char *nb = realloc(body, cap = cap ? 2 * cap : 65536);

			if (!nb)
				break;
			body = nb;
		}
		k = read(fd, body + n, cap - n - 1);
		n += k > 0 ? (size_t)k : 0;
	} while (k > 0);
	close(fd);
	if (!body)
		return -1;
	body[n] = '\0';
	for (int i = 0; i < 3; i++) {
		char want[96], *p;

		snprintf(want, sizeof(want), "\n%s ", names[i]);
		p = strstr(body, want);
		if (p) {
			v[i] = strtod(p + strlen(want), NULL);
			got++;
		}
	}
	free(body);
	return got == 3 ? 0 : -1;
}

static int start_node(struct kvb_daemon *d, const struct opts *o, const struct result *r,
		      uint64_t device_pages, char *err, size_t len)
{
	char layout[256], remote[300], dev[64];
	const char *flags[] = { layout, remote, dev, "--host_mem=64M",
				"--remote_queue=4G", "--remote_timeout_ms=5000",
				"--metrics=127.0.0.1:0", NULL };
	char path[4096];
	int ret = kvb_daemon_find(o->kvpoold, path, sizeof(path), err, len);

	if (ret)
		return ret;
	snprintf(layout, sizeof(layout), "--layout=%s", o->layout);
	snprintf(remote, sizeof(remote), "--remote=%s", r->url);
	snprintf(dev, sizeof(dev), "--device_mem=%" PRIu64, device_pages * r->l.page_bytes);
	return kvb_daemon_start(d, path, flags, -1, 30000, err, len);
}

static int run(const struct opts *o, struct result *r, char *err, size_t len)
{
	struct kvb_daemon a = { 0 }, b = { 0 };
	struct kvp_client *ca = NULL, *cb = NULL;
	uint32_t n = (uint32_t)o->tokens + 1; /* the last token is left to compute */
	uint64_t pages = n / r->l.page_tokens + 1;
	int64_t base;
	int ret;

	/* A holds one prompt: the next evicts it. B holds them all: nothing
	 * it onloads is evicted (and written back) while a round is timed. */
	ret = start_node(&a, o, r, pages + 2, err, len);
	if (!ret)
		ret = start_node(&b, o, r, pages * o->rounds + 2, err, len);
	if (!ret) {
		struct kvp_connect_opts co = { .socket = a.sock, .name = "kvbench-remote-A" };

		ret = kvp_connect(&ca, &co, err, len);
		co = (struct kvp_connect_opts){ .socket = b.sock, .name = "kvbench-remote-B" };
		if (!ret)
			ret = kvp_connect(&cb, &co, err, len);
	}
	base = store_keys(r);
	/* Eviction takes a chain's leaves first: the prompt after next is what
	 * pushes the last of a prompt's pages out, so two more than rounds. */
	for (uint64_t k = 0; !ret && k < o->rounds + 2; k++)
		ret = compute(ca, k, n, err, len);
	/* Written behind: wait (60 s at most) until the store has every
	 * evicted page, so that no round is timed against a half-written one. */
	for (int i = 0; !ret && base >= 0 && i < 600; i++) {
		int64_t now = store_keys(r);

		if (now < 0 || (uint64_t)(now - base) >= o->rounds * (o->tokens / r->l.page_tokens))
			break;
		usleep(100000);
	}
	r->split_fetch_s = r->split_wait_s = r->split_onload_s = -1;
	for (uint64_t k = 0; !ret && k < o->rounds; k++) {
		double s = 0, v0[3], v1[3];
		uint64_t cached = 0;
		bool split = !b_timers(&b, v0); /* B's timers around the lookup */

		ret = fetch(cb, k, n, &s, &cached, err, len);
		split = split && !b_timers(&b, v1);
		if (!ret && cached != o->tokens) {
			snprintf(err, len, "B: prompt %" PRIu64 ": %" PRIu64 " of %" PRIu64
				 " tokens came back from the store (write-behind "
				 "dropped pages? raise remote_queue)", k, cached, o->tokens);
			ret = -EIO;
		}
		if (!ret) {
			r->fetch_s_all[k] = s;
			if (!k || s < r->fetch_s) {
				r->fetch_s = s;
				if (split) {
					r->split_fetch_s = v1[0] - v0[0];
					r->split_wait_s = v1[1] - v0[1];
					r->split_onload_s = v1[2] - v0[2];
				}
			}
			r->cached_tokens = cached;
		}
	}
	for (uint64_t k = 0; !ret && k < o->rounds; k++) {
		struct result t = *r;

		ret = raw_round(&t, k, err, len);
		if (!ret && (!k || t.raw_get_s < r->raw_get_s))
			r->raw_get_s = t.raw_get_s;
		if (!ret && (!k || t.raw_set_s < r->raw_set_s))
			r->raw_set_s = t.raw_set_s;
	}
	if (ca)
		kvp_close(ca);
	if (cb)
		kvp_close(cb);
	kvb_daemon_stop(&a, 10000, NULL, 0);
	kvb_daemon_stop(&b, 10000, NULL, 0);
	return ret;
}

/* ---------------------------------------------------------------- reports */

static void print_table(const struct opts *o, const struct result *r,
			const struct kvb_machine *m)
{
	double mb = (double)r->bytes / 1e6;

	(void)m;
	printf("kvbench remote: %" PRIu64 " tokens of %s (%" PRIu64 " pages, %.1f MB) "
	       "from %s%s, best of %" PRIu64 "\n", o->tokens, o->layout, r->pages, mb,
	       r->url, r->own_cluster ? " (started here, loopback)" : "", o->rounds);
	printf("  %-34s %9.3f s  %6.3f GB/s\n", "B's lookup: fetch, check, onload",
	       r->fetch_s, kvb_gbps(r->bytes, r->fetch_s));
	if (r->split_fetch_s >= 0) {
		printf("    %-32s %9.3f s\n", "store rounds, checks (B's thread)",
		       r->split_fetch_s);
		printf("    %-32s %9.3f s\n", "done, until the retry took it",
		       r->split_wait_s);
		printf("    %-32s %9.3f s\n", "copy into B's pool, publish",
		       r->split_onload_s);
		printf("    %-32s %9.3f s\n", "the rest (request, lookup)",
		       r->fetch_s - r->split_fetch_s - r->split_wait_s - r->split_onload_s);
	}
	printf("  %-34s %9.3f s  %6.3f GB/s\n", "raw pipelined GET, same values",
	       r->raw_get_s, kvb_gbps(r->bytes, r->raw_get_s));
	printf("  %-34s %9.3f s  %6.3f GB/s\n", "raw pipelined SET, same values",
	       r->raw_set_s, kvb_gbps(r->bytes, r->raw_set_s));
	printf("  lookup / raw GET: %.2f (1.0 = the store's own speed)\n",
	       r->raw_get_s > 0 ? r->fetch_s / r->raw_get_s : 0);
}

static void print_json(const struct opts *o, const struct result *r,
		       const struct kvb_machine *m)
{
	struct json j;

	kvb_json_begin(&j, "remote");
	json_str(&j, "store", r->url);
	json_bool(&j, "store_started_here", r->own_cluster);
	json_str(&j, "layout", o->layout);
	json_u64(&j, "page_bytes", r->l.page_bytes);
	json_u64(&j, "tokens", o->tokens);
	json_u64(&j, "cached_tokens", r->cached_tokens);
	json_u64(&j, "pages", r->pages);
	json_u64(&j, "bytes", r->bytes);
	json_u64(&j, "rounds", o->rounds);
	json_f64(&j, "fetch_s", r->fetch_s, 4);
	json_arr_begin(&j, "fetch_s_rounds");
	for (uint64_t k = 0; k < o->rounds; k++)
		json_f64(&j, NULL, r->fetch_s_all[k], 4);
	json_arr_end(&j);
	json_f64(&j, "fetch_gbps", kvb_gbps(r->bytes, r->fetch_s), 3);
	/* The best round split by B's /metrics (-1: not read). */
	json_f64(&j, "fetch_split_store_s", r->split_fetch_s, 4);
	json_f64(&j, "fetch_split_wait_s", r->split_wait_s, 4);
	json_f64(&j, "fetch_split_onload_s", r->split_onload_s, 4);
	json_f64(&j, "raw_get_s", r->raw_get_s, 4);
	json_f64(&j, "raw_get_gbps", kvb_gbps(r->bytes, r->raw_get_s), 3);
	json_f64(&j, "raw_set_s", r->raw_set_s, 4);
	json_f64(&j, "raw_set_gbps", kvb_gbps(r->bytes, r->raw_set_s), 3);
	json_f64(&j, "fetch_over_raw_get", r->raw_get_s > 0 ? r->fetch_s / r->raw_get_s : 0, 3);
	kvb_json_end(&j, m);
}

/* ---------------------------------------------------------------- options */

enum { OPT_REMOTE = 256, OPT_LAYOUT, OPT_TOKENS, OPT_ROUNDS, OPT_KVPOOLD };

static const struct option long_opts[] = {
	{ "remote", required_argument, NULL, OPT_REMOTE },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "tokens", required_argument, NULL, OPT_TOKENS },
	{ "rounds", required_argument, NULL, OPT_ROUNDS },
	{ "kvpoold", required_argument, NULL, OPT_KVPOOLD },
	KVB_LONG_OPTS_END,
};

static void usage(FILE *f)
{
	fputs("usage: kvbench remote [options]\n"
	      "Time for one kvpoold (B) to get a prompt's KV that another (A) computed\n"
	      "from the remote tier, vs raw pipelined GET/SET of the same values.\n"
	      "  --remote URL       redis-cluster://host:port,... (default: start three\n"
	      "                     redis-server processes on loopback for this run)\n"
	      "  --layout SPEC      model geometry (default " DEFAULT_LAYOUT ",\n"
	      "                     Llama-3-8B)\n"
	      "  --tokens N         prompt tokens served from the store (default 4000)\n"
	      "  --rounds N         prompts, each timed once; the best is reported (default 3)\n"
	      "  --kvpoold PATH     the daemon to start (default: next to kvbench)\n"
	      KVB_USAGE_END_OPTS, f);
}

static int one_opt(void *ctx, int c, const char *arg)
{
	struct opts *o = ctx;

	switch (c) {
	case OPT_REMOTE:
		o->url = arg;
		return -1;
	case OPT_LAYOUT:
		o->layout = arg;
		return -1;
	case OPT_TOKENS:
		return kvb_opt_count(SUB, "--tokens", arg, 16, 1000000, &o->tokens);
	case OPT_ROUNDS:
		return kvb_opt_count(SUB, "--rounds", arg, 1, 16, &o->rounds);
	case OPT_KVPOOLD:
		o->kvpoold = arg;
		return -1;
	}
	return KVB_EXIT_USAGE;
}

int cmd_remote(int argc, char **argv)
{
	struct opts o = { .layout = DEFAULT_LAYOUT, .tokens = 4000, .rounds = 3 };
	struct result r = { 0 };
	struct redis_local rl = { 0 };
	struct kvb_machine m;
	struct summary tov;
	char err[1024] = "";
	struct errbuf e;
	int rc;

	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, &o, &o.json);
	if (rc < 0)
		rc = kvb_begin_run(SUB, KVB_CPU_NONE, &m, &tov);
	if (rc >= 0)
		return rc;
	if (kvp_layout_parse(&r.l, o.layout, err, sizeof(err)))
		return kvb_usage_error(SUB, "--layout '%s': %s", o.layout, err);
	if (o.url && redis_cluster_check_url(o.url, &e))
		return kvb_usage_error(SUB, "--remote: %s", e.msg);
	o.tokens -= o.tokens % r.l.page_tokens; /* whole pages come from the store */
	r.pages = o.tokens / r.l.page_tokens;
	r.bytes = r.pages * r.l.page_bytes;
	if (o.url) {
		snprintf(r.url, sizeof(r.url), "%s", o.url);
	} else {
		rc = redis_local_start(&rl, 3);
		if (rc == 77)
			return KVB_EXIT_FAIL;
		if (rc) {
			fprintf(stderr, "kvbench remote: could not start a Redis Cluster on "
				"loopback (%d); see %s, or give --remote\n", rc, rl.dir);
			redis_local_stop(&rl);
			return KVB_EXIT_FAIL;
		}
		snprintf(r.url, sizeof(r.url), "%s", rl.url);
		r.own_cluster = true;
	}
	rc = run(&o, &r, err, sizeof(err));
	if (r.own_cluster)
		redis_local_stop(&rl);
	if (rc) {
		fprintf(stderr, "kvbench remote: %s\n", err[0] ? err : strerror(-rc));
		return KVB_EXIT_FAIL;
	}
	if (o.json)
		print_json(&o, &r, &m);
	else
		print_table(&o, &r, &m);
	return KVB_EXIT_OK;
}
