/* SPDX-License-Identifier: MIT */
/*
 * lease.c - kvpool._kvpool.Lease: what prepare(), seq_*(), chunk_register()
 * and chunk_acquire() return: the pinned page table and the slots of the
 * new tokens, with append / commit / release / seal.
 *
 * PAGE TABLE COPY. libkvpool keeps each lease's page table until the lease
 * is released (kvp_lease.indices points at its copy), and its data ops take
 * only the lease's id. The Lease also copies the table into a bytes object
 * it owns, which is what Python sees (lease.indices) and what the views are
 * built from: it stays readable after the release, when the library's copy
 * is gone. Appends pass the library's lease on, so the library checks them
 * (-ESTALE for a released, committed, daemon-ended or foreign lease).
 *
 * A Lease is released when Python releases it, when its with block ends,
 * or when it is garbage; it is committed only when asked.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <string.h>

PyTypeObject *lease_type = &KvpLease_Type;

static const char *const kind_names[] = { "history", "seq", "chunk_fill",
					  "chunk_read" };

PyObject *lease_new(KvpClient *client, const struct kvp_lease *l, int kind)
{
	KvpLease *s;
	size_t bytes = (size_t)l->npages * sizeof(int32_t);

	s = (KvpLease *)lease_type->tp_alloc(lease_type, 0);
	if (!s)
		return NULL;
	s->l = *l;
	s->kind = kind;
	s->table = PyBytes_FromStringAndSize(l->indices && bytes ?
					     (const char *)l->indices : NULL,
					     (Py_ssize_t)(l->indices ? bytes : 0));
	if (!s->table) {
		Py_DECREF(s);
		return NULL;
	}
	Py_INCREF(client);
	s->client = client;
	if (l->id)
		client_live_add(client, l->id);
	else
		s->released = 1; /* nothing to release (a chunk hit) */
	return (PyObject *)s;
}

static void lease_release_quietly(KvpLease *s)
{
	KvpClient *c = s->client;
	int ret;

	if (s->released || !c)
		return;
	s->released = 1;
	if (c->closed || !c->c || client_enter(c)) {
		PyErr_Clear();
		return;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = kvp_release(c->c, s->l.id);
	Py_END_ALLOW_THREADS
	if (ret >= 0)
		client_live_del(c, s->l.id);
	client_leave(c);
}

static void lease_dealloc(KvpLease *s)
{
	PyObject *et, *ev, *tb;

	PyObject_GC_UnTrack(s);
	PyErr_Fetch(&et, &ev, &tb);
	lease_release_quietly(s);
	PyErr_Restore(et, ev, tb);
	if (s->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)s);
	Py_CLEAR(s->table);
	Py_CLEAR(s->client);
	Py_TYPE(s)->tp_free((PyObject *)s);
}

static int lease_traverse(KvpLease *s, visitproc visit, void *arg)
{
	/* Not Py_TYPE(s): KvpLease_Type is static, and the package's heap
	 * subclass (kvpool.Lease) has subtype_traverse visit the type already.
	 * Visiting it here too made the collector count every live lease's
	 * reference to kvpool.Lease twice, and with a few leases alive it could
	 * clear the class (its MRO): with client.prepare(...) then raised
	 * "'Lease' object does not support the context manager protocol". */
	Py_VISIT(s->client);
	return 0;
}

static int lease_clear(KvpLease *s)
{
	/* Cycles through a subclass's attributes: release before unlinking. */
	lease_release_quietly(s);
	Py_CLEAR(s->client);
	return 0;
}

/* ------------------------------------------------------------ checks */

static int lease_check_live(KvpLease *s, const char *what)
{
	if (s->released) {
		PyErr_Format(StaleLeaseError,
			     "%s: lease %llu is released; prepare a new one", what,
			     (unsigned long long)s->l.id);
		return -1;
	}
	if (s->committed) {
		PyErr_Format(StaleLeaseError,
			     "%s: lease %llu is committed; its slots are no longer "
			     "writable (prepare again for more tokens)", what,
			     (unsigned long long)s->l.id);
		return -1;
	}
	return client_check_open(s->client);
}

