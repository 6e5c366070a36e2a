/* mpx_recover.c: a replica that lost its disk rejoins safely, and the
 * crash vectors that make its earlier votes harmless.
 *
 * Why not just fetch a snapshot from the leader: a replica that forgets
 * what it promised or accepted can break quorum intersection (it may have
 * been the one member of a quorum that holds a chosen value). So, like
 * Viewstamped Replication's recovery (Liskov and Cowling 2012, section 4.3)
 * and NOPaxos section 5.3.2, it asks under a fresh nonce and waits for f+1
 * OTHER replicas, adopting the highest promise among them and, for each
 * slot after the highest applied index among them, the highest-ballot
 * entry (phase 1's rule); then (phase 3) it fetches a state at or past
 * that index as a chunked stream (cons_xfer.h) and persists all of it
 * before it acts as an acceptor again.
 *
 * That alone is not enough (the simulator's seed 66913 shows it): votes
 * the replica cast BEFORE it lost its disk are still counted by others. A
 * leader held its pre-crash ACCEPTED for slot s, a responder answered the
 * recovery and only then accepted s, and the two votes plus the leader's
 * chose s, while the recovered state (taken from the responder's earlier
 * answer) lacked s and a later leader chose something else there. The same
 * holds for a promise: a candidate may count the lost incarnation's
 * promise together with promises made after the recovery. Paxos Made Live
 * section 5.1 has the replica sit out one instance, which does not close
 * this; Michael, Ports, Sharma and Szekeres ("Recovering Shared Objects
 * Without Stable Storage", DISC 2017) show such recoveries unsafe and
 * close the hole with crash vectors and crash-consistent quorums. We do
 * the same:
 *
 *  - Every replica has a generation (0 for a member of a new group) and a
 *    crash vector known[p], the highest generation of each replica it
 *    heard of, persisted in META.
 *  - Recovery has two phases. Phase 1 asks f+1 others for the highest
 *    generation of this replica they know; the new generation is one
 *    more. Phase 2 announces it: each responder raises known[me], makes
 *    that durable and only then answers with its promise, crash vector,
 *    applied index and the entries after it. Any two sets of f+1 others
 *    intersect, so the new generation exceeds every generation that
 *    finished phase 2. Phase 3 fetches the state (cons_xfer.h).
 *  - Every vote (PROMISE, ACCEPTED) carries the voter's crash vector. A
 *    candidate or leader merges it before counting; a vote whose sender's
 *    generation is below what it knows is ignored, and when known[p] rises
 *    every vote of p counted so far is forgotten.
 *
 * Why that is safe: take any quorum Q that counted a vote of the lost
 * incarnation, and the f+1 replicas W that answered the new one's phase 2.
 * Q minus the lost replica has f members among the 2f others, so it meets
 * W in some x. If x voted before it answered, its answer (built after the
 * vote) carries that promise or accepted entry into the recovered state.
 * If x voted after, its vote carried known[me] = the new generation, and
 * the collector forgot the lost incarnation's vote before counting x's:
 * Q was never complete. Ballots carry the generation too (mpx_paxos.c
 * next_ballot), so the new incarnation never reuses one of its lost
 * self's ballots.
 *
 * With reconfiguration (mpx.h), "f+1 others" is counted among the members
 * of the newest configuration the answers report: as many of them, other
 * than this replica, as meet every majority of those members (members -
 * majority + 1; 2 of 3, 3 of 5, 2 of 4), counting only answerers that
 * report that configuration themselves, so the argument above holds
 * within it. Votes of an older epoch cannot be completed by then: every
 * counted answerer applied the change that started the newest epoch, so
 * every slot up to it is chosen and in the state they give, and their
 * promises stand above the ballots that chose them. (An answerer still in
 * an older epoch does not count: a recovery from two of those once missed
 * the slot that changed the configuration, chosen by others.) */
#include "mpx_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

void mpx__forget_votes(struct mpx *r, uint32_t p)
{
    FK_ASSERT(p < r->cfg.n);
    r->promises &= ~(1ull << p);
    for (uint32_t k = 0; k < r->cfg.log_cap; k++)
        r->slots[k].acks &= ~(1ull << p);
}

int mpx__cv_merge(struct mpx *r, const struct mpx_msg *m)
{
    if (m->ncv != r->cfg.n)
        return -1;
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        uint64_t g = mpx__cv_get(m, p);
        if (g > r->known[p] && p != r->cfg.id) {
            r->known[p] = g;
            if (!(r->cfg.bugs & MPX_BUG_STALE_VOTES))
                mpx__forget_votes(r, p);
        }
    }
    if (r->cfg.bugs & MPX_BUG_STALE_VOTES)
        return 0;
    return mpx__cv_get(m, m->from) < r->known[m->from] ? -1 : 0;
}

static void send_recover(struct mpx *r, uint32_t p)
{
    struct cons_wbuf w;
    mpx__begin(r, &w, MPX_RECOVER, 0);
    cons_w_u64(&w, r->nonce);
    cons_w_u64(&w, r->rec_phase == 2 ? r->rec_gen : 0);
    mpx__send(r, &w, cons_replica(p));
}

