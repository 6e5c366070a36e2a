/*
 * core_fix.h: one fixture for the protocol cores' unit tests
 * (test_mpx_core.c, test_nop_core.c, test_nop_restart.c,
 * test_nop_durable.c): a group of replicas of either protocol driven
 * through cons_core.h, as the server and the simulator drive them, each
 * with an in-memory machine (kv_mem) and an in-test disk, on an in-test
 * network.
 *
 * The network: CFX_DIRECT delivers each message at once, depth first (a
 * step's outbox is copied, then delivered message by message, each
 * receiving step delivering its own before the next); CFX_QUEUED appends
 * to a queue that cfx_pump empties in order. Messages to a replica in
 * `down` are lost. A test sees every message first (hooks.route: return 1
 * to take it, e.g. to hold or delay it) and gets the client replies
 * (hooks.reply).
 *
 * The disk: CFX_DISK_NONE ignores persists (NOPaxos' default mode needs
 * none to answer); CFX_DISK_NOW completes each outbox's persists at once
 * and feeds CONS_IN_PERSISTED before its messages; CFX_DISK_MANUAL keeps
 * them pending until cfx_flush (auto_flush: cfx_pump flushes every disk
 * once the queue is empty). A crash loses what was pending; the machine
 * survives it (it is on the disk, cons.h) unless the disk is wiped.
 *
 * Every step is followed by the core's seal (NOPaxos: each step a commit)
 * and its invariants. Memory: the group is large (disks, queue): make it
 * static. Single-threaded, as the tests.
 */
#ifndef CORE_FIX_H
#define CORE_FIX_H

#include "cons.h"
#include "cons_core.h"
#include "kv.h"

#include <stddef.h>
#include <stdint.h>

#define CFX_SLOTS   1024 /* disk entry records, by index % CFX_SLOTS (>= log_cap) */
#define CFX_PENDING 4096 /* persists a disk holds before it completes them */
#define CFX_QUEUE   8192 /* queued messages */
#define CFX_MSG_MAX 4096 /* an OUM message a test builds */

struct cfx_rec {
    uint8_t *buf;
    uint32_t len;
    uint64_t index;
    uint8_t kind; /* enum cons_persist_kind */
};

struct cfx_disk {
    struct cfx_rec meta, snap, ents[CFX_SLOTS];
    struct cfx_rec pending[CFX_PENDING]; /* issued, not durable yet */
    uint32_t npending;
    uint64_t last_cookie; /* per incarnation */
    uint32_t nsnaps;      /* SNAPSHOT records completed */
};

enum cfx_net { CFX_DIRECT = 0, CFX_QUEUED = 1 };
enum cfx_disks { CFX_DISK_NONE = 0, CFX_DISK_NOW = 1, CFX_DISK_MANUAL = 2 };

struct cfx;

struct cfx_hooks {
    /* A reply from replica `from` to a client (m's bytes valid during the call). */
    void (*reply)(struct cfx *g, uint32_t from, const struct cons_out_msg *m);
    /* A message from replica `from` to replica m->to.id, before it goes:
     * 1 when the hook took it, 0 to let it go. NULL: all go. */
    int (*route)(struct cfx *g, uint32_t from, const struct cons_out_msg *m);
};

struct cfx_qmsg {
    uint32_t from;
    struct cons_addr to;
    uint32_t len;
    uint8_t *buf;
};

struct cfx {
    enum cons_proto proto;
    uint32_t n;
    struct cons_core_config cfg; /* every replica's; cfx_boot sets id and seed */
    struct cons_core core[CONS_REPLICAS_MAX];
    struct kv_mem *kv[CONS_REPLICAS_MAX];
    struct cfx_disk disk[CONS_REPLICAS_MAX];
    enum cfx_net net;
    enum cfx_disks disks;
    int auto_flush;
    struct cfx_hooks hooks;
    uint64_t now;
    uint32_t down;                        /* replicas that receive nothing */
    uint64_t seeds;                       /* incarnations booted: each gets a fresh seed */
    uint64_t bytes_to[CONS_REPLICAS_MAX]; /* protocol bytes each replica received */
    /* The NOPaxos sequencer (cfx_oum). */
    uint32_t session;
    uint64_t msgnum;
    struct cfx_qmsg q[CFX_QUEUE];
    uint32_t qhead, qn;
};

/* Sets g up (zeroed first) for n replicas of proto, each created with cfg
 * (id and seed set per replica). Nothing is booted yet. */
void cfx_init(struct cfx *g, enum cons_proto proto, uint32_t n, const struct cons_core_config *cfg,
              enum cfx_net net, enum cfx_disks disks);
/* Boots replica i: a machine of 8 keys if it has none, the core created,
 * restored from its disk for CONS_START_RESTORED (CHECKs a META there), its
 * disk wiped and machine replaced for CONS_START_EMPTY, started; its
 * outbox goes out. */
void cfx_boot(struct cfx *g, uint32_t i, enum cons_start_mode mode);
/* The same, returning the start outbox undelivered (the caller looks at
 * the replica first, then cfx_deliver). */
struct cons_outbox *cfx_boot_quiet(struct cfx *g, uint32_t i, enum cons_start_mode mode);
/* Boots every replica FRESH. */
void cfx_start(struct cfx *g);
/* Replica i's process dies: its core goes, what its disk had pending is
 * lost, and it receives nothing until booted again. */
void cfx_crash(struct cfx *g, uint32_t i);
/* Frees everything. */
void cfx_stop(struct cfx *g);

/* One input to replica i, then its outbox (above). */
void cfx_step(struct cfx *g, uint32_t i, const struct cons_input *in);
/* Sends a copy of an outbox from replica `from` (cfx_step does). */
void cfx_deliver(struct cfx *g, uint32_t from, const struct cons_outbox *ob);
/* A message from replica `from` to replica `to` now (a held one). */
void cfx_send(struct cfx *g, uint32_t from, uint32_t to, const uint8_t *buf, size_t len);
/* CFX_QUEUED: delivers until nothing moves (bounded; CHECKs it settles). */
void cfx_pump(struct cfx *g);
/* CFX_DISK_MANUAL: replica i's disk completes its n oldest pending persists
 * (all with cfx_flush_all) and says so. */
void cfx_flush(struct cfx *g, uint32_t i, uint32_t n);
void cfx_flush_all(struct cfx *g, uint32_t i);
/* n rounds: time moves by dt, every replica that is up ticks (and, queued,
 * the network is pumped). */
void cfx_ticks(struct cfx *g, int n, uint64_t dt);

/* The replica that leads (cons_core_status), or -1. */
int cfx_leader(const struct cfx *g);
struct cons_core_status cfx_status(const struct cfx *g, uint32_t i);
/* NOPaxos' sequencer: the next number of the current session, and replica
 * i's copy of it: op's request, a fill (op NULL) or, with drop, a drop
 * notice. */
uint64_t cfx_oum_next(struct cfx *g);
void cfx_oum_to(struct cfx *g, uint32_t i, uint64_t num, const struct cons_op *op, int drop);
/* Empties a disk record (a test that damages a disk). */
void cfx_rec_clear(struct cfx_rec *r);
/* Whether replicas a and b hold the same pairs. */
int cfx_same_pairs(const struct cfx *g, uint32_t a, uint32_t b);

#endif /* CORE_FIX_H */
