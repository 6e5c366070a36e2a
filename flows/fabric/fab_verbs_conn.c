/*
 * fab_verbs_conn.c: the active side of a verbs connection (an RC queue pair
 * made with librdmacm).
 *
 * Posting. Each work request takes the next send-queue slot (wr_id = a
 * 64-bit sequence number, slot = wr_id % VB_SQ_WR). A caller-signaled
 * operation counts against FAB_CONN_DEPTH until fab_poll returns its
 * completion. Unsignaled writes are signaled by the backend every
 * VB_UNSIG_MAX work requests (and whenever the bounce ring is half full):
 * a signaled completion retires every earlier slot, since an RC send queue
 * completes in order, so the queue never overflows (ibv_post_send(3),
 * "selective signaling"). Writes up to the QP's max_inline_data are sent
 * IBV_SEND_INLINE; larger ones use the caller's region (lmr) or, with lmr
 * NULL, a registered bounce ring. Reads without lmr and fetch-and-adds land
 * in a per-slot registered area and are copied out when reaped.
 *
 * Ordering. RC delivers the work requests of one QP in order, and a write's
 * bytes are placed in increasing address order: the responder applies the
 * packets of a message in PSN order (InfiniBand Architecture Specification
 * vol. 1, section 9.7.5: in-order packet delivery per RC QP; rxe's
 * responder copies each packet's payload with memcpy in that order, and on
 * x86 stores become visible in program order). FaRM (Dragojevic et al.,
 * NSDI 2014, section 3) and DFI (section 5.1) rely on the same property of
 * ConnectX NICs: a reader that sees a segment's last word (its footer)
 * sees the payload written before it. The IB specification itself does not
 * promise placement order within one message, so a NIC that places data
 * out of order would need the footer in a separate, later write, which is
 * what flows' FAB_MORE path already does.
 *
 * Soft-RoCE (rxe) places data with the kernel's memcpy, which is `rep
 * movsb` on CPUs with ERMS: the last word of a write, and an 8-byte READ of
 * a word being updated, need not be single stores or loads there. Under
 * TCG, which runs `rep movsb` byte by byte, test_fab_ops saw footer 2130 as
 * 82 (0x852 with only its low byte landed) in about 5% of runs, on one
 * device and across two, with or without inline data and signaling; the
 * rdma-vm guest now boots without ERMS/FSRM so that memcpy moves words
 * (tests/rdma-vm README.md, "Torn words on rxe"). Protocols on this fabric
 * still mark a word as written with a flag in its most significant byte,
 * which a forward copy stores last (flows: FOOT_CONSUMABLE, bit 62), and
 * never act on a word without it. Hardware RNICs write an aligned word in
 * one PCIe transaction and do not tear it.
 *
 * Errors. The first failed completion moves the connection to ERROR: its
 * status (FK_EPROTO for a remote access error, FK_EUNREACHABLE when the
 * peer is gone) is reported for that operation even if it was unsignaled;
 * flushed caller-signaled operations complete with FK_EPOISONED; the QP is
 * disconnected at once (the passive side's close handler runs) and later
 * posts return FK_EPOISONED or FK_EUNREACHABLE. The handle is not
 * reconnected underneath the caller: the passive side has already reclaimed
 * what belonged to the closed connection (flows reclaims a departed
 * source's slot on close), so a silent reconnect could write into memory
 * that now belongs to someone else. Reconnection is fab_connect's job, and
 * it retries transient failures (address or route resolution errors,
 * unreachable, timeouts) with exponential back-off until its deadline.
 */
#include "fab_verbs.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Completions queued for fab_poll: every send-queue slot can produce one. */
#define VB_PEND (VB_SQ_WR + 1)
/* The control-message receive's wr_id (send slots use sequence numbers,
 * which never reach this value). */
#define VB_RECV_WRID UINT64_MAX
/* Connection back-off: 1 ms doubling to 100 ms. */
#define VB_BACKOFF_MIN_NS (1 * FK_NSEC_PER_MSEC)
#define VB_BACKOFF_MAX_NS (100 * FK_NSEC_PER_MSEC)

