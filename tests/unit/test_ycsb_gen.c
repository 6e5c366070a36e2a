/*
 * Unit tests for ycsb/ycsb_gen: YCSB's generators.
 *
 * Statistical checks use fixed seeds (so they are deterministic) and a
 * tolerance of 5 standard deviations of a binomial frequency,
 * 5 * sqrt(p (1 - p) / N): with a random seed a correct generator would fail
 * one such check with probability below 6e-7.
 */
#include "check.h"
#include "fk_error.h"
#include "ycsb_gen.h"
#include "ycsb_props.h"
#include "ycsb_workload.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int within(double freq, double p, long n)
{
    return fabs(freq - p) <= 5.0 * sqrt(p * (1 - p) / (double)n);
}

#define CHECK_FREQ(count, n, p)                                                                    \
    CHECK_MSG(within((double)(count) / (double)(n), (p), (n)),                                     \
              "%s: frequency %.6f, expected %.6f +- %.6f", #count, (double)(count) / (double)(n),  \
              (double)(p), 5.0 * sqrt((p) * (1 - (p)) / (n)))

/* ---- FNV-1a and key hashing ------------------------------------------------ */

/* A second, independent FNV-1a 64: the bytes are extracted by division into
 * an array first, and Java's Math.abs is done by comparison with 2^63. */
static int64_t fnv_reference(int64_t val)
{
    uint8_t bytes[8];
    uint64_t u = (uint64_t)val;
    for (int i = 0; i < 8; i++) {
        bytes[i] = (uint8_t)(u % 256);
        u /= 256;
    }
    uint64_t h = 14695981039346656037ULL; /* 0xcbf29ce484222325 */
    for (int i = 0; i < 8; i++)
        h = (h ^ bytes[i]) * 1099511628211ULL;
    if (h >= 9223372036854775808ULL) /* negative as a Java long */
        h = ~h + 1;
    return (int64_t)h;
}

static uint64_t pow_mod64(uint64_t b, unsigned e)
{
    uint64_t r = 1;
    while (e--)
        r *= b;
    return r;
}

TEST(fnv_known_constants)
{
    /* Derived by hand: the eight bytes of 0 are zero and x ^ 0 = x, so the
     * FNV-1a state is basis * prime^8 mod 2^64 = 0xa8c7f832281a39c5. Its top
     * bit is set, so as a Java long it is negative and Math.abs gives
     * 2^64 - 0xa8c7f832281a39c5 = 6284781860667377211: the first key of
     * every YCSB load, "user6284781860667377211". */
    const uint64_t basis = 0xCBF29CE484222325ULL, prime = 1099511628211ULL;
    CHECK_EQ_U64(basis * pow_mod64(prime, 8), 0xa8c7f832281a39c5ULL);
    CHECK_EQ_U64(0 - 0xa8c7f832281a39c5ULL, 6284781860667377211ULL);
    CHECK_EQ_I64(ycsb_fnvhash64(0), 6284781860667377211LL);
    /* 1 only flips the lowest bit of the basis before the first multiply:
     * (basis ^ 1) * prime^8, also negative, so negated. */
    uint64_t h1 = (basis ^ 1) * pow_mod64(prime, 8);
    CHECK(h1 >> 63);
    CHECK_EQ_I64(ycsb_fnvhash64(1), (int64_t)(0 - h1));
    CHECK_EQ_I64(ycsb_fnvhash64(1), 8517097267634966620LL);
    /* 256 has its 1 in the second byte: ((basis * prime) ^ 1) * prime^7. */
    uint64_t h256 = ((basis * prime) ^ 1) * pow_mod64(prime, 7);
    CHECK_EQ_I64(ycsb_fnvhash64(256), fnv_reference(256));
    CHECK_EQ_I64(ycsb_fnvhash64(256),
                 (int64_t)(h256 >> 63 ? 0 - h256 : h256)); /* Math.abs if negative */
    CHECK_EQ_I64(ycsb_fnvhash64(2), 1820151046732198393LL);
}

TEST(fnv_matches_reference)
{
    int negatives = 0;
    for (int64_t v = -1000; v < 100000; v++) {
        CHECK_EQ_I64(ycsb_fnvhash64(v), fnv_reference(v));
        CHECK(ycsb_fnvhash64(v) >= 0);
    }
    static const int64_t big[] = {INT64_MAX, INT64_MIN, 1LL << 31, (1LL << 31) - 1, 1LL << 40};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        CHECK_EQ_I64(ycsb_fnvhash64(big[i]), fnv_reference(big[i]));
    /* Math.abs happens: count inputs whose raw hash has the top bit set. */
    for (int64_t v = 0; v < 1000; v++) {
        uint64_t raw = 14695981039346656037ULL;
        for (int i = 0; i < 8; i++)
            raw = (raw ^ (((uint64_t)v >> (8 * i)) & 0xff)) * 1099511628211ULL;
        negatives += raw >> 63;
    }
    CHECK(negatives > 300 && negatives < 700);
}

