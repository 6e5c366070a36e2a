/*
 * kv_sm.h: the key-value state machine on LMDB, flowkv-server's
 * implementation of struct cons_sm (consensus/cons.h).
 *
 * LMDB is the replicated state (DESIGN.md, "Storage and state transfer").
 * The machine keeps all of it in the store (kv_store.h), in the write
 * transaction of the batch whose entries it applies:
 *   data    (live set)  the key-value pairs
 *   clients (live set)  the client table's rows: u64 client id (the key,
 *                       MDB_INTEGERKEY) -> u64 req_no, u64 stamp, i32
 *                       status, little-endian (KV_SM_ROW_LEN bytes), the
 *                       layout of a SESSION record after its id
 *   meta "sm.mark"      u64 applied, u64 clock (absent: 0, 0)
 *   meta "sm.bytes"     u64: the bytes the quota counts (below)
 * So what is on disk is always the state at its mark: a checkpoint is the
 * mark, a restart reads it back with `load` and replays the log after it.
 *
 * It answers exactly as the simulator's in-memory machine (consensus/kv.h):
 * the same operations, replies, scan order (memcmp, then length), the
 * same stream for the same state, byte for byte (cons.h, "The stream"),
 * so histories checked in simulation mean the same thing here.
 *
 * Sending (snap_open, snap_read, snap_close): a view is a kv_store view
 * (an LMDB read transaction in a preallocated slot) of the committed
 * state; the mark it reports and the HEAD it streams are read inside the
 * same transaction, so they always agree with its records. It does not
 * see the open write transaction: a view opened in mid-batch shows the
 * state at the last commit, with that commit's mark. Views survive any
 * number of later commits and installs (MVCC) and pin the pages they show
 * until closed. The cursor (opaque to the cores, at most
 * CONS_SNAP_CURSOR_MAX bytes) is a phase byte and the last record sent:
 *   (empty)                   the stream's start: HEAD next
 *   KV_SM_CUR_SESSIONS        no session sent yet
 *   KV_SM_CUR_SESSIONS u64 id sessions after client id (native order)
 *   KV_SM_CUR_PAIRS           no pair sent yet
 *   KV_SM_CUR_PAIRS key       pairs after key (1..CONS_KEY_MAX bytes)
 *   KV_SM_CUR_DONE            END sent; reading on is FK_EINVAL
 * A position names a record, not an offset, so reading again from an old
 * cursor of the same view gives the same bytes and the same next cursor.
 *
 * Receiving (install_*): the stream is written into kv_store's staging
 * set, record by record (each validated first: HEAD first and once, known
 * tags, client ids strictly increasing and nonzero with req_no > 0, keys
 * strictly increasing with 1..CONS_KEY_MAX bytes, values of at most
 * CONS_VAL_MAX, nothing after END, no record split across chunks), and
 * install_commit switches it live with its mark and byte count in the
 * open write transaction. Chunks may come in different write transactions
 * (each batch commits); what must survive between them lives in struct
 * kv_sm_install, no allocation. Any error ends the install (stage NONE)
 * and leaves the live state untouched; what was staged stays on disk
 * until the next install_begin empties it, and a store that dies before
 * the commit reopens with its old live state and mark. Staging beside the
 * live state means the map holds two states during an install: size it
 * above 2 x quota_bytes plus the log window.
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
 * would hold after the write, the quota); a stream that would pass it is
 * refused by install_chunk with FK_EFULL. Sessions are not counted: the
 * client table is bounded by its capacity (CONS_CLIENTS_MAX rows). If
 * LMDB still reports a full map or a disk error, the ops return FK_EFULL
 * or FK_ESTORAGE, which the contract treats as a failure that stops the
 * replica (never a divergent reply).
 *
 * Transactions: apply's mutations, session, mark, install_begin,
 * install_chunk and install_commit need the store's write transaction open
 * (the server opens one per batch of protocol steps and commits it with
 * the log entries they persist), else FK_EINVAL. GET, SCAN and load work
 * inside it (seeing its writes) or outside it; views never see it. A write
 * transaction aborted after an install call undoes that call's staging:
 * the next chunk or commit notices (kv_write_aborts) and answers FK_EINVAL,
 * and the install must begin again.
 *
 * Allocation: none in apply, session, mark, snap_read and install_chunk
 * once the store is warm (kv_store.h, "Allocation"); a view slot allocates
 * its LMDB transaction at its first snap_open only.
 *
 * Thread safety: the store's owner thread only.
 */
