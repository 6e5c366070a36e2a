/*
 * srv_backup.h: backup and restore of a replica's state (`flowkv snapshot
 * save FILE`, `flowkv-server --restore FILE`; DESIGN.md, "Storage and
 * state transfer": backup is the state-transfer stream into a file).
 *
 * Serving a backup (srv_backup_on_request): a client pulls the state
 * stream (cons.h, "The stream") of one view a chunk per request
 * (fkc_proto.h, FKC_SNAP). The view is the state machine's view slot
 * CONS_SM_BACKUP_SLOT (server: an LMDB read transaction), so the replica
 * keeps serving while it is read and memory is one chunk. Consistency is
 * that of a state transfer (cons_xfer.h, held views): a view shows the
 * machine at its mark, and a NOPaxos leader executes ahead of its commit
 * point, so a view above the commit point is held (READ answers
 * FK_EAGAIN) until the commit point passes it within the same term, and
 * dropped (FK_ECLOSED: the client opens another) when the term changed
 * first: entries past the commit point may have been replaced by the view
 * change (NOPaxos section 5.3). A Multi-Paxos machine applies chosen
 * entries only, so its views are within the commit point at once. A
 * replica that is recovering or changing view answers OPEN with FK_EAGAIN.
 *
 * Restoring (srv_backup_restore): seeds the state machine of a replica
 * that holds no state from a backup file (fk_snapfile.h), for the first
 * start of a new cluster (every replica of it restored from the same
 * file, as etcd's `snapshot restore` seeds every member): the file is
 * checked whole first (framing, checksum), then its pairs are installed
 * through the machine's install stream (cons_sm_ops.install_*; kv_sm.h:
 * the quota applies), atomically. The new cluster is not the old one:
 * its log starts at 1, so the mark is reset to 0, and the client table's
 * sessions are left out (the old cluster's clients are not its clients).
 * The file may come from a cluster of either protocol.
 *
 * Thread safety: the store's owner thread (the replica's loop).
 */
#ifndef SRV_BACKUP_H
#define SRV_BACKUP_H

#include "cons.h"
#include "cons_core.h"
#include "fk_snapfile.h"

#include <stddef.h>
#include <stdint.h>

struct srv_backup {
    struct cons_sm sm;
    uint32_t id;
    uint8_t protocol; /* enum cons_proto */
    uint8_t open;     /* a view is open in CONS_SM_BACKUP_SLOT */
    uint8_t held;     /* its index was above the commit point at OPEN */
    uint64_t nonce, index, term, last_ns;
    uint32_t next; /* the chunk the next new READ gives */
    uint8_t cur[CONS_SNAP_CURSOR_MAX], prev[CONS_SNAP_CURSOR_MAX], tmp[CONS_SNAP_CURSOR_MAX];
    size_t cur_len, prev_len;
    uint8_t *out; /* a reply: struct fkc_snap_reply, then a chunk */
    uint64_t served_chunks, served_bytes;
};

/* Sets b up over sm (borrowed). FK_ENOMEM (the reply buffer, about 1.1
 * MiB, allocated once). */
int srv_backup_init(struct srv_backup *b, struct cons_sm sm, uint32_t id, uint8_t protocol);
/* Closes the view and frees. Safe on a zeroed b. */
void srv_backup_free(struct srv_backup *b);

/* Answers one request body (struct fkc_snap_req; anything else is answered
 * FK_EINVAL) given the core's status now. *reply points into b, valid
 * until the next call, *rlen bytes (struct fkc_snap_reply and the chunk).
 * Never fails: errors travel in the reply's status. */
void srv_backup_on_request(struct srv_backup *b, const uint8_t *req, size_t len,
                           const struct cons_core_status *st, uint64_t now, const uint8_t **reply,
                           size_t *rlen);
/* Closes a view nobody read for FKC_SNAP_IDLE_NS (it pins LMDB pages). */
void srv_backup_tick(struct srv_backup *b, uint64_t now);

/* What a restore installed. */
struct srv_backup_restored {
    struct fk_snapfile_info file;
    uint64_t pairs, sessions_dropped;
};

/* Installs the backup at path into sm, whose write transactions are
 * store's (kv_store.h; none open at the call). The caller checked that
 * the replica holds no state. Errors, with a one-line reason in err:
 * -errno (the file), FK_EMALFORMED (a damaged or foreign file: nothing
 * was installed), FK_EFULL (more than the quota), storage errors. */
struct kv_store;
int srv_backup_restore(struct kv_store *store, struct cons_sm sm, const char *path,
                       struct srv_backup_restored *out, char *err, size_t errcap);

#endif /* SRV_BACKUP_H */
