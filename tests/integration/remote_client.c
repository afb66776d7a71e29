/* SPDX-License-Identifier: MIT */
/*
 * remote_client.c - the client side of remote_netns (test_remote_netns.sh):
 *
 *   remote_client SOCK prefill SALT BASE N FLOOD
 *       compute a prompt (tokens BASE .. BASE+N-1) into the prefix cache:
 *       seq_alloc, append h_tokens_fill(SALT), commit, free; then FLOOD
 *       other prompts' pages (freed at once) so the prompt's pages are
 *       evicted from this daemon's device tier into the remote tier.
 *   remote_client SOCK lookup SALT BASE N WANT
 *       look the prompt up: print "cached=T pages=P", exit 1 unless P == WANT
 *       (WANT -1: any, the store may have lost some); then seq_alloc it and
 *       check every cached token's bytes are SALT's (never wrong bytes),
 *       and print "recompute=K" (the tokens left to compute).
 *   remote_client SOCK chunk-put SALT BASE N FLOOD
 *       register a context chunk of tokens BASE .. BASE+N-1 (it must be
 *       new), fill it with SALT's bytes and seal it; then FLOOD tokens of
 *       other prompts push it out of the device tier into the store.
 *   remote_client SOCK chunk-get SALT BASE N HIT
 *       register the same tokens: HIT 1 wants them found sealed (the
 *       store's copy: nothing to compute), then acquired with SALT's bytes;
 *       HIT 0 wants a new entry (the store lost it: compute it).
 *   remote_client SOCK hput SALT USER N FLOOD
 *       commit a history of N tokens (h_tokens_fill(SALT)) for USER, then
 *       FLOOD tokens of other users' histories (USER+1, ...) so that
 *       eviction drops USER's from both of this daemon's tiers (with
 *       remote_user_histories = yes it is written to the remote tier).
 *   remote_client SOCK hget SALT USER N
 *       prepare USER read-only and check it holds those N tokens, byte for
 *       byte SALT's (a node that never saw USER: from the remote tier);
 *       print "len=L prepare_ms=T" (N 0: a user nobody has, a miss).
 *
 * Exit 0 when all held, 1 otherwise (with a FAIL line).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "kvpool.h"

static uint32_t *prompt(uint32_t base, uint32_t n)
{
	uint32_t *t = malloc((size_t)n * sizeof(*t));

	for (uint32_t i = 0; t && i < n; i++)
		t[i] = base + i;
	return t;
}

/* seq_alloc tokens, write SALT's bytes into what is not cached, commit, free. */
static int compute(struct kvp_client *c, uint64_t seq, const uint32_t *t, uint32_t n,
		   uint64_t salt)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	struct kvp_lease l = { 0 };
	unsigned char *kv;
	int rc = kvp_seq_alloc(c, seq, t, n, &l);

	if (rc) {
		h_fail("seq_alloc of %" PRIu32 " tokens: %s", n, kvp_last_error(c));
		return rc;
	}
	kv = malloc((size_t)l.n_new * lay->token_bytes);
	if (!kv)
		return -ENOMEM;
	h_tokens_fill(lay, salt, 0, l.len, l.n_new, kv);
	rc = kvp_append(c, &l, 0, l.n_new, kv);
	if (!rc)
		rc = kvp_commit(c, l.id, l.n_new);
	if (!rc)
		rc = kvp_release(c, l.id);
	if (!rc)
		rc = kvp_seq_free(c, seq);
	if (rc)
		h_fail("computing %" PRIu32 " tokens: %s", n, kvp_last_error(c));
	free(kv);
	return rc;
}

static int prefill(struct kvp_client *c, uint64_t salt, uint32_t base, uint32_t n,
		   uint32_t flood)
{
	uint32_t *t = prompt(base, n);
	int rc = t ? compute(c, 1, t, n, salt) : -ENOMEM;

	free(t);
	/* Other prompts, FLOOD tokens in all: the LRU evicts ours first. */
	for (uint32_t done = 0, k = 0; !rc && done < flood; done += n, k++) {
		t = prompt(base + 1000000 + k * n, n);
		rc = t ? compute(c, 2 + k, t, n, salt + 1) : -ENOMEM;
		free(t);
	}
	return rc ? 1 : 0;
}

static int hput(struct kvp_client *c, uint64_t salt, uint64_t user, uint32_t n,
		uint32_t flood)
{
	int rc = h_append_cycle(c, salt, user, 0, n, 0);

	for (uint32_t done = 0, k = 1; !rc && done < flood; done += n, k++)
		rc = h_append_cycle(c, salt + 1, user + k, 0, n, 0);
	return rc ? 1 : 0;
}

