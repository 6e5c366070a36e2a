/* nop.c: the NOPaxos replica: setup, state transfer, execution, timers and
 * the step dispatcher. Each protocol phase has its file, one handler per
 * message: normal operation over the OUM (section 5.2.1) in nop_normal.c,
 * gap agreement (5.2.2) in nop_gap.c, synchronization (5.2.4) in
 * nop_sync.c, view change and recovery (5.2.3, 5.3) in nop_view.c. */
#include "nop_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint32_t nop__leader_of(const struct nop *r, struct nop_view v)
{
    return v.leader_num % r->cfg.n;
}

int nop__is_leader(const struct nop *r)
{
    return r->status == NOP_NORMAL && nop__leader_of(r, r->view) == r->cfg.id;
}

/* The largest message: a full ring of entries (VIEW-CHANGE, START-VIEW,
 * RECOVERY-REPLY). */
static size_t whole_bytes(const struct nop_config *c)
{
    return (size_t)c->log_cap * (NOP_WIRE_OP_MAX + 1) + 4096;
}

static int config_ok(const struct nop_config *c)
{
    return c->n >= 3 && c->n <= CONS_REPLICAS_MAX && c->n % 2 == 1 && c->id < c->n &&
           c->log_cap >= 16 && c->log_cap <= CONS_LOG_CAP_MAX && c->clients_max >= 1 &&
           c->clients_max <= CONS_CLIENTS_MAX && whole_bytes(c) <= CONS_MSG_MAX &&
           c->xfer_chunk >= 1 && c->xfer_chunk <= (1u << 20) && c->xfer_window >= 1 &&
           c->xfer_window <= CONS_XFER_WINDOW_MAX && c->heartbeat_ns > 0 &&
           c->election_ns > 2 * c->heartbeat_ns && c->durable <= 1;
}

/* Memory, allocated here once:
 *   log        log_cap * sizeof(struct nop_entry)  (4,144 B each)
 *   exec_sig   log_cap * 8 B
 *   history    log_cap * 16 B (struct nop_hist); history_bytes of compacted entries
 *              (cons_hist.h: + 1/8) and one encoded entry
 *   OUM        NOP_OUM_BUF * sizeof(struct nop_oum) (1,024 * 4,152 B = 4.1 MiB)
 *   clients    2 * clients_max slots of 56 B (cons.h)
 *   transfer   struct cons_xfer: a view's cursors per peer, ~60 KiB
 *   arena      max(arena_bytes, whole_bytes() + 64 KiB, xfer_window chunks + 64 KiB):
 *              room for the largest message (VIEW-CHANGE, START-VIEW, RECOVERY-REPLY:
 *              a full ring) or a window of transfer chunks;
 *              START-VIEWs to other replicas that do not fit one step are dropped like
 *              lost messages and resent when those replicas repeat their VIEW-CHANGE
 *   durable    (durable mode only) a held-message ring as large as the arena, and
 *              NOP_HELD_MAX descriptors of 40 B (nop_durable.c)
 * e.g. log_cap 256, 16 clients: 1.1 + 4.1 + 0.06 + 1.2 MiB. */
static int alloc_all(struct nop *r)
{
    const struct nop_config *c = &r->cfg;
    /* Not zeroed: only slots below log_len are ever read, and pages that
     * are never written stay unmapped. */
    r->log = malloc((size_t)c->log_cap * sizeof *r->log);
    /* Zeroed: nop_restore_entry marks restored slots here (nop_disk.c). */
    r->exec_sig = calloc(c->log_cap, sizeof *r->exec_sig);
    /* Zeroed: slot 0 is never a committed slot of the history. */
    r->hist = calloc(c->log_cap, sizeof *r->hist);
    if (cons_hist_init(&r->past, c->history_bytes) < 0)
        return FK_ENOMEM;
    if (c->history_bytes && !(r->past_scratch = malloc(NOP_WIRE_OP_MAX + 1)))
        return FK_ENOMEM;
    r->oum = calloc(NOP_OUM_BUF, sizeof *r->oum);
    size_t whole = whole_bytes(c);
    size_t arena = c->arena_bytes;
    size_t xfer = (size_t)c->xfer_window * (c->xfer_chunk + CONS_SNAP_RECORD_MAX + 64);
    if (arena < whole + (64u << 10))
        arena = whole + (64u << 10);
    if (arena < xfer + (64u << 10))
        arena = xfer + (64u << 10);
    r->ob.arena = malloc(arena);
    r->ob.arena_cap = arena;
    if (c->durable) {
        r->held = calloc(NOP_HELD_MAX, sizeof *r->held);
        r->held_cap = arena;
        r->held_buf = malloc(arena);
        if (!r->held || !r->held_buf)
            return FK_ENOMEM;
    }
    r->reply.data = malloc(CONS_REPLY_MAX); /* touched only as far as results go */
    r->reply.cap = CONS_REPLY_MAX;
    if (!r->log || !r->exec_sig || !r->hist || !r->oum || !r->ob.arena || !r->reply.data)
        return FK_ENOMEM;
    int rc = nop__undo_init(r);
    return rc < 0 ? rc : cons_ctab_init(&r->ctab, c->clients_max);
}

