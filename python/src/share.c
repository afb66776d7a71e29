/* SPDX-License-Identifier: MIT */
/*
 * share.c - Client's sharing calls: the prefix cache, sequences (seed 004
 * allocate/free, seed 000 virtual sequences), chunks (seed 001) and
 * cascade compositions (seeds 001/003). Token lists are uint32 buffers or
 * sequences of ints; chunk ids are 64 hex digits.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <string.h>

static PyObject *int32_bytes(const int32_t *p, size_t n)
{
	return PyBytes_FromStringAndSize(n ? (const char *)p : NULL,
					 (Py_ssize_t)(n * sizeof(int32_t)));
}

/* ------------------------------------------------------------ prefix */

static PyObject *c_prefix_lookup(KvpClient *self, PyObject *arg)
{
	struct kvp_prefix_hit hit;
	uint32_t *tok, n;
	int owned, ret;
	Py_buffer vb;
	PyObject *res = NULL;

	if (tokens_from_object(arg, &tok, &n, &owned, &vb))
		return NULL;
	if (client_enter(self))
		goto out;
	CALL(ret, kvp_prefix_lookup(self->c, tok, n, &hit));
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = Py_BuildValue("{sIsIsN}", "tokens", hit.tokens, "npages", hit.npages,
				    "indices", int32_bytes(hit.indices, hit.npages));
	client_leave(self);
out:
	tokens_release(tok, owned, &vb);
	return res;
}

/* ------------------------------------------------------------ sequences */

static PyObject *seq_lease(KvpClient *self, const struct kvp_lease *l, uint64_t seq)
{
	PyObject *o = lease_new(self, l, LEASE_SEQ);

	if (o)
		((KvpLease *)o)->seq = seq;
	return o;
}

static PyObject *c_seq_alloc(KvpClient *self, PyObject *args)
{
	struct int_arg seq_a = INT_ARG("seq_alloc: seq", UINT64_MAX);
	uint64_t seq;
	PyObject *tok_o, *res = NULL;
	struct kvp_lease l;
	uint32_t *tok, n;
	int owned, ret;
	Py_buffer vb;

	if (!PyArg_ParseTuple(args, "O&O:seq_alloc", int_conv, &seq_a, &tok_o) ||
	    tokens_from_object(tok_o, &tok, &n, &owned, &vb))
		return NULL;
	seq = seq_a.v;
	if (client_enter(self))
		goto out;
	CALL(ret, kvp_seq_alloc(self->c, seq, tok, n, &l));
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = seq_lease(self, &l, seq);
	client_leave(self);
out:
	tokens_release(tok, owned, &vb);
	return res;
}

/* A source: ("user", id[, tokens]) / ("chunk", hex) / ("seq", id), kinds
 * by name or number (kvp_src_kind). */
static int src_from_object(PyObject *o, struct kvp_seq_src *s)
{
	PyObject *kind_o, *id_o;
	Py_ssize_t n;
	long kind;

	memset(s, 0, sizeof(*s));
	if (!PyTuple_Check(o) || (n = PyTuple_GET_SIZE(o)) < 2 || n > 3) {
		PyErr_SetString(PyExc_TypeError,
				"a source is ('user', user_id[, tokens]), ('chunk', "
				"chunk_id) or ('seq', seq_id): see kvpool.src_user()");
		return -1;
	}
	kind_o = PyTuple_GET_ITEM(o, 0);
	id_o = PyTuple_GET_ITEM(o, 1);
	if (PyUnicode_Check(kind_o)) {
		const char *k = PyUnicode_AsUTF8(kind_o);

		if (!k)
			return -1;
		kind = !strcmp(k, "user") ? KVP_SRC_USER : !strcmp(k, "chunk") ?
		       KVP_SRC_CHUNK : !strcmp(k, "seq") ? KVP_SRC_SEQ : -1;
	} else {
		uint64_t k;

		if (int_arg(kind_o, "source kind", 16, &k))
			return -1;
		kind = (long)k;
	}
	s->kind = (uint32_t)kind;
	switch (kind) {
	case KVP_SRC_CHUNK:
		return chunk_id_from_object(id_o, &s->chunk);
	case KVP_SRC_USER:
		if (n == 3) {
			if (int_arg(PyTuple_GET_ITEM(o, 2), "source tokens", UINT64_MAX,
				    &s->tokens))
				return -1;
		}
		/* fall through */
	case KVP_SRC_SEQ:
		return int_arg(id_o, "source id", UINT64_MAX, &s->id);
	default:
		PyErr_SetString(PyExc_ValueError,
				"a source kind is 'user', 'chunk' or 'seq'");
		return -1;
	}
}

