/* SPDX-License-Identifier: MIT */
/*
 * share.c - Client's sharing calls: the prefix cache, sequences (seed 004
 * allocate/free, seed 000 virtual sequences) and cascade compositions
 * (seeds 001/003); the chunks themselves are chunk.c's. Token lists are
 * uint32 buffers or sequences of ints; chunk ids are 64 hex digits.
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
