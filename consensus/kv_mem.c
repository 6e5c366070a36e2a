/* kv_mem.c: the in-memory ordered key-value state machine. */
#include "kv.h"
#include "cons_wire.h"

#include "fk_error.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct kv_row {
    uint16_t klen, vlen;
    uint8_t key[CONS_KEY_MAX];
    uint8_t val[CONS_VAL_MAX];
};

struct kv_mem {
    uint32_t cap, n;
    struct kv_row *rows; /* rows[0..n) sorted by kv_key_cmp */
};

int kv_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    size_t m = alen < blen ? alen : blen;
    int c = m ? memcmp(a, b, m) : 0;
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

struct kv_mem *kv_mem_create(uint32_t max_keys)
{
    if (max_keys == 0 || max_keys > 1000000)
        return NULL;
    struct kv_mem *kv = calloc(1, sizeof *kv);
    if (!kv)
        return NULL;
    kv->rows = calloc(max_keys, sizeof *kv->rows);
    if (!kv->rows) {
        free(kv);
        return NULL;
    }
    kv->cap = max_keys;
    return kv;
}

void kv_mem_destroy(struct kv_mem *kv)
{
    if (!kv)
        return;
    free(kv->rows);
    free(kv);
}

uint32_t kv_mem_count(const struct kv_mem *kv)
{
    return kv->n;
}

size_t kv_mem_snapshot_max(uint32_t max_keys)
{
    return 4 + (size_t)max_keys * (4 + CONS_KEY_MAX + CONS_VAL_MAX);
}

/* Index of the first row with key >= (k, klen); *found when equal. */
static uint32_t lower_bound(const struct kv_mem *kv, const uint8_t *k, size_t klen, int *found)
{
    uint32_t lo = 0, hi = kv->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kv_key_cmp(kv->rows[mid].key, kv->rows[mid].klen, k, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < kv->n && kv_key_cmp(kv->rows[lo].key, kv->rows[lo].klen, k, klen) == 0;
    return lo;
}

static void set_val(struct kv_row *row, const uint8_t *v, uint16_t vlen)
{
    row->vlen = vlen;
    memcpy(row->val, v, vlen);
}

static int do_put(struct kv_mem *kv, const struct cons_op *op, uint32_t i, int found)
{
    if (found) {
        set_val(&kv->rows[i], op->val, op->val_len);
        return 0;
    }
    if (kv->n >= kv->cap)
        return FK_EFULL;
    memmove(&kv->rows[i + 1], &kv->rows[i], (size_t)(kv->n - i) * sizeof *kv->rows);
    kv->n++;
    kv->rows[i].klen = op->key_len;
    memcpy(kv->rows[i].key, op->key, op->key_len);
    set_val(&kv->rows[i], op->val, op->val_len);
    return 0;
}

static void do_scan(const struct kv_mem *kv, const struct cons_op *op, uint32_t i,
                    struct cons_reply *reply)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, reply->data, CONS_REPLY_MAX);
    if ((op->scan_flags & CONS_SCAN_AFTER) && i < kv->n &&
        kv_key_cmp(kv->rows[i].key, kv->rows[i].klen, op->key, op->key_len) == 0)
        i++;
    for (uint32_t got = 0; i < kv->n && got < op->scan_limit; i++, got++) {
        const struct kv_row *row = &kv->rows[i];
        if (op->exp_len > 0 && kv_key_cmp(row->key, row->klen, op->exp, op->exp_len) >= 0)
            break; /* the end key */
        size_t need = 4 + (size_t)row->klen + row->vlen;
        if (need > w.cap - w.len)
            break; /* the reply is full: a shorter scan, still in order */
        cons_w_u16(&w, row->klen);
        cons_w_bytes(&w, row->key, row->klen);
        cons_w_u16(&w, row->vlen);
        cons_w_bytes(&w, row->val, row->vlen);
    }
    assert(w.err == 0);
    reply->len = (uint32_t)w.len;
}

