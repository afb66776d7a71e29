/* SPDX-License-Identifier: MIT */
/*
 * remote_value.c - remote keys and values (remote_value.h): the disk tier's
 * record and codec, one page per value.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "remote_value.h"

static char kind_char(uint8_t kind)
{
	return kind == DISK_KIND_PREFIX ? 'p' : kind == DISK_KIND_CHUNK ? 'c' : 'u';
}

size_t remote_key_format(const struct remote_key *k, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	int n = snprintf(buf, REMOTE_KEY_MAX, "kvp1:%c:%016" PRIx64 ":%016" PRIx64 ":",
			 kind_char(k->kind), k->layout_id, k->tenant);

	/* A history: the user id only (its snapshot is in the value). */
	for (int i = 0; i < (k->kind == DISK_KIND_USER ? 8 : 32); i++) {
		buf[n++] = hex[k->hash[i] >> 4];
		buf[n++] = hex[k->hash[i] & 15];
	}
	/* Chunk and history pages: the page index after the hash. */
	if (k->kind != DISK_KIND_PREFIX && k->page == REMOTE_PAGE_REC)
		n += snprintf(buf + n, REMOTE_KEY_MAX - (size_t)n, ":r");
	else if (k->kind != DISK_KIND_PREFIX)
		n += snprintf(buf + n, REMOTE_KEY_MAX - (size_t)n, ":%" PRIu32, k->page);
	buf[n] = '\0';
	return (size_t)n;
}

/* A record's header says so (pos), so that no page can pass for one. */
#define REC_MARK UINT64_MAX

static void header_of(const struct remote_key *k, uint64_t page_bytes,
		      struct disk_rec_hdr *h)
{
	bool rec = k->page == REMOTE_PAGE_REC;

	memset(h, 0, sizeof(*h));
	h->magic = DISK_MAGIC;
	h->version = DISK_VERSION;
	h->kind = k->kind;
	h->layout_id = k->layout_id;
	h->tenant = k->tenant;
	memcpy(h->hash, k->hash, 32);
	h->page = rec ? 0 : k->page;
	h->npages = h->page + 1;
	h->pos = rec ? REC_MARK : 0;
	h->raw_len = (uint32_t)page_bytes;
}

size_t remote_value_encode(struct disk_codec_ctx *x, const struct disk_codec *c,
			   const struct remote_key *k, const void *page,
			   uint64_t len, void *out)
{
	uint64_t page_bytes = len;
	struct disk_rec_hdr h;
	uint8_t *payload = (uint8_t *)out + DISK_HDR_BYTES;
	uint8_t id = DISK_CODEC_NONE;
	size_t stored;

	header_of(k, page_bytes, &h);
	/* A record is small and the caller's format: stored as is. */
	if (c->id == DISK_CODEC_NONE || k->page == REMOTE_PAGE_REC) {
		memcpy(payload, page, page_bytes);
		stored = page_bytes;
	} else {
		stored = disk_codec_encode(x, c, page, page_bytes, payload, page_bytes, &id);
	}
	h.codec = id;
	h.stored_len = (uint32_t)stored;
	disk_record_seal(&h, payload);
	memcpy(out, &h, sizeof(h));
	return DISK_HDR_BYTES + stored;
}

/* 0 when val is a sealed record of k's page (any codec), else -EBADMSG. */
static int value_check(const struct remote_key *k, const void *val, size_t len,
		       uint64_t page_bytes, struct disk_rec_hdr *h)
{
	const uint8_t *payload = (const uint8_t *)val + DISK_HDR_BYTES;
	struct disk_rec_hdr want;

	if (len < DISK_HDR_BYTES)
		return -EBADMSG;
	memcpy(h, val, sizeof(*h)); /* the reply's bytes need not be aligned */
	header_of(k, page_bytes, &want);
	/* Its own key and geometry, or it is not this page: a value stored
	 * under the wrong key is as wrong as a flipped bit. A record may be
	 * shorter than a page; a page is a page. */
	if (h->kind != want.kind || h->layout_id != want.layout_id ||
	    h->tenant != want.tenant || memcmp(h->hash, want.hash, 32) ||
	    h->page != want.page || h->pos != want.pos ||
	    (k->page == REMOTE_PAGE_REC ? h->raw_len > page_bytes ||
					  h->codec != DISK_CODEC_NONE
					: h->raw_len != page_bytes) ||
	    h->stored_len != len - DISK_HDR_BYTES ||
	    /* Bounds as for a disk slot of this page (the payload follows the
	     * header directly in a value: no 4 KiB alignment on the wire). */
	    disk_record_check(h, payload, DISK_PAYLOAD_OFF + page_bytes))
		return -EBADMSG;
	return 0;
}

const void *remote_value_page(const struct remote_key *k, const void *val, size_t len,
			      uint64_t page_bytes)
{
	struct disk_rec_hdr h;

	if (value_check(k, val, len, page_bytes, &h) || h.codec != DISK_CODEC_NONE ||
	    h.stored_len != page_bytes)
		return NULL;
	return (const uint8_t *)val + DISK_HDR_BYTES;
}

int remote_value_decode(struct disk_codec_ctx *x, const struct remote_key *k,
			const void *val, size_t len, void *dst, uint64_t page_bytes)
{
	const uint8_t *payload = (const uint8_t *)val + DISK_HDR_BYTES;
	struct disk_rec_hdr h;

	if (value_check(k, val, len, page_bytes, &h))
		return -EBADMSG;
	memset((uint8_t *)dst + h.raw_len, 0, page_bytes - h.raw_len);
	if (h.codec == DISK_CODEC_NONE) {
		if (h.stored_len != h.raw_len)
			return -EBADMSG;
		memcpy(dst, payload, h.raw_len);
		return 0;
	}
	return disk_codec_decode(x, h.codec, payload, h.stored_len, dst, h.raw_len);
}
