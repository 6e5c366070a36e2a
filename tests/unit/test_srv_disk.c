/* Unit tests for server/srv_disk: three replicas, each a real LMDB store
 * (kv_store) under /tmp with the LMDB state machine (kv_sm) and srv_disk
 * persisting the core's items, driven in-process on a lossless FIFO network
 * (no sockets). Each replica keeps one write transaction open per round of
 * deliveries, like the server's batch, and owns a thread that makes every
 * LMDB call on its environment, as each server process owns one (the main
 * thread hands it a step and waits: one thread holds at most one
 * environment's locks, so ThreadSanitizer sees no lock-order cycle between
 * environments); a "kill" closes the store without
 * committing it. Multi-Paxos and NOPaxos replicas restart from their disks
 * (RESTORED) or from an empty directory (EMPTY) and must end with the same
 * data database as the leader; a whole Multi-Paxos group restarts and every
 * acknowledged put is still readable; replicas whose LMDB map fills stop
 * (FK_EFULL) and nothing acknowledged is lost; and the API rejects misuse.
 * The temporary directory is removed at the end of each test (left behind,
 * and named, only when a CHECK fails). */
#include "check.h"
#include "cons_wire.h"
#include "fk_error.h"
#include "kv_sm.h"
#include "kv_store.h"
#include "cons_core.h"
#include "mpx.h"
#include "nop.h"
#include "srv_disk.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define N         3
#define CLIENT    77
#define QCAP      (1u << 14) /* in-flight messages; a full queue drops (like loss) */
#define KEYS      8
#define SNAP_MAX  ((1u << 18) + CONS_SNAP_RECORD_MAX) /* cons_sm_pairs reads whole records */
#define ROUND_MAX 20000                               /* deliveries in one round */

struct qmsg {
    uint32_t to;
    struct cons_addr from;
    uint8_t *buf;
    uint32_t len;
};

struct rep {
    char dir[128];
    uint64_t map_size;
    struct kv_store *store;
    struct kv_sm sm;
    struct srv_disk *disk;
    struct cons_core core;
    int up, txn, disk_failed;
    uint64_t fed; /* highest durable cookie fed to the core */
    uint32_t inc; /* incarnation, for a fresh seed */
};

struct group {
    int nop;
    char root[64];
    struct rep r[N];
    uint64_t now;
    struct qmsg q[QCAP];
    uint32_t qhead, qlen;
    /* the client (its id can change between operations) */
    uint64_t client, cur_req;
    uint64_t req_no, req_other; /* per client (CLIENT, CLIENT + 1), from 1 */
    uint32_t target;            /* Multi-Paxos: the replica believed to lead */
    int got;
    struct cons_reply reply; /* its data: reply_data */
    uint8_t reply_data[CONS_REPLY_MAX];
    struct nop_quorum quorum;
    uint32_t session;
    uint64_t msgnum;
    /* the model: last acknowledged value of each key ("" = none) */
    char model[KEYS][32];
};

/* ---- replicas -------------------------------------------------------- */

static void core_cfg(struct group *g, uint32_t i, struct cons_core_config *c)
{
    memset(c, 0, sizeof *c);
    c->n = N;
    c->id = i;
    c->clients_max = 4;
    c->heartbeat_ns = 10;
    c->seed = 1000 * g->r[i].inc + i + 1;
    if (g->nop) {
        c->log_cap = 64; /* checkpoints every 16 committed slots */
        c->election_ns = 100;
        return;
    }
    c->log_cap = 16; /* snapshots every 8 applied slots: SNAPSHOT items and trims */
    c->window = 4;
    c->batch_max = 2;
    c->pending_max = 8;
    c->arena_bytes = 1 << 20;
    c->election_ns = 50 + 20 * i;
}

static struct cons_core_status status_of(struct group *g, uint32_t i)
{
    struct cons_core_status st;
    g->r[i].core.ops->status(g->r[i].core.impl, &st);
    return st;
}

static void drain(struct group *g, uint32_t i, struct cons_outbox *ob);

/* ---- one thread per replica ------------------------------------------ */

/* Replica i's thread runs one call at a time for the main thread, which
 * waits for it: the test stays sequential, each environment is touched by
 * one thread only. Created per group (the harness forks each test). */
struct worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*fn)(void *arg);
    void *arg;
    int pending, quit;
};

static struct worker workers[N];
static __thread int this_worker = -1;

