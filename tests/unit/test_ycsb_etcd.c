/*
 * Unit tests for ycsb/ycsb_record (the one-value record encoding),
 * ycsb/ycsb_etcd_json (the gateway's JSON and base64) and ycsb/ycsb_etcd
 * (the binding) against a scripted HTTP server on loopback in this process:
 * each test lists the responses the server gives, in order, and checks the
 * requests the binding sent and the results it reported, for good answers,
 * error answers, garbage, oversized answers, a refused connection and a
 * server that never answers. The binding against a real etcd cluster is
 * tests/integration/test_ycsb_etcd.sh.
 */
#include "check.h"
#include "fk_error.h"
#include "fk_time.h"
#include "ycsb_etcd.h"
#include "ycsb_record.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- record encoding ---------------------------------------------------------- */

static struct ycsb_field fld(const char *name, const char *value)
{
    return (struct ycsb_field){name, (const uint8_t *)value, (uint32_t)strlen(value)};
}

TEST(record_field_index)
{
    CHECK_EQ_I64(ycsb_record_field_index("field", "field0", 10), 0);
    CHECK_EQ_I64(ycsb_record_field_index("field", "field9", 10), 9);
    CHECK_EQ_I64(ycsb_record_field_index("f", "f255", 256), 255);
    CHECK_ERR(ycsb_record_field_index("field", "field10", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", "field01", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", "field", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", "field-1", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", "fielt1", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", "field1x", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", "field99999999999999999999", 10), FK_EINVAL);
    CHECK_ERR(ycsb_record_field_index("field", NULL, 10), FK_EINVAL);
}

TEST(record_encode_layout)
{
    /* Fields given out of order land in index order. */
    struct ycsb_field f[3] = {fld("field2", "ccc"), fld("field0", "a"), fld("field1", "")};
    uint8_t out[64];
    int64_t n = ycsb_record_encode(out, sizeof out, "field", 3, f, 3);
    static const uint8_t want[] = {'Y', 'R', 1, 0, 3, 0, 0, 0, 1,   0,   0,   0,
                                   0,   0,   0, 0, 3, 0, 0, 0, 'a', 'c', 'c', 'c'};
    CHECK_EQ_I64(n, (int64_t)sizeof want);
    CHECK_EQ_I64(n, (int64_t)ycsb_record_len(3, 4));
    CHECK(memcmp(out, want, sizeof want) == 0);

    struct ycsb_record_view v;
    CHECK_OK(ycsb_record_parse(out, (size_t)n, &v));
    CHECK_EQ_I64(v.nfields, 3);
    const uint8_t *val;
    uint32_t len;
    CHECK_OK(ycsb_record_field(&v, 2, &val, &len));
    CHECK_EQ_I64(len, 3);
    CHECK(memcmp(val, "ccc", 3) == 0);
    CHECK_OK(ycsb_record_field(&v, 1, &val, &len));
    CHECK_EQ_I64(len, 0);
    CHECK_ERR(ycsb_record_field(&v, 3, &val, &len), FK_ENOTFOUND);

    /* DFI's record: one 64-byte field is 76 bytes. */
    uint8_t big[64];
    memset(big, 'x', sizeof big);
    struct ycsb_field one = {"field0", big, 64};
    CHECK_EQ_I64(ycsb_record_encode(out, sizeof out, "field", 1, &one, 1), FK_ETOOBIG);
    uint8_t out2[76];
    CHECK_EQ_I64(ycsb_record_encode(out2, sizeof out2, "field", 1, &one, 1), 76);
}

TEST(record_encode_rejects)
{
    uint8_t out[64];
    struct ycsb_field dup[2] = {fld("field0", "a"), fld("field0", "b")};
    CHECK_ERR(ycsb_record_encode(out, sizeof out, "field", 2, dup, 2), FK_EINVAL);
    struct ycsb_field one[1] = {fld("field0", "a")};
    CHECK_ERR(ycsb_record_encode(out, sizeof out, "field", 2, one, 1), FK_EINVAL); /* missing */
    struct ycsb_field bad[1] = {fld("value0", "a")};
    CHECK_ERR(ycsb_record_encode(out, sizeof out, "field", 1, bad, 1), FK_EINVAL);
    CHECK_ERR(ycsb_record_encode(out, sizeof out, "field", 0, one, 0), FK_EINVAL);
    CHECK_ERR(ycsb_record_encode(out, sizeof out, "field", YCSB_FIELDS_MAX + 1, one, 1), FK_EINVAL);
}

TEST(record_parse_malformed)
{
    struct ycsb_field f[2] = {fld("field0", "abc"), fld("field1", "de")};
    uint8_t rec[64], bad[64];
    int64_t n = ycsb_record_encode(rec, sizeof rec, "field", 2, f, 2);
    CHECK_EQ_I64(n, 8 + 8 + 5);
    struct ycsb_record_view v;
    for (int64_t cut = 0; cut < n; cut++) /* every truncation */
        CHECK_ERR(ycsb_record_parse(rec, (size_t)cut, &v), FK_EMALFORMED);
    memcpy(bad, rec, (size_t)n);
    bad[(size_t)n] = 'z'; /* one byte too many */
    CHECK_ERR(ycsb_record_parse(bad, (size_t)n + 1, &v), FK_EMALFORMED);
    static const struct {
        size_t at;
        uint8_t byte;
    } flips[] = {{0, 'X'}, {1, 'X'}, {2, 2}, {3, 1}, {4, 0}, {4, 3}, {7, 1}, {8, 4}, {12, 0xff}};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(bad, rec, (size_t)n);
        bad[flips[i].at] = flips[i].byte;
        CHECK_MSG(ycsb_record_parse(bad, (size_t)n, &v) == FK_EMALFORMED, "flip %zu", i);
    }
    CHECK_ERR(ycsb_record_parse(NULL, 0, &v), FK_EMALFORMED);
}

