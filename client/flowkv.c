/*
 * flowkv.c: libflowkv over flows; see flowkv.h and fkc_proto.h.
 *
 * Channels. The handles a process opens on one cluster share a channel:
 * one flow node, and at each replica one target in kv.reply.<i> (joined:
 * elastic membership) and one source on kv.req.<i> (Multi-Paxos, status)
 * or on kv.oum (NOPaxos). A replica then holds rings per client process,
 * not per handle: a thousand handles in a few processes cost it a few
 * rings, as FaRM and eRPC serve a machine's many client threads through
 * one endpoint each (DFI's flows are per-thread endpoints of a node,
 * section 3; here the channel's lock hands them from thread to thread,
 * flow.h's adopt). Each pipeline slot of each handle is one client
 * session with its own id; the id's low bits name the handle and the
 * slot, so a reply finds its slot without a search; a slot keeps its
 * encoded operation so a retry resends the same request number (exactly
 * once through the replicas' client table, cons.h).
 *
 * Threads. A thread waiting for its handle's completions either polls the
 * reply flows for every handle of the channel (the poller, one at a time:
 * it dispatches each reply to its slot and wakes the slot's thread) or
 * sleeps on the channel's condition variable (leader/followers). Requests
 * that submissions staged are flushed by a waiting thread before it
 * blocks, unless another thread is about to take the lock to wait too:
 * that one flushes instead, so requests of many threads share segments
 * (flat combining; a kv.oum segment is one fetch-and-add at the
 * sequencer, DFI section 5.4).
 */
#include "flowkv.h"
#include "flowkv_snap.h"

#include "fk_version.h"

#include "cons.h"
#include "cons_wire.h"
#include "fk_conf.h"
#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"
#include "fkc_proto.h"
#include "flow.h"
#include "flow_msg.h"
#include "mpx.h"
#include "nop.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

_Static_assert(FLOWKV_KEY_MAX == CONS_KEY_MAX && FLOWKV_VAL_MAX == CONS_VAL_MAX &&
                   FLOWKV_SCAN_MAX == CONS_SCAN_MAX && FLOWKV_RESULT_MAX == CONS_REPLY_MAX &&
                   FLOWKV_NOP_OP_MAX == NOP_OP_MAX && FLOWKV_SCAN_PAGE == CONS_SCAN_PAGE,
               "the public limits are the cores' limits");

/* A request unanswered for RESEND_NS, or for the channel's round-trip
 * estimate plus four deviations when that is longer (RFC 6298's RTO from
 * the requests answered at their first send, Karn's rule), up to
 * RESEND_MAX_NS, is resent. A fixed 100 ms resent every request of a
 * cluster whose queue held more than 100 ms of work: NOPaxos with sync
 * durability loading default records from 4 threads of 64 in flight
 * (about 250 ms a request) did each one three times and never finished. */
#define RESEND_NS       (100ULL * 1000000ULL)
#define RESEND_MAX_NS   (2000ULL * 1000000ULL)
#define REJOIN_NS       (1000ULL * 1000000ULL)
#define REJOIN_FAST_NS  (5000ULL * 1000000ULL) /* probed often this long after it went away */
#define OPEN_NS         (1000ULL * 1000000ULL) /* joining one replica at most */
#define REJOIN_PROBE_NS (50ULL * 1000000ULL)   /* a replica that went away must answer first */
#define PUSH_NS         (50ULL * 1000000ULL)
#define TIMERS_NS       (1000ULL * 1000ULL)   /* resends and deadlines: checked this often */
#define FLUSH_HOLD_NS   (50ULL * 1000ULL)     /* a staged request waits for company at most this */
#define SLEEP_MAX_NS    (500ULL * 1000000ULL) /* a thread waiting on the poller wakes by itself */
/* The largest reply: an operation's, or a backup chunk (fkc_proto.h). */
#define REPLY_OP_MAX    (1 + 64 + CONS_WIRE_REPLY_MAX)
#define REPLY_SNAP_MAX  (1 + sizeof(struct fkc_snap_reply) + FKC_SNAP_CHUNK_MAX)
#define REPLY_MSG_MAX   (REPLY_OP_MAX > REPLY_SNAP_MAX ? REPLY_OP_MAX : REPLY_SNAP_MAX)
#define DEFAULT_TIMEOUT (5ULL * 1000000000ULL)
/* ch->tuple holds a kv.oum message (NOPaxos) or a kind byte and an
 * encoded request (Multi-Paxos). */
#define MPX_REQ_MAX (CONS_WIRE_OP_MAX + 64)
#define TUPLE_BUF   (FKC_OUM_MSG_MAX > 1 + MPX_REQ_MAX ? FKC_OUM_MSG_MAX : 1 + MPX_REQ_MAX)
_Static_assert(FKC_OUM_TUPLE % 8 == 0 && FKC_OUM_TUPLE > FLOW_MSG_HDR + sizeof(struct fkc_oum),
               "a kv.oum fragment holds the header and some of the op");

/* A client id's low bits: the slot's index in its handle, then the
 * handle's index in its channel; the rest is random (45 bits). */
#define SLOT_BITS 7
#define HID_BITS  12
_Static_assert(FLOWKV_PIPELINE_MAX == 1 << SLOT_BITS && FLOWKV_HANDLES_MAX == 1 << HID_BITS,
               "a client id's low bits name the handle and the slot");

struct slot {
    int busy, done;
    uint64_t client_id, req_no, tag;
    uint64_t deadline, resend_at;
    uint64_t sent_at; /* the first send of this request */
    uint32_t tries;
    uint32_t sent_to; /* Multi-Paxos: the replica its last send went to */
    struct cons_op op;
    uint8_t *obuf; /* op's bytes when they do not fit inline, obuf_cap of them */
    size_t obuf_cap;
    struct nop_quorum q;
    struct cons_reply res; /* res.data: the slot's result buffer, grown to the largest */
};

struct replica {
    flow_target *t; /* our target in kv.reply.<i>, NULL until joined */
    struct flow_msg_rx *rx;
    uint32_t idx; /* our target index there */
    flow_source *req;
    struct flow_msg_tx tx;
    uint64_t retry_at;
    uint64_t left_at;    /* when it went away (went_away): probed often at first */
    uint64_t full_until; /* its request ring was full: sends wait for the resend */
    int status_seen;
    struct fkc_status status;
};

/* What the handles of a process share on one cluster (above). Every field
 * below `lock` is used under it. */
struct chan {
    struct chan *next; /* chans, under chans_lock */
    char path[FK_CONF_STR_MAX], bind[64];
    uint32_t refs; /* handles, under chans_lock */
    pthread_mutex_t lock;
    uint32_t wanting;  /* atomic: threads about to take the lock to wait for completions */
    int polling;       /* a thread polls the reply flows */
    int dirty;         /* requests staged, not flushed */
    uint64_t dirty_at; /* when the oldest of them was staged */
    struct fk_cluster_conf conf;
    uint32_t n;
    int nop;
    flow_node *node;
    struct replica r[CONS_REPLICAS_MAX];
    flow_source *oum;
    struct flow_msg_tx oum_tx;
    uint8_t *tuple; /* the kv.oum message, or the encoded request */
    uint32_t leader;
    uint32_t last_to;      /* Multi-Paxos: the replica the last request went to */
    uint64_t srtt, rttvar; /* ns; srtt 0: no sample yet (resend_after) */
    uint64_t timers_at;    /* next run of timers() */
    uint64_t status_id;    /* the client id of status and backup requests */
    struct {               /* the backup request waiting for its reply (flowkv__snap_call) */
        int want, seen;
        struct fkc_snap_req q;
        struct fkc_snap_reply rep;
        uint8_t *buf;
        size_t cap, len;
    } snap;
    uint32_t slots;              /* pipeline slots of its handles */
    uint32_t req_segs, oum_segs; /* ring segments its sources ask for (chan_segs) */
    uint32_t reply_segs;         /* and its reply targets grant */
    struct flowkv *sleepers;     /* threads asleep in wait_done, the latest first */
    uint32_t live;               /* handles registered */
    uint32_t nhandles;           /* 1 + the highest index registered */
    struct flowkv *handles[FLOWKV_HANDLES_MAX];
};

struct flowkv {
    struct chan *ch;
    uint32_t hid; /* index in ch->handles */
    uint64_t timeout_ns;
    uint32_t pipeline, inflight;
    int deferred; /* the last pump returned completions before flushing (pump) */
    int sleeping; /* its thread waits on cv for the poller (wait_done) */
    /* flowkv_poll_set: the handle whose thread sleeps for this one's
     * completions too (NULL: this one's own). */
    struct flowkv *wake_to;
    uint32_t set_next; /* flowkv_poll_set: where its next collection begins */
    pthread_cond_t cv;
    struct flowkv *sprev, *snext; /* the channel's sleepers, while sleeping */
    struct slot *slots;
    char detail[128]; /* flowkv_error_detail: the last synchronous call's */
};

