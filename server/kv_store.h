/*
 * kv_store.h: a replica's persistent state in one LMDB environment.
 *
 * LMDB is the replicated state (DESIGN.md, "Storage and state transfer"):
 * the key-value pairs and the client table live here, written by the
 * state machine (kv_sm.h) in the same write transaction as the log entries
 * whose operations it applies. One environment per replica, with these
 * named databases:
 *   log       uint64 index -> log entry bytes (MDB_INTEGERKEY)
 *   meta      name         -> bytes           (view, ballot, marks, ...)
 *   data      key bytes    -> value bytes     set 0: the key-value state
 *   clients   uint64 id    -> client-table row (MDB_INTEGERKEY)  set 0
 *   data.1, clients.1                         set 1, the same layout
 *
 * Two sets of (data, clients). One is live: every kv_data_* and
 * kv_client_* call, scan and statistic works on it. The other is the
 * staging set, where a state received by state transfer is written
 * (kv_stage_*) beside the live one and then made live in one step,
 * inside a write transaction (kv_stage_switch): a store that dies before
 * that commit reopens with its old live set, never a half-written one.
 * meta KV_STORE_LIVE_KEY (one byte, absent = 0) says which set is live;
 * an environment written before set 1 existed opens with set 0 live.
 *
 * Writes are grouped: kv_write_begin() opens the single write transaction,
 * any number of put/del/trim calls join it, and kv_write_commit() makes all
 * of them durable at once, which is how log appends are batched into one
 * LMDB commit. Reads see the open write transaction if there is one (so a
 * protocol core reads its own writes), else a snapshot taken by a read
 * transaction that is reset and renewed, never reallocated.
 *
 * Views (kv_view_*): up to KV_STORE_VIEWS_MAX read transactions kept open
 * in preallocated slots, each a consistent picture of the committed state
 * at its open (LMDB MVCC: write transactions keep committing meanwhile,
 * and a staging switch does not disturb a view of the old live set). A
 * view does not see the open write transaction. Kept open, a view pins the
 * pages of its picture: the file grows with what is rewritten meanwhile,
 * so close views once their reader is done.
 *
 * Durability (kv_store_opts.durability):
 *   FK_DURABLE_SYNC   commit returns after fsync: durable before the replica
 *                     acknowledges anything that depends on it.
 *   FK_DURABLE_ASYNC  MDB_NOSYNC | MDB_WRITEMAP: commit returns once the
 *                     writes are in the page cache (a writable map: no
 *                     page copies). A killed process loses nothing. After a
 *                     machine crash the file may be torn (lmdb.h), so the
 *                     store keeps a mark (KV_STORE_MARK, the boot id) while
 *                     it is open unsynced; opened in a later boot with the
 *                     mark still there, it is discarded (logged) and opens
 *                     empty: the replica recovers from the others, as after
 *                     a lost disk. Replication is the safety net: a machine
 *                     crash that takes a majority of the replicas loses the
 *                     group. kv_store_sync() flushes explicitly; a clean
 *                     kv_store_close() syncs and removes the mark.
 *
 * Errors: FK_EFULL when the map is full (the write transaction is aborted;
 * everything committed before is intact and the store stays usable; raise
 * map_size), FK_ENOTFOUND for a missing record, FK_ETOOBIG when a caller
 * buffer is too small (*len then holds the size needed), FK_EINVAL for bad
 * arguments or calls in the wrong state, FK_ESTORAGE (logged with LMDB's
 * message) for anything else LMDB reports, -errno for the directory.
 *
 * Allocation: none per call once warm. Scans reuse cursors (one per
 * database for the kept read transaction, renewed; one per database and
 * write transaction, opened by its first scan); a view slot allocates its
 * transaction and cursors at its first use and renews them afterwards.
 *
 * Thread safety: a store belongs to the thread that opened it (the
 * replica's event loop). No function may be called from another thread.
 */
#ifndef KV_STORE_H
#define KV_STORE_H

#include "fk_conf.h"

#include <stddef.h>
#include <stdint.h>

/* Default map size: the most the data file may grow to (sparse until used). */
#define KV_STORE_MAP_DEFAULT (1ULL << 30)
/* The async-mode boot mark in the store's directory (above), and the
 * longest directory path plus a file name. */
