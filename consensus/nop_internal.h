/*
 * nop_internal.h: NOPaxos replica internals shared by nop*.c. Not a public
 * header: drivers use nop.h only.
 */
#ifndef NOP_INTERNAL_H
#define NOP_INTERNAL_H

#include "cons.h"
#include "cons_hist.h"
#include "cons_wire.h"
#include "cons_xfer.h"
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
    NOP_SYNC = 8,           /* term = view; u64 commit, log segment, u64 safe (compaction) */
    NOP_SYNC_REP = 9,       /* term = view; u64 synced, u64 NOP_SYNC_REP_* flags, u64 asked:
                               the first slot the answered message covered, u64 executed */
    NOP_VC_REQ = 10,        /* term = view */
    NOP_VC = 11,            /* term = view; u64 last_normal, u64 sess_start, u64 commit,
                               the log after the sender's snap */
    NOP_START_VIEW = 12,    /* term = view; u64 sess_start, u64 commit, the log after snap */
    NOP_RECOVERY = 13,      /* u64 nonce, u64 have, u64 snap (restored committed prefix) */
    NOP_RECOVERY_REP = 14,  /* term = view; u64 nonce, u8 leader, u64 sess_start, u64 commit,
                               when leader: the log after its snap, or the log after the
                               requester's `have` (else empty) */
    NOP_STATE = 15,         /* term = view; u64 sess_start, u64 commit, u64 index: the leader
                               compacted what this follower lacks up to index (fetch a state) */
    NOP_SYNC_SIG = 16,      /* term = view; u64 commit, u64 lo, u32 n, n x u64 nop__entry_hash,
                               u64 safe (compaction) */
    NOP_OUM_FILL = 17,      /* term = session; u64 msgnum (a number that holds no request, nop.h) */
    NOP_XFER = 18,          /* u8 kind, a state transfer message (cons_xfer.h) */
    NOP__TYPES
};

/* A log segment on the wire: u64 lo (first slot), u32 n, then n entries,
 * each u8 kind (NOP_ENT_*) and, for a request, the op. */
enum nop_ent { NOP_ENT_NONE = 0, NOP_ENT_REQ = 1, NOP_ENT_NOOP = 2 };

#define NOP_SYNC_ENTRIES 16  /* entries per SYNC message */
#define NOP_SYNC_SIGS    512 /* entry hashes per SYNC_SIG message */
/* Bytes of entries per SYNC from the history (nop.c send_past). */
#define NOP_SYNC_PAST_BYTES (256u << 10)
/* SYNC_REP flags: what the answered message was and found. */
#define NOP_SYNC_REP_DIFFERED 1u /* a SYNC_SIG hash differed from this log */
#define NOP_SYNC_REP_FULL     2u /* the answer to a SYNC (entries) */
/* OUM messages held while the next one is missing, or while a leader is
 * paused at its stop gap waiting for the commit point to let it compact (nop.c);
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

/* What executing one slot past the commit point changed (nop_undo.c). */
enum { NOP_UNDO_NONE, NOP_UNDO_HELD, NOP_UNDO_ABSENT, NOP_UNDO_LOST };
struct nop_undo {
    uint64_t slot;            /* 0: none */
    uint64_t clock;           /* the client table's before */
    struct cons_session row;  /* the client's row before (req_no 0: none); id 0: no request */
    struct cons_session gone; /* the row its apply evicted; id 0: none */
    uint8_t pair;             /* NOP_UNDO_*: the pair's value before */
    uint16_t klen;
    uint32_t vlen;
    uint8_t bytes[CONS_KEY_MAX + NOP_OP_MAX]; /* key, then the value before */
};

