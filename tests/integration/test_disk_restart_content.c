/* SPDX-License-Identifier: MIT */
/*
 * test_disk_restart_content (ctest disk_restart_content) - prefix pages, chunks and
 * sequences over the disk tier of a real kvpoold (shm backend).
 *
 * The device tier holds 16 pages of 16 tokens; a user history of 16 pages
 * (the "hog") pushes whatever the shared world has idle out of it, which
 * goes to the disk tier instead of being dropped.
 *
 *  1. prefix:  a writer process seq_alloc's 80 tokens (5 pages), fills,
 *              commits and frees them; a hog pushes them to disk; another
 *              client's kvp_prefix_lookup reports all 80 cached, and its
 *              seq_alloc reads the writer's bytes;
 *  2. chunk:   a chunk of 100 tokens with metadata, filled and sealed, is
 *              pushed to disk; another client acquires it by entry id
 *              (bytes equal), then again (pushed out once more) by name,
 *              and its metadata came back with it; `kvctl chunks`
 *              counts it while it is on disk;
 *  3. seq:     a user pushed to disk (offload --tier disk) is a source of
 *              kvp_seq_create: the sequence reads the user's bytes;
 *  3b. uds:   a prepare in the uds request mode of a user only on disk
 *              waits for the read and answers with the history;
 *  3c. churn: three processes run sequences over random prompts and
 *              register and acquire random chunks, of sets larger than the
 *              device tier: every cached byte is the prompt's or chunk's,
 *              whether in memory or brought back from disk;
 *  4. kill -9: prefix pages and the chunk on disk, kvpoold SIGKILLed, then
 *              started on the same disk_dir: the lookup reports the 80
 *              tokens cached and the chunk is served, bytes equal;
 *  5. stop:    those back in memory, SIGTERM: the clean stop writes them
 *              to disk, and the next start serves them again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define PROMPT 80u            /* 5 full pages */
#define PROMPT_PAGES 5u
#define CHUNK_TOKENS 100u     /* 7 pages, the last partial */
#define S_PREFIX 0x9e1ull
#define S_CHUNK 0xc4ull
#define S_USER 0x5eull
#define META "doc=disk.pdf"

static char g_disk[256], g_adisk[300];
static const char *g_sock;
static uint64_t g_hog = 90000;
static int g_bad;

static int start(struct h_daemon *d)
{
	return h_daemon_start(d, 10000, "--device_mem=64K", "--host_mem=256K",
			      g_adisk, "--disk_size=8M", "--reclaim=no",
			      "--workers=2", NULL);
}

/* A fresh hog fills the device tier, then goes to the host tier: whatever
 * the shared world had idle went down to disk. */
static int push_out(struct kvp_client *c)
{
	uint64_t u = ++g_hog;

	for (uint32_t k = 0; k < 16; k++)
		if (h_append_cycle(c, S_USER, u, UINT64_MAX, H_PAGE_TOKENS, 0))
			return -1;
	if (kvp_evict(c, u, KVP_SEL_DEVICE) < 0) {
		h_fail("evict the hog: %s", kvp_last_error(c));
		return -1;
	}
	return 0;
}

