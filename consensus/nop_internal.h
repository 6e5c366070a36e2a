/*
 * nop_internal.h: NOPaxos replica internals shared by nop*.c. Not a public
 * header: drivers use nop.h only.
 */
#ifndef NOP_INTERNAL_H
#define NOP_INTERNAL_H

#include "cons.h"
#include "cons_wire.h"
#include "nop.h"

#include <stdint.h>

enum nop_type {
    NOP_OUM_REQ = 1,        /* term = session; u64 msgnum, op */
    NOP_OUM_DROP = 2,       /* term = session; u64 msgnum */
    NOP_REPLY = 3,          /* term = view; u64 slot, u8 has_result, reply */
    NOP_GAP_FIND = 4,       /* term = view; u64 slot */
    NOP_GAP_RECV = 5,       /* term = view; log segment of one entry */
    NOP_GAP_COMMIT = 6,     /* term = view; u64 slot [, u64 lo: NO-OPs in lo..slot] */
    NOP_GAP_COMMIT_REP = 7, /* term = view; u64 slot */
    NOP_SYNC = 8,           /* term = view; u64 commit, log segment */
    NOP_SYNC_REP = 9,       /* term = view; u64 synced [, u64 NOP_SYNC_REP_* flags
                               [, u64 asked: the first slot the answered message covered]] */
    NOP_VC_REQ = 10,        /* term = view */
    NOP_VC = 11,            /* term = view; u64 last_normal, u64 sess_start, u64 commit,
                               checkpoint, log after it */
    NOP_START_VIEW = 12,    /* term = view; u64 sess_start, u64 commit, checkpoint, log after it */
    NOP_RECOVERY = 13,      /* u64 nonce, u64 have, u64 snap (restored committed prefix) */
    NOP_RECOVERY_REP = 14,  /* term = view; u64 nonce, u8 leader, u64 sess_start, u64 commit,
                               when leader: checkpoint and the log after it, or no checkpoint
                               and the log after the requester's `have` (else empty) */
    NOP_STATE = 15,    /* term = view; u64 sess_start, u64 commit, checkpoint (state transfer) */
    NOP_SYNC_SIG = 16, /* term = view; u64 commit, u64 lo, u32 n, n x u64 nop__entry_hash */
    NOP_OUM_FILL = 17, /* term = session; u64 msgnum (a number that holds no request, nop.h) */
    NOP__TYPES
};

/* A log segment on the wire: u64 lo (first slot), u32 n, then n entries,
 * each u8 kind (NOP_ENT_*) and, for a request, the op. A checkpoint on the
 * wire: u32 len, then the blob (u64 index, u32 n, client table, u32 n,
 * state machine snapshot). */
enum nop_ent { NOP_ENT_NONE = 0, NOP_ENT_REQ = 1, NOP_ENT_NOOP = 2 };

#define NOP_SYNC_ENTRIES 16  /* entries per SYNC message */
#define NOP_SYNC_SIGS    512 /* entry hashes per SYNC_SIG message */
/* SYNC_REP flags: what the answered message was and found. */
#define NOP_SYNC_REP_DIFFERED 1u /* a SYNC_SIG hash differed from this log */
#define NOP_SYNC_REP_FULL     2u /* the answer to a SYNC (entries) */
/* OUM messages held while the next one is missing, or while a leader is
 * paused at its stop gap waiting for its checkpoint to commit (nop.c);
 * one beyond is dropped, which costs a gap agreement and its client a
 * resend 100 ms later. At 112k ops/s a 1 ms pause is 112 messages: with
 * 64, every pause dropped dozens, and NOPaxos' YCSB-B p95 at 112k ops/s
 * was 14-122 ms instead of 1.7 ms. 1,024 ride out 9 ms at that rate. */
#define NOP_OUM_BUF 1024
/* Durable mode: messages waiting for their persists (nop_durable.c). One
 * reply per client operation of the last disk round trip, plus protocol
 * messages: 1,024 covers a disk commit of ~1,000 operations; beyond it a
 * message is dropped like a lost one (clients and timers resend). */
#define NOP_HELD_MAX 1024

struct nop_held {
    struct cons_addr to;
    uint64_t cookie; /* released once durable >= cookie; 0: its step's persists incomplete */
    size_t off;      /* bytes at held_buf + off */
    uint32_t len;
};

struct nop_entry {
    uint8_t kind; /* enum nop_ent */
    struct cons_op op;
};

