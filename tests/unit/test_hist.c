/* Unit tests for common/fk_hist: every percentile is checked against the
 * exact nearest-rank value computed from the recorded samples. */
#include "check.h"
#include "fk_hist.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64: a fixed seed per test keeps failures reproducible. */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static const double percentiles[] = {0, 0.1, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100};

/* Records samples, then checks each percentile against the sorted samples
 * within 1% relative error, and min/max/mean exactly. */
static void check_against_exact(uint64_t *samples, size_t n, const char *what)
{
    static struct fk_hist h;
    fk_hist_init(&h);
    long double sum = 0;
    for (size_t i = 0; i < n; i++) {
        fk_hist_record(&h, samples[i]);
        sum += samples[i];
    }
    qsort(samples, n, sizeof *samples, cmp_u64);
    CHECK_EQ_U64(h.count, n);
    CHECK_EQ_U64(h.min, samples[0]);
    CHECK_EQ_U64(h.max, samples[n - 1]);
    double mean = (double)(sum / n);
    CHECK_MSG(fabs(fk_hist_mean(&h) - mean) <= mean * 1e-9, "%s: mean %f != %f", what,
              fk_hist_mean(&h), mean);
    for (size_t i = 0; i < sizeof percentiles / sizeof percentiles[0]; i++) {
        double p = percentiles[i];
        uint64_t exact = samples[fk_hist_rank(p, n) - 1];
        uint64_t got = fk_hist_percentile(&h, p);
        double err = fabs((double)got - (double)exact);
        CHECK_MSG(err <= 0.01 * (double)exact, "%s: p%g = %lu, exact %lu (error %.3f%%)", what, p,
                  (unsigned long)got, (unsigned long)exact, 100.0 * err / (double)exact);
    }
}

TEST(hist_empty)
{
    static struct fk_hist h;
    fk_hist_init(&h);
    CHECK_EQ_U64(fk_hist_percentile(&h, 50), 0);
    CHECK_EQ_U64(h.count, 0);
    CHECK(fk_hist_mean(&h) == 0.0);
}

TEST(hist_small_values_are_exact)
{
    static struct fk_hist h;
    fk_hist_init(&h);
    for (uint64_t v = 1; v <= 200; v++)
        fk_hist_record(&h, v);
    /* 1..200: nearest-rank p50 is 100, p99 is 198, p0.5 is 1. */
    CHECK_EQ_U64(fk_hist_percentile(&h, 50), 100);
    CHECK_EQ_U64(fk_hist_percentile(&h, 99), 198);
    CHECK_EQ_U64(fk_hist_percentile(&h, 0.5), 1);
    CHECK_EQ_U64(fk_hist_percentile(&h, 100), 200);
}

TEST(hist_rank_definition)
{
    CHECK_EQ_U64(fk_hist_rank(50, 100), 50);
    CHECK_EQ_U64(fk_hist_rank(99.9, 1000), 999);
    CHECK_EQ_U64(fk_hist_rank(0, 10), 1);
    CHECK_EQ_U64(fk_hist_rank(100, 10), 10);
    CHECK_EQ_U64(fk_hist_rank(50, 3), 2);
    CHECK_EQ_U64(fk_hist_rank(1, 1), 1);
}

TEST(hist_buckets_cover_every_value_once)
{
    /* Consecutive buckets tile [0, 2^64) without holes or overlap, and each
     * bucket is narrower than 1/128 of its lowest value. */
    uint64_t next = 0;
    for (unsigned i = 0; i < FK_HIST_BUCKETS; i++) {
        uint64_t lo, w;
        fk_hist_bucket_range(i, &lo, &w);
        CHECK_MSG(lo == next, "bucket %u starts at %lu, expected %lu", i, (unsigned long)lo,
                  (unsigned long)next);
        CHECK_MSG(lo < 2 * FK_HIST_SUB || w * FK_HIST_SUB <= lo, "bucket %u too wide", i);
        CHECK_EQ_U64(fk_hist_index(lo), i);
        CHECK_EQ_U64(fk_hist_index(lo + (w - 1)), i);
        next = lo + w;
    }
    CHECK_EQ_U64(next, 0); /* wrapped past UINT64_MAX exactly */
    CHECK_EQ_U64(fk_hist_index(UINT64_MAX), FK_HIST_BUCKETS - 1);
}

TEST(hist_uniform_percentiles_within_1pct)
{
    enum { N = 200000 };
    static uint64_t s[N];
    rng_state = 1;
    for (size_t i = 0; i < N; i++)
        s[i] = 1000 + rng_next() % 10000000; /* 1 us .. 10 ms in ns */
    check_against_exact(s, N, "uniform");
}

TEST(hist_log_uniform_percentiles_within_1pct)
{
    enum { N = 200000 };
    static uint64_t s[N];
    rng_state = 2;
    for (size_t i = 0; i < N; i++) {
        unsigned bits = (unsigned)(rng_next() % 40); /* 1 ns .. 18 minutes */
        s[i] = (rng_next() >> (64 - bits - 1)) | 1;
    }
    check_against_exact(s, N, "log-uniform");
}

TEST(hist_long_tail_percentiles_within_1pct)
{
    enum { N = 100000 };
    static uint64_t s[N];
    rng_state = 3;
    for (size_t i = 0; i < N; i++) {
        /* Exponential body around 20 us with a 0.5% tail of 5-50 ms stalls. */
        double u = ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
        s[i] = (uint64_t)(-log(u) * 20000.0) + 500;
        if (rng_next() % 1000 < 5)
            s[i] = 5000000 + rng_next() % 45000000;
    }
    check_against_exact(s, N, "long-tail");
}

TEST(hist_merge_equals_recording_everything)
{
    static struct fk_hist a, b, all;
    fk_hist_init(&a);
    fk_hist_init(&b);
    fk_hist_init(&all);
    rng_state = 4;
    for (int i = 0; i < 50000; i++) {
        uint64_t v = rng_next() % 5000000;
        fk_hist_record(i % 3 ? &a : &b, v);
        fk_hist_record(&all, v);
    }
    fk_hist_record_n(&b, 777, 3);
    fk_hist_record_n(&all, 777, 3);
    fk_hist_merge(&a, &b);
    CHECK_EQ_U64(a.count, all.count);
    CHECK_EQ_U64(a.min, all.min);
    CHECK_EQ_U64(a.max, all.max);
    CHECK(memcmp(a.buckets, all.buckets, sizeof a.buckets) == 0);
    for (size_t i = 0; i < sizeof percentiles / sizeof percentiles[0]; i++)
        CHECK_EQ_U64(fk_hist_percentile(&a, percentiles[i]),
                     fk_hist_percentile(&all, percentiles[i]));
}

TEST(hist_extreme_values)
{
    static struct fk_hist h;
    fk_hist_init(&h);
    fk_hist_record(&h, 0);
    fk_hist_record(&h, UINT64_MAX);
    CHECK_EQ_U64(fk_hist_percentile(&h, 50), 0);
    CHECK_EQ_U64(fk_hist_percentile(&h, 100), UINT64_MAX);
    /* Rank 2 falls in the top bucket [255 * 2^56, 2^64): its midpoint. */
    CHECK_EQ_U64(fk_hist_percentile(&h, 75), (255ULL << 56) + ((1ULL << 56) - 1) / 2);
}

CHECK_MAIN()
