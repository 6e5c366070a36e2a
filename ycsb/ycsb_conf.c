/* ycsb_conf.c: CoreWorkload and Client properties, their defaults and checks;
 * see ycsb_workload.h for the list and for where we are stricter than YCSB. */
#include "ycsb_workload.h"

#include "fk_error.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FIELD_LEN_MAX (1 << 20) /* bytes per field: bounds a driver's buffers */
#define THREADS_MAX   1024

struct parser {
    const struct ycsb_props *props;
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 3, 4))) static int bad(struct parser *ps, const char *name,
                                                     const char *fmt, ...)
{
    if (ps->err != NULL && ps->errlen > 0) {
        int n = snprintf(ps->err, ps->errlen, "%s: ", name);
        if (n >= 0 && (size_t)n < ps->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return FK_EINVAL;
}

/* The value of name with surrounding blanks removed, copied into buf; the
 * default when absent. Returns NULL (and sets err) when it does not fit. */
static const char *get_trimmed(struct parser *ps, const char *name, const char *def, char *buf,
                               size_t len)
{
    const char *v = ycsb_props_get(ps->props, name);
    if (v == NULL)
        v = def;
    while (*v == ' ' || *v == '\t' || *v == '\f' || *v == '\r' || *v == '\n')
        v++;
    size_t n = strlen(v);
    while (n > 0 && strchr(" \t\f\r\n", v[n - 1]) != NULL)
        n--;
    if (n >= len) {
        bad(ps, name, "value longer than %zu bytes", len - 1);
        return NULL;
    }
    memcpy(buf, v, n);
    buf[n] = '\0';
    return buf;
}

static int get_str(struct parser *ps, const char *name, const char *def, char *out, size_t len)
{
    const char *v = ycsb_props_get(ps->props, name);
    if (v == NULL)
        v = def;
    if (strlen(v) >= len)
        return bad(ps, name, "value longer than %zu bytes", len - 1);
    strcpy(out, v);
    return 0;
}

static int get_i64(struct parser *ps, const char *name, const char *def, int64_t min, int64_t max,
                   int64_t *out)
{
    char buf[64];
    const char *v = get_trimmed(ps, name, def, buf, sizeof buf);
    if (v == NULL)
        return FK_EINVAL;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0)
        return bad(ps, name, "'%s' is not an integer", v);
    if (x < min || x > max)
        return bad(ps, name, "%lld is outside [%lld, %lld]", x, (long long)min, (long long)max);
    *out = x;
    return 0;
}

static int get_i32(struct parser *ps, const char *name, const char *def, int32_t min, int32_t max,
                   int32_t *out)
{
    int64_t x;
    int rc = get_i64(ps, name, def, min, max, &x);
    if (rc == 0)
        *out = (int32_t)x;
    return rc;
}

static int get_double(struct parser *ps, const char *name, const char *def, double min, double max,
                      double *out)
{
    char buf[64];
    const char *v = get_trimmed(ps, name, def, buf, sizeof buf);
    if (v == NULL)
        return FK_EINVAL;
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !isfinite(x))
        return bad(ps, name, "'%s' is not a number", v);
    if (x < min || x > max)
        return bad(ps, name, "%g is outside [%g, %g]", x, min, max);
    *out = x;
    return 0;
}

static int get_bool(struct parser *ps, const char *name, const char *def, bool *out)
{
    char buf[16];
    const char *v = get_trimmed(ps, name, def, buf, sizeof buf);
    if (v == NULL)
        return FK_EINVAL;
    if (strcasecmp(v, "true") == 0)
        *out = true;
    else if (strcasecmp(v, "false") == 0)
        *out = false;
    else
        return bad(ps, name, "'%s' is neither true nor false", v);
    return 0;
}

static const char *const dist_names[] = {
    [YCSB_DIST_UNIFORM] = "uniform",       [YCSB_DIST_ZIPFIAN] = "zipfian",
    [YCSB_DIST_LATEST] = "latest",         [YCSB_DIST_HOTSPOT] = "hotspot",
    [YCSB_DIST_SEQUENTIAL] = "sequential", [YCSB_DIST_EXPONENTIAL] = "exponential",
    [YCSB_DIST_CONSTANT] = "constant",
};

