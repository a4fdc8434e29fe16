/* Two parties hand a token back and forth through a futex word: the cost of one wake-and-sleep per
   party per round, as recv and a consumer pay per heap when each waits for the other.

     pingpong ROUNDS [processes|threads] [GAP_US]

   processes: two processes share the word (recv and a consumer); threads: two threads of one process
   (spead2's reader thread and its Python thread). GAP_US: the first party sleeps that long before each
   hand-over, as heaps come spaced by the stream's rate: the other waits idle, and so may the core. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static _Atomic unsigned *word;
static int rounds, gap_us;

static long fx(int op, unsigned v) { return syscall(SYS_futex, word, op, v, NULL, NULL, 0); }

static double cpu_us(int who) {
    struct rusage ru;
    getrusage(who, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

/* play takes turn me (0 or 1) of every round and returns its CPU per round (the first party's includes
   its gap sleeps: the second's is the wake alone). */
static double play(int me, int who) {
    struct timespec gap = {0, gap_us * 1000L};
    for (int i = 0; i < rounds; i++) {
        unsigned want = 2 * i + me, v;
        while ((v = atomic_load(word)) != want) fx(FUTEX_WAIT, v);
        if (me == 0 && gap_us > 0) nanosleep(&gap, NULL);
        atomic_store(word, want + 1);
        fx(FUTEX_WAKE, 1);
    }
    return cpu_us(who) / rounds;
}

static double second;
static void *second_thread(void *arg) {
    (void)arg;
    second = play(1, RUSAGE_THREAD);
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atoi(argv[1]) : 100000;
    int threads = argc > 2 && strcmp(argv[2], "threads") == 0;
    gap_us = argc > 3 ? atoi(argv[3]) : 0;
    if (rounds <= 0 || gap_us < 0 || gap_us >= 1000000 || (argc > 2 && !threads && strcmp(argv[2], "processes") != 0)) {
        fprintf(stderr, "usage: pingpong ROUNDS [processes|threads] [GAP_US (0-999999)]\n");
        return 2;
    }
    word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (word == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double first;
    if (threads) {
        pthread_t t;
        if (pthread_create(&t, NULL, second_thread, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
        first = play(0, RUSAGE_THREAD);
        pthread_join(t, NULL);
    } else {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            printf("  second process: %.2f us CPU per round\n", play(1, RUSAGE_SELF));
            return 0;
        }
        first = play(0, RUSAGE_SELF);
        int st;
        waitpid(pid, &st, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (threads) printf("  second thread: %.2f us CPU per round\n", second);
    printf("  first %s: %.2f us CPU per round; %.2f us wall per round\n", threads ? "thread" : "process", first,
           ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / rounds);
    return 0;
}
