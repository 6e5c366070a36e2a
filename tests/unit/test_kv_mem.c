/* test_kv_mem.c: the simulator's state machine keeps cons.h's stream
 * contract: views, cursors, chunks, staged installs, refusals. */
#include "check.h"
#include "cons.h"
#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h"

#include <stdio.h>
#include <string.h>

/* Applies fill a reply's buffer (cons.h): a static one, never the stack. */
static uint8_t rep_data[CONS_REPLY_MAX];
static struct cons_reply rep = {.data = rep_data, .cap = CONS_REPLY_MAX};

static void put(struct cons_sm *sm, const char *k, const char *v)
{
    static struct cons_op op;
    cons_op_init(&op, CONS_OP_PUT, k, (uint32_t)strlen(k), v, (uint32_t)strlen(v), NULL, 0);
    op.client_id = 1;
    op.req_no = 1;
    CHECK_OK(sm->ops->apply(sm->impl, &op, &rep));
    CHECK_EQ_I64(rep.status, 0);
}

static void fill(struct cons_sm *sm, int keys, int sessions)
{
    for (int i = 0; i < keys; i++) {
        char k[16], v[32];
        snprintf(k, sizeof k, "key%03d", i);
        snprintf(v, sizeof v, "value-%d", i * 7);
        put(sm, k, v);
    }
    for (int i = 0; i < sessions; i++) {
        struct cons_session s = {.client_id = 100 + (uint64_t)i * 3,
                                 .req_no = 5,
                                 .stamp = (uint64_t)i + 1,
                                 .status = i % 2 ? FK_ECASFAIL : 0};
        CHECK_OK(sm->ops->session(sm->impl, &s));
    }
    CHECK_OK(sm->ops->mark(sm->impl, 42, (uint64_t)sessions));
}

/* Reads view slot whole, `want` bytes a chunk; returns the chunk count. */
static int read_all(struct cons_sm *sm, uint32_t slot, size_t want, uint8_t *out, size_t cap,
                    size_t *len)
{
    uint8_t cur[CONS_SNAP_CURSOR_MAX];
    size_t clen = 0, got;
    int chunks = 0, rc = 0;
    *len = 0;
    while (rc == 0) {
        CHECK(cap - *len >= CONS_SNAP_RECORD_MAX);
        rc = sm->ops->snap_read(sm->impl, slot, cur, &clen, out + *len, CONS_SNAP_RECORD_MAX, want,
                                &got);
        CHECK(rc >= 0);
        CHECK(got > 0);
        *len += got;
        chunks++;
    }
    return chunks;
}

/* Room for a whole (small) stream, and for one more record after it:
 * snap_read and cons_sm_save want CONS_SNAP_RECORD_MAX bytes free before
 * every chunk. */
#define STREAM_CAP ((1 << 16) + CONS_SNAP_RECORD_MAX)
static uint8_t a_buf[STREAM_CAP], b_buf[STREAM_CAP];

TEST(stream_round_trip_in_many_chunks)
{
    struct kv_mem *a = kv_mem_create(64), *b = kv_mem_create(64);
    struct cons_sm sa = kv_mem_sm(a), sb = kv_mem_sm(b);
    fill(&sa, 40, 9);
    uint64_t applied;
    CHECK_OK(sa.ops->snap_open(sa.impl, 3, &applied));
    CHECK_EQ_U64(applied, 42);
    size_t la, lb;
    int chunks = read_all(&sa, 3, 1, a_buf, sizeof a_buf, &la);
    CHECK_EQ_I64(chunks, 1 + 9 + 40 + 1); /* one record a chunk */
    /* Chunk by chunk into b, as a transfer would. */
    uint8_t cur[CONS_SNAP_CURSOR_MAX];
    static uint8_t chunk[CONS_SNAP_RECORD_MAX];
    size_t clen = 0, got;
    int rc = 0;
    CHECK_OK(sb.ops->install_begin(sb.impl));
    while (rc == 0) {
        rc = sa.ops->snap_read(sa.impl, 3, cur, &clen, chunk, sizeof chunk, 100, &got);
        CHECK(rc >= 0);
        CHECK_OK(sb.ops->install_chunk(sb.impl, chunk, got));
    }
    CHECK_OK(sb.ops->install_commit(sb.impl));
    sa.ops->snap_close(sa.impl, 3);
    CHECK_EQ_U64(kv_mem_count(b), 40);
    CHECK_OK(cons_sm_save(&sb, b_buf, sizeof b_buf, &lb));
    CHECK_EQ_U64(lb, la);
    CHECK(memcmp(a_buf, b_buf, la) == 0);
    /* The rows and the mark come back through load. */
    static struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 16));
    CHECK_OK(cons_sm_load(&sb, &t, &applied));
    CHECK_EQ_U64(applied, 42);
    CHECK_EQ_U64(t.used, 9);
    CHECK_EQ_U64(t.ops, 9);
    CHECK_EQ_I64(cons_ctab_find(&t, 103)->status, FK_ECASFAIL);
    cons_ctab_free(&t);
    kv_mem_destroy(a);
    kv_mem_destroy(b);
}

