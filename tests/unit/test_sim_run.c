/* Unit tests for the simulator: seeds pass, a seed replays exactly, and
 * planted bugs are caught (the checkers can fail). The long campaign is
 * tests/integration/test_sim_campaign.sh. */
#include "check.h"
#include "mpx.h"
#include "sim/sim.h"

TEST(seeds_pass)
{
    for (uint64_t s = 1000; s < 1040; s++) {
        struct sim_opts o = {.seed = s, .ops_per_client = 40};
        struct sim_result r;
        CHECK_OK(sim_run(&o, &r));
        CHECK_MSG(r.ok, "seed %llu: %s", (unsigned long long)s, r.why);
        CHECK(r.ops_done > 0);
    }
}

TEST(replay_is_exact)
{
    struct sim_opts o = {.seed = 77, .ops_per_client = 40};
    struct sim_result a, b;
    CHECK_OK(sim_run(&o, &a));
    CHECK_OK(sim_run(&o, &b));
    CHECK_EQ_U64(a.steps, b.steps);
    CHECK_EQ_U64(a.msgs, b.msgs);
    CHECK_EQ_U64(a.dropped, b.dropped);
    CHECK_EQ_U64(a.ops_done, b.ops_done);
    CHECK_EQ_U64(a.vtime_ns, b.vtime_ns);
}

static int finds_bug(uint32_t bug)
{
    for (uint64_t s = 1; s <= 500; s++) {
        struct sim_opts o = {.seed = s, .bugs = bug, .ops_per_client = 40};
        struct sim_result r;
        CHECK_OK(sim_run(&o, &r));
        if (!r.ok)
            return 1;
    }
    return 0;
}

TEST(planted_bug_apply_uncommitted_is_found)
{
    CHECK(finds_bug(MPX_BUG_APPLY_UNCOMMITTED));
}

TEST(planted_bug_local_reads_is_found)
{
    CHECK(finds_bug(MPX_BUG_LOCAL_READS));
}

TEST(planted_bug_no_merge_is_found)
{
    CHECK(finds_bug(MPX_BUG_NO_MERGE));
}

CHECK_MAIN()
