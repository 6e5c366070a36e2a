/* srv_node.c: one replica's event loop; see srv_node.h. */
#include "srv_node.h"

#include "cons_wire.h"
#include "fab.h"
#include "fk_error.h"
#include "fk_hist.h"
#include "fk_log.h"
#include "fk_metrics.h"
#include "fk_time.h"
#include "fk_version.h"
#include "fkc_proto.h"
#include "kv_sm.h"
#include "kv_store.h"
#include "cons_core.h"
#include "nop.h" /* the OUM messages a NOPaxos core takes */
#include "srv_backup.h"
#include "srv_disk.h"
#include "srv_http.h"
#include "srv_net.h"
#include "srv_notify.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* Requests waiting for their reply, for the per-operation latency
 * histograms: indexed by client id hash; a collision forgets the older
 * request (its latency is not recorded, nothing else changes). */
#define PEND_SLOTS 4096
/* Ticks between two invariant checks when FLOWKV_CHECK_INVARIANTS is set. */
#define SRV_INVARIANTS_TICKS 100
/* The core's OUM message: a header and a message number around one op. */
#define SRV_OUM_BUF (NOP_WIRE_OP_MAX + 64) /* NOPaxos ops fit NOP_OP_MAX */

struct pend {
    uint64_t client_id;
    uint64_t t0;
    uint8_t type;
};

struct srv_node {
    struct srv_opts o;
    enum cons_proto proto;
    uint32_t id, n;
    struct kv_store *store;
    struct kv_sm sm;
    struct srv_disk *disk;
    struct srv_backup backup; /* `flowkv snapshot save` (srv_backup.h) */
    struct cons_core core;
    struct srv_net *net;
    uint64_t fed;       /* highest cookie fed as CONS_IN_PERSISTED */
    uint64_t next_tick; /* monotonic ns */
    uint64_t start_ns;
    uint64_t peer_seen[CONS_REPLICAS_MAX]; /* when a message from each replica last came */
    uint64_t last_term;
    volatile sig_atomic_t stop, dump;
    uint32_t check_every; /* FLOWKV_CHECK_INVARIANTS: the core's invariants every N ticks */
    uint32_t seq_saved;   /* "seq.session" on disk: the highest sequencer session started */
    uint64_t ticks;
    struct cons_op op; /* decode scratch for OUM requests */
    uint8_t *oum_buf;  /* encode scratch: a stamped OUM message */
    struct pend *pend;
    /* metrics, served on this thread by srv_http */
    uv_loop_t loop;
    struct srv_http *http;
    struct fk_metrics metrics;
    struct fk_metric *m_req[CONS_OP__COUNT], *m_views, *m_gaps, *m_dropped, *m_malformed;
    struct fk_metric *m_peer[4]; /* peer messages: replicate out, in; shuffle out, in */
    struct fk_metric *m_sync[4], *m_stalls, *m_gap_noops, *m_holds; /* NOPaxos leader */
    /* State transfers (cons_xfer.h): in and out, bytes and chunks. */
    struct fk_metric *m_xfer[4];
    struct srv__fab_metric {
        struct srv_node *n;
        size_t off; /* of the field in struct fab_counters */
    } fab_m[13];
    struct cons_xfer_stats xfer_seen; /* the last counters logged */
    uint64_t xfer_t0;                 /* when the transfer in progress started */
    struct fk_hist lat[CONS_OP__COUNT], commit_lat;
};

static const char *const op_names[CONS_OP__COUNT] = {"noop", "get",  "put",   "del",
                                                     "cas",  "scan", "config"};

/* ---- status -------------------------------------------------------------------- */

static void fill_status(struct srv_node *n, struct fkc_status *st)
{
    memset(st, 0, sizeof(*st));
    st->id = n->id;
    st->protocol = (uint8_t)n->proto;
    snprintf((char *)st->fabric, sizeof(st->fabric), "%s", srv_net_fabric(n->net));
    st->uptime_ns = fk_now_ns() - n->start_ns;
    struct cons_core_status cs;
    n->core.ops->status(n->core.impl, &cs);
    st->role = cs.role; /* enum fkc_role mirrors enum cons_role (fkc_proto.h asserts it) */
    st->term = cs.term;
    st->leader = cs.leader;
    st->epoch = cs.conf.epoch;
    st->members = (uint32_t)cs.conf.members;
    st->commit = cs.commit;
    st->applied = cs.applied;
    st->last = cs.last;
}

/* ---- the outbox ------------------------------------------------------------------- */

static void note_reply(struct srv_node *n, uint64_t client_id)
{
    struct pend *p = &n->pend[client_id % PEND_SLOTS];
    if (p->client_id != client_id)
        return;
    fk_hist_record(&n->lat[p->type], fk_now_ns() - p->t0);
    p->client_id = 0;
}

static void note_request(struct srv_node *n, uint64_t client_id, uint8_t type)
{
    if (type >= CONS_OP__COUNT)
        return;
    n->pend[client_id % PEND_SLOTS] = (struct pend){client_id, fk_now_ns(), type};
    fk_metric_add(n->m_req[type], 1);
}

/* Persists the outbox's items into the open transaction and sends its
 * messages. A persist failure is fatal (srv_disk.h failure rule). */
