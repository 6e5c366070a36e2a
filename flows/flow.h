/*
 * flow.h: flows, flowkv's Data Flow Interface (DFI, Thostrup et al., SIGMOD
 * 2021, sections 3 to 5), over the fabric in fabric/fab.h.
 *
 * Concepts. A node (flow_node) is a process's presence on the network. A
 * flow is a named, declared data movement from sources to targets; each
 * source and target handle belongs to one thread (thread-centric: no locks on
 * the data path). Tuples are fixed-size rows of a schema. Three kinds:
 *   shuffle:   each tuple goes to one target (key hash, routing function or
 *              an explicit target per push);
 *   replicate: each tuple goes to every target, by one one-sided write per
 *              target or by multicast datagrams; optionally in one global
 *              order taken from a fetch-and-add sequencer (DFI section 5.4):
 *              every tuple has its own number, a segment takes the numbers
 *              of all its tuples with one fetch-and-add of its count;
 *   combiner:  N:1, tuples aggregated per key at the target (SUM, COUNT,
 *              MIN, MAX on one column).
 * Two modes (DFI section 5.3): bandwidth (tuples batched into segments,
 * default 8 KiB; free space learned by reading the target's consumed counter
 * lazily) and latency (a segment is one tuple; free space tracked by credits
 * the target writes back at a threshold).
 *
 * Declaration and discovery. flow_declare() publishes the flow at the
 * declaring node and at every target node; each of them answers for it, and
 * each target node alone answers for the rings it hosts. A node that does
 * not know a flow asks its peers (flow_node_add_peer). No single process is
 * needed once a flow is declared (DESIGN.md: no single point of failure).
 *
 * Lifetimes. flow_consume() returns a pointer into the target's receive
 * memory, valid until the next flow_consume() or flow_target_close() on that
 * handle (zero copy). flow_push() copies the tuple before returning.
 *
 * Errors (negative, common/fk_error.h): FK_EINVAL (bad argument),
 * FK_EUNKNOWN_FLOW, FK_ESCHEMA (tuple size or schema mismatch), FK_ETOOBIG,
 * FK_EWRONG_THREAD (handle used from another thread), FK_ECLOSED (handle or
 * target closed), FK_EEND, FK_EGAP, FK_ESESSION, FK_ETIMEDOUT, FK_ENOMEM
 * (memory bound or a pool exhausted), FK_EFULL (no free source or target
 * slot), FK_EEXIST (flow name taken), FK_EUNREACHABLE, FK_EAUTH (the nodes
 * asked refused this node's cluster token: flow_node_config.fabric.token,
 * fab.h "Authentication").
 */
#ifndef FLOW_H
#define FLOW_H

#include "fab.h"

#include <stddef.h>
#include <stdint.h>

/* Bounds (named maxima, STYLE.md point 11). */
#define FLOW_NAME_MAX    48 /* flow name including terminator */
#define FLOW_COLS_MAX    16
#define FLOW_COLNAME_MAX 24
#define FLOW_TARGETS_MAX                                                                           \
    64 /* targets per flow, declared plus joined (a declaration is one message) */
#define FLOW_SOURCES_MAX 4096 /* source slots per target (a ring each while attached) */
#define FLOW_FLOWS_MAX   64   /* flows one node knows */
#define FLOW_PEERS_MAX   16
#define FLOW_TUPLE_MAX   4032 /* a tuple fits one datagram with its header */

/* ---- schema ------------------------------------------------------------- */

enum flow_type {
    FLOW_INT8 = 1,
    FLOW_INT16,
    FLOW_INT32,
    FLOW_INT64,
    FLOW_UINT64,
    FLOW_FLOAT,
    FLOW_DOUBLE,
    FLOW_BYTES, /* fixed-length byte array; length in flow_column.len */
};

struct flow_column {
    const char *name;
    enum flow_type type;
    uint32_t len; /* FLOW_BYTES only */
};

/* A schema as computed at declaration: columns at natural (LP64) alignment,
 * the tuple size rounded up to 8 bytes. Plain data: copy freely. */
