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
	bool share;         /* group SHARE: printed after the core figures */
	char kind;          /* 'c' counter, 'g' gauge, 't' a time */
	const char *unit;   /* "bytes": also shown as a size in the human form */
};

#define STAT_KIND_COUNTER 'c'
#define STAT_KIND_GAUGE 'g'
#define STAT_KIND_TIME 't'
#define STAT_GROUP_CORE false
#define STAT_GROUP_SHARE true
#define STAT(n, group, kind, unit, metric, help)				\
	{ #n, offsetof(struct kvp_stats, n), STAT_GROUP_##group,		\
	  STAT_KIND_##kind, unit },

/* Every field (include/kvpool.h lists them); shown in three passes: the
 * core gauges, the core counters, then the sharing figures. The one time
 * (chunk_last_access_ns) is shown apart, with its age. */
static const struct stat_field stat_fields[] = {
	KVP_STATS_FIELDS(STAT)
};

static bool stat_in_pass(const struct stat_field *sf, int pass)
{
	switch (pass) {
	case 0: return !sf->share && sf->kind == STAT_KIND_GAUGE;
	case 1: return !sf->share && sf->kind != STAT_KIND_GAUGE;
	default: return sf->share && sf->kind != STAT_KIND_TIME;
	}
}

/* A rate as a JSON number in [0, 1] with 4 decimals, null when nothing
 * was asked. */
static void rate_json(struct json *j, const char *key, uint64_t part,
		      uint64_t whole)
{
	if (whole)
		json_f64(j, key, (double)part / (double)whole, 4);
	else
		json_null(j, key);
}

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

static void server_json(struct json *j, const struct kvp_server_info *si);

static void pools_json(struct json *j, const struct pool_stats *pools, size_t n);

static void stats_json(FILE *f, const struct kvp_stats *s,
		       const struct kvp_server_info *si, bool all_tenants,
		       uint64_t now_ns, const struct pool_stats *pools, size_t n)
{
	struct json j;

	json_begin(&j, f);
	if (si)
		server_json(&j, si);
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
	if (n)
		pools_json(&j, pools, n);
	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < NELEM(stat_fields); i++)
			if (stat_in_pass(&stat_fields[i], pass))
				json_u64(&j, stat_fields[i].name,
					 stat_value(s, &stat_fields[i]));
	json_u64(&j, "chunk_last_access_ns", s->chunk_last_access_ns);
	if (s->chunk_last_access_ns)
		json_u64(&j, "chunk_last_access_age_s", now_ns > s->chunk_last_access_ns ?
			 (now_ns - s->chunk_last_access_ns) / 1000000000ull : 0);
	else
		json_null(&j, "chunk_last_access_age_s");
	rate_json(&j, "prefix_hit_rate", s->prefix_hit_tokens, s->prefix_lookup_tokens);
	rate_json(&j, "chunk_hit_rate", s->chunk_hits, s->chunk_lookups);
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

/* Names line up at 17 columns; the longer sharing names get one more space
 * than their length so the value never touches them. */
static int stat_width(const struct stat_field *sf)
{
	int n = (int)strlen(sf->name);

	return n < 17 ? 17 : n;
}

static void stat_line(FILE *f, const struct kvp_stats *s, const struct stat_field *sf)
{
	uint64_t v = stat_value(s, sf);
	char size[32];

	if (!strcmp(sf->unit, "bytes") && v >= 1024) {
		fmt_bytes(size, sizeof(size), v);
		fprintf(f, "%-*s %" PRIu64 " (%s)\n", stat_width(sf), sf->name, v, size);
	} else {
		fprintf(f, "%-*s %" PRIu64 "\n", stat_width(sf), sf->name, v);
	}
}

/* ---------------------------------------------------------------- server */

/* A daemon's fixed-size string, terminated and printable whatever it sent. */
#define SERVER_STR(dst, field) text_sanitize((dst), sizeof(dst), (field), sizeof(field))

/* "45s", "5m 3s", "1h 2m", "3d 4h". */
static void fmt_uptime(char *buf, size_t len, uint64_t ns)
{
	uint64_t t = ns / 1000000000ull;

	if (t < 60)
		snprintf(buf, len, "%llus", (unsigned long long)t);
	else if (t < 3600)
		snprintf(buf, len, "%llum %llus", (unsigned long long)(t / 60),
			 (unsigned long long)(t % 60));
	else if (t < 86400)
		snprintf(buf, len, "%lluh %llum", (unsigned long long)(t / 3600),
			 (unsigned long long)(t % 3600 / 60));
	else
		snprintf(buf, len, "%llud %lluh", (unsigned long long)(t / 86400),
			 (unsigned long long)(t % 86400 / 3600));
}

/* What kvpoold serves, before the figures (Redis' INFO server). */
static void server_text(FILE *f, const struct kvp_server_info *si)
{
	char up[32], size[32], be[sizeof(si->backend)], lay[sizeof(si->layout)],
	     dir[sizeof(si->disk_dir)], zc[sizeof(si->disk_compress)],
	     url[sizeof(si->remote)];

	fmt_uptime(up, sizeof(up), si->uptime_ns);
	SERVER_STR(be, si->backend);
	SERVER_STR(lay, si->layout);
	fprintf(f, "kvpoold %u.%u (protocol %u), pid %u, up %s\n", si->version / 1000,
		si->version % 1000, si->proto, si->pid, up);
	fprintf(f, "%-9s %s, %u pool%s, %u worker%s, %u shard%s, %u tenant%s\n", "backend",
		be, si->pools, si->pools == 1 ? "" : "s", si->workers,
		si->workers == 1 ? "" : "s", si->shards, si->shards == 1 ? "" : "s",
		si->tenants, si->tenants == 1 ? "" : "s");
	fprintf(f, "%-9s %s\n", "layout", lay);
	if (si->flags & KVP_SERVER_DISK) {
		SERVER_STR(dir, si->disk_dir);
		SERVER_STR(zc, si->disk_compress);
		fmt_bytes(size, sizeof(size), si->disk_size);
		fprintf(f, "%-9s %s%s%s, %s\n", "disk", si->disk_dir[0] ? dir : "",
			si->disk_dir[0] ? ", " : "", size, zc);
	} else {
		fprintf(f, "%-9s none\n", "disk");
	}
	if (si->flags & KVP_SERVER_REMOTE) {
		SERVER_STR(url, si->remote);
		fprintf(f, "%-9s %s%s%u of %u nodes up\n", "remote", si->remote[0] ? url : "",
			si->remote[0] ? ", " : "", si->remote_nodes_up, si->remote_nodes);
	} else {
		fprintf(f, "%-9s none\n", "remote");
	}
	fputc('\n', f);
}

static void server_json(struct json *j, const struct kvp_server_info *si)
{
	char v[32], be[sizeof(si->backend)], lay[sizeof(si->layout)],
	     dir[sizeof(si->disk_dir)], zc[sizeof(si->disk_compress)],
	     url[sizeof(si->remote)];

	snprintf(v, sizeof(v), "%u.%u", si->version / 1000, si->version % 1000);
	SERVER_STR(be, si->backend);
	SERVER_STR(lay, si->layout);
	json_obj_begin(j, "server");
	json_str(j, "version", v);
	json_u64(j, "protocol", si->proto);
	json_u64(j, "pid", si->pid);
	json_u64(j, "uptime_s", si->uptime_ns / 1000000000ull);
	json_u64(j, "started_ns", si->started_ns);
	json_str(j, "backend", be);
	json_u64(j, "pools", si->pools);
	json_u64(j, "workers", si->workers);
	json_u64(j, "shards", si->shards);
	json_u64(j, "tenants", si->tenants);
	json_str(j, "layout", lay);
	if (si->flags & KVP_SERVER_DISK) {
		SERVER_STR(dir, si->disk_dir);
		SERVER_STR(zc, si->disk_compress);
		json_obj_begin(j, "disk");
		if (si->flags & KVP_SERVER_ADMIN)
			json_str(j, "dir", dir);
		json_u64(j, "size", si->disk_size);
		json_str(j, "compress", zc);
		json_obj_end(j);
	} else {
		json_null(j, "disk");
	}
	if (si->flags & KVP_SERVER_REMOTE) {
		SERVER_STR(url, si->remote);
		json_obj_begin(j, "remote");
		if (si->flags & KVP_SERVER_ADMIN)
			json_str(j, "url", url);
		json_u64(j, "nodes", si->remote_nodes);
		json_u64(j, "nodes_up", si->remote_nodes_up);
		json_obj_end(j);
	} else {
		json_null(j, "remote");
	}
	json_obj_end(j);
}

static const struct table_col pool_cols[] = {
	{ "POOL", false }, { "GPU", false }, { "DEV_USED", false },
	{ "DEV_FRAMES", false }, { "HOST_USED", false }, { "HOST_FRAMES", false },
	{ "USERS", false }, { "LEASES", false }, { "PREPARES", false },
	{ "COMMITS", false },
};

static void pool_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	const struct pool_stats *p = &((const struct pool_stats *)ctx)[row];
	const struct kvp_stats *s = &p->st;
	uint64_t v[] = {
		p->pool, 0, s->tier[KVP_TIER_DEVICE].frames_used,
		s->tier[KVP_TIER_DEVICE].frames_total, s->tier[KVP_TIER_HOST].frames_used,
		s->tier[KVP_TIER_HOST].frames_total, s->users, s->leases, s->prepares,
		s->commits,
	};

	if (col == 1)
		snprintf(buf, len, "%" PRId32, p->gpu);
	else
		snprintf(buf, len, "%" PRIu64, v[col]);
}

