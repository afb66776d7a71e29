/* SPDX-License-Identifier: MIT */
/*
 * fuzz_disk_record - one slot of the disk tier's file as the disk thread
 * reads it back (daemon/disk/disk_thread.c, open_page): the 128-byte
 * header (the input's first bytes), the payload from DISK_PAYLOAD_OFF (the
 * rest), checked by disk_record_check() and, when it passes, decoded by
 * disk_codec_decode() into a page of the default layout's size.
 *
 * A checksum rarely matches by chance, so each input is tried twice: as
 * it is, then sealed (disk_record_seal), which takes the fuzzer past the
 * checksum to the lengths and the codec. A decode must fill the page or
 * fail; it must never read or write past either buffer.
 */
#include <errno.h>
#include <string.h>

#include "disk_codec.h"
#include "disk_record.h"
#include "fuzz.h"

#define PAGE_BYTES 16384u /* layers=2,kv_heads=2,head_dim=64,bf16,16 tokens */

static struct disk_codec_ctx *cx;
static uint8_t *slot, *raw;
static uint64_t slot_bytes;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	slot_bytes = disk_slot_bytes(PAGE_BYTES);
	cx = disk_codec_ctx_new(PAGE_BYTES);
	slot = malloc(slot_bytes);
	raw = malloc(PAGE_BYTES);
	if (!cx || !slot || !raw)
		abort();
	return 0;
}

/* open_page's checks and decode; true when the page came back. */
static bool read_page(void)
{
	const struct disk_rec_hdr *h = (const void *)slot;
	uint8_t *s = slot + DISK_PAYLOAD_OFF;
	int c = disk_record_check(h, s, slot_bytes);

	fuzz_assert(c == 0 || c == 1 || c == -EBADMSG);
	if (c || h->raw_len != PAGE_BYTES)
		return false;
	fuzz_assert(h->stored_len <= slot_bytes - DISK_PAYLOAD_OFF);
	if (h->codec == DISK_CODEC_NONE)
		return h->stored_len == PAGE_BYTES;
	if (disk_codec_decode(cx, h->codec, s, h->stored_len, raw, PAGE_BYTES))
		return false;
	memcpy(s, raw, PAGE_BYTES);
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t hb = size < DISK_HDR_BYTES ? size : DISK_HDR_BYTES;
	size_t pb = size - hb;
	struct disk_rec_hdr *h = (void *)slot;

	if (pb > slot_bytes - DISK_PAYLOAD_OFF)
		pb = slot_bytes - DISK_PAYLOAD_OFF;
	memset(slot, 0, slot_bytes);
	memcpy(slot, data, hb);
	memcpy(slot + DISK_PAYLOAD_OFF, data + hb, pb);
	read_page();
	/* Sealed: only a stored_len past the slot stays unsealable (the
	 * checksum covers stored_len bytes; check refuses it first). */
	if (h->magic == DISK_MAGIC &&
	    h->stored_len <= slot_bytes - DISK_PAYLOAD_OFF) {
		disk_record_seal(h, slot + DISK_PAYLOAD_OFF);
		read_page();
	}
	return 0;
}