static int kv_apply(void *impl, const struct cons_op *op, struct cons_reply *reply)
{
    struct kv_mem *kv = impl;
    int found;
    uint32_t i = lower_bound(kv, op->key, op->key_len, &found);
    reply->status = 0;
    reply->len = 0;
    switch (op->type) {
    case CONS_OP_GET:
        if (!found)
            reply->status = FK_ENOTFOUND;
        else {
            reply->len = kv->rows[i].vlen;
            memcpy(reply->data, kv->rows[i].val, reply->len);
        }
        return 0;
    case CONS_OP_PUT:
        reply->status = do_put(kv, op, i, found);
        return 0;
    case CONS_OP_DEL:
        if (!found)
            reply->status = FK_ENOTFOUND;
        else {
            memmove(&kv->rows[i], &kv->rows[i + 1], (size_t)(kv->n - i - 1) * sizeof *kv->rows);
            kv->n--;
        }
        return 0;
    case CONS_OP_CAS:
        if (!found)
            reply->status = FK_ENOTFOUND;
        else if (kv->rows[i].vlen != op->exp_len ||
                 memcmp(kv->rows[i].val, op->exp, op->exp_len) != 0)
            reply->status = FK_ECASFAIL;
        else
            set_val(&kv->rows[i], op->val, op->val_len);
        return 0;
    case CONS_OP_SCAN:
        do_scan(kv, op, i, reply);
        return 0;
    default:
        return FK_EINVAL;
    }
}

static int kv_snapshot(void *impl, uint8_t *buf, size_t cap, size_t *len)
{
    const struct kv_mem *kv = impl;
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_w_u32(&w, kv->n);
    for (uint32_t i = 0; i < kv->n; i++) {
        cons_w_u16(&w, kv->rows[i].klen);
        cons_w_bytes(&w, kv->rows[i].key, kv->rows[i].klen);
        cons_w_u16(&w, kv->rows[i].vlen);
        cons_w_bytes(&w, kv->rows[i].val, kv->rows[i].vlen);
    }
    if (w.err)
        return FK_ETOOBIG;
    *len = w.len;
    return 0;
}

/* Validates the whole snapshot (count, bounds, strictly increasing keys)
 * before replacing anything, so a bad snapshot leaves the state intact. */
static int kv_install(void *impl, const uint8_t *buf, size_t len)
{
    struct kv_mem *kv = impl;
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    uint32_t n = cons_r_u32(&r);
    const uint8_t *pk = NULL;
    uint16_t pklen = 0;
    for (uint32_t i = 0; i < n && !r.err; i++) {
        uint16_t kl = cons_r_u16(&r);
        const uint8_t *k = cons_r_bytes(&r, kl);
        uint16_t vl = cons_r_u16(&r);
        cons_r_bytes(&r, vl);
        if (r.err || kl == 0 || kl > CONS_KEY_MAX || vl > CONS_VAL_MAX ||
            (pk && kv_key_cmp(pk, pklen, k, kl) >= 0))
            return FK_EMALFORMED;
        pk = k;
        pklen = kl;
    }
    if (cons_r_done(&r) < 0)
        return FK_EMALFORMED;
    if (n > kv->cap)
        return FK_EFULL;
    cons_rbuf_init(&r, buf, len);
    kv->n = cons_r_u32(&r);
    for (uint32_t i = 0; i < kv->n; i++) {
        struct kv_row *row = &kv->rows[i];
        row->klen = cons_r_u16(&r);
        memcpy(row->key, cons_r_bytes(&r, row->klen), row->klen);
        row->vlen = cons_r_u16(&r);
        memcpy(row->val, cons_r_bytes(&r, row->vlen), row->vlen);
    }
    assert(r.err == 0);
    return 0;
}

static const struct cons_sm_ops kv_mem_ops = {
    .apply = kv_apply,
    .snapshot = kv_snapshot,
    .install = kv_install,
};

struct cons_sm kv_mem_sm(struct kv_mem *kv)
{
    struct cons_sm sm = {&kv_mem_ops, kv};
    return sm;
}
