/* SPDX-License-Identifier: MIT */
/*
 * top.c - the commands that repeat: `kvctl top` (a live screen, redrawn in
 * place on a terminal) and `kvctl stats --watch N` (the stats again every N
 * seconds, for scripts: each sample a table or one JSON object). Both stop
 * after --count frames, or at SIGINT/SIGTERM with exit status 0.
 *
 * What is drawn is render_top() (render_top.c); this file only samples the
 * daemon and keeps time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvctl.h"

#define TOP_USERS_MAX 65536 /* users listed per refresh; more are cut */

static volatile sig_atomic_t stop;

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_stop(int sig)
{
	stop = 1;
}

static void catch_stop(void)
{
	struct sigaction sa = { .sa_handler = on_stop };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* Sleep until deadline (CLOCK_MONOTONIC ns) or a stop signal. */
static void sleep_until(uint64_t deadline)
{
	struct timespec ts = { .tv_sec = (time_t)(deadline / 1000000000ull),
			       .tv_nsec = (long)(deadline % 1000000000ull) };

	while (!stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

int stats_watch(struct kvp_client *c, const struct kvctl_args *a,
		int (*once)(struct kvp_client *c, const struct kvctl_args *a))
{
	uint64_t next = mono_ns();
	int rc = KVCTL_EXIT_OK;

	catch_stop();
	for (uint64_t n = 0; !stop && (!a->count || n < a->count); n++) {
		if (n) {
			sleep_until(next);
			if (stop)
				break;
			if (!a->json)
				fputc('\n', stdout);
		}
		next += (uint64_t)a->interval_s * 1000000000ull;
		rc = once(c, a);
		fflush(stdout);
		if (rc != KVCTL_EXIT_OK)
			break;
	}
	return rc;
}

/* Every user this client may list, at most TOP_USERS_MAX. */
static int sample_users(struct kvp_client *c, struct top_sample *s)
{
	uint64_t cursor = 0, next;
	int n;

	s->nusers = 0;
	s->users_truncated = false;
	if (!s->users) {
		s->users = calloc(TOP_USERS_MAX, sizeof(*s->users));
		if (!s->users)
			return -ENOMEM;
	}
	do {
		n = kvp_users(c, cursor, s->users + s->nusers,
			      (uint32_t)(TOP_USERS_MAX - s->nusers), &next);
		if (n < 0)
			return n;
		s->nusers += (size_t)n;
		cursor = next;
	} while (cursor && s->nusers < TOP_USERS_MAX);
	s->users_truncated = cursor != 0;
	return 0;
}

static int sample(struct kvp_client *c, bool admin, struct top_sample *s)
{
	int rc;

	memset(&s->st, 0, sizeof(s->st));
	rc = kvp_stats(c, admin, &s->st);
	if (rc < 0)
		return rc;
	s->have_lat = admin && kvp_latency(c, &s->lat) == 0;
	s->npools = stats_pools(c, admin, s->pools);
	rc = sample_users(c, s);
	s->mono_ns = mono_ns();
	return rc;
}

int cmd_top(struct kvp_client *c, const struct kvctl_args *a)
{
	struct top_sample ss[2] = { { 0 } };
	bool tty = isatty(STDOUT_FILENO), admin = kvp_client_is_admin(c);
	uint64_t next = mono_ns();
	int rc = KVCTL_EXIT_OK;

	catch_stop();
	for (uint64_t n = 0; !stop && (!a->count || n < a->count); n++) {
		struct top_sample *cur = &ss[n & 1], *prev = &ss[!(n & 1)];
		int err;

		if (n)
			sleep_until(next);
		if (stop)
			break;
		next += (uint64_t)a->interval_s * 1000000000ull;
		err = sample(c, admin, cur);
		if (err < 0) {
			fprintf(stderr, "kvctl: top: %s\n", kvp_last_error(c)[0] ?
				kvp_last_error(c) : strerror(-err));
			rc = KVCTL_EXIT_FAIL;
			break;
		}
		/* Home and clear: redrawn in place, like top(1). */
		if (tty)
			fputs("\033[H\033[2J", stdout);
		else if (n)
			fputc('\n', stdout);
		render_top(stdout, a->socket, cur, prev);
		fflush(stdout);
	}
	free(ss[0].users);
	free(ss[1].users);
	return rc;
}
