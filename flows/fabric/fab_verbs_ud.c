/*
 * fab_verbs_ud.c: datagram endpoints and multicast on UD queue pairs.
 *
 * An endpoint is one UD QP owned by one thread. Its address is
 * "a.b.c.d:QPN": the node's IPv4 address (the RoCE GID ::ffff:a.b.c.d, from
 * which the kernel resolves the Ethernet address of an address handle) and
 * the QP number. Every endpoint uses the qkey librdmacm gives UD ids and
 * multicast groups (VB_QKEY), so unicast and group traffic reach the same
 * QP. Address handles are created once per destination and cached.
 *
 * Multicast follows tests/rdma-vm/MULTICAST.md: a member binds an rdma_cm
 * UD id to the node's address and calls rdma_join_multicast(), which maps
 * the group to the GID ::ffff:239.x.y.z, joins the IP group (IGMP, without
 * which the IPv4 input path drops the datagrams before rxe sees them) and
 * hands back the address handle attributes; the member attaches its QP to
 * that GID. A sender needs no join: its address handle for the group GID
 * resolves to the group's Ethernet multicast address, and it sends to QPN
 * 0xFFFFFF. When multicast is off (FLOWKV_FAB_MCAST=0) a group send is one
 * unicast per member (DESIGN.md).
 *
 * The payload limit is the port's active MTU (UD messages are one packet):
 * 1024 bytes on rxe over a 1500-byte Ethernet MTU, 4096 over jumbo frames.
 * A larger datagram is FK_ETOOBIG at the sender. The fault knob acts at the
 * receiver, as in the tcp backend: drop with probability drop, or hold back
 * delay_ns with probability delay_p in a bounded queue.
 */
#include "fab_verbs.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Receives posted per endpoint: 256 datagrams of burst before loss, as a
 * socket buffer would hold. Sends: 32 in flight, each signaled. */
#define VB_UD_RECVS 256
#define VB_UD_SENDS 32
/* The GRH area that precedes every UD receive (the IPv4 header of a RoCE
 * v2 packet lies in its last 20 bytes). */
#define VB_UD_GRH     40
#define VB_AH_MAX     64
#define VB_GROUPS_MAX 8
#define VB_DELAY_MAX  16
#define VB_MCAST_QPN  0xFFFFFFu

struct vb_ah {
    struct in_addr ip;
    struct ibv_ah *ah;
};

struct vb_delayed {
    uint64_t due;
    uint32_t len;
    char from[FAB_ADDR_MAX];
    uint8_t data[FAB_DGRAM_MAX];
};

struct vb_ep {
    struct fab_ep base;
    struct vb_node *node;
    struct ibv_cq *scq, *rcq;
    struct ibv_comp_channel *cch;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *mem; /* VB_UD_RECVS receive slots, then VB_UD_SENDS send slots */
    uint32_t rslot, sslot;
    uint64_t sent, sdone;
    struct vb_ah ahs[VB_AH_MAX];
    int nah, ah_next;
    struct rdma_event_channel *mch;
    struct rdma_cm_id *mid;
    struct ibv_ah_attr groups[VB_GROUPS_MAX];
    int ngroups;
    int ndelayed;
    struct vb_delayed delayed[VB_DELAY_MAX];
};

static uint8_t *recv_slot(struct vb_ep *e, uint64_t i)
{
    return e->mem + i * e->rslot;
}

static uint8_t *send_slot(struct vb_ep *e, uint64_t i)
{
    return e->mem + (uint64_t)VB_UD_RECVS * e->rslot + (i % VB_UD_SENDS) * e->sslot;
}

static int post_recv(struct vb_ep *e, uint64_t i)
{
    struct ibv_sge sge = {(uint64_t)(uintptr_t)recv_slot(e, i), e->rslot, e->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(e->qp, &wr, &bad) == 0 ? 0 : FK_ENOMEM;
}

/* INIT (port, qkey), RTR, RTS: a UD QP needs no peer. */
static int qp_to_rts(struct vb_ep *e)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = e->node->port, .qkey = VB_QKEY};
    if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        return FK_ENOMEM;
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
    if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE))
        return FK_ENOMEM;
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .sq_psn = 0};
    return ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) ? FK_ENOMEM : 0;
}

