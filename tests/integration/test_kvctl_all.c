/* SPDX-License-Identifier: MIT */
/*
 * test_kvctl_all - every kvctl command, plain and --json, against three
 * daemons, checking each command's exit status, a piece of its output, and
 * that the daemon is still there after it:
 *
 *   1. a fresh daemon (no tenants configured, nothing ever cached);
 *   2. a fresh tenant: tenants configured, the one kvctl belongs to never
 *      used (as root, another tenant holds users and chunks of a client
 *      running as nobody, and every command first runs as nobody there: a
 *      uid that is no admin, whose admin commands are refused);
 *   3. a full daemon: the device and host tiers full, chunks of every type
 *      present (two ready, one still filling), a client attached.
 *
 * A command that takes the daemon down (a sanitizer abort in the sanitizer
 * build, say `kvctl chunks` sorting an empty list from a NULL pointer) fails
 * the test at that command, with the daemon's log. The daemon is stopped at
 * the end with SIGTERM and must exit 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define NOBODY 65534
#define KVCTL_TIMEOUT_MS 20000

static int g_bad;
/* The uid kvctl runs as ((uid_t)-1: the test's own). */
static uid_t g_kvctl_uid = (uid_t)-1;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

/* What a scenario holds, for the expected exit statuses and output. */
struct world {
	const char *name;
	int admin;              /* kvctl's uid is an admin */
	int host_full;          /* no free host page: offloads fail */
	uint64_t dev_user;      /* a user with device pages (0: none) */
	uint64_t host_user;     /* a user with host pages only (0: none) */
	uint64_t more_users[4]; /* other cached users, for the evicts */
	char chunk[65];         /* a ready chunk's id ("": none) */
	char filling[65];       /* a chunk being filled ("": none) */
	const char *no_chunk;   /* an id no chunk of the tenant has */
};

/* ------------------------------------------------------------ running kvctl */

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "re");
	char *buf = NULL;
	size_t cap = 0, n = 0;

	if (!f)
		return strdup("");
	for (;;) {
		if (n + 4096 + 1 > cap) {
			char *p = realloc(buf, cap = cap * 2 + 8192);

			if (!p)
				break;
			buf = p;
		}
		size_t got = fread(buf + n, 1, 4096, f);

		n += got;
		if (!got)
			break;
	}
	fclose(f);
	if (!buf)
		return strdup("");
	buf[n] = '\0';
	return buf;
}

/*
 * Run `kvctl --socket=SOCK args...` (NULL-terminated), stdout and stderr
 * into one file; check it exits with status, that its output holds want
 * (NULL: anything), and that the daemon is alive afterwards. Returns 0, or
 * -1 after reporting (the daemon's log too when it died).
 */
static int kvctl_expect(struct h_daemon *d, int status, const char *want, ...)
{
	const char *argv[24];
	char sockarg[256], out[256], cmd[512];
	size_t off = 0;
	int n = 0, rc, bad = 0;
	va_list ap;

	snprintf(sockarg, sizeof(sockarg), "--socket=%s", d->sock);
	snprintf(out, sizeof(out), "%s/kvctl.out", d->dir);
	argv[n++] = h_kvctl_path;
	va_start(ap, want);
	for (const char *a; (a = va_arg(ap, const char *)) && n < 22;)
		argv[n++] = a;
	va_end(ap);
	argv[n++] = sockarg;
	argv[n] = NULL;
	for (int i = 1; i < n - 1 && off < sizeof(cmd); i++)
		off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, "%s%s",
					i > 1 ? " " : "", argv[i]);

	pid_t pid = fork();
	if (pid < 0) {
		h_fail("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd < 0)
			_exit(126);
		dup2(fd, 1);
		dup2(fd, 2);
		if (g_kvctl_uid != (uid_t)-1 &&
		    (setgroups(0, NULL) < 0 || setgid(g_kvctl_uid) < 0 ||
		     setuid(g_kvctl_uid) < 0)) {
			dprintf(2, "cannot become uid %u: %s\n",
				(unsigned)g_kvctl_uid, strerror(errno));
			_exit(125);
		}
		execv(h_kvctl_path, (char *const *)argv);
		dprintf(2, "exec %s: %s\n", h_kvctl_path, strerror(errno));
		_exit(127);
	}
	rc = h_wait(pid, KVCTL_TIMEOUT_MS);
	char *text = slurp(out);

	if (rc != status) {
		h_fail("kvctl %s: exit status %d, expected %d; output:\n%s", cmd,
		       rc, status, text);
		bad = 1;
	} else if (want && !strstr(text, want)) {
		h_fail("kvctl %s: output lacks \"%s\":\n%s", cmd, want, text);
		bad = 1;
	}
	if (!h_daemon_alive(d)) {
		h_fail("kvctl %s: the daemon died (wait status 0x%x); its log:",
		       cmd, d->exit_status);
		h_daemon_dump_log(d);
		bad = 1;
	}
	free(text);
	g_bad += bad;
	return bad ? -1 : 0;
}

