/* kv_store.c: LMDB-backed replica state; see kv_store.h for the contract. */
#include "kv_store.h"

#include "fk_error.h"
#include "fk_log.h"

#include "fk_assert.h"
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The databases. Set k's data and clients are KV_DB_DATA + 2k and
 * KV_DB_CLIENTS + 2k (kv__dbi); set 0 keeps the names older environments
 * have. */
enum {
    KV_DB_LOG,
    KV_DB_META,
    KV_DB_DATA,
    KV_DB_CLIENTS,
    KV_DB_DATA1,
    KV_DB_CLIENTS1,
    KV_DB_UNDO,
    KV_DB_COUNT
};
static const char *const kv__db_names[KV_DB_COUNT] = {"log",    "meta",      "data", "clients",
                                                      "data.1", "clients.1", "undo"};
_Static_assert(KV_DB_DATA1 == KV_DB_DATA + 2 && KV_DB_CLIENTS1 == KV_DB_CLIENTS + 2,
               "set k's databases are set 0's plus 2k");

/* A view slot. Its transaction and cursors are allocated at the slot's
 * first open and kept (reset, renewed) afterwards: reading a view never
 * allocates. */
struct kv__view {
    MDB_txn *txn;                 /* NULL before the first open; reset while closed */
    MDB_cursor *cur[KV_DB_COUNT]; /* opened at first use, renewed at each open */
    uint8_t open;
    uint8_t set; /* the set live in this view's picture */
};

struct kv_store {
    MDB_env *env;
    MDB_dbi dbi[KV_DB_COUNT];
    MDB_txn *wtxn;                 /* the open write transaction, or NULL */
    MDB_txn *rtxn;                 /* a read transaction kept reset between reads */
    MDB_cursor *rcur[KV_DB_COUNT]; /* rtxn's scan cursors, renewed per scan */
    MDB_cursor *wcur[KV_DB_COUNT]; /* wtxn's, opened at first use; LMDB frees them */
    uint8_t live;                  /* the committed live set */
    uint8_t wlive;                 /* the live set in wtxn (a switch changes it) */
    uint64_t aborts;               /* write transactions that did not commit */
    struct kv__view views[KV_STORE_VIEWS_MAX];
    enum fk_durability durability;
    char mark[KV_STORE_PATH_MAX]; /* the boot mark's path (below) */
};

/* The index in s->dbi of database db in set `set` (only data and clients
 * have two). */
static int kv__idx(int db, uint8_t set)
{
    FK_ASSERT(set <= 1);
    return db == KV_DB_DATA || db == KV_DB_CLIENTS ? db + 2 * set : db;
}

static MDB_dbi kv__dbi(const struct kv_store *s, int db, uint8_t set)
{
    return s->dbi[kv__idx(db, set)];
}

/* The live set as txn sees it: the write transaction may have switched. */
static uint8_t kv__live(const struct kv_store *s, const MDB_txn *txn)
{
    return txn == s->wtxn ? s->wlive : s->live;
}

/* Maps an LMDB result to a flowkv code, logging what is not routine. */
static int kv__err(const char *what, int rc)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_NOTFOUND:
        return FK_ENOTFOUND;
    case MDB_MAP_FULL:
    case MDB_TXN_FULL:
        fk_warn("store", "%s: %s (raise the map size)", what, mdb_strerror(rc));
        return FK_EFULL;
    case MDB_BAD_VALSIZE:
        return FK_ETOOBIG;
    default:
        fk_error("store", "%s: %s", what, mdb_strerror(rc));
        return FK_ESTORAGE;
    }
}

/* A failed write poisons the LMDB transaction: drop it so that a commit of
 * half the changes is impossible. FK_ENOTFOUND leaves it usable. */
static int kv__write_failed(struct kv_store *s, const char *what, int rc)
{
    int e = kv__err(what, rc);
    if (e != FK_ENOTFOUND && e < 0)
        kv_write_abort(s);
    return e;
}

/* Reads KV_STORE_LIVE_KEY in txn: absent = set 0 (an environment from
 * before set 1 existed). */
static int kv__read_live(const struct kv_store *s, MDB_txn *txn, uint8_t *live)
{
    MDB_val k = {.mv_size = strlen(KV_STORE_LIVE_KEY), .mv_data = (void *)KV_STORE_LIVE_KEY}, v;
    int rc = mdb_get(txn, s->dbi[KV_DB_META], &k, &v);
    *live = 0;
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc != 0)
        return kv__err("read live set", rc);
    if (v.mv_size != 1 || *(const uint8_t *)v.mv_data > 1) {
        fk_error("store", "meta %s is corrupt (%zu bytes)", KV_STORE_LIVE_KEY, v.mv_size);
        return FK_EMALFORMED;
    }
    *live = *(const uint8_t *)v.mv_data;
    return 0;
}

