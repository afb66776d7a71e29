/* SPDX-License-Identifier: MIT */
/*
 * model_util.h - what the model-based random tests (test_engine_model,
 * test_share_model) share: the report of a mismatch and the splitmix64
 * mixer their generators are built on. Include after <cmocka.h>.
 */
#ifndef KVPOOL_MODEL_UTIL_H
#define KVPOOL_MODEL_UTIL_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Print where a run left the model (configuration, seed, step, operation,
 * test line and what disagreed), so it reproduces, and fail the test. */
__attribute__((format(printf, 6, 7), noreturn))
static inline void model_mismatch(const char *cfg, uint64_t seed, uint64_t step,
				  const char *op, int line, const char *fmt, ...)
{
	char msg[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	print_error("MODEL MISMATCH in %s, seed %#" PRIx64 ", step %" PRIu64 "\n"
		    "  op: %s\n  line %d: %s\n", cfg, seed, step, op, line, msg);
	fail();
	abort();
}

/* splitmix64's finaliser: deterministic for a seed, on every platform. */
static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif /* KVPOOL_MODEL_UTIL_H */
