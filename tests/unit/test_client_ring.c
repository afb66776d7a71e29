/* SPDX-License-Identifier: MIT */
/*
 * test_client_ring.c - libkvpool against a fake kvpoold in the same process
 * (fake_kvpoold.h). What is proven:
 *  - attach maps rings and tier, honours $KVPOOL_SOCKET, and refuses what it
 *    must (no listener, daemon refusal with its text, unsealed memfd, header
 *    past the fd, other protocol version, bad options) with messages naming
 *    the socket; descriptors beyond the two expected are closed;
 *  - synchronous calls carry results and the daemon's error text, and the
 *    last error is "" after a success;
 *  - async completions keep their tags in any completion order; -EBUSY at
 *    sq_entries in flight; free-running indices wrap past UINT32_MAX;
 *  - the daemon is rung only when it set NEED_WAKEUP; a sleeping daemon and a
 *    sleeping client are woken;
 *  - forged tags, CQEs for unpublished SQEs, a broken cq_tail and results
 *    past their range are -EPROTO (sticky); a hang-up ends a wait with
 *    -ECONNRESET;
 *  - a long page table fits the sync range where an async slice gets
 *    -EMSGSIZE; kvp_append writes exactly the leased slots and checks ranges.
 */
#define _GNU_SOURCE
#include "fake_kvpoold.h"

static void test_connect_maps_rings_and_device_tier(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = fake_attach(f, NULL);
	unsigned char *d = kvp_device_base(c);

	(void)state;
	assert_int_equal(kvp_client_id(c), 7);
	assert_true(kvp_client_is_admin(c));
	assert_memory_equal(kvp_client_layout(c), &f->layout, sizeof(f->layout));
	assert_string_equal(kvp_last_error(c), "");
	assert_non_null(d);
	((unsigned char *)f->dev)[f->dev_bytes - 1] = 0xab;
	assert_int_equal(d[f->dev_bytes - 1], 0xab);
	/* 256 KiB arena, 64 slots: 2 KiB slices below, the upper half synced. */
	assert_int_equal(c->sq_entries, 64);
	assert_int_equal(c->slice_bytes, 2048);
	assert_int_equal(c->sync_off, 128 << 10);
	assert_int_equal(c->sync_bytes, 128 << 10);
	kvp_close(c);
	fake_free(f);
}

static void test_connect_honours_KVPOOL_SOCKET(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = NULL;
	struct kvp_user_info ui;
	char err[KVP_ERRLEN];

	(void)state;
	fake_listen(f);
	setenv("KVPOOL_SOCKET", f->path, 1);
	assert_int_equal(kvp_connect(&c, NULL, err, sizeof(err)), 0);
	unsetenv("KVPOOL_SOCKET");
	assert_int_equal(kvp_info(c, 2, &ui), 0);
	assert_int_equal(ui.len, 20);
	kvp_close(c);
	fake_free(f);
}

static void test_connect_without_listener_names_socket_and_fix(void **state)
{
	struct fake *f = fake_new();
	struct kvp_connect_opts o = { .socket = f->path };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN], want[512];
	int fd;

	(void)state;
	assert_int_equal(kvp_connect(&c, &o, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "no kvpoold listening at %s (connect: No such "
		 "file or directory); start it with kvpoold --socket=%s", f->path,
		 f->path);
	assert_string_equal(err, want);

	/* A socket file nobody listens on any more. */
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(fd);
	assert_int_equal(kvp_connect(&c, &o, err, sizeof(err)), -ECONNREFUSED);
	assert_non_null(strstr(err, "kvpoold --socket="));
	assert_null(c);
	f->serve = 0;
	fake_free(f);
}

/* Attaching to f is refused with rc and an error text containing want;
 * frees f. */
static void assert_attach_refused(struct fake *f, int rc, const char *want)
{
	char err[KVP_ERRLEN];

	assert_int_equal(fake_attach_fails(f, err), rc);
	assert_non_null(strstr(err, want));
	fake_free(f);
}

static void test_connect_refusal_returns_daemon_status_and_text(void **state)
{
	struct fake *f = fake_new();
	char err[KVP_ERRLEN];

	(void)state;
	f->status = -EACCES;
	f->status_msg = "uid 1001 is not in allow_uids of kvpoold";
	assert_int_equal(fake_attach_fails(f, err), -EACCES);
	assert_string_equal(err, "uid 1001 is not in allow_uids of kvpoold");
	fake_free(f);
}

static void test_connect_refuses_unsealed_memfd(void **state)
{
	struct fake *f = fake_new();

	(void)state;
	f->no_seal = 1;
	assert_attach_refused(f, -EPROTO, "not sealed against resizing");
}

static void test_connect_refuses_header_past_fd_size(void **state)
{
	struct fake *f = fake_new();

	(void)state;
	f->bad_hdr = 1;
	assert_attach_refused(f, -EPROTO, "does not fit");
}

static void test_connect_refuses_other_protocol_version(void **state)
{
	struct fake *f = fake_new();
	char want[64];

	(void)state;
	f->version = KVP_PROTO_VERSION + 1;
	snprintf(want, sizeof(want), "speaks wire protocol %u", KVP_PROTO_VERSION + 1);
	assert_attach_refused(f, -EPROTO, want);
}