static int kv__open_dbs(struct kv_store *s)
{
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc != 0)
        return kv__err("open: begin", rc);
    for (int i = 0; i < KV_DB_COUNT; i++) {
        unsigned flags = MDB_CREATE;
        if (i == KV_DB_LOG || i == KV_DB_CLIENTS || i == KV_DB_CLIENTS1 || i == KV_DB_UNDO)
            flags |= MDB_INTEGERKEY;
        rc = mdb_dbi_open(txn, kv__db_names[i], flags, &s->dbi[i]);
        if (rc != 0) {
            mdb_txn_abort(txn);
            return kv__err("open: dbi", rc);
        }
    }
    rc = kv__read_live(s, txn, &s->live);
    if (rc < 0) {
        mdb_txn_abort(txn);
        return rc;
    }
    s->wlive = s->live;
    rc = mdb_txn_commit(txn);
    if (rc != 0)
        return kv__err("open: commit", rc);
    rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &s->rtxn);
    if (rc != 0)
        return kv__err("open: read txn", rc);
    mdb_txn_reset(s->rtxn);
    return 0;
}

/* ---- the boot mark -------------------------------------------------------
 * Async durability writes through a writable map (MDB_WRITEMAP: commits copy
 * no pages, which was a third of Multi-Paxos' replica CPU in YCSB-B) and
 * never fsyncs. A killed process then loses nothing, since the page cache
 * holds every page, but after a machine crash the kernel may have written the
 * pages in any order: a meta page on disk may point at pages that never got
 * there (lmdb.h, MDB_NOSYNC and MDB_WRITEMAP). So a store open in async mode
 * carries KV_STORE_MARK holding the machine's boot id, removed once the store
 * closed cleanly (synced). A store opened in another boot while its mark is
 * still there is discarded: the replica starts empty and recovers from the
 * others, as after a lost disk, instead of reading pages that may be torn. */

static void kv__boot_id(char *buf, size_t cap)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    buf[0] = '\0';
    if (f != NULL) {
        if (fgets(buf, (int)cap, f) == NULL)
            buf[0] = '\0';
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = '\0';
}

