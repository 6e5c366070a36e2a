/*
 * cons.h: the contract shared by flowkv's protocol cores (mpx_, nop_).
 *
 * A core is a pure state machine (STYLE.md point 1): it owns no socket,
 * clock, random source or allocator after create. Its driver (the simulator
 * in consensus/sim, later flowkv-server) feeds it inputs and drains an
 * outbox after every call:
 *
 *   input  = a message (bytes + source address), a tick (virtual or real
 *            time in ns) or a storage completion (a persist cookie);
 *   outbox = messages (bytes + destination: a replica or a client id) and
 *            persist requests (metadata, log entries, snapshots) each with a
 *            64-bit cookie.
 *
 * Operations are applied through the state machine interface (struct
 * cons_sm) that the driver hands to the core at create time; replies to
 * clients leave as messages in the outbox.
 *
 * Durability contract: a core never sends a message whose promise depends on
 * state that is not yet durable. It asks the driver to persist items with
 * increasing cookies; the driver makes them durable IN COOKIE ORDER and then
 * reports the highest durable cookie with a CONS_IN_PERSISTED input. Only
 * then does the core release the acknowledgements that depended on them. A
 * driver that crashes loses exactly the items it had not reported.
 *
 * Thread safety: a core handle belongs to one thread; nothing here locks.
 */
#ifndef CONS_H
#define CONS_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- documented limits -------------------------------------------------
 * Every bound in the cores is one of these, checked at compile time.
 * Keys and values are opaque bytes. */
#define CONS_KEY_MAX   511        /* bytes in a key: LMDB's default key limit */
#define CONS_VAL_MAX   (1u << 20) /* bytes in a value (and a CAS expected value): 1 MiB */
#define CONS_OP_INLINE 4096       /* key, value and expected bytes an op holds in itself */
#define CONS_SCAN_MAX  16         /* pairs one range scan may return */
#define CONS_SCAN_PAGE 8192       /* bytes of pairs after which a scan page stops */
/* Bytes of reply payload: a GET's value, or a scan page (pairs up to
 * CONS_SCAN_PAGE bytes, or one pair of a largest key and value). */
#define CONS_REPLY_MAX       (CONS_VAL_MAX + CONS_KEY_MAX + 6)
#define CONS_REPLICAS_MAX    7           /* replicas in a group (2f+1, f <= 3) */
#define CONS_BATCH_MAX       8           /* client operations in one log entry */
#define CONS_LOG_CAP_MAX     4096        /* log entries held in memory (the window), either core */
#define CONS_CLIENTS_MAX     (1u << 17)  /* clients in the client table (131,072) */
#define CONS_MSG_MAX         (32u << 20) /* bytes in one wire message */
#define CONS_OUT_MSGS_MAX    256         /* messages in one outbox */
#define CONS_OUT_PERSIST_MAX 256         /* persist requests in one outbox */

_Static_assert(CONS_REPLICAS_MAX % 2 == 1 && CONS_REPLICAS_MAX <= 64,
               "replica sets are 2f+1 and fit a 64-bit ack mask");
_Static_assert(CONS_KEY_MAX < 65536 && CONS_OP_INLINE >= CONS_KEY_MAX,
               "key lengths travel as u16; a key always fits inline");
_Static_assert(2ull * CONS_VAL_MAX + CONS_KEY_MAX < (1ull << 31), "op lengths fit an int");
_Static_assert(CONS_REPLY_MAX >= CONS_SCAN_PAGE, "a reply holds a scan page");
_Static_assert(CONS_BATCH_MAX >= 1 && CONS_BATCH_MAX < 256, "batch count travels as u8");
_Static_assert((CONS_LOG_CAP_MAX & (CONS_LOG_CAP_MAX - 1)) == 0, "log ring is a power of two");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "wire structs are memcpy'd; the wire format is little-endian");

