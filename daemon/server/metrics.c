/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - kvpoold's /metrics: the Prometheus text exposition format
 * (version 0.0.4) served by libmicrohttpd on its own thread.
 *
 * Names follow Prometheus' conventions: everything starts kvpool_, counters
 * end in _total, quantities are in base units (bytes, seconds). The pool
 * figures come from the one list of stats fields (KVP_STATS_FIELDS in
 * kvpool.h), per tenant and pool, under the metric names that list gives;
 * the operation counters and latency histograms from the workers' own
 * counters (metrics_ops.c). kvpoold(8) lists every family; the dashboard in
 * etc/grafana uses these names.
 *
 * libmicrohttpd rather than a few lines of HTTP by hand: the endpoint faces
 * whatever connects to it, and an HTTP parser is exactly the code that
 * should come from a library that is fuzzed and maintained for that.
 *
 * What libmicrohttpd does not bound, this file does (see the last part):
 * its connection timeout is an idle timeout, so a peer sending a byte of
 * a header every few seconds held a connection for good, and sixteen of
 * them kept every scrape out. Here a request must arrive whole within
 * HTTP_REQUEST_NS of its connection (or of the last reply on it), a reply
 * be taken within HTTP_REPLY_NS, at most HTTP_READING connections may be
 * sending a request at once (the oldest are closed for a new one) and at
 * most HTTP_PER_PEER come from one address: a scrape always gets a
 * connection and is answered within milliseconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "clock.h"
#include "kvpool_engine.h"
#include "log.h"
#include "metrics.h"
#include "redis_cluster.h"
#include "remote_tier.h"
#include "server.h"
#include "list.h" /* after server.h: its container_of is the one */

struct metrics_http;
static uint64_t metrics_http_slow_closed(struct metrics_http *h);

/* The opcodes' names (metrics_open); set before any thread reads it. */
static metrics_op_name_fn *ops_name;

/* ------------------------------------------------------------ writing */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*v, f);
	}
}

/* NAME{tenant="T",pool="P",gpu="G" (the caller adds its labels and the
 * value): G is the pool's device, its GPU ordinal (cuda) or devices entry;
 * a tensor-parallel pool's are its ranks' devices joined by '+' ("0+1"):
 * its frames exist on every one of them at once. */
static void series(FILE *f, const char *name, const struct tenants *ts,
		   const struct tenant *t, uint32_t pool)
{
	const struct pool_dev *pd = &ts->pools[pool];

	fprintf(f, "%s{tenant=\"", name);
	label_value(f, t->name);
	fprintf(f, "\",pool=\"%" PRIu32 "\",gpu=\"%d", pool, pd->device);
	for (uint32_t r = 1; r < ts->tp; r++)
		fprintf(f, "+%d", pd->rank_device[r]);
	fputc('"', f);
}

struct field {
	const char *name;
	size_t off;
	const char *kind;   /* "COUNTER", "GAUGE", "TIME" */
	const char *unit;   /* "bytes", "ns", "" */
	const char *metric;
	const char *help;
};

