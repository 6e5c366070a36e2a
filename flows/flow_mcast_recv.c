/* flow_mcast_recv.c: the receiving half of multicast replicate flows
 * (flow_mcast.c says how they work): a target takes datagrams, settles
 * each source's sequence, sends credits and loss reports back, and
 * delivers tuples in source order or, ordered, in the sequencer's order
 * with gaps reported after the gap timeout (NOPaxos section 4). */
#include "flow_mcast.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int flow__mc_target_init(flow_target *t)
{
    uint32_t W = t->desc.opts.segments;
    uint32_t n = t->desc.opts.ordered ? W * t->nslots : W * t->nslots;
    int rc = flow__mc_alloc(t->node, t->desc.opts.exempt, &t->mc, W,
                            (uint32_t)sizeof(struct mc_hdr) + t->desc.schema.tuple_size, n);
    if (rc == 0) {
        t->mc->session = t->desc.seq_session;
        t->slot_reset = flow__mc_slot_reset; /* flow_ring.c calls it when a slot ends */
    }
    if (rc == 0 && fab_node_has_mcast(flow__fab(t->node)))
        rc = fab_ep_mcast_join(t->mc->ep, t->desc.opts.group);
    return rc;
}

void flow__mc_target_free(flow_target *t)
{
    flow__mc_free(t->node, t->mc);
    t->mc = NULL;
}

void flow__mc_slot_reset(flow_target *t, uint32_t i)
{
    struct flow__mcast *m = t->mc;
    memset(&m->src[i], 0, sizeof(m->src[i]));
    if (!t->desc.opts.ordered)
        memset(m->present + (uint64_t)i * m->W, 0, m->W);
}

static void send_ctl(flow_target *t, uint32_t i, uint32_t type, uint64_t sseq, uint64_t flag)
{
    struct mc_hdr h = {.type = type, .sseq = sseq, .gseq = flag};
    fab_ep_send(t->mc->ep, t->slots[i].mcast_ep, &h, sizeof(h));
}

/* Sends slot i's credit when a quarter window was settled, or periodically
 * while something is unacknowledged (credits are datagrams too). */
static void maybe_credit(flow_target *t, uint32_t i, uint64_t now, int force)
{
    struct mc_src *s = &t->mc->src[i];
    if (force || s->settled - s->acked >= (t->mc->W / 4 ? t->mc->W / 4 : 1) ||
        (s->settled != s->acked && now - s->credit_at >= CREDIT_EVERY_NS)) {
        send_ctl(t, i, MC_CREDIT, s->settled, (uint64_t)s->end_seen);
        s->acked = s->settled;
        s->credit_at = now;
    }
}

/* A resent datagram we already settled means our credit was lost: repeat
 * it (at most once a millisecond). */
static void resent_credit(flow_target *t, uint32_t i)
{
    uint64_t now = fk_now_ns();
    if (now - t->mc->src[i].credit_at >= FK_NSEC_PER_MSEC)
        maybe_credit(t, i, now, 1);
}

static int find_slot(flow_target *t, uint64_t id)
{
    /* status first (acquire): the slot's fields are stable while attached. */
    for (uint32_t i = 0; i < t->nslots; i++)
        if (__atomic_load_n(&t->slots[i].status, __ATOMIC_ACQUIRE) == SLOT_ATTACHED &&
            t->slots[i].src_id == id)
            return (int)i;
    return -1;
}

