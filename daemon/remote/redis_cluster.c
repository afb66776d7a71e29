/* SPDX-License-Identifier: MIT */
/*
 * redis_cluster.c - the Redis Cluster client (redis_cluster.h): slot map,
 * pipelined batches per node, redirects, failed nodes as misses.
 *
 * Hand-written (see the header): no Debian library routes Redis Cluster
 * slots, so the three pieces a cache needs (CRC16 slots, CLUSTER SLOTS,
 * MOVED/ASK) are here, on hiredis's single-server connections.
 */
#define _GNU_SOURCE /* memrchr */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "clock.h"
#include "redis_cluster.h"

#define RC_NO_NODE 0xffffu
#define RC_RETRY_NS 1000000000ull /* a failed node or map: once a second */
#define RC_MAX_ROUNDS 3           /* the first round and two redirects */

struct rc_node {
	char host[48];
	int port;
	redisContext *c;
	uint64_t retry_at;       /* mono_ns before which it is not dialled */
	struct rc_node_stats st;
};

struct redis_cluster {
	struct rc_node nodes[RC_MAX_NODES];
	uint32_t nnodes;
	uint16_t slot[RC_SLOTS]; /* node of each slot, or RC_NO_NODE */
	struct timeval tv;
	bool map_stale;          /* a MOVED said the map changed */
	uint64_t map_retry_at;
	/* Per-batch scratch, grown as batches grow. */
	uint32_t cap;
	uint16_t *target;        /* node of each item this round */
	uint8_t *ask;            /* send ASKING first (an ASK redirect) */
	uint32_t *list;          /* items of one node */
};

/* ------------------------------------------------------------ slots */

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0), as the cluster spec's keyHashSlot. */
static uint16_t crc16(const uint8_t *p, size_t n)
{
	uint16_t crc = 0;

	for (size_t i = 0; i < n; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

uint16_t redis_cluster_slot(const void *key, size_t len)
{
	const uint8_t *k = key;
	size_t s, e;

	/* A hash tag: the bytes between the first '{' and the next '}', when
	 * there are some, decide the slot alone. */
	for (s = 0; s < len && k[s] != '{'; s++)
		;
	if (s < len) {
		for (e = s + 1; e < len && k[e] != '}'; e++)
			;
		if (e < len && e > s + 1)
			return crc16(k + s + 1, e - s - 1) & (RC_SLOTS - 1);
	}
	return crc16(k, len) & (RC_SLOTS - 1);
}

/* ------------------------------------------------------------ nodes */

/* "host:port" of len bytes into host and port; 0 or -EINVAL. */
static int parse_hostport(const char *s, size_t len, char *host, size_t hcap, int *port)
{
	const char *colon = memrchr(s, ':', len);
	char num[8];
	char *end;
	long p;

	if (!colon || colon == s || (size_t)(colon - s) >= hcap ||
	    len - (size_t)(colon - s) - 1 == 0 || len - (size_t)(colon - s) - 1 >= sizeof(num))
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	memcpy(num, colon + 1, len - (size_t)(colon - s) - 1);
	num[len - (size_t)(colon - s) - 1] = '\0';
	p = strtol(num, &end, 10);
	if (*end || p < 1 || p > 65535)
		return -EINVAL;
	*port = (int)p;
	return 0;
}

static int node_find_or_add(struct redis_cluster *rc, const char *host, int port)
{
	struct rc_node *n;

	for (uint32_t i = 0; i < rc->nnodes; i++)
		if (rc->nodes[i].port == port && !strcmp(rc->nodes[i].host, host))
			return (int)i;
	if (rc->nnodes == RC_MAX_NODES || strlen(host) >= sizeof(n->host))
		return -1;
	n = &rc->nodes[rc->nnodes];
	memset(n, 0, sizeof(*n));
	snprintf(n->host, sizeof(n->host), "%s", host);
	n->port = port;
	snprintf(n->st.addr, sizeof(n->st.addr), "%s:%d", host, port);
	n->st.up = true;
	return (int)rc->nnodes++;
}

static void node_fail(struct rc_node *n)
{
	if (n->c)
		redisFree(n->c);
	n->c = NULL;
	n->st.up = false;
	n->retry_at = mono_ns() + RC_RETRY_NS;
}

/* The node's connection, dialled now if it is not failed lately; NULL: down. */
static redisContext *node_conn(struct redis_cluster *rc, struct rc_node *n)
{
	if (n->c)
		return n->c;
	if (mono_ns() < n->retry_at)
		return NULL;
	n->c = redisConnectWithTimeout(n->host, n->port, rc->tv);
	if (!n->c || n->c->err || redisSetTimeout(n->c, rc->tv) != REDIS_OK) {
		node_fail(n);
		return NULL;
	}
	redisEnableKeepAlive(n->c);
	n->st.up = true;
	return n->c;
}

/* ------------------------------------------------------------ the map */

/* One CLUSTER SLOTS reply into the map: [start, end, [host, port, ...], ...]. */
static int map_read(struct redis_cluster *rc, const redisReply *r, const struct rc_node *from)
{
	if (r->type != REDIS_REPLY_ARRAY)
		return -EPROTO;
	for (uint32_t s = 0; s < RC_SLOTS; s++)
		rc->slot[s] = RC_NO_NODE;
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i], *m;
		const char *host;
		int k;

		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER ||
		    e->element[2]->type != REDIS_REPLY_ARRAY)
			return -EPROTO;
		m = e->element[2];
		if (m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER)
			return -EPROTO;
		/* An empty host is "the address you reached me at". */
		host = m->element[0]->len ? m->element[0]->str : from->host;
		k = node_find_or_add(rc, host, (int)m->element[1]->integer);
		if (k < 0)
			continue; /* past RC_MAX_NODES: those slots stay misses */
		for (long long s = e->element[0]->integer;
		     s <= e->element[1]->integer && s >= 0 && s < RC_SLOTS; s++)
			rc->slot[s] = (uint16_t)k;
	}
	return 0;
}

