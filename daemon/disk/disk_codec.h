/* SPDX-License-Identifier: MIT */
/*
 * disk_codec.h - how a page is stored on the disk tier: as is, or zstd.
 *
 * zstd sees the page byte-shuffled first when its elements are 16 bits
 * (bf16, fp16): all high bytes, then all low bytes, as KV compressors do.
 * The high bytes (sign, exponent, top of the mantissa) repeat a lot; mixed
 * with the noisy low bytes zstd finds little. A page that does not shrink
 * is stored as is (codec none in its record), so reading never costs more
 * than the raw page.
 *
 * Measured on KV-like data (bench/results/disk-2026-11-27.md): ratio
 * 1.28-1.46, while on two cores the codec costs more than the disk saves,
 * so the default is none.
 */
#ifndef KVPOOL_DISK_CODEC_H
#define KVPOOL_DISK_CODEC_H

#include <stddef.h>
#include <stdint.h>

enum disk_codec_id {
	DISK_CODEC_NONE = 0,
	DISK_CODEC_ZSTD = 1,
	DISK_CODEC_ZSTD_SHUFFLE2 = 2, /* zstd of the byte planes of 16-bit data */
};

struct disk_codec {
	enum disk_codec_id id;  /* what disk_codec_encode tries */
	int level;              /* zstd level */
	uint32_t elem_bytes;    /* bytes of one element of the layout's dtype */
};

/*
 * Parse "none", "zstd" or "zstd:LEVEL" (1..19). Returns 0 or -EINVAL with
 * what is valid in err.
 */
int disk_codec_parse(const char *s, struct disk_codec *c, char *err, size_t len);

struct disk_codec_ctx; /* per thread: zstd contexts and a shuffle buffer */
struct disk_codec_ctx *disk_codec_ctx_new(uint64_t page_bytes);
void disk_codec_ctx_free(struct disk_codec_ctx *x);

/*
 * Store n bytes of src into dst (cap bytes, cap >= n). Returns the stored
 * length and sets *id to how they were stored (DISK_CODEC_NONE when
 * compressing did not pay: dst holds src as is).
 */
size_t disk_codec_encode(struct disk_codec_ctx *x, const struct disk_codec *c,
			 const void *src, size_t n, void *dst, size_t cap,
			 uint8_t *id);
/* Undo encode: raw_len bytes into dst. Returns 0 or -EBADMSG. */
int disk_codec_decode(struct disk_codec_ctx *x, uint8_t id, const void *src,
		      size_t stored, void *dst, size_t raw_len);

/* Byte planes of n bytes of elem-byte elements (exposed for the tests). */
void disk_shuffle(const uint8_t *src, uint8_t *dst, size_t n, uint32_t elem);
void disk_unshuffle(const uint8_t *src, uint8_t *dst, size_t n, uint32_t elem);

#endif /* KVPOOL_DISK_CODEC_H */
