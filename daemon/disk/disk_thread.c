/* SPDX-License-Identifier: MIT */
/*
 * disk_thread.c - the disk tier's thread: it writes queued histories, reads
 * wanted ones back and marks freed snapshots free on disk; and the tier's
 * open and close (disk_tier.h).
 *
 * One pass takes what is queued (up to DISK_BATCH_PAGES pages each way),
 * drops the lock, and does the I/O through one queue (disk_store_submit):
 * each history's writes are submitted as soon as it is sealed, so the disk
 * writes one while the next is sealed; the reads follow in the same queue
 * (checked as their runs land) and the invalidations after them; one drain,
 * and it takes the lock again to publish the results. A ring worker never
 * waits for a pass: it finds the result on its next retry.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "disk_tier_internal.h"

/*
 * One pass of the thread. Its pages each way are in staging (a queued or
 * read entry holds its staging slots), so the per-page arrays have nstage
 * rows (at least DISK_BATCH_PAGES, for the invalidations): a history may
 * be longer than a batch.
 */
struct pass {
	struct disk_entry *w[DISK_BATCH_PAGES], *r[DISK_BATCH_PAGES];
	uint32_t nw, nr;
	uint32_t wbeg[DISK_BATCH_PAGES + 1]; /* w[j]'s rows of io */
	struct disk_io *io;      /* the writes' rows, then the reads' (rio) */
	/* reads: rio[k] is page page[k] of r[ent[k]]; ok[k] once checked */
	struct disk_io *rio;
	uint32_t *ent, *page, nrio;
	bool *ok;
	struct disk_tier *dt;
	uint32_t inval[DISK_BATCH_PAGES], ninval;
	struct disk_io iv[DISK_BATCH_PAGES]; /* the invalidations' blocks */
};

static void pass_free(struct pass *p)
{
	if (!p)
		return;
	free(p->io);
	free(p->ent);
	free(p->page);
	free(p->ok);
	free(p);
}

static struct pass *pass_new(uint32_t nstage)
{
	uint32_t rows = nstage > DISK_BATCH_PAGES ? nstage : DISK_BATCH_PAGES;
	struct pass *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	/* A pass's writes and reads are in flight together. */
	p->io = calloc(2 * (size_t)rows, sizeof(*p->io));
	p->ent = calloc(rows, sizeof(*p->ent));
	p->page = calloc(rows, sizeof(*p->page));
	p->ok = calloc(rows, sizeof(*p->ok));
	if (!p->io || !p->ent || !p->page || !p->ok) {
		pass_free(p);
		return NULL;
	}
	return p;
}

/* The oldest history on disk of tenant t (any tenant: t == 0 and !own). */
static struct disk_entry *lru_victim(struct disk_tier *dt, uint64_t t, bool own)
{
	struct disk_entry *v;

	list_for_each_entry(v, &dt->lru, lru)
		if (!own || v->k.tenant == t)
			return v;
	return NULL;
}

/*
 * Disk slots for e: past disk_size or the tenant's quota, the oldest
 * histories on disk (the tenant's own, for its quota) are dropped. false:
 * the rest is being read or written; e gets no slots.
 */
static bool slots_take(struct disk_tier *dt, struct disk_entry *e)
{
	struct disk_use *u = disk_use_of(dt, e->k.tenant);

	for (;;) {
		bool over = u->quota && u->slots + e->npages > u->quota;
		struct disk_entry *v;
		char what[80];

		if (!over && dt->nfree >= e->npages)
			break;
		v = lru_victim(dt, e->k.tenant, over);
		if (!v)
			return false;
		/* Dropped for room: its slots are overwritten soon, and a
		 * restart that finds it anyway serves what it held. */
		disk_key_name(&v->k, what, sizeof(what));
		disk_logf(dt, LOG_INFO, "disk tier full%s: dropped the %" PRIu32
			  " pages of %s (the oldest there); raise "
			  "disk_size%s to keep more", over ? " (the tenant's quota)" :
			  "", v->npages, what, over ? " of the tenant" : "");
		disk_use_of(dt, v->k.tenant)->dropped_pages += v->npages;
		disk_lru_unlink_drop(dt, v);
	}
	/* Lowest first: a history's pages land in runs. */
	for (uint32_t i = 0; i < e->npages; i++)
		e->slot[i] = dt->free_slots[--dt->nfree];
	u->slots += e->npages;
	return true;
}

