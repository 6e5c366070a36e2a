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
    t->keys = calloc(slots, sizeof *t->keys);
    t->scratch = calloc(slots, sizeof *t->scratch);
    t->rows = calloc(slots, sizeof *t->rows);
    if (!t->keys || !t->scratch || !t->rows) {
        cons_ctab_free(t);
        return FK_ENOMEM;
    }
    t->slots = slots;
    t->cap = cap;
    return 0;
}

void cons_ctab_free(struct cons_ctab *t)
{
    free(t->keys);
    free(t->scratch);
    free(t->rows);
    memset(t, 0, sizeof *t);
}

/* Linear probing over a key array: the slot holding client_id, or the
 * empty slot where it would go. Deletion shifts rows back instead of
 * leaving tombstones (ctab_remove), so a probe stops at the first empty
 * slot; load stays <= 1/2, so probes are short and one always ends. */
static uint32_t ctab_slot(const struct cons_ctab_key *keys, uint32_t slots, uint64_t client_id)
{
    uint32_t mask = slots - 1;
    uint32_t i = (uint32_t)mix64(client_id) & mask;
    for (uint32_t n = 0; n < slots; n++, i = (i + 1) & mask) {
        if (keys[i].client_id == client_id || keys[i].client_id == 0)
            return i;
    }
    assert(0 && "client table without an empty slot");
    return 0;
}

struct cons_ctab_row *cons_ctab_find(struct cons_ctab *t, uint64_t client_id)
{
    assert(client_id != 0);
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    return t->keys[i].client_id == client_id ? &t->rows[i] : NULL;
}

static void row_copy(struct cons_ctab_row *dst, const struct cons_reply *reply)
{
    dst->client_id = reply->client_id;
    cons_reply_copy(&dst->reply, reply);
}

/* Empties slot i and shifts later rows of its probe run back into the hole
 * (Knuth's algorithm R for linear probing): a row at j moves to the hole
 * unless its home slot lies cyclically in (hole, j]. */
static void ctab_remove(struct cons_ctab *t, uint32_t hole)
{
    uint32_t mask = t->slots - 1, j = hole;
    for (uint32_t n = 0; n < t->slots; n++) {
        j = (j + 1) & mask;
        if (t->keys[j].client_id == 0)
            break;
        uint32_t home = (uint32_t)mix64(t->keys[j].client_id) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->keys[hole] = t->keys[j];
            row_copy(&t->rows[hole], &t->rows[j].reply);
            hole = j;
        }
    }
    t->keys[hole].client_id = 0;
    t->keys[hole].used = 0;
    t->rows[hole].client_id = 0;
}

/* The least recently used row: smallest stamp, then smallest client id.
 * Depends only on the table's contents, never on slot order. */
static uint32_t ctab_lru(const struct cons_ctab *t)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < t->slots; i++) {
        const struct cons_ctab_key *k = &t->keys[i];
        if (k->client_id == 0)
            continue;
        if (best == UINT32_MAX || k->used < t->keys[best].used ||
            (k->used == t->keys[best].used && k->client_id < t->keys[best].client_id))
            best = i;
    }
    assert(best != UINT32_MAX);
    return best;
}

/* The slot of client_id's row, stamped `used`: a new row when it has none,
 * after evicting the least recently used one when the table is full
 * (*evicted = 1). */
static uint32_t ctab_claim(struct cons_ctab *t, uint64_t client_id, uint64_t used, int *evicted)
{
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    *evicted = 0;
    if (t->keys[i].client_id == 0) {
        if (t->used >= t->cap) {
            ctab_remove(t, ctab_lru(t));
            t->used--;
            t->evicted++;
            *evicted = 1;
            i = ctab_slot(t->keys, t->slots, client_id); /* rows moved */
        }
        t->used++;
        t->keys[i].client_id = client_id;
    }
    assert(t->used <= t->cap && t->keys[i].client_id == client_id);
    t->keys[i].used = used;
    return i;
}

int cons_ctab_put(struct cons_ctab *t, const struct cons_reply *reply, uint64_t used)
{
    assert(reply->client_id != 0 && reply->len <= CONS_REPLY_MAX);
    int evicted;
    uint32_t i = ctab_claim(t, reply->client_id, used, &evicted);
    row_copy(&t->rows[i], reply);
    return evicted;
}

/* Layout: u64 ops, u32 count, then count times (u64 stamp, encoded reply:
 * cons_wire_put_reply). */
int cons_ctab_save(const struct cons_ctab *t, uint8_t *buf, size_t cap, size_t *len)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_w_u64(&w, t->ops);
    cons_w_u32(&w, t->used);
    for (uint32_t i = 0; i < t->slots; i++) {
        if (t->keys[i].client_id) {
            cons_w_u64(&w, t->keys[i].used);
            cons_wire_put_reply(&w, &t->rows[i].reply);
        }
    }
    if (w.err)
        return FK_ETOOBIG;
    *len = w.len;
    return 0;
}

/* Checks every record and lays out the new key array in t->scratch, so a
 * bad snapshot (truncated, a duplicate client, a stamp from the future)
 * leaves the table untouched. */
