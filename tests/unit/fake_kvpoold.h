/* SPDX-License-Identifier: MIT */
/*
 * fake_kvpoold.h - a fake kvpoold for testing libkvpool in one process.
 *
 * It listens on a Unix socket in a fresh temporary directory, answers the
 * attach with a sealed ring memfd and a device-tier memfd laid out exactly as
 * proto.h says (ring indices starting at start_index, to test wrap-around),
 * and then either serves the rings from its thread with a small model of the
 * operations (serve = 1) or hands the daemon side to the test (serve = 0:
 * fake_take / fake_exec / fake_post). Knobs make the attach go wrong in the
 * ways a client must refuse. Only the test program includes this (after
 * defining _GNU_SOURCE).
 */
#ifndef KVPOOL_FAKE_KVPOOLD_H
#define KVPOOL_FAKE_KVPOOLD_H

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"

/* ------------------------------------------------------------ fake kvpoold */

struct fake {
	char dir[32], path[48];
	int lfd, conn;
	pthread_t thr;
	/* attach knobs */
	uint32_t sq_entries, arena_bytes, start_index, frames, version;
	int32_t status;
	const char *status_msg;
	int no_seal, bad_hdr, extra_fd, serve, sleepy, reverse;
	int split;               /* BATCH: answered by two completions */
	uint64_t batches;        /* BATCH entries taken */
	uint64_t hist_len;       /* PREPARE: committed tokens before the lease */
	int bad_frame;           /* PREPARE: last frame out of the tier */
	struct kvp_layout layout;
	/* the shm as the daemon sees it */
	void *shm;
	size_t shm_bytes;
	struct kvp_ring_ctl *ctl;
	struct kvp_sqe *sqes;
	struct kvp_cqe *cqes;
	unsigned char *arena;
	uint32_t sq_entries_now, cq_entries_now, arena_now;
	void *dev;
	size_t dev_bytes;
	uint32_t sq_head, cq_tail;  /* the daemon's own copies */
	int stop;                   /* atomic */
	uint32_t wakes;             /* atomic: doorbell rang while asleep */
	uint32_t saw_waiters;       /* atomic: cq_waiters was set at publish */
	uint64_t ops;
};

static long futex(uint32_t *w, int op, uint32_t v, const struct timespec *t)
{
	return syscall(SYS_futex, w, op, v, t, NULL, 0);
}

static size_t up64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

static int sealed_memfd(const char *name, size_t bytes, int seal)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
	if (seal)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK |
				       F_SEAL_SEAL), 0);
	return fd;
}

__attribute__((format(printf, 4, 5)))
static void fake_fail(struct fake *f, const struct kvp_sqe *s,
		      struct kvp_cqe *q, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf((char *)f->arena + s->out_off, s->out_len, fmt, ap);
	va_end(ap);
	q->out_bytes = (uint32_t)n + 1 < s->out_len ? (uint32_t)n + 1 : s->out_len;
}

