/*
 * test_flow_replicate.c: replicate flows across processes (DFI section 5.4):
 * unicast fan-out, multicast with credits and loss reports, global order
 * from a fetch-and-add sequencer (identical sequence at every target), GAP
 * reporting and duplicate filtering under the datagram drop knob.
 */
#include "../flows/flowtest.h"

static struct ft_spec spec(enum flow_mode mode, int sp, int st, int tp, int tt, uint64_t tuples)
{
    struct ft_spec s;
    memset(&s, 0, sizeof(s));
    flow_opts_default(&s.opts, FLOW_REPLICATE, mode);
    s.src_procs = sp;
    s.src_threads = st;
    s.tgt_procs = tp;
    s.tgt_threads = tt;
    s.tuples = tuples;
    return s;
}

TEST(replicate_1to3_unicast_bandwidth)
{
    struct ft_spec s = spec(FLOW_BANDWIDTH, 1, 1, 3, 1, 30000);
    s.opts.segment_bytes = 2048;
    s.opts.segments = 4;
    ft_run(&s);
}

TEST(replicate_nm_unicast_latency)
{
    struct ft_spec s = spec(FLOW_LATENCY, 2, 1, 1, 3, 3000);
    ft_run(&s);
}

TEST(replicate_1to3_multicast)
{
    struct ft_spec s = spec(FLOW_LATENCY, 1, 1, 3, 1, 5000);
    s.opts.multicast = 1;
    ft_run(&s);
}

TEST(replicate_multicast_lossy_reliable_no_duplicates)
{
    /* Unordered multicast is reliable: loss reports and resends fill every
     * hole, duplicates from resends are dropped, so each target gets every
     * tuple exactly once, in order per source. */
    struct ft_spec s = spec(FLOW_LATENCY, 2, 1, 2, 1, 2000);
    s.opts.multicast = 1;
    s.drop = 0.05;
    ft_run(&s);
}

/* Nothing is lost here, so no GAP may be reported: the gap timeout is
 * set far above any delay of a delivered segment. The default (50 ms) is
 * shorter than one RC retransmission on Soft-RoCE under emulation (the
 * verbs suite), where a late segment is legitimately reported as a gap. */
#define LOSSLESS_GAP_NS (2 * FK_NSEC_PER_SEC)

TEST(replicate_ordered_3_sources_identical_sequence)
{
    struct ft_spec s = spec(FLOW_LATENCY, 3, 1, 1, 3, 1500);
    s.opts.ordered = 1;
    s.opts.gap_timeout_ns = LOSSLESS_GAP_NS;
    ft_run(&s);
    struct ft_spec b = spec(FLOW_BANDWIDTH, 1, 3, 2, 1, 5000);
    b.opts.ordered = 1;
    b.opts.segment_bytes = 512;
    b.opts.gap_timeout_ns = LOSSLESS_GAP_NS;
    ft_run(&b);
}

TEST(replicate_ordered_multicast_identical_sequence)
{
    struct ft_spec s = spec(FLOW_LATENCY, 3, 1, 3, 1, 1000);
    s.opts.ordered = 1;
    s.opts.multicast = 1;
    s.opts.gap_timeout_ns = LOSSLESS_GAP_NS;
    ft_run(&s);
}

TEST(replicate_ordered_multicast_drops_report_gaps)
{
    struct ft_spec s = spec(FLOW_LATENCY, 3, 1, 2, 1, 1000);
    s.opts.ordered = 1;
    s.opts.multicast = 1;
    s.opts.gap_timeout_ns = 20 * FK_NSEC_PER_MSEC;
    s.drop = 0.05;
    ft_run(&s);
    CHECK_MSG(s.gaps > 0, "no GAP reported at drop 0.05");
}

CHECK_MAIN()
