/* SPDX-License-Identifier: MIT */
/*
 * view.c - kvpool._kvpool.View: a strided window on a client's device tier,
 * handed to torch / numpy / cupy without a copy.
 *
 *   shm backend (host memory): the buffer protocol (numpy.asarray(view),
 *     memoryview(view)) and DLPack on kDLCPU (torch.from_dlpack(view));
 *   cuda backend (device memory): DLPack on kDLCUDA and
 *     __cuda_array_interface__ (v3) for cupy / numba.
 *
 * Every export holds the View, and the View holds its Client, whose device
 * tier stays mapped while any View lives (client.c: MAPPING LIFETIME). A
 * View of a closed client refuses new exports (ClientClosedError); what was
 * exported before stays valid memory until it is freed.
 *
 * bf16 and fp8 have no buffer-protocol format: the buffer protocol exports
 * them as 'H' and 'B' (raw bits; numpy has no bf16); DLPack exports bf16 as
 * kDLBfloat and fp8 as uint8 (view it as torch.float8_e4m3fn where torch
 * has it).
 */
#include "kvpoolmodule.h"
#include "dlpack_abi.h"

#include <string.h>

static uint64_t view_elem(const KvpView *v)
{
	switch (v->dtype) {
	case KVP_DTYPE_FP32:
		return 4;
	case KVP_DTYPE_BF16:
	case KVP_DTYPE_FP16:
		return 2;
	default:
		return 1; /* fp8, raw bytes (0) */
	}
}

static void view_dealloc(KvpView *v)
{
	KvpClient *c = v->client;

	if (c) {
		v->client = NULL;
		client_view_put(c);
		Py_DECREF(c);
	}
	PyObject_Free(v);
}

static int view_usable(KvpView *v)
{
	return v->client ? client_check_open(v->client) : -1;
}

/* ------------------------------------------------------------ buffer */

static int view_getbuffer(KvpView *v, Py_buffer *b, int flags)
{
	static char fmt_f[] = "f", fmt_e[] = "e", fmt_h[] = "H", fmt_b[] = "B";
	const uint64_t elem = view_elem(v);
	Py_ssize_t len = (Py_ssize_t)elem;

	b->obj = NULL;
	if (view_usable(v))
		return -1;
	if (v->client->cuda_device >= 0) {
		PyErr_SetString(PyExc_BufferError,
				"the pool is in GPU memory: use torch.from_dlpack(view) "
				"or __cuda_array_interface__, not the buffer protocol");
		return -1;
	}
	if ((flags & PyBUF_ND) != PyBUF_ND && v->ndim != 1) {
		PyErr_SetString(PyExc_BufferError, "this view is multi-dimensional");
		return -1;
	}
	for (int i = 0; i < v->ndim; i++)
		len *= (Py_ssize_t)v->shape[i];
	/* Contiguity is not promised: refuse a consumer that needs it
	 * unless the view happens to be C-contiguous. */
	if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES) {
		int64_t want = 1;

		for (int i = v->ndim; i-- > 0;) {
			if (v->shape[i] != 1 && v->strides[i] != want) {
				PyErr_SetString(PyExc_BufferError,
						"this view is strided: ask for strides");
				return -1;
			}
			want *= v->shape[i];
		}
	}
	b->buf = v->data;
	b->obj = Py_NewRef((PyObject *)v);
	b->len = len;
	b->readonly = 0;
	b->itemsize = (Py_ssize_t)elem;
	b->format = NULL;
	if (flags & PyBUF_FORMAT)
		b->format = v->dtype == KVP_DTYPE_FP32 ? fmt_f :
			    v->dtype == KVP_DTYPE_FP16 ? fmt_e :
			    v->dtype == KVP_DTYPE_BF16 ? fmt_h : fmt_b;
	b->ndim = v->ndim;
	/* Py_buffer wants Py_ssize_t arrays: keep them after the View's own
	 * (internal), allocated per export. */
	b->shape = NULL;
	b->strides = NULL;
	b->suboffsets = NULL;
	b->internal = PyMem_Malloc(2 * VIEW_MAX_DIMS * sizeof(Py_ssize_t));
	if (!b->internal) {
		Py_CLEAR(b->obj);
		PyErr_NoMemory();
		return -1;
	}
	{
		Py_ssize_t *sh = b->internal, *st = sh + VIEW_MAX_DIMS;

		for (int i = 0; i < v->ndim; i++) {
			sh[i] = (Py_ssize_t)v->shape[i];
			st[i] = (Py_ssize_t)(v->strides[i] * (int64_t)elem);
		}
		if (flags & PyBUF_ND)
			b->shape = sh;
		if ((flags & PyBUF_STRIDES) == PyBUF_STRIDES)
			b->strides = st;
	}
	v->exports++;
	return 0;
}

static void view_releasebuffer(KvpView *v, Py_buffer *b)
{
	PyMem_Free(b->internal);
	b->internal = NULL;
	v->exports--;
}

static PyBufferProcs view_as_buffer = {
	.bf_getbuffer = (getbufferproc)view_getbuffer,
	.bf_releasebuffer = (releasebufferproc)view_releasebuffer,
};

