/*
 * ycsb_etcd.c: the etcd binding over the v3 JSON gateway with libcurl's
 * multi interface; see ycsb_etcd.h for the mapping, memory and results.
 *
 * A context is one CURLM and D slots (D = flowkv.pipeline), each one curl
 * easy handle with its own request and response buffers. submit takes a free
 * slot, writes the JSON body into the slot's buffer and adds the handle to
 * the multi; poll drives curl (curl_multi_perform, curl_multi_poll) and
 * turns finished transfers into completions. A partial UPDATE uses its slot
 * twice (range, then txn) before it completes.
 */
#include "ycsb_etcd.h"

#include "fk_error.h"
#include "fk_time.h"
#include "ycsb_record.h"

#include <assert.h>
#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_B64_MAX   (4 * ((YCSB_KEY_MAX + 2) / 3))
#define KV_JSON_EXTRA 256 /* a kv's member names, quotes and three revisions */
#define RESP_EXTRA    512 /* header (ids, revision, term) and the rest */

enum path { PATH_RANGE, PATH_PUT, PATH_DELETE, PATH_TXN, PATH__COUNT, PATH_NONE = PATH__COUNT };

static const char *const path_name[PATH__COUNT] = {"/v3/kv/range", "/v3/kv/put",
                                                   "/v3/kv/deleterange", "/v3/kv/txn"};

/* What a slot is doing. Every stage but SLOT_FREE has its handle in the
 * multi. */
enum stage {
    SLOT_FREE,
    SLOT_READ,
    SLOT_SCAN,
    SLOT_PUT,
    SLOT_DELETE,
    SLOT_RMW_RANGE, /* partial update: reading the record */
    SLOT_RMW_TXN,   /* partial update: conditional put of the merged record */
};

struct ctx;

struct slot {
    struct ctx *c;
    CURL *easy;
    enum stage stage;
    enum path path; /* the URL set on easy (PATH_NONE: none yet) */
    uint64_t cookie;
    const struct ycsb_req *req; /* NULL for a delete */
    const char *key;
    unsigned key_len;
    int32_t tries;
    char *body;
    size_t body_cap;
    char *resp;
    size_t resp_cap, resp_len;
    bool overflow;
};

struct ctx {
    CURLM *multi;
    struct curl_slist *headers;
    char url[PATH__COUNT][YCSB_ETCD_URL_MAX];
    struct ycsb_conf conf;
    bool serializable;
    long timeout_ms;
    int32_t update_tries;
    struct slot *slots;
    int32_t nslots, nfree, inflight;
    int32_t *free_list;
    uint8_t *rec, *old; /* record scratch: encode or merge; decode */
    size_t rec_cap;
    char *arena; /* every slot's body and response buffer */
};

/* ---- properties ------------------------------------------------------------ */

static int prop_long(const struct ycsb_props *p, const char *name, long def, long lo, long hi,
                     long *out, char *err, size_t errlen)
{
    const char *v = ycsb_props_get(p, name);
    *out = def;
    if (v == NULL)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
        snprintf(err, errlen, "%s: '%s' is not an integer in [%ld, %ld]", name, v, lo, hi);
        return FK_EINVAL;
    }
    *out = x;
    return 0;
}

static int prop_choice(const struct ycsb_props *p, const char *name, const char *a, const char *b,
                       int *out, char *err, size_t errlen)
{
    const char *v = ycsb_props_get(p, name);
    *out = 0;
    if (v == NULL || strcmp(v, a) == 0)
        return 0;
    if (strcmp(v, b) == 0) {
        *out = 1;
        return 0;
    }
    snprintf(err, errlen, "%s: '%s' is neither %s nor %s", name, v, a, b);
    return FK_EINVAL;
}

