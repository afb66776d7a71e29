/* SPDX-License-Identifier: MIT */
/*
 * test_chunk_entries - chunk entries under names, served by a real kvpoold
 * to real processes (kvpool.h "Chunks"):
 *
 *   1. a link of one name under two parents is two entries with different
 *      ids, at the positions after each parent (the fill lease says where);
 *   2. a second process registering the same root and link gets hits and
 *      the first process's pages, bytes and all;
 *   3. a batch of two requests on the same system and context with other
 *      queries: level 1 is one group covering both; a broken chain is
 *      refused naming the entry and its actual parent;
 *   4. delete by name cascades to the entries below and gives every frame
 *      back (tenant stats as before the registrations);
 *   5. max_chunks and chunk_memory_ratio evict least recently used
 *      unheld leaves (a parent outlives its child) and refuse with -ENOMEM
 *      naming the limit when everything is held; limits clamp to the
 *      configured ones;
 *   6. content over chunk_content_max is -E2BIG naming the setting; content
 *      and tokens read back; the preview is the content's start;
 *   7. metadata is a JSON object: filters match subsets, values typed
 *      (numbers, booleans, arrays), legacy k=v still works, bad JSON and
 *      non-objects are refused naming what is wrong;
 *   8. a client SIGKILLed while filling a link leaves nothing: the entry
 *      gone, its parent unpinned, the frames back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static const char *g_sock;
static int g_bad;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond)) {                                                 \
			h_fail(__VA_ARGS__);                                   \
			g_bad++;                                               \
		}                                                              \
	} while (0)

/* Shared with the children. */
struct shared {
	struct kvp_chunk_id sys, link, name;
	int32_t frames[64];
	uint32_t npages;
	int hits;
};

static struct shared *g;

static void ids(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 3u;
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

static int frames_back(struct kvp_client *c, uint64_t want, const char *what)
{
	uint64_t until = h_now_ms() + 2000, now = 0;

	while (h_now_ms() < until) {
		now = frames_free(c);
		if (now == want)
			return 0;
		h_sleep_ms(5);
	}
	h_fail("%s: device frames_free is %" PRIu64 ", was %" PRIu64, what, now, want);
	g_bad++;
	return -1;
}

/* Write the fill lease's n tokens from h_tokens_fill(salt, positions from
 * start) and seal. */
static int fill_seal(struct kvp_client *c, struct kvp_chunk_reg *reg, uint64_t salt)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	void *kv = malloc((size_t)reg->tokens * lay->token_bytes);
	int rc;

	if (!kv)
		return -ENOMEM;
	h_tokens_fill(lay, salt, 0, reg->start, reg->tokens, kv);
	rc = kvp_append(c, &reg->lease, 0, reg->tokens, kv);
	free(kv);
	if (!rc)
		rc = kvp_chunk_seal(c, reg);
	if (rc)
		h_fail("fill and seal: %s", kvp_last_error(c));
	return rc;
}

/* A root of n tokens from base, filled when created; *reg the result. */
static int root(struct kvp_client *c, uint32_t base, uint32_t n, uint32_t type,
		const char *meta, struct kvp_chunk_reg *reg)
{
	uint32_t *t = malloc(n * sizeof(*t));
	int rc;

	if (!t)
		return -ENOMEM;
	ids(t, n, base);
	rc = kvp_chunk_register(c, t, n, type, meta, reg);
	free(t);
	if (rc) {
		h_fail("register %u tokens from %u: %s", n, base, kvp_last_error(c));
		return rc;
	}
	return reg->created ? fill_seal(c, reg, base) : 0;
}

static int link_after(struct kvp_client *c, const struct kvp_chunk_id *name,
		const struct kvp_chunk_id *parent, uint64_t salt,
		struct kvp_chunk_reg *reg)
{
	int rc = kvp_chunk_link(c, name, parent, 1000, reg);

	if (rc) {
		h_fail("link: %s", kvp_last_error(c));
		return rc;
	}
	return reg->created ? fill_seal(c, reg, salt) : 0;
}

/* Read an entry back through a read lease and compare with salt's bytes
 * at its positions. */