/* ---- operations and replies -------------------------------------------- */
enum cons_op_type {
    CONS_OP_NOOP = 0, /* fills a log slot; changes nothing (gap agreement, phase 1) */
    CONS_OP_GET = 1,  /* reply: the value, or FK_ENOTFOUND */
    CONS_OP_PUT = 2,  /* reply: 0 */
    CONS_OP_DEL = 3,  /* reply: 0, or FK_ENOTFOUND */
    CONS_OP_CAS = 4,  /* val := new if current == exp; reply 0, FK_ECASFAIL, FK_ENOTFOUND */
    CONS_OP_SCAN = 5, /* up to scan_limit pairs from key (scan_flags), below exp if any */
    /* A change of the replica set (Multi-Paxos, mpx.h "Reconfiguration"):
     * the value is struct cons_config's CONS_CONFIG_BYTES, no key; the
     * core carries it out (cons_apply_core), never the state machine.
     * reply: 0; FK_EAGAIN, refused by the leader before the log (a change
     * under way, a new member not caught up yet): the same request number
     * may be sent again, with the same or other members; FK_EBUSY, refused
     * where the log applied it (another change came first: not the
     * current epoch); FK_EINVAL (an empty set or an id outside the
     * cluster); FK_ENOTSUP (a protocol without reconfiguration). */
    CONS_OP_CONFIG = 6,
    CONS_OP__COUNT
};

/* A configuration: the replicas that vote (a mask over ids 0..n-1; the
 * others are learners) from the epoch on. On the wire (CONS_OP_CONFIG's
 * value): u32 epoch, u64 members. */
struct cons_config {
    uint32_t epoch;
    uint64_t members;
};
#define CONS_CONFIG_BYTES 12
struct cons_op;
/* Encodes c into buf[CONS_CONFIG_BYTES]; decodes an op's value (FK_EMALFORMED
 * when it is not CONS_CONFIG_BYTES long). */
void cons_config_put(const struct cons_config *c, uint8_t *buf);
int cons_config_get(const struct cons_op *op, struct cons_config *c);

/* SCAN flags. A scan returns, in key order, up to scan_limit pairs whose
 * key is >= key (> key with CONS_SCAN_AFTER) and, when exp_len > 0, < exp
 * (the end key, exclusive): pairs while the page stays within
 * CONS_SCAN_PAGE bytes, and at least one (u16 klen, key, u32 vlen, value
 * each, struct cons_reply). A client pages
 * through a longer range by asking again AFTER the last key it got: the
 * successor of a key of CONS_KEY_MAX bytes would not be a valid key. */
enum cons_scan_flag {
    CONS_SCAN_AFTER = 1, /* the start key is exclusive (a continuation) */
};

/* One client operation, in memory. Its key, value and expected bytes lie
 * one after another (key, val, exp): in the op itself when they fit
 * CONS_OP_INLINE (a CAS of two YCSB default records does), else at `ext`, bytes the op
 * does not own (a decoded message, or a cons_big of whoever stores the op:
 * cons_op_store). So an op is a fixed-size value that logs keep in arrays
 * without reserving a megabyte per slot, and one whose bytes are inline
 * copies as bytes. On the wire only the used bytes travel (cons_wire.h).
 * Read the bytes through cons_op_key/val/exp, never inl directly. */
struct cons_op {
    uint64_t client_id; /* nonzero for client ops; 0 for NOOP */
    uint64_t req_no;    /* per client, increasing from 1 */
    uint8_t type;       /* enum cons_op_type */
    uint8_t scan_limit; /* SCAN: 1..CONS_SCAN_MAX */
    uint8_t scan_flags; /* SCAN: enum cons_scan_flag; 0 for other ops */
    uint8_t reserved;   /* 0: no byte of the head is padding (the cores hash it) */
    uint16_t key_len;
    uint16_t reserved2; /* 0 */
    uint32_t val_len, exp_len;
    const uint8_t *ext; /* NULL: the bytes are in inl */
    uint8_t inl[CONS_OP_INLINE];
};

/* The head: the fields that describe an op, hashed and compared as bytes. */
#define CONS_OP_HEAD offsetof(struct cons_op, ext)
_Static_assert(CONS_OP_HEAD == 32, "the head of an op has no padding: cores hash it as bytes");

static inline size_t cons_op_nbytes(const struct cons_op *op)
{
    return (size_t)op->key_len + op->val_len + op->exp_len;
}

static inline const uint8_t *cons_op_key(const struct cons_op *op)
{
    return op->ext ? op->ext : op->inl;
}

static inline const uint8_t *cons_op_val(const struct cons_op *op)
{
    return cons_op_key(op) + op->key_len;
}

static inline const uint8_t *cons_op_exp(const struct cons_op *op)
{
    return cons_op_val(op) + op->val_len;
}

