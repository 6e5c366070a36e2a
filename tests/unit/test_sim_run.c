/* Unit tests for the simulator: seeds pass, a seed replays exactly, and
 * planted bugs are caught (the checkers can fail). The long campaign is
 * tests/integration/test_sim_campaign.sh. */
#include "check.h"
#include "mpx.h"
#include "nop.h"
#include "sim/sim.h"

static void seeds_pass(int proto)
{
    for (uint64_t s = 1000; s < 1040; s++) {
        struct sim_opts o = {.seed = s, .proto = proto, .ops_per_client = 40};
        struct sim_result r;
        CHECK_OK(sim_run(&o, &r));
        CHECK_MSG(r.ok, "seed %llu: %s", (unsigned long long)s, r.why);
        CHECK(r.ops_done > 0);
    }
}

TEST(mpx_seeds_pass)
{
    seeds_pass(SIM_MPX);
}

TEST(nop_seeds_pass)
{
    seeds_pass(SIM_NOP);
}

TEST(replay_is_exact)
{
    for (int proto = SIM_MPX; proto <= SIM_NOP; proto++) {
        struct sim_opts o = {.seed = 77, .proto = proto, .ops_per_client = 40};
        struct sim_result a, b;
        CHECK_OK(sim_run(&o, &a));
        CHECK_OK(sim_run(&o, &b));
        CHECK_EQ_U64(a.steps, b.steps);
        CHECK_EQ_U64(a.msgs, b.msgs);
        CHECK_EQ_U64(a.dropped, b.dropped);
        CHECK_EQ_U64(a.ops_done, b.ops_done);
        CHECK_EQ_U64(a.vtime_ns, b.vtime_ns);
    }
}

static int finds_bug(int proto, uint32_t bug)
{
    for (uint64_t s = 1; s <= 500; s++) {
        struct sim_opts o = {.seed = s, .proto = proto, .bugs = bug, .ops_per_client = 40};
        struct sim_result r;
        CHECK_OK(sim_run(&o, &r));
        if (!r.ok)
            return 1;
    }
    return 0;
}

TEST(planted_bug_apply_uncommitted_is_found)
{
    CHECK(finds_bug(SIM_MPX, MPX_BUG_APPLY_UNCOMMITTED));
}

TEST(planted_bug_local_reads_is_found)
{
    CHECK(finds_bug(SIM_MPX, MPX_BUG_LOCAL_READS));
}

TEST(planted_bug_no_merge_is_found)
{
    CHECK(finds_bug(SIM_MPX, MPX_BUG_NO_MERGE));
}

TEST(planted_bug_nop_no_gap_agreement_is_found)
{
    CHECK(finds_bug(SIM_NOP, NOP_BUG_NO_GAP_AGREEMENT));
}

TEST(planted_bug_nop_follower_exec_is_found)
{
    CHECK(finds_bug(SIM_NOP, NOP_BUG_FOLLOWER_EXEC));
}

CHECK_MAIN()
