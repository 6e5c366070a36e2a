/*
 * flowtest.h: multi-process scenarios for the flows tests (header-only, one
 * copy per test program). A scenario forks target and source processes
 * before the parent starts any thread (TSan forbids threads before fork),
 * exchanges node addresses through pipes, declares the flow in the parent,
 * and checks what every target thread received:
 *   - per source, tuples arrive in push order (FIFO per (source, target));
 *   - every tuple's check word matches its (key, source, n) fields;
 *   - counts and sums match what the sources pushed (no loss, no duplicate);
 *   - shuffle by key hash: each tuple reached target XXH64(key) % ntargets.
 * Children that hang are killed by PID after the scenario's deadline.
 */
#ifndef FLOWTEST_H
#define FLOWTEST_H

#include "check.h"
#include "fk_error.h"
#include "fk_time.h"
#include "flow.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define FT_SEC      FK_NSEC_PER_SEC
#define FT_PROCS    8
#define FT_THREADS  8
#define FT_MAX_SRC  (FT_PROCS * FT_THREADS)
#define FT_DEADLINE (60 * FT_SEC)

/* The test tuple: 32 bytes, key first. */
struct ft_tuple {
    uint64_t key;
    uint64_t src;
    uint64_t n;
    uint64_t check;
};

static inline uint64_t ft_check(uint64_t key, uint64_t src, uint64_t n)
{
    return (key * 0x9E3779B97F4A7C15ULL) ^ (src << 40) ^ (n * 0xC2B2AE3D27D4EB4FULL) ^ 0x5bd1e995;
}

static inline void ft_schema(struct flow_schema *s)
{
    struct flow_column cols[] = {{"key", FLOW_UINT64, 0},
                                 {"src", FLOW_UINT64, 0},
                                 {"n", FLOW_UINT64, 0},
                                 {"check", FLOW_UINT64, 0}};
    CHECK_OK(flow_schema_init(s, cols, 4, "key"));
    CHECK_EQ_U64(s->tuple_size, sizeof(struct ft_tuple));
}

enum ft_route { FT_HASH = 0, FT_FUNC, FT_EXPLICIT };

struct ft_spec {
    struct flow_opts opts;
    int src_procs, src_threads; /* sources: src_procs * src_threads */
    int tgt_procs, tgt_threads;
    uint64_t tuples; /* per source */
    enum ft_route route;
    unsigned slow_every; /* target sleeps slow_us every slow_every tuples */
    unsigned slow_us;
    unsigned flush_every;     /* source flushes every that many tuples */
    double drop;              /* fault knob: datagram drop probability in every process */
    uint64_t mem_per_node[2]; /* out: flow_node_memory of source proc 0 and target proc 0 */
    uint64_t gaps;            /* out: GAPs reported by all targets */
};

/* What one target thread reports. */
struct ft_report {
    int rc; /* 0 = all checks passed, else the line number of the failed check */
    uint64_t count;
    uint64_t sum_check;
    uint64_t per_src[FT_MAX_SRC];
    uint64_t mem;
    uint64_t order_hash; /* over the delivered sequence, for ordered flows */
    uint64_t gaps;
};

struct ft_child {
    pid_t pid;
    int up[2];   /* child -> parent */
    int down[2]; /* parent -> child */
};

static inline void ft_write(int fd, const void *p, size_t n)
{
    CHECK_EQ_I64(write(fd, p, n), (long)n);
}

