/* mpx.c: the Multi-Paxos replica: setup, persistence, the log, applying,
 * and the step dispatcher. Message handlers for elections and phase 2 are
 * in mpx_paxos.c, recovery in mpx_recover.c. */
#include "mpx_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define MPX_META_MAGIC 0x4d58504du /* "MPXM" */
#define MPX_TRIM_MAGIC 0x5458504du /* "MPXT" */

uint64_t mpx__rand(struct mpx *r)
{
    /* xorshift64*: deterministic given cfg.seed, which the driver chooses. */
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 0x2545F4914F6CDD1DULL;
}

/* The most big-op bytes a leader may propose (mpx.h, big_bytes): a
 * PROMISE carries the whole log, log_cap inline entries and up to twice
 * this many big-op bytes (a replica stores up to twice what a leader
 * proposes: entries of two ballots), in one message. */
static size_t big_default(const struct mpx_config *c)
{
    size_t fixed = (size_t)c->log_cap * MPX_ENTRY_INLINE(c->batch_max) + (64u << 10);
    return fixed < CONS_MSG_MAX ? (CONS_MSG_MAX - fixed) / 2 : 0;
}

static int config_ok(const struct mpx_config *c)
{
    /* Epoch 0's members: all n (odd), or some of them (mpx.h,
     * "Reconfiguration": the others are learners). */
    int members_ok = c->members == 0 ? c->n % 2 == 1 : (c->members >> c->n) == 0;
    return c->n >= 3 && c->n <= CONS_REPLICAS_MAX && members_ok && c->epoch < MPX_EPOCH_MAX &&
           c->id < c->n && c->log_cap >= 8 && c->log_cap <= CONS_LOG_CAP_MAX &&
           (c->log_cap & (c->log_cap - 1)) == 0 && c->window >= 1 && c->window <= c->log_cap / 4 &&
           c->batch_max >= 1 && c->batch_max <= CONS_BATCH_MAX && c->pending_max >= 1 &&
           c->pending_max <= 65536 && c->clients_max >= 1 && c->clients_max <= CONS_CLIENTS_MAX &&
           c->heartbeat_ns > 0 && c->election_ns > 2 * c->heartbeat_ns && c->xfer_chunk >= 1 &&
           c->xfer_chunk <= (1u << 20) && c->xfer_window >= 1 &&
           c->xfer_window <= CONS_XFER_WINDOW_MAX &&
           /* A promise carries the whole log in one message (big_default). */
           big_default(c) >= (4u << 10) && c->big_bytes <= big_default(c) &&
           (c->big_bytes == 0 || c->big_bytes >= (4u << 10));
}

/* Memory, all allocated here and never again:
 *   slots        log_cap * sizeof(struct mpx_slot)             (48 B each)
 *   op pool      log_cap * batch_max * sizeof(struct cons_op)  (4,136 B each)
 *   pending      pending_max * sizeof(struct cons_op)
 *   big ops      at most 3 * big_bytes, allocated as values over
 *                CONS_OP_INLINE arrive and given back as soon as their slot
 *                or queue entry holds a small op, or is compacted (cons.h,
 *                cons_op_store); nothing for a workload of small values
 *   reply        CONS_REPLY_MAX (1 MiB, touched as far as results go)
 *   client table 2 * clients_max slots of 56 B (cons.h)
 *   transfer     struct cons_xfer: a view's cursors per peer, ~60 KiB
 *   history      history_bytes (cons_hist.h: + 1/8), and one encoded entry
 *   outbox arena max(arena_bytes, xfer_window chunks + 64 KiB)
 * The state itself is the state machine's (cons.h): nothing here grows
 * with the data. e.g. log_cap 32, batch 4, 16 clients: ~0.8 MiB. */
