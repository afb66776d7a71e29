/* SPDX-License-Identifier: MIT */
/*
 * client_pool.c - the Client's calls on the pool rather than on one lease:
 * moving a user's pages between tiers (offload, evict, and their admin and
 * tenant-wide forms), the counters (stats, latency), the listings (users,
 * clients) and reload. Each takes the client's lock and drops the GIL
 * around the library call, as client.c's calls do; the methods join
 * Client's table (module.c, concat_methods).
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

static PyObject *client_offload(KvpClient *self, PyObject *arg)
{
	uint64_t user;
	int ret;

	if (int_arg(arg, "offload: user", UINT64_MAX, &user))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_offload(self->c, user));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static PyObject *client_offload_all(KvpClient *self, PyObject *unused)
{
	int ret;

	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_offload_all(self->c));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static int tiers_from_object(PyObject *o, uint32_t *sel)
{
	if (!o || o == Py_None) {
		*sel = KVP_SEL_ALL;
		return 0;
	}
	if (PyUnicode_Check(o)) {
		const char *s = PyUnicode_AsUTF8(o);

		if (!s)
			return -1;
		if (!strcmp(s, "device"))
			*sel = KVP_SEL_DEVICE;
		else if (!strcmp(s, "host"))
			*sel = KVP_SEL_HOST;
		else if (!strcmp(s, "all"))
			*sel = KVP_SEL_ALL;
		else {
			PyErr_Format(PyExc_ValueError,
				     "tier '%s': 'device' (demote), 'host' or 'all'", s);
			return -1;
		}
		return 0;
	}
	{
		uint64_t v;

		if (int_arg(o, "tier", UINT32_MAX, &v))
			return -1;
		*sel = (uint32_t)v;
	}
	return 0;
}

static PyObject *client_evict(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "user", "tier", NULL };
	struct int_arg user = INT_ARG("evict: user", UINT64_MAX);
	PyObject *tier = NULL;
	uint32_t sel;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O:evict", kwlist, int_conv, &user,
					 &tier) ||
	    tiers_from_object(tier, &sel))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_evict(self->c, user.v, sel));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

/* A pool index argument: 0 .. KVP_POOLS_MAX - 1. */
static int pool_arg(PyObject *o, const char *what, uint32_t *out)
{
	uint64_t v;

	if (int_arg(o, what, KVP_POOLS_MAX - 1, &v))
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static PyObject *client_move(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "user", "from_pool", "to_pool", NULL };
	struct int_arg user = INT_ARG("move: user", UINT64_MAX);
	PyObject *from_o, *to_o;
	uint32_t from, to;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO:move", kwlist, int_conv, &user,
					 &from_o, &to_o) ||
	    pool_arg(from_o, "move: from_pool", &from) ||
	    pool_arg(to_o, "move: to_pool", &to) || client_enter(self))
		return NULL;
	CALL(ret, kvp_move(self->c, user.v, from, to));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static PyObject *client_chunk_copy(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "id", "from_pool", "to_pool", NULL };
	PyObject *id_o, *from_o, *to_o;
	struct kvp_chunk_id id;
	uint32_t from, to;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:chunk_copy", kwlist, &id_o,
					 &from_o, &to_o) ||
	    chunk_id_from_object(id_o, &id) ||
	    pool_arg(from_o, "chunk_copy: from_pool", &from) ||
	    pool_arg(to_o, "chunk_copy: to_pool", &to) || client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_copy(self->c, &id, from, to));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

/* evict_all / evict_tenant: one optional tier argument, a count back. */
static PyObject *evict_many(KvpClient *self, PyObject *args, PyObject *kw,
			    const char *fmt,
			    int (*fn)(struct kvp_client *, uint32_t))
{
	static char *kwlist[] = { "tier", NULL };
	PyObject *tier = NULL;
	uint32_t sel;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &tier) ||
	    tiers_from_object(tier, &sel))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, fn(self->c, sel));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static PyObject *client_evict_all(KvpClient *self, PyObject *args, PyObject *kw)
{
	return evict_many(self, args, kw, "|O:evict_all", kvp_evict_all);
}

