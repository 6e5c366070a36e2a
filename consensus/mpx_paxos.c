/* mpx_paxos.c: Multi-Paxos message handlers and timers: pre-vote, phase 1
 * (PREPARE/PROMISE over the unchosen suffix), phase 2 (ACCEPT/ACCEPTED,
 * pipelined and batched), commit notification, catch-up and client
 * requests. "Paxos Made Simple" section 3 is the reference throughout. */
#include "mpx_internal.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

static uint32_t ballot_owner(uint64_t b)
{
    return (uint32_t)(b & 0xff);
}

void mpx__reset_election(struct mpx *r)
{
    r->election_deadline = r->now + r->cfg.election_ns + mpx__rand(r) % r->cfg.election_ns;
}

/* Answers op's client FK_ENOTLEADER naming `hint` (UINT32_MAX: unknown):
 * not applied here, send it to the leader. */
static void not_leader(struct mpx *r, const struct cons_op *op, uint32_t hint)
{
    memset(&r->reply, 0, offsetof(struct cons_reply, data));
    r->reply.client_id = op->client_id;
    r->reply.req_no = op->req_no;
    r->reply.status = FK_ENOTLEADER;
    mpx__reply_hint(r, op->client_id, &r->reply, hint);
}

/* The requests queued here, never proposed, go back to their clients as
 * FK_ENOTLEADER naming `hint`, so that each is sent to the next leader at
 * once: dropped, each waited out its client's resend timer (100 ms at
 * least, client/flowkv.c) after a leader's handover. The leader's own
 * NO-OPs (queue_noop) have no client. */
static void refuse_pending(struct mpx *r, uint32_t hint)
{
    for (; r->pend_n > 0; r->pend_n--) {
        const struct cons_op *op = &r->pending[r->pend_head];
        if (op->type != CONS_OP_NOOP)
            not_leader(r, op, hint);
        cons_big_free(&r->pend_big[r->pend_head], &r->pend_bigs);
        r->pend_head = (r->pend_head + 1) % r->cfg.pending_max;
    }
}

/* Any role -> follower. The pending queue goes back to its clients. */
void mpx__become_follower(struct mpx *r)
{
    FK_ASSERT(r->role != MPX_RECOVERING);
    if (r->role == MPX_LEADER || r->role == MPX_CANDIDATE) {
        for (uint32_t k = 0; k < r->cfg.log_cap; k++)
            r->slots[k].acks = 0;
    }
    r->role = MPX_FOLLOWER;
    r->stop_at = 0;
    refuse_pending(r, UINT32_MAX);
    r->prevote_ballot = 0;
    mpx__reset_election(r);
}

/* ---- durability-gated acknowledgements ---------------------------------- */

/* Queues an acknowledgement released once everything persisted so far is
 * durable. A full queue drops it, which the sender's retry covers. */
void mpx__hold(struct mpx *r, uint8_t type, uint32_t to, uint64_t ballot, uint64_t index)
{
    if (r->held_n >= MPX_HELD_MAX)
        return;
    struct mpx_held *h = &r->held[(r->held_head + r->held_n) % MPX_HELD_MAX];
    h->cookie = r->next_cookie;
    h->type = type;
    h->to = to;
    h->ballot = ballot;
    h->index = index;
    r->held_n++;
    if (h->cookie <= r->durable)
        mpx__release_held(r);
}

static void count_ack(struct mpx *r, uint32_t from, uint64_t ballot, uint64_t index);
static void count_promise(struct mpx *r, uint32_t from);
static void advance_commit(struct mpx *r);
static int queue_noop(struct mpx *r);

static void release_one(struct mpx *r, const struct mpx_held *h, uint64_t *idx, uint32_t *n)
{
    if (h->type == MPX_PROMISE) {
        if (h->ballot != r->promised)
            return; /* superseded: a newer promise replaced it */
        if (h->to == r->cfg.id)
            count_promise(r, h->to);
        else
            mpx__send_entries(r, cons_replica(h->to), MPX_PROMISE, h->ballot, r->commit, h->index,
                              r->last, 0);
        return;
    }
    const struct mpx_slot *s = mpx__cslot(r, h->index);
    if (h->index > r->commit && (!s || s->ballot != h->ballot))
        return; /* overwritten by a later ballot: this ack would be stale */
    if (h->to == r->cfg.id)
        count_ack(r, h->to, h->ballot, h->index);
    else
        idx[(*n)++] = h->index;
}

static void send_accepted(struct mpx *r, uint32_t to, uint64_t ballot, const uint64_t *idx,
                          uint32_t n)
{
    struct cons_wbuf w;
    mpx__begin(r, &w, MPX_ACCEPTED, ballot);
    mpx__put_cv(r, &w);
    cons_w_u32(&w, n);
    cons_w_bytes(&w, idx, (size_t)n * 8);
    mpx__send(r, &w, cons_replica(to));
}

void mpx__release_held(struct mpx *r)
{
    uint64_t idx[MPX_ACK_IDX_MAX];
    uint32_t n = 0, to = 0;
    uint64_t ballot = 0;
    while (r->held_n && r->held[r->held_head].cookie <= r->durable) {
        struct mpx_held h = r->held[r->held_head];
        r->held_head = (r->held_head + 1) % MPX_HELD_MAX;
        r->held_n--;
        /* Coalesce consecutive ACCEPTED to one (leader, ballot). */
        if (n &&
            (h.type != MPX_ACCEPTED || h.to != to || h.ballot != ballot || n == MPX_ACK_IDX_MAX)) {
            send_accepted(r, to, ballot, idx, n);
            n = 0;
        }
        if (h.type == MPX_RECOVER_REPLY) {
            mpx__release_recover_reply(r, h.to, h.ballot, h.index);
            continue;
        }
        to = h.to;
        ballot = h.ballot;
        release_one(r, &h, idx, &n);
    }
    if (n)
        send_accepted(r, to, ballot, idx, n);
}

