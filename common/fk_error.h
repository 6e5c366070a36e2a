/*
 * fk_error.h: error codes shared by every flowkv module.
 *
 * Contract. A flowkv function that can fail returns a negative int:
 *   - a negated errno value (-ENOMEM, -ECONNREFUSED, ...) for a failure the
 *     operating system reported, or
 *   - one of the FK_E* codes below, which live in the reserved range
 *     [FK_ERR_BASE - 99, FK_ERR_BASE] so they never collide with an errno
 *     (the same trick as LMDB's MDB_KEYEXIST..MDB_LAST_ERRCODE range).
 * Zero or a positive value means success. Every code is named once, in the
 * FK_ERRNO_MAP X-macro, which generates the enum and the message table.
 *
 * Thread safety: fk_strerror() and fk_err_name() are pure and may be called
 * from any thread; the strings they return are static and never freed.
 */
#ifndef FK_ERROR_H
#define FK_ERROR_H

#define FK_ERR_BASE (-30900)

/* X(name, offset below FK_ERR_BASE, message). Append only: codes travel in
 * wire replies, so an existing number must never change meaning. */
#define FK_ERRNO_MAP(X)                                                                            \
    X(FK_EINVAL, 0, "invalid argument")                                                            \
    X(FK_ENOMEM, 1, "out of memory or pool exhausted")                                             \
    X(FK_ETIMEDOUT, 2, "timed out")                                                                \
    X(FK_ECLOSED, 3, "handle or flow is closed")                                                   \
    X(FK_EPOISONED, 4, "handle hit a fatal error earlier and is unusable")                         \
    X(FK_EUNKNOWN_FLOW, 5, "no flow with that name")                                               \
    X(FK_ESCHEMA, 6, "schema mismatch")                                                            \
    X(FK_ETOOBIG, 7, "too large")                                                                  \
    X(FK_EWRONG_THREAD, 8, "called from a thread that does not own the handle")                    \
    X(FK_EEND, 9, "end of flow")                                                                   \
    X(FK_EGAP, 10, "sequence gap")                                                                 \
    X(FK_EMALFORMED, 11, "malformed message")                                                      \
    X(FK_ENOTFOUND, 12, "not found")                                                               \
    X(FK_ENOTLEADER, 13, "replica is not the leader")                                              \
    X(FK_EFULL, 14, "no space left (queue, ring or storage map full)")                             \
    X(FK_EAUTH, 15, "authentication failed (wrong cluster token)")                                 \
    X(FK_ESTORAGE, 16, "storage failure")                                                          \
    X(FK_EUNREACHABLE, 17, "peer unreachable")                                                     \
    X(FK_ECONFIG, 18, "invalid configuration")                                                     \
    X(FK_EEXIST, 19, "already exists")                                                             \
    X(FK_EBUSY, 20, "resource busy")                                                               \
    X(FK_EAGAIN, 21, "try again")                                                                  \
    X(FK_ECASFAIL, 22, "compare-and-swap expected value did not match")                            \
    X(FK_ENODEV, 23, "no usable device")                                                           \
    X(FK_EPROTO, 24, "protocol violation by peer")                                                 \
    X(FK_ESESSION, 25, "sequencer session changed")                                                \
    X(FK_EVERSION, 26, "incompatible version")                                                     \
    X(FK_EEXPIRED, 27, "client session expired (evicted from the client table)")                   \
    X(FK_EUNKEPT, 28, "reply not kept (a read logged without being executed)")                     \
    X(FK_EKEYSIZE, 29, "key over the size limit of 511 bytes")                                     \
    X(FK_EVALSIZE, 30, "value over the size limit of 1048576 bytes")                               \
    X(FK_EQUOTA, 31, "quota exceeded")                                                             \
    X(FK_ENOTSUP, 32, "not supported")

enum fk_err {
#define FK__ERR_ENUM(name, off, msg) name = FK_ERR_BASE - (off),
    FK_ERRNO_MAP(FK__ERR_ENUM)
#undef FK__ERR_ENUM
};

/* The lowest code in use; every FK_E* code is in [FK_ERR_LAST, FK_ERR_BASE]. */
#define FK_ERR_LAST FK_ENOTSUP
_Static_assert(FK_ERR_LAST > FK_ERR_BASE - 100, "flowkv error range overflows its 100 codes");

/* Returns a human-readable message for err: an FK_E* code, a negated errno,
 * or 0 ("success"). Unknown values yield "unknown error". Never NULL. */
const char *fk_strerror(int err);

/* Returns the symbolic name ("FK_EGAP", "ECONNREFUSED", "OK") of err, for logs
 * and test messages. Unknown values yield "E?". Never NULL. */
const char *fk_err_name(int err);

/* Nonzero when err lies in flowkv's reserved range. */
static inline int fk_err_is_flowkv(int err)
{
    return err <= FK_ERR_BASE && err >= FK_ERR_LAST;
}

#endif /* FK_ERROR_H */
