/*
 * flowkv_snap.h: inside libflowkv, the backup request (fkc_proto.h,
 * FKC_SNAP) that client/flowkv_snap.c's flowkv_snapshot_save builds on.
 * Not installed.
 */
#ifndef FLOWKV_SNAP_H
#define FLOWKV_SNAP_H

#include "fkc_proto.h"
#include "flowkv.h"

#include <stddef.h>

/* Sends q to replica id (joining it first if needed), resending it every
 * 250 ms until the reply to it comes or timeout_ns passed: 0 with *rep and
 * the chunk (buf[0..*len), at most cap bytes) set, FK_ETIMEDOUT, FK_EINVAL,
 * or the join's or send's error. Takes the channel's lock: any thread. */
int flowkv__snap_call(flowkv *kv, uint32_t id, const struct fkc_snap_req *q,
                      struct fkc_snap_reply *rep, uint8_t *buf, size_t cap, size_t *len,
                      uint64_t timeout_ns);

/* Sets what flowkv_error_detail(kv) says (truncated to its buffer). */
void flowkv__set_detail(flowkv *kv, const char *what);

#endif /* FLOWKV_SNAP_H */
