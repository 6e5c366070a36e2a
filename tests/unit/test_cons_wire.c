/* Unit tests for consensus/ wire codecs, the client table and kv_mem. */
#include "check.h"
#include "cons.h"
#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h"
#include "mpx.h"

#include <stdlib.h>

static struct cons_op mkop(uint8_t type, const char *key, const char *val, const char *exp)
{
    struct cons_op op;
    memset(&op, 0, sizeof op);
    op.client_id = 7;
    op.req_no = 1;
    op.type = type;
    op.key_len = (uint16_t)strlen(key);
    memcpy(op.key, key, op.key_len);
    op.val_len = (uint16_t)strlen(val);
    memcpy(op.val, val, op.val_len);
    op.exp_len = (uint16_t)strlen(exp);
    memcpy(op.exp, exp, op.exp_len);
    if (type == CONS_OP_SCAN)
        op.scan_limit = 4;
    return op;
}

TEST(op_roundtrip)
{
    uint8_t buf[CONS_WIRE_OP_MAX];
    struct cons_op in = mkop(CONS_OP_CAS, "key", "new", "old"), out;
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, sizeof buf);
    cons_wire_put_op(&w, &in);
    CHECK_OK(w.err);
    CHECK_EQ_U64(w.len, sizeof(struct cons_wire_op) + 3 + 3 + 3);
    struct cons_rbuf r;
    cons_rbuf_init(&r, buf, w.len);
    CHECK_OK(cons_wire_get_op(&r, &out));
    CHECK_OK(cons_r_done(&r));
    CHECK_EQ_U64(out.type, CONS_OP_CAS);
    CHECK(out.val_len == 3 && memcmp(out.val, "new", 3) == 0);
    CHECK(out.exp_len == 3 && memcmp(out.exp, "old", 3) == 0);
    /* Every truncation is rejected. */
    for (size_t cut = 0; cut < w.len; cut++) {
        cons_rbuf_init(&r, buf, cut);
        CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
    }
}

TEST(op_shapes_rejected)
{
    uint8_t buf[CONS_WIRE_OP_MAX];
    struct cons_op bad[4] = {mkop(CONS_OP_GET, "", "", ""), mkop(CONS_OP_GET, "k", "v", ""),
                             mkop(9, "k", "", ""), mkop(CONS_OP_PUT, "k", "v", "x")};
    for (int i = 0; i < 4; i++) {
        struct cons_wbuf w;
        struct cons_rbuf r;
        struct cons_op out;
        cons_wbuf_init(&w, buf, sizeof buf);
        cons_wire_put_op(&w, &bad[i]);
        cons_rbuf_init(&r, buf, w.len);
        CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
    }
    /* A length field larger than the limit. */
    struct cons_op op = mkop(CONS_OP_PUT, "k", "v", "");
    struct cons_wbuf w;
    cons_wbuf_init(&w, buf, sizeof buf);
    cons_wire_put_op(&w, &op);
    uint16_t huge = CONS_VAL_MAX + 1;
    memcpy(buf + offsetof(struct cons_wire_op, val_len), &huge, 2);
    struct cons_rbuf r;
    struct cons_op out;
    cons_rbuf_init(&r, buf, w.len);
    CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
}

TEST(request_and_garbage)
{
    uint8_t buf[CONS_WIRE_OP_MAX + 64];
    struct cons_op op = mkop(CONS_OP_PUT, "k", "v", "");
    int len = mpx_encode_request(buf, sizeof buf, &op);
    CHECK(len > (int)sizeof(struct cons_wire_hdr));
    struct cons_reply rep;
    uint32_t hint;
    /* A request is not a reply; truncations and random bytes are rejected. */
    CHECK_ERR(mpx_decode_reply(buf, (size_t)len, &rep, &hint), FK_EMALFORMED);
    for (int cut = 0; cut < len; cut++)
        CHECK_ERR(mpx_decode_reply(buf, (size_t)cut, &rep, &hint), FK_EMALFORMED);
    uint64_t s = 1;
    for (int round = 0; round < 2000; round++) {
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[i] = (uint8_t)(s >> 56);
        }
        CHECK_ERR(mpx_decode_reply(buf, (size_t)len, &rep, &hint), FK_EMALFORMED);
    }
    CHECK_ERR(mpx_decode_reply(NULL, 0, &rep, &hint), FK_EMALFORMED);
}