/* Picks endpoint number pick % n of the comma-separated list. */
static int pick_endpoint(struct ycsb_etcd_opts *o, const char *list, int32_t pick, char *err,
                         size_t errlen)
{
    int32_t n = 1;
    for (const char *s = list; *s; s++)
        n += *s == ',';
    const char *e = list;
    for (int32_t i = pick % n; i > 0; i--)
        e = strchr(e, ',') + 1;
    size_t len = strcspn(e, ",");
    while (len > 0 && e[len - 1] == '/')
        len--;
    if (len == 0 || (strncmp(e, "http://", 7) != 0 && strncmp(e, "https://", 8) != 0)) {
        snprintf(err, errlen, "etcd.endpoints: '%.*s' is not an http:// or https:// URL",
                 (int)strcspn(e, ","), e);
        return FK_EINVAL;
    }
    if (len + 32 > sizeof o->endpoint) { /* room for the longest gateway path */
        snprintf(err, errlen, "etcd.endpoints: URL longer than %d bytes", YCSB_ETCD_URL_MAX - 32);
        return FK_EINVAL;
    }
    memcpy(o->endpoint, e, len);
    o->endpoint[len] = '\0';
    return 0;
}

int ycsb_etcd_opts_read(struct ycsb_etcd_opts *o, const struct ycsb_props *props, int32_t tid,
                        char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    int rc = ycsb_conf_parse(&o->conf, props, err, errlen);
    long tries = 0;
    int balance = 0, serializable = 0;
    if (rc == 0)
        rc = prop_long(props, "etcd.timeout_ms", 10000, 1, 3600000, &o->timeout_ms, err, errlen);
    if (rc == 0)
        rc = prop_long(props, "etcd.update_tries", 10, 1, 1000, &tries, err, errlen);
    if (rc == 0)
        rc = prop_choice(props, "etcd.balance", "first", "thread", &balance, err, errlen);
    if (rc == 0)
        rc = prop_choice(props, "etcd.serializable", "false", "true", &serializable, err, errlen);
    if (rc < 0)
        return rc;
    o->update_tries = (int32_t)tries;
    o->serializable = serializable;
    const char *list = ycsb_props_get(props, "etcd.endpoints");
    if (list == NULL || *list == '\0')
        list = "http://127.0.0.1:2379";
    return pick_endpoint(o, list, balance ? tid : 0, err, errlen);
}

/* The gateway's four URLs: the endpoint and each path. */
static int read_props(struct ctx *c, const struct ycsb_props *props, int32_t tid, char *err,
                      size_t errlen)
{
    struct ycsb_etcd_opts o;
    int rc = ycsb_etcd_opts_read(&o, props, tid, err, errlen);
    if (rc < 0)
        return rc;
    c->conf = o.conf;
    c->timeout_ms = o.timeout_ms;
    c->update_tries = o.update_tries;
    c->serializable = o.serializable;
    for (int p = 0; p < PATH__COUNT; p++)
        snprintf(c->url[p], sizeof c->url[p], "%s%s", o.endpoint, path_name[p]);
    return 0;
}

/* ---- setup -------------------------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
    struct slot *s = arg;
    size_t bytes = size * n;
    if (bytes > s->resp_cap - s->resp_len) {
        s->overflow = true;
        return 0; /* curl ends the transfer with CURLE_WRITE_ERROR */
    }
    memcpy(s->resp + s->resp_len, data, bytes);
    s->resp_len += bytes;
    return bytes;
}

static int slot_init(struct ctx *c, struct slot *s)
{
    s->c = c;
    s->path = PATH_NONE;
    s->easy = curl_easy_init();
    if (s->easy == NULL)
        return -ENOMEM;
    CURLcode e = CURLE_OK;
#define SET(opt, val)                                                                              \
    if (e == CURLE_OK)                                                                             \
    e = curl_easy_setopt(s->easy, opt, val)
    SET(CURLOPT_PRIVATE, s);
    SET(CURLOPT_POST, 1L);
    SET(CURLOPT_HTTPHEADER, c->headers);
    SET(CURLOPT_POSTFIELDS, s->body);
    SET(CURLOPT_WRITEFUNCTION, on_data);
    SET(CURLOPT_WRITEDATA, s);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_TCP_NODELAY, 1L);
    SET(CURLOPT_TIMEOUT_MS, c->timeout_ms);
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
#undef SET
    return e == CURLE_OK ? 0 : FK_EINVAL;
}

