/*
 * rdma_mcast_probe: one side of a UD multicast exchange over librdmacm,
 * the way the verbs backend's replicate flow will use it (DESIGN.md,
 * "multicast join/send"): bind an rdma_cm id to a local address (which picks
 * the RDMA device), create a UD QP on it, rdma_join_multicast() the group
 * (which attaches the QP and, on RoCE v2, joins the IP group with IGMP), then
 * send to or receive from the group's address handle.
 *
 *   rdma_mcast_probe recv BIND_IP GROUP_IP COUNT TIMEOUT_MS
 *   rdma_mcast_probe send BIND_IP GROUP_IP COUNT TIMEOUT_MS
 *
 * recv prints "ready" once joined with COUNT receives posted, then waits for
 * COUNT datagrams, checks each payload ("mcast <seq>"), prints
 * "received N/COUNT" and exits 0 only if all arrived in order within
 * TIMEOUT_MS. send joins, sends COUNT datagrams 10 ms apart and exits 0 when
 * all send completions succeeded. Every wait is bounded by TIMEOUT_MS; any
 * failure prints the failing call and exits 1. Used by tests/rdma-vm/mcast.sh
 * inside the VM; evidence in tests/rdma-vm/MULTICAST.md.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* Bounded by design: at most this many datagrams per run. */
#define PROBE_MAX_COUNT 64
#define PROBE_MSG_SIZE  64
/* UD receive buffers start with the 40-byte GRH the HCA writes. */
#define PROBE_GRH_SIZE 40
#define PROBE_SLOT     (PROBE_GRH_SIZE + PROBE_MSG_SIZE)

struct probe {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    struct ibv_ah *ah;
    uint32_t remote_qpn;
    uint32_t remote_qkey;
    int64_t deadline_ms;
    /* COUNT slots for receives, or one send slot per datagram. */
    char buf[PROBE_MAX_COUNT * PROBE_SLOT];
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int fail(const char *what, int err)
{
    fprintf(stderr, "rdma_mcast_probe: %s failed: %s\n", what, strerror(err));
    return -1;
}

/* Waits (until the deadline) for the next CM event, which must be WANT. */
static int wait_cm_event(struct probe *p, enum rdma_cm_event_type want, struct rdma_cm_event **out)
{
    struct pollfd pfd = {.fd = p->ch->fd, .events = POLLIN};
    int64_t left = p->deadline_ms - now_ms();
    if (left <= 0 || poll(&pfd, 1, (int)left) != 1) {
        fprintf(stderr, "rdma_mcast_probe: no %s event in time\n", rdma_event_str(want));
        return -1;
    }
    if (rdma_get_cm_event(p->ch, out) != 0)
        return fail("rdma_get_cm_event", errno);
    if ((*out)->event != want) {
        fprintf(stderr, "rdma_mcast_probe: got %s (status %d), wanted %s\n",
                rdma_event_str((*out)->event), (*out)->status, rdma_event_str(want));
        rdma_ack_cm_event(*out);
        return -1;
    }
    return 0;
}

static int parse_addr(const char *ip, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    if (inet_pton(AF_INET, ip, &sa->sin_addr) != 1) {
        fprintf(stderr, "rdma_mcast_probe: bad IPv4 address '%s'\n", ip);
        return -1;
    }
    return 0;
}

/* Binds to BIND_IP, creates PD, CQ and the UD QP, registers the buffer. */
static int setup(struct probe *p, const char *bind_ip, int count)
{
    struct sockaddr_in local;
    if (parse_addr(bind_ip, &local) != 0)
        return -1;
    p->ch = rdma_create_event_channel();
    if (p->ch == NULL)
        return fail("rdma_create_event_channel", errno);
    if (rdma_create_id(p->ch, &p->id, NULL, RDMA_PS_UDP) != 0)
        return fail("rdma_create_id", errno);
    if (rdma_bind_addr(p->id, (struct sockaddr *)&local) != 0)
        return fail("rdma_bind_addr", errno);
    if (p->id->verbs == NULL) {
        fprintf(stderr, "rdma_mcast_probe: %s is on no RDMA device\n", bind_ip);
        return -1;
    }
    printf("device %s port %u\n", ibv_get_device_name(p->id->verbs->device), p->id->port_num);
    p->pd = ibv_alloc_pd(p->id->verbs);
    if (p->pd == NULL)
        return fail("ibv_alloc_pd", errno);
    p->cq = ibv_create_cq(p->id->verbs, 2 * count, NULL, NULL, 0);
    if (p->cq == NULL)
        return fail("ibv_create_cq", errno);
    struct ibv_qp_init_attr attr = {
        .send_cq = p->cq,
        .recv_cq = p->cq,
        .qp_type = IBV_QPT_UD,
        .cap = {.max_send_wr = count, .max_recv_wr = count, .max_send_sge = 1, .max_recv_sge = 1},
    };
    if (rdma_create_qp(p->id, p->pd, &attr) != 0)
        return fail("rdma_create_qp", errno);
    p->mr = ibv_reg_mr(p->pd, p->buf, sizeof(p->buf), IBV_ACCESS_LOCAL_WRITE);
    if (p->mr == NULL)
        return fail("ibv_reg_mr", errno);
    return 0;
}

/* Joins GROUP_IP; the event carries the group's address handle attributes. */
static int join(struct probe *p, const char *group_ip)
{
    struct sockaddr_in group;
    struct rdma_cm_event *ev;
    if (parse_addr(group_ip, &group) != 0)
        return -1;
    if (rdma_join_multicast(p->id, (struct sockaddr *)&group, NULL) != 0)
        return fail("rdma_join_multicast", errno);
    if (wait_cm_event(p, RDMA_CM_EVENT_MULTICAST_JOIN, &ev) != 0)
        return -1;
    p->remote_qpn = ev->param.ud.qp_num;
    p->remote_qkey = ev->param.ud.qkey;
    p->ah = ibv_create_ah(p->pd, &ev->param.ud.ah_attr);
    int err = errno;
    rdma_ack_cm_event(ev);
    if (p->ah == NULL)
        return fail("ibv_create_ah", err);
    printf("joined %s qpn 0x%" PRIx32 " qkey 0x%" PRIx32 "\n", group_ip, p->remote_qpn,
           p->remote_qkey);
    return 0;
}

/* Polls one completion until the deadline; 0 with *wc filled, else -1. */
static int poll_one(struct probe *p, struct ibv_wc *wc)
{
    while (now_ms() < p->deadline_ms) {
        int n = ibv_poll_cq(p->cq, 1, wc);
        if (n < 0)
            return fail("ibv_poll_cq", EIO);
        if (n == 1)
            return 0;
        sleep_ms(1);
    }
    return -1;
}

static int do_recv(struct probe *p, int count)
{
    for (int i = 0; i < count; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)(p->buf + (size_t)i * PROBE_SLOT),
                              .length = PROBE_SLOT,
                              .lkey = p->mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1};
        struct ibv_recv_wr *bad;
        if (ibv_post_recv(p->id->qp, &wr, &bad) != 0)
            return fail("ibv_post_recv", errno);
    }
    printf("ready\n");
    fflush(stdout);
    int got = 0;
    struct ibv_wc wc;
    while (got < count && poll_one(p, &wc) == 0) {
        char want[PROBE_MSG_SIZE];
        const char *msg = p->buf + wc.wr_id * PROBE_SLOT + PROBE_GRH_SIZE;
        snprintf(want, sizeof(want), "mcast %d", got);
        if (wc.status != IBV_WC_SUCCESS || strcmp(msg, want) != 0) {
            fprintf(stderr, "rdma_mcast_probe: receive %d: status %s, payload '%.20s'\n", got,
                    ibv_wc_status_str(wc.status), msg);
            break;
        }
        got++;
    }
    printf("received %d/%d\n", got, count);
    return got == count ? 0 : -1;
}

