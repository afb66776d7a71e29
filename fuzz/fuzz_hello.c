/* SPDX-License-Identifier: MIT */
/*
 * fuzz_hello - the hello datagram a connecting process sends, as
 * conn_hello() (daemon/server/listener.c) receives it: into a zeroed buffer one
 * byte longer than struct kvp_hello, with the datagram's real length
 * (MSG_TRUNC), then hello_check(). Checked against two daemons: the
 * defaults (one worker, one pool) and one of 8 workers and 3 pools.
 *
 * What an accepted hello must give: ring sizes that are powers of two in
 * range, cq >= sq, rings of every lane within 64 MiB, an arena in range,
 * a pool the daemon has. A refusal must say why.
 */
#define _GNU_SOURCE
#include <string.h>

#include "config.h"
#include "fuzz.h"
#include "listener.h"

static struct config cfgs[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char *one[] = { "kvpoold", NULL };
	char *many[] = { "kvpoold", "--workers=8", "--devices=0,1,2", NULL };

	if (config_load(&cfgs[0], 1, one) || config_load(&cfgs[1], 3, many)) {
		fprintf(stderr, "fuzz_hello: cannot make the daemons' configs\n");
		abort();
	}
	return 0;
}

static bool pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

static void check(const struct config *cfg, const uint8_t *data, size_t size)
{
	union {
		struct kvp_hello h;
		unsigned char raw[sizeof(struct kvp_hello) + 1];
	} m;
	struct errbuf e = { .msg = "" };
	uint32_t geo[3] = { 0 };
	int ret;

	memset(&m, 0, sizeof(m));
	memcpy(&m, data, size < sizeof(m) ? size : sizeof(m));
	ret = hello_check(cfg, &m.h, (ssize_t)size, geo, &e);
	if (ret) {
		fuzz_assert(ret < 0 && e.msg[0]);
		fuzz_assert(memchr(e.msg, '\0', sizeof(e.msg)));
		return;
	}
	fuzz_assert(size == sizeof(struct kvp_hello));
	fuzz_assert(pow2(geo[0]) && geo[0] >= KVP_RING_MIN_ENTRIES &&
		    geo[0] <= KVP_RING_MAX_ENTRIES);
	fuzz_assert(pow2(geo[1]) && geo[1] >= geo[0]);
	fuzz_assert((uint64_t)cfg->workers * ((uint64_t)geo[0] * sizeof(struct kvp_sqe) +
					      (uint64_t)geo[1] * sizeof(struct kvp_cqe)) <=
		    64ull << 20);
	fuzz_assert(geo[2] >= KVP_ARENA_MIN_BYTES && geo[2] <= KVP_ARENA_MAX_BYTES);
	fuzz_assert(m.h.pool < config_npools(cfg) && m.h.rank < cfg->tp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check(&cfgs[0], data, size);
	check(&cfgs[1], data, size);
	return 0;
}
