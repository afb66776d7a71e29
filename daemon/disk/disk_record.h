/* SPDX-License-Identifier: MIT */
/*
 * disk_record.h - the self-describing record of one page on the disk tier.
 *
 * A record is one slot of a disk file: a 128-byte header in the slot's first
 * 4 KiB block (the rest of it zero), then from DISK_PAYLOAD_OFF on the page
 * as the codec stored it, then padding to the slot size (a multiple of 4096,
 * so O_DIRECT can move it). The page starts on a block of its own so that a
 * stored-as-is page moves straight between the file and a page-aligned host
 * frame (disk_tier_get_into), its header through a small buffer beside it. The header says whose page it is and where it goes,
 * so a warm restart rebuilds the index from the records alone:
 *
 *   tenant, pool  whose pool the page belongs to (xxh64 of the tenant name)
 *   kind, id/hash a user history (id), a chunk or a prefix page (hash)
 *   snap          the snapshot the page was written in: a history is written
 *                 whole, every page with the same snap, npages and [start,
 *                 start+len); the newest snap of a key wins on restart
 *   page, pos     its index in the snapshot and its first token position
 *   layout_id     the model geometry: another layout's record is skipped
 *   codec, lens   how the payload was stored, its stored and raw length
 *   checksum      xxh64 over the header (checksum field zero) and payload
 *
 * A torn write, a bit flip or a record of another layout fails
 * disk_record_check() and is never served. A freed slot gets a header with
 * DISK_FREE_MAGIC, which the scan skips silently.
 */
#ifndef KVPOOL_DISK_RECORD_H
#define KVPOOL_DISK_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define DISK_MAGIC 0x3145474150445056ull      /* "VPDPAGE1" little-endian */
#define DISK_FREE_MAGIC 0x3145455246445056ull /* "VPDFREE1" */
#define DISK_VERSION 2u  /* 1: the page right after the header */
#define DISK_HDR_BYTES 128u
#define DISK_ALIGN 4096u
#define DISK_PAYLOAD_OFF DISK_ALIGN /* the page's offset in its slot */

enum disk_kind {
	DISK_KIND_USER = 1,   /* a user history page: id = user id */
	DISK_KIND_CHUNK = 2,  /* a chunk page: hash = chunk id */
	DISK_KIND_PREFIX = 3, /* a prefix cache page: hash = block hash */
};

struct disk_rec_hdr {
	uint64_t magic;
	uint16_t version;
	uint8_t kind;        /* enum disk_kind */
	uint8_t codec;       /* enum disk_codec_id: how the payload is stored */
	uint32_t pool;       /* pool index of the tenant (one per GPU) */
	uint64_t layout_id;
	uint64_t tenant;     /* disk_tenant_key(name) */
	uint64_t id;         /* user id (DISK_KIND_USER) */
	uint8_t hash[32];    /* chunk id / block hash (other kinds) */
	uint64_t snap;       /* snapshot sequence: newest wins */
	uint64_t start;      /* history start when the snapshot was taken */
	uint64_t len;        /* history committed tokens then */
	uint64_t pos;        /* first token position of this page */
	uint32_t page;       /* index of this page in the snapshot */
	uint32_t npages;     /* pages in the snapshot */
	uint32_t raw_len;    /* page bytes (layout.page_bytes) */
	uint32_t stored_len; /* payload bytes that follow the header */
	uint64_t checksum;   /* xxh64 of header (this field 0) + payload */
};
_Static_assert(sizeof(struct disk_rec_hdr) == DISK_HDR_BYTES,
	       "the record header is part of the disk format");

/* Bytes of one slot for pages of page_bytes: the header's block, then the
 * page, 4K aligned. */
static inline uint64_t disk_slot_bytes(uint64_t page_bytes)
{
	return DISK_PAYLOAD_OFF +
	       ((page_bytes + DISK_ALIGN - 1) & ~(uint64_t)(DISK_ALIGN - 1));
}

/* A stable id of the geometry (xxh64 of its fields): records of another
 * layout are not this pool's. */
uint64_t disk_layout_id(const struct kvp_layout *l);
/* The id of a tensor-parallel pool's records (tp > 1): the layout's and
 * tp; disk_layout_id(l) for tp <= 1. */
uint64_t disk_layout_id_tp(const struct kvp_layout *l, uint32_t tp);
/* The tenant part of a record's key: xxh64 of its name. */
uint64_t disk_tenant_key(const char *name);

/* Fill the checksum of h over h and payload (h->stored_len bytes). */
void disk_record_seal(struct disk_rec_hdr *h, const void *payload);

/*
 * Check a record read back from a slot of slot_bytes: magic, version, sane
 * lengths, checksum. Returns 0, 1 for a freed slot (DISK_FREE_MAGIC or all
 * zero: never written), -EBADMSG for a torn or damaged record.
 */
int disk_record_check(const struct disk_rec_hdr *h, const void *payload,
		      uint64_t slot_bytes);

/*
 * disk_record_check for a record whose payload is not at hand: h's own
 * lengths bound it (a slot of disk_slot_bytes(h->raw_len), whatever the
 * reader's layout), and read(arg, off, buf, n) brings payload bytes
 * [off, off + n) in pieces of at most buf_bytes, returning how many came.
 * How the scan tells another layout's intact record from a damaged one of
 * its own: the checksum covers the layout field. Returns 0 or -EBADMSG.
 */
typedef int64_t (*disk_record_read_fn)(void *arg, uint64_t off, void *buf,
				       uint64_t n);
int disk_record_check_read(const struct disk_rec_hdr *h,
			   disk_record_read_fn read, void *arg, void *buf,
			   uint64_t buf_bytes);

#endif /* KVPOOL_DISK_RECORD_H */
