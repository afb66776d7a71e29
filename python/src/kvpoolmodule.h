/* SPDX-License-Identifier: MIT */
/*
 * kvpoolmodule.h - what the parts of the kvpool._kvpool extension share.
 *
 * The extension is a thin C layer over libkvpool: every Python call is one
 * library call plus argument conversion, so a call costs little more than
 * the C call itself (tools/pybench.py measures it). The Python package
 * (python/kvpool/) adds the torch conveniences on top of these types.
 *
 * Objects and what they hold:
 *   Client  - one struct kvp_client (one attach to kvpoold). A lock
 *             serialises calls (libkvpool clients are single-threaded);
 *             calls run with the GIL released.
 *   Lease   - a copy of a struct kvp_lease plus a Python-owned copy of its
 *             page table; holds its Client.
 *   View    - a strided window on the client's device tier (shape, strides,
 *             dtype), exported through the buffer protocol (shm backend),
 *             DLPack and __cuda_array_interface__ (cuda backend). A View
 *             holds its Client, and the Client's mapping lives as long as
 *             any View does (see client_close in client.c: MAPPING LIFETIME).
 */
#ifndef KVPOOLMODULE_H
#define KVPOOLMODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>

#include <kvpool.h>

/* ------------------------------------------------------------ Client */

typedef struct {
	PyObject_HEAD
	struct kvp_client *c;    /* NULL once detached */
	PyThread_type_lock lock; /* one call at a time */
	int closed;              /* close() was called: every call raises */
	Py_ssize_t views;        /* live View objects (they keep the mapping) */
	struct kvp_layout layout;
	void *tier;              /* kvp_device_base() */
	uint64_t tier_frames;    /* device-tier frames of this client's tenant */
	int cuda_device;         /* -1: shm backend (host memory) */
	uint32_t tp, rank;       /* a tensor-parallel pool's ranks, this one's */
	/* Leases this client holds that Python has not released: close()
	 * releases them even while Views keep the mapping alive. */
	uint64_t *live;
	Py_ssize_t nlive, caplive;
	long pid;                /* the process that connected */
	unsigned int fork_gen;   /* kvp_py_fork_gen when it connected */
	PyObject *weakrefs;
} KvpClient;

/* Bumped in every fork() child (module.c). */
extern unsigned int kvp_py_fork_gen;

extern PyTypeObject KvpClient_Type;

/* Raise for a closed client (ClientClosedError); returns -1. */
int client_check_open(KvpClient *self);
/* Take the client's lock (releasing the GIL while waiting); -1 with an
 * exception set when the client is closed. */
int client_enter(KvpClient *self);
void client_leave(KvpClient *self);
/* One library call with the GIL released, between enter and leave. */
#define CALL(ret, expr)                                                        \
	do {                                                                   \
		Py_BEGIN_ALLOW_THREADS(ret) = (expr);                          \
		Py_END_ALLOW_THREADS                                           \
	} while (0)
/* A View was created / freed (the last one of a closed client detaches). */
void client_view_get(KvpClient *self);
void client_view_put(KvpClient *self);
void client_live_add(KvpClient *self, uint64_t lease);
void client_live_del(KvpClient *self, uint64_t lease);

/* ------------------------------------------------------------ Lease */

enum lease_kind {
	LEASE_HISTORY = 0, /* prepare: a user history */
	LEASE_SEQ = 1,     /* seq_alloc / seq_create / seq_extend */
	LEASE_CHUNK_FILL = 2, /* chunk_register, created: fill, then seal */
	LEASE_CHUNK_READ = 3, /* chunk_acquire */
};

typedef struct {
	PyObject_HEAD
	KvpClient *client;
	struct kvp_lease l;      /* as libkvpool returned it */
	PyObject *table;         /* bytes: int32 page table, our own copy */
	int kind;                /* enum lease_kind */
	int released;
	int committed;           /* commit() returned */
	uint64_t seq;            /* LEASE_SEQ */
	struct kvp_chunk_reg reg; /* LEASE_CHUNK_FILL (and the id for READ) */
	int sealed;
	PyObject *weakrefs;
} KvpLease;

extern PyTypeObject KvpLease_Type;
/* The type prepare() and friends create: the package's subclass once
 * registered (kvpool.Lease), else KvpLease_Type. */
extern PyTypeObject *lease_type;

/* A Lease for l (its page table copied now); NULL with an exception. */
PyObject *lease_new(KvpClient *client, const struct kvp_lease *l, int kind);

/* ------------------------------------------------------------ View */

#define VIEW_MAX_DIMS 8