/* cons_xfer's messages travel as NOP_XFER, a kind byte before their body. */
static void xfer_begin(void *ctx, struct cons_wbuf *w, uint8_t kind)
{
    struct nop *r = ctx;
    nop__begin(r, w, NOP_XFER, nop__pack(r->view));
    cons_w_u8(w, kind);
}

static void xfer_send(void *ctx, struct cons_wbuf *w, uint32_t to)
{
    nop__send(ctx, w, cons_replica(to));
}

static int xfer_init(struct nop *r)
{
    const struct nop_config *c = &r->cfg;
    struct cons_xfer_config xc = {.n = c->n,
                                  .id = c->id,
                                  .chunk = c->xfer_chunk,
                                  .window = c->xfer_window,
                                  .retry_ns = c->heartbeat_ns * 4,
                                  .switch_ns = c->election_ns * 2};
    struct cons_xfer_io io = {.ctx = r, .begin = xfer_begin, .send = xfer_send};
    return cons_xfer_init(&r->xfer, &xc, r->sm, io, c->seed * 31 + c->id);
}

/* Moves snap to `upto` (committed, in the log): the slots it compacts go
 * into the history first. */
void nop__compact_to(struct nop *r, uint64_t upto)
{
    FK_ASSERT(upto >= r->snap && upto <= r->commit && upto <= r->log_len);
    for (uint64_t i = r->snap + 1; i <= upto; i++) {
        struct nop_hist *h = &r->hist[(i - 1) % r->cfg.log_cap];
        const struct nop_entry *e = nop__ent(r, i);
        h->slot = i;
        h->hash = nop__entry_hash(e);
        if (r->past_scratch) {
            struct cons_wbuf w;
            cons_wbuf_init(&w, r->past_scratch, NOP_WIRE_OP_MAX + 1);
            nop__put_one(&w, e);
            FK_ASSERT(!w.err);
            cons_hist_add(&r->past, i, w.p, (uint32_t)w.len);
        }
    }
    r->snap = upto;
}

int nop__hist_hash(const struct nop *r, uint64_t slot, uint64_t *hash)
{
    const struct nop_hist *h = &r->hist[(slot - 1) % r->cfg.log_cap];
    if (slot == 0 || slot > r->snap || h->slot != slot)
        return 0;
    *hash = h->hash;
    return 1;
}

int nop__hist_entry(const struct nop *r, uint64_t slot)
{
    uint64_t h;
    return slot + r->cfg.log_cap > r->log_len && nop__hist_hash(r, slot, &h) &&
           nop__entry_hash(nop__ent(r, slot)) == h;
}

void nop__reset_state(struct nop *r)
{
    uint64_t index;
    cons_xfer_stop(&r->xfer); /* its staging goes with the install below */
    if (cons_sm_empty(&r->sm) < 0 || cons_sm_load(&r->sm, &r->ctab, &index) < 0) {
        r->poisoned = 1; /* storage (cons.h's failure rule) */
        return;
    }
    FK_ASSERT(index == 0);
    r->executed = r->marked = 0;
    r->resets++;
    nop__undo_clear(r);
}

/* Whether this replica's log holds slots (commit, index] exactly as the
 * sender's committed history (m's hashes) does: then they are committed
 * here too. */
int nop__confirmed(const struct nop *r, uint64_t index, const struct nop_msg *m)
{
    if (index > r->log_len)
        return 0;
    for (uint64_t s = r->commit + 1; s <= index; s++) {
        if (s < m->hlo || s >= m->hlo + m->hn)
            return 0;
        struct cons_rbuf rd = m->hashes;
        rd.off += (size_t)(s - m->hlo) * 8;
        if (cons_r_u64(&rd) != nop__entry_hash(nop__ent(r, s)))
            return 0;
    }
    return 1;
}

void nop__restart_ring(struct nop *r, uint64_t index, int keep_tail, const struct nop_msg *m)
{
    FK_ASSERT(index > r->snap);
    if (index <= r->commit || nop__confirmed(r, index, m)) {
        /* Committed: identical everywhere, so this replica's own slots up
         * to index will do. */
        if (r->commit < index)
            r->commit = index;
        if (r->synced < index)
            r->synced = index;
        nop__execute_to(r, index, 0);
        if (r->executed >= index && !r->poisoned) {
            nop__compact_to(r, index);
            if (!keep_tail || r->log_len > index + r->cfg.log_cap)
                r->log_len = r->synced = index;
            return;
        }
    }
    if (r->executed > r->commit)
        nop__rollback(r, r->commit); /* speculative: what it executed may be gone */
    r->snap = index;
    if (!keep_tail || r->log_len < index || r->log_len > index + r->cfg.log_cap)
        r->log_len = index;
    if (r->synced < index || r->synced > r->log_len)
        r->synced = index;
    if (r->commit < index)
        r->commit = index;
    nop__touch(r, r->log_len + 1); /* the log may have been cut: rewrite what follows */
}

