/*
 * mpx_internal.h: Multi-Paxos replica internals shared by mpx*.c. Not a
 * public header: the server and simulator use mpx.h only.
 */
#ifndef MPX_INTERNAL_H
#define MPX_INTERNAL_H

#include "cons.h"
#include "cons_hist.h"
#include "cons_wire.h"
#include "cons_xfer.h"
#include "mpx.h"

#include <stdint.h>

enum mpx_type {
    MPX_REQUEST = 1,        /* client -> replica: body op */
    MPX_REPLY = 2,          /* replica -> client: u32 leader hint, reply */
    MPX_PREVOTE = 3,        /* term = ballot the sender would use; u64 commit */
    MPX_PREVOTE_OK = 4,     /* term = that ballot; u8 granted */
    MPX_PREPARE = 5,        /* term = ballot; u64 from_index */
    MPX_PROMISE = 6,        /* term = ballot; crash vector, u64 snap_index, u64 commit, entries */
    MPX_NACK = 7,           /* term = the sender's promised ballot */
    MPX_ACCEPT = 8,         /* term = ballot; u64 commit, entries */
    MPX_ACCEPTED = 9,       /* term = ballot; crash vector, u32 n, u64 index[n] */
    MPX_COMMIT = 10,        /* term = ballot; u64 commit (the heartbeat) */
    MPX_CATCHUP_REQ = 11,   /* u64 from_index */
    MPX_CATCHUP = 12,       /* u64 commit, entries (all chosen) */
    MPX_XFER = 13,          /* u8 kind, a state transfer message (cons_xfer.h) */
    MPX_RECOVER = 14,       /* u64 nonce, u64 gen (0: "what is my generation?") */
    MPX_RECOVER_REPLY = 15, /* u64 nonce, u64 promised, crash vector, u64 applied, conf, entries */
    MPX_RECOVER_GEN = 16,   /* u64 nonce, u64 the asker's generation as known here, conf */
    MPX_COMPACTED = 17,     /* u64 snap_index: the entries asked for are compacted here */
    MPX_TIMEOUT_NOW = 18,   /* term = the leader's ballot; u64 0: "start phase 1 now" */
    MPX__TYPES
};

/* Bytes of one encoded entry (mpx__put_entry): the leader adds ops to an
 * entry while it stays within this, and one op always fits. */
#define MPX_ENTRY_HDR 17 /* u64 index, u64 ballot, u8 nops */
#define MPX_ENTRY_MAX (MPX_ENTRY_HDR + CONS_WIRE_OP_MAX)
/* Bytes of an encoded entry of batch_max ops whose bytes are inline: what
 * every slot may hold outside the big-op budget. */
#define MPX_ENTRY_INLINE(batch_max)                                                                \
    (MPX_ENTRY_HDR + (size_t)(batch_max) * (sizeof(struct cons_wire_op) + CONS_OP_INLINE))
/* Entries in one ACCEPT/CATCHUP/PROMISE message: a bound on message size. */
#define MPX_MSG_ENTRIES 16
/* Indexes in one ACCEPTED message. */
#define MPX_ACK_IDX_MAX 64
/* Persists awaiting durability whose acknowledgement is held back. */
#define MPX_HELD_MAX 256
_Static_assert(MPX_ACK_IDX_MAX <= 255, "ack count fits a byte of headroom");

/* A ballot (mpx_paxos.c next_ballot): epoch << 48 | round << 24 |
 * generation << 8 | owner id, compared as a number, so that every ballot
 * of a newer configuration (mpx.h, "Reconfiguration") is above every
 * ballot of an older one. */
#define MPX_GEN_MASK  0xffffull
#define MPX_ROUND_MAX 0xffffffu
#define MPX_EPOCH_MAX 0xffffu
static inline uint32_t mpx__ballot_epoch(uint64_t b)
{
    return (uint32_t)(b >> 48);
}

/* A configuration on the wire ("conf" above): u32 epoch, u64 members,
 * u64 the slot of the change that started it, u64 the members before it
 * (mpx__put_conf). */
#define MPX_CONF_BYTES 28

/* A crash vector on the wire: u8 n, then n u64 generations. */
#define MPX_CV_BYTES(n) (1 + 8 * (size_t)(n))

/* A decoded, fully validated message. Variable parts stay in the input
 * buffer; `ents` re-reads them (validation already passed). */
