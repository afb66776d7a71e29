/* SPDX-License-Identifier: MIT */
/*
 * test_tier_wait - a prepare that waits for the disk tier is held by its
 * worker until the tier answers (issue 30's typed wait, read by the ring
 * worker: worker.c, DEFERRAL), answered correctly, while the worker serves
 * other clients meanwhile.
 *
 * kvpoold with one worker (every client's entries on the same thread) and
 * a disk tier. Client A writes NU users of TOKENS tokens, pushes each to
 * disk (KVP_SEL_TO_DISK: device and host frames freed), then prepares all
 * of them at once (one BATCH entry: every item waits for the disk thread's
 * reads, which come back one user at a time). Client B, another process,
 * runs write cycles on users of its own the whole time. Checked:
 *   - every prepare comes back with the whole history (len TOKENS) and the
 *     bytes read back are the bytes written;
 *   - B's cycles went on while A's prepares waited for the disk: B did
 *     cycles between A's submits and A's last completions, summed over the
 *     rounds (a worker that slept on the disk would not serve B);
 * Repeated ROUNDS times.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "harness.h"

#define NU 32u
#define TOKENS 64u
#define ROUNDS 4u
#define SALT 0x74696572ull /* "tier" */
#define B_USER0 900000ull

static int g_bad;
static uint64_t g_wait_ms, g_b_cycles; /* A's waits, B's cycles in them */

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

struct shared {
	const char *sock;
	uint64_t cycles;   /* B's, atomic */
	int stop;          /* atomic */
};

static uint64_t user_of(uint32_t r, uint32_t i)
{
	return 1000ull * (r + 1) + i;
}

/* B: write cycles on its own users until told to stop. */
static int writer(void *arg)
{
	struct shared *sh = arg;
	struct kvp_client *c = h_connect_or_fail(sh->sock, "tier-b", 5000);
	uint32_t i = 0;

	if (!c)
		return 1;
	while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
		uint64_t u = B_USER0 + i++ % 8;

		if (h_append_cycle(c, SALT, u, UINT64_MAX, 1, 0))
			return 1;
		/* Keep B's histories short: they never reach the disk. */
		if (i % 64 == 0)
			for (uint64_t k = 0; k < 8; k++)
				kvp_evict(c, B_USER0 + k, KVP_SEL_ALL);
		__atomic_add_fetch(&sh->cycles, 1, __ATOMIC_RELEASE);
	}
	kvp_close(c);
	return 0;
}

