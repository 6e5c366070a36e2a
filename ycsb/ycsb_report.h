/*
 * ycsb_report.h: YCSB's measurements, its text report and status line, and
 * the open-loop pacing of YCSB's ClientThread.
 *
 * Measurements follow DBWrapper and Measurements (site.ycsb): each operation
 * records its latency under its name ("READ") when its status is OK (or
 * BATCHED_OK), else under "<NAME>-FAILED", and counts its status under its
 * name; READ-MODIFY-WRITE, which CoreWorkload measures itself, never goes
 * to a -FAILED series. With measurement.interval = op the latency runs from the actual
 * start, with intended from the intended start (see struct ycsb_pace; YCSB
 * then prints it under the plain name), with both the second series is
 * printed as "Intended-<NAME>". Latencies are recorded in nanoseconds
 * (common/fk_hist.h, 0.4% relative error) and printed in microseconds,
 * truncated as YCSB's (int)(ns / 1000).
 *
 * The report is the exact text of YCSB's TextMeasurementsExporter for
 * OneMeasurementHdrHistogram, so YCSB result parsers read it:
 *   [OVERALL], RunTime(ms), 10007
 *   [OVERALL], Throughput(ops/sec), 9993.004896572399
 *   [READ], Operations, 95012
 *   [READ], AverageLatency(us), 101.24361554329979
 *   [READ], MinLatency(us), 61
 *   [READ], MaxLatency(us), 4419
 *   [READ], 50thPercentileLatency(us), 95
 *   [READ], 95thPercentileLatency(us), 147
 *   [READ], 99thPercentileLatency(us), 203
 *   [READ], Return=OK, 95012
 * Doubles are printed as Java's Double.toString (the shortest decimal that
 * reads back as the same double, JDK 19+ rules, "E" notation outside
 * [10^-3, 10^7)), longs in decimal; percentile names are YCSB's ordinals
 * ("50th", "99.9"). Series are printed in a fixed order (READ, UPDATE,
 * INSERT, SCAN, READ-MODIFY-WRITE, DELETE, CLEANUP; each followed by its
 * -FAILED series; then the Intended- series) where YCSB's order is that of a
 * hash map; the JVM's garbage-collector lines are left out.
 *
 * Threads: a struct ycsb_meas belongs to one driver thread (no locks on the
 * hot path); the main thread merges them after the threads stop. Everything
 * else here is pure.
 */
#ifndef YCSB_REPORT_H
#define YCSB_REPORT_H

#include "fk_hist.h"
#include "ycsb_gen.h"
#include "ycsb_workload.h"

#include <stdint.h>
#include <stdio.h>

/* YCSB's Status values, in the order the report prints them. */
enum ycsb_status {
    YCSB_ST_OK,
    YCSB_ST_ERROR,
    YCSB_ST_TIMEOUT,
    YCSB_ST_NOT_FOUND,
    YCSB_ST_NOT_IMPLEMENTED,
    YCSB_ST_UNEXPECTED_STATE,
    YCSB_ST_BAD_REQUEST,
    YCSB_ST_FORBIDDEN,
    YCSB_ST_SERVICE_UNAVAILABLE,
    YCSB_ST_BATCHED_OK,
    YCSB_ST__COUNT,
};

/* "OK", "ERROR", ... (Status.getName). */
const char *ycsb_status_name(enum ycsb_status st);
/* Maps a flowkv result to a status: >= 0 OK, FK_ENOTFOUND NOT_FOUND,
 * FK_ETIMEDOUT and -ETIMEDOUT TIMEOUT, FK_EINVAL and FK_ETOOBIG BAD_REQUEST,
 * FK_EAUTH FORBIDDEN, FK_EUNREACHABLE, FK_ENOTLEADER, FK_EBUSY, FK_EAGAIN and
 * -ECONNREFUSED SERVICE_UNAVAILABLE, anything else ERROR. */
enum ycsb_status ycsb_status_from_err(int rc);

/* Measured operations (DBWrapper's names plus CoreWorkload's RMW). */
enum ycsb_mop {
    YCSB_M_READ,
    YCSB_M_UPDATE,
    YCSB_M_INSERT,
    YCSB_M_SCAN,
    YCSB_M_RMW,
    YCSB_M_DELETE,
    YCSB_M_CLEANUP,
    YCSB_M__COUNT,
};

/* "READ", ..., "READ-MODIFY-WRITE", "DELETE", "CLEANUP". */
const char *ycsb_mop_name(enum ycsb_mop m);

enum { YCSB_SERIES_OP, YCSB_SERIES_INTENDED };

struct ycsb_meas {
    enum ycsb_interval interval;
    /* [series][operation][0: ok, 1: failed] */
    struct fk_hist hist[2][YCSB_M__COUNT][2];
    uint64_t status[YCSB_M__COUNT][YCSB_ST__COUNT];
};

