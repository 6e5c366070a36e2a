/*
 * fab_verbs.h: shared internals of the verbs backend (internal to
 * flows/fabric).
 *
 * The verbs backend runs the fabric contract of fab.h on rdma-core:
 *   fab_verbs.c       device selection, the node (protection domain,
 *                     listener, progress thread for control messages),
 *                     memory registration, doorbell and waiting, counters;
 *   fab_verbs_conn.c  the active side of an RC connection: one-sided WRITE,
 *                     READ, FETCH_AND_ADD, selective signaling, completions,
 *                     control calls, error handling;
 *   fab_verbs_ud.c    UD endpoints for datagrams and multicast groups.
 *
 * Connections are made with librdmacm (RDMA_PS_TCP, RC queue pairs): the
 * address "a.b.c.d:port" of a node is its rdma_cm listener, so flows/ passes
 * the same address strings on both backends. Control messages (fab_call)
 * travel as SEND/RECV on the connection's own RC queue pair: one request
 * and one response buffer per connection, handled on the passive side by
 * the node's progress thread, like the tcp backend's software NIC.
 */
#ifndef FAB_VERBS_H
#define FAB_VERBS_H

#include "fab_impl.h"

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Send queue of an RC connection, in work requests: FAB_CONN_DEPTH caller-
 * signaled operations, up to VB_UNSIG_MAX unsignaled writes between two
 * signaled ones, and one control message; 256 covers 64 + 4 * 32 + 1 with
 * room for batches. A power of two: slot = wr_id % VB_SQ_WR. */
#define VB_SQ_WR 256
/* At most this many unsignaled work requests in a row: the next one is
 * signaled by the backend (not reported to the caller) so that completed
 * send-queue slots are reclaimed before the queue overflows (selective
 * signaling, ibv_post_send(3); DFI section 5.3). */
#define VB_UNSIG_MAX 32
/* Work requests gathered by FAB_MORE before one ibv_post_send. */
#define VB_BATCH_MAX 16
/* Bounce ring for writes whose local buffer is in no region (lmr NULL) and
 * too large to send inline: 512 KiB per connection, freed as signaled
 * completions retire the writes that used it. */
#define VB_WRING_BYTES (512u * 1024u)
/* Bytes of a control message on the wire: an 8-byte header, then the
 * payload (FAB_MSG_MAX). */
#define VB_MSG_HDR   8
#define VB_MSG_BYTES (VB_MSG_HDR + FAB_MSG_MAX)
/* Inline data asked of each RC queue pair (rxe and ConnectX allow more; the
 * device's answer from ibv_create_qp is what counts). */
#define VB_INLINE_WANT 256
/* UDP qkey librdmacm uses for UD ids and multicast groups (RDMA_UDP_QKEY). */
#define VB_QKEY 0x01234567u
_Static_assert((VB_SQ_WR & (VB_SQ_WR - 1)) == 0, "VB_SQ_WR is a power of two");
_Static_assert(FAB_CONN_DEPTH + 4 * VB_UNSIG_MAX + VB_BATCH_MAX + 1 <= VB_SQ_WR,
               "the send queue holds every outstanding work request");

/* Work request and completion counters (enum order = struct fab_counters
 * field order in fab.h). */
enum vb_ctr {
    VB_C_WRITE,
    VB_C_WRITE_INLINE,
    VB_C_READ,
    VB_C_FAA,
    VB_C_SEND,
    VB_C_RECV,
    VB_C_COMPLETION,
    VB_C_ERROR,
    VB_C_DGRAM_SEND,
    VB_C_DGRAM_RECV,
    VB_C_MCAST_SEND,
    VB_C_CONNECT,
    VB_C_CONNECT_RETRY,
    VB_C_MAX
};

struct vb_peer;

struct vb_node {
    struct fab_node base;
    struct ibv_context *ctx; /* the selected device, opened by this node */
    char dev_name[64];
    struct ibv_pd *pd;
    uint8_t port;
    int gid_index;      /* the RoCE GID carrying the node's IPv4 address */
    uint32_t dgram_max; /* UD payload limit: the port's active MTU */
    uint32_t rd_atom;   /* reads and atomics in flight per QP (device limit) */
    struct in_addr ip;  /* the node's IPv4 address */
    char host[INET_ADDRSTRLEN];
    struct rdma_event_channel *cm_ch; /* the listener and its passive ids */
    struct rdma_cm_id *listen;
    struct ibv_comp_channel *pch; /* passive side: control message CQ */
    struct ibv_cq *pcq;
    int stop_fd; /* eventfd that stops the progress thread */
    pthread_t thread;
    struct vb_peer *peers; /* progress thread only */
    uint64_t next_peer_id;
    uint32_t bell; /* futex word: bumped by the progress thread */
    uint32_t waiters;
    int nmr;                /* regions registered, atomic */
    uint64_t ctr[VB_C_MAX]; /* atomic, relaxed */
};

