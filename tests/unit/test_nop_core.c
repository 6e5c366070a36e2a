/* Unit tests for the NOPaxos core driven directly: three replicas on a
 * lossless in-test network fed by an in-test sequencer; a request gets f+1
 * matching replies including the leader's result; a dropped message is
 * resolved by gap agreement (a NO-OP everywhere); fills are NO-OPs without
 * it; a leader whose followers answer late keeps checkpointing and
 * confirms their logs by hashes; a follower behind the leader's checkpoint
 * is confirmed from the committed history or gets entries from the ring,
 * and one a whole ring behind gets the checkpoint; a sequencer failover causes a view change
 * into the new session; malformed input is rejected. */
#include "check.h"
#include "core_fix.h"
#include "fk_error.h"
#include "kv.h"
#include "nop.h"
#include "nop_internal.h" /* message types, to count SYNCs */

#include <stdio.h>
#include <stdlib.h>

#define N 3

enum { LAG_BEFORE = 1, LAG_AFTER = 2 };

struct qmsg {
    uint32_t from, len;
    uint8_t buf[256];
};

/* A group on the shared fixture (tests/core_fix.h): depth-first delivery,
 * no disks (NOPaxos' default mode answers without one; test_nop_restart.c
 * gives the replicas disks), and this test's own view of the traffic. */
struct group {
    struct cfx fx;
    int replies, results;
    struct nop_view last_view;
    uint64_t last_slot;
    struct cons_reply result; /* its data: result_data */
    uint8_t result_data[NOP_RESULT_MAX];
    struct nop_quorum q; /* the client's f+1 rule over every reply (when reset) */
    int completed;
    uint32_t hold;           /* replicas whose messages to the leader wait (release_held) */
    uint8_t leader_msg[256]; /* the last reply carrying a result, as sent */
    uint32_t leader_len;
    /* lag: messages from the followers to the leader wait for the next
     * multicast and reach the leader before it (LAG_BEFORE) or after it
     * (LAG_AFTER: the leader hears of a request only after it executed
     * the next one). followers_first: the OUM reaches the followers before
     * the leader. */
    int lag, followers_first;
    int full_syncs;       /* SYNC messages (entries, not hashes) the leader sent */
    int chunks;           /* state transfer CHUNKs the leader sent */
    uint64_t chunk_index; /* the index of the state the last one carried */
    uint32_t nlate;
    struct qmsg late[64], held[64];
    uint32_t nheld;
};

#define R(g, i) ((struct nop *)(g)->fx.core[i].impl)

static void on_reply(struct cfx *fx, uint32_t from, const struct cons_out_msg *m)
{
    struct group *g = (struct group *)fx;
    struct cons_reply rep;
    const uint8_t *data;
    int has;
    CHECK_OK(nop_decode_reply(m->buf, m->len, &g->last_view, &g->last_slot, &has, &rep, &data));
    g->replies++;
    const struct cons_reply *done;
    int rc = g->q.n ? nop_quorum_add(&g->q, from, m->buf, m->len, &done) : 0;
    CHECK(rc >= 0);
    if (has && m->len <= sizeof g->leader_msg) {
        memcpy(g->leader_msg, m->buf, m->len);
        g->leader_len = m->len;
    }
    if (rc == 1) {
        g->completed++;
        CHECK_EQ_U64(done->req_no, g->q.req_no);
    }
    if (has) { /* kept: its bytes lie in the message */
        g->results++;
        CHECK(rep.len <= sizeof g->result_data);
        g->result = rep;
        g->result.data = g->result_data;
        g->result.cap = sizeof g->result_data;
        if (rep.len)
            memcpy(g->result_data, data, rep.len);
    }
}

/* Counts the leader's SYNCs, and holds back or delays what followers send
 * the leader (lag, hold). */
