/* SPDX-License-Identifier: MIT */
/*
 * redis_cluster_none.c - redis_cluster.h where hiredis is not installed
 * (the GPU machine): the URL is still checked, opening says how to get
 * the remote tier. kvpoold without --remote runs as before.
 */
#include <errno.h>
#include <string.h>

#include "redis_cluster.h"

int redis_cluster_check_url(const char *url, struct errbuf *e)
{
	if (!url || strncmp(url, RC_URL_SCHEME, strlen(RC_URL_SCHEME)))
		return errbuf_set(e, -EINVAL, "remote '%s': not a Redis Cluster URL; "
				  "write " RC_URL_SCHEME "host:port[,host:port...]",
				  url ? url : "");
	return 0;
}

int redis_cluster_open(struct redis_cluster **out, const char *url,
		       uint32_t timeout_ms, struct errbuf *e)
{
	(void)out;
	(void)timeout_ms;
	return errbuf_set(e, -ENOTSUP, "remote '%s': this kvpoold was built without "
			  "hiredis; install libhiredis-dev (scripts/deps.sh) and "
			  "rebuild, or leave out --remote", url ? url : "");
}

void redis_cluster_close(struct redis_cluster *rc)
{
	(void)rc;
}

void redis_cluster_limit_values(struct redis_cluster *rc, uint64_t max)
{
	(void)rc, (void)max;
}

uint32_t redis_cluster_get(struct redis_cluster *rc, struct rc_item *it, uint32_t n,
			   void (*on_value)(void *, uint32_t, char **, size_t),
			   void *arg)
{
	(void)rc, (void)on_value, (void)arg;
	for (uint32_t i = 0; i < n; i++)
		it[i].status = RC_DOWN;
	return 0;
}

uint32_t redis_cluster_set(struct redis_cluster *rc, struct rc_item *it, uint32_t n)
{
	return redis_cluster_get(rc, it, n, NULL, NULL);
}

int64_t redis_cluster_dbsize(struct redis_cluster *rc)
{
	(void)rc;
	return -1;
}

uint32_t redis_cluster_nodes(const struct redis_cluster *rc)
{
	(void)rc;
	return 0;
}

void redis_cluster_node_stats(const struct redis_cluster *rc, uint32_t i,
			      struct rc_node_stats *out)
{
	(void)rc, (void)i;
	memset(out, 0, sizeof(*out));
}

uint32_t redis_cluster_mapped_slots(const struct redis_cluster *rc)
{
	(void)rc;
	return 0;
}