static void *worker_main(void *p)
{
    struct worker *w = p;
    this_worker = (int)(w - workers);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->pending) {
            pthread_mutex_unlock(&w->mu);
            w->fn(w->arg);
            pthread_mutex_lock(&w->mu);
            w->pending = 0;
            pthread_cond_broadcast(&w->cv);
        } else {
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Runs fn(arg) on replica i's thread and returns when it is done (at once
 * when already there: a step that flushes or kills its own replica). */
static void on_rep(uint32_t i, void (*fn)(void *arg), void *arg)
{
    if (this_worker == (int)i) {
        fn(arg);
        return;
    }
    struct worker *w = &workers[i];
    pthread_mutex_lock(&w->mu);
    w->fn = fn;
    w->arg = arg;
    w->pending = 1;
    pthread_cond_broadcast(&w->cv);
    while (w->pending)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void workers_start(void)
{
    for (uint32_t i = 0; i < N; i++) {
        struct worker *w = &workers[i];
        memset(w, 0, sizeof *w);
        CHECK_OK(pthread_mutex_init(&w->mu, NULL));
        CHECK_OK(pthread_cond_init(&w->cv, NULL));
        CHECK_OK(pthread_create(&w->thread, NULL, worker_main, w));
    }
}

static void workers_stop(void)
{
    for (uint32_t i = 0; i < N; i++) {
        struct worker *w = &workers[i];
        pthread_mutex_lock(&w->mu);
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        CHECK_OK(pthread_join(w->thread, NULL));
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
    }
}

/* A call on replica i's thread: the group, the replica, its arguments. */
struct rep_call {
    struct group *g;
    uint32_t i;
    const struct cons_input *in;
    int fresh, result;
    void *buf;
    size_t cap, len;
    uint64_t a, b;
};

/* One input to replica i inside its open transaction. */
static void step_here(struct group *g, uint32_t i, const struct cons_input *in)
{
    struct rep *r = &g->r[i];
    struct cons_outbox *ob;
    CHECK(r->up && r->txn);
    CHECK_OK(r->core.ops->step(r->core.impl, in, g->now, &ob));
    r->core.ops->invariants(r->core.impl);
    drain(g, i, ob);
}

static void step_call(void *p)
{
    struct rep_call *c = p;
    step_here(c->g, c->i, c->in);
}

static void step(struct group *g, uint32_t i, const struct cons_input *in)
{
    struct rep_call c = {.g = g, .i = i, .in = in};
    on_rep(i, step_call, &c);
}

/* Ends replica i: the open transaction is dropped, as in a crash. */
static void kill_here(struct group *g, uint32_t i)
{
    struct rep *r = &g->r[i];
    CHECK(r->up);
    cons_core_destroy(&r->core);
    srv_disk_close(r->disk);
    kv_store_close(r->store);
    r->disk = NULL;
    r->store = NULL;
    r->up = r->txn = 0;
}

static void kill_call(void *p)
{
    struct rep_call *c = p;
    kill_here(c->g, c->i);
}

static void kill_rep(struct group *g, uint32_t i)
{
    struct rep_call c = {.g = g, .i = i};
    on_rep(i, kill_call, &c);
}

static void enqueue(struct group *g, uint32_t to, struct cons_addr from, const uint8_t *buf,
                    uint32_t len)
{
    if (g->qlen == QCAP)
        return;
    struct qmsg *m = &g->q[(g->qhead + g->qlen++) % QCAP];
    m->to = to;
    m->from = from;
    m->buf = malloc(len + 1);
    CHECK(m->buf != NULL);
    memcpy(m->buf, buf, len);
    m->len = len;
}

static void client_reply(struct group *g, uint32_t from, const uint8_t *buf, uint32_t len)
{
    if (g->nop) {
        const struct cons_reply *res;
        int rc = nop_quorum_add(&g->quorum, from, buf, len, &res);
        CHECK_OK(rc);
        if (rc == 1 && !g->got) {
            cons_reply_copy(&g->reply, res);
            g->got = 1;
        }
        return;
    }
    struct cons_reply rep;
    const uint8_t *data;
    uint32_t hint;
    CHECK_OK(mpx_decode_reply(buf, len, &rep, &data, &hint));
    if (rep.client_id != g->client || rep.req_no != g->cur_req)
        return;
    if (rep.status == FK_ENOTLEADER) {
        g->target = hint < N && hint != g->target ? hint : (g->target + 1) % N;
        return;
    }
    /* Kept: its bytes lie in the message. */
    CHECK(rep.len <= g->reply.cap);
    g->reply.client_id = rep.client_id;
    g->reply.req_no = rep.req_no;
    g->reply.status = rep.status;
    g->reply.len = rep.len;
    if (rep.len)
        memcpy(g->reply.data, data, rep.len);
    g->got = 1;
}

/* Messages go to the queue; persist items into the open transaction. A
 * failed persist stops the replica, as the server would (srv_disk.h). */
static void drain(struct group *g, uint32_t i, struct cons_outbox *ob)
{
    struct rep *r = &g->r[i];
    for (uint32_t k = 0; k < ob->nmsgs; k++) {
        const struct cons_out_msg *m = &ob->msgs[k];
        if (m->to.kind == CONS_ADDR_CLIENT) {
            client_reply(g, i, m->buf, m->len);
            continue;
        }
        for (uint32_t j = 0; j < N; j++) {
            if (cons_addr_has_replica(m->to, i, j))
                enqueue(g, j, cons_replica(i), m->buf, m->len);
        }
    }
    int rc = srv_disk_persist(r->disk, ob->persists, ob->npersists);
    if (rc < 0) {
        CHECK(rc == FK_EFULL || rc == FK_ESTORAGE);
        r->disk_failed = 1;
        kill_rep(g, i);
    }
}

static void begin(struct rep *r)
{
    CHECK_OK(kv_write_begin(r->store));
    r->txn = 1;
}

/* The batch boundary: commit, open the next transaction, report durable. */
static void flush_here(struct group *g, uint32_t i)
{
    struct rep *r = &g->r[i];
    uint64_t durable;
    int rc = r->core.ops->seal ? r->core.ops->seal(r->core.impl) : 0; /* as the server does */
    if (rc == 0) {
        r->core.ops->invariants(r->core.impl);
        rc = srv_disk_commit(r->disk, &durable);
    } else {
        durable = r->fed;
        srv_disk_abort(r->disk);
    }
    r->txn = 0;
    if (rc < 0) {
        CHECK(rc == FK_EFULL || rc == FK_ESTORAGE || rc == FK_EPOISONED);
        CHECK(durable == r->fed);
        r->disk_failed = 1;
        kill_rep(g, i);
        return;
    }
    CHECK(durable >= r->fed);
    begin(r);
    if (durable > r->fed) {
        struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = durable};
        r->fed = durable;
        step(g, i, &in);
    }
}