static int stats_of(struct kvp_client *c, struct kvp_stats *st)
{
	if (kvp_stats(c, 0, st)) {
		h_fail("stats: %s", kvp_last_error(c));
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------ 1. prefix */

static int prefix_writer_main(void *arg)
{
	uint32_t t[PROMPT];
	struct kvp_lease l;
	struct kvp_client *c = h_connect_or_fail(g_sock, "prefix-writer", 5000);

	(void)arg;
	if (!c)
		return 1;
	h_token_ids(t, PROMPT, 0x4000);
	if (kvp_seq_alloc(c, 4242, t, PROMPT, &l) || l.n_new != PROMPT ||
	    h_fill_lease(c, &l, S_PREFIX, PROMPT) || kvp_commit(c, l.id, PROMPT) ||
	    kvp_release(c, l.id) || kvp_seq_free(c, 4242)) {
		h_fail("prefix writer: %s", kvp_last_error(c));
		return 1;
	}
	kvp_close(c);
	return 0;
}

/* The lookup reports all PROMPT tokens of PROMPT + 1 cached, and a
 * sequence over them reads the writer's bytes. */
static int prefix_served(struct kvp_client *c, const char *when)
{
	uint32_t t[PROMPT + 1];
	struct kvp_prefix_hit hit;
	struct kvp_lease l;
	int rc, bad = 0;

	h_token_ids(t, PROMPT + 1, 0x4000);
	rc = kvp_prefix_lookup(c, t, PROMPT + 1, &hit);
	if (rc != (int)PROMPT || hit.npages != PROMPT_PAGES) {
		h_fail("prefix %s: lookup: %d tokens in %u pages; want %u in %u (%s)",
		       when, rc, hit.npages, PROMPT, PROMPT_PAGES, kvp_last_error(c));
		return 1;
	}
	rc = kvp_seq_alloc(c, 77, t, PROMPT + 1, &l);
	if (rc || l.len != PROMPT) {
		h_fail("prefix %s: seq_alloc: %d, len %" PRIu64 " (%s)", when, rc,
		       l.len, kvp_last_error(c));
		return 1;
	}
	if (h_same_bytes(c, l.indices, S_PREFIX, 0, PROMPT, "prefix pages from disk"))
		bad++;
	if (kvp_release(c, l.id) || kvp_seq_free(c, 77)) {
		h_fail("prefix %s: free: %s", when, kvp_last_error(c));
		bad++;
	}
	return bad;
}

static void phase_prefix(void)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "prefix", 5000);
	struct kvp_stats st;

	if (!c || h_wait(h_fork(prefix_writer_main, NULL), 10000) != 0) {
		g_bad++;
		return;
	}
	if (push_out(c) || stats_of(c, &st)) {
		g_bad++;
		return;
	}
	if (st.prefix_pages || st.disk_prefix_pages != PROMPT_PAGES) {
		h_fail("prefix: after the push %" PRIu64 " pages in memory, %" PRIu64
		       " on disk; want 0 and %u", st.prefix_pages,
		       st.disk_prefix_pages, PROMPT_PAGES);
		g_bad++;
	}
	g_bad += prefix_served(c, "from disk");
	kvp_close(c);
	h_log("prefix: %u pages evicted to disk came back for another client",
	      PROMPT_PAGES);
}

/* ------------------------------------------------------------ 2. chunk */

/* `kvctl chunks --json` counts the chunk on disk (when the test was given
 * kvctl). */
static int kvctl_counts_disk(void)
{
	char cmd[512], out[8192];
	size_t n;
	FILE *p;
	int st;

	if (!h_kvctl_path)
		return 0;
	snprintf(cmd, sizeof(cmd), "%s --socket %s chunks --json", h_kvctl_path,
		 g_sock);
	p = popen(cmd, "r");
	if (!p)
		return 1;
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	if (st != 0 || !strstr(out, "\"disk_chunks\": 1,")) {
		h_fail("kvctl chunks --json (status %d) does not count the chunk on "
		       "disk:\n%s", st, out);
		return 1;
	}
	return 0;
}

static struct kvp_chunk_reg g_reg;

/* Acquire id (waiting) and compare; its metadata is META. */
static int chunk_served(struct kvp_client *c, const struct kvp_chunk_id *id,
			const char *how)
{
	struct kvp_chunk_info ci;
	struct kvp_lease l;
	int bad = 0;

	if (kvp_chunk_acquire(c, id, 2000, &l)) {
		h_fail("chunk %s: acquire: %s", how, kvp_last_error(c));
		return 1;
	}
	if (l.len != CHUNK_TOKENS ||
	    h_same_bytes(c, l.indices, S_CHUNK, 0, CHUNK_TOKENS, "chunk from disk"))
		bad++;
	kvp_release(c, l.id);
	if (kvp_chunk_get(c, id, &ci) || !strstr(ci.meta, "disk.pdf")) {
		h_fail("chunk %s: metadata back from disk is '%s' (%s)", how, ci.meta,
		       kvp_last_error(c));
		bad++;
	}
	return bad;
}

static void phase_chunk(void)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "chunk", 5000);
	struct kvp_client *r = h_connect_or_fail(g_sock, "chunk-reader", 5000);
	uint32_t t[CHUNK_TOKENS];
	struct kvp_stats st;

	if (!c || !r) {
		g_bad++;
		return;
	}
	h_token_ids(t, CHUNK_TOKENS, 0x7000);
	if (kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_CONTEXT, META, &g_reg) ||
	    !g_reg.created || h_fill_lease(c, &g_reg.lease, S_CHUNK, CHUNK_TOKENS) ||
	    kvp_chunk_seal(c, &g_reg)) {
		h_fail("chunk: register and fill: %s", kvp_last_error(c));
		g_bad++;
		return;
	}
	if (push_out(c) || stats_of(c, &st)) {
		g_bad++;
		return;
	}
	if (st.chunks || st.disk_chunks != 1) {
		h_fail("chunk: after the push %" PRIu64 " in memory, %" PRIu64
		       " on disk; want 0 and 1", st.chunks, st.disk_chunks);
		g_bad++;
	}
	g_bad += kvctl_counts_disk();
	g_bad += chunk_served(r, &g_reg.id, "by entry id");
	if (push_out(c)) {
		g_bad++;
		return;
	}
	g_bad += chunk_served(r, &g_reg.name, "by name");
	kvp_close(c);
	kvp_close(r);
	h_log("chunk: evicted to disk, acquired back by id and by name");
}

