/* SPDX-License-Identifier: MIT */
/*
 * proto.h - the wire protocol between libkvpool and kvpoold. Not installed:
 * both sides are built from this tree and the attach handshake checks the
 * version, so the layout below can change with KVP_PROTO_VERSION.
 *
 * ATTACH. The client connects to the daemon's SOCK_SEQPACKET Unix socket and
 * sends one struct kvp_hello. The daemon checks the peer with SO_PEERCRED
 * (allow_uids / allow_gids, tenant mapping, admin_uids), then answers one
 * struct kvp_welcome. On success the welcome carries, with SCM_RIGHTS, in
 * this order:
 *     fds[0]  the client's shm: a memfd sealed against grow/shrink/seal,
 *             laid out as struct kvp_shm_hdr says;
 *     fds[1]  the tenant's device tier (absent for a client with no tenant,
 *             i.e. an admin-only kvctl): map welcome.tier_bytes[DEVICE] bytes.
 * welcome.nfds says how many came. The socket stays open for the client's
 * lifetime: its hang-up is how the daemon learns the client died, and it also
 * carries the "uds" request mode (one kvp_sqe in, one kvp_cqe plus the
 * result bytes out, in one message) that kvbench compares the ring against.
 *
 * SHM LAYOUT (offsets in kvp_shm_hdr, each 64-byte aligned):
 *     [hdr][lane 0: ring ctl, sq entries, cq entries][lane 1: ...]...[arena]
 * Lane k's ctl, sq and cq sit lane_bytes * k past lane 0's (ctl_off,
 * sq_off, cq_off). The daemon writes hdr once before sending the fd and
 * never reads it back.
 *
 * LANES (v7). A client has hdr.lanes ring pairs (SQ + CQ), one per daemon
 * worker; worker k consumes lane k of every client and nothing else. A user
 * belongs to shard mix64_shard(user, welcome.shards) (lib/mix64.h; the
 * engine's shards own users, daemon/engine/include/shard.h), and shard s to lane
 * s % lanes (kvp_lane_of_user below), so with shards = workers (the default) a worker
 * only ever takes its own shard's lock and touches its own shard's lines:
 * clients, not workers, carry entries to the core that owns their user.
 * A lease carries its shard in bits 24..30 (bit 31: a sharing lease, shard
 * 0's), so a commit or release goes to the lane of its prepare.
 *
 * Order. Every entry of one user goes to one lane, so the ring's FIFO keeps
 * that user's entries in submission order as before. (libkvpool's
 * KVPOOL_BATCH=one puts all of a client's async entries on one lane
 * instead, and =auto chooses per submit, moving only when nothing is in
 * flight on the lanes it leaves: either way a user's entries in flight
 * are on one lane.) Entries of different
 * lanes are unordered with respect to each other; what needs them ordered
 * is fenced by the client: libkvpool only queues the single-user
 * operations (INFO, PREPARE, COMMIT, RELEASE) asynchronously, and a
 * synchronous call (every cross-shard operation: sharing, stats, evict or
 * offload of all, listings) runs only when nothing is in flight on any
 * lane, so it is ordered after everything before it and before everything
 * after it. Cross-shard entries go to lane 0. Routing is a promise the
 * client keeps for its own sake: the daemon executes an entry on whatever
 * lane it arrives, taking the locks the operation needs, so a client that
 * routes wrongly only loses its own ordering, never anyone's bytes.
 *
 * Wake-ups of the client are per client, not per lane: it sleeps on lane
 * 0's cq_seq with lane 0's cq_waiters set, and a worker that published
 * completions on any lane wakes it through lane 0's words (the cq_waiters
 * and cq_seq lines of the other lanes are unused). Doorbells stay per lane:
 * each worker sleeps on its own lanes' sq_doorbell.
 *
 * RINGS. Single producer, single consumer each, free-running uint32 indices
 * masked on access (entries are powers of two). The submission ring (SQ) is
 * produced by the client and consumed by the daemon; the completion ring (CQ)
 * the other way. Each index is written by one side only and sits on its own
 * cache line:
 *
 *   client: write sqes[sq_tail & mask]; store-release sq_tail      (S1)
 *   daemon: load-acquire sq_tail (pairs with S1); copy the entry out ONCE,
 *           validate the copy, execute; write the result into the arena and
 *           cqes[cq_tail & mask]; store-release cq_tail             (D1)
 *           store-release sq_head after the entry was copied out    (D2)
 *   client: load-acquire cq_tail (pairs with D1), read the cqe and the arena
 *           bytes it names; store-release cq_head                   (C1)
 *   daemon: load-acquire cq_head (pairs with C1) before reusing a cq slot.
 *
 * The daemon keeps its own copy of sq_head and cq_tail (it never trusts the
 * values in shared memory), reads sq_tail and cq_head once per pass, and
 * treats tail - head > entries as a broken client (it is detached). It takes
 * an SQE only when the CQ has room for its completion, so a completion is
 * never dropped; a client that does not reap simply stalls itself.
 *
 * WAKE-UPS. The daemon's worker polls while busy. Before it sleeps it sets
 * KVP_RING_NEED_WAKEUP in ctl->sq_flags, then re-checks sq_tail (store-load
 * ordered by a full fence on both sides, as io_uring's SQPOLL does), then
 * waits on ctl->sq_doorbell (futex_waitv over all of its clients). A client
 * that published entries reads sq_flags after a full fence and, only when
 * NEED_WAKEUP is set, increments sq_doorbell and FUTEX_WAKEs it.
 * The reverse: a client that wants to sleep for completions sets
 * ctl->cq_waiters = 1, fences, re-checks cq_tail and FUTEX_WAITs on
 * ctl->cq_seq; the daemon, after publishing completions, fences, and when
 * cq_waiters is set increments cq_seq and FUTEX_WAKEs it.
 *
 * ARENA. Variable-sized results (page tables, lists, stats, error messages)
 * go to [out_off, out_off + out_len) of the client's arena, a range the
 * client chooses per SQE; the daemon checks it with overflow-safe bounds
 * (out_len <= arena_bytes && out_off <= arena_bytes - out_len) and writes
 * nothing outside it. The client must not reuse a range before it reaped the
 * SQE's completion.
 *
 * INPUTS (v3). Variable-sized inputs (token ids, sources, metadata, filters,
 * compose requests) sit in [in_off, in_off + in_len) of the same arena,
 * written by the client before it publishes the SQE (S1 orders them). The
 * daemon checks the range like the result range, copies it ONCE into
 * private memory, and only then validates and uses the copy: a client that
 * rewrites its arena meanwhile changes nothing the daemon sees. Because the
 * input is copied before any result byte is written, the input and result
 * ranges may overlap (libkvpool puts both in its sync range). Opcodes that
 * take no input need in_off == in_len == 0. Every layout below is made of
 * naturally aligned fields with no implicit padding, and every count in it
 * is checked against in_len with overflow-safe arithmetic before use: the
 * length must be exactly what the counts say. The "uds" request mode has
 * no arena: operations with input are refused there.
 */
