/* Unit tests for server/kv_sm: the LMDB state machine must answer exactly
 * as the simulator's in-memory one (consensus/kv.h), reply for reply and
 * snapshot byte for byte, under a random operation mix. */
#include "check.h"
#include "cons.h"
#include "fk_error.h"
#include "kv.h"
#include "kv_sm.h"

#include <stdio.h>
#include <stdlib.h>

static char dir[64];
static struct kv_store *store;
static struct kv_sm sm;

static void open_all(uint64_t quota)
{
    snprintf(dir, sizeof dir, "/tmp/fksmXXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    struct kv_store_opts o = {.dir = dir, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &store));
    CHECK_OK(kv_sm_init(&sm, store, quota));
}

static void close_all(void)
{
    kv_store_close(store);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static uint64_t rng = 12345;
static uint32_t rnd(uint32_t n)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng >> 33) % n;
}

static void random_op(struct cons_op *op, uint64_t req)
{
    memset(op, 0, sizeof *op);
    op->client_id = 1;
    op->req_no = req;
    op->type = (uint8_t)(1 + rnd(5));
    /* 40 keys of 1..6 bytes: prefixes of each other exercise the order. */
    op->key_len = (uint16_t)(1 + rnd(6));
    for (int i = 0; i < op->key_len; i++)
        op->key[i] = (uint8_t)('a' + (rnd(40) + i) % 3);
    op->val_len = (uint16_t)rnd(CONS_VAL_MAX + 1);
    memset(op->val, 'a' + rnd(26), op->val_len);
    op->exp_len = (uint16_t)rnd(3) ? (uint16_t)op->val_len : 0;
    memset(op->exp, op->val[0], op->exp_len);
    op->scan_limit = (uint8_t)(1 + rnd(CONS_SCAN_MAX));
}

static struct cons_reply r1, r2;
static uint8_t snap1[1 << 20], snap2[1 << 20];

TEST(sm_matches_in_memory_machine)
{
    open_all(0);
    struct kv_mem *mem = kv_mem_create(1000);
    CHECK(mem != NULL);
    struct cons_sm a = kv_mem_sm(mem), b = kv_sm_cons(&sm);
    struct cons_op op;
    for (uint64_t i = 1; i <= 5000; i++) {
        random_op(&op, i);
        CHECK_OK(kv_write_begin(store));
        CHECK_OK(a.ops->apply(a.impl, &op, &r1));
        CHECK_OK(b.ops->apply(b.impl, &op, &r2));
        CHECK_OK(kv_write_commit(store));
        CHECK_MSG(r1.status == r2.status && r1.len == r2.len &&
                      memcmp(r1.data, r2.data, r1.len) == 0,
                  "op %lu type %d: mem status %d len %u, lmdb status %d len %u", (unsigned long)i,
                  op.type, r1.status, r1.len, r2.status, r2.len);
    }
    size_t l1, l2;
    CHECK_OK(a.ops->snapshot(a.impl, snap1, sizeof snap1, &l1));
    CHECK_OK(b.ops->snapshot(b.impl, snap2, sizeof snap2, &l2));
    CHECK_EQ_U64(l1, l2);
    CHECK(memcmp(snap1, snap2, l1) == 0);
    kv_mem_destroy(mem);
    close_all();
}

TEST(sm_snapshot_install_round_trip_and_rejects_garbage)
{
    open_all(0);
    struct cons_sm b = kv_sm_cons(&sm);
    struct cons_op op;
    CHECK_OK(kv_write_begin(store));
    for (uint64_t i = 1; i <= 300; i++) {
        random_op(&op, i);
        op.type = CONS_OP_PUT;
        CHECK_OK(b.ops->apply(b.impl, &op, &r1));
    }
    CHECK_OK(kv_write_commit(store));
    size_t l1, l2;
    CHECK_OK(b.ops->snapshot(b.impl, snap1, sizeof snap1, &l1));
    uint64_t bytes = sm.bytes;
    CHECK_ERR(b.ops->snapshot(b.impl, snap2, 10, &l2), FK_ETOOBIG);
    /* Garbage and unordered snapshots are refused; the state stays. */
    CHECK_OK(kv_write_begin(store));
    CHECK_ERR(b.ops->install(b.impl, snap1, l1 - 1), FK_EMALFORMED);
    uint8_t bad[] = {2, 0, 0, 0, 1, 0, 'b', 0, 0, 1, 0, 'a', 0, 0};
    CHECK_ERR(b.ops->install(b.impl, bad, sizeof bad), FK_EMALFORMED);
    CHECK_OK(b.ops->install(b.impl, snap1, l1));
    CHECK_OK(kv_write_commit(store));
    CHECK_EQ_U64(sm.bytes, bytes);
    CHECK_OK(b.ops->snapshot(b.impl, snap2, sizeof snap2, &l2));
    CHECK_EQ_U64(l1, l2);
    CHECK(memcmp(snap1, snap2, l1) == 0);
    /* The byte count survives a reopen. */
    kv_store_close(store);
    struct kv_store_opts o = {.dir = dir, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &store));
    CHECK_OK(kv_sm_init(&sm, store, 0));
    CHECK_EQ_U64(sm.bytes, bytes);
    close_all();
}

TEST(sm_quota_is_a_deterministic_reply)
{
    open_all(3000);
    struct cons_sm b = kv_sm_cons(&sm);
    struct cons_op op = {.client_id = 1, .type = CONS_OP_PUT, .key_len = 1, .val_len = 1000};
    int full = 0;
    CHECK_OK(kv_write_begin(store));
    for (int i = 0; i < 5; i++) {
        op.key[0] = (uint8_t)('a' + i);
        CHECK_OK(b.ops->apply(b.impl, &op, &r1));
        full += r1.status == FK_EFULL;
    }
    CHECK_EQ_I64(full, 3); /* 2 x 1001 bytes fit in 3000, the third does not */
    /* Deleting makes room again. */
    op.type = CONS_OP_DEL;
    op.key[0] = 'a';
    CHECK_OK(b.ops->apply(b.impl, &op, &r1));
    CHECK_EQ_I64(r1.status, 0);
    op.type = CONS_OP_PUT;
    op.key[0] = 'z';
    CHECK_OK(b.ops->apply(b.impl, &op, &r1));
    CHECK_EQ_I64(r1.status, 0);
    CHECK_OK(kv_write_commit(store));
    CHECK_EQ_U64(sm.bytes, 2002);
    close_all();
}

CHECK_MAIN()
