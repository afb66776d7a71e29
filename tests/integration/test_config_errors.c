/* SPDX-License-Identifier: MIT */
/*
 * test_config_errors - a --config that cannot be read stops kvpoold before
 * it starts anything: exit status 2, a message naming the path and the
 * reason, no socket, no pidfile, in the foreground and when daemonizing.
 * The configs: a directory (open succeeds, read fails with EISDIR), a file
 * that does not exist, a file the daemon's uid may not read (as root: the
 * daemon runs as nobody), and /proc/self/mem (open succeeds, the first read,
 * at address 0, fails with EIO).
 *
 * Before the fix a read error was taken for the end of the file: the daemon
 * went on with the built-in defaults (no tenants, open to anyone who can
 * reach the socket). A read error part-way through a file is the same path
 * (getline fails, ferror is set); tests/unit/test_config_read.c injects one
 * after the first lines.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define NOBODY 65534

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

static char *slurp(const char *path)
{
	static char buf[16384];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? 0 : read(fd, buf, sizeof(buf) - 1);

	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

/* A daemonized kvpoold the old code left running: kill it by its pidfile. */
static void kill_stray(const char *pidfile)
{
	long pid = strtol(slurp(pidfile), NULL, 10);

	if (pid > 1) {
		h_fail("a kvpoold (pid %ld) was started anyway: killing it", pid);
		kill((pid_t)pid, SIGKILL);
	}
}

/* For the run as nobody: exec kvpoold with argv, output to the log. */
struct as_nobody {
	const char *log;
	const char *const *argv;
};

static int exec_daemon(void *arg)
{
	const struct as_nobody *a = arg;
	int fd = open(a->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);

	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	execv(h_daemon_path, (char *const *)a->argv);
	dprintf(2, "exec %s: %s\n", h_daemon_path, strerror(errno));
	return 127;
}

/*
 * kvpoold --config=config (as nobody when drop) must exit 2 at once, saying
 * "config" and why (reason), and create neither its socket nor its pidfile.
 */
static void expect_refused(const char *what, const char *config,
			   const char *reason, int drop, int daemonize)
{
	struct h_daemon d;
	char a_config[512], a_pid[256], pidfile[192], a_sock[256], a_layout[128];
	const char *extra[4] = { a_config, a_pid, NULL, NULL };
	struct stat st;
	pid_t pid;
	int rc;

	if (h_daemon_dir(&d, drop)) {
		g_bad++;
		return;
	}
	h_log("%s: --config=%s%s%s", what, config, drop ? " (as nobody)" : "",
	      daemonize ? " (daemonizing)" : "");
	snprintf(a_config, sizeof(a_config), "--config=%s", config);
	snprintf(pidfile, sizeof(pidfile), "%s/kvpoold.pid", d.dir);
	snprintf(a_pid, sizeof(a_pid), "--pidfile=%s", pidfile);
	if (daemonize)
		extra[2] = "--foreground=no"; /* later flags win */
	if (!drop) {
		pid = h_daemon_spawn(&d, extra);
	} else {
		const char *argv[] = { h_daemon_path, a_sock, "--backend=shm",
				       "--foreground", a_layout, a_config, a_pid, NULL };
		struct as_nobody an = { d.log, argv };

		snprintf(a_sock, sizeof(a_sock), "--socket=%s", d.sock);
		snprintf(a_layout, sizeof(a_layout), "--layout=%s", H_LAYOUT);
		snprintf(d.log, sizeof(d.log), "%s/kvpoold.1.log", d.dir);
		pid = h_fork_as(NOBODY, NOBODY, exec_daemon, &an);
	}
	if (pid < 0) {
		g_bad++;
		h_daemon_cleanup(&d);
		return;
	}
	rc = h_wait(pid, 5000);
	if (rc == 0)
		h_sleep_ms(500); /* a daemonized child writes its pidfile */
	const char *log = slurp(d.log);

	CHECK(rc == 2, "%s: kvpoold exited %d, expected 2 (a configuration it "
	      "cannot read)", what, rc);
	CHECK(strstr(log, config) && strstr(log, reason),
	      "%s: the message should name %s and say \"%s\"; it was: %s",
	      what, config, reason, log);
	CHECK(lstat(d.sock, &st) < 0 && errno == ENOENT,
	      "%s: the socket %s was created", what, d.sock);
	if (lstat(pidfile, &st) == 0)
		kill_stray(pidfile);
	if (h_daemon_alive(&d))
		h_daemon_kill(&d);
	h_daemon_cleanup(&d);
}

int main(int argc, char **argv)
{
	uint64_t t0 = h_now_ms();
	struct h_daemon tmp;
	char dir[256], missing[256], unreadable[256];
	int fd;

	h_init(argc, argv, "test_config_errors");
	/* The files live in a dir of their own, world-searchable for nobody. */
	if (h_daemon_dir(&tmp, 1))
		return H_FAIL;
	snprintf(dir, sizeof(dir), "%s/conf.d", tmp.dir);
	snprintf(missing, sizeof(missing), "%s/missing.conf", tmp.dir);
	snprintf(unreadable, sizeof(unreadable), "%s/unreadable.conf", tmp.dir);
	fd = open(unreadable, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (mkdir(dir, 0755) < 0 || fd < 0 ||
	    dprintf(fd, "device_mem = 4M\n[tenant a]\nuids = 1\n") < 0) {
		h_fail("making the configs under %s: %s", tmp.dir, strerror(errno));
		return H_FAIL;
	}
	close(fd);
	if (chmod(unreadable, 0) < 0) {
		h_fail("chmod %s: %s", unreadable, strerror(errno));
		return H_FAIL;
	}

	expect_refused("a directory", dir, strerror(EISDIR), 0, 0);
	expect_refused("a directory", dir, strerror(EISDIR), 0, 1);
	expect_refused("a missing file", missing, strerror(ENOENT), 0, 0);
	/* root reads a mode-0 file anyway: the daemon runs as nobody then */
	expect_refused("an unreadable file", unreadable, strerror(EACCES),
		       geteuid() == 0, 0);
	expect_refused("a read error", "/proc/self/mem", strerror(EIO), 0, 0);

	h_daemon_cleanup(&tmp);
	h_log("%s in %" PRIu64 " ms", g_bad ? "FAIL" : "PASS", h_now_ms() - t0);
	return g_bad ? H_FAIL : H_PASS;
}
