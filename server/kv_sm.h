/*
 * kv_sm.h: the key-value state machine on LMDB, flowkv-server's
 * implementation of struct cons_sm (consensus/cons.h).
 *
 * It answers exactly as the simulator's in-memory machine (consensus/kv.h):
 * the same operations, replies, scan order (memcmp, then length) and
 * snapshot layout (u32 count, then u16 klen, key, u16 vlen, value in key
 * order), so histories checked in simulation mean the same thing here.
 *
 * Determinism under a full disk: every replica must give the same reply to
 * the same operation, but LMDB's MDB_MAP_FULL depends on a replica's file
 * layout. So the state machine enforces a replicated quota instead: the
 * bytes it stores, counted as each pair's key and value plus
 * KV_SM_PAIR_BYTES (what a pair costs in a snapshot besides its bytes, so
 * that a snapshot never exceeds the quota + 4: counting key and value
 * bytes alone, a 1 MiB quota of 3-byte keys with empty values made a
 * 2.4 MB snapshot, over the cores' snapshot_max, which stopped the group),
 * kept in the meta database under "sm.bytes" and written in the same
 * transaction as the data, may not exceed quota_bytes, a cluster-wide
 * setting. A PUT or CAS that would pass it is answered FK_EQUOTA on every
 * replica alike, with "N of M bytes" as the reply's data (what the store
 * would hold after the write, the quota). The LMDB map must be larger than
 * the quota plus the log window; if LMDB still reports a full map or a disk
 * error, apply returns FK_EFULL or FK_ESTORAGE, which the contract treats as
 * a failure that stops the replica (never a divergent reply).
 *
 * Transactions: mutations need the store's write transaction open (the
 * server opens one per batch of protocol steps and commits it with the log
 * entries they persist). GET and SCAN work inside or outside it.
 *
 * Thread safety: the store's owner thread only.
 */
#ifndef KV_SM_H
#define KV_SM_H

#include "cons.h"
#include "kv_store.h"

struct kv_sm {
    struct kv_store *store;
    uint64_t quota_bytes; /* limit on stored key + value bytes */
    uint64_t bytes;       /* stored key + value bytes now (mirrors "sm.bytes") */
};

/* Binds sm to an open store and reads its byte count. quota_bytes 0 means
 * KV_SM_QUOTA_DEFAULT. Errors: FK_EINVAL, FK_ESTORAGE, FK_EMALFORMED (the
 * stored count is corrupt). */
#define KV_SM_QUOTA_DEFAULT (256ULL << 20)
#define KV_SM_PAIR_BYTES    4 /* the u16 key and value lengths of a snapshot pair */
int kv_sm_init(struct kv_sm *sm, struct kv_store *store, uint64_t quota_bytes);

/* The cons_sm view; valid while sm lives. */
struct cons_sm kv_sm_cons(struct kv_sm *sm);

#endif /* KV_SM_H */
