/* SPDX-License-Identifier: MIT */
/*
 * test_dos - a uid that floods kvpoold with connections that never send a
 * hello cannot take the daemon down.
 *
 * kvpoold runs with 64 descriptors (hard limit; soft 32, which it must raise
 * to 64 itself). An attacker process opens connections as fast as it can
 * for FLOOD_MS, reconnecting whenever the daemon drops one, then holds every
 * one it has open without a word. Then:
 *   - once the hello timeout has passed, a legitimate client connects and
 *     appends, commits and reads back, although the attacker still holds
 *     its connections open;
 *   - while the attacker holds them the daemon is idle (CPU bounded);
 *   - its log stays small (rate-limited: not one line per connection);
 *   - a second flood is running when SIGTERM comes, and the daemon exits
 *     within STOP_MS.
 * Twice: with the default pending caps (which stop the flood before the
 * descriptors run out), and with caps above the descriptor limit, where the
 * daemon hits EMFILE and must shed pending connections instead.
 *
 * Then the caps on attached clients (issue 25, item 12): one uid or one
 * tenant attaching all the clients it can is refused past
 * max_clients_per_uid / max_clients_per_tenant with a message naming the
 * setting, while another tenant still attaches; with the defaults at 256
 * descriptors too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define FD_HARD 64
#define FD_SOFT 32
#define FLOOD_MS 2000
#define HOLD_CONNS 400   /* the attacker keeps at most this many open */
#define STOP_MS 2000     /* SIGTERM to exit, mid-flood */
#define MAX_LOG_LINES 300
#define MAX_IDLE_CPU_MS 200 /* daemon CPU while the attacker only holds */

static const char *g_sock;

/* ------------------------------------------------------------ attacker */

static int attack_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g_sock);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Connect for ms; drop what the daemon hung up and connect again. Returns
 * connections made. */
static long flood(int *fds, int *n, unsigned ms)
{
	uint64_t end = h_now_ms() + ms;
	long made = 0;

	while (h_now_ms() < end) {
		if (*n < HOLD_CONNS) {
			int fd = attack_connect();

			if (fd >= 0) {
				fds[(*n)++] = fd;
				made++;
			} else {
				h_sleep_us(200); /* backlog full */
			}
			continue;
		}
		/* Full: give back what the daemon closed. */
		struct pollfd p[HOLD_CONNS];
		for (int i = 0; i < *n; i++)
			p[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
		if (poll(p, (nfds_t)*n, 10) <= 0)
			continue;
		for (int i = *n - 1; i >= 0; i--)
			if (p[i].revents & (POLLHUP | POLLERR | POLLIN)) {
				close(fds[i]);
				fds[i] = fds[--*n];
			}
	}
	return made;
}

/* Flood, hold (tell the test 'H'), flood again on 'F' until 'E'. */
static int attacker_main(void *arg)
{
	struct h_chan *ch = arg;
	static int fds[HOLD_CONNS];
	struct rlimit rl;
	int n = 0;
	long made;

	h_set_name("attacker");
	h_chan_child_side(ch);
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	made = flood(fds, &n, FLOOD_MS);
	h_log("flood: %ld connections made, %d held open", made, n);
	if (h_chan_say(ch->to_parent[1], 'H'))
		return H_FAIL;
	if (h_chan_wait(ch->to_child[0], 60000) != 'F')
		return H_FAIL;
	for (;;) {
		struct pollfd p = { .fd = ch->to_child[0], .events = POLLIN };

		if (poll(&p, 1, 0) == 1)
			break; /* 'E' or EOF */
		made += flood(fds, &n, 50);
	}
	h_log("%ld connections made in all", made);
	return H_PASS;
}

/* ------------------------------------------------------------ the daemon */

/* A wrapper that starts kvpoold with soft / hard descriptors. */
static int write_wrapper_n(const struct h_daemon *d, const char *daemon,
			   char *path, size_t len, int soft, int hard)
{
	FILE *f;

	snprintf(path, len, "%s/kvpoold-%dfds.sh", d->dir, hard);
	f = fopen(path, "w");
	if (!f) {
		h_fail("%s: %s", path, strerror(errno));
		return -1;
	}
	fprintf(f, "#!/bin/sh\nulimit -S -n %d && ulimit -H -n %d || exit 126\n"
		"exec '%s' \"$@\"\n", soft, hard, daemon);
	fclose(f);
	return chmod(path, 0755);
}

/* The wrapper of the flood runs: FD_SOFT / FD_HARD descriptors. */
static int write_wrapper(const struct h_daemon *d, const char *daemon,
			 char *path, size_t len)
{
	return write_wrapper_n(d, daemon, path, len, FD_SOFT, FD_HARD);
}

/* The daemon's soft RLIMIT_NOFILE from /proc, or -1. */
static long daemon_fd_limit(pid_t pid)
{
	char path[64], line[256];
	long soft = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "Max open files", 14))
			soft = strtol(line + 26, NULL, 10);
	fclose(f);
	return soft;
}

