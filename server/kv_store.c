/* kv_store.c: LMDB-backed replica state; see kv_store.h for the contract. */
#include "kv_store.h"

#include "fk_error.h"
#include "fk_log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { KV_DB_LOG, KV_DB_DATA, KV_DB_META, KV_DB_CLIENTS, KV_DB_COUNT };
static const char *const kv__db_names[KV_DB_COUNT] = {"log", "data", "meta", "clients"};

struct kv_store {
    MDB_env *env;
    MDB_dbi dbi[KV_DB_COUNT];
    MDB_txn *wtxn; /* the open write transaction, or NULL */
    MDB_txn *rtxn; /* a read transaction kept reset between reads */
    enum fk_durability durability;
    char mark[KV_STORE_PATH_MAX]; /* the boot mark's path (below) */
};

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

static int kv__open_dbs(struct kv_store *s)
{
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc != 0)
        return kv__err("open: begin", rc);
    for (int i = 0; i < KV_DB_COUNT; i++) {
        unsigned flags = MDB_CREATE;
        if (i == KV_DB_LOG || i == KV_DB_CLIENTS)
            flags |= MDB_INTEGERKEY;
        rc = mdb_dbi_open(txn, kv__db_names[i], flags, &s->dbi[i]);
        if (rc != 0) {
            mdb_txn_abort(txn);
            return kv__err("open: dbi", rc);
        }
    }
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
    unsigned flags = MDB_NOTLS;
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
    return kv__err("write begin", mdb_txn_begin(s->env, NULL, 0, &s->wtxn));
}

int kv_write_commit(struct kv_store *s)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    /* mdb_txn_commit frees the transaction whether or not it succeeds. */
    int rc = mdb_txn_commit(s->wtxn);
    s->wtxn = NULL;
    return kv__err("commit", rc);
}

void kv_write_abort(struct kv_store *s)
{
    if (s->wtxn != NULL) {
        mdb_txn_abort(s->wtxn);
        s->wtxn = NULL;
    }
}

static int kv__put(struct kv_store *s, int db, MDB_val *k, const void *val, size_t len,
                   const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    MDB_val v = {.mv_size = len, .mv_data = (void *)val};
    int rc = mdb_put(s->wtxn, s->dbi[db], k, &v, 0);
    return rc ? kv__write_failed(s, what, rc) : 0;
}

int kv_log_put(struct kv_store *s, uint64_t index, const void *entry, size_t len)
{
    MDB_val k = {.mv_size = sizeof index, .mv_data = &index};
    return kv__put(s, KV_DB_LOG, &k, entry, len, "log put");
}

int kv_meta_put(struct kv_store *s, const char *name, const void *val, size_t len)
{
    if (name == NULL || name[0] == '\0' || strlen(name) > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = strlen(name), .mv_data = (void *)name};
    return kv__put(s, KV_DB_META, &k, val, len, "meta put");
}

int kv_data_put(struct kv_store *s, const void *key, size_t klen, const void *val, size_t vlen)
{
    if (key == NULL || klen == 0 || klen > KV_STORE_KEY_MAX)
        return klen > KV_STORE_KEY_MAX ? FK_ETOOBIG : FK_EINVAL;
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    return kv__put(s, KV_DB_DATA, &k, val, vlen, "data put");
}

int kv_client_put(struct kv_store *s, uint64_t client_id, const void *rec, size_t len)
{
    MDB_val k = {.mv_size = sizeof client_id, .mv_data = &client_id};
    return kv__put(s, KV_DB_CLIENTS, &k, rec, len, "client put");
}

int kv_data_del(struct kv_store *s, const void *key, size_t klen)
{
    if (s->wtxn == NULL || key == NULL || klen == 0 || klen > KV_STORE_KEY_MAX)
        return FK_EINVAL;
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    int rc = mdb_del(s->wtxn, s->dbi[KV_DB_DATA], &k, NULL);
    return rc ? kv__write_failed(s, "data del", rc) : 0;
}

static int kv__drop(struct kv_store *s, int db, const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    int rc = mdb_drop(s->wtxn, s->dbi[db], 0);
    return rc ? kv__write_failed(s, what, rc) : 0;
}

