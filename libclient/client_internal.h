/* SPDX-License-Identifier: MIT */
/*
 * client_internal.h - struct kvp_client and the helpers the libclient files
 * share. Not installed. The integration tests include it (and link
 * kvpool_client_static) to reach the raw rings, e.g. to write forged SQEs
 * straight into c->sqes and publish them with kvpc_ring_submit().
 *
 * libclient reads as attach (client.c) -> rings (ring.c) -> operations
 * (batch.c: async queue/submit/reap and the one path every call takes;
 * calls.c: the synchronous calls on top of it; share.c: the sharing calls,
 * chunk_id.c, in kvpool_common, their id and type names) -> data ops (append.c; on
 * the cuda backend through cuda.c: the mapping of the GPU pool, the staging
 * ring for slots, and the events commit waits for). Underneath them all:
 * the lease records (lease.c), the growing structs' row copies (rows.c)
 * and the last error (error.c), which call nothing above them; on top, the
 * KVPOOL_0.1 entry points (compat.c), which only call the _sz calls. The
 * calls go one way, no file calling back into one that calls it:
 *
 *     compat.c -> chunk.c, share.c, seq_info.c -> calls.c -> batch.c
 *        -> ring.c -> client.c -> cuda.c -> lease.c -> error.c
 *     append.c -> cuda.c; every file -> rows.c, error.c
 *
 * (append.c checks an append and hands cuda.c the checked records; cuda.c
 * never calls back into append.c.)
 *
 * A client is not thread-safe: one thread at a time may call into it (as with
 * an io_uring). Different clients are independent.
 *
 * THE ARENA SPLIT. The client chooses every SQE's result range (proto.h,
 * ARENA). The arena is cut in two:
 *
 *     [0, sync_off)                    one fixed slice of slice_bytes per
 *                                      operation slot, for async operations;
 *     [sync_off, arena_bytes)          the rest (at least the upper half), for
 *                                      the one synchronous call in progress.
 *
 * slice_bytes = (arena_bytes / 2 / sq_entries) rounded down to 64 bytes and
 * must be at least KVPC_MIN_SLICE (an error message must fit); attach fails
 * with -EINVAL otherwise. sync_off = sq_entries * slice_bytes. A PREPARE
 * whose page table does not fit its range gets -EMSGSIZE from the daemon;
 * the sync range is about sq_entries slices, so a synchronous prepare of a
 * long history fits where an async one does not (kvpool(3), LIMITS).
 *
 * THE BATCH RECORDS (batch_wire.c). kvp_queue_*() holds an async operation
 * instead of pushing it; kvp_submit() pushes what each lane holds as one
 * BATCH entry (proto.h, BATCH; up to KVP_BATCH_MAX items each), or as the
 * plain entry when a lane holds one. A batch's items (40 bytes each), and
 * the item completions the daemon writes over them, sit in the sync range,
 * which no synchronous call uses while anything is in flight: it is cut
 * into one region per lane of lane_recs records, each a ring from which a
 * batch takes a contiguous run and gives it back when its completion is
 * taken (in order of sending; KVPC_LANE_BATCHES in flight at most). When
 * a lane's region or batch list is full, its operations go out plain.
 * Each item keeps its own slot, tag and result slice, so a batch's
 * completions (one, or more when some items waited: proto.h, BATCH) are
 * expanded into its items' completions (kvpc_pend_fill) and reaped
 * exactly like plain ones. A batch may send one completion per item, so
 * its lane is owed that many until its final one comes. A batch tag has bit 63 set (a slot's
 * generation stays below 2^31), the lane in bits 40..62 and the lane's
 * batch sequence below; an item is believed only from its own batch.
 * KVPOOL_BATCH=one (for measuring a lone client on many cores) puts every
 * async operation of the client on one lane (client id % lanes), each
 * batch's items grouped by shard (stable: one user's stay in order), so a
 * submit is one entry for one worker, which takes each shard's lock once.
 * KVPOOL_BATCH=auto[:N] chooses at each submit: one lane for a submit of
 * at most N operations (default KVPC_ONE_MAX), their shards' lanes for a
 * bigger one; it changes its choice only when that keeps every user's
 * operations on one lane (batch_wire.c, route).
 *
 * OPERATION SLOTS AND TAGS. Every operation, sync or async, holds one of
 * sq_entries slots from SQE queueing until its CQE is reaped; that bounds
 * what is queued + unreaped by sq_entries (<= cq_entries, so every
 * completion has room in the CQ). The SQE's tag is (generation << 32) | slot;
 * the generation is bumped each time the slot is taken, so a CQE naming a
 * free slot, a stale generation, or a slot whose SQE was never published is
 * caught (-EPROTO, and the client is marked broken). Slots are recycled
 * first-in first-out so an async result stays readable as long as possible.
 */
