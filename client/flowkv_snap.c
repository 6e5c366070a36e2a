/* flowkv_snap.c: flowkv_snapshot_save (flowkv.h), a backup file
 * (common/fk_snapfile.h) pulled from one replica (fkc_proto.h, FKC_SNAP). */
#include "flowkv_snap.h"

#include "cons_wire.h" /* enum cons_proto */
#include "fk_error.h"
#include "fk_snapfile.h"
#include "fk_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* A held view (srv_backup.h) or a replica in a view change answers
 * FK_EAGAIN: asked again this often, for as long as the timeout. A view
 * dropped before its first chunk (a term change) is opened again at most
 * SNAP_REOPENS times. */
#define SNAP_AGAIN_NS (20ULL * 1000000ULL)
#define SNAP_REOPENS  3

struct save {
    flowkv *kv;
    uint32_t id;
    uint64_t timeout_ns, nonce, min_index;
    uint8_t *buf;
    size_t len;
    struct fkc_snap_reply rep;
    char why[128];
};

/* One request, asked again while the replica answers FK_EAGAIN: the
 * request's error, else the reply's status. */
static int ask(struct save *s, uint8_t op, uint32_t seq)
{
    struct fkc_snap_req q = {.op = op, .seq = seq, .nonce = s->nonce, .min_index = s->min_index};
    uint64_t deadline = fk_now_ns() + s->timeout_ns;
    for (;;) {
        int rc = flowkv__snap_call(s->kv, s->id, &q, &s->rep, s->buf, FKC_SNAP_CHUNK_MAX, &s->len,
                                   s->timeout_ns);
        if (rc < 0) {
            snprintf(s->why, sizeof s->why, "replica %u did not answer", s->id);
            return rc;
        }
        if (s->rep.status != FK_EAGAIN || fk_now_ns() >= deadline)
            break;
        struct timespec ts = {0, (long)SNAP_AGAIN_NS};
        nanosleep(&ts, NULL);
    }
    if (s->rep.status == FK_EAGAIN)
        snprintf(s->why, sizeof s->why,
                 "replica %u is recovering or changing view, has not applied index %llu yet, or "
                 "its view stays above its commit point",
                 s->id, (unsigned long long)s->min_index);
    else if (s->rep.status == FK_EBUSY)
        snprintf(s->why, sizeof s->why, "replica %u is sending another backup", s->id);
    else if (s->rep.status < 0)
        snprintf(s->why, sizeof s->why, "replica %u refused the backup", s->id);
    return s->rep.status;
}

/* Opens a view and reads its first chunk: a view dropped before it (a
 * term change while held) is opened again. */
static int first_chunk(struct save *s)
{
    int rc = FK_ECLOSED;
    for (int i = 0; i < SNAP_REOPENS && rc == FK_ECLOSED; i++) {
        while (getrandom(&s->nonce, sizeof s->nonce, 0) != sizeof s->nonce || s->nonce == 0)
            ;
        rc = ask(s, FKC_SNAP_OPEN, 0);
        if (rc == 0)
            rc = ask(s, FKC_SNAP_READ, 0);
    }
    return rc;
}

static int stream(struct save *s, int fd, struct flowkv_snapshot_info *info)
{
    int rc = first_chunk(s);
    if (rc < 0)
        return rc;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct fk_snapfile_info fi = {.replica = s->rep.replica,
                                  .index = s->rep.index,
                                  .created_ns =
                                      (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec,
                                  .protocol = s->rep.protocol};
    struct fk_snapfile_w w;
    rc = fk_snapfile_begin(&w, fd, &fi);
    for (uint32_t seq = 1; rc == 0; seq++) {
        rc = fk_snapfile_add(&w, s->buf, s->len);
        if (rc < 0 || s->rep.last)
            break;
        info->chunks++;
        rc = ask(s, FKC_SNAP_READ, seq);
        if (rc == FK_ECLOSED)
            snprintf(s->why, sizeof s->why,
                     "replica %u closed the backup view (it restarted, or this client stalled)",
                     s->id);
    }
    if (rc < 0 && s->why[0] == '\0') /* ask names its own failures */
        snprintf(s->why, sizeof s->why, "cannot write the file");
    if (rc < 0) {
        fk_snapfile_discard(&w);
        return rc;
    }
    info->chunks++;
    rc = fk_snapfile_finish(&w, &fi);
    if (rc < 0) {
        snprintf(s->why, sizeof s->why, "cannot write the file");
        return rc;
    }
    info->replica = fi.replica;
    snprintf(info->protocol, sizeof info->protocol, "%s",
             fi.protocol == CONS_PROTO_MPX ? "multipaxos" : "nopaxos");
    info->index = fi.index;
    info->bytes = fi.bytes;
    info->checksum = fi.checksum;
    return 0;
}

int flowkv_snapshot_save(flowkv *kv, uint32_t id, int fd, struct flowkv_snapshot_info *info,
                         uint64_t timeout_ns)
{
    if (kv == NULL || info == NULL || fd < 0 || id >= flowkv_replicas(kv) || timeout_ns == 0)
        return FK_EINVAL;
    memset(info, 0, sizeof(*info));
    struct save s = {.kv = kv, .id = id, .timeout_ns = timeout_ns};
    /* Every write acknowledged before now is at or below the highest
     * commit point a replica reports: the view must reach it. */
    for (uint32_t i = 0; i < flowkv_replicas(kv); i++) {
        struct flowkv_replica_status st;
        if (flowkv_status(kv, i, &st, timeout_ns < 1000000000ULL ? timeout_ns : 1000000000ULL) ==
                0 &&
            st.reachable && st.commit > s.min_index)
            s.min_index = st.commit;
    }
    s.buf = malloc(FKC_SNAP_CHUNK_MAX);
    if (s.buf == NULL)
        return FK_ENOMEM;
    int rc = stream(&s, fd, info);
    if (s.nonce != 0) { /* frees the replica's view now rather than when idle */
        struct fkc_snap_req q = {.op = FKC_SNAP_CLOSE, .nonce = s.nonce};
        struct fkc_snap_reply rep;
        size_t len;
        flowkv__snap_call(kv, id, &q, &rep, s.buf, FKC_SNAP_CHUNK_MAX, &len,
                          timeout_ns < 1000000000ULL ? timeout_ns : 1000000000ULL);
    }
    free(s.buf);
    flowkv__set_detail(kv, rc < 0 ? s.why : "");
    return rc;
}
