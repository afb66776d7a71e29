/* SPDX-License-Identifier: MIT */
/*
 * remote_value.h - how a page is named and stored in the remote tier.
 *
 * Key: "kvp1:<kind>:<layout id>:<tenant>:<hash>" in hex, e.g.
 *   kvp1:p:9f3a...:01c2...:5be0...(64 hex digits)
 * kind p = a prefix page (hash = its tenant-salted block hash), c = a chunk
 * page (hash = its name id, ":<page>" after it), u = a user history page
 * (16 hex digits of the user id, ":<page>"). A chunk's or a history's
 * record (what it is: its name, its length; the caller's bytes) is page
 * REMOTE_PAGE_REC, ":r" in the key. Readable with redis-cli, no '{' (no
 * hash tag: keys spread over every slot).
 *
 * A history's key holds only the user id, but the value's header holds
 * all of remote_key.hash: the user id, then the write id of the snapshot
 * the page belongs to. A history written again overwrites its keys in
 * place (no garbage in the store), and a reader that gets the record of
 * one snapshot and a page of another sees the page name the wrong hash
 * and drops it, as any value of another key.
 *
 * Value: the disk tier's record header (disk_record.h: kind, layout id,
 * tenant, hash, codec, lengths, xxhash64 over header and payload), then the
 * page as the disk tier's codec stored it (disk_codec.h). A value is
 * served only when it checks and names exactly the key it was fetched
 * under and this daemon's layout: a torn, flipped or misplaced value is
 * dropped (counted), never copied into a frame.
 */
#ifndef KVPOOL_REMOTE_VALUE_H
#define KVPOOL_REMOTE_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "disk_codec.h"
#include "disk_record.h"

/* "kvp1:p:" + 16 + ":" + 16 + ":" + 64 + NUL */
#define REMOTE_KEY_MAX 112

struct remote_key {
	uint8_t kind;        /* DISK_KIND_PREFIX, DISK_KIND_CHUNK, DISK_KIND_USER */
	uint64_t layout_id;  /* disk_layout_id() */
	uint64_t tenant;     /* disk_tenant_key() */
	uint8_t hash[32];    /* block hash / chunk id; user id in its first 8
			      * bytes (then the snapshot's write id) */
	uint32_t page;       /* page of a chunk or history (0 for prefix pages),
			      * or REMOTE_PAGE_REC */
};

/* The page index of a chunk's or a history's record: a value shorter than
 * a page (the caller's format), found before the pages it names. */
#define REMOTE_PAGE_REC UINT32_MAX

/* Write k's key into buf (REMOTE_KEY_MAX bytes); returns its length. */
size_t remote_key_format(const struct remote_key *k, char *buf);

/* Bytes a value of a page of page_bytes can take at most. */
static inline size_t remote_value_max(uint64_t page_bytes)
{
	return DISK_HDR_BYTES + page_bytes;
}

/*
 * Encode page (len bytes: page_bytes for a page, at most that for a
 * record) as k's value into out (remote_value_max(len) bytes). Returns the
 * value's length.
 */
size_t remote_value_encode(struct disk_codec_ctx *x, const struct disk_codec *c,
			   const struct remote_key *k, const void *page,
			   uint64_t len, void *out);

/*
 * Check a value fetched under k and decode its page into dst (page_bytes;
 * a record shorter than that is followed by zeros). 0, or -EBADMSG:
 * damaged, another key's, or another layout's.
 */
int remote_value_decode(struct disk_codec_ctx *x, const struct remote_key *k,
			const void *val, size_t len, void *dst, uint64_t page_bytes);

/*
 * The page inside a value fetched under k, when it checks (as decode) and
 * is stored as is: no copy. NULL when it is compressed (decode it) or does
 * not check (then decode says -EBADMSG).
 */
const void *remote_value_page(const struct remote_key *k, const void *val, size_t len,
			      uint64_t page_bytes);

#endif /* KVPOOL_REMOTE_VALUE_H */