TEST(view_is_consistent_and_chunks_read_again)
{
    struct kv_mem *a = kv_mem_create(64);
    struct cons_sm sa = kv_mem_sm(a);
    fill(&sa, 10, 2);
    uint64_t applied;
    size_t l1, l2;
    CHECK_OK(sa.ops->snap_open(sa.impl, 0, &applied));
    put(&sa, "key000", "changed after the view opened");
    put(&sa, "zzz", "new");
    CHECK_OK(sa.ops->mark(sa.impl, 50, 3));
    read_all(&sa, 0, 64, a_buf, sizeof a_buf, &l1);
    /* The view holds the state as it was at open. */
    CHECK(memmem(a_buf, l1, "changed", 7) == NULL);
    CHECK(memmem(a_buf, l1, "zzz", 3) == NULL);
    /* A chunk read again from its cursor is the same bytes. */
    uint8_t cur[CONS_SNAP_CURSOR_MAX], saved[CONS_SNAP_CURSOR_MAX];
    size_t clen = 0, slen, got1, got2;
    CHECK_OK(sa.ops->snap_read(sa.impl, 0, cur, &clen, a_buf, CONS_SNAP_RECORD_MAX, 40, &got1));
    CHECK_OK(sa.ops->snap_read(sa.impl, 0, cur, &clen, a_buf, CONS_SNAP_RECORD_MAX, 40, &got1));
    memcpy(saved, cur, clen);
    slen = clen;
    CHECK_OK(sa.ops->snap_read(sa.impl, 0, cur, &clen, a_buf, CONS_SNAP_RECORD_MAX, 40, &got1));
    CHECK_OK(sa.ops->snap_read(sa.impl, 0, saved, &slen, b_buf, CONS_SNAP_RECORD_MAX, 40, &got2));
    CHECK_EQ_U64(got1, got2);
    CHECK(memcmp(a_buf, b_buf, got1) == 0);
    /* A reopened view sees the new state. */
    CHECK_OK(sa.ops->snap_open(sa.impl, 0, &applied));
    CHECK_EQ_U64(applied, 50);
    read_all(&sa, 0, 64, a_buf, sizeof a_buf, &l2);
    CHECK(memmem(a_buf, l2, "zzz", 3) != NULL);
    sa.ops->snap_close(sa.impl, 0);
    CHECK_ERR(sa.ops->snap_read(sa.impl, 0, cur, &clen, a_buf, sizeof a_buf, 40, &got1), FK_EINVAL);
    kv_mem_destroy(a);
}

/* Installs buf into b; the result of commit (or of the first failing call). */
static int install(struct cons_sm *sb, const uint8_t *buf, size_t len)
{
    int rc = sb->ops->install_begin(sb->impl);
    if (rc == 0)
        rc = sb->ops->install_chunk(sb->impl, buf, len);
    if (rc == 0)
        rc = sb->ops->install_commit(sb->impl);
    return rc;
}

