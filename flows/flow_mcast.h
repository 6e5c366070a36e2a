/*
 * flow_mcast.h: what the two halves of multicast replicate flows share
 * (flow_mcast.c; flow_mcast_send.c, the source; flow_mcast_recv.c, the
 * target): the datagram header, the timers, and struct flow__mcast, the
 * state either side keeps. Not a public header.
 */
#ifndef FLOW_MCAST_H
#define FLOW_MCAST_H

#include "flow_internal.h"

#include "fk_time.h"

#include <stdint.h>

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

/* The pool's entry i (a header and one tuple). */
static inline uint8_t *flow__mc_entry(struct flow__mcast *m, uint64_t i)
{
    return m->pool + (i % m->nentries) * m->dsize;
}

/* A side's state: a datagram endpoint and a pool of nentries entries of
 * dsize bytes, charged to the node's memory (exempt as the flow). */
int flow__mc_alloc(flow_node *n, int exempt, struct flow__mcast **out, uint32_t W, uint32_t dsize,
                   uint32_t nentries);
void flow__mc_free(flow_node *n, struct flow__mcast *m);

#endif /* FLOW_MCAST_H */