void render_pools_table(FILE *f, const struct pool_stats *pools, size_t n)
{
	table_print(f, pool_cols, NELEM(pool_cols), n, pool_cell, (void *)pools);
}

static void pools_json(struct json *j, const struct pool_stats *pools, size_t n)
{
	json_arr_begin(j, "pools");
	for (size_t i = 0; i < n; i++) {
		const struct kvp_stats *s = &pools[i].st;

		json_obj_begin(j, NULL);
		json_u64(j, "pool", pools[i].pool);
		json_i64(j, "gpu", pools[i].gpu);
		for (size_t t = 0; t < KVP_TIERS; t++) {
			json_obj_begin(j, tier_name(t));
			json_u64(j, "frames_total", s->tier[t].frames_total);
			json_u64(j, "frames_used", s->tier[t].frames_used);
			json_obj_end(j);
		}
		json_u64(j, "users", s->users);
		json_u64(j, "leases", s->leases);
		json_u64(j, "prepares", s->prepares);
		json_u64(j, "commits", s->commits);
		json_obj_end(j);
	}
	json_arr_end(j);
}

void render_stats(FILE *f, bool json, const struct kvp_stats *s,
		  const struct kvp_server_info *si, bool all_tenants, uint64_t now_ns)
{
	render_stats_pools(f, json, s, si, all_tenants, now_ns, NULL, 0);
}

