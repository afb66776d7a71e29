/* SPDX-License-Identifier: MIT */
/*
 * replay_redis.c - the Redis baseline of `kvbench replay`: what teams use as
 * a shared KV cache when they have no kvpool, and the redis-server kvbench
 * starts for it.
 *
 * Each history (user, date) is one Redis hash "kv:<key>": field "n" holds
 * its token count, fields "p0", "p1", ... its pages (page_tokens tokens of
 * token_bytes each, the last one partial), so Redis evicts whole histories
 * (maxmemory-policy allkeys-lru) the way kvpool does. The pipeline's calls:
 *
 *   info     HGET kv:<key> n
 *   prepare  HMGET kv:<key> p0 .. p<pages-1>: the cached KV comes to the
 *            pipeline (that is what using it needs: the bytes, not a page
 *            table); a page missing (evicted) means recompute everything
 *   append   HSET of the new pages (the partial last page rewritten with its
 *            new tokens) and n, in one command: Redis has no commit
 *   commit, release: nothing to do (not timed)
 *
 * The server: redis-server on 127.0.0.1 at a free port, --save '' and
 * --appendonly no (a cache, no persistence), maxmemory the pool's bytes,
 * killed by the kernel if kvbench dies first (PR_SET_PDEATHSIG).
 *
 * WITHOUT HIREDIS (KVBENCH_HAVE_HIREDIS 0: CMake found no libhiredis, as on
 * the GPU machine) the system is a stub: rsys_redis_open() and
 * redis_server_start() return -ENOSYS with REPLAY_NO_HIREDIS, and the
 * replay reports Redis as skipped with that reason.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "replay.h"

#if KVBENCH_HAVE_HIREDIS
#include <hiredis/hiredis.h>

struct rds {
	redisContext *c;
	uint32_t P;
	uint64_t tb;              /* token bytes */
	uint32_t max_pages;
	const char **argv;        /* 2 * max_pages + 4 */
	size_t *argvlen;
	char (*fields)[16];       /* "p<j>" */
	unsigned char *page;      /* one page being rebuilt */
	char err[512];
};

static int rds_fail(struct rds *r, const char *what, redisReply *rep)
{
	if (rep && rep->type == REDIS_REPLY_ERROR)
		snprintf(r->err, sizeof(r->err), "redis %s: %s", what, rep->str);
	else if (!rep)
		snprintf(r->err, sizeof(r->err), "redis %s: %s", what,
			 r->c->errstr[0] ? r->c->errstr : "no reply");
	else
		snprintf(r->err, sizeof(r->err), "redis %s: unexpected reply type %d", what,
			 rep->type);
	if (rep)
		freeReplyObject(rep);
	return -EIO;
}

int rsys_redis_open(void **ctx, const char *host, int port, uint32_t page_tokens,
		    uint64_t token_bytes, uint32_t max_pages, char *err, size_t errlen)
{
	struct timeval tv = { 5, 0 };
	struct rds *r = calloc(1, sizeof(*r));

	if (!r)
		goto nomem;
	r->P = page_tokens;
	r->tb = token_bytes;
	r->max_pages = max_pages;
	r->argv = calloc(2 * (size_t)max_pages + 4, sizeof(*r->argv));
	r->argvlen = calloc(2 * (size_t)max_pages + 4, sizeof(*r->argvlen));
	r->fields = calloc((size_t)max_pages + 1, sizeof(*r->fields));
	r->page = malloc(page_tokens * token_bytes);
	if (!r->argv || !r->argvlen || !r->fields || !r->page)
		goto nomem;
	for (uint32_t j = 0; j <= max_pages; j++)
		snprintf(r->fields[j], sizeof(r->fields[j]), "p%u", j);
	r->c = redisConnectWithTimeout(host, port, tv);
	if (!r->c || r->c->err) {
		snprintf(err, errlen, "cannot connect to redis at %s:%d: %s; start one or let "
			 "kvbench start its own (no --redis)", host, port,
			 r->c ? r->c->errstr : "out of memory");
		rsys_redis_close(r);
		return -ECONNREFUSED;
	}
	*ctx = r;
	return 0;
nomem:
	rsys_redis_close(r);
	snprintf(err, errlen, "out of memory for the redis client");
	return -ENOMEM;
}

