/*
 * fab.h: the flowkv fabric, one small transport vtable under flows/.
 *
 * The fabric gives flows/ the operations of an RDMA NIC (DESIGN.md, "The
 * fabric"; DFI section 5): registered memory regions with keys, reliable
 * connections carrying one-sided write, read and 64-bit fetch-and-add into a
 * peer's registered memory, completions matched by a 64-bit cookie, small
 * two-sided request/response messages for the control plane, and unreliable
 * datagrams with multicast groups. A backend is chosen once, when a node is
 * created (STYLE.md point 2): "tcp" (sockets plus a per-node progress thread,
 * the "software NIC") or "verbs" (rdma-core; a later issue). Code above this
 * header is identical for every backend.
 *
 * Semantics every backend guarantees:
 *   - Operations posted on one connection are applied at the passive side in
 *     posting order. A write lands in increasing address order, and its last
 *     8 bytes, when 8-byte aligned, are stored with release semantics: a
 *     reader that loads that word with acquire (fab_load64) and sees the new
 *     value also sees every byte written before it on that connection. This
 *     is how a segment footer written after its payload (DFI section 5.1)
 *     works. Reads of an aligned 8-byte word are atomic acquire loads;
 *     fetch-and-add is atomic with respect to other fetch-and-adds and to
 *     fab_faa_local on the same word.
 *   - A posted operation with FAB_SIGNALED produces exactly one completion;
 *     without it, it produces a completion only on error (selective
 *     signaling, as with IBV_SEND_SIGNALED). Reads and fetch-and-adds are
 *     always signaled. At most FAB_CONN_DEPTH signaled operations may be
 *     outstanding per connection; a further post returns FK_EAGAIN.
 *   - A remote access error (unknown key, range outside the region, unaligned
 *     atomic) completes with FK_EPROTO and moves the connection to an error
 *     state, as an RC queue pair would: later posts return FK_EPOISONED.
 *   - Datagrams are unreliable: lost, delayed or reordered, never corrupted.
 *
 * Backend choice: fab_config.backend, or FAB_BACKEND_AUTO which reads the
 * FLOWKV_FABRIC environment variable (tcp|verbs|auto); auto picks verbs when
 * a usable RDMA device exists, else tcp (logged once per process).
 * Fault knob (datagrams only, for tests): FLOWKV_FAB_DROP=<probability>,
 * FLOWKV_FAB_DELAY_US=<microseconds> with FLOWKV_FAB_DELAY_P=<probability>
 * (default 1 when a delay is set); fab_config fields override the variables.
 * FLOWKV_FAB_STALL_US=<microseconds> (tcp, for tests): a thread waiting in
 * fab_node_wait sleeps that long before each pass of the event loop, as a
 * thread preempted there would.
 *
 * Authentication. A node created with a token (fab_config.token, the
 * cluster's shared secret) serves an incoming connection only after the
 * dialer proved it knows the token, and proves it back (common/fk_auth.h:
 * a mutual HMAC challenge-response, two control messages that fab_connect
 * sends before it returns). Until then every control message is answered
 * FK_EAUTH and every one-sided operation fails as a remote access error
 * (tcp: the software NIC refuses it; verbs: the queue pair is accepted
 * without remote access rights and granted them only after the proof), so
 * a stranger can neither read nor write registered memory nor reach the
 * flows control plane. fab_connect from a node with a token fails with
 * FK_EAUTH when the listener does not prove the same token (or has none).
 * Datagram endpoints (fab_ep) are not authenticated: flowkv's service
 * flows never use them.
 *
 * Threads: a node may be used from any thread. A connection (fab_conn) and a
 * datagram endpoint (fab_ep) belong to the thread that uses them; no two
 * threads may call functions on the same one at the same time (DFI's
 * thread-centric model: no locks on the data path).
 */
#ifndef FAB_H
#define FAB_H

#include <stddef.h>
#include <stdint.h>

/* Most signaled operations outstanding per connection (the send queue). */
#define FAB_CONN_DEPTH 64
/* Largest one-sided read (bytes): flows read only counters and footers. */
#define FAB_READ_MAX 256
/* Largest control message, request or response (bytes). */
#define FAB_MSG_MAX 4096
/* Largest datagram payload (bytes): one UDP packet on loopback or a UD MTU. */
#define FAB_DGRAM_MAX 4096
/* Longest address string, "a.b.c.d:port" and its terminator. */
#define FAB_ADDR_MAX 48
/* Longest cluster token (bytes, without the terminator). */
#define FAB_TOKEN_MAX 127

enum fab_backend {
    FAB_BACKEND_AUTO = 0,
    FAB_BACKEND_TCP = 1,
    FAB_BACKEND_VERBS = 2,
};