/* The model of the operations the tests need. */
static void fake_exec(struct fake *f, const struct kvp_sqe *s, struct kvp_cqe *q)
{
	const uint32_t P = f->layout.page_tokens;
	unsigned char *out = f->arena + s->out_off;

	memset(q, 0, sizeof(*q));
	q->tag = s->tag;
	f->ops++;
	if (s->out_len > f->arena_now || s->out_off > f->arena_now - s->out_len) {
		q->res = -EFAULT;
		return;
	}
	switch (s->opcode) {
	case KVP_OP_INFO: {
		struct kvp_user_info u = { .user = s->user, .start = 0,
					   .len = s->user * 10, .pages_device = 1 };
		memcpy(out, &u, sizeof(u));
		q->out_bytes = sizeof(u);
		q->val1 = u.len;
		break;
	}
	case KVP_OP_PREPARE: {
		struct kvp_prepare_out h = { .lease = 1000 + s->user, .len = f->hist_len,
					     .n_new = s->n };
		uint64_t tokens = f->hist_len + s->n;
		size_t need;

		if (s->user == 666) {
			q->res = -EINVAL;
			/* the daemon's words (seed 002's sentence first) */
			fake_fail(f, s, q, "The input sequence has missing tokens "
				  "from 10 to 19 (both inclusive). For user 666 the "
				  "cache holds tokens [0, 10): send the input from "
				  "position 10");
			break;
		}
		h.npages = (uint32_t)((tokens + P - 1) / P);
		h.last_page_len = h.npages ? (uint32_t)(tokens - (h.npages - 1) * P) : 0;
		need = sizeof(h) + h.npages * sizeof(int32_t);
		if (need > s->out_len) {
			q->res = -EMSGSIZE;
			fake_fail(f, s, q, "user %" PRIu64 ": page table of %u pages does "
				  "not fit %u bytes", s->user, h.npages, s->out_len);
			break;
		}
		memcpy(out, &h, sizeof(h));
		for (uint32_t i = 0; i < h.npages; i++) {
			int32_t fr = (int32_t)((i * 7 + 3) % f->frames);

			if (f->bad_frame && i == h.npages - 1)
				fr = (int32_t)f->frames;
			memcpy(out + sizeof(h) + i * 4, &fr, 4);
		}
		q->out_bytes = (uint32_t)need;
		break;
	}
	case KVP_OP_COMMIT:
		if (!s->arg) {
			q->res = -ENOENT;
			fake_fail(f, s, q, "lease 0: no such lease");
		} else if (s->n == 999) { /* a commit the daemon refuses */
			q->res = -EINVAL;
			fake_fail(f, s, q, "lease %" PRIu64 ": commit of 999 tokens but "
				  "only 4 were prepared", s->arg);
		} else {
			q->res = (int32_t)s->n + ((s->flags & KVP_SQE_RELEASE) ? 1000 : 0);
		}
		break;
	case KVP_OP_RELEASE:
		q->res = 0;
		if (s->arg == 1013) { /* user 13's lease: a release refused */
			q->res = -EBUSY;
			fake_fail(f, s, q, "lease 1013: release refused (test)");
		}
		break;
	case KVP_OP_OFFLOAD:
		q->res = (s->flags & KVP_SQE_ALL) ? 50 : 5;
		break;
	case KVP_OP_EVICT:
		q->res = s->sel + ((s->flags & KVP_SQE_ALL) ? 100 : 0);
		break;
	case KVP_OP_STATS: {
		struct kvp_stats st = { .prepares = f->ops, .tenants = s->flags };
		memcpy(out, &st, sizeof(st));
		q->out_bytes = sizeof(st);
		break;
	}
	case KVP_OP_USERS: {
		uint32_t rows = 0;

		for (uint64_t u = s->arg; u < 25 && rows < s->n; u++, rows++) {
			struct kvp_user_info ui = { .user = u, .len = u };
			memcpy(out + rows * sizeof(ui), &ui, sizeof(ui));
		}
		q->res = (int32_t)rows;
		q->out_bytes = rows * sizeof(struct kvp_user_info);
		q->val0 = s->arg + rows < 25 ? s->arg + rows : 0;
		break;
	}
	default:
		q->res = -EPERM;
		fake_fail(f, s, q, "op %u: needs an admin uid", s->opcode);
	}
}

/*
 * A BATCH entry (proto.h, BATCH) as kvpoold answers one: each item run as
 * its own entry, its completion into the log (reversed with f->reverse);
 * q[0] the only completion, or with f->split q[0] for the first half and
 * q[1] for the rest. Returns how many completions.
 */
static uint32_t fake_batch(struct fake *f, const struct kvp_sqe *s,
			   struct kvp_cqe *q)
{
	struct kvp_batch_item it[KVP_BATCH_MAX];
	uint32_t n = s->n, half;

