/*
 * verbs_bench.c: fabric-level latency and bandwidth between the VM's two
 * Soft-RoCE hosts, over whatever backend FLOWKV_FABRIC picks (verbs in
 * `make bench-rdma`). The same two measurements as perftest's baselines
 * (tests/rdma-vm/bench-baseline.sh), so verbs_bench.sh can print ratios:
 *   latency: a ping-pong of 64-byte one-sided writes, each side waiting on
 *     the last word of its buffer with fab_node_doorbell/fab_node_wait (the
 *     way a flows target waits), like ib_write_lat; prints the median
 *     round trip;
 *   bandwidth: a stream of 64-byte writes into a ring at B, signaled once
 *     per VB_SIG writes, like ib_write_bw -s 64; prints bytes per second.
 *
 *   verbs_bench ROUNDS WRITES     prints "verbs-bench: rtt_us=... bw_MBps=..."
 *
 * Host A (this process) binds RDMA_IP_A, host B (a forked child) RDMA_IP_B
 * (127.0.0.1 when unset). Every wait is bounded; a stuck peer is an error.
 */
#include "fab.h"
#include "fk_error.h"
#include "fk_time.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG       64
#define RING      256 /* 64-byte slots at B for the stream */
#define SIG_EVERY 64
#define WAIT_NS   (10ULL * FK_NSEC_PER_SEC)

struct exportinfo {
    char addr[FAB_ADDR_MAX];
    struct fab_rkey rkey;
};

/* Each side's receive buffer: [0] ping-pong slot, then the stream ring. */
static uint8_t g_buf[MSG * (1 + RING)] __attribute__((aligned(64)));
static uint8_t g_src[MSG * 2] __attribute__((aligned(64)));

static void die(const char *what, int rc)
{
    fprintf(stderr, "verbs-bench: %s: %s\n", what, fk_strerror(rc));
    exit(1);
}

#define OK(expr)                                                                                   \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0)                                                                               \
            die(#expr, rc_);                                                                       \
    } while (0)

static fab_node *node_on(const char *var)
{
    struct fab_config cfg;
    fab_config_default(&cfg);
    cfg.host = getenv(var) ? getenv(var) : "127.0.0.1";
    fab_node *n;
    OK(fab_node_create(&cfg, &n));
    return n;
}

static void pipe_io(int fd, void *p, size_t n, int out)
{
    ssize_t r = out ? write(fd, p, n) : read(fd, p, n);
    if (r != (ssize_t)n)
        die("pipe", FK_EUNREACHABLE);
}

/* Waits until the ping-pong slot's last word holds want. */
static void await(fab_node *n, uint64_t want)
{
    volatile uint64_t *w = (volatile uint64_t *)(void *)(g_buf + MSG - 8);
    uint64_t deadline = fk_now_ns() + WAIT_NS;
    for (;;) {
        uint64_t bell = fab_node_doorbell(n);
        if (fab_load64(w) == want)
            return;
        if (fk_now_ns() > deadline)
            die("ping-pong wait", FK_ETIMEDOUT);
        fab_node_wait(n, bell, FK_NSEC_PER_MSEC);
    }
}

/* Posts one 64-byte write whose last word is v; reaps a completion per
 * SIG_EVERY writes so the connection's signaled budget never runs out. */
