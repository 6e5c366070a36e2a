/* A test program that must fail in every way the harness has to catch.
 * tests/integration/test_harness.sh runs it through tests/run.sh and checks
 * that each failure is reported and counted; it is never run on its own. */
#include "check.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

TEST(passes)
{
    CHECK_EQ_I64(2 + 2, 4);
}

TEST(check_fails)
{
    int two = 2;
    CHECK_EQ_I64(two + 2, 5);
}

TEST(crashes)
{
    raise(SIGSEGV);
}

TEST(aborts)
{
    abort();
}

TEST(hangs)
{
    for (int i = 0; i < 100; i++)
        sleep(1); /* CHECK_TIMEOUT=1 ends it long before */
}

/* Stuck where SIGALRM cannot end it (blocked), with a forked process that
 * holds the output pipe and never got the alarm: the harness must still
 * end both (tests/check.c, check__collect). */
TEST(hangs_with_a_child)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGALRM);
    sigprocmask(SIG_BLOCK, &s, NULL);
    if (fork() == 0) {
        for (int i = 0; i < 100; i++)
            sleep(1);
        _exit(0);
    }
    for (int i = 0; i < 100; i++)
        sleep(1);
}

CHECK_MAIN()
