/* nop_durable.c: NOPaxos durable mode (nop_config.durable = 1): every
 * acknowledgement waits for the disk, so a group whose replicas ALL crash
 * and restart from their disks loses nothing it acknowledged and serves
 * again. The default mode (nop_disk.c) keeps the paper's diskless argument
 * and cannot do either.
 *
 * What is persisted (at the end of every step, in this order, so that the
 * driver's in-order durability never exposes a META ahead of its log):
 *  - SNAPSHOT: the checkpoint whenever it moved past the one on disk;
 *  - ENTRY: every log slot whose disk copy may differ from the log, from
 *    dirty_lo up to log_len, committed or not (every write to the log
 *    calls nop__touch; a view change rewrites the whole log after the
 *    checkpoint);
 *  - META (durable layout): view, last normal view, session start, log
 *    length and commit point, written only once every dirty slot is. A
 *    restart reads the log up to that length; entries beyond it are stale
 *    and ignored.
 *
 * The output rule: a message made by a step leaves only once the driver
 * reported durable every persist item issued up to the end of that step
 * (nop__hold keeps it, with its bytes, until then). So every message a
 * replica ever sent -- a reply with or without a result (5.2.1), a
 * GAP-COMMIT-REPLY (5.2.2), a SYNC-REPLY (5.2.4), a VIEW-CHANGE or
 * START-VIEW (5.2.3), a RECOVERY-REPLY (5.3.2) -- describes a state that
 * its disk held before the message left. A slot the leader calls
 * committed is durable on f+1 replicas without the leader waiting for its
 * own disk: the commit point is the (f+1)-th largest of the synced
 * prefixes (its own log counting as the largest), a follower's synced
 * prefix only ever grows from the leader's SYNC, START-VIEW, STATE or
 * RECOVERY-REPLY, which left once the leader's log up to there was
 * durable, and its SYNC-REPLY once its own was.
 *
 * Restart from a durable disk (NOP_START_RESTORED): the replica takes its
 * persisted (last normal view, log) as its state and starts a view change
 * to a view above its persisted one. Why this is safe, after the view
 * change argument of section 5.2.3 (and VR's, which it follows): that
 * argument needs, for an operation that completed in view L (f+1 replies
 * for one slot, the leader's among them), that every VIEW-CHANGE quorum
 * whose newest last-normal view is L holds it at its slot in some log
 * tagged L, and that newer views' logs hold it too. A restored replica's
 * VIEW-CHANGE carries exactly what its disk held:
 *  1. Each of the f+1 replicas that replied had the operation in its log
 *     and last_normal = L on disk before the reply left (output rule).
 *     Its disk's last normal view never decreases afterwards (views only
 *     grow, META is written in order), and its log keeps the operation at
 *     that slot while the tag stays L: within view L a slot is replaced
 *     only by the leader's entry (a gap NO-OP, impossible where the
 *     leader sent a result), and a new view's log, which replaces it when
 *     the tag moves past L, holds every operation completed before that
 *     view (induction on views, as in the paper).
 *  2. A crash in the middle of a step leaves a prefix of its persists:
 *     some slots already rewritten with a newer view's log (START-VIEW,
 *     a merge, a recovery reply) under the older META. Such a log is still
 *     a valid log tagged with the older view: the newer view's entries
 *     agree with every operation completed in the older one at its slot
 *     (its log was merged from f+1 logs, so point 1 applies to it), a
 *     NO-OP can come only from a slot where nothing completed, and the
 *     length comes from the older META, which covers every slot the
 *     replica acknowledged under that tag. Operations completed in a
 *     newer view need f+1 replicas whose disks carry that newer tag, so a
 *     quorum whose newest tag is the older view has none to lose.
 *  3. Having restored, the replica never acts in its persisted view or
 *     below on its own log: the view change goes to a higher one, exactly
 *     what a replica that was cut off and timed out does (5.2.3). Its
 *     messages sent before the crash described states its disk held then,
 *     so its restored state is one the protocol already allowed it to be
 *     in; what it lost (unpersisted appends, executions, pending gap
 *     agreement) was never visible to anybody. A follower of a view it
 *     was normal in asks that view's leader first (a VIEW-CHANGE for the
 *     same view, which a leader in normal status answers with START-VIEW,
 *     as it does a follower that missed it) and acts in it again only
 *     with the leader's log: within a view the leader's log is the one
 *     every follower's promises agree with (a follower's entries differ
 *     from it only where the leader decided a NO-OP, and a follower's
 *     reply completes nothing without the leader's). Without an answer
 *     within the view-change timeout it goes to a higher view. So a
 *     follower's restart no longer moves the group to a new view and a
 *     new leader (README, "Status": a rolling restart's unavailability).
 * A replica restarted EMPTY has no log: it is RECOVERING and sends no
 * VIEW-CHANGE until it recovered (5.3.2) from f+1 replicas in normal
 * status, so it never counts in a quorum with a log it does not hold. An
 * operation acknowledged by f+1 replicas survives as long as fewer than
 * f+1 of them lose their disks: f+1 restored replicas (a view change
 * quorum) then include one holding it, with the newest tag (point 1). */
