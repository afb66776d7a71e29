/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_two_procs.c - two processes share one GPU pool through a real
 * kvpoold --backend=cuda and read each other's pages byte for byte.
 *
 *   test_gpu_two_procs KVPOOLD
 *
 * starts the daemon on a socket in a fresh temp dir, then runs itself twice
 * more as clients A and B (fresh processes: CUDA does not survive fork), in
 * steps the parent paces through pipes:
 *
 *   1. write: A appends user 1 in three leases (kvp_append; kvp_append_async
 *      split over two streams; kvp_append_layers_async committed with
 *      kvp_queue_commit), B appends users 100..107 with prepares queued as
 *      one batch, one kvp_append_batch_async launch, queued commits, twice
 *      (the second batch continues the histories mid-page);
 *   2. read: A reads B's users, B reads A's: a read lease (prepare with
 *      n_new = 0) gives the page table, each page is copied with cudaMemcpy
 *      from kvp_device_base() + frame * page_bytes, and every token must be
 *      the bytes its writer appended;
 *   3. order: A appends user 9 on a stream held busy by a 300 ms kernel and
 *      commits at once: kvp_commit must wait for the append (it takes
 *      >= 150 ms), and B, told to read as soon as the commit returned, sees
 *      every byte;
 *   4. the same the other way: B with kvp_append_batch_async and
 *      kvp_queue_commit, A reads.
 *
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "clock.h"
#include "gpu_test_kernels.h"
#include "gpu_test_util.h"
#include "kvpool.h"

#define LAYOUT "layers=4,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define STEP_TIMEOUT_MS 60000
#define SPIN_NS 300000000ull      /* the busy kernel of steps 3 and 4 */
#define MIN_WAIT_NS 150000000ull  /* a commit behind it must wait this long */
#define FD_GO 3                   /* child: the parent's go-ahead */
#define FD_DONE 4                 /* child: step done */

static const char *role = "parent";

__attribute__((format(printf, 1, 2)))
static void say(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%s %d] ", role, (int)getpid());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static uint64_t now_ns(void)
{
	return mono_ns();
}

/* ------------------------------------------------------------ token bytes */

static uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Tokens [pos, pos + n) of user: a pure function of (user, pos, byte). */
static void tokens_fill(const struct kvp_layout *l, uint64_t user, uint64_t pos,
			uint32_t n, unsigned char *out)
{
	for (uint32_t t = 0; t < n; t++) {
		unsigned char *p = out + (uint64_t)t * l->token_bytes;
		uint64_t seed = mix(user * 0x100000001b3ull + pos + t);

		for (uint64_t i = 0; i < l->token_bytes; i += 8) {
			uint64_t w = mix(seed + i);

			memcpy(p + i, &w, l->token_bytes - i < 8 ? l->token_bytes - i : 8);
		}
	}
}

/* ------------------------------------------------------------ child */

struct child {
	struct kvp_client *c;
	const struct kvp_layout *l;
	cudaStream_t s1, s2;
	int failed;
};

#define CHECK(ch, cond, ...)                                                \
	do {                                                                \
		if (!(cond)) {                                              \
			say(__VA_ARGS__);                                   \
			(ch)->failed = 1;                                   \
			return -1;                                          \
		}                                                           \
	} while (0)

#define KVP(ch, call)                                                       \
	do {                                                                \
		int r_ = (call);                                            \
		CHECK(ch, r_ >= 0, "%s:%d: %s = %d: %s", __FILE__, __LINE__, #call, \
		      r_, kvp_last_error((ch)->c));                         \
	} while (0)

