/* SPDX-License-Identifier: MIT */
/*
 * errbuf.h - an error message that travels with a -errno.
 *
 * Every engine call that can fail for a reason the user can act on takes a
 * struct errbuf and fills it with text naming what was wrong and what to do.
 * errbuf_set() returns the code it is given so a failure reads as one line:
 *
 *     return errbuf_set(e, -EBUSY, "user %" PRIu64 ": leased; release it first", u);
 *
 * A NULL errbuf is allowed: the message is dropped, the code still returned.
 */
#ifndef KVPOOL_ERRBUF_H
#define KVPOOL_ERRBUF_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool.h"

struct errbuf {
	char msg[KVP_ERRLEN];
	/* What the error is about, as data (kvpool.h struct kvp_error_info;
	 * the completion carries it, proto.h FAILURE DETAIL): set by
	 * errbuf_range() after errbuf_set(), which clears it. */
	uint32_t kind;           /* enum kvp_error_kind, 0: none */
	uint64_t first, last;    /* token positions, both inclusive */
};

__attribute__((format(printf, 3, 4)))
static inline int errbuf_set(struct errbuf *e, int code, const char *fmt, ...)
{
	va_list ap;

	if (e) {
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
		va_end(ap);
		e->kind = 0;
	}
	return code;
}

/* The range the error set just now is about (enum kvp_error_kind), for
 * clients that act on it; returns code, as errbuf_set() does. */
static inline int errbuf_range(struct errbuf *e, int code, uint32_t kind,
			       uint64_t first, uint64_t last)
{
	if (e) {
		e->kind = kind;
		e->first = first;
		e->last = last;
	}
	return code;
}

static inline void errbuf_clear(struct errbuf *e)
{
	if (e) {
		e->msg[0] = '\0';
		e->kind = 0;
	}
}

#endif /* KVPOOL_ERRBUF_H */
