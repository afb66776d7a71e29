/* SPDX-License-Identifier: MIT */
/*
 * make_seeds - write the seed corpora under DIR/<target>/ (fuzz/corpus/ in
 * the tree; scripts/fuzz.sh --seeds runs it): valid inputs made by the
 * code's own writers where there is one (the disk tier writes a file and
 * its slots become fuzz_disk_record's and fuzz_disk_scan's seeds;
 * remote_value_encode the values), the wire structs of proto.h filled as
 * libkvpool fills them for the hello and the ring, and a few edge cases
 * each. The files are small; their names say what they are.
 *
 * Usage: make_seeds DIR
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk_record.h"
#include "disk_tier.h"
#include "proto.h"
#include "redis_cluster.h"
#include "remote_value.h"

static const char *out_dir;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void put(const char *target, const char *name, const void *p, size_t n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) && errno != EEXIST)
		die(path);
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f))
		die(path);
}

/* ------------------------------------------------------------ hello */

static void hello_seeds(void)
{
	struct kvp_hello h = { .magic = KVP_PROTO_MAGIC, .version = KVP_PROTO_VERSION };
	unsigned char big[sizeof(h) + 8] = { 0 };

	/* libkvpool's: defaults, its name. */
	strncpy(h.name, "pipeline", sizeof(h.name) - 1);
	put("fuzz_hello", "default", &h, sizeof(h));
	h.sq_entries = 64;
	h.cq_entries = 256;
	h.arena_bytes = 1u << 20;
	h.pool = 1;
	put("fuzz_hello", "sized_pool1", &h, sizeof(h));
	h.sq_entries = KVP_RING_MAX_ENTRIES;
	h.cq_entries = 2 * KVP_RING_MAX_ENTRIES;
	put("fuzz_hello", "largest_rings", &h, sizeof(h));
	h = (struct kvp_hello){ .magic = KVP_PROTO_MAGIC, .version = KVP_PROTO_VERSION - 1 };
	put("fuzz_hello", "old_version", &h, sizeof(h));
	put("fuzz_hello", "truncated", &h, 12);
	memcpy(big, &h, sizeof(h));
	put("fuzz_hello", "too_long", big, sizeof(big));
}

/* ------------------------------------------------------------ ring */

#define LAST 0x545341454c54534cull /* fuzz_ring.c: the last val0 */
#define IN_AT 8192u                /* where seeds put entries' input */
#define OUT_AT 16384u              /* and their results */

struct ring_seed {
	struct kvp_sqe q[64];        /* copied after the flags byte at the end */
	unsigned char b[IN_AT + 4096];
	size_t len;                  /* bytes used */
	uint32_t nsqe;
	uint32_t in_next, out_next;
};

static void ring_init(struct ring_seed *r, uint8_t flags)
{
	memset(r, 0, sizeof(*r));
	r->b[0] = flags;
	r->len = 1;
	r->in_next = IN_AT;
	r->out_next = OUT_AT;
}

/* An entry with a result range of out_len and input in[in_len]. */
static struct kvp_sqe *ring_add(struct ring_seed *r, uint8_t op, uint32_t out_len,
				const void *in, uint32_t in_len)
{
	struct kvp_sqe *q = &r->q[r->nsqe++];

	*q = (struct kvp_sqe){ .opcode = op, .tag = r->nsqe, .out_off = r->out_next,
			       .out_len = out_len };
	r->out_next += (out_len + 63) & ~63u;
	if (in_len) {
		q->in_off = r->in_next;
		q->in_len = in_len;
		memcpy(r->b + r->in_next, in, in_len);
		r->in_next += (in_len + 7) & ~7u;
		if (r->in_next > r->len)
			r->len = r->in_next;
	}
	if (1 + r->nsqe * sizeof(*q) > r->len)
		r->len = 1 + r->nsqe * sizeof(*q);
	return q;
}

static void ring_put(struct ring_seed *r, const char *name)
{
	memcpy(r->b + 1, r->q, r->nsqe * sizeof(r->q[0]));
	put("fuzz_ring", name, r->b, r->len);
}

