/*
 * flow_internal.h: structures shared by the flows/ implementation files.
 *
 * Memory layout of one ring (DFI section 5.1), hosted at the target, one per
 * (source slot, target), registered for remote writes:
 *
 *   ring:    [ctrl 64 B][segment 0]...[segment nseg-1]
 *   ctrl:    consumed (u64: segments the target has released; read by the
 *            source in bandwidth mode), pad
 *   segment: [payload: seg_payload bytes][footer 16 B]
 *   footer:  seq (u64: global sequence number, ordered replicate), then
 *            state (u64, the segment's last word): tuple count (bits 0-31),
 *            session (32-47), FOOT_CONSUMABLE, FOOT_END.
 *
 * The source writes payload and footer in one write (full segment, latency
 * mode) or as a batched pair (partial segment); the fabric stores the last
 * word with release semantics, so a consumer that loads state with acquire
 * and sees CONSUMABLE sees the payload (fab.h). The consumer clears state to
 * 0 before advancing consumed, so a segment is never overwritten while read.
 */
#ifndef FLOW_INTERNAL_H
#define FLOW_INTERNAL_H

#include "flow.h"

#include <pthread.h>
#include <stdint.h>

#define FLOW__CTRL_BYTES   64
#define FLOW__FOOTER_BYTES 16
#define FOOT_CONSUMABLE    (1ULL << 62)
#define FOOT_END           (1ULL << 63)
#define FOOT_COUNT(s)      ((uint32_t)((s)&0xffffffffu))
#define FOOT_SESSION(s)    ((uint32_t)(((s) >> 32) & 0xffffu))
#define FOOT_STATE(count, session, flags)                                                          \
    ((uint64_t)(count) | ((uint64_t)((session)&0xffffu) << 32) | FOOT_CONSUMABLE | (flags))

#define FLOW__DEFAULT_SEG_BYTES 8192
/* Bandwidth mode: 128 segments (1 MiB at 8 KiB, what a TCP socket buffers
 * for a fast stream). A source learns free space lazily, about half a ring
 * late (DFI section 5.3), so the ring must cover that lag and the
 * consumer's wake-up: in `make bench-flows` (64-byte tuples) 32 segments
 * gave 1.6-2.3 GB/s, 64 gave 1.8-2.9 and 128 gave 2.2-3.7. */
#define FLOW__DEFAULT_SEGS_BW  128
#define FLOW__DEFAULT_SEGS_LAT 64
#define FLOW__SEGS_MAX         4096
#define FLOW__SEG_BYTES_MAX    (1u << 20)
#define FLOW__CALL_TIMEOUT_NS  (5ULL * 1000000000ULL)
/* Longest a closing joined target waits for its home to free its index:
 * closing promises not to wait for an unresponsive node (the home frees
 * the index anyway when a source finds the target gone). */
#define FLOW__LEAVE_TIMEOUT_NS (300ULL * 1000000ULL)
/* Longest one peer may take to describe a flow: a node asks its peers in
 * turn, and one that is cut off (its SYN dropped) must not hold the
 * caller for FLOW__CALL_TIMEOUT_NS (a client rejoining a replica). */
#define FLOW__DESCRIBE_TIMEOUT_NS (1000ULL * 1000000ULL)
/* A latency-mode source whose ring looks full this long reads the
 * target's consumed counter instead of waiting for a credit. */
#define FLOW__CREDIT_STALL_NS (20ULL * 1000000ULL)
/* A sequencer fetch-and-add unanswered past the caller's timeout stays
 * posted on its connection (TCP retransmits a lost segment after 200 ms or
 * more; a new connection costs a handshake that can be lost as well); the
 * next take waits for it. Only after this long is the connection given up
 * and the sequencer looked up again (it may have moved). */
#define FLOW__SEQ_STALL_NS (1000ULL * 1000000ULL)
/* A target whose node leaves a read of its consumed counter unanswered
 * this long, while the source waits for room in its ring, is written off
 * like one whose connection failed: the read is answered by the node's
 * fabric, not by the consumer, so a slow consumer is never taken for a
 * dead one, but a node cut off by a partition (TCP keeps the connection
 * for minutes) is. Without it every push to a replicate flow waited its
 * full timeout on that target, and a Multi-Paxos leader with a follower
 * cut off served a quarter of its rate, under ASan nothing. */
