/* Unit tests for server/kv_sm: the LMDB state machine must answer exactly
 * as the simulator's in-memory one (consensus/kv.h), reply for reply and
 * snapshot byte for byte, under a random operation mix; and it keeps the
 * sessions and the mark, and streams and installs the state (cons.h, "The
 * stream") byte for byte as the contract lays it out. */
#include "check.h"
#include "cons.h"
#include "cons_wire.h"
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

/* Builds op (client 1, request 0) from bytes that may be anywhere: they
 * are copied one after another into a static buffer first, which
 * cons_op_init wants for an op too large to hold inline. op is valid
 * until the next call. */
static void build_op(struct cons_op *op, uint8_t type, const void *k, size_t kl, const void *v,
                     size_t vl, const void *e, size_t el)
{
    static uint8_t bytes[CONS_KEY_MAX + 2 * (size_t)CONS_VAL_MAX];
    CHECK(kl <= CONS_KEY_MAX && vl <= CONS_VAL_MAX && el <= CONS_VAL_MAX);
    if (kl)
        memcpy(bytes, k, kl);
    if (vl)
        memcpy(bytes + kl, v, vl);
    if (el)
        memcpy(bytes + kl + vl, e, el);
    cons_op_init(op, type, bytes, (uint32_t)kl, bytes + kl, (uint32_t)vl, bytes + kl + vl,
                 (uint32_t)el);
    op->client_id = 1;
}

/* Values both machines hold: mostly up to 1 KiB, one in 16 up to the
 * in-memory machine's largest (scans of those fill pages). */
static void random_op(struct cons_op *op, uint64_t req)
{
    static uint8_t val[KV_MEM_VAL_MAX];
    uint8_t key[6], exp[6];
    uint8_t type = (uint8_t)(1 + rnd(5));
    /* 40 keys of 1..6 bytes: prefixes of each other exercise the order. */
    size_t kl = 1 + rnd(6);
    for (size_t i = 0; i < kl; i++)
        key[i] = (uint8_t)('a' + (rnd(40) + i) % 3);
    size_t vl = rnd(16) ? rnd(1025) : rnd(KV_MEM_VAL_MAX + 1);
    memset(val, 'a' + rnd(26), vl);
    /* A CAS expects a value like the new one, or an empty one. */
    size_t el = rnd(3) ? vl : 0;
    uint8_t scan_limit = (uint8_t)(1 + rnd(CONS_SCAN_MAX)), scan_flags = 0;
    if (type == CONS_OP_SCAN) { /* an end key (or none) and maybe AFTER the start */
        vl = 0;
        el = rnd(3) ? 0 : 1 + rnd(6);
        for (size_t i = 0; i < el; i++)
            exp[i] = (uint8_t)('a' + rnd(3));
        scan_flags = (uint8_t)rnd(2);
        build_op(op, type, key, kl, NULL, 0, exp, el);
    } else {
        build_op(op, type, key, kl, val, vl, val, el);
    }
    op->req_no = req;
    op->scan_limit = scan_limit;
    op->scan_flags = scan_flags;
}

/* Applies fill a reply's buffer (cons.h): static ones, never the stack. */
static uint8_t r1_data[CONS_REPLY_MAX], r2_data[CONS_REPLY_MAX];
static struct cons_reply r1 = {.data = r1_data, .cap = CONS_REPLY_MAX};
static struct cons_reply r2 = {.data = r2_data, .cap = CONS_REPLY_MAX};

/* The keys of a scan reply, concatenated with '|'. */
static const char *scan_keys(const struct cons_reply *r)
{
    static char out[256];
    size_t at = 0, o = 0;
    out[0] = '\0';
    while (at + 2 <= r->len && o + 16 < sizeof out) {
        uint16_t kl;
        uint32_t vl;
        memcpy(&kl, r->data + at, 2);
        o += (size_t)snprintf(out + o, sizeof out - o, "%s%.*s", o ? "|" : "", (int)kl,
                              (const char *)r->data + at + 2);
        memcpy(&vl, r->data + at + 2 + kl, 4);
        at += 6u + kl + vl;
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
            build_op(&op, CONS_OP_PUT, keys[i], strlen(keys[i]), "v", 1, NULL, 0);
            op.req_no = ++req;
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
            build_op(&op, CONS_OP_SCAN, cases[c].start, strlen(cases[c].start), NULL, 0,
                     cases[c].end, strlen(cases[c].end));
            op.req_no = ++req;
            op.scan_limit = cases[c].limit;
            op.scan_flags = cases[c].flags;
            CHECK_OK(sms[m].ops->apply(sms[m].impl, &op, &r1));
            CHECK_MSG(strcmp(scan_keys(&r1), cases[c].want) == 0,
                      "case %zu machine %d: got %s, want %s", c, m, scan_keys(&r1), cases[c].want);
        }
    }
    /* Pages of two, each AFTER the last key of the one before. */
    for (int m = 0; m < 2; m++) {
        char walk[256] = "";
        build_op(&op, CONS_OP_SCAN, NULL, 0, NULL, 0, NULL, 0);
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
            build_op(&op, CONS_OP_SCAN, last, strlen(last), NULL, 0, NULL, 0);
            op.scan_limit = 2;
            op.scan_flags = CONS_SCAN_AFTER;
        }
        CHECK_MSG(strcmp(walk, "a|ab|abc|b|ba|c") == 0, "machine %d walked %s", m, walk);
    }
    kv_write_abort(store);
    kv_mem_destroy(mem);
    close_all();
}
/* Whole states, with room for one more record after them (cons_sm_save
 * wants CONS_SNAP_RECORD_MAX bytes free before every chunk). */
#define STATE_MAX ((16u << 20) + CONS_SNAP_RECORD_MAX)
static uint8_t snap1[STATE_MAX], snap2[STATE_MAX];

TEST(sm_matches_in_memory_machine)
{
    open_all(0);
    struct kv_mem *mem = kv_mem_create(1000);
    CHECK(mem != NULL);
    struct cons_sm a = kv_mem_sm(mem), b = kv_sm_cons(&sm);
    struct cons_op op;
    /* Through the client table, so the rows (97 clients over 50 rows:
     * evictions) and the mark go into both machines too. */
    static struct cons_ctab ta, tb;
    CHECK_OK(cons_ctab_init(&ta, 50));
    CHECK_OK(cons_ctab_init(&tb, 50));
    for (uint64_t i = 1; i <= 5000; i++) {
        random_op(&op, i);
        op.client_id = i % 97 + 1;
        op.req_no = i / 97 + 1;
        CHECK_OK(kv_write_begin(store));
        CHECK(cons_apply_once(&a, &ta, &op, &r1) >= 0);
        CHECK(cons_apply_once(&b, &tb, &op, &r2) >= 0);
        CHECK_OK(a.ops->mark(a.impl, i, ta.ops));
        CHECK_OK(b.ops->mark(b.impl, i, tb.ops));
        CHECK_OK(kv_write_commit(store));
        CHECK_MSG(r1.status == r2.status && r1.len == r2.len &&
                      memcmp(r1.data, r2.data, r1.len) == 0,
                  "op %lu type %d: mem status %d len %u, lmdb status %d len %u", (unsigned long)i,
                  op.type, r1.status, r1.len, r2.status, r2.len);
    }
    size_t l1, l2;
    CHECK_OK(cons_sm_pairs(&a, snap1, sizeof snap1, &l1));
    CHECK_OK(cons_sm_pairs(&b, snap2, sizeof snap2, &l2));
    CHECK(l1 > 0);
    CHECK_EQ_U64(l1, l2);
    CHECK(memcmp(snap1, snap2, l1) == 0);
    /* The whole state streams to the same bytes from either machine:
     * what the simulator checks is what the server sends. */
    CHECK_OK(cons_sm_save(&a, snap1, sizeof snap1, &l1));
    CHECK_OK(cons_sm_save(&b, snap2, sizeof snap2, &l2));
    CHECK(ta.evicted > 0);
    CHECK_EQ_U64(l1, l2);
    CHECK(memcmp(snap1, snap2, l1) == 0);
    cons_ctab_free(&ta);
    cons_ctab_free(&tb);
    kv_mem_destroy(mem);
    close_all();
}

