/* SPDX-License-Identifier: MIT */
/*
 * fuzz_remote_value - a value a store node hands back for a GET, as the
 * remote tier takes it (daemon/remote/remote_tier.c, on_value):
 * remote_value_page() (kept in place when stored as is), else
 * remote_value_decode() into a page (daemon/remote/remote_value.c; the
 * disk tier's record check and codec under it).
 *
 * The value is an exact-size heap copy, so a read past its length is an
 * ASan report. It is asked for under the key its own header names (else
 * nearly every value is merely another key's), then under a fixed key;
 * and once sealed, so the fuzzer gets past the checksum. A page or record
 * taken must lie inside the value; a decode fills exactly page_bytes.
 */
#include <string.h>

#include "fuzz.h"
#include "remote_value.h"

#define PAGE_BYTES 16384u

static struct disk_codec_ctx *cx;
static uint8_t *dst;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	cx = disk_codec_ctx_new(PAGE_BYTES);
	dst = malloc(PAGE_BYTES);
	if (!cx || !dst)
		abort();
	return 0;
}

static void take(const struct remote_key *k, const uint8_t *val, size_t len)
{
	const uint8_t *page = remote_value_page(k, val, len, PAGE_BYTES);

	if (page)
		fuzz_assert(page >= val && page + PAGE_BYTES <= val + len);
	if (!remote_value_decode(cx, k, val, len, dst, PAGE_BYTES))
		fuzz_assert(len >= DISK_HDR_BYTES);
}

/* The key a value's header says it is (what a node would be asked). */
static void key_of(const struct disk_rec_hdr *h, struct remote_key *k)
{
	*k = (struct remote_key){ .kind = h->kind, .layout_id = h->layout_id,
				  .tenant = h->tenant,
				  .page = h->pos == UINT64_MAX ? REMOTE_PAGE_REC : h->page };
	memcpy(k->hash, h->hash, sizeof(k->hash));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *val = malloc(size ? size : 1);
	struct remote_key k = { .kind = DISK_KIND_PREFIX };
	struct disk_rec_hdr h;

	if (!val)
		return 0;
	memcpy(val, data, size);
	take(&k, val, size);
	if (size >= DISK_HDR_BYTES) {
		memcpy(&h, val, sizeof(h));
		key_of(&h, &k);
		take(&k, val, size);
		if (h.magic == DISK_MAGIC && h.stored_len == size - DISK_HDR_BYTES &&
		    h.stored_len <= PAGE_BYTES) {
			disk_record_seal(&h, val + DISK_HDR_BYTES);
			memcpy(val, &h, sizeof(h));
			take(&k, val, size);
		}
	}
	free(val);
	return 0;
}
