/*
 * ycsb_gen.h: YCSB's number generators, re-implemented in C.
 *
 * Each generator follows the Java class of the same name in YCSB's
 * site.ycsb.generator package (brianfrankcooper/YCSB, core/), so that a key
 * distribution here means what it means in a YCSB run: same formulas, same
 * order of IEEE double operations, same integer semantics. What is reproduced
 * exactly, and why:
 *
 *  - FNV hash (Utils.fnvhash64): FNV-1a 64 over the 8 bytes of the key number,
 *    least significant byte first (offset basis 0xcbf29ce484222325, prime
 *    1099511628211), in Java long arithmetic (wrapping), then Math.abs of the
 *    signed result. Math.abs(Long.MIN_VALUE) is Long.MIN_VALUE in Java, so that
 *    one value stays negative here too. Key names ("user" + hash) depend on
 *    this, and a store loaded by Java YCSB must be readable by this driver.
 *  - Java long overflow wraps (two's complement); we compute in uint64_t and
 *    convert, because signed overflow is undefined in C.
 *  - Java's (long) and (int) casts of a double truncate toward zero, saturate
 *    at the type's range and map NaN to 0 (JLS 5.1.3); a C cast of an
 *    out-of-range double is undefined, so ycsb_java_d2l/d2i spell them out.
 *  - Java's long % long truncates toward zero, like C99's %.
 *  - ZipfianGenerator (Gray et al., "Quickly Generating Billion-Record
 *    Synthetic Databases", SIGMOD 1994): theta 0.99, zeta computed once, and
 *    incrementally (only the new terms) when the item count grows; a smaller
 *    item count keeps the old zeta (YCSB's allowitemcountdecrease=false).
 *    YCSB recomputes eta with the item count given at construction ("items"),
 *    not the new one; we do the same, since the latest distribution's shape
 *    depends on it. Items 0 and 1 get exactly the zipfian probabilities
 *    1/zeta(n) and 0.5^theta/zeta(n); items >= 2 follow Gray's closed-form
 *    approximation, which overweights item 2 by about 17% for n = 1000 (see
 *    tests/unit/test_ycsb_gen.c, which checks both facts).
 *  - ScrambledZipfianGenerator: a zipfian over ITEM_COUNT = 10^10 items with
 *    YCSB's precomputed ZETAN = 26.46902820178302 = zeta(10^10, 0.99),
 *    hashed by fnvhash64 and reduced modulo the real item count. (Some YCSB
 *    releases set ITEM_COUNT to 10^16 while keeping that ZETAN; current YCSB
 *    has 10^10 again. With 10^16, Gray's closed form spreads the mass past
 *    item 1 over a million times more items: from the third hottest key on,
 *    each came up about 0.6 times as often as YCSB makes it, which is what
 *    flowkv-ycsb did before; tests/unit/test_ycsb_gen.c checks the twenty
 *    hottest keys against the Java algorithm's probabilities.)
 *  - SkewedLatestGenerator over an AcknowledgedCounterGenerator: "latest" =
 *    highest acknowledged insert minus a zipfian offset; the ack window is
 *    2^20 slots, and acknowledging a value whose slot is still occupied fails
 *    ("Too many unacknowledged insertion keys").
 *  - UniformLongGenerator, HotspotIntegerGenerator: Math.abs(nextLong()) %
 *    interval. We draw the 63-bit value as (x >> 1), which has the same
 *    distribution except that Java's 2^-64-probability Math.abs(Long.MIN_VALUE)
 *    case (a negative, out-of-range result) cannot happen. The hot interval is
 *    (int)(interval * hotsetfraction), an int cast as in Java.
 *  - SequentialGenerator, CounterGenerator, ExponentialGenerator,
 *    DiscreteGenerator (the operation chooser: weights in insertion order,
 *    val < weight/sum) and RandomByteIterator's value bytes (one 32-bit random
 *    per 6 bytes, each byte ' ' + a masked slice of it).
 *
 * Not reproduced: Java's random number streams (java.util.Random,
 * ThreadLocalRandom). Randomness comes from a caller-owned, seeded
 * xoshiro256** generator (struct ycsb_rng), one per thread, so a run is
 * reproducible from its seed. Math.pow may differ from glibc's pow by one ulp,
 * which changes a generated zipfian item only when the exact value lies
 * within one ulp of an integer.
 *
 * Thread safety: generators whose state is only configuration (uniform,
 * hotspot, scrambled zipfian, exponential, discrete) may be shared read-only;
 * the random state is the caller's rng. struct ycsb_zipf mutates zeta when
 * the item count grows, so each thread owns a copy (copy the struct). Counter,
 * sequential and acknowledged-counter generators are shared by all threads
 * and use atomics (plus a mutex for the ack window, as YCSB's ReentrantLock).
 */
