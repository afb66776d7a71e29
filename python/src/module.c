/* SPDX-License-Identifier: MIT */
/*
 * module.c - kvpool._kvpool: module init, errors, and the conversions every
 * part uses (token arrays, chunk ids, user rows).
 *
 * The exception classes live in Python (kvpool/errors.py, with their docs
 * and the parsing of the continuity messages); this file looks up
 * kvpool.errors.from_code once and calls it on the error path only.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

PyObject *ClientClosedError;
PyObject *StaleLeaseError;
static PyObject *from_code; /* kvpool.errors.from_code(errno, message, ...) */

/* ------------------------------------------------------------ errors */

/* from_code(errno, message, connecting, kind, first, last): the class
 * comes from the errno, where it was raised and kvpoold's detail, never
 * from the message's words. */
static PyObject *raise_from(int ret, const char *msg,
			    const struct kvp_error_info *info, int connecting)
{
	static const struct kvp_error_info none;
	PyObject *exc;

	if (!msg || !*msg)
		msg = strerror(ret < 0 ? -ret : ret);
	if (!info)
		info = &none;
	exc = PyObject_CallFunction(from_code, "isiIKK", ret < 0 ? -ret : ret, msg,
				    connecting, (unsigned)info->kind,
				    (unsigned long long)info->first,
				    (unsigned long long)info->last);
	if (!exc)
		return NULL;
	PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
	Py_DECREF(exc);
	return NULL;
}

PyObject *kvp_raise(int ret, const char *msg)
{
	return raise_from(ret, msg, NULL, 0);
}

PyObject *kvp_raise_info(int ret, const char *msg,
			 const struct kvp_error_info *info)
{
	return raise_from(ret, msg, info, 0);
}

PyObject *kvp_raise_connect(int ret, const char *msg)
{
	return raise_from(ret, msg, NULL, 1);
}

PyObject *kvp_raise_client(KvpClient *self, int ret)
{
	/* The message is copied before anything else can call the library. */
	char msg[KVP_ERRLEN];
	struct kvp_error_info info = { 0 };

	snprintf(msg, sizeof(msg), "%s", self->c ? kvp_last_error(self->c) : "");
	if (self->c)
		kvp_last_error_info(self->c, &info);
	return kvp_raise_info(ret, msg, &info);
}

/* ------------------------------------------------------------ tokens */

int tokens_from_object(PyObject *o, uint32_t **out, uint32_t *n, int *owned,
		       Py_buffer *view)
{
	PyObject *seq = NULL, *list = NULL;
	Py_ssize_t len;

	*owned = 0;
	view->obj = NULL;
	if (PyObject_CheckBuffer(o) && !PyUnicode_Check(o)) {
		if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
			return -1;
		if (view->itemsize != 4 || view->len / 4 > UINT32_MAX) {
			PyBuffer_Release(view);
			view->obj = NULL;
			PyErr_SetString(PyExc_TypeError,
					"tokens: a buffer of 4-byte integers (uint32 or "
					"int32) or a sequence of ints");
			return -1;
		}
		*out = view->buf;
		*n = (uint32_t)(view->len / 4);
		return 0;
	}
	/* torch tensors and numpy scalars' containers: tolist() first. */
	if (!PyList_Check(o) && !PyTuple_Check(o) &&
	    PyObject_HasAttrString(o, "tolist")) {
		list = PyObject_CallMethod(o, "tolist", NULL);
		if (!list)
			return -1;
		o = list;
	}
	seq = PySequence_Fast(o, "tokens: a buffer of uint32 or a sequence of ints");
	Py_XDECREF(list);
	if (!seq)
		return -1;
	len = PySequence_Fast_GET_SIZE(seq);
	if ((uint64_t)len > UINT32_MAX) {
		Py_DECREF(seq);
		PyErr_SetString(PyExc_OverflowError, "tokens: too many");
		return -1;
	}
	*out = PyMem_Malloc((size_t)(len ? len : 1) * sizeof(uint32_t));
	if (!*out) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));

		if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_OverflowError,
					     "tokens: token %zd is not a uint32", i);
			PyMem_Free(*out);
			Py_DECREF(seq);
			return -1;
		}
		(*out)[i] = (uint32_t)v;
	}
	Py_DECREF(seq);
	*n = (uint32_t)len;
	*owned = 1;
	return 0;
}