static void test_connect_rejects_bad_options_before_connecting(void **state)
{
	struct kvp_connect_opts o = { .socket = "/nonexistent/s", .sq_entries = 100 };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN];

	(void)state;
	assert_int_equal(kvp_connect(&c, &o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "power of two"));
	o.sq_entries = 65536;
	o.arena_bytes = 64 << 10;
	assert_int_equal(kvp_connect(&c, &o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "too small"));
	assert_null(c);
}

static void test_connect_closes_extra_descriptors(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c;
	char b;

	(void)state;
	f->extra_fd = 1;
	f->serve = 0;
	c = fake_attach(f, NULL);
	/* The pipe's write end went over twice as extras; the fake closed its
	 * own, so EOF means the client closed both copies it received. */
	assert_int_equal(read(f->extra_fd, &b, 1), 0);
	close(f->extra_fd);
	kvp_close(c);
	fake_free(f);
}

static void test_sync_calls_carry_results(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = fake_attach(f, NULL);
	struct kvp_user_info ui, rows[10];
	struct kvp_stats st;
	struct kvp_lease l;
	uint64_t cursor = 0, next, seen = 0;
	int n;

	(void)state;
	assert_int_equal(kvp_info(c, 3, &ui), 0);
	assert_int_equal(ui.user, 3);
	assert_int_equal(ui.len, 30);
	assert_int_equal(kvp_prepare(c, 5, 0, 10, &l), 0);
	assert_int_equal(l.id, 1005);
	assert_int_equal(l.user, 5);
	assert_int_equal(l.n_new, 10);
	assert_int_equal(l.npages, 3);
	assert_int_equal(l.last_page_len, 2);
	assert_int_equal(l.indices[0], 3);
	assert_int_equal(l.indices[1], 10);
	assert_int_equal(l.indices[2], 17);
	assert_int_equal(kvp_commit(c, l.id, 10), 10);
	assert_int_equal(kvp_release(c, l.id), 0);
	assert_int_equal(kvp_offload(c, 5), 5);
	assert_int_equal(kvp_offload_all(c), 50);
	assert_int_equal(kvp_evict(c, 5, KVP_SEL_DEVICE), KVP_SEL_DEVICE);
	assert_int_equal(kvp_evict_all(c, KVP_SEL_ALL), 100 + KVP_SEL_ALL);
	assert_int_equal(kvp_evict(c, 5, 0), -EINVAL);
	assert_non_null(strstr(kvp_last_error(c), "not a set of"));
	assert_int_equal(kvp_stats(c, 1, &st), 0);
	assert_int_equal(st.tenants, KVP_SQE_ALL); /* the fake echoes the flags */
	assert_int_equal(kvp_stats(c, 0, &st), 0);
	assert_int_equal(st.tenants, 0);
	do {
		n = kvp_users(c, cursor, rows, 10, &next);
		assert_true(n >= 0 && n <= 10);
		for (int i = 0; i < n; i++)
			assert_int_equal(rows[i].user, seen++);
		cursor = next;
	} while (next);
	assert_int_equal(seen, 25);
	assert_string_equal(kvp_last_error(c), "");
	kvp_close(c);
	fake_free(f);
}

static void test_sync_error_carries_daemon_text(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = fake_attach(f, NULL);
	struct kvp_client_info ci[4];
	struct kvp_user_info ui;
	struct kvp_lease l;
	uint64_t next;

	(void)state;
	assert_int_equal(kvp_prepare(c, 666, 0, 4, &l), -EINVAL);
	assert_string_equal(kvp_last_error(c),
			    "The input sequence has missing tokens from 10 to 19 "
			    "(both inclusive). For user 666 the cache holds tokens "
			    "[0, 10): send the input from position 10");
	/* A lease this client does not hold never reaches the daemon. */
	assert_int_equal(kvp_commit(c, 0, 1), -ESTALE);
	assert_non_null(strstr(kvp_last_error(c), "commit: lease 0 is not held by "
			       "this client"));
	assert_int_equal(kvp_clients(c, 0, ci, 4, &next), -EPERM);
	assert_string_equal(kvp_last_error(c), "op 9: needs an admin uid");
	assert_int_equal(kvp_info(c, 1, &ui), 0);
	assert_string_equal(kvp_last_error(c), "");
	kvp_close(c);
	fake_free(f);
}

/* Reap until n completions are in out. */
static void reap_all(struct kvp_client *c, struct kvp_completion *out, uint32_t n)
{
	uint32_t got = 0;

	while (got < n) {
		int r = kvp_reap(c, out + got, n - got, 1);

		if (r < 0)
			fail_msg("kvp_reap: %d %s", r, kvp_last_error(c));
		got += (uint32_t)r;
	}
}

