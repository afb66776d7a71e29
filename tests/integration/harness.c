/* SPDX-License-Identifier: MIT */
/*
 * harness.c - the processes of an integration test: a real kvpoold per
 * test in a temp dir of its own, forked (and setuid) clients, messages,
 * time and the PRNG (see harness.h; harness_kv.c and harness_raw.c hold the
 * client-side helpers).
 *
 * Everything the harness starts dies with the test: children get
 * PR_SET_PDEATHSIG(SIGKILL) (it survives exec, so the daemon has it too),
 * and exit or a fatal signal in the test's main process kills what is still
 * registered and removes the temp dirs. CTest's timeout therefore never
 * leaves a daemon behind.
 */
#define _GNU_SOURCE
#include "clock.h"
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *h_daemon_path;
const char *h_kvctl_path;

static char h_name[64] = "test";
static pid_t h_main_pid;

#define H_MAX_CHILDREN 1024
#define H_MAX_DIRS 16
static pid_t h_children[H_MAX_CHILDREN];
static int h_nchildren;
static char h_dirs[H_MAX_DIRS][128];
static int h_ndirs;

/* ------------------------------------------------------------ messages */

void h_set_name(const char *name)
{
	snprintf(h_name, sizeof(h_name), "%s", name);
}

static void h_vlog(const char *what, const char *fmt, va_list ap)
{
	char buf[1024];
	int n = snprintf(buf, sizeof(buf), "[%s %d] %s", h_name, (int)getpid(),
			 what);
	if (n < 0 || (size_t)n >= sizeof(buf))
		n = 0;
	vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
	size_t len = strlen(buf);
	if (len + 1 < sizeof(buf)) {
		buf[len++] = '\n';
		buf[len] = 0;
	}
	/* One write per line so lines of many processes do not interleave. */
	ssize_t w = write(2, buf, len);
	(void)w;
}

void h_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	h_vlog("", fmt, ap);
	va_end(ap);
}

void h_fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	h_vlog("FAIL: ", fmt, ap);
	va_end(ap);
}

uint64_t h_now_ms(void)
{
	return mono_ms();
}

