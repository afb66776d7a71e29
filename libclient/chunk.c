/* SPDX-License-Identifier: MIT */
/*
 * chunk.c - the chunk calls (kvpool.h "Chunks"): roots and links, seal,
 * acquire, rows of names and entries, content and tokens, list, delete,
 * clear, evict_unused, limits. Synchronous, on share.c's helpers (inputs
 * at the start of the sync range, results in the same range).
 *
 * METADATA. kvpoold takes a JSON object. The old "key=value,key2=value2"
 * form is turned into {"key":"value","key2":"value2"} here (meta_json), so
 * callers and `kvctl chunks --filter source=docs` written for it keep
 * working; anything that starts like JSON goes as it is, and kvpoold
 * names what is wrong with it.
 *
 * WAITING FOR A SEAL. The daemon never blocks a worker on another client:
 * acquiring an entry that is being filled, or linking after one, fails at
 * once with -EAGAIN. Here kvp_chunk_acquire and kvp_chunk_link retry with
 * a short, growing sleep (SEAL_SLEEP_*) until wait_ms have passed. Polling
 * costs one round trip per retry; a parked completion would save those but
 * could hold a CQ slot for as long as a filler takes, and a filler that
 * dies is noticed at its hang-up anyway (the entry is deleted and the next
 * retry gets -ENOENT).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "client_internal.h"

#define SEAL_SLEEP_MIN_US 100u
#define SEAL_SLEEP_MAX_US 5000u

/* ------------------------------------------------------------ metadata */

