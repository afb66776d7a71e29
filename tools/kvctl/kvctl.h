/* SPDX-License-Identifier: MIT */
/*
 * kvctl.h - what the parts of kvctl share.
 *
 * kvctl is split by what a part may touch:
 *   kvctl.c     the command line: options, the command table, help, dispatch;
 *   commands.c  the only code that talks to kvpoold (through libkvpool's
 *               public API), one cmd_<name>() per command;
 *   render.c    turns what a command fetched into a table or one JSON object;
 *   output.c    sizes, percentages, text for a terminal and the table printer
 *               (the JSON writer is tools/common/json.c, shared with kvbench);
 *   parse.c     strict parsing of user ids, counts, tier names, chunk ids.
 * render.c, output.c and parse.c do no I/O but to the FILE they are given,
 * so tests/unit/test_kvctl_output.c checks them byte for byte.
 */
#ifndef KVCTL_H
#define KVCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json.h"   /* tools/common: the JSON writer render.c prints with */
#include "kvpool.h"

enum {
	KVCTL_EXIT_OK = 0,
	KVCTL_EXIT_FAIL = 1,   /* daemon unreachable, operation refused or failed */
	KVCTL_EXIT_USAGE = 2,  /* bad command line */
};

/* ---------------------------------------------------------------- parse.c */

/*
 * Parse a decimal uint64 strictly: digits only (no sign, space, prefix or
 * suffix), at least one, no overflow. Returns 0, -EINVAL (not a number) or
 * -ERANGE (above UINT64_MAX).
 */
int parse_u64(const char *s, uint64_t *out);

/* "device", "host" or "all" to enum kvp_tier_sel; -EINVAL for anything else. */
int parse_tier_sel(const char *s, uint32_t *sel);

/* The name parse_tier_sel() reads for sel; "?" for no valid selection. */
const char *tier_sel_name(uint32_t sel);

/*
 * A chunk id as typed: 1 to 64 hex digits (the full id, or a prefix such as
 * the 16 digits `kvctl chunks` shows), written lowercase into out. Returns
 * the number of digits, or -EINVAL.
 */
int parse_chunk_prefix(const char *s, char out[65]);

/* ---------------------------------------------------------------- output.c */

/*
 * A size in binary units with one decimal ("512 B", "1.5 KiB", "2.0 GiB").
 * Returns what snprintf returned.
 */
int fmt_bytes(char *buf, size_t len, uint64_t bytes);

/* part of whole as a percentage rounded down to 0.1 ("25.0%"); "-" when whole is 0. */
int fmt_percent(char *buf, size_t len, uint64_t part, uint64_t whole);

/* How long ago then_ns was at now_ns (CLOCK_REALTIME): "42s", "5m", "3h",
 * "2d"; "-" when then_ns is 0 (never); "0s" when it is in the future. */
int fmt_age(char *buf, size_t len, uint64_t now_ns, uint64_t then_ns);

/*
 * Copy at most srclen bytes of src (stopping at a NUL) into dst for a
 * terminal: printable ASCII is kept, every other byte becomes '?', so a
 * client name cannot move the cursor or change colours. dst is always
 * NUL-terminated; an empty result is written as "-". Returns strlen(dst).
 */
size_t text_sanitize(char *dst, size_t dstlen, const char *src, size_t srclen);

struct table_col {
	const char *name;
	bool left;            /* left-aligned (text); numbers align right */
};

/* Write the cell of (row, col) into buf (NUL-terminated, at most len bytes). */
typedef void (*table_cell_fn)(void *ctx, size_t row, size_t col, char *buf,
			      size_t len);

/* Cells are at most this long; longer ones are cut. */
#define TABLE_CELL_MAX 64

/*
 * Print a header line and nrows rows, each column as wide as its widest
 * cell, columns two spaces apart, no trailing blanks. cell is called twice
 * per cell (once to measure, once to print), so it must be pure.
 */
void table_print(FILE *f, const struct table_col *cols, size_t ncols,
		 size_t nrows, table_cell_fn cell, void *ctx);

/* ---------------------------------------------------------------- render.c */

/* Each writes one JSON object when json is set, else the human form.
 * now_ns (CLOCK_REALTIME) is what ages are counted from. */
/* si (NULL: a kvpoold too old to say) comes first: what the daemon serves. */
void render_stats(FILE *f, bool json, const struct kvp_stats *s,
		  const struct kvp_server_info *si, bool all_tenants, uint64_t now_ns);

/* One pool of the daemon (one GPU): its stats in the same scope. */
struct pool_stats {
	uint32_t pool;
	int32_t gpu;        /* kvp_server_info.pool_device[pool] */
	struct kvp_stats st;
};

/* render_stats and, after the tiers, one row per pool with its GPU (JSON:
 * a "pools" array); n 0: render_stats. */
void render_stats_pools(FILE *f, bool json, const struct kvp_stats *s,
			const struct kvp_server_info *si, bool all_tenants,
			uint64_t now_ns, const struct pool_stats *pools, size_t n);
/* The per-pool table alone (kvctl top). */
void render_pools_table(FILE *f, const struct pool_stats *pools, size_t n);
void render_user(FILE *f, bool json, const struct kvp_user_info *u);
/* with_tenant: add the TENANT column (admins see every tenant's users);
 * truncated: --limit stopped the listing while the daemon had more. */
void render_users(FILE *f, bool json, const struct kvp_user_info *rows,
		  size_t n, bool with_tenant, bool truncated);
void render_clients(FILE *f, bool json, const struct kvp_client_info *rows,
		    size_t n);

