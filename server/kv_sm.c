/* kv_sm.c: the LMDB key-value state machine; see kv_sm.h. */
#include "kv_sm.h"

#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h" /* kv_key_cmp: the order scans share with the simulator */

#include "fk_assert.h"
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* A key goes into LMDB's data database as it is. */
_Static_assert(CONS_KEY_MAX <= KV_STORE_KEY_MAX, "every key fits LMDB's key limit");
_Static_assert(CONS_SNAP_OPEN_MAX <= KV_STORE_VIEWS_MAX, "a store slot for every view");
_Static_assert(CONS_SNAP_CURSOR_MAX >= 1 + CONS_KEY_MAX && CONS_SNAP_CURSOR_MAX >= 1 + 8,
               "a cursor holds a phase and a key or a client id");
_Static_assert(KV_SM_PAIR_LEN(CONS_KEY_MAX, CONS_VAL_MAX) == CONS_SNAP_RECORD_MAX &&
                   KV_SM_SESSION_LEN <= CONS_SNAP_RECORD_MAX &&
                   KV_SM_HEAD_LEN <= CONS_SNAP_RECORD_MAX,
               "every record fits a chunk of CONS_SNAP_RECORD_MAX");
_Static_assert(KV_SM_SESSION_LEN == 1 + 8 + KV_SM_ROW_LEN, "a SESSION record is tag, id, row");

#define KV_SM_BYTES_KEY "sm.bytes"
#define KV_SM_MARK_KEY  "sm.mark"

int kv_sm_init(struct kv_sm *sm, struct kv_store *store, uint64_t quota_bytes)
{
    if (sm == NULL || store == NULL)
        return FK_EINVAL;
    sm->store = store;
    sm->quota_bytes = quota_bytes ? quota_bytes : KV_SM_QUOTA_DEFAULT;
    sm->bytes = 0;
    memset(&sm->in, 0, sizeof sm->in);
    sm->in.stage = KV_SM_STAGE_NONE;
    uint8_t buf[8];
    size_t len;
    int rc = kv_meta_get(store, KV_SM_BYTES_KEY, buf, sizeof buf, &len);
    if (rc == FK_ENOTFOUND)
        return 0;
    if (rc < 0)
        return rc == FK_ETOOBIG ? FK_EMALFORMED : rc;
    if (len != sizeof buf)
        return FK_EMALFORMED;
    memcpy(&sm->bytes, buf, sizeof buf);
    return 0;
}

static int kv__save_bytes(struct kv_sm *sm, uint64_t bytes)
{
    int rc = kv_meta_put(sm->store, KV_SM_BYTES_KEY, &bytes, sizeof bytes);
    if (rc == 0)
        sm->bytes = bytes;
    return rc;
}

/* Size of the current value of op's key, or -1 when absent; other errors
 * are returned as they are (< -1). The value's bytes go to val (cap bytes)
 * when val is not NULL; a PUT or DEL needs only the size, and does not
 * copy a megabyte for it. */
static int64_t kv__current(struct kv_sm *sm, const struct cons_op *op, uint8_t *val, size_t cap)
{
    size_t len;
    int rc = kv_data_get(sm->store, cons_op_key(op), op->key_len, val, val ? cap : 0, &len);
    if (rc == FK_ENOTFOUND)
        return -1;
    if (rc == FK_ETOOBIG && val == NULL)
        return (int64_t)len;
    if (rc < 0)
        return rc == FK_ETOOBIG ? FK_EMALFORMED : rc; /* a value we never wrote */
    return (int64_t)len;
}

/* Writes op's value, keeping the byte count. Past the quota: status
 * FK_EQUOTA, and the reply says by how much ("N of M bytes": what the
 * store would hold after the write, and the quota). */
static int kv__write(struct kv_sm *sm, const struct cons_op *op, int64_t cur,
                     struct cons_reply *reply)
{
    uint64_t after = sm->bytes + op->val_len;
    after -= cur >= 0 ? (uint64_t)cur : 0;
    after += cur >= 0 ? 0 : op->key_len + KV_SM_PAIR_BYTES;
    if (after > sm->quota_bytes && after > sm->bytes) {
        reply->status = FK_EQUOTA;
        int n = snprintf((char *)reply->data, reply->cap, "%llu of %llu bytes",
                         (unsigned long long)after, (unsigned long long)sm->quota_bytes);
        reply->len = n > 0 ? (uint32_t)n : 0;
        return 0;
    }
    int rc = kv_data_put(sm->store, cons_op_key(op), op->key_len, cons_op_val(op), op->val_len);
    if (rc == 0)
        rc = kv__save_bytes(sm, after);
    return rc;
}