static inline int ft_read(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static inline void ft_fork(struct ft_child *c, void (*fn)(struct ft_child *, void *), void *arg)
{
    CHECK_OK(pipe(c->up));
    CHECK_OK(pipe(c->down));
    c->pid = fork();
    CHECK(c->pid >= 0);
    if (c->pid == 0) {
        close(c->up[0]);
        close(c->down[1]);
        fn(c, arg);
        _exit(0);
    }
    close(c->up[1]);
    close(c->down[0]);
}

/* Reaps the child, killing it by PID when it outlives deadline_ns. Returns
 * its exit status, or -1 when it was killed or crashed. */
static inline int ft_reap(struct ft_child *c, uint64_t deadline_ns)
{
    int status = 0;
    while (waitpid(c->pid, &status, WNOHANG) == 0) {
        if (fk_now_ns() > deadline_ns) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &status, 0);
            return -1;
        }
        fk_sleep_ns(FK_NSEC_PER_MSEC);
    }
    close(c->up[0]);
    close(c->down[1]);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline flow_node *ft_node(void)
{
    flow_node *n = NULL;
    CHECK_OK(flow_node_create(NULL, &n));
    return n;
}

/* A node on host (NULL: the default) with the given fabric backend. */
static inline flow_node *ft_node_cfg(const char *host, enum fab_backend backend)
{
    struct flow_node_config cfg;
    flow_node_config_default(&cfg);
    if (host != NULL)
        cfg.fabric.host = host;
    cfg.fabric.backend = backend;
    flow_node *n = NULL;
    CHECK_OK(flow_node_create(&cfg, &n));
    return n;
}

/* A node on the TCP fabric whatever FLOWKV_FABRIC says: for behaviour of
 * that backend (a stopped process still answers one-sided operations on
 * verbs, where the NIC serves them). */
static inline flow_node *ft_node_tcp(void)
{
    return ft_node_cfg(NULL, FAB_BACKEND_TCP);
}

/* In a forked child: node n (its own) announced, its address sent up to
 * the parent, then waits for the parent's word that the flow is declared
 * (exits 3 when the parent went away). */
static inline flow_node *ft_child_node(struct ft_child *c, flow_node *n)
{
    char addr[FAB_ADDR_MAX] = {0};
    snprintf(addr, sizeof(addr), "%s", flow_node_addr(n));
    ft_write(c->up[1], addr, sizeof(addr));
    if (ft_read(c->down[0], addr, sizeof(addr)) < 0) /* declared */
        _exit(3);
    return n;
}

/* A node bound to the address in environment variable var (FT_SOURCE_HOST
 * or FT_TARGET_HOST), or to the default address when it is unset or empty.
 * ft_run places its source processes and the declaring ("home") node on
 * FLOWTEST_SOURCE_HOST and its target processes on FLOWTEST_TARGET_HOST,
 * so the same scenarios run between two hosts (tests/rdma-vm: rxe0's
 * 10.77.0.1 and rxe1's 10.77.0.2); the verbs backend picks the RDMA device
 * that owns the address (fab_config.host). */
#define FT_SOURCE_HOST "FLOWTEST_SOURCE_HOST"
#define FT_TARGET_HOST "FLOWTEST_TARGET_HOST"

static inline flow_node *ft_node_on(const char *var)
{
    const char *host = getenv(var);
    if (host == NULL || *host == '\0')
        return ft_node();
    return ft_node_cfg(host, FAB_BACKEND_AUTO);
}

/* ---- the generic scenario ------------------------------------------------------------ */

struct ft_ctx {
    const struct ft_spec *spec;
    int proc;
    flow_node *node;
    int thread;
    struct ft_report rep;
    int src_rc;
};

#define FT_FAIL(ctx)                                                                               \
    do {                                                                                           \
        (ctx)->rep.rc = __LINE__;                                                                  \
        return NULL;                                                                               \
    } while (0)

static inline int ft_route_fn(const void *tuple, int ntargets, void *data)
{
    (void)data;
    const struct ft_tuple *t = tuple;
    return (int)((t->key / 7) % (uint64_t)ntargets);
}

static inline int ft_expected_target(const struct ft_spec *sp, const struct ft_tuple *t, int nt)
{
    if (sp->route == FT_FUNC)
        return ft_route_fn(t, nt, NULL);
    if (sp->route == FT_EXPLICIT)
        return (int)(t->n % (uint64_t)nt);
    return (int)(XXH64(&t->key, 8, 0) % (uint64_t)nt);
}

static void *ft_target_body(struct ft_ctx *x, flow_target **tp_out);

