/*
 * ycsb_flowkv.c: the flowkv binding on libflowkv's asynchronous API; see
 * ycsb_flowkv.h for the mapping, memory and results.
 *
 * A context is H libflowkv handles (H = flowkv.handles, default 1) and D
 * slots (D = flowkv.pipeline); slot i goes to handle i % H, whose pipeline
 * depth is D / H rounded up. H > 1 serves many handles from one thread, as
 * an event-driven application would (flowkv_poll_set): 1,024 handles with
 * one request in flight each need not be 1,024 threads. submit takes a
 * free slot and hands one
 * flowkv operation tagged with the slot's index to flowkv_submit; poll
 * takes libflowkv's completions and turns each into the runner's
 * completion, or into the slot's next flowkv operation (a partial UPDATE is
 * GET then CAS, a long SCAN several scans). A slot therefore never has more
 * than one flowkv operation in flight, so D slots never overfill the
 * handle's pipeline.
 */
#include "ycsb_flowkv.h"

#include "fk_error.h"
#include "fk_time.h"
#include "flowkv.h"
#include "ycsb_record.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CLUSTER "run/cluster.conf"
/* Bytes one scan pair of a record of rec bytes may take in a page: the
 * server stops a page when the next pair would take it past
 * FLOWKV_SCAN_PAGE (server/kv_sm.c), so a page with more room left than
 * this ended at the end of the key space. */
#define PAIR_MAX(rec) (6 + FLOWKV_KEY_MAX + (rec))

enum stage {
    SLOT_FREE,
    SLOT_READ,
    SLOT_PUT,
    SLOT_SCAN,
    SLOT_RMW_GET, /* partial update: reading the record */
    SLOT_RMW_CAS, /* partial update: CAS of the merged record */
};

struct slot {
    enum stage stage;
    uint64_t cookie;
    const struct ycsb_req *req;
    int32_t tries;       /* RMW: CAS attempts made */
    int32_t scan_left;   /* SCAN: records still wanted */
    int32_t scan_got;    /* SCAN: records returned so far */
    size_t next_len;     /* SCAN: the next piece's start key */
    uint32_t next_flags; /* SCAN: FLOWKV_SCAN_AFTER once the start is the last key got */
    uint8_t next_key[FLOWKV_KEY_MAX];
};

struct ctx {
    flowkv *kv;   /* kvs[0] */
    flowkv **kvs; /* nkv handles */
    int32_t nkv;
    struct ycsb_conf conf;
    int32_t update_tries;
    size_t rec_cap; /* the largest record of this workload */
    struct slot *slots;
    int32_t nslots, nfree, inflight;
    int32_t *free_list;
    struct flowkv_done *fdone; /* nslots completions of one flowkv_poll */
    uint8_t *rec;              /* scratch: the record being written */
};

/* ---- properties and open ----------------------------------------------------- */

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

/* The workload must fit flowkv's limits: a record in one value, a
 * handle's share of the pipeline in its handle. */
static int check_limits(struct ctx *c, long handles, char *err, size_t errlen)
{
    const struct ycsb_conf *k = &c->conf;
    c->rec_cap =
        ycsb_record_len((int32_t)k->fieldcount, (size_t)k->fieldcount * (size_t)k->fieldlength);
    if (c->rec_cap > FLOWKV_VAL_MAX) {
        snprintf(err, errlen,
                 "flowkv: a record of %lld fields of %d bytes is %zu bytes encoded, more than "
                 "flowkv's %d-byte values (lower fieldcount or fieldlength)",
                 (long long)k->fieldcount, k->fieldlength, c->rec_cap, FLOWKV_VAL_MAX);
        return FK_ETOOBIG;
    }
    if ((k->pipeline + handles - 1) / handles > FLOWKV_PIPELINE_MAX) {
        snprintf(err, errlen,
                 "flowkv.pipeline: %d over %ld handle(s) is more than libflowkv's %d a handle "
                 "(raise flowkv.handles)",
                 k->pipeline, handles, FLOWKV_PIPELINE_MAX);
        return FK_EINVAL;
    }
    return 0;
}

