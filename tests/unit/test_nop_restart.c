/* Unit tests for NOPaxos persistence and restart (nop_disk.c): three
 * replicas with in-test disks that complete every persist at once, in
 * cookie order; a replica restarted from its disk after the group moved to
 * a new view recovers into that view (never acting on its stale one) and
 * receives fewer bytes than one restarted empty; malformed records are
 * rejected with FK_EMALFORMED and misuse with FK_EINVAL. */
#include "check.h"
#include "fk_error.h"
#include "kv.h"
#include "nop.h"

#include <stdio.h>
#include <stdlib.h>

#define N     3
#define SLOTS 64 /* disk entry records, by slot % SLOTS (>= log_cap) */

struct rec {
    uint8_t *buf;
    uint32_t len;
    uint64_t index;
};

struct disk {
    struct rec meta, snap, ents[SLOTS];
    uint64_t last_cookie;
    uint32_t nsnaps; /* SNAPSHOT items written */
};

struct group {
    struct nop *r[N];
    struct kv_mem *kv[N];
    struct disk disk[N];
    uint64_t now, msgnum, bytes_to[N];
    uint32_t session, down;
};

static void rec_set(struct rec *d, const struct cons_persist *p)
{
    free(d->buf);
    d->buf = malloc(p->len + 1);
    memcpy(d->buf, p->buf, p->len);
    d->len = p->len;
    d->index = p->index;
}

static void rec_clear(struct rec *d)
{
    free(d->buf);
    memset(d, 0, sizeof *d);
}

static void disk_wipe(struct disk *d)
{
    rec_clear(&d->meta);
    rec_clear(&d->snap);
    for (int k = 0; k < SLOTS; k++)
        rec_clear(&d->ents[k]);
}

/* The disk completes every item in order (cookies strictly increase). */
static void disk_apply(struct disk *d, const struct cons_outbox *ob)
{
    for (uint32_t k = 0; k < ob->npersists; k++) {
        const struct cons_persist *p = &ob->persists[k];
        CHECK(p->cookie > d->last_cookie);
        d->last_cookie = p->cookie;
        if (p->kind == CONS_PERSIST_META) {
            rec_set(&d->meta, p);
        } else if (p->kind == CONS_PERSIST_ENTRY) {
            rec_set(&d->ents[p->index % SLOTS], p);
        } else {
            CHECK_EQ_U64(p->kind, CONS_PERSIST_SNAPSHOT);
            rec_set(&d->snap, p);
            d->nsnaps++;
            for (int e = 0; e < SLOTS; e++) {
                if (d->ents[e].buf && d->ents[e].index <= p->index)
                    rec_clear(&d->ents[e]);
            }
        }
    }
}

static void deliver(struct group *g, uint32_t from, struct cons_outbox *ob);

static void step(struct group *g, uint32_t i, const struct cons_input *in)
{
    struct cons_outbox *ob;
    CHECK_OK(nop_step(g->r[i], in, g->now, &ob));
    CHECK_OK(nop_seal(g->r[i])); /* each step a commit (nop.h) */
    nop_invariants(g->r[i]);
    deliver(g, i, ob);
}

static void deliver(struct group *g, uint32_t from, struct cons_outbox *ob)
{
    uint32_t nm = ob->nmsgs;
    int persisted = ob->npersists > 0;
    uint64_t cookie = g->disk[from].last_cookie;
    disk_apply(&g->disk[from], ob);
    if (persisted)
        cookie = g->disk[from].last_cookie;
    struct cons_out_msg *msgs = malloc(nm * sizeof *msgs + 1);
    uint8_t *copy = malloc(ob->arena_used + 1);
    memcpy(copy, ob->arena, ob->arena_used);
    for (uint32_t k = 0; k < nm; k++) {
        msgs[k] = ob->msgs[k];
        msgs[k].buf = copy + (ob->msgs[k].buf - ob->arena);
    }
    for (uint32_t k = 0; k < nm; k++) {
        uint32_t to = (uint32_t)msgs[k].to.id;
        if (msgs[k].to.kind != CONS_ADDR_REPLICA || (g->down >> to & 1))
            continue; /* client replies are test_nop_core.c's subject */
        struct cons_input in = {.kind = CONS_IN_MSG,
                                .from = cons_replica(from),
                                .buf = msgs[k].buf,
                                .len = msgs[k].len};
        g->bytes_to[to] += msgs[k].len;
        step(g, to, &in);
    }
    free(msgs);
    free(copy);
    if (persisted && !(g->down >> from & 1)) {
        struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = cookie};
        step(g, from, &in);
    }
}

