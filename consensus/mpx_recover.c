/* mpx_recover.c: a replica that lost its disk rejoins safely.
 *
 * Why not just fetch a snapshot from the leader: a replica that forgets
 * what it promised or accepted can break quorum intersection (it may have
 * been the one member of a quorum that holds a chosen value). So, like
 * Viewstamped Replication's recovery (Liskov and Cowling 2012, section 4.3)
 * and NOPaxos section 5.3.2, it asks under a fresh nonce and waits for f+1
 * OTHER replicas. Any f+1 others include a member of every quorum that
 * included it, so: the highest promise among them bounds any promise it
 * made, and for each slot after the highest snapshot the highest-ballot
 * entry among them (the phase 1 rule) carries any value that was chosen.
 * It persists that state and only then acts as an acceptor again. */
#include "mpx_internal.h"

#include "fk_error.h"

#include <assert.h>
#include <string.h>

void mpx__recover_start(struct mpx *r)
{
    r->role = MPX_RECOVERING;
    r->nonce = mpx__rand(r) | 1;
    r->rec_from = 0;
    r->rec_n = 0;
    r->rec_promised = 0;
    r->rec_wait = 0;
    r->next_heartbeat = r->now;
    mpx__recover_tick(r);
}

void mpx__recover_tick(struct mpx *r)
{
    assert(r->role == MPX_RECOVERING);
    if (r->rec_wait) {
        if (r->durable >= r->rec_wait) {
            r->role = MPX_FOLLOWER;
            r->rec_wait = 0;
            mpx__reset_election(r);
        }
        return;
    }
    if (r->now < r->next_heartbeat)
        return;
    r->next_heartbeat = r->now + r->cfg.heartbeat_ns;
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id && !(r->rec_from >> p & 1))
            mpx__send_simple(r, cons_replica(p), MPX_RECOVER, 0, r->nonce);
    }
}

/* A normal replica answers with its promise, a snapshot at its applied
 * index and every entry after it (chosen or merely accepted). */
void mpx__on_recover(struct mpx *r, const struct mpx_msg *m)
{
    size_t len;
    if (mpx__snapshot(r, &len) < 0)
        return;
    struct cons_wbuf w;
    mpx__begin(r, &w, MPX_RECOVER_REPLY, r->promised);
    cons_w_u64(&w, m->u1);
    cons_w_u64(&w, r->promised);
    cons_w_u32(&w, (uint32_t)len);
    cons_w_bytes(&w, r->snap_buf, len);
    size_t count_at = w.len;
    cons_w_u32(&w, 0);
    uint32_t n = 0;
    for (uint64_t i = r->applied + 1; i <= r->last; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        if (s) {
            mpx__put_entry(&w, s);
            n++;
        }
    }
    if (!w.err)
        memcpy(w.p + count_at, &n, sizeof n);
    mpx__send(r, &w, cons_replica(m->from));
}

static void finish(struct mpx *r)
{
    size_t len;
    if (r->rec_promised > r->promised)
        r->promised = r->rec_promised;
    if (r->promised > r->max_seen)
        r->max_seen = r->promised;
    if (mpx__snapshot(r, &len) < 0) {
        r->poisoned = 1;
        return;
    }
    mpx__persist_snapshot(r, len);
    for (uint64_t i = r->snap_index + 1; i <= r->last; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        if (s)
            mpx__persist_entry(r, s);
    }
    mpx__persist_meta(r); /* last: its presence on disk marks a complete state */
    r->rec_wait = r->next_cookie;
}

void mpx__on_recover_reply(struct mpx *r, const struct mpx_msg *m)
{
    if (r->rec_wait || m->u1 != r->nonce || (r->rec_from >> m->from & 1))
        return;
    uint64_t index;
    if (m->snap_len > r->snap_cap || mpx__install(r, m->snap, m->snap_len, &index) < 0)
        return;
    r->commit = r->applied = r->snap_index;
    struct cons_rbuf rd = m->ents;
    for (uint32_t e = 0; e < m->nents; e++) {
        uint64_t i, ballot;
        mpx__entry_peek(&rd, &i, &ballot);
        struct mpx_slot *s = mpx__slot(r, i);
        int take = s && (s->index != i || s->ballot < ballot);
        mpx__entry_into(r, &rd, take ? s : NULL);
    }
    if (m->u2 > r->rec_promised)
        r->rec_promised = m->u2;
    r->rec_from |= 1ull << m->from;
    if (++r->rec_n >= r->f + 1)
        finish(r);
}