static bool is_blank(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* Text that is meant as JSON: starts with { [ " a digit, '-' or a literal. */
static bool looks_like_json(const char *s)
{
	while (is_blank(*s))
		s++;
	return *s == '{' || *s == '[' || *s == '"' || *s == '-' ||
	       (*s >= '0' && *s <= '9') || !strncmp(s, "true", 4) ||
	       !strncmp(s, "false", 5) || !strncmp(s, "null", 4);
}

/* Append s[0, n) as a JSON string body (escaped) at out + *at. */
static int json_put_str(char *out, size_t cap, size_t *at, const char *s,
			size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		char esc[8];
		size_t k;

		if (ch == '"' || ch == '\\')
			k = (size_t)snprintf(esc, sizeof(esc), "\\%c", ch);
		else if (ch < 0x20)
			k = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", ch);
		else
			k = (size_t)snprintf(esc, sizeof(esc), "%c", ch);
		if (*at + k >= cap)
			return -1;
		memcpy(out + *at, esc, k);
		*at += k;
	}
	return 0;
}

static int put_raw(char *out, size_t cap, size_t *at, const char *s)
{
	size_t n = strlen(s);

	if (*at + n >= cap)
		return -1;
	memcpy(out + *at, s, n);
	*at += n;
	return 0;
}

/*
 * meta (NULL, "", JSON, or "k=v,k2=v2") as the text to send: *out points
 * at meta itself or at buf (the converted form); NULL for none.
 */
static int meta_json(struct kvp_client *c, const char *meta, char *buf,
		     size_t cap, const char **out, const char *what)
{
	const char *p = meta;
	size_t at = 0;

	*out = NULL;
	if (!meta || !*meta)
		return 0;
	if (looks_like_json(meta) || !strchr(meta, '=')) {
		if (strlen(meta) >= KVP_CHUNK_META_MAX)
			return kvpc_err(c, -EINVAL, "%s: %zu bytes of JSON; at most "
					"%d", what, strlen(meta), KVP_CHUNK_META_MAX - 1);
		*out = meta;
		return 0;
	}
	buf[at++] = '{';
	while (*p) {
		const char *end = strchr(p, ',');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		const char *eq = memchr(p, '=', n);

		if (!eq || eq == p)
			return kvpc_err(c, -EINVAL, "%s: '%.*s' is not key=value (give "
					"a JSON object, or key=value pairs separated "
					"by ',')", what, (int)n, p);
		if ((at > 1 && put_raw(buf, cap, &at, ",")) ||
		    put_raw(buf, cap, &at, "\"") ||
		    json_put_str(buf, cap, &at, p, (size_t)(eq - p)) ||
		    put_raw(buf, cap, &at, "\":\"") ||
		    json_put_str(buf, cap, &at, eq + 1, n - (size_t)(eq + 1 - p)) ||
		    put_raw(buf, cap, &at, "\""))
			goto long_;
		p += n + (end ? 1 : 0);
	}
	if (put_raw(buf, cap, &at, "}"))
		goto long_;
	buf[at] = '\0';
	*out = buf;
	return 0;
long_:
	return kvpc_err(c, -EINVAL, "%s: longer than %d bytes as JSON; keep it "
			"short (ids, names, versions)", what, KVP_CHUNK_META_MAX - 1);
}

/* ------------------------------------------------------------ register */

/* kvp_chunk_reg_out, then the fill lease when created. */
static int decode_reg(struct kvp_client *c, uint32_t idx,
		      const struct kvp_cqe *cqe, struct kvp_chunk_reg *out)
{
	struct kvp_chunk_reg_out ro;
	uint32_t len;
	int ret;

	if (cqe->out_bytes < sizeof(ro))
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent a %" PRIu32 "-byte "
				"register result", c->path, cqe->out_bytes);
	memcpy(&ro, kvpc_slot_out(c, idx, &len), sizeof(ro));
	memset(out, 0, sizeof(*out));
	out->id = ro.id;
	out->name = ro.name;
	out->created = ro.created ? 1 : 0;
	out->state = ro.state;
	out->start = ro.start;
	out->tokens = ro.tokens;
	if (!ro.created)
		return 0;
	ret = kvpc_decode_lease_off(c, idx, cqe, sizeof(ro), ro.tokens, 0,
				    &out->lease);
	if (!ret && (out->lease.len || out->lease.start != ro.start))
		return kvpc_err(c, -EPROTO, "kvpoold at %s returned a fill lease with %"
				PRIu64 " tokens already in it, at %" PRIu64 " for an "
				"entry at %" PRIu32, c->path, out->lease.len,
				out->lease.start, ro.start);
	return ret ? ret : kvpc_lease_add(c, &out->lease, KVPC_LEASE_CHUNK_FILL, 0);
}

KVP_PUBLIC
int kvp_chunk_put(struct kvp_client *c, const struct kvp_chunk_root *r,
		  struct kvp_chunk_reg *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_REGISTER };
	struct kvp_chunk_register_in h;
	char mbuf[KVP_CHUNK_META_MAX];
	const char *meta;
	unsigned char *in;
	struct kvp_cqe cqe;
	uint32_t idx = 0;
	int ret;

	if (!r || !out)
		return kvpc_null_arg(c, "chunk_put", r ? "the result pointer" :
				     "the registration");
	if (r->n && !r->tokens)
		return kvpc_err(c, -EINVAL, "chunk_put: NULL token ids for %" PRIu32
				" tokens", r->n);
	if (r->content_len && !r->content)
		return kvpc_err(c, -EINVAL, "chunk_put: NULL content of %" PRIu32
				" bytes", r->content_len);
	if ((ret = meta_json(c, r->meta, mbuf, sizeof(mbuf), &meta,
			     "chunk_put: the metadata")))
		return ret;
	h = (struct kvp_chunk_register_in){
		.type = r->type, .ntokens = r->n,
		.meta_len = meta ? (uint32_t)strlen(meta) + 1 : 0,
		.content_len = r->content_len,
	};
	in = kvpc_input(c, &sqe, sizeof(h) + (uint64_t)r->n * 4 + h.meta_len +
			r->content_len, "chunk_put");
	if (!in)
		return kvpc_input_fail(c);
	memcpy(in, &h, sizeof(h));
	in += sizeof(h);
	if (r->n)
		memcpy(in, r->tokens, (size_t)r->n * 4);
	in += (size_t)r->n * 4;
	if (meta)
		memcpy(in, meta, h.meta_len);
	if (r->content_len)
		memcpy(in + h.meta_len, r->content, r->content_len);
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	return decode_reg(c, idx, &cqe, out);
}