#ifndef YCSB_GEN_H
#define YCSB_GEN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- random numbers ------------------------------------------------------ */

/* xoshiro256** (Blackman and Vigna), seeded through splitmix64. */
struct ycsb_rng {
    uint64_t s[4];
};

/* Seeds rng; any seed (0 included) gives a valid, distinct stream. */
void ycsb_rng_seed(struct ycsb_rng *rng, uint64_t seed);
/* Next 64 random bits. */
uint64_t ycsb_rng_next(struct ycsb_rng *rng);
/* Uniform double in [0, 1) with 53 random bits (like Java's nextDouble). */
double ycsb_rng_double(struct ycsb_rng *rng);
/* Uniform in [0, 2^63): the distribution of Java's Math.abs(nextLong()). */
int64_t ycsb_rng_abs_long(struct ycsb_rng *rng);

/* ---- Java semantics ------------------------------------------------------ */

/* Java (long) cast of a double: truncation, saturation, NaN -> 0. */
int64_t ycsb_java_d2l(double d);
/* Java (int) cast of a double. */
int32_t ycsb_java_d2i(double d);
/* Java (int) cast of a long (Long.intValue): keeps the low 32 bits. */
int32_t ycsb_java_l2i(int64_t v);
/* Java long addition (wraps). */
int64_t ycsb_java_ladd(int64_t a, int64_t b);
/* Java Math.abs(long): Math.abs(Long.MIN_VALUE) is Long.MIN_VALUE. */
int64_t ycsb_java_labs(int64_t v);

/* Utils.fnvhash64: FNV-1a 64 of the 8 little-endian bytes of val, then
 * Java Math.abs (so the result is >= 0 except for Long.MIN_VALUE). */
int64_t ycsb_fnvhash64(int64_t val);

/* ---- zipfian ------------------------------------------------------------- */

#define YCSB_ZIPFIAN_CONSTANT 0.99
/* ScrambledZipfianGenerator's constants (see the header comment for ZETAN). */
#define YCSB_SCRAMBLED_ITEM_COUNT 10000000000LL
#define YCSB_SCRAMBLED_ZETAN      26.46902820178302

struct ycsb_zipf {
    int64_t items;        /* max - min + 1 at construction (eta uses it) */
    int64_t base;         /* smallest item */
    double theta;         /* zipfian constant */
    double alpha;         /* 1 / (1 - theta) */
    double zetan;         /* zeta(countforzeta, theta) */
    double eta;           /* Gray's eta for the current zetan */
    double zeta2theta;    /* zeta(2, theta) */
    int64_t countforzeta; /* item count zetan was computed for */
};

/* zeta(n) continued from zeta(st) = initialsum: initialsum + sum over
 * i in [st, n) of 1 / (i + 1)^theta (ZipfianGenerator.zetastatic). O(n - st). */
double ycsb_zeta(int64_t st, int64_t n, double theta, double initialsum);

/* A zipfian over [min, max] (inclusive); computes zeta over max - min + 1
 * items, O(items) calls to pow: about 30 ms per million items. */
void ycsb_zipf_init(struct ycsb_zipf *z, int64_t min, int64_t max, double theta);
/* The same with a precomputed zeta (no O(n) work). */
void ycsb_zipf_init_zetan(struct ycsb_zipf *z, int64_t min, int64_t max, double theta,
                          double zetan);
/* Next item for the construction-time item count. */
int64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *rng);
/* Next item among itemcount items (ZipfianGenerator.nextLong(itemcount)):
 * when itemcount grows, zeta is extended incrementally (O(growth)). */
int64_t ycsb_zipf_next_n(struct ycsb_zipf *z, struct ycsb_rng *rng, int64_t itemcount);

struct ycsb_scrambled {
    struct ycsb_zipf gen;
    int64_t min, max, itemcount;
};

/* ScrambledZipfianGenerator(min, max) with theta 0.99 (O(1)). */
void ycsb_scrambled_init(struct ycsb_scrambled *s, int64_t min, int64_t max);
int64_t ycsb_scrambled_next(struct ycsb_scrambled *s, struct ycsb_rng *rng);

/* ---- uniform, hotspot, exponential ---------------------------------------- */

struct ycsb_uniform {
    int64_t lb, ub, interval;
};

/* [lb, ub] inclusive. Returns 0, or FK_EINVAL when ub < lb. */
int ycsb_uniform_init(struct ycsb_uniform *u, int64_t lb, int64_t ub);
int64_t ycsb_uniform_next(const struct ycsb_uniform *u, struct ycsb_rng *rng);

struct ycsb_hotspot {
    int64_t lower, upper, hot_interval, cold_interval;
    double hotset_fraction, hotopn_fraction;
};

/* HotspotIntegerGenerator(lower, upper, hotsetfraction, hotopnfraction).
 * Returns FK_EINVAL when a fraction is outside [0, 1], upper < lower, or a
 * set that operations may choose (probability > 0) is empty (Java would
 * divide by zero). */
