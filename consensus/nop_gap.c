/* nop_gap.c: NOPaxos gap agreement (section 5.2.2): the leader decides a
 * slot the OUM dropped, request or NO-OP, and every follower learns it. */
#include "nop_internal.h"

#include "fk_assert.h"
#include "fk_error.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- gap agreement (section 5.2.2) ------------------------------------------ */

void nop__on_gap_find(struct nop *r, const struct nop_msg *m)
{
    if (!nop__is_leader(r) || m->u1 == 0 || m->u1 > r->log_len ||
        (m->u1 <= r->snap && !nop__hist_entry(r, m->u1)))
        return; /* compacted and gone: sync tells the follower to fetch a state */
    struct cons_wbuf w;
    nop__begin(r, &w, NOP_GAP_RECV, nop__pack(r->view));
    nop__put_segment(r, &w, m->u1, m->u1);
    nop__send(r, &w, cons_replica(m->from));
}

/* Places the leader's entry e at slot on a follower. */
void nop__follower_put(struct nop *r, uint64_t slot, const struct nop_entry *e)
{
    if (slot <= r->commit || slot > r->log_len + 1 || !nop__fits(r, slot))
        return; /* committed (identical), not contiguous, or no room yet */
    if (slot <= r->log_len)
        nop__entry_copy(nop__ent(r, slot), e);
    else
        nop__append(r, e);
    nop__touch(r, slot);
    if (slot <= r->executed && *nop__sig(r, slot) != nop__entry_hash(e))
        nop__rollback(r, slot - 1); /* executed as an old leader, replaced (cannot happen
                                       after enter_view's check; kept for the disk's sake) */
    if (r->find_slot && r->find_slot <= r->log_len)
        r->find_slot = 0;
}

void nop__on_gap_recv(struct nop *r, const struct nop_msg *m)
{
    struct cons_rbuf rd = m->ents;
    struct nop_entry e;
    nop__entry_next(&rd, &e);
    uint64_t before = r->log_len;
    nop__follower_put(r, m->lo, &e);
    if (r->log_len > before && e.kind == NOP_ENT_REQ)
        nop__ack_request(r, r->log_len, &e.op);
    nop__drain(r);
}

/* NO-OPs for slots lo..u1 (one slot but in durable mode); confirmed only
 * once this follower holds every one of them. */
void nop__on_gap_commit(struct nop *r, const struct nop_msg *m)
{
    uint64_t lo = m->u2;
    if (m->u1 == 0 || lo == 0 || lo > r->log_len + 1 || m->u1 <= r->commit ||
        !nop__fits(r, m->u1)) {
        if (m->u1 != 0 && m->u1 <= r->commit)
            nop__send_u64(r, m->from, NOP_GAP_COMMIT_REP, m->u1);
        return;
    }
    for (uint64_t s = lo; s <= m->u1; s++)
        nop__follower_put(r, s, &nop__noop_entry);
    nop__send_u64(r, m->from, NOP_GAP_COMMIT_REP, m->u1);
    nop__drain(r);
}

void nop__on_gap_commit_rep(struct nop *r, const struct nop_msg *m)
{
    if (!nop__is_leader(r) || !r->gap_slot || m->u1 != r->gap_slot)
        return;
    r->gap_acks |= 1ull << m->from;
    if ((uint32_t)__builtin_popcountll(r->gap_acks) >= r->f) {
        r->gap_noops += r->gap_slot - r->gap_lo + 1;
        r->gap_slot = 0;
        nop__drain(r);
    }
}
