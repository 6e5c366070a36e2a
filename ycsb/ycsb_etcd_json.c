/*
 * ycsb_etcd_json.c: the JSON and base64 pieces of the gateway binding
 * (-db etcd-json); see ycsb_etcd.h.
 *
 * The responses come from etcd's grpc-gateway (jsonpb with original field
 * names): an object with "header", then "kvs", "count", "deleted",
 * "succeeded" or, for an error, "error", "message", "code". int64 members
 * are decimal strings in proto3's JSON mapping.
 *
 * JSON: jansson (Debian's libjansson), chosen over json-c and cJSON because
 * it parses a buffer of known length (json_loadb: the response is not
 * NUL-terminated), follows RFC 8259 strictly (no raw control characters in
 * strings, digits after a decimal point, no leading zeros, nothing after
 * the document), keeps integers as 64-bit integers rather than doubles,
 * and reports where a document went wrong. Its own nesting limit is 2048;
 * this file refuses documents deeper than YCSB_ETCD_JSON_DEPTH.
 *
 * Base64: libsodium's sodium_bin2base64 and sodium_base642bin (original
 * alphabet with padding), already linked for the cluster token.
 */
#include "ycsb_etcd.h"

#include "fk_error.h"

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

/* ---- the response ------------------------------------------------------------ */

/* Deeper than YCSB_ETCD_JSON_DEPTH objects and arrays: refused. */
static bool too_deep(const json_t *v, int depth)
{
    if (!json_is_object(v) && !json_is_array(v))
        return false;
    if (depth > YCSB_ETCD_JSON_DEPTH)
        return true;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (too_deep(json_array_get(v, i), depth + 1))
                return true;
        }
        return false;
    }
    const char *name;
    const json_t *m;
    json_object_foreach((json_t *)(uintptr_t)v, name, m)
    {
        if (too_deep(m, depth + 1))
            return true;
    }
    return false;
}

/* An int64 member: a decimal string (proto3's JSON mapping) or an integer;
 * absent reads as 0. */
static int get_int64(const json_t *obj, const char *name, int64_t *out)
{
    const json_t *v = json_object_get(obj, name);
    *out = 0;
    if (v == NULL)
        return 0;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (!json_is_string(v))
        return FK_EMALFORMED;
    const char *s = json_string_value(v);
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || (size_t)(end - s) != json_string_length(v))
        return FK_EMALFORMED;
    *out = x;
    return 0;
}

static int get_string(const json_t *obj, const char *name, const char **s, size_t *len)
{
    const json_t *v = json_object_get(obj, name);
    if (v == NULL)
        return 0;
    if (!json_is_string(v))
        return FK_EMALFORMED;
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 1;
}

static int read_kv(const json_t *e, struct ycsb_etcd_kv *kv)
{
    *kv = (struct ycsb_etcd_kv){.value = ""};
    if (!json_is_object(e))
        return FK_EMALFORMED;
    int rc = get_string(e, "key", &kv->key, &kv->key_len);
    if (rc == 0)
        return FK_EMALFORMED; /* a kv without a key */
    if (rc > 0)
        rc = get_string(e, "value", &kv->value, &kv->value_len);
    if (rc >= 0)
        rc = get_int64(e, "mod_revision", &kv->mod_revision);
    return rc < 0 ? rc : 0;
}

static int read_kvs(const json_t *doc, struct ycsb_etcd_resp *r, ycsb_etcd_kv_fn on_kv, void *arg)
{
    const json_t *kvs = json_object_get(doc, "kvs");
    if (kvs == NULL)
        return 0;
    if (!json_is_array(kvs) || json_array_size(kvs) > INT32_MAX)
        return FK_EMALFORMED;
    for (size_t i = 0; i < json_array_size(kvs); i++) {
        struct ycsb_etcd_kv kv;
        int rc = read_kv(json_array_get(kvs, i), &kv);
        if (rc < 0)
            return rc;
        if (i == 0)
            r->first = kv;
        r->nkvs = (int32_t)i + 1;
        if (on_kv != NULL && (rc = on_kv(arg, &kv)) < 0)
            return rc;
    }
    return 0;
}

static int read_resp(const json_t *doc, struct ycsb_etcd_resp *r, ycsb_etcd_kv_fn on_kv, void *arg)
{
    if (!json_is_object(doc) || too_deep(doc, 1))
        return FK_EMALFORMED;
    int rc = get_int64(doc, "count", &r->count);
    if (rc == 0)
        rc = get_int64(doc, "deleted", &r->deleted);
    if (rc == 0)
        rc = get_int64(doc, "code", &r->code);
    const json_t *ok = json_object_get(doc, "succeeded");
    if (rc == 0 && ok != NULL) {
        if (!json_is_boolean(ok))
            return FK_EMALFORMED;
        r->succeeded = json_is_true(ok);
    }
    const char *s;
    size_t n;
    if (rc == 0 && (rc = get_string(doc, "error", &s, &n)) > 0) {
        r->error = true;
        rc = 0;
    }
    return rc < 0 ? rc : read_kvs(doc, r, on_kv, arg);
}

int ycsb_etcd_parse(const char *json, size_t len, struct ycsb_etcd_resp *r, ycsb_etcd_kv_fn on_kv,
                    void *arg)
{
    if (r == NULL || (json == NULL && len > 0))
        return FK_EINVAL;
    *r = (struct ycsb_etcd_resp){0};
    if (json == NULL)
        return FK_EMALFORMED;
    json_error_t e;
    json_t *doc = json_loadb(json, len, 0, &e);
    if (doc == NULL)
        return FK_EMALFORMED;
    int rc = read_resp(doc, r, on_kv, arg);
    if (rc < 0) {
        json_decref(doc);
        *r = (struct ycsb_etcd_resp){0};
        return rc;
    }
    r->doc = doc;
    return 0;
}

void ycsb_etcd_resp_free(struct ycsb_etcd_resp *r)
{
    if (r == NULL)
        return;
    json_decref(r->doc);
    *r = (struct ycsb_etcd_resp){0};
}

/* ---- base64 ------------------------------------------------------------------ */

int64_t ycsb_etcd_b64_encode(char *out, size_t cap, const uint8_t *in, size_t len)
{
    size_t need = ycsb_etcd_b64_len(len);
    if (out == NULL || need >= cap || need > INT64_MAX)
        return FK_ETOOBIG;
    sodium_bin2base64(out, cap, in, len, sodium_base64_VARIANT_ORIGINAL);
    return (int64_t)need;
}

int64_t ycsb_etcd_b64_decode(uint8_t *out, size_t cap, const char *in, size_t len)
{
    if (len % 4 != 0 || (in == NULL && len > 0))
        return FK_EMALFORMED;
    if (len == 0)
        return 0;
    size_t pad = (in[len - 1] == '=') + (in[len - 1] == '=' && in[len - 2] == '=');
    if (len / 4 * 3 - pad > cap)
        return FK_ETOOBIG;
    /* Strict: no characters ignored, nothing after the padding, and
     * libsodium refuses non-zero bits below the last byte (RFC 4648
     * section 3.5) and padding anywhere but at the end. */
    size_t n = 0;
    if (sodium_base642bin(out, cap, in, len, NULL, &n, NULL, sodium_base64_VARIANT_ORIGINAL) != 0)
        return FK_EMALFORMED;
    return (int64_t)n;
}
