/* SPDX-License-Identifier: MIT */
/*
 * config.h - kvpoold's settings: defaults, kvpool.conf, --key=value flags.
 *
 * Precedence, lowest first: built-in defaults, $KVPOOL_SOCKET (socket only),
 * the file given by --config, the command line. Every setting has a flag of
 * the same name; a --tenant=NAME:... flag replaces the file's tenant of that
 * name or adds one. A bad value is reported with where it came from, the key,
 * the value and what is valid; kvpoold then exits with status 2.
 */
#ifndef KVPOOLD_CONFIG_H
#define KVPOOLD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "kvpool.h"

#define TENANT_NAME_MAX 31 /* fits kvp_welcome.tenant with its NUL */
#define TENANTS_MAX 64
#define DEVICES_MAX 16     /* pools one kvpoold serves (GPUs of `devices`) */
#define TP_MAX 8           /* ranks of a tensor-parallel pool (`tp`) */
#define HASH_SALT_MAX 255  /* bytes of a tenant's hash_salt */

/* Exit statuses (kvpoold(8), EXIT STATUS). */
#define EXIT_RUNTIME 1 /* could not start or serve: socket in use, no memory */
#define EXIT_USAGE 2   /* a bad setting or flag */

struct id_list {
	uint32_t *v;
	uint32_t n;
	bool set;        /* given explicitly (replaces the default) */
};

/* Sequences (kvpool.h kvp_seq_info; seed 004's EnableCaching, MaxSeqLen,
 * MaxNumRequests): all zero is the default, caching on and no limit. */
struct seq_settings {
	bool no_caching;          /* prefix_caching = no */
	uint64_t max_seq_tokens;  /* tokens of one sequence (0: no limit) */
	uint64_t max_seqs;        /* sequences at once in a pool (0: no limit) */
};

struct tenant_config {
	char name[TENANT_NAME_MAX + 1];
	struct id_list uids, gids;
	uint64_t device_mem, host_mem, max_tokens; /* bytes, bytes, tokens */
	bool has_device_mem, has_host_mem, has_max_tokens;
	uint64_t disk_size;  /* the tenant's quota on the disk tier, bytes */
	bool has_disk_size;
	/* Chunk limits (kvpool.h kvp_chunk_limits): names, 0 unlimited; chunk
	 * pages over device frames, (0, 1]. */
	uint64_t max_chunks;
	double chunk_memory_ratio;
	bool has_max_chunks, has_chunk_memory_ratio;
	struct seq_settings seq;
	bool has_prefix_caching, has_max_seq_tokens, has_max_seqs;
	/* The secret the tenant's prefix and chunk hashes are salted with
	 * (tenant.c derives the engine's salt from it); "" by default. */
	char hash_salt[HASH_SALT_MAX + 1];
	char origin[64]; /* "FILE:LINE" or "--tenant": where it was defined */
};