enum vb_kind { VB_K_USER, VB_K_CALL };

struct vb_slot {
    uint64_t cookie;
    void *local;        /* read without lmr: where the data goes */
    uint64_t wring_end; /* write-ring position after this WR's bytes */
    uint32_t len;
    uint8_t op;       /* enum fab_op */
    uint8_t kind;     /* enum vb_kind */
    uint8_t user_sig; /* the caller asked for a completion */
    uint8_t bounce;   /* data in the per-slot area */
};

enum vb_state { VB_S_READY, VB_S_ERROR };

struct vb_conn {
    struct fab_conn base;
    struct vb_node *node;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_qp *qp; /* created on the node's own context (fab_verbs.c) */
    struct ibv_comp_channel *cch;
    struct ibv_cq *cq;
    struct ibv_mr *bmr;
    uint8_t *mem; /* registered: slot areas, write ring, call send, call recv */
    uint32_t max_inline;
    enum vb_state state;
    int err;          /* what posts return in VB_S_ERROR */
    int disconnected; /* rdma_disconnect done */
    uint64_t head, tail;
    int sig_out; /* caller-signaled operations not yet returned by fab_poll */
    unsigned unsig_run;
    uint64_t wring_head, wring_tail;
    struct ibv_send_wr batch[VB_BATCH_MAX];
    struct ibv_sge sges[VB_BATCH_MAX];
    int nbatch;
    struct fab_wc pend[VB_PEND];
    unsigned ph, pt;
    uint32_t call_seq;
    int call_done, call_status;
    uint32_t call_len;
    unsigned idle;
    const char *why; /* the step of the last failed connection attempt */
    struct vb_slot slots[VB_SQ_WR];
};

/* Layout of conn->mem. */
#define VB_OFF_SLOTS 0
#define VB_OFF_WRING (VB_SQ_WR * FAB_READ_MAX)
#define VB_OFF_CSEND (VB_OFF_WRING + VB_WRING_BYTES)
#define VB_OFF_CRECV (VB_OFF_CSEND + VB_MSG_BYTES)
#define VB_MEM_BYTES (VB_OFF_CRECV + VB_MSG_BYTES)

/* ---- errors and teardown ------------------------------------------------------------ */

static void enter_error(struct vb_conn *c, int why)
{
    if (c->state == VB_S_ERROR)
        return;
    c->state = VB_S_ERROR;
    c->err = why == FK_EPROTO ? FK_EPOISONED : FK_EUNREACHABLE;
    /* Tear the QP down now: the peer's close handler runs and the QP's
     * outstanding work requests flush (reaped by fab_poll). */
    if (!c->disconnected && c->id != NULL) {
        rdma_disconnect(c->id);
        c->disconnected = 1;
    }
}

static void push_wc(struct vb_conn *c, uint64_t cookie, int status, uint32_t op, uint64_t value)
{
    assert(c->ph - c->pt < VB_PEND);
    c->pend[c->ph % VB_PEND] = (struct fab_wc){cookie, status, op, value};
    c->ph++;
}

