/* SPDX-License-Identifier: MIT */
/*
 * source.c - what an append may read from, and the integers every call
 * takes, checked before anything is written.
 *
 * SOURCES. libkvpool copies n * token_bytes from the pointer it is given,
 * into pages other processes of the tenant read, so the pointer and the
 * length must come from memory that really is there, never from what an
 * object says about itself. Three kinds are taken:
 *
 *   a torch tensor  - its pointer, shape, strides, dtype and device from
 *                     torch's own DLPack export of the tensor (the at::Tensor
 *                     itself, not a Python attribute a subclass could
 *                     override), and the bytes it may read from its storage
 *                     (nbytes and data_ptr): the rows must lie inside that
 *                     one allocation (a tensor whose storage was resized
 *                     under it is refused, not read);
 *   a DLPack capsule - ("dltensor" / "dltensor_versioned", or what an
 *                     object's __dlpack__() returns): made by C code that
 *                     vouches for its pointer and shape;
 *   a buffer         - the buffer protocol (numpy, bytes, memoryview): its
 *                     pointer and len are the exporter's.
 *
 * Anything else is a TypeError naming what to pass. On the cuda backend a
 * torch tensor's copy runs on torch's current stream; any other device
 * source is copied synchronously (kvp_append) or refused where only the
 * asynchronous copy exists (per-layer appends), since nothing would keep
 * its memory alive until the stream reached the copy.
 *
 * INTEGERS. PyArg's k, K and I formats wrap silently (2**64 + 2 is 2); every
 * integer argument goes through int_arg() instead: an int (or anything with
 * __index__), within its range, else OverflowError naming the argument and
 * the range, before any call is made.
 */
#include "kvpoolmodule.h"
#include "dlpack_abi.h"

#include <string.h>

/* ------------------------------------------------------------ integers */

int int_arg(PyObject *o, const char *name, uint64_t max, uint64_t *out)
{
	PyObject *i, *zero;
	unsigned long long v;
	int neg;

	if (PyFloat_Check(o) || !(i = PyNumber_Index(o))) {
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError, "%s: an integer from 0 to %llu, not %.80s",
			     name, (unsigned long long)max, Py_TYPE(o)->tp_name);
		return -1;
	}
	zero = PyLong_FromLong(0);
	neg = zero ? PyObject_RichCompareBool(i, zero, Py_LT) : -1;
	Py_XDECREF(zero);
	if (neg < 0) {
		Py_DECREF(i);
		return -1;
	}
	v = neg ? 0 : PyLong_AsUnsignedLongLong(i);
	if (neg || (v == (unsigned long long)-1 && PyErr_Occurred()) || v > max) {
		PyErr_Clear();
		PyErr_Format(PyExc_OverflowError, "%s: %R is outside 0..%llu", name, i,
			     (unsigned long long)max);
		Py_DECREF(i);
		return -1;
	}
	Py_DECREF(i);
	*out = v;
	return 0;
}

int int_conv(PyObject *o, void *p)
{
	struct int_arg *a = p;

	return int_arg(o, a->name, a->max, &a->v) ? 0 : 1;
}

/* ------------------------------------------------------------ sources */

static void src_init(struct kv_src *s)
{
	memset(s, 0, sizeof(*s));
	s->device = -1;
}

void src_release(struct kv_src *s)
{
	if (s->have_buf)
		PyBuffer_Release(&s->buf);
	s->have_buf = 0;
	Py_CLEAR(s->keep);
}

/* The kvp dtype of a DLPack dtype (0: none of the pool's). */
static uint32_t dl_kvp_dtype(kvp_dl_dtype t)
{
	if (t.lanes != 1)
		return 0;
	if (t.code == KVP_DL_FLOAT && t.bits == 32)
		return KVP_DTYPE_FP32;
	if (t.code == KVP_DL_FLOAT && t.bits == 16)
		return KVP_DTYPE_FP16;
	if (t.code == KVP_DL_BFLOAT && t.bits == 16)
		return KVP_DTYPE_BF16;
	/* fp8 travels as uint8 bits (view.c); DLPack 1.x's kDLFloat8_e4m3fn
	 * is code 10. */
	if ((t.code == KVP_DL_UINT || t.code == 10) && t.bits == 8)
		return KVP_DTYPE_FP8_E4M3;
	return 0;
}