/* ------------------------------------------------------------ 3. seq */

static void phase_seq(void)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "seq", 5000);
	struct kvp_seq_src src = { .kind = KVP_SRC_USER, .id = 777 };
	struct kvp_user_info ui;
	struct kvp_lease l;
	int rc;

	if (!c) {
		g_bad++;
		return;
	}
	for (uint32_t k = 0; k < 3; k++)
		if (h_append_cycle(c, S_USER, 777, UINT64_MAX, H_PAGE_TOKENS, 0))
			g_bad++;
	if (kvp_evict(c, 777, KVP_SEL_TO_DISK) != 3 || kvp_info(c, 777, &ui) ||
	    ui.pages_device || ui.pages_host) {
		h_fail("seq: the user did not go to disk only (%s)", kvp_last_error(c));
		g_bad++;
	}
	rc = kvp_seq_create(c, 5, &src, 1, 1, &l);
	if (rc || l.len != 3 * H_PAGE_TOKENS) {
		h_fail("seq: seq_create over a user on disk: %d, len %" PRIu64 " (%s)",
		       rc, l.len, kvp_last_error(c));
		g_bad++;
	} else {
		if (h_same_bytes(c, l.indices, S_USER, 777, 3 * H_PAGE_TOKENS,
			       "a sequence over a user from disk"))
			g_bad++;
		kvp_release(c, l.id);
		kvp_seq_free(c, 5);
	}
	kvp_close(c);
	h_log("seq: built over a user only on disk");
}

/* ------------------------------------------------------------ 3b. uds */

/* A uds prepare of a user only on disk waits for the read and answers
 * with the whole history (it once answered at once, with nothing). */
static void phase_uds(void)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "uds-setup", 5000);
	struct kvp_sqe q = { .opcode = KVP_OP_PREPARE, .user = 778,
			     .arg = 2 * H_PAGE_TOKENS, /* read-only: at its end */
			     .n = 0, .tag = 0x5d5, .out_len = 4096 };
	union {
		struct kvp_prepare_out po;
		unsigned char b[4096];
	} out;
	struct kvp_cqe cqe;
	struct h_raw r;
	char err[256];
	int rc;

	if (!c) {
		g_bad++;
		return;
	}
	for (uint32_t k = 0; k < 2; k++)
		if (h_append_cycle(c, S_USER, 778, UINT64_MAX, H_PAGE_TOKENS, 0))
			g_bad++;
	if (kvp_evict(c, 778, KVP_SEL_TO_DISK) != 2) {
		h_fail("uds: user 778 did not go to disk (%s)", kvp_last_error(c));
		g_bad++;
	}
	kvp_close(c);
	if (h_raw_attach(&r, g_sock, 0, 0, err, sizeof(err))) {
		h_fail("uds client: %s", err);
		g_bad++;
		return;
	}
	memset(&out, 0, sizeof(out));
	rc = h_uds_call(r.sock, &q, &cqe, &out, sizeof(out));
	if (rc || cqe.tag != q.tag || cqe.res || out.po.len != 2 * H_PAGE_TOKENS ||
	    out.po.npages != 2) {
		h_fail("uds: prepare of a user on disk: %d, res %d, tag %#" PRIx64
		       ", len %" PRIu64 " in %u pages; want 0, 0, %u in 2", rc,
		       cqe.res, cqe.tag, out.po.len, out.po.npages, 2 * H_PAGE_TOKENS);
		g_bad++;
	} else {
		struct kvp_sqe rel = { .opcode = KVP_OP_RELEASE, .arg = out.po.lease,
				       .tag = 0x5d6 };

		if (h_uds_call(r.sock, &rel, &cqe, NULL, 0) || cqe.res) {
			h_fail("uds: release: res %d", cqe.res);
			g_bad++;
		}
	}
	h_raw_detach(&r);
	h_log("uds: a prepare of a user on disk waited for it");
}

/* ------------------------------------------------------------ 3c. churn */

