/* nop.c: the NOPaxos replica: setup, execution, normal operation over the
 * OUM (section 5.2.1), gap agreement (5.2.2), synchronization (5.2.4) and
 * the step dispatcher. View change and recovery are in nop_view.c. */
#include "nop_internal.h"

#include "fk_error.h"

#include <assert.h>
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

/* Bytes of a checkpoint: u64 index, u32 + client table, u32 + snapshot. */
static size_t cp_bytes(const struct nop_config *c)
{
    return 16 + 4 + CONS_CTAB_SAVE_MAX(c->clients_max) + c->snapshot_max;
}

/* The largest message: a checkpoint and a full ring of entries. */
static size_t whole_bytes(const struct nop_config *c)
{
    return (size_t)c->log_cap * (NOP_WIRE_OP_MAX + 1) + cp_bytes(c) + 4096;
}

static int config_ok(const struct nop_config *c)
{
    return c->n >= 3 && c->n <= CONS_REPLICAS_MAX && c->n % 2 == 1 && c->id < c->n &&
           c->log_cap >= 16 && c->log_cap <= CONS_LOG_CAP_MAX && c->clients_max >= 1 &&
           c->clients_max <= CONS_CLIENTS_MAX && c->snapshot_max >= 8 &&
           c->snapshot_max <= CONS_MSG_MAX && whole_bytes(c) <= CONS_MSG_MAX &&
           c->heartbeat_ns > 0 && c->election_ns > 2 * c->heartbeat_ns && c->durable <= 1;
}

/* Memory, allocated here once:
 *   log        log_cap * sizeof(struct nop_entry)  (4,144 B each)
 *   exec_sig   log_cap * 8 B
 *   history    log_cap * 16 B (struct nop_hist)
 *   OUM        NOP_OUM_BUF * sizeof(struct nop_oum) (1,024 * 4,152 B = 4.1 MiB)
 *   clients    2 * clients_max slots of 56 B (cons.h)
 *   checkpoint 2 * cp_bytes(): 32 B + clients_max * 28 B + snapshot_max, the
 *              checkpoint and a leader's next one (maybe_checkpoint)
 *   arena      max(arena_bytes, whole_bytes() + 64 KiB): room for the largest message
 *              (VIEW-CHANGE, START-VIEW, RECOVERY-REPLY: a checkpoint and a full ring);
 *              START-VIEWs to other replicas that do not fit one step are dropped like
 *              lost messages and resent when those replicas repeat their VIEW-CHANGE
 *   durable    (durable mode only) a held-message ring as large as the arena, and
 *              NOP_HELD_MAX descriptors of 40 B (nop_durable.c)
 * e.g. log_cap 256, 16 clients, 64 KiB snapshots: 1.1 + 4.1 + 0.26 + 0.2 + 0.9 MiB. */
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
    r->oum = calloc(NOP_OUM_BUF, sizeof *r->oum);
    size_t whole = whole_bytes(c);
    size_t arena = c->arena_bytes;
    r->cp_cap = cp_bytes(c);
    r->cp = malloc(r->cp_cap);
    r->pcp = malloc(r->cp_cap);
    if (arena < whole + (64u << 10))
        arena = whole + (64u << 10);
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
    if (!r->log || !r->exec_sig || !r->hist || !r->oum || !r->ob.arena || !r->cp || !r->pcp ||
        !r->reply.data)
        return FK_ENOMEM;
    int rc = cons_ctab_init(&r->ctab, c->clients_max);
    /* The table travels in this core's checkpoints (nop_disk.c), not in
     * the machine (cons_core_ops.sm_durable 0): no row writes. */
    r->ctab.write_through = 0;
    return rc;
}

/* Serialises the client table and state machine, as they are after the
 * executed slot, into buf (cp_cap bytes); sets *len. */
static int serialize_state(struct nop *r, uint8_t *buf, size_t *len)
{
    struct cons_wbuf w;
    size_t ct = 0, sml = 0;
    cons_wbuf_init(&w, buf, r->cp_cap);
    cons_w_u64(&w, r->executed);
    cons_w_u32(&w, 0);
    if (w.err || cons_ctab_save(&r->ctab, w.p + w.len, w.cap - w.len, &ct) < 0)
        return FK_ETOOBIG;
    uint32_t ct32 = (uint32_t)ct;
    memcpy(w.p + 8, &ct32, 4);
    w.len += ct;
    cons_w_u32(&w, 0);
    if (w.err || r->sm.ops->snapshot(r->sm.impl, w.p + w.len, w.cap - w.len, &sml) < 0)
        return FK_ETOOBIG;
    uint32_t sm32 = (uint32_t)sml;
    memcpy(w.p + w.len - 4, &sm32, 4);
    *len = w.len + sml;
    return 0;
}

/* Moves snap to `upto` (committed, in the log): the slots it compacts go
 * into the history first. */
