/* SPDX-License-Identifier: MIT */
/*
 * tenant.c - the pools, the tenants' engines and the admission decision.
 *
 * Isolation between tenants is physical: each engine allocates its own tiers
 * (memfds on shm, a cuMemCreate allocation and pinned host memory on cuda)
 * sized by the tenant's quota, and a client is only ever sent its own
 * tenant's device fd of its own pool, so no pointer arithmetic in a client
 * can reach another tenant's pages.
 *
 * Hashes are isolated too: every engine of a tenant gets the tenant's salt
 * (share_set_salt) right after it is made, so the same prompt hashes to
 * different prefix keys and chunk ids in different tenants, and a tenant
 * with a secret hash_salt cannot be probed by anyone who lacks it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#if KVPOOL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <openssl/evp.h>

#include "disk_record.h"
#include "disk_tier.h"
#include "log.h"
#include "kvpool_engine.h"
#include "remote_tier.h"
#include "tenant.h"

/* ------------------------------------------------------------ salt */

/*
 * salt = SHA-256("kvpool-salt-v1" || tenant name || NUL || hash_salt).
 * A pure function of the configuration, so a restarted daemon computes the
 * same prefix hashes and chunk ids; the NUL keeps ("ab", "c") and ("a",
 * "bc") apart; the version tag lets a later scheme change every hash at
 * once. Without tenants the default tenant's salt is this with "default"
 * and "": fixed, and the same on every machine.
 */
static int tenant_salt(const char *name, const char *hash_salt,
		       uint8_t out[SHARE_SALT_BYTES], struct errbuf *e)
{
	static const char tag[] = "kvpool-salt-v1";
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned int len = 0;
	int ok;

	ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
	     EVP_DigestUpdate(ctx, tag, sizeof(tag) - 1) &&
	     EVP_DigestUpdate(ctx, name, strlen(name) + 1) &&
	     EVP_DigestUpdate(ctx, hash_salt, strlen(hash_salt)) &&
	     EVP_DigestFinal_ex(ctx, out, &len) && len == SHARE_SALT_BYTES;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return errbuf_set(e, -ENOMEM, "tenant %s: computing the hash salt "
				  "(SHA-256, OpenSSL) failed", name);
	return 0;
}

/* ------------------------------------------------------------ pools */

/*
 * A tensor-parallel pool (tp > 1): its ranks' contexts behind one striped
 * context (backend_stripe.c), whose page is every rank's: rank r holds
 * kv_heads / tp heads of the layout's page.
 */
static int pools_stripe(struct tenants *ts, const struct config *cfg,
			struct errbuf *e)
{
	for (uint32_t i = 0; ts->tp > 1 && i < ts->npools; i++) {
		struct pool_dev *pd = &ts->pools[i];
		int ret = backend_stripe_open(ts->be, pd->rank_ctx, ts->tp,
					      cfg->layout.page_bytes / ts->tp,
					      &pd->be_ctx, e);

		if (ret)
			return ret;
	}
	return 0;
}

/* backend = shm | cuda | auto -> ts->be, and one context per device. */
static int pools_open(struct tenants *ts, const struct config *cfg,
		      struct errbuf *e)
{
	ts->be = &backend_shm;
	ts->backend = "shm";
	ts->tp = cfg->tp > 1 ? cfg->tp : 1;
	ts->npools = config_npools(cfg);
	for (uint32_t i = 0; i < ts->npools; i++) {
		ts->pools[i] = (struct pool_dev){ .device = cfg->devices[i * ts->tp] };
		for (uint32_t r = 0; r < ts->tp; r++)
			ts->pools[i].rank_device[r] = cfg->devices[i * ts->tp + r];
	}
	if (!strcmp(cfg->backend, "shm"))
		return pools_stripe(ts, cfg, e);
#if KVPOOL_HAVE_CUDA
	if (!strcmp(cfg->backend, "auto")) {
		int n = 0;
		cudaError_t err = cudaGetDeviceCount(&n);

		if (err != cudaSuccess || n <= 0) {
			log_info("backend auto: no CUDA device (%s); using shm",
				 err != cudaSuccess ? cudaGetErrorString(err) :
				 "the driver reports 0");
			return 0;
		}
		log_info("backend auto: %d CUDA device(s) found; using cuda", n);
	}
	ts->be = &backend_cuda;
	ts->backend = "cuda";
	for (uint32_t i = 0; i < ts->npools; i++) {
		struct pool_dev *pd = &ts->pools[i];

		for (uint32_t r = 0; r < ts->tp; r++) {
			int ret = backend_cuda_open(pd->rank_device[r],
						    &pd->rank_ctx[r], e);

			if (ret)
				return ret;
		}
		if (ts->tp == 1) {
			pd->be_ctx = pd->rank_ctx[0];
			pd->rank_ctx[0] = NULL; /* closed as be_ctx */
		}
	}
	return pools_stripe(ts, cfg, e);
#else
	return errbuf_set(e, -EINVAL, "kvpoold was built without CUDA "
			  "(KVPOOL_CUDA=OFF or no nvcc); use backend=shm");
#endif
}

