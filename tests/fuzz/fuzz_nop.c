/*
 * fuzz_nop.c: libFuzzer target for the NOPaxos replica's message decoders
 * and handlers (every byte a replica receives is untrusted).
 *
 * An input is a configuration byte, then a script of records applied to a
 * fresh member of a 3-replica group, so the fuzzer explores states deeper
 * than one message:
 *   [u8 cfg]  bit 0: durable mode; bit 1: the replica is 1 (a follower of
 *             view 0), else 0 (its leader); bits 2-3: 0 or 1 start FRESH,
 *             2 EMPTY (it recovers first), 3 RESTORED from a META and log
 *             entries described by the next 4 bytes (see restore())
 *   [u8 op][u8 type][u8 from][u8 view][u16 len][len bytes]
 *   op % 8 == 0: a message of `type` with a valid header and the bytes as
 *                body (reaches each type's body decoder)
 *           1: the bytes as a raw message (header decoding)
 *           2: a replica message of `type` whose body is well formed, its
 *              fields (slots, views, log segment, checkpoint) taken from
 *              the bytes (reaches the handlers behind the decoder)
 *           3: an OUM request, session view % 4, number `type`, carrying a
 *              valid operation made from the bytes
 *           4: an OUM request whose operation is the bytes
 *           5: an OUM drop notification for (session view % 4, `type`), or
 *              a fill (nop.h) when the first byte is odd
 *           6: a tick, `type` milliseconds later
 *           7: a storage completion: the highest cookie issued less `type`,
 *              or when `from` is odd one never issued (must be FK_EINVAL)
 * `from`: bits 0-1 name the replica (3: none such), bits 6-7 the source
 * address of ops 0-2 (0-1 that replica, 2 a client, 3 the OUM); the OUM
 * ops come from the OUM unless `from` is 0xff. A message's view term is
 * (leader_num view >> 2, session view & 3).
 *
 * After every step the replica's invariants must hold (nop_invariants); a
 * malformed message must be rejected with FK_EMALFORMED, a well-formed one
 * (ops 2, 3, 5 from a valid source) accepted, and nothing from the
 * network may poison the replica (FK_EPOISONED): a state arrives in
 * chunks that the machine validates before it switches (cons.h). Every message the replica sends
 * must decode: a replica's with the decoder its peers use, a client's with nop_decode_reply. The
 * message layouts come from nop_internal.h, the only place that documents them.
 */
#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h"
#include "nop.h"
#include "nop_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MS          1000000ull
#define KEYS_MAX    16 /* keys in the state machine: fewer than the 84 ops use */
#define SEG_MAX     20 /* entries in a built segment: more than log_cap (16) */
#define RESTORE_MAX 16 /* log entries a RESTORED start may bring: log_cap */

/* A built message: a segment of SEG_MAX largest ops NOPaxos carries (nop.h,
 * NOP_OP_MAX) plus a checkpoint. */
static uint8_t msg[SEG_MAX * (NOP_WIRE_OP_MAX + 1) + 2 * 65536];
static uint8_t rec[NOP_WIRE_OP_MAX + 64];
static struct nop_msg dec_msg;
static struct cons_op dec_op;
static struct cons_reply dec_reply;

struct run {
    struct nop *r;
    struct kv_mem *kv;
    uint32_t id;
    uint64_t now;
    uint64_t issued; /* the highest persist cookie the replica issued */
    uint64_t nonce;  /* the nonce of its latest RECOVERY */
};

/* Reads the record's bytes one at a time; zeros once they run out. */
struct cur {
    const uint8_t *p;
    size_t n;
};

static uint8_t next(struct cur *c)
{
    if (c->n == 0)
        return 0;
    c->n--;
    return *c->p++;
}

/* A valid client operation (never a NO-OP) over a few keys and clients, so
 * that scripts revisit them: duplicates, CAS hits, a full table. */
