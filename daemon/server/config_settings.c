/* SPDX-License-Identifier: MIT */
/*
 * config_settings.c - the settings table: every setting once, with its
 * key (the same in kvpool.conf and as --key=value), scope, setter and
 * --help line (config.c's top comment).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#include "config_settings.h"
#include "disk_codec.h"
#include "redis_cluster.h"
#include "kvpool_engine.h" /* SHARDS_MAX */
#include "proto.h"

int set_str(char **dst, const char *v)
{
	char *s = strdup(v);

	if (!s)
		return -ENOMEM;
	free(*dst);
	*dst = s;
	return 0;
}

static int set_socket(struct config *c, struct tenant_config *t, const char *v,
		      char *err, size_t len)
{
	if (!*v) {
		snprintf(err, len, "use the path of a Unix socket");
		return -EINVAL;
	}
	return set_str(&c->socket, v);
}

static int set_socket_mode(struct config *c, struct tenant_config *t,
			   const char *v, char *err, size_t len)
{
	return parse_mode(v, &c->socket_mode, err, len);
}

static int set_socket_group(struct config *c, struct tenant_config *t,
			    const char *v, char *err, size_t len)
{
	return parse_group(v, &c->socket_gid, err, len);
}

#if KVPOOL_HAVE_CUDA
#define BACKEND_HELP "shm, cuda or auto (default auto: cuda when a GPU is found, else shm)"
#else
#define BACKEND_HELP "shm or auto (default auto = shm: this kvpoold is built without CUDA)"
#endif

static int set_backend(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
#if KVPOOL_HAVE_CUDA
	if (strcmp(v, "shm") && strcmp(v, "cuda") && strcmp(v, "auto")) {
		snprintf(err, len, "use shm, cuda or auto");
		return -EINVAL;
	}
	return set_str(&c->backend, v);
#else
	if (strcmp(v, "cuda") == 0) {
		snprintf(err, len, "kvpoold was built without CUDA (KVPOOL_CUDA=OFF "
			 "or no nvcc); use backend=shm");
		return -EINVAL;
	}
	if (strcmp(v, "shm") && strcmp(v, "auto")) {
		snprintf(err, len, "use shm or auto (auto picks shm in this build)");
		return -EINVAL;
	}
	return set_str(&c->backend, "shm");
#endif
}

/* "0" or "0,1,3": GPU ordinals, each once; one pool per entry. "all":
 * every GPU the backend sees, resolved when it opens (devices.c); until
 * then one pool on device 0, which is what shm makes of it. */
static int set_devices(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	int dev[DEVICES_MAX];
	uint32_t n = 0;
	char *copy, *save = NULL, *tok;
	int ret = 0;

	if (!strcmp(v, "all")) {
		c->devices[0] = 0;
		c->ndevices = 1;
		c->devices_all = true;
		return 0;
	}
	copy = strdup(v);
	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok && !ret;
	     tok = strtok_r(NULL, ",", &save)) {
		uint64_t x;

		tok = str_trim(tok);
		if (parse_u64(tok, &x) || x > 1023) {
			snprintf(err, len, "'%s' is not a GPU ordinal; use a comma-"
				 "separated list of device numbers such as 0 or 0,1, "
				 "or all",
				 tok);
			ret = -EINVAL;
		} else if (n == DEVICES_MAX) {
			snprintf(err, len, "more than %d devices", DEVICES_MAX);
			ret = -EINVAL;
		} else {
			for (uint32_t i = 0; i < n && !ret; i++) {
				if (dev[i] == (int)x) {
					snprintf(err, len, "device %d is listed twice; "
						 "each GPU is one pool", dev[i]);
					ret = -EINVAL;
				}
			}
			dev[n++] = (int)x;
		}
	}
	free(copy);
	if (!ret && !n) {
		snprintf(err, len, "give at least one device, e.g. 0");
		ret = -EINVAL;
	}
	if (ret)
		return ret;
	memcpy(c->devices, dev, n * sizeof(dev[0]));
	c->ndevices = n;
	c->devices_all = false;
	return 0;
}