static void pools_close(struct tenants *ts)
{
	for (uint32_t i = 0; i < ts->npools; i++) {
		struct pool_dev *pd = &ts->pools[i];

		if (ts->tp > 1) {
			backend_stripe_close(pd->be_ctx);
			pd->be_ctx = NULL;
		}
#if KVPOOL_HAVE_CUDA
		if (pd->be_ctx)
			backend_cuda_close(pd->be_ctx);
		for (uint32_t r = 0; r < ts->tp; r++)
			if (pd->rank_ctx[r])
				backend_cuda_close(pd->rank_ctx[r]);
#endif
	}
}

int tenants_cuda_device(const struct tenants *ts, uint32_t pool)
{
	return ts->be == &backend_shm || pool >= ts->npools ? -1 :
	       ts->pools[pool].device;
}

int tenants_rank_cuda(const struct tenants *ts, uint32_t pool, uint32_t rank,
		      void **be_ctx)
{
	const struct pool_dev *pd;

	*be_ctx = NULL;
	if (ts->be == &backend_shm || pool >= ts->npools || rank >= ts->tp)
		return -1;
	pd = &ts->pools[pool];
	*be_ctx = ts->tp > 1 ? pd->rank_ctx[rank] : pd->be_ctx;
	return pd->rank_device[rank];
}

/* ------------------------------------------------------------ tenants */

/* A clean stop keeps the cache: histories in memory go to the disk tier
 * (its flush, tier.h), for the warm restart. */
static void disk_flush_set(struct tenants *ts, struct tenant *t, struct shard_set *s)
{
	int n = 0;

	for (uint32_t i = 0; ts->disk && s && i < s->n; i++) {
		n += engine_tier_flush(shard_lock(s, i), ENGINE_TIER_DISK);
		shard_unlock(s, i);
	}
	if (n)
		log_info("tenant %s: %d histories written to the disk tier before "
			 "stopping", t->name, n);
}

/* With remote_user_histories a clean stop also writes the histories to
 * the store (daemon/remote/remote_user.c), so another node serves their
 * users next (failover, a node drained); before the disk tier's flush,
 * which drops them. */
static void remote_flush_set(struct tenants *ts, struct tenant *t,
			     struct shard_set *s)
{
	int n = 0;

	for (uint32_t i = 0; ts->remote && s && i < s->n; i++) {
		n += engine_tier_flush(shard_lock(s, i), ENGINE_TIER_REMOTE);
		shard_unlock(s, i);
	}
	if (n)
		log_info("tenant %s: %d histories queued for the remote tier before "
			 "stopping", t->name, n);
}

static void tenant_fini(struct tenants *ts, struct tenant *t)
{
	/* Every pool's flush before any pool goes; then the last pool first:
	 * pool 0's set owns the host tier the others share (shard.h). */
	for (uint32_t p = 0; t->pools && p < ts->npools; p++) {
		remote_flush_set(ts, t, t->pools[p].set);
		disk_flush_set(ts, t, t->pools[p].set);
	}
	for (uint32_t p = ts->npools; t->pools && p-- > 0;)
		shard_set_destroy(t->pools[p].set);
	free(t->pools);
	t->pools = NULL;
}