#ifndef KV_SM_H
#define KV_SM_H

#include "cons.h"
#include "kv_store.h"

#define KV_SM_QUOTA_DEFAULT (256ULL << 20)
#define KV_SM_PAIR_BYTES    6 /* the u16 key and u32 value lengths of a stream's PAIR */

/* Sizes of the stream's fixed records (cons.h) and of a clients row. */
#define KV_SM_HEAD_LEN             (1 + 8 + 8)
#define KV_SM_SESSION_LEN          (1 + 8 + 8 + 8 + 4)
#define KV_SM_END_LEN              (1 + 8 + 8)
#define KV_SM_ROW_LEN              (8 + 8 + 4)
#define KV_SM_PAIR_LEN(klen, vlen) (1 + 2 + (size_t)(klen) + 4 + (size_t)(vlen))

/* The cursor's phase byte (above). */
enum kv_sm_cursor_phase {
    KV_SM_CUR_SESSIONS = 1,
    KV_SM_CUR_PAIRS = 2,
    KV_SM_CUR_DONE = 3,
};

/* Where an install stands: one value per record kind it accepts next. */
enum kv_sm_stage {
    KV_SM_STAGE_NONE = 0, /* no install: chunk and commit are FK_EINVAL */
    KV_SM_STAGE_HEAD,     /* begun: HEAD next */
    KV_SM_STAGE_SESSIONS, /* SESSION, PAIR or END next */
    KV_SM_STAGE_PAIRS,    /* PAIR or END next */
    KV_SM_STAGE_END,      /* END seen: commit next */
};

/* The install in progress, kept between chunks (and write transactions). */
struct kv_sm_install {
    uint8_t stage;            /* enum kv_sm_stage */
    uint16_t last_klen;       /* 0: no pair staged yet */
    uint64_t aborts;          /* kv_write_aborts at install_begin */
    uint64_t applied, clock;  /* from HEAD */
    uint64_t sessions, pairs; /* records staged */
    uint64_t bytes;           /* the quota's count of the staged pairs */
    uint64_t last_client;     /* 0: no session staged yet (ids are nonzero) */
    uint8_t last_key[CONS_KEY_MAX];
};

struct kv_sm {
    struct kv_store *store;
    uint64_t quota_bytes; /* limit on stored key + value bytes */
    uint64_t bytes;       /* stored key + value bytes now (mirrors "sm.bytes") */
    struct kv_sm_install in;
};

/* Binds sm to an open store and reads its byte count. quota_bytes 0 means
 * KV_SM_QUOTA_DEFAULT. Errors: FK_EINVAL, FK_ESTORAGE, FK_EMALFORMED (the
 * stored count is corrupt). Call with no install in progress elsewhere:
 * sm starts with none. */
int kv_sm_init(struct kv_sm *sm, struct kv_store *store, uint64_t quota_bytes);

/* The cons_sm view; valid while sm lives. Besides cons.h's contract:
 * session refuses client id 0 (FK_EINVAL: 0 marks an empty slot in the
 * client table); load and snap_read return FK_EMALFORMED for a stored row
 * or mark of the wrong size; snap_read returns FK_EINVAL for cap below
 * CONS_SNAP_RECORD_MAX; install_chunk refuses an empty chunk and a session
 * with client id 0 (FK_EMALFORMED) and more than CONS_CLIENTS_MAX sessions
 * (FK_EFULL). */
struct cons_sm kv_sm_cons(struct kv_sm *sm);

#endif /* KV_SM_H */
