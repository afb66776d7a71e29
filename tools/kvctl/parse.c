/* SPDX-License-Identifier: MIT */
/*
 * parse.c - strict parsing of what an operator types: user ids, counts,
 * tier selections and chunk ids. Nothing here prints; kvctl.c turns the
 * -errno into a message that names the option and says what is valid.
 */
#include <errno.h>
#include <string.h>

#include "kvctl.h"

int parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	const char *p;

	/* strtoull would accept " 12", "+12", "-1" (as UINT64_MAX) and "0x12". */
	if (!s || !*s)
		return -EINVAL;
	for (p = s; *p; p++) {
		unsigned d;

		if (*p < '0' || *p > '9')
			return -EINVAL;
		d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			goto range;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
range:
	/* A longer string of digits is still a number, only too large. */
	for (; *p; p++)
		if (*p < '0' || *p > '9')
			return -EINVAL;
	return -ERANGE;
}

static const struct {
	const char *name;
	uint32_t sel;
} tier_sels[] = {
	{ "device", KVP_SEL_DEVICE },
	{ "host", KVP_SEL_HOST },
	{ "all", KVP_SEL_ALL },
	{ "disk", KVP_SEL_DISK },       /* kvpoold(8), Disk tier */
	{ "to-disk", KVP_SEL_TO_DISK }, /* offload --tier disk, as printed */
};

#define NTIER_SELS (sizeof(tier_sels) / sizeof(tier_sels[0]))

int parse_tier_sel(const char *s, uint32_t *sel)
{
	for (size_t i = 0; i < NTIER_SELS; i++) {
		if (s && strcmp(s, tier_sels[i].name) == 0) {
			*sel = tier_sels[i].sel;
			return 0;
		}
	}
	return -EINVAL;
}

const char *tier_sel_name(uint32_t sel)
{
	for (size_t i = 0; i < NTIER_SELS; i++)
		if (tier_sels[i].sel == sel)
			return tier_sels[i].name;
	return "?";
}

int parse_chunk_prefix(const char *s, char out[65])
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > 64)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (c >= 'A' && c <= 'F')
			c = (char)(c - 'A' + 'a');
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return -EINVAL;
		out[i] = c;
	}
	out[n] = '\0';
	return (int)n;
}
