/*
 * ycsb_run.h: the load/run phase of flowkv-ycsb against any binding.
 *
 * The runner is YCSB's Client, ClientThread, DBWrapper, StatusThread and
 * TerminatorThread in one: it starts threadcount threads, each with its own
 * binding context, workload thread state (ycsb_workload.h) and measurements
 * (ycsb_report.h), and keeps up to flowkv.pipeline requests in flight per
 * thread (1 = YCSB's closed loop with one outstanding operation per thread).
 * With target > 0 each thread starts operation k at its intended time
 * (ycsb_pace_intended) and latency is measured from that time, so a stall
 * shows in the latency of every operation queued behind it (coordinated
 * omission); a thread whose pipeline is full issues late, never skips.
 *
 * Per operation, as YCSB: READ, UPDATE, INSERT and SCAN are one request each;
 * READ-MODIFY-WRITE is a read, then (if it succeeded) an update of the same
 * key, measured as READ, UPDATE and READ-MODIFY-WRITE; a run-phase insert is
 * acknowledged to the workload when it completes, whatever its outcome;
 * a failed load-phase insert is retried core_workload_insertion_retry_limit
 * times after core_workload_insertion_retry_interval seconds (x 0.8..1.2).
 * operationcount (run) or insertcount/recordcount (load) operations are
 * spread over the threads (0: no limit); maxexecutiontime stops the run.
 * With status=true a line (ycsb_status_line) is printed every status.interval
 * seconds and once at the end.
 *
 * Memory per thread, allocated at start: pipeline slots of one operation and
 * one record each (fieldcount * fieldlength bytes of values; the product,
 * times the pipeline depth, is capped at YCSB_RUN_THREAD_BYTES) and two
 * struct ycsb_meas (about 3.4 MB). Nothing is allocated per operation.
 */
#ifndef YCSB_RUN_H
#define YCSB_RUN_H

#include "ycsb_props.h"
#include "ycsb_report.h"
#include "ycsb_workload.h"

#include <stdint.h>
#include <stdio.h>

#define YCSB_RUN_THREAD_BYTES (64u << 20) /* value bytes per thread */

/* One field of a written record. */
struct ycsb_field {
    const char *name;     /* "field3" */
    const uint8_t *value; /* len bytes */
    uint32_t len;
};

enum ycsb_req_kind {
    YCSB_REQ_READ,
    YCSB_REQ_UPDATE,
    YCSB_REQ_INSERT,
    YCSB_REQ_SCAN,
};

/* A request to the store. It and everything it points to stay valid and
 * unchanged from submit until its completion is returned by poll. */
struct ycsb_req {
    uint64_t cookie; /* returned with the completion */
    enum ycsb_req_kind kind;
    const char *table; /* conf.table */
    const char *key;   /* NUL-terminated, key_len bytes */
    unsigned key_len;
    const char *read_field; /* READ/SCAN: NULL = all fields, else one name */
    int32_t scan_len;       /* SCAN: number of records from key on */
    int32_t nfields;        /* UPDATE/INSERT: fields written */
    const struct ycsb_field *fields;
};

struct ycsb_done {
    uint64_t cookie;
    int rc; /* 0 or a negative flowkv error; mapped by ycsb_status_from_err */
};

/* A store binding: one context per runner thread; each context is used by
 * that thread only. */
struct ycsb_binding {
    const char *name;
    /* Opens the context of thread tid. Returns 0 or a negative error with a
     * message in err. */
    int (*open)(void **ctx, const struct ycsb_props *props, int32_t tid, char *err, size_t errlen);
    /* Closes it. No request is in flight, unless poll failed. */
    void (*close)(void *ctx);
    /* Starts req. Returns 0 (its completion comes from poll) or a negative
     * error: the request failed at once, with that result. The runner never
     * has more than flowkv.pipeline requests in flight per context. */
    int (*submit)(void *ctx, const struct ycsb_req *req);
    /* Waits at most timeout_ns for completions and stores up to max of them
     * in done. Returns their number (0 on timeout) or a negative error, which
     * stops the thread. */
    int (*poll)(void *ctx, struct ycsb_done *done, int max, int64_t timeout_ns);
};

struct ycsb_run_result {
    int64_t runtime_ms;     /* from the threads' start to the last one's end */
    uint64_t opsdone;       /* operations completed, all threads */
    struct ycsb_meas *meas; /* merged measurements; owned by the result */
};

/* Runs the phase conf.dotransactions selects with binding b. props are
 * passed to the binding's open. Status lines go to status_out (NULL:
 * stderr). On success fills res (free res->meas with ycsb_meas_destroy) and
 * returns 0; else returns a negative error with a message in err (a binding
 * failure, -ENOMEM, FK_EINVAL for flowkv.pipeline or the record size).
 * Main thread. */
int ycsb_run(const struct ycsb_conf *conf, const struct ycsb_props *props,
             const struct ycsb_binding *b, FILE *status_out, struct ycsb_run_result *res, char *err,
             size_t errlen);

/* Prints res in YCSB's text format with conf's percentiles. Returns 0 or
 * -EIO. */
int ycsb_run_report(FILE *out, const struct ycsb_conf *conf, const struct ycsb_run_result *res);

#endif /* YCSB_RUN_H */