static PyObject *client_evict_tenant(KvpClient *self, PyObject *args, PyObject *kw)
{
	return evict_many(self, args, kw, "|O:evict_tenant", kvp_evict_tenant);
}

static const struct {
	const char *name;
	size_t off;
} stat_fields[] = {
/* Every field, from the header's one list of them. */
#define F(x, group, kind, unit, metric, help) { #x, offsetof(struct kvp_stats, x) },
	KVP_STATS_FIELDS(F)
#undef F
};

static PyObject *stats_to_dict(const struct kvp_stats *st)
{
	PyObject *d = PyDict_New(), *v;

	if (!d)
		return NULL;
	for (uint32_t t = 0; t < KVP_TIERS; t++) {
		const struct kvp_tier_stats *ts = &st->tier[t];

		v = Py_BuildValue("{sKsKsKsK}", "frames_total",
				  (unsigned long long)ts->frames_total, "frames_used",
				  (unsigned long long)ts->frames_used, "frames_free",
				  (unsigned long long)ts->frames_free, "bytes_total",
				  (unsigned long long)ts->bytes_total);
		if (!v || PyDict_SetItemString(d, kvp_tier_name(t), v)) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
		uint64_t x;

		memcpy(&x, (const char *)st + stat_fields[i].off, sizeof(x));
		v = PyLong_FromUnsignedLongLong(x);
		if (!v || PyDict_SetItemString(d, stat_fields[i].name, v)) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	return d;
}

static PyObject *client_stats(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "all_tenants", NULL };
	int all = 0, ret;
	struct kvp_stats st;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:stats", kwlist, &all))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_stats(self->c, all, &st));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return stats_to_dict(&st);
}

/* kvp_latency as {op: {count, sum_ns, buckets: [(le_ns, n), ...]}}; the
 * last bucket's le_ns is None (+Inf). */
static PyObject *client_latency(KvpClient *self, PyObject *unused)
{
	static const char *const names[KVP_LAT_OPS] = {
		"prepare", "commit", "offload", "onload",
	};
	struct kvp_latency lat;
	PyObject *d;
	int ret;

	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_latency(self->c, &lat));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	d = PyDict_New();
	for (uint32_t k = 0; d && k < KVP_LAT_OPS; k++) {
		PyObject *b = PyList_New(KVP_LAT_BUCKETS), *op;

		for (uint32_t i = 0; b && i < KVP_LAT_BUCKETS; i++) {
			PyObject *t = lat.bucket_ns[i] == UINT64_MAX ?
				Py_BuildValue("(OK)", Py_None,
					      (unsigned long long)lat.op[k].buckets[i]) :
				Py_BuildValue("(KK)", (unsigned long long)lat.bucket_ns[i],
					      (unsigned long long)lat.op[k].buckets[i]);

			if (!t) {
				Py_CLEAR(b);
				break;
			}
			PyList_SET_ITEM(b, i, t);
		}
		op = b ? Py_BuildValue("{sKsKsN}", "count",
				       (unsigned long long)lat.op[k].count, "sum_ns",
				       (unsigned long long)lat.op[k].sum_ns, "buckets", b) : NULL;
		if (!op || PyDict_SetItemString(d, names[k], op) < 0) {
			Py_XDECREF(op);
			Py_CLEAR(d);
			break;
		}
		Py_DECREF(op);
	}
	return d;
}

static PyObject *client_reload(KvpClient *self, PyObject *unused)
{
	int ret;

	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_reload(self->c));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	Py_RETURN_NONE;
}

#define LIST_ROWS 128

/* One page of rows from cursor (kvp_users, kvp_clients), and one row as a
 * dict: what list_rows() needs of a listing. */
