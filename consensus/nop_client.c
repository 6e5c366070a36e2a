/* nop_client.c: the client's f+1 reply rule for NOPaxos (nop.h). */
#include "nop_internal.h"

#include "fk_error.h"

#include <stddef.h>
#include <string.h>

void nop_quorum_reset(struct nop_quorum *q, uint32_t n, uint64_t client_id, uint64_t req_no)
{
    q->n = n;
    q->client_id = client_id;
    q->req_no = req_no;
    q->ncands = 0;
}

int nop_quorum_add(struct nop_quorum *q, uint32_t from, const uint8_t *buf, size_t len,
                   const struct cons_reply **result)
{
    struct cons_reply rep;
    const uint8_t *data;
    struct nop_view v;
    uint64_t slot;
    int has;
    if (nop_decode_reply(buf, len, &v, &slot, &has, &rep, &data) < 0 || from >= q->n ||
        from >= CONS_REPLICAS_MAX)
        return FK_EMALFORMED;
    if (rep.client_id != q->client_id || rep.req_no != q->req_no)
        return 0;
    if (has && from != v.leader_num % q->n)
        return FK_EPROTO;
    uint64_t view = nop__pack(v);
    uint32_t k = 0, used = q->ncands < NOP_QUORUM_CANDS ? q->ncands : NOP_QUORUM_CANDS;
    while (k < used && !(q->cands[k].view == view && q->cands[k].slot == slot))
        k++;
    if (k == used) {
        /* A new (view, slot); when all are taken the oldest gives way. */
        k = q->ncands++ % NOP_QUORUM_CANDS;
        q->cands[k].view = view;
        q->cands[k].slot = slot;
        q->cands[k].mask = 0;
        q->cands[k].have_result = 0;
    }
    q->cands[k].mask |= 1ull << from;
    if (has) {
        q->cands[k].have_result = 1;
        rep.data = q->cands[k].bytes; /* NOP_RESULT_MAX bytes (nop_decode_reply) */
        rep.cap = sizeof q->cands[k].bytes;
        memcpy(rep.data, data, rep.len);
        q->cands[k].result = rep;
    }
    if (!q->cands[k].have_result || (uint32_t)__builtin_popcountll(q->cands[k].mask) < q->n / 2 + 1)
        return 0;
    *result = &q->cands[k].result;
    return 1;
}

int nop_decode_reply(const uint8_t *buf, size_t len, struct nop_view *view, uint64_t *slot,
                     int *has_result, struct cons_reply *reply, const uint8_t **data)
{
    struct cons_wire_hdr h;
    struct cons_rbuf r;
    if (cons_wire_open(buf, len, CONS_PROTO_NOP, NOP__TYPES, &h, &r) < 0 || h.type != NOP_REPLY)
        return FK_EMALFORMED;
    *slot = cons_r_u64(&r);
    uint8_t flag = cons_r_u8(&r);
    if (r.err || flag > 1 || *slot == 0 || cons_wire_get_reply(&r, reply, data) < 0 ||
        reply->len > NOP_RESULT_MAX || cons_r_done(&r) < 0)
        return FK_EMALFORMED;
    *view = nop__unpack(h.term);
    *has_result = flag;
    return 0;
}