#ifndef KVPOOL_CLIENT_INTERNAL_H
#define KVPOOL_CLIENT_INTERNAL_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "hashtab.h"
#include "kvpool.h"
#include "proto.h"

/* Public entry points: the library is built with hidden visibility. */
#define KVP_PUBLIC __attribute__((visibility("default")))

#define KVPC_MIN_SLICE 256u      /* an async slot's result slice: >= KVP_ERRLEN */
#define KVPC_LANE_BATCHES 64u    /* BATCH entries in flight per lane */
#define KVPC_ONE_MAX 64u         /* KVPOOL_BATCH=auto: one lane up to this */
enum { KVPC_SLOT_PLAIN, KVPC_SLOT_HELD, KVPC_SLOT_BATCH, KVPC_SLOT_EXPANDED };
#define KVPC_DEFAULT_SPIN_US 20u /* spin before sleeping for completions */
#define KVPC_SPIN_MAX_NS 500000ull /* adaptive spin's cap (ring.c) */
#define KVPC_SLEEP_MS 100        /* futex timeout between hang-up checks */
#define KVPC_ATTACH_TIMEOUT_S 10 /* hello -> welcome */

/*
 * One ring pair (proto.h, LANES). The indices are ours (ring.c); never read
 * back from shared memory.
 */
struct kvpc_lane {
	struct kvp_ring_ctl *ctl;     /* shared indices, flags, futex words */
	struct kvp_sqe *sqes;         /* sq_entries entries */
	struct kvp_cqe *cqes;         /* cq_entries entries */
	uint32_t sq_tail;             /* next SQ position to write */
	uint32_t sq_published;        /* last value stored to ctl->sq_tail */
	uint32_t cq_head;             /* next CQ position to read */
	uint32_t cq_released;         /* last value stored to ctl->cq_head */
	uint32_t cq_ready_to;         /* cq_tail as kvpc_cq_ready() last read it */
	uint32_t cq_owed;             /* published entries not yet seen completing */
	uint32_t sq_head_seen;        /* sq_head as sq_room() last read it */
	/* batch_wire.c: async operations queued, not yet pushed (a list of
	 * slots through kvpc_slot.held_next), and the lane's BATCH entries
	 * in flight with their records (THE BATCH RECORDS). */
	uint32_t held_first, held_last, nheld;
	uint32_t rec_head, rec_tail;  /* records taken / given back */
	uint32_t bat_head, bat_tail;  /* batches sent / done (free-running) */
	struct kvpc_batch *bats;      /* KVPC_LANE_BATCHES */
};

/* One BATCH entry in flight on a lane (batch_wire.c). */
struct kvpc_batch {
	uint32_t rec;       /* its first record (lane-relative, mod records) */
	uint32_t rec_end;   /* rec_head after it was taken */
	uint32_t nitems;
	uint32_t pos;       /* the SQ position of its entry */
	uint32_t answered;  /* items its completions gave so far */
	uint32_t ncqes;     /* completions taken for it */
	uint32_t done;      /* its final completion was taken */
};

