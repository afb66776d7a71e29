/* SPDX-License-Identifier: MIT */
/*
 * listener.c - kvpoold's socket.
 *
 * Startup guarantees one daemon per socket path: an flock on PATH.lock
 * (held for the daemon's life, released by the kernel if it dies) and a
 * connect probe (in case a daemon without the lock serves PATH). A socket
 * file nobody answers on is stale and removed.
 *
 * A connection is judged at accept (SO_PEERCRED, SO_PEERGROUPS), but
 * answered when its kvp_hello arrives, so a refused client reads a welcome
 * with the reason instead of a reset on its first send. Nothing here blocks:
 * sockets are non-blocking and a peer that stops reading is detached.
 *
 * Anyone who can reach the socket can connect, admitted or not, so what a
 * connection costs before its hello is bounded (issue 11): one descriptor
 * each (the pidfd comes at attach), at most max_pending of them and
 * max_pending_per_uid from one uid, each closed hello_timeout_ms after its
 * accept. Attached ones are capped per uid and per tenant at the hello
 * (max_clients_per_uid, max_clients_per_tenant: tenant_attach_check), so
 * none can hold every descriptor. Accepting goes back to the event loop
 * after ACCEPT_BATCH connections, and when descriptors run out (EMFILE) it
 * sheds the newest pending connection, or with none, stops accepting for
 * ACCEPT_PAUSE_MS: never a loop that only a quiet attacker would end.
 *
 * A uds request is read here and run by the client's worker (worker.c), in
 * the order of the client's ring.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvpool_engine.h"
#include "client.h"
#include "listener.h"
#include "log.h"
#include "sd_service.h"
#include "worker.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; older kernels answer ENOPROTOOPT */
#endif

#define PEER_GROUPS_MAX 256
#define ACCEPT_BATCH 64     /* connections per wake-up, then the loop again */
#define ACCEPT_PAUSE_MS 100 /* no descriptor to accept with: wait this long */

/* ------------------------------------------------------------ startup */

/*
 * The directories above path that do not exist, made 0755 (a path is no
 * secret); the socket's own directory, when made here, is shaped like the
 * socket: its group socket_group's (when set), 0750, and traversable by
 * others too when socket_mode lets others connect. A directory that is
 * there already is left as its owner made it.
 */
static int mkdir_one(const char *dir, mode_t mode, int64_t gid, struct errbuf *e)
{
	if (mkdir(dir, mode) < 0) {
		if (errno == EEXIST)
			return 0;
		return errbuf_set(e, -errno, "socket directory %s: cannot create: %s",
				  dir, strerror(errno));
	}
	/* chmod: the umask took bits from mkdir's mode. */
	if (chmod(dir, mode) < 0 ||
	    (gid >= 0 && chown(dir, (uid_t)-1, (gid_t)gid) < 0))
		return errbuf_set(e, -errno, "socket directory %s: cannot set its "
				  "group %" PRId64 " and mode %04o: %s", dir, gid,
				  (unsigned)mode, strerror(errno));
	log_info("created socket directory %s (mode %04o%s)", dir, (unsigned)mode,
		 gid >= 0 ? ", group socket_group" : "");
	return 0;
}

static int mkdir_parents(const char *path, mode_t mode, int64_t gid,
			 struct errbuf *e)
{
	char *copy = strdup(path), *dir;
	struct stat st;
	int ret = 0;

	if (!copy)
		return errbuf_set(e, -ENOMEM, "out of memory");
	dir = dirname(copy);
	if (stat(dir, &st) == 0)
		goto out;
	ret = mkdir_parents(dir, 0755, -1, e);
	if (!ret)
		ret = mkdir_one(dir, mode, gid, e);
out:
	free(copy);
	return ret;
}

