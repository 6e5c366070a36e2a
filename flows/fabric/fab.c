/*
 * fab.c: backend selection, argument checks and dispatch for fab.h.
 */
#include "fab_impl.h"
#include "fab_verbs.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

void fab_config_default(struct fab_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->backend = FAB_BACKEND_AUTO;
    cfg->host = NULL;
    cfg->drop = -1;
    cfg->delay_p = -1;
}

static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    char *end;
    double d = strtod(v, &end);
    return *end == '\0' ? d : dflt;
}

void fab__fault_init(struct fab__fault *f, const struct fab_config *cfg)
{
    f->drop = cfg->drop >= 0 ? cfg->drop : env_double("FLOWKV_FAB_DROP", 0);
    f->delay_ns = cfg->delay_ns;
    if (f->delay_ns == 0)
        f->delay_ns = (uint64_t)(env_double("FLOWKV_FAB_DELAY_US", 0) * 1000.0);
    f->delay_p = cfg->delay_p >= 0 ? cfg->delay_p : env_double("FLOWKV_FAB_DELAY_P", 1.0);
    if (f->delay_ns == 0)
        f->delay_p = 0;
    f->stall_ns = (uint64_t)(env_double("FLOWKV_FAB_STALL_US", 0) * 1000.0);
    f->seed = cfg->seed ? cfg->seed : (fk_now_ns() ^ ((uint64_t)getpid() << 32)) | 1;
}

void fab__node_base_init(fab_node *base, const struct fab_config *cfg)
{
    fab__fault_init(&base->fault, cfg);
    /* Set before the backend starts listening (fab_node_create checked the
     * length): no connection is ever served without it. */
    snprintf(base->token, sizeof(base->token), "%s", cfg->token != NULL ? cfg->token : "");
}