/* utime + stime of every thread, in ms. */
static long daemon_cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut, st;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* after comm, which may hold spaces */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
			 &ut, &st) != 2)
		return -1;
	return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

static long log_lines(const struct h_daemon *d)
{
	FILE *f = fopen(d->log, "r");
	long n = 0;
	int ch;

	if (!f)
		return -1;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

/* The last n lines of the daemon's log (all of it may be 100,000). */
static void dump_log_tail(const struct h_daemon *d, int n)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "tail -n %d '%s' >&2", n, d->log);
	if (system(cmd) != 0)
		h_log("cannot show %s", d->log);
}

static int log_has(const struct h_daemon *d, const char *what)
{
	FILE *f = fopen(d->log, "r");
	char line[2048];
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, what) != NULL;
	fclose(f);
	return found;
}

/* ------------------------------------------------------------ the test */

static int run(const char *label, const char *const *flags, int hello_ms)
{
	const char *real = h_daemon_path;
	struct kvp_client *c = NULL;
	struct h_daemon d;
	struct h_chan ch;
	char wrapper[256], err[256];
	uint64_t t0 = h_now_ms(), t;
	long cpu0, cpu1, lines, lim;
	int bad = 0, ret;
	pid_t att;

	h_log("%s", label);
	if (h_daemon_dir(&d, 0) || write_wrapper(&d, real, wrapper, sizeof(wrapper)))
		return -1;
	h_daemon_path = wrapper;
	ret = h_daemon_startv(&d, 10000, flags);
	h_daemon_path = real;
	if (ret)
		return -1;
	g_sock = d.sock;
	lim = daemon_fd_limit(d.pid);
	if (lim != FD_HARD) {
		h_fail("%s: kvpoold's RLIMIT_NOFILE soft limit is %ld; it should "
		       "have raised it from %d to the hard limit %d", label, lim,
		       FD_SOFT, FD_HARD);
		bad = 1;
	}

	if (h_chan_open(&ch))
		return -1;
	att = h_fork(attacker_main, &ch);
	if (att < 0)
		return -1;
	h_chan_parent_side(&ch);
	if (h_chan_wait(ch.to_parent[0], FLOOD_MS + 20000) != 'H') {
		h_fail("%s: the attacker did not finish its flood", label);
		bad = 1;
		goto out;
	}

	/* The attacker only holds its connections now: the daemon idles. */
	cpu0 = daemon_cpu_ms(d.pid);
	h_sleep_ms((unsigned)hello_ms + 1000);
	cpu1 = daemon_cpu_ms(d.pid);
	h_log("%s: daemon CPU while the attacker holds its connections: %ld ms "
	      "in %d ms", label, cpu1 - cpu0, hello_ms + 1000);
	if (cpu0 < 0 || cpu1 - cpu0 > MAX_IDLE_CPU_MS) {
		h_fail("%s: kvpoold used %ld ms of CPU in %d ms with nothing to do "
		       "(limit %d ms)", label, cpu1 - cpu0, hello_ms + 1000,
		       MAX_IDLE_CPU_MS);
		bad = 1;
	}

	/* Past the hello timeout: a legitimate client gets in and works. */
	t = h_now_ms();
	ret = h_connect(&c, d.sock, "legit", 5000, err, sizeof(err));
	if (ret) {
		h_fail("%s: a legitimate client cannot attach after the flood: %s",
		       label, err);
		bad = 1;
	} else {
		h_log("%s: legitimate client attached in %" PRIu64 " ms", label,
		      h_now_ms() - t);
		if (h_append_cycle(c, 0xd05, 1, 0, 40, 0) ||
		    h_verify_user(c, 0xd05, 1, 0, 40, NULL)) {
			h_fail("%s: the legitimate client's append did not work", label);
			bad = 1;
		}
		kvp_close(c);
	}

	lines = log_lines(&d);
	h_log("%s: %ld log lines after the flood", label, lines);
	if (lines < 0 || lines > MAX_LOG_LINES) {
		h_fail("%s: kvpoold wrote %ld log lines for one flood (limit %d): "
		       "not rate-limited", label, lines, MAX_LOG_LINES);
		bad = 1;
	}

	/* SIGTERM in the middle of a second flood. */
	h_chan_say(ch.to_child[1], 'F');
	h_sleep_ms(500);
	t = h_now_ms();
	if (h_daemon_stop(&d, STOP_MS)) {
		h_fail("%s: kvpoold did not stop within %d ms of SIGTERM under a "
		       "flood", label, STOP_MS);
		bad = 1;
	} else {
		h_log("%s: SIGTERM under a flood: exited in %" PRIu64 " ms", label,
		      h_now_ms() - t);
		lines = log_lines(&d);
		h_log("%s: %ld log lines in all", label, lines);
		if (lines > MAX_LOG_LINES || !log_has(&d, "similar lines suppressed")) {
			h_fail("%s: %ld log lines in all and no line saying how many "
			       "were suppressed", label, lines);
			bad = 1;
		}
	}
out:
	h_chan_say(ch.to_child[1], 'E');
	close(ch.to_child[1]);
	if (h_wait(att, 10000) != 0) {
		h_fail("%s: the attacker failed", label);
		bad = 1;
	}
	close(ch.to_parent[0]);
	if (bad)
		dump_log_tail(&d, 60);
	if (d.pid > 0)
		h_daemon_kill(&d);
	h_daemon_cleanup(&d);
	h_log("%s: %s in %" PRIu64 " ms", label, bad ? "FAIL" : "pass",
	      h_now_ms() - t0);
	return bad ? -1 : 0;
}

