/*
 * kv_check: a libflowkv client for the cluster tests
 * (tests/integration/test_cluster.sh). Every mode exits 0 when what it
 * checks holds, 1 with a message naming what did not, 2 on usage.
 *
 *   kv_check CONF api                   every call of the library, checked
 *   kv_check CONF paging N              loads N keys pg-00000.. and pages
 *                                       through them with flowkv_scan_range
 *   kv_check CONF quota fill|clear      fills the cluster with q-* keys until
 *                                       FK_EQUOTA (checking its detail), or
 *                                       deletes them and writes again
 *   kv_check CONF write PREFIX N ACKS   puts PREFIX-i = v-i for i < N, one at
 *                                       a time, appending i to ACKS once
 *                                       acknowledged (a failure moves on)
 *   kv_check CONF verify PREFIX ACKS    every acknowledged key has its value
 *   kv_check CONF garbage REPLICA       malformed bytes on the replica's
 *                                       request flow and the ordered flow
 *   kv_check CONF bulk load|check PREFIX N
 *                                       puts (load) or reads back and
 *                                       compares (check) PREFIX-i for i < N,
 *                                       each a 1,000-byte value made from i,
 *                                       64 in flight: bulk data for the
 *                                       state transfer tests (64 MiB = 67,109
 *                                       pairs)
 */
#include "fk_conf.h"
#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"
#include "fkc_proto.h"
#include "flow.h"
#include "flow_msg.h"
#include "flowkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define BULK_VLEN 1000 /* bytes of a bulk value (mode_bulk) */

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "kv_check: line %d: %s: ", __LINE__, #cond);                           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static int put_s(flowkv *kv, const char *k, const char *v)
{
    return flowkv_put(kv, k, strlen(k), v, strlen(v));
}

static void check_sync(flowkv *kv)
{
    char val[FLOWKV_VAL_MAX];
    size_t vlen = 0;
    int rc = put_s(kv, "api-a", "1");
    EXPECT(rc == 0, "put: %s", fk_strerror(rc));
    rc = flowkv_get(kv, "api-a", 5, val, sizeof(val), &vlen);
    EXPECT(rc == 0 && vlen == 1 && val[0] == '1', "get: %s, %zu bytes", fk_strerror(rc), vlen);
    rc = flowkv_get(kv, "api-a", 5, val, 0, &vlen);
    EXPECT(rc == FK_ETOOBIG && vlen == 1, "get into a 0-byte buffer: %s", fk_strerror(rc));
    rc = flowkv_get(kv, "api-missing", 11, val, sizeof(val), &vlen);
    EXPECT(rc == FK_ENOTFOUND, "get of a missing key: %s", fk_strerror(rc));
    rc = flowkv_cas(kv, "api-a", 5, "2", 1, "3", 1);
    EXPECT(rc == FK_ECASFAIL, "cas with a wrong expected value: %s", fk_strerror(rc));
    rc = flowkv_cas(kv, "api-a", 5, "1", 1, "3", 1);
    EXPECT(rc == 0, "cas: %s", fk_strerror(rc));
    rc = flowkv_get(kv, "api-a", 5, val, sizeof(val), &vlen);
    EXPECT(rc == 0 && vlen == 1 && val[0] == '3', "get after cas: %s", fk_strerror(rc));
    rc = put_s(kv, "api-b", "2");
    EXPECT(rc == 0, "put b: %s", fk_strerror(rc));
    rc = put_s(kv, "api-c", "");
    EXPECT(rc == 0, "put of an empty value: %s", fk_strerror(rc));
    static struct flowkv_result res;
    rc = flowkv_scan(kv, "api-", 4, 16, &res);
    size_t off = 0, kl, vl;
    const uint8_t *k, *v;
    int n = 0;
    const char *want[] = {"api-a", "api-b", "api-c"};
    while (rc == 0 && flowkv_scan_next(&res, &off, &k, &kl, &v, &vl) == 1 && n < 3) {
        EXPECT(kl == 5 && memcmp(k, want[n], 5) == 0, "scan pair %d is %.*s", n, (int)kl, k);
        n++;
    }
    EXPECT(rc == 0 && n == 3, "scan: %s, %d pairs", fk_strerror(rc), n);
    rc = flowkv_del(kv, "api-b", 5);
    EXPECT(rc == 0, "del: %s", fk_strerror(rc));
    rc = flowkv_del(kv, "api-b", 5);
    EXPECT(rc == FK_ENOTFOUND, "del of a deleted key: %s", fk_strerror(rc));
}

