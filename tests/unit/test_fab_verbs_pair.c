/*
 * test_fab_verbs_pair.c: the fabric contract between two "hosts", each a
 * process with its own node address. On a plain host both are 127.0.0.1
 * and the backend is whatever FLOWKV_FABRIC picks (tcp here); inside the
 * Soft-RoCE VM (tests/rdma-vm/verbs_suite.sh) host A is RDMA_IP_A on rxe0
 * and host B is RDMA_IP_B on rxe1, so every operation crosses the veth wire
 * as RoCE v2 packets:
 *   - a ring of segments written with the footer last (one write, or
 *     payload then footer with FAB_MORE), the consumer checking that a
 *     visible footer implies a complete payload (DFI section 5.1), with
 *     the free space read back remotely (DFI section 5.3);
 *   - fetch-and-add on a counter at B, control calls, datagrams both ways
 *     and a multicast group (or its unicast fall-back);
 *   - a remote access error poisons the connection; a dead peer turns into
 *     an error within a bounded time, never a hang.
 * With the verbs backend the work-request counters must show WRITEs, READs
 * and FETCH_AND_ADDs.
 */
#include "check.h"
#include "fab.h"
#include "fk_error.h"
#include "fk_time.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SEC    FK_NSEC_PER_SEC
#define NSEG   8
#define ROUNDS 400
#define FAA_N  200
#define DGRAMS 20

struct seg {
    uint8_t payload[1024 - 8];
    uint64_t footer; /* round + 1 when consumable */
};

/* What host B exports to host A (through a pipe). */
struct export
{
    char addr[FAB_ADDR_MAX];
    char ep[FAB_ADDR_MAX];
    struct fab_rkey ring, consumed, counter;
};

static struct seg g_ring[NSEG] __attribute__((aligned(64)));
static uint64_t g_words[2] __attribute__((aligned(64))); /* consumed, counter */

static const char *host_of(const char *var)
{
    const char *v = getenv(var);
    return v != NULL && *v != '\0' ? v : "127.0.0.1";
}

static fab_node *node_on(const char *var)
{
    struct fab_config cfg;
    fab_config_default(&cfg);
    cfg.host = host_of(var);
    fab_node *n = NULL;
    CHECK_OK(fab_node_create(&cfg, &n));
    return n;
}

static void xfer(int fd, void *p, size_t n, int out)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r =
            out ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        CHECK_MSG(r > 0, "pipe %s failed", out ? "write" : "read");
        done += (size_t)r;
    }
}