/* The committed history: the slot and entry hash of each of the last
 * log_cap slots compacted, at (slot - 1) % log_cap. With
 * it a leader confirms, by hashes, the log of a follower that fell behind
 * its snap, and sends it entries that its ring still holds (the slot
 * is not reused before log_len passes slot + log_cap), instead of the
 * notice to fetch a state (send_sync). A follower a few milliseconds behind on a
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
    uint64_t u1, u2, u3, u4; /* per type, see enum nop_type */
    uint8_t flag;
    uint64_t lo; /* segment: first slot */
    uint32_t nents;
    struct cons_rbuf ents;
    const uint8_t *body; /* XFER: the cons_xfer message */
    uint32_t body_len;
    /* VC, START_VIEW, RECOVERY_REP, STATE: the sender's committed history
     * before its log, hashes of slots hlo.. (nop__put_hist). */
    uint64_t hlo;
    uint32_t hn;
    struct cons_rbuf hashes;
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
     * lives at (i - 1) % log_cap. Slots <= snap are compacted: committed,
     * and in the state machine, whose mark is `executed` (nop.h,
     * "State"). executed < snap: the machine is behind the ring and this
     * replica fetches a state at or past snap (nop__needs_state). */
    struct nop_entry *log;
    uint64_t *exec_sig;    /* hash of each entry as executed, to detect rollbacks */
    struct nop_hist *hist; /* committed history, log_cap rows */
    /* Compacted committed entries, each as nop__put_one encodes it, for
     * followers behind the ring (send_sync); and one encoded entry. */
    struct cons_hist past;
    uint8_t *past_scratch;
    uint64_t snap, log_len, sess_start, executed, commit, synced;
    uint64_t marked; /* the machine's mark as last set (nop__mark) */
    int sealed;      /* no step since the last nop_seal (nop_invariants) */
    /* State transfer, both ways (cons_xfer.h); resets: machines emptied
     * because what they executed left the log (nop__check_executed). */
    struct cons_xfer xfer;
    uint64_t resets;
    /* Undo records of slots executed past the commit point, at (slot - 1)
     * % log_cap (nop_undo.c); undone: rollbacks done with them. */
    struct nop_undo *undo;
    struct cons_reply undo_get;
    uint64_t undone;
    /* The records also go to the machine's stash (cons.h), once per step
     * for the slots it executed past the commit point (a batch keyed by
     * its last slot), so that a restart rolls a leader's machine back to
     * its committed prefix instead of losing it: stash_hi, the last slot
     * stashed; stash_dropped, batches at or below it dropped; stash_reset,
     * the stash no longer matches (a rollback, a new state): rewrite. */
    uint64_t stash_hi, stash_dropped;
    int stash_reset;
    uint8_t *stash_buf;
    size_t stash_cap;

    struct nop_oum *oum;    /* NOP_OUM_BUF, indexed by msgnum % NOP_OUM_BUF */
    uint64_t oum_drop_upto; /* every number up to this one not buffered was dropped */
    uint32_t oum_epoch;     /* the buffer's epoch: slots of older ones are empty */

    /* Gap agreement: the leader's pending NO-OPs (gap_lo..gap_slot, one
     * slot except in durable mode), a follower's missing slot. */
    uint64_t gap_slot, gap_lo, gap_acks, gap_sent;
    uint64_t gap_noops; /* slots decided NO-OP by completed agreements (nop_stat) */
    uint64_t find_slot, find_sent;

    /* Leader: each follower's synced prefix; sync timer. Synchronization
     * (nop.c) is eager: a follower that falls log_cap / 16 entries behind
     * gets a SYNC_SIG at once, one in flight per follower (sync_out, also
     * set until the next heartbeat when entries brought no progress);
     * need_full: its last answer reported a differing entry or
     * no progress, or its prefix did not move between two heartbeats
     * (hb_acked), so it gets entries. */
    uint64_t acked[CONS_REPLICAS_MAX];
    /* Compaction keeps the state available (nop.c, maybe_compact): a
     * leader learns each follower's executed slot (exec_of, from SYNC_REP)
     * and compacts, and lets followers compact (safe, in SYNC and
     * SYNC_SIG), only up to a slot f+1 replicas have executed. */
    uint64_t exec_of[CONS_REPLICAS_MAX], safe;
    uint64_t hb_acked[CONS_REPLICAS_MAX];
    uint8_t sync_out[CONS_REPLICAS_MAX], need_full[CONS_REPLICAS_MAX];
    /* Statistics (nop_stat): syncs sent by kind, and how often the leader
     * stopped taking requests, its ring 3/4 full (stalled: stopped now). */
    uint64_t syncs[NOP_SYNC_KINDS], stalls;
    uint64_t oum_overflows; /* OUM messages past the buffer, taken as dropped (on_oum) */
    int stalled;
    /* Serve hold (nop.c, hold_for_transfer): a leader asked for a state
     * while its machine was ahead of its commit point rolled back to it
     * and executes only committed slots until it sends a view, or until
     * hold_since is a sender switch old. */
    int serve_hold;
    uint64_t hold_since, holds;
    uint64_t next_sync;

    /* View change and recovery. */
    uint64_t vc_from, vc_since, vc_next;
    struct nop_view vc_best;
    uint64_t nonce, rec_from, rec_next;
    struct nop_view rec_view, rec_leader_view;
    int rec_have_leader;
    uint64_t rec_commit;
    /* Recovery from a restored disk (nop_disk.c): the committed prefix
     * (the machine and entries up to rec_base) is still in place while
     * rec_base_ok; replies older than rec_floor (the persisted last normal
     * view) are ignored. */
    uint64_t rec_base;
    int rec_base_ok;
    struct nop_view rec_floor;

    /* Persistence (nop_disk.c): cookies issued and reported durable; what
     * the disk was asked to hold: entries after the trim point pers_snap
     * (committed ones up to pers_upto in the default mode), and the
     * metadata last written. */
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
    /* Restore: the highest entry slot restored (rest_hi). */
    uint64_t rest_hi;

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
/* One entry of a segment: u8 kind and, for a request, the op. */
void nop__put_one(struct cons_wbuf *w, const struct nop_entry *e);
/* Writes the committed history that leads to snap: u64 hlo, u32 n, then
 * the hashes of slots hlo..snap that the history holds (at most log_cap).
 * A replica whose log holds those slots but has not seen them committed
 * confirms them with it instead of fetching a state (nop__restart_ring). */