void h_sleep_us(unsigned us)
{
	struct timespec ts = { us / 1000000, (long)(us % 1000000) * 1000 };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

void h_sleep_ms(unsigned ms)
{
	h_sleep_us(ms * 1000u);
}

/* ------------------------------------------------------------ PRNG */

uint64_t h_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

void h_rng_seed(struct h_rng *r, uint64_t seed)
{
	r->s = seed;
}

uint64_t h_rng_next(struct h_rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	uint64_t x = r->s;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t h_rng_below(struct h_rng *r, uint64_t n)
{
	return n ? h_rng_next(r) % n : 0;
}

/* ------------------------------------------------------------ cleanup */

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	remove(path);
	return 0;
}

static void h_kill_everything(void)
{
	if (getpid() != h_main_pid)
		return;
	for (int i = 0; i < h_nchildren; i++) {
		if (h_children[i] > 0) {
			kill(h_children[i], SIGKILL);
			waitpid(h_children[i], NULL, 0);
		}
	}
	h_nchildren = 0;
	if (getenv("KVPOOL_TEST_KEEP"))
		return;
	for (int i = 0; i < h_ndirs; i++)
		if (h_dirs[i][0])
			nftw(h_dirs[i], rm_one, 8, FTW_DEPTH | FTW_PHYS);
	h_ndirs = 0;
}

static void h_on_signal(int sig)
{
	h_kill_everything();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void h_remember(pid_t pid)
{
	for (int i = 0; i < h_nchildren; i++)
		if (h_children[i] == 0) {
			h_children[i] = pid;
			return;
		}
	if (h_nchildren < H_MAX_CHILDREN)
		h_children[h_nchildren++] = pid;
}

void h_forget(pid_t pid)
{
	for (int i = 0; i < h_nchildren; i++)
		if (h_children[i] == pid)
			h_children[i] = 0;
}

void h_init(int argc, char **argv, const char *name)
{
	h_set_name(name);
	h_main_pid = getpid();
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	atexit(h_kill_everything);
	signal(SIGTERM, h_on_signal);
	signal(SIGINT, h_on_signal);
	signal(SIGABRT, h_on_signal);
	signal(SIGSEGV, h_on_signal);
	signal(SIGBUS, h_on_signal);
	if (argc < 2) {
		fprintf(stderr, "usage: %s KVPOOLD [KVCTL]\n", argv[0]);
		exit(H_FAIL);
	}
	h_daemon_path = argv[1];
	if (access(h_daemon_path, X_OK) < 0) {
		fprintf(stderr, "%s: SKIP: no kvpoold at %s\n", name, h_daemon_path);
		exit(H_SKIP);
	}
	if (argc > 2 && access(argv[2], X_OK) == 0)
		h_kvctl_path = argv[2];
}

/*
 * fork() a child that dies with this process (PR_SET_PDEATHSIG): the pid in
 * the parent, 0 in the child, which _exits with orphan_exit when this
 * process was gone before the death signal was set; -1 (with a message)
 * when fork failed.
 */
static pid_t h_fork_bound(int orphan_exit)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		h_fail("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(orphan_exit);
	}
	return pid;
}

/* ------------------------------------------------------------ daemon */

int h_daemon_dir(struct h_daemon *d, int world)
{
	memset(d, 0, sizeof(*d));
	const char *tmp = getenv("TMPDIR");
	if (!tmp || strlen(tmp) > 60)
		tmp = "/tmp";
	snprintf(d->dir, sizeof(d->dir), "%s/kvpool-it-XXXXXX", tmp);
	if (!mkdtemp(d->dir)) {
		h_fail("mkdtemp %s: %s", d->dir, strerror(errno));
		return -1;
	}
	if (world && chmod(d->dir, 0777) < 0) {
		h_fail("chmod %s: %s", d->dir, strerror(errno));
		return -1;
	}
	snprintf(d->sock, sizeof(d->sock), "%s/kvpoold.sock", d->dir);
	if (h_ndirs < H_MAX_DIRS)
		snprintf(h_dirs[h_ndirs++], sizeof(h_dirs[0]), "%s", d->dir);
	return 0;
}

pid_t h_daemon_spawn(struct h_daemon *d, const char *const *extra)
{
	const char *argv[64];
	char a_sock[256], a_layout[128];
	int n = 0;
	snprintf(a_sock, sizeof(a_sock), "--socket=%s", d->sock);
	snprintf(a_layout, sizeof(a_layout), "--layout=%s", H_LAYOUT);
	argv[n++] = h_daemon_path;
	argv[n++] = a_sock;
	argv[n++] = "--backend=shm";
	argv[n++] = "--foreground";
	argv[n++] = a_layout;
	for (int i = 0; extra && extra[i] && n < 63; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	d->runs++;
	snprintf(d->log, sizeof(d->log), "%s/kvpoold.%d.log", d->dir, d->runs);
	char cmd[2048];
	size_t off = 0;
	for (int i = 0; i < n && off < sizeof(cmd) - 1; i++)
		off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, "%s%s",
					i ? " " : "", argv[i]);
	h_log("starting: %s", cmd);

	pid_t pid = h_fork_bound(127);
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
			      0644);
		int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (nul >= 0)
			dup2(nul, 0);
		signal(SIGPIPE, SIG_DFL);
		execv(h_daemon_path, (char *const *)argv);
		dprintf(2, "exec %s: %s\n", h_daemon_path, strerror(errno));
		_exit(127);
	}
	h_remember(pid);
	return pid;
}

int h_daemon_alive(struct h_daemon *d)
{
	if (d->pid <= 0)
		return 0;
	int st;
	pid_t r = waitpid(d->pid, &st, WNOHANG);
	if (r == d->pid) {
		d->exit_status = st;
		h_forget(d->pid);
		d->pid = 0;
		return 0;
	}
	return 1;
}

void h_daemon_dump_log(const struct h_daemon *d)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return;
	fprintf(stderr, "---- %s ----\n", d->log);
	char line[1024];
	int lines = 0;
	while (fgets(line, sizeof(line), f) && lines++ < 200)
		fputs(line, stderr);
	fprintf(stderr, "---- end of %s ----\n", d->log);
	fclose(f);
}

static void describe_status(int st, char *buf, size_t len)
{
	if (WIFEXITED(st))
		snprintf(buf, len, "exited %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st),
			 strsignal(WTERMSIG(st)));
	else
		snprintf(buf, len, "status 0x%x", st);
}

