/* Unit tests for NOPaxos durable mode (nop_durable.c): three replicas with
 * in-test disks that complete persists only when the test flushes them, a
 * message queue between replicas, and a client that collects f+1 replies.
 * Checked: no reply leaves before its persists are durable; after all
 * three replicas crash (losing what their disks had not completed) and
 * restart from their disks, the group serves again and every
 * acknowledged write is readable, also when one replica lost its disk
 * and when a view change rewrites more of the log than one outbox holds;
 * a durable log with a hole is refused; a stalled disk fills the ring of
 * held messages, which wraps and drains in order. */
#include "check.h"
#include "fk_error.h"
#include "kv.h"
#include "nop.h"

#include <stdio.h>
#include <stdlib.h>

#define N      3
#define SLOTS  1024 /* disk entry records, by slot % SLOTS (>= log_cap) */
#define CLIENT 5

struct rec {
    uint8_t *buf;
    uint32_t len;
    uint64_t index;
    uint8_t kind;
};

struct disk {
    struct rec meta, snap, ents[SLOTS];
    struct rec pending[4096]; /* persists issued, not yet durable */
    uint32_t npending;
    uint64_t last_cookie;
};

struct qmsg {
    uint32_t from;
    struct cons_addr to;
    uint32_t len;
    uint8_t *buf;
};

struct group {
    struct nop *r[N];
    struct kv_mem *kv[N];
    struct disk disk[N];
    struct qmsg q[8192];
    uint32_t qhead, qn;
    uint64_t now, msgnum, req_no, client_msgs;
    uint32_t session, down, incs;
    int auto_flush, done;
    uint16_t pad;     /* values padded with '.' to this many bytes */
    uint32_t log_cap; /* 0: 64 */
    struct nop_quorum quorum;
    struct cons_reply result; /* a copy of the quorum's, in result_data */
    uint8_t result_data[NOP_RESULT_MAX];
};

static void rec_set(struct rec *d, const uint8_t *buf, uint32_t len, uint64_t index, uint8_t kind)
{
    free(d->buf);
    d->buf = malloc(len + 1);
    memcpy(d->buf, buf, len);
    d->len = len;
    d->index = index;
    d->kind = kind;
}

static void rec_clear(struct rec *d)
{
    free(d->buf);
    memset(d, 0, sizeof *d);
}

static void disk_drop_pending(struct disk *d)
{
    for (uint32_t k = 0; k < d->npending; k++)
        rec_clear(&d->pending[k]);
    d->npending = 0;
}

static void disk_wipe(struct disk *d)
{
    rec_clear(&d->meta);
    rec_clear(&d->snap);
    for (int k = 0; k < SLOTS; k++)
        rec_clear(&d->ents[k]);
    disk_drop_pending(d);
}

static void take(struct group *g, uint32_t i, const struct cons_outbox *ob)
{
    struct disk *d = &g->disk[i];
    for (uint32_t k = 0; k < ob->npersists; k++) {
        const struct cons_persist *p = &ob->persists[k];
        CHECK(d->npending < 4096);
        struct rec *x = &d->pending[d->npending++];
        memset(x, 0, sizeof *x);
        rec_set(x, p->buf, p->len, p->index, p->kind);
        x->index = p->index;
        CHECK(p->cookie == d->last_cookie + d->npending);
    }
    for (uint32_t k = 0; k < ob->nmsgs; k++) {
        CHECK(g->qn < 8192);
        struct qmsg *m = &g->q[(g->qhead + g->qn++) % 8192];
        m->from = i;
        m->to = ob->msgs[k].to;
        m->len = ob->msgs[k].len;
        m->buf = malloc(m->len);
        memcpy(m->buf, ob->msgs[k].buf, m->len);
    }
}

static void step(struct group *g, uint32_t i, const struct cons_input *in)
{
    struct cons_outbox *ob;
    CHECK_OK(nop_step(g->r[i], in, g->now, &ob));
    CHECK_OK(nop_seal(g->r[i])); /* each step a commit (nop.h) */
    nop_invariants(g->r[i]);
    take(g, i, ob);
}

/* Replica i's disk completes its n oldest pending items, in order, and
 * says so. */