struct fab_config {
    enum fab_backend backend; /* AUTO reads FLOWKV_FABRIC */
    const char *host;         /* IPv4 address to bind; NULL = "127.0.0.1" */
    uint16_t port;            /* 0 = ephemeral */
    double drop;              /* datagram drop probability; < 0 = environment */
    double delay_p;           /* probability a datagram is delayed; < 0 = environment */
    uint64_t delay_ns;        /* delay applied to those datagrams */
    uint64_t seed;            /* fault knob random seed; 0 = from pid and time */
    const char *device;       /* verbs: RDMA device name; NULL = FLOWKV_RDMA_DEVICE, else the
                                 device that owns host (or the first active one) */
    const char *token;        /* cluster token, 1..FAB_TOKEN_MAX chars; NULL or "" = an open
                                 node (tests, benchmarks): see "Authentication" above */
};

/* Fills cfg with defaults: AUTO backend, 127.0.0.1, ephemeral port, fault
 * knob from the environment. */
void fab_config_default(struct fab_config *cfg);

typedef struct fab_node fab_node;
typedef struct fab_conn fab_conn;
typedef struct fab_mr fab_mr;
typedef struct fab_ep fab_ep;

enum fab_op {
    FAB_OP_WRITE = 1,
    FAB_OP_READ = 2,
    FAB_OP_FAA = 3,
    FAB_OP_CALL = 4,
};

/* One completion (a work completion in verbs terms). */
struct fab_wc {
    uint64_t cookie; /* as posted */
    int status;      /* 0, or FK_EPROTO / FK_EUNREACHABLE / -errno */
    uint32_t op;     /* enum fab_op */
    uint64_t value;  /* FAA: the word's value before the add */
};

/* Post flags. */
#define FAB_SIGNALED 1u /* produce a completion on success too */
/* More posts follow: the backend may batch (a WR list) and hold the post
 * until the next post without FAB_MORE or the next fab_poll, fab_conn_wait
 * or fab_call on the connection, which send what is held. */
#define FAB_MORE 2u

/* A remote region as the passive side describes it to the active side. */
struct fab_rkey {
    uint64_t addr; /* remote virtual address of the region's first byte */
    uint64_t len;
    uint32_t key;
};

/* ---- node ---------------------------------------------------------------- */

/* Handler for control messages (fab_call) arriving at a node. Runs on the
 * node's progress thread, or (tcp backend) on a thread blocked in
 * fab_node_wait that runs the node's event loop meanwhile; one at a time;
 * must not block. req is valid during the call;
 * writes at most cap bytes to resp and returns their number, or a negative
 * code that fab_call returns to the caller. peer_id names the connection
 * (unique per node, never reused) so the handler can tie state to it. */
typedef int (*fab_call_fn)(void *data, uint64_t peer_id, const void *req, size_t len, void *resp,
                           size_t cap);
/* Called like fab_call_fn, one at a time, when an incoming connection
 * closes (the peer closed it or its process died), after its last
 * operation applied. */
typedef void (*fab_close_fn)(void *data, uint64_t peer_id);

/* Creates a node: binds host:port, starts the backend (for tcp, its progress
 * thread). *out is owned by the caller until fab_node_destroy.
 * Errors: FK_EINVAL (bad config), FK_ENODEV (verbs asked, none usable),
 * FK_ECONFIG (bad FLOWKV_FABRIC), -errno from socket calls, FK_ENOMEM.
 * Any thread. */
int fab_node_create(const struct fab_config *cfg, fab_node **out);

/* Stops the node, closes every connection and endpoint it has, frees it.
 * Regions must have been deregistered. Any thread but the progress thread. */
void fab_node_destroy(fab_node *node);

/* The node's address ("127.0.0.1:40123"), valid until destroy. */
const char *fab_node_addr(const fab_node *node);

/* The backend's name: "tcp" or "verbs". */
const char *fab_node_backend(const fab_node *node);

/* Installs the control message and close handlers (NULL to remove). Call
 * before peers connect; any thread but one running a handler of this node.
 * Returns only once no invocation of the previous handlers is under way
 * (it waits for the progress thread to finish one), so the caller may then
 * free what the old handlers use, such as memory regions they look up. */
void fab_node_set_handlers(fab_node *node, fab_call_fn call, fab_close_fn on_close, void *data);

/* ---- memory ---------------------------------------------------------------- */

/* Registers [addr, addr+len) for remote write, read and fetch-and-add. The
 * memory stays owned by the caller and must outlive the region. *out is
 * valid until fab_mr_dereg. Errors: FK_EINVAL (NULL, len 0), FK_ENOMEM
 * (region table full, FAB_MR_MAX: a ring per attached source of a
 * target, so a few per client of a service). Any thread. */