/* ---- entries in messages --------------------------------------------------- */

void mpx__entry_peek(const struct cons_rbuf *rd, uint64_t *index, uint64_t *ballot)
{
    struct cons_rbuf p = *rd;
    *index = cons_r_u64(&p);
    *ballot = cons_r_u64(&p);
}

size_t mpx__entry_bytes(const struct mpx_slot *s)
{
    size_t n = MPX_ENTRY_HDR;
    for (uint8_t k = 0; k < s->nops; k++)
        n += mpx__op_bytes(&s->ops[k]);
    return n;
}

int mpx__slot_store(struct mpx *r, struct mpx_slot *s, const struct cons_op *ops, uint8_t nops)
{
    /* All or nothing: first the room the large ones need beyond what
     * their positions' bigs hold already (small ones give theirs back). */
    size_t need = 0, freed = 0;
    for (uint32_t k = 0; k < r->cfg.batch_max; k++) {
        size_t n = k < nops ? cons_op_nbytes(&ops[k]) : 0;
        if (n > CONS_OP_INLINE && n > s->bigs[k].cap)
            need += n - s->bigs[k].cap;
        else if (n <= CONS_OP_INLINE)
            freed += s->bigs[k].cap;
    }
    if (need > r->log_big.max - r->log_big.held + freed)
        return FK_EFULL;
    for (uint32_t k = nops; k < r->cfg.batch_max; k++)
        cons_big_free(&s->bigs[k], &r->log_big);
    for (uint8_t k = 0; k < nops; k++) {
        if (cons_op_nbytes(&ops[k]) <= CONS_OP_INLINE)
            cons_op_store(&s->ops[k], &s->bigs[k], &r->log_big, &ops[k]);
    }
    for (uint8_t k = 0; k < nops; k++) {
        if (cons_op_nbytes(&ops[k]) > CONS_OP_INLINE &&
            cons_op_store(&s->ops[k], &s->bigs[k], &r->log_big, &ops[k]) < 0) {
            r->poisoned = 1; /* out of memory under the budget: stop, do not forget */
            return FK_ENOMEM;
        }
    }
    s->nops = nops;
    return 0;
}

int mpx__entry_into(struct mpx *r, struct cons_rbuf *rd, struct mpx_slot *s)
{
    uint64_t index, ballot;
    uint8_t nops;
    int rc = mpx__entry_next(rd, &index, &ballot, &nops, r->scratch_batch, r->cfg.batch_max);
    FK_ASSERT(rc == 0); /* validated by mpx__decode */
    if (!s)
        return 0;
    rc = mpx__slot_store(r, s, r->scratch_batch, nops);
    if (rc < 0)
        return rc;
    s->index = index;
    s->ballot = ballot;
    s->acks = 0;
    s->chosen = 0;
    if (r->last < index)
        r->last = index;
    return 0;
}

/* ---- elections: pre-vote, phase 1 --------------------------------------- */

/* Ballots are (epoch << 48 | round << 24 | generation << 8 | id,
 * mpx_internal.h): the epoch is the configuration's (mpx.h), the
 * generation makes a ballot unique to one incarnation of its owner, so a
 * replica that lost its disk never reuses a ballot its earlier self may
 * have sent PREPAREs or ACCEPTs for (two proposers at one ballot would
 * break Paxos' P2a). 0 when there is none to take: a newer epoch's ballot
 * was seen (this replica has not applied the change yet), or the rounds of
 * this epoch are spent (README, Limits). */
static uint64_t next_ballot(const struct mpx *r)
{
    uint64_t top = r->promised > r->max_seen ? r->promised : r->max_seen;
    uint32_t e = r->conf.epoch, round = 1;
    if (mpx__ballot_epoch(top) > e)
        return 0;
    if (mpx__ballot_epoch(top) == e)
        round = (uint32_t)(top >> 24 & MPX_ROUND_MAX) + 1;
    if (round > MPX_ROUND_MAX)
        return 0;
    return (uint64_t)e << 48 | (uint64_t)round << 24 | (r->gen & MPX_GEN_MASK) << 8 | r->cfg.id;
}

/* Only a member starts an election (a learner follows, mpx.h). */
static void start_prevote(struct mpx *r)
{
    if (!mpx__member(r, r->cfg.id) || next_ballot(r) == 0) {
        /* A newer epoch's ballot was seen: the change that started it is
         * chosen, and this replica lacks it; any replica that applied it
         * serves it (catch-up), so ask them all. */
        if (mpx__member(r, r->cfg.id))
            mpx__send_simple(r, cons_peers(), MPX_CATCHUP_REQ, 0, r->commit + 1);
        mpx__reset_election(r);
        return;
    }
    r->prevote_ballot = next_ballot(r);
    r->votes = 1ull << r->cfg.id;
    mpx__send_simple(r, cons_peers(), MPX_PREVOTE, r->prevote_ballot, r->commit);
    mpx__reset_election(r);
}

/* Phase 1 at the next ballot, its promise to itself held until durable;
 * 0 when there is no ballot to take (next_ballot). */
static int begin_phase1(struct mpx *r)
{
    uint64_t b = next_ballot(r);
    if (b == 0)
        return 0;
    r->role = MPX_CANDIDATE;
    r->promised = b;
    r->leader = UINT32_MAX;
    r->promises = 0;
    r->prevote_ballot = 0;
    r->cand_since = r->now;
    mpx__persist_meta(r);
    mpx__hold(r, MPX_PROMISE, r->cfg.id, r->promised, r->commit + 1);
    mpx__send_simple(r, cons_peers(), MPX_PREPARE, r->promised, r->commit + 1);
    return 1;
}

static void start_phase1(struct mpx *r)
{
    FK_ASSERT(r->role == MPX_FOLLOWER && mpx__member(r, r->cfg.id));
    if (!begin_phase1(r))
        mpx__reset_election(r);
}

