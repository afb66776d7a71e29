/* SPDX-License-Identifier: MIT */
/*
 * client.c - attach to kvpoold and detach; the client's accessors. (The
 * last error and the fork check are error.c's.)
 *
 * Attach is the one place the client takes things from the daemon that it
 * then maps and dereferences, so everything is checked before use: the
 * welcome's size, magic, version and status; the descriptors' number, kind
 * and seals (a memfd not sealed against shrinking could be truncated under
 * the mapping: SIGBUS); the shm's size against the welcome and every offset
 * of its header against that size (overflow-safe); the layout against one
 * recomputed from its five parameters; the device tier's size against its
 * frame count. Only then are the rings used.
 *
 * The device tier is a memfd mapped here on the shm backend; on the cuda
 * backend (welcome.cuda_device >= 0) it is a cuMemCreate allocation that
 * cuda.c imports and maps into the GPU's address space, on the device of
 * this process whose UUID is welcome.cuda_uuid.
 *
 * INHERITED CLIENTS. A client belongs to the process that attached it. A
 * child made by fork() has a copy of the struct, the same rings and arena
 * (MAP_SHARED: the parent's very memory), the same device tier and a copy
 * of the socket; were it to submit or reap, the parent's ring indices would
 * no longer match the rings, its leases could be committed behind its back
 * and its next call would fail blaming the daemon. So the attach records
 * the pid and a fork generation (kvpc_fork_gen, bumped by a pthread_atfork
 * child handler: a load and a compare per call, no system call), and in any
 * other process every call fails with -ECHILD before it touches the rings,
 * the arena, the device tier or a lease. kvp_close() there only unmaps and
 * closes the child's copies: no shutdown of the socket, no CUDA call, so the
 * parent goes on as before. The owner's kvp_close() shuts the socket down
 * first, so that a child still holding a copy of it does not keep the
 * attach (and its leases) alive.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_internal.h"

#define ATTACH_FDS 2   /* shm, device tier */
#define CMSG_FDS 8     /* room to take (and close) a few unexpected ones */

int kvpc_check_hangup(struct kvp_client *c)
{
	struct pollfd p = { .fd = c->sock, .events = POLLIN | POLLRDHUP };

	if (poll(&p, 1, 0) > 0 &&
	    (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)))
		return kvpc_fail(c, -ECONNRESET,
				 "kvpoold at %s went away; the leases of this client are "
				 "gone; reconnect with kvp_connect()", c->path);
	return 0;
}

/* ------------------------------------------------------------ attach */

static int is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/* The async slice of each of sq operation slots (client_internal.h). */
static uint32_t slice_of(uint32_t arena, uint32_t sq)
{
	return (arena / 2 / sq) & ~63u;
}

static int check_opts(struct kvp_client *c, const struct kvp_connect_opts *o)
{
	if (!o)
		return 0;
	if (o->sq_entries && (!is_pow2(o->sq_entries) ||
			      o->sq_entries < KVP_RING_MIN_ENTRIES ||
			      o->sq_entries > KVP_RING_MAX_ENTRIES))
		return kvpc_err(c, -EINVAL,
				"sq_entries %" PRIu32 " must be a power of two from %u to "
				"%u (0: the daemon's default)", o->sq_entries,
				KVP_RING_MIN_ENTRIES, KVP_RING_MAX_ENTRIES);
	if (o->arena_bytes && (o->arena_bytes < KVP_ARENA_MIN_BYTES ||
			       o->arena_bytes > KVP_ARENA_MAX_BYTES))
		return kvpc_err(c, -EINVAL,
				"arena_bytes %" PRIu32 " must be from %u to %u "
				"(0: the daemon's default)", o->arena_bytes,
				KVP_ARENA_MIN_BYTES, KVP_ARENA_MAX_BYTES);
	if (o->sq_entries && o->arena_bytes &&
	    slice_of(o->arena_bytes, o->sq_entries) < KVPC_MIN_SLICE)
		return kvpc_err(c, -EINVAL,
				"arena_bytes %" PRIu32 " is too small for %" PRIu32
				" sq_entries: each needs %u bytes (use arena_bytes >= %"
				PRIu64 ")", o->arena_bytes, o->sq_entries,
				2 * KVPC_MIN_SLICE,
				(uint64_t)o->sq_entries * 2 * KVPC_MIN_SLICE);
	return 0;
}

