/* SPDX-License-Identifier: MIT */
/*
 * json.c - the JSON writer of kvctl and kvbench. See json.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bug.h"
#include "json.h"

/*
 * Length of the valid UTF-8 sequence at s (at most n bytes), or 0 when the
 * bytes there are not one: overlong forms, surrogates (U+D800..U+DFFF) and
 * code points above U+10FFFF are invalid (RFC 3629, table 3-7 of Unicode).
 */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xBF;
	size_t len, i;

	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		if (c == 0xE0)
			lo = 0xA0;
		else if (c == 0xED)
			hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		if (c == 0xF0)
			lo = 0x90;
		else if (c == 0xF4)
			hi = 0x8F;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	/* Only the second byte has a narrowed range. */
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xBF)
			return 0;
	return len;
}

void json_write_string(FILE *f, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, n;

	fputc('"', f);
	while (i < len) {
		unsigned char c = p[i];

		switch (c) {
		case '"': fputs("\\\"", f); i++; continue;
		case '\\': fputs("\\\\", f); i++; continue;
		case '\b': fputs("\\b", f); i++; continue;
		case '\f': fputs("\\f", f); i++; continue;
		case '\n': fputs("\\n", f); i++; continue;
		case '\r': fputs("\\r", f); i++; continue;
		case '\t': fputs("\\t", f); i++; continue;
		}
		if (c < 0x20 || c == 0x7F) {
			fprintf(f, "\\u%04x", c);
			i++;
			continue;
		}
		n = utf8_seq_len(p + i, len - i);
		if (n == 0) {
			fputs("\\ufffd", f);
			i++;
			continue;
		}
		fwrite(p + i, 1, n, f);
		i += n;
	}
	fputc('"', f);
}

static void json_indent(struct json *j)
{
	for (int i = 0; i < j->depth; i++)
		fputs("  ", j->f);
}

/* Start a member: a comma after the previous one, a newline, indent, key. */
static void json_key(struct json *j, const char *key)
{
	if (j->depth == 0)
		return;
	if (!j->first[j->depth])
		fputc(',', j->f);
	j->first[j->depth] = false;
	fputc('\n', j->f);
	json_indent(j);
	if (key) {
		json_write_string(j->f, key, strlen(key));
		fputs(": ", j->f);
	}
}

static void json_push(struct json *j, char open)
{
	KVP_BUG_ON(j->depth + 1 >= JSON_MAX_DEPTH,
		   "JSON output nests at most JSON_MAX_DEPTH objects and arrays");
	fputc(open, j->f);
	j->first[++j->depth] = true;
}

static void json_pop(struct json *j, char close)
{
	bool empty = j->first[j->depth];

	j->depth--;
	if (!empty) {
		fputc('\n', j->f);
		json_indent(j);
	}
	fputc(close, j->f);
}

void json_begin(struct json *j, FILE *f)
{
	j->f = f;
	j->depth = 0;
	j->first[0] = true;
	json_push(j, '{');
}

void json_end(struct json *j)
{
	json_pop(j, '}');
	fputc('\n', j->f);
}

void json_obj_begin(struct json *j, const char *key)
{
	json_key(j, key);
	json_push(j, '{');
}

void json_obj_end(struct json *j)
{
	json_pop(j, '}');
}

void json_arr_begin(struct json *j, const char *key)
{
	json_key(j, key);
	json_push(j, '[');
}

void json_arr_end(struct json *j)
{
	json_pop(j, ']');
}

void json_u64(struct json *j, const char *key, uint64_t v)
{
	json_key(j, key);
	fprintf(j->f, "%llu", (unsigned long long)v);
}

void json_i64(struct json *j, const char *key, int64_t v)
{
	json_key(j, key);
	fprintf(j->f, "%lld", (long long)v);
}

void json_f64(struct json *j, const char *key, double v, int decimals)
{
	json_key(j, key);
	if (isfinite(v))
		fprintf(j->f, "%.*f", decimals, v);
	else
		fputs("null", j->f);
}

void json_bool(struct json *j, const char *key, bool v)
{
	json_key(j, key);
	fputs(v ? "true" : "false", j->f);
}

void json_null(struct json *j, const char *key)
{
	json_key(j, key);
	fputs("null", j->f);
}

void json_str(struct json *j, const char *key, const char *v)
{
	json_key(j, key);
	if (v)
		json_write_string(j->f, v, strlen(v));
	else
		fputs("null", j->f);
}

void json_strn(struct json *j, const char *key, const char *s, size_t len)
{
	json_key(j, key);
	json_write_string(j->f, s, strnlen(s, len));
}
