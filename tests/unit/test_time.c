/* Unit tests for common/fk_time. */
#include "check.h"
#include "fk_time.h"

TEST(time_is_monotonic)
{
    uint64_t prev = fk_now_ns();
    for (int i = 0; i < 100000; i++) {
        uint64_t now = fk_now_ns();
        CHECK_MSG(now >= prev, "clock went back: %lu < %lu", (unsigned long)now,
                  (unsigned long)prev);
        prev = now;
    }
}

TEST(sleep_sleeps_at_least_the_requested_time)
{
    uint64_t t0 = fk_now_ns();
    fk_sleep_ns(20 * FK_NSEC_PER_MSEC);
    uint64_t dt = fk_now_ns() - t0;
    CHECK_MSG(dt >= 20 * FK_NSEC_PER_MSEC, "slept only %lu ns", (unsigned long)dt);
    /* Upper bound generous enough for a loaded 2-core CI machine. */
    CHECK_MSG(dt < 2 * FK_NSEC_PER_SEC, "slept %lu ns", (unsigned long)dt);
}

TEST(cpu_time_advances_with_work)
{
    uint64_t c0 = fk_cpu_ns();
    volatile uint64_t x = 0;
    for (uint64_t i = 0; i < 20000000; i++)
        x += i;
    CHECK(fk_cpu_ns() > c0);
}

CHECK_MAIN()