static int alloc_all(struct mpx *r)
{
    const struct mpx_config *c = &r->cfg;
    r->slots = calloc(c->log_cap, sizeof *r->slots);
    r->op_pool = calloc((size_t)c->log_cap * c->batch_max, sizeof *r->op_pool);
    r->pending = calloc(c->pending_max, sizeof *r->pending);
    r->scratch_batch = calloc(c->batch_max, sizeof *r->scratch_batch);
    r->big_pool = calloc((size_t)c->log_cap * c->batch_max, sizeof *r->big_pool);
    r->pend_big = calloc(c->pending_max, sizeof *r->pend_big);
    r->reply.data = malloc(CONS_REPLY_MAX);
    r->reply.cap = CONS_REPLY_MAX;
    r->pend_bigs.max = c->big_bytes ? c->big_bytes : big_default(c);
    r->log_big.max = 2 * r->pend_bigs.max;
    if (!r->big_pool || !r->pend_big || !r->reply.data)
        return FK_ENOMEM;
    /* A step may send a window of chunks (cons_xfer), each up to its
     * target plus one record and a header. */
    size_t arena = c->arena_bytes;
    size_t xfer = (size_t)c->xfer_window * (c->xfer_chunk + CONS_SNAP_RECORD_MAX + 64);
    if (arena < xfer + (64u << 10))
        arena = xfer + (64u << 10);
    r->ob.arena = malloc(arena);
    r->ob.arena_cap = arena;
    if (!r->slots || !r->op_pool || !r->pending || !r->scratch_batch || !r->ob.arena)
        return FK_ENOMEM;
    if (cons_hist_init(&r->hist, c->history_bytes) < 0)
        return FK_ENOMEM;
    if (c->history_bytes && !(r->hist_scratch = malloc(MPX_ENTRY_MAX)))
        return FK_ENOMEM;
    for (uint32_t i = 0; i < c->log_cap; i++) {
        r->slots[i].ops = &r->op_pool[(size_t)i * c->batch_max];
        r->slots[i].bigs = &r->big_pool[(size_t)i * c->batch_max];
    }
    return cons_ctab_init(&r->ctab, c->clients_max);
}

/* cons_xfer's messages travel as MPX_XFER, a kind byte before their body. */
static void xfer_begin(void *ctx, struct cons_wbuf *w, uint8_t kind)
{
    struct mpx *r = ctx;
    mpx__begin(r, w, MPX_XFER, 0);
    cons_w_u8(w, kind);
}

static void xfer_send(void *ctx, struct cons_wbuf *w, uint32_t to)
{
    mpx__send(ctx, w, cons_replica(to));
}

/* The configuration in force at a view's index (mpx.h,
 * "Reconfiguration"), which the machine does not hold: this replica's, if
 * it came into force at or before the index (a view of flowkv-server's
 * machine may be older than what the core applied). */
static int xfer_describe(void *ctx, uint64_t index, uint8_t *buf)
{
    struct mpx *r = ctx;
    if (index < r->conf_slot)
        return -1;
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, CONS_XFER_DESC_MAX);
    mpx__put_conf(r, &w);
    FK_ASSERT(!w.err);
    return (int)w.len;
}

void mpx__adopt_desc(struct mpx *r)
{
    size_t len;
    const uint8_t *d = cons_xfer_desc(&r->xfer, &len);
    if (len != MPX_CONF_BYTES)
        return;
    struct cons_rbuf rd;
    cons_rbuf_init(&rd, d, len);
    struct cons_config c;
    c.epoch = cons_r_u32(&rd);
    c.members = cons_r_u64(&rd);
    uint64_t slot = cons_r_u64(&rd), prev = cons_r_u64(&rd);
    if (rd.err || c.members == 0 || (c.members >> r->cfg.n) != 0 || (prev >> r->cfg.n) != 0 ||
        slot > r->applied || c.epoch == r->conf.epoch)
        return;
    mpx__set_conf(r, &c, slot, prev);
    mpx__persist_meta(r);
    if (r->role != MPX_RECOVERING)
        mpx__conf_changed(r); /* a transfer begun as a follower may end in a leader */
}

static int xfer_init(struct mpx *r)
{
    const struct mpx_config *c = &r->cfg;
    struct cons_xfer_config xc = {.n = c->n,
                                  .id = c->id,
                                  .chunk = c->xfer_chunk,
                                  .window = c->xfer_window,
                                  .retry_ns = 2 * c->heartbeat_ns,
                                  .switch_ns = 2 * c->election_ns};
    struct cons_xfer_io io = {
        .ctx = r, .begin = xfer_begin, .send = xfer_send, .describe = xfer_describe};
    return cons_xfer_init(&r->xfer, &xc, r->sm, io, c->seed * 31 + c->id);
}

