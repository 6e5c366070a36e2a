/*
 * Unit tests for ycsb/ycsb_run: the runner against test bindings.
 *
 * The bindings here exist only in this test: "mem" keeps records in a shared
 * in-memory table (a real store for the runner's purposes: reads of missing
 * keys are NOT_FOUND), and can complete requests late (after a number of
 * polls, to fill a pipeline), stall once, or fail inserts. Timing checks are
 * lower bounds that follow from the schedule (an operation cannot finish
 * before it is intended to start), never upper bounds on speed.
 */
#include "check.h"
#include "fk_error.h"
#include "fk_time.h"
#include "ycsb_run.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the test binding ------------------------------------------------------ */

#define TABLE_SIZE 16384
#define QUEUE_MAX  1024

static struct {
    pthread_mutex_t lock;
    char keys[TABLE_SIZE][YCSB_KEY_MAX];
    int used[TABLE_SIZE];
    long n;
} table = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Behaviour knobs, set by each test before ycsb_run. */
static struct {
    int delay_polls; /* complete a request only after this many polls */
    long stall_at;   /* the stall_at-th request (global) sleeps stall_ns */
    int64_t stall_ns;
    int64_t op_ns;     /* every request sleeps this long */
    int fail_inserts;  /* first attempt of each insert fails, SERVICE_UNAVAILABLE */
    int fail_open_tid; /* open fails for this thread (-1: none) */
    int bad_cookie;    /* poll returns a cookie never submitted */
} knob;

static _Atomic long requests, max_inflight, fails_left_total;
/* The most updates of one key a context had in flight at once. */
static _Atomic long max_key_updates;

struct ctx {
    struct ycsb_done q[QUEUE_MAX];
    int age[QUEUE_MAX];
    char upd[QUEUE_MAX][YCSB_KEY_MAX]; /* the key of an update, "" otherwise */
    int n;
    int32_t tid;
};

static void reset_table(void)
{
    memset(table.used, 0, sizeof table.used);
    table.n = 0;
    memset(&knob, 0, sizeof knob);
    knob.fail_open_tid = -1;
    requests = max_inflight = max_key_updates = 0;
}

static unsigned hash(const char *k)
{
    unsigned h = 2166136261u;
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 16777619u;
    return h % TABLE_SIZE;
}

