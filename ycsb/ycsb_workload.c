/* ycsb_workload.c: CoreWorkload's operation stream; see ycsb_workload.h. */
#include "ycsb_workload.h"

#include "fk_error.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char *ycsb_op_name(enum ycsb_op_type t)
{
    static const char *const names[YCSB_OP__COUNT] = {"READ", "UPDATE", "INSERT", "SCAN",
                                                      "READMODIFYWRITE"};
    return (unsigned)t < YCSB_OP__COUNT ? names[t] : "?";
}

unsigned ycsb_key_name(char key[YCSB_KEY_MAX], int64_t keynum, int32_t zeropadding, bool ordered)
{
    char digits[24];
    int64_t v = ordered ? keynum : ycsb_fnvhash64(keynum);
    int n = snprintf(digits, sizeof digits, "%" PRId64, v); /* Long.toString */
    assert(n > 0 && n < (int)sizeof digits);
    assert(zeropadding <= YCSB_ZEROPAD_MAX);
    int fill = zeropadding > n ? zeropadding - n : 0;
    memcpy(key, "user", 4);
    memset(key + 4, '0', (size_t)fill);
    memcpy(key + 4 + fill, digits, (size_t)n + 1);
    return (unsigned)(4 + fill + n);
}

int ycsb_field_name(const struct ycsb_conf *conf, int64_t index, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s%" PRId64, conf->fieldnameprefix, index);
    if (n < 0 || (size_t)n >= len)
        return FK_ETOOBIG;
    return n;
}

/* ---- setup ---------------------------------------------------------------- */

static int init_keychooser(struct ycsb_workload *w, char *err, size_t errlen)
{
    const struct ycsb_conf *c = &w->conf;
    int64_t lo = c->insertstart, hi = c->insertstart + c->insertcount - 1;
    int rc = 0;
    switch (c->requestdist) {
    case YCSB_DIST_UNIFORM:
        rc = ycsb_uniform_init(&w->key_uniform, lo, hi);
        break;
    case YCSB_DIST_SEQUENTIAL:
        rc = ycsb_sequential_init(&w->sequential, lo, hi);
        break;
    case YCSB_DIST_ZIPFIAN: {
        /* YCSB sizes the keyspace for the inserts it expects (the 2.0 is its
         * "fudge factor") so that the popular keys do not move as it grows. */
        int32_t expected = ycsb_java_d2i((double)c->operationcount * c->insertproportion * 2.0);
        ycsb_scrambled_init(&w->key_scrambled, lo, c->insertstart + c->insertcount + expected);
        break;
    }
    case YCSB_DIST_LATEST:
        ycsb_latest_init(&w->key_latest, &w->inserts);
        break;
    case YCSB_DIST_HOTSPOT:
        rc = ycsb_hotspot_init(&w->key_hotspot, lo, hi, c->hotspotdatafraction,
                               c->hotspotopnfraction);
        if (rc < 0)
            snprintf(err, errlen,
                     "hotspotdatafraction: the hot or cold set of [%" PRId64 ", %" PRId64
                     "] is empty but has operations",
                     lo, hi);
        return rc;
    case YCSB_DIST_EXPONENTIAL:
        rc = ycsb_exponential_init(&w->key_exponential, c->exponential_percentile,
                                   (double)c->recordcount * c->exponential_frac);
        break;
    default:
        rc = FK_EINVAL;
    }
    if (rc < 0)
        snprintf(err, errlen, "requestdistribution: cannot build the key chooser");
    return rc;
}

