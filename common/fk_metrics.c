/* fk_metrics.c: registry and Prometheus text rendering. */
#include "fk_metrics.h"

#include "fk_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void fk_metrics_init(struct fk_metrics *r)
{
    memset(r, 0, sizeof *r);
}

static int fk__valid_name(const char *s)
{
    if (s == NULL || s[0] == '\0' || strlen(s) >= FK_METRICS_NAME_MAX)
        return 0;
    for (const char *p = s; *p; p++) {
        int alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':';
        int digit = *p >= '0' && *p <= '9';
        if (!alpha && !(digit && p != s))
            return 0;
    }
    return 1;
}

static struct fk_metric *fk__add(struct fk_metrics *r, const char *name, const char *labels,
                                 const char *help, enum fk_metric_kind kind)
{
    if (labels == NULL)
        labels = "";
    if (r->n >= FK_METRICS_MAX || !fk__valid_name(name) || help == NULL || strchr(help, '\n') ||
        strlen(labels) >= FK_METRICS_LABEL_MAX || strchr(labels, '\n'))
        return NULL;
    for (unsigned i = 0; i < r->n; i++)
        if (strcmp(r->m[i].name, name) == 0 && r->m[i].kind != kind)
            return NULL; /* a family has one type */
    struct fk_metric *m = &r->m[r->n++];
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->labels, sizeof m->labels, "%s", labels);
    m->help = help;
    m->kind = kind;
    return m;
}

struct fk_metric *fk_metrics_counter(struct fk_metrics *r, const char *name, const char *labels,
                                     const char *help)
{
    return fk__add(r, name, labels, help, FK_METRIC_COUNTER);
}

struct fk_metric *fk_metrics_gauge(struct fk_metrics *r, const char *name, const char *labels,
                                   const char *help)
{
    return fk__add(r, name, labels, help, FK_METRIC_GAUGE);
}

static struct fk_metric *fk__add_fn(struct fk_metrics *r, const char *name, const char *labels,
                                    const char *help, enum fk_metric_kind kind, fk_gauge_fn fn,
                                    void *arg)
{
    if (fn == NULL)
        return NULL;
    struct fk_metric *m = fk__add(r, name, labels, help, kind);
    if (m) {
        m->fn = fn;
        m->fn_arg = arg;
    }
    return m;
}

struct fk_metric *fk_metrics_gauge_fn(struct fk_metrics *r, const char *name, const char *labels,
                                      const char *help, fk_gauge_fn fn, void *arg)
{
    return fk__add_fn(r, name, labels, help, FK_METRIC_GAUGE, fn, arg);
}

struct fk_metric *fk_metrics_counter_fn(struct fk_metrics *r, const char *name, const char *labels,
                                        const char *help, fk_gauge_fn fn, void *arg)
{
    return fk__add_fn(r, name, labels, help, FK_METRIC_COUNTER, fn, arg);
}

/* A summary or a histogram: both render from an fk_hist. */
static struct fk_metric *fk__add_hist(struct fk_metrics *r, const char *name, const char *labels,
                                      const char *help, enum fk_metric_kind kind,
                                      const struct fk_hist *h)
{
    if (h == NULL)
        return NULL;
    struct fk_metric *m = fk__add(r, name, labels, help, kind);
    if (m)
        m->hist = h;
    return m;
}

struct fk_metric *fk_metrics_summary(struct fk_metrics *r, const char *name, const char *labels,
                                     const char *help, const struct fk_hist *h)
{
    return fk__add_hist(r, name, labels, help, FK_METRIC_SUMMARY, h);
}

struct fk_metric *fk_metrics_histogram(struct fk_metrics *r, const char *name, const char *labels,
                                       const char *help, const struct fk_hist *h)
{
    return fk__add_hist(r, name, labels, help, FK_METRIC_HISTOGRAM, h);
}

struct fk__out {
    char *buf;
    size_t cap, len;
    int overflow;
};