/* Answers that count: members of the newest configuration reported, this
 * replica left out, as many as meet every majority of them. */
static int rec_enough(const struct mpx *r, uint64_t from)
{
    uint64_t m = r->rec_conf.members & ~(1ull << r->cfg.id);
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (r->rec_epoch[p] != r->rec_conf.epoch)
            m &= ~(1ull << p); /* still in an older epoch */
    }
    uint32_t members = (uint32_t)__builtin_popcountll(r->rec_conf.members);
    uint32_t need = members - (members / 2 + 1) + 1;
    return (uint32_t)__builtin_popcountll(from & m) >= need;
}

/* The newest configuration an answer reports (mpx.h). */
static void rec_conf(struct mpx *r, const struct mpx_msg *m)
{
    r->rec_epoch[m->from] = m->conf.epoch;
    if (m->conf.epoch > r->rec_conf.epoch && (m->conf.members >> r->cfg.n) == 0) {
        r->rec_conf = m->conf;
        r->rec_conf_slot = m->conf_slot;
        r->rec_conf_prev = m->conf_prev;
    }
}

void mpx__recover_start(struct mpx *r)
{
    r->role = MPX_RECOVERING;
    r->rec_conf = r->conf;
    r->rec_conf_slot = r->conf_slot;
    r->rec_conf_prev = r->prev_members;
    memset(r->rec_epoch, 0, sizeof r->rec_epoch);
    r->nonce = mpx__rand(r) | 1;
    r->rec_phase = 1;
    r->rec_gen = 0;
    r->rec_from = 0;
    r->rec_n = 0;
    r->rec_promised = 0;
    r->rec_index = 0;
    r->rec_fetch = 0;
    r->rec_wait = 0;
    memset(r->rec_cv, 0, sizeof r->rec_cv);
    memset(r->rec_their, 0, sizeof r->rec_their);
    r->next_heartbeat = r->now;
    mpx__recover_tick(r);
}

/* Phase 2 counts a responder only while its own generation is the highest
 * any responder reported for it (a crash-consistent quorum, DISC 2017). */
static uint64_t consistent_responders(const struct mpx *r)
{
    uint64_t n = 0;
    for (uint32_t p = 0; p < r->cfg.n; p++)
        n |= (uint64_t)((r->rec_from >> p & 1) && r->rec_their[p] >= r->rec_cv[p]) << p;
    return n;
}

void mpx__recover_tick(struct mpx *r)
{
    FK_ASSERT(r->role == MPX_RECOVERING);
    if (r->rec_wait) {
        if (r->durable >= r->rec_wait) {
            r->role = MPX_FOLLOWER;
            r->rec_wait = 0;
            mpx__reset_election(r);
        }
        return;
    }
    if (r->now < r->next_heartbeat || r->rec_phase == 3)
        return; /* phase 3: the transfer keeps its own time */
    r->next_heartbeat = r->now + r->cfg.heartbeat_ns;
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        int answered = r->rec_from >> p & 1;
        if (answered && r->rec_phase == 2 && r->rec_their[p] < r->rec_cv[p])
            answered = 0; /* its answer came from an incarnation since lost */
        if (p != r->cfg.id && !answered)
            send_recover(r, p);
    }
}

/* A normal replica answers phase 1 with the asker's generation as known
 * here; phase 2 raises it and answers once that is durable. */
void mpx__on_recover(struct mpx *r, const struct mpx_msg *m)
{
    uint64_t nonce = m->u1, gen = m->u2;
    if (gen == 0) {
        struct cons_wbuf w;
        mpx__begin(r, &w, MPX_RECOVER_GEN, r->promised);
        cons_w_u64(&w, nonce);
        cons_w_u64(&w, r->known[m->from]);
        mpx__put_conf(r, &w);
        mpx__send(r, &w, cons_replica(m->from));
        return;
    }
    if (gen < r->known[m->from])
        return; /* a recovery older than one already announced */
    if (gen > r->known[m->from]) {
        r->known[m->from] = gen;
        if (!(r->cfg.bugs & MPX_BUG_STALE_VOTES))
            mpx__forget_votes(r, m->from);
        mpx__persist_meta(r);
    }
    mpx__hold(r, MPX_RECOVER_REPLY, m->from, nonce, gen);
}

/* Once known[to] >= gen is durable: the promise, the crash vector, the
 * applied index (the state machine holds the state there; the asker
 * fetches it in phase 3) and every entry after it (chosen or merely
 * accepted), all as of now, after every vote cast so far. */
void mpx__release_recover_reply(struct mpx *r, uint32_t to, uint64_t nonce, uint64_t gen)
{
    if (r->known[to] != gen || r->role == MPX_RECOVERING)
        return; /* superseded by a newer recovery, or cannot answer now */
    struct cons_wbuf w;
    mpx__begin(r, &w, MPX_RECOVER_REPLY, r->promised);
    cons_w_u64(&w, nonce);
    cons_w_u64(&w, r->promised);
    mpx__put_cv(r, &w);
    cons_w_u64(&w, r->applied);
    mpx__put_conf(r, &w);
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
    mpx__send(r, &w, cons_replica(to));
}

