/* SPDX-License-Identifier: MIT */
/*
 * fuzz_ring - what a client writes into its submission ring and arena, run
 * as kvpoold's worker runs it (daemon/server/worker.c, run_entry): each entry
 * copied out, ops_sqe_user() asked for its user, ops_execute() (the one
 * validation layer, daemon/server/ops*.c) on a daemon of one tenant with a small
 * shm pool (1 MiB device tier, 2 MiB host tier), a prepare the reclaimer
 * would hold run again, an onload waited for. Every input starts from a
 * fresh daemon, so a finding replays alone.
 *
 * Input: byte 0 is the client's flags (bit 0: an admin); then up to
 * MAX_SQES ring entries of 64 bytes. The arena holds the whole input from
 * its start, so an entry's input range can point at bytes the fuzzer
 * wrote; results land there too. An entry whose arg is LAST gets the
 * val0 of the last completion that succeeded instead (a lease, a cursor):
 * a client naming the lease it was handed.
 *
 * FUZZ_TRACE=1 prints each completion (what a reproducer did).
 *
 * What a completion must hold: out_bytes within the entry's result range,
 * and a failure's message NUL-terminated inside it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "config.h"
#include "fuzz.h"
#include "ops.h"
#include "reload.h"
#include "server.h"
#include "tenant.h"

#define MAX_SQES 64u
#define ARENA_BYTES KVP_ARENA_MIN_BYTES
#define LAST 0x545341454c54534cull /* "LSTLEAST": the last val0 */
#define RECLAIM_WAIT_FUZZ 1000000ull /* ns; past it after the first round */

static char *args[] = { "kvpoold", "--device-mem=1M", "--host-mem=2M", "--workers=1",
			NULL };
static struct config cfg;
static unsigned char *arena;
static bool trace; /* FUZZ_TRACE=1: each completion on stderr */

/*
 * RELOAD signals kvpoold (SIGHUP) and waits for its main thread to reload
 * (reload.c). Here a thread plays that main thread: the handler wakes it
 * through a pipe and it runs reload_run() on the daemon of the input.
 */
static int hup_pipe[2];
static pthread_mutex_t cur_lock = PTHREAD_MUTEX_INITIALIZER;
static struct server *cur;

static void on_hup(int sig)
{
	char b = 0;

	(void)sig;
	if (write(hup_pipe[1], &b, 1) < 0)
		return; /* the reload times out: a finding, as in kvpoold */
}

static void *reloader(void *arg)
{
	char b;

	(void)arg;
	while (read(hup_pipe[0], &b, 1) == 1) {
		pthread_mutex_lock(&cur_lock);
		if (cur)
			reload_run(cur);
		pthread_mutex_unlock(&cur_lock);
	}
	return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	pthread_t t;

	trace = getenv("FUZZ_TRACE") != NULL;
	arena = malloc(ARENA_BYTES);
	if (!arena || config_load(&cfg, 4, args)) {
		fprintf(stderr, "fuzz_ring: cannot make the daemon's config\n");
		abort();
	}
	reload_init(4, args);
	if (pipe2(hup_pipe, O_CLOEXEC) || signal(SIGHUP, on_hup) == SIG_ERR ||
	    pthread_create(&t, NULL, reloader, NULL)) {
		perror("fuzz_ring: the reload thread");
		abort();
	}
	return 0;
}

static void check_cqe(const struct kvp_sqe *q, const struct kvp_cqe *cqe)
{
	fuzz_assert(cqe->tag == q->tag);
	if (q->out_len > ARENA_BYTES || q->out_off > ARENA_BYTES - q->out_len) {
		/* No room for a message: refused with none. */
		fuzz_assert(cqe->res == -EINVAL && !cqe->out_bytes);
		return;
	}
	fuzz_assert(cqe->out_bytes <= q->out_len);
	if (cqe->res < 0 && cqe->out_bytes)
		fuzz_assert(arena[q->out_off + cqe->out_bytes - 1] == '\0');
}

/*
 * A BATCH entry, as worker.c's take_batch/run_batch run one: opened (the
 * items checked whole and copied once), run until every item ran (a
 * prepare the reclaimer would hold runs again, as past RECLAIM_WAIT_NS),
 * its onloads waited for, its completions emitted. What they must hold:
 * the completions' item counts add up to the batch's, each names an
 * item's tag, and each item's result stays within its range.
 */
static void run_batch(struct server *s, struct client *c, const struct kvp_sqe *q,
		      struct op_scratch *scr)
{
	static const struct op_batch_clock clk = { RECLAIM_WAIT_FUZZ, 0 };
	struct op_batch *b;
	struct kvp_cqe cqe;
	uint32_t got = 0, rounds = 0;