static void flush_call(void *p)
{
    struct rep_call *c = p;
    flush_here(c->g, c->i);
}

static void flush(struct group *g, uint32_t i)
{
    struct rep_call c = {.g = g, .i = i};
    on_rep(i, flush_call, &c);
}

static void open_store(struct group *g, uint32_t i)
{
    struct rep *r = &g->r[i];
    struct kv_store_opts o = {
        .dir = r->dir, .map_size = r->map_size, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &r->store));
    CHECK_OK(kv_sm_init(&r->sm, r->store, 0));
    CHECK_OK(srv_disk_open(&r->disk, r->store, g->nop ? CONS_PROTO_NOP : CONS_PROTO_MPX,
                           kv_sm_cons(&r->sm)));
}

/* Boots replica i from its directory; fresh: a member of a new group.
 * Returns whether srv_disk restored a META record. */
static int boot_here(struct group *g, uint32_t i, int fresh)
{
    struct rep *r = &g->r[i];
    struct cons_outbox *ob;
    int restored;
    r->inc++;
    r->fed = 0;
    open_store(g, i);
    begin(r);
    r->up = 1;
    struct cons_core_config c;
    core_cfg(g, i, &c);
    CHECK_OK(
        cons_core_create(&r->core, g->nop ? &nop_core_ops : &mpx_core_ops, &c, kv_sm_cons(&r->sm)));
    CHECK_OK(srv_disk_restore(r->disk, &r->core, &restored));
    CHECK_OK(r->core.ops->start(r->core.impl,
                                restored ? CONS_START_RESTORED
                                : fresh  ? CONS_START_FRESH
                                         : CONS_START_EMPTY,
                                g->now, &ob));
    CHECK(!(fresh && restored));
    drain(g, i, ob);
    if (r->up)
        flush(g, i);
    return restored;
}

static void boot_call(void *p)
{
    struct rep_call *c = p;
    c->result = boot_here(c->g, c->i, c->fresh);
}

static int boot(struct group *g, uint32_t i, int fresh)
{
    struct rep_call c = {.g = g, .i = i, .fresh = fresh};
    on_rep(i, boot_call, &c);
    return c.result;
}

/* Test-body reads of replica i's environment, on its thread too. */
static void snapshot_call(void *p)
{
    struct rep_call *c = p;
    struct cons_sm sm = kv_sm_cons(&c->g->r[c->i].sm);
    c->result = cons_sm_pairs(&sm, c->buf, c->cap, &c->len);
}

