/* SPDX-License-Identifier: MIT */
/*
 * test_sharing - chunks and the prefix cache served to real processes by a
 * real kvpoold.
 *
 *   1. dedupe: two processes register the same tokens at the same moment
 *      (released together from a barrier): both get the same id, exactly
 *      one gets created = 1 and fills; the other gets created = 0, its
 *      acquire says -EAGAIN while the filler has not sealed, then (waiting)
 *      gets the chunk and reads the filler's bytes byte for byte; the stats
 *      hold one chunk with the pages of one chunk;
 *   2. a chunk deleted while another process holds a read lease stays
 *      readable, bytes unchanged, until that lease is released, and its
 *      frames come back (device frames_free back to the start) after;
 *   3. a filler SIGKILLed before it seals: the chunk disappears, its frames
 *      come back, and registering the same tokens creates it again;
 *   4. prefix hashes are the same in every process: one process
 *      seq_alloc's, appends, commits and frees a token list, another's
 *      kvp_prefix_lookup of the same tokens reports the full pages cached
 *      (never the last token); and across daemon restarts: the same tokens
 *      give the same chunk id (also as `kvctl chunks --json` prints it),
 *      a tenant's hash_salt changes it, the same salt gives it back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define CHUNK_TOKENS 100u        /* 7 pages of 16: the last one partial */
#define CHUNK_PAGES 7u
#define T_DEDUPE 0x1000u
#define T_DELETE 0x2000u
#define T_KILLED 0x3000u
#define T_PREFIX 0x4000u
#define T_RESTART 0x5000u

static const char *g_sock;

struct shared {
	int created;          /* registers that returned created = 1 */
	int saw_eagain;       /* the non-filler saw "not ready" */
	uint64_t filler_salt; /* the bytes the filler wrote */
	struct kvp_chunk_id id[2];
	uint32_t filler_client;
};

static struct shared *g;

/* Read tokens [0, n) of a read lease (page table copied out first: it is
 * valid only until the next call) and compare with h_tokens_fill(salt). */
static int verify(struct kvp_client *c, const struct kvp_lease *l,
		  uint64_t salt, uint32_t n, const char *what)
{
	const uint32_t P = kvp_client_layout(c)->page_tokens;

	if (l->len != n || l->npages != (n + P - 1) / P) {
		h_fail("%s: lease of %" PRIu64 " tokens in %" PRIu32 " pages, want %"
		       PRIu32, what, l->len, l->npages, n);
		return -1;
	}
	return h_same_bytes(c, l->indices, salt, 0, n, what);
}

static uint64_t frames_free(struct kvp_client *c)
{
	struct kvp_stats s;

	if (kvp_stats(c, 0, &s)) {
		h_fail("stats: %s", kvp_last_error(c));
		return 0;
	}
	return s.tier[KVP_TIER_DEVICE].frames_free;
}

/* frames_free back to want within 2 s (a dead client is noticed at its
 * hang-up, asynchronously). */
static int frames_back(struct kvp_client *c, uint64_t want, const char *what)
{
	uint64_t until = h_now_ms() + 2000, now = 0;

	while (h_now_ms() < until) {
		now = frames_free(c);
		if (now == want)
			return 0;
		h_sleep_ms(5);
	}
	h_fail("%s: device frames_free is %" PRIu64 ", %" PRIu64 " at the start",
	       what, now, want);
	return -1;
}

/* ------------------------------------------------------------ 1. dedupe */

struct racer {
	int idx;
	struct h_chan ch;
};