TEST(ctab_save_load_and_exactly_once)
{
    struct kv_mem *kv = kv_mem_create(8);
    CHECK(kv != NULL);
    struct cons_sm sm = kv_mem_sm(kv);
    struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 2));
    static struct cons_reply rep;
    struct cons_op op = mkop(CONS_OP_PUT, "a", "1", "");
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &op, &rep), 0);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &op, &rep), 1); /* duplicate: cached */
    op.req_no = 0 + 1;
    struct cons_op older = op;
    op.req_no = 2;
    op.val[0] = '2';
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &op, &rep), 0);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &older, &rep), 2); /* old: ignored */
    /* A third client evicts the least recently used row (client 7);
     * test_cons_ctab.c covers eviction in depth. */
    struct cons_op c2 = mkop(CONS_OP_PUT, "b", "x", ""), c3 = c2;
    c2.client_id = 8;
    c3.client_id = 9;
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &c2, &rep), 0);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &c3, &rep), 0);
    CHECK_EQ_I64(rep.status, 0);
    CHECK(cons_ctab_find(&t, 7) == NULL);
    c3.client_id = 7; /* 7's next request (req_no 1 of 7 was long ago) */
    c3.req_no = 3;
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &c3, &rep), 0);
    CHECK_EQ_I64(rep.status, FK_EEXPIRED);
    static uint8_t buf[1 << 16];
    size_t len;
    CHECK_OK(cons_ctab_save(&t, buf, sizeof buf, &len));
    struct cons_ctab u;
    CHECK_OK(cons_ctab_init(&u, 2));
    CHECK_OK(cons_ctab_load(&u, buf, len));
    CHECK(cons_ctab_find(&u, 9) && cons_ctab_find(&u, 9)->req_no == 1);
    CHECK(cons_ctab_find(&u, 8) != NULL);
    CHECK(cons_ctab_find(&u, 7) == NULL);
    CHECK_EQ_U64(u.ops, t.ops);
    for (size_t cut = 0; cut < len; cut++)
        CHECK(cons_ctab_load(&u, buf, cut) < 0);
    cons_ctab_free(&t);
    cons_ctab_free(&u);
    kv_mem_destroy(kv);
}

static int32_t apply(struct cons_sm *sm, struct cons_op op, struct cons_reply *rep)
{
    CHECK_OK(sm->ops->apply(sm->impl, &op, rep));
    return rep->status;
}

TEST(kv_ops_and_scan)
{
    struct kv_mem *kv = kv_mem_create(4);
    struct cons_sm sm = kv_mem_sm(kv);
    static struct cons_reply rep;
    CHECK_ERR(apply(&sm, mkop(CONS_OP_GET, "b", "", ""), &rep), FK_ENOTFOUND);
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "b", "2", ""), &rep));
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "a", "1", ""), &rep));
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "c", "3", ""), &rep));
    CHECK_OK(apply(&sm, mkop(CONS_OP_GET, "b", "", ""), &rep));
    CHECK(rep.len == 1 && rep.data[0] == '2');
    CHECK_ERR(apply(&sm, mkop(CONS_OP_CAS, "b", "9", "1"), &rep), FK_ECASFAIL);
    CHECK_OK(apply(&sm, mkop(CONS_OP_CAS, "b", "9", "2"), &rep));
    CHECK_ERR(apply(&sm, mkop(CONS_OP_CAS, "z", "9", "2"), &rep), FK_ENOTFOUND);
    CHECK_OK(apply(&sm, mkop(CONS_OP_DEL, "a", "", ""), &rep));
    CHECK_ERR(apply(&sm, mkop(CONS_OP_DEL, "a", "", ""), &rep), FK_ENOTFOUND);
    CHECK_OK(apply(&sm, mkop(CONS_OP_SCAN, "a", "", ""), &rep));
    /* b=9, c=3 in order: 2+1+2+1 + 2+1+2+1 bytes. */
    CHECK_EQ_U64(rep.len, 12);
    CHECK(rep.data[2] == 'b' && rep.data[5] == '9' && rep.data[8] == 'c');
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "d", "4", ""), &rep));
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "e", "5", ""), &rep));
    CHECK_ERR(apply(&sm, mkop(CONS_OP_PUT, "f", "6", ""), &rep), FK_EFULL);
    CHECK_EQ_U64(kv_mem_count(kv), 4);
    kv_mem_destroy(kv);
}

TEST(kv_snapshot_install)
{
    struct kv_mem *a = kv_mem_create(8), *b = kv_mem_create(8);
    struct cons_sm sa = kv_mem_sm(a), sb = kv_mem_sm(b);
    static struct cons_reply rep;
    apply(&sa, mkop(CONS_OP_PUT, "x", "1", ""), &rep);
    apply(&sa, mkop(CONS_OP_PUT, "y", "2", ""), &rep);
    static uint8_t buf[1 << 15];
    size_t len;
    CHECK_OK(sa.ops->snapshot(sa.impl, buf, sizeof buf, &len));
    CHECK_ERR(sa.ops->snapshot(sa.impl, buf, 3, &len), FK_ETOOBIG);
    CHECK_OK(sa.ops->snapshot(sa.impl, buf, sizeof buf, &len));
    for (size_t cut = 0; cut < len; cut++)
        CHECK_ERR(sb.ops->install(sb.impl, buf, cut), FK_EMALFORMED);
    CHECK_EQ_U64(kv_mem_count(b), 0); /* unchanged by bad snapshots */
    CHECK_OK(sb.ops->install(sb.impl, buf, len));
    CHECK_OK(apply(&sb, mkop(CONS_OP_GET, "y", "", ""), &rep));
    CHECK(rep.len == 1 && rep.data[0] == '2');
    /* Keys out of order are malformed. */
    buf[6] = 'z';
    CHECK_ERR(sb.ops->install(sb.impl, buf, len), FK_EMALFORMED);
    kv_mem_destroy(a);
    kv_mem_destroy(b);
}

CHECK_MAIN()
