/*
 * fuzz_request.c: libFuzzer target for the bytes a replica takes from
 * clients (proto/fkc_proto.h): a kv.req.<i> message (one fkc_kind byte and
 * the request) and, under NOPaxos, a kv.oum message (struct fkc_oum and
 * one encoded cons op, joined from its fragments by flow_msg) and the
 * fills of its leading fragments.
 *
 * flowkv-server takes them apart in static functions (server/srv_net.c
 * next_request and next_oum, server/srv_node.c feed and feed_oum), so this
 * target repeats their checks (server_request, server_oum below; keep them
 * in step) and calls the public decoders they hand the bytes to: the
 * Multi-Paxos core's request decoder (mpx_step on a client message), or
 * cons_wire_get_op, nop_encode_oum_request and the NOPaxos core's OUM
 * decoder (nop_step). Every reply the core sends must decode with the
 * client library's decoders (mpx_decode_reply, nop_decode_reply).
 *
 * An input is a configuration byte, then a script of records:
 *   [u8 cfg]  bit 0: NOPaxos, else Multi-Paxos
 *   [u8 op][u8 a][u8 b][u16 len][len bytes]
 *   op % 4 == 0: a kv.req message from client `a % 4` (0: none, which the
 *                server refuses): the bytes, kind byte first
 *           1: a request the client library would send, its operation made
 *              from the bytes (client `a % 4 + 1`): FKC_OP and
 *              mpx_encode_request, or a kv.oum message as send_nop builds
 *              it
 *           2: a kv.oum message: the bytes, fragments' dst = the client id
 *              its header names (a odd) or a (a even) (NOPaxos;
 *              Multi-Paxos hosts no kv.oum)
 *           3: by a % 5: 0 a tick, b milliseconds later; 1 a sequencer gap
 *              (the drop of the next number); 2 a new sequencer session;
 *              3 b % 4 numbers lost without notice; 4 a fill (the number
 *              of a leading fragment)
 * A replica alone serves nobody, so replica 0 of a 3-replica group gets
 * two scripted healthy peers: they elect it leader (Multi-Paxos) and
 * answer what a follower answers (PREVOTE-OK, PROMISE, ACCEPTED; SYNC-
 * REPLY, GAP-COMMIT-REPLY, VIEW-CHANGE), and every persist is reported
 * durable, so requests commit and their replies leave.
 *
 * Checks: bytes that pass the server's own checks either are accepted or
 * the core rejects them with FK_EMALFORMED; a well-formed request passes
 * the server's checks and is accepted; nothing a client sends poisons the
 * replica; the core's invariants hold after every step.
 */
#include "cons_core.h"
#include "cons_wire.h"
#include "fk_error.h"
#include "fkc_proto.h"
#include "flow_msg.h"
#include "kv.h"
#include "mpx.h"
#include "mpx_internal.h" /* the messages the scripted peers answer */
#include "nop.h"
#include "nop_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MS         1000000ull
#define KEYS_MAX   16 /* fewer than the 84 keys ops use: a full store */
#define ANSWER_MAX 256
#define QUEUE_MAX  64  /* peer answers waiting; more are lost */
#define SETTLE_MAX 256 /* steps one input may cause at most */

/* A kv.req message or a kv.oum message, built. */
static uint8_t tuple[1 + CONS_WIRE_OP_MAX + 64 + FKC_OUM_MSG_MAX];

struct node {
    int nop; /* the protocol: NOPaxos, else Multi-Paxos */
    struct cons_core core;
    struct kv_mem *kv;
    uint64_t now;
    uint64_t cookie, durable; /* the highest persist cookie issued, reported */
    uint32_t session;         /* the sequencer's (NOPaxos) */
    uint64_t seq;             /* its last number */
    struct cons_op op;
    uint8_t oum_buf[NOP_WIRE_OP_MAX + 64]; /* as srv_node's SRV_OUM_BUF */
    uint32_t nq;
    struct {
        uint32_t from, len;
        uint8_t buf[ANSWER_MAX];
    } q[QUEUE_MAX];
};

static struct cons_reply reply;

static void queue_answer(struct node *n, uint32_t from, struct cons_wbuf *w)
{
    int len = cons_wire_finish(w);
    if (len < 0)
        abort();
    if (n->nq == QUEUE_MAX)
        return; /* lost, like on the network */
    n->q[n->nq].from = from;
    n->q[n->nq].len = (uint32_t)len;
    memcpy(n->q[n->nq].buf, w->p, (size_t)len);
    n->nq++;
}

