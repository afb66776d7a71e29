/* SPDX-License-Identifier: MIT */
/*
 * sd_service.h - kvpoold as a systemd service (etc/systemd): socket
 * activation, Type=notify readiness, status and stopping, and the watchdog,
 * through libsystemd's sd-daemon calls.
 *
 * Every call is a no-op outside systemd (no LISTEN_FDS, no NOTIFY_SOCKET,
 * no WATCHDOG_USEC), so the same binary runs from a shell, from a script
 * that daemonizes it, and from the unit.
 */
#ifndef KVPOOLD_SD_SERVICE_H
#define KVPOOLD_SD_SERVICE_H

#include <stdint.h>

#include "kvpool_engine.h"

/*
 * The listening socket systemd passed (kvpoold.socket), checked to be a
 * listening AF_UNIX SOCK_SEQPACKET socket bound to path; made non-blocking
 * and close-on-exec. Returns the fd, -ENOENT when nothing was passed (bind
 * the socket yourself), or another -errno with e.
 */
int sd_service_listen_fd(const char *path, struct errbuf *e);

/* READY=1 with a STATUS= line. */
void sd_service_ready(const char *status);
/* STATUS= alone (what `systemctl status` shows). */
void sd_service_status(const char *status);
/* STOPPING=1: a clean shutdown has begun. */
void sd_service_stopping(void);

/* Whether kvpoold reports to a service manager (NOTIFY_SOCKET is set). */
int sd_service_notifying(void);

/*
 * The watchdog: 0 when WatchdogSec= is off, else how often to ping, ms
 * (half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises).
 */
uint64_t sd_service_watchdog_ms(void);
void sd_service_watchdog_ping(void);

/*
 * For the main loop, on every turn: ping the watchdog when due and, under
 * a service manager, refresh STATUS= (status(buf, len, arg) writes it)
 * every SD_STATUS_MS. Returns the ms until the next is due, -1 for never.
 * The watchdog's ping comes from the loop that serves the socket: a loop
 * that stops turning is what it should catch.
 */
#define SD_STATUS_MS 10000
typedef void (*sd_status_fn)(char *buf, unsigned len, void *arg);
int sd_service_tick(uint64_t now_ms, sd_status_fn status, void *arg);

#endif /* KVPOOLD_SD_SERVICE_H */