#define CU(ch, call)                                                        \
	do {                                                                \
		cudaError_t e_ = (call);                                    \
		CHECK(ch, e_ == cudaSuccess, "%s:%d: %s: %s", __FILE__, __LINE__, \
		      #call, cudaGetErrorString(e_));                       \
	} while (0)

/* Tokens [pos, pos + n) of user in device memory (caller frees). */
static void *device_tokens(struct child *ch, uint64_t user, uint64_t pos, uint32_t n)
{
	size_t bytes = (size_t)n * ch->l->token_bytes;
	unsigned char *h = malloc(bytes ? bytes : 1);
	void *d = NULL;

	if (!h || cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) {
		say("out of memory for %u tokens", n);
		free(h);
		return NULL;
	}
	tokens_fill(ch->l, user, pos, n, h);
	if (cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
		cudaFree(d);
		d = NULL;
	}
	free(h);
	return d;
}

/* The history's end: start + len (0 for a new user). */
static int history_end(struct child *ch, uint64_t user, uint64_t *end)
{
	struct kvp_user_info ui;

	KVP(ch, kvp_info(ch->c, user, &ui));
	*end = ui.start + ui.len;
	return 0;
}

/* A: three leases for user, each by another call. */
static int write_user_three_ways(struct child *ch, uint64_t user)
{
	const struct kvp_layout *l = ch->l;
	const uint64_t row = l->token_stride;
	struct kvp_completion done;
	struct kvp_lease lease;
	uint64_t pos;
	void *d;

	/* 1: kvp_append, synchronous on the default stream. */
	if (history_end(ch, user, &pos))
		return -1;
	KVP(ch, kvp_prepare(ch->c, user, pos, 40, &lease));
	CHECK(ch, (d = device_tokens(ch, user, pos, 40)) != NULL, "device tokens");
	KVP(ch, kvp_append(ch->c, &lease, 0, 40, d));
	/* A range past n_new is refused before anything is enqueued. */
	CHECK(ch, kvp_append(ch->c, &lease, 30, 11, d) == -EINVAL,
	      "append past n_new was not refused");
	KVP(ch, kvp_commit(ch->c, lease.id, 40));
	KVP(ch, kvp_release(ch->c, lease.id));
	cudaFree(d);

	/* 2: kvp_append_async, split over two streams. */
	pos += 40;
	KVP(ch, kvp_prepare(ch->c, user, pos, 50, &lease));
	CHECK(ch, (d = device_tokens(ch, user, pos, 50)) != NULL, "device tokens");
	KVP(ch, kvp_append_async(ch->c, &lease, 0, 20, d, ch->s1));
	KVP(ch, kvp_append_async(ch->c, &lease, 20, 30,
				 (unsigned char *)d + 20 * l->token_bytes, ch->s2));
	KVP(ch, kvp_commit(ch->c, lease.id, 50));
	KVP(ch, kvp_release(ch->c, lease.id));
	CU(ch, cudaStreamSynchronize(ch->s1));
	CU(ch, cudaStreamSynchronize(ch->s2));
	cudaFree(d);

	/* 3: per-layer buffers, committed (and released) by a queued commit. */
	pos += 50;
	{
		const uint32_t n = 33;
		unsigned char *h = malloc((size_t)n * l->token_bytes);
		unsigned char *hk = malloc((size_t)n * row);
		void *k[16] = { 0 }, *v[16] = { 0 };

		CHECK(ch, h && hk && l->layers <= 16, "out of memory");
		KVP(ch, kvp_prepare(ch->c, user, pos, n, &lease));
		tokens_fill(l, user, pos, n, h);
		for (uint32_t ly = 0; ly < l->layers; ly++) {
			for (uint32_t kv = 0; kv < 2; kv++) {
				void **dst = kv ? &v[ly] : &k[ly];

				for (uint32_t t = 0; t < n; t++)
					memcpy(hk + t * row, h + t * l->token_bytes +
					       (2 * ly + kv) * row, row);
				CU(ch, cudaMalloc(dst, n * row));
				CU(ch, cudaMemcpy(*dst, hk, n * row, cudaMemcpyHostToDevice));
			}
		}
		KVP(ch, kvp_append_layers_async(ch->c, &lease, 0, n,
						(const void *const *)k,
						(const void *const *)v, ch->s1));
		KVP(ch, kvp_queue_commit(ch->c, lease.id, n, 1, 7));
		KVP(ch, kvp_submit(ch->c));
		KVP(ch, kvp_reap(ch->c, &done, 1, 1));
		CHECK(ch, done.res >= 0 && done.tag == 7, "queued commit: %d %s", done.res,
		      done.error ? done.error : "");
		CU(ch, cudaStreamSynchronize(ch->s1));
		for (uint32_t ly = 0; ly < l->layers; ly++) {
			cudaFree(k[ly]);
			cudaFree(v[ly]);
		}
		free(h);
		free(hk);
	}
	return 0;
}

/*
 * B: users [first, first + count) in one batch: queued prepares, one
 * kvp_append_batch_async launch, queued commits with release. spin_ns > 0
 * holds the stream busy first and checks the commits waited.
 */
static int write_users_batch(struct child *ch, uint64_t first, uint32_t count,
			     uint64_t spin_ns)
{
	const struct kvp_layout *l = ch->l;
	struct kvp_completion done[16];
	struct kvp_append_item items[16];
	struct kvp_lease leases[16];
	uint64_t pos[16], t0;
	uint32_t n[16], total = 0, got = 0;
	unsigned char *h, *d;

	CHECK(ch, count <= 16, "too many users");
	/* Synchronous calls first: none may run while the batch is queued. */
	for (uint32_t i = 0; i < count; i++)
		if (history_end(ch, first + i, &pos[i]))
			return -1;
	for (uint32_t i = 0; i < count; i++) {
		n[i] = 1 + (uint32_t)(mix(first + i + pos[i]) % 70);
		total += n[i];
		KVP(ch, kvp_queue_prepare(ch->c, first + i, pos[i], n[i], i));
	}
	KVP(ch, kvp_submit(ch->c));
	while (got < count) {
		int r = kvp_reap(ch->c, done + got, count - got, 1);

		KVP(ch, r);
		got += (uint32_t)r;
	}
	for (uint32_t i = 0; i < count; i++) {
		const struct kvp_completion *cp = &done[i];

		CHECK(ch, cp->res >= 0, "prepare of user %" PRIu64 ": %s",
		      first + cp->tag, cp->error);
		leases[cp->tag] = cp->lease; /* indices valid until the next submit */
	}
	h = malloc((size_t)total * l->token_bytes);
	CHECK(ch, h != NULL, "out of memory");
	for (uint32_t i = 0, at = 0; i < count; at += n[i], i++) {
		items[i] = (struct kvp_append_item){ &leases[i], 0, n[i] };
		tokens_fill(l, first + i, pos[i], n[i], h + (size_t)at * l->token_bytes);
	}
	CU(ch, cudaMalloc((void **)&d, (size_t)total * l->token_bytes));
	CU(ch, cudaMemcpy(d, h, (size_t)total * l->token_bytes, cudaMemcpyHostToDevice));
	if (spin_ns)
		CU(ch, (cudaError_t)gpu_test_spin(spin_ns, ch->s1));
	KVP(ch, kvp_append_batch_async(ch->c, items, count, d, ch->s1));
	t0 = now_ns();
	for (uint32_t i = 0; i < count; i++)
		KVP(ch, kvp_queue_commit(ch->c, leases[i].id, n[i], 1, 100 + i));
	if (spin_ns)
		CHECK(ch, now_ns() - t0 >= MIN_WAIT_NS,
		      "kvp_queue_commit did not wait for the append (%.1f ms behind a "
		      "%.0f ms kernel)", (now_ns() - t0) / 1e6, spin_ns / 1e6);
	KVP(ch, kvp_submit(ch->c));
	for (got = 0; got < count;) {
		int r = kvp_reap(ch->c, done, count - got, 1);

		KVP(ch, r);
		for (int i = 0; i < r; i++)
			CHECK(ch, done[i].res >= 0, "commit %" PRIu64 ": %s", done[i].tag,
			      done[i].error);
		got += (uint32_t)r;
	}
	cudaFree(d);
	free(h);
	return 0;
}

/* A: one user behind a busy stream; the commit must wait for it. */
static int write_user_behind_spin(struct child *ch, uint64_t user)
{
	struct kvp_lease lease;
	uint64_t pos, t0, dt;
	void *d;

	if (history_end(ch, user, &pos))
		return -1;
	KVP(ch, kvp_prepare(ch->c, user, pos, 64, &lease));
	CHECK(ch, (d = device_tokens(ch, user, pos, 64)) != NULL, "device tokens");
	CU(ch, (cudaError_t)gpu_test_spin(SPIN_NS, ch->s2));
	KVP(ch, kvp_append_async(ch->c, &lease, 0, 64, d, ch->s2));
	t0 = now_ns();
	KVP(ch, kvp_commit(ch->c, lease.id, 64));
	dt = now_ns() - t0;
	CHECK(ch, dt >= MIN_WAIT_NS, "kvp_commit returned %.1f ms after an append "
	      "behind a %.0f ms kernel: it did not wait", dt / 1e6, SPIN_NS / 1e6);
	KVP(ch, kvp_release(ch->c, lease.id));
	cudaFree(d);
	return 0;
}

/* Read user's whole history from the GPU pool and compare every byte. */
static int verify_user(struct child *ch, uint64_t user, uint64_t min_len)
{
	const struct kvp_layout *l = ch->l;
	const unsigned char *base = kvp_device_base(ch->c);
	struct kvp_user_info ui;
	struct kvp_lease lease;
	struct kvp_slot *slots;
	unsigned char *pages, *got, *want;
	int32_t *frames;

	KVP(ch, kvp_info(ch->c, user, &ui));
	CHECK(ch, ui.len >= min_len, "user %" PRIu64 " holds %" PRIu64 " tokens, "
	      "expected at least %" PRIu64, user, ui.len, min_len);
	KVP(ch, kvp_prepare(ch->c, user, ui.start + ui.len, 0, &lease));
	CHECK(ch, lease.npages == (ui.len + l->page_tokens - 1) / l->page_tokens,
	      "user %" PRIu64 ": %u pages for %" PRIu64 " tokens", user,
	      lease.npages, ui.len);
	frames = malloc(lease.npages * sizeof(*frames));
	pages = malloc((size_t)lease.npages * l->page_bytes);
	slots = malloc(ui.len * sizeof(*slots));
	got = malloc(ui.len * l->token_bytes);
	want = malloc(ui.len * l->token_bytes);
	CHECK(ch, frames && pages && slots && got && want, "out of memory");
	memcpy(frames, lease.indices, lease.npages * sizeof(*frames));
	for (uint32_t j = 0; j < lease.npages; j++)
		CU(ch, cudaMemcpy(pages + (size_t)j * l->page_bytes,
				  base + (uint64_t)frames[j] * l->page_bytes,
				  l->page_bytes, cudaMemcpyDeviceToHost));
	/* The history starts at ui.start, in page 0 slot 0. */
	for (uint64_t s = 0; s < ui.len; s++)
		slots[s] = (struct kvp_slot){ (uint32_t)(s / l->page_tokens),
					      (uint32_t)(s % l->page_tokens) };
	kvp_read_cpu(l, pages, slots, (uint32_t)ui.len, got);
	tokens_fill(l, user, ui.start, (uint32_t)ui.len, want);
	for (uint64_t t = 0; t < ui.len; t++)
		CHECK(ch, !memcmp(got + t * l->token_bytes, want + t * l->token_bytes,
				  l->token_bytes),
		      "user %" PRIu64 " token %" PRIu64 " (frame %d slot %" PRIu64
		      ") differs from what its writer appended", user, ui.start + t,
		      frames[t / l->page_tokens], t % l->page_tokens);
	KVP(ch, kvp_release(ch->c, lease.id));
	free(frames);
	free(pages);
	free(slots);
	free(got);
	free(want);
	return 0;
}

static int step_done(int step)
{
	char b = (char)step;

	return write(FD_DONE, &b, 1) == 1 ? 0 : -1;
}

static int await_go(struct child *ch, int step)
{
	char b = 0;

	CHECK(ch, read(FD_GO, &b, 1) == 1 && b == (char)step,
	      "lost the parent before step %d", step);
	return 0;
}

static int child_main(const char *sock)
{
	struct kvp_connect_opts o = { .socket = sock, .name = role };
	struct child ch = { 0 };
	const int a = !strcmp(role, "A");
	char err[KVP_ERRLEN];
	uint64_t deadline = now_ns() + 30000000000ull;
	int ret;

	/* The daemon may still be starting. */
	while ((ret = kvp_connect(&ch.c, &o, err, sizeof(err))) == -ECONNREFUSED ||
	       ret == -ENOENT) {
		if (now_ns() > deadline)
			break;
		usleep(20000);
	}
	if (ret) {
		say("kvp_connect: %s", err);
		return 1;
	}
	ch.l = kvp_client_layout(ch.c);
	if (kvp_cuda_device(ch.c) < 0 || !kvp_device_base(ch.c)) {
		say("attached, but not to a GPU pool (cuda device %d)",
		    kvp_cuda_device(ch.c));
		return 1;
	}
	say("attached: pool on CUDA device %d at %p", kvp_cuda_device(ch.c),
	    kvp_device_base(ch.c));
	if (cudaSetDevice(kvp_cuda_device(ch.c)) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&ch.s1, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&ch.s2, cudaStreamNonBlocking) != cudaSuccess) {
		say("cannot create streams");
		return 1;
	}

	/* 1: write. */
	if ((a ? write_user_three_ways(&ch, 1)
	       : (write_users_batch(&ch, 100, 8, 0) || write_users_batch(&ch, 100, 8, 0))) ||
	    step_done(1) || await_go(&ch, 2))
		goto fail;
	/* 2: read the other's. */
	if (a) {
		for (uint64_t u = 100; u < 108; u++)
			if (verify_user(&ch, u, 2))
				goto fail;
	} else if (verify_user(&ch, 1, 123)) {
		goto fail;
	}
	if (step_done(2) || await_go(&ch, 3))
		goto fail;
	/* 3: A commits behind a busy stream, B reads at once. */
	if (a ? write_user_behind_spin(&ch, 9) : verify_user(&ch, 9, 64))
		goto fail;
	if (step_done(3) || await_go(&ch, 4))
		goto fail;
	/* 4: the other way round. */
	if (a ? verify_user(&ch, 10, 1) : write_users_batch(&ch, 10, 1, SPIN_NS))
		goto fail;
	if (step_done(4))
		goto fail;
	cudaStreamDestroy(ch.s1);
	cudaStreamDestroy(ch.s2);
	kvp_close(ch.c);
	say("done");
	return 0;
fail:
	say("failed");
	kvp_close(ch.c);
	return 1;
}