/* allowed: a bit mask of enum ycsb_dist values; what is the list for err. */
static int get_dist(struct parser *ps, const char *name, const char *def, unsigned allowed,
                    const char *what, enum ycsb_dist *out)
{
    char buf[32];
    const char *v = get_trimmed(ps, name, def, buf, sizeof buf);
    if (v == NULL)
        return FK_EINVAL;
    for (unsigned d = 0; d < sizeof dist_names / sizeof dist_names[0]; d++) {
        if ((allowed & (1u << d)) && strcmp(v, dist_names[d]) == 0) {
            *out = (enum ycsb_dist)d;
            return 0;
        }
    }
    return bad(ps, name, "unknown distribution '%s' (one of: %s)", v, what);
}

static int get_percentiles(struct parser *ps, struct ycsb_conf *c)
{
    const char *name = "hdrhistogram.percentiles";
    char buf[256];
    const char *v = get_trimmed(ps, name, "50,95,99", buf, sizeof buf);
    if (v == NULL)
        return FK_EINVAL;
    c->npercentiles = 0;
    for (const char *s = v;;) {
        char *end;
        double p = strtod(s, &end);
        if (end == s || !(p > 0.0 && p <= 100.0))
            return bad(ps, name, "'%s' is not a list of percentiles in (0, 100]", v);
        if (c->npercentiles == YCSB_PERCENTILE_MAX)
            return bad(ps, name, "more than %d percentiles", YCSB_PERCENTILE_MAX);
        c->percentiles[c->npercentiles++] = p;
        while (*end == ' ')
            end++;
        if (*end == '\0')
            return 0;
        if (*end != ',')
            return bad(ps, name, "'%s' is not a comma-separated list", v);
        s = end + 1;
    }
}

/* Properties YCSB knows that this driver refuses rather than ignores. */
static int refuse_unsupported(struct parser *ps)
{
    bool b;
    if (get_bool(ps, "dataintegrity", "false", &b) < 0)
        return FK_EINVAL;
    if (b)
        return bad(ps, "dataintegrity", "not supported by flowkv-ycsb");
    if (get_bool(ps, "reportlatencyforeacherror", "false", &b) < 0)
        return FK_EINVAL;
    if (b)
        return bad(ps, "reportlatencyforeacherror", "not supported by flowkv-ycsb");
    if (ycsb_props_get(ps->props, "latencytrackederrors") != NULL)
        return bad(ps, "latencytrackederrors", "not supported by flowkv-ycsb");
    char buf[128];
    const char *m = get_trimmed(ps, "measurementtype", "hdrhistogram", buf, sizeof buf);
    if (m == NULL)
        return FK_EINVAL;
    if (strcmp(m, "hdrhistogram") != 0)
        return bad(ps, "measurementtype", "'%s' not supported (hdrhistogram only)", m);
    const char *w =
        get_trimmed(ps, "workload", "site.ycsb.workloads.CoreWorkload", buf, sizeof buf);
    if (w == NULL)
        return FK_EINVAL;
    size_t n = strlen(w), k = strlen("CoreWorkload");
    if (n < k || strcmp(w + n - k, "CoreWorkload") != 0)
        return bad(ps, "workload", "'%s' not supported (CoreWorkload only)", w);
    return 0;
}

static int parse_names(struct parser *ps, struct ycsb_conf *c)
{
    int rc = get_str(ps, "table", "usertable", c->table, sizeof c->table);
    if (rc == 0)
        rc = get_str(ps, "db", "flowkv", c->db, sizeof c->db);
    if (rc == 0)
        rc = get_str(ps, "label", "", c->label, sizeof c->label);
    if (rc == 0)
        rc = get_str(ps, "fieldnameprefix", "field", c->fieldnameprefix, sizeof c->fieldnameprefix);
    return rc;
}

static int parse_fields(struct parser *ps, struct ycsb_conf *c)
{
    int rc = get_i64(ps, "fieldcount", "10", 1, YCSB_FIELDS_MAX, &c->fieldcount);
    if (rc == 0)
        rc = get_i32(ps, "fieldlength", "100", 0, FIELD_LEN_MAX, &c->fieldlength);
    if (rc == 0)
        rc = get_i32(ps, "minfieldlength", "1", 0, FIELD_LEN_MAX, &c->minfieldlength);
    if (rc == 0)
        rc = get_dist(ps, "fieldlengthdistribution", "constant",
                      1u << YCSB_DIST_CONSTANT | 1u << YCSB_DIST_UNIFORM | 1u << YCSB_DIST_ZIPFIAN,
                      "constant, uniform, zipfian", &c->fieldlengthdist);
    if (rc == 0 && c->fieldlengthdist != YCSB_DIST_CONSTANT && c->minfieldlength > c->fieldlength)
        rc = bad(ps, "minfieldlength", "%d is above fieldlength %d", c->minfieldlength,
                 c->fieldlength);
    if (rc == 0)
        rc = get_bool(ps, "readallfields", "true", &c->readallfields);
    if (rc == 0)
        rc = get_bool(ps, "readallfieldsbyname", "false", &c->readallfieldsbyname);
    if (rc == 0)
        rc = get_bool(ps, "writeallfields", "false", &c->writeallfields);
    return rc;
}

