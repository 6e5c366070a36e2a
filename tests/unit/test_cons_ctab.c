/* Unit tests for the client table's eviction (cons.h): when full, a new
 * client evicts the least recently used row (smallest stamp, then smallest
 * client id); a random stream of requests leaves exactly the rows an
 * independent model keeps, on two tables and on one reloaded from a
 * snapshot midway; an evicted client's later request is refused with
 * FK_EEXPIRED; a follower that logs reads unexecuted keeps the same rows,
 * and a logged read is read again on retry; load rejects bad snapshots
 * without touching the table.
 * Prints what an evicting apply costs beside an updating one. */
#include "check.h"
#include "cons.h"
#include "fk_error.h"
#include "fk_time.h"
#include "kv.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

/* Applies fill a reply's buffer (cons.h): a static one, never the stack. */
static uint8_t rep_data[CONS_REPLY_MAX];
static struct cons_reply rep = {.data = rep_data, .cap = CONS_REPLY_MAX};

/* An op of client's request req on key "k" with val and exp (C strings). */
static struct cons_op key_op(uint8_t type, uint64_t client, uint64_t req, const char *val,
                             const char *exp)
{
    struct cons_op op;
    cons_op_init(&op, type, "k", 1, val, (uint32_t)strlen(val), exp, (uint32_t)strlen(exp));
    op.client_id = client;
    op.req_no = req;
    return op;
}

static struct cons_op get_op(uint64_t client, uint64_t req)
{
    return key_op(CONS_OP_GET, client, req, "", "");
}

/* A PUT of a two-byte value to the same key. */
static struct cons_op put_op(uint64_t client, uint64_t req, const char *val)
{
    assert(strlen(val) == 2);
    return key_op(CONS_OP_PUT, client, req, val, "");
}

static int apply(struct cons_sm *sm, struct cons_ctab *t, uint64_t client, uint64_t req)
{
    struct cons_op op = get_op(client, req);
    return cons_apply_once(sm, t, &op, &rep);
}

TEST(full_table_evicts_least_recently_used)
{
    struct kv_mem *kv = kv_mem_create(8);
    struct cons_sm sm = kv_mem_sm(kv);
    struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 4));
    for (uint64_t c = 1; c <= 4; c++)
        CHECK_EQ_I64(apply(&sm, &t, c, 1), 0);
    CHECK_EQ_I64(apply(&sm, &t, 1, 2), 0); /* client 1 is now the most recent */
    CHECK_EQ_I64(apply(&sm, &t, 3, 1), 1); /* a duplicate does not refresh */
    CHECK_EQ_U64(t.ops, 5);
    CHECK_EQ_I64(apply(&sm, &t, 5, 1), 0); /* evicts 2 */
    CHECK(cons_ctab_find(&t, 2) == NULL);
    CHECK_EQ_I64(apply(&sm, &t, 6, 1), 0); /* evicts 3 */
    CHECK(cons_ctab_find(&t, 3) == NULL);
    CHECK_EQ_U64(t.evicted, 2);
    CHECK_EQ_U64(t.used, 4);
    for (uint64_t c = 1; c <= 6; c++) {
        if (c == 2 || c == 3)
            continue;
        CHECK_MSG(cons_ctab_find(&t, c) != NULL, "client %llu lost", (unsigned long long)c);
    }
    CHECK_EQ_U64(cons_ctab_find(&t, 1)->req_no, 2);
    /* 2 comes back with its next request: refused, not applied, no row. */
    CHECK_EQ_I64(apply(&sm, &t, 2, 2), 0);
    CHECK_EQ_I64(rep.status, FK_EEXPIRED);
    CHECK_EQ_I64(rep.req_no, 2);
    CHECK(cons_ctab_find(&t, 2) == NULL);
    CHECK_EQ_U64(t.ops, 7);
    /* A new client still starts at 1 (and the GET is applied). */
    CHECK_EQ_I64(apply(&sm, &t, 2, 1), 0);
    CHECK_EQ_I64(rep.status, FK_ENOTFOUND);
    CHECK(cons_ctab_find(&t, 4) == NULL);
    cons_ctab_free(&t);
    kv_mem_destroy(kv);
}

