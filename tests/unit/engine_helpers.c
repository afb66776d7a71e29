/* SPDX-License-Identifier: MIT */
/*
 * engine_helpers.c - the engine unit tests' shared helpers (see
 * engine_helpers.h).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine_helpers.h"
#include "kvp_kernels.h"

void check_at(struct engine *eng, const char *file, int line)
{
	struct errbuf e;
	int rc;

	e.msg[0] = '\0';
	rc = engine_check(eng, &e);
	if (rc != 0)
		fail_msg("%s:%d: engine_check = %d: %s", file, line, rc, e.msg);
}

/* The test's engine, destroyed by the teardown even when an assert fails,
 * so the sanitizer build reports only real leaks. */
struct engine *g_eng;

void drop_engine(void)
{
	engine_destroy(g_eng);
	g_eng = NULL;
}

int teardown(void **state)
{
	(void)state;
	drop_engine();
	return 0;
}

struct engine *mk_engine(uint32_t dev, uint32_t host, uint64_t max_tokens)
{
	return mk_engine_on(dev, host, max_tokens, NULL, NULL);
}

void test_layout(struct kvp_layout *l)
{
	char msg[KVP_ERRLEN];

	if (kvp_layout_init(l, 2, 2, 8, KVP_DTYPE_FP32, PT, msg, sizeof(msg)))
		fail_msg("kvp_layout_init: %s", msg);
}

struct engine *mk_engine_on(uint32_t dev, uint32_t host, uint64_t max_tokens,
			    const struct backend_ops *be, void *be_ctx)
{
	struct engine_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.device_frames = dev;
	cfg.host_frames = host;
	cfg.max_tokens_per_user = max_tokens;
	cfg.backend = be;
	cfg.backend_ctx = be_ctx;
	return mk_engine_cfg(&cfg);
}

struct engine *mk_engine_cfg(struct engine_config *cfg)
{
	struct engine *eng = NULL;
	struct errbuf e;
	int rc;

	e.msg[0] = '\0';
	test_layout(&cfg->layout);
	rc = engine_create(&eng, cfg, &e);
	if (rc)
		fail_msg("engine_create(dev=%u host=%u) = %d: %s", cfg->device_frames,
			 cfg->host_frames, rc, e.msg);
	assert_non_null(eng);
	drop_engine();
	g_eng = eng;
	assert_int_equal(engine_layout(eng)->page_tokens, PT);
	assert_non_null(engine_tier(eng, KVP_TIER_DEVICE));
	assert_non_null(engine_tier(eng, KVP_TIER_DEVICE)->base);
	CHECK(eng);
	return eng;
}

/* Deterministic K/V bytes of token pos of user: never all-zero. */
void pattern(const struct kvp_layout *l, uint64_t user, uint64_t pos,
	     uint32_t n, uint8_t *out)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t x = (user + 1) * 0x9E3779B97F4A7C15ull ^
			     (pos + i + 1) * 0xC2B2AE3D27D4EB4Full;

		for (uint64_t k = 0; k < l->token_bytes; k++) {
			x ^= x >> 29;
			x *= 0xBF58476D1CE4E5B9ull;
			x ^= x >> 32;
			out[i * l->token_bytes + k] = (uint8_t)(x | 1);
		}
	}
}

struct kvp_stats stats_of(struct engine *eng)
{
	struct kvp_stats s;

	memset(&s, 0, sizeof(s));
	engine_stats(eng, &s);
	return s;
}

struct engine_user_info info_of(struct engine *eng, uint64_t user)
{
	struct engine_user_info i;

	memset(&i, 0, sizeof(i));
	engine_info(eng, user, &i);
	return i;
}

void assert_info_same(const struct engine_user_info *a,
		      const struct engine_user_info *b)
{
	assert_int_equal(a->exists, b->exists);
	assert_int_equal(a->start, b->start);
	assert_int_equal(a->len, b->len);
	assert_int_equal(a->pages, b->pages);
	assert_int_equal(a->pages_device, b->pages_device);
	assert_int_equal(a->pages_host, b->pages_host);
	assert_int_equal(a->leases, b->leases);
	assert_int_equal(a->pages_disk, b->pages_disk);
	assert_int_equal(a->tokens_disk, b->tokens_disk);
}

void assert_stats_same(const struct kvp_stats *a, const struct kvp_stats *b)
{
	if (memcmp(a, b, sizeof(*a)) == 0)
		return;
	const uint64_t *x = (const uint64_t *)a, *y = (const uint64_t *)b;
	for (size_t i = 0; i < sizeof(*a) / sizeof(uint64_t); i++)
		if (x[i] != y[i])
			fail_msg("struct kvp_stats word %zu changed: %" PRIu64 " -> %" PRIu64,
				 i, x[i], y[i]);
}

uint64_t dev_used(struct engine *eng)
{
	return stats_of(eng).tier[KVP_TIER_DEVICE].frames_used;
}

struct engine_snap snap_of(struct engine *eng, uint64_t user)
{
	struct engine_snap s;

	memset(&s, 0, sizeof(s));
	s.user = user;
	s.stats = stats_of(eng);
	s.info = info_of(eng, user);
	return s;
}

