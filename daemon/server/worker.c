/* SPDX-License-Identifier: MIT */
/*
 * worker.c - ring polling: consume SQEs, execute, publish CQEs, sleep.
 *
 * The ring protocol is proto/proto.h's; the labels below (S1, D1, D2,
 * C1) are its. Worker k serves lane k of every client (proto.h, LANES): a
 * worker's list is of lanes, and everything below about "a client's ring"
 * is about the client's lane of this worker. A client is retired once the
 * worker of its last lane let go (drop_lane). A worker never trusts shared
 * memory: it keeps its own sq_head and cq_tail, reads sq_tail and cq_head
 * once per pass, copies each entry out once, and treats impossible indices
 * as a broken client to detach.
 *
 * Sleeping follows io_uring's SQPOLL: set NEED_WAKEUP in every lane's
 * sq_flags, full fence, re-check every ring, then futex_waitv on the
 * doorbells (values read before the re-check) plus the worker's private
 * control word. A client that publishes after our re-check sees the flag
 * (its own full fence pairs with ours) and rings; one that published before
 * is seen by the re-check. futex_waitv takes 128 futexes: the control word
 * and 127 clients; a worker with more, or with a client stalled on a full
 * CQ (which rings no doorbell when it reaps), sleeps 1 ms at a time.
 *
 * SLEEPING (issue 32, item 2: workers that never cost a client). A worker
 * spins (pause, the clock read every 64 empty passes) for spin_us after
 * its last pass that did anything (took or ran an entry, published a
 * completion, answered a uds request), then sleeps as above. It spins
 * only after work: a wake-up that brings none (a kick for another
 * client's attach or detach, a timed poll for CQ room, parked fences,
 * deferred entries or the clients past 127) makes one pass and sleeps
 * again at once, and a worker that has never had work (no lanes, or
 * lanes no client submits to: more workers than lanes in use) never spins
 * at all. Until issue 32 every wake-up started a fresh spin_us, so a
 * worker polling a stalled client every millisecond spun spin_us of each
 * (test_worker_idle: 5 ms of every 6 with spin_us = 5000), one with
 * parked completions spun nearly all the time, and each attach made every
 * worker spin once. Clients ring only the doorbells of the lanes they
 * published to (libclient/ring.c, kvpc_ring_submit), and only when the
 * worker set NEED_WAKEUP: a client that submits to one lane never wakes
 * the other workers.
 *
 * Late completions (issue 4: onload is asynchronous with respect to the
 * ring). A prepare that onloads comes back from the engine with its copy in
 * flight (ops_execute's op_wait). The worker does not wait: it parks the
 * CQE on the client's park list (park.h) and goes on with the next SQEs and
 * the other clients; every pass first publishes the parked CQEs whose fence
 * has landed (engine_fence_done, no mutex). While anything is parked the
 * worker never sleeps longer than PARK_POLL_NS. The CQ room a parked CQE
 * will need is reserved when it is parked (room = free CQ slots - parked),
 * so publishing it later never overruns the client's CQ.
 *
 * Order (DESIGN.md: operations on one user take effect in submission
 * order). The engine has already applied a parked prepare, so whatever runs
 * after it sees it; what must not happen is a later operation of the same
 * client on the same user completing first. Other clients keep going
 * meanwhile, and none of them can use U's pages early: their prepares of U
 * get the same fence from the engine and park too.
 *
 * DEFERRAL (issue 14: a waiting entry must not hold other users' entries).
 * An entry that must wait is copied out of the SQ once, like every entry,
 * and kept on its lane's deferred list (l->dq, in ring order) while the
 * worker goes on with the entries behind it. An entry waits when
 *  - it names a user U (ops_sqe_user: U itself, or a lease of U) that has a
 *    parked completion on this lane, or an earlier deferred entry; or
 *  - it is a prepare that must wait for the reclaimer (ops_execute's retry:
 *    nothing done), at most RECLAIM_WAIT_NS, then it evicts for itself;
 *  - or an operation that waits for a lower tier (op_wait.why: the disk
 *    or remote thread reads its history or chunk): until the tier
 *    answers, however long (a read completes or fails; the remote tier's
 *    reads end at remote_timeout_ms), tried again every TIER_RETRY_NS;
 *    that wait does not run the reclaimer's clock (issue 30);
 *  - or it names no single user (a cross-shard call: libkvpool never sends
 *    one with anything in flight), then it waits behind everything kept,
 *    and everything after it waits behind it.
 * Every pass retries the list in order before it takes new entries, so
 * one user's entries still run in ring order.
 *
 * A BATCH entry (proto.h, BATCH; ops.h) is held item by item: each item
 * is asked the questions above as if it were an entry of its own in the
 * batch's place (batch_item_held), an item that waits waits alone (later
 * items of its user behind it), and while any item is unrun or landing
 * the batch stays on the deferred list, holding the users of those items
 * for the entries behind it (ops_batch_holds). Its completions go out as
 * items finish, into CQ slots nobody else was promised, the last into the
 * one slot the entry kept (run_batch). Each deferred entry keeps a
 * CQ slot for its completion, as a parked one does, so the lane never
 * takes more entries than it can complete.
 *
 * uds requests (worker_uds.c; issue 11: they used to run on the listener
 * thread, beside the rings, and could overtake ring entries submitted
 * before them). The
 * main thread reads one, hands it over (worker_uds_submit) and reads no more
 * from that socket until it is answered. A pass notes the requests handed
 * over before it reads any sq_tail, runs the rings, then the requests: so
 * what any ring client of this worker published before a uds request was
 * sent is taken before it (unless it waits for CQ room or is held back, as
 * it would behind another ring client's entries). A request also waits
 * while its own client has ring entries it could not take yet, or a parked
 * completion of its user; its reply parks like a ring CQE when the prepare
 * onloads, and while it is parked the client's ring entries of that user
 * are held back as above.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "client.h"
#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "worker.h"
#include "worker_internal.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void futex_wake(uint32_t *addr, int op, int n)
{
	syscall(SYS_futex, addr, op, n, NULL, NULL, 0);
}

void worker_kick(struct worker *w)
{
	/* K1: publishes what the kick is about (incoming, a client's state,
	 * stop); pairs with the load-acquire of ctl at K2. */
	__atomic_fetch_add(&w->ctl, 1, __ATOMIC_RELEASE);
	futex_wake(&w->ctl, FUTEX_WAKE_PRIVATE, 1);
}