TEST(sm_state_stream_round_trip_and_rejects_garbage)
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
    CHECK_OK(cons_sm_save(&b, snap1, sizeof snap1, &l1));
    uint64_t bytes = sm.bytes;
    CHECK_ERR(cons_sm_save(&b, snap2, 10, &l2), FK_ETOOBIG);
    /* A cut stream and keys out of order are refused; the state stays. */
    CHECK_OK(kv_write_begin(store));
    CHECK_ERR(cons_sm_restore(&b, snap1, l1 - 1), FK_EMALFORMED);
    uint8_t bad[] = {CONS_SNAP_HEAD,
                     [17] = CONS_SNAP_PAIR,
                     1,
                     0,
                     'b',
                     0,
                     0,
                     0,
                     0,
                     CONS_SNAP_PAIR,
                     1,
                     0,
                     'a',
                     0,
                     0,
                     0,
                     0,
                     CONS_SNAP_END,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     2,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0};
    CHECK_ERR(cons_sm_restore(&b, bad, sizeof bad), FK_EMALFORMED);
    bad[20] = 'c'; /* keys c, d: in order, the same stream is accepted below, so */
    bad[28] = 'd'; /* what was refused was the order */
    CHECK_OK(kv_write_commit(store));
    CHECK_EQ_U64(sm.bytes, bytes);
    CHECK_OK(cons_sm_save(&b, snap2, sizeof snap2, &l2));
    CHECK_EQ_U64(l1, l2);
    CHECK(memcmp(snap1, snap2, l1) == 0);
    CHECK_OK(kv_write_begin(store));
    CHECK_OK(cons_sm_restore(&b, bad, sizeof bad)); /* the same bytes, keys in order */
    CHECK_OK(cons_sm_restore(&b, snap1, l1));
    CHECK_OK(kv_write_commit(store));
    CHECK_EQ_U64(sm.bytes, bytes);
    CHECK_OK(cons_sm_save(&b, snap2, sizeof snap2, &l2));
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

/* What the quota counts for a pair of a one-byte key and 1000-byte value. */
#define KV_1000 (1 + 1000 + KV_SM_PAIR_BYTES)

TEST(sm_quota_is_a_deterministic_reply)
{
    open_all(3000);
    struct cons_sm b = kv_sm_cons(&sm);
    static const uint8_t zeros[1000];
    struct cons_op op;
    int full = 0;
    CHECK_OK(kv_write_begin(store));
    for (int i = 0; i < 5; i++) {
        uint8_t k = (uint8_t)('a' + i);
        build_op(&op, CONS_OP_PUT, &k, 1, zeros, sizeof zeros, NULL, 0);
        CHECK_OK(b.ops->apply(b.impl, &op, &r1));
        full += r1.status == FK_EQUOTA;
        char want[32];
        int wl = snprintf(want, sizeof want, "%d of 3000 bytes", 3 * KV_1000);
        if (r1.status == FK_EQUOTA) /* the reply says by how much */
            CHECK_MSG(r1.len == (uint32_t)wl && memcmp(r1.data, want, (size_t)wl) == 0,
                      "%.*s, want %s", (int)r1.len, (const char *)r1.data, want);
    }
    CHECK_EQ_I64(full, 3); /* two such pairs fit in 3000, the third does not */
    /* Deleting makes room again. */
    build_op(&op, CONS_OP_DEL, "a", 1, NULL, 0, NULL, 0);
    CHECK_OK(b.ops->apply(b.impl, &op, &r1));
    CHECK_EQ_I64(r1.status, 0);
    build_op(&op, CONS_OP_PUT, "z", 1, zeros, sizeof zeros, NULL, 0);
    CHECK_OK(b.ops->apply(b.impl, &op, &r1));
    CHECK_EQ_I64(r1.status, 0);
    CHECK_OK(kv_write_commit(store));
    CHECK_EQ_U64(sm.bytes, 2 * KV_1000);
    close_all();
    /* Many tiny pairs: the quota bounds the state's pairs too. */
    open_all(3000);
    struct cons_op tiny;
    CHECK_OK(kv_write_begin(store));
    int stored = 0;
    for (int i = 0; i < 1000; i++) {
        uint8_t k[3] = {(uint8_t)('a' + i % 26), (uint8_t)('a' + i / 26 % 26),
                        (uint8_t)('a' + i / 676)};
        build_op(&tiny, CONS_OP_PUT, k, sizeof k, NULL, 0, NULL, 0);
        CHECK_OK(b.ops->apply(b.impl, &tiny, &r1));
        stored += r1.status == 0;
    }
    CHECK_EQ_I64(stored, 3000 / (3 + KV_SM_PAIR_BYTES));
    CHECK_OK(kv_write_commit(store));
    size_t len;
    CHECK_OK(cons_sm_pairs(&b, snap1, sizeof snap1, &len));
    CHECK_MSG(len == (size_t)stored * (1 + 3 + KV_SM_PAIR_BYTES), /* a tag byte per pair */
              "the state holds %zu bytes of pairs, not %d pairs' under a quota of 3000", len,
              stored);
    close_all();
}

/* Applies op to machine m and checks its status. */
static void apply_ok(struct cons_sm *m, const struct cons_op *op, struct cons_reply *r, int32_t st)
{
    CHECK_OK(m->ops->apply(m->impl, op, r));
    CHECK_MSG(r->status == st, "op type %d: status %d, want %d", op->type, r->status, st);
}

/* Values up to CONS_VAL_MAX (lengths past a u16) go into the LMDB machine
 * and come back whole by GET and SCAN, and a CAS compares and writes the
 * largest; the in-memory machine holds values up to KV_MEM_VAL_MAX and
 * refuses larger ones without a change. A scan page stops before its
 * pairs pass CONS_SCAN_PAGE bytes, and holds one pair however large: the
 * same pages from both machines. */