/* The pairs of replica i's data database, in order (cons_sm_pairs). */
static int data_of(struct group *g, uint32_t i, void *buf, size_t cap, size_t *len)
{
    struct rep_call c = {.g = g, .i = i, .buf = buf, .cap = cap};
    on_rep(i, snapshot_call, &c);
    *len = c.len;
    return c.result;
}

static void snap_index_call(void *p)
{
    struct rep_call *c = p;
    uint64_t idx = 0;
    size_t len;
    int rc = kv_meta_get(c->g->r[c->i].store, SRV_DISK_SNAP_INDEX_KEY, &idx, sizeof idx, &len);
    c->a = rc == 0 && len == sizeof idx ? idx : 0;
}

static uint64_t snap_index_on_disk(struct group *g, uint32_t i)
{
    struct rep_call c = {.g = g, .i = i};
    on_rep(i, snap_index_call, &c);
    return c.a;
}

static void log_bounds_call(void *p)
{
    struct rep_call *c = p;
    c->result = kv_log_bounds(c->g->r[c->i].store, &c->a, &c->b);
}

static int log_bounds(struct group *g, uint32_t i, uint64_t *first, uint64_t *last)
{
    struct rep_call c = {.g = g, .i = i};
    on_rep(i, log_bounds_call, &c);
    *first = c.a;
    *last = c.b;
    return c.result;
}

static void stats_call(void *p)
{
    struct rep_call *c = p;
    c->result = kv_store_stats(c->g->r[c->i].store, c->buf);
}

static int store_stats(struct group *g, uint32_t i, struct kv_store_stats *st)
{
    struct rep_call c = {.g = g, .i = i, .buf = st};
    on_rep(i, stats_call, &c);
    return c.result;
}

/* ---- the network and time --------------------------------------------- */

static void deliver_all(struct group *g)
{
    for (uint32_t n = 0; n < ROUND_MAX && g->qlen; n++) {
        struct qmsg m = g->q[g->qhead];
        g->qhead = (g->qhead + 1) % QCAP;
        g->qlen--;
        if (g->r[m.to].up) {
            struct cons_input in = {
                .kind = CONS_IN_MSG, .from = m.from, .buf = m.buf, .len = m.len};
            step(g, m.to, &in);
        }
        free(m.buf);
    }
}

static void round_(struct group *g)
{
    deliver_all(g);
    for (uint32_t i = 0; i < N; i++) {
        if (g->r[i].up)
            flush(g, i);
    }
    g->now += 5;
    for (uint32_t i = 0; i < N; i++) {
        struct cons_input in = {.kind = CONS_IN_TICK};
        if (g->r[i].up)
            step(g, i, &in);
    }
}

static void rounds(struct group *g, int n)
{
    for (int k = 0; k < n; k++)
        round_(g);
}

static void group_init(struct group *g, int nop)
{
    memset(g, 0, sizeof *g);
    g->reply.data = g->reply_data;
    g->reply.cap = sizeof g->reply_data;
    g->nop = nop;
    g->client = CLIENT;
    snprintf(g->root, sizeof g->root, "/tmp/fkdiskXXXXXX");
    CHECK(mkdtemp(g->root) != NULL);
    for (uint32_t i = 0; i < N; i++) {
        snprintf(g->r[i].dir, sizeof g->r[i].dir, "%s/r%u", g->root, i);
        g->r[i].map_size = 64ull << 20;
    }
    workers_start();
}

static void start_fresh(struct group *g, int nop)
{
    group_init(g, nop);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ_I64(boot(g, i, 1), 0);
}

static void wipe_dir(const char *dir)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void stop(struct group *g)
{
    for (uint32_t i = 0; i < N; i++) {
        if (g->r[i].up)
            kill_rep(g, i);
    }
    while (g->qlen) {
        free(g->q[g->qhead].buf);
        g->qhead = (g->qhead + 1) % QCAP;
        g->qlen--;
    }
    workers_stop();
    wipe_dir(g->root);
}

/* ---- the client ----------------------------------------------------------- */

static void send_op(struct group *g, const struct cons_op *op)
{
    static uint8_t buf[CONS_WIRE_OP_MAX + 256];
    if (!g->nop) {
        int len = mpx_encode_request(buf, sizeof buf, op);
        CHECK(len > 0);
        enqueue(g, g->target, cons_client(g->client), buf, (uint32_t)len);
        return;
    }
    /* The test plays the sequencer: stamp and multicast (NOPaxos 4). */
    int len = nop_encode_oum_request(buf, sizeof buf, g->session, ++g->msgnum, op);
    CHECK(len > 0);
    struct cons_addr oum = {CONS_ADDR_OUM, 0};
    for (uint32_t i = 0; i < N; i++) {
        if (g->r[i].up)
            enqueue(g, i, oum, buf, (uint32_t)len);
    }
}