#ifndef KVPOOL_PROTO_H
#define KVPOOL_PROTO_H

#include <stdint.h>

#include "kvpool.h"
#include "mix64.h"

#define KVP_PROTO_MAGIC 0x31304c4f4f50564bull /* "KVPOOL01" little-endian */
#define KVP_PROTO_VERSION 11 /* v4: welcome.cuda_uuid; v5: chunk names and entries;
			     * v6: kvp_stats grew (reclaim_stalls, reclaimed_pages, shards);
			     * v7: lanes (one ring pair per worker), welcome.shards;
			     * v8: kvp_stats grew (reclaim_onload_stalls, reclaim_direct);
			     * v9: kvp_stats grew (disk_prefix_pages, disk_chunks,
			     *     disk_chunk_pages);
			     * v10: kvp_user_info rows grew (pages_disk, tokens_disk),
			     *     kvp_stats (ns_h2d);
			     * v11: tensor-parallel pools: hello.rank, welcome.tp
			     *     and .rank, KVP_OP_LEASE_JOIN, COMMIT's res
			     *     KVP_COMMIT_PENDING; KVP_OP_MOVE and
			     *     server_info.pool_device; BATCH entries and
			     *     KVP_OP_RING_PHASES, KVP_OP_CHUNK_COPY (one version: they
			     *     landed together) */

#define KVP_RING_MIN_ENTRIES 8u
#define KVP_RING_MAX_ENTRIES 65536u
#define KVP_ARENA_MIN_BYTES (64u << 10)
#define KVP_ARENA_MAX_BYTES (256u << 20)
#define KVP_LANES_MAX 64u           /* ring pairs per client (= workers) */
#define KVP_LEASE_SHARD_SHIFT 24    /* bits 24..30 of a lease id: its shard */
#define KVP_LEASE_SHARED (1ull << 31) /* a sharing lease: shard 0's */

/* ------------------------------------------------------------ attach */

struct kvp_hello {
	uint64_t magic;        /* KVP_PROTO_MAGIC */
	uint32_t version;      /* KVP_PROTO_VERSION */
	uint32_t sq_entries;   /* power of two in [MIN, MAX]; 0: daemon default */
	uint32_t cq_entries;   /* >= sq_entries; 0: 2 * sq_entries */
	uint32_t arena_bytes;  /* [MIN, MAX]; 0: daemon default */
	char name[32];         /* for kvctl clients: program name, NUL-padded */
	uint32_t pool;         /* v2: which of the daemon's pools (one per GPU of
				* `devices`, or per tp GPUs): 0 the first;
				* -EINVAL past the last */
	uint32_t rank;         /* v11 (was rsv, zero): the client's rank in a
				* tensor-parallel pool (kvpool.conf tp), 0 to
				* tp - 1; 0 for every other client. -EINVAL
				* when rank >= the pool's tp. */
};

