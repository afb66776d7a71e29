/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_uuid.c - a client finds kvpoold's GPU by UUID, whatever its
 * CUDA_VISIBLE_DEVICES, and is told which GPU to make visible when it
 * cannot see it.
 *
 *   test_gpu_uuid KVPOOLD
 *
 * starts kvpoold --backend=cuda on this process's last GPU (ordinal D: 1
 * where there are two or more, else 0), then runs itself as a client under
 * several CUDA_VISIBLE_DEVICES (fresh processes: the variable is read when
 * CUDA starts):
 *
 *   - unchanged: the attach maps on ordinal D;
 *   - the daemon's GPU alone, by UUID: the attach maps on ordinal 0;
 *   - two or more GPUs: the daemon's GPU listed first ("D,0" as indices
 *     where the variable was unset here, and as UUIDs): the attach maps on
 *     ordinal 0, the same GPU (the ordinal alone would have named another);
 *   - two or more GPUs: only another GPU visible;
 *   - "" (no device) and "99" (a device that does not exist):
 *     kvp_connect fails with -ENODEV and a message naming the daemon's GPU
 *     (GPU-...), "not visible to this process" and the variable's value.
 *
 * An attach that succeeds must report the GPU by ordinal (kvp_cuda_device)
 * whose UUID, read here with the CUDA runtime, is the daemon's; and K/V
 * appended with kvp_append must read back byte for byte from the pool.
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "gpu_test_util.h"
#include "kvpool.h"

#define LAYOUT "layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define UUID_LEN 41
#define MAX_GPUS 16

static char tag[64] = "parent";

/* nvidia-smi -L's form, written here independently of libkvpool's. */
static void uuid_str(const cudaUUID_t *u, char out[UUID_LEN])
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	int n = snprintf(out, UUID_LEN, "GPU-");

	for (int i = 0; i < 16; i++) {
		n += snprintf(out + n, (size_t)(UUID_LEN - n), "%02x", b[i]);
		if (i == 3 || i == 5 || i == 7 || i == 9)
			n += snprintf(out + n, (size_t)(UUID_LEN - n), "-");
	}
}

static int device_uuid(int ordinal, char out[UUID_LEN])
{
	struct cudaDeviceProp p;
	cudaError_t e = cudaGetDeviceProperties(&p, ordinal);

	if (e != cudaSuccess) {
		gpu_test_say(tag, "cudaGetDeviceProperties(%d): %s", ordinal,
			     cudaGetErrorString(e));
		return -1;
	}
	uuid_str(&p.uuid, out);
	return 0;
}

/* ------------------------------------------------------------ child */

/* Append one page of tokens from device memory and read the page back. */
static int append_reads_back(struct kvp_client *c, int ordinal)
{
	const struct kvp_layout *l = kvp_client_layout(c);
	const uint32_t n = l->page_tokens;
	const size_t bytes = (size_t)n * l->token_bytes;
	unsigned char *src = malloc(bytes), *page = malloc(l->page_bytes);
	struct kvp_lease lease;
	void *dkv = NULL;
	int ret = -1, r;

	if (!src || !page)
		goto out;
	for (size_t i = 0; i < bytes; i++)
		src[i] = (unsigned char)(i * 131 + 7);
	if (cudaSetDevice(ordinal) != cudaSuccess ||
	    cudaMalloc(&dkv, bytes) != cudaSuccess ||
	    cudaMemcpy(dkv, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
		gpu_test_say(tag, "cannot stage %zu bytes on device %d", bytes, ordinal);
		goto out;
	}
	/* A user of its own: every client appends to the same daemon. */
	if ((r = kvp_prepare(c, (uint64_t)getpid(), 0, n, &lease)) ||
	    (r = kvp_append(c, &lease, 0, n, dkv)) ||
	    (r = kvp_commit(c, lease.id, n))) {
		gpu_test_say(tag, "prepare/append/commit: %d: %s", r, kvp_last_error(c));
		goto out;
	}
	if (cudaMemcpy(page, (const char *)kvp_device_base(c) +
		       (uint64_t)lease.indices[0] * l->page_bytes, l->page_bytes,
		       cudaMemcpyDeviceToHost) != cudaSuccess) {
		gpu_test_say(tag, "cannot read the page back");
		goto out;
	}
	/* src is [token][layer][K|V][head][dim]; the page [layer][K|V][token]... */
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t ly = 0; ly < l->layers; ly++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const unsigned char *s = src + ((t * l->layers + ly) * 2 + kv) *
							       l->token_stride;
				const unsigned char *d = page + ly * l->layer_stride +
							 kv * l->kv_stride + t * l->token_stride;

				if (memcmp(s, d, l->token_stride)) {
					gpu_test_say(tag, "token %u layer %u %s differs in "
						     "the pool", t, ly, kv ? "V" : "K");
					goto out;
				}
			}
	ret = kvp_release(c, lease.id) ? -1 : 0;
	if (ret)
		gpu_test_say(tag, "release: %s", kvp_last_error(c));
out:
	if (dkv)
		cudaFree(dkv);
	free(src);
	free(page);
	return ret;
}

