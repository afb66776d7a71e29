/* SPDX-License-Identifier: MIT */
/*
 * tier.h - the engine's one door to the tiers below the host tier, and the
 * typed wait its callers understand.
 *
 * The engine owns this interface; the disk tier (daemon/disk/disk_engine.c)
 * and the remote tier (daemon/remote/remote_{user,engine,chunk,publish}.c)
 * implement it. The engine names neither: it calls eng->tier[t]->op, and
 * kvpoold.c (or a test, or kvbench) hands it the tiers at startup:
 *
 *	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
 *	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
 *
 * before the first engine_create(). engine_create copies the registered
 * table into the engine (eng->tier[]) and refuses a configuration that names
 * a tier (engine_config.disk, .remote) whose operations were not registered.
 *
 * Layout: one table of function pointers per tier. Every member may be NULL
 * (the tier has no such operation: the engine's wrapper answers as for a
 * pool without the tier). Every operation is a no-op, or answers "nothing",
 * on an engine configured without that tier (engine_config.disk/.remote
 * NULL): the tier checks, as before this interface existed.
 *
 * Who calls what (each from one marked place in the engine):
 *
 *   attach, detach   engine_create (after the host frames exist) and
 *                    engine_destroy (before they go).
 *   fetch            a prepare (engine.c) or a sequence's KVP_SRC_USER
 *                    (share_seq_create.c) of a user with no history in
 *                    memory: disk first, then remote when the disk did not
 *                    bring it back. 0 (back, or a miss), a wait (below), or
 *                    -ENOMEM / -EAGAIN (nothing changed).
 *   store            eviction is about to drop an unpinned history
 *                    (evict.c): disk first, then remote; each copies what it
 *                    needs (a memcpy, or a queued write) and the engine drops
 *                    the history whatever they answer.
 *   forget           an explicit eviction (evict.c): the disk tier's
 *                    selections (KVP_SEL_DISK, KVP_SEL_TO_DISK) and the
 *                    remote tier's DEL of the user's record.
 *   forget_all       the same for every unpinned user.
 *   info, stats,     questions that change nothing (engine_query.c): a
 *   list, list_count user only on disk counts as cached.
 *   prefix_more      a prefix lookup whose local chain stops short
 *                    (share_prefix.c, share_seq.c): the disk tier's pass,
 *                    then the remote tier's; what comes back is published
 *                    as idle prefix pages. prefix_waiting: the disk tier's
 *                    last pass is still reading (answer the wait at once).
 *   demote_prefix,   a prefix page or a sealed root chunk is about to be
 *   demote_chunk     dropped by eviction (share_prefix.c, share_chunk.c):
 *                    its bytes go down (daemon/disk/share_disk.c feeds both
 *                    the disk and the remote tier from one host copy).
 *   chunk_restore    an acquire, get or KVP_SRC_CHUNK of a chunk not in
 *                    memory (share_chunk_put.c, share_seq_create.c):
 *                    0, -ENOENT, a wait, or -ENOMEM naming the limit.
 *   chunk_drop,      a deletion, a clear (share_chunk_name.c): what the
 *   chunk_clear      tiers hold goes too.
 *   publish          the reclaimer, ahead of eviction (shard.c).
 *   chunk_kept       whether a chunk type is kept in the tier (share_chunk*).
 *   flush            a clean stop (engine_tier_flush, from the server's
 *                    tenant teardown): every unpinned history written to
 *                    the tier; returns how many. The remote tier's first
 *                    (it leaves them in memory), then the disk tier's
 *                    (which drops them).
 *
 * Ordering and locking: every operation is called with the engine's lock
 * held (the caller serialises calls on one engine, engine.h), from the
 * thread that holds it; none takes the lock itself, none calls back into a
 * public engine entry point. A tier's own thread (the disk thread, the
 * remote thread) never calls these: it only fills the queues the
 * operations read under the lock. So the order the engine calls them in is
 * the order they take effect; a tier that cannot answer at once (the read
 * is queued) returns a wait and changes nothing the engine can see.
 * Registration happens once, single-threaded, before any engine exists:
 * the table is read without a lock afterwards.
 *
 * The typed wait. An engine call that cannot finish now, and need not fail,
 * records why (engine_wait_set) and returns -EINPROGRESS; its caller reads
 * the reason with engine_wait_take() on the same thread. The record is the
 * calling thread's, not the engine's: a call on one shard may wait for
 * another shard's tier (share_seq_create.c onloads a source user into the
 * shard that owns it), and the caller knows only the engine it locked. The ring worker
 * holds the entry and runs it again later (ops layer: op_retry), serving
 * others meanwhile; a caller with nowhere to hold it waits a moment,
 * unlocked, and calls again (the disk and remote tiers' reads complete on
 * their own threads). The reason says which thread it waits for; -EINPROGRESS
 * stays the value on the wire and in the engine's int returns, so every
 * existing caller and test sees what it saw before.
 */
