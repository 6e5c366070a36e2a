/*
 * fab_tcp_conn.c: the active side of a tcp-backend connection.
 *
 * The owner thread writes requests directly to the socket (one sendmsg per
 * post, or per batch with FAB_MORE) and parses responses when it polls; no
 * other thread touches the connection. Responses come back in posting order,
 * so the pending table of signaled operations is a FIFO: the response at
 * the head of the stream completes the oldest signaled request. An error
 * response for an unsignaled write is not in the FIFO (it carries no
 * FAB_SIGNALED flag) and poisons the connection.
 */
#include "fab_tcp.h"

#include "fk_error.h"
#include "fk_time.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <arpa/inet.h>
#include <unistd.h>

struct pending {
    uint64_t cookie;
    void *local; /* READ destination */
    uint32_t len;
    uint32_t op;
};

/* A FAB_MORE batch is sent once it would pass BATCH_BYTES or BATCH_IOV
 * pieces: 64 KiB is what a raw TCP stream writes per call, and on the
 * development VM a system call costs as much as copying several KiB, so
 * bandwidth-mode segments (8 KiB) go out seven to a sendmsg. Each post adds
 * at most two pieces (header, payload). */
#define BATCH_BYTES (64 * 1024)
#define BATCH_IOV   64

/* A send that the peer leaves in a full kernel buffer this long fails: the
 * peer's progress thread is not reading (connect_fd). Each connection to a
 * peer cut off costs its sender this once; a live peer that is only slow
 * still takes some bytes within it, and a send that moved any is not cut. */
#define FAB_TCP_SEND_STALL_US (500 * 1000)

/* Completions parsed while fab_call waited: at most every signaled op. */
#define STASH_MAX (FAB_CONN_DEPTH + 1)

struct tcp_conn {
    struct fab_conn base;
    int fd;
    int dead;     /* peer closed */
    int poisoned; /* remote access error seen */
    struct pending fifo[FAB_CONN_DEPTH];
    unsigned head, count;
    struct fab_wc stash[STASH_MAX];
    unsigned stash_head, stash_count;
    /* The FAB_MORE batch: one sendmsg for many posts. Headers and payloads
     * of unregistered memory are copied into sbuf; payloads in a registered
     * region (lmr given) are referenced in place (zero copy, fab.h), so a
     * batch of full bandwidth-mode segments costs no copy in user space. */
    struct iovec biov[BATCH_IOV];
    int biov_n;
    size_t bbytes;   /* bytes in the batch */
    size_t sbuf_len; /* bytes of sbuf the batch uses */
    uint8_t sbuf[16 * 1024];
    size_t rlen;
    uint8_t rbuf[FAB__TCP_IN_CAP];
};

/* TCP's retransmission timeout has a floor of 200 ms (RFC 6298 asks for
 * 1 s; Linux took 200 ms), made for the wide area: a lost packet of a
 * request/response exchange, with nothing behind it to trigger a fast
 * retransmit, waits it out. Between the hosts of one data centre a round
 * trip is tens of microseconds, and this fabric stands in for RDMA there,
 * whose reliable connections retransmit after the queue pair's timeout
 * (4.096 us x 2^timeout; milliseconds as commonly set). Under the fault
 * suite's 5% loss per drop point, most requests crossed a lost packet and
 * each loss cost 200 ms or more (two in a row, 600): a few hundred
 * operations in eight seconds, client joins timing out. Data centres run
 * TCP with a floor of a few milliseconds for the same reason (the route
 * option rto_min; Linux 6.15 made it a socket option, which an older
 * kernel refuses: the route's floor stays). 5 ms is well above any round
 * trip here, and the kernel's estimate adds the measured variance. */
#define FAB_TCP_RTO_MIN_US 5000
#ifndef TCP_RTO_MIN_US
#define TCP_RTO_MIN_US 45 /* Linux uapi (6.15): older libc headers lack it */
#endif

void fab__tcp_tune(int fd)
{
    int one = 1, rto = FAB_TCP_RTO_MIN_US;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* Refused below two jiffies (a kernel of HZ 100): its floor stays. */
    setsockopt(fd, IPPROTO_TCP, TCP_RTO_MIN_US, &rto, sizeof(rto));
}

/* A lost handshake packet costs TCP a second: its initial retransmission
 * timeout (RFC 6298 section 2.1), which no socket option lowers. Every
 * control call, attach and probe of the flows is a fresh connection, and
 * the callers' budgets are a second or less (a join must not block a
 * client for long), so under the fault suite's 5% loss about one connect
 * in five failed outright and its caller backed off for a second or more:
 * a client joined the leader seconds late. A connect that no answer
 * completes within FAB_TCP_SYN_RACE_NS gets company instead: another
 * socket's handshake, the next one twice as late, at most
 * FAB_TCP_SYN_RACE_MAX at once; the first to complete is the connection
 * and the others are closed (the listener sees a connection closed
 * unused, as it does a probe's). On a network that loses nothing the
 * first completes within a round trip and no second socket is made. */