static int ep_setup(struct vb_ep *e)
{
    struct vb_node *n = e->node;
    e->rslot = VB_UD_GRH + n->dgram_max;
    e->sslot = n->dgram_max;
    size_t bytes = (size_t)VB_UD_RECVS * e->rslot + (size_t)VB_UD_SENDS * e->sslot;
    e->mem = calloc(1, bytes);
    e->cch = ibv_create_comp_channel(n->ctx);
    if (e->mem == NULL || e->cch == NULL || fcntl(e->cch->fd, F_SETFL, O_NONBLOCK) < 0)
        return FK_ENOMEM;
    e->mr = ibv_reg_mr(n->pd, e->mem, bytes, IBV_ACCESS_LOCAL_WRITE);
    e->scq = ibv_create_cq(n->ctx, VB_UD_SENDS + 1, NULL, NULL, 0);
    e->rcq = ibv_create_cq(n->ctx, VB_UD_RECVS + 1, NULL, e->cch, 0);
    if (e->mr == NULL || e->scq == NULL || e->rcq == NULL)
        return FK_ENOMEM;
    struct ibv_qp_init_attr qa = {.send_cq = e->scq,
                                  .recv_cq = e->rcq,
                                  .qp_type = IBV_QPT_UD,
                                  .cap = {.max_send_wr = VB_UD_SENDS,
                                          .max_recv_wr = VB_UD_RECVS,
                                          .max_send_sge = 1,
                                          .max_recv_sge = 1}};
    e->qp = ibv_create_qp(n->pd, &qa);
    if (e->qp == NULL)
        return errno ? -errno : FK_ENOMEM;
    int rc = qp_to_rts(e);
    for (uint64_t i = 0; rc == 0 && i < VB_UD_RECVS; i++)
        rc = post_recv(e, i);
    return rc;
}

static void ep_free(struct vb_ep *e)
{
    for (int i = 0; i < e->ngroups; i++)
        ibv_detach_mcast(e->qp, &e->groups[i].grh.dgid, e->groups[i].dlid);
    if (e->mid != NULL)
        rdma_destroy_id(e->mid); /* leaves the groups it joined */
    if (e->mch != NULL)
        rdma_destroy_event_channel(e->mch);
    for (int i = 0; i < e->nah; i++)
        ibv_destroy_ah(e->ahs[i].ah);
    if (e->qp != NULL)
        ibv_destroy_qp(e->qp);
    if (e->scq != NULL)
        ibv_destroy_cq(e->scq);
    if (e->rcq != NULL)
        ibv_destroy_cq(e->rcq);
    if (e->cch != NULL)
        ibv_destroy_comp_channel(e->cch);
    if (e->mr != NULL)
        ibv_dereg_mr(e->mr);
    free(e->mem);
    free(e);
}

int fab__verbs_ep_open(fab_node *bn, fab_ep **out)
{
    struct vb_ep *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return FK_ENOMEM;
    e->node = (struct vb_node *)bn;
    e->base.node = bn;
    int rc = ep_setup(e);
    if (rc < 0) {
        ep_free(e);
        return rc;
    }
    snprintf(e->base.addr, sizeof(e->base.addr), "%s:%u", e->node->host, e->qp->qp_num);
    e->base.rng = bn->fault.seed ^ ((uint64_t)e->qp->qp_num * 0x9E3779B97F4A7C15ULL);
    *out = &e->base;
    return 0;
}

void fab__verbs_ep_close(fab_ep *be)
{
    struct vb_ep *e = (struct vb_ep *)be;
    /* Let posted sends finish before their address handles go (bounded). */
    struct ibv_wc wc[8];
    for (int i = 0; i < 10000 && e->sdone < e->sent; i++) {
        int got = ibv_poll_cq(e->scq, 8, wc);
        e->sdone += got > 0 ? (uint64_t)got : 0;
    }
    ep_free(e);
}

/* ---- sending --------------------------------------------------------------------- */