static PyObject *c_seq_create(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "seq", "sources", "n_new", NULL };
	struct int_arg seq_a = INT_ARG("seq_create: seq", UINT64_MAX);
	struct int_arg n_a = INT_ARG("seq_create: n_new", UINT32_MAX);
	uint64_t seq;
	uint32_t n_new;
	PyObject *src_o, *fast, *res = NULL;
	struct kvp_seq_src *src = NULL;
	struct kvp_lease l;
	Py_ssize_t nsrc;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|O&:seq_create", kwlist, int_conv,
					 &seq_a, &src_o, int_conv, &n_a))
		return NULL;
	seq = seq_a.v;
	n_new = (uint32_t)n_a.v;
	fast = PySequence_Fast(src_o, "sources: a list of source tuples");
	if (!fast)
		return NULL;
	nsrc = PySequence_Fast_GET_SIZE(fast);
	src = PyMem_Calloc((size_t)(nsrc ? nsrc : 1), sizeof(*src));
	if (!src) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < nsrc; i++)
		if (src_from_object(PySequence_Fast_GET_ITEM(fast, i), &src[i]))
			goto out;
	if (client_enter(self))
		goto out;
	CALL(ret, kvp_seq_create(self->c, seq, src, (uint32_t)nsrc, n_new, &l));
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = seq_lease(self, &l, seq);
	client_leave(self);
out:
	PyMem_Free(src);
	Py_DECREF(fast);
	return res;
}

static PyObject *c_seq_extend(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "seq", "n_new", "tokens", NULL };
	struct int_arg seq_a = INT_ARG("seq_extend: seq", UINT64_MAX);
	struct int_arg n_a = INT_ARG("seq_extend: n_new", UINT32_MAX);
	uint64_t seq;
	uint32_t n_new;
	PyObject *tok_o = Py_None, *res = NULL;
	uint32_t *tok = NULL, n = 0;
	int owned = 0, ret;
	Py_buffer vb = { 0 };
	struct kvp_lease l;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O:seq_extend", kwlist, int_conv,
					 &seq_a, int_conv, &n_a, &tok_o))
		return NULL;
	seq = seq_a.v;
	n_new = (uint32_t)n_a.v;
	if (tok_o != Py_None) {
		if (tokens_from_object(tok_o, &tok, &n, &owned, &vb))
			return NULL;
		if (n != n_new) {
			PyErr_Format(PyExc_ValueError,
				     "seq_extend: %u tokens for n_new = %u", n, n_new);
			goto out;
		}
	}
	if (client_enter(self))
		goto out;
	CALL(ret, kvp_seq_extend(self->c, seq, n_new, tok, &l));
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = seq_lease(self, &l, seq);
	client_leave(self);
out:
	tokens_release(tok, owned, &vb);
	return res;
}

static PyObject *c_seq_free(KvpClient *self, PyObject *arg)
{
	uint64_t seq;
	int ret;

	if (int_arg(arg, "seq_free: seq", UINT64_MAX, &seq))
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_seq_free(self->c, seq));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	Py_RETURN_NONE;
}

/* ------------------------------------------------------------ chunks */

/* meta / filter: None or text (JSON object, or legacy 'k=v,k2=v2'; the
 * Python Client turns dicts into JSON first). *out NULL for None. */
static int text_from_object(PyObject *o, const char **out, const char *what)
{
	*out = NULL;
	if (!o || o == Py_None)
		return 0;
	if (!PyUnicode_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s: None or JSON object text (str), "
			     "not %.100s", what, Py_TYPE(o)->tp_name);
		return -1;
	}
	*out = PyUnicode_AsUTF8(o);
	return *out ? 0 : -1;
}

static const char *state_name(uint32_t state)
{
	return state == KVP_CHUNK_READY ? "ready" : "filling";
}

/* A registration as a dict; "lease": the fill lease when created. */
static PyObject *reg_to_dict(KvpClient *self, const struct kvp_chunk_reg *reg)
{
	PyObject *lease = Py_None;

	if (reg->created) {
		lease = lease_new(self, &reg->lease, LEASE_CHUNK_FILL);
		if (!lease)
			return NULL;
		((KvpLease *)lease)->reg = *reg;
	} else {
		Py_INCREF(lease);
	}
	return Py_BuildValue("{sNsNsOsssIsIsN}", "id", chunk_id_to_str(&reg->id),
			     "name", chunk_id_to_str(&reg->name), "created",
			     reg->created ? Py_True : Py_False, "state",
			     state_name(reg->state), "start", reg->start, "tokens",
			     reg->tokens, "lease", lease);
}