static void ctx_free(struct ctx *c)
{
    for (int32_t i = 0; c->slots != NULL && i < c->nslots; i++) {
        if (c->slots[i].easy == NULL)
            continue;
        if (c->slots[i].stage != SLOT_FREE && c->multi != NULL)
            curl_multi_remove_handle(c->multi, c->slots[i].easy);
        curl_easy_cleanup(c->slots[i].easy);
    }
    if (c->multi != NULL)
        curl_multi_cleanup(c->multi);
    curl_slist_free_all(c->headers);
    free(c->slots);
    free(c->free_list);
    free(c->rec);
    free(c->old);
    free(c->arena);
    free(c);
}

/* Buffer sizes from the workload (the arithmetic is in ycsb_etcd.h). */
static int size_buffers(struct ctx *c, size_t *body, size_t *resp, char *err, size_t errlen)
{
    const struct ycsb_conf *k = &c->conf;
    c->rec_cap =
        ycsb_record_len((int32_t)k->fieldcount, (size_t)k->fieldcount * (size_t)k->fieldlength);
    size_t val = ycsb_etcd_b64_len(c->rec_cap);
    size_t kv = KEY_B64_MAX + val + KV_JSON_EXTRA;
    size_t scan = k->scanproportion > 0 ? (size_t)k->maxscanlength : 1;
    *body = 2 * KEY_B64_MAX + val + 256;
    *resp = RESP_EXTRA + scan * kv;
    if ((*body + *resp) * (size_t)k->pipeline > YCSB_ETCD_CTX_BYTES) {
        snprintf(err, errlen,
                 "etcd: %d slots of %zu + %zu bytes exceed the %u MiB of a thread's buffers "
                 "(lower flowkv.pipeline, maxscanlength or the record size)",
                 k->pipeline, *body, *resp, YCSB_ETCD_CTX_BYTES >> 20);
        return FK_ETOOBIG;
    }
    return 0;
}

static int ctx_alloc(struct ctx *c, char *err, size_t errlen)
{
    size_t body, resp;
    int rc = size_buffers(c, &body, &resp, err, errlen);
    if (rc < 0)
        return rc;
    int32_t d = c->conf.pipeline;
    c->slots = calloc((size_t)d, sizeof *c->slots);
    c->free_list = calloc((size_t)d, sizeof *c->free_list);
    c->rec = malloc(c->rec_cap);
    c->old = malloc(c->rec_cap);
    c->arena = malloc((size_t)d * (body + resp));
    c->multi = curl_multi_init();
    c->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->headers != NULL) /* no "Expect: 100-continue" round trip for large bodies */
        c->headers = curl_slist_append(c->headers, "Expect:");
    if (!c->slots || !c->free_list || !c->rec || !c->old || !c->arena || !c->multi || !c->headers)
        return -ENOMEM;
    curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)d);
    for (int32_t i = 0; i < d; i++) {
        struct slot *s = &c->slots[i];
        s->body = c->arena + (size_t)i * (body + resp);
        s->body_cap = body;
        s->resp = s->body + body;
        s->resp_cap = resp;
        c->nslots = i + 1;
        if ((rc = slot_init(c, s)) < 0)
            return rc;
        c->free_list[c->nfree++] = d - 1 - i;
    }
    return 0;
}

static int etcd_open(void **out, const struct ycsb_props *props, int32_t tid, char *err,
                     size_t errlen)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        snprintf(err, errlen, "etcd: curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return FK_ENODEV;
    }
    struct ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    int rc = read_props(c, props, tid, err, errlen);
    if (rc == 0 && (rc = ctx_alloc(c, err, errlen)) == -ENOMEM)
        snprintf(err, errlen, "etcd: out of memory for %d slots", c->conf.pipeline);
    else if (rc == FK_EINVAL && err[0] == '\0')
        snprintf(err, errlen, "etcd: curl refused an option");
    if (rc < 0) {
        ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void etcd_close(void *ctx)
{
    ctx_free(ctx);
}

/* ---- requests ----------------------------------------------------------------- */

/* Appends the base64 of len bytes at *at in s's body. */
static int put_b64(struct slot *s, size_t *at, const void *in, size_t len)
{
    int64_t n = ycsb_etcd_b64_encode(s->body + *at, s->body_cap - *at, in, len);
    if (n < 0)
        return (int)n;
    *at += (size_t)n;
    return 0;
}

/* Appends formatted text at *at in s's body. */
__attribute__((format(printf, 3, 4))) static int put_text(struct slot *s, size_t *at,
                                                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->body + *at, s->body_cap - *at, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= s->body_cap - *at)
        return FK_ETOOBIG;
    *at += (size_t)n;
    return 0;
}