static int racer_main(void *arg)
{
	struct racer *r = arg;
	uint32_t t[CHUNK_TOKENS];
	struct kvp_chunk_reg reg;
	struct kvp_lease l;
	struct kvp_client *c;
	char name[16];
	int rc;

	h_chan_child_side(&r->ch);
	snprintf(name, sizeof(name), "racer%d", r->idx);
	h_set_name(name);
	c = h_connect_or_fail(g_sock, name, 5000);
	if (!c)
		return 1;
	h_token_ids(t, CHUNK_TOKENS, T_DEDUPE);
	/* Barrier: both connected, released by the parent at once. */
	if (h_chan_say(r->ch.to_parent[1], 'r') || h_chan_wait(r->ch.to_child[0], 5000) != 'g')
		return 1;
	rc = kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_CONTEXT, "doc=dedupe", &reg);
	if (rc) {
		h_fail("register: %s", kvp_last_error(c));
		return 1;
	}
	g->id[r->idx] = reg.id;
	if (reg.created) {
		__atomic_add_fetch(&g->created, 1, __ATOMIC_SEQ_CST);
		g->filler_salt = 0xf111e0ull + (uint64_t)r->idx;
		g->filler_client = kvp_client_id(c);
		if (reg.lease.n_new != CHUNK_TOKENS || reg.lease.len ||
		    h_fill_lease(c, &reg.lease, g->filler_salt, CHUNK_TOKENS))
			return 1;
		/* Hold the seal until the other saw "not ready" (or 3 s). */
		uint64_t until = h_now_ms() + 3000;
		while (!__atomic_load_n(&g->saw_eagain, __ATOMIC_SEQ_CST) && h_now_ms() < until)
			h_sleep_ms(1);
		h_sleep_ms(20); /* and give its waiting acquire a few retries */
		if (kvp_chunk_seal(c, &reg)) {
			h_fail("seal: %s", kvp_last_error(c));
			return 1;
		}
	} else {
		if (reg.lease.id || reg.lease.indices) {
			h_fail("created = 0 but a lease came back");
			return 1;
		}
		/* The filler may not have registered its id in g yet; the
		 * chunk is being filled until it seals, so: */
		rc = kvp_chunk_acquire(c, &reg.id, 0, &l);
		if (rc != -EAGAIN) {
			h_fail("acquire of a chunk being filled: %d, want -EAGAIN (%s)",
			       rc, kvp_last_error(c));
			return 1;
		}
		__atomic_store_n(&g->saw_eagain, 1, __ATOMIC_SEQ_CST);
		rc = kvp_chunk_acquire(c, &reg.id, 5000, &l);
		if (rc) {
			h_fail("waiting acquire: %s", kvp_last_error(c));
			return 1;
		}
		if (verify(c, &l, g->filler_salt, CHUNK_TOKENS, "dedupe reader"))
			return 1;
		if (kvp_release(c, l.id)) {
			h_fail("release: %s", kvp_last_error(c));
			return 1;
		}
	}
	kvp_close(c);
	return 0;
}

static int test_dedupe(struct kvp_client *c)
{
	struct racer r[2];
	pid_t pids[2];
	struct kvp_chunk_info ci;
	struct kvp_stats s;
	int bad = 0;

	memset(g, 0, sizeof(*g));
	for (int i = 0; i < 2; i++) {
		r[i].idx = i;
		if (h_chan_open(&r[i].ch))
			return 1;
		pids[i] = h_fork(racer_main, &r[i]);
		h_chan_parent_side(&r[i].ch);
	}
	for (int i = 0; i < 2; i++)
		if (h_chan_wait(r[i].ch.to_parent[0], 5000) != 'r')
			return 1;
	for (int i = 0; i < 2; i++)
		h_chan_say(r[i].ch.to_child[1], 'g');
	bad += h_wait_all(pids, 2, 20000);
	if (g->created != 1) {
		h_fail("dedupe: %d registers created the chunk; want exactly 1", g->created);
		bad++;
	}
	if (memcmp(&g->id[0], &g->id[1], sizeof(g->id[0]))) {
		h_fail("dedupe: the two registers got different ids");
		bad++;
	}
	if (kvp_stats(c, 0, &s) || s.chunks != 1 || s.chunk_pages != CHUNK_PAGES) {
		h_fail("dedupe: stats say %" PRIu64 " chunks in %" PRIu64 " pages; want 1 "
		       "in %u (one set of pages)", s.chunks, s.chunk_pages, CHUNK_PAGES);
		bad++;
	}
	if (kvp_chunk_get(c, &g->id[0], &ci) || ci.state != KVP_CHUNK_READY ||
	    ci.holders != 0 || ci.hits < 1 || strcmp(ci.meta, "{\"doc\":\"dedupe\"}")) {
		h_fail("dedupe: chunk info state %u holders %u hits %" PRIu64 " meta '%s'",
		       ci.state, ci.holders, ci.hits, ci.meta);
		bad++;
	}
	if (kvp_chunk_delete(c, &g->id[0]) != 1 ||
	    kvp_stats(c, 0, &s) || s.chunk_pages != 0) {
		h_fail("dedupe: delete of an unheld chunk did not free its %u pages: %s",
		       CHUNK_PAGES, kvp_last_error(c));
		bad++;
	}
	h_log("dedupe: %s", bad ? "FAIL" : "one creator, one set of pages, bytes match");
	return bad;
}