struct kv__scan_ctx {
    struct cons_wbuf w;
    const struct cons_op *op;
    uint32_t got;
};

static int kv__scan_visit(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct kv__scan_ctx *c = arg;
    const struct cons_op *op = c->op;
    if (c->got == 0 && (op->scan_flags & CONS_SCAN_AFTER) &&
        kv_key_cmp(k, kl, cons_op_key(op), op->key_len) == 0)
        return 0; /* a continuation starts after the last key it got */
    if (c->got == op->scan_limit)
        return 1;
    if (op->exp_len > 0 && kv_key_cmp(k, kl, cons_op_exp(op), op->exp_len) >= 0)
        return 1; /* the end key */
    if (c->got > 0 && c->w.len + 6 + kl + vl > CONS_SCAN_PAGE)
        return 1; /* the page is full: a shorter scan, still in order */
    cons_w_u16(&c->w, (uint16_t)kl);
    cons_w_bytes(&c->w, k, kl);
    cons_w_u32(&c->w, (uint32_t)vl);
    cons_w_bytes(&c->w, v, vl);
    c->got++;
    return 0;
}

static int kv__scan(struct kv_sm *sm, const struct cons_op *op, struct cons_reply *reply)
{
    struct kv__scan_ctx c = {.op = op};
    FK_ASSERT(reply->cap >= CONS_REPLY_MAX);
    cons_wbuf_init(&c.w, reply->data, reply->cap);
    /* One more than the limit: an AFTER scan may skip its start key. */
    int rc = kv_data_scan(sm->store, cons_op_key(op), op->key_len, (uint32_t)op->scan_limit + 1,
                          kv__scan_visit, &c);
    if (rc < 0)
        return rc;
    FK_ASSERT(c.w.err == 0);
    reply->len = (uint32_t)c.w.len;
    return 0;
}

static int kv__del(struct kv_sm *sm, const struct cons_op *op, int64_t cur,
                   struct cons_reply *reply)
{
    if (cur < 0) {
        reply->status = FK_ENOTFOUND;
        return 0;
    }
    int rc = kv_data_del(sm->store, cons_op_key(op), op->key_len);
    if (rc == 0)
        rc = kv__save_bytes(sm, sm->bytes - (uint64_t)cur - op->key_len - KV_SM_PAIR_BYTES);
    return rc;
}

static int kv__apply(void *impl, const struct cons_op *op, struct cons_reply *reply)
{
    struct kv_sm *sm = impl;
    reply->status = 0;
    reply->len = 0;
    if (op->type == CONS_OP_SCAN)
        return kv__scan(sm, op, reply);
    if (op->type == CONS_OP_NOOP || op->type >= CONS_OP__COUNT)
        return FK_EINVAL;
    /* GET and CAS read the value into the reply's buffer (a CAS answers
     * no data, and compares before it writes anything there). */
    FK_ASSERT(reply->cap >= CONS_REPLY_MAX);
    int reads = op->type == CONS_OP_GET || op->type == CONS_OP_CAS;
    int64_t clen = kv__current(sm, op, reads ? reply->data : NULL, reply->cap);
    if (clen < -1)
        return (int)clen;
    switch (op->type) {
    case CONS_OP_GET:
        if (clen < 0)
            reply->status = FK_ENOTFOUND;
        else
            reply->len = (uint32_t)clen;
        return 0;
    case CONS_OP_PUT:
        return kv__write(sm, op, clen, reply);
    case CONS_OP_DEL:
        return kv__del(sm, op, clen, reply);
    case CONS_OP_CAS:
        if (clen < 0)
            reply->status = FK_ENOTFOUND;
        else if ((uint64_t)clen != op->exp_len ||
                 memcmp(reply->data, cons_op_exp(op), op->exp_len) != 0)
            reply->status = FK_ECASFAIL;
        else
            return kv__write(sm, op, clen, reply);
        return 0;
    default:
        return FK_EINVAL;
    }
}

/* ---- sessions and the mark ------------------------------------------------
 * Each is one LMDB put or delete in the caller's write transaction: they
 * run once per client operation and once per applied entry. */

