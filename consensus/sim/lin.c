/* lin.c: per-key Wing-Gong-Lowe linearizability search (see lin.h). */
#include "lin.h"

#include "fk_error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One register operation after projection onto a key. */
struct reg_op {
    uint8_t type; /* GET (also projected scans), PUT, DEL, CAS */
    int32_t status;
    uint64_t arg, exp, out, call, ret;
    size_t src; /* index in the original history */
};

/* A call or return event in Lowe's doubly linked list. */
struct ev {
    int op; /* register op index */
    int is_call;
    struct ev *match; /* call -> its return */
    struct ev *prev, *next;
};

/* Applies op to state; returns 1 and the next state if op's recorded
 * result is possible from state. */
static int reg_step(const struct reg_op *op, uint64_t st, uint64_t *next)
{
    *next = st;
    switch (op->type) {
    case CONS_OP_GET:
        return op->status == 0 ? st != 0 && st == op->out : st == 0;
    case CONS_OP_PUT:
        if (op->status == 0)
            *next = op->arg;
        return 1;
    case CONS_OP_DEL:
        if (op->status == 0) {
            *next = 0;
            return st != 0;
        }
        return st == 0;
    case CONS_OP_CAS:
        if (op->status == 0) {
            *next = op->arg;
            return st != 0 && st == op->exp;
        }
        if (op->status == FK_ECASFAIL)
            return st != 0 && st != op->exp;
        return st == 0;
    default:
        return 0;
    }
}

/* Memo of visited (bitset, state) configurations: open addressing over
 * 64-bit fingerprints (a collision could only prune a branch; with 64-bit
 * hashes over at most max_steps entries that is negligible). */
struct memo {
    uint64_t *keys;
    size_t cap, used;
};

static uint64_t fp(const uint64_t *bits, size_t words, uint64_t st)
{
    uint64_t h = st * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < words; i++)
        h = (h ^ bits[i]) * 0xff51afd7ed558ccdULL + (h >> 29);
    return h | 1;
}

static int memo_add(struct memo *m, uint64_t k)
{
    if (m->used * 2 >= m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 1024;
        uint64_t *nk = calloc(ncap, sizeof *nk);
        if (!nk)
            return FK_ENOMEM;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i])
                continue;
            size_t j = m->keys[i] & (ncap - 1);
            while (nk[j])
                j = (j + 1) & (ncap - 1);
            nk[j] = m->keys[i];
        }
        free(m->keys);
        m->keys = nk;
        m->cap = ncap;
    }
    size_t j = k & (m->cap - 1);
    while (m->keys[j]) {
        if (m->keys[j] == k)
            return 0;
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = k;
    m->used++;
    return 1;
}

static int cmp_ev_time(const void *a, const void *b, void *ctx);

struct sort_ctx {
    const struct reg_op *ops;
};

static uint64_t ev_time(const struct ev *e, const struct reg_op *ops)
{
    return e->is_call ? ops[e->op].call : ops[e->op].ret;
}

static int cmp_ev_time(const void *a, const void *b, void *ctx)
{
    const struct ev *x = a, *y = b;
    const struct reg_op *ops = ((struct sort_ctx *)ctx)->ops;
    uint64_t tx = ev_time(x, ops), ty = ev_time(y, ops);
    if (tx != ty)
        return tx < ty ? -1 : 1;
    /* Equal times: calls first, so touching operations count as concurrent. */
    return y->is_call - x->is_call;
}

static void lift(struct ev *call)
{
    call->prev->next = call->next;
    if (call->next)
        call->next->prev = call->prev;
    struct ev *ret = call->match;
    ret->prev->next = ret->next;
    if (ret->next)
        ret->next->prev = ret->prev;
}

static void unlift(struct ev *call)
{
    struct ev *ret = call->match;
    ret->prev->next = ret;
    if (ret->next)
        ret->next->prev = ret;
    call->prev->next = call;
    if (call->next)
        call->next->prev = call;
}

struct frame {
    struct ev *call;
    uint64_t state;
};

/* Builds Lowe's list: call and return events sorted by time, each call
 * pointing at its return, linked from head. evs holds 2n events. */
static int build_events(const struct reg_op *ops, int n, struct ev *evs, struct ev *head)
{
    for (int i = 0; i < n; i++) {
        evs[2 * i] = (struct ev){.op = i, .is_call = 1};
        evs[2 * i + 1] = (struct ev){.op = i, .is_call = 0};
    }
    struct sort_ctx ctx = {ops};
    qsort_r(evs, 2 * (size_t)n, sizeof *evs, cmp_ev_time, &ctx);
    int *ret_at = calloc((size_t)n + 1, sizeof *ret_at);
    if (!ret_at)
        return FK_ENOMEM;
    for (int i = 0; i < 2 * n; i++) {
        if (!evs[i].is_call)
            ret_at[evs[i].op] = i;
    }
    *head = (struct ev){.op = -1};
    struct ev *prev = head;
    for (int i = 0; i < 2 * n; i++) {
        if (evs[i].is_call)
            evs[i].match = &evs[ret_at[evs[i].op]];
        evs[i].prev = prev;
        prev->next = &evs[i];
        prev = &evs[i];
    }
    free(ret_at);
    return 0;
}