/* ------------------------------------------------------------ 2. delete while leased */

static int reader_main(void *arg)
{
	struct h_chan *ch = arg;
	struct kvp_lease l;
	struct kvp_client *c;
	int rc;

	h_chan_child_side(ch);
	h_set_name("reader");
	c = h_connect_or_fail(g_sock, "reader", 5000);
	if (!c)
		return 1;
	rc = kvp_chunk_acquire(c, &g->id[0], 1000, &l);
	if (rc) {
		h_fail("acquire: %s", kvp_last_error(c));
		return 1;
	}
	/* Copy what verify() needs: the page table lives in the arena. */
	struct kvp_lease keep = l;
	int32_t idx[CHUNK_PAGES];
	memcpy(idx, l.indices, sizeof(idx));
	keep.indices = idx;
	if (h_chan_say(ch->to_parent[1], 'l') || h_chan_wait(ch->to_child[0], 5000) != 'd')
		return 1;
	/* Deleted by the parent: still ours, bytes unchanged. */
	if (verify(c, &keep, 0xde1e7eull, CHUNK_TOKENS, "deleted but leased"))
		return 1;
	if (kvp_release(c, keep.id)) {
		h_fail("release: %s", kvp_last_error(c));
		return 1;
	}
	kvp_close(c);
	return 0;
}

static int test_delete_leased(struct kvp_client *c)
{
	uint32_t t[CHUNK_TOKENS];
	struct kvp_chunk_reg reg;
	struct kvp_chunk_info ci;
	struct h_chan ch;
	uint64_t free0 = frames_free(c), held;
	pid_t pid;
	int bad = 0, rc;

	h_token_ids(t, CHUNK_TOKENS, T_DELETE);
	if (kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_SYSTEM, NULL, &reg) ||
	    !reg.created || h_fill_lease(c, &reg.lease, 0xde1e7eull, CHUNK_TOKENS) ||
	    kvp_chunk_seal(c, &reg)) {
		h_fail("delete: set up the chunk: %s", kvp_last_error(c));
		return 1;
	}
	g->id[0] = reg.id;
	if (h_chan_open(&ch))
		return 1;
	pid = h_fork(reader_main, &ch);
	h_chan_parent_side(&ch);
	if (h_chan_wait(ch.to_parent[0], 5000) != 'l')
		return 1;
	rc = kvp_chunk_delete(c, &reg.id);
	if (rc != 1) { /* one entry; held: nothing is freed yet */
		h_fail("delete of a leased chunk: %d (%s)", rc, kvp_last_error(c));
		bad++;
	}
	rc = kvp_chunk_get(c, &reg.id, &ci);
	if (rc != -ENOENT) {
		h_fail("get after delete: %d, want -ENOENT", rc);
		bad++;
	}
	held = frames_free(c);
	if (held != free0 - CHUNK_PAGES) {
		h_fail("delete: frames_free %" PRIu64 " while leased; want %" PRIu64
		       " (the pages still held)", held, free0 - CHUNK_PAGES);
		bad++;
	}
	h_chan_say(ch.to_child[1], 'd');
	if (h_wait(pid, 10000) != 0)
		bad++;
	bad += frames_back(c, free0, "delete after release") ? 1 : 0;
	h_log("delete while leased: %s", bad ? "FAIL" : "readable until released, frames back");
	return bad;
}