static void compact_to(struct nop *r, uint64_t upto)
{
    assert(upto >= r->snap && upto <= r->commit && upto <= r->log_len);
    for (uint64_t i = r->snap + 1; i <= upto; i++) {
        struct nop_hist *h = &r->hist[(i - 1) % r->cfg.log_cap];
        h->slot = i;
        h->hash = nop__entry_hash(nop__ent(r, i));
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

/* The checkpoint at the executed slot, which must be committed (callers
 * check). */
static int make_checkpoint(struct nop *r)
{
    int rc = serialize_state(r, r->cp, &r->cp_len);
    if (rc == 0) {
        compact_to(r, r->executed);
        r->cp_due = 0;
    }
    return rc;
}

void nop__cp_fresh(struct nop *r)
{
    if (!r->cp_due || r->poisoned)
        return;
    assert(r->executed <= r->commit && r->executed >= r->snap);
    if (make_checkpoint(r) < 0)
        r->poisoned = 1;
}

int nop__install(struct nop *r, const uint8_t *blob, size_t len, uint64_t index, int keep_tail)
{
    struct cons_rbuf b;
    cons_rbuf_init(&b, blob, len);
    cons_r_u64(&b);
    uint32_t ctl = cons_r_u32(&b);
    const uint8_t *ct = cons_r_bytes(&b, ctl);
    uint32_t sml = cons_r_u32(&b);
    const uint8_t *sm = cons_r_bytes(&b, sml);
    /* Nothing is replaced unless everything is good: the table is checked
     * first, the state machine leaves itself unchanged on bad bytes
     * (FK_EMALFORMED), and only then does the table (which cannot fail any
     * more) load. Any other install error (storage) may have replaced part
     * of the state: the replica stops. */
    if (b.err || len > r->cp_cap || cons_ctab_check(&r->ctab, ct, ctl) < 0)
        return FK_EMALFORMED;
    int rc = r->sm.ops->install(r->sm.impl, sm, sml);
    if (rc == FK_EMALFORMED)
        return rc;
    if (rc < 0) {
        r->poisoned = 1;
        return FK_EPOISONED;
    }
    rc = cons_ctab_load(&r->ctab, ct, ctl);
    assert(rc == 0);
    (void)rc;
    r->pcp_slot = 0; /* the state it was taken from is gone */
    if (blob != r->cp)
        memcpy(r->cp, blob, len);
    r->cp_len = len;
    r->cp_due = 0;
    r->snap = r->executed = index;
    if (!keep_tail || r->log_len < index || r->log_len > index + r->cfg.log_cap)
        r->log_len = index;
    if (r->synced < index || r->synced > r->log_len)
        r->synced = index;
    if (r->commit < index)
        r->commit = index;
    nop__touch(r, r->log_len + 1); /* the log may have been cut: rewrite what follows */
    return 0;
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
    if ((*err = alloc_all(r)) < 0) {
        nop_destroy(r);
        return NULL;
    }
    /* The state machine starts empty (replicas are diskless): that state is
     * the first checkpoint, at slot 0. */
    if (make_checkpoint(r) < 0) {
        *err = FK_EINVAL;
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
    cons_ctab_free(&r->ctab);
    free(r->log);
    free(r->exec_sig);
    free(r->hist);
    free(r->oum);
    free(r->cp);
    free(r->reply.data);
    free(r->pcp);
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
 * it executes once committed, to be ready to lead and to checkpoint.
 * (Executing every read at every replica was 11% of a NOPaxos replica's
 * CPU under YCSB-B.) */
void nop__execute_to(struct nop *r, uint64_t upto, int reply)
{
    assert(upto <= r->log_len);
    int follower = !nop__is_leader(r);
    assert(!(follower && reply));
    while (r->executed < upto && !r->poisoned) {
        const struct nop_entry *e = nop__ent(r, r->executed + 1);
        assert(e->kind == NOP_ENT_REQ || e->kind == NOP_ENT_NOOP);
        if (e->kind == NOP_ENT_REQ && follower && cons_op_reads(&e->op)) {
            if (cons_log_read(&r->sm, &r->ctab, &e->op) < 0) {
                r->poisoned = 1; /* the machine could not keep the row */
                return;
            }
        } else if (e->kind == NOP_ENT_REQ) {
            int rc = cons_apply_once(&r->sm, &r->ctab, &e->op, &r->reply);
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

/* Rollback: if the log no longer holds what this replica executed after
 * its checkpoint (it executed speculatively as an old leader), go back to
 * the checkpoint, which is committed; callers re-execute from there. */
void nop__check_executed(struct nop *r)
{
    nop__cp_fresh(r);
    for (uint64_t i = r->snap + 1; i <= r->executed; i++) {
        if (i > r->log_len || nop__entry_hash(nop__ent(r, i)) != *nop__sig(r, i)) {
            uint64_t keep = r->log_len;
            nop__install(r, r->cp, r->cp_len, r->snap, 1);
            assert(r->poisoned || r->log_len == keep);
            return;
        }
    }
}

/* Log compaction thresholds, in slots past the last checkpoint. A
 * follower compacts at a quarter ring, which costs it little
 * (maybe_checkpoint). The leader serialises its next checkpoint at half a
 * ring: each time its loop stops for a whole serialisation (0.25-0.35 ms
 * with 5,000 YCSB records), with every request in flight waiting, so at a
 * quarter ring it did that twice as often for nothing (closed-loop YCSB-B
 * throughput 4-15% lower). It stops taking requests at three quarters
 * (nop__drain) until that checkpoint commits: a quarter ring of room for
 * the commit point to catch up. */
static uint64_t follower_cp_gap(const struct nop *r)
{
    return r->cfg.log_cap / 4;
}

static uint64_t leader_cp_gap(const struct nop *r)
{
    return r->cfg.log_cap / 2;
}

static uint64_t leader_stop_gap(const struct nop *r)
{
    return r->cfg.log_cap / 4 * 3;
}

/* Log compaction: a checkpoint at a committed slot (thresholds above). A
 * follower executes only what is committed and compacts at once. A
 * leader executes ahead of the commit point, so it serialises its state
 * at the slot it executed when its threshold is reached (pcp: not
 * committed yet) and makes that the checkpoint once the slot commits in
 * the same view; a view change or an install drops it. (It used to wait
 * until the commit point reached what it executed, which under a steady
 * stream never happens until it stops taking requests (nop__drain): a
 * stall every time, NOPaxos' p95 at 16k ops/s three times Multi-Paxos'.) */
static int leader_checkpoint(struct nop *r)
{
    uint64_t view = nop__pack(r->view);
    if (r->pcp_slot && r->pcp_view != view)
        r->pcp_slot = 0;
    if (!r->pcp_slot && r->executed - r->snap >= leader_cp_gap(r)) {
        if (serialize_state(r, r->pcp, &r->pcp_len) < 0) {
            r->poisoned = 1;
            return 0;
        }
        r->pcp_slot = r->executed;
        r->pcp_view = view;
    }
    if (!r->pcp_slot || r->pcp_slot > r->commit)
        return 0;
    /* A follower still behind it is confirmed from the history (send_sync):
     * the leader no longer waits for every follower before it compacts. */
    uint8_t *t = r->cp;
    r->cp = r->pcp;
    r->pcp = t;
    r->cp_len = r->pcp_len;
    compact_to(r, r->pcp_slot);
    r->pcp_slot = 0;
    return 1;
}

/* A follower compacts without serialising its state (cp_due) unless in
 * durable mode: its checkpoint serves only the disk and view changes,
 * which take it when they need it (nop__cp_fresh), at most once a ring
 * for the disk (nop_disk.c). Serialising at every quarter ring on all
 * replicas at once was 11% of a NOPaxos replica's CPU under YCSB-B,
 * with 5,000 records. */
static int maybe_checkpoint(struct nop *r)
{
    if (r->status != NOP_NORMAL)
        return 0;
    if (nop__is_leader(r))
        return leader_checkpoint(r);
    if (r->executed > r->commit || r->executed - r->snap < follower_cp_gap(r))
        return 0;
    if (!r->cfg.durable && !(r->cfg.bugs & NOP_BUG_FOLLOWER_EXEC)) {
        /* (The planted bug executes uncommitted entries: a lazy
         * checkpoint would then serialise uncommitted state.) */
        compact_to(r, r->executed);
        r->cp_due = 1;
        return 1;
    }
    if (make_checkpoint(r) < 0) {
        r->poisoned = 1;
        return 0;
    }
    return 1;
}

/* ---- normal operation over the OUM (section 5.2.1) ------------------------ */

/* The next OUM message number; 0 while a state transfer left this replica
 * before the session's first slot (sync fills the gap). */
static uint64_t expected(const struct nop *r)
{
    return r->log_len >= r->sess_start ? r->log_len - r->sess_start + 1 : 0;
}

/* Empties the OUM buffer in O(1): a new epoch leaves every slot stale
 * without touching it (the buffer is NOP_OUM_BUF ops, ~2.6 MiB, whose
 * pages a loop over it faulted in at every create). */
void nop__oum_clear(struct nop *r)
{
    r->oum_drop_upto = 0;
    r->oum_epoch++;
}

/* Whether slot s holds OUM message num (a request, fill or drop). */
static int oum_holds(const struct nop *r, const struct nop_oum *s, uint64_t num)
{
    return s->kind && s->epoch == r->oum_epoch && s->msgnum == num;
}

/* A NO-OP entry, for appends (a zeroed 2 KiB entry on the stack per fill
 * once cost a memset and a copy). */
static const struct nop_entry noop_entry = {.kind = NOP_ENT_NOOP};

static void append(struct nop *r, const struct nop_entry *e)
{
    assert(nop__fits(r, r->log_len + 1));
    nop__entry_copy(nop__ent(r, ++r->log_len), e);
    nop__touch(r, r->log_len);
}

static void ack_request(struct nop *r, uint64_t slot, const struct cons_op *op)
{
    memset(&r->reply, 0, offsetof(struct cons_reply, data));
    r->reply.client_id = op->client_id;
    r->reply.req_no = op->req_no;
    nop__reply(r, slot, 0, &r->reply);
}

static void send_gap_commits(struct nop *r)
{
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p == r->cfg.id || (r->gap_acks >> p & 1))
            continue;
        if (r->gap_lo == r->gap_slot) {
            nop__send_u64(r, p, NOP_GAP_COMMIT, r->gap_slot);
            continue;
        }
        struct cons_wbuf w;
        nop__begin(r, &w, NOP_GAP_COMMIT, nop__pack(r->view));
        cons_w_u64(&w, r->gap_slot);
        cons_w_u64(&w, r->gap_lo);
        nop__send(r, &w, cons_replica(p));
    }
    r->gap_sent = r->now;
}

/* Whether OUM message `want` is known dropped; if so it is consumed. */
static int take_drop(struct nop *r, uint64_t want)
{
    struct nop_oum *s = &r->oum[want % NOP_OUM_BUF];
    int here = oum_holds(r, s, want);
    if (want == 0 || (here ? s->kind != NOP_OUM_DROP : want > r->oum_drop_upto))
        return 0;
    if (here)
        s->kind = 0;
    return 1;
}

/* A dropped message (5.2.2): the leader commits a NO-OP in its slot and
 * stops until f followers hold it too; a follower asks the leader. In
 * durable mode, where each round of gap agreement waits for disks, the
 * leader NO-OPs the whole run of consecutive drops it knows in one round
 * (the same agreement, for several slots: followers confirm the run only
 * once they hold all of it), so a group that comes back from a
 * whole-group restart far behind its sequencer catches up. */
static void on_drop(struct nop *r)
{
    if (nop__is_leader(r)) {
        append(r, &noop_entry);
        r->gap_lo = r->log_len;
        while (r->cfg.durable && nop__fits(r, r->log_len + 1) &&
               r->log_len - r->snap < leader_stop_gap(r) && take_drop(r, expected(r)))
            append(r, &noop_entry);
        nop__execute_to(r, r->log_len, 1);
        r->gap_slot = r->log_len;
        r->gap_acks = 0;
        send_gap_commits(r);
        return;
    }
    if (r->cfg.bugs & NOP_BUG_NO_GAP_AGREEMENT) {
        append(r, &noop_entry); /* planted bug: decides the gap alone */
        return;
    }
    r->find_slot = r->log_len + 1;
    r->find_sent = r->now;
    nop__send_u64(r, nop__leader_of(r, r->view), NOP_GAP_FIND, r->find_slot);
}

/* Processes buffered OUM messages in number order while nothing blocks. */
void nop__drain(struct nop *r)
{
    int full = 0;
    while (r->status == NOP_NORMAL && !r->poisoned && !r->gap_slot && !r->find_slot &&
           nop__fits(r, r->log_len + 1) &&
           !(full = nop__is_leader(r) && r->log_len - r->snap >= leader_stop_gap(r))) {
        uint64_t want = expected(r);
        if (want == 0)
            return;
        struct nop_oum *s = &r->oum[want % NOP_OUM_BUF];
        uint8_t kind = NOP_OUM_DROP;
        if (oum_holds(r, s, want))
            kind = s->kind;
        else if (want > r->oum_drop_upto)
            return;
        s->kind = 0;
        if (kind == NOP_OUM_DROP) {
            on_drop(r);
            continue;
        }
        if (kind == NOP_OUM_FILL) {
            /* A number that carries no request (nop.h): every replica that
             * received it holds the same bytes, so each logs the same NO-OP
             * without agreement; one that lost it asks the leader as for any
             * drop (5.2.2). Nobody waits for it: no reply. */
            append(r, &noop_entry);
            if (nop__is_leader(r))
                nop__execute_to(r, r->log_len, 1);
            continue;
        }
        /* Straight from the OUM buffer into the ring: no copy between. */
        assert(nop__fits(r, r->log_len + 1));
        struct nop_entry *e = nop__ent(r, ++r->log_len);
        e->kind = NOP_ENT_REQ;
        cons_op_copy(&e->op, &s->op);
        nop__touch(r, r->log_len);
        if (nop__is_leader(r))
            nop__execute_to(r, r->log_len, 1);
        else
            ack_request(r, r->log_len, &e->op);
        if (!nop__is_leader(r) && (r->cfg.bugs & NOP_BUG_FOLLOWER_EXEC))
            nop__execute_to(r, r->log_len, 0); /* planted bug */
    }
    /* Stopped at the stop gap with the next message waiting: a stall. */
    uint64_t want = full ? expected(r) : 0;
    const struct nop_oum *s = &r->oum[want % NOP_OUM_BUF];
    int waiting = want && oum_holds(r, s, want);
    r->stalls += waiting && !r->stalled;
    r->stalled = waiting;
}

static void on_oum(struct nop *r, const struct nop_msg *m, const struct cons_op *op)
{
    uint32_t session = (uint32_t)m->term;
    if (r->status == NOP_RECOVERING)
        return;
    if (session > r->view.session) {
        /* The sequencer failed over: a new session needs a new view. */
        struct nop_view v = {r->view.leader_num, session};
        nop__start_view_change(r, v);
        return;
    }
    if (session < r->view.session || r->status != NOP_NORMAL)
        return;
    uint64_t want = expected(r), num = m->u1;
    if (want == 0 || num < want)
        return; /* old, or waiting for the session's start */
    if (num >= want + NOP_OUM_BUF) {
        /* Beyond the buffer: in OUM order everything before it was dropped,
         * and it is dropped too (the client retries). */
        if (num > r->oum_drop_upto)
            r->oum_drop_upto = num;
        nop__drain(r);
        return;
    }
    /* The OUM delivers in order, so every number skipped was dropped. */
    for (uint64_t k = want; k < num; k++) {
        struct nop_oum *s = &r->oum[k % NOP_OUM_BUF];
        if (!oum_holds(r, s, k)) {
            s->kind = NOP_OUM_DROP;
            s->epoch = r->oum_epoch;
            s->msgnum = k;
        }
    }
    struct nop_oum *s = &r->oum[num % NOP_OUM_BUF];
    s->kind = m->type;
    s->epoch = r->oum_epoch;
    s->msgnum = num;
    if (m->type == NOP_OUM_REQ)
        cons_op_copy(&s->op, op);
    nop__drain(r);
}

/* ---- gap agreement (section 5.2.2) ------------------------------------------ */

static void on_gap_find(struct nop *r, const struct nop_msg *m)
{
    if (!nop__is_leader(r) || m->u1 == 0 || m->u1 > r->log_len ||
        (m->u1 <= r->snap && !nop__hist_entry(r, m->u1)))
        return; /* compacted and gone: the follower gets a checkpoint through sync */
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_GAP_RECV, nop__pack(r->view));
    nop__put_segment(r, &w, m->u1, m->u1);
    nop__send(r, &w, cons_replica(m->from));
}

/* Places the leader's entry e at slot on a follower. */
static void follower_put(struct nop *r, uint64_t slot, const struct nop_entry *e)
{
    if (slot <= r->commit || slot > r->log_len + 1 || !nop__fits(r, slot))
        return; /* committed (identical), not contiguous, or no room yet */
    if (slot <= r->log_len)
        nop__entry_copy(nop__ent(r, slot), e);
    else
        append(r, e);
    nop__touch(r, slot);
    if (r->find_slot && r->find_slot <= r->log_len)
        r->find_slot = 0;
}

static void on_gap_recv(struct nop *r, const struct nop_msg *m)
{
    struct cons_rbuf rd = m->ents;
    struct nop_entry e;
    nop__entry_next(&rd, &e);
    uint64_t before = r->log_len;
    follower_put(r, m->lo, &e);
    if (r->log_len > before && e.kind == NOP_ENT_REQ)
        ack_request(r, r->log_len, &e.op);
    nop__drain(r);
}

/* NO-OPs for slots lo..u1 (one slot but in durable mode); confirmed only
 * once this follower holds every one of them. */
static void on_gap_commit(struct nop *r, const struct nop_msg *m)
{
    uint64_t lo = m->u2;
    if (m->u1 == 0 || lo == 0 || lo > r->log_len + 1 || m->u1 <= r->commit ||
        !nop__fits(r, m->u1)) {
        if (m->u1 != 0 && m->u1 <= r->commit)
            nop__send_u64(r, m->from, NOP_GAP_COMMIT_REP, m->u1);
        return;
    }
    for (uint64_t s = lo; s <= m->u1; s++)
        follower_put(r, s, &noop_entry);
    nop__send_u64(r, m->from, NOP_GAP_COMMIT_REP, m->u1);
    nop__drain(r);
}

static void on_gap_commit_rep(struct nop *r, const struct nop_msg *m)
{
    if (!nop__is_leader(r) || !r->gap_slot || m->u1 != r->gap_slot)
        return;
    r->gap_acks |= 1ull << m->from;
    if ((uint32_t)__builtin_popcountll(r->gap_acks) >= r->f) {
        r->gap_slot = 0;
        nop__drain(r);
    }
}

/* ---- synchronization (section 5.2.4) ----------------------------------------- */

/* Synchronization sends each follower, by default, only the hashes of the
 * leader's entries after its synced prefix (SYNC_SIG): its log came over
 * the OUM and normally matches, so entries travel again (SYNC, at most
 * NOP_SYNC_ENTRIES) only to a follower that reported a differing entry or
 * made no progress between two heartbeats. A prefix confirmed this way is
 * what the paper's SYNC-PREPARE / SYNC-REPLY establish: entries identical
 * to the leader's. Below the leader's checkpoint the hashes come from the
 * committed history and the entries from what the ring still holds; only
 * a follower behind both gets the checkpoint (STATE). */
static uint32_t sync_count(const struct nop *r, uint32_t p)
{
    uint64_t lo = r->acked[p] + 1;
    uint32_t max = r->need_full[p] ? NOP_SYNC_ENTRIES : NOP_SYNC_SIGS;
    return r->log_len >= lo ? (uint32_t)(r->log_len - lo + 1 < max ? r->log_len - lo + 1 : max) : 0;
}

/* 1 when follower p's next sync needs the checkpoint: it starts below the
 * leader's checkpoint where the history (hashes) or the ring (entries) no
 * longer reach. */
static int needs_state(const struct nop *r, uint32_t p)
{
    uint64_t lo = r->acked[p] + 1, h;
    uint32_t n = sync_count(r, p);
    for (uint64_t i = lo; i < lo + n && i <= r->snap; i++) {
        if (r->need_full[p] ? !nop__hist_entry(r, i) : !nop__hist_hash(r, i, &h))
            return 1;
    }
    return lo <= r->snap && n == 0;
}

/* state_ok 0: a follower that needs the checkpoint gets nothing now (the
 * eager path leaves it to the heartbeat). */
static void send_sync(struct nop *r, uint32_t p, int state_ok)
{
    struct cons_wbuf w;
    int state = needs_state(r, p);
    if (state && !state_ok)
        return;
    r->sync_out[p] = 1;
    if (state) {
        /* What it lacks was compacted: state transfer from the checkpoint. */
        nop__begin(r, &w, NOP_STATE, nop__pack(r->view));
        cons_w_u64(&w, r->sess_start);
        cons_w_u64(&w, r->commit);
        nop__put_checkpoint(r, &w);
        nop__send(r, &w, cons_replica(p));
        r->syncs[NOP_SYNC_KIND_STATE]++;
        return;
    }
    uint64_t lo = r->acked[p] + 1, hi = lo + sync_count(r, p) - 1;
    r->syncs[r->need_full[p] ? NOP_SYNC_KIND_ENTRIES : NOP_SYNC_KIND_HASHES]++;
    if (!r->need_full[p]) {
        nop__begin(r, &w, NOP_SYNC_SIG, nop__pack(r->view));
        cons_w_u64(&w, r->commit);
        cons_w_u64(&w, lo);
        cons_w_u32(&w, hi >= lo ? (uint32_t)(hi - lo + 1) : 0);
        for (uint64_t i = lo; i <= hi; i++) {
            uint64_t h = 0;
            if (i > r->snap)
                h = nop__entry_hash(nop__ent(r, i));
            else
                nop__hist_hash(r, i, &h); /* present: needs_state */
            cons_w_u64(&w, h);
        }
        nop__send(r, &w, cons_replica(p));
        return;
    }
    nop__begin(r, &w, NOP_SYNC, nop__pack(r->view));
    cons_w_u64(&w, r->commit);
    nop__put_segment(r, &w, lo, hi);
    nop__send(r, &w, cons_replica(p));
}

/* Eager synchronization: a follower log_cap / 16 entries behind (any
 * entry once a checkpoint is due) is synced now rather than at the next
 * heartbeat, unless it needs the checkpoint (that waits for the
 * heartbeat). The leader stops taking requests three quarters of a ring
 * past its checkpoint until f+1 confirm the next one (leader_checkpoint); with
 * syncs only every heartbeat a busy leader spent most of its time there. */
static void sync_eager(struct nop *r)
{
    uint64_t behind = r->cfg.log_cap / 16 > 0 ? r->cfg.log_cap / 16 : 1;
    if (!nop__is_leader(r) || r->status != NOP_NORMAL)
        return;
    if (r->log_len - r->snap >= leader_cp_gap(r))
        behind = 1; /* due for a checkpoint: it waits for f+1 */
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id && !r->sync_out[p] && r->log_len - r->acked[p] >= behind)
            send_sync(r, p, 0);
    }
}

/* asked: the first slot the answered message covered, so that the leader
 * judges progress against what it asked for (on_sync_rep). */
static void send_sync_rep(struct nop *r, uint32_t to, uint64_t flags, uint64_t asked)
{
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_SYNC_REP, nop__pack(r->view));
    cons_w_u64(&w, r->synced);
    cons_w_u64(&w, flags);
    cons_w_u64(&w, asked);
    nop__send(r, &w, cons_replica(to));
}

/* Adopts the leader's commit point up to the synced prefix and executes. */
static void follow_commit(struct nop *r, uint64_t leader_commit)
{
    uint64_t c = leader_commit < r->synced ? leader_commit : r->synced;
    if (c > r->commit)
        r->commit = c;
    nop__execute_to(r, r->commit > r->executed ? r->commit : r->executed, 0);
}

/* A follower compares the leader's entry hashes with its own log: the
 * contiguous run that matches extends its synced prefix. It stops at the
 * first slot it lacks (still on its way over the OUM, or lost: gap
 * agreement or a later SYNC brings it) or holds differently (reported, so
 * that the leader sends entries). */
static void on_sync_sig(struct nop *r, const struct nop_msg *m)
{
    r->last_heard = r->now;
    struct cons_rbuf rd = m->ents;
    uint64_t i = m->lo;
    int differed = 0;
    for (uint32_t k = 0; k < m->nents; k++, i++) {
        uint64_t h = cons_r_u64(&rd);
        if (i <= r->commit)
            continue; /* committed here already: identical */
        if (i > r->log_len)
            break;
        if (nop__entry_hash(nop__ent(r, i)) != h) {
            differed = 1;
            break;
        }
    }
    if (m->lo <= r->synced + 1 && i - 1 > r->synced)
        r->synced = i - 1;
    follow_commit(r, m->u1);
    send_sync_rep(r, m->from, differed ? NOP_SYNC_REP_DIFFERED : 0, m->lo);
    nop__drain(r);
}

/* A follower adopts the leader's entries (NO-OPs included), extends its
 * synced prefix when contiguous, and executes what the leader committed. */
static void on_sync(struct nop *r, const struct nop_msg *m)
{
    r->last_heard = r->now;
    struct cons_rbuf rd = m->ents;
    struct nop_entry e;
    uint64_t i = m->lo;
    for (uint32_t k = 0; k < m->nents; k++, i++) {
        nop__entry_next(&rd, &e);
        if (i <= r->commit)
            continue; /* committed here already: identical */
        if (i > r->log_len + 1 || !nop__fits(r, i))
            break;
        uint64_t before = r->log_len;
        follower_put(r, i, &e);
        /* Ahead of its OUM copy (which will be an old number now): the
         * client still counts this replica, as after GAP-RECV. */
        if (r->log_len > before && e.kind == NOP_ENT_REQ)
            ack_request(r, r->log_len, &e.op);
    }
    if (m->lo <= r->synced + 1 && i - 1 > r->synced)
        r->synced = i - 1;
    follow_commit(r, m->u1);
    send_sync_rep(r, m->from, NOP_SYNC_REP_FULL, m->lo);
    nop__drain(r);
}

/* State transfer (the leader compacted what this follower lacks): install
 * the checkpoint unless this replica already committed past it. The log
 * after the checkpoint stays: within a view a follower's log never loses a
 * request it acknowledged to a client (a client may count that reply). */
static void on_state(struct nop *r, const struct nop_msg *m)
{
    r->last_heard = r->now;
    if (m->cp_len > 0 && m->cp_index > r->commit) {
        uint64_t len = r->log_len;
        if (nop__install(r, m->cp, m->cp_len, m->cp_index, 1) < 0)
            return;
        r->sess_start = m->u1;
        if (r->log_len != len) {
            r->find_slot = 0;
            nop__oum_clear(r);
        }
    }
    send_sync_rep(r, m->from, NOP_SYNC_REP_FULL, m->cp_index);
}

/* The leader's commit point is the largest slot that f+1 replicas hold
 * exactly as the leader does (itself included; in durable mode every
 * follower's synced prefix is durable on the leader too, nop_durable.c). */
static void on_sync_rep(struct nop *r, const struct nop_msg *m)
{
    if (!nop__is_leader(r))
        return;
    uint64_t got = m->u1 < r->log_len ? m->u1 : r->log_len;
    /* A follower that made no progress on hashes lacks what they cover
     * (still on its way, or lost) and gets entries next; one that made
     * none on entries cannot take them now and waits for the heartbeat:
     * eager syncs to it would only bounce. Progress is judged against the
     * answered message (asked, its first slot), not against the last
     * reply: the heartbeat sends a sync while an eager one is out, and the
     * second answer, no further than the first, once sent a follower that
     * kept up to the slow path and left it there until the next heartbeat
     * (a stalled leader (nop__drain): NOPaxos' p95 at 16k ops/s was 3.5x
     * Multi-Paxos'). */
    uint32_t from = m->from;
    uint64_t asked = m->u3 ? m->u3 : r->acked[from] + 1;
    int still = got < asked && got < r->log_len;
    r->acked[from] = got;
    r->sync_out[from] = (uint8_t)(still && (m->u2 & NOP_SYNC_REP_FULL));
    r->need_full[from] = (m->u2 & NOP_SYNC_REP_DIFFERED) || still;
    uint64_t v[CONS_REPLICAS_MAX] = {0};
    uint32_t n = 0;
    for (uint32_t p = 0; p < r->cfg.n; p++)
        v[n++] = p == r->cfg.id ? r->log_len : r->acked[p];
    for (uint32_t a = 0; a < n; a++) { /* sort descending; n <= 7 */
        for (uint32_t b = a + 1; b < n; b++) {
            if (v[b] > v[a]) {
                uint64_t t = v[a];
                v[a] = v[b];
                v[b] = t;
            }
        }
    }
    if (v[r->f] > r->commit)
        r->commit = v[r->f];
}

/* ---- timers and dispatch ------------------------------------------------------- */

static void tick(struct nop *r)
{
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
                send_sync(r, p, 1);
            }
            if (r->gap_slot)
                send_gap_commits(r);
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
        on_gap_find(r, m);
        break;
    case NOP_GAP_RECV:
        if (from_leader)
            on_gap_recv(r, m);
        break;
    case NOP_GAP_COMMIT:
        if (from_leader)
            on_gap_commit(r, m);
        break;
    case NOP_GAP_COMMIT_REP:
        on_gap_commit_rep(r, m);
        break;
    case NOP_SYNC:
        if (from_leader)
            on_sync(r, m);
        break;
    case NOP_STATE:
        if (from_leader)
            on_state(r, m);
        break;
    case NOP_SYNC_SIG:
        if (from_leader)
            on_sync_sig(r, m);
        break;
    case NOP_SYNC_REP:
        on_sync_rep(r, m);
        break;
    default:
        break; /* RECOVERY_REP to a replica that is not recovering */
    }
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
    nop__persist(r);
    nop__hold(r);
    return r->poisoned ? FK_EPOISONED : 0;
}

