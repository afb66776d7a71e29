/* SPDX-License-Identifier: MIT */
/*
 * harness_raw.c - a client that speaks proto.h by itself: its own attach
 * handshake and hand-driven rings, so a test can put into the submission
 * ring, the hello or the ring indices anything a broken or hostile client
 * could (harness.h). It follows the protocol's ordering rules wherever the
 * test does not mean to break them.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ raw ring */

static int sys_futex(uint32_t *uaddr, int op, uint32_t val,
		     const struct timespec *ts)
{
	return (int)syscall(SYS_futex, uaddr, op, val, ts, NULL, 0);
}

int h_raw_attach(struct h_raw *r, const char *sock, uint32_t sq_entries,
		 uint32_t arena_bytes, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	r->sock = -1;
	for (int i = 0; i < 4; i++)
		r->fds[i] = -1;
	err[0] = 0;
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	r->sock = s;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		snprintf(err, errlen, "connect %s: %s", sock, strerror(e));
		h_raw_detach(r);
		return -e;
	}
	struct kvp_hello hello = {
		.magic = KVP_PROTO_MAGIC,
		.version = KVP_PROTO_VERSION,
		.sq_entries = sq_entries,
		.cq_entries = 0,
		.arena_bytes = arena_bytes,
	};
	snprintf(hello.name, sizeof(hello.name), "raw-%.27s",
		 program_invocation_short_name);
	if (send(s, &hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello)) {
		int e = errno;
		snprintf(err, errlen, "send hello: %s", strerror(e));
		h_raw_detach(r);
		return -(e ? e : EPROTO);
	}
	struct pollfd pfd = { .fd = s, .events = POLLIN };
	if (poll(&pfd, 1, 10000) <= 0) {
		snprintf(err, errlen, "no welcome within 10 s");
		h_raw_detach(r);
		return -ETIMEDOUT;
	}
	union {
		char buf[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov = { .iov_base = &r->w, .iov_len = sizeof(r->w) };
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = cbuf.buf,
		.msg_controllen = sizeof(cbuf.buf),
	};
	ssize_t got = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
	if (got < 0) {
		int e = errno;
		snprintf(err, errlen, "recv welcome: %s", strerror(e));
		h_raw_detach(r);
		return -e;
	}
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int nf = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *fdp = (int *)CMSG_DATA(cm);
		for (int i = 0; i < nf; i++) {
			if (r->nfds < 4)
				r->fds[r->nfds++] = fdp[i];
			else
				close(fdp[i]);
		}
	}
	if ((size_t)got != sizeof(r->w) || r->w.magic != KVP_PROTO_MAGIC) {
		snprintf(err, errlen, "welcome of %zd bytes, magic %" PRIx64
			 " (expected %zu bytes)", got, r->w.magic,
			 sizeof(r->w));
		h_raw_detach(r);
		return -EPROTO;
	}
	if (r->w.status != 0) {
		r->w.msg[sizeof(r->w.msg) - 1] = 0;
		snprintf(err, errlen, "%s", r->w.msg);
		int st = r->w.status;
		h_raw_detach(r);
		return st < 0 ? st : -EPROTO;
	}
	if (r->nfds < 1) {
		snprintf(err, errlen, "welcome without the shm fd");
		h_raw_detach(r);
		return -EPROTO;
	}
	r->shm_bytes = r->w.shm_bytes;
	void *m = mmap(NULL, r->shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
		       r->fds[0], 0);
	if (m == MAP_FAILED) {
		int e = errno;
		snprintf(err, errlen, "mmap shm of %zu bytes: %s", r->shm_bytes,
			 strerror(e));
		h_raw_detach(r);
		return -e;
	}
	r->shm = m;
	memcpy(&r->hdr, r->shm, sizeof(r->hdr));
	const struct kvp_shm_hdr *h = &r->hdr;
	uint32_t cqe = h->cq_entries;
	if (h->magic != KVP_PROTO_MAGIC || !h->sq_entries ||
	    (h->sq_entries & (h->sq_entries - 1)) || !cqe || (cqe & (cqe - 1)) ||
	    h->ctl_off > r->shm_bytes - sizeof(struct kvp_ring_ctl) ||
	    h->sq_off > r->shm_bytes - (uint64_t)h->sq_entries * 64 ||
	    h->cq_off > r->shm_bytes - (uint64_t)cqe * 32 ||
	    h->arena_off > r->shm_bytes - h->arena_bytes) {
		snprintf(err, errlen, "bad shm header");
		h_raw_detach(r);
		return -EPROTO;
	}
	r->ctl = (struct kvp_ring_ctl *)(r->shm + h->ctl_off);
	r->sq = (struct kvp_sqe *)(r->shm + h->sq_off);
	r->cq = (struct kvp_cqe *)(r->shm + h->cq_off);
	r->arena = r->shm + h->arena_off;
	r->sq_tail = __atomic_load_n(&r->ctl->sq_tail, __ATOMIC_RELAXED);
	r->cq_head = __atomic_load_n(&r->ctl->cq_head, __ATOMIC_RELAXED);
	return 0;
}