/* Sets op's head fields to zero and its bytes to key, val and exp; when
 * they do not fit inline they stay where the caller has them (ext = big,
 * which must hold the three one after another: the caller's buffer). For
 * builders (clients, tests, the simulator). */
void cons_op_init(struct cons_op *op, uint8_t type, const void *key, uint32_t key_len,
                  const void *val, uint32_t val_len, const void *exp, uint32_t exp_len);

/* Copies an op whose bytes are inline (asserted): the head and the used
 * bytes, not the whole inline area. An op is ~2 KiB and a YCSB one uses
 * ~100 B: whole copies were three 2 KiB memcpys per request per NOPaxos
 * replica. */
static inline void cons_op_copy(struct cons_op *dst, const struct cons_op *src)
{
    assert(src->ext == NULL && cons_op_nbytes(src) <= CONS_OP_INLINE);
    memcpy(dst, src, CONS_OP_HEAD);
    dst->ext = NULL;
    memcpy(dst->inl, src->inl, cons_op_nbytes(src));
}

/* Storage for the bytes of an op that do not fit inline, owned by whoever
 * keeps the op (a log slot, a queue entry), reused from op to op and
 * given back as soon as it holds a small one. `pool` counts the bytes of
 * every cons_big of one holder against its budget: with values up to
 * CONS_VAL_MAX, a log of small ops must not reserve a megabyte a slot, and
 * a log of large ones must stop at a bound (the holder refuses or drops
 * what does not fit, as if it were lost). */
struct cons_bigpool {
    size_t held, max;
};

struct cons_big {
    uint8_t *p;
    uint32_t cap;
};

/* dst := src (src's bytes may be anywhere; dst's end inline or in *big).
 * Returns 0, or FK_EFULL when src needs more bytes than pool has left
 * (dst and *big unchanged), FK_ENOMEM. No allocation for an inline op, or
 * for a large one whose size the big already had. */
int cons_op_store(struct cons_op *dst, struct cons_big *big, struct cons_bigpool *pool,
                  const struct cons_op *src);
/* Gives big's bytes back (to pool's count and to the allocator). */
void cons_big_free(struct cons_big *big, struct cons_bigpool *pool);

/* The result of one operation. GET: data = value. SCAN: data = pairs, each
 * u16 key length, key, u32 value length, value (little-endian). data is
 * the holder's buffer of cap bytes (CONS_REPLY_MAX wherever an apply may
 * fill it): a megabyte that no struct carries inline. */
struct cons_reply {
    uint64_t client_id, req_no;
    int32_t status; /* 0 or a negative FK_E* code */
    uint32_t len;   /* bytes used in data */
    uint8_t *data;
    uint32_t cap;
};

/* Copies reply's fields and used bytes into dst's buffer (dst->cap >=
 * src->len, asserted). */
static inline void cons_reply_copy(struct cons_reply *dst, const struct cons_reply *src)
{
    assert(src->len <= dst->cap);
    dst->client_id = src->client_id;
    dst->req_no = src->req_no;
    dst->status = src->status;
    dst->len = src->len;
    if (src->len)
        memcpy(dst->data, src->data, src->len);
}

/* ---- the state machine the cores apply to ------------------------------
 * Deterministic: the same operations in the same order give the same
 * replies and the same state on every replica.
 *
 * The machine holds the whole replicated state (DESIGN.md, "Storage and
 * state transfer"): the key-value pairs, the client table's rows (kept
 * through `session` by cons_apply_once and cons_log_read) and a mark, the
 * log index every applied entry is at or below and the client table's
 * clock, set by the core after each entry it applies (`mark`). flowkv-
 * server's machine (kv_sm.h) writes all of it in the write transaction of
 * the batch whose entries it applies, so what is on disk is always the
 * state at its mark: a checkpoint is that mark, never a copy, and a
 * restart reads the mark and the rows back (`load`) and replays only the
 * log after it.
 *
 * State transfer reads and installs the state as a stream of records
 * (below), in chunks of a size the core picks, so neither side holds more
 * than a chunk whatever the data size. The sender reads a consistent view
 * taken at snap_open (flowkv-server: an LMDB read transaction; the machine
 * keeps applying meanwhile, MVCC) from an opaque cursor, so the chunk that
 * starts at a cursor can be read again (a lost chunk). The receiver stages
 * chunks beside its live state and switches at install_commit, atomically:
 * a receiver that crashes, or aborts, before the commit keeps its old
 * state whole and never serves a half-installed one. */

