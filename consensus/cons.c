/* cons.c: the client table, exactly-once apply and outbox helpers. */
#include "cons.h"
#include "cons_wire.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

int cons_op_store(struct cons_op *dst, struct cons_big *big, struct cons_bigpool *pool,
                  const struct cons_op *src)
{
    size_t n = cons_op_nbytes(src);
    if (n <= CONS_OP_INLINE) {
        if (src->ext) {
            memcpy(dst, src, CONS_OP_HEAD);
            dst->ext = NULL;
            memcpy(dst->inl, src->ext, n);
        } else if (dst != src) {
            cons_op_copy(dst, src);
        }
        cons_big_free(big, pool); /* a small op: the slot gives its megabyte back */
        return 0;
    }
    if (big->cap < n) {
        size_t more = n - big->cap;
        if (more > pool->max - pool->held)
            return FK_EFULL;
        uint8_t *p = realloc(big->p, n);
        if (p == NULL)
            return FK_ENOMEM;
        big->p = p;
        big->cap = (uint32_t)n;
        pool->held += more;
    }
    FK_ASSERT(src->ext != big->p); /* a store into itself would read what it writes */
    memcpy(big->p, cons_op_key(src), n);
    memcpy(dst, src, CONS_OP_HEAD);
    dst->ext = big->p;
    return 0;
}

void cons_big_free(struct cons_big *big, struct cons_bigpool *pool)
{
    if (big->p == NULL)
        return;
    FK_ASSERT(pool->held >= big->cap);
    pool->held -= big->cap;
    free(big->p);
    big->p = NULL;
    big->cap = 0;
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
    t->order = calloc(cap, sizeof *t->order);
    if (!t->keys || !t->scratch || !t->rows || !t->order) {
        cons_ctab_free(t);
        return FK_ENOMEM;
    }
    t->slots = slots;
    t->cap = cap;
    t->head = t->tail = CONS_CTAB_NIL;
    return 0;
}

void cons_ctab_free(struct cons_ctab *t)
{
    free(t->keys);
    free(t->scratch);
    free(t->rows);
    free(t->order);
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
    /* A table always keeps empty slots (cons.h): none is corruption. */
    fk__assert_fail("client table without an empty slot", __FILE__, __LINE__, __func__);
}

struct cons_ctab_row *cons_ctab_find(struct cons_ctab *t, uint64_t client_id)
{
    FK_ASSERT(client_id != 0);
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    return t->keys[i].client_id == client_id ? &t->rows[i] : NULL;
}

/* ---- the recency list: rows linked in (stamp, client id) order -------- */

/* Whether slot a's row comes before slot b's: an older stamp, or the same
 * stamp and a smaller client id (cons.h, eviction). */
static int ctab_before(const struct cons_ctab *t, uint32_t a, uint32_t b)
{
    const struct cons_ctab_key *x = &t->keys[a], *y = &t->keys[b];
    return x->used < y->used || (x->used == y->used && x->client_id < y->client_id);
}

static void ctab_unlink(struct cons_ctab *t, uint32_t i)
{
    struct cons_ctab_row *r = &t->rows[i];
    if (r->prev != CONS_CTAB_NIL)
        t->rows[r->prev].next = r->next;
    else
        t->head = r->next;
    if (r->next != CONS_CTAB_NIL)
        t->rows[r->next].prev = r->prev;
    else
        t->tail = r->prev;
}

/* Links slot i at its place, searching back from the tail: a row stamped
 * with a new largest stamp (every cons_apply_once) goes straight there. */
static void ctab_link(struct cons_ctab *t, uint32_t i)
{
    uint32_t after = t->tail;
    while (after != CONS_CTAB_NIL && ctab_before(t, i, after))
        after = t->rows[after].prev;
    struct cons_ctab_row *r = &t->rows[i];
    r->prev = after;
    r->next = after == CONS_CTAB_NIL ? t->head : t->rows[after].next;
    if (r->next != CONS_CTAB_NIL)
        t->rows[r->next].prev = i;
    else
        t->tail = i;
    if (after != CONS_CTAB_NIL)
        t->rows[after].next = i;
    else
        t->head = i;
}

