/* SPDX-License-Identifier: MIT */
/*
 * disk_tier_internal.h - the disk tier's state, shared by disk_tier.c (the
 * index, the thread) and disk_scan.c (the warm restart's scan).
 */
#ifndef KVPOOL_DISK_TIER_INTERNAL_H
#define KVPOOL_DISK_TIER_INTERNAL_H

#include <pthread.h>
#include <time.h>

#include "disk_record.h"
#include "disk_store.h"
#include "disk_tier.h"
#include "list.h"

#define DISK_NONE UINT32_MAX
#define DISK_TENANTS_MAX 256u
#define DISK_STAGING_DEFAULT (64ull << 20)
#define DISK_BATCH_PAGES 256u  /* pages one pass of the thread moves, each way */
#define DISK_REG_Q 64u         /* host tiers waiting to be registered */

/*
 * An entry's life. put: STAGED (pages in staging, queued) -> WRITING (the
 * thread has it) -> ONDISK (slots hold it; on the LRU). get: ONDISK ->
 * READING -> READY (pages in staging again) -> take (gone). A get of a
 * STAGED entry serves the staging copy at once; one of a WRITING entry
 * sets want, and once written the thread makes its staging copy ready
 * (in_stage: READING without I/O, decoding compressed pages in place).
 */
enum disk_state { DS_STAGED, DS_WRITING, DS_ONDISK, DS_READING, DS_READY };

struct pass;

struct disk_entry {
	struct disk_key k;
	uint64_t start, len, snap;
	uint32_t npages;
	uint32_t *slot;          /* [npages] disk slot, DISK_NONE before write */
	uint32_t *stage;         /* [npages] staging slot, DISK_NONE when none */
	enum disk_state state;
	bool want;               /* a get waits: ready after the write */
	bool in_stage;           /* READING from its staging copy, no I/O */
	/* disk_tier_get_into: the caller holds it (no one else gets it, it
	 * is off the LRU, a drop only marks it gone) and wants its pages in
	 * dst; into once they are read there (hblk: their header blocks
	 * while the read is on). */
	bool held, into;
	void **dst;              /* [npages] or NULL */
	uint32_t *hblk;          /* [npages] header blocks, or NULL */
	uint64_t ready_ns;       /* when it became READY */
	bool gone;               /* dropped while the thread held it */
	struct disk_entry *hnext;        /* index chain */
	struct list_head lru;            /* LRU of ONDISK entries; self-linked off it */
	struct disk_entry *qnext;        /* write or read queue */
};

struct disk_use {
	uint64_t tenant;
	uint64_t quota;          /* slots, 0: none */
	uint64_t slots, users, pages;
	uint64_t prefix_pages, chunks, chunk_pages; /* of pages, by kind */
	uint64_t demoted_pages, dropped_pages, read_pages;
	uint64_t bytes_raw, bytes_stored;
};

struct disk_queue {
	struct disk_entry *head, *tail;
};

