/* SPDX-License-Identifier: MIT */
/*
 * kvpoold.c - the daemon's main: settings, start-up, the event loop, and a
 * clean shutdown.
 *
 * Start-up does everything that can fail for a reason the operator must see
 * (settings, tenants' memory, the socket) before daemonizing, and the
 * daemonized child reports back through a pipe, so `kvpoold` run from a
 * shell or a unit file exits non-zero with the reason when it cannot serve.
 *
 * The main thread then runs one epoll loop: the listening socket, every
 * client socket and pidfd, a signalfd, and the eventfd on which workers hand
 * back clients they stopped serving. Workers (worker.c) poll the rings.
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
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client.h"
#include "clock.h"
#include "devices.h"
#include "disk_engine.h"
#include "listener.h"
#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "reload.h"
#include "remote_engine.h"
#include "sd_service.h"
#include "worker.h"

/* A fatal start-up error: on the terminal while there is one, and in the log. */
__attribute__((format(printf, 2, 3)))
static void fatal(bool tty, const char *fmt, ...)
{
	char msg[KVP_ERRLEN + 128];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (tty && !log_to_journal())
		fprintf(stderr, "kvpoold: %s\n", msg);
	/* The journal: once, with its priority. */
	if (!tty || !log_to_stderr() || log_to_journal())
		log_err("%s", msg);
}

/* ------------------------------------------------------------ daemonizing */

/*
 * Double fork and setsid; the original process waits on a pipe for the
 * daemon's verdict and exits with it. Returns the pipe's write end in the
 * daemon, or -1 after a failure was reported.
 */
static int daemonize(void)
{
	int p[2], fd;
	unsigned char status = EXIT_RUNTIME;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0 || (pid = fork()) < 0) {
		fatal(true, "cannot daemonize: %s", strerror(errno));
		return -1;
	}
	if (pid > 0) {
		char msg[1 + KVP_ERRLEN];
		ssize_t n;

		close(p[1]);
		/* One write: the status byte, then a message when it failed
		 * after detaching (the pools of a cuda backend). */
		n = read(p[0], msg, sizeof(msg) - 1);
		if (n < 1) {
			status = EXIT_RUNTIME;
		} else {
			status = (unsigned char)msg[0];
			msg[n] = '\0';
			if (n > 1)
				fprintf(stderr, "kvpoold: %s\n", msg + 1);
		}
		_exit(status);
	}
	close(p[0]);
	if (setsid() < 0 || (pid = fork()) < 0)
		_exit(EXIT_RUNTIME);
	if (pid > 0)
		_exit(0); /* the session leader goes: no controlling tty, ever */
	if (chdir("/") < 0)
		_exit(EXIT_RUNTIME);
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		dup2(fd, STDIN_FILENO);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		if (fd > STDERR_FILENO)
			close(fd);
	}
	return p[1];
}

/* The verdict, and for a failure the message the parent prints. */
static void notify_parent_msg(int *fd, unsigned char status, const char *msg)
{
	char buf[1 + KVP_ERRLEN];
	size_t n = 1;

	if (*fd < 0)
		return;
	buf[0] = (char)status;
	if (msg && *msg) {
		n += strnlen(msg, KVP_ERRLEN - 1);
		memcpy(buf + 1, msg, n - 1);
	}
	if (write(*fd, buf, n) < 0) {
		/* The parent is gone; nobody is waiting for the verdict. */
	}
	close(*fd);
	*fd = -1;
}

static void notify_parent(int *fd, unsigned char status)
{
	notify_parent_msg(fd, status, NULL);
}

static int write_pidfile(const char *path)
{
	char buf[32];
	int fd, n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (write(fd, buf, (size_t)n) != n) {
		close(fd);
		return -EIO;
	}
	return close(fd) < 0 ? -errno : 0;
}

/* ------------------------------------------------------------ set-up */