/* Runs one operation to completion (resent every 20 rounds, same req_no,
 * so exactly-once); returns its status, or FK_ETIMEDOUT after max rounds
 * (the request then stays outstanding: call again with retry = 1). */
static int op_run(struct group *g, struct cons_op *op, int max, int retry)
{
    if (!retry)
        op->req_no = g->client == CLIENT ? ++g->req_no : ++g->req_other;
    op->client_id = g->client;
    g->cur_req = op->req_no;
    g->got = 0;
    nop_quorum_reset(&g->quorum, N, g->client, op->req_no);
    for (int k = 0; k < max; k++) {
        if (k % 20 == 0)
            send_op(g, op);
        round_(g);
        if (g->got)
            return g->reply.status;
    }
    return FK_ETIMEDOUT;
}

/* op := a `type` op on key number `key` with val (NULL: none); op_run
 * sets its client and request number. */
static void key_op(struct cons_op *op, uint8_t type, int key, const char *val)
{
    char k[16];
    int kl = snprintf(k, sizeof k, "key%02d", key);
    cons_op_init(op, type, k, (uint32_t)kl, val, val ? (uint32_t)strlen(val) : 0, NULL, 0);
}

static int put(struct group *g, int key, const char *val, int max)
{
    static struct cons_op op;
    key_op(&op, CONS_OP_PUT, key, val);
    int rc = op_run(g, &op, max, 0);
    if (rc == 0 && key < KEYS)
        snprintf(g->model[key], sizeof g->model[key], "%s", val);
    return rc;
}

/* Puts n values round-robin over the keys; every one must be acknowledged. */
static void puts_n(struct group *g, int n)
{
    for (int k = 0; k < n; k++) {
        char val[32];
        snprintf(val, sizeof val, "v%llu", (unsigned long long)g->req_no + 1);
        CHECK_OK(put(g, (int)(g->req_no % KEYS), val, 400));
    }
}

/* Every key reads back its last acknowledged value, through the log. */
static void check_reads(struct group *g)
{
    static struct cons_op op;
    for (int key = 0; key < KEYS; key++) {
        key_op(&op, CONS_OP_GET, key, NULL);
        int rc = op_run(g, &op, 400, 0);
        if (g->model[key][0] == '\0') {
            CHECK_ERR(rc, FK_ENOTFOUND);
            continue;
        }
        CHECK_OK(rc);
        CHECK_MSG(g->reply.len == strlen(g->model[key]) &&
                      memcmp(g->reply.data, g->model[key], g->reply.len) == 0,
                  "key %d: read %.*s, acknowledged %s", key, (int)g->reply.len,
                  (const char *)g->reply.data, g->model[key]);
    }
}

/* ---- checks ----------------------------------------------------------- */

static uint64_t applied_of(struct group *g, uint32_t i)
{
    struct cons_core_status st = status_of(g, i);
    if (g->nop && (st.role == CONS_ROLE_RECOVERING || st.role == CONS_ROLE_VIEW_CHANGE))
        return 0;
    return st.applied;
}

/* Runs until replicas a and b applied the same prefix, then compares their
 * data databases (kv_sm's snapshot of each: every pair, in key order). */
static void same_data(struct group *g, uint32_t a, uint32_t b)
{
    static uint8_t x[SNAP_MAX], y[SNAP_MAX];
    for (int k = 0; k < 400 && applied_of(g, a) != applied_of(g, b); k++)
        round_(g);
    CHECK_EQ_U64(applied_of(g, a), applied_of(g, b));
    CHECK(applied_of(g, a) > 0);
    size_t lx, ly;
    CHECK_OK(data_of(g, a, x, sizeof x, &lx));
    CHECK_OK(data_of(g, b, y, sizeof y, &ly));
    CHECK_MSG(lx == ly && memcmp(x, y, lx) == 0, "replicas %u and %u hold different data", a, b);
    CHECK(lx > 0 && x[0] == CONS_SNAP_PAIR); /* some pairs */
}

static int leader(struct group *g)
{
    for (int k = 0; k < 400; k++) {
        for (uint32_t i = 0; i < N; i++) {
            if (g->r[i].up && status_of(g, i).role == CONS_ROLE_LEADER)
                return (int)i;
        }
        round_(g);
    }
    CHECK_MSG(0, "no leader");
    return -1;
}