/* {"key":K + extra + "}" for range and deleterange. */
static int body_key(struct slot *s, size_t *at, const char *extra)
{
    int rc = put_text(s, at, "{\"key\":\"");
    if (rc == 0)
        rc = put_b64(s, at, s->key, s->key_len);
    if (rc == 0)
        rc = put_text(s, at, "\"%s}", extra);
    return rc;
}

/* The body for s's stage; len bytes of record rec for writes. */
static int build_body(struct slot *s, const uint8_t *rec, size_t len, int64_t mod_revision)
{
    struct ctx *c = s->c;
    size_t at = 0;
    char extra[64] = "";
    int rc = 0;
    switch (s->stage) {
    case SLOT_READ:
    case SLOT_RMW_RANGE:
        if (c->serializable && s->stage == SLOT_READ)
            snprintf(extra, sizeof extra, ",\"serializable\":true");
        return body_key(s, &at, extra) < 0 ? FK_ETOOBIG : (int)at;
    case SLOT_SCAN:
        snprintf(extra, sizeof extra, ",\"range_end\":\"AA==\",\"limit\":\"%d\"%s",
                 (int)s->req->scan_len, c->serializable ? ",\"serializable\":true" : "");
        return body_key(s, &at, extra) < 0 ? FK_ETOOBIG : (int)at;
    case SLOT_DELETE:
        return body_key(s, &at, "") < 0 ? FK_ETOOBIG : (int)at;
    case SLOT_RMW_TXN:
        rc = put_text(s, &at, "{\"compare\":[{\"key\":\"");
        if (rc == 0)
            rc = put_b64(s, &at, s->key, s->key_len);
        if (rc == 0)
            rc = put_text(s, &at,
                          "\",\"target\":\"MOD\",\"result\":\"EQUAL\",\"mod_revision\":\"%lld\"}],"
                          "\"success\":[{\"request_put\":",
                          (long long)mod_revision);
        /* the put request follows */
        __attribute__((fallthrough));
    case SLOT_PUT:
        if (rc == 0)
            rc = put_text(s, &at, "{\"key\":\"");
        if (rc == 0)
            rc = put_b64(s, &at, s->key, s->key_len);
        if (rc == 0)
            rc = put_text(s, &at, "\",\"value\":\"");
        if (rc == 0)
            rc = put_b64(s, &at, rec, len);
        if (rc == 0)
            rc = put_text(s, &at, s->stage == SLOT_RMW_TXN ? "\"}}]}" : "\"}");
        return rc < 0 ? FK_ETOOBIG : (int)at;
    case SLOT_FREE:
        break;
    }
    assert(0 && "stage");
    return FK_EINVAL;
}

static enum path stage_path(enum stage st)
{
    switch (st) {
    case SLOT_PUT:
        return PATH_PUT;
    case SLOT_DELETE:
        return PATH_DELETE;
    case SLOT_RMW_TXN:
        return PATH_TXN;
    default:
        return PATH_RANGE;
    }
}

/* Builds the body for the slot's stage and hands the handle to the multi. */
static int start(struct slot *s, const uint8_t *rec, size_t len, int64_t mod_revision)
{
    struct ctx *c = s->c;
    int n = build_body(s, rec, len, mod_revision);
    if (n < 0)
        return n;
    enum path p = stage_path(s->stage);
    if (s->path != p) { /* curl copies the URL: only when the path changes */
        if (curl_easy_setopt(s->easy, CURLOPT_URL, c->url[p]) != CURLE_OK)
            return -ENOMEM;
        s->path = p;
    }
    if (curl_easy_setopt(s->easy, CURLOPT_POSTFIELDSIZE, (long)n) != CURLE_OK)
        return FK_EINVAL;
    s->resp_len = 0;
    s->overflow = false;
    if (curl_multi_add_handle(c->multi, s->easy) != CURLM_OK)
        return FK_EPROTO;
    return 0;
}

