/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: all of it is the one remote thread's state. */
/*
 * remote_tier.c - the remote tier's queue, fetches and thread
 * (remote_tier.h). The thread owns the cluster client: nothing else
 * touches the network.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "clock.h"
#include "list.h"
#include "redis_cluster.h"
#include "remote_tier.h"
#include "remote_value.h"

#define PUT_BATCH 32                  /* pages per pipelined SET batch */
#define BATCH_BYTES (16ull << 20)     /* values in one batch to the store, at most */
#define KEEP_FREED_BYTES (512ull << 20) /* heap glibc keeps for the next fetch */
#define FETCH_KEEP_NS 10000000000ull  /* a fetch nobody took: freed after 10 s */

enum fetch_state { F_QUEUED, F_RUNNING, F_DONE };

struct remote_fetch {
	struct list_head link;
	struct remote_key *keys;
	uint32_t n, got;         /* got: leading pages fetched and checked */
	/* A record's fetch (remote_tier_fetch_rec): keys[0] is the record,
	 * and once it is back, expand names the pages that follow it, at most
	 * max of them (n grows, under the tier's mutex). */
	remote_expand_fn expand;
	uint32_t max;
	void **bufs;             /* [n]: what to free: a reply taken, or a decoded page */
	const void **pages;      /* [n]: page i's bytes (in bufs[i]) or NULL */
	int state;               /* enum fetch_state */
	bool stale;              /* a write of keys[0] was queued since: freed
				  * when done, never handed out */
	uint64_t done_ns;        /* its rounds ended (F_DONE) */
	uint64_t taken_ns;       /* the engine took it (remote_fetch_done: onloaded) */
};

struct put_item {
	struct list_head link;
	struct remote_key k;
	uint64_t len;            /* bytes of page[]: a page, a record, 0 for a DEL */
	bool del;                /* DEL k instead of SET */
	unsigned char page[];
};

struct remote_tier {
	pthread_mutex_t mu;
	pthread_cond_t wake;     /* the thread: work queued, or stop */
	pthread_cond_t done;     /* waiters: a fetch is over, or the queue empty */
	pthread_t th;
	bool stop, busy;
	struct redis_cluster *rc;        /* the thread's */
	struct disk_codec codec;
	struct disk_codec_ctx *cx;       /* the thread's */
	uint64_t page_bytes;
	struct list_head puts, fetches;
	struct put_item **writing;       /* the batch the thread writes now */
	uint32_t nwriting;
	uint64_t queued_recs;            /* records and DELs queued or being written */
	uint64_t queued_bytes, queue_cap;
	bool user_histories;
	struct remote_tier_stats st;
	struct rc_node_stats nodes[RC_MAX_NODES];
	void (*log)(int prio, const char *msg);
};

