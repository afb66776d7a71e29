/* SPDX-License-Identifier: MIT */
/*
 * rows.c - growing structs (kvpool.h, GROWING STRUCTS): the check of the
 * caller's struct size, the copy of rows at the caller's stride, and the
 * KVPOOL_0.1 entry points, which are the _sz calls with release 0.1's
 * sizes (kvp_reap's also with its layout: kvp_completion.info moved to the
 * end in 0.2 so it can grow).
 *
 * The daemon and the library are built from one tree (the attach checks
 * the protocol version), so rows on the wire are this library's structs;
 * only the caller's copy may be older or newer.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* Release 0.1's sizes, fixed forever: a field added since must not move
 * them (the static asserts fail the build if it does). */
_Static_assert(offsetof(struct kvp_user_info, pages_disk) ==
	       KVP_USER_INFO_SIZE_VER0, "kvp_user_info 0.1 prefix");
_Static_assert(offsetof(struct kvp_user_info, tokens_disk) + 8 ==
	       KVP_USER_INFO_SIZE_VER1, "kvp_user_info 0.2 prefix");
_Static_assert(sizeof(struct kvp_client_info) >= KVP_CLIENT_INFO_SIZE_VER0,
	       "kvp_client_info 0.1 prefix");
_Static_assert(sizeof(struct kvp_chunk_info) >= KVP_CHUNK_INFO_SIZE_VER0,
	       "kvp_chunk_info 0.1 prefix");
_Static_assert(offsetof(struct kvp_chunk_info, meta) + KVP_CHUNK_META_MAX ==
	       KVP_CHUNK_INFO_SIZE_VER0, "kvp_chunk_info 0.1 prefix ends with meta");
_Static_assert(sizeof(struct kvp_chunk_entry_info) >= KVP_CHUNK_ENTRY_INFO_SIZE_VER0,
	       "kvp_chunk_entry_info 0.1 prefix");
_Static_assert(offsetof(struct kvp_chunk_entry_info, children) + 4 ==
	       KVP_CHUNK_ENTRY_INFO_SIZE_VER0, "kvp_chunk_entry_info 0.1 prefix");
_Static_assert(offsetof(struct kvp_append_item, n) + 4 ==
	       KVP_APPEND_ITEM_SIZE_VER0, "kvp_append_item 0.1 prefix");
_Static_assert(offsetof(struct kvp_seq_src, chunk) + KVP_CHUNK_ID_BYTES ==
	       KVP_SEQ_SRC_SIZE_VER0, "kvp_seq_src 0.1 prefix");
_Static_assert(offsetof(struct kvp_compose_req, query) + KVP_CHUNK_ID_BYTES ==
	       KVP_COMPOSE_REQ_SIZE_VER0, "kvp_compose_req 0.1 prefix");

/* kvp_completion as release 0.1 laid it out: info (its 0.1 size) after op. */
struct completion_ver0 {
	uint64_t tag;
	int32_t res;
	uint32_t op;
	unsigned char info[KVP_USER_INFO_SIZE_VER0];
	struct kvp_lease lease;
	const char *error;
};
_Static_assert(sizeof(struct completion_ver0) == KVP_COMPLETION_SIZE_VER0,
	       "kvp_completion 0.1 layout");
_Static_assert(offsetof(struct kvp_completion, info) + KVP_USER_INFO_SIZE_VER1 ==
	       KVP_COMPLETION_SIZE_VER1, "kvp_completion 0.2 layout");


int kvpc_row_size(struct kvp_client *c, size_t size, size_t ver0,
		  const char *what)
{
	if (size >= ver0 && size % 8 == 0 && size <= UINT32_MAX)
		return 0;
	return kvpc_err(c, -EINVAL,
			"%s: the caller's struct size %zu is not one a kvpool.h ever "
			"had (at least %zu, a multiple of 8): call it through the "
			"kvpool.h macro, which passes sizeof", what, size, ver0);
}

void kvpc_rows_put(void *dst, size_t size, const void *src, size_t have,
		   uint32_t n)
{
	size_t m = size < have ? size : have;

	for (uint32_t i = 0; i < n; i++) {
		unsigned char *d = (unsigned char *)dst + (size_t)i * size;

		memcpy(d, (const unsigned char *)src + (size_t)i * have, m);
		if (size > m)
			memset(d + m, 0, size - m); /* fields this library lacks */
	}
}

int kvpc_rows_in(struct kvp_client *c, const void *src, size_t size,
		 size_t own, size_t ver0, uint32_t n, const void **out,
		 void **tmp, const char *what)
{
	const unsigned char *s = src;
	unsigned char *d;
	size_t m = size < own ? size : own;
	int ret;

	*out = src;
	*tmp = NULL;
	if (!n || size == own)
		return 0; /* nothing to read, or the caller's layout is ours */
	if (!src)
		return 0; /* the call names the NULL array itself */
	if ((ret = kvpc_row_size(c, size, ver0, what)))
		return ret;
	for (uint32_t i = 0; i < n; i++)
		for (size_t b = own; b < size; b++)
			if (s[(size_t)i * size + b])
				return kvpc_err(c, -E2BIG,
						"%s: element %" PRIu32 " sets byte %zu of a "
						"%zu-byte struct; this libkvpool's has %zu "
						"(a field it does not know): use a libkvpool "
						"as new as the kvpool.h the program was "
						"built with", what, i, b, size, own);
	d = calloc(n, own);
	if (!d)
		return kvpc_err(c, -ENOMEM, "%s: out of memory for %" PRIu32
				" elements", what, n);
	for (uint32_t i = 0; i < n; i++)
		memcpy(d + (size_t)i * own, s + (size_t)i * size, m);
	*out = d;
	*tmp = d;
	return 0;
}