double fab__rand01(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return (double)((x * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

int fab__parse_addr(const char *addr, char *host, uint16_t *port)
{
    if (addr == NULL)
        return FK_EINVAL;
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= FAB_ADDR_MAX)
        return FK_EINVAL;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || p <= 0 || p > 65535)
        return FK_EINVAL;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    *port = (uint16_t)p;
    return 0;
}

/* Resolves FAB_BACKEND_AUTO from FLOWKV_FABRIC; *automatic is set when the
 * choice is still open (auto: verbs if a device is usable, else tcp). */
static int resolve_backend(enum fab_backend want, enum fab_backend *out, int *automatic)
{
    *automatic = 0;
    if (want == FAB_BACKEND_AUTO) {
        const char *env = getenv("FLOWKV_FABRIC");
        if (env == NULL || *env == '\0' || strcasecmp(env, "auto") == 0)
            *automatic = 1;
        else if (strcasecmp(env, "tcp") == 0)
            want = FAB_BACKEND_TCP;
        else if (strcasecmp(env, "verbs") == 0)
            want = FAB_BACKEND_VERBS;
        else
            return FK_ECONFIG;
    }
    if (*automatic) {
        /* auto: verbs when a usable RDMA device exists, else tcp; said once
         * per process at info level (every node of a process decides alike). */
        static int said;
        char why[384] = "";
        want = fab__verbs_probe(why, sizeof(why)) ? FAB_BACKEND_VERBS : FAB_BACKEND_TCP;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fk_info("flows", "fabric: auto chose %s (%s)",
                    want == FAB_BACKEND_VERBS ? "verbs" : "tcp",
                    want == FAB_BACKEND_VERBS ? "an RDMA device is present" : why);
    }
    if (want != FAB_BACKEND_TCP && want != FAB_BACKEND_VERBS)
        return FK_EINVAL;
    *out = want;
    return 0;
}

int fab_node_create(const struct fab_config *cfg, fab_node **out)
{
    struct fab_config dflt;
    if (out == NULL)
        return FK_EINVAL;
    if (cfg == NULL) {
        fab_config_default(&dflt);
        cfg = &dflt;
    }
    if (cfg->drop > 1 || cfg->delay_p > 1)
        return FK_EINVAL;
    size_t toklen = cfg->token != NULL ? strlen(cfg->token) : 0;
    if (toklen > FAB_TOKEN_MAX)
        return FK_EINVAL;
    if (toklen > 0 && fk_auth_init() < 0)
        return FK_EINVAL;
    enum fab_backend be;
    int automatic;
    int rc = resolve_backend(cfg->backend, &be, &automatic);
    if (rc < 0)
        return rc;
    const struct fab__ops *ops = be == FAB_BACKEND_VERBS ? &fab__verbs_ops : &fab__tcp_ops;
    rc = ops->node_create(cfg, out);
    if (rc < 0 && automatic && ops == &fab__verbs_ops) {
        fk_warn("flows", "fabric: auto: verbs node failed (%s); using tcp", fk_strerror(rc));
        ops = &fab__tcp_ops;
        rc = ops->node_create(cfg, out);
    }
    if (rc < 0)
        return rc;
    (*out)->ops = ops;
    const char *mc = getenv("FLOWKV_FAB_MCAST");
    if (mc != NULL && strcmp(mc, "0") == 0)
        (*out)->has_mcast = 0;
    fk_debug("flows", "fabric node %s up (%s, mcast %d)", (*out)->addr, ops->name,
             (*out)->has_mcast);
    return 0;
}

void fab_node_counters(const fab_node *node, struct fab_counters *out)
{
    memset(out, 0, sizeof(*out));
    if (node != NULL && node->ops == &fab__verbs_ops)
        fab__verbs_counters(node, out);
}

void fab_node_destroy(fab_node *node)
{
    if (node != NULL)
        node->ops->node_destroy(node);
}

const char *fab_node_addr(const fab_node *node)
{
    return node->addr;
}

const char *fab_node_backend(const fab_node *node)
{
    return node->ops->name;
}

int fab_node_has_mcast(const fab_node *node)
{
    return node->has_mcast;
}

/* Entering bumps handlers_busy before loading the handlers; setting
 * stores the handlers before reading handlers_busy. Both sequentially
 * consistent (the store-load pattern of Dekker's algorithm): either the
 * invocation sees the new handlers, or the setter sees it busy and waits
 * for it to end. */
struct fab__handlers fab__handler_enter(fab_node *n)
{
    __atomic_add_fetch(&n->handlers_busy, 1, __ATOMIC_SEQ_CST);
    struct fab__handlers h = {
        .call = __atomic_load_n(&n->call_fn, __ATOMIC_SEQ_CST),
        .close = __atomic_load_n(&n->close_fn, __ATOMIC_SEQ_CST),
        .data = __atomic_load_n(&n->handler_data, __ATOMIC_SEQ_CST),
    };
    return h;
}

void fab__handler_exit(fab_node *n)
{
    __atomic_sub_fetch(&n->handlers_busy, 1, __ATOMIC_SEQ_CST);
}

void fab_node_set_handlers(fab_node *node, fab_call_fn call, fab_close_fn on_close, void *data)
{
    __atomic_store_n(&node->call_fn, NULL, __ATOMIC_SEQ_CST);
    __atomic_store_n(&node->close_fn, NULL, __ATOMIC_SEQ_CST);
    /* Quiesce: a handler the progress thread (or a waiting thread, tcp)
     * started with the old handlers may still read the old data, e.g. a
     * memory region flow_node_destroy is about to deregister. Bounded: a
     * handler is a short, non-blocking call. */
    for (unsigned spins = 0; __atomic_load_n(&node->handlers_busy, __ATOMIC_SEQ_CST) != 0;
         spins++) {
        if (spins < 1000)
            sched_yield();
        else
            nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
    }
    __atomic_store_n(&node->handler_data, data, __ATOMIC_SEQ_CST);
    __atomic_store_n(&node->close_fn, on_close, __ATOMIC_SEQ_CST);
    __atomic_store_n(&node->call_fn, call, __ATOMIC_SEQ_CST);
}

int fab_mr_reg(fab_node *node, void *addr, size_t len, fab_mr **out)
{
    if (node == NULL || addr == NULL || len == 0 || out == NULL)
        return FK_EINVAL;
    int rc = node->ops->mr_reg(node, addr, len, out);
    if (rc == 0)
        __atomic_fetch_add(&node->registered, len, __ATOMIC_RELAXED);
    return rc;
}

void fab_mr_dereg(fab_mr *mr)
{
    if (mr == NULL)
        return;
    __atomic_fetch_sub(&mr->node->registered, mr->len, __ATOMIC_RELAXED);
    mr->node->ops->mr_dereg(mr);
}

struct fab_rkey fab_mr_rkey(const fab_mr *mr)
{
    struct fab_rkey k = {(uint64_t)(uintptr_t)mr->addr, mr->len, mr->key};
    return k;
}

uint64_t fab_node_registered_bytes(const fab_node *node)
{
    return __atomic_load_n(&node->registered, __ATOMIC_RELAXED);
}

uint64_t fab_node_doorbell(fab_node *node)
{
    return node->ops->doorbell(node);
}

int fab_node_wait(fab_node *node, uint64_t seen, uint64_t timeout_ns)
{
    return node->ops->wait(node, seen, timeout_ns);
}

int fab_connect(fab_node *node, const char *addr, uint64_t timeout_ns, fab_conn **out)
{
    char host[FAB_ADDR_MAX];
    uint16_t port;
    if (node == NULL || out == NULL || fab__parse_addr(addr, host, &port) < 0)
        return FK_EINVAL;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    int rc = node->ops->connect(node, addr, timeout_ns, out);
    if (rc < 0 || node->token[0] == '\0')
        return rc;
    uint64_t now = fk_now_ns();
    rc = fab__auth_dial(*out, deadline > now ? deadline - now : FK_NSEC_PER_MSEC);
    if (rc < 0) {
        /* The caller reports FK_EAUTH; the listener logs its side. */
        if (rc == FK_EAUTH)
            fk_debug("flows", "fabric: %s and this node do not share the cluster token", addr);
        node->ops->conn_close(*out);
        *out = NULL;
    }
    return rc;
}

void fab_conn_close(fab_conn *conn)
{
    if (conn != NULL)
        conn->node->ops->conn_close(conn);
}

int fab_post_write(fab_conn *conn, fab_mr *lmr, const void *local, size_t len, uint64_t raddr,
                   uint32_t rkey, uint64_t cookie, unsigned flags)
{
    if (conn == NULL || (local == NULL && len > 0) || len > UINT32_MAX)
        return FK_EINVAL;
    return conn->node->ops->post(conn, lmr, FAB_OP_WRITE, (void *)(uintptr_t)local, len, raddr,
                                 rkey, 0, cookie, flags);
}

int fab_post_read(fab_conn *conn, fab_mr *lmr, void *local, size_t len, uint64_t raddr,
                  uint32_t rkey, uint64_t cookie, unsigned flags)
{
    if (conn == NULL || local == NULL || len == 0)
        return FK_EINVAL;
    if (len > FAB_READ_MAX)
        return FK_ETOOBIG;
    return conn->node->ops->post(conn, lmr, FAB_OP_READ, local, len, raddr, rkey, 0, cookie,
                                 flags | FAB_SIGNALED);
}

int fab_post_faa(fab_conn *conn, uint64_t raddr, uint32_t rkey, uint64_t add, uint64_t cookie,
                 unsigned flags)
{
    if (conn == NULL || (raddr & 7) != 0)
        return FK_EINVAL;
    return conn->node->ops->post(conn, NULL, FAB_OP_FAA, NULL, 8, raddr, rkey, add, cookie,
                                 flags | FAB_SIGNALED);
}

int fab_poll(fab_conn *conn, struct fab_wc *wc, int max)
{
    if (conn == NULL || wc == NULL || max <= 0)
        return FK_EINVAL;
    return conn->node->ops->poll(conn, wc, max);
}

int fab_conn_wait(fab_conn *conn, uint64_t timeout_ns)
{
    if (conn == NULL)
        return FK_EINVAL;
    return conn->node->ops->conn_wait(conn, timeout_ns);
}

int fab_conn_check(fab_conn *conn)
{
    if (conn == NULL)
        return FK_EINVAL;
    return conn->node->ops->conn_check(conn);
}

int fab_call(fab_conn *conn, const void *req, size_t len, void *resp, size_t cap,
             uint64_t timeout_ns)
{
    if (conn == NULL || req == NULL || (resp == NULL && cap > 0))
        return FK_EINVAL;
    if (len > FAB_MSG_MAX)
        return FK_ETOOBIG;
    return conn->node->ops->call(conn, req, len, resp, cap, timeout_ns);
}

int fab_ep_open(fab_node *node, fab_ep **out)
{
    if (node == NULL || out == NULL)
        return FK_EINVAL;
    return node->ops->ep_open(node, out);
}

void fab_ep_close(fab_ep *ep)
{
    if (ep != NULL)
        ep->node->ops->ep_close(ep);
}

const char *fab_ep_addr(const fab_ep *ep)
{
    return ep->addr;
}

int fab_ep_send(fab_ep *ep, const char *addr, const void *buf, size_t len)
{
    if (ep == NULL || addr == NULL || buf == NULL)
        return FK_EINVAL;
    if (len > FAB_DGRAM_MAX)
        return FK_ETOOBIG;
    return ep->node->ops->ep_send(ep, addr, buf, len);
}

int fab_ep_recv(fab_ep *ep, void *buf, size_t cap, char *from, uint64_t timeout_ns)
{
    if (ep == NULL || buf == NULL)
        return FK_EINVAL;
    return ep->node->ops->ep_recv(ep, buf, cap, from, timeout_ns);
}

int fab_ep_mcast_join(fab_ep *ep, const char *group)
{
    if (ep == NULL || group == NULL)
        return FK_EINVAL;
    return ep->node->ops->ep_join(ep, group);
}

int fab_ep_mcast_send(fab_ep *ep, const char *group, const char *const *members, int n,
                      const void *buf, size_t len)
{
    if (ep == NULL || group == NULL || buf == NULL || n < 0 || (n > 0 && members == NULL))
        return FK_EINVAL;
    if (len > FAB_DGRAM_MAX)
        return FK_ETOOBIG;
    return ep->node->ops->ep_mcast_send(ep, group, members, n, buf, len);
}