/* The size limits (README, Limits): the largest key and value work, one
 * byte more is refused with the error that names the limit. Multi-Paxos
 * takes values of FLOWKV_VAL_MAX (1 MiB); NOPaxos requests of
 * FLOWKV_NOP_OP_MAX bytes of key and values (its ordered multicast). */
static void check_limits(flowkv *kv, int nop)
{
    static char big[FLOWKV_VAL_MAX + 2];
    memset(big, 'x', sizeof(big));
    int rc = flowkv_put(kv, big, FLOWKV_KEY_MAX + 1, "v", 1);
    EXPECT(rc == FK_EKEYSIZE, "oversize key: %s", fk_strerror(rc));
    rc = flowkv_get(kv, big, FLOWKV_KEY_MAX + 1, big, sizeof big, NULL);
    EXPECT(rc == FK_EKEYSIZE, "get of an oversize key: %s", fk_strerror(rc));
    rc = flowkv_put(kv, "k", 1, big, FLOWKV_VAL_MAX + 1);
    EXPECT(rc == FK_EVALSIZE, "oversize value: %s", fk_strerror(rc));
    size_t vmax = nop ? FLOWKV_NOP_OP_MAX - FLOWKV_KEY_MAX : FLOWKV_VAL_MAX;
    rc = flowkv_put(kv, big, FLOWKV_KEY_MAX, big, vmax);
    EXPECT(rc == 0, "largest key and value: %s", fk_strerror(rc));
    if (nop) {
        rc = flowkv_put(kv, big, FLOWKV_KEY_MAX, big, vmax + 1);
        EXPECT(rc == FK_EVALSIZE && strstr(flowkv_error_detail(kv), "nopaxos carries at most"),
               "oversize NOPaxos request: %s (%s)", fk_strerror(rc), flowkv_error_detail(kv));
    }
    /* The largest operation: a CAS with two values of the largest size
     * (Multi-Paxos: 2 MiB in one log entry; NOPaxos: ten kv.oum fragments,
     * fkc_proto.h), then read back. */
    static char big2[FLOWKV_VAL_MAX], got[FLOWKV_VAL_MAX];
    size_t cmax = nop ? vmax / 2 : vmax;
    memset(big2, 'y', sizeof(big2));
    rc = flowkv_put(kv, big, FLOWKV_KEY_MAX, big, cmax);
    EXPECT(rc == 0, "put before the largest compare-and-swap: %s", fk_strerror(rc));
    rc = flowkv_cas(kv, big, FLOWKV_KEY_MAX, big, cmax, big2, cmax);
    EXPECT(rc == 0, "largest compare-and-swap: %s", fk_strerror(rc));
    size_t glen = 0;
    rc = flowkv_get(kv, big, FLOWKV_KEY_MAX, got, sizeof(got), &glen);
    EXPECT(rc == 0 && glen == cmax && memcmp(got, big2, glen) == 0,
           "largest value read back: %s, %zu bytes", fk_strerror(rc), glen);
    rc = flowkv_get(kv, big, FLOWKV_KEY_MAX, got, 10, &glen);
    EXPECT(rc == FK_ETOOBIG && glen == cmax, "get into a short buffer: %s", fk_strerror(rc));
    rc = flowkv_del(kv, big, FLOWKV_KEY_MAX); /* room under the test's 2 MiB quota */
    EXPECT(rc == 0, "del of the largest pair: %s", fk_strerror(rc));
    rc = flowkv_put(kv, "", 0, "v", 1);
    EXPECT(rc == FK_EINVAL, "empty key: %s", fk_strerror(rc));
    static struct flowkv_result res;
    rc = flowkv_scan(kv, "a", 1, FLOWKV_SCAN_MAX + 1, &res);
    EXPECT(rc == FK_EINVAL, "scan of too many pairs: %s", fk_strerror(rc));
}

