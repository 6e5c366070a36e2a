/* core_fix.c: the protocol cores' test fixture; see core_fix.h. */
#include "core_fix.h"

#include "check.h"
#include "nop.h"

#include <stdlib.h>
#include <string.h>

static void rec_set(struct cfx_rec *d, const uint8_t *buf, uint32_t len, uint64_t index,
                    uint8_t kind)
{
    free(d->buf);
    d->buf = malloc(len + 1);
    CHECK(d->buf != NULL);
    memcpy(d->buf, buf, len);
    d->len = len;
    d->index = index;
    d->kind = kind;
}

void cfx_rec_clear(struct cfx_rec *d)
{
    free(d->buf);
    memset(d, 0, sizeof *d);
}

static void disk_drop_pending(struct cfx_disk *d)
{
    for (uint32_t k = 0; k < d->npending; k++)
        cfx_rec_clear(&d->pending[k]);
    d->npending = 0;
}

static void disk_wipe(struct cfx_disk *d)
{
    cfx_rec_clear(&d->meta);
    cfx_rec_clear(&d->snap);
    for (int k = 0; k < CFX_SLOTS; k++)
        cfx_rec_clear(&d->ents[k]);
    disk_drop_pending(d);
}

/* A completed persist: META and SNAPSHOT replace theirs (a SNAPSHOT drops
 * the entries it covers), an ENTRY its slot. */
static void disk_complete(struct cfx_disk *d, const struct cfx_rec *p)
{
    if (p->kind == CONS_PERSIST_META) {
        rec_set(&d->meta, p->buf, p->len, 0, p->kind);
    } else if (p->kind == CONS_PERSIST_ENTRY) {
        rec_set(&d->ents[p->index % CFX_SLOTS], p->buf, p->len, p->index, p->kind);
    } else {
        CHECK_EQ_U64(p->kind, CONS_PERSIST_SNAPSHOT);
        rec_set(&d->snap, p->buf, p->len, p->index, p->kind);
        d->nsnaps++;
        for (int e = 0; e < CFX_SLOTS; e++)
            if (d->ents[e].buf && d->ents[e].index <= p->index)
                cfx_rec_clear(&d->ents[e]);
    }
}

void cfx_init(struct cfx *g, enum cons_proto proto, uint32_t n, const struct cons_core_config *cfg,
              enum cfx_net net, enum cfx_disks disks)
{
    CHECK(n >= 1 && n <= CONS_REPLICAS_MAX);
    memset(g, 0, sizeof *g);
    g->proto = proto;
    g->n = n;
    g->cfg = *cfg;
    g->cfg.n = n;
    g->net = net;
    g->disks = disks;
}

struct cons_outbox *cfx_boot_quiet(struct cfx *g, uint32_t i, enum cons_start_mode mode)
{
    struct cfx_disk *d = &g->disk[i];
    struct cons_core_config c = g->cfg;
    c.id = i;
    c.seed = ++g->seeds;
    if (mode == CONS_START_EMPTY) { /* the disk went, the machine with it */
        kv_mem_destroy(g->kv[i]);
        g->kv[i] = NULL;
        disk_wipe(d);
    }
    if (g->kv[i] == NULL)
        g->kv[i] = kv_mem_create(8);
    CHECK_OK(cons_core_create(&g->core[i], cons_core_ops_of(g->proto), &c, kv_mem_sm(g->kv[i])));
    g->down &= ~(1u << i);
    d->last_cookie = 0; /* cookies count per incarnation */
    const struct cons_core_ops *ops = g->core[i].ops;
    void *impl = g->core[i].impl;
    if (mode == CONS_START_RESTORED) {
        CHECK(d->meta.buf != NULL);
        CHECK_OK(ops->restore_meta(impl, d->meta.buf, d->meta.len));
        if (d->snap.buf)
            CHECK_OK(ops->restore_snapshot(impl, d->snap.buf, d->snap.len));
        for (int k = 0; k < CFX_SLOTS; k++)
            if (d->ents[k].buf && d->ents[k].index > d->snap.index)
                CHECK_OK(ops->restore_entry(impl, d->ents[k].buf, d->ents[k].len));
    }
    struct cons_outbox *ob;
    CHECK_OK(ops->start(impl, mode, g->now, &ob));
    return ob;
}

void cfx_boot(struct cfx *g, uint32_t i, enum cons_start_mode mode)
{
    cfx_deliver(g, i, cfx_boot_quiet(g, i, mode));
}

void cfx_start(struct cfx *g)
{
    for (uint32_t i = 0; i < g->n; i++)
        cfx_boot(g, i, CONS_START_FRESH);
}