/* Finds key (insert = add when missing). Returns 1 when present/added. */
static int lookup(const char *key, int insert)
{
    pthread_mutex_lock(&table.lock);
    unsigned i = hash(key);
    int found = 0;
    for (int probe = 0; probe < TABLE_SIZE; probe++, i = (i + 1) % TABLE_SIZE) {
        if (!table.used[i]) {
            if (insert) {
                table.used[i] = 1;
                snprintf(table.keys[i], YCSB_KEY_MAX, "%s", key);
                table.n++;
                found = 1;
            }
            break;
        }
        if (strcmp(table.keys[i], key) == 0) {
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&table.lock);
    return found;
}

static int mem_open(void **ctx, const struct ycsb_props *props, int32_t tid, char *err,
                    size_t errlen)
{
    (void)props;
    if (tid == knob.fail_open_tid) {
        snprintf(err, errlen, "cannot reach the store");
        return FK_EUNREACHABLE;
    }
    struct ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    c->tid = tid;
    *ctx = c;
    return 0;
}

static void mem_close(void *ctx)
{
    free(ctx);
}

static int execute(const struct ycsb_req *req)
{
    long n = atomic_fetch_add(&requests, 1) + 1;
    if (n == knob.stall_at)
        fk_sleep_ns((uint64_t)knob.stall_ns);
    if (knob.op_ns > 0)
        fk_sleep_ns((uint64_t)knob.op_ns);
    switch (req->kind) {
    case YCSB_REQ_INSERT:
        for (int32_t i = 0; i < req->nfields; i++)
            for (uint32_t k = 0; k < req->fields[i].len; k++)
                if (req->fields[i].value[k] < 0x20 || req->fields[i].value[k] > 0x7f)
                    return FK_EINVAL;
        if (knob.fail_inserts && atomic_fetch_sub(&fails_left_total, 1) > 0)
            return FK_EUNREACHABLE;
        lookup(req->key, 1);
        return 0;
    case YCSB_REQ_READ:
    case YCSB_REQ_UPDATE:
        return lookup(req->key, 0) ? 0 : FK_ENOTFOUND;
    case YCSB_REQ_SCAN:
        return req->scan_len >= 1 ? 0 : FK_EINVAL;
    }
    return FK_EINVAL;
}

static int mem_submit(void *ctx, const struct ycsb_req *req)
{
    struct ctx *c = ctx;
    if (c->n == QUEUE_MAX)
        return FK_EFULL;
    c->q[c->n] = (struct ycsb_done){.cookie = req->cookie, .rc = execute(req)};
    c->age[c->n] = 0;
    snprintf(c->upd[c->n], YCSB_KEY_MAX, "%s", req->kind == YCSB_REQ_UPDATE ? req->key : "");
    long same = 0;
    for (int i = 0; i <= c->n && c->upd[c->n][0]; i++)
        same += strcmp(c->upd[i], c->upd[c->n]) == 0;
    long m0 = atomic_load(&max_key_updates);
    while (same > m0 && !atomic_compare_exchange_weak(&max_key_updates, &m0, same))
        ;
    c->n++;
    long m = atomic_load(&max_inflight);
    while (c->n > m && !atomic_compare_exchange_weak(&max_inflight, &m, c->n))
        ;
    return 0;
}

static int mem_poll(void *ctx, struct ycsb_done *done, int max, int64_t timeout_ns)
{
    struct ctx *c = ctx;
    (void)timeout_ns;
    if (knob.bad_cookie && c->n > 0) {
        done[0] = (struct ycsb_done){.cookie = 999999, .rc = 0};
        return 1;
    }
    int out = 0, keep = 0;
    for (int i = 0; i < c->n; i++) {
        if (out < max && c->age[i] >= knob.delay_polls) {
            done[out++] = c->q[i];
        } else {
            c->age[keep] = c->age[i] + 1;
            memcpy(c->upd[keep], c->upd[i], YCSB_KEY_MAX);
            c->q[keep++] = c->q[i];
        }
    }
    c->n = keep;
    return out;
}

static const struct ycsb_binding mem = {
    .name = "mem", .open = mem_open, .close = mem_close, .submit = mem_submit, .poll = mem_poll};

/* ---- helpers ----------------------------------------------------------------- */

static struct ycsb_props props;
static struct ycsb_conf conf;
static char err[YCSB_ERR_MAX];

static int run(const char *const *kv, FILE *status, struct ycsb_run_result *res)
{
    ycsb_props_free(&props);
    for (; *kv != NULL; kv++)
        CHECK_OK(ycsb_props_set_arg(&props, *kv, err, sizeof err));
    CHECK_MSG(ycsb_conf_parse(&conf, &props, err, sizeof err) == 0, "%s", err);
    err[0] = '\0';
    return ycsb_run(&conf, &props, &mem, status, res, err, sizeof err);
}

static uint64_t ops(const struct ycsb_run_result *res, enum ycsb_mop m, int failed)
{
    return res->meas->hist[YCSB_SERIES_OP][m][failed].count;
}

/* Values recorded at or above ns in a histogram. */
static uint64_t count_above(const struct fk_hist *h, uint64_t ns)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < FK_HIST_BUCKETS; i++) {
        uint64_t lo, width;
        fk_hist_bucket_range(i, &lo, &width);
        if (lo >= ns)
            n += h->buckets[i];
    }
    return n;
}

static void load(long records, int threads)
{
    char rc_[64], th[64];
    snprintf(rc_, sizeof rc_, "recordcount=%ld", records);
    snprintf(th, sizeof th, "threadcount=%d", threads);
    const char *kv[] = {rc_, th, "dotransactions=false", "measurement.interval=op", NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "load: %s", err);
    CHECK_EQ_U64(res.opsdone, (uint64_t)records);
    CHECK_EQ_U64(ops(&res, YCSB_M_INSERT, 0), (uint64_t)records);
    CHECK_EQ_I64(table.n, records);
    ycsb_meas_destroy(res.meas);
}

