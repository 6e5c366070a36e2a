/*
 * test_flow_shuffle.c: shuffle flows across real processes on loopback, in
 * every topology and both modes (DFI sections 5.1 to 5.3), plus the
 * documented errors. Scenarios live in tests/flows/flowtest.h.
 */
#include "../flows/flowtest.h"

static struct ft_spec spec(enum flow_mode mode, int sp, int st, int tp, int tt, uint64_t tuples)
{
    struct ft_spec s;
    memset(&s, 0, sizeof(s));
    flow_opts_default(&s.opts, FLOW_SHUFFLE, mode);
    s.src_procs = sp;
    s.src_threads = st;
    s.tgt_procs = tp;
    s.tgt_threads = tt;
    s.tuples = tuples;
    return s;
}

TEST(shuffle_1to1_bandwidth_wraps_ring)
{
    struct ft_spec s = spec(FLOW_BANDWIDTH, 1, 1, 1, 1, 200000);
    s.opts.segment_bytes = 1024; /* 32 tuples a segment, 4 segments: 1500+ wraps */
    s.opts.segments = 4;
    ft_run(&s);
}

TEST(shuffle_1to1_latency_wraps_ring)
{
    struct ft_spec s = spec(FLOW_LATENCY, 1, 1, 1, 1, 20000);
    s.opts.segments = 8;
    ft_run(&s);
}

TEST(shuffle_nto1_bandwidth_partial_flushes)
{
    struct ft_spec s = spec(FLOW_BANDWIDTH, 3, 1, 1, 1, 20000);
    s.flush_every = 100; /* partial segments: payload then footer */
    ft_run(&s);
}

TEST(shuffle_1ton_latency)
{
    struct ft_spec s = spec(FLOW_LATENCY, 1, 1, 3, 1, 10000);
    ft_run(&s);
}

TEST(shuffle_nm_4x4_threads_two_procs_bandwidth)
{
    struct ft_spec s = spec(FLOW_BANDWIDTH, 1, 4, 1, 4, 20000);
    ft_run(&s);
    printf("# memory per node, 4x4 bandwidth: sources %llu B, targets %llu B\n",
           (unsigned long long)s.mem_per_node[0], (unsigned long long)s.mem_per_node[1]);
    fflush(stdout);
}

TEST(shuffle_nm_4x4_threads_two_procs_latency)
{
    struct ft_spec s = spec(FLOW_LATENCY, 1, 4, 1, 4, 5000);
    ft_run(&s);
    printf("# memory per node, 4x4 latency: sources %llu B, targets %llu B\n",
           (unsigned long long)s.mem_per_node[0], (unsigned long long)s.mem_per_node[1]);
    fflush(stdout);
}

TEST(shuffle_nm_procs_route_function)
{
    struct ft_spec s = spec(FLOW_BANDWIDTH, 2, 2, 2, 2, 5000);
    s.route = FT_FUNC;
    ft_run(&s);
}

TEST(shuffle_explicit_target_latency)
{
    struct ft_spec s = spec(FLOW_LATENCY, 2, 1, 1, 3, 3000);
    s.route = FT_EXPLICIT;
    ft_run(&s);
}

TEST(shuffle_slow_consumer_stalls_without_loss)
{
    struct ft_spec s = spec(FLOW_BANDWIDTH, 2, 1, 1, 1, 4000);
    s.opts.segment_bytes = 256;
    s.opts.segments = 2;
    s.slow_every = 200;
    s.slow_us = 2000;
    ft_run(&s);
    struct ft_spec l = spec(FLOW_LATENCY, 2, 1, 1, 1, 2000);
    l.opts.segments = 4;
    l.slow_every = 100;
    l.slow_us = 2000;
    ft_run(&l);
}

CHECK_MAIN()