void tokens_release(uint32_t *tok, int owned, Py_buffer *view)
{
	if (owned)
		PyMem_Free(tok);
	else if (view->obj)
		PyBuffer_Release(view);
}

/* ------------------------------------------------------------ chunk ids */

int chunk_id_from_object(PyObject *o, struct kvp_chunk_id *id)
{
	const char *s;
	Py_ssize_t len;
	char hex[65];

	if (PyBytes_Check(o) && PyBytes_GET_SIZE(o) == KVP_CHUNK_ID_BYTES) {
		memcpy(id->b, PyBytes_AS_STRING(o), KVP_CHUNK_ID_BYTES);
		return 0;
	}
	if (PyUnicode_Check(o)) {
		s = PyUnicode_AsUTF8AndSize(o, &len);
		if (!s)
			return -1;
	} else if (PyBytes_Check(o)) {
		s = PyBytes_AS_STRING(o);
		len = PyBytes_GET_SIZE(o);
	} else {
		PyErr_Format(PyExc_TypeError,
			     "a chunk id is 64 hex digits (str), not %.100s",
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	if (len != 64) {
		PyErr_Format(PyExc_ValueError,
			     "a chunk id is 64 hex digits, not %zd characters", len);
		return -1;
	}
	memcpy(hex, s, 64);
	hex[64] = '\0';
	if (kvp_chunk_id_parse(id, hex)) {
		PyErr_Format(PyExc_ValueError, "'%s' is not 64 hex digits", hex);
		return -1;
	}
	return 0;
}

PyObject *chunk_id_to_str(const struct kvp_chunk_id *id)
{
	char hex[65];

	kvp_chunk_id_format(id, hex);
	return PyUnicode_FromString(hex);
}

int chunk_type_from_object(PyObject *o, uint32_t *type, int allow_all)
{
	if (o == NULL || o == Py_None) {
		if (!allow_all) {
			PyErr_SetString(PyExc_ValueError,
					"a chunk type is needed: 'system', 'context' or 'query'");
			return -1;
		}
		*type = 0;
		return 0;
	}
	if (PyUnicode_Check(o)) {
		const char *s = PyUnicode_AsUTF8(o);
		int t;

		if (!s)
			return -1;
		t = kvp_chunk_type_parse(s);
		if (t < 0) {
			PyErr_Format(PyExc_ValueError,
				     "unknown chunk type '%s' (system, context, query)", s);
			return -1;
		}
		*type = (uint32_t)t;
		return 0;
	}
	{
		long t = PyLong_AsLong(o);

		if (t == -1 && PyErr_Occurred())
			return -1;
		if (t < 0 || t > (long)UINT32_MAX || !kvp_chunk_type_name((uint32_t)t)) {
			PyErr_Format(PyExc_ValueError, "unknown chunk type %ld", t);
			return -1;
		}
		*type = (uint32_t)t;
	}
	return 0;
}

/* ------------------------------------------------------------ user rows */

static PyTypeObject UserInfo_Type;

static PyStructSequence_Field user_info_fields[] = {
	{ "user", "the user id" },
	{ "start", "first cached token position" },
	{ "len", "committed tokens cached (0: nothing cached)" },
	{ "pages_device", "pages in the device tier" },
	{ "pages_host", "pages in the host tier" },
	{ "leases", "leases held on this history" },
	{ "tenant", "tenant index (admins listing all)" },
	/* Attributes only, past the 7-tuple (as os.stat_result's st_atime_ns),
	 * so code unpacking the tuple keeps working. */
	{ "pages_disk", "pages of its copy on the disk tier (0: none)" },
	{ "tokens_disk", "committed tokens of that copy" },
	{ NULL, NULL },
};

static PyStructSequence_Desc user_info_desc = {
	"kvpool.UserInfo",
	"UserInfo(user, start, len, pages_device, pages_host, leases, tenant)\n\n"
	"A user's cached history: tokens [start, start + len). len == 0 means\n"
	"nothing is cached (then start means nothing either). pages_disk and\n"
	"tokens_disk (attributes, not in the tuple) tell its copy on the disk\n"
	"tier: 0 without one.",
	user_info_fields, 7,
};

PyObject *user_info_to_object(const struct kvp_user_info *in)
{
	PyObject *o = PyStructSequence_New(&UserInfo_Type);

	if (!o)
		return NULL;
	PyStructSequence_SET_ITEM(o, 0, PyLong_FromUnsignedLongLong(in->user));
	PyStructSequence_SET_ITEM(o, 1, PyLong_FromUnsignedLongLong(in->start));
	PyStructSequence_SET_ITEM(o, 2, PyLong_FromUnsignedLongLong(in->len));
	PyStructSequence_SET_ITEM(o, 3, PyLong_FromUnsignedLong(in->pages_device));
	PyStructSequence_SET_ITEM(o, 4, PyLong_FromUnsignedLong(in->pages_host));
	PyStructSequence_SET_ITEM(o, 5, PyLong_FromUnsignedLong(in->leases));
	PyStructSequence_SET_ITEM(o, 6, PyLong_FromUnsignedLong(in->tenant));
	PyStructSequence_SET_ITEM(o, 7, PyLong_FromUnsignedLong(in->pages_disk));
	PyStructSequence_SET_ITEM(o, 8, PyLong_FromUnsignedLongLong(in->tokens_disk));
	for (int i = 0; i < 9; i++)
		if (!PyStructSequence_GET_ITEM(o, i)) {
			Py_DECREF(o);
			return NULL;
		}
	return o;
}

PyObject *user_info_to_dict(const struct kvp_user_info *in)
{
	return Py_BuildValue("{sKsKsKsIsIsIsIsIsK}", "user",
			     (unsigned long long)in->user, "start",
			     (unsigned long long)in->start, "len",
			     (unsigned long long)in->len, "pages_device",
			     in->pages_device, "pages_host", in->pages_host,
			     "leases", in->leases, "tenant", in->tenant,
			     "pages_disk", in->pages_disk, "tokens_disk",
			     (unsigned long long)in->tokens_disk);
}

/* ------------------------------------------------------------ module */

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
	return PyLong_FromLong(kvp_version());
}

/* _register_lease_class(cls): prepare() and friends create cls objects. */
static PyObject *mod_register_lease_class(PyObject *m, PyObject *cls)
{
	if (!PyType_Check(cls) ||
	    !PyType_IsSubtype((PyTypeObject *)cls, &KvpLease_Type)) {
		PyErr_SetString(PyExc_TypeError, "not a subclass of _kvpool.Lease");
		return NULL;
	}
	Py_INCREF(cls);
	Py_XDECREF((PyObject *)(lease_type == &KvpLease_Type ? NULL : lease_type));
	lease_type = (PyTypeObject *)cls;
	Py_RETURN_NONE;
}

static PyObject *mod_layout_parse(PyObject *m, PyObject *arg)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN];
	const char *spec = PyUnicode_AsUTF8(arg);
	int ret;

	if (!spec)
		return NULL;
	ret = kvp_layout_parse(&l, spec, err, sizeof(err));
	if (ret)
		return kvp_raise(ret, err);
	return Py_BuildValue("{sIsIsIsssIsIsKsKsKsKsKsK}", "layers", l.layers,
			     "kv_heads", l.kv_heads, "head_dim", l.head_dim, "dtype",
			     kvp_dtype_name(l.dtype), "page_tokens", l.page_tokens,
			     "elem_bytes", l.elem_bytes, "head_stride",
			     (unsigned long long)l.head_stride, "token_stride",
			     (unsigned long long)l.token_stride, "kv_stride",
			     (unsigned long long)l.kv_stride, "layer_stride",
			     (unsigned long long)l.layer_stride, "page_bytes",
			     (unsigned long long)l.page_bytes, "token_bytes",
			     (unsigned long long)l.token_bytes);
}