int ycsb_hotspot_init(struct ycsb_hotspot *h, int64_t lower, int64_t upper, double hotset_fraction,
                      double hotopn_fraction);
int64_t ycsb_hotspot_next(const struct ycsb_hotspot *h, struct ycsb_rng *rng);

struct ycsb_exponential {
    double gamma;
};

/* ExponentialGenerator(percentile, range): gamma = -ln(1 - percentile/100) /
 * range. Returns FK_EINVAL unless 0 < percentile < 100 and range > 0. */
int ycsb_exponential_init(struct ycsb_exponential *e, double percentile, double range);
double ycsb_exponential_next(const struct ycsb_exponential *e, struct ycsb_rng *rng);

/* ---- counters (shared by threads) ---------------------------------------- */

struct ycsb_counter {
    _Atomic int64_t next;
};

void ycsb_counter_init(struct ycsb_counter *c, int64_t countstart);
/* Returns the next value (getAndIncrement). Any thread. */
int64_t ycsb_counter_next(struct ycsb_counter *c);
/* The last value handed out (next - 1). Any thread. */
int64_t ycsb_counter_last(struct ycsb_counter *c);

struct ycsb_sequential {
    _Atomic int64_t counter;
    int64_t countstart, interval;
};

/* SequentialGenerator(countstart, countend): countstart + (counter++ %
 * interval). Returns FK_EINVAL when countend < countstart. */
int ycsb_sequential_init(struct ycsb_sequential *s, int64_t countstart, int64_t countend);
int64_t ycsb_sequential_next(struct ycsb_sequential *s);

/* AcknowledgedCounterGenerator: the window holds 2^20 pending values. */
#define YCSB_ACK_WINDOW (1u << 20)

struct ycsb_ackctr {
    _Atomic int64_t next;  /* next value handed out */
    _Atomic int64_t limit; /* highest value with every value below acknowledged */
    pthread_mutex_t lock;  /* taken with trylock, as YCSB's ReentrantLock */
    _Atomic uint8_t *window;
};

/* Starts at countstart (limit = countstart - 1). Allocates the 1 MiB window.
 * Returns 0 or -ENOMEM. */
int ycsb_ackctr_init(struct ycsb_ackctr *a, int64_t countstart);
void ycsb_ackctr_destroy(struct ycsb_ackctr *a);
/* Next value to insert. Any thread. */
int64_t ycsb_ackctr_next(struct ycsb_ackctr *a);
/* Highest acknowledged value (lastValue() in Java). Any thread. */
int64_t ycsb_ackctr_last(struct ycsb_ackctr *a);
/* Marks value done (success or failure, as YCSB's finally block). Returns 0,
 * or FK_EFULL when value's window slot is still taken: more than 2^20 values
 * are outstanding. Any thread. */
int ycsb_ackctr_ack(struct ycsb_ackctr *a, int64_t value);

/* ---- latest -------------------------------------------------------------- */

struct ycsb_latest {
    struct ycsb_zipf zipf;
    struct ycsb_ackctr *basis; /* shared; not owned */
};

/* SkewedLatestGenerator(basis): a zipfian over basis->last items (O(items)
 * for zeta; copy the struct to give threads their own). */
void ycsb_latest_init(struct ycsb_latest *l, struct ycsb_ackctr *basis);
/* last - zipf(last): the most recently acknowledged insert is the most
 * popular. */
int64_t ycsb_latest_next(struct ycsb_latest *l, struct ycsb_rng *rng);

/* ---- discrete (the operation chooser) ------------------------------------ */

#define YCSB_DISCRETE_MAX 8

struct ycsb_discrete {
    unsigned n;
    double weight[YCSB_DISCRETE_MAX];
    int value[YCSB_DISCRETE_MAX];
};

void ycsb_discrete_init(struct ycsb_discrete *d);
/* Adds a (weight, value) pair. Returns FK_EINVAL for weight <= 0 or NaN,
 * FK_EFULL when YCSB_DISCRETE_MAX pairs exist. */
int ycsb_discrete_add(struct ycsb_discrete *d, double weight, int value);
/* A value chosen with probability weight / sum. Asserts at least one pair.
 * Where Java would throw ("oops. should not get here.") because rounding left
 * val above every weight, the last value is returned. */
int ycsb_discrete_next(const struct ycsb_discrete *d, struct ycsb_rng *rng);

/* ---- values -------------------------------------------------------------- */

/* Fills buf[0, len) like RandomByteIterator(len).toArray(): printable bytes in
 * [0x20, 0x7f], six per 32-bit random number. */
void ycsb_value_fill(struct ycsb_rng *rng, uint8_t *buf, size_t len);

#endif /* YCSB_GEN_H */