static int do_send(struct probe *p, int count)
{
    for (int i = 0; i < count; i++) {
        char *msg = p->buf + (size_t)i * PROBE_SLOT;
        snprintf(msg, PROBE_MSG_SIZE, "mcast %d", i);
        struct ibv_sge sge = {
            .addr = (uintptr_t)msg, .length = PROBE_MSG_SIZE, .lkey = p->mr->lkey};
        struct ibv_send_wr wr = {.wr_id = (uint64_t)i,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.wr.ud.ah = p->ah;
        wr.wr.ud.remote_qpn = p->remote_qpn;
        wr.wr.ud.remote_qkey = p->remote_qkey;
        struct ibv_send_wr *bad;
        if (ibv_post_send(p->id->qp, &wr, &bad) != 0)
            return fail("ibv_post_send", errno);
        struct ibv_wc wc;
        if (poll_one(p, &wc) != 0 || wc.status != IBV_WC_SUCCESS) {
            fprintf(stderr, "rdma_mcast_probe: send %d did not complete\n", i);
            return -1;
        }
        sleep_ms(10);
    }
    printf("sent %d\n", count);
    return 0;
}

int main(int argc, char **argv)
{
    static struct probe p; /* static: the buffer is 6 KiB, off the stack */
    if (argc != 6) {
        fprintf(stderr, "usage: rdma_mcast_probe recv|send BIND_IP GROUP_IP COUNT TIMEOUT_MS\n");
        return 2;
    }
    int count = atoi(argv[4]);
    int timeout_ms = atoi(argv[5]);
    if (count < 1 || count > PROBE_MAX_COUNT || timeout_ms < 1) {
        fprintf(stderr, "rdma_mcast_probe: COUNT must be 1..%d, TIMEOUT_MS positive\n",
                PROBE_MAX_COUNT);
        return 2;
    }
    int sending = strcmp(argv[1], "send") == 0;
    if (!sending && strcmp(argv[1], "recv") != 0) {
        fprintf(stderr, "rdma_mcast_probe: mode must be recv or send\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    p.deadline_ms = now_ms() + timeout_ms;
    int rc = setup(&p, argv[2], count);
    if (rc == 0)
        rc = join(&p, argv[3]);
    if (rc == 0)
        rc = sending ? do_send(&p, count) : do_recv(&p, count);
    /* Process exit releases the QP, group membership and device resources. */
    return rc == 0 ? 0 : 1;
}