/* Stores one received DATA datagram (from m->rx); drops duplicates. */
static void on_data(flow_target *t, uint32_t i, const struct mc_hdr *h, size_t len)
{
    struct flow__mcast *m = t->mc;
    struct mc_src *s = &m->src[i];
    uint64_t idx;
    if (len != m->dsize)
        return;
    if (t->desc.opts.ordered) {
        /* One entry less than the pool: the delivered entry is still held. */
        if (h->session != m->session || h->gseq < m->expected ||
            h->gseq + 1 >= m->expected + m->nentries) {
            if (h->session == m->session && h->gseq < m->expected && h->sseq + 1 > s->settled)
                s->settled = h->sseq + 1; /* a resent datagram we skipped: settled */
            if (h->session == m->session && h->gseq < m->expected)
                resent_credit(t, i);
            return;
        }
        idx = h->gseq;
        if (h->gseq > m->max_seen || !m->seen_any)
            m->max_seen = h->gseq;
        m->seen_any = 1;
    } else {
        if (h->sseq < s->next) {
            resent_credit(t, i);
            return; /* duplicate */
        }
        if (h->sseq >= s->next + m->W)
            return; /* beyond the credit window */
        if (h->sseq > s->next)
            s->hole = 1;
        idx = (uint64_t)i * m->W + h->sseq % m->W;
    }
    uint8_t *e = t->desc.opts.ordered ? flow__mc_entry(m, idx) : m->pool + idx * m->dsize;
    uint8_t *present = t->desc.opts.ordered ? &m->present[idx % m->nentries] : &m->present[idx];
    if (*present)
        return; /* duplicate of a buffered datagram */
    memcpy(e, m->rx, len);
    *present = (uint8_t)(i + 1);
    s->buffered++;
}

/* Handles one datagram; returns FK_ESESSION when a newer session began. */
static int on_datagram(flow_target *t, size_t len, uint64_t now)
{
    struct flow__mcast *m = t->mc;
    struct mc_hdr h;
    if (len < sizeof(h))
        return 0;
    memcpy(&h, m->rx, sizeof(h));
    int i = find_slot(t, h.src_id);
    if (i < 0)
        return 0; /* not attached (yet, or any more) */
    if (h.type == MC_END) {
        m->src[i].end_seen = 1;
        m->src[i].end_count = h.sseq;
        maybe_credit(t, (uint32_t)i, now, 1);
        return 0;
    }
    if (h.type != MC_DATA)
        return 0;
    if (t->desc.opts.ordered && h.session > m->session) {
        /* NOPaxos: a new sequencer session ends the old one; what was not
         * delivered of it counts as dropped. */
        memset(m->present, 0, m->nentries);
        for (uint32_t k = 0; k < t->nslots; k++)
            m->src[k].buffered = 0;
        m->release = -1;
        m->session = h.session;
        m->expected = 0;
        m->seen_any = 0;
        m->wait_since = 0;
        on_data(t, (uint32_t)i, &h, len);
        return FK_ESESSION;
    }
    on_data(t, (uint32_t)i, &h, len);
    return 0;
}

/* Frees the entry delivered by the previous call and settles it. */
static void release_prev(flow_target *t)
{
    struct flow__mcast *m = t->mc;
    if (m->release < 0)
        return;
    struct mc_src *s = &m->src[m->release_slot];
    if (t->desc.opts.ordered) {
        struct mc_hdr h;
        memcpy(&h, flow__mc_entry(m, (uint64_t)m->release), sizeof(h));
        m->present[(uint64_t)m->release % m->nentries] = 0;
        if (h.sseq + 1 > s->settled)
            s->settled = h.sseq + 1;
    } else {
        m->present[m->release] = 0;
        s->settled = s->next;
    }
    if (s->buffered > 0)
        s->buffered--;
    m->release = -1;
}

static void deliver(flow_target *t, struct flow_item *item, uint8_t *e, uint32_t slot, int64_t idx)
{
    struct mc_hdr h;
    memcpy(&h, e, sizeof(h));
    item->tuple = e + sizeof(h);
    item->seq = t->desc.opts.ordered ? h.gseq : h.sseq;
    item->session = h.session;
    item->source = (int)slot;
    t->mc->release = idx;
    t->mc->release_slot = slot;
}

