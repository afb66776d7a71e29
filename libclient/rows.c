/* SPDX-License-Identifier: MIT */
/*
 * rows.c - growing structs (kvpool.h, GROWING STRUCTS): the check of the
 * caller's struct size and the copy of rows at the caller's stride, which
 * the _sz calls use. The KVPOOL_0.1 entry points on top of those calls are
 * compat.c's, so this file calls nothing above it.
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