static int set_device_mem(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	uint64_t *dst = t ? &t->device_mem : &c->device_mem;
	int ret = parse_size(v, dst, err, len);

	if (!ret && t)
		t->has_device_mem = true;
	return ret;
}

static int set_host_mem(struct config *c, struct tenant_config *t,
			const char *v, char *err, size_t len)
{
	uint64_t *dst = t ? &t->host_mem : &c->host_mem;
	int ret = parse_size(v, dst, err, len);

	if (!ret && t)
		t->has_host_mem = true;
	return ret;
}

static int set_layout(struct config *c, struct tenant_config *t, const char *v,
		      char *err, size_t len)
{
	return set_str(&c->layout_spec, v);
}

static int set_max_tokens(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	uint64_t *dst = t ? &t->max_tokens : &c->max_tokens_per_user;
	int ret = parse_uint(v, 0, 1ull << 62, dst, err, len);

	if (!ret && t)
		t->has_max_tokens = true;
	return ret;
}

static int set_max_chunks(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	uint64_t *dst = t ? &t->max_chunks : &c->max_chunks;
	int ret = parse_uint(v, 0, UINT32_MAX, dst, err, len);

	if (!ret && t)
		t->has_max_chunks = true;
	return ret;
}

static int set_chunk_memory_ratio(struct config *c, struct tenant_config *t,
				  const char *v, char *err, size_t len)
{
	double *dst = t ? &t->chunk_memory_ratio : &c->chunk_memory_ratio;
	char *end = NULL;
	double x;

	errno = 0;
	x = strtod(v, &end);
	if (!*v || errno || !end || *end || !(x > 0 && x <= 1)) {
		snprintf(err, len, "use a fraction of the device tier in (0, 1], "
			 "e.g. 0.5");
		return -EINVAL;
	}
	*dst = x;
	if (t)
		t->has_chunk_memory_ratio = true;
	return 0;
}

static int set_chunk_content_max(struct config *c, struct tenant_config *t,
				 const char *v, char *err, size_t len)
{
	uint64_t x;

	if (parse_size(v, &x, err, len) || x > (1u << 30)) {
		snprintf(err, len, "use a size from 0 to 1G, e.g. 1M");
		return -EINVAL;
	}
	c->chunk_content_max = x;
	return 0;
}

static int set_prefix_caching(struct config *c, struct tenant_config *t,
			      const char *v, char *err, size_t len)
{
	bool on;

	if (parse_bool(v, &on, err, len))
		return -EINVAL;
	(t ? &t->seq : &c->seq)->no_caching = !on;
	if (t)
		t->has_prefix_caching = true;
	return 0;
}

static int set_max_seq_tokens(struct config *c, struct tenant_config *t,
			      const char *v, char *err, size_t len)
{
	int ret = parse_uint(v, 0, 1ull << 40, &(t ? &t->seq : &c->seq)->max_seq_tokens,
			     err, len);

	if (!ret && t)
		t->has_max_seq_tokens = true;
	return ret;
}

static int set_max_seqs(struct config *c, struct tenant_config *t,
			const char *v, char *err, size_t len)
{
	int ret = parse_uint(v, 0, UINT32_MAX, &(t ? &t->seq : &c->seq)->max_seqs,
			     err, len);

	if (!ret && t)
		t->has_max_seqs = true;
	return ret;
}

/* Any bytes but NUL (the file's line ends it, a --tenant flag's ':'). Never
 * echoed back in messages: it is a secret. */
static int set_hash_salt(struct config *c, struct tenant_config *t,
			 const char *v, char *err, size_t len)
{
	size_t n = strlen(v);

	if (n > HASH_SALT_MAX) {
		snprintf(err, len, "the salt is %zu bytes; at most %d", n, HASH_SALT_MAX);
		return -EINVAL;
	}
	memcpy(t->hash_salt, v, n + 1);
	return 0;
}