void worker_kick_client(struct client *c)
{
	for (uint32_t k = 0; k < c->nlanes; k++)
		if (c->lanes[k].worker)
			worker_kick(c->lanes[k].worker);
}

/* ------------------------------------------------------------ clients */

static int take_incoming(struct worker *w)
{
	struct lane *list, *l;
	uint32_t count = 0;

	pthread_mutex_lock(&w->lock);
	list = w->incoming;
	for (l = list; l; l = l->qnext)
		count++;
	if (w->n + count > w->cap) {
		uint32_t cap = w->cap ? w->cap : 16;
		struct lane **v;

		while (cap < w->n + count)
			cap *= 2;
		v = realloc(w->lanes, cap * sizeof(*v));
		if (!v) {
			/* They stay queued; the next kick tries again. */
			pthread_mutex_unlock(&w->lock);
			log_err("worker %" PRIu32 ": out of memory for its client list; "
				"%" PRIu32 " new clients wait", w->index, count);
			return -ENOMEM;
		}
		w->lanes = v;
		w->cap = cap;
	}
	w->incoming = NULL;
	pthread_mutex_unlock(&w->lock);
	while (list) {
		l = list;
		list = l->qnext;
		l->qnext = NULL;
		w->lanes[w->n++] = l;
	}
	/* A request of theirs may have been handed over before they were
	 * on the list, its uds_gen bump already seen. */
	w->uds_rescan |= count != 0;
	return 0;
}

/*
 * Drop lanes[i] for good; the worker that drops a client's last lane hands
 * the client to the main thread. Until then the client cannot be retired,
 * so everything here may still read it.
 */
void drop_lane(struct worker *w, uint32_t i, const char *why)
{
	struct lane *l = w->lanes[i];
	struct client *c = l->c;

	if (why && client_begin_detach(c, why)) {
		log_warn("client %" PRIu32 " (uid %" PRIu32 " pid %" PRIu32 "): %s; "
			 "detaching it", c->id, c->uid, c->pid, why);
		worker_kick_client(c); /* its other lanes' workers let go too */
	}
	/* Its parked completions go with it: the main thread waits for their
	 * fences before releasing its leases (client_finalize). */
	w->parked -= l->park.n;
	if (l->index == 0 &&
	    __atomic_load_n(&c->uds_state, __ATOMIC_RELAXED) == UDS_PARKED)
		w->parked--;
	for (uint32_t j = 0; j < l->ndq; j++)
		ops_batch_drop(l->dq[j].b);
	free(l->dq); /* deferred entries die with the client, unrun */
	l->dq = NULL;
	l->ndq = 0;
	w->lanes[i] = w->lanes[--w->n];
	/* R1: orders our last use of the lane before the main thread's
	 * finalize; pairs with the acq_rel of the worker that drops last. */
	if (__atomic_sub_fetch(&c->lanes_live, 1, __ATOMIC_ACQ_REL) == 0)
		client_retire(w->s, c);
}

