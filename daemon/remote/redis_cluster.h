/* SPDX-License-Identifier: MIT */
/*
 * redis_cluster.h - a small Redis Cluster client over hiredis: the slot
 * map, pipelined GET/SET batches per node, MOVED/ASK, a node down = misses.
 *
 * Hand-written because Debian has no cluster client: hiredis 0.14 (Debian
 * 12's libhiredis-dev) speaks to one server, and hiredis-cluster /
 * hiredis-vip are not packaged. What a cache needs of the cluster protocol
 * is small: the CRC16 key slot, the map from CLUSTER SLOTS, and following
 * a MOVED (the map changed: fix the slot, refresh the map next batch) or an
 * ASK (a slot being migrated: ASKING, then the command, on that node once).
 *
 * Failure is a miss, never a hang: a batch (the map when it is read, every
 * round) has one deadline, the timeout given at open from its start, and
 * every node's replies must be whole by then, however their bytes
 * trickle. Every reply is checked as its bytes arrive, before they are
 * buffered: a bulk longer than the largest valid value
 * (redis_cluster_limit_values), an array where none belongs, a header that
 * is not RESP, and the node is refused at that header. A node that fails,
 * times out or breaks a limit is closed, its items in the batch come back
 * RC_DOWN, it is counted (rc_node_stats: timeouts, bad_replies) and not
 * tried again for a second (then reconnected on demand). Nothing here
 * retries a failed node within a batch.
 *
 * Not thread-safe: one thread (the daemon's remote thread, a test, kvbench)
 * owns a struct redis_cluster.
 */
#ifndef KVPOOL_REDIS_CLUSTER_H
#define KVPOOL_REDIS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"

#define RC_SLOTS 16384u
#define RC_MAX_NODES 64u
#define RC_URL_SCHEME "redis-cluster://"
/* The longest value a batch takes unless told (Redis's own
 * proto-max-bulk-len default). */
#define RC_VALUE_MAX (512ull << 20)

struct redis_cluster;

/* What became of one item of a batch. */
enum rc_status {
	RC_HIT = 0,   /* GET: a value was passed to the callback; SET: stored */
	RC_MISS = 1,  /* GET: no such key */
	RC_DOWN = 2,  /* its node is down or timed out: a miss, counted as an error */
	RC_ERROR = 3, /* the server answered an error (its text is logged once) */
};

struct rc_item {
	const void *key;
	size_t klen;
	const void *val;  /* SET only; NULL: DEL the key instead */
	size_t vlen;      /* SET only */
	uint8_t status;   /* enum rc_status, filled by the batch */
};

/* One node's figures (redis_cluster_node_stats). */
struct rc_node_stats {
	char addr[64];          /* host:port */
	bool up;                /* connected, or not failed lately */
	uint64_t gets, hits, misses, sets, errors;
	uint64_t bytes_in, bytes_out; /* values read, values written */
	uint64_t rounds;        /* pipelined rounds sent to the node */
	uint64_t latency_ns;    /* summed over rounds: first send to last reply */
	uint64_t timeouts;      /* batches it had not answered whole by the deadline */
	uint64_t bad_replies;   /* replies past the limits, or not RESP: refused */
};

/*
 * Parse "redis-cluster://host:port[,host:port...]" (at most RC_MAX_NODES
 * seeds). Returns 0 or -EINVAL with what was wrong and the fix in e.
 */
int redis_cluster_check_url(const char *url, struct errbuf *e);

/*
 * A client of the cluster that url names. The slot map is read from the
 * first seed that answers CLUSTER SLOTS; where none does, open still
 * succeeds (the store may start after the daemon) and every batch is a
 * miss until a seed answers (tried again at most once a second).
 * -EINVAL: a bad url; -ENOMEM.
 */
int redis_cluster_open(struct redis_cluster **out, const char *url,
		       uint32_t timeout_ms, struct errbuf *e);
void redis_cluster_close(struct redis_cluster *rc);

/* The longest value a GET may bring back (RC_VALUE_MAX until set): a
 * reply that says it is longer is refused at its header, the node down. */
void redis_cluster_limit_values(struct redis_cluster *rc, uint64_t max);

/*
 * GET every item, pipelined: one round per node holding some of them (and
 * one more for redirected items). For each hit, on_value(arg, i, &val, len)
 * is called with the reply's bytes (a malloc'd buffer of len + 1 bytes):
 * the callee may keep them by taking *val (setting it to NULL; free() it
 * later): a 2 MiB page is then never copied out of the reply. Otherwise
 * they are valid during the call only. Returns the number of hits.
 */
uint32_t redis_cluster_get(struct redis_cluster *rc, struct rc_item *it, uint32_t n,
			   void (*on_value)(void *arg, uint32_t i, char **val,
					    size_t len),
			   void *arg);
/* SET every item (key, val), pipelined as get; an item with val NULL is a
 * DEL of its key. Returns how many stored (or deleted, or not there). */
uint32_t redis_cluster_set(struct redis_cluster *rc, struct rc_item *it, uint32_t n);

/* The cluster's slot of a key: CRC16 (XMODEM) of the key, or of its first
 * non-empty {hash tag}, mod 16384. */
uint16_t redis_cluster_slot(const void *key, size_t len);

/* Keys on the nodes the map routes to (DBSIZE summed; benchmarks, tests);
 * -1 when one of them does not answer. */
int64_t redis_cluster_dbsize(struct redis_cluster *rc);

/* Nodes known (seeds and those the map named); their figures. */
uint32_t redis_cluster_nodes(const struct redis_cluster *rc);
void redis_cluster_node_stats(const struct redis_cluster *rc, uint32_t i,
			      struct rc_node_stats *out);
/* Slots the map routes to a node (RC_SLOTS when the map is whole). */
uint32_t redis_cluster_mapped_slots(const struct redis_cluster *rc);

#endif /* KVPOOL_REDIS_CLUSTER_H */
