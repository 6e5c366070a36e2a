/*
 * nop.h: NOPaxos (Li, Michael, Szekeres, Kaur, Ports: "Just Say NO to
 * Paxos Overhead", OSDI 2016) as a pure state machine; cons.h describes the
 * contract (inputs in, outbox out).
 *
 * Inputs come from three sources:
 *  - the ordered unreliable multicast (OUM, section 4): a message whose
 *    source address kind is CONS_ADDR_OUM carries either a client request
 *    stamped with (session, message number) or a drop notification for
 *    (session, number). Within a session the OUM delivers in number order;
 *    a number skipped without a notification counts as dropped too. A new
 *    session number means the sequencer failed over. A third kind, a
 *    FILL, is a number that carries no request: a driver whose transport
 *    numbers pieces of a message (the server's kv.oum cuts a large request
 *    into fragments, each numbered, and the request is whole only at its
 *    last) hands the other pieces in as fills. A fill's bytes are the same
 *    at every replica that received it, so each logs a NO-OP in its slot
 *    without gap agreement; a replica that lost it treats the number as
 *    dropped and asks the leader, whose slot holds a NO-OP either way.
 *  - other replicas (gap agreement, synchronization, view change,
 *    recovery);
 *  - ticks.
 *
 * The protocol (section 5):
 *  - Normal operation (5.2.1): every replica appends OUM requests to its log
 *    in order; the leader executes each and replies with the result;
 *    followers reply without one. A client accepts a result once f+1
 *    replies agree on (view, log slot) and one is the leader's.
 *  - Gap agreement (5.2.2): for a dropped message the leader appends a
 *    NO-OP and processes nothing further until f followers confirm the
 *    GAP-COMMIT; a follower that misses one asks the leader for the slot
 *    (GAP-FIND) and takes the request or the NO-OP.
 *  - View change (5.2.3): views are (leader number, session number); a
 *    follower that stops hearing its leader, or sees a newer session, asks
 *    for a view change; the new leader merges f+1 logs of the latest normal
 *    view (a NO-OP anywhere wins, else a request anywhere, up to the longest
 *    log) and starts the view. A session change restarts message numbers.
 *  - Synchronization (5.2.4): the leader periodically brings followers'
 *    logs up to its own; a prefix held by f+1 replicas is committed, and
 *    followers execute only committed entries, and of those only the
 *    writes: a read changes no state, so a follower logs it in its client
 *    table without a reply (cons_log_read), and a retry of it after a
 *    view change is read again (cons_apply_once).
 *  - Recovery (5.3.2, after Viewstamped Replication): a replica that
 *    restarts asks all replicas under a nonce and rejoins with the log of
 *    the leader of the newest view among f+1 answers.
 *  - State: the state machine (cons.h) holds the key-value pairs and the
 *    client table's rows, and its mark is the slot this replica executed
 *    (`executed`), set at the end of every step: a checkpoint is that
 *    mark, never a serialised copy. The leader executes ahead of the
 *    commit point (5.2.1) and the paper leaves its rollback to the
 *    application: before executing a slot past the commit point it keeps
 *    an undo record (the pair's previous value, the client's row, the row
 *    an eviction removes, the table's clock; nop_undo.c), in memory and,
 *    once a step, in the machine's stash (cons_sm_ops.stash_*) in the same
 *    transaction as the machine's changes. A replica whose executed
 *    entries differ from a new view's log (5.2.3) undoes them back to the
 *    divergence and re-executes; a restarted leader rolls its machine
 *    back to its committed prefix the same way. Only where no record
 *    reaches (a machine of an earlier incarnation past what its disk can
 *    show) is the machine emptied (a correct state at slot 0) and a state
 *    fetched. Durable mode executes only committed slots, on every
 *    replica: nothing to undo there.
 *  - Log compaction: moving `snap` (the ring holds (snap, log_len]) once
 *    half the ring is used, keeping the last quarter for replicas a little
 *    behind, and never past a slot f+1 replicas executed (the leader
 *    learns followers' executed slots from SYNC-REPLY and passes its bound
 *    in SYNC): f replicas that lose their machines leave one that can
 *    serve any state another needs. The compacted slots' hashes stay in a
 *    committed history of log_cap rows, and the entries themselves,
 *    encoded, in a history of history_bytes (cons_hist.h).
 *  - State transfer (cons_xfer.h): a replica whose machine is behind its
 *    ring (executed < snap: it lost its disk, or a log from elsewhere
 *    starts past what it holds) fetches a state at or past snap in chunks,
 *    from a follower first, while it keeps logging and acknowledging (it
 *    counts toward commits); it executes nothing until the state is in. A
 *    sender serves a view of its machine once the view's index is
 *    committed (a leader holds a view it took ahead of its commit point,
 *    and closes those views when it undoes); a leader asked for a state
 *    while it holds one rolls back to its commit point and executes only
 *    committed slots until it sends a view (nop.c, hold_for_transfer):
 *    followers fetching a state may not be able to log what would commit
 *    the held view. A follower behind the
 *    leader's snap is confirmed by the hashes of the committed history and
 *    gets entries the ring still holds; one behind those gets entries from
 *    the history (so a replica whose transfer took seconds under load
 *    catches up from the state it got); only one behind the history too
 *    is told to fetch a state (STATE). VIEW-CHANGE, START-VIEW and RECOVERY-REPLY
 *    carry the sender's log after its snap and its committed history's
 *    hashes: a receiver whose own log holds the slots up to the sender's
 *    snap confirms them by those hashes and executes them instead of
 *    fetching a state. A leader whose state passes its commit point over
 *    entries it logged starts a view change (section 5.2.3): the state
 *    may hold other entries there (committed in a view that superseded
 *    its own), and its followers, synced with the entries it had, would
 *    commit those under its new commit point (nop.c, took_state).
 *
 * Persistence has two modes (nop_config.durable):
 *  - 0, the default: persistence is an optimisation, not a safety
 *    mechanism (the paper's replicas are diskless and so is its
 *    correctness argument, section 5.3.2): the core persists COMMITTED
 *    log entries only (ENTRY, each written once its slot is committed, so
 *    every entry on disk is final and identical on every replica), a trim
 *    point (SNAPSHOT: the log on disk starts after it, written once the
 *    log on disk would outgrow a ring after the last one) and its view
 *    metadata (META: view, last normal view, session start); the machine
 *    writes its own state, mark and undo stash in the same transaction.
 *    No acknowledgement waits for CONS_IN_PERSISTED: nothing a replica
 *    promised depends on its disk, because a restarted replica
 *    (NOP_START_RESTORED) always runs the recovery protocol before it acts
 *    again; its disk only spares the transfer of the state: its machine,
 *    rolled back to the committed prefix the disk shows, and the entries
 *    after it; its RECOVERY carries that prefix and the leader answers
 *    with the log after it when the prefix covers the leader's snap
 *    (nop_disk.c explains why that is safe). A group whose replicas all
 *    restart at once cannot serve again (recovery needs f+1 replicas in
 *    normal status), and operations acknowledged but not yet committed on
 *    disk are lost when every replica crashes.
 *  - 1, durable (the server's `sync` durability): every log entry the
 *    replica holds (committed or not) and its metadata (view, last normal
 *    view, session start, log length, commit point) are persisted, and
 *    EVERY message the replica sends (client replies, VIEW-CHANGE,
 *    START-VIEW, SYNC-REPLY, GAP-COMMIT-REPLY, ...) leaves only once
 *    CONS_IN_PERSISTED covers everything persisted before it was made
 *    (cons.h, "Durability contract"). A replica restarted from such a
 *    disk treats its log like the one it would have sent in a VIEW-CHANGE
 *    (section 5.2.3) and starts a view change to a higher view instead of
 *    recovering, so a group whose replicas ALL restart from disk serves
 *    again once f+1 of them are back, and no acknowledged operation is
 *    lost. A replica restarted EMPTY (lost disk) still recovers and holds
 *    no log until then. Every replica, the leader too, executes a slot
 *    only once it is committed, so a machine on disk never holds what a
 *    view change could replace. Costs: one message copy per message while
 *    its persists are pending, a held buffer as large as the outbox arena,
 *    the leader's answer after the commit point moved (one more round of
 *    syncs, which go out at every step in this mode), a view change
 *    whenever a replica restarts from its disk, and the whole log
 *    rewritten to disk at each view change (nop_durable.c).
 *
 * Limits of this implementation (documented, not hidden):
 *  - View change messages carry up to a ring of entries: log_cap *
 *    NOP_WIRE_OP_MAX must fit CONS_MSG_MAX (checked at create).
 *  - Reads go through the log (linearizable).
 *  - No damping of view changes (unlike mpx's pre-vote): a replica that was
 *    cut off and timed out moves the group to a higher view when it is
 *    heard again. Safe, but a flapping link costs view changes.
 *
 * Thread safety: a handle belongs to one thread.
 */
