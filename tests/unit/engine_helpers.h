/* SPDX-License-Identifier: MIT */
/*
 * engine_helpers.h - what the engine unit tests (test_engine_prepare,
 * test_engine_evict) share: one engine on the shm backend with a small
 * layout, prepare / write / commit / release helpers that fail the test with
 * the engine's message, the deterministic token bytes they write and read
 * back, and stats / info snapshots to compare. Every helper that changes the
 * engine runs engine_check() afterwards.
 *
 * Include after <cmocka.h> (and the headers it needs).
 */
#ifndef KVPOOL_TEST_ENGINE_HELPERS_H
#define KVPOOL_TEST_ENGINE_HELPERS_H

#include <stdint.h>

#include "engine.h"
#include "kvpool.h"

/* 2 layers, 2 heads, dim 8, fp32, 4 tokens/page:
 * token_bytes 256, page_bytes 1024 */
#define PT 4u
#define OWNER 1u

/* engine_check() must pass, or the test fails quoting file:line. */
#define CHECK(eng) check_at((eng), __FILE__, __LINE__)
void check_at(struct engine *eng, const char *file, int line);

/* The test's engine, destroyed by the teardown even when an assert fails,
 * so the sanitizer build reports only real leaks. */
extern struct engine *g_eng;

void drop_engine(void);
/* cmocka teardown: drop_engine(). */
int teardown(void **state);

/* A fresh engine (the previous one destroyed) with dev device frames, host
 * host frames and max_tokens_per_user max_tokens (0: no cap); it becomes
 * g_eng. */
struct engine *mk_engine(uint32_t dev, uint32_t host, uint64_t max_tokens);
/* The test layout above, or the test fails. */
void test_layout(struct kvp_layout *l);
/* An engine of cfg (its layout set to the test layout here); it becomes
 * g_eng, as mk_engine's. */
struct engine *mk_engine_cfg(struct engine_config *cfg);
/* The same on another backend (NULL: shm). */
struct engine *mk_engine_on(uint32_t dev, uint32_t host, uint64_t max_tokens,
			    const struct backend_ops *be, void *be_ctx);
/* The shm backend with its device tier marked not host-visible: what the
 * cuda backend's is (reached through the backend's read and copy only). */
const struct backend_ops *shm_opaque_backend(void);

/* Deterministic K/V bytes of tokens [pos, pos+n) of user: never all-zero. */
void pattern(const struct kvp_layout *l, uint64_t user, uint64_t pos,
	     uint32_t n, uint8_t *out);

struct kvp_stats stats_of(struct engine *eng);
struct engine_user_info info_of(struct engine *eng, uint64_t user);
/* Every field of the two snapshots is equal (the first difference fails). */
void assert_info_same(const struct engine_user_info *a,
		      const struct engine_user_info *b);
void assert_stats_same(const struct kvp_stats *a, const struct kvp_stats *b);
/* Device frames in use. */
uint64_t dev_used(struct engine *eng);

/* The stats and one user's info, to show that a refused call changed
 * nothing. */
struct engine_snap {
	uint64_t user;
	struct kvp_stats stats;
	struct engine_user_info info;
};
struct engine_snap snap_of(struct engine *eng, uint64_t user);
/* The stats, then the user's info, are still those of *before. */
void assert_unchanged(struct engine *eng, const struct engine_snap *before);

/* prepare or fail with the message */
struct engine_lease prep_ok(struct engine *eng, uint64_t user, uint64_t pos,
			    uint32_t n, uint32_t owner);
/* prepare (owner OWNER) that may fail: returns its rc, message in *e. */
int prep_err(struct engine *eng, uint64_t user, uint64_t pos, uint32_t n,
	     struct errbuf *e);
/* Write pattern bytes for lease tokens [first, first+n) through its slots. */
void write_lease(struct engine *eng, const struct engine_lease *L,
		 uint64_t user, uint32_t first, uint32_t n);
void commit_ok(struct engine *eng, uint64_t id, uint32_t n);
void release_ok(struct engine *eng, uint64_t id);
/* Write the pattern of user into lease tokens [0, n), commit n, release. */
void write_commit_release(struct engine *eng, const struct engine_lease *L,
			  uint64_t user, uint32_t n);
/* prepare + write + commit all + release */
void put(struct engine *eng, uint64_t user, uint64_t pos, uint32_t n);
/* Committed tokens [pos, pos+n) of user hold the pattern. */
void verify(struct engine *eng, uint64_t user, uint64_t pos, uint32_t n);
/* The error message contains want. */
void assert_msg_has(const struct errbuf *e, const char *want);

#endif /* KVPOOL_TEST_ENGINE_HELPERS_H */