/* The pipelined interface: 64 puts through 8 slots, then 64 gets. */
static void check_async(const char *conf)
{
    struct flowkv_opts o = {.pipeline = 8};
    flowkv *kv;
    char err[256];
    int rc = flowkv_open(conf, &o, &kv, err, sizeof(err));
    EXPECT(rc == 0, "open with a pipeline: %s", err);
    if (rc < 0)
        return;
    char keys[64][16], vals[64][16];
    int seen[64] = {0};
    for (int pass = 0; pass < 2; pass++) {
        int next = 0, done = 0;
        uint64_t deadline = fk_now_ns() + 20ULL * FK_NSEC_PER_SEC;
        while (done < 64 && fk_now_ns() < deadline) {
            while (next < 64) {
                snprintf(keys[next], 16, "async-%d", next);
                snprintf(vals[next], 16, "v%d", next * 7);
                struct flowkv_op op = {.type = pass ? FLOWKV_GET : FLOWKV_PUT,
                                       .key = keys[next],
                                       .klen = strlen(keys[next]),
                                       .val = vals[next],
                                       .vlen = strlen(vals[next]),
                                       .tag = (uint64_t)next};
                rc = flowkv_submit(kv, &op);
                if (rc == FK_EBUSY)
                    break;
                EXPECT(rc == 0, "submit: %s", fk_strerror(rc));
                next++;
            }
            EXPECT(flowkv_inflight(kv) <= 8, "%u in flight with a pipeline of 8",
                   flowkv_inflight(kv));
            struct flowkv_done d[8];
            int n = flowkv_poll(kv, d, 8, 100 * FK_NSEC_PER_MSEC);
            for (int i = 0; i < n; i++) {
                int t = (int)d[i].tag;
                EXPECT(t >= 0 && t < 64 && seen[t] == pass, "completion tag %d twice", t);
                EXPECT(d[i].status == 0, "op %d: %s", t, fk_strerror(d[i].status));
                if (pass && d[i].status == 0)
                    EXPECT(d[i].len == strlen(vals[t]) && memcmp(d[i].data, vals[t], d[i].len) == 0,
                           "get %d returned another value", t);
                seen[t] = pass + 1;
                done++;
            }
        }
        EXPECT(done == 64, "pass %d completed %d of 64", pass, done);
    }
    flowkv_close(kv);
}

/* One thread, 16 handles of one slot each (flowkv_poll_set): each handle
 * puts then gets its key; every completion names its handle. Sets that
 * mix channels, repeat a handle or overlap another set are refused. */
