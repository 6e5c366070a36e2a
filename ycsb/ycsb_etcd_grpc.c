/*
 * ycsb_etcd_grpc.c: the etcd binding over etcd's native v3 gRPC API; see
 * ycsb_etcd.h for the operations and their results.
 *
 * A context is one gRPC channel (one HTTP/2 connection to the thread's
 * endpoint), one completion queue and D slots (D = flowkv.pipeline). submit
 * takes a free slot, encodes the request with protobuf-c into the slot's
 * buffer and starts one batch on a new call (send metadata, message and
 * half-close; receive metadata, message and status) tagged with the slot;
 * poll takes finished batches from the queue and turns them into
 * completions. A partial UPDATE uses its slot twice (Range, then Txn).
 *
 * Memory: the slots and their request buffers (a Txn of the largest record:
 * 2 keys + 1 record + 64 bytes) are allocated by open; gRPC allocates per
 * call inside its core (the call, its arena, the received message) and
 * protobuf-c per response (the unpacked message, freed at once): per
 * request, as etcd's own clients do.
 *
 * Threads: a context belongs to its runner thread; gRPC runs its own
 * threads behind the queue. grpc_init runs once (pthread_once) and is
 * never undone: the process ends with the run.
 */
#include "ycsb_etcd.h"

#include "etcd_kv.pb-c.h"
#include "fk_error.h"
#include "fk_time.h"
#include "ycsb_record.h"

#include <assert.h>
#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BODY_EXTRA 64 /* a Txn's tags, lengths and revision around its keys and record */

enum method { M_RANGE, M_PUT, M_DELETE, M_TXN };

static const char *const method_path[] = {"/etcdserverpb.KV/Range", "/etcdserverpb.KV/Put",
                                          "/etcdserverpb.KV/DeleteRange", "/etcdserverpb.KV/Txn"};

/* What a slot is doing (as the gateway binding's stages). */
enum stage { G_FREE, G_READ, G_SCAN, G_PUT, G_DELETE, G_RMW_RANGE, G_RMW_TXN };

struct gctx;

struct gslot {
    struct gctx *c;
    enum stage stage;
    uint64_t cookie;
    const struct ycsb_req *req; /* NULL for a delete */
    const char *key;
    unsigned key_len;
    int32_t tries;
    uint8_t *body; /* the encoded request; gRPC reads it until the batch ends */
    size_t body_cap;
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice details;
};

struct gctx {
    struct ycsb_etcd_opts o;
    grpc_channel *channel;
    grpc_completion_queue *cq;
    struct gslot *slots;
    int32_t nslots, nfree, inflight;
    int32_t *free_list;
    uint8_t *rec; /* record scratch: encode or merge */
    size_t rec_cap;
    uint8_t *arena; /* every slot's request buffer */
};

static void call_release(struct gslot *s);

/* ---- setup -------------------------------------------------------------------- */

static pthread_once_t grpc_once = PTHREAD_ONCE_INIT;

static void grpc_start(void)
{
    grpc_init();
}

static void ctx_free(struct gctx *c)
{
    for (int32_t i = 0; c->slots != NULL && i < c->nslots; i++) {
        struct gslot *s = &c->slots[i];
        if (s->call != NULL) /* poll failed with calls under way: cancel them */
            grpc_call_cancel(s->call, NULL);
    }
    if (c->cq != NULL) {
        grpc_completion_queue_shutdown(c->cq);
        for (;;) { /* drain: cancelled batches still complete */
            grpc_event ev =
                grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            call_release(ev.tag);
        }
        grpc_completion_queue_destroy(c->cq);
    }
    if (c->channel != NULL)
        grpc_channel_destroy(c->channel);
    free(c->slots);
    free(c->free_list);
    free(c->rec);
    free(c->arena);
    free(c);
}