static struct nop *make(struct group *g, uint32_t i, uint32_t id)
{
    struct nop_config c = {.n = N,
                           .id = id,
                           .log_cap = 64, /* checkpoints every 16 committed slots */
                           .xfer_chunk = 256,
                           .xfer_window = 4,
                           .clients_max = 4,
                           .heartbeat_ns = 10,
                           .election_ns = 100,
                           .seed = g->now + i + 1};
    int err;
    if (!g->kv[i]) /* the machine survives a crash: it is on the disk (cons.h) */
        g->kv[i] = kv_mem_create(8);
    struct nop *r = nop_create(&c, kv_mem_sm(g->kv[i]), &err);
    CHECK_OK(err);
    return r;
}

static void start(struct group *g)
{
    memset(g, 0, sizeof *g);
    for (uint32_t i = 0; i < N; i++) {
        g->r[i] = make(g, i, i);
        struct cons_outbox *ob;
        CHECK_OK(nop_start(g->r[i], NOP_START_FRESH, 0, &ob));
        CHECK(ob->npersists >= 1); /* its metadata, so it can restart from disk */
        deliver(g, i, ob);
    }
}

static void crash(struct group *g, uint32_t i)
{
    nop_destroy(g->r[i]);
    g->r[i] = NULL;
    g->down |= 1u << i;
}

static void stop(struct group *g)
{
    for (uint32_t i = 0; i < N; i++) {
        if (g->r[i])
            crash(g, i);
        kv_mem_destroy(g->kv[i]);
        g->kv[i] = NULL;
        disk_wipe(&g->disk[i]);
    }
}

static void ticks(struct group *g, int n)
{
    for (int t = 0; t < n; t++) {
        g->now += 5;
        for (uint32_t i = 0; i < N; i++) {
            struct cons_input in = {.kind = CONS_IN_TICK};
            if (!(g->down >> i & 1))
                step(g, i, &in);
        }
    }
}

static void put(struct group *g, uint64_t req)
{
    struct cons_op op;
    uint8_t buf[4096];
    char k[2] = {'k', (char)('a' + req % 3)}, v[24];
    int vlen = snprintf(v, sizeof v, "v%llu", (unsigned long long)req);
    cons_op_init(&op, CONS_OP_PUT, k, sizeof k, v, (uint32_t)vlen, NULL, 0);
    op.client_id = 5;
    op.req_no = req;
    uint64_t num = ++g->msgnum;
    int len = nop_encode_oum_request(buf, sizeof buf, g->session, num, &op);
    CHECK(len > 0);
    for (uint32_t i = 0; i < N; i++) {
        struct cons_input in = {
            .kind = CONS_IN_MSG, .from = {CONS_ADDR_OUM, 0}, .buf = buf, .len = (size_t)len};
        if (!(g->down >> i & 1))
            step(g, i, &in);
    }
    ticks(g, 2);
}

/* Restarts replica i from its disk (with_disk) or empty; returns the
 * slots it executed before it heard anybody. */
static uint64_t restart(struct group *g, uint32_t i, int with_disk)
{
    struct disk *d = &g->disk[i];
    if (!with_disk) { /* the disk went, the machine with it */
        kv_mem_destroy(g->kv[i]);
        g->kv[i] = NULL;
    }
    g->r[i] = make(g, i, i);
    g->down &= ~(1u << i);
    d->last_cookie = 0; /* cookies count per incarnation */
    if (!with_disk)
        disk_wipe(d);
    if (with_disk) {
        CHECK(d->meta.buf != NULL);
        CHECK_OK(nop_restore_meta(g->r[i], d->meta.buf, d->meta.len));
        if (d->snap.buf)
            CHECK_OK(nop_restore_snapshot(g->r[i], d->snap.buf, d->snap.len));
        for (int k = 0; k < SLOTS; k++) {
            if (d->ents[k].buf && d->ents[k].index > d->snap.index)
                CHECK_OK(nop_restore_entry(g->r[i], d->ents[k].buf, d->ents[k].len));
        }
    }
    struct cons_outbox *ob;
    CHECK_OK(nop_start(g->r[i], with_disk ? NOP_START_RESTORED : NOP_START_EMPTY, g->now, &ob));
    struct nop_stat st;
    nop_status(g->r[i], &st);
    CHECK_EQ_I64(st.status, NOP_RECOVERING); /* never acts before recovery */
    deliver(g, i, ob);
    return st.executed;
}