static pthread_mutex_t chans_lock = PTHREAD_MUTEX_INITIALIZER;
static struct chan *chans;

static uint64_t random_id(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof(v), 0) != sizeof(v))
            v = fk_now_ns() ^ ((uint64_t)getpid() << 40);
    }
    return v;
}

/* Each slot is a client of its own (at most one request in flight, as the
 * consensus client table wants), numbering its requests from 1. */
static void new_session(struct slot *sl, uint32_t hid, uint32_t index)
{
    uint64_t high = 0;
    while (high == 0)
        high = random_id() & ~((1ULL << (SLOT_BITS + HID_BITS)) - 1);
    sl->client_id = high | (uint64_t)hid << SLOT_BITS | index;
    sl->req_no = 0;
}

/* The local address replicas reach us at: the one the kernel would use
 * to reach the first replica (no packet is sent by a UDP connect). */
static void local_ip(const char *peer_ip, char *out, size_t cap)
{
    snprintf(out, cap, "127.0.0.1");
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)};
    if (fd < 0)
        return;
    if (inet_pton(AF_INET, peer_ip, &a.sin_addr) == 1 &&
        connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        socklen_t l = sizeof(a);
        if (getsockname(fd, (struct sockaddr *)&a, &l) == 0)
            inet_ntop(AF_INET, &a.sin_addr, out, (socklen_t)cap);
    }
    close(fd);
}

/* ---- the channel's lock ----------------------------------------------------- */

/* The lock's holder owns the channel's flows (flow.h: a hand-over ordered
 * by a mutex). */
static void ch_adopt(struct chan *ch)
{
    for (uint32_t i = 0; i < ch->n; i++) {
        if (ch->r[i].req != NULL)
            flow_source_adopt(ch->r[i].req);
        if (ch->r[i].t != NULL)
            flow_target_adopt(ch->r[i].t);
    }
    if (ch->oum != NULL)
        flow_source_adopt(ch->oum);
}

static void ch_lock(struct chan *ch)
{
    pthread_mutex_lock(&ch->lock);
    ch_adopt(ch);
}

static void ch_unlock(struct chan *ch)
{
    pthread_mutex_unlock(&ch->lock);
}

/* A thread that waits for completions takes the lock through here: while
 * it waits for the lock, a thread about to block leaves the flush to it. */
static void ch_lock_wanting(struct chan *ch)
{
    __atomic_add_fetch(&ch->wanting, 1, __ATOMIC_RELAXED);
    ch_lock(ch);
    __atomic_sub_fetch(&ch->wanting, 1, __ATOMIC_RELAXED);
}

/* ---- joining replicas ------------------------------------------------------- */

static void leave(struct replica *r)
{
    if (r->req != NULL) {
        flow_msg_tx_free(&r->tx);
        flow_source_close(r->req);
        r->req = NULL;
    }
    flow_msg_rx_destroy(r->rx);
    r->rx = NULL;
    if (r->t != NULL)
        flow_target_close(r->t);
    r->t = NULL;
}

/* Joins replica i's reply flow and opens its request flow into r, with
 * the channel's ring sizes. */
static int join_into(struct chan *ch, uint32_t i, struct replica *r)
{
    char name[FLOW_NAME_MAX];
    snprintf(name, sizeof(name), "%s%u", FKC_FLOW_REPLY, i);
    int rc = flow_target_join_ring(ch->node, name, ch->reply_segs, &r->t);
    if (rc < 0)
        return rc;
    r->idx = (uint32_t)flow_target_index(r->t);
    r->rx = flow_msg_rx_create(r->t, FKC_REPLY_TUPLE, 1, REPLY_MSG_MAX);
    if (r->rx == NULL) {
        leave(r);
        return FK_ENOMEM;
    }
    snprintf(name, sizeof(name), "%s%u", FKC_FLOW_REQ, i);
    rc = flow_source_open_ring(ch->node, name, FLOW_ANY, ch->req_segs, OPEN_NS, &r->req);
    if (rc == 0) {
        flow_source_set_timeout(r->req, PUSH_NS);
        rc = flow_msg_tx_init(&r->tx, r->req, FKC_REQ_TUPLE);
        if (rc < 0) {
            flow_source_close(r->req);
            r->req = NULL;
        }
    }
    if (rc < 0)
        leave(r);
    return rc;
}

static int join(struct chan *ch, uint32_t i)
{
    return join_into(ch, i, &ch->r[i]);
}

/* Joins again the replicas that went away, once a second. A join makes
 * several control calls, each allowed seconds: to a replica cut off by a
 * partition they blocked this thread (and every operation waiting on it)
 * until the partition healed. A replica that does not answer a short
 * probe first is skipped until the next try; one whose host refused at
 * once (a process restarting: a restarted replica listens again within a
 * second or two) is probed again every REJOIN_NS / 10 for REJOIN_FAST_NS
 * after it went away: probed once a second, one in a rolling restart was
 * joined again up to a second late, and a NOPaxos client, which needs
 * the new leader and another replica, waited for it. */
static void rejoin_due(struct chan *ch, uint64_t now)
{
    for (uint32_t i = 0; i < ch->n; i++) {
        struct replica *r = &ch->r[i];
        if (r->t != NULL || now < r->retry_at)
            continue;
        uint64_t t0 = fk_now_ns();
        if (flow_node_probe(ch->node, ch->conf.nodes[i].address, REJOIN_PROBE_NS) < 0 ||
            join(ch, i) < 0) {
            uint64_t t = fk_now_ns();
            int refused = t - t0 < REJOIN_PROBE_NS / 2;
            fk_debug("client", "replica %u: joining again failed after %llu ms", i,
                     (unsigned long long)((t - t0) / FK_NSEC_PER_MSEC));
            r->retry_at =
                t + (refused && t - r->left_at < REJOIN_FAST_NS ? REJOIN_NS / 10 : REJOIN_NS);
        }
    }
}

static void close_oum(struct chan *ch)
{
    if (ch->oum == NULL)
        return;
    flow_msg_tx_free(&ch->oum_tx);
    flow_source_close(ch->oum);
    ch->oum = NULL;
}

static int open_oum(struct chan *ch)
{
    int rc =
        flow_source_open_ring(ch->node, FKC_FLOW_OUM, FLOW_ANY, ch->oum_segs, OPEN_NS, &ch->oum);
    if (rc < 0)
        return rc;
    flow_source_set_timeout(ch->oum, PUSH_NS);
    rc = flow_msg_tx_init(&ch->oum_tx, ch->oum, FKC_OUM_TUPLE);
    if (rc < 0) {
        flow_source_close(ch->oum);
        ch->oum = NULL;
    }
    return rc;
}

/* The fewest segments of a channel's ring. Each flush takes a segment
 * however few fragments it carries, and a segment comes back with a credit
 * (DFI section 5.3) that a lossy link delays by TCP's retransmission
 * timeout (200 ms and more): with 4 segments a lost credit stalled the
 * ring, and the replicas' 2 ms pushes dropped their replies (5% loss on
 * every host, NOPaxos 8 s: 21-145 operations against 216-284 with 32). */
#define CHAN_SEGS_MIN 32

/* Ring segments for `slots` requests in flight of `frags` fragments each
 * (a larger one waits for room, it does not fail), per_seg to a segment,
 * twice over (a segment is reused once consumed), at least CHAN_SEGS_MIN,
 * at most max:
 * rings grow with the channel's handles (DFI section 5.3 sizes a ring to
 * the bandwidth it must cover; a handle with one request in flight needs
 * a few hundred bytes of it), and a process with one handle costs each
 * replica kilobytes. */
static uint32_t chan_segs(uint32_t slots, uint32_t frags, uint32_t per_seg, uint32_t max)
{
    uint64_t n = 2 * (((uint64_t)slots * frags + per_seg - 1) / per_seg);
    return n < CHAN_SEGS_MIN ? CHAN_SEGS_MIN : n > max ? max : (uint32_t)n;
}

/* A ring of `have` segments that must hold `need`: doubled at least, so
 * that a channel whose handles come one by one reopens its rings a few
 * times only (each growth holds the old and the new ring at once). */
static uint32_t grown(uint32_t have, uint32_t need, uint32_t max)
{
    if (need <= have)
        return have;
    return need > 2 * have ? need : 2 * have > max ? max : 2 * have;
}

/* Larger rings for the channel's handles (under the lock): each replica
 * is joined again (a new reply target, a new request source) before the
 * old ones close, so a refusal (the replicas' client memory) keeps the
 * old rings and fails only the growth. Requests in the old request ring
 * reach the replica before its end; a reply on its way to the old reply
 * target is lost and its request resent. Rings grow as handles open
 * (grown doubles them), so this happens a few times in a process. */