void cfx_crash(struct cfx *g, uint32_t i)
{
    cons_core_destroy(&g->core[i]);
    memset(&g->core[i], 0, sizeof g->core[i]);
    g->down |= 1u << i;
    disk_drop_pending(&g->disk[i]); /* what the disk had not completed is lost */
}

void cfx_stop(struct cfx *g)
{
    for (uint32_t i = 0; i < g->n; i++) {
        if (g->core[i].impl != NULL)
            cons_core_destroy(&g->core[i]);
        kv_mem_destroy(g->kv[i]);
        g->kv[i] = NULL;
        disk_wipe(&g->disk[i]);
    }
    for (; g->qn > 0; g->qn--, g->qhead = (g->qhead + 1) % CFX_QUEUE)
        free(g->q[g->qhead].buf);
}

void cfx_step(struct cfx *g, uint32_t i, const struct cons_input *in)
{
    struct cons_outbox *ob;
    const struct cons_core_ops *ops = g->core[i].ops;
    CHECK_OK(ops->step(g->core[i].impl, in, g->now, &ob));
    if (ops->seal != NULL)
        CHECK_OK(ops->seal(g->core[i].impl)); /* each step a commit (nop.h) */
    ops->invariants(g->core[i].impl);
    cfx_deliver(g, i, ob);
}

void cfx_send(struct cfx *g, uint32_t from, uint32_t to, const uint8_t *buf, size_t len)
{
    if (g->down >> to & 1)
        return;
    struct cons_input in = {
        .kind = CONS_IN_MSG, .from = cons_replica(from), .buf = buf, .len = len};
    g->bytes_to[to] += len;
    cfx_step(g, to, &in);
}

/* The disk takes the outbox's persists: pending (MANUAL), or completed at
 * once (NOW). Returns the cookie to report as durable, 0 for none. */
static uint64_t take_persists(struct cfx *g, uint32_t i, const struct cons_outbox *ob)
{
    struct cfx_disk *d = &g->disk[i];
    if (g->disks == CFX_DISK_NONE || ob->npersists == 0)
        return 0;
    for (uint32_t k = 0; k < ob->npersists; k++) {
        const struct cons_persist *p = &ob->persists[k];
        CHECK(d->npending < CFX_PENDING);
        CHECK(p->cookie == d->last_cookie + d->npending + 1); /* in order, none skipped */
        struct cfx_rec *x = &d->pending[d->npending++];
        memset(x, 0, sizeof *x);
        rec_set(x, p->buf, p->len, p->index, p->kind);
    }
    if (g->disks == CFX_DISK_MANUAL)
        return 0;
    for (uint32_t k = 0; k < d->npending; k++)
        disk_complete(d, &d->pending[k]);
    d->last_cookie += d->npending;
    disk_drop_pending(d);
    return d->last_cookie;
}

static void route(struct cfx *g, uint32_t from, const struct cons_out_msg *m)
{
    if (m->to.kind == CONS_ADDR_CLIENT) {
        if (g->hooks.reply != NULL)
            g->hooks.reply(g, from, m);
        return;
    }
    if (g->hooks.route != NULL && g->hooks.route(g, from, m))
        return;
    for (uint32_t j = 0; j < g->n; j++)
        if (cons_addr_has_replica(m->to, from, j))
            cfx_send(g, from, j, m->buf, m->len);
}

void cfx_deliver(struct cfx *g, uint32_t from, const struct cons_outbox *ob)
{
    uint64_t cookie = take_persists(g, from, ob);
    uint32_t nm = ob->nmsgs;
    if (g->net == CFX_QUEUED) {
        for (uint32_t k = 0; k < nm; k++) {
            CHECK(g->qn < CFX_QUEUE);
            struct cfx_qmsg *m = &g->q[(g->qhead + g->qn++) % CFX_QUEUE];
            m->from = from;
            m->to = ob->msgs[k].to;
            m->len = ob->msgs[k].len;
            m->buf = malloc(m->len + 1);
            memcpy(m->buf, ob->msgs[k].buf, m->len);
        }
    } else {
        /* A copy: the outbox is reused by the steps this delivery makes. */
        struct cons_out_msg *msgs = malloc(nm * sizeof *msgs + 1);
        uint8_t *copy = malloc(ob->arena_used + 1);
        memcpy(copy, ob->arena, ob->arena_used);
        for (uint32_t k = 0; k < nm; k++) {
            msgs[k] = ob->msgs[k];
            msgs[k].buf = copy + (ob->msgs[k].buf - ob->arena);
        }
        if (cookie && !(g->down >> from & 1)) {
            struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = cookie};
            cfx_step(g, from, &in);
        }
        for (uint32_t k = 0; k < nm; k++)
            route(g, from, &msgs[k]);
        free(msgs);
        free(copy);
        return;
    }
    if (cookie && !(g->down >> from & 1)) {
        struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = cookie};
        cfx_step(g, from, &in);
    }
}

