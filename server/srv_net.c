/*
 * srv_net.c: a replica's flows; see srv_net.h and proto/fkc_proto.h.
 *
 * Two threads touch flows here. The event loop (the handle's owner)
 * consumes every flow the replica hosts and pushes to peers and clients.
 * A connector thread does what may block for seconds when a node is down
 * or cut off (a flow_source_open towards a peer asks other nodes for the
 * declaration and connects; NOPaxos' kv.oum is declared once every replica
 * answers): it opens handles and passes them to the loop through one
 * atomic pointer per handle (flow_*_adopt), so the loop never waits for an
 * unreachable node.
 */
#include "srv_net.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"
#include "fkc_proto.h"
#include "flow.h"
#include "flow_msg.h"
#include "seqctl.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Client id -> reply target index: open addressing, 2 * FKC... rows. A row
 * is overwritten when its probe run is full: the worst case is a reply
 * sent to a stale index, which its new owner ignores (client ids differ). */
#define CMAP_SLOTS 8192
#define CMAP_PROBE 16

struct cmap_row {
    uint64_t client_id;
    uint32_t target;
};

struct peer {
    flow_source *src; /* owned by the loop once adopted */
    struct flow_msg_tx tx;
    flow_source *ready; /* atomic: opened by the connector, not yet adopted */
    int want;           /* atomic: the connector should open one */
};

/* This replica's target on replica j's replicate flow (kv.bcast.<j>). */
struct bcast_in {
    flow_target *t; /* owned by the loop once adopted */
    struct flow_msg_rx *rx;
    flow_target *ready; /* atomic: opened by the connector, not yet adopted */
    int opened;         /* connector: done, never again (the target outlives j's restarts) */
};

struct srv_net {
    const struct fk_cluster_conf *cluster;
    uint32_t id, n;
    enum cons_proto proto;
    flow_node *node;
    flow_target *peer_t, *req_t, *oum_t;
    flow_target *oum_ready; /* atomic, from the connector */
    struct flow_msg_rx *peer_rx, *req_rx, *oum_rx;
    /* kv.oum's intake (srv_net_oum_intake) and the item held back: its
     * message stays valid, as nothing else is received from oum_rx
     * until it is taken. */
    uint64_t oum_max;
    uint32_t oum_max_session;
    int oum_holding;
    struct flow_msg_item oum_held;
    flow_source *reply_s;
    struct flow_msg_tx reply_tx;
    struct peer peers[CONS_REPLICAS_MAX];
    /* Multi-Paxos: kv.bcast.<id>, this replica's replicate flow to the
     * others (srv_net_to_peers), and its targets on theirs. */
    struct peer bcast;
    int bcast_declared; /* connector */
    struct bcast_in bin[CONS_REPLICAS_MAX];
    struct cmap_row *cmap;
    uint8_t *stage;               /* kind byte + reply, for srv_net_to_client */
    unsigned turn, bturn, streak; /* poll_once */
    struct srv_net_stats st;
    pthread_t connector;
    int stop;                 /* atomic */
    uint32_t session;         /* sequencer session this node hosts, 0 = none */
    uint32_t seq_session;     /* the session to start (srv_net_conf.session) */
    struct seqctl seqctl;     /* connector: sequencer failover (consensus/seqctl.h) */
    uint32_t seen_session;    /* atomic: the loop's highest ordered-multicast session */
    uint32_t started_session; /* atomic: the highest session this node started */
    int session_joined;       /* connector: kv.oum joined */
    uint64_t probe_at;        /* connector: next round of sequencer probes */
    uint64_t announce_at;     /* connector: next attempt to tell every replica */
};

/* ---- client map ------------------------------------------------------------ */

static uint32_t cmap_hash(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (uint32_t)(id & (CMAP_SLOTS - 1));
}

static void cmap_put(struct srv_net *net, uint64_t client_id, uint32_t target)
{
    uint32_t h = cmap_hash(client_id);
    for (uint32_t i = 0; i < CMAP_PROBE; i++) {
        struct cmap_row *r = &net->cmap[(h + i) & (CMAP_SLOTS - 1)];
        if (r->client_id == client_id || r->client_id == 0) {
            r->client_id = client_id;
            r->target = target;
            return;
        }
    }
    net->cmap[h] = (struct cmap_row){client_id, target};
}

static int cmap_get(const struct srv_net *net, uint64_t client_id, uint32_t *target)
{
    uint32_t h = cmap_hash(client_id);
    for (uint32_t i = 0; i < CMAP_PROBE; i++) {
        const struct cmap_row *r = &net->cmap[(h + i) & (CMAP_SLOTS - 1)];
        if (r->client_id == client_id) {
            *target = r->target;
            return 0;
        }
        if (r->client_id == 0)
            break;
    }
    return FK_ENOTFOUND;
}

/* ---- the connector thread ---------------------------------------------------- */

static void flow_name(char *buf, size_t cap, const char *prefix, uint32_t id)
{
    snprintf(buf, cap, "%s%u", prefix, id);
}

/* Opens source `name` for p when the loop asked for one (p->want) and
 * hands it over (p->ready, adopted in srv_net_tick). Returns 1 when a
 * source was handed over. */
static int open_for(struct srv_net *net, struct peer *p, const char *name)
{
    if (!__atomic_load_n(&p->want, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&p->ready, __ATOMIC_ACQUIRE) != NULL)
        return 0;
    flow_source *s;
    int rc = flow_source_open(net->node, name, FLOW_ANY, SRV_NET_OPEN_NS, &s);
    if (rc < 0) {
        fk_debug("net", "%s not reachable yet: %s", name, fk_strerror(rc));
        return 0;
    }
    flow_source_set_timeout(s, SRV_NET_PUSH_NS);
    __atomic_store_n(&p->want, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->ready, s, __ATOMIC_RELEASE);
    return 1;
}

