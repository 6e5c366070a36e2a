/* kv_sm.c: the LMDB key-value state machine; see kv_sm.h. */
#include "kv_sm.h"

#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h" /* kv_key_cmp: the order scans share with the simulator */

#include <assert.h>
#include <stdio.h>
#include <string.h>

/* A key goes into LMDB's data database as it is. */
_Static_assert(CONS_KEY_MAX <= KV_STORE_KEY_MAX, "every key fits LMDB's key limit");

#define KV_SM_BYTES_KEY "sm.bytes"

int kv_sm_init(struct kv_sm *sm, struct kv_store *store, uint64_t quota_bytes)
{
    if (sm == NULL || store == NULL)
        return FK_EINVAL;
    sm->store = store;
    sm->quota_bytes = quota_bytes ? quota_bytes : KV_SM_QUOTA_DEFAULT;
    sm->bytes = 0;
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
 * are returned as they are (< -1). */
static int64_t kv__current(struct kv_sm *sm, const struct cons_op *op, uint8_t *val)
{
    size_t len;
    int rc = kv_data_get(sm->store, op->key, op->key_len, val, CONS_VAL_MAX, &len);
    if (rc == FK_ENOTFOUND)
        return -1;
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
        int n = snprintf((char *)reply->data, CONS_REPLY_MAX, "%llu of %llu bytes",
                         (unsigned long long)after, (unsigned long long)sm->quota_bytes);
        reply->len = n > 0 ? (uint32_t)n : 0;
        return 0;
    }
    int rc = kv_data_put(sm->store, op->key, op->key_len, op->val, op->val_len);
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
        kv_key_cmp(k, kl, op->key, op->key_len) == 0)
        return 0; /* a continuation starts after the last key it got */
    if (c->got == op->scan_limit)
        return 1;
    if (op->exp_len > 0 && kv_key_cmp(k, kl, op->exp, op->exp_len) >= 0)
        return 1; /* the end key */
    if (4 + kl + vl > c->w.cap - c->w.len)
        return 1; /* the reply is full: a shorter scan, still in order */
    cons_w_u16(&c->w, (uint16_t)kl);
    cons_w_bytes(&c->w, k, kl);
    cons_w_u16(&c->w, (uint16_t)vl);
    cons_w_bytes(&c->w, v, vl);
    c->got++;
    return 0;
}

static int kv__scan(struct kv_sm *sm, const struct cons_op *op, struct cons_reply *reply)
{
    struct kv__scan_ctx c = {.op = op};
    cons_wbuf_init(&c.w, reply->data, CONS_REPLY_MAX);
    /* One more than the limit: an AFTER scan may skip its start key. */
    int rc = kv_data_scan(sm->store, op->key, op->key_len, (uint32_t)op->scan_limit + 1,
                          kv__scan_visit, &c);
    if (rc < 0)
        return rc;
    assert(c.w.err == 0);
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
    int rc = kv_data_del(sm->store, op->key, op->key_len);
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
    uint8_t cur[CONS_VAL_MAX];
    int64_t clen = kv__current(sm, op, op->type == CONS_OP_GET ? reply->data : cur);
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
        else if ((uint64_t)clen != op->exp_len || memcmp(cur, op->exp, op->exp_len) != 0)
            reply->status = FK_ECASFAIL;
        else
            return kv__write(sm, op, clen, reply);
        return 0;
    default:
        return FK_EINVAL;
    }
}

struct kv__snap_ctx {
    struct cons_wbuf w;
    uint32_t n;
};

static int kv__snap_visit(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct kv__snap_ctx *c = arg;
    cons_w_u16(&c->w, (uint16_t)kl);
    cons_w_bytes(&c->w, k, kl);
    cons_w_u16(&c->w, (uint16_t)vl);
    cons_w_bytes(&c->w, v, vl);
    c->n++;
    return c->w.err ? FK_ETOOBIG : 0;
}

static int kv__snapshot(void *impl, uint8_t *buf, size_t cap, size_t *len)
{
    struct kv_sm *sm = impl;
    struct kv__snap_ctx c = {.n = 0};
    if (cap < 4)
        return FK_ETOOBIG;
    cons_wbuf_init(&c.w, buf + 4, cap - 4);
    int rc = kv_data_scan(sm->store, NULL, 0, UINT32_MAX, kv__snap_visit, &c);
    if (rc < 0)
        return rc;
    memcpy(buf, &c.n, 4); /* little-endian, like cons_w_u32 */
    *len = 4 + c.w.len;
    return 0;
}

/* Checks the whole snapshot before touching the state (as kv_mem does), and
 * sums its bytes. */
static int kv__validate(const uint8_t *buf, size_t len, uint64_t *bytes)
{
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    uint32_t n = cons_r_u32(&r);
    const uint8_t *pk = NULL;
    uint16_t pklen = 0;
    *bytes = 0;
    for (uint32_t i = 0; i < n && !r.err; i++) {
        uint16_t kl = cons_r_u16(&r);
        const uint8_t *k = cons_r_bytes(&r, kl);
        uint16_t vl = cons_r_u16(&r);
        cons_r_bytes(&r, vl);
        if (r.err || kl == 0 || kl > CONS_KEY_MAX || vl > CONS_VAL_MAX)
            return FK_EMALFORMED;
        if (pk && (memcmp(pk, k, pklen < kl ? pklen : kl) > 0 ||
                   (memcmp(pk, k, pklen < kl ? pklen : kl) == 0 && pklen >= kl)))
            return FK_EMALFORMED; /* keys must strictly increase */
        pk = k;
        pklen = kl;
        *bytes += (uint64_t)kl + vl + KV_SM_PAIR_BYTES;
    }
    return cons_r_done(&r);
}

static int kv__install(void *impl, const uint8_t *buf, size_t len)
{
    struct kv_sm *sm = impl;
    uint64_t bytes;
    int rc = kv__validate(buf, len, &bytes);
    if (rc < 0)
        return rc;
    rc = kv_data_clear(sm->store);
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    uint32_t n = cons_r_u32(&r);
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint16_t kl = cons_r_u16(&r);
        const uint8_t *k = cons_r_bytes(&r, kl);
        uint16_t vl = cons_r_u16(&r);
        const uint8_t *v = cons_r_bytes(&r, vl);
        rc = kv_data_put(sm->store, k, kl, v, vl);
    }
    if (rc == 0)
        rc = kv__save_bytes(sm, bytes);
    return rc;
}

static const struct cons_sm_ops kv__sm_ops = {
    .apply = kv__apply,
    .snapshot = kv__snapshot,
    .install = kv__install,
};

struct cons_sm kv_sm_cons(struct kv_sm *sm)
{
    struct cons_sm c = {&kv__sm_ops, sm};
    return c;
}