int nop_step(struct nop *r, const struct cons_input *in, uint64_t now, struct cons_outbox **out)
{
    cons_outbox_reset(&r->ob);
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
            on_oum(r, &m, &r->scratch_op);
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
    /* What this step committed reaches the disk before a checkpoint
     * compacts it, so the disk's log still leads to the checkpoint and the
     * checkpoint need not be persisted (nop_disk.c). */
    nop__persist_entries(r);
    /* A leader paused at its stop gap (nop__drain) resumes as soon as the
     * checkpoint freed the ring, not at the next message. */
    if (maybe_checkpoint(r) && nop__is_leader(r))
        nop__drain(r);
    sync_eager(r);
    nop__persist(r);
    nop__hold(r);
    return r->poisoned ? FK_EPOISONED : 0;
}

void nop_invariants(const struct nop *r)
{
    assert(r->executed <= r->log_len && r->log_len <= r->snap + r->cfg.log_cap);
    assert(r->snap <= r->executed && r->cp_len > 0);
    assert(!r->cp_due || (!nop__is_leader(r) && !r->cfg.durable && r->executed <= r->commit));
    assert(r->durable <= r->next_cookie && r->pers_snap <= r->pers_upto);
    assert(r->held_n <= NOP_HELD_MAX && (r->held_n == 0 || r->cfg.durable));
    if (r->held_n) /* FIFO: released in cookie order */
        assert(r->held[r->held_head].cookie <=
               r->held[(r->held_head + r->held_n - 1) % NOP_HELD_MAX].cookie);
    assert(!r->cfg.durable || r->status == NOP_RECOVERING || !r->pers_done ||
           r->dirty_lo > r->log_len);
    assert(r->status == NOP_RECOVERING || (r->snap <= r->commit && r->commit <= r->log_len));
    assert(r->synced <= r->log_len || r->status != NOP_NORMAL);
    assert(r->gap_slot == 0 || (nop__is_leader(r) && r->gap_slot == r->log_len));
    assert(r->find_slot == 0 || (!nop__is_leader(r) && r->find_slot == r->log_len + 1));
    if (nop__is_leader(r))
        assert(r->executed == r->log_len);
    if (r->pcp_slot && r->pcp_view == nop__pack(r->view) && nop__is_leader(r))
        assert(r->snap < r->pcp_slot && r->pcp_slot <= r->executed);
    for (uint64_t i = r->snap + 1; i <= r->log_len; i++)
        assert(nop__ent(r, i)->kind == NOP_ENT_REQ || nop__ent(r, i)->kind == NOP_ENT_NOOP);
    /* The newest executed entries still hold what was executed (the whole
     * suffix is re-checked on every view entry, nop__check_executed). */
    uint64_t from = r->executed > r->snap + 8 ? r->executed - 8 : r->snap + 1;
    for (uint64_t i = from; i <= r->executed; i++)
        assert(*nop__sig(r, i) == nop__entry_hash(nop__ent(r, i)) ||
               (r->cfg.bugs & NOP_BUG_FOLLOWER_EXEC));
}