static int parse_proportions(struct parser *ps, struct ycsb_conf *c)
{
    const struct {
        const char *name, *def;
        double *out;
    } props[] = {
        {"readproportion", "0.95", &c->readproportion},
        {"updateproportion", "0.05", &c->updateproportion},
        {"insertproportion", "0.0", &c->insertproportion},
        {"scanproportion", "0.0", &c->scanproportion},
        {"readmodifywriteproportion", "0.0", &c->readmodifywriteproportion},
    };
    double sum = 0;
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++) {
        int rc = get_double(ps, props[i].name, props[i].def, 0.0, 1e300, props[i].out);
        if (rc < 0)
            return rc;
        sum += *props[i].out;
    }
    if (c->dotransactions && !(sum > 0))
        return bad(ps, "readproportion", "every operation proportion is 0");
    return 0;
}

static int parse_keys(struct parser *ps, struct ycsb_conf *c)
{
    int rc = get_i64(ps, "recordcount", "0", 0, INT32_MAX, &c->recordcount);
    if (rc < 0)
        return rc;
    c->recordcount_given = c->recordcount;
    if (c->recordcount == 0) /* CoreWorkload: 0 means Integer.MAX_VALUE */
        c->recordcount = INT32_MAX;
    rc = get_i64(ps, "operationcount", "0", 0, INT32_MAX, &c->operationcount);
    if (rc == 0)
        rc = get_i64(ps, "insertstart", "0", 0, c->recordcount, &c->insertstart);
    if (rc < 0)
        return rc;
    char def[32];
    snprintf(def, sizeof def, "%lld", (long long)(c->recordcount - c->insertstart));
    c->insertcount_set = ycsb_props_get(ps->props, "insertcount") != NULL;
    rc = get_i64(ps, "insertcount", def, 0, INT32_MAX, &c->insertcount);
    if (rc < 0)
        return rc;
    if (c->recordcount < c->insertstart + c->insertcount)
        return bad(ps, "insertcount",
                   "recordcount (%lld) must be at least insertstart + insertcount (%lld)",
                   (long long)c->recordcount, (long long)(c->insertstart + c->insertcount));
    if (c->dotransactions && c->insertcount == 0)
        return bad(ps, "insertcount", "the run phase needs at least one record");
    char buf[32];
    const char *order = get_trimmed(ps, "insertorder", "hashed", buf, sizeof buf);
    if (order == NULL)
        return FK_EINVAL;
    if (strcmp(order, "hashed") != 0 && strcmp(order, "ordered") != 0)
        return bad(ps, "insertorder", "'%s' is neither hashed nor ordered", order);
    c->ordered_inserts = strcmp(order, "ordered") == 0;
    return get_i32(ps, "zeropadding", "1", 0, YCSB_ZEROPAD_MAX, &c->zeropadding);
}

static int parse_distributions(struct parser *ps, struct ycsb_conf *c)
{
    unsigned req = 1u << YCSB_DIST_UNIFORM | 1u << YCSB_DIST_ZIPFIAN | 1u << YCSB_DIST_LATEST |
                   1u << YCSB_DIST_HOTSPOT | 1u << YCSB_DIST_SEQUENTIAL |
                   1u << YCSB_DIST_EXPONENTIAL;
    int rc =
        get_dist(ps, "requestdistribution", "uniform", req,
                 "uniform, zipfian, latest, hotspot, sequential, exponential", &c->requestdist);
    if (rc == 0)
        rc = get_i32(ps, "minscanlength", "1", 0, INT32_MAX, &c->minscanlength);
    if (rc == 0)
        rc = get_i32(ps, "maxscanlength", "1000", 1, INT32_MAX, &c->maxscanlength);
    if (rc == 0 && c->minscanlength > c->maxscanlength)
        rc = bad(ps, "minscanlength", "%d is above maxscanlength %d", c->minscanlength,
                 c->maxscanlength);
    if (rc == 0)
        rc = get_dist(ps, "scanlengthdistribution", "uniform",
                      1u << YCSB_DIST_UNIFORM | 1u << YCSB_DIST_ZIPFIAN, "uniform, zipfian",
                      &c->scanlengthdist);
    if (rc == 0)
        rc = get_double(ps, "hotspotdatafraction", "0.2", 0, 1, &c->hotspotdatafraction);
    if (rc == 0)
        rc = get_double(ps, "hotspotopnfraction", "0.8", 0, 1, &c->hotspotopnfraction);
    if (rc == 0)
        rc = get_double(ps, "exponential.percentile", "95", 1e-9, 100 - 1e-9,
                        &c->exponential_percentile);
    if (rc == 0)
        rc = get_double(ps, "exponential.frac", "0.8571428571", 1e-12, 1e12, &c->exponential_frac);
    return rc;
}