/* NOPaxos carries requests of FLOWKV_NOP_OP_MAX bytes of key and values
 * (README, Limits): a record must fit one with its key (keys are short:
 * 64 bytes covers YCSB's), and twice when updates of some fields are a
 * compare-and-swap of the old record for the new one. Checked against
 * the first replica that answers; none answering leaves it to the
 * operations. */
static int check_nopaxos(struct ctx *c, char *err, size_t errlen)
{
    struct flowkv_replica_status st = {0};
    for (uint32_t i = 0; i < flowkv_replicas(c->kv) && !st.reachable; i++)
        flowkv_status(c->kv, i, &st, FK_NSEC_PER_SEC);
    size_t need = (c->conf.writeallfields ? 1 : 2) * c->rec_cap + 64;
    if (!st.reachable || strcmp(st.protocol, "nopaxos") != 0 || need <= FLOWKV_NOP_OP_MAX)
        return 0;
    snprintf(err, errlen,
             "flowkv: records of %zu bytes: %s needs %zu bytes a request, more than the %d "
             "NOPaxos carries (use Multi-Paxos, or lower fieldcount or fieldlength)",
             c->rec_cap, c->conf.writeallfields ? "a put" : "an update of some fields", need,
             FLOWKV_NOP_OP_MAX);
    return FK_ETOOBIG;
}

static void ctx_free(struct ctx *c)
{
    for (int32_t i = 0; c->kvs != NULL && i < c->nkv; i++)
        flowkv_close(c->kvs[i]);
    free(c->kvs);
    free(c->slots);
    free(c->free_list);
    free(c->fdone);
    free(c->rec);
    free(c);
}

static int ctx_alloc(struct ctx *c)
{
    int32_t d = c->conf.pipeline;
    c->slots = calloc((size_t)d, sizeof *c->slots);
    c->free_list = calloc((size_t)d, sizeof *c->free_list);
    c->fdone = calloc((size_t)d, sizeof *c->fdone);
    c->rec = malloc(FLOWKV_VAL_MAX);
    if (!c->slots || !c->free_list || !c->fdone || !c->rec)
        return -ENOMEM;
    c->nslots = d;
    for (int32_t i = 0; i < d; i++)
        c->free_list[c->nfree++] = d - 1 - i;
    return 0;
}

static int fkv_open(void **out, const struct ycsb_props *props, int32_t tid, char *err,
                    size_t errlen)
{
    struct ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    long timeout_ms = 0, tries = 0, handles = 1;
    int rc = ycsb_conf_parse(&c->conf, props, err, errlen);
    if (rc == 0)
        rc = prop_long(props, "flowkv.timeout_ms", 5000, 1, 3600000, &timeout_ms, err, errlen);
    if (rc == 0)
        rc = prop_long(props, "flowkv.update_tries", 10, 1, 1000, &tries, err, errlen);
    if (rc == 0)
        rc = prop_long(props, "flowkv.handles", 1, 1, FLOWKV_HANDLES_MAX, &handles, err, errlen);
    if (rc == 0 && handles > c->conf.pipeline) {
        snprintf(err, errlen,
                 "flowkv.handles: %ld handles a thread need flowkv.pipeline of at least %ld (one "
                 "request in flight each), not %d",
                 handles, handles, c->conf.pipeline);
        rc = FK_EINVAL;
    }
    if (rc == 0)
        rc = check_limits(c, handles, err, errlen);
    if (rc == 0 && (c->kvs = calloc((size_t)handles, sizeof *c->kvs)) == NULL)
        rc = -ENOMEM;
    if (rc == 0 && (rc = ctx_alloc(c)) < 0)
        snprintf(err, errlen, "flowkv: out of memory for %d slots", c->conf.pipeline);
    const char *path = ycsb_props_get(props, "flowkv.cluster");
    if (path == NULL || *path == '\0')
        path = DEFAULT_CLUSTER;
    if (rc == 0) {
        uint32_t depth = (uint32_t)((c->conf.pipeline + handles - 1) / handles);
        struct flowkv_opts o = {.timeout_ns = (uint64_t)timeout_ms * FK_NSEC_PER_MSEC,
                                .pipeline = depth};
        char why[200] = "";
        for (; rc == 0 && c->nkv < handles; c->nkv++) {
            rc = flowkv_open(path, &o, &c->kvs[c->nkv], why, sizeof why);
            if (rc < 0) {
                snprintf(err, errlen, "flowkv: cannot open %s (handle %d of this thread): %s", path,
                         c->nkv + 1, why[0] ? why : fk_strerror(rc));
                c->kvs[c->nkv] = NULL;
            }
        }
        c->kv = c->kvs[0];
        if (rc == 0 && tid == 0)
            rc = check_nopaxos(c, err, errlen);
    }
    if (rc < 0) {
        ctx_free(c);
        return rc;
    }
    int64_t sessions = (int64_t)ycsb_conf_threads(&c->conf) * c->conf.pipeline;
    if (tid == 0 && sessions > YCSB_FLOWKV_SESSIONS)
        fprintf(stderr,
                "flowkv-ycsb: warning: %lld client sessions (threads x flowkv.pipeline) but the "
                "cluster remembers %d; evicted sessions answer FK_EEXPIRED\n",
                (long long)sessions, YCSB_FLOWKV_SESSIONS);
    c->update_tries = (int32_t)tries;
    *out = c;
    return 0;
}

