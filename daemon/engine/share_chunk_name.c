/* SPDX-License-Identifier: MIT */
/*
 * share_chunk_name.c - chunk names (kvpool.h "Chunks"): the record of what
 * was registered (type, token ids, content, JSON metadata, access counts),
 * shared by the name's entries, and everything done by name: rows, lists
 * with a JSON filter, content and tokens, delete, clear, evict_unused.
 * Entries themselves are share_chunk.c's.
 *
 * Metadata is a JSON object, checked and compared with libjansson; it is
 * kept parsed (for filters: a row matches when every key of the filter is
 * in its metadata with an equal value, json_equal) and as compact text
 * with sorted keys (what rows carry), so the same object always reads the
 * same.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "share_internal.h"

/* ------------------------------------------------------------ table */

int name_table_init(struct share *s, uint32_t nframes)
{
	uint64_t nb = 2 * (uint64_t)nframes;

	/* A name has an entry, an entry a frame at least: the table never
	 * grows and inserts need no reserve. */
	if (nb < 16)
		nb = 16;
	if (nb > (1u << 31))
		nb = 1u << 31;
	return hashtab_init_fixed(&s->names, nb);
}

void name_table_fini(struct engine *eng)
{
	/* Every name went with its last entry (chunk_table_fini). */
	hashtab_fini(&eng->share->names);
}

struct chunk_name *name_find(struct engine *eng, const struct kvp_chunk_id *id)
{
	struct chunk_name *n;

	hashtab_for_each_possible(&eng->share->names, n, hnode,
				  hashtab_hash_digest(id->b))
		if (!memcmp(n->id.b, id->b, sizeof(id->b)))
			return n;
	return NULL;
}

struct chunk *name_root(const struct chunk_name *n)
{
	struct chunk *c;

	list_for_each_entry(c, &n->entries, name_link)
		if (!c->parent)
			return c;
	return NULL;
}

void name_insert(struct engine *eng, struct chunk_name *n)
{
	hashtab_insert(&eng->share->names, &n->hnode,
		       hashtab_hash_digest(n->id.b));
}

void name_free(struct engine *eng, struct chunk_name *n)
{
	hashtab_remove(&eng->share->names, &n->hnode);
	json_decref(n->meta_json);
	free(n->meta);
	free(n->tokens);
	free(n->content);
	free(n);
}

/* ------------------------------------------------------------ metadata */

static const char *json_kind(const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: case JSON_REAL: return "a number";
	case JSON_TRUE: case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	default: return "an object";
	}
}

/* The canonical text of obj, or -EINVAL when it is too long. */
static int meta_text(json_t *obj, const char *what, char **out,
		     struct errbuf *e)
{
	char *t = json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS);

	if (!t)
		return errbuf_set(e, -ENOMEM, "%s: out of memory", what);
	if (strlen(t) >= KVP_CHUNK_META_MAX) {
		size_t n = strlen(t);

		free(t);
		return errbuf_set(e, -EINVAL, "%s is %zu bytes as compact JSON; at "
				  "most %d: keep it to ids, names and versions "
				  "(put documents in the content)", what, n,
				  KVP_CHUNK_META_MAX - 1);
	}
	*out = t;
	return 0;
}

int meta_parse(const char *text, const char *what, json_t **out, char **canon,
	       struct errbuf *e)
{
	json_error_t err;
	json_t *j;
	int ret;

	*out = NULL;
	*canon = NULL;
	if (!text || !*text)
		return 0;
	j = json_loads(text, JSON_REJECT_DUPLICATES, &err);
	if (!j)
		return errbuf_set(e, -EINVAL, "%s is not valid JSON: %s (line %d, "
				  "column %d); give an object such as "
				  "{\"source\": \"docs\", \"page\": 3}", what,
				  err.text, err.line, err.column);
	if (!json_is_object(j)) {
		ret = errbuf_set(e, -EINVAL, "%s is %s, not a JSON object; give "
				 "{\"key\": value, ...}", what, json_kind(j));
		json_decref(j);
		return ret;
	}
	ret = meta_text(j, what, canon, e);
	if (ret) {
		json_decref(j);
		return ret;
	}
	*out = j;
	return 0;
}

int name_meta_merge(const struct chunk_name *n, json_t *meta, json_t **merged,
		    char **canon, struct errbuf *e)
{
	json_t *m = n->meta_json ? json_deep_copy(n->meta_json) : json_object();
	int ret;

	if (!m || json_object_update(m, meta)) {
		json_decref(m);
		return errbuf_set(e, -ENOMEM, "chunk metadata: out of memory");
	}
	ret = meta_text(m, "the chunk's metadata with the new keys", canon, e);
	if (ret) {
		json_decref(m);
		return ret;
	}
	*merged = m;
	return 0;
}

void name_meta_set(struct chunk_name *n, json_t *meta, char *canon)
{
	json_decref(n->meta_json);
	free(n->meta);
	n->meta_json = meta;
	n->meta = canon;
}

