/* Unit tests for NOPaxos persistence and restart (nop_disk.c): three
 * replicas with in-test disks that complete every persist at once, in
 * cookie order; a replica restarted from its disk after the group moved to
 * a new view recovers into that view (never acting on its stale one) and
 * receives fewer bytes than one restarted empty; malformed records are
 * rejected with FK_EMALFORMED and misuse with FK_EINVAL. */
#include "check.h"
#include "core_fix.h"
#include "fk_error.h"
#include "kv.h"
#include "nop.h"

#include <stdio.h>
#include <stdlib.h>

#define N 3

/* A group on the shared fixture (tests/core_fix.h): depth-first delivery,
 * disks that complete every persist at once, in cookie order. Client
 * replies are test_nop_core.c's subject. */
struct group {
    struct cfx fx;
};

#define R(g, i) ((struct nop *)(g)->fx.core[i].impl)

static const struct cons_core_config cfg = {.log_cap =
                                                64, /* checkpoints every 16 committed slots */
                                            .history_bytes = CONS_HISTORY_NONE,
                                            .xfer_chunk = 256,
                                            .xfer_window = 4,
                                            .clients_max = 4,
                                            .heartbeat_ns = 10,
                                            .election_ns = 100};

/* A core for replica slot i with the identity of replica id, outside the
 * fixture (the restore tests feed it records by hand). */
static struct nop *make(struct group *g, uint32_t i, uint32_t id)
{
    struct nop_config c = {.n = N,
                           .id = id,
                           .log_cap = cfg.log_cap,
                           .xfer_chunk = cfg.xfer_chunk,
                           .xfer_window = cfg.xfer_window,
                           .clients_max = cfg.clients_max,
                           .heartbeat_ns = cfg.heartbeat_ns,
                           .election_ns = cfg.election_ns,
                           .seed = g->fx.now + i + 1};
    int err;
    if (!g->fx.kv[i]) /* the machine survives a crash: it is on the disk (cons.h) */
        g->fx.kv[i] = kv_mem_create(8);
    struct nop *r = nop_create(&c, kv_mem_sm(g->fx.kv[i]), &err);
    CHECK_OK(err);
    return r;
}

static void start(struct group *g)
{
    memset(g, 0, sizeof *g);
    cfx_init(&g->fx, CONS_PROTO_NOP, N, &cfg, CFX_DIRECT, CFX_DISK_NOW);
    for (uint32_t i = 0; i < N; i++) {
        cfx_boot(&g->fx, i, CONS_START_FRESH);
        CHECK(g->fx.disk[i].meta.buf != NULL); /* its metadata, so it can restart from disk */
    }
}

static void crash(struct group *g, uint32_t i)
{
    cfx_crash(&g->fx, i);
}

static void stop(struct group *g)
{
    cfx_stop(&g->fx);
}

static void ticks(struct group *g, int n)
{
    cfx_ticks(&g->fx, n, 5);
}

static void put(struct group *g, uint64_t req)
{
    struct cons_op op;
    char k[2] = {'k', (char)('a' + req % 3)}, v[24];
    int vlen = snprintf(v, sizeof v, "v%llu", (unsigned long long)req);
    cons_op_init(&op, CONS_OP_PUT, k, sizeof k, v, (uint32_t)vlen, NULL, 0);
    op.client_id = 5;
    op.req_no = req;
    uint64_t num = cfx_oum_next(&g->fx);
    for (uint32_t i = 0; i < N; i++)
        cfx_oum_to(&g->fx, i, num, &op, 0);
    ticks(g, 2);
}

/* Restarts replica i from its disk (with_disk) or empty; returns the
 * slots it executed before it heard anybody. */
static uint64_t restart(struct group *g, uint32_t i, int with_disk)
{
    struct cons_outbox *ob =
        cfx_boot_quiet(&g->fx, i, with_disk ? CONS_START_RESTORED : CONS_START_EMPTY);
    struct nop_stat st;
    nop_status(R(g, i), &st);
    CHECK_EQ_I64(st.status, NOP_RECOVERING); /* never acts before recovery */
    cfx_deliver(&g->fx, i, ob);
    return st.executed;
}

