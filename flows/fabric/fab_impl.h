/*
 * fab_impl.h: the backend vtable behind fab.h (internal to flows/fabric).
 *
 * Each backend fills one struct fab__ops and embeds struct fab_node, fab_conn,
 * fab_mr and fab_ep as the first member of its own structs, the way rdma-core
 * drivers embed ibv_context in verbs_context. fab.c checks arguments common to
 * all backends and dispatches; a backend never sees a NULL handle.
 */
#ifndef FAB_IMPL_H
#define FAB_IMPL_H

#include "fab.h"
#include "fk_auth.h"

#include <stdint.h>

struct fab__ops {
    const char *name;
    int (*node_create)(const struct fab_config *cfg, fab_node **out);
    void (*node_destroy)(fab_node *node);
    int (*mr_reg)(fab_node *node, void *addr, size_t len, fab_mr **out);
    void (*mr_dereg)(fab_mr *mr);
    uint64_t (*doorbell)(fab_node *node);
    int (*wait)(fab_node *node, uint64_t seen, uint64_t timeout_ns);
    int (*connect)(fab_node *node, const char *addr, uint64_t timeout_ns, fab_conn **out);
    void (*conn_close)(fab_conn *conn);
    int (*post)(fab_conn *conn, fab_mr *lmr, uint32_t op, void *local, size_t len, uint64_t raddr,
                uint32_t rkey, uint64_t add, uint64_t cookie, unsigned flags);
    int (*poll)(fab_conn *conn, struct fab_wc *wc, int max);
    int (*conn_wait)(fab_conn *conn, uint64_t timeout_ns);
    int (*conn_check)(fab_conn *conn);
    int (*call)(fab_conn *conn, const void *req, size_t len, void *resp, size_t cap,
                uint64_t timeout_ns);
    int (*ep_open)(fab_node *node, fab_ep **out);
    void (*ep_close)(fab_ep *ep);
    int (*ep_send)(fab_ep *ep, const char *addr, const void *buf, size_t len);
    int (*ep_recv)(fab_ep *ep, void *buf, size_t cap, char *from, uint64_t timeout_ns);
    int (*ep_join)(fab_ep *ep, const char *group);
    int (*ep_mcast_send)(fab_ep *ep, const char *group, const char *const *members, int n,
                         const void *buf, size_t len);
};

/* Fault knob state (datagrams), resolved from config and environment. */
struct fab__fault {
    double drop;
    double delay_p;
    uint64_t delay_ns;
    uint64_t seed;
    uint64_t stall_ns; /* tcp: a waiter stalls this long before each loop pass */
};

struct fab_node {
    const struct fab__ops *ops;
    char addr[FAB_ADDR_MAX];
    char token[FAB_TOKEN_MAX + 1]; /* "" = an open node (no authentication) */
    struct fab__fault fault;
    int has_mcast;
    fab_call_fn call_fn;
    fab_close_fn close_fn;
    void *handler_data;
    uint32_t handlers_busy; /* handler invocations under way, atomic (fab.c) */
    uint64_t registered;    /* bytes, atomic */
};

/* A handler invocation: fab__handler_enter marks the node busy and loads
 * the handlers (either may be NULL); fab__handler_exit ends it. While any
 * invocation is under way, fab_node_set_handlers waits, so that after it
 * returns no old handler runs and its data may be freed. */
struct fab__handlers {
    fab_call_fn call;
    fab_close_fn close;
    void *data;
};
struct fab__handlers fab__handler_enter(fab_node *n);
void fab__handler_exit(fab_node *n);

struct fab_mr {
    fab_node *node;
    void *addr;
    size_t len;
    uint32_t key;
};

struct fab_conn {
    fab_node *node;
};

struct fab_ep {
    fab_node *node;
    char addr[FAB_ADDR_MAX];
    uint64_t rng; /* fault knob random state, per endpoint (owner thread) */
};

/* Authentication of one incoming connection (fab_auth.c; fab.h,
 * "Authentication"). Backends embed one per passive connection, zeroed. */
enum fab__auth_state {
    FAB__AUTH_NONE = 0,   /* nothing received yet: expects the dialer's nonce */
    FAB__AUTH_CHALLENGED, /* our nonce and proof sent: expects the dialer's proof */
    FAB__AUTH_OK,         /* proved: control messages go to the handler */
    FAB__AUTH_FAILED,     /* a bad or missing proof: refused for good */
};
struct fab__auth {
    uint8_t state; /* enum fab__auth_state */
    uint8_t own[FK_AUTH_NONCE], peer[FK_AUTH_NONCE];
};

/* Whether one-sided operations on a connection in state a may touch
 * registered memory: always on an open node, after the proof otherwise. */
static inline int fab__auth_ok(const fab_node *n, const struct fab__auth *a)
{
    return n->token[0] == '\0' || a->state == FAB__AUTH_OK;
}

/* Serves one control message of an incoming connection: the handshake
 * while a is not FAB__AUTH_OK, then the node's call handler. Returns as
 * fab_call_fn (bytes in resp, or a negative code for the caller). Sets
 * *granted to 1 when this message completed the proof, so that a backend
 * that enforces access in hardware opens it (verbs) before the response
 * goes out. Runs where the backend runs call handlers. */
int fab__serve_call(fab_node *n, struct fab__auth *a, uint64_t peer_id, const void *req, size_t len,
                    void *resp, size_t cap, int *granted);

/* The dialer's half of the handshake on a fresh connection, within
 * timeout_ns. 0, FK_EAUTH, or the error of fab_call. */
int fab__auth_dial(fab_conn *conn, uint64_t timeout_ns);

extern const struct fab__ops fab__tcp_ops;
extern const struct fab__ops fab__verbs_ops; /* fab_verbs.c */

/* Resolves the fault knob from cfg and the environment. */
void fab__fault_init(struct fab__fault *f, const struct fab_config *cfg);
/* What every backend's node_create does first, before it listens: the
 * fault knob and the token from cfg. */
void fab__node_base_init(fab_node *base, const struct fab_config *cfg);
/* Draws a uniform double in [0, 1) from *state (xorshift64*). */
double fab__rand01(uint64_t *state);
/* Parses "a.b.c.d:port" into host (FAB_ADDR_MAX) and port; FK_EINVAL. */
int fab__parse_addr(const char *addr, char *host, uint16_t *port);

#endif /* FAB_IMPL_H */
