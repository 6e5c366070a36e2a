/* mpx_msg.c: Multi-Paxos wire messages: validation-first decoding and the
 * encoders the replica uses to fill its outbox. Layouts: mpx_internal.h
 * (enum mpx_type); an entry is u64 index, u64 ballot, u8 nops, nops ops. */
#include "mpx_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

/* Validates `n` entries at r without copying; FK_EMALFORMED on any flaw. */
static int check_entries(struct cons_rbuf *r, uint32_t n, uint32_t max_batch)
{
    if (n > CONS_LOG_CAP_MAX)
        return FK_EMALFORMED;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t index = cons_r_u64(r);
        cons_r_u64(r);
        uint8_t nops = cons_r_u8(r);
        if (r->err || index == 0 || nops == 0 || nops > max_batch)
            return FK_EMALFORMED;
        size_t bytes = MPX_ENTRY_HDR;
        for (uint8_t k = 0; k < nops; k++) {
            int ob = cons_wire_skip_op(r);
            if (ob < 0)
                return FK_EMALFORMED;
            bytes += sizeof(struct cons_wire_op) + (size_t)ob;
        }
        if (bytes > MPX_ENTRY_MAX)
            return FK_EMALFORMED; /* larger than any leader makes (propose) */
    }
    return 0;
}

/* Reads "u32 n, entries" into m->ents after validating them. */
static int take_entries(struct cons_rbuf *r, struct mpx_msg *m, uint32_t max_batch)
{
    m->nents = cons_r_u32(r);
    if (r->err)
        return FK_EMALFORMED;
    m->ents = *r;
    m->ents.len = r->len;
    if (check_entries(r, m->nents, max_batch) < 0)
        return FK_EMALFORMED;
    return 0;
}

/* Reads a crash vector "u8 n, u64 gen[n]" (mpx_recover.c). */
static int take_cv(struct cons_rbuf *r, struct mpx_msg *m)
{
    m->ncv = cons_r_u8(r);
    m->cv = cons_r_bytes(r, (size_t)m->ncv * 8);
    return m->cv && m->ncv >= 1 && m->ncv <= CONS_REPLICAS_MAX ? 0 : FK_EMALFORMED;
}

/* Reads a configuration (MPX_CONF_BYTES): some member, none outside the
 * ids a cluster may have. */
static int take_conf(struct cons_rbuf *r, struct mpx_msg *m)
{
    m->conf.epoch = cons_r_u32(r);
    m->conf.members = cons_r_u64(r);
    m->conf_slot = cons_r_u64(r);
    m->conf_prev = cons_r_u64(r);
    return !r->err && m->conf_prev >> CONS_REPLICAS_MAX == 0 && m->conf.members != 0 &&
                   m->conf.members >> CONS_REPLICAS_MAX == 0
               ? 0
               : FK_EMALFORMED;
}