/* ---- Multi-Paxos ---------------------------------------------------------- */

TEST(mpx_follower_killed_restores_and_catches_up)
{
    static struct group g;
    start_fresh(&g, 0);
    int l = leader(&g);
    uint32_t f = (uint32_t)(l + 1) % N;
    puts_n(&g, 30);
    CHECK(snap_index_on_disk(&g, f) > 0); /* compaction reached the disk */
    uint64_t first, last;
    CHECK_OK(log_bounds(&g, f, &first, &last));
    CHECK(first > snap_index_on_disk(&g, f)); /* the snapshot trimmed the log */
    kill_rep(&g, f);                          /* its open transaction is lost */
    puts_n(&g, 20);
    CHECK_EQ_I64(boot(&g, f, 0), 1);
    struct srv_disk_stats st;
    srv_disk_stats(g.r[f].disk, &st);
    CHECK(st.restored > 0);
    puts_n(&g, 3);
    same_data(&g, (uint32_t)l, f);
    check_reads(&g);
    stop(&g);
}

TEST(mpx_whole_group_restarts_from_disk)
{
    static struct group g;
    start_fresh(&g, 0);
    leader(&g);
    puts_n(&g, 37);
    /* One more put in flight when everything dies: it may or may not
     * survive, but it must not break what was acknowledged. */
    static struct cons_op op;
    key_op(&op, CONS_OP_PUT, KEYS + 1, "xx");
    CHECK_ERR(op_run(&g, &op, 1, 0), FK_ETIMEDOUT);
    for (uint32_t i = 0; i < N; i++)
        kill_rep(&g, i);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ_I64(boot(&g, i, 0), 1);
    CHECK_OK(op_run(&g, &op, 400, 1)); /* the retry completes, exactly once */
    check_reads(&g);
    puts_n(&g, 5);
    int l = leader(&g);
    same_data(&g, (uint32_t)l, (uint32_t)(l + 1) % N);
    same_data(&g, (uint32_t)l, (uint32_t)(l + 2) % N);
    stop(&g);
}

/* Before the first compaction the disk holds META, entries and the state
 * machine at its mark (cons.h: the machine's writes commit with the log):
 * the restarted group keeps its data, replays nothing it had applied, and
 * answers from there. A GET that ran before a PUT of its key is read again
 * when its client retries it (reads keep no result, cons.h): the retry
 * sees the later value, which linearizes it within the retry. */
TEST(mpx_restart_keeps_the_state_at_its_mark)
{
    static struct group g;
    static struct cons_op get;
    start_fresh(&g, 0);
    leader(&g);
    key_op(&get, CONS_OP_GET, 0, NULL);
    g.client = CLIENT + 1;
    CHECK_ERR(op_run(&g, &get, 400, 0), FK_ENOTFOUND);
    g.client = CLIENT;
    CHECK_OK(put(&g, 0, "later", 400));
    rounds(&g, 20);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ_U64(snap_index_on_disk(&g, i), 0);
        kill_rep(&g, i);
    }
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ_I64(boot(&g, i, 0), 1);
        struct kv_store_stats st; /* the machine as it was: the pair is there */
        CHECK_OK(store_stats(&g, i, &st));
        CHECK_EQ_U64(st.data_entries, 1);
    }
    g.client = CLIENT + 1;
    CHECK_OK(op_run(&g, &get, 400, 1));
    CHECK_EQ_U64(g.reply.len, 5);
    CHECK(memcmp(g.reply.data, "later", 5) == 0);
    g.client = CLIENT;
    check_reads(&g);
    stop(&g);
}

TEST(mpx_empty_directory_starts_empty_and_recovers)
{
    static struct group g;
    start_fresh(&g, 0);
    int l = leader(&g);
    uint32_t f = (uint32_t)(l + 2) % N;
    puts_n(&g, 25);
    kill_rep(&g, f);
    wipe_dir(g.r[f].dir);
    puts_n(&g, 5);
    CHECK_EQ_I64(boot(&g, f, 0), 0); /* no META: EMPTY */
    puts_n(&g, 3);
    same_data(&g, (uint32_t)l, f);
    stop(&g);
}

/* Replicas 1 and 2 have maps too small for the run: once both stopped
 * (FK_EFULL), no put may be acknowledged; restarted with larger maps from
 * what they had made durable, every acknowledged put is still there. */
