/* SPDX-License-Identifier: MIT */
/*
 * share.c - the shared world's plumbing: its life cycle, refcounted frames,
 * the lease handles of sequences, chunks and compositions, the hooks
 * eviction calls, the statistics and the consistency walk. The prefix
 * cache, chunks, sequences and compositions themselves live in
 * share_prefix.c, share_chunk.c, share_seq.c and share_compose.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "bug.h"
#include "share_internal.h"

/* ------------------------------------------------------------ life cycle */

int share_create(struct engine *eng, struct errbuf *e)
{
	uint32_t n = eng->frames[KVP_TIER_DEVICE].total;
	struct share *s = calloc(1, sizeof(*s));

	if (!s)
		return errbuf_set(e, -ENOMEM, "engine: out of memory for sharing");
	eng->share = s;
	s->nframes = n;
	s->sp = calloc(n ? n : 1, sizeof(*s->sp));
	s->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
	s->md = EVP_MD_CTX_new();
	if (!s->sha256 || !s->md)
		return errbuf_set(e, -ENOMEM, "engine: OpenSSL has no SHA-256 "
				  "(libcrypto: %s)", OpenSSL_version(OPENSSL_VERSION));
	if (!s->sp || pc_init(s, n) || chunk_table_init(s, n) ||
	    seq_table_init(&s->seqs))
		return errbuf_set(e, -ENOMEM, "engine: out of memory for the "
				  "prefix cache and chunk tables of %" PRIu32
				  " pages", n);
	for (uint32_t f = 0; f < n; f++)
		s->sp[f].pc = PC_NONE;
	return 0;
}

void share_destroy(struct engine *eng)
{
	struct share *s = eng->share;

	if (!s)
		return;
	/* Leases first (they hold chunks and sequences), then sequences (they
	 * hold histories, chunks and frames), then the rest. */
	lease_release_sharing(eng);
	if (s->seqs.ht.buckets)
		seq_table_fini(eng);
	chunk_table_fini(eng);
	pc_fini(s);
	free(s->sp);
	free(s->scratch);
	free(s->ids);
	EVP_MD_CTX_free(s->md);
	EVP_MD_free(s->sha256);
	free(s);
	eng->share = NULL;
}

void share_set_salt(struct engine *eng, const uint8_t salt[SHARE_SALT_BYTES])
{
	memcpy(eng->share->salt, salt, SHARE_SALT_BYTES);
}

int share_scratch(struct engine *eng, uint64_t n, struct errbuf *e)
{
	struct share *s = eng->share;
	int32_t *p;

	if (n <= s->scratch_cap)
		return 0;
	p = realloc(s->scratch, n * sizeof(*p));
	if (!p)
		return errbuf_set(e, -ENOMEM, "out of memory for a result of %"
				  PRIu64 " entries", n);
	s->scratch = p;
	s->scratch_cap = n;
	return 0;
}

/* ------------------------------------------------------------ frames */

int share_read_token(struct engine *eng, uint32_t frame, uint32_t slot,
		     void *out, struct errbuf *e)
{
	const struct kvp_layout *l = &eng->layout;
	unsigned char *row = out;
	int ret = 0;

	for (uint32_t layer = 0; layer < l->layers && !ret; layer++)
		for (uint32_t kv = 0; kv < 2 && !ret; kv++) {
			uint64_t off = (uint64_t)frame * l->page_bytes +
				       layer * l->layer_stride + kv * l->kv_stride +
				       slot * l->token_stride;

			ret = eng->be->read(eng->be_ctx, &eng->mem[KVP_TIER_DEVICE],
					    off, row, l->token_stride, e);
			row += l->token_stride;
		}
	return ret;
}

uint32_t share_frame_alloc(struct engine *eng)
{
	uint32_t f = frames_alloc(&eng->frames[KVP_TIER_DEVICE]);

	KVP_BUG_ON(f == FRAME_NONE, "the caller planned (reserved) every frame it allocates");
	eng->share->sp[f] = (struct spage){ .refs = 0, .pc = PC_NONE };
	return f;
}

void sp_ref(struct engine *eng, uint32_t f)
{
	struct spage *p = &eng->share->sp[f];

	if (!p->refs && p->pc != PC_NONE)
		pc_became_busy(eng, p->pc);
	p->refs++;
}