static PyObject *c_chunk_register(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "tokens", "type", "meta", "content", NULL };
	PyObject *tok_o, *type_o = NULL, *meta_o = Py_None, *content_o = Py_None;
	PyObject *res = NULL;
	struct kvp_chunk_root root = { 0 };
	struct kvp_chunk_reg reg;
	Py_buffer cb = { 0 };
	uint32_t *tok;
	int owned, ret;
	Py_buffer vb;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:chunk_register", kwlist,
					 &tok_o, &type_o, &meta_o, &content_o) ||
	    chunk_type_from_object(type_o, &root.type, 0) ||
	    text_from_object(meta_o, &root.meta, "meta"))
		return NULL;
	if (content_o != Py_None) {
		if (PyUnicode_Check(content_o)) {
			Py_ssize_t n;
			const char *p = PyUnicode_AsUTF8AndSize(content_o, &n);

			if (!p)
				return NULL;
			root.content = p;
			root.content_len = (uint32_t)n;
			if ((Py_ssize_t)root.content_len != n) {
				PyErr_SetString(PyExc_ValueError, "content: at most 4 GiB");
				return NULL;
			}
		} else if (PyObject_GetBuffer(content_o, &cb, PyBUF_SIMPLE) == 0) {
			root.content = cb.buf;
			root.content_len = (uint32_t)cb.len;
			if ((Py_ssize_t)root.content_len != cb.len) {
				PyBuffer_Release(&cb);
				PyErr_SetString(PyExc_ValueError, "content: at most 4 GiB");
				return NULL;
			}
		} else {
			return NULL;
		}
	}
	if (tokens_from_object(tok_o, &tok, &root.n, &owned, &vb))
		goto out_cb;
	root.tokens = tok;
	if (client_enter(self))
		goto out;
	memset(&reg, 0, sizeof(reg));
	CALL(ret, kvp_chunk_put(self->c, &root, &reg));
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = reg_to_dict(self, &reg);
	client_leave(self);
out:
	tokens_release(tok, owned, &vb);
out_cb:
	if (cb.obj)
		PyBuffer_Release(&cb);
	return res;
}

static PyObject *c_chunk_link(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "parent", "wait_ms", NULL };
	PyObject *name_o, *parent_o, *res = NULL;
	struct kvp_chunk_id name, parent;
	struct kvp_chunk_reg reg;
	struct int_arg wait_ms = INT_ARG("chunk_link: wait_ms", UINT32_MAX);
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O&:chunk_link", kwlist, &name_o,
					 &parent_o, int_conv, &wait_ms) ||
	    chunk_id_from_object(name_o, &name) ||
	    chunk_id_from_object(parent_o, &parent) || client_enter(self))
		return NULL;
	memset(&reg, 0, sizeof(reg));
	CALL(ret, kvp_chunk_link(self->c, &name, &parent, (uint32_t)wait_ms.v, &reg));
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = reg_to_dict(self, &reg);
	client_leave(self);
	return res;
}

static PyObject *c_chunk_acquire(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "id", "wait_ms", NULL };
	PyObject *id_o, *res = NULL;
	struct int_arg wait_ms = INT_ARG("chunk_acquire: wait_ms", UINT32_MAX);
	struct kvp_chunk_id id;
	struct kvp_lease l;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O&:chunk_acquire", kwlist, &id_o,
					 int_conv, &wait_ms) ||
	    chunk_id_from_object(id_o, &id) || client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_acquire(self->c, &id, (uint32_t)wait_ms.v, &l));
	if (ret < 0) {
		kvp_raise_client(self, ret);
	} else {
		res = lease_new(self, &l, LEASE_CHUNK_READ);
		if (res)
			((KvpLease *)res)->reg.id = id;
	}
	client_leave(self);
	return res;
}

static PyObject *id_or_none(const struct kvp_chunk_id *id)
{
	static const struct kvp_chunk_id zero;

	if (!memcmp(id, &zero, sizeof(zero)))
		Py_RETURN_NONE;
	return chunk_id_to_str(id);
}

static PyObject *chunk_info_to_dict(const struct kvp_chunk_info *ci)
{
	const char *type = kvp_chunk_type_name(ci->type);

	return Py_BuildValue("{sNsNsssssIsIsKsIsIsKsKsKsIsNss}",
			     "id", chunk_id_to_str(&ci->id), "root", id_or_none(&ci->root),
			     "type", type ? type : "?", "state", state_name(ci->state),
			     "tokens", ci->tokens, "pages", ci->pages,
			     "bytes", (unsigned long long)ci->bytes,
			     "holders", ci->holders, "entries", ci->entries,
			     "created_ns", (unsigned long long)ci->created_ns,
			     "last_access_ns", (unsigned long long)ci->last_access_ns,
			     "hits", (unsigned long long)ci->hits,
			     "content_len", ci->content_len,
			     "preview", PyUnicode_DecodeUTF8(ci->preview, (Py_ssize_t)
							     strlen(ci->preview), "replace"),
			     "meta", ci->meta);
}

