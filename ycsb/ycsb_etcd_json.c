/*
 * ycsb_etcd_json.c: the few JSON and base64 pieces the etcd binding needs;
 * see ycsb_etcd.h.
 *
 * The responses come from etcd's grpc-gateway (jsonpb with original field
 * names): an object with "header", then "kvs", "count", "deleted",
 * "succeeded" or, for an error, "error", "message", "code". int64 members
 * are decimal strings in proto3's JSON mapping. The parser is a small
 * recursive descent over RFC 8259 that checks the whole document, reads
 * those members and skips the rest, so a truncated or garbled response is
 * an error and never a crash: every read is bounded by the end pointer and
 * the nesting by YCSB_ETCD_JSON_DEPTH.
 */
#include "ycsb_etcd.h"

#include "fk_error.h"

#include <string.h>

struct jp {
    const char *p, *end;
    int depth;
};

static void ws(struct jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

/* Consumes c (after blanks); returns 1 when it was there. */
static int eat(struct jp *j, char c)
{
    ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

static int hexdigit(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A string: stores its raw contents (escapes left as they are). */
static int jstring(struct jp *j, const char **s, size_t *n)
{
    if (!eat(j, '"'))
        return FK_EMALFORMED;
    const char *start = j->p;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20)
            return FK_EMALFORMED;
        if (c != '\\')
            continue;
        if (j->p >= j->end)
            return FK_EMALFORMED;
        c = (unsigned char)*j->p++;
        if (c == 'u') {
            if (j->end - j->p < 4 || !hexdigit(j->p[0]) || !hexdigit(j->p[1]) ||
                !hexdigit(j->p[2]) || !hexdigit(j->p[3]))
                return FK_EMALFORMED;
            j->p += 4;
        } else if (strchr("\"\\/bfnrt", c) == NULL || c == '\0') {
            return FK_EMALFORMED;
        }
    }
    if (j->p >= j->end)
        return FK_EMALFORMED;
    *s = start;
    *n = (size_t)(j->p - start);
    j->p++;
    return 0;
}

static int digits(struct jp *j)
{
    const char *s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > s;
}

/* A number per RFC 8259 section 6. */
static int jnumber(struct jp *j)
{
    ws(j);
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (!digits(j))
        return FK_EMALFORMED;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!digits(j))
            return FK_EMALFORMED;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (!digits(j))
            return FK_EMALFORMED;
    }
    return 0;
}

static int jword(struct jp *j, const char *w)
{
    size_t n = strlen(w);
    ws(j);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0)
        return FK_EMALFORMED;
    j->p += n;
    return 0;
}

typedef int (*member_fn)(struct jp *j, const char *name, size_t len, void *arg);
typedef int (*elem_fn)(struct jp *j, int32_t index, void *arg);

static int jskip(struct jp *j);

/* An object: member(j, name) parses each member's value. */
static int jobject(struct jp *j, member_fn member, void *arg)
{
    if (!eat(j, '{') || ++j->depth > YCSB_ETCD_JSON_DEPTH)
        return FK_EMALFORMED;
    if (!eat(j, '}')) {
        do {
            const char *name;
            size_t len;
            int rc = jstring(j, &name, &len);
            if (rc == 0)
                rc = eat(j, ':') ? member(j, name, len, arg) : FK_EMALFORMED;
            if (rc < 0)
                return rc;
        } while (eat(j, ','));
        if (!eat(j, '}'))
            return FK_EMALFORMED;
    }
    j->depth--;
    return 0;
}

static int jarray(struct jp *j, elem_fn elem, void *arg)
{
    if (!eat(j, '[') || ++j->depth > YCSB_ETCD_JSON_DEPTH)
        return FK_EMALFORMED;
    if (!eat(j, ']')) {
        int32_t i = 0;
        do {
            if (i == INT32_MAX)
                return FK_EMALFORMED;
            int rc = elem(j, i++, arg);
            if (rc < 0)
                return rc;
        } while (eat(j, ','));
        if (!eat(j, ']'))
            return FK_EMALFORMED;
    }
    j->depth--;
    return 0;
}

static int skip_member(struct jp *j, const char *name, size_t len, void *arg)
{
    (void)name, (void)len, (void)arg;
    return jskip(j);
}

static int skip_elem(struct jp *j, int32_t index, void *arg)
{
    (void)index, (void)arg;
    return jskip(j);
}

/* Any value. */
static int jskip(struct jp *j)
{
    ws(j);
    if (j->p >= j->end)
        return FK_EMALFORMED;
    const char *s;
    size_t n;
    switch (*j->p) {
    case '{':
        return jobject(j, skip_member, NULL);
    case '[':
        return jarray(j, skip_elem, NULL);
    case '"':
        return jstring(j, &s, &n);
    case 't':
        return jword(j, "true");
    case 'f':
        return jword(j, "false");
    case 'n':
        return jword(j, "null");
    default:
        return jnumber(j);
    }
}

/* An int64 written as a decimal string ("42", proto3's mapping) or as a
 * plain integer. */