struct mpx *mpx_create(const struct mpx_config *cfg, struct cons_sm sm, int *err)
{
    *err = FK_EINVAL;
    if (!cfg || !config_ok(cfg) || !sm.ops)
        return NULL;
    struct mpx *r = calloc(1, sizeof *r);
    *err = FK_ENOMEM;
    if (!r)
        return NULL;
    r->cfg = *cfg;
    r->sm = sm;
    struct cons_config c0 = {.epoch = cfg->epoch,
                             .members = cfg->members ? cfg->members : (1ull << cfg->n) - 1};
    mpx__set_conf(r, &c0, 0, 0);
    r->rng = cfg->seed * 0x9E3779B97F4A7C15ULL + cfg->id + 1;
    r->leader = UINT32_MAX;
    if ((*err = alloc_all(r)) < 0 || (*err = xfer_init(r)) < 0) {
        mpx_destroy(r);
        return NULL;
    }
    *err = 0;
    return r;
}

void mpx_destroy(struct mpx *r)
{
    if (!r)
        return;
    cons_xfer_close(&r->xfer);
    cons_ctab_free(&r->ctab);
    for (size_t i = 0; r->big_pool && i < (size_t)r->cfg.log_cap * r->cfg.batch_max; i++)
        cons_big_free(&r->big_pool[i], &r->log_big);
    for (uint32_t i = 0; r->pend_big && i < r->cfg.pending_max; i++)
        cons_big_free(&r->pend_big[i], &r->pend_bigs);
    free(r->big_pool);
    free(r->pend_big);
    free(r->reply.data);
    free(r->slots);
    free(r->op_pool);
    free(r->pending);
    free(r->scratch_batch);
    cons_hist_free(&r->hist);
    free(r->hist_scratch);
    free(r->ob.arena);
    free(r);
}

/* ---- the log ring -------------------------------------------------------- */

struct mpx_slot *mpx__slot(struct mpx *r, uint64_t index)
{
    if (index <= r->snap_index || index > r->snap_index + r->cfg.log_cap)
        return NULL;
    return &r->slots[index & (r->cfg.log_cap - 1)];
}

const struct mpx_slot *mpx__cslot(const struct mpx *r, uint64_t index)
{
    if (index <= r->snap_index || index > r->snap_index + r->cfg.log_cap)
        return NULL;
    const struct mpx_slot *s = &r->slots[index & (r->cfg.log_cap - 1)];
    return s->index == index ? s : NULL;
}

/* ---- the history of compacted entries (mpx.h) ------------------------------ */

/* Appends chosen entry s to the history; s NULL (not in the ring): the
 * next add starts it again. */
static void hist_add(struct mpx *r, const struct mpx_slot *s)
{
    if (!r->hist_scratch || !s)
        return;
    struct cons_wbuf w;
    cons_wbuf_init(&w, r->hist_scratch, MPX_ENTRY_MAX);
    mpx__put_entry(&w, s);
    FK_ASSERT(!w.err);
    cons_hist_add(&r->hist, s->index, w.p, (uint32_t)w.len);
}

int mpx__send_history(struct mpx *r, uint32_t to, uint64_t from)
{
    if (!cons_hist_has(&r->hist, from))
        return -1;
    struct cons_wbuf w;
    mpx__begin(r, &w, MPX_CATCHUP, r->promised);
    cons_w_u64(&w, r->commit);
    size_t count_at = w.len;
    cons_w_u32(&w, 0);
    /* Half a ring: what the asker can take before it applies and
     * compacts; it asks again for the rest. */
    uint32_t n = 0, max = r->cfg.log_cap / 2;
    for (uint64_t i = from; i <= r->hist.hi && n < max; i++, n++) {
        uint32_t len = cons_hist_get(&r->hist, i, w.p + w.len, w.cap - w.len);
        if (len > w.cap - w.len) {
            w.err = n == 0; /* not even one fits: the arena is full */
            break;
        }
        w.len += len;
    }
    if (!w.err)
        memcpy(w.p + count_at, &n, sizeof n);
    mpx__send(r, &w, cons_replica(to));
    return 0;
}

/* Drops every slot at or below `upto` (they are inside the snapshot now). */
void mpx__slot_clear(struct mpx *r, struct mpx_slot *s)
{
    s->index = 0;
    s->chosen = 0;
    s->acks = 0;
    s->nops = 0;
    for (uint32_t k = 0; k < r->cfg.batch_max; k++)
        cons_big_free(&s->bigs[k], &r->log_big); /* the room goes back */
}

static void drop_prefix(struct mpx *r, uint64_t upto)
{
    for (uint32_t i = 0; i < r->cfg.log_cap; i++) {
        struct mpx_slot *s = &r->slots[i];
        if (s->index && s->index <= upto)
            mpx__slot_clear(r, s);
    }
}

