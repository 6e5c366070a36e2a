/* nop_normal.c: NOPaxos normal operation over the ordered unreliable
 * multicast (section 5.2.1): requests in OUM order into the log, drop
 * notifications, the leader's replies. */
#include "nop_internal.h"

#include "fk_assert.h"
#include "fk_error.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- normal operation over the OUM (section 5.2.1) ------------------------ */

/* The next OUM message number; 0 while a state transfer left this replica
 * before the session's first slot (sync fills the gap). */
uint64_t nop__expected(const struct nop *r)
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
const struct nop_entry nop__noop_entry = {.kind = NOP_ENT_NOOP};

void nop__append(struct nop *r, const struct nop_entry *e)
{
    FK_ASSERT(nop__fits(r, r->log_len + 1));
    nop__entry_copy(nop__ent(r, ++r->log_len), e);
    nop__touch(r, r->log_len);
}

void nop__ack_request(struct nop *r, uint64_t slot, const struct cons_op *op)
{
    memset(&r->reply, 0, offsetof(struct cons_reply, data));
    r->reply.client_id = op->client_id;
    r->reply.req_no = op->req_no;
    nop__reply(r, slot, 0, &r->reply);
}

void nop__send_gap_commits(struct nop *r)
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
        nop__append(r, &nop__noop_entry);
        r->gap_lo = r->log_len;
        while (r->cfg.durable && nop__fits(r, r->log_len + 1) &&
               r->log_len - r->snap < nop__leader_stop_gap(r) && take_drop(r, nop__expected(r)))
            nop__append(r, &nop__noop_entry);
        nop__execute_to(r, r->log_len, 1);
        r->gap_slot = r->log_len;
        r->gap_acks = 0;
        nop__send_gap_commits(r);
        return;
    }
    if (r->cfg.bugs & NOP_BUG_NO_GAP_AGREEMENT) {
        nop__append(r, &nop__noop_entry); /* planted bug: decides the gap alone */
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
           !(full = nop__is_leader(r) && r->log_len - r->snap >= nop__leader_stop_gap(r))) {
        uint64_t want = nop__expected(r);
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
            nop__append(r, &nop__noop_entry);
            if (nop__is_leader(r))
                nop__execute_to(r, r->log_len, 1);
            continue;
        }
        /* Straight from the OUM buffer into the ring: no copy between. */
        FK_ASSERT(nop__fits(r, r->log_len + 1));
        struct nop_entry *e = nop__ent(r, ++r->log_len);
        e->kind = NOP_ENT_REQ;
        cons_op_copy(&e->op, &s->op);
        nop__touch(r, r->log_len);
        if (nop__is_leader(r))
            nop__execute_to(r, r->log_len, 1);
        else
            nop__ack_request(r, r->log_len, &e->op);
        if (!nop__is_leader(r) && (r->cfg.bugs & NOP_BUG_FOLLOWER_EXEC))
            nop__execute_to(r, r->log_len, 0); /* planted bug */
    }
    /* Stopped at the stop gap with the next message waiting: a stall. */
    uint64_t want = full ? nop__expected(r) : 0;
    const struct nop_oum *s = &r->oum[want % NOP_OUM_BUF];
    int waiting = want && oum_holds(r, s, want);
    r->stalls += waiting && !r->stalled;
    r->stalled = waiting;
}

void nop__on_oum(struct nop *r, const struct nop_msg *m, const struct cons_op *op)
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
    uint64_t want = nop__expected(r), num = m->u1;
    if (want == 0 || num < want)
        return; /* old, or waiting for the session's start */
    if (num >= want + NOP_OUM_BUF) {
        /* Beyond the buffer: in OUM order everything before it was dropped,
         * and it is dropped too (the client retries). */
        r->oum_overflows++;
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