/* Every key of filter is in meta with an equal value. */
static bool meta_match(const json_t *meta, json_t *filter)
{
	const char *key;
	json_t *v;

	if (!filter)
		return true;
	json_object_foreach(filter, key, v) {
		json_t *m = meta ? json_object_get(meta, key) : NULL;

		if (!m || !json_equal(m, v))
			return false;
	}
	return true;
}

/* ------------------------------------------------------------ busy marks */

uint64_t chunk_mark_busy(struct engine *eng)
{
	struct share *s = eng->share;
	uint64_t pages = 0;

	struct chunk *c;

	s->mark++;
	hashtab_for_each_safe(&s->chunks, c, hnode)
		if (c->holders || c->state != KVP_CHUNK_READY)
			/* Up to the first ancestor marked already. */
			for (struct chunk *x = c; x && x->mark != s->mark;
			     x = x->parent)
				x->mark = s->mark;
	hashtab_for_each_safe(&s->chunks, c, hnode)
		if (c->mark != s->mark)
			pages += c->npages;
	return pages;
}

/* ------------------------------------------------------------ rows */

static int name_not_found(const struct kvp_chunk_id *id, struct errbuf *e)
{
	char hex[65];

	kvp_chunk_id_format(id, hex);
	return errbuf_set(e, -ENOENT, "chunk %s is not registered (never, or "
			  "deleted, or evicted); register it again", hex);
}

/* A name by its id or one of its entries'. */
static struct chunk_name *name_of(struct engine *eng,
				  const struct kvp_chunk_id *id)
{
	struct chunk_name *n = name_find(eng, id);
	struct chunk *c;

	if (n)
		return n;
	c = chunk_find(eng, id);
	return c ? c->name : NULL;
}

/* n bytes of content at most, not ending inside a UTF-8 character. */
static size_t utf8_cut(const unsigned char *p, size_t len, size_t n)
{
	if (len <= n)
		return len;
	/* Back off continuation bytes (10xxxxxx) at the cut. */
	while (n && (p[n] & 0xc0) == 0x80)
		n--;
	return n;
}

static void name_info_of(const struct engine *eng, const struct chunk_name *n,
			 struct kvp_chunk_info *out)
{
	const struct chunk *root = name_root(n), *c, *k;
	size_t pv = n->content ? utf8_cut(n->content, n->content_len,
					  KVP_CHUNK_PREVIEW_MAX - 1) : 0;

	memset(out, 0, sizeof(*out));
	out->id = n->id;
	out->type = n->type;
	out->state = root ? root->state : KVP_CHUNK_READY;
	out->tokens = n->ntokens;
	out->entries = n->nentries;
	out->filler = root ? root->filler : 0;
	out->content_len = n->content_len;
	out->created_ns = n->created_ns;
	out->last_access_ns = n->last_access_ns;
	out->hits = n->hits;
	if (root)
		out->root = root->id;
	list_for_each_entry(c, &n->entries, name_link) {
		out->pages += c->npages;
		/* fill leases and FILLING children's pins are no readers */
		out->holders += c->holders - (c->fill_lease ? 1 : 0);
		list_for_each_entry(k, &c->children, sib)
			out->holders -= k->fill_pin == c;
	}
	out->bytes = (uint64_t)out->pages * eng->layout.page_bytes;
	if (pv)
		memcpy(out->preview, n->content, pv);
	if (n->meta)
		memcpy(out->meta, n->meta, strlen(n->meta) + 1);
}

int share_chunk_info(struct engine *eng, const struct kvp_chunk_id *id,
		     struct kvp_chunk_info *out, struct errbuf *e)
{
	struct chunk_name *n = name_of(eng, id);

	if (!n)
		return name_not_found(id, e);
	name_info_of(eng, n, out);
	return 0;
}

int share_chunk_content(struct engine *eng, const struct kvp_chunk_id *id,
			const void **data, uint32_t *total, struct errbuf *e)
{
	struct chunk_name *n = name_of(eng, id);

	if (!n)
		return name_not_found(id, e);
	*data = n->content;
	*total = n->content_len;
	return 0;
}

int share_chunk_tokens(struct engine *eng, const struct kvp_chunk_id *id,
		       const uint32_t **tokens, uint32_t *count, struct errbuf *e)
{
	struct chunk_name *n = name_of(eng, id);

	if (!n)
		return name_not_found(id, e);
	*tokens = n->tokens;
	*count = n->ntokens;
	return 0;
}

static int cmp_id(const void *a, const void *b)
{
	return memcmp(a, b, sizeof(struct kvp_chunk_id));
}