static int open_socket(struct kvp_client *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = KVPC_ATTACH_TIMEOUT_S };
	int err;

	if (strlen(path) >= sizeof(sa.sun_path))
		return kvpc_err(c, -ENAMETOOLONG,
				"socket path %s is longer than %zu bytes", path,
				sizeof(sa.sun_path) - 1);
	memcpy(c->path, path, strlen(path) + 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);

	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0)
		return kvpc_err(c, -errno, "socket(AF_UNIX): %s", strerror(errno));
	if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		err = errno;
		if (err == ECONNREFUSED || err == ENOENT)
			return kvpc_err(c, -err,
					"no kvpoold listening at %s (connect: %s); start "
					"it with kvpoold --socket=%s", path,
					strerror(err), path);
		if (err == EACCES || err == EPERM)
			return kvpc_err(c, -err,
					"cannot reach %s: %s; the socket directory is for "
					"the service user and the kvpool group", path,
					strerror(err));
		return kvpc_err(c, -err, "cannot connect to kvpoold at %s: %s",
				path, strerror(err));
	}
	/* A daemon that accepts but never answers must not hang the attach. */
	setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(c->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return 0;
}

static int say_hello(struct kvp_client *c, const struct kvp_connect_opts *o)
{
	struct kvp_hello h = {
		.magic = KVP_PROTO_MAGIC,
		.version = KVP_PROTO_VERSION,
		.sq_entries = o ? o->sq_entries : 0,
		.arena_bytes = o ? o->arena_bytes : 0,
		.pool = o ? o->pool : 0,
		.rank = o ? o->rank : 0,
	};
	const char *name = o && o->name ? o->name : program_invocation_short_name;
	ssize_t n;

	if (name)
		strncpy(h.name, name, sizeof(h.name) - 1);
	n = send(c->sock, &h, sizeof(h), MSG_NOSIGNAL);
	if (n < 0)
		return kvpc_err(c, -errno, "cannot send to kvpoold at %s: %s",
				c->path, strerror(errno));
	if ((size_t)n != sizeof(h))
		return kvpc_err(c, -EPROTO, "kvpoold at %s took %zd of %zu hello bytes",
				c->path, n, sizeof(h));
	return 0;
}

/*
 * Receive the welcome and up to ATTACH_FDS descriptors (close-on-exec; any
 * more are closed). Returns 0 with fds[0..*nfds) open, or -errno; the
 * caller closes what was received either way.
 */
static int get_welcome(struct kvp_client *c, struct kvp_welcome *w, int *fds,
		       uint32_t *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * CMSG_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = w, .iov_len = sizeof(*w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm;
	ssize_t n;

	memset(w, 0, sizeof(*w));
	do
		n = recvmsg(c->sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return kvpc_err(c, -ETIMEDOUT,
					"kvpoold at %s did not answer the attach within "
					"%d s", c->path, KVPC_ATTACH_TIMEOUT_S);
		return kvpc_err(c, -errno, "cannot receive from kvpoold at %s: %s",
				c->path, strerror(errno));
	}
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		size_t k, count;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
		    cm->cmsg_len < CMSG_LEN(0))
			continue;
		count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (k = 0; k < count; k++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + k * sizeof(int), sizeof(fd));
			if (*nfds < ATTACH_FDS)
				fds[(*nfds)++] = fd;
			else
				close(fd);
		}
	}
	if (n == 0)
		return kvpc_err(c, -ECONNRESET,
				"kvpoold at %s closed the connection during attach "
				"(see its log)", c->path);
	if (mh.msg_flags & MSG_CTRUNC)
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent more descriptors than an attach has",
				c->path);
	if ((size_t)n < offsetof(struct kvp_welcome, status) ||
	    w->magic != KVP_PROTO_MAGIC)
		return kvpc_err(c, -EPROTO, "%s is not a kvpoold socket (bad welcome)",
				c->path);
	if (w->version != KVP_PROTO_VERSION)
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s speaks wire protocol %" PRIu32 ", this "
				"libkvpool %u; use the libkvpool built with that kvpoold",
				c->path, w->version, KVP_PROTO_VERSION);
	if ((size_t)n != sizeof(*w) || (mh.msg_flags & MSG_TRUNC))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a %zd-byte welcome, expected %zu",
				c->path, n, sizeof(*w));
	w->msg[sizeof(w->msg) - 1] = '\0';
	if (w->status > 0 || w->status < -4095)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent status %" PRId32,
				c->path, w->status);
	if (w->status < 0) {
		if (!w->msg[0])
			return kvpc_err(c, w->status, "kvpoold at %s refused the attach: %s",
					c->path, strerror(-w->status));
		return kvpc_err(c, w->status, "%s", w->msg);
	}
	return 0;
}