KVP_PUBLIC
int kvp_chunk_register(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
		       uint32_t type, const char *meta, struct kvp_chunk_reg *out)
{
	struct kvp_chunk_root r = { .tokens = tokens, .n = n, .type = type,
				    .meta = meta };

	return kvp_chunk_put(c, &r, out);
}

static uint64_t now_us(void)
{
	return mono_ns() / 1000u;
}

static void sleep_us(uint64_t us)
{
	struct timespec ts = { .tv_sec = (time_t)(us / 1000000u),
			       .tv_nsec = (long)(us % 1000000u) * 1000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Sleep before the next try of a call that met -EAGAIN (not sealed yet);
 * 0 when the deadline has passed. */
static int seal_wait(uint64_t deadline, uint64_t *pause)
{
	uint64_t now = now_us();

	if (now >= deadline)
		return 0;
	sleep_us(*pause < deadline - now ? *pause : deadline - now);
	if (*pause < SEAL_SLEEP_MAX_US)
		*pause *= 2;
	return 1;
}

/* The last error of a wait that ran out, with how long it waited. */
static int seal_timeout(struct kvp_client *c, uint32_t wait_ms)
{
	char msg[KVP_ERRLEN];

	snprintf(msg, sizeof(msg), "%s (waited %" PRIu32 " ms for the seal; "
		 "wait longer or check that its filler is alive)",
		 kvp_last_error(c), wait_ms);
	return kvpc_err(c, -EAGAIN, "%s", msg);
}

KVP_PUBLIC
int kvp_chunk_link(struct kvp_client *c, const struct kvp_chunk_id *name,
		   const struct kvp_chunk_id *parent, uint32_t wait_ms,
		   struct kvp_chunk_reg *out)
{
	const uint64_t deadline = now_us() + (uint64_t)wait_ms * 1000u;
	struct kvp_chunk_link_in h;
	uint64_t pause = SEAL_SLEEP_MIN_US;
	int ret;

	if (!name || !parent || !out)
		return kvpc_null_arg(c, "chunk_link", !name ? "the name" : !parent ?
				     "the parent entry id" : "the result pointer");
	h = (struct kvp_chunk_link_in){ .name = *name, .parent = *parent };
	do {
		struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_LINK };
		unsigned char *in = kvpc_input(c, &sqe, sizeof(h), "chunk_link");
		struct kvp_cqe cqe;
		uint32_t idx = 0;

		if (!in)
			return kvpc_input_fail(c);
		memcpy(in, &h, sizeof(h));
		ret = kvpc_call(c, &sqe, &cqe, &idx);
		if (ret >= 0)
			return decode_reg(c, idx, &cqe, out);
	} while (ret == -EAGAIN && seal_wait(deadline, &pause));
	return ret == -EAGAIN && wait_ms ? seal_timeout(c, wait_ms) : ret;
}

KVP_PUBLIC
int kvp_chunk_seal(struct kvp_client *c, const struct kvp_chunk_reg *reg)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_SEAL };
	char hex[65];
	int ret;

	if ((ret = kvpc_check_dead(c)))
		return ret;
	if (!reg)
		return kvpc_null_arg(c, "chunk_seal", "the registration");
	if (!reg->created) {
		kvp_chunk_id_format(&reg->id, hex);
		return kvpc_err(c, -EINVAL, "chunk_seal: entry %.16s...: this call did "
				"not create it (created = 0), so there is nothing to "
				"seal; kvp_chunk_acquire() it to read it", hex);
	}
	/* Its bytes land before anyone can read it (kvp_commit's rule). */
	ret = kvpc_cuda_wait_lease(c, reg->lease.id);
	if (ret)
		return ret;
	sqe.arg = reg->lease.id;
	ret = kvpc_call_res(c, &sqe);
	/* A seal ends the fill lease; so does a daemon that no longer has it. */
	if (kvpc_lease_ended(ret))
		kvpc_lease_drop(c, reg->lease.id);
	return ret;
}