/* A command and the same with --json; stop the scenario once the daemon is
 * gone (every later command would only repeat the failure). */
#define K(status, want, ...) do { \
	if (!h_daemon_alive(d)) return; \
	kvctl_expect(d, status, want, __VA_ARGS__, (char *)NULL); \
} while (0)
#define KJ(status, want, jwant, ...) do { \
	K(status, want, __VA_ARGS__); \
	K(status, jwant, __VA_ARGS__, "--json"); \
} while (0)

static const char *u64s(char buf[24], uint64_t v)
{
	snprintf(buf, 24, "%" PRIu64, v);
	return buf;
}

/* ------------------------------------------------------------ the commands */

/* Every command that only reads. */
static void read_commands(struct h_daemon *d, const struct world *w)
{
	int st_chunk = w->chunk[0] ? 0 : 1;
	const char *chunk = w->chunk[0] ? w->chunk : w->no_chunk;
	char prefix[17];

	snprintf(prefix, sizeof(prefix), "%.16s", chunk);
	KJ(0, "device", "\"frames_total\"", "stats");
	KJ(w->admin ? 0 : 1, w->admin ? "device" : "admin",
	   w->admin ? "\"all_tenants\"" : "admin", "stats", "--all-tenants");
	KJ(0, NULL, "\"users\"", "users");
	KJ(0, NULL, "\"truncated\"", "users", "--limit", "1");
	KJ(0, NULL, "\"len\"", "user", "7");
	KJ(0, NULL, "\"len\"", "user", "18446744073709551615");
	KJ(w->admin ? 0 : 1, w->admin ? "kvctl" : "admin",
	   w->admin ? "\"clients\"" : "admin", "clients");
	KJ(0, w->chunk[0] ? prefix : NULL, "\"chunks\"", "chunks");
	for (const char *const *t = (const char *const[]){ "system", "context",
	     "query", NULL }; *t; t++)
		KJ(0, NULL, "\"chunks\"", "chunks", "--type", *t);
	KJ(0, NULL, "\"chunks\"", "chunks", "--filter", "lang=en");
	KJ(0, NULL, "\"chunks\"", "chunks", "--type", "context", "--filter",
	   "doc=faq,lang=en");
	KJ(st_chunk, w->chunk[0] ? chunk : NULL, w->chunk[0] ? "\"ready\"" : NULL,
	   "chunk", chunk);
	KJ(st_chunk, NULL, NULL, "chunk", prefix);
	if (w->filling[0])
		KJ(0, "filling", "\"filling\"", "chunk", w->filling);
	K(0, "stats", "help");
	K(0, "--tier", "help", "evict");
	K(0, "kvctl", "--version");
}

