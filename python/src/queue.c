/* SPDX-License-Identifier: MIT */
/*
 * queue.c - Client's asynchronous batch calls: queue many operations (many
 * users), submit them with one wake-up, reap the completions
 * (kvp_queue_* / kvp_submit / kvp_reap). A completion is a Completion
 * struct sequence; failures are not raised but carried (.error is the
 * kvpool exception the synchronous call would have raised), as one failed
 * user must not hide the others' results. A prepare's lease becomes a Lease
 * at reap time, its page table copied before the next submit can reuse it.
 */
#include "kvpoolmodule.h"

#include <errno.h>
#include <string.h>

static PyTypeObject Completion_Type;

static PyStructSequence_Field completion_fields[] = {
	{ "tag", "the tag given when queued" },
	{ "op", "'info', 'prepare', 'commit' or 'release'" },
	{ "res", ">= 0, or -errno" },
	{ "info", "UserInfo (info), else None" },
	{ "lease", "Lease (a successful prepare), else None" },
	{ "error", "the exception of a failed operation (not raised), else None" },
	{ NULL, NULL },
};

static PyStructSequence_Desc completion_desc = {
	"kvpool.Completion",
	"Completion(tag, op, res, info, lease, error): one reaped operation.",
	completion_fields, 6,
};

static const char *op_name(uint32_t op)
{
	switch (op) {
	case KVP_ASYNC_INFO:
		return "info";
	case KVP_ASYNC_PREPARE:
		return "prepare";
	case KVP_ASYNC_COMMIT:
		return "commit";
	case KVP_ASYNC_RELEASE:
		return "release";
	default:
		return "?";
	}
}

/* The exception object for a failed completion, without raising it. */
static PyObject *error_object(KvpClient *self, const struct kvp_completion *k)
{
	struct kvp_error_info info = { 0 };
	PyObject *et, *ev, *tb;

	kvp_completion_error_info(self->c, k, &info);
	kvp_raise_info(k->res, k->error, &info);
	PyErr_Fetch(&et, &ev, &tb);
	PyErr_NormalizeException(&et, &ev, &tb);
	Py_XDECREF(et);
	Py_XDECREF(tb);
	return ev;
}

static PyObject *queue_result(KvpClient *self, int ret)
{
	if (ret < 0)
		return kvp_raise_client(self, ret);
	Py_RETURN_NONE;
}

/* A lease argument: a Lease or its id. */
static int lease_id_from_object(PyObject *o, uint64_t *id)
{
	if (PyObject_TypeCheck(o, &KvpLease_Type)) {
		*id = ((KvpLease *)o)->l.id;
		return 0;
	}
	return int_arg(o, "lease", UINT64_MAX, id);
}

static PyObject *q_info(KvpClient *self, PyObject *args)
{
	struct int_arg user = INT_ARG("queue_info: user", UINT64_MAX);
	struct int_arg tag = INT_ARG("queue_info: tag", UINT64_MAX);
	int ret;

	if (!PyArg_ParseTuple(args, "O&|O&:queue_info", int_conv, &user, int_conv, &tag) ||
	    client_enter(self))
		return NULL;
	ret = kvp_queue_info(self->c, user.v, tag.v);
	client_leave(self);
	return queue_result(self, ret);
}

static PyObject *q_prepare(KvpClient *self, PyObject *args)
{
	struct int_arg user = INT_ARG("queue_prepare: user", UINT64_MAX);
	struct int_arg start = INT_ARG("queue_prepare: start_pos", UINT64_MAX);
	struct int_arg n_new = INT_ARG("queue_prepare: n_new", UINT32_MAX);
	struct int_arg tag = INT_ARG("queue_prepare: tag", UINT64_MAX);
	int ret;

	if (!PyArg_ParseTuple(args, "O&O&O&|O&:queue_prepare", int_conv, &user, int_conv,
			      &start, int_conv, &n_new, int_conv, &tag) ||
	    client_enter(self))
		return NULL;
	ret = kvp_queue_prepare(self->c, user.v, start.v, (uint32_t)n_new.v, tag.v);
	client_leave(self);
	return queue_result(self, ret);
}

static PyObject *q_commit(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "lease", "n", "release", "tag", NULL };
	struct int_arg n = INT_ARG("queue_commit: n", UINT32_MAX);
	struct int_arg tag = INT_ARG("queue_commit: tag", UINT64_MAX);
	int release = 0, ret;
	PyObject *lease_o;
	uint64_t id;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&|pO&:queue_commit", kwlist,
					 &lease_o, int_conv, &n, &release, int_conv,
					 &tag) ||
	    lease_id_from_object(lease_o, &id) || client_enter(self))
		return NULL;
	CALL(ret, kvp_queue_commit(self->c, id, (uint32_t)n.v, release, tag.v));
	client_leave(self);
	if (ret >= 0 && PyObject_TypeCheck(lease_o, &KvpLease_Type)) {
		/* Queued: the Lease may not be used to write any more; a
		 * release in the same operation ends it. */
		((KvpLease *)lease_o)->committed = 1;
		if (release) {
			((KvpLease *)lease_o)->released = 1;
			client_live_del(self, id);
		}
	}
	return queue_result(self, ret);
}

static PyObject *q_release(KvpClient *self, PyObject *args)
{
	struct int_arg tag = INT_ARG("queue_release: tag", UINT64_MAX);
	PyObject *lease_o;
	uint64_t id;
	int ret;

	if (!PyArg_ParseTuple(args, "O|O&:queue_release", &lease_o, int_conv, &tag) ||
	    lease_id_from_object(lease_o, &id) || client_enter(self))
		return NULL;
	CALL(ret, kvp_queue_release(self->c, id, tag.v));
	client_leave(self);
	if (ret >= 0) {
		if (PyObject_TypeCheck(lease_o, &KvpLease_Type))
			((KvpLease *)lease_o)->released = 1;
		client_live_del(self, id);
	}
	return queue_result(self, ret);
}

