/* SPDX-License-Identifier: MIT */
/*
 * disk_store.c - slots of one file over io_uring (disk_store.h).
 *
 * One daemon per disk_dir, and a restart right after a kill -9 must work
 * (issue 25, item 8). Two locks:
 *   - an flock on the directory, held for the daemon's life: the liveness
 *     lock. Its descriptor never goes near io_uring, so the kernel drops it
 *     as the holder's process exits (exit_files), before anyone can see the
 *     process gone. Held by someone else: a live kvpoold; refused.
 *   - an flock on the file, as before: the I/O lock. A request io_uring
 *     has in flight holds its own reference to the file, and a dead
 *     process's ring is torn down by a kernel worker after the process is
 *     reaped, so this lock may outlive its holder by some milliseconds (seen
 *     as "in use by another kvpoold" on 2 of 10 immediate restarts). Holding
 *     the directory lock proves its holder is dead: wait for it, bounded,
 *     which also keeps the dead daemon's last writes from landing after the
 *     scan has read the file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "bug.h"
#include "disk_record.h"
#include "disk_store.h"

/* A run in flight: slots v[i, i+k) moved as one SQE of bytes. */
struct disk_run {
	struct disk_io *v;
	uint32_t i, k;
	uint64_t bytes;
	disk_io_done_fn done;
	void *arg;
};

/* One entry of io_uring's fixed-buffer table: a piece of a region. */
struct disk_fixed {
	char *base;              /* NULL: free */
	uint64_t bytes;
	char *region;            /* the region it is a piece of */
};

#define LOCK_WAIT_MS 5000u  /* a dead daemon's I/O lets go of the file */
#define LOCK_POLL_US 5000u

struct disk_store {
	int fd;
	int dir_fd;              /* flocked: the liveness lock */
	uint32_t lock_wait_ms;   /* waited for a dead daemon's I/O lock */
	bool direct;
	uint64_t slot_bytes;
	uint32_t nslots;
	struct io_uring ring;
	/* Fixed buffers (sparse table): pieces of registered regions. The
	 * disk thread looks them up per SQE while an engine may add or drop
	 * a region: fixed_mu. */
	pthread_mutex_t fixed_mu;
	bool sparse;             /* the table exists (kernel >= 5.19) */
	struct disk_fixed fixed[DISK_FIXED_MAX];
	uint32_t region_refs[DISK_FIXED_MAX]; /* by the region's first piece */
	uint32_t inj_after, inj_n; /* disk_store_inject */
	int inj_err;
	/* The SQEs in flight, across submits (user_data: index in run). */
	struct disk_run run[2 * DISK_QD];
	uint32_t run_free[2 * DISK_QD], nrun_free, inflight;
};