static void make_op(struct cur *c, struct cons_op *op)
{
    static const uint8_t vs[8] = {'v', 'v', 'v', 'v', 'v', 'v', 'v', 'v'};
    uint8_t b = next(c), key[3] = {0};
    uint64_t req_no = 1 + next(c) % 8;
    uint8_t type = (uint8_t)(CONS_OP_GET + (b >> 2) % 5);
    uint32_t klen = type == CONS_OP_SCAN && (b & 0x80) ? 0 : 1 + b % 3, vlen = 0, elen = 0;
    for (uint32_t k = 0; k < klen; k++)
        key[k] = (uint8_t)('a' + next(c) % 4);
    if (type == CONS_OP_PUT || type == CONS_OP_CAS)
        vlen = next(c) % 8;
    if (type == CONS_OP_CAS)
        elen = next(c) % 8;
    cons_op_init(op, type, key, klen, vs, vlen, vs, elen);
    op->client_id = 1 + b % 4;
    op->req_no = req_no;
    if (type == CONS_OP_SCAN)
        op->scan_limit = (uint8_t)(1 + next(c) % CONS_SCAN_MAX);
}

/* "u64 lo, u32 n, entries": n NO-OPs and valid requests. */
static void put_segment(struct cons_wbuf *w, struct cur *c, uint64_t lo, uint32_t n)
{
    cons_w_u64(w, lo);
    cons_w_u32(w, n);
    for (uint32_t i = 0; i < n; i++) {
        struct nop_entry e = {.kind = next(c) % 4 ? NOP_ENT_REQ : NOP_ENT_NOOP};
        cons_w_u8(w, e.kind);
        if (e.kind == NOP_ENT_REQ) {
            make_op(c, &e.op);
            cons_wire_put_op(w, &e.op);
        }
    }
}

/* A segment of up to max - 1 entries starting at lo. */
static void put_log(struct cons_wbuf *w, struct cur *c, uint64_t lo, uint32_t max)
{
    put_segment(w, c, lo, next(c) % max);
}

/* A committed history: "u64 hlo, u32 n, n hashes" (mostly not this
 * log's). */
static void put_hist(struct cons_wbuf *w, struct cur *c)
{
    uint32_t n = next(c) % 8;
    cons_w_u64(w, 1 + (uint64_t)next(c));
    cons_w_u32(w, n);
    for (uint32_t i = 0; i < n; i++)
        cons_w_u64(w, next(c));
}

/* The fields of VIEW-CHANGE (after its last normal view) and START-VIEW:
 * session start, commit, the log after the sender's snap, its history. */
static void put_view_log(struct cons_wbuf *w, struct cur *c)
{
    cons_w_u64(w, next(c) % 8);
    cons_w_u64(w, next(c));
    put_log(w, c, 1 + (uint64_t)next(c), SEG_MAX);
    put_hist(w, c);
}

/* nonce, leader flag, session start, commit, log, history. The nonce is
 * the replica's own (learnt from its RECOVERY) or a byte. */
static void put_recovery_rep(struct cons_wbuf *w, struct cur *c, const struct run *s)
{
    uint8_t b = next(c);
    cons_w_u64(w, b & 1 ? s->nonce : next(c));
    cons_w_u8(w, (b >> 1) & 1);
    cons_w_u64(w, next(c) % 8);
    cons_w_u64(w, next(c));
    put_log(w, c, 1 + (uint64_t)next(c), SEG_MAX);
    put_hist(w, c);
}

/* A state transfer message (cons_xfer.h): a kind, then fields of that
 * kind, the first few from the input, and sometimes a few raw bytes (the
 * transfer validates them). */
static void put_xfer(struct cons_wbuf *w, struct cur *c)
{
    uint8_t kind = (uint8_t)(CONS_XFER_REQ + next(c) % 3);
    cons_w_u8(w, kind);
    cons_w_u64(w, next(c)); /* nonce */
    cons_w_u64(w, next(c)); /* min index, or index */
    if (kind == CONS_XFER_NO)
        return;
    cons_w_u32(w, next(c) % 4); /* next, or seq */
    cons_w_u8(w, next(c) % 2);  /* again, or last */
    if (kind == CONS_XFER_CHUNK) {
        uint32_t n = next(c) % 16;
        cons_w_u32(w, n);
        for (uint32_t i = 0; i < n; i++)
            cons_w_u8(w, next(c));
    }
}

/* GAP-COMMIT: a slot, and sometimes the first slot of a run of NO-OPs. */
static void put_gap_commit(struct cons_wbuf *w, struct cur *c)
{
    uint64_t slot = next(c), b = next(c);
    cons_w_u64(w, slot);
    if (slot > 0 && (b & 1))
        cons_w_u64(w, slot - b / 2 % slot);
}

