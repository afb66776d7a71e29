/* SPDX-License-Identifier: MIT */
/*
 * tenant.h - tenants and pools: one engine per (tenant, pool), and who may
 * attach as whom.
 *
 * A pool is one entry of `devices`: one GPU with the cuda backend (on shm,
 * one more set of memfds). Every tenant has one engine in every pool, sized
 * by the tenant's quota (device_mem / host_mem apply per pool), split into
 * shards that own its users (shard.h), each behind its own mutex. An engine
 * is not thread-safe; a shard's mutex is what makes every operation on it
 * atomic, and what orders operations on one user submitted by clients
 * served by different workers. A client attaches to one pool (hello.pool)
 * and its per-user operations go to the shard owning the user there.
 */
#ifndef KVPOOLD_TENANT_H
#define KVPOOLD_TENANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "kvpool_engine.h"

/* One tenant's engines in one pool: shards owning its users (shard.h). */
struct tenant_pool {
	struct shard_set *set;
};

struct tenant {
	char name[TENANT_NAME_MAX + 1];
	uint32_t index;             /* position in config order; sqe.tenant - 1 */
	const struct id_list *uids; /* the config's, which outlives the tenant */
	const struct id_list *gids;
	struct tenant_pool *pools;  /* [tenants.npools] */
	uint32_t clients;           /* attached clients, all pools; atomic */
};

/* What a pool is made of: the backend context of its device, or with
 * tp > 1 (tensor-parallel) of its ranks' devices, behind a striped one. */
struct pool_dev {
	int device;                 /* GPU ordinal (cuda), the devices entry (shm);
				     * rank 0's with tp > 1 */
	void *be_ctx;               /* the engine's: backend_cuda_open()'s (NULL
				     * on shm); with tp > 1 backend_stripe_open()'s */
	int rank_device[TP_MAX];    /* tp > 1: devices[p * tp + r] */
	void *rank_ctx[TP_MAX];     /* tp > 1, cuda: each rank's backend_cuda_open() */
};

/* Attached clients of one uid: an entry of an open-addressing table. */
struct uid_clients {
	uint32_t uid;
	uint32_t n;                 /* 0: the entry is free */
};

struct tenants {
	struct tenant *v;
	uint32_t n;
	bool implicit;              /* no tenants configured: one "default" */
	const struct backend_ops *be;  /* a device's: shm or cuda */
	const char *backend;        /* "shm" or "cuda": auto resolved */
	struct pool_dev pools[DEVICES_MAX];
	uint32_t npools;            /* config_npools(): ndevices / tp */
	uint32_t tp;                /* ranks per pool (cfg->tp) */
	struct disk_tier *disk;     /* NULL: no disk_dir */
	struct remote_tier *remote; /* NULL: no remote */
	/* Attached clients per uid (main thread only): for
	 * max_clients_per_uid. cap is a power of two, at most half used. */
	struct uid_clients *uids;
	uint32_t uids_cap, uids_used;
};

/* Resolve the backend, open one backend context per device, then one engine
 * per (tenant, pool); -errno with e. */
int tenants_create(struct tenants *ts, const struct config *cfg,
		   struct errbuf *e);
void tenants_destroy(struct tenants *ts);

/* The CUDA device of a pool, -1 on the shm backend. */
int tenants_cuda_device(const struct tenants *ts, uint32_t pool);
/* Rank r's (r < tp) device and backend context of a pool: on cuda its GPU
 * ordinal and context (what names it by UUID), -1 and NULL on shm. */
int tenants_rank_cuda(const struct tenants *ts, uint32_t pool, uint32_t rank,
		      void **be_ctx);

struct admission {
	bool allowed;
	bool admin;
	struct tenant *tenant;  /* NULL: admin-only (no data ops, no tier fd) */
	char msg[KVP_ERRLEN];   /* why not, when !allowed */
};

/*
 * Decide whether a peer (uid, its gids) may attach, as which tenant and
 * whether it is an admin. Allowed: an admin uid, a uid in allow_uids, a gid
 * in allow_gids, a member of a configured tenant, or anyone when the allow
 * lists are empty and no tenants are configured.
 */
void tenant_admit(const struct tenants *ts, const struct config *cfg,
		  uint32_t uid, const uint32_t *gids, uint32_t ngids,
		  struct admission *out);

/*
 * Attached clients per uid and per tenant (issue 25, item 12). Every
 * attached client holds descriptors (its socket and pidfd), and kvpoold has
 * RLIMIT_NOFILE of them: one uid or one tenant attaching clients without
 * end would lock everyone else out. max_clients_per_uid and
 * max_clients_per_tenant bound them; left 0 they are a quarter and a half
 * of the clients the descriptor limit leaves room for (kvpoold raised its
 * soft limit to the hard one at start), so no single uid or tenant takes
 * them all. Admin-only clients count for their uid.
 */
void tenant_client_caps(const struct config *cfg, uint32_t *per_uid,
			uint32_t *per_tenant);
/* One line saying the caps in force and where they come from. */
void tenant_client_caps_log(const struct config *cfg, const char *prefix);
/*
 * Main thread, at attach: whether one more client of uid (and of tenant t,
 * NULL for an admin-only client) fits. 0, or -EUSERS with msg naming the
 * cap, its setting and what to do (-ENOMEM: no room to count it).
 */
int tenant_attach_check(struct tenants *ts, const struct config *cfg,
			uint32_t uid, const struct tenant *t, char *msg,
			size_t len);
/* Main thread: a client of uid registered (+1) or gone (-1). A +1 must
 * follow a tenant_attach_check() that said yes. */
void tenant_uid_count(struct tenants *ts, uint32_t uid, int delta);

#endif /* KVPOOLD_TENANT_H */
