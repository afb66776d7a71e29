/* SPDX-License-Identifier: MIT */
/*
 * ring.c - the client's ends of its rings: producer of each lane's
 * submission ring (SQ), consumer of each lane's completion ring (CQ), the
 * routing of entries to lanes and the wake-ups both ways, exactly as
 * proto.h (RINGS, LANES, WAKE-UPS) lays them down.
 *
 * The client keeps its own copies of the indices it owns (sq_tail, cq_head)
 * and only ever stores them to shared memory; what it reads from there
 * (sq_head, cq_tail, sq_flags) is read once per use and checked before it
 * is believed. A daemon that breaks the ring marks the client broken
 * (-EPROTO); a daemon that goes away is noticed within KVPC_SLEEP_MS of
 * waiting (-ECONNRESET), so no wait here hangs forever.
 *
 * What this file is not: it knows nothing of opcodes, tags or the arena
 * (batch.c does).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "client_internal.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* Shared (not PRIVATE) futexes: the words live in memory of two processes. */
static long futex(uint32_t *word, int op, uint32_t val,
		  const struct timespec *timeout)
{
	return syscall(SYS_futex, word, op, val, timeout, NULL, 0);
}

/* ------------------------------------------------------------ lanes */

uint32_t kvpc_lane_of(const struct kvp_client *c, const struct kvp_sqe *sqe)
{
	switch (sqe->opcode) {
	case KVP_OP_INFO:
	case KVP_OP_PREPARE:
		return kvp_lane_of_user(sqe->user, c->shards, c->nlanes);
	case KVP_OP_OFFLOAD:
	case KVP_OP_EVICT:
		/* One user's: its shard's. Everything: lane 0. */
		return sqe->flags & KVP_SQE_ALL ? 0 :
		       kvp_lane_of_user(sqe->user, c->shards, c->nlanes);
	case KVP_OP_COMMIT:
	case KVP_OP_RELEASE:
	case KVP_OP_CHUNK_SEAL:
	case KVP_OP_LEASE_JOIN:
		return kvp_lane_of_lease(sqe->arg, c->shards, c->nlanes);
	default:
		return 0; /* cross-shard: the sharing state is shard 0's */
	}
}

/* ------------------------------------------------------------ SQ */

/* Free SQ slots of lane l, or -EPROTO when the daemon's sq_head is not
 * within the entries we published. The head is read from shared memory
 * only when the one seen last leaves no room: the line is the worker's,
 * written on every pass, and a load of it per push was a cache miss per
 * entry. */
static int sq_room(struct kvp_client *c, struct kvpc_lane *l)
{
	uint32_t head, behind;

	if (c->sq_entries - (l->sq_tail - l->sq_head_seen) > 0)
		return (int)(c->sq_entries - (l->sq_tail - l->sq_head_seen));
	/* A2: pairs with the daemon's store-release of sq_head (D2): every
	 * entry before head has been copied out, so its slot may be reused. */
	head = __atomic_load_n(&l->ctl->sq_head, __ATOMIC_ACQUIRE);
	behind = l->sq_published - head;
	if (behind > c->sq_entries)
		return kvpc_fail(c, -EPROTO,
				 "kvpoold at %s broke the submission ring (sq_head %u, "
				 "sq_tail %u); reconnect", c->path, head,
				 l->sq_published);
	l->sq_head_seen = head;
	return (int)(c->sq_entries - (l->sq_tail - head));
}

int kvpc_ring_push(struct kvp_client *c, uint32_t lane, const struct kvp_sqe *sqe)
{
	struct kvpc_lane *l = &c->lanes[lane];
	uint64_t spin_end = 0, next_check = 0;
	int room;

	/*
	 * The caller holds an operation slot, so fewer than sq_entries SQEs are
	 * unreaped and the ring has room as soon as the daemon has copied out
	 * the ones whose completions were reaped. That it publishes sq_head
	 * after the completion is allowed, so wait for it here: briefly.
	 */
	while ((room = sq_room(c, l)) <= 0) {
		uint64_t now;

		if (room < 0)
			return room;
		now = mono_ns();
		if (!spin_end) {
			spin_end = now + (uint64_t)c->spin_us * 1000u;
			next_check = now + KVPC_SLEEP_MS * 1000000ull;
		}
		if (now < spin_end) {
			cpu_relax();
			continue;
		}
		if (now >= next_check) {
			int ret = kvpc_check_hangup(c);

			if (ret)
				return ret;
			next_check = now + KVPC_SLEEP_MS * 1000000ull;
		}
		usleep(50);
	}
	l->sqes[l->sq_tail & c->sq_mask] = *sqe;
	l->sq_tail++;
	return 0;
}