/* ---- persistence ------------------------------------------------------- */

static struct cons_persist *persist_item(struct mpx *r, uint8_t kind, uint64_t index)
{
    if (r->ob.npersists >= CONS_OUT_PERSIST_MAX) {
        r->poisoned = 1; /* cannot drop a persist; the driver sized things wrong */
        return NULL;
    }
    struct cons_persist *p = &r->ob.persists[r->ob.npersists++];
    p->kind = kind;
    p->cookie = ++r->next_cookie;
    p->index = index;
    p->buf = r->ob.arena + r->ob.arena_used;
    p->len = 0;
    return p;
}

static void persist_commit(struct mpx *r, struct cons_persist *p, struct cons_wbuf *w)
{
    if (w->err) {
        r->poisoned = 1;
        return;
    }
    p->len = (uint32_t)w->len;
    r->ob.arena_used += w->len;
}

void mpx__persist_meta(struct mpx *r)
{
    struct cons_persist *p = persist_item(r, CONS_PERSIST_META, 0);
    if (!p)
        return;
    struct cons_wbuf w;
    cons_wbuf_init(&w, r->ob.arena + r->ob.arena_used, r->ob.arena_cap - r->ob.arena_used);
    cons_w_u32(&w, MPX_META_MAGIC);
    cons_w_u32(&w, r->cfg.n);
    cons_w_u32(&w, r->cfg.id);
    cons_w_u64(&w, r->promised);
    mpx__put_cv(r, &w); /* known[id] is this incarnation's generation */
    mpx__put_conf(r, &w);
    persist_commit(r, p, &w);
}

void mpx__set_conf(struct mpx *r, const struct cons_config *c, uint64_t slot, uint64_t prev)
{
    FK_ASSERT(c->members != 0 && (c->members >> r->cfg.n) == 0 && (prev >> r->cfg.n) == 0);
    r->conf = *c;
    r->conf_slot = slot;
    r->prev_members = prev;
    r->quorum = (uint32_t)__builtin_popcountll(c->members) / 2 + 1;
}

void mpx__persist_entry(struct mpx *r, const struct mpx_slot *s)
{
    struct cons_persist *p = persist_item(r, CONS_PERSIST_ENTRY, s->index);
    if (!p)
        return;
    struct cons_wbuf w;
    cons_wbuf_init(&w, r->ob.arena + r->ob.arena_used, r->ob.arena_cap - r->ob.arena_used);
    mpx__put_entry(&w, s);
    persist_commit(r, p, &w);
}

void mpx__persist_trim(struct mpx *r, uint64_t index)
{
    struct cons_persist *p = persist_item(r, CONS_PERSIST_SNAPSHOT, index);
    if (!p)
        return;
    struct cons_wbuf w;
    cons_wbuf_init(&w, r->ob.arena + r->ob.arena_used, r->ob.arena_cap - r->ob.arena_used);
    cons_w_u32(&w, MPX_TRIM_MAGIC);
    cons_w_u64(&w, index);
    persist_commit(r, p, &w);
}

/* ---- the state lives in the state machine (cons.h) ----------------------- */

/* MPX_BUG_STALE_ROWS: reads the mark only, the table stays as it was. */
static int skip_row(void *arg, const struct cons_session *s)
{
    (void)arg;
    (void)s;
    return 0;
}

uint64_t mpx__adopt_state(struct mpx *r)
{
    uint64_t index, clock;
    if ((r->cfg.bugs & MPX_BUG_STALE_ROWS) && r->started) {
        if (r->sm.ops->load(r->sm.impl, &index, &clock, skip_row, NULL) < 0)
            r->poisoned = 1;
    } else if (cons_sm_load(&r->sm, &r->ctab, &index) < 0) {
        r->poisoned = 1; /* the machine took the stream but cannot give it back */
        return 0;
    }
    drop_prefix(r, index);
    cons_hist_reset(&r->hist, index);
    r->snap_index = r->applied = index;
    if (r->commit < index)
        r->commit = index;
    if (r->last < index)
        r->last = index;
    if (r->role == MPX_LEADER && r->next_index <= index)
        r->next_index = index + 1;
    return index;
}