static PyObject *entry_to_dict(const struct kvp_chunk_entry_info *en)
{
	return Py_BuildValue("{sNsNsNsIsIsIsssIsI}", "id", chunk_id_to_str(&en->id),
			     "name", chunk_id_to_str(&en->name), "parent",
			     id_or_none(&en->parent), "start", en->start, "tokens",
			     en->tokens, "pages", en->pages, "state",
			     state_name(en->state), "holders", en->holders,
			     "children", en->children);
}

static PyObject *c_chunk_get(KvpClient *self, PyObject *arg)
{
	struct kvp_chunk_id id;
	struct kvp_chunk_info *ci;
	PyObject *res = NULL;
	int ret;

	if (chunk_id_from_object(arg, &id))
		return NULL;
	ci = PyMem_Malloc(sizeof(*ci));
	if (!ci)
		return PyErr_NoMemory();
	if (client_enter(self))
		goto out;
	CALL(ret, kvp_chunk_get(self->c, &id, ci));
	client_leave(self);
	res = ret < 0 ? kvp_raise_client(self, ret) : chunk_info_to_dict(ci);
out:
	PyMem_Free(ci);
	return res;
}

static PyObject *c_chunk_entry(KvpClient *self, PyObject *arg)
{
	struct kvp_chunk_entry_info en;
	struct kvp_chunk_id id;
	int ret;

	if (chunk_id_from_object(arg, &id) || client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_entry(self->c, &id, &en));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return entry_to_dict(&en);
}

static PyObject *c_chunk_entries(KvpClient *self, PyObject *arg)
{
	struct kvp_chunk_entry_info *rows = NULL;
	struct kvp_chunk_id id;
	uint32_t cap = 16;
	PyObject *list;
	int ret;

	if (chunk_id_from_object(arg, &id))
		return NULL;
	for (;;) {
		PyMem_Free(rows);
		rows = PyMem_Malloc(cap * sizeof(*rows));
		if (!rows)
			return PyErr_NoMemory();
		if (client_enter(self)) {
			PyMem_Free(rows);
			return NULL;
		}
		CALL(ret, kvp_chunk_entries(self->c, &id, rows, cap));
		client_leave(self);
		if (ret < 0) {
			PyMem_Free(rows);
			return kvp_raise_client(self, ret);
		}
		if ((uint32_t)ret <= cap)
			break;
		cap = (uint32_t)ret; /* more entries than room: again */
	}
	list = PyList_New(ret);
	for (int i = 0; list && i < ret; i++) {
		PyObject *d = entry_to_dict(&rows[i]);

		if (!d) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, i, d);
	}
	PyMem_Free(rows);
	return list;
}

static PyObject *c_chunk_content(KvpClient *self, PyObject *arg)
{
	struct kvp_chunk_id id;
	PyObject *res = NULL;
	size_t len = 0;
	char *buf = NULL;
	int ret;

	if (chunk_id_from_object(arg, &id) || client_enter(self))
		return NULL;
	/* The length first (a zero-byte read), then the bytes. */
	CALL(ret, kvp_chunk_content(self->c, &id, NULL, 0, &len));
	if (ret >= 0 && len) {
		buf = PyMem_Malloc(len);
		if (!buf) {
			client_leave(self);
			return PyErr_NoMemory();
		}
		CALL(ret, kvp_chunk_content(self->c, &id, buf, len, &len));
	}
	if (ret < 0)
		kvp_raise_client(self, ret);
	else
		res = PyBytes_FromStringAndSize(buf, (Py_ssize_t)ret);
	client_leave(self);
	PyMem_Free(buf);
	return res;
}

static PyObject *c_chunk_tokens(KvpClient *self, PyObject *arg)
{
	struct kvp_chunk_id id;
	PyObject *res = NULL;
	uint32_t n = 0, *buf = NULL;
	int ret;

	if (chunk_id_from_object(arg, &id) || client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_tokens(self->c, &id, NULL, 0, &n));
	if (ret >= 0 && n) {
		buf = PyMem_Malloc((size_t)n * sizeof(*buf));
		if (!buf) {
			client_leave(self);
			return PyErr_NoMemory();
		}
		CALL(ret, kvp_chunk_tokens(self->c, &id, buf, n, &n));
	}
	if (ret < 0) {
		kvp_raise_client(self, ret);
	} else {
		res = PyList_New(ret);
		for (int i = 0; res && i < ret; i++) {
			PyObject *v = PyLong_FromUnsignedLong(buf[i]);

			if (!v) {
				Py_CLEAR(res);
				break;
			}
			PyList_SET_ITEM(res, i, v);
		}
	}
	client_leave(self);
	PyMem_Free(buf);
	return res;
}