static void tier_log(struct remote_tier *rt, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void tier_log(struct remote_tier *rt, int prio, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (rt->log)
		rt->log(prio, msg);
	else
		fprintf(stderr, "kvpool remote: %s\n", msg);
}

static bool key_eq(const struct remote_key *a, const struct remote_key *b)
{
	return a->kind == b->kind && a->layout_id == b->layout_id &&
	       a->tenant == b->tenant && a->page == b->page &&
	       !memcmp(a->hash, b->hash, 32);
}

static void fetch_free(struct remote_fetch *f)
{
	for (uint32_t i = 0; f->bufs && i < f->n; i++)
		free(f->bufs[i]);
	free(f->bufs);
	free(f->pages);
	free(f->keys);
	free(f);
}

/* ------------------------------------------------------------ the thread */

struct fetch_ctx {
	struct remote_tier *rt;
	struct remote_fetch *f;
	uint32_t base;           /* the round's first key */
	uint64_t bad;
};

static void on_value(void *arg, uint32_t j, char **val, size_t len)
{
	struct fetch_ctx *x = arg;
	struct remote_tier *rt = x->rt;
	uint32_t i = x->base + j;
	const void *in_place = remote_value_page(&x->f->keys[i], *val, len, rt->page_bytes);
	void *page;

	if (in_place) {
		/* Stored as is and checked: the reply is kept, not copied. */
		x->f->bufs[i] = *val;
		x->f->pages[i] = in_place;
		*val = NULL;
		return;
	}
	page = malloc(rt->page_bytes);
	if (page && !remote_value_decode(rt->cx, &x->f->keys[i], *val, len, page,
					 rt->page_bytes)) {
		x->f->bufs[i] = page;
		x->f->pages[i] = page;
		return;
	}
	free(page);
	x->bad += page != NULL; /* damaged, another key's or layout's: dropped */
}

/*
 * Pages in one batch to the store: BATCH_BYTES of the longest values, at
 * least one. A batch has remote_timeout_ms as a whole (redis_cluster.h),
 * so a long run goes as several, each short enough for a healthy node
 * over a slow link; a node that holds one past its deadline is down, and
 * the next batches do not wait on it.
 */
static uint32_t batch_pages(const struct remote_tier *rt)
{
	uint64_t k = BATCH_BYTES / remote_value_max(rt->page_bytes);

	return k ? (uint32_t)(k < PUT_BATCH * 64 ? k : PUT_BATCH * 64) : 1;
}

/* One batch of GETs for keys [from, to). */
static void fetch_batch(struct remote_tier *rt, struct remote_fetch *f, uint32_t from,
			uint32_t to)
{
	uint32_t n = to - from, hits = 0;
	struct fetch_ctx x = { .rt = rt, .f = f, .base = from };
	struct rc_item *it = calloc(n, sizeof(*it));
	char (*keys)[REMOTE_KEY_MAX] = malloc((size_t)n * REMOTE_KEY_MAX);

	if (it && keys) {
		for (uint32_t i = 0; i < n; i++) {
			it[i].key = keys[i];
			it[i].klen = remote_key_format(&f->keys[from + i], keys[i]);
		}
		hits = redis_cluster_get(rt->rc, it, n, on_value, &x);
	}
	while (f->got < f->n && f->pages[f->got])
		f->got++;
	free(it);
	free(keys);
	pthread_mutex_lock(&rt->mu);
	rt->st.fetch_hits += hits - x.bad;
	rt->st.bad_values += x.bad;
	pthread_mutex_unlock(&rt->mu);
	if (x.bad)
		tier_log(rt, LOG_WARNING, "remote: %" PRIu64 " fetched pages failed "
			 "their checksum or named another page; dropped (recomputed)",
			 x.bad);
}

/* Keys [from, f->n) in batches of batch_pages(), until one leaves a gap:
 * only the leading pages of a run are used. */
static void fetch_round(struct remote_tier *rt, struct remote_fetch *f, uint32_t from)
{
	uint32_t k = batch_pages(rt);

	for (uint32_t s = from; s < f->n && f->got >= s; s += k)
		fetch_batch(rt, f, s, f->n - s > k ? s + k : f->n);
}

/* The keys of the pages record f->pages[0] names, after it: false when it
 * names none or there is no memory for them (the fetch ends with the
 * record alone). Under the tier's mutex: fetch_find reads keys[0]. */
static bool fetch_expand(struct remote_tier *rt, struct remote_fetch *f)
{
	struct remote_key *keys;
	const void **pages;
	void **bufs;
	uint8_t hash[32];
	uint32_t m = f->expand(&f->keys[0], f->pages[0], rt->page_bytes, hash);

	if (!m || m > f->max)
		return false;
	keys = realloc(f->keys, (1 + (size_t)m) * sizeof(*keys));
	if (keys)
		f->keys = keys;
	pages = keys ? realloc(f->pages, (1 + (size_t)m) * sizeof(*pages)) : NULL;
	if (pages)
		f->pages = pages;
	bufs = pages ? realloc(f->bufs, (1 + (size_t)m) * sizeof(*bufs)) : NULL;
	if (!bufs)
		return false;
	f->bufs = bufs;
	for (uint32_t i = 1; i <= m; i++) {
		f->keys[i] = f->keys[0];
		memcpy(f->keys[i].hash, hash, 32);
		f->keys[i].page = i - 1;
		f->pages[i] = NULL;
		f->bufs[i] = NULL;
	}
	f->n = 1 + m;
	rt->st.fetch_pages += m;
	return true;
}

/* A fetch: its keys in one round; a record's, the record and then, in a
 * second round, the pages it names. */
static void fetch_run(struct remote_tier *rt, struct remote_fetch *f)
{
	bool more;

	fetch_round(rt, f, 0);
	if (!f->expand || f->got != 1)
		return;
	pthread_mutex_lock(&rt->mu);
	more = fetch_expand(rt, f);
	pthread_mutex_unlock(&rt->mu);
	if (more)
		fetch_round(rt, f, 1);
}

static void puts_run(struct remote_tier *rt, struct put_item **p, uint32_t n)
{
	struct rc_item it[PUT_BATCH];
	char keys[PUT_BATCH][REMOTE_KEY_MAX];
	void *vals[PUT_BATCH] = { 0 };
	uint32_t ok = 0, m = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (!p[i]->del && !(vals[m] = malloc(remote_value_max(p[i]->len))))
			continue;
		it[m] = (struct rc_item){ .key = keys[m],
					  .klen = remote_key_format(&p[i]->k, keys[m]) };
		it[m].val = vals[m]; /* NULL: a DEL */
		if (!p[i]->del)
			it[m].vlen = remote_value_encode(rt->cx, &rt->codec, &p[i]->k,
							 p[i]->page, p[i]->len, vals[m]);
		m++;
	}
	for (uint32_t s = 0, k = batch_pages(rt); s < m; s += k)
		ok += redis_cluster_set(rt->rc, it + s, m - s > k ? k : m - s);
	for (uint32_t i = 0; i < m; i++)
		free(vals[i]);
	pthread_mutex_lock(&rt->mu);
	rt->st.written_pages += ok;
	rt->st.write_errors += n - ok;
	pthread_mutex_unlock(&rt->mu);
}