KVP_PUBLIC
int kvp_chunk_acquire(struct kvp_client *c, const struct kvp_chunk_id *id,
		      uint32_t wait_ms, struct kvp_lease *out)
{
	const uint64_t deadline = now_us() + (uint64_t)wait_ms * 1000u;
	uint64_t pause = SEAL_SLEEP_MIN_US;
	int ret;

	if (!out)
		return kvpc_null_arg(c, "chunk_acquire", "the lease pointer");
	do {
		struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_ACQUIRE };

		if ((ret = kvpc_put_id(c, &sqe, id, "chunk_acquire")))
			return ret;
		ret = kvpc_call_lease(c, &sqe, 0, 0, out);
		if (!ret)
			ret = kvpc_lease_add(c, out, KVPC_LEASE_READ, 0);
	} while (ret == -EAGAIN && seal_wait(deadline, &pause));
	return ret == -EAGAIN && wait_ms ? seal_timeout(c, wait_ms) : ret;
}

KVP_PUBLIC
int kvp_chunk_copy(struct kvp_client *c, const struct kvp_chunk_id *id,
		   uint32_t from, uint32_t to)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_COPY, .arg = from, .n = to };
	int ret = kvpc_put_id(c, &sqe, id, "chunk_copy");

	return ret ? ret : kvpc_call_res(c, &sqe);
}

/* ------------------------------------------------------------ rows */

/* A call on one id whose result is one struct of size bytes. */
static int call_row(struct kvp_client *c, uint8_t opcode,
		    const struct kvp_chunk_id *id, void *out, size_t size,
		    const char *what)
{
	struct kvp_sqe sqe = { .opcode = opcode };
	struct kvp_cqe cqe;
	uint32_t idx = 0, len;
	int ret;

	if (!out)
		return kvpc_null_arg(c, what, "the result pointer");
	if ((ret = kvpc_put_id(c, &sqe, id, what)))
		return ret;
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if (cqe.out_bytes < size)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent %" PRIu32 " bytes for "
				"%s, expected %zu", c->path, cqe.out_bytes, what, size);
	memcpy(out, kvpc_slot_out(c, idx, &len), size);
	return 0;
}

/* The daemon terminates them; a short string never reads past here. */
static void info_terminate(struct kvp_chunk_info *ci)
{
	ci->meta[KVP_CHUNK_META_MAX - 1] = '\0';
	ci->preview[KVP_CHUNK_PREVIEW_MAX - 1] = '\0';
}

/* The rows below are written at the caller's stride (kvpool.h, GROWING
 * STRUCTS; rows.c). */
KVP_PUBLIC
int kvp_chunk_get_sz(struct kvp_client *c, const struct kvp_chunk_id *id,
		     struct kvp_chunk_info *out, size_t size)
{
	struct kvp_chunk_info ci;
	int ret = kvpc_row_size(c, size, KVP_CHUNK_INFO_SIZE_VER0, "chunk_get");

	if (!ret && !out)
		ret = kvpc_null_arg(c, "chunk_get", "the result pointer");
	if (!ret)
		ret = call_row(c, KVP_OP_CHUNK_GET, id, &ci, sizeof(ci), "chunk_get");
	if (ret)
		return ret;
	info_terminate(&ci);
	kvpc_rows_put(out, size, &ci, sizeof(ci), 1);
	return 0;
}

KVP_PUBLIC
int kvp_chunk_entry_sz(struct kvp_client *c, const struct kvp_chunk_id *id,
		       struct kvp_chunk_entry_info *out, size_t size)
{
	struct kvp_chunk_entry_info en;
	int ret = kvpc_row_size(c, size, KVP_CHUNK_ENTRY_INFO_SIZE_VER0,
				"chunk_entry");

	if (!ret && !out)
		ret = kvpc_null_arg(c, "chunk_entry", "the result pointer");
	if (!ret)
		ret = call_row(c, KVP_OP_CHUNK_ENTRY, id, &en, sizeof(en), "chunk_entry");
	if (!ret)
		kvpc_rows_put(out, size, &en, sizeof(en), 1);
	return ret;
}

