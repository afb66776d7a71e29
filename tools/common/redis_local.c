/* SPDX-License-Identifier: MIT */
/*
 * redis_local.c - a throwaway Redis Cluster on loopback (redis_local.h).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "redis_local.h"

/* A port p with p and p + 10000 (the cluster bus) free on loopback now. */
static bool port_free(int p)
{
	for (int k = 0; k < 2; k++) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_port = htons((uint16_t)(p + 10000 * k)),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

		if (fd < 0)
			return false;
		ok = !bind(fd, (struct sockaddr *)&a, sizeof(a));
		close(fd);
		if (!ok)
			return false;
	}
	return true;
}

void *redis_local_cmd(const struct redis_local *r, int i, const char *fmt, ...)
{
	struct timeval tv = { 2, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port[i], tv);
	void *reply = NULL;
	va_list ap;

	if (c && !c->err) {
		redisSetTimeout(c, tv);
		va_start(ap, fmt);
		reply = redisvCommand(c, fmt, ap);
		va_end(ap);
	}
	if (c)
		redisFree(c);
	return reply;
}

static bool cluster_ok(const struct redis_local *r, int i)
{
	redisReply *x = redis_local_cmd(r, i, "CLUSTER INFO");
	bool ok = x && x->type == REDIS_REPLY_STRING &&
		  strstr(x->str, "cluster_state:ok");

	if (x)
		freeReplyObject(x);
	return ok;
}

static pid_t spawn(const struct redis_local *r, int i)
{
	char port[16], conf[128], log[128];
	pid_t pid;

	snprintf(port, sizeof(port), "%d", r->port[i]);
	snprintf(conf, sizeof(conf), "%s/nodes-%d.conf", r->dir, r->port[i]);
	snprintf(log, sizeof(log), "%s/redis-%d.log", r->dir, r->port[i]);
	pid = fork();
	if (pid == 0) {
		execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
		       "--cluster-enabled", "yes", "--cluster-config-file", conf,
		       "--dir", r->dir, "--save", "", "--appendonly", "no",
		       "--logfile", log, "--protected-mode", "no", (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Poll (up to 10 s) until pred(r, i) holds for every node. */
static bool wait_all(const struct redis_local *r, bool (*pred)(const struct redis_local *, int))
{
	for (int t = 0; t < 200; t++) {
		int ok = 0;

		for (int i = 0; i < r->n; i++)
			ok += pred(r, i);
		if (ok == r->n)
			return true;
		usleep(50000);
	}
	return false;
}

static bool answers(const struct redis_local *r, int i)
{
	redisReply *x = redis_local_cmd(r, i, "PING");
	bool ok = x != NULL;

	if (x)
		freeReplyObject(x);
	return ok;
}

int redis_local_start(struct redis_local *r, int n)
{
	int base, len;

	if (system("command -v redis-server >/dev/null 2>&1")) {
		fprintf(stderr, "skip: redis-server is not installed (apt-get install "
			"redis-server; scripts/deps.sh)\n");
		return 77;
	}
	memset(r, 0, sizeof(*r));
	r->n = n;
	snprintf(r->dir, sizeof(r->dir), "/tmp/kvpool-redis-XXXXXX");
	if (!mkdtemp(r->dir))
		return -errno;
	srand((unsigned)(getpid() ^ time(NULL)));
	base = 20000 + rand() % 20000;
	for (int i = 0, p = base; i < n; p++)
		if (port_free(p))
			r->port[i++] = p;
	for (int i = 0; i < n; i++)
		r->pid[i] = spawn(r, i);
	if (!wait_all(r, answers))
		return -ETIMEDOUT;
	for (int i = 0; i < n; i++) {
		redisReply *x = redis_local_cmd(r, i, "CLUSTER ADDSLOTSRANGE %d %d",
						16384 * i / n, 16384 * (i + 1) / n - 1);
		redisReply *id = redis_local_cmd(r, i, "CLUSTER MYID");

		if (!x || x->type == REDIS_REPLY_ERROR || !id || id->type != REDIS_REPLY_STRING)
			return -EPROTO;
		snprintf(r->id[i], sizeof(r->id[i]), "%s", id->str);
		freeReplyObject(x);
		freeReplyObject(id);
		if (i) {
			x = redis_local_cmd(r, 0, "CLUSTER MEET 127.0.0.1 %d", r->port[i]);
			if (!x)
				return -EPROTO;
			freeReplyObject(x);
		}
	}
	if (!wait_all(r, cluster_ok))
		return -ETIMEDOUT;
	len = snprintf(r->url, sizeof(r->url), "redis-cluster://");
	for (int i = 0; i < n; i++)
		len += snprintf(r->url + len, sizeof(r->url) - (size_t)len, "%s127.0.0.1:%d",
				i ? "," : "", r->port[i]);
	return 0;
}

void redis_local_stop(struct redis_local *r)
{
	char cmd[128];

	for (int i = 0; i < r->n; i++) {
		if (r->pid[i] <= 0)
			continue;
		kill(r->pid[i], SIGCONT); /* a test may have stopped it */
		kill(r->pid[i], SIGKILL);
		waitpid(r->pid[i], NULL, 0);
		r->pid[i] = 0;
	}
	if (r->dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r->dir);
		if (system(cmd))
			fprintf(stderr, "redis_local: could not remove %s\n", r->dir);
	}
}