/* ------------------------------------------------------------ rings */

/* Wake the client through lane 0's words, whichever lane we published
 * on (proto.h, LANES). */
static void wake_client(struct lane *l)
{
	struct kvp_ring_ctl *ctl = l->c->lanes[0].ctl;

	/* F1: orders our cq_tail store (D1) before the cq_waiters load; pairs
	 * with the client's fence between storing cq_waiters and re-checking
	 * cq_tail, so either it sees the completions or we see it waiting. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&ctl->cq_waiters, __ATOMIC_RELAXED)) {
		__atomic_fetch_add(&ctl->cq_seq, 1, __ATOMIC_RELEASE);
		/* Shared futex: the word is in the client's mapping too. */
		futex_wake(&ctl->cq_seq, FUTEX_WAKE, INT_MAX);
	}
}

/* Publishing parked completions: where the next CQE goes. */
struct emit_ctx {
	struct lane *l;
	uint32_t mask;
	uint32_t cq_head;   /* as this pass read it */
	uint32_t reserved;  /* CQ slots kept for deferred entries and those
			     * still to take this pass (a batch's: run_batch) */
};

static bool parked_landed(void *arg, const struct park *e)
{
	if (!engine_fence_done(e->eng, e->fence))
		return false;
	/* park_reap publishes every entry this says landed. */
	if (e->since_ns)
		metrics_lat(LAT_ONLOAD, mono_ns() - e->since_ns);
	return true;
}

static void emit_cqe(void *arg, const struct kvp_cqe *cqe)
{
	struct emit_ctx *x = arg;

	memcpy(&x->l->cqes[x->l->cq_tail++ & x->mask], cqe, sizeof(*cqe));
}

/* Keep l's completion for later; false when it cannot be parked. */
static bool park_cqe(struct lane *l, const struct kvp_sqe *sqe,
		     const struct kvp_cqe *cqe, const struct op_wait *wt)
{
	struct park e = { .cqe = *cqe, .eng = wt->eng, .fence = wt->fence,
			  .user = sqe->user, .since_ns = metrics_op_start(KVP_OP_PREPARE) };

	/* Sized once: a client has at most sq_entries operations in flight. */
	if (!l->park.v && park_init(&l->park, l->c->shm.sq_entries))
		return false;
	return park_add(&l->park, &e);
}

/*
 * Whether an entry (of user `user`, or of no single user) must wait behind
 * what this lane already keeps: a parked completion of the same user (a
 * parked uds reply only ever holds lane 0, its worker's), or one of the
 * first `upto` deferred entries of the same user. An entry of no single
 * user waits behind anything, and anything behind it (DEFERRAL at the top).
 */
static bool must_wait(const struct lane *l, uint32_t upto, bool has_user,
		      uint64_t user)
{
	const struct client *c = l->c;

	if (l->index == 0 &&
	    __atomic_load_n(&c->uds_state, __ATOMIC_RELAXED) == UDS_PARKED &&
	    (!has_user || c->uds_park.user == user))
		return true;
	if (l->park.n && (!has_user || park_has_user(&l->park, user)))
		return true;
	for (uint32_t i = 0; i < upto; i++) {
		const struct lane_defer *q = &l->dq[i];

		if (q->b ? ops_batch_holds(q->b, has_user, user) :
		    !has_user || !q->has_user || q->user == user)
			return true;
	}
	return false;
}

/* Whether the lane holds anything an entry could have to wait behind. */
static bool lane_busy(const struct lane *l)
{
	return l->ndq || l->park.n ||
	       (l->index == 0 && __atomic_load_n(&l->c->uds_state,
						 __ATOMIC_RELAXED) == UDS_PARKED);
}

/* The user an entry names, looked up only when something could hold it
 * (a commit's costs its shard's lock). Returns whether it looked. */
static bool entry_user(struct worker *w, struct lane *l, struct lane_defer *d)
{
	bool busy = lane_busy(l);

	if (busy)
		d->has_user = ops_sqe_user(w->s, l->c, &d->sqe, &d->user);
	return busy;
}

/* A batch's item waits behind the first `upto` kept entries of its lane
 * (the question ops_batch_run asks, item by item). */
struct batch_held {
	struct worker *w;
	struct lane *l;
	uint32_t upto;
};

