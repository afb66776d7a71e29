/* SPDX-License-Identifier: MIT */
/*
 * config.c - the settings table, kvpool.conf, the flags and the final checks.
 *
 * One table lists every setting once: its key (the same in the file and as
 * --key=value), whether it is valid globally, in a [tenant NAME] section or
 * both, its setter and its --help line. The file and the flags both go
 * through the table, so they cannot drift apart. Checks that need more than
 * one value (device_mem against the layout's page size, a uid in two
 * tenants) run once everything is read, in config_check().
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
#include <unistd.h>

#include "config.h"
#include "disk_codec.h"
#include "shard.h" /* SHARDS_MAX */
#include "proto.h"

#ifndef KVPOOL_HAVE_CUDA
#define KVPOOL_HAVE_CUDA 0
#endif

#define DEFAULT_LAYOUT "layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define DEFAULT_DEVICE_MEM (256ull << 20)
#define DEFAULT_HOST_MEM (1ull << 30)
#define WORKERS_MAX 64

#define G (1u << 0) /* valid as a global setting */
#define T (1u << 1) /* valid in a [tenant NAME] section */
#define B (1u << 2) /* boolean: a bare --key means yes */
#define S (1u << 3) /* a secret: never repeated in a message */

typedef int (*setter)(struct config *c, struct tenant_config *t,
		      const char *v, char *err, size_t len);

struct setting {
	const char *key;
	unsigned scope;
	setter set;
	const char *arg;
	const char *help;
};

static int set_str(char **dst, const char *v)
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