void render_stats_pools(FILE *f, bool json, const struct kvp_stats *s,
			const struct kvp_server_info *si, bool all_tenants,
			uint64_t now_ns, const struct pool_stats *pools, size_t n)
{
	char buf[32];

	/* A tenant's own client always sums exactly one tenant; more means the
	 * daemon answered for several (an admin with no tenant of its own). */
	all_tenants = all_tenants || s->tenants > 1;
	if (json) {
		stats_json(f, s, si, all_tenants, now_ns, pools, n);
		return;
	}
	if (si)
		server_text(f, si);
	fprintf(f, "scope: %s\n\n", all_tenants ? "all tenants" : "this client's tenant");
	table_print(f, tier_cols, NELEM(tier_cols), KVP_TIERS, tier_cell, (void *)s);
	fputc('\n', f);
	if (n) {
		render_pools_table(f, pools, n);
		fputc('\n', f);
	}
	for (int pass = 0; pass < 3; pass++) {
		for (size_t i = 0; i < NELEM(stat_fields); i++)
			if (stat_in_pass(&stat_fields[i], pass))
				stat_line(f, s, &stat_fields[i]);
		if (pass < 2)
			fputc('\n', f);
	}
	fmt_age(buf, sizeof(buf), now_ns, s->chunk_last_access_ns);
	fprintf(f, "%-17s %s%s\n", "chunk_last_access", buf,
		s->chunk_last_access_ns ? " ago" : "");
	fmt_percent(buf, sizeof(buf), s->prefix_hit_tokens, s->prefix_lookup_tokens);
	fprintf(f, "%-17s %s\n", "prefix_hit_rate", buf);
	fmt_percent(buf, sizeof(buf), s->chunk_hits, s->chunk_lookups);
	fprintf(f, "%-17s %s\n", "chunk_hit_rate", buf);
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
	json_u64(j, "pages_disk", u->pages_disk);
	json_u64(j, "tokens_disk", u->tokens_disk);
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
	fprintf(f, "%-14s %" PRIu32 "\n", "pages_disk", u->pages_disk);
	fprintf(f, "%-14s %" PRIu64 "\n", "tokens_disk", u->tokens_disk);
	fprintf(f, "%-14s %" PRIu32 "\n", "leases", u->leases);
	fprintf(f, "%-14s %" PRIu32 "\n", "tenant", u->tenant);
}

