/* nop_view.c: NOPaxos view change (section 5.2.3), including session
 * changes when the sequencer fails over, and replica recovery (5.3.2). */
#include "nop_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

static struct nop_view view_max(struct nop_view a, struct nop_view b)
{
    struct nop_view m = {a.leader_num > b.leader_num ? a.leader_num : b.leader_num,
                         a.session > b.session ? a.session : b.session};
    return m;
}

static int newer(struct nop_view a, struct nop_view b)
{
    return a.leader_num > b.leader_num || a.session > b.session;
}

/* VIEW-CHANGE: my latest normal view, session start and whole log. */
static void send_vc(struct nop *r)
{
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_VC, nop__pack(r->view));
    cons_w_u64(&w, nop__pack(r->last_normal));
    cons_w_u64(&w, r->sess_start);
    cons_w_u64(&w, r->commit);
    nop__put_segment(r, &w, r->snap + 1, r->log_len);
    nop__put_hist(r, &w);
    nop__send(r, &w, cons_replica(nop__leader_of(r, r->view)));
}

void nop__start_view_change(struct nop *r, struct nop_view v)
{
    FK_ASSERT(r->status != NOP_RECOVERING);
    FK_ASSERT(v.leader_num >= r->view.leader_num && v.session >= r->view.session);
    /* Views held for a transfer until their index commits (cons_xfer.h):
     * what this replica executed past its commit point may now go. */
    cons_xfer_close_above(&r->xfer, r->commit);
    r->serve_hold = 0;
    r->view = v;
    r->status = NOP_VIEWCHANGE;
    r->vc_since = r->now;
    r->vc_next = r->now + r->cfg.heartbeat_ns;
    r->gap_slot = 0;
    r->find_slot = 0;
    nop__oum_clear(r);
    r->vc_from = 0;
    if (nop__leader_of(r, v) == r->cfg.id) {
        r->vc_from = 1ull << r->cfg.id; /* my own log is the first of f+1 */
        r->vc_best = r->last_normal;
    }
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id)
            nop__send_u64(r, p, NOP_VC_REQ, 0);
    }
    if (nop__leader_of(r, v) != r->cfg.id)
        send_vc(r);
}

void nop__on_vc_req(struct nop *r, const struct nop_msg *m)
{
    struct nop_view v = nop__unpack(m->term);
    if (newer(v, r->view))
        nop__start_view_change(r, view_max(v, r->view));
}

static void send_start_view(struct nop *r, uint32_t to)
{
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_START_VIEW, nop__pack(r->view));
    cons_w_u64(&w, r->sess_start);
    cons_w_u64(&w, r->commit);
    nop__put_segment(r, &w, r->snap + 1, r->log_len);
    nop__put_hist(r, &w);
    nop__send(r, &w, cons_replica(to));
}

/* Enters a view in normal status with the current log (adopted or merged):
 * a new session restarts message numbers after the log; a machine that
 * executed entries the log no longer holds is emptied and fetches a state
 * (nop__check_executed). */
static void enter_view(struct nop *r, int leader)
{
    r->status = NOP_NORMAL;
    r->last_normal = r->view;
    r->synced = r->log_len;
    if (r->commit > r->log_len)
        r->commit = r->log_len;
    r->gap_slot = 0;
    r->find_slot = 0;
    r->last_heard = r->now;
    nop__oum_clear(r);
    /* What each follower holds is unknown until it answers a sync: the
     * first one covers the ring after snap (hashes), and its answer says
     * where the follower is. From 0 instead, the leader found slot 1 in
     * neither its ring nor its history and told every follower to fetch
     * a state; a wiped follower whose transfer was under way moved its
     * ring past it and fetched again (three transfers in a row after a
     * sequencer failover under YCSB-B). snap <= commit: no commit moves. */
    for (uint32_t p = 0; p < r->cfg.n; p++)
        r->acked[p] = r->snap;
    memset(r->exec_of, 0, sizeof r->exec_of);
    memset(r->hb_acked, 0, sizeof r->hb_acked);
    memset(r->sync_out, 0, sizeof r->sync_out);
    memset(r->need_full, 0, sizeof r->need_full);
    r->next_sync = r->now;
    nop__check_executed(r);
    nop__execute_to(r, leader ? r->log_len : r->commit, 0);
}