int h_daemon_startv(struct h_daemon *d, int timeout_ms,
		    const char *const *extra)
{
	d->pid = h_daemon_spawn(d, extra);
	if (d->pid < 0) {
		d->pid = 0;
		return -1;
	}
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	char err[KVP_ERRLEN];
	int rc = 0;
	for (;;) {
		if (!h_daemon_alive(d)) {
			char s[96];
			describe_status(d->exit_status, s, sizeof(s));
			h_fail("kvpoold %s before it served %s", s, d->sock);
			h_daemon_dump_log(d);
			return -1;
		}
		/* Only try once the socket is there: a connect before that is
		 * a plain ENOENT and costs a library call each time. */
		if (access(d->sock, F_OK) == 0) {
			struct kvp_client *c = NULL;
			struct kvp_connect_opts o = { .socket = d->sock,
						      .name = "h_ready" };
			err[0] = 0;
			rc = kvp_connect(&c, &o, err, sizeof(err));
			if (rc == 0) {
				kvp_close(c);
				return 0;
			}
			/* The daemon itself answered: it serves. */
			if (rc == -EACCES || rc == -EPERM)
				return 0;
		}
		if (h_now_ms() > deadline) {
			h_fail("kvpoold (pid %d) did not serve %s within %d ms;"
			       " last connect: %d (%s)", (int)d->pid, d->sock,
			       timeout_ms, rc, err);
			h_daemon_dump_log(d);
			h_daemon_kill(d);
			return -1;
		}
		h_sleep_ms(5);
	}
}

/* The NULL-terminated flags of ap into extra[48], NULL-terminated. */
static void h_extra_flags(va_list ap, const char *extra[48])
{
	int n = 0;
	const char *s;
	while ((s = va_arg(ap, const char *)) != NULL && n < 47)
		extra[n++] = s;
	extra[n] = NULL;
}

int h_daemon_start(struct h_daemon *d, int timeout_ms, ...)
{
	const char *extra[48];
	va_list ap;
	va_start(ap, timeout_ms);
	h_extra_flags(ap, extra);
	va_end(ap);
	return h_daemon_startv(d, timeout_ms, extra);
}

int h_daemon_up(struct h_daemon *d, ...)
{
	const char *extra[48];
	va_list ap;
	va_start(ap, d);
	h_extra_flags(ap, extra);
	va_end(ap);
	if (h_daemon_dir(d, 0))
		return -1;
	return h_daemon_startv(d, 10000, extra);
}

int h_daemon_stop(struct h_daemon *d, int timeout_ms)
{
	if (d->pid <= 0) {
		char s[96];
		describe_status(d->exit_status, s, sizeof(s));
		h_fail("kvpoold was not running at stop (%s)", s);
		h_daemon_dump_log(d);
		return -1;
	}
	pid_t pid = d->pid;
	kill(pid, SIGTERM);
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	while (h_daemon_alive(d)) {
		if (h_now_ms() > deadline) {
			h_fail("kvpoold (pid %d) still running %d ms after SIGTERM",
			       (int)pid, timeout_ms);
			h_daemon_dump_log(d);
			h_daemon_kill(d);
			return -1;
		}
		h_sleep_ms(2);
	}
	int ret = 0;
	if (!WIFEXITED(d->exit_status) || WEXITSTATUS(d->exit_status) != 0) {
		char s[96];
		describe_status(d->exit_status, s, sizeof(s));
		h_fail("kvpoold %s on SIGTERM, expected exit 0", s);
		h_daemon_dump_log(d);
		ret = -1;
	}
	if (access(d->sock, F_OK) == 0) {
		h_fail("kvpoold left its socket %s behind after SIGTERM", d->sock);
		ret = -1;
	}
	return ret;
}

void h_daemon_kill(struct h_daemon *d)
{
	if (d->pid <= 0)
		return;
	kill(d->pid, SIGKILL);
	int st;
	if (waitpid(d->pid, &st, 0) == d->pid)
		d->exit_status = st;
	h_forget(d->pid);
	d->pid = 0;
}