/* Lowe's algorithm over one key's register history: linearize the first
 * call that is consistent and leads to an unseen (set, state); when a
 * return is reached first, backtrack. */
static int search(struct ev *head, const struct reg_op *ops, uint64_t *bits, size_t words,
                  struct frame *stack, struct memo *memo, uint64_t max_steps)
{
    uint64_t state = 0, steps = 0;
    int sp = 0;
    struct ev *e = head->next;
    while (head->next) {
        if (++steps > max_steps)
            return FK_ETIMEDOUT;
        if (!e->is_call) {
            if (sp == 0)
                return FK_EPROTO;
            struct frame f = stack[--sp];
            state = f.state;
            bits[f.call->op / 64] &= ~(1ull << (f.call->op % 64));
            unlift(f.call);
            e = f.call->next;
            continue;
        }
        uint64_t next;
        if (reg_step(&ops[e->op], state, &next)) {
            bits[e->op / 64] |= 1ull << (e->op % 64);
            int fresh = memo_add(memo, fp(bits, words, next));
            if (fresh < 0)
                return fresh;
            if (fresh) {
                stack[sp++] = (struct frame){e, state};
                state = next;
                lift(e);
                e = head->next;
                continue;
            }
            bits[e->op / 64] &= ~(1ull << (e->op % 64));
        }
        e = e->next;
    }
    return 0;
}

static int check_register(const struct reg_op *ops, int n, uint64_t max_steps)
{
    int rc = FK_ENOMEM;
    size_t words = ((size_t)n + 63) / 64;
    struct ev *evs = calloc(2 * (size_t)n + 1, sizeof *evs);
    struct frame *stack = calloc((size_t)n + 1, sizeof *stack);
    uint64_t *bits = calloc(words + 1, sizeof *bits);
    struct memo memo = {0};
    struct ev head;
    if (evs && stack && bits && build_events(ops, n, evs, &head) == 0)
        rc = search(&head, ops, bits, words, stack, &memo, max_steps);
    free(evs);
    free(stack);
    free(bits);
    free(memo.keys);
    return rc;
}

/* Projects the history onto key k (see lin.h for scans). */
static int project(const struct lin_op *ops, size_t n, uint32_t k, struct reg_op *out)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        const struct lin_op *o = &ops[i];
        if (o->ret == LIN_PENDING)
            continue;
        struct reg_op r = {.type = o->type,
                           .status = o->status,
                           .arg = o->arg,
                           .exp = o->exp,
                           .out = o->out,
                           .call = o->call,
                           .ret = o->ret,
                           .src = i};
        if (o->type == CONS_OP_SCAN) {
            if (o->status != 0 || k < o->key || (o->scan_after && k == o->key) || k >= o->scan_end)
                continue;
            r.type = CONS_OP_GET;
            r.status = FK_ENOTFOUND;
            /* A short page ends the range, unless it stopped for bytes. */
            int covered = o->scan_n < o->scan_limit && !o->scan_cut;
            for (uint8_t j = 0; j < o->scan_n; j++) {
                if (o->scan_keys[j] == k) {
                    r.status = 0;
                    r.out = o->scan_vals[j];
                }
                if (o->scan_keys[j] >= k)
                    covered = 1;
            }
            if (!covered)
                continue;
        } else if (o->key != k || o->status == FK_EFULL || o->status == FK_EQUOTA) {
            continue;
        }
        out[m++] = r;
    }
    return m;
}

int lin_check(const struct lin_op *ops, size_t n, uint32_t nkeys, uint64_t max_steps, char *why,
              size_t why_cap)
{
    struct reg_op *reg = calloc(n + 1, sizeof *reg);
    if (!reg)
        return FK_ENOMEM;
    int rc = 0;
    for (uint32_t k = 0; k < nkeys && rc == 0; k++) {
        int m = project(ops, n, k, reg);
        rc = check_register(reg, m, max_steps);
        if (rc == FK_EPROTO)
            snprintf(why, why_cap, "key %u: %d operations admit no linearization", k, m);
        else if (rc == FK_ETIMEDOUT)
            snprintf(why, why_cap, "key %u: search exceeded %" PRIu64 " steps", k, max_steps);
    }
    free(reg);
    return rc;
}
