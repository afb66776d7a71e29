/* SPDX-License-Identifier: MIT */
/*
 * bench_disk.c - kvbench disk: the disk tier's demotion and read-back
 * against the raw ceiling of the same file system, measured in one run.
 *
 *   raw      io_uring O_DIRECT sequential writes, then reads, of the same
 *            slots (same sizes, same runs, same queue depth) of a file of
 *            its own: disk_store only, no kvpool logic;
 *   demote   histories of --history pages put into the tier (what host
 *            eviction does: copy into staging), until the disk thread has
 *            written them all (records sealed, xxhash64, the codec);
 *   readback every history asked back at once (as prepares would), until
 *            all are read, checked and decoded: straight into a page-
 *            aligned buffer registered as the engine's host tier is
 *            (disk_tier_get_into), else into staging; then taken;
 *   codec    zstd (with the byte shuffle for 16-bit dtypes) over the same
 *            pages: ratio and MB/s per core each way.
 *
 * The pages are KV-like by default (bf16 of Gaussian values with a few
 * outlier channels per head, as K and V of a transformer layer look), or
 * random bytes, or real KV from a file (scripts/disk_kv_dump.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_disk.h"
#include "disk_codec.h"
#include "disk_record.h"
#include "disk_store.h"
#include "disk_tier.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

#define SUB "disk"
#define DEFAULT_LAYOUT "layers=32,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=16"

struct opts {
	const char *dir, *layout, *data, *compress, *kvpoold;
	uint64_t size, history, level, rounds, prepare_size;
	bool json, keep, staging; /* staging: read back through staging */
};

struct result {
	struct kvp_layout l;
	uint64_t slot_bytes, pages, histories, bytes;
	double raw_write_s, raw_read_s, demote_s, readback_s;
	double zstd_ratio, zstd_comp_s, zstd_decomp_s;
	struct disk_tier_stats st;
	struct disk_prepare_result prep; /* seconds 0: not measured */
	bool direct;
	bool into;               /* read back straight into host */
};

/* ---------------------------------------------------------------- data */