struct disk_tier {
	pthread_mutex_t mu;
	pthread_cond_t work;     /* the thread: something queued */
	pthread_cond_t done;     /* callers: something finished */
	pthread_t thread;
	bool running, stop, idle;
	struct disk_store *st;
	uint64_t slot_bytes, page_bytes;
	uint32_t P;
	uint64_t layout_id;
	struct disk_codec codec;
	struct disk_codec_ctx *cx; /* the thread's */
	void *raw;               /* the thread's decode buffer (page_bytes) */
	void *inval_block;       /* DISK_ALIGN bytes: a DISK_FREE_MAGIC header */
	struct pass *pass;       /* the thread's (disk_thread.c) */
	/* Disk slots and staging slots: free stacks, lowest on top. */
	uint32_t *free_slots, nfree;
	char *stage_base;
	uint32_t nstage, *stage_free, nstage_free;
	/* Header blocks of reads straight into a caller's memory: nstage of
	 * DISK_ALIGN bytes (a page's header needs no staging slot). */
	char *hblk_base;
	uint32_t *hblk_free, nhblk_free;
	/* (tenant, pool, user) -> entry */
	struct disk_entry **bucket;
	uint32_t nbucket;
	struct list_head lru;    /* ONDISK entries (disk_entry.lru), oldest first */
	struct disk_queue wq, rq;
	uint32_t *inval, ninval, inval_cap; /* page-0 slots to mark free */
	uint64_t next_snap;
	struct disk_use use[DISK_TENANTS_MAX];
	uint32_t nuse;
	uint64_t write_ns, read_ns, codec_ns, bad_records, into_pages;
	uint64_t other_records;     /* the scan's: another layout's */
	uint64_t progress;       /* disk_tier_progress() */
	/* Demotions refused for want of room (disk_tier_put): one log line a
	 * second at most, with the count of those not logged. */
	uint64_t put_drop_logged_ns, put_drops_quiet;
	/* Host tiers to register as fixed buffers: the thread does it (it
	 * pins and faults in the whole region: seconds for a large one, not
	 * on kvpoold's start); registering: the one it is on. */
	struct { void *base; uint64_t bytes; } reg_q[DISK_REG_Q];
	uint32_t nreg_q;
	void *registering;
	int last_err;            /* of the last failed write, for the log */
	void (*log)(int prio, const char *msg);
};

/* Count e (d = 1) or uncount it (d = -1) in its tenant's figures. */
static inline void disk_use_count(struct disk_use *u, const struct disk_entry *e,
				  int64_t d)
{
	u->pages += (uint64_t)(d * e->npages);
	if (!e->k.kind)
		u->users += (uint64_t)d;
	else if (e->k.kind == DISK_KIND_PREFIX)
		u->prefix_pages += (uint64_t)(d * e->npages);
	else {
		u->chunks += (uint64_t)d;
		u->chunk_pages += (uint64_t)(d * e->npages);
	}
}

/* What e is, for log lines: "user 7", "prefix page 1a2b..", "chunk ..". */
void disk_key_name(const struct disk_key *k, char *out, size_t n);

static inline uint64_t disk_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* disk_tier.c */
void disk_index_remove(struct disk_tier *dt, struct disk_entry *e);
/* Free e's staging and disk slots (page 0 marked free on disk first with
 * invalidate) and e; it is in no index, list or queue. */
void disk_entry_destroy(struct disk_tier *dt, struct disk_entry *e,
			bool invalidate);
/* An ONDISK entry dropped for room: off the LRU and the index, freed. */
void disk_lru_unlink_drop(struct disk_tier *dt, struct disk_entry *e);
struct disk_use *disk_use_of(struct disk_tier *dt, uint64_t tenant);
void disk_index_insert(struct disk_tier *dt, struct disk_entry *e);
void disk_lru_push(struct disk_tier *dt, struct disk_entry *e);
struct disk_entry *disk_entry_new(uint32_t npages);
/* Give e's header blocks back (its read is checked). */
void disk_hblk_release(struct disk_tier *dt, struct disk_entry *e);
void disk_logf(struct disk_tier *dt, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A page's record header and payload wherever the entry's page i is:
 * its staging slot, or its header block and dst[i]. */
static inline char *disk_rec_of(const struct disk_tier *dt,
				const struct disk_entry *e, uint32_t i)
{
	if (e->into)
		return dt->hblk_base + (uint64_t)e->hblk[i] * DISK_ALIGN;
	return dt->stage_base + (uint64_t)e->stage[i] * dt->slot_bytes;
}

static inline char *disk_payload_of(const struct disk_tier *dt,
				    const struct disk_entry *e, uint32_t i)
{
	if (e->into)
		return e->dst[i];
	return disk_rec_of(dt, e, i) + DISK_PAYLOAD_OFF;
}

/* disk_scan.c: rebuild the index from the file (before the thread runs). */
int disk_scan(struct disk_tier *dt, struct errbuf *e);

#endif /* KVPOOL_DISK_TIER_INTERNAL_H */