static int hget(struct kvp_client *c, uint64_t salt, uint64_t user, uint32_t n)
{
	struct kvp_lease l = { 0 };
	struct timespec t0, t1;
	int rc;

	/* A prepare first: the daemon knows nothing of the user until it asks
	 * the store (info would say there is none). Its wall time is the
	 * store's price: one round for a user it has not, two for one it has. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (kvp_prepare(c, user, n, 0, &l)) {
		h_fail("prepare of user %" PRIu64 ": %s", user, kvp_last_error(c));
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("len=%" PRIu64 " prepare_ms=%.2f\n", l.len,
	       (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
	rc = l.start != 0 || l.len != n;
	if (rc)
		h_fail("user %" PRIu64 ": [%" PRIu64 ", +%" PRIu64 ") cached, want "
		       "[0, +%" PRIu32 ")", user, l.start, l.len, n);
	else
		rc = h_same_bytes(c, l.indices, salt, user, n, "the history") != 0;
	if (kvp_release(c, l.id)) {
		h_fail("release: %s", kvp_last_error(c));
		rc = 1;
	}
	return rc;
}

static int lookup(struct kvp_client *c, uint64_t salt, uint32_t base, uint32_t n,
		  long want)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	uint32_t *t = prompt(base, n), P = lay->page_tokens;
	struct kvp_prefix_hit hit = { 0 };
	struct kvp_slot *slots = NULL;
	unsigned char *got = NULL, *exp = NULL;
	struct kvp_lease l = { 0 };
	int rc = 1;

	if (!t || kvp_prefix_lookup(c, t, n, &hit) < 0) {
		h_fail("prefix_lookup: %s", t ? kvp_last_error(c) : "no memory");
		goto out;
	}
	printf("cached=%" PRIu32 " pages=%" PRIu32 "\n", hit.tokens, hit.npages);
	if (want >= 0 && hit.npages != (uint32_t)want) {
		h_fail("prefix_lookup: %" PRIu32 " pages cached, want %ld", hit.npages, want);
		goto out;
	}
	/* The cached pages are what a sequence starts from: read them back. */
	if (kvp_seq_alloc(c, 1, t, n, &l)) {
		h_fail("seq_alloc: %s", kvp_last_error(c));
		goto out;
	}
	printf("recompute=%" PRIu32 "\n", l.n_new);
	slots = calloc(l.len + 1, sizeof(*slots));
	got = malloc((l.len + 1) * lay->token_bytes);
	exp = malloc((l.len + 1) * lay->token_bytes);
	if (!slots || !got || !exp)
		goto out;
	for (uint64_t i = 0; i < l.len; i++)
		slots[i] = (struct kvp_slot){ (uint32_t)l.indices[i / P], (uint32_t)(i % P) };
	kvp_read_cpu(lay, kvp_device_base(c), slots, (uint32_t)l.len, got);
	h_tokens_fill(lay, salt, 0, 0, (uint32_t)l.len, exp);
	for (uint64_t i = 0; i < l.len; i++)
		if (memcmp(got + i * lay->token_bytes, exp + i * lay->token_bytes,
			   lay->token_bytes)) {
			h_fail("token %" PRIu64 " of the cached prefix differs from what "
			       "the other node computed", i);
			goto out;
		}
	if (kvp_release(c, l.id) || kvp_seq_free(c, 1)) {
		h_fail("release: %s", kvp_last_error(c));
		goto out;
	}
	rc = 0;
out:
	free(t);
	free(slots);
	free(got);
	free(exp);
	return rc;
}

/* The lease's tokens [0, n) hold SALT's bytes. */
static int lease_bytes_are(struct kvp_client *c, const struct kvp_lease *l,
			   uint32_t n, uint64_t salt)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	struct kvp_slot *slots = calloc(n, sizeof(*slots));
	unsigned char *got = malloc((size_t)n * lay->token_bytes);
	unsigned char *exp = malloc((size_t)n * lay->token_bytes);
	uint32_t P = lay->page_tokens;
	int rc = 1;

	if (!slots || !got || !exp)
		goto out;
	for (uint32_t i = 0; i < n; i++)
		slots[i] = (struct kvp_slot){ (uint32_t)l->indices[i / P], i % P };
	kvp_read_cpu(lay, kvp_device_base(c), slots, n, got);
	h_tokens_fill(lay, salt, 0, 0, n, exp);
	rc = 0;
	for (uint32_t i = 0; i < n && !rc; i++)
		if (memcmp(got + (size_t)i * lay->token_bytes,
			   exp + (size_t)i * lay->token_bytes, lay->token_bytes)) {
			h_fail("chunk token %" PRIu32 " differs from what the other "
			       "node computed", i);
			rc = 1;
		}
out:
	free(slots);
	free(got);
	free(exp);
	return rc;
}