/* ACCEPT: u64 commit, u32 n, entries (u64 index, u64 ballot, u8 nops, ops).
 * A healthy acceptor acknowledges every index. */
static void accepted(struct cons_rbuf *r, struct cons_wbuf *w)
{
    cons_r_u64(r);
    uint32_t nents = cons_r_u32(r);
    if (nents > MPX_MSG_ENTRIES)
        abort();
    cons_w_u32(w, nents);
    for (uint32_t i = 0; i < nents; i++) {
        cons_w_u64(w, cons_r_u64(r));
        cons_r_u64(r);
        uint8_t nops = cons_r_u8(r);
        for (uint8_t k = 0; k < nops; k++) {
            if (cons_wire_skip_op(r) < 0)
                abort();
        }
    }
}

/* A crash vector of a group of three that never lost a disk (mpx_recover.c). */
static void fresh_cv(struct cons_wbuf *w)
{
    cons_w_u8(w, 3);
    for (int p = 0; p < 3; p++)
        cons_w_u64(w, 0);
}

/* What a healthy Multi-Paxos follower answers replica 0's message with. */
static void answer_mpx(struct node *n, const struct cons_out_msg *m, uint32_t from)
{
    struct cons_wire_hdr h;
    struct cons_rbuf r;
    struct cons_wbuf w;
    uint8_t buf[ANSWER_MAX];
    if (cons_wire_open(m->buf, m->len, CONS_PROTO_MPX, MPX__TYPES, &h, &r) < 0)
        abort();
    cons_wbuf_init(&w, buf, sizeof buf);
    if (h.type == MPX_PREVOTE) {
        cons_wire_begin(&w, CONS_PROTO_MPX, MPX_PREVOTE_OK, from, h.term);
        cons_w_u8(&w, 1);
    } else if (h.type == MPX_PREPARE) {
        cons_wire_begin(&w, CONS_PROTO_MPX, MPX_PROMISE, from, h.term);
        fresh_cv(&w);
        cons_w_u64(&w, 0); /* snapshot index */
        cons_w_u64(&w, 0); /* commit */
        cons_w_u32(&w, 0); /* nothing accepted */
    } else if (h.type == MPX_ACCEPT) {
        cons_wire_begin(&w, CONS_PROTO_MPX, MPX_ACCEPTED, from, h.term);
        fresh_cv(&w);
        accepted(&r, &w);
        if (w.len == sizeof h + MPX_CV_BYTES(3) + 4)
            return; /* nothing to acknowledge */
    } else {
        return; /* COMMIT, CATCHUP, ...: nothing to say */
    }
    queue_answer(n, from, &w);
}

/* What a healthy NOPaxos follower answers replica 0's message with: it
 * takes SYNC and STATE whole, confirms gap NO-OPs, and joins a view
 * change with an empty log of the first view. */
static void answer_nop(struct node *n, const struct cons_out_msg *m)
{
    struct cons_wire_hdr h;
    struct cons_rbuf r;
    struct cons_wbuf w;
    uint8_t buf[ANSWER_MAX];
    uint32_t from = (uint32_t)m->to.id;
    if (cons_wire_open(m->buf, m->len, CONS_PROTO_NOP, NOP__TYPES, &h, &r) < 0)
        abort();
    cons_wbuf_init(&w, buf, sizeof buf);
    if (h.type == NOP_SYNC) {
        cons_r_u64(&r); /* commit */
        uint64_t lo = cons_r_u64(&r);
        cons_wire_begin(&w, CONS_PROTO_NOP, NOP_SYNC_REP, from, h.term);
        cons_w_u64(&w, lo + cons_r_u32(&r) - 1); /* synced */
        cons_w_u64(&w, NOP_SYNC_REP_FULL);
        cons_w_u64(&w, lo); /* asked */
        cons_w_u64(&w, 0);  /* executed */
    } else if (h.type == NOP_STATE) {
        cons_r_bytes(&r, 16);            /* session start, commit */
        uint64_t index = cons_r_u64(&r); /* the leader's snap: it fetches a state from there */
        cons_wire_begin(&w, CONS_PROTO_NOP, NOP_SYNC_REP, from, h.term);
        cons_w_u64(&w, index);
        cons_w_u64(&w, NOP_SYNC_REP_FULL);
        cons_w_u64(&w, index);
        cons_w_u64(&w, 0);
    } else if (h.type == NOP_GAP_COMMIT) {
        cons_wire_begin(&w, CONS_PROTO_NOP, NOP_GAP_COMMIT_REP, from, h.term);
        cons_w_u64(&w, cons_r_u64(&r));
    } else if (h.type == NOP_VC_REQ) {
        cons_wire_begin(&w, CONS_PROTO_NOP, NOP_VC, from, h.term);
        cons_w_u64(&w, 0); /* last normal view (0, 0) */
        cons_w_u64(&w, 0); /* session start */
        cons_w_u64(&w, 0); /* commit */
        cons_w_u64(&w, 1); /* an empty log from slot 1 */
        cons_w_u32(&w, 0);
        cons_w_u64(&w, 1); /* no history */
        cons_w_u32(&w, 0);
    } else {
        return;
    }
    if (r.err)
        abort();
    queue_answer(n, from, &w);
}

