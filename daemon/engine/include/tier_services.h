/* SPDX-License-Identifier: MIT */
/*
 * tier_services.h - what a tier (daemon/disk, daemon/remote) may ask of the
 * engine, beside tier.h: the engine's side of the door. A tier file that
 * includes this header needs none of the engine's private headers
 * (engine_internal.h, share_internal.h); struct engine, struct chunk and
 * struct pc_entry stay opaque to it. kvpool_tiers has no include path to
 * those headers (CMakeLists.txt): a tier file that reaches for one does
 * not compile.
 *
 * Locking: every function here is called with the engine's lock held, by
 * the thread that holds it, from inside a tier_ops operation (tier.h) or a
 * tier entry point the engine's owner calls under the lock (a flush, the
 * reclaimer's publish). None takes the lock, none waits for a tier's own
 * thread, and none may be called from a tier's thread (the disk thread,
 * the remote thread): those only fill queues the operations read.
 *
 * Cost: each is one call doing what the tier did inline before (a field
 * read, a list step) or the engine function it wrapped; the per-page work
 * around them (hashing a page, copying its bytes) is what a page costs.
 *
 * Who owns what. The engine owns every structure named here (histories,
 * frames, prefix entries, chunks and their names) and every change to them:
 * a tier reads them through these calls and changes them only through the
 * calls that say so (publish a page, adopt a chunk, mark one stored). A
 * tier owns what it keeps below the device tier (its records, keys and
 * formats: disk_record.h, share_disk.h's struct chunk_rec, remote_value.h)
 * and its own state of an engine (tier.h's engine_tier_priv: the disk
 * tier's reads in flight and its prefix walk's wait live there, not in the
 * engine). The engine never reads a tier's format: a chunk crosses the
 * door as a struct tier_chunk_desc, decoded on the tier's side.
 *
 * Implemented in tier_services.c (the engine, histories, prefix pages,
 * publishing) and tier_services_chunk.c (chunks).
 */
#ifndef KVPOOL_TIER_SERVICES_H
#define KVPOOL_TIER_SERVICES_H

#include <stdbool.h>
#include <stdint.h>

#include "kvpool.h"
#include "tier.h"

struct chunk;
struct disk_tier;
struct errbuf;
struct engine;
struct frames;
struct history;
struct kvp_chunk_id;
struct pc_entry;
struct remote_tier;

/* ------------------------------------------------------------ the engine */

/* The tiers' handles and keys, from engine_config (NULL: no such tier). */
struct disk_tier *tier_disk(const struct engine *eng);
struct remote_tier *tier_remote(const struct engine *eng);
uint64_t tier_disk_tenant(const struct engine *eng);
uint32_t tier_disk_pool(const struct engine *eng);
uint32_t tier_remote_chunk_skip(const struct engine *eng);
/* Tokens per page (engine_layout(eng)->page_tokens). */
uint32_t tier_page_tokens(const struct engine *eng);
/* The engine's index in its shard set (0: alone, or the first). */
uint32_t tier_shard(const struct engine *eng);

/* The device frame allocator (frames.h), and host frames reserved (at most
 * n) for a bounce copy: how many are free for it now. */
struct frames *tier_device_frames(struct engine *eng);
struct frames *tier_host_frames(struct engine *eng);
uint32_t tier_host_reserve(struct engine *eng, uint32_t n);
/* Device frames a caller needing `need` can have (evicting), and the
 * eviction that makes them free (engine_internal.h's engine_device_avail
 * and evict_for_device, no history excluded). */
uint64_t tier_device_avail(struct engine *eng, uint32_t need);
void tier_evict_for_device(struct engine *eng, uint32_t need);

/* Host and device frames the engine has in all (a history longer than
 * the device cannot be prepared), and engine_set_max_tokens's limit
 * (0: none). */
uint32_t tier_frames_total(const struct engine *eng, enum kvp_tier t);
uint64_t tier_max_tokens(const struct engine *eng);

/* ------------------------------------------------------------ histories */

