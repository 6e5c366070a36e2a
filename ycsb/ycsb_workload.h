/*
 * ycsb_workload.h: YCSB's CoreWorkload as a pure "next operation" API.
 *
 * A driver thread asks for its next operation (which kind, which key, which
 * fields, how many bytes per field, how long a scan) and executes it against a
 * binding; nothing here does I/O. The choices follow CoreWorkload.java
 * (brianfrankcooper/YCSB, core/src/main/java/site/ycsb/workloads/):
 *
 *  - properties and defaults: the CoreWorkload and Client property names, with
 *    their defaults (ycsb_conf_parse lists them); recordcount 0 means
 *    Integer.MAX_VALUE as in CoreWorkload;
 *  - key names: "user" + Long.toString(n), zero-padded to zeropadding digits,
 *    where n = fnvhash64(keynum) for insertorder=hashed (the default) or
 *    keynum for insertorder=ordered (CoreWorkload.buildKeyName);
 *  - field names: fieldnameprefix + index ("field0" ...);
 *  - load: keys insertstart, insertstart+1, ... from one shared counter,
 *    all fields written;
 *  - run: the operation from a DiscreteGenerator over the proportions, in the
 *    order READ, UPDATE, INSERT, SCAN, READMODIFYWRITE; the key from
 *    requestdistribution (uniform, zipfian = scrambled zipfian over
 *    [insertstart, insertstart + insertcount + (int)(2 * operationcount *
 *    insertproportion)], inclusive as in YCSB, so one key past the loaded
 *    range can be drawn, latest,
 *    hotspot, sequential, exponential), redrawn while it is above the highest
 *    acknowledged insert (nextKeynum; bounded here by YCSB_KEY_RETRY_MAX);
 *    key numbers pass through Java's intValue() (32 bits) as in YCSB;
 *    inserts take the next number of an acknowledged counter that starts at
 *    recordcount, and the driver acknowledges each insert when it completes
 *    (success or failure, as YCSB's finally block);
 *  - readallfields / writeallfields, a uniform field chooser, field lengths
 *    from fieldlengthdistribution (constant, uniform, zipfian) and scan
 *    lengths from scanlengthdistribution (uniform, zipfian) over
 *    [minscanlength, maxscanlength]; random draws happen in YCSB's order.
 *
 * Deliberate differences, each because YCSB's behaviour would hide an error:
 * a bad number, boolean or fraction is an error naming the property (Java
 * would throw or silently take false / 0.0); surrounding blanks of numbers
 * and booleans are ignored; dataintegrity, fieldlengthdistribution=histogram,
 * reportlatencyforeacherror and latencytrackederrors are refused as
 * unsupported rather than ignored.
 *
 * Threads: ycsb_workload_init runs once on the main thread; each driver
 * thread then owns one struct ycsb_thread (its rng and its copies of the
 * zipfian generators, whose zeta grows with inserts) and calls the next-op
 * functions on it without locks; shared counters are atomic.
 */
#ifndef YCSB_WORKLOAD_H
#define YCSB_WORKLOAD_H

#include "ycsb_gen.h"
#include "ycsb_props.h"

#include <stdbool.h>
#include <stdint.h>

#define YCSB_FIELDS_MAX     256  /* fieldcount limit (a record's fields) */
#define YCSB_ZEROPAD_MAX    64   /* zeropadding limit (key length bound) */
#define YCSB_NAME_MAX       64   /* table, fieldnameprefix, label, db */
#define YCSB_PERCENTILE_MAX 16   /* hdrhistogram.percentiles entries */
#define YCSB_KEY_RETRY_MAX  1000 /* redraws of a key above the inserted range */
#define YCSB_PIPELINE_MAX   1024 /* flowkv.pipeline limit */
/* "user" + padding + a Java long ("-9223372036854775808": 20 chars) + NUL. */
#define YCSB_KEY_MAX (4 + YCSB_ZEROPAD_MAX + 20 + 1)

enum ycsb_dist {
    YCSB_DIST_UNIFORM,
    YCSB_DIST_ZIPFIAN,
    YCSB_DIST_LATEST,
    YCSB_DIST_HOTSPOT,
    YCSB_DIST_SEQUENTIAL,
    YCSB_DIST_EXPONENTIAL,
    YCSB_DIST_CONSTANT, /* field lengths only */
};

/* measurement.interval: which start time latencies are measured from. */
enum ycsb_interval {
    YCSB_INTERVAL_OP,       /* the actual start ("op") */
    YCSB_INTERVAL_INTENDED, /* the intended start (coordinated omission) */
    YCSB_INTERVAL_BOTH,     /* both, the second as "Intended-<OP>" */
};