static void finish_view_change(struct nop *r)
{
    FK_ASSERT(nop__leader_of(r, r->view) == r->cfg.id && r->status == NOP_VIEWCHANGE);
    if (r->vc_best.session != r->view.session)
        r->sess_start = r->log_len; /* a new session: its message 1 goes after the log */
    enter_view(r, 1);
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id)
            send_start_view(r, p);
    }
}

/* A sender's log starts after its snap (m->lo - 1), committed and
 * compacted there: this replica's ring restarts there when it has not
 * committed that far, or when the sender's log would not fit its ring
 * (nop__restart_ring; it then needs a state). Returns 0 to go on with the
 * message's entries, <0 to drop it. */
static int adopt_start(struct nop *r, const struct nop_msg *m, int keep_tail)
{
    uint64_t end = m->lo + m->nents - 1, start = m->lo - 1;
    if (m->nents > r->cfg.log_cap)
        return FK_EMALFORMED;
    if (start > r->snap && (start > r->commit || end > r->snap + r->cfg.log_cap))
        nop__restart_ring(r, start, keep_tail, m);
    return end > r->snap + r->cfg.log_cap ? FK_EMALFORMED : 0;
}

/* The new leader merges f+1 logs (section 5.2.3): only logs of the latest
 * normal view count; a NO-OP in any of them wins (it was gap-committed),
 * else a request in any of them, up to the longest. Merging as messages
 * arrive gives the same result: the rule is associative. Slots at or below
 * this replica's commit point are committed and identical everywhere, so
 * only the rest is merged. Returns <0 when the sender's log could not be
 * taken: it was not merged, so it must not count. Executed entries are
 * checked after every merge, in the step that rewrote the log: in durable
 * mode the rewritten entries reach the disk with that step, and a machine
 * on disk must never pair with a log that no longer holds what it
 * executed. */
static int merge_vc(struct nop *r, const struct nop_msg *m)
{
    struct nop_view ln = nop__unpack(m->u3);
    int cmp = nop__view_cmp(ln, r->vc_best);
    int rc = adopt_start(r, m, 1);
    if (rc < 0 || cmp < 0) {
        nop__check_executed(r);
        return rc;
    }
    uint64_t end = m->lo + m->nents - 1;
    if (cmp > 0) {
        r->vc_best = ln;
        r->sess_start = m->u1;
        r->log_len = end > r->commit ? end : r->commit;
        nop__touch(r, r->log_len + 1);
    }
    struct cons_rbuf rd = m->ents;
    struct nop_entry e;
    for (uint64_t i = m->lo; i <= end; i++) {
        nop__entry_next(&rd, &e);
        if (i <= r->commit || i > r->log_len + 1)
            continue;
        if (i == r->log_len + 1)
            nop__entry_copy(nop__ent(r, ++r->log_len), &e);
        else if (cmp > 0 || e.kind == NOP_ENT_NOOP)
            nop__entry_copy(nop__ent(r, i), &e);
        else
            continue;
        nop__touch(r, i);
    }
    nop__check_executed(r);
    return 0;
}

void nop__on_vc(struct nop *r, const struct nop_msg *m)
{
    struct nop_view v = nop__unpack(m->term);
    if (newer(v, r->view))
        nop__start_view_change(r, view_max(v, r->view));
    if (!nop__view_eq(v, r->view) || nop__leader_of(r, v) != r->cfg.id)
        return;
    if (r->status == NOP_NORMAL) {
        send_start_view(r, m->from); /* it missed START-VIEW */
        return;
    }
    if (r->vc_from >> m->from & 1)
        return;
    if (merge_vc(r, m) < 0)
        return;
    r->vc_from |= 1ull << m->from;
    if ((uint32_t)__builtin_popcountll(r->vc_from) >= r->f + 1)
        finish_view_change(r);
}