/* TENANT last: render_users() leaves it out for a one-tenant view. */
static const struct table_col user_cols[] = {
	{ "USER", false }, { "START", false }, { "LEN", false },
	{ "PAGES_DEV", false }, { "PAGES_HOST", false }, { "PAGES_DISK", false },
	{ "TOKENS_DISK", false }, { "LEASES", false }, { "TENANT", false },
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
	case 5: snprintf(buf, len, "%" PRIu32, u->pages_disk); break;
	case 6: snprintf(buf, len, "%" PRIu64, u->tokens_disk); break;
	case 7: snprintf(buf, len, "%" PRIu32, u->leases); break;
	case 8: snprintf(buf, len, "%" PRIu32, u->tenant); break;
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
		if (r->all)
			json_str(&j, "scope", r->tenant ? "tenant" : "all_tenants");
		json_str(&j, "tier", tier);
		json_u64(&j, r->all ? "users_affected" : "pages_freed", r->count);
		json_end(&j);
		return;
	}
	if (r->all && r->tenant)
		fprintf(f, "evict all of this client's tenant (tier %s): evicted %" PRIu64
			" user%s (leased users are skipped)\n", tier, r->count,
			r->count == 1 ? "" : "s");
	else if (r->all)
		fprintf(f, "evict all (tier %s): %" PRIu64 " user%s affected\n",
			tier, r->count, r->count == 1 ? "" : "s");
	else
		fprintf(f, "evict user %" PRIu64 " (tier %s): %" PRIu64 " page%s freed\n",
			r->user, tier, r->count, r->count == 1 ? "" : "s");
}

void render_move(FILE *f, bool json, const struct op_result *r, uint32_t from,
		 uint32_t to)
{
	if (json) {
		struct json j;

		json_begin(&j, f);
		json_u64(&j, "user", r->user);
		json_u64(&j, "from", from);
		json_u64(&j, "to", to);
		json_u64(&j, "pages", r->count);
		json_end(&j);
		return;
	}
	fprintf(f, "move user %" PRIu64 " from pool %" PRIu32 " to pool %" PRIu32
		": %" PRIu64 " page%s moved\n", r->user, from, to, r->count,
		r->count == 1 ? "" : "s");
}

