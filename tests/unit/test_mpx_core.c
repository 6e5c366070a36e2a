/* Unit tests for the Multi-Paxos core driven directly (the shared fixture,
 * tests/core_fix.h): a three-replica group on a lossless in-test network
 * elects a leader and serves a put and a get; malformed input is rejected without changing
 * anything; restore rejects bad records and misuse. */
#include "check.h"
#include "cons_wire.h"
#include "core_fix.h"
#include "fk_error.h"
#include "kv.h"
#include "mpx.h"

#include <stdlib.h>

#define N 3

/* A group on the shared fixture (tests/core_fix.h): depth-first delivery,
 * every persist durable at once. */
struct group {
    struct cfx fx;
    struct cons_reply last_reply; /* its data: last_data */
    uint8_t last_data[CONS_REPLY_MAX];
    int replies;
};

#define R(g, i) ((struct mpx *)(g)->fx.core[i].impl)

static void cfg_for(struct mpx_config *c, uint32_t id)
{
    memset(c, 0, sizeof *c);
    c->n = N;
    c->id = id;
    c->log_cap = 16;
    c->window = 4;
    c->batch_max = 2;
    c->pending_max = 8;
    c->clients_max = 4;
    c->xfer_chunk = 64;
    c->xfer_window = 2;
    c->arena_bytes = 1 << 16;
    c->heartbeat_ns = 10;
    c->election_ns = 50 + 20 * id;
    c->seed = id + 1;
}

/* A reply: its bytes lie in the message, so keep a copy. */
static void on_reply(struct cfx *fx, uint32_t from, const struct cons_out_msg *m)
{
    struct group *g = (struct group *)fx;
    uint32_t hint;
    const uint8_t *data;
    (void)from;
    CHECK_OK(mpx_decode_reply(m->buf, m->len, &g->last_reply, &data, &hint));
    CHECK(g->last_reply.len <= sizeof g->last_data);
    if (g->last_reply.len)
        memcpy(g->last_data, data, g->last_reply.len);
    g->last_reply.data = g->last_data;
    g->last_reply.cap = sizeof g->last_data;
    g->replies++;
}

static void start(struct group *g)
{
    memset(g, 0, sizeof *g);
    struct cons_core_config c = {.log_cap = 16,
                                 .window = 4,
                                 .batch_max = 2,
                                 .pending_max = 8,
                                 .clients_max = 4,
                                 .xfer_chunk = 64,
                                 .xfer_window = 2,
                                 .arena_bytes = 1 << 16,
                                 .history_bytes = CONS_HISTORY_NONE,
                                 .heartbeat_ns = 10,
                                 .election_ns = 50};
    cfx_init(&g->fx, CONS_PROTO_MPX, N, &c, CFX_DIRECT, CFX_DISK_NOW);
    g->fx.hooks.reply = on_reply;
    cfx_start(&g->fx);
}

static void stop(struct group *g)
{
    cfx_stop(&g->fx);
}

static int leader_of(struct group *g)
{
    return cfx_leader(&g->fx);
}

static void tick_until_leader(struct group *g)
{
    for (int t = 0; t < 1000 && leader_of(g) < 0; t++)
        cfx_ticks(&g->fx, 1, 5);
}

static void request(struct group *g, int to, uint8_t type, uint64_t req, const char *val)
{
    static struct cons_op op;
    uint8_t buf[4096];
    cons_op_init(&op, type, "k", 1, val, val ? (uint32_t)strlen(val) : 0, NULL, 0);
    op.client_id = 5;
    op.req_no = req;
    int len = mpx_encode_request(buf, sizeof buf, &op);
    CHECK(len > 0);
    struct cons_input in = {
        .kind = CONS_IN_MSG, .from = cons_client(5), .buf = buf, .len = (size_t)len};
    cfx_step(&g->fx, (uint32_t)to, &in);
}