static int chan_grow(struct chan *ch, uint32_t req_segs, uint32_t reply_segs, uint32_t oum_segs)
{
    int rc = 0;
    if (req_segs > ch->req_segs || reply_segs > ch->reply_segs) {
        uint32_t had_req = ch->req_segs, had_reply = ch->reply_segs;
        ch->req_segs = req_segs > had_req ? req_segs : had_req;
        ch->reply_segs = reply_segs > had_reply ? reply_segs : had_reply;
        for (uint32_t i = 0; i < ch->n && rc == 0; i++) {
            if (ch->r[i].t == NULL)
                continue;
            struct replica nr;
            memset(&nr, 0, sizeof nr);
            rc = join_into(ch, i, &nr);
            if (rc == 0) {
                leave(&ch->r[i]);
                ch->r[i] = nr;
            }
        }
        if (rc < 0) { /* the replicas joined anew keep their new rings */
            ch->req_segs = had_req;
            ch->reply_segs = had_reply;
        }
    }
    if (rc == 0 && ch->oum != NULL && oum_segs > ch->oum_segs) {
        flow_source *old = ch->oum;
        struct flow_msg_tx old_tx = ch->oum_tx;
        uint32_t had = ch->oum_segs;
        ch->oum_segs = oum_segs;
        rc = open_oum(ch);
        if (rc == 0) {
            flow_msg_tx_free(&old_tx);
            flow_source_close(old);
        } else {
            ch->oum = old;
            ch->oum_tx = old_tx;
            ch->oum_segs = had;
        }
    }
    return rc;
}

static void chan_destroy(struct chan *ch)
{
    for (uint32_t i = 0; i < CONS_REPLICAS_MAX; i++)
        leave(&ch->r[i]);
    close_oum(ch);
    if (ch->node != NULL)
        flow_node_destroy(ch->node);
    pthread_mutex_destroy(&ch->lock);
    free(ch->tuple);
    free(ch);
}

/* The message of a join that failed at every replica: refused (the
 * token), full (replica `full` at its client memory limit), or why. */
static void join_failed(const struct chan *ch, const char *path, int why, int refused, int full,
                        char *err, size_t errcap)
{
    if (why == FK_EFULL)
        snprintf(err, errcap,
                 "the replicas of %s refused this client: %u client processes are connected "
                 "(FKC_REPLY_MAX)",
                 path, (unsigned)FKC_REPLY_MAX);
    else if (refused > 0)
        snprintf(err, errcap, "the replicas of %s refused this client: %s", path,
                 fk_strerror(FK_EAUTH));
    else if (full >= 0)
        snprintf(err, errcap,
                 "replica %d refused this client: client memory limit reached (%llu bytes, "
                 "flow_memory in %s)",
                 full, (unsigned long long)ch->conf.flow_memory, path);
    else
        snprintf(err, errcap, "no replica of %s answered (is the cluster running?): %s: %s", path,
                 "joining the first replica", fk_strerror(why));
}

/* One replica's join on a thread of its own (join_all). */
struct join_job {
    struct chan *ch;
    uint32_t i;
    int rc;
    uint64_t took;
    pthread_t th;
    int started;
};

static void *join_main(void *arg)
{
    struct join_job *j = arg;
    uint64_t t0 = fk_now_ns();
    j->rc = join(j->ch, j->i);
    j->took = fk_now_ns() - t0;
    return NULL;
}

/* Joins every replica at once, jobs[i] telling how replica i's went. A
 * join is some seven connections and control calls, each a few round
 * trips (the token's handshake included): one replica after another, a
 * client's open cost three times that, two seconds under the fault
 * suite's 5-10 ms delays. Each join writes only ch->r[i]; the flows it
 * opens belong to its thread until the channel's lock adopts them
 * (ch_adopt, flowkv_open). A thread that cannot start joins here. */
static void join_all(struct chan *ch, struct join_job *jobs)
{
    for (uint32_t i = 0; i < ch->n; i++) {
        jobs[i] = (struct join_job){.ch = ch, .i = i};
        jobs[i].started = pthread_create(&jobs[i].th, NULL, join_main, &jobs[i]) == 0;
        if (!jobs[i].started)
            join_main(&jobs[i]);
    }
    for (uint32_t i = 0; i < ch->n; i++)
        if (jobs[i].started)
            pthread_join(jobs[i].th, NULL);
}

/* A new channel on the cluster of the file at path: its node, joined to
 * every replica that answers (NOPaxos: and its ordered request flow). */
static int chan_create(const char *path, const char *bind, uint64_t timeout_ns, uint32_t slots,
                       struct chan **out, char *err, size_t errcap)
{
    struct chan *ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        return FK_ENOMEM;
    pthread_mutex_init(&ch->lock, NULL);
    snprintf(ch->path, sizeof ch->path, "%s", path);
    snprintf(ch->bind, sizeof ch->bind, "%s", bind ? bind : "");
    ch->tuple = malloc(TUPLE_BUF);
    ch->status_id = random_id();
    int rc = fk_conf_load(path, &ch->conf, err, errcap);
    if (rc == 0 && ch->tuple == NULL)
        rc = FK_ENOMEM;
    ch->n = ch->conf.n_nodes;
    if (rc == 0 && ch->n > CONS_REPLICAS_MAX) {
        snprintf(err, errcap, "too many replicas");
        rc = FK_EINVAL;
    }
    if (rc < 0) {
        chan_destroy(ch);
        return rc;
    }
    ch->nop = ch->conf.protocol == FK_PROTO_NOPAXOS;
    ch->req_segs = chan_segs(slots, 2, FKC_REQ_SEG_TUPLES, FKC_REQ_SEGS_MAX);
    ch->oum_segs = chan_segs(slots, 4, FKC_OUM_SEG_TUPLES, FKC_OUM_SEGS_MAX);
    ch->reply_segs = chan_segs(slots, 3, FKC_REPLY_SEG_TUPLES, FKC_REPLY_SEGS_MAX);
    char ip[64];
    if (bind != NULL)
        snprintf(ip, sizeof(ip), "%s", bind);
    else
        local_ip(ch->conf.nodes[0].ip, ip, sizeof(ip));
    struct flow_node_config nc;
    flow_node_config_default(&nc);
    nc.fabric.host = ip;
    nc.fabric.token = ch->conf.token; /* replicas refuse a client without it */
    nc.fabric.backend = ch->conf.nodes[0].fabric == FK_FABRIC_VERBS ? FAB_BACKEND_VERBS
                        : ch->conf.nodes[0].fabric == FK_FABRIC_TCP ? FAB_BACKEND_TCP
                                                                    : FAB_BACKEND_AUTO;
    rc = flow_node_create(&nc, &ch->node);
    if (rc < 0) {
        snprintf(err, errcap, "cannot create a flow node on %s: %s", ip, fk_strerror(rc));
        chan_destroy(ch);
        return rc;
    }
    for (uint32_t i = 0; i < ch->n; i++)
        flow_node_add_peer(ch->node, ch->conf.nodes[i].address);
    uint32_t joined = 0, refused = 0;
    int why = 0, full = -1; /* the first replica's error, and one at its memory limit */
    /* Rounds over the replicas until one joins. Another round only while
     * some replica took long to fail (a lost handshake packet: TCP waits a
     * second for it, so under 5% loss all three could fail once), and only
     * within the handle's timeout; a cluster that refuses at once (down,
     * wrong address, full) fails at once. Bounded by the deadline. */
    uint64_t deadline = fk_now_ns() + timeout_ns;
    for (int slow = 1; joined == 0 && refused == 0 && slow && fk_now_ns() < deadline;) {
        slow = 0;
        struct join_job jobs[CONS_REPLICAS_MAX];
        join_all(ch, jobs);
        for (uint32_t i = 0; i < ch->n; i++) {
            int jr = jobs[i].rc;
            if (jr < 0)
                fk_debug("client", "replica %u: join failed after %llu ms: %s", i,
                         (unsigned long long)(jobs[i].took / FK_NSEC_PER_MSEC), fk_strerror(jr));
            if (jr == 0)
                joined++;
            else
                ch->r[i].retry_at = fk_now_ns() + REJOIN_NS;
            refused += jr == FK_EAUTH;
            if (jr == FK_ENOMEM && full < 0)
                full = (int)i;
            slow |= jr < 0 && jobs[i].took >= OPEN_NS / 4;
            if (jr < 0 && why == 0)
                why = jr;
        }
    }
    if (joined == 0) {
        join_failed(ch, path, why, (int)refused, full, err, errcap);
        rc = refused > 0       ? FK_EAUTH
             : full >= 0       ? FK_ENOMEM
             : why == FK_EFULL ? FK_EFULL
                               : FK_EUNREACHABLE;
        chan_destroy(ch);
        return rc;
    }
    rc = ch->nop ? open_oum(ch) : 0;
    if (rc < 0) {
        if (rc == FK_ENOMEM)
            join_failed(ch, path, rc, 0, 0, err, errcap);
        else
            snprintf(err, errcap, "no replica of %s answered (is the cluster running?): %s: %s",
                     path, "opening the ordered request flow", fk_strerror(rc));
        chan_destroy(ch);
        return rc == FK_ENOMEM ? rc : FK_EUNREACHABLE;
    }
    *out = ch;
    return 0;
}