/* Waits (bounded) until a send slot is free. */
static int reap_sends(struct vb_ep *e)
{
    struct ibv_wc wc[8];
    for (unsigned i = 0; e->sent - e->sdone >= VB_UD_SENDS; i++) {
        int got = ibv_poll_cq(e->scq, 8, wc);
        if (got < 0)
            return FK_EUNREACHABLE;
        e->sdone += (uint64_t)got;
        if (got == 0 && i > 100000)
            return FK_EAGAIN;
    }
    int got = ibv_poll_cq(e->scq, 8, wc);
    e->sdone += got > 0 ? (uint64_t)got : 0;
    return 0;
}

/* The cached address handle for ip (a unicast or a group address). */
static struct ibv_ah *ah_for(struct vb_ep *e, struct in_addr ip)
{
    for (int i = 0; i < e->nah; i++)
        if (e->ahs[i].ip.s_addr == ip.s_addr)
            return e->ahs[i].ah;
    struct ibv_ah_attr a = {.is_global = 1, .port_num = e->node->port};
    a.grh.dgid.raw[10] = 0xff;
    a.grh.dgid.raw[11] = 0xff;
    memcpy(a.grh.dgid.raw + 12, &ip, 4);
    a.grh.sgid_index = (uint8_t)e->node->gid_index;
    a.grh.hop_limit = 64;
    struct ibv_ah *ah = ibv_create_ah(e->node->pd, &a);
    if (ah == NULL)
        return NULL;
    int slot = e->nah < VB_AH_MAX ? e->nah++ : e->ah_next++ % VB_AH_MAX;
    if (e->ahs[slot].ah != NULL) {
        /* Evicting: no posted send may still use the old handle. */
        while (e->sdone < e->sent && reap_sends(e) == 0 && e->sdone < e->sent)
            ;
        ibv_destroy_ah(e->ahs[slot].ah);
    }
    e->ahs[slot] = (struct vb_ah){ip, ah};
    return ah;
}

static int post_ud(struct vb_ep *e, struct in_addr ip, uint32_t qpn, const void *buf, size_t len)
{
    if (len > e->node->dgram_max)
        return FK_ETOOBIG;
    int rc = reap_sends(e);
    if (rc < 0)
        return rc;
    struct ibv_ah *ah = ah_for(e, ip);
    if (ah == NULL)
        return errno ? -errno : FK_EUNREACHABLE;
    uint8_t *slot = send_slot(e, e->sent);
    memcpy(slot, buf, len);
    struct ibv_sge sge = {(uint64_t)(uintptr_t)slot, (uint32_t)len, e->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = e->sent,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = VB_QKEY;
    rc = ibv_post_send(e->qp, &wr, &bad);
    if (rc != 0)
        return -rc;
    e->sent++;
    return 0;
}

int fab__verbs_ep_send(fab_ep *be, const char *addr, const void *buf, size_t len)
{
    struct vb_ep *e = (struct vb_ep *)be;
    struct in_addr ip;
    uint32_t qpn;
    if (fab__verbs_parse(addr, &ip, &qpn, 0xFFFFFF) < 0)
        return FK_EINVAL;
    int rc = post_ud(e, ip, qpn, buf, len);
    if (rc == 0)
        vb_count(e->node, VB_C_DGRAM_SEND, 1);
    return rc;
}

int fab__verbs_ep_mcast_send(fab_ep *be, const char *group, const char *const *members, int n,
                             const void *buf, size_t len)
{
    struct vb_ep *e = (struct vb_ep *)be;
    struct in_addr ip;
    uint32_t port;
    if (fab__verbs_parse(group, &ip, &port, 65535) < 0 || !IN_MULTICAST(ntohl(ip.s_addr)))
        return FK_EINVAL;
    if (e->node->base.has_mcast) {
        int rc = post_ud(e, ip, VB_MCAST_QPN, buf, len);
        if (rc == 0)
            vb_count(e->node, VB_C_MCAST_SEND, 1);
        return rc < 0 ? rc : 1;
    }
    for (int i = 0; i < n; i++) {
        int rc = fab__verbs_ep_send(be, members[i], buf, len);
        if (rc < 0 && rc != FK_EINVAL)
            return rc;
    }
    return 0;
}

/* ---- multicast membership ---------------------------------------------------------- */

/* Waits for the join's outcome on the endpoint's rdma_cm channel. */
static int wait_join(struct vb_ep *e, struct ibv_ah_attr *ah, uint32_t *qkey)
{
    uint64_t deadline = fk_now_ns() + 5 * FK_NSEC_PER_SEC;
    for (;;) {
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(e->mch, &ev) == 0) {
            int type = (int)ev->event, status = ev->status;
            if (type == RDMA_CM_EVENT_MULTICAST_JOIN) {
                *ah = ev->param.ud.ah_attr;
                *qkey = ev->param.ud.qkey;
            }
            rdma_ack_cm_event(ev);
            if (type == RDMA_CM_EVENT_MULTICAST_JOIN)
                return 0;
            if (type == RDMA_CM_EVENT_MULTICAST_ERROR)
                return status < 0 ? status : -EADDRNOTAVAIL;
            continue;
        }
        uint64_t now = fk_now_ns();
        if (now >= deadline)
            return FK_ETIMEDOUT;
        struct pollfd pfd = {e->mch->fd, POLLIN, 0};
        poll(&pfd, 1, (int)((deadline - now) / FK_NSEC_PER_MSEC) + 1);
    }
}