/* Discards the environment in dir when its mark names another boot. */
static int kv__check_mark(const char *dir, const char *mark)
{
    char was[64] = "", now[64];
    FILE *f = fopen(mark, "r");
    if (f == NULL)
        return errno == ENOENT ? 0 : -errno;
    if (fgets(was, sizeof was, f) == NULL)
        was[0] = '\0';
    fclose(f);
    was[strcspn(was, "\n")] = '\0';
    kv__boot_id(now, sizeof now);
    if (strcmp(was, now) == 0)
        return 0; /* the process died, not the machine: the page cache kept it all */
    fk_warn("store",
            "%s was open in async durability when the machine went down (boot %s): "
            "discarding it; the replica recovers its state from the others",
            dir, was[0] ? was : "?");
    static const char *const files[] = {"data.mdb", "lock.mdb"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[KV_STORE_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            return -errno;
    }
    return unlink(mark) == 0 ? 0 : -errno;
}

/* Writes this boot's mark before the first async write can reach the disk. */
static int kv__write_mark(const char *mark)
{
    char id[64];
    kv__boot_id(id, sizeof id);
    int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0)
        return -errno;
    size_t n = strlen(id);
    int rc = write(fd, id, n) == (ssize_t)n && fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* Syncs the environment; once that worked, whatever async mode wrote is
 * whole on disk, a machine crash can no longer tear it, and the mark goes. */
static void kv__sync_unmark(struct kv_store *s)
{
    if (mdb_env_sync(s->env, 1) == 0)
        unlink(s->mark);
}

int kv_store_open(const struct kv_store_opts *opts, struct kv_store **out)
{
    if (opts == NULL || out == NULL || opts->dir == NULL || opts->dir[0] == '\0')
        return FK_EINVAL;
    if (strlen(opts->dir) + sizeof KV_STORE_MARK + 1 > KV_STORE_PATH_MAX)
        return FK_EINVAL;
    if (mkdir(opts->dir, 0750) != 0 && errno != EEXIST)
        return -errno;
    char mark[KV_STORE_PATH_MAX];
    snprintf(mark, sizeof mark, "%s/%s", opts->dir, KV_STORE_MARK);
    int rc = kv__check_mark(opts->dir, mark);
    if (rc == 0 && opts->durability == FK_DURABLE_ASYNC)
        rc = kv__write_mark(mark);
    if (rc < 0) {
        fk_error("store", "%s: %s: %s", opts->dir, KV_STORE_MARK, strerror(-rc));
        return rc;
    }
    struct kv_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return FK_ENOMEM;
    s->durability = opts->durability;
    snprintf(s->mark, sizeof s->mark, "%s", mark);
    rc = mdb_env_create(&s->env);
    if (rc != 0) {
        free(s);
        return kv__err("env_create", rc);
    }
    mdb_env_set_maxdbs(s->env, KV_DB_COUNT);
    mdb_env_set_mapsize(s->env, opts->map_size ? opts->map_size : KV_STORE_MAP_DEFAULT);
    /* MDB_NORDAHEAD (madvise MADV_RANDOM on the map): a B-tree of a
     * million records is read and written at random, and readahead on a
     * fault fills the page cache with large folios (ext4, Linux 6.16 on),
     * so that dirtying one 4 KiB page through the writable map dirtied a
     * whole folio. Loading a million YCSB default records, each async
     * replica wrote about 1 GB/s to disk for a few MB/s of data, dirty
     * pages reached the kernel's limit, the replica threads were throttled
     * in their page faults, and the load ran at 3.2k ops/s with leader
     * changes; with it, 15.4k ops/s and none (README, "Status"). */
    unsigned flags = MDB_NOTLS | MDB_NORDAHEAD;
    if (opts->durability == FK_DURABLE_ASYNC)
        flags |= MDB_NOSYNC | MDB_WRITEMAP; /* the boot mark above */
    rc = mdb_env_open(s->env, opts->dir, flags, 0640);
    if (rc == 0)
        rc = kv__open_dbs(s);
    else
        rc = rc > 0 ? -rc : kv__err("env_open", rc);
    if (rc < 0) {
        if (rc == FK_ESTORAGE || rc < -4096)
            fk_error("store", "cannot open LMDB environment in %s", opts->dir);
        if (s->rtxn)
            mdb_txn_abort(s->rtxn);
        mdb_env_close(s->env);
        free(s);
        return rc;
    }
    /* Sync mode after an async run that died in this boot. */
    if (opts->durability == FK_DURABLE_SYNC && access(mark, F_OK) == 0)
        kv__sync_unmark(s);
    *out = s;
    return 0;
}

void kv_store_close(struct kv_store *s)
{
    if (s == NULL)
        return;
    kv_write_abort(s);
    for (uint32_t i = 0; i < KV_STORE_VIEWS_MAX; i++) {
        struct kv__view *v = &s->views[i];
        for (int db = 0; db < KV_DB_COUNT; db++)
            if (v->cur[db] != NULL)
                mdb_cursor_close(v->cur[db]);
        if (v->txn != NULL)
            mdb_txn_abort(v->txn); /* frees a reset handle and its reader slot too */
    }
    for (int db = 0; db < KV_DB_COUNT; db++)
        if (s->rcur[db] != NULL)
            mdb_cursor_close(s->rcur[db]);
    mdb_txn_abort(s->rtxn);
    kv__sync_unmark(s);
    mdb_env_close(s->env);
    free(s);
}

int kv_store_sync(struct kv_store *s)
{
    return kv__err("sync", mdb_env_sync(s->env, 1));
}

int kv_write_begin(struct kv_store *s)
{
    if (s->wtxn != NULL)
        return FK_EBUSY;
    s->wlive = s->live;
    return kv__err("write begin", mdb_txn_begin(s->env, NULL, 0, &s->wtxn));
}

/* The write transaction ended: LMDB freed its cursors; a switch in it
 * holds only if it committed. */
static void kv__write_ended(struct kv_store *s, int committed)
{
    s->wtxn = NULL;
    memset(s->wcur, 0, sizeof s->wcur);
    if (committed)
        s->live = s->wlive;
    else
        s->aborts++;
    s->wlive = s->live;
}

int kv_write_commit(struct kv_store *s)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    /* mdb_txn_commit frees the transaction whether or not it succeeds. */
    int rc = mdb_txn_commit(s->wtxn);
    kv__write_ended(s, rc == 0);
    return kv__err("commit", rc);
}

void kv_write_abort(struct kv_store *s)
{
    if (s->wtxn != NULL) {
        mdb_txn_abort(s->wtxn);
        kv__write_ended(s, 0);
    }
}

uint64_t kv_write_aborts(const struct kv_store *s)
{
    return s->aborts;
}

