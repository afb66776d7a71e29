/* SPDX-License-Identifier: MIT */
/*
 * client.c - kvpool._kvpool.Client: one attach to kvpoold and its
 * synchronous calls (info, prepare, commit, release, offload, evict, stats,
 * users, clients), plus the device tier as Views.
 *
 * Each call takes the client's lock (libkvpool clients are single-threaded),
 * drops the GIL around the library call and converts the result. Errors
 * become kvpool exceptions carrying kvp_last_error().
 *
 * MAPPING LIFETIME. Views (and every tensor made from one) point into the
 * device tier this client mapped. close() therefore detaches at once only
 * when no View is alive; otherwise it marks the client closed (every call,
 * every new export raises ClientClosedError), releases the leases Python
 * still holds, and leaves the unmap (kvp_close) to the last View's
 * deallocation. A tensor outliving close() reads and writes mapped memory,
 * never a hole.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ locking */

/* A Client inherited across fork() is the parent's: every call, view and
 * export raises in the child (libkvpool would refuse it too, -ECHILD); the
 * child connects its own. close() in the child only unmaps (kvp_close). */
static int check_not_inherited(KvpClient *self)
{
	char msg[512];

	if (__atomic_load_n(&kvp_py_fork_gen, __ATOMIC_RELAXED) == self->fork_gen)
		return 0;
	snprintf(msg, sizeof(msg),
		 "this kvpool Client was connected by pid %ld and inherited across "
		 "fork() by pid %ld; it stays the parent's (its rings and leases): "
		 "call kvpool.connect() in the child (close() of the inherited one "
		 "only unmaps it here)", self->pid, (long)getpid());
	kvp_raise(-ECHILD, msg);
	return -1;
}

int client_check_open(KvpClient *self)
{
	if (check_not_inherited(self))
		return -1;
	if (self->closed || !self->c) {
		PyErr_SetString(ClientClosedError,
				"this kvpool client is closed (close() or the end of its "
				"with block); connect again");
		return -1;
	}
	return 0;
}

static void lock_take(KvpClient *self)
{
	if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
		Py_BEGIN_ALLOW_THREADS
		PyThread_acquire_lock(self->lock, WAIT_LOCK);
		Py_END_ALLOW_THREADS
	}
}

int client_enter(KvpClient *self)
{
	if (client_check_open(self))
		return -1;
	lock_take(self);
	/* Closed by another thread while we waited. */
	if (client_check_open(self)) {
		PyThread_release_lock(self->lock);
		return -1;
	}
	return 0;
}

void client_leave(KvpClient *self)
{
	PyThread_release_lock(self->lock);
}

/* ------------------------------------------------------------ live leases */

void client_live_add(KvpClient *self, uint64_t lease)
{
	if (!lease)
		return;
	if (self->nlive == self->caplive) {
		Py_ssize_t cap = self->caplive ? self->caplive * 2 : 16;
		uint64_t *p = PyMem_Realloc(self->live, (size_t)cap * sizeof(*p));

		if (!p)
			return; /* only close()'s early release misses it */
		self->live = p;
		self->caplive = cap;
	}
	self->live[self->nlive++] = lease;
}

void client_live_del(KvpClient *self, uint64_t lease)
{
	for (Py_ssize_t i = self->nlive; i-- > 0;)
		if (self->live[i] == lease) {
			self->live[i] = self->live[--self->nlive];
			return;
		}
}

/* ------------------------------------------------------------ views */

static void client_detach(KvpClient *self)
{
	struct kvp_client *c = self->c;

	self->c = NULL;
	self->tier = NULL;
	if (c) {
		Py_BEGIN_ALLOW_THREADS
		kvp_close(c);
		Py_END_ALLOW_THREADS
	}
}

void client_view_get(KvpClient *self)
{
	self->views++;
}

void client_view_put(KvpClient *self)
{
	/* The last View of a closed client: now the mapping may go. */
	if (--self->views == 0 && self->closed)
		client_detach(self);
}

/* ------------------------------------------------------------ type */

