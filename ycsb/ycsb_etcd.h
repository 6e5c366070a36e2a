/*
 * ycsb_etcd.h: the etcd bindings of flowkv-ycsb.
 *
 *  -db etcd       etcd's native v3 gRPC API (ycsb_etcd_grpc.c): gRPC's C
 *                 core (Debian's libgrpc) on a completion queue, so one
 *                 runner thread keeps flowkv.pipeline calls in flight on one
 *                 HTTP/2 connection, messages encoded by protobuf-c from
 *                 ycsb/etcd/etcd_kv.proto (a subset of etcd's rpc.proto).
 *                 This is how etcd's own clients (etcdctl, jetcd, clientv3)
 *                 talk to it, and what every benchmark compares against.
 *  -db etcd-json  etcd's v3 JSON gateway (grpc-gateway: HTTP/1.1 POST of
 *                 JSON to /v3/kv/..., keys and values base64), with
 *                 libcurl's multi interface (ycsb_etcd.c). The gateway
 *                 translates JSON to gRPC inside the etcd member, which on
 *                 a small machine costs etcd about three times the CPU per
 *                 operation: kept to show that difference, not as a baseline.
 *
 * Both do the same operations with the same results; the paths below are
 * the gateway's, the gRPC methods /etcdserverpb.KV/Range, Put, DeleteRange
 * and Txn carry the same messages.
 *
 * Operations, as YCSB's own etcd binding (site.ycsb.db.etcd.EtcdClient) does
 * them; the table is not part of the key:
 *   READ    POST /v3/kv/range {"key":K}: OK when a kv comes back and its
 *           value is a valid record (ycsb_record.h; the named field, if any,
 *           must be in it), NOT_FOUND when none comes back.
 *   SCAN    POST /v3/kv/range {"key":K,"range_end":"AA==","limit":N}: the
 *           first N keys >= K (range_end "\0" means "to the end of the key
 *           space"); OK when at least one comes back, every value a valid
 *           record; NOT_FOUND when none (as YCSB's binding).
 *   INSERT  POST /v3/kv/put {"key":K,"value":record}.
 *   UPDATE  writing every field (fieldcount = 1, or writeallfields=true):
 *           the same put (as YCSB's binding; like it, it creates a missing
 *           record). Writing some fields only: YCSB's binding would put a
 *           record holding only those fields and lose the others; here it
 *           is a read-modify-write made atomic by a transaction: a range
 *           reads the record and its mod_revision, then POST /v3/kv/txn puts
 *           the merged record if mod_revision is unchanged; when another
 *           writer came between, the pair is retried up to etcd.update_tries
 *           times, then fails with FK_ECASFAIL. A missing record is
 *           NOT_FOUND. The DFI benchmark (workload_dfi_b, one field) never
 *           takes this path.
 *   DELETE  POST /v3/kv/deleterange {"key":K} (ycsb_etcd_submit_delete: the
 *           runner has no delete request yet): OK when a key was deleted,
 *           NOT_FOUND when none was.
 * Reads are linearizable (etcd's default, as jetcd's) unless
 * etcd.serializable=true.
 *
 * Properties (besides the workload's; open reads them from the run's props):
 *   etcd.endpoints   client URLs, comma separated (default
 *                    http://127.0.0.1:2379); etcd.balance says which one a
 *                    thread uses
 *   etcd.balance     first (default): every thread uses the first
 *                    endpoint's gateway (writes and linearizable reads go
 *                    through the leader whichever member answers); thread:
 *                    thread t uses endpoint t mod n, as jetcd's round-robin
 *                    spreads its calls over all members
 *   etcd.timeout_ms  per HTTP request, connection included (default 10000)
 *   etcd.serializable  true: serializable reads, answered by the member
 *                    without a quorum round (default false)
 *   etcd.update_tries  read-modify-write attempts of a partial UPDATE
 *                    (default 10)
 *
 * Results (struct ycsb_done.rc, mapped by ycsb_status_from_err): 0;
 * FK_ENOTFOUND; FK_ETIMEDOUT (etcd.timeout_ms passed, or gRPC code
 * DEADLINE_EXCEEDED); -ECONNREFUSED (no one listens); FK_EUNREACHABLE (any
 * other transport failure); FK_EBUSY (HTTP 429/503, gRPC UNAVAILABLE or
 * RESOURCE_EXHAUSTED: no leader, too many requests); FK_EINVAL (HTTP 400,
 * gRPC INVALID_ARGUMENT); FK_EAUTH (gRPC UNAUTHENTICATED or
 * PERMISSION_DENIED); FK_EPROTO (any other HTTP error, an error member in
 * a 200 answer, a read answered with another key); FK_EMALFORMED (a
 * response that is not the JSON expected, or a value that is not a valid
 * record); FK_ETOOBIG (a response larger than the slot's buffer);
 * FK_ECASFAIL (partial update lost etcd.update_tries races).
 *
 * Memory, allocated once by open for a context of depth D =
 * flowkv.pipeline: D curl easy handles, each with a request buffer of
 * 2 * b64(YCSB_KEY_MAX) + b64(record) + 256 bytes (the largest body, a
 * txn) and a response buffer of 512 + S * (b64(YCSB_KEY_MAX) +
 * b64(record) + 256) bytes, S = maxscanlength when scanproportion > 0,
 * else 1 (a kv's JSON: its two base64 strings plus at most 256 bytes of
 * names and three revisions); plus two record-sized scratch buffers. With
 * workload_dfi_b (76-byte records) a slot is about 1.1 KB; the whole context
 * may not exceed YCSB_ETCD_CTX_BYTES (open fails with FK_ETOOBIG). This code
 * allocates nothing per request: it sets a handle's URL only when the
 * operation's path changes, and points curl at its own body buffer.
 * libcurl itself still allocates per transfer (it parses the URL into a
 * fresh CURLU and builds the request headers in a dynamic buffer) and per
 * connection (at most D connections, kept by the multi handle's cache).
 *
 * Threads: one context per runner thread, used by that thread only (the
 * ycsb_binding contract); contexts share nothing but curl_global_init,
 * which open runs once under pthread_once.
 */