static int ctx_alloc(struct gctx *c, char *err, size_t errlen)
{
    const struct ycsb_conf *k = &c->o.conf;
    c->rec_cap =
        ycsb_record_len((int32_t)k->fieldcount, (size_t)k->fieldcount * (size_t)k->fieldlength);
    size_t body = 2 * (size_t)YCSB_KEY_MAX + c->rec_cap + BODY_EXTRA;
    int32_t d = k->pipeline;
    if (body * (size_t)d > YCSB_ETCD_CTX_BYTES) {
        snprintf(err, errlen, "etcd: %d slots of %zu bytes exceed the %u MiB of a thread's buffers",
                 d, body, YCSB_ETCD_CTX_BYTES >> 20);
        return FK_ETOOBIG;
    }
    c->slots = calloc((size_t)d, sizeof *c->slots);
    c->free_list = calloc((size_t)d, sizeof *c->free_list);
    c->rec = malloc(c->rec_cap);
    c->arena = malloc((size_t)d * body);
    if (!c->slots || !c->free_list || !c->rec || !c->arena)
        return -ENOMEM;
    for (int32_t i = 0; i < d; i++) {
        struct gslot *s = &c->slots[i];
        s->c = c;
        s->body = c->arena + (size_t)i * body;
        s->body_cap = body;
        c->free_list[c->nfree++] = d - 1 - i;
    }
    c->nslots = d;
    return 0;
}

/* "http://host:port" -> gRPC's target "host:port"; TLS endpoints are
 * refused (this binding has no certificates to offer). */
static int open_channel(struct gctx *c, char *err, size_t errlen)
{
    if (strncmp(c->o.endpoint, "http://", 7) != 0) {
        snprintf(err, errlen, "etcd.endpoints: '%s': the gRPC binding speaks plain http:// only",
                 c->o.endpoint);
        return FK_EINVAL;
    }
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(c->o.endpoint + 7, creds, NULL);
    grpc_channel_credentials_release(creds);
    c->cq = grpc_completion_queue_create_for_next(NULL);
    if (c->channel == NULL || c->cq == NULL) {
        snprintf(err, errlen, "etcd: cannot create a gRPC channel to %s", c->o.endpoint + 7);
        return FK_ENODEV;
    }
    return 0;
}