#define KVP_WELCOME_ADMIN  (1u << 0) /* the client's uid is in admin_uids */
#define KVP_WELCOME_TENANT (1u << 1) /* the client belongs to a tenant */

struct kvp_welcome {
	uint64_t magic;
	uint32_t version;
	int32_t status;        /* 0, or -errno with msg saying why */
	char msg[KVP_ERRLEN];
	uint32_t client_id;
	uint32_t flags;        /* KVP_WELCOME_* */
	uint32_t nfds;
	char tenant[32];       /* tenant name, NUL-padded */
	char backend[16];      /* "shm", "cuda" */
	struct kvp_layout layout;
	uint64_t tier_bytes[KVP_TIERS];
	uint32_t tier_frames[KVP_TIERS];
	uint64_t shm_bytes;    /* size of fds[0] */
	/* v2. cuda backend: fds[1] is a cuMemCreate allocation exported as a
	 * POSIX fd (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) of
	 * tier_bytes[DEVICE] bytes (a multiple of the allocation granularity;
	 * the first tier_frames[DEVICE] * page_bytes are the frames). Import it
	 * with cuMemImportFromShareableHandle, map it with cuMemAddressReserve +
	 * cuMemMap + cuMemSetAccess on the CUDA device cuda_uuid names (v4;
	 * cuda_device is its ordinal in the daemon). shm backend:
	 * cuda_device is -1 and fds[1] is a memfd to mmap. */
	int32_t cuda_device;
	uint32_t pool;         /* the pool attached to */
	uint32_t npools;       /* how many the daemon serves */
	uint32_t shards;       /* v7: the pool's shards (LANES); 1 without a tenant */
	/* v4. cuda backend: the pool's GPU by its UUID (cuDeviceGetUuid_v2,
	 * the bytes of CUuuid). cuda_device is the daemon's ordinal, which
	 * names another GPU (or none) under another CUDA_VISIBLE_DEVICES: the
	 * client maps on the device of its own whose UUID this is, and fails
	 * the attach with -ENODEV when it sees none. Zero on shm. */
	uint8_t cuda_uuid[16];
	/* v11. A tensor-parallel pool (tp > 1, kvpool.conf tp): the client is
	 * rank `rank` of tp. Its layout above is the rank layout (kv_heads /
	 * tp of the model's), fds[1] its rank's device tier (rank r's GPU:
	 * cuda_device and cuda_uuid are that GPU's) of tier_bytes[DEVICE]
	 * bytes, frame f at f * layout.page_bytes: the same frame indices as
	 * every other rank's. tp is 1 and rank 0 for every other pool. */
	uint32_t tp;
	uint32_t rank;
};

/* ------------------------------------------------------------ shm */

struct kvp_shm_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t client_id;
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint32_t arena_bytes;
	uint32_t lanes;        /* v7: ring pairs, 1..KVP_LANES_MAX (LANES) */
	uint64_t ctl_off;      /* lane 0's; lane k's is lane_bytes * k further */
	uint64_t sq_off;
	uint64_t cq_off;
	uint64_t arena_off;
	uint64_t total_bytes;
	uint64_t lane_bytes;   /* v7: from one lane's ctl to the next one's */
};

#define KVP_RING_NEED_WAKEUP (1u << 0)

/* Each line is written by one side only (the comment says which). */
struct kvp_ring_ctl {
	_Alignas(64) uint32_t sq_tail;     /* client */
	uint32_t sq_rsv;
	uint64_t sq_stamp;                 /* client, v11: PHASES below */
	_Alignas(64) uint32_t sq_head;     /* daemon */
	_Alignas(64) uint32_t cq_tail;     /* daemon */
	_Alignas(64) uint32_t cq_head;     /* client */
	uint32_t cq_rsv;
	uint64_t cq_stamp;                 /* client, v11: PHASES below */
	_Alignas(64) uint32_t sq_flags;    /* daemon: KVP_RING_NEED_WAKEUP */
	_Alignas(64) uint32_t sq_doorbell; /* client: futex the daemon sleeps on */
	_Alignas(64) uint32_t cq_waiters;  /* client: 1 while it sleeps on cq_seq */
	_Alignas(64) uint32_t cq_seq;      /* daemon: futex the client sleeps on */
};

/*
 * PHASES (v11). Where a ring prepare's time goes (kvpool.h, struct
 * kvp_ring_phases): the client stores CLOCK_MONOTONIC ns into sq_stamp
 * before each store-release of sq_tail (S1), and into cq_stamp before
 * each store-release of cq_head (C1); the daemon reads them after the
 * load-acquire that pairs with that store, so it sees the stamp of that
 * publish or a later one. Both sit on the line of the index they go with:
 * no extra line moves between the two. They are measurements only, never
 * trusted for anything else (a client that writes nonsense skews its own
 * samples, which the daemon drops when they run backwards).
 */

/* The lane a user's entries go to (LANES): its shard's. */
static inline uint32_t kvp_lane_of_user(uint64_t user, uint32_t shards,
					uint32_t lanes)
{
	if (shards <= 1 || lanes <= 1)
		return 0;
	/* the daemon's shard_of_user too (lib/mix64.h) */
	return mix64_shard(user, shards) % lanes;
}