static int check_welcome(struct kvp_client *c, const struct kvp_welcome *w,
			 uint32_t nfds)
{
	const int tenant = !!(w->flags & KVP_WELCOME_TENANT);
	const struct kvp_layout *wl = &w->layout;
	struct kvp_layout l;
	char msg[KVP_ERRLEN];

	if (w->nfds != nfds || nfds != (tenant ? 2u : 1u))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent %" PRIu32 " descriptors (welcome says %"
				PRIu32 "), expected %d", c->path, nfds, w->nfds,
				tenant ? 2 : 1);
	/* A client without a tenant has no pool, so maybe no layout either. */
	memset(&l, 0, sizeof(l));
	if ((tenant || memcmp(&l, wl, sizeof(l))) &&
	    (kvp_layout_init(&l, wl->layers, wl->kv_heads, wl->head_dim, wl->dtype,
			     wl->page_tokens, msg, sizeof(msg)) ||
	     memcmp(&l, wl, sizeof(l))))
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent an inconsistent layout",
				c->path);
	if (tenant && (!w->tier_frames[KVP_TIER_DEVICE] ||
		       w->tier_bytes[KVP_TIER_DEVICE] > SIZE_MAX ||
		       w->tier_bytes[KVP_TIER_DEVICE] / l.page_bytes <
		       w->tier_frames[KVP_TIER_DEVICE]))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a device tier of %" PRIu64 " bytes "
				"for %" PRIu32 " frames of %" PRIu64, c->path,
				w->tier_bytes[KVP_TIER_DEVICE],
				w->tier_frames[KVP_TIER_DEVICE], l.page_bytes);
	if (w->tp < 1 || w->tp > 8 || w->rank >= w->tp)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent rank %" PRIu32 " of %"
				PRIu32 " ranks", c->path, w->rank, w->tp);
	c->tp = w->tp;
	c->rank = w->rank;
	c->client_id = w->client_id;
	c->flags = w->flags;
	memcpy(c->tenant, w->tenant, sizeof(c->tenant));
	c->tenant[sizeof(c->tenant) - 1] = '\0';
	memcpy(c->backend, w->backend, sizeof(c->backend));
	c->backend[sizeof(c->backend) - 1] = '\0';
	c->layout = l;
	memcpy(c->tier_bytes, w->tier_bytes, sizeof(c->tier_bytes));
	memcpy(c->tier_frames, w->tier_frames, sizeof(c->tier_frames));
	return 0;
}

/* fstat + seals: fd must be a memfd sealed against grow and shrink, of at
 * least min bytes. Returns its size or -errno. */
static int64_t sealed_size(struct kvp_client *c, int fd, const char *what,
			   uint64_t min)
{
	struct stat st;
	int seals;

	if (fstat(fd, &st) < 0)
		return kvpc_err(c, -errno, "fstat of the %s: %s", what, strerror(errno));
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
			 (F_SEAL_SHRINK | F_SEAL_GROW))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a %s that is not sealed against "
				"resizing; refusing to map it", c->path, what);
	if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size < min ||
	    (uint64_t)st.st_size > SIZE_MAX)
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a %s of %lld bytes, expected %" PRIu64,
				c->path, what, (long long)st.st_size, min);
	return st.st_size;
}

/* off/size within total, overflow-safe, 64-byte aligned, not before min. */
static int region_ok(uint64_t off, uint64_t size, uint64_t total, uint64_t min)
{
	return !(off & 63) && off >= min && size <= total && off <= total - size;
}

