/*
 * sim.h: the deterministic fault simulator for the protocol cores.
 *
 * One run = one seed. Everything random comes from a splitmix64 stream
 * seeded by it, time is virtual, and events are ordered by (time, sequence
 * number), so a seed replays exactly. A run drives real cores (mpx.h)
 * through a simulated world:
 *   network  drops, duplicates, delays (hence reorders) every message with
 *            per-run probabilities, and partitions replicas into two sides;
 *   disks    complete persists in order after a random latency; a crash
 *            loses the ones not completed;
 *   crashes  at most f replicas down (or recovering) at once; each restarts
 *            after a random time with its disk or empty (state transfer);
 *   clients  several, each with one outstanding request, retried on a
 *            timeout to the hinted or next replica.
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

struct sim_opts {
    uint64_t seed;
    uint32_t bugs;           /* MPX_BUG_* planted on every replica (tests only) */
    int verbose;             /* 1: one line per fault; 2: plus every client op */
    uint32_t ops_per_client; /* default 40 */
};

struct sim_result {
    int ok;        /* 1 when every check passed */
    char why[256]; /* the first failure */
    uint32_t n, clients;
    uint64_t ops_done, ops_issued;
    uint64_t steps, msgs, dropped, duplicated, partitions, crashes, empty_restarts;
    uint64_t vtime_ns; /* virtual time at the end */
    double drop_p, dup_p;
};

/* Runs one seed. Returns 0 (see res->ok for the verdict) or FK_ENOMEM. */
int sim_run(const struct sim_opts *opts, struct sim_result *res);

#endif /* SIM_H */
