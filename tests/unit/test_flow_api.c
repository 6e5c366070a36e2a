/*
 * test_flow_api.c: the documented errors of flow.h, the schema rules, the
 * combiner flow and memory accounting. Nodes live in one process here (the
 * fabric still goes through loopback sockets); multi-process behaviour is in
 * test_flow_shuffle, test_flow_replicate and test_flow_elastic.
 */
#include "../flows/flowtest.h"

static void declare_simple(flow_node *home, const char *name, const char *target,
                           enum flow_kind kind, enum flow_mode mode, int nsources)
{
    struct flow_schema s;
    ft_schema(&s);
    struct flow_opts o;
    flow_opts_default(&o, kind, mode);
    if (kind == FLOW_COMBINER) {
        o.agg = FLOW_SUM;
        snprintf(o.agg_column, sizeof(o.agg_column), "n");
    }
    const char *targets[1] = {target};
    CHECK_OK(flow_declare(home, name, &s, nsources, targets, 1, &o));
}

TEST(flow_schema_offsets_and_errors)
{
    struct flow_schema s;
    struct flow_column cols[] = {{"a", FLOW_INT8, 0},  {"b", FLOW_INT64, 0}, {"c", FLOW_INT16, 0},
                                 {"d", FLOW_BYTES, 5}, {"e", FLOW_FLOAT, 0}, {"f", FLOW_DOUBLE, 0},
                                 {"g", FLOW_INT32, 0}, {"h", FLOW_UINT64, 0}};
    CHECK_OK(flow_schema_init(&s, cols, 8, "b"));
    CHECK_EQ_I64(flow_schema_offset(&s, "a"), 0);
    CHECK_EQ_I64(flow_schema_offset(&s, "b"), 8);
    CHECK_EQ_I64(flow_schema_offset(&s, "c"), 16);
    CHECK_EQ_I64(flow_schema_offset(&s, "d"), 18);
    CHECK_EQ_I64(flow_schema_offset(&s, "e"), 24);
    CHECK_EQ_I64(flow_schema_offset(&s, "f"), 32);
    CHECK_EQ_I64(flow_schema_offset(&s, "g"), 40);
    CHECK_EQ_I64(flow_schema_offset(&s, "h"), 48);
    CHECK_EQ_U64(s.tuple_size, 56);
    CHECK_EQ_U64(s.key, 1);
    CHECK_ERR(flow_schema_offset(&s, "zz"), FK_ENOTFOUND);
    CHECK_ERR(flow_schema_init(&s, cols, 8, "nokey"), FK_EINVAL);
    CHECK_ERR(flow_schema_init(&s, cols, 0, "a"), FK_EINVAL);
    struct flow_column dup[] = {{"a", FLOW_INT8, 0}, {"a", FLOW_INT8, 0}};
    CHECK_ERR(flow_schema_init(&s, dup, 2, "a"), FK_EINVAL);
    struct flow_column bad[] = {{"a", (enum flow_type)99, 0}};
    CHECK_ERR(flow_schema_init(&s, bad, 1, "a"), FK_EINVAL);
    struct flow_column empty[] = {{"a", FLOW_BYTES, 0}};
    CHECK_ERR(flow_schema_init(&s, empty, 1, "a"), FK_EINVAL);
    struct flow_column huge[] = {{"a", FLOW_INT64, 0}, {"b", FLOW_BYTES, FLOW_TUPLE_MAX}};
    CHECK_ERR(flow_schema_init(&s, huge, 2, "a"), FK_ETOOBIG);
}

struct wrong_thread_arg {
    flow_source *s;
    flow_target *t;
    int push_rc, consume_rc;
};

static void *wrong_thread(void *p)
{
    struct wrong_thread_arg *a = p;
    struct ft_tuple tp = {0};
    struct flow_item it;
    a->push_rc = flow_push(a->s, &tp, sizeof(tp));
    a->consume_rc = flow_consume(a->t, &it, 0);
    return NULL;
}