#define FLOW__READ_DEAD_NS (1000ULL * 1000000ULL)
/* A replicate source retries a target it could not attach to: each try
 * bounded by FLOW__REPL_ATTACH_NS, at most one per FLOW__REPL_REATTACH_NS. */
#define FLOW__REPL_ATTACH_NS   (200ULL * 1000000ULL)
#define FLOW__REPL_REATTACH_NS (500ULL * 1000000ULL)
/* A joining target that finds the flow full probes each joined member this
 * long before reclaiming its index. */
#define FLOW__PROBE_NS (200ULL * 1000000ULL)
/* How often a source pushing to joined targets looks for members that
 * left (flow_push_to): their stages are freed within this. */
#define FLOW__SWEEP_NS (100ULL * 1000000ULL)
/* Attaching to a target that joined after the source opened (a client of
 * a service) is a connection, the token handshake and one call: several
 * round trips, which a push timeout of a few milliseconds (a replica's
 * replies) does not cover once the network has any delay. So that attach
 * gets at least FLOW__JOIN_ATTACH_NS; after a failure the next try waits
 * FLOW__REATTACH_NS, doubling per failure up to 256 times that (5 s), so a
 * member that cannot be reached costs the pushing thread at most a few
 * percent of its time. */
#define FLOW__JOIN_ATTACH_NS (500ULL * 1000000ULL)
#define FLOW__REATTACH_NS    (20ULL * 1000000ULL)
#define FLOW__REATTACH_SHIFT 8
#define FLOW__DEFAULT_GAP_NS (50ULL * 1000000ULL)

struct flow__footer {
    uint64_t seq;
    uint64_t state;
};
_Static_assert(sizeof(struct flow__footer) == FLOW__FOOTER_BYTES, "footer is two words");

/* A flow's declaration as stored and sent between nodes (plain data). */
struct flow__desc {
    char name[FLOW_NAME_MAX];
    char home[FAB_ADDR_MAX]; /* the declaring node: assigns joined target indices */
    uint32_t version;        /* bumped on target join/leave and sequencer moves */
    /* The home node's incarnation when it declared the flow (wall-clock ns
     * at flow_node_create). A home restarted at the same address declares
     * again from version 1: for an unordered flow its declaration (and the
     * joined-target list it assigns) supersedes every copy of the old one,
     * whatever their versions (flow__store_desc). */
    uint64_t epoch;
    uint32_t nsources;
    uint32_t ntargets;          /* indices in use, declared and joined */
    uint32_t ntargets_declared; /* indices below this were declared, the rest joined */
    uint32_t seq_session;
    struct flow_opts opts;
    struct flow_schema schema;
    char targets[FLOW_TARGETS_MAX][FAB_ADDR_MAX]; /* "" = departed */
    /* Joins at each index so far (mod 256): a joined member is its address
     * and this. One node may leave an index and join it again (a client
     * growing its reply rings); a source whose connection to the old
     * member fails must not report the new one dead (LEAVE_TARGET names
     * both), nor keep the old connection for it. */
    uint8_t joins[FLOW_TARGETS_MAX];
};
_Static_assert(sizeof(struct flow__desc) + 64 <= FAB_MSG_MAX, "a declaration fits one message");

/* Ring geometry derived from a declaration. */
struct flow__geom {
    uint32_t seg_payload; /* bytes of tuples per segment */
    uint32_t seg_stride;  /* seg_payload + footer */
    uint32_t nseg;
    uint32_t tuples_per_seg;
    uint64_t ring_bytes; /* ctrl + nseg * seg_stride */
};
void flow__geom(const struct flow__desc *d, struct flow__geom *g);
/* The segments of a ring a source asks for: `want` capped to the
 * declared nseg (0 = nseg), at least 2. Source and target compute it
 * alike. */
uint32_t flow__ring_segs(const struct flow__geom *g, uint32_t want);

/* Control messages between nodes (fab_call), DFI's registry protocol. */
enum flow__msg_type {
    FLOW__MSG_DECLARE = 1, /* desc: store (or update) a declaration */
    FLOW__MSG_DESCRIBE,    /* name: answer with the desc */
    FLOW__MSG_ATTACH,      /* source asks a target for a ring slot */
    FLOW__MSG_JOIN_TARGET, /* ask the home node for a target index */
    FLOW__MSG_LEAVE_TARGET,
    FLOW__MSG_SEQ_INFO, /* where the sequencer counter is */
};

