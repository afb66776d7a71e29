/* SPDX-License-Identifier: MIT */
/*
 * disk_record.c - sealing and checking page records (disk_record.h).
 */
#include <errno.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "disk_record.h"

uint64_t disk_layout_id(const struct kvp_layout *l)
{
	/* Only what decides where a byte of a page lives: the geometry. */
	uint64_t v[6] = { l->layers, l->kv_heads, l->head_dim, l->dtype,
			  l->page_tokens, l->page_bytes };

	return XXH64(v, sizeof(v), 0x6b76706f6f6cull);
}

uint64_t disk_tenant_key(const char *name)
{
	return XXH64(name, strlen(name), 0);
}

static uint64_t record_sum(const struct disk_rec_hdr *h, const void *payload)
{
	struct disk_rec_hdr c = *h;
	XXH64_state_t st;

	c.checksum = 0;
	XXH64_reset(&st, 0);
	XXH64_update(&st, &c, sizeof(c));
	XXH64_update(&st, payload, h->stored_len);
	return XXH64_digest(&st);
}

void disk_record_seal(struct disk_rec_hdr *h, const void *payload)
{
	h->checksum = record_sum(h, payload);
}

int disk_record_check(const struct disk_rec_hdr *h, const void *payload,
		      uint64_t slot_bytes)
{
	static const struct disk_rec_hdr zero;

	if (h->magic == DISK_FREE_MAGIC || !memcmp(h, &zero, sizeof(zero)))
		return 1;
	if (h->magic != DISK_MAGIC || h->version != DISK_VERSION ||
	    h->stored_len > slot_bytes - DISK_PAYLOAD_OFF ||
	    h->raw_len > slot_bytes - DISK_PAYLOAD_OFF || !h->npages ||
	    h->page >= h->npages)
		return -EBADMSG;
	return record_sum(h, payload) == h->checksum ? 0 : -EBADMSG;
}