#define CHUNK_ROWS 32

static PyObject *c_chunk_list(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "type", "filter", NULL };
	PyObject *type_o = Py_None, *filter_o = Py_None, *list = NULL, *d;
	struct kvp_chunk_info *rows;
	struct kvp_chunk_id after;
	int more = 0, ret, have_after = 0;
	const char *filter;
	uint32_t type;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:chunk_list", kwlist, &type_o,
					 &filter_o) ||
	    chunk_type_from_object(type_o, &type, 1) ||
	    text_from_object(filter_o, &filter, "filter"))
		return NULL;
	rows = PyMem_Malloc(CHUNK_ROWS * sizeof(*rows));
	list = PyList_New(0);
	if (!rows || !list) {
		PyErr_NoMemory();
		goto err;
	}
	if (client_enter(self))
		goto err;
	do {
		CALL(ret, kvp_chunk_list(self->c, type, filter,
					 have_after ? &after : NULL, rows, CHUNK_ROWS, &more));
		if (ret < 0) {
			kvp_raise_client(self, ret);
			client_leave(self);
			goto err;
		}
		for (int i = 0; i < ret; i++) {
			d = chunk_info_to_dict(&rows[i]);
			if (!d || PyList_Append(list, d)) {
				Py_XDECREF(d);
				client_leave(self);
				goto err;
			}
			Py_DECREF(d);
		}
		if (ret > 0) {
			after = rows[ret - 1].id;
			have_after = 1;
		}
	} while (more && ret > 0);
	client_leave(self);
	PyMem_Free(rows);
	return list;
err:
	PyMem_Free(rows);
	Py_XDECREF(list);
	return NULL;
}

static PyObject *c_chunk_delete(KvpClient *self, PyObject *arg)
{
	struct kvp_chunk_id id;
	int ret;

	if (chunk_id_from_object(arg, &id) || client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_delete(self->c, &id));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	Py_RETURN_NONE;
}

static PyObject *c_chunk_clear(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "type", NULL };
	PyObject *type_o = Py_None;
	uint32_t type;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:chunk_clear", kwlist, &type_o) ||
	    chunk_type_from_object(type_o, &type, 1) || client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_clear(self->c, type));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static PyObject *c_chunk_evict_unused(KvpClient *self, PyObject *arg)
{
	uint64_t age;
	int ret;

	if (int_arg(arg, "chunk_evict_unused: max_age_s", UINT32_MAX, &age) ||
	    client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_evict_unused(self->c, (uint32_t)age));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

static PyObject *c_chunk_limits(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "max_chunks", "memory_ratio", NULL };
	PyObject *max_o = Py_None, *ratio_o = Py_None;
	struct kvp_chunk_limits lim;
	long long max = -1;
	double ratio = -1;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:chunk_limits", kwlist, &max_o,
					 &ratio_o))
		return NULL;
	if (max_o != Py_None) {
		uint64_t m;

		if (int_arg(max_o, "max_chunks (0: unlimited; None keeps it)", INT64_MAX,
			    &m))
			return NULL;
		max = (long long)m;
	}
	if (ratio_o != Py_None) {
		ratio = PyFloat_AsDouble(ratio_o);
		if (ratio == -1 && PyErr_Occurred())
			return NULL;
		if (!(ratio > 0)) {
			PyErr_SetString(PyExc_ValueError,
					"memory_ratio: a fraction of the device tier in "
					"(0, 1]; None keeps it");
			return NULL;
		}
	}
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_chunk_limits(self->c, max, ratio, &lim));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return Py_BuildValue("{sKsdsKsdsKsKsK}", "max_chunks",
			     (unsigned long long)lim.max_chunks, "memory_ratio",
			     lim.memory_ratio, "config_max_chunks",
			     (unsigned long long)lim.config_max_chunks,
			     "config_memory_ratio", lim.config_memory_ratio, "names",
			     (unsigned long long)lim.names, "pages",
			     (unsigned long long)lim.pages, "limit_pages",
			     (unsigned long long)lim.limit_pages);
}

/* ------------------------------------------------------------ compose */

/* A request: a dict {system, contexts=[], query, qo_len=0} or a tuple
 * (system, contexts, query[, qo_len]). */