struct flow_schema {
    uint32_t ncols;
    uint32_t key;        /* index of the key column */
    uint32_t tuple_size; /* bytes */
    struct {
        char name[FLOW_COLNAME_MAX];
        uint32_t type;
        uint32_t size;
        uint32_t offset;
    } cols[FLOW_COLS_MAX];
};

/* Computes offsets. key names the key column. Errors: FK_EINVAL (no
 * columns, too many, unknown type, empty or duplicate name, BYTES of length
 * 0, unknown key), FK_ETOOBIG (tuple larger than FLOW_TUPLE_MAX). Any thread. */
int flow_schema_init(struct flow_schema *s, const struct flow_column *cols, int n, const char *key);

/* Offset of the named column, or FK_ENOTFOUND. */
int flow_schema_offset(const struct flow_schema *s, const char *name);

/* ---- node ----------------------------------------------------------------- */

typedef struct flow_node flow_node;
typedef struct flow_source flow_source;
typedef struct flow_target flow_target;

struct flow_node_config {
    struct fab_config fabric;
    uint64_t mem_limit; /* bytes of flow memory this node may hold for flows not
                           declared exempt (flow_opts.exempt); 0 = no limit */
};

void flow_node_config_default(struct flow_node_config *cfg);

/* Creates a node (and its fabric node). cfg NULL = defaults. Errors as
 * fab_node_create. Any thread. */
int flow_node_create(const struct flow_node_config *cfg, flow_node **out);

/* Destroys the node. Every source and target opened on it must be closed.
 * Any thread except the node's progress thread. */
void flow_node_destroy(flow_node *node);

/* The node's address, valid until destroy. */
const char *flow_node_addr(const flow_node *node);

/* The fabric backend in use: "tcp" or "verbs". */
const char *flow_node_backend(const flow_node *node);

/* The fabric's work-request counters (fab_node_counters; all 0 on tcp).
 * Any thread. */
void flow_node_fab_counters(const flow_node *node, struct fab_counters *out);

/* Adds a peer asked for flows this node does not know. Errors: FK_EINVAL,
 * FK_EFULL (FLOW_PEERS_MAX). Any thread. */
int flow_node_add_peer(flow_node *node, const char *addr);

/* Waiting on several targets at once (one event loop consuming several
 * flows): read the doorbell, poll each target with flow_consume(t, item,
 * 0), and when none had anything, flow_node_wait(node, bell, timeout_ns)
 * returns once a remote write landed on the node after the read, or at
 * the timeout (0 or FK_ETIMEDOUT; spins briefly, then blocks). */
uint64_t flow_node_doorbell(flow_node *node);
int flow_node_wait(flow_node *node, uint64_t seen, uint64_t timeout_ns);

/* Bytes of flow memory this node holds: registered rings, counters and
 * staging segments, and datagram buffers (DESIGN.md: memory per node). */
uint64_t flow_node_memory(const flow_node *node);
/* Of flow_node_memory, the bytes of flows not declared exempt: what is
 * held against mem_limit. */
uint64_t flow_node_memory_limited(const flow_node *node);
/* flow_node_config.mem_limit (0: none). */
uint64_t flow_node_mem_limit(const flow_node *node);

/* ---- declaration -------------------------------------------------------------- */

enum flow_kind { FLOW_SHUFFLE = 1, FLOW_REPLICATE, FLOW_COMBINER };
enum flow_mode { FLOW_BANDWIDTH = 1, FLOW_LATENCY };
enum flow_agg { FLOW_SUM = 1, FLOW_COUNT, FLOW_MIN, FLOW_MAX };

/* Routing function for shuffle flows: returns a target index in
 * [0, ntargets). Runs on the pushing thread. */
typedef int (*flow_route_fn)(const void *tuple, int ntargets, void *data);