/* attach: connect, land on ordinal want_ordinal, whose UUID is want_uuid. */
static int child_attach(const char *sock, int want_ordinal, const char *want_uuid)
{
	struct kvp_connect_opts o = { .socket = sock };
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN], have[UUID_LEN];
	int r, ord, fail = 1;

	r = kvp_connect(&c, &o, err, sizeof(err));
	if (r) {
		gpu_test_say(tag, "kvp_connect: %d: %s", r, err);
		return 1;
	}
	ord = kvp_cuda_device(c);
	if (ord != want_ordinal)
		gpu_test_say(tag, "kvp_cuda_device() = %d, expected %d", ord, want_ordinal);
	else if (!device_uuid(ord, have) && strcmp(have, want_uuid))
		gpu_test_say(tag, "ordinal %d here is %s, kvpoold's GPU is %s", ord,
			     have, want_uuid);
	else if (!strcmp(have, want_uuid) && !append_reads_back(c, ord))
		fail = 0;
	kvp_close(c);
	if (!fail)
		gpu_test_say(tag, "attached on ordinal %d = %s; a page appended "
			     "reads back", ord, have);
	return fail;
}

/* refuse: kvp_connect fails with -ENODEV, naming the GPU and the variable. */
static int child_refuse(const char *sock, const char *want_uuid)
{
	struct kvp_connect_opts o = { .socket = sock };
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	struct kvp_client *c = NULL;
	char err[KVP_ERRLEN], env[128];
	int r;

	r = kvp_connect(&c, &o, err, sizeof(err));
	if (!r) {
		gpu_test_say(tag, "kvp_connect succeeded on ordinal %d; expected "
			     "-ENODEV", kvp_cuda_device(c));
		kvp_close(c);
		return 1;
	}
	snprintf(env, sizeof(env), "CUDA_VISIBLE_DEVICES=%s,", vis ? vis : "(unset)");
	if (r != -ENODEV || !strstr(err, want_uuid) ||
	    !strstr(err, "not visible to this process") || !strstr(err, env)) {
		gpu_test_say(tag, "kvp_connect: %d (%s), expected -ENODEV naming %s "
			     "and %s", r, err, want_uuid, env);
		return 1;
	}
	gpu_test_say(tag, "-ENODEV: %s", err);
	return 0;
}

/* ------------------------------------------------------------ parent */

/* Run this program as a client with CUDA_VISIBLE_DEVICES = vis (NULL:
 * as here); 0 when it passed. */