#ifndef KVPOOL_TIER_H
#define KVPOOL_TIER_H

#include <stdbool.h>
#include <stdint.h>

struct chunk;
struct engine;
struct engine_user_info;
struct errbuf;
struct history;
struct kvp_chunk_id;
struct kvp_stats;
struct pc_entry;

/* Why an engine call answered -EINPROGRESS. */
enum engine_wait {
	ENGINE_DONE = 0,        /* no wait: the answer is final */
	ENGINE_WAIT_RECLAIM,    /* the reclaimer frees device frames (shard.h) */
	ENGINE_WAIT_DISK,       /* the disk thread reads pages back */
	ENGINE_WAIT_REMOTE,     /* the remote thread asks the store */
};

/* The tiers below the host tier, in the order the engine asks them. */
enum engine_tier {
	ENGINE_TIER_DISK,
	ENGINE_TIER_REMOTE,
	ENGINE_TIERS_BELOW,
};

struct tier_ops {
	const char *name;       /* "disk", "remote": for messages */
	void (*attach)(struct engine *eng);
	void (*detach)(struct engine *eng);
	int (*fetch)(struct engine *eng, uint64_t user, unsigned flags,
		     struct errbuf *e);
	void (*store)(struct engine *eng, struct history *h);
	int (*forget)(struct engine *eng, uint64_t user, uint32_t sel,
		      struct errbuf *e);
	int (*forget_all)(struct engine *eng, uint32_t sel);
	bool (*info)(struct engine *eng, uint64_t user,
		     struct engine_user_info *out);
	void (*stats)(const struct engine *eng, struct kvp_stats *out);
	void (*list)(struct engine *eng, uint64_t cursor, uint64_t *ids,
		     uint64_t *n, uint64_t cap);
	uint64_t (*list_count)(struct engine *eng, uint64_t cursor);
	/* The shared world: prefix pages and sealed root chunks. */
	int (*prefix_more)(struct engine *eng, const uint32_t *tokens,
			   uint32_t full, uint32_t *frames, uint32_t *hit,
			   uint32_t *idle, bool wait);
	bool (*prefix_waiting)(struct engine *eng);
	void (*demote_prefix)(struct engine *eng, struct pc_entry *pe);
	void (*demote_chunk)(struct engine *eng, struct chunk *c);
	int (*chunk_restore)(struct engine *eng, const struct kvp_chunk_id *id,
			     uint32_t type, bool wait, struct errbuf *e);
	int (*chunk_drop)(struct engine *eng, const struct kvp_chunk_id *id);
	uint32_t (*chunk_clear)(struct engine *eng, uint32_t type);
	uint32_t (*publish)(struct engine *eng, uint32_t max_pages, bool *more);
	bool (*chunk_kept)(const struct engine *eng, uint32_t type);
	int (*flush)(struct engine *eng);
};

/* Startup, before any engine_create: the tier t's operations (NULL: none).
 * The table must outlive every engine. */
void engine_tier_register(enum engine_tier t, const struct tier_ops *ops);

/*
 * Tier t's own state of eng: a pointer the engine keeps and never reads
 * (NULL at engine_create). The tier sets it (in attach, or when it first
 * needs it) and frees it in detach; the engine holds no tier state itself.
 */
void **engine_tier_priv(struct engine *eng, enum engine_tier t);

/*
 * A clean stop, for the engine's owner (the server), with eng's lock held:
 * tier t's flush (the top comment); 0 when eng has no such tier, or it
 * has no flush. The owner names the tier, never its functions.
 */
int engine_tier_flush(struct engine *eng, enum engine_tier t);

/*
 * The typed wait (top comment). engine_wait_set records why the calling
 * thread's engine call waits and returns -EINPROGRESS, for
 * `return engine_wait_set(...)`; engine_wait_take answers it once
 * (ENGINE_DONE when none was recorded) and clears it.
 */
int engine_wait_set(enum engine_wait why);
enum engine_wait engine_wait_take(void);
const char *engine_wait_name(enum engine_wait w);

#endif /* KVPOOL_TIER_H */