TEST(java_conversions)
{
    CHECK_EQ_I64(ycsb_java_d2l(NAN), 0);
    CHECK_EQ_I64(ycsb_java_d2l(1e19), INT64_MAX);
    CHECK_EQ_I64(ycsb_java_d2l(-1e19), INT64_MIN);
    CHECK_EQ_I64(ycsb_java_d2l(INFINITY), INT64_MAX);
    CHECK_EQ_I64(ycsb_java_d2l(-2.7), -2);
    CHECK_EQ_I64(ycsb_java_d2l(2.7), 2);
    CHECK_EQ_I64(ycsb_java_d2i(3e9), INT32_MAX);
    CHECK_EQ_I64(ycsb_java_d2i(-3e9), INT32_MIN);
    CHECK_EQ_I64(ycsb_java_d2i(NAN), 0);
    CHECK_EQ_I64(ycsb_java_l2i((1LL << 32) + 5), 5);
    CHECK_EQ_I64(ycsb_java_l2i(1LL << 31), INT32_MIN);
    CHECK_EQ_I64(ycsb_java_l2i(-1), -1);
    CHECK_EQ_I64(ycsb_java_ladd(INT64_MAX, 1), INT64_MIN);
    CHECK_EQ_I64(ycsb_java_labs(INT64_MIN), INT64_MIN);
    CHECK_EQ_I64(ycsb_java_labs(-5), 5);
}

/* ---- zipfian ------------------------------------------------------------- */

#define ZN       1000
#define ZSAMPLES 1000000L

/* zeta(n) = sum of 1/i^theta, in long double, from the definition. */
static long double zeta_def(long n, double theta)
{
    long double s = 0;
    for (long i = n; i >= 1; i--) /* small terms first */
        s += 1.0L / powl((long double)i, theta);
    return s;
}

/* Gray's algorithm returns item i >= 2 when floor(n * (eta (u - 1) + 1)^alpha)
 * = i, i.e. for u in [U(i), U(i + 1)) with U(x) = 1 + ((x/n)^(1-theta) - 1) /
 * eta, and only above the u that gives items 0 and 1. Its probability is the
 * length of that interval. */
static double gray_prob(long i, long n, double theta, double zetan)
{
    double eta = (1 - pow(2.0 / n, 1 - theta)) / (1 - (1 + pow(0.5, theta)) / zetan);
    double u1 = (1 + pow(0.5, theta)) / zetan;
    double lo = 1 + (pow((double)i / n, 1 - theta) - 1) / eta;
    double hi = 1 + (pow((double)(i + 1) / n, 1 - theta) - 1) / eta;
    return fmax(hi, u1) - fmax(lo, u1);
}

TEST(zipfian_head_matches_exact_and_gray)
{
    static long count[ZN];
    struct ycsb_zipf z;
    struct ycsb_rng rng;
    ycsb_zipf_init(&z, 0, ZN - 1, YCSB_ZIPFIAN_CONSTANT);
    ycsb_rng_seed(&rng, 42);
    long double zeta = zeta_def(ZN, 0.99);
    CHECK_MSG(fabsl((long double)z.zetan - zeta) < 1e-9L * zeta, "zeta %.15f vs %.15Lf", z.zetan,
              zeta);
    for (long s = 0; s < ZSAMPLES; s++) {
        int64_t v = ycsb_zipf_next(&z, &rng);
        CHECK(v >= 0 && v < ZN);
        count[v]++;
    }
    /* Items 0 and 1: exactly the zipfian probabilities 1/zeta, 2^-theta/zeta. */
    double p0 = (double)(1.0L / zeta), p1 = (double)(powl(2, -0.99L) / zeta);
    CHECK_FREQ(count[0], ZSAMPLES, p0);
    CHECK_FREQ(count[1], ZSAMPLES, p1);
    /* Items 2..15: Gray's approximation, computed independently above. It
     * overweights item 2 by about 17% against the exact distribution, which
     * is YCSB's behaviour (documented in ycsb_gen.h). */
    for (long i = 2; i < 16; i++) {
        double g = gray_prob(i, ZN, 0.99, (double)zeta);
        CHECK_MSG(within((double)count[i] / ZSAMPLES, g, ZSAMPLES), "item %ld: %.6f vs %.6f", i,
                  (double)count[i] / ZSAMPLES, g);
    }
    double exact2 = (double)(powl(3, -0.99L) / zeta);
    double over = gray_prob(2, ZN, 0.99, (double)zeta) / exact2 - 1;
    CHECK_MSG(over > 0.15 && over < 0.19, "item 2 overweight %.4f", over);
    /* Beyond the head Gray's law stays within 5% of the exact one (it
     * underweights the tail by about 3.5%). */
    for (long i = 10; i < ZN; i += 7) {
        double exact = (double)(powl((long double)(i + 1), -0.99L) / zeta);
        CHECK(fabs(gray_prob(i, ZN, 0.99, (double)zeta) / exact - 1) < 0.05);
    }
}