TEST(sm_large_values_and_scan_pages)
{
    open_all(0);
    struct kv_mem *mem = kv_mem_create(64);
    CHECK(mem != NULL);
    struct cons_sm sms[2] = {kv_mem_sm(mem), kv_sm_cons(&sm)};
    uint8_t *v = malloc(CONS_VAL_MAX + 1), *v2 = malloc(CONS_VAL_MAX);
    CHECK(v != NULL && v2 != NULL);
    for (size_t i = 0; i <= CONS_VAL_MAX; i++)
        v[i] = (uint8_t)(i * 7 + i / 251);
    memset(v2, 'n', CONS_VAL_MAX);
    struct cons_op op;
    uint16_t kl;
    uint32_t vl;
    CHECK_OK(kv_write_begin(store));
    build_op(&op, CONS_OP_PUT, "big", 3, v, CONS_VAL_MAX, NULL, 0);
    CHECK(op.ext != NULL); /* too large for the op's inline bytes */
    apply_ok(&sms[1], &op, &r1, 0);
    build_op(&op, CONS_OP_GET, "big", 3, NULL, 0, NULL, 0);
    apply_ok(&sms[1], &op, &r1, 0);
    CHECK(r1.len == CONS_VAL_MAX && memcmp(r1.data, v, CONS_VAL_MAX) == 0);
    build_op(&op, CONS_OP_SCAN, "b", 1, NULL, 0, NULL, 0);
    op.scan_limit = CONS_SCAN_MAX;
    apply_ok(&sms[1], &op, &r1, 0);
    CHECK_EQ_U64(r1.len, 2 + 3 + 4 + CONS_VAL_MAX);
    memcpy(&kl, r1.data, 2);
    memcpy(&vl, r1.data + 2 + 3, 4);
    CHECK(kl == 3 && memcmp(r1.data + 2, "big", 3) == 0 && vl == CONS_VAL_MAX);
    CHECK(memcmp(r1.data + 9, v, CONS_VAL_MAX) == 0);
    /* A CAS of the largest value and expected value: a miss, then a hit. */
    build_op(&op, CONS_OP_CAS, "big", 3, v2, CONS_VAL_MAX, v2, CONS_VAL_MAX);
    apply_ok(&sms[1], &op, &r1, FK_ECASFAIL);
    build_op(&op, CONS_OP_CAS, "big", 3, v2, CONS_VAL_MAX, v, CONS_VAL_MAX);
    apply_ok(&sms[1], &op, &r1, 0);
    build_op(&op, CONS_OP_GET, "big", 3, NULL, 0, NULL, 0);
    apply_ok(&sms[1], &op, &r1, 0);
    CHECK(r1.len == CONS_VAL_MAX && memcmp(r1.data, v2, CONS_VAL_MAX) == 0);
    build_op(&op, CONS_OP_DEL, "big", 3, NULL, 0, NULL, 0);
    apply_ok(&sms[1], &op, &r1, 0);
    /* The in-memory machine's limit. */
    build_op(&op, CONS_OP_PUT, "m", 1, v, KV_MEM_VAL_MAX, NULL, 0);
    apply_ok(&sms[0], &op, &r1, 0);
    build_op(&op, CONS_OP_PUT, "m", 1, v2, KV_MEM_VAL_MAX + 1, NULL, 0);
    apply_ok(&sms[0], &op, &r1, FK_EVALSIZE);
    build_op(&op, CONS_OP_PUT, "n", 1, v2, KV_MEM_VAL_MAX + 1, NULL, 0);
    apply_ok(&sms[0], &op, &r1, FK_EVALSIZE);
    build_op(&op, CONS_OP_CAS, "m", 1, v2, KV_MEM_VAL_MAX + 1, v, KV_MEM_VAL_MAX);
    apply_ok(&sms[0], &op, &r1, FK_EVALSIZE);
    build_op(&op, CONS_OP_GET, "m", 1, NULL, 0, NULL, 0);
    apply_ok(&sms[0], &op, &r1, 0);
    CHECK(r1.len == KV_MEM_VAL_MAX && memcmp(r1.data, v, KV_MEM_VAL_MAX) == 0);
    build_op(&op, CONS_OP_GET, "n", 1, NULL, 0, NULL, 0);
    apply_ok(&sms[0], &op, &r1, FK_ENOTFOUND);
    build_op(&op, CONS_OP_DEL, "m", 1, NULL, 0, NULL, 0);
    apply_ok(&sms[0], &op, &r1, 0);
    /* Pages: pairs p0..p4 of 3000-byte values (3008 bytes a pair), then
     * q of the in-memory machine's largest value, alone on its page. */
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < 5; i++) {
            char k[2] = {'p', (char)('0' + i)};
            build_op(&op, CONS_OP_PUT, k, 2, v + i, 3000, NULL, 0);
            apply_ok(&sms[m], &op, &r1, 0);
        }
        build_op(&op, CONS_OP_PUT, "q", 1, v, KV_MEM_VAL_MAX, NULL, 0);
        apply_ok(&sms[m], &op, &r1, 0);
    }
    static const struct {
        const char *start;
        uint8_t flags;
        const char *want;
    } pages[] = {
        {"p", 0, "p0|p1"},
        {"p1", CONS_SCAN_AFTER, "p2|p3"},
        {"p3", CONS_SCAN_AFTER, "p4"}, /* p4 and q would pass the page */
        {"p4", CONS_SCAN_AFTER, "q"},  /* over a page alone, still one pair */
    };
    for (size_t c = 0; c < sizeof pages / sizeof *pages; c++) {
        for (int m = 0; m < 2; m++) {
            struct cons_reply *r = m ? &r2 : &r1;
            build_op(&op, CONS_OP_SCAN, pages[c].start, strlen(pages[c].start), NULL, 0, NULL, 0);
            op.scan_limit = CONS_SCAN_MAX;
            op.scan_flags = pages[c].flags;
            apply_ok(&sms[m], &op, r, 0);
            CHECK_MSG(strcmp(scan_keys(r), pages[c].want) == 0, "page %zu machine %d: got %s", c, m,
                      scan_keys(r));
            CHECK(r->len <= CONS_SCAN_PAGE || strchr(pages[c].want, '|') == NULL);
        }
        CHECK(r1.len == r2.len && memcmp(r1.data, r2.data, r1.len) == 0);
    }
    kv_write_abort(store);
    free(v);
    free(v2);
    kv_mem_destroy(mem);
    close_all();
}

/* ---- sessions, the mark, the stream -------------------------------------
 * A replica here is a store and its machine in a directory of its own. */
struct rep {
    char dir[64];
    struct kv_store *store;
    struct kv_sm sm;
    struct cons_sm c;
};

static void rep_open(struct rep *r, uint64_t quota)
{
    struct kv_store_opts o = {.dir = r->dir, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &r->store));
    CHECK_OK(kv_sm_init(&r->sm, r->store, quota));
    r->c = kv_sm_cons(&r->sm);
}

static void rep_create(struct rep *r, uint64_t quota)
{
    snprintf(r->dir, sizeof r->dir, "/tmp/fksmXXXXXX");
    CHECK(mkdtemp(r->dir) != NULL);
    rep_open(r, quota);
}

static void rep_destroy(struct rep *r)
{
    kv_store_close(r->store);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", r->dir);
    CHECK(system(cmd) == 0);
}

static void put_pair(struct rep *r, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    static struct cons_op op;
    build_op(&op, CONS_OP_PUT, k, kl, v, vl, NULL, 0);
    CHECK_OK(r->c.ops->apply(r->c.impl, &op, &r1));
    CHECK_EQ_I64(r1.status, 0);
}

static void set_session(struct rep *r, uint64_t id, uint64_t req, uint64_t stamp, int32_t status)
{
    struct cons_session se = {.client_id = id, .req_no = req, .stamp = stamp, .status = status};
    CHECK_OK(r->c.ops->session(r->c.impl, &se));
}

/* A random state in one transaction: nsess sessions with ids spread over
 * the whole u64 range, npairs pairs with keys of 1..CONS_KEY_MAX bytes
 * (a few of the largest) and values of 0..CONS_VAL_MAX, and a mark. */
