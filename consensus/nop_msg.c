/* nop_msg.c: NOPaxos wire messages: validation-first decoding and the
 * encoders the replica uses (layouts in nop_internal.h). */
#include "nop_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <stddef.h>
#include <string.h>

/* Reads "u64 lo, u32 n, entries" and validates every entry. */
static int take_segment(struct cons_rbuf *r, struct nop_msg *m)
{
    m->lo = cons_r_u64(r);
    m->nents = cons_r_u32(r);
    if (r->err || m->lo == 0 || m->nents > CONS_MSG_MAX / 2)
        return FK_EMALFORMED;
    m->ents = *r;
    for (uint32_t i = 0; i < m->nents; i++) {
        uint8_t kind = cons_r_u8(r);
        if (kind == NOP_ENT_REQ) {
            struct cons_rbuf peek = *r;
            struct cons_wire_op h;
            const uint8_t *q = cons_r_bytes(&peek, sizeof h);
            int bytes = q ? cons_wire_skip_op(r) : FK_EMALFORMED;
            if (bytes < 0 || (size_t)bytes > NOP_OP_MAX)
                return FK_EMALFORMED; /* or not a request this protocol carries */
            memcpy(&h, q, sizeof h);
            if (h.type == CONS_OP_NOOP)
                return FK_EMALFORMED; /* a NO-OP travels as its own kind */
        } else if (kind != NOP_ENT_NOOP) {
            return FK_EMALFORMED;
        }
    }
    return r->err ? FK_EMALFORMED : 0;
}

/* Reads "u64 hlo, u32 n, n x u64" (nop__put_hist). */
static int take_hist(struct cons_rbuf *r, struct nop_msg *m)
{
    m->hlo = cons_r_u64(r);
    m->hn = cons_r_u32(r);
    if (r->err || m->hn > CONS_LOG_CAP_MAX)
        return FK_EMALFORMED;
    m->hashes = *r;
    return cons_r_bytes(r, (size_t)m->hn * 8) ? 0 : FK_EMALFORMED;
}

static int decode_body(struct cons_rbuf *r, struct nop_msg *m, struct cons_op *op)
{
    switch (m->type) {
    case NOP_OUM_REQ:
        m->u1 = cons_r_u64(r);
        if (!op || cons_wire_get_op(r, op) < 0 || op->type == CONS_OP_NOOP || m->u1 == 0 ||
            op->ext != NULL)
            return FK_EMALFORMED; /* an op over NOP_OP_MAX: not one NOPaxos carries */
        return 0;
    case NOP_OUM_DROP:
    case NOP_OUM_FILL:
        m->u1 = cons_r_u64(r);
        return m->u1 == 0 ? FK_EMALFORMED : 0;
    case NOP_GAP_COMMIT:
        m->u1 = cons_r_u64(r);
        m->u2 = r->off < r->len ? cons_r_u64(r) : m->u1; /* lo: a run of NO-OPs */
        return m->u2 > m->u1 ? FK_EMALFORMED : 0;
    case NOP_GAP_FIND:
    case NOP_GAP_COMMIT_REP:
        m->u1 = cons_r_u64(r);
        return 0;
    case NOP_SYNC_REP:
        m->u1 = cons_r_u64(r);
        m->u2 = r->off < r->len ? cons_r_u64(r) : 0; /* NOP_SYNC_REP_* flags */
        m->u3 = cons_r_u64(r);                       /* asked */
        m->u4 = cons_r_u64(r);                       /* executed */
        return m->u2 & ~(uint64_t)(NOP_SYNC_REP_DIFFERED | NOP_SYNC_REP_FULL) ? FK_EMALFORMED : 0;
    case NOP_SYNC_SIG:
        /* ents holds the n hashes, 8 bytes each (nop__sig_at). */
        m->u1 = cons_r_u64(r);
        m->lo = cons_r_u64(r);
        m->nents = cons_r_u32(r);
        if (r->err || m->lo == 0 || m->nents > NOP_SYNC_SIGS)
            return FK_EMALFORMED;
        m->ents = *r;
        if (!cons_r_bytes(r, (size_t)m->nents * 8))
            return FK_EMALFORMED;
        m->u4 = cons_r_u64(r); /* safe */
        return 0;
    case NOP_RECOVERY:
        m->u1 = cons_r_u64(r); /* nonce */
        m->u2 = cons_r_u64(r); /* have: restored committed prefix, 0 for none */
        m->u3 = cons_r_u64(r); /* the requester's trim point */
        return m->u3 > m->u2 ? FK_EMALFORMED : 0;
    case NOP_VC_REQ:
        return 0;
    case NOP_GAP_RECV:
        return take_segment(r, m) < 0 || m->nents != 1 ? FK_EMALFORMED : 0;
    case NOP_SYNC:
        m->u1 = cons_r_u64(r);
        if (take_segment(r, m) < 0)
            return FK_EMALFORMED;
        m->u4 = cons_r_u64(r); /* safe */
        return 0;
    case NOP_VC:
        m->u3 = cons_r_u64(r); /* last normal view */
        /* fall through */
    case NOP_START_VIEW:
        m->u1 = cons_r_u64(r);
        m->u2 = cons_r_u64(r);
        return take_segment(r, m) < 0 ? FK_EMALFORMED : take_hist(r, m);
    case NOP_STATE:
        m->u1 = cons_r_u64(r);
        m->u2 = cons_r_u64(r);
        m->u3 = cons_r_u64(r); /* the leader's snap */
        return take_hist(r, m);
    case NOP_RECOVERY_REP:
        m->u1 = cons_r_u64(r);
        m->flag = cons_r_u8(r);
        m->u2 = cons_r_u64(r);
        m->u3 = cons_r_u64(r);
        if (m->flag > 1 || take_segment(r, m) < 0 || take_hist(r, m) < 0)
            return FK_EMALFORMED;
        return 0;
    case NOP_XFER:
        /* The rest is the transfer's own message, which cons_xfer
         * validates; at least its kind byte. */
        m->body = r->p + r->off;
        m->body_len = (uint32_t)(r->len - r->off);
        r->off = r->len;
        return m->body_len >= 1 ? 0 : FK_EMALFORMED;
    default:
        return FK_EMALFORMED; /* REPLY is for clients */
    }
}