/* Read the map from the first node that answers; false: none did. */
static bool map_refresh(struct redis_cluster *rc)
{
	uint64_t now = mono_ns();

	if (now < rc->map_retry_at)
		return false;
	for (uint32_t i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = &rc->nodes[i];
		redisContext *c = node_conn(rc, n);
		redisReply *r;
		int ret;

		if (!c)
			continue;
		r = redisCommand(c, "CLUSTER SLOTS");
		if (!r) {
			node_fail(n);
			continue;
		}
		ret = map_read(rc, r, n);
		freeReplyObject(r);
		if (!ret) {
			rc->map_stale = false;
			return true;
		}
	}
	rc->map_retry_at = now + RC_RETRY_NS;
	return false;
}

uint32_t redis_cluster_mapped_slots(const struct redis_cluster *rc)
{
	uint32_t k = 0;

	for (uint32_t s = 0; s < RC_SLOTS; s++)
		k += rc->slot[s] != RC_NO_NODE;
	return k;
}

/* ------------------------------------------------------------ open */

int redis_cluster_check_url(const char *url, struct errbuf *e)
{
	size_t sl = strlen(RC_URL_SCHEME);
	const char *p;
	uint32_t seeds = 0;

	if (!url || strncmp(url, RC_URL_SCHEME, sl))
		return errbuf_set(e, -EINVAL, "remote '%s': not a Redis Cluster URL; "
				  "write " RC_URL_SCHEME "host:port[,host:port...]",
				  url ? url : "");
	for (p = url + sl;; p++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char host[48];
		int port;

		if (parse_hostport(p, len, host, sizeof(host), &port))
			return errbuf_set(e, -EINVAL, "remote '%s': '%.*s' is not host:port "
					  "(a port from 1 to 65535); write " RC_URL_SCHEME
					  "host:port[,host:port...]", url, (int)len, p);
		if (++seeds > RC_MAX_NODES)
			return errbuf_set(e, -EINVAL, "remote '%s': more than %u seed nodes; "
					  "name a few, the others come from CLUSTER SLOTS",
					  url, RC_MAX_NODES);
		if (!end)
			break;
		p = end;
	}
	return 0;
}

int redis_cluster_open(struct redis_cluster **out, const char *url,
		       uint32_t timeout_ms, struct errbuf *e)
{
	struct redis_cluster *rc;
	const char *p;
	int ret = redis_cluster_check_url(url, e);

	if (ret)
		return ret;
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return errbuf_set(e, -ENOMEM, "remote: out of memory");
	rc->tv.tv_sec = timeout_ms / 1000;
	rc->tv.tv_usec = (timeout_ms % 1000) * 1000;
	for (uint32_t s = 0; s < RC_SLOTS; s++)
		rc->slot[s] = RC_NO_NODE;
	for (p = url + strlen(RC_URL_SCHEME);; p++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char host[48];
		int port;

		if (!parse_hostport(p, len, host, sizeof(host), &port))
			node_find_or_add(rc, host, port);
		if (!end)
			break;
		p = end;
	}
	map_refresh(rc); /* none answering yet is not an error: misses */
	*out = rc;
	return 0;
}

void redis_cluster_close(struct redis_cluster *rc)
{
	if (!rc)
		return;
	for (uint32_t i = 0; i < rc->nnodes; i++)
		if (rc->nodes[i].c)
			redisFree(rc->nodes[i].c);
	free(rc->target);
	free(rc->ask);
	free(rc->list);
	free(rc);
}

/* ------------------------------------------------------------ batches */