void rsys_redis_close(void *ctx)
{
	struct rds *r = ctx;

	if (!r)
		return;
	if (r->c)
		redisFree(r->c);
	free(r->argv);
	free(r->argvlen);
	free(r->fields);
	free(r->page);
	free(r);
}

static const char *rds_error(void *ctx)
{
	return ((struct rds *)ctx)->err;
}

static int rds_key(char *buf, size_t len, uint64_t key)
{
	return snprintf(buf, len, "kv:%" PRIx64, key);
}

static int rds_info(void *ctx, uint64_t key, uint64_t *len)
{
	struct rds *r = ctx;
	redisReply *rep;
	char k[32];

	rds_key(k, sizeof(k), key);
	rep = redisCommand(r->c, "HGET %s n", k);
	if (!rep || (rep->type != REDIS_REPLY_NIL && rep->type != REDIS_REPLY_STRING))
		return rds_fail(r, "HGET", rep);
	*len = rep->type == REDIS_REPLY_STRING ? strtoull(rep->str, NULL, 10) : 0;
	freeReplyObject(rep);
	return 0;
}

static int rds_prepare(void *ctx, uint64_t key, uint64_t pos, uint32_t n_new,
		       struct rlease *l)
{
	struct rds *r = ctx;
	uint32_t np = (uint32_t)((pos + r->P - 1) / r->P);
	uint64_t last_bytes = (pos - (uint64_t)(np ? np - 1 : 0) * r->P) * r->tb;
	redisReply *rep;
	char k[32];
	bool whole = true;

	*l = (struct rlease){ .key = key, .start = 0, .len = pos, .n_new = n_new,
			      .npages = np, .idx = l->idx, .tail = l->tail };
	if (!np)
		return 0;
	if (np > r->max_pages) {
		snprintf(r->err, sizeof(r->err), "%u pages cached, more than the %u planned "
			 "for", np, r->max_pages);
		return -E2BIG;
	}
	r->argv[0] = "HMGET";
	r->argvlen[0] = 5;
	r->argvlen[1] = (size_t)rds_key(k, sizeof(k), key);
	r->argv[1] = k;
	for (uint32_t j = 0; j < np; j++) {
		r->argv[2 + j] = r->fields[j];
		r->argvlen[2 + j] = strlen(r->fields[j]);
	}
	rep = redisCommandArgv(r->c, (int)np + 2, r->argv, r->argvlen);
	if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != np)
		return rds_fail(r, "HMGET", rep);
	for (uint32_t j = 0; j < np && whole; j++) {
		const redisReply *e = rep->element[j];
		uint64_t want = j + 1 < np ? (uint64_t)r->P * r->tb : last_bytes;

		whole = e->type == REDIS_REPLY_STRING && (uint64_t)e->len == want;
	}
	if (!whole) {
		/* Evicted (whole hashes go, but not between two commands). */
		l->len = 0;
		l->n_new = (uint32_t)(pos + n_new);
		l->npages = 0;
	} else if (pos % r->P) {
		l->tail_bytes = (uint32_t)last_bytes;
		memcpy(l->tail, rep->element[np - 1]->str, last_bytes);
	}
	freeReplyObject(rep);
	return 0;
}

