/*
 * test_fab_verbs.c: the verbs backend's selection and its contract in one
 * process. Runs everywhere: on a host without an RDMA device it checks the
 * errors and the fall-back to tcp (device selection messages, FLOWKV_FABRIC
 * =verbs giving FK_ENODEV with a line naming what was found, auto choosing
 * tcp and saying why); where a device exists (the Soft-RoCE VM,
 * tests/rdma-vm/verbs_suite.sh) it also runs one-sided operations, control
 * calls and datagrams over verbs and checks the work-request counters.
 */
#include "check.h"
#include "fab.h"
#include "fab_verbs.h"
#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEC FK_NSEC_PER_SEC

/* ---- log capture ---------------------------------------------------------------- */

static int g_pipe[2];

static void capture_start(void)
{
    CHECK_OK(pipe(g_pipe));
    fk_log_set_fd(g_pipe[1]);
    fk_log_set_level(FK_LOG_INFO); /* the backend choice is an info line */
}

/* Stops capturing; returns what was logged (static buffer). */
static const char *capture_end(void)
{
    static char buf[8192];
    fk_log_set_fd(2);
    close(g_pipe[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < sizeof(buf) && (r = read(g_pipe[0], buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(g_pipe[0]);
    return buf;
}

static int have_rdma(void)
{
    char why[256];
    return fab__verbs_probe(why, sizeof(why));
}

/* ---- device selection (pure) ------------------------------------------------------- */

TEST(select_names_what_was_found)
{
    const char *names[2] = {"rxe0", "mlx5_1"};
    int active[2] = {1, 0};
    char msg[256];
    CHECK_ERR(fab__verbs_select(NULL, names, active, 0, msg, sizeof(msg)), FK_ENODEV);
    CHECK_MSG(strstr(msg, "no RDMA device found") != NULL, "%s", msg);
    CHECK_EQ_I64(fab__verbs_select(NULL, names, active, 2, msg, sizeof(msg)), 0);
    CHECK_EQ_I64(fab__verbs_select("", names, active, 2, msg, sizeof(msg)), 0);
    CHECK_EQ_I64(fab__verbs_select("rxe0", names, active, 2, msg, sizeof(msg)), 0);
    CHECK_ERR(fab__verbs_select("mlx5_0", names, active, 2, msg, sizeof(msg)), FK_ENODEV);
    CHECK_MSG(strstr(msg, "mlx5_0 not found") && strstr(msg, "found: rxe0, mlx5_1 (port down)"),
              "%s", msg);
    CHECK_ERR(fab__verbs_select("mlx5_1", names, active, 2, msg, sizeof(msg)), FK_ENODEV);
    CHECK_MSG(strstr(msg, "mlx5_1 has no active port") != NULL, "%s", msg);
    active[0] = 0;
    CHECK_ERR(fab__verbs_select(NULL, names, active, 2, msg, sizeof(msg)), FK_ENODEV);
    CHECK_MSG(strstr(msg, "no RDMA device with an active port") != NULL, "%s", msg);
    active[1] = 1;
    CHECK_EQ_I64(fab__verbs_select(NULL, names, active, 2, msg, sizeof(msg)), 1);
}

TEST(parse_addresses)
{
    struct in_addr ip;
    uint32_t num;
    CHECK_OK(fab__verbs_parse("10.77.0.1:4791", &ip, &num, 65535));
    CHECK_EQ_U64(num, 4791);
    CHECK_OK(fab__verbs_parse("10.77.0.2:16777215", &ip, &num, 0xFFFFFF));
    CHECK_EQ_U64(num, 0xFFFFFF);
    CHECK_ERR(fab__verbs_parse("10.77.0.2:16777216", &ip, &num, 0xFFFFFF), FK_EINVAL);
    CHECK_ERR(fab__verbs_parse("host:1", &ip, &num, 65535), FK_EINVAL);
    CHECK_ERR(fab__verbs_parse("1.2.3.4:", &ip, &num, 65535), FK_EINVAL);
    CHECK_ERR(fab__verbs_parse("1.2.3.4", &ip, &num, 65535), FK_EINVAL);
    CHECK_ERR(fab__verbs_parse(NULL, &ip, &num, 65535), FK_EINVAL);
}

/* ---- backend choice ------------------------------------------------------------------ */

TEST(forced_verbs_without_device_is_enodev_with_reason)
{
    int rdma = have_rdma();
    setenv("FLOWKV_FABRIC", "verbs", 1);
    setenv("FLOWKV_RDMA_DEVICE", "nosuchdev0", 1);
    fab_node *n = NULL;
    capture_start();
    int rc = fab_node_create(NULL, &n);
    const char *log = capture_end();
    CHECK_ERR(rc, FK_ENODEV);
    CHECK_MSG(strstr(log, "nosuchdev0 not found") != NULL ||
                  strstr(log, "no RDMA device found") != NULL,
              "log: %s", log);
    if (!rdma) { /* no device at all: the plain case says so too */
        unsetenv("FLOWKV_RDMA_DEVICE");
        capture_start();
        rc = fab_node_create(NULL, &n);
        log = capture_end();
        CHECK_ERR(rc, FK_ENODEV);
        CHECK_MSG(strstr(log, "no RDMA device found") != NULL, "log: %s", log);
    }
    unsetenv("FLOWKV_RDMA_DEVICE");
    unsetenv("FLOWKV_FABRIC");
}

TEST(auto_picks_verbs_only_with_a_device_and_logs_why)
{
    unsetenv("FLOWKV_FABRIC");
    fab_node *n = NULL;
    capture_start();
    int rc = fab_node_create(NULL, &n);
    const char *log = capture_end();
    CHECK_OK(rc);
    const char *want = have_rdma() ? "verbs" : "tcp";
    CHECK_EQ_STR(fab_node_backend(n), want);
    CHECK_MSG(strstr(log, "fabric: auto chose") != NULL && strstr(log, want) != NULL, "log: %s",
              log);
    struct fab_counters c;
    fab_node_counters(n, &c);
    CHECK_EQ_U64(c.write + c.read + c.faa + c.connect, 0);
    fab_node_destroy(n);
    setenv("FLOWKV_FABRIC", "tcp", 1);
    CHECK_OK(fab_node_create(NULL, &n));
    CHECK_EQ_STR(fab_node_backend(n), "tcp");
    fab_node_destroy(n);
    unsetenv("FLOWKV_FABRIC");
}

/* ---- the contract over verbs (needs a device) ----------------------------------------- */

static int echo(void *data, uint64_t peer, const void *req, size_t len, void *resp, size_t cap)
{
    (void)data;
    (void)peer;
    size_t n = len < cap ? len : cap;
    memcpy(resp, req, n);
    return (int)n;
}

static struct fab_wc one(fab_conn *c)
{
    struct fab_wc wc;
    for (int i = 0; i < 50; i++) {
        int got = fab_poll(c, &wc, 1);
        CHECK_OK(got);
        if (got == 1)
            return wc;
        fab_conn_wait(c, 100 * FK_NSEC_PER_MSEC);
    }
    check__fail(__FILE__, __LINE__, "no completion in 5 s");
}

static uint64_t g_mem[512] __attribute__((aligned(64)));

/* Writes (inline, from a region, through the bounce ring), reads, a
 * fetch-and-add and a call on one connection, counters checked. */
static void run_ops(fab_node *a, fab_node *b)
{
    fab_mr *rmr, *lmr;
    static uint8_t local[8192] __attribute__((aligned(64)));
    CHECK_OK(fab_mr_reg(b, g_mem, sizeof(g_mem), &rmr));
    CHECK_OK(fab_mr_reg(a, local, sizeof(local), &lmr));
    fab_node_set_handlers(b, echo, NULL, NULL);
    struct fab_rkey k = fab_mr_rkey(rmr);
    fab_conn *c;
    CHECK_OK(fab_connect(a, fab_node_addr(b), 5 * SEC, &c));
    memset(local, 7, sizeof(local));
    uint64_t v = 99;
    CHECK_OK(fab_post_write(c, NULL, &v, 8, k.addr, k.key, 1, 0));                 /* inline */
    CHECK_OK(fab_post_write(c, lmr, local, 2048, k.addr + 8, k.key, 2, FAB_MORE)); /* region */
    CHECK_OK(fab_post_write(c, NULL, local, 1024, k.addr + 2056, k.key, 3, FAB_SIGNALED));
    CHECK_EQ_U64(one(c).cookie, 3);
    uint64_t r = 0;
    CHECK_OK(fab_post_read(c, NULL, &r, 8, k.addr, k.key, 4, 0));
    CHECK_EQ_U64(one(c).cookie, 4);
    CHECK_EQ_U64(r, 99);
    CHECK_OK(fab_post_read(c, lmr, local + 4096, 8, k.addr + 8, k.key, 5, 0));
    CHECK_EQ_U64(one(c).cookie, 5);
    CHECK_EQ_U64(local[4096], 7);
    CHECK_OK(fab_post_faa(c, k.addr + 8 * 400, k.key, 3, 6, 0));
    struct fab_wc wc = one(c);
    CHECK_EQ_U64(wc.value, 0);
    CHECK_EQ_U64(fab_load64(&g_mem[400]), 3);
    char resp[8];
    CHECK_EQ_I64(fab_call(c, "hello", 5, resp, sizeof(resp), 5 * SEC), 5);
    CHECK(memcmp(resp, "hello", 5) == 0);
    CHECK_EQ_U64(g_mem[1] & 0xff, 7);
    struct fab_counters ct;
    fab_node_counters(a, &ct);
    CHECK_EQ_U64(ct.write, 3);
    CHECK_EQ_U64(ct.write_inline, 1);
    CHECK_EQ_U64(ct.read, 2);
    CHECK_EQ_U64(ct.faa, 1);
    CHECK_EQ_U64(ct.connect, 1);
    CHECK(ct.completion >= 4);
    fab_conn_close(c);
    fab_mr_dereg(lmr);
    fab_mr_dereg(rmr);
}

TEST(verbs_ops_and_counters_when_a_device_exists)
{
    if (!have_rdma()) {
        /* The tcp fall-back runs the same operations; counters stay 0. */
        setenv("FLOWKV_FABRIC", "tcp", 1);
    } else {
        setenv("FLOWKV_FABRIC", "verbs", 1);
    }
    fab_node *a, *b;
    CHECK_OK(fab_node_create(NULL, &a));
    CHECK_OK(fab_node_create(NULL, &b));
    if (strcmp(fab_node_backend(a), "verbs") == 0) {
        run_ops(a, b);
    } else {
        struct fab_counters ct;
        fab_node_counters(a, &ct);
        CHECK_EQ_U64(ct.write + ct.read + ct.faa, 0);
    }
    fab_node_destroy(a);
    fab_node_destroy(b);
    unsetenv("FLOWKV_FABRIC");
}

CHECK_MAIN()
