/* SPDX-License-Identifier: MIT */
/*
 * commands.c - what each kvctl command asks kvpoold, through libkvpool's
 * public API only: one cmd_<name>() per command, given a connected client
 * and the checked command line. Each fetches, hands the result to render.c
 * and returns the exit status.
 *
 * The daemon is the authority on who may do what: kvctl does not check for
 * admin rights itself, it prints the daemon's refusal (kvp_last_error) as is.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvctl.h"

/* Rows asked for per list call: 10 KiB of users, well inside any arena. */
#define LIST_BATCH 256u

static int op_fail(struct kvp_client *c, int rc, const char *what)
{
	const char *msg = kvp_last_error(c);

	if (msg && *msg)
		fprintf(stderr, "kvctl: %s\n", msg);
	else
		fprintf(stderr, "kvctl: %s: %s\n", what, strerror(-rc));
	return KVCTL_EXIT_FAIL;
}

/* Make room for want more elements of size sz; 0 or -ENOMEM. */
static int grow(void **buf, size_t *cap, size_t n, size_t want, size_t sz)
{
	size_t ncap = *cap ? *cap : LIST_BATCH;
	void *p;

	if (n + want <= *cap)
		return 0;
	while (ncap < n + want)
		ncap *= 2;
	p = realloc(*buf, ncap * sz);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = ncap;
	return 0;
}

/*
 * A cursor that does not move would page forever; a count above what was
 * asked would read past the rows. Either is the daemon's bug, said as such.
 */
static int check_page(const char *what, int rc, uint32_t max, uint64_t cursor,
		      uint64_t next)
{
	if ((uint32_t)rc > max) {
		fprintf(stderr, "kvctl: %s: daemon returned %d rows for a page of %" PRIu32 "\n",
			what, rc, max);
		return -EPROTO;
	}
	if (next != 0 && next == cursor) {
		fprintf(stderr, "kvctl: %s: daemon returned cursor %" PRIu64
			" again; stopping\n", what, cursor);
		return -EPROTO;
	}
	return 0;
}

/* A list call (kvp_users, kvp_clients): up to max rows from cursor into rows;
 * the count or -errno, and in *next where the following page starts (0: none). */
typedef int (*page_fn)(struct kvp_client *c, uint64_t cursor, void *rows,
		       uint32_t max, uint64_t *next);

static int page_users(struct kvp_client *c, uint64_t cursor, void *rows,
		      uint32_t max, uint64_t *next)
{
	return kvp_users(c, cursor, (struct kvp_user_info *)rows, max, next);
}

static int page_clients(struct kvp_client *c, uint64_t cursor, void *rows,
			uint32_t max, uint64_t *next)
{
	return kvp_clients(c, cursor, (struct kvp_client_info *)rows, max, next);
}

/* Every row of a list, or the first limit ones. */
struct list {
	const char *what;     /* the command, for messages */
	size_t row_size;
	page_fn page;
	uint64_t limit;       /* 0: no limit */
	void *rows;           /* out: n rows (the caller frees it) */
	size_t n;
	bool truncated;       /* out: limit stopped it while the daemon had more */
};

/* Page through l until the daemon's cursor is 0 or l->limit rows are read.
 * Returns the exit status; a failure has been reported. */
static int list_all(struct kvp_client *c, struct list *l)
{
	uint64_t cursor = 0, next;
	size_t cap = 0;
	int rc;

	do {
		uint32_t max = LIST_BATCH;

		if (l->limit && l->limit - l->n < max)
			max = (uint32_t)(l->limit - l->n);
		if (grow(&l->rows, &cap, l->n, max, l->row_size) < 0) {
			fprintf(stderr, "kvctl: %s: out of memory after %zu rows\n", l->what, l->n);
			return KVCTL_EXIT_FAIL;
		}
		next = 0;
		rc = l->page(c, cursor, (char *)l->rows + l->n * l->row_size, max, &next);
		if (rc < 0)
			return op_fail(c, rc, l->what);
		if (check_page(l->what, rc, max, cursor, next) < 0)
			return KVCTL_EXIT_FAIL;
		l->n += (size_t)rc;
		cursor = next;
		if (l->limit && l->n >= l->limit && cursor != 0) {
			l->truncated = true;
			break;
		}
	} while (cursor != 0);
	return KVCTL_EXIT_OK;
}

/* Ages are counted from the operator's clock: the daemon stamps chunks
 * with CLOCK_REALTIME on the same machine. */
static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t stats_pools(struct kvp_client *c, bool all_tenants,
		   struct pool_stats *pools)
{
	struct kvp_server_info si;
	size_t n = 0;

