/* Unit tests for ycsb/ycsb_workload and ycsb_conf: CoreWorkload's properties,
 * key names and operation stream, and flowkv-ycsb --dry-run. Statistical
 * checks: fixed seeds, 5-sigma binomial tolerance (see test_ycsb_gen.c). */
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
#include <sys/wait.h>

static struct ycsb_props props;
static struct ycsb_conf conf;
static struct ycsb_workload w;
static struct ycsb_thread th;
static struct ycsb_op op;
static char err[YCSB_ERR_MAX];

#define CHECK_FREQ(count, n, p)                                                                    \
    CHECK_MSG(fabs((double)(count) / (n) - (p)) <= 5.0 * sqrt((p) * (1 - (p)) / (n)),              \
              "%s: %.5f vs %.5f", #count, (double)(count) / (n), (double)(p))

/* Parses "name=value" pairs (NULL-terminated) over empty defaults. */
static int conf_of(const char *const *kv)
{
    ycsb_props_free(&props);
    for (; *kv != NULL; kv++) {
        int rc = ycsb_props_set_arg(&props, *kv, err, sizeof err);
        if (rc < 0)
            return rc;
    }
    err[0] = '\0';
    return ycsb_conf_parse(&conf, &props, err, sizeof err);
}

static void start(const char *const *kv)
{
    CHECK_MSG(conf_of(kv) == 0, "conf: %s", err);
    CHECK_MSG(ycsb_workload_init(&w, &conf, err, sizeof err) == 0, "init: %s", err);
    ycsb_thread_init(&th, &w, 0);
}

TEST(conf_defaults_are_ycsbs)
{
    const char *none[] = {NULL};
    CHECK_OK(conf_of(none));
    CHECK_EQ_STR(conf.table, "usertable");
    CHECK_EQ_STR(conf.fieldnameprefix, "field");
    CHECK_EQ_I64(conf.recordcount, INT32_MAX); /* recordcount=0 -> Integer.MAX_VALUE */
    CHECK_EQ_I64(conf.operationcount, 0);
    CHECK_EQ_I64(conf.fieldcount, 10);
    CHECK_EQ_I64(conf.fieldlength, 100);
    CHECK_EQ_I64(conf.minfieldlength, 1);
    CHECK_EQ_I64(conf.fieldlengthdist, YCSB_DIST_CONSTANT);
    CHECK(conf.readproportion == 0.95 && conf.updateproportion == 0.05);
    CHECK(conf.insertproportion == 0 && conf.scanproportion == 0);
    CHECK(conf.readmodifywriteproportion == 0);
    CHECK_EQ_I64(conf.requestdist, YCSB_DIST_UNIFORM);
    CHECK_EQ_I64(conf.minscanlength, 1);
    CHECK_EQ_I64(conf.maxscanlength, 1000);
    CHECK_EQ_I64(conf.scanlengthdist, YCSB_DIST_UNIFORM);
    CHECK(!conf.ordered_inserts);
    CHECK_EQ_I64(conf.zeropadding, 1);
    CHECK_EQ_I64(conf.insertstart, 0);
    CHECK_EQ_I64(conf.insertcount, INT32_MAX);
    CHECK(conf.hotspotdatafraction == 0.2 && conf.hotspotopnfraction == 0.8);
    CHECK(conf.readallfields && !conf.writeallfields && !conf.readallfieldsbyname);
    CHECK(conf.dotransactions);
    CHECK_EQ_I64(conf.threadcount, 1);
    CHECK_EQ_I64(conf.target, 0);
    CHECK(!conf.status);
    CHECK_EQ_I64(conf.status_interval, 10);
    CHECK_EQ_I64(conf.interval, YCSB_INTERVAL_INTENDED);
    CHECK_EQ_U64(conf.npercentiles, 3);
    CHECK(conf.percentiles[0] == 50 && conf.percentiles[1] == 95 && conf.percentiles[2] == 99);
    CHECK(conf.exponential_percentile == 95);
}

TEST(conf_values_and_ops_split)
{
    const char *kv[] = {"recordcount=1000",
                        "operationcount=10",
                        "insertstart=100",
                        "insertcount= 500 ",
                        "insertorder=ordered",
                        "readallfields=FALSE",
                        "threadcount=3",
                        "hdrhistogram.percentiles=90,99.9",
                        "measurement.interval=both",
                        NULL};
    CHECK_MSG(conf_of(kv) == 0, "%s", err);
    CHECK_EQ_I64(conf.insertcount, 500);
    CHECK(conf.ordered_inserts && !conf.readallfields);
    CHECK_EQ_U64(conf.npercentiles, 2);
    CHECK(conf.percentiles[1] == 99.9);
    CHECK_EQ_I64(conf.interval, YCSB_INTERVAL_BOTH);
    CHECK_EQ_I64(ycsb_conf_total_ops(&conf), 10);
    CHECK_EQ_I64(ycsb_thread_ops(10, 3, 0), 4);
    CHECK_EQ_I64(ycsb_thread_ops(10, 3, 1), 3);
    CHECK_EQ_I64(ycsb_thread_ops(10, 3, 2), 3);
    const char *load[] = {"recordcount=1000", "dotransactions=false", "threadcount=8", NULL};
    CHECK_OK(conf_of(load));
    CHECK_EQ_I64(ycsb_conf_total_ops(&conf), 1000);
    const char *part[] = {"recordcount=1000", "insertcount=2", "dotransactions=false",
                          "threadcount=8", NULL};
    CHECK_OK(conf_of(part));
    CHECK_EQ_I64(ycsb_conf_total_ops(&conf), 2);
    CHECK_EQ_I64(ycsb_conf_threads(&conf), 2); /* fewer operations than threads */
}

/* Each bad value is an error whose message starts with the property name. */
TEST(conf_errors_name_the_property)
{
    static const struct {
        const char *kv, *prop;
    } bad[] = {
        {"readproportion=abc", "readproportion"},
        {"updateproportion=-0.1", "updateproportion"},
        {"recordcount=-1", "recordcount"},
        {"recordcount=12x", "recordcount"},
        {"operationcount=99999999999", "operationcount"},
        {"fieldcount=0", "fieldcount"},
        {"fieldcount=100000", "fieldcount"},
        {"insertorder=random", "insertorder"},
        {"requestdistribution=pareto", "requestdistribution"},
        {"scanlengthdistribution=latest", "scanlengthdistribution"},
        {"fieldlengthdistribution=histogram", "fieldlengthdistribution"},
        {"hotspotdatafraction=1.5", "hotspotdatafraction"},
        {"hotspotopnfraction=nan", "hotspotopnfraction"},
        {"readallfields=yes", "readallfields"},
        {"writeallfields=1", "writeallfields"},
        {"zeropadding=65", "zeropadding"},
        {"maxscanlength=0", "maxscanlength"},
        {"threadcount=0", "threadcount"},
        {"target=-5", "target"},
        {"measurement.interval=sometimes", "measurement.interval"},
        {"hdrhistogram.percentiles=50,abc", "hdrhistogram.percentiles"},
        {"hdrhistogram.percentiles=0", "hdrhistogram.percentiles"},
        {"dataintegrity=true", "dataintegrity"},
        {"measurementtype=timeseries", "measurementtype"},
        {"workload=site.ycsb.workloads.TimeSeriesWorkload", "workload"},
        {"reportlatencyforeacherror=true", "reportlatencyforeacherror"},
        {"latencytrackederrors=NOT_FOUND", "latencytrackederrors"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *kv[] = {bad[i].kv, NULL};
        CHECK_MSG(conf_of(kv) == FK_EINVAL, "%s accepted", bad[i].kv);
        size_t n = strlen(bad[i].prop);
        CHECK_MSG(strncmp(err, bad[i].prop, n) == 0 && err[n] == ':', "%s: message '%s'", bad[i].kv,
                  err);
    }
    const char *range[] = {"recordcount=100", "insertstart=50", "insertcount=60", NULL};
    CHECK_ERR(conf_of(range), FK_EINVAL);
    CHECK(strncmp(err, "insertcount:", 12) == 0);
    const char *scan[] = {"minscanlength=10", "maxscanlength=5", NULL};
    CHECK_ERR(conf_of(scan), FK_EINVAL);
    CHECK(strncmp(err, "minscanlength:", 14) == 0);
    const char *zero[] = {"readproportion=0", "updateproportion=0", NULL};
    CHECK_ERR(conf_of(zero), FK_EINVAL);
    const char *zero_load[] = {"readproportion=0", "updateproportion=0", "dotransactions=false",
                               NULL};
    CHECK_OK(conf_of(zero_load)); /* the load phase does not choose operations */
}

TEST(key_names)
{
    char key[YCSB_KEY_MAX];
    CHECK_EQ_U64(ycsb_key_name(key, 0, 1, false), 23);
    CHECK_EQ_STR(key, "user6284781860667377211");
    ycsb_key_name(key, 1, 1, false);
    CHECK_EQ_STR(key, "user8517097267634966620");
    ycsb_key_name(key, 5, 1, true);
    CHECK_EQ_STR(key, "user5");
    ycsb_key_name(key, 5, 8, true); /* CoreWorkload's own example */
    CHECK_EQ_STR(key, "user00000005");
    ycsb_key_name(key, 123456789, 3, true); /* padding shorter than the number */
    CHECK_EQ_STR(key, "user123456789");
    ycsb_key_name(key, 0, 25, false);
    CHECK_EQ_STR(key, "user0000006284781860667377211");
    ycsb_key_name(key, -7, 4, true);
    CHECK_EQ_STR(key, "user00-7"); /* Java pads before the sign */
    unsigned n = ycsb_key_name(key, INT64_MIN, YCSB_ZEROPAD_MAX, true);
    CHECK_EQ_U64(n, 4 + YCSB_ZEROPAD_MAX);
    CHECK(strlen(key) < YCSB_KEY_MAX);
    char field[32];
    const char *none[] = {"fieldnameprefix=f", NULL};
    CHECK_OK(conf_of(none));
    CHECK_EQ_I64(ycsb_field_name(&conf, 12, field, sizeof field), 3);
    CHECK_EQ_STR(field, "f12");
    CHECK_ERR(ycsb_field_name(&conf, 12, field, 3), FK_ETOOBIG);
}

TEST(load_stream)
{
    const char *kv[] = {"recordcount=100", "insertstart=40", "insertcount=10",
                        "dotransactions=false", NULL};
    start(kv);
    char key[YCSB_KEY_MAX];
    for (int64_t i = 0; i < 10; i++) {
        CHECK_OK(ycsb_next_load(&th, &op));
        CHECK_EQ_I64(op.type, YCSB_OP_INSERT);
        CHECK_EQ_I64(op.keynum, 40 + i);
        ycsb_key_name(key, 40 + i, 1, false);
        CHECK_EQ_STR(op.key, key);
        CHECK_EQ_U64(op.key_len, strlen(key));
        CHECK_EQ_I64(op.nwrite, 10);
        CHECK_EQ_I64(op.write_first, 0);
        for (int f = 0; f < 10; f++)
            CHECK_EQ_U64(op.write_len[f], 100);
    }
    ycsb_workload_destroy(&w);
    const char *ordered[] = {"recordcount=100", "insertorder=ordered", "zeropadding=10",
                             "dotransactions=false", NULL};
    start(ordered);
    CHECK_OK(ycsb_next_load(&th, &op));
    CHECK_EQ_STR(op.key, "user0000000000");
    CHECK_OK(ycsb_next_load(&th, &op));
    CHECK_EQ_STR(op.key, "user0000000001");
    ycsb_workload_destroy(&w);
}

TEST(operation_proportions)
{
    const char *kv[] = {"recordcount=1000",
                        "operationcount=100000",
                        "readproportion=0.5",
                        "updateproportion=0.3",
                        "insertproportion=0.1",
                        "scanproportion=0.05",
                        "readmodifywriteproportion=0.05",
                        "maxscanlength=50",
                        NULL};
    start(kv);
    const long n = 100000;
    long count[YCSB_OP__COUNT] = {0};
    int64_t next_insert = 1000;
    for (long i = 0; i < n; i++) {
        CHECK_OK(ycsb_next_op(&th, &op));
        count[op.type]++;
        if (op.type == YCSB_OP_INSERT) {
            CHECK_EQ_I64(op.keynum, next_insert++); /* from recordcount upwards */
            CHECK_EQ_I64(op.nwrite, 10);
            CHECK_OK(ycsb_insert_done(&w, &op));
        } else {
            /* Only keys that exist: the loaded range plus acknowledged inserts. */
            CHECK(op.keynum >= 0 && op.keynum < next_insert);
        }
        if (op.type == YCSB_OP_SCAN)
            CHECK(op.scan_len >= 1 && op.scan_len <= 50);
        if (op.type == YCSB_OP_UPDATE || op.type == YCSB_OP_RMW)
            CHECK(op.nwrite == 1 && op.write_first >= 0 && op.write_first < 10);
        if (op.type == YCSB_OP_READ || op.type == YCSB_OP_SCAN || op.type == YCSB_OP_RMW)
            CHECK_EQ_I64(op.read_field, -1); /* readallfields=true */
    }
    CHECK_FREQ(count[YCSB_OP_READ], n, 0.5);
    CHECK_FREQ(count[YCSB_OP_UPDATE], n, 0.3);
    CHECK_FREQ(count[YCSB_OP_INSERT], n, 0.1);
    CHECK_FREQ(count[YCSB_OP_SCAN], n, 0.05);
    CHECK_FREQ(count[YCSB_OP_RMW], n, 0.05);
    CHECK_ERR(ycsb_insert_done(&w, &(struct ycsb_op){.type = YCSB_OP_READ}), FK_EINVAL);
    ycsb_workload_destroy(&w);
}

TEST(field_selection_and_lengths)
{
    const char *kv[] = {
        "recordcount=100",     "readproportion=0.5", "updateproportion=0.5",
        "readallfields=false", "fieldcount=4",       "fieldlengthdistribution=uniform",
        "minfieldlength=10",   "fieldlength=20",     NULL};
    start(kv);
    const long n = 40000;
    long reads = 0, field0 = 0;
    for (long i = 0; i < n; i++) {
        CHECK_OK(ycsb_next_op(&th, &op));
        if (op.type == YCSB_OP_READ) {
            CHECK(op.read_field >= 0 && op.read_field < 4);
            reads++;
            field0 += op.read_field == 0;
        } else {
            CHECK_EQ_I64(op.nwrite, 1);
            CHECK(op.write_len[0] >= 10 && op.write_len[0] <= 20);
        }
    }
    CHECK_FREQ(field0, reads, 0.25);
    ycsb_workload_destroy(&w);
    const char *all[] = {"recordcount=100",     "readproportion=0", "updateproportion=1",
                         "writeallfields=true", "fieldcount=3",     NULL};
    start(all);
    CHECK_OK(ycsb_next_op(&th, &op));
    CHECK_EQ_I64(op.type, YCSB_OP_UPDATE);
    CHECK_EQ_I64(op.nwrite, 3);
    CHECK_EQ_U64(op.write_len[2], 100);
    ycsb_workload_destroy(&w);
}

TEST(scan_lengths)
{
    const char *kv[] = {"recordcount=100",
                        "readproportion=0",
                        "updateproportion=0",
                        "scanproportion=1",
                        "maxscanlength=100",
                        "scanlengthdistribution=zipfian",
                        NULL};
    start(kv);
    long ones = 0;
    const long n = 20000;
    for (long i = 0; i < n; i++) {
        CHECK_OK(ycsb_next_op(&th, &op));
        CHECK_EQ_I64(op.type, YCSB_OP_SCAN);
        CHECK(op.scan_len >= 1 && op.scan_len <= 100);
        ones += op.scan_len == 1;
    }
    CHECK(ones > n / 10); /* zipfian favours short scans: about 19% are 1 */
    ycsb_workload_destroy(&w);
}

TEST(request_distributions_stay_in_range)
{
    static const char *dists[] = {"uniform", "zipfian",    "latest",
                                  "hotspot", "sequential", "exponential"};
    char d[64];
    for (size_t k = 0; k < sizeof dists / sizeof dists[0]; k++) {
        snprintf(d, sizeof d, "requestdistribution=%s", dists[k]);
        const char *kv[] = {"recordcount=1000", "insertstart=100", "insertcount=500", d, NULL};
        start(kv);
        for (int i = 0; i < 5000; i++) {
            CHECK_OK(ycsb_next_op(&th, &op));
            CHECK(op.keynum >= 0 && op.keynum < 1000);
            /* YCSB builds the scrambled zipfian over [insertstart, insertstart +
             * insertcount + expected inserts] inclusive, one key past the
             * range; the others stay within [insertstart, + insertcount). */
            int64_t hi = strcmp(dists[k], "zipfian") == 0 ? 601 : 600;
            if (strcmp(dists[k], "latest") != 0 && strcmp(dists[k], "exponential") != 0)
                CHECK_MSG(op.keynum >= 100 && op.keynum < hi, "%s: %lld", dists[k],
                          (long long)op.keynum);
        }
        ycsb_workload_destroy(&w);
    }
}

TEST(latest_reads_recent_inserts)
{
    const char *kv[] = {"recordcount=1000",
                        "operationcount=10000",
                        "readproportion=0.95",
                        "updateproportion=0",
                        "insertproportion=0.05",
                        "requestdistribution=latest",
                        NULL};
    start(kv);
    long reads = 0, recent = 0;
    for (int i = 0; i < 10000; i++) {
        CHECK_OK(ycsb_next_op(&th, &op));
        if (op.type == YCSB_OP_INSERT) {
            CHECK_OK(ycsb_insert_done(&w, &op));
            continue;
        }
        int64_t last = ycsb_ackctr_last(&w.inserts);
        CHECK(op.keynum <= last);
        reads++;
        recent += op.keynum > last - 10;
    }
    /* Ten newest keys of over a thousand get about half the reads. */
    CHECK_MSG((double)recent / reads > 0.35, "recent %ld of %ld", recent, reads);
    ycsb_workload_destroy(&w);
}

TEST(zipfian_key_retry_is_bounded)
{
    /* YCSB sizes the zipfian keyspace for 2 * operationcount * insertproportion
     * future inserts; with a huge operationcount almost every draw lies above
     * the inserted range, and YCSB would loop; we give up after
     * YCSB_KEY_RETRY_MAX draws with FK_EAGAIN. */
    const char *kv[] = {"recordcount=1000",
                        "operationcount=2000000000",
                        "readproportion=0.5",
                        "updateproportion=0",
                        "insertproportion=0.5",
                        "requestdistribution=zipfian",
                        NULL};
    start(kv);
    int again = 0;
    for (int i = 0; i < 200 && !again; i++) {
        int rc = ycsb_next_op(&th, &op);
        if (rc == FK_EAGAIN)
            again = 1;
        else
            CHECK_OK(rc);
        if (rc == 0 && op.type == YCSB_OP_INSERT)
            CHECK_OK(ycsb_insert_done(&w, &op));
    }
    CHECK(again);
    ycsb_workload_destroy(&w);
}

TEST(streams_are_reproducible_per_thread)
{
    const char *kv[] = {"recordcount=1000", "requestdistribution=zipfian", "flowkv.seed=77", NULL};
    start(kv);
    static struct ycsb_thread a, b, c;
    static struct ycsb_op oa, ob, oc;
    ycsb_thread_init(&a, &w, 3);
    ycsb_thread_init(&b, &w, 3);
    ycsb_thread_init(&c, &w, 4);
    int differ = 0;
    for (int i = 0; i < 100; i++) {
        CHECK_OK(ycsb_next_op(&a, &oa));
        CHECK_OK(ycsb_next_op(&b, &ob));
        CHECK_OK(ycsb_next_op(&c, &oc));
        CHECK_EQ_STR(oa.key, ob.key);
        CHECK_EQ_I64(oa.type, ob.type);
        differ += strcmp(oa.key, oc.key) != 0;
    }
    CHECK(differ > 50);
    ycsb_workload_destroy(&w);
}

/* Driver threads share one workload: 4 threads run workload D (5% inserts,
 * latest) at once; every key read exists, and every insert number is used
 * exactly once. */
#define WT     4
#define WT_OPS 20000

static long inserted[WT];

static void *workload_worker(void *arg)
{
    long tid = (long)arg;
    static struct ycsb_thread ts[WT];
    static struct ycsb_op ops[WT];
    struct ycsb_thread *t = &ts[tid];
    struct ycsb_op *o = &ops[tid];
    ycsb_thread_init(t, &w, (int32_t)tid);
    for (int i = 0; i < WT_OPS; i++) {
        if (ycsb_next_op(t, o) != 0)
            return (void *)1;
        if (o->type == YCSB_OP_INSERT) {
            inserted[tid]++;
            if (ycsb_insert_done(&w, o) != 0)
                return (void *)1;
        } else if (o->keynum < 0 || o->keynum > ycsb_ackctr_last(&w.inserts)) {
            return (void *)1;
        }
    }
    return NULL;
}

TEST(threads_share_a_workload)
{
    const char *kv[] = {"recordcount=1000",      "readproportion=0.95",        "updateproportion=0",
                        "insertproportion=0.05", "requestdistribution=latest", NULL};
    start(kv);
    pthread_t t[WT];
    for (long i = 0; i < WT; i++)
        CHECK_EQ_I64(pthread_create(&t[i], NULL, workload_worker, (void *)i), 0);
    long total = 0;
    for (int i = 0; i < WT; i++) {
        void *rv;
        CHECK_EQ_I64(pthread_join(t[i], &rv), 0);
        CHECK(rv == NULL);
        total += inserted[i];
    }
    CHECK_EQ_I64(ycsb_ackctr_next(&w.inserts), 1000 + total);
    CHECK(total > WT * WT_OPS / 40); /* about 5% */
    ycsb_workload_destroy(&w);
}

/* flowkv-ycsb --dry-run: the real program on a shipped workload file. */
static int run_prog(const char *args, char *out, size_t len)
{
    const char *build = getenv("BUILD");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/bin/flowkv-ycsb %s 2>/dev/null", build ? build : "build", args);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(program_dry_run)
{
    static char out[1 << 20];
    int rc =
        run_prog("load -P ycsb/workloads/workloada -p recordcount=3 --dry-run", out, sizeof out);
    CHECK_EQ_I64(rc, 0);
    const char *want = "0 INSERT user6284781860667377211 write=field0:100,field1:100,";
    CHECK_MSG(strncmp(out, want, strlen(want)) == 0, "output: %.200s", out);
    CHECK(strstr(out, "0 INSERT user1820151046732198393 ") != NULL);
    int lines = 0;
    for (char *s = out; *s; s++)
        lines += *s == '\n';
    CHECK_EQ_I64(lines, 3);
    rc = run_prog("run -P ycsb/workloads/workloadc -threads 2 --dry-run", out, sizeof out);
    CHECK_EQ_I64(rc, 0);
    lines = 0;
    int t1 = 0;
    for (char *s = out; *s; s++) {
        if (*s == '\n') {
            lines++;
            t1 += strncmp(s + 1, "1 READ user", 11) == 0;
        }
    }
    CHECK_EQ_I64(lines, 1000);
    CHECK_EQ_I64(t1, 500);
    CHECK_EQ_I64(
        run_prog("run -P ycsb/workloads/workloadc -p readproportion=x --dry-run", out, sizeof out),
        2);
    /* An unknown binding is a command-line error (2), found before any
     * connection is tried. */
    CHECK_EQ_I64(run_prog("run -P ycsb/workloads/workloadc -db nosuch", out, sizeof out), 2);
}

CHECK_MAIN()