typedef struct {
	PyObject_HEAD
	KvpClient *client;
	char *data;              /* first element */
	int ndim;
	int64_t shape[VIEW_MAX_DIMS];
	int64_t strides[VIEW_MAX_DIMS]; /* in elements */
	uint32_t dtype;          /* enum kvp_dtype */
	Py_ssize_t exports;      /* buffer-protocol exports */
} KvpView;

extern PyTypeObject KvpView_Type;

/* ------------------------------------------------------------ errors */

/*
 * Raise the kvpool exception for ret (-errno) with message msg (the daemon's
 * or the library's). The class is chosen by kvpool.errors.from_code (so the
 * hierarchy lives in Python, with its docs). Returns NULL.
 */
PyObject *kvp_raise(int ret, const char *msg);
/* kvp_raise with kvpoold's detail of the error (kind, range), or NULL. */
PyObject *kvp_raise_info(int ret, const char *msg,
			 const struct kvp_error_info *info);
/* kvp_raise for kvp_connect()'s failure (-ENOENT there: no daemon). */
PyObject *kvp_raise_connect(int ret, const char *msg);
/* kvp_raise with the client's last error. */
PyObject *kvp_raise_client(KvpClient *self, int ret);
/* Exception classes the C code raises directly. */
extern PyObject *ClientClosedError;
extern PyObject *StaleLeaseError;

/* ------------------------------------------------------------ helpers */

/* A uint32 token array from a buffer (itemsize 4) or a sequence of ints
 * (or an object with tolist(), e.g. a torch tensor). *buf must be freed
 * with PyMem_Free when *owned. */
int tokens_from_object(PyObject *o, uint32_t **out, uint32_t *n, int *owned,
		       Py_buffer *view);
void tokens_release(uint32_t *tok, int owned, Py_buffer *view);
/* 64 hex digits (str or bytes) or a 32-byte bytes object. */
int chunk_id_from_object(PyObject *o, struct kvp_chunk_id *id);
PyObject *chunk_id_to_str(const struct kvp_chunk_id *id);
/* enum kvp_chunk_type from None (0), an int or a name ("system", ...). */
int chunk_type_from_object(PyObject *o, uint32_t *type, int allow_all);

PyObject *user_info_to_object(const struct kvp_user_info *in);
PyObject *user_info_to_dict(const struct kvp_user_info *in);

/* source.c: integer arguments, range-checked (never wrapped). int_arg()
 * raises TypeError / OverflowError naming the argument and 0..max. */
int int_arg(PyObject *o, const char *name, uint64_t max, uint64_t *out);
/* For PyArg's "O&": struct int_arg a = { "first", UINT32_MAX }; then a.v. */
struct int_arg {
	const char *name;
	uint64_t max;
	uint64_t v;
};
int int_conv(PyObject *o, void *arg);
#define INT_ARG(nm, mx) { .name = (nm), .max = (mx), .v = 0 }

/* source.c: the memory an append reads (see SOURCES there). */
struct kv_src {
	const void *ptr;        /* first byte */
	uint64_t nbytes;        /* bytes there from ptr */
	int ndim;
	int64_t shape[VIEW_MAX_DIMS];
	int device;             /* -1: host; else the CUDA device */
	uint32_t dtype;         /* enum kvp_dtype (DLPack sources) */
	uint8_t dl_code, dl_bits;
	uint32_t itemsize;      /* buffers */
	int is_torch, is_buffer;
	void *stream;           /* a torch tensor on CUDA: torch's current stream */
	Py_buffer buf;
	int have_buf;
	PyObject *keep;         /* the capsule that keeps ptr alive */
};
/* Fill s from o (torch tensor, DLPack capsule or __dlpack__, buffer); what
 * names the call in errors. 0, or -1 with TypeError / ValueError. */
int src_get(PyObject *o, const char *what, struct kv_src *s);
void src_release(struct kv_src *s);
/* Rows of row_bytes in s after checking dtype, device and the inner shape
 * (inner[0..ninner)); -1 with an exception. */
int64_t src_rows(KvpClient *c, const struct kv_src *s, const char *what,
		 const int64_t *inner, int ninner, uint64_t row_bytes);

/* Methods defined in client_pool.c, share.c, chunk.c, queue.c and
 * seq_info.c, part of Client's method table. */
extern PyMethodDef client_pool_methods[];
extern PyMethodDef client_chunk_methods[];
extern PyMethodDef client_share_methods[];
extern PyMethodDef client_queue_methods[];
extern PyMethodDef client_seq_methods[]; /* seq_info.c */

int share_module_init(PyObject *m);
int queue_module_init(PyObject *m);

#endif /* KVPOOLMODULE_H */