/* RECOVERY: nonce, the requester's committed prefix and its checkpoint. */
static void put_recovery(struct cons_wbuf *w, struct cur *c)
{
    uint64_t have = next(c), nonce = next(c) | 1;
    cons_w_u64(w, nonce);
    cons_w_u64(w, have);
    cons_w_u64(w, have ? next(c) % (have + 1) : 0);
}

/* A message of one of the types replicas exchange, with a well-formed body. */
static int build(const struct run *s, uint8_t type, uint32_t from, uint64_t term, struct cur *c)
{
    struct cons_wbuf w;
    uint64_t u;
    type = (uint8_t)(NOP_GAP_FIND + type % (NOP_SYNC_SIG + 2 - NOP_GAP_FIND));
    if (type == NOP_SYNC_SIG + 1)
        type = NOP_XFER;
    cons_wbuf_init(&w, msg, sizeof msg);
    cons_wire_begin(&w, CONS_PROTO_NOP, type, from, term);
    switch (type) {
    case NOP_GAP_COMMIT:
        put_gap_commit(&w, c);
        break;
    case NOP_GAP_RECV:
        put_segment(&w, c, 1 + (uint64_t)next(c), 1);
        break;
    case NOP_SYNC:
        cons_w_u64(&w, next(c));
        u = 1 + (uint64_t)next(c);
        put_log(&w, c, u, SEG_MAX);
        cons_w_u64(&w, next(c)); /* safe */
        break;
    case NOP_SYNC_SIG: /* commit, lo, n entry hashes (mostly not this log's) */
        cons_w_u64(&w, next(c));
        cons_w_u64(&w, 1 + (uint64_t)next(c));
        u = next(c) % 8;
        cons_w_u32(&w, (uint32_t)u);
        for (uint64_t i = 0; i < u; i++)
            cons_w_u64(&w, next(c));
        cons_w_u64(&w, next(c)); /* safe */
        break;
    case NOP_VC:
        u = next(c);
        cons_w_u64(&w, nop__pack((struct nop_view){(uint32_t)(u >> 2), (uint32_t)(u & 3)}));
        put_view_log(&w, c);
        break;
    case NOP_START_VIEW:
        put_view_log(&w, c);
        break;
    case NOP_RECOVERY:
        put_recovery(&w, c);
        break;
    case NOP_RECOVERY_REP:
        put_recovery_rep(&w, c, s);
        break;
    case NOP_STATE: /* session start, commit, the leader's snap, history */
        cons_w_u64(&w, next(c) % 8);
        cons_w_u64(&w, next(c));
        cons_w_u64(&w, next(c));
        put_hist(&w, c);
        break;
    case NOP_SYNC_REP: /* synced, flags, asked, executed */
        cons_w_u64(&w, next(c));
        cons_w_u64(&w, next(c) % 4);
        cons_w_u64(&w, next(c));
        cons_w_u64(&w, next(c));
        break;
    case NOP_XFER:
        put_xfer(&w, c);
        break;
    case NOP_VC_REQ:
        break;
    default: /* GAP-FIND, GAP-COMMIT-REPLY: a slot */
        cons_w_u64(&w, next(c));
        break;
    }
    return cons_wire_finish(&w);
}

static uint64_t view_term(uint8_t v)
{
    return nop__pack((struct nop_view){(uint32_t)(v >> 2), (uint32_t)(v & 3)});
}

/* Everything the replica emitted is what its peers and clients will
 * decode: it must decode. Learns the cookies issued and its nonce. */
static void check_outbox(struct run *s, const struct cons_outbox *out)
{
    for (uint32_t i = 0; i < out->npersists; i++) {
        if (out->persists[i].cookie > s->issued)
            s->issued = out->persists[i].cookie;
    }
    for (uint32_t i = 0; i < out->nmsgs; i++) {
        const struct cons_out_msg *m = &out->msgs[i];
        struct nop_view v;
        uint64_t slot;
        int has;
        const uint8_t *d;
        if (m->to.kind == CONS_ADDR_REPLICA) {
            if (m->to.id >= 3 || m->to.id == s->id ||
                nop__decode(m->buf, m->len, &dec_msg, &dec_op) < 0)
                abort();
            if (dec_msg.type == NOP_RECOVERY)
                s->nonce = dec_msg.u1;
        } else if (m->to.kind != CONS_ADDR_CLIENT ||
                   nop_decode_reply(m->buf, m->len, &v, &slot, &has, &dec_reply, &d) < 0 ||
                   dec_reply.client_id != m->to.id || dec_reply.len > NOP_RESULT_MAX ||
                   d < m->buf || d + dec_reply.len > m->buf + m->len) {
            abort();
        }
    }
}