static int init_choosers(struct ycsb_workload *w, char *err, size_t errlen)
{
    const struct ycsb_conf *c = &w->conf;
    ycsb_discrete_init(&w->opchooser);
    const double weights[YCSB_OP__COUNT] = {c->readproportion, c->updateproportion,
                                            c->insertproportion, c->scanproportion,
                                            c->readmodifywriteproportion};
    for (int op = 0; op < YCSB_OP__COUNT; op++)
        if (weights[op] > 0)
            ycsb_discrete_add(&w->opchooser, weights[op], op);
    int rc = ycsb_uniform_init(&w->field_chooser, 0, c->fieldcount - 1);
    if (rc == 0 && c->fieldlengthdist == YCSB_DIST_UNIFORM)
        rc = ycsb_uniform_init(&w->fieldlen_uniform, c->minfieldlength, c->fieldlength);
    if (rc == 0 && c->fieldlengthdist == YCSB_DIST_ZIPFIAN)
        ycsb_zipf_init(&w->fieldlen_zipf, c->minfieldlength, c->fieldlength, YCSB_ZIPFIAN_CONSTANT);
    if (rc == 0 && c->scanlengthdist == YCSB_DIST_UNIFORM)
        rc = ycsb_uniform_init(&w->scan_uniform, c->minscanlength, c->maxscanlength);
    if (rc == 0 && c->scanlengthdist == YCSB_DIST_ZIPFIAN)
        ycsb_zipf_init(&w->scan_zipf, c->minscanlength, c->maxscanlength, YCSB_ZIPFIAN_CONSTANT);
    if (rc < 0)
        snprintf(err, errlen, "fieldcount: cannot build the field choosers");
    return rc;
}

int ycsb_workload_init(struct ycsb_workload *w, const struct ycsb_conf *conf, char *err,
                       size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->conf = *conf;
    ycsb_counter_init(&w->keysequence, conf->insertstart);
    int rc = ycsb_ackctr_init(&w->inserts, conf->recordcount);
    if (rc < 0) {
        snprintf(err, errlen, "cannot allocate the insert window: %s", fk_strerror(rc));
        return rc;
    }
    rc = init_choosers(w, err, errlen);
    if (rc == 0 && conf->dotransactions)
        rc = init_keychooser(w, err, errlen);
    if (rc < 0)
        ycsb_ackctr_destroy(&w->inserts);
    return rc;
}

void ycsb_workload_destroy(struct ycsb_workload *w)
{
    ycsb_ackctr_destroy(&w->inserts);
}

void ycsb_thread_init(struct ycsb_thread *t, struct ycsb_workload *w, int32_t tid)
{
    t->w = w;
    ycsb_rng_seed(&t->rng, w->conf.seed + (uint64_t)tid);
    t->key_latest = w->key_latest;
    t->key_scrambled = w->key_scrambled;
    t->fieldlen_zipf = w->fieldlen_zipf;
    t->scan_zipf = w->scan_zipf;
}

/* ---- per operation --------------------------------------------------------- */

static uint32_t next_field_len(struct ycsb_thread *t)
{
    const struct ycsb_conf *c = &t->w->conf;
    switch (c->fieldlengthdist) {
    case YCSB_DIST_UNIFORM:
        return (uint32_t)ycsb_uniform_next(&t->w->fieldlen_uniform, &t->rng);
    case YCSB_DIST_ZIPFIAN:
        return (uint32_t)ycsb_zipf_next(&t->fieldlen_zipf, &t->rng);
    default:
        return (uint32_t)c->fieldlength;
    }
}

static int32_t next_field(struct ycsb_thread *t)
{
    return (int32_t)ycsb_uniform_next(&t->w->field_chooser, &t->rng);
}

/* buildValues (all fields) or buildSingleValue (a chosen field). */
static void build_values(struct ycsb_thread *t, struct ycsb_op *op, bool all)
{
    if (all) {
        op->write_first = 0;
        op->nwrite = (int32_t)t->w->conf.fieldcount;
        for (int32_t i = 0; i < op->nwrite; i++)
            op->write_len[i] = next_field_len(t);
        return;
    }
    op->write_first = next_field(t);
    op->nwrite = 1;
    op->write_len[0] = next_field_len(t);
}

static void set_key(struct ycsb_thread *t, struct ycsb_op *op, int64_t keynum)
{
    const struct ycsb_conf *c = &t->w->conf;
    op->keynum = keynum;
    op->key_len = ycsb_key_name(op->key, keynum, c->zeropadding, c->ordered_inserts);
}

