/*
 * fab_tcp.h: shared internals of the tcp backend (internal to flows/fabric).
 *
 * The tcp backend is a software NIC. Each node runs one progress thread on a
 * libuv loop that accepts connections, reads requests and applies one-sided
 * operations to registered memory (fab_tcp.c). The active side of a
 * connection needs no thread: the owner thread writes requests straight to
 * its socket and reads responses when it polls (fab_tcp_conn.c); a plain
 * sendmsg/recv there is one system call on the hot path where a hand-off to
 * the loop thread would cost a wake-up. Datagrams are UDP sockets owned by
 * their thread (fab_tcp_udp.c).
 */
#ifndef FAB_TCP_H
#define FAB_TCP_H

#include "fab_impl.h"

#include <stdint.h>

/* Wire header of every request and response on a connection. */
struct fab__tcp_msg {
    uint8_t op;    /* enum fab_op; responses have FAB__TCP_RESP set */
    uint8_t flags; /* FAB_SIGNALED */
    uint16_t pad;
    uint32_t rkey;
    int32_t status; /* responses: 0 or an error code */
    uint32_t len;   /* payload bytes that follow (write, call, read/call response) */
    uint64_t raddr;
    uint64_t cookie;
    uint64_t arg; /* FAA: the addend; FAA response: the old value; READ: length */
};
_Static_assert(sizeof(struct fab__tcp_msg) == 40, "tcp wire header is 40 bytes");

#define FAB__TCP_RESP 0x80u

/* Bytes the passive side may have to buffer for responses on one
 * connection: FAB_CONN_DEPTH signaled responses with read data, one call
 * response, one error response for an unsignaled op:
 * 64 * (40 + 256) + (40 + 4096) + 40 = 23120 bytes. */
#define FAB__TCP_OUT_CAP                                                                           \
    (FAB_CONN_DEPTH * (sizeof(struct fab__tcp_msg) + FAB_READ_MAX) +                               \
     (sizeof(struct fab__tcp_msg) + FAB_MSG_MAX) + sizeof(struct fab__tcp_msg))
/* Input buffer per connection on either side (64 KiB: one socket read). */
#define FAB__TCP_IN_CAP (64 * 1024)
_Static_assert(FAB__TCP_IN_CAP >= FAB__TCP_OUT_CAP, "a response burst fits one input buffer");

/* Active side (fab_tcp_conn.c). */
int fab__tcp_connect(fab_node *node, const char *addr, uint64_t timeout_ns, fab_conn **out);
/* Sets the options every fabric socket has, either side: no Nagle delay,
 * and TCP's minimum retransmission timeout at FAB_TCP_RTO_MIN_US where the
 * kernel lets a socket set it (fab_tcp_conn.c says why). */
void fab__tcp_tune(int fd);
void fab__tcp_conn_close(fab_conn *conn);
int fab__tcp_post(fab_conn *conn, fab_mr *lmr, uint32_t op, void *local, size_t len, uint64_t raddr,
                  uint32_t rkey, uint64_t add, uint64_t cookie, unsigned flags);
int fab__tcp_poll(fab_conn *conn, struct fab_wc *wc, int max);
int fab__tcp_conn_wait(fab_conn *conn, uint64_t timeout_ns);
int fab__tcp_conn_check(fab_conn *conn);
int fab__tcp_call(fab_conn *conn, const void *req, size_t len, void *resp, size_t cap,
                  uint64_t timeout_ns);

/* Datagrams (fab_tcp_udp.c). */
int fab__udp_probe_mcast(const char *host);
int fab__udp_open(fab_node *node, fab_ep **out);
void fab__udp_close(fab_ep *ep);
int fab__udp_send(fab_ep *ep, const char *addr, const void *buf, size_t len);
int fab__udp_recv(fab_ep *ep, void *buf, size_t cap, char *from, uint64_t timeout_ns);
int fab__udp_join(fab_ep *ep, const char *group);
int fab__udp_mcast_send(fab_ep *ep, const char *group, const char *const *members, int n,
                        const void *buf, size_t len);

/* The host part of the node's address (for binding endpoints). */
const char *fab__tcp_node_host(const fab_node *node);

/* One step of the first phase of adaptive waiting: spins briefly, then
 * yields, for a bounded time since start_ns. iter counts calls; returns 1
 * when the caller should now block instead. */
int fab__spin_phase(unsigned iter, uint64_t start_ns);

#endif /* FAB_TCP_H */