struct flow__msg_hdr {
    uint32_t type;
    uint32_t arg;
    char name[FLOW_NAME_MAX];
};

/* LEAVE_TARGET: the member that leaves (or that a source found dead); the
 * home frees the index only if it still names that member. */
struct flow__leave_req {
    struct flow__msg_hdr h; /* arg: target index */
    char addr[FAB_ADDR_MAX];
    uint32_t joins; /* flow__desc.joins of the member */
};

struct flow__attach_req {
    struct flow__msg_hdr h; /* arg: target index */
    int32_t slot;           /* FLOW_ANY or a declared source index */
    uint32_t segments;      /* the ring the source asks for (flow__ring_segs) */
    char source_node[FAB_ADDR_MAX];
    struct fab_rkey credit;      /* latency mode: where the target writes consumed counts */
    char mcast_ep[FAB_ADDR_MAX]; /* multicast: the source's datagram endpoint */
};

struct flow__attach_resp {
    int32_t slot;
    uint32_t segments; /* the ring's segments */
    struct fab_rkey ring;
    char mcast_ep[FAB_ADDR_MAX]; /* multicast: the target's datagram endpoint */
};

struct flow__seq_resp {
    struct fab_rkey counter; /* [counter u64][session u64] */
    uint32_t session;
    uint32_t pad;
};

/* State of one source slot at a target; fields written by the progress
 * thread (attach, close) are published by storing status with release. */
enum flow__slot_status {
    SLOT_FREE = 0, /* no source: a join may take it */
    SLOT_ATTACHED, /* a source writes its ring */
    SLOT_DRAINING,
    SLOT_ENDED, /* a declared source ended: its slot is not reused */
};

struct flow__slot {
    uint32_t status; /* enum flow__slot_status, atomic */
    uint32_t dead;   /* connection closed without end-of-flow, atomic */
    uint64_t peer_id;
    int declared; /* slot index < nsources */
    char source_node[FAB_ADDR_MAX];
    struct fab_rkey credit;
    char mcast_ep[FAB_ADDR_MAX]; /* multicast: the source's endpoint */
    uint64_t src_id;             /* multicast: XXH64 of mcast_ep, in every datagram */
    /* The ring: allocated and registered at attach, freed when the slot
     * ends (consumer thread, under the target's lock). */
    uint8_t *ring;
    fab_mr *mr;
    uint64_t ring_bytes; /* ctrl + nseg * seg_stride, charged to the node */
    uint32_t nseg;
    /* consumer thread only: */
    uint64_t head; /* segments consumed */
    uint32_t pos;  /* tuple index within the head segment */
    int ended;
    fab_conn *credit_conn;
    uint64_t credit_sent;
};

struct flow__mcast;
struct flow__order;

struct flow_target {
    flow_node *node;
    struct flow__desc desc;
    struct flow__geom geom;
    int index;
    pthread_t owner;
    int closed;
    pthread_mutex_t lock; /* slot transitions (attach, close, reclaim); not the data path */
    uint64_t mem_bytes;   /* credit words (rings are charged per slot) */
    uint32_t nslots;
    uint32_t hi;       /* atomic: 1 + the highest slot attached since open; scans stop there */
    uint32_t ring_cap; /* most segments a source's ring gets here; 0: as declared */
    struct flow__slot *slots; /* nslots */
    uint32_t cursor;          /* round-robin position */
    uint32_t run_left;        /* tuples left in the cursor slot's head segment */
    uint64_t run_state;       /* that segment's footer state */
    uint64_t bell;            /* fabric doorbell value before the last scan */
    int joined;               /* opened by flow_target_join: leaves on close */
    int release_slot;         /* slot whose head segment is released on the next consume */
    /* Called (consumer thread, under lock) when slot i ends: a multicast
     * target's per-source state (flow_mcast_recv.c); NULL for rings. */
    void (*slot_reset)(flow_target *t, uint32_t i);
    uint64_t *credit_stage; /* per slot: staging for credit writes (registered) */
    fab_mr *credit_mr;
    uint32_t declared_ended;   /* declared sources that ended */
    struct flow__order *order; /* ordered replicate state, or NULL */
    struct flow__mcast *mc;    /* multicast state, or NULL */
    void *comb;                /* combiner group table, or NULL */
};