#define CHURN_PROCS 3
#define CHURN_PROMPTS 8u      /* 40 pages: the device tier holds 16 */
#define CHURN_ROUNDS 100u

#define CHURN_CHUNKS 4u       /* of 7 pages each */

/*
 * A random chunk of CHURN_CHUNKS: registered (filled and sealed when this
 * call made it) or found (in memory or on disk), then acquired and read:
 * its bytes are the chunk's. 0, or 1 with a message.
 */
static int churn_chunk(struct kvp_client *c, struct h_rng *rng)
{
	uint32_t q = (uint32_t)h_rng_below(rng, CHURN_CHUNKS), t[CHUNK_TOKENS];
	struct kvp_chunk_reg reg;
	struct kvp_lease l;
	int rc, tries = 0;

	h_token_ids(t, CHUNK_TOKENS, 0x900000 + 0x1000 * q);
	while ((rc = kvp_chunk_register(c, t, CHUNK_TOKENS, KVP_CHUNK_CONTEXT,
					NULL, &reg)) == -ENOMEM && ++tries < 5000)
		h_sleep_us(200);
	if (rc) {
		h_fail("churn: register chunk %u: %s", q, kvp_last_error(c));
		return 1;
	}
	if (reg.created && (h_fill_lease(c, &reg.lease, S_CHUNK + q, CHUNK_TOKENS) ||
			    kvp_chunk_seal(c, &reg)))
		return 1;
	while ((rc = kvp_chunk_acquire(c, &reg.id, 5000, &l)) == -ENOMEM &&
	       ++tries < 5000)
		h_sleep_us(200);
	if (rc == -ENOENT)
		return 0; /* evicted (and dropped: a name too big?) meanwhile */
	if (rc) {
		h_fail("churn: acquire chunk %u: %s", q, kvp_last_error(c));
		return 1;
	}
	rc = h_same_bytes(c, l.indices, S_CHUNK + q, 0, CHUNK_TOKENS,
			"churn: a chunk") ? 1 : 0;
	kvp_release(c, l.id);
	return rc;
}

/*
 * One process: sequences over random prompts of a set larger than the
 * device tier, each prompt's bytes a pure function of its index, and
 * chunks likewise. What a seq_alloc finds cached (in memory or brought
 * back from disk, perhaps being read for another process) must be that
 * prompt's bytes; what it does not find is written and committed, and
 * published for the others.
 */
static int churn_main(void *arg)
{
	const uintptr_t me = (uintptr_t)arg;
	struct kvp_client *c = h_connect_or_fail(g_sock, "churn", 5000);
	const struct kvp_layout *lay;
	struct h_rng rng;
	uint32_t t[PROMPT + 1];
	void *kv;

	if (!c)
		return 1;
	lay = kvp_client_layout(c);
	kv = malloc((size_t)(PROMPT + 1) * lay->token_bytes);
	if (!kv)
		return 1;
	h_rng_seed(&rng, 0xc4u + me);
	for (uint32_t round = 0; round < CHURN_ROUNDS; round++) {
		uint32_t p = (uint32_t)h_rng_below(&rng, CHURN_PROMPTS);
		uint64_t seq = 1000 * (me + 1) + round;
		struct kvp_lease l;
		int rc, tries = 0;

		h_token_ids(t, PROMPT + 1, 0x10000 * (p + 1));
		/* Three sequences of 6 pages do not fit 16 at once: -ENOMEM
		 * while the others hold theirs, for a moment. */
		while ((rc = kvp_seq_alloc(c, seq, t, PROMPT + 1, &l)) == -ENOMEM &&
		       ++tries < 5000)
			h_sleep_us(200);
		if (rc) {
			h_fail("churn: seq_alloc of prompt %u: %s", p, kvp_last_error(c));
			return 1;
		}
		if (l.len && h_same_bytes(c, l.indices, S_PREFIX + p, 0, (uint32_t)l.len,
					"churn: a cached prompt"))
			return 1;
		h_tokens_fill(lay, S_PREFIX + p, 0, l.len, l.n_new, kv);
		if (kvp_append(c, &l, 0, l.n_new, kv) || kvp_commit(c, l.id, l.n_new) ||
		    kvp_release(c, l.id) || kvp_seq_free(c, seq)) {
			h_fail("churn: write prompt %u: %s", p, kvp_last_error(c));
			return 1;
		}
		if (churn_chunk(c, &rng))
			return 1;
	}
	free(kv);
	kvp_close(c);
	return 0;
}