static void check_set(const char *conf)
{
    enum { H = 16 };
    flowkv *kv[H] = {0}, *other = NULL;
    char err[256], key[H][16];
    struct flowkv_opts o = {.pipeline = 1};
    int opened = 0, rc = 0;
    for (; opened < H && rc == 0; opened++)
        rc = flowkv_open(conf, &o, &kv[opened], err, sizeof(err));
    EXPECT(rc == 0, "open 16 handles: %s", err);
    struct flowkv_opts own = {.own_channel = 1};
    EXPECT(flowkv_open(conf, &own, &other, err, sizeof(err)) == 0, "open on its own channel: %s",
           err);
    if (rc == 0 && other != NULL) {
        struct flowkv_done d[H];
        flowkv *mixed[2] = {kv[0], other}, *twice[2] = {kv[1], kv[1]};
        EXPECT(flowkv_poll_set(mixed, 2, d, H, 0) == FK_EINVAL, "a set of two channels polled");
        EXPECT(flowkv_poll_set(twice, 2, d, H, 0) == FK_EINVAL, "a set naming a handle twice");
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < H; i++) {
                snprintf(key[i], sizeof key[i], "set-%d", i);
                struct flowkv_op op = {.type = pass ? FLOWKV_GET : FLOWKV_PUT,
                                       .key = key[i],
                                       .klen = strlen(key[i]),
                                       .val = key[i],
                                       .vlen = strlen(key[i]),
                                       .tag = (uint64_t)(100 + i)};
                rc = flowkv_submit(kv[i], &op);
                EXPECT(rc == 0, "submit on handle %d: %s", i, fk_strerror(rc));
            }
            int seen[H] = {0}, done = 0;
            uint64_t deadline = fk_now_ns() + 20ULL * FK_NSEC_PER_SEC;
            while (done < H && fk_now_ns() < deadline) {
                int n = flowkv_poll_set(kv, H, d, H, 100 * FK_NSEC_PER_MSEC);
                EXPECT(n >= 0, "poll_set: %s", fk_strerror(n));
                for (int j = 0; j < n; j++) {
                    uint32_t h = d[j].handle;
                    EXPECT(h < H && d[j].tag == 100 + h && !seen[h],
                           "completion of handle %u tagged %lu", h, (unsigned long)d[j].tag);
                    EXPECT(d[j].status == 0, "handle %u: %s", h, fk_strerror(d[j].status));
                    if (pass && h < H && d[j].status == 0)
                        EXPECT(d[j].len == strlen(key[h]) &&
                                   memcmp(d[j].data, key[h], d[j].len) == 0,
                               "handle %u got another value", h);
                    if (h < H)
                        seen[h] = 1;
                    done++;
                }
            }
            EXPECT(done == H, "pass %d: %d of 16 handles completed", pass, done);
        }
    }
    flowkv_close(other);
    for (int i = 0; i < H; i++)
        flowkv_close(kv[i]);
}

static int mode_api(const char *conf)
{
    flowkv *kv;
    char err[256];
    int rc = flowkv_open(conf, NULL, &kv, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "kv_check: open: %s\n", err);
        return 1;
    }
    check_sync(kv);
    struct flowkv_replica_status st;
    int up = 0, nop = 0;
    for (uint32_t i = 0; i < flowkv_replicas(kv); i++) {
        if (flowkv_status(kv, i, &st, FK_NSEC_PER_SEC) == 0 && st.reachable) {
            up++;
            nop = strcmp(st.protocol, "nopaxos") == 0;
        }
    }
    check_limits(kv, nop);
    EXPECT(up == (int)flowkv_replicas(kv), "%d replicas answered status", up);
    flowkv_close(kv);
    check_async(conf);
    check_set(conf);
    EXPECT(flowkv_open("/nonexistent.conf", NULL, &kv, err, sizeof(err)) < 0,
           "opening a missing file succeeded");
    return failures ? 1 : 0;
}

/* Loads keys pg-%05d = their number, pipelined. */
/* Runs operations 0..n-1 with up to 64 in flight: make(i) fills op
 * (its buffers must stay valid until it completes: slot i % 64), done sees
 * each completion. Returns how many completed (bounded: 300 s). */
typedef void (*pipe_make_fn)(void *arg, long i, struct flowkv_op *op);
typedef void (*pipe_done_fn)(void *arg, const struct flowkv_done *d);

static long pipelined(flowkv *kv, long n, pipe_make_fn make, pipe_done_fn done, void *arg)
{
    long next = 0, finished = 0;
    uint64_t deadline = fk_now_ns() + 300ULL * FK_NSEC_PER_SEC;
    while (finished < n && fk_now_ns() < deadline && failures == 0) {
        while (next < n) {
            struct flowkv_op op;
            make(arg, next, &op);
            op.tag = (uint64_t)next;
            int rc = flowkv_submit(kv, &op);
            if (rc == FK_EBUSY)
                break;
            EXPECT(rc == 0, "submit: %s", fk_strerror(rc));
            next++;
        }
        struct flowkv_done d[64];
        int got = flowkv_poll(kv, d, 64, 100 * FK_NSEC_PER_MSEC);
        for (int i = 0; i < got; i++)
            done(arg, &d[i]);
        finished += got;
    }
    return finished;
}