/* The nodes' figures for /metrics; a node newly timed out or refused for
 * its reply is logged (at most once a second each: it is down that long). */
static void nodes_snapshot(struct remote_tier *rt)
{
	uint32_t was = rt->st.nodes;

	rt->st.nodes = redis_cluster_nodes(rt->rc);
	for (uint32_t i = 0; i < rt->st.nodes; i++) {
		struct rc_node_stats st;

		redis_cluster_node_stats(rt->rc, i, &st);
		if (i < was && st.timeouts > rt->nodes[i].timeouts)
			tier_log(rt, LOG_WARNING, "store node %s did not answer a batch whole "
				 "within remote_timeout_ms: its pages are misses, and it is "
				 "not asked for a second", st.addr);
		if (i < was && st.bad_replies > rt->nodes[i].bad_replies)
			tier_log(rt, LOG_WARNING, "store node %s sent a reply past the "
				 "limits (a value longer than %" PRIu64 " bytes, an array, or "
				 "not RESP): refused at its header, the node not asked for "
				 "a second", st.addr, remote_value_max(rt->page_bytes));
		rt->nodes[i] = st;
	}
}

static void expire_fetches(struct remote_tier *rt)
{
	struct remote_fetch *f, *t;
	uint64_t now = mono_ns();

	list_for_each_entry_safe(f, t, &rt->fetches, link)
		if (f->state == F_DONE && now - f->done_ns > FETCH_KEEP_NS) {
			list_del(&f->link);
			fetch_free(f);
		}
}

