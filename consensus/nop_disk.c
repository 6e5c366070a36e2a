/* nop_disk.c: what a NOPaxos replica persists in the default mode, how it
 * comes back from its disk, and why neither weakens safety. Durable mode
 * (nop_config.durable, nop_durable.c) persists the whole log instead and
 * restarts by a view change; restoring records of either layout and the
 * common persist helpers live here.
 *
 * The paper's replicas are diskless (Li et al., OSDI 2016, section 5.3.2):
 * a restarted replica recovers its log from the others, after Viewstamped
 * Replication's recovery protocol, and the correctness argument never
 * relies on a disk. The default mode keeps that argument intact:
 * persistence only makes recovery cheaper.
 *
 * What is persisted, and when (at the end of every step, never while
 * recovering, in this order so the driver's in-order durability keeps the
 * disk self-consistent):
 *  - the machine (cons.h): its pairs, client rows and mark (the executed
 *    slot), and the undo stash of a leader's speculative executions
 *    (nop_undo.c), written by the machine in the same transaction;
 *  - SNAPSHOT: a trim point, the slot the log on disk starts after
 *    (entries at or below it are dropped). Written once the next
 *    committed entry would lie beyond a ring after the last trim point (a
 *    restore takes entries only within a ring after it), or when the ring
 *    restarted past the entries on disk (a transfer, a log from
 *    elsewhere). It is snap, which is at or below the machine's mark,
 *    unless the machine is behind its ring and fetching a state: a
 *    restore then sees the mark below the trim point and fetches again.
 *  - ENTRY: each log slot once it is committed, exactly once, in runs:
 *    one record holds up to NOP_PERSIST_RUN consecutive committed slots
 *    and is keyed by the last of them (so a SNAPSHOT, which drops the
 *    records keyed at or below its index, drops only runs it covers
 *    whole; a restore skips the slots of a run inside its snapshot).
 *    Commits come in steps of up to a sixteenth of a ring at once
 *    (synchronization), and one LMDB put and one delete per slot were
 *    10% of a replica's CPU under YCSB-B. Committed slots never change
 *    and are identical on every replica (the simulator checks that after
 *    every step), so every entry on disk is final, whichever incarnation
 *    wrote it. Uncommitted entries are never persisted: they may still
 *    be replaced by gap agreement or a view change.
 *  - META: the current view, the last normal view and the session start,
 *    when they change. The last normal view is a floor for recovery.
 *
 * Why no acknowledgement waits for durability (CONS_IN_PERSISTED): a
 * restarted replica never answers anything from its disk before it has run
 * recovery. What it restores is a committed prefix: the machine (rolled
 * back with its stashed undo records to what the disk's committed entries
 * reach, or emptied where they do not reach it) and the contiguous run of
 * committed entries after it. That is state every replica agrees on, so it
 * is safe to hold whatever else happened.
 *
 * Transferring only what is missing: the RECOVERY request carries that
 * prefix (`have`, and its trim point). The leader answering in normal
 * status sends, when have covers its own snap and its log fits the
 * requester's ring, only its log after `have` (else its whole ring, and
 * the requester fetches a state if its machine is behind it).
 * Safety: the requester rejoins only with the log of the leader of the
 * newest view among f+1 other replicas (unchanged rule). Slot `have` was
 * committed in some view W, so f+1 replicas were in a view >= W and any
 * f+1 others include one of them; hence the newest view V >= W, and the
 * leader of V holds every slot committed before it at the same position:
 * its log up to `have` equals the requester's prefix, and the joined log
 * is exactly the leader's. A reply that cannot be joined (the requester
 * took another leader's whole ring meanwhile) is ignored, and
 * later requests ask for everything (have = 0). */
#include "nop_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

/* ---- persisting -------------------------------------------------------- */

void nop__item_begin(struct nop *r, struct cons_wbuf *w)
{
    cons_wbuf_init(w, r->ob.arena + r->ob.arena_used, r->ob.arena_cap - r->ob.arena_used);
}