TEST(equal_stamps_evict_the_smallest_client_id)
{
    struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 3));
    uint64_t ids[3] = {30, 10, 20};
    for (int i = 0; i < 3; i++)
        CHECK_EQ_I64(cons_ctab_put(&t, ids[i], 1, 0, 5), 0);
    CHECK_EQ_I64(cons_ctab_put(&t, 40, 1, 0, 5), 1);
    CHECK(cons_ctab_find(&t, 10) == NULL);
    CHECK_EQ_I64(cons_ctab_put(&t, 50, 1, 0, 6), 1);
    CHECK(cons_ctab_find(&t, 20) == NULL);
    CHECK(cons_ctab_find(&t, 30) && cons_ctab_find(&t, 40) && cons_ctab_find(&t, 50));
    cons_ctab_free(&t);
}

/* ---- an independent model: an unordered array, LRU by linear search ---- */

#define CAP      8
#define CLIENTS  64
#define MODEL_OP 20000

struct model {
    uint64_t id[CAP], stamp[CAP], req[CAP];
    uint32_t n;
    uint64_t ops;
};

/* The expected cons_apply_once result and reply status (a GET of a key
 * nobody wrote: FK_ENOTFOUND when applied). */
static int model_apply(struct model *m, uint64_t id, uint64_t req, int32_t *status)
{
    *status = FK_ENOTFOUND;
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->id[i] != id)
            continue;
        if (req < m->req[i])
            return 2;
        if (req == m->req[i])
            return 1;
        m->req[i] = req;
        m->stamp[i] = ++m->ops;
        return 0;
    }
    if (req > 1) {
        *status = FK_EEXPIRED;
        return 0;
    }
    uint32_t slot = m->n;
    if (m->n == CAP) {
        slot = 0;
        for (uint32_t i = 1; i < m->n; i++) {
            if (m->stamp[i] < m->stamp[slot] ||
                (m->stamp[i] == m->stamp[slot] && m->id[i] < m->id[slot]))
                slot = i;
        }
    } else {
        m->n++;
    }
    m->id[slot] = id;
    m->req[slot] = req;
    m->stamp[slot] = ++m->ops;
    return 0;
}