/* The stream: records, each a u8 tag and its fields (little-endian):
 *   HEAD    u64 applied, u64 clock                        the first record
 *   SESSION u64 client id, u64 req_no, u64 stamp, i32 status   in client id order
 *   PAIR    u16 klen, key, u32 vlen, value                in key order (kv_key_cmp)
 *   END     u64 sessions, u64 pairs                       the last record
 * The counts in END let the receiver refuse a stream that lost records.
 * Chunks split the stream only between records; a chunk holds at least
 * one record. */
enum cons_snap_tag {
    CONS_SNAP_HEAD = 1,
    CONS_SNAP_SESSION = 2,
    CONS_SNAP_PAIR = 3,
    CONS_SNAP_END = 4,
};

/* A client table row as the state machine keeps it. req_no 0 in a call to
 * `session` deletes the client's row (an eviction). */
struct cons_session {
    uint64_t client_id, req_no, stamp;
    int32_t status;
};

#define CONS_SNAP_CURSOR_MAX 528 /* bytes of a stream cursor: a phase and a key */
#define CONS_SNAP_OPEN_MAX   9   /* views one machine keeps open at once (slots 0..8) */
/* The largest record: a pair of the largest key and value. A chunk must
 * have room for it. */
#define CONS_SNAP_RECORD_MAX (1 + 2 + CONS_KEY_MAX + 4 + CONS_VAL_MAX)
_Static_assert(CONS_SNAP_CURSOR_MAX >= 1 + 2 + CONS_KEY_MAX, "a cursor holds a key");
/* Slots: 0..CONS_REPLICAS_MAX-1 a view per receiving peer (cons_xfer),
 * CONS_SM_BACKUP_SLOT the server's backup stream (`flowkv snapshot save`),
 * CONS_SM_SAVE_SLOT cons_sm_save's. */
#define CONS_SM_BACKUP_SLOT CONS_REPLICAS_MAX
_Static_assert(CONS_SNAP_OPEN_MAX == CONS_REPLICAS_MAX + 2, "a view per peer, a backup, a save");

typedef int (*cons_session_fn)(void *arg, const struct cons_session *s);
typedef int (*cons_stash_fn)(void *arg, uint64_t key, const uint8_t *buf, size_t len);

struct cons_sm_ops {
    /* Applies op (never NOOP) and fills reply->status, len, data. Returns 0,
     * or a negative code for a failure that must stop the replica (storage
     * broken); a rejected operation is a reply status, not an error. */
    int (*apply)(void *impl, const struct cons_op *op, struct cons_reply *reply);
    /* Sets a client table row (s->req_no > 0) or deletes it (0). */
    int (*session)(void *impl, const struct cons_session *s);
    /* Sets the mark: every entry <= applied is in the state; clock is the
     * client table's (cons_ctab.ops). */
    int (*mark)(void *impl, uint64_t applied, uint64_t clock);
    /* Reads the mark (0, 0 for an empty machine) and visits every row, in
     * client id order; a nonzero return of fn stops and is returned. */
    int (*load)(void *impl, uint64_t *applied, uint64_t *clock, cons_session_fn fn, void *arg);

    /* Sender. Opens view `slot` (0..CONS_SNAP_OPEN_MAX-1; an open one is
     * closed first) on the state as it is now; *applied = its mark. */
    int (*snap_open)(void *impl, uint32_t slot, uint64_t *applied);
    /* Reads the records of view slot that follow cursor (cursor_len 0: the
     * stream's start) into buf[0..cap): at least one, then more while the
     * chunk is under `want` bytes and the next record fits cap (cap >=
     * CONS_SNAP_RECORD_MAX; the simulator wants a few dozen bytes, so its
     * small states still travel in many chunks). Sets *len and replaces
     * cursor (CONS_SNAP_CURSOR_MAX bytes) with the position after them.
     * Returns 1 when the chunk ends the stream (END is in it), 0 when more
     * follows, FK_EINVAL for a slot not open or a bad cursor, storage
     * errors as apply. */
    int (*snap_read)(void *impl, uint32_t slot, uint8_t *cursor, size_t *cursor_len, uint8_t *buf,
                     size_t cap, size_t want, size_t *len);
    void (*snap_close)(void *impl, uint32_t slot); /* no-op when not open */

