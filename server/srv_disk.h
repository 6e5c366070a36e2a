/*
 * srv_disk.h: the persistence driver between a protocol core (mpx_, nop_)
 * and the replica's LMDB store (kv_store.h). It writes the core's persist
 * items (cons.h, "Durability contract") into the store's open write
 * transaction, tells the server which cookie a successful commit made
 * durable, and brings a restarted replica's core back from the store.
 *
 * Records (all in the store's environment):
 *   meta "cons.meta"       the core's META record, bytes as emitted
 *   meta "cons.snap"       the core's SNAPSHOT record, bytes as emitted
 *                          (Multi-Paxos: where its log starts; NOPaxos: its
 *                          checkpoint, the whole state)
 *   meta "cons.snap_index" u64 little-endian: the index of that record
 *   meta "cons.proto"      u8 enum cons_proto that wrote this disk
 *   log  index             the core's ENTRY record for that index, as is
 * kv_store has no delete for meta records, so a zero-length "cons.meta" or
 * "cons.snap" means "none" (what srv_disk_wipe writes).
 *
 * The state machine's own records (kv_sm.h: pairs, client rows, the mark)
 * are written by the machine in the same transactions as these, so the
 * disk always holds the machine's state at its mark beside the log that
 * leads past it (consensus/cons.h). A restart keeps the machine as it is:
 * restore hands the core META, the SNAPSHOT record (where its log starts)
 * and the log; the core reads the mark and the rows back (NOPaxos also its
 * undo stash, to roll a leader's machine back to its committed prefix)
 * and keeps only the entries after the mark. Restart time is the log
 * window and the client table, not the data (`make bench-capacity`
 * measures it against a 1,000-record replica).
 * A disk without META (a first start, or a replica that lost its disk)
 * holds no complete state: srv_disk_open wipes the cons records and
 * empties the machine for either core.
 *
 * The server's event loop, one batch of steps per write transaction:
 *
 *   startup (no transaction open):
 *     kv_store_open; kv_sm_init; srv_disk_open(&d, store, proto, sm);
 *     cons_core_create(&core, cons_core_ops_of(proto), cfg, sm);
 *     kv_write_begin(store);
 *     srv_disk_restore(d, &core, &restored);
 *     mode = restored ? RESTORED : (new group ? FRESH : EMPTY);
 *     core.ops->start(core.impl, mode, now, &ob);  srv_disk_persist(d, ob->persists,..);
 *     srv_disk_commit(d, &durable);  feed CONS_IN_PERSISTED(durable) if > 0
 *   every batch:
 *     kv_write_begin(store);
 *     for each input: core.ops->step (kv_sm applies inside this
 *       transaction); srv_disk_persist(d, ob->persists, ob->npersists);
 *       send ob's messages (a core never emits a message whose promise
 *       waits for durability, so sending before the commit is safe);
 *     srv_disk_commit(d, &durable);     one LMDB commit for the batch
 *     feed CONS_IN_PERSISTED with durable when it grew.
 *
 * Failure rule. If a persist or a commit fails (FK_EFULL: the LMDB map is
 * full; FK_ESTORAGE: an I/O error), the items of that transaction are not
 * durable and never will be: LMDB dropped the whole transaction, including
 * the state machine's writes the core made in it, so the core's memory is
 * now ahead of its disk and it waits for cookies that cannot come. The
 * replica must therefore stop: srv_disk poisons itself (every later call
 * returns FK_EPOISONED, srv_disk_durable never grows again), and the server
 * must not report any cookie beyond srv_disk_durable, log one clear line
 * (the error and srv_disk_durable), stop answering, and exit nonzero so a
 * supervisor restarts it from its last durable state. That is safe:
 * Multi-Paxos acknowledges nothing before CONS_IN_PERSISTED covers it, so
 * no acknowledged write depends on the lost items; NOPaxos acknowledges
 * without waiting for its disk and always recovers from the other replicas
 * after a restart (nop.h). srv_disk keeps no copy of failed items:
 * re-persisting them would not bring back the lost state machine writes.
 * A full map is a configuration error, not a runtime condition: kv_sm's
 * replicated quota (kv_sm.h) keeps the data within quota_bytes on every
 * replica alike, so size map_size for twice the quota (an install stages
 * a whole state beside the live one), the pages an open transfer view
 * keeps, and the log window (srv_node.h SRV_MAP_NEED, which flowkv-server
 * enforces) and it never fills; a replica that still fills it restarts,
 * fails again, and says why each time while the others serve.
 *
 * Durability means "committed by LMDB": fsync'ed in FK_DURABLE_SYNC mode,
 * in the page cache in FK_DURABLE_ASYNC mode (kv_store.h explains what a
 * machine crash may then lose).
 *
 * Thread safety: a srv_disk belongs to the store's owner thread.
 */
#ifndef SRV_DISK_H
#define SRV_DISK_H

#include "cons.h"
#include "cons_core.h"
#include "cons_wire.h"
#include "kv_store.h"

#include <stdint.h>

#define SRV_DISK_META_KEY       "cons.meta"
#define SRV_DISK_SNAP_KEY       "cons.snap"
#define SRV_DISK_SNAP_INDEX_KEY "cons.snap_index"
#define SRV_DISK_PROTO_KEY      "cons.proto"