struct config {
	char *config_path;
	char *socket;
	uint32_t socket_mode;
	int64_t socket_gid;       /* -1: leave the group as created */
	char *backend;            /* "shm", "cuda" or "auto" (a build without
				   * CUDA stores "shm" for auto); auto is
				   * resolved when the pools are made */
	int devices[DEVICES_MAX]; /* GPU ordinals, one pool each (default {0}) */
	uint32_t ndevices;
	/* Tensor parallelism (1..TP_MAX, default 1): with tp > 1 the devices
	 * are taken tp at a time, pool p spanning devices[p*tp .. p*tp+tp-1],
	 * rank r of it on devices[p*tp + r] (config_npools). layout stays the
	 * whole model's; each rank holds kv_heads / tp of every page. */
	uint32_t tp;
	bool devices_all;         /* `devices = all`: devices_resolve() fills
				   * devices[] when the backend opens */
	uint64_t device_mem, host_mem;
	char *layout_spec;
	struct kvp_layout layout; /* parsed from layout_spec by config_load */
	uint64_t max_tokens_per_user;
	uint64_t max_chunks;      /* default of the tenants' (0: unlimited) */
	double chunk_memory_ratio; /* default of the tenants' (1.0) */
	struct seq_settings seq;  /* default of the tenants' */
	uint64_t chunk_content_max; /* bytes of content a chunk name keeps */
	struct id_list allow_uids, allow_gids, admin_uids;
	uint32_t spin_us;
	uint32_t workers;
	uint32_t shards;          /* per (tenant, pool); 0: one per worker */
	uint32_t reclaim;         /* enum reclaim_mode (shard.h) */
	bool reclaim_boost;       /* reclaim_boost = yes (shard.h) */
	uint32_t sq_entries;
	uint32_t arena_bytes;
	/* Connections accepted that have not sent their hello yet: at most
	 * max_pending in all and max_pending_per_uid from one uid, each closed
	 * hello_timeout_ms after it was accepted (listener.c). */
	uint32_t max_pending;
	uint32_t max_pending_per_uid;
	uint32_t hello_timeout_ms;
	/* Attached clients: at most max_clients_per_uid of one uid and
	 * max_clients_per_tenant of one tenant (0: a share of the descriptor
	 * limit, tenant_client_caps()), so that none can take every
	 * descriptor (listener.c, attach). */
	uint32_t max_clients_per_uid;
	uint32_t max_clients_per_tenant;
	bool foreground;
	char *pidfile;
	char *log;                /* NULL: stderr in foreground, else syslog */
	uint32_t log_level;       /* LOG_ERR .. LOG_DEBUG: lines less severe
				   * than this are not written */
	/* The disk tier (daemon/disk/): off while disk_dir is NULL. disk_size
	 * is the file's size (the tenants' default quota: all of it);
	 * disk_compress is checked by config_load ("none", "zstd[:LEVEL]"). */
	char *disk_dir;
	uint64_t disk_size;
	char *disk_compress;
	/* The remote tier (daemon/remote/): off while remote is NULL; the URL
	 * is checked when it is set. */
	char *remote;
	uint32_t remote_timeout_ms;
	bool remote_user_histories;
	char *remote_compress;
	uint64_t remote_queue;    /* bytes; 0: 64 MiB */
	uint32_t remote_chunk_types; /* 1 << enum kvp_chunk_type of each kept there */
	char *metrics;            /* "ADDR:PORT" of /metrics; NULL: none */
	struct sockaddr_storage metrics_addr; /* parsed from it */
	struct tenant_config *tenants;
	uint32_t ntenants;
};

/*
 * Build the configuration from defaults, the environment, --config and the
 * flags. Returns 0 to run; CONFIG_EXIT_OK after printing --help or
 * --version; EXIT_USAGE after printing what was wrong to stderr.
 */
#define CONFIG_EXIT_OK (-1)
int config_load(struct config *cfg, int argc, char **argv);
/* The message of config_load's last error ("" before any): what a reload
 * logs and answers, since its standard error may go nowhere. */
const char *config_last_error(void);
/* A warning in the log when the pools could not fit this machine's memory. */
void config_warn_memory(const struct config *c);
/*
 * Apply the kvpool.conf lines read from f to cfg (config_load's --config
 * step; path names the file in messages). Returns 0, or EXIT_USAGE after
 * printing what was wrong: a bad line, or an error reading f.
 */
int config_read(struct config *cfg, FILE *f, const char *path);
void config_free(struct config *cfg);

/* Pools served: ndevices / tp (one per GPU when tp = 1). */
uint32_t config_npools(const struct config *cfg);

/* "0,1": the devices list for messages. */
void config_devices_format(const struct config *cfg, char *buf, size_t len);

/* Frames of page_bytes a size holds, as config_load checked they fit. */
uint32_t config_frames(const struct config *cfg, uint64_t bytes);

bool id_list_has(const struct id_list *l, uint32_t id);

/* ---- config_parse.c: value parsers; each returns 0 or -EINVAL with what
 * is valid in err (the caller adds where and which key). */
int parse_u64(const char *s, uint64_t *out);
int parse_size(const char *s, uint64_t *out, char *err, size_t errlen);
int parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out,
	       char *err, size_t errlen);
int parse_bool(const char *s, bool *out, char *err, size_t errlen);
int parse_mode(const char *s, uint32_t *out, char *err, size_t errlen);
/* Comma-separated numbers or names (user names for uids, group names for
 * gids); replaces *l. */
int parse_ids(const char *s, bool groups, struct id_list *l, char *err,
	      size_t errlen);
int parse_group(const char *s, int64_t *gid, char *err, size_t errlen);
/* "127.0.0.1:9464" or "[::1]:9464": a numeric address and a port (0: any
 * free one). */
int parse_listen_addr(const char *s, struct sockaddr_storage *out, char *err,
		      size_t errlen);
int parse_tenant_name(const char *s, char *out, char *err, size_t errlen);
void id_list_free(struct id_list *l);
/* "1001,1002" for messages and --help; "(none)" when empty. */
void id_list_format(const struct id_list *l, char *buf, size_t len);
/* Trim leading and trailing blanks in place; returns s. */
char *str_trim(char *s);

#endif /* KVPOOLD_CONFIG_H */