#ifndef YCSB_ETCD_H
#define YCSB_ETCD_H

#include "ycsb_run.h"
#include "ycsb_workload.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define YCSB_ETCD_CTX_BYTES  (256u << 20) /* request and response buffers per context */
#define YCSB_ETCD_URL_MAX    256          /* an endpoint plus the longest path */
#define YCSB_ETCD_JSON_DEPTH 32           /* nesting accepted in a response */

/* The bindings: "etcd" (gRPC) and "etcd-json" (the gateway). */
extern const struct ycsb_binding ycsb_etcd_grpc_binding;
extern const struct ycsb_binding ycsb_etcd_json_binding;

/* The etcd.* properties both bindings read (above) and the workload. */
struct ycsb_etcd_opts {
    struct ycsb_conf conf;
    long timeout_ms;
    int32_t update_tries;
    bool serializable;
    char endpoint[YCSB_ETCD_URL_MAX]; /* this thread's: "http://host:port", no '/' at the end */
};

/* What a request becomes in etcd, the same through either API. */
enum ycsb_etcd_op {
    YCSB_ETCD_READ, /* Range of the key */
    YCSB_ETCD_SCAN, /* Range from the key to the end, limit scan_len */
    YCSB_ETCD_PUT,  /* Put of the whole record */
    YCSB_ETCD_RMW,  /* partial update: Range, then Txn if mod_revision is unchanged */
};

/* Decides what req becomes; for a PUT encodes its record into rec (cap
 * bytes) and sets *len. Returns the op, or FK_EINVAL (a scan of fewer than
 * one record, an unknown kind) or ycsb_record_encode's error. Pure. */
int ycsb_etcd_plan(const struct ycsb_conf *conf, const struct ycsb_req *req, uint8_t *rec,
                   size_t cap, size_t *len);

/* Reads them for runner thread tid. Returns 0, or FK_EINVAL with a
 * message in err naming the property. Any thread. */