/* Learns the cookies issued, checks that every reply decodes with the
 * client library's decoder and is for the client it goes to, and lets the
 * peers answer. */
static void drain(struct node *n, const struct cons_outbox *out)
{
    for (uint32_t i = 0; i < out->npersists; i++) {
        if (out->persists[i].cookie > n->cookie)
            n->cookie = out->persists[i].cookie;
    }
    for (uint32_t i = 0; i < out->nmsgs; i++) {
        const struct cons_out_msg *m = &out->msgs[i];
        struct nop_view v;
        uint64_t slot;
        int has;
        uint32_t hint;
        const uint8_t *d;
        if (!n->nop && m->to.kind == CONS_ADDR_PEERS) {
            answer_mpx(n, m, 1);
            answer_mpx(n, m, 2);
        } else if (m->to.kind == CONS_ADDR_REPLICA && (m->to.id == 1 || m->to.id == 2)) {
            if (n->nop)
                answer_nop(n, m);
            else
                answer_mpx(n, m, (uint32_t)m->to.id);
        } else if (m->to.kind != CONS_ADDR_CLIENT ||
                   (n->nop ? nop_decode_reply(m->buf, m->len, &v, &slot, &has, &reply, &d)
                           : mpx_decode_reply(m->buf, m->len, &reply, &d, &hint)) < 0 ||
                   reply.client_id != m->to.id || d < m->buf || d + reply.len > m->buf + m->len) {
            abort();
        }
    }
}

/* One input to the core; the invariants hold after it. */
static int core_step(struct node *n, const struct cons_input *in)
{
    struct cons_outbox *out;
    int rc = n->core.ops->step(n->core.impl, in, n->now, &out);
    if (rc != FK_EPOISONED && n->core.ops->seal && n->core.ops->seal(n->core.impl) < 0)
        abort(); /* a seal fails only on a poisoned core */
    n->core.ops->invariants(n->core.impl);
    if (rc == FK_EPOISONED)
        abort(); /* nothing a client or a healthy peer sends may do that */
    drain(n, out);
    return rc;
}

/* Reports persists durable and feeds the peers' answers until quiet. */
static void settle(struct node *n)
{
    for (int k = 0; k < SETTLE_MAX && (n->nq || n->durable < n->cookie); k++) {
        struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = n->cookie};
        if (n->durable < n->cookie) {
            n->durable = n->cookie;
        } else {
            static uint8_t buf[ANSWER_MAX];
            n->nq--;
            memcpy(buf, n->q[n->nq].buf, n->q[n->nq].len);
            in = (struct cons_input){.kind = CONS_IN_MSG,
                                     .from = cons_replica(n->q[n->nq].from),
                                     .buf = buf,
                                     .len = n->q[n->nq].len};
        }
        if (core_step(n, &in) != 0)
            abort(); /* a healthy peer's message, or a completion */
    }
}

/* Feeds in; the result must be want, or also FK_EMALFORMED when
 * may_malformed. */
static void feed(struct node *n, const struct cons_input *in, int want, int may_malformed)
{
    int rc = core_step(n, in);
    if (rc != want && !(may_malformed && rc == FK_EMALFORMED))
        abort();
    settle(n);
}

/* FKC_STATUS: the server answers from the core's status (srv_node.c
 * fill_status); the body is ignored. */
static void status(const struct node *n)
{
    struct cons_core_status st;
    n->core.ops->status(n->core.impl, &st);
    if (st.applied > st.last ||
        (!n->nop && (st.applied > st.commit || st.role != CONS_ROLE_LEADER)))
        abort();
}

