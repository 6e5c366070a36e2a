/*
 * lin.h: a linearizability checker for key-value histories.
 *
 * Wing and Gong's search with Lowe's just-in-time linearization and
 * memoization of (linearized set, state) pairs ("Testing for
 * linearizability", Concurrency and Computation 2017), run per key: the
 * key-value store is a product of independent registers, so a history is
 * linearizable iff each key's projection is (Herlihy and Wing's locality).
 *
 * Values are 64-bit tokens (0 = key absent). Scans are projected onto the
 * keys they cover: the range runs from the start key (or the key after
 * it, scan_after) up to the end key (exclusive, scan_end; LIN_NO_END for
 * none); a pair returned is a read of that key with that value; a key
 * inside the range that was not returned (below the last returned key, or
 * anywhere in the range when fewer than `limit` pairs came back and the
 * page had room for more, !scan_cut) is a read
 * of "absent"; keys past a full scan's last pair are unconstrained. This checks every value and
 * omission a scan reports but not that all keys of one scan were read at the same instant.
 *
 * Thread safety: pure; allocates its search state and frees it.
 */
#ifndef LIN_H
#define LIN_H

#include <stddef.h>
#include <stdint.h>

#include "cons.h"

#define LIN_PENDING UINT64_MAX /* ret of an operation that never completed */
#define LIN_NO_END  UINT32_MAX /* scan_end of a scan without an end key */

struct lin_op {
    uint8_t type;   /* enum cons_op_type (not NOOP) */
    uint32_t key;   /* key index; key order = index order */
    uint64_t arg;   /* PUT value, CAS new value */
    uint64_t exp;   /* CAS expected value */
    int32_t status; /* 0 or FK_ENOTFOUND / FK_ECASFAIL / FK_EFULL */
    uint64_t out;   /* GET result */
    uint64_t call, ret;
    uint8_t scan_limit, scan_n;
    uint8_t scan_after; /* the range starts after key */
    uint8_t scan_cut;   /* the page may have stopped for bytes (cons.h, CONS_SCAN_PAGE) */
    uint32_t scan_end;  /* key index the range stops before, or LIN_NO_END */
    uint32_t scan_keys[CONS_SCAN_MAX];
    uint64_t scan_vals[CONS_SCAN_MAX];
    uint64_t client; /* for messages */
};

/* Checks ops[0..n) over keys 0..nkeys-1. Pending operations (ret ==
 * LIN_PENDING) are left out (the liveness check reports them). Returns 0
 * when linearizable; FK_EPROTO when not, with the key and a reason in why;
 * FK_ETIMEDOUT when a key's search exceeds max_steps (inconclusive, said in
 * why); FK_ENOMEM. */
int lin_check(const struct lin_op *ops, size_t n, uint32_t nkeys, uint64_t max_steps, char *why,
              size_t why_cap);

#endif /* LIN_H */
