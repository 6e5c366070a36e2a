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
#include "core_fix.h"
#include "fk_error.h"
#include "kv.h"
#include "nop.h"

#include <stdio.h>
#include <stdlib.h>

#define N      3
#define CLIENT 5

/* A group on the shared fixture (tests/core_fix.h): a message queue
 * between replicas, disks that complete persists only when flushed (or,
 * with auto_flush, once the queue is empty), and a client that collects
 * f+1 replies. */
struct group {
    struct cfx fx;
    uint64_t req_no, client_msgs;
    int done;
    uint16_t pad; /* values padded with '.' to this many bytes */
    struct nop_quorum quorum;
    struct cons_reply result; /* a copy of the quorum's, in result_data */
    uint8_t result_data[NOP_RESULT_MAX];
};

#define R(g, i) ((struct nop *)(g)->fx.core[i].impl)

static void on_reply(struct cfx *fx, uint32_t from, const struct cons_out_msg *m)
{
    struct group *g = (struct group *)fx;
    const struct cons_reply *res;
    g->client_msgs++;
    if (!g->done && nop_quorum_add(&g->quorum, from, m->buf, m->len, &res) == 1) {
        g->done = 1;
        cons_reply_copy(&g->result, res);
    }
}

static void flush_n(struct group *g, uint32_t i, uint32_t n)
{
    cfx_flush(&g->fx, i, n);
}

static void flush(struct group *g, uint32_t i)
{
    cfx_flush_all(&g->fx, i);
}

static void pump(struct group *g)
{
    cfx_pump(&g->fx);
}

static void ticks(struct group *g, int n)
{
    cfx_ticks(&g->fx, n, 5);
}

static void boot(struct group *g, uint32_t i, enum nop_start_mode mode)
{
    cfx_boot(&g->fx, i, (enum cons_start_mode)mode);
}

/* The process dies, and its machine with it (the disk restores it). */
static void crash(struct group *g, uint32_t i)
{
    cfx_crash(&g->fx, i);
    kv_mem_destroy(g->fx.kv[i]);
    g->fx.kv[i] = NULL;
}

static void stop(struct group *g)
{
    cfx_stop(&g->fx);
}

static void start(struct group *g, uint32_t log_cap)
{
    memset(g, 0, sizeof *g);
    g->result.data = g->result_data;
    g->result.cap = sizeof g->result_data;
    struct cons_core_config c = {.log_cap = log_cap ? log_cap : 64, /* checkpoints every 16 */
                                 .history_bytes = CONS_HISTORY_NONE,
                                 .xfer_chunk = 256,
                                 .xfer_window = 4,
                                 .clients_max = 4,
                                 .heartbeat_ns = 10,
                                 .election_ns = 100,
                                 .durable = 1};
    cfx_init(&g->fx, CONS_PROTO_NOP, N, &c, CFX_QUEUED, CFX_DISK_MANUAL);
    g->fx.hooks.reply = on_reply;
    g->fx.auto_flush = 1;
    for (uint32_t i = 0; i < N; i++)
        boot(g, i, NOP_START_FRESH);
    pump(g);
}

/* Sends one operation through the sequencer to every replica that is up
 * and pumps; the caller then waits for the quorum (g->done). */
static void send_op(struct group *g, uint8_t type, uint32_t key, uint64_t val)
{
    struct cons_op op;
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
    uint64_t num = cfx_oum_next(&g->fx);
    for (uint32_t i = 0; i < N; i++)
        cfx_oum_to(&g->fx, i, num, &op, 0);
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
        if (g->fx.down >> i & 1)
            continue;
        nop_status(R(g, i), &st);
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
        nop_status(R(g, i), &st);
        leader = st.is_leader ? i : leader;
    }
    uint32_t follower = (leader + 1) % N, slow = (leader + 2) % N;
    g->fx.auto_flush = 0;
    uint64_t before = g->client_msgs;
    send_op(g, CONS_OP_PUT, 0, 21);
    CHECK_EQ_U64(g->client_msgs, before); /* every reply waits for its disk */
    struct nop_stat ls;
    nop_status(R(g, leader), &ls);
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
    cfx_pump(&g->fx); /* messages in flight reach nobody */
    g->fx.auto_flush = 1;
    g->fx.session++; /* the sequencer restarted too: a new session */
    g->fx.msgnum = 0;
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
        nop_status(R(&g, i), &st);
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
        nop_status(R(&g, i), &st);
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
        nop_status(R(&g, i), &st);
        CHECK_EQ_I64(st.status, i == lost ? NOP_RECOVERING : NOP_VIEWCHANGE);
    }
    pump(&g);
    wait_for_leader(&g);
    for (uint32_t k = 0; k < 3; k++)
        check_value(&g, k, last[k]);
    ticks(&g, 40);
    struct nop_stat st;
    nop_status(R(&g, lost), &st);
    CHECK_EQ_I64(st.status, NOP_NORMAL); /* recovered from the others */
    stop(&g);
}