/* Reposts the control receive after its response was consumed. */
static int repost_recv(struct vb_conn *c)
{
    struct ibv_sge sge = {(uint64_t)(uintptr_t)(c->mem + VB_OFF_CRECV), VB_MSG_BYTES, c->bmr->lkey};
    struct ibv_recv_wr wr = {.wr_id = VB_RECV_WRID, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(c->qp, &wr, &bad) == 0 ? 0 : FK_EUNREACHABLE;
}

/* Handles the response to a control message. */
static void reap_recv(struct vb_conn *c, const struct ibv_wc *wc)
{
    if (wc->status != IBV_WC_SUCCESS) {
        enter_error(c, fab__verbs_wc_error(wc->status));
        return;
    }
    vb_count(c->node, VB_C_RECV, 1);
    const uint8_t *m = c->mem + VB_OFF_CRECV;
    int32_t status;
    uint32_t seq;
    memcpy(&status, m, 4);
    memcpy(&seq, m + 4, 4);
    if (seq == c->call_seq && !c->call_done) {
        c->call_done = 1;
        c->call_status = status;
        c->call_len = wc->byte_len >= VB_MSG_HDR ? wc->byte_len - VB_MSG_HDR : 0;
        return; /* fab_call copies the response out, then reposts */
    }
    /* A late response to a call that timed out: dropped. */
    if (repost_recv(c) < 0)
        enter_error(c, FK_EUNREACHABLE);
}

/* Retires send slot wr_id and every earlier one (RC completes in order). */
static void reap_send(struct vb_conn *c, const struct ibv_wc *wc)
{
    struct vb_slot *s = &c->slots[wc->wr_id % VB_SQ_WR];
    int st = fab__verbs_wc_error(wc->status);
    vb_count(c->node, VB_C_COMPLETION, 1);
    if (st != 0)
        vb_count(c->node, VB_C_ERROR, 1);
    uint64_t value = 0;
    if (st == 0 && s->op == FAB_OP_READ && s->bounce)
        memcpy(s->local, c->mem + VB_OFF_SLOTS + (wc->wr_id % VB_SQ_WR) * FAB_READ_MAX, s->len);
    if (st == 0 && s->op == FAB_OP_FAA)
        memcpy(&value, c->mem + VB_OFF_SLOTS + (wc->wr_id % VB_SQ_WR) * FAB_READ_MAX, 8);
    if (st != 0 && st != FK_EPOISONED && c->state != VB_S_ERROR) {
        /* The failing operation itself: reported even when unsignaled. */
        enter_error(c, st);
        if (s->kind == VB_K_USER)
            push_wc(c, s->cookie, st, s->op, 0);
        else
            c->call_done = 1, c->call_status = st;
    } else if (s->kind == VB_K_USER && s->user_sig) {
        push_wc(c, s->cookie, st, s->op, value);
    } else if (s->kind == VB_K_CALL && st != 0 && !c->call_done) {
        c->call_done = 1;
        c->call_status = c->err;
    }
    if (st != 0)
        enter_error(c, st);
    if (wc->wr_id + 1 > c->tail) {
        c->tail = wc->wr_id + 1;
        c->wring_tail = s->wring_end > c->wring_tail ? s->wring_end : c->wring_tail;
    }
}

/* Moves what the CQ holds into the pending queue; returns how many. */
static int reap(struct vb_conn *c)
{
    struct ibv_wc wc[16];
    int total = 0, got;
    while ((got = ibv_poll_cq(c->cq, 16, wc)) > 0) {
        for (int i = 0; i < got; i++) {
            if (wc[i].wr_id == VB_RECV_WRID)
                reap_recv(c, &wc[i]);
            else
                reap_send(c, &wc[i]);
        }
        total += got;
    }
    return total;
}

/* Checks the connection's rdma_cm channel (non-blocking): a DISCONNECTED
 * event means the peer closed or died. */
static void check_cm(struct vb_conn *c)
{
    struct rdma_cm_event *ev;
    while (c->ch != NULL && rdma_get_cm_event(c->ch, &ev) == 0) {
        enum rdma_cm_event_type t = ev->event;
        rdma_ack_cm_event(ev);
        if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL ||
            t == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
            enter_error(c, FK_EUNREACHABLE);
            c->disconnected = 1;
        }
    }
}

/* ---- connecting -------------------------------------------------------------------- */

static void conn_release(struct vb_conn *c)
{
    if (c->qp != NULL)
        ibv_destroy_qp(c->qp);
    if (c->cq != NULL)
        ibv_destroy_cq(c->cq);
    if (c->cch != NULL)
        ibv_destroy_comp_channel(c->cch);
    if (c->id != NULL)
        rdma_destroy_id(c->id);
    if (c->ch != NULL)
        rdma_destroy_event_channel(c->ch);
    c->qp = NULL;
    c->id = NULL;
    c->ch = NULL;
    c->cq = NULL;
    c->cch = NULL;
}

/* Waits for the next event on the connection's channel until deadline.
 * Returns its type, or -1 on timeout. */