static void flush_n(struct group *g, uint32_t i, uint32_t n)
{
    struct disk *d = &g->disk[i];
    if (n == 0 || (g->down >> i & 1))
        return;
    for (uint32_t k = 0; k < n; k++) {
        struct rec *p = &d->pending[k];
        if (p->kind == CONS_PERSIST_META) {
            rec_set(&d->meta, p->buf, p->len, 0, p->kind);
        } else if (p->kind == CONS_PERSIST_ENTRY) {
            rec_set(&d->ents[p->index % SLOTS], p->buf, p->len, p->index, p->kind);
        } else {
            CHECK_EQ_U64(p->kind, CONS_PERSIST_SNAPSHOT);
            rec_set(&d->snap, p->buf, p->len, p->index, p->kind);
            for (int e = 0; e < SLOTS; e++) {
                if (d->ents[e].buf && d->ents[e].index <= p->index)
                    rec_clear(&d->ents[e]);
            }
        }
    }
    d->last_cookie += n;
    for (uint32_t k = 0; k < n; k++)
        rec_clear(&d->pending[k]);
    memmove(d->pending, d->pending + n, (d->npending - n) * sizeof d->pending[0]);
    memset(d->pending + d->npending - n, 0, n * sizeof d->pending[0]);
    d->npending -= n;
    struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = d->last_cookie};
    step(g, i, &in);
}

static void flush(struct group *g, uint32_t i)
{
    flush_n(g, i, g->disk[i].npending);
}

static void deliver_one(struct group *g)
{
    struct qmsg m = g->q[g->qhead];
    g->qhead = (g->qhead + 1) % 8192;
    g->qn--;
    if (m.to.kind == CONS_ADDR_CLIENT) {
        const struct cons_reply *res;
        g->client_msgs++;
        if (!g->done && nop_quorum_add(&g->quorum, m.from, m.buf, m.len, &res) == 1) {
            g->done = 1;
            cons_reply_copy(&g->result, res);
        }
    } else if (!(g->down >> m.to.id & 1)) {
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = cons_replica(m.from), .buf = m.buf, .len = m.len};
        step(g, (uint32_t)m.to.id, &in);
    }
    free(m.buf);
}

/* Delivers queued messages (and, with auto_flush, completes every disk)
 * until nothing moves; bounded. */
static void pump(struct group *g)
{
    for (int round = 0; round < 100000; round++) {
        if (g->qn) {
            deliver_one(g);
            continue;
        }
        int pending = 0;
        for (uint32_t i = 0; i < N && g->auto_flush; i++) {
            uint64_t before = g->disk[i].last_cookie;
            flush(g, i);
            pending |= g->disk[i].last_cookie != before;
        }
        if (!pending)
            return;
    }
    CHECK_MSG(0, "pump did not settle");
}

static void ticks(struct group *g, int n)
{
    for (int t = 0; t < n; t++) {
        g->now += 5;
        for (uint32_t i = 0; i < N; i++) {
            struct cons_input in = {.kind = CONS_IN_TICK};
            if (!(g->down >> i & 1))
                step(g, i, &in);
        }
        pump(g);
    }
}

static void boot(struct group *g, uint32_t i, enum nop_start_mode mode)
{
    struct nop_config c = {.n = N,
                           .id = i,
                           .log_cap = g->log_cap ? g->log_cap : 64, /* checkpoints every 16 */
                           .xfer_chunk = 256,
                           .xfer_window = 4,
                           .clients_max = 4,
                           .heartbeat_ns = 10,
                           .election_ns = 100,
                           .seed = ++g->incs,
                           .durable = 1};
    int err;
    struct disk *d = &g->disk[i];
    g->kv[i] = kv_mem_create(8);
    g->r[i] = nop_create(&c, kv_mem_sm(g->kv[i]), &err);
    CHECK_OK(err);
    g->down &= ~(1u << i);
    d->last_cookie = 0; /* cookies count per incarnation */
    if (mode == NOP_START_EMPTY)
        disk_wipe(d);
    if (mode == NOP_START_RESTORED) {
        CHECK(d->meta.buf != NULL);
        CHECK_OK(nop_restore_meta(g->r[i], d->meta.buf, d->meta.len));
        if (d->snap.buf)
            CHECK_OK(nop_restore_snapshot(g->r[i], d->snap.buf, d->snap.len));
        for (int k = 0; k < SLOTS; k++) {
            if (d->ents[k].buf && d->ents[k].index > d->snap.index)
                CHECK_OK(nop_restore_entry(g->r[i], d->ents[k].buf, d->ents[k].len));
        }
    }
    struct cons_outbox *ob;
    CHECK_OK(nop_start(g->r[i], mode, g->now, &ob));
    take(g, i, ob);
}

