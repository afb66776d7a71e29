/* SPDX-License-Identifier: MIT */
/*
 * client.c - kvpool._kvpool.Client: one attach to kvpoold, its lock, its
 * lifetime (close, fork), the lease calls (info, prepare, commit, release)
 * and the device tier as Views. The calls on the pool as a whole (offload,
 * evict, stats, users, clients, reload) are client_pool.c's.
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
				  "arena_bytes", "spin_us", "rank", NULL };
	PyObject *sock_o = Py_None, *name_o = Py_None, *sock_b = NULL;
	struct int_arg pool = INT_ARG("pool", UINT32_MAX),
		       sq = INT_ARG("sq_entries", UINT32_MAX),
		       arena = INT_ARG("arena_bytes", UINT32_MAX),
		       spin = INT_ARG("spin_us", UINT32_MAX),
		       rank = INT_ARG("rank", UINT32_MAX);
	struct kvp_connect_opts o;
	char err[KVP_ERRLEN] = "";
	struct kvp_client *c = NULL;
	int ret;

	if (self->c || self->closed) {
		PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$O&O&O&O&O&:Client", kwlist,
					 &sock_o, &name_o, int_conv, &pool, int_conv, &sq,
					 int_conv, &arena, int_conv, &spin, int_conv, &rank))
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
	o.rank = (uint32_t)rank.v;

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
	self->tp = kvp_client_tp(c);
	self->rank = kvp_client_rank(c);
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

/* A tensor-parallel rank > 0 joins rank 0's lease: a Lease as prepare's. */
static PyObject *client_join(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "lease_id", "seq", NULL };
	struct int_arg id = INT_ARG("join: lease_id", UINT64_MAX);
	PyObject *seq_o = Py_None, *lease;
	uint64_t seq = 0;
	struct kvp_lease l;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$O:join", kwlist, int_conv,
					 &id, &seq_o) ||
	    (seq_o != Py_None && int_arg(seq_o, "join: seq", UINT64_MAX, &seq)) ||
	    client_enter(self))
		return NULL;
	CALL(ret, kvp_lease_join(self->c, id.v, &l));
	if (ret < 0) {
		kvp_raise_client(self, ret);
		client_leave(self);
		return NULL;
	}
	if (seq_o != Py_None) {
		/* A sequence's write lease (seq=): committed as rank 0's. */
		lease = lease_new(self, &l, LEASE_SEQ);
		if (lease)
			((KvpLease *)lease)->seq = seq;
	} else if (id.v & (1ull << 31)) {
		/* A chunk's fill lease (kvpool.h KVP_LEASE_SHARED ids): sealed
		 * with lease.seal(), as the registration's. */
		lease = lease_new(self, &l, LEASE_CHUNK_FILL);
		if (lease) {
			((KvpLease *)lease)->reg.created = 1;
			((KvpLease *)lease)->reg.tokens = l.n_new;
			((KvpLease *)lease)->reg.start = (uint32_t)l.start;
		}
	} else {
		lease = lease_new(self, &l, LEASE_HISTORY);
	}
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

static PyObject *get_tp(KvpClient *self, void *unused)
{
	return PyLong_FromUnsignedLong(self->tp);
}

static PyObject *get_rank(KvpClient *self, void *unused)
{
	return PyLong_FromUnsignedLong(self->rank);
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
	{ "tp", (getter)get_tp, NULL,
	  "The pool's tensor-parallel ranks (kvpool.conf tp; 1: not tensor-parallel).", NULL },
	{ "rank", (getter)get_rank, NULL,
	  "This client's rank in a tensor-parallel pool (Client(rank=...)); its\n"
	  "layout has kv_heads / tp heads and its device tier its rank's pages.", NULL },
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
	{ "join", (PyCFunction)(void (*)(void))client_join, METH_VARARGS | METH_KEYWORDS,
	  "join($self, lease_id, *, seq=None)\n--\n\n"
	  "Join rank 0's lease in a tensor-parallel pool (kvp_lease_join): ranks\n"
	  "above 0 never prepare. Returns a Lease as prepare does: the same page\n"
	  "table (frame indices valid in this rank's pool), appends of this rank's\n"
	  "heads, commit and release. Every rank commits the lease: commit()\n"
	  "returns 1 (pending) until the last rank's, which returns 0. A release\n"
	  "or the death of any rank before that releases it for every rank: the\n"
	  "others' commit and join raise StaleLeaseError saying which rank ended\n"
	  "it. Rank 0 hands lease.id to the others (torch.distributed).\n\n"
	  "A chunk's fill lease is joined the same way: rank 0 registers the\n"
	  "chunk (chunk_register / chunk_link; ranks above 0 are refused) and\n"
	  "hands reg['lease'].id over; the joined Lease has the entry's page\n"
	  "table, takes this rank's appends and seal(): seal() returns 1\n"
	  "(pending) until the last rank's, which makes the chunk ready. A\n"
	  "release or death of any rank before that abandons the chunk.\n\n"
	  "A sequence's write lease is joined with seq= its id: rank 0\n"
	  "allocates, creates and extends the sequence (seq_alloc, seq_create,\n"
	  "seq_extend; ranks above 0 are refused) and hands lease.id over; the\n"
	  "joined Lease has the sequence's page table, takes this rank's\n"
	  "appends and commit(): 1 (pending) until the last rank's, which grows\n"
	  "the sequence. A release or death of any rank before that drops the\n"
	  "new tokens for all." },
	{ "commit", (PyCFunction)client_commit, METH_VARARGS,
	  "commit($self, lease_id, n, /)\n--\n\n"
	  "Commit the first n new tokens of a lease by id (kvp_commit). Prefer\n"
	  "Lease.commit(). Raises AlreadyError on a second commit, StaleLeaseError\n"
	  "for a lease that is no longer live." },
	{ "release", (PyCFunction)client_release, METH_O,
	  "release($self, lease_id, /)\n--\n\n"
	  "Unpin a lease by id (kvp_release); uncommitted slots are given back.\n"
	  "Prefer Lease.release()." },
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
		  "arena_bytes=0, spin_us=0, rank=0)\n--\n\n"
		  "One attach to kvpoold (kvp_connect). socket None: $KVPOOL_SOCKET,\n"
		  "else /run/kvpool/kvpoold.sock. Use kvpool.connect().",
	.tp_traverse = (traverseproc)client_traverse,
	.tp_weaklistoffset = offsetof(KvpClient, weakrefs),
	.tp_getset = client_getset,
	.tp_init = (initproc)client_init,
	.tp_new = PyType_GenericNew,
};
