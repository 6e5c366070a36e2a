/* flowkv-sim: runs the deterministic fault simulator over many seeds.
 *
 *   flowkv-sim [--proto mpx|nop|both] [--seeds N] [--first S|random]
 *              [--seed S] [--seconds S] [--ops N] [--fault-ms MS] [--durable]
 *              [--reconfig] [--bug NAME] [--verbose] [--expect-failure]
 *
 * --seeds N runs seeds first..first+N-1 (default 1000 from 1) for each
 * protocol chosen (default both); --first random starts at a seed drawn
 * from /dev/urandom (printed, so a failure replays) and --seconds S stops
 * starting seeds after S seconds of wall time (a fresh block sized to the
 * time there is); --seed S runs one seed (replay) and implies --verbose 1.
 * --ops N sets operations per client (default 40) and --fault-ms the
 * virtual length of the fault phase (default 2000); clients start no new
 * operation after it. --durable runs NOPaxos replicas in durable mode
 * (nop.h) with whole-group crashes and slow disks (sim.h); --reconfig runs
 * Multi-Paxos with membership changes (sim.h). A failing seed
 * prints its reason and the exact command that replays it; the exit status
 * is 1 when any seed failed. --bug plants a known bug: apply-uncommitted,
 * local-reads, no-merge, stale-votes, stale-rows, config-no-wait (Multi-Paxos; the
 * last implies --reconfig) or no-gap-agreement,
 * follower-exec, restore-no-recovery, reply-unpersisted (NOPaxos; the last
 * implies --durable); with --expect-failure the status is 0 only if some
 * seed failed (the checkers can fail), stopping at the first. A campaign
 * prints a progress line every 15 s of wall time (FLOWKV_SIM_PROGRESS_MS)
 * and ends, per protocol,
 * with the wall and CPU time, the fault mix and simulated client
 * operations per CPU-second. */
#include "fk_version.h"
#include "sim.h"

#include "fk_error.h"
#include "fk_time.h"
#include "mpx.h"
#include "nop.h"
#include "seqctl.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int proto;
    uint32_t bit;
    int seq; /* a bug of the sequencer failover decision (seqctl.h), not of the core */
} bugs[] = {
    {"apply-uncommitted", SIM_MPX, MPX_BUG_APPLY_UNCOMMITTED, 0},
    {"local-reads", SIM_MPX, MPX_BUG_LOCAL_READS, 0},
    {"no-merge", SIM_MPX, MPX_BUG_NO_MERGE, 0},
    {"stale-votes", SIM_MPX, MPX_BUG_STALE_VOTES, 0},
    {"stale-rows", SIM_MPX, MPX_BUG_STALE_ROWS, 0},
    {"config-no-wait", SIM_MPX, MPX_BUG_CONFIG_NO_WAIT, 0}, /* reconfig only */
    {"no-gap-agreement", SIM_NOP, NOP_BUG_NO_GAP_AGREEMENT, 0},
    {"follower-exec", SIM_NOP, NOP_BUG_FOLLOWER_EXEC, 0},
    {"restore-no-recovery", SIM_NOP, NOP_BUG_RESTORE_NO_RECOVERY, 0},
    {"reply-unpersisted", SIM_NOP, NOP_BUG_REPLY_UNPERSISTED, 0}, /* durable mode only */
    {"seq-no-restart", SIM_NOP, SEQCTL_BUG_NO_RESTART, 1},
};

struct args {
    uint64_t first, count;
    int verbose, expect_failure, protos; /* protos: bit 0 mpx, bit 1 nop */
    int durable;                         /* NOPaxos durable mode */
    int reconfig;                        /* Multi-Paxos membership changes */
    uint32_t ops;                        /* operations per client */
    uint64_t fault_ms;                   /* fault phase, virtual ms (0: 2,000) */
    uint32_t bugs, seq_bugs;
    const char *bug_name;
    double seconds;   /* --seconds: stop starting seeds after this much wall time */
    int random_first; /* --first random: a fresh block of seeds */
    int count_given;  /* --seeds given: with --seconds, an upper bound */
};