static void crash(struct group *g, uint32_t i)
{
    nop_destroy(g->r[i]);
    kv_mem_destroy(g->kv[i]);
    g->r[i] = NULL;
    g->down |= 1u << i;
    disk_drop_pending(&g->disk[i]); /* what the disk had not completed is lost */
}

static void stop(struct group *g)
{
    for (uint32_t i = 0; i < N; i++) {
        if (g->r[i])
            crash(g, i);
        disk_wipe(&g->disk[i]);
    }
    while (g->qn)
        deliver_one(g);
}

static void start(struct group *g, uint32_t log_cap)
{
    memset(g, 0, sizeof *g);
    g->result.data = g->result_data;
    g->result.cap = sizeof g->result_data;
    g->log_cap = log_cap;
    g->auto_flush = 1;
    for (uint32_t i = 0; i < N; i++)
        boot(g, i, NOP_START_FRESH);
    pump(g);
}

/* Sends one operation through the sequencer to every replica that is up
 * and pumps; the caller then waits for the quorum (g->done). */
static void send_op(struct group *g, uint8_t type, uint32_t key, uint64_t val)
{
    struct cons_op op;
    uint8_t buf[4096];
    char k[2] = {'k', (char)('a' + key)}, v[NOP_OP_MAX];
    uint32_t vlen = 0;
    if (type == CONS_OP_PUT)
        vlen = (uint32_t)snprintf(v, sizeof v, "v%llu", (unsigned long long)val);
    if (type == CONS_OP_PUT && g->pad > vlen) {
        CHECK(g->pad + sizeof k <= NOP_OP_MAX);
        memset(v + vlen, '.', g->pad - vlen);
        vlen = g->pad;
    }
    cons_op_init(&op, type, k, sizeof k, v, vlen, NULL, 0);
    op.client_id = CLIENT;
    op.req_no = ++g->req_no;
    nop_quorum_reset(&g->quorum, N, CLIENT, op.req_no);
    g->done = 0;
    uint64_t num = ++g->msgnum;
    int len = nop_encode_oum_request(buf, sizeof buf, g->session, num, &op);
    CHECK(len > 0);
    for (uint32_t i = 0; i < N; i++) {
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = {CONS_ADDR_OUM, 0}, .buf = buf, .len = (size_t)len};
        if (!(g->down >> i & 1))
            step(g, i, &in);
    }
    pump(g);
}

/* One operation to completion, resent like a client would (bounded). */
static const struct cons_reply *run_op(struct group *g, uint8_t type, uint32_t key, uint64_t val)
{
    send_op(g, type, key, val);
    for (int t = 0; t < 200 && !g->done; t++) {
        ticks(g, 1);
        if (!g->done && t % 20 == 19) {
            g->req_no--; /* the same request again */
            send_op(g, type, key, val);
        }
    }
    CHECK_MSG(g->done, "operation %u on key %u did not complete", type, key);
    return &g->result;
}

static void check_value(struct group *g, uint32_t key, uint64_t val)
{
    const struct cons_reply *rep = run_op(g, CONS_OP_GET, key, 0);
    char want[NOP_OP_MAX];
    int n = snprintf(want, sizeof want, "v%llu", (unsigned long long)val);
    if (g->pad > n) {
        memset(want + n, '.', (size_t)(g->pad - n));
        n = g->pad;
    }
    CHECK_EQ_I64(rep->status, 0);
    CHECK_MSG(rep->len == (uint32_t)n && memcmp(rep->data, want, (size_t)n) == 0,
              "key %u: got %.*s, want %.*s", key, (int)rep->len, (const char *)rep->data, n, want);
}

static int leader_normal(struct group *g)
{
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        if (g->down >> i & 1)
            continue;
        nop_status(g->r[i], &st);
        if (st.is_leader)
            return 1;
    }
    return 0;
}

/* 20 acknowledged puts over 3 keys (a checkpoint at 16), then put 21 on
 * key 0 acknowledged with only the leader's and one follower's disks
 * complete, and put 22 on key 1 never acknowledged. Returns the
 * replica whose disk missed put 21. */