#ifndef NOP_H
#define NOP_H

#include "cons.h"
#include "cons_xfer.h"

#include <stddef.h>
#include <stdint.h>

/* A NOPaxos request travels whole through the ordered multicast, where
 * each fragment of it takes a sequence number and a log slot (fkc_proto.h:
 * 224 bytes a fragment): its key, value and expected bytes together are
 * at most NOP_OP_MAX, an op that fits inline (cons.h), so that the log
 * keeps requests in place: a compare-and-swap of two YCSB default records
 * (1,048 bytes each, YCSB's read-modify-write of one field) fits. Larger
 * values need Multi-Paxos (README, "Limits"). A result (a GET's value, a
 * scan page) is then at most NOP_RESULT_MAX bytes. */
#define NOP_OP_MAX      CONS_OP_INLINE
#define NOP_WIRE_OP_MAX (32 + NOP_OP_MAX) /* sizeof(struct cons_wire_op) + NOP_OP_MAX */
#define NOP_RESULT_MAX  CONS_SCAN_PAGE
_Static_assert(NOP_OP_MAX + 6 <= NOP_RESULT_MAX, "a scan page holds a pair of the largest op");

/* Test-only planted bugs, so the simulator proves its checkers can fail. */
enum nop_bug {
    NOP_BUG_NO_GAP_AGREEMENT = 1u << 0,    /* a follower NO-OPs a dropped slot on its own */
    NOP_BUG_FOLLOWER_EXEC = 1u << 1,       /* followers execute uncommitted entries, no rollback */
    NOP_BUG_RESTORE_NO_RECOVERY = 1u << 2, /* a restored replica resumes its persisted view */
    NOP_BUG_REPLY_UNPERSISTED = 1u << 3,   /* durable mode: the leader answers at execution, and
                                              client replies leave before persisted */
};