static int rds_append(void *ctx, struct rlease *l, const void *kv)
{
	struct rds *r = ctx;
	const unsigned char *src = kv;
	uint64_t pos = l->len, end = l->len + l->n_new;
	uint32_t argc = 2, first = (uint32_t)(pos / r->P);
	redisReply *rep;
	char k[32], n[24];

	r->argv[0] = "HSET";
	r->argvlen[0] = 4;
	r->argvlen[1] = (size_t)rds_key(k, sizeof(k), l->key);
	r->argv[1] = k;
	for (uint32_t j = first; (uint64_t)j * r->P < end; j++) {
		uint64_t p0 = (uint64_t)j * r->P, p1 = p0 + r->P < end ? p0 + r->P : end;

		if (j + 1 > r->max_pages) {
			snprintf(r->err, sizeof(r->err), "page %u past the %u planned for", j,
				 r->max_pages);
			return -E2BIG;
		}
		r->argv[argc] = r->fields[j];
		r->argvlen[argc++] = strlen(r->fields[j]);
		if (p0 < pos) {
			/* The cached partial page, rewritten with its new tokens. */
			memcpy(r->page, l->tail, (pos - p0) * r->tb);
			memcpy(r->page + (pos - p0) * r->tb, src, (p1 - pos) * r->tb);
			r->argv[argc] = (const char *)r->page;
		} else {
			/* Whole new pages are runs of the caller's tokens. */
			r->argv[argc] = (const char *)src + (p0 - pos) * r->tb;
		}
		r->argvlen[argc++] = (p1 - p0) * r->tb;
	}
	r->argv[argc] = "n";
	r->argvlen[argc++] = 1;
	r->argvlen[argc] = (size_t)snprintf(n, sizeof(n), "%" PRIu64, end);
	r->argv[argc++] = n;
	rep = redisCommandArgv(r->c, (int)argc, r->argv, r->argvlen);
	if (!rep || rep->type != REDIS_REPLY_INTEGER)
		return rds_fail(r, "HSET", rep);
	freeReplyObject(rep);
	return 0;
}

static int rds_nothing(void *ctx, struct rlease *l)
{
	return 0;
}

const struct rsys_ops rsys_redis_ops = {
	.name = "redis", .info = rds_info, .prepare = rds_prepare,
	.append = rds_append, .commit = NULL, .release = rds_nothing,
	.error = rds_error,
};

#else /* !KVBENCH_HAVE_HIREDIS */

int rsys_redis_open(void **ctx, const char *host, int port, uint32_t page_tokens,
		    uint64_t token_bytes, uint32_t max_pages, char *err, size_t errlen)
{
	*ctx = NULL;
	snprintf(err, errlen, "%s", REPLAY_NO_HIREDIS);
	return -ENOSYS;
}

void rsys_redis_close(void *ctx)
{
}

static const char *rds_error(void *ctx)
{
	return REPLAY_NO_HIREDIS;
}

static int rds_info(void *ctx, uint64_t key, uint64_t *len)
{
	return -ENOSYS;
}

static int rds_prepare(void *ctx, uint64_t key, uint64_t pos, uint32_t n_new,
		       struct rlease *l)
{
	return -ENOSYS;
}

static int rds_append(void *ctx, struct rlease *l, const void *kv)
{
	return -ENOSYS;
}

static int rds_release(void *ctx, struct rlease *l)
{
	return -ENOSYS;
}

const struct rsys_ops rsys_redis_ops = {
	.name = "redis", .info = rds_info, .prepare = rds_prepare,
	.append = rds_append, .commit = NULL, .release = rds_release,
	.error = rds_error,
};

#endif /* KVBENCH_HAVE_HIREDIS */

/* ---------------------------------------------------------------- server */

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void log_tail(const char *path)
{
	char line[512];
	FILE *f = fopen(path, "r");
	long n = 0;

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		n++;
	rewind(f);
	for (long i = 0; fgets(line, sizeof(line), f); i++)
		if (i >= n - 5)
			fprintf(stderr, "  redis-server: %s", line);
	fclose(f);
}

#if KVBENCH_HAVE_HIREDIS
static int ping(int port)
{
	struct timeval tv = { 0, 200000 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *rep;
	int ok = 0;

	if (c && !c->err) {
		rep = redisCommand(c, "PING");
		ok = rep && rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "PONG");
		if (rep)
			freeReplyObject(rep);
	}
	if (c)
		redisFree(c);
	return ok;
}
#else
static int ping(int port)
{
	return 0;
}
#endif

