/* SPDX-License-Identifier: MIT */
/*
 * disk_store.c - slots of one file over io_uring (disk_store.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

struct disk_store {
	int fd;
	bool direct;
	uint64_t slot_bytes;
	uint32_t nslots;
	struct io_uring ring;
	char *fixed;             /* registered buffer 0, or NULL */
	uint64_t fixed_bytes;
	uint32_t inj_after, inj_n; /* disk_store_inject */
	int inj_err;
	/* The SQEs in flight, across submits (user_data: index in run). */
	struct disk_run run[DISK_QD];
	uint32_t run_free[DISK_QD], nrun_free, inflight;
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
	for (uint32_t i = 0; i < DISK_QD; i++)
		st->run_free[i] = i;
	st->nrun_free = DISK_QD;
	st->nslots = (uint32_t)(size / slot_bytes);
	bytes = (uint64_t)st->nslots * slot_bytes;
	st->fd = open_file(path, &st->direct);
	if (st->fd < 0) {
		ret = errbuf_set(e, st->fd, "%s: cannot open the disk tier file: "
				 "%s; make disk_dir writable by kvpoold's user or "
				 "choose another disk_dir", path, strerror(-st->fd));
		free(st);
		return ret;
	}
	/* One daemon per file: a second would overwrite the first's slots. */
	if (flock(st->fd, LOCK_EX | LOCK_NB)) {
		ret = errbuf_set(e, -EBUSY, "%s: in use by another kvpoold; give "
				 "each daemon its own disk_dir", path);
		goto err;
	}
	ret = fallocate(st->fd, 0, 0, (off_t)bytes) ? -errno : 0;
	if (ret == -EOPNOTSUPP)
		ret = ftruncate(st->fd, (off_t)bytes) ? -errno : 0;
	if (ret) {
		errbuf_set(e, ret, "%s: cannot preallocate %" PRIu64 " bytes: %s; "
			   "free space there or lower disk_size", path, bytes,
			   strerror(-ret));
		goto err;
	}
	ret = io_uring_queue_init(DISK_QD, &st->ring, 0);
	if (ret) {
		errbuf_set(e, ret, "%s: io_uring_queue_init: %s (the disk tier "
			   "needs io_uring: a kernel >= 5.6 that allows it)", path,
			   strerror(-ret));
		goto err;
	}
	*out = st;
	return 0;
err:
	close(st->fd);
	free(st);
	return ret;
}

void disk_store_close(struct disk_store *st)
{
	if (!st)
		return;
	io_uring_queue_exit(&st->ring);
	close(st->fd);
	free(st);
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

int disk_store_register(struct disk_store *st, void *base, uint64_t bytes)
{
	struct iovec iov = { .iov_base = base, .iov_len = bytes };
	int ret = io_uring_register_buffers(&st->ring, &iov, 1);

	/* Without it (RLIMIT_MEMLOCK) every I/O pins its pages itself. */
	if (!ret) {
		st->fixed = base;
		st->fixed_bytes = bytes;
	}
	return ret;
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
	while (i + k < n && k < DISK_RUN_MAX_SLOTS &&
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

static void prep(struct disk_store *st, struct io_uring_sqe *sqe, bool write,
		 void *buf, uint32_t len, uint64_t off)
{
	bool fixed = st->fixed && (char *)buf >= st->fixed &&
		     (char *)buf + len <= st->fixed + st->fixed_bytes;

	if (write && fixed)
		io_uring_prep_write_fixed(sqe, st->fd, buf, len, off, 0);
	else if (write)
		io_uring_prep_write(sqe, st->fd, buf, len, off);
	else if (fixed)
		io_uring_prep_read_fixed(sqe, st->fd, buf, len, off, 0);
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
	if (ret)
		abort(); /* only with nothing in flight: a bug */
	r = &st->run[cqe->user_data];
	res = cqe->res;
	io_uring_cqe_seen(&st->ring, cqe);
	st->inflight--;
	st->run_free[st->nrun_free++] = (uint32_t)cqe->user_data;
	if (res >= 0 && (uint64_t)res != r->bytes)
		res = -EIO;
	for (uint32_t j = 0; j < r->k; j++)
		r->v[r->i + j].res = res < 0 ? res : 0;
	if (r->done)
		r->done(r->arg, r->i, r->k); /* while other runs are in flight */
	return true;
}

/*
 * Queue v's slots as runs; unit: slot_bytes (whole slots, coalesced) or
 * DISK_ALIGN (each slot's first block). Returns at once unless the queue
 * is full, when it reaps what has landed to make room: a caller submits,
 * prepares the next batch while the disk works, and drains.
 */
static void submit(struct disk_store *st, bool write, struct disk_io *v,
		   uint32_t n, uint64_t unit, disk_io_done_fn done, void *arg)
{
	uint32_t i = 0, queued = 0;

	while (i < n) {
		uint32_t k = unit == st->slot_bytes ? run_len(st, v, i, n) : 1;
		struct io_uring_sqe *sqe;
		uint32_t id;

		if (v[i].slot >= st->nslots || injected(st, write)) {
			v[i].res = v[i].slot >= st->nslots ? -ERANGE : st->inj_err;
			if (done)
				done(arg, i, 1);
			i++;
			continue;
		}
		if (st->inflight == DISK_QD) {
			/* Full: hand the kernel what is prepared, take one. */
			if (queued)
				io_uring_submit(&st->ring);
			queued = 0;
			reap_one(st, true);
		}
		sqe = io_uring_get_sqe(&st->ring);
		if (!sqe) { /* the SQ holds DISK_QD: cannot happen */
			io_uring_submit(&st->ring);
			queued = 0;
			continue;
		}
		id = st->run_free[--st->nrun_free];
		st->run[id] = (struct disk_run){ .v = v, .i = i, .k = k,
						 .bytes = k * unit, .done = done,
						 .arg = arg };
		prep(st, sqe, write, v[i].buf, (uint32_t)(k * unit),
		     (uint64_t)v[i].slot * st->slot_bytes);
		sqe->user_data = id;
		st->inflight++;
		queued++;
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