/* A peer grants a pre-vote only if it has not heard a leader for a whole
 * election timeout itself: a replica that still hears a leader never helps
 * an election (damping; no ballot inflation by a partitioned replica). */
static void on_prevote(struct mpx *r, const struct mpx_msg *m)
{
    int grant = r->role != MPX_LEADER && r->now - r->last_heard >= r->cfg.election_ns;
    mpx__send_simple(r, cons_replica(m->from), MPX_PREVOTE_OK, m->term, (uint64_t)grant);
}

static void on_prevote_ok(struct mpx *r, const struct mpx_msg *m)
{
    if (r->role != MPX_FOLLOWER || !r->prevote_ballot || m->term != r->prevote_ballot || !m->u1)
        return;
    r->votes |= 1ull << m->from;
    if (mpx__quorate(r, r->votes) && mpx__member(r, r->cfg.id)) /* a change may have removed it */
        start_phase1(r);
}

/* PREPARE(b, from): promise if b is the highest ballot seen; the promise
 * (with every accepted entry from `from` on) leaves once durable. */
/* A ballot of a newer epoch than this replica's (mpx.h, "Reconfiguration")
 * comes from a replica that applied the change that started it: this one
 * promises and accepts nothing at it before it applied that change too
 * (catch-up from the sender, at most once a heartbeat). So a replica that
 * promised a newer epoch's ballot knows the change is chosen and serves
 * it; one that did not can still finish the older epoch's last slot with
 * its peers if the newer epoch's leader dies. */
static int newer_epoch(struct mpx *r, uint64_t ballot, uint32_t from)
{
    if (mpx__ballot_epoch(ballot) <= r->conf.epoch || (r->cfg.bugs & MPX_BUG_CONFIG_NO_WAIT))
        return 0;
    if (r->now - r->catchup_sent >= r->cfg.heartbeat_ns) {
        r->catchup_sent = r->now;
        mpx__send_simple(r, cons_replica(from), MPX_CATCHUP_REQ, 0, r->commit + 1);
    }
    return 1;
}

static void on_prepare(struct mpx *r, const struct mpx_msg *m)
{
    if (newer_epoch(r, m->term, m->from))
        return;
    if (m->term > r->max_seen)
        r->max_seen = m->term;
    if (m->term < r->promised || (m->term == r->promised && ballot_owner(m->term) != m->from)) {
        mpx__send_simple(r, cons_replica(m->from), MPX_NACK, r->promised, 0);
        return;
    }
    if (m->term > r->promised) {
        if (r->role != MPX_FOLLOWER)
            mpx__become_follower(r);
        r->promised = m->term;
        r->leader = UINT32_MAX;
        mpx__persist_meta(r);
    }
    r->last_heard = r->now;
    mpx__reset_election(r);
    mpx__hold(r, MPX_PROMISE, m->from, m->term, m->u1);
}

/* ---- leadership transfer (Raft's TimeoutNow, Ongaro's thesis 3.10) ------ */

/* The follower that acknowledged the highest slot: the one whose phase 1
 * has least to merge (any follower's is safe: phase 1 takes every value
 * a majority may have chosen). */
static uint32_t best_follower(const struct mpx *r)
{
    for (uint64_t i = r->next_index;
         i-- > r->snap_index + 1 && i + r->cfg.log_cap > r->next_index;) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        for (uint32_t p = 0; s != NULL && s->index == i && p < r->cfg.n; p++)
            if (p != r->cfg.id && (s->acks >> p & 1) && mpx__member(r, p))
                return p;
    }
    for (uint32_t k = 1; k < r->cfg.n; k++) {
        uint32_t p = (r->cfg.id + k) % r->cfg.n;
        if (mpx__member(r, p))
            return p;
    }
    return (r->cfg.id + 1) % r->cfg.n;
}

/* A leader that is about to stop asks its most advanced follower to start
 * phase 1 at once, and becomes a follower: the group changes leader in a
 * round trip instead of an election timeout (a rolling restart's
 * unavailability). Lost, the message costs only the usual timeout. */
void mpx__transfer(struct mpx *r)
{
    if (r->role != MPX_LEADER)
        return;
    uint32_t to = best_follower(r);
    FK_ASSERT(to != r->cfg.id && to < r->cfg.n);
    /* The commit point rides along: a member that learns from it that a
     * change made it a member (mpx.h) can start at once. */
    mpx__send_simple(r, cons_replica(to), MPX_TIMEOUT_NOW, r->promised, r->commit);
    refuse_pending(r, to); /* the leader to be */
    /* The requests in its slots not applied yet go back too. The next
     * leader's phase 1 keeps them and it answers them once applied, but
     * through its own reply flow, which a client has not joined again
     * when that follower restarted earlier (a rolling restart: the
     * client/flowkv.c went_away comment): sent there now, the client
     * finds that out at once instead of at its resend timer (100 ms).
     * Exactly once holds: a retry of an op the new leader applies is
     * answered from the client table, one still in its log waits for it. */
    for (uint64_t i = r->applied + 1; i < r->next_index; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        for (uint32_t k = 0; s != NULL && s->index == i && k < s->nops; k++) {
            if (s->ops[k].type != CONS_OP_NOOP)
                not_leader(r, &s->ops[k], to);
        }
    }
    mpx__become_follower(r);
    r->last_heard = r->now; /* it grants no pre-vote of its own meanwhile */
}

/* Only from the leader this follower follows, at its ballot: anything else
 * (a stale or duplicated request) is ignored. No pre-vote: the leader
 * asked, and PREPARE's higher ballot is what makes the change safe. */
static void on_timeout_now(struct mpx *r, const struct mpx_msg *m)
{
    if (r->role != MPX_FOLLOWER || m->term != r->promised || m->from != r->leader ||
        ballot_owner(m->term) != m->from)
        return;
    mpx__learn_commit(r, m->term, m->u1, m->from);
    if (r->role == MPX_FOLLOWER && mpx__member(r, r->cfg.id))
        start_phase1(r);
}