int share_chunk_list(struct engine *eng, uint32_t type, const char *filter,
		     const struct kvp_chunk_id *cursor, struct kvp_chunk_info *rows,
		     uint32_t max, bool *more, struct errbuf *e)
{
	struct share *s = eng->share;
	uint64_t n = 0, from = 0;
	struct chunk_name *c;
	json_t *f = NULL;
	char *canon = NULL;
	uint32_t w = 0;
	int ret;

	*more = false;
	if (type && !kvp_chunk_type_name(type))
		return errbuf_set(e, -EINVAL, "chunk type %" PRIu32 " is not system "
				  "(1), context (2) or query (3)", type);
	ret = meta_parse(filter, "the chunk list filter", &f, &canon, e);
	free(canon);
	if (ret)
		return ret;
	if (s->names.count > s->ids_cap) {
		struct kvp_chunk_id *p = realloc(s->ids, s->names.count * sizeof(*p));

		if (!p) {
			json_decref(f);
			return errbuf_set(e, -ENOMEM, "out of memory listing %"
					  PRIu64 " chunks", s->names.count);
		}
		s->ids = p;
		s->ids_cap = s->names.count;
	}
	hashtab_for_each_safe(&s->names, c, hnode)
		if ((!type || c->type == type) &&
		    (!cursor || memcmp(c->id.b, cursor->b, 32) > 0) &&
		    meta_match(c->meta_json, f))
			s->ids[n++] = c->id;
	json_decref(f);
	/* A tenant that never had a chunk has no ids array yet, and qsort's
	 * base must not be NULL even for 0 elements (glibc declares it
	 * nonnull; UBSan aborts the daemon on it). */
	if (n > 1)
		qsort(s->ids, n, sizeof(*s->ids), cmp_id);
	for (; from < n && w < max; from++)
		name_info_of(eng, name_find(eng, &s->ids[from]), &rows[w++]);
	*more = from < n;
	return (int)w;
}

/* ------------------------------------------------------------ deletion */

/* Every entry of n and everything below them: n goes with the last (which
 * may be below another of its entries, so look it up again each time). */
static uint32_t name_kill(struct engine *eng, struct chunk_name *n,
			  uint32_t *nkilled)
{
	const struct kvp_chunk_id id = n->id;
	uint32_t freed = 0;

	while ((n = name_find(eng, &id)))
		freed += chunk_kill_tree(eng, name_first_entry(n), nkilled);
	return freed;
}

int share_chunk_delete(struct engine *eng, const struct kvp_chunk_id *id,
		       struct errbuf *e)
{
	struct chunk_name *n = name_find(eng, id);
	struct chunk *c;
	uint32_t killed = 0;

	/* Its copy on the disk tier goes too (its root, named either way). */
	killed += (uint32_t)tier_chunk_drop(eng, id);
	if (n) {
		name_kill(eng, n, &killed);
		return (int)killed;
	}
	c = chunk_find(eng, id);
	if (!c && !killed)
		return name_not_found(id, e);
	if (c)
		chunk_kill_tree(eng, c, &killed);
	return (int)killed;
}

/* Kill every name matching pred (after the marks when marked); returns
 * how many. Names may go while this walks (an entry below another name
 * was its last): start each bucket over after a kill. */
static int name_kill_matching(struct engine *eng,
			      bool (*pred)(struct engine *, const struct chunk_name *,
					   const void *),
			      const void *arg, bool evicted)
{
	struct share *s = eng->share;
	int count = 0;

	for (uint64_t b = 0; b < hashtab_nbuckets(&s->names); b++) {
		struct hnode *x = hashtab_bucket(&s->names, b);

		while (x) {
			struct chunk_name *n = hashtab_entry(x, struct chunk_name,
							     hnode);
			uint32_t k = 0;

			if (!pred(eng, n, arg)) {
				x = x->next;
				continue;
			}
			if (evicted)
				eng->st.chunk_evicted++;
			name_kill(eng, n, &k);
			count++;
			x = hashtab_bucket(&s->names, b);
		}
	}
	return count;
}

static bool of_type(struct engine *eng, const struct chunk_name *n,
		    const void *arg)
{
	uint32_t type = *(const uint32_t *)arg;

	return !type || n->type == type;
}

int share_chunk_clear(struct engine *eng, uint32_t type)
{
	uint32_t ondisk;

	if (type && !kvp_chunk_type_name(type))
		return -EINVAL;
	ondisk = tier_chunk_clear(eng, type);
	/* A name only on disk counts once; one in memory too, as it was
	 * before (its disk copy is older: it came back since). */
	return name_kill_matching(eng, of_type, &type, false) + (int)ondisk;
}

struct age_arg {
	uint64_t max_age_ns;
	uint64_t now_ns;
};

/* Not used for max age, and nothing of it held or filling (marks). */
static bool unused_for(struct engine *eng, const struct chunk_name *n,
		       const void *arg)
{
	const struct age_arg *a = arg;

	if (a->now_ns < n->last_access_ns ||
	    a->now_ns - n->last_access_ns < a->max_age_ns)
		return false;
	const struct chunk *c;

	list_for_each_entry(c, &n->entries, name_link)
		if (c->mark == eng->share->mark)
			return false;
	return true;
}

int share_chunk_evict_unused(struct engine *eng, uint64_t max_age_ns,
			     uint64_t now_ns)
{
	struct age_arg a = { max_age_ns, now_ns };

	/* Kills only remove unmarked entries: the marks stay true. */
	chunk_mark_busy(eng);
	return name_kill_matching(eng, unused_for, &a, true);
}