static void populate(struct rep *r, int nsess, int npairs, uint64_t applied, uint64_t clock)
{
    static uint8_t k[CONS_KEY_MAX], v[CONS_VAL_MAX];
    CHECK_OK(kv_write_begin(r->store));
    for (int i = 0; i < nsess; i++) {
        uint64_t id = ((uint64_t)rnd(1u << 31) << 33) | rnd(1u << 31) | 1;
        set_session(r, id, 1 + rnd(1000), rnd(1u << 30), -(int32_t)rnd(30));
    }
    for (int i = 0; i < npairs; i++) {
        size_t kl = i % 37 == 0 ? CONS_KEY_MAX : 1 + rnd(12);
        size_t vl = i % 41 == 0 ? CONS_VAL_MAX : rnd(200);
        for (size_t j = 0; j < kl; j++)
            k[j] = (uint8_t)('a' + rnd(4));
        memset(v, 'a' + (int)rnd(26), vl);
        put_pair(r, k, kl, v, vl);
    }
    CHECK_OK(r->c.ops->mark(r->c.impl, applied, clock));
    CHECK_OK(kv_write_commit(r->store));
}

/* Chunk sizes (snap_read's `want`): small ones (about a record of a
 * small value) make many chunks, big ones few. A chunk's buffer always
 * has room for the largest record (cap >= CONS_SNAP_RECORD_MAX). */
#define SMALL_WANT 1536
#define BIG_WANT   (1 << 16)
static uint8_t stream1[STATE_MAX], stream2[STATE_MAX], chunk[CONS_SNAP_RECORD_MAX + BIG_WANT];

/* Reads view slot's whole stream in chunks of `want` bytes into out (of
 * STATE_MAX bytes), each read with the smallest cap the contract allows;
 * returns its length, and the number of chunks in *chunks. */
static size_t read_view(struct rep *r, uint32_t slot, size_t want, uint8_t *out, int *chunks)
{
    uint8_t cur[CONS_SNAP_CURSOR_MAX] = {0};
    size_t clen = 0, at = 0, len;
    int rc = 0, n = 0;
    while (rc == 0) {
        CHECK(n < 100000);
        CHECK(at + CONS_SNAP_RECORD_MAX <= STATE_MAX);
        rc = r->c.ops->snap_read(r->c.impl, slot, cur, &clen, out + at, CONS_SNAP_RECORD_MAX, want,
                                 &len);
        CHECK_OK(rc);
        CHECK(len > 0 && len <= CONS_SNAP_RECORD_MAX);
        at += len;
        n++;
    }
    CHECK_EQ_I64(rc, 1);
    if (chunks != NULL)
        *chunks = n;
    return at;
}

/* The whole stream of r's committed state, in chunks of `want` bytes. */
static size_t read_state(struct rep *r, size_t want, uint8_t *out, uint64_t *applied)
{
    uint64_t a;
    CHECK_OK(r->c.ops->snap_open(r->c.impl, 3, &a));
    size_t n = read_view(r, 3, want, out, NULL);
    r->c.ops->snap_close(r->c.impl, 3);
    if (applied != NULL)
        *applied = a;
    return n;
}

/* Streams a's state into b, chunks of `want` bytes, each chunk in a write
 * transaction of its own as the server's batches would; returns the
 * number of chunks. */
static int transfer(struct rep *a, struct rep *b, size_t want)
{
    uint8_t cur[CONS_SNAP_CURSOR_MAX] = {0};
    size_t clen = 0, len;
    uint64_t applied;
    int rc = 0, n = 0;
    CHECK_OK(a->c.ops->snap_open(a->c.impl, 0, &applied));
    CHECK_OK(kv_write_begin(b->store));
    CHECK_OK(b->c.ops->install_begin(b->c.impl));
    CHECK_OK(kv_write_commit(b->store));
    while (rc == 0) {
        rc = a->c.ops->snap_read(a->c.impl, 0, cur, &clen, chunk, sizeof chunk, want, &len);
        CHECK_OK(rc);
        CHECK_OK(kv_write_begin(b->store));
        CHECK_OK(b->c.ops->install_chunk(b->c.impl, chunk, len));
        CHECK_OK(kv_write_commit(b->store));
        n++;
    }
    CHECK_OK(kv_write_begin(b->store));
    CHECK_OK(b->c.ops->install_commit(b->c.impl));
    CHECK_OK(kv_write_commit(b->store));
    a->c.ops->snap_close(a->c.impl, 0);
    return n;
}

/* The stream's records, written by hand from cons.h for the tests. */
static void w_head(struct cons_wbuf *w, uint64_t applied, uint64_t clock)
{
    cons_w_u8(w, CONS_SNAP_HEAD);
    cons_w_u64(w, applied);
    cons_w_u64(w, clock);
}

static void w_session(struct cons_wbuf *w, uint64_t id, uint64_t req, uint64_t stamp, int32_t st)
{
    cons_w_u8(w, CONS_SNAP_SESSION);
    cons_w_u64(w, id);
    cons_w_u64(w, req);
    cons_w_u64(w, stamp);
    cons_w_u32(w, (uint32_t)st);
}

static void w_pair(struct cons_wbuf *w, const char *k, size_t kl, const char *v, uint32_t vl)
{
    cons_w_u8(w, CONS_SNAP_PAIR);
    cons_w_u16(w, (uint16_t)kl);
    cons_w_bytes(w, k, kl);
    cons_w_u32(w, vl);
    cons_w_bytes(w, v, vl);
}

static void w_end(struct cons_wbuf *w, uint64_t sessions, uint64_t pairs)
{
    cons_w_u8(w, CONS_SNAP_END);
    cons_w_u64(w, sessions);
    cons_w_u64(w, pairs);
}

/* A small state, streamed in one chunk and in chunks of the smallest cap,
 * is exactly the records cons.h lays out: sessions in numeric id order
 * (not byte order: 256 sorts after 2), pairs in kv_key_cmp order. */
TEST(sm_stream_bytes_follow_cons_h)
{
    struct rep a = {0};
    rep_create(&a, 0);
    CHECK_OK(kv_write_begin(a.store));
    set_session(&a, 256, 4, 9, FK_ECASFAIL);
    set_session(&a, 2, 1, 3, 0);
    set_session(&a, 7, 5, 10, FK_EUNKEPT);
    set_session(&a, 7, 0, 0, 0); /* evicted */
    put_pair(&a, (const uint8_t *)"b", 1, (const uint8_t *)"xyz", 3);
    put_pair(&a, (const uint8_t *)"ab", 2, (const uint8_t *)"", 0);
    put_pair(&a, (const uint8_t *)"a", 1, (const uint8_t *)"1", 1);
    CHECK_OK(a.c.ops->mark(a.c.impl, 41, 17));
    CHECK_OK(kv_write_commit(a.store));
    static uint8_t want[512];
    struct cons_wbuf w;
    cons_wbuf_init(&w, want, sizeof want);
    w_head(&w, 41, 17);
    w_session(&w, 2, 1, 3, 0);
    w_session(&w, 256, 4, 9, FK_ECASFAIL);
    w_pair(&w, "a", 1, "1", 1);
    w_pair(&w, "ab", 2, "", 0);
    w_pair(&w, "b", 1, "xyz", 3);
    w_end(&w, 2, 3);
    CHECK(w.err == 0);
    uint64_t applied;
    size_t n = read_state(&a, BIG_WANT, stream1, &applied);
    CHECK_EQ_U64(applied, 41);
    CHECK_EQ_U64(n, w.len);
    CHECK(memcmp(stream1, want, n) == 0);
    int chunks;
    CHECK_OK(a.c.ops->snap_open(a.c.impl, 3, &applied));
    CHECK_EQ_U64(read_view(&a, 3, 1, stream2, &chunks), n); /* one record a chunk */
    a.c.ops->snap_close(a.c.impl, 3);
    CHECK_EQ_I64(chunks, 1 + 2 + 3 + 1);
    CHECK(memcmp(stream2, want, n) == 0);
    /* An empty machine: HEAD (0, 0) and END (0, 0). */
    struct rep e = {0};
    rep_create(&e, 0);
    n = read_state(&e, SMALL_WANT, stream1, &applied);
    cons_wbuf_init(&w, want, sizeof want);
    w_head(&w, 0, 0);
    w_end(&w, 0, 0);
    CHECK(n == w.len && memcmp(stream1, want, n) == 0 && applied == 0);
    rep_destroy(&e);
    rep_destroy(&a);
}

