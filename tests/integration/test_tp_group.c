/* SPDX-License-Identifier: MIT */
/*
 * test_tp_group - a tensor-parallel pool (issue 31) on shm: kvpoold with
 * devices = 0,1 and tp = 2, two real client processes, rank 0 (this
 * process) and rank 1 (a child driven through a pipe):
 *
 *   a. attach: each rank gets the rank layout (kv_heads / 2), tp 2 and its
 *      rank; rank 2 is refused naming the ranks; rank 1 on a tp = 1 daemon
 *      is refused naming the setting;
 *   b. rank 0 prepares, rank 1 joins and gets the same page table; rank 1's
 *      prepare, rank 0's join, a double join and a stale id are refused;
 *   c. each rank appends its own bytes into its own pool at the same frame
 *      indices; rank 0's commit is pending (the history does not grow),
 *      rank 1's takes effect;
 *   d. offload, evict the device copy, another user's garbage written by
 *      both ranks into the freed frames, then a prepare onloads the user:
 *      each rank reads its own bytes back in its own pool (the striped
 *      device -> host -> device copies put each rank's page where it
 *      belongs); then down to the disk tier and back, the same;
 *   e. a release by rank 1 before the group committed: rank 0's commit is
 *      -ESTALE saying rank 1 released it, the history unchanged;
 *   e'. another rank 0 process prepares, rank 1 joins, the rank 0 process
 *      is killed: rank 1's commit is -ESTALE saying rank 0's client died;
 *   f. rank 1's process killed (SIGKILL) after it joined and appended,
 *      before it committed: the lease is released, rank 0's commit is
 *      -ESTALE saying rank 1's client died, the history unchanged, no
 *      frame leaked and no lease left (h_check_accounting).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define SALT0 0x7010ull     /* rank 0's bytes */
#define SALT1 0x7011ull     /* rank 1's bytes */
#define GARBAGE 0xbadull
#define USER 1u
#define OTHER 2u
#define MAXP 16u

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

/* What the parent asks rank 1 to do and what it answers. */
struct cmd {
	uint64_t lease, user, start, salt;
	uint32_t n;
	int ret;
	char msg[KVP_ERRLEN];
	uint32_t npages;
	uint64_t len;
	int32_t idx[MAXP];
};

static struct cmd *g_cmd;
static struct h_chan g_ch;
static const char *g_sock;
static unsigned char g_buf[64 * 256];

/* ------------------------------------------------------------ rank 1 */

static int rank1_do(struct kvp_client *c, char op, struct kvp_lease *cur)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	struct kvp_lease tmp;
	int ret = 0;

	switch (op) {
	case 'j':
		ret = kvp_lease_join(c, g_cmd->lease, &tmp);
		if (!ret) {
			*cur = tmp;
			g_cmd->npages = tmp.npages;
			g_cmd->len = tmp.len;
			memcpy(g_cmd->idx, tmp.indices,
			       (tmp.npages < MAXP ? tmp.npages : MAXP) * sizeof(int32_t));
		}
		return ret;
	case 'p':
		return kvp_prepare(c, g_cmd->user, g_cmd->start, g_cmd->n, &tmp);
	case 'a':
		h_tokens_fill(lay, g_cmd->salt, cur->user, cur->start + cur->len,
			      cur->n_new, g_buf);
		return kvp_append(c, cur, 0, cur->n_new, g_buf);
	case 'c':
		return kvp_commit(c, g_cmd->lease, g_cmd->n);
	case 'r':
		return kvp_release(c, g_cmd->lease);
	case 'v':
		return h_same_bytes(c, cur->indices, g_cmd->salt, cur->user,
				    (uint32_t)cur->len, "rank 1's pool");
	case 'i':
		/* The attach: layout, tp and rank as rank 1 sees them. */
		g_cmd->npages = kvp_device_frames(c);
		g_cmd->len = lay->kv_heads;
		g_cmd->n = kvp_client_tp(c) << 8 | kvp_client_rank(c);
		return 0;
	}
	return -ENOSYS;
}

static int rank1(void *arg)
{
	struct kvp_connect_opts o = { .socket = g_sock, .name = "rank1", .rank = 1 };
	struct kvp_lease cur = { 0 };
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	int op;

	(void)arg;
	h_set_name("rank1");
	h_chan_child_side(&g_ch);
	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("rank 1 attach: %s", err);
		return 1;
	}
	while ((op = h_chan_wait(g_ch.to_child[0], 30000)) > 0 && op != 'q') {
		g_cmd->msg[0] = '\0';
		g_cmd->ret = rank1_do(c, (char)op, &cur);
		snprintf(g_cmd->msg, sizeof(g_cmd->msg), "%s", kvp_last_error(c));
		if (h_chan_say(g_ch.to_parent[1], 'k'))
			break;
	}
	kvp_close(c);
	return 0;
}