static int ctab_load_keys(struct cons_ctab *t, struct cons_rbuf v, uint32_t n, uint64_t ops)
{
    memset(t->scratch, 0, (size_t)t->slots * sizeof *t->scratch);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t used = cons_r_u64(&v);
        struct cons_wire_reply h;
        const uint8_t *q = cons_r_bytes(&v, sizeof h);
        if (!q)
            return FK_EMALFORMED;
        memcpy(&h, q, sizeof h);
        /* What cons_wire_get_reply accepts, checked again below by assert. */
        if (h.client_id == 0 || h.status > 0 || used > ops || h.len > CONS_REPLY_MAX ||
            !cons_r_bytes(&v, h.len))
            return FK_EMALFORMED;
        uint32_t s = ctab_slot(t->scratch, t->slots, h.client_id);
        if (t->scratch[s].client_id != 0)
            return FK_EMALFORMED; /* a duplicate client */
        t->scratch[s].client_id = h.client_id;
        t->scratch[s].used = used;
    }
    return cons_r_done(&v) < 0 ? FK_EMALFORMED : 0;
}

/* Parses the table's header into *r, *ops and *n and validates every row
 * into t->scratch (the live table is untouched). */
static int ctab_parse(struct cons_ctab *t, const uint8_t *buf, size_t len, struct cons_rbuf *r,
                      uint64_t *ops, uint32_t *n)
{
    cons_rbuf_init(r, buf, len);
    *ops = cons_r_u64(r);
    *n = cons_r_u32(r);
    if (r->err)
        return FK_EMALFORMED;
    if (*n > t->cap)
        return FK_EFULL;
    return ctab_load_keys(t, *r, *n, *ops);
}

int cons_ctab_check(struct cons_ctab *t, const uint8_t *buf, size_t len)
{
    struct cons_rbuf r;
    uint64_t ops;
    uint32_t n;
    return ctab_parse(t, buf, len, &r, &ops, &n);
}

int cons_ctab_load(struct cons_ctab *t, const uint8_t *buf, size_t len)
{
    struct cons_rbuf r;
    uint64_t ops;
    uint32_t n;
    int rc = ctab_parse(t, buf, len, &r, &ops, &n);
    if (rc < 0)
        return rc;
    struct cons_ctab_key *old = t->keys;
    t->keys = t->scratch;
    t->scratch = old;
    for (uint32_t i = 0; i < t->slots; i++)
        t->rows[i].client_id = t->keys[i].client_id;
    for (uint32_t i = 0; i < n; i++) {
        cons_r_u64(&r); /* the stamp, already placed */
        uint64_t id;
        memcpy(&id, r.p + r.off, sizeof id); /* validated above */
        uint32_t s = ctab_slot(t->keys, t->slots, id);
        assert(t->keys[s].client_id == id);
        rc = cons_wire_get_reply(&r, &t->rows[s].reply);
        assert(rc == 0);
    }
    t->used = n;
    t->ops = ops;
    return 0;
}

/* Where op stands against its client's row, the one decision that
 * cons_apply_once and cons_log_read share so that every replica moves its
 * table alike: older than the row, the row's own request, refused (no
 * row and req_no > 1: the row was evicted, cons.h; applying it could
 * apply a request twice), or new. */
enum ctab_verdict { CTAB_NEW, CTAB_DUP, CTAB_OLD, CTAB_EXPIRED };

static enum ctab_verdict ctab_judge(struct cons_ctab *t, const struct cons_op *op,
                                    struct cons_ctab_row **row)
{
    *row = cons_ctab_find(t, op->client_id);
    if (*row != NULL)
        return op->req_no < (*row)->reply.req_no    ? CTAB_OLD
               : op->req_no == (*row)->reply.req_no ? CTAB_DUP
                                                    : CTAB_NEW;
    return op->req_no > 1 ? CTAB_EXPIRED : CTAB_NEW;
}

int cons_apply_once(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op,
                    struct cons_reply *reply)
{
    assert(op->type != CONS_OP_NOOP && op->client_id != 0);
    struct cons_ctab_row *row;
    enum ctab_verdict v = ctab_judge(t, op, &row);
    if (v == CTAB_OLD)
        return 2;
    if (v == CTAB_DUP && row->reply.status != FK_EUNKEPT) {
        cons_reply_copy(reply, &row->reply);
        return 1;
    }
    reply->client_id = op->client_id;
    reply->req_no = op->req_no;
    reply->len = 0;
    if (v == CTAB_DUP) {
        /* Logged unexecuted (cons_log_read): a read is read again, here
         * and now, which linearizes it within its retry; the table stays
         * as it is on every replica. */
        if (!cons_op_reads(op)) {
            reply->status = FK_EEXPIRED;
            return 1;
        }
        int rc = sm->ops->apply(sm->impl, op, reply);
        return rc < 0 ? rc : 1;
    }
    if (v == CTAB_EXPIRED) {
        reply->status = FK_EEXPIRED; /* refused, not applied */
        return 0;
    }
    int rc = sm->ops->apply(sm->impl, op, reply);
    if (rc < 0)
        return rc;
    assert(reply->len <= CONS_REPLY_MAX);
    cons_ctab_put(t, reply, ++t->ops);
    return 0;
}

int cons_log_read(struct cons_ctab *t, const struct cons_op *op)
{
    assert(cons_op_reads(op) && op->client_id != 0);
    struct cons_ctab_row *row;
    enum ctab_verdict v = ctab_judge(t, op, &row);
    if (v != CTAB_NEW)
        return v == CTAB_OLD ? 2 : v == CTAB_DUP ? 1 : 0; /* as cons_apply_once */
    int evicted;
    uint32_t i = ctab_claim(t, op->client_id, ++t->ops, &evicted);
    row = &t->rows[i];
    row->client_id = op->client_id;
    row->reply.client_id = op->client_id;
    row->reply.req_no = op->req_no;
    row->reply.status = FK_EUNKEPT;
    row->reply.len = 0;
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