static void fkv_close(void *ctx)
{
    ctx_free(ctx);
}

/* ---- requests ---------------------------------------------------------------- */

static struct slot *take_slot(struct ctx *c)
{
    if (c->nfree == 0)
        return NULL;
    struct slot *s = &c->slots[c->free_list[--c->nfree]];
    assert(s->stage == SLOT_FREE);
    return s;
}

/* Frees s, taken by take_slot (its stage may still be SLOT_FREE when it
 * failed before its first operation). */
static void release_slot(struct ctx *c, struct slot *s)
{
    s->stage = SLOT_FREE;
    c->free_list[c->nfree++] = (int32_t)(s - c->slots);
    assert(c->nfree <= c->nslots);
}

/* Hands s's next flowkv operation to libflowkv; the slot's stage says
 * which. rec (len bytes) is the value of a PUT or CAS, exp (elen bytes) the
 * expected value of a CAS; libflowkv copies both. */
static int send_op(struct ctx *c, struct slot *s, const uint8_t *rec, size_t len,
                   const uint8_t *exp, size_t elen)
{
    const struct ycsb_req *q = s->req;
    struct flowkv_op op = {.key = q->key, .klen = q->key_len, .tag = (uint64_t)(s - c->slots)};
    switch (s->stage) {
    case SLOT_READ:
    case SLOT_RMW_GET:
        op.type = FLOWKV_GET;
        break;
    case SLOT_PUT:
        op.type = FLOWKV_PUT;
        op.val = rec;
        op.vlen = len;
        break;
    case SLOT_RMW_CAS:
        op.type = FLOWKV_CAS;
        op.val = rec;
        op.vlen = len;
        op.exp = exp;
        op.elen = elen;
        break;
    case SLOT_SCAN:
        op.type = FLOWKV_SCAN;
        op.key = s->next_key;
        op.klen = s->next_len;
        op.flags = s->next_flags;
        op.count = (uint32_t)(s->scan_left < FLOWKV_SCAN_MAX ? s->scan_left : FLOWKV_SCAN_MAX);
        break;
    case SLOT_FREE:
        assert(0 && "stage");
        return FK_EINVAL;
    }
    return flowkv_submit(c->kvs[(s - c->slots) % c->nkv], &op);
}

/* Starts the first operation of s at stage st; on failure the slot is free
 * again and the error is the request's result. */
static int launch(struct ctx *c, struct slot *s, enum stage st, const uint8_t *rec, size_t len)
{
    s->stage = st;
    int rc = send_op(c, s, rec, len, NULL, 0);
    if (rc < 0) {
        release_slot(c, s);
        return rc;
    }
    c->inflight++;
    return 0;
}

/* Sets up a SCAN's first piece; FK_EINVAL or FK_EKEYSIZE for a request
 * flowkv cannot take. */
