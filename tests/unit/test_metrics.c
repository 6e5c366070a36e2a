/* Unit tests for common/fk_metrics: Prometheus text rendering. */
#include "check.h"
#include "fk_error.h"
#include "fk_metrics.h"

static uint64_t forty_two(void *arg)
{
    return *(uint64_t *)arg;
}

static struct fk_metrics reg;
static struct fk_hist hist;
static char out[8192];

TEST(metrics_render_every_kind)
{
    fk_metrics_init(&reg);
    fk_hist_init(&hist);
    struct fk_metric *get =
        fk_metrics_counter(&reg, "flowkv_requests_total", "op=\"get\"", "Requests served.");
    struct fk_metric *put =
        fk_metrics_counter(&reg, "flowkv_requests_total", "op=\"put\"", "Requests served.");
    struct fk_metric *commit = fk_metrics_gauge(&reg, "flowkv_commit_index", NULL, "Commit point.");
    uint64_t mem = 42;
    CHECK(fk_metrics_gauge_fn(&reg, "flowkv_flow_bytes", NULL, "Registered bytes.", forty_two,
                              &mem) != NULL);
    uint64_t writes = 7;
    CHECK(fk_metrics_counter_fn(&reg, "flowkv_verbs_total", "kind=\"write\"", "Work requests.",
                                forty_two, &writes) != NULL);
    CHECK(fk_metrics_counter_fn(&reg, "flowkv_verbs_total", NULL, "x", NULL, NULL) == NULL);
    CHECK(fk_metrics_summary(&reg, "flowkv_latency_seconds", "op=\"get\"", "Latency.", &hist));
    CHECK(get && put && commit);
    fk_metric_add(get, 3);
    fk_metric_add(put, 1);
    fk_metric_set(commit, 17);
    for (uint64_t i = 1; i <= 100; i++)
        fk_hist_record(&hist, i * 1000); /* 1..100 us */
    int n = fk_metrics_render(&reg, out, sizeof out);
    CHECK(n > 0 && (size_t)n == strlen(out));
    const char *want[] = {
        "# HELP flowkv_requests_total Requests served.\n# TYPE flowkv_requests_total counter\n"
        "flowkv_requests_total{op=\"get\"} 3\nflowkv_requests_total{op=\"put\"} 1\n",
        "# TYPE flowkv_commit_index gauge\nflowkv_commit_index 17\n",
        "flowkv_flow_bytes 42\n",
        "# TYPE flowkv_verbs_total counter\nflowkv_verbs_total{kind=\"write\"} 7\n",
        "# TYPE flowkv_latency_seconds summary\n",
        "flowkv_latency_seconds{op=\"get\",quantile=\"0.5\"} 0.0000500", /* within 1% */
        "flowkv_latency_seconds{op=\"get\",quantile=\"0.99\"} 0.000099",
        "flowkv_latency_seconds_sum{op=\"get\"} 0.005050000\n",
        "flowkv_latency_seconds_count{op=\"get\"} 100\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(strstr(out, want[i]) != NULL, "missing item %zu in:\n%s", i, out);
    /* HELP appears once per name. */
    CHECK(strstr(strstr(out, "# HELP flowkv_requests_total") + 1, "# HELP flowkv_requests_total") ==
          NULL);
}

/* Families render together even when registered interleaved (the text
 * format's rule); a histogram's buckets are cumulative, end in +Inf and
 * agree with _count; a name keeps one type. */
TEST(metrics_families_grouped_and_histograms)
{
    fk_metrics_init(&reg);
    fk_hist_init(&hist);
    struct fk_metric *a = fk_metrics_counter(&reg, "fam_a_total", "op=\"get\"", "A.");
    CHECK(fk_metrics_histogram(&reg, "lat_seconds", "op=\"get\"", "Latency.", &hist) != NULL);
    struct fk_metric *b = fk_metrics_counter(&reg, "fam_a_total", "op=\"put\"", "A.");
    CHECK(fk_metrics_histogram(&reg, "lat_seconds", "op=\"put\"", "Latency.", &hist) != NULL);
    CHECK(fk_metrics_gauge(&reg, "fam_a_total", "op=\"x\"", "A.") == NULL); /* another type */
    CHECK(a && b);
    fk_metric_add(a, 2);
    fk_metric_add(b, 5);
    fk_hist_record(&hist, 30000);          /* 30 us: in every bucket from 50 us */
    fk_hist_record(&hist, 3000000);        /* 3 ms: from 5 ms */
    fk_hist_record(&hist, 20000000000ULL); /* 20 s: +Inf only */
    int n = fk_metrics_render(&reg, out, sizeof out);
    CHECK(n > 0);
    const char *want = "# HELP fam_a_total A.\n# TYPE fam_a_total counter\n"
                       "fam_a_total{op=\"get\"} 2\nfam_a_total{op=\"put\"} 5\n"
                       "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
                       "lat_seconds_bucket{op=\"get\",le=\"5e-05\"} 1\n";
    CHECK_MSG(strncmp(out, want, strlen(want)) == 0, "got:\n%s", out);
    const char *more[] = {"lat_seconds_bucket{op=\"get\",le=\"0.0025\"} 1\n",
                          "lat_seconds_bucket{op=\"get\",le=\"0.005\"} 2\n",
                          "lat_seconds_bucket{op=\"get\",le=\"10\"} 2\n",
                          "lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 3\n",
                          "lat_seconds_count{op=\"get\"} 3\n",
                          "lat_seconds_bucket{op=\"put\",le=\"+Inf\"} 3\n"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        CHECK_MSG(strstr(out, more[i]) != NULL, "missing %s in:\n%s", more[i], out);
    /* One HELP per family. */
    CHECK(strstr(strstr(out, "# HELP lat_seconds") + 1, "# HELP lat_seconds") == NULL);
}

TEST(metrics_reject_bad_names_and_overflow)
{
    fk_metrics_init(&reg);
    CHECK(fk_metrics_counter(&reg, "1bad", NULL, "x") == NULL);
    CHECK(fk_metrics_counter(&reg, "bad-name", NULL, "x") == NULL);
    CHECK(fk_metrics_counter(&reg, "ok", "a=\"1\"\n", "x") == NULL);
    CHECK(fk_metrics_counter(&reg, "ok", NULL, "two\nlines") == NULL);
    for (int i = 0; i < FK_METRICS_MAX; i++)
        CHECK(fk_metrics_counter(&reg, "many", NULL, "x") != NULL);
    CHECK(fk_metrics_counter(&reg, "one_more", NULL, "x") == NULL);
    char small[64];
    CHECK_ERR(fk_metrics_render(&reg, small, sizeof small), FK_ETOOBIG);
}

CHECK_MAIN()