/* The user's history in this engine's table, NULL when none. */
struct history *tier_history_find(struct engine *eng, uint64_t user);
/* Histories in the table, and each of them to fn (a nonzero return stops
 * the walk and is returned): fn must not add or drop any. */
uint64_t tier_user_count(const struct engine *eng);
int tier_user_foreach(struct engine *eng,
		      int (*fn)(struct history *h, void *arg), void *arg);
uint64_t tier_history_user(const struct history *h);
/* Its tokens [start, start + len), in pages of committed tokens. */
uint64_t tier_history_start(const struct history *h);
uint64_t tier_history_len(const struct history *h);
uint32_t tier_history_pages(const struct engine *eng, const struct history *h);
/* Its pages, committed and reserved (an unpinned history has no reserved). */
uint32_t tier_history_npages(const struct history *h);
/* The least recently used unpinned history holding frames of tier t
 * (device: any device frame; host: host frames only), NULL when none. */
struct history *tier_lru_oldest(const struct engine *eng, enum kvp_tier t);
/* Free every frame of the unpinned h and h itself; frames freed. */
uint32_t tier_history_drop(struct engine *eng, struct history *h);
/* Leases and sequences holding it: a pinned history is not the tier's. */
uint32_t tier_history_pins(const struct history *h);
/* The remote tier's mark: h as it is now is what the store has (set when
 * it came from the store); true while nothing was written or trimmed. */
void tier_history_mark_stored(struct history *h);
bool tier_history_stored(const struct history *h);
/* Demote the unpinned h to the host tier where it fits, else drop it
 * (through the tiers' store): h may be gone after. */
void tier_history_demote(struct engine *eng, struct history *h);
/* Where page i of h can be read by the CPU: its host frame, else its
 * device frame where the device tier is host memory (shm); NULL: nowhere
 * (device-only on a GPU). Out of line, as it was in the disk tier: the
 * caller copies or writes the page's bytes next. */
void *tier_history_page_cpu(struct engine *eng, struct history *h, uint32_t i);
/*
 * Host room for n pages coming back from the tier `from` ("disk",
 * "remote") for user: the host LRU's oldest go (through the tiers' store),
 * then the host copies of unpinned device-resident histories, then, with
 * every shard's lock held, the other shards' host LRUs. 0; -EAGAIN (a
 * shard short of host room: retried with every shard) or -ENOMEM, naming
 * the numbers.
 */
int tier_host_room(struct engine *eng, uint64_t user, uint32_t n,
		   const char *from, struct errbuf *e);
/*
 * The disk and remote tiers' one rebuild of a history that comes back:
 * n pages (page i's bytes at src[i]) for [start, start + len) into host
 * frames, on the host LRU as its newest. frames: host frames taken for it
 * already (src[i] may be frames[i]'s bytes), or NULL: room made here
 * (tier_host_room) and frames taken. `from` names the tier in the
 * messages. 0; -ENOMEM, -EAGAIN: nothing changed.
 */
int tier_history_from_pages(struct engine *eng, uint64_t user, uint64_t start,
			    uint64_t len, uint32_t n, const void *const *src,
			    const uint32_t *frames, const char *from,
			    struct errbuf *e);

/* ------------------------------------------------------------ prefix pages */

#define TIER_PC_NONE UINT32_MAX

/* Device frames of the shared world (the longest chain a lookup walks);
 * 0: the engine has none. */
uint32_t tier_share_frames(const struct engine *eng);
/* Hold and let go of a shared-world frame (a chain's last page while its
 * continuation is onloaded, so eviction cannot take it). */
void tier_frame_ref(struct engine *eng, uint32_t frame);
void tier_frame_unref(struct engine *eng, uint32_t frame);
/* The prefix entry a published frame holds (TIER_PC_NONE: none), and that
 * frame's page hash. */
uint32_t tier_frame_pc(const struct engine *eng, uint32_t frame);
const uint8_t *tier_frame_hash(const struct engine *eng, uint32_t frame);
/* The chain hash of one page after prev (share_prefix.c's pc_hash_page). */
void tier_pc_hash_page(const struct engine *eng, const uint8_t prev[32],
		       const uint32_t *tokens, uint8_t out[32]);
