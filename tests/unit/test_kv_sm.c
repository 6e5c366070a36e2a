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
    if (op->type == CONS_OP_SCAN) { /* an end key (or none) and maybe AFTER the start */
        op->exp_len = (uint16_t)(rnd(3) ? 0 : 1 + rnd(6));
        for (int i = 0; i < op->exp_len; i++)
            op->exp[i] = (uint8_t)('a' + rnd(3));
        op->scan_flags = (uint8_t)rnd(2);
    }
}

static struct cons_reply r1, r2;

/* The keys of a scan reply, concatenated with '|'. */
static const char *scan_keys(const struct cons_reply *r)
{
    static char out[256];
    size_t at = 0, o = 0;
    out[0] = '\0';
    while (at + 2 <= r->len && o + 16 < sizeof out) {
        uint16_t kl, vl;
        memcpy(&kl, r->data + at, 2);
        o += (size_t)snprintf(out + o, sizeof out - o, "%s%.*s", o ? "|" : "", (int)kl,
                              (const char *)r->data + at + 2);
        memcpy(&vl, r->data + at + 2 + kl, 2);
        at += 4u + kl + vl;
    }
    return out;
}

/* Start inclusive or AFTER it, an optional end key (exclusive), a limit:
 * the same answers from both machines, and a page walk that continues
 * AFTER the last key visits every key once. */
TEST(scan_start_after_end_and_paging)
{
    open_all(0);
    struct kv_mem *mem = kv_mem_create(100);
    CHECK(mem != NULL);
    struct cons_sm sms[2] = {kv_mem_sm(mem), kv_sm_cons(&sm)};
    static const char *const keys[] = {"a", "ab", "abc", "b", "ba", "c"};
    struct cons_op op;
    uint64_t req = 0;
    CHECK_OK(kv_write_begin(store));
    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            memset(&op, 0, sizeof op);
            op.client_id = 1;
            op.req_no = ++req;
            op.type = CONS_OP_PUT;
            op.key_len = (uint16_t)strlen(keys[i]);
            memcpy(op.key, keys[i], op.key_len);
            op.val_len = 1;
            op.val[0] = 'v';
            CHECK_OK(sms[m].ops->apply(sms[m].impl, &op, &r1));
        }
    }
    static const struct {
        const char *start, *end;
        uint8_t flags, limit;
        const char *want;
    } cases[] = {
        {"ab", "", 0, 16, "ab|abc|b|ba|c"},
        {"ab", "", CONS_SCAN_AFTER, 16, "abc|b|ba|c"},
        {"aa", "", CONS_SCAN_AFTER, 2, "ab|abc"},
        {"", "b", 0, 16, "a|ab|abc"},
        {"a", "ba", CONS_SCAN_AFTER, 16, "ab|abc|b"},
        {"c", "", CONS_SCAN_AFTER, 16, ""},
        {"b", "b", 0, 16, ""},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int m = 0; m < 2; m++) {
            memset(&op, 0, sizeof op);
            op.client_id = 1;
            op.req_no = ++req;
            op.type = CONS_OP_SCAN;
            op.scan_limit = cases[c].limit;
            op.scan_flags = cases[c].flags;
            op.key_len = (uint16_t)strlen(cases[c].start);
            memcpy(op.key, cases[c].start, op.key_len);
            op.exp_len = (uint16_t)strlen(cases[c].end);
            memcpy(op.exp, cases[c].end, op.exp_len);
            CHECK_OK(sms[m].ops->apply(sms[m].impl, &op, &r1));
            CHECK_MSG(strcmp(scan_keys(&r1), cases[c].want) == 0,
                      "case %zu machine %d: got %s, want %s", c, m, scan_keys(&r1), cases[c].want);
        }
    }
    /* Pages of two, each AFTER the last key of the one before. */
    for (int m = 0; m < 2; m++) {
        char walk[256] = "";
        memset(&op, 0, sizeof op);
        op.client_id = 1;
        op.type = CONS_OP_SCAN;
        op.scan_limit = 2;
        for (int page = 0; page < 10; page++) {
            op.req_no = ++req;
            CHECK_OK(sms[m].ops->apply(sms[m].impl, &op, &r1));
            if (r1.len == 0)
                break;
            const char *k = scan_keys(&r1);
            snprintf(walk + strlen(walk), sizeof walk - strlen(walk), "%s%s", walk[0] ? "|" : "",
                     k);
            const char *last = strrchr(k, '|') ? strrchr(k, '|') + 1 : k;
            op.key_len = (uint16_t)strlen(last);
            memcpy(op.key, last, op.key_len);
            op.scan_flags = CONS_SCAN_AFTER;
        }
        CHECK_MSG(strcmp(walk, "a|ab|abc|b|ba|c") == 0, "machine %d walked %s", m, walk);
    }
    kv_write_abort(store);
    kv_mem_destroy(mem);
    close_all();
}
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
        full += r1.status == FK_EQUOTA;
        if (r1.status == FK_EQUOTA) /* the reply says by how much */
            CHECK_MSG(r1.len == 18 && memcmp(r1.data, "3015 of 3000 bytes", 18) == 0, "%.*s",
                      (int)r1.len, (const char *)r1.data);
    }
    CHECK_EQ_I64(full, 3); /* 2 x 1005 bytes fit in 3000, the third does not */
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
    CHECK_EQ_U64(sm.bytes, 2010);
    close_all();
    /* Many tiny pairs: the quota bounds the snapshot too (quota + 4). */
    open_all(3000);
    struct cons_op tiny = {.client_id = 1, .type = CONS_OP_PUT, .key_len = 3};
    CHECK_OK(kv_write_begin(store));
    int stored = 0;
    for (int i = 0; i < 1000; i++) {
        tiny.key[0] = (uint8_t)('a' + i % 26);
        tiny.key[1] = (uint8_t)('a' + i / 26 % 26);
        tiny.key[2] = (uint8_t)('a' + i / 676);
        CHECK_OK(b.ops->apply(b.impl, &tiny, &r1));
        stored += r1.status == 0;
    }
    CHECK_EQ_I64(stored, 3000 / 7);
    static uint8_t snap[8192];
    size_t len;
    CHECK_OK(b.ops->snapshot(b.impl, snap, sizeof snap, &len));
    CHECK_MSG(len <= 3000 + 4, "a snapshot of %zu bytes under a quota of 3000", len);
    CHECK_OK(kv_write_commit(store));
    close_all();
}

CHECK_MAIN()
