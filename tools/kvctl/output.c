/* SPDX-License-Identifier: MIT */
/*
 * output.c - the pieces kvctl prints tables with: binary sizes and
 * percentages, names made safe for a terminal, and a table printer that sizes
 * each column to its widest cell. JSON goes through tools/common/json.c.
 *
 * It knows nothing of kvpool's structs; render.c decides what is printed.
 */
#include <stdlib.h>
#include <string.h>

#include "bug.h"
#include "kvctl.h"

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

int fmt_age(char *buf, size_t len, uint64_t now_ns, uint64_t then_ns)
{
	uint64_t s;

	if (then_ns == 0)
		return snprintf(buf, len, "-");
	s = now_ns > then_ns ? (now_ns - then_ns) / 1000000000ull : 0;
	/* Two of a unit before the next: "90s", not "1m". */
	if (s < 120)
		return snprintf(buf, len, "%llus", (unsigned long long)s);
	if (s < 120 * 60)
		return snprintf(buf, len, "%llum", (unsigned long long)(s / 60));
	if (s < 48 * 3600)
		return snprintf(buf, len, "%lluh", (unsigned long long)(s / 3600));
	return snprintf(buf, len, "%llud", (unsigned long long)(s / 86400));
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
	KVP_ASSERT(width, "a table's column widths (a few words) can be allocated");
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