static void kv__row_encode(uint8_t row[KV_SM_ROW_LEN], const struct cons_session *se)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, row, KV_SM_ROW_LEN);
    cons_w_u64(&w, se->req_no);
    cons_w_u64(&w, se->stamp);
    cons_w_u32(&w, (uint32_t)se->status);
    FK_ASSERT(w.err == 0 && w.len == KV_SM_ROW_LEN);
}

static int kv__session(void *impl, const struct cons_session *se)
{
    struct kv_sm *sm = impl;
    if (se == NULL || se->client_id == 0)
        return FK_EINVAL;
    if (se->req_no == 0) { /* an eviction; a row never written is gone already */
        int rc = kv_client_del(sm->store, se->client_id);
        return rc == FK_ENOTFOUND ? 0 : rc;
    }
    uint8_t row[KV_SM_ROW_LEN];
    kv__row_encode(row, se);
    return kv_client_put(sm->store, se->client_id, row, sizeof row);
}

static int kv__mark(void *impl, uint64_t applied, uint64_t clock)
{
    struct kv_sm *sm = impl;
    uint8_t b[16];
    struct cons_wbuf w;
    cons_wbuf_init(&w, b, sizeof b);
    cons_w_u64(&w, applied);
    cons_w_u64(&w, clock);
    FK_ASSERT(w.err == 0);
    return kv_meta_put(sm->store, KV_SM_MARK_KEY, b, sizeof b);
}

/* The core's stash lives in the store's undo database (kv_store.h), in
 * the batch's write transaction like everything else here. */
static int kv__stash_put(void *impl, uint64_t key, const uint8_t *buf, size_t len)
{
    struct kv_sm *sm = impl;
    return kv_undo_put(sm->store, key, buf, len);
}

static int kv__stash_drop(void *impl, uint64_t lo, uint64_t hi)
{
    struct kv_sm *sm = impl;
    return kv_undo_del(sm->store, lo, hi);
}

struct kv__stash_visit {
    cons_stash_fn fn;
    void *arg;
};

static int kv__stash_one(void *arg, const void *key, size_t klen, const void *val, size_t vlen)
{
    const struct kv__stash_visit *v = arg;
    uint64_t k;
    if (klen != sizeof k)
        return FK_EMALFORMED;
    memcpy(&k, key, sizeof k);
    return v->fn(v->arg, k, val, vlen);
}

static int kv__stash_load(void *impl, cons_stash_fn fn, void *arg)
{
    struct kv_sm *sm = impl;
    struct kv__stash_visit v = {fn, arg};
    return kv_undo_scan(sm->store, kv__stash_one, &v);
}

/* Decodes the mark a kv_meta_get or kv_view_meta_get returned (rc, b,
 * len): absent is 0, 0. */
static int kv__mark_decode(int rc, const uint8_t *b, size_t len, uint64_t *applied, uint64_t *clock)
{
    *applied = *clock = 0;
    if (rc == FK_ENOTFOUND)
        return 0;
    if (rc == FK_ETOOBIG || (rc == 0 && len != 16))
        return FK_EMALFORMED; /* not a mark we wrote */
    if (rc < 0)
        return rc;
    struct cons_rbuf r;
    cons_rbuf_init(&r, b, len);
    *applied = cons_r_u64(&r);
    *clock = cons_r_u64(&r);
    return cons_r_done(&r);
}

struct kv__load_ctx {
    cons_session_fn fn;
    void *arg;
    int rc; /* fn's nonzero return, or FK_EMALFORMED for a bad row */
};

static int kv__load_visit(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct kv__load_ctx *c = arg;
    if (kl != sizeof(uint64_t) || vl != KV_SM_ROW_LEN) {
        c->rc = FK_EMALFORMED;
        return 1;
    }
    struct cons_session se;
    struct cons_rbuf r;
    memcpy(&se.client_id, k, sizeof se.client_id);
    cons_rbuf_init(&r, v, vl);
    se.req_no = cons_r_u64(&r);
    se.stamp = cons_r_u64(&r);
    se.status = (int32_t)cons_r_u32(&r);
    c->rc = c->fn(c->arg, &se);
    return c->rc != 0;
}