int mpx__xfer_msg(struct mpx *r, const struct mpx_msg *m, uint64_t serve)
{
    uint64_t index;
    int rc = cons_xfer_on_msg(&r->xfer, (uint8_t)m->u1, m->from, m->body, m->body_len, serve,
                              r->now, &index);
    if (rc < 0)
        r->poisoned = 1; /* storage: cons.h's failure rule */
    return rc == 1;
}

/* Log compaction: once half the ring is applied history, or while the
 * log holds large values (they wait for room: propose), drop that prefix.
 * The state machine already holds the state at the applied index, and its
 * writes reach the disk with this trim (cons.h): nothing is copied. */
static void maybe_compact(struct mpx *r)
{
    if (r->role == MPX_RECOVERING || r->applied == r->snap_index ||
        (r->applied - r->snap_index < r->cfg.log_cap / 2 && r->log_big.held == 0))
        return;
    for (uint64_t i = r->snap_index + 1; i <= r->applied; i++)
        hist_add(r, mpx__cslot(r, i)); /* applied: chosen and in the ring */
    drop_prefix(r, r->applied);
    r->snap_index = r->applied;
    mpx__persist_trim(r, r->applied);
}

/* ---- applying ------------------------------------------------------------ */

/* The outcome of the change at `slot` (mpx.h, "Reconfiguration"), the
 * same on every replica: the same log applied from the same
 * configurations. *next: the configuration it starts. */
static int32_t change_outcome(const struct mpx *r, const struct cons_op *op, uint64_t slot,
                              struct cons_config *next)
{
    struct cons_config c;
    if (cons_config_get(op, &c) < 0 || c.members == 0 || (c.members >> r->cfg.n) != 0)
        return FK_EINVAL;
    if (c.epoch != r->conf.epoch)
        return FK_EBUSY; /* another change came first */
    if (c.epoch >= MPX_EPOCH_MAX)
        return FK_EINVAL; /* the epochs a ballot holds are spent (README, Limits) */
    next->epoch = c.epoch + 1;
    next->members = c.members;
    return 0;
}

/* Applies slot s's change; 1 when it changed the configuration. */
static int apply_change(struct mpx *r, const struct mpx_slot *s)
{
    struct cons_config next = r->conf;
    uint64_t slot = r->applied + 1;
    int32_t st = change_outcome(r, &s->ops[0], slot, &next);
    int rc = cons_apply_core(&r->sm, &r->ctab, &s->ops[0], st, &r->reply);
    if (rc < 0) {
        r->poisoned = 1;
        return 0;
    }
    if (rc <= 1 && r->role == MPX_LEADER)
        mpx__reply(r, s->ops[0].client_id, &r->reply);
    if (rc != 0 || r->reply.status != 0 || next.epoch == r->conf.epoch)
        return 0;
    mpx__set_conf(r, &next, slot, r->conf.members);
    mpx__persist_meta(r);
    return 1;
}

void mpx__apply_committed(struct mpx *r)
{
    uint64_t from = r->applied;
    int changed = 0;
    while (r->applied < r->commit && !r->poisoned) {
        const struct mpx_slot *s = mpx__cslot(r, r->applied + 1);
        FK_ASSERT(s && s->chosen);
        if (mpx__is_change(s)) {
            changed |= apply_change(r, s);
            r->applied++;
            continue;
        }
        for (uint8_t k = 0; k < s->nops; k++) {
            if (s->ops[k].type == CONS_OP_NOOP)
                continue;
            /* Only the leader answers, so only it executes a read; the
             * others log it in their client tables (cons_log_read), whose
             * rows and clock move exactly as the leader's, as NOPaxos'
             * followers do (nop.c, nop__execute_to). A read changes no
             * state, and one retried after a leader change is read again
             * by the new leader (cons.h). Reading every GET at every
             * replica cost Multi-Paxos a third of its YCSB-B throughput at
             * a million 64-byte records (0.67 of its peak at 5,000 keys;
             * NOPaxos 0.96), B-tree descents that miss the cache. */
            /* A change travels alone in its slot (propose); one in a batch
             * is refused, as it would be by every replica. */
            int rc = s->ops[k].type == CONS_OP_CONFIG
                         ? cons_apply_core(&r->sm, &r->ctab, &s->ops[k], FK_EINVAL, &r->reply)
                     : r->role != MPX_LEADER && cons_op_reads(&s->ops[k])
                         ? cons_log_read(&r->sm, &r->ctab, &s->ops[k])
                         : cons_apply_once(&r->sm, &r->ctab, &s->ops[k], &r->reply);
            if (rc < 0) {
                r->poisoned = 1;
                return;
            }
            if (rc <= 1 && r->role == MPX_LEADER)
                mpx__reply(r, s->ops[k].client_id, &r->reply);
        }
        r->applied++;
    }
    /* The mark once for all the slots this call applied: a step's writes
     * reach the disk together (cons.h), so only its last mark counts. */
    if (r->applied > from && r->sm.ops->mark(r->sm.impl, r->applied, r->ctab.ops) < 0) {
        r->poisoned = 1;
        return;
    }
    if (r->stop_at && r->stop_at <= r->applied)
        r->stop_at = 0; /* applied, whatever its outcome: the stop sign is passed */
    if (changed)
        mpx__conf_changed(r);
    /* Caught up through the log meanwhile: a state fetched now would be
     * older than this one (it is staged, never installed, cons.h). */
    if (cons_xfer_active(&r->xfer) && r->role != MPX_RECOVERING && r->applied >= r->xfer.min_index)
        cons_xfer_stop(&r->xfer);
    maybe_compact(r);
}