static void connect_peers(struct srv_net *net)
{
    for (uint32_t j = 0; j < net->n; j++) {
        char name[FLOW_NAME_MAX];
        flow_name(name, sizeof(name), FKC_FLOW_PEER, j);
        if (j != net->id && open_for(net, &net->peers[j], name))
            fk_info("net", "connected to replica %u", j);
    }
}

/* Bandwidth-mode rings at the receiver: 32 segments of 8 fragments for
 * the peer flows (512 KiB per peer). A client process asks for the ring
 * its handles' pipelines need (client/flowkv.c, chan_segs), up to
 * SRV_NET_REQ_SEGS segments of 8 requests on kv.req (1 MiB: 2,048
 * one-fragment requests) and SRV_NET_OUM_SEGS of 64 fragments on kv.oum
 * (1 MiB); its reply rings, which it hosts, up to SRV_NET_REPLY_SEGS
 * (2 MiB), and this replica stages as much for it (exempt). A
 * bandwidth-mode source reads the consumed counter once half its ring is
 * in flight. A kv.oum segment is one fetch-and-add at the sequencer,
 * which the client waits for, and one write per replica: a pipelined
 * client's burst of 64 small requests fills one (fkc_proto.h,
 * FKC_OUM_TUPLE), and loading YCSB's default record (six fragments:
 * 1,048 bytes of value, a 23-byte key and 80 of headers) a segment holds
 * 10 records: with segments of 32 fragments, the load of
 * 300,000 records took 15% more CPU in the cluster (the client's system
 * time 5.6 s against 3.2 s, each replica 10% more). */
#define SRV_NET_SEGS       32
#define SRV_NET_REQ_SEGS   FKC_REQ_SEGS_MAX
#define SRV_NET_REPLY_SEGS FKC_REPLY_SEGS_MAX
#define SRV_NET_OUM_SEGS   FKC_OUM_SEGS_MAX
#define SRV_NET_PEER_SEG   (8 * FKC_PEER_TUPLE)
#define SRV_NET_REQ_SEG    (FKC_REQ_SEG_TUPLES * FKC_REQ_TUPLE)
#define SRV_NET_REPLY_SEG  (8 * FKC_REPLY_TUPLE)
#define SRV_NET_OUM_SEG    (FKC_OUM_SEG_TUPLES * FKC_OUM_TUPLE)

/* The target index of replica `member` on replica `home`'s kv.bcast.<home>:
 * the targets are the other replicas in id order. */
static int bcast_index(uint32_t member, uint32_t home)
{
    assert(member != home);
    return (int)(member < home ? member : member - 1);
}

/* Two source slots per target: a restarted replica attaches while its old
 * incarnation's slot is still being reclaimed. */
#define SRV_NET_BCAST_SOURCES 2

/* Multi-Paxos' replicate flow from the leader to the followers (DFI
 * Figure 3): every replica declares kv.bcast.<id> with the others as
 * targets (any replica may lead), opens a target on each other replica's,
 * and opens its source. A declaration that did not reach a replica that
 * was down is fetched by that replica from its peers when it opens its
 * target (flow.h, discovery). */
static void connect_bcast(struct srv_net *net)
{
    const struct fk_cluster_conf *c = net->cluster;
    char name[FLOW_NAME_MAX];
    if (!net->bcast_declared) {
        const char *targets[CONS_REPLICAS_MAX];
        int nt = 0;
        for (uint32_t j = 0; j < net->n; j++) {
            if (j != net->id)
                targets[nt++] = c->nodes[j].address;
        }
        struct flow_schema sc;
        struct flow_opts o;
        flow_opts_default(&o, FLOW_REPLICATE, FLOW_BANDWIDTH); /* flushed per batch */
        o.segment_bytes = SRV_NET_PEER_SEG;
        o.segments = SRV_NET_SEGS;
        o.max_sources = SRV_NET_BCAST_SOURCES;
        o.exempt = 1; /* the replicas' own: never refused for the clients' sake */
        int rc = flow_msg_schema(&sc, FKC_PEER_TUPLE);
        assert(rc == 0);
        flow_name(name, sizeof(name), FKC_FLOW_BCAST, net->id);
        rc = flow_declare(net->node, name, &sc, 0, targets, nt, &o);
        /* Stored here before it is published: a replica that did not
         * answer (FK_EUNREACHABLE and the like) asks for it later. */
        net->bcast_declared = rc != FK_EINVAL && rc != FK_ENOMEM;
        if (!net->bcast_declared) {
            fk_warn("net", "cannot declare %s: %s", name, fk_strerror(rc));
            return;
        }
    }
    /* Targets first: opening one does not wait, while opening our source
     * waits up to SRV_NET_OPEN_NS for targets that are not open yet. In
     * the other order every replica of a starting group sat in its own
     * source's open before it opened anybody's target, and the leader's
     * accepts went on the shuffles for the first seconds (a 2-CPU VM:
     * 3 to 8 s). */
    for (uint32_t j = 0; j < net->n; j++) {
        struct bcast_in *in = &net->bin[j];
        if (j == net->id || in->opened)
            continue;
        flow_name(name, sizeof(name), FKC_FLOW_BCAST, j);
        flow_target *t;
        int rc = flow_target_open(net->node, name, bcast_index(net->id, j), &t);
        if (rc < 0) {
            fk_debug("net", "%s not known yet: %s", name, fk_strerror(rc));
            continue;
        }
        in->opened = 1;
        __atomic_store_n(&in->ready, t, __ATOMIC_RELEASE);
    }
    flow_name(name, sizeof(name), FKC_FLOW_BCAST, net->id);
    open_for(net, &net->bcast, name);
}