static int ensure_cm_id(struct vb_ep *e)
{
    if (e->mid != NULL)
        return 0;
    e->mch = rdma_create_event_channel();
    if (e->mch == NULL || fcntl(e->mch->fd, F_SETFL, O_NONBLOCK) < 0)
        return FK_ENOMEM;
    if (rdma_create_id(e->mch, &e->mid, e, RDMA_PS_UDP) != 0)
        return -errno;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = e->node->ip};
    return rdma_bind_addr(e->mid, (struct sockaddr *)&sa) != 0 ? -errno : 0;
}

int fab__verbs_ep_join(fab_ep *be, const char *group)
{
    struct vb_ep *e = (struct vb_ep *)be;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    uint32_t port;
    if (fab__verbs_parse(group, &sa.sin_addr, &port, 65535) < 0 ||
        !IN_MULTICAST(ntohl(sa.sin_addr.s_addr)))
        return FK_EINVAL;
    if (!e->node->base.has_mcast)
        return -EOPNOTSUPP;
    if (e->ngroups == VB_GROUPS_MAX)
        return FK_ENOMEM;
    int rc = ensure_cm_id(e);
    if (rc == 0 && rdma_join_multicast(e->mid, (struct sockaddr *)&sa, e) != 0)
        rc = -errno;
    struct ibv_ah_attr ah;
    uint32_t qkey = 0;
    if (rc == 0)
        rc = wait_join(e, &ah, &qkey);
    if (rc == 0 && qkey != VB_QKEY)
        rc = -EPROTO;
    if (rc == 0 && ibv_attach_mcast(e->qp, &ah.grh.dgid, ah.dlid) != 0)
        rc = -errno;
    if (rc < 0) {
        fk_warn("flows", "fabric verbs: joining %s failed: %s", group, fk_strerror(rc));
        return rc;
    }
    e->groups[e->ngroups++] = ah;
    return 0;
}

/* ---- receiving -------------------------------------------------------------------- */

static int earliest(const struct vb_ep *e)
{
    int best = -1;
    for (int i = 0; i < e->ndelayed; i++)
        if (best < 0 || e->delayed[i].due < e->delayed[best].due)
            best = i;
    return best;
}

static int deliver_delayed(struct vb_ep *e, int i, void *buf, size_t cap, char *from)
{
    struct vb_delayed *d = &e->delayed[i];
    int len = (int)d->len;
    if ((size_t)len > cap)
        len = FK_ETOOBIG;
    else
        memcpy(buf, d->data, d->len);
    if (from != NULL)
        memcpy(from, d->from, FAB_ADDR_MAX);
    e->delayed[i] = e->delayed[--e->ndelayed];
    return len;
}

/* Applies the fault knob and copies one received datagram; returns its
 * length, 0 when dropped or delayed, or FK_ETOOBIG. */