struct flow_opts {
    enum flow_kind kind;
    enum flow_mode mode;
    uint32_t segment_bytes;            /* bandwidth mode: segment payload; default 8192 */
    uint32_t segments;                 /* per ring; default 128 (bandwidth), 64 (latency) */
    uint32_t max_sources;              /* source slots per target (elastic); default nsources */
    uint32_t max_targets;              /* targets including joined ones; default ntargets */
    int multicast;                     /* replicate: datagrams to a group instead of N writes */
    int ordered;                       /* replicate: global order from a sequencer */
    char sequencer[FAB_ADDR_MAX];      /* ordered: node hosting the sequencer */
    char group[FAB_ADDR_MAX];          /* multicast: "239.x.y.z:port" */
    uint64_t gap_timeout_ns;           /* ordered: wait before GAP; default 50 ms */
    enum flow_agg agg;                 /* combiner */
    char agg_column[FLOW_COLNAME_MAX]; /* combiner: aggregated column */
    int exempt; /* its memory counts in flow_node_memory, never against mem_limit: a
                   service's own flows, bounded by their declaration, stay open when its
                   clients' flows reach the limit */
};

void flow_opts_default(struct flow_opts *o, enum flow_kind kind, enum flow_mode mode);

/* Declares flow name with nsources sources (opened by index 0..nsources-1;
 * more may join up to max_sources) and ntargets targets, target i hosted by
 * the node at targets[i]. The declaration is stored here and pushed to every
 * target node. A shuffle flow may declare no targets (ntargets 0) when
 * opts->max_targets says how many may join: a service's outbound flow
 * whose targets are its clients. Errors: FK_EINVAL (bad counts, options or names), FK_EEXIST,
 * FK_ENOMEM (FLOW_FLOWS_MAX), FK_EUNREACHABLE (a target node did not answer).
 * Any thread. */
int flow_declare(flow_node *node, const char *name, const struct flow_schema *schema, int nsources,
                 const char *const *targets, int ntargets, const struct flow_opts *opts);

/* ---- targets ---------------------------------------------------------------------- */

/* Opens target index of flow name on node (which must be the node declared
 * for that index). Allocates max_sources slots; a slot's ring is allocated
 * and registered when a source attaches, sized as that source asks (at
 * most the declared segments), charged to the node's mem_limit, and freed
 * when the source ends (DFI section 5.3: a ring per source; a service
 * with many clients pays for the clients it has, each for the load it
 * declared). An attach past mem_limit is refused: the source's open fails
 * with FK_ENOMEM. The handle belongs to the calling thread. Errors:
 * FK_EUNKNOWN_FLOW, FK_EINVAL (index, wrong node), FK_EBUSY (already
 * open), FK_ENOMEM. */
int flow_target_open(flow_node *node, const char *name, int index, flow_target **out);

/* Elastic join (beyond DFI): adds this node as a new target of an open flow
 * (reusing a departed target's index when one is free) and opens it. The
 * declaring node assigns the index. Errors: FK_EFULL (max_targets reached),
 * plus those of flow_target_open. */
int flow_target_join(flow_node *node, const char *name, flow_target **out);
/* As flow_target_join, with rings of at most `segments` segments for the
 * sources that attach (0: as they ask): a client holds the replies it
 * waits for, not the flow's declared ring per source. */
int flow_target_join_ring(flow_node *node, const char *name, uint32_t segments, flow_target **out);

/* The target's index. */
int flow_target_index(const flow_target *t);

/* One consumed item. */
struct flow_item {
    const void *tuple; /* into the target's memory; valid until the next consume */
    uint64_t seq;      /* ordered replicate: the tuple's global number; FK_EGAP: the missing one */
    uint32_t session;  /* ordered replicate: sequencer session */
    int source;        /* source slot the tuple came from */
};

/* Returns the next tuple: 0 with item filled; FK_EEND when every declared
 * source has closed and no joined source remains; FK_EGAP (ordered flow:
 * item->seq never arrived within gap_timeout_ns; tests make gaps with the
 * sources' FLOWKV_FLOW_DROP_ORDERED knob, flows/README.md); FK_ESESSION (ordered flow:
 * a new sequencer session began, item->session); FK_ETIMEDOUT. Waits up to
 * timeout_ns (0 = poll). Combiner targets return FK_EINVAL (use
 * flow_combiner_result). Owner thread only (FK_EWRONG_THREAD). */
int flow_consume(flow_target *t, struct flow_item *item, uint64_t timeout_ns);