static struct slot *take_slot(struct ctx *c, uint64_t cookie, const char *key, unsigned key_len)
{
    if (c->nfree == 0)
        return NULL;
    struct slot *s = &c->slots[c->free_list[--c->nfree]];
    assert(s->stage == SLOT_FREE);
    s->cookie = cookie;
    s->key = key;
    s->key_len = key_len;
    s->req = NULL;
    s->tries = 0;
    return s;
}

static void release_slot(struct ctx *c, struct slot *s)
{
    s->stage = SLOT_FREE;
    c->free_list[c->nfree++] = (int32_t)(s - c->slots);
    assert(c->nfree <= c->nslots);
}

/* Starts s at stage st; on failure the slot is free again. */
static int launch(struct ctx *c, struct slot *s, enum stage st, const uint8_t *rec, size_t len)
{
    s->stage = st;
    int rc = start(s, rec, len, 0);
    if (rc < 0) {
        release_slot(c, s);
        return rc;
    }
    c->inflight++;
    return 0;
}

int ycsb_etcd_plan(const struct ycsb_conf *conf, const struct ycsb_req *req, uint8_t *rec,
                   size_t cap, size_t *len)
{
    *len = 0;
    switch (req->kind) {
    case YCSB_REQ_READ:
        return YCSB_ETCD_READ;
    case YCSB_REQ_SCAN:
        return req->scan_len < 1 ? FK_EINVAL : YCSB_ETCD_SCAN;
    case YCSB_REQ_UPDATE:
        if (req->nfields != conf->fieldcount)
            return YCSB_ETCD_RMW;
        /* every field written: a put, as an insert */
        __attribute__((fallthrough));
    case YCSB_REQ_INSERT: {
        int64_t n = ycsb_record_encode(rec, cap, conf->fieldnameprefix, (int32_t)conf->fieldcount,
                                       req->fields, req->nfields);
        if (n < 0)
            return (int)n;
        *len = (size_t)n;
        return YCSB_ETCD_PUT;
    }
    }
    return FK_EINVAL;
}

static int etcd_submit(void *ctx, const struct ycsb_req *req)
{
    static const enum stage stage_of[] = {[YCSB_ETCD_READ] = SLOT_READ,
                                          [YCSB_ETCD_SCAN] = SLOT_SCAN,
                                          [YCSB_ETCD_PUT] = SLOT_PUT,
                                          [YCSB_ETCD_RMW] = SLOT_RMW_RANGE};
    struct ctx *c = ctx;
    if (req == NULL || req->key == NULL || req->key_len == 0 || req->key_len >= YCSB_KEY_MAX)
        return FK_EINVAL;
    struct slot *s = take_slot(c, req->cookie, req->key, req->key_len);
    if (s == NULL)
        return FK_EFULL;
    s->req = req;
    size_t len;
    int op = ycsb_etcd_plan(&c->conf, req, c->rec, c->rec_cap, &len);
    if (op < 0) {
        release_slot(c, s);
        return op;
    }
    return launch(c, s, stage_of[op], op == YCSB_ETCD_PUT ? c->rec : NULL, len);
}

int ycsb_etcd_submit_delete(void *ctx, uint64_t cookie, const char *key, unsigned key_len)
{
    struct ctx *c = ctx;
    if (c == NULL || key == NULL || key_len == 0 || key_len >= YCSB_KEY_MAX)
        return FK_EINVAL;
    struct slot *s = take_slot(c, cookie, key, key_len);
    if (s == NULL)
        return FK_EFULL;
    return launch(c, s, SLOT_DELETE, NULL, 0);
}

/* ---- completions -------------------------------------------------------------- */