static void usage(void)
{
    fprintf(stderr, "usage: flowkv-sim [--proto mpx|nop|both] [--seeds N] [--first S|random]\n"
                    "                  [--seed S] [--seconds S] [--ops N] [--fault-ms MS]\n"
                    "                  [--durable] [--reconfig] [--bug NAME] [--verbose]\n"
                    "                  [--expect-failure]\n"
                    "bugs: apply-uncommitted, local-reads, no-merge, stale-votes, stale-rows,\n"
                    "      config-no-wait (mpx, reconfig);\n"
                    "      no-gap-agreement, follower-exec, restore-no-recovery,\n"
                    "      reply-unpersisted (nop, durable), \n"
                    "      seq-no-restart (nop)\n");
}

static int parse_bug(struct args *a, const char *name)
{
    for (size_t i = 0; i < sizeof bugs / sizeof bugs[0]; i++) {
        if (strcmp(bugs[i].name, name) == 0) {
            if (bugs[i].seq)
                a->seq_bugs |= bugs[i].bit;
            else
                a->bugs |= bugs[i].bit;
            a->bug_name = name;
            a->protos = 1 << bugs[i].proto;
            if (bugs[i].bit == NOP_BUG_REPLY_UNPERSISTED && bugs[i].proto == SIM_NOP)
                a->durable = 1;
            if (bugs[i].bit == MPX_BUG_CONFIG_NO_WAIT && bugs[i].proto == SIM_MPX)
                a->reconfig = 1;
            return 0;
        }
    }
    return -1;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    a->first = 1;
    a->count = 1000;
    a->protos = 3;
    a->ops = 40;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = v && argv[i][0] == '-' && strcmp(argv[i], "--verbose") != 0 &&
                    strcmp(argv[i], "--expect-failure") != 0 && strcmp(argv[i], "--durable") != 0 &&
                    strcmp(argv[i], "--reconfig") != 0;
        if (strcmp(argv[i], "--seeds") == 0 && v) {
            a->count = strtoull(v, NULL, 10);
            a->count_given = 1;
        } else if (strcmp(argv[i], "--fault-ms") == 0 && v) {
            a->fault_ms = strtoull(v, NULL, 10);
        } else if (strcmp(argv[i], "--ops") == 0 && v) {
            a->ops = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(argv[i], "--first") == 0 && v) {
            a->random_first = strcmp(v, "random") == 0;
            a->first = strtoull(v, NULL, 10);
        } else if (strcmp(argv[i], "--seconds") == 0 && v) {
            a->seconds = strtod(v, NULL);
        } else if (strcmp(argv[i], "--seed") == 0 && v) {
            a->first = strtoull(v, NULL, 10);
            a->count = 1;
            a->verbose = a->verbose ? a->verbose : 1;
        } else if (strcmp(argv[i], "--proto") == 0 && v) {
            a->protos = strcmp(v, "mpx") == 0    ? 1
                        : strcmp(v, "nop") == 0  ? 2
                        : strcmp(v, "both") == 0 ? 3
                                                 : 0;
        } else if (strcmp(argv[i], "--bug") == 0 && v) {
            if (parse_bug(a, v) < 0)
                return -1;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            a->verbose = 2;
        } else if (strcmp(argv[i], "--durable") == 0) {
            a->durable = 1;
        } else if (strcmp(argv[i], "--reconfig") == 0) {
            a->reconfig = 1;
        } else if (strcmp(argv[i], "--expect-failure") == 0) {
            a->expect_failure = 1;
        } else {
            return -1;
        }
        i += takes;
    }
    if (a->seconds > 0 && !a->count_given)
        a->count = UINT64_C(1) << 40; /* bounded by the time alone */
    if (a->reconfig && (a->protos & 2)) {
        if (a->protos == 2)
            return -1; /* NOPaxos has no reconfiguration yet */
        a->protos = 1;
    }
    return a->count > 0 && a->protos && a->ops > 0 && a->ops <= 100000 && a->fault_ms <= 600000
               ? 0
               : -1;
}