/* ------------------------------------------------------------ 3. killed filler */

static int filler_main(void *arg)
{
	struct h_chan *ch = arg;
	uint32_t t[CHUNK_TOKENS];
	struct kvp_chunk_reg reg;
	struct kvp_client *c;

	h_chan_child_side(ch);
	h_set_name("filler");
	c = h_connect_or_fail(g_sock, "filler", 5000);
	if (!c)
		return 1;
	h_token_ids(t, CHUNK_TOKENS, T_KILLED);
	if (kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_QUERY, NULL, &reg) ||
	    !reg.created) {
		h_fail("register: %s", kvp_last_error(c));
		return 1;
	}
	g->id[0] = reg.id;
	g->filler_client = kvp_client_id(c);
	/* Half written, then killed. */
	h_fill_lease(c, &reg.lease, 0xdeadull, CHUNK_TOKENS / 2);
	h_chan_say(ch->to_parent[1], 'f');
	for (;;)
		pause();
}

static int test_killed_filler(struct kvp_client *c)
{
	uint32_t t[CHUNK_TOKENS];
	struct kvp_chunk_reg reg;
	struct kvp_chunk_info ci;
	struct h_chan ch;
	uint64_t free0 = frames_free(c), until;
	pid_t pid;
	int bad = 0, rc;

	if (h_chan_open(&ch))
		return 1;
	pid = h_fork(filler_main, &ch);
	h_chan_parent_side(&ch);
	if (h_chan_wait(ch.to_parent[0], 5000) != 'f')
		return 1;
	rc = kvp_chunk_get(c, &g->id[0], &ci);
	if (rc || ci.state != KVP_CHUNK_FILLING || ci.filler != g->filler_client) {
		h_fail("killed filler: before the kill: rc %d state %u filler %u (want %u)",
		       rc, ci.state, ci.filler, g->filler_client);
		bad++;
	}
	kill(pid, SIGKILL);
	h_wait(pid, 5000);
	until = h_now_ms() + 2000;
	while ((rc = kvp_chunk_get(c, &g->id[0], &ci)) == 0 && h_now_ms() < until)
		h_sleep_ms(5);
	if (rc != -ENOENT) {
		h_fail("killed filler: the unsealed chunk is still there (%d)", rc);
		bad++;
	}
	bad += frames_back(c, free0, "killed filler") ? 1 : 0;
	h_token_ids(t, CHUNK_TOKENS, T_KILLED);
	if (kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_QUERY, NULL, &reg) ||
	    !reg.created || memcmp(&reg.id, &g->id[0], sizeof(reg.id))) {
		h_fail("killed filler: register again: created %d (%s)", reg.created,
		       kvp_last_error(c));
		bad++;
	} else if (h_fill_lease(c, &reg.lease, 1, CHUNK_TOKENS) || kvp_chunk_seal(c, &reg) ||
		   kvp_chunk_delete(c, &reg.id) < 0) {
		h_fail("killed filler: refill: %s", kvp_last_error(c));
		bad++;
	}
	h_log("killed filler: %s", bad ? "FAIL" : "chunk gone, frames back, registers anew");
	return bad;
}

/* ------------------------------------------------------------ 4. prefix */

#define PREFIX_TOKENS 80u /* 5 full pages */

static int prefix_writer_main(void *arg)
{
	uint32_t t[PREFIX_TOKENS];
	struct kvp_lease l;
	struct kvp_client *c;

	h_set_name("prefix-writer");
	c = h_connect_or_fail(g_sock, "prefix-writer", 5000);
	if (!c)
		return 1;
	h_token_ids(t, PREFIX_TOKENS, T_PREFIX);
	if (kvp_seq_alloc(c, 4242, t, PREFIX_TOKENS, &l)) {
		h_fail("seq_alloc: %s", kvp_last_error(c));
		return 1;
	}
	if (l.len != 0 || l.n_new != PREFIX_TOKENS || h_fill_lease(c, &l, 0x9e1ull, l.n_new) ||
	    kvp_commit(c, l.id, l.n_new) || kvp_release(c, l.id) ||
	    kvp_seq_free(c, 4242)) {
		h_fail("seq cycle (len %" PRIu64 " n_new %u): %s", l.len, l.n_new,
		       kvp_last_error(c));
		return 1;
	}
	kvp_close(c);
	return 0;
}