typedef int (*list_page_fn)(struct kvp_client *c, uint64_t cursor, void *rows,
			    uint32_t max, uint64_t *next);
typedef PyObject *(*list_row_fn)(const void *row);

/* Every row of a listing, page by page, as a list of dicts. */
static PyObject *list_rows(KvpClient *self, list_page_fn page, size_t size,
			   list_row_fn to_dict)
{
	unsigned char *rows;
	uint64_t cursor = 0, next = 0;
	PyObject *list = PyList_New(0), *d;
	int ret = 0;

	rows = PyMem_Malloc(LIST_ROWS * size);
	if (!list || !rows) {
		Py_XDECREF(list);
		PyMem_Free(rows);
		return PyErr_NoMemory();
	}
	if (client_enter(self))
		goto err;
	do {
		CALL(ret, page(self->c, cursor, rows, LIST_ROWS, &next));
		if (ret < 0) {
			kvp_raise_client(self, ret);
			client_leave(self);
			goto err;
		}
		for (int i = 0; i < ret; i++) {
			d = to_dict(rows + (size_t)i * size);
			if (!d || PyList_Append(list, d)) {
				Py_XDECREF(d);
				client_leave(self);
				goto err;
			}
			Py_DECREF(d);
		}
		cursor = next;
	} while (next);
	client_leave(self);
	PyMem_Free(rows);
	return list;
err:
	PyMem_Free(rows);
	Py_DECREF(list);
	return NULL;
}

static int users_page(struct kvp_client *c, uint64_t cursor, void *rows,
		      uint32_t max, uint64_t *next)
{
	return kvp_users(c, cursor, (struct kvp_user_info *)rows, max, next);
}

static PyObject *user_row(const void *row)
{
	return user_info_to_dict(row);
}

static PyObject *client_users(KvpClient *self, PyObject *unused)
{
	return list_rows(self, users_page, sizeof(struct kvp_user_info), user_row);
}

static int clients_page(struct kvp_client *c, uint64_t cursor, void *rows,
			uint32_t max, uint64_t *next)
{
	return kvp_clients(c, cursor, (struct kvp_client_info *)rows, max, next);
}

static PyObject *client_row(const void *row)
{
	const struct kvp_client_info *r = row;
	char name[sizeof(r->name) + 1];
	PyObject *tenant = r->tenant == UINT32_MAX ?
		Py_NewRef(Py_None) : PyLong_FromUnsignedLong(r->tenant);

	memcpy(name, r->name, sizeof(r->name));
	name[sizeof(r->name)] = '\0';
	return Py_BuildValue("{sIsIsIsIsNsOsKsKss}", "client_id", r->client_id,
			     "pid", r->pid, "uid", r->uid, "gid", r->gid,
			     "tenant", tenant,
			     "admin", (r->flags & 1) ? Py_True : Py_False,
			     "ops", (unsigned long long)r->ops, "leases",
			     (unsigned long long)r->leases, "name", name);
}

static PyObject *client_clients(KvpClient *self, PyObject *unused)
{
	return list_rows(self, clients_page, sizeof(struct kvp_client_info),
			 client_row);
}