static void ring_histories(void)
{
	struct ring_seed r;
	struct kvp_sqe *q;

	ring_init(&r, 0);
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 7, q->arg = 0, q->n = 40;
	q = ring_add(&r, KVP_OP_COMMIT, 256, NULL, 0);
	q->arg = LAST, q->n = 40, q->flags = KVP_SQE_RELEASE;
	q = ring_add(&r, KVP_OP_INFO, 256, NULL, 0);
	q->user = 7;
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 7, q->arg = 40, q->n = 16;
	q = ring_add(&r, KVP_OP_RELEASE, 256, NULL, 0);
	q->arg = LAST;
	q = ring_add(&r, KVP_OP_OFFLOAD, 256, NULL, 0);
	q->user = 7;
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 7, q->arg = 40, q->n = 8;
	q = ring_add(&r, KVP_OP_COMMIT, 256, NULL, 0);
	q->arg = LAST, q->n = 8;
	q = ring_add(&r, KVP_OP_STATS, 1024, NULL, 0);
	q = ring_add(&r, KVP_OP_USERS, 2048, NULL, 0);
	q->n = 16;
	q = ring_add(&r, KVP_OP_EVICT, 256, NULL, 0);
	q->user = 7, q->sel = 3;
	q = ring_add(&r, KVP_OP_EVICT_TENANT, 256, NULL, 0);
	q->sel = 1;
	ring_put(&r, "histories");

	/* Admin: every tenant, the clients, latency, a reload. */
	ring_init(&r, 1);
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 9, q->n = 100;
	q = ring_add(&r, KVP_OP_CLIENTS, 2048, NULL, 0);
	q->flags = KVP_SQE_ALL, q->n = 8;
	q = ring_add(&r, KVP_OP_STATS, 1024, NULL, 0);
	q->flags = KVP_SQE_ALL;
	q = ring_add(&r, KVP_OP_USERS, 2048, NULL, 0);
	q->flags = KVP_SQE_ALL, q->n = 8;
	q = ring_add(&r, KVP_OP_LATENCY, 2048, NULL, 0);
	q = ring_add(&r, KVP_OP_RELOAD, 256, NULL, 0);
	q = ring_add(&r, KVP_OP_OFFLOAD, 256, NULL, 0);
	q->flags = KVP_SQE_ALL;
	q = ring_add(&r, KVP_OP_EVICT, 256, NULL, 0);
	q->flags = KVP_SQE_ALL, q->sel = 2;
	ring_put(&r, "admin");

	/* BATCH entries (proto.h): prepares, a commit of no lease, infos;
	 * then one with a malformed item (nothing of it runs). */
	{
		struct kvp_batch_item it[4] = {
			{ .tag = 1, .user = 7, .n = 16, .opcode = KVP_OP_PREPARE,
			  .out_off = OUT_AT + 8192, .out_len = 1024 },
			{ .tag = 2, .user = 8, .n = 1, .opcode = KVP_OP_PREPARE,
			  .out_off = OUT_AT + 9216, .out_len = 1024 },
			{ .tag = 3, .arg = 1, .n = 1, .opcode = KVP_OP_COMMIT,
			  .flags = KVP_SQE_RELEASE, .out_off = OUT_AT + 10240,
			  .out_len = 256 },
			{ .tag = 4, .user = 7, .opcode = KVP_OP_INFO,
			  .out_off = OUT_AT + 10496, .out_len = 256 },
		};

		ring_init(&r, 0);
		q = ring_add(&r, KVP_OP_BATCH, 256, it, sizeof(it));
		q->n = 4;
		it[2].opcode = KVP_OP_EVICT;
		q = ring_add(&r, KVP_OP_BATCH, 256, it, sizeof(it));
		q->n = 4;
		ring_put(&r, "batch");
	}

	/* Edge cases: result ranges that wrap or overrun, input past the
	 * arena, an opcode past the last, reserved fields set, a stale lease. */
	ring_init(&r, 0);
	q = ring_add(&r, KVP_OP_INFO, 256, NULL, 0);
	q->out_off = UINT32_MAX - 8, q->out_len = 64;
	q = ring_add(&r, KVP_OP_PREFIX_LOOKUP, 256, NULL, 0);
	q->in_off = KVP_ARENA_MIN_BYTES - 4, q->in_len = 64, q->n = 16;
	q = ring_add(&r, KVP_OP_MAX, 256, NULL, 0);
	q = ring_add(&r, KVP_OP_INFO, 256, NULL, 0);
	q->rsv0 = 1;
	q = ring_add(&r, KVP_OP_INFO, 256, NULL, 0);
	q->rsv1 = 1;
	q = ring_add(&r, KVP_OP_COMMIT, 256, NULL, 0);
	q->arg = 0x100000001ull, q->n = 1;
	q = ring_add(&r, KVP_OP_PREPARE, 0, NULL, 0);
	q->user = 1, q->n = 1;
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 1, q->n = UINT32_MAX;
	ring_put(&r, "edges");

	/* Found by fuzz_ring (issue 25, item 11): a read lease on an empty
	 * user, the first page-table operation of a fresh daemon, copied 0
	 * bytes from the engine's NULL view. */
	ring_init(&r, 0);
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 1;
	ring_put(&r, "regress_prepare_empty_user");
}

