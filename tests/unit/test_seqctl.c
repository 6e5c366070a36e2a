/* test_seqctl.c: the sequencer failover decision (consensus/seqctl.h):
 * strong evidence only, a majority behind every miss, the first live
 * candidate alone, sessions above all known, announcing until all heard. */
#include "check.h"
#include "fk_error.h"
#include "seqctl.h"

static struct seqctl make(uint32_t n, uint32_t id, uint32_t floor, uint32_t bugs)
{
    struct seqctl_config c = {.n = n, .id = id, .norder = n, .bugs = bugs};
    for (uint32_t k = 0; k < n; k++)
        c.order[k] = n - 1 - k; /* n-1, ..., 0 */
    struct seqctl s;
    CHECK_OK(seqctl_init(&s, &c, floor));
    return s;
}

/* A round: host and session, every replica answering but those in
 * refused (bit mask) and silent. */
static struct seqctl_round round_of(uint32_t host, uint32_t session, uint32_t refused,
                                    uint32_t silent)
{
    struct seqctl_round r = {.host = host, .session = session, .hosting = 1};
    for (uint32_t j = 0; j < CONS_REPLICAS_MAX; j++)
        r.probe[j] = refused >> j & 1  ? SEQCTL_REFUSED_NOW
                     : silent >> j & 1 ? SEQCTL_SILENT
                                       : SEQCTL_ANSWERED;
    return r;
}

TEST(seqctl_refused_three_times_takes_over)
{
    struct seqctl s = make(3, 1, 4, 0); /* order 2, 1, 0: replica 1 is next after 2 */
    struct seqctl_round dead = round_of(2, 7, 1u << 2, 0);
    CHECK_EQ_I64(seqctl_step(&s, &dead).kind, SEQCTL_NOTHING);
    CHECK_EQ_I64(seqctl_step(&s, &dead).kind, SEQCTL_NOTHING);
    struct seqctl_action a = seqctl_step(&s, &dead);
    CHECK_EQ_I64(a.kind, SEQCTL_TAKE_OVER);
    CHECK_EQ_U64(a.session, 10); /* replica 1's first above 7 and the floor 4: 8 + 1 + 1 */
    seqctl_took_over(&s, a.session, 1);
    /* Now the host: announce once every replica answers. */
    CHECK_EQ_I64(
        seqctl_step(&s, &(struct seqctl_round){.host = 1, .session = 10, .hosting = 1}).kind,
        SEQCTL_NOTHING); /* probes zeroed: nobody answered */
    struct seqctl_round back = round_of(1, 10, 0, 0);
    a = seqctl_step(&s, &back);
    CHECK_EQ_I64(a.kind, SEQCTL_ANNOUNCE);
    CHECK_EQ_U64(a.session, 10);
    seqctl_announced(&s);
    CHECK_EQ_I64(seqctl_step(&s, &back).kind, SEQCTL_NOTHING);
}