/* Adds the record written in w as a persist item. FK_EFULL when it did not
 * fit the arena or the array: the item is deferred to a later step, which
 * is harmless because nothing waits for it (see above; in durable mode
 * the step's messages wait for the later step, nop_durable.c). */
int nop__item_end(struct nop *r, uint8_t kind, uint64_t index, const struct cons_wbuf *w)
{
    if (w->err || r->ob.npersists >= CONS_OUT_PERSIST_MAX)
        return FK_EFULL;
    struct cons_persist *p = &r->ob.persists[r->ob.npersists++];
    p->kind = kind;
    p->cookie = ++r->next_cookie;
    p->index = index;
    p->buf = w->p;
    p->len = (uint32_t)w->len;
    r->ob.arena_used += w->len;
    return 0;
}

/* An ENTRY record: u64 first slot, then each entry of the run (u8 kind,
 * the op for a request). Durable mode writes runs of one. */
static void put_entry_body(struct cons_wbuf *w, const struct nop_entry *e)
{
    cons_w_u8(w, e->kind);
    if (e->kind == NOP_ENT_REQ)
        cons_wire_put_op(w, &e->op);
}

void nop__put_entry(struct cons_wbuf *w, uint64_t slot, const struct nop_entry *e)
{
    cons_w_u64(w, slot);
    put_entry_body(w, e);
}

int nop__persist_trim(struct nop *r, uint64_t index)
{
    struct cons_wbuf w;
    nop__item_begin(r, &w);
    cons_w_u32(&w, NOP_TRIM_MAGIC);
    cons_w_u64(&w, index);
    if (nop__item_end(r, CONS_PERSIST_SNAPSHOT, index, &w) < 0)
        return FK_EFULL;
    return 0;
}

static void persist_meta(struct nop *r)
{
    uint64_t meta[3] = {nop__pack(r->view), nop__pack(r->last_normal), r->sess_start};
    if (r->pers_meta_ok && memcmp(meta, r->pers_meta, sizeof meta) == 0)
        return;
    struct cons_wbuf w;
    nop__item_begin(r, &w);
    cons_w_u32(&w, NOP_META_MAGIC);
    cons_w_u32(&w, r->cfg.n);
    cons_w_u32(&w, r->cfg.id);
    for (int k = 0; k < 3; k++)
        cons_w_u64(&w, meta[k]);
    if (nop__item_end(r, CONS_PERSIST_META, 0, &w) == 0) {
        memcpy(r->pers_meta, meta, sizeof meta);
        r->pers_meta_ok = 1;
    }
}

/* Default mode: committed entries after what the disk holds, while its
 * log leads to the ring (else the trim point goes first, in
 * nop__persist) and fits a ring after its snapshot. */
void nop__persist_entries(struct nop *r)
{
    if (r->status == NOP_RECOVERING || r->poisoned || !r->started || r->cfg.durable)
        return;
    struct cons_wbuf w;
    while (r->pers_upto >= r->snap && r->pers_upto < r->commit &&
           r->pers_upto < r->pers_snap + r->cfg.log_cap &&
           r->ob.npersists + 1 < CONS_OUT_PERSIST_MAX) {
        uint64_t lo = r->pers_upto + 1, hi = r->commit;
        if (hi > r->pers_snap + r->cfg.log_cap)
            hi = r->pers_snap + r->cfg.log_cap;
        if (hi - lo + 1 > NOP_PERSIST_RUN)
            hi = lo + NOP_PERSIST_RUN - 1;
        FK_ASSERT(lo > r->snap && hi <= r->log_len);
        nop__item_begin(r, &w);
        cons_w_u64(&w, lo);
        for (uint64_t slot = lo; slot <= hi; slot++)
            put_entry_body(&w, nop__ent(r, slot));
        if (nop__item_end(r, CONS_PERSIST_ENTRY, hi, &w) < 0)
            break; /* the arena is full: the next step goes on */
        r->pers_upto = hi;
    }
}

