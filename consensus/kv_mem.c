/* kv_mem.c: the in-memory ordered key-value state machine. */
#include "kv.h"
#include "cons_wire.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <stdlib.h>
#include <string.h>

struct kv_row {
    uint32_t vlen;
    uint16_t klen;
    uint8_t key[CONS_KEY_MAX];
    uint8_t val[KV_MEM_VAL_MAX];
};

/* One state (cons.h): pairs, client table rows and the mark. The live
 * state, each open view and an install's staging are one of these. */
struct kv_state {
    uint32_t n;
    struct kv_row *rows; /* rows[0..n) sorted by kv_key_cmp, cap of them */
    uint32_t ns, scap;
    struct cons_session *ses; /* ses[0..ns) by client id; grows by doubling */
    uint64_t applied, clock;
};

/* An install in progress: what its stream has shown so far. */
struct kv_staging {
    uint8_t active, head, end;
    uint64_t sessions, pairs; /* END's counts */
};

struct kv_stash {
    uint64_t key;
    uint8_t *buf;
    size_t len;
};

struct kv_mem {
    uint32_t cap;
    struct kv_state live;
    struct kv_state views[CONS_SNAP_OPEN_MAX];
    uint8_t open[CONS_SNAP_OPEN_MAX];
    struct kv_state stage;
    struct kv_staging st;
    uint64_t version;       /* bumped by every change of the live state */
    struct kv_stash *stash; /* the core's stash (cons.h), by key */
    uint32_t nstash, stash_cap;
};

int kv_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    size_t m = alen < blen ? alen : blen;
    int c = m ? memcmp(a, b, m) : 0;
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static void state_free(struct kv_state *st)
{
    free(st->rows);
    free(st->ses);
    memset(st, 0, sizeof *st);
}

struct kv_mem *kv_mem_create(uint32_t max_keys)
{
    if (max_keys == 0 || max_keys > 1000000)
        return NULL;
    struct kv_mem *kv = calloc(1, sizeof *kv);
    if (!kv)
        return NULL;
    kv->cap = max_keys;
    kv->live.rows = calloc(max_keys, sizeof *kv->live.rows);
    kv->stage.rows = calloc(max_keys, sizeof *kv->stage.rows);
    if (!kv->live.rows || !kv->stage.rows) {
        kv_mem_destroy(kv);
        return NULL;
    }
    return kv;
}

void kv_mem_destroy(struct kv_mem *kv)
{
    if (!kv)
        return;
    state_free(&kv->live);
    state_free(&kv->stage);
    for (uint32_t i = 0; i < CONS_SNAP_OPEN_MAX; i++)
        state_free(&kv->views[i]);
    for (uint32_t i = 0; i < kv->nstash; i++)
        free(kv->stash[i].buf);
    free(kv->stash);
    free(kv);
}

uint64_t kv_mem_version(const struct kv_mem *kv)
{
    return kv->version;
}

uint32_t kv_mem_count(const struct kv_mem *kv)
{
    return kv->live.n;
}

size_t kv_mem_snapshot_max(uint32_t max_keys)
{
    return CONS_SNAP_BYTES(0, max_keys, (size_t)max_keys * (CONS_KEY_MAX + KV_MEM_VAL_MAX));
}