void h_daemon_cleanup(struct h_daemon *d)
{
	h_daemon_kill(d);
	if (!d->dir[0] || getenv("KVPOOL_TEST_KEEP"))
		return;
	nftw(d->dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	for (int i = 0; i < h_ndirs; i++)
		if (!strcmp(h_dirs[i], d->dir))
			h_dirs[i][0] = 0;
}

int h_daemon_teardown(void **state)
{
	struct h_daemon *d = *state;
	if (d) {
		h_daemon_cleanup(d);
		free(d);
	}
	*state = NULL;
	return 0;
}

int h_daemon_end(struct h_daemon *d, int fail)
{
	if (fail)
		h_daemon_dump_log(d);
	h_daemon_cleanup(d);
	return fail ? H_FAIL : H_PASS;
}

int h_daemon_finish(struct h_daemon *d, int fail, uint64_t t0_ms)
{
	if (h_daemon_stop(d, 10000))
		fail = 1;
	h_log("%s in %" PRIu64 " ms", fail ? "FAIL" : "PASS", h_now_ms() - t0_ms);
	return h_daemon_end(d, fail);
}

int h_run_with_1_then_2_workers(int (*run)(int workers))
{
	int rc = run(1);
	if (rc == H_PASS)
		rc = run(2);
	return rc;
}

long h_proc_status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long v = -1;
	size_t fl = strlen(field);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, field, fl) && line[fl] == ':') {
			v = strtol(line + fl + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return v;
}

int h_proc_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* ------------------------------------------------------------ children */

struct fork_as {
	uid_t uid;
	gid_t gid;
	int drop;
};

static pid_t h_fork_common(const struct fork_as *as, int (*fn)(void *),
			   void *arg)
{
	pid_t parent = getpid();
	fflush(NULL);
	pid_t pid = h_fork_bound(H_FAIL);
	if (pid < 0)
		return -1;
	if (pid == 0) {
		/* The child owns none of the parent's daemons or dirs. */
		h_nchildren = 0;
		h_ndirs = 0;
		h_main_pid = getpid();
		if (as->drop) {
			if (setgroups(0, NULL) < 0 || setgid(as->gid) < 0 ||
			    setuid(as->uid) < 0) {
				h_log("cannot become uid %u gid %u: %s",
				      (unsigned)as->uid, (unsigned)as->gid,
				      strerror(errno));
				_exit(H_SKIP);
			}
			/* setuid clears the death signal: set it again. */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(H_FAIL);
		}
		int rc = fn(arg);
		fflush(NULL);
		_exit(rc);
	}
	h_remember(pid);
	return pid;
}

pid_t h_fork(int (*fn)(void *), void *arg)
{
	struct fork_as as = { 0 };
	return h_fork_common(&as, fn, arg);
}

pid_t h_fork_as(uid_t uid, gid_t gid, int (*fn)(void *), void *arg)
{
	struct fork_as as = { .uid = uid, .gid = gid, .drop = 1 };
	return h_fork_common(&as, fn, arg);
}

int h_wait(pid_t pid, int timeout_ms)
{
	uint64_t deadline = h_now_ms() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms);
	int st;
	for (;;) {
		pid_t r = waitpid(pid, &st, timeout_ms < 0 ? 0 : WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR) {
			h_fail("waitpid %d: %s", (int)pid, strerror(errno));
			h_forget(pid);
			return -1;
		}
		if (timeout_ms >= 0 && h_now_ms() > deadline) {
			h_fail("child %d still running after %d ms: killing it",
			       (int)pid, timeout_ms);
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			h_forget(pid);
			return -1;
		}
		h_sleep_ms(2);
	}
	h_forget(pid);
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return -1;
}

int h_wait_all(const pid_t *pids, int n, int timeout_ms)
{
	uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
	int bad = 0;
	for (int i = 0; i < n; i++) {
		int64_t left = (int64_t)deadline - (int64_t)h_now_ms();
		int rc = h_wait(pids[i], left < 0 ? 0 : (int)left);
		if (rc != 0) {
			if (rc > 0)
				h_log("child %d (#%d) exited %d%s", (int)pids[i], i,
				      rc, rc > 128 ? " (signal)" : "");
			bad++;
		}
	}
	return bad;
}

void *h_shared_zalloc(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		h_fail("mmap of %zu shared bytes: %s", bytes, strerror(errno));
		return NULL;
	}
	memset(p, 0, bytes);
	return p;
}

/* ------------------------------------------------------------ pipes */

int h_chan_open(struct h_chan *ch)
{
	if (pipe(ch->to_parent) < 0) {
		h_fail("pipe: %s", strerror(errno));
		return -1;
	}
	if (pipe(ch->to_child) < 0) {
		h_fail("pipe: %s", strerror(errno));
		close(ch->to_parent[0]);
		close(ch->to_parent[1]);
		return -1;
	}
	return 0;
}

void h_chan_child_side(struct h_chan *ch)
{
	close(ch->to_parent[0]);
	close(ch->to_child[1]);
}

void h_chan_parent_side(struct h_chan *ch)
{
	close(ch->to_parent[1]);
	close(ch->to_child[0]);
}

int h_chan_say(int fd, char b)
{
	if (write(fd, &b, 1) != 1) {
		h_log("pipe write failed");
		return -1;
	}
	return 0;
}

int h_chan_wait(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char b;
	if (poll(&p, 1, timeout_ms) <= 0 || read(fd, &b, 1) != 1)
		return -1;
	return b;
}