static void page_make(void *arg, long i, struct flowkv_op *op)
{
    char(*keys)[16] = arg;
    char *k = keys[i % 64];
    snprintf(k, 16, "pg-%05ld", i);
    *op = (struct flowkv_op){
        .type = FLOWKV_PUT, .key = k, .klen = strlen(k), .val = k + 3, .vlen = strlen(k + 3)};
}

static void page_done(void *arg, const struct flowkv_done *d)
{
    (void)arg;
    EXPECT(d->status == 0, "put %lu: %s", (unsigned long)d->tag, fk_strerror(d->status));
}

static void load_pages(flowkv *kv, long n)
{
    static char keys[64][16];
    long done = pipelined(kv, n, page_make, page_done, keys);
    EXPECT(done == n, "loaded %ld of %ld keys", done, n);
}

struct walk {
    long next; /* the number the next key must carry */
    char last[16];
};

static int walk_pair(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    struct walk *w = arg;
    char want[16];
    snprintf(want, sizeof want, "pg-%05ld", w->next);
    if (kl != strlen(want) || memcmp(k, want, kl) != 0 || vl != kl - 3 ||
        memcmp(v, want + 3, vl) != 0) {
        fprintf(stderr, "kv_check: scan: got %.*s, want %s\n", (int)kl, (const char *)k, want);
        return -1;
    }
    memcpy(w->last, want, sizeof want);
    w->next++;
    return 0;
}

/* Pages through n keys with flowkv_scan_range: calls of up to
 * FLOWKV_SCAN_COUNT_MAX pairs, each from just after the last key of the
 * one before; then an end key, and the count limit. */
static int mode_paging(const char *conf, long n)
{
    struct flowkv_opts o = {.pipeline = 64, .timeout_ns = 10 * FK_NSEC_PER_SEC};
    flowkv *kv;
    char err[256];
    if (flowkv_open(conf, &o, &kv, err, sizeof(err)) < 0) {
        fprintf(stderr, "kv_check: open: %s\n", err);
        return 1;
    }
    load_pages(kv, n);
    struct walk w = {0};
    char start[17] = "pg-";
    size_t slen = 3;
    for (int call = 0; call < 100 && w.next < n && failures == 0; call++) {
        int rc = flowkv_scan_range(kv, start, slen, "pg.", 3, FLOWKV_SCAN_COUNT_MAX, walk_pair, &w);
        EXPECT(rc == FLOWKV_SCAN_COUNT_MAX || (rc > 0 && w.next == n), "scan call %d: %d (%s)",
               call, rc, rc < 0 ? fk_strerror(rc) : "pairs");
        slen = strlen(w.last) + 1; /* the successor of the last key: it plus a zero byte */
        memcpy(start, w.last, slen);
    }
    EXPECT(w.next == n, "paged through %ld of %ld keys", w.next, n);
    struct walk w2 = {0};
    int rc = flowkv_scan_range(kv, "pg-", 3, "pg-00100", 8, FLOWKV_SCAN_COUNT_MAX, walk_pair, &w2);
    EXPECT(rc == 100 && w2.next == 100, "scan up to an end key: %d pairs", rc);
    rc = flowkv_scan_range(kv, "pg-", 3, NULL, 0, FLOWKV_SCAN_COUNT_MAX + 1, walk_pair, &w2);
    EXPECT(rc == FK_EINVAL, "scan of more than the count limit: %s", fk_strerror(rc));
    flowkv_close(kv);
    return failures ? 1 : 0;
}

