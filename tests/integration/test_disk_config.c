/* SPDX-License-Identifier: MIT */
/*
 * test_disk_config - a disk tier kvpoold cannot have stops it before it
 * starts anything: exit status 2, a message naming the setting, the path
 * where there is one, and what to do; no socket. The cases: a disk_dir that
 * does not exist, one that is a file, disk_size without disk_dir, disk_dir
 * without disk_size, a disk tier with no host tier, a bad disk_compress, a
 * tenant's disk quota past the disk, and a second kvpoold on a disk_dir
 * that one already uses (exit 1: the file is locked). Then a good one
 * starts, serves and stops.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static int g_bad;

static const char *slurp(const char *path)
{
	static char buf[1 << 15];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? 0 : read(fd, buf, sizeof(buf) - 1);

	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

/* kvpoold with flags must exit `status` at once, its message holding
 * every string of want (NULL-terminated). */
static void expect_refused(struct h_daemon *d, const char *what, int status,
			   const char *const *flags, const char *const *want)
{
	struct stat st;
	pid_t pid = h_daemon_spawn(d, flags);
	int rc = pid < 0 ? -1 : h_wait(pid, 10000);
	const char *log = slurp(d->log);

	if (rc != status) {
		h_fail("%s: kvpoold exited %d, expected %d; it said: %s", what, rc,
		       status, log);
		g_bad++;
	}
	for (int i = 0; want[i]; i++)
		if (!strstr(log, want[i])) {
			h_fail("%s: the message should say \"%s\"; it was: %s", what,
			       want[i], log);
			g_bad++;
		}
	if (status == 2 && lstat(d->sock, &st) == 0) {
		h_fail("%s: the socket %s was created", what, d->sock);
		g_bad++;
	}
	h_log("%s: refused (exit %d) as expected", what, rc);
}

int main(int argc, char **argv)
{
	uint64_t t0 = h_now_ms();
	char dir[256], file[256], missing[256], a_dir[300], a_file[300], a_missing[300];
	struct h_daemon d, d2;
	int fd;

	h_init(argc, argv, "test_disk_config");
	if (h_daemon_dir(&d, 0))
		return H_FAIL;
	snprintf(dir, sizeof(dir), "%s/disk", d.dir);
	snprintf(file, sizeof(file), "%s/a-file", d.dir);
	snprintf(missing, sizeof(missing), "%s/no-such-dir", d.dir);
	snprintf(a_dir, sizeof(a_dir), "--disk_dir=%s", dir);
	snprintf(a_file, sizeof(a_file), "--disk_dir=%s", file);
	snprintf(a_missing, sizeof(a_missing), "--disk_dir=%s", missing);
	fd = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (mkdir(dir, 0700) || fd < 0) {
		h_fail("making %s and %s: %s", dir, file, strerror(errno));
		return H_FAIL;
	}
	close(fd);

	expect_refused(&d, "a missing disk_dir", 2,
		       (const char *[]){ a_missing, "--disk_size=1M", NULL },
		       (const char *[]){ "disk_dir", missing, "mkdir -p", NULL });
	expect_refused(&d, "a disk_dir that is a file", 2,
		       (const char *[]){ a_file, "--disk_size=1M", NULL },
		       (const char *[]){ "disk_dir", file, "not a directory", NULL });
	expect_refused(&d, "disk_size without disk_dir", 2,
		       (const char *[]){ "--disk_size=1M", NULL },
		       (const char *[]){ "disk_size", "set disk_dir", NULL });
	expect_refused(&d, "disk_dir without disk_size", 2,
		       (const char *[]){ a_dir, NULL },
		       (const char *[]){ "disk_size", "set disk_size", NULL });
	expect_refused(&d, "a disk tier without a host tier", 2,
		       (const char *[]){ a_dir, "--disk_size=1M", "--host_mem=0", NULL },
		       (const char *[]){ "disk_dir", "host_mem", NULL });
	expect_refused(&d, "a bad disk_compress", 2,
		       (const char *[]){ a_dir, "--disk_size=1M", "--disk_compress=lz4",
					 NULL },
		       (const char *[]){ "disk_compress", "zstd:LEVEL", NULL });
	expect_refused(&d, "a tenant quota past the disk", 2,
		       (const char *[]){ a_dir, "--disk_size=1M",
					 "--tenant=a:uids=0:disk_size=2M", NULL },
		       (const char *[]){ "disk_size", "quota", NULL });

	/* A good one serves; a second on the same disk_dir is refused. */
	if (h_daemon_start(&d, 10000, a_dir, "--disk_size=1M", NULL)) {
		g_bad++;
	} else {
		if (h_daemon_dir(&d2, 0) == 0) {
			expect_refused(&d2, "a second kvpoold on the same disk_dir", 1,
				       (const char *[]){ a_dir, "--disk_size=1M", NULL },
				       (const char *[]){ "kvpool.disk", "another kvpoold",
							 NULL });
			h_daemon_cleanup(&d2);
		}
	}
	return h_daemon_finish(&d, g_bad, t0);
}
