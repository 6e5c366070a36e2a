/* fk_hist.c: log-linear histogram; see fk_hist.h for the error bound. */
#include "fk_hist.h"

#include <assert.h>
#include <string.h>

void fk_hist_init(struct fk_hist *h)
{
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

unsigned fk_hist_index(uint64_t v)
{
    if (v < 2 * FK_HIST_SUB)
        return (unsigned)v;
    /* k = position of the top bit (>= SUB_BITS + 1). Keeping SUB_BITS + 1
     * top bits gives sub in [SUB, 2*SUB); each power adds SUB buckets. */
    unsigned k = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = k - FK_HIST_SUB_BITS;
    unsigned sub = (unsigned)(v >> shift);
    assert(sub >= FK_HIST_SUB && sub < 2 * FK_HIST_SUB);
    unsigned idx = shift * FK_HIST_SUB + sub;
    assert(idx < FK_HIST_BUCKETS);
    return idx;
}

void fk_hist_bucket_range(unsigned idx, uint64_t *lo, uint64_t *width)
{
    assert(idx < FK_HIST_BUCKETS);
    if (idx < 2 * FK_HIST_SUB) {
        *lo = idx;
        *width = 1;
        return;
    }
    unsigned shift = idx / FK_HIST_SUB - 1;
    uint64_t sub = idx - (uint64_t)shift * FK_HIST_SUB;
    *lo = sub << shift;
    *width = 1ULL << shift;
}

void fk_hist_record_n(struct fk_hist *h, uint64_t v, uint64_t n)
{
    if (n == 0)
        return;
    h->buckets[fk_hist_index(v)] += n;
    h->count += n;
    h->sum += (long double)v * (long double)n;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

void fk_hist_record(struct fk_hist *h, uint64_t v)
{
    fk_hist_record_n(h, v, 1);
}

void fk_hist_merge(struct fk_hist *dst, const struct fk_hist *src)
{
    assert(dst != src);
    if (src->count == 0)
        return;
    for (unsigned i = 0; i < FK_HIST_BUCKETS; i++)
        dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t fk_hist_rank(double p, uint64_t count)
{
    /* Nearest rank: ceil(p/100 * count), within [1, count]. The 1e-12 slack
     * keeps 99.9% of 1000 at rank 999 despite binary rounding. */
    double exact = p / 100.0 * (double)count * (1.0 - 1e-12);
    uint64_t rank = (uint64_t)exact;
    if ((double)rank < exact)
        rank++;
    if (rank == 0)
        rank = 1;
    if (rank > count)
        rank = count;
    return rank;
}

uint64_t fk_hist_percentile(const struct fk_hist *h, double p)
{
    if (h->count == 0)
        return 0;
    if (!(p > 0.0))
        return h->min;
    if (p >= 100.0)
        return h->max;
    uint64_t rank = fk_hist_rank(p, h->count);
    uint64_t seen = 0;
    for (unsigned i = 0; i < FK_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t lo, width;
            fk_hist_bucket_range(i, &lo, &width);
            uint64_t mid = lo + (width - 1) / 2;
            if (mid < h->min)
                mid = h->min;
            if (mid > h->max)
                mid = h->max;
            return mid;
        }
    }
    assert(0 && "bucket counts sum to less than count");
    return h->max;
}

double fk_hist_mean(const struct fk_hist *h)
{
    return h->count ? (double)(h->sum / (long double)h->count) : 0.0;
}
