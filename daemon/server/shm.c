/* SPDX-License-Identifier: MIT */
/*
 * shm.c - the per-client memfd: sizing, sealing, mapping, the header.
 *
 * The seals matter more to the client than to us: with F_SEAL_SHRINK the
 * file can never be truncated under either side's mapping (no SIGBUS), and
 * F_SEAL_SEAL stops anyone from removing that guarantee later.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~((uint64_t)(a) - 1))
#define SHM_PAGE 4096u

int shm_create(struct client_shm *s, uint32_t client_id, uint32_t lanes,
	       uint32_t sq_entries, uint32_t cq_entries, uint32_t arena_bytes,
	       struct errbuf *e)
{
	struct kvp_shm_hdr hdr = {
		.magic = KVP_PROTO_MAGIC,
		.version = KVP_PROTO_VERSION,
		.client_id = client_id,
		.sq_entries = sq_entries,
		.cq_entries = cq_entries,
		.arena_bytes = arena_bytes,
		.lanes = lanes,
	};
	char name[32];
	void *base;
	int fd, err;

	/* Each part 64-byte aligned (proto.h); the arena page aligned so a
	 * client may register it for DMA. */
	hdr.ctl_off = ALIGN_UP(sizeof(hdr), 64);
	hdr.sq_off = ALIGN_UP(hdr.ctl_off + sizeof(struct kvp_ring_ctl), 64);
	hdr.cq_off = ALIGN_UP(hdr.sq_off + (uint64_t)sq_entries * sizeof(struct kvp_sqe), 64);
	hdr.lane_bytes = ALIGN_UP(hdr.cq_off + (uint64_t)cq_entries * sizeof(struct kvp_cqe),
				  64) - hdr.ctl_off;
	hdr.arena_off = ALIGN_UP(hdr.ctl_off + lanes * hdr.lane_bytes, SHM_PAGE);
	hdr.total_bytes = ALIGN_UP(hdr.arena_off + arena_bytes, SHM_PAGE);

	snprintf(name, sizeof(name), "kvpool-client-%" PRIu32, client_id);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errbuf_set(e, -errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)hdr.total_bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		err = -errno;
		close(fd);
		return errbuf_set(e, err, "client shm of %" PRIu64 " bytes: %s",
				  hdr.total_bytes, strerror(-err));
	}
	base = mmap(NULL, hdr.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		close(fd);
		return errbuf_set(e, err, "mmap of client shm: %s", strerror(-err));
	}
	memcpy(base, &hdr, sizeof(hdr));
	*s = (struct client_shm){
		.fd = fd,
		.base = base,
		.bytes = hdr.total_bytes,
		.arena = (unsigned char *)base + hdr.arena_off,
		.lanes = lanes,
		.ctl_off = hdr.ctl_off,
		.sq_off = hdr.sq_off,
		.cq_off = hdr.cq_off,
		.lane_bytes = hdr.lane_bytes,
		.sq_entries = sq_entries,
		.cq_entries = cq_entries,
		.arena_bytes = arena_bytes,
	};
	return 0;
}

void shm_close_fd(struct client_shm *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
}

void shm_destroy(struct client_shm *s)
{
	shm_close_fd(s);
	if (s->base)
		munmap(s->base, s->bytes);
	s->base = NULL;
}