	memset(q, 0, sizeof(*q));
	q->tag = s->tag;
	f->batches++;
	if (!n || n > KVP_BATCH_MAX || s->in_len != n * sizeof(it[0]) ||
	    s->in_off > f->arena_now - s->in_len ||
	    s->out_off > f->arena_now - n * sizeof(struct kvp_cqe)) {
		q->res = -EINVAL;
		return 1;
	}
	memcpy(it, f->arena + s->in_off, s->in_len);
	for (uint32_t i = 0; i < n; i++) {
		const struct kvp_batch_item *x = &it[f->reverse ? n - 1 - i : i];
		struct kvp_sqe e = { .opcode = x->opcode, .flags = x->flags,
				     .n = x->n, .tag = x->tag, .user = x->user,
				     .arg = x->arg, .out_off = x->out_off,
				     .out_len = x->out_len };
		struct kvp_cqe c;

		fake_exec(f, &e, &c);
		memcpy(f->arena + s->out_off + i * sizeof(c), &c, sizeof(c));
	}
	half = f->split && n >= 2 ? n / 2 : n;
	q[0] = (struct kvp_cqe){ .tag = s->tag, .res = (int32_t)half,
				 .out_bytes = half * sizeof(struct kvp_cqe),
				 .val0 = 0, .val1 = half == n };
	if (half == n)
		return 1;
	q[1] = (struct kvp_cqe){ .tag = s->tag, .res = (int32_t)(n - half),
				 .out_bytes = (n - half) * sizeof(struct kvp_cqe),
				 .val0 = half, .val1 = 1 };
	return 2;
}

/* Daemon side by hand: take one published SQE (0 when none). */
static int fake_take(struct fake *f, struct kvp_sqe *s)
{
	uint32_t tail = __atomic_load_n(&f->ctl->sq_tail, __ATOMIC_ACQUIRE);

	if (tail == f->sq_head)
		return 0;
	*s = f->sqes[f->sq_head & (f->sq_entries_now - 1)];
	f->sq_head++;
	return 1;
}

static void fake_post(struct fake *f, const struct kvp_cqe *q, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		f->cqes[f->cq_tail++ & (f->cq_entries_now - 1)] = q[i];
	__atomic_store_n(&f->ctl->cq_tail, f->cq_tail, __ATOMIC_RELEASE);
	__atomic_store_n(&f->ctl->sq_head, f->sq_head, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&f->ctl->cq_waiters, __ATOMIC_RELAXED)) {
		__atomic_fetch_add(&f->saw_waiters, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&f->ctl->cq_seq, 1, __ATOMIC_RELEASE);
		futex(&f->ctl->cq_seq, FUTEX_WAKE, 1, NULL);
	}
}

static void fake_idle(struct fake *f)
{
	const struct timespec t = { .tv_nsec = 5000000 };
	uint32_t bell;

	if (!f->sleepy) {
		sched_yield();
		return;
	}
	bell = __atomic_load_n(&f->ctl->sq_doorbell, __ATOMIC_ACQUIRE);
	__atomic_store_n(&f->ctl->sq_flags, KVP_RING_NEED_WAKEUP, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&f->ctl->sq_tail, __ATOMIC_ACQUIRE) == f->sq_head) {
		futex(&f->ctl->sq_doorbell, FUTEX_WAIT, bell, &t);
		if (__atomic_load_n(&f->ctl->sq_doorbell, __ATOMIC_ACQUIRE) != bell)
			__atomic_fetch_add(&f->wakes, 1, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&f->ctl->sq_flags, 0, __ATOMIC_RELAXED);
}