void render_chunk_copy(FILE *f, bool json, const char *id, uint32_t from,
		       uint32_t to, uint64_t pages)
{
	if (json) {
		struct json j;

		json_begin(&j, f);
		json_str(&j, "chunk", id);
		json_u64(&j, "from", from);
		json_u64(&j, "to", to);
		json_u64(&j, "pages", pages);
		json_end(&j);
		return;
	}
	fprintf(f, "copy chunk %.16s from pool %" PRIu32 " to pool %" PRIu32 ": %"
		PRIu64 " page%s copied%s\n", id, from, to, pages, pages == 1 ? "" : "s",
		pages ? "" : " (it was there already)");
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

/* ---------------------------------------------------------------- chunks */

static const char *type_text(uint32_t type)
{
	const char *n = kvp_chunk_type_name(type);

	return n ? n : "?";
}

static const char *state_text(uint32_t state)
{
	switch (state) {
	case KVP_CHUNK_FILLING: return "filling";
	case KVP_CHUNK_READY: return "ready";
	default: return "?";
	}
}

static bool id_zero(const struct kvp_chunk_id *id)
{
	static const struct kvp_chunk_id zero;

	return !memcmp(id, &zero, sizeof(zero));
}

static void chunk_members(struct json *j, const struct kvp_chunk_info *ci,
			  uint64_t now_ns)
{
	char hex[65];

	kvp_chunk_id_format(&ci->id, hex);
	json_str(j, "id", hex);
	kvp_chunk_id_format(&ci->root, hex);
	json_str(j, "root", id_zero(&ci->root) ? NULL : hex);
	json_str(j, "type", type_text(ci->type));
	json_str(j, "state", state_text(ci->state));
	json_u64(j, "tokens", ci->tokens);
	json_u64(j, "entries", ci->entries);
	json_u64(j, "pages", ci->pages);
	json_u64(j, "bytes", ci->bytes);
	json_u64(j, "holders", ci->holders);
	json_u64(j, "filler", ci->filler);
	json_u64(j, "hits", ci->hits);
	json_u64(j, "created_ns", ci->created_ns);
	json_u64(j, "last_access_ns", ci->last_access_ns);
	if (ci->last_access_ns)
		json_u64(j, "last_access_age_s", now_ns > ci->last_access_ns ?
			 (now_ns - ci->last_access_ns) / 1000000000ull : 0);
	else
		json_null(j, "last_access_age_s");
	json_u64(j, "content_len", ci->content_len);
	json_strn(j, "preview", ci->preview, sizeof(ci->preview));
	/* JSON object text, as a string: what the Python binding gives too. */
	json_strn(j, "meta", ci->meta, sizeof(ci->meta));
}

static const struct table_col chunk_cols[] = {
	{ "NAME", true }, { "TYPE", true }, { "STATE", true }, { "TOKENS", false },
	{ "ENTRIES", false }, { "PAGES", false }, { "HOLDERS", false },
	{ "HITS", false }, { "LAST", false }, { "META", true }, { "PREVIEW", true },
};

struct chunk_ctx {
	const struct kvp_chunk_info *rows;
	uint64_t now_ns;
};

static void chunk_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	const struct chunk_ctx *cc = ctx;
	const struct kvp_chunk_info *ci = &cc->rows[row];
	char hex[65];

	switch (col) {
	case 0:
		kvp_chunk_id_format(&ci->id, hex);
		snprintf(buf, len, "%.16s", hex);
		break;
	case 1: snprintf(buf, len, "%s", type_text(ci->type)); break;
	case 2: snprintf(buf, len, "%s", state_text(ci->state)); break;
	case 3: snprintf(buf, len, "%" PRIu32, ci->tokens); break;
	case 4: snprintf(buf, len, "%" PRIu32, ci->entries); break;
	case 5: snprintf(buf, len, "%" PRIu32, ci->pages); break;
	case 6: snprintf(buf, len, "%" PRIu32, ci->holders); break;
	case 7: snprintf(buf, len, "%" PRIu64, ci->hits); break;
	case 8: fmt_age(buf, len, cc->now_ns, ci->last_access_ns); break;
	/* Whatever a client registered: not for the terminal as is. */
	case 9: text_sanitize(buf, len, ci->meta, sizeof(ci->meta)); break;
	case 10: text_sanitize(buf, len, ci->preview, sizeof(ci->preview)); break;
	}
}