static int drain(struct srv_node *n, const struct cons_outbox *ob)
{
    int rc = srv_disk_persist(n->disk, ob->persists, ob->npersists);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < ob->nmsgs; i++) {
        const struct cons_out_msg *m = &ob->msgs[i];
        if (m->to.kind == CONS_ADDR_REPLICA) {
            srv_net_to_peer(n->net, (uint32_t)m->to.id, m->buf, m->len);
        } else if (m->to.kind == CONS_ADDR_PEERS) {
            srv_net_to_peers(n->net, m->buf, m->len);
        } else if (m->to.kind == CONS_ADDR_CLIENT) {
            note_reply(n, m->to.id);
            srv_net_to_client(n->net, m->to.id, FKC_OP, m->buf, m->len);
        }
    }
    if (ob->dropped)
        fk_metric_add(n->m_dropped, ob->dropped);
    return 0;
}

static int step(struct srv_node *n, const struct cons_input *in)
{
    struct cons_outbox *ob = NULL;
    uint64_t now = fk_now_ns();
    int rc = n->core.ops->step(n->core.impl, in, now, &ob);
    if (rc == FK_EMALFORMED) {
        fk_metric_add(n->m_malformed, 1);
        return 0; /* ignored by the core; the sender is untrusted */
    }
    if (rc < 0)
        return rc;
    if (n->core.ops->oum_intake) {
        uint32_t session;
        uint64_t max = n->core.ops->oum_intake(n->core.impl, &session);
        srv_net_oum_intake(n->net, session, max);
    }
    return drain(n, ob);
}

/* ---- inputs ------------------------------------------------------------------------ */

/* A NOPaxos request off kv.oum: decoded, then stamped with the sequencer's
 * session and number as the core's OUM message; drops and fills (nop.h)
 * likewise. */
static int feed_oum(struct srv_node *n, const struct srv_in *in)
{
    struct cons_rbuf r;
    cons_rbuf_init(&r, in->buf, in->len);
    int len;
    if (in->kind == SRV_IN_OUM_DROP) {
        fk_metric_add(n->m_gaps, 1);
        len = nop_encode_oum_drop(n->oum_buf, SRV_OUM_BUF, in->session, in->seq);
    } else if (in->kind == SRV_IN_OUM_FILL) {
        len = nop_encode_oum_fill(n->oum_buf, SRV_OUM_BUF, in->session, in->seq);
    } else {
        if (cons_wire_get_op(&r, &n->op) < 0 || n->op.client_id != in->client_id) {
            fk_metric_add(n->m_malformed, 1);
            return 0;
        }
        note_request(n, n->op.client_id, n->op.type);
        len = nop_encode_oum_request(n->oum_buf, SRV_OUM_BUF, in->session, in->seq, &n->op);
    }
    if (len < 0)
        return 0;
    struct cons_input ci = {
        .kind = CONS_IN_MSG, .from = {CONS_ADDR_OUM, 0}, .buf = n->oum_buf, .len = (size_t)len};
    return step(n, &ci);
}

/* The op type of a Multi-Paxos client request, for metrics only. */
static uint8_t request_type(const uint8_t *buf, size_t len)
{
    size_t at = sizeof(struct cons_wire_hdr) + offsetof(struct cons_wire_op, type);
    return len > at ? buf[at] : CONS_OP__COUNT;
}

static int feed(struct srv_node *n, const struct srv_in *in)
{
    struct cons_input ci = {.kind = CONS_IN_MSG, .buf = in->buf, .len = in->len};
    switch (in->kind) {
    case SRV_IN_PEER:
        if (in->from < CONS_REPLICAS_MAX)
            n->peer_seen[in->from] = fk_now_ns(); /* /health's quorum */
        ci.from = cons_replica(in->from);
        return step(n, &ci);
    case SRV_IN_REQUEST:
        if (n->proto != CONS_PROTO_MPX) {
            fk_metric_add(n->m_malformed, 1); /* NOPaxos requests go through kv.oum */
            return 0;
        }
        note_request(n, in->client_id, request_type(in->buf, in->len));
        ci.from = cons_client(in->client_id);
        return step(n, &ci);
    case SRV_IN_STATUS: {
        struct fkc_status st;
        fill_status(n, &st);
        srv_net_to_client(n->net, in->client_id, FKC_STATUS, &st, sizeof(st));
        return 0;
    }
    case SRV_IN_SNAP: {
        struct cons_core_status cs;
        const uint8_t *reply;
        size_t len;
        n->core.ops->status(n->core.impl, &cs);
        srv_backup_on_request(&n->backup, in->buf, in->len, &cs, fk_now_ns(), &reply, &len);
        srv_net_to_client(n->net, in->client_id, FKC_SNAP, reply, len);
        return 0;
    }
    case SRV_IN_OUM:
    case SRV_IN_OUM_DROP:
    case SRV_IN_OUM_FILL:
        return n->proto == CONS_PROTO_NOP ? feed_oum(n, in) : 0;
    }
    return 0;
}

/* ---- the loop ------------------------------------------------------------------------- */

static int commit_batch(struct srv_node *n)
{
    uint64_t t0 = fk_now_ns(), durable = 0;
    int rc = n->core.ops->seal ? n->core.ops->seal(n->core.impl) : 0;
    if (rc < 0) {
        srv_disk_abort(n->disk);
        return rc;
    }
    rc = srv_disk_commit(n->disk, &durable);
    fk_hist_record(&n->commit_lat, fk_now_ns() - t0);
    if (rc < 0)
        return rc;
    if (durable <= n->fed)
        return 0;
    n->fed = durable;
    struct cons_input ci = {.kind = CONS_IN_PERSISTED, .cookie = durable};
    rc = kv_write_begin(n->store);
    if (rc == 0)
        rc = step(n, &ci);
    return rc < 0 ? rc : 1; /* 1: a transaction is open */
}