/*
 * Every client costs descriptors (its socket, pidfd, shm mapping's fd while
 * attaching) and the default soft limit is often 1024: take the hard limit,
 * which is ours to take. Logged, so an operator who wonders why connections
 * are shed at EMFILE sees the number.
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;

		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			log_warn("cannot raise the descriptor limit from %llu to %llu: "
				 "%s", (unsigned long long)was,
				 (unsigned long long)rl.rlim_max, strerror(errno));
			return;
		}
	}
	log_info("descriptor limit %llu (RLIMIT_NOFILE)",
		 (unsigned long long)rl.rlim_cur);
}

static int watch_fd(struct server *s, int fd, struct watch *w)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = w };

	return epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static int server_events(struct server *s, const sigset_t *sigs, struct errbuf *e)
{
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	s->sigfd = signalfd(-1, sigs, SFD_CLOEXEC | SFD_NONBLOCK);
	s->retire_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->epfd < 0 || s->sigfd < 0 || s->retire_fd < 0)
		return errbuf_set(e, -errno, "epoll/signalfd/eventfd: %s", strerror(errno));
	s->sig_w.kind = WATCH_SIGNAL;
	s->retire_w.kind = WATCH_RETIRE;
	if (watch_fd(s, s->lis.fd, &s->lis.w) || watch_fd(s, s->sigfd, &s->sig_w) ||
	    watch_fd(s, s->retire_fd, &s->retire_w))
		return errbuf_set(e, -errno, "epoll_ctl: %s", strerror(errno));
	return 0;
}

static void server_init(struct server *s, const struct config *cfg)
{
	*s = (struct server){ .cfg = cfg, .epfd = -1, .sigfd = -1, .retire_fd = -1,
			      .started_real_ns = real_ns(), .started_mono_ns = mono_ns(),
			      .lis = { .fd = -1, .lock_fd = -1, .spare_fd = -1 } };
	pthread_mutex_init(&s->reg.lock, NULL);
	pthread_mutex_init(&s->retire_lock, NULL);
}

/* Stop serving: workers first, so no ring is touched while leases go. */
static void server_fini(struct server *s)
{
	if (s->lis.fd >= 0 && s->epfd >= 0)
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->lis.fd, NULL);
	workers_stop(s);
	metrics_close(s); /* its scrapes read the tenants, destroyed below */
	s->retired = NULL; /* still registered: finalized below */
	while (s->reg.head)
		client_finalize(s, s->reg.head);
	while (s->pending)
		client_finalize(s, s->pending);
	client_bury(s);
	listener_close(&s->lis, s->cfg);
	tenants_destroy(&s->tenants);
	if (s->epfd >= 0)
		close(s->epfd);
	if (s->sigfd >= 0)
		close(s->sigfd);
	if (s->retire_fd >= 0)
		close(s->retire_fd);
	pthread_mutex_destroy(&s->reg.lock);
	pthread_mutex_destroy(&s->retire_lock);
}

/* ------------------------------------------------------------ the loop */

static void on_signal(struct server *s)
{
	struct signalfd_siginfo si;

	while (read(s->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			log_info("SIGHUP from pid %" PRIu32 ": log reopened, settings "
				 "re-read", si.ssi_pid);
			reload_run(s);
			continue;
		}
		log_info("%s from pid %" PRIu32 ": shutting down",
			 strsignal((int)si.ssi_signo), si.ssi_pid);
		s->stopping = true;
	}
}

static void dispatch(struct server *s, struct watch *w, uint32_t events)
{
	struct client *c;

	switch (w->kind) {
	case WATCH_LISTEN:
		listener_accept(s);
		break;
	case WATCH_SIGNAL:
		on_signal(s);
		break;
	case WATCH_RETIRE:
		client_reap_retired(s);
		break;
	case WATCH_CLIENT_SOCK:
		c = container_of(w, struct client, sock_w);
		if (c->freed)
			break; /* finalized earlier in this batch */
		if (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP))
			listener_hangup(s, c, "hung up");
		else
			listener_readable(s, c);
		break;
	case WATCH_CLIENT_PID:
		c = container_of(w, struct client, pid_w);
		if (!c->freed)
			listener_hangup(s, c, "process exited");
		break;
	}
}

/* The sooner of two timeouts in ms, -1 being none. */
static int sooner(int a, int b)
{
	return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

static void status_line(char *buf, unsigned len, void *arg)
{
	metrics_status_line(arg, buf, len);
}

static int serve(struct server *s)
{
	struct epoll_event ev[64];

	while (!s->stopping) {
		/* Timers: hello timeouts, a paused listener, log summaries,
		 * the service manager's watchdog and status. */
		uint64_t now = log_now_ms();
		int timeout = sooner(listener_tick(s, now), log_flush_suppressed(now));
		int n;

		timeout = sooner(timeout, sd_service_tick(now, status_line, s));
		n = epoll_wait(s->epfd, ev, 64, timeout);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			log_err("epoll_wait: %s", strerror(errno));
			return EXIT_RUNTIME;
		}
		for (int i = 0; i < n; i++)
			dispatch(s, ev[i].data.ptr, ev[i].events);
		/* Only now: a later event of this batch may name a client
		 * that an earlier one finalized. */
		client_bury(s);
	}
	return 0;
}

/* ------------------------------------------------------------ main */

/* `devices = all` resolved as the backend opens, then the pools. */
static int pools_create(struct server *s, struct config *cfg, struct errbuf *e)
{
	int ret = devices_resolve(cfg, e);

	return ret ? ret : tenants_create(&s->tenants, cfg, e);
}