static void test_async_tags_survive_out_of_order_completion(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c;
	struct kvp_completion out[40];
	struct kvp_lease l7, l8, l9;
	int seen[40] = { 0 };

	(void)state;
	f->reverse = 1;
	c = fake_attach(f, NULL);
	/* Leases to end: the fake grants lease 1000 + user. */
	assert_int_equal(kvp_prepare(c, 7, 0, 4, &l7), 0);
	assert_int_equal(kvp_prepare(c, 8, 0, 4, &l8), 0);
	assert_int_equal(kvp_prepare(c, 9, 0, 4, &l9), 0);
	for (uint32_t i = 0; i < 32; i++)
		assert_int_equal(kvp_queue_prepare(c, 100 + i, 0, 4, 5000 + i), 0);
	assert_int_equal(kvp_queue_info(c, 4, 6000), 0);
	assert_int_equal(kvp_queue_commit(c, l7.id, 3, 1, 6001), 0);
	assert_int_equal(kvp_queue_commit(c, l8.id, 3, 0, 6002), 0);
	assert_int_equal(kvp_queue_release(c, l9.id, 6003), 0);
	/* Queued commits and releases end the leases for writes at once. */
	assert_int_equal(kvp_queue_commit(c, l8.id, 3, 0, 6004), -ESTALE);
	assert_int_equal(kvp_append(c, &l9, 0, 1, out), -ESTALE);
	assert_int_equal(kvp_submit(c), 36);
	reap_all(c, out, 36);
	for (uint32_t i = 0; i < 36; i++) {
		struct kvp_completion *o = &out[i];

		assert_null(o->error);
		assert_int_equal(o->res >= 0, 1);
		if (o->tag >= 6000) {
			seen[32 + o->tag - 6000]++;
			switch (o->tag) {
			case 6000:
				assert_int_equal(o->op, KVP_ASYNC_INFO);
				assert_int_equal(o->info.len, 40);
				break;
			case 6001:
				assert_int_equal(o->op, KVP_ASYNC_COMMIT);
				assert_int_equal(o->res, 1003); /* RELEASE flag sent */
				break;
			case 6002:
				assert_int_equal(o->res, 3);
				break;
			default:
				assert_int_equal(o->op, KVP_ASYNC_RELEASE);
			}
			continue;
		}
		assert_int_equal(o->op, KVP_ASYNC_PREPARE);
		assert_int_equal(o->lease.user - 100, o->tag - 5000);
		assert_int_equal(o->lease.id, 1000 + o->lease.user);
		assert_int_equal(o->lease.npages, 1);
		seen[o->tag - 5000]++;
	}
	for (int i = 0; i < 36; i++)
		assert_int_equal(seen[i], 1);
	assert_int_equal(c->inflight, 0);
	/* Reaped: 7 and 9 are gone, 8 is committed; the 32 new ones are open. */
	assert_null(kvpc_lease_find(c, l7.id));
	assert_null(kvpc_lease_find(c, l9.id));
	assert_int_equal(kvpc_lease_find(c, l8.id)->state, KVPC_LEASE_CLOSED);
	assert_int_equal(kvpc_lease_count(c), 33);
	kvp_close(c);
	fake_free(f);
}

static void test_async_error_points_into_arena(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = fake_attach(f, NULL);
	struct kvp_completion out[2];
	unsigned char kv[128] = { 5 };
	struct kvp_lease l;

	(void)state;
	assert_int_equal(kvp_prepare(c, 5, 0, 4, &l), 0);
	assert_int_equal(kvp_queue_prepare(c, 666, 0, 4, 1), 0);
	assert_int_equal(kvp_queue_commit(c, l.id, 999, 0, 2), 0);
	assert_int_equal(kvp_submit(c), 2);
	reap_all(c, out, 2);
	for (int i = 0; i < 2; i++) {
		struct kvp_completion *o = &out[i];

		assert_true((const unsigned char *)o->error >= c->arena &&
			    (const unsigned char *)o->error < c->arena + c->sync_off);
		if (o->tag == 1) {
			assert_int_equal(o->res, -EINVAL);
			assert_string_equal(o->error, "The input sequence has "
					    "missing tokens from 10 to 19 (both "
					    "inclusive). For user 666 the cache "
					    "holds tokens [0, 10): send the input "
					    "from position 10");
			assert_null(o->lease.indices);
		} else {
			assert_int_equal(o->res, -EINVAL);
			assert_string_equal(o->error, "lease 1005: commit of 999 tokens "
					    "but only 4 were prepared");
		}
	}
	assert_string_equal(kvp_last_error(c), "");
	/* The refused commit gave nothing back: the lease is open again. */
	assert_int_equal(kvp_append(c, &l, 0, 1, kv), 0);
	kvp_close(c);
	fake_free(f);
}