static uint64_t rng(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static double gauss(uint64_t *x)
{
	double u = ((double)(rng(x) >> 11) + 0.5) / 9007199254740992.0;
	double v = ((double)(rng(x) >> 11) + 0.5) / 9007199254740992.0;

	return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static void put_elem(uint8_t *p, uint32_t dtype, float f)
{
	uint32_t b;

	memcpy(&b, &f, 4);
	switch (dtype) {
	case KVP_DTYPE_FP32:
		memcpy(p, &b, 4);
		break;
	case KVP_DTYPE_FP8_E4M3:
		p[0] = (uint8_t)(b >> 24 ^ b >> 20); /* a noisy byte: no fp8 math */
		break;
	default: {
		uint16_t h = (uint16_t)(b >> 16); /* bf16; fp16 as noisy */

		memcpy(p, &h, 2);
	}
	}
}

/* KV-like: per (head, dim) a scale, a few channels large (K's outliers). */
static void fill_kv(const struct kvp_layout *l, uint8_t *page, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	uint32_t E = l->elem_bytes;

	for (uint32_t ly = 0; ly < l->layers; ly++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t t = 0; t < l->page_tokens; t++)
				for (uint32_t h = 0; h < l->kv_heads; h++)
					for (uint32_t d = 0; d < l->head_dim; d++) {
						uint64_t off = ly * l->layer_stride +
							       kv * l->kv_stride +
							       t * l->token_stride +
							       h * l->head_stride + d * E;
						float scale = (d * 7 + h) % 61 == 0 && !kv ?
							      8.0f : 0.5f + (d % 13) * 0.1f;

						put_elem(page + off, l->dtype,
							 (float)gauss(&x) * scale);
					}
}

/* pages distinct pages of data into buf (page_bytes each). */
static int fill_data(const struct opts *o, const struct kvp_layout *l,
		     uint8_t *buf, uint64_t pages, char *err, size_t len)
{
	FILE *f;

	if (!strcmp(o->data, "random")) {
		uint64_t x = 12345;

		for (uint64_t i = 0; i < pages * l->page_bytes; i++)
			buf[i] = (uint8_t)rng(&x);
		return 0;
	}
	if (!strcmp(o->data, "kv")) {
		for (uint64_t i = 0; i < pages; i++)
			fill_kv(l, buf + i * l->page_bytes, i);
		return 0;
	}
	/* A file of pages of this layout: repeated when it is shorter. */
	f = fopen(o->data, "rb");
	if (!f) {
		snprintf(err, len, "%s: %s", o->data, strerror(errno));
		return -1;
	}
	for (uint64_t i = 0; i < pages; i++) {
		if (fread(buf + i * l->page_bytes, l->page_bytes, 1, f) == 1)
			continue;
		rewind(f);
		if (!i || fread(buf + i * l->page_bytes, l->page_bytes, 1, f) != 1) {
			snprintf(err, len, "%s: not one page of %" PRIu64 " bytes; "
				 "dump it with the same --layout", o->data,
				 l->page_bytes);
			fclose(f);
			return -1;
		}
	}
	fclose(f);
	return 0;
}

/* ---------------------------------------------------------------- measure */

/* The raw ceiling: the same slots of a file of its own, one run each way. */
static int measure_raw(const struct opts *o, struct result *r,
		       const uint8_t *data, char *err, size_t len)
{
	uint64_t sb = r->slot_bytes, n = r->pages;
	uint64_t chunk = n < 256 ? n : 256; /* slots one batch moves */
	struct disk_io *io = calloc(chunk, sizeof(*io));
	uint8_t *buf = aligned_alloc(DISK_ALIGN, chunk * sb);
	struct disk_store *st = NULL;
	struct errbuf e;
	char path[4096];
	double t0;
	int ret = -1;

	snprintf(path, sizeof(path), "%s/kvbench-raw.disk", o->dir);
	if (!io || !buf) {
		snprintf(err, len, "out of memory");
		goto out;
	}
	/* The same bytes the tier writes: a disk that compresses or dedupes
	 * underneath (a VM's) must see the same data both ways. */
	memset(buf, 0, chunk * sb);
	for (uint64_t i = 0; i < chunk; i++)
		memcpy(buf + i * sb + DISK_PAYLOAD_OFF, data + i * r->l.page_bytes,
		       r->l.page_bytes);
	if (disk_store_open(&st, path, n * sb, sb, &e)) {
		snprintf(err, len, "%s", e.msg);
		goto out;
	}
	r->direct = disk_store_direct(st);
	disk_store_register(st, buf, chunk * sb, sb);
	for (int dir = 1; dir >= 0; dir--) {
		t0 = kvb_now_s();
		for (uint64_t s = 0; s < n; s += chunk) {
			uint64_t k = n - s < chunk ? n - s : chunk;

			for (uint64_t i = 0; i < k; i++)
				io[i] = (struct disk_io){ .slot = (uint32_t)(s + i),
							  .buf = buf + i * sb };
			if (disk_store_rw(st, dir, io, (uint32_t)k)) {
				snprintf(err, len, "%.900s: raw %s failed: %s", path,
					 dir ? "write" : "read", strerror(-io[0].res));
				goto out;
			}
		}
		*(dir ? &r->raw_write_s : &r->raw_read_s) = kvb_now_s() - t0;
	}
	ret = 0;
out:
	disk_store_close(st);
	if (!o->keep)
		unlink(path);
	free(io);
	free(buf);
	return ret;
}

/*
 * Every history asked back at once, as prepares would, until all are
 * ready: straight into host (the engine's host frames: registered, page by
 * page) where the tier can, else through staging.
 */
static int read_back(struct disk_tier *dt, const struct result *r, uint64_t H,
		     uint64_t nh, struct disk_hist *hh, uint8_t *host, char *err,
		     size_t len)
{
	void **dst = calloc(H, sizeof(*dst));
	int rc = 0;

	if (!dst) {
		snprintf(err, len, "out of memory");
		return -1;
	}
	for (uint64_t u = 0; u < nh; u++) {
		struct disk_key k = { .tenant = 1, .user = u };

		for (uint64_t i = 0; host && i < H; i++)
			dst[i] = host + (u * H + i) * r->l.page_bytes;
		/* queues every read at once */
		if (host)
			disk_tier_get_into(dt, &k, (uint32_t)H, dst, &hh[u]);
		else
			disk_tier_get(dt, &k, &hh[u]);
	}
	for (uint64_t u = 0; u < nh && !rc; u++) {
		struct disk_key k = { .tenant = 1, .user = u };

		while ((rc = host ? disk_tier_poll(dt, &hh[u], &hh[u]) :
			     disk_tier_get(dt, &k, &hh[u])) == -EINPROGRESS) {
			if (host)
				disk_tier_wait_held(dt, &hh[u]);
			else
				disk_tier_wait(dt, &k);
		}
		if (rc)
			snprintf(err, len, "history %" PRIu64 ": read back: %s", u,
				 strerror(-rc));
	}
	free(dst);
	return rc;
}

/* Demote every history, then read every one back, through the tier. */
static int measure_tier(const struct opts *o, struct result *r,
			const uint8_t *data, uint8_t *host, char *err, size_t len)
{
	struct disk_tier_config c = { .dir = o->dir, .layout = r->l,
				      .size = r->pages * r->slot_bytes,
				      .staging_bytes = r->pages * r->slot_bytes };
	uint64_t H = o->history, nh = r->histories;
	struct disk_hist *hh = calloc(nh, sizeof(*hh));
	void **pages = calloc(H, sizeof(*pages));
	struct disk_tier *dt = NULL;
	struct errbuf e;
	char path[4096];
	double t0;
	int ret = -1;

	if (!hh || !pages) {
		snprintf(err, len, "out of memory");
		goto out;
	}
	if (disk_codec_parse(o->compress, &c.codec, err, len))
		goto out;
	snprintf(path, sizeof(path), "%s/kvpool.disk", o->dir);
	unlink(path); /* a cold file: no warm restart to scan */
	if (disk_tier_open(&dt, &c, &e)) {
		snprintf(err, len, "%s", e.msg);
		goto out;
	}
	t0 = kvb_now_s();
	for (uint64_t u = 0; u < nh; u++) {
		struct disk_key k = { .tenant = 1, .user = u };

		for (uint64_t i = 0; i < H; i++)
			pages[i] = (void *)(data + (u * H + i) * r->l.page_bytes);
		if (disk_tier_put(dt, &k, 0, H * r->l.page_tokens, (uint32_t)H,
				  pages)) {
			snprintf(err, len, "history %" PRIu64 ": no staging room", u);
			goto out;
		}
	}
	disk_tier_flush(dt);
	r->demote_s = kvb_now_s() - t0;
	if (host && !o->staging && disk_tier_into_ok(dt))
		disk_tier_register_host(dt, host, r->bytes);
	else
		host = NULL;
	r->into = host != NULL;
	disk_tier_flush(dt); /* the registration too: the thread does it */
	t0 = kvb_now_s();
	if (read_back(dt, r, H, nh, hh, host, err, len))
		goto out;
	r->readback_s = kvb_now_s() - t0;
	/* Every byte as written (outside the timing). */
	for (uint64_t u = 0; u < nh; u++) {
		for (uint64_t i = 0; i < H; i++)
			if (memcmp(disk_tier_page(dt, &hh[u], (uint32_t)i),
				   data + (u * H + i) * r->l.page_bytes,
				   r->l.page_bytes)) {
				snprintf(err, len, "history %" PRIu64 " page %" PRIu64
					 " read back differs", u, i);
				goto out;
			}
		disk_tier_take(dt, &hh[u]);
	}
	disk_tier_stats(dt, 1, &r->st);
	ret = 0;
out:
	if (host)
		disk_tier_unregister_host(dt, host);
	disk_tier_close(dt);
	if (!o->keep)
		unlink(path);
	free(hh);
	free(pages);
	return ret;
}

/* zstd over the pages (one core): ratio, and time each way. */
static int measure_codec(const struct opts *o, struct result *r,
			 const uint8_t *data)
{
	uint64_t pb = r->l.page_bytes, n = r->pages < 64 ? r->pages : 64;
	struct disk_codec c = { .id = DISK_CODEC_ZSTD, .level = (int)o->level,
				.elem_bytes = r->l.elem_bytes };
	struct disk_codec_ctx *x = disk_codec_ctx_new(pb);
	uint8_t *z = malloc(pb), *out = malloc(pb);
	uint64_t stored = 0;
	double t0, tc = 0, td = 0;
	int ret = -1;

	if (!x || !z || !out)
		goto out;
	for (uint64_t i = 0; i < n; i++) {
		uint8_t id;
		size_t s;

		t0 = kvb_now_s();
		s = disk_codec_encode(x, &c, data + i * pb, pb, z, pb, &id);
		tc += kvb_now_s() - t0;
		t0 = kvb_now_s();
		if (disk_codec_decode(x, id, z, s, out, pb))
			goto out;
		td += kvb_now_s() - t0;
		stored += s;
	}
	r->zstd_ratio = (double)(n * pb) / (double)stored;
	r->zstd_comp_s = tc / (double)n;   /* per page */
	r->zstd_decomp_s = td / (double)n;
	ret = 0;
out:
	disk_codec_ctx_free(x);
	free(z);
	free(out);
	return ret;
}

/* The prepare path end to end, in a directory of its own under --dir. */
static int measure_prepare(const struct opts *o, struct result *r, char *err,
			   size_t len)
{
	struct disk_prepare_opts po = { .layout = o->layout, .kvpoold = o->kvpoold,
					.bytes = o->prepare_size,
					.rounds = o->rounds };
	char dir[4096], file[4200];
	int rc;

	snprintf(dir, sizeof(dir), "%s/kvbench-prepare", o->dir);
	snprintf(file, sizeof(file), "%s/kvpool.disk", dir);
	if (mkdir(dir, 0700) && errno != EEXIST) {
		snprintf(err, len, "%.900s: %s; make --dir writable", dir,
			 strerror(errno));
		return -1;
	}
	unlink(file); /* a cold file: no warm restart to scan */
	po.dir = dir;
	rc = disk_measure_prepare(&po, &r->prep, err, len);
	if (!o->keep) {
		unlink(file);
		rmdir(dir);
	}
	return rc;
}

/* ---------------------------------------------------------------- report */

static void print_json(const struct opts *o, const struct result *r,
		       const struct kvb_machine *m)
{
	double pb = (double)r->l.page_bytes;
	char layout[256];
	struct json j;

	kvp_layout_format(&r->l, layout, sizeof(layout));
	kvb_json_begin(&j, "disk");
	json_str(&j, "dir", o->dir);
	json_str(&j, "layout", layout);
	json_u64(&j, "page_bytes", r->l.page_bytes);
	json_u64(&j, "slot_bytes", r->slot_bytes);
	json_u64(&j, "pages", r->pages);
	json_u64(&j, "history_pages", o->history);
	json_u64(&j, "rounds", o->rounds);
	json_str(&j, "data", o->data);
	json_str(&j, "compress", o->compress);
	json_bool(&j, "o_direct", r->direct);
	json_bool(&j, "readback_into_host", !o->staging && r->into);
	json_f64(&j, "raw_write_gbps", kvb_gbps(r->bytes, r->raw_write_s), 3);
	json_f64(&j, "raw_read_gbps", kvb_gbps(r->bytes, r->raw_read_s), 3);
	json_f64(&j, "demote_gbps", kvb_gbps(r->bytes, r->demote_s), 3);
	json_f64(&j, "readback_gbps", kvb_gbps(r->bytes, r->readback_s), 3);
	json_f64(&j, "demote_ratio", r->demote_s > 0 ? r->raw_write_s / r->demote_s : 0, 3);
	json_f64(&j, "readback_ratio", r->readback_s > 0 ? r->raw_read_s / r->readback_s : 0, 3);
	json_f64(&j, "zstd_ratio", r->zstd_ratio, 3);
	json_u64(&j, "prepare_bytes", r->prep.bytes);
	json_f64(&j, "prepare_gbps", kvb_gbps(r->prep.bytes, r->prep.seconds), 3);
	json_f64(&j, "prepare_ratio", r->prep.seconds > 0 && r->raw_read_s > 0 ?
		 kvb_gbps(r->prep.bytes, r->prep.seconds) /
		 kvb_gbps(r->bytes, r->raw_read_s) : 0, 3);
	json_u64(&j, "zstd_level", o->level);
	json_f64(&j, "zstd_compress_mbps_per_core", pb / r->zstd_comp_s / 1e6, 1);
	json_f64(&j, "zstd_decompress_mbps_per_core", pb / r->zstd_decomp_s / 1e6, 1);
	json_f64(&j, "demote_thread_write_s", r->st.write_ns * 1e-9, 4);
	json_f64(&j, "demote_thread_codec_s", r->st.codec_ns * 1e-9, 4);
	json_f64(&j, "stored_ratio", r->st.bytes_stored ?
		 (double)r->st.bytes_raw / (double)r->st.bytes_stored : 0, 3);
	kvb_json_end(&j, m);
}

static void print_table(const struct opts *o, const struct result *r,
			const struct kvb_machine *m)
{
	double pb = (double)r->l.page_bytes;
	char layout[256];

	kvp_layout_format(&r->l, layout, sizeof(layout));
	printf("kvbench disk on %s (%ld CPUs), %s (%s)\n", m->cpu_model, m->nproc,
	       o->dir, r->direct ? "O_DIRECT" : "buffered: O_DIRECT refused");
	printf("%" PRIu64 " pages of %" PRIu64 " bytes (%s), slots of %" PRIu64
	       ", histories of %" PRIu64 " pages, data %s, stored %s\n\n", r->pages,
	       r->l.page_bytes, layout, r->slot_bytes, o->history, o->data,
	       o->compress);
	printf("%-10s %10s %10s %8s\n", "", "GB/s", "raw GB/s", "of raw");
	printf("%-10s %10.3f %10.3f %8.3f   (target >= 0.9)\n", "demote",
	       kvb_gbps(r->bytes, r->demote_s), kvb_gbps(r->bytes, r->raw_write_s),
	       r->demote_s > 0 ? r->raw_write_s / r->demote_s : 0);
	printf("%-10s %10.3f %10.3f %8.3f   (target >= 0.9)\n", "read back",
	       kvb_gbps(r->bytes, r->readback_s), kvb_gbps(r->bytes, r->raw_read_s),
	       r->readback_s > 0 ? r->raw_read_s / r->readback_s : 0);
	if (r->prep.seconds > 0)
		printf("%-10s %10.3f %10.3f %8.3f   (a reader prepare, disk -> host "
		       "-> device, %" PRIu64 " MB)\n", "prepare",
		       kvb_gbps(r->prep.bytes, r->prep.seconds),
		       kvb_gbps(r->bytes, r->raw_read_s), kvb_gbps(r->prep.bytes,
		       r->prep.seconds) / kvb_gbps(r->bytes, r->raw_read_s),
		       r->prep.bytes / 1000000);
	printf("best of %" PRIu64 " rounds; in the disk thread: %.3f s writing, "
	       "%.3f s in the codec, %.3f s reading\n", o->rounds,
	       r->st.write_ns * 1e-9, r->st.codec_ns * 1e-9, r->st.read_ns * 1e-9);
	printf("\nzstd:%" PRIu64 " ratio %.3f, %.0f MB/s compress, %.0f MB/s "
	       "decompress per core\n", o->level, r->zstd_ratio,
	       pb / r->zstd_comp_s / 1e6, pb / r->zstd_decomp_s / 1e6);
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench disk [options]\n"
"\n"
"The disk tier's demotion and read-back GB/s against the raw ceiling of the\n"
"same directory (io_uring O_DIRECT sequential writes and reads of the same\n"
"slots), and zstd's ratio and speed on the same pages, in one run.\n"
"\n"
"Options:\n"
"  --dir PATH         directory to test (default /var/tmp); two files are\n"
"                     made there and removed\n"
"  --size SIZE        bytes of pages moved each way (default 1G)\n"
"  --layout SPEC      page geometry (default " DEFAULT_LAYOUT ":\n"
"                     Llama-3-8B, 2 MiB pages)\n"
"  --history N        pages per history (default 16)\n"
"  --data kv|random|FILE\n"
"                     page contents: KV-like bf16 (default), random bytes,\n"
"                     or pages of this layout from FILE (scripts/disk_kv_dump.py)\n"
"  --compress C       how the tier stores pages: none (default), zstd[:LEVEL]\n"
"  --level N          zstd level of the codec measurement (default 3)\n"
"  --rounds N         rounds of raw and tier (each first in turn), best\n"
"                     of each (default 4)\n"
"  --prepare-size SIZE\n"
"                     bytes of the history a reader prepare brings back\n"
"                     through a kvpoold of its own (default 512M; 0: skip)\n"
"  --kvpoold PATH     the kvpoold to start (default: next to kvbench)\n"
"  --staging          read back through staging, not straight into a\n"
"                     registered host buffer (the engine's way before)\n"
"  --keep             keep the files\n"
KVB_USAGE_END_OPTS
"\n"
"Sizes take K, M or G suffixes. See kvbench(1).\n");
}

enum { OPT_DIR = 256, OPT_SIZE, OPT_LAYOUT, OPT_HISTORY, OPT_DATA, OPT_COMPRESS,
       OPT_LEVEL, OPT_KEEP, OPT_ROUNDS, OPT_PREPARE_SIZE, OPT_KVPOOLD,
       OPT_STAGING };

static const struct option long_opts[] = {
	{ "dir", required_argument, NULL, OPT_DIR },
	{ "size", required_argument, NULL, OPT_SIZE },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "history", required_argument, NULL, OPT_HISTORY },
	{ "data", required_argument, NULL, OPT_DATA },
	{ "compress", required_argument, NULL, OPT_COMPRESS },
	{ "level", required_argument, NULL, OPT_LEVEL },
	{ "keep", no_argument, NULL, OPT_KEEP },
	{ "rounds", required_argument, NULL, OPT_ROUNDS },
	{ "prepare-size", required_argument, NULL, OPT_PREPARE_SIZE },
	{ "kvpoold", required_argument, NULL, OPT_KVPOOLD },
	{ "staging", no_argument, NULL, OPT_STAGING },
	KVB_LONG_OPTS_END,
};