struct mpx_msg {
    uint8_t type;
    uint32_t from;
    uint64_t term;
    uint64_t u1, u2, u3; /* per type: see enum mpx_type (XFER: u1 = kind) */
    uint32_t nents;
    struct cons_rbuf ents; /* PROMISE, ACCEPT, CATCHUP, RECOVER_REPLY */
    const uint8_t *body;   /* XFER: the cons_xfer message */
    uint32_t body_len;
    uint32_t nidx; /* ACCEPTED */
    const uint8_t *idx;
    uint32_t hint; /* REPLY */
    uint32_t ncv;  /* PROMISE, ACCEPTED, RECOVER_REPLY: the sender's crash vector */
    const uint8_t *cv;
    struct cons_config conf; /* RECOVER_GEN, RECOVER_REPLY: the sender's */
    uint64_t conf_slot, conf_prev;
};

/* One log slot. The ring holds index i at slots[i & (log_cap - 1)]. */
struct mpx_slot {
    uint64_t index;  /* 0 = empty */
    uint64_t ballot; /* ballot of the accepted (or merged) value */
    uint64_t acks;   /* leader: replicas that durably accepted at my ballot */
    uint64_t sent_ns;
    uint8_t chosen;
    uint8_t nops;
    struct cons_op *ops;   /* batch_max ops, preallocated */
    struct cons_big *bigs; /* their bytes beyond CONS_OP_INLINE (in log_big) */
};

/* An acknowledgement released once persist `cookie` is durable. */
struct mpx_held {
    uint64_t cookie;
    uint8_t type; /* MPX_PROMISE, MPX_ACCEPTED or MPX_RECOVER_REPLY */
    uint32_t to;
    uint64_t ballot; /* RECOVER_REPLY: the nonce */
    uint64_t index;  /* ACCEPTED: the slot; PROMISE: from_index; RECOVER_REPLY: gen */
};

struct mpx {
    struct mpx_config cfg;
    struct cons_sm sm;
    struct cons_ctab ctab;
    /* Reconfiguration (mpx.h): the configuration in force, the slot of the
     * change that started it and its quorum (a majority of its members);
     * stop_at, the slot of a change in the log past the commit point (0:
     * none), past which a leader proposes nothing; leader: the highest
     * slot each replica acknowledged (a new member must be near the
     * commit point). */
    struct cons_config conf;
    uint64_t conf_slot, stop_at;
    uint64_t prev_members; /* the members before the change at conf_slot (0: epoch 0) */
    uint32_t quorum;
    uint64_t progress[CONS_REPLICAS_MAX];
    uint8_t role, started, poisoned;
    uint64_t rng;

    /* Acceptor state (META is promised, gen and known). */
    uint64_t promised, max_seen;
    /* The crash vector (mpx_recover.c): gen is this incarnation's
     * generation, known[p] the highest generation of replica p heard of;
     * known[cfg.id] == gen. */
    uint64_t gen;
    uint64_t known[CONS_REPLICAS_MAX];
    uint32_t leader;
    uint64_t commit, applied, snap_index, last;
    struct mpx_slot *slots;
    struct cons_op *op_pool;
    struct cons_big *big_pool;   /* log_cap * batch_max, the slots' bigs */
    struct cons_bigpool log_big; /* max: twice cfg.big_bytes (mpx.h) */

    /* Persistence. */
    uint64_t next_cookie, durable;
    struct mpx_held held[MPX_HELD_MAX];
    uint32_t held_head, held_n;
    uint8_t meta_seen;

    /* Timers. */
    uint64_t now, last_heard, election_deadline, next_heartbeat, catchup_sent;

    /* Candidate and leader. */
    uint64_t votes, promises, cand_since;
    uint64_t next_index; /* leader: next slot to propose */
    struct cons_op *pending;
    struct cons_big *pend_big;     /* pending_max, the queue's bigs */
    struct cons_bigpool pend_bigs; /* max: cfg.big_bytes */
    uint32_t pend_head, pend_n;