TEST(elect_put_get_exactly_once)
{
    static struct group g;
    start(&g);
    tick_until_leader(&g);
    int l = leader_of(&g);
    CHECK(l >= 0);
    request(&g, (l + 1) % N, CONS_OP_PUT, 1, "v1"); /* a follower redirects */
    CHECK_EQ_I64(g.last_reply.status, FK_ENOTLEADER);
    request(&g, l, CONS_OP_PUT, 1, "v1");
    CHECK_EQ_I64(g.last_reply.status, 0);
    CHECK_EQ_U64(g.last_reply.req_no, 1);
    int before = g.replies;
    request(&g, l, CONS_OP_PUT, 1, "v1"); /* a retry is answered from the cache */
    CHECK_EQ_I64(g.replies, before + 1);
    request(&g, l, CONS_OP_GET, 2, NULL);
    CHECK_EQ_I64(g.last_reply.status, 0);
    CHECK(g.last_reply.len == 2 && memcmp(g.last_reply.data, "v1", 2) == 0);
    stop(&g);
}

/* A leader about to stop hands over (mpx_transfer): its most advanced
 * follower runs phase 1 at once, without an election timeout, and the
 * value chosen before is there. */
TEST(leader_hands_over_without_a_timeout)
{
    static struct group g;
    start(&g);
    tick_until_leader(&g);
    int l = leader_of(&g);
    CHECK(l >= 0);
    request(&g, l, CONS_OP_PUT, 1, "v1");
    CHECK_EQ_I64(g.last_reply.status, 0);
    uint64_t before = g.fx.now;
    struct cons_outbox *ob;
    CHECK_OK(mpx_transfer(R(&g, l), g.fx.now, &ob));
    CHECK_EQ_U64(ob->nmsgs, 1);
    g.fx.down |= 1u << l; /* it stops: only the message goes out */
    cfx_deliver(&g.fx, (uint32_t)l, ob);
    cfx_crash(&g.fx, (uint32_t)l);
    int nl = leader_of(&g);
    CHECK(nl >= 0 && nl != l);
    CHECK_EQ_U64(g.fx.now, before); /* no time passed: no timeout ran */
    request(&g, nl, CONS_OP_GET, 2, NULL);
    CHECK_EQ_I64(g.last_reply.status, 0);
    CHECK(g.last_reply.len == 2 && memcmp(g.last_reply.data, "v1", 2) == 0);
    /* A follower asked to hand over has nothing to hand. */
    CHECK_OK(mpx_transfer(R(&g, (uint32_t)(nl + 1) % N == (uint32_t)l ? (uint32_t)(nl + 2) % N
                                                                      : (uint32_t)(nl + 1) % N),
                          g.fx.now, &ob));
    CHECK_EQ_U64(ob->nmsgs, 0);
    stop(&g);
}

/* Requests at a leader that hands over, queued or in slots not applied,
 * go back to their clients as FK_ENOTLEADER naming the leader to be
 * (mpx_paxos.c, refuse_pending and mpx__transfer), so that they go there
 * at once instead of after the clients' resend timers; the ones in slots
 * stay in the log for the next leader's phase 1 too. */
TEST(handover_returns_queued_requests_naming_the_next_leader)
{
    static struct group g;
    start(&g);
    tick_until_leader(&g);
    int l = leader_of(&g);
    CHECK(l >= 0);
    struct cons_outbox *ob;
    /* Stepped alone, its accepts unanswered: the window fills, the rest queue. */
    for (uint64_t k = 1; k <= 10; k++) {
        static struct cons_op op;
        uint8_t buf[256];
        cons_op_init(&op, CONS_OP_PUT, "q", 1, "v", 1, NULL, 0);
        op.client_id = 100 + k;
        op.req_no = 1;
        int len = mpx_encode_request(buf, sizeof buf, &op);
        CHECK(len > 0);
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = cons_client(100 + k), .buf = buf, .len = (size_t)len};
        CHECK_OK(mpx_step(R(&g, l), &in, g.fx.now, &ob));
    }
    CHECK_OK(mpx_transfer(R(&g, l), g.fx.now, &ob));
    uint64_t to = UINT64_MAX;
    uint32_t refused = 0, hints = 0;
    for (uint32_t i = 0; i < ob->nmsgs; i++) {
        const struct cons_out_msg *m = &ob->msgs[i];
        if (m->to.kind == CONS_ADDR_REPLICA) {
            to = m->to.id; /* TIMEOUT_NOW */
            continue;
        }
        struct cons_reply rep;
        const uint8_t *data;
        uint32_t hint;
        CHECK_OK(mpx_decode_reply(m->buf, m->len, &rep, &data, &hint));
        CHECK_EQ_I64(rep.status, FK_ENOTLEADER);
        CHECK_EQ_U64(rep.client_id, m->to.id);
        refused++;
        CHECK(hint < N);
        hints |= 1u << (hint % N);
    }
    CHECK_EQ_U64(refused, 10); /* 4 slots of up to 2, the rest queued: none applied */
    CHECK(to < N && to != (uint64_t)l);
    CHECK_EQ_U64(hints, 1u << to);
    stop(&g);
}