static int client_init(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "socket", "name", "pool", "sq_entries",
				  "arena_bytes", "spin_us", NULL };
	PyObject *sock_o = Py_None, *name_o = Py_None, *sock_b = NULL;
	struct int_arg pool = INT_ARG("pool", UINT32_MAX),
		       sq = INT_ARG("sq_entries", UINT32_MAX),
		       arena = INT_ARG("arena_bytes", UINT32_MAX),
		       spin = INT_ARG("spin_us", UINT32_MAX);
	struct kvp_connect_opts o;
	char err[KVP_ERRLEN] = "";
	struct kvp_client *c = NULL;
	int ret;

	if (self->c || self->closed) {
		PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$O&O&O&O&:Client", kwlist,
					 &sock_o, &name_o, int_conv, &pool, int_conv, &sq,
					 int_conv, &arena, int_conv, &spin))
		return -1;
	memset(&o, 0, sizeof(o));
	if (sock_o != Py_None) {
		if (!PyUnicode_FSConverter(sock_o, &sock_b))
			return -1;
		o.socket = PyBytes_AS_STRING(sock_b);
	}
	if (name_o != Py_None) {
		o.name = PyUnicode_AsUTF8(name_o);
		if (!o.name) {
			Py_XDECREF(sock_b);
			return -1;
		}
	}
	o.pool = (uint32_t)pool.v;
	o.sq_entries = (uint32_t)sq.v;
	o.arena_bytes = (uint32_t)arena.v;
	o.spin_us = (uint32_t)spin.v;

	Py_BEGIN_ALLOW_THREADS
	ret = kvp_connect(&c, &o, err, sizeof(err));
	Py_END_ALLOW_THREADS
	Py_XDECREF(sock_b);
	if (ret) {
		kvp_raise_connect(ret, err);
		return -1;
	}
	self->lock = PyThread_allocate_lock();
	if (!self->lock) {
		kvp_close(c);
		PyErr_NoMemory();
		return -1;
	}
	self->c = c;
	self->pid = (long)getpid();
	self->fork_gen = __atomic_load_n(&kvp_py_fork_gen, __ATOMIC_RELAXED);
	self->layout = *kvp_client_layout(c);
	self->tier = kvp_device_base(c);
	self->cuda_device = kvp_cuda_device(c);
	/* The tenant's device frames: what this client mapped (0 for a
	 * client without a tenant, which has no tier). */
	self->tier_frames = kvp_device_frames(c);
	return 0;
}

static void client_dealloc(KvpClient *self)
{
	PyObject_GC_UnTrack(self);
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	/* Views hold the client, so none is alive here. */
	client_detach(self);
	if (self->lock)
		PyThread_free_lock(self->lock);
	PyMem_Free(self->live);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int client_traverse(KvpClient *self, visitproc visit, void *arg)
{
	/* Not Py_TYPE(self): a static type; the heap subclass kvpool.Client
	 * has subtype_traverse visit it (see lease_traverse). */
	(void)self;
	(void)visit;
	(void)arg;
	return 0;
}

/* ------------------------------------------------------------ close */

static PyObject *client_close(KvpClient *self, PyObject *unused)
{
	if (!self->c) {
		self->closed = 1;
		Py_RETURN_NONE;
	}
	lock_take(self);
	if (!self->closed && self->c) {
		self->closed = 1;
		if (self->views == 0) {
			client_detach(self);
		} else {
			/* Views keep the mapping; the leases go now, as
			 * kvp_close() would release them. */
			struct kvp_client *c = self->c;

			for (Py_ssize_t i = 0; i < self->nlive; i++) {
				uint64_t id = self->live[i];

				Py_BEGIN_ALLOW_THREADS
				kvp_release(c, id);
				Py_END_ALLOW_THREADS
			}
			self->nlive = 0;
		}
	}
	PyThread_release_lock(self->lock);
	Py_RETURN_NONE;
}

static PyObject *client_enter_ctx(PyObject *self, PyObject *unused)
{
	if (client_check_open((KvpClient *)self))
		return NULL;
	Py_INCREF(self);
	return self;
}

static PyObject *client_exit_ctx(KvpClient *self, PyObject *args)
{
	return client_close(self, NULL);
}

/* ------------------------------------------------------------ calls */

static PyObject *client_info(KvpClient *self, PyObject *arg)
{
	struct kvp_user_info in;
	uint64_t user;
	int ret;

	if (int_arg(arg, "info: user", UINT64_MAX, &user))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_info(self->c, user, &in));
	if (ret < 0) {
		kvp_raise_client(self, ret);
		client_leave(self);
		return NULL;
	}
	client_leave(self);
	return user_info_to_object(&in);
}