TEST(record_merge)
{
    struct ycsb_field f[3] = {fld("field0", "aaa"), fld("field1", "bb"), fld("field2", "c")};
    uint8_t old[64], out[64], want[64];
    int64_t n = ycsb_record_encode(old, sizeof old, "field", 3, f, 3);
    CHECK(n > 0);
    struct ycsb_field upd[1] = {fld("field1", "NEWER")};
    int64_t m = ycsb_record_merge(out, sizeof out, old, (size_t)n, "field", upd, 1);
    struct ycsb_field g[3] = {fld("field0", "aaa"), fld("field1", "NEWER"), fld("field2", "c")};
    int64_t w = ycsb_record_encode(want, sizeof want, "field", 3, g, 3);
    CHECK_EQ_I64(m, w);
    CHECK(memcmp(out, want, (size_t)w) == 0);
    /* No field: a copy. */
    CHECK_EQ_I64(ycsb_record_merge(out, sizeof out, old, (size_t)n, "field", NULL, 0), n);
    CHECK(memcmp(out, old, (size_t)n) == 0);
    struct ycsb_field beyond[1] = {fld("field3", "x")};
    CHECK_ERR(ycsb_record_merge(out, sizeof out, old, (size_t)n, "field", beyond, 1), FK_EINVAL);
    CHECK_ERR(ycsb_record_merge(out, sizeof out, old, (size_t)n - 1, "field", upd, 1),
              FK_EMALFORMED);
    CHECK_ERR(ycsb_record_merge(out, 10, old, (size_t)n, "field", upd, 1), FK_ETOOBIG);
}

/* ---- base64 ------------------------------------------------------------------- */

