/* SPDX-License-Identifier: MIT */
/*
 * ops_chunk.c - the chunk operations (proto.h CHUNK_*, kvpool.h "Chunks"):
 * register a root, link, seal, acquire, rows of names and entries,
 * content and tokens, list, delete, clear, evict_unused, limits. Each is a
 * thin layer between a checked submission and the engine's share_chunk_*
 * call, in the three steps ops_share.c describes (copy the input once,
 * validate the copy, call the engine under the pool's mutex and copy the
 * result out before it is let go).
 *
 * Waiting for a seal is the client's business: CHUNK_ACQUIRE of an entry,
 * or CHUNK_LINK after a parent, being filled completes at once with
 * -EAGAIN and libkvpool retries until its wait_ms runs out.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "ops_internal.h"
#include "kvpool_engine.h"

/* Tokens one register may carry (a 4 MiB input). */
#define SHARE_MAX_TOKENS (1u << 20)


static bool type_valid(uint32_t type, bool zero_ok)
{
	return (zero_ok && type == 0) ||
	       (type >= KVP_CHUNK_SYSTEM && type <= KVP_CHUNK_QUERY);
}

/* A string of len bytes (its NUL counted; 0: none) at s: NUL at the end and
 * nowhere before. */
static int check_str(struct op *o, const char *s, uint32_t len,
		     const char *what)
{
	if (!len)
		return 0;
	if (len > KVP_CHUNK_META_MAX)
		return errbuf_set(o->e, -EINVAL, "%s: %s of %" PRIu32 " bytes; at most "
				  "%u with its NUL", o->name, what, len,
				  KVP_CHUNK_META_MAX);
	if (s[len - 1] != '\0')
		return errbuf_set(o->e, -EINVAL, "%s: %s is not NUL-terminated within "
				  "its %" PRIu32 " bytes", o->name, what, len);
	if (strlen(s) != len - 1)
		return errbuf_set(o->e, -EINVAL, "%s: %s has a NUL at byte %zu of %"
				  PRIu32 "; its length must count exactly one, the "
				  "last", o->name, what, strlen(s), len);
	return 0;
}

/*
 * The result of a register or a link: kvp_chunk_reg_out, then the fill
 * lease when created. A fill lease released before its seal deletes the
 * entry: a result that does not fit undoes it. Pool locked.
 */
static int put_reg(struct op *o, struct engine *eng,
		   const struct share_chunk_reg *reg)
{
	struct kvp_chunk_reg_out ro = {
		.id = reg->id, .name = reg->name, .created = reg->created,
		.state = reg->state, .start = reg->start, .tokens = reg->tokens,
	};
	int ret;

	if (reg->created && (ret = op_put_lease(o, sizeof(ro), &reg->lease))) {
		engine_release(eng, reg->lease.id, NULL);
		return ret;
	}
	memcpy(o->out, &ro, sizeof(ro));
	if (!reg->created)
		o->cqe->out_bytes = sizeof(ro);
	return reg->created ? 1 : 0;
}

/* In a tensor-parallel pool rank 0 registers; the others join its fill
 * lease (engine.h, chunk fills as group leases). */
static int refuse_rank(struct op *o)
{
	if (!o->c->rank)
		return 0;
	return errbuf_set(o->e, -EINVAL, "%s: rank %" PRIu32 " of a tensor-parallel "
			  "pool: rank 0 registers chunks; join its fill lease "
			  "with kvp_lease_join", o->name, o->c->rank);
}