/* ---- restore and start ---------------------------------------------------- */

int mpx_restore_meta(struct mpx *r, const uint8_t *buf, size_t len)
{
    struct cons_rbuf rd;
    cons_rbuf_init(&rd, buf, len);
    uint32_t magic = cons_r_u32(&rd), n = cons_r_u32(&rd), id = cons_r_u32(&rd);
    uint64_t promised = cons_r_u64(&rd);
    uint64_t known[CONS_REPLICAS_MAX] = {0};
    struct cons_config conf = r->conf;
    uint64_t conf_slot = r->conf_slot, conf_prev = r->prev_members;
    /* A META written before crash vectors existed ends here: generation 0
     * everywhere, which is what such a group ran with; one written before
     * reconfiguration ends after them: epoch 0, the configured members. */
    if (!rd.err && rd.off < rd.len) {
        uint32_t ncv = cons_r_u8(&rd);
        for (uint32_t p = 0; p < ncv && p < CONS_REPLICAS_MAX; p++)
            known[p] = cons_r_u64(&rd);
        if (ncv != n)
            return FK_EMALFORMED;
    }
    if (!rd.err && rd.off < rd.len) {
        conf.epoch = cons_r_u32(&rd);
        conf.members = cons_r_u64(&rd);
        conf_slot = cons_r_u64(&rd);
        conf_prev = cons_r_u64(&rd);
        if (conf.members == 0 || (conf.members >> r->cfg.n) != 0 || (conf_prev >> r->cfg.n) != 0)
            return FK_EMALFORMED;
    }
    if (r->started)
        return FK_EINVAL;
    if (cons_r_done(&rd) < 0 || magic != MPX_META_MAGIC || n != r->cfg.n || id != r->cfg.id)
        return FK_EMALFORMED;
    r->promised = r->max_seen = promised;
    memcpy(r->known, known, sizeof known);
    r->gen = known[id];
    mpx__set_conf(r, &conf, conf_slot, conf_prev);
    r->meta_seen = 1;
    return 0;
}

int mpx_restore_snapshot(struct mpx *r, const uint8_t *buf, size_t len)
{
    if (r->started)
        return FK_EINVAL;
    struct cons_rbuf rd;
    cons_rbuf_init(&rd, buf, len);
    uint32_t magic = cons_r_u32(&rd);
    uint64_t index = cons_r_u64(&rd);
    if (cons_r_done(&rd) < 0 || magic != MPX_TRIM_MAGIC)
        return FK_EMALFORMED;
    if (index > r->snap_index) {
        drop_prefix(r, index);
        r->snap_index = index;
    }
    return 0;
}

int mpx_restore_entry(struct mpx *r, const uint8_t *buf, size_t len)
{
    if (r->started)
        return FK_EINVAL;
    struct cons_rbuf rd;
    uint64_t index, ballot;
    uint8_t nops;
    cons_rbuf_init(&rd, buf, len);
    index = cons_r_u64(&rd);
    if (rd.err || index == 0)
        return FK_EMALFORMED;
    if (index <= r->snap_index)
        return 0; /* inside the snapshot already */
    struct mpx_slot *s = mpx__slot(r, index);
    if (!s)
        return FK_EINVAL;
    cons_rbuf_init(&rd, buf, len);
    if (mpx__entry_next(&rd, &index, &ballot, &nops, r->scratch_batch, r->cfg.batch_max) < 0 ||
        cons_r_done(&rd) < 0)
        return FK_EMALFORMED;
    int rc = mpx__slot_store(r, s, r->scratch_batch, nops);
    if (rc < 0)
        return rc; /* more big ops than the log holds: not a log this config wrote */
    s->index = index;
    s->ballot = ballot;
    s->chosen = 0;
    s->acks = 0;
    if (r->last < index)
        r->last = index;
    return 0;
}