/* max_pending_per_uid: the connections past it are refused, and a slot is
 * free again once one of them is gone. */
static int per_uid_cap(void)
{
	static const char *const flags[] = { "--max_pending_per_uid=4",
		"--hello_timeout_ms=60000", NULL };
	struct kvp_client *c = NULL;
	struct kvp_connect_opts o = { .name = "fifth" };
	struct h_daemon d;
	char err[KVP_ERRLEN];
	int idle[4], bad = 0, ret;

	h_log("max_pending_per_uid");
	if (h_daemon_dir(&d, 0) || h_daemon_startv(&d, 10000, flags))
		return -1;
	g_sock = o.socket = d.sock;
	for (int i = 0; i < 4; i++)
		idle[i] = attack_connect();
	h_sleep_ms(200); /* accepted: four pending connections of our uid */
	ret = kvp_connect(&c, &o, err, sizeof(err));
	if (ret == 0) {
		h_fail("a fifth connection of one uid attached with "
		       "max_pending_per_uid=4 and four waiting for their hello");
		kvp_close(c);
		bad = 1;
	} else {
		h_log("the fifth connection is refused: %s", err);
	}
	close(idle[0]);
	h_sleep_ms(200); /* the daemon sees the hang-up */
	ret = kvp_connect(&c, &o, err, sizeof(err));
	if (ret) {
		h_fail("one pending connection closed, a client still cannot "
		       "attach: %s", err);
		bad = 1;
	} else {
		kvp_close(c);
	}
	for (int i = 1; i < 4; i++)
		close(idle[i]);
	if (h_daemon_stop(&d, STOP_MS))
		bad = 1;
	if (bad)
		dump_log_tail(&d, 60);
	h_daemon_cleanup(&d);
	return bad ? -1 : 0;
}

/* ------------------------------------------------------------ attached */

#define UID_A1 1001 /* tenant a */
#define UID_A2 1003 /* tenant a too */
#define UID_B 1002  /* tenant b */

/* One uid's clients: n must attach, then one more must be refused with a
 * message holding expect (none: no more is tried); held until 'E'. */