static void ring_sharing(void)
{
	struct {
		struct kvp_chunk_register_in h;
		uint32_t tok[20];
		char meta[8];
		char content[5];
	} __attribute__((packed)) reg = {
		.h = { .type = KVP_CHUNK_CONTEXT, .ntokens = 20, .meta_len = 8,
		       .content_len = 5 },
		.meta = "{\"a\":1}", .content = "hello",
	};
	struct {
		struct kvp_compose_in h;
		struct kvp_compose_req_in req;
		struct kvp_chunk_id ctx;
	} comp = { .h = { .nreq = 1, .nctx = 1 }, .req = { .ncontexts = 1 } };
	struct kvp_chunk_limits_in lim = { .max_chunks = 4, .memory_ratio = 0.5 };
	struct kvp_chunk_list_in list = { 0 };
	uint32_t tok[48];
	struct kvp_seq_src src[2] = { { .kind = KVP_SRC_SEQ, .id = 1 },
				      { .kind = KVP_SRC_USER, .id = 7, .tokens = 16 } };
	unsigned char create[sizeof(struct kvp_seq_create_in) + sizeof(src)];
	struct kvp_seq_create_in ch = { .nsrc = 2 };
	struct ring_seed r;
	struct kvp_sqe *q;
	uint32_t reg_out;

	memcpy(create, &ch, sizeof(ch));
	memcpy(create + sizeof(ch), src, sizeof(src));
	for (uint32_t i = 0; i < 48; i++)
		tok[i] = 1000 + i;
	memcpy(reg.tok, tok, sizeof(reg.tok));

	/* Chunks: register, fill lease sealed, then every query on the id
	 * the daemon wrote into the arena (inputs pointed at it). */
	ring_init(&r, 0);
	reg_out = r.out_next;
	q = ring_add(&r, KVP_OP_CHUNK_REGISTER, 4096, &reg, sizeof(reg));
	q = ring_add(&r, KVP_OP_CHUNK_SEAL, 256, NULL, 0);
	q->arg = LAST;
	q = ring_add(&r, KVP_OP_CHUNK_GET, 4096, NULL, 0);
	q->in_off = reg_out, q->in_len = 32;
	q = ring_add(&r, KVP_OP_CHUNK_ACQUIRE, 4096, NULL, 0);
	q->in_off = reg_out, q->in_len = 32;
	q = ring_add(&r, KVP_OP_RELEASE, 256, NULL, 0);
	q->arg = LAST;
	q = ring_add(&r, KVP_OP_CHUNK_ENTRY, 1024, NULL, 0);
	q->in_off = reg_out, q->in_len = 32;
	q = ring_add(&r, KVP_OP_CHUNK_ENTRIES, 2048, NULL, 0);
	q->in_off = reg_out + 32, q->in_len = 32, q->n = 8;
	q = ring_add(&r, KVP_OP_CHUNK_CONTENT, 256, NULL, 0);
	q->in_off = reg_out + 32, q->in_len = 32;
	q = ring_add(&r, KVP_OP_CHUNK_TOKENS, 256, NULL, 0);
	q->in_off = reg_out + 32, q->in_len = 32;
	q = ring_add(&r, KVP_OP_CHUNK_LIST, 4096, &list, sizeof(list));
	q->n = 8;
	q = ring_add(&r, KVP_OP_CHUNK_LIMITS, 256, &lim, sizeof(lim));
	q = ring_add(&r, KVP_OP_CHUNK_COPY, 256, NULL, 0);
	q->in_off = reg_out, q->in_len = 32, q->arg = 0, q->n = 1;
	q = ring_add(&r, KVP_OP_COMPOSE, 4096, &comp, sizeof(comp));
	q->flags = KVP_SQE_PREVIEW;
	q = ring_add(&r, KVP_OP_CHUNK_DELETE, 256, NULL, 0);
	q->in_off = reg_out, q->in_len = 32;
	q = ring_add(&r, KVP_OP_CHUNK_CLEAR, 256, NULL, 0);
	q = ring_add(&r, KVP_OP_CHUNK_EVICT_UNUSED, 256, NULL, 0);
	ring_put(&r, "chunks");

	/* Prefix cache and sequences. */
	ring_init(&r, 0);
	q = ring_add(&r, KVP_OP_SEQ_ALLOC, 4096, tok, sizeof(tok));
	q->arg = 1, q->n = 48;
	q = ring_add(&r, KVP_OP_COMMIT, 256, NULL, 0);
	q->arg = LAST, q->n = 48, q->flags = KVP_SQE_RELEASE;
	q = ring_add(&r, KVP_OP_PREFIX_LOOKUP, 1024, tok, sizeof(tok));
	q->n = 48;
	q = ring_add(&r, KVP_OP_SEQ_EXTEND, 4096, tok, 8 * sizeof(uint32_t));
	q->arg = 1, q->n = 8;
	q = ring_add(&r, KVP_OP_RELEASE, 256, NULL, 0);
	q->arg = LAST;
	q = ring_add(&r, KVP_OP_PREPARE, 4096, NULL, 0);
	q->user = 7, q->n = 32;
	q = ring_add(&r, KVP_OP_COMMIT, 256, NULL, 0);
	q->arg = LAST, q->n = 32, q->flags = KVP_SQE_RELEASE;
	q = ring_add(&r, KVP_OP_SEQ_CREATE, 4096, create, sizeof(create));
	q->arg = 2, q->n = 4;
	q = ring_add(&r, KVP_OP_RELEASE, 256, NULL, 0);
	q->arg = LAST;
	q = ring_add(&r, KVP_OP_SEQ_FREE, 256, NULL, 0);
	q->arg = 2;
	q = ring_add(&r, KVP_OP_SEQ_FREE, 256, NULL, 0);
	q->arg = 1;
	ring_put(&r, "prefix_seq");
}