static int tenant_init(struct tenants *ts, struct tenant *t, uint32_t index,
		       const char *name, const struct config *cfg,
		       uint64_t device_mem, uint64_t host_mem,
		       uint64_t max_tokens, const char *hash_salt,
		       uint64_t max_chunks, double chunk_ratio,
		       const struct seq_settings *seq, struct errbuf *e)
{
	uint8_t salt[SHARE_SALT_BYTES];
	struct shard_set_config sc = {
		.ec = {
			.layout = cfg->layout,
			.device_frames = config_frames(cfg, device_mem),
			.host_frames = config_frames(cfg, host_mem),
			.max_tokens_per_user = max_tokens,
			.backend = ts->tp > 1 ? &backend_stripe : ts->be,
			.tp = ts->tp,
		},
		.shards = cfg->shards ? cfg->shards : cfg->workers,
		.reclaim = cfg->reclaim,
		.boost = cfg->reclaim_boost,
	};
	bool plain = ts->npools == 1 && ts->be == &backend_shm && ts->tp == 1;
	int ret;

	ret = tenant_salt(name, hash_salt, salt, e);
	if (ret)
		return ret;
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->index = index;
	t->pools = calloc(ts->npools, sizeof(*t->pools));
	if (!t->pools)
		return errbuf_set(e, -ENOMEM, "tenant %s: out of memory", name);
	for (uint32_t p = 0; p < ts->npools; p++) {
		struct tenant_pool *tp = &t->pools[p];
		char where[48];

		if (ts->tp > 1)
			snprintf(where, sizeof(where), "pool %" PRIu32 " (%s devices %d"
				 "..%d, tp %" PRIu32 ")", p, ts->backend,
				 ts->pools[p].rank_device[0],
				 ts->pools[p].rank_device[ts->tp - 1], ts->tp);
		else if (ts->be == &backend_shm)
			snprintf(where, sizeof(where), "pool %" PRIu32 " (shm)", p);
		else
			snprintf(where, sizeof(where), "pool %" PRIu32 " (cuda device "
				 "%d)", p, ts->pools[p].device);
		sc.ec.backend_ctx = ts->pools[p].be_ctx;
		sc.ec.disk = ts->disk;
		sc.ec.disk_tenant = disk_tenant_key(name);
		sc.ec.disk_pool = p;
		sc.ec.remote = ts->remote;
		sc.ec.remote_chunk_skip = ~cfg->remote_chunk_types &
			(1u << KVP_CHUNK_SYSTEM | 1u << KVP_CHUNK_CONTEXT | 1u << KVP_CHUNK_QUERY);
		/* One host tier for all of the tenant's pools: pool 0's. */
		sc.host_of = p && sc.ec.host_frames ? t->pools[0].set : NULL;
		ret = shard_set_create(&tp->set, &sc, e);
		if (ret) {
			if (!plain) {
				char why[KVP_ERRLEN];

				memcpy(why, e->msg, sizeof(why));
				errbuf_set(e, ret, "tenant %s, %s: %s", name, where,
					   why);
			}
			tp->set = NULL;
			tenant_fini(ts, t);
			return ret;
		}
		for (uint32_t i = 0; i < tp->set->n; i++) {
			share_set_salt(tp->set->v[i].eng, salt);
			share_chunk_configure(tp->set->v[i].eng, max_chunks,
					      chunk_ratio, cfg->chunk_content_max);
			share_seq_configure(tp->set->v[i].eng, !seq->no_caching,
					    seq->max_seq_tokens, seq->max_seqs);
		}
		if (plain)
			log_info("tenant %s: device tier %" PRIu32 " pages, host tier %"
				 PRIu32 " pages of %" PRIu64 " bytes", name,
				 sc.ec.device_frames, sc.ec.host_frames,
				 cfg->layout.page_bytes);
		else
			log_info("tenant %s, %s: device tier %" PRIu32 " pages (%"
				 PRIu64 " bytes mapped), host tier %" PRIu32 " pages "
				 "of %" PRIu64 " bytes%s", name, where, sc.ec.device_frames,
				 shard_set_tier(tp->set, KVP_TIER_DEVICE)->bytes,
				 sc.ec.host_frames, cfg->layout.page_bytes,
				 sc.host_of ? " (pool 0's, shared)" : "");
	}
	return 0;
}

/* The disk tier's warnings: through the log, rate limited. */
static void disk_log(int prio, const char *msg)
{
	if (prio <= LOG_WARNING)
		log_warn("%s", msg);
	else
		log_info("%s", msg);
}

/* One disk tier for every tenant and pool; each tenant's disk_size is its
 * quota of it. */
