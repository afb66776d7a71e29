/* SPDX-License-Identifier: MIT */
/*
 * ops_list.c - USERS and CLIENTS: paged listings behind a cursor.
 *
 * Rows are built in private memory and copied to the result range in one
 * go; nothing is ever read back from shared memory.
 *
 * USERS over several tenants (an admin's view) pages through one sequence
 * ordered by (user id, tenant index), so a single 64-bit cursor suffices:
 * the cursor is a user id, and a page never ends between two tenants' rows
 * of the same user id (it stops before them instead), so resuming at
 * "last id + 1" skips nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "ops_internal.h"

static bool row_before(const struct kvp_user_info *a,
		       const struct kvp_user_info *b)
{
	return a->user < b->user || (a->user == b->user && a->tenant < b->tenant);
}

/* One tenant's rows of one shard (locked) with user >= cursor, tenant
 * index filled in. */
static int list_shard(struct tenant *t, struct engine *eng, uint64_t cursor,
		      struct kvp_user_info *rows, uint32_t max, uint64_t *next)
{
	int n = engine_list_users(eng, cursor, rows, max, next);

	for (int i = 0; i < n; i++)
		rows[i].tenant = t->index;
	return n;
}

struct merge {
	struct kvp_user_info *acc, *add, *tmp;
	uint32_t nacc, max;
	bool dropped;                /* a row fell past the page */
	uint64_t first_dropped;      /* the smallest user id that did */
	bool more;                   /* a source has rows past its page */
};

/* acc = the first max rows of acc + add[0, nadd), both sorted. */
static void merge_rows(struct merge *m, uint32_t nadd)
{
	uint32_t i = 0, j = 0, k = 0;
	struct kvp_user_info *swap;

	while (k < m->max && (i < m->nacc || j < nadd)) {
		if (j == nadd || (i < m->nacc && row_before(&m->acc[i], &m->add[j])))
			m->tmp[k++] = m->acc[i++];
		else
			m->tmp[k++] = m->add[j++];
	}
	if (i < m->nacc || j < nadd) {
		uint64_t u = i < m->nacc && (j == nadd ||
			     row_before(&m->acc[i], &m->add[j])) ?
			     m->acc[i].user : m->add[j].user;

		if (!m->dropped || u < m->first_dropped)
			m->first_dropped = u;
		m->dropped = true;
	}
	swap = m->acc;
	m->acc = m->tmp;
	m->tmp = swap;
	m->nacc = k;
}

/* One (tenant, pool) source's page merged into m (arg), shard by shard:
 * a user's row is in one shard, so the merge never meets it twice. */
static int merge_pool(struct op *o, struct tenant *t, uint32_t pool,
		      struct tenant_pool *tp, void *arg)
{
	struct merge *m = arg;

	for (uint32_t i = 0; i < tp->set->n; i++) {
		uint64_t tnext;
		int n = list_shard(t, shard_lock(tp->set, i), o->sqe->arg, m->add,
				   m->max, &tnext);

		shard_unlock(tp->set, i);
		if (n < 0)
			return errbuf_set(o->e, n, "out of memory");
		m->more |= tnext != 0;
		merge_rows(m, (uint32_t)n);
	}
	return 0;
}

static int users_merged(struct op *o, uint32_t max, uint64_t *next)
{
	struct kvp_user_info *buf = op_scratch_get(o->scr, 3 * (size_t)max *
						   sizeof(*buf));
	struct merge m = { .max = max };
	int ret;

	if (!buf)
		return errbuf_set(o->e, -ENOMEM, "users: out of memory for %" PRIu32
				  " rows; ask for fewer (n)", max);
	m.acc = buf;
	m.add = buf + max;
	m.tmp = buf + 2 * (size_t)max;
	/* The message has always named the tenant only, not the pool. */
	ret = op_for_each_pool(o, "users", false, merge_pool, &m);
	if (ret < 0)
		return ret;
	*next = 0;
	if (m.dropped && m.nacc && m.acc[m.nacc - 1].user == m.first_dropped) {
		/* Do not split one user id's rows across pages. */
		uint64_t u = m.first_dropped;

		while (m.nacc && m.acc[m.nacc - 1].user == u)
			m.nacc--;
		if (!m.nacc)
			return errbuf_set(o->e, -EMSGSIZE, "users: user %" PRIu64 " is "
					  "cached in more tenants than %" PRIu32 " rows "
					  "hold; ask for more rows (n)", u, max);
		*next = u;
	} else if ((m.dropped || m.more) && m.nacc) {
		*next = m.acc[m.nacc - 1].user + 1;
	}
	memcpy(o->out, m.acc, (size_t)m.nacc * sizeof(*m.acc));
	return (int)m.nacc;
}

int op_users(struct op *o)
{
	int max = op_list_rows(o, sizeof(struct kvp_user_info), "USERS");
	uint64_t next = 0;
	int n;

	if (max < 0)
		return max;
	/* Several sources (tenants, pools, shards): merged by user id; one
	 * user id may have a row in each tenant (rows carry the tenant). */
	n = users_merged(o, (uint32_t)max, &next);
	if (n < 0)
		return n;
	o->cqe->out_bytes = (uint32_t)((size_t)n * sizeof(struct kvp_user_info));
	o->cqe->val0 = next;
	return n;
}

static void client_row(const struct client *c, struct kvp_client_info *r)
{
	*r = (struct kvp_client_info){
		.client_id = c->id, .pid = c->pid, .uid = c->uid, .gid = c->gid,
		.tenant = c->tenant ? c->tenant->index : UINT32_MAX,
		.flags = c->admin ? 1 : 0,
		.ops = __atomic_load_n(&c->ops, __ATOMIC_RELAXED),
		.leases = __atomic_load_n(&c->leases, __ATOMIC_RELAXED),
	};
	memcpy(r->name, c->name, sizeof(r->name));
}

/* Admin; every client, or with KVP_SQE_ALL and sqe.tenant one tenant's. */
int op_clients(struct op *o)
{
	int max = op_list_rows(o, sizeof(struct kvp_client_info), "CLIENTS");
	uint32_t want = o->sqe->tenant, n = 0;
	uint64_t cursor = o->sqe->arg;
	struct registry *r = &o->s->reg;

	if (max < 0)
		return max;
	pthread_mutex_lock(&r->lock);
	for (struct client *c = r->head; c; c = c->next) {
		struct kvp_client_info row;

		if (c->id < cursor || (want && (!c->tenant ||
		    c->tenant->index != want - 1)))
			continue;
		if (n == (uint32_t)max) {
			o->cqe->val0 = c->id; /* ids ascend along the registry */
			break;
		}
		client_row(c, &row);
		memcpy(o->out + (size_t)n * sizeof(row), &row, sizeof(row));
		n++;
	}
	pthread_mutex_unlock(&r->lock);
	o->cqe->out_bytes = (uint32_t)((size_t)n * sizeof(struct kvp_client_info));
	return (int)n;
}