/* A transfer that did not end in HTTP 200: the result it stands for. */
static int transport_error(struct slot *s, CURLcode res, long http)
{
    switch (res) {
    case CURLE_OK:
        break;
    case CURLE_OPERATION_TIMEDOUT:
        return FK_ETIMEDOUT;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_WRITE_ERROR:
        return s->overflow ? FK_ETOOBIG : FK_EUNREACHABLE;
    default:
        return FK_EUNREACHABLE;
    }
    /* An error body is {"error":...,"code":<gRPC code>,"message":...}. */
    struct ycsb_etcd_resp r;
    int64_t code = 0;
    if (ycsb_etcd_parse(s->resp, s->resp_len, &r, NULL, NULL) == 0) {
        code = r.code;
        ycsb_etcd_resp_free(&r);
    }
    if (code != 0) {
        switch (code) {
        case 3: /* INVALID_ARGUMENT */
            return FK_EINVAL;
        case 4: /* DEADLINE_EXCEEDED */
            return FK_ETIMEDOUT;
        case 7:  /* PERMISSION_DENIED */
        case 16: /* UNAUTHENTICATED */
            return FK_EAUTH;
        case 8:  /* RESOURCE_EXHAUSTED */
        case 14: /* UNAVAILABLE */
            return FK_EBUSY;
        default:
            break;
        }
    }
    if (http == 429 || http == 503)
        return FK_EBUSY;
    return http == 400 ? FK_EINVAL : FK_EPROTO;
}

/* Decodes a kv's value into the ctx's scratch and checks it is a record
 * holding the field a read names. */
static int check_value(struct ctx *c, const struct ycsb_req *req, const struct ycsb_etcd_kv *kv,
                       struct ycsb_record_view *v)
{
    int64_t n = ycsb_etcd_b64_decode(c->old, c->rec_cap, kv->value, kv->value_len);
    if (n < 0)
        return FK_EMALFORMED; /* also a value larger than this workload's records */
    if (ycsb_record_parse(c->old, (size_t)n, v) < 0)
        return FK_EMALFORMED;
    if (req != NULL && req->read_field != NULL &&
        ycsb_record_field_index(c->conf.fieldnameprefix, req->read_field, v->nfields) < 0)
        return FK_EMALFORMED;
    return 0;
}

struct scan_check {
    struct ctx *c;
    const struct ycsb_req *req;
};

static int scan_kv(void *arg, const struct ycsb_etcd_kv *kv)
{
    struct scan_check *sc = arg;
    struct ycsb_record_view v;
    return check_value(sc->c, sc->req, kv, &v);
}

/* A partial update read its record: start the conditional put of the merged
 * record. Returns 0 (the slot goes on) or the update's result. */
static int rmw_write(struct ctx *c, struct slot *s, const struct ycsb_etcd_resp *r)
{
    struct ycsb_record_view v;
    if (r->nkvs == 0)
        return FK_ENOTFOUND;
    int rc = check_value(c, NULL, &r->first, &v);
    if (rc < 0)
        return rc;
    int64_t n = ycsb_record_merge(c->rec, c->rec_cap, v.rec, v.len, c->conf.fieldnameprefix,
                                  s->req->fields, s->req->nfields);
    if (n < 0)
        return (int)n;
    s->stage = SLOT_RMW_TXN;
    return start(s, c->rec, (size_t)n, r->first.mod_revision);
}

/* A single-key range must answer with that key (base64 in kv). */
static bool same_key(const struct slot *s, const struct ycsb_etcd_kv *kv)
{
    char b64[KEY_B64_MAX + 1];
    int64_t n = ycsb_etcd_b64_encode(b64, sizeof b64, (const uint8_t *)s->key, s->key_len);
    return n >= 0 && (size_t)n == kv->key_len && memcmp(b64, kv->key, kv->key_len) == 0;
}

static int on_parsed(struct ctx *c, struct slot *s, const struct ycsb_etcd_resp *r);

/* The result of a finished transfer with HTTP 200, or 1 when the slot
 * started its next stage. */
