/*
 * cons_core.h: one interface over both protocol cores (mpx_, nop_).
 *
 * A driver (flowkv-server's srv_node, the simulator, the unit tests) picks
 * a protocol once, with cons_core_ops_of, and from then on talks to the
 * core only through struct cons_core: create, restore, start, step,
 * status, describe, invariants, destroy. Everything protocol-specific
 * (ballots or views, pre-vote or gap agreement) stays inside the core; the
 * contract of every call is cons.h's (inputs in, outbox out, durability by
 * persist cookies), and mpx.h and nop.h document what each protocol does
 * behind it.
 *
 * Thread safety: a core handle belongs to one thread.
 */
#ifndef CONS_CORE_H
#define CONS_CORE_H

#include "cons.h"
#include "cons_wire.h" /* enum cons_proto */
#include "cons_xfer.h"

#include <stddef.h>
#include <stdint.h>

/* A replica's role, as clients and operators see it (the values of
 * proto/fkc_proto.h's enum fkc_role, which asserts it). Multi-Paxos uses FOLLOWER, CANDIDATE,
 * LEADER and RECOVERING; NOPaxos FOLLOWER, LEADER (the leader of a view in
 * normal status), VIEW_CHANGE and RECOVERING. */
enum cons_role {
    CONS_ROLE_FOLLOWER = 1,
    CONS_ROLE_CANDIDATE = 2,
    CONS_ROLE_LEADER = 3,
    CONS_ROLE_RECOVERING = 4,
    CONS_ROLE_VIEW_CHANGE = 5,
};

/* How a core starts (the values of enum mpx_start_mode and nop_start_mode). */
enum cons_start_mode {
    CONS_START_FRESH = 1,    /* a member of a brand-new group */
    CONS_START_RESTORED = 2, /* after restore_meta (and snapshot, entries) from its disk */
    CONS_START_EMPTY = 3,    /* lost its disk: recovers from the others first */
};

/* What both cores need to be created. Fields one protocol does not use are
 * ignored by it (marked); 0 in those means the core's own default. */
struct cons_core_config {
    uint32_t n, id;        /* 2f+1 replicas, 3..CONS_REPLICAS_MAX; this one */
    uint32_t log_cap;      /* in-memory log entries (mpx.h, nop.h: their ranges) */
    uint32_t clients_max;  /* client table rows, 1..CONS_CLIENTS_MAX */
    uint32_t xfer_chunk;   /* state transfer chunk bytes; 0 = CONS_XFER_CHUNK_DEFAULT */
    uint32_t xfer_window;  /* chunks in flight; 0 = CONS_XFER_WINDOW_DEFAULT */
    size_t history_bytes;  /* compacted entries kept (cons_hist.h); 0 = CONS_HISTORY_DEFAULT,
                              CONS_HISTORY_NONE: none (tests of catch-up without it) */
    size_t big_bytes;      /* Multi-Paxos: large values in the log (mpx.h); 0 = the most */
    size_t arena_bytes;    /* outbox arena */
    uint64_t heartbeat_ns; /* leader heartbeat, retransmission period */
    uint64_t election_ns;  /* a follower that hears no leader this long acts */
    uint64_t seed;         /* jitter and recovery nonce; fresh per incarnation */
    uint32_t bugs;         /* planted bugs (enum mpx_bug or nop_bug); 0 in production */
    /* Multi-Paxos only */
    uint32_t window, batch_max, pending_max;
    uint64_t tick_ns;
    uint64_t members; /* the first configuration's members (mpx.h, "Reconfiguration"); 0 = all n */
    uint32_t epoch;   /* its epoch (a new cluster starts in it) */
    /* NOPaxos only: 1 = durable mode (nop.h, "Persistence") */
    uint32_t durable;
};

/* State transfer defaults: 256 KiB chunks, four in flight (1 MiB a
 * receiver, per DESIGN.md a few hundred KiB a chunk). */
#define CONS_XFER_CHUNK_DEFAULT  (256u << 10)
#define CONS_XFER_WINDOW_DEFAULT 4
/* Compacted entries a replica keeps for replicas behind its log
 * (cons_hist.h): 64 MiB, about fifteen seconds of YCSB-B at 70k ops/s with
 * small records, twenty at 40k ops/s with YCSB's default record (a read's
 * entry is about 60 bytes, an update's 150). A follower whose state
 * transfer took longer than that under continuous writes fetches the
 * state again: 16 MiB was outgrown by the 9 s a million default records
 * take to stream (NOPaxos, capacity.sh), and the follower fetched three
 * times. The history costs its bytes of anonymous memory once full. */
#define CONS_HISTORY_DEFAULT (64u << 20)
#define CONS_HISTORY_NONE    ((size_t)-1)

