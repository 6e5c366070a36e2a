/*
 * flow_combiner.c: the combiner flow's target side (DFI section 3.3): an N:1
 * flow whose target aggregates one column per key group (SUM, COUNT, MIN,
 * MAX) as tuples arrive, straight out of the ring (no copy of the tuple).
 *
 * The group table is open addressing on the key bytes (xxHash64), sized at
 * open: FLOW_GROUPS_MAX rows of one tuple each plus a used flag, so no
 * allocation happens while consuming. A group row is a tuple of the flow's
 * schema: the key column holds the group, the aggregated column the result.
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_time.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct comb {
    uint32_t ngroups;
    uint32_t key_off, key_size;
    uint32_t col_off, col_type;
    uint8_t used[FLOW_GROUPS_MAX];
    uint32_t order[FLOW_GROUPS_MAX]; /* table slot of the i-th group, for results */
    uint8_t *table;                  /* FLOW_GROUPS_MAX * tuple_size */
    uint8_t *rows;                   /* results, packed */
};

int flow__comb_init(flow_target *t)
{
    struct comb *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return FK_ENOMEM;
    const struct flow_schema *s = &t->desc.schema;
    c->key_off = s->cols[s->key].offset;
    c->key_size = s->cols[s->key].size;
    for (uint32_t i = 0; i < s->ncols; i++) {
        if (strcmp(s->cols[i].name, t->desc.opts.agg_column) == 0) {
            c->col_off = s->cols[i].offset;
            c->col_type = s->cols[i].type;
        }
    }
    c->table = calloc(FLOW_GROUPS_MAX, s->tuple_size);
    c->rows = calloc(FLOW_GROUPS_MAX, s->tuple_size);
    t->comb = c;
    if (c->table == NULL || c->rows == NULL)
        return FK_ENOMEM;
    return 0;
}

void flow__comb_free(flow_target *t)
{
    struct comb *c = t->comb;
    free(c->table);
    free(c->rows);
    free(c);
    t->comb = NULL;
}

/* Reads the aggregated column as a double or an int64 (by type). */
static int is_float(uint32_t type)
{
    return type == FLOW_FLOAT || type == FLOW_DOUBLE;
}

static double get_f(const uint8_t *p, uint32_t type)
{
    if (type == FLOW_FLOAT) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    double d;
    memcpy(&d, p, 8);
    return d;
}

static void put_f(uint8_t *p, uint32_t type, double v)
{
    if (type == FLOW_FLOAT) {
        float f = (float)v;
        memcpy(p, &f, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

static int64_t get_i(const uint8_t *p, uint32_t type)
{
    switch (type) {
    case FLOW_INT8:
        return *(const int8_t *)p;
    case FLOW_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case FLOW_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

static void put_i(uint8_t *p, uint32_t type, int64_t v)
{
    switch (type) {
    case FLOW_INT8:
        *(int8_t *)p = (int8_t)v;
        return;
    case FLOW_INT16: {
        int16_t x = (int16_t)v;
        memcpy(p, &x, 2);
        return;
    }
    case FLOW_INT32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        return;
    }
    default:
        memcpy(p, &v, 8);
    }
}

/* Folds one tuple into its group's row. */
static void fold(uint8_t *row, const uint8_t *tuple, struct comb *c, enum flow_agg agg, int fresh)
{
    uint8_t *dst = row + c->col_off;
    const uint8_t *src = tuple + c->col_off;
    if (agg == FLOW_COUNT) {
        int64_t n = fresh ? 1 : get_i(dst, c->col_type) + 1;
        if (is_float(c->col_type))
            put_f(dst, c->col_type, fresh ? 1.0 : get_f(dst, c->col_type) + 1.0);
        else
            put_i(dst, c->col_type, n);
        return;
    }
    if (fresh)
        return; /* the row is a copy of the tuple: its value is the aggregate so far */
    if (is_float(c->col_type)) {
        double a = get_f(dst, c->col_type), b = get_f(src, c->col_type);
        double r = agg == FLOW_SUM ? a + b : agg == FLOW_MIN ? (b < a ? b : a) : (b > a ? b : a);
        put_f(dst, c->col_type, r);
    } else {
        int64_t a = get_i(dst, c->col_type), b = get_i(src, c->col_type);
        int64_t r = agg == FLOW_SUM   ? (int64_t)((uint64_t)a + (uint64_t)b)
                    : agg == FLOW_MIN ? (b < a ? b : a)
                                      : (b > a ? b : a);
        put_i(dst, c->col_type, r);
    }
}

static int aggregate(flow_target *t, const uint8_t *tuple)
{
    struct comb *c = t->comb;
    uint32_t ts = t->desc.schema.tuple_size;
    uint64_t h = XXH64(tuple + c->key_off, c->key_size, 0);
    for (uint32_t probe = 0; probe < FLOW_GROUPS_MAX; probe++) {
        uint32_t i = (uint32_t)((h + probe) % FLOW_GROUPS_MAX);
        uint8_t *row = c->table + (uint64_t)i * ts;
        if (c->used[i] && memcmp(row + c->key_off, tuple + c->key_off, c->key_size) == 0) {
            fold(row, tuple, c, t->desc.opts.agg, 0);
            return 0;
        }
        if (!c->used[i]) {
            c->used[i] = 1;
            c->order[c->ngroups++] = i;
            memcpy(row, tuple, ts);
            fold(row, tuple, c, t->desc.opts.agg, 1);
            return 0;
        }
    }
    return FK_ENOMEM;
}

int flow_combiner_result(flow_target *t, const void **rows, uint64_t timeout_ns)
{
    if (t == NULL || rows == NULL)
        return FK_EINVAL;
    if (!FLOW__OWNER_OK(t))
        return FK_EWRONG_THREAD;
    if (t->comb == NULL)
        return FK_EINVAL;
    struct comb *c = t->comb;
    uint32_t ts = t->desc.schema.tuple_size;
    uint64_t deadline = fk_now_ns() + timeout_ns;
    for (;;) {
        struct flow_item it;
        t->bell = fab_node_doorbell(flow__fab(t->node));
        int rc = flow__ring_next(t, &it);
        if (rc == 0) {
            rc = aggregate(t, it.tuple);
            if (rc < 0)
                return rc;
            continue;
        }
        if (rc == FK_EEND)
            break;
        if (rc != FK_EAGAIN)
            return rc;
        if (flow__wait(t, deadline) < 0)
            return FK_ETIMEDOUT;
    }
    for (uint32_t g = 0; g < c->ngroups; g++)
        memcpy(c->rows + (uint64_t)g * ts, c->table + (uint64_t)c->order[g] * ts, ts);
    *rows = c->rows;
    return (int)c->ngroups;
}