static int jint64(struct jp *j, int64_t *out)
{
    const char *s;
    size_t n;
    ws(j);
    if (j->p < j->end && *j->p == '"') {
        if (jstring(j, &s, &n) < 0)
            return FK_EMALFORMED;
    } else {
        s = j->p;
        if (j->p < j->end && *j->p == '-')
            j->p++;
        digits(j);
        n = (size_t)(j->p - s);
    }
    size_t i = n > 0 && s[0] == '-';
    if (i == n || n - i > 19)
        return FK_EMALFORMED;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return FK_EMALFORMED;
        v = v * 10 + (uint64_t)(s[i] - '0'); /* 19 digits fit in a uint64 */
    }
    int neg = s[0] == '-';
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return FK_EMALFORMED;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int jbool(struct jp *j, bool *out)
{
    ws(j);
    if (j->p < j->end && *j->p == 't') {
        *out = true;
        return jword(j, "true");
    }
    *out = false;
    return jword(j, "false");
}

static int name_is(const char *name, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(name, want, len) == 0;
}

/* ---- the response ------------------------------------------------------------ */

struct parse {
    struct ycsb_etcd_resp *r;
    ycsb_etcd_kv_fn on_kv;
    void *arg;
    struct ycsb_etcd_kv kv; /* the entry being read */
    bool has_key;
};

static int kv_member(struct jp *j, const char *name, size_t len, void *arg)
{
    struct parse *ps = arg;
    if (name_is(name, len, "key")) {
        ps->has_key = true;
        return jstring(j, &ps->kv.key, &ps->kv.key_len);
    }
    if (name_is(name, len, "value"))
        return jstring(j, &ps->kv.value, &ps->kv.value_len);
    if (name_is(name, len, "mod_revision"))
        return jint64(j, &ps->kv.mod_revision);
    return jskip(j);
}

static int kv_elem(struct jp *j, int32_t index, void *arg)
{
    struct parse *ps = arg;
    ps->kv = (struct ycsb_etcd_kv){.value = ""};
    ps->has_key = false;
    int rc = jobject(j, kv_member, ps);
    if (rc < 0)
        return rc;
    if (!ps->has_key)
        return FK_EMALFORMED;
    if (index == 0)
        ps->r->first = ps->kv;
    ps->r->nkvs = index + 1;
    return ps->on_kv != NULL ? ps->on_kv(ps->arg, &ps->kv) : 0;
}

static int top_member(struct jp *j, const char *name, size_t len, void *arg)
{
    struct parse *ps = arg;
    const char *s;
    size_t n;
    if (name_is(name, len, "kvs"))
        return jarray(j, kv_elem, ps);
    if (name_is(name, len, "count"))
        return jint64(j, &ps->r->count);
    if (name_is(name, len, "deleted"))
        return jint64(j, &ps->r->deleted);
    if (name_is(name, len, "succeeded"))
        return jbool(j, &ps->r->succeeded);
    if (name_is(name, len, "code"))
        return jint64(j, &ps->r->code);
    if (name_is(name, len, "error")) {
        ps->r->error = true;
        return jstring(j, &s, &n);
    }
    return jskip(j);
}

int ycsb_etcd_parse(const char *json, size_t len, struct ycsb_etcd_resp *r, ycsb_etcd_kv_fn on_kv,
                    void *arg)
{
    if (r == NULL || (json == NULL && len > 0))
        return FK_EINVAL;
    *r = (struct ycsb_etcd_resp){0};
    if (json == NULL)
        return FK_EMALFORMED;
    struct jp j = {.p = json, .end = json + len};
    struct parse ps = {.r = r, .on_kv = on_kv, .arg = arg};
    int rc = jobject(&j, top_member, &ps);
    if (rc < 0)
        return rc;
    ws(&j);
    return j.p == j.end ? 0 : FK_EMALFORMED;
}

/* ---- base64 ------------------------------------------------------------------ */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int64_t ycsb_etcd_b64_encode(char *out, size_t cap, const uint8_t *in, size_t len)
{
    size_t need = ycsb_etcd_b64_len(len);
    if (out == NULL || need >= cap || need > INT64_MAX)
        return FK_ETOOBIG;
    char *o = out;
    size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *o++ = b64_alphabet[v >> 18];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = b64_alphabet[(v >> 6) & 63];
        *o++ = b64_alphabet[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
        *o++ = b64_alphabet[v >> 18];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return (int64_t)need;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int64_t ycsb_etcd_b64_decode(uint8_t *out, size_t cap, const char *in, size_t len)
{
    if (len % 4 != 0 || (in == NULL && len > 0))
        return FK_EMALFORMED;
    size_t pad = len == 0 ? 0 : (in[len - 1] == '=') + (in[len - 1] == '=' && in[len - 2] == '=');
    size_t n = len / 4 * 3 - pad;
    if (n > cap)
        return FK_ETOOBIG;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int last = i + 4 == len;
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = b64_value(in[i + k]);
            /* '=' only as the padding of the last quantum. */
            if (v[k] < 0 && !(last && in[i + k] == '=' && k >= 4 - (int)pad))
                return FK_EMALFORMED;
        }
        uint32_t q = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                     (uint32_t)(v[2] < 0 ? 0 : v[2]) << 6 | (uint32_t)(v[3] < 0 ? 0 : v[3]);
        int bytes = last ? 3 - (int)pad : 3;
        /* Bits below the last byte must be zero (RFC 4648 section 3.5). */
        if ((bytes == 1 && (q & 0xffff) != 0) || (bytes == 2 && (q & 0xff) != 0))
            return FK_EMALFORMED;
        for (int k = 0; k < bytes; k++)
            out[o++] = (uint8_t)(q >> (16 - 8 * k));
    }
    return (int64_t)o;
}