static int test_prefix(struct kvp_client *c)
{
	uint32_t t[PREFIX_TOKENS + 1];
	struct kvp_prefix_hit hit;
	struct kvp_lease l;
	int bad = 0, rc;

	if (h_wait(h_fork(prefix_writer_main, NULL), 10000) != 0)
		return 1;
	h_token_ids(t, PREFIX_TOKENS + 1, T_PREFIX);
	rc = kvp_prefix_lookup(c, t, PREFIX_TOKENS, &hit);
	/* All 80 are cached, but the last token is left to compute (seed
	 * 004: 79, in all 5 pages, not a page less). */
	if (rc != 79 || hit.tokens != 79 || hit.npages != 5) {
		h_fail("prefix: lookup of the writer's 80 tokens: %d (%u tokens, %u "
		       "pages); want 79 in 5 (%s)", rc, hit.tokens, hit.npages,
		       kvp_last_error(c));
		bad++;
	}
	rc = kvp_prefix_lookup(c, t, PREFIX_TOKENS + 1, &hit);
	if (rc != 80) {
		h_fail("prefix: lookup of 81 tokens: %d cached; want 80", rc);
		bad++;
	}
	/* seq_alloc of the whole 80: 79 shared, the last page a private copy
	 * holding the writer's bytes, one slot to compute at 79. */
	int32_t cached_last = hit.npages == 5 ? hit.indices[4] : -1;
	rc = kvp_seq_alloc(c, 78, t, PREFIX_TOKENS, &l);
	if (rc || l.len != 79 || l.n_new != 1 || l.npages != 5) {
		h_fail("prefix: seq_alloc of the 80 cached tokens: %d len %" PRIu64
		       " n_new %u npages %u; want 79 + 1 in 5 pages (%s)", rc, l.len,
		       l.n_new, l.npages, kvp_last_error(c));
		bad++;
	} else {
		if (verify(c, &l, 0x9e1ull, 79, "the whole prompt's pages"))
			bad++;
		if (l.indices[4] == cached_last) {
			h_fail("prefix: the last page of a whole-prompt hit is the "
			       "cached frame %d, not a copy", l.indices[4]);
			bad++;
		}
		if (kvp_release(c, l.id) || kvp_seq_free(c, 78)) {
			h_fail("prefix: free: %s", kvp_last_error(c));
			bad++;
		}
	}
	t[3] ^= 1; /* a different first page: nothing matches */
	rc = kvp_prefix_lookup(c, t, PREFIX_TOKENS, &hit);
	if (rc != 0) {
		h_fail("prefix: a changed first page still hits %d tokens", rc);
		bad++;
	}
	t[3] ^= 1;
	/* seq_alloc shares the cached pages and reads the writer's bytes. */
	rc = kvp_seq_alloc(c, 77, t, PREFIX_TOKENS + 1, &l);
	if (rc || l.len != 80 || l.n_new != 1) {
		h_fail("prefix: seq_alloc over the cache: %d len %" PRIu64 " n_new %u (%s)",
		       rc, l.len, l.n_new, kvp_last_error(c));
		bad++;
	} else {
		struct kvp_lease rd = l;

		rd.len = 80;
		rd.npages = 5;
		if (verify(c, &rd, 0x9e1ull, 80, "prefix pages"))
			bad++;
		if (kvp_release(c, l.id) || kvp_seq_free(c, 77)) {
			h_fail("prefix: free: %s", kvp_last_error(c));
			bad++;
		}
	}
	h_log("prefix: %s", bad ? "FAIL" : "hashes agree across processes");
	return bad;
}

/* ------------------------------------------------------------ 4b. restarts */

