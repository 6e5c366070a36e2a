/* fk_time.c: clock wrappers. */
#include "fk_time.h"

#include <errno.h>
#include <time.h>

static uint64_t fk__read(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * FK_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t fk_now_ns(void)
{
    return fk__read(CLOCK_MONOTONIC);
}

uint64_t fk_cpu_ns(void)
{
    return fk__read(CLOCK_PROCESS_CPUTIME_ID);
}

void fk_sleep_ns(uint64_t ns)
{
    struct timespec req = {.tv_sec = (time_t)(ns / FK_NSEC_PER_SEC),
                           .tv_nsec = (long)(ns % FK_NSEC_PER_SEC)};
    /* clock_nanosleep with a relative time reports the remainder in req on
     * EINTR, so the loop ends once the full duration has elapsed. */
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &req, &req) == EINTR)
        ;
}