TEST(mpx_full_map_stops_replica_and_loses_nothing_acknowledged)
{
    static struct group g;
    static char val[1001];
    group_init(&g, 0);
    g.r[1].map_size = g.r[2].map_size = 256u << 10;
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ_I64(boot(&g, i, 1), 0);
    leader(&g);
    int acked = 0, rc = 0;
    memset(val, 'a', 1000);
    for (int k = 0; k < 400 && rc == 0; k++) {
        val[0] = (char)('a' + k % 26);
        rc = put(&g, KEYS + 2 + k, val, 200); /* distinct keys: the data grows */
        acked += rc == 0;
        if (g.r[1].disk_failed && g.r[2].disk_failed)
            break;
    }
    CHECK_MSG(g.r[1].disk_failed && g.r[2].disk_failed, "maps never filled (%d puts)", acked);
    CHECK(acked > 5);
    static struct cons_op op;
    key_op(&op, CONS_OP_PUT, 0, "last");
    CHECK_ERR(op_run(&g, &op, 200, 0), FK_ETIMEDOUT); /* no quorum can make it durable */
    for (uint32_t i = 1; i < N; i++) {
        g.r[i].map_size = 64ull << 20;
        g.r[i].disk_failed = 0;
        CHECK_EQ_I64(boot(&g, i, 0), 1);
    }
    CHECK_OK(op_run(&g, &op, 400, 1));
    snprintf(g.model[0], sizeof g.model[0], "last");
    check_reads(&g);
    /* Every acknowledged big value too. */
    for (int k = 0; k < acked; k++) {
        static struct cons_op get;
        key_op(&get, CONS_OP_GET, KEYS + 2 + k, NULL);
        CHECK_OK(op_run(&g, &get, 400, 0));
        CHECK_EQ_U64(g.reply.len, 1000);
        CHECK_EQ_I64(g.reply.data[0], 'a' + k % 26);
    }
    stop(&g);
}

/* ---- NOPaxos ------------------------------------------------------------ */

TEST(nop_follower_and_leader_restart_from_disk)
{
    static struct group g;
    start_fresh(&g, 1);
    int l = leader(&g);
    uint32_t f = (uint32_t)(l + 1) % N;
    puts_n(&g, 80); /* a snapshot reaches the disk once a ring (64) of entries did */
    rounds(&g, 10);
    CHECK(snap_index_on_disk(&g, f) > 0);
    kill_rep(&g, f);
    puts_n(&g, 10);
    CHECK_EQ_I64(boot(&g, f, 0), 1);
    struct srv_disk_stats st;
    srv_disk_stats(g.r[f].disk, &st);
    CHECK(st.restored > 0);
    puts_n(&g, 3);
    same_data(&g, (uint32_t)l, f);
    /* The leader dies: a view change, then it comes back from its disk. */
    kill_rep(&g, (uint32_t)l);
    g.session++; /* and the sequencer fails over with it */
    g.msgnum = 0;
    rounds(&g, 60);
    puts_n(&g, 5);
    CHECK_EQ_I64(boot(&g, (uint32_t)l, 0), 1);
    puts_n(&g, 3);
    int l2 = leader(&g);
    CHECK(l2 != l);
    same_data(&g, (uint32_t)l2, (uint32_t)l);
    same_data(&g, (uint32_t)l2, f);
    check_reads(&g);
    stop(&g);
}

TEST(nop_empty_directory_starts_empty_and_recovers)
{
    static struct group g;
    start_fresh(&g, 1);
    int l = leader(&g);
    uint32_t f = (uint32_t)(l + 2) % N;
    puts_n(&g, 30);
    kill_rep(&g, f);
    wipe_dir(g.r[f].dir);
    puts_n(&g, 5);
    CHECK_EQ_I64(boot(&g, f, 0), 0);
    puts_n(&g, 3);
    same_data(&g, (uint32_t)l, f);
    stop(&g);
}

/* A whole NOPaxos group cannot come back by itself (a restarted replica
 * recovers from others in normal status, nop.h), but each disk must hold
 * the committed prefix: restored, it is executed into the data database. */
TEST(nop_disks_hold_committed_prefix_after_group_crash)
{
    static struct group g;
    static uint8_t before[SNAP_MAX], after[SNAP_MAX];
    start_fresh(&g, 1);
    int l = leader(&g);
    puts_n(&g, 37);
    rounds(&g, 20); /* sync: every replica commits and persists */
    size_t lb, la;
    CHECK_OK(data_of(&g, (uint32_t)l, before, sizeof before, &lb));
    uint64_t exec = applied_of(&g, (uint32_t)l);
    for (uint32_t i = 0; i < N; i++)
        kill_rep(&g, i);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ_I64(boot(&g, i, 0), 1);
        CHECK_EQ_U64(status_of(&g, i).applied, exec);
        CHECK_OK(data_of(&g, i, after, sizeof after, &la));
        CHECK(la == lb && memcmp(before, after, la) == 0);
    }
    stop(&g);
}