struct ycsb_conf {
    char table[YCSB_NAME_MAX];           /* table=usertable */
    char db[YCSB_NAME_MAX];              /* db=flowkv */
    char label[YCSB_NAME_MAX];           /* label= (status line prefix) */
    char fieldnameprefix[YCSB_NAME_MAX]; /* fieldnameprefix=field */
    int64_t recordcount;                 /* recordcount=0 (-> INT32_MAX) */
    int64_t recordcount_given;           /* as written (0 when absent) */
    int64_t operationcount;              /* operationcount=0 (0: no limit) */
    int64_t fieldcount;                  /* fieldcount=10 */
    int32_t fieldlength;                 /* fieldlength=100 */
    int32_t minfieldlength;              /* minfieldlength=1 */
    enum ycsb_dist fieldlengthdist;      /* fieldlengthdistribution=constant */
    double readproportion;               /* 0.95 */
    double updateproportion;             /* 0.05 */
    double insertproportion;             /* 0 */
    double scanproportion;               /* 0 */
    double readmodifywriteproportion;    /* 0 */
    enum ycsb_dist requestdist;          /* requestdistribution=uniform */
    int32_t minscanlength;               /* 1 */
    int32_t maxscanlength;               /* 1000 */
    enum ycsb_dist scanlengthdist;       /* scanlengthdistribution=uniform */
    bool ordered_inserts;                /* insertorder=hashed -> false */
    int32_t zeropadding;                 /* 1 */
    int64_t insertstart;                 /* 0 */
    int64_t insertcount;                 /* recordcount - insertstart */
    bool insertcount_set;                /* insertcount was given */
    double hotspotdatafraction;          /* 0.2 */
    double hotspotopnfraction;           /* 0.8 */
    bool readallfields;                  /* true */
    bool readallfieldsbyname;            /* false */
    bool writeallfields;                 /* false */
    double exponential_percentile;       /* exponential.percentile=95 */
    double exponential_frac;             /* exponential.frac=0.8571428571 */
    bool dotransactions;                 /* true (run), false (load) */
    int32_t threadcount;                 /* threadcount=1 */
    int32_t target;                      /* target=0 (ops/s, 0 = closed loop) */
    bool status;                         /* status=false (-s) */
    int32_t status_interval;             /* status.interval=10 (s) */
    int64_t maxexecutiontime;            /* maxexecutiontime=0 (s, 0 = none) */
    int32_t insertion_retry_limit;       /* core_workload_insertion_retry_limit=0 */
    int32_t insertion_retry_interval;    /* core_workload_insertion_retry_interval=3 */
    enum ycsb_interval interval;         /* measurement.interval=intended */
    unsigned npercentiles;               /* hdrhistogram.percentiles=50,95,99 */
    double percentiles[YCSB_PERCENTILE_MAX];
    uint64_t seed;    /* flowkv.seed=1: thread t's rng is seeded with seed + t */
    int32_t pipeline; /* flowkv.pipeline=1: requests in flight per thread */
};

/* Fills conf from props (missing properties take their defaults) and checks
 * it: numbers in range, proportions >= 0 with a positive sum for the run
 * phase, recordcount >= insertstart + insertcount, fractions in [0, 1],
 * minscanlength <= maxscanlength, known distribution names. Defaults that
 * differ from YCSB's: measurement.interval=intended (identical to "op" in a
 * closed loop, and the honest figure in an open loop) and
 * hdrhistogram.percentiles=50,95,99 (YCSB: 95,99). Returns 0 or FK_EINVAL
 * with err = "<property>: <why>". Pure; any thread. */
int ycsb_conf_parse(struct ycsb_conf *conf, const struct ycsb_props *props, char *err,
                    size_t errlen);

/* Operations the whole run performs (Client.initDb): operationcount for the
 * run phase; for the load phase insertcount if given, else recordcount as
 * given (0 = no limit, as YCSB). */
int64_t ycsb_conf_total_ops(const struct ycsb_conf *conf);
/* Threads actually used: threadcount, lowered to the total when the total is
 * positive and smaller (as YCSB). */
int32_t ycsb_conf_threads(const struct ycsb_conf *conf);
/* Operations of thread tid among nthreads: total / n, plus one for the first
 * total % n threads. */
int64_t ycsb_thread_ops(int64_t total, int32_t nthreads, int32_t tid);

