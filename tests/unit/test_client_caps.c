/* SPDX-License-Identifier: MIT */
/*
 * test_client_caps - the caps on attached clients (daemon/server/tenant.c, issue
 * 25 item 12): the count per uid against a reference model through random
 * attaches and detaches of many uids (the open-addressing table's growth
 * and its deletions that shift entries back), the refusal messages naming
 * max_clients_per_uid and max_clients_per_tenant, and the defaults: a
 * quarter and a half of what the descriptor limit leaves room for, never
 * zero.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "tenant.h"

#define NUIDS 200u

/* Distinct uids whose low 9 bits take 8 values: in a table of up to 512
 * entries they have 8 homes, so their runs collide and merge; white-box,
 * the 8 are chosen so that in the table of 512 (where the 200 end up) the
 * homes are its last and first slots, so runs wrap past its end. */
static uint32_t lows[8];

static void pick_lows(void)
{
	static const uint32_t want[8] = { 506, 508, 510, 511, 0, 1, 3, 5 };

	for (int w = 0; w < 8; w++)
		for (uint32_t low = 0; low < 512; low++)
			if (((low * 2654435761u) & 511) == want[w])
				lows[w] = low;
}

static uint32_t uid_of(uint32_t u)
{
	return u << 9 | lows[u % 8];
}

static void counts_match_a_model(void **state)
{
	struct config cfg = { .max_clients_per_uid = 1000000,
			      .max_clients_per_tenant = 1000000, .ndevices = 1 };
	struct tenants ts = { 0 };
	static uint32_t model[NUIDS];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	char msg[256];

	(void)state;
	pick_lows();
	for (int step = 0; step < 200000; step++) {
		uint32_t u, uid;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		u = (uint32_t)(x % NUIDS);
		uid = uid_of(u);
		if ((x >> 32) % 3 && model[u] < 50) {
			assert_int_equal(tenant_attach_check(&ts, &cfg, uid, NULL, msg,
							     sizeof(msg)), 0);
			tenant_uid_count(&ts, uid, 1);
			model[u]++;
		} else if (model[u]) {
			tenant_uid_count(&ts, uid, -1);
			model[u]--;
		}
		if (step % 997 == 0)
			for (uint32_t v = 0; v < NUIDS; v++) {
				struct config one = cfg;

				/* The count is what a cap of model[v] says. */
				one.max_clients_per_uid = model[v] ? model[v] : 1;
				assert_int_equal(tenant_attach_check(&ts, &one,
								     uid_of(v),
								     NULL, msg,
								     sizeof(msg)),
						 model[v] ? -EUSERS : 0);
			}
	}
	for (uint32_t v = 0; v < NUIDS; v++)
		while (model[v]--)
			tenant_uid_count(&ts, uid_of(v), -1);
	assert_int_equal(ts.uids_used, 0);
	free(ts.uids);
}

static void refusals_name_the_setting(void **state)
{
	struct config cfg = { .max_clients_per_uid = 2, .max_clients_per_tenant = 3,
			      .ndevices = 1 };
	struct tenants ts = { 0 };
	struct tenant t = { .name = "chat" };
	char msg[256];

	(void)state;
	for (int i = 0; i < 2; i++) {
		assert_int_equal(tenant_attach_check(&ts, &cfg, 7, &t, msg,
						     sizeof(msg)), 0);
		tenant_uid_count(&ts, 7, 1);
		t.clients++;
	}
	assert_int_equal(tenant_attach_check(&ts, &cfg, 7, &t, msg, sizeof(msg)),
			 -EUSERS);
	assert_non_null(strstr(msg, "uid 7 has 2 clients attached"));
	assert_non_null(strstr(msg, "max_clients_per_uid=2"));
	assert_non_null(strstr(msg, "raise max_clients_per_uid"));
	/* Another uid of the tenant: one more fits, then the tenant's cap. */
	assert_int_equal(tenant_attach_check(&ts, &cfg, 8, &t, msg, sizeof(msg)), 0);
	tenant_uid_count(&ts, 8, 1);
	t.clients++;
	assert_int_equal(tenant_attach_check(&ts, &cfg, 8, &t, msg, sizeof(msg)),
			 -EUSERS);
	assert_non_null(strstr(msg, "tenant chat has 3 clients attached"));
	assert_non_null(strstr(msg, "raise max_clients_per_tenant"));
	/* An admin-only client of a third uid: no tenant to count. */
	assert_int_equal(tenant_attach_check(&ts, &cfg, 0, NULL, msg, sizeof(msg)), 0);
	free(ts.uids);
}

static void defaults_share_the_descriptor_limit(void **state)
{
	struct config cfg = { .ndevices = 1 };
	struct rlimit was, rl;
	uint32_t per_uid, per_tenant;

	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
	rl = was;
	rl.rlim_cur = 256;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	tenant_client_caps(&cfg, &per_uid, &per_tenant);
	/* (256 - 68) / 2 = 94 clients: a quarter and a half. */
	assert_int_equal(per_uid, 23);
	assert_int_equal(per_tenant, 47);
	rl.rlim_cur = 16; /* tiny: never zero */
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	tenant_client_caps(&cfg, &per_uid, &per_tenant);
	assert_true(per_uid >= 1 && per_tenant >= per_uid);
	cfg.max_clients_per_uid = 5;
	cfg.max_clients_per_tenant = 9;
	tenant_client_caps(&cfg, &per_uid, &per_tenant);
	assert_int_equal(per_uid, 5);
	assert_int_equal(per_tenant, 9);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(counts_match_a_model),
		cmocka_unit_test(refusals_name_the_setting),
		cmocka_unit_test(defaults_share_the_descriptor_limit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
