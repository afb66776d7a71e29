/* SPDX-License-Identifier: MIT */
/*
 * chunk_id.c - the names of chunk types and the text form of chunk ids:
 * pure functions, no client needed. Like layout.c it is part of
 * kvpool_common, so the daemon and the engine print ids the same way the
 * library and kvctl do.
 */
#include <errno.h>
#include <string.h>

#include "kvpool.h"

static const char *const type_names[] = {
	[KVP_CHUNK_SYSTEM] = "system",
	[KVP_CHUNK_CONTEXT] = "context",
	[KVP_CHUNK_QUERY] = "query",
};

#define NTYPES (sizeof(type_names) / sizeof(type_names[0]))

const char *kvp_chunk_type_name(uint32_t type)
{
	return type < NTYPES ? type_names[type] : NULL;
}

int kvp_chunk_type_parse(const char *name)
{
	for (uint32_t t = 1; name && t < NTYPES; t++)
		if (strcmp(name, type_names[t]) == 0)
			return (int)t;
	return -EINVAL;
}

void kvp_chunk_id_format(const struct kvp_chunk_id *id, char hex[65])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < KVP_CHUNK_ID_BYTES; i++) {
		hex[2 * i] = digits[id->b[i] >> 4];
		hex[2 * i + 1] = digits[id->b[i] & 15];
	}
	hex[2 * KVP_CHUNK_ID_BYTES] = '\0';
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int kvp_chunk_id_parse(struct kvp_chunk_id *id, const char *hex)
{
	struct kvp_chunk_id tmp;

	/* Exactly 64 digits: strlen first, so no digit past a NUL is read. */
	if (!id || !hex || strlen(hex) != 2 * KVP_CHUNK_ID_BYTES)
		return -EINVAL;
	for (int i = 0; i < KVP_CHUNK_ID_BYTES; i++) {
		int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		tmp.b[i] = (uint8_t)(hi << 4 | lo);
	}
	*id = tmp;
	return 0;
}