/* The row in slot j moved to slot h (ctab_remove): its neighbours follow. */
static void ctab_moved(struct cons_ctab *t, uint32_t j, uint32_t h)
{
    struct cons_ctab_row *r = &t->rows[h];
    *r = t->rows[j];
    if (r->prev != CONS_CTAB_NIL)
        t->rows[r->prev].next = h;
    else
        t->head = h;
    if (r->next != CONS_CTAB_NIL)
        t->rows[r->next].prev = h;
    else
        t->tail = h;
}

/* Empties slot i and shifts later rows of its probe run back into the hole
 * (Knuth's algorithm R for linear probing): a row at j moves to the hole
 * unless its home slot lies cyclically in (hole, j]. */
static void ctab_remove(struct cons_ctab *t, uint32_t hole)
{
    ctab_unlink(t, hole);
    uint32_t mask = t->slots - 1, j = hole;
    for (uint32_t n = 0; n < t->slots; n++) {
        j = (j + 1) & mask;
        if (t->keys[j].client_id == 0)
            break;
        uint32_t home = (uint32_t)mix64(t->keys[j].client_id) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->keys[hole] = t->keys[j];
            ctab_moved(t, j, hole);
            hole = j;
        }
    }
    t->keys[hole].client_id = 0;
    t->keys[hole].used = 0;
    t->rows[hole].client_id = 0;
}

/* The slot of client_id's row, stamped `used`: a new row when it has none,
 * after evicting the least recently used one when the table is full
 * (*evicted = 1). */
static uint32_t ctab_claim(struct cons_ctab *t, uint64_t client_id, uint64_t used, int *evicted)
{
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    *evicted = 0;
    t->last_evicted = 0;
    if (t->keys[i].client_id == 0) {
        if (t->used >= t->cap) {
            /* The least recently used row: the list's head, an order that
             * depends only on the table's contents, never on slots. */
            t->last_evicted = t->keys[t->head].client_id;
            ctab_remove(t, t->head);
            t->used--;
            t->evicted++;
            *evicted = 1;
            i = ctab_slot(t->keys, t->slots, client_id); /* rows moved */
        }
        t->used++;
        t->keys[i].client_id = client_id;
        t->rows[i].client_id = client_id;
    } else {
        ctab_unlink(t, i);
    }
    FK_ASSERT(t->used <= t->cap && t->keys[i].client_id == client_id);
    t->keys[i].used = used;
    ctab_link(t, i);
    return i;
}

int cons_ctab_put(struct cons_ctab *t, uint64_t client_id, uint64_t req_no, int32_t status,
                  uint64_t used)
{
    FK_ASSERT(client_id != 0 && req_no != 0 && status <= 0);
    int evicted;
    uint32_t i = ctab_claim(t, client_id, used, &evicted);
    t->rows[i].req_no = req_no;
    t->rows[i].status = status;
    return evicted;
}

int cons_ctab_get(const struct cons_ctab *t, uint64_t client_id, struct cons_session *out)
{
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    out->client_id = client_id;
    if (t->keys[i].client_id == 0) {
        out->req_no = out->stamp = 0;
        out->status = 0;
        return 0;
    }
    out->req_no = t->rows[i].req_no;
    out->status = t->rows[i].status;
    out->stamp = t->keys[i].used;
    return 1;
}

int cons_ctab_victim(const struct cons_ctab *t, struct cons_session *out)
{
    memset(out, 0, sizeof *out);
    if (t->used < t->cap || t->head == CONS_CTAB_NIL)
        return 0;
    return cons_ctab_get(t, t->keys[t->head].client_id, out);
}

int cons_ctab_del(struct cons_ctab *t, uint64_t client_id)
{
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    if (t->keys[i].client_id == 0)
        return 0;
    ctab_remove(t, i);
    t->used--;
    return 1;
}

/* Layout: cons.h, cons_ctab_save. */
int cons_ctab_save(const struct cons_ctab *t, uint8_t *buf, size_t cap, size_t *len)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_w_u64(&w, t->ops);
    cons_w_u32(&w, t->used);
    /* In recency order: O(rows), not O(slots) (a table sized for 50,000
     * sessions has 131,072 slots, and snapshots come every few hundred
     * operations); the order is replicated state, so every replica writes
     * the same bytes. */
    uint32_t n = 0;
    for (uint32_t i = t->head; i != CONS_CTAB_NIL; i = t->rows[i].next, n++) {
        cons_w_u64(&w, t->keys[i].used);
        cons_w_u64(&w, t->rows[i].client_id);
        cons_w_u64(&w, t->rows[i].req_no);
        cons_w_u32(&w, (uint32_t)t->rows[i].status);
    }
    FK_ASSERT(n == t->used);
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
        uint64_t used = cons_r_u64(&v), id = cons_r_u64(&v), req_no = cons_r_u64(&v);
        int32_t status = (int32_t)cons_r_u32(&v);
        if (v.err || id == 0 || req_no == 0 || status > 0 || used > ops)
            return FK_EMALFORMED;
        uint32_t s = ctab_slot(t->scratch, t->slots, id);
        if (t->scratch[s].client_id != 0)
            return FK_EMALFORMED; /* a duplicate client */
        t->scratch[s].client_id = id;
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