/* The source's view of one target. */
struct flow__starget {
    int state;         /* 0 = not attached, 1 = attached, 2 = gone, 3 = attach failed (retry_at) */
    uint64_t retry_at; /* state 3: no new attach before this time (ns) */
    uint32_t fails;    /* attaches to a joined member that failed in a row */
    fab_conn *conn;
    int32_t slot;
    struct fab_rkey ring;
    uint64_t sent;      /* segments written */
    uint64_t consumed;  /* segments the target released, as last learned */
    uint64_t *read_buf; /* bandwidth mode: destination of the consumed read (registered) */
    int read_pending;
    int read_held;        /* the pending read was posted with FAB_MORE, not sent yet */
    uint64_t read_posted; /* when the pending read went out (ns, about) */
    uint64_t full_since;  /* when a push first found the ring full, 0 = it has room */
    int held;             /* posts with FAB_MORE the fabric may still hold (sent by a poll) */
    uint32_t fill;        /* tuples staged in the current segment */
    uint32_t nseg;        /* segments of its ring: what the target granted */
    uint32_t stage_nseg;  /* segments in stages */
    uint8_t *stages;      /* nseg segments, indexed by sent % nseg: a segment's
                           * buffer is reused only after the target consumed it,
                           * so zero-copy backends may read it until then */
    fab_mr *stage_mr;
    uint32_t signaled;  /* outstanding signaled writes */
    uint64_t last_push; /* joined targets: when this source last pushed (ns) */
    char mcast_ep[FAB_ADDR_MAX];
};

struct flow_source {
    flow_node *node;
    uint64_t swept_at; /* joined members that left: last looked for (ns) */
    struct flow__desc desc;
    struct flow__geom geom;
    int index;          /* declared index, or FLOW_ANY for a joined source */
    uint32_t want_segs; /* ring size asked of every target (flow_source_open_ring) */
    uint32_t rfill;     /* replicate: tuples in the current segment of every target */
    pthread_t owner;
    uint64_t timeout_ns;
    flow_route_fn route;
    void *route_data;
    uint8_t *mem; /* credits[FLOW_TARGETS_MAX] + read bufs[FLOW_TARGETS_MAX] */
    uint64_t mem_bytes;
    fab_mr *mr;
    uint64_t *credits; /* latency mode: consumed counts written by targets */
    struct flow__starget t[FLOW_TARGETS_MAX];
    /* ordered replicate */
    fab_conn *seq_conn;
    struct fab_rkey seq_counter;
    int seq_pending;    /* a fetch-and-add posted, not answered yet */
    uint32_t seq_n;     /* the numbers it asked for */
    uint64_t seq_since; /* when it was posted */
    uint32_t session;
    struct flow__mcast *mc;
    /* Fault knob (tests): FLOWKV_FLOW_DROP_ORDERED=p leaves out each
     * sequenced segment at each target with probability p, as a lossy
     * network would drop an ordered multicast message (replicate_seal). */
    double drop_p;
    uint64_t drop_rng;
};

/* ---- flow_node.c ---- */
/* Looks up name locally, then asks the peers (and hint, when not NULL);
 * caches what it learns. */
int flow__describe(flow_node *n, const char *name, const char *hint, struct flow__desc *out);
fab_node *flow__fab(flow_node *n);
/* Reserves (positive) or returns (negative) delta bytes: FK_ENOMEM when
 * that passes mem_limit, unless for a flow declared exempt (counted, never
 * refused); a return passes the same exempt. */
int flow__mem_charge(flow_node *n, int64_t delta, int exempt);
/* Target registry of the node, for the control handler. */
int flow__host_target(flow_node *n, flow_target *t);
void flow__unhost_target(flow_node *n, flow_target *t);
/* Pushes desc to the nodes that host it (targets and home). */
int flow__publish(flow_node *n, const struct flow__desc *d);
/* Whether d supersedes have, a stored declaration of the same flow: for
 * an unordered flow a later incarnation of the same home (its joined
 * targets are assigned anew; the old list names clients of the dead
 * incarnation), else a newer version; for an ordered flow a later
 * sequencer session first (a failover's declaration wins over whatever
 * its versions, which nodes bump independently), then a newer version. */