uint32_t kvpc_ring_submit(struct kvp_client *c)
{
	uint64_t now = 0;
	uint32_t n = 0;
	bool any = false;

	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];

		if (l->sq_tail == l->sq_published)
			continue;
		/* proto.h, PHASES: the stamp goes out with the tail. */
		if (!now)
			now = mono_ns();
		__atomic_store_n(&l->ctl->sq_stamp, now, __ATOMIC_RELAXED);
		/* S1: pairs with the daemon's load-acquire of sq_tail: the
		 * entries written by kvpc_ring_push() are visible before the
		 * tail that covers them. */
		__atomic_store_n(&l->ctl->sq_tail, l->sq_tail, __ATOMIC_RELEASE);
		n += l->sq_tail - l->sq_published;
		l->cq_owed += l->sq_tail - l->sq_published;
		any = true;
	}
	if (!any)
		return 0;
	/*
	 * W1: order the stores of sq_tail before the loads of sq_flags. Pairs
	 * with each worker's full fence between setting NEED_WAKEUP and
	 * re-reading sq_tail: either it sees our tail and does not sleep, or
	 * we see its flag and wake it. One fence covers every lane.
	 */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];

		if (l->sq_tail == l->sq_published)
			continue;
		l->sq_published = l->sq_tail;
		if (__atomic_load_n(&l->ctl->sq_flags, __ATOMIC_RELAXED) &
		    KVP_RING_NEED_WAKEUP) {
			/* W2: the worker waits for the doorbell to differ from
			 * the value it read before its re-check; bump it, then
			 * wake. */
			__atomic_fetch_add(&l->ctl->sq_doorbell, 1, __ATOMIC_RELEASE);
			futex(&l->ctl->sq_doorbell, FUTEX_WAKE, 1, NULL);
		}
	}
	return n;
}

/* ------------------------------------------------------------ CQ */

int kvpc_cq_ready(struct kvp_client *c)
{
	uint32_t total = 0;

	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];
		uint32_t tail, ready;

		/* A lane whose published entries were all seen completing has
		 * nothing to say: its worker's line is left alone (polling
		 * every lane's cq_tail took lines from busy workers). */
		if (!l->cq_owed) {
			total += l->cq_ready_to - l->cq_head;
			continue;
		}
		/* A1: pairs with the daemon's store-release of cq_tail (D1):
		 * the CQEs before tail and the arena bytes they name are
		 * visible. */
		tail = __atomic_load_n(&l->ctl->cq_tail, __ATOMIC_ACQUIRE);
		ready = tail - l->cq_head;

		if (ready > c->cq_entries || tail - l->cq_ready_to > l->cq_owed)
			return kvpc_fail(c, -EPROTO,
					 "kvpoold at %s broke the completion ring of lane "
					 "%u (cq_tail %u, cq_head %u, %u completions owed); "
					 "reconnect", c->path, k, tail, l->cq_head,
					 l->cq_owed);
		l->cq_owed -= tail - l->cq_ready_to;
		l->cq_ready_to = tail;
		total += ready;
	}
	return (int)total;
}

/* Sleep on lane 0's cq_seq until want CQEs are ready on any lanes (the slow
 * half of kvpc_cq_wait; proto.h, LANES: the workers of every lane wake us
 * through lane 0's words). */
static int cq_sleep(struct kvp_client *c, uint32_t want)
{
	const struct timespec nap = { .tv_sec = 0,
				      .tv_nsec = KVPC_SLEEP_MS * 1000000l };
	struct kvp_ring_ctl *ctl = c->lanes[0].ctl;
	int ready;

	for (;;) {
		uint32_t seq;

		__atomic_store_n(&ctl->cq_waiters, 1, __ATOMIC_RELAXED);
		/* W3: order the store of cq_waiters before the re-read of
		 * cq_tail. Pairs with the daemon's full fence between its
		 * store of cq_tail and its load of cq_waiters: either we see
		 * the new tail below, or it sees cq_waiters and wakes us. */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		/* A3: pairs with the daemon's increment of cq_seq, made after
		 * its store of cq_tail. Read before the re-check: if the wake
		 * comes between the two, the futex sees a changed word and
		 * returns at once. */
		seq = __atomic_load_n(&ctl->cq_seq, __ATOMIC_ACQUIRE);
		ready = kvpc_cq_ready(c);
		if (ready < 0 || (uint32_t)ready >= want)
			break;
		if (futex(&ctl->cq_seq, FUTEX_WAIT, seq, &nap) < 0 &&
		    errno == ETIMEDOUT) {
			/* Nothing for a while: is anyone still there? */
			ready = kvpc_check_hangup(c);
			if (ready)
				break;
		}
	}
	__atomic_store_n(&ctl->cq_waiters, 0, __ATOMIC_RELAXED);
	return ready;
}