/* A kv.req message from client dst: srv_net.c next_request's checks, then
 * srv_node.c feed. FK_EMALFORMED where the server drops it itself. */
static void server_request(struct node *n, uint64_t dst, const uint8_t *buf, size_t len,
                           int well_formed)
{
    if (len < 1 || dst == 0 || (buf[0] != FKC_OP && buf[0] != FKC_STATUS)) {
        if (well_formed)
            abort();
        return;
    }
    if (buf[0] == FKC_STATUS) {
        status(n);
        return;
    }
    if (n->nop)
        return; /* NOPaxos requests go through kv.oum */
    struct cons_input in = {
        .kind = CONS_IN_MSG, .from = cons_client(dst), .buf = buf + 1, .len = len - 1};
    feed(n, &in, 0, !well_formed);
}

/* A kv.oum message whole at a number the sequencer gave: srv_net.c
 * next_oum's checks, then srv_node.c feed_oum. A message the server drops
 * still used its number: the replica sees a gap there. */
static void server_oum(struct node *n, const uint8_t *m, size_t mlen, uint64_t dst, int well_formed)
{
    struct fkc_oum h;
    struct cons_rbuf r;
    n->seq++;
    if (mlen <= sizeof h) {
        if (well_formed)
            abort();
        return;
    }
    memcpy(&h, m, sizeof h);
    cons_rbuf_init(&r, m + sizeof h, mlen - sizeof h);
    if (h.client_id == 0 || h.client_id != dst || h.len != mlen - sizeof h ||
        cons_wire_get_op(&r, &n->op) < 0 || n->op.client_id != h.client_id) {
        if (well_formed)
            abort();
        return;
    }
    int len = nop_encode_oum_request(n->oum_buf, sizeof n->oum_buf, n->session, n->seq, &n->op);
    if (len < 0)
        abort(); /* the buffer holds the largest operation */
    struct cons_input in = {
        .kind = CONS_IN_MSG, .from = {CONS_ADDR_OUM, 0}, .buf = n->oum_buf, .len = (size_t)len};
    feed(n, &in, 0, 0);
}

/* A number that carries no request, as srv_node.c feed_oum hands it in:
 * a sequencer gap (srv_net.c next_oum's drop) or, with fill, the number of
 * a leading fragment (FLOW_MSG_FRAGMENT). */
static void server_number(struct node *n, int fill)
{
    int len = fill ? nop_encode_oum_fill(n->oum_buf, sizeof n->oum_buf, n->session, ++n->seq)
                   : nop_encode_oum_drop(n->oum_buf, sizeof n->oum_buf, n->session, ++n->seq);
    struct cons_input in = {
        .kind = CONS_IN_MSG, .from = {CONS_ADDR_OUM, 0}, .buf = n->oum_buf, .len = (size_t)len};
    if (len < 0)
        abort();
    feed(n, &in, 0, 0);
}

/* A valid operation over a few clients and keys, from the bytes. */
static void make_op(const uint8_t *p, size_t len, uint64_t client, struct cons_op *op)
{
    static const uint8_t vs[8] = {'v', 'v', 'v', 'v', 'v', 'v', 'v', 'v'};
    uint8_t b[8] = {0}, key[3] = {0};
    memcpy(b, p, len < sizeof b ? len : sizeof b);
    uint8_t type = (uint8_t)(CONS_OP_GET + b[1] % 5);
    uint32_t klen = type == CONS_OP_SCAN && (b[1] & 0x80) ? 0 : 1 + b[2] % 3, vlen = 0, elen = 0;
    for (uint32_t k = 0; k < klen; k++)
        key[k] = (uint8_t)('a' + (b[3 + k] % 4));
    if (type == CONS_OP_PUT || type == CONS_OP_CAS)
        vlen = b[6] % 8;
    if (type == CONS_OP_CAS)
        elen = b[7] % 8;
    cons_op_init(op, type, key, klen, vs, vlen, vs, elen);
    op->client_id = client;
    op->req_no = 1 + b[0] % 8;
    if (type == CONS_OP_SCAN)
        op->scan_limit = (uint8_t)(1 + b[6] % CONS_SCAN_MAX);
}

