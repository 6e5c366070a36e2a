/*
 * cons_hist.h: a history of compacted log entries, kept for replicas a
 * little behind (Multi-Paxos catch-up, mpx.h; NOPaxos synchronization,
 * nop.h). Compaction drops a prefix of the in-memory log once the state
 * machine holds it; a replica that lags by more than what the log still
 * holds would otherwise need a whole state transfer, however small its
 * lag. The history keeps the compacted entries, each in its core's wire
 * form, in a byte ring: the newest `bytes` worth, oldest dropped first.
 *
 * It holds the consecutive indexes (lo, hi]. An entry whose index does not
 * follow hi starts the history again at it; one larger than the ring
 * empties it (the next add starts again). With 0 bytes nothing is kept and
 * every lookup misses.
 *
 * Memory: `bytes`, and 8 bytes a position for bytes / 64 entries (at
 * least 16). No allocation after cons_hist_init.
 *
 * Thread safety: part of a core; one thread.
 */
#ifndef CONS_HIST_H
#define CONS_HIST_H

#include <stddef.h>
#include <stdint.h>

struct cons_hist {
    /* Entry i is at byte position at[i % n], "u32 len, bytes"; positions
     * grow forever and the ring is ring[pos % cap]; the bytes in use are
     * [head, tail). */
    uint8_t *ring;
    size_t cap;
    uint64_t *at;
    uint32_t n;
    uint64_t lo, hi, head, tail;
};

/* Returns 0 or FK_ENOMEM. bytes 0: an empty history that keeps nothing. */
int cons_hist_init(struct cons_hist *h, size_t bytes);
void cons_hist_free(struct cons_hist *h);

/* Forgets every entry: the history starts again after `index`. */
void cons_hist_reset(struct cons_hist *h, uint64_t index);

/* Appends entry `index` (len bytes, len >= 1), dropping the oldest to make
 * room. */
void cons_hist_add(struct cons_hist *h, uint64_t index, const void *bytes, uint32_t len);

/* 1 when entry `index` is held. */
int cons_hist_has(const struct cons_hist *h, uint64_t index);

/* Entry `index`'s length, 0 when it is not held; its bytes are copied to
 * out only when they fit cap. */
uint32_t cons_hist_get(const struct cons_hist *h, uint64_t index, uint8_t *out, size_t cap);

#endif