static int take(struct vb_ep *e, const uint8_t *data, uint32_t n, const char *src, void *buf,
                size_t cap, char *from)
{
    const struct fab__fault *f = &e->node->base.fault;
    if (f->drop > 0 && fab__rand01(&e->base.rng) < f->drop)
        return 0;
    if (f->delay_p > 0 && e->ndelayed < VB_DELAY_MAX && fab__rand01(&e->base.rng) < f->delay_p) {
        struct vb_delayed *d = &e->delayed[e->ndelayed++];
        d->due = fk_now_ns() + f->delay_ns;
        d->len = n;
        memcpy(d->from, src, FAB_ADDR_MAX);
        memcpy(d->data, data, n);
        return 0;
    }
    if (n > cap)
        return FK_ETOOBIG;
    memcpy(buf, data, n);
    if (from != NULL)
        memcpy(from, src, FAB_ADDR_MAX);
    return n == 0 ? FK_EMALFORMED : (int)n;
}

/* Takes one completion from the receive CQ: returns 0 when there was none,
 * else 1 with *res as take() returns it. */
static int recv_one(struct vb_ep *e, void *buf, size_t cap, char *from, int *res)
{
    struct ibv_wc wc;
    if (ibv_poll_cq(e->rcq, 1, &wc) <= 0)
        return 0;
    *res = 0;
    uint8_t *slot = recv_slot(e, wc.wr_id);
    if (wc.status == IBV_WC_SUCCESS && wc.byte_len >= VB_UD_GRH) {
        vb_count(e->node, VB_C_DGRAM_RECV, 1);
        char src[FAB_ADDR_MAX], ip[INET_ADDRSTRLEN];
        /* RoCE v2 over IPv4: the IPv4 header sits in the GRH area's last 20
         * bytes; its source address is at offset 12 of that header. */
        inet_ntop(AF_INET, slot + 20 + 12, ip, sizeof(ip));
        snprintf(src, sizeof(src), "%s:%u", ip, wc.src_qp);
        *res = take(e, slot + VB_UD_GRH, wc.byte_len - VB_UD_GRH, src, buf, cap, from);
    }
    if (post_recv(e, wc.wr_id) < 0)
        fk_warn("flows", "fabric verbs: cannot repost a UD receive");
    return 1;
}

/* Receives until a datagram is delivered or the CQ is empty. */
static int drain(struct vb_ep *e, void *buf, size_t cap, char *from)
{
    int res = 0;
    while (recv_one(e, buf, cap, from, &res) && res == 0)
        ;
    return res;
}

/* Sleeps on the receive CQ's channel (armed by the caller) until until. */
static void ep_block(struct vb_ep *e, uint64_t until)
{
    uint64_t now = fk_now_ns();
    if (now >= until)
        return;
    struct pollfd pfd = {e->cch->fd, POLLIN, 0};
    int ms = (int)((until - now + FK_NSEC_PER_MSEC - 1) / FK_NSEC_PER_MSEC);
    if (poll(&pfd, 1, ms) > 0) {
        struct ibv_cq *cq;
        void *ctx;
        if (ibv_get_cq_event(e->cch, &cq, &ctx) == 0)
            ibv_ack_cq_events(cq, 1);
    }
}

int fab__verbs_ep_recv(fab_ep *be, void *buf, size_t cap, char *from, uint64_t timeout_ns)
{
    struct vb_ep *e = (struct vb_ep *)be;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    for (unsigned iter = 0;; iter++) {
        uint64_t now = fk_now_ns();
        int i = earliest(e);
        if (i >= 0 && e->delayed[i].due <= now)
            return deliver_delayed(e, i, buf, cap, from);
        int rc = drain(e, buf, cap, from);
        if (rc != 0)
            return rc;
        if (now >= deadline)
            return FK_ETIMEDOUT;
        if (!fab__verbs_spin(iter))
            continue;
        /* Arm, then look once more: nothing that arrived is missed. */
        if (ibv_req_notify_cq(e->rcq, 0) != 0)
            return FK_EUNREACHABLE;
        rc = drain(e, buf, cap, from);
        if (rc != 0)
            return rc;
        uint64_t until = deadline;
        if (i >= 0 && e->delayed[i].due < until)
            until = e->delayed[i].due;
        ep_block(e, until);
    }
}
