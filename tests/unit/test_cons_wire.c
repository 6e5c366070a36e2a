/* Unit tests for consensus/ wire codecs, the client table and kv_mem. */
#include "check.h"
#include "cons.h"
#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h"
#include "mpx.h"

#include <stdlib.h>

/* Applies fill a reply's buffer (cons.h): a static one, never the stack. */
static uint8_t rep_data[CONS_REPLY_MAX];
static struct cons_reply rep = {.data = rep_data, .cap = CONS_REPLY_MAX};
/* Encodings of the largest op. */
static uint8_t buf[CONS_WIRE_OP_MAX + 64];

static struct cons_op mkop(uint8_t type, const char *key, const char *val, const char *exp)
{
    struct cons_op op;
    cons_op_init(&op, type, key, (uint32_t)strlen(key), val, (uint32_t)strlen(val), exp,
                 (uint32_t)strlen(exp));
    op.client_id = 7;
    op.req_no = 1;
    if (type == CONS_OP_SCAN)
        op.scan_limit = 4;
    return op;
}

TEST(op_roundtrip)
{
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
    CHECK(out.ext == NULL);
    CHECK(out.key_len == 3 && memcmp(cons_op_key(&out), "key", 3) == 0);
    CHECK(out.val_len == 3 && memcmp(cons_op_val(&out), "new", 3) == 0);
    CHECK(out.exp_len == 3 && memcmp(cons_op_exp(&out), "old", 3) == 0);
    cons_rbuf_init(&r, buf, w.len);
    CHECK_EQ_I64(cons_wire_skip_op(&r), 3 + 3 + 3);
    CHECK_OK(cons_r_done(&r));
    /* Every truncation is rejected. */
    for (size_t cut = 0; cut < w.len; cut++) {
        cons_rbuf_init(&r, buf, cut);
        CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
    }
}

/* An op of the largest key and value, and a CAS of the largest value and
 * expected value: their bytes do not fit inline, so they are decoded in
 * place (ext points into the message). */
TEST(large_op_roundtrip)
{
    size_t n = CONS_KEY_MAX + 2 * (size_t)CONS_VAL_MAX;
    uint8_t *bytes = malloc(n);
    CHECK(bytes != NULL);
    for (size_t i = 0; i < n; i++)
        bytes[i] = (uint8_t)(i * 131 + 7);
    uint32_t vals[2] = {CONS_VAL_MAX, CONS_VAL_MAX};
    uint32_t exps[2] = {0, CONS_VAL_MAX};
    uint8_t types[2] = {CONS_OP_PUT, CONS_OP_CAS};
    for (int i = 0; i < 2; i++) {
        struct cons_op in, out;
        cons_op_init(&in, types[i], bytes, CONS_KEY_MAX, bytes + CONS_KEY_MAX, vals[i],
                     bytes + CONS_KEY_MAX + vals[i], exps[i]);
        in.client_id = 7;
        in.req_no = 1;
        CHECK(in.ext == bytes);
        size_t nb = cons_op_nbytes(&in);
        struct cons_wbuf w;
        cons_wbuf_init(&w, buf, sizeof buf);
        cons_wire_put_op(&w, &in);
        CHECK_OK(w.err);
        CHECK_EQ_U64(w.len, sizeof(struct cons_wire_op) + nb);
        CHECK(w.len <= CONS_WIRE_OP_MAX);
        struct cons_rbuf r;
        cons_rbuf_init(&r, buf, w.len);
        CHECK_OK(cons_wire_get_op(&r, &out));
        CHECK_OK(cons_r_done(&r));
        CHECK(out.ext == buf + sizeof(struct cons_wire_op));
        CHECK(memcmp(&out, &in, CONS_OP_HEAD) == 0);
        CHECK(memcmp(cons_op_key(&out), bytes, nb) == 0);
        cons_rbuf_init(&r, buf, w.len);
        CHECK_EQ_I64(cons_wire_skip_op(&r), (int64_t)nb);
        cons_rbuf_init(&r, buf, w.len - 1);
        CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
    }
    free(bytes);
}

TEST(op_shapes_rejected)
{
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
    uint32_t huge = CONS_VAL_MAX + 1;
    memcpy(buf + offsetof(struct cons_wire_op, val_len), &huge, 4);
    struct cons_rbuf r;
    struct cons_op out;
    cons_rbuf_init(&r, buf, w.len);
    CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
}

/* A configuration change travels with its CONS_CONFIG_BYTES value and no
 * key; any other shape is refused. */
TEST(config_op_shape)
{
    uint8_t v[CONS_CONFIG_BYTES] = {1};
    struct cons_op op, out;
    cons_op_init(&op, CONS_OP_CONFIG, NULL, 0, v, CONS_CONFIG_BYTES, NULL, 0);
    op.client_id = 4;
    op.req_no = 1;
    struct cons_wbuf w;
    struct cons_rbuf r;
    cons_wbuf_init(&w, buf, sizeof buf);
    cons_wire_put_op(&w, &op);
    cons_rbuf_init(&r, buf, w.len);
    CHECK_OK(cons_wire_get_op(&r, &out));
    CHECK_EQ_U64(out.type, CONS_OP_CONFIG);
    CHECK_EQ_U64(out.val_len, CONS_CONFIG_BYTES);
    cons_op_init(&op, CONS_OP_CONFIG, "k", 1, v, CONS_CONFIG_BYTES, NULL, 0);
    op.client_id = 4;
    op.req_no = 1;
    cons_wbuf_init(&w, buf, sizeof buf);
    cons_wire_put_op(&w, &op);
    cons_rbuf_init(&r, buf, w.len);
    CHECK_ERR(cons_wire_get_op(&r, &out), FK_EMALFORMED);
}

