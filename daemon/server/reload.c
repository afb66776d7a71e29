/* SPDX-License-Identifier: MIT */
/*
 * reload.c - re-read the settings on SIGHUP (reload.h).
 *
 * The new settings are read exactly as at start-up (config_load on the same
 * command line: defaults, --config, flags) into a second struct config;
 * nothing changes unless that succeeds. Then each key is either applied to
 * the running config (main owns it; the lists swapped here are read only by
 * this thread) or, if its value differs, refused with a line naming it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "kvpool_engine.h"
#include "log.h"
#include "reload.h"
#include "server.h"

static int saved_argc;
static char **saved_argv;

/*
 * The outcome of the last reload, for kvctl reload (reload_request): a
 * worker asks with SIGHUP like an operator and waits for the count of
 * finished reloads to pass the one it saw. Written by the main thread
 * under the lock; the message is what the log said, since the log may be
 * a file the operator is not reading or standard error may be /dev/null.
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t done;
	uint64_t gen;            /* reloads finished */
	int result;              /* reload_run()'s */
	char msg[768];
	size_t len;
} last = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, "", 0 };

void reload_init(int argc, char **argv)
{
	saved_argc = argc;
	saved_argv = argv;
}

static bool str_differs(const char *a, const char *b)
{
	return (a == NULL) != (b == NULL) || (a && strcmp(a, b));
}

static bool ids_differ(const struct id_list *a, const struct id_list *b)
{
	return a->n != b->n || (a->n && memcmp(a->v, b->v, a->n * sizeof(*a->v)));
}

static int refuse(const char *key, const char *tenant)
{
	/* Named in the answer too: "device_mem, [tenant a] host_mem". */
	if (last.len < sizeof(last.msg))
		last.len += (size_t)snprintf(last.msg + last.len,
					     sizeof(last.msg) - last.len, "%s%s%s%s%s",
					     last.len ? ", " : "", tenant ? "[tenant " : "",
					     tenant ? tenant : "", tenant ? "] " : "", key);
	log_warn("reload: refused key %s%s%s%s: it changed, but it sizes memory or "
		 "was used to start and cannot change while running; restart "
		 "kvpoold to apply it", tenant ? "[tenant " : "", tenant ? tenant : "",
		 tenant ? "] " : "", key);
	return 1;
}

/* Global keys that cannot change at run time; how many differ. */
static int refused_globals(const struct config *o, const struct config *n)
{
	int r = 0;

#define CHK(cond, key) do { if (cond) r += refuse(key, NULL); } while (0)
	CHK(str_differs(o->socket, n->socket), "socket");
	CHK(o->socket_mode != n->socket_mode, "socket_mode");
	CHK(o->socket_gid != n->socket_gid, "socket_group");
	CHK(str_differs(o->backend, n->backend), "backend");
	/* `all` was resolved in o (devices.c), not yet in n. */
	CHK(o->devices_all != n->devices_all ||
	    (!o->devices_all && (o->ndevices != n->ndevices ||
	     memcmp(o->devices, n->devices, o->ndevices * sizeof(int)))), "devices");
	CHK(o->tp != n->tp, "tp");
	CHK(o->device_mem != n->device_mem, "device_mem");
	CHK(o->host_mem != n->host_mem, "host_mem");
	CHK(str_differs(o->layout_spec, n->layout_spec), "layout");
	CHK(o->chunk_content_max != n->chunk_content_max, "chunk_content_max");
	CHK(o->spin_us != n->spin_us, "spin_us");
	CHK(o->workers != n->workers, "workers");
	CHK(o->shards != n->shards, "shards");
	CHK(o->reclaim != n->reclaim, "reclaim");
	CHK(o->reclaim_boost != n->reclaim_boost, "reclaim_boost");
	CHK(o->sq_entries != n->sq_entries, "sq_entries");
	CHK(o->arena_bytes != n->arena_bytes, "arena_bytes");
	CHK(o->max_pending != n->max_pending, "max_pending");
	CHK(o->max_pending_per_uid != n->max_pending_per_uid, "max_pending_per_uid");
	CHK(o->hello_timeout_ms != n->hello_timeout_ms, "hello_timeout_ms");
	CHK(str_differs(o->pidfile, n->pidfile), "pidfile");
	CHK(str_differs(o->log, n->log), "log");
	CHK(str_differs(o->metrics, n->metrics), "metrics");
	CHK(o->ntenants != n->ntenants, "[tenant] sections (added or removed)");
#undef CHK
	return r;
}