static const struct field fields[] = {
#define F(n, group, kind, unit, metric, help)				\
	{ #n, offsetof(struct kvp_stats, n), #kind, unit, metric, help },
	KVP_STATS_FIELDS(F)
#undef F
};
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static uint64_t field_value(const struct kvp_stats *st, const struct field *fd)
{
	uint64_t v;

	memcpy(&v, (const char *)st + fd->off, sizeof(v));
	return v;
}

/* kvpool_METRIC[_bytes|_seconds][_total] */
static void field_name(const struct field *fd, char *buf, size_t len)
{
	const char *suffix = !strcmp(fd->unit, "bytes") ? "_bytes" :
			     !strcmp(fd->unit, "ns") ? "_seconds" : "";

	snprintf(buf, len, "kvpool_%s%s%s", fd->metric, suffix,
		 !strcmp(fd->kind, "COUNTER") ? "_total" : "");
}

/* A field's value in its exported unit: ns become seconds. */
static void field_print(FILE *f, const struct field *fd, uint64_t v)
{
	if (!strcmp(fd->unit, "ns"))
		fprintf(f, " %.9f\n", (double)v / 1e9);
	else
		fprintf(f, " %" PRIu64 "\n", v);
}

/* Every tenant's every pool, as kvctl stats reads one: [tenant][pool]. */
static struct kvp_stats *pools_read(struct server *s)
{
	const struct tenants *ts = &s->tenants;
	struct kvp_stats *st = calloc((size_t)ts->n * ts->npools, sizeof(*st));

	if (!st)
		return NULL;
	for (uint32_t i = 0; i < ts->n; i++)
		for (uint32_t p = 0; p < ts->npools; p++)
			shard_set_stats(ts->v[i].pools[p].set, &st[i * ts->npools + p]);
	return st;
}

static void write_tiers(struct server *s, FILE *f, const struct kvp_stats *st)
{
	const struct tenants *ts = &s->tenants;
	uint64_t page = s->cfg->layout.page_bytes;

	family(f, "kvpool_tier_frames", "gauge",
	       "Frames (pages) of a tier, by state: used or free.");
	for (uint32_t i = 0; i < ts->n; i++)
		for (uint32_t p = 0; p < ts->npools; p++)
			for (uint32_t t = 0; t < KVP_TIERS; t++) {
				const struct kvp_tier_stats *x =
					&st[i * ts->npools + p].tier[t];

				series(f, "kvpool_tier_frames", ts, &ts->v[i], p);
				fprintf(f, ",tier=\"%s\",state=\"used\"} %" PRIu64 "\n",
					kvp_tier_name(t), x->frames_used);
				series(f, "kvpool_tier_frames", ts, &ts->v[i], p);
				fprintf(f, ",tier=\"%s\",state=\"free\"} %" PRIu64 "\n",
					kvp_tier_name(t), x->frames_free);
			}
	family(f, "kvpool_tier_capacity_bytes", "gauge", "Size of a tier.");
	for (uint32_t i = 0; i < ts->n; i++)
		for (uint32_t p = 0; p < ts->npools; p++)
			for (uint32_t t = 0; t < KVP_TIERS; t++) {
				series(f, "kvpool_tier_capacity_bytes", ts, &ts->v[i], p);
				fprintf(f, ",tier=\"%s\"} %" PRIu64 "\n", kvp_tier_name(t),
					st[i * ts->npools + p].tier[t].bytes_total);
			}
	family(f, "kvpool_tier_used_bytes", "gauge", "Bytes of a tier's used frames.");
	for (uint32_t i = 0; i < ts->n; i++)
		for (uint32_t p = 0; p < ts->npools; p++)
			for (uint32_t t = 0; t < KVP_TIERS; t++) {
				series(f, "kvpool_tier_used_bytes", ts, &ts->v[i], p);
				fprintf(f, ",tier=\"%s\"} %" PRIu64 "\n", kvp_tier_name(t),
					st[i * ts->npools + p].tier[t].frames_used * page);
			}
}

/* Every stats field per tenant and pool; clients and tenants, which the
 * daemon (not a pool) knows, are written by write_daemon. */
static void write_pools(struct server *s, FILE *f, const struct kvp_stats *st)
{
	const struct tenants *ts = &s->tenants;
	char name[96];

	for (size_t k = 0; k < NFIELDS; k++) {
		const struct field *fd = &fields[k];

		if (!strcmp(fd->name, "clients") || !strcmp(fd->name, "tenants"))
			continue;
		field_name(fd, name, sizeof(name));
		family(f, name, strcmp(fd->kind, "COUNTER") ? "gauge" : "counter",
		       fd->help);
		for (uint32_t i = 0; i < ts->n; i++)
			for (uint32_t p = 0; p < ts->npools; p++) {
				series(f, name, ts, &ts->v[i], p);
				fputc('}', f);
				field_print(f, fd, field_value(&st[i * ts->npools + p], fd));
			}
	}
}

static void write_daemon(struct server *s, FILE *f)
{
	const struct tenants *ts = &s->tenants;

	family(f, "kvpool_build_info", "gauge", "The kvpoold version, in a label; always 1.");
	fprintf(f, "kvpool_build_info{version=\"%d.%d\",backend=\"%s\"} 1\n",
		KVP_VERSION_MAJOR, KVP_VERSION_MINOR, ts->backend);
	family(f, "kvpool_clients", "gauge", "Attached clients of a tenant, all pools.");
	for (uint32_t i = 0; i < ts->n; i++) {
		fputs("kvpool_clients{tenant=\"", f);
		label_value(f, ts->v[i].name);
		fprintf(f, "\"} %" PRIu32 "\n",
			__atomic_load_n(&ts->v[i].clients, __ATOMIC_RELAXED));
	}
	family(f, "kvpool_clients_attached", "gauge",
	       "Attached clients, admin-only ones included.");
	fprintf(f, "kvpool_clients_attached %" PRIu32 "\n",
		__atomic_load_n(&s->reg.live, __ATOMIC_RELAXED));
	family(f, "kvpool_tenants", "gauge", "Tenants configured.");
	fprintf(f, "kvpool_tenants %" PRIu32 "\n", ts->n);
	family(f, "kvpool_workers", "gauge", "Worker threads polling the rings.");
	fprintf(f, "kvpool_workers %" PRIu32 "\n", s->nworkers);
	if (s->http) {
		family(f, "kvpool_metrics_slow_closed_total", "counter",
		       "/metrics connections closed for sending a request too slowly "
		       "(or taking a reply too slowly), or as the oldest of too many.");
		fprintf(f, "kvpool_metrics_slow_closed_total %" PRIu64 "\n",
			metrics_http_slow_closed(s->http));
	}
}

/* The remote tier's figures (REMOTE_TIER_FIELDS), then each store node's
 * (REMOTE_NODE_FIELDS) labelled node="host:port"; nothing without one. */
static void write_remote(struct server *s, FILE *f)
{
	static const struct field tier[] = {
#define F(n, kind, unit, metric, help) \
	{ #n, offsetof(struct remote_tier_stats, n), #kind, unit, metric, help },
		REMOTE_TIER_FIELDS(F)
#undef F
	};
	static const struct field node[] = {
#define F(n, kind, unit, metric, help) \
	{ #n, offsetof(struct rc_node_stats, n), #kind, unit, metric, help },
		REMOTE_NODE_FIELDS(F)
#undef F
	};
	struct remote_tier *rt = s->tenants.remote;
	struct rc_node_stats ns[RC_MAX_NODES];
	struct remote_tier_stats st;
	char name[128];
	uint64_t v;

	if (!rt)
		return;
	remote_tier_stats(rt, &st);
	for (size_t i = 0; i < sizeof(tier) / sizeof(tier[0]); i++) {
		field_name(&tier[i], name, sizeof(name));
		family(f, name, strcmp(tier[i].kind, "COUNTER") ? "gauge" : "counter",
		       tier[i].help);
		memcpy(&v, (const char *)&st + tier[i].off, sizeof(v));
		fputs(name, f);
		field_print(f, &tier[i], v);
	}
	for (uint32_t k = 0; k < st.nodes; k++)
		if (!remote_tier_node_stats(rt, k, &ns[k]))
			st.nodes = k;
	family(f, "kvpool_remote_node_up", "gauge",
	       "1 while a store node answers, 0 after it failed (tried again each second).");
	for (uint32_t k = 0; k < st.nodes; k++) {
		fputs("kvpool_remote_node_up{node=\"", f);
		label_value(f, ns[k].addr);
		fprintf(f, "\"} %d\n", ns[k].up);
	}
	for (size_t i = 0; i < sizeof(node) / sizeof(node[0]); i++) {
		field_name(&node[i], name, sizeof(name));
		family(f, name, "counter", node[i].help);
		for (uint32_t k = 0; k < st.nodes; k++) {
			memcpy(&v, (const char *)&ns[k] + node[i].off, sizeof(v));
			fprintf(f, "%s{node=\"", name);
			label_value(f, ns[k].addr);
			fputs("\"}", f);
			field_print(f, &node[i], v);
		}
	}
}

/* Every worker's counters summed. */
static void ops_sum(const struct server *s, struct op_metrics *sum)
{
	uint64_t *d = (uint64_t *)sum;

	memset(sum, 0, sizeof(*sum));
	for (uint32_t w = 0; w < s->nopm; w++) {
		const uint64_t *v = (const uint64_t *)&s->opm[w];

		for (size_t k = 0; k < sizeof(*sum) / sizeof(uint64_t); k++)
			d[k] += __atomic_load_n(&v[k], __ATOMIC_RELAXED);
	}
}

/* One histogram series of latency kind k (m->lat[k], m->lat_ns[k]), the
 * buckets cumulative as Prometheus wants them, labelled label="value". */
static void histogram(FILE *f, const char *name, const char *label,
		      const char *value, const struct op_metrics *m, uint32_t k)
{
	uint64_t cum = 0;

	for (uint32_t b = 0; b <= METRICS_BUCKETS; b++) {
		cum += m->lat[k][b];
		if (b < METRICS_BUCKETS)
			fprintf(f, "%s_bucket{%s=\"%s\",le=\"%g\"} %" PRIu64 "\n", name,
				label, value, (double)metrics_bucket_ns[b] / 1e9, cum);
		else
			fprintf(f, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
				name, label, value, cum);
	}
	fprintf(f, "%s_sum{%s=\"%s\"} %.9f\n", name, label, value,
		(double)m->lat_ns[k] / 1e9);
	fprintf(f, "%s_count{%s=\"%s\"} %" PRIu64 "\n", name, label, value, cum);
}

/* kvpool.h, struct kvp_ring_phases: where a ring prepare's time goes. */
static void write_phases(FILE *f, const struct op_metrics *m)
{
	static const char *const name[KVP_PHASES] = {
		"queue", "execute", "publish", "wake",
	};

	family(f, "kvpool_ring_prepare_phase_seconds", "histogram",
	       "Ring entries carrying a prepare, answered in the pass that took "
	       "them, by phase: queue (client submit to worker pickup), execute, "
	       "publish (to the completion's publication), wake (to the client "
	       "reaping it).");
	for (uint32_t p = 0; p < KVP_PHASES; p++)
		histogram(f, "kvpool_ring_prepare_phase_seconds", "phase", name[p],
			  m, LAT_PH_QUEUE + p);
}

static void write_ops(FILE *f, const struct op_metrics *m)
{
	static const char *const lat_op[LAT_KINDS] = {
		[LAT_PREPARE] = "prepare", [LAT_COMMIT] = "commit",
		[LAT_OFFLOAD] = "offload", [LAT_ONLOAD] = "onload",
	};

	family(f, "kvpool_ops_total", "counter",
	       "Operations served (rings and uds), failed ones included.");
	for (uint32_t op = 0; op < KVP_OP_MAX; op++)
		if (ops_name(op))
			fprintf(f, "kvpool_ops_total{op=\"%s\"} %" PRIu64 "\n",
				ops_name(op), m->ops[op]);
	family(f, "kvpool_op_errors_total", "counter",
	       "Operations that failed, by errno (error=\"other\": any other).");
	for (uint32_t op = 0; op < KVP_OP_MAX; op++)
		for (uint32_t k = 0; k < METRICS_ERR_KINDS; k++) {
			if (!ops_name(op) || !m->errors[op][k])
				continue; /* a series appears with its first error */
			fprintf(f, "kvpool_op_errors_total{op=\"%s\",error=\"%s\"} %"
				PRIu64 "\n", ops_name(op), k == METRICS_ERR_OTHER ?
				"other" : strerrorname_np(metrics_err_errno[k]),
				m->errors[op][k]);
		}
	family(f, "kvpool_op_duration_seconds", "histogram",
	       "Latency in the daemon: prepare, commit and offload from the "
	       "submission's start to its completion; onload from the prepare to "
	       "the completion that waited for the copy.");
	for (uint32_t k = 0; k < LAT_OPS; k++)
		histogram(f, "kvpool_op_duration_seconds", "op", lat_op[k], m, k);
	write_phases(f, m);
}

int metrics_write(struct server *s, FILE *f)
{
	struct kvp_stats *st = pools_read(s);
	struct op_metrics *sum = malloc(sizeof(*sum));

	if (!st || !sum) {
		free(st);
		free(sum);
		return -ENOMEM;
	}
	write_daemon(s, f);
	metrics_write_process(s, f);
	write_tiers(s, f, st);
	write_pools(s, f, st);
	write_remote(s, f);
	ops_sum(s, sum);
	write_ops(f, sum);
	free(st);
	free(sum);
	return ferror(f) ? -EIO : 0;
}

void metrics_status_line(struct server *s, char *buf, size_t len)
{
	const struct tenants *ts = &s->tenants;
	uint64_t used[KVP_TIERS] = { 0 }, total[KVP_TIERS] = { 0 };
	struct kvp_stats *st = pools_read(s);

	for (uint32_t k = 0; st && k < ts->n * ts->npools; k++)
		for (uint32_t t = 0; t < KVP_TIERS; t++) {
			used[t] += st[k].tier[t].frames_used;
			total[t] += st[k].tier[t].frames_total;
		}
	free(st);
	snprintf(buf, len, "serving %s: %" PRIu32 " client(s), %" PRIu32
		 " tenant(s); device %" PRIu64 "/%" PRIu64 " frames used, host %"
		 PRIu64 "/%" PRIu64, s->cfg->socket,
		 __atomic_load_n(&s->reg.live, __ATOMIC_RELAXED), ts->n,
		 used[KVP_TIER_DEVICE], total[KVP_TIER_DEVICE],
		 used[KVP_TIER_HOST], total[KVP_TIER_HOST]);
}

void metrics_latency(struct server *s, struct kvp_latency *out)
{
	static const enum metrics_lat map[KVP_LAT_OPS] = {
		[KVP_LAT_PREPARE] = LAT_PREPARE, [KVP_LAT_COMMIT] = LAT_COMMIT,
		[KVP_LAT_OFFLOAD] = LAT_OFFLOAD, [KVP_LAT_ONLOAD] = LAT_ONLOAD,
	};
	struct op_metrics *sum = malloc(sizeof(*sum));

	_Static_assert(KVP_LAT_BUCKETS == METRICS_BUCKETS + 1,
		       "kvp_latency has the daemon's buckets and +Inf");
	/* Someone looks: time operations from now on (metrics.h). */
	__atomic_store_n(&metrics_timing, true, __ATOMIC_RELAXED);
	memset(out, 0, sizeof(*out));
	for (uint32_t b = 0; b < METRICS_BUCKETS; b++)
		out->bucket_ns[b] = metrics_bucket_ns[b];
	out->bucket_ns[METRICS_BUCKETS] = UINT64_MAX;
	if (!sum)
		return; /* empty histograms: nothing to show, nothing wrong */
	ops_sum(s, sum);
	for (uint32_t k = 0; k < KVP_LAT_OPS; k++) {
		for (uint32_t b = 0; b < KVP_LAT_BUCKETS; b++) {
			out->op[k].buckets[b] = sum->lat[map[k]][b];
			out->op[k].count += sum->lat[map[k]][b];
		}
		out->op[k].sum_ns = sum->lat_ns[map[k]];
	}
	free(sum);
}

void metrics_phases(struct server *s, struct kvp_ring_phases *out)
{
	struct op_metrics *sum = malloc(sizeof(*sum));

	_Static_assert(LAT_PH_WAKE - LAT_PH_QUEUE + 1 == KVP_PHASES,
		       "one histogram per kvp_phase");
	__atomic_store_n(&metrics_timing, true, __ATOMIC_RELAXED);
	memset(out, 0, sizeof(*out));
	for (uint32_t b = 0; b < METRICS_BUCKETS; b++)
		out->bucket_ns[b] = metrics_bucket_ns[b];
	out->bucket_ns[METRICS_BUCKETS] = UINT64_MAX;
	if (!sum)
		return;
	ops_sum(s, sum);
	for (uint32_t p = 0; p < KVP_PHASES; p++) {
		for (uint32_t b = 0; b < KVP_LAT_BUCKETS; b++) {
			out->phase[p].buckets[b] = sum->lat[LAT_PH_QUEUE + p][b];
			out->phase[p].count += sum->lat[LAT_PH_QUEUE + p][b];
		}
		out->phase[p].sum_ns = sum->lat_ns[LAT_PH_QUEUE + p];
	}
	free(sum);
}

/* ------------------------------------------------------------ serving */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status,
			     char *body, size_t len, bool owned,
			     const char *type)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body,
		owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (!r) {
		if (owned)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* ------------------------------------------------------------ connections */

#define HTTP_CONNS 64          /* libmicrohttpd's limit on connections */
#define HTTP_PER_PEER 4        /* from one address */
#define HTTP_READING 16        /* sending a request at once */
#define HTTP_REQUEST_NS (3ull * 1000000000)  /* to send a whole request */
#define HTTP_REPLY_NS (10ull * 1000000000)   /* to take a reply */
#define HTTP_IDLE_S 10u        /* libmicrohttpd's own: no byte either way */
#define HTTP_TICK_MS 250       /* how often the deadlines are looked at */

/* One connection, from libmicrohttpd's start notice to its close notice. */
struct http_conn {
	struct list_head link;   /* oldest first */
	int fd;
	uint64_t since;          /* accepted, or its last reply taken */
	bool busy;               /* its request is whole: being answered */
	bool closing;            /* shut down; libmicrohttpd closes it next */
};

/*
 * The server: libmicrohttpd in its external epoll mode on a thread of
 * ours, so that between two MHD_run() the thread can close connections
 * that are past their deadline (shutdown() on a descriptor libmicrohttpd
 * cannot be closing at that moment; it sees the end and closes it). Every
 * callback runs on that thread: nothing here is shared but stop and the
 * counter a scrape reads (written and read on the thread too).
 */
struct metrics_http {
	struct MHD_Daemon *d;
	pthread_t th;
	int stop;
	struct list_head conns;
	uint64_t slow_closed;
};

static uint64_t metrics_http_slow_closed(struct metrics_http *h)
{
	return __atomic_load_n(&h->slow_closed, __ATOMIC_RELAXED);
}

static void on_connection(void *arg, struct MHD_Connection *conn, void **ctx,
			  enum MHD_ConnectionNotificationCode code)
{
	struct metrics_http *h = arg;
	struct http_conn *c = *ctx;
	const union MHD_ConnectionInfo *i;

	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (c) {
			list_del(&c->link);
			free(c);
		}
		*ctx = NULL;
		return;
	}
	i = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!i)
		return;
	c = calloc(1, sizeof(*c));
	if (!c) {
		shutdown(i->connect_fd, SHUT_RDWR); /* one we could not bound */
		return;
	}
	c->fd = i->connect_fd;
	c->since = mono_ns();
	list_add_tail(&c->link, &h->conns);
	*ctx = c;
}

/* The connection's request is whole (busy) or its reply taken (not). */
static void conn_busy(struct MHD_Connection *conn, bool busy)
{
	const union MHD_ConnectionInfo *i =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *c = i ? i->socket_context : NULL;

	if (!c)
		return;
	c->busy = busy;
	c->since = mono_ns();
}

static void on_completed(void *arg, struct MHD_Connection *conn, void **req_ctx,
			 enum MHD_RequestTerminationCode why)
{
	(void)arg, (void)req_ctx, (void)why;
	conn_busy(conn, false);
}

/* Close what is past its deadline, then the oldest of those still
 * sending a request while more than HTTP_READING do. */
static void http_sweep(struct metrics_http *h)
{
	uint64_t now = mono_ns();
	uint32_t reading = 0;
	struct http_conn *c;

	list_for_each_entry(c, &h->conns, link)
		reading += !c->busy && !c->closing;
	list_for_each_entry(c, &h->conns, link) {
		uint64_t limit = c->busy ? HTTP_REPLY_NS : HTTP_REQUEST_NS;

		if (c->closing ||
		    (now - c->since <= limit && (c->busy || reading <= HTTP_READING)))
			continue;
		shutdown(c->fd, SHUT_RDWR);
		c->closing = true;
		reading -= !c->busy;
		__atomic_store_n(&h->slow_closed, h->slow_closed + 1, __ATOMIC_RELAXED);
	}
}

static void *http_thread(void *arg)
{
	struct metrics_http *h = arg;
	const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
	struct pollfd p = { .fd = i ? i->epoll_fd : -1, .events = POLLIN };

	while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) {
		MHD_UNSIGNED_LONG_LONG ms;
		int wait = HTTP_TICK_MS;

		if (MHD_get_timeout(h->d, &ms) == MHD_YES && ms < (unsigned)wait)
			wait = (int)ms;
		poll(&p, 1, wait);
		MHD_run(h->d);
		http_sweep(h);
	}
	return NULL;
}

