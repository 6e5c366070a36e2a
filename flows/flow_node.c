/*
 * flow_node.c: nodes, flow declaration and discovery (the registry).
 *
 * Every node keeps the declarations it knows in a fixed table and answers
 * DESCRIBE for them; the declaring node ("home") and every target node store
 * each declaration, so a flow stays discoverable while any of them lives (no
 * single point of failure, DESIGN.md). Each target node alone answers ATTACH
 * for the rings it hosts, and each sequencer node for its counter. Control
 * messages travel as fab_call requests and are handled on the thread running
 * the fabric's event loop (fab.h); they never block there (no outgoing calls
 * from a handler).
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_MAX 16 /* sequencers one node hosts */

struct flow__hosted {
    char name[FLOW_NAME_MAX];
    int index;
    flow_target *t;
};

struct flow__seq {
    char name[FLOW_NAME_MAX];
    uint32_t session;
    uint64_t *words; /* [counter][session], registered */
    fab_mr *mr;
};

struct flow_node {
    fab_node *fab;
    uint64_t mem_limit;
    uint64_t mem_used;    /* atomic: every flow's */
    uint64_t mem_limited; /* atomic: that of flows not exempt, held to mem_limit */
    pthread_mutex_t lock; /* registry tables; control plane only */
    struct flow__desc flows[FLOW_FLOWS_MAX];
    int nflows;
    char peers[FLOW_PEERS_MAX][FAB_ADDR_MAX];
    int npeers;
    struct flow__hosted hosted[FLOW_FLOWS_MAX];
    struct flow__seq seqs[SEQ_MAX];
    uint64_t epoch; /* this incarnation: flow__desc.epoch of what it declares */
};

fab_node *flow__fab(flow_node *n)
{
    return n->fab;
}

void flow_node_config_default(struct flow_node_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    fab_config_default(&cfg->fabric);
}

int flow__mem_charge(flow_node *n, int64_t delta, int exempt)
{
    __atomic_add_fetch(&n->mem_used, (uint64_t)delta, __ATOMIC_RELAXED);
    if (exempt)
        return 0;
    uint64_t after = __atomic_add_fetch(&n->mem_limited, (uint64_t)delta, __ATOMIC_RELAXED);
    if (delta > 0 && n->mem_limit != 0 && after > n->mem_limit) {
        __atomic_sub_fetch(&n->mem_limited, (uint64_t)delta, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&n->mem_used, (uint64_t)delta, __ATOMIC_RELAXED);
        return FK_ENOMEM;
    }
    return 0;
}

uint64_t flow_node_memory(const flow_node *n)
{
    return __atomic_load_n(&n->mem_used, __ATOMIC_RELAXED);
}

uint64_t flow_node_memory_limited(const flow_node *n)
{
    return __atomic_load_n(&n->mem_limited, __ATOMIC_RELAXED);
}

uint64_t flow_node_mem_limit(const flow_node *n)
{
    return n->mem_limit;
}

const char *flow_node_addr(const flow_node *n)
{
    return fab_node_addr(n->fab);
}