/* A follower restarted from its durable disk while the rest of the group
 * served on asks the leader of the view it was normal in for the view's
 * log and rejoins that view (nop_durable.c, point 3): no view change, the
 * same leader, the writes made while it was down in its log, and it
 * takes part in the next ones. Restarted so before, it moved the group to
 * a new view with a new leader. */
TEST(follower_restart_rejoins_the_leaders_view)
{
    static struct group g;
    start(&g, 0);
    for (uint64_t k = 1; k <= 5; k++)
        run_op(&g, CONS_OP_PUT, (uint32_t)(k % 3), k);
    ticks(&g, 10);
    uint32_t leader = 0;
    struct nop_stat st, was;
    for (uint32_t i = 0; i < N; i++) {
        nop_status(R(&g, i), &st);
        leader = st.is_leader ? i : leader;
    }
    nop_status(R(&g, leader), &was);
    uint32_t f = (leader + 1) % N;
    crash(&g, f);
    for (uint64_t k = 6; k <= 10; k++) /* the leader and the other follower */
        run_op(&g, CONS_OP_PUT, (uint32_t)(k % 3), k);
    boot(&g, f, NOP_START_RESTORED);
    nop_status(R(&g, f), &st);
    CHECK_EQ_I64(st.status, NOP_VIEWCHANGE);
    CHECK_EQ_U64(st.view.leader_num, was.view.leader_num); /* its persisted view, not above */
    pump(&g);
    ticks(&g, 5);
    nop_status(R(&g, f), &st);
    CHECK_EQ_I64(st.status, NOP_NORMAL);
    CHECK_EQ_U64(st.view.leader_num, was.view.leader_num);
    CHECK_EQ_U64(st.view.session, was.view.session);
    CHECK_EQ_U64(st.leader, leader);
    struct nop_stat ls;
    nop_status(R(&g, leader), &ls);
    CHECK(ls.is_leader && ls.view.leader_num == was.view.leader_num);
    CHECK(st.log_len >= ls.commit); /* the writes made while it was down */
    /* It serves in the view: with the other follower down, it is the f+1-th. */
    crash(&g, (leader + 2) % N);
    run_op(&g, CONS_OP_PUT, 1, 11);
    check_value(&g, 1, 11);
    check_value(&g, 0, 9);
    stop(&g);
}

TEST(durable_log_with_a_hole_is_refused)
{
    static struct group g;
    uint64_t last[3] = {0};
    uint32_t slow = acknowledged_then_crash_all(&g, last);
    struct cfx_disk *d = &g.fx.disk[slow];
    int k = -1; /* drop the newest entry record above the snapshot */
    for (int e = 0; e < CFX_SLOTS; e++) {
        if (d->ents[e].buf && d->ents[e].index > d->snap.index &&
            (k < 0 || d->ents[e].index > d->ents[k].index))
            k = e;
    }
    CHECK(k >= 0);
    cfx_rec_clear(&d->ents[k]);
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
    for (int e = 0; e < CFX_SLOTS; e++) {
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
        nop_status(R(&g, i), &st);
        leader = st.is_leader ? i : leader;
    }
    g.fx.auto_flush = 0;
    for (uint64_t k = 256; k <= 260; k++)
        send_op(&g, CONS_OP_PUT, 3, k);
    flush(&g, leader);
    pump(&g);
    for (uint32_t i = 0; i < N; i++)
        crash(&g, i);
    g.fx.auto_flush = 1;
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
        nop_status(R(&g, i), &st);
        leader = st.is_leader ? i : leader;
    }
    g.fx.auto_flush = 0;
    for (uint64_t k = 2; k <= 400; k++) {
        send_op(&g, CONS_OP_PUT, (uint32_t)(k % 3), k);
        ticks(&g, 2);
    }
    struct nop_stat st;
    nop_status(R(&g, leader), &st);
    CHECK_MSG(st.held_dropped > 0, "held %u, none dropped", st.held);
    for (int round = 0; round < 400 && g.fx.disk[leader].npending; round++) {
        flush_n(&g, leader, 2); /* a slow disk: a few items per tick */
        pump(&g);
        ticks(&g, 1);
    }
    g.fx.auto_flush = 1;
    pump(&g);
    ticks(&g, 20);
    nop_status(R(&g, leader), &st);
    CHECK_EQ_U64(st.held, 0);
    for (uint32_t k = 0; k < 3; k++) {
        run_op(&g, CONS_OP_PUT, k, 100 + k);
        check_value(&g, k, 100 + k);
    }
    stop(&g);
}

CHECK_MAIN()