int op_chunk_register(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct kvp_chunk_register_in h;
	struct share_chunk_reg reg;
	struct share_chunk_root root;
	const unsigned char *in = NULL;
	const char *meta;
	struct engine *eng;
	uint64_t want;
	int ret;

	if ((ret = refuse_rank(o)) ||
	    (ret = op_input_header(o, &h, sizeof(h), 0, &in, NULL)))
		return ret;
	if (!type_valid(h.type, false))
		return errbuf_set(o->e, -EINVAL, "%s: chunk type %" PRIu32 " is unknown; "
				  "use 1 (system), 2 (context) or 3 (query)", o->name,
				  h.type);
	if (!h.ntokens || h.ntokens > SHARE_MAX_TOKENS)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " tokens; a chunk has 1 "
				  "to %u", o->name, h.ntokens, SHARE_MAX_TOKENS);
	want = sizeof(h) + (uint64_t)h.ntokens * 4 + h.meta_len + h.content_len;
	if (h.meta_len > KVP_CHUNK_META_MAX || q->in_len != want)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " tokens, %" PRIu32
				  " metadata bytes (at most %u) and %" PRIu32 " content "
				  "bytes need in_len %" PRIu64 "; it is %" PRIu32,
				  o->name, h.ntokens, h.meta_len, KVP_CHUNK_META_MAX,
				  h.content_len, want, q->in_len);
	meta = (const char *)in + sizeof(h) + (size_t)h.ntokens * 4;
	if ((ret = check_str(o, meta, h.meta_len, "the metadata")) ||
	    (ret = op_lease_room(o, sizeof(struct kvp_chunk_reg_out),
				 op_span_pages(o, h.ntokens))))
		return ret;
	root = (struct share_chunk_root){
		.tokens = (const uint32_t *)(in + sizeof(h)), .n = h.ntokens,
		.type = h.type, .meta = h.meta_len ? meta : NULL,
		.content = h.content_len ? meta + h.meta_len : NULL,
		.content_len = h.content_len,
	};
	do {
		eng = op_lock_own(o);
		ret = share_chunk_put(eng, &root, o->c->id, op_now_ns(), &reg, o->e);
		if (!ret)
			ret = put_reg(o, eng, &reg);
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	return ret;
}

int op_chunk_link(struct op *o)
{
	struct kvp_chunk_link_in h;
	struct share_chunk_reg reg;
	const unsigned char *in = NULL;
	struct engine *eng;
	int ret;

	if ((ret = refuse_rank(o)))
		return ret;
	if (o->sqe->in_len != sizeof(h))
		return errbuf_set(o->e, -EINVAL, "%s: the input is a name and a parent "
				  "id, %zu bytes; in_len is %" PRIu32, o->name,
				  sizeof(h), o->sqe->in_len);
	if ((ret = op_input_header(o, &h, sizeof(h), 0, &in, NULL)))
		return ret;
	eng = op_lock_own(o);
	/* The tokens are the name's: the lease room is known only now. */
	{
		struct kvp_chunk_info ci;
		struct errbuf ign = { 0 };

		if (!share_chunk_info(eng, &h.name, &ci, &ign) &&
		    (ret = op_lease_room(o, sizeof(struct kvp_chunk_reg_out),
					 op_span_pages(o, ci.tokens)))) {
			op_unlock_own(o);
			return ret;
		}
	}
	ret = share_chunk_link(eng, &h.name, &h.parent, o->c->id, op_now_ns(),
			       &reg, o->e);
	if (!ret)
		ret = put_reg(o, eng, &reg);
	op_unlock_own(o);
	return ret;
}

/* A tensor-parallel pool's fill lease is a group's: every rank seals it,
 * all but the last answered KVP_COMMIT_PENDING. */
int op_chunk_seal(struct op *o)
{
	struct engine *eng = op_lock_own(o);
	int ret;

	if (o->s->tenants.tp > 1)
		ret = engine_chunk_seal_rank(eng, o->sqe->arg, o->c->rank, o->c->id,
					     UINT32_MAX, o->e);
	else
		ret = share_chunk_seal(eng, o->sqe->arg, o->c->id, o->e);
	op_unlock_own(o);
	return ret;
}