/* Closes the target: its rings are deregistered and its slot in the flow is
 * freed for a later join. Owner thread. */
void flow_target_close(flow_target *t);

/* Combiner targets: consumes until FK_EEND (or timeout), aggregating; then
 * returns the number of groups and points *rows at them: each row is a tuple
 * of the flow's schema whose key column is the group and whose aggregated
 * column holds the result (COUNT: as int64 in that column). Valid until
 * close. Errors: FK_EINVAL (not a combiner), FK_ETIMEDOUT, FK_ENOMEM (more
 * than the group table holds, FLOW_GROUPS_MAX). Owner thread. */
#define FLOW_GROUPS_MAX 4096
int flow_combiner_result(flow_target *t, const void **rows, uint64_t timeout_ns);

/* ---- sources ------------------------------------------------------------------------ */

#define FLOW_ANY (-1) /* elastic join: take any free source slot */

/* Opens source index (0..nsources-1, or FLOW_ANY to join) of flow name:
 * connects to every target node and attaches to a ring there, retrying until
 * timeout_ns while targets are not open yet. Errors: FK_EUNKNOWN_FLOW,
 * FK_EINVAL, FK_EFULL (no free slot), FK_ETIMEDOUT, FK_EUNREACHABLE,
 * FK_ENOMEM. The handle belongs to the calling thread. */
int flow_source_open(flow_node *node, const char *name, int index, uint64_t timeout_ns,
                     flow_source **out);
/* As flow_source_open, with rings of `segments` segments at every target
 * (0: the declared count; more is capped to it, fewer than 2 raised to
 * 2): a source that never has much in flight (a client with one request
 * outstanding) costs its targets that much memory only. FK_ENOMEM: a
 * target's node is at its memory limit (flow_node_config.mem_limit). */
int flow_source_open_ring(flow_node *node, const char *name, int index, uint32_t segments,
                          uint64_t timeout_ns, flow_source **out);

/* Sets how long a push (and a later attach to a joined target) may block
 * before FK_ETIMEDOUT; 0 = FLOW_BLOCK_TIMEOUT_NS. A service answering many
 * clients from one event loop sets it short, so that one stalled client
 * costs that long at most and its reply is dropped. Owner thread. */
void flow_source_set_timeout(flow_source *s, uint64_t timeout_ns);

/* Hands a source or target to the calling thread, which becomes its owner.
 * The previous owner must be done with it and the hand-over must order the
 * two threads (a mutex, or an atomic store-release/load-acquire): a
 * service opens handles on a helper thread, whose opens may block on an
 * unreachable node, and its event loop adopts them. */
void flow_source_adopt(flow_source *s);
void flow_target_adopt(flow_target *t);

/* Shuffle routing by function (instead of the key hash). Owner thread. */
void flow_source_set_route(flow_source *s, flow_route_fn fn, void *data);

/* Pushes one tuple of exactly the schema's tuple size (copied before
 * return). Shuffle routes it by key hash (xxHash64 of the key column) or the
 * routing function; replicate and combiner send it to every target (combiner:
 * the one target). Blocks while the ring is full (slow consumer) up to the
 * source's timeout. Errors: FK_ESCHEMA (size), FK_ECLOSED (source closed,
 * or the target left), FK_EWRONG_THREAD, FK_ETIMEDOUT, FK_EUNREACHABLE. */
int flow_push(flow_source *s, const void *tuple, size_t size);

/* Pushes to an explicit target index (shuffle). Errors as flow_push plus
 * FK_EINVAL (index). A target that joined after open is found by asking
 * the declaring node again. */
int flow_push_to(flow_source *s, int target, const void *tuple, size_t size);

/* Sends partly filled segments now (bandwidth mode), and full segments the
 * fabric still holds in a batch (bandwidth mode sends several segments per
 * system call). Until a flush or close, pushed tuples may wait in the
 * source. Owner thread. */
int flow_flush(flow_source *s);

