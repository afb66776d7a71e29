/* SPDX-License-Identifier: MIT */
/*
 * bench_disk_prepare.c - kvbench disk's end-to-end figure: a history only
 * on disk brought back by a reader prepare, through a real kvpoold.
 *
 * A private kvpoold (shm backend, daemon_proc.h) with a disk tier in the
 * directory under test: one user's history of --prepare-size bytes is
 * appended and committed, pushed to disk (kvp_evict KVP_SEL_TO_DISK, as
 * `kvctl offload --tier disk`), and once the disk thread has written it
 * (the stats say so) a reader prepare brings it back disk -> host -> device. The prepare's wall time is the figure: the disk
 * read, the checks, the copies into host and device frames, and the ring
 * round trips while the worker retries. The bytes are compared afterwards.
 * On the device machine, tools/disk_recompute.py measures the same path
 * with a GPU behind it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_disk.h"
#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"

/* Token-major K/V of tokens [0, n): the append's layout, seeded bytes. */
static void fill_tokens(uint8_t *kv, uint64_t bytes)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;

	for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(kv + i, &x, 8);
	}
}

/* Append and commit the user's whole history, in prepares of <= 1024
 * tokens. */
static int write_history(struct kvp_client *c, uint64_t user, uint64_t tokens,
			 uint64_t token_bytes, const uint8_t *kv, char *err,
			 size_t len)
{
	for (uint64_t t = 0; t < tokens;) {
		uint32_t n = tokens - t < 1024 ? (uint32_t)(tokens - t) : 1024;
		struct kvp_lease l;
		int rc = kvp_prepare(c, user, t, n, &l);

		if (!rc)
			rc = kvp_append(c, &l, 0, n, kv + t * token_bytes);
		if (!rc)
			rc = kvp_commit(c, l.id, n);
		if (!rc)
			rc = kvp_release(c, l.id);
		if (rc) {
			snprintf(err, len, "writing the history (token %" PRIu64 "): "
				 "%s", t, kvp_last_error(c));
			return rc;
		}
		t += n;
	}
	return 0;
}

/* Every byte of the lease equals what was appended: K and V of each token
 * sit in the device frames at the layout's strides. */
static int verify(struct kvp_client *c, const struct kvp_lease *l,
		  const uint8_t *kv, uint64_t tokens, char *err, size_t len)
{
	const struct kvp_layout *L = kvp_client_layout(c);
	const uint8_t *base = kvp_device_base(c);
	uint64_t row = (uint64_t)L->kv_heads * L->head_dim * L->elem_bytes;

	for (uint64_t t = 0; t < tokens; t++) {
		const uint8_t *frame = base + (uint64_t)l->indices[t / L->page_tokens] *
						      L->page_bytes;

		for (uint32_t ly = 0; ly < L->layers; ly++)
			for (uint32_t kvi = 0; kvi < 2; kvi++) {
				const uint8_t *got = frame + ly * L->layer_stride +
						     kvi * L->kv_stride +
						     (t % L->page_tokens) * L->token_stride;
				const uint8_t *want = kv + t * L->token_bytes +
						      ((uint64_t)ly * 2 + kvi) * row;

				if (memcmp(got, want, row)) {
					snprintf(err, len, "token %" PRIu64 " layer %"
						 PRIu32 " came back from disk changed",
						 t, ly);
					return -EBADMSG;
				}
			}
	}
	return 0;
}

/* Wait until the disk thread has written the pages pushed (kvp_evict
 * returns once they are staged): the prepare then reads them from disk. */
