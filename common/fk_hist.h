/*
 * fk_hist.h: a log-linear latency histogram (HDR-histogram style).
 *
 * Values are unsigned 64-bit (nanoseconds, by convention). Values below
 * 2 * FK_HIST_SUB (256) are counted exactly. Above, each power of two
 * [2^k, 2^(k+1)) is cut into FK_HIST_SUB (128) equal buckets, so a bucket's
 * width is at most 1/128 of any value in it; a query answers with the
 * bucket's midpoint, so the relative error of any reported percentile is at
 * most 1/256 (0.4%), within the 1% the benchmarks require.
 *
 * Memory: FK_HIST_BUCKETS counters of 8 bytes = 59,392 bytes per histogram,
 * embedded in the struct; nothing is allocated, so recording is safe on hot
 * paths (one clz, a shift and an add).
 *
 * Thread safety: a histogram belongs to one thread. To combine histograms
 * from several threads, give each its own and fk_hist_merge() them.
 */
#ifndef FK_HIST_H
#define FK_HIST_H

#include <stdint.h>

#define FK_HIST_SUB_BITS 7
#define FK_HIST_SUB      (1u << FK_HIST_SUB_BITS)
/* Exact region [0, 2*SUB) plus SUB buckets for each power 2^k, k in
 * [SUB_BITS+1, 63]: 2*128 + (63 - 7) * 128 = 7424 buckets. */
#define FK_HIST_BUCKETS (2u * FK_HIST_SUB + (63u - FK_HIST_SUB_BITS) * FK_HIST_SUB)
_Static_assert(FK_HIST_BUCKETS == 7424, "bucket arithmetic");

struct fk_hist {
    uint64_t count;  /* values recorded */
    uint64_t min;    /* smallest value recorded (UINT64_MAX when empty) */
    uint64_t max;    /* largest value recorded (0 when empty) */
    long double sum; /* exact enough for a mean over 2^64 values */
    uint64_t buckets[FK_HIST_BUCKETS];
};

/* Empties h. Must be called before first use. */
void fk_hist_init(struct fk_hist *h);

/* Records one value. */
void fk_hist_record(struct fk_hist *h, uint64_t value);

/* Records value n times (n may be 0). */
void fk_hist_record_n(struct fk_hist *h, uint64_t value, uint64_t n);

/* Adds every count of src into dst. dst and src may not alias. */
void fk_hist_merge(struct fk_hist *dst, const struct fk_hist *src);

/* Returns the value at percentile p (0 <= p <= 100): the smallest recorded
 * value v such that at least p% of the values are <= v, reported as its
 * bucket's midpoint clamped to [min, max]. p = 0 gives min, p = 100 max.
 * Returns 0 for an empty histogram; p outside [0, 100] is clamped. */
uint64_t fk_hist_percentile(const struct fk_hist *h, double p);

/* The nearest rank (1-based) of percentile p among count sorted values:
 * ceil(p/100 * count) clamped to [1, count]. fk_hist_percentile answers with
 * the value of this rank; tests use it to compute exact percentiles. */
uint64_t fk_hist_rank(double p, uint64_t count);

/* Mean of the recorded values (exact, from the running sum); 0 when empty. */
double fk_hist_mean(const struct fk_hist *h);

/* Bucket index of a value, and the [lo, lo + width) range of a bucket.
 * Exposed for tests and for exporting Prometheus buckets. */
unsigned fk_hist_index(uint64_t value);
void fk_hist_bucket_range(unsigned index, uint64_t *lo, uint64_t *width);

#endif /* FK_HIST_H */