static int ctab_order_cmp(const void *a, const void *b, void *arg)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return ctab_before(arg, x, y) ? -1 : ctab_before(arg, y, x) ? 1 : 0;
}

/* Builds the recency list of the n rows in t->order, sorted first into
 * (stamp, client id) order: a load's one sort. */
static void ctab_link_all(struct cons_ctab *t, uint32_t n)
{
    qsort_r(t->order, n, sizeof *t->order, ctab_order_cmp, t);
    t->head = t->tail = CONS_CTAB_NIL;
    for (uint32_t i = 0; i < n; i++) {
        struct cons_ctab_row *row = &t->rows[t->order[i]];
        row->prev = t->tail;
        row->next = CONS_CTAB_NIL;
        if (t->tail != CONS_CTAB_NIL)
            t->rows[t->tail].next = t->order[i];
        else
            t->head = t->order[i];
        t->tail = t->order[i];
    }
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
        cons_r_u64(&r);               /* the stamp, already placed */
        uint64_t id = cons_r_u64(&r); /* validated above */
        uint32_t s = ctab_slot(t->keys, t->slots, id);
        FK_ASSERT(t->keys[s].client_id == id);
        t->rows[s].req_no = cons_r_u64(&r);
        t->rows[s].status = (int32_t)cons_r_u32(&r);
        t->order[i] = s;
    }
    FK_ASSERT(r.err == 0);
    ctab_link_all(t, n);
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
        return op->req_no < (*row)->req_no    ? CTAB_OLD
               : op->req_no == (*row)->req_no ? CTAB_DUP
                                              : CTAB_NEW;
    return op->req_no > 1 ? CTAB_EXPIRED : CTAB_NEW;
}

/* ctab_judge for an op to answer: the reply's ids set and no data yet,
 * unless the op is older than the row (CTAB_OLD: no answer). */
static enum ctab_verdict ctab_judge_reply(struct cons_ctab *t, const struct cons_op *op,
                                          struct cons_ctab_row **row, struct cons_reply *reply)
{
    enum ctab_verdict v = ctab_judge(t, op, row);
    if (v != CTAB_OLD) {
        reply->client_id = op->client_id;
        reply->req_no = op->req_no;
        reply->len = 0;
    }
    return v;
}

/* The machine keeps the table's rows (cons.h): after a put, client_id's
 * row and, if one went, the evicted client's deletion. */
static int ctab_write_through(struct cons_sm *sm, struct cons_ctab *t, uint64_t client_id)
{
    uint32_t i = ctab_slot(t->keys, t->slots, client_id);
    FK_ASSERT(t->keys[i].client_id == client_id);
    struct cons_session s = {.client_id = client_id,
                             .req_no = t->rows[i].req_no,
                             .stamp = t->keys[i].used,
                             .status = t->rows[i].status};
    int rc = sm->ops->session(sm->impl, &s);
    if (rc == 0 && t->last_evicted != 0) {
        struct cons_session gone = {.client_id = t->last_evicted};
        rc = sm->ops->session(sm->impl, &gone);
    }
    return rc;
}