    /* Recovery: phase 1 learns a generation, phase 2 the state. */
    uint64_t nonce, rec_from;
    uint32_t rec_n;
    uint8_t rec_phase;
    uint64_t rec_gen;                      /* phase 1: highest heard; phase 2: the new generation */
    uint64_t rec_cv[CONS_REPLICAS_MAX];    /* phase 2: the responders' vectors, merged */
    uint64_t rec_their[CONS_REPLICAS_MAX]; /* phase 2: each responder's own generation */
    uint64_t rec_promised;
    uint64_t rec_index;          /* phase 2: the most advanced responder's applied index */
    uint32_t rec_best;           /* ... and that responder: phase 3 fetches the state from it */
    uint8_t rec_fetch;           /* phase 3: the state transfer runs */
    struct cons_config rec_conf; /* the newest configuration the answers report */
    uint64_t rec_conf_slot, rec_conf_prev;
    uint32_t rec_epoch[CONS_REPLICAS_MAX]; /* each answerer's epoch, as it reported */

    /* State transfer, both ways (cons_xfer.h). */
    struct cons_xfer xfer;

    /* Compacted chosen entries, each as mpx__put_entry encodes it (mpx.h). */
    struct cons_hist hist;
    uint8_t *hist_scratch; /* one encoded entry */

    /* Buffers. */
    struct cons_reply reply;
    struct cons_op scratch_op;
    struct cons_op *scratch_batch; /* batch_max ops for entries we skip */
    uint64_t prevote_ballot;       /* nonzero while a pre-vote runs */
    uint64_t rec_wait;             /* recovery: cookie of the final META */
    struct cons_outbox ob;
};

/* mpx_msg.c */
/* Decodes and fully validates a message; batches above max_batch ops are
 * malformed. op receives a REQUEST's operation. */
int mpx__decode(const uint8_t *buf, size_t len, struct mpx_msg *m, struct cons_op *op,
                uint32_t max_batch);
/* Reads one entry into ops[0..max_ops). */
int mpx__entry_next(struct cons_rbuf *r, uint64_t *index, uint64_t *ballot, uint8_t *nops,
                    struct cons_op *ops, uint32_t max_ops);
void mpx__put_entry(struct cons_wbuf *w, const struct mpx_slot *s);
/* Starts a message in the outbox arena. */
void mpx__begin(struct mpx *r, struct cons_wbuf *w, uint8_t type, uint64_t term);
/* Finishes and queues it to `to` (dropped when it does not fit). */
void mpx__send(struct mpx *r, struct cons_wbuf *w, struct cons_addr to);
void mpx__send_simple(struct mpx *r, struct cons_addr to, uint8_t type, uint64_t term, uint64_t u1);
/* Writes this replica's configuration (MPX_CONF_BYTES). */
void mpx__put_conf(const struct mpx *r, struct cons_wbuf *w);
/* Writes this replica's crash vector (known[0..n)). */
void mpx__put_cv(const struct mpx *r, struct cons_wbuf *w);
/* Reads generation p of a validated crash vector. */
uint64_t mpx__cv_get(const struct mpx_msg *m, uint32_t p);
void mpx__send_entries(struct mpx *r, struct cons_addr to, uint8_t type, uint64_t term, uint64_t u1,
                       uint64_t lo, uint64_t hi, int chosen_only);
void mpx__reply(struct mpx *r, uint64_t client, const struct cons_reply *rep);
/* As mpx__reply, naming `hint` as the leader (UINT32_MAX: unknown). */
void mpx__reply_hint(struct mpx *r, uint64_t client, const struct cons_reply *rep, uint32_t hint);

/* mpx.c helpers used by mpx_msg.c / mpx_recover.c */
/* After a transfer installed a state: the configuration in force there,
 * from the sender's descriptor of the view (mpx.c). */
void mpx__adopt_desc(struct mpx *r);
/* Puts configuration c, started by the change at slot from members
 * prev, in force. */
void mpx__set_conf(struct mpx *r, const struct cons_config *c, uint64_t slot, uint64_t prev);
static inline int mpx__member(const struct mpx *r, uint32_t p)
{
    return (int)(r->conf.members >> p & 1);
}
/* Whether the replicas in `votes` include a majority of the members. */
static inline int mpx__quorate(const struct mpx *r, uint64_t votes)
{
    return (uint32_t)__builtin_popcountll(votes & r->conf.members) >= r->quorum;
}
/* Whether slot s holds a configuration change (alone in it: propose). */
static inline int mpx__is_change(const struct mpx_slot *s)
{
    return s->nops == 1 && s->ops[0].type == CONS_OP_CONFIG;
}
struct mpx_slot *mpx__slot(struct mpx *r, uint64_t index);
const struct mpx_slot *mpx__cslot(const struct mpx *r, uint64_t index);
void mpx__persist_entry(struct mpx *r, const struct mpx_slot *s);
void mpx__persist_meta(struct mpx *r);
/* Persists the compaction point: the log up to index may go (the state
 * machine holds it, cons.h). */