static int call_upper(void *data, uint64_t peer, const void *req, size_t len, void *resp,
                      size_t cap)
{
    (void)data;
    (void)peer;
    if (len > cap)
        return FK_ETOOBIG;
    for (size_t i = 0; i < len; i++) {
        char ch = ((const char *)req)[i];
        ((char *)resp)[i] = (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
    }
    return (int)len;
}

/* Host B's consumer loop over the ring (adaptive waiting on the doorbell). */
static void consume_ring(fab_node *n)
{
    for (uint64_t r = 0; r < ROUNDS; r++) {
        struct seg *s = &g_ring[r % NSEG];
        uint64_t deadline = fk_now_ns() + 20 * SEC;
        for (;;) {
            uint64_t bell = fab_node_doorbell(n);
            if (fab_load64(&s->footer) != 0)
                break;
            CHECK_MSG(fk_now_ns() < deadline, "round %lu never arrived", (unsigned long)r);
            fab_node_wait(n, bell, 100 * FK_NSEC_PER_MSEC);
        }
        CHECK_EQ_U64(fab_load64(&s->footer), r + 1);
        for (size_t i = 0; i < sizeof(s->payload); i++)
            CHECK_MSG(s->payload[i] == (uint8_t)r, "round %lu byte %zu is %u", (unsigned long)r, i,
                      s->payload[i]);
        fab_store64(&s->footer, 0);
        fab_store64(&g_words[0], r + 1);
    }
}

/* Host B: exports memory and an endpoint, consumes, echoes datagrams. */
static void host_b(int up, int down)
{
    fab_node *n = node_on("RDMA_IP_B");
    fab_node_set_handlers(n, call_upper, NULL, NULL);
    fab_mr *ring, *words;
    CHECK_OK(fab_mr_reg(n, g_ring, sizeof(g_ring), &ring));
    CHECK_OK(fab_mr_reg(n, g_words, sizeof(g_words), &words));
    fab_ep *ep;
    CHECK_OK(fab_ep_open(n, &ep));
    int joined = fab_ep_mcast_join(ep, "239.77.1.1:7000") == 0;
    struct export e = {.ring = fab_mr_rkey(ring), .consumed = fab_mr_rkey(words)};
    e.counter = e.consumed;
    e.counter.addr += 8;
    snprintf(e.addr, sizeof(e.addr), "%s", fab_node_addr(n));
    snprintf(e.ep, sizeof(e.ep), "%s", fab_ep_addr(ep));
    xfer(up, &e, sizeof(e), 1);
    consume_ring(n);
    /* Datagrams: echo each unicast one back to its sender; count the group's. */
    int got = 0, group = 0;
    char buf[64], from[FAB_ADDR_MAX];
    uint64_t deadline = fk_now_ns() + 20 * SEC;
    while ((got < DGRAMS || (joined && group < 1)) && fk_now_ns() < deadline) {
        int len = fab_ep_recv(ep, buf, sizeof(buf), from, 100 * FK_NSEC_PER_MSEC);
        if (len == 4 && memcmp(buf, "dgrm", 4) == 0 && ++got > 0)
            CHECK_OK(fab_ep_send(ep, from, "echo", 4));
        else if (len == 5 && memcmp(buf, "group", 5) == 0)
            group++;
    }
    int res[2] = {got, joined ? group : -1};
    xfer(up, res, sizeof(res), 1);
    char done;
    xfer(down, &done, 1, 0); /* A finished with B's memory */
    CHECK_EQ_U64(fab_load64(&g_words[1]), FAA_N);
    fab_ep_close(ep);
    fab_mr_dereg(ring);
    fab_mr_dereg(words);
    fab_node_destroy(n);
}

/* One completion within 10 s; `what` and `n` name the operation waited on. */
static struct fab_wc one(fab_conn *c, const char *what, uint64_t n)
{
    struct fab_wc wc;
    for (int i = 0; i < 100; i++) {
        int got = fab_poll(c, &wc, 1);
        CHECK_OK(got);
        if (got == 1)
            return wc;
        fab_conn_wait(c, 100 * FK_NSEC_PER_MSEC);
    }
    check__fail(__FILE__, __LINE__, "no completion in 10 s for %s %lu", what, (unsigned long)n);
}

/* Host A's producer: footer-last segments, free space read remotely. */
static void produce_ring(fab_conn *c, const struct export *e)
{
    static struct seg s;
    uint64_t consumed = 0;
    for (uint64_t r = 0; r < ROUNDS; r++) {
        while (r - consumed >= NSEG) {
            CHECK_OK(fab_post_read(c, NULL, &consumed, 8, e->consumed.addr, e->consumed.key, r, 0));
            one(c, "read of consumed at round", r);
        }
        memset(s.payload, (int)(uint8_t)r, sizeof(s.payload));
        s.footer = r + 1;
        uint64_t at = e->ring.addr + (r % NSEG) * sizeof(struct seg);
        unsigned sig = r % NSEG == NSEG - 1 ? FAB_SIGNALED : 0;
        if (r % 2 == 0) {
            CHECK_OK(fab_post_write(c, NULL, &s, sizeof(s), at, e->ring.key, r, sig));
        } else {
            CHECK_OK(fab_post_write(c, NULL, s.payload, sizeof(s.payload), at, e->ring.key, r,
                                    FAB_MORE));
            CHECK_OK(
                fab_post_write(c, NULL, &s.footer, 8, at + sizeof(s.payload), e->ring.key, r, sig));
        }
        if (sig)
            CHECK_OK(one(c, "signaled write at round", r).status);
    }
}

static void faa_and_call(fab_conn *c, const struct export *e)
{
    for (uint64_t i = 0; i < FAA_N; i++) {
        CHECK_OK(fab_post_faa(c, e->counter.addr, e->counter.key, 1, i, 0));
        struct fab_wc wc = one(c, "fetch-and-add", i);
        CHECK_EQ_U64(wc.cookie, i);
        CHECK_EQ_U64(wc.value, i);
    }
    char resp[16];
    CHECK_EQ_I64(fab_call(c, "verbs", 5, resp, sizeof(resp), 5 * SEC), 5);
    CHECK(memcmp(resp, "VERBS", 5) == 0);
}

static void datagrams(fab_node *n, const struct export *e, int *echoes)
{
    fab_ep *ep;
    CHECK_OK(fab_ep_open(n, &ep));
    char buf[16];
    const char *members[1] = {e->ep};
    *echoes = 0;
    for (int i = 0; i < DGRAMS * 3 && *echoes < DGRAMS; i++) {
        CHECK_OK(fab_ep_send(ep, e->ep, "dgrm", 4));
        if (fab_ep_recv(ep, buf, sizeof(buf), NULL, 200 * FK_NSEC_PER_MSEC) == 4)
            (*echoes)++;
        if (i % 4 == 0)
            CHECK_OK(fab_ep_mcast_send(ep, "239.77.1.1:7000", members, 1, "group", 5));
    }
    for (int i = 0; i < 20; i++) /* late group sends, in case B is still looping */
        CHECK_OK(fab_ep_mcast_send(ep, "239.77.1.1:7000", members, 1, "group", 5));
    fab_ep_close(ep);
}

static void check_counters(fab_node *n)
{
    struct fab_counters ct;
    fab_node_counters(n, &ct);
    printf("# %s counters: write=%lu (inline %lu) read=%lu faa=%lu send=%lu recv=%lu "
           "completion=%lu error=%lu dgram_send=%lu dgram_recv=%lu mcast_send=%lu\n",
           fab_node_backend(n), ct.write, ct.write_inline, ct.read, ct.faa, ct.send, ct.recv,
           ct.completion, ct.error, ct.dgram_send, ct.dgram_recv, ct.mcast_send);
    fflush(stdout);
    if (strcmp(fab_node_backend(n), "verbs") == 0) {
        CHECK(ct.write >= ROUNDS && ct.read > 0 && ct.faa >= FAA_N && ct.send > 0);
        CHECK(ct.dgram_send > 0 && ct.dgram_recv > 0);
    }
}

TEST(pair_ring_faa_call_datagrams)
{
    int up[2], down[2];
    CHECK_OK(pipe(up));
    CHECK_OK(pipe(down));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        host_b(up[1], down[0]);
        _exit(0);
    }
    struct export e;
    xfer(up[0], &e, sizeof(e), 0);
    fab_node *n = node_on("RDMA_IP_A");
    fab_conn *c;
    CHECK_OK(fab_connect(n, e.addr, 10 * SEC, &c));
    produce_ring(c, &e);
    faa_and_call(c, &e);
    int echoes, res[2];
    datagrams(n, &e, &echoes);
    xfer(up[0], res, sizeof(res), 0);
    printf("# datagrams: %d echoed, B got %d; group datagrams at B: %d (-1: not joined)\n", echoes,
           res[0], res[1]);
    fflush(stdout);
    CHECK(echoes > 0 && res[0] > 0);
    /* With multicast on (rdma_join_multicast on verbs), B must have joined
     * and received group datagrams across the wire; without, -1 or any. */
    if (fab_node_has_mcast(n))
        CHECK_MSG(res[1] > 0, "group datagrams at B: %d (-1: join failed)", res[1]);
    xfer(down[1], "x", 1, 1);
    int status;
    CHECK_EQ_I64(waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "host B status %d", status);
    check_counters(n);
    fab_conn_close(c);
    fab_node_destroy(n);
}

