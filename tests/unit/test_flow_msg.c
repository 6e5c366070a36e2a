/* Unit tests for flows/flow_msg: messages of any length over a shuffle flow,
 * reassembled per source; torn and lying fragments are dropped; over an
 * ordered replicate flow every number is accounted for (whole, fragment or
 * lost). */
#include "../flows/flowtest.h"
#include "flow_msg.h"

#define TUPLE  256
#define NMSG   200
#define MAXMSG (64 * 1024)
/* The largest messages flowkv sends: a request of a 1 MiB value and a
 * 1 MiB expected value (cons_wire.h, CONS_WIRE_OP_MAX) with its headers,
 * some 9,400 fragments each. */
#define BIGMSG ((2u << 20) + 4096)

/* The run's shape: NMSG messages up to MAXMSG, or (big) a few of up to
 * BIGMSG between small ones. */
static int g_big;

static size_t run_max(void)
{
    return g_big ? BIGMSG : MAXMSG;
}

static int run_nmsg(void)
{
    return g_big ? 4 : NMSG;
}

/* Message n of source src: length and bytes derived from (src, n). */
static size_t msg_len(int src, int n)
{
    if (g_big)
        return n % 2 ? 1 + (size_t)(n * 7919 + src) % 600 : BIGMSG - (size_t)n * 1000 - (size_t)src;
    return 1 + (size_t)((n * 7919 + src * 104729) % (n % 10 == 0 ? MAXMSG : 600));
}

static void msg_fill(uint8_t *b, size_t len, int src, int n)
{
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)(src * 31 + n * 17 + i * 13);
}

struct sender {
    flow_node *node;
    const char *flow;
    int index;
    int rc;
};

static void *send_all(void *p)
{
    struct sender *s = p;
    uint8_t *buf = malloc(run_max());
    flow_source *src;
    struct flow_msg_tx tx;
    s->rc = buf ? flow_source_open(s->node, s->flow, s->index, 10 * FT_SEC, &src) : FK_ENOMEM;
    if (s->rc < 0) {
        free(buf);
        return NULL;
    }
    s->rc = flow_msg_tx_init(&tx, src, TUPLE);
    for (int n = 0; n < run_nmsg() && s->rc == 0; n++) {
        size_t len = msg_len(s->index, n);
        msg_fill(buf, len, s->index, n);
        s->rc = flow_msg_send(&tx, 0, (uint64_t)n, (uint32_t)s->index, buf, len);
    }
    flow_msg_tx_free(&tx);
    int rc = flow_source_close(src);
    if (s->rc == 0)
        s->rc = rc;
    free(buf);
    return NULL;
}

static void run_two_senders(enum flow_mode mode)
{
    flow_node *home = ft_node(), *peer = ft_node();
    CHECK_OK(flow_node_add_peer(peer, flow_node_addr(home))); /* where "msgs" is known */
    struct flow_schema sc;
    CHECK_OK(flow_msg_schema(&sc, TUPLE));
    struct flow_opts o;
    flow_opts_default(&o, FLOW_SHUFFLE, mode);
    const char *targets[1] = {flow_node_addr(home)};
    CHECK_OK(flow_declare(home, "msgs", &sc, 2, targets, 1, &o));
    flow_target *t;
    CHECK_OK(flow_target_open(home, "msgs", 0, &t));
    struct flow_msg_rx *rx = flow_msg_rx_create(t, TUPLE, 2, run_max());
    CHECK(rx != NULL);
    struct sender s[2] = {{peer, "msgs", 0, 0}, {peer, "msgs", 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, send_all, &s[i]) == 0);
    int next[2] = {0, 0};
    uint8_t *want = malloc(run_max());
    CHECK(want != NULL);
    struct flow_msg m;
    int rc;
    /* Bounded: 2 * run_nmsg() messages, then end-of-flow, or a 30 s timeout. */
    while ((rc = flow_msg_recv(rx, &m, 30 * FT_SEC)) == 0) {
        CHECK(m.from < 2 && (int)m.from == m.source);
        int n = next[m.from]++;
        CHECK_EQ_U64(m.dst, n); /* in order per source */
        CHECK_EQ_U64(m.len, msg_len((int)m.from, n));
        msg_fill(want, m.len, (int)m.from, n);
        CHECK_MSG(memcmp(want, m.buf, m.len) == 0, "message %d of %u differs", n, m.from);
    }
    CHECK_ERR(rc, FK_EEND);
    free(want);
    CHECK_EQ_I64(next[0], run_nmsg());
    CHECK_EQ_I64(next[1], run_nmsg());
    CHECK_EQ_U64(flow_msg_dropped(rx), 0);
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_join(th[i], NULL) == 0);
        CHECK_OK(s[i].rc);
    }
    flow_msg_rx_destroy(rx);
    flow_target_close(t);
    flow_node_destroy(peer);
    flow_node_destroy(home);
}

