/* flow_mcast_send.c: the sending half of multicast replicate flows
 * (flow_mcast.c says how they work): a source sends each tuple once as a
 * datagram, keeps a window of unsettled ones for retransmission, and
 * waits on the targets' credits. */
#include "flow_mcast.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int flow__mc_source_init(flow_source *s)
{
    uint32_t W = s->desc.opts.segments;
    int rc = flow__mc_alloc(s->node, s->desc.opts.exempt, &s->mc, W,
                            (uint32_t)sizeof(struct mc_hdr) + s->desc.schema.tuple_size, W);
    if (rc == 0)
        s->mc->id = flow__mc_src_id(fab_ep_addr(s->mc->ep));
    return rc;
}

void flow__mc_source_free(flow_source *s)
{
    flow__mc_free(s->node, s->mc);
    s->mc = NULL;
}

const char *flow__mc_source_ep(const flow_source *s)
{
    return fab_ep_addr(s->mc->ep);
}

static int members(flow_source *s)
{
    int n = 0;
    for (uint32_t k = 0; k < s->desc.ntargets; k++)
        if (s->t[k].state == 1)
            s->mc->members[n++] = s->t[k].mcast_ep;
    return n;
}

static uint64_t min_ack(flow_source *s)
{
    uint64_t lo = s->mc->sent;
    for (uint32_t k = 0; k < s->desc.ntargets; k++)
        if (s->t[k].state == 1 && s->mc->ack[k] < lo)
            lo = s->mc->ack[k];
    return lo;
}

static void resend(flow_source *s, int k, uint64_t from)
{
    struct flow__mcast *m = s->mc;
    for (uint64_t q = from; q < m->sent && m->sent - q <= m->W; q++)
        fab_ep_send(m->ep, s->t[k].mcast_ep, flow__mc_entry(m, q), m->dsize);
}

/* Handles credits and loss reports waiting at the source's endpoint. */
static int source_incoming(flow_source *s, uint64_t timeout_ns)
{
    struct flow__mcast *m = s->mc;
    char from[FAB_ADDR_MAX];
    int progress = 0;
    for (int n = 0; n < 64; n++) {
        int len = fab_ep_recv(m->ep, m->rx, sizeof(m->rx), from, n == 0 ? timeout_ns : 0);
        if (len < (int)sizeof(struct mc_hdr))
            break;
        struct mc_hdr h;
        memcpy(&h, m->rx, sizeof(h));
        int k = -1;
        for (uint32_t i = 0; i < s->desc.ntargets && k < 0; i++)
            if (s->t[i].state == 1 && strcmp(s->t[i].mcast_ep, from) == 0)
                k = (int)i;
        if (k < 0)
            continue;
        if (h.type == MC_CREDIT) {
            if (h.sseq > m->ack[k] && h.sseq <= m->sent) {
                m->ack[k] = h.sseq;
                progress = 1;
            }
            m->end_ack[k] |= h.gseq != 0;
        } else if (h.type == MC_NACK && h.sseq >= m->ack[k] && h.sseq < m->sent &&
                   m->sent - h.sseq <= m->W) {
            fab_ep_send(m->ep, s->t[k].mcast_ep, flow__mc_entry(m, h.sseq), m->dsize);
        }
    }
    return progress;
}

/* Waits until the credit window has room; resends on a stall. */
static int wait_window(flow_source *s)
{
    struct flow__mcast *m = s->mc;
    uint64_t deadline = fk_now_ns() + s->timeout_ns;
    uint64_t stall = STALL_NS;
    if (s->desc.opts.ordered && stall < 2 * s->desc.opts.gap_timeout_ns)
        stall = 2 * s->desc.opts.gap_timeout_ns;
    while (m->sent - min_ack(s) >= m->W) {
        uint64_t now = fk_now_ns();
        if (now >= deadline)
            return FK_ETIMEDOUT;
        if (m->stall_since == 0)
            m->stall_since = now;
        if (source_incoming(s, FK_NSEC_PER_MSEC)) {
            m->stall_since = 0;
        } else if (now - m->stall_since >= stall) {
            for (uint32_t k = 0; k < s->desc.ntargets; k++)
                if (s->t[k].state == 1 && m->ack[k] < m->sent)
                    resend(s, (int)k, m->ack[k]);
            m->stall_since = now;
        }
    }
    m->stall_since = 0;
    return 0;
}

int flow__mc_push(flow_source *s, const void *tuple)
{
    struct flow__mcast *m = s->mc;
    int rc = wait_window(s);
    if (rc < 0)
        return rc;
    struct mc_hdr h = {.type = MC_DATA, .src_id = m->id, .sseq = m->sent};
    if (s->desc.opts.ordered) {
        rc = flow__seq_take(s, 1, &h.gseq);
        if (rc < 0)
            return rc;
        h.session = s->session;
    }
    uint8_t *e = flow__mc_entry(m, m->sent);
    memcpy(e, &h, sizeof(h));
    memcpy(e + sizeof(h), tuple, s->desc.schema.tuple_size);
    int n = members(s);
    if (n == 0)
        return FK_ECLOSED;
    rc = fab_ep_mcast_send(m->ep, s->desc.opts.group, m->members, n, e, m->dsize);
    if (rc < 0)
        return rc;
    m->sent++;
    if ((m->sent & 7) == 0 || m->sent - min_ack(s) >= m->W / 2)
        source_incoming(s, 0);
    return 0;
}

/* Sends END until every live target acknowledged it (and, unordered, every
 * datagram), resending what is unsettled; bounded by END_WAIT_NS. */
int flow__mc_close(flow_source *s)
{
    struct flow__mcast *m = s->mc;
    struct mc_hdr h = {.type = MC_END, .src_id = m->id, .sseq = m->sent};
    uint64_t deadline = fk_now_ns() + END_WAIT_NS;
    for (;;) {
        int n = members(s), pending = 0;
        if (n == 0)
            return 0;
        fab_ep_mcast_send(m->ep, s->desc.opts.group, m->members, n, &h, sizeof(h));
        for (uint32_t k = 0; k < s->desc.ntargets; k++) {
            if (s->t[k].state != 1)
                continue;
            int done = m->end_ack[k] && m->ack[k] >= m->sent;
            if (!done) {
                pending = 1;
                if (m->ack[k] < m->sent)
                    resend(s, (int)k, m->ack[k]);
            }
        }
        if (!pending)
            return 0;
        if (fk_now_ns() >= deadline) {
            for (uint32_t k = 0; k < s->desc.ntargets; k++)
                fk_warn("flows",
                        "flow %s: end not acknowledged by target %u (acked %llu of %llu, end %d)",
                        s->desc.name, k, (unsigned long long)m->ack[k], (unsigned long long)m->sent,
                        m->end_ack[k]);
            return FK_ETIMEDOUT;
        }
        source_incoming(s, 10 * FK_NSEC_PER_MSEC);
    }
}