/* Register the restart tokens (filled, sealed) and return their id. */
static int restart_id(struct h_daemon *d, struct kvp_chunk_id *id)
{
	uint32_t t[CHUNK_TOKENS];
	struct kvp_chunk_reg reg;
	struct kvp_client *c = h_connect_or_fail(d->sock, "restart", 5000);
	int rc;

	if (!c)
		return -1;
	h_token_ids(t, CHUNK_TOKENS, T_RESTART);
	rc = kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_CONTEXT, "k=v", &reg);
	if (!rc && reg.created)
		rc = h_fill_lease(c, &reg.lease, 5, CHUNK_TOKENS) ? -1 : kvp_chunk_seal(c, &reg);
	if (rc)
		h_fail("restart: register: %s", kvp_last_error(c));
	*id = reg.id;
	kvp_close(c);
	return rc;
}

/* `kvctl chunks --json` names the id (when the test was given kvctl). */
static int kvctl_lists(struct h_daemon *d, const struct kvp_chunk_id *id)
{
	char cmd[512], hex[65], out[8192];
	size_t n;
	FILE *p;
	int st;

	if (!h_kvctl_path)
		return 0;
	kvp_chunk_id_format(id, hex);
	snprintf(cmd, sizeof(cmd), "%s --socket %s chunks --json", h_kvctl_path, d->sock);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	if (st != 0 || !strstr(out, hex)) {
		h_fail("kvctl chunks --json (status %d) does not list %s:\n%s", st, hex, out);
		return -1;
	}
	return 0;
}

static int run_daemon(struct h_daemon *d, const char *tenant,
		      struct kvp_chunk_id *id)
{
	int bad = 0;

	if (h_daemon_start(d, 10000, "--device_mem=4M", tenant, (char *)NULL))
		return 1;
	if (restart_id(d, id) || kvctl_lists(d, id))
		bad++;
	if (h_daemon_stop(d, 5000))
		bad++;
	return bad;
}

static int test_restarts(struct h_daemon *d)
{
	struct kvp_chunk_id a, b, s1, s1b, s2;
	char t_s1[128], t_s2[128];
	int bad = 0;

	/* No tenants (the default tenant's fixed salt), then a tenant holding
	 * our uid with one salt, the same again, and another salt. */
	snprintf(t_s1, sizeof(t_s1), "--tenant=t:uids=%u:hash_salt=first secret",
		 (unsigned)getuid());
	snprintf(t_s2, sizeof(t_s2), "--tenant=t:uids=%u:hash_salt=second secret",
		 (unsigned)getuid());
	bad += run_daemon(d, "--workers=1", &a);
	bad += run_daemon(d, "--workers=1", &b);
	if (!bad && memcmp(&a, &b, sizeof(a))) {
		h_fail("restart: the same tokens got another chunk id after a restart");
		bad++;
	}
	bad += run_daemon(d, t_s1, &s1);
	bad += run_daemon(d, t_s1, &s1b);
	bad += run_daemon(d, t_s2, &s2);
	if (!bad && (!memcmp(&s1, &a, sizeof(a)) || !memcmp(&s2, &s1, sizeof(a)))) {
		h_fail("restart: a tenant's hash_salt does not change the chunk id");
		bad++;
	}
	if (!bad && memcmp(&s1, &s1b, sizeof(a))) {
		h_fail("restart: the same hash_salt gave another id after a restart");
		bad++;
	}
	h_log("restarts: %s", bad ? "FAIL" : "ids stable across restarts, salted per tenant");
	return bad;
}

int main(int argc, char **argv)
{
	struct kvp_client *c;
	struct h_daemon d;
	uint64_t t0;
	int fail = 0;

	h_init(argc, argv, "test_sharing");
	t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	if (h_daemon_up(&d, "--device_mem=4M", "--workers=2", (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	c = h_connect_or_fail(d.sock, "test", 5000);
	if (!c)
		return h_daemon_finish(&d, 1, t0);
	fail += test_dedupe(c);
	fail += test_delete_leased(c);
	fail += test_killed_filler(c);
	fail += test_prefix(c);
	kvp_close(c);
	if (h_daemon_stop(&d, 5000))
		fail++;
	if (!fail)
		fail += test_restarts(&d);
	return h_daemon_end(&d, fail);
}