    /* Receiver. begin discards any staged stream and starts a new one;
     * chunk adds the next chunk's records; commit checks the stream is
     * whole (HEAD first, END's counts, keys and clients increasing) and
     * replaces the live state (pairs, rows, mark) with it in one step;
     * abort discards the staging. Errors: FK_EMALFORMED (a bad record,
     * out of order, or commit before END: the staging is discarded and
     * the live state untouched), FK_EFULL (more than the machine holds),
     * FK_EINVAL (chunk or commit without begin), storage errors. */
    int (*install_begin)(void *impl);
    int (*install_chunk)(void *impl, const uint8_t *buf, size_t len);
    int (*install_commit)(void *impl);
    void (*install_abort)(void *impl);

    /* The core's stash: records it keeps with the state, written in the
     * same transaction as the machine's changes and never part of the
     * stream (a NOPaxos leader's undo records for what it executed past
     * its commit point, so that a restart can roll its machine back to
     * the committed prefix, nop_undo.c). put replaces record `key`; drop
     * removes the records with keys in [lo, hi]; load visits them in key
     * order (a nonzero return of fn stops and is returned). An install
     * leaves the stash alone. Errors as apply. */
    int (*stash_put)(void *impl, uint64_t key, const uint8_t *buf, size_t len);
    int (*stash_drop)(void *impl, uint64_t lo, uint64_t hi);
    int (*stash_load)(void *impl, cons_stash_fn fn, void *arg);
};

struct cons_sm {
    const struct cons_sm_ops *ops;
    void *impl;
};

/* ---- addresses, inputs and the outbox ---------------------------------- */
/* OUM: the ordered unreliable multicast (NOPaxos section 4) delivering a
 * sequenced message or a drop notification; id is unused (0).
 * PEERS (outbox only): the same message to every other replica, which the
 * driver sends once on the sender's replicate flow (DFI Figure 3: the
 * leader's accepts reach the followers by one push); each copy may be
 * lost on its own, as on that flow. id is unused (0). */
enum cons_addr_kind {
    CONS_ADDR_REPLICA = 1,
    CONS_ADDR_CLIENT = 2,
    CONS_ADDR_OUM = 3,
    CONS_ADDR_PEERS = 4,
};

struct cons_addr {
    uint8_t kind; /* enum cons_addr_kind */
    uint64_t id;  /* replica index 0..n-1, or client id */
};

enum cons_in_kind {
    CONS_IN_MSG = 1,       /* buf/len from `from`; bytes are untrusted */
    CONS_IN_TICK = 2,      /* time passed; the core runs its timers */
    CONS_IN_PERSISTED = 3, /* every persist item with cookie <= cookie is durable */
};

struct cons_input {
    uint8_t kind; /* enum cons_in_kind */
    struct cons_addr from;
    const uint8_t *buf; /* CONS_IN_MSG: borrowed for the duration of the call */
    size_t len;
    uint64_t cookie; /* CONS_IN_PERSISTED */
};

enum cons_persist_kind {
    CONS_PERSIST_META = 1,     /* replace the protocol metadata record */
    CONS_PERSIST_ENTRY = 2,    /* write log record `index` (replace any old one): entry
                                  `index`, or a NOPaxos run of entries ending there */
    CONS_PERSIST_SNAPSHOT = 3, /* replace the snapshot; drop entries <= index */
};

struct cons_out_msg {
    struct cons_addr to;
    const uint8_t *buf; /* into the outbox arena */
    uint32_t len;
};

struct cons_persist {
    uint8_t kind; /* enum cons_persist_kind */
    uint64_t cookie;
    uint64_t index;     /* ENTRY, SNAPSHOT */
    const uint8_t *buf; /* opaque record bytes, into the outbox arena */
    uint32_t len;
};

/* Filled by every step; everything in it is valid until the next call on
 * the same core. The driver copies what it needs. Bounded: when the arena
 * or an array is full, further messages are dropped (counted in `dropped`),
 * which the protocols tolerate like network loss; a persist request that
 * does not fit poisons the core (FK_EPOISONED) since it cannot be dropped. */
struct cons_outbox {
    struct cons_out_msg msgs[CONS_OUT_MSGS_MAX];
    uint32_t nmsgs;
    struct cons_persist persists[CONS_OUT_PERSIST_MAX];
    uint32_t npersists;
    uint32_t dropped;
    uint8_t *arena; /* owned by the core, arena_cap bytes */
    size_t arena_cap, arena_used;
};