static int kv__load(void *impl, uint64_t *applied, uint64_t *clock, cons_session_fn fn, void *arg)
{
    struct kv_sm *sm = impl;
    uint8_t b[16];
    size_t len = 0;
    int rc = kv_meta_get(sm->store, KV_SM_MARK_KEY, b, sizeof b, &len);
    rc = kv__mark_decode(rc, b, len, applied, clock);
    if (rc < 0 || fn == NULL)
        return rc;
    struct kv__load_ctx c = {.fn = fn, .arg = arg, .rc = 0};
    rc = kv_client_scan(sm->store, kv__load_visit, &c);
    return rc < 0 ? rc : c.rc;
}

/* ---- sending: views and chunks --------------------------------------- */

static int kv__view_mark(struct kv_sm *sm, uint32_t slot, uint64_t *applied, uint64_t *clock)
{
    uint8_t b[16];
    size_t len = 0;
    int rc = kv_view_meta_get(sm->store, slot, KV_SM_MARK_KEY, b, sizeof b, &len);
    return kv__mark_decode(rc, b, len, applied, clock);
}

static int kv__snap_open(void *impl, uint32_t slot, uint64_t *applied)
{
    struct kv_sm *sm = impl;
    uint64_t clock;
    if (slot >= CONS_SNAP_OPEN_MAX || applied == NULL)
        return FK_EINVAL;
    int rc = kv_view_open(sm->store, slot);
    if (rc == 0)
        rc = kv__view_mark(sm, slot, applied, &clock);
    if (rc < 0)
        kv_view_close(sm->store, slot);
    return rc;
}

static void kv__snap_close(void *impl, uint32_t slot)
{
    struct kv_sm *sm = impl;
    if (slot < CONS_SNAP_OPEN_MAX)
        kv_view_close(sm->store, slot);
}

/* A position in the stream: the decoded cursor (kv_sm.h). phase 0 is the
 * start. key points into the cursor or into the chunk being written. */
struct kv__pos {
    uint8_t phase;
    int has_client;
    uint64_t client;
    const uint8_t *key;
    size_t klen; /* 0: no pair sent yet */
};

static int kv__cursor_decode(const uint8_t *cur, size_t len, struct kv__pos *p)
{
    memset(p, 0, sizeof *p);
    if (len == 0)
        return 0;
    p->phase = cur[0];
    if (p->phase == KV_SM_CUR_SESSIONS && (len == 1 || len == 9)) {
        p->has_client = len == 9;
        if (p->has_client)
            memcpy(&p->client, cur + 1, sizeof p->client);
        return 0;
    }
    if (p->phase == KV_SM_CUR_PAIRS && len <= 1 + CONS_KEY_MAX) {
        p->key = len > 1 ? cur + 1 : NULL;
        p->klen = len - 1;
        return 0;
    }
    return FK_EINVAL; /* not a cursor of ours, or past END */
}

static void kv__cursor_encode(const struct kv__pos *p, uint8_t *cur, size_t *len)
{
    FK_ASSERT(p->phase >= KV_SM_CUR_SESSIONS && p->phase <= KV_SM_CUR_DONE);
    cur[0] = p->phase;
    *len = 1;
    if (p->phase == KV_SM_CUR_SESSIONS && p->has_client) {
        memcpy(cur + 1, &p->client, sizeof p->client);
        *len = 1 + sizeof p->client;
    } else if (p->phase == KV_SM_CUR_PAIRS && p->klen > 0) {
        memmove(cur + 1, p->key, p->klen); /* the key may already be there */
        *len = 1 + p->klen;
    }
    FK_ASSERT(*len <= CONS_SNAP_CURSOR_MAX);
}

/* One chunk being written: records go into w while they fit. */
struct kv__chunk {
    struct cons_wbuf w;
    struct kv__pos *pos;
    size_t want; /* the chunk ends once it holds this many bytes */
    int full;    /* a record did not fit, or want was reached: the chunk ends here */
};

static int kv__emit_session(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct kv__chunk *c = arg;
    if (kl != sizeof(uint64_t) || vl != KV_SM_ROW_LEN)
        return FK_EMALFORMED; /* a row we never wrote */
    if (c->w.len >= c->want || c->w.cap - c->w.len < KV_SM_SESSION_LEN) {
        c->full = 1;
        return 1;
    }
    cons_w_u8(&c->w, CONS_SNAP_SESSION);
    cons_w_bytes(&c->w, k, kl); /* the native id is little-endian (cons.h) */
    cons_w_bytes(&c->w, v, vl); /* the row is the record's remaining layout */
    memcpy(&c->pos->client, k, sizeof c->pos->client);
    c->pos->has_client = 1;
    return 0;
}