static int req_from_object(PyObject *o, struct kvp_compose_req *r,
			   struct kvp_chunk_id *ctx, uint32_t maxctx)
{
	PyObject *sys, *ctxs, *query, *qo = NULL, *fast;
	Py_ssize_t n;

	memset(r, 0, sizeof(*r));
	if (PyDict_Check(o)) {
		sys = PyDict_GetItemString(o, "system");
		ctxs = PyDict_GetItemString(o, "contexts");
		query = PyDict_GetItemString(o, "query");
		qo = PyDict_GetItemString(o, "qo_len");
	} else if (PyTuple_Check(o) && (PyTuple_GET_SIZE(o) == 3 || PyTuple_GET_SIZE(o) == 4)) {
		sys = PyTuple_GET_ITEM(o, 0);
		ctxs = PyTuple_GET_ITEM(o, 1);
		query = PyTuple_GET_ITEM(o, 2);
		if (PyTuple_GET_SIZE(o) == 4)
			qo = PyTuple_GET_ITEM(o, 3);
	} else {
		PyErr_SetString(PyExc_TypeError,
				"a request is {'system': id, 'contexts': [ids], 'query': "
				"id, 'qo_len': n} or (system, contexts, query[, qo_len])");
		return -1;
	}
	if (!sys || !query) {
		PyErr_SetString(PyExc_ValueError, "a request needs a system and a query chunk");
		return -1;
	}
	if (chunk_id_from_object(sys, &r->system) || chunk_id_from_object(query, &r->query))
		return -1;
	if (qo && qo != Py_None) {
		uint64_t q;

		if (int_arg(qo, "qo_len", UINT32_MAX, &q))
			return -1;
		r->qo_len = (uint32_t)q;
	}
	if (!ctxs || ctxs == Py_None)
		return 0;
	fast = PySequence_Fast(ctxs, "contexts: a list of chunk ids");
	if (!fast)
		return -1;
	n = PySequence_Fast_GET_SIZE(fast);
	if ((uint64_t)n > maxctx) {
		PyErr_Format(PyExc_ValueError, "at most %u contexts per request", maxctx);
		Py_DECREF(fast);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++)
		if (chunk_id_from_object(PySequence_Fast_GET_ITEM(fast, i), &ctx[i])) {
			Py_DECREF(fast);
			return -1;
		}
	Py_DECREF(fast);
	r->contexts = ctx;
	r->ncontexts = (uint32_t)n;
	return 0;
}

static PyObject *composition_to_dict(const struct kvp_composition *cp)
{
	PyObject *levels = PyList_New(cp->nlevels);

	if (!levels)
		return NULL;
	for (uint32_t i = 0; i < cp->nlevels; i++) {
		const struct kvp_cascade_level *lv = &cp->level[i];
		uint32_t g = lv->ngroups;
		uint32_t nidx = g && lv->kv_indptr ? (uint32_t)lv->kv_indptr[g] : 0;
		PyObject *d = Py_BuildValue("{sIsNsNsNsN}", "ngroups", g, "qo_indptr",
					    int32_bytes(lv->qo_indptr, g + 1), "kv_indptr",
					    int32_bytes(lv->kv_indptr, g + 1), "kv_indices",
					    int32_bytes(lv->kv_indices, nidx), "kv_last_page_len",
					    int32_bytes(lv->kv_last_page_len, g));

		if (!d) {
			Py_DECREF(levels);
			return NULL;
		}
		PyList_SET_ITEM(levels, i, d);
	}
	return Py_BuildValue("{sKsIsIsKsKsKsN}", "lease", (unsigned long long)cp->lease,
			     "nlevels", cp->nlevels, "nrequests", cp->nrequests, "tokens",
			     (unsigned long long)cp->tokens, "pages",
			     (unsigned long long)cp->pages, "bytes",
			     (unsigned long long)cp->bytes, "levels", levels);
}

static PyObject *do_compose(KvpClient *self, PyObject *reqs_o, int preview)
{
	PyObject *fast, *res = NULL;
	struct kvp_compose_req *reqs = NULL;
	struct kvp_chunk_id *ctx = NULL;
	struct kvp_composition *cp = NULL;
	Py_ssize_t n;
	int ret;

	fast = PySequence_Fast(reqs_o, "requests: a list of requests");
	if (!fast)
		return NULL;
	n = PySequence_Fast_GET_SIZE(fast);
	if (n > KVP_COMPOSE_MAX_REQUESTS) {
		PyErr_Format(PyExc_ValueError, "at most %d requests", KVP_COMPOSE_MAX_REQUESTS);
		goto out;
	}
	reqs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*reqs));
	ctx = PyMem_Calloc((size_t)(n ? n : 1) * KVP_COMPOSE_MAX_CONTEXTS, sizeof(*ctx));
	cp = PyMem_Calloc(1, sizeof(*cp));
	if (!reqs || !ctx || !cp) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++)
		if (req_from_object(PySequence_Fast_GET_ITEM(fast, i), &reqs[i],
				    ctx + i * KVP_COMPOSE_MAX_CONTEXTS,
				    KVP_COMPOSE_MAX_CONTEXTS))
			goto out;
	if (client_enter(self))
		goto out;
	if (preview)
		CALL(ret, kvp_compose_preview(self->c, reqs, (uint32_t)n, cp));
	else
		CALL(ret, kvp_compose(self->c, reqs, (uint32_t)n, cp));
	if (ret < 0) {
		kvp_raise_client(self, ret);
	} else {
		/* Copied under the lock: the tables are in the arena. */
		res = composition_to_dict(cp);
		if (res && cp->lease)
			client_live_add(self, cp->lease);
	}
	client_leave(self);
