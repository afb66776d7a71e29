/* SPDX-License-Identifier: MIT */
/*
 * daemon_proc.c - start and stop a private kvpoold; sample a process's
 * threads through /proc. See daemon_proc.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bug.h"
#include "clock.h"
#include "daemon_proc.h"
#include "kvbench.h"
#include "kvpool.h"

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void describe_status(int st, char *buf, size_t len)
{
	if (WIFEXITED(st))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st),
			 strsignal(WTERMSIG(st)));
	else
		snprintf(buf, len, "ended with wait status 0x%x", st);
}

/* The log's last lines on stderr, each prefixed, so a failure explains itself. */
static void dump_log(const struct kvb_daemon *d)
{
	char buf[2048];
	FILE *f = fopen(d->log, "r");
	long size;
	size_t n;
	char *p, *line;

	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (!n)
		return;
	p = buf;
	if (size > (long)sizeof(buf) - 1 && (line = strchr(p, '\n')))
		p = line + 1; /* skip a partial first line */
	fprintf(stderr, "kvbench: last lines of kvpoold's log (%s):\n", d->log);
	for (line = strtok(p, "\n"); line; line = strtok(NULL, "\n"))
		fprintf(stderr, "  | %s\n", line);
}

static void remove_dir(struct kvb_daemon *d)
{
	if (!d->dir[0])
		return;
	unlink(d->log);
	unlink(d->sock);
	rmdir(d->dir);
	d->dir[0] = '\0';
}

/* ------------------------------------------------------------ find */

int kvb_daemon_find(const char *override, char *out, size_t outlen,
		    char *err, size_t errlen)
{
	char self[PATH_MAX];
	ssize_t n;

	if (override) {
		if (access(override, X_OK) < 0) {
			int rc = -errno;

			snprintf(err, errlen, "--kvpoold %s: %s", override, strerror(errno));
			return rc;
		}
		snprintf(out, outlen, "%s", override);
		return 0;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0) {
		snprintf(err, errlen, "cannot find kvpoold: readlink /proc/self/exe: %s; "
			 "give --kvpoold PATH or --socket PATH of a running one",
			 strerror(errno));
		return -ENOENT;
	}
	self[n] = '\0';
	if ((size_t)snprintf(out, outlen, "%s/kvpoold", dirname(self)) >= outlen ||
	    access(out, X_OK) < 0) {
		snprintf(err, errlen, "no kvpoold next to kvbench (%.200s); give --kvpoold PATH, "
			 "or --socket PATH of a running kvpoold", out);
		return -ENOENT;
	}
	return 0;
}

/* A CPU this process may run on, or "none" (*cpu = -1); 0 or -EINVAL with a
 * message in err. */
static int parse_cpu(const char *opt, const char *arg, int *cpu, char *err,
		     size_t errlen)
{
	cpu_set_t allowed;
	char *end;
	long v;

	if (!strcmp(arg, "none")) {
		*cpu = -1;
		return 0;
	}
	errno = 0;
	v = strtol(arg, &end, 10);
	if (end == arg || *end || errno || v < 0 || v >= CPU_SETSIZE) {
		snprintf(err, errlen, "%s: '%s' is not a CPU number or 'none'", opt, arg);
		return -EINVAL;
	}
	if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 &&
	    !CPU_ISSET((int)v, &allowed)) {
		snprintf(err, errlen, "%s: CPU %ld is not one this process may run on", opt, v);
		return -EINVAL;
	}
	*cpu = (int)v;
	return 0;
}

int kvb_daemon_opt(const char *sub, int code, const char *arg,
		   struct kvb_daemon_opts *o)
{
	char err[KVP_ERRLEN];
	uint64_t v;
	int rc;