static int open_file(const char *path, bool *direct)
{
	int flags = O_RDWR | O_CREAT | O_CLOEXEC;
	int fd = open(path, flags | O_DIRECT, 0600);

	*direct = fd >= 0;
	/* tmpfs and some others refuse O_DIRECT: buffered, and said so. */
	if (fd < 0 && errno == EINVAL)
		fd = open(path, flags, 0600);
	return fd < 0 ? -errno : fd;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The pid holding an flock on fd's inode (/proc/locks), 0 when unknown. */
static int flock_holder(int fd)
{
	char line[256];
	struct stat sb;
	int pid = 0;
	FILE *f;

	if (fstat(fd, &sb) || !(f = fopen("/proc/locks", "re")))
		return 0;
	while (!pid && fgets(line, sizeof(line), f)) {
		unsigned int maj, min;
		unsigned long ino;
		int p;

		/* "1: FLOCK  ADVISORY  WRITE 4242 fe:00:1095 0 EOF"; a waiter's
		 * line ("1: -> FLOCK ...") does not match. */
		if (sscanf(line, "%*d: FLOCK %*s %*s %d %x:%x:%lu", &p, &maj, &min,
			   &ino) == 4 && ino == sb.st_ino &&
		    makedev(maj, min) == sb.st_dev)
			pid = p;
	}
	fclose(f);
	return pid;
}

static int in_use(const char *path, const char *dir, int fd, struct errbuf *e)
{
	int pid = flock_holder(fd);

	if (pid > 0)
		return errbuf_set(e, -EBUSY, "%s: in use by another kvpoold (pid %d "
				  "holds the lock on %s); stop it first or give each "
				  "daemon its own disk_dir", path, pid, dir);
	return errbuf_set(e, -EBUSY, "%s: in use by another kvpoold (it holds the "
			  "lock on %s); stop it first or give each daemon its own "
			  "disk_dir", path, dir);
}

/* The liveness lock: an flock on the directory of path, for our life. */
static int lock_dir(const char *path, struct errbuf *e)
{
	const char *slash = strrchr(path, '/');
	char dir[PATH_MAX];
	int fd, ret;

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if ((size_t)(slash - path) >= sizeof(dir))
		return errbuf_set(e, -ENAMETOOLONG, "%s: path too long", path);
	else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path),
			 path);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return errbuf_set(e, -errno, "disk_dir %s: cannot open it: %s; make it "
				  "readable by kvpoold's user", dir, strerror(errno));
	if (!flock(fd, LOCK_EX | LOCK_NB))
		return fd;
	ret = errno == EWOULDBLOCK ? in_use(path, dir, fd, e) :
	      errbuf_set(e, -errno, "disk_dir %s: cannot lock it: %s", dir,
			 strerror(errno));
	close(fd);
	return ret;
}

/*
 * The I/O lock on the file. We hold the directory's, so whoever holds this
 * one is dead (or a kvpoold from before the directory lock): io_uring
 * requests it left in flight still hold the file. Wait for them, bounded.
 */
static int lock_file(struct disk_store *st, const char *path, struct errbuf *e)
{
	uint64_t t0 = now_ms(), waited;
	int pid;

	for (;;) {
		if (!flock(st->fd, LOCK_EX | LOCK_NB)) {
			st->lock_wait_ms = (uint32_t)(now_ms() - t0);
			return 0;
		}
		if (errno != EWOULDBLOCK)
			return errbuf_set(e, -errno, "%s: cannot lock it: %s", path,
					  strerror(errno));
		waited = now_ms() - t0;
		if (waited >= LOCK_WAIT_MS)
			break;
		usleep(LOCK_POLL_US);
	}
	pid = flock_holder(st->fd);
	if (pid > 0)
		return errbuf_set(e, -EBUSY, "%s: still locked after %" PRIu64 " ms "
				  "(by pid %d) with no kvpoold holding its disk_dir: a "
				  "kvpoold older than this one, or a dead one's I/O that "
				  "does not end; stop that process or give each daemon "
				  "its own disk_dir", path, waited, pid);
	return errbuf_set(e, -EBUSY, "%s: still locked after %" PRIu64 " ms with no "
			  "kvpoold holding its disk_dir: a kvpoold older than this "
			  "one, or a dead one's I/O that does not end; stop that "
			  "process or give each daemon its own disk_dir", path, waited);
}

