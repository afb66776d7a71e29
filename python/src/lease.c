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

static int lease_check_range(KvpLease *s, uint64_t first, uint64_t n)
{
	if (first > s->l.n_new || n > s->l.n_new - first) {
		PyErr_Format(PyExc_IndexError,
			     "tokens [%llu, %llu) are outside the %u new tokens of lease %llu",
			     (unsigned long long)first, (unsigned long long)(first + n),
			     s->l.n_new, (unsigned long long)s->l.id);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------ append */

/* The copy itself, checks done; the client's lock is taken here. kv: one
 * [n][layers][2][heads][dim] source; else k and v, per layer (layer < 0:
 * every layer) or of one layer. sync: the copy is done when this returns
 * (a device source torch does not own: nothing else keeps it alive). */
static int do_append(KvpLease *s, uint32_t first, uint32_t n, const void *kv,
		     const void *const *k, const void *const *v, int32_t layer,
		     void *stream, int sync)
{
	KvpClient *c = s->client;
	int ret;

	if (client_enter(c))
		return -1;
	Py_BEGIN_ALLOW_THREADS
	if (kv && sync)
		ret = kvp_append(c->c, &s->l, first, n, kv);
	else if (kv)
		ret = kvp_append_async(c->c, &s->l, first, n, kv, stream);
	else if (layer >= 0)
		ret = kvp_append_layer_async(c->c, &s->l, (uint32_t)layer, first, n,
					     k[0], v[0], stream);
	else
		ret = kvp_append_layers_async(c->c, &s->l, first, n, k, v, stream);
	Py_END_ALLOW_THREADS
	if (ret < 0)
		kvp_raise_client(c, ret);
	client_leave(c);
	return ret < 0 ? -1 : 0;
}

static PyObject *lease_append(KvpLease *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "kv", "first", NULL };
	const struct kvp_layout *L = &s->client->layout;
	const int64_t inner[] = { L->layers, 2, L->kv_heads, L->head_dim };
	struct int_arg first = INT_ARG("first", UINT32_MAX);
	PyObject *kv_o, *res = NULL;
	struct kv_src src;
	int64_t n;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O&:append", kwlist, &kv_o,
					 int_conv, &first))
		return NULL;
	if (lease_check_live(s, "append") || src_get(kv_o, "append", &src))
		return NULL;
	n = src_rows(s->client, &src, "append", inner, 4, L->token_bytes);
	if (n >= 0 && !lease_check_range(s, first.v, (uint64_t)n) &&
	    !do_append(s, (uint32_t)first.v, (uint32_t)n, src.ptr, NULL, NULL, -1,
		       src.stream, src.device >= 0 && !src.is_torch))
		res = Py_NewRef(Py_None);
	src_release(&src);
	return res;
}

/*
 * The sources of count per-layer K or V objects ([n][kv_heads][head_dim]
 * each) into src[0..count); *n their common tokens. On the cuda backend only
 * torch tensors: the per-layer copies are asynchronous, and only torch keeps
 * device memory alive until its stream reaches them.
 */
static int layer_sources(KvpLease *s, PyObject *const *objs, Py_ssize_t count,
			 const char *what, struct kv_src *src, int64_t *n)
{
	const struct kvp_layout *L = &s->client->layout;
	const int64_t inner[] = { L->kv_heads, L->head_dim };
	const uint64_t row = (uint64_t)L->kv_heads * L->head_dim * L->elem_bytes;

	for (Py_ssize_t i = 0; i < count; i++) {
		int64_t rows;

		if (src_get(objs[i], what, &src[i]))
			return -1;
		rows = src_rows(s->client, &src[i], what, inner, 2, row);
		if (rows < 0)
			return -1;
		if (i && rows != *n) {
			PyErr_Format(PyExc_ValueError, "%s: every K and V holds the same "
				     "tokens (%lld, then %lld)", what, (long long)*n,
				     (long long)rows);
			return -1;
		}
		*n = rows;
		if (src[i].device >= 0 && !src[i].is_torch) {
			PyErr_Format(PyExc_TypeError,
				     "%s: on the cuda backend pass torch tensors (the copy "
				     "runs on torch's current stream); for other device "
				     "memory use append()", what);
			return -1;
		}
	}
	return 0;
}

