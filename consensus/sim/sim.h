/*
 * sim.h: the deterministic fault simulator for the protocol cores.
 *
 * One run = one seed and one protocol (Multi-Paxos or NOPaxos). Everything random comes from a
 * splitmix64 stream seeded by it, time is virtual, and events are ordered by (time, sequence
 * number), so a seed replays exactly. A run drives real cores (mpx.h)
 * through a simulated world:
 *   network  drops, duplicates, delays (hence reorders) every message with
 *            per-run probabilities, and partitions replicas into two sides;
 *   disks    complete persists in order after a random latency; a crash
 *            loses the ones not completed;
 *   crashes  at most f replicas down (or recovering) at once; each restarts
 *            after a random time with its disk (restored, then recovery
 *            for NOPaxos) or empty (recovery, state transfer); with
 *            `durable` (NOPaxos durable mode, nop.h) also every replica
 *            at once, each restarting from its disk (a view change), and
 *            disks up to 25 ms slow so acknowledgements wait for them;
 *   OUM      for NOPaxos, a sequencer stamps each client request with
 *            (session, number) and multicasts it in order to every replica,
 *            replacing it by a drop notification at random; it fails over
 *            to a new session at random;
 *   clients  several, each with one outstanding request, retried on a
 *            timeout (Multi-Paxos: to the hinted or next replica; NOPaxos:
 *            through the sequencer, accepting f+1 matching replies in one
 *            view that include the leader's);
 *   changes  with `reconfig` (Multi-Paxos, mpx.h "Reconfiguration"): five
 *            replicas, three of them members at first and two learners
 *            that start at random times (catching up through the log or a
 *            state transfer); an administrator adds learners, removes
 *            members and replaces them (CONS_OP_CONFIG) at random during
 *            the fault phase, keeping three to five members.
 * After the fault phase everything heals; every pending client operation
 * must then complete within live_ns of virtual time (liveness). Every step
 * is followed by the core's invariants() and a cross-replica check that no
 * two replicas ever hold different chosen values for one slot; at the end
 * the client history goes through lin_check and replicas that applied the
 * same prefix must hold identical state.
 *
 * Thread safety: a run uses only its own memory; runs may go in parallel.
 */
#ifndef SIM_H
#define SIM_H

#include <stddef.h>
#include <stdint.h>

#define SIM_CLIENTS_MAX 16
#define SIM_KEYS_MAX    16
/* Values: a 16-digit token, for one in eight tokens (Multi-Paxos) padded
 * to SIM_VAL_MAX bytes, more than an op holds inline (cons.h), so seeds
 * exercise the log's storage of large values and its budget. */
#define SIM_VAL_MAX 5000

enum sim_proto { SIM_MPX = 0, SIM_NOP = 1 };

struct sim_opts {
    uint64_t seed;
    int proto;               /* enum sim_proto */
    uint32_t bugs;           /* MPX_BUG_* or NOP_BUG_* on every replica (tests only) */
    uint32_t seq_bugs;       /* SEQCTL_BUG_* in every replica's failover decision (tests only) */
    int verbose;             /* 1: one line per fault; 2: plus every client op */
    uint32_t ops_per_client; /* default 40 */
    uint64_t fault_ms;       /* virtual length of the fault phase; 0 = 2,000 */
    int durable;             /* NOPaxos: durable mode, whole-group crashes */
    int reconfig;            /* Multi-Paxos: membership changes (above) */
};

struct sim_result {
    int ok;        /* 1 when every check passed */
    char why[256]; /* the first failure */
    uint32_t n, clients;
    uint64_t ops_done, ops_issued;
    uint64_t steps, msgs, dropped, duplicated, partitions, crashes, empty_restarts;
    uint64_t failovers, oum_drops; /* NOPaxos: sequencer failovers, OUM drop notifications */
    uint64_t handovers;            /* leaders stopped gracefully that handed over */
    uint64_t oum_fills;            /* NOPaxos: OUM numbers that carried a fill */
    uint64_t crash_alls;           /* durable NOPaxos: whole-group crashes */
    uint64_t amnesias;             /* amnesia-in-the-minority faults (sim.c) */
    /* State transfers (cons_xfer.h), summed over every incarnation. */
    uint64_t xfers, xfers_multi, xfer_chunks, xfer_switches, xfer_resent;
    uint64_t xfer_recv_crashes, xfer_send_crashes; /* crashes mid-transfer */
    uint64_t past_syncs; /* NOPaxos: syncs of entries from the history (cons_hist.h) */
    uint64_t changes, changes_refused; /* reconfig: changes applied, refused (busy, again) */
    uint64_t vtime_ns;                 /* virtual time at the end */
    double drop_p, dup_p;
};

/* Runs one seed. Returns 0 (see res->ok for the verdict) or FK_ENOMEM. */
int sim_run(const struct sim_opts *opts, struct sim_result *res);

#endif /* SIM_H */