int disk_store_open(struct disk_store **out, const char *path, uint64_t size,
		    uint64_t slot_bytes, struct errbuf *e)
{
	struct disk_store *st;
	uint64_t bytes;
	int ret;

	if (!slot_bytes || size / slot_bytes == 0 || size / slot_bytes > UINT32_MAX)
		return errbuf_set(e, -EINVAL, "disk_size %" PRIu64 " holds no page "
				  "slot of %" PRIu64 " bytes (or more than 2^32); "
				  "raise or lower disk_size", size, slot_bytes);
	st = calloc(1, sizeof(*st));
	if (!st)
		return errbuf_set(e, -ENOMEM, "%s: out of memory", path);
	st->slot_bytes = slot_bytes;
	for (uint32_t i = 0; i < 2 * DISK_QD; i++)
		st->run_free[i] = i;
	st->nrun_free = 2 * DISK_QD;
	st->nslots = (uint32_t)(size / slot_bytes);
	bytes = (uint64_t)st->nslots * slot_bytes;
	/* One daemon per directory: a second would overwrite the first's
	 * slots. */
	st->dir_fd = lock_dir(path, e);
	if (st->dir_fd < 0) {
		ret = st->dir_fd;
		free(st);
		return ret;
	}
	st->fd = open_file(path, &st->direct);
	if (st->fd < 0) {
		ret = errbuf_set(e, st->fd, "%s: cannot open the disk tier file: "
				 "%s; make disk_dir writable by kvpoold's user or "
				 "choose another disk_dir", path, strerror(-st->fd));
		close(st->dir_fd);
		free(st);
		return ret;
	}
	ret = lock_file(st, path, e);
	if (ret)
		goto err;
	ret = fallocate(st->fd, 0, 0, (off_t)bytes) ? -errno : 0;
	if (ret == -EOPNOTSUPP)
		ret = ftruncate(st->fd, (off_t)bytes) ? -errno : 0;
	if (ret) {
		errbuf_set(e, ret, "%s: cannot preallocate %" PRIu64 " bytes: %s; "
			   "free space there or lower disk_size", path, bytes,
			   strerror(-ret));
		goto err;
	}
	/* Each slot may take two SQEs (disk_io.hdr). */
	ret = io_uring_queue_init(2 * DISK_QD, &st->ring, 0);
	if (ret) {
		errbuf_set(e, ret, "%s: io_uring_queue_init: %s (the disk tier "
			   "needs io_uring: a kernel >= 5.6 that allows it)", path,
			   strerror(-ret));
		goto err;
	}
	/* Without the sparse table (an older kernel) only the first region
	 * goes fixed (disk_store_register); the rest works unfixed. */
	st->sparse = !io_uring_register_buffers_sparse(&st->ring, DISK_FIXED_MAX);
	pthread_mutex_init(&st->fixed_mu, NULL);
	*out = st;
	return 0;
err:
	close(st->fd);
	close(st->dir_fd);
	free(st);
	return ret;
}

void disk_store_close(struct disk_store *st)
{
	if (!st)
		return;
	io_uring_queue_exit(&st->ring);
	pthread_mutex_destroy(&st->fixed_mu);
	close(st->fd);
	close(st->dir_fd); /* last: the file is let go of first */
	free(st);
}

uint32_t disk_store_lock_wait_ms(const struct disk_store *st)
{
	return st->lock_wait_ms;
}

int64_t disk_store_read_at(struct disk_store *st, uint64_t off, void *buf,
			   uint64_t len)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t n = pread(st->fd, (char *)buf + done, len - done,
				  (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break; /* the file's end */
		done += (uint64_t)n;
	}
	return (int64_t)done;
}

uint32_t disk_store_slots(const struct disk_store *st)
{
	return st->nslots;
}

uint64_t disk_store_slot_bytes(const struct disk_store *st)
{
	return st->slot_bytes;
}

bool disk_store_direct(const struct disk_store *st)
{
	return st->direct;
}

/* Locked: the region at base (its first piece), or DISK_FIXED_MAX. */
static uint32_t region_find(const struct disk_store *st, const void *base)
{
	for (uint32_t i = 0; i < DISK_FIXED_MAX; i++)
		if (st->fixed[i].base == base && st->fixed[i].region == base)
			return i;
	return DISK_FIXED_MAX;
}

/* Locked: unregister every piece of the region at base. */
static void region_drop(struct disk_store *st, const char *base)
{
	struct iovec none = { 0 };

	for (uint32_t i = 0; i < DISK_FIXED_MAX; i++)
		if (st->fixed[i].region == base) {
			if (st->sparse)
				io_uring_register_buffers_update_tag(&st->ring, i,
								     &none, NULL, 1);
			else
				io_uring_unregister_buffers(&st->ring);
			st->fixed[i] = (struct disk_fixed){ 0 };
			st->region_refs[i] = 0;
		}
}

