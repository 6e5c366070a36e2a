/* Unit tests for ycsb/ycsb_report: Java number formatting, the YCSB report
 * (printed, then parsed back line by line and checked against the
 * histograms), the -s status line and open-loop pacing. */
#include "check.h"
#include "fk_error.h"
#include "fk_hist.h"
#include "ycsb_report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

TEST(java_double_to_string)
{
    /* Outputs of Java's Double.toString for these doubles. */
    static const struct {
        double d;
        const char *s;
    } cases[] = {
        {0.0, "0.0"},
        {-0.0, "-0.0"},
        {1.0, "1.0"},
        {-1.5, "-1.5"},
        {100.0, "100.0"},
        {0.1, "0.1"},
        {0.1 + 0.2, "0.30000000000000004"},
        {1.0 / 3, "0.3333333333333333"},
        {2000.0 / 3, "666.6666666666666"},
        {123.456, "123.456"},
        {9999999.0, "9999999.0"},
        {1e7, "1.0E7"},
        {12345678.9, "1.23456789E7"},
        {1e21, "1.0E21"},
        {0.001, "0.001"},
        {0.00123, "0.00123"},
        {1e-4, "1.0E-4"},
        {1e-5, "1.0E-5"},
        {4.9e-324, "4.9E-324"},
        {1.7976931348623157e308, "1.7976931348623157E308"},
        {9223372036854775808.0, "9.223372036854776E18"},
        {NAN, "NaN"},
        {INFINITY, "Infinity"},
        {-INFINITY, "-Infinity"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ycsb_java_double(buf, sizeof buf, cases[i].d);
        CHECK_EQ_STR(buf, cases[i].s);
    }
    /* Every printed double reads back as itself (shortest round trip). */
    for (int i = 1; i < 2000; i++) {
        double d = 1000.0 * i / 7.3;
        ycsb_java_double(buf, sizeof buf, d);
        CHECK(strtod(buf, NULL) == d);
    }
}

TEST(java_decimal_format_and_ordinals)
{
    static const struct {
        double d;
        const char *s;
    } cases[] = {
        {1234.5, "1234.5"}, {3.14159, "3.14"},     {2.0, "2"},      {0.004, "0"},
        {0.125, "0.12"},    {0.375, "0.38"},       {99.999, "100"}, {1e9, "1000000000"},
        {-2.5, "-2.5"},     {NAN, "\xEF\xBF\xBD"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ycsb_java_decimal2(buf, sizeof buf, cases[i].d);
        CHECK_EQ_STR(buf, cases[i].s);
    }
    static const struct {
        double p;
        const char *s;
    } ords[] = {{50, "50th"},   {1, "1st"},     {2, "2nd"},      {3, "3rd"},   {11, "11th"},
                {12, "12th"},   {13, "13th"},   {21, "21st"},    {95, "95th"}, {99, "99th"},
                {100, "100th"}, {99.9, "99.9"}, {99.99, "99.99"}};
    for (size_t i = 0; i < sizeof ords / sizeof ords[0]; i++) {
        ycsb_java_ordinal(buf, sizeof buf, ords[i].p);
        CHECK_EQ_STR(buf, ords[i].s);
    }
}

TEST(status_mapping)
{
    CHECK_EQ_I64(ycsb_status_from_err(0), YCSB_ST_OK);
    CHECK_EQ_I64(ycsb_status_from_err(5), YCSB_ST_OK);
    CHECK_EQ_I64(ycsb_status_from_err(FK_ENOTFOUND), YCSB_ST_NOT_FOUND);
    CHECK_EQ_I64(ycsb_status_from_err(FK_ETIMEDOUT), YCSB_ST_TIMEOUT);
    CHECK_EQ_I64(ycsb_status_from_err(-ETIMEDOUT), YCSB_ST_TIMEOUT);
    CHECK_EQ_I64(ycsb_status_from_err(FK_EINVAL), YCSB_ST_BAD_REQUEST);
    CHECK_EQ_I64(ycsb_status_from_err(FK_EAUTH), YCSB_ST_FORBIDDEN);
    CHECK_EQ_I64(ycsb_status_from_err(FK_ENOTLEADER), YCSB_ST_SERVICE_UNAVAILABLE);
    CHECK_EQ_I64(ycsb_status_from_err(FK_ESTORAGE), YCSB_ST_ERROR);
    CHECK_EQ_STR(ycsb_status_name(YCSB_ST_NOT_FOUND), "NOT_FOUND");
    CHECK_EQ_STR(ycsb_mop_name(YCSB_M_RMW), "READ-MODIFY-WRITE");
}

/* ---- the report, parsed back ------------------------------------------------ */

struct line {
    char name[64], metric[64], value[64];
};

#define MAX_LINES 200
static struct line lines[MAX_LINES];
static int nlines;

/* Prints the report into memory and splits every "[NAME], METRIC, VALUE". */
static void print_and_parse(const struct ycsb_meas *m, int64_t runtime_ms, uint64_t ops,
                            const double *pct, unsigned npct)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    CHECK_OK(ycsb_report_write(f, m, runtime_ms, ops, pct, npct));
    fclose(f);
    nlines = 0;
    for (char *s = text, *nl; *s != '\0'; s = nl + 1) {
        nl = strchr(s, '\n');
        CHECK(nl != NULL); /* every line ends in a newline */
        *nl = '\0';
        CHECK(nlines < MAX_LINES);
        struct line *l = &lines[nlines++];
        CHECK_MSG(sscanf(s, "[%63[^]]], %63[^,], %63s", l->name, l->metric, l->value) == 3,
                  "line '%s'", s);
        char again[256];
        snprintf(again, sizeof again, "[%s], %s, %s", l->name, l->metric, l->value);
        CHECK_EQ_STR(again, s); /* exactly that shape, nothing else */
    }
    free(text);
}

/* The index of the line NAME/METRIC, or -1. */
static int find(const char *name, const char *metric)
{
    for (int i = 0; i < nlines; i++)
        if (strcmp(lines[i].name, name) == 0 && strcmp(lines[i].metric, metric) == 0)
            return i;
    return -1;
}

static const char *value(const char *name, const char *metric)
{
    int i = find(name, metric);
    CHECK_MSG(i >= 0, "no line [%s], %s", name, metric);
    return lines[i].value;
}

static uint64_t u64(const char *name, const char *metric)
{
    return strtoull(value(name, metric), NULL, 10);
}

/* Checks one block against the histogram it was printed from. */
static void check_block(const char *name, const struct fk_hist *h, const double *pct, unsigned npct)
{
    static const char *const pnames[] = {"50thPercentileLatency(us)", "95thPercentileLatency(us)",
                                         "99thPercentileLatency(us)"};
    int first = find(name, "Operations");
    CHECK_MSG(first >= 0, "no block %s", name);
    CHECK_EQ_STR(lines[first + 1].metric, "AverageLatency(us)");
    CHECK_EQ_STR(lines[first + 2].metric, "MinLatency(us)");
    CHECK_EQ_STR(lines[first + 3].metric, "MaxLatency(us)");
    CHECK_EQ_U64(u64(name, "Operations"), h->count);
    /* The average is printed as the shortest decimal that reads back as the
     * same double, so it compares exactly. */
    CHECK(strtod(value(name, "AverageLatency(us)"), NULL) == fk_hist_mean(h) / 1000.0);
    CHECK_EQ_U64(u64(name, "MinLatency(us)"), h->min / 1000);
    CHECK_EQ_U64(u64(name, "MaxLatency(us)"), h->max / 1000);
    for (unsigned i = 0; i < npct; i++) {
        CHECK_EQ_STR(lines[first + 4 + (int)i].metric, pnames[i]);
        CHECK_EQ_U64(u64(name, pnames[i]), fk_hist_percentile(h, pct[i]) / 1000);
    }
}

static const double pct3[] = {50, 95, 99};

TEST(report_parsed_back)
{
    struct ycsb_meas *a = ycsb_meas_create(YCSB_INTERVAL_OP);
    struct ycsb_meas *b = ycsb_meas_create(YCSB_INTERVAL_OP);
    struct ycsb_meas *all = ycsb_meas_create(YCSB_INTERVAL_OP);
    CHECK(a && b && all);
    /* 1000 reads of i.5 us (i = 1..1000) split over two threads, 10 reads
     * not found in 2 ms, 50 updates of 7 us, one failed update. */
    for (int i = 1; i <= 1000; i++)
        ycsb_meas_record(i % 2 ? a : b, YCSB_M_READ, YCSB_ST_OK, 0, 0, i * 1000 + 500);
    for (int i = 0; i < 10; i++)
        ycsb_meas_record(a, YCSB_M_READ, YCSB_ST_NOT_FOUND, 0, 100, 2000100);
    for (int i = 0; i < 50; i++)
        ycsb_meas_record(b, YCSB_M_UPDATE, YCSB_ST_OK, 0, 1000, 8000);
    ycsb_meas_record(b, YCSB_M_UPDATE, YCSB_ST_ERROR, 0, 0, 3000);
    ycsb_meas_merge(all, a);
    ycsb_meas_merge(all, b);
    print_and_parse(all, 1500, 1000, pct3, 3);

    CHECK_EQ_STR(lines[0].name, "OVERALL");
    CHECK_EQ_STR(lines[0].metric, "RunTime(ms)");
    CHECK_EQ_STR(lines[0].value, "1500");
    CHECK_EQ_STR(lines[1].metric, "Throughput(ops/sec)");
    CHECK_EQ_STR(lines[1].value, "666.6666666666666");
    CHECK_EQ_STR(lines[2].name, "READ");

    check_block("READ", &all->hist[YCSB_SERIES_OP][YCSB_M_READ][0], pct3, 3);
    CHECK_EQ_U64(u64("READ", "Operations"), 1000);
    CHECK_EQ_STR(value("READ", "AverageLatency(us)"), "501.0");
    CHECK_EQ_U64(u64("READ", "MinLatency(us)"), 1);
    CHECK_EQ_U64(u64("READ", "MaxLatency(us)"), 1000);
    /* Percentiles within the histogram's 0.4% of the exact 500, 950, 990. */
    CHECK(labs((long)u64("READ", "50thPercentileLatency(us)") - 500) <= 2);
    CHECK(labs((long)u64("READ", "95thPercentileLatency(us)") - 950) <= 4);
    CHECK(labs((long)u64("READ", "99thPercentileLatency(us)") - 990) <= 4);
    CHECK_EQ_U64(u64("READ", "Return=OK"), 1000);
    CHECK_EQ_U64(u64("READ", "Return=NOT_FOUND"), 10);
    CHECK(find("READ", "Return=ERROR") < 0); /* only statuses that occurred */

    check_block("READ-FAILED", &all->hist[YCSB_SERIES_OP][YCSB_M_READ][1], pct3, 3);
    CHECK_EQ_U64(u64("READ-FAILED", "MaxLatency(us)"), 2000);
    CHECK(find("READ-FAILED", "Return=NOT_FOUND") < 0); /* statuses go to READ */

    check_block("UPDATE", &all->hist[YCSB_SERIES_OP][YCSB_M_UPDATE][0], pct3, 3);
    CHECK_EQ_STR(value("UPDATE", "AverageLatency(us)"), "7.0");
    CHECK_EQ_U64(u64("UPDATE", "Return=OK"), 50);
    CHECK_EQ_U64(u64("UPDATE", "Return=ERROR"), 1);
    check_block("UPDATE-FAILED", &all->hist[YCSB_SERIES_OP][YCSB_M_UPDATE][1], pct3, 3);
    CHECK(find("INSERT", "Operations") < 0);
    /* Block order: READ, READ-FAILED, UPDATE, UPDATE-FAILED. */
    CHECK(find("READ", "Operations") < find("READ-FAILED", "Operations"));
    CHECK(find("READ-FAILED", "Operations") < find("UPDATE", "Operations"));
    CHECK_EQ_I64(nlines, 2 + 9 + 7 + 9 + 7); /* blocks of 7 lines, + Return= lines */
    ycsb_meas_destroy(a);
    ycsb_meas_destroy(b);
    ycsb_meas_destroy(all);
}

TEST(report_intended_series)
{
    /* An operation intended at t=0 that started at 1 ms (queued) and ended
     * at 1.1 ms: 100 us from its start, 1100 us from its intended start. */
    struct ycsb_meas *m = ycsb_meas_create(YCSB_INTERVAL_BOTH);
    CHECK(m != NULL);
    ycsb_meas_record(m, YCSB_M_READ, YCSB_ST_OK, 0, 1000000, 1100000);
    const double p99[] = {99.9};
    print_and_parse(m, 1000, 1, p99, 1);
    CHECK_EQ_U64(u64("READ", "MaxLatency(us)"), 100);
    CHECK_EQ_U64(u64("Intended-READ", "MaxLatency(us)"), 1100);
    CHECK_EQ_U64(u64("Intended-READ", "99.9PercentileLatency(us)"), 1100);
    CHECK_EQ_U64(u64("READ", "Return=OK"), 1);
    CHECK(find("Intended-READ", "Return=OK") < 0);
    CHECK_EQ_STR(lines[1].value, "1.0");
    ycsb_meas_destroy(m);

    /* measurement.interval=intended: one series, under the plain name. */
    m = ycsb_meas_create(YCSB_INTERVAL_INTENDED);
    CHECK(m != NULL);
    ycsb_meas_record(m, YCSB_M_RMW, YCSB_ST_OK, 0, 1000000, 1100000);
    print_and_parse(m, 0, 1, pct3, 3);
    CHECK_EQ_STR(lines[1].value, "Infinity"); /* 1000.0 * 1 / 0, as Java */
    CHECK_EQ_U64(u64("READ-MODIFY-WRITE", "MaxLatency(us)"), 1100);
    CHECK_EQ_U64(u64("READ-MODIFY-WRITE", "Return=OK"), 1);
    CHECK(find("Intended-READ-MODIFY-WRITE", "Operations") < 0);
    ycsb_meas_destroy(m);
}

TEST(report_all_failed_and_empty)
{
    /* Every read failed: READ still prints (with its statuses) with an empty
     * histogram, as YCSB's measurement created by reportStatus does. */
    struct ycsb_meas *m = ycsb_meas_create(YCSB_INTERVAL_OP);
    CHECK(m != NULL);
    ycsb_meas_record(m, YCSB_M_READ, YCSB_ST_TIMEOUT, 0, 0, 5000);
    print_and_parse(m, 10, 0, pct3, 3);
    CHECK_EQ_U64(u64("READ", "Operations"), 0);
    CHECK_EQ_STR(value("READ", "AverageLatency(us)"), "0.0");
    CHECK_EQ_U64(u64("READ", "MinLatency(us)"), 0);
    CHECK_EQ_U64(u64("READ", "MaxLatency(us)"), 0);
    CHECK_EQ_U64(u64("READ", "Return=TIMEOUT"), 1);
    CHECK_EQ_U64(u64("READ-FAILED", "Operations"), 1);
    CHECK_EQ_STR(lines[1].value, "0.0");
    ycsb_meas_reset(m);
    print_and_parse(m, 10, 0, pct3, 3);
    CHECK_EQ_I64(nlines, 2);
    ycsb_meas_destroy(m);
}

/* ---- status line ------------------------------------------------------------- */

TEST(status_remaining)
{
    static const struct {
        int64_t s;
        const char *want;
    } cases[] = {
        {0, "0 second "},
        {5, "5 second "}, /* YCSB's one-digit quirk */
        {45, "45 seconds "},
        {60, "1 minute "},
        {150, "2 minutes "},
        {3700, "1 hour 1 minute "},
        {7200, "2 hours "},
        {90000, "1 day 1 hour "},
        {2 * 86400 + 59, "2 days "}, /* minutes only below a day */
    };
    char buf[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(ycsb_remaining(buf, sizeof buf, cases[i].s) > 0);
        CHECK_EQ_STR(buf, cases[i].want);
    }
    CHECK_ERR(ycsb_remaining(buf, 4, 3700), FK_ETOOBIG);
}

TEST(status_line_format)
{
    setenv("TZ", "UTC", 1);
    tzset();
    struct ycsb_meas *total = ycsb_meas_create(YCSB_INTERVAL_OP);
    struct ycsb_meas *iv = ycsb_meas_create(YCSB_INTERVAL_OP);
    CHECK(total && iv);
    for (int i = 1; i <= 100; i++) {
        ycsb_meas_record(iv, YCSB_M_READ, YCSB_ST_OK, 0, 0, i * 1000);
        ycsb_meas_record(total, YCSB_M_READ, YCSB_ST_OK, 0, 0, i * 1000);
    }
    ycsb_meas_record(total, YCSB_M_UPDATE, YCSB_ST_OK, 0, 0, 1000); /* none this interval */
    struct ycsb_status_args a = {
        .label = "lbl ",
        .wall_ms = 1700000000123LL, /* 2023-11-14 22:13:20.123 UTC */
        .start_ms = 0,
        .interval_start_ms = 0,
        .now_ms = 10000,
        .totalops = 12345,
        .lastops = 0,
        .todoops = 87655,
    };
    char buf[1024];
    CHECK(ycsb_status_line(buf, sizeof buf, &a, total, iv) > 0);
    /* 12345 / 10 s = 1234.5 ops/s; 87655 / 1234.5 = 71.0 s -> ceil 72 s. */
    char want[1024];
    snprintf(want, sizeof want,
             "lbl 2023-11-14 22:13:20:123 10 sec: 12345 operations; 1234.5 current ops/sec; "
             "est completion in 1 minute [READ: Count=100, Max=100, Min=1, Avg=50.5, 90=%llu, "
             "99=%llu, 99.9=%llu, 99.99=%llu] [UPDATE: Count=0, Max=0, Min=0, Avg=0, 90=0, 99=0, "
             "99.9=0, 99.99=0] ",
             (unsigned long long)(fk_hist_percentile(&iv->hist[0][YCSB_M_READ][0], 90) / 1000),
             (unsigned long long)(fk_hist_percentile(&iv->hist[0][YCSB_M_READ][0], 99) / 1000),
             (unsigned long long)(fk_hist_percentile(&iv->hist[0][YCSB_M_READ][0], 99.9) / 1000),
             (unsigned long long)(fk_hist_percentile(&iv->hist[0][YCSB_M_READ][0], 99.99) / 1000));
    CHECK_EQ_STR(buf, want);
    /* Second interval, nothing done, nothing to do: no rate, no estimate. */
    struct ycsb_status_args b = {.label = "",
                                 .wall_ms = 1700000010000LL,
                                 .start_ms = 0,
                                 .interval_start_ms = 10000,
                                 .now_ms = 20000,
                                 .totalops = 0,
                                 .lastops = 0,
                                 .todoops = 0};
    CHECK(ycsb_status_line(buf, sizeof buf, &b, NULL, NULL) > 0);
    CHECK_EQ_STR(buf, "2023-11-14 22:13:30:000 20 sec: 0 operations; ");
    CHECK_ERR(ycsb_status_line(buf, 20, &a, total, iv), FK_ETOOBIG);
    ycsb_meas_destroy(total);
    ycsb_meas_destroy(iv);
}

/* ---- pacing -------------------------------------------------------------------- */

TEST(pacing_intended_starts)
{
    struct ycsb_pace p;
    struct ycsb_rng rng;
    ycsb_rng_seed(&rng, 1);
    /* 1000 ops/s over 4 threads: 250 ops/s each, one every 4 ms. */
    CHECK_OK(ycsb_pace_init(&p, 1000, 4, 5000));
    CHECK_EQ_I64(p.tick_ns, 4000000);
    CHECK_EQ_I64(ycsb_pace_intended(&p, 0, 123), 5000);
    CHECK_EQ_I64(ycsb_pace_intended(&p, 10, 123), 5000 + 40000000);
    /* At most one op per ms per thread: a random start offset in [0, tick). */
    for (int i = 0; i < 100; i++) {
        int64_t d = ycsb_pace_initial_delay(&p, &rng);
        CHECK(d >= 0 && d < 4000000);
    }
    /* 100,000 ops/s on one thread: 10 us apart, no initial delay. */
    CHECK_OK(ycsb_pace_init(&p, 100000, 1, 0));
    CHECK_EQ_I64(p.tick_ns, 10000);
    CHECK_EQ_I64(ycsb_pace_initial_delay(&p, &rng), 0);
    CHECK_EQ_I64(ycsb_pace_intended(&p, UINT64_MAX / 2, 0), INT64_MAX); /* saturates */
    /* YCSB's truncation: 3 ops/s -> (long)(1e6 / 0.003) ns. */
    CHECK_OK(ycsb_pace_init(&p, 3, 1, 0));
    CHECK_EQ_I64(p.tick_ns, 333333333);
    /* Closed loop: the intended start is the actual one. */
    CHECK_OK(ycsb_pace_init(&p, 0, 8, 0));
    CHECK_EQ_I64(p.tick_ns, 0);
    CHECK_EQ_I64(ycsb_pace_intended(&p, 7, 777), 777);
    CHECK_EQ_I64(ycsb_pace_initial_delay(&p, &rng), 0);
    CHECK_ERR(ycsb_pace_init(&p, 100, 0, 0), FK_EINVAL);
    CHECK_ERR(ycsb_pace_init(&p, -1, 1, 0), FK_EINVAL);
}

CHECK_MAIN()