static PyObject *q_submit(KvpClient *self, PyObject *unused)
{
	int ret;

	if (client_enter(self))
		return NULL;
	CALL(ret, kvp_submit(self->c));
	client_leave(self);
	if (ret < 0)
		return kvp_raise_client(self, ret);
	return PyLong_FromLong(ret);
}

#define REAP_MAX 256

static PyObject *q_reap(KvpClient *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "min_complete", "max", NULL };
	struct int_arg min_a = INT_ARG("reap: min_complete", UINT32_MAX);
	struct int_arg max_a = INT_ARG("reap: max", UINT32_MAX);
	unsigned int min_complete, max;
	struct kvp_completion *cq;
	PyObject *list = NULL;
	int ret;

	min_a.v = 1;
	max_a.v = REAP_MAX;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&O&:reap", kwlist, int_conv, &min_a,
					 int_conv, &max_a))
		return NULL;
	min_complete = (unsigned int)min_a.v;
	max = (unsigned int)max_a.v;
	if (max == 0 || max > REAP_MAX)
		max = REAP_MAX;
	if (min_complete > max)
		min_complete = max;
	cq = PyMem_Calloc(max, sizeof(*cq));
	if (!cq)
		return PyErr_NoMemory();
	if (client_enter(self)) {
		PyMem_Free(cq);
		return NULL;
	}
	CALL(ret, kvp_reap(self->c, cq, max, min_complete));
	if (ret < 0) {
		kvp_raise_client(self, ret);
		goto out;
	}
	list = PyList_New(ret);
	for (int i = 0; list && i < ret; i++) {
		const struct kvp_completion *k = &cq[i];
		PyObject *o = PyStructSequence_New(&Completion_Type), *info = Py_None,
			 *lease = Py_None, *err = Py_None;

		if (!o) {
			Py_CLEAR(list);
			break;
		}
		Py_INCREF(Py_None);
		Py_INCREF(Py_None);
		Py_INCREF(Py_None);
		if (k->res < 0) {
			Py_DECREF(err);
			err = error_object(self, k);
		} else if (k->op == KVP_ASYNC_INFO) {
			Py_DECREF(info);
			info = user_info_to_object(&k->info);
		} else if (k->op == KVP_ASYNC_PREPARE) {
			Py_DECREF(lease);
			lease = lease_new(self, &k->lease, LEASE_HISTORY);
		}
		PyStructSequence_SET_ITEM(o, 0, PyLong_FromUnsignedLongLong(k->tag));
		PyStructSequence_SET_ITEM(o, 1, PyUnicode_FromString(op_name(k->op)));
		PyStructSequence_SET_ITEM(o, 2, PyLong_FromLong(k->res));
		PyStructSequence_SET_ITEM(o, 3, info);
		PyStructSequence_SET_ITEM(o, 4, lease);
		PyStructSequence_SET_ITEM(o, 5, err);
		PyList_SET_ITEM(list, i, o);
		for (int f = 0; f < 6; f++)
			if (!PyStructSequence_GET_ITEM(o, f)) {
				Py_CLEAR(list);
				break;
			}
	}
out:
	client_leave(self);
	PyMem_Free(cq);
	return list;
}

PyMethodDef client_queue_methods[] = {
	{ "queue_info", (PyCFunction)q_info, METH_VARARGS,
	  "queue_info($self, user, tag=0, /)\n--\n\n"
	  "Queue an info (kvp_queue_info); submit() sends it, reap() returns it." },
	{ "queue_prepare", (PyCFunction)q_prepare, METH_VARARGS,
	  "queue_prepare($self, user, start_pos, n_new, tag=0, /)\n--\n\n"
	  "Queue a prepare (kvp_queue_prepare). Operations on one user take effect\n"
	  "in queue order; its completion carries the Lease." },
	{ "queue_commit", (PyCFunction)(void (*)(void))q_commit, METH_VARARGS | METH_KEYWORDS,
	  "queue_commit($self, /, lease, n, release=False, tag=0)\n--\n\n"
	  "Queue a commit of a Lease (or lease id); release=True releases it in the\n"
	  "same operation (kvp_queue_commit)." },
	{ "queue_release", (PyCFunction)q_release, METH_VARARGS,
	  "queue_release($self, lease, tag=0, /)\n--\n\n"
	  "Queue a release of a Lease or lease id (kvp_queue_release)." },
	{ "submit", (PyCFunction)q_submit, METH_NOARGS,
	  "submit($self, /)\n--\n\n"
	  "Publish every queued operation with at most one wake-up (kvp_submit);\n"
	  "returns how many. Synchronous calls raise BusyError until all are reaped." },
	{ "reap", (PyCFunction)(void (*)(void))q_reap, METH_VARARGS | METH_KEYWORDS,
	  "reap($self, /, min_complete=1, max=256)\n--\n\n"
	  "Completions as a list of Completion(tag, op, res, info, lease, error),\n"
	  "waiting until at least min_complete are there (kvp_reap). A failed\n"
	  "operation's exception is in .error, not raised." },
	{ NULL, NULL, 0, NULL },
};

int queue_module_init(PyObject *m)
{
	if (PyStructSequence_InitType2(&Completion_Type, &completion_desc) < 0)
		return -1;
	Py_INCREF(&Completion_Type);
	return PyModule_AddObject(m, "Completion", (PyObject *)&Completion_Type);
}
