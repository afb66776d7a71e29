/* SPDX-License-Identifier: MIT */
/*
 * tenant.h - tenants: one engine each, and who may attach as whom.
 *
 * A tenant is one pool (one engine, with its own tier memfds) behind one
 * mutex. The engine is not thread-safe; the mutex is what makes every
 * operation on it atomic, and what orders operations on one user submitted
 * by clients served by different workers.
 */
#ifndef KVPOOLD_TENANT_H
#define KVPOOLD_TENANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"

struct tenant {
	char name[TENANT_NAME_MAX + 1];
	uint32_t index;             /* position in config order; sqe.tenant - 1 */
	const struct id_list *uids; /* the config's, which outlives the tenant */
	const struct id_list *gids;
	pthread_mutex_t lock;       /* held around every engine call */
	struct engine *eng;
	uint32_t clients;           /* attached clients; atomic */
};

struct tenants {
	struct tenant *v;
	uint32_t n;
	bool implicit;              /* no tenants configured: one "default" */
};

/* One engine per tenant (or the implicit default); -errno with e. */
int tenants_create(struct tenants *ts, const struct config *cfg,
		   struct errbuf *e);
void tenants_destroy(struct tenants *ts);

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

#endif /* KVPOOLD_TENANT_H */
