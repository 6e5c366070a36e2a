/*
 * flow_mcast.c: replicate flows over multicast datagrams (DFI section 5.4),
 * what both halves share: the sending half is flow_mcast_send.c, the
 * receiving half flow_mcast_recv.c.
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
#include "flow_mcast.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint64_t flow__mc_src_id(const char *ep_addr)
{
    return ep_addr[0] ? XXH64(ep_addr, strlen(ep_addr), 0x51) : 0;
}

const char *flow__mc_ep_addr(const flow_target *t)
{
    return fab_ep_addr(t->mc->ep);
}

int flow__mc_alloc(flow_node *n, int exempt, struct flow__mcast **out, uint32_t W, uint32_t dsize,
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

void flow__mc_free(flow_node *n, struct flow__mcast *m)
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
