/* SPDX-License-Identifier: MIT */
/*
 * disk_scan.c - the warm restart: rebuild the disk tier's index from the
 * records in its file (disk_tier.h, disk_record.h).
 *
 * Every slot is read and checked. For each (tenant, pool, user) only the
 * newest snapshot counts (an older one is stale: the history came back to
 * memory and moved on since), and of it the pages 0..k-1 that all check:
 * a hole (a torn or damaged page, one never written before a crash) keeps
 * only the prefix before it, as continuity demands. A snapshot without its
 * page 0 is gone. Prefix pages and chunks (kind and hash in the key) come
 * back the same way but whole or not at all: a chunk without one of its
 * pages or its name record is skipped. Damaged records and other layouts'
 * records are skipped, with one warning each saying how many; a record is
 * another layout's only when its checksum (which covers the layout field)
 * holds, so a bit flip there counts as damage, not as another model.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "disk_tier_internal.h"

struct scan_rec {
	uint64_t tenant, user, snap, start, len;
	uint32_t pool, page, npages, slot;
	uint8_t kind;     /* disk_key.kind: 0 for a user history */
	uint8_t hash[32];
};

/* Same key but for user and snap: kind and hash. */
static int kind_cmp(const struct scan_rec *x, const struct scan_rec *y)
{
	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	return memcmp(x->hash, y->hash, sizeof(x->hash));
}

static int rec_cmp(const void *a, const void *b)
{
	const struct scan_rec *x = a, *y = b;

	if (x->tenant != y->tenant)
		return x->tenant < y->tenant ? -1 : 1;
	if (x->pool != y->pool)
		return x->pool < y->pool ? -1 : 1;
	if (x->user != y->user)
		return x->user < y->user ? -1 : 1;
	if (kind_cmp(x, y))
		return kind_cmp(x, y);
	if (x->snap != y->snap)
		return x->snap > y->snap ? -1 : 1; /* newest first */
	return x->page < y->page ? -1 : x->page > y->page;
}

static bool same_snap(const struct scan_rec *a, const struct scan_rec *b)
{
	return a->tenant == b->tenant && a->pool == b->pool &&
	       a->user == b->user && a->snap == b->snap && !kind_cmp(a, b);
}

static bool same_key(const struct scan_rec *a, const struct scan_rec *b)
{
	return a->tenant == b->tenant && a->pool == b->pool && a->user == b->user &&
	       !kind_cmp(a, b);
}

/* Entries for the newest snapshot of each key in r[0..n) (sorted). */
static int build(struct disk_tier *dt, struct scan_rec *r, uint32_t n,
		 bool *used, uint64_t *kept)
{
	for (uint32_t i = 0; i < n;) {
		uint32_t j = i, k = 0;
		struct disk_entry *e;

		while (j < n && same_snap(&r[i], &r[j]))
			j++;
		/* Pages 0..k-1 present in a row (sorted by page; a page seen
		 * twice in one snapshot cannot be: a slot holds one page). */
		while (i + k < j && r[i + k].page == k && r[i + k].npages == r[i].npages &&
		       r[i + k].start == r[i].start && r[i + k].len == r[i].len)
			k++;
		/* A prefix page or a chunk is whole or nothing. */
		if (r[i].kind && k != r[i].npages)
			k = 0;
		if (k) {
			e = disk_entry_new(k);
			if (!e)
				return -ENOMEM;
			e->k = (struct disk_key){ .tenant = r[i].tenant,
						  .pool = r[i].pool,
						  .user = r[i].user,
						  .kind = r[i].kind };
			memcpy(e->k.hash, r[i].hash, sizeof(e->k.hash));
			e->start = r[i].start;
			e->len = r[i].len;
			if ((uint64_t)k * dt->P < e->len)
				e->len = (uint64_t)k * dt->P;
			e->snap = r[i].snap;
			e->state = DS_ONDISK;
			for (uint32_t p = 0; p < k; p++) {
				e->slot[p] = r[i + p].slot;
				used[r[i + p].slot] = true;
			}
			disk_use_of(dt, e->k.tenant)->slots += k;
			disk_index_insert(dt, e);
			disk_lru_push(dt, e);
			*kept += k;
		}
		/* Older snapshots of the key: stale, their slots free. */
		while (j < n && same_key(&r[i], &r[j]))
			j++;
		i = j;
	}
	return 0;
}

#define OTHER_BUF_BYTES (1u << 20) /* pieces of another layout's payload */

/* What the scan has found so far. */
struct scan_acc {
	struct scan_rec *r;
	uint32_t nr;
	uint64_t bad, other;
	void *buf;               /* OTHER_BUF_BYTES, DISK_ALIGN aligned; lazy */
};

struct other_read {
	struct disk_tier *dt;
	uint64_t payload_off;    /* in the file */
};

static int64_t other_read(void *arg, uint64_t off, void *buf, uint64_t n)
{
	struct other_read *o = arg;

	return disk_store_read_at(o->dt->st, o->payload_off + off, buf, n);
}

