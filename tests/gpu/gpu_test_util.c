/* SPDX-License-Identifier: MIT */
/*
 * gpu_test_util.c - the gpu tests' shared pieces (gpu_test_util.h).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu_test_util.h"

#define DAEMON_ARGS_MAX 16

bool gpu_test_no_device(void)
{
	int ndev = 0;
	cudaError_t e = cudaGetDeviceCount(&ndev);

	if (e == cudaSuccess && ndev > 0)
		return false;
	printf("SKIP: no CUDA device present (%s); run the gpu tests on a "
	       "GPU machine: ctest -L gpu\n",
	       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
	return true;
}

void gpu_test_say(const char *tag, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%s] ", tag);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int gpu_test_reap(const char *tag, pid_t pid, const char *who, unsigned wait_ms)
{
	int st;

	for (unsigned i = 0; i < wait_ms / 50; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid) {
			if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
				return 0;
			gpu_test_say(tag, "%s exited with status 0x%x", who, st);
			return -1;
		}
		usleep(50000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	gpu_test_say(tag, "%s did not exit; killed", who);
	return -1;
}

void gpu_daemon_dump_log(const struct gpu_daemon *d)
{
	char buf[4096];
	FILE *f = fopen(d->log, "r");
	size_t n;

	if (!f)
		return;
	fprintf(stderr, "---- kvpoold log (%s)\n", d->log);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, stderr);
	fprintf(stderr, "---- end of kvpoold log\n");
	fclose(f);
}

static pid_t spawn(const struct gpu_daemon *d, const char *kvpoold,
		   const char *const *args)
{
	const char *argv[DAEMON_ARGS_MAX + 6];
	char a_sock[200];
	size_t n = 0;
	pid_t pid;

	snprintf(a_sock, sizeof(a_sock), "--socket=%s", d->sock);
	argv[n++] = kvpoold;
	argv[n++] = a_sock;
	argv[n++] = "--backend=cuda";
	argv[n++] = "--foreground";
	for (size_t i = 0; args && args[i] && i < DAEMON_ARGS_MAX; i++)
		argv[n++] = args[i];
	argv[n++] = "--log=stderr";
	argv[n] = NULL;
	pid = fork();
	if (pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(kvpoold, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

int gpu_daemon_start(struct gpu_daemon *d, const char *tag,
		     const char *dir_template, const char *kvpoold,
		     const char *const *args)
{
	int st;

	*d = (struct gpu_daemon){ .tag = tag, .pid = -1 };
	snprintf(d->dir, sizeof(d->dir), "%s", dir_template);
	if (!mkdtemp(d->dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(d->sock, sizeof(d->sock), "%s/kvpoold.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/kvpoold.log", d->dir);
	d->pid = spawn(d, kvpoold, args);
	if (d->pid < 0) {
		perror("fork");
		return 1;
	}
	/* Until the socket is there (or the daemon gave up). */
	for (int i = 0;; i++) {
		struct stat sst;

		if (!stat(d->sock, &sst))
			return 0;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid || i == 600) {
			gpu_test_say(tag, "kvpoold --backend=cuda did not start");
			gpu_daemon_dump_log(d);
			if (i == 600)
				kill(d->pid, SIGKILL);
			rmdir(d->dir);
			return 1;
		}
		usleep(50000);
	}
}

int gpu_daemon_stop(const struct gpu_daemon *d, unsigned wait_ms)
{
	kill(d->pid, SIGTERM);
	return gpu_test_reap(d->tag, d->pid, "kvpoold", wait_ms);
}

void gpu_daemon_cleanup(const struct gpu_daemon *d)
{
	unlink(d->log);
	unlink(d->sock);
	rmdir(d->dir);
}

static uint64_t rng_state;

void gpu_rng_seed(uint64_t seed)
{
	rng_state = seed;
}

uint64_t gpu_rng(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint32_t gpu_below(uint32_t n)
{
	return (uint32_t)(gpu_rng() % n);
}