static PyObject *client_prepare(KvpClient *self, PyObject *const *args,
				Py_ssize_t nargs)
{
	uint64_t user, start, n_new;
	struct kvp_lease l;
	PyObject *lease;
	int ret;

	if (nargs != 3) {
		PyErr_SetString(PyExc_TypeError,
				"prepare(user, start_pos, n_new): three positional ints");
		return NULL;
	}
	if (int_arg(args[0], "prepare: user", UINT64_MAX, &user) ||
	    int_arg(args[1], "prepare: start_pos", UINT64_MAX, &start) ||
	    int_arg(args[2], "prepare: n_new", UINT32_MAX, &n_new))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_prepare(self->c, user, start, (uint32_t)n_new, &l));
	if (ret < 0) {
		kvp_raise_client(self, ret);
		client_leave(self);
		return NULL;
	}
	/* Copied while we still hold the lock: no other call can reuse the
	 * arena the page table may sit in. */
	lease = lease_new(self, &l, LEASE_HISTORY);
	client_leave(self);
	return lease;
}

/* commit / release by lease id: Lease objects call these through their
 * own methods (lease.c); here for ids from elsewhere (reap, kvctl). */
static PyObject *client_commit(KvpClient *self, PyObject *args)
{
	struct int_arg id = INT_ARG("commit: lease_id", UINT64_MAX);
	struct int_arg n = INT_ARG("commit: n", UINT32_MAX);
	int ret;

	if (!PyArg_ParseTuple(args, "O&O&:commit", int_conv, &id, int_conv, &n))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_commit(self->c, id.v, (uint32_t)n.v));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static PyObject *client_release(KvpClient *self, PyObject *arg)
{
	uint64_t id;
	int ret;

	if (int_arg(arg, "release: lease_id", UINT64_MAX, &id))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_release(self->c, id));
	if (ret >= 0)
		client_live_del(self, id);
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	Py_RETURN_NONE;
}

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

/* ------------------------------------------------------------ views */

/*
 * _view(offset, shape, strides, dtype=None): a View of the device tier from
 * byte offset, strides in elements (of dtype: a kvp dtype number, default
 * the layout's; 0 means raw bytes). Every element it can reach must lie
 * inside the tier.
 */