static int on_response(struct ctx *c, struct slot *s)
{
    struct ycsb_etcd_resp r;
    struct scan_check sc = {c, s->req};
    int rc = ycsb_etcd_parse(s->resp, s->resp_len, &r, s->stage == SLOT_SCAN ? scan_kv : NULL, &sc);
    if (rc < 0)
        return rc;
    rc = on_parsed(c, s, &r);
    ycsb_etcd_resp_free(&r);
    return rc;
}

static int on_parsed(struct ctx *c, struct slot *s, const struct ycsb_etcd_resp *r)
{
    int rc;
    if (r->error)
        return FK_EPROTO;
    if ((s->stage == SLOT_READ || s->stage == SLOT_RMW_RANGE) && r->nkvs > 0 &&
        (r->nkvs != 1 || !same_key(s, &r->first)))
        return FK_EPROTO; /* not the answer to this request */
    struct ycsb_record_view v;
    switch (s->stage) {
    case SLOT_READ:
        return r->nkvs == 0 ? FK_ENOTFOUND : check_value(c, s->req, &r->first, &v);
    case SLOT_SCAN:
        return r->nkvs == 0 ? FK_ENOTFOUND : 0;
    case SLOT_PUT:
        return 0;
    case SLOT_DELETE:
        return r->deleted > 0 ? 0 : FK_ENOTFOUND;
    case SLOT_RMW_RANGE:
        rc = rmw_write(c, s, r);
        return rc < 0 ? rc : 1;
    case SLOT_RMW_TXN:
        if (r->succeeded)
            return 0;
        if (++s->tries >= c->update_tries)
            return FK_ECASFAIL;
        s->stage = SLOT_RMW_RANGE; /* another writer came between: read again */
        rc = start(s, NULL, 0, 0);
        return rc < 0 ? rc : 1;
    case SLOT_FREE:
        break;
    }
    assert(0 && "stage");
    return FK_EPROTO;
}

/* Takes finished transfers; stores up to max completions in done. */
static int collect(struct ctx *c, struct ycsb_done *done, int max)
{
    int n = 0, left;
    CURLMsg *m;
    while (n < max && (m = curl_multi_info_read(c->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURL *easy = m->easy_handle;
        CURLcode res = m->data.result; /* m dies with the handle's removal */
        char *priv = NULL;
        long http = 0;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
        struct slot *s = (struct slot *)(void *)priv;
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
        assert(s != NULL && s->easy == easy && s->stage != SLOT_FREE);
        curl_multi_remove_handle(c->multi, easy);
        int rc = res == CURLE_OK && http == 200 ? on_response(c, s) : transport_error(s, res, http);
        if (rc == 1)
            continue; /* the next stage of a partial update is under way */
        done[n++] = (struct ycsb_done){.cookie = s->cookie, .rc = rc > 0 ? 0 : rc};
        c->inflight--;
        release_slot(c, s);
    }
    return n;
}

static int etcd_poll(void *ctx, struct ycsb_done *done, int max, int64_t timeout_ns)
{
    struct ctx *c = ctx;
    int64_t deadline = (int64_t)fk_now_ns() + (timeout_ns > 0 ? timeout_ns : 0);
    int n = 0;
    for (;;) {
        int running;
        CURLMcode mc = curl_multi_perform(c->multi, &running);
        if (mc != CURLM_OK)
            return FK_EPROTO;
        n += collect(c, done + n, max - n);
        if (n > 0 || c->inflight == 0)
            return n;
        int64_t left = deadline - (int64_t)fk_now_ns();
        if (left <= 0)
            return 0;
        int64_t ms = (left + (int64_t)FK_NSEC_PER_MSEC - 1) / (int64_t)FK_NSEC_PER_MSEC;
        mc = curl_multi_poll(c->multi, NULL, 0, ms > INT_MAX ? INT_MAX : (int)ms, NULL);
        if (mc != CURLM_OK)
            return FK_EPROTO;
    }
}

const struct ycsb_binding ycsb_etcd_json_binding = {
    .name = "etcd-json",
    .open = etcd_open,
    .close = etcd_close,
    .submit = etcd_submit,
    .poll = etcd_poll,
};