static inline void vb_count(struct vb_node *n, enum vb_ctr c, uint64_t k)
{
    __atomic_fetch_add(&n->ctr[c], k, __ATOMIC_RELAXED);
}

/* ---- device selection (fab_verbs.c) ------------------------------------------ */

/* Picks a device: the one named want (NULL or "" = the first with an active
 * port). names/active describe the n devices found. Returns its index, or
 * FK_ENODEV with a message in msg (cap bytes) that names what was found.
 * Pure; any thread. */
int fab__verbs_select(const char *want, const char *const *names, const int *active, int n,
                      char *msg, size_t cap);

/* Whether a usable RDMA device exists (for FAB_BACKEND_AUTO); when not,
 * why is filled (cap bytes). Any thread. */
int fab__verbs_probe(char *why, size_t cap);

struct rdma_cm_id;
/* Whether an rdma_cm id resolved to the node's device (by name: the node's
 * context is its own, not librdmacm's). */
int fab__verbs_same_device(const struct vb_node *n, const struct rdma_cm_id *id);
/* Moves qp to state with rdma_init_qp_attr's attributes for id (the
 * node's reads/atomics in flight; remote write, read and atomic access
 * when remote is 1, none when 0). Returns 0 or -errno. */
int fab__verbs_qp_to(const struct vb_node *n, struct rdma_cm_id *id, struct ibv_qp *qp,
                     enum ibv_qp_state state, int remote);

/* The local key of a region (for a work request's scatter/gather entry). */
uint32_t fab__verbs_lkey(const fab_mr *mr);

/* Copies the node's counters into out (struct fab_counters). */
void fab__verbs_counters(const fab_node *node, struct fab_counters *out);

/* ---- shared helpers ------------------------------------------------------------- */

/* Parses "a.b.c.d:N" with N <= max into ip and *num; FK_EINVAL. */
int fab__verbs_parse(const char *addr, struct in_addr *ip, uint32_t *num, uint32_t max);
/* Maps a work completion status to an fk error code. */
int fab__verbs_wc_error(enum ibv_wc_status st);
/* Adaptive waiting, first phase: bounded spin then yields; returns 1 when the
 * caller should block now. */
int fab__verbs_spin(unsigned iter);

/* ---- active side (fab_verbs_conn.c) ---------------------------------------------- */

int fab__verbs_connect(fab_node *node, const char *addr, uint64_t timeout_ns, fab_conn **out);
void fab__verbs_conn_close(fab_conn *conn);
int fab__verbs_post(fab_conn *conn, fab_mr *lmr, uint32_t op, void *local, size_t len,
                    uint64_t raddr, uint32_t rkey, uint64_t add, uint64_t cookie, unsigned flags);
int fab__verbs_poll(fab_conn *conn, struct fab_wc *wc, int max);
int fab__verbs_conn_wait(fab_conn *conn, uint64_t timeout_ns);
int fab__verbs_conn_check(fab_conn *conn);
int fab__verbs_call(fab_conn *conn, const void *req, size_t len, void *resp, size_t cap,
                    uint64_t timeout_ns);

/* ---- datagrams (fab_verbs_ud.c) ---------------------------------------------------- */

int fab__verbs_ep_open(fab_node *node, fab_ep **out);
void fab__verbs_ep_close(fab_ep *ep);
int fab__verbs_ep_send(fab_ep *ep, const char *addr, const void *buf, size_t len);
int fab__verbs_ep_recv(fab_ep *ep, void *buf, size_t cap, char *from, uint64_t timeout_ns);
int fab__verbs_ep_join(fab_ep *ep, const char *group);
int fab__verbs_ep_mcast_send(fab_ep *ep, const char *group, const char *const *members, int n,
                             const void *buf, size_t len);

#endif /* FAB_VERBS_H */