TEST(malformed_messages_rejected)
{
    static struct group g;
    start(&g);
    tick_until_leader(&g);
    struct mpx_status a, b;
    mpx_status(R(&g, 0), &a);
    uint8_t junk[200];
    uint64_t s = 9;
    struct cons_outbox *ob;
    for (int round = 0; round < 3000; round++) {
        size_t len = (size_t)(s % sizeof junk);
        for (size_t i = 0; i < sizeof junk; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            junk[i] = (uint8_t)(s >> 56);
        }
        if (round % 2) { /* a valid header over a garbage body */
            uint16_t magic = CONS_WIRE_MAGIC;
            memcpy(junk, &magic, 2);
            junk[2] = CONS_WIRE_VERSION;
            junk[3] = CONS_PROTO_MPX;
            uint32_t body = len > 24 ? (uint32_t)(len - 24) : 0;
            memcpy(junk + 12, &body, 4);
        }
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = cons_replica(1), .buf = junk, .len = len};
        int rc = mpx_step(R(&g, 0), &in, g.fx.now, &ob);
        CHECK(rc == FK_EMALFORMED || rc == 0);
        mpx_invariants(R(&g, 0));
    }
    struct cons_input bad = {.kind = CONS_IN_PERSISTED, .cookie = UINT64_MAX};
    CHECK_ERR(mpx_step(R(&g, 0), &bad, g.fx.now, &ob), FK_EINVAL);
    mpx_status(R(&g, 0), &b);
    CHECK_EQ_U64(a.commit, b.commit);
    stop(&g);
}

TEST(config_and_restore_errors)
{
    struct mpx_config c;
    int err;
    struct kv_mem *kv = kv_mem_create(8);
    cfg_for(&c, 0);
    c.n = 4;
    CHECK(mpx_create(&c, kv_mem_sm(kv), &err) == NULL);
    CHECK_EQ_I64(err, FK_EINVAL);
    cfg_for(&c, 0);
    c.log_cap = 12;
    CHECK(mpx_create(&c, kv_mem_sm(kv), &err) == NULL);
    cfg_for(&c, 0);
    struct mpx *r = mpx_create(&c, kv_mem_sm(kv), &err);
    CHECK(r != NULL);
    uint8_t junk[8] = {1, 2, 3};
    CHECK_ERR(mpx_restore_meta(r, junk, sizeof junk), FK_EMALFORMED);
    CHECK_ERR(mpx_restore_snapshot(r, junk, sizeof junk), FK_EMALFORMED);
    CHECK_ERR(mpx_restore_entry(r, junk, 3), FK_EMALFORMED);
    struct cons_outbox *ob;
    CHECK_ERR(mpx_start(r, MPX_START_RESTORED, 0, &ob), FK_EINVAL); /* no META */
    struct cons_input tick = {.kind = CONS_IN_TICK};
    CHECK_ERR(mpx_step(r, &tick, 0, &ob), FK_EINVAL); /* not started */
    mpx_destroy(r);
    kv_mem_destroy(kv);
}

CHECK_MAIN()