/* Every command that changes something, in an order that keeps each one's
 * outcome known: a user's pages are offloaded, demoted, dropped. */
static void write_commands(struct h_daemon *d, const struct world *w)
{
	char a[24], b[24], c[24];
	const uint64_t *m = w->more_users;
	int ok_dev = w->dev_user ? 0 : 1, ok_host = w->host_user ? 0 : 1;
	uint64_t dev = w->dev_user ? w->dev_user : 7;
	uint64_t host = w->host_user ? w->host_user : 8;

	/* A full host tier takes no offload: an error that says what to do. */
	KJ(w->host_full ? 1 : ok_dev, w->host_full ? "raise host_mem" : NULL,
	   NULL, "offload", "--user", u64s(a, dev));
	KJ(w->admin && !w->host_full ? 0 : 1, NULL,
	   !w->admin ? "admin" : w->host_full ? "raise host_mem" : "\"pages_copied\"",
	   "offload", "--all");
	/* Room on the host first, then a demotion (device only) into it. */
	K(ok_host, NULL, "evict", "--user", u64s(b, host), "--tier", "host");
	K(ok_dev, NULL, "evict", "--user", u64s(a, dev), "--tier", "device");
	K(m[0] ? 0 : 1, NULL, "evict", "--user", u64s(c, m[0] ? m[0] : 9),
	  "--tier", "all");
	K(m[1] ? 0 : 1, m[1] ? "\"pages_freed\"" : "nothing cached", "evict",
	  "--user", u64s(c, m[1] ? m[1] : 10), "--json");
	K(m[2] ? 0 : 1, m[2] ? "\"pages_freed\"" : "nothing cached", "evict",
	  "--user", u64s(c, m[2] ? m[2] : 11), "--tier", "device", "--json");
	K(1, "nothing cached", "evict", "--user", "18446744073709551615");
	K(1, "nothing cached", "offload", "--user", "18446744073709551615", "--json");
	for (const char *const *t = (const char *const[]){ "device", "host", "all",
	     NULL }; *t; t++)
		/* an admin: every tenant; otherwise its own tenant */
		KJ(0, w->admin ? NULL : "tenant", w->admin ? "\"users_affected\"" :
		   "\"scope\": \"tenant\"", "evict", "--all", "--tier", *t);
	KJ(0, NULL, "\"chunks_deleted\"", "chunks", "--evict-unused", "3600");
	KJ(0, NULL, "\"chunks_deleted\"", "chunks", "--clear", "--type", "query");
	if (w->chunk[0]) {
		K(0, NULL, "evict", "--chunk", w->chunk);
		/* gone from the table once deleted, held or not */
		K(1, NULL, "evict", "--chunk", w->chunk, "--json");
	} else {
		KJ(1, NULL, NULL, "evict", "--chunk", w->no_chunk);
	}
	KJ(0, NULL, "\"chunks_deleted\"", "chunks", "--clear");
	KJ(0, NULL, "\"chunks_deleted\"", "chunks", "--evict-unused", "0");
	KJ(0, NULL, "\"chunks\"", "chunks");
	KJ(0, NULL, "\"users\"", "users");
}

static void every_command(struct h_daemon *d, const struct world *w)
{
	h_log("%s: every kvctl command", w->name);
	read_commands(d, w);
	write_commands(d, w);
	/* The daemon still answers, then stops cleanly. */
	K(0, "device", "stats");
}

/* ------------------------------------------------------------ scenarios */

#define NO_CHUNK "00000000000000000000000000000000000000000000000000000000deadbeef"

static int scenario_fresh_daemon(void)
{
	struct h_daemon d = { 0 };
	struct world w = { .name = "fresh daemon", .admin = 1, .no_chunk = NO_CHUNK };
	int bad0 = g_bad;
	uint64_t t0 = h_now_ms();

	if (h_daemon_up(&d, "--device_mem=64K", "--host_mem=64K", (char *)NULL))
		return -1;
	every_command(&d, &w);
	return h_daemon_finish(&d, g_bad != bad0, t0) ? -1 : 0;
}