/* One operation slot (see OPERATION SLOTS above). */
struct kvpc_slot {
	uint64_t user_tag;  /* the caller's tag (async) */
	uint64_t user;      /* INFO / PREPARE: the user asked about */
	uint32_t gen;       /* bumped each time the slot is taken */
	uint32_t pos;       /* SQ position its SQE was written at, */
	uint32_t lane;      /* in this lane's SQ */
	uint32_t n;         /* PREPARE: n_new asked for */
	uint64_t lease;     /* COMMIT / RELEASE: the lease it ends (lease.c) */
	uint8_t op;         /* enum kvp_opcode */
	uint8_t busy;
	uint8_t sync;       /* result range is the sync range */
	uint8_t stage;      /* KVPC_SLOT_*: plain, held, in a batch, expanded */
	uint16_t batch_i;   /* its item index in its batch */
	uint32_t batch_seq; /* its lane's batch (bat_head when sent) */
	uint32_t held_next; /* the next held slot of its lane (UINT32_MAX: last) */
	struct kvp_sqe sqe; /* held: the entry it will be, or the item */
	struct kvp_error_info err; /* a failed completion's detail, reaped
				    * (kvp_completion_error_info) */
};

struct kvp_client {
	/* ---- attach (client.c) */
	int sock;                     /* the attach socket; its hang-up = death */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	uint32_t client_id;
	uint32_t flags;               /* KVP_WELCOME_* */
	char tenant[32];
	char backend[16];
	struct kvp_layout layout;
	uint64_t tier_bytes[KVP_TIERS];
	uint32_t tier_frames[KVP_TIERS];
	uint32_t spin_us;
	uint64_t wait_avg_ns;         /* ring.c: recent completion waits */

	/* ---- the client's shm: [hdr][lanes: ctl, sqes, cqes][arena] */
	void *shm;
	size_t shm_bytes;
	struct kvpc_lane *lanes;      /* nlanes ring pairs (proto.h, LANES) */
	uint32_t nlanes;
	uint32_t shards;              /* welcome.shards: users -> lanes */
	uint32_t tp, rank;            /* welcome.tp, .rank (tensor-parallel pool) */
	uint32_t cq_next;             /* the lane kvpc_cq_take() looks at first */
	unsigned char *arena;         /* arena_bytes bytes */
	uint32_t sq_entries, sq_mask; /* per lane */
	uint32_t cq_entries, cq_mask;
	uint32_t arena_bytes;
	/* ---- operations (batch.c) */
	struct kvpc_slot *slots;      /* sq_entries */
	struct kvp_cqe *pend;         /* batch_wire.c: item completions taken */
	uint32_t pend_head, pend_tail;/* out of BATCH completions, not reaped */
	uint32_t lane_recs;           /* records per lane (THE BATCH RECORDS) */
	int32_t one_lane;             /* KVPOOL_BATCH=one: every async operation
				       * on this lane; -1: on its shard's
				       * (=auto: the current choice) */
	uint32_t one_max;             /* KVPOOL_BATCH=auto[:N]: N (0: off) */
	uint32_t *free_slots;         /* FIFO of free slot indices, sq_entries */
	uint32_t free_head, free_tail;
	uint32_t inflight;            /* slots taken: queued + submitted, unreaped */
	uint32_t queued;              /* SQEs written but not yet published */
	uint32_t slice_bytes;         /* per async slot, at slot * slice_bytes */
	uint32_t sync_off, sync_bytes;

	/* ---- the tenant's device tier (NULL / -1 for an admin-only client) */
	void *device;                 /* shm: the host mapping; cuda: the device
				       * pointer of the mapping (cuda.c) */
	size_t device_bytes;
	int device_fd;                /* unused since protocol 2: always -1 */
	int cuda_device;              /* the pool's CUDA device; -1 on shm */
	struct kvpc_cuda *cuda;       /* cuda.c state; NULL on shm */

	/* ---- lease.c: the leases this client holds, by id (struct
	 * kvpc_lease); buckets NULL until the first lease */
	struct hashtab leases;
	struct kvpc_lease *lease_cache; /* free small records, for reuse */
	uint32_t lease_cached;

	/* ---- append.c: host slots for the shm data ops and the checked
	 * records of a batch's items, grown on demand */
	struct kvp_slot *scratch;
	uint32_t scratch_cap;
	struct kvpc_lease **recs;
	uint32_t recs_cap;

