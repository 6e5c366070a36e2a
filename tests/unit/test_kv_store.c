/* Unit tests for server/kv_store: the LMDB environment of a replica. */
#include "check.h"
#include "fk_error.h"
#include "kv_store.h"

#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static struct kv_store *open_store(uint64_t map, enum fk_durability d)
{
    struct kv_store_opts o = {.dir = dir, .map_size = map, .durability = d};
    struct kv_store *s = NULL;
    CHECK_OK(kv_store_open(&o, &s));
    return s;
}

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/fkstoreXXXXXX");
    CHECK(mkdtemp(dir) != NULL);
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST(store_put_get_across_reopen)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_SYNC);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_log_put(s, 1, "entry-1", 7));
    CHECK_OK(kv_data_put(s, "k", 1, "v1", 2));
    CHECK_OK(kv_meta_put(s, "view", "\x05", 1));
    CHECK_OK(kv_client_put(s, 42, "rec", 3));
    /* Reads inside the write transaction see its writes. */
    char buf[64];
    size_t len;
    CHECK_OK(kv_data_get(s, "k", 1, buf, sizeof buf, &len));
    CHECK(len == 2 && memcmp(buf, "v1", 2) == 0);
    CHECK_OK(kv_write_commit(s));
    kv_store_close(s);

    s = open_store(0, FK_DURABLE_SYNC);
    CHECK_OK(kv_log_get(s, 1, buf, sizeof buf, &len));
    CHECK(len == 7 && memcmp(buf, "entry-1", 7) == 0);
    CHECK_OK(kv_meta_get(s, "view", buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 5);
    CHECK_OK(kv_client_get(s, 42, buf, sizeof buf, &len));
    CHECK(len == 3 && memcmp(buf, "rec", 3) == 0);
    CHECK_ERR(kv_data_get(s, "x", 1, buf, sizeof buf, &len), FK_ENOTFOUND);
    CHECK_ERR(kv_data_get(s, "k", 1, buf, 1, &len), FK_ETOOBIG);
    CHECK_EQ_U64(len, 2);
    kv_store_close(s);
    remove_dir();
}

/* kv_data_get in the write transaction positions the data cursor that
 * kv_data_put then writes through: a key absent but with a neighbour
 * that starts with it, one past the last key, one before the first, and
 * writes of other databases and deletes in between must all read and
 * write exactly that key. Checked against what a fresh read sees. */
TEST(store_get_then_put_in_one_transaction_writes_exactly_that_key)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    static const char *const keys[] = {"m", "ma", "mab", "a", "zz", "z", "mb", "m0", "ma"};
    char buf[64];
    size_t len;
    CHECK_OK(kv_write_begin(s));
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int rc = kv_data_get(s, keys[i], strlen(keys[i]), buf, sizeof buf, &len);
        int again = i == 8; /* "ma" a second time */
        CHECK_EQ_I64(rc, again ? 0 : FK_ENOTFOUND);
        char val[16];
        int n = snprintf(val, sizeof val, "v%zu", i);
        CHECK_OK(kv_data_put(s, keys[i], strlen(keys[i]), val, (size_t)n));
        CHECK_OK(kv_log_put(s, i + 1, val, (size_t)n)); /* another database between */
        if (i == 5)
            CHECK_OK(kv_data_del(s, "m", 1)); /* moves the neighbours on its page */
    }
    CHECK_OK(kv_write_commit(s));
    static const struct {
        const char *k, *v;
    } want[] = {{"a", "v3"},  {"m0", "v7"}, {"ma", "v8"}, {"mab", "v2"},
                {"mb", "v6"}, {"z", "v5"},  {"zz", "v4"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_OK(kv_data_get(s, want[i].k, strlen(want[i].k), buf, sizeof buf, &len));
        CHECK(len == strlen(want[i].v) && memcmp(buf, want[i].v, len) == 0);
    }
    CHECK_ERR(kv_data_get(s, "m", 1, buf, sizeof buf, &len), FK_ENOTFOUND);
    kv_store_close(s);
    remove_dir();
}