/* Runs the checks; closes the target even when a check failed, so the
 * process can still report (and destroy its node). */
static void *ft_target_thread(void *arg)
{
    struct ft_ctx *x = arg;
    flow_target *t = NULL;
    ft_target_body(x, &t);
    if (t != NULL)
        flow_target_close(t);
    return NULL;
}

static void *ft_target_body(struct ft_ctx *x, flow_target **tp_out)
{
    const struct ft_spec *sp = x->spec;
    int index = x->proc * sp->tgt_threads + x->thread;
    int nt = sp->tgt_procs * sp->tgt_threads;
    flow_target *t;
    if (flow_target_open(x->node, "ft", index, &t) < 0)
        FT_FAIL(x);
    *tp_out = t;
    uint64_t next[FT_MAX_SRC] = {0};
    uint64_t deadline = fk_now_ns() + FT_DEADLINE;
    uint64_t want_seq = 0;
    int ordered = sp->opts.ordered, lossy = sp->drop > 0;
    for (;;) {
        struct flow_item it;
        int rc = flow_consume(t, &it, FT_SEC);
        if (rc == FK_EEND)
            break;
        if (rc == FK_ETIMEDOUT && fk_now_ns() < deadline)
            continue;
        if (rc == FK_EGAP && ordered && lossy && it.seq == want_seq) {
            x->rep.gaps++;
            x->rep.order_hash = x->rep.order_hash * 1000003 + it.seq;
            want_seq++;
            continue;
        }
        if (rc < 0)
            FT_FAIL(x);
        const struct ft_tuple *tp = it.tuple;
        if (tp->src >= FT_MAX_SRC || tp->check != ft_check(tp->key, tp->src, tp->n))
            FT_FAIL(x);
        /* One global order without holes: a sequence number per tuple in
         * both modes (a bandwidth-mode segment takes its tuple count in one
         * fetch-and-add, flow_order.c). */
        if (ordered && it.seq != want_seq++)
            FT_FAIL(x);
        if (tp->n != next[tp->src]) { /* FIFO per source; replicate: every tuple */
            if (tp->n < next[tp->src] || (sp->opts.kind == FLOW_REPLICATE && !lossy))
                FT_FAIL(x);
        }
        if (sp->opts.kind == FLOW_SHUFFLE && ft_expected_target(sp, tp, nt) != index)
            FT_FAIL(x);
        next[tp->src] = tp->n + 1;
        x->rep.count++;
        x->rep.sum_check += tp->check;
        x->rep.per_src[tp->src]++;
        x->rep.order_hash = x->rep.order_hash * 1000003 + (tp->src << 32 ^ tp->n);
        if (sp->slow_every && x->rep.count % sp->slow_every == 0)
            fk_sleep_ns(sp->slow_us * FK_NSEC_PER_USEC);
    }
    struct flow_item it;
    if (flow_consume(t, &it, 0) != FK_EEND) /* end is sticky */
        FT_FAIL(x);
    x->rep.mem = flow_node_memory(x->node);
    return NULL;
}

static void *ft_source_thread(void *arg)
{
    struct ft_ctx *x = arg;
    const struct ft_spec *sp = x->spec;
    int index = x->proc * sp->src_threads + x->thread;
    int nt = sp->tgt_procs * sp->tgt_threads;
    flow_source *s;
    int rc = flow_source_open(x->node, "ft", index, FT_DEADLINE, &s);
    if (rc < 0) {
        x->src_rc = rc;
        return NULL;
    }
    if (sp->route == FT_FUNC)
        flow_source_set_route(s, ft_route_fn, NULL);
    for (uint64_t n = 0; n < sp->tuples && rc == 0; n++) {
        struct ft_tuple tp = {n * 31 + (uint64_t)index, (uint64_t)index, n, 0};
        tp.check = ft_check(tp.key, tp.src, tp.n);
        if (sp->route == FT_EXPLICIT)
            rc = flow_push_to(s, (int)(n % (uint64_t)nt), &tp, sizeof(tp));
        else
            rc = flow_push(s, &tp, sizeof(tp));
        if (rc == 0 && sp->flush_every && n % sp->flush_every == 0)
            rc = flow_flush(s);
    }
    x->rep.mem = flow_node_memory(x->node);
    int crc = flow_source_close(s);
    x->src_rc = rc < 0 ? rc : crc;
    return NULL;
}