static void *remote_thread(void *arg)
{
	struct remote_tier *rt = arg;
	struct put_item *batch[PUT_BATCH];

	pthread_mutex_lock(&rt->mu);
	for (;;) {
		struct remote_fetch *f, *next = NULL;
		uint32_t n = 0;

		/* Fetches first: a lookup is waiting for them. */
		list_for_each_entry(f, &rt->fetches, link)
			if (f->state == F_QUEUED) {
				next = f;
				break;
			}
		if (next && !rt->stop) {
			uint64_t t0 = mono_ns();

			next->state = F_RUNNING;
			rt->busy = true;
			pthread_mutex_unlock(&rt->mu);
			fetch_run(rt, next);
			pthread_mutex_lock(&rt->mu);
			next->state = F_DONE;
			next->done_ns = mono_ns();
			rt->st.fetch_ns += next->done_ns - t0;
			if (next->stale) {
				list_del(&next->link);
				fetch_free(next);
			}
			nodes_snapshot(rt);
			pthread_cond_broadcast(&rt->done);
			continue;
		}
		while (n < PUT_BATCH && !list_empty(&rt->puts)) {
			batch[n] = list_first_entry(&rt->puts, struct put_item, link);
			list_del(&batch[n++]->link);
		}
		if (n) {
			rt->busy = true;
			rt->writing = batch;
			rt->nwriting = n;
			pthread_mutex_unlock(&rt->mu);
			puts_run(rt, batch, n);
			pthread_mutex_lock(&rt->mu);
			rt->nwriting = 0;
			for (uint32_t i = 0; i < n; i++) {
				rt->queued_bytes -= batch[i]->len;
				rt->queued_recs -= batch[i]->k.page == REMOTE_PAGE_REC;
				free(batch[i]);
			}
			nodes_snapshot(rt);
			continue;
		}
		rt->busy = false;
		pthread_cond_broadcast(&rt->done);
		if (rt->stop)
			break;
		expire_fetches(rt);
		{
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&rt->wake, &rt->mu, &ts);
		}
	}
	pthread_mutex_unlock(&rt->mu);
	return NULL;
}

/* ------------------------------------------------------------ open/close */

/*
 * A fetch keeps every value of its run (250 values of 2 MiB for 4,000
 * Llama-3-8B tokens) until the engine has copied them, so glibc serves
 * each with a fresh mmap that page-faults as hiredis fills it: a round
 * took 1.8x raw GETs of the same values on the H100 machine (kvbench
 * remote's split, bench/results/remote-2026-11-27.md), where raw GETs free
 * each value and get the same memory back. Values up to a page come from
 * the heap instead, and up to KEEP_FREED_BYTES of it stays with the
 * process once freed, faulted in for the next round (the same run on
 * the 2-core VM: store rounds 0.41 s against raw GETs' 0.28-0.42 s, from
 * 0.55-0.65 s). Process-wide, set
 * only where there is a remote tier; pages over glibc's limit for this
 * (32 MiB) are left as they were.
 */
static void heap_for_values(uint64_t page_bytes)
{
	uint64_t v = remote_value_max(page_bytes) + 4096;

	if (v > (32ull << 20))
		return;
	if (v > 128 * 1024)
		mallopt(M_MMAP_THRESHOLD, (int)v);
	mallopt(M_TRIM_THRESHOLD, (int)KEEP_FREED_BYTES);
	/* A heap grows 64 MiB at a time (address space; RSS only as
	 * touched): a round's values take few heap extensions. */
	mallopt(M_TOP_PAD, 64 << 20);
}

int remote_tier_open(struct remote_tier **out, const struct remote_tier_config *c,
		     struct errbuf *e)
{
	struct remote_tier *rt;
	char err[128];
	int ret;