/* ------------------------------------------------------------ parent */

struct proc {
	pid_t pid;
	int go, done; /* pipe ends: parent -> child, child -> parent */
};

static char parent_tag[32]; /* "parent PID", as say() puts it */
static struct gpu_daemon kvpoold;

static int start_child(struct proc *p, const char *who)
{
	int go[2], done[2];

	if (pipe(go) || pipe(done))
		return -1;
	p->pid = fork();
	if (p->pid < 0)
		return -1;
	if (p->pid == 0) {
		dup2(go[0], FD_GO);
		dup2(done[1], FD_DONE);
		execl("/proc/self/exe", "test_gpu_two_procs", "--child", who,
		      kvpoold.sock, (char *)NULL);
		_exit(127);
	}
	close(go[0]);
	close(done[1]);
	p->go = go[1];
	p->done = done[0];
	return 0;
}

/* Wait until the child reports step; -1 on a timeout or its death. */
static int wait_step(struct proc *p, const char *who, int step)
{
	struct pollfd pf = { .fd = p->done, .events = POLLIN };
	char b = 0;

	if (poll(&pf, 1, STEP_TIMEOUT_MS) != 1 || read(p->done, &b, 1) != 1 ||
	    b != (char)step) {
		say("client %s did not finish step %d", who, step);
		return -1;
	}
	return 0;
}