static int start(struct server *s, struct config *cfg, const sigset_t *sigs)
{
	struct errbuf e = { .msg = "" };
	char err[KVP_ERRLEN], devs[DEVICES_MAX * 6];
	/* The pools are made after the fork that detaches, whatever the
	 * backend: CUDA does not survive fork(), and a fork copies only the
	 * calling thread, so the threads the pools start (each shard set's
	 * reclaimer, the disk and remote tiers' threads) would be gone in
	 * the daemon and a lock one held at the fork held for ever. The
	 * daemonized process reports a failure back through the pipe. */
	bool late = !cfg->foreground;
	int ret, notify = -1;

	/* The socket first: a second instance should fail before it
	 * allocates a pool. */
	ret = listener_open(&s->lis, cfg, &e);
	if (!ret && !late)
		ret = pools_create(s, cfg, &e);
	if (ret) {
		fatal(true, "%s", e.msg);
		return EXIT_RUNTIME;
	}
	if (!cfg->foreground) {
		notify = daemonize();
		if (notify < 0)
			return EXIT_RUNTIME;
		if (!cfg->log && log_open(NULL, true, err, sizeof(err)) < 0)
			return EXIT_RUNTIME; /* syslog cannot fail to open */
	}
	if (late && (ret = pools_create(s, cfg, &e)) != 0) {
		notify_parent_msg(&notify, EXIT_RUNTIME, e.msg);
		log_err("%s", e.msg);
		return EXIT_RUNTIME;
	}
	if (cfg->pidfile && (ret = write_pidfile(cfg->pidfile)) < 0) {
		fatal(cfg->foreground, "pidfile %s: %s", cfg->pidfile, strerror(-ret));
		notify_parent(&notify, EXIT_RUNTIME);
		return EXIT_RUNTIME;
	}
	ret = server_events(s, sigs, &e);
	if (!ret)
		ret = metrics_open(s, ops_name, &e);
	if (!ret)
		ret = workers_start(s, &e);
	if (!ret)
		ret = metrics_serve(s, &e);
	if (ret) {
		fatal(cfg->foreground, "%s", e.msg);
		if (cfg->pidfile)
			unlink(cfg->pidfile);
		notify_parent(&notify, EXIT_RUNTIME);
		return EXIT_RUNTIME;
	}
	config_devices_format(cfg, devs, sizeof(devs));
	if (s->tenants.npools == 1 && !strcmp(s->tenants.backend, "shm"))
		log_info("serving %s: backend %s, %" PRIu32 " tenant(s), %" PRIu32
			 " worker(s), spin %" PRIu32 " us, layout %s (%" PRIu64
			 " bytes/page)", cfg->socket, s->tenants.backend,
			 s->tenants.n, s->nworkers, cfg->spin_us, cfg->layout_spec,
			 cfg->layout.page_bytes);
	else
		log_info("serving %s: backend %s, %" PRIu32 " pool(s) on devices %s, %"
			 PRIu32 " tenant(s), %" PRIu32 " worker(s), spin %" PRIu32
			 " us, layout %s (%" PRIu64 " bytes/page)", cfg->socket,
			 s->tenants.backend, s->tenants.npools, devs, s->tenants.n,
			 s->nworkers, cfg->spin_us, cfg->layout_spec,
			 cfg->layout.page_bytes);
	notify_parent(&notify, 0);
	if (sd_service_notifying()) {
		metrics_status_line(s, err, sizeof(err));
		sd_service_ready(err);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct config cfg;
	struct server s;
	char err[KVP_ERRLEN];
	sigset_t sigs;
	int ret;

	ret = config_load(&cfg, argc, argv);
	if (ret) {
		config_free(&cfg);
		return ret == CONFIG_EXIT_OK ? 0 : ret;
	}
	if (log_open(cfg.log, false, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvpoold: %s\n", err);
		config_free(&cfg);
		return EXIT_USAGE;
	}
	log_set_level((int)cfg.log_level);
	config_warn_memory(&cfg);
	reload_init(argc, argv);
	/* Blocked before any thread exists, so every thread inherits it and
	 * only the signalfd sees these. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	raise_fd_limit();
	tenant_client_caps_log(&cfg, "");
	/* The engine names no tier: it is handed them, once (tier.h). */
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);

	server_init(&s, &cfg);
	ret = start(&s, &cfg, &sigs);
	if (!ret) {
		ret = serve(&s);
		sd_service_stopping();
		server_fini(&s);
		if (cfg.pidfile)
			unlink(cfg.pidfile);
		log_flush_all(); /* what a flood left unsaid */
		log_info("stopped");
	} else {
		server_fini(&s);
	}
	log_close();
	config_free(&cfg);
	return ret;
}
