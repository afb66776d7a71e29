/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - what every libFuzzer target in fuzz/ defines, and its helpers.
 *
 * A target's input is what a hostile or broken peer could hand kvpoold:
 * its bytes go to the daemon's own parsing and validation code, linked as
 * kvpoold links it. A crash, an ASan/UBSan report or an abort() of one of
 * the harness's checks (fuzz_assert) is a finding; scripts/fuzz.sh runs
 * every target for a bounded time and prints the reproducer.
 */
#ifndef KVPOOL_FUZZ_H
#define KVPOOL_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A property the code promises: its failure is a finding, like a crash. */
#define fuzz_assert(cond)                                                   \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "%s:%d: fuzz_assert(%s) failed\n",  \
				__FILE__, __LINE__, #cond);                 \
			abort();                                            \
		}                                                           \
	} while (0)

#endif /* KVPOOL_FUZZ_H */
