/* SPDX-License-Identifier: MIT */
/*
 * disk_codec.c - none | zstd[:LEVEL] with byte shuffle (disk_codec.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "disk_codec.h"

struct disk_codec_ctx {
	ZSTD_CCtx *c;
	ZSTD_DCtx *d;
	uint8_t *tmp;           /* the shuffled page */
	size_t tmp_bytes;
};

int disk_codec_parse(const char *s, struct disk_codec *c, char *err, size_t len)
{
	char *end;
	long lv;

	c->level = 3;
	if (!strcmp(s, "none")) {
		c->id = DISK_CODEC_NONE;
		return 0;
	}
	if (strncmp(s, "zstd", 4) || (s[4] && s[4] != ':'))
		goto bad;
	c->id = DISK_CODEC_ZSTD;
	if (!s[4])
		return 0;
	lv = strtol(s + 5, &end, 10);
	if (end == s + 5 || *end || lv < 1 || lv > 19)
		goto bad;
	c->level = (int)lv;
	return 0;
bad:
	snprintf(err, len, "use none, zstd or zstd:LEVEL with LEVEL 1 to 19");
	return -EINVAL;
}

struct disk_codec_ctx *disk_codec_ctx_new(uint64_t page_bytes)
{
	struct disk_codec_ctx *x = calloc(1, sizeof(*x));

	if (!x)
		return NULL;
	x->c = ZSTD_createCCtx();
	x->d = ZSTD_createDCtx();
	x->tmp_bytes = page_bytes;
	x->tmp = malloc(page_bytes ? page_bytes : 1);
	if (!x->c || !x->d || !x->tmp) {
		disk_codec_ctx_free(x);
		return NULL;
	}
	return x;
}

void disk_codec_ctx_free(struct disk_codec_ctx *x)
{
	if (!x)
		return;
	ZSTD_freeCCtx(x->c);
	ZSTD_freeDCtx(x->d);
	free(x->tmp);
	free(x);
}

/* Plane b holds byte b of every element; a tail shorter than one element
 * stays where it is. */
void disk_shuffle(const uint8_t *src, uint8_t *dst, size_t n, uint32_t elem)
{
	size_t m = n / elem;

	for (uint32_t b = 0; b < elem; b++)
		for (size_t i = 0; i < m; i++)
			dst[b * m + i] = src[i * elem + b];
	memcpy(dst + m * elem, src + m * elem, n - m * elem);
}

void disk_unshuffle(const uint8_t *src, uint8_t *dst, size_t n, uint32_t elem)
{
	size_t m = n / elem;

	for (uint32_t b = 0; b < elem; b++)
		for (size_t i = 0; i < m; i++)
			dst[i * elem + b] = src[b * m + i];
	memcpy(dst + m * elem, src + m * elem, n - m * elem);
}

size_t disk_codec_encode(struct disk_codec_ctx *x, const struct disk_codec *c,
			 const void *src, size_t n, void *dst, size_t cap,
			 uint8_t *id)
{
	bool shuffle = c->elem_bytes == 2 && n <= x->tmp_bytes;
	size_t z;

	if (c->id != DISK_CODEC_NONE) {
		if (shuffle)
			disk_shuffle(src, x->tmp, n, 2);
		z = ZSTD_compressCCtx(x->c, dst, cap, shuffle ? x->tmp : src, n,
				      c->level);
		if (!ZSTD_isError(z) && z < n) {
			*id = shuffle ? DISK_CODEC_ZSTD_SHUFFLE2 : DISK_CODEC_ZSTD;
			return z;
		}
	}
	memcpy(dst, src, n);
	*id = DISK_CODEC_NONE;
	return n;
}

int disk_codec_decode(struct disk_codec_ctx *x, uint8_t id, const void *src,
		      size_t stored, void *dst, size_t raw_len)
{
	size_t z;

	switch (id) {
	case DISK_CODEC_NONE:
		if (stored != raw_len)
			return -EBADMSG;
		memcpy(dst, src, raw_len);
		return 0;
	case DISK_CODEC_ZSTD:
		z = ZSTD_decompressDCtx(x->d, dst, raw_len, src, stored);
		return ZSTD_isError(z) || z != raw_len ? -EBADMSG : 0;
	case DISK_CODEC_ZSTD_SHUFFLE2:
		if (raw_len > x->tmp_bytes)
			return -EBADMSG;
		z = ZSTD_decompressDCtx(x->d, x->tmp, raw_len, src, stored);
		if (ZSTD_isError(z) || z != raw_len)
			return -EBADMSG;
		disk_unshuffle(x->tmp, dst, raw_len, 2);
		return 0;
	}
	return -EBADMSG;
}
