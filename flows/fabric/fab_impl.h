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
};

struct fab_node {
    const struct fab__ops *ops;
    char addr[FAB_ADDR_MAX];
    struct fab__fault fault;
    int has_mcast;
    fab_call_fn call_fn;
    fab_close_fn close_fn;
    void *handler_data;
    uint64_t registered; /* bytes, atomic */
};

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

extern const struct fab__ops fab__tcp_ops;
extern const struct fab__ops fab__verbs_ops; /* fab_verbs.c */

/* Resolves the fault knob from cfg and the environment. */
void fab__fault_init(struct fab__fault *f, const struct fab_config *cfg);
/* Draws a uniform double in [0, 1) from *state (xorshift64*). */
double fab__rand01(uint64_t *state);
/* Parses "a.b.c.d:port" into host (FAB_ADDR_MAX) and port; FK_EINVAL. */
int fab__parse_addr(const char *addr, char *host, uint16_t *port);

#endif /* FAB_IMPL_H */