int op_chunk_acquire(struct op *o)
{
	struct kvp_chunk_id id;
	struct engine_lease l;
	struct engine *eng;
	int ret;

	if ((ret = op_input_id(o, &id)))
		return ret;
	do {
		eng = op_lock_own(o);
		ret = share_chunk_acquire(eng, &id, o->c->id, op_now_ns(), &l, o->e);
		if (!ret && (ret = op_put_lease(o, 0, &l)))
			engine_release(eng, l.id, NULL);
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	return ret;
}

int op_chunk_get(struct op *o)
{
	struct kvp_chunk_info info;
	struct kvp_chunk_id id;
	int ret;

	if (o->out_len < sizeof(info))
		return errbuf_set(o->e, -EMSGSIZE, "%s: the result needs out_len >= %zu "
				  "bytes; out_len is %" PRIu32, o->name, sizeof(info),
				  o->out_len);
	if ((ret = op_input_id(o, &id)))
		return ret;
	do { /* another node's chunk: from the tiers below first */
		struct engine *eng = op_lock_own(o);

		ret = share_chunk_from_below(eng, &id, o->e);
		if (!ret)
			ret = share_chunk_info(eng, &id, &info, o->e);
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	if (ret)
		return ret;
	memcpy(o->out, &info, sizeof(info));
	o->cqe->out_bytes = sizeof(info);
	return 0;
}

int op_chunk_list(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	int max = op_list_rows(o, sizeof(struct kvp_chunk_info), "CHUNK_LIST");
	struct kvp_chunk_info *rows;
	struct kvp_chunk_list_in h;
	const unsigned char *in = NULL;
	const char *filter;
	bool more = false;
	int n;

	if (max < 0)
		return max;
	n = op_input_header(o, &h, sizeof(h), (size_t)max * sizeof(*rows), &in,
			    (void **)&rows);
	if (n)
		return n;
	if (h.rsv || h.has_after > 1)
		return errbuf_set(o->e, -EINVAL, "%s: reserved fields must be zero and "
				  "has_after 0 or 1", o->name);
	if (!type_valid(h.type, true))
		return errbuf_set(o->e, -EINVAL, "%s: chunk type %" PRIu32 " is unknown; "
				  "use 0 (all), 1 (system), 2 (context) or 3 (query)",
				  o->name, h.type);
	if (q->in_len != sizeof(h) + (uint64_t)h.filter_len)
		return errbuf_set(o->e, -EINVAL, "%s: a %" PRIu32 "-byte filter needs "
				  "in_len %" PRIu64 "; it is %" PRIu32, o->name,
				  h.filter_len, sizeof(h) + (uint64_t)h.filter_len,
				  q->in_len);
	filter = (const char *)in + sizeof(h);
	if ((n = check_str(o, filter, h.filter_len, "the filter")))
		return n;
	n = share_chunk_list(op_lock_own(o), h.type, h.filter_len ? filter : NULL,
			     h.has_after ? &h.after : NULL, rows, (uint32_t)max,
			     &more, o->e);
	op_unlock_own(o);
	if (n < 0)
		return n;
	if (n > max)
		return errbuf_set(o->e, -EPROTO, "%s: the engine listed %d rows for a "
				  "page of %d", o->name, n, max);
	memcpy(o->out, rows, (size_t)n * sizeof(*rows));
	o->cqe->out_bytes = (uint32_t)((size_t)n * sizeof(*rows));
	o->cqe->val0 = more;
	return n;
}

int op_chunk_delete(struct op *o)
{
	struct kvp_chunk_id id;
	int ret;

	if ((ret = op_input_id(o, &id)))
		return ret;
	ret = share_chunk_delete(op_lock_own(o), &id, o->e);
	op_unlock_own(o);
	return ret;
}

int op_chunk_clear(struct op *o)
{
	int ret;

	if (!type_valid(o->sqe->n, true))
		return errbuf_set(o->e, -EINVAL, "%s: chunk type %" PRIu32 " is unknown; "
				  "use 0 (all), 1 (system), 2 (context) or 3 (query)",
				  o->name, o->sqe->n);
	ret = share_chunk_clear(op_lock_own(o), o->sqe->n);
	op_unlock_own(o);
	return ret;
}

int op_chunk_evict_unused(struct op *o)
{
	uint64_t age = o->sqe->arg;
	int ret;

	if (age > UINT32_MAX)
		return errbuf_set(o->e, -EINVAL, "%s: max age %" PRIu64 " s; at most %"
				  PRIu32, o->name, age, UINT32_MAX);
	ret = share_chunk_evict_unused(op_lock_own(o), age * 1000000000ull, op_now_ns());
	op_unlock_own(o);
	return ret;
}


int op_chunk_entry(struct op *o)
{
	struct kvp_chunk_entry_info info;
	struct kvp_chunk_id id;
	int ret;

	if (o->out_len < sizeof(info))
		return errbuf_set(o->e, -EMSGSIZE, "%s: the result needs out_len >= %zu "
				  "bytes; out_len is %" PRIu32, o->name, sizeof(info),
				  o->out_len);
	if ((ret = op_input_id(o, &id)))
		return ret;
	do { /* as op_chunk_get */
		struct engine *eng = op_lock_own(o);

		ret = share_chunk_from_below(eng, &id, o->e);
		if (!ret)
			ret = share_chunk_entry(eng, &id, &info, o->e);
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	if (ret)
		return ret;
	memcpy(o->out, &info, sizeof(info));
	o->cqe->out_bytes = sizeof(info);
	return 0;
}

int op_chunk_entries(struct op *o)
{
	int max = op_list_rows(o, sizeof(struct kvp_chunk_entry_info), "CHUNK_ENTRIES");
	struct kvp_chunk_entry_info *rows;
	const unsigned char *in = NULL;
	struct kvp_chunk_id id;
	int n;

	if (max < 0)
		return max;
	if (o->sqe->in_len != sizeof(id))
		return errbuf_set(o->e, -EINVAL, "%s: the input is one %zu-byte chunk "
				  "id; in_len is %" PRIu32, o->name, sizeof(id),
				  o->sqe->in_len);
	n = op_input_header(o, &id, sizeof(id), (size_t)max * sizeof(*rows), &in,
			    (void **)&rows);
	if (n)
		return n;
	n = share_chunk_entries(op_lock_own(o), &id, rows, (uint32_t)max, o->e);
	op_unlock_own(o);
	if (n < 0)
		return n;
	memcpy(o->out, rows, (size_t)(n < max ? n : max) * sizeof(*rows));
	o->cqe->out_bytes = (uint32_t)((size_t)(n < max ? n : max) * sizeof(*rows));
	return n;
}

/* CONTENT (unit 1) and TOKENS (unit 4): [arg, arg + out_len / unit) of the
 * name's bytes or ids; val0 the whole length in units. */
static int chunk_span(struct op *o, bool tokens)
{
	const size_t unit = tokens ? 4 : 1;
	const void *data = NULL;
	struct kvp_chunk_id id;
	struct engine *eng;
	uint32_t total = 0;
	uint64_t n = 0;
	int ret;

	if ((ret = op_input_id(o, &id)))
		return ret;
	eng = op_lock_own(o);
	ret = tokens ? share_chunk_tokens(eng, &id, (const uint32_t **)&data,
					  &total, o->e) :
		       share_chunk_content(eng, &id, &data, &total, o->e);
	if (!ret && o->sqe->arg > total)
		ret = errbuf_set(o->e, -EINVAL, "%s: offset %" PRIu64 " is past the "
				 "chunk's %" PRIu32 " %s", o->name, o->sqe->arg,
				 total, tokens ? "tokens" : "content bytes");
	if (!ret) {
		n = total - o->sqe->arg;
		if (n > o->out_len / unit)
			n = o->out_len / unit;
		if (n)
			memcpy(o->out, (const unsigned char *)data +
			       o->sqe->arg * unit, (size_t)(n * unit));
	}
	op_unlock_own(o);
	if (ret)
		return ret;
	o->cqe->out_bytes = (uint32_t)(n * unit);
	o->cqe->val0 = total;
	return (int)n;
}

int op_chunk_content(struct op *o)
{
	return chunk_span(o, false);
}

int op_chunk_tokens(struct op *o)
{
	return chunk_span(o, true);
}

int op_chunk_limits(struct op *o)
{
	struct kvp_chunk_limits_in h;
	struct kvp_chunk_limits out;
	const unsigned char *in = NULL;
	int ret;

	if (o->out_len < sizeof(out))
		return errbuf_set(o->e, -EMSGSIZE, "%s: the result needs out_len >= %zu "
				  "bytes; out_len is %" PRIu32, o->name, sizeof(out),
				  o->out_len);
	if (o->sqe->in_len != sizeof(h))
		return errbuf_set(o->e, -EINVAL, "%s: the input is %zu bytes; in_len "
				  "is %" PRIu32, o->name, sizeof(h), o->sqe->in_len);
	if ((ret = op_input_header(o, &h, sizeof(h), 0, &in, NULL)))
		return ret;
	ret = share_chunk_limits(op_lock_own(o), h.max_chunks, h.memory_ratio,
				 &out, o->e);
	op_unlock_own(o);
	if (ret)
		return ret;
	memcpy(o->out, &out, sizeof(out));
	o->cqe->out_bytes = sizeof(out);
	return 0;
}