static void same_state(struct group *g, uint32_t a, uint32_t b)
{
    CHECK(cfx_same_pairs(&g->fx, a, b));
}

/* Replica 2 crashes after 20 committed puts (20 entries on its disk: a
 * snapshot goes there only once a ring of entries is), misses a session change (a new view) and 6
 * more (one lost to the session change, so a NO-OP), then restarts. Returns the bytes it received
 * while it recovered. */
static uint64_t crash_and_restart(struct group *g, int with_disk, uint64_t *restored)
{
    start(g);
    for (uint64_t k = 1; k <= 20; k++)
        put(g, k);
    ticks(g, 10);
    crash(g, 2);
    g->fx.session = 1; /* the sequencer fails over: view (0, 1) */
    g->fx.msgnum = 0;
    for (uint64_t k = 21; k <= 26; k++)
        put(g, k);
    ticks(g, 10);
    struct nop_stat st0;
    nop_status(R(g, 0), &st0);
    CHECK_EQ_U64(st0.view.session, 1);
    CHECK_EQ_U64(st0.commit, 26);
    g->fx.bytes_to[2] = 0;
    *restored = restart(g, 2, with_disk);
    struct nop_stat st;
    nop_status(R(g, 2), &st);
    for (int t = 0; t < 40 && st.status != NOP_NORMAL; t++) {
        ticks(g, 1);
        nop_status(R(g, 2), &st);
    }
    uint64_t bytes = g->fx.bytes_to[2];
    CHECK_EQ_I64(st.status, NOP_NORMAL);
    CHECK_EQ_U64(st.view.session, 1); /* the group's view, not its stale one */
    ticks(g, 20);
    nop_status(R(g, 2), &st);
    CHECK_EQ_U64(st.commit, 26);
    CHECK_EQ_U64(st.executed, 26);
    same_state(g, 0, 2);
    CHECK_EQ_U64(st.log_len, 26);
    stop(g);
    return bytes;
}

TEST(restart_with_disk_rejoins_and_transfers_less)
{
    static struct group g;
    uint64_t restored_disk, restored_empty;
    uint64_t with_disk = crash_and_restart(&g, 1, &restored_disk);
    uint64_t empty = crash_and_restart(&g, 0, &restored_empty);
    CHECK_MSG(restored_disk >= 18, "restored prefix %llu", (unsigned long long)restored_disk);
    CHECK_EQ_U64(restored_empty, 0);
    CHECK_MSG(with_disk < empty, "recovery bytes with disk %llu, empty %llu",
              (unsigned long long)with_disk, (unsigned long long)empty);
    printf("recovery bytes received: with disk %llu, empty %llu\n", (unsigned long long)with_disk,
           (unsigned long long)empty);
}

/* A checkpoint is the whole state, so the disk takes one only when its
 * log would otherwise outgrow a ring after the one it holds: 200 puts make
 * 12 checkpoints (one every 16 slots), about a third of them reach the
 * disk, and the disk still restores the whole committed prefix. */
TEST(snapshots_reach_the_disk_once_a_ring_and_restore_everything)
{
    static struct group g;
    start(&g);
    for (uint64_t k = 1; k <= 200; k++)
        put(&g, k);
    ticks(&g, 10);
    struct nop_stat st;
    nop_status(R(&g, 2), &st);
    CHECK_EQ_U64(st.commit, 200);
    printf("snapshots persisted for 200 committed slots: %u\n", g.fx.disk[2].nsnaps);
    CHECK(g.fx.disk[2].nsnaps >= 2 && g.fx.disk[2].nsnaps <= 5);
    crash(&g, 2);
    CHECK_EQ_U64(restart(&g, 2, 1), 200);
    for (int t = 0; t < 40 && st.status != NOP_NORMAL; t++) {
        ticks(&g, 1);
        nop_status(R(&g, 2), &st);
    }
    CHECK_EQ_I64(st.status, NOP_NORMAL);
    ticks(&g, 5);
    same_state(&g, 0, 2);
    stop(&g);
}