#define FAB_MR_MAX 16384
int fab_mr_reg(fab_node *node, void *addr, size_t len, fab_mr **out);

/* Deregisters: after return no remote operation touches the memory. */
void fab_mr_dereg(fab_mr *mr);

/* The description a peer needs to access the region. */
struct fab_rkey fab_mr_rkey(const fab_mr *mr);

/* Bytes currently registered on the node (DESIGN.md: memory per node). */
uint64_t fab_node_registered_bytes(const fab_node *node);

/* Loads an aligned 8-byte word of registered memory with acquire semantics
 * (pairs with the release store of a write's last word). */
static inline uint64_t fab_load64(const volatile void *p)
{
    return __atomic_load_n((const volatile uint64_t *)p, __ATOMIC_ACQUIRE);
}
/* Stores an aligned 8-byte word of registered memory with release semantics,
 * for the owner's own updates that a remote read may observe. */
static inline void fab_store64(volatile void *p, uint64_t v)
{
    __atomic_store_n((volatile uint64_t *)p, v, __ATOMIC_RELEASE);
}

/* A counter the backend bumps after applying remote writes, so a thread that
 * waits for registered memory to change can block instead of spinning
 * (adaptive waiting). Read it, check memory, then fab_node_wait(seen). */
uint64_t fab_node_doorbell(fab_node *node);
/* Spins briefly, then blocks until the doorbell differs from seen or
 * timeout_ns passes. Returns 0 when it changed, FK_ETIMEDOUT. The verbs
 * backend, whose remote writes raise no event, may also return 0 early
 * while it spins, so callers re-check memory after every return. Any
 * thread. */
int fab_node_wait(fab_node *node, uint64_t seen, uint64_t timeout_ns);

/* ---- connections and one-sided operations ---------------------------------- */

/* Connects to the node at addr ("host:port"). Blocks up to timeout_ns
 * (with a token: connection and authentication together).
 * Errors: FK_EINVAL (bad address), FK_EUNREACHABLE (refused or timed out),
 * FK_EAUTH (this node has a token and the peer did not prove it),
 * FK_ENOMEM. The connection belongs to the calling thread afterwards. */
int fab_connect(fab_node *node, const char *addr, uint64_t timeout_ns, fab_conn **out);

/* Closes the connection; outstanding operations are abandoned (the passive
 * side still applies what it already received). Owner thread. */
void fab_conn_close(fab_conn *conn);

/* One-sided write of len bytes from local to the peer's region at raddr.
 * lmr is the caller's registered region that holds local (verbs needs its
 * lkey; NULL lets the backend copy through its own registered bounce buffer).
 * With lmr NULL the tcp backend copies local before returning; with lmr
 * given and FAB_MORE it may send local in place later (zero copy). A
 * backend with zero-copy sends owns local until the next signaled
 * completion on this connection, so callers reuse a buffer only after a
 * signaled completion that follows it (DFI's one completion check per ring
 * wrap).
 * Errors: FK_EAGAIN (FAB_CONN_DEPTH signaled ops outstanding: poll first),
 * FK_EPOISONED (connection in error), FK_EUNREACHABLE (peer gone), FK_EINVAL.
 * Owner thread. */
int fab_post_write(fab_conn *conn, fab_mr *lmr, const void *local, size_t len, uint64_t raddr,
                   uint32_t rkey, uint64_t cookie, unsigned flags);

/* One-sided read of len <= FAB_READ_MAX bytes at raddr into local, which lies
 * in the registered region lmr (NULL: any memory, copied by the backend). local
 * belongs to the fabric until the completion with this cookie is polled
 * (STYLE.md point 9). Always signaled. Errors as fab_post_write. */
int fab_post_read(fab_conn *conn, fab_mr *lmr, void *local, size_t len, uint64_t raddr,
                  uint32_t rkey, uint64_t cookie, unsigned flags);

/* Atomic fetch-and-add of add to the aligned 8-byte word at raddr; the old
 * value arrives in the completion's value. Always signaled. */
int fab_post_faa(fab_conn *conn, uint64_t raddr, uint32_t rkey, uint64_t add, uint64_t cookie,
                 unsigned flags);

/* Moves up to max completions into wc without blocking; returns how many
 * (0 when none) or FK_EUNREACHABLE when the peer closed and nothing is left.
 * Owner thread. */
int fab_poll(fab_conn *conn, struct fab_wc *wc, int max);