/* What libflowkv sends (client/flowkv.c send_mpx, send_nop). */
static void client_request(struct node *n, uint8_t a, const uint8_t *p, size_t len)
{
    struct cons_op op;
    make_op(p, len, 1 + a % 4, &op);
    if (!n->nop) {
        tuple[0] = FKC_OP;
        int m = mpx_encode_request(tuple + 1, sizeof tuple - 1, &op);
        if (m < 0)
            abort();
        server_request(n, op.client_id, tuple, (size_t)m + 1, 1);
        return;
    }
    struct fkc_oum h = {.client_id = op.client_id};
    struct cons_wbuf w;
    for (uint32_t i = 0; i < CONS_REPLICAS_MAX; i++)
        h.reply_to[i] = i < 3 ? 0 : FKC_NO_TARGET;
    cons_wbuf_init(&w, tuple + sizeof h, FKC_OUM_MSG_MAX - sizeof h);
    cons_wire_put_op(&w, &op);
    h.len = (uint32_t)w.len;
    memcpy(tuple, &h, sizeof h);
    /* flow_msg numbers each fragment: the leading ones are fills. */
    for (size_t k = FKC_OUM_TUPLE - FLOW_MSG_HDR; k < sizeof h + w.len;
         k += FKC_OUM_TUPLE - FLOW_MSG_HDR)
        server_number(n, 1);
    server_oum(n, tuple, sizeof h + w.len, op.client_id, 1);
}

/* Applies one record: [op][a][b] and its bytes. */
static void record(struct node *n, const uint8_t h[3], const uint8_t *p, size_t len)
{
    uint8_t a = h[1], b = h[2];
    struct cons_input tick = {.kind = CONS_IN_TICK};
    switch (h[0] % 4) {
    case 0:
        server_request(n, a % 4, p, len, 0);
        break;
    case 1:
        client_request(n, a, p, len);
        break;
    case 2:
        if (n->nop) {
            struct fkc_oum named = {0};
            memcpy(&named, p, len < sizeof named ? len : sizeof named);
            server_oum(n, p, len < FKC_OUM_MSG_MAX ? len : FKC_OUM_MSG_MAX,
                       a % 2 ? named.client_id : a, 0);
        }
        break;
    default:
        if (a % 5 == 0 || !n->nop) {
            n->now += b * MS;
            feed(n, &tick, 0, 0);
        } else if (a % 5 == 1) {
            server_number(n, 0);
        } else if (a % 5 == 2) {
            n->session += n->session < 65535;
            n->seq = 0;
        } else if (a % 5 == 3) {
            n->seq += b % 4;
        } else {
            server_number(n, 1);
        }
        break;
    }
}

/* Replica 0, started FRESH; under Multi-Paxos elected leader with the
 * peers' help (a follower answers clients FK_ENOTLEADER only). */
static void make_node(struct node *n)
{
    struct cons_core_config c = {
        .n = 3,
        .log_cap = 16,
        .clients_max = 3, /* fewer than the 4 clients ops use: evictions */
        .arena_bytes = n->nop ? 64u << 10 : 256u << 10,
        .heartbeat_ns = 20 * MS,
        .election_ns = 100 * MS,
        .seed = 1,
        .window = 4,
        .batch_max = 2,
        .pending_max = 16,
        .tick_ns = MS,
    };
    struct cons_outbox *out;
    n->kv = kv_mem_create(KEYS_MAX);
    if (!n->kv ||
        cons_core_create(&n->core, n->nop ? &nop_core_ops : &mpx_core_ops, &c, kv_mem_sm(n->kv)) <
            0 ||
        n->core.ops->start(n->core.impl, CONS_START_FRESH, n->now, &out) < 0)
        abort();
    drain(n, out);
    settle(n);
    if (!n->nop) {
        struct cons_input tick = {.kind = CONS_IN_TICK};
        n->now += 2 * c.election_ns;
        feed(n, &tick, 0, 0);
        status(n); /* a leader now */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct node n;
    if (size < 1)
        return 0;
    memset(&n, 0, sizeof n);
    n.nop = data[0] & 1;
    n.now = MS;
    n.session = 1; /* the first sequencer's (srv_net.h: 1..65535) */
    make_node(&n);
    data++;
    size--;
    /* Bounded: each record consumes at least 5 bytes. */
    while (size >= 5) {
        size_t len = (size_t)data[3] | (size_t)data[4] << 8;
        if (len > size - 5)
            len = size - 5;
        record(&n, data, data + 5, len);
        data += 5 + len;
        size -= 5 + len;
    }
    cons_core_destroy(&n.core);
    kv_mem_destroy(n.kv);
    return 0;
}
