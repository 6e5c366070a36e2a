/* ycsb_gen.c: YCSB's generators; see ycsb_gen.h for what is reproduced. */
#include "ycsb_gen.h"

#include "fk_error.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

/* ---- random numbers ------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void ycsb_rng_seed(struct ycsb_rng *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t ycsb_rng_next(struct ycsb_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ycsb_rng_double(struct ycsb_rng *rng)
{
    return (double)(ycsb_rng_next(rng) >> 11) * 0x1.0p-53;
}

int64_t ycsb_rng_abs_long(struct ycsb_rng *rng)
{
    return (int64_t)(ycsb_rng_next(rng) >> 1);
}

/* ---- Java semantics ------------------------------------------------------ */

int64_t ycsb_java_d2l(double d)
{
    if (isnan(d))
        return 0;
    if (d >= 9223372036854775808.0) /* 2^63 */
        return INT64_MAX;
    if (d <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)d;
}

int32_t ycsb_java_d2i(double d)
{
    if (isnan(d))
        return 0;
    if (d >= 2147483647.0)
        return INT32_MAX;
    if (d <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)d;
}

int32_t ycsb_java_l2i(int64_t v)
{
    /* GCC and Clang define the out-of-range conversion as modulo 2^32,
     * which is exactly Java's narrowing (JLS 5.1.3). */
    return (int32_t)(uint32_t)(uint64_t)v;
}

int64_t ycsb_java_ladd(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

int64_t ycsb_java_labs(int64_t v)
{
    /* Negation in uint64_t: 2^63 negates to itself, as in Java. */
    return v < 0 ? (int64_t)(0 - (uint64_t)v) : v;
}

#define FNV_OFFSET_BASIS_64 0xCBF29CE484222325ULL
#define FNV_PRIME_64        1099511628211ULL

int64_t ycsb_fnvhash64(int64_t val)
{
    uint64_t v = (uint64_t)val, h = FNV_OFFSET_BASIS_64;
    /* Java shifts val arithmetically (>> 8), but only the low byte is used
     * in each of the 8 rounds, so the sign bits shifted in never matter. */
    for (int i = 0; i < 8; i++) {
        h ^= v & 0xff;
        v >>= 8;
        h *= FNV_PRIME_64;
    }
    return ycsb_java_labs((int64_t)h);
}

/* ---- zipfian ------------------------------------------------------------- */

double ycsb_zeta(int64_t st, int64_t n, double theta, double initialsum)
{
    double sum = initialsum;
    for (int64_t i = st; i < n; i++)
        sum += 1 / pow((double)(i + 1), theta);
    return sum;
}

static double zipf_eta(const struct ycsb_zipf *z)
{
    /* As ZipfianGenerator: "items" is the construction-time count. */
    return (1 - pow(2.0 / (double)z->items, 1 - z->theta)) / (1 - z->zeta2theta / z->zetan);
}

void ycsb_zipf_init_zetan(struct ycsb_zipf *z, int64_t min, int64_t max, double theta, double zetan)
{
    z->items = ycsb_java_ladd(max - min, 1);
    z->base = min;
    z->theta = theta;
    z->zeta2theta = ycsb_zeta(0, 2, theta, 0);
    z->alpha = 1.0 / (1.0 - theta);
    z->zetan = zetan;
    z->countforzeta = z->items;
    z->eta = zipf_eta(z);
}

void ycsb_zipf_init(struct ycsb_zipf *z, int64_t min, int64_t max, double theta)
{
    ycsb_zipf_init_zetan(z, min, max, theta, ycsb_zeta(0, max - min + 1, theta, 0));
}

int64_t ycsb_zipf_next_n(struct ycsb_zipf *z, struct ycsb_rng *rng, int64_t itemcount)
{
    /* Gray et al., SIGMOD 1994, as ZipfianGenerator.nextLong. A smaller
     * itemcount keeps the larger zeta (allowitemcountdecrease = false). */
    if (itemcount > z->countforzeta) {
        z->zetan = ycsb_zeta(z->countforzeta, itemcount, z->theta, z->zetan);
        z->countforzeta = itemcount;
        z->eta = zipf_eta(z);
    }
    double u = ycsb_rng_double(rng);
    double uz = u * z->zetan;
    if (uz < 1.0)
        return z->base;
    if (uz < 1.0 + pow(0.5, z->theta))
        return ycsb_java_ladd(z->base, 1);
    double x = (double)itemcount * pow(z->eta * u - z->eta + 1, z->alpha);
    return ycsb_java_ladd(z->base, ycsb_java_d2l(x));
}

int64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *rng)
{
    return ycsb_zipf_next_n(z, rng, z->items);
}