static int kv__emit_pair(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct kv__chunk *c = arg;
    if (kl == 0 || kl > CONS_KEY_MAX || vl > CONS_VAL_MAX)
        return FK_EMALFORMED; /* a pair apply never wrote */
    if (c->w.len >= c->want || c->w.cap - c->w.len < KV_SM_PAIR_LEN(kl, vl)) {
        c->full = 1;
        return 1;
    }
    cons_w_u8(&c->w, CONS_SNAP_PAIR);
    cons_w_u16(&c->w, (uint16_t)kl);
    c->pos->key = c->w.p + c->w.len; /* the chunk keeps the key for the cursor */
    c->pos->klen = kl;
    cons_w_bytes(&c->w, k, kl);
    cons_w_u32(&c->w, (uint32_t)vl);
    cons_w_bytes(&c->w, v, vl);
    return 0;
}

static int kv__emit_head(struct kv_sm *sm, uint32_t slot, struct kv__chunk *c)
{
    uint64_t applied, clock;
    int rc = kv__view_mark(sm, slot, &applied, &clock);
    if (rc < 0)
        return rc;
    cons_w_u8(&c->w, CONS_SNAP_HEAD);
    cons_w_u64(&c->w, applied);
    cons_w_u64(&c->w, clock);
    c->pos->phase = KV_SM_CUR_SESSIONS;
    return 0;
}

/* END's counts are the view's: mdb_stat in its transaction. */
static int kv__emit_end(struct kv_sm *sm, uint32_t slot, struct kv__chunk *c)
{
    uint64_t pairs, sessions;
    if (c->w.len >= c->want || c->w.cap - c->w.len < KV_SM_END_LEN) {
        c->full = 1;
        return 0;
    }
    int rc = kv_view_counts(sm->store, slot, &pairs, &sessions);
    if (rc < 0)
        return rc;
    cons_w_u8(&c->w, CONS_SNAP_END);
    cons_w_u64(&c->w, sessions);
    cons_w_u64(&c->w, pairs);
    c->pos->phase = KV_SM_CUR_DONE;
    return 0;
}

/* Writes records from pos on until one does not fit or END is written;
 * each phase that runs out moves pos to the next. */
static int kv__emit(struct kv_sm *sm, uint32_t slot, struct kv__chunk *c)
{
    struct kv__pos *p = c->pos;
    int rc = 0;
    if (p->phase == 0)
        rc = kv__emit_head(sm, slot, c); /* a chunk always has room for HEAD */
    if (rc == 0 && p->phase == KV_SM_CUR_SESSIONS) {
        uint64_t after = p->client;
        rc = kv_view_client_scan(sm->store, slot, p->has_client ? &after : NULL, kv__emit_session,
                                 c);
        if (rc >= 0 && !c->full)
            p->phase = KV_SM_CUR_PAIRS;
    }
    if (rc >= 0 && !c->full && p->phase == KV_SM_CUR_PAIRS) {
        rc = kv_view_data_scan(sm->store, slot, p->key, p->klen, kv__emit_pair, c);
        if (rc >= 0 && !c->full)
            rc = kv__emit_end(sm, slot, c);
    }
    return rc < 0 ? rc : 0;
}

static int kv__snap_read(void *impl, uint32_t slot, uint8_t *cursor, size_t *cursor_len,
                         uint8_t *buf, size_t cap, size_t want, size_t *len)
{
    struct kv_sm *sm = impl;
    struct kv__pos pos;
    if (slot >= CONS_SNAP_OPEN_MAX || cursor == NULL || cursor_len == NULL || buf == NULL ||
        len == NULL || cap < CONS_SNAP_RECORD_MAX || *cursor_len > CONS_SNAP_CURSOR_MAX)
        return FK_EINVAL;
    int rc = kv__cursor_decode(cursor, *cursor_len, &pos);
    if (rc < 0)
        return rc;
    struct kv__chunk c = {.pos = &pos, .want = want ? want : 1, .full = 0};
    cons_wbuf_init(&c.w, buf, cap);
    FK_ASSERT(pos.phase != KV_SM_CUR_DONE && pos.klen <= CONS_KEY_MAX);
    rc = kv__emit(sm, slot, &c);
    if (rc < 0)
        return rc;
    /* Every record fits a chunk of CONS_SNAP_RECORD_MAX, so each read
     * makes progress. */
    FK_ASSERT(c.w.err == 0 && c.w.len > 0);
    kv__cursor_encode(&pos, cursor, cursor_len);
    *len = c.w.len;
    return pos.phase == KV_SM_CUR_DONE;
}