/* The table holds exactly the model's rows, with their stamps and replies. */
static void same_as_model(struct cons_ctab *t, const struct model *m)
{
    CHECK_EQ_U64(t->used, m->n);
    CHECK_EQ_U64(t->ops, m->ops);
    uint32_t found = 0;
    for (uint32_t s = 0; s < t->slots; s++) {
        if (t->keys[s].client_id == 0)
            continue;
        found++;
        uint32_t i = 0;
        while (i < m->n && m->id[i] != t->keys[s].client_id)
            i++;
        CHECK_MSG(i < m->n, "table holds client %llu, the model evicted it",
                  (unsigned long long)t->keys[s].client_id);
        CHECK_EQ_U64(t->keys[s].used, m->stamp[i]);
        CHECK_EQ_U64(t->rows[s].req_no, m->req[i]);
    }
    CHECK_EQ_U64(found, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        CHECK(cons_ctab_find(t, m->id[i]) != NULL);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(uint64_t n)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
}

/* Clients send mostly their next request, sometimes a resend or an old,
 * delayed copy; a client refused as expired starts over under a fresh id,
 * as a real one would. */
TEST(random_stream_matches_model_and_reload)
{
    struct kv_mem *kv = kv_mem_create(8);
    struct cons_sm sm = kv_mem_sm(kv);
    static struct cons_ctab a, b;
    static struct model m;
    static uint8_t snap[CONS_CTAB_SAVE_MAX(CAP)];
    uint64_t id[CLIENTS], next_req[CLIENTS], fresh = 0;
    CHECK_OK(cons_ctab_init(&a, CAP));
    CHECK_OK(cons_ctab_init(&b, CAP));
    for (int c = 0; c < CLIENTS; c++) {
        id[c] = ++fresh;
        next_req[c] = 1;
    }
    static struct cons_ctab f; /* a follower's: it logs reads unexecuted */
    CHECK_OK(cons_ctab_init(&f, CAP));
    /* The follower's own machine keeps its rows (cons.h, write-through). */
    struct kv_mem *fkv = kv_mem_create(8);
    struct cons_sm fsm = kv_mem_sm(fkv);
    uint64_t expired = 0;
    for (int k = 0; k < MODEL_OP; k++) {
        uint64_t c = rnd(CLIENTS);
        uint64_t dice = rnd(10), req = next_req[c];
        if (dice == 0 && req > 1)
            req--; /* a resend */
        else if (dice == 1 && req > 2)
            req -= 2; /* an old, delayed copy */
        else
            next_req[c]++;
        int32_t st;
        int want = model_apply(&m, id[c], req, &st);
        CHECK_EQ_I64(apply(&sm, &a, id[c], req), want);
        if (want == 0)
            CHECK_EQ_I64(rep.status, st);
        CHECK_EQ_I64(apply(&sm, &b, id[c], req), want);
        struct cons_op op = get_op(id[c], req);
        CHECK_EQ_I64(cons_log_read(&fsm, &f, &op), want);
        if (st == FK_EEXPIRED) {
            expired++;
            id[c] = ++fresh;
            next_req[c] = 1;
        }
        if (k % 997 == 0) {
            /* b restarts from a's snapshot: same rows, same future. */
            size_t len;
            same_as_model(&a, &m);
            CHECK_OK(cons_ctab_save(&a, snap, sizeof snap, &len));
            CHECK_OK(cons_ctab_load(&b, snap, len));
        }
    }
    same_as_model(&a, &m);
    same_as_model(&b, &m);
    same_as_model(&f, &m);
    CHECK_EQ_U64(f.evicted, a.evicted);
    /* The rows the machine kept are the table: loading them back gives
     * the model's rows, stamps and clock (evictions deleted theirs). */
    static struct cons_ctab g;
    uint64_t applied;
    CHECK_OK(cons_ctab_init(&g, CAP));
    CHECK_OK(fsm.ops->mark(fsm.impl, 77, f.ops));
    CHECK_OK(cons_sm_load(&fsm, &g, &applied));
    CHECK_EQ_U64(applied, 77);
    same_as_model(&g, &m);
    cons_ctab_free(&g);
    kv_mem_destroy(fkv);
    CHECK(a.evicted > 100 && expired > 100);
    fprintf(stderr,
            "# %d requests from %d clients over %d rows: %llu evictions, %llu refused as expired\n",
            MODEL_OP, CLIENTS, CAP, (unsigned long long)a.evicted, (unsigned long long)expired);
    cons_ctab_free(&a);
    cons_ctab_free(&b);
    cons_ctab_free(&f);
    kv_mem_destroy(kv);
}

/* A follower logs a read without a reply (FK_EUNKEPT); when it leads and
 * the client retries, the read is read again and the table stays as it
 * is; another op under that number gets FK_EEXPIRED and changes nothing.
 * The marker survives a snapshot. */
TEST(logged_read_is_read_again_on_retry)
{
    struct kv_mem *kv = kv_mem_create(8);
    struct cons_sm sm = kv_mem_sm(kv);
    static struct cons_ctab t, u;
    static uint8_t snap[CONS_CTAB_SAVE_MAX(4)];
    CHECK_OK(cons_ctab_init(&t, 4));
    CHECK_OK(cons_ctab_init(&u, 4));
    struct cons_op put = put_op(1, 1, "v1");
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &put, &rep), 0);
    struct cons_op get = get_op(7, 1);
    CHECK_EQ_I64(cons_log_read(&sm, &t, &get), 0);
    struct cons_ctab_row *row = cons_ctab_find(&t, 7);
    CHECK(row != NULL);
    CHECK_EQ_I64(row->status, FK_EUNKEPT);
    CHECK_EQ_U64(row->req_no, 1);
    CHECK_EQ_U64(t.ops, 2);
    CHECK_EQ_I64(cons_log_read(&sm, &t, &get), 1); /* a duplicate */
    CHECK_EQ_U64(t.ops, 2);
    size_t len;
    CHECK_OK(cons_ctab_save(&t, snap, sizeof snap, &len));
    CHECK_OK(cons_ctab_load(&u, snap, len));
    CHECK_EQ_I64(cons_ctab_find(&u, 7)->status, FK_EUNKEPT);
    put = put_op(1, 2, "v2"); /* written after the read's slot */
    CHECK_EQ_I64(cons_apply_once(&sm, &u, &put, &rep), 0);
    CHECK_EQ_U64(u.ops, 3);
    CHECK_EQ_I64(cons_apply_once(&sm, &u, &get, &rep), 1);
    CHECK_EQ_I64(rep.status, 0);
    CHECK_EQ_U64(rep.req_no, 1);
    CHECK_EQ_U64(rep.len, 2);
    CHECK(memcmp(rep.data, "v2", 2) == 0); /* read now, within its retry */
    CHECK_EQ_U64(u.ops, 3);
    CHECK_EQ_I64(cons_ctab_find(&u, 7)->status, FK_EUNKEPT);
    struct cons_op del = get_op(7, 1);
    del.type = CONS_OP_DEL; /* a client that reused the number */
    CHECK_EQ_I64(cons_apply_once(&sm, &u, &del, &rep), 1);
    CHECK_EQ_I64(rep.status, FK_EEXPIRED);
    CHECK_EQ_I64(cons_apply_once(&sm, &u, &get, &rep), 1);
    CHECK_EQ_I64(rep.status, 0); /* the key is still there */
    CHECK_EQ_U64(u.ops, 3);
    struct cons_op old = get_op(7, 0);
    CHECK_EQ_I64(cons_apply_once(&sm, &u, &old, &rep), 2);
    cons_ctab_free(&t);
    cons_ctab_free(&u);
    kv_mem_destroy(kv);
}