static void fake_serve(struct fake *f)
{
	struct kvp_cqe *batch = calloc(f->cq_entries_now, sizeof(*batch));
	struct kvp_sqe s;

	while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
		uint32_t n = 0, room;

		room = f->cq_entries_now - (f->cq_tail -
			__atomic_load_n(&f->ctl->cq_head, __ATOMIC_ACQUIRE));
		while (n + 1 < room && fake_take(f, &s)) {
			if (s.opcode == KVP_OP_BATCH)
				n += fake_batch(f, &s, &batch[n]);
			else
				fake_exec(f, &s, &batch[n++]);
		}
		if (!n) {
			fake_idle(f);
			continue;
		}
		/* (A batch's parts come in order: with split, only its log is
		 * reversed.) */
		if (f->reverse && !f->split)
			for (uint32_t i = 0; i < n / 2; i++) {
				struct kvp_cqe t = batch[i];
				batch[i] = batch[n - 1 - i];
				batch[n - 1 - i] = t;
			}
		fake_post(f, batch, n);
	}
	free(batch);
}

static void fake_send_welcome(struct fake *f, const struct kvp_hello *h)
{
	struct kvp_welcome w = { .magic = KVP_PROTO_MAGIC,
				 .version = f->version ? f->version : KVP_PROTO_VERSION,
				 .status = f->status, .client_id = 7,
				 .flags = KVP_WELCOME_TENANT | KVP_WELCOME_ADMIN,
				 .shards = 1, .tp = 1 };
	size_t ctl_off = up64(sizeof(struct kvp_shm_hdr)), sq_off, cq_off, arena_off;
	int fds[4], nfds = 0, pfd[2] = { -1, -1 };
	union { char buf[CMSG_SPACE(sizeof(fds))]; struct cmsghdr a; } u;
	struct iovec iov = { &w, sizeof(w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct kvp_shm_hdr *hdr;
	struct cmsghdr *cm;

	f->sq_entries_now = h->sq_entries ? h->sq_entries : f->sq_entries;
	f->cq_entries_now = 2 * f->sq_entries_now;
	f->arena_now = h->arena_bytes ? h->arena_bytes : f->arena_bytes;
	sq_off = up64(ctl_off + sizeof(struct kvp_ring_ctl));
	cq_off = up64(sq_off + f->sq_entries_now * sizeof(struct kvp_sqe));
	arena_off = up64(cq_off + f->cq_entries_now * sizeof(struct kvp_cqe));
	f->shm_bytes = arena_off + f->arena_now;

	if (f->status) {
		snprintf(w.msg, sizeof(w.msg), "%s", f->status_msg);
		assert_true(send(f->conn, &w, sizeof(w), 0) == sizeof(w));
		return;
	}
	fds[0] = sealed_memfd("fake-shm", f->shm_bytes, !f->no_seal);
	f->shm = mmap(NULL, f->shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	assert_true(f->shm != MAP_FAILED);
	hdr = f->shm;
	*hdr = (struct kvp_shm_hdr){ .magic = KVP_PROTO_MAGIC,
		.version = KVP_PROTO_VERSION, .client_id = 7,
		.sq_entries = f->sq_entries_now, .cq_entries = f->cq_entries_now,
		.arena_bytes = f->arena_now, .ctl_off = ctl_off, .sq_off = sq_off,
		.cq_off = cq_off, .arena_off = f->bad_hdr ? arena_off + 64 : arena_off,
		.total_bytes = f->shm_bytes, .lanes = 1,
		.lane_bytes = up64(cq_off + f->cq_entries_now * sizeof(struct kvp_cqe)) -
			      ctl_off };
	f->ctl = (void *)((char *)f->shm + ctl_off);
	f->sqes = (void *)((char *)f->shm + sq_off);
	f->cqes = (void *)((char *)f->shm + cq_off);
	f->arena = (unsigned char *)f->shm + arena_off;
	f->sq_head = f->cq_tail = f->start_index;
	f->ctl->sq_tail = f->ctl->sq_head = f->start_index;
	f->ctl->cq_tail = f->ctl->cq_head = f->start_index;
	nfds = 1;

	f->dev_bytes = (size_t)f->frames * f->layout.page_bytes;
	fds[nfds++] = sealed_memfd("fake-device", f->dev_bytes, 1);
	f->dev = mmap(NULL, f->dev_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	assert_true(f->dev != MAP_FAILED);
	if (f->extra_fd) {
		assert_int_equal(pipe2(pfd, O_CLOEXEC | O_NONBLOCK), 0);
		f->extra_fd = pfd[0]; /* the test reads it: EOF once all writers closed */
		fds[nfds++] = pfd[1];
		fds[nfds++] = pfd[1];
	}
	w.nfds = 2;
	w.layout = f->layout;
	w.tier_bytes[KVP_TIER_DEVICE] = f->dev_bytes;
	w.tier_frames[KVP_TIER_DEVICE] = f->frames;
	w.shm_bytes = f->shm_bytes;
	snprintf(w.backend, sizeof(w.backend), "shm");
	mh.msg_control = u.buf;
	mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	assert_true(sendmsg(f->conn, &mh, 0) == sizeof(w));
	close(fds[0]);
	close(fds[1]);
	if (pfd[1] >= 0)
		close(pfd[1]);
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	struct kvp_hello h;

	f->conn = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (f->conn < 0)
		return NULL;
	if (recv(f->conn, &h, sizeof(h), 0) != sizeof(h) ||
	    h.magic != KVP_PROTO_MAGIC || h.version != KVP_PROTO_VERSION)
		return NULL;
	fake_send_welcome(f, &h);
	if (f->serve && f->shm)
		fake_serve(f);
	return NULL;
}

static struct fake *fake_new(void)
{
	struct fake *f = calloc(1, sizeof(*f));
	char err[KVP_ERRLEN];

	assert_non_null(f);
	f->lfd = f->conn = -1;
	f->sq_entries = 64;
	f->arena_bytes = 256 << 10;
	f->frames = 64;
	f->serve = 1;
	assert_int_equal(kvp_layout_init(&f->layout, 2, 2, 8, KVP_DTYPE_FP16, 4,
					  err, sizeof(err)), 0);
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvp-test-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/s", f->dir);
	return f;
}

static void fake_listen(struct fake *f)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f->lfd, 4), 0);
	assert_int_equal(pthread_create(&f->thr, NULL, fake_main, f), 0);
}

/* Start the fake and attach a client to it (serving from a thread when
 * f->serve, else the test is the daemon once this returns). */
static struct kvp_client *fake_attach(struct fake *f,
				      const struct kvp_connect_opts *o)
{
	struct kvp_connect_opts d = { 0 };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN];

	fake_listen(f);
	d = o ? *o : d;
	d.socket = f->path;
	if (kvp_connect(&c, &d, err, sizeof(err)))
		fail_msg("kvp_connect: %s", err);
	if (!f->serve)
		pthread_join(f->thr, NULL);
	return c;
}

static void fake_free(struct fake *f)
{
	__atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
	if (f->serve && f->lfd >= 0) {
		/* Unblock an accept that never came. */
		shutdown(f->lfd, SHUT_RDWR);
		pthread_join(f->thr, NULL);
	}
	if (f->conn >= 0)
		close(f->conn);
	if (f->lfd >= 0)
		close(f->lfd);
	if (f->shm)
		munmap(f->shm, f->shm_bytes);
	if (f->dev)
		munmap(f->dev, f->dev_bytes);
	unlink(f->path);
	rmdir(f->dir);
	free(f);
}

/* Attach must fail; returns the code with the message in err. */
static int fake_attach_fails(struct fake *f, char *err)
{
	struct kvp_connect_opts o = { .socket = f->path };
	struct kvp_client *c = (void *)1;
	int ret;

	fake_listen(f);
	ret = kvp_connect(&c, &o, err, KVP_ERRLEN);
	assert_true(ret < 0);
	assert_null(c);
	f->serve = 1; /* so fake_free joins the thread */
	return ret;
}

#endif /* KVPOOL_FAKE_KVPOOLD_H */