static int on_route(struct cfx *fx, uint32_t from, const struct cons_out_msg *m)
{
    struct group *g = (struct group *)fx;
    struct cons_wire_hdr h;
    struct cons_rbuf body;
    if (from == 0 && cons_wire_open(m->buf, m->len, CONS_PROTO_NOP, NOP__TYPES, &h, &body) == 0) {
        g->full_syncs += h.type == NOP_SYNC;
        if (h.type == NOP_XFER && cons_r_u8(&body) == CONS_XFER_CHUNK) {
            (void)cons_r_u64(&body); /* nonce */
            g->chunk_index = cons_r_u64(&body);
            g->chunks++;
        }
    }
    struct qmsg *q = NULL;
    if (g->lag && from != 0 && m->to.id == 0) {
        CHECK(g->nlate < 64);
        q = &g->late[g->nlate++];
    } else if (g->hold >> from & 1 && m->to.id == 0) {
        CHECK(g->nheld < 64);
        q = &g->held[g->nheld++];
    }
    if (q == NULL)
        return 0;
    CHECK(m->len <= sizeof q->buf);
    q->from = from;
    q->len = (uint32_t)m->len;
    memcpy(q->buf, m->buf, m->len);
    return 1;
}

static void step(struct group *g, uint32_t i, const struct cons_input *in)
{
    cfx_step(&g->fx, i, in);
}

/* A fresh group; history: bytes of compacted entries each replica keeps. */
static void start_with(struct group *g, size_t history)
{
    memset(g, 0, sizeof *g);
    struct cons_core_config c = {.log_cap = 16,
                                 .history_bytes = history ? history : CONS_HISTORY_NONE,
                                 .xfer_chunk = 256,
                                 .xfer_window = 4,
                                 .clients_max = 4,
                                 .heartbeat_ns = 10,
                                 .election_ns = 100};
    cfx_init(&g->fx, CONS_PROTO_NOP, N, &c, CFX_DIRECT, CFX_DISK_NONE);
    g->fx.hooks.reply = on_reply;
    g->fx.hooks.route = on_route;
    cfx_start(&g->fx);
}

static void start(struct group *g)
{
    start_with(g, 0);
}

static void stop(struct group *g)
{
    cfx_stop(&g->fx);
}

/* The followers' messages of the last round, to the leader. */
static void release(struct group *g, uint8_t (*late)[256], const uint32_t *lens,
                    const uint32_t *froms, uint32_t nlate)
{
    for (uint32_t k = 0; k < nlate; k++) {
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = cons_replica(froms[k]), .buf = late[k], .len = lens[k]};
        step(g, 0, &in);
    }
}

/* Copies n queued messages out (stepping the leader refills the queue). */
static void copy_out(const struct qmsg *q, uint32_t n, uint8_t (*buf)[256], uint32_t *lens,
                     uint32_t *froms)
{
    for (uint32_t k = 0; k < n; k++) {
        memcpy(buf[k], q[k].buf, q[k].len);
        lens[k] = q[k].len;
        froms[k] = q[k].from;
    }
}

/* The held messages, in order, to the leader. */
static void release_held(struct group *g)
{
    static uint8_t held[64][256];
    uint32_t n = g->nheld, lens[64], froms[64];
    copy_out(g->held, n, held, lens, froms);
    g->nheld = 0;
    g->hold = 0;
    release(g, held, lens, froms, n);
}

/* The sequencer: stamps op (a fill when NULL) and delivers it, or a drop
 * notice to `drops`. */
static void multicast(struct group *g, const struct cons_op *op, uint32_t drops_mask)
{
    uint64_t num = cfx_oum_next(&g->fx);
    static uint8_t late[64][256]; /* the queue, copied out: stepping refills it */
    uint32_t nlate = g->nlate, lens[64], froms[64];
    copy_out(g->late, nlate, late, lens, froms);
    g->nlate = 0;
    if (g->lag == LAG_BEFORE)
        release(g, late, lens, froms, nlate);
    for (uint32_t k = 0; k < N; k++) {
        uint32_t i = g->followers_first ? N - 1 - k : k;
        cfx_oum_to(&g->fx, i, num, op, drops_mask >> i & 1);
    }
    if (g->lag == LAG_AFTER)
        release(g, late, lens, froms, nlate);
}

static struct cons_op put(uint64_t req, const char *val)
{
    struct cons_op op;
    cons_op_init(&op, CONS_OP_PUT, "k", 1, val, (uint32_t)strlen(val), NULL, 0);
    op.client_id = 5;
    op.req_no = req;
    return op;
}

/* Request i: a put of key k to the decimal i, client 5's request i. */
static void multicast_put(struct group *g, int i)
{
    char v[12]; /* any int, sign included */
    snprintf(v, sizeof v, "%d", i);
    struct cons_op op = put((uint64_t)i, v);
    multicast(g, &op, 0);
}

static void ticks(struct group *g, int n)
{
    cfx_ticks(&g->fx, n, 5);
}