/* ------------------------------------------------------------ serving */

#define TEXT "text/plain; charset=utf-8"

static enum MHD_Result on_request(void *arg, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_len, void **ctx)
{
	static char not_found[] = "kvpoold serves /metrics only\n";
	static char bad_method[] = "use GET\n";
	struct server *s = arg;
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	conn_busy(conn, true);
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, bad_method,
			     sizeof(bad_method) - 1, false, TEXT);
	if (strcmp(url, "/metrics"))
		return reply(conn, MHD_HTTP_NOT_FOUND, not_found,
			     sizeof(not_found) - 1, false, TEXT);
	f = open_memstream(&buf, &len);
	if (!f)
		return MHD_NO;
	if (metrics_write(s, f) < 0 || fclose(f)) {
		free(buf);
		return MHD_NO;
	}
	return reply(conn, MHD_HTTP_OK, buf, len, true,
		     "text/plain; version=0.0.4; charset=utf-8");
}

int metrics_open(struct server *s, metrics_op_name_fn *op_name,
		 struct errbuf *e)
{
	ops_name = op_name;
	s->opm = aligned_alloc(64, sizeof(*s->opm) * s->cfg->workers);
	if (!s->opm)
		return errbuf_set(e, -ENOMEM, "metrics: out of memory");
	memset(s->opm, 0, sizeof(*s->opm) * s->cfg->workers);
	s->nopm = s->cfg->workers;
	if (s->cfg->metrics)
		__atomic_store_n(&metrics_timing, true, __ATOMIC_RELAXED);
	return 0;
}