static void same_state(struct group *g, uint32_t a, uint32_t b)
{
    static uint8_t x[(1 << 16) + CONS_SNAP_RECORD_MAX], y[(1 << 16) + CONS_SNAP_RECORD_MAX];
    size_t lx, ly;
    struct cons_sm sa = kv_mem_sm(g->kv[a]), sb = kv_mem_sm(g->kv[b]);
    CHECK_OK(cons_sm_pairs(&sa, x, sizeof x, &lx));
    CHECK_OK(cons_sm_pairs(&sb, y, sizeof y, &ly));
    CHECK(lx == ly && memcmp(x, y, lx) == 0);
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
    g->session = 1; /* the sequencer fails over: view (0, 1) */
    g->msgnum = 0;
    for (uint64_t k = 21; k <= 26; k++)
        put(g, k);
    ticks(g, 10);
    struct nop_stat st0;
    nop_status(g->r[0], &st0);
    CHECK_EQ_U64(st0.view.session, 1);
    CHECK_EQ_U64(st0.commit, 26);
    g->bytes_to[2] = 0;
    *restored = restart(g, 2, with_disk);
    struct nop_stat st;
    nop_status(g->r[2], &st);
    for (int t = 0; t < 40 && st.status != NOP_NORMAL; t++) {
        ticks(g, 1);
        nop_status(g->r[2], &st);
    }
    uint64_t bytes = g->bytes_to[2];
    CHECK_EQ_I64(st.status, NOP_NORMAL);
    CHECK_EQ_U64(st.view.session, 1); /* the group's view, not its stale one */
    ticks(g, 20);
    nop_status(g->r[2], &st);
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
    nop_status(g.r[2], &st);
    CHECK_EQ_U64(st.commit, 200);
    printf("snapshots persisted for 200 committed slots: %u\n", g.disk[2].nsnaps);
    CHECK(g.disk[2].nsnaps >= 2 && g.disk[2].nsnaps <= 5);
    crash(&g, 2);
    CHECK_EQ_U64(restart(&g, 2, 1), 200);
    for (int t = 0; t < 40 && st.status != NOP_NORMAL; t++) {
        ticks(&g, 1);
        nop_status(g.r[2], &st);
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
    struct disk *d = &g.disk[1];
    struct kv_mem *kv1 = g.kv[1]; /* make() below reuses the slot */
    CHECK(d->meta.buf && d->snap.buf);
    g.kv[1] = NULL; /* a fresh machine for each make() below */
    struct nop *r = make(&g, 1, 1);
    struct kv_mem *kv = g.kv[1];
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
    g.kv[1] = NULL;
    r = make(&g, 1, 2);
    kv = g.kv[1];
    CHECK_ERR(nop_restore_meta(r, d->meta.buf, d->meta.len), FK_EMALFORMED);
    nop_destroy(r);
    kv_mem_destroy(kv);
    /* The real records restore; nothing restores after start. */
    g.kv[1] = NULL;
    r = make(&g, 1, 1);
    kv = g.kv[1];
    CHECK_OK(nop_restore_meta(r, d->meta.buf, d->meta.len));
    CHECK_OK(nop_restore_snapshot(r, d->snap.buf, d->snap.len));
    CHECK_OK(nop_start(r, NOP_START_RESTORED, g.now, &ob));
    CHECK_ERR(nop_restore_meta(r, d->meta.buf, d->meta.len), FK_EINVAL);
    CHECK_ERR(nop_restore_snapshot(r, d->snap.buf, d->snap.len), FK_EINVAL);
    CHECK_ERR(nop_start(r, NOP_START_RESTORED, g.now, &ob), FK_EINVAL);
    nop_invariants(r);
    nop_destroy(r);
    kv_mem_destroy(kv);
    g.kv[1] = kv1;
    crash(&g, 1);
    stop(&g);
}

CHECK_MAIN()
