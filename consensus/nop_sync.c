/* nop_sync.c: NOPaxos synchronization (section 5.2.4): the leader brings
 * followers to its log and commit point, from its ring, its history of
 * compacted entries, or a state transfer. */
#include "nop_internal.h"

#include "fk_assert.h"
#include "fk_error.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- synchronization (section 5.2.4) ----------------------------------------- */

/* Synchronization sends each follower, by default, only the hashes of the
 * leader's entries after its synced prefix (SYNC_SIG): its log came over
 * the OUM and normally matches, so entries travel again (SYNC, at most
 * NOP_SYNC_ENTRIES) only to a follower that reported a differing entry or
 * made no progress between two heartbeats. A prefix confirmed this way is
 * what the paper's SYNC-PREPARE / SYNC-REPLY establish: entries identical
 * to the leader's. Below the leader's snap the hashes come from the
 * committed history and the entries from what the ring still holds; only
 * a follower behind both is told to fetch a state (STATE). */
static uint32_t sync_count(const struct nop *r, uint32_t p)
{
    uint64_t lo = r->acked[p] + 1;
    uint32_t max = r->need_full[p] ? NOP_SYNC_ENTRIES : NOP_SYNC_SIGS;
    return r->log_len >= lo ? (uint32_t)(r->log_len - lo + 1 < max ? r->log_len - lo + 1 : max) : 0;
}

/* 1 when follower p's next sync needs a state: it starts below the
 * leader's snap where the history (hashes) or the ring (entries) no
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

/* Entries from the history (cons_hist.h) for follower p, behind what the
 * ring and the hashes reach: a SYNC from lo with as many as its ring can
 * take before it executes and compacts (half a ring) within
 * NOP_SYNC_PAST_BYTES. A wiped follower that fetched a state for seconds
 * under load finds its state behind the ring; without these it fetched a
 * state again, and again while the load went on. */
static void send_past(struct nop *r, uint32_t p, uint64_t lo)
{
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_SYNC, nop__pack(r->view));
    cons_w_u64(&w, r->commit);
    cons_w_u64(&w, lo);
    size_t count_at = w.len;
    cons_w_u32(&w, 0);
    size_t end = w.len + NOP_SYNC_PAST_BYTES;
    if (w.err || w.cap - w.len < 8)
        return; /* the arena is full this step: the next heartbeat sends it */
    if (end > w.cap - 8)
        end = w.cap - 8; /* room for safe */
    uint32_t n = 0;
    for (uint64_t i = lo; i <= r->snap && n < r->cfg.log_cap / 2; i++, n++) {
        uint32_t len = cons_hist_get(&r->past, i, w.p + w.len, end - w.len);
        if (len == 0 || len > end - w.len)
            break;
        w.len += len;
    }
    if (n == 0)
        return;
    memcpy(w.p + count_at, &n, sizeof n);
    cons_w_u64(&w, nop__leader_safe(r));
    nop__send(r, &w, cons_replica(p));
    r->sync_out[p] = 1;
    r->syncs[NOP_SYNC_KIND_PAST]++;
}

/* state_ok 0: a follower that needs a state gets nothing now (the
 * eager path leaves it to the heartbeat). */
void nop__send_sync(struct nop *r, uint32_t p, int state_ok)
{
    struct cons_wbuf w;
    int state = needs_state(r, p);
    if (state && cons_hist_has(&r->past, r->acked[p] + 1)) {
        send_past(r, p, r->acked[p] + 1);
        return;
    }
    if (state && !state_ok)
        return;
    r->sync_out[p] = 1;
    if (state) {
        /* What it lacks was compacted: it fetches a state (cons_xfer). */
        nop__begin(r, &w, NOP_STATE, nop__pack(r->view));
        cons_w_u64(&w, r->sess_start);
        cons_w_u64(&w, r->commit);
        cons_w_u64(&w, r->snap);
        nop__put_hist(r, &w);
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
        cons_w_u64(&w, nop__leader_safe(r));
        nop__send(r, &w, cons_replica(p));
        return;
    }
    nop__begin(r, &w, NOP_SYNC, nop__pack(r->view));
    cons_w_u64(&w, r->commit);
    nop__put_segment(r, &w, lo, hi);
    cons_w_u64(&w, nop__leader_safe(r));
    nop__send(r, &w, cons_replica(p));
}