static PyMethodDef module_methods[] = {
	{ "version", mod_version, METH_NOARGS,
	  "version($module, /)\n--\n\n"
	  "libkvpool's version: major * 1000 + minor (kvp_version)." },
	{ "layout_parse", mod_layout_parse, METH_O,
	  "layout_parse($module, spec, /)\n--\n\n"
	  "Parse 'layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32' into\n"
	  "a dict with every stride (kvp_layout_parse). Raises InvalidArgumentError." },
	{ "_register_lease_class", mod_register_lease_class, METH_O,
	  "The package's Lease subclass, which prepare() and friends create." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef kvpool_module = {
	PyModuleDef_HEAD_INIT,
	"kvpool._kvpool",
	"The C core of the kvpool package: libkvpool's calls as Client and Lease\n"
	"methods, and View, a zero-copy window on the device tier. Use it through\n"
	"the kvpool package (kvpool.connect).",
	-1,
	module_methods,
	NULL, NULL, NULL, NULL,
};

/* Client's method table is its own plus client_pool.c's, share.c's,
 * chunk.c's, queue.c's and seq_info.c's. */
extern PyMethodDef client_methods[];

static PyMethodDef *concat_methods(void)
{
	PyMethodDef *parts[] = { client_methods, client_pool_methods, client_share_methods,
				 client_chunk_methods, client_queue_methods,
				 client_seq_methods };
	const size_t nparts = sizeof(parts) / sizeof(parts[0]);
	size_t n = 0, k = 0;
	PyMethodDef *all;

	for (size_t p = 0; p < nparts; p++)
		for (PyMethodDef *d = parts[p]; d->ml_name; d++)
			n++;
	all = PyMem_Calloc(n + 1, sizeof(*all));
	if (!all)
		return NULL;
	for (size_t p = 0; p < nparts; p++)
		for (PyMethodDef *d = parts[p]; d->ml_name; d++)
			all[k++] = *d;
	return all;
}

/* The one exported symbol; the prototype satisfies -Wmissing-prototypes. */
/* ------------------------------------------------------------ fork */

/* Bumped in every child fork() makes: a Client made before it is the
 * parent's (client.c, client_check_open). */
unsigned int kvp_py_fork_gen;

static void fork_child(void)
{
	__atomic_add_fetch(&kvp_py_fork_gen, 1, __ATOMIC_RELAXED);
}

PyMODINIT_FUNC PyInit__kvpool(void);

PyMODINIT_FUNC PyInit__kvpool(void)
{
	PyObject *m, *errors;

	errors = PyImport_ImportModule("kvpool.errors");
	if (!errors)
		return NULL;
	from_code = PyObject_GetAttrString(errors, "from_code");
	ClientClosedError = PyObject_GetAttrString(errors, "ClientClosedError");
	StaleLeaseError = PyObject_GetAttrString(errors, "StaleLeaseError");
	Py_DECREF(errors);
	if (!from_code || !ClientClosedError || !StaleLeaseError)
		return NULL;

	KvpClient_Type.tp_methods = concat_methods();
	if (!KvpClient_Type.tp_methods) {
		PyErr_NoMemory();
		return NULL;
	}
	if (PyType_Ready(&KvpClient_Type) < 0 || PyType_Ready(&KvpLease_Type) < 0 ||
	    PyType_Ready(&KvpView_Type) < 0)
		return NULL;
	if (PyStructSequence_InitType2(&UserInfo_Type, &user_info_desc) < 0)
		return NULL;

	m = PyModule_Create(&kvpool_module);
	if (!m)
		return NULL;
	/* Once per process: a module is initialised once per interpreter. */
	{
		static int hooked;

		if (!hooked && !pthread_atfork(NULL, NULL, fork_child))
			hooked = 1;
	}
	Py_INCREF(&KvpClient_Type);
	Py_INCREF(&KvpLease_Type);
	Py_INCREF(&KvpView_Type);
	Py_INCREF(&UserInfo_Type);
	if (PyModule_AddObject(m, "Client", (PyObject *)&KvpClient_Type) ||
	    PyModule_AddObject(m, "Lease", (PyObject *)&KvpLease_Type) ||
	    PyModule_AddObject(m, "View", (PyObject *)&KvpView_Type) ||
	    PyModule_AddObject(m, "UserInfo", (PyObject *)&UserInfo_Type) ||
	    PyModule_AddStringConstant(m, "DEFAULT_SOCKET", KVP_DEFAULT_SOCKET) ||
	    PyModule_AddIntConstant(m, "SEL_DEVICE", KVP_SEL_DEVICE) ||
	    PyModule_AddIntConstant(m, "SEL_HOST", KVP_SEL_HOST) ||
	    PyModule_AddIntConstant(m, "SEL_ALL", KVP_SEL_ALL) ||
	    PyModule_AddIntConstant(m, "SEQ_TOKEN_IDS", KVP_SEQ_TOKEN_IDS) ||
	    PyModule_AddIntConstant(m, "SEQ_CACHING", KVP_SEQ_CACHING) ||
	    PyModule_AddIntConstant(m, "ERRLEN", KVP_ERRLEN) ||
	    share_module_init(m) || queue_module_init(m)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