static int verify_entry(struct kvp_client *c, const struct kvp_chunk_id *id,
			uint64_t salt, const char *what)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	const uint32_t P = lay->page_tokens;
	struct kvp_lease l;
	unsigned char *got = NULL, *want = NULL;
	struct kvp_slot *slots = NULL;
	int bad = -1;

	if (kvp_chunk_acquire(c, id, 1000, &l)) {
		h_fail("%s: acquire: %s", what, kvp_last_error(c));
		return -1;
	}
	slots = calloc(l.len, sizeof(*slots));
	got = malloc(l.len * lay->token_bytes);
	want = malloc(l.len * lay->token_bytes);
	if (slots && got && want) {
		for (uint32_t i = 0; i < l.len; i++)
			slots[i] = (struct kvp_slot){ (uint32_t)l.indices[i / P], i % P };
		kvp_read_cpu(lay, kvp_device_base(c), slots, (uint32_t)l.len, got);
		h_tokens_fill(lay, salt, 0, l.start, (uint32_t)l.len, want);
		bad = memcmp(got, want, l.len * lay->token_bytes) ? -1 : 0;
		if (bad)
			h_fail("%s: the bytes differ from what the filler wrote", what);
	}
	kvp_release(c, l.id);
	free(slots);
	free(got);
	free(want);
	return bad;
}

/* ------------------------------------------------------------ 1, 2 */

static int second_process(void *arg)
{
	struct kvp_chunk_reg sys, doc, lk;
	struct kvp_lease l;
	struct kvp_client *c;

	(void)arg;
	h_set_name("second");
	c = h_connect_or_fail(g_sock, "second", 5000);
	if (!c)
		return 1;
	if (root(c, 100, 40, KVP_CHUNK_SYSTEM, NULL, &sys) ||
	    root(c, 500, 20, KVP_CHUNK_CONTEXT, NULL, &doc) ||
	    link_after(c, &doc.name, &sys.id, 0x77, &lk))
		return 1;
	g->hits = !sys.created + !doc.created + !lk.created;
	if (memcmp(&lk.id, &g->link, sizeof(lk.id)) || lk.start != 40) {
		h_fail("second process: link id or start %u differs", lk.start);
		return 1;
	}
	if (kvp_chunk_acquire(c, &lk.id, 1000, &l))
		return 1;
	if (l.npages != g->npages || memcmp(l.indices, g->frames, l.npages * 4)) {
		h_fail("second process: the link's pages differ from the filler's");
		return 1;
	}
	kvp_release(c, l.id);
	/* its bytes, written by the first process at positions 40.. */
	if (verify_entry(c, &lk.id, 0x55, "second process"))
		return 1;
	kvp_close(c);
	return 0;
}

static void test_links_and_second_process(struct kvp_client *c)
{
	struct kvp_chunk_reg a, b, doc, la, lb;
	struct kvp_chunk_entry_info rows[8];
	struct kvp_chunk_info ci;
	pid_t pid;
	int n;

	if (root(c, 100, 40, KVP_CHUNK_SYSTEM, NULL, &a) ||
	    root(c, 200, 35, KVP_CHUNK_SYSTEM, NULL, &b) ||
	    root(c, 500, 20, KVP_CHUNK_CONTEXT, NULL, &doc)) {
		g_bad++;
		return;
	}
	CHECK(kvp_chunk_link(c, &doc.name, &a.id, 0, &la) == 0 && la.created &&
	      la.start == 40 && la.lease.start == 40 && la.lease.len == 0 &&
	      la.lease.n_new == 20, "link after a: created %d start %u lease start %"
	      PRIu64 " (%s)", la.created, la.start, la.lease.start, kvp_last_error(c));
	g->npages = la.lease.npages;
	memcpy(g->frames, la.lease.indices, la.lease.npages * 4);
	CHECK(fill_seal(c, &la, 0x55) == 0, "fill the link after a");
	CHECK(link_after(c, &doc.name, &b.id, 0x66, &lb) == 0 && lb.created && lb.start == 35,
	      "link after b: start %u", lb.start);
	CHECK(memcmp(&la.id, &lb.id, sizeof(la.id)) && memcmp(&la.id, &doc.id, sizeof(la.id)),
	      "one name under two parents gave the same entry id");
	CHECK(!memcmp(&la.name, &doc.name, sizeof(la.name)) &&
	      !memcmp(&lb.name, &doc.name, sizeof(la.name)), "a link's name is not its name");
	CHECK(kvp_chunk_get(c, &doc.name, &ci) == 0 && ci.entries == 3 &&
	      !memcmp(&ci.root, &doc.id, sizeof(ci.root)) && ci.tokens == 20 &&
	      ci.pages == 3 * 2, "name row: %u entries, %u pages", ci.entries, ci.pages);
	n = kvp_chunk_entries(c, &doc.name, rows, 8);
	CHECK(n == 3, "entries: %d (%s)", n, kvp_last_error(c));
	for (int i = 0; i < n && i < 3; i++) {
		bool is_a = !memcmp(&rows[i].id, &la.id, 32), is_b = !memcmp(&rows[i].id, &lb.id, 32);
		const struct kvp_chunk_id *want = is_a ? &a.id : is_b ? &b.id : NULL;
		struct kvp_chunk_id zero = { { 0 } };

		CHECK(!memcmp(&rows[i].parent, want ? want : &zero, 32) &&
		      rows[i].start == (is_a ? 40u : is_b ? 35u : 0u) && rows[i].tokens == 20,
		      "entry %d: start %u, parent wrong", i, rows[i].start);
	}
	CHECK(verify_entry(c, &la.id, 0x55, "link after a") == 0, "link after a bytes");
	/* a second process: the same registrations are hits on the same pages */
	g->link = la.id;
	pid = h_fork(second_process, NULL);
	CHECK(pid > 0 && h_wait(pid, 20000) == 0, "the second process failed");
	CHECK(g->hits == 3, "the second process got %d hits of 3", g->hits);
	CHECK(kvp_chunk_get(c, &doc.name, &ci) == 0 && ci.hits >= 1 && ci.entries == 3,
	      "after the second process: hits %" PRIu64 ", entries %u", ci.hits, ci.entries);
	h_log("links: two parents, two entries at 40 and 35; a second process hits");
	kvp_chunk_clear(c, 0);
}

