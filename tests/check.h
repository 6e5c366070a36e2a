/*
 * check.h: flowkv's in-tree test harness.
 *
 * Why in-tree rather than cmocka/Check/Criterion: flowkv tests fork server
 * processes, run under ASan/TSan, inside a Soft-RoCE VM from a read-only
 * root, and from shell scripts; one tiny harness with one output format
 * (aggregated by tests/run.sh into "N passed, M failed") covers all of them
 * without a dependency that must exist inside the VM too.
 *
 * Usage:
 *   #include "check.h"
 *   TEST(hist_exact_small) { CHECK_EQ_U64(fk_hist_percentile(&h, 50), 7); }
 *   CHECK_MAIN()  // optional: a main() that runs every TEST in the file
 *
 * Each TEST runs in a forked child with an alarm of CHECK_TIMEOUT_S seconds
 * (environment CHECK_TIMEOUT, default 120), so a crash, an abort, a sanitizer
 * report or a hang fails that test and the others still run. A failing
 * CHECK prints the file, line, the expression and both values, then ends the
 * test. Output lines:
 *   ok <n> - <name> (<ms> ms)
 *   not ok <n> - <name>: <why>
 *   # check: <program> passed=<P> failed=<F>
 * Run one test: ./test_prog <name>  (or a prefix ending in '*').
 */
#ifndef FK_CHECK_H
#define FK_CHECK_H

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

typedef void (*check_fn)(void);

void check__register(const char *name, check_fn fn);
void check__fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
int check_main(int argc, char **argv);

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void test__reg_##name(void)                                \
    {                                                                                              \
        check__register(#name, test_##name);                                                       \
    }                                                                                              \
    static void test_##name(void)

#define CHECK_MAIN()                                                                               \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        return check_main(argc, argv);                                                             \
    }

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check__fail(__FILE__, __LINE__, "CHECK(%s) is false", #cond);                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check__fail(__FILE__, __LINE__, __VA_ARGS__);                                          \
    } while (0)

#define CHECK_EQ_I64(a, b)                                                                         \
    do {                                                                                           \
        int64_t check_a_ = (int64_t)(a), check_b_ = (int64_t)(b);                                  \
        if (check_a_ != check_b_)                                                                  \
            check__fail(__FILE__, __LINE__, "%s == %s: %" PRId64 " != %" PRId64, #a, #b, check_a_, \
                        check_b_);                                                                 \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                         \
    do {                                                                                           \
        uint64_t check_a_ = (uint64_t)(a), check_b_ = (uint64_t)(b);                               \
        if (check_a_ != check_b_)                                                                  \
            check__fail(__FILE__, __LINE__, "%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, check_a_, \
                        check_b_);                                                                 \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *check_a_ = (a), *check_b_ = (b);                                               \
        if (check_a_ == NULL || check_b_ == NULL || strcmp(check_a_, check_b_) != 0)               \
            check__fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,                  \
                        check_a_ ? check_a_ : "(null)", check_b_ ? check_b_ : "(null)");           \
    } while (0)

/* A call that returns a flowkv error code must succeed (>= 0). */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        long check_rc_ = (long)(expr);                                                             \
        if (check_rc_ < 0)                                                                         \
            check__fail(__FILE__, __LINE__, "%s failed: %ld (%s)", #expr, check_rc_,               \
                        check__errname((int)check_rc_));                                           \
    } while (0)

/* A call must fail with exactly the given error code. */
#define CHECK_ERR(expr, code)                                                                      \
    do {                                                                                           \
        long check_rc_ = (long)(expr);                                                             \
        if (check_rc_ != (long)(code))                                                             \
            check__fail(__FILE__, __LINE__, "%s: expected %s, got %ld (%s)", #expr, #code,         \
                        check_rc_, check__errname((int)check_rc_));                                \
    } while (0)

/* Names an error code without making the harness depend on common/. */
const char *check__errname(int err);

#endif /* FK_CHECK_H */