static int fill_addr(struct sockaddr_un *sa, const char *path)
{
	*sa = (struct sockaddr_un){ .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memcpy(sa->sun_path, path, strlen(path) + 1);
	return 0;
}

static int in_use(const char *path, struct errbuf *e)
{
	return errbuf_set(e, -EADDRINUSE, "another kvpoold is serving %s; stop it "
			  "first or choose another --socket", path);
}

/* Is someone answering on path? Remove the file if it is a dead socket. */
static int probe_existing(const char *path, struct errbuf *e)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, ret;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 :
		       errbuf_set(e, -errno, "socket %s: %s", path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return errbuf_set(e, -EEXIST, "socket %s exists and is not a socket; "
				  "remove it or choose another --socket", path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errbuf_set(e, -errno, "socket: %s", strerror(errno));
	fill_addr(&sa, path);
	ret = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : -errno;
	close(fd);
	if (ret == 0 || ret == -EPROTOTYPE || ret == -EAGAIN)
		return in_use(path, e); /* alive (EPROTOTYPE: a stream server) */
	if (ret != -ECONNREFUSED)
		return errbuf_set(e, ret, "socket %s: cannot probe it: %s", path,
				  strerror(-ret));
	if (unlink(path) < 0 && errno != ENOENT)
		return errbuf_set(e, -errno, "stale socket %s: cannot remove it: %s",
				  path, strerror(errno));
	log_info("removed stale socket %s (no daemon answered)", path);
	return 0;
}

static int take_lock(struct listener *l, const char *path, struct errbuf *e)
{
	if (asprintf(&l->lock_path, "%s.lock", path) < 0) {
		l->lock_path = NULL;
		return errbuf_set(e, -ENOMEM, "out of memory");
	}
	l->lock_fd = open(l->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (l->lock_fd < 0)
		return errbuf_set(e, -errno, "lock file %s: %s", l->lock_path,
				  strerror(errno));
	if (flock(l->lock_fd, LOCK_EX | LOCK_NB) < 0)
		return errno == EWOULDBLOCK ? in_use(path, e) :
		       errbuf_set(e, -errno, "lock file %s: flock: %s",
				  l->lock_path, strerror(errno));
	l->locked = true;
	return 0;
}

static int bind_listen(struct listener *l, const struct config *cfg,
		       struct errbuf *e)
{
	struct sockaddr_un sa;
	mode_t old;
	int ret;

	l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l->fd < 0)
		return errbuf_set(e, -errno, "socket: %s", strerror(errno));
	fill_addr(&sa, cfg->socket);
	/* No window in which the socket is more open than socket_mode. */
	old = umask(0177);
	ret = bind(l->fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (ret < 0)
		return errbuf_set(e, -errno, "bind %s: %s", cfg->socket, strerror(errno));
	l->bound = true;
	if (cfg->socket_gid >= 0 && chown(cfg->socket, (uid_t)-1, (gid_t)cfg->socket_gid) < 0)
		return errbuf_set(e, -errno, "socket_group: chown %s to gid %" PRId64
				  ": %s", cfg->socket, cfg->socket_gid, strerror(errno));
	if (chmod(cfg->socket, cfg->socket_mode) < 0)
		return errbuf_set(e, -errno, "socket_mode: chmod %s to %04o: %s",
				  cfg->socket, cfg->socket_mode, strerror(errno));
	if (listen(l->fd, 128) < 0)
		return errbuf_set(e, -errno, "listen %s: %s", cfg->socket, strerror(errno));
	return 0;
}

int listener_open(struct listener *l, const struct config *cfg,
		  struct errbuf *e)
{
	int ret;

	*l = (struct listener){ .fd = -1, .lock_fd = -1, .spare_fd = -1,
				.w = { WATCH_LISTEN } };
	/* Socket activation (kvpoold.socket): systemd made the socket, owns
	 * its file and keeps it while we restart; no lock, nothing to unlink. */
	ret = sd_service_listen_fd(cfg->socket, e);
	if (ret >= 0) {
		l->fd = ret;
		l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		log_info("listening on %s, passed by the service manager", cfg->socket);
		return 0;
	}
	if (ret != -ENOENT)
		return ret;
	ret = mkdir_parents(cfg->socket,
			    0750 | ((cfg->socket_mode & 0006) ? 0005 : 0),
			    cfg->socket_gid, e);
	ret = ret ? ret : take_lock(l, cfg->socket, e);
	ret = ret ? ret : probe_existing(cfg->socket, e);
	ret = ret ? ret : bind_listen(l, cfg, e);
	if (!ret)
		l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (ret)
		listener_close(l, cfg);
	return ret;
}

void listener_close(struct listener *l, const struct config *cfg)
{
	if (l->fd >= 0)
		close(l->fd);
	if (l->bound)
		unlink(cfg->socket);
	/* Unlink the lock while still holding it: a newcomer that opened the
	 * old file gets its lock only after we are gone. */
	if (l->locked)
		unlink(l->lock_path);
	if (l->lock_fd >= 0)
		close(l->lock_fd);
	if (l->spare_fd >= 0)
		close(l->spare_fd);
	free(l->lock_path);
	*l = (struct listener){ .fd = -1, .lock_fd = -1, .spare_fd = -1 };
}

/* ------------------------------------------------------------ accept */

/* Credentials as the kernel saw them at connect(); gids[0] is the primary. */
static uint32_t peer_creds(struct client *c, uint32_t *gids)
{
	gid_t groups[PEER_GROUPS_MAX];
	struct ucred uc = { 0 };
	socklen_t len = sizeof(uc);
	uint32_t n = 1;

	/* Without credentials uid stays UINT32_MAX, which nothing allows. */
	c->uid = c->gid = UINT32_MAX;
	if (getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0 ||
	    len != sizeof(uc)) {
		log_warn("SO_PEERCRED: %s", strerror(errno));
		return 0;
	}
	c->pid = (uint32_t)uc.pid;
	c->uid = (uint32_t)uc.uid;
	c->gid = (uint32_t)uc.gid;
	gids[0] = c->gid;
	len = sizeof(groups);
	if (getsockopt(c->sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
		for (uint32_t i = 0; i < len / sizeof(gid_t) && n < PEER_GROUPS_MAX + 1; i++)
			gids[n++] = groups[i];
	return n;
}

/* The peer's process as a pidfd: race-free from the socket where the
 * kernel has SO_PEERPIDFD, else by pid. */
static int peer_pidfd(struct client *c)
{
	socklen_t len = sizeof(int);
	int fd = -1;

	if (getsockopt(c->sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0)
		return fd;
#ifdef SYS_pidfd_open
	if (c->pid)
		return (int)syscall(SYS_pidfd_open, (pid_t)c->pid, 0);
#endif
	return -1;
}

/* Pending connections of uid (the list is at most max_pending long). */
static uint32_t pending_of_uid(const struct server *s, uint32_t uid)
{
	uint32_t n = 0;

	for (const struct client *c = s->pending; c; c = c->next)
		n += c->uid == uid;
	return n;
}

static void refuse(struct server *s, struct client *c, int status,
		   const char *msg);

/* Whether one more pending connection of c's uid fits the caps; if not, c
 * is refused and closed before it costs anything more (the welcome is for a
 * client that reads before it sends; libkvpool sees the hang-up). */
static bool pending_fits(struct server *s, struct client *c)
{
	const struct config *cfg = s->cfg;
	char msg[KVP_ERRLEN];

	/* c is on the list already: more than the cap means over it. */
	if (s->npending > cfg->max_pending)
		snprintf(msg, sizeof(msg), "kvpoold has %" PRIu32 " connections "
			 "waiting for their hello (max_pending); try again, or raise "
			 "max_pending", cfg->max_pending);
	else if (pending_of_uid(s, c->uid) > cfg->max_pending_per_uid)
		snprintf(msg, sizeof(msg), "uid %" PRIu32 " has %" PRIu32 " connections "
			 "waiting for their hello (max_pending_per_uid); send a hello "
			 "on them or close them", c->uid, cfg->max_pending_per_uid);
	else
		return true;
	refuse(s, c, -EAGAIN, msg);
	return false;
}

static void accept_one(struct server *s, int fd)
{
	uint32_t gids[PEER_GROUPS_MAX + 1], ngids;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
	struct client *c = client_new(s, fd);

	if (!c) {
		log_err("accept: out of memory for a client; closing the connection");
		close(fd);
		return;
	}
	c->accepted_ms = log_now_ms();
	ngids = peer_creds(c, gids);
	if (!pending_fits(s, c))
		return;
	if (c->uid == UINT32_MAX) {
		c->adm.allowed = false; /* no credentials, no entry */
		snprintf(c->adm.msg, sizeof(c->adm.msg), "kvpoold could not read "
			 "the peer's credentials");
	} else {
		tenant_admit(&s->tenants, s->cfg, c->uid, gids, ngids, &c->adm);
	}
	ev.data.ptr = &c->sock_w;
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		log_err("epoll_ctl(client socket): %s", strerror(errno));
		client_finalize(s, c);
		return;
	}
	c->watched = true;
}

/* Stop watching the listener until ms from now (listener_tick resumes). */
static void accept_pause(struct server *s, const char *why)
{
	struct listener *l = &s->lis;
	struct epoll_event ev = { .events = 0, .data.ptr = &l->w };

	if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, l->fd, &ev) < 0)
		return; /* still watched: the next wake-up tries again */
	l->paused_until_ms = log_now_ms() + ACCEPT_PAUSE_MS;
	log_err("accept: %s; not accepting for %d ms (raise the descriptor limit, "
		"or lower max_pending)", why, ACCEPT_PAUSE_MS);
}

/* Out of descriptors: give one back. The newest pending connection goes
 * (the oldest are nearest their timeout, and a flood's newest are its
 * own); without one, the spare accepts and drops a connection, so the
 * level-triggered listener does not fire again at once. */
static void accept_emfile(struct server *s, int err)
{
	struct listener *l = &s->lis;
	struct client *c = s->pending;
	int fd;

	if (c) {
		log_warn("accept: %s; closed the newest connection waiting for its "
			 "hello (uid %" PRIu32 " pid %" PRIu32 ") to make room (raise "
			 "the descriptor limit, or lower max_pending)", strerror(err),
			 c->uid, c->pid);
		client_finalize(s, c);
		return;
	}
	if (l->spare_fd < 0) {
		accept_pause(s, strerror(err));
		return;
	}
	close(l->spare_fd);
	fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0)
		close(fd);
	l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	log_err("accept: %s and no connection waiting for its hello; refused a "
		"connection (raise the descriptor limit)", strerror(err));
}

void listener_accept(struct server *s)
{
	struct listener *l = &s->lis;

	for (int n = 0; n < ACCEPT_BATCH; n++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd >= 0) {
			accept_one(s, fd);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EAGAIN)
			return;
		if (errno == EMFILE || errno == ENFILE)
			accept_emfile(s, errno);
		else if (errno == ENOBUFS || errno == ENOMEM)
			accept_pause(s, strerror(errno));
		else
			log_err("accept: %s", strerror(errno));
		/* Back to the loop: signals and hellos come first. */
		return;
	}
}

int listener_tick(struct server *s, uint64_t now_ms)
{
	struct listener *l = &s->lis;
	uint64_t next = UINT64_MAX, limit = s->cfg->hello_timeout_ms;
	struct client *c, *older;

	if (l->paused_until_ms && now_ms >= l->paused_until_ms) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &l->w };

		if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, l->fd, &ev) == 0)
			l->paused_until_ms = 0;
	}
	if (l->paused_until_ms)
		next = l->paused_until_ms - now_ms;
	for (c = s->pending; c; c = older) {
		uint64_t age = now_ms > c->accepted_ms ? now_ms - c->accepted_ms : 0;

		older = c->next;
		if (age < limit) {
			next = limit - age < next ? limit - age : next;
			continue;
		}
		log_warn("uid %" PRIu32 " pid %" PRIu32 ": no hello within %" PRIu64
			 " ms (hello_timeout_ms); closed the connection", c->uid,
			 c->pid, limit);
		client_finalize(s, c);
	}
	return next == UINT64_MAX ? -1 : (int)(next > INT32_MAX ? INT32_MAX : next);
}