	memset(&si, 0, sizeof(si));
	if (kvp_server_info(c, &si) < 0 || !(si.flags & KVP_SERVER_POOL_DEVICES))
		return 0;
	for (uint32_t p = 0; p < si.pools && p < KVP_POOLS_MAX; p++) {
		pools[n] = (struct pool_stats){ .pool = p, .gpu = si.pool_device[p] };
		if (kvp_stats_pool(c, all_tenants, p, &pools[n].st) < 0)
			return 0;
		n++;
	}
	return n;
}

static int stats_once(struct kvp_client *c, const struct kvctl_args *a)
{
	struct pool_stats pools[KVP_POOLS_MAX];
	struct kvp_server_info si;
	struct kvp_stats s;
	size_t np;
	int rc;

	memset(&s, 0, sizeof(s));
	rc = kvp_stats(c, a->all_tenants, &s);
	if (rc < 0) {
		op_fail(c, rc, "stats");
		/* An admin uid that is in no tenant has no "own" pool to show. */
		if (rc == -EPERM && !a->all_tenants && kvp_client_is_admin(c))
			fprintf(stderr, "kvctl: as an admin, see every tenant with "
				"'kvctl stats --all-tenants'\n");
		return KVCTL_EXIT_FAIL;
	}
	/* What the daemon serves; one too old to say answers -EINVAL (an
	 * unknown opcode) and the figures come alone. */
	memset(&si, 0, sizeof(si));
	rc = kvp_server_info(c, &si);
	np = rc ? 0 : stats_pools(c, a->all_tenants, pools);
	render_stats_pools(stdout, a->json, &s, rc ? NULL : &si, a->all_tenants,
			   now_ns(), pools, np);
	return KVCTL_EXIT_OK;
}

int cmd_stats(struct kvp_client *c, const struct kvctl_args *a)
{
	return a->watch ? stats_watch(c, a, stats_once) : stats_once(c, a);
}

int cmd_users(struct kvp_client *c, const struct kvctl_args *a)
{
	struct list l = { .what = "users", .row_size = sizeof(struct kvp_user_info),
			  .page = page_users, .limit = a->limit };
	int status = list_all(c, &l);

	if (status == KVCTL_EXIT_OK) {
		render_users(stdout, a->json, l.rows, l.n, kvp_client_is_admin(c), l.truncated);
		if (l.truncated && !a->json)
			fprintf(stderr, "kvctl: showing the first %zu users (--limit); there are more\n",
				l.n);
	}
	free(l.rows);
	return status;
}

int cmd_user(struct kvp_client *c, const struct kvctl_args *a)
{
	struct kvp_user_info u;
	int rc;

	memset(&u, 0, sizeof(u));
	rc = kvp_info(c, a->user, &u);
	if (rc < 0)
		return op_fail(c, rc, "user");
	/* A user with nothing cached is an answer, not an error: len 0. */
	u.user = a->user;
	render_user(stdout, a->json, &u);
	return KVCTL_EXIT_OK;
}

int cmd_clients(struct kvp_client *c, const struct kvctl_args *a)
{
	struct list l = { .what = "clients", .row_size = sizeof(struct kvp_client_info),
			  .page = page_clients };
	int status = list_all(c, &l);

	if (status == KVCTL_EXIT_OK)
		render_clients(stdout, a->json, l.rows, l.n);
	free(l.rows);
	return status;
}

int cmd_reload(struct kvp_client *c, const struct kvctl_args *a)
{
	int rc = kvp_reload(c);

	if (rc < 0)
		return op_fail(c, rc, "reload");
	if (a->json)
		printf("{\n  \"op\": \"reload\",\n  \"applied\": true\n}\n");
	else
		printf("reload: done: kvpoold re-read its settings and applied every "
		       "one; its log says what changed\n");
	return KVCTL_EXIT_OK;
}

/* ------------------------------------------------------------ chunks */

/* Every chunk of type matching filter, in id order; *rows is the caller's
 * to free. Returns the exit status (a failure has been reported). */
static int chunks_all(struct kvp_client *c, uint32_t type, const char *filter,
		      struct kvp_chunk_info **rows, size_t *n)
{
	size_t cap = 0;
	int more = 1;