struct srv_disk;

struct srv_disk_stats {
    uint64_t records;  /* persist items written (committed or not) */
    uint64_t bytes;    /* record bytes written */
    uint64_t commits;  /* successful srv_disk_commit calls that held items */
    uint64_t durable;  /* highest durable cookie (srv_disk_durable) */
    uint64_t restored; /* entries handed to the core by the last restore */
    int poisoned;      /* 1 after a failed persist, commit or abort with items */
};

/* Opens the driver for an open store (borrowed; it must outlive d) and the
 * state machine sm that the core will be created with (borrowed likewise).
 * Runs its own write transaction, so none may be open: it checks that the
 * disk was written by `proto` (CONS_PROTO_MPX or CONS_PROTO_NOP), and
 * when the disk holds no META record wipes the cons records (a disk
 * without META holds no complete state: the core starts FRESH or EMPTY);
 * it empties the state machine then, and always for a core that rebuilds
 * it (see above). Call it before creating
 * the core. Errors: FK_EINVAL (bad arguments), FK_ENOMEM, FK_ECONFIG (the
 * disk holds another protocol's state), FK_EBUSY (a write transaction is
 * open), FK_EMALFORMED (a cons record is corrupt), FK_EFULL / FK_ESTORAGE
 * (the store; nothing changed). */
int srv_disk_open(struct srv_disk **out, struct kv_store *store, enum cons_proto proto,
                  struct cons_sm sm);
/* Frees d; the store is not touched (an open transaction stays open).
 * Safe on NULL. */
void srv_disk_close(struct srv_disk *d);

/* Restores a just-created core (before its start) from the disk:
 * META, then the SNAPSHOT if any, then every log ENTRY above the snapshot
 * index in index order. Must run inside the caller's open write
 * transaction (installing the snapshot, and NOPaxos's start, write the
 * data database); start the core and persist its outbox in the same
 * transaction. *restored = 1 when a META record existed (start with
 * CONS_START_RESTORED), 0 when not (start FRESH for a
 * brand-new group, else EMPTY). Persist cookies restart at 1 with every
 * core, so one srv_disk serves one core incarnation: a process that
 * replaces a started core closes d and opens a new one. A restored NOPaxos
 * replica still runs recovery, which needs f+1 others in normal status: a
 * whole NOPaxos group restarted from disk holds its committed prefix but
 * cannot serve by itself (nop.h); Multi-Paxos groups can. Errors:
 * FK_EINVAL (no write transaction open, a core of another protocol than
 * the disk's, or the core refused a record as misuse), FK_EPOISONED, FK_EMALFORMED (a record the
 * core rejected, or a log reaching beyond any log window above the snapshot), FK_EFULL (a snapshot
 * over the core's capacity), FK_ENOMEM, FK_ESTORAGE. After an error: kv_write_abort, destroy the
 * core, create a new one, and inside a new transaction call srv_disk_wipe and start it EMPTY (safe:
 * both protocols recover a replica that lost its disk), or exit. */
int srv_disk_restore(struct srv_disk *d, const struct cons_core *core, int *restored);

/* Discards every cons record (META, snapshot, log) and empties the state
 * machine, inside the caller's open write transaction. FK_EINVAL without one; store errors as
 * kv_store.h (they poison d, see the failure rule). */
int srv_disk_wipe(struct srv_disk *d);

/* Writes n persist items (an outbox's persists/npersists; bytes copied,
 * the caller keeps them) into the open write transaction: META replaces
 * "cons.meta", ENTRY replaces log `index`, SNAPSHOT replaces "cons.snap"
 * and "cons.snap_index" and deletes log entries <= index. Cookies must be
 * strictly increasing across calls since srv_disk_open (checked before
 * anything is written: FK_EINVAL, nothing written, d not poisoned). n = 0
 * is a no-op. Errors: FK_EINVAL (no open transaction, bad item or
 * cookie), FK_EPOISONED, FK_EFULL / FK_ESTORAGE: the store aborted the
 * transaction and d is poisoned (failure rule above: stop the replica). */
int srv_disk_persist(struct srv_disk *d, const struct cons_persist *items, uint32_t n);

/* Commits the store's write transaction (use it instead of
 * kv_write_commit) and sets *durable to the highest cookie durable on disk
 * now: feed CONS_IN_PERSISTED with it when it grew. Errors: FK_EINVAL (no
 * transaction open), FK_EPOISONED (d was poisoned: the transaction is
 * aborted, nothing more becomes durable), FK_EFULL / FK_ESTORAGE (the
 * commit failed: d is poisoned; *durable keeps the last durable cookie).
 * *durable is set in every case. */
int srv_disk_commit(struct srv_disk *d, uint64_t *durable);

/* Aborts the store's write transaction (instead of kv_write_abort). If it
 * held persist items, they are lost and d is poisoned (returns
 * FK_EPOISONED: stop the replica); otherwise returns 0. */
int srv_disk_abort(struct srv_disk *d);

/* The highest cookie made durable (0 before the first commit of items). */
uint64_t srv_disk_durable(const struct srv_disk *d);

void srv_disk_stats(const struct srv_disk *d, struct srv_disk_stats *st);

#endif /* SRV_DISK_H */