/* The lane of a lease's commit or release: the lane of its shard. */
static inline uint32_t kvp_lane_of_lease(uint64_t lease, uint32_t shards,
					 uint32_t lanes)
{
	uint32_t shard;

	if (lease & KVP_LEASE_SHARED || lanes <= 1)
		return 0;
	shard = ((uint32_t)lease >> KVP_LEASE_SHARD_SHIFT) & 0x7f;
	return shard < shards ? shard % lanes : 0;
}

/* ------------------------------------------------------------ entries */

enum kvp_opcode {
	KVP_OP_NOP = 0,
	KVP_OP_INFO = 1,      /* user -> cqe.val0 start, val1 len; out: struct kvp_user_info */
	KVP_OP_PREPARE = 2,   /* user, arg start_pos, n n_new -> out: kvp_prepare_out + frames */
	KVP_OP_COMMIT = 3,    /* arg lease, n tokens; flag RELEASE also releases */
	KVP_OP_RELEASE = 4,   /* arg lease */
	KVP_OP_OFFLOAD = 5,   /* user, or flag ALL -> res pages copied */
	KVP_OP_EVICT = 6,     /* user, or flag ALL; sel tiers -> res pages / users */
	KVP_OP_STATS = 7,     /* out: struct kvp_stats (flag ALL: every tenant, admin);
			       * arg pool + 1: that pool alone (0: the op's) */
	KVP_OP_USERS = 8,     /* arg cursor, n max rows -> out: kvp_user_info[]; val0 next cursor (0: end) */
	KVP_OP_CLIENTS = 9,   /* admin; arg cursor -> out: kvp_client_info[]; val0 next cursor */
	/* v3: sharing (kvpool.h "Sharing"; layouts below). Per tenant and pool. */
	KVP_OP_PREFIX_LOOKUP = 10, /* n tokens, in: uint32 ids[n] -> out: kvp_prefix_out */
	KVP_OP_SEQ_ALLOC = 11,     /* arg seq, n tokens, in: uint32 ids[n] -> out: kvp_prepare_out */
	KVP_OP_SEQ_CREATE = 12,    /* arg seq, n n_new, in: kvp_seq_create_in -> out: kvp_prepare_out */
	KVP_OP_SEQ_EXTEND = 13,    /* arg seq, n n_new, in: uint32 ids[n] or nothing -> kvp_prepare_out */
	KVP_OP_SEQ_FREE = 14,      /* arg seq */
	KVP_OP_CHUNK_REGISTER = 15, /* in: kvp_chunk_register_in -> out: kvp_chunk_reg_out */
	KVP_OP_CHUNK_SEAL = 16,    /* arg the fill lease */
	KVP_OP_CHUNK_ACQUIRE = 17, /* in: kvp_chunk_id -> out: kvp_prepare_out (-EAGAIN: filling) */
	KVP_OP_CHUNK_GET = 18,     /* in: kvp_chunk_id -> out: kvp_chunk_info */
	KVP_OP_CHUNK_LIST = 19,    /* n max rows, in: kvp_chunk_list_in -> out: kvp_chunk_info[]; val0 more */
	KVP_OP_CHUNK_DELETE = 20,  /* in: kvp_chunk_id */
	KVP_OP_CHUNK_CLEAR = 21,   /* n type (0: all) -> res chunks deleted */
	KVP_OP_CHUNK_EVICT_UNUSED = 22, /* arg max_age_s -> res chunks deleted */
	KVP_OP_COMPOSE = 23,       /* flag PREVIEW; in: kvp_compose_in -> out: kvp_compose_out */
	/* Every unleased user of the client's tenant (all of its pools), no
	 * admin needed (seed 002's evict_kv_cache); sel tiers -> res users
	 * evicted, cqe.val0 users skipped because a lease holds them. */
	KVP_OP_EVICT_TENANT = 24,
	/* v5: chunk entries under names (kvpool.h "Chunks"). */
	KVP_OP_CHUNK_LINK = 25,    /* in: kvp_chunk_link_in -> out: as CHUNK_REGISTER's (-EAGAIN: parent filling) */
	KVP_OP_CHUNK_ENTRY = 26,   /* in: kvp_chunk_id -> out: kvp_chunk_entry_info */
	KVP_OP_CHUNK_ENTRIES = 27, /* n max rows, in: name id -> out: kvp_chunk_entry_info[]; res: entries the name has */
	KVP_OP_CHUNK_CONTENT = 28, /* arg offset, in: name id -> out: content bytes; val0 content length */
	KVP_OP_CHUNK_TOKENS = 29,  /* arg offset (tokens), in: name id -> out: uint32 ids; val0 token count */
	KVP_OP_CHUNK_LIMITS = 30,  /* in: kvp_chunk_limits_in -> out: kvp_chunk_limits */
	/* Admin: kvpoold re-reads its settings as on SIGHUP (it raises one;
	 * the main thread does it after this completes). A daemon before it
	 * answers -EINVAL, as for any opcode it does not know. */
	KVP_OP_RELOAD = 31,
	KVP_OP_LATENCY = 32,       /* admin; out: struct kvp_latency */
	KVP_OP_SERVER_INFO = 33,   /* out: struct kvp_server_info */
	/* A sequence's state (seed 004's GetRequest): arg seq, user the first
	 * page wanted -> out: struct kvp_seq_info, then int32 frames from that
	 * page on, as many as fit; val0 npages. */
	KVP_OP_SEQ_INFO = 34,
	/* arg seq, user the first token wanted -> out: uint32 ids from there,
	 * as many as fit; res how many, val0 its ntoken_ids. */
	KVP_OP_SEQ_TOKENS = 35,
	/* v11, GROUP LEASES. A tensor-parallel pool (welcome.tp > 1): only
	 * rank 0 prepares; rank r > 0 joins rank 0's history lease (arg the
	 * lease id), answered exactly as a prepare (kvp_prepare_out + int32
	 * frames: the same frame indices, valid in every rank's pool; cqe
	 * val0 the lease, val1 its user). Every
	 * rank commits the same lease id (COMMIT): a commit before the last
	 * rank's answers res = KVP_COMMIT_PENDING (recorded; the history does
	 * not change yet), the last one's res 0 (the group's commit took
	 * effect, as a tp = 1 commit). A release by any rank, or the death of
	 * any rank's client, before the group committed releases the lease
	 * for every rank: nothing changes, and the others' later commits and
	 * joins answer -ESTALE saying so (their releases answer 0). A rank
	 * that committed and releases before the others committed leaves when
	 * the group commits (it does not end it).
	 * A chunk's fill lease (a KVP_LEASE_SHARED id) is joined the same way
	 * (answered as the registration's lease; val1 0): rank 0 registers or
	 * links (CHUNK_REGISTER / CHUNK_LINK by a rank > 0: -EINVAL), every
	 * rank seals (CHUNK_SEAL, or COMMIT of all its tokens): res
	 * KVP_COMMIT_PENDING before the last seal, which makes it READY; a
	 * rank's seal ends its part, so only a release or death of a rank that
	 * has not sealed abandons the entry (nothing published; -ESTALE to
	 * the others' seals).
	 * A sequence's write lease (LEASE_SEQ_WRITE: a KVP_LEASE_SHARED id
	 * from SEQ_ALLOC, SEQ_CREATE or SEQ_EXTEND) is joined the same way
	 * (answered as rank 0's lease: the sequence's page table; val1 0):
	 * rank 0 allocates, creates and extends (those ops by a rank
	 * > 0: -EINVAL), every rank commits as for a history (res
	 * KVP_COMMIT_PENDING before the last, whose commit grows the
	 * sequence); a release or death before that drops the new tokens
	 * for every rank (the sequence keeps its committed ones; -ESTALE to
	 * the others' commits). SEQ_INFO (kvp_seq_pages too), SEQ_TOKENS
	 * and PREFIX_LOOKUP by any rank name the same frames (a sequence is
	 * found by its id). Other sharing leases (chunk reads,
	 * compositions) are not joined (-EINVAL): each rank takes its own. */
	KVP_OP_LEASE_JOIN = 36,
	/* v11, MOVES. user, arg the pool it is in, n the pool to move it to: the user's
	 * history moves there (engine_move.h) -> res pages moved, val0 its
	 * length, val1 bytes copied. The client's tenant, any of its pools. */
	KVP_OP_MOVE = 37,
	/* v11: n items, in: struct kvp_batch_item[n] -> out: struct
	 * kvp_cqe[n] (one per item); res n. BATCH below. */
	KVP_OP_BATCH = 38,
	KVP_OP_RING_PHASES = 39,   /* v11, admin; out: struct kvp_ring_phases */
	/* v11: in one struct kvp_chunk_id (an entry, or a name for its root),
	 * arg the pool it is in, n the pool to copy it to: the entry and the
	 * entries it hangs under that pool lacks are registered there with
	 * their pages copied (share_chunk_copy.c) -> res pages copied, val0
	 * entries copied, val1 bytes copied. The client's tenant. */
	KVP_OP_CHUNK_COPY = 40,
	KVP_OP_MAX,
};

