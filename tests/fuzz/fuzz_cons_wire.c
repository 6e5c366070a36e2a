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
static uint8_t rep_data[CONS_REPLY_MAX];
static uint8_t out[CONS_WIRE_OP_MAX + CONS_WIRE_REPLY_MAX];

/* Whether [p, p + n) lies within the input [data, data + size). */
static int within(const uint8_t *p, size_t n, const uint8_t *data, size_t size)
{
    return p >= data && n <= size && (size_t)(p - data) <= size - n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cons_rbuf r;
    struct cons_wire_hdr h;
    (void)cons_wire_open(data, size, CONS_PROTO_MPX, 16, &h, &r);
    (void)cons_wire_open(data, size, CONS_PROTO_NOP, 32, &h, &r);

    cons_rbuf_init(&r, data, size);
    if (cons_wire_get_op(&r, &op) == 0) {
        /* Accepted: within limits, its bytes inline when they fit and else
         * in the input, and it survives a round trip byte for byte. */
        size_t n = cons_op_nbytes(&op);
        if (op.key_len > CONS_KEY_MAX || op.val_len > CONS_VAL_MAX || op.exp_len > CONS_VAL_MAX)
            abort();
        if ((n > CONS_OP_INLINE) != (op.ext != NULL) || (op.ext && !within(op.ext, n, data, size)))
            abort();
        struct cons_wbuf w;
        cons_wbuf_init(&w, out, sizeof out);
        cons_wire_put_op(&w, &op);
        if (w.err || w.len != r.off || memcmp(out, data, w.len) != 0)
            abort();
        /* Skipping it consumes the same bytes and counts them. */
        struct cons_rbuf s;
        cons_rbuf_init(&s, data, size);
        if (cons_wire_skip_op(&s) != (int)n || s.off != r.off)
            abort();
    } else {
        cons_rbuf_init(&r, data, size);
        if (cons_wire_skip_op(&r) >= 0)
            abort(); /* skip validates as get does */
    }
    const uint8_t *d = NULL;
    cons_rbuf_init(&r, data, size);
    if (cons_wire_get_reply(&r, &rep, &d) == 0) {
        /* Accepted: within limits, its bytes in the input; a round trip. */
        if (rep.len > CONS_REPLY_MAX || !within(d, rep.len, data, size))
            abort();
        if (rep.len)
            memcpy(rep_data, d, rep.len);
        rep.data = rep_data;
        rep.cap = sizeof rep_data;
        struct cons_wbuf w;
        cons_wbuf_init(&w, out, sizeof out);
        cons_wire_put_reply(&w, &rep);
        if (w.err || w.len != r.off || memcmp(out, data, w.len) != 0)
            abort();
    }
    uint32_t hint;
    if (mpx_decode_reply(data, size, &rep, &d, &hint) == 0 &&
        (rep.len > CONS_REPLY_MAX || !within(d, rep.len, data, size)))
        abort();
    return 0;
}