/* A transfer brought the state at `index` (>= the snap it was asked
 * for, unless the ring moved since): the table and mark come from the
 * machine, and the ring restarts after index when index passed it. */
static void took_state(struct nop *r, uint64_t index)
{
    uint64_t applied, was = r->commit, len_was = r->log_len;
    if (cons_sm_load(&r->sm, &r->ctab, &applied) < 0 || applied != index) {
        r->poisoned = 1;
        return;
    }
    r->executed = r->marked = index;
    nop__undo_clear(r);
    if (index > r->snap) {
        /* The slots up to index are in the machine: hashes only for
         * those this replica had committed (the rest may differ). */
        uint64_t c = r->commit < index ? r->commit : index;
        if (c > r->snap && c <= r->log_len)
            nop__compact_to(r, c);
        r->snap = index;
        if (r->log_len < index || r->log_len > index + r->cfg.log_cap) {
            r->log_len = index;
            /* A gap it waited for, or (a leader of a view that ended
             * without it knowing) one it was agreeing on, is inside the
             * state now. */
            r->find_slot = r->gap_slot = 0;
            nop__oum_clear(r);
        }
        if (r->synced < index || r->synced > r->log_len)
            r->synced = index;
        if (r->commit < index)
            r->commit = index;
        nop__touch(r, r->log_len + 1);
    }
    for (uint64_t i = r->snap + 1; i <= r->executed; i++)
        *nop__sig(r, i) = nop__entry_hash(nop__ent(r, i));
    if (nop__is_leader(r) && index > was && len_was > was) {
        /* Synchronization commits a prefix of the leader's own log that
         * f+1 replicas hold as it does (section 5.2.4), and within a view
         * that log only grows. This state replaced slots (was, index] of
         * this leader's log that it had not committed, with entries it
         * never compared (committed elsewhere: in a newer view that
         * superseded this one without its knowing, or passed on by a
         * replica that took them from there), while its followers' synced
         * prefixes still hold the entries it had: a SYNC carrying the new
         * commit point would have them commit those. No message of this
         * view can take those prefixes back (a reply to an earlier sync
         * may still report them); a view change (5.2.3) gives the group
         * one log again. */
        FK_ASSERT(r->commit >= index && r->snap == index);
        struct nop_view v = {r->view.leader_num + 1, r->view.session};
        nop__start_view_change(r, v);
        FK_ASSERT(!nop__is_leader(r));
    }
    if (nop__is_leader(r))
        nop__execute_to(r, r->log_len, 1);
    else
        nop__execute_to(r, r->commit, 0);
}

/* Fetches a state when the machine is behind the ring (nop.h, "State"),
 * from the view's leader first (cons_xfer moves on to the others). */
void nop__maybe_fetch(struct nop *r)
{
    if (!nop__needs_state(r) || r->status != NOP_NORMAL || cons_xfer_active(&r->xfer) ||
        r->poisoned)
        return;
    /* A follower first: its machine holds committed state only, so it
     * serves at once (a leader holds its view until the commit point
     * passes it). cons_xfer moves on from there. */
    uint32_t from = (r->cfg.id + 1) % r->cfg.n;
    if (from == nop__leader_of(r, r->view))
        from = (from + 1) % r->cfg.n;
    if (from == r->cfg.id)
        from = (from + 1) % r->cfg.n;
    if (cons_xfer_start(&r->xfer, from, r->snap, r->now) < 0)
        r->poisoned = 1;
}

/* The most a transfer from this replica may show: its committed prefix,
 * when its machine holds committed state (cons_xfer.h, held views). */
static uint64_t serve_bound(const struct nop *r)
{
    if (r->status == NOP_RECOVERING || nop__needs_state(r))
        return CONS_XFER_SERVE_NONE;
    return r->commit;
}

/* A leader serves a view once its index is committed, and its machine
 * runs ahead of the commit point (speculative execution, section 5.2.1),
 * so a view it opens is usually held until the commit point passes it.
 * That can wait forever: followers whose machines are behind their rings
 * (fetching a state) cannot log past their rings either, and when the
 * leader's log is past theirs the commit point stops short of the held
 * view, while nobody else has a state to serve (simulator seed
 * 246867850701677). So a leader asked for a state while it holds a view
 * rolls its machine back to the commit point (undo records, as for a new
 * view's log) and executes only committed slots until a view within the
 * commit point is being sent: the next request opens one (flowkv-server:
 * once the rollback's write transaction committed). Then it executes its
 * log again and answers those clients again (the same results: the same
 * entries on the same state; clients drop answers they already have).
 * The hold ends at a view change too, or after a sender switch without
 * a request (the receiver went elsewhere). */