static int decode_body(struct cons_rbuf *r, struct mpx_msg *m, struct cons_op *op,
                       struct cons_reply *rep, const uint8_t **data, uint32_t max_batch)
{
    switch (m->type) {
    case MPX_REQUEST:
        if (!op || cons_wire_get_op(r, op) < 0 || op->type == CONS_OP_NOOP)
            return FK_EMALFORMED;
        return 0;
    case MPX_REPLY:
        m->hint = cons_r_u32(r);
        return rep ? cons_wire_get_reply(r, rep, data) : FK_EMALFORMED;
    case MPX_PREVOTE_OK:
        m->u1 = cons_r_u8(r);
        return m->u1 > 1 ? FK_EMALFORMED : 0;
    case MPX_PREVOTE:
    case MPX_COMMIT:
    case MPX_PREPARE:
    case MPX_CATCHUP_REQ:
    case MPX_TIMEOUT_NOW:
        m->u1 = cons_r_u64(r);
        return 0;
    case MPX_RECOVER:
        m->u1 = cons_r_u64(r);
        m->u2 = cons_r_u64(r);
        return 0;
    case MPX_RECOVER_GEN:
        m->u1 = cons_r_u64(r);
        m->u2 = cons_r_u64(r);
        return take_conf(r, m);
    case MPX_NACK:
        return 0;
    case MPX_PROMISE:
        if (take_cv(r, m) < 0)
            return FK_EMALFORMED;
        m->u1 = cons_r_u64(r);
        m->u2 = cons_r_u64(r);
        return take_entries(r, m, max_batch);
    case MPX_ACCEPT:
    case MPX_CATCHUP:
        m->u1 = cons_r_u64(r);
        return take_entries(r, m, max_batch);
    case MPX_ACCEPTED:
        if (take_cv(r, m) < 0)
            return FK_EMALFORMED;
        m->nidx = cons_r_u32(r);
        if (m->nidx == 0 || m->nidx > MPX_ACK_IDX_MAX)
            return FK_EMALFORMED;
        m->idx = cons_r_bytes(r, (size_t)m->nidx * 8);
        return 0;
    case MPX_XFER:
        /* The rest is the transfer's own message, which cons_xfer
         * validates as it reads it. */
        m->u1 = cons_r_u8(r);
        m->body_len = (uint32_t)(r->len - r->off);
        m->body = cons_r_bytes(r, m->body_len);
        return r->err ? FK_EMALFORMED : 0;
    case MPX_COMPACTED:
        m->u1 = cons_r_u64(r);
        return 0;
    case MPX_RECOVER_REPLY:
        m->u1 = cons_r_u64(r);
        m->u2 = cons_r_u64(r);
        if (take_cv(r, m) < 0)
            return FK_EMALFORMED;
        m->u3 = cons_r_u64(r);
        if (take_conf(r, m) < 0)
            return FK_EMALFORMED;
        return take_entries(r, m, max_batch);
    default:
        return FK_EMALFORMED;
    }
}

static int decode(const uint8_t *buf, size_t len, struct mpx_msg *m, struct cons_op *op,
                  struct cons_reply *rep, const uint8_t **data, uint32_t max_batch)
{
    struct cons_wire_hdr h;
    struct cons_rbuf r;
    memset(m, 0, sizeof *m);
    if (cons_wire_open(buf, len, CONS_PROTO_MPX, MPX__TYPES, &h, &r) < 0)
        return FK_EMALFORMED;
    m->type = h.type;
    m->from = h.from;
    m->term = h.term;
    if (decode_body(&r, m, op, rep, data, max_batch) < 0 || cons_r_done(&r) < 0)
        return FK_EMALFORMED;
    if ((m->type == MPX_REQUEST) != (h.from == CONS_FROM_CLIENT))
        return FK_EMALFORMED;
    return 0;
}

int mpx__decode(const uint8_t *buf, size_t len, struct mpx_msg *m, struct cons_op *op,
                uint32_t max_batch)
{
    return decode(buf, len, m, op, NULL, NULL, max_batch);
}

int mpx__entry_next(struct cons_rbuf *r, uint64_t *index, uint64_t *ballot, uint8_t *nops,
                    struct cons_op *ops, uint32_t max_ops)
{
    *index = cons_r_u64(r);
    *ballot = cons_r_u64(r);
    *nops = cons_r_u8(r);
    if (r->err || *index == 0 || *nops == 0 || *nops > max_ops)
        return FK_EMALFORMED;
    for (uint8_t k = 0; k < *nops; k++) {
        if (cons_wire_get_op(r, &ops[k]) < 0)
            return FK_EMALFORMED;
    }
    return 0;
}

void mpx__put_entry(struct cons_wbuf *w, const struct mpx_slot *s)
{
    FK_ASSERT(s->index != 0 && s->nops >= 1);
    cons_w_u64(w, s->index);
    cons_w_u64(w, s->ballot);
    cons_w_u8(w, s->nops);
    for (uint8_t k = 0; k < s->nops; k++)
        cons_wire_put_op(w, &s->ops[k]);
}