struct holder {
	uid_t uid;
	int n;
	const char *expect;
	struct h_chan ch;
	pid_t pid;
};

static int holder_main(void *arg)
{
	struct holder *h = arg;
	struct kvp_connect_opts o = { .socket = g_sock, .name = "holder" };
	static struct kvp_client *cs[512];
	char err[KVP_ERRLEN], name[32];
	int n = 0, rc = H_PASS;

	snprintf(name, sizeof(name), "uid-%u", (unsigned)h->uid);
	h_set_name(name);
	h_chan_child_side(&h->ch);
	while (n < h->n && n < 512) {
		if (kvp_connect(&cs[n], &o, err, sizeof(err))) {
			if (h->expect && h->n >= 512)
				break; /* "as many as it may": the cap came */
			h_fail("client %d of %d cannot attach: %s", n + 1, h->n, err);
			rc = H_FAIL;
			goto out;
		}
		n++;
	}
	if (h->expect && h->n >= 512 && n == h->n) {
		h_fail("%d clients of one uid attached: no cap stopped them", n);
		rc = H_FAIL;
		goto out;
	}
	if (h->expect && h->n < 512) {
		if (!kvp_connect(&cs[n], &o, err, sizeof(err))) {
			h_fail("client %d attached past the cap (%d)", n + 1, h->n);
			n++;
			rc = H_FAIL;
			goto out;
		}
	}
	if (h->expect && (!strstr(err, h->expect) || !strstr(err, "raise"))) {
		h_fail("refused with \"%s\": it should name %s and what to do",
		       err, h->expect);
		rc = H_FAIL;
		goto out;
	}
	if (h->expect)
		h_log("%d clients attached, the next refused: %s", n, err);
	else
		h_log("%d clients attached", n);
out:
	/* Held until the test is done with them, failed or not: the others
	 * are tried against what this uid holds. */
	if (h_chan_say(h->ch.to_parent[1], rc == H_PASS ? 'R' : 'X') ||
	    h_chan_wait(h->ch.to_child[0], 60000) != 'E')
		rc = H_FAIL;
	while (n > 0)
		kvp_close(cs[--n]);
	return rc;
}

/* Start h: 0 once its clients are attached (and the extra one refused),
 * -1 when that failed (it holds what it got until holder_end), 1 when it
 * cannot become its uid (gone). */
static int holder_start(struct holder *h)
{
	int said;

	if (h_chan_open(&h->ch))
		return -1;
	h->pid = h_fork_as(h->uid, h->uid, holder_main, h);
	if (h->pid < 0)
		return -1;
	h_chan_parent_side(&h->ch);
	said = h_chan_wait(h->ch.to_parent[0], 30000);
	if (said == 'R' || said == 'X')
		return said == 'R' ? 0 : -1;
	if (h_wait(h->pid, 5000) == H_SKIP) {
		h->pid = 0;
		return 1;
	}
	h->pid = 0;
	return -1;
}

/* Let h's clients go and reap it; 0 when it passed. */
static int holder_end(struct holder *h)
{
	int rc;

	if (!h->pid)
		return -1;
	h_chan_say(h->ch.to_child[1], 'E');
	close(h->ch.to_child[1]);
	rc = h_wait(h->pid, 10000);
	close(h->ch.to_parent[0]);
	return rc == 0 ? 0 : -1;
}

/*
 * Attached clients are capped per uid and per tenant (issue 25, item 12):
 * uid 1001 (tenant a) attaches max_clients_per_uid and is refused the next
 * one; uid 1003 (tenant a too) is refused once the tenant holds
 * max_clients_per_tenant; while they hold theirs, tenant b (uid 1002) and
 * an admin still attach; once 1001 lets go, it attaches again.
 */
