/* SPDX-License-Identifier: MIT */
/*
 * remote_tier.h - the fourth tier: content-addressed pages (prefix pages,
 * sealed chunk pages) in a store other machines share, here a Redis
 * Cluster (redis_cluster.h), named and checked as remote_value.h says.
 *
 * One remote tier per daemon with one thread of its own, the remote
 * thread; no network I/O runs on a ring worker or under an engine lock:
 *
 *  put    (engine, locked)   remote_tier_put() copies an evicted page into
 *                            the bounded write-behind queue (a memcpy) and
 *                            returns; when the queue is full the page is
 *                            dropped and counted (it can be recomputed).
 *  write  (remote thread)    encodes, seals and SETs queued pages in
 *                            pipelined batches.
 *  fetch  (engine, locked)   remote_tier_fetch() for the missing run of a
 *                            prefix lookup: -EINPROGRESS the first time
 *                            (the run is queued; the ring worker holds the
 *                            entry and retries), -EINPROGRESS while the
 *                            thread's batched round of GETs is out (a
 *                            long run: 16 MiB batches, each after the
 *                            last came back whole),
 *                            then 0: the run's leading pages that came back
 *                            and checked are in memory for the engine to
 *                            onload (remote_fetch_page), released with
 *                            remote_fetch_done().
 *
 * A failed node, a timeout, a corrupt value: that page is a miss (counted
 * per node and in bad_values), never a wait past the timeout, never bytes
 * that do not check. Thread-safe: every call takes the tier's mutex for a
 * short while.
 */
#ifndef KVPOOL_REMOTE_TIER_H
#define KVPOOL_REMOTE_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "errbuf.h"
#include "kvpool.h"

struct remote_tier;
struct remote_fetch;
struct remote_key;

struct remote_tier_config {
	const char *url;          /* redis-cluster://host:port,... */
	uint32_t timeout_ms;      /* a batch's deadline (redis_cluster.h) */
	struct kvp_layout layout;
	const char *codec;        /* disk_codec_parse(): "none", "zstd[:L]" */
	uint64_t queue_bytes;     /* write-behind queue; 0: 64 MiB */
	bool user_histories;      /* remote_user_histories=yes */
	/* Where warnings go (kvpoold: its log); NULL: stderr. */
	void (*log)(int prio, const char *msg);
};

/* -EINVAL (a bad url or codec: the message names it and the fix),
 * -ENOTSUP (built without hiredis), -ENOMEM. An unreachable store is not
 * an error: its pages are misses until it answers. */
int remote_tier_open(struct remote_tier **out, const struct remote_tier_config *c,
		     struct errbuf *e);
/* Stop the thread after the queued writes (bounded by the timeout). */
void remote_tier_close(struct remote_tier *rt);
bool remote_tier_user_histories(const struct remote_tier *rt);

/* Queue page (layout.page_bytes) for writing under k; -ENOSPC: the queue
 * is full, dropped. */
int remote_tier_put(struct remote_tier *rt, const struct remote_key *k,
		    const void *page);
/* The same with the page's bytes written into the queue's buffer by
 * fill(arg, dst) (a device tier the CPU cannot read: the backend's read);
 * fill's error drops the page (counted) and is returned. */
int remote_tier_put_fill(struct remote_tier *rt, const struct remote_key *k,
			 int (*fill)(void *arg, void *dst), void *arg);

/* Bytes the write-behind queue can take now (a hint: others may queue). */
uint64_t remote_tier_free_bytes(struct remote_tier *rt);
/* Whether the write-behind queue has room for bytes now (a chunk queued
 * whole or not at all: the put can still find it full, another engine
 * having queued meanwhile). false counts one drop. */
bool remote_tier_has_room(struct remote_tier *rt, uint64_t bytes);
/* Queue a record (a chunk's or a history's: k.page REMOTE_PAGE_REC, len
 * at most a page; stored as is); -ENOSPC as put, -EINVAL. */
int remote_tier_put_rec(struct remote_tier *rt, const struct remote_key *k,
			const void *rec, uint64_t len);
