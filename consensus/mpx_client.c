/* mpx_client.c: Multi-Paxos' client-side codecs (mpx.h): a request and a
 * reply on the wire, over cons_wire.c alone, so that libflowkv links
 * these and not the replica (proto/fkc_proto.h). */
#include "mpx_internal.h"

#include "fk_error.h"

int mpx_encode_request(uint8_t *buf, size_t cap, const struct cons_op *op)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_wire_begin(&w, CONS_PROTO_MPX, MPX_REQUEST, CONS_FROM_CLIENT, 0);
    cons_wire_put_op(&w, op);
    return cons_wire_finish(&w);
}

/* The replica's decoder (mpx_msg.c) reads a REPLY the same way: u32 leader
 * hint, then the reply; nothing may follow. */
int mpx_decode_reply(const uint8_t *buf, size_t len, struct cons_reply *reply, const uint8_t **data,
                     uint32_t *leader_hint)
{
    struct cons_wire_hdr h;
    struct cons_rbuf r;
    if (cons_wire_open(buf, len, CONS_PROTO_MPX, MPX__TYPES, &h, &r) < 0 || h.type != MPX_REPLY)
        return FK_EMALFORMED;
    uint32_t hint = cons_r_u32(&r);
    if (r.err || cons_wire_get_reply(&r, reply, data) < 0 || cons_r_done(&r) < 0)
        return FK_EMALFORMED;
    *leader_hint = hint;
    return 0;
}