	switch (code) {
	case KVB_OPT_SOCKET:
		if (!*arg)
			return kvb_usage_error(sub, "--socket: give the path of kvpoold's socket");
		o->socket = arg;
		return -1;
	case KVB_OPT_KVPOOLD:
		if (access(arg, X_OK) < 0)
			return kvb_usage_error(sub, "--kvpoold %s: %s", arg, strerror(errno));
		o->kvpoold = arg;
		return -1;
	case KVB_OPT_SPIN:
		rc = kvb_opt_count(sub, "--spin-us", arg, 0, 10000000, &v);
		if (rc < 0)
			o->spin_us = (int64_t)v;
		return rc;
	case KVB_OPT_CLIENT_SPIN:
		return kvb_opt_count(sub, "--client-spin-us", arg, 1, 10000000,
				     &o->client_spin_us);
	case KVB_OPT_DAEMON_CPU:
		if (parse_cpu("--daemon-cpu", arg, &o->cpu, err, sizeof(err)))
			return kvb_usage_error(sub, "%s", err);
		return -1;
	case KVB_OPT_WORKERS:
		return kvb_opt_count(sub, "--workers", arg, 1, 64, &o->workers);
	case KVB_OPT_DISK_DIR:
		if (access(arg, W_OK | X_OK) < 0)
			return kvb_usage_error(sub, "--disk-dir %s: %s; give a writable "
					       "directory", arg, strerror(errno));
		o->disk_dir = arg;
		return -1;
	case KVB_OPT_DISK_SIZE:
		if (kvb_opt_bytes(arg, &o->disk_size) || !o->disk_size)
			return kvb_usage_error(sub, "--disk-size '%s': give bytes with an "
					       "optional K, M or G suffix", arg);
		return -1;
	case KVB_OPT_DAEMON_FLAG:
		if (strncmp(arg, "--", 2) || !strchr(arg, '=') || strlen(arg) >= 320)
			return kvb_usage_error(sub, "--daemon-flag '%s': give one kvpoold "
					       "flag as --KEY=VALUE (kvpoold --help "
					       "lists them)", arg);
		if (o->nflag >= KVB_DAEMON_EXTRA)
			return kvb_usage_error(sub, "--daemon-flag: %d at most",
					       KVB_DAEMON_EXTRA);
		o->flag[o->nflag++] = arg;
		return -1;
	}
	KVP_BUG("every option code in long_opts has a case here");
}

/* ------------------------------------------------------------ start / stop */

static int spawn(struct kvb_daemon *d, const char *const *argv, int cpu)
{
	pid_t parent = getpid();
	int logfd, nul;
	pid_t pid;

	logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (logfd < 0)
		return -errno;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		int rc = -errno;

		close(logfd);
		return rc;
	}
	if (pid == 0) {
		/* If kvbench dies, so does its daemon (it exits cleanly on TERM). */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (nul >= 0)
			dup2(nul, STDIN_FILENO);
		dup2(logfd, STDOUT_FILENO);
		dup2(logfd, STDERR_FILENO);
		signal(SIGPIPE, SIG_DFL);
		if (cpu >= 0) {
			cpu_set_t set;

			CPU_ZERO(&set);
			CPU_SET(cpu, &set);
			if (sched_setaffinity(0, sizeof(set), &set) < 0) {
				dprintf(STDERR_FILENO, "kvbench: cannot pin kvpoold to CPU %d: %s\n",
					cpu, strerror(errno));
				_exit(127);
			}
		}
		execv(d->path, (char *const *)argv);
		dprintf(STDERR_FILENO, "kvbench: exec %s: %s\n", d->path, strerror(errno));
		_exit(127);
	}
	close(logfd);
	d->pid = pid;
	return 0;
}

/* 1 when the daemon has exited (status in d->exit_status), else 0. */
static int reaped(struct kvb_daemon *d)
{
	int st;

	if (d->pid <= 0)
		return 1;
	if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
		d->exit_status = st;
		d->pid = 0;
		return 1;
	}
	return 0;
}

