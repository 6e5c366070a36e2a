/*
 * ycsb_flowkv.h: the flowkv binding of flowkv-ycsb (-db flowkv, the
 * default), on libflowkv's pipelined asynchronous API (client/flowkv.h) so
 * that one runner thread keeps flowkv.pipeline requests in flight (issue 7,
 * item 5).
 *
 * Each runner thread opens its own flowkv handle (flows are thread-centric,
 * DFI section 3) on the cluster file flowkv.cluster, with flowkv_opts.
 * pipeline = flowkv.pipeline. A request's slot index is the flowkv tag; the
 * runner's cookie travels in the slot.
 *
 * A record is one value in ycsb_record.h's encoding (identical bytes to the
 * etcd binding's); the table is not part of the key. The encoded record
 * must fit in one flowkv value (FLOWKV_VAL_MAX = 1 MiB): 8 + fieldcount *
 * (4 + fieldlength) bytes: 1,048 for YCSB's default 10 x 100-byte fields,
 * 76 for the DFI benchmark's one 64-byte field. On NOPaxos a request holds
 * at most FLOWKV_NOP_OP_MAX bytes of key and values, and an update of some
 * fields is a compare-and-swap of two records: open refuses records that
 * do not fit, with FK_ETOOBIG and a message.
 *
 * Operations:
 *   READ    flowkv GET: OK when the value is a valid record (holding the
 *           named field, if one is asked), NOT_FOUND when the key is missing.
 *   INSERT  PUT of the encoded record.
 *   UPDATE  writing every field (fieldcount = 1, or writeallfields=true): the
 *           same PUT (like YCSB's bindings, it creates a missing record).
 *           Writing some fields only: a read-modify-write made atomic with
 *           flowkv's compare-and-swap: GET the record, merge the new fields
 *           (ycsb_record_merge), CAS with the old value as the expected one;
 *           when another writer came between (FK_ECASFAIL) the pair is
 *           retried, at most flowkv.update_tries times in all, then the
 *           update fails with FK_ECASFAIL. A missing record is NOT_FOUND.
 *           workload_dfi_b (one field) never takes this path.
 *   SCAN    flowkv SCAN from the key on. One flowkv scan returns at most
 *           FLOWKV_SCAN_MAX (16) pairs, so a YCSB scan of n records is
 *           ceil(n / 16) or more flowkv scans in sequence, each starting just
 *           after the last key of the one before (key + "\0": flowkv orders
 *           keys by memcmp); it ends early at the end of the key space. The
 *           pieces are each linearizable but the scan as a whole is not one
 *           snapshot (YCSB asks no more). OK when at least one record comes
 *           back, every value a valid record; NOT_FOUND when none.
 *
 * Properties (besides the workload's; open reads them from the run's props):
 *   flowkv.cluster       the cluster file (default run/cluster.conf, what
 *                        deploy/run-local.sh writes); flowkv-ycsb -c PATH
 *                        sets it
 *   flowkv.timeout_ms    per operation, retries included (default 5000)
 *   flowkv.update_tries  GET + CAS attempts of a partial UPDATE (default 10)
 *   flowkv.pipeline      requests in flight per thread (1..FLOWKV_PIPELINE_MAX)
 * The cluster remembers YCSB_FLOWKV_SESSIONS client sessions and every
 * pipeline slot of every thread is one: open warns (once, on stderr) when
 * threadcount * flowkv.pipeline is larger, since evicted sessions then
 * answer FK_EEXPIRED.
 *
 * Results (struct ycsb_done.rc, mapped by ycsb_status_from_err): 0;
 * FK_ENOTFOUND (NOT_FOUND); FK_ETIMEDOUT (TIMEOUT: no answer within
 * flowkv.timeout_ms, e.g. no quorum); FK_EINVAL, FK_ETOOBIG, FK_EKEYSIZE,
 * FK_EVALSIZE (BAD_REQUEST: a key longer than FLOWKV_KEY_MAX, a record
 * over FLOWKV_VAL_MAX, a bad field name); FK_EBUSY
 * (SERVICE_UNAVAILABLE); FK_EMALFORMED (a value that is not a record of this
 * workload), FK_ECASFAIL (partial update lost flowkv.update_tries races),
 * FK_EQUOTA (the cluster's data quota), FK_EEXPIRED (the session was
 * forgotten: outcome unknown), each ERROR.
 *
 * Memory, allocated once by open: D = flowkv.pipeline slots of about 600
 * bytes (the cookie, the request, a key buffer of FLOWKV_KEY_MAX bytes
 * for scan continuation), two record buffers of FLOWKV_VAL_MAX bytes, D
 * struct flowkv_done, and the libflowkv handle (its own flow node, D
 * sessions). Nothing per request: libflowkv copies a request's bytes at
 * submit, so the record buffers are scratch reused by every request.
 *
 * Threads: one context per runner thread, used by that thread only (the
 * ycsb_binding contract, and libflowkv's: a handle belongs to its thread).
 */
#ifndef YCSB_FLOWKV_H
#define YCSB_FLOWKV_H

#include "ycsb_run.h"

/* Client sessions every cluster remembers, the smaller of the protocols'
 * (server/srv_node.h SRV_CLIENTS_MAX, NOPaxos; Multi-Paxos keeps 131,072;
 * ycsb/ cannot include server headers, so the figure is repeated here and
 * used only for a warning). */
#define YCSB_FLOWKV_SESSIONS 50000

/* The binding ("flowkv"). */
extern const struct ycsb_binding ycsb_flowkv_binding;

#endif /* YCSB_FLOWKV_H */