/* Host B for the error test: exports 64 bytes, then waits to be killed. */
static void host_b_victim(int up)
{
    fab_node *n = node_on("RDMA_IP_B");
    fab_mr *mr;
    CHECK_OK(fab_mr_reg(n, g_words, sizeof(g_words), &mr));
    struct export e = {.ring = fab_mr_rkey(mr)};
    snprintf(e.addr, sizeof(e.addr), "%s", fab_node_addr(n));
    xfer(up, &e, sizeof(e), 1);
    sleep(60); /* killed by the parent long before */
}

TEST(pair_access_error_poisons_and_dead_peer_is_an_error)
{
    int up[2];
    CHECK_OK(pipe(up));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        host_b_victim(up[1]);
        _exit(0);
    }
    struct export e;
    xfer(up[0], &e, sizeof(e), 0);
    fab_node *n = node_on("RDMA_IP_A");
    fab_conn *c;
    CHECK_OK(fab_connect(n, e.addr, 10 * SEC, &c));
    uint64_t v = 1;
    CHECK_OK(fab_post_write(c, NULL, &v, 8, e.ring.addr + 4096, e.ring.key, 1, 0));
    CHECK_ERR(one(c, "bad write", 1).status, FK_EPROTO); /* unsignaled, but errors complete */
    CHECK_ERR(fab_post_write(c, NULL, &v, 8, e.ring.addr, e.ring.key, 2, 0), FK_EPOISONED);
    fab_conn_close(c);
    /* A fresh connection works; then the peer dies: an error, not a hang. */
    CHECK_OK(fab_connect(n, e.addr, 10 * SEC, &c));
    CHECK_OK(fab_post_faa(c, e.ring.addr, e.ring.key, 1, 3, 0));
    CHECK_OK(one(c, "fetch-and-add", 3).status);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t deadline = fk_now_ns() + 60 * SEC;
    int rc = 0;
    for (uint64_t i = 4; rc >= 0 && fk_now_ns() < deadline; i++) {
        struct fab_wc wc;
        rc = fab_post_faa(c, e.ring.addr, e.ring.key, 1, i, 0);
        if (rc == FK_EAGAIN)
            rc = 0;
        while (rc >= 0 && fk_now_ns() < deadline && (rc = fab_poll(c, &wc, 1)) == 0)
            fab_conn_wait(c, 100 * FK_NSEC_PER_MSEC);
        if (rc == 1 && wc.status < 0)
            rc = wc.status;
    }
    CHECK_MSG(rc == FK_EUNREACHABLE || rc == FK_EPOISONED, "after the peer died: %d (%s)", rc,
              fk_err_name(rc));
    fab_conn_close(c);
    fab_node_destroy(n);
}

CHECK_MAIN()