static bool batch_item_held(void *arg, struct op_batch *b, uint32_t i)
{
	struct batch_held *h = arg;
	uint64_t user;
	bool has = ops_batch_user(h->w->s, h->l->c, b, i, &user);

	return must_wait(h->l, h->upto, has, user);
}

/*
 * Run what a batch entry's items can run now (proto.h, BATCH: in item
 * order, each as its own entry would run, behind the first `upto` kept
 * entries of the lane) and publish the completions of those done. true:
 * every item is answered, the final completion emitted and d->b freed;
 * false: keep it deferred. Until then a completion for the items done is
 * emitted only into a CQ slot nobody else was promised (ex->reserved
 * counts this entry's own, which its final completion takes), so the
 * items of other users that passed a waiting one reach the client now,
 * as they would have, one by one.
 */
static bool run_batch(struct worker *w, struct lane *l, struct lane_defer *d,
		      uint32_t upto, struct emit_ctx *ex)
{
	static const struct op_batch_clock clk = { RECLAIM_WAIT_NS, TIER_RETRY_NS };
	struct client_shm *sh = &l->c->shm;
	struct batch_held h = { w, l, upto };
	struct kvp_cqe cqe;
	uint32_t used;

	ops_batch_run(w->s, l->c, &d->sqe, d->b, sh->arena, sh->arena_bytes,
		      &w->scratch, lane_busy(l) ? batch_item_held : NULL, &h,
		      mono_ns(), &clk);
	if (!ops_batch_settle(&d->sqe, d->b, sh->arena)) {
		used = l->cq_tail - ex->cq_head + l->park.n + ex->reserved;
		if (used < sh->cq_entries && ops_batch_emit(&d->sqe, d->b, &cqe))
			emit_cqe(ex, &cqe);
		return false;
	}
	ops_batch_emit(&d->sqe, d->b, &cqe);
	ops_batch_free(d->b);
	d->b = NULL;
	emit_cqe(ex, &cqe);
	return true;
}

/*
 * Take a batch entry off the ring (its items copied once, ops_batch_open)
 * and run what can run. 1: done (or refused), its completion emitted; 0:
 * deferred; -ENOMEM: not taken, try again on a later pass.
 */
static int take_batch(struct worker *w, struct lane *l, struct lane_defer *d,
		      struct emit_ctx *ex, bool *prepares)
{
	struct client_shm *sh = &l->c->shm;
	struct kvp_cqe cqe;

	*prepares = false;
	d->b = ops_batch_open(w->s, l->c, &d->sqe, sh->arena, sh->arena_bytes,
			      sh->arena, sh->arena_bytes, &cqe);
	if (!d->b && !cqe.res)
		return -ENOMEM;
	if (!d->b) {
		emit_cqe(ex, &cqe);
		return 1;
	}
	*prepares = ops_batch_has(d->b, KVP_OP_PREPARE);
	return run_batch(w, l, d, l->ndq, ex) ? 1 : 0;
}

/*
 * PHASES (proto.h; kvpool.h, struct kvp_ring_phases): one pass's timing
 * of the entries that carry a prepare, while timing is on. Each answered
 * in the pass gives a queue sample (the client's sq_stamp to its start),
 * an execute sample and, at the pass's publish, a publish sample; the
 * publish's time waits on the lane for the client's cq_stamp of a release
 * past it: the wake sample, taken on a later pass.
 */
#define PHASE_MAX 64u

struct phase_clock {
	bool on;
	uint32_t n;
	uint64_t stamp;            /* the client's sq_stamp, read after A1 */
	uint64_t done[PHASE_MAX];  /* when each answered entry had executed */
};

static void phase_begin(struct phase_clock *pc, struct lane *l, uint32_t cq_head)
{
	uint64_t r;

	pc->n = 0;
	pc->on = metrics_timed();
	if (!pc->on)
		return;
	pc->stamp = __atomic_load_n(&l->ctl->sq_stamp, __ATOMIC_RELAXED);
	/* After A2: a release at or past our last timed publish. */
	if (l->pub_ns && (int32_t)(cq_head - l->pub_pos) >= 0) {
		r = __atomic_load_n(&l->ctl->cq_stamp, __ATOMIC_RELAXED);
		if (r >= l->pub_ns)
			metrics_lat(LAT_PH_WAKE, r - l->pub_ns);
		l->pub_ns = 0;
	}
}

/* An entry that started at t0 (0: not timed) was answered in this pass. */
static void phase_entry(struct phase_clock *pc, uint64_t t0)
{
	uint64_t t1;

	if (!t0)
		return;
	t1 = mono_ns();
	if (pc->stamp && pc->stamp <= t0)
		metrics_lat(LAT_PH_QUEUE, t0 - pc->stamp);
	metrics_lat(LAT_PH_EXECUTE, t1 - t0);
	if (pc->n < PHASE_MAX)
		pc->done[pc->n++] = t1;
}