/* A core's state in protocol-neutral terms. */
struct cons_core_status {
    uint8_t role;            /* enum cons_role */
    uint64_t term;           /* Multi-Paxos: ballot promised; NOPaxos: leader_num << 32 | session */
    uint32_t leader;         /* the replica believed to lead, UINT32_MAX if unknown */
    uint64_t commit;         /* every entry <= commit is chosen (committed) here */
    uint64_t applied;        /* every entry <= applied is applied (executed) here */
    uint64_t last;           /* highest log entry held (NOPaxos: the log length) */
    uint64_t dropped;        /* outbox messages dropped (full arena, held ring) */
    uint64_t syncs[4];       /* NOPaxos leader: syncs sent by NOP_SYNC_KIND_* (nop.h); else 0 */
    uint64_t stalls;         /* NOPaxos leader: times it stopped taking requests; else 0 */
    uint64_t holds;          /* NOPaxos leader: serve holds for a state transfer (nop.c); else 0 */
    uint64_t gap_noops;      /* NOPaxos leader: slots gap agreement decided NO-OP; else 0 */
    struct cons_config conf; /* Multi-Paxos: the configuration in force (mpx.h); NOPaxos:
                              * epoch 0, all n */
    uint8_t stateless;       /* its machine waits for a state before it executes (NOPaxos: behind
                              * its ring, in any status); a transfer in is in xfer.receiving */
    struct cons_xfer_stats xfer; /* state transfers (cons_xfer.h); zero where unused */
};

struct cons_core_ops {
    enum cons_proto proto;
    const char *name; /* "multipaxos", "nopaxos" */
    /* Creates a replica applying to sm (borrowed for its lifetime); NULL
     * with *err = FK_EINVAL (bad config) or FK_ENOMEM. */
    void *(*create)(const struct cons_core_config *cfg, struct cons_sm sm, int *err);
    void (*destroy)(void *core); /* safe on NULL */
    /* Before start(RESTORED): META, then the SNAPSHOT if any, then ENTRY
     * records (mpx.h, nop.h: what each accepts and in which order). */
    int (*restore_meta)(void *core, const uint8_t *buf, size_t len);
    int (*restore_snapshot)(void *core, const uint8_t *buf, size_t len);
    int (*restore_entry)(void *core, const uint8_t *buf, size_t len);
    int (*start)(void *core, enum cons_start_mode mode, uint64_t now, struct cons_outbox **out);
    int (*step)(void *core, const struct cons_input *in, uint64_t now, struct cons_outbox **out);
    void (*status)(const void *core, struct cons_core_status *st);
    /* One line for diagnostics (the SIGUSR1 dump); snprintf's count. */
    int (*describe)(const void *core, char *buf, size_t cap);
    /* If entry `index` is chosen (committed) and still in memory, sets
     * *hash to a hash of its operations and returns 1; else 0. */
    int (*committed_hash)(const void *core, uint64_t index, uint64_t *hash);
    void (*invariants)(const void *core); /* aborts on violation */
    /* NOPaxos: before the driver commits the state machine's writes
     * (nop_seal); 0 or FK_EPOISONED. NULL for Multi-Paxos. */
    int (*seal)(void *core);
    /* NOPaxos: the highest ordered-multicast number of *session the core
     * takes now (nop_oum_intake); 0: any. NULL for Multi-Paxos. */
    uint64_t (*oum_intake)(const void *core, uint32_t *session);
    /* The driver is about to stop this replica (SIGTERM): a leader hands
     * over at once (Multi-Paxos: mpx_transfer, Raft's TimeoutNow;
     * NOPaxos: nop_transfer, the view change to the next leader); the
     * outbox carries what to send before stopping (seal it as a step's).
     * 0 or a core error. */
    int (*transfer)(void *core, uint64_t now, struct cons_outbox **out);
};

extern const struct cons_core_ops mpx_core_ops; /* Multi-Paxos (mpx.h) */
extern const struct cons_core_ops nop_core_ops; /* NOPaxos (nop.h) */

/* The ops of a protocol; NULL for an unknown one. */
const struct cons_core_ops *cons_core_ops_of(enum cons_proto proto);

/* A core and its ops: what drivers hold. */
struct cons_core {
    const struct cons_core_ops *ops;
    void *impl;
};

/* Creates core->impl with ops; 0, FK_EINVAL or FK_ENOMEM (core->impl NULL). */
int cons_core_create(struct cons_core *core, const struct cons_core_ops *ops,
                     const struct cons_core_config *cfg, struct cons_sm sm);
/* Destroys the core and clears the handle; safe on an empty handle. */
void cons_core_destroy(struct cons_core *core);

#endif /* CONS_CORE_H */