int kvpc_completion_size(struct kvp_client *c, size_t size)
{
	/* 0.1's layout, or 0.2's and every later one (info last). Between
	 * them no kvpool.h had a kvp_completion. */
	if (size == KVP_COMPLETION_SIZE_VER0)
		return 0;
	return kvpc_row_size(c, size, KVP_COMPLETION_SIZE_VER1, "kvp_reap");
}

void kvpc_completion_put(void *dst, size_t size, const struct kvp_completion *k)
{
	struct completion_ver0 v;

	if (size != KVP_COMPLETION_SIZE_VER0) {
		kvpc_rows_put(dst, size, k, sizeof(*k), 1);
		return;
	}
	memset(&v, 0, sizeof(v));
	v.tag = k->tag;
	v.res = k->res;
	v.op = k->op;
	memcpy(v.info, &k->info, sizeof(v.info));
	v.lease = k->lease;
	v.error = k->error;
	memcpy(dst, &v, sizeof(v));
}

/* ------------------------------------------------------------ KVPOOL_0.1 */

KVP_PUBLIC
int (kvp_info)(struct kvp_client *c, uint64_t user, struct kvp_user_info *out)
{
	return kvp_info_sz(c, user, out, KVP_USER_INFO_SIZE_VER0);
}

KVP_PUBLIC
int (kvp_users)(struct kvp_client *c, uint64_t cursor,
		struct kvp_user_info *rows, uint32_t max, uint64_t *next)
{
	return kvp_users_sz(c, cursor, rows, KVP_USER_INFO_SIZE_VER0, max, next);
}

KVP_PUBLIC
int (kvp_clients)(struct kvp_client *c, uint64_t cursor,
		  struct kvp_client_info *rows, uint32_t max, uint64_t *next)
{
	return kvp_clients_sz(c, cursor, rows, KVP_CLIENT_INFO_SIZE_VER0, max, next);
}

KVP_PUBLIC
int (kvp_reap)(struct kvp_client *c, struct kvp_completion *out, uint32_t max,
	       uint32_t min_complete)
{
	return kvp_reap_sz(c, out, KVP_COMPLETION_SIZE_VER0, max, min_complete);
}

KVP_PUBLIC
int (kvp_chunk_get)(struct kvp_client *c, const struct kvp_chunk_id *id,
		    struct kvp_chunk_info *out)
{
	return kvp_chunk_get_sz(c, id, out, KVP_CHUNK_INFO_SIZE_VER0);
}

KVP_PUBLIC
int (kvp_chunk_entry)(struct kvp_client *c, const struct kvp_chunk_id *id,
		      struct kvp_chunk_entry_info *out)
{
	return kvp_chunk_entry_sz(c, id, out, KVP_CHUNK_ENTRY_INFO_SIZE_VER0);
}

KVP_PUBLIC
int (kvp_chunk_entries)(struct kvp_client *c, const struct kvp_chunk_id *name,
			struct kvp_chunk_entry_info *rows, uint32_t max)
{
	return kvp_chunk_entries_sz(c, name, rows, KVP_CHUNK_ENTRY_INFO_SIZE_VER0,
				    max);
}

KVP_PUBLIC
int (kvp_append_batch_async)(struct kvp_client *c,
			     const struct kvp_append_item *items, uint32_t count,
			     const void *kv, void *stream)
{
	return kvp_append_batch_async_sz(c, items, KVP_APPEND_ITEM_SIZE_VER0, count,
					 kv, stream);
}

KVP_PUBLIC
int (kvp_seq_create)(struct kvp_client *c, uint64_t seq,
		     const struct kvp_seq_src *src, uint32_t nsrc, uint32_t n_new,
		     struct kvp_lease *out)
{
	return kvp_seq_create_sz(c, seq, src, KVP_SEQ_SRC_SIZE_VER0, nsrc, n_new, out);
}

KVP_PUBLIC
int (kvp_compose)(struct kvp_client *c, const struct kvp_compose_req *reqs,
		  uint32_t nreq, struct kvp_composition *out)
{
	return kvp_compose_sz(c, reqs, KVP_COMPOSE_REQ_SIZE_VER0, nreq, out);
}

KVP_PUBLIC
int (kvp_compose_preview)(struct kvp_client *c,
			  const struct kvp_compose_req *reqs, uint32_t nreq,
			  struct kvp_composition *out)
{
	return kvp_compose_preview_sz(c, reqs, KVP_COMPOSE_REQ_SIZE_VER0, nreq, out);
}

KVP_PUBLIC
int (kvp_chunk_list)(struct kvp_client *c, uint32_t type, const char *filter,
		     const struct kvp_chunk_id *after,
		     struct kvp_chunk_info *rows, uint32_t max, int *more)
{
	return kvp_chunk_list_sz(c, type, filter, after, rows,
				 KVP_CHUNK_INFO_SIZE_VER0, max, more);
}