static int disk_open(struct tenants *ts, const struct config *cfg,
		     struct errbuf *e)
{
	/* Staging holds whole histories on their way each way: a quarter of
	 * the host tier, 64 MiB at least (a larger history is dropped). */
	struct disk_tier_config dc = {
		.dir = cfg->disk_dir, .size = cfg->disk_size,
		.layout = cfg->layout, .tp = cfg->tp, .log = disk_log,
		.staging_bytes = cfg->host_mem / 4 > (64ull << 20) ?
				 cfg->host_mem / 4 : 64ull << 20,
	};
	char err[128];
	int ret;

	if (!cfg->disk_dir)
		return 0;
	if (disk_codec_parse(cfg->disk_compress ? cfg->disk_compress : "none",
			     &dc.codec, err, sizeof(err)))
		return errbuf_set(e, -EINVAL, "disk_compress: %s", err);
	ret = disk_tier_open(&ts->disk, &dc, e);
	if (ret)
		return ret;
	for (uint32_t i = 0; i < cfg->ntenants; i++)
		if (cfg->tenants[i].has_disk_size)
			disk_tier_set_quota(ts->disk,
					    disk_tenant_key(cfg->tenants[i].name),
					    cfg->tenants[i].disk_size /
					    disk_slot_bytes(cfg->layout.page_bytes));
	log_info("disk tier: %s/kvpool.disk, %" PRIu64 " bytes, pages stored %s",
		 cfg->disk_dir, cfg->disk_size,
		 cfg->disk_compress ? cfg->disk_compress : "as is");
	return 0;
}

/* One remote tier for every tenant and pool: keys carry the tenant. */
static int remote_open(struct tenants *ts, const struct config *cfg,
		       struct errbuf *e)
{
	struct remote_tier_config rc = {
		.url = cfg->remote, .timeout_ms = cfg->remote_timeout_ms,
		.layout = cfg->layout, .codec = cfg->remote_compress,
		.user_histories = cfg->remote_user_histories, .log = disk_log,
		.queue_bytes = cfg->remote_queue,
	};
	int ret;

	if (!cfg->remote) {
		if (cfg->remote_user_histories)
			log_warn("remote_user_histories = yes does nothing without "
				 "a remote tier; set remote (--remote=redis-cluster://"
				 "HOST:PORT,...) or remove it");
		return 0;
	}
	ret = remote_tier_open(&ts->remote, &rc, e);
	if (ret)
		return ret;
	log_info("remote tier: %s, timeout %" PRIu32 " ms, pages stored %s%s",
		 cfg->remote, cfg->remote_timeout_ms,
		 cfg->remote_compress ? cfg->remote_compress : "as is",
		 cfg->remote_user_histories ? ", user histories too" : "");
	return 0;
}

int tenants_create(struct tenants *ts, const struct config *cfg,
		   struct errbuf *e)
{
	static const struct id_list none;
	uint32_t n = cfg->ntenants ? cfg->ntenants : 1;
	int ret = 0;

	*ts = (struct tenants){ .implicit = !cfg->ntenants };
	ret = pools_open(ts, cfg, e);
	if (!ret)
		ret = disk_open(ts, cfg, e);
	if (!ret)
		ret = remote_open(ts, cfg, e);
	if (ret) {
		tenants_destroy(ts);
		return ret;
	}
	ts->v = calloc(n, sizeof(*ts->v));
	if (!ts->v) {
		tenants_destroy(ts);
		return errbuf_set(e, -ENOMEM, "out of memory for %" PRIu32 " tenants", n);
	}
	for (uint32_t i = 0; i < n && !ret; i++) {
		struct tenant *t = &ts->v[i];

		if (ts->implicit) {
			t->uids = t->gids = &none;
			ret = tenant_init(ts, t, 0, "default", cfg, cfg->device_mem,
					  cfg->host_mem, cfg->max_tokens_per_user, "",
					  cfg->max_chunks, cfg->chunk_memory_ratio,
					  &cfg->seq, e);
		} else {
			const struct tenant_config *tc = &cfg->tenants[i];

			t->uids = &tc->uids;
			t->gids = &tc->gids;
			ret = tenant_init(ts, t, i, tc->name, cfg, tc->device_mem,
					  tc->host_mem, tc->max_tokens, tc->hash_salt,
					  tc->max_chunks, tc->chunk_memory_ratio,
					  &tc->seq, e);
		}
		if (!ret)
			ts->n++;
	}
	if (ret)
		tenants_destroy(ts);
	return ret;
}