/*
 * A record at slot whose header names another layout, and which did not
 * check as one of our slot's size: intact (0) if its checksum holds over
 * its own length, read from the file; else damaged (-EBADMSG). A bit flip
 * in the layout field lands here and fails: the checksum covers the field,
 * so damage is never taken for another model.
 */
static int other_intact(struct disk_tier *dt, struct scan_acc *a, uint32_t slot,
			const struct disk_rec_hdr *h)
{
	struct other_read o = {
		.dt = dt,
		.payload_off = (uint64_t)slot * dt->slot_bytes + DISK_PAYLOAD_OFF,
	};

	if (!a->buf && posix_memalign(&a->buf, DISK_ALIGN, OTHER_BUF_BYTES))
		a->buf = NULL;
	if (!a->buf)
		return -ENOMEM;
	return disk_record_check_read(h, other_read, &o, a->buf, OTHER_BUF_BYTES);
}

/* Read slots [first, first+n) into staging and sort what they hold. */
static void scan_batch(struct disk_tier *dt, uint32_t first, uint32_t n,
		       struct disk_io *io, struct scan_acc *a)
{
	for (uint32_t i = 0; i < n; i++)
		io[i] = (struct disk_io){ .slot = first + i,
					  .buf = dt->stage_base + (uint64_t)i * dt->slot_bytes };
	disk_store_rw(dt->st, false, io, n);
	for (uint32_t i = 0; i < n; i++) {
		const char *s = io[i].buf;
		const struct disk_rec_hdr *h = (const void *)s;
		struct scan_rec *r = &a->r[a->nr];
		int c;

		if (io[i].res) {
			a->bad++; /* unreadable: never served */
			continue;
		}
		c = disk_record_check(h, s + DISK_PAYLOAD_OFF, dt->slot_bytes);
		if (c == 1)
			continue;
		/* Another layout's record has slots of another size: check it
		 * at its own length before believing its layout field. */
		if (c < 0 && h->magic == DISK_MAGIC && h->layout_id != dt->layout_id)
			c = other_intact(dt, a, first + i, h);
		if (c < 0) {
			a->bad++;
			continue;
		}
		if (h->layout_id != dt->layout_id || h->raw_len != dt->page_bytes) {
			a->other++;
			continue;
		}
		if (h->kind != DISK_KIND_USER && h->kind != DISK_KIND_CHUNK &&
		    h->kind != DISK_KIND_PREFIX) {
			a->bad++; /* checks, yet of no kind: never served */
			continue;
		}
		*r = (struct scan_rec){
			.tenant = h->tenant, .user = h->id, .snap = h->snap,
			.start = h->start, .len = h->len, .pool = h->pool,
			.page = h->page, .npages = h->npages, .slot = first + i,
			.kind = h->kind == DISK_KIND_USER ? 0 : h->kind,
		};
		memcpy(r->hash, h->hash, sizeof(h->hash));
		a->nr++;
		if (h->snap >= dt->next_snap)
			dt->next_snap = h->snap + 1;
	}
}

int disk_scan(struct disk_tier *dt, struct errbuf *e)
{
	uint32_t nslots = disk_store_slots(dt->st);
	uint64_t kept = 0;
	struct scan_acc a = { .r = malloc((size_t)nslots * sizeof(*a.r)) };
	bool *used = calloc(nslots, sizeof(*used));
	struct disk_io *io = malloc(dt->nstage * sizeof(*io));
	int ret = 0;

	if (!a.r || !used || !io) {
		ret = errbuf_set(e, -ENOMEM, "disk tier: out of memory scanning %"
				 PRIu32 " slots", nslots);
		goto out;
	}
	for (uint32_t s = 0; s < nslots; s += dt->nstage) {
		uint32_t n = nslots - s < dt->nstage ? nslots - s : dt->nstage;

		scan_batch(dt, s, n, io, &a);
	}
	qsort(a.r, a.nr, sizeof(*a.r), rec_cmp);
	ret = build(dt, a.r, a.nr, used, &kept);
	if (ret) {
		errbuf_set(e, ret, "disk tier: out of memory rebuilding the index");
		goto out;
	}
	for (uint32_t s = nslots; s-- > 0;)
		if (!used[s])
			dt->free_slots[dt->nfree++] = s;
	/* A file of another layout is misaligned with ours: what looks
	 * damaged in it is the other layout's too. Only an intact record of
	 * another layout says so (other_intact): damage alone never does. */
	if (a.other) {
		a.other += a.bad;
		a.bad = 0;
	}
	dt->bad_records = a.bad;
	dt->other_records = a.other;
	if (a.bad)
		disk_logf(dt, LOG_WARNING, "disk tier: %" PRIu64 " damaged or torn "
			  "records skipped (never served)", a.bad);
	if (a.other)
		disk_logf(dt, LOG_WARNING, "disk tier: %" PRIu64 " records of another "
			  "layout skipped (disk_dir was used with another model; "
			  "their slots are reused)",
			  a.other);
	if (kept)
		disk_logf(dt, LOG_INFO, "disk tier: warm restart: %" PRIu64 " pages "
			  "of %" PRIu64 " slots kept", kept, (uint64_t)nslots);
out:
	free(a.r);
	free(a.buf);
	free(used);
	free(io);
	return ret;
}