/* Locked: register pieces of at most 1 GiB (the kernel's limit per
 * buffer), cut at multiples of unit so no I/O of unit bytes straddles two. */
static int region_add(struct disk_store *st, char *base, uint64_t bytes,
		      uint64_t unit)
{
	uint64_t max = (1ull << 30) / unit * unit, off = 0;
	uint32_t first = DISK_FIXED_MAX;

	if (!max || !bytes)
		return -EINVAL;
	while (off < bytes) {
		uint64_t len = bytes - off < max ? bytes - off : max;
		struct iovec iov = { .iov_base = base + off, .iov_len = len };
		uint32_t i = 0;
		int ret;

		while (i < DISK_FIXED_MAX && st->fixed[i].base)
			i++;
		ret = i == DISK_FIXED_MAX ? -ENOSPC :
		      io_uring_register_buffers_update_tag(&st->ring, i, &iov, NULL, 1);
		if (ret < 0) {
			/* None of it, then: a piece without its count would
			 * never be dropped. */
			region_drop(st, base);
			return ret;
		}
		st->fixed[i] = (struct disk_fixed){ .base = base + off, .bytes = len,
						    .region = base };
		if (first == DISK_FIXED_MAX)
			first = i;
		off += len;
	}
	st->region_refs[first] = 1;
	return 0;
}

int disk_store_register(struct disk_store *st, void *base, uint64_t bytes,
			uint64_t unit)
{
	struct iovec iov = { .iov_base = base, .iov_len = bytes };
	uint32_t r;
	int ret;

	pthread_mutex_lock(&st->fixed_mu);
	r = region_find(st, base);
	if (r < DISK_FIXED_MAX) {
		st->region_refs[r]++; /* another shard of the same host tier */
		ret = 0;
	} else if (st->sparse) {
		ret = region_add(st, base, bytes, unit);
	} else if (st->fixed[0].base || bytes > (1ull << 30)) {
		ret = -EOPNOTSUPP;
	} else {
		ret = io_uring_register_buffers(&st->ring, &iov, 1);
		if (!ret) {
			st->fixed[0] = (struct disk_fixed){ .base = base,
							    .bytes = bytes,
							    .region = base };
			st->region_refs[0] = 1;
		}
	}
	pthread_mutex_unlock(&st->fixed_mu);
	/* Failing (RLIMIT_MEMLOCK, an old kernel): I/O there pins its pages
	 * itself, a little slower. */
	return ret;
}

void disk_store_unregister(struct disk_store *st, void *base)
{
	uint32_t r;

	pthread_mutex_lock(&st->fixed_mu);
	r = region_find(st, base);
	/* No I/O into it is in flight (its owner waited for that): the
	 * kernel lets go of its pages now. */
	if (r < DISK_FIXED_MAX && st->region_refs[r] && !--st->region_refs[r])
		region_drop(st, base);
	pthread_mutex_unlock(&st->fixed_mu);
}

void disk_store_inject(struct disk_store *st, uint32_t after, uint32_t n,
		       int err)
{
	st->inj_after = after;
	st->inj_n = n;
	st->inj_err = err;
}

/* Slots v[i..] that go as one SQE: consecutive slots, contiguous buffers. */
static uint32_t run_len(const struct disk_store *st, const struct disk_io *v,
			uint32_t i, uint32_t n)
{
	uint32_t k = 1;

	/* At most DISK_RUN_MAX_SLOTS and 64 MiB (the length is 32 bits). */
	if (v[i].hdr)
		return 1; /* two SQEs of its own (disk_io.hdr) */
	while (i + k < n && k < DISK_RUN_MAX_SLOTS && !v[i + k].hdr &&
	       (k + 1) * st->slot_bytes <= (64u << 20) &&
	       v[i + k].slot == v[i].slot + k &&
	       (char *)v[i + k].buf == (char *)v[i].buf + k * st->slot_bytes)
		k++;
	return k;
}