/* Puts into database db of set `set` (ignored but for data and clients). */
static int kv__put(struct kv_store *s, int db, uint8_t set, MDB_val *k, const void *val, size_t len,
                   unsigned flags, const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    MDB_val v = {.mv_size = len, .mv_data = (void *)val};
    int rc = mdb_put(s->wtxn, kv__dbi(s, db, set), k, &v, flags);
    if (rc == MDB_KEYEXIST && (flags & MDB_APPEND))
        return FK_EINVAL; /* out of order: LMDB wrote nothing, the transaction goes on */
    return rc ? kv__write_failed(s, what, rc) : 0;
}

int kv_log_put(struct kv_store *s, uint64_t index, const void *entry, size_t len)
{
    MDB_val k = {.mv_size = sizeof index, .mv_data = &index};
    return kv__put(s, KV_DB_LOG, 0, &k, entry, len, 0, "log put");
}

int kv_meta_put(struct kv_store *s, const char *name, const void *val, size_t len)
{
    if (name == NULL || name[0] == '\0' || strlen(name) > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = strlen(name), .mv_data = (void *)name};
    return kv__put(s, KV_DB_META, 0, &k, val, len, 0, "meta put");
}

static int kv__key_check(const void *key, size_t klen)
{
    if (key == NULL || klen == 0 || klen > KV_STORE_KEY_MAX)
        return klen > KV_STORE_KEY_MAX ? FK_ETOOBIG : FK_EINVAL;
    return 0;
}

/* A cursor on database i (an index into s->dbi) in txn, the write
 * transaction or the kept read one, opened once and then reused: the read
 * transaction's is renewed for each read, the write transaction's lives
 * until it ends (kv__write_ended). Returns an LMDB code. */
static int kv__cursor(struct kv_store *s, MDB_txn *txn, int i, MDB_cursor **c)
{
    FK_ASSERT(txn == s->wtxn || txn == s->rtxn);
    MDB_cursor **slot = txn == s->wtxn ? &s->wcur[i] : &s->rcur[i];
    int rc = 0;
    if (*slot == NULL) {
        rc = mdb_cursor_open(txn, s->dbi[i], slot);
        if (rc != 0)
            *slot = NULL;
    } else if (txn == s->rtxn) {
        rc = mdb_cursor_renew(txn, *slot);
    }
    *c = *slot;
    return rc;
}

/* Puts through the write transaction's data cursor: the machine reads a
 * key's current value (kv_data_get, for the quota and the undo record)
 * just before it writes it, and that read left the cursor on the key's
 * leaf, so LMDB's cursor put finds the page without a second descent from
 * the root (mdb_cursor_set checks the cursor's page first). At a million
 * records the two descents were 9% of a follower's CPU each. */
int kv_data_put(struct kv_store *s, const void *key, size_t klen, const void *val, size_t vlen)
{
    int rc = kv__key_check(key, klen);
    if (rc < 0)
        return rc;
    if (s->wtxn == NULL)
        return FK_EINVAL;
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    MDB_val v = {.mv_size = vlen, .mv_data = (void *)val};
    MDB_cursor *c;
    rc = kv__cursor(s, s->wtxn, kv__idx(KV_DB_DATA, s->wlive), &c);
    if (rc == 0)
        rc = mdb_cursor_put(c, &k, &v, 0);
    return rc ? kv__write_failed(s, "data put", rc) : 0;
}

int kv_client_put(struct kv_store *s, uint64_t client_id, const void *rec, size_t len)
{
    MDB_val k = {.mv_size = sizeof client_id, .mv_data = &client_id};
    return kv__put(s, KV_DB_CLIENTS, s->wlive, &k, rec, len, 0, "client put");
}

static int kv__del(struct kv_store *s, int db, MDB_val *k, const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    int rc = mdb_del(s->wtxn, kv__dbi(s, db, s->wlive), k, NULL);
    return rc ? kv__write_failed(s, what, rc) : 0;
}

