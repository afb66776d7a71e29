/* SPDX-License-Identifier: MIT */
/*
 * test_kvbench_prefix.c - `kvbench prefix --json` on a tiny trace, in-process
 * and through a private kvpoold: the report has the keys others rely on
 * (hit_rate, best_hit_rate, belady_hit_rate, hit_ratio_vs_belady,
 * dedupe_pages_saved, compose_p50_ns, compose_p99_ns, source),
 * 0 <= hit_rate <= belady_hit_rate <= best_hit_rate <= 1 (no policy with the
 * pool's pages beats the offline optimum, which no bounded cache lifts above
 * the unbounded one) and hit_ratio_vs_belady their quotient, both runs
 * succeeded with every page a hit handed out holding the right KV, and
 * sharing saved pages. A few seconds.
 *
 * Usage: test_kvbench_prefix KVBENCH KVPOOLD
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define OUT_MAX (1 << 20)

static int failures;

#define CHECK(cond, ...)						\
	do {								\
		if (!(cond)) {						\
			fprintf(stderr, "FAIL: " __VA_ARGS__);		\
			fprintf(stderr, "\n");				\
			failures++;					\
		}							\
	} while (0)

/* Run argv with stdout into out[OUT_MAX]; returns the exit status or -1. */
static int run(char *const argv[], char *out)
{
	size_t len = 0;
	int fd[2], status;
	ssize_t n;
	pid_t pid;

	if (pipe(fd))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(fd[1], STDOUT_FILENO);
		close(fd[0]);
		close(fd[1]);
		execv(argv[0], argv);
		_exit(127);
	}
	close(fd[1]);
	while (len < OUT_MAX - 1 && (n = read(fd[0], out + len, OUT_MAX - 1 - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		len += (size_t)n;
	}
	out[len] = '\0';
	close(fd[0]);
	if (waitpid(pid, &status, 0) < 0)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The first "key": value in json (the top-level one: the report prints its
 * top-level figures before any section), as a number; false if absent. */
static bool number(const char *json, const char *key, double *v)
{
	char pat[64];
	const char *p;
	char *end;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	p = strstr(json, pat);
	if (!p)
		return false;
	*v = strtod(p + strlen(pat), &end);
	return end != p + strlen(pat);
}

/* Every "key": value in json is zero. */
static bool all_zero(const char *json, const char *key)
{
	char pat[64];
	const char *p = json;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	while ((p = strstr(p, pat))) {
		p += strlen(pat);
		if (strtod(p, NULL) != 0)
			return false;
	}
	return true;
}

/* Section "name" of json has "ok": true (its first member). */
static bool section_ok(const char *json, const char *name)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\": {", name);
	p = strstr(json, pat);
	if (!p)
		return false;
	p = strstr(p, "\"ok\": ");
	return p && !strncmp(p + 6, "true", 4);
}

int main(int argc, char **argv)
{
	char *out = malloc(OUT_MAX);
	double hit, best, belady, vs_belady, dedupe, p50, p99;
	char *const args[] = {
		argc > 1 ? argv[1] : (char *)"kvbench", (char *)"prefix", (char *)"--json",
		(char *)"--seed", (char *)"7", (char *)"--conversations", (char *)"8",
		(char *)"--turns", (char *)"6", (char *)"--rag-requests", (char *)"40",
		(char *)"--library", (char *)"60", (char *)"--agent-requests", (char *)"20",
		(char *)"--projects", (char *)"2", (char *)"--compose-samples", (char *)"200",
		(char *)"--kvpoold", argc > 2 ? argv[2] : (char *)"kvpoold", NULL,
	};
	int rc;

	if (argc < 3 || !out) {
		fprintf(stderr, "usage: %s KVBENCH KVPOOLD\n", argv[0]);
		return 2;
	}
	rc = run(args, out);
	CHECK(rc == 0, "kvbench prefix exited with %d", rc);
	CHECK(out[0] == '{', "no JSON object on stdout");
	CHECK(strstr(out, "\"benchmark\": \"prefix\""), "\"benchmark\" is not \"prefix\"");
	CHECK(strstr(out, "\"source\": \"kvpoold\""),
	      "\"source\" is not \"kvpoold\" (the kvpoold run did not succeed)");
	CHECK(number(out, "hit_rate", &hit), "no hit_rate");
	CHECK(number(out, "best_hit_rate", &best), "no best_hit_rate");
	CHECK(number(out, "belady_hit_rate", &belady), "no belady_hit_rate");
	CHECK(number(out, "hit_ratio_vs_belady", &vs_belady), "no hit_ratio_vs_belady");
	CHECK(number(out, "dedupe_pages_saved", &dedupe), "no dedupe_pages_saved");
	CHECK(number(out, "compose_p50_ns", &p50), "no compose_p50_ns");
	CHECK(number(out, "compose_p99_ns", &p99), "no compose_p99_ns");
	if (!failures) {
		CHECK(0 <= hit && hit <= belady && belady <= best && best <= 1,
		      "not 0 <= hit_rate (%g) <= belady_hit_rate (%g) <= "
		      "best_hit_rate (%g) <= 1", hit, belady, best);
		/* Both are printed to 6 decimals. */
		CHECK(belady > 0 && vs_belady - hit / belady < 1e-5 &&
		      hit / belady - vs_belady < 1e-5,
		      "hit_ratio_vs_belady %g is not hit_rate / belady_hit_rate "
		      "(%g / %g)", vs_belady, hit, belady);
		CHECK(hit > 0, "nothing was served from cache");
		CHECK(dedupe > 0, "no pages saved by sharing");
		CHECK(p50 > 0 && p99 >= p50, "compose latency p50 %g p99 %g", p50, p99);
	}
	CHECK(section_ok(out, "inproc"), "the inproc run failed");
	CHECK(section_ok(out, "kvpoold"), "the kvpoold run failed");
	CHECK(all_zero(out, "verify_failures"), "pages served from cache held other KV");
	CHECK(!all_zero(out, "verified_pages"), "no page was read back");
	CHECK(strstr(out, "\"multi_turn\": {") && strstr(out, "\"rag\": {") &&
	      strstr(out, "\"agents\": {"), "a workload is missing");
	if (failures)
		fprintf(stderr, "--- kvbench output ---\n%s\n", out);
	free(out);
	printf("%s: %s\n", argv[0], failures ? "FAIL" : "ok");
	return failures ? 1 : 0;
}