TEST(bad_streams_leave_the_live_state)
{
    struct kv_mem *a = kv_mem_create(64), *b = kv_mem_create(4);
    struct cons_sm sa = kv_mem_sm(a), sb = kv_mem_sm(b);
    fill(&sa, 3, 2);
    fill(&sb, 1, 0);
    size_t len, before_len, after_len;
    static uint8_t before[STREAM_CAP], after[STREAM_CAP], bad[STREAM_CAP];
    CHECK_OK(cons_sm_save(&sb, before, sizeof before, &before_len));
    CHECK_OK(cons_sm_save(&sa, a_buf, sizeof a_buf, &len));
    /* Offsets: HEAD 17, two sessions of 29, three pairs, END 17. */
    size_t pair0 = 17 + 2 * 29;
    memcpy(bad, a_buf, len);
    bad[0] = 9; /* an unknown tag */
    CHECK_ERR(install(&sb, bad, len), FK_EMALFORMED);
    memcpy(bad, a_buf, len);
    bad[17] = CONS_SNAP_PAIR; /* a pair where a session is: garbage lengths */
    CHECK(install(&sb, bad, len) < 0);
    CHECK_ERR(install(&sb, a_buf, len - 17), FK_EMALFORMED);      /* no END */
    CHECK_ERR(install(&sb, a_buf, len - 5), FK_EMALFORMED);       /* a record cut */
    CHECK_ERR(install(&sb, a_buf + 17, len - 17), FK_EMALFORMED); /* no HEAD */
    memcpy(bad, a_buf, len);
    bad[len - 1 - 8] ^= 1; /* END's pair count */
    CHECK_ERR(install(&sb, bad, len), FK_EMALFORMED);
    memcpy(bad, a_buf, len);
    bad[pair0 + 3 + 5] = 'z'; /* "key000" -> "key00z": keys out of order */
    CHECK_ERR(install(&sb, bad, len), FK_EMALFORMED);
    /* Over the machine's capacity: 4 keys. */
    struct kv_mem *c = kv_mem_create(64);
    struct cons_sm sc = kv_mem_sm(c);
    fill(&sc, 5, 0);
    CHECK_OK(cons_sm_save(&sc, bad, sizeof bad, &len));
    CHECK_ERR(install(&sb, bad, len), FK_EFULL);
    /* A pair whose value is within CONS_VAL_MAX but over what this machine
     * holds (KV_MEM_VAL_MAX): refused. HEAD, the pair (u8 tag, u16 klen,
     * key, u32 vlen, value), END. */
    struct cons_wbuf w;
    cons_wbuf_init(&w, bad, sizeof bad);
    cons_w_u8(&w, CONS_SNAP_HEAD);
    cons_w_u64(&w, 1);
    cons_w_u64(&w, 0);
    cons_w_u8(&w, CONS_SNAP_PAIR);
    cons_w_u16(&w, 1);
    cons_w_u8(&w, 'k');
    cons_w_u32(&w, KV_MEM_VAL_MAX + 1);
    for (uint32_t i = 0; i <= KV_MEM_VAL_MAX; i++)
        cons_w_u8(&w, 'v');
    cons_w_u8(&w, CONS_SNAP_END);
    cons_w_u64(&w, 0);
    cons_w_u64(&w, 1);
    CHECK_OK(w.err);
    CHECK(install(&sb, bad, w.len) < 0);
    /* The same stream with the largest value it holds installs. */
    struct kv_mem *d = kv_mem_create(4);
    struct cons_sm sd = kv_mem_sm(d);
    uint32_t vmax = KV_MEM_VAL_MAX;
    memcpy(bad + 17 + 4, &vmax, 4);
    memmove(bad + 17 + 8 + vmax, bad + 17 + 8 + vmax + 1, 17);
    CHECK_OK(install(&sd, bad, w.len - 1));
    CHECK_EQ_U64(kv_mem_count(d), 1);
    kv_mem_destroy(d);
    /* An abort, and a chunk without begin. */
    CHECK_OK(sb.ops->install_begin(sb.impl));
    CHECK_OK(sb.ops->install_chunk(sb.impl, a_buf, 17));
    sb.ops->install_abort(sb.impl);
    CHECK_ERR(sb.ops->install_chunk(sb.impl, a_buf, 17), FK_EINVAL);
    CHECK_ERR(sb.ops->install_commit(sb.impl), FK_EINVAL);
    CHECK_OK(cons_sm_save(&sb, after, sizeof after, &after_len));
    CHECK_EQ_U64(after_len, before_len);
    CHECK(memcmp(before, after, before_len) == 0);
    kv_mem_destroy(a);
    kv_mem_destroy(b);
    kv_mem_destroy(c);
}
CHECK_MAIN()