/* The data quota (test_cluster.sh's 1 or 2 MiB): puts of 2,000-byte values
 * (NOPaxos takes 2,048 bytes of key and value a request) until the
 * cluster answers FK_EQUOTA with "N of M bytes" (M the quota), or deletes
 * them again. */
static int mode_quota(const char *conf, const char *what)
{
    flowkv *kv;
    char err[256], key[16];
    static char val[2000];
    memset(val, 'q', sizeof val);
    if (flowkv_open(conf, NULL, &kv, err, sizeof(err)) < 0) {
        fprintf(stderr, "kv_check: open: %s\n", err);
        return 1;
    }
    int fill = strcmp(what, "fill") == 0, rc = 0, i;
    for (i = 0; i < 4000; i++) {
        snprintf(key, sizeof key, "q-%05d", i);
        rc = fill ? flowkv_put(kv, key, strlen(key), val, sizeof val)
                  : flowkv_del(kv, key, strlen(key));
        if (rc == FK_EQUOTA || (!fill && rc == FK_ENOTFOUND))
            break;
        EXPECT(rc == 0, "%s %s: %s", fill ? "put" : "del", key, fk_strerror(rc));
        if (rc < 0)
            break;
    }
    if (fill) {
        unsigned long long n = 0, m = 0;
        const char *d = flowkv_error_detail(kv);
        EXPECT(rc == FK_EQUOTA, "after %d puts: %s", i, fk_strerror(rc));
        EXPECT(sscanf(d, "%llu of %llu bytes", &n, &m) == 2 && n > m && m > 0, "quota detail '%s'",
               d); /* the CLI's check names M (test_cluster.sh) */
    } else {
        EXPECT(rc == FK_ENOTFOUND && i > 0, "deleted %d keys: %s", i, fk_strerror(rc));
        rc = flowkv_put(kv, "q-again", 7, val, sizeof val);
        EXPECT(rc == 0, "a put after the quota freed: %s", fk_strerror(rc));
    }
    flowkv_close(kv);
    return failures ? 1 : 0;
}

static int mode_write(const char *conf, const char *prefix, long n, const char *acks)
{
    struct flowkv_opts o = {.timeout_ns = 3 * FK_NSEC_PER_SEC};
    flowkv *kv;
    char err[256];
    if (flowkv_open(conf, &o, &kv, err, sizeof(err)) < 0) {
        fprintf(stderr, "kv_check: open: %s\n", err);
        return 1;
    }
    FILE *f = fopen(acks, "a");
    if (f == NULL)
        return 1;
    long ok = 0;
    for (long i = 0; i < n; i++) {
        char k[64], v[32];
        snprintf(k, sizeof(k), "%s-%ld", prefix, i);
        snprintf(v, sizeof(v), "v-%ld", i);
        if (put_s(kv, k, v) == 0) {
            fprintf(f, "%ld\n", i);
            fflush(f);
            ok++;
        }
    }
    fclose(f);
    flowkv_close(kv);
    printf("%ld of %ld writes acknowledged\n", ok, n);
    return ok > 0 ? 0 : 1;
}

static int mode_verify(const char *conf, const char *prefix, const char *acks)
{
    flowkv *kv;
    char err[256];
    if (flowkv_open(conf, NULL, &kv, err, sizeof(err)) < 0) {
        fprintf(stderr, "kv_check: open: %s\n", err);
        return 1;
    }
    FILE *f = fopen(acks, "r");
    long i, n = 0;
    while (f != NULL && fscanf(f, "%ld", &i) == 1) {
        char k[64], want[32], got[64];
        size_t len = 0;
        snprintf(k, sizeof(k), "%s-%ld", prefix, i);
        snprintf(want, sizeof(want), "v-%ld", i);
        int rc = flowkv_get(kv, k, strlen(k), got, sizeof(got), &len);
        EXPECT(rc == 0 && len == strlen(want) && memcmp(got, want, len) == 0, "acknowledged %s: %s",
               k, fk_strerror(rc));
        n++;
    }
    if (f != NULL)
        fclose(f);
    flowkv_close(kv);
    printf("%ld acknowledged writes checked, %d missing or wrong\n", n, failures);
    return failures || n == 0 ? 1 : 0;
}