/* ---- tests --------------------------------------------------------------------- */

TEST(load_then_run_report)
{
    reset_table();
    load(300, 3);
    const char *kv[] = {"recordcount=300",
                        "operationcount=2000",
                        "readproportion=0.5",
                        "updateproportion=0.5",
                        "requestdistribution=zipfian",
                        "threadcount=2",
                        "measurement.interval=op",
                        NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 2000);
    CHECK_EQ_U64(ops(&res, YCSB_M_READ, 0) + ops(&res, YCSB_M_UPDATE, 0), 2000);
    CHECK_EQ_U64(ops(&res, YCSB_M_READ, 1) + ops(&res, YCSB_M_UPDATE, 1), 0);
    CHECK_EQ_U64(res.meas->status[YCSB_M_READ][YCSB_ST_OK], ops(&res, YCSB_M_READ, 0));
    /* The report names both operations and nothing failed. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK_OK(ycsb_run_report(f, &conf, &res));
    fclose(f);
    CHECK(strncmp(text, "[OVERALL], RunTime(ms), ", 24) == 0);
    CHECK(strstr(text, "[READ], Operations, ") != NULL);
    CHECK(strstr(text, "[UPDATE], Return=OK, ") != NULL);
    CHECK(strstr(text, "[READ], 50thPercentileLatency(us), ") != NULL);
    CHECK(strstr(text, "FAILED") == NULL);
    free(text);
    ycsb_meas_destroy(res.meas);
}

TEST(reads_of_missing_keys_fail)
{
    reset_table(); /* nothing loaded */
    const char *kv[] = {"recordcount=100", "operationcount=50", "measurement.interval=op", NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 50);
    CHECK_EQ_U64(ops(&res, YCSB_M_READ, 0) + ops(&res, YCSB_M_UPDATE, 0), 0);
    CHECK_EQ_U64(res.meas->status[YCSB_M_READ][YCSB_ST_NOT_FOUND] +
                     res.meas->status[YCSB_M_UPDATE][YCSB_ST_NOT_FOUND],
                 50);
    ycsb_meas_destroy(res.meas);
}

TEST(pipeline_fills_and_bounds)
{
    reset_table();
    load(100, 1);
    knob.delay_polls = 3; /* requests complete late: the pipeline fills up */
    const char *kv[] = {"recordcount=100", "operationcount=500", "flowkv.pipeline=8",
                        "measurement.interval=op", NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 500);
    CHECK_EQ_I64(max_inflight, 8);
    CHECK_EQ_U64(res.meas->status[YCSB_M_READ][YCSB_ST_OK] +
                     res.meas->status[YCSB_M_UPDATE][YCSB_ST_OK],
                 500);
    ycsb_meas_destroy(res.meas);
}