static int parse_client(struct parser *ps, struct ycsb_conf *c)
{
    int rc = get_i32(ps, "threadcount", "1", 1, THREADS_MAX, &c->threadcount);
    if (rc == 0)
        rc = get_i32(ps, "target", "0", 0, INT32_MAX, &c->target);
    if (rc == 0)
        rc = get_bool(ps, "status", "false", &c->status);
    if (rc == 0)
        rc = get_i32(ps, "status.interval", "10", 1, 86400, &c->status_interval);
    if (rc == 0)
        rc = get_i64(ps, "maxexecutiontime", "0", 0, INT32_MAX, &c->maxexecutiontime);
    if (rc == 0)
        rc = get_i32(ps, "core_workload_insertion_retry_limit", "0", 0, 1000,
                     &c->insertion_retry_limit);
    if (rc == 0)
        rc = get_i32(ps, "core_workload_insertion_retry_interval", "3", 0, 86400,
                     &c->insertion_retry_interval);
    if (rc < 0)
        return rc;
    char buf[32];
    const char *iv = get_trimmed(ps, "measurement.interval", "intended", buf, sizeof buf);
    if (iv == NULL)
        return FK_EINVAL;
    if (strcmp(iv, "op") == 0)
        c->interval = YCSB_INTERVAL_OP;
    else if (strcmp(iv, "intended") == 0)
        c->interval = YCSB_INTERVAL_INTENDED;
    else if (strcmp(iv, "both") == 0)
        c->interval = YCSB_INTERVAL_BOTH;
    else
        return bad(ps, "measurement.interval", "'%s' is not op, intended or both", iv);
    int64_t seed;
    rc = get_i64(ps, "flowkv.seed", "1", 0, INT64_MAX, &seed);
    c->seed = (uint64_t)seed;
    if (rc == 0)
        rc = get_i32(ps, "flowkv.pipeline", "1", 1, YCSB_PIPELINE_MAX, &c->pipeline);
    return rc < 0 ? rc : get_percentiles(ps, c);
}

int ycsb_conf_parse(struct ycsb_conf *conf, const struct ycsb_props *props, char *err,
                    size_t errlen)
{
    struct parser ps = {.props = props, .err = err, .errlen = errlen};
    memset(conf, 0, sizeof *conf);
    int rc = get_bool(&ps, "dotransactions", "true", &conf->dotransactions);
    if (rc == 0)
        rc = refuse_unsupported(&ps);
    if (rc == 0)
        rc = parse_names(&ps, conf);
    if (rc == 0)
        rc = parse_fields(&ps, conf);
    if (rc == 0)
        rc = parse_proportions(&ps, conf);
    if (rc == 0)
        rc = parse_keys(&ps, conf);
    if (rc == 0)
        rc = parse_distributions(&ps, conf);
    if (rc == 0)
        rc = parse_client(&ps, conf);
    return rc;
}

int64_t ycsb_conf_total_ops(const struct ycsb_conf *c)
{
    if (c->dotransactions)
        return c->operationcount;
    if (c->insertcount_set)
        return c->insertcount;
    /* Client reads recordcount itself, where 0 stays 0 (no limit). */
    return c->recordcount_given;
}

int32_t ycsb_conf_threads(const struct ycsb_conf *c)
{
    int64_t total = ycsb_conf_total_ops(c);
    if (total > 0 && c->threadcount > total)
        return (int32_t)total;
    return c->threadcount;
}

int64_t ycsb_thread_ops(int64_t total, int32_t nthreads, int32_t tid)
{
    int64_t n = total / nthreads;
    if (tid < total % nthreads)
        n++;
    return n;
}