TEST(flow_bad_arguments_return_documented_errors)
{
    flow_node *a = ft_node(), *b = ft_node();
    flow_target *t;
    flow_source *s;
    CHECK_ERR(flow_target_open(a, "nope", 0, &t), FK_EUNKNOWN_FLOW);
    CHECK_ERR(flow_source_open(a, "nope", 0, FT_SEC, &s), FK_EUNKNOWN_FLOW);
    declare_simple(a, "f", flow_node_addr(b), FLOW_SHUFFLE, FLOW_LATENCY, 1);
    /* Declared twice, bad names and counts. */
    struct flow_schema sc;
    ft_schema(&sc);
    struct flow_opts o;
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_LATENCY);
    const char *tg[1] = {flow_node_addr(b)};
    CHECK_ERR(flow_declare(a, "f", &sc, 1, tg, 1, &o), FK_EEXIST);
    CHECK_ERR(flow_declare(a, "", &sc, 1, tg, 1, &o), FK_EINVAL);
    CHECK_ERR(flow_declare(a, "g", &sc, 1, tg, 0, &o), FK_EINVAL);
    o.segments = 1;
    CHECK_ERR(flow_declare(a, "g", &sc, 1, tg, 1, &o), FK_EINVAL);
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_LATENCY);
    o.ordered = 1; /* ordered is for replicate flows only */
    CHECK_ERR(flow_declare(a, "g", &sc, 1, tg, 1, &o), FK_EINVAL);
    /* Target on the wrong node, wrong index, opened twice. */
    CHECK_ERR(flow_target_open(a, "f", 0, &t), FK_EINVAL);
    CHECK_ERR(flow_target_open(b, "f", 1, &t), FK_EINVAL);
    CHECK_OK(flow_target_open(b, "f", 0, &t));
    flow_target *t2;
    CHECK_ERR(flow_target_open(b, "f", 0, &t2), FK_EBUSY);
    /* Source index beyond the declared ones; the declared one twice. */
    CHECK_ERR(flow_source_open(a, "f", 1, FT_SEC, &s), FK_EINVAL);
    CHECK_OK(flow_source_open(a, "f", 0, FT_SEC, &s));
    flow_source *s2;
    CHECK_ERR(flow_source_open(a, "f", 0, FT_SEC, &s2), FK_EBUSY);
    CHECK_ERR(flow_source_open(a, "f", FLOW_ANY, FT_SEC, &s2), FK_EFULL); /* max_sources 1 */
    /* Wrong tuple size, wrong thread. */
    struct ft_tuple tp = {1, 0, 0, 0};
    CHECK_ERR(flow_push(s, &tp, sizeof(tp) - 8), FK_ESCHEMA);
    CHECK_ERR(flow_push(s, NULL, sizeof(tp)), FK_EINVAL);
    CHECK_ERR(flow_push_to(s, 5, &tp, sizeof(tp)), FK_EINVAL);
    struct wrong_thread_arg w = {s, t, 0, 0};
    pthread_t th;
    CHECK_OK(pthread_create(&th, NULL, wrong_thread, &w));
    pthread_join(th, NULL);
    CHECK_ERR(w.push_rc, FK_EWRONG_THREAD);
    CHECK_ERR(w.consume_rc, FK_EWRONG_THREAD);
    /* A tuple through, then end-of-flow, which stays. */
    CHECK_OK(flow_push(s, &tp, sizeof(tp)));
    CHECK_OK(flow_source_close(s));
    struct flow_item it;
    CHECK_OK(flow_consume(t, &it, 5 * FT_SEC));
    CHECK_EQ_U64(((const struct ft_tuple *)it.tuple)->key, 1);
    CHECK_ERR(flow_consume(t, &it, 5 * FT_SEC), FK_EEND);
    CHECK_ERR(flow_consume(t, &it, 0), FK_EEND);
    const void *rows;
    CHECK_ERR(flow_combiner_result(t, &rows, 0), FK_EINVAL);
    flow_target_close(t);
    /* A closed target: its node no longer attaches sources to it. */
    CHECK_ERR(flow_source_open(a, "f", 0, 50 * FK_NSEC_PER_MSEC, &s), FK_ETIMEDOUT);
    CHECK_EQ_U64(flow_node_memory(a), 0);
    CHECK_EQ_U64(flow_node_memory(b), 0);
    flow_node_destroy(a);
    flow_node_destroy(b);
}