static void send_accepts(struct mpx *r, uint32_t to, int force);

/* The leader's heartbeat: unacknowledged accepts to each follower (all of
 * them when force), then the commit point to every follower at once. */
static void heartbeat(struct mpx *r, int force)
{
    for (uint32_t p = 0; p < r->cfg.n; p++) {
        if (p != r->cfg.id)
            send_accepts(r, p, force);
    }
    mpx__send_simple(r, cons_peers(), MPX_COMMIT, r->promised, r->commit);
}

/* Stoppable Paxos' rule for a new leader's merged suffix (mpx.h,
 * "Reconfiguration"): the first change at i either provably was not
 * chosen (an entry after it carries a higher ballot of the same epoch:
 * that entry's proposer ran phase 1 after the change was proposed and did
 * not find it chosen, or it would have stopped at i), and becomes a
 * NO-OP, or nothing after it can have been chosen in this epoch, and the
 * suffix ends at i. An entry after it of a newer epoch proves the change
 * chosen (that epoch began where it was applied): the suffix ends at i
 * too, and the slots after it are the newer epoch's, which this leader
 * reaches by applying i (its phase 1 there takes them). */
static void stop_at_change(struct mpx *r)
{
    r->stop_at = 0;
    for (uint64_t i = r->commit + 1; i < r->next_index; i++) {
        struct mpx_slot *s = mpx__slot(r, i);
        struct cons_config c;
        /* A change of another epoch than the one in force here (a stale
         * one, merged from an old leader's log) changes nothing where it
         * is applied (FK_EBUSY): not a stop sign, its leader went on. */
        if (s->index != i || !mpx__is_change(s) || cons_config_get(&s->ops[0], &c) < 0 ||
            c.epoch != r->conf.epoch)
            continue;
        int later = 0, newer = 0;
        for (uint64_t j = i + 1; j < r->next_index; j++) {
            const struct mpx_slot *t = mpx__cslot(r, j);
            if (t != NULL && mpx__ballot_epoch(t->ballot) > mpx__ballot_epoch(s->ballot))
                newer = 1;
            else if (t != NULL && t->ballot > s->ballot)
                later = 1;
        }
        later &= !newer;
        if (later) {
            struct cons_op noop;
            cons_op_init(&noop, CONS_OP_NOOP, NULL, 0, NULL, 0, NULL, 0);
            int rc = mpx__slot_store(r, s, &noop, 1);
            FK_ASSERT(rc == 0); /* a small op needs no room */
            (void)rc;
            continue;
        }
        for (uint64_t j = i + 1; j < r->next_index; j++) {
            struct mpx_slot *t = mpx__slot(r, j);
            if (t->index == j)
                mpx__slot_clear(r, t);
        }
        r->next_index = i + 1;
        if (r->last > i)
            r->last = i;
        r->stop_at = i;
        return;
    }
}

static void become_leader(struct mpx *r)
{
    FK_ASSERT(r->role == MPX_CANDIDATE && ballot_owner(r->promised) == r->cfg.id);
    r->role = MPX_LEADER;
    r->leader = r->cfg.id;
    r->next_index = r->last + 1;
    if (r->next_index > r->snap_index + r->cfg.log_cap + 1)
        r->next_index = r->snap_index + r->cfg.log_cap + 1;
    memset(r->progress, 0, sizeof r->progress);
    stop_at_change(r);
    /* Re-propose the whole suffix at my ballot: the merged highest-ballot
     * value where one was reported, a NO-OP in every hole. */
    for (uint64_t i = r->commit + 1; i < r->next_index; i++) {
        struct mpx_slot *s = mpx__slot(r, i);
        FK_ASSERT(s != NULL);
        if (s->index != i) {
            struct cons_op noop;
            cons_op_init(&noop, CONS_OP_NOOP, NULL, 0, NULL, 0, NULL, 0);
            int rc = mpx__slot_store(r, s, &noop, 1);
            FK_ASSERT(rc == 0); /* a small op needs no room */
            (void)rc;
            s->index = i;
            s->chosen = 0;
        }
        s->ballot = r->promised;
        s->acks = 0;
        s->sent_ns = r->now;
        mpx__persist_entry(r, s);
        mpx__hold(r, MPX_ACCEPTED, r->cfg.id, r->promised, i);
    }
    heartbeat(r, 1);
    r->next_heartbeat = r->now + r->cfg.heartbeat_ns;
    if (r->conf.epoch > 0 && r->commit == r->conf_slot && r->next_index == r->commit + 1 &&
        r->pend_n == 0)
        queue_noop(r); /* the epoch's first slot (promised_enough) */
}

/* A new epoch's first leader (mpx.h, "Reconfiguration"): nothing is
 * chosen in the epoch yet (commit is the change's slot), so the change is
 * known only to whoever applied it. Promises of a newer epoch's ballot
 * come only from replicas that applied the change (newer_epoch), and
 * here a majority of the previous members must be among them too: a
 * replica that loses its disk later recovers from answerers among whom
 * one knows the new configuration (mpx_recover.c), however few of the
 * new members were up. Once a slot of the epoch is chosen (the first
 * leader proposes a NO-OP at once), that holds for good, and removed
 * members may go away. */
static int promised_enough(const struct mpx *r)
{
    if (!mpx__quorate(r, r->promises))
        return 0;
    if (r->conf.epoch == 0 || r->commit > r->conf_slot || r->prev_members == 0)
        return 1;
    uint32_t prev = (uint32_t)__builtin_popcountll(r->prev_members);
    return (uint32_t)__builtin_popcountll(r->promises & r->prev_members) >= prev / 2 + 1;
}