/* Ask rank 1 to do op; its return value. */
static int ask(char op)
{
	g_cmd->ret = -EIO;
	if (h_chan_say(g_ch.to_child[1], op) ||
	    h_chan_wait(g_ch.to_parent[0], 10000) != 'k') {
		h_fail("rank 1 did not answer '%c'", op);
		g_bad++;
		return -EIO;
	}
	return g_cmd->ret;
}

/* ------------------------------------------------------------ rank 0 */

static void check_attach(struct kvp_client *c, const struct h_daemon *one)
{
	struct kvp_connect_opts o = { .socket = g_sock, .rank = 2 };
	struct kvp_client *x = NULL;
	char err[KVP_ERRLEN];
	int ret;

	CHECK(kvp_client_tp(c) == 2 && kvp_client_rank(c) == 0,
	      "rank 0: tp %u rank %u, want 2 and 0", kvp_client_tp(c),
	      kvp_client_rank(c));
	CHECK(kvp_client_layout(c)->kv_heads == 1,
	      "rank 0's layout has %u kv_heads, want 1 (2 / tp)",
	      kvp_client_layout(c)->kv_heads);
	CHECK(kvp_device_frames(c) == 4, "rank 0 maps %u frames, want 4",
	      kvp_device_frames(c));
	CHECK(ask('i') == 0 && g_cmd->n == (2u << 8 | 1) && g_cmd->len == 1 &&
	      g_cmd->npages == 4, "rank 1: tp/rank %#x kv_heads %" PRIu64
	      " frames %u, want 0x201, 1, 4", g_cmd->n, g_cmd->len, g_cmd->npages);

	ret = kvp_connect(&x, &o, err, sizeof(err));
	CHECK(ret == -EINVAL && strstr(err, "rank 2: pool 0 is tensor-parallel "
					   "over 2 GPUs: ranks 0 to 1"),
	      "rank 2 of tp 2: %d '%s'", ret, err);
	kvp_close(x);
	o = (struct kvp_connect_opts){ .socket = one->sock, .rank = 1 };
	ret = kvp_connect(&x, &o, err, sizeof(err));
	CHECK(ret == -EINVAL && strstr(err, "rank 1: pool 0 is not tensor-parallel "
					   "(kvpoold's tp = 1)"),
	      "rank 1 of a tp = 1 daemon: %d '%s'", ret, err);
	kvp_close(x);
}

/* Rank 0 prepares user [start, start + n), rank 1 joins: the lease, or 0. */
static uint64_t group_prepare(struct kvp_client *c, uint64_t user,
			      uint64_t start, uint32_t n, struct kvp_lease *l)
{
	int ret = kvp_prepare(c, user, start, n, l);

	CHECK(!ret, "prepare(%" PRIu64 ", %" PRIu64 ", %u): %d %s", user, start,
	      n, ret, kvp_last_error(c));
	if (ret)
		return 0;
	g_cmd->lease = l->id;
	ret = ask('j');
	CHECK(!ret, "rank 1 join of %#" PRIx64 ": %d %s", l->id, ret, g_cmd->msg);
	CHECK(g_cmd->npages == l->npages && g_cmd->len == l->len &&
	      !memcmp(g_cmd->idx, l->indices, l->npages * sizeof(int32_t)),
	      "rank 1's page table (%u pages, len %" PRIu64 ") is not rank 0's "
	      "(%u, %" PRIu64 ")", g_cmd->npages, g_cmd->len, l->npages, l->len);
	return l->id;
}

static uint64_t hist_len(struct kvp_client *c, uint64_t user)
{
	struct kvp_user_info u;

	return kvp_info(c, user, &u) ? UINT64_MAX : u.len;
}

/* Both ranks append their bytes (salt0, salt1) into lease l. */
static void both_append(struct kvp_client *c, const struct kvp_lease *l,
			uint64_t salt0, uint64_t salt1)
{
	int ret;

	h_tokens_fill(kvp_client_layout(c), salt0, l->user, l->start + l->len,
		      l->n_new, g_buf);
	ret = kvp_append(c, l, 0, l->n_new, g_buf);
	CHECK(!ret, "rank 0 append: %d %s", ret, kvp_last_error(c));
	g_cmd->salt = salt1;
	ret = ask('a');
	CHECK(!ret, "rank 1 append: %d %s", ret, g_cmd->msg);
}

