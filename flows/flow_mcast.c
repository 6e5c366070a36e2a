/*
 * flow_mcast.c: replicate flows over multicast datagrams (DFI section 5.4).
 *
 * A source sends each tuple once, as one datagram to the flow's group (one
 * unicast per target where the network has no multicast). Datagrams can be
 * lost, duplicated by retransmission, or reordered, so:
 *   - every datagram carries the source's id and its per-source sequence
 *     number (sseq), plus (session, gseq) from the sequencer when ordered;
 *   - targets send credits back (how many of the source's datagrams they
 *     settled); a source keeps at most W = segments datagrams unsettled and
 *     retains them for retransmission (credit back-flow);
 *   - unordered flows are reliable: a target that sees a hole in a source's
 *     sseq sends a loss report (NACK) and the source retransmits;
 *   - ordered flows follow NOPaxos's OUM (OSDI 2016 section 4): no
 *     retransmission fills a hole before the gap timeout; the consumer gets
 *     FK_EGAP(gseq) and the flow moves on;
 *   - duplicates (sseq or gseq already settled or buffered) are dropped.
 * A stalled source (window full, no credit for a while) resends what is
 * unsettled, which also recovers lost credits and a lost tail.
 *
 * Target memory: W entries per source slot (unordered) or W * max_sources
 * entries indexed by gseq (ordered), each a header plus one tuple; source
 * memory: W retained datagrams.
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { MC_DATA = 1, MC_END, MC_CREDIT, MC_NACK };

struct mc_hdr {
    uint32_t type;
    uint32_t session;
    uint64_t src_id;
    uint64_t sseq; /* DATA/NACK: sequence; END: datagrams sent; CREDIT: settled count */
    uint64_t gseq; /* DATA: global sequence (ordered); CREDIT: end seen */
};
_Static_assert(sizeof(struct mc_hdr) == 32, "datagram header is 32 bytes");
_Static_assert(FLOW_TUPLE_MAX + sizeof(struct mc_hdr) <= FAB_DGRAM_MAX, "a tuple fits a datagram");

#define CREDIT_EVERY_NS (5 * FK_NSEC_PER_MSEC)
#define NACK_EVERY_NS   (2 * FK_NSEC_PER_MSEC)
#define STALL_NS        (20 * FK_NSEC_PER_MSEC)
#define END_WAIT_NS     (5 * FK_NSEC_PER_SEC)

struct mc_src {       /* a target's view of one source slot */
    uint64_t next;    /* unordered: next sseq to deliver */
    uint64_t settled; /* sseqs below this are delivered or skipped */
    uint64_t acked;   /* settled count last sent as credit */
    uint64_t end_count;
    int end_seen;
    uint64_t credit_at, nack_at;
    uint32_t buffered; /* ordered: entries of this source in the pool */
    int hole;          /* unordered: a later sseq arrived before next */
};

struct flow__mcast {
    fab_ep *ep;
    uint32_t W;     /* window: datagrams per source in flight */
    uint32_t dsize; /* header + tuple */
    uint32_t nentries;
    uint8_t *pool; /* nentries * dsize */
    uint8_t *present;
    uint64_t pool_bytes;
    int exempt; /* the flow's opts.exempt (flow__mem_charge) */
    struct mc_src src[FLOW_SOURCES_MAX];
    /* ordered targets */
    uint32_t session;
    uint64_t expected, max_seen, wait_since;
    int seen_any;
    /* the entry delivered last, released on the next call */
    int64_t release;
    uint32_t release_slot;
    uint32_t cursor;
    /* sources */
    uint64_t id, sent, stall_since;
    uint64_t ack[FLOW_TARGETS_MAX];
    int end_ack[FLOW_TARGETS_MAX];
    const char *members[FLOW_TARGETS_MAX];
    uint8_t rx[FAB_DGRAM_MAX];
};

uint64_t flow__mc_src_id(const char *ep_addr)
{
    return ep_addr[0] ? XXH64(ep_addr, strlen(ep_addr), 0x51) : 0;
}

const char *flow__mc_ep_addr(const flow_target *t)
{
    return fab_ep_addr(t->mc->ep);
}

static int mc_alloc(flow_node *n, int exempt, struct flow__mcast **out, uint32_t W, uint32_t dsize,
                    uint32_t nentries)
{
    struct flow__mcast *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return FK_ENOMEM;
    *out = m;
    m->W = W;
    m->dsize = dsize;
    m->nentries = nentries;
    m->release = -1;
    m->pool_bytes = (uint64_t)nentries * dsize + nentries;
    m->exempt = exempt;
    int rc = flow__mem_charge(n, (int64_t)m->pool_bytes, exempt);
    if (rc < 0) {
        m->pool_bytes = 0;
        return rc;
    }
    m->pool = calloc(nentries, dsize);
    m->present = calloc(nentries, 1);
    if (m->pool == NULL || m->present == NULL)
        return FK_ENOMEM;
    return fab_ep_open(flow__fab(n), &m->ep);
}

static void mc_free(flow_node *n, struct flow__mcast *m)
{
    if (m == NULL)
        return;
    if (m->ep != NULL)
        fab_ep_close(m->ep);
    flow__mem_charge(n, -(int64_t)m->pool_bytes, m->exempt);
    free(m->pool);
    free(m->present);
    free(m);
}

static uint8_t *entry(struct flow__mcast *m, uint64_t i)
{
    return m->pool + (i % m->nentries) * m->dsize;
}

/* ---- target side --------------------------------------------------------------------- */

int flow__mc_target_init(flow_target *t)
{
    uint32_t W = t->desc.opts.segments;
    uint32_t n = t->desc.opts.ordered ? W * t->nslots : W * t->nslots;
    int rc = mc_alloc(t->node, t->desc.opts.exempt, &t->mc, W,
                      (uint32_t)sizeof(struct mc_hdr) + t->desc.schema.tuple_size, n);
    if (rc == 0)
        t->mc->session = t->desc.seq_session;
    if (rc == 0 && fab_node_has_mcast(flow__fab(t->node)))
        rc = fab_ep_mcast_join(t->mc->ep, t->desc.opts.group);
    return rc;
}

void flow__mc_target_free(flow_target *t)
{
    mc_free(t->node, t->mc);
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
    uint8_t *e = t->desc.opts.ordered ? entry(m, idx) : m->pool + idx * m->dsize;
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
        memcpy(&h, entry(m, (uint64_t)m->release), sizeof(h));
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
        memcpy(&h, entry(m, m->expected), sizeof(h));
        assert(h.gseq == m->expected);
        deliver(t, item, entry(m, m->expected), m->present[idx] - 1u, (int64_t)m->expected);
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

/* ---- source side ------------------------------------------------------------------------ */

int flow__mc_source_init(flow_source *s)
{
    uint32_t W = s->desc.opts.segments;
    int rc = mc_alloc(s->node, s->desc.opts.exempt, &s->mc, W,
                      (uint32_t)sizeof(struct mc_hdr) + s->desc.schema.tuple_size, W);
    if (rc == 0)
        s->mc->id = flow__mc_src_id(fab_ep_addr(s->mc->ep));
    return rc;
}

void flow__mc_source_free(flow_source *s)
{
    mc_free(s->node, s->mc);
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
        fab_ep_send(m->ep, s->t[k].mcast_ep, entry(m, q), m->dsize);
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
            fab_ep_send(m->ep, s->t[k].mcast_ep, entry(m, h.sseq), m->dsize);
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
    uint8_t *e = entry(m, m->sent);
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