struct nop_config {
    uint32_t n, id;        /* 3..CONS_REPLICAS_MAX replicas, odd; this one */
    uint32_t log_cap;      /* log entries, 16..CONS_LOG_CAP_MAX, within CONS_MSG_MAX (above) */
    uint32_t clients_max;  /* client table rows */
    uint32_t xfer_chunk;   /* bytes a state transfer chunk aims at, 1..1 MiB (cons_xfer.h) */
    uint32_t xfer_window;  /* transfer chunks in flight, 1..CONS_XFER_WINDOW_MAX */
    size_t history_bytes;  /* compacted entries kept for followers behind the ring (0: none) */
    size_t arena_bytes;    /* outbox arena; raised to hold one whole-log message */
    uint64_t heartbeat_ns; /* sync and retransmission period */
    uint64_t election_ns;  /* a follower that hears no leader this long starts a view change */
    uint64_t seed;         /* recovery nonce; fresh per incarnation */
    uint32_t durable;      /* 1: acknowledge only what is durable, restart whole groups from
                              disk (see "Persistence" above); 0: diskless argument */
    uint32_t bugs;         /* enum nop_bug; 0 in production */
};

enum nop_status { NOP_NORMAL = 1, NOP_VIEWCHANGE = 2, NOP_RECOVERING = 3 };
enum nop_start_mode { NOP_START_FRESH = 1, NOP_START_RESTORED = 2, NOP_START_EMPTY = 3 };

/* A view: leader number (leader = leader_num % n) and session number. */
struct nop_view {
    uint32_t leader_num;
    uint32_t session;
};

/* Synchronization messages a leader sends a follower (nop.c send_sync):
 * hashes of entries it should hold, the entries, for one behind the ring
 * entries from the history of compacted ones, or, for one behind that
 * too, word to fetch a state. */
enum { NOP_SYNC_KIND_HASHES, NOP_SYNC_KIND_ENTRIES, NOP_SYNC_KIND_STATE, NOP_SYNC_KIND_PAST };
#define NOP_SYNC_KINDS 4