static void hold_for_transfer(struct nop *r)
{
    if (!nop__is_leader(r) || r->status != NOP_NORMAL || nop__commit_only(r) ||
        !cons_xfer_holds(&r->xfer, r->commit))
        return;
    cons_xfer_close_above(&r->xfer, r->commit);
    r->holds += !r->serve_hold;
    r->serve_hold = 1;
    r->hold_since = r->now;
    nop__rollback(r, r->commit);
}

static void end_hold(struct nop *r)
{
    if (!r->serve_hold)
        return;
    int leading = nop__is_leader(r) && r->status == NOP_NORMAL;
    if (leading && !cons_xfer_sends(&r->xfer, r->commit) &&
        r->now - r->hold_since < r->xfer.cfg.switch_ns)
        return;
    r->serve_hold = 0;
    if (leading)
        nop__execute_to(r, r->log_len, 1);
}

static void on_xfer(struct nop *r, const struct nop_msg *m)
{
    uint64_t index;
    int rc = cons_xfer_on_msg(&r->xfer, m->body[0], m->from, m->body + 1, m->body_len - 1,
                              serve_bound(r), r->now, &index);
    if (rc < 0)
        r->poisoned = 1; /* storage: cons.h's failure rule */
    else if (rc == 1)
        took_state(r, index);
    else if (m->body[0] == CONS_XFER_REQ)
        hold_for_transfer(r);
}

int nop__fits(const struct nop *r, uint64_t slot)
{
    return slot > r->snap && slot <= r->snap + r->cfg.log_cap;
}

struct nop *nop_create(const struct nop_config *cfg, struct cons_sm sm, int *err)
{
    *err = FK_EINVAL;
    if (!cfg || !config_ok(cfg) || !sm.ops)
        return NULL;
    struct nop *r = calloc(1, sizeof *r);
    *err = FK_ENOMEM;
    if (!r)
        return NULL;
    r->cfg = *cfg;
    r->sm = sm;
    r->f = cfg->n / 2;
    r->rng = cfg->seed * 0x9E3779B97F4A7C15ULL + cfg->id + 1;
    r->dirty_lo = 1;
    if ((*err = alloc_all(r)) < 0 || (*err = xfer_init(r)) < 0) {
        nop_destroy(r);
        return NULL;
    }
    *err = 0;
    return r;
}

void nop_destroy(struct nop *r)
{
    if (!r)
        return;
    if (r->xfer.sm.ops)
        cons_xfer_close(&r->xfer);
    cons_ctab_free(&r->ctab);
    free(r->log);
    free(r->exec_sig);
    free(r->hist);
    cons_hist_free(&r->past);
    free(r->past_scratch);
    free(r->oum);
    free(r->reply.data);
    nop__undo_free(r);
    free(r->ob.arena);
    free(r->held);
    free(r->held_buf);
    free(r);
}

/* ---- execution ------------------------------------------------------------- */

/* XXH3 over the op's header and used bytes, chained through the seed. It
 * runs for every entry at every replica (execution, synchronization, the
 * history); the byte-wise FNV-1a it replaced was 3% of a NOPaxos
 * cluster's CPU under YCSB. */
uint64_t nop__entry_hash(const struct nop_entry *e)
{
    if (e->kind != NOP_ENT_REQ)
        return XXH3_64bits_withSeed(NULL, 0, e->kind);
    const struct cons_op *op = &e->op;
    uint64_t h = XXH3_64bits_withSeed(op, CONS_OP_HEAD, e->kind);
    return XXH3_64bits_withSeed(cons_op_key(op), cons_op_nbytes(op), h);
}

/* Executes log slots up to `upto` in order; the leader (reply != 0) answers
 * each client with the result. A follower logs reads without executing
 * them (cons_log_read): in the paper only the leader executes in normal
 * operation (section 5.2.1), and a read changes no state, so the
 * follower's state is the same and its client table moves alike; writes
 * it executes once committed, to be ready to lead and to serve a state.
 * (Executing every read at every replica was 11% of a NOPaxos replica's
 * CPU under YCSB-B.) A machine behind the ring executes nothing: it waits
 * for a state (nop__needs_state). The machine's mark follows at the end of
 * the step (nop__mark). */