static int lease_check_range(KvpLease *s, unsigned long first, unsigned long n)
{
	if (first > s->l.n_new || n > s->l.n_new - first) {
		PyErr_Format(PyExc_IndexError,
			     "tokens [%lu, %lu) are outside the %u new tokens of lease %llu",
			     first, first + n, s->l.n_new, (unsigned long long)s->l.id);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------ append */

/* The copy itself, checks done, the client's lock held. */
static int do_append(KvpLease *s, uint32_t first, uint32_t n, const void *kv,
		     const void *const *k, const void *const *v, void *stream)
{
	KvpClient *c = s->client;
	int ret;

	Py_BEGIN_ALLOW_THREADS
	if (kv)
		ret = kvp_append_async(c->c, &s->l, first, n, kv, stream);
	else
		ret = kvp_append_layers_async(c->c, &s->l, first, n, k, v, stream);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		kvp_raise_client(c, ret);
		return -1;
	}
	return 0;
}

static PyObject *lease_append(KvpLease *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "kv", "first", NULL };
	const struct kvp_layout *L = &s->client->layout;
	unsigned long first = 0;
	Py_buffer b;
	uint64_t n;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|k:append", kwlist, &b, &first))
		return NULL;
	if (lease_check_live(s, "append"))
		goto err;
	if (b.len % L->token_bytes) {
		PyErr_Format(PyExc_ValueError,
			     "append: %zd bytes are not whole tokens of %llu bytes "
			     "([n][layers][2][kv_heads][head_dim] of %s)", b.len,
			     (unsigned long long)L->token_bytes, kvp_dtype_name(L->dtype));
		goto err;
	}
	n = (uint64_t)b.len / L->token_bytes;
	if (lease_check_range(s, first, (unsigned long)n) || client_enter(s->client))
		goto err;
	ret = do_append(s, (uint32_t)first, (uint32_t)n, b.buf, NULL, NULL, NULL);
	client_leave(s->client);
	PyBuffer_Release(&b);
	if (ret)
		return NULL;
	Py_RETURN_NONE;
err:
	PyBuffer_Release(&b);
	return NULL;
}

/* _append_ptr(first, n, ptr, nbytes, stream=0): the torch path. */
static PyObject *lease_append_ptr(KvpLease *s, PyObject *args)
{
	const struct kvp_layout *L = &s->client->layout;
	unsigned long first, n;
	unsigned long long ptr, nbytes, stream = 0;
	int ret;

	if (!PyArg_ParseTuple(args, "kkKK|K:_append_ptr", &first, &n, &ptr, &nbytes,
			      &stream))
		return NULL;
	if (lease_check_live(s, "append") || lease_check_range(s, first, n))
		return NULL;
	if (nbytes != (unsigned long long)n * L->token_bytes || (!ptr && n)) {
		PyErr_Format(PyExc_ValueError,
			     "append: %llu bytes for %lu tokens of %llu bytes", nbytes, n,
			     (unsigned long long)L->token_bytes);
		return NULL;
	}
	if (client_enter(s->client))
		return NULL;
	ret = do_append(s, (uint32_t)first, (uint32_t)n, (const void *)(uintptr_t)ptr,
			NULL, NULL, (void *)(uintptr_t)stream);
	client_leave(s->client);
	if (ret)
		return NULL;
	Py_RETURN_NONE;
}

/* _append_layers_ptr(first, n, k_ptrs, v_ptrs, stream=0): per-layer
 * [n][kv_heads][head_dim] buffers, one pointer per layer each. */