/* ------------------------------------------------------------ disk */

static void fill_page(uint8_t *p, uint64_t n, uint64_t seed)
{
	/* bf16-like: repeating high bytes, noisy low ones (zstd shrinks it). */
	for (uint64_t i = 0; i < n; i += 2) {
		p[i] = (uint8_t)(seed * 31 + i * 7);
		p[i + 1] = (uint8_t)(0x3f + (i >> 9 & 1));
	}
}

/* Write a tier file with the tier's own writer; return its bytes. */
static uint8_t *disk_file(const struct kvp_layout *l, const char *codec, uint32_t slots,
			  uint64_t *bytes)
{
	char dir[] = "/tmp/kvpool-seeds-XXXXXX", path[64], err[128];
	struct disk_tier_config c = { .size = slots * disk_slot_bytes(l->page_bytes),
				      .layout = *l };
	struct errbuf e = { .msg = "" };
	struct disk_tier *dt;
	uint8_t *pages[4], *buf;
	struct disk_key k = { .tenant = disk_tenant_key("default") };
	int fd;

	if (!mkdtemp(dir))
		die("mkdtemp");
	c.dir = dir;
	if (disk_codec_parse(codec, &c.codec, err, sizeof(err)) ||
	    disk_tier_open(&dt, &c, &e)) {
		fprintf(stderr, "make_seeds: %s%s\n", err, e.msg);
		exit(1);
	}
	for (int i = 0; i < 4; i++) {
		pages[i] = malloc(l->page_bytes);
		fill_page(pages[i], l->page_bytes, (uint64_t)i);
	}
	/* A history of 3 pages (40 tokens), a prefix page, a chunk of 2. */
	k.user = 7;
	disk_tier_put(dt, &k, 0, 40, 3, (void *const *)pages);
	k = (struct disk_key){ .tenant = k.tenant, .kind = DISK_KIND_PREFIX, .user = 1 };
	memset(k.hash, 0xab, sizeof(k.hash));
	disk_tier_put(dt, &k, 0, l->page_tokens, 1, (void *const *)pages + 3);
	k.kind = DISK_KIND_CHUNK;
	memset(k.hash, 0xcd, sizeof(k.hash));
	disk_tier_put(dt, &k, 0, 2 * l->page_tokens, 2, (void *const *)pages + 1);
	disk_tier_flush(dt);
	disk_tier_close(dt);
	for (int i = 0; i < 4; i++)
		free(pages[i]);
	snprintf(path, sizeof(path), "%s/kvpool.disk", dir);
	*bytes = c.size;
	buf = malloc(*bytes);
	fd = open(path, O_RDONLY);
	if (fd < 0 || pread(fd, buf, *bytes, 0) != (ssize_t)*bytes)
		die(path);
	close(fd);
	unlink(path);
	rmdir(dir);
	return buf;
}