static void connect_oum(struct srv_net *net)
{
    if (net->session_joined)
        return;
    const struct fk_cluster_conf *c = net->cluster;
    uint32_t seq_node = c->n_sequencers > 0 ? c->sequencers[0] : 0;
    struct flow_schema sc;
    int rc = flow_msg_schema(&sc, FKC_OUM_TUPLE); /* fkc_proto.h */
    assert(rc == 0);
    const char *targets[CONS_REPLICAS_MAX];
    for (uint32_t i = 0; i < net->n; i++)
        targets[i] = c->nodes[i].address;
    struct flow_opts o;
    /* Bandwidth mode: a client's burst of requests shares a segment and one
     * fetch-and-add of its count (flow_order.c); it flushes before it
     * waits (client/flowkv.c). */
    flow_opts_default(&o, FLOW_REPLICATE, FLOW_BANDWIDTH);
    o.segment_bytes = SRV_NET_OUM_SEG;
    o.segments = SRV_NET_OUM_SEGS;
    o.ordered = 1;
    o.max_sources = FKC_CLIENTS_MAX;
    snprintf(o.sequencer, sizeof(o.sequencer), "%s", c->nodes[seq_node].address);
    /* A restarted replica first asks its peers: the sequencer may have
     * failed over while it was down, and the declaration it would make
     * names the first node of the sequencers list (which, restarted, would
     * start a competing session). Only a flow nobody declared yet is
     * declared here. */
    char at[FAB_ADDR_MAX];
    uint32_t known = 0;
    rc = flow_sequencer_info(net->node, FKC_FLOW_OUM, at, sizeof(at), &known);
    if (rc == 0)
        rc = FK_EEXIST;
    else if (rc == FK_EUNKNOWN_FLOW)
        rc = flow_declare(net->node, FKC_FLOW_OUM, &sc, 0, targets, (int)net->n, &o);
    if (rc < 0 && rc != FK_EEXIST) {
        fk_debug("net", "kv.oum not declared yet: %s", fk_strerror(rc));
        return;
    }
    /* The node the declaration names starts the sequencer, with a session
     * above any this node or the declaration has seen; after a failover
     * the declaration names the node that took over. */
    if (net->session == 0 &&
        flow_sequencer_info(net->node, FKC_FLOW_OUM, at, sizeof(at), &known) == 0 &&
        strcmp(at, c->nodes[net->id].address) == 0) {
        uint32_t session = seqctl_new_session(&net->seqctl, known);
        rc = flow_sequencer_start(net->node, FKC_FLOW_OUM, session);
        /* A replica that did not answer yet learns where the sequencer is
         * when it asks (flow.h): only a sequencer that did not start here
         * is a failure; starting it again would open a new session. */
        uint32_t now_session = 0;
        if (flow_sequencer_info(net->node, FKC_FLOW_OUM, at, sizeof(at), &now_session) < 0 ||
            strcmp(at, c->nodes[net->id].address) != 0 || now_session != session) {
            fk_warn("net", "cannot start the sequencer: %s", fk_strerror(rc));
            return;
        }
        net->session = session;
        seqctl_took_over(&net->seqctl, session, rc < 0);
        __atomic_store_n(&net->started_session, session, __ATOMIC_RELEASE);
        fk_info("net", "sequencer started, session %u%s%s", session,
                rc < 0 ? "; not every replica heard of it yet: " : "",
                rc < 0 ? fk_strerror(rc) : "");
    }
    flow_target *t;
    rc = flow_target_open(net->node, FKC_FLOW_OUM, (int)net->id, &t);
    if (rc < 0) {
        fk_debug("net", "kv.oum target not open yet: %s", fk_strerror(rc));
        return;
    }
    net->session_joined = 1;
    __atomic_store_n(&net->oum_ready, t, __ATOMIC_RELEASE);
    fk_info("net", "joined the ordered multicast (kv.oum)");
}

/* A probe is a connection with the token handshake (three round trips):
 * on a loaded machine that can take tens of milliseconds, and a false
 * failover costs a session change and a view change. A dead process is
 * found at once anyway (the connection is refused). */
#define SEQ_PROBE_TIMEOUT_NS (100ULL * 1000000ULL)
/* Between attempts to tell every replica where the sequencer is. */
#define SEQ_ANNOUNCE_NS (1000ULL * 1000000ULL)

/* The replica listening at addr, or SEQCTL_NONE. */
static uint32_t replica_at(const struct srv_net *net, const char *addr)
{
    for (uint32_t i = 0; i < net->n; i++)
        if (strcmp(net->cluster->nodes[i].address, addr) == 0)
            return i;
    return SEQCTL_NONE;
}

/* A replica's answer; the host is asked which session it runs (one that
 * answers without running the declared one is as good as gone). */