static int client_caps(void)
{
	static const char *const flags[] = {
		"--tenant=a:uids=1001,1003:device_mem=1M:host_mem=1M",
		"--tenant=b:uids=1002:device_mem=1M:host_mem=1M",
		"--max_clients_per_uid=3", "--max_clients_per_tenant=5",
		"--socket_mode=0666", NULL };
	struct holder a1 = { .uid = UID_A1, .n = 3, .expect = "max_clients_per_uid" };
	struct holder a2 = { .uid = UID_A2, .n = 2, .expect = "max_clients_per_tenant" };
	struct holder b = { .uid = UID_B, .n = 3 };
	struct holder again = { .uid = UID_A1, .n = 1 };
	struct kvp_client *c;
	struct h_daemon d;
	char err[KVP_ERRLEN];
	int bad = 0, rc;

	h_log("max_clients_per_uid and max_clients_per_tenant");
	if (geteuid() != 0) {
		h_log("skipped: needs root to setuid() client processes");
		return 0;
	}
	if (h_daemon_dir(&d, 1) || h_daemon_startv(&d, 10000, flags))
		return -1;
	g_sock = d.sock;
	rc = holder_start(&a1);
	if (rc > 0) {
		h_log("skipped: cannot setuid(%d)", UID_A1);
		h_daemon_stop(&d, STOP_MS);
		h_daemon_cleanup(&d);
		return 0;
	}
	bad |= rc != 0;
	bad |= holder_start(&a2) != 0;
	bad |= holder_start(&b) != 0;
	if (h_connect(&c, d.sock, "admin", 5000, err, sizeof(err))) {
		h_fail("an admin cannot attach while tenant a holds its clients: %s",
		       err);
		bad = 1;
	} else {
		kvp_close(c);
	}
	bad |= holder_end(&a1) != 0;
	h_sleep_ms(200); /* the daemon sees a1's clients go */
	bad |= holder_start(&again) != 0;
	bad |= holder_end(&again) != 0;
	bad |= holder_end(&a2) != 0;
	bad |= holder_end(&b) != 0;
	if (h_daemon_stop(&d, STOP_MS))
		bad = 1;
	if (bad)
		dump_log_tail(&d, 60);
	h_daemon_cleanup(&d);
	return bad ? -1 : 0;
}

/*
 * The attack with the caps left at their defaults: a daemon with 256
 * descriptors, one uid attaching as many clients as it may (it tries 512)
 * is stopped by max_clients_per_uid long before the descriptors run out,
 * and another tenant still attaches and works while it holds them.
 */
static int default_caps(void)
{
	static const char *const flags[] = {
		"--tenant=a:uids=1001:device_mem=1M:host_mem=1M",
		"--tenant=b:uids=1002:device_mem=1M:host_mem=1M",
		"--socket_mode=0666", NULL };
	struct holder a = { .uid = UID_A1, .n = 512, .expect = "max_clients_per_uid" };
	struct holder b = { .uid = UID_B, .n = 8 };
	const char *real = h_daemon_path;
	struct h_daemon d;
	char wrapper[256];
	int bad = 0, rc;

	h_log("default client caps at 256 descriptors");
	if (geteuid() != 0) {
		h_log("skipped: needs root to setuid() client processes");
		return 0;
	}
	if (h_daemon_dir(&d, 1) ||
	    write_wrapper_n(&d, real, wrapper, sizeof(wrapper), 128, 256))
		return -1;
	h_daemon_path = wrapper;
	rc = h_daemon_startv(&d, 10000, flags);
	h_daemon_path = real;
	if (rc)
		return -1;
	g_sock = d.sock;
	rc = holder_start(&a);
	if (rc > 0) {
		h_log("skipped: cannot setuid(%d)", UID_A1);
		h_daemon_stop(&d, STOP_MS);
		h_daemon_cleanup(&d);
		return 0;
	}
	bad |= rc != 0;
	bad |= holder_start(&b) != 0;
	bad |= holder_end(&b) != 0;
	bad |= holder_end(&a) != 0;
	if (h_daemon_stop(&d, STOP_MS))
		bad = 1;
	if (bad)
		dump_log_tail(&d, 60);
	h_daemon_cleanup(&d);
	return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
	static const char *const caps[] = { "--hello_timeout_ms=1000", NULL };
	static const char *const emfile[] = { "--hello_timeout_ms=1000",
		"--max_pending=1000", "--max_pending_per_uid=1000", NULL };
	int fail;

	h_init(argc, argv, "test_dos");
	fail = run("pending caps below the fd limit", caps, 1000) != 0;
	fail |= run("caps above the fd limit (EMFILE)", emfile, 1000) != 0;
	fail |= per_uid_cap() != 0;
	fail |= client_caps() != 0;
	fail |= default_caps() != 0;
	return fail ? H_FAIL : H_PASS;
}