static void fk__printf(struct fk__out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fk__printf(struct fk__out *o, const char *fmt, ...)
{
    if (o->overflow)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    o->len += (size_t)n;
}

/* "{labels}" or "{labels,extra}" or "" */
static void fk__labels(struct fk__out *o, const char *labels, const char *extra)
{
    if (labels[0] && extra)
        fk__printf(o, "{%s,%s}", labels, extra);
    else if (labels[0] || extra)
        fk__printf(o, "{%s}", labels[0] ? labels : extra);
}

static void fk__render_summary(struct fk__out *o, const struct fk_metric *m)
{
    static const double qs[] = {0.5, 0.9, 0.99, 0.999};
    const struct fk_hist *h = m->hist;
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        char q[32];
        snprintf(q, sizeof q, "quantile=\"%g\"", qs[i]);
        fk__printf(o, "%s", m->name);
        fk__labels(o, m->labels, q);
        fk__printf(o, " %.9f\n", (double)fk_hist_percentile(h, qs[i] * 100.0) / 1e9);
    }
    fk__printf(o, "%s_sum", m->name);
    fk__labels(o, m->labels, NULL);
    fk__printf(o, " %.9f\n", (double)(h->sum / 1e9L));
    fk__printf(o, "%s_count", m->name);
    fk__labels(o, m->labels, NULL);
    fk__printf(o, " %lu\n", (unsigned long)h->count);
}

static const double fk__bounds[FK_METRICS_BUCKETS] = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 10};

/* One pass over the fk_hist's buckets in value order: each bound's
 * cumulative count is that of the buckets starting at or below it. */
static void fk__render_histogram(struct fk__out *o, const struct fk_metric *m)
{
    const struct fk_hist *h = m->hist;
    uint64_t cum = 0;
    unsigned idx = 0;
    for (int b = 0; b < FK_METRICS_BUCKETS; b++) {
        uint64_t bound_ns = (uint64_t)(fk__bounds[b] * 1e9 + 0.5);
        unsigned last = fk_hist_index(bound_ns);
        for (; idx <= last; idx++)
            cum += h->buckets[idx];
        char le[32];
        snprintf(le, sizeof le, "le=\"%g\"", fk__bounds[b]);
        fk__printf(o, "%s_bucket", m->name);
        fk__labels(o, m->labels, le);
        fk__printf(o, " %lu\n", (unsigned long)cum);
    }
    fk__printf(o, "%s_bucket", m->name);
    fk__labels(o, m->labels, "le=\"+Inf\"");
    fk__printf(o, " %lu\n", (unsigned long)h->count);
    fk__printf(o, "%s_sum", m->name);
    fk__labels(o, m->labels, NULL);
    fk__printf(o, " %.9f\n", (double)(h->sum / 1e9L));
    fk__printf(o, "%s_count", m->name);
    fk__labels(o, m->labels, NULL);
    fk__printf(o, " %lu\n", (unsigned long)h->count);
}

static const char *const fk__type_names[] = {"counter", "gauge", "summary", "histogram"};

static void fk__render_one(struct fk__out *o, const struct fk_metric *m)
{
    if (m->kind == FK_METRIC_SUMMARY) {
        fk__render_summary(o, m);
        return;
    }
    if (m->kind == FK_METRIC_HISTOGRAM) {
        fk__render_histogram(o, m);
        return;
    }
    uint64_t v = m->fn ? m->fn(m->fn_arg) : atomic_load_explicit(&m->value, memory_order_relaxed);
    fk__printf(o, "%s", m->name);
    fk__labels(o, m->labels, NULL);
    if (m->ns_as_seconds)
        fk__printf(o, " %.9f\n", (double)v / 1e9);
    else
        fk__printf(o, " %lu\n", (unsigned long)v);
}

int fk_metrics_render(const struct fk_metrics *r, char *buf, size_t cap)
{
    struct fk__out o = {.buf = buf, .cap = cap, .len = 0, .overflow = 0};
    if (cap == 0)
        return FK_ETOOBIG;
    buf[0] = '\0';
    /* Families together (the text format wants a family's lines in one
     * group): a family is rendered at its first metric, with every later
     * metric of the same name. O(n^2) over at most FK_METRICS_MAX. */
    for (unsigned i = 0; i < r->n; i++) {
        const struct fk_metric *m = &r->m[i];
        int first = 1;
        for (unsigned j = 0; j < i && first; j++)
            first = strcmp(r->m[j].name, m->name) != 0;
        if (!first)
            continue;
        fk__printf(&o, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name,
                   fk__type_names[m->kind]);
        for (unsigned j = i; j < r->n; j++)
            if (strcmp(r->m[j].name, m->name) == 0)
                fk__render_one(&o, &r->m[j]);
    }
    if (o.overflow)
        return FK_ETOOBIG;
    return (int)o.len;
}