static int set_allow_uids(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	return parse_ids(v, false, &c->allow_uids, err, len);
}

static int set_allow_gids(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	return parse_ids(v, true, &c->allow_gids, err, len);
}

static int set_admin_uids(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	return parse_ids(v, false, &c->admin_uids, err, len);
}

static int set_uids(struct config *c, struct tenant_config *t, const char *v,
		    char *err, size_t len)
{
	return parse_ids(v, false, &t->uids, err, len);
}

static int set_gids(struct config *c, struct tenant_config *t, const char *v,
		    char *err, size_t len)
{
	return parse_ids(v, true, &t->gids, err, len);
}

static int set_u32(uint32_t *dst, const char *v, uint64_t min, uint64_t max,
		   char *err, size_t len)
{
	uint64_t x;
	int ret = parse_uint(v, min, max, &x, err, len);

	if (!ret)
		*dst = (uint32_t)x;
	return ret;
}

static int set_spin_us(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	return set_u32(&c->spin_us, v, 0, 1000000, err, len);
}

static int set_workers(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	return set_u32(&c->workers, v, 1, WORKERS_MAX, err, len);
}

static int set_tp(struct config *c, struct tenant_config *t, const char *v,
		  char *err, size_t len)
{
	return set_u32(&c->tp, v, 1, TP_MAX, err, len);
}

static int set_shards(struct config *c, struct tenant_config *t, const char *v,
		      char *err, size_t len)
{
	return set_u32(&c->shards, v, 0, SHARDS_MAX, err, len);
}

static int set_reclaim(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	bool on;

	if (!strcmp(v, "auto")) {
		c->reclaim = RECLAIM_AUTO;
		return 0;
	}
	if (parse_bool(v, &on, err, len)) {
		snprintf(err, len, "use auto, yes or no");
		return -EINVAL;
	}
	c->reclaim = on ? RECLAIM_ON : RECLAIM_OFF;
	return 0;
}

static int set_reclaim_boost(struct config *c, struct tenant_config *t,
			     const char *v, char *err, size_t len)
{
	bool on;
	int ret = parse_bool(v, &on, err, len);

	(void)t;
	if (!ret)
		c->reclaim_boost = on;
	return ret;
}

static int set_max_pending(struct config *c, struct tenant_config *t,
			   const char *v, char *err, size_t len)
{
	return set_u32(&c->max_pending, v, 1, 1000000, err, len);
}

static int set_max_pending_per_uid(struct config *c, struct tenant_config *t,
				   const char *v, char *err, size_t len)
{
	return set_u32(&c->max_pending_per_uid, v, 1, 1000000, err, len);
}

static int set_hello_timeout_ms(struct config *c, struct tenant_config *t,
				const char *v, char *err, size_t len)
{
	return set_u32(&c->hello_timeout_ms, v, 10, 3600000, err, len);
}

static int set_max_clients_per_uid(struct config *c, struct tenant_config *t,
				   const char *v, char *err, size_t len)
{
	return set_u32(&c->max_clients_per_uid, v, 0, 1000000, err, len);
}

static int set_max_clients_per_tenant(struct config *c, struct tenant_config *t,
				      const char *v, char *err, size_t len)
{
	return set_u32(&c->max_clients_per_tenant, v, 0, 1000000, err, len);
}

static int set_sq_entries(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	uint64_t x;

	if (parse_u64(v, &x) || x < KVP_RING_MIN_ENTRIES ||
	    x > KVP_RING_MAX_ENTRIES || (x & (x - 1))) {
		snprintf(err, len, "use a power of two from %u to %u",
			 KVP_RING_MIN_ENTRIES, KVP_RING_MAX_ENTRIES);
		return -EINVAL;
	}
	c->sq_entries = (uint32_t)x;
	return 0;
}