static PyObject *lease_append_layers_ptr(KvpLease *s, PyObject *args)
{
	const struct kvp_layout *L = &s->client->layout;
	unsigned long first, n;
	unsigned long long stream = 0;
	PyObject *ko, *vo, *kf = NULL, *vf = NULL;
	const void **k = NULL, **v = NULL;
	PyObject *res = NULL;
	int ret;

	if (!PyArg_ParseTuple(args, "kkOO|K:_append_layers_ptr", &first, &n, &ko, &vo,
			      &stream))
		return NULL;
	if (lease_check_live(s, "append_layers") || lease_check_range(s, first, n))
		return NULL;
	kf = PySequence_Fast(ko, "k pointers: a sequence of ints");
	vf = kf ? PySequence_Fast(vo, "v pointers: a sequence of ints") : NULL;
	if (!vf)
		goto out;
	if (PySequence_Fast_GET_SIZE(kf) != L->layers ||
	    PySequence_Fast_GET_SIZE(vf) != L->layers) {
		PyErr_Format(PyExc_ValueError, "append_layers: %u layers of K and of V",
			     L->layers);
		goto out;
	}
	k = PyMem_Calloc(L->layers, sizeof(*k));
	v = PyMem_Calloc(L->layers, sizeof(*v));
	if (!k || !v) {
		PyErr_NoMemory();
		goto out;
	}
	for (uint32_t i = 0; i < L->layers; i++) {
		k[i] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(kf, i));
		v[i] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(vf, i));
		if (PyErr_Occurred())
			goto out;
		if ((!k[i] || !v[i]) && n) {
			PyErr_SetString(PyExc_ValueError, "append_layers: a NULL pointer");
			goto out;
		}
	}
	if (client_enter(s->client))
		goto out;
	ret = do_append(s, (uint32_t)first, (uint32_t)n, NULL, k, v,
			(void *)(uintptr_t)stream);
	client_leave(s->client);
	if (!ret)
		res = Py_NewRef(Py_None);
out:
	PyMem_Free(k);
	PyMem_Free(v);
	Py_XDECREF(kf);
	Py_XDECREF(vf);
	return res;
}

/* _append_layer_ptr(layer, first, n, k_ptr, v_ptr, stream=0): one layer's
 * [n][kv_heads][head_dim] K and V (kvp_append_layer_async). */
static PyObject *lease_append_layer_ptr(KvpLease *s, PyObject *args)
{
	unsigned long layer, first, n;
	unsigned long long stream = 0;
	PyObject *ko, *vo;
	const void *k, *v;
	int ret;

	if (!PyArg_ParseTuple(args, "kkkOO|K:_append_layer_ptr", &layer, &first, &n,
			      &ko, &vo, &stream))
		return NULL;
	if (lease_check_live(s, "append_layer") || lease_check_range(s, first, n))
		return NULL;
	k = PyLong_AsVoidPtr(ko);
	v = PyLong_AsVoidPtr(vo);
	if (PyErr_Occurred())
		return NULL;
	if (client_enter(s->client))
		return NULL;
	CALL(ret, kvp_append_layer_async(s->client->c, &s->l, (uint32_t)layer,
					 (uint32_t)first, (uint32_t)n, k, v,
					 (void *)(uintptr_t)stream));
	client_leave(s->client);
	if (ret < 0)
		return kvp_raise_client(s->client, ret);
	Py_RETURN_NONE;
}

/* _check_write(first, n): what a write through the views needs (the torch
 * per-layer path, which writes with torch ops and not through the library). */
static PyObject *lease_check_write(KvpLease *s, PyObject *args)
{
	unsigned long first, n;

	if (!PyArg_ParseTuple(args, "kk:_check_write", &first, &n))
		return NULL;
	if (lease_check_live(s, "append") || lease_check_range(s, first, n))
		return NULL;
	Py_RETURN_NONE;
}

/* ------------------------------------------------------------ commit */