/* COMMIT's res (cqe.res, no flag): 0, the commit took effect; this, a
 * group lease's commit recorded while other ranks have yet to commit. */
#define KVP_COMMIT_PENDING 1

#define KVP_SQE_ALL     (1u << 0) /* OFFLOAD / EVICT / STATS / USERS: every user (admin: every tenant) */
#define KVP_SQE_RELEASE (1u << 1) /* COMMIT: release the lease too */
#define KVP_SQE_PREVIEW (1u << 2) /* COMPOSE: build the tables, hold nothing */

struct kvp_sqe {
	uint8_t opcode;
	uint8_t flags;         /* KVP_SQE_* */
	uint16_t sel;          /* EVICT, EVICT_TENANT: enum kvp_tier_sel */
	uint32_t n;            /* PREPARE n_new; COMMIT tokens; list max rows;
				* sharing: see the opcode */
	uint64_t tag;          /* echoed in the cqe */
	uint64_t user;
	uint64_t arg;          /* PREPARE start_pos; COMMIT/RELEASE/SEAL lease; list
				* cursor; SEQ_* seq id; EVICT_UNUSED max age (s) */
	uint32_t out_off;      /* arena range for results / the error message */
	uint32_t out_len;
	uint32_t tenant;       /* admin ops with ALL: 0 = every tenant, else tenant index + 1 */
	uint32_t rsv0;         /* must be zero */
	uint32_t in_off;       /* v3: arena range of the input (INPUTS above); */
	uint32_t in_len;       /* both zero for opcodes without input */
	uint64_t rsv1;         /* must be zero */
};

