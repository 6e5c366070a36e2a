/*
 * flowkv.h: libflowkv, the client library of the flowkv replicated
 * key-value store.
 *
 *   flowkv *kv;
 *   char err[256];
 *   if (flowkv_open("run/cluster.conf", NULL, &kv, err, sizeof err) < 0) ...
 *   flowkv_put(kv, "k", 1, "v", 1);
 *   flowkv_close(kv);
 *
 * Connecting. flowkv_open reads the cluster description file (the one the
 * replicas use: addresses, protocol) and joins each replica's reply flow;
 * requests go to the Multi-Paxos leader (found and followed automatically)
 * or, for NOPaxos, through the ordered multicast to every replica, whose
 * replies are gathered until f+1 agree including the leader's (NOPaxos
 * section 5.2.1).
 *
 * Semantics. Every operation is linearizable (reads go through the log)
 * and applied at most once: each pipeline slot is one client session (a
 * random 64-bit client id and request numbers 1, 2, ...), retried with the
 * same number after a timeout or a leader change until the deadline. The
 * cluster remembers the most recent sessions (131,072 on Multi-Paxos,
 * 50,000 on NOPaxos: README, "Limits"); a session it
 * forgot answers FK_EEXPIRED (fk_error.h): the outcome is unknown (like a
 * timeout).
 *
 * Limits (checked here and by the replicas; README, "Limits"): keys
 * 1..FLOWKV_KEY_MAX bytes, values 0..FLOWKV_VAL_MAX bytes (NOPaxos: key,
 * value and expected value of one request together at most
 * FLOWKV_NOP_OP_MAX bytes, FK_EVALSIZE with flowkv_error_detail naming
 * it), one scan request returns 1..FLOWKV_SCAN_MAX pairs, a page of at
 * most FLOWKV_SCAN_PAGE bytes or one pair; flowkv_scan_range pages
 * through up to FLOWKV_SCAN_COUNT_MAX pairs.
 *
 * Errors are negative codes (fk_error.h; fk_strerror names them):
 * FK_ENOTFOUND (get, del, cas on a missing key), FK_ECASFAIL (cas: the
 * current value differs), FK_EKEYSIZE (a key over FLOWKV_KEY_MAX bytes),
 * FK_EVALSIZE (a value over FLOWKV_VAL_MAX bytes), FK_ETOOBIG (get: the
 * caller's buffer is too small), FK_EINVAL (bad arguments),
 * FK_ETIMEDOUT (no answer before the deadline: unreachable cluster or no
 * quorum), FK_EBUSY (the pipeline is full), FK_EQUOTA (the cluster's
 * data quota; flowkv_error_detail says by
 * how much), FK_EEXPIRED, FK_ECONFIG (cluster file), FK_EUNREACHABLE (no
 * replica answered at open).
 *
 * Threads: a handle is used by one thread at a time; open one per thread.
 * The handles a process opens on one cluster file (and bind address)
 * share a channel: one flow node and one set of flows to each replica,
 * under a lock, so that a replica spends its client memory per process,
 * not per handle, and the requests of many threads share segments. A
 * thread waiting for its completions may read and dispatch the others'
 * too. At most FLOWKV_HANDLES_MAX handles share a channel;
 * flowkv_opts.own_channel gives a handle a channel of its own. A child
 * of fork() opens channels of its own.
 */
#ifndef FLOWKV_H
#define FLOWKV_H

#include <stddef.h>
#include <stdint.h>

#define FLOWKV_KEY_MAX        511
#define FLOWKV_VAL_MAX        1048576 /* 1 MiB (NOPaxos: FLOWKV_NOP_OP_MAX) */
#define FLOWKV_NOP_OP_MAX     4096    /* NOPaxos: key + value (+ expected) bytes of one request */
#define FLOWKV_SCAN_MAX       16
#define FLOWKV_SCAN_PAGE      8192 /* bytes of pairs after which a scan page stops */
#define FLOWKV_PIPELINE_MAX   128
#define FLOWKV_HANDLES_MAX    4096    /* handles of one process on one cluster (a channel) */
#define FLOWKV_RESULT_MAX     1049093 /* bytes of a get value or scan page: 1 MiB + 517 */
#define FLOWKV_SCAN_COUNT_MAX 10000   /* pairs one flowkv_scan_range call visits */

typedef struct flowkv flowkv;

struct flowkv_opts {
    uint64_t timeout_ns; /* per operation, retries included; 0 = 5 s */
    uint32_t pipeline;   /* operations in flight (asynchronous use); 0 = 1 */
    const char *bind;    /* local address replicas reach this client at;
                            NULL = the one that routes to the first replica */
    int own_channel;     /* 1: a channel of its own, shared with no other handle */
};