void cfx_flush(struct cfx *g, uint32_t i, uint32_t n)
{
    struct cfx_disk *d = &g->disk[i];
    if (n == 0 || (g->down >> i & 1))
        return;
    CHECK(n <= d->npending);
    for (uint32_t k = 0; k < n; k++) {
        disk_complete(d, &d->pending[k]);
        cfx_rec_clear(&d->pending[k]);
    }
    d->last_cookie += n;
    memmove(d->pending, d->pending + n, (d->npending - n) * sizeof d->pending[0]);
    memset(d->pending + d->npending - n, 0, n * sizeof d->pending[0]);
    d->npending -= n;
    struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = d->last_cookie};
    cfx_step(g, i, &in);
}

void cfx_flush_all(struct cfx *g, uint32_t i)
{
    cfx_flush(g, i, g->disk[i].npending);
}

static void deliver_one(struct cfx *g)
{
    struct cfx_qmsg m = g->q[g->qhead];
    g->qhead = (g->qhead + 1) % CFX_QUEUE;
    g->qn--;
    struct cons_out_msg om = {.to = m.to, .buf = m.buf, .len = m.len};
    route(g, m.from, &om);
    free(m.buf);
}

void cfx_pump(struct cfx *g)
{
    for (int round = 0; round < 100000; round++) {
        if (g->qn) {
            deliver_one(g);
            continue;
        }
        int moved = 0;
        for (uint32_t i = 0; i < g->n && g->auto_flush; i++) {
            uint64_t before = g->disk[i].last_cookie;
            cfx_flush_all(g, i);
            moved |= g->disk[i].last_cookie != before;
        }
        if (!moved)
            return;
    }
    CHECK_MSG(0, "the network did not settle");
}

void cfx_ticks(struct cfx *g, int n, uint64_t dt)
{
    for (int t = 0; t < n; t++) {
        g->now += dt;
        for (uint32_t i = 0; i < g->n; i++) {
            struct cons_input in = {.kind = CONS_IN_TICK};
            if (!(g->down >> i & 1))
                cfx_step(g, i, &in);
        }
        if (g->net == CFX_QUEUED)
            cfx_pump(g);
    }
}

struct cons_core_status cfx_status(const struct cfx *g, uint32_t i)
{
    struct cons_core_status st;
    g->core[i].ops->status(g->core[i].impl, &st);
    return st;
}

int cfx_leader(const struct cfx *g)
{
    for (uint32_t i = 0; i < g->n; i++)
        if (g->core[i].impl != NULL && !(g->down >> i & 1) &&
            cfx_status(g, i).role == CONS_ROLE_LEADER)
            return (int)i;
    return -1;
}

uint64_t cfx_oum_next(struct cfx *g)
{
    return ++g->msgnum;
}

void cfx_oum_to(struct cfx *g, uint32_t i, uint64_t num, const struct cons_op *op, int drop)
{
    static uint8_t buf[CFX_MSG_MAX];
    if (g->down >> i & 1)
        return; /* lost: the OUM never reached it */
    int len = drop         ? nop_encode_oum_drop(buf, sizeof buf, g->session, num)
              : op == NULL ? nop_encode_oum_fill(buf, sizeof buf, g->session, num)
                           : nop_encode_oum_request(buf, sizeof buf, g->session, num, op);
    CHECK(len > 0);
    struct cons_input in = {
        .kind = CONS_IN_MSG, .from = {CONS_ADDR_OUM, 0}, .buf = buf, .len = (size_t)len};
    cfx_step(g, i, &in);
}

int cfx_same_pairs(const struct cfx *g, uint32_t a, uint32_t b)
{
    static uint8_t x[(1 << 16) + CONS_SNAP_RECORD_MAX], y[(1 << 16) + CONS_SNAP_RECORD_MAX];
    size_t lx, ly;
    struct cons_sm sa = kv_mem_sm(g->kv[a]), sb = kv_mem_sm(g->kv[b]);
    CHECK_OK(cons_sm_pairs(&sa, x, sizeof x, &lx));
    CHECK_OK(cons_sm_pairs(&sb, y, sizeof y, &ly));
    return lx == ly && memcmp(x, y, lx) == 0;
}