struct totals {
    uint64_t ran, failed, ops, msgs, drops, dups, parts, crashes, empties, n5, failovers, oum,
        handovers;
    uint64_t fills, crash_alls, amnesias;
    uint64_t xfers, xfers_multi, xfer_chunks, xfer_switches, xfer_resent, xfer_rc, xfer_sc;
    uint64_t past;
    uint64_t changes, refused;
};

static void add(struct totals *t, const struct sim_result *r)
{
    t->ran++;
    t->ops += r->ops_done;
    t->msgs += r->msgs;
    t->drops += r->dropped;
    t->dups += r->duplicated;
    t->parts += r->partitions;
    t->crashes += r->crashes;
    t->empties += r->empty_restarts;
    t->n5 += r->n == 5;
    t->failovers += r->failovers;
    t->handovers += r->handovers;
    t->oum += r->oum_drops;
    t->fills += r->oum_fills;
    t->crash_alls += r->crash_alls;
    t->amnesias += r->amnesias;
    t->xfers += r->xfers;
    t->xfers_multi += r->xfers_multi;
    t->xfer_chunks += r->xfer_chunks;
    t->xfer_switches += r->xfer_switches;
    t->xfer_resent += r->xfer_resent;
    t->xfer_rc += r->xfer_recv_crashes;
    t->xfer_sc += r->xfer_send_crashes;
    t->past += r->past_syncs;
    t->changes += r->changes;
    t->refused += r->changes_refused;
}

/* How often a long campaign prints a progress line: 15 s, or
 * FLOWKV_SIM_PROGRESS_MS milliseconds (1..3,600,000; tests use 100). */
static uint64_t progress_ns(void)
{
    const char *e = getenv("FLOWKV_SIM_PROGRESS_MS");
    long ms = e != NULL ? strtol(e, NULL, 10) : 0;
    return (uint64_t)(ms >= 1 && ms <= 3600000 ? ms : 15000) * 1000000ull;
}

