/* SPDX-License-Identifier: MIT */
/*
 * compat.c - the KVPOOL_0.1 entry points of the growing structs' calls
 * (kvpool.h, GROWING STRUCTS): each is its _sz call with release 0.1's
 * size (kvp_reap's also with 0.1's layout, which rows.c writes:
 * kvp_completion.info moved to the end in 0.2 so it can grow). The top of
 * libclient: nothing calls these but the caller.
 */
#include <stddef.h>

#include "client_internal.h"

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
