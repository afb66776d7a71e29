/* SPDX-License-Identifier: MIT */
/*
 * render.c - what each kvctl command prints, from the structs libkvpool
 * filled: a human table (the default) or one JSON object (--json).
 *
 * JSON keys are the field names of the public structs (kvpool.h), so a
 * script reads "frames_used" or "hit_tokens" and finds the same word in the
 * header; the man page lists every object. Nothing here talks to the daemon.
 */
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "kvctl.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- stats */

struct stat_field {
	const char *name;   /* the struct kvp_stats field, and the JSON key */
	size_t off;
	bool bytes;         /* also shown as a size in the human form */
};

#define STAT(f, b) { #f, offsetof(struct kvp_stats, f), b }

static const struct stat_field stat_gauges[] = {
	STAT(users, false),
	STAT(clients, false),
	STAT(leases, false),
	STAT(tenants, false),
};

static const struct stat_field stat_counters[] = {
	STAT(prepares, false),
	STAT(commits, false),
	STAT(releases, false),
	STAT(hit_tokens, false),
	STAT(committed_tokens, false),
	STAT(evicted_users, false),
	STAT(evicted_pages, false),
	STAT(demoted_users, false),
	STAT(demoted_pages, false),
	STAT(offloaded_pages, false),
	STAT(onloaded_pages, false),
	STAT(trimmed_pages, false),
	STAT(bytes_d2h, true),
	STAT(bytes_h2d, true),
};

static uint64_t stat_value(const struct kvp_stats *s, const struct stat_field *f)
{
	uint64_t v;

	memcpy(&v, (const char *)s + f->off, sizeof(v));
	return v;
}

static const char *tier_name(size_t t)
{
	const char *n = kvp_tier_name((uint32_t)t);

	return n ? n : "?";
}

static void stats_json(FILE *f, const struct kvp_stats *s, bool all_tenants)
{
	struct json j;

	json_begin(&j, f);
	json_str(&j, "scope", all_tenants ? "all_tenants" : "tenant");
	json_obj_begin(&j, "tiers");
	for (size_t t = 0; t < KVP_TIERS; t++) {
		const struct kvp_tier_stats *ts = &s->tier[t];

		json_obj_begin(&j, tier_name(t));
		json_u64(&j, "frames_total", ts->frames_total);
		json_u64(&j, "frames_used", ts->frames_used);
		json_u64(&j, "frames_free", ts->frames_free);
		json_u64(&j, "bytes_total", ts->bytes_total);
		json_obj_end(&j);
	}
	json_obj_end(&j);
	for (size_t i = 0; i < NELEM(stat_gauges); i++)
		json_u64(&j, stat_gauges[i].name, stat_value(s, &stat_gauges[i]));
	for (size_t i = 0; i < NELEM(stat_counters); i++)
		json_u64(&j, stat_counters[i].name, stat_value(s, &stat_counters[i]));
	json_end(&j);
}

static const struct table_col tier_cols[] = {
	{ "TIER", true }, { "FRAMES", false }, { "USED", false },
	{ "FREE", false }, { "USED%", false }, { "SIZE", false },
};

static void tier_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	const struct kvp_tier_stats *ts = &((const struct kvp_stats *)ctx)->tier[row];

	switch (col) {
	case 0: snprintf(buf, len, "%s", tier_name(row)); break;
	case 1: snprintf(buf, len, "%" PRIu64, ts->frames_total); break;
	case 2: snprintf(buf, len, "%" PRIu64, ts->frames_used); break;
	case 3: snprintf(buf, len, "%" PRIu64, ts->frames_free); break;
	case 4: fmt_percent(buf, len, ts->frames_used, ts->frames_total); break;
	case 5: fmt_bytes(buf, len, ts->bytes_total); break;
	}
}

static void stat_line(FILE *f, const struct kvp_stats *s, const struct stat_field *sf)
{
	uint64_t v = stat_value(s, sf);
	char size[32];

	if (sf->bytes && v >= 1024) {
		fmt_bytes(size, sizeof(size), v);
		fprintf(f, "%-17s %" PRIu64 " (%s)\n", sf->name, v, size);
	} else {
		fprintf(f, "%-17s %" PRIu64 "\n", sf->name, v);
	}
}