static bool injected(struct disk_store *st, bool write)
{
	if (!write || !st->inj_n)
		return false;
	if (st->inj_after) {
		st->inj_after--;
		return false;
	}
	st->inj_n--;
	return true;
}

/* The fixed buffer holding [buf, buf+len), or -1. */
static int fixed_index(struct disk_store *st, const void *buf, uint64_t len)
{
	const char *p = buf;
	int idx = -1;

	pthread_mutex_lock(&st->fixed_mu);
	for (uint32_t i = 0; i < DISK_FIXED_MAX; i++)
		if (st->fixed[i].base && p >= st->fixed[i].base &&
		    len <= st->fixed[i].bytes &&
		    (uint64_t)(p - st->fixed[i].base) <= st->fixed[i].bytes - len) {
			idx = (int)i;
			break;
		}
	pthread_mutex_unlock(&st->fixed_mu);
	return idx;
}

static void prep(struct disk_store *st, struct io_uring_sqe *sqe, bool write,
		 void *buf, uint32_t len, uint64_t off)
{
	int idx = fixed_index(st, buf, len);

	if (write && idx >= 0)
		io_uring_prep_write_fixed(sqe, st->fd, buf, len, off, idx);
	else if (write)
		io_uring_prep_write(sqe, st->fd, buf, len, off);
	else if (idx >= 0)
		io_uring_prep_read_fixed(sqe, st->fd, buf, len, off, idx);
	else
		io_uring_prep_read(sqe, st->fd, buf, len, off);
}

/* Reap one completion (waiting for it when wait): mark its run's slots,
 * tell its caller. false: none was there. */
static bool reap_one(struct disk_store *st, bool wait)
{
	struct io_uring_cqe *cqe;
	struct disk_run *r;
	int res, ret;

	do
		ret = wait ? io_uring_wait_cqe(&st->ring, &cqe) :
			     io_uring_peek_cqe(&st->ring, &cqe);
	while (ret == -EINTR);
	if (ret == -EAGAIN && !wait)
		return false;
	KVP_BUG_ON(ret, "a completion is waited for only while a read or write is in flight");
	r = &st->run[cqe->user_data];
	res = cqe->res;
	io_uring_cqe_seen(&st->ring, cqe);
	st->inflight--;
	st->run_free[st->nrun_free++] = (uint32_t)cqe->user_data;
	if (res >= 0 && (uint64_t)res != r->bytes)
		res = -EIO;
	for (uint32_t j = 0; j < r->k; j++) {
		struct disk_io *x = &r->v[r->i + j];

		if (res < 0 && !x->res)
			x->res = res;
		x->parts--;
	}
	/* A slot moved in two parts (hdr) is done when both are. */
	if (r->done && !r->v[r->i].parts)
		r->done(r->arg, r->i, r->k); /* while other runs are in flight */
	return true;
}

/* One SQE of run id for v[i, i+k), bytes at off. */
static void queue_sqe(struct disk_store *st, struct io_uring_sqe *sqe, bool write,
		      struct disk_io *v, uint32_t i, uint32_t k, void *buf,
		      uint64_t bytes, uint64_t off, disk_io_done_fn done, void *arg)
{
	uint32_t id = st->run_free[--st->nrun_free];

	st->run[id] = (struct disk_run){ .v = v, .i = i, .k = k, .bytes = bytes,
					 .done = done, .arg = arg };
	prep(st, sqe, write, buf, (uint32_t)bytes, off);
	sqe->user_data = id;
	st->inflight++;
}

/*
 * Queue v's slots as runs; unit: slot_bytes (whole slots, coalesced) or
 * DISK_ALIGN (each slot's first block). A slot with hdr goes as two SQEs:
 * its header block from or to hdr, its page from or to buf. Returns at once unless the queue
 * is full, when it reaps what has landed to make room: a caller submits,
 * prepares the next batch while the disk works, and drains.
 */