int kvb_daemon_start(struct kvb_daemon *d, const char *path,
		     const char *const *flags, int cpu, int timeout_ms, char *err,
		     size_t errlen)
{
	const char *argv[KVB_DAEMON_MAX_FLAGS + 6];
	char a_sock[300], cerr[KVP_ERRLEN] = "", status[96];
	const char *tmp = getenv("TMPDIR");
	uint64_t deadline;
	size_t off = 0;
	int n = 0, rc = 0;

	memset(d, 0, sizeof(*d));
	snprintf(d->path, sizeof(d->path), "%s", path);
	/* A socket path must fit sun_path (108 bytes): keep the prefix short. */
	if (!tmp || !*tmp || strlen(tmp) > 64)
		tmp = "/tmp";
	snprintf(d->dir, sizeof(d->dir), "%s/kvbench-XXXXXX", tmp);
	if (!mkdtemp(d->dir)) {
		rc = -errno;
		snprintf(err, errlen, "mkdtemp %s: %s", d->dir, strerror(errno));
		d->dir[0] = '\0';
		return rc;
	}
	snprintf(d->sock, sizeof(d->sock), "%s/kvpoold.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
	snprintf(a_sock, sizeof(a_sock), "--socket=%s", d->sock);

	argv[n++] = d->path;
	argv[n++] = a_sock;
	argv[n++] = "--backend=shm";
	argv[n++] = "--foreground";
	for (int i = 0; flags && flags[i] && i < KVB_DAEMON_MAX_FLAGS; i++)
		argv[n++] = flags[i];
	argv[n] = NULL;
	for (int i = 0; i < n && off < sizeof(d->command) - 1; i++)
		off += (size_t)snprintf(d->command + off, sizeof(d->command) - off,
					"%s%s", i ? " " : "", argv[i]);

	rc = spawn(d, argv, cpu);
	if (rc) {
		snprintf(err, errlen, "cannot start %s: %s", d->path, strerror(-rc));
		remove_dir(d);
		return rc;
	}

	deadline = mono_ms() + (uint64_t)timeout_ms;
	for (;;) {
		if (reaped(d)) {
			describe_status(d->exit_status, status, sizeof(status));
			snprintf(err, errlen, "kvpoold %s before it served %s (started as: %.900s)",
				 status, d->sock, d->command);
			dump_log(d);
			remove_dir(d);
			return -ECHILD;
		}
		if (access(d->sock, F_OK) == 0) {
			struct kvp_connect_opts o = { .socket = d->sock, .name = "kvbench-ready" };
			struct kvp_client *c = NULL;

			cerr[0] = '\0';
			rc = kvp_connect(&c, &o, cerr, sizeof(cerr));
			if (rc == 0) {
				kvp_close(c);
				return 0;
			}
		}
		if (mono_ms() > deadline) {
			snprintf(err, errlen, "kvpoold (pid %d) did not serve %s within %d ms%s%s",
				 (int)d->pid, d->sock, timeout_ms,
				 cerr[0] ? "; last connect: " : "", cerr);
			dump_log(d);
			kvb_daemon_stop(d, 2000, status, sizeof(status));
			return -ETIMEDOUT;
		}
		sleep_ms(5);
	}
}

int kvb_daemon_stop(struct kvb_daemon *d, int timeout_ms, char *err,
		    size_t errlen)
{
	uint64_t deadline;
	char status[96];
	int rc = 0;

	if (d->pid <= 0) {
		remove_dir(d);
		return 0;
	}
	kill(d->pid, SIGTERM);
	deadline = mono_ms() + (uint64_t)timeout_ms;
	while (!reaped(d)) {
		if (mono_ms() > deadline) {
			snprintf(err, errlen, "kvpoold (pid %d) still ran %d ms after SIGTERM; killed it",
				 (int)d->pid, timeout_ms);
			dump_log(d);
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			d->pid = 0;
			remove_dir(d);
			return -1;
		}
		sleep_ms(2);
	}
	if (!WIFEXITED(d->exit_status) || WEXITSTATUS(d->exit_status) != 0) {
		describe_status(d->exit_status, status, sizeof(status));
		snprintf(err, errlen, "kvpoold %s on SIGTERM (expected 0)", status);
		dump_log(d);
		rc = -1;
	}
	remove_dir(d);
	return rc;
}

int kvb_daemon_tail_flags(const struct kvb_daemon_opts *o, char (*f)[320])
{
	int n = 0;

	if (o->disk_dir) {
		snprintf(f[n++], sizeof(f[0]), "--disk_dir=%s", o->disk_dir);
		/* No size given: as much disk as host and device memory. */
		snprintf(f[n++], sizeof(f[0]), "--disk_size=%llu", (unsigned long long)
			 (o->disk_size ? o->disk_size : o->device_mem + o->host_mem));
	}
	/* Last: a later flag wins over one made here. */
	for (int i = 0; i < o->nflag; i++)
		snprintf(f[n++], sizeof(f[0]), "%s", o->flag[i]);
	return n;
}

int kvb_daemon_open(struct kvb_daemon *d, const struct kvb_daemon_opts *o,
		    const char **socket, char *err, size_t errlen)
{
	char path[PATH_MAX], f[8 + KVB_DAEMON_EXTRA][320];
	const char *flags[9 + KVB_DAEMON_EXTRA];
	int n = 0, rc;

	memset(d, 0, sizeof(*d));
	if (o->socket) {
		*socket = o->socket;
		return 0;
	}
	rc = kvb_daemon_find(o->kvpoold, path, sizeof(path), err, errlen);
	if (rc)
		return rc;
	if (o->spin_us >= 0)
		snprintf(f[n++], sizeof(f[0]), "--spin_us=%lld", (long long)o->spin_us);
	if (o->workers)
		snprintf(f[n++], sizeof(f[0]), "--workers=%llu", (unsigned long long)o->workers);
	if (o->device_mem)
		snprintf(f[n++], sizeof(f[0]), "--device_mem=%lluK",
			 (unsigned long long)((o->device_mem + 1023) / 1024));
	snprintf(f[n++], sizeof(f[0]), "--host_mem=%lluK",
		 (unsigned long long)((o->host_mem + 1023) / 1024));
	if (o->max_tokens)
		snprintf(f[n++], sizeof(f[0]), "--max_tokens_per_user=%llu",
			 (unsigned long long)o->max_tokens);
	if (o->layout)
		snprintf(f[n++], sizeof(f[0]), "--layout=%s", o->layout);
	n += kvb_daemon_tail_flags(o, f + n);
	for (int i = 0; i < n; i++)
		flags[i] = f[i];
	flags[n] = NULL;
	rc = kvb_daemon_start(d, path, flags, o->cpu, 10000, err, errlen);
	if (rc)
		return rc;
	*socket = d->sock;
	return 0;
}

void json_daemon(struct json *j, const struct kvb_daemon *d,
		 const struct kvb_daemon_opts *o, const char *socket, pid_t pid)
{
	bool started = !o->socket;

	json_obj_begin(j, "daemon");
	json_bool(j, "started", started);
	json_str(j, "socket", socket);
	if (pid > 0)
		json_i64(j, "pid", pid);
	else
		json_null(j, "pid");
	if (started) {
		json_str(j, "path", d->path);
		json_str(j, "command", d->command);
		if (o->spin_us >= 0)
			json_i64(j, "spin_us", o->spin_us);
		else
			json_null(j, "spin_us");
		if (o->workers)
			json_u64(j, "workers", o->workers);
		else
			json_null(j, "workers");
		if (o->cpu >= 0)
			json_i64(j, "cpu", o->cpu);
		else
			json_null(j, "cpu");
		if (o->disk_dir) {
			json_str(j, "disk_dir", o->disk_dir);
			json_u64(j, "disk_size", o->disk_size ? o->disk_size :
				 o->device_mem + o->host_mem);
		} else {
			json_null(j, "disk_dir");
		}
	}
	json_obj_end(j);
}

void kvb_print_daemon(const struct kvb_daemon *d, const struct kvb_daemon_opts *o,
		      const char *socket)
{
	if (o->socket)
		printf("kvpoold: the running one at %s\n", socket);
	else
		printf("kvpoold: started here: %s\n", d->command);
}

/* ------------------------------------------------------------ /proc */

/*
 * CPU time of one thread in ns: schedstat's first field (time on the CPU,
 * ns resolution) where the kernel has it, else utime + stime from stat
 * (clock ticks). 0 when unreadable.
 */
static uint64_t thread_cpu_ns(pid_t pid, long tid)
{
	char path[128], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	long hz = sysconf(_SC_CLK_TCK);
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/task/%ld/schedstat", (int)pid, tid);
	f = fopen(path, "r");
	if (f) {
		int ok = fscanf(f, "%llu", &ut) == 1;

		fclose(f);
		if (ok)
			return ut;
	}
	snprintf(path, sizeof(path), "/proc/%d/task/%ld/stat", (int)pid, tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* Fields after the command (which may hold spaces) start past ')':
	 * state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
	 * cmajflt utime stime. */
	p = strrchr(buf, ')');
	if (!p || hz <= 0)
		return 0;
	if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
		   &ut, &st) != 2)
		return 0;
	return (ut + st) * (1000000000ull / (uint64_t)hz);
}

