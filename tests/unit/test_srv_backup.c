/* test_srv_backup.c: a replica serves a backup as its state stream (one
 * view, chunks in order, a lost reply answered again, held views, one
 * backup at a time, idle views closed), and a restore installs a backup's
 * pairs only, atomically, refusing a damaged file (server/srv_backup.h). */
#include "check.h"
#include "cons.h"
#include "cons_core.h"
#include "fk_error.h"
#include "fk_snapfile.h"
#include "fkc_proto.h"
#include "kv.h"
#include "kv_sm.h"
#include "kv_store.h"
#include "srv_backup.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint8_t rep_data[CONS_REPLY_MAX];
static struct cons_reply rep = {.data = rep_data, .cap = CONS_REPLY_MAX};

static void put(struct cons_sm *sm, int i, size_t vlen)
{
    static struct cons_op op;
    static char v[4096];
    char k[16];
    snprintf(k, sizeof k, "key%05d", i);
    memset(v, 'a' + i % 26, vlen);
    cons_op_init(&op, CONS_OP_PUT, k, (uint32_t)strlen(k), v, (uint32_t)vlen, NULL, 0);
    op.client_id = 1;
    op.req_no = 1;
    CHECK_OK(sm->ops->apply(sm->impl, &op, &rep));
    CHECK_EQ_I64(rep.status, 0);
}

/* 1,000 pairs of 200-byte values (about 215 KB: four chunks), two
 * sessions, mark 42. */
static void fill(struct cons_sm *sm)
{
    for (int i = 0; i < 1000; i++)
        put(sm, i, 200);
    for (uint64_t c = 1; c <= 2; c++) {
        struct cons_session s = {.client_id = 100 * c, .req_no = 3, .stamp = c};
        CHECK_OK(sm->ops->session(sm->impl, &s));
    }
    CHECK_OK(sm->ops->mark(sm->impl, 42, 2));
}

static struct cons_core_status st = {.role = CONS_ROLE_FOLLOWER, .term = 1, .commit = 42};

/* One request; returns the reply's status, its header in *r and the chunk
 * in chunk/clen. */
static int ask(struct srv_backup *b, uint8_t op, uint64_t nonce, uint32_t seq, uint64_t min,
               uint64_t now, struct fkc_snap_reply *r, const uint8_t **chunk, size_t *clen)
{
    struct fkc_snap_req q = {.op = op, .seq = seq, .nonce = nonce, .min_index = min};
    const uint8_t *out;
    size_t len;
    srv_backup_on_request(b, (const uint8_t *)&q, sizeof q, &st, now, &out, &len);
    CHECK(len >= sizeof *r);
    memcpy(r, out, sizeof *r);
    *chunk = out + sizeof *r;
    *clen = len - sizeof *r;
    CHECK_EQ_U64(r->nonce, nonce);
    CHECK_EQ_U64(r->seq, seq);
    return r->status;
}

static uint8_t whole[4 << 20], got[4 << 20];

TEST(backup_streams_one_view_in_chunks)
{
    struct kv_mem *kv = kv_mem_create(2000);
    struct cons_sm sm = kv_mem_sm(kv);
    fill(&sm);
    size_t wlen, glen = 0, clen;
    CHECK_OK(cons_sm_save(&sm, whole, sizeof whole, &wlen));
    struct srv_backup b;
    CHECK_OK(srv_backup_init(&b, sm, 1, CONS_PROTO_MPX));
    struct fkc_snap_reply r;
    const uint8_t *chunk;
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 42, 0, &r, &chunk, &clen), 0);
    CHECK_EQ_U64(r.index, 42);
    CHECK_EQ_U64(r.replica, 1);
    /* Another client waits; the view does not see later writes (MVCC). */
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 8, 0, 0, 1, &r, &chunk, &clen), FK_EBUSY);
    put(&sm, 5000, 10);
    uint32_t seq = 0;
    for (r.last = 0; !r.last && seq < 100; seq++) {
        CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, seq, 0, 2, &r, &chunk, &clen), 0);
        CHECK(clen > 0 && clen <= FKC_SNAP_CHUNK_MAX);
        memcpy(got + glen, chunk, clen);
        /* The same chunk again (a lost reply): the same bytes. */
        CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, seq, 0, 2, &r, &chunk, &clen), 0);
        CHECK(memcmp(got + glen, chunk, clen) == 0);
        glen += clen;
    }
    CHECK(seq >= 3);
    CHECK_EQ_U64(glen, wlen);
    CHECK(memcmp(got, whole, wlen) == 0);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, seq + 3, 0, 2, &r, &chunk, &clen), FK_EINVAL);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 9, 0, 0, 2, &r, &chunk, &clen), FK_ECLOSED);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_CLOSE, 7, 0, 0, 3, &r, &chunk, &clen), 0);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, 0, 0, 3, &r, &chunk, &clen), FK_ECLOSED);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 8, 0, 0, 4, &r, &chunk, &clen), 0);
    /* A request of the wrong size is refused. */
    const uint8_t *out;
    size_t len;
    srv_backup_on_request(&b, whole, 5, &st, 5, &out, &len);
    memcpy(&r, out, sizeof r);
    CHECK_EQ_I64(r.status, FK_EINVAL);
    srv_backup_free(&b);
    kv_mem_destroy(kv);
}