/* A tenant's quotas into every engine of its pools. */
static void tenant_quotas(struct server *s, struct tenant *t, uint64_t max_tokens,
			  uint64_t max_chunks, double ratio)
{
	for (uint32_t p = 0; p < s->tenants.npools; p++) {
		struct shard_set *set = t->pools[p].set;

		for (uint32_t i = 0; i < set->n; i++) {
			struct engine *eng = shard_lock(set, i);

			engine_set_max_tokens(eng, max_tokens);
			share_chunk_configure(eng, max_chunks, ratio,
					      s->cfg->chunk_content_max);
			shard_unlock(set, i);
		}
	}
}

/* A tenant's sequence settings (prefix_caching, max_seq_tokens, max_seqs)
 * into every engine of its pools when they changed; the log says so. */
static void tenant_seq_settings(struct server *s, struct tenant *t,
				struct seq_settings *o, const struct seq_settings *n)
{
	if (o->no_caching == n->no_caching && o->max_seq_tokens == n->max_seq_tokens &&
	    o->max_seqs == n->max_seqs)
		return;
	for (uint32_t p = 0; p < s->tenants.npools; p++) {
		struct shard_set *set = t->pools[p].set;

		for (uint32_t i = 0; i < set->n; i++) {
			struct engine *eng = shard_lock(set, i);

			share_seq_configure(eng, !n->no_caching, n->max_seq_tokens,
					    n->max_seqs);
			shard_unlock(set, i);
		}
	}
	log_info("reload: tenant %s: prefix_caching %s, max_seq_tokens %" PRIu64
		 ", max_seqs %" PRIu64, t->name, n->no_caching ? "no" : "yes",
		 n->max_seq_tokens, n->max_seqs);
	*o = *n;
}

static void id_swap(struct id_list *a, struct id_list *b, const char *key,
		    const char *tenant)
{
	struct id_list t;
	char was[128], now[128];

	if (!ids_differ(a, b))
		return;
	id_list_format(a, was, sizeof(was));
	id_list_format(b, now, sizeof(now));
	log_info("reload: %s%s%s%s: %s -> %s (new connections)", tenant ? "[tenant " : "",
		 tenant ? tenant : "", tenant ? "] " : "", key, was, now);
	t = *a;
	*a = *b;
	*b = t;
}

/* Per tenant: identities swapped, quotas applied, salt and sizes refused. */
static int apply_tenants(struct server *s, struct config *o, struct config *n)
{
	int r = 0;

	if (!o->ntenants) {
		/* The implicit tenant: the global quotas are its. */
		if (o->max_tokens_per_user != n->max_tokens_per_user ||
		    o->max_chunks != n->max_chunks ||
		    o->chunk_memory_ratio != n->chunk_memory_ratio) {
			tenant_quotas(s, &s->tenants.v[0], n->max_tokens_per_user,
				      n->max_chunks, n->chunk_memory_ratio);
			log_info("reload: tenant default: max_tokens_per_user %" PRIu64
				 ", max_chunks %" PRIu64 ", chunk_memory_ratio %g",
				 n->max_tokens_per_user, n->max_chunks,
				 n->chunk_memory_ratio);
		}
		o->max_tokens_per_user = n->max_tokens_per_user;
		o->max_chunks = n->max_chunks;
		o->chunk_memory_ratio = n->chunk_memory_ratio;
		tenant_seq_settings(s, &s->tenants.v[0], &o->seq, &n->seq);
		return 0;
	}
	for (uint32_t i = 0; i < o->ntenants; i++) {
		struct tenant_config *ot = &o->tenants[i], *nt = &n->tenants[i];

		if (strcmp(ot->name, nt->name)) {
			r += refuse("[tenant] sections (renamed or reordered)", NULL);
			break;
		}
		if (ot->device_mem != nt->device_mem)
			r += refuse("device_mem", ot->name);
		if (ot->host_mem != nt->host_mem)
			r += refuse("host_mem", ot->name);
		if (strcmp(ot->hash_salt, nt->hash_salt))
			r += refuse("hash_salt", ot->name);
		id_swap(&ot->uids, &nt->uids, "uids", ot->name);
		id_swap(&ot->gids, &nt->gids, "gids", ot->name);
		if (ot->max_tokens != nt->max_tokens || ot->max_chunks != nt->max_chunks ||
		    ot->chunk_memory_ratio != nt->chunk_memory_ratio) {
			tenant_quotas(s, &s->tenants.v[i], nt->max_tokens, nt->max_chunks,
				      nt->chunk_memory_ratio);
			log_info("reload: tenant %s: max_tokens_per_user %" PRIu64
				 ", max_chunks %" PRIu64 ", chunk_memory_ratio %g",
				 ot->name, nt->max_tokens, nt->max_chunks,
				 nt->chunk_memory_ratio);
			ot->max_tokens = nt->max_tokens;
			ot->max_chunks = nt->max_chunks;
			ot->chunk_memory_ratio = nt->chunk_memory_ratio;
		}
		tenant_seq_settings(s, &s->tenants.v[i], &ot->seq, &nt->seq);
	}
	return r;
}

