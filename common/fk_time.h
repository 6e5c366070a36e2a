/*
 * fk_time.h: monotonic time in nanoseconds.
 *
 * Protocol cores never call these: their time is an argument ("now"), so the
 * simulator can drive them in virtual time (STYLE.md point 1). Only drivers
 * (server, flows, benchmarks) read the clock.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef FK_TIME_H
#define FK_TIME_H

#include <stdint.h>

#define FK_NSEC_PER_USEC 1000ULL
#define FK_NSEC_PER_MSEC 1000000ULL
#define FK_NSEC_PER_SEC  1000000000ULL

/* Nanoseconds from CLOCK_MONOTONIC: never goes backwards, unaffected by
 * wall-clock changes, arbitrary epoch. */
uint64_t fk_now_ns(void);

/* Nanoseconds of CPU time used by this process (CLOCK_PROCESS_CPUTIME_ID),
 * for "operations per CPU-second" figures. */
uint64_t fk_cpu_ns(void);

/* Sleeps at least ns nanoseconds (restarting after signals). */
void fk_sleep_ns(uint64_t ns);

#endif /* FK_TIME_H */
