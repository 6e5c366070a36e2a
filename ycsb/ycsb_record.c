/* ycsb_record.c: the one-value record encoding; see ycsb_record.h. */
#include "ycsb_record.h"

#include "fk_error.h"

#include <assert.h>
#include <string.h>

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int32_t ycsb_record_field_index(const char *prefix, const char *name, int32_t fieldcount)
{
    if (prefix == NULL || name == NULL)
        return FK_EINVAL;
    size_t plen = strlen(prefix);
    if (strncmp(name, prefix, plen) != 0)
        return FK_EINVAL;
    const char *d = name + plen;
    if (*d < '0' || *d > '9' || (d[0] == '0' && d[1] != '\0'))
        return FK_EINVAL;
    int64_t idx = 0;
    for (; *d != '\0'; d++) {
        if (*d < '0' || *d > '9' || idx >= fieldcount)
            return FK_EINVAL;
        idx = idx * 10 + (*d - '0');
    }
    return idx < fieldcount ? (int32_t)idx : FK_EINVAL;
}

/* Sorts fields by index into by_index (fieldcount slots, NULL = not given).
 * Returns 0 or FK_EINVAL for a bad or repeated name. */
static int index_fields(const struct ycsb_field **by_index, const char *prefix, int32_t fieldcount,
                        const struct ycsb_field *fields, int32_t nfields)
{
    for (int32_t i = 0; i < fieldcount; i++)
        by_index[i] = NULL;
    if (nfields < 0 || (nfields > 0 && fields == NULL))
        return FK_EINVAL;
    for (int32_t i = 0; i < nfields; i++) {
        int32_t idx = ycsb_record_field_index(prefix, fields[i].name, fieldcount);
        if (idx < 0 || by_index[idx] != NULL || (fields[i].len > 0 && fields[i].value == NULL))
            return FK_EINVAL;
        by_index[idx] = &fields[i];
    }
    return 0;
}

/* Writes a record of n fields: field i from by_index[i] when given, else
 * from old (NULL only when every field is given). Returns the length or
 * FK_ETOOBIG. */
static int64_t write_record(uint8_t *out, size_t cap, int32_t n,
                            const struct ycsb_field *const *by_index,
                            const struct ycsb_record_view *old)
{
    size_t data = 0;
    for (int32_t i = 0; i < n; i++) {
        if (by_index[i] != NULL) {
            data += by_index[i]->len;
        } else {
            uint32_t len;
            const uint8_t *v;
            int rc = ycsb_record_field(old, i, &v, &len);
            assert(rc == 0);
            (void)rc;
            data += len;
        }
    }
    size_t total = ycsb_record_len(n, data);
    if (total > cap || total > INT64_MAX)
        return FK_ETOOBIG;
    memcpy(out, "YR", 2);
    out[2] = YCSB_RECORD_VERSION;
    out[3] = 0;
    put_u32(out + 4, (uint32_t)n);
    uint8_t *p = out + YCSB_RECORD_HDR + 4 * (size_t)n;
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *v;
        uint32_t len;
        if (by_index[i] != NULL) {
            v = by_index[i]->value;
            len = by_index[i]->len;
        } else {
            ycsb_record_field(old, i, &v, &len);
        }
        put_u32(out + YCSB_RECORD_HDR + 4 * (size_t)i, len);
        if (len > 0)
            memcpy(p, v, len);
        p += len;
    }
    assert((size_t)(p - out) == total);
    return (int64_t)total;
}

int64_t ycsb_record_encode(uint8_t *out, size_t cap, const char *prefix, int32_t fieldcount,
                           const struct ycsb_field *fields, int32_t nfields)
{
    const struct ycsb_field *by_index[YCSB_FIELDS_MAX];
    if (out == NULL || fieldcount < 1 || fieldcount > YCSB_FIELDS_MAX || nfields != fieldcount)
        return FK_EINVAL;
    int rc = index_fields(by_index, prefix, fieldcount, fields, nfields);
    if (rc < 0)
        return rc;
    /* nfields == fieldcount distinct indexes below fieldcount: all given. */
    return write_record(out, cap, fieldcount, by_index, NULL);
}

int ycsb_record_parse(const uint8_t *rec, size_t len, struct ycsb_record_view *v)
{
    if (rec == NULL || len < YCSB_RECORD_HDR || memcmp(rec, "YR", 2) != 0 ||
        rec[2] != YCSB_RECORD_VERSION || rec[3] != 0)
        return FK_EMALFORMED;
    uint32_t n = get_u32(rec + 4);
    if (n < 1 || n > YCSB_FIELDS_MAX || len < ycsb_record_len((int32_t)n, 0))
        return FK_EMALFORMED;
    size_t data = 0;
    for (uint32_t i = 0; i < n; i++)
        data += get_u32(rec + YCSB_RECORD_HDR + 4 * (size_t)i); /* <= 256 * 2^32: no overflow */
    if (ycsb_record_len((int32_t)n, data) != len)
        return FK_EMALFORMED;
    *v = (struct ycsb_record_view){.rec = rec, .len = len, .nfields = (int32_t)n};
    return 0;
}

int ycsb_record_field(const struct ycsb_record_view *v, int32_t index, const uint8_t **value,
                      uint32_t *len)
{
    if (v == NULL || index < 0 || index >= v->nfields)
        return FK_ENOTFOUND;
    size_t off = ycsb_record_len(v->nfields, 0);
    for (int32_t i = 0; i < index; i++)
        off += get_u32(v->rec + YCSB_RECORD_HDR + 4 * (size_t)i);
    *len = get_u32(v->rec + YCSB_RECORD_HDR + 4 * (size_t)index);
    *value = v->rec + off;
    assert(off + *len <= v->len);
    return 0;
}

int64_t ycsb_record_merge(uint8_t *out, size_t cap, const uint8_t *old, size_t old_len,
                          const char *prefix, const struct ycsb_field *fields, int32_t nfields)
{
    struct ycsb_record_view v;
    const struct ycsb_field *by_index[YCSB_FIELDS_MAX];
    if (out == NULL)
        return FK_EINVAL;
    int rc = ycsb_record_parse(old, old_len, &v);
    if (rc < 0)
        return rc;
    rc = index_fields(by_index, prefix, v.nfields, fields, nfields);
    if (rc < 0)
        return rc;
    return write_record(out, cap, v.nfields, by_index, &v);
}