/* Phase 1: the new generation is one above the highest of f+1 answers. */
void mpx__on_recover_gen(struct mpx *r, const struct mpx_msg *m)
{
    if (r->rec_phase != 1 || m->u1 != r->nonce || (r->rec_from >> m->from & 1))
        return;
    if (m->u2 > r->rec_gen)
        r->rec_gen = m->u2;
    r->rec_from |= 1ull << m->from;
    r->rec_n++;
    rec_conf(r, m);
    if (!rec_enough(r, r->rec_from))
        return;
    r->rec_phase = 2;
    r->rec_gen++;
    r->rec_from = 0;
    r->rec_n = 0;
    r->next_heartbeat = r->now;
    mpx__recover_tick(r);
}

/* Moves the log's base to `index`: the state up to there comes whole,
 * from phase 3's transfer, so entries at or below it are not needed. */
static void rebase(struct mpx *r, uint64_t index)
{
    for (uint32_t k = 0; k < r->cfg.log_cap; k++) {
        struct mpx_slot *s = &r->slots[k];
        if (s->index && s->index <= index)
            mpx__slot_clear(r, s);
    }
    r->snap_index = index;
    if (r->last < index)
        r->last = index;
}

/* The recovered state is complete: persist it, META last, and rejoin once
 * that is durable (recover_tick). */
void mpx__recover_fetched(struct mpx *r)
{
    FK_ASSERT(r->rec_phase == 3);
    if (r->rec_fetch) {
        uint64_t index = mpx__adopt_state(r);
        if (r->poisoned)
            return;
        mpx__adopt_desc(r);
        r->rec_fetch = 0;
        r->commit = r->applied = index;
    }
    if (r->rec_promised > r->promised)
        r->promised = r->rec_promised;
    if (r->promised > r->max_seen)
        r->max_seen = r->promised;
    memcpy(r->known, r->rec_cv, sizeof r->known);
    r->gen = r->known[r->cfg.id] = r->rec_gen;
    if (r->rec_conf.epoch > r->conf.epoch && r->applied >= r->rec_conf_slot)
        mpx__set_conf(r, &r->rec_conf, r->rec_conf_slot, r->rec_conf_prev);
    mpx__persist_trim(r, r->snap_index);
    for (uint64_t i = r->snap_index + 1; i <= r->last; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        if (s)
            mpx__persist_entry(r, s);
    }
    mpx__persist_meta(r); /* last: its presence on disk marks a complete state */
    r->rec_wait = r->next_cookie;
}

/* Phase 3: the state at the highest responder's index, fetched from it (or,
 * if it cannot serve, from another: any state at or past that index is a
 * chosen prefix that covers it). A group that never applied anything has
 * nothing to fetch. */
static void fetch(struct mpx *r)
{
    r->rec_phase = 3;
    if (r->rec_index == 0) {
        mpx__recover_fetched(r);
        return;
    }
    r->rec_fetch = 1;
    if (cons_xfer_start(&r->xfer, r->rec_best, r->rec_index, r->now) < 0)
        r->poisoned = 1;
}

/* Phase 2: merge each answer's state (more state from a responder that
 * later turns out stale is harmless: every entry is a real proposal and
 * every applied index a chosen prefix); count only a crash-consistent f+1. */
void mpx__on_recover_reply(struct mpx *r, const struct mpx_msg *m)
{
    if (r->rec_wait || r->rec_phase != 2 || m->u1 != r->nonce || m->ncv != r->cfg.n)
        return;
    uint64_t their = mpx__cv_get(m, m->from);
    if ((r->rec_from >> m->from & 1) && their <= r->rec_their[m->from])
        return; /* a duplicate */
    if (mpx__cv_get(m, r->cfg.id) != r->rec_gen)
        return; /* not an answer to this generation's announcement */
    if (m->u3 > r->rec_index) {
        r->rec_index = m->u3;
        r->rec_best = m->from;
        rebase(r, m->u3);
    }
    struct cons_rbuf rd = m->ents;
    for (uint32_t e = 0; e < m->nents; e++) {
        uint64_t i, ballot;
        mpx__entry_peek(&rd, &i, &ballot);
        struct mpx_slot *s = mpx__slot(r, i);
        int take = s && (s->index != i || s->ballot < ballot);
        if (mpx__entry_into(r, &rd, take ? s : NULL) < 0)
            return; /* no room to merge it: this answer counts as lost */
    }
    if (m->u2 > r->rec_promised)
        r->rec_promised = m->u2;
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        uint64_t g = mpx__cv_get(m, p);
        if (p != r->cfg.id && g > r->rec_cv[p])
            r->rec_cv[p] = g;
    }
    r->rec_their[m->from] = their;
    r->rec_from |= 1ull << m->from;
    rec_conf(r, m);
    if (rec_enough(r, consistent_responders(r)))
        fetch(r);
}