#include "nop_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

/* ---- persisting ---------------------------------------------------------- */

static int persist_meta_log(struct nop *r)
{
    uint64_t meta[5] = {nop__pack(r->view), nop__pack(r->last_normal), r->sess_start, r->log_len,
                        r->commit};
    if (r->pers_meta_ok && memcmp(meta, r->pers_meta, sizeof meta) == 0)
        return 0;
    struct cons_wbuf w;
    nop__item_begin(r, &w);
    cons_w_u32(&w, NOP_META_LOG_MAGIC);
    cons_w_u32(&w, r->cfg.n);
    cons_w_u32(&w, r->cfg.id);
    for (int k = 0; k < 5; k++)
        cons_w_u64(&w, meta[k]);
    if (nop__item_end(r, CONS_PERSIST_META, 0, &w) < 0)
        return FK_EFULL;
    memcpy(r->pers_meta, meta, sizeof meta);
    r->pers_meta_ok = 1;
    return 0;
}

void nop__persist_durable(struct nop *r)
{
    FK_ASSERT(r->cfg.durable && r->status != NOP_RECOVERING);
    struct cons_wbuf w;
    r->pers_done = 0;
    if (r->snap > r->pers_snap) {
        if (nop__persist_trim(r, r->snap) < 0)
            return; /* what follows waits for it; the next step goes on */
        r->pers_snap = r->snap;
        if (r->pers_upto < r->snap)
            r->pers_upto = r->snap;
    }
    if (r->dirty_lo <= r->snap)
        r->dirty_lo = r->snap + 1; /* compacted now */
    while (r->dirty_lo <= r->log_len) {
        if (r->ob.npersists + 2 > CONS_OUT_PERSIST_MAX)
            return; /* keep room for META; the rest goes in later steps */
        nop__item_begin(r, &w);
        nop__put_entry(&w, r->dirty_lo, nop__ent(r, r->dirty_lo));
        if (nop__item_end(r, CONS_PERSIST_ENTRY, r->dirty_lo, &w) < 0)
            return;
        r->dirty_lo++;
    }
    if (r->commit > r->pers_upto)
        r->pers_upto = r->commit;
    r->pers_done = persist_meta_log(r) == 0;
}

/* ---- restoring --------------------------------------------------------------- */

int nop__restore_meta_durable(struct nop *r, struct cons_rbuf *rd)
{
    struct nop_view v = nop__unpack(cons_r_u64(rd));
    struct nop_view ln = nop__unpack(cons_r_u64(rd));
    uint64_t sess_start = cons_r_u64(rd), len = cons_r_u64(rd), commit = cons_r_u64(rd);
    if (cons_r_done(rd) < 0 || ln.leader_num > v.leader_num || ln.session > v.session ||
        commit > len)
        return FK_EMALFORMED;
    r->view = v;
    r->last_normal = r->rec_floor = ln;
    r->sess_start = sess_start;
    r->rest_log = 1;
    r->rest_view = v;
    r->rest_len = len;
    r->rest_commit = commit;
    return 0;
}

int nop__start_from_log(struct nop *r)
{
    FK_ASSERT(r->cfg.durable && r->rest_log && r->started);
    uint64_t len = r->rest_len > r->snap ? r->rest_len : r->snap;
    if (len > r->snap + r->cfg.log_cap)
        return FK_EMALFORMED;
    for (uint64_t s = r->snap + 1; s <= len; s++) {
        if (*nop__sig(r, s) != s)
            return FK_EMALFORMED; /* a hole: nop_restore_entry marks what it restored */
    }
    r->log_len = len;
    r->pers_snap = r->snap; /* the disk's trim point */
    r->commit = r->rest_commit < r->snap ? r->snap : r->rest_commit;
    /* The machine holds committed slots only (durable mode executes
     * nothing else), possibly past META's commit point, which lags when a
     * step's persists did not all fit. Its slots need no check (nothing
     * it executed can be replaced), so the ring stays as the disk has it;
     * the entries on disk for those slots may still be older copies that
     * the view change replaces. Only a machine past the persisted log
     * restarts the ring after it. */
    if (!nop__needs_state(r) && r->executed > r->log_len)
        r->snap = r->log_len = r->commit = r->executed;
    r->synced = r->commit;
    nop__execute_to(r, r->commit, 0);
    r->pers_upto = r->commit;
    r->dirty_lo = r->log_len + 1; /* the disk holds this log */
    r->view = r->rest_view;
    /* Point 3 above: never act in the persisted view again on this log; a
     * follower of a normal view asks its leader for the view's log. */
    if (nop__view_eq(r->view, r->last_normal) && nop__leader_of(r, r->view) != r->cfg.id) {
        nop__start_view_change(r, r->view);
        return 0;
    }
    struct nop_view v = {r->view.leader_num + 1, r->view.session};
    nop__start_view_change(r, v);
    return 0;
}

