/*
 * fab_verbs.c: the verbs backend's node: device selection, protection
 * domain, memory registration, the listener and the progress thread that
 * answers control messages, the doorbell, counters.
 *
 * Device selection. fab_config.device, else FLOWKV_RDMA_DEVICE, names the
 * device. A node binds an IPv4 address: fab_config.host when it is not a
 * loopback address (the device is then the one that owns it, as rdma_cm
 * resolves it), else the IPv4 address in the chosen device's RoCE GID table
 * (RDMA has no loopback interface; the default "127.0.0.1" of the tcp
 * backend becomes the device's own address, so tests that pass addresses
 * around work unchanged). No device, a missing named device, or a device
 * without an IPv4 GID is FK_ENODEV with an error line naming what exists.
 *
 * Passive side. RDMA WRITE, READ and FETCH_AND_ADD need no CPU at the
 * target. The progress thread only accepts connections (rdma_cm events),
 * runs the control message handler for requests that arrive as SENDs
 * (fab_call) and reports closed connections to the close handler.
 *
 * Doorbell. An RDMA WRITE raises no event at the receiver (only
 * WRITE_WITH_IMM consumes a receive, and a receive per segment would cost
 * a posted buffer and a completion per write, which is what one-sided
 * writes avoid; DFI section 5.3). So the verbs doorbell is the progress
 * thread's event counter plus a clock that advances every 2^20 ns: a
 * waiter polls memory for a bounded time (fab_node_wait returns early so
 * the caller re-checks, see vb_wait), then sleeps at most one tick and
 * re-checks. fab.h's waiting protocol (read the doorbell, check memory,
 * wait) re-checks after every return, so flows/ stays correct; the cost is
 * at most one tick of added latency for a waiter that went to sleep, and
 * at most 1000 wake-ups per second per sleeping thread.
 */
#include "fab_verbs.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The clock part of the doorbell: 2^20 ns, about 1 ms. */
#define VB_TICK_SHIFT 20
/* Receive buffers per passive connection: a fab_call waits for its
 * response, so one request is in flight; the second covers a request that
 * arrives while the first buffer is being reposted. */
#define VB_PEER_RECVS 2
/* The progress thread sweeps the control CQ and the rdma_cm channel this
 * often even without an event, so a lost completion notification delays a
 * control message by at most this much instead of stalling it. */
#define VB_SWEEP_MS 20
/* Passive control CQ: every peer's receives and response sends. */
#define VB_PCQ_ENTRIES 4096

struct vb_mr {
    struct fab_mr base;
    struct ibv_mr *mr;
};

/* One accepted connection (passive side); progress thread only. */
struct vb_peer {
    struct vb_node *node;
    struct rdma_cm_id *id;
    struct ibv_qp *qp;
    uint64_t num; /* peer_id handed to the handlers */
    int established;
    struct fab__auth auth; /* the token handshake (fab_auth.c) */
    struct ibv_mr *mr;
    struct vb_peer *next, *prev;
    uint8_t buf[VB_PEER_RECVS + 1][VB_MSG_BYTES]; /* receives, then the response */
};

/* ---- device selection ------------------------------------------------------------ */

int fab__verbs_select(const char *want, const char *const *names, const int *active, int n,
                      char *msg, size_t cap)
{
    char found[256] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof(found); i++)
        used += (size_t)snprintf(found + used, sizeof(found) - used, "%s%s%s", i ? ", " : "",
                                 names[i], active[i] ? "" : " (port down)");
    if (n == 0) {
        snprintf(msg, cap, "no RDMA device found (ibv_get_device_list lists none)");
        return FK_ENODEV;
    }
    for (int i = 0; i < n; i++) {
        int named = want != NULL && *want != '\0';
        if (named && strcmp(names[i], want) != 0)
            continue;
        if (active[i])
            return i;
        if (named) {
            snprintf(msg, cap, "RDMA device %s has no active port (found: %s)", want, found);
            return FK_ENODEV;
        }
    }
    if (want != NULL && *want != '\0')
        snprintf(msg, cap, "RDMA device %s not found (found: %s)", want, found);
    else
        snprintf(msg, cap, "no RDMA device with an active port (found: %s)", found);
    return FK_ENODEV;
}

/* Port 1's state (rdma_cm devices here have one port: rxe, RoCE NICs). */
static int port_active(struct ibv_context *ctx)
{
    struct ibv_port_attr pa;
    return ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
}