/* Feeds one input: its result must be `want`, or FK_EMALFORMED as well
 * when may_malformed. Then the invariants. Returns 0, or -1 when the
 * replica was poisoned for the documented reason (it must be destroyed). */
static int step(struct run *s, const struct cons_input *in, int want, int may_malformed)
{
    struct cons_outbox *out;
    int rc = nop_step(s->r, in, s->now, &out);
    if (rc != want && !(may_malformed && rc == FK_EMALFORMED))
        abort();
    if (nop_seal(s->r) != (rc == FK_EPOISONED ? FK_EPOISONED : 0))
        abort();
    nop_invariants(s->r);
    check_outbox(s, out);
    return 0;
}

static int make_replica(struct run *s, uint32_t durable)
{
    struct nop_config c = {
        .n = 3,
        .id = s->id,
        .log_cap = 16,
        .clients_max = 3, /* fewer than the 4 clients ops use: evictions */
        .xfer_chunk = 64,
        .xfer_window = 4,
        .arena_bytes = 64u << 10, /* raised to one whole-log message */
        .heartbeat_ns = 20 * MS,
        .election_ns = 100 * MS,
        .seed = 1,
        .durable = durable,
    };
    int err = 0;
    s->kv = kv_mem_create(KEYS_MAX);
    s->r = s->kv ? nop_create(&c, kv_mem_sm(s->kv), &err) : NULL;
    return s->r != NULL;
}

/* RESTORED: a META naming view b[0] and last normal view b[1] (durable
 * layout when cfg bit 4 is set, with a log of b[2] % 17 entries committed
 * up to b[3]), then entries 1..b[2] % 17. Returns 0, or FK_EMALFORMED when
 * the META is refused (a last normal view above the view). */
static int restore(struct run *s, uint8_t cfg, const uint8_t b[4])
{
    struct cons_wbuf w;
    uint64_t len = b[2] % (RESTORE_MAX + 1), commit = b[3] % (len + 1);
    cons_wbuf_init(&w, rec, sizeof rec);
    cons_w_u32(&w, cfg & 16 ? NOP_META_LOG_MAGIC : NOP_META_MAGIC);
    cons_w_u32(&w, 3);
    cons_w_u32(&w, s->id);
    cons_w_u64(&w, view_term(b[0]));
    cons_w_u64(&w, view_term(b[1]));
    cons_w_u64(&w, 0); /* session start */
    if (cfg & 16) {
        cons_w_u64(&w, len);
        cons_w_u64(&w, commit);
    }
    int rc = nop_restore_meta(s->r, rec, w.len);
    for (uint64_t slot = 1; rc == 0 && slot <= len; slot++) {
        uint8_t seed[8] = {(uint8_t)(slot * 4 + 1), (uint8_t)slot, (uint8_t)slot, 3};
        struct cur c = {seed, sizeof seed};
        struct nop_entry e = {.kind = slot % 5 ? NOP_ENT_REQ : NOP_ENT_NOOP};
        if (e.kind == NOP_ENT_REQ)
            make_op(&c, &e.op);
        cons_wbuf_init(&w, rec, sizeof rec);
        nop__put_entry(&w, slot, &e);
        rc = nop_restore_entry(s->r, rec, w.len);
    }
    if (rc < 0 && rc != FK_EMALFORMED)
        abort();
    return rc;
}

/* The address a record's message comes from (ops 0-2). */
static struct cons_addr source(uint8_t from)
{
    if (from >> 6 < 2)
        return cons_replica(from & 3);
    if (from >> 6 == 2)
        return cons_client(from & 3);
    return (struct cons_addr){CONS_ADDR_OUM, 0};
}