static int set_arena_bytes(struct config *c, struct tenant_config *t,
			   const char *v, char *err, size_t len)
{
	uint64_t x;

	if (parse_size(v, &x, err, len) || x < KVP_ARENA_MIN_BYTES ||
	    x > KVP_ARENA_MAX_BYTES) {
		snprintf(err, len, "use a size from 64K to 256M");
		return -EINVAL;
	}
	c->arena_bytes = (uint32_t)x;
	return 0;
}

static int set_foreground(struct config *c, struct tenant_config *t,
			  const char *v, char *err, size_t len)
{
	return parse_bool(v, &c->foreground, err, len);
}

static int set_pidfile(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	return set_str(&c->pidfile, v);
}

static int set_log(struct config *c, struct tenant_config *t, const char *v,
		   char *err, size_t len)
{
	if (!*v) {
		snprintf(err, len, "use stderr, syslog or the path of a file");
		return -EINVAL;
	}
	return set_str(&c->log, v);
}

/* ---- the disk tier (daemon/disk/) */
static int set_disk_dir(struct config *c, struct tenant_config *t,
			const char *v, char *err, size_t len)
{
	if (!*v) {
		snprintf(err, len, "give a directory kvpoold may write");
		return -EINVAL;
	}
	return set_str(&c->disk_dir, v);
}

static int set_disk_size(struct config *c, struct tenant_config *t,
			 const char *v, char *err, size_t len)
{
	int ret = parse_size(v, t ? &t->disk_size : &c->disk_size, err, len);

	if (!ret && t)
		t->has_disk_size = true;
	return ret;
}

static int set_disk_compress(struct config *c, struct tenant_config *t,
			     const char *v, char *err, size_t len)
{
	struct disk_codec dc;
	int ret = disk_codec_parse(v, &dc, err, len);

	return ret ? ret : set_str(&c->disk_compress, v);
}

/* ---- the remote tier (daemon/remote/) */
static int set_remote(struct config *c, struct tenant_config *t, const char *v,
		      char *err, size_t len)
{
	struct errbuf e;
	int ret = redis_cluster_check_url(v, &e);

	if (ret) {
		snprintf(err, len, "%s", e.msg);
		return ret;
	}
	return set_str(&c->remote, v);
}

static int set_remote_timeout_ms(struct config *c, struct tenant_config *t,
				 const char *v, char *err, size_t len)
{
	return set_u32(&c->remote_timeout_ms, v, 1, 60000, err, len);
}

static int set_remote_user_histories(struct config *c, struct tenant_config *t,
				     const char *v, char *err, size_t len)
{
	return parse_bool(v, &c->remote_user_histories, err, len);
}

static int set_remote_queue(struct config *c, struct tenant_config *t,
			    const char *v, char *err, size_t len)
{
	return parse_size(v, &c->remote_queue, err, len);
}

static int set_remote_compress(struct config *c, struct tenant_config *t,
			       const char *v, char *err, size_t len)
{
	struct disk_codec dc;
	int ret = disk_codec_parse(v, &dc, err, len);

	return ret ? ret : set_str(&c->remote_compress, v);
}