/* The CPU a thread last ran on (stat field 39), or -1. */
static int thread_last_cpu(pid_t pid, long tid)
{
	char path[128], buf[1024], *p;
	int cpu = -1, field = 2;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/task/%ld/stat", (int)pid, tid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	/* Field 3 (state) follows ") "; count spaces up to field 39. */
	for (p = p ? p + 1 : NULL; p && *p; p++) {
		if (*p == ' ' && ++field == 39) {
			cpu = atoi(p + 1);
			break;
		}
	}
	return cpu;
}

static void status_switches(const char *path, uint64_t *vol, uint64_t *invol)
{
	char line[256];
	unsigned long long v;
	FILE *f = fopen(path, "r");

	*vol = *invol = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1)
			*vol = v;
		else if (sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
			*invol = v;
	}
	fclose(f);
}

void kvb_proc_sample(pid_t pid, struct kvb_proc_sample *out)
{
	char path[128];
	struct dirent *de;
	DIR *dir;

	memset(out, 0, sizeof(*out));
	out->main_last_cpu = out->other_last_cpu = -1;
	if (pid <= 0)
		return;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	if (!dir)
		return;
	while ((de = readdir(dir))) {
		uint64_t cpu, v, iv;
		long tid;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		tid = strtol(de->d_name, NULL, 10);
		cpu = thread_cpu_ns(pid, tid);
		snprintf(path, sizeof(path), "/proc/%d/task/%ld/status", (int)pid, tid);
		status_switches(path, &v, &iv);
		if (tid == pid) {
			out->main_last_cpu = thread_last_cpu(pid, tid);
			out->main_cpu_ns = cpu;
			out->main_vcsw = v;
			out->main_ivcsw = iv;
		} else {
			if (out->other_last_cpu < 0)
				out->other_last_cpu = thread_last_cpu(pid, tid);
			out->other_cpu_ns += cpu;
			out->other_vcsw += v;
			out->other_ivcsw += iv;
		}
		out->threads++;
	}
	closedir(dir);
	out->ok = out->threads > 0;
}

pid_t kvb_peer_pid(int sock)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (sock < 0 || getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return -1;
	return cr.pid;
}