int kv_data_del(struct kv_store *s, const void *key, size_t klen)
{
    if (key == NULL || klen == 0 || klen > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    return kv__del(s, KV_DB_DATA, &k, "data del");
}

int kv_client_del(struct kv_store *s, uint64_t client_id)
{
    MDB_val k = {.mv_size = sizeof client_id, .mv_data = &client_id};
    return kv__del(s, KV_DB_CLIENTS, &k, "client del");
}

static int kv__drop(struct kv_store *s, int db, uint8_t set, const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    int rc = mdb_drop(s->wtxn, kv__dbi(s, db, set), 0);
    return rc ? kv__write_failed(s, what, rc) : 0;
}

int kv_data_clear(struct kv_store *s)
{
    return kv__drop(s, KV_DB_DATA, s->wlive, "data clear");
}

int kv_client_clear(struct kv_store *s)
{
    return kv__drop(s, KV_DB_CLIENTS, s->wlive, "client clear");
}

/* ---- staging ------------------------------------------------------------
 * The staging set is the one not live in the write transaction. Staged
 * records are appended in order, so a large install fills pages left to
 * right (MDB_APPEND) instead of splitting them. */

int kv_stage_clear(struct kv_store *s)
{
    int rc = kv__drop(s, KV_DB_DATA, (uint8_t)!s->wlive, "stage clear");
    return rc < 0 ? rc : kv__drop(s, KV_DB_CLIENTS, (uint8_t)!s->wlive, "stage clear");
}

int kv_stage_data_put(struct kv_store *s, const void *key, size_t klen, const void *val,
                      size_t vlen)
{
    int rc = kv__key_check(key, klen);
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    return rc < 0 ? rc
                  : kv__put(s, KV_DB_DATA, (uint8_t)!s->wlive, &k, val, vlen, MDB_APPEND,
                            "stage data put");
}

int kv_stage_client_put(struct kv_store *s, uint64_t client_id, const void *rec, size_t len)
{
    MDB_val k = {.mv_size = sizeof client_id, .mv_data = &client_id};
    return kv__put(s, KV_DB_CLIENTS, (uint8_t)!s->wlive, &k, rec, len, MDB_APPEND,
                   "stage client put");
}

/* The flip and the emptying of the old set share the transaction, so a
 * crash commits both or neither. Emptying now, not at the next install,
 * gives the old set's pages back as soon as no view reads them. */
int kv_stage_switch(struct kv_store *s)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    uint8_t old = s->wlive, now = (uint8_t)!old;
    MDB_val k = {.mv_size = strlen(KV_STORE_LIVE_KEY), .mv_data = (void *)KV_STORE_LIVE_KEY};
    int rc = kv__put(s, KV_DB_META, 0, &k, &now, 1, 0, "stage switch");
    if (rc == 0)
        rc = kv__drop(s, KV_DB_DATA, old, "stage switch");
    if (rc == 0)
        rc = kv__drop(s, KV_DB_CLIENTS, old, "stage switch");
    if (rc == 0)
        s->wlive = now; /* kv__write_ended makes it s->live at the commit */
    return rc;
}

/* Deletes log entries from the cursor position on while the key is below
 * `below` (or to the end when below is UINT64_MAX). Each step deletes one
 * entry, so the loop is bounded by the log's size. */
static int kv__log_delete_from(struct kv_store *s, MDB_cursor *c, MDB_cursor_op first,
                               uint64_t from, uint64_t below)
{
    MDB_val k = {.mv_size = sizeof from, .mv_data = &from}, v;
    int rc = mdb_cursor_get(c, &k, &v, first);
    while (rc == 0) {
        uint64_t idx;
        memcpy(&idx, k.mv_data, sizeof idx);
        if (idx >= below)
            break;
        rc = mdb_cursor_del(c, 0);
        if (rc == 0)
            rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
        if (rc == EINVAL || rc == MDB_NOTFOUND) /* deleted the last entry */
            break;
    }
    return rc == MDB_NOTFOUND || rc == EINVAL ? 0 : rc;
}

static int kv__range_delete(struct kv_store *s, int db, MDB_cursor_op first, uint64_t from,
                            uint64_t below, const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    MDB_cursor *c;
    int rc = kv__cursor(s, s->wtxn, db, &c);
    if (rc == 0)
        rc = kv__log_delete_from(s, c, first, from, below);
    return rc ? kv__write_failed(s, what, rc) : 0;
}

static int kv__log_delete(struct kv_store *s, MDB_cursor_op first, uint64_t from, uint64_t below,
                          const char *what)
{
    return kv__range_delete(s, KV_DB_LOG, first, from, below, what);
}

int kv_log_trim(struct kv_store *s, uint64_t below)
{
    return kv__log_delete(s, MDB_FIRST, 0, below, "log trim");
}

int kv_log_truncate(struct kv_store *s, uint64_t from)
{
    return kv__log_delete(s, MDB_SET_RANGE, from, UINT64_MAX, "log truncate");
}

int kv_undo_put(struct kv_store *s, uint64_t key, const void *rec, size_t len)
{
    MDB_val k = {.mv_size = sizeof key, .mv_data = &key};
    return kv__put(s, KV_DB_UNDO, 0, &k, rec, len, 0, "undo put");
}