static void step_refusals(struct kvp_client *c)
{
	struct kvp_lease l;
	uint64_t id = group_prepare(c, USER, 0, 32, &l);
	int ret;

	g_cmd->user = USER;
	g_cmd->start = 0;
	g_cmd->n = 32;
	ret = ask('p');
	CHECK(ret == -EINVAL && strstr(g_cmd->msg, "rank 1 of a tensor-parallel "
				       "pool: rank 0 prepares; join its lease with "
				       "kvp_lease_join"),
	      "rank 1's prepare: %d '%s'", ret, g_cmd->msg);
	ret = kvp_lease_join(c, id, &l);
	CHECK(ret == -EINVAL && strstr(kvp_last_error(c), "rank 0 of a "
				       "tensor-parallel pool prepares"),
	      "rank 0's join: %d '%s'", ret, kvp_last_error(c));
	g_cmd->lease = id;
	ret = ask('j');
	CHECK(ret == -EALREADY && strstr(g_cmd->msg, "rank 1 joined it already"),
	      "rank 1's second join: %d '%s'", ret, g_cmd->msg);
	g_cmd->lease = id + (1ull << 32); /* the slot's next generation */
	ret = ask('j');
	CHECK(ret == -ESTALE && strstr(g_cmd->msg, "is not held"),
	      "a stale id's join: %d '%s'", ret, g_cmd->msg);
	g_cmd->lease = id;

	/* c. Each rank's own bytes; rank 0's commit waits for rank 1's. */
	both_append(c, &l, SALT0, SALT1);
	ret = kvp_commit(c, id, 32);
	CHECK(ret == KVP_COMMIT_PENDING, "rank 0's commit: %d (want %d, pending) %s",
	      ret, KVP_COMMIT_PENDING, kvp_last_error(c));
	CHECK(hist_len(c, USER) == 0, "after rank 0's commit alone the history "
	      "has %" PRIu64 " tokens, want 0", hist_len(c, USER));
	/* Rank 0 is done: its release does not end the group. */
	ret = kvp_release(c, id);
	CHECK(ret == 0, "rank 0's release after its commit: %d %s", ret,
	      kvp_last_error(c));
	g_cmd->n = 32;
	ret = ask('c');
	CHECK(ret == 0, "rank 1's commit (the last): %d %s", ret, g_cmd->msg);
	CHECK(hist_len(c, USER) == 32, "after both commits the history has %"
	      PRIu64 " tokens, want 32", hist_len(c, USER));
	ret = ask('r');
	CHECK(ret == 0, "rank 1's release: %d %s", ret, g_cmd->msg);
}

/* Both ranks read user's committed bytes through a read lease. */
static void both_verify(struct kvp_client *c, uint64_t user, uint32_t len,
			int want_onloaded)
{
	struct kvp_lease l;
	uint64_t id = group_prepare(c, user, len, 0, &l);
	int ret;

	if (!id)
		return;
	CHECK(want_onloaded < 0 || l.onloaded_pages == (uint32_t)want_onloaded,
	      "the read prepare onloaded %u pages, want %d", l.onloaded_pages,
	      want_onloaded);
	CHECK(!h_same_bytes(c, l.indices, SALT0, user, len, "rank 0's pool"),
	      "rank 0's bytes of user %" PRIu64, user);
	g_cmd->salt = SALT1;
	CHECK(ask('v') == 0, "rank 1's bytes of user %" PRIu64, user);
	g_cmd->lease = id;
	ret = ask('r');
	CHECK(ret == 0, "rank 1's release of the read lease: %d %s", ret, g_cmd->msg);
	ret = kvp_release(c, id);
	CHECK(ret == 0, "rank 0's release of the read lease: %d %s", ret,
	      kvp_last_error(c));
}