static PyObject *client_view(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "offset", "shape", "strides", "dtype", NULL };
	struct int_arg off_a = INT_ARG("_view: offset", UINT64_MAX);
	uint64_t off;
	PyObject *shape_o, *strides_o, *shape = NULL, *strides = NULL;
	int dtype = -1;
	KvpView *v;
	uint64_t elem, last, tier_bytes;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO|i:_view", kwlist, int_conv,
					 &off_a, &shape_o, &strides_o, &dtype))
		return NULL;
	off = off_a.v;
	if (client_check_open(self))
		return NULL;
	if (!self->tier) {
		PyErr_SetString(PyExc_ValueError,
				"this client has no device tier (an admin-only client "
				"without a tenant)");
		return NULL;
	}
	if (dtype < 0)
		dtype = (int)self->layout.dtype;
	elem = dtype == 0 ? 1 : (dtype == KVP_DTYPE_FP32 ? 4 :
				 dtype == KVP_DTYPE_FP8_E4M3 ? 1 : 2);
	if (dtype != 0 && !kvp_dtype_name((uint32_t)dtype)) {
		PyErr_Format(PyExc_ValueError, "unknown dtype %d", dtype);
		return NULL;
	}
	shape = PySequence_Fast(shape_o, "shape: a sequence of ints");
	strides = shape ? PySequence_Fast(strides_o, "strides: a sequence of ints") : NULL;
	if (!strides)
		goto err;
	if (PySequence_Fast_GET_SIZE(shape) != PySequence_Fast_GET_SIZE(strides) ||
	    PySequence_Fast_GET_SIZE(shape) > VIEW_MAX_DIMS) {
		PyErr_SetString(PyExc_ValueError, "shape and strides: same length, at most 8");
		goto err;
	}
	v = PyObject_New(KvpView, &KvpView_Type);
	if (!v)
		goto err;
	v->client = NULL;
	v->exports = 0;
	v->dtype = (uint32_t)dtype;
	v->ndim = (int)PySequence_Fast_GET_SIZE(shape);
	tier_bytes = self->tier_frames * self->layout.page_bytes;
	last = 0; /* element offset of the farthest element */
	int empty = 0;
	for (int i = 0; i < v->ndim; i++) {
		long long s = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(shape, i));
		long long st = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(strides, i));

		if (PyErr_Occurred())
			goto err_v;
		if (s < 0 || st < 0 || s > (1ll << 40) || st > (1ll << 40)) {
			PyErr_SetString(PyExc_ValueError,
					"shape and strides: non-negative and below 2^40");
			goto err_v;
		}
		v->shape[i] = s;
		v->strides[i] = st;
		if (s == 0)
			empty = 1;
		else
			last += (uint64_t)(s - 1) * (uint64_t)st;
	}
	if (!empty && (off > tier_bytes || last > (tier_bytes - off) / elem ||
		       (last + 1) * elem > tier_bytes - off)) {
		PyErr_Format(PyExc_IndexError,
			     "a view of %llu bytes from offset %llu does not fit the "
			     "device tier (%llu bytes)",
			     (unsigned long long)((last + 1) * elem),
			     (unsigned long long)off, (unsigned long long)tier_bytes);
		goto err_v;
	}
	v->data = (char *)self->tier + off;
	Py_INCREF(self);
	v->client = self;
	client_view_get(self);
	Py_DECREF(shape);
	Py_DECREF(strides);
	return (PyObject *)v;
err_v:
	Py_DECREF(v);
err:
	Py_XDECREF(shape);
	Py_XDECREF(strides);
	return NULL;
}

/*
 * _bench_info(user, n): n kvp_info round trips timed in C, in ns, on this
 * client: the C side of tools/pybench.py, measured in the same process,
 * on the same connection, in the same run.
 */
