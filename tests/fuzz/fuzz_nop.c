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
 * (ops 2, 3, 5 from a valid source) accepted, and the network may poison
 * the replica (FK_EPOISONED) only the one documented way (poison_expected;
 * the script ends there). Every message the replica sends must decode: a
 * replica's with the decoder its peers use, a client's with
 * nop_decode_reply. The message layouts come from nop_internal.h, the only
 * place that documents them.
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
#define BLOBS       4  /* prebuilt checkpoints holding 0..3 clients and keys */
#define BLOB_MAX    4096
#define RESTORE_MAX 16 /* log entries a RESTORED start may bring: log_cap */

/* A built message: a segment of SEG_MAX largest ops NOPaxos carries (nop.h,
 * NOP_OP_MAX) plus a checkpoint. */
static uint8_t msg[SEG_MAX * (NOP_WIRE_OP_MAX + 1) + 2 * 65536];
static uint8_t rec[NOP_WIRE_OP_MAX + 64];
static uint8_t cp_scratch[65536 + 64];
static struct nop_msg dec_msg;
static struct cons_op dec_op;
static struct cons_reply dec_reply;
/* Applies fill a reply's buffer (cons.h): a static one. */
static uint8_t apply_data[CONS_REPLY_MAX];
static struct cons_ctab scratch_ctab; /* to tell which checkpoints are valid */
static struct kv_mem *scratch_kv;

/* Valid checkpoint contents: a client table and a state machine snapshot. */
static struct {
    uint8_t ct[BLOB_MAX], sm[BLOB_MAX];
    size_t ctl, sml;
} blobs[BLOBS];

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

/* Checkpoint contents after k operations, built once. */
static void make_blobs(void)
{
    for (int k = 0; k < BLOBS; k++) {
        struct kv_mem *kv = kv_mem_create(KEYS_MAX);
        struct cons_sm sm = kv ? kv_mem_sm(kv) : (struct cons_sm){0};
        struct cons_ctab t;
        if (!kv || cons_ctab_init(&t, 3) < 0)
            abort();
        for (int i = 0; i < k; i++) {
            uint8_t seed[4] = {(uint8_t)(4 + i), 0, (uint8_t)i, (uint8_t)(i + 1)};
            struct cur c = {seed, sizeof seed};
            struct cons_op op;
            struct cons_reply rep = {.data = apply_data, .cap = sizeof apply_data};
            make_op(&c, &op); /* client 1 + i's first request: a PUT */
            if (cons_apply_once(&sm, &t, &op, &rep) < 0)
                abort();
        }
        if (cons_ctab_save(&t, blobs[k].ct, BLOB_MAX, &blobs[k].ctl) < 0 ||
            sm.ops->snapshot(sm.impl, blobs[k].sm, BLOB_MAX, &blobs[k].sml) < 0)
            abort();
        cons_ctab_free(&t);
        kv_mem_destroy(kv);
    }
}

/* Takes up to max bytes of the input as checkpoint contents. */
static const uint8_t *take_raw(struct cur *c, size_t max, size_t *len)
{
    size_t want = next(c) % max;
    const uint8_t *p = c->p;
    *len = want < c->n ? want : c->n;
    c->p += *len;
    c->n -= *len;
    return p;
}

/* "u32 len, checkpoint blob": none, a valid one at a fuzzed index, one
 * whose contents are bytes of the input, or a valid one with a byte
 * flipped. The framing is always valid. Returns whether there is one and
 * sets *index (0 for none). */
