/* ycsb_run.c: runner threads, pipeline slots, status and termination; see
 * ycsb_run.h. */
#include "ycsb_run.h"

#include "fk_error.h"
#include "fk_time.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POLL_MAX_NS    (100 * (int64_t)FK_NSEC_PER_MSEC) /* re-check stop this often */
#define DRAIN_MAX_NS   (30 * (int64_t)FK_NSEC_PER_SEC)   /* in-flight wait after stop */
#define FIELD_NAME_MAX (YCSB_NAME_MAX + 24)

enum slot_stage { SLOT_FREE, SLOT_FIRST, SLOT_RMW_UPDATE };

struct slot {
    struct ycsb_op op;
    struct ycsb_req req;
    struct ycsb_field *fields; /* fieldcount entries */
    uint8_t *values;           /* fieldcount * fieldlength bytes */
    enum slot_stage stage;
    int64_t intended, start, first_start;
    int32_t retries;
    /* Updates of one key, one at a time (submit): updating, this slot's
     * update is with the binding; waiter, the next slot whose update of
     * the same key waits for it (-1: none). */
    int updating;
    int32_t waiter;
};

struct runner;

struct worker {
    struct runner *r;
    int32_t tid;
    pthread_t thread;
    void *ctx;
    struct ycsb_thread wt;
    struct ycsb_pace pace;
    struct slot *slots;
    int32_t *free_list; /* stack of free slot indexes */
    int32_t nfree, inflight;
    struct ycsb_done *done;
    int64_t todo;   /* operations to do; 0: no limit */
    int64_t issued; /* operations started */
    _Atomic uint64_t opsdone;
    struct ycsb_meas *meas;     /* the thread's own, read after it stops */
    struct ycsb_meas *interval; /* for status lines, under lock */
    pthread_mutex_t lock;
    int rc;
    char err[YCSB_ERR_MAX];
};

struct runner {
    const struct ycsb_conf *conf;
    const struct ycsb_props *props;
    const struct ycsb_binding *b;
    struct ycsb_workload w;
    char (*field_names)[FIELD_NAME_MAX];
    struct worker *workers;
    int32_t nthreads;
    _Atomic int stop;
    pthread_mutex_t lock; /* guards running */
    pthread_cond_t cond;
    int32_t running;
};

__attribute__((format(printf, 3, 4))) static int fail(struct worker *w, int rc, const char *fmt,
                                                      ...)
{
    if (w->rc == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
        w->rc = rc;
    }
    atomic_store(&w->r->stop, 1);
    return rc;
}

static int64_t now_ns(void)
{
    return (int64_t)fk_now_ns();
}

/* ---- requests -------------------------------------------------------------- */

static void fill_fields(struct worker *w, struct slot *s)
{
    const struct ycsb_conf *c = w->r->conf;
    for (int32_t i = 0; i < s->op.nwrite; i++) {
        uint8_t *v = s->values + (size_t)i * (size_t)c->fieldlength;
        assert(s->op.write_len[i] <= (uint32_t)c->fieldlength);
        ycsb_value_fill(&w->wt.rng, v, s->op.write_len[i]);
        s->fields[i] = (struct ycsb_field){
            .name = w->r->field_names[s->op.write_first + i],
            .value = v,
            .len = s->op.write_len[i],
        };
    }
}

static void set_req(struct worker *w, struct slot *s, enum ycsb_req_kind kind)
{
    struct ycsb_req *q = &s->req;
    q->cookie = (uint64_t)(s - w->slots);
    q->kind = kind;
    q->table = w->r->conf->table;
    q->key = s->op.key;
    q->key_len = s->op.key_len;
    q->read_field = s->op.read_field < 0 ? NULL : w->r->field_names[s->op.read_field];
    q->scan_len = s->op.scan_len;
    int writes = kind == YCSB_REQ_UPDATE || kind == YCSB_REQ_INSERT;
    q->nfields = writes ? s->op.nwrite : 0;
    q->fields = writes ? s->fields : NULL;
}

static void complete(struct worker *w, struct slot *s, int rc);

