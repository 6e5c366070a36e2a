/* cons.c: the client table, exactly-once apply and outbox helpers. */
#include "cons.h"
#include "cons_wire.h"

#include "fk_error.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

int cons_ctab_init(struct cons_ctab *t, uint32_t cap)
{
    memset(t, 0, sizeof *t);
    if (cap == 0 || cap > CONS_CLIENTS_MAX)
        return FK_EINVAL;
    uint32_t slots = 2;
    while (slots < 2 * cap)
        slots *= 2;
    t->rows = calloc(slots, sizeof *t->rows);
    if (!t->rows)
        return FK_ENOMEM;
    t->slots = slots;
    t->cap = cap;
    return 0;
}

void cons_ctab_free(struct cons_ctab *t)
{
    free(t->rows);
    memset(t, 0, sizeof *t);
}

/* Linear probing; the table never deletes, so a probe stops at an empty
 * slot. Load stays <= 1/2, so probes are short. */
static struct cons_ctab_row *ctab_slot(struct cons_ctab *t, uint64_t client_id)
{
    uint32_t mask = t->slots - 1;
    uint32_t i = (uint32_t)mix64(client_id) & mask;
    for (uint32_t n = 0; n < t->slots; n++, i = (i + 1) & mask) {
        if (t->rows[i].client_id == client_id || t->rows[i].client_id == 0)
            return &t->rows[i];
    }
    return NULL;
}

struct cons_ctab_row *cons_ctab_find(struct cons_ctab *t, uint64_t client_id)
{
    assert(client_id != 0);
    struct cons_ctab_row *row = ctab_slot(t, client_id);
    return row && row->client_id == client_id ? row : NULL;
}

int cons_ctab_put(struct cons_ctab *t, const struct cons_reply *reply)
{
    assert(reply->client_id != 0);
    struct cons_ctab_row *row = ctab_slot(t, reply->client_id);
    assert(row != NULL);
    if (row->client_id == 0) {
        if (t->used >= t->cap)
            return FK_EFULL;
        t->used++;
        row->client_id = reply->client_id;
    }
    row->reply.client_id = reply->client_id;
    row->reply.req_no = reply->req_no;
    row->reply.status = reply->status;
    row->reply.len = reply->len;
    memcpy(row->reply.data, reply->data, reply->len);
    return 0;
}

/* Layout: u32 count, then count encoded replies (cons_wire_put_reply). */
int cons_ctab_save(const struct cons_ctab *t, uint8_t *buf, size_t cap, size_t *len)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_w_u32(&w, t->used);
    for (uint32_t i = 0; i < t->slots; i++) {
        if (t->rows[i].client_id)
            cons_wire_put_reply(&w, &t->rows[i].reply);
    }
    if (w.err)
        return FK_ETOOBIG;
    *len = w.len;
    return 0;
}

int cons_ctab_load(struct cons_ctab *t, const uint8_t *buf, size_t len)
{
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    uint32_t n = cons_r_u32(&r);
    if (r.err)
        return FK_EMALFORMED;
    if (n > t->cap)
        return FK_EFULL;
    /* Validate everything before touching the table. */
    struct cons_rbuf v = r;
    for (uint32_t i = 0; i < n; i++) {
        struct cons_wire_reply h;
        const uint8_t *q = cons_r_bytes(&v, sizeof h);
        if (!q)
            return FK_EMALFORMED;
        memcpy(&h, q, sizeof h);
        if (h.client_id == 0 || h.len > CONS_REPLY_MAX || !cons_r_bytes(&v, h.len))
            return FK_EMALFORMED;
    }
    if (cons_r_done(&v) < 0)
        return FK_EMALFORMED;
    memset(t->rows, 0, (size_t)t->slots * sizeof *t->rows);
    t->used = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id;
        memcpy(&id, r.p + r.off, sizeof id); /* validated above */
        struct cons_ctab_row *row = ctab_slot(t, id);
        assert(row != NULL);
        if (row->client_id != 0)
            return FK_EMALFORMED; /* duplicate client: reject */
        int rc = cons_wire_get_reply(&r, &row->reply);
        assert(rc == 0);
        row->client_id = id;
        t->used++;
    }
    return 0;
}

int cons_apply_once(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op,
                    struct cons_reply *reply)
{
    assert(op->type != CONS_OP_NOOP && op->client_id != 0);
    struct cons_ctab_row *row = cons_ctab_find(t, op->client_id);
    if (row && op->req_no < row->reply.req_no)
        return 2;
    if (row && op->req_no == row->reply.req_no) {
        memcpy(reply, &row->reply, offsetof(struct cons_reply, data) + row->reply.len);
        return 1;
    }
    reply->client_id = op->client_id;
    reply->req_no = op->req_no;
    reply->len = 0;
    if (!row && t->used >= t->cap) {
        /* Deterministic on every replica: the op is refused, not applied. */
        reply->status = FK_EFULL;
        return 0;
    }
    int rc = sm->ops->apply(sm->impl, op, reply);
    if (rc < 0)
        return rc;
    assert(reply->len <= CONS_REPLY_MAX);
    rc = cons_ctab_put(t, reply);
    assert(rc == 0);
    return 0;
}

void cons_outbox_reset(struct cons_outbox *ob)
{
    ob->nmsgs = 0;
    ob->npersists = 0;
    ob->dropped = 0;
    ob->arena_used = 0;
}

uint8_t *cons_outbox_alloc(struct cons_outbox *ob, size_t len)
{
    if (len > ob->arena_cap - ob->arena_used)
        return NULL;
    return ob->arena + ob->arena_used;
}

int cons_outbox_msg(struct cons_outbox *ob, struct cons_addr to, const uint8_t *buf, uint32_t len)
{
    assert(buf == ob->arena + ob->arena_used);
    assert(len <= ob->arena_cap - ob->arena_used);
    if (ob->nmsgs >= CONS_OUT_MSGS_MAX) {
        ob->dropped++;
        return FK_EFULL;
    }
    ob->msgs[ob->nmsgs++] = (struct cons_out_msg){.to = to, .buf = buf, .len = len};
    ob->arena_used += len;
    return 0;
}