	*rows = NULL;
	*n = 0;
	while (more) {
		const struct kvp_chunk_id *after = *n ? &(*rows)[*n - 1].id : NULL;
		struct kvp_chunk_id last;
		int rc;

		if (grow((void **)rows, &cap, *n, LIST_BATCH, sizeof(**rows)) < 0) {
			fprintf(stderr, "kvctl: chunks: out of memory after %zu rows\n", *n);
			return KVCTL_EXIT_FAIL;
		}
		/* The cursor must not live in the buffer that grows. */
		if (after) {
			last = *after;
			after = &last;
		}
		more = 0;
		rc = kvp_chunk_list(c, type, filter, after, *rows + *n, LIST_BATCH, &more);
		if (rc < 0)
			return op_fail(c, rc, "chunks");
		if ((uint32_t)rc > LIST_BATCH || (more && rc == 0)) {
			fprintf(stderr, "kvctl: chunks: daemon returned %d rows (more %d) for "
				"a page of %u; stopping\n", rc, more, LIST_BATCH);
			return KVCTL_EXIT_FAIL;
		}
		*n += (size_t)rc;
	}
	return KVCTL_EXIT_OK;
}

/*
 * The chunk a typed id names: the full id as is; a prefix must match
 * exactly one chunk of the tenant. Returns the exit status.
 */
static int chunk_resolve(struct kvp_client *c, const char *hex,
			 struct kvp_chunk_id *id)
{
	struct kvp_chunk_info *rows;
	size_t n, len = strlen(hex), found = 0;
	char full[65];
	int status;

	if (kvp_chunk_id_parse(id, hex) == 0)
		return KVCTL_EXIT_OK;
	status = chunks_all(c, 0, NULL, &rows, &n);
	if (status != KVCTL_EXIT_OK)
		return status;
	for (size_t i = 0; i < n; i++) {
		kvp_chunk_id_format(&rows[i].id, full);
		if (strncmp(full, hex, len) == 0) {
			if (!found++)
				*id = rows[i].id;
		}
	}
	free(rows);
	if (found == 1)
		return KVCTL_EXIT_OK;
	if (!found)
		fprintf(stderr, "kvctl: no chunk id starts with '%s' in this tenant; "
			"see 'kvctl chunks'\n", hex);
	else
		fprintf(stderr, "kvctl: '%s' is the start of %zu chunk ids; give more "
			"digits (or all 64)\n", hex, found);
	return KVCTL_EXIT_FAIL;
}

/* chunks --entries NAME: the name's entries, asked again with room for
 * all of them when there are more than the first guess. */
static int chunk_entries(struct kvp_client *c, const struct kvctl_args *a)
{
	struct kvp_chunk_entry_info *rows = NULL;
	struct kvp_chunk_id id;
	uint32_t cap = 64;
	int rc = chunk_resolve(c, a->chunk, &id);

	if (rc != KVCTL_EXIT_OK)
		return rc;
	for (;;) {
		struct kvp_chunk_entry_info *p = realloc(rows, cap * sizeof(*rows));

		if (!p) {
			free(rows);
			fprintf(stderr, "kvctl: chunks --entries: out of memory\n");
			return KVCTL_EXIT_FAIL;
		}
		rows = p;
		rc = kvp_chunk_entries(c, &id, rows, cap);
		if (rc < 0) {
			free(rows);
			return op_fail(c, rc, "chunks --entries");
		}
		if ((uint32_t)rc <= cap)
			break;
		cap = (uint32_t)rc;
	}
	render_chunk_entries(stdout, a->json, rows, (size_t)rc);
	free(rows);
	return KVCTL_EXIT_OK;
}

int cmd_chunks(struct kvp_client *c, const struct kvctl_args *a)
{
	struct chunk_op_result r = { .type = a->chunk_type, .max_age_s = a->max_age_s };
	struct chunks_disk disk, *dp = NULL;
	struct kvp_chunk_info *rows;
	struct kvp_stats st;
	size_t n;
	int rc;

	if (a->clear || a->evict_unused) {
		r.op = a->clear ? "clear" : "evict_unused";
		rc = a->clear ? kvp_chunk_clear(c, a->chunk_type) :
		     kvp_chunk_evict_unused(c, a->max_age_s);
		if (rc < 0)
			return op_fail(c, rc, "chunks");
		r.count = (uint64_t)rc;
		render_chunk_op(stdout, a->json, &r);
		return KVCTL_EXIT_OK;
	}
	if (a->entries)
		return chunk_entries(c, a);
	rc = chunks_all(c, a->chunk_type, a->filter, &rows, &n);
	/* Residency on the disk tier: the tenant's figures (all types; a
	 * daemon without a disk tier has none). */
	if (rc == KVCTL_EXIT_OK && kvp_stats(c, 0, &st) == 0 && st.disk_chunks) {
		disk = (struct chunks_disk){ st.disk_chunks, st.disk_chunk_pages };
		dp = &disk;
	}
	if (rc == KVCTL_EXIT_OK)
		render_chunks(stdout, a->json, rows, n, now_ns(), dp);
	free(rows);
	return rc;
}