TEST(normal_operation_f_plus_one_replies)
{
    static struct group g;
    start(&g);
    struct cons_op op = put(1, "a");
    nop_quorum_reset(&g.q, N, 5, 1);
    multicast(&g, &op, 0);
    CHECK_EQ_I64(g.replies, 3);
    CHECK_EQ_I64(g.completed, 2); /* f+1 with the leader's, then the third reply */
    CHECK_EQ_I64(g.results, 1);   /* only the leader (replica 0 in view 0) executes */
    CHECK_EQ_U64(g.last_slot, 1);
    CHECK_EQ_I64(g.result.status, 0);
    ticks(&g, 5); /* synchronization commits; followers execute */
    struct nop_stat st;
    nop_status(R(&g, 1), &st);
    CHECK_EQ_U64(st.commit, 1);
    CHECK_EQ_U64(st.executed, 1);
    stop(&g);
}

/* A leader stops taking requests half a ring past its checkpoint until
 * its followers confirmed what it executed. Synchronization is eager
 * (SYNC_SIG once a follower is log_cap / 16 behind), so a stream of
 * requests with no timer at all keeps being served, and the followers'
 * commit point keeps up; with syncs only per heartbeat this stream stopped
 * after half a ring (8 requests here) until the next tick. */
TEST(sustained_load_needs_no_heartbeat)
{
    static struct group g;
    start(&g);
    for (int i = 1; i <= 80; i++) {
        multicast_put(&g, i);
        CHECK_EQ_I64(g.results, i);
    }
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(R(&g, i), &st);
        CHECK_EQ_U64(st.log_len, 80);
        CHECK(st.commit >= 80 - 16 / 16);
    }
    stop(&g);
}

/* The leader hears its followers one request late, always, so its commit
 * point never reaches what it executed. It still checkpoints (at a slot it
 * executed a quarter ring past the last checkpoint, once that slot
 * commits) and so never stops at half a ring: every request is answered
 * at once through five rings. Before, it waited for the commit point to
 * reach what it executed, which here happens only after it stopped. */
TEST(leader_checkpoints_behind_a_moving_commit_point)
{
    static struct group g;
    start(&g);
    g.lag = LAG_BEFORE;
    for (int i = 1; i <= 80; i++) {
        multicast_put(&g, i);
        CHECK_EQ_I64(g.results, i);
        struct nop_stat st;
        nop_status(R(&g, 0), &st);
        CHECK(st.commit < st.executed);
    }
    stop(&g);
}

/* Followers that hold every entry (from the OUM) need only hashes to
 * confirm them, also when a heartbeat's sync overlaps an eager one (the
 * leader hears of each one request late here). The answer to the second,
 * no further than the first's, is still progress on what that message
 * asked; it once counted as none, and the follower got entries (SYNC) and
 * could be left waiting for the next heartbeat. */
TEST(overlapping_syncs_send_no_entries)
{
    static struct group g;
    start(&g);
    g.lag = LAG_AFTER;
    g.followers_first = 1;
    for (int i = 1; i <= 40; i++) {
        multicast_put(&g, i);
        CHECK_EQ_I64(g.results, i);
        if (i % 3 == 0)
            ticks(&g, 2); /* a heartbeat: a sync to each follower */
    }
    CHECK_EQ_I64(g.full_syncs, 0);
    stop(&g);
}

TEST(gap_agreement_commits_noop)
{
    static struct group g;
    start(&g);
    struct cons_op a = put(1, "a"), b = put(2, "b");
    multicast(&g, &a, 1u << 0 | 1u << 2); /* the leader and replica 2 miss it */
    multicast(&g, &b, 0);
    ticks(&g, 5);
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(R(&g, i), &st);
        CHECK_EQ_U64(st.log_len, 2);
        CHECK_EQ_U64(st.commit, 2);
    }
    /* Slot 1 is the same NO-OP everywhere, though replica 1 had the request. */
    uint64_t h0, h1;
    CHECK(nop_committed_hash(R(&g, 0), 1, &h0) && nop_committed_hash(R(&g, 1), 1, &h1));
    CHECK_EQ_U64(h0, h1);
    CHECK_EQ_I64(g.result.req_no, 2);
    stop(&g);
}

/* A fill (nop.h: a number that carries no request, the leading fragments
 * of a large request on kv.oum) is a NO-OP in its slot at every replica
 * that received it, with no reply and no round of gap agreement: the
 * request right behind it is answered at once. Replicas that missed a fill
 * end with the leader's NO-OP in its slot. */