struct nop_stat {
    uint8_t status;
    struct nop_view view;
    uint32_t leader; /* view.leader_num % n */
    uint32_t n;      /* replicas */
    uint64_t log_len, commit, executed;
    int is_leader;
    uint32_t held;                  /* durable mode: messages waiting for the disk */
    uint64_t held_dropped;          /* durable mode: messages dropped, the held ring full */
    uint64_t syncs[NOP_SYNC_KINDS]; /* leader: syncs sent, by NOP_SYNC_KIND_* */
    uint64_t stalls;                /* leader: times it stopped taking requests (ring 3/4 full) */
    uint64_t holds;                 /* leader: serve holds for a state transfer (nop.c) */
    uint64_t gap_noops;             /* leader: slots gap agreement decided NO-OP (5.2.2) */
    int needs_state;                /* the machine is behind the ring: waits for a state */
    uint64_t resets;                /* machines emptied: executed entries left the log, no undo */
    uint64_t undone;                /* rollbacks of speculative execution by undo records */
    struct cons_xfer_stats xfer;
};

struct nop;

/* Creates a replica applying to sm (borrowed for its lifetime): empty for
 * START_FRESH and START_EMPTY, the machine as its disk holds it for
 * START_RESTORED (nop_restore_meta reads its mark, rows and stash).
 * Allocates everything it will use. NULL with *err = FK_EINVAL (bad
 * config) or FK_ENOMEM. */
struct nop *nop_create(const struct nop_config *cfg, struct cons_sm sm, int *err);
void nop_destroy(struct nop *r);
/* Restore persisted records (the bytes of persist items of that kind, as
 * the core emitted them; borrowed for the call) before
 * nop_start(NOP_START_RESTORED): META first (which also reads the
 * machine's mark, rows and undo stash), then the SNAPSHOT (the trim
 * point) if the disk holds one, then ENTRY records (each a run of
 * consecutive entries) in any order (entries at or below the trim point
 * are ignored; a durable-mode disk may hold stale entries beyond its
 * persisted log length, which are ignored too, so pass them all).
 * Returns 0, FK_EMALFORMED (bad bytes, or a record of another group or
 * replica, a machine whose rows or stash do not load), FK_EINVAL (called
 * after start; an entry beyond the ring after the trim point), or the
 * machine's storage error. After any error the handle must be destroyed:
 * restart EMPTY with a wiped disk instead. Owner thread only. */
int nop_restore_meta(struct nop *r, const uint8_t *buf, size_t len);
int nop_restore_snapshot(struct nop *r, const uint8_t *buf, size_t len);
int nop_restore_entry(struct nop *r, const uint8_t *buf, size_t len);
/* FRESH: a member of a new group. RESTORED: a restart from the records
 * given to nop_restore_*; rebuilds its committed prefix, then recovers,
 * or, in durable mode with a META written in durable mode, takes its
 * persisted log and starts a view change to a higher view (every replica
 * of a durable group that still has its disk must restart RESTORED, never
 * EMPTY: a durable group restarted all at once needs f+1 of them).
 * EMPTY: a restart with a wiped disk; recovers first. FK_EINVAL when
 * started twice, or RESTORED without a META record; FK_EMALFORMED when a
 * durable META's log has a hole (an ENTRY record missing between the
 * snapshot and the persisted log length): destroy the handle and restart
 * EMPTY with a wiped disk. A META of the other mode is accepted: durable
 * mode then recovers (that disk holds no log), default mode uses only its
 * committed prefix. In durable mode a driver must keep feeding ticks and
 * CONS_IN_PERSISTED: held messages leave in the outbox of a later step. */
int nop_start(struct nop *r, enum nop_start_mode mode, uint64_t now, struct cons_outbox **out);
/* Feeds one input (cons.h). Returns 0, FK_EMALFORMED (message ignored),
 * FK_EINVAL (misuse: not started, unknown input, a persisted cookie never
 * issued), FK_EPOISONED (state machine failure, or a persist item that did
 * not fit the outbox array). */
int nop_step(struct nop *r, const struct cons_input *in, uint64_t now, struct cons_outbox **out);
/* Writes the machine's mark and the undo stash for what the steps since
 * the last seal executed (see "State" above), so that the machine's
 * writes since then describe a state the replica can restart from. A
 * driver calls it before it makes those writes durable together (the
 * server: before each LMDB commit, once per batch of inputs; the
 * simulator: after every step, since a crash may come at any moment);
 * nop_start seals by itself. Writing both at every step cost a NOPaxos
 * leader loading YCSB records 15% of its CPU: a step per kv.oum fragment,
 * dozens per commit. Returns 0 or FK_EPOISONED. */
