/* SPDX-License-Identifier: MIT */
/*
 * disk_record.c - sealing and checking page records (disk_record.h).
 */
#include <errno.h>
#include <stdbool.h>
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

/* A tensor-parallel pool's frame is its ranks' pages, rank after rank: the
 * same bytes in another order than a tp = 1 page, so another id. tp <= 1
 * is disk_layout_id's, as records written before tp existed are. */
uint64_t disk_layout_id_tp(const struct kvp_layout *l, uint32_t tp)
{
	uint64_t v[2] = { disk_layout_id(l), tp };

	return tp <= 1 ? v[0] : XXH64(v, sizeof(v), 0x6b767470ull);
}

uint64_t disk_tenant_key(const char *name)
{
	return XXH64(name, strlen(name), 0);
}

static void sum_begin(XXH64_state_t *st, const struct disk_rec_hdr *h)
{
	struct disk_rec_hdr c = *h;

	c.checksum = 0;
	XXH64_reset(st, 0);
	XXH64_update(st, &c, sizeof(c));
}

static uint64_t record_sum(const struct disk_rec_hdr *h, const void *payload)
{
	XXH64_state_t st;

	sum_begin(&st, h);
	XXH64_update(&st, payload, h->stored_len);
	return XXH64_digest(&st);
}

void disk_record_seal(struct disk_rec_hdr *h, const void *payload)
{
	h->checksum = record_sum(h, payload);
}

/* The fields a record must have before its checksum is worth computing. */
static bool hdr_sane(const struct disk_rec_hdr *h, uint64_t slot_bytes)
{
	return h->magic == DISK_MAGIC && h->version == DISK_VERSION &&
	       h->stored_len <= slot_bytes - DISK_PAYLOAD_OFF &&
	       h->raw_len <= slot_bytes - DISK_PAYLOAD_OFF && h->npages &&
	       h->page < h->npages;
}

int disk_record_check(const struct disk_rec_hdr *h, const void *payload,
		      uint64_t slot_bytes)
{
	static const struct disk_rec_hdr zero;

	if (h->magic == DISK_FREE_MAGIC || !memcmp(h, &zero, sizeof(zero)))
		return 1;
	if (!hdr_sane(h, slot_bytes))
		return -EBADMSG;
	return record_sum(h, payload) == h->checksum ? 0 : -EBADMSG;
}

int disk_record_check_read(const struct disk_rec_hdr *h,
			   disk_record_read_fn read, void *arg, void *buf,
			   uint64_t buf_bytes)
{
	uint64_t off = 0;
	XXH64_state_t st;

	if (!hdr_sane(h, disk_slot_bytes(h->raw_len)))
		return -EBADMSG;
	sum_begin(&st, h);
	while (off < h->stored_len) {
		uint64_t want = h->stored_len - off;
		int64_t got = read(arg, off, buf, buf_bytes);

		if (want > buf_bytes)
			want = buf_bytes;
		if (got < (int64_t)want)
			return -EBADMSG; /* cut short: the file ends in it */
		XXH64_update(&st, buf, want);
		off += want;
	}
	return XXH64_digest(&st) == h->checksum ? 0 : -EBADMSG;
}