int ycsb_etcd_opts_read(struct ycsb_etcd_opts *o, const struct ycsb_props *props, int32_t tid,
                        char *err, size_t errlen);

/* Starts a DELETE of key (key_len bytes; the caller keeps it valid until the
 * completion) on ctx, a context of ycsb_etcd_json_binding; its completion carries
 * cookie and comes from poll like any other. Returns 0, FK_EFULL (flowkv.
 * pipeline requests are in flight) or FK_EINVAL (empty or too long key).
 * The context's thread only. */
int ycsb_etcd_submit_delete(void *ctx, uint64_t cookie, const char *key, unsigned key_len);
/* The same on a context of ycsb_etcd_grpc_binding (DeleteRange). */
int ycsb_etcd_grpc_submit_delete(void *ctx, uint64_t cookie, const char *key, unsigned key_len);

/* ---- the JSON gateway's responses (exposed for tests) ------------------- */

/* One entry of "kvs": base64 text of the key and value (pointers into the
 * parsed document, valid until ycsb_etcd_resp_free) and the mod_revision. */
struct ycsb_etcd_kv {
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
    int64_t mod_revision;
};

/* What the binding needs of a response; absent members read as zero or
 * false, as proto3's JSON leaves default values out. */
struct ycsb_etcd_resp {
    int32_t nkvs;              /* entries of "kvs" */
    struct ycsb_etcd_kv first; /* "kvs"[0] when nkvs > 0 */
    int64_t count;             /* "count": keys in the range (before limit) */
    int64_t deleted;           /* "deleted" (deleterange) */
    bool succeeded;            /* "succeeded" (txn) */
    bool error;                /* an "error" member: an error response */
    int64_t code;              /* "code": the gRPC status code of an error */
    void *doc;                 /* the parsed document (jansson), owned here */
};

/* Called for each entry of "kvs" in order; a negative return stops the
 * parse with that result. */
typedef int (*ycsb_etcd_kv_fn)(void *arg, const struct ycsb_etcd_kv *kv);

/* Parses a gateway response (len bytes of json, need not be NUL-terminated)
 * into r with jansson: one JSON object whose members "kvs" (an array of
 * objects with "key", "value" base64 strings and "mod_revision"), "count",
 * "deleted" (int64 as a decimal string or a number), "succeeded" (a
 * boolean), "error" (a string) and "code" (an integer) are read; the rest
 * must be valid JSON (RFC 8259) and is not looked at. on_kv (may be NULL)
 * sees every kv. Returns 0, after which r holds the document until
 * ycsb_etcd_resp_free(r); FK_EMALFORMED for anything that is not such an
 * object (bad syntax, trailing bytes, nesting deeper than
 * YCSB_ETCD_JSON_DEPTH, a member of the wrong type, an integer out of
 * range, a kv without a key); or on_kv's error (r then holds nothing). Any
 * thread. */
int ycsb_etcd_parse(const char *json, size_t len, struct ycsb_etcd_resp *r, ycsb_etcd_kv_fn on_kv,
                    void *arg);
/* Frees what a successful ycsb_etcd_parse left in r; r reads as empty. */
void ycsb_etcd_resp_free(struct ycsb_etcd_resp *r);

/* Base64 (RFC 4648 section 4, with padding: what the gateway reads and
 * writes for bytes), through libsodium. Encode writes 4 * ceil(len / 3)
 * characters and a NUL into out (cap bytes) and returns their number, or
 * FK_ETOOBIG. Decode writes the bytes of len characters of in and returns
 * their number; FK_EMALFORMED for a length that is not a multiple of 4, a
 * character outside the alphabet, misplaced padding or non-zero padding
 * bits; FK_ETOOBIG when cap is too small. Pure. */
int64_t ycsb_etcd_b64_encode(char *out, size_t cap, const uint8_t *in, size_t len);
int64_t ycsb_etcd_b64_decode(uint8_t *out, size_t cap, const char *in, size_t len);

/* Characters of the base64 text of len bytes. */
static inline size_t ycsb_etcd_b64_len(size_t len)
{
    return 4 * ((len + 2) / 3);
}

#endif /* YCSB_ETCD_H */