/* What evict or offload did: to one user, or (all) to every user. */
struct op_result {
	bool all;
	bool tenant;        /* all: the client's tenant only, not every tenant */
	uint64_t user;      /* when !all */
	uint32_t sel;       /* evict: enum kvp_tier_sel */
	uint64_t count;     /* evict: pages freed (user) or users affected (all);
			     * offload: pages copied to the host tier */
};

void render_evict(FILE *f, bool json, const struct op_result *r);
/* kvctl move: user, from, to, pages moved (r->count). */
void render_move(FILE *f, bool json, const struct op_result *r, uint32_t from,
		 uint32_t to);
void render_chunk_copy(FILE *f, bool json, const char *id, uint32_t from,
		       uint32_t to, uint64_t pages);
void render_offload(FILE *f, bool json, const struct op_result *r);

/* Chunks only on the disk tier (kvp_stats): not listed by name (their
 * names are on disk), counted after the list. */
struct chunks_disk {
	uint64_t chunks, pages;
};

/* kvctl chunks: one row per chunk name, the name cut to 16 hex digits in
 * the table (full in JSON, with its root entry); disk (NULL: no disk tier)
 * adds the chunks only on disk. */
void render_chunks(FILE *f, bool json, const struct kvp_chunk_info *rows,
		   size_t n, uint64_t now_ns, const struct chunks_disk *disk);
/* kvctl chunk ID: every field of one chunk. */
void render_chunk(FILE *f, bool json, const struct kvp_chunk_info *ci,
		  uint64_t now_ns);

/* kvctl chunks --entries NAME: one row per entry, parent and start. */
void render_chunk_entries(FILE *f, bool json, const struct kvp_chunk_entry_info *rows,
			  size_t n);

/* What chunks --clear, chunks --evict-unused or evict --chunk did. */
struct chunk_op_result {
	const char *op;     /* "clear", "evict_unused", "delete" */
	uint32_t type;      /* clear: enum kvp_chunk_type, 0 all */
	uint32_t max_age_s; /* evict_unused */
	char id[65];        /* delete: the full id */
	uint64_t count;     /* chunks (delete: entries) deleted */
};

void render_chunk_op(FILE *f, bool json, const struct chunk_op_result *r);

/* ---------------------------------------------------------------- commands.c */

/* Everything the command line said, parsed and checked by kvctl.c. */
struct kvctl_args {
	bool json;
	bool all_tenants;     /* stats */
	bool all;             /* evict, offload */
	uint64_t user;        /* user: the ID argument; evict, offload: --user */
	uint32_t sel;         /* evict: enum kvp_tier_sel, KVP_SEL_ALL by default */
	uint64_t limit;       /* users: 0 = no limit */
	uint32_t chunk_type;  /* chunks: --type, 0 = all */
	const char *filter;   /* chunks: --filter k=v,... (NULL: none) */
	bool clear;           /* chunks --clear */
	bool evict_unused;    /* chunks --evict-unused SECONDS */
	uint32_t max_age_s;
	char chunk[65];       /* chunk ID, evict --chunk ID: hex digits typed */
	bool has_chunk;
	bool entries;         /* chunks --entries NAME (in chunk) */
	bool watch;           /* stats --watch */
	uint32_t interval_s;  /* stats --watch, top --interval (default 1) */
	uint64_t count;       /* --count: frames, 0 = until interrupted */
	const char *socket;   /* the daemon's socket (top's header) */
	uint32_t from, to;    /* move --from, --to */
};

int cmd_stats(struct kvp_client *c, const struct kvctl_args *a);
int cmd_users(struct kvp_client *c, const struct kvctl_args *a);
int cmd_user(struct kvp_client *c, const struct kvctl_args *a);
int cmd_clients(struct kvp_client *c, const struct kvctl_args *a);
int cmd_reload(struct kvp_client *c, const struct kvctl_args *a);
int cmd_evict(struct kvp_client *c, const struct kvctl_args *a);
int cmd_offload(struct kvp_client *c, const struct kvctl_args *a);
int cmd_chunks(struct kvp_client *c, const struct kvctl_args *a);
int cmd_chunk(struct kvp_client *c, const struct kvctl_args *a);
int cmd_top(struct kvp_client *c, const struct kvctl_args *a);
int cmd_move(struct kvp_client *c, const struct kvctl_args *a);
/* Each pool's stats in the scope of kvp_stats(all_tenants) into pools;
 * how many, 0 when the daemon is too old to say (or failed). */
size_t stats_pools(struct kvp_client *c, bool all_tenants,
		   struct pool_stats *pools);

/* ---------------------------------------------------------------- top.c */

/* One refresh of kvctl top: what the daemon said, and when. */
struct top_sample {
	uint64_t mono_ns;
	struct kvp_stats st;
	struct kvp_latency lat;
	bool have_lat;                 /* admins only */
	struct pool_stats pools[KVP_POOLS_MAX]; /* per GPU; npools 0: none */
	size_t npools;
	struct kvp_user_info *users;   /* every user the client may list */
	size_t nusers;
	bool users_truncated;
};

/*
 * One screen of kvctl top from two samples (prev may have mono_ns 0: the
 * first screen, no rates yet): header, tiers, rates per second of the
 * counters, op latency percentiles over the interval, top users and
 * tenants by pages. Sorts cur->users.
 */
void render_top(FILE *f, const char *socket, struct top_sample *cur,
		const struct top_sample *prev);

/* stats --watch: kvctl stats every interval_s seconds (commands.c runs one). */
int stats_watch(struct kvp_client *c, const struct kvctl_args *a,
		int (*once)(struct kvp_client *c, const struct kvctl_args *a));

#endif /* KVCTL_H */