/* ---- client table (exactly-once, part of replicated state) -------------
 * One row per client: the latest applied request number and the outcome
 * of that request when it wrote (its status: a write's reply carries no
 * data). A request with req_no <= the row's is never applied again; the
 * equal one is answered from the row. A read keeps no result (status
 * FK_EUNKEPT): a retried read is read again where the retry lands in the
 * log, which linearizes it within the retry and changes nothing, so no
 * replica stores values or scan pages for sessions (Raft's client
 * sessions do the same for read-only queries, Ongaro's dissertation
 * section 6.3). Sized at create: cap rows (open addressing at load <= 1/2,
 * so 2*cap slots of a 32-byte row and two 16-byte keys: 64 bytes a slot,
 * and a 4-byte sort index per row: about 132 bytes a client;
 * CONS_CLIENTS_MAX = 17 MiB).
 *
 * Eviction (sessions expire, as in Raft's client sessions, Ongaro's
 * dissertation section 6.3): every CLI invocation is a new client, so a
 * table that only grew would refuse new clients forever. When a new client
 * arrives and the table is full, the least recently used row goes: the
 * smallest last-use stamp, ties (impossible with cons_apply_once, whose
 * stamps are unique) broken by the smaller client id. Stamps come from
 * replicated state only (t->ops counts the client operations applied, the
 * same on every replica, and travels in the snapshot), never from a clock
 * or from slot order, so the same sequence of applies leaves the same table
 * on every replica. Exactly-once therefore holds for the cap most recently
 * active clients: a client that stayed idle while cap others were active
 * loses its row. Its next request (req_no > 1, from an unknown client) is
 * answered FK_EEXPIRED and not applied, so nothing is ever applied twice.
 * For the client: this copy was not applied, but an earlier copy of the
 * same request (a resend, or a duplicate made by the network) may have
 * been before the row went, so the outcome is unknown, as after a timeout;
 * it reports that, or resends an idempotent operation under a new client
 * id (new clients start at req_no 1). Cost: the rows are also linked in
 * (stamp, client id) order, so the victim is the list's head and a row
 * touched with a new largest stamp moves to its tail: an evicting apply
 * costs about what an updating one does (test_cons_ctab prints both; a
 * scan of the key array for the smallest stamp took 1.2 ms at 131,072
 * rows). Only a stamp smaller than the largest (cons_ctab_put called
 * directly) walks the list back from the tail; load sorts once. */
struct cons_ctab_row {
    uint64_t client_id;  /* 0 = empty slot */
    uint64_t req_no;     /* the latest applied request */
    int32_t status;      /* its outcome: 0 or FK_E* of a write, FK_EUNKEPT for a read */
    uint32_t prev, next; /* slots of the neighbours in (stamp, id) order; CONS_CTAB_NIL */
};

#define CONS_CTAB_NIL UINT32_MAX

/* Bytes one row takes in a saved table (cons_ctab_save): stamp, client
 * id, request number, status; and the most a saved table of cap rows
 * takes. */
#define CONS_CTAB_ROW_WIRE      28
#define CONS_CTAB_SAVE_MAX(cap) (12 + (size_t)(cap)*CONS_CTAB_ROW_WIRE)

/* The probe array, parallel to rows: kept apart so probing reads 16 bytes
 * per slot instead of a whole row. */
struct cons_ctab_key {
    uint64_t client_id; /* 0 = empty slot */
    uint64_t used;      /* last-use stamp: t->ops when the row was last written */
};

struct cons_ctab {
    uint32_t slots, used, cap;
    uint64_t ops;          /* client operations applied: the clock of the stamps (replicated) */
    uint64_t evicted;      /* rows evicted by this replica (a local statistic, not saved) */
    uint64_t last_evicted; /* the client whose row the last put evicted (0: none) */
    struct cons_ctab_key *keys;
    struct cons_ctab_key *scratch; /* load builds the new key array here first */
    struct cons_ctab_row *rows;
    uint32_t head, tail; /* least and most recently used rows' slots; CONS_CTAB_NIL */
    uint32_t *order;     /* load: the occupied slots, sorted into list order */
};

/* Allocates a table for up to cap clients (1..CONS_CLIENTS_MAX). Returns 0,
 * FK_EINVAL or FK_ENOMEM. Call from the owner thread at setup. */