/* A target or source process: threads per spec, then one report each. */
static void ft_proc(struct ft_child *c, void *arg, int is_target)
{
    const struct ft_spec *sp = arg;
    int proc;
    char home[FAB_ADDR_MAX];
    if (ft_read(c->down[0], &proc, sizeof(proc)) < 0)
        _exit(3);
    if (sp->drop > 0) {
        char v[32];
        snprintf(v, sizeof(v), "%.3f", sp->drop);
        setenv("FLOWKV_FAB_DROP", v, 1);
    }
    flow_node *n = ft_node_on(is_target ? FT_TARGET_HOST : FT_SOURCE_HOST);
    char addr[FAB_ADDR_MAX] = {0};
    snprintf(addr, sizeof(addr), "%s", flow_node_addr(n));
    ft_write(c->up[1], addr, sizeof(addr));
    if (ft_read(c->down[0], home, sizeof(home)) < 0) /* the flow is declared */
        _exit(3);
    CHECK_OK(flow_node_add_peer(n, home));
    int nth = is_target ? sp->tgt_threads : sp->src_threads;
    static struct ft_ctx ctx[FT_THREADS];
    pthread_t th[FT_THREADS];
    for (int i = 0; i < nth; i++) {
        ctx[i] = (struct ft_ctx){.spec = sp, .proc = proc, .node = n, .thread = i};
        CHECK_OK(
            pthread_create(&th[i], NULL, is_target ? ft_target_thread : ft_source_thread, &ctx[i]));
    }
    for (int i = 0; i < nth; i++) {
        pthread_join(th[i], NULL);
        if (!is_target && ctx[i].src_rc < 0)
            ctx[i].rep.rc = ctx[i].src_rc;
        ft_write(c->up[1], &ctx[i].rep, sizeof(ctx[i].rep));
    }
    flow_node_destroy(n);
}

static inline void ft_target_proc(struct ft_child *c, void *arg)
{
    ft_proc(c, arg, 1);
}

static inline void ft_source_proc(struct ft_child *c, void *arg)
{
    ft_proc(c, arg, 0);
}