TEST(zipfian_range_and_base)
{
    struct ycsb_zipf z;
    struct ycsb_rng rng;
    ycsb_zipf_init(&z, 100, 1099, YCSB_ZIPFIAN_CONSTANT);
    ycsb_rng_seed(&rng, 7);
    long at_min = 0;
    for (int s = 0; s < 100000; s++) {
        int64_t v = ycsb_zipf_next(&z, &rng);
        CHECK(v >= 100 && v <= 1099);
        at_min += v == 100;
    }
    CHECK(at_min > 10000); /* min is the most popular: about 13% */
}

TEST(zipfian_incremental_zeta)
{
    struct ycsb_zipf z;
    struct ycsb_rng rng;
    ycsb_zipf_init(&z, 0, 999, YCSB_ZIPFIAN_CONSTANT);
    ycsb_rng_seed(&rng, 1);
    double eta0 = z.eta;
    int64_t v = ycsb_zipf_next_n(&z, &rng, 5000);
    CHECK(v >= 0 && v < 5000);
    CHECK_EQ_I64(z.countforzeta, 5000);
    long double want = zeta_def(5000, 0.99);
    CHECK_MSG(fabsl((long double)z.zetan - want) < 1e-9L * want, "incremental zeta %.15f", z.zetan);
    CHECK(z.eta != eta0);
    /* A smaller count keeps the larger zeta (allowitemcountdecrease=false). */
    double zn = z.zetan;
    v = ycsb_zipf_next_n(&z, &rng, 10);
    CHECK_EQ_I64(z.countforzeta, 5000);
    CHECK(z.zetan == zn);
    /* The incremental sum equals a from-scratch sum over the same terms. */
    CHECK(fabs(ycsb_zeta(1000, 5000, 0.99, ycsb_zeta(0, 1000, 0.99, 0)) -
               ycsb_zeta(0, 5000, 0.99, 0)) < 1e-9);
}

/* ---- scrambled zipfian ---------------------------------------------------- */

/* zeta(n, theta) for huge n: the first N0 terms summed exactly, the rest by
 * Euler-Maclaurin (integral, end-point and first derivative terms; the next
 * term is below 1e-20 here). */
static double zeta_em(double n, double theta)
{
    const long n0 = 1000000;
    long double s = zeta_def(n0, theta);
    long double a = n0, b = n, t = 1 - theta;
    s += (powl(b, t) - powl(a, t)) / t;
    s += (powl(b, -theta) - powl(a, -theta)) / 2;
    s += (-theta * powl(b, -theta - 1) + theta * powl(a, -theta - 1)) / 12;
    return (double)s;
}

TEST(scrambled_zetan_is_zeta_of_item_count)
{
    /* YCSB's ZETAN is zeta(ITEM_COUNT = 10^10, 0.99), not zeta(10^16). */
    CHECK_EQ_I64(YCSB_SCRAMBLED_ITEM_COUNT, 10000000000LL);
    CHECK_MSG(fabs(zeta_em(1e10, 0.99) - YCSB_SCRAMBLED_ZETAN) < 1e-6, "zeta(1e10) = %.12f",
              zeta_em(1e10, 0.99));
    CHECK(fabs(zeta_em(1e16, 0.99) - YCSB_SCRAMBLED_ZETAN) > 10);
}