static void send_word(fab_conn *c, fab_mr *lmr, uint64_t raddr, uint32_t key, uint64_t v,
                      uint64_t i)
{
    uint8_t *src = g_src + (i % 2) * MSG;
    memcpy(src + MSG - 8, &v, 8);
    unsigned sig = i % SIG_EVERY == SIG_EVERY - 1 ? FAB_SIGNALED : 0;
    OK(fab_post_write(c, lmr, src, MSG, raddr, key, i, sig));
    if (sig) {
        struct fab_wc wc;
        int got;
        uint64_t deadline = fk_now_ns() + WAIT_NS;
        while ((got = fab_poll(c, &wc, 1)) == 0) {
            if (fk_now_ns() > deadline)
                die("completion", FK_ETIMEDOUT);
            fab_conn_wait(c, FK_NSEC_PER_MSEC);
        }
        OK(got);
        OK(wc.status);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Host B: exports its buffer, connects back to A, echoes ping-pongs. */
static void host_b(int up, int down, int rounds)
{
    fab_node *n = node_on("RDMA_IP_B");
    fab_mr *mr, *lmr;
    OK(fab_mr_reg(n, g_buf, sizeof(g_buf), &mr));
    OK(fab_mr_reg(n, g_src, sizeof(g_src), &lmr));
    struct exportinfo me = {.rkey = fab_mr_rkey(mr)}, a;
    snprintf(me.addr, sizeof(me.addr), "%s", fab_node_addr(n));
    pipe_io(up, &me, sizeof(me), 1);
    pipe_io(down, &a, sizeof(a), 0);
    fab_conn *c;
    OK(fab_connect(n, a.addr, WAIT_NS, &c));
    for (int i = 0; i < rounds; i++) {
        await(n, (uint64_t)i + 1);
        send_word(c, lmr, a.rkey.addr, a.rkey.key, (uint64_t)i + 1, (uint64_t)i);
    }
    char done;
    pipe_io(down, &done, 1, 0); /* A finished streaming into our ring */
    fab_conn_close(c);
    fab_mr_dereg(lmr);
    fab_mr_dereg(mr);
    fab_node_destroy(n);
}

static uint64_t pingpong(fab_node *n, fab_conn *c, fab_mr *lmr, const struct exportinfo *b,
                         int rounds)
{
    uint64_t *rtt = calloc((size_t)rounds, sizeof(uint64_t));
    if (rtt == NULL)
        die("calloc", FK_ENOMEM);
    for (int i = 0; i < rounds; i++) {
        uint64_t t0 = fk_now_ns();
        send_word(c, lmr, b->rkey.addr, b->rkey.key, (uint64_t)i + 1, (uint64_t)i);
        await(n, (uint64_t)i + 1);
        rtt[i] = fk_now_ns() - t0;
    }
    qsort(rtt, (size_t)rounds, sizeof(uint64_t), cmp_u64);
    uint64_t med = rtt[rounds / 2];
    free(rtt);
    return med;
}

static double stream(fab_conn *c, fab_mr *lmr, const struct exportinfo *b, int writes)
{
    uint64_t t0 = fk_now_ns();
    /* Round up to whole signaled batches so the last write is signaled. */
    int total = (writes + SIG_EVERY - 1) / SIG_EVERY * SIG_EVERY;
    for (int i = 0; i < total; i++) {
        uint64_t at = b->rkey.addr + MSG + (uint64_t)(i % RING) * MSG;
        send_word(c, lmr, at, b->rkey.key, (uint64_t)i, (uint64_t)i);
    }
    double secs = (double)(fk_now_ns() - t0) / 1e9;
    return (double)total * MSG / secs;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 1000;
    int writes = argc > 2 ? atoi(argv[2]) : 20000;
    if (rounds <= 0 || writes <= 0) {
        fprintf(stderr, "usage: verbs_bench ROUNDS WRITES\n");
        return 2;
    }
    int up[2], down[2];
    if (pipe(up) < 0 || pipe(down) < 0)
        die("pipe", FK_ENOMEM);
    pid_t pid = fork(); /* before any fabric state exists in this process */
    if (pid < 0)
        die("fork", FK_ENOMEM);
    if (pid == 0) {
        host_b(up[1], down[0], rounds);
        _exit(0);
    }
    struct exportinfo b, me;
    pipe_io(up[0], &b, sizeof(b), 0);
    fab_node *n = node_on("RDMA_IP_A");
    fab_mr *mr, *lmr;
    OK(fab_mr_reg(n, g_buf, sizeof(g_buf), &mr));
    OK(fab_mr_reg(n, g_src, sizeof(g_src), &lmr));
    me.rkey = fab_mr_rkey(mr);
    snprintf(me.addr, sizeof(me.addr), "%s", fab_node_addr(n));
    pipe_io(down[1], &me, sizeof(me), 1);
    fab_conn *c;
    OK(fab_connect(n, b.addr, WAIT_NS, &c));
    uint64_t rtt = pingpong(n, c, lmr, &b, rounds);
    double bw = stream(c, lmr, &b, writes);
    pipe_io(down[1], "x", 1, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    struct fab_counters ct;
    fab_node_counters(n, &ct);
    printf("verbs-bench: backend=%s rtt_us=%.2f bw_MBps=%.2f writes_posted=%lu inline=%lu\n",
           fab_node_backend(n), (double)rtt / 1e3, bw / 1e6, (unsigned long)ct.write,
           (unsigned long)ct.write_inline);
    fab_conn_close(c);
    fab_mr_dereg(lmr);
    fab_mr_dereg(mr);
    fab_node_destroy(n);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