int cons_apply_once(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op,
                    struct cons_reply *reply)
{
    FK_ASSERT(op->type != CONS_OP_NOOP && op->type != CONS_OP_CONFIG && op->client_id != 0);
    struct cons_ctab_row *row;
    enum ctab_verdict v = ctab_judge_reply(t, op, &row, reply);
    if (v == CTAB_OLD)
        return 2;
    if (v == CTAB_DUP && row->status != FK_EUNKEPT) {
        reply->status = row->status; /* a write's outcome: no data */
        return 1;
    }
    if (v == CTAB_DUP) {
        /* A read keeps no result: it is read again, here and now, which
         * linearizes it within its retry; the table stays as it is on
         * every replica. */
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
    /* A write's reply carries data only as the detail of an error. */
    FK_ASSERT(reply->len <= CONS_REPLY_MAX &&
              (cons_op_reads(op) || reply->status < 0 || !reply->len));
    cons_ctab_put(t, op->client_id, op->req_no, cons_op_reads(op) ? FK_EUNKEPT : reply->status,
                  ++t->ops);
    rc = ctab_write_through(sm, t, op->client_id);
    return rc < 0 ? rc : 0;
}

int cons_apply_core(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op,
                    int32_t status, struct cons_reply *reply)
{
    FK_ASSERT(op->type == CONS_OP_CONFIG && op->client_id != 0 && status <= 0);
    struct cons_ctab_row *row;
    enum ctab_verdict v = ctab_judge_reply(t, op, &row, reply);
    if (v == CTAB_OLD)
        return 2;
    if (v == CTAB_DUP) {
        reply->status = row->status != FK_EUNKEPT ? row->status : FK_EEXPIRED;
        return 1;
    }
    if (v == CTAB_EXPIRED) {
        reply->status = FK_EEXPIRED;
        return 0;
    }
    reply->status = status;
    cons_ctab_put(t, op->client_id, op->req_no, status, ++t->ops);
    int rc = ctab_write_through(sm, t, op->client_id);
    return rc < 0 ? rc : 0;
}

int cons_log_read(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op)
{
    FK_ASSERT(cons_op_reads(op) && op->client_id != 0);
    struct cons_ctab_row *row;
    enum ctab_verdict v = ctab_judge(t, op, &row);
    if (v != CTAB_NEW)
        return v == CTAB_OLD ? 2 : v == CTAB_DUP ? 1 : 0; /* as cons_apply_once */
    int evicted;
    uint32_t i = ctab_claim(t, op->client_id, ++t->ops, &evicted);
    t->rows[i].req_no = op->req_no;
    t->rows[i].status = FK_EUNKEPT;
    int rc = ctab_write_through(sm, t, op->client_id);
    return rc < 0 ? rc : 0;
}

/* ---- the machine's copy of the table, and its whole stream ------------ */

struct sm_load_ctx {
    struct cons_ctab *t;
    uint64_t max_stamp;
};

static int sm_load_row(void *arg, const struct cons_session *s)
{
    struct sm_load_ctx *c = arg;
    struct cons_ctab *t = c->t;
    if (s->client_id == 0 || s->req_no == 0 || s->status > 0)
        return FK_EMALFORMED;
    if (t->used >= t->cap)
        return FK_EFULL;
    uint32_t i = ctab_slot(t->keys, t->slots, s->client_id);
    if (t->keys[i].client_id != 0)
        return FK_EMALFORMED; /* a duplicate client */
    t->keys[i].client_id = s->client_id;
    t->keys[i].used = s->stamp;
    t->rows[i].client_id = s->client_id;
    t->rows[i].req_no = s->req_no;
    t->rows[i].status = s->status;
    t->order[t->used++] = i;
    if (s->stamp > c->max_stamp)
        c->max_stamp = s->stamp;
    return 0;
}

static void ctab_empty(struct cons_ctab *t)
{
    memset(t->keys, 0, (size_t)t->slots * sizeof *t->keys);
    memset(t->rows, 0, (size_t)t->slots * sizeof *t->rows);
    t->used = 0;
    t->ops = 0;
    t->head = t->tail = CONS_CTAB_NIL;
}

int cons_sm_load(struct cons_sm *sm, struct cons_ctab *t, uint64_t *applied)
{
    struct sm_load_ctx c = {.t = t, .max_stamp = 0};
    uint64_t clock = 0;
    ctab_empty(t);
    int rc = sm->ops->load(sm->impl, applied, &clock, sm_load_row, &c);
    if (rc == 0 && c.max_stamp > clock)
        rc = FK_EMALFORMED; /* a stamp from the future */
    if (rc != 0) {
        ctab_empty(t);
        return rc < 0 ? rc : FK_EMALFORMED;
    }
    ctab_link_all(t, t->used);
    t->ops = clock;
    return 0;
}

int cons_sm_save(struct cons_sm *sm, uint8_t *buf, size_t cap, size_t *len)
{
    uint8_t cursor[CONS_SNAP_CURSOR_MAX];
    size_t clen = 0, got;
    uint64_t applied;
    int rc = sm->ops->snap_open(sm->impl, CONS_SM_SAVE_SLOT, &applied);
    *len = 0;
    while (rc == 0) {
        if (cap - *len < CONS_SNAP_RECORD_MAX) {
            rc = FK_ETOOBIG;
            break;
        }
        rc = sm->ops->snap_read(sm->impl, CONS_SM_SAVE_SLOT, cursor, &clen, buf + *len, cap - *len,
                                cap - *len, &got);
        if (rc >= 0)
            *len += got;
    }
    sm->ops->snap_close(sm->impl, CONS_SM_SAVE_SLOT);
    return rc < 0 ? rc : 0;
}

int cons_sm_restore(struct cons_sm *sm, const uint8_t *buf, size_t len)
{
    int rc = sm->ops->install_begin(sm->impl);
    if (rc == 0)
        rc = sm->ops->install_chunk(sm->impl, buf, len);
    if (rc == 0)
        rc = sm->ops->install_commit(sm->impl);
    if (rc < 0)
        sm->ops->install_abort(sm->impl);
    return rc;
}

int cons_sm_pairs(struct cons_sm *sm, uint8_t *buf, size_t cap, size_t *len)
{
    size_t all, off = 0;
    struct cons_snap_rec r;
    int rc = cons_sm_save(sm, buf, cap, &all);
    *len = 0;
    if (rc < 0)
        return rc;
    while ((rc = cons_snap_next(buf, all, &off, &r)) == 1) {
        if (r.tag == CONS_SNAP_PAIR) {
            memmove(buf + *len, r.at, r.len);
            *len += r.len;
        }
    }
    return rc;
}

static uint64_t snap_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int cons_snap_next(const uint8_t *buf, size_t len, size_t *off, struct cons_snap_rec *r)
{
    size_t p = *off, left = len - p, n = 0;
    if (p >= len)
        return 0;
    const uint8_t *b = buf + p;
    *r = (struct cons_snap_rec){.tag = b[0], .at = b};
    switch (b[0]) {
    case CONS_SNAP_HEAD:
    case CONS_SNAP_END:
        n = 1 + 16;
        if (left >= n) {
            r->a = snap_u64(b + 1);
            r->b = snap_u64(b + 9);
        }
        break;
    case CONS_SNAP_SESSION:
        n = 1 + 28;
        if (left >= n)
            r->s = (struct cons_session){
                .client_id = snap_u64(b + 1),
                .req_no = snap_u64(b + 9),
                .stamp = snap_u64(b + 17),
                .status = (int32_t)((uint32_t)b[25] | (uint32_t)b[26] << 8 | (uint32_t)b[27] << 16 |
                                    (uint32_t)b[28] << 24)};
        break;
    case CONS_SNAP_PAIR:
        if (left < 7)
            return FK_EMALFORMED;
        r->klen = (size_t)b[1] | (size_t)b[2] << 8;
        if (left - 7 < r->klen)
            return FK_EMALFORMED;
        r->key = b + 3;
        r->vlen = (size_t)b[3 + r->klen] | (size_t)b[4 + r->klen] << 8 |
                  (size_t)b[5 + r->klen] << 16 | (size_t)b[6 + r->klen] << 24;
        r->val = b + 7 + r->klen;
        n = left - 7 - r->klen >= r->vlen ? 7 + r->klen + r->vlen : 0;
        break;
    }
    if (n == 0 || n > left)
        return FK_EMALFORMED;
    r->len = n;
    *off = p + n;
    return 1;
}

int cons_sm_empty(struct cons_sm *sm)
{
    static const uint8_t empty_state[34] = {CONS_SNAP_HEAD, [17] = CONS_SNAP_END};
    return cons_sm_restore(sm, empty_state, sizeof empty_state);
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
    FK_ASSERT(buf == ob->arena + ob->arena_used);
    FK_ASSERT(len <= ob->arena_cap - ob->arena_used);
    if (ob->nmsgs >= CONS_OUT_MSGS_MAX) {
        ob->dropped++;
        return FK_EFULL;
    }
    ob->msgs[ob->nmsgs++] = (struct cons_out_msg){.to = to, .buf = buf, .len = len};
    ob->arena_used += len;
    return 0;
}