/* Opens a handle on the cluster described by the file at path (on the
 * process's channel to it, opened by the first handle). err gets one line
 * on failure. Errors: FK_ECONFIG / -errno (the file), FK_EINVAL,
 * FK_ENOMEM (out of memory, or every replica refused a new client
 * process: "replica N refused this client: client memory limit reached
 * (M bytes, flow_memory in FILE)"), FK_EFULL (FLOWKV_HANDLES_MAX handles
 * in this process, or FKC_REPLY_MAX client processes at the replicas),
 * FK_EUNREACHABLE (no replica could be joined), FK_EAUTH (the replicas
 * refused the file's token: every connection proves it, fab.h). */
int flowkv_open(const char *path, const struct flowkv_opts *opts, flowkv **out, char *err,
                size_t errcap);
/* Waits for nothing: operations in flight are abandoned. Safe on NULL. */
void flowkv_close(flowkv *kv);

/* ---- synchronous calls (one at a time; 0 or a negative error) ------------ */

/* Copies the value into val (cap bytes) and sets *vlen; FK_ETOOBIG when
 * cap is too small (*vlen then says how much is needed). */
int flowkv_get(flowkv *kv, const void *key, size_t klen, void *val, size_t cap, size_t *vlen);
int flowkv_put(flowkv *kv, const void *key, size_t klen, const void *val, size_t vlen);
int flowkv_del(flowkv *kv, const void *key, size_t klen);
/* Sets key to val if its value is exp (elen bytes). */
int flowkv_cas(flowkv *kv, const void *key, size_t klen, const void *exp, size_t elen,
               const void *val, size_t vlen);

/* A scan's result: up to `count` pairs with key >= start, in key order
 * (memcmp order, shorter first), as many as one page holds (pairs up to
 * FLOWKV_SCAN_PAGE bytes, at least one). Walk them with flowkv_scan_next.
 * data points into the handle: valid until its next call. */
struct flowkv_result {
    int status;
    uint32_t len;
    const uint8_t *data;
};
int flowkv_scan(flowkv *kv, const void *start, size_t slen, uint32_t count,
                struct flowkv_result *res);
/* Returns 1 and the next pair (pointers into res) advancing *off (start at
 * 0), 0 at the end, FK_EMALFORMED on bad bytes. */
int flowkv_scan_next(const struct flowkv_result *res, size_t *off, const uint8_t **key,
                     size_t *klen, const uint8_t **val, size_t *vlen);

/* Visits up to count (1..FLOWKV_SCAN_COUNT_MAX) pairs with start <= key <
 * end in key order; end NULL (elen 0) means no end, start NULL (slen 0)
 * the first key. It pages: each page is one linearizable scan request of
 * at most FLOWKV_SCAN_MAX pairs and FLOWKV_RESULT_MAX bytes, and the next
 * page continues after the last key visited (FLOWKV_SCAN_AFTER), so a
 * range is NOT read at one instant: a key written between two pages
 * appears if it lies after the page boundary, as with etcd's paginated
 * range reads. fn's key and value are valid during the call; it returns 0
 * to go on or nonzero to stop. Returns the number of pairs visited, or a
 * negative error (fn's own negative value is returned as is). */
typedef int (*flowkv_visit_fn)(void *arg, const uint8_t *key, size_t klen, const uint8_t *val,
                               size_t vlen);
int flowkv_scan_range(flowkv *kv, const void *start, size_t slen, const void *end, size_t elen,
                      uint32_t count, flowkv_visit_fn fn, void *arg);

/* The replicas' detail of the last synchronous call's error, "" when they
 * sent none: for FK_EQUOTA "N of M bytes" (what the cluster would hold
 * after the write, and its quota). Valid until the next call. */
const char *flowkv_error_detail(const flowkv *kv);

/* ---- asynchronous, pipelined ---------------------------------------------- */

enum flowkv_op_type {
    FLOWKV_GET = 1,
    FLOWKV_PUT = 2,
    FLOWKV_DEL = 3,
    FLOWKV_CAS = 4,
    FLOWKV_SCAN = 5,
    FLOWKV_CONFIG = 6, /* flowkv_member_change's; val: CONS_CONFIG_BYTES, no key */
};

struct flowkv_op {
    uint8_t type; /* enum flowkv_op_type */
    const void *key;
    size_t klen;
    const void *val; /* PUT, CAS: the new value */
    size_t vlen;
    const void *exp; /* CAS: the expected value */
    size_t elen;
    uint32_t count;  /* SCAN: 1..FLOWKV_SCAN_MAX pairs */
    const void *end; /* SCAN: keys below this one only (exclusive); NULL = no end */
    size_t endlen;   /* SCAN: 0..FLOWKV_KEY_MAX */
    uint32_t flags;  /* SCAN: FLOWKV_SCAN_AFTER, or 0 */
    uint64_t tag;    /* returned with the completion */
};

/* SCAN flag: start after key, not at it (a continuation from the last key
 * of a page; a key of FLOWKV_KEY_MAX bytes has no successor to start at). */
#define FLOWKV_SCAN_AFTER 1u

/* Starts op (its bytes are copied). 0, FK_EBUSY (pipeline full: poll),
 * or a limit error. */