/* Index of the first row of st with key >= (k, klen); *found when equal. */
static uint32_t lower_bound_in(const struct kv_state *st, const uint8_t *k, size_t klen, int *found)
{
    uint32_t lo = 0, hi = st->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kv_key_cmp(st->rows[mid].key, st->rows[mid].klen, k, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < st->n && kv_key_cmp(st->rows[lo].key, st->rows[lo].klen, k, klen) == 0;
    return lo;
}

static uint32_t lower_bound(const struct kv_mem *kv, const uint8_t *k, size_t klen, int *found)
{
    return lower_bound_in(&kv->live, k, klen, found);
}

static void set_val(struct kv_row *row, const uint8_t *v, uint32_t vlen)
{
    FK_ASSERT(vlen <= KV_MEM_VAL_MAX);
    row->vlen = vlen;
    memcpy(row->val, v, vlen);
}

static int do_put(struct kv_mem *kv, const struct cons_op *op, uint32_t i, int found)
{
    if (op->val_len > KV_MEM_VAL_MAX)
        return FK_EVALSIZE;
    if (found) {
        set_val(&kv->live.rows[i], cons_op_val(op), op->val_len);
        return 0;
    }
    if (kv->live.n >= kv->cap)
        return FK_EFULL;
    memmove(&kv->live.rows[i + 1], &kv->live.rows[i],
            (size_t)(kv->live.n - i) * sizeof *kv->live.rows);
    kv->live.n++;
    kv->live.rows[i].klen = op->key_len;
    memcpy(kv->live.rows[i].key, cons_op_key(op), op->key_len);
    set_val(&kv->live.rows[i], cons_op_val(op), op->val_len);
    return 0;
}

static void do_scan(const struct kv_mem *kv, const struct cons_op *op, uint32_t i,
                    struct cons_reply *reply)
{
    struct cons_wbuf w;
    FK_ASSERT(reply->cap >= CONS_REPLY_MAX);
    cons_wbuf_init(&w, reply->data, reply->cap);
    if ((op->scan_flags & CONS_SCAN_AFTER) && i < kv->live.n &&
        kv_key_cmp(kv->live.rows[i].key, kv->live.rows[i].klen, cons_op_key(op), op->key_len) == 0)
        i++;
    for (uint32_t got = 0; i < kv->live.n && got < op->scan_limit; i++, got++) {
        const struct kv_row *row = &kv->live.rows[i];
        if (op->exp_len > 0 && kv_key_cmp(row->key, row->klen, cons_op_exp(op), op->exp_len) >= 0)
            break; /* the end key */
        size_t need = 6 + (size_t)row->klen + row->vlen;
        if (got > 0 && w.len + need > CONS_SCAN_PAGE)
            break; /* the page is full: a shorter scan, still in order */
        cons_w_u16(&w, row->klen);
        cons_w_bytes(&w, row->key, row->klen);
        cons_w_u32(&w, row->vlen);
        cons_w_bytes(&w, row->val, row->vlen);
    }
    FK_ASSERT(w.err == 0);
    reply->len = (uint32_t)w.len;
}

static int kv_apply(void *impl, const struct cons_op *op, struct cons_reply *reply)
{
    struct kv_mem *kv = impl;
    if (!cons_op_reads(op))
        kv->version++;
    int found;
    uint32_t i = lower_bound(kv, cons_op_key(op), op->key_len, &found);
    reply->status = 0;
    reply->len = 0;
    switch (op->type) {
    case CONS_OP_GET:
        if (!found)
            reply->status = FK_ENOTFOUND;
        else {
            reply->len = kv->live.rows[i].vlen;
            memcpy(reply->data, kv->live.rows[i].val, reply->len);
        }
        return 0;
    case CONS_OP_PUT:
        reply->status = do_put(kv, op, i, found);
        return 0;
    case CONS_OP_DEL:
        if (!found)
            reply->status = FK_ENOTFOUND;
        else {
            memmove(&kv->live.rows[i], &kv->live.rows[i + 1],
                    (size_t)(kv->live.n - i - 1) * sizeof *kv->live.rows);
            kv->live.n--;
        }
        return 0;
    case CONS_OP_CAS:
        if (!found)
            reply->status = FK_ENOTFOUND;
        else if (kv->live.rows[i].vlen != op->exp_len ||
                 memcmp(kv->live.rows[i].val, cons_op_exp(op), op->exp_len) != 0)
            reply->status = FK_ECASFAIL;
        else if (op->val_len > KV_MEM_VAL_MAX)
            reply->status = FK_EVALSIZE;
        else
            set_val(&kv->live.rows[i], cons_op_val(op), op->val_len);
        return 0;
    case CONS_OP_SCAN:
        do_scan(kv, op, i, reply);
        return 0;
    default:
        return FK_EINVAL;
    }
}

/* ---- the client table's rows and the mark -------------------------------- */

/* Index of the first session with id >= client_id; *found when equal. */
static uint32_t ses_bound(const struct kv_state *st, uint64_t client_id, int *found)
{
    uint32_t lo = 0, hi = st->ns;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (st->ses[mid].client_id < client_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < st->ns && st->ses[lo].client_id == client_id;
    return lo;
}

/* Inserts s at i (the simulator's tables are small: allocation and
 * shifting are fine here; the server keeps rows in LMDB). */
static int ses_insert(struct kv_state *st, uint32_t i, const struct cons_session *s)
{
    if (st->ns == st->scap) {
        uint32_t cap = st->scap ? 2 * st->scap : 16;
        struct cons_session *p = realloc(st->ses, (size_t)cap * sizeof *p);
        if (!p)
            return FK_ENOMEM;
        st->ses = p;
        st->scap = cap;
    }
    memmove(&st->ses[i + 1], &st->ses[i], (size_t)(st->ns - i) * sizeof *st->ses);
    st->ses[i] = *s;
    st->ns++;
    return 0;
}

static int kv_session(void *impl, const struct cons_session *s)
{
    struct kv_mem *kv = impl;
    int found;
    uint32_t i = ses_bound(&kv->live, s->client_id, &found);
    kv->version++;
    if (s->req_no == 0) {
        if (found) {
            memmove(&kv->live.ses[i], &kv->live.ses[i + 1],
                    (size_t)(kv->live.ns - i - 1) * sizeof *kv->live.ses);
            kv->live.ns--;
        }
        return 0;
    }
    if (found) {
        kv->live.ses[i] = *s;
        return 0;
    }
    return ses_insert(&kv->live, i, s);
}

static int kv_mark(void *impl, uint64_t applied, uint64_t clock)
{
    struct kv_mem *kv = impl;
    kv->version++;
    kv->live.applied = applied;
    kv->live.clock = clock;
    return 0;
}

static int kv_load(void *impl, uint64_t *applied, uint64_t *clock, cons_session_fn fn, void *arg)
{
    const struct kv_mem *kv = impl;
    *applied = kv->live.applied;
    *clock = kv->live.clock;
    for (uint32_t i = 0; i < kv->live.ns; i++) {
        int rc = fn(arg, &kv->live.ses[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- the stream, sender: a view is a copy (the simulator's states are a
 * few kilobytes) ---------------------------------------------------------- */

static int state_copy(struct kv_state *dst, const struct kv_state *src, uint32_t cap)
{
    if (!dst->rows && !(dst->rows = calloc(cap, sizeof *dst->rows)))
        return FK_ENOMEM;
    if (dst->scap < src->ns) {
        struct cons_session *p = realloc(dst->ses, (size_t)src->ns * sizeof *p);
        if (!p)
            return FK_ENOMEM;
        dst->ses = p;
        dst->scap = src->ns;
    }
    memcpy(dst->rows, src->rows, (size_t)src->n * sizeof *src->rows);
    if (src->ns)
        memcpy(dst->ses, src->ses, (size_t)src->ns * sizeof *src->ses);
    dst->n = src->n;
    dst->ns = src->ns;
    dst->applied = src->applied;
    dst->clock = src->clock;
    return 0;
}

static void kv_snap_close(void *impl, uint32_t slot)
{
    struct kv_mem *kv = impl;
    if (slot < CONS_SNAP_OPEN_MAX)
        kv->open[slot] = 0;
}

static int kv_snap_open(void *impl, uint32_t slot, uint64_t *applied)
{
    struct kv_mem *kv = impl;
    if (slot >= CONS_SNAP_OPEN_MAX)
        return FK_EINVAL;
    kv->open[slot] = 0;
    int rc = state_copy(&kv->views[slot], &kv->live, kv->cap);
    if (rc < 0)
        return rc;
    kv->open[slot] = 1;
    *applied = kv->live.applied;
    return 0;
}

/* Cursor: u8 phase, then for SES the last client id sent and for PAIRS the
 * last key sent (u16 length, bytes); nothing sent yet is id 0 / length 0. */
enum { CUR_HEAD = 0, CUR_SES = 1, CUR_PAIRS = 2, CUR_END = 3, CUR_DONE = 4 };

static size_t record_bytes(uint8_t tag, const struct kv_row *row)
{
    switch (tag) {
    case CONS_SNAP_HEAD:
    case CONS_SNAP_END:
        return 17;
    case CONS_SNAP_SESSION:
        return 29;
    default:
        return 7 + (size_t)row->klen + row->vlen;
    }
}

static int kv_snap_read(void *impl, uint32_t slot, uint8_t *cursor, size_t *cursor_len,
                        uint8_t *buf, size_t cap, size_t want, size_t *len)
{
    struct kv_mem *kv = impl;
    if (slot >= CONS_SNAP_OPEN_MAX || !kv->open[slot] || cap < CONS_SNAP_RECORD_MAX)
        return FK_EINVAL;
    const struct kv_state *v = &kv->views[slot];
    uint8_t phase = *cursor_len ? cursor[0] : CUR_HEAD;
    uint32_t si = 0, pi = 0;
    int found;
    if (phase == CUR_SES && *cursor_len == 9) {
        uint64_t id;
        memcpy(&id, cursor + 1, 8);
        si = ses_bound(v, id, &found) + (uint32_t)found;
    } else if (phase == CUR_PAIRS && *cursor_len >= 3) {
        uint16_t kl;
        memcpy(&kl, cursor + 1, 2);
        if (kl > CONS_KEY_MAX || *cursor_len != 3 + (size_t)kl)
            return FK_EINVAL;
        pi = kl ? lower_bound_in(v, cursor + 3, kl, &found) + (uint32_t)found : 0;
    } else if (phase != CUR_HEAD && phase != CUR_END) {
        return FK_EINVAL;
    }
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    while (phase != CUR_DONE && (w.len == 0 || w.len < want)) {
        if (phase == CUR_HEAD) {
            cons_w_u8(&w, CONS_SNAP_HEAD);
            cons_w_u64(&w, v->applied);
            cons_w_u64(&w, v->clock);
            phase = CUR_SES;
            si = 0;
        } else if (phase == CUR_SES && si < v->ns) {
            if (record_bytes(CONS_SNAP_SESSION, NULL) > cap - w.len)
                break;
            const struct cons_session *e = &v->ses[si++];
            cons_w_u8(&w, CONS_SNAP_SESSION);
            cons_w_u64(&w, e->client_id);
            cons_w_u64(&w, e->req_no);
            cons_w_u64(&w, e->stamp);
            cons_w_u32(&w, (uint32_t)e->status);
        } else if (phase == CUR_SES) {
            phase = CUR_PAIRS;
            pi = 0;
        } else if (phase == CUR_PAIRS && pi < v->n) {
            const struct kv_row *row = &v->rows[pi];
            if (record_bytes(CONS_SNAP_PAIR, row) > cap - w.len)
                break;
            cons_w_u8(&w, CONS_SNAP_PAIR);
            cons_w_u16(&w, row->klen);
            cons_w_bytes(&w, row->key, row->klen);
            cons_w_u32(&w, row->vlen);
            cons_w_bytes(&w, row->val, row->vlen);
            pi++;
        } else if (phase == CUR_PAIRS) {
            phase = CUR_END;
        } else {
            if (record_bytes(CONS_SNAP_END, NULL) > cap - w.len)
                break;
            cons_w_u8(&w, CONS_SNAP_END);
            cons_w_u64(&w, v->ns);
            cons_w_u64(&w, v->n);
            phase = CUR_DONE;
        }
    }
    FK_ASSERT(w.err == 0);
    *len = w.len;
    /* The position after what was written. */
    cursor[0] = phase;
    *cursor_len = 1;
    if (phase == CUR_SES) {
        uint64_t id = si ? v->ses[si - 1].client_id : 0;
        memcpy(cursor + 1, &id, 8);
        *cursor_len = 9;
    } else if (phase == CUR_PAIRS) {
        uint16_t kl = pi ? v->rows[pi - 1].klen : 0;
        memcpy(cursor + 1, &kl, 2);
        if (kl)
            memcpy(cursor + 3, v->rows[pi - 1].key, kl);
        *cursor_len = 3 + (size_t)kl;
    }
    return phase == CUR_DONE;
}

/* ---- the stream, receiver: staged, switched at commit ------------------ */

static void kv_install_abort(void *impl)
{
    struct kv_mem *kv = impl;
    memset(&kv->st, 0, sizeof kv->st);
    kv->stage.n = kv->stage.ns = 0;
}

static int kv_install_begin(void *impl)
{
    struct kv_mem *kv = impl;
    kv_install_abort(kv);
    kv->st.active = 1;
    return 0;
}

static int stage_record(struct kv_mem *kv, struct cons_rbuf *r)
{
    struct kv_state *g = &kv->stage;
    uint8_t tag = cons_r_u8(r);
    if (r->err || kv->st.end || (tag != CONS_SNAP_HEAD) == !kv->st.head)
        return FK_EMALFORMED; /* HEAD first and once, nothing after END */
    switch (tag) {
    case CONS_SNAP_HEAD:
        g->applied = cons_r_u64(r);
        g->clock = cons_r_u64(r);
        kv->st.head = 1;
        return r->err ? FK_EMALFORMED : 0;
    case CONS_SNAP_SESSION: {
        struct cons_session e;
        e.client_id = cons_r_u64(r);
        e.req_no = cons_r_u64(r);
        e.stamp = cons_r_u64(r);
        e.status = (int32_t)cons_r_u32(r);
        if (r->err || e.client_id == 0 || e.req_no == 0 || g->n > 0 ||
            (g->ns && g->ses[g->ns - 1].client_id >= e.client_id))
            return FK_EMALFORMED; /* sessions first, in increasing id order */
        return ses_insert(g, g->ns, &e);
    }
    case CONS_SNAP_PAIR: {
        uint16_t kl = cons_r_u16(r);
        const uint8_t *k = cons_r_bytes(r, kl);
        uint32_t vl = cons_r_u32(r);
        const uint8_t *v = cons_r_bytes(r, vl);
        if (r->err || kl == 0 || kl > CONS_KEY_MAX || vl > CONS_VAL_MAX ||
            (g->n && kv_key_cmp(g->rows[g->n - 1].key, g->rows[g->n - 1].klen, k, kl) >= 0))
            return FK_EMALFORMED;
        if (vl > KV_MEM_VAL_MAX)
            return FK_EVALSIZE;
        if (g->n >= kv->cap)
            return FK_EFULL;
        struct kv_row *row = &g->rows[g->n++];
        row->klen = kl;
        memcpy(row->key, k, kl);
        row->vlen = vl;
        memcpy(row->val, v, vl);
        return 0;
    }
    case CONS_SNAP_END:
        kv->st.sessions = cons_r_u64(r);
        kv->st.pairs = cons_r_u64(r);
        kv->st.end = 1;
        return r->err ? FK_EMALFORMED : 0;
    default:
        return FK_EMALFORMED;
    }
}

static int kv_install_chunk(void *impl, const uint8_t *buf, size_t len)
{
    struct kv_mem *kv = impl;
    if (!kv->st.active)
        return FK_EINVAL;
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    while (r.off < r.len) {
        int rc = stage_record(kv, &r);
        if (rc < 0) {
            kv_install_abort(kv);
            return rc;
        }
    }
    return 0;
}

static int kv_install_commit(void *impl)
{
    struct kv_mem *kv = impl;
    if (!kv->st.active)
        return FK_EINVAL;
    if (!kv->st.end || kv->st.sessions != kv->stage.ns || kv->st.pairs != kv->stage.n) {
        kv_install_abort(kv);
        return FK_EMALFORMED;
    }
    struct kv_state t = kv->live;
    kv->live = kv->stage;
    kv->stage = t;
    kv->version++;
    kv_install_abort(kv);
    return 0;
}

/* ---- the stash: a small array in key order -------------------------------- */

static int kv_stash_drop(void *impl, uint64_t lo, uint64_t hi)
{
    struct kv_mem *kv = impl;
    uint32_t w = 0;
    for (uint32_t i = 0; i < kv->nstash; i++) {
        if (kv->stash[i].key >= lo && kv->stash[i].key <= hi) {
            free(kv->stash[i].buf);
            kv->version++;
            continue;
        }
        kv->stash[w++] = kv->stash[i];
    }
    kv->nstash = w;
    return 0;
}

static int kv_stash_put(void *impl, uint64_t key, const uint8_t *buf, size_t len)
{
    struct kv_mem *kv = impl;
    kv_stash_drop(kv, key, key);
    if (kv->nstash == kv->stash_cap) {
        uint32_t cap = kv->stash_cap ? 2 * kv->stash_cap : 8;
        struct kv_stash *n = realloc(kv->stash, cap * sizeof *n);
        if (!n)
            return FK_ENOMEM;
        kv->stash = n;
        kv->stash_cap = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return FK_ENOMEM;
    memcpy(copy, buf, len);
    uint32_t i = kv->nstash;
    while (i > 0 && kv->stash[i - 1].key > key) {
        kv->stash[i] = kv->stash[i - 1];
        i--;
    }
    kv->stash[i] = (struct kv_stash){key, copy, len};
    kv->nstash++;
    kv->version++;
    return 0;
}

static int kv_stash_load(void *impl, cons_stash_fn fn, void *arg)
{
    struct kv_mem *kv = impl;
    for (uint32_t i = 0; i < kv->nstash; i++) {
        int rc = fn(arg, kv->stash[i].key, kv->stash[i].buf, kv->stash[i].len);
        if (rc)
            return rc;
    }
    return 0;
}

int kv_mem_stash_save(const struct kv_mem *kv, uint8_t *buf, size_t cap, size_t *len)
{
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, cap);
    cons_w_u32(&w, kv->nstash);
    for (uint32_t i = 0; i < kv->nstash; i++) {
        cons_w_u64(&w, kv->stash[i].key);
        cons_w_u32(&w, (uint32_t)kv->stash[i].len);
        cons_w_bytes(&w, kv->stash[i].buf, kv->stash[i].len);
    }
    if (w.err)
        return FK_ETOOBIG;
    *len = w.len;
    return 0;
}

int kv_mem_stash_restore(struct kv_mem *kv, const uint8_t *buf, size_t len)
{
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, len);
    uint32_t n = cons_r_u32(&r);
    kv_stash_drop(kv, 0, UINT64_MAX);
    for (uint32_t i = 0; i < n && !r.err; i++) {
        uint64_t key = cons_r_u64(&r);
        uint32_t l = cons_r_u32(&r);
        const uint8_t *b = cons_r_bytes(&r, l);
        if (!b || kv_stash_put(kv, key, b, l) < 0)
            return FK_EMALFORMED;
    }
    return cons_r_done(&r);
}

static const struct cons_sm_ops kv_mem_ops = {
    .apply = kv_apply,
    .session = kv_session,
    .mark = kv_mark,
    .load = kv_load,
    .snap_open = kv_snap_open,
    .snap_read = kv_snap_read,
    .snap_close = kv_snap_close,
    .install_begin = kv_install_begin,
    .install_chunk = kv_install_chunk,
    .install_commit = kv_install_commit,
    .install_abort = kv_install_abort,
    .stash_put = kv_stash_put,
    .stash_drop = kv_stash_drop,
    .stash_load = kv_stash_load,
};

struct cons_sm kv_mem_sm(struct kv_mem *kv)
{
    struct cons_sm sm = {&kv_mem_ops, kv};
    return sm;
}