/* d. Offload, drop the device copy, garbage into the freed frames, onload. */
static void step_roundtrip(struct kvp_client *c)
{
	struct kvp_lease l;
	uint64_t id;
	int ret;

	both_verify(c, USER, 32, 0);
	ret = kvp_offload(c, USER);
	CHECK(ret == 2, "offload: %d pages, want 2 (%s)", ret, kvp_last_error(c));
	ret = kvp_evict(c, USER, KVP_SEL_DEVICE);
	CHECK(ret == 2, "evict of the device copy: %d pages, want 2 (%s)", ret,
	      kvp_last_error(c));
	/* Another user's garbage in every device frame, from both ranks. */
	id = group_prepare(c, OTHER, 0, 64, &l);
	if (id) {
		both_append(c, &l, GARBAGE, GARBAGE);
		ret = kvp_commit(c, id, 64);
		CHECK(ret == KVP_COMMIT_PENDING, "garbage commit, rank 0: %d", ret);
		g_cmd->n = 64;
		CHECK(ask('c') == 0, "garbage commit, rank 1: %s", g_cmd->msg);
		CHECK(ask('r') == 0, "garbage release, rank 1: %s", g_cmd->msg);
		CHECK(kvp_release(c, id) == 0, "garbage release, rank 0: %s",
		      kvp_last_error(c));
	}
	/* The onload evicts the garbage and lands the host copy, per rank. */
	both_verify(c, USER, 32, 2);

	/* Down to the disk tier (device and host frames freed) and back. */
	{
		struct kvp_user_info u;

		ret = kvp_evict(c, USER, KVP_SEL_TO_DISK);
		CHECK(ret >= 0, "push to disk: %d %s", ret, kvp_last_error(c));
		ret = kvp_info(c, USER, &u);
		CHECK(!ret && u.pages_disk == 2 && !u.pages_device && !u.pages_host,
		      "after the push to disk: %d, %u disk %u device %u host pages",
		      ret, u.pages_disk, u.pages_device, u.pages_host);
	}
	both_verify(c, USER, 32, 2);
}

/* e. Rank 1 releases before the group committed. */
static void step_release(struct kvp_client *c)
{
	struct kvp_lease l;
	uint64_t id = group_prepare(c, USER, 32, 16, &l);
	int ret;

	if (!id)
		return;
	both_append(c, &l, SALT0, SALT1);
	ret = ask('r');
	CHECK(ret == 0, "rank 1's release: %d %s", ret, g_cmd->msg);
	ret = kvp_commit(c, id, 16);
	CHECK(ret == -ESTALE && strstr(kvp_last_error(c), "released (rank 1's "
				       "client released it) before every rank "
				       "committed; nothing changed; prepare again"),
	      "rank 0's commit after rank 1's release: %d '%s'", ret,
	      kvp_last_error(c));
	CHECK(hist_len(c, USER) == 32, "the history has %" PRIu64 " tokens, want "
	      "32 (unchanged)", hist_len(c, USER));
	ret = kvp_commit(c, id, 16);
	CHECK(ret == -ESTALE, "rank 0's second commit: %d, want -ESTALE", ret);
	ret = kvp_release(c, id);
	CHECK(ret == 0, "rank 0's release of the ended lease: %d %s", ret,
	      kvp_last_error(c));
}

/* Wait until the daemon unpinned user (a group ended by a death). */
static void wait_unpinned(struct kvp_client *c, uint64_t user)
{
	struct kvp_user_info u = { 0 };
	uint64_t t0;

	for (t0 = h_now_ms(); h_now_ms() - t0 < 5000; h_sleep_ms(5))
		if (!kvp_info(c, user, &u) && !u.leases)
			break;
	CHECK(!u.leases, "user %" PRIu64 " still has %u leases 5 s after a rank "
	      "died", user, u.leases);
}

/* Another rank 0 process: prepares, says the lease id, waits to be killed. */
static volatile uint64_t *g_r0_lease;

static int rank0_child(void *arg)
{
	struct kvp_connect_opts o = { .socket = g_sock, .name = "rank0b" };
	struct kvp_client *c;
	struct kvp_lease l;
	char err[KVP_ERRLEN];

	(void)arg;
	h_set_name("rank0b");
	if (kvp_connect(&c, &o, err, sizeof(err)) ||
	    kvp_prepare(c, USER, 32, 16, &l)) {
		h_fail("rank 0b: %s", err);
		*g_r0_lease = UINT64_MAX;
		return 1;
	}
	*g_r0_lease = l.id;
	for (;;)
		h_sleep_ms(100);
}