/* ---- holding messages until durable ----------------------------------------- */

/* Reserves len bytes at the tail of the byte ring. */
static int held_alloc(struct nop *r, uint32_t len, size_t *off)
{
    if (r->held_n == NOP_HELD_MAX || len > r->held_cap)
        return FK_EFULL;
    if (r->held_n == 0) {
        r->hb_head = r->hb_tail = 0;
        r->hb_wrap = 0;
    }
    if (!r->hb_wrap && r->held_cap - r->hb_tail < len) {
        if (r->hb_head < len)
            return FK_EFULL;
        r->hb_tail = 0; /* wrap: the end of the buffer stays unused */
        r->hb_wrap = 1;
    }
    if (r->hb_wrap && r->hb_head - r->hb_tail < len)
        return FK_EFULL;
    *off = r->hb_tail;
    r->hb_tail += len;
    return 0;
}

static void held_pop(struct nop *r)
{
    FK_ASSERT(r->held_n > 0);
    r->held_head = (r->held_head + 1) % NOP_HELD_MAX;
    if (--r->held_n == 0) {
        r->hb_head = r->hb_tail = 0;
        r->hb_wrap = 0;
        return;
    }
    size_t next = r->held[r->held_head].off;
    if (next < r->hb_head)
        r->hb_wrap = 0; /* the head went back to the start */
    r->hb_head = next;
}

/* Moves the held messages that are durable now into the outbox, in order,
 * as far as the outbox has room (the rest go with a later step). */
static void release(struct nop *r)
{
    while (r->held_n) {
        const struct nop_held *h = &r->held[r->held_head];
        if (h->cookie > r->durable || r->ob.nmsgs >= CONS_OUT_MSGS_MAX)
            return;
        uint8_t *dst = cons_outbox_alloc(&r->ob, h->len);
        if (!dst)
            return;
        memcpy(dst, r->held_buf + h->off, h->len);
        cons_outbox_msg(&r->ob, h->to, dst, h->len);
        held_pop(r);
    }
}

/* Copies message m into the held ring, waiting for cookie. A full ring
 * drops it, like a lost message (every sender retries or is retried). */
static void hold_one(struct nop *r, const struct cons_out_msg *m, uint64_t cookie)
{
    size_t off;
    if (held_alloc(r, m->len, &off) < 0) {
        r->held_dropped++;
        r->ob.dropped++;
        return;
    }
    memcpy(r->held_buf + off, m->buf, m->len);
    struct nop_held *h = &r->held[(r->held_head + r->held_n) % NOP_HELD_MAX];
    h->to = m->to;
    h->cookie = cookie;
    h->off = off;
    h->len = m->len;
    r->held_n++;
}

void nop__hold(struct nop *r)
{
    if (!r->cfg.durable)
        return;
    /* A recovering replica holds no state its messages (RECOVERY) promise. */
    int done = r->pers_done || r->status == NOP_RECOVERING;
    uint64_t cookie = done ? r->next_cookie : UINT64_MAX;
    for (uint32_t i = r->held_n; done && i-- > 0;) {
        struct nop_held *h = &r->held[(r->held_head + i) % NOP_HELD_MAX];
        if (h->cookie != UINT64_MAX)
            break; /* only a tail of the FIFO waits for its cookie */
        h->cookie = cookie;
    }
    if (r->held_n == 0 && cookie <= r->durable)
        return; /* everything this step depends on is durable: send now */
    uint32_t keep = 0;
    for (uint32_t k = 0; k < r->ob.nmsgs; k++) {
        const struct cons_out_msg *m = &r->ob.msgs[k];
        if ((r->cfg.bugs & NOP_BUG_REPLY_UNPERSISTED) && m->to.kind == CONS_ADDR_CLIENT)
            r->ob.msgs[keep++] = *m; /* planted bug: replies do not wait */
        else
            hold_one(r, m, cookie);
    }
    r->ob.nmsgs = keep;
    release(r);
}