static PyObject *client_bench_info(KvpClient *self, PyObject *args)
{
	struct int_arg user_a = INT_ARG("_bench_info: user", UINT64_MAX);
	struct int_arg n_a = INT_ARG("_bench_info: n", 1u << 24);
	uint64_t user;
	unsigned int n;
	struct kvp_user_info in;
	PyObject *list;
	uint64_t *ns;
	int ret = 0;

	if (!PyArg_ParseTuple(args, "O&O&:_bench_info", int_conv, &user_a, int_conv, &n_a))
		return NULL;
	user = user_a.v;
	n = (unsigned int)n_a.v;
	ns = PyMem_Malloc((n ? n : 1) * sizeof(*ns));
	if (!ns)
		return PyErr_NoMemory();
	if (client_enter(self)) {
		PyMem_Free(ns);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	for (unsigned int i = 0; i < n && ret >= 0; i++) {
		struct timespec a, b;

		clock_gettime(CLOCK_MONOTONIC, &a);
		ret = kvp_info(self->c, user, &in);
		clock_gettime(CLOCK_MONOTONIC, &b);
		ns[i] = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000ull +
			(uint64_t)b.tv_nsec - (uint64_t)a.tv_nsec;
	}
	Py_END_ALLOW_THREADS
	client_leave(self);
	if (ret < 0) {
		PyMem_Free(ns);
		return kvp_raise_client(self, ret);
	}
	list = PyList_New(n);
	for (unsigned int i = 0; list && i < n; i++)
		PyList_SET_ITEM(list, i, PyLong_FromUnsignedLongLong(ns[i]));
	PyMem_Free(ns);
	return list;
}

/* ------------------------------------------------------------ properties */

static PyObject *get_layout(KvpClient *self, void *unused)
{
	const struct kvp_layout *l = &self->layout;

	return Py_BuildValue("{sIsIsIsssIsIsKsKsKsKsKsK}", "layers", l->layers,
			     "kv_heads", l->kv_heads, "head_dim", l->head_dim, "dtype",
			     l->dtype ? kvp_dtype_name(l->dtype) : "", "page_tokens",
			     l->page_tokens, "elem_bytes", l->elem_bytes, "head_stride",
			     (unsigned long long)l->head_stride, "token_stride",
			     (unsigned long long)l->token_stride, "kv_stride",
			     (unsigned long long)l->kv_stride, "layer_stride",
			     (unsigned long long)l->layer_stride, "page_bytes",
			     (unsigned long long)l->page_bytes, "token_bytes",
			     (unsigned long long)l->token_bytes);
}

static PyObject *get_layout_spec(KvpClient *self, void *unused)
{
	char buf[256];

	if (!self->layout.dtype)
		Py_RETURN_NONE;
	kvp_layout_format(&self->layout, buf, sizeof(buf));
	return PyUnicode_FromString(buf);
}

static PyObject *get_closed(KvpClient *self, void *unused)
{
	return PyBool_FromLong(self->closed || !self->c);
}

static PyObject *get_client_id(KvpClient *self, void *unused)
{
	if (client_check_open(self))
		return NULL;
	return PyLong_FromUnsignedLong(kvp_client_id(self->c));
}

static PyObject *get_is_admin(KvpClient *self, void *unused)
{
	if (client_check_open(self))
		return NULL;
	return PyBool_FromLong(kvp_client_is_admin(self->c));
}

static PyObject *get_cuda_device(KvpClient *self, void *unused)
{
	return PyLong_FromLong(self->cuda_device);
}

static PyObject *get_device_frames(KvpClient *self, void *unused)
{
	return PyLong_FromUnsignedLongLong(self->tier_frames);
}

static PyObject *get_views(KvpClient *self, void *unused)
{
	return PyLong_FromSsize_t(self->views);
}

static PyObject *get_attached(KvpClient *self, void *unused)
{
	return PyBool_FromLong(self->c != NULL);
}

static PyGetSetDef client_getset[] = {
	{ "layout", (getter)get_layout, NULL,
	  "The pool's layout as a dict: layers, kv_heads, head_dim, dtype (name),\n"
	  "page_tokens, elem_bytes and every stride in bytes (struct kvp_layout).", NULL },
	{ "layout_spec", (getter)get_layout_spec, NULL,
	  "The layout as kvpoold's --layout string.", NULL },
	{ "closed", (getter)get_closed, NULL, "True after close().", NULL },
	{ "attached", (getter)get_attached, NULL,
	  "True while the client is attached (after close() it stays attached, with\n"
	  "its device tier mapped, until the last View of it is freed).", NULL },
	{ "client_id", (getter)get_client_id, NULL, "The daemon's id for this client.", NULL },
	{ "is_admin", (getter)get_is_admin, NULL, "True when the daemon granted admin rights.", NULL },
	{ "cuda_device", (getter)get_cuda_device, NULL,
	  "The CUDA device ordinal of the pool, or -1 on the shm backend (host memory).", NULL },
	{ "device_frames", (getter)get_device_frames, NULL,
	  "Frames (pages) of the device tier this client mapped.", NULL },
	{ "live_views", (getter)get_views, NULL,
	  "View objects alive (each keeps the device tier mapped).", NULL },
	{ NULL },
};

PyMethodDef client_methods[] = {
	{ "close", (PyCFunction)client_close, METH_NOARGS,
	  "close($self, /)\n--\n\n"
	  "Detach from kvpoold (kvp_close): the daemon releases every lease this\n"
	  "client holds. Afterwards every call raises ClientClosedError. Tensors\n"
	  "made from the device tier keep the mapping alive: while any exists the\n"
	  "leases are released now and the unmap waits for the last of them.\n"
	  "Calling close() twice is harmless." },
	{ "__enter__", client_enter_ctx, METH_NOARGS, "with kvpool.connect() as c: ..." },
	{ "__exit__", (PyCFunction)client_exit_ctx, METH_VARARGS, "close() on exit." },
	{ "info", (PyCFunction)client_info, METH_O,
	  "info($self, user, /)\n--\n\n"
	  "What the cache holds of a user's history (kvp_info).\n\n"
	  "Returns UserInfo(user, start, len, pages_device, pages_host, leases,\n"
	  "tenant) with the attributes pages_disk and tokens_disk (its copy on the\n"
	  "disk tier; 0: none): tokens [start, start + len) are cached; len == 0\n"
	  "means nothing is. One round trip to kvpoold; nothing changes." },
	{ "prepare", (PyCFunction)(void (*)(void))client_prepare,
	  METH_FASTCALL,
	  "prepare($self, user, start_pos, n_new, /)\n--\n\n"
	  "Reserve n_new new tokens after a user's cached history and pin its pages\n"
	  "(kvp_prepare): the HSTU pair get_user_kvdata_info + prepare_kv_cache as\n"
	  "one atomic operation.\n\n"
	  "start_pos must equal start + len of the cached history (any position when\n"
	  "nothing is cached). Otherwise nothing changes and it raises GapError\n"
	  "('The input sequence has missing tokens from A to B (both inclusive).')\n"
	  "or OverlapError ('... overlapping tokens from A to B ...'), with .first\n"
	  "and .last set. Pages offloaded to the host tier are brought back first;\n"
	  "when the device tier is full, unleased histories are evicted in LRU order\n"
	  "(demoted to the host tier when it has room); when everything is pinned it\n"
	  "raises PoolFullError and changes nothing.\n\n"
	  "Returns a Lease: its page table (kv_indices / kv_indptr / last_page_len,\n"
	  "FlashInfer's convention) and the slots of the new tokens. Write them with\n"
	  "lease.append(...), make them part of the history with lease.commit(n),\n"
	  "unpin with lease.release() (or use the lease as a context manager)." },
	{ "commit", (PyCFunction)client_commit, METH_VARARGS,
	  "commit($self, lease_id, n, /)\n--\n\n"
	  "Commit the first n new tokens of a lease by id (kvp_commit). Prefer\n"
	  "Lease.commit(). Raises AlreadyError on a second commit, StaleLeaseError\n"
	  "for a lease that is no longer live." },
	{ "release", (PyCFunction)client_release, METH_O,
	  "release($self, lease_id, /)\n--\n\n"
	  "Unpin a lease by id (kvp_release); uncommitted slots are given back.\n"
	  "Prefer Lease.release()." },
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
	{ "_view", (PyCFunction)(void (*)(void))client_view, METH_VARARGS | METH_KEYWORDS,
	  "_view($self, /, offset, shape, strides, dtype=-1)\n--\n\n"
	  "A View of the device tier from byte offset with shape and strides in\n"
	  "elements (bounds checked). The package's tier()/layer()/page() use it." },
	{ "_bench_info", (PyCFunction)client_bench_info, METH_VARARGS,
	  "_bench_info($self, user, n, /)\n--\n\n"
	  "n kvp_info calls timed in C (ns): the C baseline of tools/pybench.py." },
	{ NULL, NULL, 0, NULL },
};

PyTypeObject KvpClient_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "kvpool._kvpool.Client",
	.tp_basicsize = sizeof(KvpClient),
	.tp_dealloc = (destructor)client_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "Client(socket=None, name=None, *, pool=0, sq_entries=0, "
		  "arena_bytes=0, spin_us=0)\n--\n\n"
		  "One attach to kvpoold (kvp_connect). socket None: $KVPOOL_SOCKET,\n"
		  "else /run/kvpool/kvpoold.sock. Use kvpool.connect().",
	.tp_traverse = (traverseproc)client_traverse,
	.tp_weaklistoffset = offsetof(KvpClient, weakrefs),
	.tp_getset = client_getset,
	.tp_init = (initproc)client_init,
	.tp_new = PyType_GenericNew,
};
