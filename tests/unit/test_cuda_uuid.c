/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_uuid.c - how libkvpool finds kvpoold's GPU among its own
 * devices (libclient/cuda.c, "WHICH GPU"), without a GPU: the UUID's text
 * form, the pick by UUID whatever the ordinals, and the -ENODEV message that
 * names the GPU and $CUDA_VISIBLE_DEVICES when it is not visible. The
 * attach itself on a real GPU is tests/gpu/test_gpu_uuid.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_internal.h"

/* Three GPUs as nvidia-smi -L would list them. */
static const uint8_t gpu[3][16] = {
	{ 0x5f, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70,
	  0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0xf8 },
	{ 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
	  0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f },
	{ 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88,
	  0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00 },
};

static struct kvp_client *client(void)
{
	struct kvp_client *c = calloc(1, sizeof(*c));

	assert_non_null(c);
	snprintf(c->path, sizeof(c->path), "/run/kvpool/kvpoold.sock");
	return c;
}

static void test_uuid_formats_like_nvidia_smi(void **state)
{
	char s[KVPC_UUID_STRLEN];

	(void)state;
	kvpc_uuid_format(gpu[0], s);
	assert_string_equal(s, "GPU-5f1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8");
	kvpc_uuid_format(gpu[1], s);
	assert_string_equal(s, "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
	assert_int_equal(strlen(s), KVPC_UUID_STRLEN - 1);
}

static void test_pick_finds_the_daemons_gpu_under_another_ordinal(void **state)
{
	/* The daemon's ordinal 0 is this process's 2 (CUDA_VISIBLE_DEVICES
	 * reorders), and its 2 our 0: the ordinal is not what is matched. */
	uint8_t v[3][16];
	struct kvp_client *c = client();

	(void)state;
	memcpy(v[0], gpu[2], 16);
	memcpy(v[1], gpu[1], 16);
	memcpy(v[2], gpu[0], 16);
	assert_int_equal(kvpc_cuda_pick(c, gpu[0], 0, (const uint8_t (*)[16])v, 3), 2);
	assert_int_equal(kvpc_cuda_pick(c, gpu[2], 2, (const uint8_t (*)[16])v, 3), 0);
	assert_int_equal(kvpc_cuda_pick(c, gpu[1], 1, (const uint8_t (*)[16])v, 3), 1);
	/* The same ordinal when the views agree. */
	assert_int_equal(kvpc_cuda_pick(c, gpu[1], 1, gpu, 3), 1);
	free(c);
}

static void test_pick_names_the_invisible_gpu_and_CUDA_VISIBLE_DEVICES(void **state)
{
	struct kvp_client *c = client();

	(void)state;
	setenv("CUDA_VISIBLE_DEVICES", "1,2", 1);
	assert_int_equal(kvpc_cuda_pick(c, gpu[0], 0, &gpu[1], 2), -ENODEV);
	assert_string_equal(c->err,
			    "kvpoold's pool is on GPU-5f1a2b3c-4d5e-6f70-8192-"
			    "a3b4c5d6e7f8 (ordinal 0 in the daemon), which is not "
			    "visible to this process (CUDA_VISIBLE_DEVICES=1,2, 2 "
			    "device(s) visible); make it visible");
	free(c);
}

static void test_pick_with_no_device_visible_is_ENODEV(void **state)
{
	struct kvp_client *c = client();

	(void)state;
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	assert_int_equal(kvpc_cuda_pick(c, gpu[2], 3, NULL, 0), -ENODEV);
	assert_non_null(strstr(c->err, "GPU-ffeeddcc-bbaa-9988-7766-554433221100 "
				       "(ordinal 3 in the daemon)"));
	assert_non_null(strstr(c->err, "(CUDA_VISIBLE_DEVICES=, 0 device(s) visible)"));
	unsetenv("CUDA_VISIBLE_DEVICES");
	assert_int_equal(kvpc_cuda_pick(c, gpu[2], 3, gpu, 2), -ENODEV);
	assert_non_null(strstr(c->err, "(CUDA_VISIBLE_DEVICES unset, 2 device(s) "
				       "visible); make it visible"));
	free(c);
}

static void test_pick_refuses_a_welcome_without_uuid(void **state)
{
	static const uint8_t zero[16];
	struct kvp_client *c = client();

	(void)state;
	/* Even if a device happened to have it: zero means "not sent". */
	assert_int_equal(kvpc_cuda_pick(c, zero, 0, &zero, 1), -EPROTO);
	assert_non_null(strstr(c->err, "did not say which GPU its pool is on"));
	assert_non_null(strstr(c->err, "/run/kvpool/kvpoold.sock"));
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uuid_formats_like_nvidia_smi),
		cmocka_unit_test(test_pick_finds_the_daemons_gpu_under_another_ordinal),
		cmocka_unit_test(test_pick_names_the_invisible_gpu_and_CUDA_VISIBLE_DEVICES),
		cmocka_unit_test(test_pick_with_no_device_visible_is_ENODEV),
		cmocka_unit_test(test_pick_refuses_a_welcome_without_uuid),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