static int check_hdr(struct kvp_client *c, const struct kvp_shm_hdr *h,
		     uint64_t total)
{
	const uint64_t sq_size = (uint64_t)h->sq_entries * sizeof(struct kvp_sqe);
	const uint64_t cq_size = (uint64_t)h->cq_entries * sizeof(struct kvp_cqe);

	if (h->magic != KVP_PROTO_MAGIC || h->version != KVP_PROTO_VERSION ||
	    h->client_id != c->client_id || h->total_bytes != total ||
	    h->lanes < 1 || h->lanes > KVP_LANES_MAX || (h->lane_bytes & 63) ||
	    h->lane_bytes < h->cq_off + cq_size - h->ctl_off ||
	    !is_pow2(h->sq_entries) || h->sq_entries < KVP_RING_MIN_ENTRIES ||
	    !is_pow2(h->cq_entries) || h->cq_entries < h->sq_entries ||
	    h->cq_entries > KVP_RING_MAX_ENTRIES ||
	    h->arena_bytes < KVP_ARENA_MIN_BYTES ||
	    h->arena_bytes > KVP_ARENA_MAX_BYTES ||
	    !region_ok(h->ctl_off, sizeof(struct kvp_ring_ctl), total, sizeof(*h)) ||
	    !region_ok(h->sq_off, sq_size, total, h->ctl_off + sizeof(struct kvp_ring_ctl)) ||
	    !region_ok(h->cq_off, cq_size, total, h->sq_off + sq_size) ||
	    !region_ok(h->arena_off, h->arena_bytes, total,
		       h->ctl_off + h->lanes * h->lane_bytes))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a ring header that does not fit its "
				"%" PRIu64 "-byte shm", c->path, total);
	return 0;
}

static int map_shm(struct kvp_client *c, int fd, uint64_t expect)
{
	struct kvp_shm_hdr h;
	int64_t size;
	void *p;
	int ret;

	size = sealed_size(c, fd, "ring memfd", sizeof(h));
	if (size < 0)
		return (int)size;
	if ((uint64_t)size != expect)
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s sent a %" PRId64 "-byte ring memfd, the "
				"welcome says %" PRIu64, c->path, size, expect);
	p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return kvpc_err(c, -errno, "mmap of %" PRId64 " ring bytes: %s",
				size, strerror(errno));
	c->shm = p;
	c->shm_bytes = (size_t)size;

	/* Read the header once; only the checked copy is used. */
	memcpy(&h, p, sizeof(h));
	ret = check_hdr(c, &h, (uint64_t)size);
	if (ret)
		return ret;
	c->lanes = calloc(h.lanes, sizeof(*c->lanes));
	if (!c->lanes)
		return kvpc_err(c, -ENOMEM, "out of memory for %" PRIu32 " lanes",
				h.lanes);
	c->nlanes = h.lanes;
	c->arena = (unsigned char *)p + h.arena_off;
	c->sq_entries = h.sq_entries;
	c->sq_mask = h.sq_entries - 1;
	c->cq_entries = h.cq_entries;
	c->cq_mask = h.cq_entries - 1;
	c->arena_bytes = h.arena_bytes;

	/*
	 * The rings start empty at whatever index the daemon chose. It wrote
	 * them before sending the fd, so sendmsg/recvmsg order them for us;
	 * from here on only our own copies of sq_tail and cq_head count.
	 */
	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];
		char *at = (char *)p + k * h.lane_bytes;

		l->ctl = (struct kvp_ring_ctl *)(at + h.ctl_off);
		l->sqes = (struct kvp_sqe *)(at + h.sq_off);
		l->cqes = (struct kvp_cqe *)(at + h.cq_off);
		l->sq_tail = __atomic_load_n(&l->ctl->sq_tail, __ATOMIC_RELAXED);
		l->sq_published = l->sq_tail;
		l->cq_head = __atomic_load_n(&l->ctl->cq_head, __ATOMIC_RELAXED);
		l->cq_released = l->cq_ready_to = l->cq_head;
		l->sq_head_seen = l->sq_tail;
		if (__atomic_load_n(&l->ctl->sq_head, __ATOMIC_RELAXED) != l->sq_tail ||
		    __atomic_load_n(&l->ctl->cq_tail, __ATOMIC_RELAXED) != l->cq_head)
			return kvpc_err(c, -EPROTO, "kvpoold at %s handed over rings "
					"that are not empty", c->path);
	}
	return 0;
}