TEST(fills_are_noops_without_agreement)
{
    static struct group g;
    start(&g);
    multicast(&g, NULL, 0);
    /* The followers hear nothing now, so a leader that ran gap agreement
     * for the second fill would wait for them and not execute request 1. */
    g.fx.down = 1u << 1 | 1u << 2;
    multicast(&g, NULL, 0);
    struct cons_op a = put(1, "a");
    multicast(&g, &a, 0);
    CHECK_EQ_I64(g.results, 1);
    CHECK_EQ_U64(g.last_slot, 3);
    CHECK_EQ_I64(g.replies, 1); /* the fills themselves were answered by nobody */
    /* Back: synchronization brings the followers' logs up to the leader's
     * (3 slots, under the 4 after which a replica of this ring checkpoints
     * and compacts, so every slot can still be compared). */
    g.fx.down = 0;
    ticks(&g, 5);
    uint64_t h[N][3];
    for (uint32_t i = 0; i < N; i++) {
        struct nop_stat st;
        nop_status(R(&g, i), &st);
        CHECK_EQ_U64(st.log_len, 3);
        CHECK_EQ_U64(st.commit, 3);
        for (uint64_t k = 1; k <= 3; k++)
            CHECK(nop_committed_hash(R(&g, i), k, &h[i][k - 1]));
    }
    for (uint32_t i = 1; i < N; i++)
        for (uint32_t k = 0; k < 3; k++)
            CHECK_EQ_U64(h[i][k], h[0][k]);
    CHECK(h[0][0] == h[0][1] && h[0][1] != h[0][2]); /* two NO-OPs, then the request */
    stop(&g);
}

TEST(session_change_starts_new_view)
{
    static struct group g;
    start(&g);
    struct cons_op a = put(1, "a");
    multicast(&g, &a, 0);
    g.fx.session = 1; /* the sequencer failed over */
    g.fx.msgnum = 0;
    struct cons_op b = put(2, "b");
    multicast(&g, &b, 0); /* triggers the view change; the message itself is lost */
    ticks(&g, 10);
    struct nop_stat st;
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.status, NOP_NORMAL);
    CHECK_EQ_U64(st.view.session, 1);
    int before = g.results;
    multicast(&g, &b, 0);
    CHECK_EQ_I64(g.results, before + 1);
    CHECK_EQ_U64(g.last_view.session, 1);
    stop(&g);
}

/* A leader about to stop hands over (nop_transfer): the next view, led
 * by replica 1, starts at once, without the view-change timeout, keeps
 * what was committed and serves. */
TEST(leader_hands_over_without_a_timeout)
{
    static struct group g;
    start(&g);
    struct cons_op a = put(1, "a");
    multicast(&g, &a, 0);
    ticks(&g, 5); /* committed everywhere */
    uint64_t before = g.fx.now;
    struct cons_outbox *ob;
    CHECK_OK(nop_transfer(R(&g, 0), g.fx.now, &ob));
    CHECK_OK(nop_seal(R(&g, 0)));
    CHECK(ob->nmsgs >= 2);
    g.fx.down |= 1u << 0; /* it stops: only its messages go out */
    cfx_deliver(&g.fx, 0, ob);
    cfx_crash(&g.fx, 0);
    struct nop_stat st;
    nop_status(R(&g, 1), &st);
    CHECK_EQ_U64(st.status, NOP_NORMAL);
    CHECK_EQ_U64(st.view.leader_num, 1);
    CHECK_EQ_U64(g.fx.now, before); /* no time passed: no timeout ran */
    struct cons_op b = put(2, "b");
    int results = g.results;
    multicast(&g, &b, 0);
    CHECK_EQ_I64(g.results, results + 1); /* the new leader executes it */
    CHECK_EQ_U64(g.last_view.leader_num, 1);
    /* A follower has nothing to hand over. */
    CHECK_OK(nop_transfer(R(&g, 2), g.fx.now, &ob));
    CHECK_EQ_U64(ob->nmsgs, 0);
    stop(&g);
}