	/* ---- fork (client.c, INHERITED CLIENTS) */
	pid_t pid;                    /* the process that attached */
	uint32_t fork_gen;            /* kvpc_fork_gen when it attached */

	/* ---- errors */
	int dead;                     /* sticky: -ECONNRESET, -EPROTO; 0 = fine */
	char dead_msg[KVP_ERRLEN];
	char err[KVP_ERRLEN];         /* kvp_last_error() */
	struct kvp_error_info errinfo; /* kvp_last_error_info(): kvpoold's
				       * detail of the last failure (calls.c),
				       * zeroed by every library error */
};

/*
 * THE LEASE RECORD. One per lease this client holds, whatever made it
 * (prepare, reap, seq_alloc/create/extend, chunk_register/acquire,
 * compose), and the only thing libclient knows about a lease: the data ops
 * trust it and nothing the caller passes but the id, and on the cuda
 * backend it also says which appends of the lease may still be running on
 * the GPU.
 *
 * Owner: lease.c allocates, indexes (c->leases, lib/hashtab keyed by id)
 * and frees records; nothing else frees one or keeps a pointer to one
 * across calls. The operations (batch.c, calls.c, chunk.c, share.c) move
 * state as the comment in lease.c says; cuda.c writes only the gpu_*
 * fields.
 *
 * Locking: none. A client is used by one thread at a time, so a record is
 * read and written by that thread only; the GPU never reads it.
 *
 * Order with respect to appends, completions and cuda events:
 *  1. an append is checked once, at its public entry (append.c): the
 *     record is OPEN and the tokens lie within its n_new. The slots then
 *     come from its frames (kvpc_lease_slots, each frame checked against
 *     the tier) into host memory (shm: written by the CPU before the call
 *     returns) or into a cuda staging entry (cuda.c);
 *  2. cuda.c records the staging entry's event behind the launch and only
 *     then notes (entry, generation) in gpu_stage/gpu_gen; an entry reused
 *     since (its generation moved on) is known to have completed;
 *  3. a commit or release first waits for the noted events
 *     (kvpc_cuda_wait_lease: the bytes landed) and empties the list, then
 *     queues its SQE and moves the record out of OPEN in the same call, so
 *     no append of the lease can start between the wait and the daemon
 *     seeing the commit;
 *  4. a completion (reap, or the sync call's) moves the record on: a failed
 *     commit makes it OPEN again (appends resume, noted afresh), a release
 *     drops it. A record the daemon ended (extend, seal) had its commit
 *     wait already. A dropped record forgets its notes; the staging ring
 *     still holds the events, and kvp_close() waits for every one of them
 *     (kvpc_cuda_detach) before it frees the records.
 */
enum kvpc_lease_state {
	KVPC_LEASE_OPEN = 1,       /* writable */
	KVPC_LEASE_COMMITTING = 2, /* a commit is queued (async) */
	KVPC_LEASE_CLOSED = 3,     /* committed: readable, not writable */
	KVPC_LEASE_RELEASING = 4,  /* a release is queued (async) */
};

enum kvpc_lease_kind {
	KVPC_LEASE_HISTORY = 1,    /* prepare of a user history */
	KVPC_LEASE_SEQ = 2,        /* a sequence's write lease (seq = its id) */
	KVPC_LEASE_CHUNK_FILL = 3, /* a registered chunk's fill lease */
	KVPC_LEASE_READ = 4,       /* chunk_acquire: read-only */
	KVPC_LEASE_COMPOSE = 5,    /* a composition's hold on its chunks */
};

/* GPU appends of one lease noted at most; one more waits for the oldest. */
#define KVPC_LEASE_GPU_NOTES 4u