void mpx__begin(struct mpx *r, struct cons_wbuf *w, uint8_t type, uint64_t term)
{
    size_t room = r->ob.arena_cap - r->ob.arena_used;
    if (room > CONS_MSG_MAX)
        room = CONS_MSG_MAX;
    cons_wbuf_init(w, r->ob.arena + r->ob.arena_used, room);
    cons_wire_begin(w, CONS_PROTO_MPX, type, r->cfg.id, term);
}

void mpx__send(struct mpx *r, struct cons_wbuf *w, struct cons_addr to)
{
    int len = cons_wire_finish(w);
    if (len < 0) {
        r->ob.dropped++; /* arena full: like a lost message */
        return;
    }
    cons_outbox_msg(&r->ob, to, w->p, (uint32_t)len);
}

void mpx__put_conf(const struct mpx *r, struct cons_wbuf *w)
{
    cons_w_u32(w, r->conf.epoch);
    cons_w_u64(w, r->conf.members);
    cons_w_u64(w, r->conf_slot);
    cons_w_u64(w, r->prev_members);
}

void mpx__put_cv(const struct mpx *r, struct cons_wbuf *w)
{
    cons_w_u8(w, (uint8_t)r->cfg.n);
    for (uint32_t p = 0; p < r->cfg.n; p++)
        cons_w_u64(w, r->known[p]);
}

uint64_t mpx__cv_get(const struct mpx_msg *m, uint32_t p)
{
    FK_ASSERT(p < m->ncv);
    uint64_t g;
    memcpy(&g, m->cv + 8 * (size_t)p, sizeof g);
    return g;
}

void mpx__send_simple(struct mpx *r, struct cons_addr to, uint8_t type, uint64_t term, uint64_t u1)
{
    struct cons_wbuf w;
    mpx__begin(r, &w, type, term);
    if (type == MPX_PREVOTE_OK)
        cons_w_u8(&w, (uint8_t)u1);
    else if (type != MPX_NACK)
        cons_w_u64(&w, u1);
    mpx__send(r, &w, to);
}

/* Sends the slots in [lo, hi] that hold entries (only chosen ones when
 * chosen_only), at most MPX_MSG_ENTRIES of them. Layout: u64 u1 then
 * "u32 n, entries"; PROMISE callers write their second field via u1 too. */
void mpx__send_entries(struct mpx *r, struct cons_addr to, uint8_t type, uint64_t term, uint64_t u1,
                       uint64_t lo, uint64_t hi, int chosen_only)
{
    struct cons_wbuf w;
    mpx__begin(r, &w, type, term);
    if (type == MPX_PROMISE) {
        mpx__put_cv(r, &w);
        cons_w_u64(&w, r->snap_index);
    }
    cons_w_u64(&w, u1);
    size_t count_at = w.len;
    cons_w_u32(&w, 0);
    uint32_t n = 0;
    /* A promise carries the whole suffix (at most log_cap entries, sized in
     * mpx_create); other messages a bounded chunk. */
    uint32_t max = type == MPX_PROMISE ? r->cfg.log_cap : MPX_MSG_ENTRIES;
    for (uint64_t i = lo; i <= hi && n < max; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        if (!s || (chosen_only && !s->chosen))
            continue;
        /* Others a bounded chunk in bytes too (entries of large values):
         * the receiver asks again for the rest. A promise must carry all:
         * the log's budget makes it fit (mpx.c, big_default). */
        if (type != MPX_PROMISE && n > 0 && mpx__entry_bytes(s) > w.cap - w.len)
            break;
        mpx__put_entry(&w, s);
        n++;
    }
    if (!w.err)
        memcpy(w.p + count_at, &n, sizeof n);
    mpx__send(r, &w, to);
}

void mpx__reply_hint(struct mpx *r, uint64_t client, const struct cons_reply *rep, uint32_t hint)
{
    struct cons_wbuf w;
    mpx__begin(r, &w, MPX_REPLY, r->promised);
    cons_w_u32(&w, hint);
    cons_wire_put_reply(&w, rep);
    mpx__send(r, &w, cons_client(client));
}

void mpx__reply(struct mpx *r, uint64_t client, const struct cons_reply *rep)
{
    mpx__reply_hint(r, client, rep, r->leader);
}