int kv_data_clear(struct kv_store *s)
{
    return kv__drop(s, KV_DB_DATA, "data clear");
}

int kv_client_clear(struct kv_store *s)
{
    return kv__drop(s, KV_DB_CLIENTS, "client clear");
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

static int kv__log_delete(struct kv_store *s, MDB_cursor_op first, uint64_t from, uint64_t below,
                          const char *what)
{
    if (s->wtxn == NULL)
        return FK_EINVAL;
    MDB_cursor *c;
    int rc = mdb_cursor_open(s->wtxn, s->dbi[KV_DB_LOG], &c);
    if (rc == 0) {
        rc = kv__log_delete_from(s, c, first, from, below);
        mdb_cursor_close(c);
    }
    return rc ? kv__write_failed(s, what, rc) : 0;
}

int kv_log_trim(struct kv_store *s, uint64_t below)
{
    return kv__log_delete(s, MDB_FIRST, 0, below, "log trim");
}

int kv_log_truncate(struct kv_store *s, uint64_t from)
{
    return kv__log_delete(s, MDB_SET_RANGE, from, UINT64_MAX, "log truncate");
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

static int kv__get(struct kv_store *s, int db, MDB_val *k, void *buf, size_t cap, size_t *len)
{
    MDB_txn *txn = NULL;
    MDB_val v;
    int rc = kv__read_begin(s, &txn);
    if (rc < 0)
        return rc;
    rc = kv__err("get", mdb_get(txn, s->dbi[db], k, &v));
    if (rc == 0) {
        *len = v.mv_size;
        if (v.mv_size > cap)
            rc = FK_ETOOBIG;
        else if (v.mv_size > 0)
            memcpy(buf, v.mv_data, v.mv_size);
    }
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

int kv_data_get(struct kv_store *s, const void *key, size_t klen, void *buf, size_t cap,
                size_t *len)
{
    if (key == NULL || klen == 0 || klen > KV_STORE_KEY_MAX)
        return klen > KV_STORE_KEY_MAX ? FK_ETOOBIG : FK_EINVAL;
    MDB_val k = {.mv_size = klen, .mv_data = (void *)key};
    return kv__get(s, KV_DB_DATA, &k, buf, cap, len);
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
    rc = mdb_cursor_open(txn, s->dbi[KV_DB_LOG], &c);
    if (rc == 0) {
        rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
        if (rc == 0)
            memcpy(first, k.mv_data, sizeof *first);
        if (rc == 0)
            rc = mdb_cursor_get(c, &k, &v, MDB_LAST);
        if (rc == 0)
            memcpy(last, k.mv_data, sizeof *last);
        mdb_cursor_close(c);
    }
    kv__read_end(s, txn);
    return kv__err("log bounds", rc);
}

/* Walks a database from a start position, calling fn; at most max pairs. */
static int kv__scan(struct kv_store *s, int db, MDB_val *start, uint32_t max, kv_visit_fn fn,
                    void *arg)
{
    MDB_txn *txn = NULL;
    MDB_cursor *c;
    MDB_val k, v;
    int rc = kv__read_begin(s, &txn);
    if (rc < 0)
        return rc;
    rc = mdb_cursor_open(txn, s->dbi[db], &c);
    if (rc != 0) {
        kv__read_end(s, txn);
        return kv__err("scan", rc);
    }
    int visited = 0, stop = 0;
    if (start != NULL)
        k = *start;
    rc = mdb_cursor_get(c, &k, &v, start != NULL ? MDB_SET_RANGE : MDB_FIRST);
    while (rc == 0 && (uint32_t)visited < max && stop == 0) {
        stop = fn(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
        visited++;
        if (stop == 0)
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(c);
    kv__read_end(s, txn);
    if (stop < 0)
        return stop;
    if (rc != 0 && rc != MDB_NOTFOUND)
        return kv__err("scan", rc);
    return visited;
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
    for (int i = 0; i < KV_DB_COUNT && rc == 0; i++)
        rc = mdb_stat(txn, s->dbi[i], &ms[i]);
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