struct kvpc_lease {
	struct hnode node;         /* in c->leases, hashed from id */
	uint64_t id;
	uint64_t seq;              /* KVPC_LEASE_SEQ: the sequence */
	uint64_t len;              /* committed tokens before the lease */
	uint32_t n_new;
	uint32_t npages;
	uint32_t committed;        /* CLOSED: tokens the commit kept */
	uint8_t state;             /* enum kvpc_lease_state */
	uint8_t kind;              /* enum kvpc_lease_kind */
	uint8_t release_queued;    /* COMMITTING with release: gone on success */
	uint8_t state_before;      /* RELEASING: the state a refused release
				    * returns to (OPEN or CLOSED) */
	/* cuda.c: appends that may still be in flight, oldest first, as
	 * (staging entry, its generation at the launch) pairs. */
	uint8_t gpu_n;
	uint8_t gpu_stage[KVPC_LEASE_GPU_NOTES];
	uint32_t gpu_gen[KVPC_LEASE_GPU_NOTES];
	uint32_t cap;              /* frames[] room, in 32-bit words */
	struct kvpc_lease *free_next; /* on the client's record cache */
	int32_t frames[];          /* npages device frames, copied at decode */
};

/* Record *l (just decoded from the arena): copy its page table and point
 * l->indices at the copy. id 0 (no lease) records nothing. 0 or -ENOMEM
 * with the last error set (the daemon still holds the lease). */
int kvpc_lease_add(struct kvp_client *c, struct kvp_lease *l, uint8_t kind,
		   uint64_t seq);
/* Record a held composition: a copy of its bytes-long result at *copy,
 * kept until the release. 0 or -ENOMEM (no message set). */
int kvpc_lease_add_blob(struct kvp_client *c, uint64_t id, const void *src,
			uint32_t bytes, const unsigned char **copy);
struct kvpc_lease *kvpc_lease_find(const struct kvp_client *c, uint64_t id);
/* The record of an OPEN lease in *out, or -ESTALE naming the lease and why
 * (not held by this client, committed, commit or release queued). */
int kvpc_lease_open(struct kvp_client *c, uint64_t id, const char *what,
		    struct kvpc_lease **out);
/* Whether the daemon's answer to a release (or seal) means it no longer
 * holds the lease for this client: done, or never held (unknown, another
 * client's). Then the record goes. */
static inline int kvpc_lease_ended(int res)
{
	return res >= 0 || res == -ENOENT || res == -EPERM;
}
/* Forget a lease (released, or ended by the daemon); frees its page table. */
void kvpc_lease_drop(struct kvp_client *c, uint64_t id);
/* Forget every lease of sequence seq but keep. */
void kvpc_lease_drop_seq(struct kvp_client *c, uint64_t seq, uint64_t keep);
void kvpc_lease_table_free(struct kvp_client *c);
/* Leases held (records in the table). */
static inline uint64_t kvpc_lease_count(const struct kvp_client *c)
{
	return c->leases.count;
}
/* The slots of new tokens [first, first + n) of r, whose range the caller
 * checked (kvpc_lease_open and r->n_new), into out. Every frame is read
 * once from the record, checked against the device tier and only then
 * written. 0 or -EINVAL with the last error set. */
int kvpc_lease_slots(struct kvp_client *c, const struct kvpc_lease *r,
		     uint32_t first, uint32_t n, struct kvp_slot *out);

/* error.c: the client's last error. kvpc_err() returns code. */
__attribute__((format(printf, 3, 4)))
int kvpc_err(struct kvp_client *c, int code, const char *fmt, ...);
/* A cqe's failure detail (proto.h FAILURE DETAIL), all zero unless it failed. */
void kvpc_cqe_error_info(const struct kvp_cqe *cqe, struct kvp_error_info *out);
/* Mark the client broken (daemon gone, ring corrupt): every later call
 * fails with code and this message. Returns code. */
__attribute__((format(printf, 3, 4)))
int kvpc_fail(struct kvp_client *c, int code, const char *fmt, ...);
/* Fail with the sticky error if the client is broken, or with -ECHILD if
 * this process inherited it across fork(); else 0. */
int kvpc_check_dead(struct kvp_client *c);
/* Bumped in every child fork() makes (client.c, INHERITED CLIENTS), from
 * the first kvpc_fork_watch() on. */
extern uint32_t kvpc_fork_gen;
void kvpc_fork_watch(void);
/* Whether this process is not the one that attached c (the slow check,
 * with getpid(), kvp_close() makes). */