void render_chunks(FILE *f, bool json, const struct kvp_chunk_info *rows,
		   size_t n, uint64_t now_ns, const struct chunks_disk *disk)
{
	struct chunk_ctx cc = { rows, now_ns };

	if (json) {
		struct json j;

		json_begin(&j, f);
		json_arr_begin(&j, "chunks");
		for (size_t i = 0; i < n; i++) {
			json_obj_begin(&j, NULL);
			chunk_members(&j, &rows[i], now_ns);
			json_obj_end(&j);
		}
		json_arr_end(&j);
		json_u64(&j, "count", n);
		if (disk) {
			json_u64(&j, "disk_chunks", disk->chunks);
			json_u64(&j, "disk_chunk_pages", disk->pages);
		}
		json_end(&j);
		return;
	}
	table_print(f, chunk_cols, NELEM(chunk_cols), n, chunk_cell, &cc);
	if (disk && disk->chunks)
		fprintf(f, "and %" PRIu64 " chunk%s (%" PRIu64 " pages) only on the disk "
			"tier: an acquire or a register of one brings it back\n",
			disk->chunks, disk->chunks == 1 ? "" : "s", disk->pages);
}

void render_chunk(FILE *f, bool json, const struct kvp_chunk_info *ci,
		  uint64_t now_ns)
{
	char hex[65], buf[TABLE_CELL_MAX * 4 + 8];

	if (json) {
		struct json j;

		json_begin(&j, f);
		chunk_members(&j, ci, now_ns);
		json_end(&j);
		return;
	}
	kvp_chunk_id_format(&ci->id, hex);
	fprintf(f, "%-12s %s\n", "name", hex);
	kvp_chunk_id_format(&ci->root, hex);
	fprintf(f, "%-12s %s\n", "root", id_zero(&ci->root) ? "-" : hex);
	fprintf(f, "%-12s %s\n", "type", type_text(ci->type));
	fprintf(f, "%-12s %s\n", "state", state_text(ci->state));
	fprintf(f, "%-12s %" PRIu32 "\n", "tokens", ci->tokens);
	fprintf(f, "%-12s %" PRIu32 "\n", "entries", ci->entries);
	fprintf(f, "%-12s %" PRIu32 "\n", "pages", ci->pages);
	fmt_bytes(buf, sizeof(buf), ci->bytes);
	fprintf(f, "%-12s %" PRIu64 " (%s)\n", "bytes", ci->bytes, buf);
	fprintf(f, "%-12s %" PRIu32 "\n", "holders", ci->holders);
	if (ci->state == KVP_CHUNK_FILLING)
		fprintf(f, "%-12s client %" PRIu32 "\n", "filler", ci->filler);
	fprintf(f, "%-12s %" PRIu64 "\n", "hits", ci->hits);
	fmt_age(buf, sizeof(buf), now_ns, ci->created_ns);
	fprintf(f, "%-12s %s%s\n", "created", buf, ci->created_ns ? " ago" : "");
	fmt_age(buf, sizeof(buf), now_ns, ci->last_access_ns);
	fprintf(f, "%-12s %s%s\n", "last_access", buf, ci->last_access_ns ? " ago" : "");
	fprintf(f, "%-12s %" PRIu32 " bytes\n", "content", ci->content_len);
	text_sanitize(buf, sizeof(buf), ci->preview, sizeof(ci->preview));
	fprintf(f, "%-12s %s\n", "preview", buf);
	text_sanitize(buf, sizeof(buf), ci->meta, sizeof(ci->meta));
	fprintf(f, "%-12s %s\n", "meta", buf);
}

