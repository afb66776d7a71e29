/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: one Cluster client, one node table and parser. */
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
#include <hiredis/sds.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "clock.h"
#include "redis_cluster.h"

#define RC_NO_NODE 0xffffu
#define RC_RETRY_NS 1000000000ull /* a failed node or map: once a second */
#define RC_MAX_ROUNDS 3           /* the first round and two redirects */
#define RC_IO_CHUNK 65536         /* bytes read from a node at once */
#define RC_LINE_MAX 4096          /* a header, status or error line */
#define RC_MAX_DEPTH 8            /* arrays in arrays (CLUSTER SLOTS: 3) */
/* A CLUSTER SLOTS reply: a map cut into every one of the 16384 slots,
 * with replicas, stays well inside these. */
#define RC_MAP_BYTES (8u << 20)
#define RC_MAP_ITEMS (1u << 19)

/* What one reply may be, checked as its bytes arrive. */
struct rc_limits {
	uint64_t bulk;     /* longest bulk string */
	uint64_t bytes;    /* most bytes of one reply */
	uint32_t elements; /* most elements of one array; 0: no arrays */
	uint32_t items;    /* most items of one reply, nested ones counted */
};

static const struct rc_limits map_limits = {
	.bulk = RC_LINE_MAX, .bytes = RC_MAP_BYTES,
	.elements = RC_SLOTS, .items = RC_MAP_ITEMS,
};

/*
 * Where a node's reply stream stands, scanned as it arrives and before
 * hiredis sees it: hiredis 0.14's reader buffers a bulk of any length
 * until it is whole and callocs an array's element pointers from its
 * header (no maxbulk or maxelements to set), so a length past the limits
 * is refused here, at its header, and its bytes never buffered.
 */
struct rc_scan {
	uint64_t skip;           /* bytes of a bulk (and its CRLF) still to come */
	uint64_t bytes;          /* of the reply so far */
	uint32_t items;          /* of the reply so far */
	uint32_t line;           /* bytes of the header line so far */
	char head[24];           /* its first bytes: a type and a length */
	uint32_t depth;          /* arrays open */
	int64_t left[RC_MAX_DEPTH]; /* items each still owes */
};

struct rc_node {
	char host[48];
	int port;
	redisContext *c;
	struct rc_scan scan;
	uint64_t retry_at;       /* mono_ns before which it is not dialled */
	struct rc_node_stats st;
};

struct redis_cluster {
	struct rc_node nodes[RC_MAX_NODES];
	uint32_t nnodes;
	uint16_t slot[RC_SLOTS]; /* node of each slot, or RC_NO_NODE */
	uint64_t timeout_ns;     /* a batch's deadline from its start */
	struct rc_limits values; /* replies of a batch (GET, SET, DEL, ASKING) */
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

/* The node failed: closed (its replies are out of step with the
 * requests), not dialled again for a second. A round it did not finish in
 * time, or a reply it broke the limits with, is counted as such. */
static void node_fail(struct rc_node *n, int why)
{
	if (n->c)
		redisFree(n->c);
	n->c = NULL;
	n->st.up = false;
	n->st.timeouts += why == -ETIMEDOUT;
	n->st.bad_replies += why == -EMSGSIZE || why == -EPROTO;
	n->retry_at = mono_ns() + RC_RETRY_NS;
}

/* ms until deadline, rounded up; 0 once it is past. */
static int ms_left(uint64_t deadline)
{
	uint64_t now = mono_ns();

	return now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
}

/* The node's connection, dialled now if it is not failed lately and the
 * deadline leaves time to; NULL: down. */
static redisContext *node_conn(struct rc_node *n, uint64_t deadline)
{
	int ms = ms_left(deadline);
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = ms % 1000 * 1000 };

	if (n->c)
		return n->c;
	if (mono_ns() < n->retry_at || !ms)
		return NULL;
	n->c = redisConnectWithTimeout(n->host, n->port, tv);
	if (!n->c || n->c->err) {
		node_fail(n, -ECONNREFUSED);
		return NULL;
	}
	redisEnableKeepAlive(n->c);
	memset(&n->scan, 0, sizeof(n->scan));
	n->st.up = true;
	return n->c;
}

/* ------------------------------------------------------------ replies */

/* An item of the reply ended: close the arrays it completes; the reply
 * ends with the last. */
static void scan_item_done(struct rc_scan *s)
{
	while (s->depth && --s->left[s->depth - 1] == 0)
		s->depth--;
	if (!s->depth) {
		s->bytes = 0;
		s->items = 0;
	}
}