static int reload_apply(struct server *s)
{
	/* main() owns the config and only this thread changes it; workers
	 * read none of what is written here. */
	struct config *o = (struct config *)s->cfg, n;
	int r;

	log_reopen();
	if (config_load(&n, saved_argc, saved_argv)) {
		config_free(&n);
		snprintf(last.msg, sizeof(last.msg), "the settings could not be "
			 "read: %s; the running ones stay", config_last_error());
		log_err("reload: %s", last.msg);
		return -1;
	}
	r = refused_globals(o, &n);
	if (o->ntenants == n.ntenants)
		r += apply_tenants(s, o, &n);
	id_swap(&o->allow_uids, &n.allow_uids, "allow_uids", NULL);
	id_swap(&o->allow_gids, &n.allow_gids, "allow_gids", NULL);
	id_swap(&o->admin_uids, &n.admin_uids, "admin_uids", NULL);
	if (o->max_clients_per_uid != n.max_clients_per_uid ||
	    o->max_clients_per_tenant != n.max_clients_per_tenant) {
		o->max_clients_per_uid = n.max_clients_per_uid;
		o->max_clients_per_tenant = n.max_clients_per_tenant;
		tenant_client_caps_log(o, "reload: ");
	}
	if (o->log_level != n.log_level) {
		o->log_level = n.log_level;
		log_set_level(n.log_level);
		log_info("reload: log_level %s", log_level_name(n.log_level));
	}
	config_free(&n);
	log_info("reload: done, %d key%s refused", r, r == 1 ? "" : "s");
	return r;
}

int reload_run(struct server *s)
{
	int r;

	pthread_mutex_lock(&last.lock);
	last.msg[0] = '\0';
	last.len = 0;
	r = reload_apply(s);
	last.result = r;
	last.gen++;
	pthread_cond_broadcast(&last.done);
	pthread_mutex_unlock(&last.lock);
	return r;
}

int reload_request(int timeout_ms, char *msg, size_t len)
{
	struct timespec dl;
	uint64_t seen;
	int ret = 0;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&last.lock);
	seen = last.gen;
	if (kill(getpid(), SIGHUP) < 0) {
		ret = -errno;
		snprintf(msg, len, "cannot signal kvpoold: %s", strerror(errno));
		goto out;
	}
	while (last.gen == seen && !ret)
		ret = -pthread_cond_timedwait(&last.done, &last.lock, &dl);
	if (ret) {
		snprintf(msg, len, "kvpoold did not finish the reload within %d ms; "
			 "its log says how it went", timeout_ms);
		ret = -ETIMEDOUT;
	} else if (last.result < 0) {
		snprintf(msg, len, "%s", last.msg);
		ret = -EINVAL;
	} else if (last.result > 0) {
		snprintf(msg, len, "applied the rest, but refused %s: %s sized memory "
			 "or started kvpoold and cannot change while it runs; restart "
			 "kvpoold to apply %s", last.msg, last.result == 1 ? "it" : "they",
			 last.result == 1 ? "it" : "them");
		ret = -EBUSY;
	} else {
		snprintf(msg, len, "done: every setting applied");
	}
out:
	pthread_mutex_unlock(&last.lock);
	return ret;
}