static uint32_t acknowledged_then_crash_all(struct group *g, uint64_t last[3])
{
    start(g, 0);
    for (uint64_t k = 1; k <= 20; k++) {
        run_op(g, CONS_OP_PUT, (uint32_t)(k % 3), k);
        last[k % 3] = k;
    }
    ticks(g, 10);
    uint32_t leader = 0;
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(g->r[i], &st);
        leader = st.is_leader ? i : leader;
    }
    uint32_t follower = (leader + 1) % N, slow = (leader + 2) % N;
    g->auto_flush = 0;
    uint64_t before = g->client_msgs;
    send_op(g, CONS_OP_PUT, 0, 21);
    CHECK_EQ_U64(g->client_msgs, before); /* every reply waits for its disk */
    struct nop_stat ls;
    nop_status(g->r[leader], &ls);
    CHECK(ls.held >= 1 && ls.held_dropped == 0); /* the leader's result, at least */
    /* The leader executes (and answers) once the follower's durable
     * SYNC-REPLY committed the slot; its META with that commit point is
     * on its disk before the reply leaves: a second round of the same two
     * disks. The third replica's disk never completes. */
    for (int round = 0; round < 3 && !g->done; round++) {
        flush(g, leader);
        flush(g, follower);
        pump(g);
    }
    CHECK_MSG(g->done, "f+1 durable replicas including the leader acknowledge");
    last[0] = 21;
    send_op(g, CONS_OP_PUT, 1, 22); /* never durable, never acknowledged */
    CHECK(!g->done);
    for (uint32_t i = 0; i < N; i++)
        crash(g, i);
    while (g->qn)
        deliver_one(g); /* messages in flight reach nobody */
    g->auto_flush = 1;
    g->session++; /* the sequencer restarted too: a new session */
    g->msgnum = 0;
    return slow;
}

static void wait_for_leader(struct group *g)
{
    for (int t = 0; t < 400 && !leader_normal(g); t++)
        ticks(g, 1);
    CHECK_MSG(leader_normal(g), "the group elected no leader after the restart");
}

TEST(whole_group_restart_keeps_acknowledged_writes)
{
    static struct group g;
    uint64_t last[3] = {0};
    acknowledged_then_crash_all(&g, last);
    for (uint32_t i = 0; i < N; i++) {
        boot(&g, i, NOP_START_RESTORED);
        struct nop_stat st;
        nop_status(g.r[i], &st);
        CHECK_EQ_I64(st.status, NOP_VIEWCHANGE); /* its log counts: no recovery */
    }
    pump(&g);
    wait_for_leader(&g);
    for (uint32_t k = 0; k < 3; k++)
        check_value(&g, k, last[k]);
    run_op(&g, CONS_OP_PUT, 2, 30); /* and it takes new writes */
    check_value(&g, 2, 30);
    ticks(&g, 20);
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(g.r[i], &st);
        CHECK_EQ_I64(st.status, NOP_NORMAL);
        CHECK_EQ_U64(st.view.session, 1);
    }
    stop(&g);
}

TEST(whole_group_restart_with_one_disk_lost)
{
    static struct group g;
    uint64_t last[3] = {0};
    /* The replica whose disk missed put 21 keeps it; one of the two that
     * hold put 21 loses its disk: the other still brings it back. */
    uint32_t slow = acknowledged_then_crash_all(&g, last);
    uint32_t lost = (slow + 1) % N;
    for (uint32_t i = 0; i < N; i++) {
        boot(&g, i, i == lost ? NOP_START_EMPTY : NOP_START_RESTORED);
        struct nop_stat st;
        nop_status(g.r[i], &st);
        CHECK_EQ_I64(st.status, i == lost ? NOP_RECOVERING : NOP_VIEWCHANGE);
    }
    pump(&g);
    wait_for_leader(&g);
    for (uint32_t k = 0; k < 3; k++)
        check_value(&g, k, last[k]);
    ticks(&g, 40);
    struct nop_stat st;
    nop_status(g.r[lost], &st);
    CHECK_EQ_I64(st.status, NOP_NORMAL); /* recovered from the others */
    stop(&g);
}