static void round_(struct kvp_client *c, struct shared *sh, uint32_t r)
{
	struct kvp_completion cq[NU];
	struct kvp_user_info ui;
	uint64_t b0, b1, t0;
	uint32_t got = 0, ok = 0;

	for (uint32_t i = 0; i < NU; i++) {
		uint64_t u = user_of(r, i);

		for (uint32_t k = 0; k < TOKENS; k += 16)
			if (h_append_cycle(c, SALT, u, k, 16, 0)) {
				g_bad++;
				return;
			}
		CHECK(kvp_evict(c, u, KVP_SEL_TO_DISK) >= 0, "push %" PRIu64
		      " to disk: %s", u, kvp_last_error(c));
		CHECK(kvp_info(c, u, &ui) == 0 && ui.len == TOKENS &&
		      !ui.pages_device && !ui.pages_host && ui.pages_disk,
		      "user %" PRIu64 " is not on disk only: len %" PRIu64
		      " device %u host %u disk %u", u, ui.len, ui.pages_device,
		      ui.pages_host, ui.pages_disk);
	}
	for (uint32_t i = 0; i < NU; i++)
		CHECK(kvp_queue_prepare(c, user_of(r, i), TOKENS, 0, i) == 0,
		      "queue_prepare: %s", kvp_last_error(c));
	b0 = __atomic_load_n(&sh->cycles, __ATOMIC_ACQUIRE);
	t0 = h_now_ms();
	CHECK(kvp_submit(c) == (int)NU, "submit: %s", kvp_last_error(c));
	while (got < NU) {
		int n = kvp_reap(c, cq + got, NU - got, 1);

		if (n <= 0) {
			CHECK(0, "reap: %d %s", n, kvp_last_error(c));
			return;
		}
		got += (uint32_t)n;
	}
	b1 = __atomic_load_n(&sh->cycles, __ATOMIC_ACQUIRE);
	h_log("round %u: %u prepares from disk in %" PRIu64 " ms; B did %" PRIu64
	      " cycles meanwhile", r, NU, h_now_ms() - t0, b1 - b0);
	for (uint32_t i = 0; i < NU; i++) {
		CHECK(cq[i].res == 0 && cq[i].lease.len == TOKENS,
		      "prepare of %" PRIu64 ": %d len %" PRIu64 " %s",
		      user_of(r, cq[i].tag), cq[i].res, cq[i].lease.len,
		      cq[i].error ? cq[i].error : "");
		if (cq[i].res == 0) {
			ok++;
			kvp_release(c, cq[i].lease.id);
		}
	}
	/* Summed over the rounds (main): on two busy cores one round's wait
	 * may pass while B's process is not even scheduled. */
	g_wait_ms += h_now_ms() - t0;
	g_b_cycles += b1 - b0;
	for (uint32_t i = 0; i < NU && ok == NU; i += 5)
		CHECK(h_verify_user(c, SALT, user_of(r, i), 0, TOKENS, NULL) == 0,
		      "user %" PRIu64 ": the bytes read back from disk differ",
		      user_of(r, i));
	/* The next round starts from a device tier with room. */
	for (uint32_t i = 0; i < NU; i++)
		kvp_evict(c, user_of(r, i), KVP_SEL_ALL);
}

int main(int argc, char **argv)
{
	struct h_daemon d;
	struct shared *sh;
	struct kvp_client *c;
	char disk[300], adisk[320];
	uint64_t t0 = h_now_ms();
	pid_t b;

	h_init(argc, argv, "test_tier_wait");
	sh = h_shared_zalloc(sizeof(*sh));
	if (!sh || h_daemon_dir(&d, 0))
		return H_FAIL;
	snprintf(disk, sizeof(disk), "%s/disk", d.dir);
	snprintf(adisk, sizeof(adisk), "--disk_dir=%s", disk);
	if (mkdir(disk, 0700)) {
		h_fail("mkdir %s: %m", disk);
		return h_daemon_end(&d, 1);
	}
	if (h_daemon_start(&d, 10000, "--device_mem=2M", "--host_mem=1M", adisk,
			   "--disk_size=64M", "--workers=1", (char *)NULL))
		return h_daemon_end(&d, 1);
	sh->sock = d.sock;
	c = h_connect_or_fail(d.sock, "tier-a", 5000);
	if (!c)
		return h_daemon_end(&d, 1);
	b = h_fork(writer, sh);
	CHECK(b > 0, "fork B");
	while (b > 0 && __atomic_load_n(&sh->cycles, __ATOMIC_ACQUIRE) < 10)
		h_sleep_ms(1);
	for (uint32_t r = 0; r < ROUNDS && !g_bad; r++)
		round_(c, sh, r);
	/* A cycle of B's is a few round trips: ask for them only when A's
	 * waits were long enough for many. */
	h_log("A waited %" PRIu64 " ms for the disk; B did %" PRIu64 " cycles "
	      "meanwhile", g_wait_ms, g_b_cycles);
	if (!g_bad && g_wait_ms >= 20)
		CHECK(g_b_cycles >= 1, "B did no cycle in the %" PRIu64 " ms A's "
		      "prepares read from disk", g_wait_ms);
	__atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
	if (b > 0)
		CHECK(h_wait(b, 10000) == 0, "B failed");
	kvp_close(c);
	return h_daemon_finish(&d, g_bad, t0);
}