TEST(msg_round_trip_latency_mode)
{
    run_two_senders(FLOW_LATENCY);
}

TEST(msg_round_trip_bandwidth_mode)
{
    run_two_senders(FLOW_BANDWIDTH);
}

/* Messages of 2 MiB (a request with a 1 MiB value and a 1 MiB expected
 * value) travel in pieces, whole and in order, on either fabric (the
 * verbs suite runs this file over Soft-RoCE). */
TEST(msg_megabyte_messages_both_modes)
{
    g_big = 1;
    run_two_senders(FLOW_LATENCY);
    run_two_senders(FLOW_BANDWIDTH);
    g_big = 0;
}

/* Pushes one raw fragment (dst 7, or dst when given). */
static void push_frag_to(flow_source *src, uint64_t dst, uint64_t id, uint32_t len, uint32_t off,
                         uint32_t chunk, uint8_t fill)
{
    uint8_t t[TUPLE] = {0};
    uint32_t from = 0;
    memcpy(t, &dst, 8);
    memcpy(t + 8, &id, 8);
    memcpy(t + 16, &len, 4);
    memcpy(t + 20, &off, 4);
    memcpy(t + 24, &from, 4);
    memcpy(t + 28, &chunk, 4);
    memset(t + FLOW_MSG_HDR, fill, TUPLE - FLOW_MSG_HDR);
    CHECK_OK(flow_push(src, t, TUPLE));
}

static void push_frag(flow_source *src, uint64_t id, uint32_t len, uint32_t off, uint32_t chunk,
                      uint8_t fill)
{
    push_frag_to(src, 7, id, len, off, chunk, fill);
}

TEST(msg_drops_torn_and_lying_fragments)
{
    flow_node *home = ft_node();
    struct flow_schema sc;
    CHECK_OK(flow_msg_schema(&sc, TUPLE));
    struct flow_opts o;
    flow_opts_default(&o, FLOW_SHUFFLE, FLOW_LATENCY);
    const char *targets[1] = {flow_node_addr(home)};
    CHECK_OK(flow_declare(home, "raw", &sc, 1, targets, 1, &o));
    flow_target *t;
    CHECK_OK(flow_target_open(home, "raw", 0, &t));
    struct flow_msg_rx *rx = flow_msg_rx_create(t, TUPLE, 1, 1000);
    CHECK(rx != NULL);
    flow_source *src;
    CHECK_OK(flow_source_open(home, "raw", 0, 10 * FT_SEC, &src));
    const uint32_t room = TUPLE - FLOW_MSG_HDR;
    push_frag(src, 1, 500, 0, room, 'a');          /* starts message 1 ... */
    push_frag(src, 2, 300, 0, room, 'b');          /* ... torn by message 2 */
    push_frag(src, 2, 300, room, 300 - room, 'b'); /* message 2 completes */
    push_frag(src, 3, 5000, 0, room, 'c');         /* longer than max_msg */
    push_frag(src, 4, 100, 0, 200, 'd');           /* chunk beyond len */
    push_frag(src, 5, 900, 0, room + 8, 'e');      /* chunk beyond the tuple */
    push_frag(src, 6, 600, room, room, 'f');       /* middle without a start */
    push_frag(src, 7, 10, 0, 10, 'g');             /* a good one-fragment message */
    CHECK_OK(flow_source_close(src));
    struct flow_msg m;
    CHECK_OK(flow_msg_recv(rx, &m, 10 * FT_SEC));
    CHECK_EQ_U64(m.len, 300);
    CHECK(m.buf[0] == 'b' && m.buf[299] == 'b');
    CHECK_OK(flow_msg_recv(rx, &m, 10 * FT_SEC));
    CHECK_EQ_U64(m.len, 10);
    CHECK(m.buf[0] == 'g');
    CHECK_ERR(flow_msg_recv(rx, &m, 10 * FT_SEC), FK_EEND);
    CHECK_EQ_U64(flow_msg_dropped(rx), 5);
    flow_msg_rx_destroy(rx);
    flow_target_close(t);
    flow_node_destroy(home);
}

/* NOPaxos' kv.oum (server/srv_net.c): one item per global number, so the
 * consumer can log every number; a leading fragment is FRAGMENT even when
 * its message is torn, because every target must decide alike from the
 * bytes; a last fragment that completes nothing is LOST. */