void nop__execute_to(struct nop *r, uint64_t upto, int reply)
{
    FK_ASSERT(upto <= r->log_len);
    if (nop__needs_state(r))
        return;
    if ((nop__commit_only(r) || r->serve_hold) && upto > r->commit)
        upto = r->commit; /* durable mode executes only what is committed (nop.h) */
    int follower = !nop__is_leader(r);
    FK_ASSERT(!(follower && reply));
    while (r->executed < upto && !r->poisoned) {
        const struct nop_entry *e = nop__ent(r, r->executed + 1);
        FK_ASSERT(e->kind == NOP_ENT_REQ || e->kind == NOP_ENT_NOOP);
        if (r->executed + 1 > r->commit && nop__undo_capture(r, r->executed + 1, e) < 0) {
            r->poisoned = 1;
            return;
        }
        if (e->kind == NOP_ENT_REQ && follower && cons_op_reads(&e->op)) {
            if (cons_log_read(&r->sm, &r->ctab, &e->op) < 0) {
                r->poisoned = 1; /* the machine could not keep the row */
                return;
            }
        } else if (e->kind == NOP_ENT_REQ) {
            /* No reconfiguration in NOPaxos yet (cons.h, CONS_OP_CONFIG). */
            int rc = e->op.type == CONS_OP_CONFIG
                         ? cons_apply_core(&r->sm, &r->ctab, &e->op, FK_ENOTSUP, &r->reply)
                         : cons_apply_once(&r->sm, &r->ctab, &e->op, &r->reply);
            if (rc < 0) {
                r->poisoned = 1;
                return;
            }
            if (reply && rc <= 1)
                nop__reply(r, r->executed + 1, 1, &r->reply);
        }
        *nop__sig(r, r->executed + 1) = nop__entry_hash(e);
        r->executed++;
    }
}

/* Rollback: the machine executed speculatively (as a leader, section
 * 5.2.1) entries that the log no longer holds: undo them (nop_undo.c);
 * callers re-execute. Only where the undo records do not reach (an
 * earlier incarnation's executions) is the machine emptied and a state
 * fetched (nop.h, "State"). */
void nop__rollback(struct nop *r, uint64_t target)
{
    if (target >= r->executed || nop__needs_state(r) || nop__commit_only(r))
        return; /* durable mode executes only committed slots: nothing to undo */
    if ((r->cfg.bugs & NOP_BUG_FOLLOWER_EXEC) && !nop__is_leader(r))
        return; /* planted bug: a follower keeps what it executed uncommitted */
    /* A view a sender holds past target shows executions that are being
     * undone (its index may already be committed: the new view's commit
     * point, with other entries at those slots). */
    cons_xfer_close_above(&r->xfer, target);
    int rc = nop__undo_to(r, target);
    if (rc == FK_EINVAL)
        nop__reset_state(r);
}

void nop__check_executed(struct nop *r)
{
    if (nop__needs_state(r) || nop__commit_only(r))
        return; /* durable mode executes only committed slots */
    for (uint64_t i = r->snap + 1; i <= r->executed; i++) {
        if (i > r->log_len || nop__entry_hash(nop__ent(r, i)) != *nop__sig(r, i)) {
            nop__rollback(r, i - 1);
            return;
        }
    }
}

uint64_t nop__quorum_point(const struct nop *r, uint64_t mine, const uint64_t *theirs)
{
    uint64_t v[CONS_REPLICAS_MAX] = {0};
    uint32_t n = 0;
    for (uint32_t p = 0; p < r->cfg.n; p++)
        v[n++] = p == r->cfg.id ? mine : theirs[p];
    for (uint32_t a = 0; a < n; a++) { /* sort descending; n <= 7 */
        for (uint32_t b = a + 1; b < n; b++) {
            if (v[b] > v[a]) {
                uint64_t t = v[a];
                v[a] = v[b];
                v[b] = t;
            }
        }
    }
    return v[r->f];
}

/* The slot f+1 replicas have executed, as far as this leader heard in
 * its view (itself included): compacting no further keeps every state a
 * replica may need (a replica behind the ring fetches one at or past
 * snap) on f+1 replicas, so that f losing theirs leave one to serve. A
 * follower that lags in execution holds the leader back (the ring fills,
 * nop__drain stops taking requests) instead of needing a state. */
uint64_t nop__leader_safe(const struct nop *r)
{
    return nop__quorum_point(r, r->executed, r->exec_of);
}

/* Log compaction: the machine holds the state at `executed`, so
 * compacting is only moving snap (the slots go into the history); nothing
 * is copied. Once half the ring is used, the committed and executed
 * prefix goes, keeping the last quarter ring so that a replica a little
 * behind still finds its entries (a view change, a sync) instead of
 * needing a state. The leader stops taking requests three quarters of a
 * ring past snap (nop__drain) until the commit point lets it compact. */
uint64_t nop__leader_stop_gap(const struct nop *r)
{
    return r->cfg.log_cap / 4 * 3;
}

int nop__maybe_compact(struct nop *r)
{
    if (r->status != NOP_NORMAL || nop__needs_state(r) || r->log_len - r->snap < r->cfg.log_cap / 2)
        return 0;
    uint64_t to = r->log_len - r->cfg.log_cap / 4;
    uint64_t safe = nop__is_leader(r) ? nop__leader_safe(r) : r->safe;
    if (to > safe)
        to = safe;
    if (to > r->commit)
        to = r->commit;
    if (to > r->executed)
        to = r->executed;
    if (to <= r->snap)
        return 0;
    nop__compact_to(r, to);
    return 1;
}