int mpx_start(struct mpx *r, enum mpx_start_mode mode, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
    *out = &r->ob;
    if (r->started || (mode == MPX_START_RESTORED && !r->meta_seen))
        return FK_EINVAL;
    r->started = 1;
    r->now = now;
    if (mode == MPX_START_RESTORED) {
        /* The state machine holds the state at its mark, written with the
         * log (cons.h): the log before it is history. A mark below the
         * log's trim point means the disk lost state: refuse it. */
        uint64_t trimmed = r->snap_index, index = mpx__adopt_state(r);
        if (index < trimmed || r->poisoned)
            return r->poisoned ? FK_EPOISONED : FK_EMALFORMED;
        /* The disk's log base follows, so that what this replica accepts
         * from here on (up to index + log_cap) restores next time. */
        if (index > trimmed)
            mpx__persist_trim(r, index);
    }
    r->commit = r->applied = r->snap_index > r->applied ? r->snap_index : r->applied;
    if (r->last < r->commit)
        r->last = r->commit;
    r->role = MPX_FOLLOWER;
    mpx__reset_election(r);
    switch (mode) {
    case MPX_START_FRESH:
        mpx__persist_meta(r);
        break;
    case MPX_START_RESTORED:
        break;
    case MPX_START_EMPTY:
        mpx__recover_start(r);
        break;
    default:
        return FK_EINVAL;
    }
    return r->poisoned ? FK_EPOISONED : 0;
}

static int on_input(struct mpx *r, const struct cons_input *in)
{
    struct mpx_msg m;
    switch (in->kind) {
    case CONS_IN_TICK:
        mpx__tick(r);
        return 0;
    case CONS_IN_PERSISTED:
        if (in->cookie > r->next_cookie)
            return FK_EINVAL;
        if (in->cookie > r->durable)
            r->durable = in->cookie;
        mpx__release_held(r);
        return 0;
    case CONS_IN_MSG:
        if (mpx__decode(in->buf, in->len, &m, &r->scratch_op, r->cfg.batch_max) < 0)
            return FK_EMALFORMED;
        /* The claimed sender must match the transport's address. */
        if (in->from.kind == CONS_ADDR_REPLICA
                ? (m.from != in->from.id || m.from >= r->cfg.n || m.from == r->cfg.id)
                : m.type != MPX_REQUEST)
            return FK_EMALFORMED;
        mpx__dispatch(r, &m, &r->scratch_op, in);
        return 0;
    default:
        return FK_EINVAL;
    }
}

int mpx_step(struct mpx *r, const struct cons_input *in, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
    *out = &r->ob;
    if (r->poisoned)
        return FK_EPOISONED;
    if (!r->started || !in)
        return FK_EINVAL;
    if (now > r->now)
        r->now = now;
    maybe_compact(r);
    int rc = on_input(r, in);
    return r->poisoned ? FK_EPOISONED : rc;
}

int mpx_transfer(struct mpx *r, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
    *out = &r->ob;
    if (r->poisoned)
        return FK_EPOISONED;
    if (!r->started)
        return FK_EINVAL;
    if (now > r->now)
        r->now = now;
    mpx__transfer(r);
    return 0;
}

