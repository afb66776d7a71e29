/* SPDX-License-Identifier: MIT */
/*
 * bug.h - an invariant that does not hold says which, and where, then aborts.
 *
 * For states only a bug in kvpool can reach (a frame freed twice, a ring
 * that lost an entry), never for what a peer or a user can send: those get
 * an error they can act on. Continuing past a broken invariant would hand
 * one page to two owners, so the process stops, and its last line names the
 * file, the line and the invariant, as Redis's serverAssert does:
 *
 *   kvpoold: BUG at daemon/engine/frames.c:129: the caller made room for n
 *   frames (n > src->nfree || dst->pool != src->pool)
 *
 * KVP_ASSERT(cond, what)  aborts unless cond holds; what says what must hold.
 * KVP_BUG_ON(cond, what)  aborts when cond holds (the broken state).
 * KVP_BUG(what)           aborts: a branch that cannot be reached was.
 *
 * The line goes to standard error with one write(2) and, where the process
 * has set one (kvpoold's log, daemon/server/log.c), to a log sink as well.
 */
#ifndef KVPOOL_LIB_BUG_H
#define KVPOOL_LIB_BUG_H

/* The cold path of the macros: file and line of the check, the invariant
 * in words, the condition's text (NULL for KVP_BUG). Never returns. */
__attribute__((noreturn, cold))
void kvp_bug_at(const char *file, int line, const char *what, const char *cond);

/* Where the line goes besides standard error (NULL: nowhere): called once,
 * with the line (no newline), just before abort(). */
void kvp_bug_set_sink(void (*sink)(const char *line));

#define KVP_BUG(what) kvp_bug_at(__FILE__, __LINE__, (what), NULL)

#define KVP_BUG_ON(cond, what) do {					\
		if (__builtin_expect(!!(cond), 0))			\
			kvp_bug_at(__FILE__, __LINE__, (what), #cond);	\
	} while (0)

#define KVP_ASSERT(cond, what) do {					\
		if (__builtin_expect(!(cond), 0))			\
			kvp_bug_at(__FILE__, __LINE__, (what), "!(" #cond ")"); \
	} while (0)

#endif /* KVPOOL_LIB_BUG_H */