/* Queue a DEL of k (behind the puts queued before it: same key, same
 * node, in order). -ENOSPC: the queue is full. A user history's record
 * put or DELed makes any fetch of it stale: one done is freed, one queued
 * or out is freed when done; neither is handed out (a reader waits for
 * the write with remote_tier_put_pending, then asks again). */
int remote_tier_del(struct remote_tier *rt, const struct remote_key *k);

/*
 * The run keys[0..n) (a prefix's consecutive missing pages), named by
 * keys[0]: -EINPROGRESS queued or being fetched; 0: fetched, *out is the
 * result (remote_fetch_pages leading pages there; release it with
 * remote_fetch_done); -ENOMEM.
 */
int remote_tier_fetch(struct remote_tier *rt, const struct remote_key *keys,
		      uint32_t n, struct remote_fetch **out);
/*
 * What a record names, called by the remote thread on a record that came
 * back and checked (val: page_bytes, the record then zeros): how many
 * pages follow it (0: none, or it is not the caller's format), and into
 * hash the hash of their keys (page 0.., kind, layout and tenant as rec's).
 */
typedef uint32_t (*remote_expand_fn)(const struct remote_key *rec, const void *val,
				     uint64_t page_bytes, uint8_t hash[32]);
/*
 * A record and the pages it names, named by rec (page REMOTE_PAGE_REC):
 * one round for the record, then one for its pages (at most max; a record
 * naming more is not expanded) on the remote thread, nothing in between
 * on the caller's. As remote_tier_fetch otherwise; page 0 of the result is
 * the record, page i + 1 its page i.
 */
int remote_tier_fetch_rec(struct remote_tier *rt, const struct remote_key *rec,
			  remote_expand_fn expand, uint32_t max,
			  struct remote_fetch **out);
/* Whether the fetch of the run named by key0 is queued or out (a cheap
 * check for a lookup retried while it waits). */
bool remote_tier_pending(struct remote_tier *rt, const struct remote_key *key0);
/* Block until the fetch of the run named by keys[0] is over. */
void remote_tier_wait(struct remote_tier *rt, const struct remote_key *key0);
uint32_t remote_fetch_pages(const struct remote_fetch *f);
const void *remote_fetch_page(const struct remote_fetch *f, uint32_t i);
/* The hash of page i's key (i < remote_fetch_pages). */
const uint8_t *remote_fetch_hash(const struct remote_fetch *f, uint32_t i);
/* The engine took what it could (onloaded pages of the fetch); count them
 * and free the fetch. */
void remote_fetch_done(struct remote_tier *rt, struct remote_fetch *f,
		       uint32_t onloaded);

/*
 * The tier's figures, listed once: X(name, kind, unit, metric, help), as
 * KVP_STATS_FIELDS (kvpool.h) lists a pool's; kvpoold's /metrics walks
 * both lists (daemon/server/metrics.c), and REMOTE_NODE_FIELDS per store node.
 */