/* State transfers into this replica: one line when one starts, moves to
 * another sender, or completes (with its rate); counters for the page. */
static void observe_xfer(struct srv_node *n, const struct cons_xfer_stats *x)
{
    struct cons_xfer_stats *o = &n->xfer_seen;
    const uint64_t v[4] = {x->bytes_in, x->chunks_in, x->bytes_out, x->chunks_out};
    for (int i = 0; i < 4; i++)
        fk_metric_set(n->m_xfer[i], v[i]);
    uint64_t now = fk_now_ns();
    /* A completion first: the core may start the next transfer in the
     * same step (a NOPaxos state that landed behind the ring again). */
    if (x->completed != o->completed) {
        double s = (double)(now - n->xfer_t0) / 1e9;
        double mib = (double)(x->bytes_in - o->bytes_in) / (1 << 20);
        fk_info("node", "state transfer: complete, %.1f MiB in %llu chunks, %.2f s (%.1f MiB/s)",
                mib, (unsigned long long)(x->chunks_in - o->chunks_in), s, s > 0 ? mib / s : 0.0);
    }
    if (x->started != o->started) {
        n->xfer_t0 = now;
        fk_info("node", "state transfer: fetching the state from replica %u", x->from);
    }
    if (x->switched != o->switched)
        fk_info("node", "state transfer: fetching the state from replica %u (again, %llu so far)",
                x->from, (unsigned long long)x->switched);
    if (x->started != o->started || x->completed != o->completed || x->switched != o->switched)
        *o = *x; /* the bytes of a transfer count from its start */
}

/* Peer message counts from srv_net, once per tick (the metrics page is
 * served by this thread's loop). */
static void observe_net(struct srv_node *n)
{
    struct srv_net_stats st;
    srv_net_stats(n->net, &st);
    const uint64_t v[4] = {st.out_bcast, st.in_bcast, st.out_peer, st.in_peer};
    for (int i = 0; i < 4; i++)
        fk_metric_set(n->m_peer[i], v[i]);
    struct cons_core_status cs;
    n->core.ops->status(n->core.impl, &cs);
    for (int i = 0; i < 4; i++)
        fk_metric_set(n->m_sync[i], cs.syncs[i]);
    fk_metric_set(n->m_stalls, cs.stalls);
    fk_metric_set(n->m_gap_noops, cs.gap_noops);
    fk_metric_set(n->m_holds, cs.holds);
    observe_xfer(n, &cs.xfer);
}

static void observe_term(struct srv_node *n)
{
    struct fkc_status st;
    fill_status(n, &st);
    if (st.term != n->last_term) {
        if (n->last_term != 0)
            fk_metric_add(n->m_views, 1);
        fk_info("node", "%s %llu, role %u, leader %u",
                n->proto == CONS_PROTO_MPX ? "ballot" : "view", (unsigned long long)st.term,
                st.role, st.leader);
        n->last_term = st.term;
    }
}

/* The SIGUSR1 line: the core's state and what the network layer counted. */
static void dump_state(struct srv_node *n)
{
    char core[512];
    n->core.ops->describe(n->core.impl, core, sizeof core);
    struct srv_net_stats st;
    srv_net_stats(n->net, &st);
    fk_info(
        "node",
        "state: %s; net in peer %llu req %llu oum %llu drop %llu fill %llu held %llu bcast %llu, "
        "out peer %llu client %llu bcast %llu, failed sends %llu; durable %llu",
        core, (unsigned long long)st.in_peer, (unsigned long long)st.in_req,
        (unsigned long long)st.in_oum, (unsigned long long)st.in_drop,
        (unsigned long long)st.in_fill, (unsigned long long)st.oum_holds,
        (unsigned long long)st.in_bcast, (unsigned long long)st.out_peer,
        (unsigned long long)st.out_client, (unsigned long long)st.out_bcast,
        (unsigned long long)st.dropped, (unsigned long long)srv_disk_durable(n->disk));
}

/* One batch: inputs, a tick when due, one commit. */
/* NOPaxos, each tick: the session of the core's view to the failover
 * decision (srv_net_seen_session), and a session this node started to
 * its disk, in the batch's transaction, so that a restart starts above it. */
static int note_sequencer(struct srv_node *n)
{
    struct cons_core_status cs;
    n->core.ops->status(n->core.impl, &cs);
    srv_net_seen_session(n->net, (uint32_t)(cs.term & 0xffffffffu)); /* nop.h: the view's session */
    uint32_t started = srv_net_started_session(n->net);
    if (started <= n->seq_saved)
        return 0;
    n->seq_saved = started;
    return kv_meta_put(n->store, "seq.session", &started, sizeof(started));
}