void h_raw_detach(struct h_raw *r)
{
	if (r->shm)
		munmap(r->shm, r->shm_bytes);
	r->shm = NULL;
	for (int i = 0; i < r->nfds; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	r->nfds = 0;
	if (r->sock >= 0)
		close(r->sock);
	r->sock = -1;
}

uint32_t h_raw_sq_space(const struct h_raw *r)
{
	uint32_t head = __atomic_load_n(&r->ctl->sq_head, __ATOMIC_ACQUIRE);
	uint32_t used = r->sq_tail - head;
	return used >= r->hdr.sq_entries ? 0 : r->hdr.sq_entries - used;
}

void h_raw_put(struct h_raw *r, const struct kvp_sqe *e)
{
	r->sq[r->sq_tail & (r->hdr.sq_entries - 1)] = *e;
	r->sq_tail++;
}

void h_raw_kick(struct h_raw *r)
{
	__atomic_fetch_add(&r->ctl->sq_doorbell, 1, __ATOMIC_SEQ_CST);
	sys_futex(&r->ctl->sq_doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

void h_raw_publish(struct h_raw *r)
{
	/* S1: pairs with the daemon's load-acquire of sq_tail. */
	__atomic_store_n(&r->ctl->sq_tail, r->sq_tail, __ATOMIC_RELEASE);
	/* The store to sq_tail must be visible before we read the flag
	 * (the daemon fences between setting it and re-checking sq_tail). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&r->ctl->sq_flags, __ATOMIC_RELAXED) &
	    KVP_RING_NEED_WAKEUP)
		h_raw_kick(r);
}

int h_raw_reap(struct h_raw *r, struct kvp_cqe *out, uint32_t max,
	       uint32_t min, int timeout_ms)
{
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	uint32_t got = 0, mask = r->hdr.cq_entries - 1;
	unsigned spins = 0;
	for (;;) {
		/* Pairs with the daemon's store-release of cq_tail (D1). */
		uint32_t tail = __atomic_load_n(&r->ctl->cq_tail, __ATOMIC_ACQUIRE);
		while (r->cq_head != tail && got < max)
			out[got++] = r->cq[r->cq_head++ & mask];
		/* C1: the slots may be reused once the daemon sees this. */
		__atomic_store_n(&r->ctl->cq_head, r->cq_head, __ATOMIC_RELEASE);
		if (got >= min || got == max)
			return (int)got;
		if (h_now_ms() > deadline)
			return -ETIMEDOUT;
		if (++spins < 64) {
			sched_yield();
			continue;
		}
		/* Entries still unconsumed and the daemon asleep: ring. */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(&r->ctl->sq_head, __ATOMIC_ACQUIRE) != r->sq_tail &&
		    (__atomic_load_n(&r->ctl->sq_flags, __ATOMIC_RELAXED) &
		     KVP_RING_NEED_WAKEUP))
			h_raw_kick(r);
		/* Sleep on cq_seq, with a short timeout so a missed wake-up
		 * costs a millisecond, not the test. */
		uint32_t seq = __atomic_load_n(&r->ctl->cq_seq, __ATOMIC_ACQUIRE);
		__atomic_store_n(&r->ctl->cq_waiters, 1, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(&r->ctl->cq_tail, __ATOMIC_ACQUIRE) == r->cq_head) {
			struct timespec ts = { 0, 1000000 };
			sys_futex(&r->ctl->cq_seq, FUTEX_WAIT, seq, &ts);
		}
		__atomic_store_n(&r->ctl->cq_waiters, 0, __ATOMIC_RELAXED);
	}
}

int h_raw_call(struct h_raw *r, const struct kvp_sqe *in, struct kvp_cqe *out,
	       uint32_t n, int timeout_ms)
{
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	uint8_t *done = calloc(n ? n : 1, 1);
	struct kvp_cqe buf[64];
	uint32_t sent = 0, reaped = 0;
	int ret = 0;
	if (!done)
		return -ENOMEM;
	while (reaped < n) {
		uint32_t space = h_raw_sq_space(r);
		uint32_t inflight = sent - reaped;
		/* Never more in flight than the CQ holds. */
		uint32_t cq_room = r->hdr.cq_entries - inflight;
		if (space > cq_room)
			space = cq_room;
		uint32_t k = 0;
		while (sent < n && k < space) {
			h_raw_put(r, &in[sent++]);
			k++;
		}
		if (k)
			h_raw_publish(r);
		int64_t left = (int64_t)deadline - (int64_t)h_now_ms();
		if (left < 0) {
			ret = -ETIMEDOUT;
			break;
		}
		int got = h_raw_reap(r, buf, 64, 1, (int)left);
		if (got < 0) {
			ret = got;
			break;
		}
		for (int i = 0; i < got; i++) {
			uint32_t j;
			for (j = 0; j < sent; j++)
				if (in[j].tag == buf[i].tag && !done[j])
					break;
			if (j == sent) {
				h_fail("completion with unknown or repeated tag %#"
				       PRIx64 " (res %d)", buf[i].tag, buf[i].res);
				ret = -EPROTO;
				continue;
			}
			done[j] = 1;
			out[j] = buf[i];
			reaped++;
		}
		if (ret)
			break;
	}
	free(done);
	return ret;
}

int h_raw_hello(const char *sock, const void *hello, size_t len,
		struct kvp_welcome *w, int *nfds, int timeout_ms)
{
	*nfds = 0;
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(s);
		return -e;
	}
	if (len && send(s, hello, len, MSG_NOSIGNAL) != (ssize_t)len) {
		int e = errno;
		close(s);
		/* The daemon may have hung up already: that is an answer. */
		return e == EPIPE || e == ECONNRESET ? 0 : -e;
	}
	struct pollfd pfd = { .fd = s, .events = POLLIN };
	if (poll(&pfd, 1, timeout_ms) <= 0) {
		close(s);
		return -ETIMEDOUT;
	}
	union {
		char buf[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} cbuf;
	memset(w, 0, sizeof(*w));
	struct iovec iov = { .iov_base = w, .iov_len = sizeof(*w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf.buf,
			     .msg_controllen = sizeof(cbuf.buf) };
	ssize_t got = recvmsg(s, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); got > 0 && cm;
	     cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int nf = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *fdp = (int *)CMSG_DATA(cm);
		for (int i = 0; i < nf; i++)
			close(fdp[i]);
		*nfds += nf;
	}
	close(s);
	if (got < 0)
		return errno == ECONNRESET ? 0 : -errno;
	if (got == 0)
		return 0;
	w->msg[sizeof(w->msg) - 1] = 0;
	return 1;
}

int h_raw_hung_up(struct h_raw *r, int timeout_ms)
{
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		struct pollfd pfd = { .fd = r->sock, .events = POLLIN | POLLRDHUP };
		int64_t left = (int64_t)deadline - (int64_t)h_now_ms();
		int n = poll(&pfd, 1, left < 0 ? 0 : (int)(left > 50 ? 50 : left));
		if (n > 0) {
			if (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR))
				return 1;
			char b[512];
			ssize_t g = recv(r->sock, b, sizeof(b), MSG_DONTWAIT);
			if (g == 0 || (g < 0 && errno != EAGAIN))
				return 1;
		}
		if (left <= 0)
			return 0;
	}
}

/* ------------------------------------------------------------ uds mode */

int h_uds_call(int sock, const struct kvp_sqe *q, struct kvp_cqe *cqe,
	       void *out, size_t out_cap)
{
	unsigned char buf[sizeof(struct kvp_cqe) + 4096];
	struct pollfd p = { .fd = sock, .events = POLLIN };
	ssize_t n;

	if (send(sock, q, sizeof(*q), MSG_NOSIGNAL) != (ssize_t)sizeof(*q))
		return -errno;
	if (poll(&p, 1, 10000) != 1)
		return -ETIMEDOUT;
	n = recv(sock, buf, sizeof(buf), 0);
	if (n < (ssize_t)sizeof(*cqe))
		return n < 0 ? -errno : -EPROTO;
	memcpy(cqe, buf, sizeof(*cqe));
	if (out && (size_t)n - sizeof(*cqe) <= out_cap)
		memcpy(out, buf + sizeof(*cqe), (size_t)n - sizeof(*cqe));
	return 0;
}