void nop_status(const struct nop *r, struct nop_stat *st)
{
    st->status = r->status;
    st->view = r->view;
    st->leader = r->view.leader_num % r->cfg.n;
    st->log_len = r->log_len;
    st->commit = r->commit;
    st->executed = r->executed;
    st->is_leader = nop__is_leader(r);
    st->held = r->held_n;
    st->held_dropped = r->held_dropped;
    memcpy(st->syncs, r->syncs, sizeof st->syncs);
    st->stalls = r->stalls;
}

int nop_describe(const struct nop *r, char *buf, size_t cap)
{
    static const char *const st[] = {"?", "normal", "view-change", "recovering"};
    int n = snprintf(buf, cap,
                     "%s view %u.%u%s log %" PRIu64 " commit %" PRIu64 " executed %" PRIu64
                     " synced %" PRIu64 " snap %" PRIu64 " sess_start %" PRIu64 " oum_next %" PRIu64
                     " gap %" PRIu64 " find %" PRIu64 " pcp %" PRIu64
                     " stalled %d held %u durable %" PRIu64 "/%" PRIu64,
                     st[r->status <= NOP_RECOVERING ? r->status : 0], r->view.leader_num,
                     r->view.session, nop__is_leader(r) ? " leader" : "", r->log_len, r->commit,
                     r->executed, r->synced, r->snap, r->sess_start, expected(r), r->gap_slot,
                     r->find_slot, r->pcp_slot, r->stalled, r->held_n, r->durable, r->next_cookie);
    for (uint32_t p = 0; nop__is_leader(r) && p < r->cfg.n && n >= 0 && (size_t)n < cap; p++) {
        if (p != r->cfg.id)
            n += snprintf(buf + n, cap - (size_t)n, " r%u acked %" PRIu64 "%s%s", p, r->acked[p],
                          r->sync_out[p] ? " out" : "", r->need_full[p] ? " full" : "");
    }
    return n;
}

int nop_committed_hash(const struct nop *r, uint64_t index, uint64_t *hash)
{
    if (index <= r->snap || index > r->commit || index > r->log_len || r->status == NOP_RECOVERING)
        return 0;
    *hash = nop__entry_hash(nop__ent(r, index));
    return 1;
}