void render_stats(FILE *f, bool json, const struct kvp_stats *s, bool all_tenants)
{
	/* A tenant's own client always sums exactly one tenant; more means the
	 * daemon answered for several (an admin with no tenant of its own). */
	all_tenants = all_tenants || s->tenants > 1;
	if (json) {
		stats_json(f, s, all_tenants);
		return;
	}
	fprintf(f, "scope: %s\n\n", all_tenants ? "all tenants" : "this client's tenant");
	table_print(f, tier_cols, NELEM(tier_cols), KVP_TIERS, tier_cell, (void *)s);
	fputc('\n', f);
	for (size_t i = 0; i < NELEM(stat_gauges); i++)
		stat_line(f, s, &stat_gauges[i]);
	fputc('\n', f);
	for (size_t i = 0; i < NELEM(stat_counters); i++)
		stat_line(f, s, &stat_counters[i]);
}

/* ---------------------------------------------------------------- users */

/* The members of one user's object: the struct kvp_user_info fields. */
static void user_members(struct json *j, const struct kvp_user_info *u)
{
	json_u64(j, "user", u->user);
	json_u64(j, "start", u->start);
	json_u64(j, "len", u->len);
	json_u64(j, "pages_device", u->pages_device);
	json_u64(j, "pages_host", u->pages_host);
	json_u64(j, "leases", u->leases);
	json_u64(j, "tenant", u->tenant);
}

void render_user(FILE *f, bool json, const struct kvp_user_info *u)
{
	if (json) {
		struct json j;

		/* The user's object is the top-level object itself. */
		json_begin(&j, f);
		user_members(&j, u);
		json_end(&j);
		return;
	}
	fprintf(f, "%-14s %" PRIu64 "\n", "user", u->user);
	fprintf(f, "%-14s %" PRIu64 "\n", "start", u->start);
	fprintf(f, "%-14s %" PRIu64 "%s\n", "len", u->len,
		u->len ? " tokens" : " (nothing cached)");
	/* What an operator debugging a "missing tokens" error wants to know. */
	fprintf(f, "%-14s %" PRIu64 "\n", "next_start_pos", u->start + u->len);
	fprintf(f, "%-14s %" PRIu32 "\n", "pages_device", u->pages_device);
	fprintf(f, "%-14s %" PRIu32 "\n", "pages_host", u->pages_host);
	fprintf(f, "%-14s %" PRIu32 "\n", "leases", u->leases);
	fprintf(f, "%-14s %" PRIu32 "\n", "tenant", u->tenant);
}

static const struct table_col user_cols[] = {
	{ "USER", false }, { "START", false }, { "LEN", false },
	{ "PAGES_DEV", false }, { "PAGES_HOST", false }, { "LEASES", false },
	{ "TENANT", false },
};

static void user_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	const struct kvp_user_info *u = (const struct kvp_user_info *)ctx + row;

	switch (col) {
	case 0: snprintf(buf, len, "%" PRIu64, u->user); break;
	case 1: snprintf(buf, len, "%" PRIu64, u->start); break;
	case 2: snprintf(buf, len, "%" PRIu64, u->len); break;
	case 3: snprintf(buf, len, "%" PRIu32, u->pages_device); break;
	case 4: snprintf(buf, len, "%" PRIu32, u->pages_host); break;
	case 5: snprintf(buf, len, "%" PRIu32, u->leases); break;
	case 6: snprintf(buf, len, "%" PRIu32, u->tenant); break;
	}
}

void render_users(FILE *f, bool json, const struct kvp_user_info *rows,
		  size_t n, bool with_tenant, bool truncated)
{
	if (json) {
		struct json j;

		json_begin(&j, f);
		json_arr_begin(&j, "users");
		for (size_t i = 0; i < n; i++) {
			json_obj_begin(&j, NULL);
			user_members(&j, &rows[i]);
			json_obj_end(&j);
		}
		json_arr_end(&j);
		json_u64(&j, "count", n);
		json_bool(&j, "truncated", truncated);
		json_end(&j);
		return;
	}
	table_print(f, user_cols, NELEM(user_cols) - (with_tenant ? 0 : 1), n,
		    user_cell, (void *)rows);
}

/* ---------------------------------------------------------------- clients */