/* Unlinks ch from the process's channels (under chans_lock) and destroys
 * it: its last handle closed, or its first failed to register. */
static void chan_drop(struct chan *ch)
{
    for (struct chan **p = &chans; *p != NULL; p = &(*p)->next)
        if (*p == ch) {
            *p = ch->next;
            break;
        }
    chan_destroy(ch);
}

/* Takes a free handle index in ch (under its lock). */
static int chan_register(struct chan *ch, flowkv *kv)
{
    for (uint32_t h = 0; h < FLOWKV_HANDLES_MAX; h++) {
        if (ch->handles[h] != NULL)
            continue;
        ch->handles[h] = kv;
        kv->hid = h;
        if (h >= ch->nhandles)
            ch->nhandles = h + 1;
        ch->live++;
        return 0;
    }
    return FK_EFULL;
}

/* A child of fork() has no flow node threads: it starts without channels
 * (the parent's stay the parent's). */
static void chans_forget(void)
{
    chans = NULL;
    pthread_mutex_init(&chans_lock, NULL);
}

static void chans_init(void)
{
    pthread_atfork(NULL, NULL, chans_forget);
}

int flowkv_open(const char *path, const struct flowkv_opts *opts, flowkv **out, char *err,
                size_t errcap)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    char dummy[8];
    if (err == NULL) {
        err = dummy;
        errcap = sizeof(dummy);
    }
    struct flowkv_opts o = opts ? *opts : (struct flowkv_opts){0};
    if (path == NULL || out == NULL || o.pipeline > FLOWKV_PIPELINE_MAX) {
        snprintf(err, errcap, "bad arguments");
        return FK_EINVAL;
    }
    pthread_once(&once, chans_init);
    flowkv *kv = calloc(1, sizeof(*kv));
    if (kv == NULL)
        return FK_ENOMEM;
    kv->timeout_ns = o.timeout_ns ? o.timeout_ns : DEFAULT_TIMEOUT;
    kv->pipeline = o.pipeline ? o.pipeline : 1;
    kv->slots = calloc(kv->pipeline, sizeof(*kv->slots));
    if (kv->slots == NULL) {
        snprintf(err, errcap, "out of memory");
        free(kv);
        return FK_ENOMEM;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&kv->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&chans_lock);
    struct chan *ch = NULL;
    for (struct chan *c = o.own_channel ? NULL : chans; c != NULL && ch == NULL; c = c->next)
        if (c->refs > 0 && strcmp(c->path, path) == 0 && strcmp(c->bind, o.bind ? o.bind : "") == 0)
            ch = c;
    int rc = 0;
    if (ch == NULL) {
        rc = chan_create(path, o.bind, kv->timeout_ns, kv->pipeline, &ch, err, errcap);
        if (rc == 0 && !o.own_channel) {
            ch->next = chans;
            chans = ch;
        }
    }
    if (rc == 0) {
        ch_lock(ch);
        rc = chan_register(ch, kv);
        if (rc < 0) {
            snprintf(err, errcap, "%u handles on %s in this process already (FLOWKV_HANDLES_MAX)",
                     (unsigned)FLOWKV_HANDLES_MAX, path);
        } else {
            uint32_t slots = ch->slots + kv->pipeline;
            rc = chan_grow(
                ch,
                grown(ch->req_segs, chan_segs(slots, 2, FKC_REQ_SEG_TUPLES, FKC_REQ_SEGS_MAX),
                      FKC_REQ_SEGS_MAX),
                grown(ch->reply_segs, chan_segs(slots, 3, FKC_REPLY_SEG_TUPLES, FKC_REPLY_SEGS_MAX),
                      FKC_REPLY_SEGS_MAX),
                grown(ch->oum_segs, chan_segs(slots, 4, FKC_OUM_SEG_TUPLES, FKC_OUM_SEGS_MAX),
                      FKC_OUM_SEGS_MAX));
            if (rc == 0) {
                ch->slots = slots;
            } else {
                ch->handles[kv->hid] = NULL;
                ch->live--;
                if (rc == FK_ENOMEM)
                    join_failed(ch, path, rc, 0, 0, err, errcap);
                else
                    snprintf(err, errcap, "growing the request rings to the replicas of %s: %s",
                             path, fk_strerror(rc));
            }
        }
        ch_unlock(ch);
        if (rc < 0) {
            if (ch->refs == 0)
                chan_drop(ch);
        } else {
            ch->refs++;
            kv->ch = ch;
        }
    }
    pthread_mutex_unlock(&chans_lock);
    if (rc < 0) {
        pthread_cond_destroy(&kv->cv);
        free(kv->slots);
        free(kv);
        return rc;
    }
    for (uint32_t s = 0; s < kv->pipeline; s++)
        new_session(&kv->slots[s], kv->hid, s);
    *out = kv;
    return 0;
}

void flowkv_close(flowkv *kv)
{
    if (kv == NULL)
        return;
    struct chan *ch = kv->ch;
    pthread_mutex_lock(&chans_lock);
    ch_lock(ch);
    ch->handles[kv->hid] = NULL; /* replies to its requests are dropped from now on */
    ch->live--;
    ch->slots -= kv->pipeline; /* its rings stay as large as they grew */
    while (ch->nhandles > 0 && ch->handles[ch->nhandles - 1] == NULL)
        ch->nhandles--;
    ch_unlock(ch);
    if (--ch->refs == 0)
        chan_drop(ch);
    pthread_mutex_unlock(&chans_lock);
    for (uint32_t i = 0; kv->slots != NULL && i < kv->pipeline; i++) {
        free(kv->slots[i].obuf);
        free(kv->slots[i].res.data);
    }
    pthread_cond_destroy(&kv->cv);
    free(kv->slots);
    free(kv);
}

const char *flowkv_version(void)
{
    return FK_VERSION;
}

uint32_t flowkv_replicas(const flowkv *kv)
{
    return kv->ch->n;
}

uint32_t flowkv_inflight(const flowkv *kv)
{
    return kv->inflight;
}

/* ---- sending ------------------------------------------------------------------ */

/* Multi-Paxos: replica i went away (its reply flow ended, or a send to it
 * failed), so the requests last sent to it get no answer from it: they go
 * again at the next timer tick (to the next replica, send_mpx) instead of
 * at their resend timers (RESEND_NS at least). */
static void resend_from(struct chan *ch, uint32_t i)
{
    uint64_t now = fk_now_ns();
    for (uint32_t h = 0; !ch->nop && h < ch->nhandles; h++) {
        flowkv *kv = ch->handles[h];
        for (uint32_t k = 0; kv != NULL && k < kv->pipeline; k++) {
            struct slot *s = &kv->slots[k];
            if (s->busy && !s->done && s->tries > 0 && s->sent_to == i && s->resend_at > now)
                s->resend_at = now;
        }
    }
}

/* A send to replica i failed: the connection is gone, most often because
 * the replica restarted while this channel only ever sent to the leader
 * (a follower's restart leaves no trace here: its reply flow's target
 * stays), so the first request after the leader changed found it dead.
 * It is joined again at the next timer tick, once it answers a probe
 * (rejoin_due), not a second later: a rolling restart's clients waited
 * out that second after the leader's stop, every follower having
 * restarted before it. What it held goes again at once. */
static void went_away(struct chan *ch, uint32_t i)
{
    leave(&ch->r[i]);
    ch->r[i].retry_at = ch->r[i].left_at = fk_now_ns();
    resend_from(ch, i);
}

/* Multi-Paxos: to the believed leader's kv.req flow, moving on to the next
 * replica after two unanswered tries. A request ring that stays full for
 * PUSH_NS (a leader stalled on its disk's writeback, or requests of large
 * values: a pipeline of 64 YCSB default records is 200 fragments) is
 * waited out: the request goes again at its resend, and the requests
 * behind it in this burst wait for theirs instead of each blocking for
 * PUSH_NS. Taking a full ring for a departed replica sent the whole
 * pipeline to followers and back (a million-record load of default
 * records crawled at a few hundred operations a second). */
static void send_mpx(struct chan *ch, struct slot *s)
{
    if (s->tries > 0 && s->tries % 2 == 0)
        ch->leader = (ch->leader + 1) % ch->n;
    uint64_t now = fk_now_ns();
    for (uint32_t k = 0; k < ch->n; k++) {
        uint32_t i = (ch->leader + k) % ch->n;
        struct replica *r = &ch->r[i];
        if (r->req == NULL)
            continue;
        if (r->full_until > now)
            return;
        /* Turning to another replica (a hint, a rotation): one that
         * restarted since this channel last wrote to it is seen now, not
         * after a write that TCP still takes and the resend timer. */
        if (i != ch->last_to && flow_source_check(r->req) < 0) {
            went_away(ch, i);
            continue;
        }
        ch->tuple[0] = FKC_OP;
        int len = mpx_encode_request(ch->tuple + 1, MPX_REQ_MAX, &s->op);
        if (len < 0)
            return;
        int rc = flow_msg_send(&r->tx, 0, s->client_id, r->idx, ch->tuple, (size_t)len + 1);
        if (rc == 0) {
            ch->leader = ch->last_to = i;
            s->sent_to = i;
            return;
        }
        if (rc == FK_ETIMEDOUT) {
            r->full_until = now + RESEND_NS / 2;
            return;
        }
        went_away(ch, i);
    }
}

