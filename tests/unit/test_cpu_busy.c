/* SPDX-License-Identifier: MIT */
/*
 * test_cpu_busy - lib/cpu_busy.[ch]: the runnable count is read from
 * /proc/loadavg's text; with more spinning threads than cores the test says
 * busy within a few periods; the answer is cached for a period (no /proc
 * read per call); KVPOOL_SPIN=always turns the test off (a child process:
 * the setting is read once per process).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "cpu_busy.h"

static void test_parse(void **state)
{
	(void)state;
	assert_int_equal(cpu_busy_parse_running("0.50 0.40 0.30 3/456 12345\n"), 3);
	assert_int_equal(cpu_busy_parse_running("12.00 9.10 4.00 40/1203 99"), 40);
	assert_int_equal(cpu_busy_parse_running("0.50 0.40"), 0);
	assert_int_equal(cpu_busy_parse_running(""), 0);
}

static volatile int spin_stop;

static void *spinner(void *arg)
{
	(void)arg;
	while (!spin_stop)
		;
	return NULL;
}

static void test_busy_when_oversubscribed(void **state)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t n = (uint32_t)cores + 3;
	pthread_t *t = calloc(n, sizeof(*t));
	uint64_t until;
	bool busy = false;

	(void)state;
	assert_non_null(t);
	spin_stop = 0;
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(pthread_create(&t[i], NULL, spinner, NULL), 0);
	/* nr_running is sampled by the kernel as it is read: poll a while. */
	until = mono_ns() + 2000000000ull;
	while (!busy && mono_ns() < until) {
		usleep(3000);
		busy = cpu_busy(mono_ns());
	}
	spin_stop = 1;
	for (uint32_t i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	free(t);
	assert_true(busy);
	/* Cached for a period: the same instant gives the same answer even
	 * though the spinners are gone. */
	{
		uint64_t now = mono_ns();
		bool a = cpu_busy(now);

		assert_true(cpu_busy(now + 1) == a);
	}
}

static void test_spin_always(void **state)
{
	pid_t pid;
	int st;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int bad = 0;

		setenv("KVPOOL_SPIN", "always", 1);
		/* Even with more cores spinning than there are, the test is off. */
		for (long i = 0; i < sysconf(_SC_NPROCESSORS_ONLN) + 2; i++)
			if (fork() == 0) {
				uint64_t end = mono_ns() + 200000000ull;

				while (mono_ns() < end)
					;
				_exit(0);
			}
		for (int i = 0; i < 20; i++) {
			bad |= cpu_busy(mono_ns() + (uint64_t)i * CPU_BUSY_PERIOD_NS);
			usleep(5000);
		}
		while (wait(NULL) > 0)
			;
		_exit(bad);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_spin_always),
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_busy_when_oversubscribed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