/* The published entry under hash, TIER_PC_NONE when none. */
uint32_t tier_pc_find(const struct engine *eng, const uint8_t hash[32]);
/* Walk tokens' chain of `full` pages while published (share_prefix.c's
 * pc_match): frames into frames[], the idle ones counted into *idle. */
uint32_t tier_pc_match(struct engine *eng, const uint32_t *tokens,
		       uint32_t full, uint32_t *frames, uint32_t *idle);
/* A filled device frame nobody holds, published under hash after parent
 * as an idle leaf that came from the store: not queued for it, not
 * written back on eviction. Returns its entry. */
uint32_t tier_pc_adopt_stored(struct engine *eng, uint32_t frame,
			      const uint8_t hash[32], uint32_t parent);
/* Copy src[0, n) into device frames dev[] (share_bounce.c's
 * share_pages_in): 0, or -ENOMEM with no host frames for the copy. */
int tier_pages_in(struct engine *eng, const void *const *src,
		  const uint32_t *dev, uint32_t n);
/*
 * The other way (share_bounce.c's share_pages_out): CPU-readable copies of
 * device frames dev[0, n) into out[], the device tier itself where the CPU
 * can read it (shm), else host frames bounce[] filled by one device -> host
 * copy; then *bounced, and tier_bounce_free(bounce) once the bytes are
 * copied. false: no host frames for the copy, or it failed.
 */
bool tier_pages_out(struct engine *eng, const uint32_t *dev, uint32_t n,
		    void **out, uint32_t *bounce, bool *bounced);
void tier_bounce_free(struct engine *eng, uint32_t *bounce, uint32_t n);
/* Sequence pages listing a shared-world frame: 0 when idle. */
uint32_t tier_frame_refs(const struct engine *eng, uint32_t frame);
/* The frame of the published entry e (from tier_pc_find). */
uint32_t tier_pc_frame(const struct engine *eng, uint32_t e);
/*
 * A free device frame for the shared world, neither listed nor published:
 * the caller made room first (tier_device_avail, tier_evict_for_device).
 * While nobody holds it, frames_free(tier_device_frames(eng), f) gives it
 * back; tier_frame_ref holds it, tier_pc_publish publishes the held frame
 * under hash after parent (TIER_PC_NONE: page 0), hash not published yet.
 */
uint32_t tier_share_frame_alloc(struct engine *eng);
void tier_pc_publish(struct engine *eng, uint32_t frame, const uint8_t hash[32],
		     uint32_t parent);
/* A prefix entry the engine hands a tier (demote_prefix, tier_pub_pc_first):
 * its device frame, its page hash, and the remote tier's mark (queued for
 * the store, or from it: never written there again). */
uint32_t tier_pc_entry_frame(const struct pc_entry *pe);
const uint8_t *tier_pc_entry_hash(const struct pc_entry *pe);
bool tier_pc_in_store(const struct pc_entry *pe);
void tier_pc_set_in_store(struct pc_entry *pe, bool in_store);

/* ------------------------------------------------------------ chunks */

/*
 * A chunk entry as it crosses the door (tier_services_chunk.c). Going down,
 * tier_chunk_describe fills it from the engine's entry: the pointers are
 * the engine's, valid while the lock is held and nothing changes the
 * entry. Coming back, a tier fills it from what it kept (decoded from its
 * own format) for tier_chunk_adopt: the pointers are the tier's, read
 * during the call only.
 */
struct tier_chunk_desc {
	uint8_t id[32];          /* the entry's id */
	uint8_t name_id[32];     /* its name's id (zero once dead) */
	uint32_t type;           /* enum kvp_chunk_type, its name's */
	uint32_t state;          /* enum kvp_chunk_state */
	bool root;               /* alive, named, no parent: what tiers keep */
	uint32_t tokens;         /* the entry's tokens */
	uint32_t npages;
	const uint32_t *frames;  /* [npages] its device frames (describe) */
	/* Its name's record: what was registered (zero once dead). */
	uint32_t ntokens;
	const uint32_t *name_tokens; /* [ntokens] */
	const unsigned char *content; /* NULL: none */
	uint32_t content_len;
	const char *meta;        /* canonical JSON, meta_len bytes, no NUL
				  * needed; NULL: none */
	uint32_t meta_len;
	uint64_t created_ns;
};