TEST(quorum_rejects_results_from_followers)
{
    static struct group g;
    start(&g);
    struct cons_op op = put(1, "a");
    nop_quorum_reset(&g.q, N, 5, 1);
    multicast(&g, &op, 0);
    CHECK(g.completed >= 1);
    /* The leader's bytes attributed to another replica: a result from a
     * follower is a protocol violation; garbage is malformed; another
     * request's reply is ignored. */
    static struct nop_quorum q;
    const struct cons_reply *res;
    CHECK(g.leader_len > 0);
    nop_quorum_reset(&q, N, 5, 1);
    CHECK_ERR(nop_quorum_add(&q, 1, g.leader_msg, g.leader_len, &res), FK_EPROTO);
    CHECK_EQ_I64(nop_quorum_add(&q, 0, g.leader_msg, g.leader_len, &res), 0); /* 1 of 2 */
    nop_quorum_reset(&q, N, 5, 2);
    CHECK_EQ_I64(nop_quorum_add(&q, 0, g.leader_msg, g.leader_len, &res), 0); /* not req 2 */
    uint8_t junk[40] = {0};
    CHECK_ERR(nop_quorum_add(&q, 1, junk, sizeof junk, &res), FK_EMALFORMED);
    CHECK_ERR(nop_quorum_add(&q, 7, junk, sizeof junk, &res), FK_EMALFORMED);
    stop(&g);
}

TEST(compaction_and_state_transfer)
{
    static struct group g;
    start(&g);           /* log_cap 16: checkpoints every 4 committed slots */
    g.fx.down = 1u << 2; /* replica 2 hears nothing for a while */
    char val[8];
    for (int i = 1; i <= 40; i++) {
        snprintf(val, sizeof val, "v%d", i);
        struct cons_op op = put((uint64_t)i, val);
        multicast(&g, &op, 1u << 2);
        ticks(&g, 1);
    }
    ticks(&g, 10);
    struct nop_stat st0, st2;
    nop_status(R(&g, 0), &st0);
    CHECK_EQ_U64(st0.log_len, 40);
    CHECK_EQ_U64(st0.commit, 40);
    nop_status(R(&g, 2), &st2);
    CHECK_EQ_U64(st2.log_len, 0);
    uint64_t h;
    CHECK(!nop_committed_hash(R(&g, 0), 1, &h)); /* compacted */
    g.fx.down = 0; /* back: the leader's sync sends its checkpoint, then entries */
    ticks(&g, 10);
    nop_status(R(&g, 2), &st2);
    CHECK_EQ_U64(st2.log_len, 40);
    CHECK_EQ_U64(st2.commit, 40);
    CHECK_EQ_U64(st2.executed, 40);
    CHECK_EQ_U64(kv_mem_count(g.fx.kv[2]), 1);
    nop_status(R(&g, 0), &st0);
    CHECK(st0.syncs[NOP_SYNC_KIND_STATE] >= 1 && st0.syncs[NOP_SYNC_KIND_HASHES] >= 1);
    CHECK_EQ_U64(st0.stalls, 0);
    stop(&g);
}

/* Replica i holds, committed and executed n slots; the leader sent no
 * checkpoint (STATE) and never stopped at half a ring. */
static void caught_up_without_state(struct group *g, uint32_t i, uint64_t n)
{
    struct nop_stat st, st0;
    nop_status(R(g, i), &st);
    CHECK_EQ_U64(st.log_len, n);
    CHECK_EQ_U64(st.commit, n);
    CHECK_EQ_U64(st.executed, n);
    nop_status(R(g, 0), &st0);
    CHECK_EQ_U64(st0.syncs[NOP_SYNC_KIND_STATE], 0);
    CHECK_EQ_U64(st0.stalls, 0);
}

/* A follower that holds every entry but answers late, so that the leader
 * compacted past what it confirmed, is confirmed by the hashes of the
 * committed history: no state transfer and no entries. (It used to get
 * the whole checkpoint, which on a busy machine cost it more than it was
 * behind: up to 61 state transfers in a 5 s YCSB run.) */
TEST(follower_behind_the_checkpoint_is_confirmed_by_hashes)
{
    static struct group g;
    start(&g); /* log_cap 16: checkpoints every 4 committed slots */
    g.hold = 1u << 2;
    g.followers_first = 1; /* so that hashes always find the entries */
    for (int i = 1; i <= 10; i++) {
        multicast_put(&g, i);
        CHECK_EQ_I64(g.results, i);
    }
    uint64_t h;
    CHECK(!nop_committed_hash(R(&g, 0), 1, &h)); /* compacted past replica 2 */
    CHECK(g.nheld >= 1);
    release_held(&g); /* its late answers; the leader syncs it from there */
    caught_up_without_state(&g, 2, 10);
    CHECK_EQ_I64(g.full_syncs, 0);
    stop(&g);
}

