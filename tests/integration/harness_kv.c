/* SPDX-License-Identifier: MIT */
/*
 * harness_kv.c - what the integration tests do through libkvpool: the token
 * bytes every test writes, one append cycle, reading a user back through a
 * read-only lease, and checking the pool's frame accounting (harness.h).
 */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ token bytes */

void h_token_fill(const struct kvp_layout *l, uint64_t salt, uint64_t user,
		  uint64_t pos, void *out)
{
	uint8_t *p = out;
	uint64_t base = h_mix64(salt ^ h_mix64(user ^ h_mix64(pos)));
	uint64_t words = l->token_bytes / 4;
	for (uint64_t i = 0; i < words; i++) {
		/* Clearing bit 6 of every byte keeps every fp32, bf16, fp16
		 * and fp8_e4m3 value finite (no exponent is all ones). */
		uint32_t w = (uint32_t)h_mix64(base + i) & 0xbfbfbfbfu;
		memcpy(p + i * 4, &w, 4);
	}
	for (uint64_t i = words * 4; i < l->token_bytes; i++)
		p[i] = (uint8_t)(h_mix64(base + i) & 0xbf);
}

void h_tokens_fill(const struct kvp_layout *l, uint64_t salt, uint64_t user,
		   uint64_t pos, uint32_t n, void *out)
{
	for (uint32_t i = 0; i < n; i++)
		h_token_fill(l, salt, user, pos + i,
			     (uint8_t *)out + (uint64_t)i * l->token_bytes);
}

int h_connect(struct kvp_client **out, const char *sock, const char *name,
	      int timeout_ms, char *err, size_t errlen)
{
	struct kvp_connect_opts o = { .socket = sock, .name = name };
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	int rc;
	for (;;) {
		err[0] = 0;
		rc = kvp_connect(out, &o, err, errlen);
		if (rc == 0)
			return 0;
		if (rc != -ECONNREFUSED && rc != -ENOENT && rc != -EAGAIN &&
		    rc != -EINTR)
			return rc;
		if (h_now_ms() >= deadline)
			return rc;
		h_sleep_ms(5);
	}
}

struct kvp_client *h_connect_or_fail(const char *sock, const char *name,
				     int timeout_ms)
{
	struct kvp_client *c;
	char err[KVP_ERRLEN];
	int rc = h_connect(&c, sock, name, timeout_ms, err, sizeof(err));
	if (rc < 0) {
		h_fail("connect as %s: %d (%s)", name, rc, err);
		return NULL;
	}
	return c;
}

void h_token_ids(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 7u;
}

int h_fill_lease(struct kvp_client *c, const struct kvp_lease *l, uint64_t salt,
		 uint32_t n)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	void *kv = malloc((size_t)n * lay->token_bytes);
	int rc;

	if (!kv)
		return -ENOMEM;
	h_tokens_fill(lay, salt, 0, 0, n, kv);
	rc = kvp_append(c, l, 0, n, kv);
	free(kv);
	if (rc)
		h_fail("append: %s", kvp_last_error(c));
	return rc;
}

int h_same_bytes(struct kvp_client *c, const int32_t *indices, uint64_t salt,
		 uint64_t user, uint32_t n, const char *what)
{
	const struct kvp_layout *lay = kvp_client_layout(c);
	const uint32_t P = lay->page_tokens;
	struct kvp_slot *slots = calloc(n ? n : 1, sizeof(*slots));
	unsigned char *got = malloc((size_t)n * lay->token_bytes + 1);
	unsigned char *want = malloc((size_t)n * lay->token_bytes + 1);
	int bad = -1;

	if (!slots || !got || !want)
		goto out;
	for (uint32_t i = 0; i < n; i++)
		slots[i] = (struct kvp_slot){ (uint32_t)indices[i / P], i % P };
	kvp_read_cpu(lay, kvp_device_base(c), slots, n, got);
	h_tokens_fill(lay, salt, user, 0, n, want);
	bad = 0;
	for (uint32_t i = 0; i < n && !bad; i++)
		if (memcmp(got + (size_t)i * lay->token_bytes,
			   want + (size_t)i * lay->token_bytes, lay->token_bytes)) {
			h_fail("%s: token %" PRIu32 " differs from what was written",
			       what, i);
			bad = -1;
		}
out:
	free(slots);
	free(got);
	free(want);
	return bad;
}