out:
	PyMem_Free(reqs);
	PyMem_Free(ctx);
	PyMem_Free(cp);
	Py_DECREF(fast);
	return res;
}

static PyObject *c_compose(KvpClient *self, PyObject *arg)
{
	return do_compose(self, arg, 0);
}

static PyObject *c_compose_preview(KvpClient *self, PyObject *arg)
{
	return do_compose(self, arg, 1);
}

PyMethodDef client_share_methods[] = {
	{ "prefix_lookup", (PyCFunction)c_prefix_lookup, METH_O,
	  "prefix_lookup($self, tokens, /)\n--\n\n"
	  "How many leading tokens of a token list the prefix cache holds\n"
	  "(kvp_prefix_lookup): {'tokens', 'npages', 'indices' (int32 bytes)}.\n"
	  "Full pages only, never all of them (the last token is left to compute).\n"
	  "Pins nothing: seq_alloc() is what holds pages." },
	{ "seq_alloc", (PyCFunction)c_seq_alloc, METH_VARARGS,
	  "seq_alloc($self, seq, tokens, /)\n--\n\n"
	  "A request-scoped sequence for a prompt (kvp_seq_alloc, seed 004's\n"
	  "allocate): the leading full pages found in the prefix cache are shared,\n"
	  "pages are allocated for the rest. Returns a Lease with len = cached\n"
	  "tokens and n_new = the rest: append those and commit() them (which\n"
	  "publishes the pages they fill). seq_free() ends the sequence." },
	{ "seq_create", (PyCFunction)(void (*)(void))c_seq_create, METH_VARARGS | METH_KEYWORDS,
	  "seq_create($self, /, seq, sources, n_new=0)\n--\n\n"
	  "A virtual sequence (kvp_seq_create, seed 000): the pages of the sources\n"
	  "in order, shared by refcount, plus n_new tokens of its own. Sources:\n"
	  "kvpool.src_user(user, tokens=0), src_chunk(chunk_id), src_seq(seq).\n"
	  "Every source but the last must end on a page boundary. Returns a Lease\n"
	  "(len = source tokens)." },
	{ "seq_extend", (PyCFunction)(void (*)(void))c_seq_extend, METH_VARARGS | METH_KEYWORDS,
	  "seq_extend($self, /, seq, n_new, tokens=None)\n--\n\n"
	  "Grow a sequence by n_new tokens (decode): a new write Lease. tokens\n"
	  "(n_new ids) keep its pages publishable in the prefix cache. BusyError\n"
	  "while its previous write lease is not committed." },
	{ "seq_free", (PyCFunction)c_seq_free, METH_O,
	  "seq_free($self, seq, /)\n--\n\n"
	  "Drop a sequence's references (kvp_seq_free); pages nobody else holds are\n"
	  "freed (or stay in the prefix cache when published)." },
	{ "_chunk_register", (PyCFunction)(void (*)(void))c_chunk_register,
	  METH_VARARGS | METH_KEYWORDS,
	  "_chunk_register($self, /, tokens, type, meta=None, content=None)\n--\n\n"
	  "kvp_chunk_put: a root entry (see Client.chunk_register). meta: None or\n"
	  "JSON object text; content: str or bytes." },
	{ "chunk_link", (PyCFunction)(void (*)(void))c_chunk_link,
	  METH_VARARGS | METH_KEYWORDS,
	  "chunk_link($self, /, name, parent, wait_ms=0)\n--\n\n"
	  "The name's tokens after entry parent (kvp_chunk_link): a dict {'id' (the\n"
	  "entry), 'name', 'created', 'state', 'start', 'tokens', 'lease'}; when\n"
	  "created, 'lease' is the fill lease (write positions start.. and seal it),\n"
	  "else None. A parent being filled: waits up to wait_ms, then NotReadyError." },
	{ "chunk_acquire", (PyCFunction)(void (*)(void))c_chunk_acquire,
	  METH_VARARGS | METH_KEYWORDS,
	  "chunk_acquire($self, /, id, wait_ms=0)\n--\n\n"
	  "A read Lease on a ready entry (id: an entry, or a name for its root):\n"
	  "its page table, pinned until release() (kvp_chunk_acquire). An entry\n"
	  "being filled: waits up to wait_ms for the seal, then NotReadyError." },
	{ "chunk_get", (PyCFunction)c_chunk_get, METH_O,
	  "chunk_get($self, id, /)\n--\n\n"
	  "A name's row (id: the name or one of its entries) as a dict: id, root\n"
	  "(None: no root entry), type, state, tokens, pages, bytes, holders,\n"
	  "entries, created_ns, last_access_ns, hits, content_len, preview, meta\n"
	  "(JSON text) (kvp_chunk_get)." },
	{ "chunk_entry", (PyCFunction)c_chunk_entry, METH_O,
	  "chunk_entry($self, id, /)\n--\n\n"
	  "One entry: {id, name, parent (None: a root), start, tokens, pages, state,\n"
	  "holders, children} (kvp_chunk_entry)." },
	{ "chunk_entries", (PyCFunction)c_chunk_entries, METH_O,
	  "chunk_entries($self, name, /)\n--\n\n"
	  "Every entry of a name, oldest first, as chunk_entry() dicts." },
	{ "chunk_content", (PyCFunction)c_chunk_content, METH_O,
	  "chunk_content($self, name, /)\n--\n\nThe content bytes of a name." },
	{ "chunk_tokens", (PyCFunction)c_chunk_tokens, METH_O,
	  "chunk_tokens($self, name, /)\n--\n\nThe token ids of a name (a list)." },
	{ "_chunk_list", (PyCFunction)(void (*)(void))c_chunk_list, METH_VARARGS | METH_KEYWORDS,
	  "_chunk_list($self, /, type=None, filter=None)\n--\n\n"
	  "kvp_chunk_list through every page (see Client.chunk_list)." },
	{ "chunk_delete", (PyCFunction)c_chunk_delete, METH_O,
	  "chunk_delete($self, id, /)\n--\n\n"
	  "Delete a name (every entry) or one entry, and every entry below them;\n"
	  "pages are freed once nobody holds them (kvp_chunk_delete)." },
	{ "chunk_clear", (PyCFunction)(void (*)(void))c_chunk_clear, METH_VARARGS | METH_KEYWORDS,
	  "chunk_clear($self, /, type=None)\n--\n\n"
	  "Delete every name of a type (None: all); returns how many." },
	{ "chunk_evict_unused", (PyCFunction)c_chunk_evict_unused, METH_O,
	  "chunk_evict_unused($self, max_age_s, /)\n--\n\n"
	  "Delete names not used for max_age_s seconds whose entries nobody holds;\n"
	  "returns how many." },
	{ "chunk_limits", (PyCFunction)(void (*)(void))c_chunk_limits,
	  METH_VARARGS | METH_KEYWORDS,
	  "chunk_limits($self, /, max_chunks=None, memory_ratio=None)\n--\n\n"
	  "Set the tenant's chunk limits in this pool (None: keep), clamped to\n"
	  "kvpool.conf's, and read them: {max_chunks, memory_ratio,\n"
	  "config_max_chunks, config_memory_ratio, names, pages, limit_pages}." },
	{ "_compose", (PyCFunction)c_compose, METH_O,
	  "_compose($self, requests, /)\n--\n\nkvp_compose as a dict (see compose())." },
	{ "_compose_preview", (PyCFunction)c_compose_preview, METH_O,
	  "_compose_preview($self, requests, /)\n--\n\nkvp_compose_preview as a dict." },
	{ NULL, NULL, 0, NULL },
};

int share_module_init(PyObject *m)
{
	return PyModule_AddIntConstant(m, "SRC_USER", KVP_SRC_USER) ||
	       PyModule_AddIntConstant(m, "SRC_CHUNK", KVP_SRC_CHUNK) ||
	       PyModule_AddIntConstant(m, "SRC_SEQ", KVP_SRC_SEQ) ||
	       PyModule_AddIntConstant(m, "CHUNK_SYSTEM", KVP_CHUNK_SYSTEM) ||
	       PyModule_AddIntConstant(m, "CHUNK_CONTEXT", KVP_CHUNK_CONTEXT) ||
	       PyModule_AddIntConstant(m, "CHUNK_QUERY", KVP_CHUNK_QUERY) ? -1 : 0;
}
