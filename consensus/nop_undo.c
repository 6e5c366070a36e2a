/* nop_undo.c: undoing a NOPaxos leader's speculative execution.
 *
 * The leader executes each request as it logs it and replies with the
 * result at once (Li et al., OSDI 2016, section 5.2.1); the request is
 * committed only once f followers hold it (5.2.4). A view change may
 * replace entries the old leader executed but that never committed
 * (5.2.3: a NO-OP anywhere in the merged logs wins, and a log may end
 * before them). The paper leaves the rollback to the application. The
 * machine here is the store itself (LMDB at its mark, nop.h "State"), so
 * there is no serialised checkpoint to go back to: before executing a
 * slot past the commit point, the replica records what the apply will
 * change (the pair's previous value or its absence, the client's row, the
 * row an eviction removes, the table's clock) in an undo ring parallel to
 * the log, and rolls back by putting those back in reverse order. The
 * committed prefix is never touched, so a rollback never costs a state
 * transfer. Memory: log_cap records of CONS_KEY_MAX + NOP_OP_MAX bytes
 * (a NOPaxos value is at most that), touched only where a leader executes
 * ahead of its commit point.
 *
 * Records live in memory only: a leader that crashes with speculative
 * executions on disk cannot prove its machine (nop_disk.c) and fetches a
 * state instead. */
#include "nop_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <stdlib.h>
#include <string.h>

int nop__undo_init(struct nop *r)
{
    r->undo = malloc((size_t)r->cfg.log_cap * sizeof *r->undo);
    r->undo_get.data = malloc(CONS_REPLY_MAX);
    r->undo_get.cap = CONS_REPLY_MAX;
    if (!r->undo || !r->undo_get.data)
        return FK_ENOMEM;
    nop__undo_clear(r);
    return 0;
}

void nop__undo_clear(struct nop *r)
{
    for (uint32_t i = 0; i < r->cfg.log_cap; i++)
        r->undo[i].slot = 0;
    r->stash_reset = 1;
}

void nop__undo_free(struct nop *r)
{
    free(r->stash_buf);
    free(r->undo);
    free(r->undo_get.data);
}

static struct nop_undo *rec_of(const struct nop *r, uint64_t slot)
{
    return &r->undo[(slot - 1) % r->cfg.log_cap];
}

/* The pair's value before op writes it: present (NOP_UNDO_HELD), absent
 * (NOP_UNDO_ABSENT), or not kept (NOP_UNDO_LOST: too large, which a
 * NOPaxos store never holds). */
static int capture_pair(struct nop *r, struct nop_undo *u, const struct cons_op *op)
{
    struct cons_op get;
    cons_op_init(&get, CONS_OP_GET, cons_op_key(op), op->key_len, NULL, 0, NULL, 0);
    int rc = r->sm.ops->apply(r->sm.impl, &get, &r->undo_get);
    if (rc < 0)
        return rc;
    u->klen = op->key_len;
    memcpy(u->bytes, cons_op_key(op), op->key_len);
    if (r->undo_get.status == FK_ENOTFOUND) {
        u->pair = NOP_UNDO_ABSENT;
    } else if (r->undo_get.status == 0 && r->undo_get.len <= sizeof u->bytes - op->key_len) {
        u->pair = NOP_UNDO_HELD;
        u->vlen = r->undo_get.len;
        memcpy(u->bytes + op->key_len, r->undo_get.data, r->undo_get.len);
    } else {
        u->pair = NOP_UNDO_LOST;
    }
    return 0;
}

int nop__undo_capture(struct nop *r, uint64_t slot, const struct nop_entry *e)
{
    struct nop_undo *u = rec_of(r, slot);
    u->slot = slot;
    u->clock = r->ctab.ops;
    u->row.client_id = 0;
    u->gone.client_id = 0;
    u->pair = NOP_UNDO_NONE;
    u->klen = 0;
    u->vlen = 0;
    if (e->kind != NOP_ENT_REQ)
        return 0;
    const struct cons_op *op = &e->op;
    if (!cons_ctab_get(&r->ctab, op->client_id, &u->row))
        cons_ctab_victim(&r->ctab, &u->gone);
    if (op->type == CONS_OP_PUT || op->type == CONS_OP_DEL || op->type == CONS_OP_CAS)
        return capture_pair(r, u, op);
    return 0;
}

