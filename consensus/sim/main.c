/* flowkv-sim: runs the deterministic fault simulator over many seeds.
 *
 *   flowkv-sim [--seeds N] [--first S] [--seed S] [--bug NAME] [--verbose]
 *              [--expect-failure]
 *
 * --seeds N runs seeds first..first+N-1 (default 1000 from 1); --seed S runs
 * one seed (replay) and implies --verbose 1. A failing seed prints its
 * reason and the exact command that replays it; the exit status is 1 when
 * any seed failed. --bug plants a known bug (apply-uncommitted,
 * local-reads); with --expect-failure the exit status is 0 only if some
 * seed failed (the checkers can fail) and the run stops at the first.
 * Prints the fault mix and simulated operations per CPU-second. */
#include "sim.h"

#include "fk_error.h"
#include "fk_time.h"
#include "mpx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_bug(const char *name, uint32_t *bugs)
{
    if (strcmp(name, "apply-uncommitted") == 0)
        *bugs |= MPX_BUG_APPLY_UNCOMMITTED;
    else if (strcmp(name, "local-reads") == 0)
        *bugs |= MPX_BUG_LOCAL_READS;
    else if (strcmp(name, "no-merge") == 0)
        *bugs |= MPX_BUG_NO_MERGE;
    else
        return -1;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: flowkv-sim [--seeds N] [--first S] [--seed S] [--bug NAME]\n"
                    "                  [--verbose] [--expect-failure]\n"
                    "bugs: apply-uncommitted, local-reads, no-merge\n");
}

struct args {
    uint64_t first, count;
    int verbose, expect_failure;
    uint32_t bugs;
    const char *bug_name;
};

static int parse_args(int argc, char **argv, struct args *a)
{
    a->first = 1;
    a->count = 1000;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--seeds") == 0 && v) {
            a->count = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(argv[i], "--first") == 0 && v) {
            a->first = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(argv[i], "--seed") == 0 && v) {
            a->first = strtoull(v, NULL, 10);
            a->count = 1;
            if (!a->verbose)
                a->verbose = 1;
            i++;
        } else if (strcmp(argv[i], "--bug") == 0 && v && parse_bug(v, &a->bugs) == 0) {
            a->bug_name = v;
            i++;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            a->verbose = 2;
        } else if (strcmp(argv[i], "--expect-failure") == 0) {
            a->expect_failure = 1;
        } else {
            return -1;
        }
    }
    return a->count > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct args a = {0};
    if (parse_args(argc, argv, &a) < 0) {
        usage();
        return 2;
    }
    uint64_t cpu0 = fk_cpu_ns(), wall0 = fk_now_ns();
    uint64_t failed = 0, ran = 0, ops = 0, msgs = 0, drops = 0, dups = 0, parts = 0, crashes = 0,
             empties = 0, n5 = 0;
    for (uint64_t s = a.first; s < a.first + a.count; s++) {
        struct sim_opts o = {.seed = s, .bugs = a.bugs, .verbose = a.verbose, .ops_per_client = 40};
        struct sim_result r;
        if (sim_run(&o, &r) < 0) {
            fprintf(stderr, "flowkv-sim: out of memory\n");
            return 2;
        }
        ran++;
        ops += r.ops_done;
        msgs += r.msgs;
        drops += r.dropped;
        dups += r.duplicated;
        parts += r.partitions;
        crashes += r.crashes;
        empties += r.empty_restarts;
        n5 += r.n == 5;
        if (!r.ok) {
            failed++;
            printf("FAIL seed %" PRIu64 " (n=%u): %s\n  replay: %s --seed %" PRIu64 "%s%s\n", s,
                   r.n, r.why, argv[0], s, a.bug_name ? " --bug " : "",
                   a.bug_name ? a.bug_name : "");
            if (a.expect_failure)
                break;
        }
    }
    double cpu_s = (double)(fk_cpu_ns() - cpu0) / 1e9, wall_s = (double)(fk_now_ns() - wall0) / 1e9;
    printf("flowkv-sim mpx: %" PRIu64 " seeds (%" PRIu64 " with 5 replicas), %" PRIu64
           " failed, %.1f s wall, %.1f s CPU\n",
           ran, n5, failed, wall_s, cpu_s);
    printf("  faults: %" PRIu64 " messages, %" PRIu64 " dropped, %" PRIu64 " duplicated, %" PRIu64
           " partitions, %" PRIu64 " crashes (%" PRIu64 " restarted empty)\n",
           msgs, drops, dups, parts, crashes, empties);
    printf("  client operations: %" PRIu64 " completed, %.0f per CPU-second\n", ops,
           cpu_s > 0 ? (double)ops / cpu_s : 0.0);
    if (a.expect_failure)
        return failed ? 0 : 1;
    return failed ? 1 : 0;
}