int kvpc_is_inherited(const struct kvp_client *c);
/* -ECHILD with the message that says what to do (error.c). */
int kvpc_inherited(struct kvp_client *c);
/* 0 in the process that attached c; -ECHILD in a child that inherited it.
 * Every call checks this before it touches the rings, the arena, the
 * device tier or a lease. */
static inline int kvpc_check_fork(struct kvp_client *c)
{
	if (__atomic_load_n(&kvpc_fork_gen, __ATOMIC_RELAXED) == c->fork_gen)
		return 0;
	return kvpc_inherited(c);
}
/* -ECONNRESET (and the client broken) if the daemon hung up; else 0. */
int kvpc_check_hangup(struct kvp_client *c);

/* Doorbells rung and client wake-ups so far, over every lane (kvbench's
 * counters: the words live in shared memory, so the daemon's view too). */
static inline uint32_t kvpc_doorbells(const struct kvp_client *c)
{
	uint32_t n = 0;

	for (uint32_t k = 0; k < c->nlanes; k++)
		n += __atomic_load_n(&c->lanes[k].ctl->sq_doorbell, __ATOMIC_RELAXED);
	return n;
}

static inline uint32_t kvpc_client_wakeups(const struct kvp_client *c)
{
	return __atomic_load_n(&c->lanes[0].ctl->cq_seq, __ATOMIC_RELAXED);
}

/* ring.c: SQ producers and CQ consumers (proto.h, RINGS, LANES and
 * WAKE-UPS). */
/* The lane an SQE goes to (proto.h, LANES). */
uint32_t kvpc_lane_of(const struct kvp_client *c, const struct kvp_sqe *sqe);
/* Write *sqe at lane's local tail, waiting for the daemon to free the slot. */
int kvpc_ring_push(struct kvp_client *c, uint32_t lane, const struct kvp_sqe *sqe);
/* Publish every pushed SQE, one store-release per lane that has any; wake a
 * lane's worker only if it sleeps. Returns how many were published. */
uint32_t kvpc_ring_submit(struct kvp_client *c);
/* CQEs ready now over every lane, or -EPROTO (the client is marked broken). */
int kvpc_cq_ready(struct kvp_client *c);
/* Wait (spin, then sleep) until at least want CQEs are ready; returns how
 * many are, or -ECONNRESET / -EPROTO. */
int kvpc_cq_wait(struct kvp_client *c, uint32_t want);
/* Copy out one CQE that kvpc_cq_ready() (or _wait) counted and advance that
 * lane's head locally; kvpc_cq_release() hands the consumed entries back to
 * the daemon. */
void kvpc_cq_take(struct kvp_client *c, struct kvp_cqe *out);
/* The same, saying which lane it came from. */
void kvpc_cq_take_lane(struct kvp_client *c, struct kvp_cqe *out, uint32_t *lane);
void kvpc_cq_release(struct kvp_client *c);

/* batch_wire.c: BATCH entries (proto.h, BATCH). */
/* Per-lane records and item completion queue; at attach, after the slots. */
int kvpc_batch_setup(struct kvp_client *c);
void kvpc_batch_free(struct kvp_client *c);
/* Hold an async operation's slot (its sqe filled) until kvpc_flush(). */
void kvpc_hold(struct kvp_client *c, uint32_t idx);
/* Push what is held, one BATCH entry per lane where two or more wait. */
int kvpc_flush(struct kvp_client *c);
/* Take every ready CQE into the item completion queue (a BATCH entry's
 * completion gives its items'): how many completions are queued now, or
 * -EPROTO. want > 0: wait until at least one is. */
int kvpc_pend_fill(struct kvp_client *c, int wait);

/* batch.c: the path every operation takes. */
/* Take a slot, point sqe at its result range, tag it and push it.
 * Returns the slot index, or -EBUSY / -errno. */
int kvpc_queue(struct kvp_client *c, struct kvp_sqe *sqe, uint64_t user_tag,
	       int sync);
/* The slot a CQE belongs to, or -EPROTO (client marked broken). */
int kvpc_slot_of(struct kvp_client *c, const struct kvp_cqe *cqe);
void kvpc_slot_put(struct kvp_client *c, uint32_t idx);
/* Where a slot's results are. */
unsigned char *kvpc_slot_out(struct kvp_client *c, uint32_t idx,
			     uint32_t *len);