void nop__put_hist(struct nop *r, struct cons_wbuf *w);
/* Reads the next entry of a validated segment. */
void nop__entry_next(struct cons_rbuf *rd, struct nop_entry *e);
void nop__reply(struct nop *r, uint64_t slot, int with_result, const struct cons_reply *rep);

/* nop.c */
uint32_t nop__leader_of(const struct nop *r, struct nop_view v);
int nop__is_leader(const struct nop *r);
void nop__execute_to(struct nop *r, uint64_t upto, int reply);
/* Durable mode executes only committed slots (nop.h, "State"); the planted
 * bug NOP_BUG_REPLY_UNPERSISTED executes and answers at once instead, as
 * the default mode does, before the disk. */
static inline int nop__commit_only(const struct nop *r)
{
    return r->cfg.durable && !(r->cfg.bugs & NOP_BUG_REPLY_UNPERSISTED);
}
/* Whether the machine is behind the ring (executed < snap): it executes
 * nothing and serves no state until a transfer brought one. */
static inline int nop__needs_state(const struct nop *r)
{
    return r->executed < r->snap;
}
/* After a view's log replaced this replica's: if it no longer holds what
 * the machine executed (speculatively, as an old leader), the machine is
 * emptied (nop__reset_state) and the replica fetches a state. */
void nop__check_executed(struct nop *r);
/* Rolls the machine back to `target` (undo records; else emptied). */
void nop__rollback(struct nop *r, uint64_t target);
/* Empties the machine (a state at index 0, which is correct; there is no
 * undo) and the client table with it. */
void nop__reset_state(struct nop *r);
/* The log from elsewhere starts after `index` > snap (a compacted prefix
 * this replica may not hold): with keep_tail the log after index stays
 * when it fits the ring, else it ends at index. Slots up to index this
 * replica committed are executed and compacted; otherwise its ring starts
 * after index and it needs a state (its machine emptied first when it
 * executed past its commit point: unverifiable). */
void nop__restart_ring(struct nop *r, uint64_t index, int keep_tail, const struct nop_msg *m);
void nop__oum_clear(struct nop *r);
/* The largest slot that f+1 replicas reached: this one at `mine`, replica
 * p at theirs[p] (theirs[self] unused). */
uint64_t nop__quorum_point(const struct nop *r, uint64_t mine, const uint64_t *theirs);
/* Moves snap to `upto` (committed, executed, in the log): the slots it
 * compacts go into the history first. */
void nop__compact_to(struct nop *r, uint64_t upto);
/* Whether the ring has room for slot `slot`. */
int nop__fits(const struct nop *r, uint64_t slot);
void nop__drain(struct nop *r);
uint64_t nop__entry_hash(const struct nop_entry *e);
/* Whether this replica's log holds slots (commit, index] as the sender's
 * committed history (m's hashes) does. */
