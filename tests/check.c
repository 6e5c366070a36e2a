/* check.c: the test harness runner; see check.h for the contract. */
#include "check.h"

#include "fk_error.h"

#include <errno.h>
#include <fnmatch.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK_MAX_TESTS 512

struct check_entry {
    const char *name;
    check_fn fn;
};

static struct check_entry check__tests[CHECK_MAX_TESTS];
static int check__ntests;

void check__register(const char *name, check_fn fn)
{
    if (check__ntests >= CHECK_MAX_TESTS) {
        fprintf(stderr, "check: more than %d tests in one program\n", CHECK_MAX_TESTS);
        abort();
    }
    check__tests[check__ntests].name = name;
    check__tests[check__ntests].fn = fn;
    check__ntests++;
}

const char *check__errname(int err)
{
    return fk_err_name(err);
}

void check__fail(const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The parent reads this line from the pipe and prints it on the
     * "not ok" line, so the failure names what it checked. */
    fprintf(stdout, "%s:%d: %s\n", file, line, msg);
    fflush(stdout);
    _exit(1);
}

static double check__ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Reads the child's output into buf (keeping the tail) until every
 * writer closed the pipe. The timeout is enforced here too, not only by
 * the child's alarm: a process the test forked does not inherit the alarm
 * and may hold the pipe open (or the child itself may be stuck where
 * SIGALRM cannot end it), so past the deadline, or once the child has
 * exited and the pipe stays open for CHECK__GRACE_S, the test's whole
 * process group is killed. Returns 1 when it had to kill for the timeout. */
#define CHECK__GRACE_S 5
static int check__collect(int fd, pid_t pid, unsigned timeout_s, char *buf, size_t cap,
                          size_t *used, int *status, int *reaped)
{
    time_t start = time(NULL), exited = 0;
    int killed = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, 1000);
        if (r > 0) {
            ssize_t n = read(fd, buf + *used, cap - 1 - *used);
            if (n == 0)
                return killed;
            if (n > 0) {
                *used += (size_t)n;
                if (*used >= cap - 1) { /* keep the tail: drop the first half */
                    memmove(buf, buf + *used / 2, *used - *used / 2);
                    *used -= *used / 2;
                }
            } else if (errno != EINTR) {
                return killed;
            }
        }
        time_t now = time(NULL);
        if (!*reaped && waitpid(pid, status, WNOHANG) == pid) {
            *reaped = 1;
            exited = now;
        }
        if (!killed && now - start > (time_t)timeout_s + CHECK__GRACE_S) {
            kill(-pid, SIGKILL);
            killed = 1;
        } else if (*reaped && now - exited > CHECK__GRACE_S) {
            kill(-pid, SIGKILL); /* the test left processes holding the pipe */
            return killed;
        }
        if (killed && now - start > (time_t)timeout_s + 3 * CHECK__GRACE_S)
            return killed; /* something outside the group still holds it */
    }
}

/* Runs one test in a child; returns 1 on pass. why receives the reason. */
static int check__run_one(const struct check_entry *t, unsigned timeout_s, char *why, size_t cap)
{
    int pfd[2];
    if (pipe(pfd) != 0) {
        snprintf(why, cap, "pipe: %s", strerror(errno));
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return 0;
    }
    if (pid == 0) {
        setpgid(0, 0); /* the test and what it forks: one group to end on a timeout */
        close(pfd[0]);
        dup2(pfd[1], 1);
        close(pfd[1]);
        alarm(timeout_s);
        t->fn();
        fflush(stdout);
        _exit(0);
    }
    setpgid(pid, pid); /* also here: whichever runs first */
    close(pfd[1]);
    /* Collect the child's stdout: failure messages and any test chatter.
     * The last line is kept as the reason. */
    char buf[4096];
    size_t used = 0;
    int status = 0, reaped = 0;
    int killed = check__collect(pfd[0], pid, timeout_s, buf, sizeof buf, &used, &status, &reaped);
    close(pfd[0]);
    buf[used] = '\0';
    while (!reaped && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !killed)
        return 1;
    while (used > 0 && buf[used - 1] == '\n')
        buf[--used] = '\0';
    char *last = strrchr(buf, '\n');
    if (last != NULL) {
        /* A multi-line failure message or test chatter: show all of it as
         * comment lines, then the last line becomes the reason. */
        *last = '\0';
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
            printf("#   %s\n", line);
        last++;
    } else {
        last = buf;
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(why, cap, "killed by signal %d (%s)%s%s%.2000s", sig, strsignal(sig),
                 sig == SIGALRM || killed ? ", timed out" : "", *last ? "; last output: " : "",
                 last);
    } else if (killed) {
        snprintf(why, cap, "timed out: processes it started still ran after %u s and were killed",
                 timeout_s + CHECK__GRACE_S);
    } else {
        if (*last)
            snprintf(why, cap, "%.2200s", last);
        else
            snprintf(why, cap,
                     "exited with status %d (a sanitizer report, if any, is on stderr above)",
                     WEXITSTATUS(status));
    }
    return 0;
}

int check_main(int argc, char **argv)
{
    const char *prog = strrchr(argv[0], '/');
    prog = prog ? prog + 1 : argv[0];
    const char *pattern = argc > 1 ? argv[1] : "*";
    const char *tenv = getenv("CHECK_TIMEOUT");
    unsigned timeout_s = tenv ? (unsigned)strtoul(tenv, NULL, 10) : 120;
    if (timeout_s == 0)
        timeout_s = 120;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int passed = 0, failed = 0, n = 0;
    for (int i = 0; i < check__ntests; i++) {
        const struct check_entry *t = &check__tests[i];
        if (fnmatch(pattern, t->name, 0) != 0)
            continue;
        n++;
        char why[2300] = "";
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (check__run_one(t, timeout_s, why, sizeof why)) {
            passed++;
            printf("ok %d - %s (%.0f ms)\n", n, t->name, check__ms_since(&t0));
        } else {
            failed++;
            printf("not ok %d - %s: %s\n", n, t->name, why);
        }
    }
    printf("# check: %s passed=%d failed=%d\n", prog, passed, failed);
    return failed > 0 || passed == 0 ? 1 : 0;
}
