/*
 * mpx.h: Multi-Paxos as a pure state machine (cons.h describes the
 * contract: inputs in, outbox out, durability by persist cookies).
 *
 * The protocol (Lamport, "Paxos Made Simple", section 3, with the usual
 * engineering):
 *  - Ballots are (round << 8 | replica id); the leader of a ballot is its
 *    low byte. A follower that has not heard a leader for its election
 *    timeout runs a pre-vote first; peers grant it only if they too have not
 *    heard a leader for an election timeout, so a replica that can still
 *    hear a leader never helps start an election (damping, no ballot
 *    inflation from a partitioned replica).
 *  - Phase 1 covers the whole unchosen suffix: PREPARE(b, from = commit+1);
 *    each PROMISE carries every accepted entry from there on. The new leader
 *    re-proposes, at its ballot, the highest-ballot value for every slot up
 *    to the highest slot it heard of, and NO-OPs in holes.
 *  - Phase 2 is pipelined: up to `window` unchosen slots in flight, each
 *    slot a batch of up to batch_max client operations; unacknowledged
 *    slots are resent on ticks.
 *  - Acceptors acknowledge only after their promise and entry are durable.
 *  - The leader's commit index travels on ACCEPT and on heartbeats (COMMIT);
 *    a follower marks a slot chosen only if it holds the leader's ballot
 *    for it, otherwise it fetches chosen entries (CATCHUP_REQ), which any
 *    replica answers with entries or, when they were compacted there,
 *    COMPACTED: the follower then fetches that replica's state as a
 *    stream of chunks (cons_xfer.h), installed atomically, and goes on
 *    from the index it brought.
 *  - All replicas apply chosen slots in order through the client table; the
 *    leader replies to clients. Reads go through the log (linearizable);
 *    only the leader executes them, the others log them in their client
 *    tables (cons_log_read), as NOPaxos' followers do.
 *  - Compacted chosen entries stay in a history of history_bytes (encoded,
 *    oldest dropped first), from which a follower somewhat behind the ring
 *    catches up, as etcd keeps entries after a snapshot: above all one
 *    that just installed a transferred state, while the leader moved on
 *    further than its ring during the transfer (without it such a
 *    follower fetched the state again and again under load).
 *  - The state is the state machine's (cons.h): after each applied slot
 *    the core sets the machine's mark (applied index, table clock), and
 *    the table's rows live in the machine too. So log compaction copies
 *    nothing: once applied - snap_index reaches log_cap/2 the replica
 *    drops that prefix and persists a SNAPSHOT record that only says where
 *    the log now starts (the server writes the machine's changes in the
 *    same transaction, so the disk's state is always at its mark).
 *  - Restart with persisted state: restore META, the SNAPSHOT record (the
 *    log's start) and ENTRY records (mpx_restore_*), then
 *    mpx_start(MPX_START_RESTORED), which reads the machine's mark and
 *    rows back (cons_sm_load) and keeps only the entries after the mark:
 *    restart time is the log window, not the data. Restart without state:
 *    mpx_start(MPX_START_EMPTY) runs recovery (mpx_recover.c): it learns a
 *    new generation from f+1 others, announces it to f+1 others, who each
 *    make it durable before answering with their applied index and the
 *    entries after it; it keeps, after the highest such index, the entries
 *    of the highest ballot (phase 1's rule) and the highest promise,
 *    fetches a state at or past that index (phase 3, cons_xfer.h),
 *    persists all of it, and only then takes part again. Every vote
 *    carries the voter's crash vector (the highest generation it knows of
 *    each replica), so a vote cast by an incarnation that has since lost
 *    its disk is never counted together with votes cast after its recovery
 *    (Michael et al., DISC 2017): this keeps every quorum intersection
 *    argument intact though a disk was lost. Ballots carry the owner's
 *    generation, so no two incarnations ever propose at one ballot.
 *
 * Reconfiguration (the replica set changes at run time): the cluster's
 * replicas are ids 0..n-1; a configuration (cons_config) says which of
 * them vote, the members, from an epoch on; the others are learners, which
 * follow the leader, log, apply and serve catch-up and state like any
 * follower but never start an election and whose votes are not counted
 * (etcd's learners; a replica added to a cluster runs as one until it
 * caught up). A change is a CONS_OP_CONFIG request naming the current
 * epoch and the new members, committed through the log like any write
 * (Lamport, Malkhi and Zhou, "Stoppable Paxos", 2008, and VR Revisited's
 * epochs, Liskov and Cowling 2012, section 7):
 *  - The leader takes it only when no other change is in its log, when
 *    the epoch is the current one and every new member acknowledged
 *    entries near its commit point (caught up through the log or the
 *    streamed state transfer); else FK_EBUSY. It proposes it alone in its
 *    slot i and then nothing after it: i is a stop sign. The members of
 *    the current epoch decide every slot up to i; the new members every
 *    slot after it, and only once i is applied.
 *  - A new leader's phase 1 keeps that true (Stoppable Paxos' rule): with
 *    a change at i in its merged suffix, an entry after i at a higher
 *    ballot proves the change was not chosen (its proposer's phase 1 would
 *    have found it and stopped there), so i becomes a NO-OP; otherwise no
 *    entry after i can have been chosen (the change's proposer would have
 *    found it in its phase 1 and placed the change after it), and the
 *    suffix ends at i.
 *  - Applying i (every replica, at the same slot) moves to the new epoch
 *    and members and answers the client. A leader that stays a member
 *    runs phase 1 again at once among the new members (they may have
 *    promised nothing to it); one that is no longer a member asks the most
 *    advanced new member to start it (TIMEOUT_NOW) and follows. Quorums
 *    are majorities of the members, every vote counted only from a member
 *    of the counter's configuration. The configuration in force is part
 *    of the state at an index, as in Raft's snapshots (Ongaro's thesis,
 *    section 5.1): it is in META with the machine's mark, and a transfer
 *    carries the one in force at its view (cons_xfer_io.describe), so a
 *    replica always knows the configuration at the slot it applied; a
 *    sender whose configuration is newer than a view refuses it.
 *  - A replica that lost its disk recovers from the members of the newest
 *    configuration its answers report, as many of them (others than
 *    itself) as meet every majority of those members
 *    (mpx_recover.c): they have applied that configuration's change, so
 *    every slot of an older epoch is chosen and in the state they give.
 *
 * Thread safety: a handle belongs to one thread.
 */