int nop_seal(struct nop *r);
/* Asserts internal invariants (aborts on violation); those of the
 * machine's mark only right after a seal. */
void nop_invariants(const struct nop *r);
/* The driver is about to stop this replica: a leader in normal status
 * starts the view change to the next view (led by the next replica) and
 * asks its followers to join it, so the group moves on in a round trip
 * instead of a view-change timeout; other replicas do nothing. The outbox
 * holds what to send (durable mode: released as usual once durable). 0,
 * FK_EINVAL (not started), FK_EPOISONED. */
int nop_transfer(struct nop *r, uint64_t now, struct cons_outbox **out);
void nop_status(const struct nop *r, struct nop_stat *st);
/* Writes a one-line account of the replica's protocol state (view, log
 * positions, pending gap agreement, held messages; a leader's view of each
 * follower) into buf, for diagnostics; returns snprintf's count. */
int nop_describe(const struct nop *r, char *buf, size_t cap);
/* If slot `index` <= commit, sets *hash to a hash of its entry; returns 1. */
int nop_committed_hash(const struct nop *r, uint64_t index, uint64_t *hash);
/* The highest OUM message number of *session the replica can take now
 * without taking it for dropped; 0: any. A message beyond its buffer
 * (NOP_OUM_BUF past the next one it expects) counts as dropped, and each
 * drop costs the leader a round of gap agreement and its client a resend:
 * a leader waiting on gap agreement or compaction while hundreds of
 * clients' fragments arrived dropped them all, and every resend again
 * (a NOPaxos cluster loading YCSB records from 4 threads of 64 made no
 * progress at all). So a driver holds the OUM back from the leader here
 * (flow control up to the clients) instead. Followers take everything:
 * one that fetches a state for seconds must not hold every client up, and
 * what it drops it gets from the leader. */
uint64_t nop_oum_intake(const struct nop *r, uint32_t *session);

/* OUM side (the sequencer and the drop detector of libOUM): encode a
 * stamped request, a drop notification or a fill. Return length or
 * FK_ETOOBIG. */
int nop_encode_oum_request(uint8_t *buf, size_t cap, uint32_t session, uint64_t msgnum,
                           const struct cons_op *op);
int nop_encode_oum_drop(uint8_t *buf, size_t cap, uint32_t session, uint64_t msgnum);
int nop_encode_oum_fill(uint8_t *buf, size_t cap, uint32_t session, uint64_t msgnum);

/* Client side: decodes a replica's reply: its view, log slot, whether it
 * carries the result (the leader's) and the reply, whose reply->len bytes
 * *data points at in buf. FK_EMALFORMED otherwise. */
int nop_decode_reply(const uint8_t *buf, size_t len, struct nop_view *view, uint64_t *slot,
                     int *has_result, struct cons_reply *reply, const uint8_t **data);

/* Client side: collects replies for one request until f+1 replicas agree on
 * (view, log slot) and the leader of that view sent the result (section
 * 5.2.1). Replies for other requests are ignored. Caller-owned, no
 * allocation; sizeof is about NOP_QUORUM_CANDS * 8.2 KiB. */
#define NOP_QUORUM_CANDS 4
struct nop_quorum {
    uint32_t n;
    uint64_t client_id, req_no;
    uint32_t ncands;
    struct {
        uint64_t view, slot, mask;
        int have_result;
        struct cons_reply result; /* result.data = bytes */
        uint8_t bytes[NOP_RESULT_MAX];
    } cands[NOP_QUORUM_CANDS];
};

/* Starts collecting for (client_id, req_no) in a group of n replicas. */
void nop_quorum_reset(struct nop_quorum *q, uint32_t n, uint64_t client_id, uint64_t req_no);
/* Adds the reply message buf[0..len) from replica `from`. Returns 1 when
 * the request is complete (*result points into q, valid until the next
 * reset), 0 while pending or for a reply to another request, FK_EMALFORMED
 * for bytes that are not a reply, FK_EPROTO for a result from a replica
 * that does not lead the reply's view. */
int nop_quorum_add(struct nop_quorum *q, uint32_t from, const uint8_t *buf, size_t len,
                   const struct cons_reply **result);

#endif /* NOP_H */