#define KV_STORE_MARK     "async.boot"
#define KV_STORE_PATH_MAX 4096
/* LMDB's compiled-in key limit (mdb_env_get_maxkeysize) is 511 bytes. */
#define KV_STORE_KEY_MAX 511
/* The meta record naming the live set (above), and the view slots. */
#define KV_STORE_LIVE_KEY  "sm.live"
#define KV_STORE_VIEWS_MAX 9

struct kv_store;

struct kv_store_opts {
    const char *dir;               /* created if missing (one level, mode 0750) */
    uint64_t map_size;             /* bytes; 0 = KV_STORE_MAP_DEFAULT */
    enum fk_durability durability; /* see above */
};

/* Opens or creates the environment in opts->dir. On success *out owns it
 * until kv_store_close(). Errors: FK_EINVAL, -errno (directory), FK_ESTORAGE
 * (LMDB refused: e.g. a file that is not an LMDB environment),
 * FK_EMALFORMED (KV_STORE_LIVE_KEY is neither absent, 0 nor 1). */
int kv_store_open(const struct kv_store_opts *opts, struct kv_store **out);

/* Aborts an open write transaction (uncommitted writes are dropped), closes
 * every view, flushes to disk, and closes. Safe on NULL. */
void kv_store_close(struct kv_store *s);

/* Flushes committed data to disk (useful in async mode). */
int kv_store_sync(struct kv_store *s);

/* --- writes: begin, any number of changes, then commit or abort -------- */

/* Opens the write transaction. FK_EBUSY if one is already open. */
int kv_write_begin(struct kv_store *s);
/* Commits every change since kv_write_begin. On FK_EFULL or FK_ESTORAGE the
 * transaction is gone and none of its changes happened. */
int kv_write_commit(struct kv_store *s);
/* Drops every change since kv_write_begin. No-op when none is open. */
void kv_write_abort(struct kv_store *s);
/* How many write transactions ended without committing (aborted, by the
 * caller or by a failed write, or a failed commit) since open. A caller
 * that spreads one piece of work over several transactions (an install,
 * chunk by chunk) compares it to tell that part of its work was undone. */
uint64_t kv_write_aborts(const struct kv_store *s);

/* The calls below need an open write transaction (else FK_EINVAL). A failure
 * other than FK_ENOTFOUND aborts the whole transaction: the caller must not
 * commit and may begin again. Buffers are copied; the caller keeps them. */
int kv_log_put(struct kv_store *s, uint64_t index, const void *entry, size_t len);
/* Deletes every log entry with index < below (log compaction). */
int kv_log_trim(struct kv_store *s, uint64_t below);
/* Deletes every log entry with index >= from (a new leader's log wins). */
int kv_log_truncate(struct kv_store *s, uint64_t from);
/* The undo database: a core's stash (consensus/cons.h, stash_*), u64
 * keys. put replaces; del removes keys in [lo, hi]; scan visits in key
 * order (kv_visit_fn's key is the u64). Write ones need the write
 * transaction. */
int kv_undo_put(struct kv_store *s, uint64_t key, const void *rec, size_t len);
int kv_undo_del(struct kv_store *s, uint64_t lo, uint64_t hi);

int kv_meta_put(struct kv_store *s, const char *name, const void *val, size_t len);
int kv_data_put(struct kv_store *s, const void *key, size_t klen, const void *val, size_t vlen);
/* FK_ENOTFOUND when absent (the transaction stays open and usable). */
int kv_data_del(struct kv_store *s, const void *key, size_t klen);
/* Removes every key-value pair of the live set (an install stages
 * instead, kv_stage_*). */
int kv_data_clear(struct kv_store *s);
int kv_client_put(struct kv_store *s, uint64_t client_id, const void *rec, size_t len);
/* FK_ENOTFOUND when absent (the transaction stays open and usable). */
int kv_client_del(struct kv_store *s, uint64_t client_id);
int kv_client_clear(struct kv_store *s);

/* --- staging: the other set of (data, clients), then one switch ---------
 * Each needs the open write transaction (else FK_EINVAL) and, like the
 * writes above, a failure aborts the whole transaction, except where
 * said. Nothing staged is visible to reads until the switch commits. */

/* Empties the staging set: what an earlier, unfinished staging left. */
int kv_stage_clear(struct kv_store *s);
/* Appends a pair (MDB_APPEND: a bulk load without page splits in the
 * middle): key must sort after every staged key (kv_data_scan's order),
 * else FK_EINVAL and the transaction stays usable. Key bounds as
 * kv_data_put. */