static int go(struct proc *p, int step)
{
	char b = (char)step;

	return write(p->go, &b, 1) == 1 ? 0 : -1;
}

static int reap(pid_t pid, const char *who)
{
	return gpu_test_reap(parent_tag, pid, who, 30000);
}

int main(int argc, char **argv)
{
	static const char *const args[] = {
		"--layout=" LAYOUT, "--device_mem=64M", "--host_mem=32M", NULL,
	};
	struct proc a = { 0, -1, -1 }, b = { 0, -1, -1 };
	int fail = 0;

	signal(SIGPIPE, SIG_IGN);
	if (argc == 4 && !strcmp(argv[1], "--child")) {
		role = argv[2];
		return child_main(argv[3]);
	}
	if (argc < 2) {
		fprintf(stderr, "usage: %s KVPOOLD\n", argv[0]);
		return 1;
	}
	if (gpu_test_no_device())
		return 77;
	if (access(argv[1], X_OK)) {
		printf("SKIP: no kvpoold at %s\n", argv[1]);
		return 77;
	}
	snprintf(parent_tag, sizeof(parent_tag), "%s %d", role, (int)getpid());
	if (gpu_daemon_start(&kvpoold, parent_tag, "/tmp/kvpool-gpu-XXXXXX",
			     argv[1], args))
		return 1;
	if (start_child(&a, "A") || start_child(&b, "B")) {
		say("cannot start the clients");
		fail = 1;
	}
	for (int step = 1; !fail && step <= 4; step++) {
		/* Steps 1, 2: both at once. Steps 3, 4: the writer first, the
		 * reader only once the writer's commit returned. */
		if (step <= 2) {
			fail = wait_step(&a, "A", step) || wait_step(&b, "B", step);
		} else {
			struct proc *w = step == 3 ? &a : &b, *r = step == 3 ? &b : &a;
			const char *wn = step == 3 ? "A" : "B", *rn = step == 3 ? "B" : "A";

			fail = wait_step(w, wn, step) || go(r, step) || wait_step(r, rn, step);
		}
		if (!fail && step < 4) {
			if (step == 2)
				fail = go(&a, 3); /* B gets 3 once A wrote */
			else if (step == 3)
				fail = go(&b, 4);
			else
				fail = go(&a, step + 1) || go(&b, step + 1);
		}
	}
	/* On a failure the clients' next wait for the parent ends (EOF). */
	if (a.go >= 0)
		close(a.go);
	if (b.go >= 0)
		close(b.go);
	if (a.pid > 0 && reap(a.pid, "client A"))
		fail = 1;
	if (b.pid > 0 && reap(b.pid, "client B"))
		fail = 1;
	if (gpu_daemon_stop(&kvpoold, 30000))
		fail = 1;
	if (fail)
		gpu_daemon_dump_log(&kvpoold);
	gpu_daemon_cleanup(&kvpoold);
	if (!fail)
		say("two processes read each other's GPU pages byte-exactly; commits "
		    "waited for their appends");
	return fail;
}