static int set_remote_chunk_types(struct config *c, struct tenant_config *t,
				  const char *v, char *err, size_t len)
{
	uint32_t mask = 0;
	char *dup = strdup(v), *save = NULL;

	if (!dup) {
		snprintf(err, len, "out of memory");
		return -1;
	}
	for (char *w = strtok_r(dup, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		int type = kvp_chunk_type_parse(w);

		if (!strcmp(w, "all")) {
			mask |= 1u << KVP_CHUNK_SYSTEM | 1u << KVP_CHUNK_CONTEXT |
				1u << KVP_CHUNK_QUERY;
		} else if (!strcmp(w, "none")) {
			mask |= 0;
		} else if (type < 0) {
			snprintf(err, len, "unknown chunk type '%s' (system, context, "
				 "query, all or none, comma separated)", w);
			free(dup);
			return -1;
		} else {
			mask |= 1u << type;
		}
	}
	free(dup);
	c->remote_chunk_types = mask;
	return 0;
}

static int set_log_level(struct config *c, struct tenant_config *t,
			 const char *v, char *err, size_t len)
{
	static const struct { const char *name; uint32_t prio; } levels[] = {
		{ "error", LOG_ERR }, { "warning", LOG_WARNING },
		{ "info", LOG_INFO }, { "debug", LOG_DEBUG },
	};

	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
		if (!strcmp(v, levels[i].name)) {
			c->log_level = levels[i].prio;
			return 0;
		}
	snprintf(err, len, "use error, warning, info or debug");
	return -EINVAL;
}

static int set_metrics(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	int ret = parse_listen_addr(v, &c->metrics_addr, err, len);

	return ret ? ret : set_str(&c->metrics, v);
}

const struct setting settings[] = {
	{ "socket", G, set_socket, "PATH",
	  "Unix socket to listen on (default $KVPOOL_SOCKET, else " KVP_DEFAULT_SOCKET ")" },
	{ "socket_mode", G, set_socket_mode, "MODE", "permissions of the socket (default 0660)" },
	{ "socket_group", G, set_socket_group, "GROUP", "group of the socket (default: the daemon's)" },
	{ "backend", G, set_backend, "NAME", BACKEND_HELP },
	{ "devices", G, set_devices, "LIST",
	  "GPU ordinals, one pool per device, e.g. 0,1, or all (default 0)" },
	{ "tp", G, set_tp, "N",
	  "tensor parallelism: each pool spans N devices of `devices`, one rank each, "
	  "holding kv_heads / N of every page (1 to 8, default 1)" },
	{ "device_mem", G | T, set_device_mem, "SIZE", "device tier size, e.g. 256M (default 256M)" },
	{ "host_mem", G | T, set_host_mem, "SIZE", "host tier size for offload, may be 0 (default 1G)" },
	{ "layout", G, set_layout, "SPEC", "model geometry (default " DEFAULT_LAYOUT ")" },
	{ "max_tokens_per_user", G | T, set_max_tokens, "N",
	  "cap of a user's history, head pages trimmed past it (default 0 = unlimited)" },
	{ "allow_uids", G, set_allow_uids, "LIST", "uids allowed to attach (default: see kvpoold(8))" },
	{ "allow_gids", G, set_allow_gids, "LIST", "gids allowed to attach" },
	{ "admin_uids", G, set_admin_uids, "LIST", "uids with admin rights (default 0 and kvpoold's uid)" },
	{ "uids", T, set_uids, "LIST", "the tenant's uids" },
	{ "gids", T, set_gids, "LIST", "the tenant's gids" },
	{ "max_chunks", G | T, set_max_chunks, "N",
	  "chunk names a tenant may keep, LRU ones evicted past it (default 0 = unlimited)" },
	{ "chunk_memory_ratio", G | T, set_chunk_memory_ratio, "R",
	  "most of the device tier chunks may take, in (0, 1] (default 1)" },
	{ "chunk_content_max", G, set_chunk_content_max, "SIZE",
	  "content bytes a chunk may keep (default 1M)" },
	{ "prefix_caching", G | T | B, set_prefix_caching, "BOOL",
	  "sequences find and publish pages in the prefix cache (default yes)" },
	{ "max_seq_tokens", G | T, set_max_seq_tokens, "N",
	  "tokens one sequence may hold (default 0 = unlimited)" },
	{ "max_seqs", G | T, set_max_seqs, "N",
	  "sequences a tenant may have at once in each pool (default 0 = unlimited)" },
	{ "hash_salt", T | S, set_hash_salt, "SECRET",
	  "salt of the tenant's prefix and chunk hashes (default empty)" },
	{ "spin_us", G, set_spin_us, "US", "how long an idle worker polls before it sleeps (default 50)" },
	{ "workers", G, set_workers, "N", "threads polling client rings (default 1)" },
	{ "shards", G, set_shards, "N",
	  "engine shards per tenant and pool, each owning a share of the users "
	  "(default 0: one per worker)" },
	{ "reclaim", G | B, set_reclaim, "auto|yes|no",
	  "demote and drop in the background to keep frames free (default auto: "
	  "tiers of 1024 pages or more)" },
	{ "reclaim_boost", G | B, set_reclaim_boost, "BOOL",
	  "raise the device watermarks after a prepare waited for the reclaimer "
	  "(default no)" },
	{ "sq_entries", G, set_sq_entries, "N", "default submission ring entries (default 256)" },
	{ "arena_bytes", G, set_arena_bytes, "SIZE", "default result arena per client (default 4M)" },
	{ "max_pending", G, set_max_pending, "N",
	  "connections waiting for their hello, in all (default 256)" },
	{ "max_pending_per_uid", G, set_max_pending_per_uid, "N",
	  "connections waiting for their hello, from one uid (default 64)" },
	{ "hello_timeout_ms", G, set_hello_timeout_ms, "MS",
	  "close a connection that sent no hello after this long (default 5000)" },
	{ "max_clients_per_uid", G, set_max_clients_per_uid, "N",
	  "attached clients of one uid, at most (default 0: a quarter of the clients "
	  "the descriptor limit allows; SIGHUP re-reads it)" },
	{ "max_clients_per_tenant", G, set_max_clients_per_tenant, "N",
	  "attached clients of one tenant, at most (default 0: half of the clients "
	  "the descriptor limit allows; SIGHUP re-reads it)" },
	{ "foreground", G | B, set_foreground, "BOOL", "stay in the foreground (default no: daemonize)" },
	{ "pidfile", G, set_pidfile, "PATH", "write the daemon's pid here (default none)" },
	{ "disk_dir", G, set_disk_dir, "PATH",
	  "directory of the disk tier's file kvpool.disk (default none: no disk tier)" },
	{ "disk_size", G | T, set_disk_size, "SIZE",
	  "disk tier size; per tenant, its quota of it (default 0)" },
	{ "disk_compress", G, set_disk_compress, "none|zstd[:LEVEL]",
	  "how pages are stored on disk (default none)" },
	{ "remote", G, set_remote, "URL",
	  "the remote tier: redis-cluster://HOST:PORT[,HOST:PORT...] (default none)" },
	{ "remote_timeout_ms", G, set_remote_timeout_ms, "MS",
	  "the deadline of a batch of requests to the remote tier, start to last reply "
	  "(default 500)" },
	{ "remote_user_histories", G | B, set_remote_user_histories, "BOOL",
	  "user histories go to the remote tier too: written when eviction drops them, "
	  "asked for by a prepare of a user with none in memory or on disk (one store "
	  "round per new user; default no: prefix pages only)" },
	{ "remote_queue", G, set_remote_queue, "SIZE",
	  "evicted pages waiting to be written to the remote tier, at most (default 64M; "
	  "past it they are dropped)" },
	{ "remote_compress", G, set_remote_compress, "none|zstd[:LEVEL]",
	  "how pages are stored in the remote tier (default none)" },
	{ "remote_chunk_types", G, set_remote_chunk_types, "TYPE[,TYPE...]",
	  "the chunk types kept in the remote tier: system, context, query, all or none "
	  "(default system,context)" },
	{ "log", G, set_log, "TARGET",
	  "stderr, syslog or a file (default stderr in foreground, else syslog)" },
	{ "log_level", G, set_log_level, "LEVEL",
	  "least severe lines logged: error, warning, info or debug (default info; "
	  "SIGHUP re-reads it)" },
	{ "metrics", G, set_metrics, "ADDR:PORT",
	  "serve Prometheus metrics at http://ADDR:PORT/metrics (default none)" },
};
const size_t nsettings = sizeof(settings) / sizeof(settings[0]);

const struct setting *setting_find(const char *key)
{
	for (size_t i = 0; i < nsettings; i++)
		if (strcmp(settings[i].key, key) == 0)
			return &settings[i];
	return NULL;
}