void nop__on_start_view(struct nop *r, const struct nop_msg *m)
{
    struct nop_view v = nop__unpack(m->term);
    if (m->from != nop__leader_of(r, v) || v.leader_num < r->view.leader_num ||
        v.session < r->view.session || (r->status == NOP_NORMAL && nop__view_eq(v, r->view)))
        return;
    /* Every slot this replica committed is in every later view's log
     * (section 5.2.3): a log that ends before them is no leader's, and
     * taking it cut the log below what the machine executed (fuzz_nop,
     * a durable replica restored with 9 slots executed, then an empty
     * START-VIEW). */
    if (m->lo + m->nents - 1 < r->commit)
        return;
    if (adopt_start(r, m, 0) < 0)
        return;
    /* The view's log: mine up to the sender's snap (committed here, or
     * compacted away), the leader's after it. */
    uint64_t end = m->lo + m->nents - 1;
    struct cons_rbuf rd = m->ents;
    struct nop_entry e;
    for (uint64_t i = m->lo; i <= end; i++) {
        nop__entry_next(&rd, &e);
        if (i > r->snap) {
            nop__entry_copy(nop__ent(r, i), &e);
            nop__touch(r, i);
        }
    }
    r->view = v;
    r->log_len = end > r->snap ? end : r->snap;
    nop__touch(r, r->log_len + 1);
    r->sess_start = m->u1;
    uint64_t c = m->u2 < r->log_len ? m->u2 : r->log_len;
    if (c > r->commit)
        r->commit = c;
    enter_view(r, 0);
}

void nop__vc_tick(struct nop *r)
{
    if (r->now - r->vc_since >= r->cfg.election_ns) {
        struct nop_view v = {r->view.leader_num + 1, r->view.session};
        nop__start_view_change(r, v); /* this view's leader did not finish: next */
        return;
    }
    if (r->now < r->vc_next)
        return;
    r->vc_next = r->now + r->cfg.heartbeat_ns;
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id)
            nop__send_u64(r, p, NOP_VC_REQ, 0);
    }
    if (nop__leader_of(r, r->view) != r->cfg.id)
        send_vc(r);
}

/* ---- recovery (section 5.3.2, after VR's recovery protocol) -------------- */

void nop__recover_start(struct nop *r)
{
    r->status = NOP_RECOVERING;
    r->nonce = (r->rng = r->rng * 6364136223846793005ULL + 1442695040888963407ULL) | 1;
    r->rec_from = 0;
    r->rec_have_leader = 0;
    memset(&r->rec_view, 0, sizeof r->rec_view);
    r->rec_next = r->now;
    /* What this replica holds is committed state (empty, or restored from
     * its disk, nop_disk.c): a leader may send only what comes after it.
     * A machine behind its ring (a trimmed disk whose state went) has no
     * prefix to offer: it asks for the leader's whole log. */
    r->rec_base = r->executed;
    r->rec_base_ok = !nop__needs_state(r);
    if (nop__needs_state(r))
        r->log_len = r->synced = r->commit = r->snap;
    FK_ASSERT(r->executed == r->log_len || nop__needs_state(r));
    nop__recover_tick(r);
}

void nop__recover_tick(struct nop *r)
{
    if (r->now < r->rec_next)
        return;
    r->rec_next = r->now + r->cfg.heartbeat_ns;
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p == r->cfg.id)
            continue;
        struct cons_wbuf w;
        nop__begin(r, &w, NOP_RECOVERY, 0);
        cons_w_u64(&w, r->nonce);
        cons_w_u64(&w, r->rec_base_ok ? r->rec_base : 0);
        cons_w_u64(&w, r->rec_base_ok ? r->snap : 0);
        nop__send(r, &w, cons_replica(p));
    }
}

/* Whether the requester's committed prefix `have` (trim point rsnap)
 * can be joined with this leader's log after it: the leader holds the
 * slots after have, and its log fits the requester's ring. */