int flow_node_add_peer(flow_node *n, const char *addr)
{
    if (n == NULL || addr == NULL || strlen(addr) >= FAB_ADDR_MAX)
        return FK_EINVAL;
    pthread_mutex_lock(&n->lock);
    int rc = FK_EFULL;
    if (n->npeers < FLOW_PEERS_MAX) {
        snprintf(n->peers[n->npeers++], FAB_ADDR_MAX, "%s", addr);
        rc = 0;
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

/* ---- declaration table --------------------------------------------------------- */

static struct flow__desc *find_desc(flow_node *n, const char *name)
{
    for (int i = 0; i < n->nflows; i++)
        if (strcmp(n->flows[i].name, name) == 0)
            return &n->flows[i];
    return NULL;
}

int flow__desc_newer(const struct flow__desc *d, const struct flow__desc *have)
{
    if (!d->opts.ordered && !have->opts.ordered && d->epoch != have->epoch &&
        strcmp(d->home, have->home) == 0)
        return d->epoch > have->epoch;
    if (d->opts.ordered && have->opts.ordered && d->seq_session != have->seq_session)
        return d->seq_session > have->seq_session;
    return d->version > have->version;
}

int flow__store_desc(flow_node *n, const struct flow__desc *d)
{
    struct flow__seq old = {0};
    pthread_mutex_lock(&n->lock);
    struct flow__desc *have = find_desc(n, d->name);
    int rc = 0, replaced = 0;
    if (have != NULL) {
        if ((replaced = flow__desc_newer(d, have)) != 0)
            *have = *d;
    } else if (n->nflows < FLOW_FLOWS_MAX) {
        n->flows[n->nflows++] = *d;
        replaced = 1;
    } else {
        rc = FK_ENOMEM;
    }
    /* A newer session elsewhere supersedes the sequencer this node hosts
     * for the flow (NOPaxos section 3: after a failover the old sequencer
     * must no longer stamp messages; the paper's controller reroutes the
     * network, here the counter goes away): a source still taking numbers
     * here gets a remote access error and looks for the new declaration,
     * instead of stamping messages its targets drop as an old session. */
    for (int i = 0; replaced && d->opts.ordered && i < SEQ_MAX; i++) {
        struct flow__seq *q = &n->seqs[i];
        if (q->mr != NULL && strcmp(q->name, d->name) == 0 && q->session < d->seq_session &&
            strcmp(d->opts.sequencer, flow_node_addr(n)) != 0) {
            old = *q;
            memset(q, 0, sizeof(*q));
        }
    }
    pthread_mutex_unlock(&n->lock);
    if (old.mr != NULL) {
        fk_info("flows", "flow %s: sequencer session %u retired: session %u runs at %s", d->name,
                old.session, d->seq_session, d->opts.sequencer);
        fab_mr_dereg(old.mr);
        free(old.words);
        flow__mem_charge(n, -64, 0);
    }
    return rc;
}

static int local_desc(flow_node *n, const char *name, struct flow__desc *out)
{
    pthread_mutex_lock(&n->lock);
    struct flow__desc *d = find_desc(n, name);
    if (d != NULL)
        *out = *d;
    pthread_mutex_unlock(&n->lock);
    return d != NULL ? 0 : FK_EUNKNOWN_FLOW;
}

const char *flow_node_backend(const flow_node *n)
{
    return fab_node_backend(n->fab);
}

void flow_node_fab_counters(const flow_node *n, struct fab_counters *out)
{
    fab_node_counters(n->fab, out);
}

uint64_t flow_node_doorbell(flow_node *n)
{
    return fab_node_doorbell(n->fab);
}

int flow_node_wait(flow_node *n, uint64_t seen, uint64_t timeout_ns)
{
    return fab_node_wait(n->fab, seen, timeout_ns);
}

static int on_call(void *data, uint64_t peer, const void *req, size_t len, void *resp, size_t cap);

int flow__call(flow_node *n, const char *addr, const void *req, size_t len, void *resp, size_t cap)
{
    return flow__call_within(n, addr, req, len, resp, cap, FLOW__CALL_TIMEOUT_NS);
}

int flow__call_within(flow_node *n, const char *addr, const void *req, size_t len, void *resp,
                      size_t cap, uint64_t timeout_ns)
{
    /* A node asking itself (a service that is the home of its own flows)
     * answers directly: a connection to itself would cost a round trip
     * through its own progress thread. The handlers do not use the peer
     * id for these control messages (ATTACH travels on data connections). */
    if (strcmp(addr, flow_node_addr(n)) == 0) {
        uint8_t tmp[FAB_MSG_MAX];
        int rc = on_call(n, 0, req, len, tmp, sizeof(tmp));
        if (rc > 0 && resp != NULL)
            memcpy(resp, tmp, (size_t)rc < cap ? (size_t)rc : cap);
        return rc > 0 && (size_t)rc > cap ? (int)cap : rc;
    }
    fab_conn *c;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    int rc = fab_connect(n->fab, addr, timeout_ns, &c);
    if (rc < 0)
        return rc;
    uint64_t now = fk_now_ns();
    rc = fab_call(c, req, len, resp, cap, deadline > now ? deadline - now : FK_NSEC_PER_MSEC);
    fab_conn_close(c);
    return rc;
}

static int ask_describe(flow_node *n, const char *addr, const char *name, struct flow__desc *out)
{
    struct flow__msg_hdr h = {.type = FLOW__MSG_DESCRIBE};
    snprintf(h.name, sizeof(h.name), "%s", name);
    int rc =
        flow__call_within(n, addr, &h, sizeof(h), out, sizeof(*out), FLOW__DESCRIBE_TIMEOUT_NS);
    if (rc < 0)
        return rc;
    if (rc != (int)sizeof(*out) || strcmp(out->name, name) != 0)
        return FK_EPROTO;
    return 0;
}

int flow__describe(flow_node *n, const char *name, const char *hint, struct flow__desc *out)
{
    if (hint == NULL && local_desc(n, name, out) == 0)
        return 0;
    int rc = FK_EUNKNOWN_FLOW, refused = 0;
    if (hint != NULL && hint[0] != '\0')
        refused += (rc = ask_describe(n, hint, name, out)) == FK_EAUTH;
    for (int i = 0; rc < 0; i++) {
        char peer[FAB_ADDR_MAX];
        pthread_mutex_lock(&n->lock);
        int have = i < n->npeers;
        if (have)
            memcpy(peer, n->peers[i], sizeof(peer));
        pthread_mutex_unlock(&n->lock);
        if (!have)
            break;
        refused += (rc = ask_describe(n, peer, name, out)) == FK_EAUTH;
    }
    /* Nodes that refused our token are worth naming: the flow may well
     * exist behind them (a client with the wrong cluster token). */
    if (rc < 0)
        return local_desc(n, name, out) == 0 ? 0 : refused ? FK_EAUTH : FK_EUNKNOWN_FLOW;
    flow__store_desc(n, out);
    return local_desc(n, name, out);
}

int flow__publish(flow_node *n, const struct flow__desc *d)
{
    uint8_t msg[sizeof(struct flow__msg_hdr) + sizeof(*d)];
    struct flow__msg_hdr h = {.type = FLOW__MSG_DECLARE};
    snprintf(h.name, sizeof(h.name), "%s", d->name);
    memcpy(msg, &h, sizeof(h));
    memcpy(msg + sizeof(h), d, sizeof(*d));
    int rc = flow__store_desc(n, d);
    if (rc < 0)
        return rc;
    /* Every node hears of it even when one does not answer (a moved
     * sequencer must reach the live targets while a dead one is down);
     * the first error is returned. */
    for (uint32_t i = 0; i <= d->ntargets; i++) {
        const char *addr = i < d->ntargets ? d->targets[i] : d->home;
        if (addr[0] == '\0' || strcmp(addr, flow_node_addr(n)) == 0)
            continue;
        int r = flow__call(n, addr, msg, sizeof(msg), NULL, 0);
        if (r < 0 && i < d->ntargets && rc == 0) /* a departed home is no error */
            rc = r;
    }
    return rc;
}

/* ---- hosted targets --------------------------------------------------------------- */

int flow__host_target(flow_node *n, flow_target *t)
{
    pthread_mutex_lock(&n->lock);
    int free_i = -1, rc = 0;
    for (int i = 0; i < FLOW_FLOWS_MAX; i++) {
        struct flow__hosted *h = &n->hosted[i];
        if (h->t == NULL && free_i < 0)
            free_i = i;
        if (h->t != NULL && h->index == t->index && strcmp(h->name, t->desc.name) == 0)
            rc = FK_EBUSY;
    }
    if (rc == 0 && free_i < 0)
        rc = FK_ENOMEM;
    if (rc == 0) {
        snprintf(n->hosted[free_i].name, FLOW_NAME_MAX, "%s", t->desc.name);
        n->hosted[free_i].index = t->index;
        n->hosted[free_i].t = t;
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

void flow__unhost_target(flow_node *n, flow_target *t)
{
    pthread_mutex_lock(&n->lock);
    for (int i = 0; i < FLOW_FLOWS_MAX; i++)
        if (n->hosted[i].t == t)
            n->hosted[i].t = NULL;
    pthread_mutex_unlock(&n->lock);
}

/* ---- control handler (the fabric's event loop) --------------------------------------------------
 */

static int on_attach(flow_node *n, uint64_t peer, const void *req, size_t len, void *resp,
                     size_t cap)
{
    struct flow__attach_req a;
    if (len != sizeof(a) || cap < sizeof(struct flow__attach_resp))
        return FK_EMALFORMED;
    memcpy(&a, req, sizeof(a));
    a.h.name[FLOW_NAME_MAX - 1] = '\0';
    a.source_node[FAB_ADDR_MAX - 1] = '\0';
    int rc = FK_ENOTFOUND; /* not open yet: the source retries */
    pthread_mutex_lock(&n->lock);
    for (int i = 0; i < FLOW_FLOWS_MAX; i++) {
        struct flow__hosted *h = &n->hosted[i];
        if (h->t != NULL && h->index == (int)a.h.arg && strcmp(h->name, a.h.name) == 0) {
            rc = flow__target_attach(h->t, peer, &a, resp);
            break;
        }
    }
    pthread_mutex_unlock(&n->lock);
    return rc < 0 ? rc : (int)sizeof(struct flow__attach_resp);
}

/* JOIN_TARGET and LEAVE_TARGET, answered by the flow's home node with the
 * declaration; a join's answer adds the index it assigned (u32): one node
 * may hold several joined targets of a flow (a client process's reply
 * targets while it grows them), so its address alone does not say which
 * is new. */
static int on_membership(flow_node *n, const struct flow__msg_hdr *h, const void *req, size_t len,
                         void *resp, size_t cap)
{
    if (cap < sizeof(struct flow__desc) + sizeof(uint32_t))
        return FK_EMALFORMED;
    pthread_mutex_lock(&n->lock);
    struct flow__desc *d = find_desc(n, h->name);
    int rc = d == NULL ? FK_EUNKNOWN_FLOW : 0;
    uint32_t assigned = 0;
    if (rc == 0 && h->type == FLOW__MSG_JOIN_TARGET) {
        char addr[FAB_ADDR_MAX] = {0};
        if (len != sizeof(*h) + FAB_ADDR_MAX)
            rc = FK_EMALFORMED;
        else
            memcpy(addr, (const uint8_t *)req + sizeof(*h), FAB_ADDR_MAX - 1);
        uint32_t idx = 0;
        while (rc == 0 && idx < d->ntargets && d->targets[idx][0] != '\0')
            idx++;
        assigned = idx;
        if (rc == 0 && idx >= d->opts.max_targets)
            rc = FK_EFULL;
        if (rc == 0) {
            memcpy(d->targets[idx], addr, FAB_ADDR_MAX);
            d->joins[idx]++;
            if (idx == d->ntargets)
                d->ntargets++;
            d->version++;
        }
    } else if (rc == 0) {
        /* A leave names the member it means (a source reporting a dead
         * joined target, or the member itself): a newer member at the
         * index, even of the same node, stays. */
        struct flow__leave_req lr;
        if (len != sizeof(lr) || h->arg >= d->ntargets || h->arg < d->ntargets_declared) {
            rc = FK_EINVAL;
        } else {
            memcpy(&lr, req, sizeof(lr));
            if (strncmp(d->targets[h->arg], lr.addr, FAB_ADDR_MAX) != 0 ||
                d->joins[h->arg] != (uint8_t)lr.joins) {
                rc = FK_ENOTFOUND;
            } else {
                d->targets[h->arg][0] = '\0';
                d->version++;
            }
        }
    }
    if (rc == 0)
        memcpy(resp, d, sizeof(*d));
    pthread_mutex_unlock(&n->lock);
    if (rc < 0)
        return rc;
    if (h->type != FLOW__MSG_JOIN_TARGET)
        return (int)sizeof(*d);
    memcpy((uint8_t *)resp + sizeof(*d), &assigned, sizeof assigned);
    return (int)(sizeof(*d) + sizeof assigned);
}

static int on_seq_info(flow_node *n, const struct flow__msg_hdr *h, void *resp, size_t cap)
{
    if (cap < sizeof(struct flow__seq_resp))
        return FK_EMALFORMED;
    int rc = FK_ENOTFOUND;
    pthread_mutex_lock(&n->lock);
    for (int i = 0; i < SEQ_MAX; i++) {
        struct flow__seq *s = &n->seqs[i];
        if (s->mr != NULL && strcmp(s->name, h->name) == 0) {
            struct flow__seq_resp r = {.counter = fab_mr_rkey(s->mr), .session = s->session};
            memcpy(resp, &r, sizeof(r));
            rc = (int)sizeof(r);
        }
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

static int on_call(void *data, uint64_t peer, const void *req, size_t len, void *resp, size_t cap)
{
    flow_node *n = data;
    struct flow__msg_hdr h;
    if (len < sizeof(h))
        return FK_EMALFORMED;
    memcpy(&h, req, sizeof(h));
    h.name[FLOW_NAME_MAX - 1] = '\0';
    switch (h.type) {
    case FLOW__MSG_DECLARE: {
        struct flow__desc d;
        if (len != sizeof(h) + sizeof(d))
            return FK_EMALFORMED;
        memcpy(&d, (const uint8_t *)req + sizeof(h), sizeof(d));
        d.name[FLOW_NAME_MAX - 1] = '\0';
        return flow__store_desc(n, &d);
    }
    case FLOW__MSG_DESCRIBE: {
        struct flow__desc d;
        if (cap < sizeof(d))
            return FK_EMALFORMED;
        int rc = local_desc(n, h.name, &d);
        if (rc < 0)
            return rc;
        memcpy(resp, &d, sizeof(d));
        return (int)sizeof(d);
    }
    case FLOW__MSG_ATTACH:
        return on_attach(n, peer, req, len, resp, cap);
    case FLOW__MSG_JOIN_TARGET:
    case FLOW__MSG_LEAVE_TARGET:
        return on_membership(n, &h, req, len, resp, cap);
    case FLOW__MSG_SEQ_INFO:
        return on_seq_info(n, &h, resp, cap);
    }
    return FK_EMALFORMED;
}

static void on_close(void *data, uint64_t peer)
{
    flow_node *n = data;
    pthread_mutex_lock(&n->lock);
    for (int i = 0; i < FLOW_FLOWS_MAX; i++)
        if (n->hosted[i].t != NULL)
            flow__target_peer_closed(n->hosted[i].t, peer);
    pthread_mutex_unlock(&n->lock);
}

/* ---- node lifetime -------------------------------------------------------------------------- */

int flow_node_create(const struct flow_node_config *cfg, flow_node **out)
{
    struct flow_node_config dflt;
    if (out == NULL)
        return FK_EINVAL;
    if (cfg == NULL) {
        flow_node_config_default(&dflt);
        cfg = &dflt;
    }
    flow_node *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return FK_ENOMEM;
    int rc = fab_node_create(&cfg->fabric, &n->fab);
    if (rc < 0) {
        free(n);
        return rc;
    }
    n->mem_limit = cfg->mem_limit;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    n->epoch = (uint64_t)now.tv_sec * FK_NSEC_PER_SEC + (uint64_t)now.tv_nsec;
    pthread_mutex_init(&n->lock, NULL);
    fab_node_set_handlers(n->fab, on_call, on_close, n);
    *out = n;
    return 0;
}

void flow_node_destroy(flow_node *n)
{
    if (n == NULL)
        return;
    fab_node_set_handlers(n->fab, NULL, NULL, NULL);
    for (int i = 0; i < FLOW_FLOWS_MAX; i++)
        assert(n->hosted[i].t == NULL && "flow_node_destroy with a target still open");
    for (int i = 0; i < SEQ_MAX; i++) {
        if (n->seqs[i].mr != NULL) {
            fab_mr_dereg(n->seqs[i].mr);
            free(n->seqs[i].words);
        }
    }
    fab_node_destroy(n->fab);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

/* ---- declaration ----------------------------------------------------------------------------- */

void flow_opts_default(struct flow_opts *o, enum flow_kind kind, enum flow_mode mode)
{
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->mode = mode;
    o->gap_timeout_ns = FLOW__DEFAULT_GAP_NS;
}

void flow__geom(const struct flow__desc *d, struct flow__geom *g)
{
    uint32_t ts = d->schema.tuple_size;
    if (d->opts.mode == FLOW_LATENCY) {
        g->tuples_per_seg = 1; /* DFI section 5.3: a segment is one tuple */
        g->seg_payload = ts;
    } else {
        g->tuples_per_seg = d->opts.segment_bytes / ts;
        g->seg_payload = g->tuples_per_seg * ts;
    }
    g->seg_stride = g->seg_payload + FLOW__FOOTER_BYTES;
    g->nseg = d->opts.segments;
    g->ring_bytes = FLOW__CTRL_BYTES + (uint64_t)g->nseg * g->seg_stride;
}

uint32_t flow__ring_segs(const struct flow__geom *g, uint32_t want)
{
    uint32_t n = want == 0 || want > g->nseg ? g->nseg : want;
    return n < 2 ? 2 : n;
}

static int check_opts(struct flow_opts *o, const struct flow_schema *s, int nsources, int ntargets)
{
    if (o->kind < FLOW_SHUFFLE || o->kind > FLOW_COMBINER || o->mode < FLOW_BANDWIDTH ||
        o->mode > FLOW_LATENCY)
        return FK_EINVAL;
    if (o->segment_bytes == 0)
        o->segment_bytes = FLOW__DEFAULT_SEG_BYTES;
    if (o->segments == 0)
        o->segments = o->mode == FLOW_LATENCY ? FLOW__DEFAULT_SEGS_LAT : FLOW__DEFAULT_SEGS_BW;
    if (o->max_sources == 0)
        o->max_sources = (uint32_t)nsources;
    if (o->max_targets == 0)
        o->max_targets = (uint32_t)ntargets;
    if (o->gap_timeout_ns == 0)
        o->gap_timeout_ns = FLOW__DEFAULT_GAP_NS;
    if (o->segment_bytes < s->tuple_size || o->segment_bytes > FLOW__SEG_BYTES_MAX ||
        o->segments < 2 || o->segments > FLOW__SEGS_MAX || o->max_sources < (uint32_t)nsources ||
        o->max_sources == 0 || o->max_sources > FLOW_SOURCES_MAX ||
        o->max_targets < (uint32_t)ntargets || o->max_targets > FLOW_TARGETS_MAX)
        return FK_EINVAL;
    if (o->kind == FLOW_COMBINER && (o->max_targets != 1 || ntargets != 1))
        return FK_EINVAL;
    if (o->kind == FLOW_COMBINER && flow_schema_offset(s, o->agg_column) < 0)
        return FK_EINVAL;
    if (o->kind == FLOW_COMBINER && (o->agg < FLOW_SUM || o->agg > FLOW_MAX))
        return FK_EINVAL;
    if ((o->multicast || o->ordered) && o->kind != FLOW_REPLICATE)
        return FK_EINVAL;
    if (o->ordered && o->sequencer[0] == '\0')
        return FK_EINVAL;
    if (o->multicast && (o->group[0] == '\0' || o->mode != FLOW_LATENCY))
        return FK_EINVAL; /* multicast sends each tuple as one datagram */
    return 0;
}

int flow_declare(flow_node *n, const char *name, const struct flow_schema *schema, int nsources,
                 const char *const *targets, int ntargets, const struct flow_opts *opts)
{
    if (n == NULL || name == NULL || name[0] == '\0' || strlen(name) >= FLOW_NAME_MAX ||
        schema == NULL || schema->tuple_size == 0 || (targets == NULL && ntargets > 0) ||
        opts == NULL || nsources < 0 || ntargets < 0 || ntargets > FLOW_TARGETS_MAX)
        return FK_EINVAL;
    /* A flow with no declared targets is a service's outbound flow: every
     * target joins (flow_target_join), so its maximum must say how many. */
    if (ntargets == 0 && (opts->kind != FLOW_SHUFFLE || opts->max_targets == 0))
        return FK_EINVAL;
    struct flow__desc *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return FK_ENOMEM;
    snprintf(d->name, sizeof(d->name), "%s", name);
    snprintf(d->home, sizeof(d->home), "%s", flow_node_addr(n));
    d->version = 1;
    d->epoch = n->epoch;
    d->nsources = (uint32_t)nsources;
    d->ntargets = (uint32_t)ntargets;
    d->ntargets_declared = (uint32_t)ntargets;
    d->schema = *schema;
    d->opts = *opts;
    int rc = check_opts(&d->opts, schema, nsources, ntargets);
    for (int i = 0; rc == 0 && i < ntargets; i++) {
        if (targets[i] == NULL || strlen(targets[i]) >= FAB_ADDR_MAX)
            rc = FK_EINVAL;
        else
            snprintf(d->targets[i], FAB_ADDR_MAX, "%s", targets[i]);
    }
    if (rc == 0) {
        struct flow__desc have;
        if (local_desc(n, name, &have) == 0)
            rc = FK_EEXIST;
    }
    if (rc == 0)
        rc = flow__publish(n, d);
    free(d);
    return rc;
}

/* The declaration of ordered flow name: FK_EINVAL when it is not ordered. */
static int describe_ordered(flow_node *n, const char *name, struct flow__desc *d)
{
    int rc = flow__describe(n, name, NULL, d);
    return rc < 0 ? rc : d->opts.ordered ? 0 : FK_EINVAL;
}

int flow_sequencer_info(flow_node *n, const char *name, char *addr, size_t cap, uint32_t *session)
{
    struct flow__desc d;
    if (n == NULL || name == NULL || addr == NULL || session == NULL)
        return FK_EINVAL;
    int rc = describe_ordered(n, name, &d);
    if (rc < 0)
        return rc;
    snprintf(addr, cap, "%s", d.opts.sequencer);
    *session = d.seq_session;
    return 0;
}

int flow_node_probe(flow_node *n, const char *addr, uint64_t timeout_ns)
{
    fab_conn *c;
    int rc = fab_connect(n->fab, addr, timeout_ns, &c);
    if (rc == 0)
        fab_conn_close(c);
    return rc;
}

int flow_sequencer_handoff(flow_node *n, const char *name, const char *addr)
{
    struct flow__desc d;
    if (n == NULL || name == NULL || addr == NULL || addr[0] == '\0')
        return FK_EINVAL;
    int rc = describe_ordered(n, name, &d);
    if (rc < 0)
        return rc;
    if (strcmp(d.opts.sequencer, flow_node_addr(n)) != 0)
        return FK_ENOTFOUND;
    struct flow__seq old = {0};
    pthread_mutex_lock(&n->lock);
    for (int i = 0; i < SEQ_MAX; i++) {
        if (n->seqs[i].mr != NULL && strcmp(n->seqs[i].name, name) == 0) {
            old = n->seqs[i];
            memset(&n->seqs[i], 0, sizeof(n->seqs[i]));
        }
    }
    pthread_mutex_unlock(&n->lock);
    if (old.mr != NULL) {
        fab_mr_dereg(old.mr);
        free(old.words);
        flow__mem_charge(n, -64, 0);
    }
    snprintf(d.opts.sequencer, FAB_ADDR_MAX, "%s", addr);
    d.version++;
    fk_info("flows", "flow %s: sequencer session %u handed to %s", name, d.seq_session, addr);
    return flow__publish(n, &d);
}

int flow_sequencer_probe(flow_node *n, const char *name, const char *addr, uint64_t timeout_ns,
                         uint32_t *session)
{
    if (n == NULL || name == NULL || addr == NULL || session == NULL)
        return FK_EINVAL;
    fab_conn *c;
    int rc = fab_connect(n->fab, addr, timeout_ns, &c);
    if (rc < 0)
        return rc;
    struct flow__seq_resp r;
    rc = flow__seq_info(c, name, timeout_ns, &r);
    fab_conn_close(c);
    if (rc == 0)
        *session = r.session;
    return rc;
}

int flow_sequencer_start(flow_node *n, const char *name, uint32_t session)
{
    struct flow__desc d;
    if (n == NULL || name == NULL || session == 0 || session > 0xffff)
        return FK_EINVAL;
    int rc = describe_ordered(n, name, &d);
    if (rc < 0)
        return rc;
    uint64_t *words = aligned_alloc(64, 64);
    if (words == NULL)
        return FK_ENOMEM;
    memset(words, 0, 64);
    words[1] = session;
    fab_mr *mr;
    rc = fab_mr_reg(n->fab, words, 64, &mr);
    if (rc < 0) {
        free(words);
        return rc;
    }
    /* A node hosts one sequencer per flow: starting it again (a caller
     * retrying after a publish that did not reach every node) reuses the
     * slot; a new session replaces the counter, whose numbering restarts. */
    pthread_mutex_lock(&n->lock);
    int slot = -1, reused = 0;
    struct flow__seq old = {0};
    for (int i = 0; i < SEQ_MAX && !reused; i++) {
        if (n->seqs[i].mr != NULL && strcmp(n->seqs[i].name, name) == 0) {
            slot = i;
            reused = 1;
        } else if (n->seqs[i].mr == NULL && slot < 0) {
            slot = i;
        }
    }
    if (reused && n->seqs[slot].session == session) {
        old = (struct flow__seq){.words = words, .mr = mr}; /* keep the running counter */
    } else if (slot >= 0) {
        if (reused)
            old = n->seqs[slot];
        n->seqs[slot] = (struct flow__seq){.session = session, .words = words, .mr = mr};
        snprintf(n->seqs[slot].name, FLOW_NAME_MAX, "%s", name);
    }
    pthread_mutex_unlock(&n->lock);
    if (slot < 0 || old.mr != NULL) {
        fab_mr_dereg(slot < 0 ? mr : old.mr);
        free(slot < 0 ? words : old.words);
    }
    if (slot < 0)
        return FK_ENOMEM;
    if (!reused)
        flow__mem_charge(n, 64, 0);
    snprintf(d.opts.sequencer, FAB_ADDR_MAX, "%s", flow_node_addr(n));
    d.seq_session = session;
    d.version++;
    return flow__publish(n, &d);
}