/* Queues a NO-OP to propose (the queue's own room; 0 when it has none). */
static int queue_noop(struct mpx *r)
{
    if (r->pend_n >= r->cfg.pending_max)
        return 0;
    struct cons_op noop;
    cons_op_init(&noop, CONS_OP_NOOP, NULL, 0, NULL, 0, NULL, 0);
    uint32_t at = (r->pend_head + r->pend_n) % r->cfg.pending_max;
    if (cons_op_store(&r->pending[at], &r->pend_big[at], &r->pend_bigs, &noop) < 0)
        return 0;
    r->pend_n++;
    return 1;
}

static void count_promise(struct mpx *r, uint32_t from)
{
    if (r->role != MPX_CANDIDATE)
        return;
    r->promises |= 1ull << from;
    if (promised_enough(r))
        become_leader(r);
}

/* Gives up an election this replica cannot win safely yet (it lacks chosen
 * entries a peer compacted or holds beyond this log's window) and fetches
 * them first. */
static void abort_for_catchup(struct mpx *r, uint32_t from)
{
    mpx__become_follower(r);
    mpx__send_simple(r, cons_replica(from), MPX_CATCHUP_REQ, 0, r->commit + 1);
}

static void on_promise(struct mpx *r, const struct mpx_msg *m)
{
    if (mpx__cv_merge(r, m) < 0)
        return; /* from an incarnation that lost its disk since */
    if (r->role != MPX_CANDIDATE || m->term != r->promised || (r->promises >> m->from & 1))
        return;
    if (m->u1 > r->commit) {
        abort_for_catchup(r, m->from);
        return;
    }
    struct cons_rbuf rd = m->ents;
    for (uint32_t e = 0; e < m->nents; e++) {
        uint64_t index, ballot;
        mpx__entry_peek(&rd, &index, &ballot);
        struct mpx_slot *s = mpx__slot(r, index);
        if (index > r->commit && !s) {
            abort_for_catchup(r, m->from);
            return;
        }
        /* Phase 1 rule: keep the value of the highest ballot per slot. */
        int take = index > r->commit && (s->index != index || s->ballot < ballot) &&
                   !(r->cfg.bugs & MPX_BUG_NO_MERGE);
        if (mpx__entry_into(r, &rd, take ? s : NULL) < 0)
            return; /* no room to merge it: this promise counts as lost */
    }
    count_promise(r, m->from);
}

static void on_nack(struct mpx *r, const struct mpx_msg *m)
{
    if (m->term > r->max_seen)
        r->max_seen = m->term;
    if (m->term > r->promised && (r->role == MPX_LEADER || r->role == MPX_CANDIDATE))
        mpx__become_follower(r);
}

/* ---- phase 2 --------------------------------------------------------------- */

/* Sends `to` the unchosen slots it has not acknowledged (all of them when
 * force, else those not sent for two heartbeats), MPX_MSG_ENTRIES per
 * message: the retransmission that makes phase 2 survive loss. */
static void send_accepts(struct mpx *r, uint32_t to, int force)
{
    uint64_t i = r->commit + 1;
    while (i < r->next_index) {
        struct cons_wbuf w;
        mpx__begin(r, &w, MPX_ACCEPT, r->promised);
        cons_w_u64(&w, r->commit);
        size_t count_at = w.len;
        cons_w_u32(&w, 0);
        uint32_t n = 0;
        for (; i < r->next_index && n < MPX_MSG_ENTRIES; i++) {
            const struct mpx_slot *s = mpx__cslot(r, i);
            FK_ASSERT(s != NULL);
            if (s->chosen || (s->acks >> to & 1) ||
                (!force && r->now - s->sent_ns < 2 * r->cfg.heartbeat_ns))
                continue;
            mpx__put_entry(&w, s);
            n++;
        }
        if (n == 0)
            continue;
        if (!w.err)
            memcpy(w.p + count_at, &n, sizeof n);
        mpx__send(r, &w, cons_replica(to));
    }
}

static void advance_commit(struct mpx *r)
{
    uint64_t limit = r->snap_index + r->cfg.log_cap;
    while (r->commit < limit) {
        const struct mpx_slot *s = mpx__cslot(r, r->commit + 1);
        if (!s || !s->chosen)
            break;
        r->commit++;
    }
    mpx__apply_committed(r);
}

static void count_ack(struct mpx *r, uint32_t from, uint64_t ballot, uint64_t index)
{
    if (r->role != MPX_LEADER || ballot != r->promised)
        return;
    if (index > r->progress[from])
        r->progress[from] = index;
    struct mpx_slot *s = mpx__slot(r, index);
    if (!s || s->index != index || s->ballot != ballot || s->chosen)
        return;
    s->acks |= 1ull << from;
    if (mpx__quorate(r, s->acks))
        s->chosen = 1;
    advance_commit(r);
}