void nop__persist(struct nop *r)
{
    if (r->status == NOP_RECOVERING || r->poisoned || !r->started)
        return;
    if (r->cfg.durable) {
        nop__persist_durable(r); /* the whole log, nop_durable.c */
        return;
    }
    FK_ASSERT(r->pers_snap <= r->pers_upto);
    /* The disk's log (entries after pers_snap up to pers_upto) still leads
     * to the ring when its entries reach snap; the next entry must fit a
     * ring after pers_snap. Otherwise the disk's log restarts at snap
     * (TRIM): the machine, written in the same transaction, is at or past
     * it, or behind it and fetching (a restore then knows it). */
    int leads = r->pers_upto >= r->snap;
    int room = r->pers_upto < r->pers_snap + r->cfg.log_cap;
    if (r->snap > r->pers_snap && (!leads || !room)) {
        if (nop__persist_trim(r, r->snap) < 0)
            return; /* the entries after it wait for it */
        r->pers_snap = r->snap;
        if (r->pers_upto < r->snap)
            r->pers_upto = r->snap;
    }
    nop__persist_entries(r);
    persist_meta(r);
}

/* ---- restoring ----------------------------------------------------------- */

/* The machine as the disk holds it: its rows and its mark, the state
 * after `executed` (cons.h), checked against the log at start. */
static int load_machine(struct nop *r)
{
    uint64_t applied;
    int rc = cons_sm_load(&r->sm, &r->ctab, &applied);
    if (rc < 0)
        return rc == FK_EFULL || rc == FK_EMALFORMED ? FK_EMALFORMED : rc;
    r->executed = r->marked = applied;
    return nop__commit_only(r) ? 0 : nop__stash_restore(r);
}

int nop_restore_meta(struct nop *r, const uint8_t *buf, size_t len)
{
    if (r->started)
        return FK_EINVAL;
    int lrc = load_machine(r);
    if (lrc < 0)
        return lrc;
    struct cons_rbuf rd;
    cons_rbuf_init(&rd, buf, len);
    uint32_t magic = cons_r_u32(&rd), n = cons_r_u32(&rd), id = cons_r_u32(&rd);
    if (rd.err || n != r->cfg.n || id != r->cfg.id)
        return FK_EMALFORMED;
    if (magic == NOP_META_LOG_MAGIC) {
        int rc = nop__restore_meta_durable(r, &rd); /* written in durable mode */
        r->meta_seen = rc == 0;
        return rc;
    }
    struct nop_view v = nop__unpack(cons_r_u64(&rd));
    struct nop_view ln = nop__unpack(cons_r_u64(&rd));
    uint64_t sess_start = cons_r_u64(&rd);
    if (cons_r_done(&rd) < 0 || magic != NOP_META_MAGIC || ln.leader_num > v.leader_num ||
        ln.session > v.session)
        return FK_EMALFORMED;
    /* The replica was normal in ln, so f+1 replicas reached a view >= ln:
     * recovery may insist on it (rec_floor). The view it was changing to
     * may never have started anywhere, so it is not a floor. */
    r->view = r->last_normal = r->rec_floor = ln;
    r->sess_start = sess_start;
    r->meta_seen = 1;
    return 0;
}

int nop_restore_snapshot(struct nop *r, const uint8_t *buf, size_t len)
{
    if (r->started)
        return FK_EINVAL;
    struct cons_rbuf rd;
    cons_rbuf_init(&rd, buf, len);
    uint32_t magic = cons_r_u32(&rd);
    uint64_t index = cons_r_u64(&rd);
    if (cons_r_done(&rd) < 0 || magic != NOP_TRIM_MAGIC)
        return FK_EMALFORMED;
    r->snap = r->synced = r->commit = r->log_len = index;
    return 0;
}

/* One entry of a run; FK_EMALFORMED on bad bytes. */
static int get_entry_body(struct cons_rbuf *rd, struct nop_entry *e)
{
    e->kind = cons_r_u8(rd);
    if (e->kind == NOP_ENT_REQ) {
        if (cons_wire_get_op(rd, &e->op) < 0 || e->op.type == CONS_OP_NOOP || e->op.ext != NULL)
            return FK_EMALFORMED; /* NOPaxos ops fit inline (NOP_OP_MAX) */
    } else if (e->kind == NOP_ENT_NOOP) {
        memset(&e->op, 0, CONS_OP_HEAD);
        e->op.ext = NULL;
    } else {
        return FK_EMALFORMED;
    }
    return rd->err ? FK_EMALFORMED : 0;
}