/* A read applied once keeps no result: its retry is read again (a later
 * value, read within the retry) and the table does not move; a write's
 * retry gets the write's kept outcome without applying it again. */
TEST(reads_keep_no_result_writes_keep_their_outcome)
{
    struct kv_mem *kv = kv_mem_create(8);
    struct cons_sm sm = kv_mem_sm(kv);
    static struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 4));
    struct cons_op put = put_op(1, 1, "v1");
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &put, &rep), 0);
    struct cons_op get = get_op(7, 1);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &get, &rep), 0);
    CHECK(rep.status == 0 && rep.len == 2 && memcmp(rep.data, "v1", 2) == 0);
    CHECK_EQ_I64(cons_ctab_find(&t, 7)->status, FK_EUNKEPT);
    put = put_op(1, 2, "v2");
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &put, &rep), 0);
    CHECK_EQ_U64(t.ops, 3);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &get, &rep), 1);
    CHECK(rep.status == 0 && rep.len == 2 && memcmp(rep.data, "v2", 2) == 0);
    CHECK_EQ_U64(t.ops, 3);
    struct cons_op cas = key_op(CONS_OP_CAS, 8, 1, "y", "x");
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &cas, &rep), 0);
    CHECK_EQ_I64(rep.status, FK_ECASFAIL);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &cas, &rep), 1);
    CHECK_EQ_I64(rep.status, FK_ECASFAIL);
    CHECK_EQ_U64(rep.len, 0);
    CHECK_EQ_U64(t.ops, 4);
    cons_ctab_free(&t);
    kv_mem_destroy(kv);
}

/* A configuration change (CONS_OP_CONFIG) is carried out by the core: the
 * machine is not consulted; its outcome is kept as a write's, a retry gets
 * it back without a second change, and the table's clock moves once. */
TEST(config_change_outcome_kept_as_a_writes)
{
    struct kv_mem *kv = kv_mem_create(8);
    struct cons_sm sm = kv_mem_sm(kv);
    static struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 4));
    struct cons_config c = {.epoch = 3, .members = 0x1b}, back;
    uint8_t v[CONS_CONFIG_BYTES];
    cons_config_put(&c, v);
    struct cons_op op;
    cons_op_init(&op, CONS_OP_CONFIG, NULL, 0, v, CONS_CONFIG_BYTES, NULL, 0);
    op.client_id = 9;
    op.req_no = 1;
    CHECK_OK(cons_config_get(&op, &back));
    CHECK(back.epoch == 3 && back.members == 0x1b);
    CHECK_EQ_I64(cons_apply_core(&sm, &t, &op, 0, &rep), 0);
    CHECK_EQ_I64(rep.status, 0);
    CHECK_EQ_U64(t.ops, 1);
    CHECK_EQ_I64(cons_apply_core(&sm, &t, &op, FK_EBUSY, &rep), 1); /* a retry: kept */
    CHECK_EQ_I64(rep.status, 0);
    op.req_no = 2;
    CHECK_EQ_I64(cons_apply_core(&sm, &t, &op, FK_EBUSY, &rep), 0);
    CHECK_EQ_I64(rep.status, FK_EBUSY);
    CHECK_EQ_U64(t.ops, 2);
    CHECK_EQ_U64(kv_mem_count(kv), 0); /* nothing reached the machine's pairs */
    struct cons_op bad = op;
    bad.val_len = 4;
    CHECK_ERR(cons_config_get(&bad, &back), FK_EMALFORMED);
    cons_ctab_free(&t);
    kv_mem_destroy(kv);
}