#define VB_DEVS_MAX 16

/* The devices of this host, each opened by this process. Contexts come
 * from ibv_open_device, never from librdmacm's rdma_get_devices(): those
 * are opened once per process and inherited across fork(), and a child
 * that creates queue pairs on its parent's context gets queue pairs that
 * never complete anything (seen on rxe with flows' forked test processes).
 * Each node opens its own context; rdma_cm ids are only matched to it by
 * device name, and queue pairs are moved through their states with
 * rdma_init_qp_attr (librdmacm's "QP-less" use, as UCX does). */
struct vb_devlist {
    struct ibv_device **list;
    struct ibv_context *ctx[VB_DEVS_MAX];
    const char *names[VB_DEVS_MAX];
    int active[VB_DEVS_MAX];
    int n;
};

static void devs_open(struct vb_devlist *d)
{
    int n = 0;
    memset(d, 0, sizeof(*d));
    d->list = ibv_get_device_list(&n);
    for (int i = 0; d->list != NULL && i < n && d->n < VB_DEVS_MAX; i++) {
        struct ibv_context *ctx = ibv_open_device(d->list[i]);
        if (ctx == NULL)
            continue;
        d->ctx[d->n] = ctx;
        d->names[d->n] = ibv_get_device_name(d->list[i]);
        d->active[d->n] = port_active(ctx);
        d->n++;
    }
}

/* Closes every context but keep (NULL: all). */
static void devs_close(struct vb_devlist *d, const struct ibv_context *keep)
{
    for (int i = 0; i < d->n; i++)
        if (d->ctx[i] != keep)
            ibv_close_device(d->ctx[i]);
    if (d->list != NULL)
        ibv_free_device_list(d->list);
}

int fab__verbs_probe(char *why, size_t cap)
{
    struct vb_devlist d;
    devs_open(&d);
    int rc = fab__verbs_select(getenv("FLOWKV_RDMA_DEVICE"), d.names, d.active, d.n, why, cap);
    devs_close(&d, NULL);
    return rc >= 0;
}

/* Finds the RoCE v2 GID (else any GID) that maps ip (::ffff:a.b.c.d) on
 * port 1 of ctx; with ip 0, the first IPv4-mapped GID, whose address is
 * stored in *ip. Returns the GID index or -1. */
static int find_ipv4_gid(struct ibv_context *ctx, struct in_addr *ip)
{
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, 1, &pa) != 0)
        return -1;
    int best = -1;
    for (int i = 0; i < pa.gid_tbl_len && i < 256; i++) {
        union ibv_gid g;
        if (ibv_query_gid(ctx, 1, i, &g) != 0)
            continue;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(g.raw, v4, 12) != 0)
            continue;
        struct in_addr a;
        memcpy(&a, g.raw + 12, 4);
        if (ip->s_addr != 0 && a.s_addr != ip->s_addr)
            continue;
        struct ibv_gid_entry e;
        int v2 =
            ibv_query_gid_ex(ctx, 1, (uint32_t)i, &e, 0) == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2;
        if (best < 0 || v2) {
            best = i;
            *ip = a;
        }
        if (v2)
            break;
    }
    return best;
}

/* Picks the device index for a node bound to ip (0: not given; then the
 * named or first active device, and ip becomes its address). Logs why
 * when there is none. */
static int pick(struct vb_devlist *d, const char *want, struct in_addr *ip, const char *host)
{
    char msg[384];
    int idx = fab__verbs_select(host ? NULL : want, d->names, d->active, d->n, msg, sizeof(msg));
    if (idx < 0) {
        fk_error("flows", "fabric verbs: %s", msg);
        return idx;
    }
    if (host == NULL)
        return idx;
    for (int i = 0; i < d->n; i++) { /* the device that owns host */
        struct in_addr a = *ip;
        if (d->active[i] && find_ipv4_gid(d->ctx[i], &a) >= 0 &&
            (want == NULL || *want == '\0' || strcmp(d->names[i], want) == 0))
            return i;
    }
    fab__verbs_select(NULL, d->names, d->active, d->n, msg, sizeof(msg));
    fk_error("flows", "fabric verbs: address %s is on no active RDMA device%s%s (devices: %s)",
             host, want ? " named " : "", want ? want : "", msg);
    return FK_ENODEV;
}

/* Resolves the device and the IPv4 address of a new node (see the top of
 * this file). Returns 0 or FK_ENODEV / FK_EINVAL after logging why. */