static void test_busy_at_sq_entries_in_flight(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = fake_attach(f, NULL);
	struct kvp_completion out[64];
	struct kvp_user_info ui;

	(void)state;
	for (uint32_t i = 0; i < 64; i++)
		assert_int_equal(kvp_queue_info(c, i, i), 0);
	assert_int_equal(kvp_queue_info(c, 64, 64), -EBUSY);
	assert_string_equal(kvp_last_error(c),
			    "64 operations in flight; reap completions first");
	assert_int_equal(kvp_info(c, 1, &ui), -EBUSY);
	assert_non_null(strstr(kvp_last_error(c), "asynchronous operations in flight"));
	assert_int_equal(kvp_reap(c, out, 64, 1), -EINVAL);
	assert_non_null(strstr(kvp_last_error(c), "kvp_submit first"));
	assert_int_equal(kvp_reap(c, out, 1, 2), -EINVAL);
	assert_int_equal(kvp_submit(c), 64);
	assert_int_equal(kvp_submit(c), 0);
	reap_all(c, out, 64);
	for (uint32_t i = 0; i < 64; i++)
		assert_int_equal(out[i].info.user, out[i].tag);
	assert_int_equal(kvp_reap(c, out, 64, 0), 0);
	assert_int_equal(kvp_info(c, 1, &ui), 0);
	kvp_close(c);
	fake_free(f);
}

static void test_indices_wrap_past_uint32_max(void **state)
{
	struct kvp_connect_opts o = { .sq_entries = 8 };
	struct fake *f = fake_new();
	struct kvp_completion out[8];
	struct kvp_user_info ui;
	struct kvp_client *c;

	(void)state;
	f->start_index = UINT32_MAX - 40;
	c = fake_attach(f, &o);
	assert_int_equal(c->lanes[0].sq_tail, UINT32_MAX - 40);
	for (uint64_t i = 0; i < 100; i++) {
		assert_int_equal(kvp_info(c, i, &ui), 0);
		assert_int_equal(ui.len, i * 10);
	}
	for (uint32_t r = 0; r < 50; r++) {
		for (uint32_t i = 0; i < 8; i++)
			assert_int_equal(kvp_queue_prepare(c, r * 8 + i, 0, 5, r * 8 + i), 0);
		assert_int_equal(kvp_submit(c), 8);
		reap_all(c, out, 8);
		for (uint32_t i = 0; i < 8; i++) {
			assert_int_equal(out[i].res, 0);
			assert_int_equal(out[i].lease.user, out[i].tag);
			assert_int_equal(out[i].lease.npages, 2);
		}
	}
	/* 100 calls and 50 batches (one BATCH entry of 8 each) from
	 * UINT32_MAX - 40: both indices wrapped to 109. */
	assert_int_equal(c->lanes[0].sq_tail, 109);
	assert_int_equal(c->lanes[0].cq_head, 109);
	assert_int_equal(__atomic_load_n(&c->lanes[0].ctl->cq_head, __ATOMIC_ACQUIRE), 109);
	assert_int_equal(f->batches, 50);
	kvp_close(c);
	fake_free(f);
}

/* Daemon side by hand: answer every published SQE. */
static uint32_t fake_answer_all(struct fake *f)
{
	struct kvp_sqe s;
	struct kvp_cqe q;
	uint32_t n = 0;

	while (fake_take(f, &s)) {
		fake_exec(f, &s, &q);
		fake_post(f, &q, 1);
		n++;
	}
	return n;
}

/*
 * BATCH entries (proto.h, BATCH; batch_wire.c): a lane's queued operations
 * go out as one entry, its completion may come in parts, the records are
 * reused round after round, and nothing stays owed.
 */
static void test_batch_in_parts_round_after_round(void **state)
{
	struct kvp_connect_opts o = { .sq_entries = 16 };
	struct fake *f = fake_new();
	struct kvp_completion out[16];
	struct kvp_user_info ui;
	struct kvp_client *c;

	(void)state;
	f->split = 1;
	f->reverse = 1;
	c = fake_attach(f, &o);
	for (uint32_t r = 0; r < 40; r++) {
		uint32_t n = 2 + r % 15, seen = 0;

		for (uint32_t i = 0; i < n; i++)
			assert_int_equal(kvp_queue_prepare(c, 100 + i, 0, 5, i), 0);
		assert_int_equal(kvp_submit(c), (int)n);
		reap_all(c, out, n);
		for (uint32_t i = 0; i < n; i++) {
			assert_int_equal(out[i].res, 0);
			assert_int_equal(out[i].lease.user, 100 + out[i].tag);
			seen |= 1u << out[i].tag;
		}
		assert_int_equal(seen, (1u << n) - 1);
	}
	assert_int_equal(f->batches, 40);
	assert_int_equal(c->lanes[0].cq_owed, 0);
	assert_int_equal(c->lanes[0].bat_head, c->lanes[0].bat_tail);
	assert_int_equal(c->lanes[0].rec_head, c->lanes[0].rec_tail);
	/* A lone operation goes out plain. */
	assert_int_equal(kvp_queue_info(c, 3, 9), 0);
	assert_int_equal(kvp_submit(c), 1);
	reap_all(c, out, 1);
	assert_int_equal(out[0].info.len, 30);
	assert_int_equal(f->batches, 40);
	assert_int_equal(kvp_info(c, 4, &ui), 0);
	kvp_close(c);
	fake_free(f);
}