/*
 * How long a wait spins before it sleeps. At least spin_us; when recent
 * waits took longer (a saturated daemon answers a whole round of clients
 * before ours), up to twice their average, capped: a client that sleeps
 * costs the worker a FUTEX_WAKE per completion batch, which is what made
 * throughput fall as clients were added to a busy worker. Past spin_us the
 * spin yields the core every 64 polls, so spinning clients do not starve
 * the workers where processes outnumber cores.
 */
static uint64_t spin_budget_ns(const struct kvp_client *c)
{
	uint64_t base = (uint64_t)c->spin_us * 1000u, adapt = 2 * c->wait_avg_ns;

	if (adapt > KVPC_SPIN_MAX_NS)
		adapt = KVPC_SPIN_MAX_NS;
	return adapt > base ? adapt : base;
}

int kvpc_cq_wait(struct kvp_client *c, uint32_t want)
{
	uint64_t start = 0, yield_at = 0, spin_end = 0, now;
	unsigned int i = 0;
	int ready;

	for (;;) {
		ready = kvpc_cq_ready(c);
		if (ready < 0 || (uint32_t)ready >= want)
			break;
		/* Spin first: a busy daemon answers within microseconds and a
		 * futex round trip costs more than that. */
		if ((i++ & 63) == 0) {
			now = mono_ns();
			if (!start) {
				start = now;
				yield_at = now + (uint64_t)c->spin_us * 1000u;
				spin_end = now + spin_budget_ns(c);
			} else if (now >= spin_end) {
				ready = cq_sleep(c, want);
				break;
			} else if (now >= yield_at) {
				sched_yield();
			}
		}
		cpu_relax();
	}
	if (ready >= 0 && start) {
		/* An average of the waits that did not end at once, 1/8 new. */
		uint64_t took = mono_ns() - start;

		c->wait_avg_ns = c->wait_avg_ns - c->wait_avg_ns / 8 + took / 8;
	}
	return ready;
}

void kvpc_cq_take(struct kvp_client *c, struct kvp_cqe *out)
{
	uint32_t lane;

	kvpc_cq_take_lane(c, out, &lane);
}

void kvpc_cq_take_lane(struct kvp_client *c, struct kvp_cqe *out, uint32_t *lane)
{
	/* Round robin from the lane after the last one taken from, so no lane
	 * starves a caller that reaps fewer than are ready. The caller took
	 * no more than kvpc_cq_ready() counted, so some lane has one. */
	for (uint32_t n = 0; n < c->nlanes; n++) {
		uint32_t k = (c->cq_next + n) % c->nlanes;
		struct kvpc_lane *l = &c->lanes[k];

		if (l->cq_head == l->cq_ready_to)
			continue;
		/* Copied out once; only the copy is looked at (the daemon may
		 * not write the slot again until cq_head passes it, but trust
		 * nothing). */
		*out = l->cqes[l->cq_head & c->cq_mask];
		l->cq_head++;
		c->cq_next = (k + 1) % c->nlanes;
		*lane = k;
		return;
	}
	/* Unreachable for a caller that keeps the contract; a CQE no lane
	 * has is not one of ours, and kvpc_slot_of() refuses tag 0. */
	memset(out, 0, sizeof(*out));
	*lane = 0;
}

void kvpc_cq_release(struct kvp_client *c)
{
	uint64_t now = 0;

	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];

		if (l->cq_head == l->cq_released)
			continue;
		/* proto.h, PHASES: the stamp goes out with the head. */
		if (!now)
			now = mono_ns();
		__atomic_store_n(&l->ctl->cq_stamp, now, __ATOMIC_RELAXED);
		/* C1: pairs with the daemon's load-acquire of cq_head before it
		 * reuses a CQ slot: our reads of the entries above are done. */
		__atomic_store_n(&l->ctl->cq_head, l->cq_head, __ATOMIC_RELEASE);
		l->cq_released = l->cq_head;
	}
}