TEST(seqctl_silence_needs_six_rounds_in_a_row)
{
    struct seqctl s = make(3, 1, 0, 0);
    struct seqctl_round silent = round_of(2, 3, 0, 1u << 2), alive = round_of(2, 3, 0, 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_I64(seqctl_step(&s, &silent).kind, SEQCTL_NOTHING);
    CHECK_EQ_I64(seqctl_step(&s, &alive).kind, SEQCTL_NOTHING); /* answered: start again */
    for (int i = 0; i < 5; i++)
        CHECK_EQ_I64(seqctl_step(&s, &silent).kind, SEQCTL_NOTHING);
    struct seqctl_action a = seqctl_step(&s, &silent);
    CHECK_EQ_I64(a.kind, SEQCTL_TAKE_OVER);
    CHECK_EQ_U64(a.session, 10);
    /* A silent round breaks a run of refusals. */
    struct seqctl t = make(3, 1, 0, 0);
    struct seqctl_round refused = round_of(2, 3, 1u << 2, 0);
    seqctl_step(&t, &refused);
    seqctl_step(&t, &refused);
    seqctl_step(&t, &silent);
    CHECK_EQ_I64(seqctl_step(&t, &refused).kind, SEQCTL_NOTHING);
}

TEST(seqctl_a_minority_never_takes_over)
{
    /* Replica 1 cut off from 0 and 2: every probe silent, for ever. */
    struct seqctl s = make(3, 1, 0, 0);
    struct seqctl_round cut = round_of(2, 3, 0, 1u << 0 | 1u << 2);
    for (int i = 0; i < 50; i++)
        CHECK_EQ_I64(seqctl_step(&s, &cut).kind, SEQCTL_NOTHING);
    /* Misses before a heal do not add up with those after it: five
     * rounds with a majority, one without, five with: nothing yet. */
    struct seqctl_round dead = round_of(2, 3, 0, 1u << 2);
    for (int i = 0; i < 5; i++)
        seqctl_step(&s, &dead);
    seqctl_step(&s, &cut);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_I64(seqctl_step(&s, &dead).kind, SEQCTL_NOTHING);
    CHECK_EQ_I64(seqctl_step(&s, &dead).kind, SEQCTL_TAKE_OVER);
}

TEST(seqctl_only_the_first_live_candidate_acts)
{
    /* Five replicas, order 4, 3, 2, 1, 0; the host 4 is gone. */
    struct seqctl r2 = make(5, 2, 0, 0), r3 = make(5, 3, 0, 0);
    struct seqctl_round dead = round_of(4, 9, 1u << 4, 0);
    struct seqctl_action a2 = {0}, a3 = {0};
    for (int i = 0; i < 3; i++) {
        a2 = seqctl_step(&r2, &dead);
        a3 = seqctl_step(&r3, &dead);
    }
    CHECK_EQ_I64(a2.kind, SEQCTL_NOTHING); /* 3 answers: it takes over */
    CHECK_EQ_I64(a3.kind, SEQCTL_TAKE_OVER);
    CHECK_EQ_U64(a3.session, 12); /* replica 3's first above 9 */
    /* 3 is gone too: 2 is next, with 0 and 1 a majority of five. */
    struct seqctl_round both = round_of(4, 9, 1u << 4 | 1u << 3, 0);
    struct seqctl s = make(5, 2, 0, 0);
    for (int i = 0; i < 3; i++)
        a2 = seqctl_step(&s, &both);
    CHECK_EQ_I64(a2.kind, SEQCTL_TAKE_OVER);
}

TEST(seqctl_sessions_grow_past_every_known_one)
{
    struct seqctl s = make(3, 0, 20, 0); /* its own floor is above the declaration's */
    struct seqctl_round dead = round_of(2, 5, 1u << 2, 1u << 1);
    /* 0 with 1 silent: 0 alone is no majority of three. */
    for (int i = 0; i < 10; i++)
        CHECK_EQ_I64(seqctl_step(&s, &dead).kind, SEQCTL_NOTHING);
    /* 1 gone too (refused is not answering): still no majority. */
    struct seqctl_round dead2 = round_of(2, 5, 1u << 2 | 1u << 1, 0);
    CHECK_EQ_I64(seqctl_step(&s, &dead2).kind, SEQCTL_NOTHING);
    struct seqctl t = make(3, 0, 20, 0);
    struct seqctl_round only2 = round_of(2, 5, 1u << 2, 0);
    t.cfg.order[0] = 2, t.cfg.order[1] = 0, t.cfg.order[2] = 1;
    struct seqctl_action a = {0};
    for (int i = 0; i < 3; i++)
        a = seqctl_step(&t, &only2);
    CHECK_EQ_I64(a.kind, SEQCTL_TAKE_OVER);
    CHECK_EQ_U64(a.session, 25); /* replica 0's first above its floor 20 */
    /* Sessions belong to one replica each, and wrap to the owner's first. */
    CHECK_EQ_U64(seqctl_session_after(0, 2), 3);
    CHECK_EQ_U64(seqctl_session_after(2, 2), 3);
    CHECK_EQ_U64(seqctl_session_after(3, 2), 11);
    CHECK_EQ_U64(seqctl_session_after(4, 0), 9);
    CHECK_EQ_U64(seqctl_session_after(SEQCTL_SESSION_MAX, 6), 7);
    for (uint32_t v = 0; v < 200; v++)
        for (uint32_t id = 0; id < SEQCTL_IDS; id++) {
            uint32_t x = seqctl_session_after(v, id);
            CHECK(x > v && (x - 1) % SEQCTL_IDS == id && x - v <= SEQCTL_IDS);
        }
}

TEST(seqctl_a_named_host_without_its_sequencer_starts_one)
{
    /* Replica 2 restarted: the declaration names it, its process runs no
     * sequencer; it starts one at once, above what it knows and did. */
    struct seqctl s = make(3, 2, 11, 0);
    struct seqctl_round r = round_of(2, 3, 0, 0);
    r.hosting = 0;
    struct seqctl_action a = seqctl_step(&s, &r);
    CHECK_EQ_I64(a.kind, SEQCTL_TAKE_OVER);
    CHECK_EQ_U64(a.session, 19);
    seqctl_took_over(&s, a.session, 0);
    r.session = 19;
    r.hosting = 1;
    CHECK_EQ_I64(seqctl_step(&s, &r).kind, SEQCTL_NOTHING);
    /* Its session is obsolete (the group saw 20): it waits for the newer
     * declaration three rounds, then starts one of its own above it. */
    r.seen = 20;
    CHECK_EQ_I64(seqctl_step(&s, &r).kind, SEQCTL_NOTHING);
    CHECK_EQ_I64(seqctl_step(&s, &r).kind, SEQCTL_NOTHING);
    a = seqctl_step(&s, &r);
    CHECK_EQ_I64(a.kind, SEQCTL_TAKE_OVER);
    CHECK_EQ_U64(a.session, 27);
}

TEST(seqctl_announcing_stops_when_another_hosts)
{
    struct seqctl s = make(3, 2, 0, 0);
    seqctl_took_over(&s, 3, 1);
    CHECK_EQ_I64(seqctl_step(&s, &(struct seqctl_round){0}).kind, SEQCTL_NOTHING);
    struct seqctl_round mine = round_of(2, 3, 0, 1u << 0);
    CHECK_EQ_I64(seqctl_step(&s, &mine).kind, SEQCTL_NOTHING); /* 0 silent: wait */
    struct seqctl_round other = round_of(1, 4, 0, 0);
    CHECK_EQ_I64(seqctl_step(&s, &other).kind, SEQCTL_NOTHING);
    struct seqctl_round all = round_of(2, 3, 0, 0);
    CHECK_EQ_I64(seqctl_step(&s, &all).kind, SEQCTL_NOTHING); /* no longer pending */
}

TEST(seqctl_a_stopping_host_hands_to_the_first_live_successor)
{
    struct seqctl s = make(5, 4, 0, 0); /* order 4, 3, 2, 1, 0 */
    struct seqctl_round r = round_of(4, 5, 0, 1u << 3);
    CHECK_EQ_U64(seqctl_successor(&s, r.probe), 2); /* 3 silent */
    r = round_of(4, 5, 1u << 3 | 1u << 2, 1u << 1 | 1u << 0);
    CHECK_EQ_U64(seqctl_successor(&s, r.probe), SEQCTL_NONE);
    struct seqctl t = make(3, 0, 0, 0);
    r = round_of(0, 5, 0, 0);
    CHECK_EQ_U64(seqctl_successor(&t, r.probe), 2);
}

TEST(seqctl_init_refuses_bad_configs)
{
    struct seqctl s;
    struct seqctl_config c = {.n = 3, .id = 3, .norder = 1, .order = {0}};
    CHECK_ERR(seqctl_init(&s, &c, 0), FK_EINVAL);
    c = (struct seqctl_config){.n = 3, .id = 0, .norder = 2, .order = {1, 1}};
    CHECK_ERR(seqctl_init(&s, &c, 0), FK_EINVAL);
    c = (struct seqctl_config){.n = 3, .id = 0, .norder = 0};
    CHECK_ERR(seqctl_init(&s, &c, 0), FK_EINVAL);
    c = (struct seqctl_config){.n = 3, .id = 0, .norder = 1, .order = {5}};
    CHECK_ERR(seqctl_init(&s, &c, 0), FK_EINVAL);
}

CHECK_MAIN()