/* Fill s from a DLPack tensor: pointer, shape, dtype, device; C-contiguous
 * or refused. nbytes is what the shape says (the producer vouches). */
static int src_from_dl(struct kv_src *s, const kvp_dl_tensor *t, const char *what)
{
	int64_t want = 1;
	uint64_t elems = 1;

	if (t->ndim < 1 || t->ndim > VIEW_MAX_DIMS) {
		PyErr_Format(PyExc_ValueError, "%s: a tensor of %d dimensions", what,
			     (int)t->ndim);
		return -1;
	}
	s->ndim = t->ndim;
	for (int i = t->ndim; i-- > 0;) {
		if (t->shape[i] < 0 || t->shape[i] > (1ll << 40)) {
			PyErr_Format(PyExc_ValueError, "%s: dimension %d of size %lld", what,
				     i, (long long)t->shape[i]);
			return -1;
		}
		s->shape[i] = t->shape[i];
		if (t->strides && t->shape[i] != 1 && t->strides[i] != want) {
			PyErr_Format(PyExc_ValueError,
				     "%s: the tensor must be contiguous (.contiguous())", what);
			return -1;
		}
		want *= t->shape[i];
		elems *= (uint64_t)t->shape[i];
	}
	s->dtype = dl_kvp_dtype(t->dtype);
	s->dl_code = t->dtype.code;
	s->dl_bits = t->dtype.bits;
	s->ptr = (const char *)t->data + t->byte_offset;
	s->nbytes = elems * ((t->dtype.bits + 7u) / 8u);
	if (t->device.device_type == KVP_DL_CUDA)
		s->device = t->device.device_id;
	else if (t->device.device_type == KVP_DL_CPU)
		s->device = -1;
	else {
		PyErr_Format(PyExc_ValueError,
			     "%s: memory on DLPack device type %d; kvpool reads host "
			     "(kDLCPU) or CUDA (kDLCUDA) memory", what,
			     (int)t->device.device_type);
		return -1;
	}
	return 0;
}

static int src_from_capsule(struct kv_src *s, PyObject *cap, const char *what)
{
	if (PyCapsule_IsValid(cap, "dltensor")) {
		kvp_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");

		return src_from_dl(s, &m->dl_tensor, what);
	}
	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		kvp_dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");

		if (m->version.major != 1) {
			PyErr_Format(PyExc_ValueError, "%s: DLPack %u.%u; this reads 1.x",
				     what, m->version.major, m->version.minor);
			return -1;
		}
		return src_from_dl(s, &m->dl_tensor, what);
	}
	PyErr_Format(PyExc_TypeError,
		     "%s: a capsule that is not an unconsumed DLPack tensor ('dltensor')",
		     what);
	return -1;
}

/* torch's own view of a tensor: base-class methods, not the object's. */
static PyObject *torch_base(PyObject *torch_C)
{
	PyObject *b = PyObject_GetAttrString(torch_C, "TensorBase");

	if (!b) {
		PyErr_Clear();
		b = PyObject_GetAttrString(torch_C, "_TensorBase");
	}
	return b;
}