/* Locked: move queued work into the pass. */
static void pass_take(struct disk_tier *dt, struct pass *p)
{
	uint32_t pages = 0;

	p->nw = p->nr = 0;
	while (dt->wq.head && p->nw < DISK_BATCH_PAGES &&
	       (!pages || pages + dt->wq.head->npages <= DISK_BATCH_PAGES)) {
		struct disk_entry *e = dt->wq.head;

		dt->wq.head = e->qnext;
		if (!dt->wq.head)
			dt->wq.tail = NULL;
		if (!slots_take(dt, e)) {
			struct disk_use *u = disk_use_of(dt, e->k.tenant);
			uint32_t np = e->npages;
			char what[80];

			disk_key_name(&e->k, what, sizeof(what));
			u->dropped_pages += e->npages;
			disk_index_remove(dt, e);
			disk_entry_destroy(dt, e, false);
			disk_logf(dt, LOG_WARNING, "disk tier full: %" PRIu32
				  " pages of %s dropped (the rest "
				  "is being read or written); raise disk_size",
				  np, what);
			continue;
		}
		e->state = DS_WRITING;
		p->w[p->nw++] = e;
		pages += e->npages;
	}
	pages = 0;
	while (dt->rq.head && p->nr < DISK_BATCH_PAGES &&
	       (!pages || pages + dt->rq.head->npages <= DISK_BATCH_PAGES)) {
		struct disk_entry *e = dt->rq.head;

		dt->rq.head = e->qnext;
		if (!dt->rq.head)
			dt->rq.tail = NULL;
		p->r[p->nr++] = e;
		pages += e->npages;
	}
	p->ninval = dt->ninval < DISK_BATCH_PAGES ? dt->ninval : DISK_BATCH_PAGES;
	dt->ninval -= p->ninval;
	memcpy(p->inval, dt->inval + dt->ninval, p->ninval * sizeof(*p->inval));
}

/* Unlocked: header and payload of page i of e in its staging slot. */
static void seal_page(struct disk_tier *dt, struct disk_entry *e, uint32_t i,
		      uint64_t *stored)
{
	char *s = dt->stage_base + (uint64_t)e->stage[i] * dt->slot_bytes;
	struct disk_rec_hdr *h = (struct disk_rec_hdr *)s;
	uint8_t id = DISK_CODEC_NONE;
	size_t n = dt->page_bytes;

	if (dt->codec.id != DISK_CODEC_NONE) {
		n = disk_codec_encode(dt->cx, &dt->codec, s + DISK_PAYLOAD_OFF,
				      dt->page_bytes, dt->raw, dt->page_bytes, &id);
		memcpy(s + DISK_PAYLOAD_OFF, dt->raw, n);
	}
	*h = (struct disk_rec_hdr){
		.magic = DISK_MAGIC, .version = DISK_VERSION,
		.kind = e->k.kind ? e->k.kind : DISK_KIND_USER, .codec = id,
		.pool = e->k.pool,
		.layout_id = dt->layout_id, .tenant = e->k.tenant, .id = e->k.user,
		.snap = e->snap, .start = e->start, .len = e->len,
		.pos = e->start + (uint64_t)i * dt->P, .page = i,
		.npages = e->npages, .raw_len = (uint32_t)dt->page_bytes,
		.stored_len = (uint32_t)n,
	};
	memcpy(h->hash, e->k.hash, sizeof(h->hash));
	/* Zero the slot's tail: no stale bytes of an older page on disk. */
	memset(s + DISK_HDR_BYTES, 0, DISK_PAYLOAD_OFF - DISK_HDR_BYTES);
	memset(s + DISK_PAYLOAD_OFF + n, 0, dt->slot_bytes - DISK_PAYLOAD_OFF - n);
	disk_record_seal(h, s + DISK_PAYLOAD_OFF);
	*stored += n;
}

