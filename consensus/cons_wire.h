/*
 * cons_wire.h: byte layouts shared by the cores' wire messages, persisted
 * records and snapshots.
 *
 * Every message starts with struct cons_wire_hdr. Bodies are sequences of
 * fixed-layout little-endian fields written with cons_wbuf and read with
 * cons_rbuf; variable parts (keys, values, entries) are length-prefixed and
 * bounded by the limits in cons.h. A reader never reads past its end: any
 * shortfall, bad length or unknown type makes it fail with FK_EMALFORMED,
 * and the whole message is rejected before the core acts on any of it.
 *
 * Thread safety: pure functions over caller buffers.
 */
#ifndef CONS_WIRE_H
#define CONS_WIRE_H

#include "cons.h"

#include <stdint.h>

#define CONS_WIRE_MAGIC 0x4b46u /* "FK" */
#define CONS_WIRE_VERSION                                                                          \
    3 /* 2: ops carry u32 value lengths (values up to 1 MiB); 3: NOPaxos moves state by NOP_XFER   \
       */

enum cons_proto { CONS_PROTO_MPX = 1, CONS_PROTO_NOP = 2 };

/* The common message header (24 bytes). `term` is the ballot (Multi-Paxos)
 * or the view (NOPaxos); `from` the sending replica or 0xffffffff for a
 * client. body_len counts the bytes after the header. */
struct cons_wire_hdr {
    uint16_t magic;
    uint8_t version;
    uint8_t proto; /* enum cons_proto */
    uint8_t type;  /* per protocol */
    uint8_t pad[3];
    uint32_t from;
    uint32_t body_len;
    uint64_t term;
} __attribute__((packed));
_Static_assert(sizeof(struct cons_wire_hdr) == 24, "wire header is 24 bytes");

#define CONS_FROM_CLIENT 0xffffffffu

/* The fixed part of an encoded operation (32 bytes), then key, val, exp. */
struct cons_wire_op {
    uint64_t client_id;
    uint64_t req_no;
    uint8_t type;
    uint8_t scan_limit;
    uint16_t key_len;
    uint32_t val_len, exp_len;
    uint8_t scan_flags;
    uint8_t pad[3];
} __attribute__((packed));
_Static_assert(sizeof(struct cons_wire_op) == 32, "wire op header is 32 bytes");

/* The fixed part of an encoded reply (24 bytes), then len data bytes. */
struct cons_wire_reply {
    uint64_t client_id;
    uint64_t req_no;
    int32_t status;
    uint32_t len;
} __attribute__((packed));
_Static_assert(sizeof(struct cons_wire_reply) == 24, "wire reply header is 24 bytes");

/* Largest encoded op and reply; a batch of ops in one entry. */
#define CONS_WIRE_OP_MAX    (sizeof(struct cons_wire_op) + CONS_KEY_MAX + 2 * (size_t)CONS_VAL_MAX)
#define CONS_WIRE_REPLY_MAX (sizeof(struct cons_wire_reply) + CONS_REPLY_MAX)

/* A bounded writer. On overflow it stops writing and remembers FK_ETOOBIG. */
struct cons_wbuf {
    uint8_t *p;
    size_t len, cap;
    int err;
};

/* A bounded reader. On underflow it returns zeros and remembers
 * FK_EMALFORMED; callers check err once at the end. */
struct cons_rbuf {
    const uint8_t *p;
    size_t off, len;
    int err;
};

void cons_wbuf_init(struct cons_wbuf *w, uint8_t *p, size_t cap);
void cons_w_bytes(struct cons_wbuf *w, const void *src, size_t n);
void cons_w_u8(struct cons_wbuf *w, uint8_t v);
void cons_w_u16(struct cons_wbuf *w, uint16_t v);
void cons_w_u32(struct cons_wbuf *w, uint32_t v);
void cons_w_u64(struct cons_wbuf *w, uint64_t v);

void cons_rbuf_init(struct cons_rbuf *r, const uint8_t *p, size_t len);
/* Returns a pointer to the next n bytes (or NULL and sets err). */
const uint8_t *cons_r_bytes(struct cons_rbuf *r, size_t n);
uint8_t cons_r_u8(struct cons_rbuf *r);
uint16_t cons_r_u16(struct cons_rbuf *r);
uint32_t cons_r_u32(struct cons_rbuf *r);
uint64_t cons_r_u64(struct cons_rbuf *r);
/* FK_EMALFORMED unless every byte was consumed without error. */
int cons_r_done(const struct cons_rbuf *r);

/* Writes the header for a message of the given type; the body follows.
 * cons_wire_finish() fills body_len once the body is written. */
void cons_wire_begin(struct cons_wbuf *w, uint8_t proto, uint8_t type, uint32_t from,
                     uint64_t term);
/* Returns the message length, or FK_ETOOBIG when the writer overflowed. */
int cons_wire_finish(struct cons_wbuf *w);
/* Checks magic, version, proto, type < ntypes and body_len == len - 24.
 * Fills *h and positions r at the body. FK_EMALFORMED on any mismatch. */
int cons_wire_open(const uint8_t *buf, size_t len, uint8_t proto, uint8_t ntypes,
                   struct cons_wire_hdr *h, struct cons_rbuf *r);

/* Encodes/decodes one op. Decoding checks type, lengths against the limits
 * and that the fields a type needs are present: FK_EMALFORMED otherwise.
 * An op whose bytes do not fit inline is decoded in place: op->ext points
 * into r's buffer, valid while it is (cons_op_store keeps it longer). */
void cons_wire_put_op(struct cons_wbuf *w, const struct cons_op *op);
int cons_wire_get_op(struct cons_rbuf *r, struct cons_op *op);
void cons_wire_put_reply(struct cons_wbuf *w, const struct cons_reply *rep);
/* Decodes a reply's fields into *rep (not its data, nor rep->data and
 * cap) and points *data at its rep->len bytes in r's buffer. */
int cons_wire_get_reply(struct cons_rbuf *r, struct cons_reply *rep, const uint8_t **data);
/* Skips one encoded op after validating it (no copy); returns its key,
 * value and expected bytes (>= 0). */
int cons_wire_skip_op(struct cons_rbuf *r);

#endif /* CONS_WIRE_H */