void mpx_invariants(const struct mpx *r)
{
    FK_ASSERT(r->applied <= r->commit);
    /* A recovering replica's log starts past its state until phase 3's
     * transfer brings the state (mpx_recover.c). */
    FK_ASSERT(r->snap_index <= r->applied || r->role == MPX_RECOVERING);
    FK_ASSERT(r->commit <= r->last || r->commit == r->snap_index);
    FK_ASSERT(r->durable <= r->next_cookie);
    FK_ASSERT(r->held_n <= MPX_HELD_MAX);
    FK_ASSERT(r->pend_n <= r->cfg.pending_max);
    /* The crash vector's own entry is this incarnation's generation; a
     * replica that has recovered never proposes at another's ballot. */
    FK_ASSERT(r->role == MPX_RECOVERING || r->known[r->cfg.id] == r->gen);
    /* Reconfiguration (mpx.h): a configuration is in force from its change
     * on; a leader is a member and proposes nothing past a change. */
    FK_ASSERT(r->conf.members != 0 && (r->conf.members >> r->cfg.n) == 0 &&
              r->quorum == (uint32_t)__builtin_popcountll(r->conf.members) / 2 + 1);
    FK_ASSERT(r->conf_slot <= r->applied || r->role == MPX_RECOVERING);
    if (r->role == MPX_LEADER) {
        FK_ASSERT((r->promised >> 8 & MPX_GEN_MASK) == (r->gen & MPX_GEN_MASK));
        FK_ASSERT(r->promised % 256 == r->cfg.id && r->leader == r->cfg.id);
        FK_ASSERT(r->next_index > r->commit && r->next_index <= r->snap_index + r->cfg.log_cap + 1);
        FK_ASSERT(mpx__member(r, r->cfg.id) && mpx__ballot_epoch(r->promised) == r->conf.epoch);
        if (r->stop_at) {
            const struct mpx_slot *s = mpx__cslot(r, r->stop_at);
            FK_ASSERT(r->stop_at > r->commit && r->next_index == r->stop_at + 1 && s &&
                      mpx__is_change(s));
        }
    } else {
        /* A leader that a change kept a member runs phase 1 again with
         * its queue (mpx__conf_changed). */
        FK_ASSERT(r->pend_n == 0 || r->role == MPX_CANDIDATE);
        FK_ASSERT(r->stop_at == 0);
    }
    for (uint64_t i = r->snap_index + 1; i <= r->commit; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        FK_ASSERT(s && s->chosen && s->nops >= 1);
    }
    /* Large values: every byte counted belongs to an op a slot holds
     * (none leaks when a slot empties), within the log's budget. */
    size_t big = 0, pend = 0;
    for (uint32_t k = 0; k < r->cfg.log_cap; k++) {
        const struct mpx_slot *s = &r->slots[k];
        FK_ASSERT(s->index == 0 || (s->index > r->snap_index && s->index <= r->last &&
                                    (s->index & (r->cfg.log_cap - 1)) == k));
        FK_ASSERT(s->index == 0 || s->nops <= r->cfg.batch_max);
        FK_ASSERT(r->role == MPX_LEADER || s->acks == 0 || s->chosen || s->index == 0);
        for (uint32_t j = 0; j < r->cfg.batch_max; j++) {
            FK_ASSERT(s->bigs[j].p == NULL ||
                      (s->index != 0 && j < s->nops && s->ops[j].ext == s->bigs[j].p));
            big += s->bigs[j].cap;
        }
    }
    for (uint32_t j = 0; j < r->cfg.pending_max; j++) {
        uint32_t age = (j + r->cfg.pending_max - r->pend_head) % r->cfg.pending_max;
        FK_ASSERT(r->pend_big[j].p == NULL || age < r->pend_n); /* queued ones only */
        pend += r->pend_big[j].cap;
    }
    FK_ASSERT(big == r->log_big.held && r->log_big.held <= r->log_big.max);
    FK_ASSERT(pend == r->pend_bigs.held && r->pend_bigs.held <= r->pend_bigs.max);
}

void mpx_status(const struct mpx *r, struct mpx_status *st)
{
    st->role = r->role;
    st->promised = r->promised;
    st->leader = r->leader;
    st->commit = r->commit;
    st->applied = r->applied;
    st->snap_index = r->snap_index;
    st->last = r->last;
    st->dropped = r->ob.dropped;
    st->conf = r->conf;
    st->conf_slot = r->conf_slot;
    st->xfer = cons_xfer_stats(&r->xfer);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL; /* FNV-1a */
    return h;
}

int mpx_chosen_hash(const struct mpx *r, uint64_t index, uint64_t *hash)
{
    const struct mpx_slot *s = mpx__cslot(r, index);
    if (!s || !s->chosen)
        return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint8_t k = 0; k < s->nops; k++) {
        const struct cons_op *op = &s->ops[k];
        h = hash_bytes(h, op, CONS_OP_HEAD);
        h = hash_bytes(h, cons_op_key(op), cons_op_nbytes(op));
    }
    *hash = h;
    return 1;
}