/* A target's open costs its credit words; each attached source costs the
 * ring it asked for (at most the declared one), checked against the
 * node's limit at the attach and given back when the source ends. */
TEST(flow_memory_reported_and_bounded)
{
    struct flow_node_config cfg;
    flow_node_config_default(&cfg);
    cfg.mem_limit = 100 * 1024;
    flow_node *a = ft_node(), *b;
    CHECK_OK(flow_node_create(&cfg, &b));
    CHECK_EQ_U64(flow_node_mem_limit(b), 100 * 1024);
    struct flow_schema sc;
    ft_schema(&sc);
    struct flow_opts o;
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_BANDWIDTH);
    o.segments = 4;
    o.segment_bytes = 4096;
    const char *tg[1] = {flow_node_addr(b)};
    CHECK_OK(flow_declare(a, "small", &sc, 2, tg, 1, &o));
    o.segments = 64; /* a ring of 64 * 4 KiB: over the 100 KiB bound */
    CHECK_OK(flow_declare(a, "big", &sc, 2, tg, 1, &o));
    flow_target *t, *tb;
    CHECK_OK(flow_target_open(b, "small", 0, &t));
    CHECK_EQ_U64(flow_node_memory(b), 64); /* 2 credit words padded to 64 */
    CHECK_OK(flow_target_open(b, "big", 0, &tb));
    CHECK_EQ_U64(flow_node_memory(b), 128);
    const uint64_t ring4 = 64 + 4 * (4096 + 16), ring3 = (64 + 3 * (4096 + 16) + 63) / 64 * 64;
    flow_source *s, *s2;
    CHECK_OK(flow_source_open(a, "small", 0, FT_SEC, &s));
    CHECK_EQ_U64(flow_node_memory(b), 128 + ring4);
    /* credits and read words (2 * FLOW_TARGETS_MAX * 8) plus one target's 4 staged segments. */
    CHECK_EQ_U64(flow_node_memory(a), 2 * FLOW_TARGETS_MAX * 8 + 4 * (4096 + 16));
    /* The declared ring does not fit: refused, and nothing is held. */
    CHECK_ERR(flow_source_open(a, "big", 0, FT_SEC, &s2), FK_ENOMEM);
    CHECK_EQ_U64(flow_node_memory(b), 128 + ring4);
    /* A source asking for 3 segments fits, and its tuples wrap that ring. */
    CHECK_OK(flow_source_open_ring(a, "big", 0, 3, FT_SEC, &s2));
    CHECK_EQ_U64(flow_node_memory(b), 128 + ring4 + ring3);
    struct flow_item it;
    for (uint64_t round = 0; round < 10; round++) {
        for (uint64_t i = 0; i < 100; i++) {
            struct ft_tuple tp = {round * 100 + i, 0, 0, 0};
            CHECK_OK(flow_push(s2, &tp, sizeof tp));
        }
        CHECK_OK(flow_flush(s2));
        for (uint64_t i = 0; i < 100; i++) {
            CHECK_OK(flow_consume(tb, &it, 5 * FT_SEC));
            CHECK_EQ_U64(((const struct ft_tuple *)it.tuple)->key, round * 100 + i);
        }
    }
    CHECK_OK(flow_source_close(s2));
    CHECK_OK(flow_source_close(s));
    /* Each ring is given back once its target has seen the source end. */
    CHECK_ERR(flow_consume(tb, &it, 100 * FK_NSEC_PER_MSEC), FK_ETIMEDOUT);
    CHECK_ERR(flow_consume(t, &it, 100 * FK_NSEC_PER_MSEC), FK_ETIMEDOUT);
    CHECK_EQ_U64(flow_node_memory(b), 128);
    CHECK_EQ_U64(flow_node_memory(a), 0);
    flow_target_close(t);
    flow_target_close(tb);
    CHECK_EQ_U64(flow_node_memory(b), 0);
    flow_node_destroy(a);
    flow_node_destroy(b);
}