/* The twenty hottest keys of a scrambled zipfian over 1,000 keys, against
 * the probabilities of YCSB's Java algorithm (ScrambledZipfianGenerator over
 * ZipfianGenerator(0, ITEM_COUNT, 0.99, ZETAN): items 0 and 1 exactly,
 * items >= 2 by Gray's intervals, each item hashed to key fnvhash64(item) %
 * 1000). Items up to SZ_HEAD are summed exactly; the rest (about 40% of the
 * mass, spread over 10^10 items) are taken as uniform over the keys. With
 * ITEM_COUNT = 10^16 the third hottest key and those after it came out at
 * about 0.6 of these probabilities. */
#define SZ_KEYS    1000
#define SZ_HEAD    1000000L
#define SZ_SAMPLES 2000000L

TEST(scrambled_hottest_keys_match_the_java_algorithm)
{
    static double p[SZ_KEYS];
    static long count[SZ_KEYS];
    const long n = 10000000000L + 1; /* Java's ITEM_COUNT; ZipfianGenerator(0, ITEM_COUNT) */
    double z = YCSB_SCRAMBLED_ZETAN, head = 0;
    for (long i = 0; i < SZ_HEAD; i++) {
        double pi = i == 0   ? 1 / z
                    : i == 1 ? pow(0.5, YCSB_ZIPFIAN_CONSTANT) / z
                             : gray_prob(i, n, YCSB_ZIPFIAN_CONSTANT, z);
        p[ycsb_fnvhash64(i) % SZ_KEYS] += pi;
        head += pi;
    }
    CHECK(head > 0.5 && head < 0.7);
    for (int k = 0; k < SZ_KEYS; k++)
        p[k] += (1 - head) / SZ_KEYS;
    struct ycsb_scrambled s;
    struct ycsb_rng rng;
    ycsb_scrambled_init(&s, 0, SZ_KEYS - 1);
    ycsb_rng_seed(&rng, 11);
    for (long i = 0; i < SZ_SAMPLES; i++)
        count[ycsb_scrambled_next(&s, &rng)]++;
    /* The twenty keys the algorithm makes hottest, hottest first. */
    int order[SZ_KEYS];
    for (int k = 0; k < SZ_KEYS; k++)
        order[k] = k;
    for (int a = 0; a < 20; a++) {
        for (int b = a + 1; b < SZ_KEYS; b++) {
            if (p[order[b]] > p[order[a]]) {
                int t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
        }
        int k = order[a];
        double f = (double)count[k] / SZ_SAMPLES;
        /* Sampling error, and 2% for the uniform tail's approximation. */
        CHECK_MSG(fabs(f - p[k]) <= 5 * sqrt(p[k] / SZ_SAMPLES) + 0.02 * p[k],
                  "rank %d (key %d): frequency %.5f, Java's algorithm %.5f", a + 1, k, f, p[k]);
    }
}

TEST(scrambled_zipfian_range_and_skew)
{
    static long count[1000];
    struct ycsb_scrambled s;
    struct ycsb_rng rng;
    ycsb_scrambled_init(&s, 1000, 1999);
    ycsb_rng_seed(&rng, 3);
    const long n = 200000;
    for (long i = 0; i < n; i++) {
        int64_t v = ycsb_scrambled_next(&s, &rng);
        CHECK(v >= 1000 && v <= 1999);
        count[v - 1000]++;
    }
    long best = 0;
    for (int i = 1; i < 1000; i++)
        if (count[i] > count[best])
            best = i;
    /* The zipfian's item 0 (probability 1/ZETAN = 3.8%) lands on
     * fnvhash64(0) % 1000 = 6284781860667377211 % 1000 = 211. */
    CHECK_EQ_I64(best, 211);
    CHECK((double)count[best] / n >= 1 / YCSB_SCRAMBLED_ZETAN - 0.005);
    /* Skewed: the 10 most popular keys take far more than 1% of requests. */
    long sorted[1000];
    memcpy(sorted, count, sizeof sorted);
    long top = 0;
    for (int k = 0; k < 10; k++) {
        int m = 0;
        for (int i = 1; i < 1000; i++)
            if (sorted[i] > sorted[m])
                m = i;
        top += sorted[m];
        sorted[m] = -1;
    }
    CHECK((double)top / n > 0.10);
}

/* ---- uniform, hotspot, sequential, exponential ------------------------------- */

TEST(uniform_in_range_and_flat)
{
    struct ycsb_uniform u;
    struct ycsb_rng rng;
    long count[10] = {0};
    CHECK_OK(ycsb_uniform_init(&u, 10, 19));
    ycsb_rng_seed(&rng, 5);
    const long n = 200000;
    for (long i = 0; i < n; i++) {
        int64_t v = ycsb_uniform_next(&u, &rng);
        CHECK(v >= 10 && v <= 19);
        count[v - 10]++;
    }
    for (int i = 0; i < 10; i++)
        CHECK_FREQ(count[i], n, 0.1);
    CHECK_ERR(ycsb_uniform_init(&u, 5, 4), FK_EINVAL);
    CHECK_ERR(ycsb_uniform_init(&u, INT64_MIN, INT64_MAX), FK_EINVAL);
    CHECK_OK(ycsb_uniform_init(&u, 7, 7));
    CHECK_EQ_I64(ycsb_uniform_next(&u, &rng), 7);
}

TEST(hotspot_fractions)
{
    struct ycsb_hotspot h;
    struct ycsb_rng rng;
    CHECK_OK(ycsb_hotspot_init(&h, 0, 999, 0.2, 0.8));
    CHECK_EQ_I64(h.hot_interval, 200);
    CHECK_EQ_I64(h.cold_interval, 800);
    ycsb_rng_seed(&rng, 9);
    const long n = 200000;
    long hot = 0, hot_low_half = 0, cold_low_half = 0;
    for (long i = 0; i < n; i++) {
        int64_t v = ycsb_hotspot_next(&h, &rng);
        CHECK(v >= 0 && v <= 999);
        if (v < 200) {
            hot++;
            hot_low_half += v < 100;
        } else {
            cold_low_half += v < 600;
        }
    }
    /* hotspotopnfraction of the operations go to the first
     * hotspotdatafraction of the keys, uniformly within each set. */
    CHECK_FREQ(hot, n, 0.8);
    CHECK_FREQ(hot_low_half, hot, 0.5);
    CHECK_FREQ(cold_low_half, n - hot, 0.5);
    /* Other fractions. */
    CHECK_OK(ycsb_hotspot_init(&h, 100, 199, 0.1, 0.5));
    long hits = 0;
    for (long i = 0; i < n; i++)
        hits += ycsb_hotspot_next(&h, &rng) < 110;
    CHECK_FREQ(hits, n, 0.5);
    CHECK_ERR(ycsb_hotspot_init(&h, 0, 999, 1.5, 0.8), FK_EINVAL);
    CHECK_ERR(ycsb_hotspot_init(&h, 0, 999, 0.2, -0.1), FK_EINVAL);
    CHECK_ERR(ycsb_hotspot_init(&h, 0, 999, 0.0, 0.8), FK_EINVAL); /* empty hot set */
    CHECK_ERR(ycsb_hotspot_init(&h, 0, 999, 1.0, 0.8), FK_EINVAL); /* empty cold set */
    CHECK_OK(ycsb_hotspot_init(&h, 0, 999, 1.0, 1.0));
    CHECK_ERR(ycsb_hotspot_init(&h, 5, 4, 0.2, 0.8), FK_EINVAL);
}

TEST(sequential_and_counter)
{
    struct ycsb_sequential s;
    CHECK_OK(ycsb_sequential_init(&s, 5, 7));
    const int64_t want[] = {5, 6, 7, 5, 6, 7, 5};
    for (int i = 0; i < 7; i++)
        CHECK_EQ_I64(ycsb_sequential_next(&s), want[i]);
    CHECK_ERR(ycsb_sequential_init(&s, 7, 5), FK_EINVAL);
    struct ycsb_counter c;
    ycsb_counter_init(&c, 10);
    CHECK_EQ_I64(ycsb_counter_last(&c), 9);
    CHECK_EQ_I64(ycsb_counter_next(&c), 10);
    CHECK_EQ_I64(ycsb_counter_next(&c), 11);
    CHECK_EQ_I64(ycsb_counter_last(&c), 11);
}

TEST(exponential_percentile)
{
    struct ycsb_exponential e;
    struct ycsb_rng rng;
    CHECK_OK(ycsb_exponential_init(&e, 95, 1000));
    ycsb_rng_seed(&rng, 11);
    const long n = 100000;
    long below = 0;
    for (long i = 0; i < n; i++) {
        double x = ycsb_exponential_next(&e, &rng);
        CHECK(x >= 0);
        below += x < 1000;
    }
    CHECK_FREQ(below, n, 0.95);
    CHECK_ERR(ycsb_exponential_init(&e, 100, 1000), FK_EINVAL);
    CHECK_ERR(ycsb_exponential_init(&e, 95, 0), FK_EINVAL);
}

/* ---- CoreWorkload's request distributions against the Java algorithm ---- */

/* Key numbers of RD_SAMPLES reads from flowkv-ycsb's operation stream over
 * RD_KEYS records (workload C's reads, requestdistribution=dist), as
 * CoreWorkload.nextKeynum draws them. */
#define RD_KEYS    1000
#define RD_SAMPLES 400000L

static void stream_counts(const char *dist, long *count)
{
    static struct ycsb_props props;
    static struct ycsb_conf conf;
    static struct ycsb_workload w;
    static struct ycsb_thread th;
    char err[YCSB_ERR_MAX], d[64];
    snprintf(d, sizeof d, "requestdistribution=%s", dist);
    const char *kv[] = {"recordcount=1000",
                        "operationcount=400000",
                        "readproportion=1",
                        "updateproportion=0",
                        d,
                        NULL};
    ycsb_props_init(&props);
    for (const char *const *p = kv; *p != NULL; p++)
        CHECK_OK(ycsb_props_set_arg(&props, *p, err, sizeof err));
    CHECK_MSG(ycsb_conf_parse(&conf, &props, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(ycsb_workload_init(&w, &conf, err, sizeof err) == 0, "%s", err);
    ycsb_thread_init(&th, &w, 0);
    memset(count, 0, RD_KEYS * sizeof *count);
    for (long i = 0; i < RD_SAMPLES; i++) {
        struct ycsb_op op;
        CHECK_OK(ycsb_next_op(&th, &op));
        CHECK(op.type == YCSB_OP_READ && op.keynum >= 0 && op.keynum < RD_KEYS);
        count[op.keynum]++;
    }
    ycsb_workload_destroy(&w);
    ycsb_props_free(&props);
}

/* Each key's frequency within sampling error of its probability p[k]; the
 * first `ranks` of them, by p, hottest first (ties in key order). */
static void check_ranks(const char *dist, const long *count, const double *p, int ranks)
{
    int order[RD_KEYS];
    for (int k = 0; k < RD_KEYS; k++)
        order[k] = k;
    for (int a = 0; a < ranks; a++) {
        for (int b = a + 1; b < RD_KEYS; b++) {
            if (p[order[b]] > p[order[a]]) {
                int t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
        }
        int k = order[a];
        CHECK_MSG(within((double)count[k] / RD_SAMPLES, p[k], RD_SAMPLES),
                  "%s: rank %d (key %d): frequency %.5f, Java's algorithm %.5f", dist, a + 1, k,
                  (double)count[k] / RD_SAMPLES, p[k]);
    }
}

/* uniform, hotspot, exponential and latest, each key's probability computed
 * here from YCSB's Java source (CoreWorkload.nextKeynum and the
 * generators), and sequential's exact order. */
TEST(request_distributions_match_the_java_algorithm)
{
    static long count[RD_KEYS];
    static double p[RD_KEYS];
    /* uniform: UniformLongGenerator(0, 999). Every key, not only twenty. */
    stream_counts("uniform", count);
    for (int k = 0; k < RD_KEYS; k++)
        p[k] = 1.0 / RD_KEYS;
    check_ranks("uniform", count, p, RD_KEYS);
    /* hotspot: HotspotIntegerGenerator(0, 999, hotspotdatafraction 0.2,
     * hotspotopnfraction 0.8): the first 200 keys share 0.8 uniformly, the
     * other 800 share 0.2. */
    stream_counts("hotspot", count);
    for (int k = 0; k < RD_KEYS; k++)
        p[k] = k < 200 ? 0.8 / 200 : 0.2 / 800;
    check_ranks("hotspot", count, p, RD_KEYS);
    long hot = 0;
    for (int k = 0; k < 200; k++)
        hot += count[k];
    CHECK_FREQ(hot, RD_SAMPLES, 0.8); /* the sets' shares, which no single key resolves */
    /* exponential: keynum = last - (int)(-ln(u) / gamma), drawn again
     * while negative; gamma = -ln(1 - 95/100) / (recordcount * 0.8571428571)
     * (exponential.percentile and exponential.frac's defaults). Offset j
     * has e^(-gamma j) - e^(-gamma (j + 1)), renormalised over 0..999. */
    stream_counts("exponential", count);
    double gamma = -log(1 - 95 / 100.0) / (RD_KEYS * 0.8571428571);
    double kept = 1 - exp(-gamma * RD_KEYS);
    for (int k = 0; k < RD_KEYS; k++) {
        int j = RD_KEYS - 1 - k;
        p[k] = (exp(-gamma * j) - exp(-gamma * (j + 1))) / kept;
    }
    check_ranks("exponential", count, p, 20);
    /* latest: SkewedLatestGenerator: last - ZipfianGenerator(0, 998)
     * .nextLong(999): offsets 0 and 1 exactly zipfian over 999 items,
     * the others Gray's intervals. */
    stream_counts("latest", count);
    double z = (double)zeta_def(RD_KEYS - 1, YCSB_ZIPFIAN_CONSTANT);
    for (int k = 0; k < RD_KEYS; k++) {
        int j = RD_KEYS - 1 - k;
        p[k] = j == 0   ? 1 / z
               : j == 1 ? pow(0.5, YCSB_ZIPFIAN_CONSTANT) / z
                        : gray_prob(j, RD_KEYS - 1, YCSB_ZIPFIAN_CONSTANT, z);
    }
    check_ranks("latest", count, p, 20);
    /* sequential: SequentialGenerator(0, 999): 0, 1, ..., 999, 0, ... */
    stream_counts("sequential", count);
    for (int k = 0; k < RD_KEYS; k++)
        CHECK_EQ_I64(count[k], RD_SAMPLES / RD_KEYS);
}

/* ---- acknowledged counter and latest ----------------------------------------- */

TEST(ackctr_window)
{
    struct ycsb_ackctr a;
    CHECK_OK(ycsb_ackctr_init(&a, 1000));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 999);
    int64_t v0 = ycsb_ackctr_next(&a), v1 = ycsb_ackctr_next(&a), v2 = ycsb_ackctr_next(&a);
    CHECK_EQ_I64(v0, 1000);
    CHECK_EQ_I64(v2, 1002);
    /* Out of order: 1001 done first leaves a hole at 1000. */
    CHECK_OK(ycsb_ackctr_ack(&a, v1));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 999);
    CHECK_OK(ycsb_ackctr_ack(&a, v0));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 1001);
    CHECK_OK(ycsb_ackctr_ack(&a, v2));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 1002);
    /* A value and one 2^20 later share a slot: the second is refused while
     * the first is pending ("Too many unacknowledged insertion keys"). */
    int64_t far = 1004 + YCSB_ACK_WINDOW;
    CHECK_OK(ycsb_ackctr_ack(&a, 1004));
    CHECK_ERR(ycsb_ackctr_ack(&a, far), FK_EFULL);
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 1002);
    CHECK_OK(ycsb_ackctr_ack(&a, 1003));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 1004);
    ycsb_ackctr_destroy(&a);
}

