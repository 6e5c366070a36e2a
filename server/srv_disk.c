/* srv_disk.c: a core's persist items into LMDB, and back; see srv_disk.h
 * for the records, the event loop and the failure rule. */
#include "srv_disk.h"

#include "fk_error.h"
#include "fk_log.h"

#include "fk_assert.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Restore reads each record into one scratch buffer, grown on demand (at
 * startup only, never while serving). 64 KiB holds any Multi-Paxos entry
 * (CONS_BATCH_MAX * CONS_WIRE_OP_MAX ~ 17 KiB) and a small snapshot. */
#define SRV_DISK_SCRATCH_INIT (64u << 10)

struct srv_disk {
    struct kv_store *store; /* borrowed */
    struct cons_sm sm;      /* borrowed */
    enum cons_proto proto;
    uint64_t last_cookie; /* highest cookie written since open */
    uint64_t pending;     /* highest cookie written in the open transaction; 0: none */
    uint64_t durable;     /* highest cookie committed */
    int poisoned;
    uint8_t *buf; /* restore scratch */
    size_t cap;
    struct srv_disk_stats st;
};

static const uint8_t srv_disk__none[1]; /* the bytes of a zero-length record */

static void poison(struct srv_disk *d, const char *what, int rc)
{
    if (!d->poisoned)
        fk_error("disk",
                 "%s failed: %s; items after cookie %" PRIu64
                 " are not durable, the replica must restart",
                 what, fk_strerror(rc), d->durable);
    d->poisoned = 1;
    d->pending = 0;
}

/* ---- records ------------------------------------------------------------- */

/* The length of meta record `name`: 0 when absent or empty (none). */
static int meta_len(struct srv_disk *d, const char *name, size_t *len)
{
    uint8_t probe;
    int rc = kv_meta_get(d->store, name, &probe, 0, len);
    if (rc == FK_ENOTFOUND) {
        *len = 0;
        return 0;
    }
    return rc == FK_ETOOBIG ? 0 : rc;
}

/* Reads meta record `name` (length known: len > 0) into the scratch. */
static int meta_read(struct srv_disk *d, const char *name, size_t len)
{
    if (len > d->cap) {
        uint8_t *b = realloc(d->buf, len);
        if (b == NULL)
            return FK_ENOMEM;
        d->buf = b;
        d->cap = len;
    }
    size_t got;
    int rc = kv_meta_get(d->store, name, d->buf, d->cap, &got);
    return rc < 0 ? rc : got == len ? 0 : FK_ESTORAGE;
}

/* Reads log entry `index` into the scratch, growing it when needed. */
static int log_read(struct srv_disk *d, uint64_t index, size_t *len)
{
    int rc = kv_log_get(d->store, index, d->buf, d->cap, len);
    if (rc != FK_ETOOBIG)
        return rc;
    uint8_t *b = realloc(d->buf, *len);
    if (b == NULL)
        return FK_ENOMEM;
    d->buf = b;
    d->cap = *len;
    return kv_log_get(d->store, index, d->buf, d->cap, len);
}

/* Every cons record gone; the open transaction holds the change. */
static int wipe_records(struct srv_disk *d)
{
    uint64_t zero = 0;
    int rc = kv_meta_put(d->store, SRV_DISK_META_KEY, srv_disk__none, 0);
    if (rc == 0)
        rc = kv_meta_put(d->store, SRV_DISK_SNAP_KEY, srv_disk__none, 0);
    if (rc == 0)
        rc = kv_meta_put(d->store, SRV_DISK_SNAP_INDEX_KEY, &zero, sizeof zero);
    if (rc == 0)
        rc = kv_log_truncate(d->store, 0);
    return rc;
}

/* ---- open and close ------------------------------------------------------- */

/* A disk with state must be this protocol's. *same = 1 when the record
 * already names it (nothing to write). */
static int check_proto(struct srv_disk *d, int has_meta, int *same)
{
    uint8_t p;
    size_t len;
    int rc = kv_meta_get(d->store, SRV_DISK_PROTO_KEY, &p, sizeof p, &len);
    *same = rc == 0 && len == 1 && p == (uint8_t)d->proto;
    if (rc == FK_ENOTFOUND || (rc == 0 && !has_meta))
        return 0;
    if (rc < 0 || len != 1)
        return rc == FK_ETOOBIG || rc == 0 ? FK_EMALFORMED : rc;
    if (p != (uint8_t)d->proto) {
        fk_error("disk", "the data directory holds protocol %u state, this replica runs %u", p,
                 (unsigned)d->proto);
        return FK_ECONFIG;
    }
    return 0;
}

/* Empties the state machine: the stream of an empty state (cons.h), HEAD
 * (applied 0, clock 0) and END (no sessions, no pairs). */
static int empty_sm(struct srv_disk *d)
{
    return cons_sm_empty(&d->sm);
}

/* The open's transaction: protocol check, wipe without META, and an empty
 * state machine where the disk holds no complete state. */