/* Turns queued client requests into new slots while the window allows. */
static void propose(struct mpx *r)
{
    while (r->role == MPX_LEADER && r->pend_n > 0 && !r->stop_at &&
           r->next_index <= r->snap_index + r->cfg.log_cap &&
           r->next_index - r->commit <= r->cfg.window) {
        struct mpx_slot *s = mpx__slot(r, r->next_index);
        FK_ASSERT(s && s->index == 0);
        /* A batch of queued requests, as many as fit an entry, and the
         * big ones while the log holds at most big_bytes of them: room a
         * follower (twice as much) and a PROMISE have. */
        uint8_t n = 0;
        size_t bytes = MPX_ENTRY_HDR, big = 0;
        while (n < r->pend_n && n < r->cfg.batch_max) {
            const struct cons_op *op = &r->pending[(r->pend_head + n) % r->cfg.pending_max];
            if (op->type == CONS_OP_CONFIG && n > 0)
                break; /* a change goes alone in its slot (mpx.h) */
            if (op->type == CONS_OP_CONFIG) {
                n = 1;
                break;
            }
            size_t ob = cons_op_nbytes(op);
            size_t b = ob > CONS_OP_INLINE ? ob : 0;
            if (n > 0 && bytes + mpx__op_bytes(op) > MPX_ENTRY_MAX)
                break;
            if (b > 0 && r->log_big.held + big + b > r->pend_bigs.max)
                break;
            bytes += mpx__op_bytes(op);
            big += b;
            n++;
        }
        if (n == 0)
            break; /* the log is full of large values: compaction makes room */
        for (uint32_t k = n; k < r->cfg.batch_max; k++)
            cons_big_free(&s->bigs[k], &r->log_big);
        for (uint8_t k = 0; k < n; k++) {
            uint32_t h = r->pend_head;
            /* Room checked above; only the allocator can fail. */
            if (cons_op_store(&s->ops[k], &s->bigs[k], &r->log_big, &r->pending[h]) < 0) {
                r->poisoned = 1;
                return;
            }
            cons_big_free(&r->pend_big[h], &r->pend_bigs);
            r->pend_head = (h + 1) % r->cfg.pending_max;
            r->pend_n--;
        }
        s->nops = n;
        s->index = r->next_index++;
        s->ballot = r->promised;
        s->acks = 0;
        s->chosen = 0;
        s->sent_ns = r->now;
        if (r->last < s->index)
            r->last = s->index;
        if (mpx__is_change(s))
            r->stop_at = s->index; /* a stop sign: nothing after it (mpx.h) */
        mpx__persist_entry(r, s);
        mpx__hold(r, MPX_ACCEPTED, r->cfg.id, r->promised, s->index);
        /* One message for every follower: it leaves on this replica's
         * replicate flow (cons.h, CONS_ADDR_PEERS). */
        mpx__send_entries(r, cons_peers(), MPX_ACCEPT, r->promised, r->commit, s->index, s->index,
                          0);
    }
}

/* Accepts a higher or equal ballot's leader: the promise rises (durably,
 * before any acknowledgement) and this replica follows it. */
static int follow(struct mpx *r, uint64_t ballot, uint32_t from)
{
    if (newer_epoch(r, ballot, from))
        return 0;
    if (ballot > r->max_seen)
        r->max_seen = ballot;
    if (ballot < r->promised || ballot_owner(ballot) != from) {
        mpx__send_simple(r, cons_replica(from), MPX_NACK, r->promised, 0);
        return 0;
    }
    if (ballot > r->promised) {
        if (r->role != MPX_FOLLOWER)
            mpx__become_follower(r);
        r->promised = ballot;
        mpx__persist_meta(r);
    }
    if (r->role != MPX_FOLLOWER)
        return 0; /* my own ballot, echoed: ignore */
    r->leader = from;
    r->last_heard = r->now;
    r->prevote_ballot = 0;
    mpx__reset_election(r);
    return 1;
}

static void on_accept(struct mpx *r, const struct mpx_msg *m)
{
    if (!follow(r, m->term, m->from))
        return;
    struct cons_rbuf rd = m->ents;
    for (uint32_t e = 0; e < m->nents; e++) {
        uint64_t index, ballot;
        mpx__entry_peek(&rd, &index, &ballot);
        struct mpx_slot *s = mpx__slot(r, index);
        if (index <= r->commit) {
            /* Chosen here already: the leader's value is the same, so the
             * acknowledgement is true without writing anything. */
            mpx__entry_into(r, &rd, NULL);
            mpx__hold(r, MPX_ACCEPTED, m->from, m->term, index);
            continue;
        }
        if (!s) {
            mpx__entry_into(r, &rd, NULL); /* beyond my window: catch up first */
            continue;
        }
        if (s->index == index && s->ballot == m->term) {
            mpx__entry_into(r, &rd, NULL); /* a retransmission */
        } else if (mpx__entry_into(r, &rd, s) < 0) {
            continue; /* no room for its big ops yet: lost, the leader resends */
        } else {
            s->ballot = m->term;
            mpx__persist_entry(r, s);
            if (r->cfg.bugs & MPX_BUG_APPLY_UNCOMMITTED)
                s->chosen = 1;
        }
        mpx__hold(r, MPX_ACCEPTED, m->from, m->term, index);
    }
    mpx__learn_commit(r, m->term, m->u1, m->from);
}

static void on_accepted(struct mpx *r, const struct mpx_msg *m)
{
    if (mpx__cv_merge(r, m) < 0)
        return; /* from an incarnation that lost its disk since */
    for (uint32_t k = 0; k < m->nidx; k++) {
        uint64_t index;
        memcpy(&index, m->idx + 8 * k, sizeof index);
        count_ack(r, m->from, m->term, index);
    }
    propose(r);
}

/* Commit notification: a slot holding the leader's ballot holds the
 * leader's value, which is chosen if the leader says its commit passed it.
 * Slots with another ballot are fetched (CATCHUP_REQ), at most once per
 * heartbeat. */
void mpx__learn_commit(struct mpx *r, uint64_t ballot, uint64_t commit, uint32_t from)
{
    uint64_t top =
        commit < r->snap_index + r->cfg.log_cap ? commit : r->snap_index + r->cfg.log_cap;
    for (uint64_t i = r->commit + 1; i <= top; i++) {
        struct mpx_slot *s = mpx__slot(r, i);
        if (s && s->index == i && s->ballot == ballot)
            s->chosen = 1;
    }
    advance_commit(r);
    if (r->commit < commit && r->now - r->catchup_sent >= r->cfg.heartbeat_ns) {
        r->catchup_sent = r->now;
        mpx__send_simple(r, cons_replica(from), MPX_CATCHUP_REQ, 0, r->commit + 1);
    }
}

static void on_commit(struct mpx *r, const struct mpx_msg *m)
{
    if (follow(r, m->term, m->from))
        mpx__learn_commit(r, m->term, m->u1, m->from);
}

/* The configuration changed at the slot just applied (mpx.h): a leader
 * that stays a member runs phase 1 again among the new members, keeping
 * its queue; one that does not hands over to the most advanced of them
 * and follows; a candidate's votes were counted under the old one. */
