/* SPDX-License-Identifier: MIT */
/*
 * output.c - the pieces kvctl prints with: a streaming JSON writer whose
 * strings are always valid JSON (whatever bytes a client put in its name),
 * binary sizes and percentages, and a table printer that sizes each column
 * to its widest cell.
 *
 * It knows nothing of kvpool's structs; render.c decides what is printed.
 */
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"

/* ---------------------------------------------------------------- JSON */

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
	if (j->depth + 1 >= JSON_MAX_DEPTH)
		abort();
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

/* ---------------------------------------------------------------- numbers */

int fmt_bytes(char *buf, size_t len, uint64_t bytes)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	const size_t last = sizeof(units) / sizeof(units[0]) - 1;
	double v = (double)bytes;
	size_t u = 0;

	if (bytes < 1024)
		return snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	/* Step up while the value would print as 1024.0 or more in this unit. */
	while (u < last && v >= 1023.95) {
		v /= 1024.0;
		u++;
	}
	return snprintf(buf, len, "%.1f %s", v, units[u]);
}

int fmt_percent(char *buf, size_t len, uint64_t part, uint64_t whole)
{
	uint64_t tenths;

	if (whole == 0)
		return snprintf(buf, len, "-");
	/* Rounded down, so a pool one frame short of full never shows 100.0%. */
	if (part <= UINT64_MAX / 1000)
		tenths = part * 1000 / whole;
	else
		tenths = (uint64_t)((long double)part * 1000.0L / (long double)whole);
	if (part < whole && tenths >= 1000)
		tenths = 999;
	return snprintf(buf, len, "%llu.%llu%%", (unsigned long long)(tenths / 10),
			(unsigned long long)(tenths % 10));
}

/* ---------------------------------------------------------------- text */

size_t text_sanitize(char *dst, size_t dstlen, const char *src, size_t srclen)
{
	size_t n = 0;

	if (dstlen == 0)
		return 0;
	for (size_t i = 0; i < srclen && src[i] && n + 1 < dstlen; i++) {
		unsigned char c = (unsigned char)src[i];

		dst[n++] = c >= 0x20 && c < 0x7F ? (char)c : '?';
	}
	if (n == 0 && dstlen >= 2)
		dst[n++] = '-';
	dst[n] = '\0';
	return n;
}

/* ---------------------------------------------------------------- tables */

static size_t cell_text(table_cell_fn cell, void *ctx, size_t row, size_t col,
			char *buf)
{
	buf[0] = '\0';
	cell(ctx, row, col, buf, TABLE_CELL_MAX);
	buf[TABLE_CELL_MAX - 1] = '\0';
	return strlen(buf);
}

static void print_cell(FILE *f, const struct table_col *c, const char *text,
		       size_t width, bool last)
{
	size_t n = strlen(text);

	if (!c->left)
		for (size_t i = n; i < width; i++)
			fputc(' ', f);
	fputs(text, f);
	if (c->left && !last)
		for (size_t i = n; i < width; i++)
			fputc(' ', f);
	fputs(last ? "\n" : "  ", f);
}

void table_print(FILE *f, const struct table_col *cols, size_t ncols,
		 size_t nrows, table_cell_fn cell, void *ctx)
{
	char buf[TABLE_CELL_MAX];
	size_t *width;

	if (ncols == 0)
		return;
	width = calloc(ncols, sizeof(*width));
	if (!width)
		abort();
	for (size_t c = 0; c < ncols; c++)
		width[c] = strlen(cols[c].name);
	for (size_t r = 0; r < nrows; r++) {
		for (size_t c = 0; c < ncols; c++) {
			size_t n = cell_text(cell, ctx, r, c, buf);

			if (n > width[c])
				width[c] = n;
		}
	}
	for (size_t c = 0; c < ncols; c++)
		print_cell(f, &cols[c], cols[c].name, width[c], c + 1 == ncols);
	for (size_t r = 0; r < nrows; r++) {
		for (size_t c = 0; c < ncols; c++) {
			cell_text(cell, ctx, r, c, buf);
			print_cell(f, &cols[c], buf, width[c], c + 1 == ncols);
		}
	}
	free(width);
}