/* c as it is now (the top comment): a tier keeps a chunk below the device
 * tier only when d->root and d->state == KVP_CHUNK_READY. */
void tier_chunk_describe(const struct chunk *c, struct tier_chunk_desc *d);
/* Whether the engine holds an alive entry / a name with this id. */
bool tier_chunk_known(struct engine *eng, const struct kvp_chunk_id *id);
bool tier_chunk_name_known(struct engine *eng, const struct kvp_chunk_id *id);
/*
 * A sealed root chunk a tier kept comes back (d: id, name_id, type, tokens,
 * npages, the name's record; page i's bytes at src[i], page_bytes each):
 * room is made for it (the chunk limits, then device frames, evicting: a
 * name the eviction frees meanwhile is made again), its name found or made
 * from d (metadata parsed again: its canonical form), and it goes into the
 * table READY, unheld, as the newest on the chunk LRU. from_store: it came
 * from the remote tier (in_store: never queued for it again); else it is
 * queued for the store ahead of eviction where a tier keeps its type, as a
 * chunk sealed here. id (the id the caller asked for) and `from` ("disk",
 * "remote") name it in the messages. The caller checked tier_chunk_known
 * (d->id) is false. 0; -ENOMEM naming the limit or the device tier (no
 * room now: nothing changed but what eviction took), -ENOMEM (its record),
 * -EIO (its pages could not be copied in): the chunk stays below.
 */
int tier_chunk_adopt(struct engine *eng, const struct tier_chunk_desc *d,
		     const void *const *src, bool from_store,
		     const struct kvp_chunk_id *id, const char *from,
		     struct errbuf *e);

uint32_t tier_chunk_type(const struct chunk *c);
uint32_t tier_chunk_npages(const struct chunk *c);
/* The entry's id, and its name's id (32 bytes each). */
const uint8_t *tier_chunk_id(const struct chunk *c);
const uint8_t *tier_chunk_name_id(const struct chunk *c);
/* Queued for the remote tier whole (or onloaded from it). */
bool tier_chunk_in_store(const struct chunk *c);
void tier_chunk_set_in_store(struct chunk *c, bool in_store);
/* Pages queued for the remote tier so far; one more queued. */
uint32_t tier_chunk_pub_next(const struct chunk *c);
void tier_chunk_pub_advance(struct chunk *c);
/*
 * The other ids a chunk id may be known by in a lower tier: the name id
 * id names (or whose entry id is), and each root entry of that name; each
 * that differs from id goes to fn once. Nothing when the engine does not
 * know id.
 */
void tier_chunk_aliases(struct engine *eng, const struct kvp_chunk_id *id,
			void (*fn)(struct engine *eng, const uint8_t id[32]));

/* Device frames eviction can free from the shared world (unheld chunks,
 * idle prefix pages), and evicting its oldest such item (through the
 * tiers' demote_prefix / demote_chunk): frames freed. */
uint64_t tier_shared_evictable(const struct engine *eng);
uint32_t tier_shared_evict_oldest(struct engine *eng);

/* ------------------------------------------------------------ publishing */

/* The oldest prefix page / root chunk the remote tier does not have yet
 * (NULL: none), and taking one off that list. */
struct pc_entry *tier_pub_pc_first(struct engine *eng);
void tier_pub_pc_take(struct pc_entry *pe);
struct chunk *tier_pub_chunk_first(struct engine *eng);
void tier_pub_chunk_take(struct chunk *c);
/* Whether either list still has something. */
bool tier_pub_pending(const struct engine *eng);

#endif /* KVPOOL_TIER_SERVICES_H */
