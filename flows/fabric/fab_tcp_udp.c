/*
 * fab_tcp_udp.c: datagram endpoints and multicast for the tcp backend.
 *
 * An endpoint is a UDP socket owned by one thread (a UD queue pair in verbs
 * terms); joining a group adds a second socket bound to the group's port and
 * subscribed on the node's interface. When the network has no multicast
 * (probed at node creation, or FLOWKV_FAB_MCAST=0) a group send becomes one
 * unicast per member (DESIGN.md).
 *
 * The fault knob acts at the receiver, so each member of a group loses its
 * own datagrams independently, as with real loss: a datagram is dropped with
 * probability drop, or held back delay_ns with probability delay_p in a small
 * bounded queue (FAB__DELAY_MAX; when full it is delivered at once).
 */
#include "fab_tcp.h"

#include "fk_error.h"
#include "fk_time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <stdio.h>
#include <unistd.h>

#define FAB__DELAY_MAX 16

struct delayed {
    uint64_t due;
    uint32_t len;
    char from[FAB_ADDR_MAX];
    uint8_t data[FAB_DGRAM_MAX];
};

struct udp_ep {
    struct fab_ep base;
    int fd;
    int mfd; /* group socket, or -1 */
    int ndelayed;
    struct delayed delayed[FAB__DELAY_MAX];
};

static int to_sockaddr(const char *addr, struct sockaddr_in *sa)
{
    char host[FAB_ADDR_MAX];
    uint16_t port;
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    if (fab__parse_addr(addr, host, &port) < 0 || inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return FK_EINVAL;
    sa->sin_port = htons(port);
    return 0;
}

/* Receive buffers sized for a burst of every sender's credit window: UDP
 * on loopback drops when a slow receiver's buffer fills, and an ordered
 * flow reports each such loss as a GAP. SO_RCVBUFFORCE passes rmem_max
 * when privileged; otherwise the kernel caps SO_RCVBUF. */
#define FAB__UDP_RCVBUF (4 * 1024 * 1024)

static void size_rcvbuf(int fd)
{
    int v = FAB__UDP_RCVBUF;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
}

int fab__udp_probe_mcast(const char *host)
{
    struct in_addr ifa;
    if (inet_pton(AF_INET, host, &ifa) != 1)
        return 0;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct ip_mreq mr;
    inet_pton(AF_INET, "239.255.77.1", &mr.imr_multiaddr);
    mr.imr_interface = ifa;
    int ok = setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof(ifa)) == 0 &&
             setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof(mr)) == 0;
    close(fd);
    return ok;
}