void mpx__conf_changed(struct mpx *r)
{
    r->stop_at = 0;
    if (r->role == MPX_CANDIDATE) {
        mpx__become_follower(r);
    } else if (r->role == MPX_LEADER && !mpx__member(r, r->cfg.id)) {
        mpx__transfer(r);
    } else if (r->role == MPX_LEADER) {
        for (uint32_t k = 0; k < r->cfg.log_cap; k++)
            r->slots[k].acks = 0;
        mpx__reset_election(r);
        if (!begin_phase1(r))
            mpx__become_follower(r);
    }
}

/* ---- catch-up: any replica serves chosen entries, or its state --------- */

static void on_catchup_req(struct mpx *r, const struct mpx_msg *m)
{
    if (r->role == MPX_RECOVERING || m->u1 == 0 || m->u1 > r->commit)
        return;
    if (m->u1 <= r->snap_index) {
        /* Compacted here: from the history if it still holds them, else
         * the asker fetches the state (cons_xfer). */
        if (mpx__send_history(r, m->from, m->u1) < 0)
            mpx__send_simple(r, cons_replica(m->from), MPX_COMPACTED, 0, r->snap_index);
        return;
    }
    mpx__send_entries(r, cons_replica(m->from), MPX_CATCHUP, r->promised, r->commit, m->u1,
                      r->commit, 1);
}

static void on_catchup(struct mpx *r, const struct mpx_msg *m)
{
    if (r->role == MPX_LEADER || r->role == MPX_RECOVERING)
        return;
    struct cons_rbuf rd = m->ents;
    for (uint32_t e = 0; e < m->nents; e++) {
        uint64_t index, ballot;
        mpx__entry_peek(&rd, &index, &ballot);
        struct mpx_slot *s = mpx__slot(r, index);
        int take = s && index > r->commit && !(s->index == index && s->chosen);
        if (mpx__entry_into(r, &rd, take ? s : NULL) < 0)
            break; /* no room: the rest is asked for again once applied */
        if (take) {
            /* Chosen values are safe to hold at any ballot >= the one that
             * chose them; the sender's is such a ballot. */
            s->chosen = 1;
            mpx__persist_entry(r, s);
        }
    }
    advance_commit(r);
    if (r->commit < m->u1 && m->nents > 0)
        mpx__send_simple(r, cons_replica(m->from), MPX_CATCHUP_REQ, 0, r->commit + 1);
}

/* What this replica lacks was compacted at the sender: fetch its state,
 * which holds every chosen entry up to some index past this one's. */
static void on_compacted(struct mpx *r, const struct mpx_msg *m)
{
    if (r->role == MPX_LEADER || r->role == MPX_RECOVERING || cons_xfer_active(&r->xfer) ||
        m->u1 <= r->applied)
        return;
    if (cons_xfer_start(&r->xfer, m->from, r->applied + 1, r->now) < 0)
        r->poisoned = 1;
}

/* A transfer message; one that completes a transfer into this (normal)
 * replica moves it to the state it brought. */
static void on_xfer(struct mpx *r, const struct mpx_msg *m)
{
    if (!mpx__xfer_msg(r, m, CONS_XFER_SERVE_ALL))
        return;
    uint64_t index = mpx__adopt_state(r);
    if (r->poisoned)
        return;
    mpx__adopt_desc(r);
    mpx__persist_trim(r, index); /* the log before it is history now */
    advance_commit(r);
    mpx__send_simple(r, cons_replica(m->from), MPX_CATCHUP_REQ, 0, r->commit + 1);
}

/* ---- clients ---------------------------------------------------------------- */

static int in_flight(const struct mpx *r, const struct cons_op *op)
{
    for (uint32_t k = 0; k < r->pend_n; k++) {
        const struct cons_op *p = &r->pending[(r->pend_head + k) % r->cfg.pending_max];
        if (p->client_id == op->client_id && p->req_no == op->req_no)
            return 1;
    }
    for (uint64_t i = r->commit + 1; i < r->next_index; i++) {
        const struct mpx_slot *s = mpx__cslot(r, i);
        for (uint8_t k = 0; s && k < s->nops; k++) {
            if (s->ops[k].client_id == op->client_id && s->ops[k].req_no == op->req_no)
                return 1;
        }
    }
    return 0;
}

/* Whether a queued request is a change (mpx.h: one at a time). */
static int change_queued(const struct mpx *r)
{
    for (uint32_t k = 0; k < r->pend_n; k++) {
        if (r->pending[(r->pend_head + k) % r->cfg.pending_max].type == CONS_OP_CONFIG)
            return 1;
    }
    return 0;
}

/* The leader's admission of a change (mpx.h, "Reconfiguration"): 0 to
 * propose it, else the answer, never logged (FK_EAGAIN: the client may
 * send the same number again; FK_EBUSY and FK_EINVAL come from the log's
 * outcome, mpx.c change_outcome). A new member must have acknowledged a slot
 * at or past the commit point in this leadership: when one has not, a
 * NO-OP goes out so that a caught-up one does and the retry passes. */
static int32_t admit_change(struct mpx *r, const struct cons_op *op)
{
    struct cons_config c;
    if (cons_config_get(op, &c) < 0 || c.members == 0 || (c.members >> r->cfg.n) != 0)
        return 0; /* refused where it is applied (FK_EINVAL) */
    if (c.epoch != r->conf.epoch)
        return 0; /* refused where it is applied (FK_EBUSY), like every replica */
    if (r->stop_at || change_queued(r))
        return FK_EAGAIN;
    uint64_t fresh = c.members & ~r->conf.members;
    int behind = 0;
    for (uint32_t p = 0; p < r->cfg.n; p++)
        behind |= (fresh >> p & 1) && p != r->cfg.id &&
                  (r->progress[p] < r->commit || r->progress[p] == 0);
    if (!behind)
        return 0;
    if (queue_noop(r))
        propose(r);
    return FK_EAGAIN;
}