/* Durable mode (and a leader's serve hold): the leader executes (and
 * answers) once the commit point passed a slot, at the end of the step
 * that moved it. */
static void execute_committed(struct nop *r)
{
    if ((nop__commit_only(r) || r->serve_hold) && r->status == NOP_NORMAL)
        nop__execute_to(r, r->commit, nop__is_leader(r));
}

/* The machine's mark follows what executed, once per step (cons.h: a
 * step's writes reach the disk together, so only its last mark counts). */
static void nop__mark(struct nop *r)
{
    if (r->executed == r->marked || r->poisoned)
        return;
    if (r->sm.ops->mark(r->sm.impl, r->executed, r->ctab.ops) < 0) {
        r->poisoned = 1;
        return;
    }
    r->marked = r->executed;
}

/* ---- timers and dispatch ------------------------------------------------------- */

static void tick(struct nop *r)
{
    if (cons_xfer_tick(&r->xfer, r->now) < 0) {
        r->poisoned = 1;
        return;
    }
    if (r->status == NOP_RECOVERING) {
        nop__recover_tick(r);
        return;
    }
    if (r->status == NOP_VIEWCHANGE) {
        nop__vc_tick(r);
        return;
    }
    if (nop__is_leader(r)) {
        if (r->now >= r->next_sync) {
            r->next_sync = r->now + r->cfg.heartbeat_ns;
            for (uint32_t p = 0; p < r->cfg.n; p++) {
                if (p == r->cfg.id)
                    continue;
                if (r->acked[p] == r->hb_acked[p] && r->acked[p] < r->log_len)
                    r->need_full[p] = 1; /* stuck on hashes: send entries */
                r->hb_acked[p] = r->acked[p];
                nop__send_sync(r, p, 1);
            }
            if (r->gap_slot)
                nop__send_gap_commits(r);
        }
        return;
    }
    if (r->now - r->last_heard >= r->cfg.election_ns) {
        struct nop_view v = {r->view.leader_num + 1, r->view.session};
        nop__start_view_change(r, v); /* the leader went quiet */
        return;
    }
    if (r->find_slot && r->now - r->find_sent >= r->cfg.heartbeat_ns) {
        r->find_sent = r->now;
        nop__send_u64(r, nop__leader_of(r, r->view), NOP_GAP_FIND, r->find_slot);
    }
}

static int newer(struct nop_view a, struct nop_view b)
{
    return a.leader_num > b.leader_num || a.session > b.session;
}

static void on_replica_msg(struct nop *r, const struct nop_msg *m)
{
    struct nop_view v = nop__unpack(m->term);
    if (m->type == NOP_XFER) {
        on_xfer(r, m); /* committed state: the same in every view */
        return;
    }
    if (r->status == NOP_RECOVERING) {
        if (m->type == NOP_RECOVERY_REP)
            nop__on_recovery_rep(r, m);
        return;
    }
    switch (m->type) {
    case NOP_VC_REQ:
        nop__on_vc_req(r, m);
        return;
    case NOP_VC:
        nop__on_vc(r, m);
        return;
    case NOP_START_VIEW:
        nop__on_start_view(r, m);
        return;
    case NOP_RECOVERY:
        nop__on_recovery(r, m);
        return;
    default:
        break;
    }
    if (newer(v, r->view)) {
        /* A view started without us: join it (its leader resends START-VIEW). */
        struct nop_view mx = {v.leader_num > r->view.leader_num ? v.leader_num : r->view.leader_num,
                              v.session > r->view.session ? v.session : r->view.session};
        nop__start_view_change(r, mx);
        return;
    }
    if (!nop__view_eq(v, r->view) || r->status != NOP_NORMAL)
        return;
    int from_leader = m->from == nop__leader_of(r, r->view);
    switch (m->type) {
    case NOP_GAP_FIND:
        nop__on_gap_find(r, m);
        break;
    case NOP_GAP_RECV:
        if (from_leader)
            nop__on_gap_recv(r, m);
        break;
    case NOP_GAP_COMMIT:
        if (from_leader)
            nop__on_gap_commit(r, m);
        break;
    case NOP_GAP_COMMIT_REP:
        nop__on_gap_commit_rep(r, m);
        break;
    case NOP_SYNC:
        if (from_leader)
            nop__on_sync(r, m);
        break;
    case NOP_STATE:
        if (from_leader)
            nop__on_state(r, m);
        break;
    case NOP_SYNC_SIG:
        if (from_leader)
            nop__on_sync_sig(r, m);
        break;
    case NOP_SYNC_REP:
        nop__on_sync_rep(r, m);
        break;
    default:
        break; /* RECOVERY_REP to a replica that is not recovering */
    }
}

/* What every call does last: a durable leader's answers, a state to
 * fetch or to release, the machine's stash and mark, the persists of the
 * step, and (durable mode) the messages that wait for them. */