int kv_undo_del(struct kv_store *s, uint64_t lo, uint64_t hi)
{
    /* Keys are log slots: UINT64_MAX is never one. */
    uint64_t below = hi == UINT64_MAX ? UINT64_MAX : hi + 1;
    return kv__range_delete(s, KV_DB_UNDO, MDB_SET_RANGE, lo, below, "undo del");
}

/* --- reads ------------------------------------------------------------- */

/* The transaction reads go through: the open write transaction (read your
 * own writes) or the kept read transaction, renewed for this read. */
static int kv__read_begin(struct kv_store *s, MDB_txn **txn)
{
    if (s->wtxn != NULL) {
        *txn = s->wtxn;
        return 0;
    }
    int rc = mdb_txn_renew(s->rtxn);
    if (rc != 0)
        return kv__err("read renew", rc);
    *txn = s->rtxn;
    return 0;
}

static void kv__read_end(struct kv_store *s, MDB_txn *txn)
{
    if (txn == s->rtxn)
        mdb_txn_reset(s->rtxn);
}

/* Copies a value found by a get out to the caller's buffer: FK_ETOOBIG
 * when it does not fit (*len says how large it is). */
static int kv__copy_out(const MDB_val *v, void *buf, size_t cap, size_t *len)
{
    *len = v->mv_size;
    if (v->mv_size > cap)
        return FK_ETOOBIG;
    if (v->mv_size > 0)
        memcpy(buf, v->mv_data, v->mv_size);
    return 0;
}

static int kv__get(struct kv_store *s, int db, MDB_val *k, void *buf, size_t cap, size_t *len)
{
    MDB_txn *txn = NULL;
    MDB_val v;
    int rc = kv__read_begin(s, &txn);
    if (rc < 0)
        return rc;
    rc = kv__err("get", mdb_get(txn, kv__dbi(s, db, kv__live(s, txn)), k, &v));
    if (rc == 0)
        rc = kv__copy_out(&v, buf, cap, len);
    kv__read_end(s, txn);
    return rc;
}

int kv_log_get(struct kv_store *s, uint64_t index, void *buf, size_t cap, size_t *len)
{
    MDB_val k = {.mv_size = sizeof index, .mv_data = &index};
    return kv__get(s, KV_DB_LOG, &k, buf, cap, len);
}

int kv_meta_get(struct kv_store *s, const char *name, void *buf, size_t cap, size_t *len)
{
    if (name == NULL || name[0] == '\0' || strlen(name) > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = strlen(name), .mv_data = (void *)name};
    return kv__get(s, KV_DB_META, &k, buf, cap, len);
}

/* In the write transaction, a get through its data cursor positioned
 * with MDB_SET_RANGE, so that it stays on the leaf where the key is or
 * would go even when the key is absent (MDB_SET leaves an unpositioned
 * cursor there): the put that follows starts from it (kv_data_put). */
static int kv__data_get_w(struct kv_store *s, MDB_val *k, void *buf, size_t cap, size_t *len)
{
    MDB_cursor *c;
    MDB_val at = *k, v;
    int rc = kv__cursor(s, s->wtxn, kv__idx(KV_DB_DATA, s->wlive), &c);
    if (rc == 0)
        rc = mdb_cursor_get(c, &at, &v, MDB_SET_RANGE);
    if (rc == 0 && (at.mv_size != k->mv_size || memcmp(at.mv_data, k->mv_data, k->mv_size) != 0))
        rc = MDB_NOTFOUND;
    rc = kv__err("get", rc);
    return rc == 0 ? kv__copy_out(&v, buf, cap, len) : rc;
}

int kv_data_get(struct kv_store *s, const void *key, size_t klen, void *buf, size_t cap,
                size_t *len)
{
    int rc = kv__key_check(key, klen);
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    if (rc < 0)
        return rc;
    return s->wtxn != NULL ? kv__data_get_w(s, &k, buf, cap, len)
                           : kv__get(s, KV_DB_DATA, &k, buf, cap, len);
}

int kv_client_get(struct kv_store *s, uint64_t client_id, void *buf, size_t cap, size_t *len)
{
    MDB_val k = {.mv_size = sizeof client_id, .mv_data = &client_id};
    return kv__get(s, KV_DB_CLIENTS, &k, buf, cap, len);
}

int kv_log_bounds(struct kv_store *s, uint64_t *first, uint64_t *last)
{
    MDB_txn *txn = NULL;
    MDB_cursor *c;
    MDB_val k, v;
    int rc = kv__read_begin(s, &txn);
    if (rc < 0)
        return rc;
    rc = kv__cursor(s, txn, KV_DB_LOG, &c);
    if (rc == 0)
        rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
    if (rc == 0)
        memcpy(first, k.mv_data, sizeof *first);
    if (rc == 0)
        rc = mdb_cursor_get(c, &k, &v, MDB_LAST);
    if (rc == 0)
        memcpy(last, k.mv_data, sizeof *last);
    kv__read_end(s, txn);
    return kv__err("log bounds", rc);
}

