/* SPDX-License-Identifier: MIT */
/*
 * backend_shm.c - the shm backend: both tiers in sealed memfds, memcpy copies.
 *
 * This is the backend where there is no GPU, what CI tests and what the demo
 * runs on. Each tier is one memfd sized once and sealed against growing and
 * shrinking before anyone maps it, so a client that maps it can never have the
 * mapping truncated under it (SIGBUS), and neither can the daemon.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"

static int shm_tier_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
			  struct tier_mem *out, struct errbuf *e)
{
	const char *name = tier == KVP_TIER_DEVICE ? "kvpool-device" : "kvpool-host";
	void *base;
	int fd, err;

	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errbuf_set(e, -errno, "memfd_create(%s): %s", name, strerror(errno));
	if (ftruncate(fd, (off_t)bytes) < 0) {
		err = -errno;
		close(fd);
		return errbuf_set(e, err, "%s tier: cannot size to %" PRIu64 " bytes: %s",
				  kvp_tier_name(tier), bytes, strerror(-err));
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		err = -errno;
		close(fd);
		return errbuf_set(e, err, "%s tier: cannot seal memfd: %s",
				  kvp_tier_name(tier), strerror(-err));
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		close(fd);
		return errbuf_set(e, err, "%s tier: mmap of %" PRIu64 " bytes: %s",
				  kvp_tier_name(tier), bytes, strerror(-err));
	}
	out->base = base;
	out->host_visible = true;
	out->bytes = bytes;
	out->fd = fd;
	return 0;
}

static void shm_tier_free(void *ctx, struct tier_mem *m)
{
	if (m->base)
		munmap(m->base, m->bytes);
	if (m->fd >= 0)
		close(m->fd);
	m->base = NULL;
	m->fd = -1;
}

static int shm_copy(void *ctx, enum copy_dir dir, const struct tier_mem *dst,
		    const struct tier_mem *src, const struct copy_run *runs,
		    uint32_t n, struct errbuf *e)
{
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)dst->base + runs[i].dst_off,
		       (const char *)src->base + runs[i].src_off, runs[i].bytes);
	return 0;
}

/* memcpy lands before it returns: every fence is 0, landed. */
static int shm_copy_async(void *ctx, enum copy_dir dir,
			  const struct tier_mem *dst, const struct tier_mem *src,
			  const struct copy_run *runs, uint32_t n,
			  uint64_t *fence, struct errbuf *e)
{
	*fence = 0;
	return shm_copy(ctx, dir, dst, src, runs, n, e);
}

/* Likewise for the pipelined device -> host copies: ticket 0. */
static int shm_copy_start(void *ctx, const struct tier_mem *dst,
			  const struct tier_mem *src, const struct copy_run *runs,
			  uint32_t n, uint64_t *ticket, struct errbuf *e)
{
	*ticket = 0;
	return shm_copy(ctx, COPY_D2H, dst, src, runs, n, e);
}

static int shm_copy_wait(void *ctx, uint64_t ticket)
{
	return 0;
}

static int shm_fence_done(void *ctx, uint64_t fence)
{
	return 1;
}

static void shm_fence_wait(void *ctx, uint64_t fence)
{
}

static int shm_read(void *ctx, const struct tier_mem *m, uint64_t off,
		    void *dst, uint64_t bytes, struct errbuf *e)
{
	if (off > m->bytes || bytes > m->bytes - off)
		return errbuf_set(e, -ERANGE, "read of %" PRIu64 " bytes at %" PRIu64
				  " is outside the %" PRIu64 "-byte tier", bytes,
				  off, m->bytes);
	memcpy(dst, (const char *)m->base + off, bytes);
	return 0;
}

const struct backend_ops backend_shm = {
	.name = "shm",
	.tier_alloc = shm_tier_alloc,
	.tier_free = shm_tier_free,
	.copy = shm_copy,
	.copy_async = shm_copy_async,
	.copy_start = shm_copy_start,
	.copy_wait = shm_copy_wait,
	.fence_done = shm_fence_done,
	.fence_wait = shm_fence_wait,
	.read = shm_read,
};