TEST(latest_favours_recent_inserts)
{
    struct ycsb_ackctr a;
    struct ycsb_latest l;
    struct ycsb_rng rng;
    CHECK_OK(ycsb_ackctr_init(&a, 1000));
    ycsb_latest_init(&l, &a);
    ycsb_rng_seed(&rng, 13);
    const long n = 100000;
    long at_last = 0;
    for (long i = 0; i < n; i++) {
        int64_t v = ycsb_latest_next(&l, &rng);
        CHECK(v >= 0 && v <= 999);
        at_last += v == 999;
    }
    CHECK(at_last > n / 10); /* the newest key is the most popular (~13%) */
    for (int i = 0; i < 100; i++)
        CHECK_OK(ycsb_ackctr_ack(&a, ycsb_ackctr_next(&a)));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 1099);
    long recent = 0, newest = 0;
    for (long i = 0; i < n; i++) {
        int64_t v = ycsb_latest_next(&l, &rng);
        CHECK(v >= 0 && v <= 1099);
        recent += v >= 1000;
        newest += v == 1099;
    }
    /* The 100 newest of 1100 keys (9%) take most of the requests. */
    CHECK_MSG((double)recent / n > 0.5, "recent %ld", recent);
    CHECK(newest > n / 10);
    CHECK_EQ_I64(l.zipf.countforzeta, 1099);
    ycsb_ackctr_destroy(&a);
}