/* The committed history: the slot and entry hash of each of the last
 * log_cap slots compacted into a checkpoint, at (slot - 1) % log_cap. With
 * it a leader confirms, by hashes, the log of a follower that fell behind
 * its checkpoint, and sends it entries that its ring still holds (the slot
 * is not reused before log_len passes slot + log_cap), instead of the
 * whole checkpoint (send_sync). A follower a few milliseconds behind on a
 * busy machine used to get state transfers over and over: each one
 * cost it more time than it was behind. */
struct nop_hist {
    uint64_t slot, hash;
};

struct nop_oum {
    uint8_t kind;   /* 0 empty, NOP_OUM_REQ, NOP_OUM_DROP or NOP_OUM_FILL */
    uint32_t epoch; /* valid only in the buffer's current epoch (nop__oum_clear) */
    uint64_t msgnum;
    struct cons_op op;
};

struct nop_msg {
    uint8_t type;
    uint32_t from;
    uint64_t term;
    uint64_t u1, u2, u3; /* per type, see enum nop_type */
    uint8_t flag;
    uint64_t lo; /* segment: first slot */
    uint32_t nents;
    struct cons_rbuf ents;
    const uint8_t *cp; /* checkpoint blob */
    uint32_t cp_len;
    uint64_t cp_index; /* its index */
};

struct nop {
    struct nop_config cfg;
    struct cons_sm sm;
    struct cons_ctab ctab;
    uint32_t f;
    uint8_t status, started, poisoned;
    uint64_t rng, now, last_heard;

    struct nop_view view, last_normal;
    /* The log is a ring of log_cap slots holding (snap, log_len]; slot i
     * lives at (i - 1) % log_cap. Slots <= snap are compacted into the
     * checkpoint: the state after executing them, always committed. */
    struct nop_entry *log;
    uint64_t *exec_sig;    /* hash of each entry as executed, to detect rollbacks */
    struct nop_hist *hist; /* committed history, log_cap rows */
    uint64_t snap, log_len, sess_start, executed, commit, synced;
    uint8_t *cp; /* checkpoint blob at snap, unless cp_due */
    size_t cp_len, cp_cap;
    /* A follower compacts without serialising (maybe_checkpoint): cp_due
     * says cp is older than snap, and nop__cp_fresh serialises the state
     * (committed: a follower executes nothing else) when a checkpoint is
     * needed, for the disk or a view change. */
    int cp_due;
    /* A leader's next checkpoint, taken when it executed pcp_slot (not
     * committed yet) in view pcp_view; 0 = none (maybe_checkpoint). */
    uint8_t *pcp;
    size_t pcp_len;
    uint64_t pcp_slot, pcp_view;

    struct nop_oum *oum;    /* NOP_OUM_BUF, indexed by msgnum % NOP_OUM_BUF */
    uint64_t oum_drop_upto; /* every number up to this one not buffered was dropped */
    uint32_t oum_epoch;     /* the buffer's epoch: slots of older ones are empty */

    /* Gap agreement: the leader's pending NO-OPs (gap_lo..gap_slot, one
     * slot except in durable mode), a follower's missing slot. */
    uint64_t gap_slot, gap_lo, gap_acks, gap_sent;
    uint64_t find_slot, find_sent;

    /* Leader: each follower's synced prefix; sync timer. Synchronization
     * (nop.c) is eager: a follower that falls log_cap / 16 entries behind
     * gets a SYNC_SIG at once, one in flight per follower (sync_out, also
     * set until the next heartbeat when entries brought no progress);
     * need_full: its last answer reported a differing entry or
     * no progress, or its prefix did not move between two heartbeats
     * (hb_acked), so it gets entries. */
    uint64_t acked[CONS_REPLICAS_MAX];
    uint64_t hb_acked[CONS_REPLICAS_MAX];
    uint8_t sync_out[CONS_REPLICAS_MAX], need_full[CONS_REPLICAS_MAX];
    /* Statistics (nop_stat): syncs sent by kind, and how often the leader
     * stopped taking requests, its ring 3/4 full (stalled: stopped now). */
    uint64_t syncs[3], stalls;
    int stalled;
    uint64_t next_sync;