int fab__udp_open(fab_node *node, fab_ep **out)
{
    struct udp_ep *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return FK_ENOMEM;
    e->mfd = -1;
    e->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa;
    char any[FAB_ADDR_MAX];
    snprintf(any, sizeof(any), "%s:1", fab__tcp_node_host(node));
    int rc = e->fd < 0 ? -errno : to_sockaddr(any, &sa);
    sa.sin_port = 0;
    if (rc == 0 && bind(e->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        rc = -errno;
    if (rc == 0)
        size_rcvbuf(e->fd);
    socklen_t sl = sizeof(sa);
    if (rc == 0 && getsockname(e->fd, (struct sockaddr *)&sa, &sl) < 0)
        rc = -errno;
    if (rc == 0 && node->has_mcast) {
        unsigned char loop = 1, ttl = 1;
        setsockopt(e->fd, IPPROTO_IP, IP_MULTICAST_IF, &sa.sin_addr, sizeof(sa.sin_addr));
        setsockopt(e->fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof(loop));
        setsockopt(e->fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof(ttl));
    }
    if (rc < 0) {
        if (e->fd >= 0)
            close(e->fd);
        free(e);
        return rc;
    }
    snprintf(e->base.addr, sizeof(e->base.addr), "%s:%u", fab__tcp_node_host(node),
             ntohs(sa.sin_port));
    e->base.node = node;
    e->base.rng = node->fault.seed ^ ((uint64_t)ntohs(sa.sin_port) * 0x9E3779B97F4A7C15ULL);
    if (e->base.rng == 0)
        e->base.rng = 1;
    *out = &e->base;
    return 0;
}

void fab__udp_close(fab_ep *be)
{
    struct udp_ep *e = (struct udp_ep *)be;
    close(e->fd);
    if (e->mfd >= 0)
        close(e->mfd);
    free(e);
}

int fab__udp_send(fab_ep *be, const char *addr, const void *buf, size_t len)
{
    struct udp_ep *e = (struct udp_ep *)be;
    struct sockaddr_in sa;
    if (to_sockaddr(addr, &sa) < 0)
        return FK_EINVAL;
    if (sendto(e->fd, buf, len, 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        /* A full socket buffer is loss, as on a real network. */
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
            return 0;
        return -errno;
    }
    return 0;
}

int fab__udp_join(fab_ep *be, const char *group)
{
    struct udp_ep *e = (struct udp_ep *)be;
    struct sockaddr_in sa;
    if (to_sockaddr(group, &sa) < 0 || !IN_MULTICAST(ntohl(sa.sin_addr.s_addr)) || e->mfd >= 0)
        return FK_EINVAL;
    if (!be->node->has_mcast)
        return -ENODEV;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    struct ip_mreq mr = {.imr_multiaddr = sa.sin_addr};
    inet_pton(AF_INET, fab__tcp_node_host(be->node), &mr.imr_interface);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof(mr)) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    size_rcvbuf(fd);
    e->mfd = fd;
    return 0;
}

int fab__udp_mcast_send(fab_ep *be, const char *group, const char *const *members, int n,
                        const void *buf, size_t len)
{
    if (be->node->has_mcast) {
        int rc = fab__udp_send(be, group, buf, len);
        return rc < 0 ? rc : 1;
    }
    for (int i = 0; i < n; i++) {
        int rc = fab__udp_send(be, members[i], buf, len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Returns the index of the earliest delayed datagram, or -1. */
static int earliest(const struct udp_ep *e)
{
    int best = -1;
    for (int i = 0; i < e->ndelayed; i++)
        if (best < 0 || e->delayed[i].due < e->delayed[best].due)
            best = i;
    return best;
}

static int deliver_delayed(struct udp_ep *e, int i, void *buf, size_t cap, char *from)
{
    struct delayed *d = &e->delayed[i];
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

/* Reads one datagram from fd and applies the fault knob. Returns its length,
 * 0 when it was dropped or delayed (or none was there), or an error. */
static int recv_one(struct udp_ep *e, int fd, void *buf, size_t cap, char *from)
{
    uint8_t tmp[FAB_DGRAM_MAX + 1];
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    ssize_t n = recvfrom(fd, tmp, sizeof(tmp), 0, (struct sockaddr *)&sa, &sl);
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -errno;
    char src[FAB_ADDR_MAX];
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    snprintf(src, sizeof(src), "%s:%u", ip, ntohs(sa.sin_port));
    const struct fab__fault *f = &e->base.node->fault;
    if (f->drop > 0 && fab__rand01(&e->base.rng) < f->drop)
        return 0;
    if (n > FAB_DGRAM_MAX)
        return FK_ETOOBIG;
    if (f->delay_p > 0 && e->ndelayed < FAB__DELAY_MAX && fab__rand01(&e->base.rng) < f->delay_p) {
        struct delayed *d = &e->delayed[e->ndelayed++];
        d->due = fk_now_ns() + f->delay_ns;
        d->len = (uint32_t)n;
        memcpy(d->from, src, sizeof(src));
        memcpy(d->data, tmp, (size_t)n);
        return 0;
    }
    if ((size_t)n > cap)
        return FK_ETOOBIG;
    memcpy(buf, tmp, (size_t)n);
    if (from != NULL)
        memcpy(from, src, FAB_ADDR_MAX);
    return n == 0 ? FK_EMALFORMED : (int)n;
}

int fab__udp_recv(fab_ep *be, void *buf, size_t cap, char *from, uint64_t timeout_ns)
{
    struct udp_ep *e = (struct udp_ep *)be;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    for (;;) {
        uint64_t now = fk_now_ns();
        int i = earliest(e);
        if (i >= 0 && e->delayed[i].due <= now)
            return deliver_delayed(e, i, buf, cap, from);
        int fds[2] = {e->fd, e->mfd};
        for (int k = 0; k < 2; k++) {
            if (fds[k] < 0)
                continue;
            int rc = recv_one(e, fds[k], buf, cap, from);
            if (rc != 0)
                return rc;
        }
        if (now >= deadline)
            return FK_ETIMEDOUT;
        uint64_t until = deadline;
        if (i >= 0 && e->delayed[i].due < until)
            until = e->delayed[i].due;
        struct pollfd pfd[2] = {{e->fd, POLLIN, 0}, {e->mfd, POLLIN, 0}};
        int ms = (int)((until - now + FK_NSEC_PER_MSEC - 1) / FK_NSEC_PER_MSEC);
        poll(pfd, e->mfd >= 0 ? 2 : 1, ms);
    }
}