#ifndef MPX_H
#define MPX_H

#include "cons.h"
#include "cons_xfer.h"

#include <stddef.h>
#include <stdint.h>

/* Test-only switches that plant known bugs, so the simulator can prove its
 * checkers fail. Never set outside tests. */
enum mpx_bug {
    MPX_BUG_APPLY_UNCOMMITTED = 1u << 0, /* followers apply slots as soon as accepted */
    MPX_BUG_LOCAL_READS = 1u << 1,       /* a leader answers GET from local state */
    MPX_BUG_NO_MERGE = 1u << 2,          /* phase 1 ignores values in promises */
    MPX_BUG_STALE_VOTES = 1u << 3,       /* votes of an incarnation that lost its disk count */
    MPX_BUG_STALE_ROWS = 1u << 4,        /* a transferred state's client rows are not loaded */
    /* a replica promises and accepts a newer epoch's ballots before it
     * applied the change that started the epoch (as plain Paxos would) */
    MPX_BUG_CONFIG_NO_WAIT = 1u << 5,
};

struct mpx_config {
    uint32_t n;           /* replicas, odd, 3..CONS_REPLICAS_MAX, members or learners */
    uint32_t id;          /* this replica, 0..n-1 */
    uint64_t members;     /* the first configuration's members, a mask of ids < n (0: all n) */
    uint32_t epoch;       /* its epoch, < MPX_EPOCH_MAX (a new cluster starts in it; 0 mostly) */
    uint32_t log_cap;     /* in-memory log slots, power of two, 8..CONS_LOG_CAP_MAX */
    uint32_t window;      /* unchosen slots in flight, 1..log_cap/4 */
    uint32_t batch_max;   /* ops per slot, 1..CONS_BATCH_MAX */
    uint32_t pending_max; /* client requests queued at the leader, 1..65536 */
    uint32_t clients_max; /* client table rows, 1..CONS_CLIENTS_MAX */
    uint32_t xfer_chunk;  /* bytes a state transfer chunk aims at, 1..1 MiB (cons_xfer.h) */
    uint32_t xfer_window; /* transfer chunks in flight, 1..CONS_XFER_WINDOW_MAX */
    size_t history_bytes; /* compacted chosen entries kept for catch-up (0: none) */
    /* Bytes of ops held outside their slot (cons_op_store: values over
     * CONS_OP_INLINE). The leader proposes while its log holds at most
     * this many; a replica's log holds at most twice as many, and a
     * PROMISE, which carries the whole log, fits CONS_MSG_MAX with them.
     * 0: the most that fits (mpx.c, big_default); else at least 4 KiB, and
     * a request with more bytes is answered FK_EVALSIZE. */
    size_t big_bytes;
    size_t arena_bytes; /* outbox arena, >= 64 KiB */
    uint64_t tick_ns;   /* how often the driver ticks (informational) */
    uint64_t heartbeat_ns;
    uint64_t election_ns; /* timeout drawn from [election_ns, 2*election_ns) */
    uint64_t seed;        /* election jitter and recovery nonce; fresh per incarnation */
    uint32_t bugs;        /* enum mpx_bug; 0 in production */
};