TEST(durable_log_with_a_hole_is_refused)
{
    static struct group g;
    uint64_t last[3] = {0};
    uint32_t slow = acknowledged_then_crash_all(&g, last);
    struct disk *d = &g.disk[slow];
    int k = -1; /* drop the newest entry record above the snapshot */
    for (int e = 0; e < SLOTS; e++) {
        if (d->ents[e].buf && d->ents[e].index > d->snap.index &&
            (k < 0 || d->ents[e].index > d->ents[k].index))
            k = e;
    }
    CHECK(k >= 0);
    rec_clear(&d->ents[k]);
    struct nop_config c = {.n = N,
                           .id = slow,
                           .log_cap = 64,
                           .xfer_chunk = 256,
                           .xfer_window = 4,
                           .clients_max = 4,
                           .heartbeat_ns = 10,
                           .election_ns = 100,
                           .seed = 99,
                           .durable = 1};
    int err;
    struct kv_mem *kv = kv_mem_create(8);
    struct nop *r = nop_create(&c, kv_mem_sm(kv), &err);
    CHECK_OK(err);
    CHECK_OK(nop_restore_meta(r, d->meta.buf, d->meta.len));
    if (d->snap.buf)
        CHECK_OK(nop_restore_snapshot(r, d->snap.buf, d->snap.len));
    for (int e = 0; e < SLOTS; e++) {
        if (d->ents[e].buf && d->ents[e].index > d->snap.index)
            CHECK_OK(nop_restore_entry(r, d->ents[e].buf, d->ents[e].len));
    }
    struct cons_outbox *ob;
    CHECK_ERR(nop_start(r, NOP_START_RESTORED, 0, &ob), FK_EMALFORMED);
    nop_destroy(r);
    kv_mem_destroy(kv);
    stop(&g);
}

/* A log of 255 committed entries after the checkpoint (log_cap 1,024
 * checkpoints every 256) and 5 more on the leader's disk only (to a
 * fourth key; not acknowledged): after a whole-group restart a follower
 * rewrites the whole log for START-VIEW, more ENTRY items than one outbox
 * holds, so its persistence spans several steps and its messages wait for
 * the last one. */
TEST(whole_group_restart_with_a_log_longer_than_one_outbox)
{
    static struct group g;
    uint64_t last[3] = {0};
    start(&g, 1024);
    for (uint64_t k = 1; k <= 255; k++) {
        run_op(&g, CONS_OP_PUT, (uint32_t)(k % 3), k);
        last[k % 3] = k;
    }
    ticks(&g, 10);
    uint32_t leader = 0;
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(g.r[i], &st);
        leader = st.is_leader ? i : leader;
    }
    g.auto_flush = 0;
    for (uint64_t k = 256; k <= 260; k++)
        send_op(&g, CONS_OP_PUT, 3, k);
    flush(&g, leader);
    pump(&g);
    for (uint32_t i = 0; i < N; i++)
        crash(&g, i);
    g.auto_flush = 1;
    for (uint32_t i = 0; i < N; i++)
        boot(&g, i, NOP_START_RESTORED);
    pump(&g);
    wait_for_leader(&g);
    ticks(&g, 10);
    for (uint32_t k = 0; k < 3; k++)
        check_value(&g, k, last[k]);
    stop(&g);
}

/* The leader's disk stalls while it keeps sending SYNCs of 1 KiB entries:
 * its held ring fills (later messages are dropped like lost ones), then
 * the disk completes part of its queue, the oldest messages leave and new
 * ones wrap around the ring; once the disks catch up, everything held
 * leaves in order and the group serves as before. */
TEST(held_ring_fills_wraps_and_drains_in_order)
{
    static struct group g;
    start(&g, 0);
    g.pad = 1000;
    run_op(&g, CONS_OP_PUT, 0, 1);
    uint32_t leader = 0;
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(g.r[i], &st);
        leader = st.is_leader ? i : leader;
    }
    g.auto_flush = 0;
    for (uint64_t k = 2; k <= 400; k++) {
        send_op(&g, CONS_OP_PUT, (uint32_t)(k % 3), k);
        ticks(&g, 2);
    }
    struct nop_stat st;
    nop_status(g.r[leader], &st);
    CHECK_MSG(st.held_dropped > 0, "held %u, none dropped", st.held);
    for (int round = 0; round < 400 && g.disk[leader].npending; round++) {
        flush_n(&g, leader, 2); /* a slow disk: a few items per tick */
        pump(&g);
        ticks(&g, 1);
    }
    g.auto_flush = 1;
    pump(&g);
    ticks(&g, 20);
    nop_status(g.r[leader], &st);
    CHECK_EQ_U64(st.held, 0);
    for (uint32_t k = 0; k < 3; k++) {
        run_op(&g, CONS_OP_PUT, k, 100 + k);
        check_value(&g, k, 100 + k);
    }
    stop(&g);
}

CHECK_MAIN()