static int grpc_open(void **out, const struct ycsb_props *props, int32_t tid, char *err,
                     size_t errlen)
{
    pthread_once(&grpc_once, grpc_start);
    struct gctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    int rc = ycsb_etcd_opts_read(&c->o, props, tid, err, errlen);
    if (rc == 0 && (rc = ctx_alloc(c, err, errlen)) == -ENOMEM)
        snprintf(err, errlen, "etcd: out of memory for %d slots", c->o.conf.pipeline);
    if (rc == 0)
        rc = open_channel(c, err, errlen);
    if (rc < 0) {
        ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void grpc_close(void *ctx)
{
    ctx_free(ctx);
}

/* ---- requests ----------------------------------------------------------------- */

static ProtobufCBinaryData bytes_of(const void *p, size_t len)
{
    return (ProtobufCBinaryData){.len = len, .data = (uint8_t *)(uintptr_t)p};
}

/* Encodes the stage's request into s->body; returns its method or an error.
 * rec/len: the record of a put (or the merged one of a Txn, whose compare
 * wants mod_revision unchanged). */
static int encode(struct gslot *s, const uint8_t *rec, size_t len, int64_t mod_revision,
                  size_t *out)
{
    static const uint8_t zero = 0; /* range_end "\0": every key from key on */
    const ProtobufCMessage *m;
    Etcdserverpb__RangeRequest range = ETCDSERVERPB__RANGE_REQUEST__INIT;
    Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
    Etcdserverpb__DeleteRangeRequest del = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
    Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
    Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT;
    Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
    Etcdserverpb__Compare *cmps[1] = {&cmp};
    Etcdserverpb__RequestOp *ops[1] = {&op};
    ProtobufCBinaryData key = bytes_of(s->key, s->key_len);
    int method;
    switch (s->stage) {
    case G_READ:
    case G_SCAN:
    case G_RMW_RANGE:
        range.key = key;
        range.serializable = s->c->o.serializable;
        if (s->stage == G_SCAN) {
            range.range_end = bytes_of(&zero, 1);
            range.limit = s->req->scan_len;
        }
        m = &range.base;
        method = M_RANGE;
        break;
    case G_PUT:
        put.key = key;
        put.value = bytes_of(rec, len);
        m = &put.base;
        method = M_PUT;
        break;
    case G_DELETE:
        del.key = key;
        m = &del.base;
        method = M_DELETE;
        break;
    case G_RMW_TXN:
        cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
        cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
        cmp.key = key;
        cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
        cmp.mod_revision = mod_revision;
        put.key = key;
        put.value = bytes_of(rec, len);
        op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
        op.request_put = &put;
        txn.n_compare = 1;
        txn.compare = cmps;
        txn.n_success = 1;
        txn.success = ops;
        m = &txn.base;
        method = M_TXN;
        break;
    default:
        assert(0 && "stage");
        return FK_EINVAL;
    }
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > s->body_cap)
        return FK_ETOOBIG;
    *out = protobuf_c_message_pack(m, s->body);
    return method;
}

/* Starts the slot's current stage: one call, one batch. */
static int start(struct gslot *s, const uint8_t *rec, size_t len, int64_t mod_revision)
{
    struct gctx *c = s->c;
    size_t n;
    int method = encode(s, rec, len, mod_revision, &n);
    if (method < 0)
        return method;
    grpc_slice body = grpc_slice_from_static_buffer(s->body, n);
    s->send = grpc_raw_byte_buffer_create(&body, 1);
    s->recv = NULL;
    grpc_metadata_array_init(&s->md_initial);
    grpc_metadata_array_init(&s->md_trailing);
    s->details = grpc_empty_slice();
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(c->o.timeout_ms, GPR_TIMESPAN));
    grpc_slice path = grpc_slice_from_static_string(method_path[method]);
    s->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, path, NULL,
                                       deadline, NULL);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &s->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &s->md_trailing;
    ops[5].data.recv_status_on_client.status = &s->status;
    ops[5].data.recv_status_on_client.status_details = &s->details;
    grpc_call_error e = s->call ? grpc_call_start_batch(s->call, ops, 6, s, NULL) : GRPC_CALL_ERROR;
    if (e != GRPC_CALL_OK) {
        if (s->call != NULL)
            grpc_call_unref(s->call);
        s->call = NULL;
        grpc_byte_buffer_destroy(s->send);
        grpc_metadata_array_destroy(&s->md_initial);
        grpc_metadata_array_destroy(&s->md_trailing);
        return FK_EPROTO;
    }
    return 0;
}

static struct gslot *take_slot(struct gctx *c, uint64_t cookie, const char *key, unsigned key_len)
{
    if (c->nfree == 0)
        return NULL;
    struct gslot *s = &c->slots[c->free_list[--c->nfree]];
    assert(s->stage == G_FREE && s->call == NULL);
    s->cookie = cookie;
    s->key = key;
    s->key_len = key_len;
    s->req = NULL;
    s->tries = 0;
    return s;
}

static void release_slot(struct gctx *c, struct gslot *s)
{
    s->stage = G_FREE;
    c->free_list[c->nfree++] = (int32_t)(s - c->slots);
}

static int launch(struct gctx *c, struct gslot *s, enum stage st, const uint8_t *rec, size_t len)
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

static int grpc_submit(void *ctx, const struct ycsb_req *req)
{
    static const enum stage stage_of[] = {[YCSB_ETCD_READ] = G_READ,
                                          [YCSB_ETCD_SCAN] = G_SCAN,
                                          [YCSB_ETCD_PUT] = G_PUT,
                                          [YCSB_ETCD_RMW] = G_RMW_RANGE};
    struct gctx *c = ctx;
    if (req == NULL || req->key == NULL || req->key_len == 0 || req->key_len >= YCSB_KEY_MAX)
        return FK_EINVAL;
    struct gslot *s = take_slot(c, req->cookie, req->key, req->key_len);
    if (s == NULL)
        return FK_EFULL;
    s->req = req;
    size_t len;
    int op = ycsb_etcd_plan(&c->o.conf, req, c->rec, c->rec_cap, &len);
    if (op < 0) {
        release_slot(c, s);
        return op;
    }
    return launch(c, s, stage_of[op], op == YCSB_ETCD_PUT ? c->rec : NULL, len);
}