static int batch(struct srv_node *n, int txn_open)
{
    int rc = txn_open ? 0 : kv_write_begin(n->store);
    uint64_t now = fk_now_ns();
    uint64_t wait = n->next_tick > now ? n->next_tick - now : 0;
    struct srv_in in;
    for (int i = 0; rc == 0 && i < SRV_BATCH; i++) {
        if (srv_net_next(n->net, &in, i == 0 ? wait : 0) < 0)
            break;
        rc = feed(n, &in);
    }
    now = fk_now_ns();
    if (rc == 0 && now >= n->next_tick) {
        n->next_tick = now + SRV_TICK_NS;
        struct cons_input ci = {.kind = CONS_IN_TICK};
        rc = step(n, &ci);
        srv_net_tick(n->net, now);
        srv_backup_tick(&n->backup, now);
        uv_run(&n->loop, UV_RUN_NOWAIT);
        observe_term(n);
        observe_net(n);
        if (rc == 0 && n->proto == CONS_PROTO_NOP)
            rc = note_sequencer(n);
        if (n->check_every != 0 && ++n->ticks % n->check_every == 0)
            n->core.ops->invariants(n->core.impl); /* aborts on a violation */
        if (n->dump) {
            n->dump = 0;
            dump_state(n);
        }
    }
    /* Messages first, then the LMDB commit: in async durability nothing
     * the messages promise waits for it (srv_disk.h). */
    srv_net_flush(n->net);
    if (rc < 0) {
        srv_disk_abort(n->disk);
        return rc;
    }
    rc = commit_batch(n);
    if (rc == 1)
        srv_net_flush(n->net); /* what CONS_IN_PERSISTED released (durable mode) */
    return rc;
}

/* SIGTERM: a leader hands over before the drain (cons_core_ops.transfer;
 * Multi-Paxos asks its most advanced follower to start phase 1 at once),
 * so a rolling restart changes leader in a round trip, not an election
 * timeout. Returns 1 (the write transaction is open) or an error. */
static int hand_over(struct srv_node *n, int txn_open)
{
    if (n->core.ops->transfer == NULL)
        return txn_open;
    struct cons_outbox *ob = NULL;
    int rc = txn_open ? 0 : kv_write_begin(n->store);
    if (rc == 0)
        rc = n->core.ops->transfer(n->core.impl, fk_now_ns(), &ob);
    if (rc == 0)
        rc = drain(n, ob);
    srv_net_flush(n->net);
    if (rc == 0 && ob->nmsgs > 0)
        fk_info("node", "stopping: leadership handed over");
    return rc < 0 ? rc : 1;
}

int srv_node_run(struct srv_node *n)
{
    srv_notify("READY=1\nSTATUS=serving");
    fk_info("node", "replica %u serving (%s, %s fabric, %s durability)%s", n->id, n->core.ops->name,
            srv_net_fabric(n->net), n->o.cluster.durability == FK_DURABLE_SYNC ? "sync" : "async",
            n->check_every ? "; checking the core's invariants every 100 ms" : "");
    int rc = 0, open = 0;
    while (!n->stop && rc >= 0) {
        rc = batch(n, open);
        open = rc == 1;
    }
    srv_notify("STOPPING=1");
    if (rc >= 0) {
        int h = hand_over(n, open);
        rc = h < 0 ? h : rc;
        open = h == 1;
    }
    /* Drain: what was received is stepped and committed, and replies
     * already produced go out; nothing new is taken once the deadline
     * passes. */
    uint64_t end = fk_now_ns() + SRV_DRAIN_NS / 20;
    while (rc >= 0 && fk_now_ns() < end) {
        rc = batch(n, open);
        open = rc == 1;
    }
    if (open && rc >= 0)
        rc = commit_batch(n) < 0 ? FK_ESTORAGE : 0;
    if (rc < 0) {
        fk_error("node", "stopping on a storage failure: %s (durable through cookie %llu)",
                 fk_strerror(rc), (unsigned long long)srv_disk_durable(n->disk));
        return rc;
    }
    return 0;
}

void srv_node_stop(struct srv_node *n)
{
    n->stop = 1;
}

void srv_node_dump(struct srv_node *n)
{
    n->dump = 1;
}

/* ---- open and close ------------------------------------------------------------------- */

static uint64_t gauge_commit(void *arg)
{
    struct fkc_status st;
    fill_status(arg, &st);
    return st.commit;
}

static uint64_t gauge_flow_bytes(void *arg)
{
    struct srv_net_stats st;
    srv_net_stats(((struct srv_node *)arg)->net, &st);
    return st.flow_bytes;
}

static uint64_t gauge_client_flow_bytes(void *arg)
{
    struct srv_net_stats st;
    srv_net_stats(((struct srv_node *)arg)->net, &st);
    return st.client_flow_bytes;
}

/* One verbs counter (srv_net_fab_counters): the whole set is copied per
 * sample, 13 small copies per scrape. */
static uint64_t counter_fab(void *arg)
{
    const struct srv__fab_metric *f = arg;
    struct fab_counters c;
    srv_net_fab_counters(f->n->net, &c);
    uint64_t v;
    memcpy(&v, (const char *)&c + f->off, sizeof v);
    return v;
}

static uint64_t gauge_is_leader(void *arg)
{
    struct fkc_status st;
    fill_status(arg, &st);
    return st.role == FKC_ROLE_LEADER;
}

static uint64_t gauge_one(void *arg)
{
    (void)arg;
    return 1;
}

/* Process metrics under their standard names (the Prometheus client
 * libraries' process collector), from /proc/self. */