void mpx__persist_trim(struct mpx *r, uint64_t index);
/* The state machine now holds the state a transfer brought: reload the
 * client table and move the log past it. Returns its index, 0 when the
 * replica must stop (poisoned). */
uint64_t mpx__adopt_state(struct mpx *r);
/* Sends `to` the chosen entries from index `from` on that the history
 * holds (up to half a ring of them), as CATCHUP; 0, or -1 when it holds
 * none from there (the entries are gone: the asker needs the state). */
int mpx__send_history(struct mpx *r, uint32_t to, uint64_t from);
/* Feeds an XFER message to the transfer (serving only when `serve`);
 * returns 1 when it completed a transfer into this replica. */
int mpx__xfer_msg(struct mpx *r, const struct mpx_msg *m, uint64_t serve);
void mpx__apply_committed(struct mpx *r);
void mpx__become_follower(struct mpx *r);
uint64_t mpx__rand(struct mpx *r);

/* mpx_paxos.c */
/* The leader hands over (mpx_transfer). */
void mpx__transfer(struct mpx *r);
/* After the slot just applied changed the configuration (mpx.h). */
void mpx__conf_changed(struct mpx *r);
void mpx__dispatch(struct mpx *r, const struct mpx_msg *m, const struct cons_op *op,
                   const struct cons_input *in);
void mpx__tick(struct mpx *r);
void mpx__release_held(struct mpx *r);
void mpx__hold(struct mpx *r, uint8_t type, uint32_t to, uint64_t ballot, uint64_t index);
void mpx__reset_election(struct mpx *r);
/* Decodes the next entry of m into slot s (when s) or skips it. Returns 0,
 * or FK_EFULL when s has no room for its big ops (log_big; s unchanged:
 * the caller treats the message as lost). */
int mpx__entry_into(struct mpx *r, struct cons_rbuf *rd, struct mpx_slot *s);
/* Stores ops[0..nops) in slot s (all or, on FK_EFULL, nothing). */
int mpx__slot_store(struct mpx *r, struct mpx_slot *s, const struct cons_op *ops, uint8_t nops);
/* Empties slot s, giving its big ops' room back. */
void mpx__slot_clear(struct mpx *r, struct mpx_slot *s);
/* Encoded bytes of one op in an entry. */
static inline size_t mpx__op_bytes(const struct cons_op *op)
{
    return sizeof(struct cons_wire_op) + cons_op_nbytes(op);
}
/* Encoded bytes of slot s's entry. */
size_t mpx__entry_bytes(const struct mpx_slot *s);
void mpx__entry_peek(const struct cons_rbuf *rd, uint64_t *index, uint64_t *ballot);
void mpx__learn_commit(struct mpx *r, uint64_t ballot, uint64_t commit, uint32_t from);

/* mpx_recover.c */
/* Merges a sender's crash vector into known[]; forgets the counted votes
 * of every replica whose known generation rose. Returns 0 if the sender's
 * own generation is current (its vote counts), -1 if it is stale or the
 * vector is not this group's. */
int mpx__cv_merge(struct mpx *r, const struct mpx_msg *m);
/* Forgets every vote of replica p counted by this candidate or leader. */
void mpx__forget_votes(struct mpx *r, uint32_t p);
void mpx__release_recover_reply(struct mpx *r, uint32_t to, uint64_t nonce, uint64_t gen);
void mpx__on_recover_gen(struct mpx *r, const struct mpx_msg *m);
void mpx__recover_start(struct mpx *r);
void mpx__recover_tick(struct mpx *r);
void mpx__on_recover(struct mpx *r, const struct mpx_msg *m);
void mpx__on_recover_reply(struct mpx *r, const struct mpx_msg *m);
/* Phase 3 done: the state arrived; persist everything and rejoin. */
void mpx__recover_fetched(struct mpx *r);

#endif /* MPX_INTERNAL_H */