TEST(store_abort_drops_changes_and_bad_calls_fail)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    char buf[8];
    size_t len;
    CHECK_ERR(kv_data_put(s, "k", 1, "v", 1), FK_EINVAL); /* no write txn */
    CHECK_ERR(kv_write_commit(s), FK_EINVAL);
    CHECK_OK(kv_write_begin(s));
    CHECK_ERR(kv_write_begin(s), FK_EBUSY);
    CHECK_OK(kv_data_put(s, "k", 1, "v", 1));
    CHECK_ERR(kv_data_del(s, "nope", 4), FK_ENOTFOUND);
    kv_write_abort(s);
    CHECK_ERR(kv_data_get(s, "k", 1, buf, sizeof buf, &len), FK_ENOTFOUND);
    CHECK_OK(kv_write_begin(s));
    char big[KV_STORE_KEY_MAX + 1];
    memset(big, 'a', sizeof big);
    CHECK_ERR(kv_data_put(s, big, sizeof big, "v", 1), FK_ETOOBIG);
    CHECK_ERR(kv_data_put(s, "", 0, "v", 1), FK_EINVAL);
    CHECK_ERR(kv_meta_put(s, "", "v", 1), FK_EINVAL);
    kv_write_abort(s);
    kv_store_close(s);
    struct kv_store_opts o = {.dir = "/proc/definitely/not/here"};
    struct kv_store *t = NULL;
    CHECK(kv_store_open(&o, &t) < 0 && t == NULL);
    CHECK_ERR(kv_store_open(NULL, &t), FK_EINVAL);
    remove_dir();
}

TEST(store_log_trim_truncate_bounds)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    uint64_t first, last;
    CHECK_ERR(kv_log_bounds(s, &first, &last), FK_ENOTFOUND);
    char entry[100];
    memset(entry, 'e', sizeof entry);
    /* 20,000 entries span many B-tree pages, so trimming crosses pages. */
    CHECK_OK(kv_write_begin(s));
    for (uint64_t i = 1; i <= 20000; i++)
        CHECK_OK(kv_log_put(s, i, entry, sizeof entry));
    CHECK_OK(kv_write_commit(s));
    CHECK_OK(kv_log_bounds(s, &first, &last));
    CHECK_EQ_U64(first, 1);
    CHECK_EQ_U64(last, 20000);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_log_trim(s, 15001));
    CHECK_OK(kv_log_truncate(s, 19001));
    CHECK_OK(kv_write_commit(s));
    CHECK_OK(kv_log_bounds(s, &first, &last));
    CHECK_EQ_U64(first, 15001);
    CHECK_EQ_U64(last, 19000);
    struct kv_store_stats st;
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ_U64(st.log_entries, 4000);
    size_t len;
    CHECK_ERR(kv_log_get(s, 15000, entry, sizeof entry, &len), FK_ENOTFOUND);
    CHECK_OK(kv_log_get(s, 15001, entry, sizeof entry, &len));
    /* Trimming below everything and truncating past the end are no-ops. */
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_log_trim(s, 3));
    CHECK_OK(kv_log_truncate(s, 50000));
    CHECK_OK(kv_write_commit(s));
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ_U64(st.log_entries, 4000);
    kv_store_close(s);
    remove_dir();
}

struct scan_acc {
    char keys[16][8];
    int n;
};

static int collect(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct scan_acc *a = arg;
    CHECK(kl < 8 && a->n < 16);
    memcpy(a->keys[a->n], k, kl);
    a->keys[a->n][kl] = '\0';
    a->n++;
    return strcmp(a->keys[a->n - 1], "k7") == 0 ? 1 : 0;
}

TEST(store_scan_is_ordered_and_bounded)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    CHECK_OK(kv_write_begin(s));
    const char *keys[] = {"k5", "k1", "k3", "k7", "k9", "k2"};
    for (int i = 0; i < 6; i++)
        CHECK_OK(kv_data_put(s, keys[i], 2, "v", 1));
    CHECK_OK(kv_write_commit(s));
    struct scan_acc a = {.n = 0};
    CHECK_EQ_I64(kv_data_scan(s, "k2", 2, 2, collect, &a), 2);
    CHECK_EQ_STR(a.keys[0], "k2");
    CHECK_EQ_STR(a.keys[1], "k3");
    a.n = 0;
    /* Starts between keys; the visitor stops at k7. */
    CHECK_EQ_I64(kv_data_scan(s, "k4", 2, 100, collect, &a), 2);
    CHECK_EQ_STR(a.keys[0], "k5");
    CHECK_EQ_STR(a.keys[1], "k7");
    a.n = 0;
    CHECK_EQ_I64(kv_data_scan(s, NULL, 0, 100, collect, &a), 5);
    CHECK_EQ_STR(a.keys[0], "k1");
    a.n = 0;
    CHECK_EQ_I64(kv_data_scan(s, "z", 1, 100, collect, &a), 0);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_data_clear(s));
    CHECK_OK(kv_write_commit(s));
    CHECK_EQ_I64(kv_data_scan(s, NULL, 0, 100, collect, &a), 0);
    kv_store_close(s);
    remove_dir();
}