static void clear_op(struct ycsb_op *op, enum ycsb_op_type type)
{
    op->type = type;
    op->scan_len = 0;
    op->read_field = -1;
    op->write_first = 0;
    op->nwrite = 0;
}

int ycsb_next_load(struct ycsb_thread *t, struct ycsb_op *op)
{
    clear_op(op, YCSB_OP_INSERT);
    /* doInsert: keysequence.nextValue().intValue(). */
    int64_t keynum = ycsb_java_l2i(ycsb_counter_next(&t->w->keysequence));
    set_key(t, op, keynum);
    build_values(t, op, true);
    return 0;
}

static int64_t draw_key(struct ycsb_thread *t)
{
    struct ycsb_workload *w = t->w;
    switch (w->conf.requestdist) {
    case YCSB_DIST_UNIFORM:
        return ycsb_uniform_next(&w->key_uniform, &t->rng);
    case YCSB_DIST_ZIPFIAN:
        return ycsb_scrambled_next(&t->key_scrambled, &t->rng);
    case YCSB_DIST_LATEST:
        return ycsb_latest_next(&t->key_latest, &t->rng);
    case YCSB_DIST_HOTSPOT:
        return ycsb_hotspot_next(&w->key_hotspot, &t->rng);
    case YCSB_DIST_SEQUENTIAL:
        return ycsb_sequential_next(&w->sequential);
    default:
        assert(0 && "key distribution");
        return 0;
    }
}

/* CoreWorkload.nextKeynum, with a bound on the redraws. */
static int next_keynum(struct ycsb_thread *t, int64_t *out)
{
    struct ycsb_workload *w = t->w;
    for (int i = 0; i < YCSB_KEY_RETRY_MAX; i++) {
        int64_t last = ycsb_ackctr_last(&w->inserts), k;
        if (w->conf.requestdist == YCSB_DIST_EXPONENTIAL) {
            double x = ycsb_exponential_next(&w->key_exponential, &t->rng);
            k = last - ycsb_java_d2i(x);
            if (k >= 0) {
                *out = k;
                return 0;
            }
        } else {
            k = ycsb_java_l2i(draw_key(t));
            if (k <= last) {
                *out = k;
                return 0;
            }
        }
    }
    return FK_EAGAIN;
}

static int32_t next_scan_len(struct ycsb_thread *t)
{
    if (t->w->conf.scanlengthdist == YCSB_DIST_ZIPFIAN)
        return ycsb_java_l2i(ycsb_zipf_next(&t->scan_zipf, &t->rng));
    return ycsb_java_l2i(ycsb_uniform_next(&t->w->scan_uniform, &t->rng));
}

int ycsb_next_op(struct ycsb_thread *t, struct ycsb_op *op)
{
    const struct ycsb_conf *c = &t->w->conf;
    enum ycsb_op_type type = (enum ycsb_op_type)ycsb_discrete_next(&t->w->opchooser, &t->rng);
    clear_op(op, type);
    if (type == YCSB_OP_INSERT) {
        set_key(t, op, ycsb_ackctr_next(&t->w->inserts));
        build_values(t, op, true);
        return 0;
    }
    int64_t keynum;
    int rc = next_keynum(t, &keynum);
    if (rc < 0)
        return rc;
    set_key(t, op, keynum);
    switch (type) {
    case YCSB_OP_READ:
        if (!c->readallfields)
            op->read_field = next_field(t);
        break;
    case YCSB_OP_UPDATE:
        build_values(t, op, c->writeallfields);
        break;
    case YCSB_OP_SCAN:
        op->scan_len = next_scan_len(t);
        if (!c->readallfields)
            op->read_field = next_field(t);
        break;
    case YCSB_OP_RMW:
        if (!c->readallfields)
            op->read_field = next_field(t);
        build_values(t, op, c->writeallfields);
        break;
    default:
        assert(0 && "operation type");
    }
    return 0;
}

int ycsb_insert_done(struct ycsb_workload *w, const struct ycsb_op *op)
{
    if (op->type != YCSB_OP_INSERT)
        return FK_EINVAL;
    return ycsb_ackctr_ack(&w->inserts, op->keynum);
}