void tenants_destroy(struct tenants *ts)
{
	for (uint32_t i = 0; i < ts->n; i++)
		tenant_fini(ts, &ts->v[i]);
	free(ts->v);
	free(ts->uids);
	pools_close(ts);
	disk_tier_close(ts->disk); /* after the engines: none puts pages now */
	remote_tier_close(ts->remote);
	*ts = (struct tenants){ 0 };
}

static bool any_gid_in(const struct id_list *l, const uint32_t *gids,
		       uint32_t ngids)
{
	for (uint32_t i = 0; i < ngids; i++)
		if (id_list_has(l, gids[i]))
			return true;
	return false;
}

/* uid first: a user named in one tenant is not moved by a group of another. */
static struct tenant *tenant_match(const struct tenants *ts, uint32_t uid,
				   const uint32_t *gids, uint32_t ngids)
{
	if (ts->implicit)
		return &ts->v[0];
	for (uint32_t i = 0; i < ts->n; i++)
		if (id_list_has(ts->v[i].uids, uid))
			return &ts->v[i];
	for (uint32_t i = 0; i < ts->n; i++)
		if (any_gid_in(ts->v[i].gids, gids, ngids))
			return &ts->v[i];
	return NULL;
}

void tenant_admit(const struct tenants *ts, const struct config *cfg,
		  uint32_t uid, const uint32_t *gids, uint32_t ngids,
		  struct admission *out)
{
	bool open = !cfg->allow_uids.n && !cfg->allow_gids.n && ts->implicit;

	*out = (struct admission){
		.admin = id_list_has(&cfg->admin_uids, uid),
		.tenant = tenant_match(ts, uid, gids, ngids),
	};
	out->allowed = open || out->admin || id_list_has(&cfg->allow_uids, uid) ||
		       any_gid_in(&cfg->allow_gids, gids, ngids) ||
		       (out->tenant && !ts->implicit);
	if (!out->allowed) {
		snprintf(out->msg, sizeof(out->msg), "uid %" PRIu32 " is not allowed "
			 "by kvpoold at %s (allow_uids/allow_gids%s); ask the "
			 "operator to add it", uid, cfg->socket,
			 ts->implicit ? "" : ", or a tenant's uids/gids");
		return;
	}
	if (!out->tenant && !out->admin) {
		out->allowed = false;
		snprintf(out->msg, sizeof(out->msg), "uid %" PRIu32 " is allowed by "
			 "kvpoold at %s but belongs to no tenant; ask the operator "
			 "to add it to a [tenant] section (uids=/gids=)", uid,
			 cfg->socket);
	}
}

/* ------------------------------------------------------------ client caps */

#define FDS_PER_CLIENT 2u   /* an attached client's socket and pidfd */
#define FDS_OWN 64u         /* the daemon's own: listener, epoll, logs, disk */
#define FDS_PER_POOL 4u     /* a tenant's tier memfds in one pool, and more */

/* Clients the descriptor limit leaves room for, next to the daemon's own
 * descriptors and its tenants' tiers. */
static uint32_t clients_room(const struct config *cfg, uint64_t *limit)
{
	uint64_t own = FDS_OWN + (uint64_t)FDS_PER_POOL * cfg->ndevices *
			       (cfg->ntenants ? cfg->ntenants : 1);
	struct rlimit rl;
	uint64_t n;

	n = getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ?
	    1u << 20 : (uint64_t)rl.rlim_cur;
	*limit = n;
	/* What a tiny limit leaves: half of it, never nothing. */
	n = n > 2 * own ? n - own : n / 2;
	n /= FDS_PER_CLIENT;
	return n > UINT32_MAX ? UINT32_MAX : (n ? (uint32_t)n : 1);
}

void tenant_client_caps(const struct config *cfg, uint32_t *per_uid,
			uint32_t *per_tenant)
{
	uint64_t limit;
	uint32_t room = clients_room(cfg, &limit);

	*per_uid = cfg->max_clients_per_uid ? cfg->max_clients_per_uid :
		   (room / 4 ? room / 4 : 1);
	*per_tenant = cfg->max_clients_per_tenant ? cfg->max_clients_per_tenant :
		      (room / 2 ? room / 2 : 1);
}