/* After D1. */
static void phase_publish(struct phase_clock *pc, struct lane *l)
{
	uint64_t t;

	if (!pc->n)
		return;
	t = mono_ns();
	for (uint32_t i = 0; i < pc->n; i++)
		metrics_lat(LAT_PH_PUBLISH, t - pc->done[i]);
	l->pub_ns = t;
	l->pub_pos = l->cq_tail;
}

/*
 * Run one entry. false: it must wait for the reclaimer (nothing done; the
 * caller keeps it deferred, d->since says since when). Its completion is
 * emitted or parked.
 */
static bool run_entry(struct worker *w, struct lane *l, struct lane_defer *d,
		      struct emit_ctx *ex)
{
	struct client_shm *sh = &l->c->shm;
	struct op_wait wt = { 0 };
	struct kvp_cqe cqe;
	uint64_t now;

	/* A prepare may wait for the reclaimer, RECLAIM_WAIT_NS at most
	 * (then it makes its room itself); for a lower tier until the tier
	 * answers, tried again every TIER_RETRY_NS (worker_internal.h). */
	if (d->retry_at && (now = mono_ns()) < d->retry_at)
		return false;
	wt.retried = d->since != 0;
	wt.may_retry = !wt.retried || mono_ns() - d->since < RECLAIM_WAIT_NS;
	ops_execute(w->s, l->c, &d->sqe, sh->arena, sh->arena_bytes,
		    sh->arena, sh->arena_bytes, &w->scratch, &cqe, &wt);
	if (wt.retry) {
		now = mono_ns();
		/* Only the reclaimer's wait runs the reclaimer's clock: a slow
		 * disk read must not use up the prepare's wait for frames. */
		d->retry_at = 0;
		if (wt.why == ENGINE_WAIT_DISK || wt.why == ENGINE_WAIT_REMOTE)
			d->retry_at = now + TIER_RETRY_NS;
		else if (!d->since)
			d->since = now;
		return false;
	}
	if (wt.fence && park_cqe(l, &d->sqe, &cqe, &wt)) {
		w->parked++;
		return true;
	}
	/* Could not park it (out of memory): wait for the copy here. */
	if (wt.fence)
		engine_fence_wait(wt.eng, wt.fence);
	emit_cqe(ex, &cqe);
	return true;
}

/* Retry the deferred entries in order, keeping those that still wait.
 * Returns how many ran. */
static uint32_t run_deferred(struct worker *w, struct lane *l,
			     struct emit_ctx *ex)
{
	uint32_t kept = 0, ran = 0;

	for (uint32_t i = 0; i < l->ndq; i++) {
		struct lane_defer d = l->dq[i];

		ex->reserved = l->ndq - ran; /* this one's and those after it */
		if (d.b ? run_batch(w, l, &d, kept, ex) :
		    !must_wait(l, kept, d.has_user, d.user) && run_entry(w, l, &d, ex)) {
			ran++;
			continue;
		}
		l->dq[kept++] = d;
	}
	l->ndq = kept;
	return ran;
}

/*
 * One pass over lane l: publish the parked completions that landed, retry
 * the deferred entries, then take every available SQE the CQ has room for,
 * up to budget operations (PASS_BUDGET; a batch counts its items).
 * Returns entries consumed or run plus completions published, or -EPROTO
 * with *why for a broken client. *blocked says entries wait for CQ room.
 * Past 80 lines: the ring indices (S1, D1, D2, C1) are read, checked and
 * published in one place, so their pairing can be read at once; the phase
 * clock's three calls sit where those indices are.
 */