static void hand_to_binding(struct worker *w, struct slot *s)
{
    s->updating = s->req.kind == YCSB_REQ_UPDATE;
    int rc = w->r->b->submit(w->ctx, &s->req);
    if (rc < 0) {
        complete(w, s, rc); /* failed at once: a completed request */
        return;
    }
    w->inflight++;
}

/* The slot whose update of s's key is with the binding, if any. */
static struct slot *updating(struct worker *w, const struct slot *s)
{
    for (int32_t i = 0; i < w->r->conf->pipeline; i++) {
        struct slot *o = &w->slots[i];
        if (o->updating && o->op.keynum == s->op.keynum)
            return o;
    }
    return NULL;
}

/* A worker's pipeline stands for that many YCSB client threads, each with
 * one request at a time, but one key's updates go one at a time: a
 * binding updates some fields of a record by reading it and writing it
 * back if unchanged (compare-and-swap, as flowkv and etcd must, neither
 * storing fields), so two updates of one record in flight together race,
 * and on a workload's hottest keys one of them lost every retry: with 128
 * in flight, 3,364 of 1.1 million updates of workload A failed
 * (2026-11-27, a million default records). YCSB's own bindings write
 * fields blindly and never fail so. An update waits for the one before it
 * on its key (the wait counts in its latency), and goes to the binding
 * when that one completes (release_waiter). */
static void submit(struct worker *w, struct slot *s)
{
    s->start = now_ns();
    s->waiter = -1;
    struct slot *o = s->req.kind == YCSB_REQ_UPDATE ? updating(w, s) : NULL;
    if (o == NULL) {
        hand_to_binding(w, s);
        return;
    }
    while (o->waiter >= 0)
        o = &w->slots[o->waiter];
    o->waiter = (int32_t)(s - w->slots);
}

/* An update completed: the next one of its key goes to the binding. */
static void release_waiter(struct worker *w, struct slot *s)
{
    if (!s->updating)
        return;
    s->updating = 0;
    int32_t next = s->waiter;
    s->waiter = -1;
    if (next >= 0)
        hand_to_binding(w, &w->slots[next]);
}

static int issue(struct worker *w, int64_t intended)
{
    assert(w->nfree > 0);
    struct slot *s = &w->slots[w->free_list[--w->nfree]];
    int rc =
        w->r->conf->dotransactions ? ycsb_next_op(&w->wt, &s->op) : ycsb_next_load(&w->wt, &s->op);
    if (rc < 0) {
        w->free_list[w->nfree++] = (int32_t)(s - w->slots);
        return fail(w, rc, "no key to operate on: %s", fk_strerror(rc));
    }
    static const enum ycsb_req_kind first[YCSB_OP__COUNT] = {
        [YCSB_OP_READ] = YCSB_REQ_READ,     [YCSB_OP_UPDATE] = YCSB_REQ_UPDATE,
        [YCSB_OP_INSERT] = YCSB_REQ_INSERT, [YCSB_OP_SCAN] = YCSB_REQ_SCAN,
        [YCSB_OP_RMW] = YCSB_REQ_READ,
    };
    fill_fields(w, s);
    set_req(w, s, first[s->op.type]);
    s->stage = SLOT_FIRST;
    s->intended = intended;
    s->retries = 0;
    w->issued++;
    submit(w, s);
    return 0;
}

/* ---- completions ----------------------------------------------------------- */

static void record(struct worker *w, enum ycsb_mop op, enum ycsb_status st, int64_t intended,
                   int64_t start, int64_t end)
{
    ycsb_meas_record(w->meas, op, st, intended, start, end);
    if (w->interval != NULL) {
        pthread_mutex_lock(&w->lock);
        ycsb_meas_record(w->interval, op, st, intended, start, end);
        pthread_mutex_unlock(&w->lock);
    }
}