static int map_device(struct kvp_client *c, int *fd, int32_t cuda_device,
		      const uint8_t cuda_uuid[16])
{
	const uint64_t bytes = c->tier_bytes[KVP_TIER_DEVICE];
	int64_t size;
	void *p;

	/* A GPU pool: a cuMem handle for cuda.c to import. (A daemon that
	 * says shm is believed whatever else its welcome holds.) */
	if (cuda_device >= 0 && strcmp(c->backend, "shm"))
		return kvpc_cuda_attach(c, fd, cuda_device, cuda_uuid);
	if (strcmp(c->backend, "shm"))
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s serves a '%s' pool on no CUDA device; this "
				"libkvpool maps shm and cuda pools", c->path, c->backend);
	size = sealed_size(c, *fd, "device tier", bytes);
	if (size < 0)
		return (int)size;
	p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (p == MAP_FAILED)
		return kvpc_err(c, -errno, "mmap of the %" PRIu64 "-byte device tier: %s",
				bytes, strerror(errno));
	c->device = p;
	c->device_bytes = (size_t)bytes;
	return 0;
}

static int setup_slots(struct kvp_client *c)
{
	c->slice_bytes = slice_of(c->arena_bytes, c->sq_entries);
	if (c->slice_bytes < KVPC_MIN_SLICE)
		return kvpc_err(c, -EINVAL,
				"an arena of %" PRIu32 " bytes is too small for %" PRIu32
				" sq_entries: each needs %u bytes (ask for arena_bytes >= %"
				PRIu64 " or fewer sq_entries)", c->arena_bytes,
				c->sq_entries, 2 * KVPC_MIN_SLICE,
				(uint64_t)c->sq_entries * 2 * KVPC_MIN_SLICE);
	c->sync_off = c->sq_entries * c->slice_bytes;
	c->sync_bytes = c->arena_bytes - c->sync_off;
	c->slots = calloc(c->sq_entries, sizeof(*c->slots));
	c->free_slots = calloc(c->sq_entries, sizeof(*c->free_slots));
	if (!c->slots || !c->free_slots)
		return kvpc_err(c, -ENOMEM, "out of memory for %" PRIu32 " slots",
				c->sq_entries);
	for (uint32_t i = 0; i < c->sq_entries; i++)
		c->free_slots[i] = i;
	c->free_head = 0;
	c->free_tail = c->sq_entries;
	return kvpc_batch_setup(c);
}

/* Users -> lanes (proto.h, LANES): the pool's shard count. */
static int set_shards(struct kvp_client *c, const struct kvp_welcome *w)
{
	if (w->shards < 1 || w->shards > 128)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent %" PRIu32 " shards "
				"(1 to 128); reconnect", c->path, w->shards);
	c->shards = w->shards;
	return 0;
}

static const char *socket_path(const struct kvp_connect_opts *o)
{
	const char *env;

	if (o && o->socket && *o->socket)
		return o->socket;
	env = secure_getenv("KVPOOL_SOCKET");
	return env && *env ? env : KVP_DEFAULT_SOCKET;
}