static void http_free(struct metrics_http *h)
{
	if (h->d)
		MHD_stop_daemon(h->d); /* its close notices free the connections */
	free(h);
}

int metrics_serve(struct server *s, struct errbuf *e)
{
	const struct config *cfg = s->cfg;
	const union MHD_DaemonInfo *info;
	struct metrics_http *h;
	int ret;

	if (!cfg->metrics)
		return 0;
	h = calloc(1, sizeof(*h));
	if (!h)
		return errbuf_set(e, -ENOMEM, "metrics: out of memory");
	INIT_LIST_HEAD(&h->conns);
	/* One thread answers every scrape in turn: a scrape is a few
	 * milliseconds, and scrapers come every few seconds. */
	h->d = MHD_start_daemon(MHD_USE_EPOLL, 0, NULL, NULL, on_request, s,
				MHD_OPTION_SOCK_ADDR,
				(const struct sockaddr *)&cfg->metrics_addr,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONNS,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)HTTP_PER_PEER,
				MHD_OPTION_CONNECTION_TIMEOUT, HTTP_IDLE_S,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
				MHD_OPTION_END);
	if (!h->d) {
		http_free(h);
		return errbuf_set(e, -EADDRNOTAVAIL, "metrics = %s: cannot listen there "
				  "(address in use or not this host's?); pick another "
				  "ADDR:PORT or leave --metrics out", cfg->metrics);
	}
	/* The port it bound: the one asked for, or the kernel's pick for 0. */
	info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	ret = -pthread_create(&h->th, NULL, http_thread, h);
	if (ret) {
		http_free(h);
		return errbuf_set(e, ret, "metrics: cannot start its thread: %s",
				  strerror(-ret));
	}
	s->http = h;
	log_info("metrics: serving http://%.*s:%u/metrics",
		 (int)(strrchr(cfg->metrics, ':') - cfg->metrics), cfg->metrics,
		 info ? (unsigned)info->port : 0);
	return 0;
}

void metrics_close(struct server *s)
{
	struct metrics_http *h = s->http;

	if (h) {
		__atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
		pthread_join(h->th, NULL);
		http_free(h);
	}
	s->http = NULL;
	free(s->opm);
	s->opm = NULL;
	s->nopm = 0;
}