static uint8_t probe(struct srv_net *net, uint32_t id, int host, uint32_t session)
{
    uint64_t t0 = fk_now_ns();
    const char *addr = net->cluster->nodes[id].address;
    uint32_t runs = 0;
    int rc = host ? flow_sequencer_probe(net->node, FKC_FLOW_OUM, addr, SEQ_PROBE_TIMEOUT_NS, &runs)
                  : flow_node_probe(net->node, addr, SEQ_PROBE_TIMEOUT_NS);
    if (rc == 0 && (!host || runs == session))
        return SEQCTL_ANSWERED;
    if (rc == 0 || rc == FK_ENOTFOUND)
        return SEQCTL_REFUSED_NOW;
    return fk_now_ns() - t0 < SEQ_PROBE_TIMEOUT_NS / 2 ? SEQCTL_REFUSED_NOW : SEQCTL_SILENT;
}

/* NOPaxos sequencer failover (NOPaxos section 3, the controller's role):
 * one round of evidence for seqctl (consensus/seqctl.h, which decides and
 * says why), then what it decided. The other replicas are probed only
 * when the decision depends on them (seqctl_needs_all). */
static void check_sequencer(struct srv_net *net)
{
    char addr[FAB_ADDR_MAX];
    uint32_t session;
    uint64_t now = fk_now_ns();
    if (now < net->probe_at ||
        flow_sequencer_info(net->node, FKC_FLOW_OUM, addr, sizeof(addr), &session) < 0)
        return;
    net->probe_at = now + SEQCTL_PROBE_NS;
    struct seqctl_round r = {.host = replica_at(net, addr),
                             .session = session,
                             .seen = __atomic_load_n(&net->seen_session, __ATOMIC_ACQUIRE)};
    r.hosting = r.host == net->id && net->session == session;
    int host_answered = 0;
    if (r.host != SEQCTL_NONE && r.host != net->id) {
        r.probe[r.host] = probe(net, r.host, 1, session);
        host_answered = r.probe[r.host] == SEQCTL_ANSWERED && r.seen <= session;
    }
    for (uint32_t j = 0; seqctl_needs_all(&net->seqctl, r.host, host_answered) && j < net->n; j++)
        if (j != net->id && j != r.host)
            r.probe[j] = probe(net, j, 0, 0);
    struct seqctl_action a = seqctl_step(&net->seqctl, &r);
    if (a.kind == SEQCTL_ANNOUNCE && now >= net->announce_at) {
        net->announce_at = now + SEQ_ANNOUNCE_NS;
        if (flow_sequencer_start(net->node, FKC_FLOW_OUM, a.session) == 0) {
            seqctl_announced(&net->seqctl);
            fk_info("net", "every replica knows sequencer session %u", a.session);
        }
    }
    if (a.kind != SEQCTL_TAKE_OVER)
        return;
    uint32_t from = r.host;
    flow_sequencer_start(net->node, FKC_FLOW_OUM, a.session);
    if (flow_sequencer_info(net->node, FKC_FLOW_OUM, addr, sizeof(addr), &session) == 0 &&
        replica_at(net, addr) == net->id && session == a.session) {
        net->session = a.session;
        seqctl_took_over(&net->seqctl, a.session, 1); /* the dead host too, should it come back */
        __atomic_store_n(&net->started_session, a.session, __ATOMIC_RELEASE);
        if (from == net->id)
            fk_warn("net",
                    "this node is named the sequencer's host but ran no current one: "
                    "started session %u",
                    a.session);
        else
            fk_warn("net", "the sequencer stopped answering: this node took over, session %u",
                    a.session);
    }
}

static void *connector_main(void *arg)
{
    struct srv_net *net = arg;
    while (!__atomic_load_n(&net->stop, __ATOMIC_ACQUIRE)) {
        connect_peers(net);
        if (net->proto == CONS_PROTO_MPX)
            connect_bcast(net);
        if (net->proto == CONS_PROTO_NOP)
            connect_oum(net);
        if (net->proto == CONS_PROTO_NOP && net->session_joined)
            check_sequencer(net);
        fk_sleep_ns(SRV_NET_RETRY_NS / 4);
    }
    return NULL;
}

/* ---- open and close ----------------------------------------------------------- */

static int declare_own(struct srv_net *net)
{
    const char *self = net->cluster->nodes[net->id].address;
    char name[FLOW_NAME_MAX];
    struct flow_schema sc;
    struct flow_opts o;
    /* Replica to replica: bandwidth mode, flushed once per batch of the
     * event loop (srv_net_flush). */
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_BANDWIDTH);
    o.segment_bytes = SRV_NET_PEER_SEG;
    o.segments = SRV_NET_SEGS;
    o.max_sources = CONS_REPLICAS_MAX;
    o.exempt = 1; /* the replicas' own: never refused for the clients' sake */
    int rc = flow_msg_schema(&sc, FKC_PEER_TUPLE);
    flow_name(name, sizeof(name), FKC_FLOW_PEER, net->id);
    if (rc == 0)
        rc = flow_declare(net->node, name, &sc, 0, &self, 1, &o);
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_BANDWIDTH); /* flushed per burst, as kv.oum */
    o.segment_bytes = SRV_NET_REQ_SEG;
    o.segments = SRV_NET_REQ_SEGS;
    o.max_sources = FKC_CLIENTS_MAX;
    if (rc == 0)
        rc = flow_msg_schema(&sc, FKC_REQ_TUPLE);
    flow_name(name, sizeof(name), FKC_FLOW_REQ, net->id);
    if (rc == 0)
        rc = flow_declare(net->node, name, &sc, 0, &self, 1, &o);
    /* Replies: bandwidth mode too, one segment per client per batch. */
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_BANDWIDTH);
    o.segment_bytes = SRV_NET_REPLY_SEG;
    o.segments = SRV_NET_REPLY_SEGS;
    o.max_sources = 1;
    o.max_targets = FKC_REPLY_MAX;
    /* Its staging per client is bounded by max_targets; a client is
     * refused at its request flows (flow_memory), not by a dropped reply. */
    o.exempt = 1;
    if (rc == 0)
        rc = flow_msg_schema(&sc, FKC_REPLY_TUPLE);
    flow_name(name, sizeof(name), FKC_FLOW_REPLY, net->id);
    if (rc == 0)
        rc = flow_declare(net->node, name, &sc, 1, NULL, 0, &o);
    return rc;
}

