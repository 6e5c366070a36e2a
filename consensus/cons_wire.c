/* cons_wire.c: bounded readers and writers and the op/reply layouts. */
#include "cons_wire.h"

#include "fk_assert.h"
#include "fk_error.h"

#include <stddef.h>
#include <string.h>

void cons_wbuf_init(struct cons_wbuf *w, uint8_t *p, size_t cap)
{
    w->p = p;
    w->len = 0;
    w->cap = cap;
    w->err = 0;
}

void cons_w_bytes(struct cons_wbuf *w, const void *src, size_t n)
{
    if (w->err || n > w->cap - w->len) {
        w->err = FK_ETOOBIG;
        return;
    }
    if (n)
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

void cons_w_u8(struct cons_wbuf *w, uint8_t v)
{
    cons_w_bytes(w, &v, 1);
}

/* The host is little-endian (static assert in cons.h), so memcpy of the
 * native integer writes the wire's little-endian bytes. */
void cons_w_u16(struct cons_wbuf *w, uint16_t v)
{
    cons_w_bytes(w, &v, 2);
}

void cons_w_u32(struct cons_wbuf *w, uint32_t v)
{
    cons_w_bytes(w, &v, 4);
}

void cons_w_u64(struct cons_wbuf *w, uint64_t v)
{
    cons_w_bytes(w, &v, 8);
}

void cons_rbuf_init(struct cons_rbuf *r, const uint8_t *p, size_t len)
{
    r->p = p;
    r->off = 0;
    r->len = p ? len : 0;
    r->err = 0;
}

const uint8_t *cons_r_bytes(struct cons_rbuf *r, size_t n)
{
    if (r->err || n > r->len - r->off) {
        r->err = FK_EMALFORMED;
        return NULL;
    }
    const uint8_t *q = r->p + r->off;
    r->off += n;
    return q;
}

#define CONS__R_INT(name, type)                                                                    \
    type name(struct cons_rbuf *r)                                                                 \
    {                                                                                              \
        type v = 0;                                                                                \
        const uint8_t *q = cons_r_bytes(r, sizeof v);                                              \
        if (q)                                                                                     \
            memcpy(&v, q, sizeof v);                                                               \
        return v;                                                                                  \
    }
CONS__R_INT(cons_r_u8, uint8_t)
CONS__R_INT(cons_r_u16, uint16_t)
CONS__R_INT(cons_r_u32, uint32_t)
CONS__R_INT(cons_r_u64, uint64_t)

int cons_r_done(const struct cons_rbuf *r)
{
    if (r->err || r->off != r->len)
        return FK_EMALFORMED;
    return 0;
}

void cons_wire_begin(struct cons_wbuf *w, uint8_t proto, uint8_t type, uint32_t from, uint64_t term)
{
    struct cons_wire_hdr h = {.magic = CONS_WIRE_MAGIC,
                              .version = CONS_WIRE_VERSION,
                              .proto = proto,
                              .type = type,
                              .from = from,
                              .term = term};
    cons_w_bytes(w, &h, sizeof h);
}

int cons_wire_finish(struct cons_wbuf *w)
{
    if (w->err)
        return w->err;
    if (w->len > CONS_MSG_MAX)
        return FK_ETOOBIG;
    uint32_t body = (uint32_t)(w->len - sizeof(struct cons_wire_hdr));
    memcpy(w->p + offsetof(struct cons_wire_hdr, body_len), &body, sizeof body);
    return (int)w->len;
}

int cons_wire_open(const uint8_t *buf, size_t len, uint8_t proto, uint8_t ntypes,
                   struct cons_wire_hdr *h, struct cons_rbuf *r)
{
    if (!buf || len < sizeof *h || len > CONS_MSG_MAX)
        return FK_EMALFORMED;
    memcpy(h, buf, sizeof *h);
    if (h->magic != CONS_WIRE_MAGIC || h->version != CONS_WIRE_VERSION || h->proto != proto ||
        h->type == 0 || h->type >= ntypes || h->body_len != len - sizeof *h)
        return FK_EMALFORMED;
    cons_rbuf_init(r, buf + sizeof *h, h->body_len);
    return 0;
}

void cons_wire_put_op(struct cons_wbuf *w, const struct cons_op *op)
{
    struct cons_wire_op h = {.client_id = op->client_id,
                             .req_no = op->req_no,
                             .type = op->type,
                             .scan_limit = op->scan_limit,
                             .scan_flags = op->scan_flags,
                             .key_len = op->key_len,
                             .val_len = op->val_len,
                             .exp_len = op->exp_len};
    cons_w_bytes(w, &h, sizeof h);
    cons_w_bytes(w, cons_op_key(op), cons_op_nbytes(op));
}

/* Which fields each type carries: NOOP nothing; GET/DEL a key; PUT key and
 * value; CAS key, value and expected; SCAN a start key (may be empty), an
 * end key (may be empty), a limit and its flags. Anything else is
 * malformed, so a core never applies nonsense. */
static int op_shape_ok(const struct cons_wire_op *h)
{
    if (h->key_len > CONS_KEY_MAX || h->val_len > CONS_VAL_MAX || h->exp_len > CONS_VAL_MAX)
        return 0;
    if ((h->type != CONS_OP_SCAN && h->scan_flags != 0) || h->pad[0] || h->pad[1] || h->pad[2])
        return 0;
    switch (h->type) {
    case CONS_OP_NOOP:
        return h->client_id == 0 && h->key_len == 0 && h->val_len == 0 && h->exp_len == 0;
    case CONS_OP_GET:
    case CONS_OP_DEL:
        return h->client_id && h->key_len > 0 && h->val_len == 0 && h->exp_len == 0;
    case CONS_OP_PUT:
        return h->client_id && h->key_len > 0 && h->exp_len == 0;
    case CONS_OP_CAS:
        return h->client_id && h->key_len > 0;
    case CONS_OP_CONFIG:
        return h->client_id && h->key_len == 0 && h->val_len == CONS_CONFIG_BYTES &&
               h->exp_len == 0;
    case CONS_OP_SCAN:
        return h->client_id && h->val_len == 0 && h->exp_len <= CONS_KEY_MAX &&
               h->scan_limit >= 1 && h->scan_limit <= CONS_SCAN_MAX &&
               (h->scan_flags & ~CONS_SCAN_AFTER) == 0;
    default:
        return 0;
    }
}

static int read_op_hdr(struct cons_rbuf *r, struct cons_wire_op *h)
{
    const uint8_t *q = cons_r_bytes(r, sizeof *h);
    if (!q)
        return FK_EMALFORMED;
    memcpy(h, q, sizeof *h);
    if (!op_shape_ok(h) || (h->client_id && h->req_no == 0)) {
        r->err = FK_EMALFORMED;
        return FK_EMALFORMED;
    }
    return 0;
}

int cons_wire_get_op(struct cons_rbuf *r, struct cons_op *op)
{
    struct cons_wire_op h;
    if (read_op_hdr(r, &h) < 0)
        return FK_EMALFORMED;
    size_t n = (size_t)h.key_len + h.val_len + h.exp_len;
    const uint8_t *b = cons_r_bytes(r, n);
    if (r->err)
        return FK_EMALFORMED;
    memset(op, 0, CONS_OP_HEAD);
    op->client_id = h.client_id;
    op->req_no = h.req_no;
    op->type = h.type;
    op->scan_limit = h.scan_limit;
    op->scan_flags = h.scan_flags;
    op->key_len = h.key_len;
    op->val_len = h.val_len;
    op->exp_len = h.exp_len;
    op->ext = NULL;
    if (n > CONS_OP_INLINE)
        op->ext = b; /* in place: no megabyte copied per decode */
    else if (n)
        memcpy(op->inl, b, n);
    return 0;
}

int cons_wire_skip_op(struct cons_rbuf *r)
{
    struct cons_wire_op h;
    if (read_op_hdr(r, &h) < 0)
        return FK_EMALFORMED;
    size_t n = (size_t)h.key_len + h.val_len + h.exp_len;
    cons_r_bytes(r, n);
    return r->err ? FK_EMALFORMED : (int)n;
}

void cons_wire_put_reply(struct cons_wbuf *w, const struct cons_reply *rep)
{
    struct cons_wire_reply h = {
        .client_id = rep->client_id, .req_no = rep->req_no, .status = rep->status, .len = rep->len};
    cons_w_bytes(w, &h, sizeof h);
    cons_w_bytes(w, rep->data, rep->len);
}

int cons_wire_get_reply(struct cons_rbuf *r, struct cons_reply *rep, const uint8_t **data)
{
    struct cons_wire_reply h;
    const uint8_t *q = cons_r_bytes(r, sizeof h);
    if (!q)
        return FK_EMALFORMED;
    memcpy(&h, q, sizeof h);
    if (h.len > CONS_REPLY_MAX || h.status > 0 || h.client_id == 0) {
        r->err = FK_EMALFORMED;
        return FK_EMALFORMED;
    }
    const uint8_t *d = cons_r_bytes(r, h.len);
    if (!d)
        return FK_EMALFORMED;
    rep->client_id = h.client_id;
    rep->req_no = h.req_no;
    rep->status = h.status;
    rep->len = h.len;
    *data = d;
    return 0;
}

/* An op is built here too (cons.h): the one constructor clients and cores
 * share, beside its wire form. */
void cons_op_init(struct cons_op *op, uint8_t type, const void *key, uint32_t key_len,
                  const void *val, uint32_t val_len, const void *exp, uint32_t exp_len)
{
    FK_ASSERT(key_len <= CONS_KEY_MAX);
    memset(op, 0, CONS_OP_HEAD);
    op->type = type;
    op->key_len = (uint16_t)key_len;
    op->val_len = val_len;
    op->exp_len = exp_len;
    op->ext = NULL;
    if (cons_op_nbytes(op) > CONS_OP_INLINE) {
        /* The caller's bytes, one after another (cons_op_init's contract). */
        FK_ASSERT((const uint8_t *)val == (const uint8_t *)key + key_len || val_len == 0);
        op->ext = key;
        return;
    }
    if (key_len)
        memcpy(op->inl, key, key_len);
    if (val_len)
        memcpy(op->inl + key_len, val, val_len);
    if (exp_len)
        memcpy(op->inl + key_len + val_len, exp, exp_len);
}

/* A configuration change's value (cons.h, CONS_OP_CONFIG), beside the
 * op's wire form: clients build it too. */
void cons_config_put(const struct cons_config *c, uint8_t *buf)
{
    memcpy(buf, &c->epoch, 4);
    memcpy(buf + 4, &c->members, 8);
}

int cons_config_get(const struct cons_op *op, struct cons_config *c)
{
    if (op->type != CONS_OP_CONFIG || op->key_len != 0 || op->val_len != CONS_CONFIG_BYTES)
        return FK_EMALFORMED;
    const uint8_t *v = cons_op_val(op);
    memcpy(&c->epoch, v, 4);
    memcpy(&c->members, v + 4, 8);
    return 0;
}