/* Eager synchronization: a follower log_cap / 16 entries behind (any
 * entry once compaction is due) is synced now rather than at the next
 * heartbeat, unless it needs a state (that notice waits for the
 * heartbeat). The leader stops taking requests three quarters of a ring
 * past snap until f+1 confirm enough to compact (maybe_compact); with
 * syncs only every heartbeat a busy leader spent most of its time there. */
void nop__sync_eager(struct nop *r)
{
    /* Durable mode: the leader answers only once a slot commits, so every
     * step that appended syncs. */
    uint64_t behind = r->cfg.log_cap / 16 > 0 && !r->cfg.durable ? r->cfg.log_cap / 16 : 1;
    if (!nop__is_leader(r) || r->status != NOP_NORMAL)
        return;
    if (r->log_len - r->snap >= r->cfg.log_cap / 2)
        behind = 1; /* due for compaction: it waits for f+1 */
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id && !r->sync_out[p] && r->log_len - r->acked[p] >= behind)
            nop__send_sync(r, p, 0);
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
    cons_w_u64(&w, r->executed);
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
void nop__on_sync_sig(struct nop *r, const struct nop_msg *m)
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
    if (m->u4 > r->safe)
        r->safe = m->u4;
    follow_commit(r, m->u1);
    send_sync_rep(r, m->from, differed ? NOP_SYNC_REP_DIFFERED : 0, m->lo);
    nop__drain(r);
}

/* A follower adopts the leader's entries (NO-OPs included), extends its
 * synced prefix when contiguous, and executes what the leader committed. */
void nop__on_sync(struct nop *r, const struct nop_msg *m)
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
        nop__follower_put(r, i, &e);
        /* Ahead of its OUM copy (which will be an old number now): the
         * client still counts this replica, as after GAP-RECV. Not for a
         * slot a ring or more below the leader's commit point (entries
         * from its history, send_past): f+1 replicas, the leader among
         * them, answered it as they logged it, long ago, and a follower
         * catching up would answer thousands of finished requests. */
        if (r->log_len > before && e.kind == NOP_ENT_REQ && i + r->cfg.log_cap > m->u1)
            nop__ack_request(r, r->log_len, &e.op);
    }
    if (m->lo <= r->synced + 1 && i - 1 > r->synced)
        r->synced = i - 1;
    if (m->u4 > r->safe)
        r->safe = m->u4;
    follow_commit(r, m->u1);
    send_sync_rep(r, m->from, NOP_SYNC_REP_FULL, m->lo);
    nop__drain(r);
}

/* The leader compacted what this follower lacks, up to m->u3: the ring
 * restarts there (the log after it stays: within a view a follower's log
 * never loses a request it acknowledged to a client, who may count that
 * reply) and the follower fetches a state at or past it (maybe_fetch). */
void nop__on_state(struct nop *r, const struct nop_msg *m)
{
    r->last_heard = r->now;
    if (m->u3 > r->snap && m->u3 > r->commit) {
        uint64_t len = r->log_len;
        nop__restart_ring(r, m->u3, 1, m);
        r->sess_start = m->u1;
        if (r->log_len != len) {
            r->find_slot = 0;
            nop__oum_clear(r);
        }
    }
    send_sync_rep(r, m->from, NOP_SYNC_REP_FULL, m->u3);
}

/* The leader's commit point is the largest slot that f+1 replicas hold
 * exactly as the leader does (itself included; in durable mode every
 * follower's synced prefix is durable on the leader too, nop_durable.c). */
void nop__on_sync_rep(struct nop *r, const struct nop_msg *m)
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
    if (m->u4 > r->exec_of[from])
        r->exec_of[from] = m->u4;
    int still = got < asked && got < r->log_len;
    r->acked[from] = got;
    r->sync_out[from] = (uint8_t)(still && (m->u2 & NOP_SYNC_REP_FULL));
    r->need_full[from] = (m->u2 & NOP_SYNC_REP_DIFFERED) || still;
    uint64_t c = nop__quorum_point(r, r->log_len, r->acked);
    if (c > r->commit)
        r->commit = c;
}