/* Four threads insert and acknowledge concurrently (YCSB's tryLock scheme). A
 * thread that misses the lock leaves its slot for the next acknowledger, so
 * limit may lag when the threads stop; one more acknowledged insert sweeps
 * every pending slot. */
#define ACK_THREADS    4
#define ACK_PER_THREAD 50000

static void *ack_worker(void *arg)
{
    struct ycsb_ackctr *a = arg;
    for (int i = 0; i < ACK_PER_THREAD; i++) {
        int64_t v = ycsb_ackctr_next(a);
        if (ycsb_ackctr_ack(a, v) != 0)
            return (void *)1;
        if (ycsb_ackctr_last(a) >= v + YCSB_ACK_WINDOW)
            return (void *)1;
    }
    return NULL;
}

TEST(ackctr_concurrent)
{
    static struct ycsb_ackctr a;
    CHECK_OK(ycsb_ackctr_init(&a, 500));
    pthread_t t[ACK_THREADS];
    for (int i = 0; i < ACK_THREADS; i++)
        CHECK_EQ_I64(pthread_create(&t[i], NULL, ack_worker, &a), 0);
    for (int i = 0; i < ACK_THREADS; i++) {
        void *rv;
        CHECK_EQ_I64(pthread_join(t[i], &rv), 0);
        CHECK(rv == NULL);
    }
    const int64_t total = (int64_t)ACK_THREADS * ACK_PER_THREAD;
    CHECK(ycsb_ackctr_last(&a) <= 500 + total - 1);
    CHECK_OK(ycsb_ackctr_ack(&a, ycsb_ackctr_next(&a)));
    CHECK_EQ_I64(ycsb_ackctr_last(&a), 500 + total);
    ycsb_ackctr_destroy(&a);
}