/* ------------------------------------------------------------ hang-up */

void listener_hangup(struct server *s, struct client *c, const char *why)
{
	if (c->freed)
		return;
	/* Level-triggered hang-ups would fire again on every epoll_wait. */
	client_unwatch(s, c);
	switch (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE)) {
	case CLIENT_HELLO:
		client_finalize(s, c);
		break;
	case CLIENT_LIVE:
		/* The workers must let go of the rings before the leases go. */
		if (client_begin_detach(c, why))
			worker_kick_client(c);
		break;
	default:
		break; /* already on its way out */
	}
}

/* ------------------------------------------------------------ handshake */

static int send_welcome(struct client *c, const struct kvp_welcome *w,
			const int *fds, uint32_t nfds)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(2 * sizeof(int))];
	} u;
	struct iovec iov = { .iov_base = (void *)w, .iov_len = sizeof(*w) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	memset(&u, 0, sizeof(u));
	if (nfds) {
		struct cmsghdr *cm;

		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	n = sendmsg(c->sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (n < 0)
		return -errno;
	return n == (ssize_t)sizeof(*w) ? 0 : -EIO;
}

static void welcome_init(struct kvp_welcome *w, int status, const char *msg)
{
	*w = (struct kvp_welcome){ .magic = KVP_PROTO_MAGIC,
				   .version = KVP_PROTO_VERSION, .status = status };
	snprintf(w->msg, sizeof(w->msg), "%s", msg);
}

/* Answer a refused hello with the reason, then drop the connection. */
static void refuse(struct server *s, struct client *c, int status, const char *msg)
{
	struct kvp_welcome w;

	welcome_init(&w, status, msg);
	send_welcome(c, &w, NULL, 0);
	log_warn("refused uid %" PRIu32 " gid %" PRIu32 " pid %" PRIu32 ": %s",
		 c->uid, c->gid, c->pid, msg);
	client_finalize(s, c);
}

static bool pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

#define RINGS_MAX_BYTES (64ull << 20) /* a client's rings, all lanes */

/* Validate the hello; fill the ring geometry with defaults applied. */
int hello_check(const struct config *cfg, const struct kvp_hello *h,
		ssize_t len, uint32_t geo[3], struct errbuf *e)
{
	uint32_t sq = h->sq_entries ? h->sq_entries : cfg->sq_entries, cq, arena;
	uint64_t rings;

	if (len < (ssize_t)(sizeof(h->magic) + sizeof(h->version)) ||
	    h->magic != KVP_PROTO_MAGIC)
		return errbuf_set(e, -EPROTO, "not a libkvpool hello (%zd bytes, bad "
				  "magic); is this a kvpool client?", len);
	if (h->version != KVP_PROTO_VERSION)
		return errbuf_set(e, -EPROTO, "libkvpool protocol %" PRIu32 ", kvpoold "
				  "speaks %d; use the libkvpool that came with this "
				  "kvpoold", h->version, KVP_PROTO_VERSION);
	if (len != (ssize_t)sizeof(*h))
		return errbuf_set(e, -EPROTO, "hello of %zd bytes, protocol %d's is "
				  "%zu", len, KVP_PROTO_VERSION, sizeof(*h));
	if (!pow2(sq) || sq < KVP_RING_MIN_ENTRIES || sq > KVP_RING_MAX_ENTRIES)
		return errbuf_set(e, -EINVAL, "sq_entries %" PRIu32 ": use a power of "
				  "two from %u to %u", sq, KVP_RING_MIN_ENTRIES,
				  KVP_RING_MAX_ENTRIES);
	cq = h->cq_entries ? h->cq_entries : 2 * sq;
	if (!pow2(cq) || cq < sq || cq > 2 * KVP_RING_MAX_ENTRIES)
		return errbuf_set(e, -EINVAL, "cq_entries %" PRIu32 ": use a power of "
				  "two from sq_entries (%" PRIu32 ") to %u", cq, sq,
				  2 * KVP_RING_MAX_ENTRIES);
	/* Every lane (one per worker) gets rings this size: bound their sum,
	 * or a client asking for the largest rings of a daemon with many
	 * workers would cost half a GiB. */
	rings = (uint64_t)cfg->workers * ((uint64_t)sq * sizeof(struct kvp_sqe) +
					  (uint64_t)cq * sizeof(struct kvp_cqe));
	if (rings > RINGS_MAX_BYTES)
		return errbuf_set(e, -EINVAL, "sq_entries %" PRIu32 " and cq_entries %"
				  PRIu32 " on %" PRIu32 " lanes (one per worker) are %"
				  PRIu64 " MiB of rings, more than %llu MiB: ask for "
				  "fewer entries", sq, cq, cfg->workers, rings >> 20,
				  RINGS_MAX_BYTES >> 20);
	arena = h->arena_bytes ? h->arena_bytes : cfg->arena_bytes;
	if (arena < KVP_ARENA_MIN_BYTES || arena > KVP_ARENA_MAX_BYTES)
		return errbuf_set(e, -EINVAL, "arena_bytes %" PRIu32 ": use %u to %u",
				  arena, KVP_ARENA_MIN_BYTES, KVP_ARENA_MAX_BYTES);
	if (h->pool >= config_npools(cfg)) {
		char devs[DEVICES_MAX * 6];

		config_devices_format(cfg, devs, sizeof(devs));
		if (config_npools(cfg) == 1)
			return errbuf_set(e, -EINVAL, "pool %" PRIu32 ": this kvpoold "
					  "serves pool 0 only (devices %s)", h->pool,
					  devs);
		return errbuf_set(e, -EINVAL, "pool %" PRIu32 ": this kvpoold serves "
				  "pools 0 to %" PRIu32 " (devices %s)", h->pool,
				  config_npools(cfg) - 1, devs);
	}
	if (h->rank && cfg->tp <= 1)
		return errbuf_set(e, -EINVAL, "rank %" PRIu32 ": pool %" PRIu32 " is "
				  "not tensor-parallel (kvpoold's tp = 1); attach "
				  "with rank 0, or set tp in kvpool.conf", h->rank,
				  h->pool);
	if (h->rank >= cfg->tp)
		return errbuf_set(e, -EINVAL, "rank %" PRIu32 ": pool %" PRIu32 " is "
				  "tensor-parallel over %" PRIu32 " GPUs: ranks 0 to %"
				  PRIu32, h->rank, h->pool, cfg->tp, cfg->tp - 1);
	geo[0] = sq;
	geo[1] = cq;
	geo[2] = arena;
	return 0;
}

/* The program name from the hello, printable and NUL-terminated. */
static void copy_name(char dst[32], const char src[32])
{
	for (int i = 0; i < 31; i++)
		dst[i] = src[i] && (src[i] < 0x20 || src[i] > 0x7e) ? '?' : src[i];
	dst[31] = '\0';
}

/* A tensor-parallel rank's layout: the model's with kv_heads / tp (config
 * checked that tp divides it). */
static void rank_layout(struct kvp_layout *l, uint32_t tp)
{
	struct kvp_layout r;

	if (!kvp_layout_init(&r, l->layers, l->kv_heads / tp, l->head_dim,
			     l->dtype, l->page_tokens, NULL, 0))
		*l = r;
}

static void welcome_fill(struct server *s, struct client *c, struct kvp_welcome *w,
			 int fds[2])
{
	struct tenant_pool *tp;
	void *be_ctx = NULL;

	welcome_init(w, 0, "");
	w->client_id = c->id;
	w->flags = (c->admin ? KVP_WELCOME_ADMIN : 0) |
		   (c->tenant ? KVP_WELCOME_TENANT : 0);
	snprintf(w->backend, sizeof(w->backend), "%s", s->tenants.backend);
	w->layout = s->cfg->layout;
	w->shm_bytes = c->shm.bytes;
	w->cuda_device = tenants_rank_cuda(&s->tenants, c->pool, c->rank, &be_ctx);
#if KVPOOL_HAVE_CUDA
	/* The ordinal is ours; a client under another CUDA_VISIBLE_DEVICES
	 * finds the GPU by its UUID (proto.h, v4): its rank's. */
	if (w->cuda_device >= 0)
		backend_cuda_uuid(be_ctx, w->cuda_uuid);
#endif
	w->tp = s->tenants.tp;
	w->rank = c->rank;
	if (w->tp > 1)
		rank_layout(&w->layout, w->tp);
	w->pool = c->pool;
	w->npools = s->tenants.npools;
	w->shards = c->tenant ? c->tenant->pools[c->pool].set->n : 1;
	fds[w->nfds++] = c->shm.fd;
	if (!c->tenant)
		return;
	snprintf(w->tenant, sizeof(w->tenant), "%s", c->tenant->name);
	tp = &c->tenant->pools[c->pool];
	for (int t = 0; t < KVP_TIERS; t++) {
		/* cuda: bytes is the whole allocation (granularity-rounded),
		 * frames the pages in it the engine uses. */
		w->tier_bytes[t] = shard_set_tier(tp->set, t)->bytes;
		w->tier_frames[t] = tp->set->pool[t]->total;
	}
	if (w->tp > 1) {
		/* Rank r maps its own slice: rank r's page of every frame. */
		fds[w->nfds++] = backend_stripe_fd(s->tenants.pools[c->pool].be_ctx,
						   shard_set_tier(tp->set, KVP_TIER_DEVICE),
						   c->rank, &w->tier_bytes[KVP_TIER_DEVICE]);
		return;
	}
	fds[w->nfds++] = shard_set_tier(tp->set, KVP_TIER_DEVICE)->fd;
}

static void attach(struct server *s, struct client *c, const struct kvp_hello *h,
		   const uint32_t geo[3])
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct errbuf e = { .msg = "" };
	struct kvp_welcome w;
	int fds[2], ret;

	if (s->next_id == UINT32_MAX) {
		refuse(s, c, -EMFILE, "kvpoold has handed out every client id; "
		       "restart it");
		return;
	}
	/* One uid or tenant must not hold every descriptor (issue 25). */
	ret = tenant_attach_check(&s->tenants, s->cfg, c->uid, c->adm.tenant,
				  w.msg, sizeof(w.msg));
	if (ret) {
		refuse(s, c, ret, w.msg);
		return;
	}
	c->id = ++s->next_id;
	c->tenant = c->adm.tenant;
	c->admin = c->adm.admin;
	c->pool = h->pool; /* hello_check() bounded it */
	c->rank = h->rank; /* and it */
	copy_name(c->name, h->name);
	ret = shm_create(&c->shm, c->id, s->nworkers, geo[0], geo[1], geo[2], &e);
	if (!ret && client_lanes_init(c))
		ret = errbuf_set(&e, -ENOMEM, "out of memory for the client's %" PRIu32
				 " lanes", s->nworkers);
	if (ret) {
		refuse(s, c, ret, e.msg);
		return;
	}
	welcome_fill(s, c, &w, fds);
	ret = send_welcome(c, &w, fds, w.nfds);
	if (ret) {
		log_warn("client %" PRIu32 " (uid %" PRIu32 " pid %" PRIu32 "): cannot "
			 "send the welcome: %s", c->id, c->uid, c->pid, strerror(-ret));
		client_finalize(s, c);
		return;
	}
	shm_close_fd(&c->shm); /* the client has it; the mapping stays */
	client_register(s, c);
	/* Only now: a pending connection costs one descriptor, not two. */
	c->pidfd = peer_pidfd(c);
	ev.data.ptr = &c->pid_w;
	if (c->pidfd >= 0 && epoll_ctl(s->epfd, EPOLL_CTL_ADD, c->pidfd, &ev) < 0) {
		close(c->pidfd); /* the socket hang-up still tells us */
		c->pidfd = -1;
	}
	worker_assign(s, c);
	log_info("client %" PRIu32 " attached: uid %" PRIu32 " gid %" PRIu32 " pid %"
		 PRIu32 " '%s', tenant %s%s, pool %" PRIu32 ", rings %" PRIu32 "/%"
		 PRIu32 ", arena %" PRIu32 " bytes", c->id, c->uid, c->gid, c->pid,
		 c->name, c->tenant ? c->tenant->name : "(none)",
		 c->admin ? ", admin" : "", c->pool, geo[0], geo[1], geo[2]);
}

static void conn_hello(struct server *s, struct client *c)
{
	union {
		struct kvp_hello h;
		unsigned char raw[sizeof(struct kvp_hello) + 1];
	} m;
	struct errbuf e = { .msg = "" };
	uint32_t geo[3] = { 0 };
	ssize_t n;
	int ret;

	memset(&m, 0, sizeof(m));
	/* MSG_TRUNC: n is the datagram's real size, so a longer one shows. */
	n = recv(c->sock, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		listener_hangup(s, c, "closed before its hello");
		return;
	}
	if (!c->adm.allowed) {
		refuse(s, c, -EACCES, c->adm.msg);
		return;
	}
	ret = hello_check(s->cfg, &m.h, n, geo, &e);
	if (ret)
		refuse(s, c, ret, e.msg);
	else
		attach(s, c, &m.h, geo);
}

/* ------------------------------------------------------------ uds mode */

/*
 * One kvp_sqe in, one kvp_cqe plus its result bytes out: the ring's
 * operation without the ring, for kvbench's round-trip baseline. Read here,
 * run by the client's worker (worker_uds_submit), so a user's operations
 * keep their order whichever way they came. One request at a time: the
 * socket is not read again (EPOLLIN off) until the worker has answered,
 * so a client that pipelines requests waits in its own socket buffer.
 */
static void conn_uds(struct server *s, struct client *c)
{
	union {
		struct kvp_sqe q;
		unsigned char raw[sizeof(struct kvp_sqe) + 1];
	} m;
	struct epoll_event ev = { .events = EPOLLRDHUP, .data.ptr = &c->sock_w };
	struct kvp_cqe cqe;
	char msg[128];
	ssize_t n;
	int ret, len;

	if (__atomic_load_n(&c->uds_state, __ATOMIC_ACQUIRE) != UDS_IDLE)
		return; /* EPOLLIN is off until the worker answers */
	n = recv(c->sock, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		listener_hangup(s, c, "hung up");
		return;
	}
	if (n == (ssize_t)sizeof(struct kvp_sqe) && !c->uds_out)
		c->uds_out = malloc(UDS_RESULT_MAX);
	if (n == (ssize_t)sizeof(struct kvp_sqe) && c->uds_out) {
		/* Off before the hand-over: the worker turns it back on, and
		 * must not find us turning it off after it did. */
		if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->sock, &ev) < 0) {
			listener_hangup(s, c, "epoll_ctl failed");
			return;
		}
		c->uds_sqe = m.q;
		worker_uds_submit(c);
		return;
	}
	if (n == (ssize_t)sizeof(struct kvp_sqe))
		len = snprintf(msg, sizeof(msg), "kvpoold is out of memory for a uds "
			       "result buffer; use the ring");
	else
		len = snprintf(msg, sizeof(msg), "uds request of %zd bytes; send "
			       "exactly one %zu-byte kvp_sqe", n, sizeof(struct kvp_sqe));
	cqe = (struct kvp_cqe){ .res = n == (ssize_t)sizeof(struct kvp_sqe) ?
				-ENOMEM : -EINVAL, .out_bytes = (uint32_t)len + 1 };
	ret = worker_uds_reply(c->sock, &cqe, msg);
	if (ret == -EAGAIN)
		log_warn("client %" PRIu32 " (uid %" PRIu32 " pid %" PRIu32 "): does "
			 "not read its uds replies; detaching it", c->id, c->uid, c->pid);
	if (ret)
		listener_hangup(s, c, ret == -EAGAIN ? "uds replies not read" : "hung up");
}

void listener_readable(struct server *s, struct client *c)
{
	switch (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE)) {
	case CLIENT_HELLO:
		conn_hello(s, c);
		break;
	case CLIENT_LIVE:
		conn_uds(s, c);
		break;
	default:
		break; /* detaching: nothing more is served */
	}
}
