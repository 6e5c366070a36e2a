/*
 * fuzz_cons_wire.c: libFuzzer target for the wire codecs every core and
 * client shares: the header check, operations, replies and the client-side
 * reply decoder. Decoding must reject bad bytes with FK_EMALFORMED, and
 * whatever it accepts must re-encode within the documented limits.
 */
#include "cons_wire.h"
#include "fk_error.h"
#include "mpx.h"

#include <stdlib.h>
#include <string.h>

static struct cons_op op;
static struct cons_reply rep;
static uint8_t out[CONS_WIRE_OP_MAX + CONS_WIRE_REPLY_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cons_rbuf r;
    struct cons_wire_hdr h;
    (void)cons_wire_open(data, size, CONS_PROTO_MPX, 16, &h, &r);
    (void)cons_wire_open(data, size, CONS_PROTO_NOP, 32, &h, &r);

    cons_rbuf_init(&r, data, size);
    if (cons_wire_get_op(&r, &op) == 0) {
        /* Accepted: within limits, and it survives a round trip. */
        if (op.key_len > CONS_KEY_MAX || op.val_len > CONS_VAL_MAX || op.exp_len > CONS_VAL_MAX)
            abort();
        struct cons_wbuf w;
        cons_wbuf_init(&w, out, sizeof out);
        cons_wire_put_op(&w, &op);
        if (w.err)
            abort();
    }
    cons_rbuf_init(&r, data, size);
    if (cons_wire_get_reply(&r, &rep) == 0 && rep.len > CONS_REPLY_MAX)
        abort();
    cons_rbuf_init(&r, data, size);
    (void)cons_wire_skip_op(&r);
    uint32_t hint;
    (void)mpx_decode_reply(data, size, &rep, &hint);
    return 0;
}