static void client_json(struct json *j, const struct kvp_client_info *ci)
{
	json_obj_begin(j, NULL);
	json_u64(j, "client_id", ci->client_id);
	json_u64(j, "pid", ci->pid);
	json_u64(j, "uid", ci->uid);
	json_u64(j, "gid", ci->gid);
	if (ci->tenant == UINT32_MAX)
		json_null(j, "tenant");
	else
		json_u64(j, "tenant", ci->tenant);
	json_bool(j, "admin", ci->flags & 1u);
	json_strn(j, "name", ci->name, sizeof(ci->name));
	json_u64(j, "ops", ci->ops);
	json_u64(j, "leases", ci->leases);
	json_obj_end(j);
}

static const struct table_col client_cols[] = {
	{ "ID", false }, { "PID", false }, { "UID", false }, { "GID", false },
	{ "TENANT", false }, { "NAME", true }, { "OPS", false },
	{ "LEASES", false }, { "ADMIN", true },
};

static void client_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	const struct kvp_client_info *ci = (const struct kvp_client_info *)ctx + row;

	switch (col) {
	case 0: snprintf(buf, len, "%" PRIu32, ci->client_id); break;
	case 1: snprintf(buf, len, "%" PRIu32, ci->pid); break;
	case 2: snprintf(buf, len, "%" PRIu32, ci->uid); break;
	case 3: snprintf(buf, len, "%" PRIu32, ci->gid); break;
	case 4:
		if (ci->tenant == UINT32_MAX)
			snprintf(buf, len, "-");
		else
			snprintf(buf, len, "%" PRIu32, ci->tenant);
		break;
	/* The name is whatever the client sent: not NUL-terminated for sure,
	 * and not to be trusted with the operator's terminal. */
	case 5: text_sanitize(buf, len, ci->name, sizeof(ci->name)); break;
	case 6: snprintf(buf, len, "%" PRIu64, ci->ops); break;
	case 7: snprintf(buf, len, "%" PRIu64, ci->leases); break;
	case 8: snprintf(buf, len, "%s", ci->flags & 1u ? "yes" : "no"); break;
	}
}

void render_clients(FILE *f, bool json, const struct kvp_client_info *rows,
		    size_t n)
{
	if (json) {
		struct json j;

		json_begin(&j, f);
		json_arr_begin(&j, "clients");
		for (size_t i = 0; i < n; i++)
			client_json(&j, &rows[i]);
		json_arr_end(&j);
		json_u64(&j, "count", n);
		json_end(&j);
		return;
	}
	table_print(f, client_cols, NELEM(client_cols), n, client_cell, (void *)rows);
}

/* ---------------------------------------------------------------- evict, offload */

static void target_json(struct json *j, const struct op_result *r)
{
	json_bool(j, "all", r->all);
	if (r->all)
		json_null(j, "user");
	else
		json_u64(j, "user", r->user);
}

void render_evict(FILE *f, bool json, const struct op_result *r)
{
	const char *tier = tier_sel_name(r->sel);

	if (json) {
		struct json j;

		json_begin(&j, f);
		target_json(&j, r);
		json_str(&j, "tier", tier);
		json_u64(&j, r->all ? "users_affected" : "pages_freed", r->count);
		json_end(&j);
		return;
	}
	if (r->all)
		fprintf(f, "evict all (tier %s): %" PRIu64 " user%s affected\n",
			tier, r->count, r->count == 1 ? "" : "s");
	else
		fprintf(f, "evict user %" PRIu64 " (tier %s): %" PRIu64 " page%s freed\n",
			r->user, tier, r->count, r->count == 1 ? "" : "s");
}

void render_offload(FILE *f, bool json, const struct op_result *r)
{
	if (json) {
		struct json j;

		json_begin(&j, f);
		target_json(&j, r);
		json_u64(&j, "pages_copied", r->count);
		json_end(&j);
		return;
	}
	if (r->all)
		fprintf(f, "offload all: %" PRIu64 " page%s copied to the host tier\n",
			r->count, r->count == 1 ? "" : "s");
	else
		fprintf(f, "offload user %" PRIu64 ": %" PRIu64 " page%s copied to the host tier\n",
			r->user, r->count, r->count == 1 ? "" : "s");
}