/*
 * FAILURE DETAIL. On failure (res < 0) val0 and val1 are 0, or carry what
 * the error is about (kvpool.h, struct kvp_error_info) so that a client
 * chooses what to do from data, never from the message's words:
 *     kind  = (val0 >> 63) | (val1 >> 63) << 1     enum kvp_error_kind
 *     first = val0 & KVP_CQE_POS_MASK              token positions, both
 *     last  = val1 & KVP_CQE_POS_MASK              inclusive
 * History positions stay below 2^63 (the engine's POS_LIMIT), which leaves
 * bit 63 of each word for the kind's two bits; a range past 2^63 (a
 * start_pos no prepare accepts anyway) is sent without detail. Kind 0 is
 * "no detail": what every other error, and a kvpoold before this, sends,
 * so a client reads both alike. Only failures use this; a success's val0
 * and val1 are the opcode's.
 */
#define KVP_CQE_POS_MASK ((UINT64_C(1) << 63) - 1)

struct kvp_cqe {
	uint64_t tag;
	int32_t res;           /* >= 0 success (op-specific), -errno on failure */
	uint32_t out_bytes;    /* bytes written at out_off: the result, or on
			        * failure the NUL-terminated error message */
	uint64_t val0;         /* on failure: FAILURE DETAIL above */
	uint64_t val1;
};

_Static_assert(sizeof(struct kvp_sqe) == 64, "sqe is one cache line");
_Static_assert(sizeof(struct kvp_cqe) == 32, "cqe is half a cache line");

/* A failure's detail into val0 / val1 (FAILURE DETAIL above). */
static inline void kvp_cqe_detail_put(struct kvp_cqe *cqe, uint32_t kind,
				      uint64_t first, uint64_t last)
{
	if (kind > 3 || first > KVP_CQE_POS_MASK || last > KVP_CQE_POS_MASK)
		kind = 0;
	cqe->val0 = kind ? first | (uint64_t)(kind & 1) << 63 : 0;
	cqe->val1 = kind ? last | (uint64_t)(kind >> 1) << 63 : 0;
}

/* And back: the kind (0: none), first and last. */
static inline uint32_t kvp_cqe_detail_get(const struct kvp_cqe *cqe,
					  uint64_t *first, uint64_t *last)
{
	uint32_t kind = (uint32_t)(cqe->val0 >> 63) |
			(uint32_t)(cqe->val1 >> 63) << 1;

	*first = kind ? cqe->val0 & KVP_CQE_POS_MASK : 0;
	*last = kind ? cqe->val1 & KVP_CQE_POS_MASK : 0;
	return kind;
}