/* Walks c from start (inclusive, or exclusive with `after`; NULL: the
 * first record), calling fn on at most max records until it returns
 * nonzero. Returns the number visited, fn's negative return, or an error.
 * Bounded by max and by the database's size. */
static int kv__walk(MDB_cursor *c, const MDB_val *start, int after, uint32_t max, kv_visit_fn fn,
                    void *arg)
{
    MDB_val k = {0}, v;
    if (start != NULL)
        k = *start;
    int rc = mdb_cursor_get(c, &k, &v, start != NULL ? MDB_SET_RANGE : MDB_FIRST);
    if (rc == 0 && after && start != NULL && k.mv_size == start->mv_size &&
        memcmp(k.mv_data, start->mv_data, k.mv_size) == 0)
        rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    int visited = 0, stop = 0;
    while (rc == 0 && (uint32_t)visited < max && stop == 0) {
        stop = fn(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
        visited++;
        if (stop == 0)
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    }
    if (stop < 0)
        return stop;
    if (rc != 0 && rc != MDB_NOTFOUND)
        return kv__err("scan", rc);
    return visited;
}

/* Walks database db of the live set from a start position (inclusive). */
static int kv__scan(struct kv_store *s, int db, const MDB_val *start, uint32_t max, kv_visit_fn fn,
                    void *arg)
{
    MDB_txn *txn = NULL;
    MDB_cursor *c;
    int rc = kv__read_begin(s, &txn);
    if (rc < 0)
        return rc;
    rc = kv__cursor(s, txn, kv__idx(db, kv__live(s, txn)), &c);
    rc = rc ? kv__err("scan", rc) : kv__walk(c, start, 0, max, fn, arg);
    kv__read_end(s, txn);
    return rc;
}

int kv_data_scan(struct kv_store *s, const void *start, size_t slen, uint32_t max, kv_visit_fn fn,
                 void *arg)
{
    if (fn == NULL || slen > KV_STORE_KEY_MAX || (start == NULL && slen != 0))
        return FK_EINVAL;
    MDB_val k = {.mv_size = slen, .mv_data = (void *)start};
    /* An empty start key means "from the first key". */
    return kv__scan(s, KV_DB_DATA, slen ? &k : NULL, max, fn, arg);
}

int kv_undo_scan(struct kv_store *s, kv_visit_fn fn, void *arg)
{
    if (fn == NULL)
        return FK_EINVAL;
    return kv__scan(s, KV_DB_UNDO, NULL, UINT32_MAX, fn, arg);
}

int kv_client_scan(struct kv_store *s, kv_visit_fn fn, void *arg)
{
    if (fn == NULL)
        return FK_EINVAL;
    return kv__scan(s, KV_DB_CLIENTS, NULL, UINT32_MAX, fn, arg);
}

int kv_store_stats(struct kv_store *s, struct kv_store_stats *st)
{
    MDB_txn *txn = NULL;
    MDB_stat ms[KV_DB_COUNT], es;
    MDB_envinfo info;
    int rc = kv__read_begin(s, &txn);
    if (rc < 0)
        return rc;
    uint8_t live = kv__live(s, txn);
    static const int dbs[] = {KV_DB_LOG, KV_DB_DATA, KV_DB_CLIENTS};
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0] && rc == 0; i++)
        rc = mdb_stat(txn, kv__dbi(s, dbs[i], live), &ms[dbs[i]]);
    kv__read_end(s, txn);
    if (rc == 0)
        rc = mdb_env_stat(s->env, &es);
    if (rc == 0)
        rc = mdb_env_info(s->env, &info);
    if (rc != 0)
        return kv__err("stats", rc);
    st->data_entries = ms[KV_DB_DATA].ms_entries;
    st->log_entries = ms[KV_DB_LOG].ms_entries;
    st->client_entries = ms[KV_DB_CLIENTS].ms_entries;
    st->map_size = info.me_mapsize;
    st->map_used = (uint64_t)(info.me_last_pgno + 1) * es.ms_psize;
    return 0;
}

/* ---- views ---------------------------------------------------------------
 * A slot's read transaction is begun once and then reset and renewed (the
 * env is MDB_NOTLS, so one thread may hold all of them beside its write
 * transaction); its cursors are renewed with it. */

