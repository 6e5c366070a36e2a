/* srv_backup.c: backup and restore of a replica's state; see srv_backup.h. */
#include "srv_backup.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fkc_proto.h"
#include "kv_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(CONS_SM_BACKUP_SLOT < CONS_SNAP_OPEN_MAX && CONS_SM_BACKUP_SLOT != CONS_SM_SAVE_SLOT,
               "the backup view has its own slot");
_Static_assert(FKC_SNAP_CHUNK_MAX <= FK_SNAPFILE_FRAME_MAX, "a chunk is one frame of the file");

int srv_backup_init(struct srv_backup *b, struct cons_sm sm, uint32_t id, uint8_t protocol)
{
    *b = (struct srv_backup){.sm = sm, .id = id, .protocol = protocol};
    b->out = malloc(sizeof(struct fkc_snap_reply) + FKC_SNAP_CHUNK_MAX);
    return b->out == NULL ? FK_ENOMEM : 0;
}

static void close_view(struct srv_backup *b)
{
    if (b->open)
        b->sm.ops->snap_close(b->sm.impl, CONS_SM_BACKUP_SLOT);
    b->open = 0;
}

void srv_backup_free(struct srv_backup *b)
{
    if (b->sm.ops != NULL)
        close_view(b);
    free(b->out);
    b->out = NULL;
}

void srv_backup_tick(struct srv_backup *b, uint64_t now)
{
    if (b->open && now - b->last_ns > FKC_SNAP_IDLE_NS) {
        fk_info("backup", "closing the backup view at index %llu: idle for %llu s",
                (unsigned long long)b->index, (unsigned long long)(FKC_SNAP_IDLE_NS / 1000000000));
        close_view(b);
    }
}

static int on_open(struct srv_backup *b, const struct fkc_snap_req *q,
                   const struct cons_core_status *st, uint64_t now)
{
    if (q->nonce == 0)
        return FK_EINVAL;
    if (b->open && b->nonce != q->nonce && now - b->last_ns <= FKC_SNAP_IDLE_NS)
        return FK_EBUSY; /* another client's backup is being read */
    if (st->role == CONS_ROLE_RECOVERING || st->role == CONS_ROLE_VIEW_CHANGE)
        return FK_EAGAIN;
    close_view(b);
    int rc = b->sm.ops->snap_open(b->sm.impl, CONS_SM_BACKUP_SLOT, &b->index);
    if (rc < 0)
        return rc;
    b->open = 1;
    if (b->index < q->min_index) { /* not applied that far yet: ask again */
        close_view(b);
        return FK_EAGAIN;
    }
    b->held = b->index > st->commit;
    b->nonce = q->nonce;
    b->term = st->term;
    b->last_ns = now;
    b->next = 0;
    b->cur_len = b->prev_len = 0;
    fk_info("backup", "backup view opened at index %llu%s", (unsigned long long)b->index,
            b->held ? " (held until committed)" : "");
    return 0;
}

/* A held view is served once the commit point passed it in the term it
 * was opened in; a term change first drops it (srv_backup.h). */
static int release(struct srv_backup *b, const struct cons_core_status *st)
{
    if (!b->held)
        return 0;
    if (st->term != b->term) {
        close_view(b);
        return FK_ECLOSED;
    }
    if (b->index > st->commit)
        return FK_EAGAIN;
    b->held = 0;
    return 0;
}

static int on_read(struct srv_backup *b, const struct fkc_snap_req *q,
                   const struct cons_core_status *st, uint64_t now, size_t *clen, uint8_t *last)
{
    if (!b->open || q->nonce != b->nonce)
        return FK_ECLOSED;
    b->last_ns = now;
    int rc = release(b, st);
    if (rc < 0)
        return rc;
    uint8_t *chunk = b->out + sizeof(struct fkc_snap_reply);
    size_t tlen;
    if (q->seq == b->next) { /* the next chunk: the cursor moves on */
        memcpy(b->prev, b->cur, b->cur_len);
        b->prev_len = b->cur_len;
        rc = b->sm.ops->snap_read(b->sm.impl, CONS_SM_BACKUP_SLOT, b->cur, &b->cur_len, chunk,
                                  FKC_SNAP_CHUNK_MAX, FKC_SNAP_WANT, clen);
        if (rc >= 0)
            b->next++;
    } else if (q->seq + 1 == b->next) { /* its reply was lost: the same bytes again */
        memcpy(b->tmp, b->prev, b->prev_len);
        tlen = b->prev_len;
        rc = b->sm.ops->snap_read(b->sm.impl, CONS_SM_BACKUP_SLOT, b->tmp, &tlen, chunk,
                                  FKC_SNAP_CHUNK_MAX, FKC_SNAP_WANT, clen);
    } else {
        return FK_EINVAL;
    }
    if (rc < 0) {
        fk_warn("backup", "reading the backup view failed: %s", fk_strerror(rc));
        close_view(b);
        return rc;
    }
    *last = rc == 1;
    b->served_chunks++;
    b->served_bytes += *clen;
    return 0;
}