int nop_restore_entry(struct nop *r, const uint8_t *buf, size_t len)
{
    if (r->started)
        return FK_EINVAL;
    struct nop_entry e;
    struct cons_rbuf rd;
    cons_rbuf_init(&rd, buf, len);
    uint64_t first = cons_r_u64(&rd);
    if (rd.err || first == 0)
        return FK_EMALFORMED;
    /* Bounded by len: every entry takes at least its kind byte. */
    uint64_t slot = first;
    do {
        if (get_entry_body(&rd, &e) < 0 || slot == UINT64_MAX)
            return FK_EMALFORMED;
        if (slot > r->snap + r->cfg.log_cap)
            return FK_EINVAL;
        if (slot > r->snap) { /* else at or below the trim point */
            nop__entry_copy(nop__ent(r, slot), &e);
            /* Until start executes them, the signature slot marks a
             * restored entry with its own index (exec_sig starts zeroed,
             * nop_create). */
            *nop__sig(r, slot) = slot;
        }
        if (slot > r->rest_hi)
            r->rest_hi = slot;
        slot++;
    } while (rd.off < rd.len);
    return 0;
}

/* The planted bug NOP_BUG_RESTORE_NO_RECOVERY: resume normal operation in
 * the persisted view with the persisted prefix, forgetting every entry it
 * acknowledged but had not yet seen committed. */
static void resume_without_recovery(struct nop *r)
{
    r->status = NOP_NORMAL;
    r->view = r->last_normal;
    r->last_heard = r->next_sync = r->now;
    r->synced = r->log_len;
}

void nop__check_machine(struct nop *r, uint64_t upto)
{
    if (nop__needs_state(r))
        return; /* behind the trim point: it fetches a state */
    /* A leader's machine past its committed prefix goes back to it with
     * the undo records it stashed (nop_undo.c). */
    if (r->executed > upto && nop__undo_to(r, upto) < 0) {
        if (!r->poisoned)
            nop__reset_state(r);
        return;
    }
    for (uint64_t s = r->snap + 1; s <= r->executed; s++) {
        if (*nop__sig(r, s) != s) {
            nop__reset_state(r);
            return;
        }
    }
    for (uint64_t s = r->snap + 1; s <= r->executed; s++)
        *nop__sig(r, s) = nop__entry_hash(nop__ent(r, s));
}

int nop__start_restored(struct nop *r)
{
    FK_ASSERT(r->meta_seen && r->started);
    if (r->cfg.durable && r->rest_log && !(r->cfg.bugs & NOP_BUG_RESTORE_NO_RECOVERY))
        return nop__start_from_log(r); /* nop_durable.c */
    uint64_t have = r->snap;
    while (have < r->snap + r->cfg.log_cap && *nop__sig(r, have + 1) == have + 1)
        have++;
    /* A disk of durable mode holds uncommitted entries too: only its
     * committed prefix is committed state. */
    if (r->rest_log && have > r->rest_commit)
        have = r->rest_commit > r->snap ? r->rest_commit : r->snap;
    /* The machine is committed state if the disk's committed entries
     * reach its mark (a leader's machine may be past them: it executed
     * speculatively, section 5.2.1, and cannot be checked). */
    nop__check_machine(r, have);
    r->log_len = r->commit = r->synced = have;
    nop__execute_to(r, have, 0);
    /* The disk holds this much already. */
    r->pers_snap = r->snap;
    r->pers_upto = have;
    r->dirty_lo = have + 1;
    if (r->cfg.bugs & NOP_BUG_RESTORE_NO_RECOVERY)
        resume_without_recovery(r);
    else
        nop__recover_start(r);
    return 0;
}