static int chunk_put(struct kvp_client *c, uint64_t salt, uint32_t base, uint32_t n,
		     uint32_t flood)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	uint32_t *t = prompt(base, n);
	struct kvp_chunk_reg r = { 0 };
	unsigned char *kv = malloc((size_t)n * lay->token_bytes);
	int rc = 1;

	if (!t || !kv)
		goto out;
	if (kvp_chunk_register(c, t, n, KVP_CHUNK_CONTEXT, "{\"doc\":\"netns\"}", &r)) {
		h_fail("chunk_register: %s", kvp_last_error(c));
		goto out;
	}
	if (!r.created) {
		h_fail("chunk_register: the chunk exists already");
		goto out;
	}
	h_tokens_fill(lay, salt, 0, 0, n, kv);
	if (kvp_append(c, &r.lease, 0, n, kv) || kvp_chunk_seal(c, &r)) {
		h_fail("filling the chunk: %s", kvp_last_error(c));
		goto out;
	}
	rc = 0;
	/* Other prompts push it out, to the store. */
	for (uint32_t done = 0, k = 0; !rc && done < flood; done += n, k++) {
		uint32_t *o = prompt(base + 2000000 + k * n, n);

		rc = o ? compute(c, 100 + k, o, n, salt + 1) : 1;
		free(o);
	}
out:
	free(t);
	free(kv);
	return rc ? 1 : 0;
}

static int chunk_get(struct kvp_client *c, uint64_t salt, uint32_t base, uint32_t n,
		     int want_hit)
{
	uint32_t *t = prompt(base, n);
	struct kvp_chunk_reg r = { 0 };
	struct kvp_lease l = { 0 };
	int rc = 1;

	if (!t || kvp_chunk_register(c, t, n, KVP_CHUNK_CONTEXT, NULL, &r)) {
		h_fail("chunk_register: %s", t ? kvp_last_error(c) : "no memory");
		goto out;
	}
	printf("created=%d\n", r.created);
	if (r.created == want_hit) {
		h_fail("chunk_register: created=%d, want %d", r.created, !want_hit);
		goto out;
	}
	if (r.created) { /* a miss: this node computes it */
		rc = kvp_chunk_delete(c, &r.id) < 0 ? 1 : 0;
		goto out;
	}
	if (kvp_chunk_acquire(c, &r.id, 0, &l)) {
		h_fail("chunk_acquire: %s", kvp_last_error(c));
		goto out;
	}
	rc = lease_bytes_are(c, &l, n, salt);
	if (kvp_release(c, l.id))
		rc = 1;
out:
	free(t);
	return rc;
}

int main(int argc, char **argv)
{
	struct kvp_client *c;
	int rc;

	if (argc < 6 || (argc < 7 && strcmp(argv[2], "hget"))) {
		fprintf(stderr, "usage: remote_client SOCK prefill SALT BASE N FLOOD\n"
			"       remote_client SOCK lookup SALT BASE N WANT_PAGES|-1\n"
			"       remote_client SOCK chunk-put SALT BASE N FLOOD\n"
			"       remote_client SOCK chunk-get SALT BASE N HIT\n"
			"       remote_client SOCK hput SALT USER N FLOOD\n"
			"       remote_client SOCK hget SALT USER N\n");
		return 2;
	}
	h_set_name(argv[2]);
	c = h_connect_or_fail(argv[1], argv[2], 5000);
	if (!c)
		return 1;
	if (!strcmp(argv[2], "chunk-put"))
		rc = chunk_put(c, strtoull(argv[3], NULL, 0), (uint32_t)strtoul(argv[4], NULL, 0),
			       (uint32_t)strtoul(argv[5], NULL, 0),
			       (uint32_t)strtoul(argv[6], NULL, 0));
	else if (!strcmp(argv[2], "chunk-get"))
		rc = chunk_get(c, strtoull(argv[3], NULL, 0), (uint32_t)strtoul(argv[4], NULL, 0),
			       (uint32_t)strtoul(argv[5], NULL, 0), atoi(argv[6]));
	else if (!strcmp(argv[2], "hput"))
		rc = hput(c, strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0),
			  (uint32_t)strtoul(argv[5], NULL, 0),
			  (uint32_t)strtoul(argv[6], NULL, 0));
	else if (!strcmp(argv[2], "hget"))
		rc = hget(c, strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0),
			  (uint32_t)strtoul(argv[5], NULL, 0));
	else if (!strcmp(argv[2], "prefill"))
		rc = prefill(c, strtoull(argv[3], NULL, 0), (uint32_t)strtoul(argv[4], NULL, 0),
			     (uint32_t)strtoul(argv[5], NULL, 0),
			     (uint32_t)strtoul(argv[6], NULL, 0));
	else
		rc = lookup(c, strtoull(argv[3], NULL, 0), (uint32_t)strtoul(argv[4], NULL, 0),
			    (uint32_t)strtoul(argv[5], NULL, 0), strtol(argv[6], NULL, 0));
	kvp_close(c);
	return rc;
}