/* ---- the API ---------------------------------------------------------- */

TEST(api_misuse_and_full_map)
{
    static struct group g;
    static uint8_t big[1 << 20];
    group_init(&g, 0);
    struct rep *r = &g.r[0];
    r->map_size = 256u << 10;
    open_store(&g, 0);
    struct srv_disk *d = r->disk;
    int restored = 7;
    CHECK_ERR(srv_disk_restore(d, NULL, &restored), FK_EINVAL);
    struct cons_core other = {&nop_core_ops, (void *)1};
    CHECK_ERR(srv_disk_restore(d, &other, &restored), FK_EINVAL); /* proto */
    struct cons_persist p = {.kind = CONS_PERSIST_META, .cookie = 1, .buf = big, .len = 8};
    CHECK_ERR(srv_disk_persist(d, &p, 1), FK_EINVAL); /* no transaction */
    uint64_t durable = 9;
    CHECK_ERR(srv_disk_commit(d, &durable), FK_EINVAL);
    CHECK_EQ_U64(durable, 0);
    CHECK_OK(kv_write_begin(r->store));
    struct srv_disk *d2;
    CHECK_ERR(srv_disk_open(&d2, r->store, CONS_PROTO_MPX, kv_sm_cons(&r->sm)), FK_EBUSY);
    CHECK_OK(srv_disk_persist(d, &p, 1));
    CHECK_ERR(srv_disk_persist(d, &p, 1), FK_EINVAL); /* cookie not increasing */
    struct cons_persist bad = {.kind = 9, .cookie = 5, .buf = big, .len = 8};
    CHECK_ERR(srv_disk_persist(d, &bad, 1), FK_EINVAL);
    CHECK_OK(srv_disk_commit(d, &durable));
    CHECK_EQ_U64(durable, 1);
    CHECK_EQ_U64(srv_disk_durable(d), 1);
    /* A snapshot larger than the map: FK_EFULL, then poisoned. */
    CHECK_OK(kv_write_begin(r->store));
    struct cons_persist s = {
        .kind = CONS_PERSIST_SNAPSHOT, .cookie = 2, .index = 4, .buf = big, .len = sizeof big};
    CHECK_ERR(srv_disk_persist(d, &s, 1), FK_EFULL);
    p.cookie = 3;
    CHECK_ERR(srv_disk_persist(d, &p, 1), FK_EPOISONED);
    CHECK_ERR(srv_disk_commit(d, &durable), FK_EPOISONED);
    CHECK_EQ_U64(durable, 1);
    struct srv_disk_stats st;
    srv_disk_stats(d, &st);
    CHECK(st.poisoned && st.durable == 1 && st.records == 1);
    srv_disk_close(d);
    /* What was committed survives; a NOPaxos replica refuses this disk. */
    kv_store_close(r->store);
    struct kv_store_opts o = {.dir = r->dir, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &r->store));
    CHECK_OK(kv_sm_init(&r->sm, r->store, 0));
    CHECK_ERR(srv_disk_open(&d, r->store, CONS_PROTO_NOP, kv_sm_cons(&r->sm)), FK_ECONFIG);
    CHECK_OK(srv_disk_open(&d, r->store, CONS_PROTO_MPX, kv_sm_cons(&r->sm)));
    uint8_t meta[16];
    size_t len;
    CHECK_OK(kv_meta_get(r->store, SRV_DISK_META_KEY, meta, sizeof meta, &len));
    CHECK_EQ_U64(len, 8);
    /* Restore outside a transaction is misuse; a lost transaction poisons. */
    struct cons_core_config c;
    core_cfg(&g, 0, &c);
    struct cons_core m;
    CHECK_OK(cons_core_create(&m, &mpx_core_ops, &c, kv_sm_cons(&r->sm)));
    CHECK_ERR(srv_disk_restore(d, &m, &restored), FK_EINVAL);
    CHECK_OK(kv_write_begin(r->store));
    CHECK_ERR(srv_disk_restore(d, &m, &restored), FK_EMALFORMED); /* 8 bytes of zeros */
    CHECK_OK(srv_disk_wipe(d));
    p.cookie = 1;
    CHECK_OK(srv_disk_persist(d, &p, 1));
    CHECK_ERR(srv_disk_abort(d), FK_EPOISONED);
    cons_core_destroy(&m);
    srv_disk_close(d);
    kv_store_close(r->store);
    r->store = NULL;
    workers_stop();
    wipe_dir(g.root);
}

CHECK_MAIN()