void sp_unref(struct engine *eng, uint32_t f)
{
	struct spage *p = &eng->share->sp[f];

	KVP_BUG_ON(!p->refs, "a shared page's reference is dropped once, never twice");
	if (--p->refs)
		return;
	if (p->pc != PC_NONE)
		pc_became_idle(eng, p->pc);
	else
		frames_free(&eng->frames[KVP_TIER_DEVICE], f);
}

/* ------------------------------------------------------------ leases */

/* ------------------------------------------------------------ leases */

int share_lease_slots(struct engine *eng, struct lease *l, uint64_t id,
		      uint32_t first, uint32_t n, struct kvp_slot *out,
		      struct errbuf *e)
{
	uint64_t base;
	uint32_t limit;

	if (l->kind != LEASE_SEQ_WRITE && l->kind != LEASE_CHUNK_FILL)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 " is a read lease: "
				  "it has no slots to write", id);
	if (l->committed)
		return errbuf_set(e, -EALREADY, "lease %#" PRIx64 " has committed; "
				  "its slots are no longer writable", id);
	base = l->kind == LEASE_SEQ_WRITE ? l->seq->len : 0;
	limit = l->kind == LEASE_SEQ_WRITE ? l->seq->n_new : l->chunk->tokens;
	if (first > limit || n > limit - first)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": slots [%" PRIu32
				  ", %" PRIu32 ") past its %" PRIu32 " new tokens",
				  id, first, first + n, limit);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t q = base + first + i;

		out[i].frame = l->kind == LEASE_SEQ_WRITE ?
			l->seq->pages[q / eng->P].frame : l->chunk->frames[q / eng->P];
		out[i].slot = (uint32_t)(q % eng->P);
	}
	return 0;
}

int share_lease_commit(struct engine *eng, struct lease *l, uint64_t id,
		       uint32_t n, struct errbuf *e)
{
	switch (l->kind) {
	case LEASE_SEQ_WRITE:
		if (l->committed)
			return errbuf_set(e, -EALREADY, "lease %#" PRIx64 " has "
					  "already committed; extend the sequence "
					  "for more tokens", id);
		if (n > l->seq->n_new)
			return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": commit of %"
					  PRIu32 " tokens but only %" PRIu32 " were "
					  "reserved", id, n, l->seq->n_new);
		seq_commit(eng, l->seq, n);
		l->committed = true;
		eng->st.commits++;
		eng->st.committed_tokens += n;
		return 0;
	case LEASE_CHUNK_FILL:
		if (l->committed)
			return errbuf_set(e, -EALREADY, "lease %#" PRIx64 ": the "
					  "chunk is sealed already", id);
		if (n != l->chunk->tokens)
			return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": a chunk "
					  "seals whole: commit all %" PRIu32 " tokens, "
					  "not %" PRIu32, id, l->chunk->tokens, n);
		chunk_fill_end(eng, l->chunk, true);
		l->committed = true;
		return 0;
	default:
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 " is a read lease "
				  "(chunk or composition): there is nothing to "
				  "commit; release it when done", id);
	}
}

void share_lease_end(struct engine *eng, struct lease *l)
{
	switch (l->kind) {
	case LEASE_SEQ_WRITE:
		if (l->seq->write_lease == lease_id(eng, l)) {
			if (!l->committed)
				seq_end_write(eng, l->seq);
			l->seq->write_lease = 0;
		}
		break;
	case LEASE_CHUNK_FILL:
		if (!l->committed)
			chunk_fill_end(eng, l->chunk, false);
		chunk_unhold(eng, l->chunk);
		break;
	case LEASE_CHUNK_READ:
		chunk_unhold(eng, l->chunk);
		break;
	case LEASE_COMPOSE:
		for (uint32_t i = 0; i < l->comp.n; i++)
			chunk_unhold(eng, l->comp.chunks[i]);
		free(l->comp.chunks);
		break;
	}
}

uint32_t share_release_owner(struct engine *eng, uint32_t owner)
{
	return seq_release_owner(eng, owner);
}

/* ------------------------------------------------------------ eviction */

uint64_t share_evictable(const struct engine *eng)
{
	const struct share *s = eng->share;

	return s->chunk_lru_frames + s->pc_idle;
}

uint64_t share_oldest_tick(const struct engine *eng)
{
	const struct share *s = eng->share;
	uint64_t t = UINT64_MAX;

	const struct chunk *c = chunk_lru_head(s);
	const struct pc_entry *pe = pc_lru_head(s);

	if (c)
		t = c->tick;
	if (pe && pe->tick < t)
		t = pe->tick;
	return t;
}