static int one_opt(void *ctx, int c, const char *arg)
{
	struct opts *o = ctx;
	char err[128];

	switch (c) {
	case OPT_DIR:
		o->dir = arg;
		return -1;
	case OPT_SIZE:
		if (kvb_opt_bytes(arg, &o->size))
			return kvb_usage_error(SUB, "--size '%s': give bytes with an "
					       "optional K, M or G suffix", arg);
		return -1;
	case OPT_LAYOUT:
		o->layout = arg;
		return -1;
	case OPT_HISTORY:
		return kvb_opt_count(SUB, "--history", arg, 1, 4096, &o->history);
	case OPT_DATA:
		o->data = arg;
		return -1;
	case OPT_COMPRESS: {
		struct disk_codec dc;

		if (disk_codec_parse(arg, &dc, err, sizeof(err)))
			return kvb_usage_error(SUB, "--compress '%s': %s", arg, err);
		o->compress = arg;
		return -1;
	}
	case OPT_LEVEL:
		return kvb_opt_count(SUB, "--level", arg, 1, 19, &o->level);
	case OPT_KEEP:
		o->keep = true;
		return -1;
	case OPT_ROUNDS:
		return kvb_opt_count(SUB, "--rounds", arg, 1, 100, &o->rounds);
	case OPT_PREPARE_SIZE:
		if (!strcmp(arg, "0")) {
			o->prepare_size = 0;
			return -1;
		}
		if (kvb_opt_bytes(arg, &o->prepare_size))
			return kvb_usage_error(SUB, "--prepare-size '%s': give bytes "
					       "with an optional K, M or G suffix, or "
					       "0", arg);
		return -1;
	case OPT_KVPOOLD:
		o->kvpoold = arg;
		return -1;
	case OPT_STAGING:
		o->staging = true;
		return -1;
	}
	return KVB_EXIT_USAGE;
}