/* Register (and seal unless keep_filling) n tokens from base as type with
 * meta; the name in hex. The read lease a ready chunk is acquired with, or
 * the filler's lease, is kept (so the fill cannot evict the chunk). */
static int make_chunk(struct kvp_client *c, uint32_t base, uint32_t n,
		      uint32_t type, const char *meta, int keep_filling,
		      char hex[65])
{
	uint32_t *t = malloc(n * sizeof(*t));
	struct kvp_chunk_reg reg;
	struct kvp_lease rd;
	int rc;

	if (!t)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
	rc = kvp_chunk_register(c, t, n, type, meta, &reg);
	free(t);
	if (!rc && reg.created && !keep_filling)
		rc = kvp_chunk_seal(c, &reg);
	if (!rc && !keep_filling)
		rc = kvp_chunk_acquire(c, &reg.id, 2000, &rd);
	if (rc) {
		h_fail("chunk of %u tokens from %u: %s", n, base, kvp_last_error(c));
		return rc;
	}
	kvp_chunk_id_format(&reg.name, hex); /* what kvctl lists */
	return 0;
}

/* As nobody, in the other tenant: users 1 to 4 (3 pages each, all on the
 * device) and a ready context chunk, whose id goes back in hex. */
struct busy {
	char sock[192];
	char hex[65];
};

static int busy_tenant_client(void *arg)
{
	struct busy *b = arg;
	struct kvp_client *c = h_connect_or_fail(b->sock, "busy", 5000);

	if (!c)
		return 1;
	for (uint64_t u = 1; u <= 4; u++)
		if (h_append_cycle(c, 3, u, 0, 40, 0))
			return 1;
	if (make_chunk(c, 500, 32, KVP_CHUNK_CONTEXT, "doc=faq,lang=en", 0, b->hex))
		return 1;
	kvp_close(c);
	return 0;
}

static int scenario_fresh_tenant(void)
{
	struct h_daemon d = { 0 };
	struct world w = { .name = "fresh tenant", .admin = 1, .no_chunk = NO_CHUNK };
	char fresh[64];
	int root = geteuid() == 0, bad0 = g_bad;
	uint64_t t0 = h_now_ms();

	/* kvctl runs in tenant fresh; as root, nobody fills tenant busy. */
	snprintf(fresh, sizeof(fresh), "--tenant=fresh:uids=%u", (unsigned)geteuid());
	if (h_daemon_dir(&d, root) ||
	    h_daemon_start(&d, 10000, "--device_mem=64K", "--host_mem=64K",
			   "--socket_mode=0666", fresh,
			   root ? "--tenant=busy:uids=65534" : (char *)NULL,
			   (char *)NULL))
		return -1;
	if (root) {
		struct busy *b = h_shared_zalloc(sizeof(*b));
		pid_t p;

		if (!b)
			return h_daemon_finish(&d, 1, t0), -1;
		snprintf(b->sock, sizeof(b->sock), "%s", d.sock);
		p = h_fork_as(NOBODY, NOBODY, busy_tenant_client, b);
		CHECK(p > 0 && h_wait(p, 30000) == 0,
		      "the busy tenant's client (as nobody) failed");
		/* First the busy tenant's view, from a uid that is no admin:
		 * the admin commands are refused, the daemon stays. */
		struct world wb = { .name = "busy tenant, not an admin",
				    .dev_user = 1, .more_users = { 2, 3, 4 },
				    .no_chunk = NO_CHUNK };

		memcpy(wb.chunk, b->hex, sizeof(wb.chunk));
		g_kvctl_uid = NOBODY;
		every_command(&d, &wb);
		g_kvctl_uid = (uid_t)-1;
	} else {
		h_log("fresh tenant: not root, so no second tenant holds data");
	}
	every_command(&d, &w);
	return h_daemon_finish(&d, g_bad != bad0, t0) ? -1 : 0;
}