/* A follower that missed entries the leader compacted, while the ring
 * still holds them, gets them from the ring (SYNC), not the checkpoint;
 * one behind a whole ring gets the checkpoint (compaction_and_state_transfer). */
TEST(follower_missing_compacted_entries_gets_them_from_the_ring)
{
    static struct group g;
    start(&g);
    g.fx.down = 1u << 2;
    for (int i = 1; i <= 10; i++)
        multicast_put(&g, i);
    uint64_t h;
    CHECK(!nop_committed_hash(R(&g, 0), 1, &h));
    g.fx.down = 0;
    ticks(&g, 10);
    caught_up_without_state(&g, 2, 10);
    CHECK_EQ_U64(kv_mem_count(g.fx.kv[2]), 1);
    CHECK(g.full_syncs >= 1);
    stop(&g);
}

/* A follower behind the ring and the hashes, within the history of
 * compacted entries, gets the entries from it (send_past): no state
 * transfer. It answers none of those requests (committed a ring ago). */
TEST(follower_behind_the_ring_gets_entries_from_the_history)
{
    static struct group g;
    start_with(&g, 64u << 10);
    g.fx.down = 1u << 2;
    for (int i = 1; i <= 40; i++) {
        multicast_put(&g, i);
        ticks(&g, 1);
    }
    uint64_t h;
    CHECK(!nop_committed_hash(R(&g, 0), 1, &h)); /* compacted, and no hash left */
    int replies = g.replies;
    g.fx.down = 0;
    ticks(&g, 10);
    caught_up_without_state(&g, 2, 40);
    CHECK_EQ_U64(kv_mem_count(g.fx.kv[2]), 1);
    struct nop_stat st0;
    nop_status(R(&g, 0), &st0);
    CHECK(st0.syncs[NOP_SYNC_KIND_PAST] >= 1);
    struct nop_stat st2;
    nop_status(R(&g, 2), &st2);
    CHECK_EQ_U64(st2.xfer.started, 0);
    CHECK_MSG(g.replies - replies < 40 - 16, "%d replies", g.replies - replies);
    stop(&g);
}

/* Replica 2 asks the leader for a state (a transfer REQ: u8 kind, u64
 * nonce, u64 min_index, u32 next, u8 again; cons_xfer.h). */
static void ask_leader_for_state(struct group *g)
{
    uint8_t buf[64];
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, sizeof buf);
    cons_wire_begin(&w, CONS_PROTO_NOP, NOP_XFER, 2, 0);
    cons_w_u8(&w, CONS_XFER_REQ);
    cons_w_u64(&w, 77);
    cons_w_u64(&w, 0);
    cons_w_u32(&w, 0);
    cons_w_u8(&w, 0);
    int len = cons_wire_finish(&w);
    CHECK(len > 0);
    cfx_send(&g->fx, 2, 0, buf, (size_t)len);
}

/* A leader asked for a state while its machine is ahead of its commit
 * point (speculative execution) rolls back to the commit point and
 * executes only committed slots until it sends a view: held instead
 * until the commit point passed it, the view could wait forever when the
 * followers fetching a state cannot log what would commit it (simulator
 * seed 7087870393583). Once sending, it executes its log again and
 * answers those clients again, with the same results. */
TEST(leader_asked_for_a_state_ahead_of_its_commit_point_rolls_back_and_serves)
{
    static struct group g;
    start(&g);
    multicast_put(&g, 1);
    multicast_put(&g, 2);
    ticks(&g, 5);
    struct nop_stat st;
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.commit, 2);
    g.fx.down = 1u << 1 | 1u << 2; /* nothing more commits */
    for (int i = 3; i <= 6; i++)
        multicast_put(&g, i);
    CHECK_EQ_I64(g.results, 6);
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.executed, 6);
    CHECK_EQ_U64(st.commit, 2);

    ask_leader_for_state(&g); /* its view (index 6) would be held: roll back */
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.executed, 2);
    CHECK_EQ_U64(st.holds, 1);
    CHECK_EQ_I64(g.chunks, 0);
    multicast_put(&g, 7); /* logged, not executed: not committed */
    CHECK_EQ_I64(g.results, 6);
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.executed, 2);
    CHECK_EQ_U64(st.log_len, 7);

    ask_leader_for_state(&g); /* again: a view at the commit point, sent */
    CHECK(g.chunks >= 1);
    CHECK_EQ_U64(g.chunk_index, 2);
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.executed, 7);   /* executing its log again */
    CHECK_EQ_I64(g.results, 6 + 5); /* 3..6 again, and 7 */

    g.fx.down = 0;
    ticks(&g, 20);
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.commit, 7);
    CHECK_EQ_U64(st.holds, 1);
    CHECK(cfx_same_pairs(&g.fx, 0, 1));
    stop(&g);
}

