/*
 * sim_internal.h: the simulated world shared by sim.c (world, network,
 * disks, faults, the Multi-Paxos driver) and sim_nop.c (the NOPaxos
 * driver: sequencer, OUM, f+1 reply collection). Not a public header.
 */
#ifndef SIM_INTERNAL_H
#define SIM_INTERNAL_H

#include "cons.h"
#include "cons_core.h"
#include "kv.h"
#include "lin.h"
#include "mpx.h"
#include "nop.h"
#include "seqctl.h"
#include "sim.h"

#include <stddef.h>
#include <stdint.h>

#define MS ((uint64_t)1000000)

/* Core configuration for every simulated replica: a small log ring so
 * compaction, snapshot catch-up and window stalls happen often. */
#define SIM_LOG_CAP 32
/* NOPaxos: a small ring, so checkpoints, state transfer and the leader's
 * pause at half a ring happen often. */
#define SIM_NOP_LOG_CAP 64
/* Entry records a simulated disk holds (slot index % this): at least
 * either protocol's log ring, so entries after the snapshot never collide. */
#define SIM_DISK_SLOTS 64
_Static_assert(SIM_DISK_SLOTS >= SIM_LOG_CAP && SIM_DISK_SLOTS >= SIM_NOP_LOG_CAP,
               "the disk holds a whole ring after the snapshot");
#define SIM_TICK_NS   (5 * MS)
#define SIM_RETRY_NS  (120 * MS)
#define SIM_FAULT_NS  (2000 * MS)
#define SIM_LIVE_NS   (10000 * MS)
#define SIM_SETTLE_NS (600 * MS)

enum ev_kind {
    EV_MSG = 1,
    EV_TICK,
    EV_DISK,
    EV_CLIENT,
    EV_FAULT,
    EV_RESTART,
    EV_HEAL,
    EV_AMNESIA,
    EV_SEQCTL, /* NOPaxos: a round of the sequencer failover decision (sim_nop.c) */
    EV_ADMIN,  /* reconfig: the administrator's timer (sim.c) */
};

/* A NOPaxos sequencer a replica's process hosts (sim_nop.c). */
struct sim_seq {
    uint8_t live;
    uint32_t session;
    uint64_t msgnum;
};

struct smsg {
    struct cons_addr from, to;
    uint32_t len;
    uint8_t data[];
};

struct ev {
    uint64_t t, seq;
    uint8_t kind;
    uint32_t who, inc;
    uint64_t arg;
    struct smsg *m;
};

struct prec { /* a persist the disk has not completed */
    uint8_t kind;
    uint64_t cookie, index;
    uint32_t len;
    uint8_t *buf;
};

struct blob {
    uint8_t *buf;
    uint32_t len;
    uint64_t index;
};

struct rep {
    struct cons_core core; /* either protocol (cons_core.h) */
    struct kv_mem *kv;
    int up, disk_busy, side;
    uint32_t inc;
    struct blob meta, snap, ents[SIM_DISK_SLOTS];
    /* The state machine as the disk holds it (cons_sm_save's stream and
     * the core's stash): the image after the latest step rides with the
     * persists queued so far (one LMDB transaction in the server) and
     * lands when they do. */
    struct blob sm_disk, sm_queued;
    uint64_t sm_version; /* kv_mem_version when sm_queued was taken */
    struct prec *pq;
    size_t pq_n, pq_cap;
    uint64_t checked;
};

struct client {
    uint64_t id, req_no, next_val;
    struct nop_quorum q; /* NOPaxos: replies gathered for the current request */

    struct cons_op op;
    uint8_t op_bytes[3 + 2 * SIM_VAL_MAX]; /* op's key, value and expected when not inline */
    int busy;
    uint32_t target, gen, done;
    size_t hist;
    uint64_t seen[SIM_KEYS_MAX];
};