/* OUM requests and drops (ops 3-5): from the OUM, numbered `type`. */
static int oum(struct run *s, uint8_t op, uint8_t type, uint8_t from, uint8_t view, struct cur *c)
{
    struct cons_input in = {.kind = CONS_IN_MSG, .buf = msg};
    struct cons_op o;
    int n, bad = from == 0xff || type == 0;
    in.from = from == 0xff ? cons_replica(1) : (struct cons_addr){CONS_ADDR_OUM, 0};
    if (op == 3) {
        make_op(c, &o);
        n = nop_encode_oum_request(msg, sizeof msg, view & 3, type, &o);
    } else if (op == 4) {
        struct cons_wbuf w;
        cons_wbuf_init(&w, msg, sizeof msg);
        cons_wire_begin(&w, CONS_PROTO_NOP, NOP_OUM_REQ, CONS_FROM_CLIENT, view & 3);
        cons_w_u64(&w, type);
        cons_w_bytes(&w, c->p, c->n);
        n = cons_wire_finish(&w);
    } else if (c->n > 0 && c->p[0] & 1) {
        n = nop_encode_oum_fill(msg, sizeof msg, view & 3, type);
    } else {
        n = nop_encode_oum_drop(msg, sizeof msg, view & 3, type);
    }
    if (n < 0)
        abort();
    in.len = (size_t)n;
    return step(s, &in, bad ? FK_EMALFORMED : 0, op == 4);
}

/* Applies one record: [op][type][from][view] and its bytes. Returns 0, or
 * -1 when the replica must be destroyed. */
static int record(struct run *s, const uint8_t h[4], const uint8_t *body, size_t len)
{
    uint8_t op = h[0] % 8, type = h[1], from = h[2], view = h[3];
    struct cons_input in = {.kind = CONS_IN_MSG, .from = source(from), .buf = msg};
    struct cur c = {body, len};
    struct cons_wbuf w;
    int n, valid = from >> 6 < 2 && (from & 3) < 3 && (from & 3) != s->id;
    switch (op) {
    case 0:
        cons_wbuf_init(&w, msg, sizeof msg);
        cons_wire_begin(&w, CONS_PROTO_NOP, type % 32, from & 3, view_term(view));
        cons_w_bytes(&w, body, len);
        n = cons_wire_finish(&w);
        in.len = n > 0 ? (size_t)n : 0;
        return step(s, &in, 0, 1);
    case 1:
        in.buf = body;
        in.len = len;
        return step(s, &in, 0, 1);
    case 2:
        n = build(s, type, from & 3, view_term(view), &c);
        if (n < 0)
            abort();
        in.len = (size_t)n;
        return step(s, &in, valid ? 0 : FK_EMALFORMED, 0);
    case 6:
        in.kind = CONS_IN_TICK;
        s->now += type * MS;
        return step(s, &in, 0, 0);
    case 7:
        in.kind = CONS_IN_PERSISTED;
        in.cookie = s->issued - (type < s->issued ? type : s->issued);
        if (from & 1)
            in.cookie = s->issued + 1 + type;
        return step(s, &in, from & 1 ? FK_EINVAL : 0, 0);
    default:
        return oum(s, op, type, from, view, &c);
    }
}

static void finish(struct run *s)
{
    nop_destroy(s->r);
    kv_mem_destroy(s->kv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        ready = 1;
    }
    if (size < 1)
        return 0;
    uint8_t cfg = data[0], mode = (cfg >> 2) & 3;
    struct run s = {.id = cfg & 2 ? 1 : 0, .now = MS};
    struct cons_outbox *out;
    data++;
    size--;
    if (!make_replica(&s, cfg & 1))
        abort();
    if (mode == 3 && (size < 4 || restore(&s, cfg, data) < 0)) {
        finish(&s); /* refused records: the handle must go (nop.h) */
        return 0;
    }
    if (mode == 3) {
        data += 4;
        size -= 4;
    }
    enum nop_start_mode sm = mode == 3   ? NOP_START_RESTORED
                             : mode == 2 ? NOP_START_EMPTY
                                         : NOP_START_FRESH;
    if (nop_start(s.r, sm, s.now, &out) < 0)
        abort();
    nop_invariants(s.r);
    check_outbox(&s, out);
    /* Bounded: each record consumes at least 6 bytes. */
    while (size >= 6) {
        size_t len = (size_t)data[4] | (size_t)data[5] << 8;
        if (len > size - 6)
            len = size - 6;
        if (record(&s, data, data + 6, len) < 0)
            break;
        data += 6 + len;
        size -= 6 + len;
    }
    finish(&s);
    return 0;
}