TEST(b64_vectors)
{
    /* RFC 4648 section 10. */
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const enc[] = {"",         "Zg==",     "Zm8=",    "Zm9v",
                                      "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    char out[16];
    uint8_t back[16];
    for (int i = 0; i < 7; i++) {
        size_t len = strlen(plain[i]);
        CHECK_EQ_I64(ycsb_etcd_b64_encode(out, sizeof out, (const uint8_t *)plain[i], len),
                     (int64_t)strlen(enc[i]));
        CHECK_EQ_STR(out, enc[i]);
        CHECK_EQ_I64(ycsb_etcd_b64_decode(back, sizeof back, enc[i], strlen(enc[i])), (int64_t)len);
        CHECK(memcmp(back, plain[i], len) == 0);
    }
    uint8_t all[256];
    char text[400];
    uint8_t round[256];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    int64_t n = ycsb_etcd_b64_encode(text, sizeof text, all, sizeof all);
    CHECK_EQ_I64(n, (int64_t)ycsb_etcd_b64_len(256));
    CHECK_EQ_I64(ycsb_etcd_b64_decode(round, sizeof round, text, (size_t)n), 256);
    CHECK(memcmp(round, all, 256) == 0);
    CHECK_ERR(ycsb_etcd_b64_encode(out, 4, (const uint8_t *)"foo", 3), FK_ETOOBIG); /* NUL */
    CHECK_ERR(ycsb_etcd_b64_decode(back, 2, "Zm9v", 4), FK_ETOOBIG);
}

TEST(b64_malformed)
{
    static const char *const bad[] = {
        "Zg=", "Zm9", "Z===", "====", "Zg=a", "Zh==", "Zm9=", "Zm!v", "Zg==Zg==", "Zm 9", "Zm9v\n"};
    uint8_t out[16];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(ycsb_etcd_b64_decode(out, sizeof out, bad[i], strlen(bad[i])) == FK_EMALFORMED,
                  "'%s' accepted", bad[i]);
}

/* ---- JSON responses ------------------------------------------------------------- */

/* Parses json into r; the document r held from the previous call is freed
 * first (r's pointers stay valid until the next call). */
static int parse(const char *json, struct ycsb_etcd_resp *r)
{
    static struct ycsb_etcd_resp held;
    ycsb_etcd_resp_free(&held);
    int rc = ycsb_etcd_parse(json, strlen(json), r, NULL, NULL);
    held = *r;
    return rc;
}

/* Verbatim answers of etcd 3.4.23's gateway. */
static const char range_hit[] =
    "{\"header\":{\"cluster_id\":\"7839007887772995619\",\"member_id\":\"13514998752772718781\","
    "\"revision\":\"2\",\"raft_term\":\"2\"},\"kvs\":[{\"key\":\"Zm9v\",\"create_revision\":\"2\","
    "\"mod_revision\":\"2\",\"version\":\"1\",\"value\":\"YmFy\"}],\"count\":\"1\"}";
static const char range_miss[] =
    "{\"header\":{\"cluster_id\":\"7839007887772995619\",\"member_id\":\"13514998752772718781\","
    "\"revision\":\"2\",\"raft_term\":\"2\"}}";
static const char txn_ok[] =
    "{\"header\":{\"cluster_id\":\"7839007887772995619\",\"member_id\":\"13514998752772718781\","
    "\"revision\":\"3\",\"raft_term\":\"2\"},\"succeeded\":true,\"responses\":[{\"response_put\":"
    "{\"header\":{\"revision\":\"3\"}}}]}";
static const char bad_request[] =
    "{\"error\":\"illegal base64 data at input byte 0\",\"message\":\"illegal base64 data at "
    "input byte 0\",\"code\":3}";

TEST(json_gateway_answers)
{
    struct ycsb_etcd_resp r;
    CHECK_OK(parse(range_hit, &r));
    CHECK_EQ_I64(r.nkvs, 1);
    CHECK_EQ_I64(r.count, 1);
    CHECK_EQ_I64(r.first.key_len, 4);
    CHECK(memcmp(r.first.key, "Zm9v", 4) == 0);
    CHECK_EQ_I64(r.first.value_len, 4);
    CHECK(memcmp(r.first.value, "YmFy", 4) == 0);
    CHECK_EQ_I64(r.first.mod_revision, 2);
    CHECK(!r.error && !r.succeeded);

    CHECK_OK(parse(range_miss, &r));
    CHECK_EQ_I64(r.nkvs, 0);
    CHECK_EQ_I64(r.count, 0);

    CHECK_OK(parse(txn_ok, &r));
    CHECK(r.succeeded);
    CHECK_OK(parse("{\"header\":{},\"deleted\":\"3\"}", &r));
    CHECK_EQ_I64(r.deleted, 3);

    CHECK_OK(parse(bad_request, &r));
    CHECK(r.error);
    CHECK_EQ_I64(r.code, 3);

    /* Numbers either way, escapes, blanks, nested values to skip. */
    CHECK_OK(parse(" {\"count\" : 12 , \"x\":[1,-2.5e3,true,false,null,{\"a\":\"\\u00e9\\\"\"}],"
                   "\"kvs\":[{\"key\":\"YQ==\"},{\"key\":\"Yg==\",\"value\":\"\","
                   "\"mod_revision\":\"-9223372036854775808\"}]}\n",
                   &r));
    CHECK_EQ_I64(r.count, 12);
    CHECK_EQ_I64(r.nkvs, 2);
    CHECK_EQ_I64(r.first.value_len, 0);
}

static int count_kvs(void *arg, const struct ycsb_etcd_kv *kv)
{
    int *n = arg;
    if (kv->key_len != 4)
        return FK_EINVAL;
    return ++*n == 3 ? FK_EFULL : 0;
}

TEST(json_callback)
{
    static const char three[] =
        "{\"kvs\":[{\"key\":\"YQ==\"},{\"key\":\"Yg==\"},{\"key\":\"Yw==\"}]}";
    struct ycsb_etcd_resp r;
    int n = 0;
    CHECK_ERR(ycsb_etcd_parse(three, strlen(three), &r, count_kvs, &n), FK_EFULL);
    CHECK_EQ_I64(n, 3);
    n = 0;
    CHECK_OK(ycsb_etcd_parse(three, strlen(three) - 0, &r, NULL, &n));
    CHECK_EQ_I64(r.nkvs, 3);
    ycsb_etcd_resp_free(&r);
    CHECK(r.doc == NULL && r.nkvs == 0);
}

TEST(json_malformed)
{
    static const char *const bad[] = {
        "",
        "   ",
        "[]",
        "\"kvs\"",
        "{",
        "{\"kvs\":[{\"key\":\"Zm9v\"}]",   /* unclosed */
        "{\"kvs\":[{\"key\":\"Zm9v\"}]}x", /* trailing bytes */
        "{\"kvs\":[{\"key\":\"Zm9v\"}]}{}",
        "{\"kvs\":{}}",                     /* kvs not an array */
        "{\"kvs\":[{\"value\":\"YmFy\"}]}", /* kv without key */
        "{\"kvs\":[{\"key\":12}]}",         /* key not a string */
        "{\"kvs\":[\"Zm9v\"]}",             /* entry not an object */
        "{\"count\":\"12a\"}",              /* not an integer */
        "{\"count\":\"\"}",
        "{\"count\":1.5}",
        "{\"count\":\"99999999999999999999\"}", /* out of range */
        "{\"count\":\"9223372036854775808\"}",
        "{\"succeeded\":\"true\"}",
        "{\"succeeded\":tru}",
        "{\"error\":1}",
        "{\"a\":\"\\x\"}", /* bad escape */
        "{\"a\":\"\\u12g4\"}",
        "{\"a\":\"tab\there\"}", /* raw control character */
        "{\"a\":\"unterminated}",
        "{\"a\" 1}",
        "{\"a\":1,}",
        "{,\"a\":1}",
        "{\"a\":[1,]}",
        "{\"a\":-}",
        "{\"a\":01x}",
        "{\"a\":1.}",
        "{\"a\":1e}",
        "{a:1}",
        "{\"a\":nul}",
    };
    struct ycsb_etcd_resp r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(parse(bad[i], &r) == FK_EMALFORMED, "accepted: %s", bad[i]);

    /* Nesting beyond the limit is refused, at the limit accepted. */
    char deep[256];
    size_t n = 0;
    deep[n++] = '{';
    for (int d = 1; d < YCSB_ETCD_JSON_DEPTH; d++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "\"a\":{");
    for (int d = 0; d < YCSB_ETCD_JSON_DEPTH; d++)
        deep[n++] = '}';
    CHECK_OK(ycsb_etcd_parse(deep, n, &r, NULL, NULL));
    ycsb_etcd_resp_free(&r);
    char deeper[300];
    int m = snprintf(deeper, sizeof deeper, "{\"a\":%.*s}", (int)n, deep);
    CHECK_ERR(ycsb_etcd_parse(deeper, (size_t)m, &r, NULL, NULL), FK_EMALFORMED);

    /* Every truncation of a good answer is refused (and read in bounds: the
     * copy has no terminator). */
    size_t len = strlen(range_hit);
    for (size_t cut = 0; cut < len; cut++) {
        char *copy = malloc(cut + 1);
        CHECK(copy != NULL);
        memcpy(copy, range_hit, cut);
        int rc = ycsb_etcd_parse(copy, cut, &r, NULL, NULL);
        free(copy);
        CHECK_MSG(rc == FK_EMALFORMED, "truncation at %zu accepted", cut);
    }
}

/* ---- a scripted HTTP server --------------------------------------------------- */

#define SCRIPT_MAX 16
#define REQ_MAX    8192

enum answer { ANSWER, HANG, CLOSE };

struct step {
    enum answer what;
    int status;
    const char *body; /* NULL: body_fill bytes of 'x' */
    size_t body_fill;
};

static struct server {
    int lfd;
    int port;
    pthread_t thread;
    atomic_int stop;
    struct step script[SCRIPT_MAX];
    int nsteps;
    int served;
    char path[SCRIPT_MAX][64];
    char body[SCRIPT_MAX][REQ_MAX];
} srv;

/* Reads one request (headers and a Content-Length body) into the log. */
static int read_request(int fd, int i)
{
    static char buf[REQ_MAX * 2];
    size_t n = 0;
    char *hdr_end = NULL;
    int64_t deadline = (int64_t)fk_now_ns() + 5 * (int64_t)FK_NSEC_PER_SEC;
    for (;;) {
        if (hdr_end != NULL) {
            const char *cl = strcasestr(buf, "Content-Length:");
            size_t want = (size_t)(hdr_end + 4 - buf) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
            if (n >= want) {
                sscanf(buf, "POST %63s", srv.path[i]);
                snprintf(srv.body[i], REQ_MAX, "%.*s", (int)(n - (size_t)(hdr_end + 4 - buf)),
                         hdr_end + 4);
                return 0;
            }
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if ((int64_t)fk_now_ns() > deadline || poll(&p, 1, 100) < 0 || n + 1 >= sizeof buf)
            return -1;
        if (!(p.revents & POLLIN))
            continue;
        ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
        if (r <= 0)
            return -1;
        n += (size_t)r;
        buf[n] = '\0';
        hdr_end = strstr(buf, "\r\n\r\n");
    }
}

static void answer(int fd, const struct step *st)
{
    static char big[1 << 20];
    const char *body = st->body;
    size_t len = body ? strlen(body) : st->body_fill;
    if (body == NULL) {
        memset(big, 'x', len);
        body = big;
    }
    char head[256];
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     st->status, len);
    if (write(fd, head, (size_t)h) != h)
        return;
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, body + off, len - off);
        if (w <= 0)
            return;
        off += (size_t)w;
    }
}