/*
 * BATCH (v11): one ring entry that carries n operations of one lane, so
 * that a worker pays its per-entry costs (copy, CQ slot, completion
 * publish, client wake-up) once per batch instead of once per operation.
 *
 *   sqe:  opcode KVP_OP_BATCH, n = count (1 .. KVP_BATCH_MAX), flags, sel,
 *         user, arg, tenant, rsv0, rsv1 zero; in_off/in_len the items,
 *         in_len == 40 * n exactly; out_off/out_len the item completions,
 *         out_len >= 32 * n.
 *   in:   struct kvp_batch_item items[n]                     40 bytes each
 *   out:  struct kvp_cqe log[n]                              32 bytes each
 *         the items' completions in the order they completed (the log),
 *         each exactly as the item's own entry would have had it (tag =
 *         items[i].tag, res, out_bytes, val0, val1, failure detail), its
 *         result bytes at the item's own range [items[i].out_off,
 *         +out_len) of the arena.
 *   cqe:  one or more per batch, in order: res k >= 0 new completions,
 *         log[val0, val0 + k), out_bytes 32 * k, val1 1 on the last (when
 *         every item is in the log; only the last may have k = 0), 0
 *         before it. The daemon sends one before the last only when items
 *         wait (below) and the CQ has a slot nobody else was promised, so
 *         a client must expect up to n completions for a batch and count
 *         the entry done at val1 = 1. Or, instead of all that, one with
 *         res < 0 and the message in the batch's out range when the batch
 *         is malformed (count 0 or over KVP_BATCH_MAX, in_len not 40 * n,
 *         a range outside the arena, out_len short, an item whose opcode is
 *         not INFO / PREPARE / COMMIT / RELEASE, whose flags are not its
 *         opcode's, whose rsv is not zero, or whose out range is outside
 *         the arena): then no item ran and nothing changed.
 * Item opcodes may be mixed. The input is copied once, whole, before any
 * item runs (INPUTS above), so the input and output ranges may overlap:
 * libkvpool puts both in one range of 40 * n bytes.
 *
 * Order. Items take effect in item order. A batch is ordered with its
 * lane's other entries exactly as its items would be, submitted one by one
 * in its place: item i of user U runs only when no earlier entry of U is
 * still held back on the lane (a parked completion, a deferred entry, or
 * an earlier item of a held batch), and an entry behind the batch waits
 * while an unrun item of the batch names its user. An item that must wait
 * (its user held, or its prepare waits for the reclaimer or a lower tier)
 * waits alone: later items of its user (or any item of no single user)
 * wait behind it, those of other users run, and their completions may be
 * sent before it, as they would have been one by one. A prepare that
 * onloads takes effect at once in the engine; its completion enters the
 * log when its copy has landed, and until then later items of its user
 * wait, as behind a parked completion. The items of a
 * batch may name users of several shards: each runs under its own shard's
 * lock, held from one item to the next while they share the shard.
 * libkvpool batches only entries it would have put on the same lane.
 *
 * The uds request mode has no arena: BATCH is refused there.
 */
#define KVP_BATCH_MAX 256u

struct kvp_batch_item {
	uint64_t tag;          /* echoed in the item's cqe */
	uint64_t user;         /* INFO, PREPARE */
	uint64_t arg;          /* PREPARE start_pos; COMMIT, RELEASE lease */
	uint32_t n;            /* PREPARE n_new; COMMIT tokens */
	uint8_t opcode;        /* KVP_OP_INFO, _PREPARE, _COMMIT, _RELEASE */
	uint8_t flags;         /* COMMIT: KVP_SQE_RELEASE; otherwise 0 */
	uint16_t rsv;          /* zero */
	uint32_t out_off;      /* the item's result range (ARENA above) */
	uint32_t out_len;
};

_Static_assert(sizeof(struct kvp_batch_item) == 40, "batch item wire size");

/* PREPARE result at out_off; frames[npages] follow (device frame indices,
 * the lease's CSR indices with indptr [0, npages]). */
struct kvp_prepare_out {
	uint64_t lease;
	uint64_t start;
	uint64_t len;          /* committed tokens before this lease */
	uint32_t n_new;
	uint32_t npages;
	uint32_t last_page_len;
	uint32_t onloaded_pages;
	int32_t frames[];
};

/* USERS rows are struct kvp_user_info, CLIENTS rows struct kvp_client_info,
 * the STATS result a struct kvp_stats (kvpool.h). */

/* ------------------------------------------------------------ sharing (v3) */

/*
 * Token ids are uint32 in the host's byte order on the wire (client and
 * daemon share the machine); the engine hashes them as little-endian.
 *
 * Leases of sequences and chunks come back as a struct kvp_prepare_out plus
 * frames[npages], exactly like PREPARE's, so libkvpool's kvp_lease, the
 * append data ops, COMMIT and RELEASE work on them unchanged: start is 0,
 * len the tokens the lease's page table already holds, n_new the tokens to
 * write. SEQ_ALLOC's n is the token count (n_new = n - cached), the others'
 * n_new is what was asked for.
 */

/* PREFIX_LOOKUP result: frames[npages] follow (not pinned). */
struct kvp_prefix_out {
	uint32_t tokens;       /* leading tokens cached: npages * page_tokens */
	uint32_t npages;
	int32_t frames[];
};

/* SEQ_CREATE input: nsrc sources, in order. in_len == 8 + nsrc * 56. */
struct kvp_seq_create_in {
	uint32_t nsrc;
	uint32_t rsv;          /* zero */
	struct kvp_seq_src src[];
};

/*
 * CHUNK_REGISTER input (a root entry), in this order (the tokens 4-byte
 * aligned because the header is 16 bytes):
 *     struct kvp_chunk_register_in     16 bytes
 *     uint32 tokens[ntokens]
 *     char meta[meta_len]              NUL-terminated JSON object text
 *                                      (meta_len counts the NUL; 0: none)
 *     uint8 content[content_len]       v5; any bytes (0: none)
 * in_len == 16 + 4 * ntokens + meta_len + content_len exactly.
 */
struct kvp_chunk_register_in {
	uint32_t type;         /* enum kvp_chunk_type */
	uint32_t ntokens;      /* >= 1 */
	uint32_t meta_len;     /* <= KVP_CHUNK_META_MAX */
	uint32_t content_len;  /* v5: <= kvpoold's chunk_content_max */
};