enum mpx_role { MPX_FOLLOWER = 1, MPX_CANDIDATE = 2, MPX_LEADER = 3, MPX_RECOVERING = 4 };

enum mpx_start_mode {
    MPX_START_FRESH = 1,    /* a member of a brand-new group: empty state is the truth */
    MPX_START_RESTORED = 2, /* state came back through mpx_restore_* */
    MPX_START_EMPTY = 3,    /* lost its disk: recover from the others */
};

struct mpx_status {
    uint8_t role;
    uint64_t promised; /* highest ballot promised */
    uint32_t leader;   /* believed leader id, or UINT32_MAX */
    uint64_t commit;   /* every slot <= commit is chosen here */
    uint64_t applied;  /* every slot <= applied is applied here */
    uint64_t snap_index;
    uint64_t last;           /* highest slot holding an entry */
    uint64_t dropped;        /* outbox messages dropped (full) */
    struct cons_config conf; /* the configuration in force here */
    uint64_t conf_slot;      /* the slot whose change started it (0: epoch 0) */
    struct cons_xfer_stats xfer;
};

struct mpx;

/* Creates a replica. sm is borrowed for the replica's lifetime. Allocates
 * everything the replica will ever use; the arithmetic is in mpx.c. On
 * failure returns NULL and sets *err to FK_EINVAL (bad config) or
 * FK_ENOMEM. The replica does nothing until mpx_start. */
struct mpx *mpx_create(const struct mpx_config *cfg, struct cons_sm sm, int *err);
void mpx_destroy(struct mpx *r);

/* Restore persisted records before mpx_start(MPX_START_RESTORED): META and
 * the SNAPSHOT record (if any: where the log starts) first, then every
 * ENTRY the disk holds above its index; the state itself is the state
 * machine's, read back at start. buf is the bytes of a persist item of that kind,
 * borrowed for the call. FK_EMALFORMED on bad bytes; FK_EINVAL after start
 * or for an entry beyond snapshot index + log_cap (an entry at or below
 * the snapshot index is ignored: 0). A disk without a META record holds no
 * complete state: wipe it and start with MPX_START_EMPTY. */
int mpx_restore_meta(struct mpx *r, const uint8_t *buf, size_t len);
int mpx_restore_snapshot(struct mpx *r, const uint8_t *buf, size_t len);
int mpx_restore_entry(struct mpx *r, const uint8_t *buf, size_t len);

/* Starts the replica at time now; may fill the outbox (*out). FK_EINVAL if
 * started twice or RESTORED without a META record. */
int mpx_start(struct mpx *r, enum mpx_start_mode mode, uint64_t now, struct cons_outbox **out);

/* Feeds one input at time now (monotonic ns) and returns the outbox in *out
 * (valid until the next call). Returns 0; FK_EMALFORMED for a message that
 * failed to decode (ignored, nothing changed); FK_EINVAL for a misuse (not
 * started, persisted cookie never issued); FK_EPOISONED once a state
 * machine or persistence failure poisoned the replica (every later call
 * returns it too). */
int mpx_step(struct mpx *r, const struct cons_input *in, uint64_t now, struct cons_outbox **out);

/* The driver is about to stop this replica: a leader asks the follower
 * that acknowledged the highest slot to start phase 1 at once (TIMEOUT_NOW,
 * as Raft's leadership transfer, Ongaro's thesis section 3.10) and
 * becomes a follower; other roles do nothing. The outbox holds the
 * message. 0, FK_EINVAL (not started), FK_EPOISONED. */
int mpx_transfer(struct mpx *r, uint64_t now, struct cons_outbox **out);

/* Asserts the replica's internal invariants (aborts on violation). */
void mpx_invariants(const struct mpx *r);
void mpx_status(const struct mpx *r, struct mpx_status *st);
/* For cross-replica checks: if slot `index` is chosen here and still in
 * memory, sets *hash to a hash of its operations and returns 1; else 0. */
int mpx_chosen_hash(const struct mpx *r, uint64_t index, uint64_t *hash);

/* Client side (pure helpers for libflowkv and the simulator). */
/* Encodes a request for op into buf; returns its length or FK_ETOOBIG. */
int mpx_encode_request(uint8_t *buf, size_t cap, const struct cons_op *op);
/* Decodes a reply message: its fields into *reply, and *data points at
 * its reply->len bytes in buf. *leader_hint is the replica the sender
 * believes leads (UINT32_MAX if unknown); reply->status FK_ENOTLEADER
 * means "ask another replica". FK_EMALFORMED for anything else. */
int mpx_decode_reply(const uint8_t *buf, size_t len, struct cons_reply *reply, const uint8_t **data,
                     uint32_t *leader_hint);

#endif /* MPX_H */