/* ------------------------------------------------------------ 3 */

static void test_batch_grouping(struct kvp_client *c)
{
	struct kvp_chunk_reg s, d, q1, q2, x, l1, l2, bad;
	struct kvp_composition comp;
	char hex[65];
	int rc;

	if (root(c, 1000, 32, KVP_CHUNK_SYSTEM, NULL, &s) ||
	    root(c, 2000, 48, KVP_CHUNK_CONTEXT, NULL, &d) ||
	    root(c, 3000, 5, KVP_CHUNK_QUERY, NULL, &q1) ||
	    root(c, 3100, 7, KVP_CHUNK_QUERY, NULL, &q2) ||
	    link_after(c, &d.name, &s.id, 1, &x) || link_after(c, &q1.name, &x.id, 2, &l1) ||
	    link_after(c, &q2.name, &x.id, 3, &l2)) {
		g_bad++;
		return;
	}
	struct kvp_compose_req r[2] = {
		{ .system = s.id, .contexts = &x.id, .ncontexts = 1, .qo_len = 5,
		  .query = l1.id },
		{ .system = s.id, .contexts = &x.id, .ncontexts = 1, .qo_len = 7,
		  .query = l2.id },
	};
	rc = kvp_compose(c, r, 2, &comp);
	CHECK(rc == 0 && comp.nlevels == 3, "compose: %d (%s)", rc, kvp_last_error(c));
	if (!rc) {
		const struct kvp_cascade_level *l1v = &comp.level[1];

		CHECK(comp.level[0].ngroups == 1 && comp.level[0].qo_indptr[1] == 12,
		      "level 0: %u groups", comp.level[0].ngroups);
		CHECK(l1v->ngroups == 1 && l1v->qo_indptr[0] == 0 && l1v->qo_indptr[1] == 12 &&
		      l1v->kv_indptr[1] == 3 && l1v->kv_last_page_len[0] == 16,
		      "level 1 (the shared context): %u groups, rows to %d, %d pages",
		      l1v->ngroups, l1v->qo_indptr[1], l1v->kv_indptr[1]);
		CHECK(comp.level[2].ngroups == 2 && comp.level[2].qo_indptr[1] == 5 &&
		      comp.level[2].qo_indptr[2] == 12, "level 2: %u groups",
		      comp.level[2].ngroups);
		CHECK(comp.tokens == 2 * (32 + 48) + 5 + 7 && comp.pages == 2 + 3 + 1 + 1,
		      "tokens %" PRIu64 " pages %" PRIu64, comp.tokens, comp.pages);
		kvp_release(c, comp.lease);
	}
	/* q1 linked after the system directly: not after x */
	if (link_after(c, &q1.name, &s.id, 4, &bad) == 0) {
		struct kvp_compose_req br = { .system = s.id, .contexts = &x.id,
					      .ncontexts = 1, .query = bad.id };

		rc = kvp_compose(c, &br, 1, &comp);
		kvp_chunk_id_format(&bad.id, hex);
		CHECK(rc == -EINVAL && strstr(kvp_last_error(c), "chain is broken") &&
		      strstr(kvp_last_error(c), (hex[16] = 0, hex)),
		      "broken chain: %d '%s'", rc, kvp_last_error(c));
		kvp_chunk_id_format(&s.id, hex);
		hex[16] = 0;
		CHECK(strstr(kvp_last_error(c), hex), "the message names the actual parent");
	}
	h_log("grouping: a context shared by two requests is one cascade group");
	kvp_chunk_clear(c, 0);
}