static int next_event(struct vb_conn *c, uint64_t deadline, int *status)
{
    for (;;) {
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(c->ch, &ev) == 0) {
            int t = (int)ev->event;
            *status = ev->status;
            rdma_ack_cm_event(ev);
            return t;
        }
        uint64_t now = fk_now_ns();
        if (errno != EAGAIN || now >= deadline)
            return -1;
        struct pollfd pfd = {c->ch->fd, POLLIN, 0};
        poll(&pfd, 1, (int)((deadline - now + FK_NSEC_PER_MSEC - 1) / FK_NSEC_PER_MSEC));
    }
}

/* Creates the CQ and RC QP on the resolved id, posts the control receive. */
static int make_qp(struct vb_conn *c)
{
    struct vb_node *n = c->node;
    c->cch = ibv_create_comp_channel(n->ctx);
    if (c->cch == NULL || fcntl(c->cch->fd, F_SETFL, O_NONBLOCK) < 0)
        return FK_ENOMEM;
    c->cq = ibv_create_cq(n->ctx, VB_SQ_WR + 4, c, c->cch, 0);
    if (c->cq == NULL)
        return FK_ENOMEM;
    struct ibv_qp_init_attr qa = {.send_cq = c->cq,
                                  .recv_cq = c->cq,
                                  .qp_type = IBV_QPT_RC,
                                  .sq_sig_all = 0,
                                  .cap = {.max_send_wr = VB_SQ_WR,
                                          .max_recv_wr = 2,
                                          .max_send_sge = 1,
                                          .max_recv_sge = 1,
                                          .max_inline_data = VB_INLINE_WANT}};
    c->qp = ibv_create_qp(n->pd, &qa);
    if (c->qp == NULL) {
        qa.cap.max_inline_data = 0;
        c->qp = ibv_create_qp(n->pd, &qa);
        if (c->qp == NULL)
            return errno ? -errno : FK_ENOMEM;
    }
    c->max_inline = qa.cap.max_inline_data;
    int rc = fab__verbs_qp_to(n, c->id, c->qp, IBV_QPS_INIT, 1);
    return rc < 0 ? rc : repost_recv(c);
}

/* One connection attempt. Returns 0, FK_EAGAIN (transient: retry after a
 * back-off), FK_EUNREACHABLE (refused) or another error. */
static int attempt(struct vb_conn *c, const struct sockaddr_in *dst, uint64_t deadline)
{
    struct vb_node *n = c->node;
    int st = 0, ms = (int)((deadline - fk_now_ns()) / FK_NSEC_PER_MSEC);
    struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = n->ip};
    c->ch = rdma_create_event_channel();
    if (c->ch == NULL || fcntl(c->ch->fd, F_SETFL, O_NONBLOCK) < 0 ||
        rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP) != 0)
        return FK_ENOMEM;
    c->why = "address resolution";
    if (rdma_resolve_addr(c->id, (struct sockaddr *)&src, (struct sockaddr *)dst,
                          ms > 2000 ? 2000 : (ms < 1 ? 1 : ms)) != 0)
        return FK_EAGAIN;
    if (next_event(c, deadline, &st) != RDMA_CM_EVENT_ADDR_RESOLVED)
        return FK_EAGAIN;
    c->why = "route resolution";
    if (rdma_resolve_route(c->id, 2000) != 0 ||
        next_event(c, deadline, &st) != RDMA_CM_EVENT_ROUTE_RESOLVED)
        return FK_EAGAIN;
    c->why = "connection request";
    if (!fab__verbs_same_device(n, c->id)) {
        fk_warn("flows", "fabric verbs: peer is reachable only through another device");
        return FK_EUNREACHABLE;
    }
    int rc = make_qp(c);
    if (rc < 0)
        return rc;
    struct rdma_conn_param cp = {.initiator_depth = (uint8_t)n->rd_atom,
                                 .responder_resources = 0,
                                 .retry_count = 7,
                                 .rnr_retry_count = 7,
                                 .qp_num = c->qp->qp_num};
    if (rdma_connect(c->id, &cp) != 0)
        return FK_EAGAIN;
    int ev = next_event(c, deadline, &st);
    if (ev == RDMA_CM_EVENT_CONNECT_RESPONSE) {
        /* Our QP is not librdmacm's: move it to RTR and RTS, then tell the
         * passive side (the RTU). */
        c->why = "queue pair transition";
        if (fab__verbs_qp_to(n, c->id, c->qp, IBV_QPS_RTR, 1) != 0 ||
            fab__verbs_qp_to(n, c->id, c->qp, IBV_QPS_RTS, 1) != 0 || rdma_establish(c->id) != 0)
            return FK_EAGAIN;
        return 0;
    }
    /* REJECTED: nobody listens on that port (connection refused). */
    return ev == RDMA_CM_EVENT_REJECTED ? FK_EUNREACHABLE : FK_EAGAIN;
}

