/* SPDX-License-Identifier: MIT */
/*
 * fuzz_config - a kvpool.conf, read as kvpoold reads one: config_load()
 * with --config=FILE (daemon/server/config.c, config_settings.c, config_parse.c;
 * lines through libinih). The file is a memfd holding the input.
 *
 * A file is accepted or refused with a message; either way config_free()
 * leaves nothing behind (LeakSanitizer), and what is accepted holds the
 * limits config_load() promises.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "fuzz.h"

static int fd = -1;
static char arg[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fd = memfd_create("kvpool.conf", 0);
	if (fd < 0) {
		perror("fuzz_config: memfd_create");
		abort();
	}
	snprintf(arg, sizeof(arg), "--config=/proc/self/fd/%d", fd);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *argv[] = { "kvpoold", arg, NULL };
	struct config c;
	int ret;

	if (ftruncate(fd, 0) || pwrite(fd, data, size, 0) != (ssize_t)size)
		abort();
	ret = config_load(&c, 2, argv);
	if (!ret) {
		fuzz_assert(c.ntenants <= TENANTS_MAX);
		fuzz_assert(c.ndevices >= 1 && c.ndevices <= DEVICES_MAX);
		fuzz_assert(c.socket && c.socket[0] == '/');
		fuzz_assert(c.device_mem >= 1 && c.layout.page_bytes);
		for (uint32_t i = 0; i < c.ntenants; i++)
			fuzz_assert(memchr(c.tenants[i].name, '\0',
					   sizeof(c.tenants[i].name)));
	}
	config_free(&c);
	return 0;
}