/* ---- receiving: staging and the switch ----------------------------------
 * An explicit state machine (enum kv_sm_stage): each record kind is taken
 * in the stages that allow it and moves the stage on; everything else is
 * FK_EMALFORMED. Records are written to the staging set as they come, in
 * the caller's write transaction. */

static void kv__install_end(struct kv_sm *sm)
{
    sm->in.stage = KV_SM_STAGE_NONE;
}

/* What the stages promise about the counts, checked after every record. */
static void kv__install_invariants(const struct kv_sm *sm)
{
    const struct kv_sm_install *in = &sm->in;
    FK_ASSERT(in->stage > KV_SM_STAGE_NONE && in->stage <= KV_SM_STAGE_END);
    FK_ASSERT(in->stage > KV_SM_STAGE_HEAD || (in->sessions == 0 && in->pairs == 0));
    FK_ASSERT(in->stage != KV_SM_STAGE_SESSIONS || in->pairs == 0);
    FK_ASSERT((in->sessions == 0) == (in->last_client == 0));
    FK_ASSERT((in->pairs == 0) == (in->last_klen == 0) && in->last_klen <= CONS_KEY_MAX);
    FK_ASSERT(in->bytes <= sm->quota_bytes && in->sessions <= CONS_CLIENTS_MAX);
    FK_ASSERT(in->bytes >= in->pairs * (1 + KV_SM_PAIR_BYTES));
}

static int kv__in_head(struct kv_sm *sm, struct cons_rbuf *r)
{
    struct kv_sm_install *in = &sm->in;
    in->applied = cons_r_u64(r);
    in->clock = cons_r_u64(r);
    if (r->err || in->stage != KV_SM_STAGE_HEAD)
        return FK_EMALFORMED;
    in->stage = KV_SM_STAGE_SESSIONS;
    return 0;
}

static int kv__in_session(struct kv_sm *sm, struct cons_rbuf *r)
{
    struct kv_sm_install *in = &sm->in;
    uint64_t id = cons_r_u64(r);
    const uint8_t *row = cons_r_bytes(r, KV_SM_ROW_LEN); /* req_no, stamp, status */
    uint64_t req_no = 0;
    if (row != NULL)
        memcpy(&req_no, row, sizeof req_no);
    if (r->err || in->stage != KV_SM_STAGE_SESSIONS || id <= in->last_client || req_no == 0)
        return FK_EMALFORMED;
    if (in->sessions == CONS_CLIENTS_MAX)
        return FK_EFULL;
    int rc = kv_stage_client_put(sm->store, id, row, KV_SM_ROW_LEN);
    if (rc < 0)
        return rc;
    in->last_client = id;
    in->sessions++;
    return 0;
}

static int kv__in_pair(struct kv_sm *sm, struct cons_rbuf *r)
{
    struct kv_sm_install *in = &sm->in;
    uint16_t kl = cons_r_u16(r);
    const uint8_t *k = cons_r_bytes(r, kl);
    uint32_t vl = cons_r_u32(r);
    const uint8_t *v = vl <= CONS_VAL_MAX ? cons_r_bytes(r, vl) : NULL;
    if (r->err || kl == 0 || kl > CONS_KEY_MAX || vl > CONS_VAL_MAX)
        return FK_EMALFORMED;
    if (in->stage != KV_SM_STAGE_SESSIONS && in->stage != KV_SM_STAGE_PAIRS)
        return FK_EMALFORMED;
    if (in->last_klen > 0 && kv_key_cmp(in->last_key, in->last_klen, k, kl) >= 0)
        return FK_EMALFORMED; /* keys strictly increase */
    uint64_t bytes = in->bytes + kl + vl + KV_SM_PAIR_BYTES;
    if (bytes > sm->quota_bytes)
        return FK_EFULL;
    int rc = kv_stage_data_put(sm->store, k, kl, v, vl);
    if (rc < 0)
        return rc;
    in->stage = KV_SM_STAGE_PAIRS;
    memcpy(in->last_key, k, kl);
    in->last_klen = kl;
    in->bytes = bytes;
    in->pairs++;
    return 0;
}

/* END's counts must match what was staged: a stream that lost records
 * in between is refused here, before the switch. */