static int open_own(struct srv_net *net)
{
    char name[FLOW_NAME_MAX];
    flow_name(name, sizeof(name), FKC_FLOW_PEER, net->id);
    int rc = flow_target_open(net->node, name, 0, &net->peer_t);
    if (rc < 0)
        return rc;
    net->peer_rx = flow_msg_rx_create(net->peer_t, FKC_PEER_TUPLE, CONS_REPLICAS_MAX, FKC_MSG_MAX);
    flow_name(name, sizeof(name), FKC_FLOW_REQ, net->id);
    rc = flow_target_open(net->node, name, 0, &net->req_t);
    if (rc < 0)
        return rc;
    net->req_rx = flow_msg_rx_create(net->req_t, FKC_REQ_TUPLE, FKC_CLIENTS_MAX,
                                     1 + CONS_WIRE_OP_MAX + sizeof(struct cons_wire_hdr));
    if (net->peer_rx == NULL || net->req_rx == NULL)
        return FK_ENOMEM;
    flow_name(name, sizeof(name), FKC_FLOW_REPLY, net->id);
    rc = flow_source_open(net->node, name, 0, SRV_NET_START_NS, &net->reply_s);
    if (rc < 0)
        return rc;
    flow_source_set_timeout(net->reply_s, SRV_NET_PUSH_NS);
    return flow_msg_tx_init(&net->reply_tx, net->reply_s, FKC_REPLY_TUPLE);
}

int srv_net_open(const struct srv_net_conf *conf, struct srv_net **out)
{
    const struct fk_cluster_conf *c = conf->cluster;
    if (c->n_nodes < 1 || c->n_nodes > CONS_REPLICAS_MAX || conf->id >= c->n_nodes)
        return FK_EINVAL;
    struct srv_net *net = calloc(1, sizeof(*net));
    if (net == NULL)
        return FK_ENOMEM;
    net->cluster = c;
    net->id = conf->id;
    net->n = c->n_nodes;
    net->proto = conf->proto;
    net->seq_session = conf->session;
    /* The failover order: the cluster file's sequencers list (fk_conf.h),
     * node 0 alone when it has none. */
    struct seqctl_config sc = {.n = net->n, .id = net->id, .norder = c->n_sequencers};
    for (uint32_t k = 0; k < c->n_sequencers && k < CONS_REPLICAS_MAX; k++)
        sc.order[k] = c->sequencers[k];
    if (sc.norder == 0)
        sc.norder = 1; /* order[0] = 0 */
    if (seqctl_init(&net->seqctl, &sc, conf->session) < 0) {
        free(net);
        return FK_EINVAL;
    }
    net->cmap = calloc(CMAP_SLOTS, sizeof(*net->cmap));
    net->stage = malloc(1 + FKC_MSG_MAX);
    const struct fk_node_conf *self = &c->nodes[conf->id];
    struct flow_node_config nc;
    flow_node_config_default(&nc);
    nc.fabric.host = self->ip;
    nc.fabric.port = self->port;
    nc.fabric.device = self->rdma_device[0] ? self->rdma_device : NULL;
    nc.fabric.token = c->token;    /* peers and clients prove it (fab.h) */
    nc.mem_limit = c->flow_memory; /* a client past it is refused (flowkv.c, join_failed) */
    nc.fabric.backend = self->fabric == FK_FABRIC_TCP     ? FAB_BACKEND_TCP
                        : self->fabric == FK_FABRIC_VERBS ? FAB_BACKEND_VERBS
                                                          : FAB_BACKEND_AUTO;
    const char *step = "listening";
    int rc = net->cmap && net->stage ? flow_node_create(&nc, &net->node) : FK_ENOMEM;
    for (uint32_t j = 0; rc == 0 && j < net->n; j++)
        if (j != net->id)
            rc = flow_node_add_peer(net->node, c->nodes[j].address);
    if (rc == 0) {
        step = "declaring its flows";
        rc = declare_own(net);
    }
    if (rc == 0) {
        step = "opening its flows";
        rc = open_own(net);
    }
    /* Which step: a start once failed at once with "peer unreachable",
     * and none of them should reach a peer. */
    if (rc < 0)
        fk_warn("net", "%s failed: %s", step, fk_strerror(rc));
    for (uint32_t j = 0; j < net->n; j++)
        net->peers[j].want = j != net->id;
    net->bcast.want = 1;
    if (rc == 0 && pthread_create(&net->connector, NULL, connector_main, net) != 0)
        rc = FK_ENOMEM;
    if (rc < 0) {
        net->connector = 0;
        srv_net_close(net);
        return rc;
    }
    *out = net;
    return 0;
}

static void close_source(flow_source *s, struct flow_msg_tx *tx)
{
    flow_source_adopt(s);
    flow_source_set_timeout(s, SRV_NET_PUSH_NS);
    if (tx != NULL && tx->src == s)
        flow_msg_tx_free(tx);
    flow_source_close(s);
}