/* ------------------------------------------------------------ 4 */

static void test_delete_cascades(struct kvp_client *c)
{
	struct kvp_chunk_reg s, d, q, x, y;
	struct kvp_chunk_entry_info e;
	struct kvp_stats st;
	uint64_t free0 = frames_free(c);
	int rc;

	if (root(c, 4000, 40, KVP_CHUNK_SYSTEM, NULL, &s) ||
	    root(c, 4100, 20, KVP_CHUNK_CONTEXT, NULL, &d) ||
	    root(c, 4200, 4, KVP_CHUNK_QUERY, NULL, &q) ||
	    link_after(c, &d.name, &s.id, 5, &x) || link_after(c, &q.name, &x.id, 6, &y)) {
		g_bad++;
		return;
	}
	CHECK(frames_free(c) == free0 - (3 + 2 + 1 + 2 + 1), "frames after registering");
	rc = kvp_chunk_delete(c, &s.name);
	CHECK(rc == 3, "delete of the system name: %d entries (%s), want 3 (its root, "
	      "the context and the query below)", rc, kvp_last_error(c));
	CHECK(kvp_chunk_entry(c, &y.id, &e) == -ENOENT, "the query link outlived its ancestor");
	CHECK(kvp_chunk_entry(c, &d.id, &e) == 0 && e.children == 0,
	      "the context's root went too, or keeps a child");
	CHECK(frames_free(c) == free0 - (2 + 1), "frames after the delete");
	CHECK(kvp_chunk_delete(c, &d.name) == 1 && kvp_chunk_delete(c, &q.name) == 1,
	      "delete the other names: %s", kvp_last_error(c));
	frames_back(c, free0, "delete by name");
	CHECK(kvp_stats(c, 0, &st) == 0 && st.chunks == 0 && st.chunk_pages == 0,
	      "stats after the deletes: %" PRIu64 " chunks, %" PRIu64 " pages", st.chunks,
	      st.chunk_pages);
	h_log("delete: by name, with everything below; frames back");
}

/* ------------------------------------------------------------ 5 */