/* append_layers(k, v, first=0): k[layer], v[layer] [n][kv_heads][head_dim]. */
static PyObject *lease_append_layers(KvpLease *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "k", "v", "first", NULL };
	const struct kvp_layout *L = &s->client->layout;
	struct int_arg first = INT_ARG("first", UINT32_MAX);
	const Py_ssize_t count = 2 * (Py_ssize_t)L->layers;
	PyObject *ko, *vo, *kf = NULL, *vf = NULL, *res = NULL, **objs = NULL;
	struct kv_src *src = NULL;
	const void **ptr = NULL;
	int64_t n = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O&:append_layers", kwlist, &ko,
					 &vo, int_conv, &first))
		return NULL;
	if (lease_check_live(s, "append_layers"))
		return NULL;
	kf = PySequence_Fast(ko, "append_layers: k is a sequence of per-layer tensors");
	vf = kf ? PySequence_Fast(vo, "append_layers: v is a sequence of per-layer "
				  "tensors") : NULL;
	if (!vf)
		goto out;
	if (PySequence_Fast_GET_SIZE(kf) != L->layers ||
	    PySequence_Fast_GET_SIZE(vf) != L->layers) {
		PyErr_Format(PyExc_ValueError, "append_layers: %u layers of K and of V, "
			     "not %zd and %zd", L->layers, PySequence_Fast_GET_SIZE(kf),
			     PySequence_Fast_GET_SIZE(vf));
		goto out;
	}
	objs = PyMem_Calloc((size_t)count, sizeof(*objs));
	src = PyMem_Calloc((size_t)count, sizeof(*src));
	ptr = PyMem_Calloc((size_t)count, sizeof(*ptr));
	if (!objs || !src || !ptr) {
		PyErr_NoMemory();
		goto out;
	}
	for (uint32_t i = 0; i < L->layers; i++) {
		objs[i] = PySequence_Fast_GET_ITEM(kf, i);
		objs[L->layers + i] = PySequence_Fast_GET_ITEM(vf, i);
	}
	if (layer_sources(s, objs, count, "append_layers", src, &n) ||
	    lease_check_range(s, first.v, (uint64_t)n))
		goto out;
	for (Py_ssize_t i = 0; i < count; i++)
		ptr[i] = src[i].ptr;
	if (!do_append(s, (uint32_t)first.v, (uint32_t)n, NULL, ptr, ptr + L->layers, -1,
		       src[0].stream, 0))
		res = Py_NewRef(Py_None);
out:
	for (Py_ssize_t i = 0; src && i < count; i++)
		src_release(&src[i]);
	PyMem_Free(src);
	PyMem_Free(objs);
	PyMem_Free(ptr);
	Py_XDECREF(kf);
	Py_XDECREF(vf);
	return res;
}

/* append_layer(layer, k, v, first=0): one layer's K and V,
 * [n][kv_heads][head_dim] each (kvp_append_layer_async). */