TEST(store_map_full_is_an_error_and_keeps_committed_data)
{
    make_dir();
    struct kv_store *s = open_store(1 << 20, FK_DURABLE_ASYNC); /* 1 MiB map */
    char val[4000];
    memset(val, 'v', sizeof val);
    int rc = 0, committed = 0;
    /* Bounded: 1 MiB cannot hold 1,000 values of 4 KB. */
    for (int i = 0; i < 1000 && rc == 0; i++) {
        char key[16];
        snprintf(key, sizeof key, "key%05d", i);
        CHECK_OK(kv_write_begin(s));
        rc = kv_data_put(s, key, strlen(key), val, sizeof val);
        if (rc == 0)
            rc = kv_write_commit(s);
        if (rc == 0)
            committed++;
    }
    CHECK_ERR(rc, FK_EFULL);
    CHECK(committed > 10);
    /* The failed transaction is gone; the store still answers. */
    CHECK_ERR(kv_write_commit(s), FK_EINVAL);
    char buf[4096];
    size_t len;
    CHECK_OK(kv_data_get(s, "key00000", 8, buf, sizeof buf, &len));
    CHECK_EQ_U64(len, sizeof val);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_data_del(s, "key00000", 8));
    CHECK_OK(kv_write_commit(s));
    kv_store_close(s);
    s = open_store(1 << 20, FK_DURABLE_ASYNC);
    struct kv_store_stats st;
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ_U64(st.data_entries, (uint64_t)committed - 1);
    kv_store_close(s);
    remove_dir();
}

TEST(store_survives_kill_9_with_every_acknowledged_commit)
{
    /* A child commits log entries in sync mode and reports each commit
     * through a pipe; the parent kills it with SIGKILL mid-stream, reopens
     * the environment and finds every reported entry. */
    make_dir();
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        struct kv_store *s = open_store(0, FK_DURABLE_SYNC);
        for (uint64_t i = 1; i <= 100000; i++) {
            if (kv_write_begin(s) < 0 || kv_log_put(s, i, &i, sizeof i) < 0 ||
                kv_write_commit(s) < 0)
                _exit(2);
            if (write(p[1], &i, sizeof i) != sizeof i)
                _exit(3);
        }
        _exit(0);
    }
    close(p[1]);
    uint64_t acked = 0, v;
    while (acked < 200 && read(p[0], &v, sizeof v) == sizeof v)
        acked = v;
    kill(pid, SIGKILL);
    while (read(p[0], &v, sizeof v) == sizeof v) /* drain what was acknowledged */
        acked = v;
    close(p[0]);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK(acked >= 200);
    struct kv_store *s = open_store(0, FK_DURABLE_SYNC);
    uint64_t first, last;
    CHECK_OK(kv_log_bounds(s, &first, &last));
    CHECK_EQ_U64(first, 1);
    CHECK_MSG(last >= acked, "last entry %lu < acknowledged %lu", (unsigned long)last,
              (unsigned long)acked);
    for (uint64_t i = 1; i <= acked; i++) {
        size_t len;
        CHECK_OK(kv_log_get(s, i, &v, sizeof v, &len));
        CHECK_EQ_U64(v, i);
    }
    kv_store_close(s);
    remove_dir();
}

/* Async mode writes through a writable map without fsync: a process that
 * dies keeps every commit (the page cache has it), a machine that goes down
 * may leave a torn file, so a store still marked by another boot is
 * discarded and opens empty (kv_store.h). The machine crash is simulated by
 * rewriting the mark with another boot id. */
static void async_commit_and_die(uint64_t entries)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct kv_store_opts o = {.dir = dir, .durability = FK_DURABLE_ASYNC};
        struct kv_store *s = NULL;
        if (kv_store_open(&o, &s) < 0 || kv_write_begin(s) < 0)
            _exit(2);
        for (uint64_t i = 1; i <= entries; i++)
            if (kv_log_put(s, i, &i, sizeof i) < 0)
                _exit(3);
        _exit(kv_write_commit(s) < 0 ? 4 : 0); /* no close: the mark stays */
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static uint64_t log_last(struct kv_store *s)
{
    uint64_t first = 0, last = 0;
    int rc = kv_log_bounds(s, &first, &last);
    CHECK(rc == 0 || rc == FK_ENOTFOUND);
    return rc == 0 ? last : 0;
}

