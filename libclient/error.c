/* SPDX-License-Identifier: MIT */
/*
 * error.c - the client's last error, its sticky failure, and the fork check
 * (client.c, INHERITED CLIENTS) every call makes first.
 *
 * The bottom of libclient: every other file reports through these, and
 * they call nothing of libclient's, so reporting an error never runs into
 * the layer that reports it (client_internal.h, the order of the files).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

/* ------------------------------------------------------------ errors */

int kvpc_err(struct kvp_client *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	memset(&c->errinfo, 0, sizeof(c->errinfo)); /* the library's own: none */
	return code;
}

void kvpc_cqe_error_info(const struct kvp_cqe *cqe, struct kvp_error_info *out)
{
	*out = (struct kvp_error_info){ 0 };
	if (cqe->res < 0) /* a success's val0 / val1 are the opcode's */
		out->kind = kvp_cqe_detail_get(cqe, &out->first, &out->last);
}

int kvpc_fail(struct kvp_client *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->dead_msg, sizeof(c->dead_msg), fmt, ap);
	va_end(ap);
	memcpy(c->err, c->dead_msg, sizeof(c->err));
	memset(&c->errinfo, 0, sizeof(c->errinfo));
	c->dead = code;
	return code;
}

/* ------------------------------------------------------------ fork */

uint32_t kvpc_fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_child(void)
{
	__atomic_add_fetch(&kvpc_fork_gen, 1, __ATOMIC_RELAXED);
}

static void fork_hook(void)
{
	pthread_atfork(NULL, NULL, fork_child);
}

void kvpc_fork_watch(void)
{
	pthread_once(&fork_once, fork_hook);
}

int kvpc_is_inherited(const struct kvp_client *c)
{
	return __atomic_load_n(&kvpc_fork_gen, __ATOMIC_RELAXED) != c->fork_gen ||
	       getpid() != c->pid;
}

int kvpc_inherited(struct kvp_client *c)
{
	return kvpc_err(c, -ECHILD,
			"kvpool client %" PRIu32 " was connected by pid %d and "
			"inherited across fork() by pid %d; it stays the parent's "
			"(its rings and leases): kvp_connect() a client of this "
			"process's own (kvp_close() of the inherited one only "
			"unmaps it)",
			c->client_id, (int)c->pid, (int)getpid());
}

int kvpc_check_dead(struct kvp_client *c)
{
	int ret = kvpc_check_fork(c);

	if (ret)
		return ret;
	if (!c->dead)
		return 0;
	memcpy(c->err, c->dead_msg, sizeof(c->err));
	memset(&c->errinfo, 0, sizeof(c->errinfo));
	return c->dead;
}