static void disk_seeds(void)
{
	static const char *const codecs[] = { "none", "zstd" };
	struct kvp_layout small, dflt;
	char err[128], name[64];

	kvp_layout_init(&small, 2, 2, 16, KVP_DTYPE_BF16, 16, err, sizeof(err));
	kvp_layout_init(&dflt, 2, 2, 64, KVP_DTYPE_BF16, 16, err, sizeof(err));
	for (int ci = 0; ci < 2; ci++) {
		uint64_t sb = disk_slot_bytes(small.page_bytes), bytes, n = 0;
		uint8_t *f = disk_file(&small, codecs[ci], 8, &bytes);
		uint8_t *seed = malloc(bytes);

		/* fuzz_disk_scan: header, u16 payload length, payload. */
		for (uint64_t s = 0; s < bytes / sb; s++) {
			const struct disk_rec_hdr *h = (const void *)(f + s * sb);
			uint16_t plen = h->magic == DISK_MAGIC ? (uint16_t)h->stored_len : 0;

			memcpy(seed + n, h, DISK_HDR_BYTES);
			memcpy(seed + n + DISK_HDR_BYTES, &plen, 2);
			memcpy(seed + n + DISK_HDR_BYTES + 2, f + s * sb + DISK_PAYLOAD_OFF, plen);
			n += DISK_HDR_BYTES + 2 + plen;
		}
		snprintf(name, sizeof(name), "tier_%s", codecs[ci]);
		put("fuzz_disk_scan", name, seed, n);
		free(seed);
		free(f);

		/* fuzz_disk_record: one slot (header, payload) of the default
		 * layout's file, per kind. */
		sb = disk_slot_bytes(dflt.page_bytes);
		f = disk_file(&dflt, ci ? "zstd:3" : "none", 8, &bytes);
		for (uint64_t s = 0; s < bytes / sb; s++) {
			const struct disk_rec_hdr *h = (const void *)(f + s * sb);

			/* Stored as is, one page of each kind is enough. */
			if (h->magic != DISK_MAGIC || (!ci && h->page))
				continue;
			seed = malloc(DISK_HDR_BYTES + h->stored_len);
			memcpy(seed, h, DISK_HDR_BYTES);
			memcpy(seed + DISK_HDR_BYTES, f + s * sb + DISK_PAYLOAD_OFF,
			       h->stored_len);
			snprintf(name, sizeof(name), "%s_kind%u_page%u", codecs[ci],
				 h->kind, h->page);
			put("fuzz_disk_record", name, seed, DISK_HDR_BYTES + h->stored_len);
			free(seed);
		}
		free(f);
	}
}