static int conn_alloc(struct vb_node *n, struct vb_conn **out)
{
    struct vb_conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return FK_ENOMEM;
    c->node = n;
    c->base.node = &n->base;
    if (posix_memalign((void **)&c->mem, 4096, VB_MEM_BYTES) != 0) {
        free(c);
        return FK_ENOMEM;
    }
    memset(c->mem, 0, VB_MEM_BYTES);
    c->bmr = ibv_reg_mr(n->pd, c->mem, VB_MEM_BYTES, IBV_ACCESS_LOCAL_WRITE);
    if (c->bmr == NULL) {
        free(c->mem);
        free(c);
        return FK_ENOMEM;
    }
    *out = c;
    return 0;
}

static void conn_free(struct vb_conn *c)
{
    conn_release(c);
    ibv_dereg_mr(c->bmr);
    free(c->mem);
    free(c);
}

int fab__verbs_connect(fab_node *bn, const char *addr, uint64_t timeout_ns, fab_conn **out)
{
    struct vb_node *n = (struct vb_node *)bn;
    struct sockaddr_in dst = {.sin_family = AF_INET};
    uint32_t port;
    if (fab__verbs_parse(addr, &dst.sin_addr, &port, 65535) < 0 || port == 0)
        return FK_EINVAL;
    dst.sin_port = htons((uint16_t)port);
    struct vb_conn *c;
    int rc = conn_alloc(n, &c);
    if (rc < 0)
        return rc;
    uint64_t deadline = fk_now_ns() + timeout_ns, backoff = VB_BACKOFF_MIN_NS;
    for (;;) {
        rc = attempt(c, &dst, deadline);
        if (rc != FK_EAGAIN)
            break;
        fk_debug("flows", "fabric verbs: connecting to %s: %s; retrying", addr, c->why);
        conn_release(c);
        uint64_t now = fk_now_ns();
        if (now + backoff >= deadline)
            break;
        vb_count(n, VB_C_CONNECT_RETRY, 1);
        fk_sleep_ns(backoff);
        backoff = backoff * 2 < VB_BACKOFF_MAX_NS ? backoff * 2 : VB_BACKOFF_MAX_NS;
    }
    if (rc < 0) {
        conn_free(c);
        return rc == FK_EAGAIN ? FK_EUNREACHABLE : rc;
    }
    vb_count(n, VB_C_CONNECT, 1);
    *out = &c->base;
    return 0;
}

void fab__verbs_conn_close(fab_conn *bc)
{
    struct vb_conn *c = (struct vb_conn *)bc;
    if (!c->disconnected)
        rdma_disconnect(c->id);
    conn_free(c);
}

/* ---- posting ---------------------------------------------------------------------- */

static int flush_batch(struct vb_conn *c)
{
    if (c->nbatch == 0)
        return 0;
    for (int i = 0; i + 1 < c->nbatch; i++)
        c->batch[i].next = &c->batch[i + 1];
    c->batch[c->nbatch - 1].next = NULL;
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(c->qp, c->batch, &bad);
    c->nbatch = 0;
    if (rc != 0) {
        enter_error(c, FK_EUNREACHABLE);
        return c->err;
    }
    return 0;
}

/* Reserves len bytes of the bounce ring; returns its offset or -1 (full:
 * the caller reaps and retries). Allocations never straddle the end. */