static int end_of_step(struct nop *r)
{
    execute_committed(r);
    nop__maybe_fetch(r);
    if (serve_bound(r) != CONS_XFER_SERVE_NONE)
        cons_xfer_release(&r->xfer, serve_bound(r));
    end_hold(r);
    nop__persist(r);
    nop__hold(r);
    return r->poisoned ? FK_EPOISONED : 0;
}

int nop_start(struct nop *r, enum nop_start_mode mode, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
    *out = &r->ob;
    if (r->started ||
        (mode != NOP_START_FRESH && mode != NOP_START_EMPTY && mode != NOP_START_RESTORED) ||
        (mode == NOP_START_RESTORED && !r->meta_seen))
        return FK_EINVAL;
    r->started = 1;
    r->now = r->last_heard = now;
    int rc = 0;
    if (mode == NOP_START_FRESH)
        r->status = NOP_NORMAL;
    else if (mode == NOP_START_RESTORED)
        rc = nop__start_restored(r);
    else
        nop__recover_start(r);
    if (rc < 0) {
        r->poisoned = 1; /* the handle must be destroyed (nop.h) */
        cons_outbox_reset(&r->ob);
        return rc;
    }
    rc = end_of_step(r);
    return rc < 0 ? rc : nop_seal(r);
}

int nop_seal(struct nop *r)
{
    nop__stash_sync(r);
    nop__mark(r);
    r->sealed = 1;
    return r->poisoned ? FK_EPOISONED : 0;
}

int nop_step(struct nop *r, const struct cons_input *in, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
    r->sealed = 0;
    *out = &r->ob;
    if (r->poisoned)
        return FK_EPOISONED;
    if (!r->started || !in)
        return FK_EINVAL;
    if (now > r->now)
        r->now = now;
    struct nop_msg m;
    switch (in->kind) {
    case CONS_IN_TICK:
        tick(r);
        break;
    case CONS_IN_MSG:
        if (nop__decode(in->buf, in->len, &m, &r->scratch_op) < 0)
            return FK_EMALFORMED;
        if (m.type == NOP_OUM_REQ || m.type == NOP_OUM_DROP || m.type == NOP_OUM_FILL) {
            if (in->from.kind != CONS_ADDR_OUM)
                return FK_EMALFORMED;
            nop__on_oum(r, &m, &r->scratch_op);
        } else {
            if (in->from.kind != CONS_ADDR_REPLICA || m.from != in->from.id || m.from >= r->cfg.n ||
                m.from == r->cfg.id)
                return FK_EMALFORMED;
            on_replica_msg(r, &m);
        }
        break;
    case CONS_IN_PERSISTED:
        /* Nothing waits for durability in the default mode (nop_disk.c);
         * durable mode releases held messages (nop_durable.c). */
        if (in->cookie > r->next_cookie)
            return FK_EINVAL;
        if (in->cookie > r->durable)
            r->durable = in->cookie;
        break;
    default:
        return FK_EINVAL;
    }
    /* What this step committed reaches the disk before compaction moves
     * past it, so the disk's log still leads from its trim point
     * (nop_disk.c). */
    nop__persist_entries(r);
    /* A leader paused at its stop gap (nop__drain) resumes as soon as
     * compaction freed the ring, not at the next message. */
    if (nop__maybe_compact(r) && nop__is_leader(r))
        nop__drain(r);
    nop__sync_eager(r);
    return end_of_step(r);
}

int nop_transfer(struct nop *r, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
    r->sealed = 0;
    *out = &r->ob;
    if (r->poisoned)
        return FK_EPOISONED;
    if (!r->started)
        return FK_EINVAL;
    if (now > r->now)
        r->now = now;
    /* The next view, led by the next replica: the followers start it now
     * instead of after a view-change timeout of silence (section 5.2.3:
     * any replica may ask for a view change; this one asks for its own
     * succession). */
    if (r->status == NOP_NORMAL && nop__is_leader(r)) {
        struct nop_view v = {.leader_num = r->view.leader_num + 1, .session = r->view.session};
        nop__start_view_change(r, v);
    }
    return end_of_step(r);
}

static int skip_row(void *arg, const struct cons_session *s)
{
    (void)arg;
    (void)s;
    return 0;
}