struct rows {
    int n, stop_at;
    struct cons_session s[16];
};

static int collect_row(void *arg, const struct cons_session *se)
{
    struct rows *r = arg;
    CHECK(r->n < 16);
    r->s[r->n++] = *se;
    return r->n == r->stop_at ? 7 : 0;
}

/* Rows are set, overwritten and deleted (req_no 0, even when absent);
 * load visits them in numeric client id order inside or outside the
 * write transaction and stops where its callback says. */
TEST(sm_session_set_delete_and_load_order)
{
    open_all(0);
    struct cons_sm b = kv_sm_cons(&sm);
    struct cons_session se = {.client_id = 0, .req_no = 1};
    CHECK_ERR(b.ops->session(b.impl, &se), FK_EINVAL); /* no write transaction */
    CHECK_OK(kv_write_begin(store));
    CHECK_ERR(b.ops->session(b.impl, &se), FK_EINVAL); /* client 0 */
    static const uint64_t ids[] = {5, 1, 1ull << 40, 3, UINT64_MAX, 2, 256};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        struct cons_session s1 = {
            .client_id = ids[i], .req_no = 10 + i, .stamp = 100 + i, .status = -(int32_t)i};
        CHECK_OK(b.ops->session(b.impl, &s1));
    }
    se = (struct cons_session){.client_id = 3, .req_no = 0};
    CHECK_OK(b.ops->session(b.impl, &se));
    se.client_id = 99; /* never had a row */
    CHECK_OK(b.ops->session(b.impl, &se));
    se = (struct cons_session){.client_id = 5, .req_no = 77, .stamp = 78, .status = FK_ECASFAIL};
    CHECK_OK(b.ops->session(b.impl, &se));
    static const uint64_t order[] = {1, 2, 5, 256, 1ull << 40, UINT64_MAX};
    for (int committed = 0; committed < 2; committed++) {
        struct rows rows = {.n = 0};
        uint64_t applied = 9, clock = 9;
        CHECK_OK(b.ops->load(b.impl, &applied, &clock, collect_row, &rows));
        CHECK(applied == 0 && clock == 0);
        CHECK_EQ_I64(rows.n, 6);
        for (int i = 0; i < 6; i++)
            CHECK_EQ_U64(rows.s[i].client_id, order[i]);
        CHECK(rows.s[0].req_no == 11 && rows.s[0].stamp == 101 && rows.s[0].status == -1);
        CHECK(rows.s[2].req_no == 77 && rows.s[2].stamp == 78 && rows.s[2].status == FK_ECASFAIL);
        struct rows stop = {.n = 0, .stop_at = 3};
        CHECK_EQ_I64(b.ops->load(b.impl, &applied, &clock, collect_row, &stop), 7);
        CHECK_EQ_I64(stop.n, 3);
        if (!committed)
            CHECK_OK(kv_write_commit(store));
    }
    close_all();
}

/* The mark is 0, 0 on an empty machine, sticks only when its transaction
 * commits, and survives a reopen. */
TEST(sm_mark_round_trip_across_reopen)
{
    open_all(0);
    struct cons_sm b = kv_sm_cons(&sm);
    uint64_t applied = 1, clock = 1;
    CHECK_OK(b.ops->load(b.impl, &applied, &clock, NULL, NULL));
    CHECK(applied == 0 && clock == 0);
    CHECK_ERR(b.ops->mark(b.impl, 5, 6), FK_EINVAL); /* no write transaction */
    CHECK_OK(kv_write_begin(store));
    CHECK_OK(b.ops->mark(b.impl, 10, 20));
    CHECK_OK(kv_write_commit(store));
    CHECK_OK(kv_write_begin(store));
    CHECK_OK(b.ops->mark(b.impl, 11, 21));
    CHECK_OK(b.ops->load(b.impl, &applied, &clock, NULL, NULL)); /* reads its transaction */
    CHECK(applied == 11 && clock == 21);
    kv_write_abort(store);
    kv_store_close(store);
    struct kv_store_opts o = {.dir = dir, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &store));
    CHECK_OK(kv_sm_init(&sm, store, 0));
    CHECK_OK(b.ops->load(b.impl, &applied, &clock, NULL, NULL));
    CHECK(applied == 10 && clock == 20);
    CHECK_OK(kv_write_begin(store)); /* a mark of the wrong size is not ours */
    CHECK_OK(kv_meta_put(store, "sm.mark", "x", 1));
    CHECK_ERR(b.ops->load(b.impl, &applied, &clock, NULL, NULL), FK_EMALFORMED);
    kv_write_abort(store);
    close_all();
}

/* A random state with sessions, pairs and a mark crosses to another
 * machine in many chunks of the smallest cap, each installed in its own
 * write transaction, and reads back byte for byte; the receiver serves
 * its old state until the commit, and keeps the new one across a
 * reopen. A second transfer switches back to the first set. */
TEST(sm_stream_round_trip_into_a_second_store)
{
    struct rep a = {0}, b = {0};
    rep_create(&a, 0);
    rep_create(&b, 0);
    populate(&a, 200, 400, 1234, 5678);
    populate(&b, 10, 10, 99, 100); /* replaced whole by the install */
    size_t n1 = read_state(&a, SMALL_WANT, stream1, NULL);
    int chunks = transfer(&a, &b, SMALL_WANT);
    CHECK_MSG(chunks > 20, "only %d chunks", chunks);
    uint64_t applied;
    size_t n2 = read_state(&b, BIG_WANT, stream2, &applied);
    CHECK_EQ_U64(n2, n1);
    CHECK(memcmp(stream1, stream2, n1) == 0);
    CHECK_EQ_U64(applied, 1234);
    CHECK_EQ_U64(b.sm.bytes, a.sm.bytes);
    uint64_t clock;
    struct rows rows = {.n = 0, .stop_at = 5};
    CHECK_EQ_I64(b.c.ops->load(b.c.impl, &applied, &clock, collect_row, &rows), 7);
    CHECK(applied == 1234 && clock == 5678);
    struct kv_store_stats st;
    CHECK_OK(kv_store_stats(b.store, &st));
    CHECK_EQ_U64(st.client_entries, 200);
    kv_store_close(b.store);
    rep_open(&b, 0);
    CHECK_EQ_U64(b.sm.bytes, a.sm.bytes);
    CHECK_EQ_U64(read_state(&b, SMALL_WANT, stream2, NULL), n1);
    CHECK(memcmp(stream1, stream2, n1) == 0);
    /* A changed sender, a chunk of 4 KiB: b switches back to set 0. */
    CHECK_OK(kv_write_begin(a.store));
    put_pair(&a, (const uint8_t *)"zz", 2, (const uint8_t *)"new", 3);
    set_session(&a, 1, 3, 3, 0);
    CHECK_OK(a.c.ops->mark(a.c.impl, 1300, 5700));
    CHECK_OK(kv_write_commit(a.store));
    n1 = read_state(&a, SMALL_WANT, stream1, NULL);
    CHECK(transfer(&a, &b, 4096) > 1);
    CHECK_EQ_U64(read_state(&b, 4096, stream2, NULL), n1);
    CHECK(memcmp(stream1, stream2, n1) == 0);
    rep_destroy(&a);
    rep_destroy(&b);
}