/* A header line ended (its first bytes in s->head): 0, -EMSGSIZE past a
 * limit, -EPROTO not RESP2. */
static int scan_line(struct rc_scan *s, const struct rc_limits *lim)
{
	char type = s->head[0], *end;
	long long v;

	if (++s->items > lim->items)
		return -EMSGSIZE;
	if (type == '+' || type == '-' || type == ':') {
		scan_item_done(s);
		return 0;
	}
	if ((type != '$' && type != '*') || s->line >= sizeof(s->head))
		return -EPROTO;
	errno = 0;
	v = strtoll(s->head + 1, &end, 10);
	if (errno || end == s->head + 1 || strcmp(end, "\r") || v < -1)
		return -EPROTO;
	if (v == -1 || (type == '*' && v == 0)) {
		scan_item_done(s); /* a nil, an empty array */
		return 0;
	}
	if (type == '$') {
		if ((uint64_t)v > lim->bulk)
			return -EMSGSIZE;
		s->skip = (uint64_t)v + 2;
		return 0;
	}
	if ((uint64_t)v > lim->elements)
		return -EMSGSIZE;
	if (s->depth == RC_MAX_DEPTH)
		return -EPROTO;
	s->left[s->depth++] = v;
	return 0;
}

/* n bytes a node sent, before hiredis buffers them: 0, or -EMSGSIZE /
 * -EPROTO as soon as a header says the reply breaks lim. */
static int scan_feed(struct rc_scan *s, const struct rc_limits *lim, const char *p, size_t n)
{
	size_t i = 0;
	int ret;

	while (i < n) {
		if (s->skip) {
			size_t k = s->skip < n - i ? (size_t)s->skip : n - i;

			s->skip -= k;
			s->bytes += k;
			i += k;
			if (s->bytes > lim->bytes)
				return -EMSGSIZE;
			if (!s->skip)
				scan_item_done(s);
			continue;
		}
		if (++s->bytes > lim->bytes)
			return -EMSGSIZE;
		if (p[i] != '\n') {
			if (s->line < sizeof(s->head) - 1)
				s->head[s->line] = p[i];
			if (++s->line > RC_LINE_MAX)
				return -EMSGSIZE;
			i++;
			continue;
		}
		i++;
		s->head[s->line < sizeof(s->head) - 1 ? s->line : sizeof(s->head) - 1] = '\0';
		ret = s->line ? scan_line(s, lim) : -EPROTO;
		s->line = 0;
		if (ret)
			return ret;
	}
	return 0;
}

/* Write what the node's pipeline has left, as much as the socket takes
 * now: 0 or -errno. */