static void on_request(struct mpx *r, const struct cons_op *op)
{
    if (r->role != MPX_LEADER) {
        not_leader(r, op, r->leader);
        return;
    }
    if ((r->cfg.bugs & MPX_BUG_LOCAL_READS) && op->type == CONS_OP_GET) {
        r->sm.ops->apply(r->sm.impl, op, &r->reply); /* planted bug: stale reads */
        r->reply.client_id = op->client_id;
        r->reply.req_no = op->req_no;
        mpx__reply(r, op->client_id, &r->reply);
        return;
    }
    /* Exactly once: a write applied before is answered with its kept
     * outcome; a read keeps none (cons.h), so it goes through the log
     * again, where it is read again. */
    const struct cons_ctab_row *row = cons_ctab_find(&r->ctab, op->client_id);
    if (row && op->req_no < row->req_no)
        return;
    if (row && op->req_no == row->req_no && row->status != FK_EUNKEPT) {
        r->reply.client_id = op->client_id;
        r->reply.req_no = op->req_no;
        r->reply.status = row->status;
        r->reply.len = 0;
        mpx__reply(r, op->client_id, &r->reply);
        return;
    }
    if (cons_op_nbytes(op) > CONS_OP_INLINE && cons_op_nbytes(op) > r->pend_bigs.max) {
        r->reply.client_id = op->client_id; /* more than this log ever holds (mpx.h) */
        r->reply.req_no = op->req_no;
        r->reply.status = FK_EVALSIZE;
        r->reply.len = 0;
        mpx__reply(r, op->client_id, &r->reply);
        return;
    }
    if (in_flight(r, op) || r->pend_n >= r->cfg.pending_max)
        return; /* the client retries */
    int32_t admit = op->type == CONS_OP_CONFIG ? admit_change(r, op) : 0;
    if (admit < 0) {
        r->reply.client_id = op->client_id;
        r->reply.req_no = op->req_no;
        r->reply.status = admit;
        r->reply.len = 0;
        mpx__reply(r, op->client_id, &r->reply);
        return;
    }
    uint32_t at = (r->pend_head + r->pend_n) % r->cfg.pending_max;
    if (cons_op_store(&r->pending[at], &r->pend_big[at], &r->pend_bigs, op) < 0)
        return; /* the queue holds its most large values: the client retries */
    r->pend_n++;
    propose(r);
}

/* ---- timers and dispatch ----------------------------------------------------- */

void mpx__tick(struct mpx *r)
{
    if (cons_xfer_tick(&r->xfer, r->now) < 0) {
        r->poisoned = 1;
        return;
    }
    switch (r->role) {
    case MPX_RECOVERING:
        mpx__recover_tick(r);
        break;
    case MPX_LEADER:
        if (r->now >= r->next_heartbeat) {
            r->next_heartbeat = r->now + r->cfg.heartbeat_ns;
            heartbeat(r, 0);
            for (uint64_t i = r->commit + 1; i < r->next_index; i++) {
                struct mpx_slot *s = mpx__slot(r, i);
                if (r->now - s->sent_ns >= 2 * r->cfg.heartbeat_ns)
                    s->sent_ns = r->now;
            }
        }
        propose(r);
        break;
    case MPX_CANDIDATE:
        if (r->now - r->cand_since >= r->cfg.election_ns) {
            mpx__become_follower(r); /* lost or stalled: try again later */
            break;
        }
        if (r->now >= r->next_heartbeat) {
            r->next_heartbeat = r->now + r->cfg.heartbeat_ns;
            for (uint32_t p = 0; p < r->cfg.n; p++) {
                if (p != r->cfg.id && !(r->promises >> p & 1))
                    mpx__send_simple(r, cons_replica(p), MPX_PREPARE, r->promised, r->commit + 1);
            }
        }
        break;
    case MPX_FOLLOWER:
        if (r->now >= r->election_deadline)
            start_prevote(r);
        break;
    default:
        FK_ASSERT(0);
    }
}

void mpx__dispatch(struct mpx *r, const struct mpx_msg *m, const struct cons_op *op,
                   const struct cons_input *in)
{
    (void)in;
    if (r->role == MPX_RECOVERING) {
        if (m->type == MPX_RECOVER_REPLY)
            mpx__on_recover_reply(r, m);
        else if (m->type == MPX_RECOVER_GEN)
            mpx__on_recover_gen(r, m);
        else if (m->type == MPX_XFER && mpx__xfer_msg(r, m, CONS_XFER_SERVE_NONE))
            mpx__recover_fetched(r);
        else if (m->type == MPX_REQUEST)
            on_request(r, op);
        return;
    }
    switch (m->type) {
    case MPX_REQUEST:
        on_request(r, op);
        break;
    case MPX_PREVOTE:
        on_prevote(r, m);
        break;
    case MPX_PREVOTE_OK:
        on_prevote_ok(r, m);
        break;
    case MPX_PREPARE:
        on_prepare(r, m);
        break;
    case MPX_PROMISE:
        on_promise(r, m);
        break;
    case MPX_NACK:
        on_nack(r, m);
        break;
    case MPX_ACCEPT:
        on_accept(r, m);
        break;
    case MPX_ACCEPTED:
        on_accepted(r, m);
        break;
    case MPX_COMMIT:
        on_commit(r, m);
        break;
    case MPX_CATCHUP_REQ:
        on_catchup_req(r, m);
        break;
    case MPX_CATCHUP:
        on_catchup(r, m);
        break;
    case MPX_XFER:
        on_xfer(r, m);
        break;
    case MPX_COMPACTED:
        on_compacted(r, m);
        break;
    case MPX_RECOVER:
        mpx__on_recover(r, m);
        break;
    case MPX_TIMEOUT_NOW:
        on_timeout_now(r, m);
        break;
    default:
        break; /* REPLY, RECOVER_REPLY, RECOVER_GEN: not for a normal replica */
    }
}