/* A batch completion the client cannot believe breaks it (-EPROTO). */
static void forged_batch(int how)
{
	struct fake *f = fake_new();
	struct kvp_completion out[4];
	struct kvp_client *c;
	struct kvp_sqe s;
	struct kvp_cqe q[2];
	int ret;

	f->serve = 0;
	c = fake_attach(f, NULL);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(kvp_queue_prepare(c, 100 + i, 0, 5, i), 0);
	assert_int_equal(kvp_submit(c), 3);
	assert_int_equal(fake_take(f, &s), 1);
	assert_int_equal(s.opcode, KVP_OP_BATCH);
	assert_int_equal(fake_batch(f, &s, q), 1);
	switch (how) {
	case 0: q[0].res = 4; q[0].out_bytes = 4 * 32; break; /* more items */
	case 1: q[0].tag ^= 1; break;                      /* another batch */
	case 2: /* an item it did not carry */
		((struct kvp_cqe *)(f->arena + s.out_off))[1].tag += 1;
		break;
	case 3: q[0].val1 = 0; break;                      /* never final */
	case 4: q[1] = q[0]; break;                        /* twice */
	}
	fake_post(f, q, how == 4 ? 2 : 1);
	ret = kvp_reap(c, out, 4, 3);
	if (how == 4 && ret == 3)
		ret = kvp_reap(c, out, 4, 1);
	assert_int_equal(ret, -EPROTO);
	assert_non_null(strstr(kvp_last_error(c), "batch completion"));
	kvp_close(c);
	fake_free(f);
}

static void test_forged_batch_completions_are_eproto(void **state)
{
	(void)state;
	for (int how = 0; how < 5; how++)
		forged_batch(how);
}

static void test_daemon_rung_only_when_it_asked(void **state)
{
	struct fake *f = fake_new();
	struct kvp_completion out[2];
	struct kvp_client *c;
	uint32_t bell;

	(void)state;
	f->serve = 0;
	c = fake_attach(f, NULL);
	bell = f->ctl->sq_doorbell;
	assert_int_equal(kvp_queue_info(c, 1, 1), 0);
	assert_int_equal(kvp_submit(c), 1);
	assert_int_equal(f->ctl->sq_doorbell, bell); /* daemon busy: no syscall */
	f->ctl->sq_flags = KVP_RING_NEED_WAKEUP;
	assert_int_equal(kvp_submit(c), 0);
	assert_int_equal(f->ctl->sq_doorbell, bell); /* nothing new: no ring */
	assert_int_equal(kvp_queue_info(c, 2, 2), 0);
	assert_int_equal(kvp_submit(c), 1);
	assert_int_equal(f->ctl->sq_doorbell, bell + 1);
	assert_int_equal(fake_answer_all(f), 2);
	reap_all(c, out, 2);
	kvp_close(c);
	fake_free(f);
}

static void test_sleeping_daemon_is_woken(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c;
	struct kvp_user_info ui;

	(void)state;
	f->sleepy = 1;
	c = fake_attach(f, NULL);
	for (uint64_t i = 0; i < 200; i++) {
		assert_int_equal(kvp_info(c, i, &ui), 0);
		assert_int_equal(ui.user, i);
		if (i % 20 == 0)
			usleep(2000); /* let it fall asleep */
	}
	assert_true(__atomic_load_n(&f->wakes, __ATOMIC_RELAXED) > 0);
	kvp_close(c);
	fake_free(f);
}

struct later {
	struct fake *f;
	int hangup;
	uint32_t waiters;
	long woken;
};