/* A node that stops while it hosts the sequencer hands it to its successor
 * (seqctl_successor), which starts a new session at once: the clients wait
 * a round, not the three refused probes the others would need. */
static void hand_over_sequencer(struct srv_net *net)
{
    char addr[FAB_ADDR_MAX];
    uint32_t session;
    if (net->proto != CONS_PROTO_NOP || net->session == 0 ||
        flow_sequencer_info(net->node, FKC_FLOW_OUM, addr, sizeof(addr), &session) < 0 ||
        replica_at(net, addr) != net->id || session != net->session)
        return;
    uint8_t probes[CONS_REPLICAS_MAX] = {0};
    for (uint32_t j = 0; j < net->n; j++)
        if (j != net->id)
            probes[j] = probe(net, j, 0, 0);
    uint32_t to = seqctl_successor(&net->seqctl, probes);
    if (to == SEQCTL_NONE)
        return;
    int rc = flow_sequencer_handoff(net->node, FKC_FLOW_OUM, net->cluster->nodes[to].address);
    fk_info("net", "stopping: the sequencer (session %u) handed to replica %u%s%s", session, to,
            rc < 0 ? ": " : "", rc < 0 ? fk_strerror(rc) : "");
}

void srv_net_close(struct srv_net *net)
{
    if (net == NULL)
        return;
    if (net->connector) {
        __atomic_store_n(&net->stop, 1, __ATOMIC_RELEASE);
        pthread_join(net->connector, NULL);
        hand_over_sequencer(net); /* the connector's state is this thread's now */
    }
    for (uint32_t j = 0; j < CONS_REPLICAS_MAX; j++) {
        struct peer *p = &net->peers[j];
        if (p->src != NULL)
            close_source(p->src, &p->tx);
        if (p->ready != NULL)
            close_source(p->ready, NULL);
    }
    if (net->bcast.src != NULL)
        close_source(net->bcast.src, &net->bcast.tx);
    if (net->bcast.ready != NULL)
        close_source(net->bcast.ready, NULL);
    for (uint32_t j = 0; j < CONS_REPLICAS_MAX; j++) {
        struct bcast_in *in = &net->bin[j];
        flow_msg_rx_destroy(in->rx);
        flow_target *t = in->t ? in->t : in->ready;
        if (t != NULL) {
            flow_target_adopt(t);
            flow_target_close(t);
        }
    }
    if (net->reply_s != NULL)
        close_source(net->reply_s, &net->reply_tx);
    flow_msg_rx_destroy(net->peer_rx);
    flow_msg_rx_destroy(net->req_rx);
    flow_msg_rx_destroy(net->oum_rx);
    flow_target *oum = net->oum_t ? net->oum_t : net->oum_ready;
    if (oum != NULL) {
        flow_target_adopt(oum);
        flow_target_close(oum);
    }
    if (net->peer_t != NULL)
        flow_target_close(net->peer_t);
    if (net->req_t != NULL)
        flow_target_close(net->req_t);
    if (net->node != NULL)
        flow_node_destroy(net->node);
    free(net->cmap);
    free(net->stage);
    free(net);
}

const char *srv_net_fabric(const struct srv_net *net)
{
    return flow_node_backend(net->node);
}

int srv_net_oum_ready(const struct srv_net *net)
{
    return net->proto != CONS_PROTO_NOP || net->oum_t != NULL;
}

void srv_net_stats(const struct srv_net *net, struct srv_net_stats *st)
{
    *st = net->st;
    st->flow_bytes = flow_node_memory(net->node);
    st->client_flow_bytes = flow_node_memory_limited(net->node);
}

void srv_net_fab_counters(const struct srv_net *net, struct fab_counters *out)
{
    flow_node_fab_counters(net->node, out);
}

/* ---- the event loop's side -------------------------------------------------------- */

/* Takes over the source the connector opened for p, if any. */
static void adopt_peer(struct peer *p)
{
    flow_source *s = __atomic_exchange_n(&p->ready, NULL, __ATOMIC_ACQ_REL);
    if (s == NULL)
        return;
    flow_source_adopt(s);
    if (p->src != NULL)
        close_source(p->src, &p->tx);
    p->src = s;
    if (flow_msg_tx_init(&p->tx, s, FKC_PEER_TUPLE) < 0) {
        close_source(s, NULL);
        p->src = NULL;
        __atomic_store_n(&p->want, 1, __ATOMIC_RELEASE);
    }
}

void srv_net_tick(struct srv_net *net, uint64_t now)
{
    (void)now;
    if (net->reply_s != NULL) /* clients gone while no reply went to them */
        flow_source_sweep(net->reply_s);
    for (uint32_t j = 0; j < net->n; j++)
        adopt_peer(&net->peers[j]);
    adopt_peer(&net->bcast);
    for (uint32_t j = 0; j < net->n; j++) {
        struct bcast_in *in = &net->bin[j];
        if (in->t != NULL || __atomic_load_n(&in->ready, __ATOMIC_ACQUIRE) == NULL)
            continue;
        flow_target *t = __atomic_exchange_n(&in->ready, NULL, __ATOMIC_ACQ_REL);
        flow_target_adopt(t);
        in->t = t;
        in->rx = flow_msg_rx_create(t, FKC_PEER_TUPLE, SRV_NET_BCAST_SOURCES, FKC_MSG_MAX);
        if (in->rx == NULL)
            fk_warn("net", "no memory for replica %u's replicate flow: its shuffle serves", j);
    }
    if (net->oum_t == NULL) {
        flow_target *t = __atomic_exchange_n(&net->oum_ready, NULL, __ATOMIC_ACQ_REL);
        if (t != NULL) {
            flow_target_adopt(t);
            net->oum_t = t;
            net->oum_rx = flow_msg_rx_create(t, FKC_OUM_TUPLE, FKC_CLIENTS_MAX, FKC_OUM_MSG_MAX);
            if (net->oum_rx == NULL)
                fk_warn("net", "no memory to join kv.oum's messages: no requests are taken");
        }
    }
}

