/* SPDX-License-Identifier: MIT */
/*
 * ring.c - the client's ends of the two rings: producer of the submission
 * ring (SQ), consumer of the completion ring (CQ), and the wake-ups both
 * ways, exactly as proto.h (RINGS, WAKE-UPS) lays them down.
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
#include <linux/futex.h>
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

/* ------------------------------------------------------------ SQ */

/* Free SQ slots, or -EPROTO when the daemon's sq_head is not within the
 * entries we published. */
static int sq_room(struct kvp_client *c)
{
	uint32_t head, behind;

	/* A2: pairs with the daemon's store-release of sq_head (D2): every
	 * entry before head has been copied out, so its slot may be reused. */
	head = __atomic_load_n(&c->ctl->sq_head, __ATOMIC_ACQUIRE);
	behind = c->sq_published - head;
	if (behind > c->sq_entries)
		return kvpc_fail(c, -EPROTO,
				 "kvpoold at %s broke the submission ring (sq_head %u, "
				 "sq_tail %u); reconnect", c->path, head,
				 c->sq_published);
	return (int)(c->sq_entries - (c->sq_tail - head));
}

int kvpc_ring_push(struct kvp_client *c, const struct kvp_sqe *sqe)
{
	uint64_t spin_end = 0, next_check = 0;
	int room;

	/*
	 * The caller holds an operation slot, so fewer than sq_entries SQEs are
	 * unreaped and the ring has room as soon as the daemon has copied out
	 * the ones whose completions were reaped. That it publishes sq_head
	 * after the completion is allowed, so wait for it here: briefly.
	 */
	while ((room = sq_room(c)) <= 0) {
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
	c->sqes[c->sq_tail & c->sq_mask] = *sqe;
	c->sq_tail++;
	return 0;
}

uint32_t kvpc_ring_submit(struct kvp_client *c)
{
	uint32_t n = c->sq_tail - c->sq_published;

	if (!n)
		return 0;
	/* S1: pairs with the daemon's load-acquire of sq_tail: the entries
	 * written by kvpc_ring_push() are visible before the tail that
	 * covers them. */
	__atomic_store_n(&c->ctl->sq_tail, c->sq_tail, __ATOMIC_RELEASE);
	c->sq_published = c->sq_tail;

	/*
	 * W1: order the store of sq_tail before the load of sq_flags. Pairs
	 * with the daemon's full fence between setting NEED_WAKEUP and
	 * re-reading sq_tail: either it sees our tail and does not sleep, or
	 * we see its flag and wake it.
	 */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->ctl->sq_flags, __ATOMIC_RELAXED) &
	    KVP_RING_NEED_WAKEUP) {
		/* W2: the daemon waits for the doorbell to differ from the
		 * value it read before its re-check; bump it, then wake. */
		__atomic_fetch_add(&c->ctl->sq_doorbell, 1, __ATOMIC_RELEASE);
		futex(&c->ctl->sq_doorbell, FUTEX_WAKE, 1, NULL);
	}
	return n;
}

/* ------------------------------------------------------------ CQ */

int kvpc_cq_ready(struct kvp_client *c)
{
	uint32_t tail, ready;

	/* A1: pairs with the daemon's store-release of cq_tail (D1): the
	 * CQEs before tail and the arena bytes they name are visible. */
	tail = __atomic_load_n(&c->ctl->cq_tail, __ATOMIC_ACQUIRE);
	ready = tail - c->cq_head;
	if (ready > c->cq_entries)
		return kvpc_fail(c, -EPROTO,
				 "kvpoold at %s broke the completion ring (cq_tail %u, "
				 "cq_head %u); reconnect", c->path, tail, c->cq_head);
	return (int)ready;
}

/* Sleep on cq_seq until want CQEs are ready (the slow half of kvpc_cq_wait). */
static int cq_sleep(struct kvp_client *c, uint32_t want)
{
	const struct timespec nap = { .tv_sec = 0,
				      .tv_nsec = KVPC_SLEEP_MS * 1000000l };
	int ready;

	for (;;) {
		uint32_t seq;

		__atomic_store_n(&c->ctl->cq_waiters, 1, __ATOMIC_RELAXED);
		/* W3: order the store of cq_waiters before the re-read of
		 * cq_tail. Pairs with the daemon's full fence between its
		 * store of cq_tail and its load of cq_waiters: either we see
		 * the new tail below, or it sees cq_waiters and wakes us. */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		/* A3: pairs with the daemon's increment of cq_seq, made after
		 * its store of cq_tail. Read before the re-check: if the wake
		 * comes between the two, the futex sees a changed word and
		 * returns at once. */
		seq = __atomic_load_n(&c->ctl->cq_seq, __ATOMIC_ACQUIRE);
		ready = kvpc_cq_ready(c);
		if (ready < 0 || (uint32_t)ready >= want)
			break;
		if (futex(&c->ctl->cq_seq, FUTEX_WAIT, seq, &nap) < 0 &&
		    errno == ETIMEDOUT) {
			/* Nothing for a while: is anyone still there? */
			ready = kvpc_check_hangup(c);
			if (ready)
				break;
		}
	}
	__atomic_store_n(&c->ctl->cq_waiters, 0, __ATOMIC_RELAXED);
	return ready;
}

int kvpc_cq_wait(struct kvp_client *c, uint32_t want)
{
	uint64_t spin_end = 0;
	unsigned int i = 0;
	int ready;

	for (;;) {
		ready = kvpc_cq_ready(c);
		if (ready < 0 || (uint32_t)ready >= want)
			return ready;
		/* Spin first: a busy daemon answers within microseconds and a
		 * futex round trip costs more than that. */
		if ((i++ & 63) == 0) {
			uint64_t now = mono_ns();

			if (!spin_end)
				spin_end = now + (uint64_t)c->spin_us * 1000u;
			else if (now >= spin_end)
				break;
		}
		cpu_relax();
	}
	return cq_sleep(c, want);
}

void kvpc_cq_take(struct kvp_client *c, struct kvp_cqe *out)
{
	/* Copied out once; only the copy is looked at (the daemon may not
	 * write the slot again until cq_head passes it, but trust nothing). */
	*out = c->cqes[c->cq_head & c->cq_mask];
	c->cq_head++;
}

void kvpc_cq_release(struct kvp_client *c)
{
	/* C1: pairs with the daemon's load-acquire of cq_head before it
	 * reuses a CQ slot: our reads of the entries above are done. */
	__atomic_store_n(&c->ctl->cq_head, c->cq_head, __ATOMIC_RELEASE);
}
