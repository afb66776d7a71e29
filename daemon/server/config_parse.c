/* SPDX-License-Identifier: MIT */
/*
 * config_parse.c - the value parsers behind kvpool.conf and the flags:
 * numbers, sizes with K/M/G/T suffixes, booleans, octal modes, uid and gid
 * lists (numbers or names), tenant names. Each says what is valid; the caller
 * adds where the value came from and which key it was.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"

char *str_trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* Decimal digits only: strtoull alone would take "-1", " 7" and "0x10". */
int parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (!isdigit((unsigned char)*s))
			return -EINVAL;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return 0;
}

int parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out,
	       char *err, size_t errlen)
{
	uint64_t v;

	if (parse_u64(s, &v) || v < min || v > max) {
		snprintf(err, errlen, "use a whole number from %" PRIu64 " to %" PRIu64,
			 min, max);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* "256M", "1G", "65536", "4KiB": binary multiples, as memory is sized. */
int parse_size(const char *s, uint64_t *out, char *err, size_t errlen)
{
	static const char units[] = "KMGT";
	char num[32], *suffix;
	const char *u;
	size_t digits = strspn(s, "0123456789");
	uint64_t v;
	int shift = 0;

	if (!digits || digits >= sizeof(num))
		goto bad;
	memcpy(num, s, digits);
	num[digits] = '\0';
	if (parse_u64(num, &v))
		goto bad;
	suffix = (char *)s + digits;
	if (*suffix) {
		u = strchr(units, toupper((unsigned char)*suffix));
		if (!u)
			goto bad;
		shift = 10 * (int)(u - units + 1);
		suffix++;
		if (strcasecmp(suffix, "") && strcasecmp(suffix, "B") &&
		    strcasecmp(suffix, "iB"))
			goto bad;
	}
	if (shift && v > (UINT64_MAX >> shift))
		goto bad;
	*out = v << shift;
	return 0;
bad:
	snprintf(err, errlen, "use a size in bytes with an optional K, M, G or T "
		 "suffix (binary: 1K = 1024), e.g. 256M");
	return -EINVAL;
}

int parse_bool(const char *s, bool *out, char *err, size_t errlen)
{
	static const char *yes[] = { "1", "yes", "true", "on" };
	static const char *no[] = { "0", "no", "false", "off" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	snprintf(err, errlen, "use yes or no (also true/false, on/off, 1/0)");
	return -EINVAL;
}

int parse_mode(const char *s, uint32_t *out, char *err, size_t errlen)
{
	uint32_t v = 0;

	if (!*s || strlen(s) > 4)
		goto bad;
	for (; *s; s++) {
		if (*s < '0' || *s > '7')
			goto bad;
		v = v * 8 + (uint32_t)(*s - '0');
	}
	if (v > 0777)
		goto bad;
	*out = v;
	return 0;
bad:
	snprintf(err, errlen, "use an octal permission mode from 0000 to 0777, e.g. 0660");
	return -EINVAL;
}

static int id_lookup(const char *name, bool groups, uint32_t *id)
{
	uint64_t v;

	if (parse_u64(name, &v) == 0)
		return v < UINT32_MAX ? (*id = (uint32_t)v, 0) : -ERANGE;
	if (groups) {
		struct group *g = getgrnam(name);

		if (!g)
			return -ENOENT;
		*id = g->gr_gid;
	} else {
		struct passwd *p = getpwnam(name);

		if (!p)
			return -ENOENT;
		*id = p->pw_uid;
	}
	return 0;
}

int parse_ids(const char *s, bool groups, struct id_list *l, char *err,
	      size_t errlen)
{
	char *copy = strdup(s), *save = NULL, *tok;
	struct id_list n = { .set = true };
	size_t cap = 0;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint32_t id;

		tok = str_trim(tok);
		if (!*tok)
			continue;
		if (id_lookup(tok, groups, &id)) {
			snprintf(err, errlen, "'%s' is neither a %s id below 4294967295 "
				 "nor a known %s name; use a comma-separated list, "
				 "e.g. %s", tok, groups ? "group" : "user",
				 groups ? "group" : "user", groups ? "0,kvpool" : "0,1001");
			ret = -EINVAL;
			goto out;
		}
		if (n.n == cap) {
			uint32_t *v;

			cap = cap ? cap * 2 : 8;
			v = realloc(n.v, cap * sizeof(*v));
			if (!v) {
				ret = -ENOMEM;
				goto out;
			}
			n.v = v;
		}
		n.v[n.n++] = id;
	}
	id_list_free(l);
	*l = n;
	n.v = NULL;
out:
	free(n.v);
	free(copy);
	return ret;
}

int parse_group(const char *s, int64_t *gid, char *err, size_t errlen)
{
	uint32_t id;

	if (id_lookup(s, true, &id)) {
		snprintf(err, errlen, "use a group name or number, e.g. kvpool");
		return -EINVAL;
	}
	*gid = id;
	return 0;
}

int parse_listen_addr(const char *s, struct sockaddr_storage *out, char *err,
		      size_t errlen)
{
	static const char use[] = "use a numeric address and a port, e.g. "
				  "127.0.0.1:9464 or [::1]:9464 (port 0: any free one)";
	const char *colon = strrchr(s, ':');
	char host[INET6_ADDRSTRLEN + 2];
	size_t n = colon ? (size_t)(colon - s) : 0;
	uint64_t port;

	if (!colon || !n || n >= sizeof(host) || parse_u64(colon + 1, &port) ||
	    port > 65535) {
		snprintf(err, errlen, "%s", use);
		return -EINVAL;
	}
	memcpy(host, s, n);
	host[n] = '\0';
	memset(out, 0, sizeof(*out));
	if (host[0] == '[' && host[n - 1] == ']') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;

		host[n - 1] = '\0';
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) == 1)
			return 0;
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)out;

		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		if (inet_pton(AF_INET, host, &a->sin_addr) == 1)
			return 0;
	}
	snprintf(err, errlen, "%s", use);
	return -EINVAL;
}

int parse_tenant_name(const char *s, char *out, char *err, size_t errlen)
{
	size_t n = strlen(s);

	if (!n || n > TENANT_NAME_MAX || strspn(s, "abcdefghijklmnopqrstuvwxyz"
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != n) {
		snprintf(err, errlen, "a tenant name is 1 to %d characters of "
			 "letters, digits, '_', '.' and '-'", TENANT_NAME_MAX);
		return -EINVAL;
	}
	memcpy(out, s, n + 1);
	return 0;
}

bool id_list_has(const struct id_list *l, uint32_t id)
{
	for (uint32_t i = 0; i < l->n; i++)
		if (l->v[i] == id)
			return true;
	return false;
}

void id_list_free(struct id_list *l)
{
	free(l->v);
	*l = (struct id_list){ 0 };
}

void id_list_format(const struct id_list *l, char *buf, size_t len)
{
	size_t off = 0;

	if (!len)
		return;
	buf[0] = '\0';
	if (!l->n) {
		snprintf(buf, len, "(none)");
		return;
	}
	for (uint32_t i = 0; i < l->n && off < len; i++) {
		int w = snprintf(buf + off, len - off, "%s%" PRIu32, i ? "," : "",
				 l->v[i]);

		if (w < 0)
			break;
		off += (size_t)w;
	}
}