int nop__confirmed(const struct nop *r, uint64_t index, const struct nop_msg *m);
/* Fetches a state when the machine is behind the ring (nop.h, "State"). */
void nop__maybe_fetch(struct nop *r);
/* The leader: the highest slot it may compact to (every state a replica may
 * need on f+1 replicas), and where it stops taking requests. */
uint64_t nop__leader_safe(const struct nop *r);
uint64_t nop__leader_stop_gap(const struct nop *r);
/* Compacts what the commit point and the followers allow; 0 or FK_E*. */
int nop__maybe_compact(struct nop *r);

/* nop_normal.c: normal operation over the OUM (section 5.2.1), one handler
 * per input. */
extern const struct nop_entry nop__noop_entry; /* a NO-OP log entry */
/* The next OUM message number (0: a state transfer left this replica before
 * the session's first slot). */
uint64_t nop__expected(const struct nop *r);
void nop__append(struct nop *r, const struct nop_entry *e);
/* Answers the client of the request at slot (the leader with its result). */
void nop__ack_request(struct nop *r, uint64_t slot, const struct cons_op *op);
/* The leader: NO-OPs it decided go to the followers again. */
void nop__send_gap_commits(struct nop *r);
void nop__on_oum(struct nop *r, const struct nop_msg *m, const struct cons_op *op);

/* nop_gap.c: gap agreement (section 5.2.2), one handler per message. */
void nop__on_gap_find(struct nop *r, const struct nop_msg *m);
void nop__on_gap_recv(struct nop *r, const struct nop_msg *m);
void nop__on_gap_commit(struct nop *r, const struct nop_msg *m);
void nop__on_gap_commit_rep(struct nop *r, const struct nop_msg *m);
/* Places the leader's entry e at slot on a follower. */
void nop__follower_put(struct nop *r, uint64_t slot, const struct nop_entry *e);

/* nop_sync.c: synchronization (section 5.2.4), one handler per message. */
/* The leader syncs follower p (state_ok 0: one that needs a state gets
 * nothing now), or every follower at once when its ring fills. */
void nop__send_sync(struct nop *r, uint32_t p, int state_ok);
void nop__sync_eager(struct nop *r);
void nop__on_sync_sig(struct nop *r, const struct nop_msg *m);
void nop__on_sync(struct nop *r, const struct nop_msg *m);
void nop__on_state(struct nop *r, const struct nop_msg *m);
void nop__on_sync_rep(struct nop *r, const struct nop_msg *m);

/* nop_undo.c */
int nop__undo_init(struct nop *r);
void nop__undo_free(struct nop *r);
/* Forgets every record (the machine was replaced). */
void nop__undo_clear(struct nop *r);
/* End of a step: brings the machine's stash up to the undo records. */
void nop__stash_sync(struct nop *r);
/* Restore: the stash's records back into the undo ring. 0 or an error of
 * the machine (FK_EMALFORMED for bad bytes). */
int nop__stash_restore(struct nop *r);
/* Records what executing slot (past the commit point) will change. 0 or a
 * storage error. */
int nop__undo_capture(struct nop *r, uint64_t slot, const struct nop_entry *e);
/* Rolls the machine and table back to `target` (< executed): 0, or
 * FK_EINVAL when a slot after target has no record (it was executed
 * before it was speculative, or by an earlier incarnation), nothing
 * changed; FK_EPOISONED on storage errors. */
int nop__undo_to(struct nop *r, uint64_t target);

/* nop_disk.c */
#define NOP_META_MAGIC     0x4d504f4eu /* "NOPM": META of the default mode */
#define NOP_TRIM_MAGIC     0x54504f4eu /* "NOPT": the SNAPSHOT record: where the log starts */
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
/* The SNAPSHOT record: the log on disk starts after `index` (entries at or
 * below it are dropped). FK_EFULL when it did not fit. */
int nop__persist_trim(struct nop *r, uint64_t index);
/* Restore: the machine (at `executed`) is kept when the restored entries
 * (snap, executed] are all there and executed <= upto (their hashes
 * become the executed signatures); else it is emptied. */
void nop__check_machine(struct nop *r, uint64_t upto);
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