static PyObject *lease_commit(KvpLease *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "n", NULL };
	PyObject *n_o = Py_None;
	unsigned long n;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:commit", kwlist, &n_o))
		return NULL;
	if (n_o == Py_None) {
		n = s->l.n_new;
	} else {
		n = PyLong_AsUnsignedLong(n_o);
		if (n == (unsigned long)-1 && PyErr_Occurred())
			return NULL;
	}
	if (s->kind == LEASE_CHUNK_FILL || s->kind == LEASE_CHUNK_READ) {
		PyErr_SetString(PyExc_TypeError,
				"a chunk lease is not committed: seal() a chunk you filled, "
				"release() one you acquired");
		return NULL;
	}
	if (lease_check_live(s, "commit") || lease_check_range(s, 0, n) ||
	    client_enter(s->client))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = kvp_commit(s->client->c, s->l.id, (uint32_t)n);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		kvp_raise_client(s->client, ret);
		client_leave(s->client);
		return NULL;
	}
	s->committed = 1;
	client_leave(s->client);
	return PyLong_FromLong(ret);
}

static PyObject *lease_release(KvpLease *s, PyObject *unused)
{
	KvpClient *c = s->client;
	int ret;

	if (s->released)
		Py_RETURN_NONE;
	if (c->closed || !c->c) {
		/* close() released it (or kvp_close() will). */
		s->released = 1;
		Py_RETURN_NONE;
	}
	if (client_enter(c))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = kvp_release(c->c, s->l.id);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		kvp_raise_client(c, ret);
		client_leave(c);
		return NULL;
	}
	s->released = 1;
	client_live_del(c, s->l.id);
	client_leave(c);
	Py_RETURN_NONE;
}

static PyObject *lease_seal(KvpLease *s, PyObject *unused)
{
	KvpClient *c = s->client;
	int ret;

	if (s->kind != LEASE_CHUNK_FILL) {
		PyErr_SetString(PyExc_TypeError,
				"seal(): only the write lease of a chunk this client "
				"registered (created) is sealed");
		return NULL;
	}
	if (s->sealed || !s->reg.created)
		Py_RETURN_NONE; /* sealed already, or a hit: nothing to seal */
	if (lease_check_live(s, "seal") || client_enter(c))
		return NULL;
	s->reg.lease = s->l;
	Py_BEGIN_ALLOW_THREADS
	ret = kvp_chunk_seal(c->c, &s->reg);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		kvp_raise_client(c, ret);
		client_leave(c);
		return NULL;
	}
	s->sealed = 1;
	s->released = 1; /* the seal ended the write lease */
	client_live_del(c, s->l.id);
	client_leave(c);
	Py_RETURN_NONE;
}