/* Runs the scenario and checks the reports. */
static inline void ft_run(struct ft_spec *sp)
{
    struct ft_child tg[FT_PROCS], sc[FT_PROCS];
    CHECK(sp->tgt_procs <= FT_PROCS && sp->src_procs <= FT_PROCS);
    CHECK(sp->tgt_threads <= FT_THREADS && sp->src_threads <= FT_THREADS);
    for (int p = 0; p < sp->tgt_procs; p++)
        ft_fork(&tg[p], ft_target_proc, sp);
    for (int p = 0; p < sp->src_procs; p++)
        ft_fork(&sc[p], ft_source_proc, sp);
    int nt = sp->tgt_procs * sp->tgt_threads, ns = sp->src_procs * sp->src_threads;
    char addrs[FT_PROCS][FAB_ADDR_MAX], junk[FAB_ADDR_MAX];
    const char *targets[FLOW_TARGETS_MAX];
    for (int p = 0; p < sp->tgt_procs; p++) {
        ft_write(tg[p].down[1], &p, sizeof(p));
        CHECK_OK(ft_read(tg[p].up[0], addrs[p], FAB_ADDR_MAX));
        for (int i = 0; i < sp->tgt_threads; i++)
            targets[p * sp->tgt_threads + i] = addrs[p];
    }
    for (int p = 0; p < sp->src_procs; p++) {
        ft_write(sc[p].down[1], &p, sizeof(p));
        CHECK_OK(ft_read(sc[p].up[0], junk, FAB_ADDR_MAX));
    }
    flow_node *home = ft_node_on(FT_SOURCE_HOST);
    struct flow_schema schema;
    ft_schema(&schema);
    if (sp->opts.ordered)
        snprintf(sp->opts.sequencer, FAB_ADDR_MAX, "%s", flow_node_addr(home));
    if (sp->opts.multicast)
        snprintf(sp->opts.group, FAB_ADDR_MAX, "239.255.%d.%d:%d", getpid() % 250,
                 (int)(fk_now_ns() % 250), 20000 + (int)(fk_now_ns() / 1000 % 30000));
    CHECK_OK(flow_declare(home, "ft", &schema, ns, targets, nt, &sp->opts));
    if (sp->opts.ordered)
        CHECK_OK(flow_sequencer_start(home, "ft", 1));
    char ha[FAB_ADDR_MAX] = {0};
    snprintf(ha, sizeof(ha), "%s", flow_node_addr(home));
    for (int p = 0; p < sp->tgt_procs; p++)
        ft_write(tg[p].down[1], ha, sizeof(ha));
    for (int p = 0; p < sp->src_procs; p++)
        ft_write(sc[p].down[1], ha, sizeof(ha));
    uint64_t deadline = fk_now_ns() + FT_DEADLINE + 10 * FT_SEC;
    static struct ft_report rep;
    for (int p = 0; p < sp->src_procs; p++) {
        for (int i = 0; i < sp->src_threads; i++) {
            CHECK_OK(ft_read(sc[p].up[0], &rep, sizeof(rep)));
            CHECK_MSG(rep.rc == 0, "source %d.%d failed: %d (%s)", p, i, rep.rc,
                      fk_err_name(rep.rc));
            if (p == 0 && i == 0)
                sp->mem_per_node[0] = rep.mem;
        }
        CHECK_EQ_I64(ft_reap(&sc[p], deadline), 0);
    }
    uint64_t total = 0, sum = 0, per_src[FT_MAX_SRC] = {0}, hash0 = 0, gaps = 0;
    for (int p = 0; p < sp->tgt_procs; p++) {
        for (int i = 0; i < sp->tgt_threads; i++) {
            CHECK_OK(ft_read(tg[p].up[0], &rep, sizeof(rep)));
            CHECK_MSG(rep.rc == 0, "target %d.%d failed a check at flowtest.h:%d", p, i, rep.rc);
            total += rep.count;
            sum += rep.sum_check;
            gaps += rep.gaps;
            for (int s = 0; s < ns; s++)
                per_src[s] += rep.per_src[s];
            if (p == 0 && i == 0) {
                sp->mem_per_node[1] = rep.mem;
                hash0 = rep.order_hash;
            }
            /* Ordered and lossless: every target delivered the same sequence. */
            if (sp->opts.ordered && sp->drop == 0)
                CHECK_EQ_U64(rep.order_hash, hash0);
            /* Lossy ordered: every sequence number was delivered or a GAP. */
            if (sp->opts.ordered && sp->drop > 0)
                CHECK_EQ_U64(rep.count + rep.gaps, (uint64_t)ns * sp->tuples);
        }
        CHECK_EQ_I64(ft_reap(&tg[p], deadline), 0);
    }
    sp->gaps = gaps;
    if (sp->drop > 0) {
        flow_node_destroy(home);
        return;
    }
    uint64_t copies = sp->opts.kind == FLOW_REPLICATE ? (uint64_t)nt : 1;
    uint64_t want_sum = 0;
    for (int s = 0; s < ns; s++) {
        CHECK_EQ_U64(per_src[s], sp->tuples * copies);
        for (uint64_t n = 0; n < sp->tuples; n++)
            want_sum += ft_check(n * 31 + (uint64_t)s, (uint64_t)s, n);
    }
    CHECK_EQ_U64(total, (uint64_t)ns * sp->tuples * copies);
    CHECK_EQ_U64(sum, want_sum * copies);
    flow_node_destroy(home);
}

#endif /* FLOWTEST_H */
