/* SPDX-License-Identifier: MIT */
/*
 * sd_service.c - socket activation and sd_notify for kvpoold (sd_service.h).
 *
 * libsystemd rather than the protocol by hand: the notify datagram and
 * LISTEN_FDS/LISTEN_PID are small, but sd-daemon is the reference that
 * tracks systemd's changes (abstract NOTIFY_SOCKET, vsock, fd names).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "sd_service.h"

int sd_service_listen_fd(const char *path, struct errbuf *e)
{
	int n = sd_listen_fds(1), fd = SD_LISTEN_FDS_START, fl;

	if (n == 0)
		return -ENOENT;
	if (n < 0)
		return errbuf_set(e, n, "socket activation: LISTEN_FDS: %s",
				  strerror(-n));
	if (n > 1)
		return errbuf_set(e, -EINVAL, "socket activation: %d sockets passed; "
				  "kvpoold.socket must have one ListenSequentialPacket=", n);
	if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, path, 0) <= 0)
		return errbuf_set(e, -EINVAL, "socket activation: the socket passed is "
				  "not a listening SOCK_SEQPACKET Unix socket at %s; make "
				  "kvpoold.socket's ListenSequentialPacket= the same path "
				  "as kvpoold's socket setting", path);
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return errbuf_set(e, -errno, "socket activation: fcntl: %s",
				  strerror(errno));
	return fd;
}

int sd_service_notifying(void)
{
	const char *s = getenv("NOTIFY_SOCKET");

	return s && *s;
}

void sd_service_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void sd_service_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}

void sd_service_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

uint64_t sd_service_watchdog_ms(void)
{
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) <= 0 || !usec)
		return 0;
	return usec / 2000 ? usec / 2000 : 1;
}

void sd_service_watchdog_ping(void)
{
	sd_notify(0, "WATCHDOG=1");
}

int sd_service_tick(uint64_t now_ms, sd_status_fn status, void *arg)
{
	static uint64_t wd_ms, wd_next, status_next;
	static int init, notifying;
	int64_t next = -1;

	if (!init) {
		init = 1;
		notifying = sd_service_notifying();
		wd_ms = sd_service_watchdog_ms();
		wd_next = now_ms;
		status_next = now_ms + SD_STATUS_MS;
	}
	if (wd_ms) {
		if (now_ms >= wd_next) {
			sd_service_watchdog_ping();
			wd_next = now_ms + wd_ms;
		}
		next = (int64_t)(wd_next - now_ms);
	}
	if (notifying) {
		if (now_ms >= status_next) {
			char buf[256];

			status(buf, sizeof(buf), arg);
			sd_service_status(buf);
			status_next = now_ms + SD_STATUS_MS;
		}
		if (next < 0 || (int64_t)(status_next - now_ms) < next)
			next = (int64_t)(status_next - now_ms);
	}
	return (int)next;
}