static PyObject *lease_enter(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *lease_exit(KvpLease *s, PyObject *args)
{
	PyObject *et = PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : Py_None;

	/* A chunk filled without error is sealed on exit; otherwise released. */
	if (s->kind == LEASE_CHUNK_FILL && et == Py_None && !s->released)
		return lease_seal(s, NULL);
	if (et != Py_None) {
		/* Keep the with block's exception: release quietly. */
		lease_release_quietly(s);
		Py_RETURN_FALSE;
	}
	return lease_release(s, NULL);
}

/* ------------------------------------------------------------ attributes */

static PyObject *get_u64(uint64_t v)
{
	return PyLong_FromUnsignedLongLong(v);
}

#define GETTER(name, expr)                                                     \
	static PyObject *get_##name(KvpLease *s, void *unused)                \
	{                                                                      \
		return expr;                                                   \
	}

GETTER(id, get_u64(s->l.id))
GETTER(user, get_u64(s->l.user))
GETTER(start, get_u64(s->l.start))
GETTER(len, get_u64(s->l.len))
GETTER(n_new, get_u64(s->l.n_new))
GETTER(npages, get_u64(s->l.npages))
GETTER(last_page_len, get_u64(s->l.last_page_len))
GETTER(onloaded_pages, get_u64(s->l.onloaded_pages))
GETTER(kind, PyUnicode_FromString(kind_names[s->kind]))
GETTER(released, PyBool_FromLong(s->released))
GETTER(committed, PyBool_FromLong(s->committed))
GETTER(sealed, PyBool_FromLong(s->sealed))
GETTER(table, Py_NewRef(s->table))
GETTER(client, Py_NewRef((PyObject *)s->client))

static PyObject *get_seq(KvpLease *s, void *unused)
{
	if (s->kind != LEASE_SEQ)
		Py_RETURN_NONE;
	return get_u64(s->seq);
}

static PyObject *get_chunk_id(KvpLease *s, void *unused)
{
	if (s->kind != LEASE_CHUNK_FILL && s->kind != LEASE_CHUNK_READ)
		Py_RETURN_NONE;
	return chunk_id_to_str(&s->reg.id);
}

static PyObject *get_created(KvpLease *s, void *unused)
{
	return PyBool_FromLong(s->kind == LEASE_CHUNK_FILL && s->reg.created);
}

static PyObject *get_indices(KvpLease *s, void *unused)
{
	PyObject *mv = PyMemoryView_FromObject(s->table), *r;

	if (!mv)
		return NULL;
	r = PyObject_CallMethod(mv, "cast", "s", "i");
	Py_DECREF(mv);
	return r;
}

static PyGetSetDef lease_getset[] = {
	{ "id", (getter)get_id, NULL, "The lease id (0: none, a chunk hit).", NULL },
	{ "user", (getter)get_user, NULL, "The user (history leases).", NULL },
	{ "start", (getter)get_start, NULL, "History start.", NULL },
	{ "len", (getter)get_len, NULL,
	  "Committed tokens before this lease (cached tokens for seq_alloc).", NULL },
	{ "n_new", (getter)get_n_new, NULL,
	  "Reserved new tokens: positions [start+len, start+len+n_new).", NULL },
	{ "npages", (getter)get_npages, NULL, "Page table entries.", NULL },
	{ "last_page_len", (getter)get_last_page_len, NULL,
	  "Tokens in the last page once n_new are written.", NULL },
	{ "onloaded_pages", (getter)get_onloaded_pages, NULL,
	  "Pages brought back from the host tier by this prepare.", NULL },
	{ "indices", (getter)get_indices, NULL,
	  "The page table (device frame of each page) as a read-only int32\n"
	  "memoryview: FlashInfer's kv_indices, kv_indptr [0, npages]. A copy the\n"
	  "Lease owns: valid whatever calls follow.", NULL },
	{ "_table", (getter)get_table, NULL, "The page table as bytes (int32).", NULL },
	{ "kind", (getter)get_kind, NULL,
	  "'history', 'seq', 'chunk_fill' or 'chunk_read'.", NULL },
	{ "seq", (getter)get_seq, NULL, "The sequence id (seq leases), else None.", NULL },
	{ "chunk_id", (getter)get_chunk_id, NULL, "The chunk id (chunk leases), else None.", NULL },
	{ "created", (getter)get_created, NULL,
	  "chunk_register: True when this call made the chunk (fill it, then seal).", NULL },
	{ "released", (getter)get_released, NULL, "True once released (or sealed).", NULL },
	{ "committed", (getter)get_committed, NULL, "True once committed.", NULL },
	{ "sealed", (getter)get_sealed, NULL, "True once sealed (chunk fill).", NULL },
	{ "client", (getter)get_client, NULL, "The Client that holds the lease.", NULL },
	{ NULL },
};

static PyMethodDef lease_methods[] = {
	{ "append", (PyCFunction)(void (*)(void))lease_append, METH_VARARGS | METH_KEYWORDS,
	  "append($self, /, kv, first=0)\n--\n\n"
	  "Write K and V of new tokens [first, first + n) into their page slots\n"
	  "(kvp_append) from a buffer ([n][layers][2][kv_heads][head_dim] elements\n"
	  "of the layout's dtype, e.g. a numpy array). The package's Lease.append\n"
	  "takes torch tensors too. No round trip." },
	{ "_append_ptr", (PyCFunction)lease_append_ptr, METH_VARARGS,
	  "_append_ptr($self, first, n, ptr, nbytes, stream=0, /)\n--\n\n"
	  "kvp_append_async from memory at ptr (host on shm, device on cuda)." },
	{ "_append_layers_ptr", (PyCFunction)lease_append_layers_ptr, METH_VARARGS,
	  "_append_layers_ptr($self, first, n, k_ptrs, v_ptrs, stream=0, /)\n--\n\n"
	  "kvp_append_layers_async from per-layer [n][kv_heads][head_dim] buffers." },
	{ "_append_layer_ptr", (PyCFunction)lease_append_layer_ptr, METH_VARARGS,
	  "_append_layer_ptr($self, layer, first, n, k_ptr, v_ptr, stream=0, /)\n--\n\n"
	  "kvp_append_layer_async from one layer's [n][kv_heads][head_dim] K and V." },
	{ "_check_write", (PyCFunction)lease_check_write, METH_VARARGS,
	  "Raise unless tokens [first, first + n) are writable now." },
	{ "commit", (PyCFunction)(void (*)(void))lease_commit, METH_VARARGS | METH_KEYWORDS,
	  "commit($self, /, n=None)\n--\n\n"
	  "Make the first n new tokens (default: all n_new) part of the history\n"
	  "(kvp_commit); the other reserved slots are given back. Once per lease\n"
	  "(a second commit raises AlreadyError); afterwards appends raise\n"
	  "StaleLeaseError. The lease stays pinned until release()." },
	{ "release", (PyCFunction)lease_release, METH_NOARGS,
	  "release($self, /)\n--\n\n"
	  "Unpin the pages (kvp_release); uncommitted slots are given back.\n"
	  "Releasing twice is harmless." },
	{ "seal", (PyCFunction)lease_seal, METH_NOARGS,
	  "seal($self, /)\n--\n\n"
	  "A chunk this client registered and filled becomes ready and immutable\n"
	  "(kvp_chunk_seal); this ends the write lease." },
	{ "__enter__", lease_enter, METH_NOARGS, "with client.prepare(...) as lease: ..." },
	{ "__exit__", (PyCFunction)lease_exit, METH_VARARGS,
	  "Release on exit (never commits; a filled chunk is sealed when the block\n"
	  "ends without an exception)." },
	{ NULL, NULL, 0, NULL },
};

static PyObject *lease_repr(KvpLease *s)
{
	return PyUnicode_FromFormat("<kvpool.Lease %s id=%llu user=%llu start=%llu "
				    "len=%llu n_new=%u npages=%u%s>",
				    kind_names[s->kind], (unsigned long long)s->l.id,
				    (unsigned long long)s->l.user,
				    (unsigned long long)s->l.start,
				    (unsigned long long)s->l.len, s->l.n_new, s->l.npages,
				    s->released ? " released" : "");
}

PyTypeObject KvpLease_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "kvpool._kvpool.Lease",
	.tp_basicsize = sizeof(KvpLease),
	.tp_dealloc = (destructor)lease_dealloc,
	.tp_repr = (reprfunc)lease_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "A lease: pinned pages, their page table and the slots of the new\n"
		  "tokens. Made by Client.prepare(), seq_alloc(), seq_create(),\n"
		  "seq_extend(), chunk_register() and chunk_acquire().",
	.tp_traverse = (traverseproc)lease_traverse,
	.tp_clear = (inquiry)lease_clear,
	.tp_weaklistoffset = offsetof(KvpLease, weakrefs),
	.tp_methods = lease_methods,
	.tp_getset = lease_getset,
};