static int io_cmp(const void *a, const void *b)
{
	const struct disk_io *x = a, *y = b;

	return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/*
 * Unlocked: check and decode page i of e read into its staging slot.
 * false: the record is damaged, torn or not the one expected.
 */
static bool open_page(struct disk_tier *dt, struct disk_entry *e, uint32_t i)
{
	const struct disk_rec_hdr *h = (const void *)disk_rec_of(dt, e, i);
	char *s = disk_payload_of(dt, e, i);

	if (disk_record_check(h, s, dt->slot_bytes) ||
	    h->layout_id != dt->layout_id || h->tenant != e->k.tenant ||
	    h->pool != e->k.pool || h->id != e->k.user || h->snap != e->snap ||
	    h->kind != (e->k.kind ? e->k.kind : DISK_KIND_USER) ||
	    memcmp(h->hash, e->k.hash, sizeof(h->hash)) ||
	    h->page != i || h->raw_len != dt->page_bytes)
		return false;
	if (h->codec == DISK_CODEC_NONE)
		return h->stored_len == dt->page_bytes;
	if (disk_codec_decode(dt->cx, h->codec, s, h->stored_len, dt->raw,
			      dt->page_bytes))
		return false;
	memcpy(s, dt->raw, dt->page_bytes);
	return true;
}

/*
 * Unlocked: page i of e, sealed in its staging slot a moment ago and
 * written since, made ready where it is: as written (no check needed: it
 * never left this memory), or decoded in place.
 */
static bool stage_page_ready(struct disk_tier *dt, struct disk_entry *e,
			     uint32_t i)
{
	char *s = dt->stage_base + (uint64_t)e->stage[i] * dt->slot_bytes;
	const struct disk_rec_hdr *h = (const struct disk_rec_hdr *)s;

	if (h->codec == DISK_CODEC_NONE)
		return true;
	if (disk_codec_decode(dt->cx, h->codec, s + DISK_PAYLOAD_OFF, h->stored_len,
			      dt->raw, dt->page_bytes))
		return false;
	memcpy(s + DISK_PAYLOAD_OFF, dt->raw, dt->page_bytes);
	return true;
}

/*
 * Unlocked: seal and submit the pass's writes, entry by entry, so the disk
 * writes one history while the next is sealed (xxhash64, the codec). Entry
 * j's slots are io[wbeg[j], wbeg[j+1]).
 */
static uint32_t pass_write_submit(struct disk_tier *dt, struct pass *p,
				  uint64_t *stored)
{
	uint32_t n = 0;

	for (uint32_t j = 0; j < p->nw; j++) {
		struct disk_entry *e = p->w[j];
		uint64_t t0 = disk_now_ns();

		p->wbeg[j] = n;
		stored[j] = 0;
		for (uint32_t i = 0; i < e->npages; i++) {
			seal_page(dt, e, i, &stored[j]);
			p->io[n++] = (struct disk_io){
				.slot = e->slot[i],
				.buf = dt->stage_base +
				       (uint64_t)e->stage[i] * dt->slot_bytes,
			};
		}
		dt->codec_ns += dt->codec.id != DISK_CODEC_NONE ?
				disk_now_ns() - t0 : 0;
		/* Sorted by slot: runs of a history go as one SQE. */
		qsort(p->io + p->wbeg[j], n - p->wbeg[j], sizeof(*p->io), io_cmp);
		disk_store_submit(dt->st, true, p->io + p->wbeg[j],
				  n - p->wbeg[j], NULL, NULL);
	}
	p->wbeg[p->nw] = n;
	return n;
}

/* After the drain: per entry, whether every page landed. */
static void pass_write_check(struct disk_tier *dt, struct pass *p, bool *ok)
{
	for (uint32_t j = 0; j < p->nw; j++) {
		ok[j] = true;
		for (uint32_t x = p->wbeg[j]; x < p->wbeg[j + 1]; x++)
			if (p->io[x].res) {
				ok[j] = false;
				dt->last_err = p->io[x].res;
			}
	}
}

/* A run of reads landed: check and decode its pages now, while the disk
 * reads the rest. */
static void read_landed(void *arg, uint32_t i, uint32_t k)
{
	struct pass *p = arg;

	for (uint32_t x = i; x < i + k; x++)
		p->ok[x] = !p->rio[x].res &&
			   open_page(p->dt, p->r[p->ent[x]], p->page[x]);
}

/* Rows of entry j, page by page, from row n on. */
static uint32_t read_rows(struct disk_tier *dt, struct pass *p, uint32_t j,
			  uint32_t n)
{
	struct disk_entry *e = p->r[j];

	for (uint32_t i = 0; i < e->npages; i++, n++) {
		/* Into the caller's memory: the header block apart. */
		p->rio[n] = (struct disk_io){
			.slot = e->slot[i],
			.buf = e->into ? e->dst[i] : disk_rec_of(dt, e, i),
			.hdr = e->into ? disk_rec_of(dt, e, i) : NULL,
		};
		p->ent[n] = j;
		p->page[n] = i;
		p->ok[n] = false; /* until its run lands and checks */
	}
	return n;
}

/*
 * Unlocked: submit the pass's reads behind its writes (the queue stays
 * full across both), then, while the disk works, make ready the entries
 * whose pages are still in staging (a get came while they were written):
 * they need no I/O, only their compressed pages decoded in place.
 */
static void pass_read_submit(struct disk_tier *dt, struct pass *p, uint32_t off)
{
	uint32_t n = 0, m;

	p->rio = p->io + off;
	p->dt = dt;
	for (uint32_t j = 0; j < p->nr; j++)
		if (!p->r[j]->in_stage)
			n = read_rows(dt, p, j, n);
	disk_store_submit(dt->st, false, p->rio, n, read_landed, p);
	for (uint32_t j = 0; j < p->nr; j++) {
		if (!p->r[j]->in_stage)
			continue;
		m = read_rows(dt, p, j, n);
		for (; n < m; n++)
			p->ok[n] = stage_page_ready(dt, p->r[j], p->page[n]);
	}
	p->nrio = n;
}

/* After the drain: per entry, pages that came back good in a row from
 * page 0 (an entry's rows are in page order). */
static void pass_read_check(struct pass *p, uint32_t *good)
{
	for (uint32_t j = 0; j < p->nr; j++)
		good[j] = 0;
	for (uint32_t x = 0; x < p->nrio; x++)
		if (good[p->ent[x]] == p->page[x] && p->ok[x])
			good[p->ent[x]]++;
}

/* Unlocked: mark the pass's freed snapshots free on disk (their page 0):
 * one block each, the header's; the rest of the slot can stay. */
static void pass_inval_submit(struct disk_tier *dt, struct pass *p)
{
	for (uint32_t i = 0; i < p->ninval; i++)
		p->iv[i] = (struct disk_io){ .slot = p->inval[i],
					     .buf = dt->inval_block };
	disk_store_submit_heads(dt->st, p->iv, p->ninval);
}

/* Unlocked: the pass's I/O, all of it in one queue, then one drain. */
static void pass_io(struct disk_tier *dt, struct pass *p, bool *ok,
		    uint64_t *stored, uint32_t *good)
{
	uint64_t t0 = disk_now_ns(), t1;
	uint32_t nw = pass_write_submit(dt, p, stored);

	t1 = disk_now_ns();
	pass_read_submit(dt, p, nw);
	pass_inval_submit(dt, p);
	disk_store_drain(dt->st);
	/* Writes and reads overlap now: each side is charged the pass's
	 * time while it had I/O in it. */
	if (p->nw)
		dt->write_ns += disk_now_ns() - t0;
	if (p->nr)
		dt->read_ns += disk_now_ns() - t1;
	pass_write_check(dt, p, ok);
	pass_read_check(p, good);
}

/* Locked: e is gone; a held one waits for its holder's poll to free it
 * (the holder's memory is no longer being written). */
static void finish_gone(struct disk_tier *dt, struct disk_entry *e)
{
	if (e->held) {
		e->gone = true;
		e->state = DS_READY;
		return;
	}
	disk_entry_destroy(dt, e, true);
}

/* Locked: publish a written entry. */
static void finish_write(struct disk_tier *dt, struct disk_entry *e, bool ok,
			 uint64_t stored)
{
	struct disk_use *u = disk_use_of(dt, e->k.tenant);

	if (!ok) {
		char what[80];

		disk_key_name(&e->k, what, sizeof(what));
		u->dropped_pages += e->npages;
		if (!e->gone)
			disk_index_remove(dt, e);
		disk_logf(dt, LOG_WARNING, "disk tier: writing %" PRIu32 " pages of "
			  "%s failed (%s); dropped, as without a disk "
			  "tier%s", e->npages, what, strerror(-dt->last_err),
			  dt->last_err == -ENOSPC ? "; the disk is full: free space "
			  "or lower disk_size" : "");
		finish_gone(dt, e);
		return;
	}
	u->demoted_pages += e->npages;
	u->bytes_raw += (uint64_t)e->npages * dt->page_bytes;
	u->bytes_stored += stored;
	if (e->gone) {
		finish_gone(dt, e);
		return;
	}
	if (e->want) {
		/* A get came while it was written: the pages are still in
		 * staging (encoded): the next pass makes them ready there, no
		 * read (a prepare right after a demotion waits for the write,
		 * not for a write and a read). */
		e->want = false;
		e->in_stage = true;
		e->state = DS_READING;
		e->qnext = NULL;
		if (dt->rq.tail)
			dt->rq.tail->qnext = e;
		else
			dt->rq.head = e;
		dt->rq.tail = e;
		return;
	}
	e->state = DS_ONDISK;
	/* Staging back: the pages live on disk now. */
	for (uint32_t i = e->npages; i-- > 0;) {
		dt->stage_free[dt->nstage_free++] = e->stage[i];
		e->stage[i] = DISK_NONE;
	}
	disk_lru_push(dt, e);
}

/* Locked: publish a read entry; a bad page cuts the history there. */
static void finish_read(struct disk_tier *dt, struct disk_entry *e, uint32_t good)
{
	struct disk_use *u = disk_use_of(dt, e->k.tenant);

	e->in_stage = false;
	disk_hblk_release(dt, e); /* the headers are checked */
	if (good < e->npages && !e->gone) {
		char what[80];

		disk_key_name(&e->k, what, sizeof(what));
		if (e->k.kind)
			good = 0; /* a prefix page or a chunk: whole or nothing */
		dt->bad_records++;
		disk_logf(dt, LOG_WARNING, "disk tier: %s: page %" PRIu32
			  " of %" PRIu32 " read back damaged (checksum, torn write or "
			  "I/O error); kept the %" PRIu32 " pages before it", what,
			  good, e->npages, good);
		disk_use_count(u, e, -1);
		u->dropped_pages += e->npages - good;
		for (uint32_t i = good; i < e->npages; i++) {
			if (e->stage[i] != DISK_NONE)
				dt->stage_free[dt->nstage_free++] = e->stage[i];
			dt->free_slots[dt->nfree++] = e->slot[i];
			u->slots--;
			e->stage[i] = e->slot[i] = DISK_NONE;
		}
		e->npages = good;
		disk_use_count(u, e, 1);
		if ((uint64_t)good * dt->P < e->len)
			e->len = (uint64_t)good * dt->P;
		if (!good) {
			disk_index_remove(dt, e);
			finish_gone(dt, e);
			return;
		}
	}
	if (e->gone) {
		finish_gone(dt, e);
		return;
	}
	if (e->into)
		dt->into_pages += e->npages;
	e->state = DS_READY;
	e->ready_ns = disk_now_ns();
}

/* Locked: register a queued host tier, unlocked meanwhile (it pins and
 * faults in every page of it). */
static void host_register(struct disk_tier *dt)
{
	void *base = dt->reg_q[--dt->nreg_q].base;
	uint64_t bytes = dt->reg_q[dt->nreg_q].bytes;

	dt->registering = base;
	pthread_mutex_unlock(&dt->mu);
	disk_store_register(dt->st, base, bytes, dt->page_bytes);
	pthread_mutex_lock(&dt->mu);
	dt->registering = NULL;
	pthread_cond_broadcast(&dt->done);
}

static void *disk_thread(void *arg)
{
	struct disk_tier *dt = arg;
	struct pass *p = dt->pass;
	uint64_t stored[DISK_BATCH_PAGES];
	uint32_t good[DISK_BATCH_PAGES];
	bool ok[DISK_BATCH_PAGES];

	pthread_mutex_lock(&dt->mu);
	for (;;) {
		while (!dt->stop && !dt->wq.head && !dt->rq.head && !dt->ninval &&
		       !dt->nreg_q) {
			dt->idle = true;
			pthread_cond_broadcast(&dt->done);
			pthread_cond_wait(&dt->work, &dt->mu);
		}
		if (dt->stop && !dt->wq.head && !dt->rq.head && !dt->ninval)
			break;
		dt->idle = false;
		if (dt->nreg_q) {
			host_register(dt);
			continue;
		}
		pass_take(dt, p);
		pthread_mutex_unlock(&dt->mu);
		pass_io(dt, p, ok, stored, good);
		pthread_mutex_lock(&dt->mu);
		for (uint32_t i = 0; i < p->ninval; i++)
			dt->free_slots[dt->nfree++] = p->inval[i];
		for (uint32_t j = 0; j < p->nw; j++)
			finish_write(dt, p->w[j], ok[j], stored[j]);
		for (uint32_t j = 0; j < p->nr; j++)
			finish_read(dt, p->r[j], good[j]);
		__atomic_add_fetch(&dt->progress, 1, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&dt->done);
	}
	dt->idle = true;
	pthread_cond_broadcast(&dt->done);
	pthread_mutex_unlock(&dt->mu);
	return NULL;
}

/* ------------------------------------------------------------ open, close */

/* A missing or unwritable disk_dir is a startup error naming the fix. */
static int check_dir(const char *dir, struct errbuf *e)
{
	struct stat sb;

	if (stat(dir, &sb))
		return errbuf_set(e, -errno, "disk_dir %s: %s; create it (mkdir -p "
				  "%s, owned by kvpoold's user) or set disk_dir to "
				  "an existing directory", dir, strerror(errno), dir);
	if (!S_ISDIR(sb.st_mode))
		return errbuf_set(e, -ENOTDIR, "disk_dir %s is not a directory; set "
				  "disk_dir to a directory", dir);
	if (access(dir, W_OK | X_OK))
		return errbuf_set(e, -EACCES, "disk_dir %s is not writable by uid %u "
				  "(%s); chown it to kvpoold's user or choose another "
				  "disk_dir", dir, (unsigned)geteuid(), strerror(errno));
	return 0;
}

static int tier_alloc(struct disk_tier *dt, const struct disk_tier_config *c,
		      struct errbuf *e)
{
	uint32_t nslots = disk_store_slots(dt->st);
	uint64_t staging = c->staging_bytes ? c->staging_bytes : DISK_STAGING_DEFAULT;
	struct disk_rec_hdr *h;

	dt->nstage = (uint32_t)(staging / dt->slot_bytes);
	if (dt->nstage < 4)
		dt->nstage = 4;
	if (dt->nstage > nslots)
		dt->nstage = nslots;
	dt->stage_base = aligned_alloc(DISK_ALIGN, dt->nstage * dt->slot_bytes);
	dt->hblk_base = aligned_alloc(DISK_ALIGN, (uint64_t)dt->nstage * DISK_ALIGN);
	dt->hblk_free = malloc(dt->nstage * sizeof(uint32_t));
	dt->stage_free = malloc(dt->nstage * sizeof(uint32_t));
	dt->free_slots = malloc(nslots * sizeof(uint32_t));
	dt->inval = malloc(nslots * sizeof(uint32_t));
	dt->inval_cap = nslots;
	dt->inval_block = aligned_alloc(DISK_ALIGN, DISK_ALIGN);
	dt->nbucket = nslots < 64 ? 64 : nslots;
	dt->bucket = calloc(dt->nbucket, sizeof(*dt->bucket));
	dt->cx = disk_codec_ctx_new(dt->page_bytes);
	dt->raw = malloc(dt->page_bytes);
	dt->pass = pass_new(dt->nstage);
	if (!dt->stage_base || !dt->stage_free || !dt->hblk_base || !dt->hblk_free || !dt->free_slots || !dt->inval ||
	    !dt->inval_block || !dt->bucket || !dt->cx || !dt->raw || !dt->pass)
		return errbuf_set(e, -ENOMEM, "disk tier: out of memory for %" PRIu32
				  " staging pages of %" PRIu64 " bytes", dt->nstage,
				  dt->slot_bytes);
	/* Fixed buffers: no page pinning per I/O. Without (RLIMIT_MEMLOCK)
	 * the same I/O works, a little slower. */
	disk_store_register(dt->st, dt->stage_base, dt->nstage * dt->slot_bytes,
			    dt->slot_bytes);
	disk_store_register(dt->st, dt->hblk_base, (uint64_t)dt->nstage * DISK_ALIGN,
			    DISK_ALIGN);
	for (uint32_t i = 0; i < dt->nstage; i++)
		dt->stage_free[i] = dt->hblk_free[i] = dt->nstage - 1 - i;
	dt->nstage_free = dt->nhblk_free = dt->nstage;
	memset(dt->inval_block, 0, DISK_ALIGN);
	h = dt->inval_block;
	h->magic = DISK_FREE_MAGIC;
	return 0;
}

static void tier_free(struct disk_tier *dt)
{
	for (uint32_t b = 0; dt->bucket && b < dt->nbucket; b++)
		while (dt->bucket[b]) {
			struct disk_entry *e = dt->bucket[b];

			dt->bucket[b] = e->hnext;
			free(e->slot);
			free(e->stage);
			free(e->dst);
			free(e->hblk);
			free(e);
		}
	free(dt->bucket);
	free(dt->stage_base);
	free(dt->hblk_base);
	free(dt->hblk_free);
	free(dt->stage_free);
	free(dt->free_slots);
	free(dt->inval);
	free(dt->inval_block);
	free(dt->raw);
	pass_free(dt->pass);
	disk_codec_ctx_free(dt->cx);
	disk_store_close(dt->st);
	pthread_mutex_destroy(&dt->mu);
	pthread_cond_destroy(&dt->work);
	pthread_cond_destroy(&dt->done);
	free(dt);
}

int disk_tier_open(struct disk_tier **out, const struct disk_tier_config *c,
		   struct errbuf *e)
{
	struct disk_tier *dt;
	char path[4096];
	int ret;

	ret = check_dir(c->dir, e);
	if (ret)
		return ret;
	if ((size_t)snprintf(path, sizeof(path), "%s/kvpool.disk", c->dir) >=
	    sizeof(path))
		return errbuf_set(e, -ENAMETOOLONG, "disk_dir %s: path too long",
				  c->dir);
	dt = calloc(1, sizeof(*dt));
	if (!dt)
		return errbuf_set(e, -ENOMEM, "disk tier: out of memory");
	INIT_LIST_HEAD(&dt->lru);
	pthread_mutex_init(&dt->mu, NULL);
	pthread_cond_init(&dt->work, NULL);
	pthread_cond_init(&dt->done, NULL);
	dt->log = c->log;
	dt->codec = c->codec;
	dt->codec.elem_bytes = c->layout.elem_bytes;
	dt->page_bytes = c->layout.page_bytes;
	dt->slot_bytes = disk_slot_bytes(dt->page_bytes);
	dt->P = c->layout.page_tokens;
	dt->layout_id = disk_layout_id_tp(&c->layout, c->tp);
	dt->next_snap = 1;
	dt->idle = true;
	ret = disk_store_open(&dt->st, path, c->size, dt->slot_bytes, e);
	if (ret) {
		free(dt);
		return ret;
	}
	ret = tier_alloc(dt, c, e);
	if (!ret)
		ret = disk_scan(dt, e);
	if (!ret && pthread_create(&dt->thread, NULL, disk_thread, dt))
		ret = errbuf_set(e, -EAGAIN, "disk tier: cannot start its thread");
	if (ret) {
		tier_free(dt);
		return ret;
	}
	dt->running = true;
	if (disk_store_lock_wait_ms(dt->st))
		disk_logf(dt, LOG_INFO, "disk tier: waited %" PRIu32 " ms for the I/O "
			  "of the last kvpoold (dead) to let go of %s",
			  disk_store_lock_wait_ms(dt->st), path);
	if (!disk_store_direct(dt->st))
		disk_logf(dt, LOG_INFO, "disk tier: %s refuses O_DIRECT (tmpfs?): "
			  "buffered I/O, pages pass through the page cache", path);
	*out = dt;
	return 0;
}

void disk_tier_close(struct disk_tier *dt)
{
	if (!dt)
		return;
	pthread_mutex_lock(&dt->mu);
	dt->stop = true;
	pthread_cond_signal(&dt->work);
	pthread_mutex_unlock(&dt->mu);
	if (dt->running)
		pthread_join(dt->thread, NULL);
	tier_free(dt);
}
