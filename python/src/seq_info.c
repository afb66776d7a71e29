/* SPDX-License-Identifier: MIT */
/*
 * seq_info.c - Client.seq_info(): a sequence's state (kvp_seq_info,
 * kvp_seq_pages, kvp_seq_tokens), seed 004's GetRequest under the
 * kvpool.kvcache request manager.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <string.h>

/* A list of n ints from 32-bit words (signed: frames, or unsigned: ids). */
static PyObject *u32_list(const void *p, uint32_t n, int is_signed)
{
	PyObject *l = PyList_New(n);

	for (uint32_t i = 0; l && i < n; i++) {
		PyObject *v = is_signed ?
			PyLong_FromLong(((const int32_t *)p)[i]) :
			PyLong_FromUnsignedLong(((const uint32_t *)p)[i]);

		if (!v) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, i, v);
	}
	return l;
}

static PyObject *seq_info_dict(const struct kvp_seq_info *si, PyObject *pages,
			       PyObject *ids)
{
	return Py_BuildValue(
		"{sKsKsKsKsKsIsIsIsIsIsIsIsIsNsN}",
		"seq", (unsigned long long)si->seq,
		"tokens", (unsigned long long)si->tokens,
		"computed", (unsigned long long)si->computed,
		"cached", (unsigned long long)si->cached,
		"write_lease", (unsigned long long)si->write_lease,
		"n_new", si->n_new, "npages", si->npages,
		"computed_pages", si->computed_pages, "published", si->published,
		"borrowed", si->borrowed, "owner", si->owner, "flags", si->flags,
		"ntoken_ids", si->ntoken_ids, "pages", pages, "token_ids", ids);
}

/* The state, its page table and its token ids, under one client lock
 * (a sequence changes only by its owner's calls). */
static PyObject *c_seq_info(KvpClient *self, PyObject *arg)
{
	unsigned long long seq = PyLong_AsUnsignedLongLong(arg);
	struct kvp_seq_info si;
	int32_t *pages = NULL;
	uint32_t *ids = NULL, n = 0;
	PyObject *pl = NULL, *il = NULL, *res = NULL;
	int ret;

	if (seq == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_seq_info(self->c, seq, &si));
	if (!ret) {
		pages = PyMem_Malloc(((size_t)si.npages + 1) * sizeof(*pages));
		ids = PyMem_Malloc(((size_t)si.ntoken_ids + 1) * sizeof(*ids));
		if (!pages || !ids) {
			client_leave(self);
			PyMem_Free(pages);
			PyMem_Free(ids);
			return PyErr_NoMemory();
		}
		CALL(ret, kvp_seq_pages(self->c, seq, pages, si.npages));
		if (ret >= 0 && (uint32_t)ret != si.npages)
			ret = -EAGAIN; /* changed in between: not by us */
		if (ret >= 0)
			CALL(ret, kvp_seq_tokens(self->c, seq, ids, si.ntoken_ids, &n));
	}
	if (ret == -EAGAIN)
		PyErr_Format(PyExc_RuntimeError, "seq_info: sequence %llu changed "
			     "while it was read", seq);
	else if (ret < 0)
		kvp_raise_client(self, ret);
	client_leave(self);
	if (ret >= 0) {
		uint32_t k = n < si.ntoken_ids ? n : si.ntoken_ids;

		pl = u32_list(pages, si.npages, 1);
		il = pl ? u32_list(ids, k, 0) : NULL;
		if (il)
			res = seq_info_dict(&si, pl, il);
		else
			Py_XDECREF(pl);
	}
	PyMem_Free(pages);
	PyMem_Free(ids);
	return res;
}

PyMethodDef client_seq_methods[] = {
	{ "seq_info", (PyCFunction)c_seq_info, METH_O,
	  "seq_info($self, seq, /)\n--\n\n"
	  "A sequence's state as a dict (kvp_seq_info, kvp_seq_pages,\n"
	  "kvp_seq_tokens): tokens (committed + reserved), computed (committed:\n"
	  "seed 004's NumComputedTokens), cached (found in the prefix cache at\n"
	  "seq_alloc, or seq_create's source tokens), write_lease, n_new, npages,\n"
	  "computed_pages (computed // page_tokens), published, borrowed, owner,\n"
	  "flags (KVP_SEQ_*), ntoken_ids, pages (the page table: device frames)\n"
	  "and token_ids (empty when kvpoold has none: made by seq_create, or\n"
	  "extended without ids). Any client of the tenant may read any of its\n"
	  "sequences. NotFoundError when there is no such sequence." },
	{ NULL, NULL, 0, NULL },
};