/* "0" or "0,1,3": GPU ordinals, each once; one pool per entry. */
static int set_devices(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	int dev[DEVICES_MAX];
	uint32_t n = 0;
	char *copy = strdup(v), *save = NULL, *tok;
	int ret = 0;

	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok && !ret;
	     tok = strtok_r(NULL, ",", &save)) {
		uint64_t x;

		tok = str_trim(tok);
		if (parse_u64(tok, &x) || x > 1023) {
			snprintf(err, len, "'%s' is not a GPU ordinal; use a comma-"
				 "separated list of device numbers such as 0 or 0,1",
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

static int set_metrics(struct config *c, struct tenant_config *t, const char *v,
		       char *err, size_t len)
{
	int ret = parse_listen_addr(v, &c->metrics_addr, err, len);

	return ret ? ret : set_str(&c->metrics, v);
}

static const struct setting settings[] = {
	{ "socket", G, set_socket, "PATH",
	  "Unix socket to listen on (default $KVPOOL_SOCKET, else " KVP_DEFAULT_SOCKET ")" },
	{ "socket_mode", G, set_socket_mode, "MODE", "permissions of the socket (default 0660)" },
	{ "socket_group", G, set_socket_group, "GROUP", "group of the socket (default: the daemon's)" },
	{ "backend", G, set_backend, "NAME", BACKEND_HELP },
	{ "devices", G, set_devices, "LIST",
	  "GPU ordinals, one pool per device, e.g. 0,1 (default 0)" },
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
	{ "sq_entries", G, set_sq_entries, "N", "default submission ring entries (default 256)" },
	{ "arena_bytes", G, set_arena_bytes, "SIZE", "default result arena per client (default 4M)" },
	{ "max_pending", G, set_max_pending, "N",
	  "connections waiting for their hello, in all (default 256)" },
	{ "max_pending_per_uid", G, set_max_pending_per_uid, "N",
	  "connections waiting for their hello, from one uid (default 64)" },
	{ "hello_timeout_ms", G, set_hello_timeout_ms, "MS",
	  "close a connection that sent no hello after this long (default 5000)" },
	{ "foreground", G | B, set_foreground, "BOOL", "stay in the foreground (default no: daemonize)" },
	{ "pidfile", G, set_pidfile, "PATH", "write the daemon's pid here (default none)" },
	{ "disk_dir", G, set_disk_dir, "PATH",
	  "directory of the disk tier's file kvpool.disk (default none: no disk tier)" },
	{ "disk_size", G | T, set_disk_size, "SIZE",
	  "disk tier size; per tenant, its quota of it (default 0)" },
	{ "disk_compress", G, set_disk_compress, "none|zstd[:LEVEL]",
	  "how pages are stored on disk (default none)" },
	{ "log", G, set_log, "TARGET",
	  "stderr, syslog or a file (default stderr in foreground, else syslog)" },
	{ "metrics", G, set_metrics, "ADDR:PORT",
	  "serve Prometheus metrics at http://ADDR:PORT/metrics (default none)" },
};
#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))

static const struct setting *setting_find(const char *key)
{
	for (size_t i = 0; i < NSETTINGS; i++)
		if (strcmp(settings[i].key, key) == 0)
			return &settings[i];
	return NULL;
}

/* ------------------------------------------------------------ messages */

__attribute__((format(printf, 2, 3)))
static int usage_err(const char *where, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvpoold: %s: ", where);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return EXIT_USAGE;
}

static void print_help(void)
{
	printf("Usage: kvpoold [--config=PATH] [--KEY=VALUE ...]\n"
	       "       kvpoold --help | --version\n\n"
	       "The kvpool daemon: serves a shared KV-cache page pool to local clients.\n\n"
	       "  -c, --config=PATH     read settings from PATH (kvpool.conf(5)); flags override it\n"
	       "  -f                    same as --foreground\n"
	       "  --tenant=NAME[:uids=L][:gids=L][:device_mem=S][:host_mem=S][:max_tokens_per_user=N]\n"
	       "              [:max_chunks=N][:chunk_memory_ratio=R][:hash_salt=SECRET]\n"
	       "                        define a tenant (replaces a file tenant of that name)\n"
	       "  -h, --help            this text\n"
	       "  -V, --version         the version\n\nSettings (--KEY=VALUE, or KEY = VALUE in the file):\n");
	for (size_t i = 0; i < NSETTINGS; i++) {
		char lhs[48];

		if (!(settings[i].scope & G))
			continue;
		snprintf(lhs, sizeof(lhs), "--%s=%s", settings[i].key, settings[i].arg);
		printf("  %-27s %s\n", lhs, settings[i].help);
	}
	printf("\nSIZE takes K, M, G or T (binary). LIST is comma-separated ids or names.\n"
	       "See kvpoold(8) and kvpool.conf(5).\n");
}

/* ------------------------------------------------------------ applying */

static int apply(struct config *c, struct tenant_config *t, const char *where,
		 const char *key, const char *val)
{
	const struct setting *s = setting_find(key);
	char err[384];
	int ret;

	if (!s)
		return usage_err(where, "unknown setting '%s' (see kvpoold --help "
				 "and kvpool.conf(5))", key);
	if (t && !(s->scope & T))
		return usage_err(where, "%s is a global setting; put it before the "
				 "first [tenant] section", key);
	if (!t && !(s->scope & G))
		return usage_err(where, "%s belongs in a [tenant NAME] section "
				 "(or --tenant=NAME:%s=...)", key, key);
	err[0] = '\0';
	ret = s->set(c, t, val, err, sizeof(err));
	if (ret == -ENOMEM)
		return usage_err(where, "out of memory");
	if (ret)
		return usage_err(where, "%s = '%s': %s", key,
				 (s->scope & S) ? "(secret)" : val, err);
	return 0;
}

static struct tenant_config *tenant_add(struct config *c, const char *name,
					const char *origin, bool replace)
{
	struct tenant_config *t = NULL, *v;

	for (uint32_t i = 0; i < c->ntenants; i++)
		if (strcmp(c->tenants[i].name, name) == 0)
			t = &c->tenants[i];
	if (t && !replace)
		return NULL; /* the caller reports the duplicate */
	if (!t) {
		v = realloc(c->tenants, (c->ntenants + 1) * sizeof(*v));
		if (!v)
			return NULL;
		c->tenants = v;
		t = &v[c->ntenants++];
	} else {
		id_list_free(&t->uids);
		id_list_free(&t->gids);
	}
	*t = (struct tenant_config){ 0 };
	snprintf(t->name, sizeof(t->name), "%s", name);
	snprintf(t->origin, sizeof(t->origin), "%s", origin);
	return t;
}

/* "[tenant NAME]" -> the new tenant; NULL after reporting why not. */
static struct tenant_config *file_section(struct config *c, char *line,
					  const char *where, int *ret)
{
	char name[TENANT_NAME_MAX + 1], err[160], *end = strchr(line, ']');
	struct tenant_config *t;

	*ret = EXIT_USAGE;
	if (!end || end[1] || strncmp(line, "[tenant", 7) ||
	    (line[7] != ' ' && line[7] != '\t')) {
		usage_err(where, "'%s': the only section is [tenant NAME]", line);
		return NULL;
	}
	*end = '\0';
	if (parse_tenant_name(str_trim(line + 8), name, err, sizeof(err))) {
		usage_err(where, "[tenant %s]: %s", str_trim(line + 8), err);
		return NULL;
	}
	t = tenant_add(c, name, where, false);
	if (!t)
		usage_err(where, "[tenant %s] is defined twice (or out of memory)", name);
	else
		*ret = 0;
	return t;
}

static int file_line(struct config *c, char *line, const char *where,
		     struct tenant_config **t)
{
	char *eq, *key, *val;
	int ret;
	size_t n;

	line = str_trim(line);
	if (!*line)
		return 0;
	if (*line == '[') {
		*t = file_section(c, line, where, &ret);
		return ret;
	}
	eq = strchr(line, '=');
	if (!eq)
		return usage_err(where, "'%s': expected 'key = value'", line);
	*eq = '\0';
	key = str_trim(line);
	val = str_trim(eq + 1);
	n = strlen(val);
	if (n >= 2 && val[0] == '"' && val[n - 1] == '"') {
		val[n - 1] = '\0';
		val++;
	}
	return apply(c, *t, where, key, val);
}

/*
 * getline() returns -1 at the end of the file and on a read error alike
 * (EISDIR for a directory, EIO): only feof() tells them apart. Taking an
 * error for the end would start kvpoold on what was read so far, or on
 * the built-in defaults (no tenants: anyone who reaches the socket). A
 * line that ends in an error is not applied either: it may be cut short.
 */
int config_read(struct config *c, FILE *f, const char *path)
{
	struct tenant_config *t = NULL;
	char *line = NULL, where[PATH_MAX + 32];
	size_t cap = 0;
	unsigned lineno = 0;
	int ret = 0;

	for (;;) {
		char *hash;

		errno = 0;
		if (getline(&line, &cap, f) < 0 || ferror(f))
			break;
		lineno++;
		hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		snprintf(where, sizeof(where), "%s:%u", path, lineno);
		ret = file_line(c, line, where, &t);
		if (ret)
			break;
	}
	if (!ret && (ferror(f) || !feof(f))) {
		int err = errno ? errno : EIO;

		snprintf(where, sizeof(where), "--config=%s", path);
		if (lineno)
			ret = usage_err(where, "read error after line %u: %s; kvpoold "
					"did not start (fix the file or give another)",
					lineno, strerror(err));
		else
			ret = usage_err(where, "cannot read: %s; kvpoold did not start "
					"(give the path of a kvpool.conf(5) file)",
					strerror(err));
	}
	free(line);
	return ret;
}

static int load_file(struct config *c, const char *path)
{
	char where[PATH_MAX + 32];
	FILE *f = fopen(path, "re");
	int ret;

	if (!f) {
		snprintf(where, sizeof(where), "--config=%s", path);
		return usage_err(where, "cannot open: %s; kvpoold did not start "
				 "(give the path of a kvpool.conf(5) file)",
				 strerror(errno));
	}
	ret = config_read(c, f, path);
	fclose(f);
	return ret;
}

/* --tenant=NAME:key=value:key=value */
static int flag_tenant(struct config *c, const char *arg)
{
	char *copy = strdup(arg), *save = NULL, *tok, err[160];
	char name[TENANT_NAME_MAX + 1], where[96];
	struct tenant_config *t;
	int ret = 0;

	if (!copy)
		return usage_err("--tenant", "out of memory");
	snprintf(where, sizeof(where), "--tenant=%.80s", arg);
	tok = strtok_r(copy, ":", &save);
	if (!tok || parse_tenant_name(tok, name, err, sizeof(err))) {
		ret = usage_err(where, "%s", tok ? err : "give NAME:uids=...");
		goto out;
	}
	t = tenant_add(c, name, "--tenant", true);
	if (!t) {
		ret = usage_err(where, "out of memory");
		goto out;
	}
	while (!ret && (tok = strtok_r(NULL, ":", &save))) {
		char *eq = strchr(tok, '=');

		if (!eq) {
			ret = usage_err(where, "'%s': expected key=value", tok);
			break;
		}
		*eq = '\0';
		ret = apply(c, t, where, tok, eq + 1);
	}
out:
	free(copy);
	return ret;
}

/* ------------------------------------------------------------ flags */

enum flag_kind { FLAG_SETTING, FLAG_HELP, FLAG_VERSION };

/*
 * Split argv[*i] into key and value ("--key=value", "--key value", a bare
 * boolean "--foreground", and the short -c -f -h -V); advances *i past a
 * value taken from the next argument. keybuf receives the key with '-'
 * turned into '_' so --device-mem works as well as --device_mem.
 */
static int flag_split(int argc, char **argv, int *i, char *keybuf, size_t klen,
		      const char **val, enum flag_kind *kind)
{
	const char *a = argv[*i], *eq;
	const struct setting *s;
	size_t n;

	*kind = FLAG_SETTING;
	if (!strcmp(a, "-h") || !strcmp(a, "--help"))
		return *kind = FLAG_HELP, 0;
	if (!strcmp(a, "-V") || !strcmp(a, "--version"))
		return *kind = FLAG_VERSION, 0;
	if (!strcmp(a, "-f")) {
		snprintf(keybuf, klen, "foreground");
		*val = "yes";
		return 0;
	}
	if (!strcmp(a, "-c"))
		a = "--config";
	if (strncmp(a, "--", 2) || !a[2])
		return usage_err(a, "unexpected argument; settings are --key=value "
				 "(see kvpoold --help)");
	a += 2;
	eq = strchr(a, '=');
	n = eq ? (size_t)(eq - a) : strlen(a);
	if (n >= klen)
		return usage_err(argv[*i], "unknown flag (see kvpoold --help)");
	for (size_t k = 0; k < n; k++)
		keybuf[k] = a[k] == '-' ? '_' : a[k];
	keybuf[n] = '\0';
	if (eq) {
		*val = eq + 1;
		return 0;
	}
	s = setting_find(keybuf);
	if (s && (s->scope & B)) {
		*val = "yes";
		return 0;
	}
	if (*i + 1 >= argc)
		return usage_err(argv[*i], "needs a value: --%s=VALUE", keybuf);
	*val = argv[++*i];
	return 0;
}

/*
 * Pass 0 only looks for --help, --version and --config; pass 1 applies
 * every setting, so the command line overrides the file read in between.
 */
static int parse_flags(struct config *c, int argc, char **argv, int pass)
{
	for (int i = 1; i < argc; i++) {
		char key[64], where[128];
		enum flag_kind kind;
		const char *val = NULL;
		int ret = flag_split(argc, argv, &i, key, sizeof(key), &val, &kind);

		if (ret)
			return ret;
		if (kind == FLAG_HELP || kind == FLAG_VERSION) {
			if (pass == 0 && kind == FLAG_HELP)
				print_help();
			else if (pass == 0)
				printf("kvpoold (kvpool) %d.%d, protocol %d\n",
				       KVP_VERSION_MAJOR, KVP_VERSION_MINOR,
				       KVP_PROTO_VERSION);
			return CONFIG_EXIT_OK;
		}
		if (!strcmp(key, "config")) {
			if (pass == 0 && set_str(&c->config_path, val))
				return usage_err("--config", "out of memory");
			continue;
		}
		if (pass == 0)
			continue;
		if (!strcmp(key, "tenant")) {
			ret = flag_tenant(c, val);
		} else {
			snprintf(where, sizeof(where), "--%s", key);
			ret = apply(c, NULL, where, key, val);
		}
		if (ret)
			return ret;
	}
	return 0;
}

/* ------------------------------------------------------------ checks */

void config_devices_format(const struct config *c, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < c->ndevices && off < len; i++) {
		int n = snprintf(buf + off, len - off, "%s%d", i ? "," : "",
				 c->devices[i]);

		if (n < 0)
			break;
		off += (size_t)n;
	}
}

uint32_t config_frames(const struct config *c, uint64_t bytes)
{
	return (uint32_t)(bytes / c->layout.page_bytes);
}

static int check_mem(const struct config *c, const char *who, const char *key,
		     uint64_t bytes, uint64_t min_frames, uint64_t max_frames)
{
	uint64_t pb = c->layout.page_bytes, frames = bytes / pb;

	if (frames < min_frames)
		return usage_err(who, "%s = %" PRIu64 " bytes holds no page of the "
				 "layout (%" PRIu64 " bytes per page); use at least "
				 "%" PRIu64 "K", key, bytes, pb, (pb + 1023) / 1024);
	if (frames > max_frames)
		return usage_err(who, "%s = %" PRIu64 " bytes is %" PRIu64 " pages; "
				 "at most %" PRIu64 " pages of %" PRIu64 " bytes fit "
				 "one tier", key, bytes, frames, max_frames, pb);
	return 0;
}

static int check_max_tokens(const struct config *c, const char *who, uint64_t v)
{
	if (v && v < c->layout.page_tokens)
		return usage_err(who, "max_tokens_per_user = %" PRIu64 " is less than "
				 "one page (%" PRIu32 " tokens); use 0 for unlimited "
				 "or at least %" PRIu32, v, c->layout.page_tokens,
				 c->layout.page_tokens);
	return 0;
}

/* A uid (or gid) maps to one tenant: two would make the mapping a guess. */
static int check_members(const struct config *c, uint32_t ti, bool groups)
{
	const struct tenant_config *t = &c->tenants[ti];
	const struct id_list *l = groups ? &t->gids : &t->uids;

	for (uint32_t k = 0; k < l->n; k++)
		for (uint32_t j = 0; j < ti; j++)
			if (id_list_has(groups ? &c->tenants[j].gids :
					&c->tenants[j].uids, l->v[k]))
				return usage_err(t->origin, "%s %" PRIu32 " is in "
						 "tenants %s and %s; it may "
						 "belong to one tenant only",
						 groups ? "gid" : "uid", l->v[k],
						 c->tenants[j].name, t->name);
	return 0;
}

static int check_tenant(struct config *c, uint32_t ti)
{
	struct tenant_config *t = &c->tenants[ti];
	char who[128];
	int ret;

	snprintf(who, sizeof(who), "%s: [tenant %s]", t->origin, t->name);
	if (!t->uids.n && !t->gids.n)
		return usage_err(who, "no uids= or gids=: no client could ever "
				 "belong to it");
	if (!t->has_device_mem)
		t->device_mem = c->device_mem;
	if (!t->has_host_mem)
		t->host_mem = c->host_mem;
	if (!t->has_max_tokens)
		t->max_tokens = c->max_tokens_per_user;
	if (!t->has_max_chunks)
		t->max_chunks = c->max_chunks;
	if (!t->has_chunk_memory_ratio)
		t->chunk_memory_ratio = c->chunk_memory_ratio;
	ret = check_mem(c, who, "device_mem", t->device_mem, 1, INT32_MAX);
	if (!ret)
		ret = check_mem(c, who, "host_mem", t->host_mem, 0, UINT32_MAX - 1);
	if (!ret)
		ret = check_max_tokens(c, who, t->max_tokens);
	if (!ret && t->has_disk_size && (!c->disk_dir || t->disk_size > c->disk_size))
		ret = usage_err(who, "disk_size = %" PRIu64 " is a quota of the disk "
				"tier, which is %" PRIu64 " bytes; set disk_dir and a "
				"disk_size at least as large", t->disk_size,
				c->disk_dir ? c->disk_size : 0);
	if (!ret)
		ret = check_members(c, ti, false);
	if (!ret)
		ret = check_members(c, ti, true);
	return ret;
}

/* Relative paths would break once a daemon chdir()s to /. */
static int make_absolute(char **path)
{
	char cwd[PATH_MAX], *abs;

	if (!*path || (*path)[0] == '/' || !strcmp(*path, "stderr") ||
	    !strcmp(*path, "syslog"))
		return 0;
	if (!getcwd(cwd, sizeof(cwd)) || asprintf(&abs, "%s/%s", cwd, *path) < 0)
		return usage_err(*path, "cannot make the path absolute");
	free(*path);
	*path = abs;
	return 0;
}

static int check_admins(struct config *c)
{
	uint32_t euid = (uint32_t)geteuid();

	if (c->admin_uids.set)
		return 0;
	c->admin_uids.v = calloc(2, sizeof(uint32_t));
	if (!c->admin_uids.v)
		return usage_err("admin_uids", "out of memory");
	c->admin_uids.v[c->admin_uids.n++] = 0;
	if (euid)
		c->admin_uids.v[c->admin_uids.n++] = euid;
	return 0;
}

/*
 * The disk tier: a directory kvpoold can write, a size, and a host tier
 * (pages come back from disk through it). Checked here so a bad one stops
 * kvpoold before it starts anything, with what to do.
 */
static int check_disk(struct config *c)
{
	if (!c->disk_dir) {
		if (c->disk_size)
			return usage_err("disk_size", "%" PRIu64 " bytes but no "
					 "disk_dir; set disk_dir to enable the "
					 "disk tier", c->disk_size);
		return 0;
	}
	if (make_absolute(&c->disk_dir))
		return EXIT_USAGE;
	if (access(c->disk_dir, F_OK))
		return usage_err("disk_dir", "%s: %s; create it (mkdir -p %s, owned "
				 "by kvpoold's user) or set disk_dir to an existing "
				 "directory", c->disk_dir, strerror(errno),
				 c->disk_dir);
	if (access(c->disk_dir, W_OK | X_OK))
		return usage_err("disk_dir", "%s is not writable by uid %u (%s); "
				 "chown it to kvpoold's user or choose another "
				 "disk_dir", c->disk_dir, (unsigned)geteuid(),
				 strerror(errno));
	if (c->disk_size < c->layout.page_bytes + 4096)
		return usage_err("disk_size", "%" PRIu64 " bytes holds no page of "
				 "the layout (%" PRIu64 " bytes and a 4K header); "
				 "set disk_size, e.g. 64G", c->disk_size,
				 c->layout.page_bytes);
	if (!c->host_mem)
		return usage_err("disk_dir", "the disk tier needs a host tier "
				 "(pages go to disk from it and come back through "
				 "it); set host_mem");
	return 0;
}

static int config_check(struct config *c)
{
	const size_t sun_max = sizeof(((struct sockaddr_un *)0)->sun_path);
	char err[KVP_ERRLEN];
	int ret;

	if (kvp_layout_parse(&c->layout, c->layout_spec, err, sizeof(err)))
		return usage_err("layout", "'%s': %s", c->layout_spec, err);
	ret = make_absolute(&c->socket);
	ret = ret ? ret : make_absolute(&c->pidfile);
	ret = ret ? ret : make_absolute(&c->log);
	if (ret)
		return ret;
	if (strlen(c->socket) >= sun_max)
		return usage_err("socket", "'%s' is %zu bytes; a Unix socket path "
				 "must be shorter than %zu", c->socket,
				 strlen(c->socket), sun_max);
	ret = check_mem(c, "device_mem", "device_mem", c->device_mem, 1, INT32_MAX);
	ret = ret ? ret : check_mem(c, "host_mem", "host_mem", c->host_mem, 0,
				    UINT32_MAX - 1);
	ret = ret ? ret : check_max_tokens(c, "max_tokens_per_user",
					   c->max_tokens_per_user);
	if (!ret && c->ntenants > TENANTS_MAX)
		ret = usage_err("tenant", "%u tenants; at most %d", c->ntenants,
				TENANTS_MAX);
	ret = ret ? ret : check_disk(c);
	for (uint32_t i = 0; !ret && i < c->ntenants; i++)
		ret = check_tenant(c, i);
	return ret ? ret : check_admins(c);
}

static int config_defaults(struct config *c)
{
	const char *env = getenv("KVPOOL_SOCKET");

	*c = (struct config){
		.socket_mode = 0660,
		.socket_gid = -1,
		.device_mem = DEFAULT_DEVICE_MEM,
		.host_mem = DEFAULT_HOST_MEM,
		.spin_us = 50,
		.workers = 1,
		.reclaim = RECLAIM_AUTO,
		.sq_entries = 256,
		.arena_bytes = 4u << 20,
		.max_pending = 256,
		.max_pending_per_uid = 64,
		.hello_timeout_ms = 5000,
		.chunk_memory_ratio = 1.0,
		.chunk_content_max = 1u << 20,
		.devices = { 0 },
		.ndevices = 1,
	};
	if (set_str(&c->socket, env && *env ? env : KVP_DEFAULT_SOCKET) ||
	    set_str(&c->backend, KVPOOL_HAVE_CUDA ? "auto" : "shm") ||
	    set_str(&c->layout_spec, DEFAULT_LAYOUT))
		return usage_err("kvpoold", "out of memory");
	return 0;
}

int config_load(struct config *c, int argc, char **argv)
{
	int ret = config_defaults(c);

	ret = ret ? ret : parse_flags(c, argc, argv, 0);
	if (!ret && c->config_path)
		ret = load_file(c, c->config_path);
	ret = ret ? ret : parse_flags(c, argc, argv, 1);
	return ret ? ret : config_check(c);
}

void config_free(struct config *c)
{
	for (uint32_t i = 0; i < c->ntenants; i++) {
		id_list_free(&c->tenants[i].uids);
		id_list_free(&c->tenants[i].gids);
	}
	free(c->tenants);
	id_list_free(&c->allow_uids);
	id_list_free(&c->allow_gids);
	id_list_free(&c->admin_uids);
	free(c->config_path);
	free(c->socket);
	free(c->backend);
	free(c->layout_spec);
	free(c->pidfile);
	free(c->log);
	free(c->disk_dir);
	free(c->disk_compress);
	free(c->metrics);
	*c = (struct config){ 0 };
}