TEST(read_modify_write_measured_three_ways)
{
    reset_table();
    load(100, 1);
    knob.delay_polls = 1;
    const char *kv[] = {"recordcount=100",
                        "operationcount=400",
                        "readproportion=0.5",
                        "updateproportion=0",
                        "readmodifywriteproportion=0.5",
                        "flowkv.pipeline=4",
                        "measurement.interval=op",
                        NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    uint64_t rmw = ops(&res, YCSB_M_RMW, 0);
    CHECK(rmw > 100 && rmw < 300);
    CHECK_EQ_U64(ops(&res, YCSB_M_UPDATE, 0), rmw); /* the write of each RMW */
    CHECK_EQ_U64(ops(&res, YCSB_M_READ, 0), 400);   /* reads + RMW reads */
    CHECK_EQ_U64(requests, 400 + rmw + 100);        /* + the load */
    /* An RMW spans its read and its update. */
    CHECK(res.meas->hist[0][YCSB_M_RMW][0].max >= res.meas->hist[0][YCSB_M_UPDATE][0].min);
    ycsb_meas_destroy(res.meas);
}

/* A pipeline stands for many clients, but one key's updates go one at a
 * time (ycsb_run.c, submit): bindings update fields by compare-and-swap,
 * and updates of a hot key in flight together made them fail. The others
 * wait in the runner, not in the binding, and every one completes. */
TEST(updates_of_one_key_one_at_a_time)
{
    reset_table();
    load(4, 1);
    knob.delay_polls = 2;
    const char *kv[] = {
        "recordcount=4",        "operationcount=3000",           "readproportion=0.3",
        "updateproportion=0.4", "readmodifywriteproportion=0.3", "requestdistribution=zipfian",
        "flowkv.pipeline=32",   "measurement.interval=op",       NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 3000);
    CHECK_EQ_I64(max_key_updates, 1);
    CHECK(max_inflight > 4); /* reads of those keys still go together */
    uint64_t rmw = ops(&res, YCSB_M_RMW, 0);
    CHECK(rmw > 600 && rmw < 1200);
    CHECK_EQ_U64(ops(&res, YCSB_M_READ, 1) + ops(&res, YCSB_M_UPDATE, 1), 0);
    CHECK_EQ_U64(requests, 3000 + rmw + 4); /* each RMW's update, the load */
    ycsb_meas_destroy(res.meas);
}

TEST(run_inserts_are_acknowledged)
{
    reset_table();
    load(200, 2);
    const char *kv[] = {"recordcount=200",         "operationcount=4000",
                        "readproportion=0.9",      "updateproportion=0",
                        "insertproportion=0.1",    "requestdistribution=latest",
                        "threadcount=2",           "flowkv.pipeline=4",
                        "measurement.interval=op", NULL};
    knob.delay_polls = 1;
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    /* Every read is of a key whose insert completed: none is missing. */
    CHECK_EQ_U64(res.meas->status[YCSB_M_READ][YCSB_ST_NOT_FOUND], 0);
    uint64_t inserts = ops(&res, YCSB_M_INSERT, 0);
    CHECK(inserts > 200);
    CHECK_EQ_I64(table.n, 200 + (long)inserts);
    ycsb_meas_destroy(res.meas);
}

TEST(load_insert_retries)
{
    /* One failed attempt: the retry stores the record. */
    reset_table();
    knob.fail_inserts = 1;
    fails_left_total = 1;
    const char *kv[] = {"recordcount=100",
                        "dotransactions=false",
                        "core_workload_insertion_retry_limit=2",
                        "core_workload_insertion_retry_interval=0",
                        "measurement.interval=op",
                        NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 100);
    CHECK_EQ_I64(table.n, 100);
    CHECK_EQ_U64(res.meas->status[YCSB_M_INSERT][YCSB_ST_OK], 100);
    CHECK_EQ_U64(res.meas->status[YCSB_M_INSERT][YCSB_ST_SERVICE_UNAVAILABLE], 1);
    ycsb_meas_destroy(res.meas);
    /* 30 failures in a row: the first 10 records fail 3 times each (one try
     * and 2 retries) and are given up, as YCSB does; the run goes on. */
    reset_table();
    knob.fail_inserts = 1;
    fails_left_total = 30;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 100);
    CHECK_EQ_I64(table.n, 90);
    CHECK_EQ_U64(res.meas->status[YCSB_M_INSERT][YCSB_ST_OK], 90);
    CHECK_EQ_U64(res.meas->status[YCSB_M_INSERT][YCSB_ST_SERVICE_UNAVAILABLE], 30);
    CHECK_EQ_U64(ops(&res, YCSB_M_INSERT, 1), 30); /* INSERT-FAILED */
    ycsb_meas_destroy(res.meas);
}