static long wring_alloc(struct vb_conn *c, uint32_t len, uint64_t *end)
{
    uint64_t pos = c->wring_head;
    uint64_t off = pos % VB_WRING_BYTES;
    if (off + len > VB_WRING_BYTES)
        pos += VB_WRING_BYTES - off; /* skip the tail piece */
    if (pos + len - c->wring_tail > VB_WRING_BYTES)
        return -1;
    c->wring_head = pos + len;
    *end = c->wring_head;
    return (long)(pos % VB_WRING_BYTES);
}

static int in_region(const fab_mr *mr, const void *p, uint32_t len)
{
    uintptr_t lo = (uintptr_t)mr->addr, a = (uintptr_t)p;
    return a >= lo && len <= mr->len && a - lo <= mr->len - len;
}

/* Fills the scatter/gather entry of a write or read. Returns 0, FK_EAGAIN
 * (bounce ring full) or FK_ETOOBIG (a copied write above half the ring). */
static int fill_sge(struct vb_conn *c, struct vb_slot *s, uint64_t slot, fab_mr *lmr, void *local,
                    struct ibv_sge *sge, unsigned *send_flags)
{
    if (s->op == FAB_OP_FAA || (s->op == FAB_OP_READ && lmr == NULL)) {
        *sge = (struct ibv_sge){(uint64_t)(uintptr_t)(c->mem + VB_OFF_SLOTS + slot * FAB_READ_MAX),
                                s->len, c->bmr->lkey};
        s->bounce = 1;
        return 0;
    }
    if (lmr != NULL && !in_region(lmr, local, s->len)) {
        /* A caller bug (fab.h: lmr holds local); the tcp backend ignores
         * lmr, so stay compatible: copy as for lmr NULL, and say so once. */
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fk_warn("flows", "fabric verbs: a posted buffer lies outside the region given "
                             "with it; copying it instead (fix the caller's lmr)");
        lmr = NULL;
    }
    if (lmr != NULL) {
        *sge = (struct ibv_sge){(uintptr_t)local, s->len, fab__verbs_lkey(lmr)};
        if (s->op == FAB_OP_WRITE && s->len <= c->max_inline)
            *send_flags |= IBV_SEND_INLINE;
        return 0;
    }
    if (s->len <= c->max_inline) { /* copied by ibv_post_send */
        *sge = (struct ibv_sge){(uintptr_t)local, s->len, 0};
        *send_flags |= IBV_SEND_INLINE;
        return 0;
    }
    if (s->len > VB_WRING_BYTES / 2)
        return FK_ETOOBIG;
    long off = wring_alloc(c, s->len, &s->wring_end);
    if (off < 0)
        return FK_EAGAIN;
    memcpy(c->mem + VB_OFF_WRING + off, local, s->len);
    *sge =
        (struct ibv_sge){(uint64_t)(uintptr_t)(c->mem + VB_OFF_WRING + off), s->len, c->bmr->lkey};
    return 0;
}

/* Room for one more work request: reaps completions when the send queue or
 * the bounce ring is short. */
static int make_room(struct vb_conn *c, size_t len)
{
    for (int i = 0; i < 1000; i++) {
        int wr_ok = c->head - c->tail + (uint64_t)c->nbatch < VB_SQ_WR - 1;
        int ring_ok =
            len <= c->max_inline || c->wring_head + 2 * len - c->wring_tail <= VB_WRING_BYTES;
        if (wr_ok && ring_ok)
            return 0;
        int rc = flush_batch(c);
        if (rc < 0)
            return rc;
        if (reap(c) == 0 && i > 0)
            fab__verbs_spin(0);
        if (c->state == VB_S_ERROR)
            return c->err;
    }
    return FK_EAGAIN;
}

static void count_post(struct vb_conn *c, uint32_t op, unsigned send_flags)
{
    enum vb_ctr k = op == FAB_OP_WRITE ? VB_C_WRITE : op == FAB_OP_READ ? VB_C_READ : VB_C_FAA;
    vb_count(c->node, k, 1);
    if (send_flags & IBV_SEND_INLINE)
        vb_count(c->node, VB_C_WRITE_INLINE, 1);
}