/* Puts a pair back as it was: its value, or its absence. */
static int restore_pair(struct nop *r, const struct nop_undo *u)
{
    struct cons_op op;
    if (u->pair == NOP_UNDO_HELD)
        cons_op_init(&op, CONS_OP_PUT, u->bytes, u->klen, u->bytes + u->klen, u->vlen, NULL, 0);
    else
        cons_op_init(&op, CONS_OP_DEL, u->bytes, u->klen, NULL, 0, NULL, 0);
    int rc = r->sm.ops->apply(r->sm.impl, &op, &r->undo_get);
    if (rc < 0)
        return rc;
    /* Every state on the way back was the machine's once, within its
     * quota: a restore cannot be refused. */
    FK_ASSERT(r->undo_get.status == 0 ||
              (u->pair == NOP_UNDO_ABSENT && r->undo_get.status == FK_ENOTFOUND));
    return 0;
}

/* A client table row back, in the table and in the machine's copy. */
static int restore_row(struct nop *r, const struct cons_session *s)
{
    if (s->req_no) {
        cons_ctab_put(&r->ctab, s->client_id, s->req_no, s->status, s->stamp);
        return r->sm.ops->session(r->sm.impl, s);
    }
    cons_ctab_del(&r->ctab, s->client_id);
    struct cons_session gone = {.client_id = s->client_id};
    return r->sm.ops->session(r->sm.impl, &gone);
}

int nop__undo_to(struct nop *r, uint64_t target)
{
    FK_ASSERT(target < r->executed && !nop__needs_state(r));
    if (target < r->snap || r->executed - target > r->cfg.log_cap)
        return FK_EINVAL;
    for (uint64_t s = r->executed; s > target; s--) {
        const struct nop_undo *u = rec_of(r, s);
        if (u->slot != s || u->pair == NOP_UNDO_LOST)
            return FK_EINVAL; /* executed before it was speculative, or not kept */
    }
    for (uint64_t s = r->executed; s > target; s--) {
        struct nop_undo *u = rec_of(r, s);
        int rc = 0;
        if (u->pair == NOP_UNDO_HELD || u->pair == NOP_UNDO_ABSENT)
            rc = restore_pair(r, u);
        /* The client's row first: a row its apply evicted goes back into
         * the room that frees. */
        if (rc == 0 && u->row.client_id)
            rc = restore_row(r, &u->row);
        if (rc == 0 && u->gone.client_id)
            rc = restore_row(r, &u->gone);
        if (rc < 0) {
            r->poisoned = 1; /* storage (cons.h's failure rule) */
            return FK_EPOISONED;
        }
        r->ctab.ops = u->clock;
        u->slot = 0;
        r->executed = s - 1;
    }
    r->undone++;
    r->stash_reset = 1;
    r->marked = UINT64_MAX; /* the clock moved back: mark again, whatever executes next */
    return 0;
}

/* ---- the stash: records kept with the machine (cons.h) ------------------ */

static void put_session(struct cons_wbuf *w, const struct cons_session *s)
{
    cons_w_u64(w, s->client_id);
    cons_w_u64(w, s->req_no);
    cons_w_u64(w, s->stamp);
    cons_w_u32(w, (uint32_t)s->status);
}

static void get_session(struct cons_rbuf *rd, struct cons_session *s)
{
    s->client_id = cons_r_u64(rd);
    s->req_no = cons_r_u64(rd);
    s->stamp = cons_r_u64(rd);
    s->status = (int32_t)cons_r_u32(rd);
}

/* Bytes a record takes encoded, at most. */
static size_t rec_bytes(const struct nop_undo *u)
{
    size_t n = 8 + 8 + 2 * 28 + 1;
    if (u->pair == NOP_UNDO_HELD || u->pair == NOP_UNDO_ABSENT)
        n += 2 + u->klen;
    if (u->pair == NOP_UNDO_HELD)
        n += 4 + u->vlen;
    return n;
}

static void rec_put(struct cons_wbuf *w, const struct nop_undo *u)
{
    cons_w_u64(w, u->slot);
    cons_w_u64(w, u->clock);
    put_session(w, &u->row);
    put_session(w, &u->gone);
    cons_w_u8(w, u->pair);
    if (u->pair == NOP_UNDO_HELD || u->pair == NOP_UNDO_ABSENT) {
        cons_w_u16(w, u->klen);
        cons_w_bytes(w, u->bytes, u->klen);
    }
    if (u->pair == NOP_UNDO_HELD) {
        cons_w_u32(w, u->vlen);
        cons_w_bytes(w, u->bytes + u->klen, u->vlen);
    }
}