/* Both tiers full: a device tier of 16 pages (4 held by chunks), a host
 * tier of 16, users of 2 pages each until 3 times that was written. */
static int fill(struct kvp_client *c, struct world *w)
{
	struct kvp_user_info rows[64];
	struct kvp_stats st;
	char ctx[65];
	uint64_t next;
	int n, k = 0;

	if (make_chunk(c, 100, 16, KVP_CHUNK_SYSTEM, "kind=sys", 0, w->chunk) ||
	    make_chunk(c, 200, 32, KVP_CHUNK_CONTEXT, "doc=faq,lang=en", 0, ctx) ||
	    make_chunk(c, 300, 16, KVP_CHUNK_QUERY, NULL, 1, w->filling))
		return -1;
	for (uint64_t u = 1; u <= 48; u++)
		if (h_append_cycle(c, 5, u, 0, 2 * H_PAGE_TOKENS, 0))
			return -1;
	if (kvp_stats(c, 0, &st)) {
		h_fail("stats: %s", kvp_last_error(c));
		return -1;
	}
	for (int t = 0; t < KVP_TIERS; t++)
		CHECK(st.tier[t].frames_free == 0 && st.tier[t].frames_total > 0,
		      "tier %d: %" PRIu64 " of %" PRIu64 " frames free; the fill "
		      "should leave none", t, st.tier[t].frames_free,
		      st.tier[t].frames_total);
	n = kvp_users(c, 0, rows, 64, &next);
	if (n < 0) {
		h_fail("users: %s", kvp_last_error(c));
		return -1;
	}
	/* The other users evicted are on the device: evicting them never
	 * drops the host users the demotion below relies on. */
	for (int i = 0; i < n; i++) {
		if (!w->dev_user && rows[i].pages_device)
			w->dev_user = rows[i].user;
		else if (k < 3 && rows[i].pages_device)
			w->more_users[k++] = rows[i].user;
		else if (!w->host_user && !rows[i].pages_device && rows[i].pages_host)
			w->host_user = rows[i].user;
	}
	w->host_full = 1;
	CHECK(w->dev_user && w->host_user && k == 3,
	      "after the fill: want users on the device, on the host only, and 3 "
	      "more; got %d users", n);
	return 0;
}

static int scenario_full(void)
{
	struct h_daemon d = { 0 };
	struct world w = { .name = "full daemon", .admin = 1, .no_chunk = NO_CHUNK };
	struct kvp_client *c;
	int bad0 = g_bad;
	uint64_t t0 = h_now_ms();

	if (h_daemon_up(&d, "--device_mem=64K", "--host_mem=64K", (char *)NULL))
		return -1;
	c = h_connect_or_fail(d.sock, "filler", 5000);
	if (!c || fill(c, &w)) {
		if (c)
			kvp_close(c);
		return h_daemon_finish(&d, 1, t0), -1;
	}
	/* the client stays: `clients` lists it, its leases hold the chunks */
	every_command(&d, &w);
	kvp_close(c);
	return h_daemon_finish(&d, g_bad != bad0, t0) ? -1 : 0;
}

int main(int argc, char **argv)
{
	uint64_t t0 = h_now_ms();
	int bad = 0;

	h_init(argc, argv, "test_kvctl_all");
	if (!h_kvctl_path) {
		h_log("SKIP: no kvctl given");
		return H_SKIP;
	}
	bad |= scenario_fresh_daemon() != 0;
	bad |= scenario_fresh_tenant() != 0;
	bad |= scenario_full() != 0;
	bad |= g_bad != 0;
	h_log("%s in %" PRIu64 " ms", bad ? "FAIL" : "PASS", h_now_ms() - t0);
	return bad ? H_FAIL : H_PASS;
}
