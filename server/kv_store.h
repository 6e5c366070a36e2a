/*
 * kv_store.h: a replica's persistent state in one LMDB environment.
 *
 * One environment per replica (DESIGN.md, server/), with four named
 * databases:
 *   log     uint64 index -> log entry bytes (MDB_INTEGERKEY)
 *   data    key bytes    -> value bytes     (the key-value state, ordered)
 *   meta    name         -> bytes           (view, ballot, commit point, session)
 *   clients uint64 id    -> client-table record (MDB_INTEGERKEY)
 *
 * Writes are grouped: kv_write_begin() opens the single write transaction,
 * any number of put/del/trim calls join it, and kv_write_commit() makes all
 * of them durable at once, which is how log appends are batched into one
 * LMDB commit. Reads see the open write transaction if there is one (so a
 * protocol core reads its own writes), else a snapshot taken by a read
 * transaction that is reset and renewed, never reallocated.
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

struct kv_store;

struct kv_store_opts {
    const char *dir;               /* created if missing (one level, mode 0750) */
    uint64_t map_size;             /* bytes; 0 = KV_STORE_MAP_DEFAULT */
    enum fk_durability durability; /* see above */
};

/* Opens or creates the environment in opts->dir. On success *out owns it
 * until kv_store_close(). Errors: FK_EINVAL, -errno (directory), FK_ESTORAGE
 * (LMDB refused: e.g. a file that is not an LMDB environment). */
int kv_store_open(const struct kv_store_opts *opts, struct kv_store **out);

/* Aborts an open write transaction (uncommitted writes are dropped), flushes
 * to disk, and closes. Safe on NULL. */
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

/* The calls below need an open write transaction (else FK_EINVAL). A failure
 * other than FK_ENOTFOUND aborts the whole transaction: the caller must not
 * commit and may begin again. Buffers are copied; the caller keeps them. */
int kv_log_put(struct kv_store *s, uint64_t index, const void *entry, size_t len);
/* Deletes every log entry with index < below (log compaction). */
int kv_log_trim(struct kv_store *s, uint64_t below);
/* Deletes every log entry with index >= from (a new leader's log wins). */
int kv_log_truncate(struct kv_store *s, uint64_t from);
int kv_meta_put(struct kv_store *s, const char *name, const void *val, size_t len);
int kv_data_put(struct kv_store *s, const void *key, size_t klen, const void *val, size_t vlen);
/* FK_ENOTFOUND when absent (the transaction stays open and usable). */
int kv_data_del(struct kv_store *s, const void *key, size_t klen);
/* Removes every key-value pair (before installing a snapshot). */
int kv_data_clear(struct kv_store *s);
int kv_client_put(struct kv_store *s, uint64_t client_id, const void *rec, size_t len);
int kv_client_clear(struct kv_store *s);

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

/* Visits up to max pairs with key >= start in key order (memcmp order,
 * shorter first on a common prefix). start may be NULL (from the first key).
 * Returns the number visited, or an error. */
int kv_data_scan(struct kv_store *s, const void *start, size_t slen, uint32_t max, kv_visit_fn fn,
                 void *arg);
/* Visits every client record (key is the 8-byte native client id). */
int kv_client_scan(struct kv_store *s, kv_visit_fn fn, void *arg);

struct kv_store_stats {
    uint64_t data_entries, log_entries, client_entries;
    uint64_t map_size, map_used; /* bytes */
};
int kv_store_stats(struct kv_store *s, struct kv_store_stats *st);

#endif /* KV_STORE_H */
