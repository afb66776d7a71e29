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
#include <stdio.h>

#include "kvpool.h"

struct errbuf {
	char msg[KVP_ERRLEN];
};

__attribute__((format(printf, 3, 4)))
static inline int errbuf_set(struct errbuf *e, int code, const char *fmt, ...)
{
	va_list ap;

	if (e) {
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

static inline void errbuf_clear(struct errbuf *e)
{
	if (e)
		e->msg[0] = '\0';
}

#endif /* KVPOOL_ERRBUF_H */