/* Waits (spin, then block) until a completion is ready or timeout_ns passes.
 * Returns 0 or FK_ETIMEDOUT, FK_EUNREACHABLE. Owner thread. */
int fab_conn_wait(fab_conn *conn, uint64_t timeout_ns);

/* Whether the peer is still there, without posting anything: 0, or
 * FK_EUNREACHABLE once the connection is known dead (tcp: the peer's
 * socket closed, which the first write after a peer's exit does not see;
 * verbs: rdma_cm reported it disconnected, which fab_poll looks at only
 * now and then). A system call or two. Owner thread. */
int fab_conn_check(fab_conn *conn);

/* Sends a control message and waits for the peer handler's response: returns
 * its length (copied into resp, at most cap bytes) or the handler's negative
 * code, FK_ETIMEDOUT, FK_ETOOBIG (len > FAB_MSG_MAX), FK_EUNREACHABLE.
 * Completions of other operations that arrive meanwhile are kept for
 * fab_poll. Owner thread. */
int fab_call(fab_conn *conn, const void *req, size_t len, void *resp, size_t cap,
             uint64_t timeout_ns);

/* ---- datagrams and multicast ------------------------------------------------ */

/* Opens a datagram endpoint (a UD queue pair) on node. Its address is
 * fab_ep_addr(). Errors: -errno, FK_ENOMEM. The endpoint belongs to the
 * calling thread. */
int fab_ep_open(fab_node *node, fab_ep **out);
void fab_ep_close(fab_ep *ep);
const char *fab_ep_addr(const fab_ep *ep);

/* Sends one datagram of len <= FAB_DGRAM_MAX bytes to the endpoint at addr.
 * The fault knob may drop it silently. Errors: FK_ETOOBIG, FK_EINVAL,
 * -errno. Owner thread. */
int fab_ep_send(fab_ep *ep, const char *addr, const void *buf, size_t len);

/* Receives one datagram into buf (cap bytes), waiting up to timeout_ns (0 =
 * poll once). Returns its length; writes the sender's address to from when
 * not NULL (FAB_ADDR_MAX bytes). Errors: FK_ETIMEDOUT, FK_ETOOBIG (the
 * datagram did not fit; it is dropped), -errno. Owner thread. */
int fab_ep_recv(fab_ep *ep, void *buf, size_t cap, char *from, uint64_t timeout_ns);

/* Joins the multicast group ("239.x.y.z:port"): datagrams sent to the group
 * arrive at this endpoint through fab_ep_recv. Errors: FK_EINVAL, -errno
 * (multicast not available: the sender side then uses unicast). */
int fab_ep_mcast_join(fab_ep *ep, const char *group);

/* Sends one datagram to every member of group. members lists the members'
 * endpoint addresses: used when the network has no multicast (one unicast
 * per member, DESIGN.md) and ignored otherwise. Returns 1 when sent by
 * multicast, 0 when by unicasts, or an error as fab_ep_send. */
int fab_ep_mcast_send(fab_ep *ep, const char *group, const char *const *members, int n,
                      const void *buf, size_t len);

/* Whether multicast works on this node's network (probed at create;
 * FLOWKV_FAB_MCAST=0 forces unicast fallback). */
int fab_node_has_mcast(const fab_node *node);

/* ---- counters (verbs backend; proof that bytes went through RDMA) ---------- */

/* Work requests posted per opcode and completions seen, since the node was
 * created. The tcp backend has no work requests: every field is 0. With
 * FLOWKV_FAB_COUNTERS=<file> set, a verbs node appends one line
 * "fab-counters: pid=... addr=... write=... read=... faa=... ..." to that
 * file when it is destroyed (tests/rdma-vm sums them). */
struct fab_counters {
    uint64_t write;         /* RDMA WRITE work requests posted */
    uint64_t write_inline;  /* ... of which IBV_SEND_INLINE */
    uint64_t read;          /* RDMA READ */
    uint64_t faa;           /* ATOMIC_FETCH_AND_ADD */
    uint64_t send;          /* SEND (control messages, both directions) */
    uint64_t recv;          /* RECV completions (control messages) */
    uint64_t completion;    /* send-queue completions polled */
    uint64_t error;         /* completions with an error status */
    uint64_t dgram_send;    /* UD SENDs (datagrams, unicast) */
    uint64_t dgram_recv;    /* UD RECV completions */
    uint64_t mcast_send;    /* UD SENDs to a multicast group */
    uint64_t connect;       /* RC connections established (active side) */
    uint64_t connect_retry; /* connection attempts retried after back-off */
};

/* Copies the node's counters into out. Any thread. */
void fab_node_counters(const fab_node *node, struct fab_counters *out);

#endif /* FAB_H */