static int run_client(const char *self, const char *vis, const char *mode,
		      const char *sock, int ordinal, const char *uuid)
{
	char ord[16], name[96];
	pid_t pid;

	snprintf(ord, sizeof(ord), "%d", ordinal);
	snprintf(name, sizeof(name), "client %s CUDA_VISIBLE_DEVICES=%s", mode,
		 vis ? vis : "(as here)");
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return -1;
	}
	if (pid == 0) {
		if (vis)
			setenv("CUDA_VISIBLE_DEVICES", vis, 1);
		execl(self, self, "--child", mode, sock, ord, uuid, name, (char *)NULL);
		_exit(127);
	}
	return gpu_test_reap(tag, pid, name, 60000);
}

int main(int argc, char **argv)
{
	static const char *const args_tpl[] = {
		"--layout=" LAYOUT, "--device_mem=16M", "--host_mem=16M",
	};
	const char *args[5];
	const char *here = getenv("CUDA_VISIBLE_DEVICES");
	char uuid[MAX_GPUS][UUID_LEN], devices[32], vis[3 * UUID_LEN];
	struct gpu_daemon d;
	int n = 0, dev, fail = 0;

	if (argc == 7 && !strcmp(argv[1], "--child")) {
		snprintf(tag, sizeof(tag), "%s", argv[6]);
		if (!strcmp(argv[2], "attach"))
			return child_attach(argv[3], atoi(argv[4]), argv[5]);
		return child_refuse(argv[3], argv[5]);
	}
	if (argc < 2) {
		fprintf(stderr, "usage: %s KVPOOLD\n", argv[0]);
		return 1;
	}
	if (gpu_test_no_device())
		return 77;
	if (access(argv[1], X_OK)) {
		printf("SKIP: no kvpoold at %s\n", argv[1]);
		return 77;
	}
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
		return 1;
	if (n > MAX_GPUS)
		n = MAX_GPUS;
	for (int i = 0; i < n; i++)
		if (device_uuid(i, uuid[i]))
			return 1;
	dev = n >= 2 ? 1 : 0;
	snprintf(devices, sizeof(devices), "--devices=%d", dev);
	memcpy(args, args_tpl, sizeof(args_tpl));
	args[3] = devices;
	args[4] = NULL;
	gpu_test_say(tag, "%d GPU(s); kvpoold on ordinal %d = %s (CUDA_VISIBLE_DEVICES "
		     "here: %s)", n, dev, uuid[dev], here ? here : "unset");
	if (gpu_daemon_start(&d, tag, "/tmp/kvpool-gpu-XXXXXX", argv[1], args))
		return 1;

	fail |= run_client(argv[0], NULL, "attach", d.sock, dev, uuid[dev]);
	/* Named by its UUID alone: ordinal 0 here. */
	fail |= run_client(argv[0], uuid[dev], "attach", d.sock, 0, uuid[dev]);
	if (n >= 2) {
		/* The daemon's GPU first: ordinal 0 here, 1 in the daemon. */
		if (!here)
			fail |= run_client(argv[0], "1,0", "attach", d.sock, 0, uuid[dev]);
		snprintf(vis, sizeof(vis), "%s,%s", uuid[dev], uuid[0]);
		fail |= run_client(argv[0], vis, "attach", d.sock, 0, uuid[dev]);
		/* Only another GPU. */
		fail |= run_client(argv[0], uuid[0], "refuse", d.sock, dev, uuid[dev]);
	} else {
		gpu_test_say(tag, "one GPU: the different-ordinal cases need two "
			     "(test_cuda_uuid covers the matching without a GPU)");
	}
	fail |= run_client(argv[0], "", "refuse", d.sock, dev, uuid[dev]);
	fail |= run_client(argv[0], "99", "refuse", d.sock, dev, uuid[dev]);

	if (gpu_daemon_stop(&d, 30000))
		fail = 1;
	if (fail)
		gpu_daemon_dump_log(&d);
	gpu_daemon_cleanup(&d);
	if (!fail)
		gpu_test_say(tag, "clients found kvpoold's GPU by UUID, and were told "
			     "which GPU to make visible when they could not see it");
	return fail ? 1 : 0;
}