void ycsb_scrambled_init(struct ycsb_scrambled *s, int64_t min, int64_t max)
{
    s->min = min;
    s->max = max;
    s->itemcount = max - min + 1;
    ycsb_zipf_init_zetan(&s->gen, 0, YCSB_SCRAMBLED_ITEM_COUNT, YCSB_ZIPFIAN_CONSTANT,
                         YCSB_SCRAMBLED_ZETAN);
}

int64_t ycsb_scrambled_next(struct ycsb_scrambled *s, struct ycsb_rng *rng)
{
    assert(s->itemcount > 0);
    int64_t r = ycsb_zipf_next(&s->gen, rng);
    return ycsb_java_ladd(s->min, ycsb_fnvhash64(r) % s->itemcount);
}

/* ---- uniform, hotspot, exponential ---------------------------------------- */

int ycsb_uniform_init(struct ycsb_uniform *u, int64_t lb, int64_t ub)
{
    /* The interval ub - lb + 1 must fit a Java long. */
    if (ub < lb || (uint64_t)ub - (uint64_t)lb >= (uint64_t)INT64_MAX)
        return FK_EINVAL;
    u->lb = lb;
    u->ub = ub;
    u->interval = ub - lb + 1;
    return 0;
}

int64_t ycsb_uniform_next(const struct ycsb_uniform *u, struct ycsb_rng *rng)
{
    return ycsb_rng_abs_long(rng) % u->interval + u->lb;
}

int ycsb_hotspot_init(struct ycsb_hotspot *h, int64_t lower, int64_t upper, double hotset_fraction,
                      double hotopn_fraction)
{
    if (!(hotset_fraction >= 0.0 && hotset_fraction <= 1.0))
        return FK_EINVAL;
    if (!(hotopn_fraction >= 0.0 && hotopn_fraction <= 1.0))
        return FK_EINVAL;
    if (upper < lower)
        return FK_EINVAL;
    int64_t interval = upper - lower + 1;
    h->lower = lower;
    h->upper = upper;
    h->hotset_fraction = hotset_fraction;
    h->hotopn_fraction = hotopn_fraction;
    h->hot_interval = ycsb_java_d2i((double)interval * hotset_fraction);
    h->cold_interval = interval - h->hot_interval;
    /* nextDouble() < hotopn picks the hot set: possible iff hotopn > 0; the
     * cold set is possible iff hotopn < 1. */
    if (hotopn_fraction > 0.0 && h->hot_interval <= 0)
        return FK_EINVAL;
    if (hotopn_fraction < 1.0 && h->cold_interval <= 0)
        return FK_EINVAL;
    return 0;
}

int64_t ycsb_hotspot_next(const struct ycsb_hotspot *h, struct ycsb_rng *rng)
{
    if (ycsb_rng_double(rng) < h->hotopn_fraction)
        return h->lower + ycsb_rng_abs_long(rng) % h->hot_interval;
    return h->lower + h->hot_interval + ycsb_rng_abs_long(rng) % h->cold_interval;
}

int ycsb_exponential_init(struct ycsb_exponential *e, double percentile, double range)
{
    if (!(percentile > 0.0 && percentile < 100.0) || !(range > 0.0) || isinf(range))
        return FK_EINVAL;
    e->gamma = -log(1.0 - percentile / 100.0) / range;
    return 0;
}

double ycsb_exponential_next(const struct ycsb_exponential *e, struct ycsb_rng *rng)
{
    return -log(ycsb_rng_double(rng)) / e->gamma;
}

/* ---- counters ------------------------------------------------------------ */

void ycsb_counter_init(struct ycsb_counter *c, int64_t countstart)
{
    atomic_init(&c->next, countstart);
}

int64_t ycsb_counter_next(struct ycsb_counter *c)
{
    return atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
}

int64_t ycsb_counter_last(struct ycsb_counter *c)
{
    return atomic_load_explicit(&c->next, memory_order_relaxed) - 1;
}

int ycsb_sequential_init(struct ycsb_sequential *s, int64_t countstart, int64_t countend)
{
    if (countend < countstart)
        return FK_EINVAL;
    atomic_init(&s->counter, 0);
    s->countstart = countstart;
    s->interval = countend - countstart + 1;
    return 0;
}

int64_t ycsb_sequential_next(struct ycsb_sequential *s)
{
    int64_t c = atomic_fetch_add_explicit(&s->counter, 1, memory_order_relaxed);
    return s->countstart + c % s->interval;
}

#define ACK_MASK ((int64_t)YCSB_ACK_WINDOW - 1)

int ycsb_ackctr_init(struct ycsb_ackctr *a, int64_t countstart)
{
    a->window = calloc(YCSB_ACK_WINDOW, sizeof *a->window);
    if (a->window == NULL)
        return -ENOMEM;
    atomic_init(&a->next, countstart);
    atomic_init(&a->limit, countstart - 1);
    pthread_mutex_init(&a->lock, NULL);
    return 0;
}