/* ---- combiner ---------------------------------------------------------------------------- */

#define COMB_KEYS 50
#define COMB_N    3000

static void comb_source(struct ft_child *c, void *arg)
{
    (void)arg;
    int idx;
    char home[FAB_ADDR_MAX];
    if (ft_read(c->down[0], &idx, sizeof(idx)) < 0 || ft_read(c->down[0], home, sizeof(home)) < 0)
        _exit(3);
    flow_node *n = ft_node();
    CHECK_OK(flow_node_add_peer(n, home));
    for (int agg = 0; agg < 4; agg++) {
        static const char *names[4] = {"sum", "count", "min", "max"};
        flow_source *s;
        CHECK_OK(flow_source_open(n, names[agg], idx, FT_DEADLINE, &s));
        for (int64_t i = 0; i < COMB_N; i++) {
            struct ft_tuple tp = {(uint64_t)(i % COMB_KEYS), (uint64_t)idx,
                                  (uint64_t)(i * (idx + 1) % 1000), 0};
            CHECK_OK(flow_push(s, &tp, sizeof(tp)));
        }
        CHECK_OK(flow_source_close(s));
    }
    flow_node_destroy(n);
}

TEST(combiner_sum_count_min_max_by_key)
{
    struct ft_child src[3];
    for (int i = 0; i < 3; i++)
        ft_fork(&src[i], comb_source, NULL);
    flow_node *n = ft_node();
    struct flow_schema sc;
    ft_schema(&sc);
    static const char *names[4] = {"sum", "count", "min", "max"};
    const char *tg[1] = {flow_node_addr(n)};
    for (int agg = 0; agg < 4; agg++) {
        struct flow_opts o;
        flow_opts_default(&o, FLOW_COMBINER, agg % 2 ? FLOW_LATENCY : FLOW_BANDWIDTH);
        o.agg = (enum flow_agg)(FLOW_SUM + agg);
        snprintf(o.agg_column, sizeof(o.agg_column), "n");
        CHECK_OK(flow_declare(n, names[agg], &sc, 3, tg, 1, &o));
    }
    char home[FAB_ADDR_MAX] = {0};
    snprintf(home, sizeof(home), "%s", flow_node_addr(n));
    for (int i = 0; i < 3; i++) {
        ft_write(src[i].down[1], &i, sizeof(i));
        ft_write(src[i].down[1], home, sizeof(home));
    }
    for (int agg = 0; agg < 4; agg++) {
        /* Expected per key, from the same formula the sources use. */
        int64_t want[COMB_KEYS];
        for (int k = 0; k < COMB_KEYS; k++)
            want[k] = agg == 2 ? INT64_MAX : agg == 3 ? INT64_MIN : 0;
        for (int idx = 0; idx < 3; idx++) {
            for (int64_t i = 0; i < COMB_N; i++) {
                int k = (int)(i % COMB_KEYS);
                int64_t v = i * (idx + 1) % 1000;
                want[k] = agg == 0   ? want[k] + v
                          : agg == 1 ? want[k] + 1
                          : agg == 2 ? (v < want[k] ? v : want[k])
                                     : (v > want[k] ? v : want[k]);
            }
        }
        flow_target *t;
        CHECK_OK(flow_target_open(n, names[agg], 0, &t));
        const void *rows;
        int g = flow_combiner_result(t, &rows, 30 * FT_SEC);
        CHECK_EQ_I64(g, COMB_KEYS);
        const struct ft_tuple *r = rows;
        for (int i = 0; i < g; i++) {
            CHECK(r[i].key < COMB_KEYS);
            CHECK_MSG((int64_t)r[i].n == want[r[i].key], "%s key %lu: %ld != %ld", names[agg],
                      (unsigned long)r[i].key, (long)r[i].n, (long)want[r[i].key]);
        }
        flow_target_close(t);
    }
    for (int i = 0; i < 3; i++)
        CHECK_EQ_I64(ft_reap(&src[i], fk_now_ns() + 60 * FT_SEC), 0);
    flow_node_destroy(n);
}

CHECK_MAIN()