/* ---- discrete and values ------------------------------------------------------- */

TEST(discrete_proportions)
{
    struct ycsb_discrete d;
    struct ycsb_rng rng;
    ycsb_discrete_init(&d);
    CHECK_OK(ycsb_discrete_add(&d, 0.5, 10));
    CHECK_OK(ycsb_discrete_add(&d, 0.3, 20));
    CHECK_OK(ycsb_discrete_add(&d, 0.2, 30));
    CHECK_ERR(ycsb_discrete_add(&d, 0, 40), FK_EINVAL);
    CHECK_ERR(ycsb_discrete_add(&d, NAN, 40), FK_EINVAL);
    ycsb_rng_seed(&rng, 17);
    const long n = 100000;
    long c10 = 0, c20 = 0, c30 = 0;
    for (long i = 0; i < n; i++) {
        int v = ycsb_discrete_next(&d, &rng);
        c10 += v == 10;
        c20 += v == 20;
        c30 += v == 30;
    }
    CHECK_EQ_I64(c10 + c20 + c30, n);
    CHECK_FREQ(c10, n, 0.5);
    CHECK_FREQ(c20, n, 0.3);
    CHECK_FREQ(c30, n, 0.2);
    /* Weights need not sum to 1. */
    ycsb_discrete_init(&d);
    CHECK_OK(ycsb_discrete_add(&d, 3, 1));
    CHECK_OK(ycsb_discrete_add(&d, 1, 2));
    long ones = 0;
    for (long i = 0; i < n; i++)
        ones += ycsb_discrete_next(&d, &rng) == 1;
    CHECK_FREQ(ones, n, 0.75);
}