static int choose_device(struct vb_node *n, const struct fab_config *cfg)
{
    const char *want = cfg->device ? cfg->device : getenv("FLOWKV_RDMA_DEVICE");
    const char *host = cfg->host;
    if (host != NULL && strncmp(host, "127.", 4) == 0)
        host = NULL; /* loopback: the device's own address */
    if (host != NULL && inet_pton(AF_INET, host, &n->ip) != 1)
        return FK_EINVAL;
    struct vb_devlist d;
    devs_open(&d);
    int idx = pick(&d, want, &n->ip, host);
    n->ctx = idx >= 0 ? d.ctx[idx] : NULL;
    if (idx >= 0)
        snprintf(n->dev_name, sizeof(n->dev_name), "%s", d.names[idx]);
    devs_close(&d, n->ctx);
    if (idx < 0)
        return idx;
    n->port = 1;
    n->gid_index = find_ipv4_gid(n->ctx, &n->ip);
    if (n->gid_index < 0) {
        fk_error("flows", "fabric verbs: device %s has no IPv4 (RoCE) GID; set fab_config.host",
                 n->dev_name);
        return FK_ENODEV;
    }
    inet_ntop(AF_INET, &n->ip, n->host, sizeof(n->host));
    return 0;
}

/* Whether an rdma_cm id resolved to the node's device. */
int fab__verbs_same_device(const struct vb_node *n, const struct rdma_cm_id *id)
{
    return id->verbs != NULL && strcmp(ibv_get_device_name(id->verbs->device), n->dev_name) == 0;
}

/* Moves qp to state with the attributes rdma_cm computed for id, granting
 * every remote access and rd_atom reads/atomics in flight each way. */
#define VB_REMOTE_ACCESS                                                                           \
    (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

int fab__verbs_qp_to(const struct vb_node *n, struct rdma_cm_id *id, struct ibv_qp *qp,
                     enum ibv_qp_state state, int remote)
{
    struct ibv_qp_attr a = {.qp_state = state};
    int mask = 0;
    if (rdma_init_qp_attr(id, &a, &mask) != 0)
        return -errno;
    if (mask & IBV_QP_ACCESS_FLAGS)
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | (remote ? VB_REMOTE_ACCESS : 0);
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        a.max_dest_rd_atomic = (uint8_t)n->rd_atom;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        a.max_rd_atomic = (uint8_t)n->rd_atom;
    int rc = ibv_modify_qp(qp, &a, mask);
    return rc != 0 ? -rc : 0;
}

/* ---- regions ------------------------------------------------------------------------ */

static int vb_mr_reg(fab_node *bn, void *addr, size_t len, fab_mr **out)
{
    struct vb_node *n = (struct vb_node *)bn;
    struct vb_mr *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return FK_ENOMEM;
    if (__atomic_add_fetch(&n->nmr, 1, __ATOMIC_RELAXED) > FAB_MR_MAX) {
        __atomic_sub_fetch(&n->nmr, 1, __ATOMIC_RELAXED);
        free(m);
        return FK_ENOMEM;
    }
    /* Registered once per region with every access a peer may use. */
    m->mr = ibv_reg_mr(n->pd, addr, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_ATOMIC);
    if (m->mr == NULL) {
        int err = errno ? -errno : FK_ENOMEM;
        __atomic_sub_fetch(&n->nmr, 1, __ATOMIC_RELAXED);
        free(m);
        return err;
    }
    m->base.node = bn;
    m->base.addr = addr;
    m->base.len = len;
    m->base.key = m->mr->rkey;
    *out = &m->base;
    return 0;
}

static void vb_mr_dereg(fab_mr *bmr)
{
    struct vb_mr *m = (struct vb_mr *)bmr;
    struct vb_node *n = (struct vb_node *)bmr->node;
    /* ibv_dereg_mr returns after the device stopped using the memory. */
    int rc = ibv_dereg_mr(m->mr);
    if (rc != 0)
        fk_warn("flows", "fabric verbs: ibv_dereg_mr: %s", strerror(rc));
    __atomic_sub_fetch(&n->nmr, 1, __ATOMIC_RELAXED);
    free(m);
}

uint32_t fab__verbs_lkey(const fab_mr *mr)
{
    return ((const struct vb_mr *)mr)->mr->lkey;
}

/* ---- doorbell and waiting ---------------------------------------------------------- */

static long futex(uint32_t *uaddr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, uaddr, op, val, ts, NULL, 0);
}