/* len bytes of xorshift64 from state *x. */
static void random_bytes(uint8_t *b, size_t len, uint64_t *x)
{
    for (size_t j = 0; j < len; j++) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        b[j] = (uint8_t)*x;
    }
}

/* Malformed requests straight onto the replica's flows: lying lengths, bad
 * kinds, random bytes, truncated protocol messages, bogus ordered messages. */
static int mode_garbage(const char *conf, uint32_t replica)
{
    struct fk_cluster_conf c;
    char err[FK_CONF_ERR_MAX];
    if (fk_conf_load(conf, &c, err, sizeof(err)) < 0 || replica >= c.n_nodes)
        return 2;
    flow_node *node;
    if (flow_node_create(NULL, &node) < 0)
        return 1;
    for (uint32_t i = 0; i < c.n_nodes; i++)
        flow_node_add_peer(node, c.nodes[i].address);
    char name[FLOW_NAME_MAX];
    snprintf(name, sizeof(name), "%s%u", FKC_FLOW_REQ, replica);
    flow_source *s;
    int rc = flow_source_open(node, name, FLOW_ANY, 2 * FK_NSEC_PER_SEC, &s);
    EXPECT(rc == 0, "open %s: %s", name, fk_strerror(rc));
    if (rc == 0) {
        struct flow_msg_tx tx;
        flow_msg_tx_init(&tx, s, FKC_REQ_TUPLE);
        uint8_t buf[3000];
        uint64_t x = 88172645463325252ULL;
        for (int i = 0; i < 200; i++) {
            size_t len = 1 + (size_t)(i * 37) % sizeof(buf);
            random_bytes(buf, len, &x);
            if (i % 3 == 0)
                buf[0] = FKC_OP; /* a valid kind, then garbage */
            flow_msg_send(&tx, 0, x | 1, 0, buf, len);
        }
        /* Raw fragments that lie about their lengths. */
        uint8_t frag[FKC_REQ_TUPLE];
        memset(frag, 0xff, sizeof(frag));
        for (int i = 0; i < 20; i++)
            flow_push(s, frag, sizeof(frag));
        flow_msg_tx_free(&tx);
        flow_source_close(s);
    }
    if (c.protocol == FK_PROTO_NOPAXOS) {
        rc = flow_source_open(node, FKC_FLOW_OUM, FLOW_ANY, 2 * FK_NSEC_PER_SEC, &s);
        EXPECT(rc == 0, "open kv.oum: %s", fk_strerror(rc));
        if (rc == 0) {
            static uint8_t t[FKC_OUM_TUPLE];
            for (int i = 0; i < 20; i++) { /* fragments that lie */
                memset(t, i * 13, sizeof(t));
                flow_push(s, t, sizeof(t));
            }
            /* The first fragment of a message that never ends (flow_msg.h
             * layout: dst, id, len, off, from, chunk), then whole messages
             * of random bytes, some of several fragments. */
            uint64_t head[2] = {5, 1000};
            uint32_t frag[4] = {2 * FKC_OUM_TUPLE, 0, 0, FKC_OUM_TUPLE - FLOW_MSG_HDR};
            memcpy(t, head, sizeof(head));
            memcpy(t + sizeof(head), frag, sizeof(frag));
            flow_push(s, t, sizeof(t));
            struct flow_msg_tx tx;
            flow_msg_tx_init(&tx, s, FKC_OUM_TUPLE);
            static uint8_t m[FKC_OUM_MSG_MAX];
            uint64_t x = 2463534242ULL;
            for (int i = 0; i < 20; i++) {
                size_t len = 1 + (size_t)(i * 211) % sizeof(m);
                random_bytes(m, len, &x);
                flow_msg_send(&tx, -1, x | 1, 0, m, len);
            }
            flow_msg_tx_free(&tx);
            flow_source_close(s);
        }
    }
    flow_node_destroy(node);
    return failures ? 1 : 0;
}