int nop__decode(const uint8_t *buf, size_t len, struct nop_msg *m, struct cons_op *op)
{
    struct cons_wire_hdr h;
    struct cons_rbuf r;
    memset(m, 0, sizeof *m);
    if (cons_wire_open(buf, len, CONS_PROTO_NOP, NOP__TYPES, &h, &r) < 0)
        return FK_EMALFORMED;
    m->type = h.type;
    m->from = h.from;
    m->term = h.term;
    if (decode_body(&r, m, op) < 0 || cons_r_done(&r) < 0)
        return FK_EMALFORMED;
    return 0;
}

void nop__entry_next(struct cons_rbuf *rd, struct nop_entry *e)
{
    e->kind = cons_r_u8(rd);
    if (e->kind == NOP_ENT_REQ) {
        int rc = cons_wire_get_op(rd, &e->op);
        FK_ASSERT(rc == 0 && e->op.ext == NULL); /* validated by nop__decode */
    } else {
        memset(&e->op, 0, CONS_OP_HEAD);
        e->op.ext = NULL;
    }
}

void nop__begin(struct nop *r, struct cons_wbuf *w, uint8_t type, uint64_t term)
{
    size_t room = r->ob.arena_cap - r->ob.arena_used;
    if (room > CONS_MSG_MAX)
        room = CONS_MSG_MAX;
    cons_wbuf_init(w, r->ob.arena + r->ob.arena_used, room);
    cons_wire_begin(w, CONS_PROTO_NOP, type, r->cfg.id, term);
}

void nop__send(struct nop *r, struct cons_wbuf *w, struct cons_addr to)
{
    int len = cons_wire_finish(w);
    if (len < 0) {
        r->ob.dropped++;
        return;
    }
    cons_outbox_msg(&r->ob, to, w->p, (uint32_t)len);
}

void nop__send_u64(struct nop *r, uint32_t to, uint8_t type, uint64_t u1)
{
    struct cons_wbuf w;
    nop__begin(r, &w, type, nop__pack(r->view));
    if (type != NOP_VC_REQ)
        cons_w_u64(&w, u1);
    nop__send(r, &w, cons_replica(to));
}

void nop__put_segment(struct nop *r, struct cons_wbuf *w, uint64_t lo, uint64_t hi)
{
    FK_ASSERT(lo >= 1 && (hi < lo || hi <= r->log_len));
    cons_w_u64(w, lo);
    cons_w_u32(w, hi >= lo ? (uint32_t)(hi - lo + 1) : 0);
    for (uint64_t i = lo; i <= hi && i <= r->snap; i++)
        FK_ASSERT(nop__hist_entry(r, i)); /* below snap: still in the ring */
    for (uint64_t i = lo; i <= hi; i++)
        nop__put_one(w, nop__ent(r, i));
}

void nop__put_one(struct cons_wbuf *w, const struct nop_entry *e)
{
    FK_ASSERT(e->kind == NOP_ENT_REQ || e->kind == NOP_ENT_NOOP);
    cons_w_u8(w, e->kind);
    if (e->kind == NOP_ENT_REQ)
        cons_wire_put_op(w, &e->op);
}

void nop__put_hist(struct nop *r, struct cons_wbuf *w)
{
    uint64_t lo = r->snap + 1, h;
    while (lo > 1 && r->snap - (lo - 1) < r->cfg.log_cap && nop__hist_hash(r, lo - 1, &h))
        lo--;
    cons_w_u64(w, lo);
    cons_w_u32(w, (uint32_t)(r->snap + 1 - lo));
    for (uint64_t s = lo; s <= r->snap; s++) {
        nop__hist_hash(r, s, &h);
        cons_w_u64(w, h);
    }
}

void nop__reply(struct nop *r, uint64_t slot, int with_result, const struct cons_reply *rep)
{
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_REPLY, nop__pack(r->view));
    cons_w_u64(&w, slot);
    cons_w_u8(&w, (uint8_t)with_result);
    cons_wire_put_reply(&w, rep);
    nop__send(r, &w, cons_client(rep->client_id));
}

int nop_encode_oum_request(uint8_t *buf, size_t cap, uint32_t session, uint64_t msgnum,
                           const struct cons_op *op)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_wire_begin(&w, CONS_PROTO_NOP, NOP_OUM_REQ, CONS_FROM_CLIENT, session);
    cons_w_u64(&w, msgnum);
    cons_wire_put_op(&w, op);
    return cons_wire_finish(&w);
}

static int encode_oum_number(uint8_t *buf, size_t cap, uint8_t type, uint32_t session,
                             uint64_t msgnum)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_wire_begin(&w, CONS_PROTO_NOP, type, CONS_FROM_CLIENT, session);
    cons_w_u64(&w, msgnum);
    return cons_wire_finish(&w);
}

int nop_encode_oum_drop(uint8_t *buf, size_t cap, uint32_t session, uint64_t msgnum)
{
    return encode_oum_number(buf, cap, NOP_OUM_DROP, session, msgnum);
}

int nop_encode_oum_fill(uint8_t *buf, size_t cap, uint32_t session, uint64_t msgnum)
{
    return encode_oum_number(buf, cap, NOP_OUM_FILL, session, msgnum);
}