static int prepare(struct srv_disk *d)
{
    uint8_t proto = (uint8_t)d->proto;
    size_t mlen;
    int same = 0;
    int rc = meta_len(d, SRV_DISK_META_KEY, &mlen);
    if (rc == 0)
        rc = check_proto(d, mlen > 0, &same);
    if (rc == 0 && !same) /* a restart writes nothing before it restores */
        rc = kv_meta_put(d->store, SRV_DISK_PROTO_KEY, &proto, 1);
    if (rc == 0 && mlen == 0)
        rc = wipe_records(d);
    if (rc == 0 && mlen == 0)
        rc = empty_sm(d);
    if (rc == 0)
        return kv_write_commit(d->store);
    kv_write_abort(d->store);
    return rc;
}

int srv_disk_open(struct srv_disk **out, struct kv_store *store, enum cons_proto proto,
                  struct cons_sm sm)
{
    if (out == NULL || store == NULL || sm.ops == NULL ||
        (proto != CONS_PROTO_MPX && proto != CONS_PROTO_NOP))
        return FK_EINVAL;
    struct srv_disk *d = calloc(1, sizeof *d);
    uint8_t *buf = malloc(SRV_DISK_SCRATCH_INIT);
    if (d == NULL || buf == NULL) {
        free(d);
        free(buf);
        return FK_ENOMEM;
    }
    d->store = store;
    d->sm = sm;
    d->proto = proto;
    d->buf = buf;
    d->cap = SRV_DISK_SCRATCH_INIT;
    int rc = kv_write_begin(store);
    if (rc == 0)
        rc = prepare(d);
    if (rc < 0) {
        srv_disk_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

void srv_disk_close(struct srv_disk *d)
{
    if (d == NULL)
        return;
    free(d->buf);
    free(d);
}

/* ---- restore ------------------------------------------------------------- */

static int restore_snapshot(struct srv_disk *d, const struct cons_core *c, uint64_t *snap_index)
{
    size_t len, ilen;
    *snap_index = 0;
    int rc = meta_len(d, SRV_DISK_SNAP_KEY, &len);
    if (rc < 0 || len == 0)
        return rc;
    rc = kv_meta_get(d->store, SRV_DISK_SNAP_INDEX_KEY, snap_index, sizeof *snap_index, &ilen);
    if (rc < 0 || ilen != sizeof *snap_index)
        return rc == FK_ENOTFOUND || rc == FK_ETOOBIG || rc == 0 ? FK_EMALFORMED : rc;
    rc = meta_read(d, SRV_DISK_SNAP_KEY, len);
    return rc < 0 ? rc : c->ops->restore_snapshot(c->impl, d->buf, len);
}

/* Every log entry above the snapshot, in index order. A core's log never
 * reaches past its window above its snapshot, and no window is wider than
 * CONS_LOG_CAP_MAX, so that bounds the walk; holes (slots never accepted)
 * are skipped. */
static int restore_entries(struct srv_disk *d, const struct cons_core *c, uint64_t snap)
{
    uint64_t first, last;
    int rc = kv_log_bounds(d->store, &first, &last);
    if (rc == FK_ENOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    if (last > snap && last - snap > CONS_LOG_CAP_MAX) {
        fk_error("disk", "log entry %" PRIu64 " lies beyond any window above snapshot %" PRIu64,
                 last, snap);
        return FK_EMALFORMED;
    }
    for (uint64_t i = first > snap ? first : snap + 1; i <= last && rc == 0; i++) {
        size_t len;
        rc = log_read(d, i, &len);
        if (rc == FK_ENOTFOUND) {
            rc = 0;
            continue;
        }
        if (rc == 0)
            rc = c->ops->restore_entry(c->impl, d->buf, len);
        d->st.restored += rc == 0;
    }
    return rc;
}

static int restore(struct srv_disk *d, const struct cons_core *c, int *restored)
{
    if (d == NULL || c == NULL || c->impl == NULL || restored == NULL)
        return FK_EINVAL;
    *restored = 0;
    if (d->poisoned)
        return FK_EPOISONED;
    /* Installing the snapshot writes the data database: the caller's
     * transaction must be open. Opening one here means it was not. */
    if (kv_write_begin(d->store) == 0) {
        kv_write_abort(d->store);
        return FK_EINVAL;
    }
    d->st.restored = 0;
    size_t mlen;
    uint64_t snap;
    int rc = meta_len(d, SRV_DISK_META_KEY, &mlen);
    if (rc < 0 || mlen == 0)
        return rc; /* open wiped a disk without META */
    rc = meta_read(d, SRV_DISK_META_KEY, mlen);
    if (rc == 0)
        rc = c->ops->restore_meta(c->impl, d->buf, mlen);
    if (rc == 0)
        rc = restore_snapshot(d, c, &snap);
    if (rc == 0)
        rc = restore_entries(d, c, snap);
    if (rc < 0) {
        fk_error("disk", "restore failed: %s", fk_strerror(rc));
        return rc;
    }
    *restored = 1;
    fk_info("disk", "restored META, snapshot at %" PRIu64 ", %" PRIu64 " log entries", snap,
            d->st.restored);
    return 0;
}

int srv_disk_restore(struct srv_disk *d, const struct cons_core *core, int *restored)
{
    if (d != NULL && core != NULL && core->ops != NULL && d->proto != core->ops->proto)
        return FK_EINVAL;
    return restore(d, core, restored);
}

int srv_disk_wipe(struct srv_disk *d)
{
    if (d == NULL)
        return FK_EINVAL;
    if (d->poisoned)
        return FK_EPOISONED;
    int rc = wipe_records(d);
    if (rc == 0)
        rc = empty_sm(d); /* a replica that starts EMPTY holds no state */
    if (rc < 0 && rc != FK_EINVAL)
        poison(d, "wipe", rc);
    return rc;
}

/* ---- persisting ----------------------------------------------------------- */

static int check_items(const struct srv_disk *d, const struct cons_persist *items, uint32_t n)
{
    uint64_t prev = d->last_cookie;
    for (uint32_t k = 0; k < n; k++) {
        const struct cons_persist *p = &items[k];
        if (p->cookie <= prev || (p->buf == NULL && p->len > 0) || p->kind < CONS_PERSIST_META ||
            p->kind > CONS_PERSIST_SNAPSHOT)
            return FK_EINVAL;
        if (p->kind != CONS_PERSIST_META && (p->len == 0 || p->index == 0))
            return FK_EINVAL; /* a zero-length record would read as "none" */
        prev = p->cookie;
    }
    return 0;
}

static int write_item(struct srv_disk *d, const struct cons_persist *p)
{
    const uint8_t *b = p->len ? p->buf : srv_disk__none;
    int rc;
    switch (p->kind) {
    case CONS_PERSIST_META:
        return kv_meta_put(d->store, SRV_DISK_META_KEY, b, p->len);
    case CONS_PERSIST_ENTRY:
        return kv_log_put(d->store, p->index, b, p->len);
    default:
        FK_ASSERT(p->kind == CONS_PERSIST_SNAPSHOT);
        rc = kv_meta_put(d->store, SRV_DISK_SNAP_KEY, b, p->len);
        if (rc == 0)
            rc = kv_meta_put(d->store, SRV_DISK_SNAP_INDEX_KEY, &p->index, sizeof p->index);
        /* SNAPSHOT drops the entries it covers (cons.h). */
        if (rc == 0)
            rc = kv_log_trim(d->store, p->index == UINT64_MAX ? UINT64_MAX : p->index + 1);
        return rc;
    }
}

int srv_disk_persist(struct srv_disk *d, const struct cons_persist *items, uint32_t n)
{
    if (d == NULL || (items == NULL && n > 0))
        return FK_EINVAL;
    if (d->poisoned)
        return FK_EPOISONED;
    int rc = check_items(d, items, n);
    if (rc < 0)
        return rc;
    for (uint32_t k = 0; k < n; k++) {
        rc = write_item(d, &items[k]);
        if (rc == FK_EINVAL && d->pending == 0 && k == 0)
            return rc; /* no transaction open: nothing was written or lost */
        if (rc < 0) {
            poison(d, "persist", rc);
            return rc == FK_EINVAL ? FK_EPOISONED : rc;
        }
        d->last_cookie = d->pending = items[k].cookie;
        d->st.records++;
        d->st.bytes += items[k].len;
    }
    return 0;
}

int srv_disk_commit(struct srv_disk *d, uint64_t *durable)
{
    if (d == NULL || durable == NULL)
        return FK_EINVAL;
    *durable = d->durable;
    if (d->poisoned) {
        kv_write_abort(d->store);
        return FK_EPOISONED;
    }
    int rc = kv_write_commit(d->store);
    if (rc == FK_EINVAL && d->pending == 0)
        return rc; /* nothing open, nothing lost */
    if (rc < 0) {
        poison(d, "commit", rc);
        return rc == FK_EINVAL ? FK_EPOISONED : rc;
    }
    if (d->pending) {
        FK_ASSERT(d->pending > d->durable);
        d->durable = d->pending;
        d->pending = 0;
        d->st.commits++;
    }
    *durable = d->durable;
    return 0;
}

int srv_disk_abort(struct srv_disk *d)
{
    if (d == NULL)
        return FK_EINVAL;
    kv_write_abort(d->store);
    if (d->pending) {
        poison(d, "abort", FK_EPOISONED);
        return FK_EPOISONED;
    }
    return d->poisoned ? FK_EPOISONED : 0;
}

uint64_t srv_disk_durable(const struct srv_disk *d)
{
    return d ? d->durable : 0;
}

void srv_disk_stats(const struct srv_disk *d, struct srv_disk_stats *st)
{
    *st = d->st;
    st->durable = d->durable;
    st->poisoned = d->poisoned;
}