static uint64_t gauge_rss_bytes(void *arg)
{
    (void)arg;
    unsigned long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL) {
        if (fscanf(f, "%lu %lu", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t gauge_open_fds(void *arg)
{
    (void)arg;
    uint64_t k = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && k < 1000000;)
        k += e->d_name[0] != '.';
    closedir(d);
    return k > 0 ? k - 1 : 0; /* not the directory's own descriptor */
}

static uint64_t counter_cpu_ns(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * FK_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static const char *const role_names[] = {"",       "follower",   "candidate",
                                         "leader", "recovering", "view-change"};

/* A replica counts as heard from when a protocol message of it arrived
 * this recently: heartbeats travel every 20 ms, a view change starts
 * after 1 s of silence. */
#define SRV_HEALTH_PEER_NS (2 * FK_NSEC_PER_SEC)

/* /health as etcd's: 200 with a small JSON body when the replica serves in
 * a view (or ballot) with a leader it knows and hears from a majority of
 * the replicas (itself included): a replica alone can believe it leads
 * (NOPaxos' view 0), but serves nothing. 503 otherwise, with the reason. */
static int health_page(struct srv_node *n, char *body, size_t cap, int *status)
{
    struct fkc_status st;
    fill_status(n, &st);
    uint64_t now = fk_now_ns();
    uint32_t heard = 1, quorum = n->n / 2 + 1;
    for (uint32_t i = 0; i < n->n && i < CONS_REPLICAS_MAX; i++)
        heard += i != n->id && n->peer_seen[i] != 0 && now - n->peer_seen[i] < SRV_HEALTH_PEER_NS;
    char why[96] = "";
    if (st.leader >= n->n)
        snprintf(why, sizeof why, "no leader known");
    else if ((st.role != FKC_ROLE_LEADER && st.role != FKC_ROLE_FOLLOWER) ||
             !srv_net_oum_ready(n->net))
        snprintf(why, sizeof why, "not in a view: a view change or recovery runs");
    else if (heard < quorum)
        snprintf(why, sizeof why, "hears from %u of %u replicas, a majority is %u", heard, n->n,
                 quorum);
    *status = why[0] ? 503 : 200;
    const char *role =
        st.role < sizeof role_names / sizeof role_names[0] ? role_names[st.role] : "";
    if (why[0])
        return snprintf(body, cap,
                        "{\"health\":\"false\",\"id\":%u,\"role\":\"%s\",\"reason\":\"%s\"}\n",
                        st.id, role, why);
    return snprintf(body, cap,
                    "{\"health\":\"true\",\"id\":%u,\"role\":\"%s\",\"leader\":%u,"
                    "\"term\":%llu,\"commit\":%llu}\n",
                    st.id, role, st.leader, (unsigned long long)st.term,
                    (unsigned long long)st.commit);
}

static int metrics_page(void *arg, const char *path, char *body, size_t cap, const char **ctype,
                        int *status)
{
    struct srv_node *n = arg;
    if (strcmp(path, "/health") == 0) {
        *ctype = "application/json";
        return health_page(n, body, cap, status);
    }
    if (strcmp(path, "/metrics") != 0)
        return -1;
    *ctype = "text/plain; version=0.0.4";
    return fk_metrics_render(&n->metrics, body, cap);
}

static void metrics_init(struct srv_node *n)
{
    struct fk_metrics *r = &n->metrics;
    fk_metrics_init(r);
    for (int t = CONS_OP_GET; t < CONS_OP__COUNT; t++) {
        char label[32];
        snprintf(label, sizeof(label), "op=\"%s\"", op_names[t]);
        fk_hist_init(&n->lat[t]);
        n->m_req[t] = fk_metrics_counter(r, "flowkv_requests_total", label,
                                         "Client requests received, by operation");
        fk_metrics_histogram(r, "flowkv_request_seconds", label,
                             "Time from a request's arrival to this replica's reply", &n->lat[t]);
    }
    n->m_req[CONS_OP_NOOP] = n->m_req[CONS_OP_GET];
    fk_hist_init(&n->commit_lat);
    fk_metrics_histogram(r, "flowkv_lmdb_commit_seconds", "", "LMDB write transaction commits",
                         &n->commit_lat);
    fk_metrics_gauge_fn(r, "flowkv_is_leader", "", "1 on the replica that leads its view or ballot",
                        gauge_is_leader, n);
    fk_metrics_gauge_fn(r, "flowkv_build_info", "version=\"" FK_VERSION "\"",
                        "The release this replica runs (always 1)", gauge_one, n);
    fk_metrics_gauge_fn(r, "process_resident_memory_bytes", "", "Resident memory size in bytes",
                        gauge_rss_bytes, n);
    fk_metrics_gauge_fn(r, "process_open_fds", "", "Number of open file descriptors",
                        gauge_open_fds, n);
    struct fk_metric *cpu =
        fk_metrics_counter_fn(r, "process_cpu_seconds_total", "",
                              "User and system CPU time in seconds", counter_cpu_ns, n);
    if (cpu != NULL)
        cpu->ns_as_seconds = 1;
    fk_metrics_gauge_fn(r, "flowkv_commit_index", "", "Highest committed log index", gauge_commit,
                        n);
    fk_metrics_gauge_fn(r, "flowkv_flow_memory_bytes", "",
                        "Bytes of flow memory this node holds (rings, staging, counters)",
                        gauge_flow_bytes, n);
    fk_metrics_gauge_fn(r, "flowkv_flow_client_memory_bytes", "",
                        "Of those, the clients' request rings, held to flow_memory",
                        gauge_client_flow_bytes, n);
    n->m_views = fk_metrics_counter(r, "flowkv_view_changes_total", "",
                                    "Ballot (Multi-Paxos) or view (NOPaxos) changes seen");
    n->m_gaps = fk_metrics_counter(r, "flowkv_oum_gaps_total", "",
                                   "NOPaxos: sequence numbers reported missing (gap agreement)");
    n->m_dropped = fk_metrics_counter(r, "flowkv_outbox_dropped_total", "",
                                      "Protocol messages dropped because an outbox was full");
    n->m_malformed =
        fk_metrics_counter(r, "flowkv_malformed_total", "", "Messages rejected as malformed");
    static const char *const sync_labels[4] = {"kind=\"hashes\"", "kind=\"entries\"",
                                               "kind=\"state\"", "kind=\"history\""};
    for (int i = 0; i < 4; i++)
        n->m_sync[i] = fk_metrics_counter(
            r, "flowkv_nop_syncs_total", sync_labels[i],
            "NOPaxos leader: synchronization messages sent to followers, by what they carry");
    static const char *const xfer_names[4][2] = {
        {"flowkv_transfer_in_bytes_total", "State transfer bytes received"},
        {"flowkv_transfer_in_chunks_total", "State transfer chunks received"},
        {"flowkv_transfer_out_bytes_total", "State transfer bytes sent"},
        {"flowkv_transfer_out_chunks_total", "State transfer chunks sent"}};
    for (int i = 0; i < 4; i++)
        n->m_xfer[i] = fk_metrics_counter(r, xfer_names[i][0], "", xfer_names[i][1]);
    n->m_stalls = fk_metrics_counter(
        r, "flowkv_nop_ring_stalls_total", "",
        "NOPaxos leader: times it stopped taking requests half a ring past its checkpoint");
    n->m_gap_noops = fk_metrics_counter(
        r, "flowkv_nop_gap_noops_total", "",
        "NOPaxos leader: slots the ordered multicast dropped, agreed as NO-OPs (gap agreement)");
    n->m_holds = fk_metrics_counter(
        r, "flowkv_nop_serve_holds_total", "",
        "NOPaxos leader: times it rolled back to its commit point to serve a state transfer");
    static const char *const peer_labels[4] = {
        "flow=\"replicate\",dir=\"out\"", "flow=\"replicate\",dir=\"in\"",
        "flow=\"shuffle\",dir=\"out\"", "flow=\"shuffle\",dir=\"in\""};
    for (int i = 0; i < 4; i++)
        n->m_peer[i] = fk_metrics_counter(
            r, "flowkv_peer_messages_total", peer_labels[i],
            "Protocol messages between replicas, by flow: the replicate flow (kv.bcast) or the "
            "shuffles (kv.peer)");
    /* What went through RDMA (fab.h, struct fab_counters): the checks of
     * the service on Soft-RoCE read them (tests/rdma-vm/cluster.sh). */
    static const struct {
        const char *label;
        size_t off;
    } fab[13] = {{"kind=\"write\"", offsetof(struct fab_counters, write)},
                 {"kind=\"write_inline\"", offsetof(struct fab_counters, write_inline)},
                 {"kind=\"read\"", offsetof(struct fab_counters, read)},
                 {"kind=\"fetch_and_add\"", offsetof(struct fab_counters, faa)},
                 {"kind=\"send\"", offsetof(struct fab_counters, send)},
                 {"kind=\"recv\"", offsetof(struct fab_counters, recv)},
                 {"kind=\"completion\"", offsetof(struct fab_counters, completion)},
                 {"kind=\"completion_error\"", offsetof(struct fab_counters, error)},
                 {"kind=\"ud_send\"", offsetof(struct fab_counters, dgram_send)},
                 {"kind=\"ud_recv\"", offsetof(struct fab_counters, dgram_recv)},
                 {"kind=\"mcast_send\"", offsetof(struct fab_counters, mcast_send)},
                 {"kind=\"connect\"", offsetof(struct fab_counters, connect)},
                 {"kind=\"connect_retry\"", offsetof(struct fab_counters, connect_retry)}};
    _Static_assert(sizeof(fab) / sizeof(fab[0]) == sizeof(n->fab_m) / sizeof(n->fab_m[0]),
                   "one metric per verbs counter");
    for (int i = 0; i < 13; i++) {
        n->fab_m[i] = (struct srv__fab_metric){.n = n, .off = fab[i].off};
        fk_metrics_counter_fn(r, "flowkv_verbs_total", fab[i].label,
                              "Verbs work requests posted, completions and connections, by "
                              "kind (RDMA WRITE, READ, FETCH_AND_ADD, ...); 0 on the tcp fabric",
                              counter_fab, &n->fab_m[i]);
    }
}

/* The cluster file names a configuration (fk_conf.h, `members` and
 * `epoch`), which flowkv-deploy rewrites after each change but a change
 * made with the CLI alone does not: a replica restarted with a newer
 * configuration says that the file is behind (a new cluster made from it
 * would start with old members), one with an older learns the newer one
 * from the others. */
static void conf_note(struct srv_node *n)
{
    if (n->proto != CONS_PROTO_MPX)
        return;
    struct cons_core_status cs;
    n->core.ops->status(n->core.impl, &cs);
    char ids[64];
    fk_conf_ids(cs.conf.members, ids, sizeof ids);
    if (cs.conf.epoch > n->o.cluster.epoch)
        fk_warn("node",
                "this replica's configuration (epoch %u, members %s) is newer than the cluster "
                "file's (epoch %u): set `members = %s` and `epoch = %u` in it",
                cs.conf.epoch, ids, n->o.cluster.epoch, ids, cs.conf.epoch);
    else if (cs.conf.epoch < n->o.cluster.epoch)
        fk_info("node",
                "the cluster file names configuration epoch %u, this replica's disk epoch %u: it "
                "learns the newer one from the others",
                n->o.cluster.epoch, cs.conf.epoch);
}

static int open_core(struct srv_node *n, char *err, size_t errcap)
{
    struct cons_sm sm = kv_sm_cons(&n->sm);
    uint64_t seed = fk_now_ns() ^ ((uint64_t)getpid() << 32);
    int rc = 0;
    /* NOPaxos' view-change timeout (nop.h): one second, as etcd's default
     * election timeout. At 300 ms a lossy link started view changes in
     * cascade: a TCP segment lost twice waits 200 + 400 ms for its
     * retransmission, and heartbeats travel over TCP (the fault suite's 5%
     * loss scenario served almost nothing). Multi-Paxos draws its timeout
     * from [300, 600) ms and rides that out. */
    struct cons_core_config c = {.n = n->n,
                                 .id = n->id,
                                 .clients_max = n->proto == CONS_PROTO_MPX ? SRV_MPX_CLIENTS_MAX
                                                                           : SRV_CLIENTS_MAX,
                                 .arena_bytes = CONS_MSG_MAX + (1u << 20),
                                 .heartbeat_ns = 20 * FK_NSEC_PER_MSEC,
                                 .xfer_chunk = n->o.cluster.transfer_chunk,
                                 .xfer_window = n->o.cluster.transfer_window,
                                 .seed = seed};
    if (n->proto == CONS_PROTO_MPX) {
        c.log_cap = SRV_MPX_LOG;
        c.window = 64;
        c.batch_max = SRV_MPX_BATCH;
        c.pending_max = 4096;
        c.tick_ns = SRV_TICK_NS;
        c.election_ns = 300 * FK_NSEC_PER_MSEC;
        c.members = n->o.cluster.members; /* a new cluster's voters and epoch (fk_conf.h) */
        c.epoch = n->o.cluster.epoch;
    } else {
        /* `sync` durability is NOPaxos' durable mode (nop.h): replies wait
         * for the disk, and a group restarted all at once serves again. */
        c.log_cap = SRV_NOP_LOG;
        c.durable = n->o.cluster.durability == FK_DURABLE_SYNC;
        c.election_ns = SRV_NOP_ELECTION_NS;
    }
    const struct cons_core_ops *ops = cons_core_ops_of(n->proto);
    rc = ops ? cons_core_create(&n->core, ops, &c, sm) : FK_EINVAL;
    if (rc < 0) {
        snprintf(err, errcap, "cannot create the protocol core: %s", fk_strerror(rc));
        return rc;
    }
    int restored = 0;
    rc = kv_write_begin(n->store);
    if (rc == 0)
        rc = srv_disk_restore(n->disk, &n->core, &restored);
    if (rc < 0) {
        snprintf(err, errcap,
                 "cannot restore from %s: %s (move the directory away to recover it from the other "
                 "replicas)",
                 n->o.cluster.nodes[n->id].data_dir, fk_strerror(rc));
        srv_disk_abort(n->disk);
        return rc;
    }
    enum cons_start_mode mode = restored           ? CONS_START_RESTORED
                                : n->o.new_cluster ? CONS_START_FRESH
                                                   : CONS_START_EMPTY;
    fk_info("node", "starting %s",
            mode == CONS_START_RESTORED ? "from disk"
            : mode == CONS_START_FRESH  ? "a new cluster"
                                        : "empty: recovering state from the other replicas");
    struct cons_outbox *ob = NULL;
    rc = n->core.ops->start(n->core.impl, mode, fk_now_ns(), &ob);
    if (rc == 0)
        rc = srv_disk_persist(n->disk, ob->persists, ob->npersists);
    if (rc == 0)
        rc = commit_batch(n);
    if (rc == 1)
        rc = commit_batch(n) < 0 ? FK_ESTORAGE : 0;
    if (rc < 0)
        snprintf(err, errcap, "cannot start the protocol core: %s", fk_strerror(rc));
    else if (mode == CONS_START_RESTORED)
        conf_note(n);
    return rc < 0 ? rc : 0;
}

/* --restore seeds a replica that holds no state (srv_backup.h): one that
 * has a log (META) is refused, so a mistyped command never replaces a
 * replica's data. */
static int restore_check(struct srv_node *n, char *err, size_t errcap)
{
    uint8_t b;
    size_t len = 0;
    int rc = kv_meta_get(n->store, SRV_DISK_META_KEY, &b, sizeof b, &len);
    if ((rc == 0 || rc == FK_ETOOBIG) && len > 0) {
        snprintf(err, errcap,
                 "--restore: the data directory %s holds a replica's state; restore seeds an empty "
                 "one (move it away first)",
                 n->o.cluster.nodes[n->id].data_dir);
        return FK_EEXIST;
    }
    return rc == FK_ENOTFOUND ? 0 : rc;
}

static int restore(struct srv_node *n, char *err, size_t errcap)
{
    struct srv_backup_restored r;
    uint64_t t0 = fk_now_ns();
    int rc = srv_backup_restore(n->store, kv_sm_cons(&n->sm), n->o.restore, &r, err, errcap);
    if (rc < 0)
        return rc;
    fk_info("node",
            "restored %llu pairs from %s (checksum %016llx; index %llu of replica %u of a %s "
            "cluster; %llu sessions left out) in %.1f s",
            (unsigned long long)r.pairs, n->o.restore, (unsigned long long)r.file.checksum,
            (unsigned long long)r.file.index, r.file.replica,
            r.file.protocol == CONS_PROTO_MPX ? "multipaxos" : "nopaxos",
            (unsigned long long)r.sessions_dropped, (double)(fk_now_ns() - t0) / 1e9);
    return 0;
}

int srv_node_open(const struct srv_opts *o, struct srv_node **out, char *err, size_t errcap)
{
    struct srv_node *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return FK_ENOMEM;
    n->o = *o;
    n->id = o->id;
    n->n = o->cluster.n_nodes;
    n->proto = o->cluster.protocol == FK_PROTO_MULTIPAXOS ? CONS_PROTO_MPX : CONS_PROTO_NOP;
    n->start_ns = fk_now_ns();
    /* The test suite (tests/run.sh) sets FLOWKV_CHECK_INVARIANTS: every
     * replica it starts checks its core's invariants (nop_invariants,
     * mpx_invariants) ten times a second, as the simulator does after every
     * step. */
    const char *inv = getenv("FLOWKV_CHECK_INVARIANTS");
    n->check_every =
        inv != NULL && *inv != '\0' && strcmp(inv, "0") != 0 ? SRV_INVARIANTS_TICKS : 0;
    n->pend = calloc(PEND_SLOTS, sizeof(*n->pend));
    n->oum_buf = malloc(SRV_OUM_BUF);
    uv_loop_init(&n->loop);
    metrics_init(n);
    *out = n;
    const struct fk_node_conf *self = &o->cluster.nodes[o->id];
    if (n->pend == NULL || n->oum_buf == NULL) {
        snprintf(err, errcap, "out of memory");
        return FK_ENOMEM;
    }
    struct kv_store_opts so = {
        .dir = self->data_dir, .map_size = o->map_size, .durability = o->cluster.durability};
    int rc = kv_store_open(&so, &n->store);
    if (rc < 0) {
        snprintf(err, errcap, "cannot open the data directory %s: %s", self->data_dir,
                 fk_strerror(rc));
        return rc;
    }
    rc = kv_sm_init(&n->sm, n->store, o->quota);
    if (rc == 0)
        rc = srv_backup_init(&n->backup, kv_sm_cons(&n->sm), n->id, (uint8_t)n->proto);
    if (rc == 0 && o->restore != NULL)
        rc = restore_check(n, err, errcap);
    if (rc == FK_EEXIST)
        return rc;
    if (rc == 0)
        rc = srv_disk_open(&n->disk, n->store, n->proto, kv_sm_cons(&n->sm));
    if (rc < 0) {
        snprintf(err, errcap, "cannot use the data in %s: %s%s", self->data_dir, fk_strerror(rc),
                 rc == FK_ECONFIG ? " (it was written by the other protocol)" : "");
        return rc;
    }
    if (o->restore != NULL && (rc = restore(n, err, errcap)) < 0)
        return rc;
    /* The sequencer sessions this node starts stay above the highest it ever
     * started (consensus/seqctl.h): kept here, raised at each start and by
     * the sessions it starts (note_sequencer). */
    uint32_t session = 0;
    size_t len = 0;
    if (kv_meta_get(n->store, "seq.session", &session, sizeof(session), &len) < 0 || len != 4)
        session = 0;
    session = session % 65535 + 1;
    rc = kv_write_begin(n->store);
    if (rc == 0)
        rc = kv_meta_put(n->store, "seq.session", &session, sizeof(session));
    if (rc == 0)
        rc = kv_write_commit(n->store);
    if (rc < 0) {
        snprintf(err, errcap, "cannot write to %s: %s", self->data_dir, fk_strerror(rc));
        return rc;
    }
    n->seq_saved = session;
    struct srv_net_conf nc = {
        .cluster = &n->o.cluster, .id = n->id, .proto = n->proto, .session = session};
    rc = srv_net_open(&nc, &n->net);
    if (rc < 0) {
        snprintf(err, errcap, "cannot listen on %s or open its flows: %s", self->address,
                 fk_strerror(rc));
        return rc;
    }
    rc = open_core(n, err, errcap);
    if (rc < 0)
        return rc;
    if (self->metrics[0] != '\0') {
        rc = srv_http_start(&n->loop, self->metrics, metrics_page, n, &n->http);
        if (rc < 0) {
            snprintf(err, errcap, "cannot serve metrics on %s: %s", self->metrics, fk_strerror(rc));
            return rc;
        }
        fk_info("node", "metrics on http://%s/metrics", self->metrics);
    }
    n->next_tick = fk_now_ns();
    return 0;
}

void srv_node_close(struct srv_node *n)
{
    if (n == NULL)
        return;
    srv_http_stop(n->http);
    uv_run(&n->loop, UV_RUN_DEFAULT); /* runs the close callbacks */
    uv_loop_close(&n->loop);
    srv_net_close(n->net);
    if (n->disk != NULL)
        srv_disk_abort(n->disk);
    cons_core_destroy(&n->core);
    srv_backup_free(&n->backup);
    srv_disk_close(n->disk);
    kv_store_close(n->store);
    free(n->pend);
    free(n->oum_buf);
    free(n);
}