/* e'. The process that prepared (rank 0) dies after rank 1 joined. */
static void step_kill_owner(struct kvp_client *c)
{
	uint64_t t0;
	pid_t pid;
	int ret;

	*g_r0_lease = 0;
	pid = h_fork(rank0_child, NULL);
	for (t0 = h_now_ms(); !*g_r0_lease && h_now_ms() - t0 < 5000; )
		h_sleep_ms(2);
	if (pid < 0 || !*g_r0_lease || *g_r0_lease == UINT64_MAX) {
		CHECK(0, "the second rank 0 did not prepare");
		return;
	}
	g_cmd->lease = *g_r0_lease;
	ret = ask('j');
	CHECK(ret == 0, "rank 1's join of rank 0b's lease: %d %s", ret, g_cmd->msg);
	g_cmd->salt = SALT1;
	CHECK(ask('a') == 0, "rank 1's append: %s", g_cmd->msg);
	kill(pid, SIGKILL);
	CHECK(h_wait(pid, 5000) == 128 + SIGKILL, "rank 0b did not die of SIGKILL");
	wait_unpinned(c, USER);
	g_cmd->n = 16;
	ret = ask('c');
	CHECK(ret == -ESTALE && strstr(g_cmd->msg, "released (rank 0's client "
				       "died) before every rank committed"),
	      "rank 1's commit after rank 0 died: %d '%s'", ret, g_cmd->msg);
	ret = ask('r');
	CHECK(ret == 0, "rank 1's release of the ended lease: %d %s", ret, g_cmd->msg);
	CHECK(hist_len(c, USER) == 32, "the history has %" PRIu64 " tokens, want "
	      "32 (unchanged)", hist_len(c, USER));
}

/* f. Rank 1's process dies after it joined and appended. */
static void step_kill(struct kvp_client *c, pid_t child)
{
	struct kvp_stats st;
	struct kvp_lease l;
	uint64_t id = group_prepare(c, USER, 32, 16, &l);
	int ret;

	if (!id)
		return;
	both_append(c, &l, SALT0, SALT1);
	kill(child, SIGKILL);
	CHECK(h_wait(child, 5000) == 128 + SIGKILL, "rank 1 did not die of SIGKILL");
	/* The daemon ends the group when it sees the death: the user is
	 * unpinned then. */
	wait_unpinned(c, USER);
	ret = kvp_commit(c, id, 16);
	CHECK(ret == -ESTALE && strstr(kvp_last_error(c), "released (rank 1's "
				       "client died) before every rank committed; "
				       "nothing changed; prepare again"),
	      "rank 0's commit after rank 1 died: %d '%s'", ret, kvp_last_error(c));
	ret = kvp_release(c, id);
	CHECK(ret == 0, "rank 0's release of the ended lease: %d", ret);
	CHECK(hist_len(c, USER) == 32, "the history has %" PRIu64 " tokens, want "
	      "32 (unchanged)", hist_len(c, USER));
	CHECK(!h_check_accounting(c, &st), "frames or leases leaked after the death");
	CHECK(st.leases == 0, "%" PRIu64 " leases left, want 0", (uint64_t)st.leases);
}

int main(int argc, char **argv)
{
	struct h_daemon d = { 0 }, one = { 0 };
	struct kvp_client *c = NULL;
	struct kvp_connect_opts o = { .name = "rank0" };
	char err[KVP_ERRLEN], disk[256];
	uint64_t t0 = h_now_ms();
	pid_t child;

	h_init(argc, argv, "test_tp_group");
	g_cmd = h_shared_zalloc(sizeof(*g_cmd));
	g_r0_lease = h_shared_zalloc(sizeof(*g_r0_lease));
	if (!g_cmd || !g_r0_lease || h_chan_open(&g_ch))
		return H_FAIL;
	if (h_daemon_dir(&d, 0))
		return H_FAIL;
	snprintf(disk, sizeof(disk), "--disk_dir=%s", d.dir);
	if (h_daemon_start(&d, 10000, "--devices=0,1", "--tp=2", "--device_mem=16K",
			   "--host_mem=64K", disk, "--disk_size=1M", (char *)NULL) ||
	    h_daemon_up(&one, (char *)NULL))
		return H_FAIL;
	g_sock = d.sock;
	o.socket = d.sock;
	if (kvp_connect(&c, &o, err, sizeof(err))) {
		h_fail("rank 0 attach: %s", err);
		return h_daemon_end(&d, 1);
	}
	child = h_fork(rank1, NULL);
	h_chan_parent_side(&g_ch);
	if (child < 0)
		return h_daemon_end(&d, 1);

	check_attach(c, &one);
	step_refusals(c);
	step_roundtrip(c);
	step_release(c);
	step_kill_owner(c);
	step_kill(c, child);

	kvp_close(c);
	h_daemon_finish(&one, 0, t0);
	return h_daemon_finish(&d, g_bad, t0);
}