static void test_limits(struct kvp_client *c)
{
	struct kvp_chunk_reg r[6], p, l, big;
	struct kvp_chunk_limits lim;
	struct kvp_chunk_info ci;
	struct kvp_lease hold[4];
	struct kvp_stats s0, s1;
	int rc;

	/* clamped to kvpool.conf's (chunk_memory_ratio 0.5 on this daemon) */
	CHECK(kvp_chunk_limits(c, 3, 0.9, &lim) == 0 && lim.max_chunks == 3 &&
	      lim.memory_ratio == 0.5 && lim.config_memory_ratio == 0.5 &&
	      lim.config_max_chunks == 0 && lim.limit_pages == 128,
	      "limits: max %" PRIu64 " ratio %g (config %g) limit %" PRIu64,
	      lim.max_chunks, lim.memory_ratio, lim.config_memory_ratio, lim.limit_pages);
	kvp_stats(c, 0, &s0);
	for (int i = 0; i < 3; i++)
		if (root(c, 6000 + 100 * (uint32_t)i, 16, KVP_CHUNK_CONTEXT, NULL, &r[i]))
			g_bad++;
	/* touch 0: 1 is the least recently used */
	CHECK(verify_entry(c, &r[0].id, 6000, "touch") == 0, "touch r0");
	CHECK(root(c, 6300, 16, KVP_CHUNK_CONTEXT, NULL, &r[3]) == 0 && r[3].created,
	      "a 4th name past max_chunks 3: %s", kvp_last_error(c));
	CHECK(kvp_chunk_get(c, &r[1].name, &ci) == -ENOENT, "the LRU name survived");
	CHECK(kvp_chunk_get(c, &r[0].name, &ci) == 0, "a recent name was evicted");
	kvp_stats(c, 0, &s1);
	CHECK(s1.chunks == 3 && s1.chunk_evicted == s0.chunk_evicted + 1,
	      "after: %" PRIu64 " chunks, %" PRIu64 " evicted", s1.chunks,
	      s1.chunk_evicted - s0.chunk_evicted);
	/* all held: refused, naming the limit */
	for (int i = 0; i < 3; i++) {
		const struct kvp_chunk_id *id = &r[i == 1 ? 3 : i].id;

		CHECK(kvp_chunk_acquire(c, id, 0, &hold[i]) == 0, "hold: %s", kvp_last_error(c));
	}
	uint32_t t[16];
	ids(t, 16, 6400);
	rc = kvp_chunk_register(c, t, 16, KVP_CHUNK_CONTEXT, NULL, &r[4]);
	CHECK(rc == -ENOMEM && strstr(kvp_last_error(c), "max_chunks"),
	      "everything held: %d '%s'", rc, kvp_last_error(c));
	for (int i = 0; i < 3; i++)
		kvp_release(c, hold[i].id);
	kvp_chunk_clear(c, 0);

	/* memory: 160 pages of the 256 may be chunks at 0.625; 0.125 -> 32 */
	CHECK(kvp_chunk_limits(c, 0, 0.125, &lim) == 0 && lim.limit_pages == 32 &&
	      lim.max_chunks == 0, "limits: %" PRIu64 " pages", lim.limit_pages);
	/* an older parent with a newer child: the child (a leaf) goes first */
	if (root(c, 7000, 8 * 16, KVP_CHUNK_SYSTEM, NULL, &p) ||
	    root(c, 7100, 8 * 16, KVP_CHUNK_CONTEXT, NULL, &r[5]) ||
	    link_after(c, &r[5].name, &p.id, 8, &l)) {
		g_bad++;
		return;
	}
	CHECK(kvp_chunk_delete(c, &r[5].id) == 1, "drop the context's root");
	/* 16 used (p 8, l 8); 20 more pages need 4 freed: l, the only leaf */
	CHECK(root(c, 7200, 20 * 16, KVP_CHUNK_QUERY, NULL, &big) == 0 && big.created,
	      "20 pages under a 32-page limit: %s", kvp_last_error(c));
	CHECK(kvp_chunk_entry(c, &l.id, &(struct kvp_chunk_entry_info){ 0 }) == -ENOENT,
	      "the leaf link survived");
	CHECK(kvp_chunk_get(c, &p.name, &ci) == 0 && ci.entries == 1,
	      "the parent was evicted before its child");
	/* held: nothing to evict */
	CHECK(kvp_chunk_acquire(c, &p.id, 0, &hold[0]) == 0 &&
	      kvp_chunk_acquire(c, &big.id, 0, &hold[1]) == 0, "hold both");
	uint32_t t2[8 * 16];
	ids(t2, 8 * 16, 7300);
	rc = kvp_chunk_register(c, t2, 8 * 16, KVP_CHUNK_QUERY, NULL, &r[4]);
	CHECK(rc == -ENOMEM && strstr(kvp_last_error(c), "chunk_memory_ratio"),
	      "everything held (memory): %d '%s'", rc, kvp_last_error(c));
	kvp_release(c, hold[0].id);
	kvp_release(c, hold[1].id);
	kvp_chunk_limits(c, 0, 0.5, NULL);
	kvp_chunk_clear(c, 0);
	h_log("limits: max_chunks and chunk_memory_ratio evict LRU leaves, -ENOMEM when held");
}

/* ------------------------------------------------------------ 6, 7 */