PyMethodDef client_pool_methods[] = {
	{ "offload", (PyCFunction)client_offload, METH_O,
	  "offload($self, user, /)\n--\n\n"
	  "Copy a user's device pages to the host tier; both copies stay valid\n"
	  "(kvp_offload). Returns the pages copied." },
	{ "offload_all", (PyCFunction)client_offload_all, METH_NOARGS,
	  "offload_all($self, /)\n--\n\n"
	  "Admin: offload every user of every tenant. Returns pages copied." },
	{ "evict", (PyCFunction)(void (*)(void))client_evict, METH_VARARGS | METH_KEYWORDS,
	  "evict($self, /, user, tier='all')\n--\n\n"
	  "Drop a user's pages from tier 'device' (demote: a host copy is kept when\n"
	  "it fits), 'host' or 'all' (kvp_evict). Returns the pages freed. A leased\n"
	  "user raises BusyError." },
	{ "evict_all", (PyCFunction)(void (*)(void))client_evict_all,
	  METH_VARARGS | METH_KEYWORDS,
	  "evict_all($self, /, tier='all')\n--\n\n"
	  "Admin: evict every unleased user of every tenant (kvp_evict_all).\n"
	  "Returns users affected." },
	{ "evict_tenant", (PyCFunction)(void (*)(void))client_evict_tenant,
	  METH_VARARGS | METH_KEYWORDS,
	  "evict_tenant($self, /, tier='all')\n--\n\n"
	  "Evict every unleased user of this client's tenant (kvp_evict_tenant,\n"
	  "seed 002's evict_kv_cache); leased users are skipped. Returns users\n"
	  "affected." },
	{ "move", (PyCFunction)(void (*)(void))client_move, METH_VARARGS | METH_KEYWORDS,
	  "move($self, /, user, from_pool, to_pool)\n--\n\n"
	  "Move a user's committed history to another pool (GPU) of this\n"
	  "client's tenant in one step (kvp_move): device pages by a peer copy,\n"
	  "host pages into the shared host tier; from_pool keeps nothing.\n"
	  "Returns the pages moved. NotFoundError nothing there, BusyError a\n"
	  "lease holds it, KvpoolError (errno EEXIST) to_pool has one." },
	{ "chunk_copy", (PyCFunction)(void (*)(void))client_chunk_copy,
	  METH_VARARGS | METH_KEYWORDS,
	  "chunk_copy($self, /, id, from_pool, to_pool)\n--\n\n"
	  "Copy chunk entry id (a name: its root entry) with the entries it hangs\n"
	  "under into another pool of the tenant, under the same ids, for the\n"
	  "clients running on that pool's GPUs (kvp_chunk_copy); from_pool keeps\n"
	  "them. Returns the pages copied (0: to_pool had them all). NotFoundError\n"
	  "no such chunk in from_pool, NotReadyError an entry still being filled." },
	{ "latency", (PyCFunction)client_latency, METH_NOARGS,
	  "latency($self, /)\n--\n\n"
	  "Admin: the daemon's latency histograms (kvp_latency) as\n"
	  "{'prepare'|'commit'|'offload'|'onload': {count, sum_ns,\n"
	  "buckets: [(le_ns or None, n), ...]}}; buckets are not cumulative." },
	{ "reload", (PyCFunction)client_reload, METH_NOARGS,
	  "reload($self, /)\n--\n\n"
	  "Admin: kvpoold re-reads its settings as on SIGHUP (kvp_reload)." },
	{ "stats", (PyCFunction)(void (*)(void))client_stats, METH_VARARGS | METH_KEYWORDS,
	  "stats($self, /, all_tenants=False)\n--\n\n"
	  "The pool's counters as a dict (struct kvp_stats): 'device' and 'host'\n"
	  "(frames_total, frames_used, frames_free, bytes_total), users, leases,\n"
	  "prepares, commits, hit_tokens, evicted_*, demoted_*, offloaded_pages,\n"
	  "onloaded_pages, prefix_*, chunk_*, ... all_tenants (admin): summed over\n"
	  "every tenant." },
	{ "users", (PyCFunction)client_users, METH_NOARGS,
	  "users($self, /)\n--\n\n"
	  "Every cached history as a list of dicts (user, start, len, pages_device,\n"
	  "pages_host, leases, tenant, pages_disk, tokens_disk): admins see every\n"
	  "tenant's (kvp_users)." },
	{ "clients", (PyCFunction)client_clients, METH_NOARGS,
	  "clients($self, /)\n--\n\n"
	  "Admin: the attached clients as dicts (client_id, pid, uid, gid, tenant,\n"
	  "admin, ops, leases, name) (kvp_clients)." },
	{ NULL, NULL, 0, NULL },
};