/* NOPaxos: one message on the ordered multicast, naming our reply target
 * at every replica (fkc_proto.h). */
static void send_nop(struct chan *ch, struct slot *s)
{
    struct fkc_oum h = {.client_id = s->client_id};
    for (uint32_t i = 0; i < CONS_REPLICAS_MAX; i++)
        h.reply_to[i] = i < ch->n && ch->r[i].t != NULL ? ch->r[i].idx : FKC_NO_TARGET;
    struct cons_wbuf w;
    cons_wbuf_init(&w, ch->tuple + sizeof(h), FKC_OUM_MSG_MAX - sizeof(h));
    cons_wire_put_op(&w, &s->op);
    h.len = (uint32_t)w.len;
    memcpy(ch->tuple, &h, sizeof(h));
    if (ch->oum == NULL && open_oum(ch) < 0)
        return;
    int rc = flow_msg_send(&ch->oum_tx, -1, s->client_id, 0, ch->tuple, sizeof(h) + w.len);
    /* A slow sequencer (FK_ETIMEDOUT: its fetch-and-add stays posted) or a
     * full ring is waited out by the resend; anything else reopens the
     * flow on the next try. Reopening on every timeout made a lossy
     * network unusable: each reopen is a dozen connections and calls. */
    if (rc < 0 && rc != FK_ETIMEDOUT)
        close_oum(ch);
}

/* Sends what submissions and resends staged. kv.oum and kv.req are
 * bandwidth-mode flows (DFI section 5.3): the requests of a burst share
 * segments, so a pipelined burst costs one fetch-and-add at the sequencer
 * and one write per replica (NOPaxos), or one write to the leader
 * (Multi-Paxos), instead of one each. */
/* A request was staged (pushed, not yet flushed). */
static void staged(struct chan *ch)
{
    if (!ch->dirty)
        ch->dirty_at = fk_now_ns();
    ch->dirty = 1;
}

static void flush_requests(struct chan *ch)
{
    ch->dirty = 0;
    if (ch->oum != NULL) {
        int rc = flow_flush(ch->oum);
        if (rc < 0 && rc != FK_ETIMEDOUT) /* as in send_nop */
            close_oum(ch);
    }
    for (uint32_t i = 0; i < ch->n; i++) {
        struct replica *r = &ch->r[i];
        if (r->req != NULL && flow_flush(r->req) < 0)
            went_away(ch, i);
    }
}

static uint64_t resend_after(const struct chan *ch)
{
    uint64_t rto = ch->srtt + 4 * ch->rttvar;
    return rto < RESEND_NS ? RESEND_NS : rto > RESEND_MAX_NS ? RESEND_MAX_NS : rto;
}

/* A request answered at its first send took `ns`: RFC 6298's estimator
 * (gains 1/8 and 1/4). */
static void rtt_sample(struct chan *ch, uint64_t ns)
{
    if (ch->srtt == 0) {
        ch->srtt = ns;
        ch->rttvar = ns / 2;
        return;
    }
    uint64_t dev = ns > ch->srtt ? ns - ch->srtt : ch->srtt - ns;
    ch->rttvar = ch->rttvar - ch->rttvar / 4 + dev / 4;
    ch->srtt = ch->srtt - ch->srtt / 8 + ns / 8;
}

static void send_slot(struct chan *ch, struct slot *s)
{
    uint64_t now = fk_now_ns();
    if (s->tries == 0)
        s->sent_at = now;
    s->resend_at = now + resend_after(ch);
    if (ch->nop)
        nop_quorum_reset(&s->q, ch->n, s->client_id, s->req_no);
    if (ch->nop)
        send_nop(ch, s);
    else
        send_mpx(ch, s);
    s->tries++;
}

static int check_op(const struct flowkv_op *op)
{
    if (op != NULL && op->type == FLOWKV_CONFIG)
        return op->klen == 0 && op->vlen == CONS_CONFIG_BYTES && op->val != NULL && !op->elen &&
                       !op->flags
                   ? 0
                   : FK_EINVAL;
    if (op == NULL || op->type < FLOWKV_GET || op->type > FLOWKV_SCAN || op->key == NULL)
        return FK_EINVAL;
    if (op->klen > FLOWKV_KEY_MAX)
        return FK_EKEYSIZE;
    if (op->vlen > FLOWKV_VAL_MAX || op->elen > FLOWKV_VAL_MAX)
        return FK_EVALSIZE;
    if (op->type != FLOWKV_SCAN && op->klen == 0)
        return FK_EINVAL;
    if ((op->vlen && op->val == NULL) || (op->elen && op->exp == NULL))
        return FK_EINVAL;
    if (op->type == FLOWKV_SCAN && (op->count == 0 || op->count > FLOWKV_SCAN_MAX))
        return FK_EINVAL;
    if (op->type == FLOWKV_SCAN && op->endlen > FLOWKV_KEY_MAX)
        return FK_EKEYSIZE;
    if ((op->type == FLOWKV_SCAN && op->endlen && op->end == NULL) ||
        (op->flags & ~FLOWKV_SCAN_AFTER) || (op->type != FLOWKV_SCAN && op->flags))
        return FK_EINVAL;
    return 0;
}

/* s->op := op, under the slot's session. Bytes that do not fit inline
 * go to the slot's own buffer, key, value and expected one after another
 * (cons_op_init), kept for resends. */
static int build_op(flowkv *kv, struct slot *s, const struct flowkv_op *op)
{
    _Static_assert(FLOWKV_SCAN_AFTER == CONS_SCAN_AFTER, "scan flags line up");
    size_t vlen = op->type == FLOWKV_PUT || op->type == FLOWKV_CAS || op->type == FLOWKV_CONFIG
                      ? op->vlen
                      : 0;
    /* The end key of a scan travels as exp (cons.h). */
    const void *exp = op->type == FLOWKV_CAS ? op->exp : op->end;
    size_t elen = op->type == FLOWKV_CAS ? op->elen : op->type == FLOWKV_SCAN ? op->endlen : 0;
    size_t n = op->klen + vlen + elen;
    if (kv->ch->nop && n > NOP_OP_MAX) {
        snprintf(kv->detail, sizeof kv->detail,
                 "nopaxos carries at most %u bytes of key and values in one request (%zu here)",
                 (unsigned)NOP_OP_MAX, n);
        return FK_EVALSIZE;
    }
    const uint8_t *k = op->key, *v = op->val, *e = exp;
    if (n > CONS_OP_INLINE) {
        if (s->obuf_cap < n) {
            free(s->obuf);
            s->obuf_cap = 0;
            s->obuf = malloc(n);
            if (s->obuf == NULL)
                return FK_ENOMEM;
            s->obuf_cap = n;
        }
        memcpy(s->obuf, op->key, op->klen);
        if (vlen)
            memcpy(s->obuf + op->klen, op->val, vlen);
        if (elen)
            memcpy(s->obuf + op->klen + vlen, exp, elen);
        k = s->obuf;
        v = k + op->klen;
        e = v + vlen;
    }
    cons_op_init(&s->op, op->type, k, (uint32_t)op->klen, v, (uint32_t)vlen, e, (uint32_t)elen);
    s->op.client_id = s->client_id;
    s->op.req_no = ++s->req_no;
    s->op.scan_limit = (uint8_t)op->count;
    s->op.scan_flags = (uint8_t)op->flags;
    return 0;
}

/* Under the channel's lock. */
static int submit(flowkv *kv, const struct flowkv_op *op)
{
    int rc = check_op(op);
    if (rc < 0)
        return rc;
    struct slot *s = NULL;
    for (uint32_t i = 0; i < kv->pipeline && s == NULL; i++)
        if (!kv->slots[i].busy)
            s = &kv->slots[i];
    if (s == NULL)
        return FK_EBUSY;
    _Static_assert((int)FLOWKV_GET == (int)CONS_OP_GET && (int)FLOWKV_SCAN == (int)CONS_OP_SCAN,
                   "op types line up");
    rc = build_op(kv, s, op);
    if (rc < 0)
        return rc;
    s->busy = 1;
    s->done = 0;
    s->tag = op->tag;
    s->tries = 0;
    s->deadline = fk_now_ns() + kv->timeout_ns;
    kv->inflight++;
    send_slot(kv->ch, s);
    staged(kv->ch);
    return 0;
}

/* Staged, not flushed: the flush is the poll's (pump), so a burst of
 * submissions shares segments. */