TEST(target_paces_operations)
{
    reset_table();
    load(50, 1);
    const char *kv[] = {"recordcount=50", "operationcount=200", "target=2000",
                        "measurement.interval=op", NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    CHECK_EQ_U64(res.opsdone, 200);
    /* Operation 199 is intended 199 * 0.5 ms after the start. */
    CHECK_MSG(res.runtime_ms >= 99, "runtime %lld ms", (long long)res.runtime_ms);
    ycsb_meas_destroy(res.meas);
}

TEST(coordinated_omission_counts_queueing)
{
    reset_table();
    load(50, 1);
    long base = requests;
    knob.stall_at = base + 20; /* the 20th request of the run stalls 50 ms */
    knob.stall_ns = 50 * (int64_t)FK_NSEC_PER_MSEC;
    const char *kv[] = {"recordcount=50", "operationcount=100", "target=1000",
                        "measurement.interval=both", NULL};
    struct ycsb_run_result res;
    CHECK_MSG(run(kv, NULL, &res) == 0, "%s", err);
    /* 1 ms apart, the operations intended during the stall (about 49) wait
     * behind it; measured from their intended start, the 40 intended in its
     * first 40 ms each take at least 10 ms. Measured from their actual start
     * only the stalled one does. */
    uint64_t slow_intended = 0, slow_op = 0;
    for (int k = 0; k < YCSB_M__COUNT; k++) {
        slow_intended += count_above(&res.meas->hist[YCSB_SERIES_INTENDED][k][0], 10000000);
        slow_op += count_above(&res.meas->hist[YCSB_SERIES_OP][k][0], 10000000);
    }
    CHECK_MSG(slow_intended >= 40, "slow intended %llu", (unsigned long long)slow_intended);
    CHECK(slow_op >= 1);
    CHECK(slow_intended > slow_op + 30);
    ycsb_meas_destroy(res.meas);
}

TEST(status_lines_and_maxexecutiontime)
{
    reset_table();
    load(50, 1);
    knob.op_ns = 1000000; /* 1 ms per request */
    const char *kv[] = {
        "recordcount=50",    "operationcount=0", "maxexecutiontime=2", "status=true",
        "status.interval=1", "label=T ",         "threadcount=2",      NULL};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    struct ycsb_run_result res;
    int rc = run(kv, f, &res);
    fclose(f);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(res.runtime_ms >= 2000);
    CHECK(res.opsdone > 0);
    int lines = 0, first_ok = 0;
    for (char *s = text; s != NULL && *s; s = strchr(s, '\n') ? strchr(s, '\n') + 1 : NULL) {
        lines++;
        CHECK(strncmp(s, "T 20", 4) == 0); /* label, then the year */
        if (lines == 1)
            first_ok = strstr(s, " 0 sec: ") != NULL; /* printed as the threads start */
        else
            CHECK(strstr(s, " current ops/sec; ") != NULL);
    }
    CHECK(first_ok);
    CHECK_MSG(lines >= 3, "%d status lines:\n%s", lines, text); /* start, 1 s, 2 s / end */
    CHECK(strstr(text, "[READ: Count=") != NULL);
    free(text);
    ycsb_meas_destroy(res.meas);
}

TEST(binding_errors)
{
    reset_table();
    knob.fail_open_tid = 1;
    const char *kv[] = {"recordcount=10", "operationcount=10", "threadcount=2", NULL};
    struct ycsb_run_result res;
    CHECK_ERR(run(kv, NULL, &res), FK_EUNREACHABLE);
    CHECK_MSG(strstr(err, "thread 1: cannot reach the store") != NULL, "%s", err);
    reset_table();
    knob.bad_cookie = 1;
    knob.delay_polls = 1;
    CHECK_ERR(run(kv, NULL, &res), FK_EPROTO);
    CHECK(strstr(err, "unknown request") != NULL);
    reset_table();
    const char *big[] = {"recordcount=10", "fieldcount=256", "fieldlength=1048576",
                         "flowkv.pipeline=2", NULL};
    CHECK_ERR(run(big, NULL, &res), FK_EINVAL);
    CHECK(strncmp(err, "flowkv.pipeline:", 16) == 0);
}

CHECK_MAIN()