static int wait_written(struct kvp_client *c, uint64_t before, uint64_t pages,
			char *err, size_t len)
{
	for (int i = 0; i < 30000; i++) {
		struct kvp_stats st;

		if (kvp_stats(c, 0, &st)) {
			snprintf(err, len, "stats: %s", kvp_last_error(c));
			return -EIO;
		}
		if (st.disk_demoted_pages >= before + pages)
			return 0;
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
	snprintf(err, len, "the disk tier did not write %" PRIu64 " pages in 30 s",
		 pages);
	return -ETIMEDOUT;
}

static int rounds_of(struct kvp_client *c, const struct disk_prepare_opts *o,
		     struct disk_prepare_result *r, const uint8_t *kv,
		     uint64_t tokens, char *err, size_t len)
{
	for (uint64_t k = 0; k < o->rounds; k++) {
		struct kvp_lease l;
		struct kvp_stats st;
		double t0, s;
		int rc = kvp_stats(c, 0, &st);

		if (!rc)
			rc = kvp_evict(c, 1, KVP_SEL_TO_DISK);
		if (rc < 0) {
			snprintf(err, len, "pushing the history to disk: %s",
				 kvp_last_error(c));
			return rc;
		}
		rc = wait_written(c, st.disk_demoted_pages, (uint64_t)rc, err, len);
		if (rc)
			return rc;
		t0 = kvb_now_s();
		rc = kvp_prepare(c, 1, tokens, 0, &l);
		s = kvb_now_s() - t0;
		if (rc) {
			snprintf(err, len, "the reader prepare: %s", kvp_last_error(c));
			return rc;
		}
		if (l.len != tokens) {
			snprintf(err, len, "the history came back with %" PRIu64 " of %"
				 PRIu64 " tokens", l.len, tokens);
			kvp_release(c, l.id);
			return -EBADMSG;
		}
		rc = verify(c, &l, kv, tokens, err, len);
		kvp_release(c, l.id);
		if (rc)
			return rc;
		if (!k || s < r->seconds)
			r->seconds = s;
	}
	return 0;
}

int disk_measure_prepare(const struct disk_prepare_opts *o,
			 struct disk_prepare_result *r, char *err, size_t len)
{
	struct kvp_layout L;
	uint64_t tokens, bytes;
	char a[6][512], path[4096];
	const char *flags[7];
	struct kvb_daemon d = { 0 };
	struct kvp_connect_opts co = { .name = "kvbench-disk" };
	struct kvp_client *c = NULL;
	uint8_t *kv = NULL;
	int rc;

	if (kvp_layout_parse(&L, o->layout, err, len))
		return -EINVAL;
	tokens = o->bytes / L.token_bytes / L.page_tokens * L.page_tokens;
	if (!tokens) {
		snprintf(err, len, "--prepare-size %" PRIu64 " holds no page; raise "
			 "it", o->bytes);
		return -EINVAL;
	}
	bytes = tokens * L.token_bytes;
	/* The disk tier's staging is a quarter of host_mem and must hold the
	 * whole history (tenant.c); the device tier holds it once. */
	snprintf(a[0], sizeof(a[0]), "--layout=%s", o->layout);
	snprintf(a[1], sizeof(a[1]), "--host_mem=%" PRIu64, 4 * bytes + (64u << 20));
	snprintf(a[2], sizeof(a[2]), "--device_mem=%" PRIu64, bytes + (64u << 20));
	snprintf(a[3], sizeof(a[3]), "--disk_dir=%s", o->dir);
	snprintf(a[4], sizeof(a[4]), "--disk_size=%" PRIu64, 2 * bytes + (64u << 20));
	snprintf(a[5], sizeof(a[5]), "--max_tokens_per_user=%" PRIu64, tokens + 1024);
	for (int i = 0; i < 6; i++)
		flags[i] = a[i];
	flags[6] = NULL;
	kv = malloc(bytes);
	if (!kv) {
		snprintf(err, len, "out of memory for %" PRIu64 " bytes of K/V; lower "
			 "--prepare-size", bytes);
		return -ENOMEM;
	}
	fill_tokens(kv, bytes);
	rc = kvb_daemon_find(o->kvpoold, path, sizeof(path), err, len);
	if (!rc)
		rc = kvb_daemon_start(&d, path, flags, -1, 30000, err, len);
	if (rc)
		goto out;
	co.socket = d.sock;
	rc = kvp_connect(&c, &co, err, len);
	if (!rc)
		rc = write_history(c, 1, tokens, L.token_bytes, kv, err, len);
	if (!rc)
		rc = rounds_of(c, o, r, kv, tokens, err, len);
	r->bytes = bytes;
	r->tokens = tokens;
	kvp_close(c);
out:
	kvb_daemon_stop(&d, 10000, a[0], sizeof(a[0]));
	free(kv);
	return rc;
}