int flowkv_submit(flowkv *kv, const struct flowkv_op *op)
{
    if (kv == NULL)
        return FK_EINVAL;
    ch_lock(kv->ch);
    int rc = submit(kv, op);
    ch_unlock(kv->ch);
    return rc;
}

/* ---- receiving -------------------------------------------------------------------- */

static struct slot *slot_of(struct chan *ch, uint64_t client_id, flowkv **owner)
{
    uint32_t i = (uint32_t)(client_id & (FLOWKV_PIPELINE_MAX - 1));
    uint32_t h = (uint32_t)(client_id >> SLOT_BITS) & (FLOWKV_HANDLES_MAX - 1);
    flowkv *kv = h < ch->nhandles ? ch->handles[h] : NULL;
    if (kv == NULL || i >= kv->pipeline)
        return NULL;
    struct slot *s = &kv->slots[i];
    *owner = kv;
    return s->busy && !s->done && s->client_id == client_id ? s : NULL;
}

/* Wakes the thread of a handle asleep waiting for its completions. */
static void wake(flowkv *kv)
{
    if (kv->wake_to != NULL)
        kv = kv->wake_to;
    if (kv->sleeping)
        pthread_cond_signal(&kv->cv);
}

/* The slot's result: rep's fields and its len bytes at data. The buffer
 * grows to the largest result the slot has had (a GET of a 1 MiB value
 * once), and is kept: no allocation per call at a steady size. On no
 * memory the result is that error. */
static void finish_data(struct slot *s, const struct cons_reply *rep, const uint8_t *data)
{
    s->done = 1;
    s->res.client_id = rep->client_id;
    s->res.req_no = rep->req_no;
    s->res.status = rep->status;
    if (rep->status == FK_EAGAIN && s->op.type == CONS_OP_CONFIG && s->req_no == rep->req_no)
        s->req_no--; /* never logged: the number goes again (cons.h, CONS_OP_CONFIG) */
    s->res.len = 0;
    if (rep->len > s->res.cap) {
        uint32_t cap = rep->len < 16384 ? 16384 : rep->len;
        uint8_t *p = realloc(s->res.data, cap);
        if (p == NULL) {
            s->res.status = FK_ENOMEM;
            return;
        }
        s->res.data = p;
        s->res.cap = cap;
    }
    if (rep->len)
        memcpy(s->res.data, data, rep->len);
    s->res.len = rep->len;
}

static void finish(struct slot *s, const struct cons_reply *rep)
{
    finish_data(s, rep, rep->data);
}

static void on_op_reply(struct chan *ch, uint32_t from, uint64_t dst, const uint8_t *buf,
                        size_t len)
{
    flowkv *owner = NULL;
    struct slot *s = slot_of(ch, dst, &owner);
    if (s == NULL)
        return; /* a late answer to a finished request, or to a closed handle */
    if (ch->nop) {
        const struct cons_reply *res;
        if (nop_quorum_add(&s->q, from, buf, len, &res) == 1) {
            if (s->tries == 1)
                rtt_sample(ch, fk_now_ns() - s->sent_at);
            finish(s, res);
            wake(owner);
        }
        return;
    }
    struct cons_reply rep;
    const uint8_t *data;
    uint32_t hint;
    if (mpx_decode_reply(buf, len, &rep, &data, &hint) < 0 || rep.client_id != s->client_id ||
        rep.req_no != s->req_no)
        return;
    if (rep.status == FK_ENOTLEADER) {
        uint32_t to = hint < ch->n && hint != from ? hint : (from + 1) % ch->n;
        ch->leader = to;
        s->tries = 1; /* give the hinted leader two tries */
        if (ch->r[to].req == NULL) {
            /* A leader this channel has not joined (its join lost a
             * handshake, or it went away): the request would go on to the
             * next replica and come straight back with the same hint,
             * thousands of round trips a second. The leader is joined at
             * the next timer tick (at most every REJOIN_NS / 10 while the
             * hints keep naming it) and the request goes at its resend. */
            uint64_t soon = fk_now_ns() + REJOIN_NS / 10;
            if (ch->r[to].retry_at > soon)
                ch->r[to].retry_at = soon;
            return;
        }
        send_slot(ch, s);
        staged(ch);
        return;
    }
    ch->leader = from;
    if (s->tries == 1)
        rtt_sample(ch, fk_now_ns() - s->sent_at);
    finish_data(s, &rep, data);
    wake(owner);
}

/* The reply the waiting backup request asked for (same op, nonce and
 * chunk), copied into its buffer; any other (a late answer to a resent
 * request) is ignored. */
static void on_snap_reply(struct chan *ch, const uint8_t *buf, size_t len)
{
    struct fkc_snap_reply rep;
    memcpy(&rep, buf, sizeof(rep));
    size_t n = len - sizeof(rep);
    if (!ch->snap.want || ch->snap.seen || rep.op != ch->snap.q.op ||
        rep.nonce != ch->snap.q.nonce || rep.seq != ch->snap.q.seq || n > ch->snap.cap)
        return;
    ch->snap.rep = rep;
    memcpy(ch->snap.buf, buf + sizeof(rep), n);
    ch->snap.len = n;
    ch->snap.seen = 1;
}

static void pump_replica(struct chan *ch, uint32_t i)
{
    struct replica *r = &ch->r[i];
    struct flow_msg m;
    for (int k = 0; r->rx != NULL && k < 64; k++) {
        int rc = flow_msg_recv(r->rx, &m, 0);
        if (rc == FK_ETIMEDOUT)
            return;
        if (rc < 0) { /* the replica closed its reply source: it restarted */
            fk_debug("client", "replica %u: reply flow: %s", i, fk_strerror(rc));
            went_away(ch, i);
            r->retry_at += REJOIN_NS / 10; /* it is not listening yet */
            return;
        }
        if (m.len < 1)
            continue;
        if (m.buf[0] == FKC_OP)
            on_op_reply(ch, i, m.dst, m.buf + 1, m.len - 1);
        else if (m.buf[0] == FKC_STATUS && m.len == 1 + sizeof(struct fkc_status)) {
            memcpy(&r->status, m.buf + 1, sizeof(r->status));
            r->status_seen = 1;
        } else if (m.buf[0] == FKC_SNAP && m.len >= 1 + sizeof(struct fkc_snap_reply)) {
            on_snap_reply(ch, m.buf + 1, m.len - 1);
        }
    }
}

/* Resends what waited too long and fails what passed its deadline, for
 * every handle of the channel (their threads may be asleep). */
static void timers(struct chan *ch, uint64_t now)
{
    rejoin_due(ch, now);
    for (uint32_t h = 0; h < ch->nhandles; h++) {
        flowkv *kv = ch->handles[h];
        for (uint32_t i = 0; kv != NULL && i < kv->pipeline; i++) {
            struct slot *s = &kv->slots[i];
            if (!s->busy || s->done)
                continue;
            if (now >= s->deadline) {
                struct cons_reply rep = {
                    .client_id = s->client_id, .req_no = s->req_no, .status = FK_ETIMEDOUT};
                finish(s, &rep);
                wake(kv);
                /* The slot's next request opens a new session: if this one
                 * was never applied and was its session's first, every
                 * later one would be refused as expired (cons_apply_once),
                 * and a handle whose first request timed out, as under the
                 * fault suite's 5% loss, never served again on that slot. */
                new_session(s, kv->hid, i);
            } else if (now >= s->resend_at) {
                send_slot(ch, s);
                staged(ch);
            }
        }
    }
}

static int collect(flowkv *kv, uint32_t handle, struct flowkv_done *done, int max)
{
    int n = 0;
    for (uint32_t i = 0; done != NULL && i < kv->pipeline && n < max; i++) {
        struct slot *s = &kv->slots[i];
        if (!s->busy || !s->done)
            continue;
        done[n++] = (struct flowkv_done){.tag = s->tag,
                                         .status = s->res.status,
                                         .len = s->res.len,
                                         .data = s->res.data,
                                         .handle = handle};
        s->busy = 0;
        kv->inflight--;
    }
    return n;
}

/* A set's completions (flowkv_poll_set), from the handle after the one
 * the last call began with: a busy handle does not starve the others. */
struct set {
    flowkv *const *kvs;
    uint32_t n, *next;
};

static int collect_set(const struct set *st, struct flowkv_done *done, int max)
{
    int n = 0;
    uint32_t first = *st->next % st->n;
    for (uint32_t k = 0; k < st->n && n < max; k++) {
        uint32_t h = (first + k) % st->n;
        n += collect(st->kvs[h], h, done == NULL ? NULL : done + n, max - n);
    }
    *st->next = first + 1;
    return n;
}

/* Before this thread blocks or returns: staged requests go now, unless a
 * thread that takes the lock to wait for completions comes next (it
 * flushes in turn, with whatever was staged meanwhile) and the oldest
 * staged request is younger than FLUSH_HOLD_NS: with hundreds of threads
 * one is nearly always waiting for the lock, and requests held for the
 * next one waited for a lull (YCSB-B at 1,024 threads: 1.1k ops/s, p95
 * 1.4 s). */