int redis_server_start(struct redis_server *r, const char *binary,
		       uint64_t maxmemory, char *err, size_t errlen)
{
	const char *tmp = getenv("TMPDIR");
	char port[16], mem[32];
	pid_t parent = getpid();
	int st;

	memset(r, 0, sizeof(*r));
	if (!KVBENCH_HAVE_HIREDIS) {
		snprintf(err, errlen, "%s", REPLAY_NO_HIREDIS);
		return -ENOSYS;
	}
	snprintf(r->dir, sizeof(r->dir), "%s/kvbench-redis.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(r->dir)) {
		int rc = -errno;

		snprintf(err, errlen, "mkdtemp %s: %s", r->dir, strerror(errno));
		r->dir[0] = '\0';
		return rc;
	}
	snprintf(r->log, sizeof(r->log), "%s/redis.log", r->dir);
	r->port = free_port();
	if (r->port <= 0) {
		snprintf(err, errlen, "no free loopback port for redis-server");
		return -EADDRINUSE;
	}
	snprintf(port, sizeof(port), "%d", r->port);
	/* Redis takes maxmemory in bytes; at least 1 MiB so it starts. */
	snprintf(mem, sizeof(mem), "%" PRIu64, maxmemory < (1u << 20) ? (1u << 20) : maxmemory);
	snprintf(r->command, sizeof(r->command), "%s --port %s --bind 127.0.0.1 --save '' "
		 "--appendonly no --maxmemory %s --maxmemory-policy allkeys-lru --dir %s",
		 binary, port, mem, r->dir);
	fflush(NULL);
	r->pid = fork();
	if (r->pid < 0) {
		int rc = -errno;

		snprintf(err, errlen, "fork: %s", strerror(errno));
		r->pid = 0;
		return rc;
	}
	if (r->pid == 0) {
		int fd = open(r->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execlp(binary, binary, "--port", port, "--bind", "127.0.0.1", "--save", "",
		       "--appendonly", "no", "--maxmemory", mem, "--maxmemory-policy",
		       "allkeys-lru", "--dir", r->dir, "--daemonize", "no",
		       "--logfile", "", (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", binary, strerror(errno));
		_exit(127);
	}
	for (int i = 0; i < 100; i++) {
		if (ping(r->port))
			return 0;
		if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
			r->pid = 0;
			snprintf(err, errlen, "redis-server (%s) exited at start%s; install Debian's "
				 "redis-server or name a running one with --redis HOST:PORT", binary,
				 WIFEXITED(st) && WEXITSTATUS(st) == 127 ? ": not found" : "");
			log_tail(r->log);
			return -ENOENT;
		}
		struct timespec ts = { 0, 50000000 };

		nanosleep(&ts, NULL);
	}
	snprintf(err, errlen, "redis-server on port %d did not answer PING within 5 s", r->port);
	log_tail(r->log);
	redis_server_stop(r, err + strlen(err), 0);
	return -ETIMEDOUT;
}

int redis_server_stop(struct redis_server *r, char *err, size_t errlen)
{
	int st = 0, rc = 0;

	if (r->pid > 0) {
		kill(r->pid, SIGTERM);
		for (int i = 0; i < 200; i++) {
			if (waitpid(r->pid, &st, WNOHANG) == r->pid)
				break;
			if (i == 199) {
				kill(r->pid, SIGKILL);
				waitpid(r->pid, &st, 0);
				if (errlen)
					snprintf(err, errlen, "redis-server did not stop within 10 s "
						 "of SIGTERM; killed");
				rc = -1;
			}
			struct timespec ts = { 0, 50000000 };

			nanosleep(&ts, NULL);
		}
		r->pid = 0;
	}
	if (r->dir[0]) {
		unlink(r->log);
		rmdir(r->dir);
		r->dir[0] = '\0';
	}
	return rc;
}