	rt = calloc(1, sizeof(*rt));
	if (!rt)
		return errbuf_set(e, -ENOMEM, "remote tier: out of memory");
	if (disk_codec_parse(c->codec ? c->codec : "none", &rt->codec, err, sizeof(err))) {
		free(rt);
		return errbuf_set(e, -EINVAL, "remote tier: %s", err);
	}
	rt->codec.elem_bytes = c->layout.elem_bytes;
	rt->page_bytes = c->layout.page_bytes;
	rt->queue_cap = c->queue_bytes ? c->queue_bytes : 64ull << 20;
	rt->user_histories = c->user_histories;
	rt->log = c->log;
	INIT_LIST_HEAD(&rt->puts);
	INIT_LIST_HEAD(&rt->fetches);
	ret = redis_cluster_open(&rt->rc, c->url, c->timeout_ms ? c->timeout_ms : 500, e);
	if (ret) {
		free(rt);
		return ret;
	}
	/* Nothing longer is ever stored (a record is at most a page; a
	 * compressed page is shorter): a node that says a reply is longer is
	 * refused at its header. */
	redis_cluster_limit_values(rt->rc, remote_value_max(rt->page_bytes));
	if (!redis_cluster_mapped_slots(rt->rc))
		tier_log(rt, LOG_WARNING, "remote %s: no seed answered CLUSTER SLOTS "
			 "yet; pages are misses until one does (is the cluster up "
			 "and formed?)", c->url);
	else if (redis_cluster_mapped_slots(rt->rc) < RC_SLOTS)
		tier_log(rt, LOG_WARNING, "remote %s: %u of %u slots are served; "
			 "keys of the others are misses", c->url,
			 redis_cluster_mapped_slots(rt->rc), RC_SLOTS);
	heap_for_values(rt->page_bytes);
	rt->cx = disk_codec_ctx_new(rt->page_bytes);
	if (!rt->cx) {
		redis_cluster_close(rt->rc);
		free(rt);
		return errbuf_set(e, -ENOMEM, "remote tier: out of memory");
	}
	nodes_snapshot(rt);
	pthread_mutex_init(&rt->mu, NULL);
	pthread_cond_init(&rt->wake, NULL);
	pthread_cond_init(&rt->done, NULL);
	ret = -pthread_create(&rt->th, NULL, remote_thread, rt);
	if (ret) {
		disk_codec_ctx_free(rt->cx);
		redis_cluster_close(rt->rc);
		free(rt);
		return errbuf_set(e, ret, "remote tier: cannot start its thread: %s",
				  strerror(-ret));
	}
	*out = rt;
	return 0;
}

void remote_tier_close(struct remote_tier *rt)
{
	struct remote_fetch *f, *t;

	if (!rt)
		return;
	pthread_mutex_lock(&rt->mu);
	rt->stop = true;
	pthread_cond_signal(&rt->wake);
	pthread_mutex_unlock(&rt->mu);
	pthread_join(rt->th, NULL);
	list_for_each_entry_safe(f, t, &rt->fetches, link)
		fetch_free(f);
	redis_cluster_close(rt->rc);
	disk_codec_ctx_free(rt->cx);
	pthread_mutex_destroy(&rt->mu);
	pthread_cond_destroy(&rt->wake);
	pthread_cond_destroy(&rt->done);
	free(rt);
}

bool remote_tier_user_histories(const struct remote_tier *rt)
{
	return rt->user_histories;
}

/* ------------------------------------------------------------ put, fetch */

struct page_src {
	const void *page;
	uint64_t bytes;
};

static int copy_page(void *arg, void *dst)
{
	const struct page_src *src = arg;

	memcpy(dst, src->page, src->bytes);
	return 0;
}

/* A record written or deleted: what a fetch of it read, or will read
 * before the write reaches the store, is an older snapshot. Under the
 * tier's mutex. */
static void fetches_stale(struct remote_tier *rt, const struct remote_key *k)
{
	struct remote_fetch *f, *t;

	list_for_each_entry_safe(f, t, &rt->fetches, link) {
		if (!key_eq(&f->keys[0], k))
			continue;
		if (f->state == F_DONE) {
			list_del(&f->link);
			fetch_free(f);
		} else {
			f->stale = true;
		}
	}
}

/* Queue k's value (len bytes from fill; del: a DEL of k). */
static int put_item(struct remote_tier *rt, const struct remote_key *k, uint64_t len,
		    bool del, int (*fill)(void *arg, void *dst), void *arg)
{
	struct put_item *p;
	int ret = 0;

	pthread_mutex_lock(&rt->mu);
	rt->st.put_pages += !del;
	if (rt->queued_bytes + len > rt->queue_cap ||
	    !(p = malloc(sizeof(*p) + len))) {
		rt->st.put_dropped++;
		pthread_mutex_unlock(&rt->mu);
		return -ENOSPC;
	}
	rt->queued_bytes += len;
	pthread_mutex_unlock(&rt->mu);
	/* The copy outside the tier's lock (the engine's is held: the page
	 * cannot change); the thread sees the item once it is linked. */
	p->k = *k;
	p->len = len;
	p->del = del;
	if (fill)
		ret = fill(arg, p->page);
	pthread_mutex_lock(&rt->mu);
	if (ret) {
		rt->queued_bytes -= len;
		rt->st.put_dropped++;
		pthread_mutex_unlock(&rt->mu);
		free(p);
		return ret;
	}
	list_add_tail(&p->link, &rt->puts);
	if (k->page == REMOTE_PAGE_REC) {
		rt->queued_recs++;
		/* A history's record names a snapshot; a chunk's is the same
		 * whoever writes it (content-addressed): nothing goes stale. */
		if (k->kind == DISK_KIND_USER)
			fetches_stale(rt, k);
	}
	pthread_cond_signal(&rt->wake);
	pthread_mutex_unlock(&rt->mu);
	return 0;
}

