/* SPDX-License-Identifier: MIT */
/*
 * reload.h - SIGHUP (and kvctl reload): re-read the settings, apply what
 * can change while clients are attached, name in the log what cannot.
 *
 * Applied: tenants' uids and gids, allow_uids, allow_gids, admin_uids (read
 * only by the main thread, at admission: swapped there), the tenants'
 * quotas max_tokens_per_user, max_chunks and chunk_memory_ratio (set in
 * every engine under its shard's mutex), and log_level. Refused, each with
 * a warning naming the key: everything that sizes or lays out memory, or
 * that the socket, workers or tenants' identities were made from.
 */
#ifndef KVPOOLD_RELOAD_H
#define KVPOOLD_RELOAD_H

#include <stddef.h>

struct server;

/* The command line to re-read the settings from (main's). */
void reload_init(int argc, char **argv);

/* Main thread only. Reopens the log first, then re-reads and applies.
 * Returns how many keys were refused, or -1 when the settings could not be
 * read (the running ones stay, the log says why). */
int reload_run(struct server *s);

/*
 * Any thread (kvctl reload's worker): SIGHUP, then wait up to timeout_ms
 * for a reload that starts after it to finish. 0 when every setting was
 * applied; -EINVAL when the settings could not be read (msg: why, the
 * config's own message); -EBUSY when keys were refused (msg names them);
 * -ETIMEDOUT. msg gets a line for the caller either way.
 */
int reload_request(int timeout_ms, char *msg, size_t len);

#endif /* KVPOOLD_RELOAD_H */