/* CHUNK_LINK input: the name's tokens after the parent entry. */
struct kvp_chunk_link_in {
	struct kvp_chunk_id name;
	struct kvp_chunk_id parent;
};

/* CHUNK_REGISTER / CHUNK_LINK result: when created, the fill lease follows
 * as a kvp_prepare_out + frames (start = the entry's start, len 0, n_new =
 * tokens); otherwise nothing. */
struct kvp_chunk_reg_out {
	struct kvp_chunk_id id;   /* the entry */
	struct kvp_chunk_id name;
	uint32_t created;      /* 1: the caller fills and seals it */
	uint32_t state;        /* enum kvp_chunk_state */
	uint32_t start;
	uint32_t tokens;
};

/* CHUNK_LIMITS input: max_chunks < 0 / memory_ratio < 0 keep the current. */
struct kvp_chunk_limits_in {
	int64_t max_chunks;
	double memory_ratio;
};

/*
 * CHUNK_LIST input: the header, then filter[filter_len] (NUL-terminated
 * JSON object text, filter_len counts the NUL; 0: no filter). in_len == 48 +
 * filter_len. Rows (struct kvp_chunk_info, one per name) come in ascending
 * name order from the first name
 * greater than after (has_after 0: from the first); cqe.val0 is 1 when
 * more rows follow the last one written.
 */
struct kvp_chunk_list_in {
	uint32_t type;         /* 0: every type */
	uint32_t has_after;    /* 0 or 1 */
	uint32_t filter_len;   /* <= KVP_CHUNK_META_MAX */
	uint32_t rsv;          /* zero */
	struct kvp_chunk_id after;
};

/*
 * COMPOSE input (v5: entry ids that chain): the header, nreq request records, then every request's
 * context ids back to back in request order (request i's ncontexts ids
 * after those of requests 0..i-1). The daemon checks nreq <=
 * KVP_COMPOSE_MAX_REQUESTS, each ncontexts <= KVP_COMPOSE_MAX_CONTEXTS and
 * their sum == nctx, so
 *     in_len == 8 + 72 * nreq + 32 * nctx
 * exactly; the pointers of kvp_compose_req are rebuilt from the daemon's
 * own copy, never taken from the client.
 */
struct kvp_compose_in {
	uint32_t nreq;         /* 1 .. KVP_COMPOSE_MAX_REQUESTS */
	uint32_t nctx;         /* sum of ncontexts */
};

struct kvp_compose_req_in {
	struct kvp_chunk_id system;
	struct kvp_chunk_id query;
	uint32_t ncontexts;
	uint32_t qo_len;       /* 0: 1 */
};

/*
 * COMPOSE result (PREVIEW: lease 0). After the header, the per-level counts
 * for every level first, then the level arrays, level by level:
 *
 *     struct kvp_compose_out                         40 bytes
 *     struct kvp_compose_level_out lv[nlevels]        8 bytes each
 *     for each level l in 0 .. nlevels-1, int32 each:
 *         qo_indptr[lv[l].ngroups + 1]
 *         kv_indptr[lv[l].ngroups + 1]
 *         kv_indices[lv[l].nindices]                 (== kv_indptr[ngroups])
 *         kv_last_page_len[lv[l].ngroups]
 *
 * The counts come first so a reader knows every array's offset before it
 * reads any array: it sums the counts (checking against out_bytes) once,
 * then takes pointers, and no array's length is ever read from the middle
 * of another's bytes.
 */
struct kvp_compose_out {
	uint64_t lease;
	uint32_t nlevels;      /* <= KVP_COMPOSE_MAX_LEVELS */
	uint32_t nrequests;
	uint64_t tokens;
	uint64_t pages;
	uint64_t bytes;
};

struct kvp_compose_level_out {
	uint32_t ngroups;
	uint32_t nindices;
};

_Static_assert(sizeof(struct kvp_seq_src) == 56, "seq source wire size");
_Static_assert(sizeof(struct kvp_seq_create_in) == 8, "seq create header");
_Static_assert(sizeof(struct kvp_chunk_register_in) == 16, "register header");
_Static_assert(sizeof(struct kvp_chunk_reg_out) == 80, "register result");
_Static_assert(sizeof(struct kvp_chunk_link_in) == 64, "link input");
_Static_assert(sizeof(struct kvp_chunk_limits_in) == 16, "limits input");
_Static_assert(sizeof(struct kvp_chunk_info) % 8 == 0, "chunk row alignment");
_Static_assert(sizeof(struct kvp_chunk_entry_info) % 8 == 0, "entry row alignment");
_Static_assert(sizeof(struct kvp_chunk_list_in) == 48, "list header");
_Static_assert(sizeof(struct kvp_compose_in) == 8, "compose header");
_Static_assert(sizeof(struct kvp_compose_req_in) == 72, "compose request");
_Static_assert(sizeof(struct kvp_compose_out) == 40, "compose result");
_Static_assert(sizeof(struct kvp_prepare_out) % 8 == 0, "lease header alignment");

#endif /* KVPOOL_PROTO_H */