#define REMOTE_TIER_FIELDS(X) \
	X(put_pages, COUNTER, "", "remote_put_pages", \
	  "Evicted pages queued for the remote tier.") \
	X(put_dropped, COUNTER, "", "remote_put_dropped_pages", \
	  "Pages not queued: the write-behind queue was full.") \
	X(written_pages, COUNTER, "", "remote_written_pages", "Pages the store took.") \
	X(write_errors, COUNTER, "", "remote_write_errors", \
	  "Pages a store node did not take (down, timed out, an error).") \
	X(fetches, COUNTER, "", "remote_fetches", \
	  "Batched rounds asked for a lookup's missing run.") \
	X(fetch_pages, COUNTER, "", "remote_fetch_pages", "Pages those rounds asked for.") \
	X(fetch_hits, COUNTER, "", "remote_fetch_hit_pages", \
	  "Pages the store had and that checked.") \
	X(onloaded_pages, COUNTER, "", "remote_onloaded_pages", \
	  "Fetched pages onloaded into a device tier and served.") \
	X(bad_values, COUNTER, "", "remote_bad_values", \
	  "Fetched values dropped: checksum, another key's or layout's.") \
	X(queued_bytes, GAUGE, "bytes", "remote_queued", \
	  "Bytes waiting in the write-behind queue.") \
	X(fetch_ns, COUNTER, "ns", "remote_fetch", \
	  "Time of the remote thread's fetches: the rounds, the checks and decoding.") \
	X(fetch_wait_ns, COUNTER, "ns", "remote_fetch_wait", \
	  "Time fetches waited, done, for the held request's retry to take them.") \
	X(onload_ns, COUNTER, "ns", "remote_onload", \
	  "Time the engine spent on fetches taken: copies into the device tier, publishing.") \
	X(user_puts, COUNTER, "", "remote_user_puts", \
	  "User histories dropped by eviction and queued whole for the store.") \
	X(user_fetched, COUNTER, "", "remote_user_fetched", \
	  "User histories brought back whole from the store.") \
	X(user_missed, COUNTER, "", "remote_user_missed", \
	  "Prepares of a user with no history anywhere that the store had none of.") \
	X(user_torn, COUNTER, "", "remote_user_torn", \
	  "Histories the store had only in part, or of mixed snapshots: misses.") \
	X(user_dels, COUNTER, "", "remote_user_dels", \
	  "Explicit evictions of a user that queued a DEL of its history.") \
	X(user_dropped, COUNTER, "", "remote_user_dropped", \
	  "User histories not queued: no room in the write-behind queue for all of one.")

struct remote_tier_stats {
#define REMOTE_FIELD_(name, kind, unit, metric, help) uint64_t name;
	REMOTE_TIER_FIELDS(REMOTE_FIELD_)
#undef REMOTE_FIELD_
	uint32_t nodes;
};

/* Per store node (struct rc_node_stats, redis_cluster.h). */
#define REMOTE_NODE_FIELDS(X) \
	X(gets, COUNTER, "", "remote_node_gets", "GETs sent to a store node.") \
	X(hits, COUNTER, "", "remote_node_hits", "GETs it answered with a value.") \
	X(misses, COUNTER, "", "remote_node_misses", \
	  "GETs that found nothing or failed (down, timed out).") \
	X(sets, COUNTER, "", "remote_node_sets", "SETs sent to it.") \
	X(errors, COUNTER, "", "remote_node_errors", \
	  "Requests that failed: down, timed out, an error reply.") \
	X(bytes_in, COUNTER, "bytes", "remote_node_read", "Value bytes read from it.") \
	X(bytes_out, COUNTER, "bytes", "remote_node_written", "Value bytes it stored.") \
	X(rounds, COUNTER, "", "remote_node_rounds", "Pipelined rounds sent to it.") \
	X(latency_ns, COUNTER, "ns", "remote_node_round", \
	  "Time of those rounds, first send to last reply: / rounds is the mean.") \
	X(timeouts, COUNTER, "", "remote_node_timeouts", \
	  "Batches it had not answered whole within remote_timeout_ms: marked down.") \
	X(bad_replies, COUNTER, "", "remote_node_bad_replies", \
	  "Replies refused at their header (longer than the largest valid value, " \
	  "an array where none belongs, not RESP): marked down.")
void remote_tier_stats(struct remote_tier *rt, struct remote_tier_stats *out);

/* Per node (i < stats.nodes): the client's figures as of its last batch. */
struct rc_node_stats;
bool remote_tier_node_stats(struct remote_tier *rt, uint32_t i,
			    struct rc_node_stats *out);

/* The user history counters above (remote_user.c): enum remote_user_stat. */
enum remote_user_stat { RU_PUT, RU_FETCHED, RU_MISSED, RU_TORN, RU_DEL, RU_DROPPED };
void remote_tier_count_user(struct remote_tier *rt, enum remote_user_stat what);

/* Whether a put or DEL of k is queued or being written (a reader of k
 * waits for it: the store does not have it yet). */
bool remote_tier_put_pending(struct remote_tier *rt, const struct remote_key *k);

/* Tests: wait until nothing is queued. */
void remote_tier_flush(struct remote_tier *rt);

#endif /* KVPOOL_REMOTE_TIER_H */