static uint64_t vb_doorbell(fab_node *bn)
{
    struct vb_node *n = (struct vb_node *)bn;
    return __atomic_load_n(&n->bell, __ATOMIC_SEQ_CST) + (fk_now_ns() >> VB_TICK_SHIFT);
}

static void ring_doorbell(struct vb_node *n)
{
    __atomic_fetch_add(&n->bell, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&n->waiters, __ATOMIC_SEQ_CST) > 0)
        futex(&n->bell, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

/* About 30 us of spinning, then 30 yields (as the tcp backend's adaptive
 * wait): a reply that comes back within a round trip is caught on-core. */
int fab__verbs_spin(unsigned iter)
{
    if (iter < 300) {
        for (int i = 0; i < 64; i++)
            __builtin_ia32_pause();
        return 0;
    }
    if (iter < 330) {
        sched_yield();
        return 0;
    }
    return 1;
}

/* Remote writes raise no event here, so waiting for memory means the
 * caller polls it. For the first VB_SPIN_NS of a wait (per thread and
 * doorbell value) fab_node_wait returns 0 after a short pause, as if the
 * doorbell had moved, so the caller re-checks memory about every
 * microsecond; until VB_YIELD_NS more it yields first; after that it
 * sleeps to the next doorbell tick (about 1 ms), unless the progress
 * thread rings. fab.h's waiting protocol (read the doorbell, check memory,
 * wait) tolerates such early returns. 400 us covers a round trip on RoCE
 * (a few us on hardware, 40 to 60 us on rxe under TCG, several times that
 * when the guest is briefly descheduled) so a ping-pong never sleeps:
 * make bench-rdma's latency ratio read 1.44, 1.95 (and 1.23, 2.06, 1.77
 * before) with 100 us, 1.24, 1.37, 1.51, 1.29, 1.42 with 400 us. The
 * price: a long idle wait spins 400 us of every tick, about 45% of a core
 * (15% at 100 us), as RDMA systems that poll (DFI) spend a core anyway. */
#define VB_SPIN_NS  (400 * FK_NSEC_PER_USEC)
#define VB_YIELD_NS (50 * FK_NSEC_PER_USEC)

/* A call more than VB_GAP_NS after this thread's previous one starts a new
 * wait (the doorbell value alone changes only once per tick, and a thread
 * may wait many times within one). */
#define VB_GAP_NS (20 * FK_NSEC_PER_USEC)

static __thread uint64_t t_wait_seen, t_wait_since, t_wait_last;

static int vb_wait(fab_node *bn, uint64_t seen, uint64_t timeout_ns)
{
    struct vb_node *n = (struct vb_node *)bn;
    uint64_t now = fk_now_ns(), deadline = now + timeout_ns;
    if (vb_doorbell(bn) != seen)
        return 0;
    if (seen != t_wait_seen || now - t_wait_last > VB_GAP_NS) {
        t_wait_seen = seen; /* a new wait: the spin window starts */
        t_wait_since = now;
    }
    t_wait_last = now;
    if (now - t_wait_since < VB_SPIN_NS)
        return 0; /* no pause: under qemu TCG each one leaves the
                   * translated-code loop, and that costs more than a round
                   * trip of rxe; the caller's own check paces the loop */
    if (now - t_wait_since < VB_SPIN_NS + VB_YIELD_NS) {
        sched_yield();
        return 0;
    }
    for (;;) {
        now = fk_now_ns();
        t_wait_last = now; /* a sleep is part of this wait */
        if (vb_doorbell(bn) != seen)
            return 0;
        if (now >= deadline)
            return FK_ETIMEDOUT;
        /* Sleep to the next tick (or the deadline) unless the progress
         * thread rings first. */
        uint64_t tick = ((now >> VB_TICK_SHIFT) + 1) << VB_TICK_SHIFT;
        uint64_t left = (tick < deadline ? tick : deadline) - now;
        struct timespec ts = {0, (long)left};
        uint32_t b = __atomic_load_n(&n->bell, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&n->waiters, 1, __ATOMIC_SEQ_CST);
        futex(&n->bell, FUTEX_WAIT_PRIVATE, b, &ts);
        __atomic_fetch_sub(&n->waiters, 1, __ATOMIC_SEQ_CST);
    }
}

/* ---- counters ----------------------------------------------------------------------- */

_Static_assert(sizeof(struct fab_counters) == VB_C_MAX * sizeof(uint64_t),
               "one fab_counters field per verbs counter");

void fab__verbs_counters(const fab_node *bn, struct fab_counters *out)
{
    const struct vb_node *n = (const struct vb_node *)bn;
    uint64_t v[VB_C_MAX];
    for (int i = 0; i < VB_C_MAX; i++)
        v[i] = __atomic_load_n(&n->ctr[i], __ATOMIC_RELAXED);
    memcpy(out, v, sizeof(v));
}

/* FLOWKV_FAB_COUNTERS=<file>: one line per destroyed node, one write(2)
 * with O_APPEND so lines of concurrent processes do not interleave. */
static void dump_counters(struct vb_node *n)
{
    const char *path = getenv("FLOWKV_FAB_COUNTERS");
    if (path == NULL || *path == '\0')
        return;
    struct fab_counters c;
    fab__verbs_counters(&n->base, &c);
    char line[512];
    int len = snprintf(line, sizeof(line),
                       "fab-counters: pid=%d addr=%s write=%lu write_inline=%lu read=%lu faa=%lu "
                       "send=%lu recv=%lu completion=%lu error=%lu dgram_send=%lu dgram_recv=%lu "
                       "mcast_send=%lu connect=%lu connect_retry=%lu\n",
                       (int)getpid(), n->base.addr, c.write, c.write_inline, c.read, c.faa, c.send,
                       c.recv, c.completion, c.error, c.dgram_send, c.dgram_recv, c.mcast_send,
                       c.connect, c.connect_retry);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)len) != len)
        fk_warn("flows", "fabric verbs: cannot write counters to %s", path);
    close(fd);
}