/* 28 histograms of 59,392 bytes: about 1.7 MB per thread, allocated once.
 * Returns NULL when out of memory. */
struct ycsb_meas *ycsb_meas_create(enum ycsb_interval interval);
void ycsb_meas_destroy(struct ycsb_meas *m);
/* Empties every histogram and count. */
void ycsb_meas_reset(struct ycsb_meas *m);

/* Records one operation (DBWrapper.measure + reportStatus): latency end -
 * start and/or end - intended (ns, monotonic clock; a negative difference
 * counts as 0) by m->interval, and the status. Owning thread; no allocation. */
void ycsb_meas_record(struct ycsb_meas *m, enum ycsb_mop op, enum ycsb_status st,
                      int64_t intended_ns, int64_t start_ns, int64_t end_ns);

/* Adds src into dst (same interval mode; asserted). */
void ycsb_meas_merge(struct ycsb_meas *dst, const struct ycsb_meas *src);

/* Writes the report: the two [OVERALL] lines, then every series that has a
 * latency or a status, with the given percentiles. runtime_ms is the run's
 * wall time, opsdone the operations done (Throughput = 1000.0 * opsdone /
 * runtime_ms, a Java double division). Returns 0 or -EIO. Main thread. */
int ycsb_report_write(FILE *out, const struct ycsb_meas *m, int64_t runtime_ms, uint64_t opsdone,
                      const double *percentiles, unsigned npercentiles);

/* ---- number formatting (Java's) -------------------------------------------- */

/* Double.toString(d) into buf; returns the length (buf holds >= 32 bytes). */
int ycsb_java_double(char *buf, size_t len, double d);
/* new DecimalFormat("#.##").format(d): at most 2 decimals, rounded half-even,
 * no trailing zeros; NaN as U+FFFD and infinity as U+221E (UTF-8), as Java. */
int ycsb_java_decimal2(char *buf, size_t len, double d);
/* OneMeasurementHdrHistogram.ordinal: "50th", "1st", "12th", "99.9". */
int ycsb_java_ordinal(char *buf, size_t len, double p);

/* ---- status line (-s) ------------------------------------------------------ */

struct ycsb_status_args {
    const char *label;         /* -l label ("" for none) */
    int64_t wall_ms;           /* time of day to print, ms since the epoch */
    int64_t start_ms;          /* start of the run */
    int64_t interval_start_ms; /* start of this interval */
    int64_t now_ms;            /* now (same clock as the two above) */
    uint64_t totalops;         /* operations done so far, all threads */
    uint64_t lastops;          /* totalops at the start of this interval */
    uint64_t todoops;          /* operations still to do (0: unknown/none) */
};

/* StatusThread.computeStats' line:
 *   "<label><yyyy-MM-dd HH:mm:ss:SSS> <s> sec: <n> operations; <x> current
 *   ops/sec; est completion in <t> [READ: Count=.., Max=.., Min=.., Avg=..,
 *   90=.., 99=.., 99.9=.., 99.99=..] "
 * with the time of day in local time. The bracketed summaries come from
 * interval (this interval's measurements; may be NULL) for each series that
 * exists in total (the run's so far; NULL: use interval). Returns the length,
 * or FK_ETOOBIG when buf (len bytes) is too small. Pure. */
int ycsb_status_line(char *buf, size_t len, const struct ycsb_status_args *a,
                     const struct ycsb_meas *total, const struct ycsb_meas *interval);

/* RemainingFormatter.format(seconds): "2 hours 5 minutes ", "7 second ". */
int ycsb_remaining(char *buf, size_t len, int64_t seconds);

/* ---- open-loop pacing (ClientThread.throttleNanos) ------------------------- */

struct ycsb_pace {
    int64_t start_ns; /* the thread's start (after its initial delay) */
    int64_t tick_ns;  /* ns between intended starts; 0: closed loop */
};

/* Per-thread pacing for target ops/s shared by threads threads: tick =
 * (long)(1e6 / (target / threads / 1000.0)) ns, as YCSB; target 0 gives a
 * closed loop (each operation intended to start when it starts). Returns 0
 * or FK_EINVAL (threads < 1, target < 0). */
int ycsb_pace_init(struct ycsb_pace *p, int32_t target, int32_t threads, int64_t start_ns);
/* Intended start of the thread's operation k (0-based): start + k * tick,
 * saturating. For a closed loop returns now_ns. Latency is measured from it,
 * so time spent queued behind a slow operation is counted. */
int64_t ycsb_pace_intended(const struct ycsb_pace *p, uint64_t k, int64_t now_ns);
/* YCSB spreads threads whose rate is at most one operation per ms by a
 * random delay in [0, tick) before they start; else 0. */
int64_t ycsb_pace_initial_delay(const struct ycsb_pace *p, struct ycsb_rng *rng);

#endif /* YCSB_REPORT_H */