int ycsb_etcd_grpc_submit_delete(void *ctx, uint64_t cookie, const char *key, unsigned key_len)
{
    struct gctx *c = ctx;
    if (c == NULL || key == NULL || key_len == 0 || key_len >= YCSB_KEY_MAX)
        return FK_EINVAL;
    struct gslot *s = take_slot(c, cookie, key, key_len);
    if (s == NULL)
        return FK_EFULL;
    return launch(c, s, G_DELETE, NULL, 0);
}

/* ---- completions -------------------------------------------------------------- */

/* A call that did not end with status OK: the result it stands for. */
static int status_error(grpc_status_code st)
{
    switch (st) {
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return FK_ETIMEDOUT;
    case GRPC_STATUS_UNAVAILABLE:
        return FK_EUNREACHABLE; /* no connection, or "etcdserver: no leader" */
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return FK_EBUSY;
    case GRPC_STATUS_INVALID_ARGUMENT:
        return FK_EINVAL;
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
        return FK_EAUTH;
    default:
        return FK_EPROTO;
    }
}

/* A kv's value must be a record holding the field a read names. */
static int check_value(struct gctx *c, const struct ycsb_req *req, const Etcdserverpb__KeyValue *kv,
                       struct ycsb_record_view *v)
{
    if (kv->value.len > c->rec_cap || ycsb_record_parse(kv->value.data, kv->value.len, v) < 0)
        return FK_EMALFORMED;
    if (req != NULL && req->read_field != NULL &&
        ycsb_record_field_index(c->o.conf.fieldnameprefix, req->read_field, v->nfields) < 0)
        return FK_EMALFORMED;
    return 0;
}

static bool same_key(const struct gslot *s, const Etcdserverpb__KeyValue *kv)
{
    return kv->key.len == s->key_len && memcmp(kv->key.data, s->key, s->key_len) == 0;
}

/* A Range answered: the result of a read or scan, or 1 when a partial
 * update started its Txn. */