static void test_content_and_meta(struct kvp_client *c)
{
	char content[2000], got[2000];
	struct kvp_chunk_root rr = { .type = KVP_CHUNK_CONTEXT };
	struct kvp_chunk_reg reg, r2, r3;
	struct kvp_chunk_info rows[8], ci;
	uint32_t t[20], tk[32], nt = 0;
	size_t len = 0;
	int more, n, rc;

	for (size_t i = 0; i < sizeof(content); i++)
		content[i] = (char)('a' + i % 26);
	ids(t, 20, 8000);
	rr.tokens = t;
	rr.n = 20;
	rr.content = content;
	rr.content_len = 1025;
	rc = kvp_chunk_put(c, &rr, &reg);
	CHECK(rc == -E2BIG && strstr(kvp_last_error(c), "chunk_content_max"),
	      "content over chunk_content_max: %d '%s'", rc, kvp_last_error(c));
	rr.content_len = 1000;
	rr.meta = "{\"src\": \"docs\", \"page\": 3, \"tags\": [\"a\", \"b\"], \"ok\": true}";
	rc = kvp_chunk_put(c, &rr, &reg);
	CHECK(rc == 0 && reg.created && fill_seal(c, &reg, 1) == 0, "put: %s",
	      kvp_last_error(c));
	rc = kvp_chunk_content(c, &reg.name, got, sizeof(got), &len);
	CHECK(rc == 1000 && len == 1000 && !memcmp(got, content, 1000),
	      "content back: %d bytes of %zu", rc, len);
	rc = kvp_chunk_tokens(c, &reg.name, tk, 32, &nt);
	CHECK(rc == 20 && nt == 20 && !memcmp(tk, t, sizeof(t)), "tokens back: %d", rc);
	CHECK(kvp_chunk_get(c, &reg.id, &ci) == 0 && ci.content_len == 1000 &&
	      strlen(ci.preview) == KVP_CHUNK_PREVIEW_MAX - 1 &&
	      !strncmp(ci.preview, content, KVP_CHUNK_PREVIEW_MAX - 1) &&
	      !strcmp(ci.meta, "{\"ok\":true,\"page\":3,\"src\":\"docs\",\"tags\":[\"a\",\"b\"]}"),
	      "row: content %u, preview '%s', meta '%s'", ci.content_len, ci.preview, ci.meta);
	if (root(c, 8100, 10, KVP_CHUNK_CONTEXT, "{\"src\": \"docs\", \"page\": 4}", &r2) ||
	    root(c, 8200, 10, KVP_CHUNK_CONTEXT, "src=web,lang=en", &r3))
		g_bad++;
	static const struct { const char *f; int n; } cases[] = {
		{ "{\"page\": 3}", 1 }, { "{\"src\": \"docs\"}", 2 }, { "{\"page\": \"3\"}", 0 },
		{ "{\"tags\": [\"a\", \"b\"]}", 1 }, { "{\"tags\": [\"b\", \"a\"]}", 0 },
		{ "{\"ok\": true, \"page\": 3}", 1 }, { "{\"ok\": false}", 0 },
		{ "src=web", 1 }, { "{\"lang\": \"en\", \"src\": \"web\"}", 1 }, { "{}", 3 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		n = kvp_chunk_list(c, KVP_CHUNK_CONTEXT, cases[i].f, NULL, rows, 8, &more);
		CHECK(n == cases[i].n, "filter %s: %d rows, want %d (%s)", cases[i].f, n,
		      cases[i].n, kvp_last_error(c));
	}
	n = kvp_chunk_list(c, 0, "{\"page\": ", NULL, rows, 8, &more);
	CHECK(n == -EINVAL && strstr(kvp_last_error(c), "filter is not valid JSON"),
	      "bad filter: %d '%s'", n, kvp_last_error(c));
	ids(t, 20, 8300);
	rc = kvp_chunk_register(c, t, 20, KVP_CHUNK_CONTEXT, "[1, 2]", &reg);
	CHECK(rc == -EINVAL && strstr(kvp_last_error(c), "an array, not a JSON object"),
	      "array metadata: %d '%s'", rc, kvp_last_error(c));
	rc = kvp_chunk_register(c, t, 20, KVP_CHUNK_CONTEXT, "{\"a\": }", &reg);
	CHECK(rc == -EINVAL && strstr(kvp_last_error(c), "metadata is not valid JSON"),
	      "bad metadata: %d '%s'", rc, kvp_last_error(c));
	/* the same name with other tokens: named both ways */
	ids(t, 20, 8400);
	rr.meta = NULL;
	rc = kvp_chunk_put(c, &rr, &reg);
	CHECK(rc == -EINVAL && strstr(kvp_last_error(c), "20 tokens") &&
	      strstr(kvp_last_error(c), "delete it first"), "same content, other tokens: "
	      "%d '%s'", rc, kvp_last_error(c));
	kvp_chunk_clear(c, 0);
	h_log("content and metadata: bounded content, JSON filters typed and by subset");
}

/* ------------------------------------------------------------ 8 */

static int killed_filler(void *arg)
{
	struct h_chan *ch = arg;
	struct kvp_chunk_reg reg;
	struct kvp_client *c;
	const struct kvp_layout *lay;
	void *kv;

	h_chan_child_side(ch);
	h_set_name("filler");
	c = h_connect_or_fail(g_sock, "filler", 5000);
	if (!c || kvp_chunk_link(c, &g->name, &g->sys, 0, &reg) || !reg.created) {
		h_fail("link in the filler: %s", c ? kvp_last_error(c) : "no client");
		return 1;
	}
	lay = kvp_client_layout(c);
	kv = calloc(reg.tokens, lay->token_bytes);
	kvp_append(c, &reg.lease, 0, reg.tokens / 2, kv); /* half, then killed */
	g->link = reg.id;
	h_chan_say(ch->to_parent[1], 'f');
	for (;;)
		pause();
}

static void test_killed_link_filler(struct kvp_client *c)
{
	struct kvp_chunk_reg s, d;
	struct kvp_chunk_entry_info e;
	struct h_chan ch;
	uint64_t free0;
	pid_t pid;
	int rc = 0;

	if (root(c, 9000, 40, KVP_CHUNK_SYSTEM, NULL, &s) ||
	    root(c, 9100, 50, KVP_CHUNK_CONTEXT, NULL, &d)) {
		g_bad++;
		return;
	}
	free0 = frames_free(c);
	g->sys = s.id;
	g->name = d.name;
	if (h_chan_open(&ch)) {
		g_bad++;
		return;
	}
	pid = h_fork(killed_filler, &ch);
	h_chan_parent_side(&ch);
	if (h_chan_wait(ch.to_parent[0], 5000) != 'f') {
		g_bad++;
		return;
	}
	CHECK(kvp_chunk_entry(c, &s.id, &e) == 0 && e.children == 1 && e.holders == 0,
	      "while filling: parent has %u children, %u holders", e.children, e.holders);
	CHECK(kvp_chunk_entry(c, &g->link, &e) == 0 && e.state == KVP_CHUNK_FILLING &&
	      e.start == 40, "the link while filling: state %u start %u", e.state, e.start);
	CHECK(frames_free(c) == free0 - 4, "the link's 4 pages are taken");
	kill(pid, SIGKILL);
	h_wait(pid, 5000);
	for (uint64_t until = h_now_ms() + 2000;
	     (rc = kvp_chunk_entry(c, &g->link, &e)) == 0 && h_now_ms() < until;)
		h_sleep_ms(5);
	CHECK(rc == -ENOENT, "the killed filler's link is still there: %d", rc);
	frames_back(c, free0, "killed link filler");
	CHECK(kvp_chunk_entry(c, &s.id, &e) == 0 && e.children == 0 && e.holders == 0,
	      "after: parent has %u children, %u holders", e.children, e.holders);
	/* unpinned: deletable at once, frames freed at once */
	CHECK(kvp_chunk_delete(c, &s.name) == 1, "delete the parent: %s", kvp_last_error(c));
	CHECK(frames_free(c) == free0 + 3, "the parent's 3 pages came back at once");
	h_log("killed link filler: entry gone, parent unpinned, frames back");
	kvp_chunk_clear(c, 0);
}

int main(int argc, char **argv)
{
	struct kvp_client *c;
	struct h_daemon d;
	uint64_t t0;

	h_init(argc, argv, "test_chunk_entries");
	t0 = h_now_ms();
	g = h_shared_zalloc(sizeof(*g));
	if (!g)
		return H_FAIL;
	/* 256 pages of 4 KiB; chunks may take half; 1 KiB of content */
	if (h_daemon_up(&d, "--device_mem=1M", "--workers=2", "--chunk_memory_ratio=0.5",
			"--chunk_content_max=1K", (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	c = h_connect_or_fail(d.sock, "test", 5000);
	if (!c)
		return h_daemon_finish(&d, 1, t0);
	test_links_and_second_process(c);
	test_batch_grouping(c);
	test_delete_cascades(c);
	test_limits(c);
	test_content_and_meta(c);
	test_killed_link_filler(c);
	kvp_close(c);
	return h_daemon_finish(&d, g_bad != 0, t0);
}
