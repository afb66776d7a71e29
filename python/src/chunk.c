/* SPDX-License-Identifier: MIT */
/*
 * chunk.c - Client's chunk calls (seed 001): register, link and acquire a
 * chunk of tokens, look one up (get, entry, entries, content, tokens),
 * list them, delete, clear, evict the unused and set the limits. Chunk ids
 * are 64 hex digits; metadata is JSON text. The methods join Client's
 * table (module.c, concat_methods); compositions of chunks are share.c's.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <string.h>

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

PyMethodDef client_chunk_methods[] = {
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
	{ NULL, NULL, 0, NULL },
};
