/*
 * ycsb_record.h: one YCSB record as one value, for stores whose values are
 * flat byte strings (etcd, flowkv). Every binding that stores a record in
 * one value uses this encoding, so that the figures of different stores are
 * measured on identical bytes.
 *
 * YCSB writes a record as fieldcount named fields ("field0" ... with the
 * workload's fieldnameprefix). The names follow from the index, so the
 * encoding keeps only the values, in index order, behind a small header:
 *
 *   offset  size      content
 *   0       2         magic "YR"
 *   2       1         version (YCSB_RECORD_VERSION)
 *   3       1         0 (reserved)
 *   4       4         n: number of fields, little-endian u32 (1..YCSB_FIELDS_MAX)
 *   8       4 * n     length of field i, little-endian u32
 *   8+4n    sum       the values of fields 0 .. n-1, concatenated
 *
 * A record of fieldcount fields of fieldlength bytes is therefore
 * 8 + fieldcount * (4 + fieldlength) bytes: 76 bytes for the DFI benchmark's
 * one 64-byte field, 1,048 for YCSB's default 10 x 100. A decoder accepts a
 * value only when its lengths add up to exactly its size.
 *
 * Partial writes (UPDATE with writeallfields=false) replace some fields of
 * an existing record: ycsb_record_merge builds the new value from the old
 * one, so a binding needs the old value (a read) unless the update writes
 * every field.
 *
 * Everything here is pure (no allocation, no I/O) and may be called from any
 * thread; output buffers belong to the caller.
 */
#ifndef YCSB_RECORD_H
#define YCSB_RECORD_H

#include "ycsb_run.h"

#include <stddef.h>
#include <stdint.h>

#define YCSB_RECORD_VERSION 1
#define YCSB_RECORD_HDR     8 /* magic, version, reserved, field count */

/* Bytes of a record with nfields fields holding data_bytes value bytes. */
static inline size_t ycsb_record_len(int32_t nfields, size_t data_bytes)
{
    return YCSB_RECORD_HDR + 4 * (size_t)nfields + data_bytes;
}

/* A parsed record: points into the caller's bytes, valid while they are. */
struct ycsb_record_view {
    const uint8_t *rec; /* the whole encoded value */
    size_t len;
    int32_t nfields;
};

/* The index of field name for fieldnameprefix prefix: "field12" -> 12.
 * Returns the index (0 .. fieldcount - 1), or FK_EINVAL when name is not the
 * prefix followed by a canonical decimal (no sign, no leading zero) below
 * fieldcount. */
int32_t ycsb_record_field_index(const char *prefix, const char *name, int32_t fieldcount);

/* Encodes a whole record of fieldcount fields into out (cap bytes). fields
 * (nfields entries, in any order) must name every field of the record
 * exactly once, by prefix + index. Returns the encoded length, FK_EINVAL
 * (a bad or repeated name, a missing field, fieldcount outside
 * 1..YCSB_FIELDS_MAX) or FK_ETOOBIG (cap too small). */
int64_t ycsb_record_encode(uint8_t *out, size_t cap, const char *prefix, int32_t fieldcount,
                           const struct ycsb_field *fields, int32_t nfields);

/* Checks rec (len bytes) and fills v. Returns 0 or FK_EMALFORMED (short,
 * wrong magic, version or field count, lengths that do not add up to len). */
int ycsb_record_parse(const uint8_t *rec, size_t len, struct ycsb_record_view *v);

/* Field index of a parsed record: stores a pointer into v's bytes and the
 * length. Returns 0 or FK_ENOTFOUND (index outside 0 .. nfields - 1). */
int ycsb_record_field(const struct ycsb_record_view *v, int32_t index, const uint8_t **value,
                      uint32_t *len);

/* Writes into out (cap bytes; must not overlap old) the record old (old_len
 * bytes, a valid encoding) with the given fields replaced; the other fields
 * keep their values. Names are prefix + index and must be below old's
 * field count. Returns the new length, FK_EMALFORMED (old is not a valid
 * record), FK_EINVAL (a bad or repeated name) or FK_ETOOBIG. */
int64_t ycsb_record_merge(uint8_t *out, size_t cap, const uint8_t *old, size_t old_len,
                          const char *prefix, const struct ycsb_field *fields, int32_t nfields);

#endif /* YCSB_RECORD_H */