/* ------------------------------------------------------------ DLPack */

/* One allocation: the managed tensor, then shape and strides. */
struct dl_legacy {
	kvp_dl_managed m;
	int64_t shape[VIEW_MAX_DIMS];
	int64_t strides[VIEW_MAX_DIMS];
};

struct dl_versioned {
	kvp_dl_managed_v m;
	int64_t shape[VIEW_MAX_DIMS];
	int64_t strides[VIEW_MAX_DIMS];
};

/* The consumer's deleter may run on any thread, GIL or not. */
static void dl_drop_ctx(void *ctx)
{
	PyGILState_STATE g = PyGILState_Ensure();

	Py_XDECREF((PyObject *)ctx);
	PyGILState_Release(g);
}

static void dl_legacy_deleter(kvp_dl_managed *m)
{
	dl_drop_ctx(m->manager_ctx);
	PyMem_RawFree(m);
}

static void dl_versioned_deleter(kvp_dl_managed_v *m)
{
	dl_drop_ctx(m->manager_ctx);
	PyMem_RawFree(m);
}

static void fill_dl_tensor(KvpView *v, kvp_dl_tensor *t, int64_t *shape,
			   int64_t *strides)
{
	t->data = v->data;
	t->byte_offset = 0;
	t->device.device_type = v->client->cuda_device >= 0 ? KVP_DL_CUDA : KVP_DL_CPU;
	t->device.device_id = v->client->cuda_device >= 0 ? v->client->cuda_device : 0;
	t->ndim = v->ndim;
	t->dtype.lanes = 1;
	switch (v->dtype) {
	case KVP_DTYPE_FP32:
		t->dtype.code = KVP_DL_FLOAT;
		t->dtype.bits = 32;
		break;
	case KVP_DTYPE_FP16:
		t->dtype.code = KVP_DL_FLOAT;
		t->dtype.bits = 16;
		break;
	case KVP_DTYPE_BF16:
		t->dtype.code = KVP_DL_BFLOAT;
		t->dtype.bits = 16;
		break;
	default:
		t->dtype.code = KVP_DL_UINT;
		t->dtype.bits = 8;
		break;
	}
	memcpy(shape, v->shape, sizeof(int64_t) * (size_t)v->ndim);
	memcpy(strides, v->strides, sizeof(int64_t) * (size_t)v->ndim);
	t->shape = shape;
	t->strides = strides;
}

static void capsule_legacy_destructor(PyObject *cap)
{
	/* Not consumed: the capsule still owns the tensor. */
	if (PyCapsule_IsValid(cap, "dltensor")) {
		kvp_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");

		if (m && m->deleter)
			m->deleter(m);
	}
}

static void capsule_versioned_destructor(PyObject *cap)
{
	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		kvp_dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");

		if (m && m->deleter)
			m->deleter(m);
	}
}

/*
 * __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None).
 * The tier has no pending work of its own on any stream (appends through the
 * library are ordered by commit), so stream needs no synchronisation here.
 */
static PyObject *view_dlpack(KvpView *v, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "stream", "max_version", "dl_device", "copy", NULL };
	PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
		 *copy = Py_None, *cap;
	long major = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream,
					 &max_version, &dl_device, &copy))
		return NULL;
	if (view_usable(v))
		return NULL;
	if (copy == Py_True) {
		PyErr_SetString(PyExc_BufferError,
				"kvpool views are zero-copy: copy=True is not supported "
				"(copy the tensor afterwards)");
		return NULL;
	}
	if (max_version != Py_None) {
		PyObject *o = PySequence_GetItem(max_version, 0);

		if (!o)
			return NULL;
		major = PyLong_AsLong(o);
		Py_DECREF(o);
		if (major == -1 && PyErr_Occurred())
			return NULL;
	}
	if (major >= 1) {
		struct dl_versioned *d = PyMem_RawCalloc(1, sizeof(*d));

		if (!d)
			return PyErr_NoMemory();
		d->m.version.major = 1;
		d->m.version.minor = 0;
		d->m.flags = 0;
		fill_dl_tensor(v, &d->m.dl_tensor, d->shape, d->strides);
		d->m.manager_ctx = Py_NewRef((PyObject *)v);
		d->m.deleter = dl_versioned_deleter;
		cap = PyCapsule_New(&d->m, "dltensor_versioned",
				    capsule_versioned_destructor);
		if (!cap)
			dl_versioned_deleter(&d->m);
		return cap;
	} else {
		struct dl_legacy *d = PyMem_RawCalloc(1, sizeof(*d));

		if (!d)
			return PyErr_NoMemory();
		fill_dl_tensor(v, &d->m.dl_tensor, d->shape, d->strides);
		d->m.manager_ctx = Py_NewRef((PyObject *)v);
		d->m.deleter = dl_legacy_deleter;
		cap = PyCapsule_New(&d->m, "dltensor", capsule_legacy_destructor);
		if (!cap)
			dl_legacy_deleter(&d->m);
		return cap;
	}
}