KVP_PUBLIC
int kvp_chunk_entries_sz(struct kvp_client *c, const struct kvp_chunk_id *name,
			 struct kvp_chunk_entry_info *rows, size_t size,
			 uint32_t max)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_ENTRIES };
	uint32_t idx = 0, len, fit, got;
	struct kvp_cqe cqe;
	int ret;

	if ((ret = kvpc_row_size(c, size, KVP_CHUNK_ENTRY_INFO_SIZE_VER0,
				 "chunk_entries")))
		return ret;
	if (max && !rows)
		return kvpc_null_arg(c, "chunk_entries", "the row array");
	if ((ret = kvpc_put_id(c, &sqe, name, "chunk_entries")))
		return ret;
	fit = (uint32_t)(c->sync_bytes / sizeof(*rows));
	sqe.n = max < fit ? max : fit;
	if (!sqe.n)
		sqe.n = 1; /* the daemon wants room for one; the count comes back */
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	got = (uint32_t)ret < sqe.n ? (uint32_t)ret : sqe.n;
	if ((uint64_t)got * sizeof(*rows) > cqe.out_bytes)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent %" PRIu32 " bytes for "
				"%" PRIu32 " entries", c->path, cqe.out_bytes, got);
	if (got > max)
		got = max;
	if (got)
		kvpc_rows_put(rows, size, kvpc_slot_out(c, idx, &len),
			      sizeof(*rows), got);
	return ret;
}

/* CONTENT / TOKENS: page through [0, total) units into buf[0, cap). */
static int call_span(struct kvp_client *c, uint8_t opcode,
		     const struct kvp_chunk_id *name, void *buf, uint64_t cap,
		     size_t unit, uint64_t *total, const char *what)
{
	uint64_t at = 0;

	*total = 0;
	if (cap && !buf)
		return kvpc_null_arg(c, what, "the buffer");
	do {
		struct kvp_sqe sqe = { .opcode = opcode, .arg = at };
		struct kvp_cqe cqe;
		uint32_t idx = 0, len;
		int ret;

		if ((ret = kvpc_put_id(c, &sqe, name, what)))
			return ret;
		ret = kvpc_call(c, &sqe, &cqe, &idx);
		if (ret < 0)
			return ret;
		if ((uint64_t)ret * unit != cqe.out_bytes || at + (uint64_t)ret >
		    cqe.val0 || (!ret && at < cqe.val0))
			return kvpc_err(c, -EPROTO, "kvpoold at %s sent %d units of "
					"%s at %" PRIu64 " of %" PRIu64, c->path, ret,
					what, at, (uint64_t)cqe.val0);
		*total = cqe.val0;
		if (at < cap)
			memcpy((unsigned char *)buf + at * unit,
			       kvpc_slot_out(c, idx, &len),
			       (size_t)((cap - at < (uint64_t)ret ? cap - at :
					 (uint64_t)ret) * unit));
		at += (uint64_t)ret;
	} while (at < *total && at < cap);
	return (int)(at < cap ? at : cap);
}

KVP_PUBLIC
int kvp_chunk_content(struct kvp_client *c, const struct kvp_chunk_id *name,
		      void *buf, size_t cap, size_t *len)
{
	uint64_t total;
	int ret = call_span(c, KVP_OP_CHUNK_CONTENT, name, buf, cap, 1, &total,
			    "chunk_content");

	if (len)
		*len = (size_t)total;
	return ret;
}

KVP_PUBLIC
int kvp_chunk_tokens(struct kvp_client *c, const struct kvp_chunk_id *name,
		     uint32_t *buf, uint32_t cap, uint32_t *n)
{
	uint64_t total;
	int ret = call_span(c, KVP_OP_CHUNK_TOKENS, name, buf, cap, 4, &total,
			    "chunk_tokens");

	if (n)
		*n = (uint32_t)total;
	return ret;
}

