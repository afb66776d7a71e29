/* SPDX-License-Identifier: MIT */
/*
 * disk_store.h - the disk tier's file: fixed-size slots moved by io_uring.
 *
 * One preallocated file (fallocate) of nslots slots of slot_bytes, opened
 * O_DIRECT so pages do not pass through the page cache twice; where the
 * filesystem refuses O_DIRECT (tmpfs) it is opened buffered and
 * disk_store_direct() says so (the caller logs it once). Reads and writes
 * are batches of (slot, buffer): runs of consecutive slots whose buffers
 * follow each other in memory go as one SQE, at most DISK_QD SQEs in
 * flight; buffers inside the region given to disk_store_register() go as
 * fixed-buffer operations (no page pinning per I/O).
 *
 * Not thread-safe but for (un)registering: one thread (the disk tier's)
 * drives a store.
 */
#ifndef KVPOOL_DISK_STORE_H
#define KVPOOL_DISK_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "errbuf.h"

#define DISK_QD 32u            /* SQEs in flight */
#define DISK_RUN_MAX_SLOTS 64u /* slots one SQE moves at most */
#define DISK_FIXED_MAX 64u     /* fixed buffers (pieces of <= 1 GiB) */

struct disk_store;

struct disk_io {
	uint32_t slot;
	void *buf;     /* slot_bytes, DISK_ALIGN aligned; with hdr: the page
			* alone (slot_bytes - DISK_PAYLOAD_OFF bytes) */
	void *hdr;     /* NULL, or the slot's first block (DISK_ALIGN bytes):
			* the slot moves in two parts, so its page can live
			* in memory of its own (a host frame) */
	int res;       /* out: 0 or -errno */
	uint32_t parts; /* the store's: parts still in flight */
};

/*
 * Open (creating if needed) path with room for size bytes of slots, kept
 * when it exists (a warm restart reads it). Errors name the path and what
 * to do: -ENOSPC (preallocation), -EACCES / -ENOENT / others from open,
 * -EBUSY when another live kvpoold holds the directory (its pid named).
 * A dead daemon's I/O still holding the file is waited for (at most 5 s):
 * a supervisor may restart kvpoold at once after a kill -9.
 */
int disk_store_open(struct disk_store **out, const char *path, uint64_t size,
		    uint64_t slot_bytes, struct errbuf *e);
void disk_store_close(struct disk_store *st);
/* How long the open waited for a dead daemon's I/O to let go of the file. */
uint32_t disk_store_lock_wait_ms(const struct disk_store *st);

uint32_t disk_store_slots(const struct disk_store *st);
uint64_t disk_store_slot_bytes(const struct disk_store *st);
bool disk_store_direct(const struct disk_store *st);

/*
 * Register [base, base+bytes) as fixed buffers (pieces of at most 1 GiB,
 * cut at multiples of unit): I/O from or to it pins no pages per call. A
 * region registered again (shards sharing a host tier) is counted. Returns
 * 0 or -errno (RLIMIT_MEMLOCK, an old kernel, the table full): I/O there
 * works anyway, unfixed. Any thread may call it and unregister.
 */
int disk_store_register(struct disk_store *st, void *base, uint64_t bytes,
			uint64_t unit);
/* Drop a region (its last registration): no I/O into it may be in flight. */
void disk_store_unregister(struct disk_store *st, void *base);

/*
 * Write (or read) the n slots of v, sorted by slot for best coalescing.
 * Returns how many failed; each v[i].res says how (-ENOSPC: disk full,
 * -EIO: short transfer). Reading a slot past the file's end gives zeros.
 */
uint32_t disk_store_rw(struct disk_store *st, bool write, struct disk_io *v,
		       uint32_t n);

/*
 * disk_store_rw, calling done(arg, i, k) as each run v[i, i+k) completes
 * (its res set), while later runs are still in flight: the caller checks
 * what has landed while the disk works on the rest.
 */
typedef void (*disk_io_done_fn)(void *arg, uint32_t i, uint32_t k);
uint32_t disk_store_rw_each(struct disk_store *st, bool write, struct disk_io *v,
			    uint32_t n, disk_io_done_fn done, void *arg);

/*
 * The same, without waiting: v's runs are queued (reaping earlier ones when
 * DISK_QD are in flight, their done callbacks run then) and the call
 * returns; v must stay put until disk_store_drain(). Submits of both
 * directions and several batches share the queue, so the disk stays busy
 * while the caller prepares the next batch. A slot refused before any I/O
 * gets its res and its done at once.
 */
void disk_store_submit(struct disk_store *st, bool write, struct disk_io *v,
		       uint32_t n, disk_io_done_fn done, void *arg);
/* disk_store_submit of disk_store_write_heads' blocks. */
void disk_store_submit_heads(struct disk_store *st, struct disk_io *v,
			     uint32_t n);
/* Wait until everything submitted has landed (res set, done called). */
void disk_store_drain(struct disk_store *st);

/* Write the first DISK_ALIGN bytes of each slot of v (buf: that many). */
uint32_t disk_store_write_heads(struct disk_store *st, struct disk_io *v,
				uint32_t n);

/*
 * Read len bytes at off (both multiples of DISK_ALIGN, buf DISK_ALIGN
 * aligned) synchronously, outside the ring: the scan's look at a record
 * longer than a slot. Returns the bytes read (short at the file's end) or
 * -errno.
 */
int64_t disk_store_read_at(struct disk_store *st, uint64_t off, void *buf,
			   uint64_t len);

/* Tests: the next `n` writes after `after` more fail with err. */
void disk_store_inject(struct disk_store *st, uint32_t after, uint32_t n,
		       int err);

#endif /* KVPOOL_DISK_STORE_H */