void srv_net_flush(struct srv_net *net)
{
    for (uint32_t j = 0; j < net->n; j++) {
        struct peer *p = &net->peers[j];
        if (p->src != NULL && flow_flush(p->src) < 0)
            net->st.dropped++;
    }
    if (net->bcast.src != NULL && flow_flush(net->bcast.src) < 0)
        net->st.dropped++;
    if (net->reply_s != NULL && flow_flush(net->reply_s) < 0)
        net->st.dropped++;
}

int srv_net_to_peer(struct srv_net *net, uint32_t to, const void *buf, size_t len)
{
    if (to >= net->n || to == net->id)
        return FK_EINVAL;
    struct peer *p = &net->peers[to];
    if (p->src == NULL) {
        net->st.dropped++;
        return FK_EUNREACHABLE;
    }
    int rc = flow_msg_send(&p->tx, 0, to, net->id, buf, len);
    if (rc == FK_ECLOSED || rc == FK_EUNREACHABLE) {
        /* The peer went away: reopen from the connector (a restarted peer
         * has a new ring for us). */
        close_source(p->src, &p->tx);
        p->src = NULL;
        __atomic_store_n(&p->want, 1, __ATOMIC_RELEASE);
    }
    if (rc < 0) {
        net->st.dropped++;
        return rc;
    }
    net->st.out_peer++;
    return 0;
}

int srv_net_to_peers(struct srv_net *net, const void *buf, size_t len)
{
    struct peer *b = &net->bcast;
    uint64_t reached = 0;
    if (b->src != NULL) {
        int rc = flow_msg_send(&b->tx, -1, 0, net->id, buf, len);
        if (rc == 0) {
            reached = flow_source_live(b->src);
            net->st.out_bcast++;
        } else if (rc == FK_ECLOSED || rc == FK_EUNREACHABLE) {
            /* No replica attached: open it again from the connector. */
            close_source(b->src, &b->tx);
            b->src = NULL;
            __atomic_store_n(&b->want, 1, __ATOMIC_RELEASE);
        }
    }
    /* Replicas the flow does not reach now (down, restarting, not yet
     * attached) get their copy on their shuffle. */
    int rc = 0;
    for (uint32_t j = 0; j < net->n; j++) {
        if (j == net->id || (reached >> bcast_index(j, net->id) & 1))
            continue;
        int r = srv_net_to_peer(net, j, buf, len);
        if (r < 0 && rc == 0)
            rc = r;
    }
    return rc;
}

int srv_net_to_client(struct srv_net *net, uint64_t client_id, uint8_t kind, const void *buf,
                      size_t len)
{
    uint32_t target;
    if (cmap_get(net, client_id, &target) < 0 || target == FKC_NO_TARGET)
        return FK_ENOTFOUND;
    if (len > FKC_MSG_MAX)
        return FK_ETOOBIG;
    net->stage[0] = kind;
    memcpy(net->stage + 1, buf, len);
    int rc = flow_msg_send(&net->reply_tx, (int)target, client_id, net->id, net->stage, len + 1);
    /* The index may have passed from a client that left to a new one: the
     * failed push told the source, which attaches to the new member on the
     * next push. */
    if (rc == FK_ECLOSED)
        rc = flow_msg_send(&net->reply_tx, (int)target, client_id, net->id, net->stage, len + 1);
    if (rc < 0) {
        fk_debug("net", "reply to client %016llx (target %u) dropped: %s",
                 (unsigned long long)client_id, target, fk_strerror(rc));
        net->st.dropped++;
        return rc;
    }
    net->st.out_client++;
    return 0;
}

/* ---- receiving ------------------------------------------------------------------------- */

static int next_peer(struct srv_net *net, struct srv_in *in)
{
    struct flow_msg m;
    int rc = flow_msg_recv(net->peer_rx, &m, 0);
    if (rc < 0)
        return rc;
    if (m.from >= net->n || m.from == net->id)
        return FK_EMALFORMED;
    *in = (struct srv_in){.kind = SRV_IN_PEER, .from = m.from, .buf = m.buf, .len = m.len};
    net->st.in_peer++;
    return 0;
}

/* The next message on another replica's kv.bcast, taking them in turn. */
static int next_bcast(struct srv_net *net, struct srv_in *in)
{
    for (uint32_t k = 0; k < net->n; k++) {
        uint32_t j = (net->bturn + k) % net->n;
        if (net->bin[j].rx == NULL)
            continue;
        struct flow_msg m;
        int rc = flow_msg_recv(net->bin[j].rx, &m, 0);
        if (rc == FK_EMALFORMED || (rc == 0 && m.from != j))
            return FK_EMALFORMED;
        if (rc < 0)
            continue;
        net->bturn = j + 1;
        *in = (struct srv_in){.kind = SRV_IN_PEER, .from = j, .buf = m.buf, .len = m.len};
        net->st.in_bcast++;
        return 0;
    }
    return FK_ETIMEDOUT;
}