/* ---- passive side: control messages ------------------------------------------------- */

static struct vb_peer *find_peer(struct vb_node *n, uint64_t num)
{
    for (struct vb_peer *p = n->peers; p != NULL; p = p->next)
        if (p->num == num)
            return p;
    return NULL;
}

/* wr_id of a passive work request: the peer number and the buffer index, so
 * a completion left in the CQ after its peer was freed matches nothing. */
static uint64_t peer_wrid(const struct vb_peer *p, unsigned slot)
{
    return (p->num << 4) | slot;
}

static int post_peer_recv(struct vb_peer *p, unsigned slot)
{
    struct ibv_sge sge = {(uint64_t)(uintptr_t)p->buf[slot], VB_MSG_BYTES, p->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = peer_wrid(p, slot), .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(p->qp, &wr, &bad);
}

/* Runs the handler on one request and sends its response (a SEND from the
 * peer's response buffer; the next request can only come after the active
 * side received this response, so the buffer is free again by then). */
/* The token was proved (fab_auth.c): the queue pair, accepted without
 * remote access rights, gets them now, before the response that lets the
 * dialer post (RTS to RTS may change access flags: IB spec vol. 1, table
 * 91 "QP state transition properties"). */
static int grant_remote(struct vb_peer *p)
{
    struct ibv_qp_attr a = {.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | VB_REMOTE_ACCESS};
    int rc = ibv_modify_qp(p->qp, &a, IBV_QP_ACCESS_FLAGS);
    if (rc != 0)
        fk_warn("flows", "fabric verbs: cannot grant remote access to peer %lu: %s", p->num,
                strerror(rc));
    return rc;
}

static void on_call(struct vb_peer *p, unsigned slot, uint32_t bytes)
{
    struct vb_node *n = p->node;
    uint8_t *req = p->buf[slot], *resp = p->buf[VB_PEER_RECVS];
    uint32_t len, seq;
    memcpy(&len, req, 4);
    memcpy(&seq, req + 4, 4);
    int rc = FK_EINVAL, granted = 0;
    if (len <= FAB_MSG_MAX && len + VB_MSG_HDR <= bytes)
        rc = fab__serve_call(&n->base, &p->auth, p->num, req + VB_MSG_HDR, len, resp + VB_MSG_HDR,
                             FAB_MSG_MAX, &granted);
    if (granted && grant_remote(p) != 0)
        rc = FK_EAUTH; /* the dialer then closes: nothing half-open stays */
    int32_t status = rc < 0 ? rc : 0;
    uint32_t rlen = rc > 0 ? (uint32_t)rc : 0;
    memcpy(resp, &status, 4);
    memcpy(resp + 4, &seq, 4);
    /* The request buffer is no longer needed: repost it first. */
    if (post_peer_recv(p, slot) != 0)
        fk_warn("flows", "fabric verbs: cannot repost a receive for peer %lu", p->num);
    struct ibv_sge sge = {(uint64_t)(uintptr_t)resp, VB_MSG_HDR + rlen, p->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = peer_wrid(p, VB_PEER_RECVS),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(p->qp, &wr, &bad) == 0)
        vb_count(n, VB_C_SEND, 1);
}

static int drain_pcq(struct vb_node *n)
{
    struct ibv_wc wc[16];
    int got, total = 0;
    while ((got = ibv_poll_cq(n->pcq, 16, wc)) > 0) {
        total += got;
        for (int i = 0; i < got; i++) {
            struct vb_peer *p = find_peer(n, wc[i].wr_id >> 4);
            unsigned slot = (unsigned)(wc[i].wr_id & 15);
            if (p == NULL || wc[i].status != IBV_WC_SUCCESS || slot >= VB_PEER_RECVS)
                continue; /* response sent, flushed, or a peer already gone */
            vb_count(n, VB_C_RECV, 1);
            on_call(p, slot, wc[i].byte_len);
        }
    }
    return total;
}

static void on_pcq_event(struct vb_node *n)
{
    struct ibv_cq *cq;
    void *ctx;
    if (ibv_get_cq_event(n->pch, &cq, &ctx) == 0)
        ibv_ack_cq_events(cq, 1);
    ibv_req_notify_cq(n->pcq, 0);
    drain_pcq(n); /* after re-arming, so nothing that arrived is missed */
}

/* ---- passive side: connections ------------------------------------------------------ */

static void peer_free(struct vb_peer *p, int notify)
{
    struct vb_node *n = p->node;
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        n->peers = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    if (notify && p->established) {
        struct fab__handlers h = fab__handler_enter(&n->base);
        if (h.close != NULL)
            h.close(h.data, p->num);
        fab__handler_exit(&n->base);
    }
    if (p->qp != NULL)
        ibv_destroy_qp(p->qp);
    if (p->mr != NULL)
        ibv_dereg_mr(p->mr);
    rdma_destroy_id(p->id);
    free(p);
}

/* A connection request: a QP on the node's PD and control CQ, two receives
 * for control messages, accept with as many incoming reads and atomics as
 * the initiator asked for and the device allows. */
static void on_connect_request(struct vb_node *n, struct rdma_cm_event *ev)
{
    struct vb_peer *p = calloc(1, sizeof(*p));
    struct ibv_qp_init_attr qa = {.send_cq = n->pcq,
                                  .recv_cq = n->pcq,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = VB_PEER_RECVS + 2,
                                          .max_recv_wr = VB_PEER_RECVS,
                                          .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    if (p == NULL || !fab__verbs_same_device(n, ev->id) || !(p->qp = ibv_create_qp(n->pd, &qa))) {
        free(p);
        rdma_reject(ev->id, NULL, 0);
        rdma_destroy_id(ev->id);
        return;
    }
    p->node = n;
    p->id = ev->id;
    p->num = ++n->next_peer_id;
    ev->id->context = p;
    p->next = n->peers;
    if (n->peers != NULL)
        n->peers->prev = p;
    n->peers = p;
    p->mr = ibv_reg_mr(n->pd, p->buf, sizeof(p->buf), IBV_ACCESS_LOCAL_WRITE);
    /* With a token, no remote access until the dialer proved it. */
    int open_node = n->base.token[0] == '\0';
    int ok = p->mr != NULL && fab__verbs_qp_to(n, ev->id, p->qp, IBV_QPS_INIT, open_node) == 0 &&
             fab__verbs_qp_to(n, ev->id, p->qp, IBV_QPS_RTR, open_node) == 0;
    for (unsigned i = 0; ok && i < VB_PEER_RECVS; i++)
        ok = post_peer_recv(p, i) == 0;
    struct rdma_conn_param cp = {.responder_resources = (uint8_t)n->rd_atom,
                                 .initiator_depth = 0,
                                 .rnr_retry_count = 7,
                                 .qp_num = p->qp->qp_num};
    /* RTS right after the accept (the REP is out), before any request can
     * need a response: the kernel's own rdma_accept does the same. */
    if (!ok || rdma_accept(ev->id, &cp) != 0 ||
        fab__verbs_qp_to(n, ev->id, p->qp, IBV_QPS_RTS, open_node) != 0) {
        rdma_reject(ev->id, NULL, 0);
        peer_free(p, 0);
    }
}

static void on_cm_event(struct vb_node *n)
{
    struct rdma_cm_event *ev;
    while (rdma_get_cm_event(n->cm_ch, &ev) == 0) {
        struct vb_peer *p = ev->id->context != n ? ev->id->context : NULL;
        enum rdma_cm_event_type type = ev->event;
        if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
            on_connect_request(n, ev);
            rdma_ack_cm_event(ev);
            continue;
        }
        rdma_ack_cm_event(ev);
        if (p == NULL)
            continue;
        if (type == RDMA_CM_EVENT_ESTABLISHED) {
            p->established = 1;
        } else if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_TIMEWAIT_EXIT ||
                   type == RDMA_CM_EVENT_CONNECT_ERROR || type == RDMA_CM_EVENT_UNREACHABLE ||
                   type == RDMA_CM_EVENT_REJECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
            /* Drain control messages that arrived before the close. */
            drain_pcq(n);
            rdma_disconnect(p->id);
            peer_free(p, 1);
        }
        ring_doorbell(n);
    }
}