static void *answer_later(void *arg)
{
	struct later *l = arg;
	struct kvp_sqe s;
	struct kvp_cqe q;

	usleep(50000);
	if (l->hangup) {
		shutdown(l->f->conn, SHUT_RDWR);
		return NULL;
	}
	l->waiters = __atomic_load_n(&l->f->ctl->cq_waiters, __ATOMIC_ACQUIRE);
	assert_int_equal(fake_take(l->f, &s), 1);
	fake_exec(l->f, &s, &q);
	l->f->cqes[l->f->cq_tail++ & (l->f->cq_entries_now - 1)] = q;
	__atomic_store_n(&l->f->ctl->cq_tail, l->f->cq_tail, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	__atomic_fetch_add(&l->f->ctl->cq_seq, 1, __ATOMIC_RELEASE);
	l->woken = futex(&l->f->ctl->cq_seq, FUTEX_WAKE, 1, NULL);
	return NULL;
}

/* c queues info(9) with tag 99 and waits for it in kvp_reap while
 * answer_later(l) answers (or hangs up) from a thread. Returns what
 * kvp_reap returned, once the thread is joined. */
static int reap_answered_later(struct kvp_client *c, struct later *l,
			       struct kvp_completion *out)
{
	pthread_t t;
	int rc;

	assert_int_equal(kvp_queue_info(c, 9, 99), 0);
	assert_int_equal(kvp_submit(c), 1);
	assert_int_equal(pthread_create(&t, NULL, answer_later, l), 0);
	rc = kvp_reap(c, out, 1, 1);
	pthread_join(t, NULL);
	return rc;
}

static void test_sleeping_client_is_woken(void **state)
{
	struct fake *f = fake_new();
	struct later l = { .f = f };
	struct kvp_completion out;
	struct kvp_client *c;

	(void)state;
	f->serve = 0;
	c = fake_attach(f, NULL);
	assert_int_equal(reap_answered_later(c, &l, &out), 1);
	assert_int_equal(out.tag, 99);
	assert_int_equal(out.info.len, 90);
	assert_int_equal(l.waiters, 1);  /* it slept with cq_waiters set */
	assert_int_equal(l.woken, 1);    /* on cq_seq, and was woken there */
	assert_int_equal(c->lanes[0].ctl->cq_waiters, 0);
	kvp_close(c);
	fake_free(f);
}

static void test_daemon_hangup_ends_wait(void **state)
{
	struct fake *f = fake_new();
	struct later l = { .f = f, .hangup = 1 };
	struct kvp_completion out;
	struct kvp_user_info ui;
	struct kvp_client *c;
	char want[KVP_ERRLEN];

	(void)state;
	f->serve = 0;
	c = fake_attach(f, NULL);
	assert_int_equal(reap_answered_later(c, &l, &out), -ECONNRESET);
	snprintf(want, sizeof(want), "kvpoold at %s went away; the leases of this "
		 "client are gone; reconnect with kvp_connect()", f->path);
	assert_string_equal(kvp_last_error(c), want);
	assert_int_equal(kvp_info(c, 1, &ui), -ECONNRESET);
	assert_int_equal(kvp_queue_info(c, 1, 1), -ECONNRESET);
	kvp_close(c);
	fake_free(f);
}

/* Publish one CQE for the next SQE, bent by bend(). */
static int reap_bent(void (*bend)(struct fake *, struct kvp_client *,
				  struct kvp_cqe *), int submit)
{
	struct fake *f = fake_new();
	struct kvp_completion out;
	struct kvp_client *c;
	struct kvp_user_info ui;
	struct kvp_sqe s;
	struct kvp_cqe q;
	int ret;

	f->serve = 0;
	c = fake_attach(f, NULL);
	assert_int_equal(kvp_queue_info(c, 3, 33), 0);
	if (submit) {
		assert_int_equal(kvp_submit(c), 1);
		assert_int_equal(fake_take(f, &s), 1);
	} else {
		s = c->lanes[0].sqes[c->lanes[0].sq_published & c->sq_mask]; /* peeked, not published */
	}
	fake_exec(f, &s, &q);
	bend(f, c, &q);
	fake_post(f, &q, 1);
	ret = kvp_reap(c, &out, 1, 0);
	if (ret == -EPROTO) /* broken for good */
		assert_int_equal(kvp_info(c, 1, &ui), -EPROTO);
	kvp_close(c);
	fake_free(f);
	return ret;
}

static void bend_generation(struct fake *f, struct kvp_client *c, struct kvp_cqe *q)
{
	q->tag ^= 1ull << 32;
}

static void bend_slot(struct fake *f, struct kvp_client *c, struct kvp_cqe *q)
{
	q->tag = (q->tag & ~0xffffffffull) | c->sq_entries;
}

static void bend_out_bytes(struct fake *f, struct kvp_client *c, struct kvp_cqe *q)
{
	q->out_bytes = c->slice_bytes + 1;
}

static void bend_cq_tail(struct fake *f, struct kvp_client *c, struct kvp_cqe *q)
{
	f->cq_tail += c->cq_entries + 1;
}

static void bend_nothing(struct fake *f, struct kvp_client *c, struct kvp_cqe *q)
{
}

/* One completion more than entries were published. */
static void bend_extra(struct fake *f, struct kvp_client *c, struct kvp_cqe *q)
{
	f->cq_tail += 1;
}

static void test_foreign_completions_are_eproto(void **state)
{
	(void)state;
	assert_int_equal(reap_bent(bend_nothing, 1), 1);
	assert_int_equal(reap_bent(bend_generation, 1), -EPROTO);
	assert_int_equal(reap_bent(bend_slot, 1), -EPROTO);
	assert_int_equal(reap_bent(bend_out_bytes, 1), -EPROTO);
	assert_int_equal(reap_bent(bend_cq_tail, 1), -EPROTO);
	assert_int_equal(reap_bent(bend_extra, 1), -EPROTO);
	/* A completion for an SQE the client never published: a lane that
	 * owes nothing is not read at all (ring.c: its worker's line is left
	 * alone), so it is not seen, let alone taken. */
	assert_int_equal(reap_bent(bend_nothing, 0), 0);
}

static void test_long_page_table_fits_sync_range_not_slice(void **state)
{
	struct fake *f = fake_new();
	struct kvp_completion out;
	struct kvp_client *c;
	struct kvp_lease l;

	(void)state;
	/* 2 KiB slices hold (2048 - 40) / 4 = 502 pages; ask for 601. */
	f->hist_len = 4 * 600;
	c = fake_attach(f, NULL);
	assert_int_equal(kvp_queue_prepare(c, 1, 2400, 4, 1), 0);
	assert_int_equal(kvp_submit(c), 1);
	reap_all(c, &out, 1);
	assert_int_equal(out.res, -EMSGSIZE);
	assert_non_null(strstr(out.error, "601 pages"));
	assert_int_equal(kvp_prepare(c, 1, 2400, 4, &l), 0);
	assert_int_equal(l.npages, 601);
	for (uint32_t i = 0; i < 601; i++)
		assert_int_equal(l.indices[i], (int32_t)((i * 7 + 3) % 64));
	kvp_close(c);
	fake_free(f);
}

static void test_append_writes_exactly_the_leased_slots(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c;
	struct kvp_slot slots[7];
	struct kvp_lease l, forged;
	unsigned char kv[7 * 128], back[7 * 128];
	int32_t table[4] = { 0 };
	size_t nonzero = 0;

	(void)state;
	f->hist_len = 6; /* the new tokens start at page 1, slot 2 */
	c = fake_attach(f, NULL);
	assert_int_equal(f->layout.token_bytes, 128);
	assert_int_equal(kvp_prepare(c, 1, 6, 7, &l), 0);
	assert_int_equal(l.npages, 4);
	for (size_t i = 0; i < sizeof(kv); i++)
		kv[i] = (unsigned char)(1 + i % 251);
	assert_int_equal(kvp_append(c, &l, 0, 3, kv), 0);
	assert_int_equal(kvp_append(c, &l, 3, 4, kv + 3 * 128), 0);
	assert_string_equal(kvp_last_error(c), "");
	for (uint32_t i = 0; i < 7; i++) {
		uint32_t q = 6 + i;

		slots[i].frame = ((q / 4) * 7 + 3) % 64;
		slots[i].slot = q % 4;
	}
	kvp_read_cpu(&f->layout, f->dev, slots, 7, back);
	assert_memory_equal(back, kv, sizeof(kv));
	for (size_t i = 0; i < f->dev_bytes; i++)
		nonzero += ((unsigned char *)f->dev)[i] != 0;
	assert_int_equal(nonzero, sizeof(kv)); /* and nothing else */

	assert_int_equal(kvp_append(c, &l, 5, 3, kv), -EINVAL);
	assert_non_null(strstr(kvp_last_error(c), "[5, 8) are outside the 7 new tokens"));
	assert_int_equal(kvp_append(c, &l, 8, 0, kv), -EINVAL);
	assert_int_equal(kvp_append(c, &l, 7, 0, kv), 0);
	/* Only the id of the caller's struct counts: a forged page table or
	 * n_new changes nothing, a forged id is not held. */
	forged = l;
	forged.indices = table;
	forged.n_new = 100;
	forged.len = 0;
	assert_int_equal(kvp_append(c, &forged, 0, 1, kv), 0);
	kvp_read_cpu(&f->layout, f->dev, slots, 1, back);
	assert_memory_equal(back, kv, 128);
	assert_int_equal(kvp_append(c, &forged, 7, 1, kv), -EINVAL);
	forged.id = l.id + 1;
	assert_int_equal(kvp_append(c, &forged, 0, 1, kv), -ESTALE);
	assert_non_null(strstr(kvp_last_error(c), "is not held by this client"));
	/* Committed: no more writes, no second commit; released: unknown. */
	assert_int_equal(kvp_commit(c, l.id, 7), 7); /* the fake answers n */
	assert_int_equal(kvp_append(c, &l, 0, 1, kv), -ESTALE);
	assert_non_null(strstr(kvp_last_error(c), "has committed 7 of its 7 new tokens"));
	assert_int_equal(kvp_commit(c, l.id, 7), -ESTALE);
	assert_int_equal(kvp_release(c, l.id), 0);
	assert_int_equal(kvp_append(c, &l, 0, 1, kv), -ESTALE);
	assert_non_null(strstr(kvp_last_error(c), "is not held by this client"));
	kvp_close(c);
	fake_free(f);
}

/* kvp_append_layer_async, layer by layer, writes exactly what one
 * kvp_append of all layers would: the same bytes in the same slots, and
 * nothing else. */
static void test_append_layer_by_layer_equals_one_append(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c;
	struct kvp_slot slots[7];
	struct kvp_lease l;
	unsigned char kv[7 * 128], back[7 * 128], k[7 * 64], v[7 * 64];
	size_t nonzero = 0;
	uint64_t row;

	(void)state;
	f->hist_len = 6;
	c = fake_attach(f, NULL);
	row = f->layout.token_stride;
	assert_int_equal(f->layout.token_bytes, 2 * f->layout.layers * row);
	assert_true(row * 7 <= sizeof(k));
	assert_int_equal(kvp_prepare(c, 1, 6, 7, &l), 0);
	for (size_t i = 0; i < sizeof(kv); i++)
		kv[i] = (unsigned char)(1 + i % 253);
	for (uint32_t layer = 0; layer < f->layout.layers; layer++) {
		for (uint32_t t = 0; t < 7; t++) {
			const unsigned char *tok = kv + t * f->layout.token_bytes +
						   layer * 2 * row;

			memcpy(k + t * row, tok, row);
			memcpy(v + t * row, tok + row, row);
		}
		assert_int_equal(kvp_append_layer_async(c, &l, layer, 0, 7, k, v, NULL), 0);
	}
	for (uint32_t i = 0; i < 7; i++) {
		uint32_t q = 6 + i;

		slots[i].frame = ((q / 4) * 7 + 3) % 64;
		slots[i].slot = q % 4;
	}
	kvp_read_cpu(&f->layout, f->dev, slots, 7, back);
	assert_memory_equal(back, kv, sizeof(kv));
	for (size_t i = 0; i < f->dev_bytes; i++)
		nonzero += ((unsigned char *)f->dev)[i] != 0;
	assert_int_equal(nonzero, sizeof(kv));
	assert_int_equal(kvp_append_layer_async(c, &l, f->layout.layers, 0, 1, k, v,
						NULL), -EINVAL);
	assert_non_null(strstr(kvp_last_error(c), "layers"));
	assert_int_equal(kvp_append_layer_async(c, &l, 0, 6, 2, k, v, NULL), -EINVAL);
	assert_int_equal(kvp_commit(c, l.id, 7), 7); /* the fake answers n */
	assert_int_equal(kvp_append_layer_async(c, &l, 0, 0, 1, k, v, NULL), -ESTALE);
	kvp_close(c);
	fake_free(f);
}

/* A refused async release leaves the lease as it was: a committed one stays
 * closed to writes (lease.c, STATES). */
static void test_refused_release_keeps_a_committed_lease_closed(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c = fake_attach(f, NULL);
	struct kvp_completion out[1];
	unsigned char kv[4 * 128] = { 1 }; /* 4 tokens of 128 bytes */
	struct kvp_lease l;

	(void)state;
	assert_int_equal(kvp_prepare(c, 13, 0, 4, &l), 0);
	assert_int_equal(kvp_append(c, &l, 0, 4, kv), 0);
	assert_int_equal(kvp_commit(c, l.id, 4), 4); /* the fake answers n */
	assert_int_equal(kvp_queue_release(c, l.id, 1), 0);
	assert_int_equal(kvpc_lease_find(c, l.id)->state, KVPC_LEASE_RELEASING);
	assert_int_equal(kvp_submit(c), 1);
	reap_all(c, out, 1);
	assert_int_equal(out[0].res, -EBUSY);
	assert_int_equal(kvpc_lease_find(c, l.id)->state, KVPC_LEASE_CLOSED);
	assert_int_equal(kvp_append(c, &l, 0, 1, kv), -ESTALE);
	assert_non_null(strstr(kvp_last_error(c), "has committed 4 of its 4"));
	kvp_close(c);
	fake_free(f);
}

static void test_append_refuses_frame_outside_tier(void **state)
{
	struct fake *f = fake_new();
	struct kvp_client *c;
	struct kvp_lease l;
	unsigned char kv[8 * 128] = { 1 };

	(void)state;
	f->bad_frame = 1;
	c = fake_attach(f, NULL);
	assert_int_equal(kvp_prepare(c, 1, 0, 8, &l), 0);
	assert_int_equal(kvp_append(c, &l, 0, 4, kv), 0);  /* page 0 is fine */
	assert_int_equal(kvp_append(c, &l, 4, 4, kv), -EINVAL);
	assert_non_null(strstr(kvp_last_error(c), "names frame 64, outside the 64 frames"));
	kvp_close(c);
	fake_free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connect_maps_rings_and_device_tier),
		cmocka_unit_test(test_connect_honours_KVPOOL_SOCKET),
		cmocka_unit_test(test_connect_without_listener_names_socket_and_fix),
		cmocka_unit_test(test_connect_refusal_returns_daemon_status_and_text),
		cmocka_unit_test(test_connect_refuses_unsealed_memfd),
		cmocka_unit_test(test_connect_refuses_header_past_fd_size),
		cmocka_unit_test(test_connect_refuses_other_protocol_version),
		cmocka_unit_test(test_connect_rejects_bad_options_before_connecting),
		cmocka_unit_test(test_connect_closes_extra_descriptors),
		cmocka_unit_test(test_sync_calls_carry_results),
		cmocka_unit_test(test_sync_error_carries_daemon_text),
		cmocka_unit_test(test_async_tags_survive_out_of_order_completion),
		cmocka_unit_test(test_batch_in_parts_round_after_round),
		cmocka_unit_test(test_forged_batch_completions_are_eproto),
		cmocka_unit_test(test_async_error_points_into_arena),
		cmocka_unit_test(test_busy_at_sq_entries_in_flight),
		cmocka_unit_test(test_indices_wrap_past_uint32_max),
		cmocka_unit_test(test_daemon_rung_only_when_it_asked),
		cmocka_unit_test(test_sleeping_daemon_is_woken),
		cmocka_unit_test(test_sleeping_client_is_woken),
		cmocka_unit_test(test_daemon_hangup_ends_wait),
		cmocka_unit_test(test_foreign_completions_are_eproto),
		cmocka_unit_test(test_long_page_table_fits_sync_range_not_slice),
		cmocka_unit_test(test_append_writes_exactly_the_leased_slots),
		cmocka_unit_test(test_refused_release_keeps_a_committed_lease_closed),
		cmocka_unit_test(test_append_layer_by_layer_equals_one_append),
		cmocka_unit_test(test_append_refuses_frame_outside_tier),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