/* The storage's [data_ptr, data_ptr + nbytes) of tensor t. */
static int torch_storage_range(PyObject *base, PyObject *t, uint64_t *lo,
			       uint64_t *nbytes)
{
	PyObject *st = NULL, *p = NULL, *n = NULL;
	int ret = -1;

	if (PyObject_HasAttrString(base, "untyped_storage"))
		st = PyObject_CallMethod(base, "untyped_storage", "O", t);
	else
		st = PyObject_CallMethod(base, "_storage", "O", t);
	if (!st)
		return -1;
	p = PyObject_CallMethod(st, "data_ptr", NULL);
	n = p ? PyObject_CallMethod(st, "nbytes", NULL) : NULL;
	if (n) {
		*lo = PyLong_AsUnsignedLongLong(p);
		*nbytes = PyLong_AsUnsignedLongLong(n);
		ret = PyErr_Occurred() ? -1 : 0;
	}
	Py_XDECREF(p);
	Py_XDECREF(n);
	Py_DECREF(st);
	return ret;
}

/* The current torch stream of CUDA device dev, as a pointer. */
static void *torch_stream(PyObject *torch, int dev)
{
	PyObject *cuda = PyObject_GetAttrString(torch, "cuda"), *st, *h;
	void *p = NULL;

	if (!cuda)
		return NULL;
	st = PyObject_CallMethod(cuda, "current_stream", "i", dev);
	Py_DECREF(cuda);
	h = st ? PyObject_GetAttrString(st, "cuda_stream") : NULL;
	Py_XDECREF(st);
	if (h) {
		p = PyLong_AsVoidPtr(h);
		Py_DECREF(h);
	}
	return p;
}

/* Whether tensor t has 1-byte elements (fp8 bits, uint8). */
static int one_byte(PyObject *base, PyObject *t)
{
	PyObject *e = PyObject_CallMethod(base, "element_size", "O", t);
	long v = e ? PyLong_AsLong(e) : -1;

	Py_XDECREF(e);
	PyErr_Clear();
	return v == 1;
}

/* torch's DLPack export of t (torch._C._to_dlpack, else the public one). */
static PyObject *to_dlpack(PyObject *torch, PyObject *torch_C, PyObject *t)
{
	PyObject *utils, *cap;

	if (PyObject_HasAttrString(torch_C, "_to_dlpack"))
		return PyObject_CallMethod(torch_C, "_to_dlpack", "O", t);
	utils = PyImport_ImportModule("torch.utils.dlpack");
	if (!utils)
		return NULL;
	cap = PyObject_CallMethod(utils, "to_dlpack", "O", t);
	Py_DECREF(utils);
	return cap;
}

static int src_from_torch(struct kv_src *s, PyObject *torch, PyObject *o,
			  const char *what)
{
	PyObject *torch_C = PyObject_GetAttrString(torch, "_C"), *base = NULL,
		 *t = NULL, *cap = NULL;
	uint64_t lo, nbytes, p;
	int ret = -1;

	if (!torch_C || !(base = torch_base(torch_C)))
		goto out;
	/* detach(): DLPack refuses a tensor that requires grad; the bytes
	 * are the same. Whatever it returns is what is measured below. */
	t = PyObject_CallMethod(base, "detach", "O", o);
	if (t && one_byte(base, t)) {
		/* fp8 bits: DLPack has no float8 in older torch; the bytes as
		 * uint8 are the same bytes. */
		PyObject *u8 = PyObject_GetAttrString(torch, "uint8"), *tv;

		tv = u8 ? PyObject_CallMethod(base, "view", "OO", t, u8) : NULL;
		Py_XDECREF(u8);
		Py_SETREF(t, tv);
	}
	cap = t ? to_dlpack(torch, torch_C, t) : NULL;
	if (!cap && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
		/* torch's own check (e.g. sizes past the storage). */
		PyObject *et, *ev, *tb;

		PyErr_Fetch(&et, &ev, &tb);
		PyErr_NormalizeException(&et, &ev, &tb);
		PyErr_Format(PyExc_ValueError, "%s: torch cannot export this tensor "
			     "(%S); nothing was read", what, ev ? ev : Py_None);
		Py_XDECREF(et);
		Py_XDECREF(ev);
		Py_XDECREF(tb);
	}
	if (!cap || src_from_capsule(s, cap, what) ||
	    torch_storage_range(base, t, &lo, &nbytes))
		goto out;
	p = (uint64_t)(uintptr_t)s->ptr;
	/* The rows the shape claims, inside the storage that is there. */
	if (s->nbytes && (p < lo || p - lo > nbytes || s->nbytes > nbytes - (p - lo))) {
		PyErr_Format(PyExc_ValueError,
			     "%s: the tensor claims %llu bytes at offset %lld of a "
			     "storage of %llu bytes; refusing to read past its storage",
			     what, (unsigned long long)s->nbytes,
			     (long long)(p - lo), (unsigned long long)nbytes);
		goto out;
	}
	s->is_torch = 1;
	s->keep = cap;
	cap = NULL;
	if (s->device >= 0) {
		s->stream = torch_stream(torch, s->device);
		if (PyErr_Occurred())
			goto out;
	}
	ret = 0;
out:
	Py_XDECREF(cap);
	Py_XDECREF(t);
	Py_XDECREF(base);
	Py_XDECREF(torch_C);
	return ret;
}