int flowkv_submit(flowkv *kv, const struct flowkv_op *op);

struct flowkv_done {
    uint64_t tag;
    int status;          /* 0 or a negative error, as the synchronous calls */
                         /* (an error's data, when len > 0, is its detail as text) */
    uint32_t len;        /* GET: value bytes; SCAN: pair bytes */
    const uint8_t *data; /* valid until the next flowkv_poll on this handle */
    uint32_t handle;     /* flowkv_poll_set: its handle's index in kvs (else 0) */
};

/* Waits up to timeout_ns for completions and stores up to max of them.
 * Returns their number (0 on timeout). */
int flowkv_poll(flowkv *kv, struct flowkv_done *done, int max, uint64_t timeout_ns);

/* As flowkv_poll, for the n handles in kvs at once: one thread serves many
 * handles, each with its own requests in flight (an event loop, or
 * flowkv-ycsb's flowkv.handles), and sleeps until any of them completes.
 * The handles must share a channel (opened on one cluster file in this
 * process, without own_channel) and be in no other set being polled.
 * done[i].handle says which. Returns their number (0 on timeout), or
 * FK_EINVAL. */
int flowkv_poll_set(flowkv *const *kvs, uint32_t n, struct flowkv_done *done, int max,
                    uint64_t timeout_ns);

/* Operations submitted and not yet returned by flowkv_poll. */
uint32_t flowkv_inflight(const flowkv *kv);

/* ---- cluster status ----------------------------------------------------------- */

struct flowkv_replica_status {
    uint32_t id;
    int reachable;     /* 0: no answer within the timeout (other fields 0) */
    char role[16];     /* "leader", "follower", "candidate", "recovering", "view-change" */
    char fabric[8];    /* "tcp", "verbs" */
    char protocol[12]; /* "multipaxos", "nopaxos" */
    uint64_t term;     /* ballot, or NOPaxos view (leader_num << 32 | session) */
    uint32_t leader;
    uint64_t commit, applied, last;
    uint64_t uptime_ns;
    uint32_t epoch;   /* the configuration in force there (Multi-Paxos; 0 for NOPaxos) */
    uint64_t members; /* its voters, a mask of replica ids; the others are learners */
};

/* Changes the replicas that vote (Multi-Paxos, consensus/mpx.h
 * "Reconfiguration") to `members` (a mask of ids below flowkv_replicas),
 * from configuration `epoch`, the current one (flowkv_status). 0 once the
 * change is committed; FK_EAGAIN when the leader refused it for now (a
 * change under way, or a new member that has not caught up yet: try
 * again); FK_EBUSY when another change came first (read the epoch again);
 * FK_EINVAL for an empty set or an id outside the cluster; FK_ENOTSUP on
 * NOPaxos. */
int flowkv_member_change(flowkv *kv, uint32_t epoch, uint64_t members);

/* Number of replicas in the cluster. */
uint32_t flowkv_replicas(const flowkv *kv);

/* The library's release, "MAJOR.MINOR.PATCH" (a static string): what the
 * programs print with --version. */
const char *flowkv_version(void);
/* Asks replica id for its status. 0 (st->reachable says whether it
 * answered) or FK_EINVAL. */
int flowkv_status(flowkv *kv, uint32_t id, struct flowkv_replica_status *st, uint64_t timeout_ns);

/* ---- backup ------------------------------------------------------------------ */

struct flowkv_snapshot_info {
    uint32_t replica;  /* the replica that sent it */
    char protocol[12]; /* its cluster's: "multipaxos", "nopaxos" */
    uint64_t index;    /* its mark: every log entry <= index is in it */
    uint64_t bytes;    /* of the state stream (the file has a little more) */
    uint64_t chunks;   /* requests it took */
    uint64_t checksum; /* the file's XXH3-64 (its trailer) */
};

/* Writes a consistent snapshot of replica id's state to fd, as a backup
 * file (`flowkv snapshot save`; restored with `flowkv-server --restore`):
 * the replica streams one view of its state (an LMDB read transaction; it
 * keeps serving) a chunk at a time, and the file ends with a checksum of
 * every byte. The view holds every write acknowledged before the call
 * (its index reaches the highest commit point the replicas report). The caller owns fd (write
 * position: the file's start); nothing is synced. timeout_ns bounds each chunk's wait (resent while
 * unanswered), not the whole transfer. Errors: FK_EINVAL, FK_ETIMEDOUT
 * (the replica stopped answering), FK_EBUSY (another backup is being read
 * from it), FK_EAGAIN (it recovers or changes view: for as long as the
 * timeout), -errno from writing fd, a storage error from the replica;
 * flowkv_error_detail says which step. Any thread; one call at a time per
 * process and cluster. */
int flowkv_snapshot_save(flowkv *kv, uint32_t id, int fd, struct flowkv_snapshot_info *info,
                         uint64_t timeout_ns);

#endif /* FLOWKV_H */