/* ------------------------------------------------------------ remote */

static void remote_seeds(void)
{
	struct kvp_layout l;
	struct disk_codec none = { .id = DISK_CODEC_NONE }, zstd;
	struct remote_key k = { .kind = DISK_KIND_PREFIX, .tenant = disk_tenant_key("default") };
	struct disk_codec_ctx *cx;
	uint8_t *page, *val;
	char err[128];
	size_t n;

	kvp_layout_init(&l, 2, 2, 64, KVP_DTYPE_BF16, 16, err, sizeof(err));
	disk_codec_parse("zstd", &zstd, err, sizeof(err));
	zstd.elem_bytes = 2;
	cx = disk_codec_ctx_new(l.page_bytes);
	page = malloc(l.page_bytes);
	val = malloc(remote_value_max(l.page_bytes));
	fill_page(page, l.page_bytes, 5);
	k.layout_id = disk_layout_id(&l);
	memset(k.hash, 0x11, sizeof(k.hash));
	n = remote_value_encode(cx, &none, &k, page, l.page_bytes, val);
	put("fuzz_remote_value", "prefix_page_none", val, n);
	k.kind = DISK_KIND_CHUNK;
	k.page = 1;
	n = remote_value_encode(cx, &zstd, &k, page, l.page_bytes, val);
	put("fuzz_remote_value", "chunk_page_zstd", val, n);
	/* A history's record: shorter than a page, stored as is. */
	k.kind = DISK_KIND_USER;
	k.page = REMOTE_PAGE_REC;
	n = remote_value_encode(cx, &zstd, &k, page, 96, val);
	put("fuzz_remote_value", "user_record", val, n);
	put("fuzz_remote_value", "short", val, 100);
	free(page);
	free(val);
	disk_codec_ctx_free(cx);
}

/* ------------------------------------------------------------ cluster */

static void put_text(const char *target, const char *name, const char *s)
{
	put(target, name, s, strlen(s));
}

#define MAP3 "*3\r\n" \
	"*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$4\r\nid-a\r\n" \
	"*3\r\n:5461\r\n:10922\r\n*2\r\n$9\r\n127.0.0.1\r\n:7001\r\n" \
	"*4\r\n:10923\r\n:16383\r\n*2\r\n$0\r\n\r\n:7002\r\n*2\r\n$9\r\n127.0.0.1\r\n:7005\r\n"
#define MAP1 "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n"
#define SEP "\n#node\n"