TEST(value_bytes_like_random_byte_iterator)
{
    struct ycsb_rng rng, copy;
    ycsb_rng_seed(&rng, 21);
    copy = rng;
    uint8_t buf[15];
    ycsb_value_fill(&rng, buf, sizeof buf);
    /* Three 32-bit numbers for 6 + 6 + 3 bytes; a short tail takes the low
     * slices (RandomByteIterator's switch falls through from the tail size). */
    for (int chunk = 0; chunk < 3; chunk++) {
        uint32_t b = (uint32_t)ycsb_rng_next(&copy);
        const int shift[6] = {0, 5, 10, 15, 20, 25};
        const uint32_t mask[6] = {31, 63, 95, 31, 63, 95};
        for (int k = 0; k < 6 && chunk * 6 + k < 15; k++)
            CHECK_EQ_I64(buf[chunk * 6 + k], ' ' + ((b >> shift[k]) & mask[k]));
    }
    uint8_t big[1000];
    ycsb_value_fill(&rng, big, sizeof big);
    for (size_t i = 0; i < sizeof big; i++)
        CHECK(big[i] >= 0x20 && big[i] <= 0x7f);
}

TEST(rng_reproducible)
{
    struct ycsb_rng a, b;
    ycsb_rng_seed(&a, 99);
    ycsb_rng_seed(&b, 99);
    for (int i = 0; i < 100; i++)
        CHECK_EQ_U64(ycsb_rng_next(&a), ycsb_rng_next(&b));
    ycsb_rng_seed(&b, 100);
    CHECK(ycsb_rng_next(&a) != ycsb_rng_next(&b));
    for (int i = 0; i < 1000; i++) {
        double d = ycsb_rng_double(&a);
        CHECK(d >= 0 && d < 1);
        CHECK(ycsb_rng_abs_long(&a) >= 0);
    }
}

CHECK_MAIN()