/* The failed CQE's message, NUL-terminated in place (its range); a generic
 * text where the daemon sent none. */
const char *kvpc_cqe_message(struct kvp_client *c, uint32_t idx,
			     const struct kvp_cqe *cqe);
/* Copy a fixed-size result (INFO, STATS) out of the slot's range; -EPROTO
 * with a message in msg if the daemon sent fewer bytes. */
int kvpc_decode_fixed(struct kvp_client *c, uint32_t idx,
		      const struct kvp_cqe *cqe, void *dst, size_t size,
		      const char *what, char *msg, size_t msglen);
/* rows.c (kvpool.h, GROWING STRUCTS): 0 when size is a size the caller's
 * struct may have (>= ver0, a multiple of 8), else -EINVAL naming what. */
int kvpc_row_size(struct kvp_client *c, size_t size, size_t ver0,
		  const char *what);
/* n rows of have bytes at src to dst at stride size: min(size, have) bytes
 * each, the rest of a larger row zeroed. */
void kvpc_rows_put(void *dst, size_t size, const void *src, size_t have,
		   uint32_t n);
/* Input arrays (kvp_seq_src, ...): n elements of the caller's size as
 * this library's own-byte structs in *out, the array itself when the
 * sizes match, else a copy in *tmp (free() it; NULL when none): missing
 * fields 0, bytes set past own -E2BIG. n 0 or src NULL: nothing checked. */
int kvpc_rows_in(struct kvp_client *c, const void *src, size_t size,
		 size_t own, size_t ver0, uint32_t n, const void **out,
		 void **tmp, const char *what);
/* kvpc_row_size() for kvp_reap's completions (two layouts). */
int kvpc_completion_size(struct kvp_client *c, size_t size);
/* One completion in the caller's layout: 0.1's for KVP_COMPLETION_SIZE_VER0,
 * else a prefix of (or zero-filled past) this library's. */
void kvpc_completion_put(void *dst, size_t size, const struct kvp_completion *k);
/* Fill *l from a PREPARE result; -EPROTO with a message in msg if the
 * daemon's bytes are malformed. */
int kvpc_decode_lease(struct kvp_client *c, uint32_t idx,
		      const struct kvp_cqe *cqe, struct kvp_lease *l,
		      char *msg, size_t msglen);
/* The same for a kvp_prepare_out + frames at src (bytes long, inside the
 * arena): n_new must be want_n_new (UINT32_MAX: any); l->user = user. */
int kvpc_decode_lease_at(struct kvp_client *c, const unsigned char *src,
			 uint32_t bytes, uint32_t want_n_new, uint64_t user,
			 struct kvp_lease *l, char *msg, size_t msglen);

/* calls.c: run one operation synchronously (results in the sync range).
 * Returns the CQE's res (>= 0) with *cqe filled and *idx the slot, whose
 * result range stays readable until the next call; or -errno with the last
 * error set (the daemon's message). */
/* share.c: helpers of the sharing calls (share.c, chunk.c). */
/* Room for bytes of input at the start of the sync range, named in sqe;
 * NULL (last error set) when it does not fit (-E2BIG) or the client was
 * inherited across fork() (-ECHILD): kvpc_input_fail() says which. */
unsigned char *kvpc_input(struct kvp_client *c, struct kvp_sqe *sqe,
			  uint64_t bytes, const char *what);
static inline int kvpc_input_fail(struct kvp_client *c)
{
	return kvpc_check_fork(c) ? -ECHILD : -E2BIG;
}
int kvpc_null_arg(struct kvp_client *c, const char *what, const char *arg);
/* A lease result at offset off of slot idx's output. */
int kvpc_decode_lease_off(struct kvp_client *c, uint32_t idx,
			  const struct kvp_cqe *cqe, size_t off,
			  uint32_t want_n_new, uint64_t user, struct kvp_lease *l);
/* A call returning a lease with n_new == want (UINT32_MAX: any). */
int kvpc_call_lease(struct kvp_client *c, struct kvp_sqe *sqe,
		    uint32_t want_n_new, uint64_t user, struct kvp_lease *out);