static int prepare_scan(struct slot *s)
{
    const struct ycsb_req *q = s->req;
    if (q->scan_len < 1)
        return FK_EINVAL;
    if (q->key_len > FLOWKV_KEY_MAX)
        return FK_EKEYSIZE;
    s->scan_left = q->scan_len;
    s->scan_got = 0;
    memcpy(s->next_key, q->key, q->key_len);
    s->next_len = q->key_len;
    s->next_flags = 0;
    return 0;
}

static int fkv_submit(void *ctx, const struct ycsb_req *req)
{
    struct ctx *c = ctx;
    if (req == NULL || req->key == NULL || req->key_len == 0)
        return FK_EINVAL;
    struct slot *s = take_slot(c);
    if (s == NULL)
        return FK_EFULL;
    s->cookie = req->cookie;
    s->req = req;
    s->tries = 0;
    int rc = FK_EINVAL;
    switch (req->kind) {
    case YCSB_REQ_READ:
        return launch(c, s, SLOT_READ, NULL, 0);
    case YCSB_REQ_SCAN:
        if ((rc = prepare_scan(s)) == 0)
            return launch(c, s, SLOT_SCAN, NULL, 0);
        break;
    case YCSB_REQ_UPDATE:
        if (req->nfields != c->conf.fieldcount)
            return launch(c, s, SLOT_RMW_GET, NULL, 0);
        /* every field written: a put, as an insert */
        __attribute__((fallthrough));
    case YCSB_REQ_INSERT: {
        int64_t n = ycsb_record_encode(c->rec, c->rec_cap, c->conf.fieldnameprefix,
                                       (int32_t)c->conf.fieldcount, req->fields, req->nfields);
        if (n >= 0)
            return launch(c, s, SLOT_PUT, c->rec, (size_t)n);
        rc = (int)n;
        break;
    }
    }
    release_slot(c, s);
    return rc;
}

/* ---- completions --------------------------------------------------------------- */

/* Checks that val (len bytes) is a record of this workload holding the field
 * req names (if any). */
static int check_value(const struct ctx *c, const struct ycsb_req *req, const uint8_t *val,
                       size_t len, struct ycsb_record_view *v)
{
    if (len > c->rec_cap || ycsb_record_parse(val, len, v) < 0)
        return FK_EMALFORMED;
    if (req->read_field != NULL &&
        ycsb_record_field_index(c->conf.fieldnameprefix, req->read_field, v->nfields) < 0)
        return FK_EMALFORMED;
    return 0;
}

/* A partial update read its record: CAS the merged record in, with the old
 * value as the expected one. Returns 1 (the slot goes on) or the update's
 * result. */
static int rmw_cas(struct ctx *c, struct slot *s, const struct flowkv_done *d)
{
    struct ycsb_record_view v;
    int rc = check_value(c, s->req, d->data, d->len, &v);
    if (rc < 0)
        return rc;
    int64_t n = ycsb_record_merge(c->rec, c->rec_cap, v.rec, v.len, c->conf.fieldnameprefix,
                                  s->req->fields, s->req->nfields);
    if (n < 0)
        return (int)n;
    s->stage = SLOT_RMW_CAS;
    s->tries++;
    /* d->data lives until the next flowkv_poll; flowkv_submit copies it. */
    rc = send_op(c, s, c->rec, (size_t)n, d->data, d->len);
    return rc < 0 ? rc : 1;
}

/* A scan piece came back: checks its records, then starts the next piece
 * after its last key when more are wanted and the key space may go on.
 * Returns 1 (the slot goes on) or the scan's result. */