uint64_t remote_tier_free_bytes(struct remote_tier *rt)
{
	uint64_t free;

	pthread_mutex_lock(&rt->mu);
	free = rt->queue_cap > rt->queued_bytes ? rt->queue_cap - rt->queued_bytes : 0;
	pthread_mutex_unlock(&rt->mu);
	return free;
}

bool remote_tier_has_room(struct remote_tier *rt, uint64_t bytes)
{
	bool room;

	pthread_mutex_lock(&rt->mu);
	room = rt->queued_bytes + bytes <= rt->queue_cap;
	rt->st.put_dropped += !room;
	pthread_mutex_unlock(&rt->mu);
	return room;
}

int remote_tier_put(struct remote_tier *rt, const struct remote_key *k,
		    const void *page)
{
	struct page_src src = { page, rt->page_bytes };

	return put_item(rt, k, rt->page_bytes, false, copy_page, &src);
}

int remote_tier_put_fill(struct remote_tier *rt, const struct remote_key *k,
			 int (*fill)(void *arg, void *dst), void *arg)
{
	return put_item(rt, k, rt->page_bytes, false, fill, arg);
}

int remote_tier_put_rec(struct remote_tier *rt, const struct remote_key *k,
			const void *rec, uint64_t len)
{
	struct page_src src = { rec, len };

	if (k->page != REMOTE_PAGE_REC || len > rt->page_bytes)
		return -EINVAL;
	return put_item(rt, k, len, false, copy_page, &src);
}

int remote_tier_del(struct remote_tier *rt, const struct remote_key *k)
{
	return put_item(rt, k, 0, true, NULL, NULL);
}

static struct remote_fetch *fetch_find(struct remote_tier *rt, const struct remote_key *k0)
{
	struct remote_fetch *f;

	list_for_each_entry(f, &rt->fetches, link)
		if (key_eq(&f->keys[0], k0))
			return f;
	return NULL;
}

static int fetch_start(struct remote_tier *rt, const struct remote_key *keys,
		       uint32_t n, remote_expand_fn expand, uint32_t max,
		       struct remote_fetch **out)
{
	struct remote_fetch *f;
	int ret = -EINPROGRESS;

	if (!n)
		return -EINVAL;
	pthread_mutex_lock(&rt->mu);
	f = fetch_find(rt, &keys[0]);
	if (f && f->state == F_DONE) {
		list_del(&f->link); /* the caller's now */
		f->taken_ns = mono_ns();
		rt->st.fetch_wait_ns += f->taken_ns - f->done_ns;
		*out = f;
		ret = 0;
	} else if (!f) {
		f = calloc(1, sizeof(*f));
		if (f) {
			f->keys = malloc(n * sizeof(*keys));
			f->pages = calloc(n, sizeof(*f->pages));
			f->bufs = calloc(n, sizeof(*f->bufs));
		}
		if (!f || !f->keys || !f->pages || !f->bufs) {
			if (f)
				fetch_free(f);
			ret = -ENOMEM;
		} else {
			memcpy(f->keys, keys, n * sizeof(*keys));
			f->n = n;
			f->expand = expand;
			f->max = max;
			list_add_tail(&f->link, &rt->fetches);
			rt->st.fetches++;
			rt->st.fetch_pages += n;
			pthread_cond_signal(&rt->wake);
		}
	}
	pthread_mutex_unlock(&rt->mu);
	return ret;
}

int remote_tier_fetch(struct remote_tier *rt, const struct remote_key *keys,
		      uint32_t n, struct remote_fetch **out)
{
	return fetch_start(rt, keys, n, NULL, 0, out);
}