static int on_range(struct gctx *c, struct gslot *s, const Etcdserverpb__RangeResponse *r)
{
    struct ycsb_record_view v;
    if (s->stage != G_SCAN && r->n_kvs > 0 && (r->n_kvs != 1 || !same_key(s, r->kvs[0])))
        return FK_EPROTO; /* not the answer to this request */
    if (r->n_kvs == 0)
        return FK_ENOTFOUND;
    if (s->stage == G_SCAN) {
        if (r->n_kvs > (size_t)s->req->scan_len)
            return FK_EPROTO;
        for (size_t i = 0; i < r->n_kvs; i++) {
            int rc = check_value(c, s->req, r->kvs[i], &v);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (s->stage == G_READ)
        return check_value(c, s->req, r->kvs[0], &v);
    /* G_RMW_RANGE: merge and put it back if nobody wrote since. */
    int rc = check_value(c, NULL, r->kvs[0], &v);
    if (rc < 0)
        return rc;
    int64_t n = ycsb_record_merge(c->rec, c->rec_cap, v.rec, v.len, c->o.conf.fieldnameprefix,
                                  s->req->fields, s->req->nfields);
    if (n < 0)
        return (int)n;
    s->stage = G_RMW_TXN;
    rc = start(s, c->rec, (size_t)n, r->kvs[0]->mod_revision);
    return rc < 0 ? rc : 1;
}

/* The result of a call that ended OK with message bytes buf/len, or 1 when
 * the slot started its next stage. */
static int on_response(struct gctx *c, struct gslot *s, const uint8_t *buf, size_t len)
{
    int rc = FK_EMALFORMED;
    switch (s->stage) {
    case G_READ:
    case G_SCAN:
    case G_RMW_RANGE: {
        Etcdserverpb__RangeResponse *r = etcdserverpb__range_response__unpack(NULL, len, buf);
        if (r != NULL) {
            rc = on_range(c, s, r);
            etcdserverpb__range_response__free_unpacked(r, NULL);
        }
        return rc;
    }
    case G_PUT: {
        Etcdserverpb__PutResponse *r = etcdserverpb__put_response__unpack(NULL, len, buf);
        rc = r != NULL ? 0 : FK_EMALFORMED;
        etcdserverpb__put_response__free_unpacked(r, NULL);
        return rc;
    }
    case G_DELETE: {
        Etcdserverpb__DeleteRangeResponse *r =
            etcdserverpb__delete_range_response__unpack(NULL, len, buf);
        if (r != NULL)
            rc = r->deleted > 0 ? 0 : FK_ENOTFOUND;
        etcdserverpb__delete_range_response__free_unpacked(r, NULL);
        return rc;
    }
    case G_RMW_TXN: {
        Etcdserverpb__TxnResponse *r = etcdserverpb__txn_response__unpack(NULL, len, buf);
        if (r == NULL)
            return FK_EMALFORMED;
        int ok = r->succeeded;
        etcdserverpb__txn_response__free_unpacked(r, NULL);
        if (ok)
            return 0;
        if (++s->tries >= c->o.update_tries)
            return FK_ECASFAIL;
        s->stage = G_RMW_RANGE; /* another writer came between: read again */
        rc = start(s, NULL, 0, 0);
        return rc < 0 ? rc : 1;
    }
    case G_FREE:
        break;
    }
    assert(0 && "stage");
    return FK_EPROTO;
}

/* Ends a slot's call: what the batch received and the call itself. */
static void call_release(struct gslot *s)
{
    grpc_byte_buffer_destroy(s->send);
    grpc_byte_buffer_destroy(s->recv);
    grpc_metadata_array_destroy(&s->md_initial);
    grpc_metadata_array_destroy(&s->md_trailing);
    grpc_slice_unref(s->details);
    grpc_call_unref(s->call);
    s->call = NULL;
    s->send = s->recv = NULL;
}

/* One finished batch: its result (1: the slot goes on with a new call). */
static int finish(struct gctx *c, struct gslot *s, int success)
{
    grpc_slice all = grpc_empty_slice();
    int rc = FK_EMALFORMED, have = 0;
    grpc_byte_buffer_reader rd;
    if (!success)
        rc = FK_EUNREACHABLE;
    else if (s->status != GRPC_STATUS_OK)
        rc = status_error(s->status);
    else if (s->recv != NULL && grpc_byte_buffer_reader_init(&rd, s->recv)) {
        all = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        have = 1;
    }
    call_release(s);
    /* on_response may start the next stage's call on this slot */
    if (have)
        rc = on_response(c, s, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all));
    grpc_slice_unref(all);
    return rc;
}

static int grpc_poll(void *ctx, struct ycsb_done *done, int max, int64_t timeout_ns)
{
    struct gctx *c = ctx;
    int n = 0;
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_nanos(timeout_ns > 0 ? timeout_ns : 0, GPR_TIMESPAN));
    while (n < max && c->inflight > 0) {
        /* Wait for the first completion; then take what is there already. */
        grpc_event ev = grpc_completion_queue_next(
            c->cq, n == 0 ? deadline : gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            return FK_EPROTO;
        struct gslot *s = ev.tag;
        assert(s != NULL && s->c == c && s->stage != G_FREE);
        int rc = finish(c, s, ev.success);
        if (rc == 1)
            continue; /* the next stage of a partial update is under way */
        done[n++] = (struct ycsb_done){.cookie = s->cookie, .rc = rc > 0 ? 0 : rc};
        c->inflight--;
        release_slot(c, s);
    }
    return n;
}

const struct ycsb_binding ycsb_etcd_grpc_binding = {
    .name = "etcd",
    .open = grpc_open,
    .close = grpc_close,
    .submit = grpc_submit,
    .poll = grpc_poll,
};