static PyObject *view_dlpack_device(KvpView *v, PyObject *unused)
{
	if (!v->client)
		return NULL;
	if (v->client->cuda_device >= 0)
		return Py_BuildValue("(ii)", KVP_DL_CUDA, v->client->cuda_device);
	return Py_BuildValue("(ii)", KVP_DL_CPU, 0);
}

/* __cuda_array_interface__ v3: only on the cuda backend (AttributeError on
 * shm, so hasattr() tells consumers which protocol to use). */
static PyObject *view_cai(KvpView *v, void *unused)
{
	const uint64_t elem = view_elem(v);
	const char *typestr;
	PyObject *shape, *strides, *d;

	if (!v->client || v->client->cuda_device < 0) {
		PyErr_SetString(PyExc_AttributeError,
				"__cuda_array_interface__: the pool is in host memory "
				"(shm backend); use the buffer protocol or DLPack");
		return NULL;
	}
	if (view_usable(v))
		return NULL;
	typestr = v->dtype == KVP_DTYPE_FP32 ? "<f4" :
		  v->dtype == KVP_DTYPE_FP16 ? "<f2" :
		  v->dtype == KVP_DTYPE_BF16 ? "<V2" : "|u1";
	shape = PyTuple_New(v->ndim);
	strides = PyTuple_New(v->ndim);
	if (!shape || !strides) {
		Py_XDECREF(shape);
		Py_XDECREF(strides);
		return NULL;
	}
	for (int i = 0; i < v->ndim; i++) {
		PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(v->shape[i]));
		PyTuple_SET_ITEM(strides, i,
				 PyLong_FromLongLong(v->strides[i] * (int64_t)elem));
	}
	d = Py_BuildValue("{sNsssNs(NO)sisO}", "shape", shape, "typestr", typestr,
			  "strides", strides, "data",
			  PyLong_FromVoidPtr(v->data), Py_False, "version", 3,
			  "stream", Py_None);
	return d;
}

/* ------------------------------------------------------------ attributes */

static PyObject *view_shape(KvpView *v, void *unused)
{
	PyObject *t = PyTuple_New(v->ndim);

	for (int i = 0; t && i < v->ndim; i++)
		PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(v->shape[i]));
	return t;
}

static PyObject *view_strides(KvpView *v, void *unused)
{
	PyObject *t = PyTuple_New(v->ndim);

	for (int i = 0; t && i < v->ndim; i++)
		PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(v->strides[i]));
	return t;
}

static PyObject *view_dtype(KvpView *v, void *unused)
{
	const char *n = kvp_dtype_name(v->dtype);

	return PyUnicode_FromString(n ? n : "u8");
}

static PyObject *view_data_ptr(KvpView *v, void *unused)
{
	return PyLong_FromVoidPtr(v->data);
}

static PyObject *view_client(KvpView *v, void *unused)
{
	return Py_NewRef(v->client ? (PyObject *)v->client : Py_None);
}

static PyGetSetDef view_getset[] = {
	{ "shape", (getter)view_shape, NULL, "The shape.", NULL },
	{ "strides", (getter)view_strides, NULL, "Strides in elements.", NULL },
	{ "dtype", (getter)view_dtype, NULL, "The kvpool dtype name ('u8': raw bytes).", NULL },
	{ "data_ptr", (getter)view_data_ptr, NULL, "Address of the first element.", NULL },
	{ "client", (getter)view_client, NULL, "The Client whose tier this is.", NULL },
	{ "__cuda_array_interface__", (getter)view_cai, NULL,
	  "CUDA Array Interface v3 (cuda backend only).", NULL },
	{ NULL },
};

static PyMethodDef view_methods[] = {
	{ "__dlpack__", (PyCFunction)(void (*)(void))view_dlpack, METH_VARARGS | METH_KEYWORDS,
	  "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n"
	  "--\n\nA DLPack capsule of this view (no copy)." },
	{ "__dlpack_device__", (PyCFunction)view_dlpack_device, METH_NOARGS,
	  "(kDLCPU, 0) on the shm backend, (kDLCUDA, ordinal) on cuda." },
	{ NULL, NULL, 0, NULL },
};

static PyObject *view_repr(KvpView *v)
{
	PyObject *shape = view_shape(v, NULL), *r;

	if (!shape)
		return NULL;
	r = PyUnicode_FromFormat("<kvpool.View %s %R on %s>", kvp_dtype_name(v->dtype) ?
				 kvp_dtype_name(v->dtype) : "u8", shape,
				 v->client && v->client->cuda_device >= 0 ? "cuda" : "cpu");
	Py_DECREF(shape);
	return r;
}

PyTypeObject KvpView_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "kvpool._kvpool.View",
	.tp_basicsize = sizeof(KvpView),
	.tp_dealloc = (destructor)view_dealloc,
	.tp_repr = (reprfunc)view_repr,
	.tp_as_buffer = &view_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A zero-copy window on the device tier: torch.from_dlpack(view),\n"
		  "numpy.asarray(view) (shm), cupy.asarray(view) (cuda). Made by\n"
		  "Client.tier_view(), layer_view(), page_view().",
	.tp_getset = view_getset,
	.tp_methods = view_methods,
};