static int kv__in_end(struct kv_sm *sm, struct cons_rbuf *r)
{
    struct kv_sm_install *in = &sm->in;
    uint64_t sessions = cons_r_u64(r);
    uint64_t pairs = cons_r_u64(r);
    if (r->err || (in->stage != KV_SM_STAGE_SESSIONS && in->stage != KV_SM_STAGE_PAIRS))
        return FK_EMALFORMED;
    if (sessions != in->sessions || pairs != in->pairs)
        return FK_EMALFORMED;
    in->stage = KV_SM_STAGE_END;
    return 0;
}

static int kv__in_record(struct kv_sm *sm, struct cons_rbuf *r)
{
    switch (cons_r_u8(r)) {
    case CONS_SNAP_HEAD:
        return kv__in_head(sm, r);
    case CONS_SNAP_SESSION:
        return kv__in_session(sm, r);
    case CONS_SNAP_PAIR:
        return kv__in_pair(sm, r);
    case CONS_SNAP_END:
        return kv__in_end(sm, r);
    default:
        return FK_EMALFORMED; /* an unknown tag */
    }
}

/* An install in progress whose staged records are all still there: a
 * write transaction aborted since install_begin took some with it. */
static int kv__install_live(struct kv_sm *sm)
{
    if (sm->in.stage == KV_SM_STAGE_NONE)
        return FK_EINVAL;
    if (kv_write_aborts(sm->store) != sm->in.aborts) {
        kv__install_end(sm);
        return FK_EINVAL;
    }
    return 0;
}

static int kv__install_begin(void *impl)
{
    struct kv_sm *sm = impl;
    kv__install_end(sm);
    int rc = kv_stage_clear(sm->store); /* what an unfinished install left */
    if (rc < 0)
        return rc;
    memset(&sm->in, 0, offsetof(struct kv_sm_install, last_key));
    sm->in.aborts = kv_write_aborts(sm->store);
    sm->in.stage = KV_SM_STAGE_HEAD;
    return 0;
}

static int kv__install_chunk(void *impl, const uint8_t *buf, size_t len)
{
    struct kv_sm *sm = impl;
    int rc = kv__install_live(sm);
    if (rc < 0)
        return rc;
    if (buf == NULL || len == 0)
        rc = FK_EMALFORMED; /* a chunk holds at least one record */
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    /* Bounded: each record consumes at least its tag byte. */
    while (rc == 0 && r.off < r.len) {
        rc = kv__in_record(sm, &r);
        if (rc == 0)
            kv__install_invariants(sm);
    }
    if (rc < 0)
        kv__install_end(sm);
    return rc;
}

/* The switch, the mark and the byte count share the caller's write
 * transaction: it commits the new state whole or not at all. */
static int kv__install_commit(void *impl)
{
    struct kv_sm *sm = impl;
    int rc = kv__install_live(sm);
    if (rc < 0)
        return rc;
    if (sm->in.stage != KV_SM_STAGE_END)
        rc = FK_EMALFORMED; /* the stream was cut short */
    else
        kv__install_invariants(sm);
    if (rc == 0)
        rc = kv_stage_switch(sm->store);
    if (rc == 0)
        rc = kv__mark(sm, sm->in.applied, sm->in.clock);
    if (rc == 0)
        rc = kv__save_bytes(sm, sm->in.bytes);
    kv__install_end(sm);
    return rc;
}

/* The staged records stay on disk until the next install_begin empties
 * them: emptying here could fail, and a failed write aborts the caller's
 * whole transaction, which an abort must not do. */
static void kv__install_abort(void *impl)
{
    kv__install_end(impl);
}

static const struct cons_sm_ops kv__sm_ops = {
    .apply = kv__apply,
    .session = kv__session,
    .mark = kv__mark,
    .load = kv__load,
    .snap_open = kv__snap_open,
    .snap_read = kv__snap_read,
    .snap_close = kv__snap_close,
    .install_begin = kv__install_begin,
    .install_chunk = kv__install_chunk,
    .install_commit = kv__install_commit,
    .install_abort = kv__install_abort,
    .stash_put = kv__stash_put,
    .stash_drop = kv__stash_drop,
    .stash_load = kv__stash_load,
};

struct cons_sm kv_sm_cons(struct kv_sm *sm)
{
    struct cons_sm c = {&kv__sm_ops, sm};
    return c;
}