/* With no follower answering, the leader executes three quarters of a
 * ring (12 of 16) and then stops taking requests until f+1 confirm: one
 * stall, counted once however many requests wait. */
TEST(leader_stalls_at_three_quarters_of_a_ring_without_followers)
{
    static struct group g;
    start(&g);
    g.fx.down = 1u << 1 | 1u << 2;
    for (int i = 1; i <= 16; i++)
        multicast_put(&g, i);
    CHECK_EQ_I64(g.results, 12);
    struct nop_stat st;
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.stalls, 1);
    stop(&g);
}

/* A leader paused at its stop gap keeps what the OUM delivers meanwhile
 * and executes all of it once its followers are back: with a buffer of
 * 64 messages, the rest were dropped (gap agreement NO-OPs, the clients
 * resending 100 ms later). */
TEST(paused_leader_buffers_what_arrives_and_drops_nothing)
{
    static struct group g;
    start(&g);
    g.fx.down = 1u << 1 | 1u << 2;
    for (int i = 1; i <= 12 + 200; i++)
        multicast_put(&g, i);
    CHECK_EQ_I64(g.results, 12);
    g.fx.down = 0;
    ticks(&g, 200);
    CHECK_EQ_I64(g.results, 12 + 200); /* a dropped one has no result */
    struct nop_stat st;
    nop_status(R(&g, 0), &st);
    CHECK_EQ_U64(st.log_len, 12 + 200);
    CHECK_EQ_U64(st.stalls, 1);
    stop(&g);
}

TEST(malformed_and_misuse)
{
    static struct group g;
    start(&g);
    uint8_t junk[300];
    uint64_t s = 3;
    struct cons_outbox *ob;
    for (int round = 0; round < 3000; round++) {
        size_t len = (size_t)(s % sizeof junk);
        for (size_t i = 0; i < sizeof junk; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            junk[i] = (uint8_t)(s >> 56);
        }
        if (round % 2) {
            uint16_t magic = CONS_WIRE_MAGIC;
            memcpy(junk, &magic, 2);
            junk[2] = CONS_WIRE_VERSION;
            junk[3] = CONS_PROTO_NOP;
            uint32_t body = len > 24 ? (uint32_t)(len - 24) : 0;
            memcpy(junk + 12, &body, 4);
        }
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = cons_replica(1), .buf = junk, .len = len};
        int rc = nop_step(R(&g, 0), &in, 0, &ob);
        CHECK(rc == FK_EMALFORMED || rc == 0);
        CHECK_OK(nop_seal(R(&g, 0)));
        nop_invariants(R(&g, 0));
    }
    uint8_t buf[128];
    int len = nop_encode_oum_drop(buf, sizeof buf, 0, 1);
    struct cons_input spoof = {
        .kind = CONS_IN_MSG, .from = cons_replica(1), .buf = buf, .len = (size_t)len};
    CHECK_ERR(nop_step(R(&g, 0), &spoof, 0, &ob), FK_EMALFORMED); /* OUM only from the OUM */
    struct cons_input persisted = {.kind = CONS_IN_PERSISTED, .cookie = 1u << 30};
    CHECK_ERR(nop_step(R(&g, 0), &persisted, 0, &ob), FK_EINVAL); /* never issued */
    struct nop_config bad = {.n = 4,
                             .log_cap = 64,
                             .clients_max = 4,
                             .xfer_chunk = 256,
                             .xfer_window = 4,
                             .heartbeat_ns = 1,
                             .election_ns = 10};
    int err;
    CHECK(nop_create(&bad, kv_mem_sm(g.fx.kv[0]), &err) == NULL);
    CHECK_EQ_I64(err, FK_EINVAL);
    stop(&g);
}

CHECK_MAIN()
