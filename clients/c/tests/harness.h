/* harness.h — the C tests' checks and runner: each test runs in a forked child (a crash or a hang fails
 * that test alone), IBVB_TEST=substring runs a subset. Test-only; include once per test program. */
#ifndef IBVB_TESTS_HARNESS_H
#define IBVB_TESTS_HARNESS_H

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ibvbridge.h"

static int g_fail;

/* CHECK / CHECK_EQ fail the running test and return from the function they are in. */
#define CHECK(c)                                                                                                \
	do {                                                                                                    \
		if (!(c)) {                                                                                     \
			fprintf(stderr, "    %s:%d: CHECK(%s) failed [last error: %s]\n", __FILE__, __LINE__, #c,   \
				ibvb_last_error());                                                             \
			g_fail = 1;                                                                             \
			return;                                                                                 \
		}                                                                                               \
	} while (0)
#define CHECK_EQ(a, b)                                                                                          \
	do {                                                                                                    \
		long long _a = (long long)(a), _b = (long long)(b);                                             \
		if (_a != _b) {                                                                                 \
			fprintf(stderr, "    %s:%d: %s == %lld, want %s == %lld [last error: %s]\n", __FILE__,      \
				__LINE__, #a, _a, #b, _b, ibvb_last_error());                                   \
			g_fail = 1;                                                                             \
			return;                                                                                 \
		}                                                                                               \
	} while (0)

static inline int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void msleep(int ms) { usleep((useconds_t)ms * 1000); }

/* Entries of /proc/self/fd (open descriptors, plus the directory's own), -1 if unreadable. */
static inline int count_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* Lines of /proc/self/maps: this process's mappings. */
static inline int count_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	int n = 0, c;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

struct test {
	const char *name;
	void (*fn)(void);
};

/* rm_tree removes dir and everything below it (not following links). */
static inline void rm_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char path[1024];
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path)
			continue;
		struct stat st;
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
			rm_tree(path);
		else
			unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

/* run_tests runs each test in a child with a 60 s alarm, prints a line per test and the totals, removes
 * dir, and returns the process exit status (0: all passed). */
static inline int run_tests(const struct test *tests, size_t n, const char *dir)
{
	signal(SIGPIPE, SIG_IGN);
	const char *only = getenv("IBVB_TEST");
	int passed = 0, failed = 0;
	for (size_t i = 0; i < n; i++) {
		if (only && !strstr(tests[i].name, only))
			continue;
		fflush(stdout);
		int64_t t0 = now_ms();
		pid_t pid = fork();
		if (pid == 0) {
			alarm(60);
			g_fail = 0;
			tests[i].fn();
			_exit(g_fail ? 1 : 0);
		}
		int st;
		waitpid(pid, &st, 0);
		int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (WIFSIGNALED(st))
			fprintf(stderr, "    killed by signal %d%s\n", WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (hang)" : "");
		printf("%-32s %s (%lld ms)\n", tests[i].name, ok ? "ok" : "FAIL", (long long)(now_ms() - t0));
		if (ok)
			passed++;
		else
			failed++;
	}
	rm_tree(dir);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}

#endif