void assert_unchanged(struct engine *eng, const struct engine_snap *before)
{
	struct kvp_stats sa = stats_of(eng);
	struct engine_user_info ia = info_of(eng, before->user);

	assert_stats_same(&before->stats, &sa);
	assert_info_same(&before->info, &ia);
}

/* prepare or fail with the message */
struct engine_lease prep_ok(struct engine *eng, uint64_t user, uint64_t pos,
			    uint32_t n, uint32_t owner)
{
	struct engine_lease L;
	struct errbuf e;
	int rc;

	memset(&L, 0, sizeof(L));
	e.msg[0] = '\0';
	rc = engine_prepare(eng, user, pos, n, owner, &L, &e);
	if (rc != 0)
		fail_msg("engine_prepare(user %" PRIu64 ", pos %" PRIu64 ", n %u) = %d: %s",
			 user, pos, n, rc, e.msg);
	CHECK(eng);
	return L;
}

int prep_err(struct engine *eng, uint64_t user, uint64_t pos, uint32_t n,
	     struct errbuf *e)
{
	struct engine_lease L;
	int rc;

	memset(&L, 0, sizeof(L));
	e->msg[0] = '\0';
	rc = engine_prepare(eng, user, pos, n, OWNER, &L, e);
	CHECK(eng);
	return rc;
}

/* Write pattern bytes for lease tokens [first, first+n) through its slots. */
void write_lease(struct engine *eng, const struct engine_lease *L,
		 uint64_t user, uint32_t first, uint32_t n)
{
	const struct kvp_layout *l = engine_layout(eng);
	struct kvp_slot *slots = calloc(n ? n : 1, sizeof(*slots));
	uint8_t *buf = malloc((size_t)(n ? n : 1) * l->token_bytes);
	struct errbuf e;
	int rc;

	assert_non_null(slots);
	assert_non_null(buf);
	e.msg[0] = '\0';
	rc = engine_lease_slots(eng, L->id, first, n, slots, &e);
	if (rc != 0)
		fail_msg("engine_lease_slots = %d: %s", rc, e.msg);
	pattern(l, user, L->start + L->len + first, n, buf);
	kvp_append_cpu(l, engine_tier(eng, KVP_TIER_DEVICE)->base, slots, n, buf);
	free(buf);
	free(slots);
}

void commit_ok(struct engine *eng, uint64_t id, uint32_t n)
{
	struct errbuf e;
	int rc;

	e.msg[0] = '\0';
	rc = engine_commit(eng, id, n, &e);
	if (rc != 0)
		fail_msg("engine_commit(%" PRIu64 ", %u) = %d: %s", id, n, rc, e.msg);
	CHECK(eng);
}

void release_ok(struct engine *eng, uint64_t id)
{
	struct errbuf e;
	int rc;

	e.msg[0] = '\0';
	rc = engine_release(eng, id, &e);
	if (rc != 0)
		fail_msg("engine_release(%" PRIu64 ") = %d: %s", id, rc, e.msg);
	CHECK(eng);
}

void write_commit_release(struct engine *eng, const struct engine_lease *L,
			  uint64_t user, uint32_t n)
{
	write_lease(eng, L, user, 0, n);
	commit_ok(eng, L->id, n);
	release_ok(eng, L->id);
}

/* prepare + write + commit all + release */
void put(struct engine *eng, uint64_t user, uint64_t pos, uint32_t n)
{
	struct engine_lease L = prep_ok(eng, user, pos, n, OWNER);

	write_commit_release(eng, &L, user, n);
}

/* Committed tokens [pos, pos+n) of user hold the pattern. */
void verify(struct engine *eng, uint64_t user, uint64_t pos, uint32_t n)
{
	const struct kvp_layout *l = engine_layout(eng);
	uint8_t *got = malloc((size_t)n * l->token_bytes);
	uint8_t *want = malloc((size_t)n * l->token_bytes);
	struct errbuf e;
	int rc;

	assert_non_null(got);
	assert_non_null(want);
	e.msg[0] = '\0';
	rc = engine_read_tokens(eng, user, pos, n, got, &e);
	if (rc != 0)
		fail_msg("engine_read_tokens(user %" PRIu64 ", %" PRIu64 ", %u) = %d: %s",
			 user, pos, n, rc, e.msg);
	pattern(l, user, pos, n, want);
	for (uint32_t i = 0; i < n; i++)
		if (memcmp(got + (size_t)i * l->token_bytes,
			   want + (size_t)i * l->token_bytes, l->token_bytes))
			fail_msg("user %" PRIu64 " token %" PRIu64 ": bytes differ",
				 user, pos + i);
	free(want);
	free(got);
	CHECK(eng);
}

void assert_msg_has(const struct errbuf *e, const char *want)
{
	if (!strstr(e->msg, want))
		fail_msg("message \"%s\" lacks \"%s\"", e->msg, want);
}

static int opaque_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
			struct tier_mem *out, struct errbuf *e)
{
	int ret = backend_shm.tier_alloc(ctx, tier, bytes, out, e);

	if (!ret && tier == KVP_TIER_DEVICE)
		out->host_visible = false;
	return ret;
}

const struct backend_ops *shm_opaque_backend(void)
{
	static struct backend_ops be;

	be = backend_shm;
	be.tier_alloc = opaque_alloc;
	return &be;
}