int kv_stage_data_put(struct kv_store *s, const void *key, size_t klen, const void *val,
                      size_t vlen);
/* Appends a client row: client_id above every staged one, else FK_EINVAL
 * and the transaction stays usable. */
int kv_stage_client_put(struct kv_store *s, uint64_t client_id, const void *rec, size_t len);
/* Makes the staging set live and empties the set that was (its pages are
 * freed for reuse once no view holds them), and rewrites
 * KV_STORE_LIVE_KEY, all in the open transaction: the switch happens when
 * it commits, and not at all if it aborts. Views already open keep
 * reading the set that was live at their open. */
int kv_stage_switch(struct kv_store *s);

/* --- reads: copy into caller buffers ------------------------------------ */

/* Each copies the record into buf (capacity cap) and sets *len. */
int kv_log_get(struct kv_store *s, uint64_t index, void *buf, size_t cap, size_t *len);
int kv_meta_get(struct kv_store *s, const char *name, void *buf, size_t cap, size_t *len);
int kv_data_get(struct kv_store *s, const void *key, size_t klen, void *buf, size_t cap,
                size_t *len);
int kv_client_get(struct kv_store *s, uint64_t client_id, void *buf, size_t cap, size_t *len);

/* Lowest and highest log index present; FK_ENOTFOUND when the log is empty. */
int kv_log_bounds(struct kv_store *s, uint64_t *first, uint64_t *last);

/* Visitor for scans: key/value point into LMDB's map and are valid only
 * during the call. Return 0 to continue, 1 to stop, < 0 to stop with that
 * error (returned by the scan). */
typedef int (*kv_visit_fn)(void *arg, const void *key, size_t klen, const void *val, size_t vlen);
/* The undo database's records in key order (kv_undo_put). */
int kv_undo_scan(struct kv_store *s, kv_visit_fn fn, void *arg);

/* Visits up to max pairs with key >= start in key order (memcmp order,
 * shorter first on a common prefix). start may be NULL (from the first key).
 * Returns the number visited, or an error. */
int kv_data_scan(struct kv_store *s, const void *start, size_t slen, uint32_t max, kv_visit_fn fn,
                 void *arg);
/* Visits every client record in numeric client id order (key is the
 * 8-byte native client id). */
int kv_client_scan(struct kv_store *s, kv_visit_fn fn, void *arg);

/* --- views: consistent read-only pictures of the committed state --------
 * slot is 0..KV_STORE_VIEWS_MAX-1. Calls on a slot that is not open, or
 * out of range, return FK_EINVAL. */

/* Opens view slot on the state committed now (an open one is closed
 * first). Its live set is the one live in that picture. Errors: FK_EINVAL,
 * FK_ESTORAGE (e.g. LMDB's reader table is full), FK_EMALFORMED (a corrupt
 * KV_STORE_LIVE_KEY). */
int kv_view_open(struct kv_store *s, uint32_t slot);
/* Ends the view's read transaction; no-op when not open. */
void kv_view_close(struct kv_store *s, uint32_t slot);
/* kv_meta_get, read in the view. */
int kv_view_meta_get(struct kv_store *s, uint32_t slot, const char *name, void *buf, size_t cap,
                     size_t *len);
/* The numbers of pairs and of client rows in the view's live set. */
int kv_view_counts(struct kv_store *s, uint32_t slot, uint64_t *pairs, uint64_t *clients);
/* Visit the view's pairs with key > after (from the first when after is
 * NULL, alen 0), or its client rows with id > *after (from the first when
 * after is NULL), in order, until fn returns nonzero or none is left.
 * Returns the number visited, or fn's negative return, or an error. The
 * key and value pointers are valid during the call only. */
int kv_view_data_scan(struct kv_store *s, uint32_t slot, const void *after, size_t alen,
                      kv_visit_fn fn, void *arg);
int kv_view_client_scan(struct kv_store *s, uint32_t slot, const uint64_t *after, kv_visit_fn fn,
                        void *arg);

/* Entries of the log and of the live set's databases, and the map. */
struct kv_store_stats {
    uint64_t data_entries, log_entries, client_entries;
    uint64_t map_size, map_used; /* bytes */
};
int kv_store_stats(struct kv_store *s, struct kv_store_stats *st);

#endif /* KV_STORE_H */