KVP_PUBLIC
int kvp_chunk_list_sz(struct kvp_client *c, uint32_t type, const char *filter,
		      const struct kvp_chunk_id *after,
		      struct kvp_chunk_info *rows, size_t size, uint32_t max,
		      int *more)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_LIST };
	struct kvp_chunk_list_in h = { .type = type, .has_after = after ? 1 : 0 };
	char fbuf[KVP_CHUNK_META_MAX];
	const unsigned char *src;
	const char *f;
	unsigned char *in;
	struct kvp_cqe cqe;
	uint32_t idx = 0, len, fit;
	size_t flen;
	int ret;

	if ((ret = kvpc_row_size(c, size, KVP_CHUNK_INFO_SIZE_VER0, "chunk_list")))
		return ret;
	if (!rows || !max)
		return kvpc_err(c, -EINVAL, "chunk_list: need room for at least one row");
	if ((ret = meta_json(c, filter, fbuf, sizeof(fbuf), &f,
			     "chunk_list: the filter")))
		return ret;
	flen = f ? strlen(f) + 1 : 0;
	h.filter_len = (uint32_t)flen;
	if (after)
		h.after = *after;
	if (!(in = kvpc_input(c, &sqe, sizeof(h) + flen, "chunk_list")))
		return kvpc_input_fail(c);
	memcpy(in, &h, sizeof(h));
	if (flen)
		memcpy(in + sizeof(h), f, flen);
	/* At most what the sync range holds; the caller pages on with after. */
	fit = (uint32_t)(c->sync_bytes / sizeof(*rows));
	sqe.n = max < fit ? max : fit;
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if ((uint32_t)ret > sqe.n || (uint64_t)ret * sizeof(*rows) > cqe.out_bytes)
		return kvpc_err(c, -EPROTO, "kvpoold at %s listed %d chunks in %" PRIu32
				" bytes (asked for at most %" PRIu32 ")", c->path, ret,
				cqe.out_bytes, sqe.n);
	src = kvpc_slot_out(c, idx, &len);
	for (int i = 0; i < ret; i++) {
		/* Terminated in a private copy, then at the caller's stride. */
		struct kvp_chunk_info ci;

		memcpy(&ci, src + (size_t)i * sizeof(ci), sizeof(ci));
		info_terminate(&ci);
		kvpc_rows_put((unsigned char *)rows + (size_t)i * size, size, &ci,
			      sizeof(ci), 1);
	}
	if (more)
		*more = cqe.val0 ? 1 : 0;
	return ret;
}

/* ------------------------------------------------------------ removal */

KVP_PUBLIC
int kvp_chunk_delete(struct kvp_client *c, const struct kvp_chunk_id *id)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_DELETE };
	int ret = kvpc_put_id(c, &sqe, id, "chunk_delete");

	return ret ? ret : kvpc_call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_chunk_clear(struct kvp_client *c, uint32_t type)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_CLEAR, .n = type };

	return kvpc_call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_chunk_evict_unused(struct kvp_client *c, uint32_t max_age_s)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_EVICT_UNUSED, .arg = max_age_s };

	return kvpc_call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_chunk_limits(struct kvp_client *c, int64_t max_chunks,
		     double memory_ratio, struct kvp_chunk_limits *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CHUNK_LIMITS };
	struct kvp_chunk_limits_in h = { .max_chunks = max_chunks,
					 .memory_ratio = memory_ratio };
	struct kvp_chunk_limits tmp;
	unsigned char *in = kvpc_input(c, &sqe, sizeof(h), "chunk_limits");
	struct kvp_cqe cqe;
	uint32_t idx = 0, len;
	int ret;

	if (!in)
		return kvpc_input_fail(c);
	memcpy(in, &h, sizeof(h));
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if (cqe.out_bytes < sizeof(tmp))
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent %" PRIu32 " bytes of "
				"chunk limits", c->path, cqe.out_bytes);
	memcpy(&tmp, kvpc_slot_out(c, idx, &len), sizeof(tmp));
	if (out)
		*out = tmp;
	return 0;
}