int cmd_chunk(struct kvp_client *c, const struct kvctl_args *a)
{
	struct kvp_chunk_info ci;
	struct kvp_chunk_id id;
	int rc = chunk_resolve(c, a->chunk, &id);

	if (rc != KVCTL_EXIT_OK)
		return rc;
	rc = kvp_chunk_get(c, &id, &ci);
	if (rc < 0)
		return op_fail(c, rc, "chunk");
	render_chunk(stdout, a->json, &ci, now_ns());
	return KVCTL_EXIT_OK;
}

static int evict_chunk(struct kvp_client *c, const struct kvctl_args *a)
{
	struct chunk_op_result r = { .op = "delete" };
	struct kvp_chunk_id id;
	int rc = chunk_resolve(c, a->chunk, &id);

	if (rc != KVCTL_EXIT_OK)
		return rc;
	rc = kvp_chunk_delete(c, &id);
	if (rc < 0)
		return op_fail(c, rc, "evict --chunk");
	r.count = (uint64_t)rc; /* entries, with those below them */
	kvp_chunk_id_format(&id, r.id);
	render_chunk_op(stdout, a->json, &r);
	return KVCTL_EXIT_OK;
}

int cmd_evict(struct kvp_client *c, const struct kvctl_args *a)
{
	struct op_result r = { .all = a->all, .user = a->user, .sel = a->sel };
	int rc;

	if (a->has_chunk)
		return evict_chunk(c, a);
	/* --all: an admin's is every tenant, as it always was; anyone else's is
	 * their own tenant (seed 002's evict_kv_cache). --all-tenants says
	 * every tenant whoever asks, so a non-admin hears that it needs one. */
	r.tenant = a->all && !a->all_tenants && !kvp_client_is_admin(c);
	if (r.tenant)
		rc = kvp_evict_tenant(c, a->sel);
	else if (a->all)
		rc = kvp_evict_all(c, a->sel);
	else
		rc = kvp_evict(c, a->user, a->sel);
	if (rc < 0)
		return op_fail(c, rc, "evict");
	r.count = (uint64_t)rc;
	render_evict(stdout, a->json, &r);
	return KVCTL_EXIT_OK;
}

/* move --chunk: a copy, the source keeps it (kvp_chunk_copy). */
static int copy_chunk(struct kvp_client *c, const struct kvctl_args *a)
{
	struct kvp_chunk_id id;
	char hex[65];
	int rc = chunk_resolve(c, a->chunk, &id);

	if (rc != KVCTL_EXIT_OK)
		return rc;
	rc = kvp_chunk_copy(c, &id, a->from, a->to);
	if (rc < 0)
		return op_fail(c, rc, "move --chunk");
	kvp_chunk_id_format(&id, hex);
	render_chunk_copy(stdout, a->json, hex, a->from, a->to, (uint64_t)rc);
	return KVCTL_EXIT_OK;
}

int cmd_move(struct kvp_client *c, const struct kvctl_args *a)
{
	struct op_result r = { .user = a->user };
	int rc;

	if (a->has_chunk)
		return copy_chunk(c, a);
	rc = kvp_move(c, a->user, a->from, a->to);
	if (rc < 0)
		return op_fail(c, rc, "move");
	r.count = (uint64_t)rc;
	render_move(stdout, a->json, &r, a->from, a->to);
	return KVCTL_EXIT_OK;
}

int cmd_offload(struct kvp_client *c, const struct kvctl_args *a)
{
	struct op_result r = { .all = a->all, .user = a->user, .sel = KVP_SEL_DEVICE };
	int rc;

	/* --tier disk: pushed down, an evict of the disk tier's kind. */
	if (a->sel == KVP_SEL_TO_DISK) {
		r.sel = KVP_SEL_TO_DISK;
		r.tenant = a->all && !kvp_client_is_admin(c);
		rc = !a->all ? kvp_evict(c, a->user, KVP_SEL_TO_DISK) :
		     r.tenant ? kvp_evict_tenant(c, KVP_SEL_TO_DISK) :
		     kvp_evict_all(c, KVP_SEL_TO_DISK);
		if (rc < 0)
			return op_fail(c, rc, "offload --tier disk");
		r.count = (uint64_t)rc;
		render_evict(stdout, a->json, &r);
		return KVCTL_EXIT_OK;
	}
	if (a->all)
		rc = kvp_offload_all(c);
	else
		rc = kvp_offload(c, a->user);
	if (rc < 0)
		return op_fail(c, rc, "offload");
	r.count = (uint64_t)rc;
	render_offload(stdout, a->json, &r);
	return KVCTL_EXIT_OK;
}