	b = ops_batch_open(s, c, q, arena, ARENA_BYTES, arena, ARENA_BYTES, &cqe);
	if (!b) {
		check_cqe(q, &cqe);
		fuzz_assert(cqe.res < 0);
		return;
	}
	for (;;) {
		/* now past the reclaimer's wait after the first round */
		static const struct op_batch_clock clk = { RECLAIM_WAIT_FUZZ, 0 };

		ops_batch_run(s, c, q, b, arena, ARENA_BYTES, scr, NULL, NULL,
			      rounds ? UINT64_MAX / 2 : 1, &clk);
		for (uint32_t i = 0; i < b->count; i++)
			if (b->v[i].state == OP_ITEM_LANDING)
				engine_fence_wait(b->v[i].eng, b->v[i].fence);
		if (ops_batch_settle(q, b, arena))
			break;
		if (ops_batch_emit(q, b, &cqe))
			got += (uint32_t)cqe.res;
		/* Nothing here waits for a lower tier: each round runs at
		 * least the first item not run, whatever held it. */
		fuzz_assert(++rounds <= b->count + 1);
	}
	fuzz_assert(ops_batch_emit(q, b, &cqe) && cqe.val1 == 1);
	got += (uint32_t)cqe.res;
	fuzz_assert(got == b->count && cqe.tag == q->tag);
	for (uint32_t i = 0; i < b->count; i++) {
		struct kvp_cqe ic;
		bool found = false;

		memcpy(&ic, arena + q->out_off + i * sizeof(ic), sizeof(ic));
		for (uint32_t j = 0; j < b->count && !found; j++)
			found = b->v[j].it.tag == ic.tag &&
				ic.out_bytes <= b->v[j].it.out_len;
		fuzz_assert(found);
	}
	if (trace)
		fprintf(stderr, "fuzz_ring: batch tag %llu: %u items\n",
			(unsigned long long)q->tag, b->count);
	ops_batch_free(b);
}

/* One entry, as run_entry() runs it. */
static void run_entry(struct server *s, struct client *c, struct kvp_sqe *q,
		      struct op_scratch *scr, uint64_t *last)
{
	struct op_wait wt = { .may_retry = true };
	struct kvp_cqe cqe;
	uint64_t user;

	if (q->arg == LAST)
		q->arg = *last;
	if (q->opcode == KVP_OP_BATCH) {
		run_batch(s, c, q, scr);
		return;
	}
	(void)ops_sqe_user(s, c, q, &user);
	ops_execute(s, c, q, arena, ARENA_BYTES, arena, ARENA_BYTES, scr, &cqe, &wt);
	if (wt.retry) {
		/* Past RECLAIM_WAIT_NS: the prepare makes its room itself. */
		wt = (struct op_wait){ .retried = true };
		ops_execute(s, c, q, arena, ARENA_BYTES, arena, ARENA_BYTES, scr, &cqe,
			    &wt);
		fuzz_assert(!wt.retry);
	}
	if (wt.fence)
		engine_fence_wait(wt.eng, wt.fence);
	check_cqe(q, &cqe);
	if (trace)
		fprintf(stderr, "fuzz_ring: %s tag %llu: res %d val0 %llu%s%.*s\n",
			ops_name(q->opcode) ? ops_name(q->opcode) : "?",
			(unsigned long long)q->tag, cqe.res,
			(unsigned long long)cqe.val0, cqe.res < 0 ? ": " : "",
			cqe.res < 0 ? (int)cqe.out_bytes : 0,
			cqe.res < 0 && cqe.out_bytes ? (char *)arena + q->out_off : "");
	if (cqe.res >= 0 && cqe.val0)
		*last = cqe.val0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct server s = { .cfg = &cfg, .nworkers = 1 };
	struct errbuf e = { .msg = "" };
	struct op_scratch scr = { 0 };
	struct client c = { .id = 1, .uid = 1000, .pid = 1, .state = CLIENT_LIVE };
	uint32_t n = size > 1 ? (uint32_t)((size - 1) / sizeof(struct kvp_sqe)) : 0;
	uint64_t last = 0;

	if (!size)
		return 0;
	if (tenants_create(&s.tenants, &cfg, &e)) {
		fprintf(stderr, "fuzz_ring: %s\n", e.msg);
		abort();
	}
	pthread_mutex_init(&s.reg.lock, NULL);
	pthread_mutex_lock(&cur_lock);
	cur = &s;
	pthread_mutex_unlock(&cur_lock);
	s.reg.head = s.reg.tail = &c;
	s.reg.live = 1;
	c.tenant = &s.tenants.v[0];
	c.admin = data[0] & 1;
	snprintf(c.name, sizeof(c.name), "fuzz_ring");
	memset(arena, 0, ARENA_BYTES);
	memcpy(arena, data, size < ARENA_BYTES ? size : ARENA_BYTES);
	c.shm.arena = arena;
	c.shm.arena_bytes = ARENA_BYTES;
	for (uint32_t i = 0; i < n && i < MAX_SQES; i++) {
		struct kvp_sqe q;

		memcpy(&q, data + 1 + i * sizeof(q), sizeof(q));
		run_entry(&s, &c, &q, &scr, &last);
	}
	op_scratch_free(&scr);
	pthread_mutex_lock(&cur_lock);
	cur = NULL;
	pthread_mutex_unlock(&cur_lock);
	tenants_destroy(&s.tenants);
	pthread_mutex_destroy(&s.reg.lock);
	return 0;
}