static int joinable(const struct nop *r, uint64_t have, uint64_t rsnap)
{
    return have >= 1 && have >= r->snap && have <= r->log_len && rsnap <= have &&
           r->log_len <= rsnap + r->cfg.log_cap;
}

/* Only a replica in normal status answers; the leader adds its log: after
 * the requester's restored prefix when it can be joined (nop_disk.c
 * argues why that is safe), else its whole ring. */
void nop__on_recovery(struct nop *r, const struct nop_msg *m)
{
    if (r->status != NOP_NORMAL)
        return;
    int leader = nop__is_leader(r);
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_RECOVERY_REP, nop__pack(r->view));
    cons_w_u64(&w, m->u1);
    cons_w_u8(&w, (uint8_t)leader);
    cons_w_u64(&w, r->sess_start);
    cons_w_u64(&w, r->commit);
    if (leader && joinable(r, m->u2, m->u3))
        nop__put_segment(r, &w, m->u2 + 1, r->log_len);
    else if (leader)
        nop__put_segment(r, &w, r->snap + 1, r->log_len);
    else
        nop__put_segment(r, &w, 1, 0);
    nop__put_hist(r, &w);
    nop__send(r, &w, cons_replica(m->from));
}

/* The leader's log replaces whatever a previous (older) leader reply gave:
 * either the log after this replica's committed prefix (still in place),
 * or the leader's whole ring, after its snap. With the whole ring the
 * ring restarts at the leader's snap: a machine behind it needs a state
 * (nop__needs_state); one past it holds a committed prefix, whose slots
 * the leader's log holds identically (nop_disk.c), so they count as
 * executed. */
static int take_leader_log(struct nop *r, const struct nop_msg *m)
{
    struct cons_rbuf rd = m->ents;
    uint64_t start = m->lo - 1, end = start + m->nents;
    if (r->rec_base_ok && start == r->rec_base && end <= r->snap + r->cfg.log_cap) {
        FK_ASSERT(r->executed == r->rec_base);
        r->log_len = r->rec_base;
    } else {
        if (r->executed > end)
            return FK_EPROTO; /* an older leader's shorter log: wait for another */
        r->snap = r->log_len = r->synced = start;
        if (r->commit < start)
            r->commit = start;
        r->rec_base_ok = 0; /* later requests ask for everything */
    }
    nop__touch(r, r->log_len + 1);
    for (uint32_t i = 0; i < m->nents; i++)
        nop__entry_next(&rd, nop__ent(r, ++r->log_len));
    for (uint64_t i = r->snap + 1; i <= r->executed; i++)
        *nop__sig(r, i) = nop__entry_hash(nop__ent(r, i));
    return 0;
}

/* Rejoins once f+1 replicas answered and the leader of the newest view
 * among them sent its log: that log holds every operation a client may
 * have seen complete, so forgetting this replica's own lost log is safe. */
void nop__on_recovery_rep(struct nop *r, const struct nop_msg *m)
{
    struct nop_view v = nop__unpack(m->term);
    if (m->u1 != r->nonce || nop__view_cmp(v, r->rec_floor) < 0)
        return; /* another request's, or older than a view this replica was normal in */
    r->rec_from |= 1ull << m->from;
    if (nop__view_cmp(v, r->rec_view) > 0)
        r->rec_view = v;
    if (m->flag && m->nents <= r->cfg.log_cap &&
        (!r->rec_have_leader || nop__view_cmp(v, r->rec_leader_view) > 0) &&
        take_leader_log(r, m) == 0) {
        r->sess_start = m->u2;
        r->rec_commit = m->u3 < r->log_len ? m->u3 : r->log_len;
        if (r->rec_commit < r->executed)
            r->rec_commit = r->executed; /* the restored prefix: committed */
        r->rec_leader_view = v;
        r->rec_have_leader = 1;
    }
    if ((uint32_t)__builtin_popcountll(r->rec_from) < r->f + 1 || !r->rec_have_leader ||
        !nop__view_eq(r->rec_leader_view, r->rec_view))
        return;
    r->view = r->rec_view;
    r->commit = r->rec_commit;
    enter_view(r, 0);
}
