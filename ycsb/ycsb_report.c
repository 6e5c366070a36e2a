/* ycsb_report.c: YCSB's measurements, report text, status line and pacing;
 * see ycsb_report.h. */
#include "ycsb_report.h"

#include "fk_error.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *ycsb_status_name(enum ycsb_status st)
{
    static const char *const names[YCSB_ST__COUNT] = {
        "OK",          "ERROR",           "TIMEOUT",
        "NOT_FOUND",   "NOT_IMPLEMENTED", "UNEXPECTED_STATE",
        "BAD_REQUEST", "FORBIDDEN",       "SERVICE_UNAVAILABLE",
        "BATCHED_OK",
    };
    return (unsigned)st < YCSB_ST__COUNT ? names[st] : "?";
}

enum ycsb_status ycsb_status_from_err(int rc)
{
    if (rc >= 0)
        return YCSB_ST_OK;
    switch (rc) {
    case FK_ENOTFOUND:
        return YCSB_ST_NOT_FOUND;
    case FK_ETIMEDOUT:
    case -ETIMEDOUT:
        return YCSB_ST_TIMEOUT;
    case FK_EINVAL:
    case FK_ETOOBIG:
    case FK_EKEYSIZE:
    case FK_EVALSIZE:
        return YCSB_ST_BAD_REQUEST;
    case FK_EAUTH:
        return YCSB_ST_FORBIDDEN;
    case FK_EUNREACHABLE:
    case FK_ENOTLEADER:
    case FK_EBUSY:
    case FK_EAGAIN:
    case -ECONNREFUSED:
        return YCSB_ST_SERVICE_UNAVAILABLE;
    default:
        return YCSB_ST_ERROR;
    }
}

const char *ycsb_mop_name(enum ycsb_mop m)
{
    static const char *const names[YCSB_M__COUNT] = {
        "READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE", "DELETE", "CLEANUP",
    };
    return (unsigned)m < YCSB_M__COUNT ? names[m] : "?";
}

/* ---- measurements ---------------------------------------------------------- */

struct ycsb_meas *ycsb_meas_create(enum ycsb_interval interval)
{
    struct ycsb_meas *m = malloc(sizeof *m);
    if (m == NULL)
        return NULL;
    m->interval = interval;
    ycsb_meas_reset(m);
    return m;
}

void ycsb_meas_destroy(struct ycsb_meas *m)
{
    free(m);
}

void ycsb_meas_reset(struct ycsb_meas *m)
{
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < YCSB_M__COUNT; k++)
            for (int f = 0; f < 2; f++)
                fk_hist_init(&m->hist[s][k][f]);
    memset(m->status, 0, sizeof m->status);
}

static uint64_t span(int64_t from, int64_t to)
{
    return to > from ? (uint64_t)(to - from) : 0;
}

void ycsb_meas_record(struct ycsb_meas *m, enum ycsb_mop op, enum ycsb_status st,
                      int64_t intended_ns, int64_t start_ns, int64_t end_ns)
{
    assert((unsigned)op < YCSB_M__COUNT && (unsigned)st < YCSB_ST__COUNT);
    /* CoreWorkload measures READ-MODIFY-WRITE itself, under its own name
     * whatever the status; DBWrapper adds -FAILED for the others. */
    int failed = op != YCSB_M_RMW && !(st == YCSB_ST_OK || st == YCSB_ST_BATCHED_OK);
    if (m->interval != YCSB_INTERVAL_INTENDED)
        fk_hist_record(&m->hist[YCSB_SERIES_OP][op][failed], span(start_ns, end_ns));
    if (m->interval != YCSB_INTERVAL_OP)
        fk_hist_record(&m->hist[YCSB_SERIES_INTENDED][op][failed], span(intended_ns, end_ns));
    m->status[op][st]++;
}

void ycsb_meas_merge(struct ycsb_meas *dst, const struct ycsb_meas *src)
{
    assert(dst->interval == src->interval);
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < YCSB_M__COUNT; k++)
            for (int f = 0; f < 2; f++)
                fk_hist_merge(&dst->hist[s][k][f], &src->hist[s][k][f]);
    for (int k = 0; k < YCSB_M__COUNT; k++)
        for (int st = 0; st < YCSB_ST__COUNT; st++)
            dst->status[k][st] += src->status[k][st];
}