static int scratch(struct redis_cluster *rc, uint32_t n)
{
	uint16_t *t;
	uint8_t *a;
	uint32_t *l;

	if (n <= rc->cap)
		return 0;
	t = realloc(rc->target, n * sizeof(*t));
	if (t)
		rc->target = t;
	a = realloc(rc->ask, n);
	if (a)
		rc->ask = a;
	l = realloc(rc->list, n * sizeof(*l));
	if (l)
		rc->list = l;
	if (!t || !a || !l)
		return -ENOMEM;
	rc->cap = n;
	return 0;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": point item i at that node. */
static bool redirect(struct redis_cluster *rc, uint32_t i, const redisReply *r)
{
	bool ask = !strncmp(r->str, "ASK ", 4);
	const char *sp;
	unsigned long slot;
	char host[48];
	int port, k;

	if (!ask && strncmp(r->str, "MOVED ", 6))
		return false;
	slot = strtoul(r->str + (ask ? 4 : 6), NULL, 10);
	sp = strrchr(r->str, ' ');
	if (!sp || slot >= RC_SLOTS ||
	    parse_hostport(sp + 1, strlen(sp + 1), host, sizeof(host), &port) ||
	    (k = node_find_or_add(rc, host, port)) < 0)
		return false;
	rc->target[i] = (uint16_t)k;
	rc->ask[i] = ask;
	if (!ask) {
		rc->slot[slot] = (uint16_t)k;
		rc->map_stale = true;
	}
	return true;
}

struct batch {
	struct rc_item *it;
	bool set;
	void (*on_value)(void *arg, uint32_t i, char **val, size_t len);
	void *arg;
	uint32_t redirected; /* items sent to another node for the next round */
};

/* One reply to item i: its status, or a redirect. */
static void reply_one(struct redis_cluster *rc, struct rc_node *n, struct batch *b,
		      uint32_t i, redisReply *r)
{
	struct rc_item *it = &b->it[i];

	if (r->type == REDIS_REPLY_ERROR) {
		if (redirect(rc, i, r)) {
			b->redirected++;
			return;
		}
		it->status = RC_ERROR; /* CLUSTERDOWN, TRYAGAIN, OOM: a miss */
		n->st.errors++;
	} else if (b->set) {
		/* SET says OK, DEL how many keys it removed. */
		it->status = r->type == REDIS_REPLY_STATUS ||
			     r->type == REDIS_REPLY_INTEGER ? RC_HIT : RC_ERROR;
		n->st.errors += it->status != RC_HIT;
		n->st.bytes_out += it->status == RC_HIT ? it->vlen : 0;
	} else if (r->type == REDIS_REPLY_STRING) {
		it->status = RC_HIT;
		n->st.hits++;
		n->st.bytes_in += r->len;
		/* hiredis allocates a reply's string with malloc (hi_malloc)
		 * and frees it with free(): taken, it is the callee's. */
		b->on_value(b->arg, i, &r->str, r->len);
	} else {
		it->status = RC_MISS;
		n->st.misses++;
	}
	rc->target[i] = RC_NO_NODE; /* done */
}

/* This round's items grouped by node into rc->list: node k's are
 * list[off[k], off[k + 1]). Fixed before anything is sent: a redirect read
 * from one node must not add an item to another's replies. */
static void round_lists(struct redis_cluster *rc, uint32_t n, uint32_t *off)
{
	uint32_t m = 0;

	for (uint32_t k = 0; k < rc->nnodes; k++) {
		off[k] = m;
		for (uint32_t i = 0; i < n; i++)
			if (rc->target[i] == k)
				rc->list[m++] = i;
	}
	off[rc->nnodes] = m;
}

/* The rest of node k's items failed: close it (its replies are out of step
 * with the requests), they are misses. */
static void node_items_down(struct redis_cluster *rc, uint32_t k, struct batch *b,
			    const uint32_t *list, uint32_t from, uint32_t m)
{
	struct rc_node *n = &rc->nodes[k];

	node_fail(n);
	for (uint32_t j = from; j < m; j++) {
		b->it[list[j]].status = RC_DOWN;
		rc->target[list[j]] = RC_NO_NODE;
		n->st.errors++;
		n->st.misses += !b->set;
	}
}

/* Send node k's items in one pipeline, written out whole; false: down. */
static bool node_send(struct redis_cluster *rc, uint32_t k, struct batch *b,
		      const uint32_t *list, uint32_t m)
{
	struct rc_node *n = &rc->nodes[k];
	redisContext *c = node_conn(rc, n);
	int done = 0;

	for (uint32_t x = 0; c && x < m; x++) {
		const struct rc_item *it = &b->it[list[x]];
		int ret = REDIS_OK;

		if (rc->ask[list[x]])
			ret = redisAppendCommand(c, "ASKING");
		if (ret == REDIS_OK)
			ret = !b->set ? redisAppendCommand(c, "GET %b", it->key, it->klen)
			      : it->val ? redisAppendCommand(c, "SET %b %b", it->key, it->klen,
							     it->val, it->vlen)
					: redisAppendCommand(c, "DEL %b", it->key, it->klen);
		if (ret != REDIS_OK)
			c = NULL; /* out of memory: the node's items are misses */
		if (b->set)
			n->st.sets++;
		else
			n->st.gets++;
	}
	while (c && !done)
		if (redisBufferWrite(c, &done) != REDIS_OK)
			c = NULL;
	if (!c)
		node_items_down(rc, k, b, list, 0, m);
	return c != NULL;
}

/* Read node k's m replies (its items in rc->list). */
static void node_recv(struct redis_cluster *rc, uint32_t k, struct batch *b,
		      const uint32_t *list, uint32_t m, uint64_t t0)
{
	struct rc_node *n = &rc->nodes[k];
	redisContext *c = n->c;
	uint32_t j = 0;

	for (; j < m; j++) {
		uint32_t i = list[j];
		redisReply *r = NULL;

		if (rc->ask[i]) {
			if (redisGetReply(c, (void **)&r) != REDIS_OK)
				break;
			freeReplyObject(r);
			rc->ask[i] = 0;
		}
		if (redisGetReply(c, (void **)&r) != REDIS_OK)
			break;
		reply_one(rc, n, b, i, r);
		freeReplyObject(r);
	}
	n->st.rounds++;
	n->st.latency_ns += mono_ns() - t0;
	if (j < m)
		node_items_down(rc, k, b, list, j, m);
}

static uint32_t batch_run(struct redis_cluster *rc, struct batch *b, uint32_t n)
{
	uint32_t done = 0;

	for (uint32_t i = 0; i < n; i++)
		b->it[i].status = RC_DOWN;
	if (!n || scratch(rc, n))
		return 0;
	if (rc->map_stale || !redis_cluster_mapped_slots(rc))
		map_refresh(rc);
	for (uint32_t i = 0; i < n; i++) {
		rc->target[i] = rc->slot[redis_cluster_slot(b->it[i].key, b->it[i].klen)];
		rc->ask[i] = 0;
	}
	for (int round = 0; round < RC_MAX_ROUNDS; round++) {
		bool sent[RC_MAX_NODES] = { false };
		uint32_t off[RC_MAX_NODES + 1];
		uint64_t t0 = mono_ns();

		b->redirected = 0;
		round_lists(rc, n, off);
		/* Every node's pipeline goes out before any reply is read, so
		 * the nodes work at once: a round costs the slowest node, not
		 * the sum. (Replies wait in the sockets and the servers' output
		 * buffers meanwhile.) */
		for (uint32_t k = 0; k < rc->nnodes; k++)
			sent[k] = off[k + 1] > off[k] &&
				  node_send(rc, k, b, rc->list + off[k], off[k + 1] - off[k]);
		for (uint32_t k = 0; k < rc->nnodes; k++)
			if (sent[k])
				node_recv(rc, k, b, rc->list + off[k], off[k + 1] - off[k], t0);
		if (!b->redirected)
			break;
	}
	for (uint32_t i = 0; i < n; i++)
		done += b->it[i].status == RC_HIT;
	return done;
}

uint32_t redis_cluster_get(struct redis_cluster *rc, struct rc_item *it, uint32_t n,
			   void (*on_value)(void *arg, uint32_t i, char **val,
					    size_t len),
			   void *arg)
{
	struct batch b = { .it = it, .on_value = on_value, .arg = arg };

	return batch_run(rc, &b, n);
}

uint32_t redis_cluster_set(struct redis_cluster *rc, struct rc_item *it, uint32_t n)
{
	struct batch b = { .it = it, .set = true };

	return batch_run(rc, &b, n);
}

int64_t redis_cluster_dbsize(struct redis_cluster *rc)
{
	int64_t sum = 0;

	if (rc->map_stale || !redis_cluster_mapped_slots(rc))
		map_refresh(rc);
	for (uint32_t k = 0; k < rc->nnodes; k++) {
		redisContext *c;
		redisReply *r;
		bool routed = false;

		for (uint32_t s = 0; s < RC_SLOTS && !routed; s++)
			routed = rc->slot[s] == k;
		if (!routed)
			continue;
		if (!(c = node_conn(rc, &rc->nodes[k])) || !(r = redisCommand(c, "DBSIZE")))
			return -1;
		sum += r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
		freeReplyObject(r);
	}
	return sum;
}

uint32_t redis_cluster_nodes(const struct redis_cluster *rc)
{
	return rc->nnodes;
}

void redis_cluster_node_stats(const struct redis_cluster *rc, uint32_t i,
			      struct rc_node_stats *out)
{
	*out = rc->nodes[i].st;
}