int h_verify_user(struct kvp_client *c, uint64_t salt, uint64_t user,
		  uint64_t expect_start, uint64_t expect_len, uint64_t *len_out)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	struct kvp_user_info ui;
	int rc = kvp_info(c, user, &ui);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": info: %d (%s)", user, rc,
		       kvp_last_error(c));
		return -1;
	}
	if (len_out)
		*len_out = ui.len;
	if (expect_len != UINT64_MAX && ui.len != expect_len) {
		h_fail("user %" PRIu64 ": info len %" PRIu64 ", expected %" PRIu64
		       " (start %" PRIu64 ")", user, ui.len, expect_len, ui.start);
		return -1;
	}
	if (expect_start != UINT64_MAX && ui.len && ui.start != expect_start) {
		h_fail("user %" PRIu64 ": info start %" PRIu64 ", expected %" PRIu64,
		       user, ui.start, expect_start);
		return -1;
	}
	if (ui.len == 0)
		return 0;

	struct kvp_lease ls;
	uint64_t deadline = h_now_ms() + 5000;
	for (;;) {
		rc = kvp_prepare(c, user, ui.start + ui.len, 0, &ls);
		if (rc != -EBUSY || h_now_ms() > deadline)
			break;
		h_sleep_ms(1);
	}
	if (rc < 0) {
		h_fail("user %" PRIu64 ": read-only prepare at %" PRIu64 ": %d (%s)",
		       user, ui.start + ui.len, rc, kvp_last_error(c));
		return -1;
	}
	int ret = 0;
	uint32_t P = l->page_tokens;
	uint64_t want_pages = (ui.len + P - 1) / P;
	uint32_t want_last = (uint32_t)(ui.len - (want_pages - 1) * P);
	struct kvp_slot *slots = NULL;
	uint8_t *got = NULL, *want = NULL;
	if (ls.start != ui.start || ls.len != ui.len || ls.n_new != 0) {
		h_fail("user %" PRIu64 ": lease start %" PRIu64 " len %" PRIu64
		       " n_new %u, info said start %" PRIu64 " len %" PRIu64,
		       user, ls.start, ls.len, ls.n_new, ui.start, ui.len);
		ret = -1;
		goto out;
	}
	if (ls.npages != want_pages || ls.last_page_len != want_last) {
		h_fail("user %" PRIu64 ": page table of %u pages, last_page_len %u;"
		       " %" PRIu64 " tokens need %" PRIu64 " pages, last %u",
		       user, ls.npages, ls.last_page_len, ui.len, want_pages,
		       want_last);
		ret = -1;
		goto out;
	}
	slots = calloc(ui.len, sizeof(*slots));
	got = malloc(ui.len * l->token_bytes);
	want = malloc(ui.len * l->token_bytes);
	if (!slots || !got || !want) {
		h_fail("out of memory");
		ret = -1;
		goto out;
	}
	for (uint64_t i = 0; i < ui.len; i++) {
		int32_t f = ls.indices[i / P];
		if (f < 0) {
			h_fail("user %" PRIu64 ": page %" PRIu64 " has frame %d",
			       user, i / P, f);
			ret = -1;
			goto out;
		}
		slots[i].frame = (uint32_t)f;
		slots[i].slot = (uint32_t)(i % P);
	}
	kvp_read_cpu(l, kvp_device_base(c), slots, (uint32_t)ui.len, got);
	h_tokens_fill(l, salt, user, ui.start, (uint32_t)ui.len, want);
	for (uint64_t i = 0; i < ui.len; i++) {
		uint64_t tb = l->token_bytes;
		if (memcmp(got + i * tb, want + i * tb, tb)) {
			uint64_t b = 0;
			while (got[i * tb + b] == want[i * tb + b])
				b++;
			h_fail("user %" PRIu64 ": token at position %" PRIu64
			       " (page %" PRIu64 " frame %u slot %u) differs at"
			       " byte %" PRIu64 ": 0x%02x, wrote 0x%02x",
			       user, ui.start + i, i / P, slots[i].frame,
			       slots[i].slot, b, got[i * tb + b],
			       want[i * tb + b]);
			ret = -1;
			break;
		}
	}
out:
	free(slots);
	free(got);
	free(want);
	rc = kvp_release(c, ls.id);
	if (rc < 0) {
		h_fail("user %" PRIu64 ": release of read-only lease %" PRIu64
		       ": %d (%s)", user, ls.id, rc, kvp_last_error(c));
		ret = -1;
	}
	return ret;
}