TEST(store_async_mark_discards_a_store_torn_by_a_machine_crash)
{
    make_dir();
    char mark[128];
    snprintf(mark, sizeof mark, "%s/%s", dir, KV_STORE_MARK);
    /* The process died in this boot: every commit is there. */
    async_commit_and_die(50);
    CHECK(access(mark, F_OK) == 0);
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    CHECK_EQ_U64(log_last(s), 50);
    kv_store_close(s);
    CHECK_MSG(access(mark, F_OK) != 0, "a clean close removes the mark");
    /* Opened in sync mode after such a death: synced at once, unmarked. */
    async_commit_and_die(55);
    s = open_store(0, FK_DURABLE_SYNC);
    CHECK_MSG(access(mark, F_OK) != 0, "a sync open syncs and removes the mark");
    CHECK_EQ_U64(log_last(s), 55);
    kv_store_close(s);
    /* Closed cleanly: no mark, so kept in any later boot. */
    s = open_store(0, FK_DURABLE_SYNC);
    CHECK_EQ_U64(log_last(s), 55);
    kv_store_close(s);
    /* Died unsynced, and the machine went down: discarded, whichever mode
     * opens it next, and usable at once. */
    async_commit_and_die(60);
    FILE *f = fopen(mark, "w");
    CHECK(f != NULL);
    fputs("00000000-0000-0000-0000-000000000000\n", f);
    fclose(f);
    s = open_store(0, FK_DURABLE_SYNC);
    CHECK_EQ_U64(log_last(s), 0);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_log_put(s, 1, "x", 1));
    CHECK_OK(kv_write_commit(s));
    kv_store_close(s);
    CHECK(access(mark, F_OK) != 0);
    remove_dir();
}

TEST(store_rejects_a_directory_that_is_not_lmdb)
{
    make_dir();
    char path[128];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    for (int i = 0; i < 1000; i++)
        fputs("this is not an lmdb file\n", f);
    fclose(f);
    struct kv_store_opts o = {.dir = dir};
    struct kv_store *s = NULL;
    int rc = kv_store_open(&o, &s);
    CHECK_MSG(rc < 0 && s == NULL, "opened garbage: rc=%d", rc);
    remove_dir();
}

/* Counts what a scan visits and remembers the last key. */
struct walk {
    int n;
    char last[16];
};

static int walk_visit(void *arg, const void *k, size_t kl, const void *v, size_t vl)
{
    struct walk *w = arg;
    CHECK(kl < sizeof w->last);
    memcpy(w->last, k, kl);
    w->last[kl] = '\0';
    w->n++;
    return 0;
}

static int data_count(struct kv_store *s)
{
    struct walk w = {0};
    CHECK_OK(kv_data_scan(s, NULL, 0, UINT32_MAX, walk_visit, &w));
    return w.n;
}

/* Staged records are invisible until the switch commits; an aborted
 * switch changes nothing; a committed one survives a reopen, empties the
 * old set, and switching again goes back to set 0. */