#define FAB_TCP_SYN_RACE_NS  (100 * FK_NSEC_PER_MSEC)
#define FAB_TCP_SYN_RACE_MAX 5

/* Starts a non-blocking connect: 1 connected, 0 under way, FK_ error. */
static int start_connect(const struct sockaddr_in *sa, int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (*fd < 0)
        return -errno;
    fab__tcp_tune(*fd); /* before the handshake, whose sample sets the timeout */
    if (connect(*fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
        return 1;
    if (errno == EINPROGRESS)
        return 0;
    close(*fd);
    *fd = -1;
    return FK_EUNREACHABLE;
}

/* The racing handshakes of connect_fd: the descriptor of the first to
 * complete, FK_EUNREACHABLE once one is refused (the host answered: no
 * listener) or at the deadline. */
static int race_connect(const struct sockaddr_in *sa, uint64_t timeout_ns)
{
    struct pollfd pfd[FAB_TCP_SYN_RACE_MAX];
    int n = 0, won = -1, rc = 0;
    uint64_t now = fk_now_ns(), deadline = now + timeout_ns, next = now;
    uint64_t gap = FAB_TCP_SYN_RACE_NS;
    for (;;) {
        if (n < FAB_TCP_SYN_RACE_MAX && now >= next) {
            int fd, r = start_connect(sa, &fd);
            if (r < 0) {
                rc = r;
                break;
            }
            pfd[n++] = (struct pollfd){fd, POLLOUT, 0};
            if (r == 1) {
                won = n - 1;
                break;
            }
            next = now + gap;
            gap *= 2;
        }
        if (now >= deadline) {
            rc = FK_EUNREACHABLE;
            break;
        }
        uint64_t until = n < FAB_TCP_SYN_RACE_MAX && next < deadline ? next : deadline;
        int ms = (int)((until - now + FK_NSEC_PER_MSEC - 1) / FK_NSEC_PER_MSEC);
        if (poll(pfd, (nfds_t)n, ms) < 0 && errno != EINTR) {
            rc = -errno;
            break;
        }
        for (int i = 0; i < n && won < 0 && rc == 0; i++) {
            int err = 0;
            socklen_t el = sizeof(err);
            if (pfd[i].revents == 0)
                continue;
            if (getsockopt(pfd[i].fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0)
                rc = FK_EUNREACHABLE;
            else
                won = i;
        }
        if (won >= 0 || rc < 0)
            break;
        now = fk_now_ns();
    }
    for (int i = 0; i < n; i++)
        if (i != won)
            close(pfd[i].fd);
    return won >= 0 ? pfd[won].fd : rc;
}

static int connect_fd(const char *addr, uint64_t timeout_ns)
{
    char host[FAB_ADDR_MAX];
    uint16_t port;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (fab__parse_addr(addr, host, &port) < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return FK_EINVAL;
    sa.sin_port = htons(port);
    int fd = race_connect(&sa, timeout_ns);
    if (fd < 0)
        return fd;
    /* Blocking sends, bounded: the passive side's progress thread always
     * drains its socket, so a send blocks only while the kernel buffer is
     * full, and a peer that takes nothing for FAB_TCP_SEND_STALL_US is cut
     * off or stopped: the send fails and the connection is dead (send_all).
     * TCP would hold it for many minutes, and the sender with it: a
     * Multi-Paxos leader blocked on a follower behind a partition served
     * nothing until the partition healed. */
    struct timeval stall = {.tv_sec = 0, .tv_usec = FAB_TCP_SEND_STALL_US};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &stall, sizeof(stall));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

int fab__tcp_connect(fab_node *node, const char *addr, uint64_t timeout_ns, fab_conn **out)
{
    struct tcp_conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return FK_ENOMEM;
    c->fd = connect_fd(addr, timeout_ns);
    if (c->fd < 0) {
        int rc = c->fd;
        free(c);
        return rc;
    }
    c->base.node = node;
    *out = &c->base;
    return 0;
}

void fab__tcp_conn_close(fab_conn *bc)
{
    struct tcp_conn *c = (struct tcp_conn *)bc;
    close(c->fd);
    free(c);
}

static int send_all(struct tcp_conn *c, struct iovec *iov, int iovcnt)
{
    while (iovcnt > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            c->dead = 1;
            return FK_EUNREACHABLE;
        }
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

static int flush_batch(struct tcp_conn *c)
{
    if (c->biov_n == 0)
        return 0;
    int n = c->biov_n;
    c->biov_n = 0;
    c->bbytes = 0;
    c->sbuf_len = 0;
    return send_all(c, c->biov, n);
}

/* Appends n bytes to the batch, copied into sbuf (the caller checked the
 * room) or referenced in place. */
static void batch_add(struct tcp_conn *c, const void *p, size_t n, int copy)
{
    if (n == 0)
        return;
    struct iovec *last = c->biov_n > 0 ? &c->biov[c->biov_n - 1] : NULL;
    if (copy) {
        uint8_t *dst = c->sbuf + c->sbuf_len;
        memcpy(dst, p, n);
        c->sbuf_len += n;
        if (last != NULL && (uint8_t *)last->iov_base + last->iov_len == dst) {
            last->iov_len += n; /* contiguous with the previous copy */
            c->bbytes += n;
            return;
        }
        p = dst;
    }
    assert(c->biov_n < BATCH_IOV);
    c->biov[c->biov_n++] = (struct iovec){(void *)(uintptr_t)p, n};
    c->bbytes += n;
}

/* Sends header + payload now (with whatever is batched, in one sendmsg), or
 * appends them to the FAB_MORE batch. A payload is referenced instead of
 * copied when it is sent before we return (no FAB_MORE) or lies in a
 * registered region (zero copy: the caller keeps it until a later signaled
 * completion, fab.h), or when it is too large for sbuf (then sent now). */
static int transmit(struct tcp_conn *c, const struct fab__tcp_msg *m, const void *data, size_t len,
                    unsigned flags, int registered)
{
    int more = (flags & FAB_MORE) != 0;
    int ref = !more || registered || len > sizeof(c->sbuf) - sizeof(*m);
    size_t copy = sizeof(*m) + (ref ? 0 : len);
    if (c->sbuf_len + copy > sizeof(c->sbuf) || c->biov_n + 2 > BATCH_IOV ||
        (more && c->bbytes + sizeof(*m) + len > BATCH_BYTES)) {
        int rc = flush_batch(c);
        if (rc < 0)
            return rc;
    }
    batch_add(c, m, sizeof(*m), 1);
    batch_add(c, data, len, !ref);
    if (!more || (ref && !registered))
        return flush_batch(c);
    return 0;
}

int fab__tcp_post(fab_conn *bc, fab_mr *lmr, uint32_t op, void *local, size_t len, uint64_t raddr,
                  uint32_t rkey, uint64_t add, uint64_t cookie, unsigned flags)
{
    struct tcp_conn *c = (struct tcp_conn *)bc;
    if (c->poisoned)
        return FK_EPOISONED;
    if (c->dead)
        return FK_EUNREACHABLE;
    int signaled = (flags & FAB_SIGNALED) != 0;
    if (signaled && c->count == FAB_CONN_DEPTH)
        return FK_EAGAIN;
    struct fab__tcp_msg m = {.op = (uint8_t)op,
                             .flags = (uint8_t)(flags & FAB_SIGNALED),
                             .rkey = rkey,
                             .raddr = raddr,
                             .cookie = cookie,
                             .arg = op == FAB_OP_FAA ? add : (uint64_t)len};
    const void *payload = NULL;
    size_t plen = 0;
    if (op == FAB_OP_WRITE) {
        m.len = (uint32_t)len;
        payload = local;
        plen = len;
    }
    int rc = transmit(c, &m, payload, plen, flags, lmr != NULL);
    if (rc < 0)
        return rc;
    if (signaled) {
        struct pending *p = &c->fifo[(c->head + c->count) % FAB_CONN_DEPTH];
        *p = (struct pending){cookie, local, (uint32_t)len, op};
        c->count++;
    }
    return 0;
}

/* Reads whatever the socket has without blocking. Returns 0, or
 * FK_EUNREACHABLE when the peer closed. */
static int fill_rbuf(struct tcp_conn *c)
{
    if (c->dead)
        return FK_EUNREACHABLE;
    if (c->biov_n > 0 && flush_batch(c) < 0)
        return FK_EUNREACHABLE;
    ssize_t n = recv(c->fd, c->rbuf + c->rlen, sizeof(c->rbuf) - c->rlen, MSG_DONTWAIT);
    if (n > 0) {
        c->rlen += (size_t)n;
        return 0;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c->dead = 1;
        return FK_EUNREACHABLE;
    }
    return 0;
}

/* Parses one response at the head of rbuf. Returns 1 with *wc filled (and
 * *call set for a call response, whose payload is copied to resp), 0 when
 * incomplete. */
static int parse_one(struct tcp_conn *c, struct fab_wc *wc, int *call, void *resp, size_t cap,
                     int *call_len)
{
    struct fab__tcp_msg m;
    if (c->rlen < sizeof(m))
        return 0;
    memcpy(&m, c->rbuf, sizeof(m));
    if (c->rlen < sizeof(m) + m.len)
        return 0;
    uint32_t op = m.op & ~FAB__TCP_RESP;
    *wc = (struct fab_wc){m.cookie, m.status, op, m.arg};
    *call = op == FAB_OP_CALL;
    if (*call) {
        size_t n = m.len < cap ? m.len : cap;
        if (n > 0 && resp != NULL)
            memcpy(resp, c->rbuf + sizeof(m), n);
        *call_len = m.status < 0 ? m.status : (int)n;
    } else if (m.flags & FAB_SIGNALED) {
        assert(c->count > 0);
        struct pending *p = &c->fifo[c->head];
        assert(p->cookie == m.cookie && p->op == op);
        if (op == FAB_OP_READ && m.status == 0)
            memcpy(p->local, c->rbuf + sizeof(m), m.len < p->len ? m.len : p->len);
        c->head = (c->head + 1) % FAB_CONN_DEPTH;
        c->count--;
    }
    if (m.status < 0 && !*call)
        c->poisoned = 1;
    size_t used = sizeof(m) + m.len;
    memmove(c->rbuf, c->rbuf + used, c->rlen - used);
    c->rlen -= used;
    return 1;
}

int fab__tcp_poll(fab_conn *bc, struct fab_wc *wc, int max)
{
    struct tcp_conn *c = (struct tcp_conn *)bc;
    int got = 0;
    while (got < max && c->stash_count > 0) {
        wc[got++] = c->stash[c->stash_head];
        c->stash_head = (c->stash_head + 1) % STASH_MAX;
        c->stash_count--;
    }
    int rc = fill_rbuf(c);
    int call, call_len;
    while (got < max && parse_one(c, &wc[got], &call, NULL, 0, &call_len) == 1)
        if (!call)
            got++;
    if (got == 0 && rc < 0 && c->rlen == 0)
        return rc;
    return got;
}

static int has_completion(struct tcp_conn *c, int count_stash)
{
    struct fab__tcp_msg m;
    if (count_stash && c->stash_count > 0)
        return 1;
    if (c->rlen < sizeof(m))
        return 0;
    memcpy(&m, c->rbuf, sizeof(m));
    return c->rlen >= sizeof(m) + m.len;
}

/* Waits for input: spins on a non-blocking receive, then blocks in poll. */
static int wait_input(struct tcp_conn *c, uint64_t deadline, int count_stash)
{
    uint64_t start = fk_now_ns();
    for (unsigned i = 0;; i++) {
        int rc = fill_rbuf(c);
        if (has_completion(c, count_stash))
            return 0;
        if (rc < 0)
            return rc;
        if (fab__spin_phase(i, start) || fk_now_ns() >= deadline)
            break;
    }
    for (;;) {
        uint64_t now = fk_now_ns();
        if (now >= deadline)
            return FK_ETIMEDOUT;
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int ms = (int)((deadline - now + FK_NSEC_PER_MSEC - 1) / FK_NSEC_PER_MSEC);
        poll(&pfd, 1, ms);
        int rc = fill_rbuf(c);
        if (has_completion(c, count_stash))
            return 0;
        if (rc < 0)
            return rc;
    }
}

/* What arrived is read into rbuf (fab__tcp_poll parses it later); a
 * closed peer shows as EOF. */
int fab__tcp_conn_check(fab_conn *bc)
{
    struct tcp_conn *c = (struct tcp_conn *)bc;
    return fill_rbuf(c) < 0 ? FK_EUNREACHABLE : 0;
}

int fab__tcp_conn_wait(fab_conn *bc, uint64_t timeout_ns)
{
    struct tcp_conn *c = (struct tcp_conn *)bc;
    return wait_input(c, fk_now_ns() + timeout_ns, 1);
}

int fab__tcp_call(fab_conn *bc, const void *req, size_t len, void *resp, size_t cap,
                  uint64_t timeout_ns)
{
    struct tcp_conn *c = (struct tcp_conn *)bc;
    if (c->poisoned)
        return FK_EPOISONED;
    struct fab__tcp_msg m = {.op = FAB_OP_CALL, .len = (uint32_t)len};
    int rc = transmit(c, &m, req, len, 0, 0);
    if (rc < 0)
        return rc;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    for (;;) {
        struct fab_wc wc;
        int call, call_len = 0;
        while (parse_one(c, &wc, &call, resp, cap, &call_len) == 1) {
            if (call)
                return call_len;
            assert(c->stash_count < STASH_MAX);
            c->stash[(c->stash_head + c->stash_count) % STASH_MAX] = wc;
            c->stash_count++;
        }
        rc = wait_input(c, deadline, 0);
        if (rc < 0 && rc != FK_ETIMEDOUT)
            return rc;
        if (rc == FK_ETIMEDOUT) {
            /* The call may still be answered later: the connection can no
             * longer match responses, so it is poisoned. */
            c->poisoned = 1;
            return FK_ETIMEDOUT;
        }
    }
}