/* Runs the campaign for one protocol; returns the number of failed seeds. */
static uint64_t campaign(const struct args *a, int proto, const char *argv0)
{
    const char *pname = proto == SIM_NOP ? "nop" : "mpx";
    struct totals t = {0};
    const uint64_t every = progress_ns();
    uint64_t cpu0 = fk_cpu_ns(), wall0 = fk_now_ns(), next_note = wall0 + every;
    if (a->random_first || a->seconds > 0)
        printf("flowkv-sim %s: seeds from %" PRIu64 "%s\n", pname, a->first,
               a->seconds > 0 ? " while time allows" : "");
    for (uint64_t s = a->first; s < a->first + a->count; s++) {
        uint64_t now = fk_now_ns();
        if (a->seconds > 0 && (double)(now - wall0) / 1e9 >= a->seconds)
            break;
        if (now >= next_note && a->count > 1) {
            /* Long campaigns speak: one line every `every` ns of wall time. */
            printf("flowkv-sim %s: %" PRIu64 " seeds done", pname, t.ran);
            if (a->seconds <= 0)
                printf(" of %" PRIu64, a->count);
            printf(", %" PRIu64 " failed, %.0f s\n", t.failed, (double)(now - wall0) / 1e9);
            fflush(stdout);
            next_note = now + every;
        }
        struct sim_opts o = {.seed = s,
                             .proto = proto,
                             .bugs = a->bugs,
                             .seq_bugs = a->seq_bugs,
                             .verbose = a->verbose,
                             .ops_per_client = a->ops,
                             .fault_ms = a->fault_ms,
                             .durable = proto == SIM_NOP && a->durable,
                             .reconfig = proto == SIM_MPX && a->reconfig};
        struct sim_result r;
        if (sim_run(&o, &r) < 0) {
            fprintf(stderr, "flowkv-sim: out of memory\n");
            exit(2);
        }
        add(&t, &r);
        if (!r.ok) {
            t.failed++;
            printf("FAIL %s seed %" PRIu64 " (n=%u): %s\n  replay: %s --proto %s --seed %" PRIu64
                   " --ops %u --fault-ms %" PRIu64 "%s%s%s%s\n",
                   pname, s, r.n, r.why, argv0, pname, s, a->ops, a->fault_ms ? a->fault_ms : 2000,
                   o.durable ? " --durable" : "", o.reconfig ? " --reconfig" : "",
                   a->bug_name ? " --bug " : "", a->bug_name ? a->bug_name : "");
            fflush(stdout);
            if (a->expect_failure)
                break;
        }
    }
    double cpu_s = (double)(fk_cpu_ns() - cpu0) / 1e9, wall_s = (double)(fk_now_ns() - wall0) / 1e9;
    printf("flowkv-sim %s%s: %" PRIu64 " seeds (%" PRIu64 " with 5 replicas), %" PRIu64
           " failed, %.1f s wall, %.1f s CPU\n",
           pname,
           proto == SIM_NOP && a->durable    ? " (durable)"
           : proto == SIM_MPX && a->reconfig ? " (reconfig)"
                                             : "",
           t.ran, t.n5, t.failed, wall_s, cpu_s);
    printf("  faults: %" PRIu64 " messages, %" PRIu64 " dropped, %" PRIu64 " duplicated, %" PRIu64
           " partitions, %" PRIu64 " crashes (%" PRIu64 " restarted empty, %" PRIu64
           " of them amnesia in the minority)",
           t.msgs, t.drops, t.dups, t.parts, t.crashes, t.empties, t.amnesias);
    if (proto == SIM_NOP)
        printf(", %" PRIu64 " sequencer failovers, %" PRIu64 " OUM drops, %" PRIu64 " OUM fills",
               t.failovers, t.oum, t.fills);
    printf(", %" PRIu64 " leaders stopped that handed over", t.handovers);
    if (proto == SIM_NOP && a->durable)
        printf(", %" PRIu64 " whole-group crashes", t.crash_alls);
    printf("\n  state transfers: %" PRIu64 " completed (%" PRIu64
           " in more than one chunk), %" PRIu64 " chunks, %" PRIu64 " resent, %" PRIu64
           " sender switches, %" PRIu64 " receivers and %" PRIu64 " senders crashed mid-transfer",
           t.xfers, t.xfers_multi, t.xfer_chunks, t.xfer_resent, t.xfer_switches, t.xfer_rc,
           t.xfer_sc);
    if (proto == SIM_NOP)
        printf("; %" PRIu64 " syncs from the history of compacted entries", t.past);
    if (proto == SIM_MPX && a->reconfig)
        printf("\n  membership changes: %" PRIu64 " applied, %" PRIu64 " refused", t.changes,
               t.refused);
    printf("\n  client operations: %" PRIu64 " completed, %.0f per CPU-second\n", t.ops,
           cpu_s > 0 ? (double)t.ops / cpu_s : 0.0);
    return t.failed;
}

/* --first random: a block of seeds no run has chosen on purpose, below
 * 2^48 so the printed replay commands stay short. */
static int random_first(struct args *a)
{
    FILE *f = fopen("/dev/urandom", "rb");
    uint64_t x = 0;
    int ok = f && fread(&x, sizeof x, 1, f) == 1;
    if (f)
        fclose(f);
    a->first = (x >> 16) | 1;
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    /* A run creates and destroys cores at every crash and restart, each
     * allocating megabytes (logs, OUM buffer, arenas) with calloc. A fixed
     * mmap threshold keeps those in fresh zero pages, faulted in only
     * where touched; glibc's dynamic threshold moved them to the heap,
     * where calloc clears every byte (durable NOPaxos runs took 2-3x the
     * CPU). */
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    struct args a = {0};
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("flowkv-sim %s\n", FK_VERSION);
        return 0;
    }
    if (parse_args(argc, argv, &a) < 0) {
        usage();
        return 2;
    }
    if (a.random_first && random_first(&a) < 0) {
        fprintf(stderr, "flowkv-sim: cannot read /dev/urandom\n");
        return 2;
    }
    uint64_t failed = 0;
    if (a.protos & 1)
        failed += campaign(&a, SIM_MPX, argv[0]);
    if (a.protos & 2)
        failed += campaign(&a, SIM_NOP, argv[0]);
    if (a.expect_failure)
        return failed ? 0 : 1;
    return failed ? 1 : 0;
}
