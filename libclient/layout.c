/* SPDX-License-Identifier: MIT */
/*
 * layout.c - the layout descriptor: model geometry in, every stride out.
 *
 * Shared by kvpoold (which sizes frames with it) and clients (which address
 * pages with it), so both sides compute the same numbers from the same code.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"

__attribute__((format(printf, 4, 5)))
static int layout_err(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

static const struct {
	const char *name;
	uint32_t bytes;
} dtypes[] = {
	[KVP_DTYPE_BF16] = { "bf16", 2 },
	[KVP_DTYPE_FP16] = { "fp16", 2 },
	[KVP_DTYPE_FP8_E4M3] = { "fp8_e4m3", 1 },
	[KVP_DTYPE_FP32] = { "fp32", 4 },
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const char *kvp_dtype_name(uint32_t dtype)
{
	return dtype < NDTYPES ? dtypes[dtype].name : NULL;
}

int kvp_dtype_parse(const char *name)
{
	for (uint32_t i = 0; i < NDTYPES; i++)
		if (dtypes[i].name && name && strcmp(dtypes[i].name, name) == 0)
			return (int)i;
	return -EINVAL;
}

const char *kvp_tier_name(uint32_t tier)
{
	switch (tier) {
	case KVP_TIER_DEVICE: return "device";
	case KVP_TIER_HOST: return "host";
	default: return NULL;
	}
}

int kvp_layout_init(struct kvp_layout *l, uint32_t layers, uint32_t kv_heads,
		    uint32_t head_dim, uint32_t dtype, uint32_t page_tokens,
		    char *err, size_t errlen)
{
	struct kvp_layout n = { 0 };
	uint64_t v;

	if (!layers || !kv_heads || !head_dim || !page_tokens)
		return layout_err(err, errlen, -EINVAL,
				  "layout: %s must be at least 1",
				  !layers ? "layers" : !kv_heads ? "kv_heads" :
				  !head_dim ? "head_dim" : "page_tokens");
	if (!kvp_dtype_name(dtype))
		return layout_err(err, errlen, -EINVAL,
				  "layout: unknown dtype %" PRIu32
				  " (use bf16, fp16, fp8_e4m3 or fp32)", dtype);
	if (page_tokens > KVP_MAX_PAGE_TOKENS || (page_tokens & (page_tokens - 1)))
		return layout_err(err, errlen, -EINVAL,
				  "layout: page_tokens %" PRIu32 " must be a power of two "
				  "from 1 to %u (16, 32, 64 and 128 are usual)",
				  page_tokens, KVP_MAX_PAGE_TOKENS);

	n.layers = layers;
	n.kv_heads = kv_heads;
	n.head_dim = head_dim;
	n.dtype = dtype;
	n.page_tokens = page_tokens;
	n.elem_bytes = dtypes[dtype].bytes;

	/* Each product is checked: a page past 2^64 bytes must not wrap into a
	 * small one that the allocator would then happily hand out. */
	if (__builtin_mul_overflow((uint64_t)head_dim, n.elem_bytes, &n.head_stride) ||
	    __builtin_mul_overflow(n.head_stride, (uint64_t)kv_heads, &n.token_stride) ||
	    __builtin_mul_overflow(n.token_stride, (uint64_t)page_tokens, &n.kv_stride) ||
	    __builtin_mul_overflow(n.kv_stride, 2, &n.layer_stride) ||
	    __builtin_mul_overflow(n.layer_stride, (uint64_t)layers, &v) ||
	    v > KVP_MAX_PAGE_BYTES)
		return layout_err(err, errlen, -EINVAL,
				  "layout: one page of %" PRIu32 " layers x 2 x %" PRIu32
				  " tokens x %" PRIu32 " heads x %" PRIu32 " x %s is over %llu MiB; "
				  "use fewer page_tokens", layers, page_tokens, kv_heads,
				  head_dim, dtypes[dtype].name, KVP_MAX_PAGE_BYTES >> 20);
	n.page_bytes = v;
	n.token_bytes = n.page_bytes / page_tokens;
	*l = n;
	return 0;
}

/* strtoul with every failure mode turned into false. */
static bool parse_u32(const char *s, size_t len, uint32_t *out)
{
	char buf[24], *end;
	unsigned long long v;

	if (!len || len >= sizeof(buf) || s[0] == '-' || s[0] == '+')
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return false;
	*out = (uint32_t)v;
	return true;
}

int kvp_layout_parse(struct kvp_layout *l, const char *spec, char *err,
		     size_t errlen)
{
	static const char *const keys[] = { "layers", "kv_heads", "head_dim",
					    "dtype", "page_tokens" };
	uint32_t val[5] = { 0 };
	bool seen[5] = { false };
	const char *p = spec;

	if (!spec || !*spec)
		return layout_err(err, errlen, -EINVAL,
				  "layout: empty; expected layers=N,kv_heads=N,"
				  "head_dim=N,dtype=bf16|fp16|fp8_e4m3|fp32,page_tokens=N");
	while (*p) {
		const char *eq = strchr(p, '=');
		const char *end = strchr(p, ',');
		size_t klen, vlen;
		int k = -1;

		if (!end)
			end = p + strlen(p);
		if (!eq || eq > end)
			return layout_err(err, errlen, -EINVAL,
					  "layout: '%.*s' is not key=value", (int)(end - p), p);
		klen = (size_t)(eq - p);
		vlen = (size_t)(end - eq - 1);
		for (int i = 0; i < 5; i++)
			if (strlen(keys[i]) == klen && !memcmp(keys[i], p, klen))
				k = i;
		if (k < 0)
			return layout_err(err, errlen, -EINVAL,
					  "layout: unknown key '%.*s' (keys: layers, kv_heads, "
					  "head_dim, dtype, page_tokens)", (int)klen, p);
		if (seen[k])
			return layout_err(err, errlen, -EINVAL,
					  "layout: %s given twice", keys[k]);
		seen[k] = true;
		if (k == 3) {
			char name[16];
			int d;

			if (vlen >= sizeof(name))
				vlen = sizeof(name) - 1;
			memcpy(name, eq + 1, vlen);
			name[vlen] = '\0';
			d = kvp_dtype_parse(name);
			if (d < 0)
				return layout_err(err, errlen, -EINVAL,
						  "layout: unknown dtype '%s' (use bf16, fp16, "
						  "fp8_e4m3 or fp32)", name);
			val[k] = (uint32_t)d;
		} else if (!parse_u32(eq + 1, vlen, &val[k])) {
			return layout_err(err, errlen, -EINVAL,
					  "layout: %s='%.*s' is not a number from 0 to %u",
					  keys[k], (int)vlen, eq + 1, UINT32_MAX);
		}
		p = *end ? end + 1 : end;
	}
	for (int i = 0; i < 5; i++)
		if (!seen[i])
			return layout_err(err, errlen, -EINVAL,
					  "layout: missing %s", keys[i]);
	return kvp_layout_init(l, val[0], val[1], val[2], val[3], val[4], err,
			       errlen);
}

int kvp_layout_format(const struct kvp_layout *l, char *buf, size_t len)
{
	const char *d = kvp_dtype_name(l->dtype);

	return snprintf(buf, len,
			"layers=%" PRIu32 ",kv_heads=%" PRIu32 ",head_dim=%" PRIu32
			",dtype=%s,page_tokens=%" PRIu32, l->layers, l->kv_heads,
			l->head_dim, d ? d : "?", l->page_tokens);
}