/* ---------------------------------------------------------------- main */

int cmd_disk(int argc, char **argv)
{
	struct opts o = { .dir = "/var/tmp", .layout = DEFAULT_LAYOUT,
			  .data = "kv", .compress = "none", .size = 1ull << 30,
			  .history = 16, .level = 3, .rounds = 4,
			  .prepare_size = 512ull << 20 };
	struct result r = { 0 };
	struct kvb_machine m;
	struct summary tov;
	char err[1024] = "";
	uint8_t *data = NULL, *host = NULL;
	int rc;

	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, &o, &o.json);
	if (rc < 0)
		rc = kvb_begin_run(SUB, KVB_CPU_NONE, &m, &tov);
	if (rc >= 0)
		return rc;
	if (kvp_layout_parse(&r.l, o.layout, err, sizeof(err)))
		return kvb_usage_error(SUB, "--layout '%s': %s", o.layout, err);
	r.slot_bytes = disk_slot_bytes(r.l.page_bytes);
	r.histories = o.size / (o.history * r.l.page_bytes);
	if (!r.histories)
		return kvb_usage_error(SUB, "--size %" PRIu64 " holds no history of %"
				       PRIu64 " pages of %" PRIu64 " bytes; raise "
				       "--size or lower --history", o.size, o.history,
				       r.l.page_bytes);
	r.pages = r.histories * o.history;
	r.bytes = r.pages * r.l.page_bytes;
	data = malloc(r.bytes);
	/* The read-back's destination, as the engine's host tier: page
	 * aligned, faulted in (pinned host memory is). */
	host = aligned_alloc(DISK_ALIGN, (r.bytes + DISK_ALIGN - 1) / DISK_ALIGN *
			     DISK_ALIGN);
	if (host)
		memset(host, 0, r.bytes);
	if (!data || !host) {
		free(data);
		free(host);
		fprintf(stderr, "kvbench disk: out of memory for %" PRIu64 " bytes of "
			"pages; lower --size\n", r.bytes);
		return KVB_EXIT_FAIL;
	}
	rc = fill_data(&o, &r.l, data, r.pages, err, sizeof(err));
	/* Rounds measure raw and tier back to back, so a disk whose speed
	 * drifts (a shared VM's) treats both alike; the best of each is
	 * reported. */
	for (uint64_t k = 0; !rc && k < o.rounds; k++) {
		struct result t = r;

		/* Which goes first alternates too: right after 1 GB of
		 * writes a VM's disk is slower for a while. */
		if (k % 2) {
			rc = measure_tier(&o, &t, data, host, err, sizeof(err));
			if (!rc)
				rc = measure_raw(&o, &t, data, err, sizeof(err));
		} else {
			rc = measure_raw(&o, &t, data, err, sizeof(err));
			if (!rc)
				rc = measure_tier(&o, &t, data, host, err, sizeof(err));
		}
		if (rc)
			break;
		if (!k || t.raw_write_s < r.raw_write_s)
			r.raw_write_s = t.raw_write_s;
		if (!k || t.raw_read_s < r.raw_read_s)
			r.raw_read_s = t.raw_read_s;
		if (!k || t.demote_s < r.demote_s) {
			r.demote_s = t.demote_s;
			r.st = t.st;
		}
		if (!k || t.readback_s < r.readback_s)
			r.readback_s = t.readback_s;
		r.direct = t.direct;
		r.into = t.into;
	}
	if (!rc)
		rc = measure_codec(&o, &r, data);
	free(data);
	free(host);
	if (!rc && o.prepare_size)
		rc = measure_prepare(&o, &r, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvbench disk: %s\n", err[0] ? err : "codec failed");
		return KVB_EXIT_FAIL;
	}
	if (o.json)
		print_json(&o, &r, &m);
	else
		print_table(&o, &r, &m);
	return KVB_EXIT_OK;
}