TEST(request_and_garbage)
{
    struct cons_op op = mkop(CONS_OP_PUT, "k", "v", "");
    int len = mpx_encode_request(buf, sizeof buf, &op);
    CHECK(len > (int)sizeof(struct cons_wire_hdr));
    struct cons_reply dec;
    const uint8_t *data;
    uint32_t hint;
    /* A request is not a reply; truncations and random bytes are rejected. */
    CHECK_ERR(mpx_decode_reply(buf, (size_t)len, &dec, &data, &hint), FK_EMALFORMED);
    for (int cut = 0; cut < len; cut++)
        CHECK_ERR(mpx_decode_reply(buf, (size_t)cut, &dec, &data, &hint), FK_EMALFORMED);
    uint64_t s = 1;
    for (int round = 0; round < 2000; round++) {
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[i] = (uint8_t)(s >> 56);
        }
        CHECK_ERR(mpx_decode_reply(buf, (size_t)len, &dec, &data, &hint), FK_EMALFORMED);
    }
    CHECK_ERR(mpx_decode_reply(NULL, 0, &dec, &data, &hint), FK_EMALFORMED);
}

TEST(ctab_save_load_and_exactly_once)
{
    struct kv_mem *kv = kv_mem_create(8);
    CHECK(kv != NULL);
    struct cons_sm sm = kv_mem_sm(kv);
    struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 2));
    struct cons_op op = mkop(CONS_OP_PUT, "a", "1", "");
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &op, &rep), 0);
    CHECK_EQ_I64(cons_apply_once(&sm, &t, &op, &rep), 1); /* duplicate: cached */
    op.req_no = 0 + 1;
    struct cons_op older = op;
    op = mkop(CONS_OP_PUT, "a", "2", "");
    op.req_no = 2;
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

static int32_t apply(struct cons_sm *sm, struct cons_op op, struct cons_reply *out)
{
    CHECK_OK(sm->ops->apply(sm->impl, &op, out));
    return out->status;
}

TEST(kv_ops_and_scan)
{
    struct kv_mem *kv = kv_mem_create(4);
    struct cons_sm sm = kv_mem_sm(kv);
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
    /* b=9, c=3 in order: 2+1+4+1 + 2+1+4+1 bytes (u16 klen, key, u32 vlen,
     * value). */
    CHECK_EQ_U64(rep.len, 16);
    CHECK(rep.data[2] == 'b' && rep.data[7] == '9' && rep.data[10] == 'c' && rep.data[15] == '3');
    uint16_t kl;
    uint32_t vl;
    memcpy(&kl, rep.data + 8, 2);
    memcpy(&vl, rep.data + 11, 4);
    CHECK(kl == 1 && vl == 1);
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "d", "4", ""), &rep));
    CHECK_OK(apply(&sm, mkop(CONS_OP_PUT, "e", "5", ""), &rep));
    CHECK_ERR(apply(&sm, mkop(CONS_OP_PUT, "f", "6", ""), &rep), FK_EFULL);
    CHECK_EQ_U64(kv_mem_count(kv), 4);
    kv_mem_destroy(kv);
}

/* The state stream (cons.h) of kv_mem, saved and restored whole: every
 * cut of it is refused and leaves the receiver as it was, and so are
 * keys out of order. */
TEST(kv_state_stream_save_restore)
{
    static uint8_t st[CONS_SNAP_RECORD_MAX + 4096];
    struct kv_mem *a = kv_mem_create(8), *b = kv_mem_create(8);
    struct cons_sm sa = kv_mem_sm(a), sb = kv_mem_sm(b);
    apply(&sa, mkop(CONS_OP_PUT, "x", "1", ""), &rep);
    apply(&sa, mkop(CONS_OP_PUT, "y", "2", ""), &rep);
    size_t len, plen;
    CHECK_ERR(cons_sm_save(&sa, st, 3, &len), FK_ETOOBIG);
    CHECK_OK(cons_sm_save(&sa, st, sizeof st, &len));
    for (size_t cut = 0; cut < len; cut++)
        CHECK_ERR(cons_sm_restore(&sb, st, cut), FK_EMALFORMED);
    CHECK_EQ_U64(kv_mem_count(b), 0); /* unchanged by bad streams */
    CHECK_OK(cons_sm_restore(&sb, st, len));
    CHECK_OK(apply(&sb, mkop(CONS_OP_GET, "y", "", ""), &rep));
    CHECK(rep.len == 1 && rep.data[0] == '2');
    /* The pairs alone: two PAIR records, x then y. */
    CHECK_OK(cons_sm_pairs(&sb, st, sizeof st, &plen));
    CHECK_EQ_U64(plen, 2 * (1 + 2 + 1 + 4 + 1));
    CHECK(st[0] == CONS_SNAP_PAIR && st[3] == 'x' && st[9] == CONS_SNAP_PAIR && st[12] == 'y');
    /* Keys out of order are malformed: x becomes z, after y. */
    CHECK_OK(cons_sm_save(&sa, st, sizeof st, &len));
    size_t x = 0;
    while (x + 4 < len && !(st[x] == CONS_SNAP_PAIR && st[x + 3] == 'x'))
        x++;
    CHECK(x + 4 < len);
    st[x + 3] = 'z';
    CHECK_ERR(cons_sm_restore(&sb, st, len), FK_EMALFORMED);
    CHECK_OK(apply(&sb, mkop(CONS_OP_GET, "x", "", ""), &rep)); /* still there */
    kv_mem_destroy(a);
    kv_mem_destroy(b);
}

CHECK_MAIN()