TEST(store_staging_switch_is_atomic_and_survives_reopen)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    char buf[16];
    size_t len;
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_data_put(s, "old", 3, "o", 1));
    CHECK_OK(kv_client_put(s, 7, "row7", 4));
    CHECK_OK(kv_write_commit(s));
    CHECK_ERR(kv_stage_clear(s), FK_EINVAL); /* no write transaction */
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_stage_clear(s));
    CHECK_OK(kv_stage_data_put(s, "a", 1, "1", 1));
    CHECK_OK(kv_stage_data_put(s, "b", 1, "2", 1));
    /* Appends must increase; a refused one leaves the transaction usable. */
    CHECK_ERR(kv_stage_data_put(s, "a", 1, "x", 1), FK_EINVAL);
    CHECK_ERR(kv_stage_data_put(s, "", 0, "x", 1), FK_EINVAL);
    CHECK_OK(kv_stage_client_put(s, 3, "row3", 4));
    CHECK_OK(kv_stage_client_put(s, 1ull << 40, "rowL", 4));
    CHECK_ERR(kv_stage_client_put(s, 5, "row5", 4), FK_EINVAL);
    CHECK_OK(kv_write_commit(s));
    CHECK_ERR(kv_data_get(s, "a", 1, buf, sizeof buf, &len), FK_ENOTFOUND);
    CHECK_OK(kv_data_get(s, "old", 3, buf, sizeof buf, &len));
    /* A switch in an aborted transaction never happened. */
    uint64_t aborts = kv_write_aborts(s);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_stage_switch(s));
    CHECK_OK(kv_data_get(s, "a", 1, buf, sizeof buf, &len)); /* the transaction sees it */
    kv_write_abort(s);
    CHECK_EQ_U64(kv_write_aborts(s), aborts + 1);
    CHECK_OK(kv_data_get(s, "old", 3, buf, sizeof buf, &len));
    CHECK_ERR(kv_data_get(s, "a", 1, buf, sizeof buf, &len), FK_ENOTFOUND);
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_stage_switch(s));
    CHECK_OK(kv_write_commit(s));
    kv_store_close(s);
    s = open_store(0, FK_DURABLE_ASYNC);
    CHECK_EQ_I64(data_count(s), 2);
    CHECK_ERR(kv_data_get(s, "old", 3, buf, sizeof buf, &len), FK_ENOTFOUND);
    CHECK_OK(kv_client_get(s, 1ull << 40, buf, sizeof buf, &len));
    CHECK(len == 4 && memcmp(buf, "rowL", 4) == 0);
    CHECK_ERR(kv_client_get(s, 7, buf, sizeof buf, &len), FK_ENOTFOUND);
    struct kv_store_stats st;
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ_U64(st.data_entries, 2);
    CHECK_EQ_U64(st.client_entries, 2);
    /* Writes go to the live set (now set 1); the staging set is set 0,
     * which the switch emptied: staging one pair and switching back
     * leaves exactly that pair. */
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_data_put(s, "c", 1, "3", 1));
    CHECK_OK(kv_client_del(s, 3));
    CHECK_ERR(kv_client_del(s, 3), FK_ENOTFOUND);
    CHECK_EQ_I64(data_count(s), 3);
    CHECK_OK(kv_stage_data_put(s, "z", 1, "9", 1));
    CHECK_OK(kv_stage_switch(s));
    CHECK_EQ_I64(data_count(s), 1);
    CHECK_OK(kv_write_commit(s));
    kv_store_close(s);
    s = open_store(0, FK_DURABLE_ASYNC);
    CHECK_EQ_I64(data_count(s), 1);
    CHECK_OK(kv_data_get(s, "z", 1, buf, sizeof buf, &len));
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ_U64(st.client_entries, 0);
    /* A corrupt live-set record is refused at open. */
    CHECK_OK(kv_write_begin(s));
    CHECK_OK(kv_meta_put(s, KV_STORE_LIVE_KEY, "\x02", 1));
    CHECK_OK(kv_write_commit(s));
    kv_store_close(s);
    struct kv_store_opts o = {.dir = dir, .durability = FK_DURABLE_ASYNC};
    CHECK_ERR(kv_store_open(&o, &s), FK_EMALFORMED);
    remove_dir();
}

/* A view is the committed state at its open: later commits, a switch and
 * the open write transaction do not change what it reads; slots are
 * bounded and reopen on demand. */