/* Writes "user" + ... into key (YCSB_KEY_MAX bytes); returns its length. */
unsigned ycsb_key_name(char key[YCSB_KEY_MAX], int64_t keynum, int32_t zeropadding, bool ordered);
/* Writes fieldnameprefix + index; returns the length or FK_ETOOBIG. */
int ycsb_field_name(const struct ycsb_conf *conf, int64_t index, char *buf, size_t len);

enum ycsb_op_type {
    YCSB_OP_READ,
    YCSB_OP_UPDATE,
    YCSB_OP_INSERT,
    YCSB_OP_SCAN,
    YCSB_OP_RMW, /* read-modify-write: a read, then an update of the same key */
    YCSB_OP__COUNT,
};

/* "READ", "UPDATE", "INSERT", "SCAN", "READMODIFYWRITE" (YCSB's names). */
const char *ycsb_op_name(enum ycsb_op_type t);

/* One operation. Reads (READ, SCAN, RMW's read) name either all fields
 * (read_field < 0) or one. Writes (UPDATE, INSERT, RMW's update) cover
 * fields write_first .. write_first + nwrite - 1 with write_len[i] bytes
 * each: all fields (write_first = 0, nwrite = fieldcount) or one. The driver
 * fills values with ycsb_value_fill on its thread's rng. */
struct ycsb_op {
    enum ycsb_op_type type;
    int64_t keynum;
    char key[YCSB_KEY_MAX];
    unsigned key_len;
    int32_t scan_len;   /* SCAN: records to scan */
    int32_t read_field; /* -1: all fields */
    int32_t write_first;
    int32_t nwrite;
    uint32_t write_len[YCSB_FIELDS_MAX];
};

/* Shared by all driver threads. */
struct ycsb_workload {
    struct ycsb_conf conf;
    struct ycsb_counter keysequence; /* load: insertstart, insertstart + 1, ... */
    struct ycsb_ackctr inserts;      /* run: recordcount, recordcount + 1, ... */
    struct ycsb_sequential sequential;
    struct ycsb_discrete opchooser;
    /* Prototypes each thread copies (zeta computed once here). */
    struct ycsb_uniform key_uniform, field_chooser, fieldlen_uniform, scan_uniform;
    struct ycsb_scrambled key_scrambled;
    struct ycsb_hotspot key_hotspot;
    struct ycsb_exponential key_exponential;
    struct ycsb_latest key_latest;
    struct ycsb_zipf fieldlen_zipf, scan_zipf;
};

/* Per driver thread. */
struct ycsb_thread {
    struct ycsb_workload *w;
    struct ycsb_rng rng;
    struct ycsb_latest key_latest;
    struct ycsb_scrambled key_scrambled;
    struct ycsb_zipf fieldlen_zipf, scan_zipf;
};

/* Builds the shared state from a checked conf (copied). Cost: O(recordcount)
 * pow calls for requestdistribution=latest, O(maxscanlength) and
 * O(fieldlength) for zipfian scan and field lengths. Allocates the 1 MiB
 * insert window. Returns 0, -ENOMEM, or FK_EINVAL with err set. Main thread,
 * before any ycsb_thread_init. */
int ycsb_workload_init(struct ycsb_workload *w, const struct ycsb_conf *conf, char *err,
                       size_t errlen);
/* Frees the window. After every thread has stopped. */
void ycsb_workload_destroy(struct ycsb_workload *w);

/* Prepares thread tid: copies the generators and seeds its rng with
 * conf.seed + tid. The thread owns t afterwards. */
void ycsb_thread_init(struct ycsb_thread *t, struct ycsb_workload *w, int32_t tid);

/* Load phase (doInsert): the next insert, with every field written.
 * Returns 0. Owning thread. */
int ycsb_next_load(struct ycsb_thread *t, struct ycsb_op *op);

/* Run phase (doTransaction): the next operation. Returns 0, or FK_EAGAIN when
 * YCSB_KEY_RETRY_MAX draws all fell above the highest acknowledged insert
 * (only with a configuration whose inserted range is nearly empty). After an
 * INSERT the driver must call ycsb_insert_done. Owning thread. */
int ycsb_next_op(struct ycsb_thread *t, struct ycsb_op *op);

/* Acknowledges a run-phase insert (whatever its outcome), so "latest" and
 * the key range see it. Returns 0, FK_EINVAL for a non-INSERT op, or FK_EFULL
 * when 2^20 inserts are outstanding. Any thread. */
int ycsb_insert_done(struct ycsb_workload *w, const struct ycsb_op *op);

#endif /* YCSB_WORKLOAD_H */