TEST(msg_ordered_accounts_for_every_number)
{
    flow_node *home = ft_node();
    struct flow_schema sc;
    CHECK_OK(flow_msg_schema(&sc, TUPLE));
    struct flow_opts o;
    flow_opts_default(&o, FLOW_REPLICATE, FLOW_BANDWIDTH);
    o.ordered = 1;
    o.gap_timeout_ns = 2 * FT_SEC; /* nothing is lost here */
    snprintf(o.sequencer, FAB_ADDR_MAX, "%s", flow_node_addr(home));
    const char *targets[1] = {flow_node_addr(home)};
    CHECK_OK(flow_declare(home, "ord", &sc, 1, targets, 1, &o));
    CHECK_OK(flow_sequencer_start(home, "ord", 1));
    flow_target *t;
    CHECK_OK(flow_target_open(home, "ord", 0, &t));
    struct flow_msg_rx *rx = flow_msg_rx_create(t, TUPLE, 1, 1000);
    CHECK(rx != NULL);
    flow_source *src;
    CHECK_OK(flow_source_open(home, "ord", 0, 10 * FT_SEC, &src));
    struct flow_msg_tx tx;
    CHECK_OK(flow_msg_tx_init(&tx, src, TUPLE));
    static uint8_t big[500];
    msg_fill(big, sizeof big, 0, 1);
    const uint32_t room = TUPLE - FLOW_MSG_HDR;
    CHECK_OK(flow_msg_send(&tx, -1, 9, 0, big, sizeof big)); /* 0, 1, 2: three fragments */
    CHECK_OK(flow_msg_send(&tx, -1, 9, 0, "hi", 2));         /* 3 */
    push_frag(src, 50, 300, 0, room, 'a');                   /* 4: leads message 50 ... */
    push_frag(src, 51, 10, 0, 10, 'b');                      /* 5: ... torn by message 51 */
    push_frag(src, 50, 300, room, 300 - room, 'a');          /* 6: 50's last, joins nothing */
    push_frag(src, 52, 300, 0, room, 'c');                   /* 7: leads message 52 ... */
    push_frag_to(src, 8, 52, 300, room, 300 - room, 'c');    /* 8: ... a last from another dst */
    push_frag(src, 53, 5000, 0, room, 'd');                  /* 9: longer than max_msg */
    CHECK_OK(flow_source_close(src));
    flow_msg_tx_free(&tx);
    static const int want[] = {
        FLOW_MSG_FRAGMENT, FLOW_MSG_FRAGMENT, FLOW_MSG_WHOLE,    FLOW_MSG_WHOLE, FLOW_MSG_FRAGMENT,
        FLOW_MSG_WHOLE,    FLOW_MSG_LOST,     FLOW_MSG_FRAGMENT, FLOW_MSG_LOST,  FLOW_MSG_LOST};
    struct flow_msg_item it;
    for (uint64_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        CHECK_OK(flow_msg_recv_ordered(rx, &it, 10 * FT_SEC));
        CHECK_EQ_U64(it.seq, k);
        CHECK_EQ_U64(it.session, 1);
        CHECK_MSG(it.kind == want[k], "number %" PRIu64 ": kind %d, want %d", k, it.kind, want[k]);
        if (k == 2) {
            CHECK_EQ_U64(it.msg.len, sizeof big);
            CHECK_EQ_U64(it.msg.dst, 9);
            CHECK(memcmp(it.msg.buf, big, sizeof big) == 0);
        }
        if (k == 5)
            CHECK(it.msg.len == 10 && it.msg.buf[0] == 'b');
    }
    CHECK_ERR(flow_msg_recv_ordered(rx, &it, 10 * FT_SEC), FK_EEND);
    flow_msg_rx_destroy(rx);
    flow_target_close(t);
    flow_node_destroy(home);
}

TEST(msg_bad_arguments)
{
    struct flow_schema sc;
    CHECK_ERR(flow_msg_schema(&sc, 30), FK_EINVAL);
    CHECK_ERR(flow_msg_schema(&sc, 100), FK_EINVAL); /* not a multiple of 8 */
    CHECK_ERR(flow_msg_schema(&sc, FLOW_TUPLE_MAX + 8), FK_EINVAL);
    CHECK_OK(flow_msg_schema(&sc, 64));
    CHECK_EQ_U64(sc.tuple_size, 64);
    CHECK(flow_msg_rx_create(NULL, 64, 1, 10) == NULL);
    struct flow_msg_tx tx;
    CHECK_ERR(flow_msg_tx_init(&tx, NULL, 64), FK_EINVAL);
}

CHECK_MAIN()