int flow__desc_newer(const struct flow__desc *d, const struct flow__desc *have);
/* Stores d unless what is stored supersedes it; a stored ordered flow whose
 * sequencer moved to a later session elsewhere retires the one hosted here. */
int flow__store_desc(flow_node *n, const struct flow__desc *d);
/* One control message to the node at addr (a fresh connection), answered
 * within FLOW__CALL_TIMEOUT_NS, or within timeout_ns for _within. */
int flow__call(flow_node *n, const char *addr, const void *req, size_t len, void *resp, size_t cap);
int flow__call_within(flow_node *n, const char *addr, const void *req, size_t len, void *resp,
                      size_t cap, uint64_t timeout_ns);

/* ---- flow_target.c ---- */
/* Slots at or above this were never attached: scans of the rings stop
 * there, so a target sized for thousands of sources scans the ones it had. */
static inline uint32_t flow__slots_hi(const flow_target *t)
{
    return __atomic_load_n(&t->hi, __ATOMIC_ACQUIRE);
}
int flow__target_attach(flow_target *t, uint64_t peer, const struct flow__attach_req *req,
                        struct flow__attach_resp *resp);
void flow__target_peer_closed(flow_target *t, uint64_t peer);
/* ---- flow_ring.c (the leaf: rings, segments, footers, slot ends) ---- */
/* A ring of nseg segments for slot s, charged to the node's memory limit
 * (control plane, under t->lock); FK_ENOMEM past it. */
int flow__ring_alloc(flow_target *t, struct flow__slot *s, uint32_t nseg);
void flow__ring_free(flow_target *t, struct flow__slot *s);
/* Next tuple from the rings in arrival order (round-robin over slots). */
int flow__ring_next(flow_target *t, struct flow_item *item);
uint8_t *flow__seg(const flow_target *t, uint32_t slot, uint64_t segno);
void flow__release_head(flow_target *t, uint32_t slot);
int flow__wait(flow_target *t, uint64_t deadline);
int flow__all_ended(flow_target *t);
void flow__end_slot(flow_target *t, uint32_t i);
/* Returns 1 with the head segment's footer state of slot i, 0 when empty
 * (ending the slot when its source finished). */
int flow__head_state(flow_target *t, uint32_t i, uint64_t *state);
struct flow__footer *flow__footer_of(const flow_target *t, uint8_t *seg);

/* ---- flow_order.c ---- */
int flow__order_init(flow_target *t);
void flow__order_free(flow_target *t);
int flow__order_next(flow_target *t, struct flow_item *item);
int flow__comb_result(flow_target *t, const void **rows, uint64_t deadline);

/* ---- flow_mcast.c ---- */
const char *flow__mc_ep_addr(const flow_target *t);
uint64_t flow__mc_src_id(const char *ep_addr);
/* Called by the consumer when slot i ends, to reset its multicast state. */
void flow__mc_slot_reset(flow_target *t, uint32_t i);
int flow__mc_target_init(flow_target *t);
void flow__mc_target_free(flow_target *t);
int flow__mc_next(flow_target *t, struct flow_item *item, uint64_t deadline);
int flow__mc_source_init(flow_source *s);
const char *flow__mc_source_ep(const flow_source *s);
void flow__mc_source_free(flow_source *s);
int flow__mc_push(flow_source *s, const void *tuple);
int flow__mc_close(flow_source *s);

/* ---- flow_seq.c (the leaf: a source's side of the sequencer) ---- */
/* Takes n global numbers (seq .. seq + n - 1) with one fetch-and-add. */
int flow__seq_take(flow_source *s, uint32_t n, uint64_t *seq);
/* Asks the node behind c which session of flow name's sequencer it runs
 * (and the counter's key): 0, FK_ENOTFOUND (none), or the call's error. */
int flow__seq_info(fab_conn *c, const char *name, uint64_t timeout_ns, struct flow__seq_resp *r);

/* ---- flow_combiner.c ---- */
int flow__comb_init(flow_target *t);
void flow__comb_free(flow_target *t);

/* Checks the calling thread owns the handle. */
#define FLOW__OWNER_OK(h) pthread_equal((h)->owner, pthread_self())

#endif /* FLOW_INTERNAL_H */