static int attach(struct kvp_client *c, const struct kvp_connect_opts *o,
		  int *fds, uint32_t *nfds)
{
	const struct timeval none = { 0 };
	struct kvp_welcome w;
	int ret;

	c->spin_us = o && o->spin_us ? o->spin_us : KVPC_DEFAULT_SPIN_US;
	if ((ret = check_opts(c, o)) ||
	    (ret = open_socket(c, socket_path(o))) ||
	    (ret = say_hello(c, o)) ||
	    (ret = get_welcome(c, &w, fds, nfds)) ||
	    (ret = check_welcome(c, &w, *nfds)) ||
	    (ret = map_shm(c, fds[0], w.shm_bytes)) ||
	    (ret = set_shards(c, &w)) ||
	    (*nfds > 1 && (ret = map_device(c, &fds[1], w.cuda_device,
					    w.cuda_uuid))) ||
	    (ret = setup_slots(c)))
		return ret;
	setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
	setsockopt(c->sock, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
	return 0;
}

KVP_PUBLIC
int kvp_connect(struct kvp_client **out, const struct kvp_connect_opts *opts,
		char *err, size_t errlen)
{
	int fds[ATTACH_FDS] = { -1, -1 };
	struct kvp_client *c;
	uint32_t nfds = 0;
	int ret;

	if (err && errlen)
		err[0] = '\0';
	if (!out) {
		if (err && errlen)
			snprintf(err, errlen, "kvp_connect: out is NULL");
		return -EINVAL;
	}
	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c) {
		if (err && errlen)
			snprintf(err, errlen, "kvp_connect: out of memory");
		return -ENOMEM;
	}
	c->sock = -1;
	c->device_fd = -1;
	c->cuda_device = -1;
	kvpc_fork_watch();
	c->pid = getpid();
	c->fork_gen = __atomic_load_n(&kvpc_fork_gen, __ATOMIC_RELAXED);

	ret = attach(c, opts, fds, &nfds);
	for (uint32_t i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (ret) {
		if (err && errlen)
			snprintf(err, errlen, "%s", c->err);
		kvp_close(c);
		return ret;
	}
	c->err[0] = '\0';
	*out = c;
	return 0;
}

KVP_PUBLIC
void kvp_close(struct kvp_client *c)
{
	int child;

	if (!c)
		return;
	/* A child closing what it inherited unmaps its own copies and closes
	 * its own descriptor: the attach, the rings and the GPU mapping stay
	 * the parent's (INHERITED CLIENTS). Its cuda state is left, not freed
	 * through a CUDA context that fork() did not carry over. */
	child = kvpc_is_inherited(c);
	/* The daemon sees the hang-up and releases every lease we hold; on a
	 * GPU every append must have landed before (cuda.c waits). */
	if (c->cuda && !child)
		kvpc_cuda_detach(c);
	else if (c->device && !c->cuda)
		munmap(c->device, c->device_bytes);
	if (c->shm)
		munmap(c->shm, c->shm_bytes);
	if (c->device_fd >= 0)
		close(c->device_fd);
	if (c->sock >= 0) {
		/* A child may hold a copy of the socket: the hang-up must
		 * reach the daemon now, not when the last copy goes. */
		if (!child)
			shutdown(c->sock, SHUT_RDWR);
		close(c->sock);
	}
	kvpc_batch_free(c);
	free(c->lanes);
	free(c->slots);
	free(c->free_slots);
	free(c->scratch);
	free(c->recs);
	kvpc_lease_table_free(c);
	free(c);
}

/* ------------------------------------------------------------ accessors */

KVP_PUBLIC
const char *kvp_last_error(const struct kvp_client *c)
{
	return c ? c->err : "no client (kvp_connect failed?)";
}

_Static_assert(sizeof(struct kvp_error_info) == KVP_ERROR_INFO_SIZE_VER0,
	       "kvp_error_info 0.2 layout");

KVP_PUBLIC
int kvp_last_error_info_sz(const struct kvp_client *c, struct kvp_error_info *out,
			   size_t size)
{
	static const struct kvp_error_info none;

	/* No message on a bad argument: it would replace the one asked about. */
	if (!out || size < KVP_ERROR_INFO_SIZE_VER0 || size % 8 || size > UINT32_MAX)
		return -EINVAL;
	kvpc_rows_put(out, size, c ? &c->errinfo : &none, sizeof(*out), 1);
	return 0;
}

KVP_PUBLIC
const struct kvp_layout *kvp_client_layout(const struct kvp_client *c)
{
	return &c->layout;
}

KVP_PUBLIC
void *kvp_device_base(const struct kvp_client *c)
{
	return c->device;
}

KVP_PUBLIC
uint32_t kvp_device_frames(const struct kvp_client *c)
{
	return c->device ? c->tier_frames[KVP_TIER_DEVICE] : 0;
}

KVP_PUBLIC
int kvp_cuda_device(const struct kvp_client *c)
{
	return c->cuda ? c->cuda_device : -1;
}

KVP_PUBLIC
uint32_t kvp_client_id(const struct kvp_client *c)
{
	return c->client_id;
}

KVP_PUBLIC
uint32_t kvp_client_tp(const struct kvp_client *c)
{
	return c->tp;
}

KVP_PUBLIC
uint32_t kvp_client_rank(const struct kvp_client *c)
{
	return c->rank;
}

KVP_PUBLIC
int kvp_client_is_admin(const struct kvp_client *c)
{
	return !!(c->flags & KVP_WELCOME_ADMIN);
}