static void *progress_main(void *arg)
{
    struct vb_node *n = arg;
    struct pollfd pfd[3] = {
        {n->cm_ch->fd, POLLIN, 0}, {n->pch->fd, POLLIN, 0}, {n->stop_fd, POLLIN, 0}};
    for (;;) {
        int rc = poll(pfd, 3, VB_SWEEP_MS);
        if (rc < 0 && errno != EINTR)
            break;
        if (pfd[2].revents)
            break;
        if (pfd[1].revents) {
            on_pcq_event(n);
            ring_doorbell(n);
        } else if (n->peers != NULL && drain_pcq(n) > 0) {
            /* A completion whose event never came: see VB_SWEEP_MS. */
            fk_debug("flows", "fabric verbs %s: control message found by the sweep", n->base.addr);
            ring_doorbell(n);
        }
        on_cm_event(n); /* non-blocking channel: cheap when empty */
    }
    return NULL;
}

/* ---- node ---------------------------------------------------------------------------- */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

/* Creates the listener bound to the node's address on cfg->port. */
static int start_listener(struct vb_node *n, uint16_t port)
{
    n->cm_ch = rdma_create_event_channel();
    if (n->cm_ch == NULL || set_nonblock(n->cm_ch->fd) < 0)
        return FK_ENOMEM;
    if (rdma_create_id(n->cm_ch, &n->listen, n, RDMA_PS_TCP) != 0)
        return -errno;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = n->ip};
    if (rdma_bind_addr(n->listen, (struct sockaddr *)&sa) != 0) {
        int err = -errno;
        fk_error("flows", "fabric verbs: rdma_bind_addr %s:%u: %s", n->host, port, strerror(-err));
        return err;
    }
    if (!fab__verbs_same_device(n, n->listen)) {
        fk_error("flows", "fabric verbs: %s is bound to another device than %s", n->host,
                 n->dev_name);
        return FK_ENODEV;
    }
    if (rdma_listen(n->listen, 128) != 0)
        return -errno;
    snprintf(n->base.addr, sizeof(n->base.addr), "%s:%u", n->host,
             ntohs(rdma_get_src_port(n->listen)));
    return 0;
}

