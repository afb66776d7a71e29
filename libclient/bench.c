/* SPDX-License-Identifier: MIT */
/*
 * bench.c - kvpool_bench.h: kvbench's view of a client's socket and
 * ring counters.
 */
#include "client_internal.h"
#include "kvpool_bench.h"

int kvpb_socket(const struct kvp_client *c)
{
	return c->sock;
}

uint32_t kvpb_doorbells(const struct kvp_client *c)
{
	return kvpc_doorbells(c);
}

uint32_t kvpb_client_wakeups(const struct kvp_client *c)
{
	return kvpc_client_wakeups(c);
}