TEST(backup_holds_a_view_above_the_commit_point)
{
    struct kv_mem *kv = kv_mem_create(2000);
    struct cons_sm sm = kv_mem_sm(kv);
    fill(&sm);
    CHECK_OK(sm.ops->mark(sm.impl, 50, 2)); /* executed past commit 42 (a NOPaxos leader) */
    struct srv_backup b;
    CHECK_OK(srv_backup_init(&b, sm, 0, CONS_PROTO_NOP));
    struct fkc_snap_reply r;
    const uint8_t *chunk;
    size_t clen;
    /* Not applied as far as the client needs: ask again. */
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 60, 0, &r, &chunk, &clen), FK_EAGAIN);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 50, 0, &r, &chunk, &clen), 0);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, 0, 0, 1, &r, &chunk, &clen), FK_EAGAIN);
    st.commit = 50; /* committed in the same term: served */
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, 0, 0, 2, &r, &chunk, &clen), 0);
    CHECK(clen > 0);
    /* Held, and the term changes first: dropped. */
    st.commit = 42;
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 9, 0, 0, 3, &r, &chunk, &clen), FK_EBUSY);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 0, 3, &r, &chunk, &clen), 0);
    st.term = 2;
    st.commit = 60;
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, 0, 0, 4, &r, &chunk, &clen), FK_ECLOSED);
    /* A replica changing view or recovering serves no backup. */
    st.role = CONS_ROLE_VIEW_CHANGE;
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 0, 5, &r, &chunk, &clen), FK_EAGAIN);
    st.role = CONS_ROLE_RECOVERING;
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 0, 5, &r, &chunk, &clen), FK_EAGAIN);
    st.role = CONS_ROLE_LEADER;
    /* An idle view is closed; then another client may open one. */
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 7, 0, 0, 10, &r, &chunk, &clen), 0);
    srv_backup_tick(&b, 10 + FKC_SNAP_IDLE_NS / 2);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 9, 0, 0, 11, &r, &chunk, &clen), FK_EBUSY);
    srv_backup_tick(&b, 12 + FKC_SNAP_IDLE_NS);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_READ, 7, 0, 0, 13, &r, &chunk, &clen), FK_ECLOSED);
    CHECK_EQ_I64(ask(&b, FKC_SNAP_OPEN, 9, 0, 0, 14, &r, &chunk, &clen), 0);
    st = (struct cons_core_status){.role = CONS_ROLE_FOLLOWER, .term = 1, .commit = 42};
    srv_backup_free(&b);
    kv_mem_destroy(kv);
}

/* ---- restore into LMDB ---------------------------------------------------------------- */

static char dir[64], file[64];
static struct kv_store *store;
static struct kv_sm ksm;