void tenant_client_caps_log(const struct config *cfg, const char *prefix)
{
	uint32_t per_uid, per_tenant, room;
	uint64_t limit;

	room = clients_room(cfg, &limit);
	tenant_client_caps(cfg, &per_uid, &per_tenant);
	log_info("%sattached clients: at most %" PRIu32 " per uid (max_clients_per_uid"
		 "%s) and %" PRIu32 " per tenant (max_clients_per_tenant%s); the "
		 "descriptor limit %" PRIu64 " has room for about %" PRIu32,
		 prefix, per_uid, cfg->max_clients_per_uid ? "" : ", by default",
		 per_tenant, cfg->max_clients_per_tenant ? "" : ", by default",
		 limit, room);
}

static uint32_t uid_home(const struct tenants *ts, uint32_t uid)
{
	return (uid * 2654435761u) & (ts->uids_cap - 1);
}

/* uid's entry, or the free one where it would go. cap > 0. */
static uint32_t uid_slot(const struct tenants *ts, uint32_t uid)
{
	uint32_t i = uid_home(ts, uid);

	while (ts->uids[i].n && ts->uids[i].uid != uid)
		i = (i + 1) & (ts->uids_cap - 1);
	return i;
}

static uint32_t uid_clients(const struct tenants *ts, uint32_t uid)
{
	return ts->uids_cap ? ts->uids[uid_slot(ts, uid)].n : 0;
}

/* Room for one more uid, the table at most half full. */
static int uids_reserve(struct tenants *ts)
{
	uint32_t cap = ts->uids_cap ? 2 * ts->uids_cap : 16, old = ts->uids_cap;
	struct uid_clients *v = ts->uids;

	if (2 * (ts->uids_used + 1) <= ts->uids_cap)
		return 0;
	ts->uids = calloc(cap, sizeof(*ts->uids));
	if (!ts->uids) {
		ts->uids = v;
		return -ENOMEM;
	}
	ts->uids_cap = cap;
	for (uint32_t i = 0; i < old; i++)
		if (v[i].n)
			ts->uids[uid_slot(ts, v[i].uid)] = v[i];
	free(v);
	return 0;
}

int tenant_attach_check(struct tenants *ts, const struct config *cfg,
			uint32_t uid, const struct tenant *t, char *msg,
			size_t len)
{
	uint32_t per_uid, per_tenant, n;

	tenant_client_caps(cfg, &per_uid, &per_tenant);
	n = uid_clients(ts, uid);
	if (n >= per_uid) {
		snprintf(msg, len, "uid %" PRIu32 " has %" PRIu32 " clients attached, "
			 "the most one uid may (max_clients_per_uid=%" PRIu32 "); close "
			 "some, or ask the operator to raise max_clients_per_uid",
			 uid, n, per_uid);
		return -EUSERS;
	}
	n = t ? __atomic_load_n(&t->clients, __ATOMIC_RELAXED) : 0;
	if (t && n >= per_tenant) {
		snprintf(msg, len, "tenant %s has %" PRIu32 " clients attached, the "
			 "most one tenant may (max_clients_per_tenant=%" PRIu32 "); "
			 "close some, or ask the operator to raise "
			 "max_clients_per_tenant", t->name, n, per_tenant);
		return -EUSERS;
	}
	if (uids_reserve(ts)) {
		snprintf(msg, len, "kvpoold is out of memory counting uid %" PRIu32
			 "'s clients; try again", uid);
		return -ENOMEM;
	}
	return 0;
}

void tenant_uid_count(struct tenants *ts, uint32_t uid, int delta)
{
	uint32_t mask = ts->uids_cap - 1, i, j;

	if (!ts->uids_cap)
		return; /* nothing counted: a +1 checks first */
	i = uid_slot(ts, uid);
	if (delta > 0) {
		if (!ts->uids[i].n) {
			ts->uids[i].uid = uid;
			ts->uids_used++;
		}
		ts->uids[i].n++;
		return;
	}
	if (!ts->uids[i].n || --ts->uids[i].n)
		return;
	/* The entry is free: shift back the ones probed past it, so no
	 * lookup stops short at the hole. */
	ts->uids_used--;
	for (j = (i + 1) & mask; ts->uids[j].n; j = (j + 1) & mask) {
		uint32_t k = uid_home(ts, ts->uids[j].uid);

		if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
			ts->uids[i] = ts->uids[j];
			ts->uids[j].n = 0;
			i = j;
		}
	}
}