    /* View change and recovery. */
    uint64_t vc_from, vc_since, vc_next;
    struct nop_view vc_best;
    uint64_t nonce, rec_from, rec_next;
    struct nop_view rec_view, rec_leader_view;
    int rec_have_leader;
    uint64_t rec_commit;
    /* Recovery from a restored disk (nop_disk.c): the committed prefix
     * (checkpoint at snap, executed up to rec_base) is still in place while
     * rec_base_ok; replies older than rec_floor (the persisted last normal
     * view) are ignored. */
    uint64_t rec_base;
    int rec_base_ok;
    struct nop_view rec_floor;

    /* Persistence (nop_disk.c): cookies issued and reported durable; what
     * the disk was asked to hold: the checkpoint at pers_snap, committed
     * entries up to pers_upto, and the metadata last written. */
    uint64_t next_cookie, durable;
    uint64_t pers_snap, pers_upto;
    uint64_t pers_meta[5]; /* the META fields as last written */
    int pers_meta_ok, meta_seen;

    /* Durable mode (nop_durable.c). dirty_lo: the lowest slot whose disk
     * copy may differ from the log (every write to the log lowers it,
     * nop__touch); pers_done: the last step's persists covered the whole
     * state, so its messages may take its last cookie. */
    uint64_t dirty_lo;
    int pers_done;
    struct nop_held *held; /* FIFO ring of NOP_HELD_MAX, cookies non-decreasing */
    uint32_t held_head, held_n;
    uint8_t *held_buf; /* byte ring for their bytes: [hb_head, hb_tail), wrapped when hb_wrap */
    size_t held_cap, hb_head, hb_tail;
    int hb_wrap;
    uint64_t held_dropped;
    /* A META restored in durable layout: the log it describes. */
    int rest_log;
    struct nop_view rest_view;
    uint64_t rest_len, rest_commit;

    struct cons_reply reply;
    struct cons_op scratch_op;
    struct cons_outbox ob;
};

static inline uint64_t nop__pack(struct nop_view v)
{
    return (uint64_t)v.leader_num << 32 | v.session;
}

static inline struct nop_view nop__unpack(uint64_t t)
{
    struct nop_view v = {(uint32_t)(t >> 32), (uint32_t)t};
    return v;
}

static inline int nop__view_eq(struct nop_view a, struct nop_view b)
{
    return a.leader_num == b.leader_num && a.session == b.session;
}

/* Views of normal operation are totally ordered; compare them so. */
static inline int nop__view_cmp(struct nop_view a, struct nop_view b)
{
    if (a.leader_num != b.leader_num)
        return a.leader_num < b.leader_num ? -1 : 1;
    if (a.session != b.session)
        return a.session < b.session ? -1 : 1;
    return 0;
}

static inline struct nop_entry *nop__ent(const struct nop *r, uint64_t slot)
{
    return &r->log[(slot - 1) % r->cfg.log_cap];
}

/* Copies an entry's used bytes (a NO-OP's op is never read). */
static inline void nop__entry_copy(struct nop_entry *dst, const struct nop_entry *src)
{
    dst->kind = src->kind;
    if (src->kind == NOP_ENT_REQ)
        cons_op_copy(&dst->op, &src->op);
}

static inline uint64_t *nop__sig(const struct nop *r, uint64_t slot)
{
    return &r->exec_sig[(slot - 1) % r->cfg.log_cap];
}

/* The hash of committed slot `slot` <= snap from the history: 1, or 0 when
 * the history no longer (or never) held it. */
int nop__hist_hash(const struct nop *r, uint64_t slot, uint64_t *hash);
/* 1 when the ring still holds committed slot `slot` <= snap (its entry's
 * hash is the history's), so that it may be sent. */
int nop__hist_entry(const struct nop *r, uint64_t slot);

/* nop_msg.c */
int nop__decode(const uint8_t *buf, size_t len, struct nop_msg *m, struct cons_op *op);
void nop__begin(struct nop *r, struct cons_wbuf *w, uint8_t type, uint64_t term);
void nop__send(struct nop *r, struct cons_wbuf *w, struct cons_addr to);
void nop__send_u64(struct nop *r, uint32_t to, uint8_t type, uint64_t u1);
/* Writes slots [lo, hi] of the log as a segment. */
void nop__put_segment(struct nop *r, struct cons_wbuf *w, uint64_t lo, uint64_t hi);
/* Writes the checkpoint blob (u32 len, bytes). */
void nop__put_checkpoint(struct nop *r, struct cons_wbuf *w);
/* Reads the next entry of a validated segment. */
void nop__entry_next(struct cons_rbuf *rd, struct nop_entry *e);
void nop__reply(struct nop *r, uint64_t slot, int with_result, const struct cons_reply *rep);

