/* spawn-cost.c: what one process start costs, by way of starting it.
 *
 *   cc -O2 -o /tmp/spawn-cost bench/spawn/spawn-cost.c
 *   /tmp/spawn-cost ROUNDS BIN
 *
 * Each round times, in turn (interleaved, so a busy moment hits every row):
 *   fork          fork(), the child _exits at once, parent waits
 *   vfork+exec    posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK)) of BIN
 *                 __runner with stdin at EOF (it reads no config and exits 1:
 *                 the exec and start-up of the whole binary up to its main)
 *   fork+exec     fork() then execv of the same
 *   small exec    posix_spawn of /bin/true (a small dynamically linked
 *                 program: the floor a dedicated small entry binary nears)
 * and prints the median and minimum of each in microseconds.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

static void spawn_wait(char *const argv[]) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) == 0) waitpid(pid, NULL, 0);
    posix_spawn_file_actions_destroy(&fa);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s ROUNDS BIN\n", argv[0]); return 2; }
    int rounds = atoi(argv[1]);
    char *bin[] = {argv[2], "__runner", "bench", NULL};
    char *small[] = {"/bin/true", NULL};
    const char *names[] = {"fork", "vfork+exec BIN", "fork+exec BIN", "small exec (/bin/true)"};
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = calloc(rounds, sizeof(double));
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        pid_t p = fork();
        if (p == 0) _exit(0);
        waitpid(p, NULL, 0);
        t[0][r] = now() - t0;
        t0 = now(); spawn_wait(bin); t[1][r] = now() - t0;
        t0 = now();
        p = fork();
        if (p == 0) {
            int null = open("/dev/null", O_RDWR);
            dup2(null, 0); dup2(null, 2);
            execv(bin[0], bin);
            _exit(127);
        }
        waitpid(p, NULL, 0);
        t[2][r] = now() - t0;
        t0 = now(); spawn_wait(small); t[3][r] = now() - t0;
    }
    for (int k = 0; k < 4; k++) {
        qsort(t[k], rounds, sizeof(double), cmp);
        printf("{\"name\": \"%s\", \"rounds\": %d, \"median_us\": %.0f, \"min_us\": %.0f}\n", names[k], rounds, t[k][rounds / 2], t[k][0]);
    }
    return 0;
}