int cons_ctab_init(struct cons_ctab *t, uint32_t cap);
void cons_ctab_free(struct cons_ctab *t);
/* The row of client_id, or NULL. The pointer is valid until the next put or
 * load (eviction moves rows). */
struct cons_ctab_row *cons_ctab_find(struct cons_ctab *t, uint64_t client_id);
/* Records request req_no of client_id and its outcome (status: 0, a
 * negative FK_E* code of a write, or FK_EUNKEPT) as the client's latest,
 * stamped `used` (a value from replicated state; larger = more recent).
 * When the client has no row and the table is full, the least recently
 * used row is evicted first (returns 1); otherwise returns 0. Never
 * fails. */
int cons_ctab_put(struct cons_ctab *t, uint64_t client_id, uint64_t req_no, int32_t status,
                  uint64_t used);
/* For undoing applies (a NOPaxos leader's speculative ones, nop.h): the
 * client's row as a session (stamp included; 1), or req_no 0 when it has
 * none (0); the row a new client would evict now (1), none while the
 * table has room (0); and deleting a row (1 if it was there). */
int cons_ctab_get(const struct cons_ctab *t, uint64_t client_id, struct cons_session *out);
int cons_ctab_victim(const struct cons_ctab *t, struct cons_session *out);
int cons_ctab_del(struct cons_ctab *t, uint64_t client_id);
/* Serialises the table (u64 ops, u32 count, then each row: u64 stamp, u64
 * client id, u64 request number, i32 status) into buf; FK_ETOOBIG when cap
 * is too small. At most CONS_CTAB_SAVE_MAX(cap) bytes. */
int cons_ctab_save(const struct cons_ctab *t, uint8_t *buf, size_t cap, size_t *len);
/* Replaces the table; FK_EMALFORMED on bad bytes (a duplicate client, a
 * stamp above ops; the table is unchanged), FK_EFULL over capacity. */
int cons_ctab_load(struct cons_ctab *t, const uint8_t *buf, size_t len);
/* Whether cons_ctab_load would accept buf: 0 or its error, and the table
 * is unchanged either way (it uses only t's scratch space). Lets a core
 * validate a whole snapshot before it replaces anything. */
int cons_ctab_check(struct cons_ctab *t, const uint8_t *buf, size_t len);

/* Applies op exactly once through the client table: a duplicate of a
 * write returns its kept outcome (1), an old request returns 2 and no
 * reply, a new one is applied (0) and its row stamped with ++t->ops
 * (evicting the least recently used row if the table is full; a read's row
 * keeps FK_EUNKEPT, not its result). A request with req_no > 1 from a
 * client without a row is answered FK_EEXPIRED and not applied (returns 0;
 * see eviction above). A duplicate whose row holds no outcome
 * (FK_EUNKEPT: a read, here or through cons_log_read) is read again, which
 * changes neither the state nor the table, and answered (1); any other op
 * under that number is answered FK_EEXPIRED. reply is filled when the
 * result is 0 or 1. Negative: the sm failed. */
int cons_apply_once(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op,
                    struct cons_reply *reply);

/* As cons_apply_once for an operation the core carries out itself
 * (CONS_OP_CONFIG): the machine is not consulted, `status` is the outcome
 * the core decided, kept in the client table as a write's. Returns 0 for
 * a new request (the core acts on it when status is 0), 1 for a
 * duplicate answered with its kept outcome, 2 for an older one, as
 * cons_apply_once; reply is filled for 0 and 1. */
int cons_apply_core(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op,
                    int32_t status, struct cons_reply *reply);

/* Whether op only reads (a get or a scan): applying it changes nothing. */
static inline int cons_op_reads(const struct cons_op *op)
{
    return op->type == CONS_OP_GET || op->type == CONS_OP_SCAN;
}

/* For a replica that logs a read without executing it (a NOPaxos
 * follower: only the leader executes in normal operation, Li et al., OSDI
 * 2016, section 5.2.1). The table moves exactly as cons_apply_once would
 * move it, so that every replica keeps the same rows, stamps and
 * evictions, but the state machine is not consulted and the row's reply is
 * FK_EUNKEPT; a retry of that read is read again (cons_apply_once). Same
 * return values as cons_apply_once, without a reply. op must read
 * (cons_op_reads). */