int remote_tier_fetch_rec(struct remote_tier *rt, const struct remote_key *rec,
			  remote_expand_fn expand, uint32_t max,
			  struct remote_fetch **out)
{
	if (rec->page != REMOTE_PAGE_REC || !expand)
		return -EINVAL;
	return fetch_start(rt, rec, 1, expand, max, out);
}

bool remote_tier_pending(struct remote_tier *rt, const struct remote_key *key0)
{
	struct remote_fetch *f;
	bool pending;

	pthread_mutex_lock(&rt->mu);
	f = fetch_find(rt, key0);
	pending = f && f->state != F_DONE;
	pthread_mutex_unlock(&rt->mu);
	return pending;
}

void remote_tier_wait(struct remote_tier *rt, const struct remote_key *key0)
{
	struct remote_fetch *f;

	pthread_mutex_lock(&rt->mu);
	while ((f = fetch_find(rt, key0)) && f->state != F_DONE && !rt->stop)
		pthread_cond_wait(&rt->done, &rt->mu);
	pthread_mutex_unlock(&rt->mu);
}

uint32_t remote_fetch_pages(const struct remote_fetch *f)
{
	return f->got;
}

const void *remote_fetch_page(const struct remote_fetch *f, uint32_t i)
{
	return i < f->got ? f->pages[i] : NULL;
}

const uint8_t *remote_fetch_hash(const struct remote_fetch *f, uint32_t i)
{
	return f->keys[i].hash;
}

void remote_fetch_done(struct remote_tier *rt, struct remote_fetch *f,
		       uint32_t onloaded)
{
	pthread_mutex_lock(&rt->mu);
	rt->st.onloaded_pages += onloaded;
	rt->st.onload_ns += mono_ns() - f->taken_ns;
	pthread_mutex_unlock(&rt->mu);
	fetch_free(f);
}

/* ------------------------------------------------------------ stats */

void remote_tier_stats(struct remote_tier *rt, struct remote_tier_stats *out)
{
	pthread_mutex_lock(&rt->mu);
	*out = rt->st;
	out->queued_bytes = rt->queued_bytes;
	pthread_mutex_unlock(&rt->mu);
}

bool remote_tier_node_stats(struct remote_tier *rt, uint32_t i,
			    struct rc_node_stats *out)
{
	bool ok;

	pthread_mutex_lock(&rt->mu);
	ok = i < rt->st.nodes;
	if (ok)
		*out = rt->nodes[i];
	pthread_mutex_unlock(&rt->mu);
	return ok;
}

void remote_tier_count_user(struct remote_tier *rt, enum remote_user_stat what)
{
	pthread_mutex_lock(&rt->mu);
	switch (what) {
	case RU_PUT: rt->st.user_puts++; break;
	case RU_FETCHED: rt->st.user_fetched++; break;
	case RU_MISSED: rt->st.user_missed++; break;
	case RU_TORN: rt->st.user_torn++; break;
	case RU_DEL: rt->st.user_dels++; break;
	case RU_DROPPED: rt->st.user_dropped++; break;
	}
	pthread_mutex_unlock(&rt->mu);
}

bool remote_tier_put_pending(struct remote_tier *rt, const struct remote_key *k)
{
	struct put_item *p;
	bool found = false;

	pthread_mutex_lock(&rt->mu);
	/* A record's reader is retried every few microseconds while one is
	 * queued: none queued is the common answer, without a walk. */
	if (k->page == REMOTE_PAGE_REC && !rt->queued_recs) {
		pthread_mutex_unlock(&rt->mu);
		return false;
	}
	for (uint32_t i = 0; i < rt->nwriting && !found; i++)
		found = key_eq(&rt->writing[i]->k, k);
	list_for_each_entry(p, &rt->puts, link)
		if (found || (found = key_eq(&p->k, k)))
			break;
	pthread_mutex_unlock(&rt->mu);
	return found;
}

void remote_tier_flush(struct remote_tier *rt)
{
	pthread_mutex_lock(&rt->mu);
	while (!list_empty(&rt->puts) || rt->busy) {
		pthread_cond_signal(&rt->wake);
		pthread_cond_wait(&rt->done, &rt->mu);
	}
	pthread_mutex_unlock(&rt->mu);
}