/* nop.c */
uint32_t nop__leader_of(const struct nop *r, struct nop_view v);
int nop__is_leader(const struct nop *r);
void nop__execute_to(struct nop *r, uint64_t upto, int reply);
/* Makes cp the checkpoint at snap again after a follower's lazy
 * compaction (cp_due): serialises the state at the executed slot and
 * compacts to it. Call before anything reads cp or pairs it with snap. */
void nop__cp_fresh(struct nop *r);
void nop__check_executed(struct nop *r);
void nop__oum_clear(struct nop *r);
/* Replaces the state with a checkpoint blob at `index` (framing validated
 * by the decoder): snap = executed = index, commit >= index. With
 * keep_tail the log after index stays when it fits the ring, else the log
 * ends at index. 0; FK_EMALFORMED when the blob is over the capacity, its
 * client table or its state machine snapshot is malformed (nothing
 * changed); FK_EPOISONED when the state machine failed otherwise (a
 * storage error: part of the state may be replaced). */
int nop__install(struct nop *r, const uint8_t *blob, size_t len, uint64_t index, int keep_tail);
/* Whether the ring has room for slot `slot`. */
int nop__fits(const struct nop *r, uint64_t slot);
void nop__drain(struct nop *r);
uint64_t nop__entry_hash(const struct nop_entry *e);

/* nop_disk.c */
#define NOP_META_MAGIC     0x4d504f4eu /* "NOPM": META of the default mode */
#define NOP_PERSIST_RUN    128         /* committed entries in one ENTRY record at most */
#define NOP_META_LOG_MAGIC 0x4c504f4eu /* "NOPL": META of durable mode (nop_durable.c) */
/* Queues persist items for what changed (never while recovering). */
void nop__persist(struct nop *r);
/* Default mode: only the committed entries nop__persist would write. */
void nop__persist_entries(struct nop *r);
/* A persist item: write the record into w (begin), then add it (end:
 * FK_EFULL when it did not fit the arena or the array; nothing added). */
void nop__item_begin(struct nop *r, struct cons_wbuf *w);
int nop__item_end(struct nop *r, uint8_t kind, uint64_t index, const struct cons_wbuf *w);
/* An ENTRY record: u64 slot, u8 kind, the op for a request. */
void nop__put_entry(struct cons_wbuf *w, uint64_t slot, const struct nop_entry *e);
/* NOP_START_RESTORED: rebuilds the committed prefix from the restored
 * records, then recovers (or, with the planted bug, does not); in durable
 * mode with a durable META, takes the whole log and changes view. 0 or
 * FK_EMALFORMED (a hole in a durable log). */
int nop__start_restored(struct nop *r);

/* nop_durable.c */
/* Lowers the dirty mark: slot (and what follows) must be written again. */
static inline void nop__touch(struct nop *r, uint64_t slot)
{
    if (slot < r->dirty_lo)
        r->dirty_lo = slot;
}
/* Durable mode: persists the snapshot, every dirty slot and META. */
void nop__persist_durable(struct nop *r);
/* Durable mode: META in durable layout (also parsed by nop_restore_meta). */
int nop__restore_meta_durable(struct nop *r, struct cons_rbuf *rd);
/* Durable mode, RESTORED with a durable META: takes the persisted log and
 * starts a view change. 0 or FK_EMALFORMED (a hole in the log). */
int nop__start_from_log(struct nop *r);
/* Durable mode, at the end of every call: holds the outbox's messages
 * until their persists are durable, releases those now durable. */
void nop__hold(struct nop *r);

/* nop_view.c */
void nop__start_view_change(struct nop *r, struct nop_view v);
void nop__on_vc_req(struct nop *r, const struct nop_msg *m);
void nop__on_vc(struct nop *r, const struct nop_msg *m);
void nop__on_start_view(struct nop *r, const struct nop_msg *m);
void nop__vc_tick(struct nop *r);
void nop__recover_start(struct nop *r);
void nop__recover_tick(struct nop *r);
void nop__on_recovery(struct nop *r, const struct nop_msg *m);
void nop__on_recovery_rep(struct nop *r, const struct nop_msg *m);

#endif /* NOP_INTERNAL_H */