void srv_backup_on_request(struct srv_backup *b, const uint8_t *req, size_t len,
                           const struct cons_core_status *st, uint64_t now, const uint8_t **reply,
                           size_t *rlen)
{
    struct fkc_snap_req q = {0};
    struct fkc_snap_reply r = {.protocol = b->protocol, .replica = b->id};
    size_t clen = 0;
    int rc = FK_EINVAL;
    if (len == sizeof q) {
        memcpy(&q, req, sizeof q);
        r.op = q.op;
        r.seq = q.seq;
        r.nonce = q.nonce;
        if (q.op == FKC_SNAP_OPEN)
            rc = on_open(b, &q, st, now);
        else if (q.op == FKC_SNAP_READ)
            rc = on_read(b, &q, st, now, &clen, &r.last);
        else if (q.op == FKC_SNAP_CLOSE)
            rc = 0;
        if (q.op == FKC_SNAP_CLOSE && b->open && b->nonce == q.nonce)
            close_view(b);
    }
    r.status = rc;
    r.index = b->index;
    if (rc < 0)
        clen = 0;
    memcpy(b->out, &r, sizeof r);
    *reply = b->out;
    *rlen = sizeof r + clen;
}

/* ---- restore ---------------------------------------------------------------- */

/* The chunk as the new cluster takes it (srv_backup.h): HEAD with mark 0,
 * no SESSION, END counting no sessions; PAIR records as they are. */
static int filter(const uint8_t *in, size_t len, uint8_t *out, size_t *olen, uint64_t *pairs,
                  uint64_t *dropped)
{
    size_t off = 0;
    struct cons_snap_rec r;
    int rc;
    *olen = 0;
    while ((rc = cons_snap_next(in, len, &off, &r)) == 1) {
        if (r.tag == CONS_SNAP_SESSION) {
            (*dropped)++;
            continue;
        }
        memcpy(out + *olen, r.at, r.len);
        if (r.tag == CONS_SNAP_HEAD)
            memset(out + *olen + 1, 0, 16); /* applied 0, clock 0 */
        if (r.tag == CONS_SNAP_END)
            memset(out + *olen + 1, 0, 8); /* no sessions */
        if (r.tag == CONS_SNAP_PAIR)
            (*pairs)++;
        *olen += r.len;
    }
    return rc;
}

/* Pass 1: the whole file's framing and checksum, before anything changes. */
static int verify(int fd, struct fk_snapfile_info *info, char *err, size_t errcap)
{
    struct fk_snapfile_r r;
    const uint8_t *buf;
    size_t len;
    int rc = fk_snapfile_open(&r, fd, info);
    if (rc == 0)
        while ((rc = fk_snapfile_next(&r, &buf, &len, info)) == 1)
            ;
    if (rc < 0)
        snprintf(err, errcap, "%s", *fk_snapfile_why(&r) ? fk_snapfile_why(&r) : fk_strerror(rc));
    fk_snapfile_close(&r);
    return rc;
}

/* Pass 2: the pairs through the install stream, a write transaction per
 * 64 frames (about 4 MiB), committed live at the end (cons.h: atomic). */
static int install(struct kv_store *store, struct cons_sm sm, int fd, struct srv_backup_restored *o,
                   char *err, size_t errcap)
{
    struct fk_snapfile_r r;
    struct fk_snapfile_info info;
    const uint8_t *buf;
    size_t len, olen;
    uint8_t *out = malloc(FK_SNAPFILE_FRAME_MAX);
    int rc = out == NULL ? FK_ENOMEM : fk_snapfile_open(&r, fd, &info);
    if (rc < 0) {
        free(out);
        snprintf(err, errcap, "%s", fk_strerror(rc));
        return rc;
    }
    rc = kv_write_begin(store);
    if (rc == 0)
        rc = sm.ops->install_begin(sm.impl);
    for (uint64_t n = 0; rc == 0 && (rc = fk_snapfile_next(&r, &buf, &len, &info)) == 1; n++) {
        rc = filter(buf, len, out, &olen, &o->pairs, &o->sessions_dropped);
        if (rc == 0 && olen > 0)
            rc = sm.ops->install_chunk(sm.impl, out, olen);
        if (rc == 0 && n % 64 == 63) {
            rc = kv_write_commit(store);
            if (rc == 0)
                rc = kv_write_begin(store);
        }
    }
    if (rc == 0)
        rc = sm.ops->install_commit(sm.impl);
    if (rc == 0)
        rc = kv_write_commit(store);
    if (rc < 0) {
        sm.ops->install_abort(sm.impl);
        kv_write_abort(store);
        snprintf(err, errcap, "%s%s",
                 rc == FK_EFULL ? "the snapshot holds more than this cluster's quota: "
                                : "installing it failed: ",
                 *fk_snapfile_why(&r) ? fk_snapfile_why(&r) : fk_strerror(rc));
    }
    fk_snapfile_close(&r);
    free(out);
    return rc;
}

int srv_backup_restore(struct kv_store *store, struct cons_sm sm, const char *path,
                       struct srv_backup_restored *out, char *err, size_t errcap)
{
    char why[256] = "";
    *out = (struct srv_backup_restored){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errcap, "cannot open the snapshot %s: %s", path, strerror(e));
        return -e;
    }
    int rc = verify(fd, &out->file, why, sizeof why);
    if (rc == 0 && lseek(fd, 0, SEEK_SET) != 0)
        rc = -errno;
    if (rc == 0)
        rc = install(store, sm, fd, out, why, sizeof why);
    close(fd);
    if (rc < 0)
        snprintf(err, errcap, "cannot restore from %s: %s", path, why[0] ? why : fk_strerror(rc));
    return rc;
}