static void flush_unless_followed(struct chan *ch)
{
    if (ch->dirty && (__atomic_load_n(&ch->wanting, __ATOMIC_RELAXED) == 0 ||
                      fk_now_ns() - ch->dirty_at >= FLUSH_HOLD_NS))
        flush_requests(ch);
}

/* Leaving the poller's role: the thread that slept last takes it over. */
static void hand_over(struct chan *ch)
{
    ch->polling = 0;
    if (ch->sleepers != NULL)
        pthread_cond_signal(&ch->sleepers->cv);
}

/* Sleeps on the handle's condition variable until woken or `until`
 * (CLOCK_MONOTONIC, as fk_now_ns), listed among the channel's sleepers. */
static void sleep_until(struct chan *ch, flowkv *kv, uint64_t until)
{
    struct timespec ts = {.tv_sec = (time_t)(until / FK_NSEC_PER_SEC),
                          .tv_nsec = (long)(until % FK_NSEC_PER_SEC)};
    kv->sleeping = 1;
    kv->snext = ch->sleepers;
    kv->sprev = NULL;
    if (ch->sleepers != NULL)
        ch->sleepers->sprev = kv;
    ch->sleepers = kv;
    pthread_cond_timedwait(&kv->cv, &ch->lock, &ts);
    if (kv->sprev != NULL)
        kv->sprev->snext = kv->snext;
    else
        ch->sleepers = kv->snext;
    if (kv->snext != NULL)
        kv->snext->sprev = kv->sprev;
    kv->sleeping = 0;
    ch_adopt(ch);
}

/* Under the channel's lock: kv's completions, up to max, waiting up to
 * deadline (done NULL: one round of at most a millisecond, for status).
 * As the poller, this thread reads every reply flow, dispatches, and runs
 * the timers of every handle; else it sleeps until the poller wakes it or
 * hands it the role. Waits are sliced (a quarter of RESEND_NS) for
 * resends and deadlines. NOPaxos on a channel of one handle: completions
 * go back before the staged requests are flushed, every other call. Its
 * flush waits for the sequencer's fetch-and-add (150-190 us on a loaded
 * 2-CPU machine), which held back every completion behind it; this way
 * the caller's next submissions join the same segment. (Multi-Paxos'
 * flush does not wait, and deferring it there cost open-loop throughput:
 * 96k ops/s no longer sustained in 3 runs of 3.) With several handles,
 * the threads' submissions share segments instead (flush_unless_followed). */
static int wait_set(const struct set *st, struct flowkv_done *done, int max, uint64_t deadline)
{
    flowkv *kv = st->kvs[0]; /* sleeps for the set, and keeps its flush turn */
    struct chan *ch = kv->ch;
    for (int round = 0;; round++) {
        int n = collect_set(st, done, max);
        uint64_t now = fk_now_ns();
        uint64_t slice = done != NULL ? RESEND_NS / 4 : FK_NSEC_PER_MSEC;
        uint64_t until = deadline < now + slice ? deadline : now + slice;
        int more = n == 0 && now < deadline && (done != NULL || round == 0);
        if (more && ch->polling) {
            /* Woken by the poller (a completion, or the role handed
             * over), not by a slice: with a thousand threads asleep, a
             * wake-up each per slice was most of the client's CPU. The
             * poller runs every handle's timers; SLEEP_MAX_NS is a
             * safety net only. */
            flush_unless_followed(ch);
            uint64_t far = done != NULL ? now + SLEEP_MAX_NS : until;
            sleep_until(ch, kv, deadline < far ? deadline : far);
            continue;
        }
        int mine = n == 0 && !ch->polling;
        if (mine) {
            ch->polling = 1;
            uint64_t bell = flow_node_doorbell(ch->node);
            for (uint32_t i = 0; i < ch->n; i++)
                pump_replica(ch, i);
            now = fk_now_ns();
            if (now >= ch->timers_at) {
                timers(ch, now);
                ch->timers_at = now + TIMERS_NS;
            }
            n = collect_set(st, done, max);
            if (n == 0 && more && now < until) {
                if (ch->dirty) /* the poller sleeps on the network: nobody else would flush */
                    flush_requests(ch);
                ch_unlock(ch);
                flow_node_wait(ch->node, bell, until - now);
                ch_lock_wanting(ch);
                ch->polling = 0;
                continue;
            }
        }
        if (mine || !ch->polling)
            hand_over(ch); /* this thread polled (or none does): another polls on */
        if (n > 0 && ch->nop && ch->live == 1 && !kv->deferred) {
            kv->deferred = 1;
            return n;
        }
        kv->deferred = 0;
        flush_unless_followed(ch);
        return n;
    }
}

static int wait_done(flowkv *kv, struct flowkv_done *done, int max, uint64_t deadline)
{
    uint32_t next = 0;
    struct set st = {.kvs = &kv, .n = 1, .next = &next};
    return wait_set(&st, done, max, deadline);
}

static int pump(flowkv *kv, struct flowkv_done *done, int max, uint64_t deadline)
{
    ch_lock_wanting(kv->ch);
    int n = wait_done(kv, done, max, deadline);
    ch_unlock(kv->ch);
    return n;
}

int flowkv_poll(flowkv *kv, struct flowkv_done *done, int max, uint64_t timeout_ns)
{
    if (kv == NULL || done == NULL || max < 1)
        return FK_EINVAL;
    return pump(kv, done, max, fk_now_ns() + timeout_ns);
}

/* One thread, many handles (an event loop serving many connections, or
 * YCSB's flowkv.handles): the set's thread sleeps on the first handle's
 * condition variable, and the others' completions wake it there
 * (wake_to) for the length of the call. */
int flowkv_poll_set(flowkv *const *kvs, uint32_t n, struct flowkv_done *done, int max,
                    uint64_t timeout_ns)
{
    if (kvs == NULL || n == 0 || done == NULL || max < 1)
        return FK_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (kvs[i] == NULL || kvs[i]->ch != kvs[0]->ch)
            return FK_EINVAL;
    struct chan *ch = kvs[0]->ch;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    ch_lock_wanting(ch);
    for (uint32_t i = 1; i < n; i++) {
        if (kvs[i]->wake_to != NULL || kvs[i] == kvs[0]) { /* in another set, or twice */
            for (uint32_t j = 1; j < i; j++)
                kvs[j]->wake_to = NULL;
            ch_unlock(ch);
            return FK_EINVAL;
        }
        kvs[i]->wake_to = kvs[0];
    }
    struct set st = {.kvs = kvs, .n = n, .next = &kvs[0]->set_next};
    int got = wait_set(&st, done, max, deadline);
    for (uint32_t i = 1; i < n; i++)
        kvs[i]->wake_to = NULL;
    ch_unlock(ch);
    return got;
}

/* ---- synchronous calls ------------------------------------------------------------------ */

static int call(flowkv *kv, const struct flowkv_op *op, struct flowkv_done *d)
{
    if (kv == NULL)
        return FK_EINVAL;
    if (kv->inflight > 0)
        return FK_EBUSY; /* synchronous calls need an idle handle */
    kv->detail[0] = '\0';
    ch_lock_wanting(kv->ch);
    int rc = submit(kv, op);
    while (rc == 0 && wait_done(kv, d, 1, fk_now_ns() + kv->timeout_ns + RESEND_NS) == 0)
        ;
    ch_unlock(kv->ch);
    if (rc < 0)
        return rc;
    if (d->status < 0 && d->len > 0) /* an error's detail is text (kv_sm.c) */
        snprintf(kv->detail, sizeof kv->detail, "%.*s",
                 (int)(d->len < sizeof kv->detail ? d->len : sizeof kv->detail - 1),
                 (const char *)d->data);
    return d->status;
}

const char *flowkv_error_detail(const flowkv *kv)
{
    return kv ? kv->detail : "";
}

void flowkv__set_detail(flowkv *kv, const char *what)
{
    snprintf(kv->detail, sizeof kv->detail, "%s", what);
}

int flowkv_get(flowkv *kv, const void *key, size_t klen, void *val, size_t cap, size_t *vlen)
{
    struct flowkv_op op = {.type = FLOWKV_GET, .key = key, .klen = klen};
    struct flowkv_done d;
    int rc = call(kv, &op, &d);
    if (rc < 0)
        return rc;
    if (vlen != NULL)
        *vlen = d.len;
    if (d.len > cap)
        return FK_ETOOBIG;
    if (d.len > 0)
        memcpy(val, d.data, d.len);
    return 0;
}

int flowkv_put(flowkv *kv, const void *key, size_t klen, const void *val, size_t vlen)
{
    struct flowkv_op op = {.type = FLOWKV_PUT, .key = key, .klen = klen, .val = val, .vlen = vlen};
    struct flowkv_done d;
    return call(kv, &op, &d);
}