/* Whether o is a torch.Tensor (torch imported by someone already). */
static int is_torch_tensor(PyObject *o, PyObject **torch)
{
	PyObject *tensor, *name = PyUnicode_FromString("torch");
	int r;

	*torch = name ? PyImport_GetModule(name) : NULL;
	Py_XDECREF(name);
	if (!*torch) {
		PyErr_Clear();
		return 0;
	}
	tensor = PyObject_GetAttrString(*torch, "Tensor");
	if (!tensor) {
		PyErr_Clear();
		Py_CLEAR(*torch);
		return 0;
	}
	r = PyObject_IsInstance(o, tensor);
	Py_DECREF(tensor);
	if (r <= 0) {
		PyErr_Clear();
		Py_CLEAR(*torch);
		return 0;
	}
	return 1;
}

static int src_from_buffer(struct kv_src *s, PyObject *o, const char *what)
{
	if (PyObject_GetBuffer(o, &s->buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError,
			     "%s: the buffer must be C-contiguous "
			     "(numpy.ascontiguousarray)", what);
		return -1;
	}
	s->have_buf = 1;
	s->is_buffer = 1;
	s->ptr = s->buf.buf;
	s->nbytes = (uint64_t)s->buf.len;
	s->itemsize = (uint32_t)s->buf.itemsize;
	s->ndim = s->buf.ndim <= VIEW_MAX_DIMS ? s->buf.ndim : 0;
	for (int i = 0; i < s->ndim; i++)
		s->shape[i] = s->buf.shape ? s->buf.shape[i] : s->buf.len;
	return 0;
}

int src_get(PyObject *o, const char *what, struct kv_src *s)
{
	PyObject *torch = NULL, *cap;
	int ret;

	src_init(s);
	if (is_torch_tensor(o, &torch)) {
		ret = src_from_torch(s, torch, o, what);
		Py_DECREF(torch);
		if (ret)
			src_release(s);
		return ret;
	}
	if (PyCapsule_CheckExact(o)) {
		if (src_from_capsule(s, o, what))
			return -1;
		s->keep = Py_NewRef(o);
		return 0;
	}
	if (PyObject_CheckBuffer(o) && !PyUnicode_Check(o))
		return src_from_buffer(s, o, what);
	if (PyObject_HasAttrString(o, "__dlpack__")) {
		/* No stream: a CUDA producer orders its work before the
		 * legacy default stream, where kvp_append's synchronous
		 * copy of a non-torch device source runs. */
		cap = PyObject_CallMethod(o, "__dlpack__", NULL);
		if (!cap)
			return -1;
		if (!PyCapsule_CheckExact(cap)) {
			Py_DECREF(cap);
			PyErr_Format(PyExc_TypeError, "%s: %.80s.__dlpack__() did not return "
				     "a capsule", what, Py_TYPE(o)->tp_name);
			return -1;
		}
		s->keep = cap;
		if (src_from_capsule(s, cap, what)) {
			src_release(s);
			return -1;
		}
		return 0;
	}
	PyErr_Format(PyExc_TypeError,
		     "%s: pass a torch tensor, a DLPack capsule (or an object with "
		     "__dlpack__) or a buffer (numpy array, bytes, memoryview), not "
		     "%.80s", what, Py_TYPE(o)->tp_name);
	return -1;
}