static void phase_churn(void)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "churn-stats", 5000);
	pid_t pids[CHURN_PROCS];
	struct kvp_stats st;

	for (uintptr_t i = 0; i < CHURN_PROCS; i++)
		pids[i] = h_fork(churn_main, (void *)i);
	if (h_wait_all(pids, CHURN_PROCS, 60000)) {
		h_fail("churn: a process failed");
		g_bad++;
	}
	if (!c || stats_of(c, &st)) {
		g_bad++;
		return;
	}
	if (!st.disk_read_pages || !st.prefix_hit_tokens) {
		h_fail("churn: nothing came back from disk (%" PRIu64 " pages read, %"
		       PRIu64 " tokens hit)", st.disk_read_pages, st.prefix_hit_tokens);
		g_bad++;
	}
	kvp_close(c);
	h_log("churn: %d processes, %u rounds over %u prompts and %u chunks: "
	      "every cached byte right (%" PRIu64 " pages read back from disk so "
	      "far)", CHURN_PROCS, CHURN_ROUNDS, CHURN_PROMPTS, CHURN_CHUNKS,
	      st.disk_read_pages);
}

/* ------------------------------------------------------------ 4. kill -9 */

static void phase_kill(struct h_daemon *d)
{
	struct kvp_client *c = h_connect_or_fail(g_sock, "kill", 5000);
	struct kvp_stats st;

	if (!c || push_out(c) || stats_of(c, &st)) {
		g_bad++;
		return;
	}
	if (st.disk_prefix_pages < PROMPT_PAGES || st.disk_chunks < 1) {
		h_fail("kill: before it %" PRIu64 " prefix pages and %" PRIu64
		       " chunks on disk; want %u and 1 at least", st.disk_prefix_pages,
		       st.disk_chunks, PROMPT_PAGES);
		g_bad++;
	}
	kvp_close(c);
	h_sleep_ms(500); /* the disk thread writes at once; no clean stop */
	h_daemon_kill(d);
	if (start(d)) {
		g_bad++;
		return;
	}
	c = h_connect_or_fail(g_sock, "after-kill", 5000);
	if (!c) {
		g_bad++;
		return;
	}
	g_bad += prefix_served(c, "after kill -9");
	g_bad += chunk_served(c, &g_reg.name, "after kill -9");
	kvp_close(c);
	h_log("kill -9: prefix pages and the chunk served from disk after a restart");
}

/* ------------------------------------------------------------ 5. stop */

/* After phase 4 the prefix pages and the chunk are in memory again (idle,
 * unheld): a clean stop writes them to disk, the next start serves them. */
static void phase_clean_stop(struct h_daemon *d)
{
	struct kvp_client *c;
	struct kvp_stats st;

	if (h_daemon_stop(d, 10000) || start(d)) {
		g_bad++;
		return;
	}
	c = h_connect_or_fail(g_sock, "after-stop", 5000);
	if (!c || stats_of(c, &st)) {
		g_bad++;
		return;
	}
	if (st.prefix_pages || st.chunks || st.disk_prefix_pages < PROMPT_PAGES ||
	    st.disk_chunks < 1) {
		h_fail("stop: after the restart %" PRIu64 " prefix pages and %" PRIu64
		       " chunks in memory, %" PRIu64 " and %" PRIu64 " on disk; want "
		       "0, 0, %u and 1 at least", st.prefix_pages, st.chunks,
		       st.disk_prefix_pages, st.disk_chunks, PROMPT_PAGES);
		g_bad++;
	}
	g_bad += prefix_served(c, "after a clean stop");
	g_bad += chunk_served(c, &g_reg.id, "after a clean stop");
	kvp_close(c);
	h_log("stop: a clean stop wrote the prefix pages and the chunk to disk");
}

int main(int argc, char **argv)
{
	uint64_t t0 = h_now_ms();
	struct h_daemon d;

	h_init(argc, argv, "disk_restart_content");
	if (h_daemon_dir(&d, 0))
		return H_FAIL;
	snprintf(g_disk, sizeof(g_disk), "%s/disk", d.dir);
	snprintf(g_adisk, sizeof(g_adisk), "--disk_dir=%s", g_disk);
	if (mkdir(g_disk, 0700)) {
		h_fail("mkdir %s: %m", g_disk);
		return H_FAIL;
	}
	g_sock = d.sock;
	if (start(&d))
		return h_daemon_end(&d, 1);
	phase_prefix();
	phase_chunk();
	phase_seq();
	phase_uds();
	phase_churn();
	phase_kill(&d);
	phase_clean_stop(&d);
	return h_daemon_finish(&d, g_bad, t0);
}
