/*
 * fk_metrics.h: a fixed-size metrics registry rendered as Prometheus text
 * (exposition format 0.0.4).
 *
 * Three kinds of metric:
 *   counter  a monotonically increasing uint64 (fk_metric_add)
 *   gauge    a uint64 set with fk_metric_set, or read through a callback at
 *            render time (fk_metrics_gauge_fn) for values owned elsewhere
 *   summary  a pointer to an fk_hist (nanoseconds) rendered as quantiles
 *            0.5, 0.9, 0.99, 0.999 plus _sum and _count, in seconds
 *
 * A metric is a (name, labels) pair; several metrics may share a name with
 * different labels (e.g. op="get", op="put"); HELP and TYPE are printed once
 * per name, from the first registration.
 *
 * Memory: FK_METRICS_MAX entries embedded in the registry; registration
 * never allocates; updating is one relaxed atomic add.
 *
 * Thread safety: counters and set-gauges may be updated from any thread.
 * Registration and rendering must happen on one thread (the owner), and a
 * summary's histogram and a gauge callback's data must belong to that
 * thread, since rendering reads them without locks.
 */
#ifndef FK_METRICS_H
#define FK_METRICS_H

#include "fk_hist.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FK_METRICS_MAX       128
#define FK_METRICS_NAME_MAX  64
#define FK_METRICS_LABEL_MAX 96

enum fk_metric_kind { FK_METRIC_COUNTER, FK_METRIC_GAUGE, FK_METRIC_SUMMARY, FK_METRIC_HISTOGRAM };

/* A histogram's upper bounds (seconds), le="..." in the text format, then
 * +Inf: Prometheus' default buckets below 100 us stretched down to 50 us,
 * where a replica's latencies start. Cumulative counts are read off the
 * fk_hist (a value counts in the first bound at or above its fk_hist
 * bucket, within 1/128 of it). */
#define FK_METRICS_BUCKETS 14

typedef uint64_t (*fk_gauge_fn)(void *arg);

struct fk_metric {
    char name[FK_METRICS_NAME_MAX];
    char labels[FK_METRICS_LABEL_MAX]; /* 'op="get"' or "" */
    const char *help;                  /* static string */
    enum fk_metric_kind kind;
    _Atomic uint64_t value; /* counter or set-gauge */
    fk_gauge_fn fn;         /* callback gauge, or NULL */
    void *fn_arg;
    const struct fk_hist *hist; /* summary, histogram */
    int ns_as_seconds;          /* counter or gauge whose value is in ns: rendered in s */
};

struct fk_metrics {
    unsigned n;
    struct fk_metric m[FK_METRICS_MAX];
};

void fk_metrics_init(struct fk_metrics *r);

/* Each registration returns the metric (owned by r, valid while r lives) or
 * NULL when the registry is full or an argument is invalid: name must match
 * [a-zA-Z_:][a-zA-Z0-9_:]* and fit FK_METRICS_NAME_MAX; labels must fit and
 * contain no newline; help must be a static string without newline. */
struct fk_metric *fk_metrics_counter(struct fk_metrics *r, const char *name, const char *labels,
                                     const char *help);
struct fk_metric *fk_metrics_gauge(struct fk_metrics *r, const char *name, const char *labels,
                                   const char *help);
struct fk_metric *fk_metrics_gauge_fn(struct fk_metrics *r, const char *name, const char *labels,
                                      const char *help, fk_gauge_fn fn, void *arg);
/* A counter whose value fn reads at each render (a total kept elsewhere,
 * e.g. the fabric's). */
struct fk_metric *fk_metrics_counter_fn(struct fk_metrics *r, const char *name, const char *labels,
                                        const char *help, fk_gauge_fn fn, void *arg);
struct fk_metric *fk_metrics_summary(struct fk_metrics *r, const char *name, const char *labels,
                                     const char *help, const struct fk_hist *h);
/* A histogram (h in nanoseconds, rendered in seconds): _bucket{le=...}
 * cumulative counts, _sum and _count, which can be summed across replicas
 * as a summary's quantiles cannot. */
struct fk_metric *fk_metrics_histogram(struct fk_metrics *r, const char *name, const char *labels,
                                       const char *help, const struct fk_hist *h);

static inline void fk_metric_add(struct fk_metric *m, uint64_t n)
{
    atomic_fetch_add_explicit(&m->value, n, memory_order_relaxed);
}

static inline void fk_metric_set(struct fk_metric *m, uint64_t v)
{
    atomic_store_explicit(&m->value, v, memory_order_relaxed);
}

/* Renders every metric into buf (capacity cap, NUL-terminated), in the
 * Prometheus text format: each family's HELP and TYPE once, then all its
 * samples together (families in the order their first metric was
 * registered). Returns the length, or FK_ETOOBIG when cap is too small
 * (buf then holds a prefix). */
int fk_metrics_render(const struct fk_metrics *r, char *buf, size_t cap);

#endif /* FK_METRICS_H */