static int rec_get(struct cons_rbuf *rd, struct nop_undo *u)
{
    u->slot = cons_r_u64(rd);
    u->clock = cons_r_u64(rd);
    get_session(rd, &u->row);
    get_session(rd, &u->gone);
    u->pair = cons_r_u8(rd);
    u->klen = 0;
    u->vlen = 0;
    if (u->pair == NOP_UNDO_HELD || u->pair == NOP_UNDO_ABSENT) {
        u->klen = cons_r_u16(rd);
        if (u->klen > CONS_KEY_MAX)
            return FK_EMALFORMED;
        const uint8_t *k = cons_r_bytes(rd, u->klen);
        if (k)
            memcpy(u->bytes, k, u->klen);
    }
    if (u->pair == NOP_UNDO_HELD) {
        u->vlen = cons_r_u32(rd);
        if (u->vlen > sizeof u->bytes - u->klen)
            return FK_EMALFORMED;
        const uint8_t *v = cons_r_bytes(rd, u->vlen);
        if (v)
            memcpy(u->bytes + u->klen, v, u->vlen);
    }
    if (u->pair > NOP_UNDO_LOST || u->slot == 0)
        return FK_EMALFORMED;
    return rd->err ? FK_EMALFORMED : 0;
}

/* Puts the records of slots [from, to] into one stash record keyed by to. */
static int stash_batch(struct nop *r, uint64_t from, uint64_t to)
{
    size_t need = 0;
    for (uint64_t s = from; s <= to; s++) {
        const struct nop_undo *u = rec_of(r, s);
        if (u->slot == s)
            need += rec_bytes(u);
    }
    if (need == 0)
        return 0;
    if (need > r->stash_cap) {
        /* Grows to the largest batch seen; a step executes at most a ring. */
        uint8_t *b = realloc(r->stash_buf, need);
        if (!b)
            return FK_ENOMEM;
        r->stash_buf = b;
        r->stash_cap = need;
    }
    struct cons_wbuf w;
    cons_wbuf_init(&w, r->stash_buf, r->stash_cap);
    for (uint64_t s = from; s <= to; s++) {
        const struct nop_undo *u = rec_of(r, s);
        if (u->slot == s)
            rec_put(&w, u);
    }
    FK_ASSERT(!w.err);
    return r->sm.ops->stash_put(r->sm.impl, to, w.p, w.len);
}

void nop__stash_sync(struct nop *r)
{
    if (nop__commit_only(r) || r->poisoned)
        return; /* durable mode never executes past its commit point */
    uint64_t top = r->executed < r->commit ? r->executed : r->commit;
    int rc = 0;
    if (r->stash_reset) {
        rc = r->sm.ops->stash_drop(r->sm.impl, 0, UINT64_MAX);
        r->stash_hi = r->stash_dropped = top;
        r->stash_reset = 0;
    }
    if (rc == 0 && r->stash_hi > r->stash_dropped && r->commit > r->stash_dropped) {
        /* A batch goes once its last slot committed. */
        uint64_t to = r->commit < r->stash_hi ? r->commit : r->stash_hi;
        rc = r->sm.ops->stash_drop(r->sm.impl, 0, to);
        r->stash_dropped = to;
    }
    if (rc == 0 && !nop__needs_state(r) && r->executed > r->commit && r->executed > r->stash_hi) {
        uint64_t from = (r->stash_hi > r->commit ? r->stash_hi : r->commit) + 1;
        rc = stash_batch(r, from, r->executed);
        r->stash_hi = r->executed;
    }
    if (rc < 0)
        r->poisoned = 1; /* storage (cons.h's failure rule) */
}

static int stash_one(void *arg, uint64_t key, const uint8_t *buf, size_t len)
{
    struct nop *r = arg;
    struct cons_rbuf rd;
    struct nop_undo u;
    cons_rbuf_init(&rd, buf, len);
    (void)key;
    while (rd.off < rd.len) {
        if (rec_get(&rd, &u) < 0)
            return FK_EMALFORMED;
        struct nop_undo *d = rec_of(r, u.slot);
        *d = u;
    }
    return 0;
}

int nop__stash_restore(struct nop *r)
{
    int rc = r->sm.ops->stash_load(r->sm.impl, stash_one, r);
    r->stash_reset = 1; /* rewritten at the end of start */
    return rc;
}