static int scan_piece(struct ctx *c, struct slot *s, const struct flowkv_done *d)
{
    if (d->len > FLOWKV_RESULT_MAX)
        return FK_EMALFORMED;
    struct flowkv_result piece = {.status = 0, .len = d->len, .data = d->data};
    size_t off = 0, klen = 0, vlen;
    const uint8_t *key = NULL, *val;
    int32_t n = 0, rc;
    while ((rc = flowkv_scan_next(&piece, &off, &key, &klen, &val, &vlen)) == 1) {
        struct ycsb_record_view v;
        if (klen > FLOWKV_KEY_MAX || check_value(c, s->req, val, vlen, &v) < 0)
            return FK_EMALFORMED;
        n++;
    }
    if (rc < 0 || n > s->scan_left)
        return FK_EMALFORMED;
    int32_t asked = s->scan_left < FLOWKV_SCAN_MAX ? s->scan_left : FLOWKV_SCAN_MAX;
    s->scan_got += n;
    s->scan_left -= n;
    /* The key space goes on when the piece was full, in pairs or bytes;
     * the next piece starts after the last key (FLOWKV_SCAN_AFTER). */
    int more = n > 0 && (n == asked || PAIR_MAX(c->rec_cap) > FLOWKV_SCAN_PAGE ||
                         d->len > FLOWKV_SCAN_PAGE - PAIR_MAX(c->rec_cap));
    if (s->scan_left > 0 && more) {
        memcpy(s->next_key, key, klen);
        s->next_len = klen;
        s->next_flags = FLOWKV_SCAN_AFTER;
        rc = send_op(c, s, NULL, 0, NULL, 0);
        return rc < 0 ? rc : 1;
    }
    return s->scan_got > 0 ? 0 : FK_ENOTFOUND;
}

/* The result of one flowkv completion for slot s, or 1 when the slot
 * started its next operation. */
static int on_done(struct ctx *c, struct slot *s, const struct flowkv_done *d)
{
    struct ycsb_record_view v;
    switch (s->stage) {
    case SLOT_READ:
        return d->status < 0 ? d->status : check_value(c, s->req, d->data, d->len, &v);
    case SLOT_PUT:
        return d->status;
    case SLOT_SCAN:
        if (d->status < 0)
            return d->status;
        return scan_piece(c, s, d);
    case SLOT_RMW_GET:
        return d->status < 0 ? d->status : rmw_cas(c, s, d);
    case SLOT_RMW_CAS:
        if (d->status != FK_ECASFAIL || s->tries >= c->update_tries)
            return d->status;
        s->stage = SLOT_RMW_GET; /* another writer came between: read again */
        int rc = send_op(c, s, NULL, 0, NULL, 0);
        return rc < 0 ? rc : 1;
    case SLOT_FREE:
        break;
    }
    assert(0 && "stage");
    return FK_EPROTO;
}

static int fkv_poll(void *ctx, struct ycsb_done *done, int max, int64_t timeout_ns)
{
    struct ctx *c = ctx;
    int64_t deadline = (int64_t)fk_now_ns() + (timeout_ns > 0 ? timeout_ns : 0);
    int want = max < c->nslots ? max : c->nslots;
    for (;;) {
        int64_t left = deadline - (int64_t)fk_now_ns();
        uint64_t wait = left > 0 ? (uint64_t)left : 0;
        int got = c->nkv == 1 ? flowkv_poll(c->kv, c->fdone, want, wait)
                              : flowkv_poll_set(c->kvs, (uint32_t)c->nkv, c->fdone, want, wait);
        if (got < 0)
            return got;
        int n = 0;
        for (int i = 0; i < got; i++) {
            uint64_t tag = c->fdone[i].tag;
            if (tag >= (uint64_t)c->nslots || c->slots[tag].stage == SLOT_FREE)
                return FK_EPROTO; /* libflowkv returned a tag we never gave */
            struct slot *s = &c->slots[tag];
            int rc = on_done(c, s, &c->fdone[i]);
            if (rc == 1)
                continue; /* the slot's next flowkv operation is under way */
            done[n++] = (struct ycsb_done){.cookie = s->cookie, .rc = rc > 0 ? 0 : rc};
            c->inflight--;
            release_slot(c, s);
        }
        if (n > 0 || c->inflight == 0 || (int64_t)fk_now_ns() >= deadline)
            return n;
    }
}

const struct ycsb_binding ycsb_flowkv_binding = {
    .name = "flowkv",
    .open = fkv_open,
    .close = fkv_close,
    .submit = fkv_submit,
    .poll = fkv_poll,
};