static int ring_pass(struct worker *w, struct lane *l, uint32_t budget,
		     bool *blocked, const char **why)
{
	struct client *c = l->c;
	struct client_shm *sh = &c->shm;
	struct kvp_ring_ctl *ctl = l->ctl;
	struct emit_ctx ex = { l, sh->cq_entries - 1, 0, 0 };
	uint32_t tail, cq_head, avail, used, room, n, i, cq0 = l->cq_tail;
	uint32_t late = 0, ran = 0, work = 0;
	struct phase_clock pc = { 0 };

	/* A1: pairs with the client's store-release of sq_tail (S1): the
	 * entries below tail are written. */
	tail = __atomic_load_n(&ctl->sq_tail, __ATOMIC_ACQUIRE);
	l->sq_tail_seen = tail; /* a uds request waits for what is below it */
	avail = tail - l->sq_head;
	if (avail > sh->sq_entries) {
		*why = "sq_tail is more than sq_entries ahead of sq_head";
		return -EPROTO;
	}
	if (!avail && !l->park.n && !l->ndq)
		return 0;
	/* (An idle lane costs its pass one load, of sq_tail: the client's
	 * cq_head line is read only when there is something to complete.)
	 * A2: pairs with the client's store-release of cq_head (C1): it is
	 * done with those CQEs and their arena bytes. */
	cq_head = __atomic_load_n(&ctl->cq_head, __ATOMIC_ACQUIRE);
	ex.cq_head = cq_head;
	phase_begin(&pc, l, cq_head);
	used = l->cq_tail - cq_head;
	if (used > sh->cq_entries) {
		*why = "cq_head moved past cq_tail";
		return -EPROTO;
	}
	if (l->park.n) {
		uint32_t before = l->park.n;

		late = park_reap(&l->park, sh->cq_entries - used, parked_landed,
				 emit_cqe, &ex);
		w->parked -= before - l->park.n;
		used += late;
	}
	/* A deferred entry's CQ slot is kept for it (as a parked one's), so
	 * running it here needs no room check. */
	if (l->ndq)
		ran = run_deferred(w, l, &ex);
	used = l->cq_tail - cq_head;
	/* Each parked completion and deferred entry keeps one CQ slot. */
	room = sh->cq_entries - used;
	room = room > l->park.n + l->ndq ? room - l->park.n - l->ndq : 0;
	n = avail < room ? avail : room;
	*blocked = avail > room;
	if (n && !l->dq && !(l->dq = calloc(sh->cq_entries, sizeof(*l->dq))))
		n = 0; /* out of memory: try again on the next pass */
	for (i = 0; i < n && work < budget; i++) {
		struct lane_defer d = { 0 };
		uint64_t t0 = 0;
		uint32_t parked;

		/* The one read of this entry: validated and used as copied. */
		memcpy(&d.sqe, &l->sqes[l->sq_head & (sh->sq_entries - 1)],
		       sizeof(d.sqe));
		l->sq_head++;
		if (pc.on && (d.sqe.opcode == KVP_OP_PREPARE ||
			      d.sqe.opcode == KVP_OP_BATCH))
			t0 = mono_ns();
		work++;
		if (d.sqe.opcode == KVP_OP_BATCH) {
			bool prep;
			int st;

			if (d.sqe.n > 1 && d.sqe.n <= KVP_BATCH_MAX)
				work += d.sqe.n - 1;
			ex.reserved = l->ndq + (n - i); /* this one's too */
			st = take_batch(w, l, &d, &ex, &prep);
			if (st < 0) {
				l->sq_head--; /* out of memory: not taken */
				break;
			}
			if (!st)
				l->dq[l->ndq++] = d; /* room counted its CQ slot */
			else if (prep)
				phase_entry(&pc, t0);
			continue;
		}
		if (entry_user(w, l, &d) && must_wait(l, l->ndq, d.has_user, d.user)) {
			l->dq[l->ndq++] = d; /* room counted its CQ slot */
			continue;
		}
		parked = l->park.n;
		if (run_entry(w, l, &d, &ex)) {
			if (l->park.n == parked)
				phase_entry(&pc, t0);
			continue;
		}
		/* Waits for the reclaimer: later entries of its user wait
		 * behind it, the others pass. */
		d.has_user = ops_sqe_user(w->s, c, &d.sqe, &d.user);
		l->dq[l->ndq++] = d;
	}
	if (!i && !ran && l->cq_tail == cq0)
		return 0;
	if (l->cq_tail != cq0) {
		/* D1: publishes the CQEs and arena results written above (and
		 * at execution, for parked ones); pairs with the client's
		 * load-acquire of cq_tail. */
		__atomic_store_n(&ctl->cq_tail, l->cq_tail, __ATOMIC_RELEASE);
		phase_publish(&pc, l);
	}
	if (i) {
		/* D2: the entries were copied out above; their slots are free. */
		__atomic_store_n(&ctl->sq_head, l->sq_head, __ATOMIC_RELEASE);
	}
	if (l->cq_tail != cq0)
		wake_client(l);
	return (int)(i + ran + late);
}

/* ------------------------------------------------------------ passes */

/* One pass over every client. Returns entries consumed and completions
 * published. */