static PyObject *lease_append_layer(KvpLease *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "layer", "k", "v", "first", NULL };
	struct int_arg layer = INT_ARG("layer", s->client->layout.layers ?
				       s->client->layout.layers - 1 : 0);
	struct int_arg first = INT_ARG("first", UINT32_MAX);
	PyObject *objs[2], *res = NULL;
	struct kv_src src[2];
	const void *ptr[2];
	int64_t n = 0;

	memset(src, 0, sizeof(src));
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO|O&:append_layer", kwlist,
					 int_conv, &layer, &objs[0], &objs[1], int_conv,
					 &first))
		return NULL;
	if (lease_check_live(s, "append_layer"))
		return NULL;
	if (!layer_sources(s, objs, 2, "append_layer", src, &n) &&
	    !lease_check_range(s, first.v, (uint64_t)n)) {
		ptr[0] = src[0].ptr;
		ptr[1] = src[1].ptr;
		if (!do_append(s, (uint32_t)first.v, (uint32_t)n, NULL, &ptr[0], &ptr[1],
			       (int32_t)layer.v, src[0].stream, 0))
			res = Py_NewRef(Py_None);
	}
	src_release(&src[0]);
	src_release(&src[1]);
	return res;
}

/*
 * _check_write(first, n): raise unless tokens [first, first + n) are
 * writable now, as the library sees it: an append of 0 tokens at first runs
 * every lease check of kvp_append (open, this client's, not committed) and
 * writes nothing. For writers that cannot go through the library (a CUDA
 * graph replaying captured slots): check before each replay.
 */
static PyObject *lease_check_write(KvpLease *s, PyObject *args)
{
	struct int_arg first = INT_ARG("first", UINT32_MAX);
	struct int_arg n = INT_ARG("n", UINT32_MAX);
	KvpClient *c = s->client;
	int ret;

	if (!PyArg_ParseTuple(args, "O&O&:_check_write", int_conv, &first, int_conv, &n))
		return NULL;
	if (lease_check_live(s, "append") || lease_check_range(s, first.v, n.v) ||
	    client_enter(c))
		return NULL;
	CALL(ret, kvp_append(c->c, &s->l, (uint32_t)first.v, 0, NULL));
	if (ret < 0)
		kvp_raise_client(c, ret);
	client_leave(c);
	if (ret < 0)
		return NULL;
	Py_RETURN_NONE;
}

/* ------------------------------------------------------------ commit */

static PyObject *lease_commit(KvpLease *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "n", NULL };
	PyObject *n_o = Py_None;
	uint64_t n = s->l.n_new;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:commit", kwlist, &n_o))
		return NULL;
	if (n_o != Py_None && int_arg(n_o, "commit: n", UINT32_MAX, &n))
		return NULL;
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
	/* 1 (KVP_COMMIT_PENDING): a tensor-parallel group's seal, recorded
	 * until every rank sealed; 0: the chunk is ready. */
	return PyLong_FromLong(ret);
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
	  "(kvp_append) from kv: a torch tensor or DLPack tensor of shape\n"
	  "[n, layers, 2, kv_heads, head_dim] in the pool's dtype, contiguous, where\n"
	  "the pool is (host memory on shm, the pool's GPU on cuda), or a buffer\n"
	  "(numpy array, bytes) of n whole tokens. A tensor is read only within its\n"
	  "storage. On cuda a torch tensor is copied on torch's current stream\n"
	  "(commit() waits for it); other device memory synchronously." },
	{ "append_layers", (PyCFunction)(void (*)(void))lease_append_layers,
	  METH_VARARGS | METH_KEYWORDS,
	  "append_layers($self, /, k, v, first=0)\n--\n\n"
	  "Write new tokens [first, first + n) from per-layer sources: k[layer] and\n"
	  "v[layer] of shape [n, kv_heads, head_dim] (kvp_append_layers_async)." },
	{ "append_layer", (PyCFunction)(void (*)(void))lease_append_layer,
	  METH_VARARGS | METH_KEYWORDS,
	  "append_layer($self, /, layer, k, v, first=0)\n--\n\n"
	  "Write one layer's K and V ([n, kv_heads, head_dim]) of new tokens\n"
	  "[first, first + n) (kvp_append_layer_async)." },
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
	  "(kvp_chunk_seal); this ends the write lease. Returns 0, or 1 (pending)\n"
	  "for a tensor-parallel group's fill lease (Client.join) until the last\n"
	  "rank's seal; None when there was nothing to seal." },
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