/* Protection domain, port limits, the passive control CQ. */
static int open_device(struct vb_node *n)
{
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    if (ibv_query_device(n->ctx, &da) != 0 || ibv_query_port(n->ctx, n->port, &pa) != 0)
        return FK_ENODEV;
    n->rd_atom = (uint32_t)(da.max_qp_rd_atom < 16 ? da.max_qp_rd_atom : 16);
    if (n->rd_atom == 0 || da.atomic_cap == IBV_ATOMIC_NONE) {
        fk_error("flows", "fabric verbs: device %s has no RDMA READ/atomic support", n->dev_name);
        return FK_ENODEV;
    }
    /* UD payload limit: the active MTU (256 << (mtu - 1) bytes). */
    n->dgram_max = 128u << pa.active_mtu;
    n->pd = ibv_alloc_pd(n->ctx);
    n->pch = ibv_create_comp_channel(n->ctx);
    if (n->pd == NULL || n->pch == NULL || set_nonblock(n->pch->fd) < 0)
        return FK_ENOMEM;
    n->pcq = ibv_create_cq(n->ctx, VB_PCQ_ENTRIES, NULL, n->pch, 0);
    if (n->pcq == NULL || ibv_req_notify_cq(n->pcq, 0) != 0)
        return FK_ENOMEM;
    n->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return n->stop_fd < 0 ? -errno : 0;
}