TEST(store_views_keep_their_picture_across_commits_and_a_switch)
{
    make_dir();
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    char key[16];
    CHECK_OK(kv_write_begin(s));
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        CHECK_OK(kv_data_put(s, key, 4, key, 4));
    }
    uint64_t one = 1, two = 2;
    CHECK_OK(kv_client_put(s, one, "r", 1));
    CHECK_OK(kv_client_put(s, two, "r", 1));
    CHECK_OK(kv_meta_put(s, "m", "A", 1));
    CHECK_OK(kv_write_commit(s));
    CHECK_ERR(kv_view_open(s, KV_STORE_VIEWS_MAX), FK_EINVAL);
    CHECK_ERR(kv_view_counts(s, 0, &one, &two), FK_EINVAL); /* not open */
    CHECK_OK(kv_view_open(s, 0));
    CHECK_OK(kv_write_begin(s)); /* the view ignores the open write transaction */
    CHECK_OK(kv_data_put(s, "k000", 4, "changed", 7));
    CHECK_OK(kv_view_open(s, 1));
    for (int round = 0; round < 50; round++) { /* many commits, each changing pages */
        snprintf(key, sizeof key, "k%03d", round * 2);
        CHECK_OK(kv_data_del(s, key, 4));
        CHECK_OK(kv_meta_put(s, "m", "B", 1));
        CHECK_OK(kv_write_commit(s));
        CHECK_OK(kv_write_begin(s));
    }
    CHECK_OK(kv_stage_data_put(s, "new", 3, "n", 1));
    CHECK_OK(kv_stage_switch(s));
    CHECK_OK(kv_write_commit(s));
    CHECK_EQ_I64(data_count(s), 1);
    for (uint32_t slot = 0; slot < 2; slot++) {
        uint64_t pairs, clients;
        CHECK_OK(kv_view_counts(s, slot, &pairs, &clients));
        CHECK_EQ_U64(pairs, 100);
        CHECK_EQ_U64(clients, 2);
        char m;
        size_t len;
        CHECK_OK(kv_view_meta_get(s, slot, "m", &m, 1, &len));
        CHECK(len == 1 && m == 'A');
        struct walk w = {0};
        CHECK_EQ_I64(kv_view_data_scan(s, slot, NULL, 0, walk_visit, &w), 100);
        CHECK_EQ_STR(w.last, "k099");
        w.n = 0; /* exclusive start, present or not */
        CHECK_EQ_I64(kv_view_data_scan(s, slot, "k097", 4, walk_visit, &w), 2);
        CHECK_EQ_I64(kv_view_data_scan(s, slot, "k0975", 5, walk_visit, &w), 2);
        uint64_t after = 1;
        CHECK_EQ_I64(kv_view_client_scan(s, slot, &after, walk_visit, &w), 1);
        CHECK_EQ_I64(kv_view_client_scan(s, slot, NULL, walk_visit, &w), 2);
    }
    /* Reopening a slot moves it to the state now. */
    CHECK_OK(kv_view_open(s, 0));
    uint64_t pairs, clients;
    CHECK_OK(kv_view_counts(s, 0, &pairs, &clients));
    CHECK_EQ_U64(pairs, 1);
    CHECK_EQ_U64(clients, 0);
    kv_view_close(s, 0);
    kv_view_close(s, 0); /* a no-op */
    struct walk w = {0};
    CHECK_ERR(kv_view_data_scan(s, 0, NULL, 0, walk_visit, &w), FK_EINVAL);
    for (uint32_t slot = 0; slot < KV_STORE_VIEWS_MAX; slot++)
        CHECK_OK(kv_view_open(s, slot));
    kv_store_close(s); /* closes the open views */
    remove_dir();
}

/* An environment written before the second set existed (four databases,
 * no live-set record) opens with its data and clients live, as set 0. */
TEST(store_opens_an_environment_from_before_the_second_set)
{
    make_dir();
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi data, clients;
    CHECK(mdb_env_create(&env) == 0);
    CHECK(mdb_env_set_maxdbs(env, 4) == 0);
    CHECK(mdb_env_open(env, dir, MDB_NOTLS, 0640) == 0);
    CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0);
    CHECK(mdb_dbi_open(txn, "data", MDB_CREATE, &data) == 0);
    CHECK(mdb_dbi_open(txn, "clients", MDB_CREATE | MDB_INTEGERKEY, &clients) == 0);
    uint64_t id = 5;
    MDB_val k = {.mv_size = 1, .mv_data = "k"}, v = {.mv_size = 2, .mv_data = "v1"};
    CHECK(mdb_put(txn, data, &k, &v, 0) == 0);
    k = (MDB_val){.mv_size = sizeof id, .mv_data = &id};
    CHECK(mdb_put(txn, clients, &k, &v, 0) == 0);
    CHECK(mdb_txn_commit(txn) == 0);
    mdb_env_close(env);
    struct kv_store *s = open_store(0, FK_DURABLE_ASYNC);
    char buf[8];
    size_t len;
    CHECK_OK(kv_data_get(s, "k", 1, buf, sizeof buf, &len));
    CHECK(len == 2 && memcmp(buf, "v1", 2) == 0);
    CHECK_OK(kv_client_get(s, 5, buf, sizeof buf, &len));
    CHECK_OK(kv_view_open(s, 0));
    uint64_t pairs, rows;
    CHECK_OK(kv_view_counts(s, 0, &pairs, &rows));
    CHECK(pairs == 1 && rows == 1);
    kv_store_close(s);
    remove_dir();
}

CHECK_MAIN()