/* The 1,000-byte value of bulk key i: its number, then a pattern of it. */
static void bulk_value(long i, char *v)
{
    int n = snprintf(v, BULK_VLEN, "%ld:", i);
    for (int k = n; k < BULK_VLEN; k++)
        v[k] = (char)('a' + (i * 7 + k) % 26);
}

struct bulk {
    const char *prefix;
    int load;
    long bad;
    char keys[64][64], vals[64][BULK_VLEN];
};

static void bulk_make(void *arg, long i, struct flowkv_op *op)
{
    struct bulk *b = arg;
    char *k = b->keys[i % 64], *v = b->vals[i % 64];
    snprintf(k, 64, "%s-%08ld", b->prefix, i);
    bulk_value(i, v);
    *op = (struct flowkv_op){.type = b->load ? FLOWKV_PUT : FLOWKV_GET,
                             .key = k,
                             .klen = strlen(k),
                             .val = b->load ? v : NULL,
                             .vlen = b->load ? BULK_VLEN : 0};
}

static void bulk_done(void *arg, const struct flowkv_done *d)
{
    struct bulk *b = arg;
    EXPECT(d->status == 0, "%s %lu: %s", b->load ? "put" : "get", (unsigned long)d->tag,
           fk_strerror(d->status));
    if (!b->load && d->status == 0) {
        char want[BULK_VLEN];
        bulk_value((long)d->tag, want);
        b->bad += d->len != BULK_VLEN || memcmp(d->data, want, BULK_VLEN) != 0;
    }
}

static int mode_bulk(const char *conf, const char *what, const char *prefix, long n)
{
    struct flowkv_opts o = {.pipeline = 64, .timeout_ns = 20 * FK_NSEC_PER_SEC};
    flowkv *kv;
    char err[256];
    if (flowkv_open(conf, &o, &kv, err, sizeof(err)) < 0) {
        fprintf(stderr, "kv_check: open: %s\n", err);
        return 1;
    }
    static struct bulk b;
    b.prefix = prefix;
    b.load = strcmp(what, "load") == 0;
    b.bad = 0;
    long done = pipelined(kv, n, bulk_make, bulk_done, &b);
    EXPECT(done == n, "%s: %ld of %ld keys", what, done, n);
    EXPECT(b.bad == 0, "%ld of %ld values differ from what was put", b.bad, n);
    flowkv_close(kv);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (getenv("FLOWKV_LOG") == NULL)
        fk_log_set_level(FK_LOG_WARN);
    if (argc >= 3 && strcmp(argv[2], "api") == 0)
        return mode_api(argv[1]);
    if (argc == 6 && strcmp(argv[2], "write") == 0)
        return mode_write(argv[1], argv[3], atol(argv[4]), argv[5]);
    if (argc == 5 && strcmp(argv[2], "verify") == 0)
        return mode_verify(argv[1], argv[3], argv[4]);
    if (argc == 4 && strcmp(argv[2], "quota") == 0)
        return mode_quota(argv[1], argv[3]);
    if (argc == 4 && strcmp(argv[2], "paging") == 0)
        return mode_paging(argv[1], atol(argv[3]));
    if (argc == 4 && strcmp(argv[2], "garbage") == 0)
        return mode_garbage(argv[1], (uint32_t)atoi(argv[3]));
    if (argc == 6 && strcmp(argv[2], "bulk") == 0)
        return mode_bulk(argv[1], argv[3], argv[4], atol(argv[5]));
    fprintf(stderr, "usage: kv_check CONF api|paging N|quota fill|clear|write PREFIX N ACKS|"
                    "verify PREFIX ACKS|garbage ID|bulk load|check PREFIX N\n");
    return 2;
}