/* A view is the state committed at snap_open: a stream read across many
 * later commits (data, sessions, mark), half before and half after them,
 * is the stream read at once; the open write transaction is not in it;
 * a view opened afterwards sees the new state. */
TEST(sm_view_stays_consistent_while_writes_commit)
{
    struct rep a = {0};
    rep_create(&a, 0);
    populate(&a, 50, 300, 70, 80);
    uint64_t applied;
    CHECK_OK(kv_write_begin(a.store)); /* uncommitted: not in the view */
    put_pair(&a, (const uint8_t *)"uncommitted", 11, (const uint8_t *)"x", 1);
    CHECK_OK(a.c.ops->mark(a.c.impl, 71, 81));
    CHECK_OK(a.c.ops->snap_open(a.c.impl, 5, &applied));
    CHECK_EQ_U64(applied, 70);
    kv_write_abort(a.store);
    size_t n1 = read_view(&a, 5, BIG_WANT, stream1, NULL);
    uint8_t cur[CONS_SNAP_CURSOR_MAX] = {0};
    size_t clen = 0, at = 0, len;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_I64(a.c.ops->snap_read(a.c.impl, 5, cur, &clen, stream2 + at, CONS_SNAP_RECORD_MAX,
                                        SMALL_WANT, &len),
                     0);
        at += len;
    }
    for (uint64_t t = 0; t < 40; t++) {
        CHECK_OK(kv_write_begin(a.store));
        for (int i = 0; i < 20; i++) {
            uint8_t k = (uint8_t)('a' + rnd(4)), v[64];
            memset(v, (int)t, sizeof v);
            put_pair(&a, &k, 1, v, sizeof v);
        }
        set_session(&a, 1 + t, 1, t, 0);
        CHECK_OK(a.c.ops->mark(a.c.impl, 100 + t, 200 + t));
        CHECK_OK(kv_write_commit(a.store));
    }
    int rc = 0;
    while (rc == 0) {
        CHECK(at + CONS_SNAP_RECORD_MAX <= sizeof stream2);
        rc = a.c.ops->snap_read(a.c.impl, 5, cur, &clen, stream2 + at, CONS_SNAP_RECORD_MAX,
                                SMALL_WANT, &len);
        CHECK_OK(rc);
        at += len;
    }
    CHECK_EQ_U64(at, n1);
    CHECK(memcmp(stream1, stream2, n1) == 0);
    CHECK_EQ_U64(read_view(&a, 5, 8192, stream2, NULL), n1); /* from the start again */
    CHECK(memcmp(stream1, stream2, n1) == 0);
    CHECK_OK(a.c.ops->snap_open(a.c.impl, 6, &applied));
    CHECK_EQ_U64(applied, 139);
    size_t n3 = read_view(&a, 6, BIG_WANT, stream2, NULL);
    CHECK(n3 != n1 || memcmp(stream1, stream2, n1) != 0);
    /* Reopening slot 5 moves it to now as well. */
    CHECK_OK(a.c.ops->snap_open(a.c.impl, 5, &applied));
    CHECK_EQ_U64(read_view(&a, 5, BIG_WANT, stream1, NULL), n3);
    CHECK(memcmp(stream1, stream2, n3) == 0);
    a.c.ops->snap_close(a.c.impl, 5);
    a.c.ops->snap_close(a.c.impl, 6);
    rep_destroy(&a);
}

/* The chunk that starts at a cursor is the same however often and in
 * whatever order it is read (a lost chunk is sent again), and bad
 * cursors, slots and caps are refused. */
TEST(sm_snap_read_again_from_a_saved_cursor)
{
    struct rep a = {0};
    rep_create(&a, 0);
    populate(&a, 100, 200, 5, 6);
    enum { MAXC = 512 };
    static uint8_t at_cur[MAXC][CONS_SNAP_CURSOR_MAX], next_cur[MAXC][CONS_SNAP_CURSOR_MAX];
    static size_t at_len[MAXC], next_len[MAXC], off[MAXC + 1];
    static int ret[MAXC];
    uint64_t applied;
    CHECK_OK(a.c.ops->snap_open(a.c.impl, 7, &applied));
    uint8_t cur[CONS_SNAP_CURSOR_MAX] = {0};
    size_t clen = 0, len;
    int n = 0, rc = 0;
    const size_t cap = CONS_SNAP_RECORD_MAX + 100, want = SMALL_WANT;
    while (rc == 0) {
        CHECK(n < MAXC);
        CHECK(off[n] + cap <= sizeof stream1);
        memcpy(at_cur[n], cur, clen);
        at_len[n] = clen;
        rc = a.c.ops->snap_read(a.c.impl, 7, cur, &clen, stream1 + off[n], cap, want, &len);
        CHECK_OK(rc);
        ret[n] = rc;
        memcpy(next_cur[n], cur, clen);
        next_len[n] = clen;
        off[n + 1] = off[n] + len;
        n++;
    }
    CHECK(n > 10);
    for (int t = 0; t < 3 * n; t++) {
        int i = t < n ? n - 1 - t : (int)rnd((uint32_t)n);
        memcpy(cur, at_cur[i], at_len[i]);
        clen = at_len[i];
        CHECK_EQ_I64(a.c.ops->snap_read(a.c.impl, 7, cur, &clen, chunk, cap, want, &len), ret[i]);
        CHECK_EQ_U64(len, off[i + 1] - off[i]);
        CHECK(memcmp(chunk, stream1 + off[i], len) == 0);
        CHECK(clen == next_len[i] && memcmp(cur, next_cur[i], clen) == 0);
    }
    /* Past END, unknown phases, wrong lengths, small caps, bad slots. */
    memcpy(cur, next_cur[n - 1], next_len[n - 1]);
    clen = next_len[n - 1];
    CHECK_ERR(a.c.ops->snap_read(a.c.impl, 7, cur, &clen, chunk, cap, cap, &len), FK_EINVAL);
    static const struct {
        uint8_t bytes[4];
        size_t len;
    } bad[] = {{{9}, 1}, {{0}, 1}, {{KV_SM_CUR_SESSIONS, 1}, 2}, {{KV_SM_CUR_SESSIONS}, 10}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(cur, 0, sizeof cur);
        memcpy(cur, bad[i].bytes, sizeof bad[i].bytes);
        clen = bad[i].len;
        CHECK_ERR(a.c.ops->snap_read(a.c.impl, 7, cur, &clen, chunk, cap, cap, &len), FK_EINVAL);
    }
    clen = CONS_SNAP_CURSOR_MAX + 1;
    CHECK_ERR(a.c.ops->snap_read(a.c.impl, 7, cur, &clen, chunk, cap, cap, &len), FK_EINVAL);
    clen = 0;
    CHECK_ERR(a.c.ops->snap_read(a.c.impl, 7, cur, &clen, chunk, CONS_SNAP_RECORD_MAX - 1,
                                 CONS_SNAP_RECORD_MAX - 1, &len),
              FK_EINVAL);
    CHECK_ERR(a.c.ops->snap_read(a.c.impl, CONS_SNAP_OPEN_MAX, cur, &clen, chunk, cap, cap, &len),
              FK_EINVAL);
    CHECK_ERR(a.c.ops->snap_read(a.c.impl, 2, cur, &clen, chunk, cap, cap, &len), FK_EINVAL);
    CHECK_ERR(a.c.ops->snap_open(a.c.impl, CONS_SNAP_OPEN_MAX, &applied), FK_EINVAL);
    a.c.ops->snap_close(a.c.impl, 7);
    a.c.ops->snap_close(a.c.impl, 7);
    memcpy(cur, at_cur[n / 2], at_len[n / 2]);
    clen = at_len[n / 2];
    CHECK_ERR(a.c.ops->snap_read(a.c.impl, 7, cur, &clen, chunk, cap, cap, &len), FK_EINVAL);
    rep_destroy(&a);
}