static void cat(char *seg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cat(char *seg, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(seg + strlen(seg), 2048 - strlen(seg), fmt, ap);
	va_end(ap);
}

/* fuzz_cluster_reply.c's batch: GET key0..key15, SET key0..key3, DEL
 * key4, DBSIZE; each connection's whole conversation is one segment. */
static void cluster_three(void)
{
	char seg[5][2048] = { MAP3 }, key[16], all[5 * 2048 + 64] = "";
	bool moved = false, ask = false;

	for (int i = 0; i < 16; i++) {
		int n = snprintf(key, sizeof(key), "key%d", i);
		uint16_t slot = redis_cluster_slot(key, (size_t)n);
		int node = slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2;

		if (node == 1 && !moved) {
			/* Moved for good: node 3 answers, the map is read again. */
			cat(seg[1], "-MOVED %u 127.0.0.1:7003\r\n", slot);
			cat(seg[3], "$5\r\nmoved\r\n");
			moved = true;
		} else if (node == 2 && !ask) {
			/* Asked once: ASKING (+OK) and the GET on node 4. */
			cat(seg[2], "-ASK %u 127.0.0.1:7004\r\n", slot);
			cat(seg[4], "+OK\r\n$3\r\nask\r\n");
			ask = true;
		} else if (i % 5 == 4) {
			cat(seg[node], "-TRYAGAIN Multiple keys request during rehashing\r\n");
		} else {
			cat(seg[node], i % 3 ? "$6\r\nval-%02d\r\n" : "$-1\r\n", i);
		}
	}
	cat(seg[0], MAP3);
	for (int i = 0; i < 5; i++) {
		int n = snprintf(key, sizeof(key), "key%d", i);
		uint16_t slot = redis_cluster_slot(key, (size_t)n);

		cat(seg[slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2], i < 4 ? "+OK\r\n" : ":1\r\n");
	}
	for (int k = 0; k < 3; k++)
		cat(seg[k], ":%d\r\n", 10 + k);
	for (int k = 0; k < 5; k++)
		cat(all, "%s%s", k ? SEP : "", seg[k]);
	put("fuzz_cluster_reply", "three_nodes", all, strlen(all));
}

static void cluster_seeds(void)
{
	char one[2048] = MAP1;

	cluster_three();
	for (int i = 0; i < 16; i++)
		cat(one, i % 4 ? "$2\r\nv%d\r\n" : "$-1\r\n", i % 10);
	cat(one, "+OK\r\n+OK\r\n+OK\r\n+OK\r\n:0\r\n:16\r\n");
	put("fuzz_cluster_reply", "one_node", one, strlen(one));
	/* The same node, closing its side after its answers. */
	memmove(one + 5, one, strlen(one) + 1);
	memcpy(one, "#fin\n", 5);
	put("fuzz_cluster_reply", "one_node_closes", one, strlen(one));
	put_text("fuzz_cluster_reply", "no_cluster",
		 "-ERR This instance has cluster support disabled\r\n");
	put_text("fuzz_cluster_reply", "slots_out_of_range",
		 "*2\r\n*3\r\n:-5\r\n:99999\r\n*2\r\n$9\r\n127.0.0.1\r\n:0\r\n"
		 "*3\r\n:9\r\n:3\r\n*2\r\n$60\r\n"
		 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n:70000\r\n");
	/* A bulk that claims 2 GiB and stops. */
	put_text("fuzz_cluster_reply", "huge_bulk", MAP1 "$2147483647\r\nabc");
	/* Found by fuzz_cluster_reply (issue 25, item 2): an array header
	 * that claims 412,710,923 elements; hiredis 0.14 allocates them all
	 * (3.3 GB) before a byte of them arrives. */
	put_text("fuzz_cluster_reply", "regress_huge_array", "*412710923\r\n");
	/* Replies of the wrong type where a map or a value belongs. */
	put_text("fuzz_cluster_reply", "wrong_types",
		 "*1\r\n*3\r\n$1\r\n0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n"
		 SEP MAP1 "*2\r\n:1\r\n:2\r\n%3\r\n+OK\r\n");
}

/* ------------------------------------------------------------ config */

static void config_seeds(void)
{
	put_text("fuzz_config", "tenants",
		 "# two tenants\n"
		 "device_mem = 4M\nhost_mem = 16M\nworkers = 2\nshards = 2\n"
		 "layout = layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16\n"
		 "allow_uids = 0,1000\nadmin_uids = 0\nsocket_mode = 0600\n"
		 "[tenant a]\nuids = 1001, 1002\ndevice_mem = 1M\nmax_tokens_per_user = 4096\n"
		 "hash_salt = pepper\nmax_chunks = 10\nchunk_memory_ratio = 0.5\n"
		 "[tenant b]\ngids = 0\nhost_mem = 2M ; inline comment is not one\n");
	put_text("fuzz_config", "remote_metrics",
		 "remote = redis-cluster://127.0.0.1:7000,127.0.0.1:7001\n"
		 "remote_timeout_ms = 300\nremote_compress = zstd:3\n"
		 "remote_chunk_types = system,context\nremote_user_histories = yes\n"
		 "metrics = [::1]:9464\nlog_level = debug\nreclaim = yes\n"
		 "devices = 0,1\nbackend = shm\nsq_entries = 64\narena_bytes = 1M\n");
	put_text("fuzz_config", "bad_lines",
		 "device_mem = -1\n[tenant]\n= x\nnope\n[tenant a\nsocket = \n");
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: make_seeds DIR\n");
		return 2;
	}
	out_dir = argv[1];
	if (mkdir(out_dir, 0755) && errno != EEXIST)
		die(out_dir);
	hello_seeds();
	ring_histories();
	ring_sharing();
	disk_seeds();
	remote_seeds();
	cluster_seeds();
	config_seeds();
	return 0;
}