static uint32_t worker_pass(struct worker *w, bool *blocked)
{
	bool uds = uds_note(w);
	uint32_t done = 0, i = 0;

	*blocked = false;
	while (i < w->n) {
		struct lane *l = w->lanes[i];
		const char *why = NULL;
		bool stalled = false;
		int ret;

		if (__atomic_load_n(&l->c->state, __ATOMIC_ACQUIRE) != CLIENT_LIVE) {
			drop_lane(w, i, NULL); /* the client is on its way out */
			continue;
		}
		/* A pass that noted uds requests takes every entry it can, as
		 * they must not overtake any published before (top comment). */
		ret = ring_pass(w, l, uds ? UINT32_MAX : PASS_BUDGET, &stalled, &why);
		if (ret < 0) {
			drop_lane(w, i, why);
			continue;
		}
		done += (uint32_t)ret;
		*blocked |= stalled;
		i++;
	}
	if (uds) {
		done += uds_pass(w);
		/* A request that waits is polled, whatever it waits for. */
		*blocked |= w->uds_busy != 0;
	}
	return done;
}

/* ------------------------------------------------------------ sleeping */

/* True when l has entries we could take now (or broken indices to see). */
static bool ring_has_work(const struct lane *l, bool *blocked)
{
	const struct client_shm *sh = &l->c->shm;
	uint32_t tail = __atomic_load_n(&l->ctl->sq_tail, __ATOMIC_ACQUIRE);
	uint32_t cq_head = __atomic_load_n(&l->ctl->cq_head, __ATOMIC_ACQUIRE);

	if (tail == l->sq_head)
		return false; /* deferred ones: the parked poll comes back to them */
	if (l->cq_tail - cq_head + l->park.n + l->ndq >= sh->cq_entries &&
	    tail - l->sq_head <= sh->sq_entries) {
		*blocked = true; /* waits for the client to reap */
		return false;
	}
	return true;
}

static void set_need_wakeup(struct worker *w, uint32_t nc, bool on)
{
	for (uint32_t i = 0; i < nc; i++) {
		uint32_t *flags = &w->lanes[i]->ctl->sq_flags;

		if (on)
			__atomic_fetch_or(flags, KVP_RING_NEED_WAKEUP, __ATOMIC_RELAXED);
		else
			__atomic_fetch_and(flags, ~KVP_RING_NEED_WAKEUP, __ATOMIC_RELAXED);
	}
}

static void sleep_fallback(struct worker *w, uint32_t ctl_seen)
{
	struct timespec ts = { 0, w->parked ? PARK_POLL_NS : POLL_NS };

	syscall(SYS_futex, &w->ctl, FUTEX_WAIT_PRIVATE, ctl_seen, &ts, NULL, 0);
}

static void worker_sleep(struct worker *w, uint32_t ctl_seen, bool blocked)
{
	uint32_t nc = w->n < WAITV_CLIENTS ? w->n : WAITV_CLIENTS;
	struct timespec deadline, *timeout = NULL;
	bool work = false, stalls = false;

	if (w->no_waitv) {
		sleep_fallback(w, ctl_seen);
		return;
	}
	set_need_wakeup(w, nc, true);
	/* F2: orders the NEED_WAKEUP stores before the re-check loads; pairs
	 * with the client's full fence between its sq_tail store (S1) and its
	 * sq_flags load. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	w->waitv[0] = (struct futex_waitv){ .val = ctl_seen,
		.uaddr = (uintptr_t)&w->ctl, .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG };
	for (uint32_t i = 0; i < nc; i++) {
		uint32_t *db = &w->lanes[i]->ctl->sq_doorbell;

		/* Read before the re-check: a ring after it changes the value
		 * and futex_waitv returns at once. */
		w->waitv[1 + i] = (struct futex_waitv){
			.val = __atomic_load_n(db, __ATOMIC_ACQUIRE),
			.uaddr = (uintptr_t)db, .flags = FUTEX_32 };
	}
	for (uint32_t i = 0; i < w->n && !work; i++) {
		work = ring_has_work(w->lanes[i], &blocked) ||
		       __atomic_load_n(&w->lanes[i]->c->state, __ATOMIC_ACQUIRE) != CLIENT_LIVE;
		stalls |= w->lanes[i]->ndq != 0;
	}
	if (!work && !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		if (blocked || w->n > nc || w->parked || stalls) {
			/* Fences land, and the reclaimer frees, without a
			 * wake-up: poll them briefly. */
			deadline = mono_deadline(w->parked || stalls ?
						 PARK_POLL_NS : POLL_NS);
			timeout = &deadline;
		}
		if (syscall(SYS_futex_waitv, w->waitv, 1 + nc, 0, timeout,
			    CLOCK_MONOTONIC) < 0 && errno == ENOSYS) {
			log_warn("worker %" PRIu32 ": no futex_waitv (Linux < 5.16); "
				 "idle rings are polled every millisecond", w->index);
			w->no_waitv = true;
		}
	}
	set_need_wakeup(w, nc, false);
}