/* The install into b of a's state, stopped at chunk `stop`: chunks
 * 0..stop-1 staged and committed, install_commit not called. */
static void install_part(struct rep *a, struct rep *b, int stop)
{
    uint8_t cur[CONS_SNAP_CURSOR_MAX] = {0};
    size_t clen = 0, len;
    uint64_t applied;
    CHECK_OK(a->c.ops->snap_open(a->c.impl, 1, &applied));
    CHECK_OK(kv_write_begin(b->store));
    CHECK_OK(b->c.ops->install_begin(b->c.impl));
    CHECK_OK(kv_write_commit(b->store));
    for (int i = 0; i < stop; i++) {
        CHECK_EQ_I64(a->c.ops->snap_read(a->c.impl, 1, cur, &clen, chunk, CONS_SNAP_RECORD_MAX,
                                         SMALL_WANT, &len),
                     0);
        CHECK_OK(kv_write_begin(b->store));
        CHECK_OK(b->c.ops->install_chunk(b->c.impl, chunk, len));
        CHECK_OK(kv_write_commit(b->store));
    }
    a->c.ops->snap_close(a->c.impl, 1);
}

/* Nothing half-installed is ever live: after an abort, after a write
 * transaction that undid a chunk, and after the store closed before the
 * commit (a crash), b keeps its old state and mark, and the next install
 * clears what was staged and succeeds. A view of b's old state outlives
 * the switch. */
TEST(sm_install_abort_and_close_before_commit_keep_the_old_state)
{
    struct rep a = {0}, b = {0};
    rep_create(&a, 0);
    rep_create(&b, 0);
    populate(&a, 30, 300, 500, 600);
    populate(&b, 20, 50, 40, 41);
    size_t nb = read_state(&b, BIG_WANT, stream2, NULL);
    install_part(&a, &b, 6);
    b.c.ops->install_abort(b.c.impl);
    CHECK_OK(kv_write_begin(b.store));
    CHECK_ERR(b.c.ops->install_chunk(b.c.impl, chunk, 10), FK_EINVAL);
    CHECK_ERR(b.c.ops->install_commit(b.c.impl), FK_EINVAL);
    kv_write_abort(b.store);
    CHECK_EQ_U64(read_state(&b, BIG_WANT, stream1, NULL), nb);
    CHECK(memcmp(stream1, stream2, nb) == 0);
    /* A write transaction aborted mid-install may have taken staged
     * records with it: the install is over. */
    for (int then_commit = 0; then_commit < 2; then_commit++) {
        install_part(&a, &b, 3);
        CHECK_OK(kv_write_begin(b.store));
        kv_write_abort(b.store);
        CHECK_OK(kv_write_begin(b.store));
        if (then_commit)
            CHECK_ERR(b.c.ops->install_commit(b.c.impl), FK_EINVAL);
        else
            CHECK_ERR(b.c.ops->install_chunk(b.c.impl, chunk, 10), FK_EINVAL);
        CHECK_ERR(b.c.ops->install_commit(b.c.impl), FK_EINVAL);
        kv_write_abort(b.store);
    }
    /* Closed with 8 chunks staged, as a crash would leave it. */
    install_part(&a, &b, 8);
    kv_store_close(b.store);
    rep_open(&b, 0);
    uint64_t applied, clock;
    CHECK_OK(b.c.ops->load(b.c.impl, &applied, &clock, NULL, NULL));
    CHECK(applied == 40 && clock == 41);
    CHECK_EQ_U64(read_state(&b, BIG_WANT, stream1, NULL), nb);
    CHECK(memcmp(stream1, stream2, nb) == 0);
    CHECK_OK(b.c.ops->snap_open(b.c.impl, 4, &applied)); /* a reader of the old state */
    size_t na = read_state(&a, BIG_WANT, stream1, NULL);
    transfer(&a, &b, SMALL_WANT);
    static uint8_t s3[STATE_MAX];
    CHECK_EQ_U64(read_state(&b, BIG_WANT, s3, NULL), na);
    CHECK(memcmp(stream1, s3, na) == 0);
    CHECK_EQ_U64(read_view(&b, 4, BIG_WANT, s3, NULL), nb);
    CHECK(memcmp(stream2, s3, nb) == 0);
    b.c.ops->snap_close(b.c.impl, 4);
    rep_destroy(&a);
    rep_destroy(&b);
}

/* Malformed streams, each a few hand-written chunks. Every one is refused
 * with FK_EMALFORMED at a chunk or at the commit; the install is over
 * (FK_EINVAL after) and the live state untouched. */
enum { BAD_CHUNKS = 3 };
struct bad_stream {
    uint8_t buf[BAD_CHUNKS][CONS_SNAP_RECORD_MAX + 64]; /* a chunk holds a pair of any size */
    size_t len[BAD_CHUNKS];
    int n;
};