TEST(restore_rejects_malformed_records)
{
    static struct group g;
    start(&g);
    for (uint64_t k = 1; k <= 70; k++) /* the first snapshot on disk: past a ring */
        put(&g, k);
    ticks(&g, 10);
    struct cfx_disk *d = &g.fx.disk[1];
    struct kv_mem *kv1 = g.fx.kv[1]; /* make() below reuses the slot */
    CHECK(d->meta.buf && d->snap.buf);
    g.fx.kv[1] = NULL; /* a fresh machine for each make() below */
    struct nop *r = make(&g, 1, 1);
    struct kv_mem *kv = g.fx.kv[1];
    uint8_t junk[64] = {1, 2, 3};
    CHECK_ERR(nop_restore_meta(r, junk, sizeof junk), FK_EMALFORMED);
    CHECK_ERR(nop_restore_meta(r, d->meta.buf, d->meta.len - 1), FK_EMALFORMED);
    CHECK_ERR(nop_restore_entry(r, junk, 9), FK_EMALFORMED); /* slot 0x030201, kind 0 */
    uint8_t ent[9] = {1, 0, 0, 0, 0, 0, 0, 0, 2};            /* slot 1, a NO-OP */
    CHECK_OK(nop_restore_entry(r, ent, sizeof ent));
    ent[8] = 7; /* no such kind */
    CHECK_ERR(nop_restore_entry(r, ent, sizeof ent), FK_EMALFORMED);
    memset(ent, 0, 8); /* slot 0 */
    ent[8] = 2;
    CHECK_ERR(nop_restore_entry(r, ent, sizeof ent), FK_EMALFORMED);
    CHECK_ERR(nop_restore_entry(r, d->ents[0].buf ? d->ents[0].buf : junk, 8), FK_EMALFORMED);
    CHECK_ERR(nop_restore_snapshot(r, d->snap.buf, d->snap.len - 1), FK_EMALFORMED);
    CHECK_ERR(nop_restore_snapshot(r, junk, 3), FK_EMALFORMED);
    struct cons_outbox *ob;
    CHECK_ERR(nop_start(r, NOP_START_RESTORED, 0, &ob), FK_EINVAL); /* no META */
    nop_destroy(r);
    kv_mem_destroy(kv);
    /* Another replica's metadata is not this one's. */
    g.fx.kv[1] = NULL;
    r = make(&g, 1, 2);
    kv = g.fx.kv[1];
    CHECK_ERR(nop_restore_meta(r, d->meta.buf, d->meta.len), FK_EMALFORMED);
    nop_destroy(r);
    kv_mem_destroy(kv);
    /* The real records restore; nothing restores after start. */
    g.fx.kv[1] = NULL;
    r = make(&g, 1, 1);
    kv = g.fx.kv[1];
    CHECK_OK(nop_restore_meta(r, d->meta.buf, d->meta.len));
    CHECK_OK(nop_restore_snapshot(r, d->snap.buf, d->snap.len));
    CHECK_OK(nop_start(r, NOP_START_RESTORED, g.fx.now, &ob));
    CHECK_ERR(nop_restore_meta(r, d->meta.buf, d->meta.len), FK_EINVAL);
    CHECK_ERR(nop_restore_snapshot(r, d->snap.buf, d->snap.len), FK_EINVAL);
    CHECK_ERR(nop_start(r, NOP_START_RESTORED, g.fx.now, &ob), FK_EINVAL);
    nop_invariants(r);
    nop_destroy(r);
    kv_mem_destroy(kv);
    g.fx.kv[1] = kv1;
    crash(&g, 1);
    stop(&g);
}

CHECK_MAIN()