/* ------------------------------------------------------------ the thread */

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t spin_ns = (uint64_t)w->s->cfg->spin_us * 1000, idle_since = 0;
	uint32_t ctl_seen = ~__atomic_load_n(&w->ctl, __ATOMIC_ACQUIRE);
	uint32_t idle = 0; /* empty passes since the last useful one */
	bool spun = true;  /* no spin before this worker's first work */

	/* Only this thread writes its counters (metrics.h). */
	metrics_self = w->s->opm ? &w->s->opm[w->index] : NULL;

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		/* K2: pairs with K1; what the kicker published is visible. */
		uint32_t ctl = __atomic_load_n(&w->ctl, __ATOMIC_ACQUIRE);
		bool blocked;

		if (ctl != ctl_seen) {
			ctl_seen = ctl;
			take_incoming(w);
		}
		if (worker_pass(w, &blocked)) {
			idle = 0;
			spun = false;
			continue;
		}
		/*
		 * Spin only after work (top comment, SLEEPING): a wake-up that
		 * brought none (a kick, a timed poll) goes back to sleep.
		 * The clock is read only when going idle and every 64 empty
		 * passes: read on every pass it was a fifth of the worker's
		 * time under load. (Yielding here as well was measured: p99
		 * fell, but 4-client throughput on 2 cores lost 30%;
		 * bench/results.)
		 */
		if (!spun) {
			if (!idle++) {
				idle_since = mono_ns();
				continue;
			}
			if (idle % 64 || mono_ns() - idle_since < spin_ns) {
				cpu_relax();
				continue;
			}
		}
		worker_sleep(w, ctl_seen, blocked);
		spun = true;
		idle = 0;
	}
	return NULL;
}

int workers_start(struct server *s, struct errbuf *e)
{
	uint32_t n = s->cfg->workers;
	int ret;

	s->workers = calloc(n, sizeof(*s->workers));
	if (!s->workers)
		return errbuf_set(e, -ENOMEM, "out of memory for %" PRIu32 " workers", n);
	for (uint32_t i = 0; i < n; i++) {
		struct worker *w = &s->workers[i];

		w->s = s;
		w->index = i;
		pthread_mutex_init(&w->lock, NULL);
		ret = pthread_create(&w->thread, NULL, worker_main, w);
		if (ret) {
			workers_stop(s);
			return errbuf_set(e, -ret, "cannot start worker %" PRIu32 ": %s",
					  i, strerror(ret));
		}
		s->nworkers++;
	}
	return 0;
}

void workers_stop(struct server *s)
{
	for (uint32_t i = 0; i < s->nworkers; i++) {
		__atomic_store_n(&s->workers[i].stop, 1, __ATOMIC_RELEASE);
		worker_kick(&s->workers[i]);
	}
	for (uint32_t i = 0; i < s->nworkers; i++) {
		struct worker *w = &s->workers[i];

		pthread_join(w->thread, NULL);
		pthread_mutex_destroy(&w->lock);
		/* Lanes still served at exit were never dropped: their
		 * deferred lists are the worker's to free (ASan: a leak on
		 * every SIGTERM with a client attached). */
		for (uint32_t j = 0; j < w->n; j++) {
			for (uint32_t k = 0; k < w->lanes[j]->ndq; k++)
				ops_batch_drop(w->lanes[j]->dq[k].b);
			free(w->lanes[j]->dq);
			w->lanes[j]->dq = NULL;
			w->lanes[j]->ndq = 0;
		}
		free(w->lanes);
		op_scratch_free(&w->scratch);
	}
	free(s->workers);
	s->workers = NULL;
	s->nworkers = 0;
}

void worker_assign(struct server *s, struct client *c)
{
	/* Lane k to worker k (proto.h, LANES): the lanes were made one per
	 * worker, so each worker gets exactly one lane of every client. */
	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct lane *l = &c->lanes[k];
		struct worker *w = &s->workers[k % s->nworkers];

		l->worker = w;
		pthread_mutex_lock(&w->lock);
		l->qnext = w->incoming;
		w->incoming = l;
		pthread_mutex_unlock(&w->lock);
	}
	c->worker = c->lanes[0].worker;
	for (uint32_t k = 0; k < c->nlanes; k++)
		worker_kick(c->lanes[k].worker);
}
