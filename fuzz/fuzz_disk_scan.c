/* SPDX-License-Identifier: MIT */
/*
 * fuzz_disk_scan - a whole disk tier file after a restart: the warm
 * restart's scan (daemon/disk/disk_scan.c) over it, then every history,
 * prefix page and chunk it kept read back through the disk thread
 * (disk_thread.c: open_page's checks and the codec).
 *
 * The input is a run of slots, each a 128-byte record header, a 16-bit
 * payload length and that many payload bytes (the rest of the page is
 * zero), written into a file of SLOTS slots of a 4 KiB-page layout. A
 * header with DISK_MAGIC is sealed (its checksum made right, so the
 * fuzzer gets past it) unless its checksum field is 1: then it is left
 * as given, damaged. What the scan keeps must read back with the pages
 * it claims, or not at all; nothing is read past a slot. FUZZ_TRACE=1
 * prints what each key read back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "disk_record.h"
#include "disk_tier.h"
#include "fuzz.h"

#define SLOTS 16u

static char dir[64], path[96];
static struct kvp_layout layout;
static uint64_t slot_bytes;
static uint8_t *slot;
static bool trace; /* FUZZ_TRACE=1: what the scan kept and what read back */

static void quiet(int prio, const char *msg)
{
	(void)prio;
	(void)msg;
}

static void cleanup(void)
{
	unlink(path);
	rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[128];

	trace = getenv("FUZZ_TRACE") != NULL;
	if (kvp_layout_init(&layout, 2, 2, 16, KVP_DTYPE_BF16, 16, err, sizeof(err))) {
		fprintf(stderr, "fuzz_disk_scan: %s\n", err);
		abort();
	}
	slot_bytes = disk_slot_bytes(layout.page_bytes);
	slot = malloc(slot_bytes);
	snprintf(dir, sizeof(dir), "/tmp/kvpool-fuzz-disk-XXXXXX");
	if (!slot || !mkdtemp(dir))
		abort();
	snprintf(path, sizeof(path), "%s/kvpool.disk", dir);
	atexit(cleanup);
	return 0;
}

/* Slot i of the input at *off; false when the input is used up. */
static bool next_slot(const uint8_t *data, size_t size, size_t *off)
{
	struct disk_rec_hdr *h = (void *)slot;
	uint16_t plen = 0;
	size_t n;

	if (*off >= size)
		return false;
	memset(slot, 0, slot_bytes);
	n = size - *off < DISK_HDR_BYTES ? size - *off : DISK_HDR_BYTES;
	memcpy(slot, data + *off, n);
	*off += n;
	if (size - *off >= 2) {
		memcpy(&plen, data + *off, 2);
		*off += 2;
	}
	n = size - *off < plen ? size - *off : plen;
	if (n > slot_bytes - DISK_PAYLOAD_OFF)
		n = slot_bytes - DISK_PAYLOAD_OFF;
	memcpy(slot + DISK_PAYLOAD_OFF, data + *off, n);
	*off += n;
	if (h->magic == DISK_MAGIC && h->checksum != 1 &&
	    h->stored_len <= slot_bytes - DISK_PAYLOAD_OFF)
		disk_record_seal(h, slot + DISK_PAYLOAD_OFF);
	return true;
}

/* Read back what the scan kept under the key h names. */
static void read_back(struct disk_tier *dt, const struct disk_rec_hdr *h)
{
	struct disk_key k = { .tenant = h->tenant, .pool = h->pool, .user = h->id,
			      .kind = h->kind == DISK_KIND_USER ? 0 : h->kind };
	struct disk_hist hh;
	uint64_t start, len, sum = 0;
	uint32_t npages;
	int ret;

	memcpy(k.hash, h->hash, sizeof(k.hash));
	if (!disk_tier_info(dt, &k, &start, &len, &npages))
		return;
	fuzz_assert(npages >= 1 && npages <= SLOTS);
	fuzz_assert(len <= (uint64_t)npages * layout.page_tokens);
	while ((ret = disk_tier_get(dt, &k, &hh)) == -EINPROGRESS)
		disk_tier_wait(dt, &k);
	if (trace)
		fprintf(stderr, "fuzz_disk_scan: kind %u user %llu: %u pages on disk, "
			"get %d (%u pages)\n", k.kind, (unsigned long long)k.user, npages,
			ret, ret ? 0 : hh.npages);
	if (ret)
		return; /* a page failed its check on the way back: dropped */
	fuzz_assert(hh.npages >= 1 && hh.npages <= npages);
	for (uint32_t i = 0; i < hh.npages; i++) {
		const uint8_t *p = disk_tier_page(dt, &hh, i);

		for (uint64_t b = 0; b < layout.page_bytes; b += 64)
			sum += p[b];
	}
	disk_tier_take(dt, &hh);
	(void)sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct disk_tier_config c = { .dir = dir, .size = SLOTS * slot_bytes,
				      .layout = layout, .staging_bytes = SLOTS * slot_bytes,
				      .log = quiet };
	struct disk_rec_hdr hdrs[SLOTS];
	struct errbuf e = { .msg = "" };
	struct disk_tier *dt;
	size_t off = 0;
	uint32_t n = 0;
	uint64_t ids[SLOTS];
	int fd;

	unlink(path);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		abort();
	while (n < SLOTS && next_slot(data, size, &off)) {
		memcpy(&hdrs[n], slot, sizeof(hdrs[n]));
		if (pwrite(fd, slot, slot_bytes, (off_t)(n * slot_bytes)) !=
		    (ssize_t)slot_bytes)
			abort();
		n++;
	}
	close(fd);
	if (disk_tier_open(&dt, &c, &e)) {
		fprintf(stderr, "fuzz_disk_scan: %s\n", e.msg);
		abort();
	}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t all = disk_tier_list(dt, hdrs[i].tenant, hdrs[i].pool, 0, ids,
					      SLOTS);

		fuzz_assert(all <= SLOTS);
		read_back(dt, &hdrs[i]);
	}
	disk_tier_close(dt);
	return 0;
}