static void bad_build(int which, struct bad_stream *b)
{
    struct cons_wbuf w[BAD_CHUNKS];
    static char big[CONS_KEY_MAX + 1];
    memset(big, 'k', sizeof big);
    for (int i = 0; i < BAD_CHUNKS; i++)
        cons_wbuf_init(&w[i], b->buf[i], sizeof b->buf[i]);
    b->n = 1;
    if (which != 0 && which != 13 && which != 14)
        w_head(&w[0], 1, 2);
    switch (which) {
    case 0: /* no HEAD first */
        w_session(&w[0], 1, 1, 1, 0);
        break;
    case 1: /* two HEADs */
        w_head(&w[0], 1, 2);
        break;
    case 2: /* an unknown tag */
        cons_w_u8(&w[0], 5);
        break;
    case 3: /* the same client twice */
        w_session(&w[0], 4, 1, 1, 0);
        w_session(&w[0], 4, 2, 2, 0);
        break;
    case 4: /* clients decreasing */
        w_session(&w[0], 4, 1, 1, 0);
        w_session(&w[0], 3, 1, 1, 0);
        break;
    case 5: /* req_no 0 */
        w_session(&w[0], 4, 0, 1, 0);
        break;
    case 6: /* client 0 */
        w_session(&w[0], 0, 1, 1, 0);
        break;
    case 7: /* keys decreasing in kv_key_cmp order: "ab" sorts after "a" */
        w_pair(&w[0], "ab", 2, "", 0);
        w_pair(&w[0], "a", 1, "", 0);
        break;
    case 8: /* the same key twice */
        w_pair(&w[0], "a", 1, "", 0);
        w_pair(&w[0], "a", 1, "", 0);
        break;
    case 9: /* an empty key */
        w_pair(&w[0], "", 0, "v", 1);
        break;
    case 10: /* a key over CONS_KEY_MAX */
        w_pair(&w[0], big, CONS_KEY_MAX + 1, "v", 1);
        break;
    case 11: { /* a value over CONS_VAL_MAX (its bytes are there) */
        char *v = calloc(1, CONS_VAL_MAX + 1);
        CHECK(v != NULL);
        w_pair(&w[0], "a", 1, v, CONS_VAL_MAX + 1);
        free(v);
        break;
    }
    case 12: /* a session after a pair */
        w_pair(&w[0], "a", 1, "", 0);
        w_session(&w[0], 4, 1, 1, 0);
        break;
    case 13: /* a pair before HEAD */
        w_pair(&w[0], "a", 1, "", 0);
        break;
    case 14: /* END before HEAD */
        w_end(&w[0], 0, 0);
        break;
    case 15: /* a record split across chunks */
        w_pair(&w[1], "abc", 3, "val", 3);
        w_end(&w[1], 0, 1);
        memcpy(b->buf[0] + w[0].len, b->buf[1], 5);
        w[0].len += 5;
        memmove(b->buf[1], b->buf[1] + 5, w[1].len - 5);
        w[1].len -= 5;
        b->n = 2;
        break;
    case 16: /* a record after END, in END's chunk */
        w_end(&w[0], 0, 0);
        w_pair(&w[0], "a", 1, "", 0);
        break;
    case 17: /* a record after END, in a later chunk */
        w_end(&w[0], 0, 0);
        w_pair(&w[1], "a", 1, "", 0);
        b->n = 2;
        break;
    case 18: /* END counts a session that is not there */
        w_pair(&w[0], "a", 1, "", 0);
        w_end(&w[0], 1, 1);
        break;
    case 19: /* END counts fewer pairs than came */
        w_session(&w[0], 4, 1, 1, 0);
        w_pair(&w[1], "a", 1, "", 0);
        w_pair(&w[1], "b", 1, "", 0);
        w_end(&w[2], 1, 1);
        b->n = 3;
        break;
    case 20: /* no END: refused at the commit */
        w_pair(&w[0], "a", 1, "", 0);
        break;
    case 21: /* an empty chunk */
        b->n = 2;
        break;
    case 22: /* END cut short */
        w_end(&w[0], 0, 0);
        w[0].len -= 3;
        break;
    default:
        CHECK(0);
    }
    for (int i = 0; i < BAD_CHUNKS; i++) {
        CHECK(w[i].err == 0);
        b->len[i] = w[i].len;
    }
}

TEST(sm_install_refuses_malformed_streams)
{
    struct rep b = {0};
    rep_create(&b, 0);
    populate(&b, 5, 20, 3, 4);
    size_t nb = read_state(&b, BIG_WANT, stream2, NULL);
    static struct bad_stream bs;
    for (int which = 0; which <= 22; which++) {
        memset(&bs, 0, sizeof bs);
        bad_build(which, &bs);
        CHECK_OK(kv_write_begin(b.store));
        CHECK_OK(b.c.ops->install_begin(b.c.impl));
        CHECK_OK(kv_write_commit(b.store));
        int rc = 0;
        for (int i = 0; i < bs.n && rc == 0; i++) {
            CHECK_OK(kv_write_begin(b.store));
            rc = b.c.ops->install_chunk(b.c.impl, bs.buf[i], bs.len[i]);
            CHECK_OK(kv_write_commit(b.store));
        }
        CHECK_OK(kv_write_begin(b.store));
        if (rc == 0)
            rc = b.c.ops->install_commit(b.c.impl);
        CHECK_MSG(rc == FK_EMALFORMED, "case %d: %d", which, rc);
        CHECK_ERR(b.c.ops->install_chunk(b.c.impl, bs.buf[0], bs.len[0]), FK_EINVAL);
        CHECK_ERR(b.c.ops->install_commit(b.c.impl), FK_EINVAL);
        CHECK_OK(kv_write_commit(b.store));
        CHECK_EQ_U64(read_state(&b, BIG_WANT, stream1, NULL), nb);
        CHECK_MSG(memcmp(stream1, stream2, nb) == 0, "case %d changed the live state", which);
    }
    /* The well-formed stream these cases break installs. */
    struct cons_wbuf w;
    cons_wbuf_init(&w, bs.buf[0], sizeof bs.buf[0]);
    w_head(&w, 1, 2);
    w_session(&w, 4, 1, 1, 0);
    w_pair(&w, "a", 1, "", 0);
    w_pair(&w, "ab", 2, "x", 1);
    w_end(&w, 1, 2);
    CHECK_OK(kv_write_begin(b.store));
    CHECK_ERR(b.c.ops->install_chunk(b.c.impl, w.p, w.len), FK_EINVAL); /* no begin */
    CHECK_OK(b.c.ops->install_begin(b.c.impl));
    CHECK_OK(b.c.ops->install_chunk(b.c.impl, w.p, w.len));
    CHECK_OK(b.c.ops->install_commit(b.c.impl));
    CHECK_OK(kv_write_commit(b.store));
    CHECK_EQ_U64(read_state(&b, BIG_WANT, stream1, NULL), w.len);
    CHECK(memcmp(stream1, w.p, w.len) == 0);
    CHECK_EQ_U64(b.sm.bytes, 1 + 2 + 1 + 2 * KV_SM_PAIR_BYTES);
    rep_destroy(&b);
}

/* A stream over the receiver's quota (counted as apply counts it) is
 * refused with FK_EFULL and changes nothing; one exactly at it installs. */
TEST(sm_install_refuses_a_stream_over_the_quota)
{
    struct rep a = {0}, b = {0}, c = {0};
    rep_create(&a, 0);
    rep_create(&b, 3000);
    rep_create(&c, 3 * KV_1000);
    static uint8_t v[1000];
    CHECK_OK(kv_write_begin(a.store));
    for (uint8_t k = 'a'; k < 'd'; k++)
        put_pair(&a, &k, 1, v, sizeof v);
    CHECK_OK(kv_write_commit(a.store));
    CHECK_EQ_U64(a.sm.bytes, 3 * KV_1000);
    populate(&b, 2, 0, 8, 9);
    size_t nb = read_state(&b, BIG_WANT, stream2, NULL);
    uint8_t cur[CONS_SNAP_CURSOR_MAX] = {0};
    size_t clen = 0, len;
    uint64_t applied;
    CHECK_OK(a.c.ops->snap_open(a.c.impl, 0, &applied));
    CHECK_EQ_I64(
        a.c.ops->snap_read(a.c.impl, 0, cur, &clen, chunk, sizeof chunk, sizeof chunk, &len), 1);
    CHECK_OK(kv_write_begin(b.store));
    CHECK_OK(b.c.ops->install_begin(b.c.impl));
    CHECK_ERR(b.c.ops->install_chunk(b.c.impl, chunk, len), FK_EFULL);
    CHECK_ERR(b.c.ops->install_commit(b.c.impl), FK_EINVAL);
    CHECK_OK(kv_write_commit(b.store));
    CHECK_EQ_U64(read_state(&b, BIG_WANT, stream1, NULL), nb);
    CHECK(memcmp(stream1, stream2, nb) == 0);
    CHECK_EQ_U64(b.sm.bytes, 0);
    a.c.ops->snap_close(a.c.impl, 0);
    transfer(&a, &c, SMALL_WANT);
    CHECK_EQ_U64(c.sm.bytes, 3 * KV_1000);
    rep_destroy(&a);
    rep_destroy(&b);
    rep_destroy(&c);
}

CHECK_MAIN()
