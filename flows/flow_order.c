/*
 * flow_order.c: global order at the targets of an ordered replicate flow
 * over rings (DFI section 5.4; NOPaxos's ordered unreliable multicast,
 * OSDI 2016 section 4).
 *
 * Every segment carries (session, seq) taken from the sequencer by one
 * fetch-and-add of its tuple count: its tuples are numbered seq, seq + 1,
 * ..., so a bandwidth-mode segment of many tuples costs one round trip to
 * the sequencer and every tuple still has its own number (NOPaxos numbers
 * each message). Each source's ring holds its segments in increasing seq,
 * so the next deliverable tuple is always at the head of some ring: the
 * target scans the heads and delivers the one numbered expected, in place
 * (no copy). A head with an older session or number is a late duplicate
 * and is dropped (the part of a segment already reported as a gap is
 * skipped). When a later seq is visible but expected has not come for
 * gap_timeout_ns, the consumer gets FK_EGAP(expected) and the flow moves on;
 * a head with a newer session ends the old one: the consumer gets
 * FK_ESESSION and numbering restarts at 0.
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_time.h"

#include <assert.h>
#include <stdlib.h>

struct flow__order {
    uint32_t session;
    uint64_t expected;
    uint64_t wait_since; /* when a later seq was first seen; 0 = not waiting */
    uint64_t gap_until;  /* every seq below this has waited out the timeout */
};

int flow__order_init(flow_target *t)
{
    t->order = calloc(1, sizeof(*t->order));
    if (t->order == NULL)
        return FK_ENOMEM;
    t->order->session = t->desc.seq_session;
    return 0;
}

void flow__order_free(flow_target *t)
{
    free(t->order);
    t->order = NULL;
}

/* What the scan of ring heads found. */
struct scan {
    int deliver;          /* slot holding expected, or -1 */
    uint64_t later;       /* smallest head seq of this session beyond expected; 0 = none */
    uint32_t new_session; /* smallest newer session seen, 0 = none */
};

static void scan_heads(flow_target *t, struct scan *sc)
{
    struct flow__order *o = t->order;
    sc->deliver = -1;
    sc->later = 0;
    sc->new_session = 0;
    for (uint32_t i = 0; i < flow__slots_hi(t); i++) {
        uint64_t st;
        while (flow__head_state(t, i, &st)) {
            struct flow__slot *s = &t->slots[i];
            uint64_t first = flow__footer_of(t, flow__seg(t, i, s->head))->seq;
            uint64_t seq = first + s->pos; /* the head tuple's number */
            uint32_t sess = FOOT_SESSION(st);
            if (sess == o->session && seq < o->expected && o->expected < first + FOOT_COUNT(st)) {
                s->pos = (uint32_t)(o->expected - first); /* its start was reported as a gap */
                seq = o->expected;
            }
            if (sess < o->session || (sess == o->session && seq < o->expected)) {
                flow__release_head(t, i); /* late duplicate or old session */
                continue;
            }
            if (sess > o->session) {
                if (sc->new_session == 0 || sess < sc->new_session)
                    sc->new_session = sess;
            } else if (seq == o->expected) {
                sc->deliver = (int)i;
            } else if (sc->later == 0 || seq < sc->later) {
                sc->later = seq;
            }
            break;
        }
    }
}

int flow__order_next(flow_target *t, struct flow_item *item)
{
    struct flow__order *o = t->order;
    if (t->release_slot >= 0) {
        flow__release_head(t, (uint32_t)t->release_slot);
        t->release_slot = -1;
    }
    struct scan sc;
    scan_heads(t, &sc);
    if (sc.deliver >= 0) {
        uint32_t i = (uint32_t)sc.deliver;
        struct flow__slot *s = &t->slots[i];
        uint8_t *seg = flow__seg(t, i, s->head);
        uint64_t st = fab_load64(&flow__footer_of(t, seg)->state);
        assert(s->pos < FOOT_COUNT(st));
        item->tuple = seg + (uint64_t)s->pos * t->desc.schema.tuple_size;
        item->seq = o->expected;
        item->session = o->session;
        item->source = (int)i;
        o->expected++;
        if (++s->pos == FOOT_COUNT(st))
            t->release_slot = (int)i;
        o->wait_since = 0;
        return 0;
    }
    if (sc.new_session != 0) {
        o->session = sc.new_session;
        o->expected = 0;
        o->wait_since = 0;
        o->gap_until = 0;
        item->session = o->session;
        item->seq = 0;
        return FK_ESESSION;
    }
    if (sc.later && o->expected < o->gap_until) {
        /* A run of missing numbers: each was stamped before the later one
         * that has been visible for the whole timeout, so none of them is
         * owed a fresh wait (a target that joined behind the sequencer, a
         * restarted replica, reports the run at once, not one per timeout). */
        item->seq = o->expected++;
        item->session = o->session;
        item->tuple = NULL;
        return FK_EGAP;
    }
    if (sc.later) {
        uint64_t now = fk_now_ns();
        if (o->wait_since == 0) {
            o->wait_since = now;
        } else if (now - o->wait_since >= t->desc.opts.gap_timeout_ns) {
            o->gap_until = sc.later;
            item->seq = o->expected++;
            item->session = o->session;
            item->tuple = NULL;
            o->wait_since = 0;
            return FK_EGAP;
        }
    }
    return flow__all_ended(t) ? FK_EEND : FK_EAGAIN;
}