static void submit(struct disk_store *st, bool write, struct disk_io *v,
		   uint32_t n, uint64_t unit, disk_io_done_fn done, void *arg)
{
	uint32_t i = 0, queued = 0;

	while (i < n) {
		uint32_t k = unit == st->slot_bytes ? run_len(st, v, i, n) : 1;
		struct io_uring_sqe *sqe, *sqe2;
		uint32_t parts;
		uint64_t off;

		parts = v[i].hdr && unit == st->slot_bytes ? 2 : 1;
		/* DISK_QD runs in flight; a slot in two parts counts as one
		 * (its header block is 4 KiB beside the page). */
		if (st->inflight + parts > DISK_QD * parts) {
			/* Full: hand the kernel what is prepared, take one. */
			if (queued)
				io_uring_submit(&st->ring);
			queued = 0;
			reap_one(st, true);
			continue;
		}
		if (v[i].slot >= st->nslots || injected(st, write)) {
			v[i].res = v[i].slot >= st->nslots ? -ERANGE : st->inj_err;
			v[i].parts = 0;
			if (done)
				done(arg, i, 1);
			i++;
			continue;
		}
		/* The SQ has 2 * DISK_QD entries: never short here. */
		sqe = io_uring_get_sqe(&st->ring);
		sqe2 = parts == 2 ? io_uring_get_sqe(&st->ring) : NULL;
		KVP_BUG_ON(!sqe || (parts == 2 && !sqe2),
			   "the SQ has 2 * DISK_QD entries: room for every part in flight");
		for (uint32_t j = 0; j < k; j++)
			v[i + j] = (struct disk_io){ .slot = v[i + j].slot,
						     .buf = v[i + j].buf,
						     .hdr = v[i + j].hdr,
						     .parts = parts };
		off = (uint64_t)v[i].slot * st->slot_bytes;
		if (parts == 2) {
			queue_sqe(st, sqe2, write, v, i, 1, v[i].hdr, DISK_ALIGN,
				  off, done, arg);
			queue_sqe(st, sqe, write, v, i, 1, v[i].buf,
				  st->slot_bytes - DISK_ALIGN, off + DISK_ALIGN,
				  done, arg);
		} else {
			queue_sqe(st, sqe, write, v, i, k, v[i].buf, k * unit, off,
				  done, arg);
		}
		queued += parts;
		i += k;
	}
	if (queued)
		io_uring_submit(&st->ring);
	/* Take what has landed already: its callbacks run now, not at the
	 * drain. */
	while (st->inflight && reap_one(st, false))
		;
}

void disk_store_submit(struct disk_store *st, bool write, struct disk_io *v,
		       uint32_t n, disk_io_done_fn done, void *arg)
{
	submit(st, write, v, n, st->slot_bytes, done, arg);
}

void disk_store_submit_heads(struct disk_store *st, struct disk_io *v,
			     uint32_t n)
{
	submit(st, true, v, n, DISK_ALIGN, NULL, NULL);
}

void disk_store_drain(struct disk_store *st)
{
	while (st->inflight)
		reap_one(st, true);
}

static uint32_t failed_of(const struct disk_io *v, uint32_t n)
{
	uint32_t failed = 0;

	for (uint32_t i = 0; i < n; i++)
		failed += v[i].res != 0;
	return failed;
}

uint32_t disk_store_rw(struct disk_store *st, bool write, struct disk_io *v,
		       uint32_t n)
{
	return disk_store_rw_each(st, write, v, n, NULL, NULL);
}

uint32_t disk_store_rw_each(struct disk_store *st, bool write, struct disk_io *v,
			    uint32_t n, disk_io_done_fn done, void *arg)
{
	submit(st, write, v, n, st->slot_bytes, done, arg);
	disk_store_drain(st);
	return failed_of(v, n);
}

uint32_t disk_store_write_heads(struct disk_store *st, struct disk_io *v,
				uint32_t n)
{
	submit(st, true, v, n, DISK_ALIGN, NULL, NULL);
	disk_store_drain(st);
	return failed_of(v, n);
}
