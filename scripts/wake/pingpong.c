/* Two processes hand a token back and forth through futex words in shared memory: the cost of one
   wake-and-sleep per process per round, as recv and a consumer pay per heap when each waits for the other. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static long fx(_Atomic unsigned *a, int op, unsigned v) { return syscall(SYS_futex, a, op, v, NULL, NULL, 0); }
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    _Atomic unsigned *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    w[0] = 0; /* turn: even = parent, odd = child */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    int me = pid == 0;
    for (int i = 0; i < n; i++) {
        unsigned want = 2 * i + me;
        unsigned v;
        while ((v = atomic_load(&w[0])) != want) fx(&w[0], FUTEX_WAIT, v);
        atomic_store(&w[0], want + 1);
        fx(&w[0], FUTEX_WAKE, 1);
    }
    if (me) {
        struct rusage ru; getrusage(RUSAGE_SELF, &ru);
        printf("child: %.2f us CPU per round\n", (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 / n + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / (double)n);
        return 0;
    }
    int st; waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct rusage ru; getrusage(RUSAGE_SELF, &ru);
    printf("parent: %.2f us CPU per round; %.2f us wall per round\n", (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 / n + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / (double)n,
           ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n);
    return 0;
}