int cons_log_read(struct cons_sm *sm, struct cons_ctab *t, const struct cons_op *op);

/* Replaces t with the rows the machine keeps (cons_sm_ops.load) and sets
 * *applied to its mark: a restart, or the end of an install. FK_EFULL over
 * t's capacity, FK_EMALFORMED for a bad row (an id of 0, a duplicate, a
 * stamp above the clock); after an error t is empty. */
int cons_sm_load(struct cons_sm *sm, struct cons_ctab *t, uint64_t *applied);

/* The whole stream of the machine's state in one buffer (view slot
 * CONS_SM_SAVE_SLOT), and its install: the simulator's disk images
 * of its small machines, and tests. FK_ETOOBIG when cap cannot hold it. */
#define CONS_SM_SAVE_SLOT (CONS_SNAP_OPEN_MAX - 1)
int cons_sm_save(struct cons_sm *sm, uint8_t *buf, size_t cap, size_t *len);
int cons_sm_restore(struct cons_sm *sm, const uint8_t *buf, size_t len);
/* The pairs of the machine's state alone: the PAIR records of its stream
 * (cons_sm_save into buf, then only those kept, at its start), so that
 * tests compare what two machines store whatever their marks and rows.
 * Errors as cons_sm_save; FK_EMALFORMED for a stream it cannot walk. */
int cons_sm_pairs(struct cons_sm *sm, uint8_t *buf, size_t cap, size_t *len);
/* Empties the machine (pairs, rows, mark 0) through an install of the
 * empty stream, so that its byte count stays right. 0 or a storage error. */
int cons_sm_empty(struct cons_sm *sm);
/* One record of a stream chunk, as cons_snap_next reads it: the record's
 * bytes (at, len) and its fields. HEAD and END fill a and b (applied and
 * clock; sessions and pairs), SESSION s, PAIR key and val. */
struct cons_snap_rec {
    uint8_t tag; /* enum cons_snap_tag */
    const uint8_t *at;
    size_t len;
    uint64_t a, b;
    struct cons_session s;
    const uint8_t *key, *val;
    size_t klen, vlen;
};
/* Reads the record at buf[*off] (a chunk of len bytes) and moves *off past
 * it: 1, or 0 at the chunk's end, or FK_EMALFORMED for an unknown tag or a
 * record cut by the chunk's end (its fields are not checked further: the
 * installing machine does, kv_sm.h). Pure. */
int cons_snap_next(const uint8_t *buf, size_t len, size_t *off, struct cons_snap_rec *r);
/* Bytes of a stream holding `sessions` rows and pairs of `pair_bytes` key
 * and value bytes in all, `pairs` of them. */
#define CONS_SNAP_BYTES(sessions, pairs, pair_bytes)                                               \
    (34 + (size_t)(sessions)*29 + (size_t)(pairs)*7 + (size_t)(pair_bytes))

/* ---- outbox helpers for the cores --------------------------------------- */
/* Resets the outbox for a new step. */
void cons_outbox_reset(struct cons_outbox *ob);
/* Reserves len bytes in the arena; NULL when full. */
uint8_t *cons_outbox_alloc(struct cons_outbox *ob, size_t len);
/* Appends a message whose bytes were written at buf (from cons_outbox_alloc,
 * possibly shrunk to len). Returns 0 or FK_EFULL (the message is dropped). */
int cons_outbox_msg(struct cons_outbox *ob, struct cons_addr to, const uint8_t *buf, uint32_t len);

static inline struct cons_addr cons_replica(uint64_t id)
{
    struct cons_addr a = {CONS_ADDR_REPLICA, id};
    return a;
}

static inline struct cons_addr cons_client(uint64_t id)
{
    struct cons_addr a = {CONS_ADDR_CLIENT, id};
    return a;
}

static inline struct cons_addr cons_peers(void)
{
    struct cons_addr a = {CONS_ADDR_PEERS, 0};
    return a;
}

/* Whether a message to `to`, sent by replica `self`, is for replica i: the
 * drivers' fan-out of CONS_ADDR_PEERS. */
static inline int cons_addr_has_replica(struct cons_addr to, uint32_t self, uint32_t i)
{
    return to.kind == CONS_ADDR_PEERS ? i != self : to.kind == CONS_ADDR_REPLICA && to.id == i;
}

#endif /* CONS_H */