uint32_t share_evict_oldest(struct engine *eng)
{
	struct share *s = eng->share;
	struct chunk *c = chunk_lru_head(s);
	struct pc_entry *pe = pc_lru_head(s);

	if (c && (!pe || c->tick <= pe->tick))
		return chunk_evict(eng, c);
	KVP_BUG_ON(!pe, "the caller evicts only what it counted as evictable");
	pc_evict_head(eng);
	return 1;
}

/* ------------------------------------------------------------ stats */

void share_stats(const struct engine *eng, struct kvp_stats *st)
{
	const struct share *s = eng->share;

	st->prefix_pages = s->pc_count;
	st->prefix_idle_pages = s->pc_idle;
	st->seqs = s->seqs.ht.count;
	st->seq_pages = s->seq_pages;
	st->chunks = s->names.count;
	st->chunk_pages = s->chunk_pages;
	st->chunk_bytes = s->chunk_pages * eng->layout.page_bytes;
	st->chunk_last_access_ns = s->chunk_last_access_ns;
}

/* ------------------------------------------------------------ check */

int share_check(struct engine *eng, uint8_t *owner, uint64_t *frames_held,
		struct errbuf *e)
{
	struct share *s = eng->share;
	uint32_t *refs = calloc(s->nframes ? s->nframes : 1, sizeof(*refs));
	uint64_t idle = 0, count = 0, lru = 0, chunk_frames = 0;
	const struct pc_entry *lp;
	int ret;

	if (!refs)
		return errbuf_set(e, -ENOMEM, "share_check: out of memory");
	ret = chunk_check(eng, owner, &chunk_frames, e);
	if (ret)
		goto out;
	*frames_held += chunk_frames;
	ret = seq_check(eng, refs, e);
	if (ret)
		goto out;
	for (uint32_t f = 0; f < s->nframes; f++) {
		const struct spage *p = &s->sp[f];
		bool world = frames_in_use(&eng->frames[KVP_TIER_DEVICE], f) &&
			     (refs[f] || p->pc != PC_NONE);

		if (!world)
			continue;
		if (owner[f]) {
			ret = errbuf_set(e, -EFAULT, "device frame %" PRIu32 " is "
					 "shared (refs %" PRIu32 ") and owned by a "
					 "history or chunk", f, refs[f]);
			goto out;
		}
		if (refs[f] != p->refs) {
			ret = errbuf_set(e, -EFAULT, "device frame %" PRIu32 ": refs %"
					 PRIu32 " but sequences list it %" PRIu32
					 " times", f, p->refs, refs[f]);
			goto out;
		}
		owner[f] = 1;
		(*frames_held)++;
		if (p->pc != PC_NONE) {
			const struct pc_entry *pe = &s->pc[p->pc];

			count++;
			if (pe->frame != f) {
				ret = errbuf_set(e, -EFAULT, "prefix entry %" PRIu32
						 " names frame %" PRIu32 ", frame %"
						 PRIu32 " names it", p->pc, pe->frame, f);
				goto out;
			}
			if (!p->refs)
				idle++;
			if (p->refs && pe->parent != PC_NONE &&
			    !s->sp[s->pc[pe->parent].frame].refs) {
				ret = errbuf_set(e, -EFAULT, "prefix page in frame %"
						 PRIu32 " is held but its parent "
						 "is idle", f);
				goto out;
			}
			if (pe->on_lru != (!p->refs && !pe->nchildren)) {
				ret = errbuf_set(e, -EFAULT, "prefix page in frame %"
						 PRIu32 ": on the LRU %d, refs %" PRIu32
						 ", children %" PRIu32, f, pe->on_lru,
						 p->refs, pe->nchildren);
				goto out;
			}
		}
	}
	list_for_each_entry(lp, &s->pc_lru, link)
		if (++lru > s->pc_count)
			break;
	if (count != s->pc_count || idle != s->pc_idle || lru > s->pc_count) {
		ret = errbuf_set(e, -EFAULT, "prefix cache counts %" PRIu64
				 " pages, %" PRIu64 " idle; found %" PRIu64 ", %"
				 PRIu64 " idle, %" PRIu64 " on its LRU", s->pc_count,
				 s->pc_idle, count, idle, lru);
		goto out;
	}
out:
	free(refs);
	return ret;
}
