/* SPDX-License-Identifier: MIT */
/*
 * tenant.c - building the tenants' engines and the admission decision.
 *
 * Isolation between tenants is physical: each engine allocates its own tier
 * memfds sized by the tenant's quota, and a client is only ever sent its own
 * tenant's device fd, so no pointer arithmetic in a client can reach another
 * tenant's pages.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tenant.h"

static int tenant_init(struct tenant *t, uint32_t index, const char *name,
		       const struct config *cfg, uint64_t device_mem,
		       uint64_t host_mem, uint64_t max_tokens, struct errbuf *e)
{
	struct engine_config ec = {
		.layout = cfg->layout,
		.device_frames = config_frames(cfg, device_mem),
		.host_frames = config_frames(cfg, host_mem),
		.max_tokens_per_user = max_tokens,
	};
	int ret;

	snprintf(t->name, sizeof(t->name), "%s", name);
	t->index = index;
	ret = engine_create(&t->eng, &ec, e);
	if (ret)
		return ret;
	pthread_mutex_init(&t->lock, NULL);
	log_info("tenant %s: device tier %" PRIu32 " pages, host tier %" PRIu32
		 " pages of %" PRIu64 " bytes", name, ec.device_frames,
		 ec.host_frames, cfg->layout.page_bytes);
	return 0;
}

int tenants_create(struct tenants *ts, const struct config *cfg,
		   struct errbuf *e)
{
	static const struct id_list none;
	uint32_t n = cfg->ntenants ? cfg->ntenants : 1;
	int ret = 0;

	*ts = (struct tenants){ .implicit = !cfg->ntenants };
	ts->v = calloc(n, sizeof(*ts->v));
	if (!ts->v)
		return errbuf_set(e, -ENOMEM, "out of memory for %" PRIu32 " tenants", n);
	for (uint32_t i = 0; i < n && !ret; i++) {
		struct tenant *t = &ts->v[i];

		if (ts->implicit) {
			t->uids = t->gids = &none;
			ret = tenant_init(t, 0, "default", cfg, cfg->device_mem,
					  cfg->host_mem, cfg->max_tokens_per_user, e);
		} else {
			const struct tenant_config *tc = &cfg->tenants[i];

			t->uids = &tc->uids;
			t->gids = &tc->gids;
			ret = tenant_init(t, i, tc->name, cfg, tc->device_mem,
					  tc->host_mem, tc->max_tokens, e);
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
	for (uint32_t i = 0; i < ts->n; i++) {
		engine_destroy(ts->v[i].eng);
		pthread_mutex_destroy(&ts->v[i].lock);
	}
	free(ts->v);
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