/*
 * The checks of one source against the pool: dtype, inner shape (rows of
 * inner[0..ninner) elements; NULL: any, raw bytes), device. Returns the
 * number of rows (shape[0], or bytes / row_bytes for a buffer) or -1.
 */
int64_t src_rows(KvpClient *c, const struct kv_src *s, const char *what,
		 const int64_t *inner, int ninner, uint64_t row_bytes)
{
	const struct kvp_layout *L = &c->layout;
	const int pool_dev = c->cuda_device;

	if (s->device != pool_dev) {
		PyErr_Format(PyExc_ValueError, "%s: the data is in %s memory (device %d), "
			     "the pool in %s memory (device %d): pass it where the pool "
			     "is", what, s->device >= 0 ? "CUDA" : "host", s->device,
			     pool_dev >= 0 ? "CUDA" : "host", pool_dev);
		return -1;
	}
	if (s->is_buffer) {
		if (s->itemsize != 1 && s->itemsize != L->elem_bytes) {
			PyErr_Format(PyExc_TypeError,
				     "%s: a buffer of %u-byte items; the pool holds %s "
				     "(%u bytes each)", what, s->itemsize,
				     kvp_dtype_name(L->dtype), L->elem_bytes);
			return -1;
		}
		if (s->nbytes % row_bytes) {
			PyErr_Format(PyExc_ValueError,
				     "%s: %llu bytes are not whole tokens of %llu bytes "
				     "([n][layers][2][kv_heads][head_dim] of %s)", what,
				     (unsigned long long)s->nbytes,
				     (unsigned long long)row_bytes, kvp_dtype_name(L->dtype));
			return -1;
		}
		return (int64_t)(s->nbytes / row_bytes);
	}
	if (s->dtype != L->dtype) {
		static const char *const codes[] = { "int", "uint", "float", "complex",
						     "bfloat" };

		PyErr_Format(PyExc_TypeError,
			     "%s: elements of %s%u, the pool holds %s: convert first "
			     "(.to(the pool's dtype))", what,
			     s->dl_code < 5 ? codes[s->dl_code] : "code ", s->dl_bits,
			     kvp_dtype_name(L->dtype));
		return -1;
	}
	if (s->ndim != ninner + 1)
		goto shape;
	for (int i = 0; i < ninner; i++)
		if (s->shape[i + 1] != inner[i])
			goto shape;
	if ((uint64_t)s->shape[0] * row_bytes > s->nbytes) {
		PyErr_Format(PyExc_ValueError, "%s: %lld rows of %llu bytes in %llu bytes",
			     what, (long long)s->shape[0], (unsigned long long)row_bytes,
			     (unsigned long long)s->nbytes);
		return -1;
	}
	return s->shape[0];
shape:
	{
		char want[96] = "[n", got[160] = "[";
		size_t w = 2, g = 1;

		for (int i = 0; i < ninner && w < sizeof(want) - 24; i++)
			w += (size_t)snprintf(want + w, sizeof(want) - w, ", %lld",
					      (long long)inner[i]);
		snprintf(want + w, sizeof(want) - w, "]");
		for (int i = 0; i < s->ndim && g < sizeof(got) - 24; i++)
			g += (size_t)snprintf(got + g, sizeof(got) - g, "%s%lld",
					      i ? ", " : "", (long long)s->shape[i]);
		snprintf(got + g, sizeof(got) - g, "]");
		PyErr_Format(PyExc_ValueError, "%s: shape %s, expected %s", what, got, want);
	}
	return -1;
}