/* ---- Java number formatting ------------------------------------------------ */

int ycsb_java_double(char *buf, size_t len, double d)
{
    if (isnan(d))
        return snprintf(buf, len, "NaN");
    if (isinf(d))
        return snprintf(buf, len, d > 0 ? "Infinity" : "-Infinity");
    if (d == 0)
        return snprintf(buf, len, signbit(d) ? "-0.0" : "0.0");
    /* The shortest correctly rounded decimal of at least 2 digits that reads
     * back as d: JDK 19's rule (when one digit would do, the closest decimal
     * of one or two digits, i.e. the rounded two-digit one). */
    char tmp[40];
    for (int prec = 1; prec <= 16; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    /* tmp is [-]D.DDDDe[+-]XX: collect the digits and the exponent. */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int e10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    double a = fabs(d);
    char out[48];
    int o = 0;
    if (neg)
        out[o++] = '-';
    if (a >= 1e-3 && a < 1e7) {
        if (e10 >= 0) {
            for (int i = 0; i <= e10; i++)
                out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > e10 + 1)
                for (int i = e10 + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -e10 - 1; i++)
                out[o++] = '0';
            for (int i = 0; i < nd; i++)
                out[o++] = digits[i];
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        out[o++] = '.';
        if (nd > 1)
            for (int i = 1; i < nd; i++)
                out[o++] = digits[i];
        else
            out[o++] = '0';
        snprintf(out + o, sizeof out - (size_t)o, "E%d", e10);
    }
    return snprintf(buf, len, "%s", out);
}

int ycsb_java_decimal2(char *buf, size_t len, double d)
{
    if (isnan(d))
        return snprintf(buf, len, "\xEF\xBF\xBD");
    if (isinf(d))
        return snprintf(buf, len, d > 0 ? "\xE2\x88\x9E" : "-\xE2\x88\x9E");
    /* printf rounds the exact binary value to nearest, ties to even: the same
     * digits as DecimalFormat's HALF_EVEN (which also uses the exact value). */
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%.2f", d);
    size_t n = strlen(tmp);
    while (tmp[n - 1] == '0')
        n--;
    if (tmp[n - 1] == '.')
        n--;
    tmp[n] = '\0';
    return snprintf(buf, len, "%s", tmp);
}

int ycsb_java_ordinal(char *buf, size_t len, double p)
{
    static const char *const suffixes[10] = {"th", "st", "nd", "rd", "th",
                                             "th", "th", "th", "th", "th"};
    if (fmod(p, 1.0) != 0)
        return ycsb_java_double(buf, len, p);
    int j = ycsb_java_d2i(p);
    int r = j % 100;
    if (r == 11 || r == 12 || r == 13)
        return snprintf(buf, len, "%dth", j);
    int r10 = j % 10 < 0 ? -(j % 10) : j % 10;
    return snprintf(buf, len, "%d%s", j, suffixes[r10]);
}

/* ---- the report ------------------------------------------------------------ */

static int series_enabled(const struct ycsb_meas *m, int s)
{
    return s == YCSB_SERIES_OP ? m->interval != YCSB_INTERVAL_INTENDED
                               : m->interval != YCSB_INTERVAL_OP;
}

/* The series whose block carries the Return= lines. */
static int status_series(const struct ycsb_meas *m)
{
    return m->interval == YCSB_INTERVAL_INTENDED ? YCSB_SERIES_INTENDED : YCSB_SERIES_OP;
}

static uint64_t status_total(const struct ycsb_meas *m, int k)
{
    uint64_t n = 0;
    for (int st = 0; st < YCSB_ST__COUNT; st++)
        n += m->status[k][st];
    return n;
}

static void series_name(const struct ycsb_meas *m, int s, int k, int failed, char *buf, size_t len)
{
    const char *pre =
        s == YCSB_SERIES_INTENDED && m->interval == YCSB_INTERVAL_BOTH ? "Intended-" : "";
    snprintf(buf, len, "%s%s%s", pre, ycsb_mop_name((enum ycsb_mop)k), failed ? "-FAILED" : "");
}

static void write_block(FILE *out, const char *name, const struct fk_hist *h, const double *pct,
                        unsigned npct, const uint64_t *status)
{
    char d[48], ord[48];
    fprintf(out, "[%s], Operations, %" PRIu64 "\n", name, h->count);
    ycsb_java_double(d, sizeof d, fk_hist_mean(h) / 1000.0);
    fprintf(out, "[%s], AverageLatency(us), %s\n", name, d);
    fprintf(out, "[%s], MinLatency(us), %" PRIu64 "\n", name, h->count ? h->min / 1000 : 0);
    fprintf(out, "[%s], MaxLatency(us), %" PRIu64 "\n", name, h->max / 1000);
    for (unsigned i = 0; i < npct; i++) {
        ycsb_java_ordinal(ord, sizeof ord, pct[i]);
        fprintf(out, "[%s], %sPercentileLatency(us), %" PRIu64 "\n", name, ord,
                fk_hist_percentile(h, pct[i]) / 1000);
    }
    for (int st = 0; status != NULL && st < YCSB_ST__COUNT; st++)
        if (status[st] > 0)
            fprintf(out, "[%s], Return=%s, %" PRIu64 "\n", name,
                    ycsb_status_name((enum ycsb_status)st), status[st]);
}

int ycsb_report_write(FILE *out, const struct ycsb_meas *m, int64_t runtime_ms, uint64_t opsdone,
                      const double *percentiles, unsigned npercentiles)
{
    char d[48], name[64];
    fprintf(out, "[OVERALL], RunTime(ms), %" PRId64 "\n", runtime_ms);
    ycsb_java_double(d, sizeof d, 1000.0 * (double)opsdone / (double)runtime_ms);
    fprintf(out, "[OVERALL], Throughput(ops/sec), %s\n", d);
    for (int s = 0; s < 2; s++) {
        if (!series_enabled(m, s))
            continue;
        for (int k = 0; k < YCSB_M__COUNT; k++) {
            for (int f = 0; f < 2; f++) {
                const struct fk_hist *h = &m->hist[s][k][f];
                int with_status = s == status_series(m) && f == 0 && status_total(m, k) > 0;
                if (h->count == 0 && !with_status)
                    continue;
                series_name(m, s, k, f, name, sizeof name);
                write_block(out, name, h, percentiles, npercentiles,
                            with_status ? m->status[k] : NULL);
            }
        }
    }
    return fflush(out) == 0 && !ferror(out) ? 0 : -EIO;
}

/* ---- status line ----------------------------------------------------------- */

struct sbuf {
    char *p;
    size_t len, n;
    int overflow;
};

__attribute__((format(printf, 2, 3))) static void put(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(b->p + b->n, b->n < b->len ? b->len - b->n : 0, fmt, ap);
    va_end(ap);
    if (w < 0 || b->n + (size_t)w >= b->len)
        b->overflow = 1;
    else
        b->n += (size_t)w;
}

int ycsb_remaining(char *buf, size_t len, int64_t seconds)
{
    struct sbuf b = {.p = buf, .len = len, .n = 0, .overflow = len == 0};
    if (len > 0)
        buf[0] = '\0';
    int64_t days = seconds / 86400;
    if (days > 0) {
        put(&b, "%" PRId64 "%s", days, days == 1 ? " day " : " days ");
        seconds -= days * 86400;
    }
    int64_t hours = seconds / 3600;
    if (hours > 0) {
        put(&b, "%" PRId64 "%s", hours, hours == 1 ? " hour " : " hours ");
        seconds -= hours * 3600;
    }
    if (days < 1) {
        int64_t minutes = seconds / 60;
        if (minutes > 0)
            put(&b, "%" PRId64 "%s", minutes, minutes == 1 ? " minute " : " minutes ");
    }
    if (b.n == 0 && !b.overflow) {
        /* Java tests the builder's length after appending the number, so a
         * one-digit count says "second" (YCSB's quirk, kept). */
        char num[24];
        int nl = snprintf(num, sizeof num, "%" PRId64, seconds);
        put(&b, "%s%s", num, nl == 1 ? " second " : " seconds ");
    }
    return b.overflow ? FK_ETOOBIG : (int)b.n;
}

/* OneMeasurementHdrHistogram.getSummary for one series. */
static void summary(struct sbuf *b, const char *name, const struct fk_hist *h)
{
    static const double pcts[] = {90, 99, 99.9, 99.99};
    static const char *const labels[] = {"90", "99", "99.9", "99.99"};
    char avg[48], v[48];
    ycsb_java_decimal2(avg, sizeof avg, fk_hist_mean(h) / 1000.0);
    put(b, "[%s: Count=%" PRIu64 ", Max=%" PRIu64 ", Min=%" PRIu64 ", Avg=%s", name, h->count,
        h->max / 1000, h->count ? h->min / 1000 : 0, avg);
    for (int i = 0; i < 4; i++) {
        ycsb_java_decimal2(v, sizeof v, (double)(fk_hist_percentile(h, pcts[i]) / 1000));
        put(b, ", %s=%s", labels[i], v);
    }
    put(b, "] ");
}

static void summaries(struct sbuf *b, const struct ycsb_meas *total,
                      const struct ycsb_meas *interval)
{
    static const struct fk_hist empty = {.min = UINT64_MAX};
    char name[64];
    for (int s = 0; s < 2; s++) {
        if (!series_enabled(total, s))
            continue;
        for (int k = 0; k < YCSB_M__COUNT; k++)
            for (int f = 0; f < 2; f++) {
                if (total->hist[s][k][f].count == 0)
                    continue;
                series_name(total, s, k, f, name, sizeof name);
                summary(b, name, interval ? &interval->hist[s][k][f] : &empty);
            }
    }
}

int ycsb_status_line(char *buf, size_t len, const struct ycsb_status_args *a,
                     const struct ycsb_meas *total, const struct ycsb_meas *interval)
{
    struct sbuf b = {.p = buf, .len = len, .n = 0, .overflow = len == 0};
    time_t secs = (time_t)(a->wall_ms / 1000);
    struct tm tm;
    localtime_r(&secs, &tm);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", &tm);
    int64_t interval_ms = a->now_ms - a->start_ms;
    put(&b, "%s%s:%03d %" PRId64 " sec: %" PRIu64 " operations; ", a->label ? a->label : "", date,
        (int)(a->wall_ms % 1000), interval_ms / 1000, a->totalops);
    double throughput = 1000.0 * ((double)a->totalops / (double)interval_ms);
    double cur =
        1000.0 * ((double)(a->totalops - a->lastops) / (double)(a->now_ms - a->interval_start_ms));
    char tmp[64];
    if (a->totalops != 0) {
        ycsb_java_decimal2(tmp, sizeof tmp, cur);
        put(&b, "%s current ops/sec; ", tmp);
    }
    if (a->todoops != 0) {
        int64_t rem = ycsb_java_d2l(ceil((double)a->todoops / throughput));
        if (ycsb_remaining(tmp, sizeof tmp, rem) < 0)
            b.overflow = 1;
        put(&b, "est completion in %s", tmp);
    }
    if (total == NULL)
        total = interval;
    if (total != NULL)
        summaries(&b, total, interval);
    return b.overflow ? FK_ETOOBIG : (int)b.n;
}

/* ---- pacing ---------------------------------------------------------------- */

int ycsb_pace_init(struct ycsb_pace *p, int32_t target, int32_t threads, int64_t start_ns)
{
    if (threads < 1 || target < 0)
        return FK_EINVAL;
    p->start_ns = start_ns;
    p->tick_ns = 0;
    if (target > 0) {
        double per_thread_per_ms = (double)target / (double)threads / 1000.0;
        p->tick_ns = ycsb_java_d2l(1000000 / per_thread_per_ms);
    }
    return 0;
}

int64_t ycsb_pace_intended(const struct ycsb_pace *p, uint64_t k, int64_t now_ns)
{
    if (p->tick_ns == 0)
        return now_ns;
    __int128 t = (__int128)p->start_ns + (__int128)k * p->tick_ns;
    return t > INT64_MAX ? INT64_MAX : (int64_t)t;
}

int64_t ycsb_pace_initial_delay(const struct ycsb_pace *p, struct ycsb_rng *rng)
{
    /* targetOpsPerMs <= 1.0 exactly when the tick is at least 1 ms. */
    if (p->tick_ns < 1000000)
        return 0;
    int32_t bound = ycsb_java_d2i((double)p->tick_ns);
    return (int64_t)(ycsb_rng_next(rng) % (uint64_t)bound);
}
