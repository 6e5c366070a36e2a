/*
 * flow_schema.c: tuple schemas (DFI section 3.2): fixed-size rows of
 * LP64-sized columns at natural alignment, offsets computed once at
 * declaration so a push is a single size check and a copy.
 */
#include "flow_internal.h"

#include "fk_error.h"

#include <string.h>

static int type_size(enum flow_type t, uint32_t len, uint32_t *size, uint32_t *align)
{
    switch (t) {
    case FLOW_INT8:
        *size = *align = 1;
        return 0;
    case FLOW_INT16:
        *size = *align = 2;
        return 0;
    case FLOW_INT32:
    case FLOW_FLOAT:
        *size = *align = 4;
        return 0;
    case FLOW_INT64:
    case FLOW_UINT64:
    case FLOW_DOUBLE:
        *size = *align = 8;
        return 0;
    case FLOW_BYTES:
        if (len == 0 || len > FLOW_TUPLE_MAX)
            return FK_EINVAL;
        *size = len;
        *align = 1;
        return 0;
    }
    return FK_EINVAL;
}

int flow_schema_init(struct flow_schema *s, const struct flow_column *cols, int n, const char *key)
{
    if (s == NULL || cols == NULL || key == NULL || n <= 0 || n > FLOW_COLS_MAX)
        return FK_EINVAL;
    memset(s, 0, sizeof(*s));
    uint64_t off = 0;
    int key_idx = -1;
    for (int i = 0; i < n; i++) {
        uint32_t size, align;
        const char *name = cols[i].name;
        if (name == NULL || name[0] == '\0' || strlen(name) >= FLOW_COLNAME_MAX)
            return FK_EINVAL;
        for (int j = 0; j < i; j++)
            if (strcmp(s->cols[j].name, name) == 0)
                return FK_EINVAL;
        if (type_size(cols[i].type, cols[i].len, &size, &align) < 0)
            return FK_EINVAL;
        off = (off + align - 1) / align * align;
        strcpy(s->cols[i].name, name);
        s->cols[i].type = cols[i].type;
        s->cols[i].size = size;
        s->cols[i].offset = (uint32_t)off;
        off += size;
        if (off > FLOW_TUPLE_MAX)
            return FK_ETOOBIG;
        if (strcmp(name, key) == 0)
            key_idx = i;
    }
    if (key_idx < 0)
        return FK_EINVAL;
    off = (off + 7) / 8 * 8;
    if (off > FLOW_TUPLE_MAX)
        return FK_ETOOBIG;
    s->ncols = (uint32_t)n;
    s->key = (uint32_t)key_idx;
    s->tuple_size = (uint32_t)off;
    return 0;
}

int flow_schema_offset(const struct flow_schema *s, const char *name)
{
    if (s == NULL || name == NULL)
        return FK_EINVAL;
    for (uint32_t i = 0; i < s->ncols && i < FLOW_COLS_MAX; i++)
        if (strcmp(s->cols[i].name, name) == 0)
            return (int)s->cols[i].offset;
    return FK_ENOTFOUND;
}
