/*
 * srv_net.h: a replica's flows (proto/fkc_proto.h names them): its node,
 * the flows it hosts, its sources towards the other replicas and its
 * replies to clients, behind one "next input" call for the event loop.
 *
 * Nothing here blocks the event loop for long: sources towards peers and
 * clients push with a short timeout (SRV_NET_PUSH_NS) and a message that
 * cannot go out is dropped, which the protocols tolerate like network loss
 * (cons.h); a peer that cannot be reached is retried at most every
 * SRV_NET_RETRY_NS.
 *
 * Errors: negative FK_E* codes (fk_error.h). Thread safety: the thread that
 * called srv_net_open owns the handle (flows handles are thread-centric).
 */
#ifndef SRV_NET_H
#define SRV_NET_H

#include "cons_wire.h"
#include "fk_conf.h"

#include <stddef.h>
#include <stdint.h>

struct fab_counters; /* fab.h */

#define SRV_NET_PUSH_NS (2ULL * 1000000ULL) /* longest a push may block */
/* Longest a source open towards a peer may take (the connector thread: the
 * event loop does not wait for it): several round trips, which must fit
 * a network with some delay. */
#define SRV_NET_OPEN_NS (1000ULL * 1000000ULL)
/* srv_net_open's own opens, before the event loop runs: a replica that
 * starts while its peers are busy (a restart under load) must not give up
 * after SRV_NET_OPEN_NS. */
#define SRV_NET_START_NS (2000ULL * 1000000ULL)
#define SRV_NET_RETRY_NS (200ULL * 1000000ULL) /* between attempts to reach a peer */

struct srv_net;

struct srv_net_conf {
    const struct fk_cluster_conf *cluster;
    uint32_t id;           /* this replica */
    enum cons_proto proto; /* NOPaxos adds the kv.oum flow */
    /* NOPaxos, on the first node of the cluster's sequencers list: the
     * session of the sequencer it hosts, 1..65535, larger than any this
     * node hosted before (the server keeps a counter in LMDB): a new
     * session is how replicas learn that a sequencer restarted (NOPaxos
     * section 3). */
    uint32_t session;
};

enum srv_in_kind {
    SRV_IN_PEER = 1, /* a protocol message from replica `from` */
    SRV_IN_REQUEST,  /* a client's request (FKC_OP body without the kind byte) */
    SRV_IN_STATUS,   /* a client asks for this replica's status */
    SRV_IN_SNAP,     /* a client's backup request (struct fkc_snap_req) */
    SRV_IN_OUM,      /* NOPaxos: a sequenced request: buf = encoded cons op */
    SRV_IN_OUM_DROP, /* NOPaxos: sequence number seq never arrived (a gap), or its request
                        could not be joined or read here */
    SRV_IN_OUM_FILL, /* NOPaxos: number seq carries a leading fragment, no request */
};

struct srv_in {
    uint8_t kind;       /* enum srv_in_kind */
    uint32_t from;      /* SRV_IN_PEER: replica id */
    uint64_t client_id; /* REQUEST, STATUS, OUM */
    const uint8_t *buf; /* valid until the next srv_net_next */
    size_t len;
    uint64_t seq;     /* OUM, OUM_DROP: global sequence number */
    uint32_t session; /* OUM, OUM_DROP: sequencer session */
};

/* Creates the node at this replica's address and declares and opens the
 * flows it hosts. Errors: those of flow_node_create (the address is in
 * use: -EADDRINUSE), FK_ENOMEM, FK_EINVAL. */
int srv_net_open(const struct srv_net_conf *conf, struct srv_net **out);
void srv_net_close(struct srv_net *net);

/* The fabric in use ("tcp" or "verbs"). */
const char *srv_net_fabric(const struct srv_net *net);

/* Returns the next input: 0 with *in filled, FK_ETIMEDOUT when nothing
 * arrived within timeout_ns. Inputs from every flow are taken in turn. */
int srv_net_next(struct srv_net *net, struct srv_in *in, uint64_t timeout_ns);

/* Background work: opening sources towards peers that were unreachable,
 * and (NOPaxos) joining the kv.oum flow and hosting its sequencer. Call
 * every few milliseconds. */
void srv_net_tick(struct srv_net *net, uint64_t now);

/* NOPaxos: the loop tells the sequencer failover decision (consensus/
 * seqctl.h) the highest session its core is in (a declaration below it is
 * obsolete); ordered-multicast messages raise it too. Loop thread. */
void srv_net_seen_session(struct srv_net *net, uint32_t session);
/* The highest sequencer session this node started (0: none), which the
 * loop keeps on disk: a restarted node starts above it. Any thread. */
uint32_t srv_net_started_session(const struct srv_net *net);

/* Sends a protocol message to replica `to`. 0, or a negative code when it
 * was dropped (the peer unreachable or stalled). */
int srv_net_to_peer(struct srv_net *net, uint32_t to, const void *buf, size_t len);

/* Sends a protocol message to every other replica (cons.h,
 * CONS_ADDR_PEERS): once on this replica's replicate flow (Multi-Paxos:
 * kv.bcast.<id>), and on the shuffle to each replica that flow does not
 * reach now. 0, or the first failed shuffle send's code. */
int srv_net_to_peers(struct srv_net *net, const void *buf, size_t len);

/* Sends `kind` (enum fkc_kind) and buf to the client, at the reply target
 * it named in its latest request. FK_ENOTFOUND when this replica never
 * heard from it; other negative codes when dropped. */
int srv_net_to_client(struct srv_net *net, uint64_t client_id, uint8_t kind, const void *buf,
                      size_t len);

/* Sends what srv_net_to_peer and srv_net_to_client staged. Replies and
 * peer messages travel on bandwidth-mode flows (DFI section 5.3): the
 * messages of one batch of the event loop share segments, one write per
 * client and per peer, instead of one write each; the loop calls this at
 * the end of every batch. Failures count as dropped sends. */
void srv_net_flush(struct srv_net *net);

/* NOPaxos: the core takes kv.oum numbers of `session` up to max now
 * (nop_oum_intake; 0: any). A later one waits in kv.oum, unread, so its
 * ring fills and its sources wait: flow control, where a number past the
 * core's buffer would count as dropped. The loop sets this after every
 * step. */
void srv_net_oum_intake(struct srv_net *net, uint32_t session, uint64_t max);

/* Whether this replica can take sequenced requests yet (NOPaxos: joined
 * kv.oum). Always 1 for Multi-Paxos. */
int srv_net_oum_ready(const struct srv_net *net);

struct srv_net_stats {
    uint64_t in_peer, in_req, in_oum, in_drop; /* messages received */
    uint64_t in_fill;                          /* kv.oum numbers holding a leading fragment */
    uint64_t oum_holds;                        /* kv.oum held back (srv_net_oum_intake) */
    uint64_t in_bcast;                         /* peer messages received on kv.bcast */
    uint64_t out_peer, out_client;             /* messages sent */
    uint64_t out_bcast;                        /* peer messages sent on kv.bcast */
    uint64_t dropped;                          /* sends that failed */
    uint64_t flow_bytes;                       /* flow_node_memory */
    uint64_t client_flow_bytes;                /* flow_node_memory_limited: clients' rings */
};
void srv_net_stats(const struct srv_net *net, struct srv_net_stats *st);

/* The fabric's work-request counters (flow_node_fab_counters): what went
 * through RDMA on the verbs fabric, all 0 on tcp. Any thread. */
void srv_net_fab_counters(const struct srv_net *net, struct fab_counters *out);

#endif /* SRV_NET_H */