void ycsb_ackctr_destroy(struct ycsb_ackctr *a)
{
    if (a->window == NULL)
        return;
    pthread_mutex_destroy(&a->lock);
    free((void *)a->window);
    a->window = NULL;
}

int64_t ycsb_ackctr_next(struct ycsb_ackctr *a)
{
    return atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
}

int64_t ycsb_ackctr_last(struct ycsb_ackctr *a)
{
    return atomic_load_explicit(&a->limit, memory_order_acquire);
}

int ycsb_ackctr_ack(struct ycsb_ackctr *a, int64_t value)
{
    size_t slot = (size_t)(value & ACK_MASK);
    if (atomic_load_explicit(&a->window[slot], memory_order_acquire))
        return FK_EFULL; /* "Too many unacknowledged insertion keys." */
    atomic_store_explicit(&a->window[slot], 1, memory_order_release);
    /* Whoever holds the lock moves the contiguous acknowledged run from the
     * window into limit; a thread that misses the lock leaves its slot for
     * the next acknowledger, exactly as YCSB's tryLock. YCSB bounds the scan
     * by comparing the absolute index with a masked one (always unequal);
     * the real bound is one pass over the window, written out here. */
    if (pthread_mutex_trylock(&a->lock) != 0)
        return 0;
    int64_t limit = atomic_load_explicit(&a->limit, memory_order_relaxed);
    int64_t index = limit + 1;
    for (uint32_t n = 0; n < YCSB_ACK_WINDOW; n++, index++) {
        size_t s = (size_t)(index & ACK_MASK);
        if (!atomic_load_explicit(&a->window[s], memory_order_acquire))
            break;
        atomic_store_explicit(&a->window[s], 0, memory_order_relaxed);
    }
    atomic_store_explicit(&a->limit, index - 1, memory_order_release);
    pthread_mutex_unlock(&a->lock);
    return 0;
}

/* ---- latest -------------------------------------------------------------- */

void ycsb_latest_init(struct ycsb_latest *l, struct ycsb_ackctr *basis)
{
    l->basis = basis;
    /* new ZipfianGenerator(basis.lastValue()): items 0 .. last - 1. */
    int64_t last = ycsb_ackctr_last(basis);
    ycsb_zipf_init(&l->zipf, 0, last - 1, YCSB_ZIPFIAN_CONSTANT);
}

int64_t ycsb_latest_next(struct ycsb_latest *l, struct ycsb_rng *rng)
{
    int64_t max = ycsb_ackctr_last(l->basis);
    return max - ycsb_zipf_next_n(&l->zipf, rng, max);
}

/* ---- discrete ------------------------------------------------------------ */

void ycsb_discrete_init(struct ycsb_discrete *d)
{
    d->n = 0;
}

int ycsb_discrete_add(struct ycsb_discrete *d, double weight, int value)
{
    if (!(weight > 0.0) || isinf(weight))
        return FK_EINVAL;
    if (d->n == YCSB_DISCRETE_MAX)
        return FK_EFULL;
    d->weight[d->n] = weight;
    d->value[d->n] = value;
    d->n++;
    return 0;
}

int ycsb_discrete_next(const struct ycsb_discrete *d, struct ycsb_rng *rng)
{
    assert(d->n > 0);
    double sum = 0;
    for (unsigned i = 0; i < d->n; i++)
        sum += d->weight[i];
    double val = ycsb_rng_double(rng);
    for (unsigned i = 0; i < d->n; i++) {
        double pw = d->weight[i] / sum;
        if (val < pw)
            return d->value[i];
        val -= pw;
    }
    return d->value[d->n - 1];
}

/* ---- values -------------------------------------------------------------- */

void ycsb_value_fill(struct ycsb_rng *rng, uint8_t *buf, size_t len)
{
    /* RandomByteIterator.fillBytesImpl: the masks 31, 63, 95 give three byte
     * ranges; the switch falls through so a short tail takes the low slices. */
    for (size_t base = 0; base < len; base += 6) {
        uint32_t b = (uint32_t)ycsb_rng_next(rng);
        size_t left = len - base;
        uint8_t *p = buf + base;
        switch (left >= 6 ? 6 : left) {
        case 6:
            p[5] = (uint8_t)(((b >> 25) & 95) + ' ');
            /* fall through */
        case 5:
            p[4] = (uint8_t)(((b >> 20) & 63) + ' ');
            /* fall through */
        case 4:
            p[3] = (uint8_t)(((b >> 15) & 31) + ' ');
            /* fall through */
        case 3:
            p[2] = (uint8_t)(((b >> 10) & 95) + ' ');
            /* fall through */
        case 2:
            p[1] = (uint8_t)(((b >> 5) & 63) + ' ');
            /* fall through */
        default:
            p[0] = (uint8_t)((b & 31) + ' ');
        }
    }
}