static const struct table_col entry_cols[] = {
	{ "ENTRY", true }, { "PARENT", true }, { "START", false }, { "TOKENS", false },
	{ "PAGES", false }, { "STATE", true }, { "HOLDERS", false }, { "CHILDREN", false },
};

static void entry_cell(void *ctx, size_t row, size_t col, char *buf, size_t len)
{
	const struct kvp_chunk_entry_info *en = (const struct kvp_chunk_entry_info *)ctx + row;
	char hex[65];

	switch (col) {
	case 0:
		kvp_chunk_id_format(&en->id, hex);
		snprintf(buf, len, "%.16s", hex);
		break;
	case 1:
		kvp_chunk_id_format(&en->parent, hex);
		snprintf(buf, len, "%.16s", id_zero(&en->parent) ? "- (root)" : hex);
		break;
	case 2: snprintf(buf, len, "%" PRIu32, en->start); break;
	case 3: snprintf(buf, len, "%" PRIu32, en->tokens); break;
	case 4: snprintf(buf, len, "%" PRIu32, en->pages); break;
	case 5: snprintf(buf, len, "%s", state_text(en->state)); break;
	case 6: snprintf(buf, len, "%" PRIu32, en->holders); break;
	case 7: snprintf(buf, len, "%" PRIu32, en->children); break;
	}
}

void render_chunk_entries(FILE *f, bool json, const struct kvp_chunk_entry_info *rows,
			  size_t n)
{
	char hex[65];

	if (!json) {
		table_print(f, entry_cols, NELEM(entry_cols), n, entry_cell, (void *)rows);
		return;
	}
	struct json j;

	json_begin(&j, f);
	json_arr_begin(&j, "entries");
	for (size_t i = 0; i < n; i++) {
		const struct kvp_chunk_entry_info *en = &rows[i];

		json_obj_begin(&j, NULL);
		kvp_chunk_id_format(&en->id, hex);
		json_str(&j, "id", hex);
		kvp_chunk_id_format(&en->name, hex);
		json_str(&j, "name", hex);
		kvp_chunk_id_format(&en->parent, hex);
		json_str(&j, "parent", id_zero(&en->parent) ? NULL : hex);
		json_u64(&j, "start", en->start);
		json_u64(&j, "tokens", en->tokens);
		json_u64(&j, "pages", en->pages);
		json_str(&j, "state", state_text(en->state));
		json_u64(&j, "holders", en->holders);
		json_u64(&j, "children", en->children);
		json_obj_end(&j);
	}
	json_arr_end(&j);
	json_u64(&j, "count", n);
	json_end(&j);
}

void render_chunk_op(FILE *f, bool json, const struct chunk_op_result *r)
{
	const char *type = r->type ? type_text(r->type) : "all";
	const char *s = r->count == 1 ? "" : "s";

	if (json) {
		struct json j;

		json_begin(&j, f);
		json_str(&j, "op", r->op);
		if (!strcmp(r->op, "clear"))
			json_str(&j, "type", type);
		else if (!strcmp(r->op, "evict_unused"))
			json_u64(&j, "max_age_s", r->max_age_s);
		else
			json_str(&j, "id", r->id);
		json_u64(&j, "chunks_deleted", r->count);
		json_end(&j);
		return;
	}
	if (!strcmp(r->op, "clear"))
		fprintf(f, "clear chunks (type %s): %" PRIu64 " chunk%s deleted\n",
			type, r->count, s);
	else if (!strcmp(r->op, "evict_unused"))
		fprintf(f, "evict unused chunks (idle %" PRIu32 " s or more): %" PRIu64
			" chunk%s deleted\n", r->max_age_s, r->count, s);
	else
		fprintf(f, "deleted chunk %s: %" PRIu64 " entr%s with everything below "
			"(pages are freed once no lease holds them)\n", r->id, r->count,
			r->count == 1 ? "y" : "ies");
}