int h_append_cycle(struct kvp_client *c, uint64_t salt, uint64_t user,
		   uint64_t expect_pos, uint32_t n, int quiet)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	struct kvp_user_info ui;
	int rc = kvp_info(c, user, &ui);
	if (rc < 0) {
		if (!quiet)
			h_fail("user %" PRIu64 ": info: %d (%s)", user, rc,
			       kvp_last_error(c));
		return rc;
	}
	uint64_t pos = ui.start + ui.len;
	if (ui.len == 0)
		pos = expect_pos == UINT64_MAX ? 0 : expect_pos;
	if (expect_pos != UINT64_MAX && pos != expect_pos) {
		if (!quiet)
			h_fail("user %" PRIu64 ": history ends at %" PRIu64
			       " (start %" PRIu64 " len %" PRIu64 "), expected %"
			       PRIu64, user, pos, ui.start, ui.len, expect_pos);
		return -ERANGE;
	}
	struct kvp_lease ls;
	rc = kvp_prepare(c, user, pos, n, &ls);
	if (rc < 0) {
		if (!quiet)
			h_fail("user %" PRIu64 ": prepare(%" PRIu64 ", %u): %d (%s)",
			       user, pos, n, rc, kvp_last_error(c));
		return rc;
	}
	if (ls.start + ls.len != pos || ls.n_new != n) {
		h_fail("user %" PRIu64 ": lease covers start %" PRIu64 " len %"
		       PRIu64 " n_new %u, asked for %u from %" PRIu64, user,
		       ls.start, ls.len, ls.n_new, n, pos);
		kvp_release(c, ls.id);
		return -EPROTO;
	}
	uint8_t *kv = malloc((size_t)n * l->token_bytes + 1);
	if (!kv) {
		kvp_release(c, ls.id);
		return -ENOMEM;
	}
	h_tokens_fill(l, salt, user, pos, n, kv);
	/* Two appends (the second from a middle token) to use `first`. */
	uint32_t half = n / 2;
	rc = kvp_append(c, &ls, 0, half, kv);
	if (rc == 0)
		rc = kvp_append(c, &ls, half, n - half,
				kv + (size_t)half * l->token_bytes);
	free(kv);
	if (rc < 0) {
		if (!quiet)
			h_fail("user %" PRIu64 ": append: %d (%s)", user, rc,
			       kvp_last_error(c));
		kvp_release(c, ls.id);
		return rc;
	}
	rc = kvp_commit(c, ls.id, n);
	if (rc < 0) {
		if (!quiet)
			h_fail("user %" PRIu64 ": commit(%" PRIu64 ", %u): %d (%s)",
			       user, ls.id, n, rc, kvp_last_error(c));
		kvp_release(c, ls.id);
		return rc;
	}
	rc = kvp_release(c, ls.id);
	if (rc < 0) {
		if (!quiet)
			h_fail("user %" PRIu64 ": release(%" PRIu64 "): %d (%s)",
			       user, ls.id, rc, kvp_last_error(c));
		return rc;
	}
	return 0;
}

int h_check_accounting(struct kvp_client *c, struct kvp_stats *st_out)
{
	struct kvp_stats st;
	int rc = kvp_stats(c, 0, &st);
	if (rc < 0) {
		h_fail("stats: %d (%s)", rc, kvp_last_error(c));
		return -1;
	}
	if (st_out)
		*st_out = st;
	uint64_t pages[KVP_TIERS] = { 0, 0 }, users = 0, cursor = 0, next = 0;
	struct kvp_user_info rows[64];
	int ret = 0;
	do {
		int n = kvp_users(c, cursor, rows, 64, &next);
		if (n < 0) {
			h_fail("users: %d (%s)", n, kvp_last_error(c));
			return -1;
		}
		for (int i = 0; i < n; i++) {
			pages[KVP_TIER_DEVICE] += rows[i].pages_device;
			pages[KVP_TIER_HOST] += rows[i].pages_host;
			if (rows[i].leases) {
				h_fail("user %" PRIu64 " still has %u leases",
				       rows[i].user, rows[i].leases);
				ret = -1;
			}
		}
		users += (uint64_t)n;
		if (next && next <= cursor) {
			h_fail("users: the cursor went from %" PRIu64 " to %" PRIu64,
			       cursor, next);
			return -1;
		}
		cursor = next;
	} while (next);
	if (st.users != users) {
		h_fail("stats count %" PRIu64 " users but kvp_users lists %" PRIu64,
		       st.users, users);
		ret = -1;
	}
	for (int t = 0; t < KVP_TIERS; t++) {
		const struct kvp_tier_stats *ts = &st.tier[t];
		const char *name = kvp_tier_name((uint32_t)t);
		h_log("%s tier: %" PRIu64 " used + %" PRIu64 " free of %" PRIu64
		      "; %" PRIu64 " users hold %" PRIu64 " pages", name,
		      ts->frames_used, ts->frames_free, ts->frames_total, users,
		      pages[t]);
		if (ts->frames_used + ts->frames_free != ts->frames_total) {
			h_fail("%s tier: used %" PRIu64 " + free %" PRIu64
			       " != total %" PRIu64, name, ts->frames_used,
			       ts->frames_free, ts->frames_total);
			ret = -1;
		}
		if (ts->frames_used != pages[t]) {
			h_fail("%s tier: %" PRIu64 " frames used but the users hold %"
			       PRIu64 " pages (a reservation leaked?)", name,
			       ts->frames_used, pages[t]);
			ret = -1;
		}
	}
	return ret;
}