TEST(load_rejects_bad_snapshots_and_keeps_the_table)
{
    static struct cons_ctab t, u;
    static uint8_t buf[CONS_CTAB_SAVE_MAX(4)], bad[sizeof buf];
    CHECK_OK(cons_ctab_init(&t, 4));
    CHECK_OK(cons_ctab_init(&u, 4));
    for (uint64_t c = 1; c <= 3; c++) {
        cons_ctab_put(&t, c, 1, FK_ECASFAIL, c);
        t.ops = c;
    }
    cons_ctab_put(&u, 9, 1, 0, 0);
    size_t len;
    CHECK_OK(cons_ctab_save(&t, buf, sizeof buf, &len));
    CHECK_EQ_U64(len, CONS_CTAB_SAVE_MAX(3));
    /* Records: u64 ops, u32 n, then (u64 stamp, u64 client, u64 request, i32 status). */
    size_t rec = CONS_CTAB_ROW_WIRE, first = 12;
    memcpy(bad, buf, len);
    memcpy(bad + first + rec + 8, bad + first + 8, 8); /* record 2 names record 1's client */
    CHECK_ERR(cons_ctab_load(&u, bad, len), FK_EMALFORMED);
    memcpy(bad, buf, len);
    uint64_t future = 4;
    memcpy(bad + first, &future, 8); /* a stamp above ops */
    CHECK_ERR(cons_ctab_load(&u, bad, len), FK_EMALFORMED);
    CHECK_ERR(cons_ctab_check(&u, bad, len), FK_EMALFORMED);
    int32_t positive = 1;
    memcpy(bad, buf, len);
    memcpy(bad + first + 8 + 16, &positive, 4); /* a status > 0 */
    CHECK_ERR(cons_ctab_check(&u, bad, len), FK_EMALFORMED);
    CHECK_ERR(cons_ctab_load(&u, bad, len), FK_EMALFORMED);
    for (size_t cut = 0; cut < len; cut++)
        CHECK(cons_ctab_load(&u, buf, cut) < 0 && cons_ctab_check(&u, buf, cut) < 0);
    /* A good table checks, and checking changes nothing. */
    CHECK_OK(cons_ctab_check(&u, buf, len));
    CHECK_EQ_U64(u.used, 1); /* untouched by every failure */
    CHECK(cons_ctab_find(&u, 9) != NULL && cons_ctab_find(&u, 1) == NULL);
    struct cons_ctab small;
    CHECK_OK(cons_ctab_init(&small, 2));
    CHECK_ERR(cons_ctab_load(&small, buf, len), FK_EFULL);
    cons_ctab_free(&small);
    CHECK_OK(cons_ctab_load(&u, buf, len));
    CHECK(cons_ctab_find(&u, 9) == NULL);
    for (uint64_t c = 1; c <= 3; c++) {
        struct cons_ctab_row *row = cons_ctab_find(&u, c);
        CHECK(row != NULL && row->req_no == 1 && row->status == FK_ECASFAIL);
    }
    CHECK_EQ_U64(u.ops, 3);
    cons_ctab_free(&t);
    cons_ctab_free(&u);
}

/* Not a timed test: prints the cost of an apply that evicts from a full
 * CONS_CLIENTS_MAX table beside one that updates an existing row. */
TEST(eviction_cost_figure)
{
    struct kv_mem *kv = kv_mem_create(8);
    struct cons_sm sm = kv_mem_sm(kv);
    static struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, CONS_CLIENTS_MAX));
    for (uint64_t c = 1; c <= CONS_CLIENTS_MAX; c++)
        CHECK_EQ_I64(apply(&sm, &t, c, 1), 0);
    enum { ROUNDS = 2000 };
    uint64_t t0 = fk_now_ns();
    for (uint64_t k = 0; k < ROUNDS; k++)
        CHECK_EQ_I64(apply(&sm, &t, 1 + k % CONS_CLIENTS_MAX, 2 + k / CONS_CLIENTS_MAX), 0);
    uint64_t t1 = fk_now_ns();
    for (uint64_t k = 0; k < ROUNDS; k++)
        CHECK_EQ_I64(apply(&sm, &t, 1000000 + k, 1), 0);
    uint64_t t2 = fk_now_ns();
    CHECK_EQ_U64(t.evicted, ROUNDS);
    double upd = (double)(t1 - t0) / ROUNDS, evict = (double)(t2 - t1) / ROUNDS;
    fprintf(stderr,
            "# apply with eviction (%u rows): %.0f ns; updating apply: %.0f ns; ratio %.1f\n",
            (unsigned)CONS_CLIENTS_MAX, evict, upd, evict / upd);
    cons_ctab_free(&t);
    kv_mem_destroy(kv);
}

CHECK_MAIN()