int fab__verbs_post(fab_conn *bc, fab_mr *lmr, uint32_t op, void *local, size_t len, uint64_t raddr,
                    uint32_t rkey, uint64_t add, uint64_t cookie, unsigned flags)
{
    struct vb_conn *c = (struct vb_conn *)bc;
    if (c->state == VB_S_ERROR)
        return c->err;
    int user_sig = (flags & FAB_SIGNALED) != 0;
    if (user_sig && c->sig_out >= FAB_CONN_DEPTH)
        return FK_EAGAIN;
    int rc = make_room(c, op == FAB_OP_WRITE ? len : 0);
    if (rc < 0)
        return rc;
    uint64_t seq = c->head, slot = seq % VB_SQ_WR;
    struct vb_slot *s = &c->slots[slot];
    *s = (struct vb_slot){.cookie = cookie,
                          .local = local,
                          .wring_end = c->wring_head,
                          .len = (uint32_t)len,
                          .op = (uint8_t)op,
                          .kind = VB_K_USER,
                          .user_sig = (uint8_t)user_sig};
    struct ibv_send_wr *wr = &c->batch[c->nbatch];
    struct ibv_sge *sge = &c->sges[c->nbatch];
    unsigned sf = 0;
    rc = len > 0 ? fill_sge(c, s, slot, lmr, local, sge, &sf) : 0;
    if (rc < 0)
        return rc;
    s->wring_end = s->wring_end > c->wring_head ? s->wring_end : c->wring_head;
    int sig = user_sig || op != FAB_OP_WRITE || ++c->unsig_run >= VB_UNSIG_MAX ||
              c->wring_head - c->wring_tail > VB_WRING_BYTES / 2;
    if (sig) {
        sf |= IBV_SEND_SIGNALED;
        c->unsig_run = 0;
    }
    *wr = (struct ibv_send_wr){.wr_id = seq, .sg_list = sge, .num_sge = len > 0, .send_flags = sf};
    if (op == FAB_OP_FAA) {
        wr->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr->wr.atomic.remote_addr = raddr;
        wr->wr.atomic.compare_add = add;
        wr->wr.atomic.rkey = rkey;
    } else {
        wr->opcode = op == FAB_OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr->wr.rdma.remote_addr = raddr;
        wr->wr.rdma.rkey = rkey;
    }
    c->head++;
    c->nbatch++;
    c->sig_out += user_sig;
    count_post(c, op, sf);
    /* An inline write of a buffer outside any region is copied by
     * ibv_post_send, so it is posted before we return (fab.h: tcp copies). */
    if (!(flags & FAB_MORE) || c->nbatch == VB_BATCH_MAX || (lmr == NULL && op == FAB_OP_WRITE))
        return flush_batch(c);
    return 0;
}

/* ---- completions ------------------------------------------------------------------- */

int fab__verbs_poll(fab_conn *bc, struct fab_wc *wc, int max)
{
    struct vb_conn *c = (struct vb_conn *)bc;
    int rc = flush_batch(c);
    if (rc < 0 && c->ph == c->pt)
        return rc;
    if (c->ph == c->pt)
        reap(c);
    int n = 0;
    while (n < max && c->pt != c->ph) {
        wc[n] = c->pend[c->pt % VB_PEND];
        c->pt++;
        if (c->sig_out > 0 && wc[n].op != FAB_OP_CALL)
            c->sig_out--;
        n++;
    }
    if (n == 0 && c->state == VB_S_READY && ++c->idle % 256 == 0)
        check_cm(c);
    if (n == 0 && c->state == VB_S_ERROR)
        return FK_EUNREACHABLE;
    return n;
}

/* Blocks on the completion channel and the rdma_cm channel until either
 * has something or deadline passes. */
