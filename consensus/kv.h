/*
 * kv.h: the in-memory key-value state machine (kv_mem) the simulator uses.
 *
 * Implements struct cons_sm (cons.h): get, put, delete, compare-and-swap and
 * ordered range scan over byte-string keys compared with memcmp then length
 * (shorter first), the order LMDB uses by default, so the LMDB state machine
 * in server/ answers scans identically.
 *
 * Storage: a sorted array of max_keys fixed rows, each sizeof(struct
 * kv_row) = 4 + 2 + 511 + KV_MEM_VAL_MAX bytes (~8.7 KiB: 64 keys = 0.5
 * MiB), allocated at create. Lookups are binary searches; inserts shift
 * rows (fine for the simulator's small key sets; the server uses LMDB). A
 * PUT of a new key when full replies FK_EFULL, and a PUT or CAS of a value
 * over KV_MEM_VAL_MAX (the simulator's values are smaller, but larger than
 * an op holds inline, so they exercise the cores' big-op storage)
 * FK_EVALSIZE; neither changes anything.
 *
 * It keeps the whole replicated state as cons.h's contract says: pairs,
 * the client table's rows (a sorted array that grows) and the mark. A
 * view (snap_open) is a copy of that state, and an install stages into a
 * second state switched in at commit, so the simulator exercises the
 * stream contract with chunks as small as its caller wants.
 *
 * Thread safety: one thread per handle.
 */
#ifndef KV_H
#define KV_H

#include "cons.h"

#include <stdint.h>

struct kv_mem;

#define KV_MEM_VAL_MAX 8192 /* bytes of a value the in-memory machine holds */

/* Creates a store for up to max_keys keys (1..1,000,000). NULL on bad
 * arguments or out of memory. Free with kv_mem_destroy. */
struct kv_mem *kv_mem_create(uint32_t max_keys);
void kv_mem_destroy(struct kv_mem *kv);
/* The state machine view of kv; valid until kv_mem_destroy. */
struct cons_sm kv_mem_sm(struct kv_mem *kv);
/* Bumped by every change of the live state (pairs, rows, mark, an
 * install): the simulator's disk keeps an image only when it moved. */
uint64_t kv_mem_version(const struct kv_mem *kv);
/* The stash (cons.h) as bytes and back, for the simulator's disk images
 * (the stream leaves it out). FK_ETOOBIG, FK_EMALFORMED. */
int kv_mem_stash_save(const struct kv_mem *kv, uint8_t *buf, size_t cap, size_t *len);
int kv_mem_stash_restore(struct kv_mem *kv, const uint8_t *buf, size_t len);
/* Number of keys stored. */
uint32_t kv_mem_count(const struct kv_mem *kv);
/* Bytes a snapshot of a full store needs, for sizing buffers. */
size_t kv_mem_snapshot_max(uint32_t max_keys);
/* Compares keys the way scans order them: <0, 0, >0. */
int kv_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

#endif /* KV_H */