/* Releases what joined targets that are gone (left, or their node closed
 * the connection) hold at this source: connections and segment stages (a
 * client that came and went leaves nothing behind at a service's reply
 * flow). Pushes to joined targets do it too; call it now and then when
 * there may be none (a server's tick). At most every 100 ms, cheap
 * otherwise. Owner thread. */
void flow_source_sweep(flow_source *s);

/* Whether the targets this source writes to are still there, without
 * writing: polls their connections. A target whose node went away without
 * a word (its process exited: TCP's first write after that still
 * succeeds, and only the next one fails) is seen gone and dropped as a
 * failed write drops it. 0, or FK_ECLOSED when one is gone. A client that
 * turns to a replica it has not written to for a while checks first
 * (client/flowkv.c). Owner thread. */
int flow_source_check(flow_source *s);

/* The targets this source is attached to now: bit k for target index k.
 * A replicate push reaches exactly these (it attaches again to the others
 * later, between segments): a caller that must reach every target sends
 * the others a copy by another way. Owner thread. */
uint64_t flow_source_live(const flow_source *s);

/* Ends the flow for this source: flushes, sends end-of-flow to every target
 * and frees the handle (whose slot the targets reclaim). Returns the first
 * error met, the handle is freed regardless. Owner thread. */
int flow_source_close(flow_source *s);

/* Default time a push or open blocks before FK_ETIMEDOUT. */
#define FLOW_BLOCK_TIMEOUT_NS (30ULL * 1000000000ULL)

/* ---- sequencer (ordered replicate) ----------------------------------------------------- */

/* Hosts the sequencer of flow name on node with the given session (start at
 * 1; a replacement after failure uses a larger one), and tells the flow's
 * nodes where it is. A node that hosts an older session of the flow's
 * sequencer retires it when it hears of this one (a host that was only cut
 * off must not go on numbering). Sources move to it when the old one is
 * unreachable or retired; targets report FK_ESESSION. Starting it again on the same node with the
 * same session keeps its counter and only tells the nodes again; another
 * session replaces the counter. Errors: FK_EUNKNOWN_FLOW, FK_EINVAL (not
 * ordered), FK_ENOMEM, FK_EUNREACHABLE or another call error (a node of the
 * flow did not hear of it: the sequencer runs, nodes that answered know it,
 * the others learn it when they ask). Any thread; lives until the node is
 * destroyed. */
int flow_sequencer_start(flow_node *node, const char *name, uint32_t session);

/* Where the sequencer of ordered flow name runs and its session, as this
 * node last learned (the declaration it stores, or asks its peers for).
 * Errors: FK_EUNKNOWN_FLOW, FK_EINVAL (not ordered). Any thread. */
int flow_sequencer_info(flow_node *node, const char *name, char *addr, size_t cap,
                        uint32_t *session);

/* Hands the sequencer of ordered flow name, which this node hosts, to the
 * node at addr: this node's counter goes (its sources move on, as from a
 * retired one) and the declaration naming addr, with the same session and
 * a newer version, is told to every node of the flow. The node at addr is
 * expected to start a sequencer with a new session (flowkv: seqctl.h, a
 * named host that runs none starts one at once). FK_ENOTFOUND when this
 * node does not host it; publishing errors as flow_sequencer_start's. Any
 * thread. */
int flow_sequencer_handoff(flow_node *node, const char *name, const char *addr);

/* Which session of ordered flow name's sequencer the node at addr runs:
 * asks it within timeout_ns (a connection and one call). 0 with *session
 * set; FK_ENOTFOUND when it answers but runs none (it restarted, or
 * retired it); else the connect or call error (FK_EUNREACHABLE,
 * FK_ETIMEDOUT, -errno). Any thread; may block up to about twice
 * timeout_ns. */
int flow_sequencer_probe(flow_node *node, const char *name, const char *addr, uint64_t timeout_ns,
                         uint32_t *session);

/* Whether a node answers at addr: connects and closes within timeout_ns.
 * 0, or the connect error (FK_EUNREACHABLE, FK_ETIMEDOUT, -errno). Any
 * thread; may block up to timeout_ns. */
int flow_node_probe(flow_node *node, const char *addr, uint64_t timeout_ns);

#endif /* FLOW_H */