int kvpc_call_res(struct kvp_client *c, struct kvp_sqe *sqe);
/* A call whose input is one chunk id. */
int kvpc_put_id(struct kvp_client *c, struct kvp_sqe *sqe,
		const struct kvp_chunk_id *id, const char *what);

int kvpc_call(struct kvp_client *c, struct kvp_sqe *sqe, struct kvp_cqe *cqe,
	      uint32_t *idx);

/*
 * cuda.c: the cuda backend (client side). Without KVPOOL_HAVE_CUDA every
 * one of these fails with -EOPNOTSUPP ("built without CUDA") or does
 * nothing.
 */
/* One append: the items' slots, and where their bytes are (kv, or the
 * per-layer k / v arrays of one item). */
struct kvpc_cuda_job {
	const struct kvp_append_item *items;
	struct kvpc_lease *const *recs; /* items[i]'s record, checked: OPEN,
				       * the item's range within its n_new */
	uint32_t count;
	uint32_t n;                   /* sum of items[].n, > 0 */
	const void *kv;               /* [n][layers][2][heads][dim], or NULL */
	const void *const *k, *const *v; /* host arrays of layers device ptrs */
	int32_t layer;                /* -1: every layer; else k and v hold one
				       * pointer each, for this layer only */
	void *stream;                 /* cudaStream_t; NULL: legacy default */
	int sync;                     /* wait for it (kvp_append) */
};
/*
 * Layer `layer` of a tier at base seen as a pool of one layer: the same
 * strides and page stride (page_bytes), layers 1, base moved by layer *
 * layer_stride. Every append kernel addresses frame f, layer 0 at base +
 * f * page_bytes, so through this view it writes exactly that layer's rows
 * (kvp_append_layer_async: one layer, the existing kernels).
 */
static inline void *kvpc_one_layer(const struct kvp_layout *l, uint32_t layer,
				   void *base, struct kvp_layout *sub)
{
	*sub = *l;
	sub->layers = 1;
	sub->token_bytes = 2 * l->token_stride;
	return (unsigned char *)base + (uint64_t)layer * l->layer_stride;
}
/* Find the GPU whose UUID is uuid among this process's devices (`device`
 * is its ordinal in the daemon, for messages), import *fd (a cuMemCreate
 * POSIX fd) there, map tier_bytes[DEVICE] bytes and set c->device and
 * c->cuda_device (this process's ordinal); closes *fd (-1 after). -ENODEV
 * when that GPU is not visible here. */
int kvpc_cuda_attach(struct kvp_client *c, int *fd, int32_t device,
		     const uint8_t uuid[16]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi -L's form). */
#define KVPC_UUID_STRLEN 41
void kvpc_uuid_format(const uint8_t uuid[16], char out[KVPC_UUID_STRLEN]);
/* The index of want in seen[n] (this process's devices' UUIDs, by
 * ordinal): the ordinal to use. -ENODEV with a message naming the GPU,
 * daemon_ordinal and $CUDA_VISIBLE_DEVICES when it is not there; -EPROTO
 * for an all-zero want (a daemon that sent no UUID). No CUDA needed. */
int kvpc_cuda_pick(struct kvp_client *c, const uint8_t want[16],
		   int32_t daemon_ordinal, const uint8_t (*seen)[16], int n);
/* Wait for every append in flight, unmap and free (kvp_close). */
void kvpc_cuda_detach(struct kvp_client *c);
/* Stage the slots (from the checked records: nothing is checked again but
 * the frames, kvpc_lease_slots), copy them over and launch, all on
 * j->stream; note the launch in each record. */
int kvpc_cuda_append(struct kvp_client *c, const struct kvpc_cuda_job *j);
/* Before a commit or release of lease: wait until every append of it
 * noted in its record landed (THE LEASE RECORD, 3; the commit ordering
 * rule, kvpool.h). 0 (also for a lease not held) or -EIO. */
int kvpc_cuda_wait_lease(struct kvp_client *c, uint64_t lease);

#endif /* KVPOOL_CLIENT_INTERNAL_H */