/* One connection per request (every answer says Connection: close). */
static void *server_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&srv.stop) && srv.served < srv.nsteps) {
        struct pollfd p = {.fd = srv.lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(srv.lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int i = srv.served;
        if (read_request(fd, i) == 0) {
            srv.served++;
            if (srv.script[i].what == ANSWER)
                answer(fd, &srv.script[i]);
            while (srv.script[i].what == HANG && !atomic_load(&srv.stop))
                fk_sleep_ns(10 * FK_NSEC_PER_MSEC);
        }
        close(fd);
    }
    return NULL;
}

static void server_start(const struct step *script, int n)
{
    CHECK(n <= SCRIPT_MAX);
    signal(SIGPIPE, SIG_IGN); /* the binding may hang up on an oversized answer */
    memset(&srv, 0, sizeof srv);
    memcpy(srv.script, script, (size_t)n * sizeof *script);
    srv.nsteps = n;
    srv.lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(srv.lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    CHECK(bind(srv.lfd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(listen(srv.lfd, 16) == 0);
    CHECK(getsockname(srv.lfd, (struct sockaddr *)&a, &alen) == 0);
    srv.port = ntohs(a.sin_port);
    CHECK(pthread_create(&srv.thread, NULL, server_main, NULL) == 0);
}

static void server_stop(void)
{
    atomic_store(&srv.stop, 1);
    pthread_join(srv.thread, NULL);
    close(srv.lfd);
}

/* ---- the binding against it --------------------------------------------------- */

static struct ycsb_props props;

static void *open_ctx(int port, const char *const *extra)
{
    char arg[128], err[YCSB_ERR_MAX] = "";
    ycsb_props_init(&props);
    snprintf(arg, sizeof arg, "etcd.endpoints=http://127.0.0.1:%d/", port);
    CHECK_OK(ycsb_props_set_arg(&props, arg, err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "fieldcount=2", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "fieldlength=8", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "etcd.timeout_ms=2000", err, sizeof err));
    for (; extra != NULL && *extra != NULL; extra++)
        CHECK_OK(ycsb_props_set_arg(&props, *extra, err, sizeof err));
    void *ctx = NULL;
    int rc = ycsb_etcd_json_binding.open(&ctx, &props, 0, err, sizeof err);
    CHECK_MSG(rc == 0, "open: %s (%s)", err, fk_err_name(rc));
    return ctx;
}

/* Polls until want completions came (5 s at most); returns their number. */
static int wait_done(void *ctx, struct ycsb_done *done, int want)
{
    int got = 0;
    int64_t deadline = (int64_t)fk_now_ns() + 5 * (int64_t)FK_NSEC_PER_SEC;
    while (got < want && (int64_t)fk_now_ns() < deadline) {
        int n = ycsb_etcd_json_binding.poll(ctx, done + got, want - got,
                                            100 * (int64_t)FK_NSEC_PER_MSEC);
        CHECK_OK(n);
        got += n;
    }
    return got;
}

/* One request against one scripted answer; returns its result. */
static int one(void *ctx, const struct ycsb_req *req)
{
    struct ycsb_done d;
    CHECK_OK(ycsb_etcd_json_binding.submit(ctx, req));
    CHECK_EQ_I64(wait_done(ctx, &d, 1), 1);
    CHECK_EQ_U64(d.cookie, req->cookie);
    return d.rc;
}

/* A record of this test's shape (2 fields of up to 8 bytes), as base64. */
static void record_b64(char *out, size_t cap, const char *f0, const char *f1)
{
    struct ycsb_field f[2] = {fld("field0", f0), fld("field1", f1)};
    uint8_t rec[64];
    int64_t n = ycsb_record_encode(rec, sizeof rec, "field", 2, f, 2);
    CHECK(n > 0);
    CHECK(ycsb_etcd_b64_encode(out, cap, rec, (size_t)n) > 0);
}

static const struct ycsb_req read_req = {
    .cookie = 7, .kind = YCSB_REQ_READ, .table = "usertable", .key = "user1", .key_len = 5};

TEST(binding_read)
{
    static char hit[256], hit_body[512], notrec[256];
    record_b64(hit, sizeof hit, "abcdefgh", "12345678");
    snprintf(hit_body, sizeof hit_body,
             "{\"header\":{\"revision\":\"9\"},\"kvs\":[{\"key\":\"dXNlcjE=\",\"mod_revision\":"
             "\"4\",\"value\":\"%s\"}],\"count\":\"1\"}",
             hit);
    snprintf(notrec, sizeof notrec, "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"value\":\"YmFy\"}]}");
    const struct step script[] = {
        {ANSWER, 200, hit_body, 0},
        {ANSWER, 200, range_miss, 0},
        {ANSWER, 200, notrec, 0}, /* value is not a record */
        {ANSWER, 200, "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"value\":\"!!!!\"}]}", 0},
        {ANSWER, 200, "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"val", 0}, /* truncated */
        {ANSWER, 200, "<html>proxy error</html>", 0},
        {ANSWER, 200, NULL, 1 << 20}, /* larger than the response buffer */
        {ANSWER, 200, "{\"kvs\":[{\"key\":\"dXNlcjI=\",\"value\":\"\"}]}", 0}, /* user2 */
    };
    server_start(script, 8);
    void *ctx = open_ctx(srv.port, NULL);
    CHECK_OK(one(ctx, &read_req));
    CHECK_EQ_STR(srv.path[0], "/v3/kv/range");
    CHECK_EQ_STR(srv.body[0], "{\"key\":\"dXNlcjE=\"}");
    CHECK_ERR(one(ctx, &read_req), FK_ENOTFOUND);
    CHECK_ERR(one(ctx, &read_req), FK_EMALFORMED);
    CHECK_ERR(one(ctx, &read_req), FK_EMALFORMED);
    CHECK_ERR(one(ctx, &read_req), FK_EMALFORMED);
    CHECK_ERR(one(ctx, &read_req), FK_EMALFORMED);
    CHECK_ERR(one(ctx, &read_req), FK_ETOOBIG);
    CHECK_ERR(one(ctx, &read_req), FK_EPROTO); /* another key's answer */
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

TEST(binding_http_errors)
{
    const struct step script[] = {
        {ANSWER, 400, bad_request, 0},
        {ANSWER, 503, "{\"error\":\"etcdserver: no leader\",\"code\":14}", 0},
        {ANSWER, 500, "{\"error\":\"etcdserver: request timed out\",\"code\":4}", 0},
        {ANSWER, 500, "{\"error\":\"permission denied\",\"code\":7}", 0},
        {ANSWER, 500, "not json", 0},
        {ANSWER, 404, "", 0},
        {ANSWER, 503, "", 0},
        {CLOSE, 0, NULL, 0}, /* the connection closes without an answer */
        {ANSWER, 200, "{\"error\":\"in a 200\",\"code\":2}", 0},
    };
    server_start(script, 9);
    void *ctx = open_ctx(srv.port, NULL);
    CHECK_ERR(one(ctx, &read_req), FK_EINVAL);
    CHECK_ERR(one(ctx, &read_req), FK_EBUSY);
    CHECK_ERR(one(ctx, &read_req), FK_ETIMEDOUT);
    CHECK_ERR(one(ctx, &read_req), FK_EAUTH);
    CHECK_ERR(one(ctx, &read_req), FK_EPROTO);
    CHECK_ERR(one(ctx, &read_req), FK_EPROTO);
    CHECK_ERR(one(ctx, &read_req), FK_EBUSY);
    CHECK_ERR(one(ctx, &read_req), FK_EUNREACHABLE);
    CHECK_ERR(one(ctx, &read_req), FK_EPROTO);
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

TEST(binding_writes)
{
    static char merged[256], old_body[512], old[256], txn_body[1024], put_body[512], whole[256];
    record_b64(old, sizeof old, "aaaa", "bbbb");
    record_b64(merged, sizeof merged, "aaaa", "NEW");
    record_b64(whole, sizeof whole, "x", "y");
    snprintf(old_body, sizeof old_body,
             "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"mod_revision\":\"41\",\"value\":\"%s\"}]}", old);
    const struct step script[] = {
        {ANSWER, 200, "{\"header\":{\"revision\":\"5\"}}", 0}, /* insert */
        {ANSWER, 200, old_body, 0},                            /* partial update: read */
        {ANSWER, 200, range_miss, 0},                          /* txn lost (succeeded absent) */
        {ANSWER, 200, old_body, 0},                            /* read again */
        {ANSWER, 200, txn_ok, 0},                              /* txn won */
        {ANSWER, 200, range_miss, 0},                          /* partial update of a missing key */
        {ANSWER, 200, "{\"deleted\":\"1\"}", 0},
        {ANSWER, 200, range_miss, 0}, /* nothing deleted */
    };
    server_start(script, 8);
    void *ctx = open_ctx(srv.port, NULL);
    struct ycsb_field all[2] = {fld("field0", "x"), fld("field1", "y")};
    struct ycsb_req ins = {.cookie = 1,
                           .kind = YCSB_REQ_INSERT,
                           .key = "user1",
                           .key_len = 5,
                           .nfields = 2,
                           .fields = all};
    CHECK_OK(one(ctx, &ins));
    CHECK_EQ_STR(srv.path[0], "/v3/kv/put");
    snprintf(put_body, sizeof put_body, "{\"key\":\"dXNlcjE=\",\"value\":\"%s\"}", whole);
    CHECK_EQ_STR(srv.body[0], put_body);

    struct ycsb_field part[1] = {fld("field1", "NEW")};
    struct ycsb_req upd = {.cookie = 2,
                           .kind = YCSB_REQ_UPDATE,
                           .key = "user1",
                           .key_len = 5,
                           .nfields = 1,
                           .fields = part};
    CHECK_OK(one(ctx, &upd));
    CHECK_EQ_STR(srv.path[1], "/v3/kv/range");
    CHECK_EQ_STR(srv.path[2], "/v3/kv/txn");
    CHECK_EQ_STR(srv.path[3], "/v3/kv/range");
    CHECK_EQ_STR(srv.path[4], "/v3/kv/txn");
    snprintf(txn_body, sizeof txn_body,
             "{\"compare\":[{\"key\":\"dXNlcjE=\",\"target\":\"MOD\",\"result\":\"EQUAL\","
             "\"mod_revision\":\"41\"}],\"success\":[{\"request_put\":{\"key\":\"dXNlcjE=\","
             "\"value\":\"%s\"}}]}",
             merged);
    CHECK_EQ_STR(srv.body[4], txn_body);
    CHECK_ERR(one(ctx, &upd), FK_ENOTFOUND);

    CHECK_OK(ycsb_etcd_submit_delete(ctx, 3, "user1", 5));
    struct ycsb_done d;
    CHECK_EQ_I64(wait_done(ctx, &d, 1), 1);
    CHECK_EQ_U64(d.cookie, 3);
    CHECK_OK(d.rc);
    CHECK_EQ_STR(srv.path[6], "/v3/kv/deleterange");
    CHECK_EQ_STR(srv.body[6], "{\"key\":\"dXNlcjE=\"}");
    CHECK_OK(ycsb_etcd_submit_delete(ctx, 4, "user1", 5));
    CHECK_EQ_I64(wait_done(ctx, &d, 1), 1);
    CHECK_ERR(d.rc, FK_ENOTFOUND);

    /* Refused at once, nothing sent. */
    struct ycsb_field wrong[2] = {fld("field0", "x"), fld("field7", "y")};
    ins.fields = wrong;
    CHECK_ERR(ycsb_etcd_json_binding.submit(ctx, &ins), FK_EINVAL);
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    CHECK_EQ_I64(srv.served, 8);
    ycsb_props_free(&props);
}

TEST(binding_update_gives_up)
{
    static char old[256], old_body[512];
    record_b64(old, sizeof old, "aaaa", "bbbb");
    snprintf(old_body, sizeof old_body,
             "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"mod_revision\":\"41\",\"value\":\"%s\"}]}", old);
    const struct step script[] = {
        {ANSWER, 200, old_body, 0},
        {ANSWER, 200, range_miss, 0},
        {ANSWER, 200, old_body, 0},
        {ANSWER, 200, range_miss, 0},
    };
    server_start(script, 4);
    const char *const extra[] = {"etcd.update_tries=2", NULL};
    void *ctx = open_ctx(srv.port, extra);
    struct ycsb_field part[1] = {fld("field0", "z")};
    struct ycsb_req upd = {.cookie = 9,
                           .kind = YCSB_REQ_UPDATE,
                           .key = "user1",
                           .key_len = 5,
                           .nfields = 1,
                           .fields = part};
    CHECK_ERR(one(ctx, &upd), FK_ECASFAIL);
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

TEST(binding_scan_and_pipeline)
{
    static char rec[256], two[1024];
    record_b64(rec, sizeof rec, "a", "b");
    snprintf(two, sizeof two,
             "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"value\":\"%s\"},{\"key\":\"dXNlcjI=\",\"value\":"
             "\"%s\"}],\"count\":\"2\"}",
             rec, rec);
    static char one_bad[1024];
    snprintf(one_bad, sizeof one_bad,
             "{\"kvs\":[{\"key\":\"dXNlcjE=\",\"value\":\"%s\"},{\"key\":\"dXNlcjI=\",\"value\":"
             "\"YmFy\"}]}",
             rec);
    const struct step script[] = {
        {ANSWER, 200, two, 0},        {ANSWER, 200, range_miss, 0}, {ANSWER, 200, one_bad, 0},
        {ANSWER, 200, range_miss, 0}, {ANSWER, 200, range_miss, 0}, {ANSWER, 200, range_miss, 0},
        {ANSWER, 200, range_miss, 0},
    };
    server_start(script, 7);
    const char *const extra[] = {"flowkv.pipeline=4", "scanproportion=0.5", "maxscanlength=10",
                                 "etcd.serializable=true", NULL};
    void *ctx = open_ctx(srv.port, extra);
    struct ycsb_req scan = {
        .cookie = 0, .kind = YCSB_REQ_SCAN, .key = "user1", .key_len = 5, .scan_len = 5};
    CHECK_OK(one(ctx, &scan));
    CHECK_EQ_STR(srv.body[0], "{\"key\":\"dXNlcjE=\",\"range_end\":\"AA==\",\"limit\":\"5\","
                              "\"serializable\":true}");
    CHECK_ERR(one(ctx, &scan), FK_ENOTFOUND);
    CHECK_ERR(one(ctx, &scan), FK_EMALFORMED);
    scan.scan_len = 0;
    CHECK_ERR(ycsb_etcd_json_binding.submit(ctx, &scan), FK_EINVAL);

    /* Four in flight at once; a fifth is refused. */
    struct ycsb_req r[5];
    for (int i = 0; i < 5; i++) {
        r[i] = read_req;
        r[i].cookie = (uint64_t)i;
    }
    for (int i = 0; i < 4; i++)
        CHECK_OK(ycsb_etcd_json_binding.submit(ctx, &r[i]));
    CHECK_ERR(ycsb_etcd_json_binding.submit(ctx, &r[4]), FK_EFULL);
    struct ycsb_done d[4];
    CHECK_EQ_I64(wait_done(ctx, d, 4), 4);
    unsigned seen = 0;
    for (int i = 0; i < 4; i++) {
        CHECK_ERR(d[i].rc, FK_ENOTFOUND);
        CHECK(d[i].cookie < 4);
        seen |= 1u << d[i].cookie;
    }
    CHECK_EQ_U64(seen, 0xf);
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

TEST(binding_refused_and_timeout)
{
    /* A port nobody listens on: bound, never listening. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    void *ctx = open_ctx(ntohs(a.sin_port), NULL);
    CHECK_ERR(one(ctx, &read_req), -ECONNREFUSED);
    ycsb_etcd_json_binding.close(ctx);
    close(fd);
    ycsb_props_free(&props);

    const struct step script[] = {{HANG, 0, NULL, 0}};
    server_start(script, 1);
    const char *const extra[] = {"etcd.timeout_ms=300", NULL};
    ctx = open_ctx(srv.port, extra);
    int64_t t0 = (int64_t)fk_now_ns();
    CHECK_ERR(one(ctx, &read_req), FK_ETIMEDOUT);
    /* Not before the timeout: libcurl's own clock may end it a few
     * milliseconds before ours says 300 (seen once in make test). */
    CHECK((int64_t)fk_now_ns() - t0 >= 250 * (int64_t)FK_NSEC_PER_MSEC);
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

TEST(binding_bad_properties)
{
    static const char *const bad[][2] = {
        {"etcd.endpoints=127.0.0.1:2379", "not an http"},
        {"etcd.timeout_ms=0", "etcd.timeout_ms"},
        {"etcd.balance=random", "etcd.balance"},
        {"etcd.serializable=yes", "etcd.serializable"},
        {"fieldcount=x", "fieldcount"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[YCSB_ERR_MAX] = "";
        ycsb_props_init(&props);
        CHECK_OK(ycsb_props_set_arg(&props, bad[i][0], err, sizeof err));
        void *ctx = NULL;
        CHECK_ERR(ycsb_etcd_json_binding.open(&ctx, &props, 0, err, sizeof err), FK_EINVAL);
        CHECK_MSG(strstr(err, bad[i][1]) != NULL, "%s: message '%s'", bad[i][0], err);
        ycsb_props_free(&props);
    }
    /* Buffers beyond YCSB_ETCD_CTX_BYTES are refused up front. */
    char err[YCSB_ERR_MAX] = "";
    ycsb_props_init(&props);
    CHECK_OK(ycsb_props_set_arg(&props, "flowkv.pipeline=1024", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "scanproportion=1", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "readproportion=0", err, sizeof err));
    void *ctx = NULL;
    CHECK_ERR(ycsb_etcd_json_binding.open(&ctx, &props, 0, err, sizeof err), FK_ETOOBIG);
    ycsb_props_free(&props);
}

TEST(binding_balance_thread)
{
    /* etcd.balance=thread: thread 1 of two endpoints uses the second. */
    const struct step script[] = {{ANSWER, 200, range_miss, 0}};
    server_start(script, 1);
    char arg[160], err[YCSB_ERR_MAX] = "";
    ycsb_props_init(&props);
    snprintf(arg, sizeof arg, "etcd.endpoints=http://127.0.0.1:1,http://127.0.0.1:%d", srv.port);
    CHECK_OK(ycsb_props_set_arg(&props, arg, err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "etcd.balance=thread", err, sizeof err));
    void *ctx = NULL;
    CHECK_OK(ycsb_etcd_json_binding.open(&ctx, &props, 1, err, sizeof err));
    CHECK_ERR(one(ctx, &read_req), FK_ENOTFOUND);
    ycsb_etcd_json_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

/* ---- the gRPC binding (-db etcd); tests/integration/test_ycsb_etcd.sh
 * runs it against a real etcd cluster ------------------------------------ */

static void *grpc_ctx(const char *endpoint, const char *const *extra)
{
    char arg[160], err[YCSB_ERR_MAX] = "";
    ycsb_props_init(&props);
    snprintf(arg, sizeof arg, "etcd.endpoints=%s", endpoint);
    CHECK_OK(ycsb_props_set_arg(&props, arg, err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "fieldcount=2", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "fieldlength=8", err, sizeof err));
    for (; extra != NULL && *extra != NULL; extra++)
        CHECK_OK(ycsb_props_set_arg(&props, *extra, err, sizeof err));
    void *ctx = NULL;
    int rc = ycsb_etcd_grpc_binding.open(&ctx, &props, 0, err, sizeof err);
    CHECK_MSG(rc == 0, "open: %s (%s)", err, fk_err_name(rc));
    return ctx;
}

/* One request through the gRPC binding; its result (5 s at most). */
static int grpc_one(void *ctx, const struct ycsb_req *req)
{
    struct ycsb_done d;
    CHECK_OK(ycsb_etcd_grpc_binding.submit(ctx, req));
    int64_t deadline = (int64_t)fk_now_ns() + 5 * (int64_t)FK_NSEC_PER_SEC;
    while ((int64_t)fk_now_ns() < deadline) {
        int n = ycsb_etcd_grpc_binding.poll(ctx, &d, 1, 100 * (int64_t)FK_NSEC_PER_MSEC);
        CHECK(n >= 0);
        if (n == 1) {
            CHECK_EQ_U64(d.cookie, req->cookie);
            return d.rc;
        }
    }
    CHECK_MSG(0, "no completion in 5 s");
    return 0;
}

TEST(grpc_refused_and_timeout)
{
    /* A port nobody listens on: the call ends UNAVAILABLE. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", ntohs(a.sin_port));
    void *ctx = grpc_ctx(ep, NULL);
    CHECK_ERR(grpc_one(ctx, &read_req), FK_EUNREACHABLE);
    ycsb_etcd_grpc_binding.close(ctx);
    ycsb_props_free(&props);
    close(fd);

    /* A server that accepts and never answers: the deadline ends it. */
    const struct step script[] = {{HANG, 0, NULL, 0}};
    server_start(script, 1);
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    const char *const extra[] = {"etcd.timeout_ms=300", NULL};
    ctx = grpc_ctx(ep, extra);
    int64_t t0 = (int64_t)fk_now_ns();
    CHECK_ERR(grpc_one(ctx, &read_req), FK_ETIMEDOUT);
    CHECK((int64_t)fk_now_ns() - t0 >= 250 * (int64_t)FK_NSEC_PER_MSEC);
    ycsb_etcd_grpc_binding.close(ctx);
    server_stop();
    ycsb_props_free(&props);
}

TEST(grpc_bad_properties)
{
    static const char *const bad[][2] = {
        {"etcd.endpoints=https://127.0.0.1:2379", "plain http:// only"},
        {"etcd.endpoints=127.0.0.1:2379", "not an http"},
        {"etcd.timeout_ms=0", "etcd.timeout_ms"},
        {"etcd.balance=random", "etcd.balance"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[YCSB_ERR_MAX] = "";
        ycsb_props_init(&props);
        CHECK_OK(ycsb_props_set_arg(&props, bad[i][0], err, sizeof err));
        void *ctx = NULL;
        CHECK_ERR(ycsb_etcd_grpc_binding.open(&ctx, &props, 0, err, sizeof err), FK_EINVAL);
        CHECK_MSG(strstr(err, bad[i][1]) != NULL, "%s: message '%s'", bad[i][0], err);
        ycsb_props_free(&props);
    }
    /* Requests the binding cannot send are refused at once. */
    void *ctx = grpc_ctx("http://127.0.0.1:1", NULL);
    struct ycsb_req empty = read_req;
    empty.key_len = 0;
    CHECK_ERR(ycsb_etcd_grpc_binding.submit(ctx, &empty), FK_EINVAL);
    CHECK_ERR(ycsb_etcd_grpc_submit_delete(ctx, 1, "", 0), FK_EINVAL);
    ycsb_etcd_grpc_binding.close(ctx);
    ycsb_props_free(&props);
}

CHECK_MAIN()