/* The open view in slot, or NULL. */
static struct kv__view *kv__view(struct kv_store *s, uint32_t slot)
{
    if (s == NULL || slot >= KV_STORE_VIEWS_MAX || !s->views[slot].open)
        return NULL;
    return &s->views[slot];
}

int kv_view_open(struct kv_store *s, uint32_t slot)
{
    if (s == NULL || slot >= KV_STORE_VIEWS_MAX)
        return FK_EINVAL;
    kv_view_close(s, slot);
    struct kv__view *v = &s->views[slot];
    int rc =
        v->txn == NULL ? mdb_txn_begin(s->env, NULL, MDB_RDONLY, &v->txn) : mdb_txn_renew(v->txn);
    if (rc != 0) /* a failed begin leaves v->txn NULL, a failed renew the handle reset */
        return kv__err("view open", rc);
    for (int i = 0; i < KV_DB_COUNT && rc == 0; i++)
        if (v->cur[i] != NULL)
            rc = mdb_cursor_renew(v->txn, v->cur[i]);
    int e = rc ? kv__err("view open: cursor", rc) : kv__read_live(s, v->txn, &v->set);
    if (e < 0) {
        mdb_txn_reset(v->txn);
        return e;
    }
    v->open = 1;
    return 0;
}

void kv_view_close(struct kv_store *s, uint32_t slot)
{
    struct kv__view *v = kv__view(s, slot);
    if (v != NULL) {
        mdb_txn_reset(v->txn); /* keeps the handle and cursors for the next open */
        v->open = 0;
    }
}

/* The view's cursor on database i (an index into s->dbi). */
static int kv__view_cursor(struct kv_store *s, struct kv__view *v, int i, MDB_cursor **c)
{
    if (v->cur[i] == NULL) {
        int rc = mdb_cursor_open(v->txn, s->dbi[i], &v->cur[i]);
        if (rc != 0) {
            v->cur[i] = NULL;
            return kv__err("view cursor", rc);
        }
    }
    *c = v->cur[i];
    return 0;
}

int kv_view_meta_get(struct kv_store *s, uint32_t slot, const char *name, void *buf, size_t cap,
                     size_t *len)
{
    struct kv__view *v = kv__view(s, slot);
    if (v == NULL || name == NULL || name[0] == '\0' || strlen(name) > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = strlen(name), .mv_data = (void *)name}, val;
    int rc = kv__err("view get", mdb_get(v->txn, s->dbi[KV_DB_META], &k, &val));
    if (rc < 0)
        return rc;
    *len = val.mv_size;
    if (val.mv_size > cap)
        return FK_ETOOBIG;
    if (val.mv_size > 0)
        memcpy(buf, val.mv_data, val.mv_size);
    return 0;
}

int kv_view_counts(struct kv_store *s, uint32_t slot, uint64_t *pairs, uint64_t *clients)
{
    struct kv__view *v = kv__view(s, slot);
    if (v == NULL)
        return FK_EINVAL;
    MDB_stat d, c;
    int rc = mdb_stat(v->txn, kv__dbi(s, KV_DB_DATA, v->set), &d);
    if (rc == 0)
        rc = mdb_stat(v->txn, kv__dbi(s, KV_DB_CLIENTS, v->set), &c);
    if (rc != 0)
        return kv__err("view counts", rc);
    *pairs = d.ms_entries;
    *clients = c.ms_entries;
    return 0;
}

static int kv__view_scan(struct kv_store *s, uint32_t slot, int db, const MDB_val *after,
                         kv_visit_fn fn, void *arg)
{
    struct kv__view *v = kv__view(s, slot);
    MDB_cursor *c = NULL;
    if (v == NULL || fn == NULL)
        return FK_EINVAL;
    int rc = kv__view_cursor(s, v, kv__idx(db, v->set), &c);
    return rc < 0 ? rc : kv__walk(c, after, 1, UINT32_MAX, fn, arg);
}

int kv_view_data_scan(struct kv_store *s, uint32_t slot, const void *after, size_t alen,
                      kv_visit_fn fn, void *arg)
{
    if ((after == NULL) != (alen == 0) || alen > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = alen, .mv_data = (void *)after};
    return kv__view_scan(s, slot, KV_DB_DATA, after ? &k : NULL, fn, arg);
}

int kv_view_client_scan(struct kv_store *s, uint32_t slot, const uint64_t *after, kv_visit_fn fn,
                        void *arg)
{
    MDB_val k = {.mv_size = sizeof *after, .mv_data = (void *)after};
    return kv__view_scan(s, slot, KV_DB_CLIENTS, after ? &k : NULL, fn, arg);
}