static int next_request(struct srv_net *net, struct srv_in *in)
{
    struct flow_msg m;
    int rc = flow_msg_recv(net->req_rx, &m, 0);
    if (rc < 0)
        return rc;
    if (m.len < 1 || m.dst == 0 ||
        (m.buf[0] != FKC_OP && m.buf[0] != FKC_STATUS && m.buf[0] != FKC_SNAP))
        return FK_EMALFORMED;
    cmap_put(net, m.dst, m.from);
    *in = (struct srv_in){.kind = m.buf[0] == FKC_OP       ? SRV_IN_REQUEST
                                  : m.buf[0] == FKC_STATUS ? SRV_IN_STATUS
                                                           : SRV_IN_SNAP,
                          .client_id = m.dst,
                          .buf = m.buf + 1,
                          .len = m.len - 1};
    net->st.in_req++;
    return 0;
}

/* kv.oum (fkc_proto.h): one input per global number, as NOPaxos counts
 * them: a request whole at its last fragment, a fill for every leading
 * fragment (the same at every replica: its bytes say so), a drop for a
 * number that never came or a request this replica could not join or
 * read (the leader decides that slot, NOPaxos 5.2.2). */
static int oum_admits(const struct srv_net *net, const struct flow_msg_item *it)
{
    return net->oum_max == 0 || it->session != net->oum_max_session || it->seq <= net->oum_max;
}

void srv_net_seen_session(struct srv_net *net, uint32_t session)
{
    if (session > __atomic_load_n(&net->seen_session, __ATOMIC_RELAXED))
        __atomic_store_n(&net->seen_session, session, __ATOMIC_RELEASE);
}

uint32_t srv_net_started_session(const struct srv_net *net)
{
    return __atomic_load_n(&net->started_session, __ATOMIC_ACQUIRE);
}

void srv_net_oum_intake(struct srv_net *net, uint32_t session, uint64_t max)
{
    net->oum_max = max;
    net->oum_max_session = session;
}

static int next_oum(struct srv_net *net, struct srv_in *in)
{
    if (net->oum_rx == NULL)
        return FK_ETIMEDOUT;
    struct flow_msg_item it;
    if (net->oum_holding) {
        if (!oum_admits(net, &net->oum_held))
            return FK_ETIMEDOUT;
        it = net->oum_held;
        net->oum_holding = 0;
    } else {
        int rc = flow_msg_recv_ordered(net->oum_rx, &it, 0);
        if (rc == FK_ESESSION) /* the core learns it from the next message's session */
            return FK_EAGAIN;
        if (rc < 0)
            return rc;
        if (!oum_admits(net, &it)) {
            net->oum_held = it;
            net->oum_holding = 1;
            net->st.oum_holds++;
            return FK_ETIMEDOUT;
        }
    }
    *in = (struct srv_in){.kind = SRV_IN_OUM_DROP, .seq = it.seq, .session = it.session};
    srv_net_seen_session(net, it.session);
    if (it.kind == FLOW_MSG_FRAGMENT) {
        in->kind = SRV_IN_OUM_FILL;
        net->st.in_fill++;
        return 0;
    }
    struct fkc_oum h;
    if (it.kind == FLOW_MSG_WHOLE && it.msg.len > sizeof(h)) {
        memcpy(&h, it.msg.buf, sizeof(h));
        if (h.client_id != 0 && h.client_id == it.msg.dst && h.len == it.msg.len - sizeof(h)) {
            cmap_put(net, h.client_id, h.reply_to[net->id]);
            in->kind = SRV_IN_OUM;
            in->client_id = h.client_id;
            in->buf = it.msg.buf + sizeof(h);
            in->len = h.len;
            net->st.in_oum++;
            return 0;
        }
    }
    net->st.in_drop++;
    return 0;
}

/* Inputs taken from one flow in a row before the next flow's turn. */
#define SRV_NET_STREAK 16

/* One pass over every flow, starting at a rotating one so that a busy
 * flow cannot starve the others. A flow that yields keeps the turn for up
 * to SRV_NET_STREAK inputs: moving on after each one polled the three
 * others, mostly empty, for every input (a NOPaxos replica's one busy
 * flow is kv.oum; the request flow's check walks every client's ring: 3%
 * of the cluster's CPU under YCSB). */
static int poll_once(struct srv_net *net, struct srv_in *in)
{
    for (unsigned i = 0; i < 4; i++) {
        unsigned which = (net->turn + i) % 4;
        int rc = which == 0   ? next_peer(net, in)
                 : which == 1 ? next_request(net, in)
                 : which == 2 ? next_oum(net, in)
                              : next_bcast(net, in);
        if (rc == 0) {
            net->streak = i == 0 ? net->streak + 1 : 1;
            net->turn = net->streak < SRV_NET_STREAK ? which : which + 1;
            if (net->streak >= SRV_NET_STREAK)
                net->streak = 0;
            return 0;
        }
        if (rc == FK_EMALFORMED)
            fk_debug("net", "dropped a malformed message");
    }
    return FK_ETIMEDOUT;
}

int srv_net_next(struct srv_net *net, struct srv_in *in, uint64_t timeout_ns)
{
    uint64_t deadline = 0;
    for (;;) {
        uint64_t bell = flow_node_doorbell(net->node);
        if (poll_once(net, in) == 0)
            return 0;
        uint64_t now = fk_now_ns();
        if (deadline == 0)
            deadline = now + timeout_ns;
        if (now >= deadline)
            return FK_ETIMEDOUT;
        flow_node_wait(net->node, bell, deadline - now);
    }
}
