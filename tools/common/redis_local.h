/* SPDX-License-Identifier: MIT */
/*
 * redis_local.h - a Redis Cluster of n redis-server processes on loopback
 * for the remote tier's tests and `kvbench remote`: free ports, slots split
 * evenly, CLUSTER MEET, waited for until every node says cluster_state:ok.
 */
#ifndef KVPOOL_TEST_REDIS_LOCAL_H
#define KVPOOL_TEST_REDIS_LOCAL_H

#include <stdbool.h>
#include <sys/types.h>

#define REDIS_LOCAL_MAX 3

struct redis_local {
	int n;
	int port[REDIS_LOCAL_MAX];
	pid_t pid[REDIS_LOCAL_MAX];
	char id[REDIS_LOCAL_MAX][48];   /* CLUSTER MYID */
	char dir[64];
	char url[256];                  /* redis-cluster://127.0.0.1:p,... */
};

/* 0, or 77 (skip, with a message) where redis-server is not installed;
 * anything else fails the test. */
int redis_local_start(struct redis_local *r, int n);
void redis_local_stop(struct redis_local *r);
/* A command on node i; the reply (freeReplyObject it) or NULL. */
void *redis_local_cmd(const struct redis_local *r, int i, const char *fmt, ...);

#endif