/* A store in a fresh directory; quota 0: the default. */
static void open_store(uint64_t quota)
{
    snprintf(dir, sizeof dir, "/tmp/fkbkXXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    struct kv_store_opts o = {.dir = dir, .durability = FK_DURABLE_ASYNC};
    CHECK_OK(kv_store_open(&o, &store));
    CHECK_OK(kv_sm_init(&ksm, store, quota));
}

static void close_store(void)
{
    kv_store_close(store);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* A backup file of kv_mem's state, in chunks of about 16 KiB. */
static void save_file(struct cons_sm *sm)
{
    size_t len, clen;
    CHECK_OK(cons_sm_save(sm, whole, sizeof whole, &len));
    strcpy(file, "/tmp/fkbkfile.XXXXXX");
    int fd = mkstemp(file);
    CHECK(fd >= 0);
    struct fk_snapfile_w w;
    struct fk_snapfile_info info = {.replica = 0, .index = 42};
    CHECK_OK(fk_snapfile_begin(&w, fd, &info));
    struct cons_snap_rec r;
    for (size_t off = 0, start = 0; off < len; start = off) {
        while (off < len && off - start < (16u << 10))
            CHECK_EQ_I64(cons_snap_next(whole, len, &off, &r), 1);
        clen = off - start;
        CHECK_OK(fk_snapfile_add(&w, whole + start, clen));
    }
    CHECK_OK(fk_snapfile_finish(&w, &info));
    close(fd);
}

TEST(restore_installs_the_pairs_alone)
{
    struct kv_mem *kv = kv_mem_create(2000);
    struct cons_sm sm = kv_mem_sm(kv);
    fill(&sm);
    save_file(&sm);
    size_t want, have;
    CHECK_OK(cons_sm_pairs(&sm, whole, sizeof whole, &want));
    CHECK(want > 1000 * 200); /* every pair, each more than its value */
    memcpy(got, whole, want);

    open_store(0);
    struct cons_sm ls = kv_sm_cons(&ksm);
    /* A damaged copy is refused before anything is installed. */
    char bad[80], cmd[320], err[256];
    snprintf(bad, sizeof bad, "%s.bad", file);
    snprintf(cmd, sizeof cmd,
             "cp %s %s && printf 'Z' | dd of=%s bs=1 seek=20000 conv=notrunc status=none", file,
             bad, bad);
    CHECK(system(cmd) == 0);
    struct srv_backup_restored out;
    CHECK_ERR(srv_backup_restore(store, ls, bad, &out, err, sizeof err), FK_EMALFORMED);
    CHECK(strstr(err, "checksum mismatch") != NULL);
    CHECK_OK(cons_sm_pairs(&ls, whole, sizeof whole, &have));
    CHECK_EQ_U64(have, 0);
    CHECK_ERR(srv_backup_restore(store, ls, "/nonexistent/x", &out, err, sizeof err), -2);

    CHECK_OK(srv_backup_restore(store, ls, file, &out, err, sizeof err));
    CHECK_EQ_U64(out.pairs, 1000);
    CHECK_EQ_U64(out.sessions_dropped, 2);
    CHECK_EQ_U64(out.file.index, 42);
    CHECK_OK(cons_sm_pairs(&ls, whole, sizeof whole, &have));
    CHECK_EQ_U64(have, want);
    CHECK(memcmp(whole, got, want) == 0);
    /* A new cluster: mark 0, no sessions. */
    struct cons_ctab t;
    CHECK_OK(cons_ctab_init(&t, 16));
    uint64_t applied = 99;
    CHECK_OK(cons_sm_load(&ls, &t, &applied));
    CHECK_EQ_U64(applied, 0);
    CHECK_EQ_U64(t.used, 0);
    cons_ctab_free(&t);
    close_store();
    unlink(file);
    unlink(bad);
    kv_mem_destroy(kv);
}

TEST(restore_refuses_more_than_the_quota)
{
    struct kv_mem *kv = kv_mem_create(2000);
    struct cons_sm sm = kv_mem_sm(kv);
    fill(&sm);
    save_file(&sm);
    open_store(100000); /* the data is about 215 KB */
    struct cons_sm ls = kv_sm_cons(&ksm);
    struct srv_backup_restored out;
    char err[256];
    size_t have;
    CHECK_ERR(srv_backup_restore(store, ls, file, &out, err, sizeof err), FK_EFULL);
    CHECK(strstr(err, "quota") != NULL);
    CHECK_OK(cons_sm_pairs(&ls, whole, sizeof whole, &have));
    CHECK_EQ_U64(have, 0);
    close_store();
    unlink(file);
    kv_mem_destroy(kv);
}

CHECK_MAIN()