static void finish(struct worker *w, struct slot *s)
{
    s->stage = SLOT_FREE;
    w->free_list[w->nfree++] = (int32_t)(s - w->slots);
    atomic_store_explicit(&w->opsdone, atomic_load_explicit(&w->opsdone, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* A failed load insert is retried after interval * [0.8, 1.2) seconds, as
 * CoreWorkload.doInsert; returns 1 when it was resubmitted. */
static int retry_insert(struct worker *w, struct slot *s, int rc)
{
    const struct ycsb_conf *c = w->r->conf;
    if (rc >= 0 || c->dotransactions || s->retries >= c->insertion_retry_limit ||
        atomic_load(&w->r->stop))
        return 0;
    s->retries++;
    double secs = c->insertion_retry_interval * (0.8 + 0.4 * ycsb_rng_double(&w->wt.rng));
    fk_sleep_ns((uint64_t)(secs * 1e9));
    submit(w, s);
    return 1;
}

static void complete(struct worker *w, struct slot *s, int rc)
{
    int64_t end = now_ns();
    release_waiter(w, s);
    enum ycsb_status st = ycsb_status_from_err(rc);
    switch (s->op.type) {
    case YCSB_OP_READ:
    case YCSB_OP_UPDATE:
    case YCSB_OP_SCAN: {
        static const enum ycsb_mop m[] = {[YCSB_OP_READ] = YCSB_M_READ,
                                          [YCSB_OP_UPDATE] = YCSB_M_UPDATE,
                                          [YCSB_OP_SCAN] = YCSB_M_SCAN};
        record(w, m[s->op.type], st, s->intended, s->start, end);
        break;
    }
    case YCSB_OP_INSERT:
        record(w, YCSB_M_INSERT, st, s->intended, s->start, end);
        if (retry_insert(w, s, rc))
            return;
        if (w->r->conf->dotransactions) {
            int arc = ycsb_insert_done(&w->r->w, &s->op);
            if (arc < 0)
                fail(w, arc, "Too many unacknowledged insertion keys");
        }
        break;
    case YCSB_OP_RMW:
        if (s->stage == SLOT_FIRST) {
            record(w, YCSB_M_READ, st, s->intended, s->start, end);
            if (st == YCSB_ST_OK || st == YCSB_ST_BATCHED_OK) {
                s->first_start = s->start;
                s->stage = SLOT_RMW_UPDATE;
                set_req(w, s, YCSB_REQ_UPDATE);
                submit(w, s);
                return;
            }
            s->first_start = s->start;
        } else {
            record(w, YCSB_M_UPDATE, st, s->intended, s->start, end);
        }
        record(w, YCSB_M_RMW, st, s->intended, s->first_start, end);
        break;
    default:
        assert(0 && "operation type");
    }
    finish(w, s);
}

/* ---- the thread loop -------------------------------------------------------- */

static int more_to_issue(const struct worker *w)
{
    return !atomic_load_explicit(&w->r->stop, memory_order_relaxed) &&
           (w->todo == 0 || w->issued < w->todo);
}

/* Takes the completions of one poll. */
static int reap(struct worker *w, int64_t timeout)
{
    int32_t depth = w->r->conf->pipeline;
    int n = w->r->b->poll(w->ctx, w->done, depth, timeout);
    if (n < 0)
        return fail(w, n, "binding %s: poll: %s", w->r->b->name, fk_strerror(n));
    if (n > depth)
        return fail(w, FK_EPROTO, "binding %s returned %d completions", w->r->b->name, n);
    for (int i = 0; i < n; i++) {
        uint64_t c = w->done[i].cookie;
        if (c >= (uint64_t)depth || w->slots[c].stage == SLOT_FREE)
            return fail(w, FK_EPROTO, "binding %s completed an unknown request", w->r->b->name);
        w->inflight--;
        complete(w, &w->slots[c], w->done[i].rc);
    }
    return 0;
}

static int worker_loop(struct worker *w)
{
    int64_t drain_deadline = 0;
    for (;;) {
        int64_t now = now_ns(), next = now;
        while (w->nfree > 0 && more_to_issue(w) && w->rc == 0) {
            next = ycsb_pace_intended(&w->pace, (uint64_t)w->issued, now);
            if (next > now)
                break;
            issue(w, next);
            now = now_ns();
        }
        /* After an error nothing more is issued (w->rc != 0 stops the loop
         * above, and fail() set stop) but what is in flight drains. */
        int issuing = w->nfree > 0 && more_to_issue(w);
        if (w->inflight == 0 && !issuing)
            return 0;
        int64_t timeout = POLL_MAX_NS;
        if (issuing && next - now < timeout)
            timeout = next > now ? next - now : 0;
        if (w->inflight == 0) {
            fk_sleep_ns((uint64_t)timeout); /* open loop: wait for the next start */
            continue;
        }
        if (!more_to_issue(w)) {
            if (drain_deadline == 0)
                drain_deadline = now + DRAIN_MAX_NS;
            else if (now > drain_deadline)
                return fail(w, FK_ETIMEDOUT, "%d requests still in flight after stop",
                            (int)w->inflight);
        }
        if (reap(w, timeout) < 0)
            return w->rc;
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct runner *r = w->r;
    int rc = r->b->open(&w->ctx, r->props, w->tid, w->err, sizeof w->err);
    if (rc < 0) {
        w->rc = rc;
        atomic_store(&r->stop, 1);
    } else {
        /* Client divides target by threadcount before it lowers threadcount
         * to the operation count, so the per-thread rate uses the former. */
        ycsb_pace_init(&w->pace, r->conf->target, r->conf->threadcount, 0);
        fk_sleep_ns((uint64_t)ycsb_pace_initial_delay(&w->pace, &w->wt.rng));
        w->pace.start_ns = now_ns();
        worker_loop(w);
        r->b->close(w->ctx);
    }
    pthread_mutex_lock(&r->lock);
    r->running--;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* ---- setup ------------------------------------------------------------------- */

static int worker_setup(struct runner *r, struct worker *w, int32_t tid, int64_t total)
{
    const struct ycsb_conf *c = r->conf;
    int32_t depth = c->pipeline;
    size_t record = (size_t)c->fieldcount * (size_t)c->fieldlength;
    w->r = r;
    w->tid = tid;
    w->todo = ycsb_thread_ops(total, r->nthreads, tid);
    atomic_init(&w->opsdone, 0);
    pthread_mutex_init(&w->lock, NULL);
    ycsb_thread_init(&w->wt, &r->w, tid);
    w->meas = ycsb_meas_create(c->interval);
    w->interval = c->status ? ycsb_meas_create(c->interval) : NULL;
    w->slots = calloc((size_t)depth, sizeof *w->slots);
    w->free_list = calloc((size_t)depth, sizeof *w->free_list);
    w->done = calloc((size_t)depth, sizeof *w->done);
    if (w->meas == NULL || (c->status && w->interval == NULL) || w->slots == NULL ||
        w->free_list == NULL || w->done == NULL)
        return -ENOMEM;
    for (int32_t i = 0; i < depth; i++) {
        struct slot *s = &w->slots[i];
        s->fields = calloc((size_t)c->fieldcount, sizeof *s->fields);
        s->values = malloc(record > 0 ? record : 1);
        if (s->fields == NULL || s->values == NULL)
            return -ENOMEM;
        w->free_list[w->nfree++] = depth - 1 - i;
    }
    return 0;
}

static void worker_free(struct worker *w)
{
    for (int32_t i = 0; w->slots != NULL && i < w->r->conf->pipeline; i++) {
        free(w->slots[i].fields);
        free(w->slots[i].values);
    }
    free(w->slots);
    free(w->free_list);
    free(w->done);
    ycsb_meas_destroy(w->meas);
    ycsb_meas_destroy(w->interval);
    pthread_mutex_destroy(&w->lock);
}

static int runner_setup(struct runner *r, char *err, size_t errlen)
{
    const struct ycsb_conf *c = r->conf;
    uint64_t bytes = (uint64_t)c->pipeline * (uint64_t)c->fieldcount * (uint64_t)c->fieldlength;
    if (bytes > YCSB_RUN_THREAD_BYTES) {
        snprintf(err, errlen,
                 "flowkv.pipeline: %d records of fieldcount * fieldlength bytes exceed %u "
                 "bytes per thread",
                 c->pipeline, YCSB_RUN_THREAD_BYTES);
        return FK_EINVAL;
    }
    int rc = ycsb_workload_init(&r->w, c, err, errlen);
    if (rc < 0)
        return rc;
    r->field_names = calloc((size_t)c->fieldcount, sizeof *r->field_names);
    r->workers = calloc((size_t)r->nthreads, sizeof *r->workers);
    if (r->field_names == NULL || r->workers == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int64_t i = 0; i < c->fieldcount; i++)
        if (ycsb_field_name(c, i, r->field_names[i], FIELD_NAME_MAX) < 0)
            return FK_ETOOBIG; /* cannot happen: the prefix is < YCSB_NAME_MAX */
    int64_t total = ycsb_conf_total_ops(c);
    for (int32_t t = 0; t < r->nthreads; t++) {
        rc = worker_setup(r, &r->workers[t], t, total);
        if (rc < 0) {
            snprintf(err, errlen, "out of memory for thread %d", t);
            return rc;
        }
    }
    return 0;
}

static void runner_free(struct runner *r)
{
    for (int32_t t = 0; r->workers != NULL && t < r->nthreads; t++)
        if (r->workers[t].r != NULL)
            worker_free(&r->workers[t]);
    free(r->workers);
    free(r->field_names);
    ycsb_workload_destroy(&r->w);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cond);
}

/* ---- status and termination (StatusThread, TerminatorThread) ------------------- */

struct monitor {
    int64_t start_ns, interval_start_ns;
    uint64_t lastops;
    struct ycsb_meas *total, *iv; /* status only: series seen so far, this interval */
    FILE *out;
};

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void print_status(struct runner *r, struct monitor *m)
{
    uint64_t total = 0, todo = 0;
    ycsb_meas_reset(m->iv);
    for (int32_t t = 0; t < r->nthreads; t++) {
        struct worker *w = &r->workers[t];
        uint64_t done = atomic_load_explicit(&w->opsdone, memory_order_relaxed);
        total += done;
        if (w->todo > 0 && (uint64_t)w->todo > done)
            todo += (uint64_t)w->todo - done;
        pthread_mutex_lock(&w->lock);
        ycsb_meas_merge(m->iv, w->interval);
        ycsb_meas_reset(w->interval);
        pthread_mutex_unlock(&w->lock);
    }
    ycsb_meas_merge(m->total, m->iv);
    int64_t now = now_ns();
    struct ycsb_status_args a = {
        .label = r->conf->label,
        .wall_ms = wall_ms(),
        .start_ms = m->start_ns / 1000000,
        .interval_start_ms = m->interval_start_ns / 1000000,
        .now_ms = now / 1000000,
        .totalops = total,
        .lastops = m->lastops,
        .todoops = todo,
    };
    static char line[8192];
    if (ycsb_status_line(line, sizeof line, &a, m->total, m->iv) >= 0)
        fprintf(m->out, "%s\n", line);
    fflush(m->out);
    m->lastops = total;
    m->interval_start_ns = now;
}

/* Waits for the threads, printing status lines and stopping them at
 * maxexecutiontime. */
static void monitor(struct runner *r, struct monitor *m)
{
    const struct ycsb_conf *c = r->conf;
    int64_t status_every = (int64_t)c->status_interval * (int64_t)FK_NSEC_PER_SEC;
    int64_t next_status = m->start_ns + status_every;
    int64_t stop_at = c->maxexecutiontime > 0
                          ? m->start_ns + c->maxexecutiontime * (int64_t)FK_NSEC_PER_SEC
                          : INT64_MAX;
    if (c->status)
        print_status(r, m);
    pthread_mutex_lock(&r->lock);
    while (r->running > 0) {
        int64_t wake = c->status && next_status < stop_at ? next_status : stop_at;
        if (atomic_load(&r->stop) || wake == INT64_MAX)
            wake = now_ns() + POLL_MAX_NS;
        int64_t wait = wake - now_ns();
        if (wait > 0) {
            /* The condition variable runs on CLOCK_REALTIME; waits are short
             * and re-checked against the monotonic clock. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t ns = ts.tv_nsec + (wait < POLL_MAX_NS ? wait : POLL_MAX_NS);
            ts.tv_sec += ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            pthread_cond_timedwait(&r->cond, &r->lock, &ts);
        }
        int64_t now = now_ns();
        if (now >= stop_at)
            atomic_store(&r->stop, 1);
        if (c->status && now >= next_status && r->running > 0) {
            pthread_mutex_unlock(&r->lock);
            print_status(r, m);
            pthread_mutex_lock(&r->lock);
            next_status += status_every;
        }
    }
    pthread_mutex_unlock(&r->lock);
}

/* ---- the run ------------------------------------------------------------------- */

static int start_threads(struct runner *r, char *err, size_t errlen)
{
    r->running = r->nthreads;
    for (int32_t t = 0; t < r->nthreads; t++) {
        int e = pthread_create(&r->workers[t].thread, NULL, worker_main, &r->workers[t]);
        if (e != 0) {
            /* Stop the threads already started; they are joined as usual. */
            atomic_store(&r->stop, 1);
            pthread_mutex_lock(&r->lock);
            r->running -= r->nthreads - t;
            pthread_mutex_unlock(&r->lock);
            r->nthreads = t;
            snprintf(err, errlen, "cannot start thread %d: %s", t, strerror(e));
            return -e;
        }
    }
    return 0;
}

static int collect(struct runner *r, struct ycsb_run_result *res, char *err, size_t errlen)
{
    for (int32_t t = 0; t < r->nthreads; t++) {
        struct worker *w = &r->workers[t];
        if (w->rc < 0) {
            snprintf(err, errlen, "thread %d: %s", t, w->err[0] ? w->err : fk_strerror(w->rc));
            return w->rc;
        }
    }
    res->meas = ycsb_meas_create(r->conf->interval);
    if (res->meas == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    res->opsdone = 0;
    for (int32_t t = 0; t < r->nthreads; t++) {
        ycsb_meas_merge(res->meas, r->workers[t].meas);
        res->opsdone += atomic_load(&r->workers[t].opsdone);
    }
    return 0;
}

int ycsb_run(const struct ycsb_conf *conf, const struct ycsb_props *props,
             const struct ycsb_binding *b, FILE *status_out, struct ycsb_run_result *res, char *err,
             size_t errlen)
{
    struct runner *r = calloc(1, sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    r->conf = conf;
    r->props = props;
    r->b = b;
    r->nthreads = ycsb_conf_threads(conf);
    atomic_init(&r->stop, 0);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    res->meas = NULL;
    struct monitor m = {.out = status_out ? status_out : stderr};
    int rc = runner_setup(r, err, errlen);
    if (rc == 0 && conf->status) {
        m.total = ycsb_meas_create(conf->interval);
        m.iv = ycsb_meas_create(conf->interval);
        if (m.total == NULL || m.iv == NULL)
            rc = -ENOMEM;
    }
    if (rc == 0) {
        m.start_ns = m.interval_start_ns = now_ns();
        int src = start_threads(r, err, errlen);
        monitor(r, &m);
        for (int32_t t = 0; t < r->nthreads; t++)
            pthread_join(r->workers[t].thread, NULL);
        res->runtime_ms = (now_ns() - m.start_ns) / 1000000;
        if (conf->status)
            print_status(r, &m);
        rc = src < 0 ? src : collect(r, res, err, errlen);
    }
    ycsb_meas_destroy(m.total);
    ycsb_meas_destroy(m.iv);
    runner_free(r);
    free(r);
    return rc;
}

int ycsb_run_report(FILE *out, const struct ycsb_conf *conf, const struct ycsb_run_result *res)
{
    return ycsb_report_write(out, res->meas, res->runtime_ms, res->opsdone, conf->percentiles,
                             conf->npercentiles);
}