static void block(struct vb_conn *c, uint64_t deadline)
{
    if (ibv_req_notify_cq(c->cq, 0) != 0 || reap(c) > 0)
        return; /* re-check after arming: nothing is missed */
    uint64_t now = fk_now_ns();
    if (now >= deadline)
        return;
    uint64_t left = deadline - now;
    struct timespec ts = {(time_t)(left / FK_NSEC_PER_SEC), (long)(left % FK_NSEC_PER_SEC)};
    struct pollfd pfd[2] = {{c->cch->fd, POLLIN, 0}, {c->ch->fd, POLLIN, 0}};
    if (ppoll(pfd, 2, &ts, NULL) > 0 && pfd[0].revents) {
        struct ibv_cq *cq;
        void *ctx;
        if (ibv_get_cq_event(c->cch, &cq, &ctx) == 0)
            ibv_ack_cq_events(cq, 1);
    }
    check_cm(c);
}

int fab__verbs_conn_check(fab_conn *bc)
{
    struct vb_conn *c = (struct vb_conn *)bc;
    check_cm(c);
    return c->state == VB_S_ERROR ? FK_EUNREACHABLE : 0;
}

int fab__verbs_conn_wait(fab_conn *bc, uint64_t timeout_ns)
{
    struct vb_conn *c = (struct vb_conn *)bc;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    if (flush_batch(c) < 0 && c->ph == c->pt)
        return c->err;
    for (unsigned i = 0;; i++) {
        if (c->ph == c->pt)
            reap(c);
        if (c->ph != c->pt)
            return 0;
        if (c->state == VB_S_ERROR)
            return c->ph != c->pt ? 0 : FK_EUNREACHABLE;
        if (fk_now_ns() >= deadline)
            return FK_ETIMEDOUT;
        if (fab__verbs_spin(i))
            block(c, deadline);
    }
}

/* ---- control messages ---------------------------------------------------------------- */

static int post_call(struct vb_conn *c, const void *req, size_t len)
{
    int rc = make_room(c, 0);
    if (rc < 0)
        return rc;
    uint8_t *m = c->mem + VB_OFF_CSEND;
    uint32_t l32 = (uint32_t)len;
    c->call_seq++;
    memcpy(m, &l32, 4);
    memcpy(m + 4, &c->call_seq, 4);
    memcpy(m + VB_MSG_HDR, req, len);
    uint64_t seq = c->head;
    c->slots[seq % VB_SQ_WR] =
        (struct vb_slot){.op = FAB_OP_CALL, .kind = VB_K_CALL, .wring_end = c->wring_head};
    c->sges[c->nbatch] =
        (struct ibv_sge){(uint64_t)(uintptr_t)m, (uint32_t)(VB_MSG_HDR + len), c->bmr->lkey};
    c->batch[c->nbatch] = (struct ibv_send_wr){.wr_id = seq,
                                               .sg_list = &c->sges[c->nbatch],
                                               .num_sge = 1,
                                               .opcode = IBV_WR_SEND,
                                               .send_flags = IBV_SEND_SIGNALED};
    c->unsig_run = 0;
    c->head++;
    c->nbatch++;
    c->call_done = 0;
    vb_count(c->node, VB_C_SEND, 1);
    return flush_batch(c);
}

int fab__verbs_call(fab_conn *bc, const void *req, size_t len, void *resp, size_t cap,
                    uint64_t timeout_ns)
{
    struct vb_conn *c = (struct vb_conn *)bc;
    if (c->state == VB_S_ERROR)
        return c->err;
    int rc = post_call(c, req, len);
    if (rc < 0)
        return rc;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    for (unsigned i = 0; !c->call_done; i++) {
        reap(c);
        if (c->call_done)
            break;
        if (c->state == VB_S_ERROR)
            return c->err;
        if (fk_now_ns() >= deadline)
            return FK_ETIMEDOUT;
        if (fab__verbs_spin(i))
            block(c, deadline);
    }
    if (c->call_status < 0 && c->state == VB_S_ERROR)
        return c->call_status;
    size_t n = c->call_len < cap ? c->call_len : cap;
    if (n > 0)
        memcpy(resp, c->mem + VB_OFF_CRECV + VB_MSG_HDR, n);
    rc = c->call_status < 0 ? c->call_status : (int)n;
    return repost_recv(c) < 0 ? FK_EUNREACHABLE : rc;
}