struct world {
    const struct sim_opts *o;
    int tearing_down;                /* crash() at the end of a run is no fault */
    uint8_t *sm_img;                 /* scratch for a state machine image (sim.c) */
    const struct cons_core_ops *ops; /* the protocol, picked once */
    struct sim_result *res;
    uint64_t rng, now, seq;
    struct ev *heap;
    size_t heap_n, heap_cap;
    uint32_t n, f, nclients, nkeys;
    struct rep reps[CONS_REPLICAS_MAX];
    struct client cl[SIM_CLIENTS_MAX];
    struct lin_op *hist;
    size_t hist_n, hist_cap;
    uint64_t *chosen;
    size_t chosen_cap;
    double drop_p, dup_p;
    uint64_t delay_max, disk_max, fault_end;
    int partitioned, healed, failed;
    /* NOPaxos sequencers (sim_nop.c): the one each replica's process
     * hosts, the declaration each replica knows (where the sequencer runs,
     * its session), each replica's failover controller (consensus/
     * seqctl.h, the server's decision) and the session floor its disk
     * keeps (one more at each start); per replica the time of its last OUM
     * delivery, so each sees numbers in order. */
    struct sim_seq seqs[CONS_REPLICAS_MAX];
    uint32_t decl_host[CONS_REPLICAS_MAX], decl_session[CONS_REPLICAS_MAX];
    struct seqctl seqctl[CONS_REPLICAS_MAX];
    uint32_t seq_floor[CONS_REPLICAS_MAX];
    uint32_t seq_seen[CONS_REPLICAS_MAX]; /* the highest session delivered to each (memory) */
    uint64_t oum_last[CONS_REPLICAS_MAX];
    /* The leader and victim of the amnesia-in-the-minority fault (sim.c). */
    uint32_t am_leader, am_victim;
    /* reconfig: the administrator, a client of its own outside the
     * history (sim.c, admin_*). */
    struct admin {
        struct cons_op op;
        uint64_t req_no;
        uint32_t target, gen;
        int busy, again; /* again: the last answer was FK_EAGAIN (cons.h) */
    } admin;
};

uint64_t sim__rnd(struct world *w);
uint64_t sim__urange(struct world *w, uint64_t lo, uint64_t hi);
double sim__ufrac(struct world *w);
void sim__fail(struct world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sim__say(struct world *w, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sim__at(struct world *w, uint64_t dt, uint8_t kind, uint32_t who, uint32_t inc, uint64_t arg,
             struct smsg *m);
/* A copy of a message for the event queue (owned by the event). */
struct smsg *sim__msg(struct cons_addr from, struct cons_addr to, const uint8_t *buf, uint32_t len);
/* Records client c's reply (history, statistics) and schedules its next op. */
void sim__client_done(struct world *w, struct client *c, const struct cons_reply *rep);

/* Queues a core's outbox: messages to the network, persists to its disk. */
void sim__take_outbox(struct world *w, uint32_t i, const struct cons_outbox *ob);

/* Whether the network separates replicas a and b now (a partition). */
int sim__cut(const struct world *w, uint32_t a, uint32_t b);

/* sim_nop.c */
void sim__nop_client_send(struct world *w, struct client *c);
void sim__nop_client_msg(struct world *w, struct client *c, const struct smsg *m);
/* The sequencer at the start: hosted by the first replica of the failover
 * order, known to all; the first round of the decision scheduled. */
void sim__nop_seq_init(struct world *w);
/* Replica i's process started again (after crash), or ended. */
void sim__nop_seq_boot(struct world *w, uint32_t i);
void sim__nop_seq_crash(struct world *w, uint32_t i);
/* Replica i stops gracefully: it hands the sequencer it hosts over. */
void sim__nop_seq_handoff(struct world *w, uint32_t i);
/* One round of every replica's failover decision (EV_SEQCTL). */
void sim__nop_seq_round(struct world *w);
/* The replica hosting the sequencer most replicas know of (faults aim at
 * it), or SEQCTL_NONE. */
uint32_t sim__nop_seq_host(const struct world *w);

#endif /* SIM_INTERNAL_H */