static int put_checkpoint(struct cons_wbuf *w, struct cur *c, uint64_t *index)
{
    uint8_t kind = next(c);
    const uint8_t *ct = blobs[kind / 4 % BLOBS].ct, *sm = blobs[kind / 4 % BLOBS].sm;
    size_t ctl = blobs[kind / 4 % BLOBS].ctl, sml = blobs[kind / 4 % BLOBS].sml;
    *index = 0;
    if (kind % 4 == 0) {
        cons_w_u32(w, 0);
        return 0;
    }
    *index = next(c);
    if (kind % 4 == 2) {
        ct = take_raw(c, 64, &ctl);
        sm = take_raw(c, 64, &sml);
    } else if (kind % 4 == 3) {
        size_t at = next(c) % (ctl + sml);
        memcpy(cp_scratch, ct, ctl);
        memcpy(cp_scratch + ctl, sm, sml);
        cp_scratch[at] ^= (uint8_t)(next(c) | 1);
        ct = cp_scratch;
        sm = cp_scratch + ctl;
    }
    cons_w_u32(w, (uint32_t)(8 + 4 + ctl + 4 + sml));
    cons_w_u64(w, *index);
    cons_w_u32(w, (uint32_t)ctl);
    cons_w_bytes(w, ct, ctl);
    cons_w_u32(w, (uint32_t)sml);
    cons_w_bytes(w, sm, sml);
    return 1;
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

/* The fields of VIEW-CHANGE (after its last normal view) and START-VIEW:
 * session start, commit, the checkpoint and the log after it. */
static void put_view_log(struct cons_wbuf *w, struct cur *c)
{
    uint64_t cp;
    cons_w_u64(w, next(c) % 8);
    cons_w_u64(w, next(c));
    put_checkpoint(w, c, &cp);
    put_log(w, c, cp + 1, SEG_MAX);
}

/* nonce, leader flag, session start, commit, checkpoint, log. The nonce is
 * the replica's own (learnt from its RECOVERY) or a byte. */
static void put_recovery_rep(struct cons_wbuf *w, struct cur *c, const struct run *s)
{
    uint8_t b = next(c);
    uint64_t cp;
    cons_w_u64(w, b & 1 ? s->nonce : next(c));
    cons_w_u8(w, (b >> 1) & 1);
    cons_w_u64(w, next(c) % 8);
    cons_w_u64(w, next(c));
    uint64_t lo = put_checkpoint(w, c, &cp) ? cp + 1 : 1 + (uint64_t)next(c);
    put_log(w, c, lo, SEG_MAX);
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
    type = (uint8_t)(NOP_GAP_FIND + type % (NOP_SYNC_SIG + 1 - NOP_GAP_FIND));
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
        break;
    case NOP_SYNC_SIG: /* commit, lo, n entry hashes (mostly not this log's) */
        cons_w_u64(&w, next(c));
        cons_w_u64(&w, 1 + (uint64_t)next(c));
        u = next(c) % 8;
        cons_w_u32(&w, (uint32_t)u);
        for (uint64_t i = 0; i < u; i++)
            cons_w_u64(&w, next(c));
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
    case NOP_STATE:
        cons_w_u64(&w, next(c) % 8);
        cons_w_u64(&w, next(c));
        put_checkpoint(&w, c, &u);
        break;
    case NOP_VC_REQ:
        break;
    default: /* GAP-FIND, GAP-COMMIT-REPLY, SYNC-REPLY: a slot */
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

/* Whether a step that poisoned the replica had the one documented cause
 * a message can give (nop__install): a checkpoint whose client table is
 * valid but whose state machine snapshot the state machine refuses, which
 * it finds only once the table was replaced. */
static int poison_expected(const struct cons_input *in)
{
    struct cons_rbuf b;
    if (in->kind != CONS_IN_MSG || nop__decode(in->buf, in->len, &dec_msg, &dec_op) < 0 ||
        dec_msg.cp_len == 0)
        return 0;
    cons_rbuf_init(&b, dec_msg.cp, dec_msg.cp_len);
    cons_r_u64(&b);
    uint32_t ctl = cons_r_u32(&b);
    const uint8_t *ct = cons_r_bytes(&b, ctl);
    uint32_t sml = cons_r_u32(&b);
    const uint8_t *sm = cons_r_bytes(&b, sml);
    struct cons_sm ops = kv_mem_sm(scratch_kv);
    /* A malformed snapshot is refused whole (FK_EMALFORMED); only another
     * state machine failure may poison (part of the state replaced). */
    if (cons_ctab_load(&scratch_ctab, ct, ctl) != 0)
        return 0;
    int rc = ops.ops->install(ops.impl, sm, sml);
    return rc < 0 && rc != FK_EMALFORMED;
}

/* Feeds one input: its result must be `want`, or FK_EMALFORMED as well
 * when may_malformed. Then the invariants. Returns 0, or -1 when the
 * replica was poisoned for the documented reason (it must be destroyed). */
static int step(struct run *s, const struct cons_input *in, int want, int may_malformed)
{
    struct cons_outbox *out;
    int rc = nop_step(s->r, in, s->now, &out);
    if (rc == FK_EPOISONED && poison_expected(in))
        return -1;
    if (rc != want && !(may_malformed && rc == FK_EMALFORMED))
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
        .snapshot_max = kv_mem_snapshot_max(KEYS_MAX),
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
        make_blobs();
        scratch_kv = kv_mem_create(KEYS_MAX);
        if (!scratch_kv || cons_ctab_init(&scratch_ctab, 3) < 0)
            abort();
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