static int try_deliver(flow_target *t, struct flow_item *item)
{
    struct flow__mcast *m = t->mc;
    if (t->desc.opts.ordered) {
        uint64_t idx = m->expected % m->nentries;
        if (!m->present[idx])
            return FK_EAGAIN;
        struct mc_hdr h;
        memcpy(&h, flow__mc_entry(m, m->expected), sizeof(h));
        assert(h.gseq == m->expected);
        deliver(t, item, flow__mc_entry(m, m->expected), m->present[idx] - 1u,
                (int64_t)m->expected);
        m->expected++;
        m->wait_since = 0;
        return 0;
    }
    for (uint32_t k = 0; k < t->nslots; k++) {
        uint32_t i = (m->cursor + k) % t->nslots;
        struct mc_src *s = &m->src[i];
        uint64_t idx = (uint64_t)i * m->W + s->next % m->W;
        if (!m->present[idx])
            continue;
        deliver(t, item, m->pool + idx * m->dsize, i, (int64_t)idx);
        s->next++;
        m->cursor = i + 1;
        return 0;
    }
    return FK_EAGAIN;
}

/* Credits, loss reports and the end of finished sources. */
static void housekeeping(flow_target *t, uint64_t now)
{
    struct flow__mcast *m = t->mc;
    for (uint32_t i = 0; i < t->nslots; i++) {
        if (__atomic_load_n(&t->slots[i].status, __ATOMIC_ACQUIRE) != SLOT_ATTACHED)
            continue;
        struct mc_src *s = &m->src[i];
        /* Every datagram of an ended source is settled before its slot
         * goes: the source resends until our credit covers them all. */
        int done = t->desc.opts.ordered
                       ? s->end_seen && s->buffered == 0 && s->settled >= s->end_count
                       : s->end_seen && s->next >= s->end_count;
        if (done) {
            s->settled = s->end_count;
            for (int copies = 0; copies < 3; copies++) /* credits are datagrams too */
                maybe_credit(t, i, now, 1);
        }
        if (done || (__atomic_load_n(&t->slots[i].dead, __ATOMIC_ACQUIRE) && s->buffered == 0)) {
            flow__end_slot(t, i);
            continue;
        }
        maybe_credit(t, i, now, 0);
        if (!t->desc.opts.ordered && s->hole && now - s->nack_at >= NACK_EVERY_NS) {
            if (m->present[(uint64_t)i * m->W + s->next % m->W]) {
                s->hole = 0;
            } else {
                send_ctl(t, i, MC_NACK, s->next, 0); /* loss report */
                s->nack_at = now;
            }
        }
    }
}

/* Ordered: after gap_timeout with a later gseq buffered, report the hole. */
static int check_gap(flow_target *t, struct flow_item *item, uint64_t now)
{
    struct flow__mcast *m = t->mc;
    if (!t->desc.opts.ordered || !m->seen_any || m->max_seen <= m->expected)
        return FK_EAGAIN;
    if (m->wait_since == 0) {
        m->wait_since = now;
        return FK_EAGAIN;
    }
    if (now - m->wait_since < t->desc.opts.gap_timeout_ns)
        return FK_EAGAIN;
    item->tuple = NULL;
    item->seq = m->expected++;
    item->session = m->session;
    m->wait_since = 0;
    return FK_EGAP;
}

int flow__mc_next(flow_target *t, struct flow_item *item, uint64_t deadline)
{
    struct flow__mcast *m = t->mc;
    release_prev(t);
    for (;;) {
        uint64_t now = fk_now_ns();
        int rc = try_deliver(t, item);
        if (rc != FK_EAGAIN)
            return rc;
        rc = check_gap(t, item, now);
        if (rc != FK_EAGAIN)
            return rc;
        housekeeping(t, now);
        if (flow__all_ended(t))
            return FK_EEND;
        if (now >= deadline)
            return FK_ETIMEDOUT;
        uint64_t slice = deadline - now < FK_NSEC_PER_MSEC ? deadline - now : FK_NSEC_PER_MSEC;
        for (int k = 0; k < 64; k++) {
            int n = fab_ep_recv(m->ep, m->rx, sizeof(m->rx), NULL, k == 0 ? slice : 0);
            if (n <= 0)
                break;
            if (on_datagram(t, (size_t)n, now) == FK_ESESSION) {
                item->session = m->session;
                item->seq = 0;
                item->tuple = NULL;
                return FK_ESESSION;
            }
        }
    }
}