int flowkv_member_change(flowkv *kv, uint32_t epoch, uint64_t members)
{
    uint8_t v[CONS_CONFIG_BYTES];
    struct cons_config c = {.epoch = epoch, .members = members};
    cons_config_put(&c, v);
    static const uint8_t none = 0;
    struct flowkv_op op = {
        .type = FLOWKV_CONFIG, .key = &none, .klen = 0, .val = v, .vlen = sizeof v};
    struct flowkv_done d;
    return call(kv, &op, &d);
}

int flowkv_del(flowkv *kv, const void *key, size_t klen)
{
    struct flowkv_op op = {.type = FLOWKV_DEL, .key = key, .klen = klen};
    struct flowkv_done d;
    return call(kv, &op, &d);
}

int flowkv_cas(flowkv *kv, const void *key, size_t klen, const void *exp, size_t elen,
               const void *val, size_t vlen)
{
    struct flowkv_op op = {.type = FLOWKV_CAS,
                           .key = key,
                           .klen = klen,
                           .val = val,
                           .vlen = vlen,
                           .exp = exp,
                           .elen = elen};
    struct flowkv_done d;
    return call(kv, &op, &d);
}

int flowkv_scan(flowkv *kv, const void *start, size_t slen, uint32_t count,
                struct flowkv_result *res)
{
    static const uint8_t empty[1];
    struct flowkv_op op = {
        .type = FLOWKV_SCAN, .key = slen ? start : empty, .klen = slen, .count = count};
    struct flowkv_done d;
    int rc = call(kv, &op, &d);
    res->status = rc;
    res->len = rc == 0 ? d.len : 0;
    res->data = rc == 0 ? d.data : NULL;
    return rc;
}

/* The pair at data[*off..len) of a scan reply (u16 key length, key, u32
 * value length, value): 1 and *off advanced, 0 at the end, FK_EMALFORMED. */
static int next_pair(const uint8_t *data, uint32_t len, size_t *off, const uint8_t **key,
                     size_t *klen, const uint8_t **val, size_t *vlen)
{
    if (*off >= len)
        return 0;
    struct cons_rbuf r;
    cons_rbuf_init(&r, data + *off, len - *off);
    *klen = cons_r_u16(&r);
    *key = cons_r_bytes(&r, *klen);
    *vlen = cons_r_u32(&r);
    *val = cons_r_bytes(&r, *vlen);
    if (r.err)
        return FK_EMALFORMED;
    *off += r.off;
    return 1;
}

int flowkv_scan_range(flowkv *kv, const void *start, size_t slen, const void *end, size_t elen,
                      uint32_t count, flowkv_visit_fn fn, void *arg)
{
    static const uint8_t empty[1];
    if (fn == NULL || count == 0 || count > FLOWKV_SCAN_COUNT_MAX || (slen && start == NULL) ||
        (elen && end == NULL))
        return FK_EINVAL;
    if (slen > FLOWKV_KEY_MAX || elen > FLOWKV_KEY_MAX)
        return FK_EKEYSIZE;
    uint8_t next[FLOWKV_KEY_MAX];
    struct flowkv_op op = {.type = FLOWKV_SCAN,
                           .key = slen ? start : empty,
                           .klen = slen,
                           .end = elen ? end : NULL,
                           .endlen = elen};
    uint32_t got = 0;
    /* Bounded: every page but the last visits at least one pair. */
    while (got < count) {
        op.count = count - got < FLOWKV_SCAN_MAX ? count - got : FLOWKV_SCAN_MAX;
        struct flowkv_done d;
        int rc = call(kv, &op, &d);
        if (rc < 0)
            return rc;
        size_t off = 0, kl = 0, vl;
        const uint8_t *k = NULL, *v;
        while (got < count && (rc = next_pair(d.data, d.len, &off, &k, &kl, &v, &vl)) == 1) {
            got++;
            rc = fn(arg, k, kl, v, vl);
            if (rc != 0)
                return rc < 0 ? rc : (int)got;
        }
        if (rc < 0)
            return rc;
        if (off == 0)
            break;           /* an empty page: the range is done */
        memcpy(next, k, kl); /* the page's last key: the next page starts after it */
        op.key = next;
        op.klen = kl;
        op.flags = FLOWKV_SCAN_AFTER;
    }
    return (int)got;
}

int flowkv_scan_next(const struct flowkv_result *res, size_t *off, const uint8_t **key,
                     size_t *klen, const uint8_t **val, size_t *vlen)
{
    return next_pair(res->data, res->len, off, key, klen, val, vlen);
}

/* ---- status ------------------------------------------------------------------------------ */

static const char *role_name(uint8_t role)
{
    switch (role) {
    case FKC_ROLE_LEADER:
        return "leader";
    case FKC_ROLE_FOLLOWER:
        return "follower";
    case FKC_ROLE_CANDIDATE:
        return "candidate";
    case FKC_ROLE_RECOVERING:
        return "recovering";
    case FKC_ROLE_VIEW_CHANGE:
        return "view-change";
    }
    return "unknown";
}

int flowkv_status(flowkv *kv, uint32_t id, struct flowkv_replica_status *st, uint64_t timeout_ns)
{
    if (kv == NULL || st == NULL || id >= kv->ch->n)
        return FK_EINVAL;
    memset(st, 0, sizeof(*st));
    st->id = id;
    struct chan *ch = kv->ch;
    struct replica *r = &ch->r[id];
    uint64_t deadline = fk_now_ns() + timeout_ns;
    ch_lock_wanting(ch);
    int rc = r->t == NULL ? join(ch, id) : 0;
    if (rc < 0)
        fk_debug("client", "replica %u: not joined", id);
    r->status_seen = 0;
    uint8_t kind = FKC_STATUS;
    if (rc == 0)
        rc = flow_msg_send(&r->tx, 0, ch->status_id, r->idx, &kind, 1);
    if (rc == 0)
        staged(ch);
    else
        fk_debug("client", "status request to replica %u failed: %s", id, fk_strerror(rc));
    /* Bounded by the deadline: each round waits at most its slice. */
    while (rc == 0 && !r->status_seen && fk_now_ns() < deadline)
        wait_done(kv, NULL, 0, deadline);
    struct fkc_status got = r->status;
    int seen = rc == 0 && r->status_seen;
    ch_unlock(ch);
    if (!seen)
        return 0;
    st->reachable = 1;
    snprintf(st->role, sizeof(st->role), "%s", role_name(got.role));
    snprintf(st->fabric, sizeof(st->fabric), "%.6s", (const char *)got.fabric);
    snprintf(st->protocol, sizeof(st->protocol), "%s",
             got.protocol == CONS_PROTO_MPX ? "multipaxos" : "nopaxos");
    st->term = got.term;
    st->leader = got.leader;
    st->epoch = got.epoch;
    st->members = got.members;
    st->commit = got.commit;
    st->applied = got.applied;
    st->last = got.last;
    st->uptime_ns = got.uptime_ns;
    return 0;
}

/* Resent this often while unanswered: a reply the replica could not push
 * (its push waits SRV_NET_PUSH_NS at most for the client's ring) is lost,
 * and the replica answers a repeated READ with the same bytes. */
#define SNAP_RESEND_NS (250ULL * 1000000ULL)

int flowkv__snap_call(flowkv *kv, uint32_t id, const struct fkc_snap_req *q,
                      struct fkc_snap_reply *rep, uint8_t *buf, size_t cap, size_t *len,
                      uint64_t timeout_ns)
{
    if (kv == NULL || q == NULL || rep == NULL || id >= kv->ch->n)
        return FK_EINVAL;
    struct chan *ch = kv->ch;
    struct replica *r = &ch->r[id];
    uint8_t msg[1 + sizeof(*q)] = {FKC_SNAP};
    memcpy(msg + 1, q, sizeof(*q));
    uint64_t now = fk_now_ns(), deadline = now + timeout_ns, resend = now;
    ch_lock_wanting(ch);
    int rc = r->t == NULL ? join(ch, id) : 0;
    ch->snap.want = 1;
    ch->snap.seen = 0;
    ch->snap.q = *q;
    ch->snap.buf = buf;
    ch->snap.cap = cap;
    /* Bounded by the deadline: each round waits at most its slice. */
    while (rc == 0 && !ch->snap.seen && (now = fk_now_ns()) < deadline) {
        if (now >= resend) {
            rc = flow_msg_send(&r->tx, 0, ch->status_id, r->idx, msg, sizeof(msg));
            if (rc < 0)
                break;
            staged(ch);
            resend = now + SNAP_RESEND_NS;
        }
        wait_done(kv, NULL, 0, resend < deadline ? resend : deadline);
    }
    int seen = ch->snap.seen;
    *rep = ch->snap.rep;
    *len = ch->snap.len;
    ch->snap.want = 0;
    ch_unlock(ch);
    if (rc < 0)
        fk_debug("client", "backup request to replica %u failed: %s", id, fk_strerror(rc));
    return rc < 0 ? rc : seen ? 0 : FK_ETIMEDOUT;
}