static void release(struct vb_node *n)
{
    while (n->peers != NULL)
        peer_free(n->peers, 0);
    if (n->listen != NULL)
        rdma_destroy_id(n->listen);
    if (n->cm_ch != NULL)
        rdma_destroy_event_channel(n->cm_ch);
    if (n->pcq != NULL)
        ibv_destroy_cq(n->pcq);
    if (n->pch != NULL)
        ibv_destroy_comp_channel(n->pch);
    if (n->pd != NULL && ibv_dealloc_pd(n->pd) != 0)
        fk_warn("flows", "fabric node %s destroyed with a region still registered", n->base.addr);
    if (n->stop_fd > 0)
        close(n->stop_fd);
    if (n->ctx != NULL)
        ibv_close_device(n->ctx);
    free(n);
}

static int vb_node_create(const struct fab_config *cfg, fab_node **out)
{
    struct vb_node *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return FK_ENOMEM;
    n->stop_fd = -1;
    n->base.ops = &fab__verbs_ops;
    fab__node_base_init(&n->base, cfg);
    int rc = choose_device(n, cfg);
    if (rc == 0)
        rc = open_device(n);
    if (rc == 0)
        rc = start_listener(n, cfg->port);
    if (rc == 0 && pthread_create(&n->thread, NULL, progress_main, n) != 0)
        rc = FK_ENOMEM;
    if (rc < 0) {
        release(n);
        return rc;
    }
    /* Multicast: rdma_join_multicast on RoCE (tests/rdma-vm/MULTICAST.md). */
    n->base.has_mcast = 1;
    fk_debug("flows", "fabric verbs node %s on %s port %u gid %d, UD MTU %u", n->base.addr,
             n->dev_name, n->port, n->gid_index, n->dgram_max);
    *out = &n->base;
    return 0;
}

static void vb_node_destroy(fab_node *bn)
{
    struct vb_node *n = (struct vb_node *)bn;
    uint64_t one = 1;
    if (write(n->stop_fd, &one, sizeof(one)) != sizeof(one))
        fk_warn("flows", "fabric verbs: cannot stop the progress thread");
    pthread_join(n->thread, NULL);
    dump_counters(n);
    release(n);
}

/* ---- shared helpers ---------------------------------------------------------------- */

int fab__verbs_parse(const char *addr, struct in_addr *ip, uint32_t *num, uint32_t max)
{
    char host[FAB_ADDR_MAX];
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= sizeof(host))
        return FK_EINVAL;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *end;
    unsigned long v = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || end == colon + 1 || v > max || inet_pton(AF_INET, host, ip) != 1)
        return FK_EINVAL;
    *num = (uint32_t)v;
    return 0;
}

int fab__verbs_wc_error(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return 0;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_MW_BIND_ERR:
        return FK_EPROTO; /* a bad key, range or alignment: the caller's fault */
    case IBV_WC_WR_FLUSH_ERR:
        return FK_EPOISONED;
    default:
        return FK_EUNREACHABLE; /* retries exhausted, the peer is gone */
    }
}

const struct fab__ops fab__verbs_ops = {
    .name = "verbs",
    .node_create = vb_node_create,
    .node_destroy = vb_node_destroy,
    .mr_reg = vb_mr_reg,
    .mr_dereg = vb_mr_dereg,
    .doorbell = vb_doorbell,
    .wait = vb_wait,
    .connect = fab__verbs_connect,
    .conn_close = fab__verbs_conn_close,
    .post = fab__verbs_post,
    .poll = fab__verbs_poll,
    .conn_wait = fab__verbs_conn_wait,
    .conn_check = fab__verbs_conn_check,
    .call = fab__verbs_call,
    .ep_open = fab__verbs_ep_open,
    .ep_close = fab__verbs_ep_close,
    .ep_send = fab__verbs_ep_send,
    .ep_recv = fab__verbs_ep_recv,
    .ep_join = fab__verbs_ep_join,
    .ep_mcast_send = fab__verbs_ep_mcast_send,
};