static int node_write(struct rc_node *n, size_t *off)
{
	size_t len = sdslen(n->c->obuf);
	ssize_t w;

	if (*off == len)
		return 0;
	w = send(n->c->fd, n->c->obuf + *off, len - *off, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (w < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	*off += (size_t)w;
	if (*off == len) {
		sdsclear(n->c->obuf);
		*off = 0;
	}
	return 0;
}

static bool node_writing(const struct rc_node *n)
{
	return sdslen(n->c->obuf) > 0;
}

/* Read what the node sent, scanned against lim, into its reader: 0 or
 * -errno (-ECONNRESET: it closed; -EMSGSIZE, -EPROTO: scan_feed's). */
static int node_read(struct rc_node *n, const struct rc_limits *lim)
{
	char buf[RC_IO_CHUNK];
	ssize_t r = recv(n->c->fd, buf, sizeof(buf), MSG_DONTWAIT);
	int ret;

	if (r < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	if (!r)
		return -ECONNRESET;
	ret = scan_feed(&n->scan, lim, buf, (size_t)r);
	if (ret)
		return ret;
	return redisReaderFeed(n->c->reader, buf, (size_t)r) == REDIS_OK ? 0 : -ENOMEM;
}

/* The next reply the node's reader holds, or NULL (*err: 0, wait for
 * more; -EPROTO: hiredis could not parse it). */
static redisReply *node_reply(struct rc_node *n, int *err)
{
	void *r = NULL;

	*err = redisReaderGetReply(n->c->reader, &r) == REDIS_OK ? 0 : -EPROTO;
	return r;
}

/* One command on node n and its reply, all by deadline, within lim; NULL:
 * n failed (closed and counted). */
static redisReply *node_command(struct rc_node *n, const struct rc_limits *lim,
				uint64_t deadline, const char *cmd)
{
	struct pollfd p;
	redisReply *r = NULL;
	size_t off = 0;
	int err = 0;

	/* Past the deadline a node is not asked: no answer is not its fault. */
	if (!ms_left(deadline) || !node_conn(n, deadline))
		return NULL;
	if (redisAppendCommand(n->c, cmd) != REDIS_OK) {
		node_fail(n, -ENOMEM);
		return NULL;
	}
	while (!err && !(r = node_reply(n, &err)) && !err) {
		p = (struct pollfd){ .fd = n->c->fd,
				     .events = POLLIN | (node_writing(n) ? POLLOUT : 0) };
		err = poll(&p, 1, ms_left(deadline));
		if (err < 0)
			err = errno == EINTR ? 0 : -errno;
		else if (!err)
			err = -ETIMEDOUT;
		else if (!(err = p.revents & POLLOUT ? node_write(n, &off) : 0) &&
			 p.revents & (POLLIN | POLLHUP | POLLERR))
			err = node_read(n, lim);
	}
	if (err) {
		node_fail(n, err);
		return NULL;
	}
	return r;
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

/* Read the map from the first node that answers by deadline; false: none
 * did. */
static bool map_refresh(struct redis_cluster *rc, uint64_t deadline)
{
	uint64_t now = mono_ns();

	if (now < rc->map_retry_at)
		return false;
	for (uint32_t i = 0; i < rc->nnodes; i++) {
		struct rc_node *n = &rc->nodes[i];
		redisReply *r = node_command(n, &map_limits, deadline, "CLUSTER SLOTS");
		int ret;

		if (!r)
			continue;
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
	rc->timeout_ns = (uint64_t)timeout_ms * 1000000;
	redis_cluster_limit_values(rc, RC_VALUE_MAX);
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
	/* None answering yet is not an error: misses. */
	map_refresh(rc, mono_ns() + rc->timeout_ns);
	*out = rc;
	return 0;
}

void redis_cluster_limit_values(struct redis_cluster *rc, uint64_t max)
{
	/* A value, or a status or error line: one item, no arrays. */
	rc->values = (struct rc_limits){ .bulk = max, .bytes = max + RC_LINE_MAX + 64,
					 .elements = 0, .items = 1 };
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

/* One node's part of a round. */
struct rc_io {
	const uint32_t *list;    /* its items */
	uint32_t m, j;           /* how many; replies taken */
	size_t off;              /* pipeline bytes written */
	bool busy;               /* sending, or replies owed */
};

/* The rest of node k's items failed (why: node_fail's): close it, they
 * are misses. */
static void node_items_down(struct redis_cluster *rc, uint32_t k, struct batch *b,
			    struct rc_io *io, int why)
{
	struct rc_node *n = &rc->nodes[k];

	if (n->c)
		node_fail(n, why); /* not one that was down already: its retry stands */
	for (uint32_t j = io->j; j < io->m; j++) {
		b->it[io->list[j]].status = RC_DOWN;
		rc->target[io->list[j]] = RC_NO_NODE;
		n->st.errors++;
		n->st.misses += !b->set;
	}
	io->busy = false;
}

/* Queue node k's items as one pipeline (written by round_io); false: down. */
static bool node_queue(struct redis_cluster *rc, uint32_t k, struct batch *b,
		       struct rc_io *io, uint64_t deadline)
{
	struct rc_node *n = &rc->nodes[k];
	redisContext *c = node_conn(n, deadline);

	io->busy = true;
	for (uint32_t x = 0; c && x < io->m; x++) {
		const struct rc_item *it = &b->it[io->list[x]];
		int ret = REDIS_OK;

		if (rc->ask[io->list[x]])
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
	if (!c)
		node_items_down(rc, k, b, io, -ENOMEM);
	return c != NULL;
}

/* Take the replies node k's reader holds; 0, or -EPROTO. */
static int node_take(struct redis_cluster *rc, uint32_t k, struct batch *b,
		     struct rc_io *io)
{
	struct rc_node *n = &rc->nodes[k];
	redisReply *r;
	int err = 0;

	while (io->j < io->m && (r = node_reply(n, &err))) {
		uint32_t i = io->list[io->j];

		if (rc->ask[i]) {
			rc->ask[i] = 0; /* ASKING's +OK: the item's reply is next */
		} else {
			reply_one(rc, n, b, i, r);
			io->j++;
		}
		freeReplyObject(r);
	}
	return err;
}

/*
 * Write every node's pipeline and read its replies, all nodes at once,
 * until each has answered every item or deadline has passed. Past the
 * deadline a node gets only what it has sent already (bounded: a reply is
 * at most rc->values); one that has not answered whole is down, as is one
 * whose reply breaks the limits: a node trickling a byte at a time or
 * claiming a 4 GiB value holds a round no longer than the timeout and
 * costs no more memory than a valid value.
 */
static void round_io(struct redis_cluster *rc, struct batch *b, struct rc_io *io,
		     uint64_t t0, uint64_t deadline)
{
	struct pollfd p[RC_MAX_NODES];
	uint32_t who[RC_MAX_NODES];

	for (;;) {
		uint32_t np = 0;
		int ms, ready, perr;

		for (uint32_t k = 0; k < rc->nnodes; k++) {
			struct rc_node *n = &rc->nodes[k];
			int err;

			if (!io[k].busy)
				continue;
			err = node_take(rc, k, b, &io[k]);
			if (err) {
				node_items_down(rc, k, b, &io[k], err);
			} else if (io[k].j == io[k].m && !node_writing(n)) {
				io[k].busy = false;
			} else {
				p[np] = (struct pollfd){ .fd = n->c->fd, .events = POLLIN |
					(node_writing(n) ? POLLOUT : 0) };
				who[np++] = k;
				continue;
			}
			n->st.rounds++;
			n->st.latency_ns += mono_ns() - t0;
		}
		if (!np)
			return;
		ms = ms_left(deadline);
		ready = poll(p, np, ms);
		if (ready < 0 && errno == EINTR)
			continue;
		perr = ready < 0 ? -errno : 0; /* before a close below sets errno */
		for (uint32_t x = 0; x < np; x++) {
			struct rc_node *n = &rc->nodes[who[x]];
			int err = perr;

			if (!err && !p[x].revents)
				err = ms ? 0 : -ETIMEDOUT; /* past the deadline, and silent */
			if (!err && p[x].revents & POLLOUT)
				err = node_write(n, &io[who[x]].off);
			if (!err && p[x].revents & (POLLIN | POLLHUP | POLLERR))
				err = node_read(n, &rc->values);
			if (err) {
				node_items_down(rc, who[x], b, &io[who[x]], err);
				n->st.rounds++;
				n->st.latency_ns += mono_ns() - t0;
			}
		}
	}
}

static uint32_t batch_run(struct redis_cluster *rc, struct batch *b, uint32_t n)
{
	/* One deadline for the whole batch: the map, every round. */
	uint64_t deadline = mono_ns() + rc->timeout_ns;
	uint32_t done = 0;

	for (uint32_t i = 0; i < n; i++)
		b->it[i].status = RC_DOWN;
	if (!n || scratch(rc, n))
		return 0;
	if (rc->map_stale || !redis_cluster_mapped_slots(rc))
		map_refresh(rc, deadline);
	for (uint32_t i = 0; i < n; i++) {
		rc->target[i] = rc->slot[redis_cluster_slot(b->it[i].key, b->it[i].klen)];
		rc->ask[i] = 0;
	}
	/* A redirect round starts only while the deadline leaves time: a
	 * node asked past it could not answer in time, through no fault. */
	for (int round = 0; round < RC_MAX_ROUNDS && ms_left(deadline); round++) {
		struct rc_io io[RC_MAX_NODES];
		uint32_t off[RC_MAX_NODES + 1];
		uint64_t t0 = mono_ns();

		/* A redirect read this round can add a node (round_io walks
		 * every node): idle until the next round, not garbage. */
		memset(io, 0, sizeof(io));
		b->redirected = 0;
		round_lists(rc, n, off);
		/* Every node's pipeline goes out and every node's replies come
		 * in at once: a round costs the slowest node, not the sum. */
		for (uint32_t k = 0; k < rc->nnodes; k++) {
			io[k] = (struct rc_io){ .list = rc->list + off[k],
						.m = off[k + 1] - off[k] };
			if (io[k].m)
				node_queue(rc, k, b, &io[k], deadline);
		}
		round_io(rc, b, io, t0, deadline);
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
	uint64_t deadline = mono_ns() + rc->timeout_ns;
	int64_t sum = 0;

	if (rc->map_stale || !redis_cluster_mapped_slots(rc))
		map_refresh(rc, deadline);
	for (uint32_t k = 0; k < rc->nnodes; k++) {
		redisReply *r;
		bool routed = false;

		for (uint32_t s = 0; s < RC_SLOTS && !routed; s++)
			routed = rc->slot[s] == k;
		if (!routed)
			continue;
		r = node_command(&rc->nodes[k], &rc->values, deadline, "DBSIZE");
		if (!r)
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