void nop_invariants(const struct nop *r)
{
    FK_ASSERT(r->executed <= r->log_len && r->log_len <= r->snap + r->cfg.log_cap);
    FK_ASSERT(!r->sealed || r->marked == r->executed || r->poisoned);
    /* After a seal, the machine's mark is this replica's executed slot
     * and table clock (nop__mark). */
    if (r->sealed && r->marked == r->executed && !r->poisoned) {
        uint64_t applied, clock;
        struct nop *w = (struct nop *)r; /* load reads only */
        int lrc = w->sm.ops->load(w->sm.impl, &applied, &clock, skip_row, NULL);
        FK_ASSERT(lrc != 0 || (applied == r->executed && clock == r->ctab.ops));
        (void)lrc;
        (void)applied;
        (void)clock;
    }
    FK_ASSERT(r->durable <= r->next_cookie && r->pers_snap <= r->pers_upto);
    FK_ASSERT(r->held_n <= NOP_HELD_MAX && (r->held_n == 0 || r->cfg.durable));
    if (r->held_n) /* FIFO: released in cookie order */
        FK_ASSERT(r->held[r->held_head].cookie <=
                  r->held[(r->held_head + r->held_n - 1) % NOP_HELD_MAX].cookie);
    FK_ASSERT(!r->cfg.durable || r->status == NOP_RECOVERING || !r->pers_done ||
              r->dirty_lo > r->log_len);
    FK_ASSERT(r->status == NOP_RECOVERING || (r->snap <= r->commit && r->commit <= r->log_len));
    FK_ASSERT(r->synced <= r->log_len || r->status != NOP_NORMAL);
    FK_ASSERT(r->gap_slot == 0 || (nop__is_leader(r) && r->gap_slot == r->log_len));
    FK_ASSERT(r->find_slot == 0 || (!nop__is_leader(r) && r->find_slot == r->log_len + 1));
    if (nop__is_leader(r) && !nop__commit_only(r))
        FK_ASSERT(r->executed == r->log_len || nop__needs_state(r) ||
                  (r->serve_hold && r->executed == r->commit));
    for (uint64_t i = r->snap + 1; i <= r->log_len; i++)
        FK_ASSERT(nop__ent(r, i)->kind == NOP_ENT_REQ || nop__ent(r, i)->kind == NOP_ENT_NOOP);
    /* The newest executed entries still hold what was executed (the whole
     * suffix is re-checked on every view entry, nop__check_executed). */
    uint64_t from = r->executed > r->snap + 8 ? r->executed - 8 : r->snap + 1;
    for (uint64_t i = from; i <= r->executed && r->status == NOP_NORMAL && !nop__commit_only(r);
         i++)
        FK_ASSERT(*nop__sig(r, i) == nop__entry_hash(nop__ent(r, i)) ||
                  (r->cfg.bugs & NOP_BUG_FOLLOWER_EXEC));
}

void nop_status(const struct nop *r, struct nop_stat *st)
{
    st->status = r->status;
    st->view = r->view;
    st->leader = r->view.leader_num % r->cfg.n;
    st->n = r->cfg.n;
    st->log_len = r->log_len;
    st->commit = r->commit;
    st->executed = r->executed;
    st->is_leader = nop__is_leader(r);
    st->held = r->held_n;
    st->held_dropped = r->held_dropped;
    memcpy(st->syncs, r->syncs, sizeof st->syncs);
    st->stalls = r->stalls;
    st->holds = r->holds;
    st->gap_noops = r->gap_noops;
    st->needs_state = nop__needs_state(r);
    st->resets = r->resets;
    st->undone = r->undone;
    st->xfer = cons_xfer_stats(&r->xfer);
}

int nop_describe(const struct nop *r, char *buf, size_t cap)
{
    static const char *const st[] = {"?", "normal", "view-change", "recovering"};
    int n = snprintf(buf, cap,
                     "%s view %u.%u%s log %" PRIu64 " commit %" PRIu64 " executed %" PRIu64
                     " synced %" PRIu64 " snap %" PRIu64 " sess_start %" PRIu64 " oum_next %" PRIu64
                     " gap %" PRIu64 " find %" PRIu64 " fetching %d"
                     " stalled %d held %u durable %" PRIu64 "/%" PRIu64 " overflows %" PRIu64,
                     st[r->status <= NOP_RECOVERING ? r->status : 0], r->view.leader_num,
                     r->view.session, nop__is_leader(r) ? " leader" : "", r->log_len, r->commit,
                     r->executed, r->synced, r->snap, r->sess_start, nop__expected(r), r->gap_slot,
                     r->find_slot, cons_xfer_active(&r->xfer), r->stalled, r->held_n, r->durable,
                     r->next_cookie, r->oum_overflows);
    for (uint32_t p = 0; nop__is_leader(r) && p < r->cfg.n && n >= 0 && (size_t)n < cap; p++) {
        if (p != r->cfg.id)
            n += snprintf(buf + n, cap - (size_t)n, " r%u acked %" PRIu64 "%s%s", p, r->acked[p],
                          r->sync_out[p] ? " out" : "", r->need_full[p] ? " full" : "");
    }
    return n;
}

uint64_t nop_oum_intake(const struct nop *r, uint32_t *session)
{
    uint64_t want = nop__expected(r);
    *session = r->view.session;
    return r->status == NOP_NORMAL && want && !nop__needs_state(r) ? want + NOP_OUM_BUF - 1 : 0;
}

int nop_committed_hash(const struct nop *r, uint64_t index, uint64_t *hash)
{
    if (index <= r->snap || index > r->commit || index > r->log_len || r->status == NOP_RECOVERING)
        return 0;
    *hash = nop__entry_hash(nop__ent(r, index));
    return 1;
}
