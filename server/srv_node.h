/*
 * srv_node.h: one flowkv replica: a protocol core (consensus/mpx.h or
 * nop.h) driven by an event loop over the replica's flows (srv_net.h),
 * persisting into LMDB (srv_disk.h, kv_sm.h), with metrics (fk_metrics.h)
 * served on the same thread (srv_http.h).
 *
 * The loop, one LMDB write transaction per batch (srv_disk.h):
 *   take up to SRV_BATCH inputs (waiting up to SRV_TICK_NS for the first),
 *   step the core on each and drain its outbox (persist items into the
 *   transaction, messages to peers and clients at once), tick the core
 *   every SRV_TICK_NS, commit, and feed CONS_IN_PERSISTED when the durable
 *   cookie grew. Batching many requests into one commit is how sync
 *   durability stays affordable (one fsync per batch, not per request).
 *
 * Durability: Multi-Paxos acknowledges nothing before it is durable in
 * LMDB (fsync'ed in `sync` mode, in the page cache in `async` mode).
 * NOPaxos acknowledges on replication (its correctness argument is
 * diskless, NOPaxos section 5.3.2); its disk spares a restarted replica the
 * checkpoint transfer (consensus/nop.h).
 *
 * Thread safety: create, run and close from one thread; srv_node_stop may
 * be called from a signal handler.
 */
#ifndef SRV_NODE_H
#define SRV_NODE_H

#include "cons.h"
#include "srv_opts.h"

#include <stdint.h>

#define SRV_TICK_NS         (1000ULL * 1000ULL)           /* core timer resolution: 1 ms */
#define SRV_NOP_ELECTION_NS (1000ULL * 1000ULL * 1000ULL) /* NOPaxos view-change timeout: 1 s */
#define SRV_BATCH           64                            /* inputs per LMDB transaction at most */
#define SRV_DRAIN_NS        (2ULL * 1000000000ULL) /* SIGTERM: longest wait for in-flight work */

/* Core settings, documented limits (README "Limits"). Both protocols
 * keep their state in LMDB and move it in chunks
 * (consensus/cons_xfer.h): data is bounded by the quota and the map, as
 * etcd's by its backend quota (2 GiB by default). */
#define SRV_QUOTA_BYTES (2ULL << 30) /* default replicated quota */
#define SRV_QUOTA_MAX   (1ULL << 40) /* the most a cluster file may set */
/* A replica's LMDB map must hold the data twice (a state transfer stages
 * the new state beside the old until it switches, cons.h), the pages a
 * sender's open view keeps from reuse while writes go on (a quarter of the
 * quota), and the log: SRV_MAP_NEED(quota); the default map is that, and
 * at least SRV_MAP_DEFAULT (sparse: only used pages take disk). */
#define SRV_MAP_NEED(q) (2 * (uint64_t)(q) + (uint64_t)(q) / 4 + (64ULL << 20))
#define SRV_MAP_DEFAULT (1ULL << 30)
/* Client table rows (exactly-once sessions): 28 bytes each in a snapshot,
 * about 132 bytes of memory each (cons.h). A NOPaxos checkpoint (the
 * table, the snapshot) and a ring of entries must fit one message:
 * 2048 * 2,592 + 50,000 * 28 + 1.5 MiB = 8.0 of CONS_MSG_MAX's 8.4 MB. */
#define SRV_CLIENTS_MAX 50000
/* Multi-Paxos keeps the rows in LMDB and moves them in the state stream:
 * no message bounds them, only the core's table (cons.h, about 17 MiB). */
#define SRV_MPX_CLIENTS_MAX CONS_CLIENTS_MAX
/* The cores check at create that their largest message fits CONS_MSG_MAX:
 * Multi-Paxos a promise of log_cap batches, NOPaxos a checkpoint plus a
 * ring of entries. */
#define SRV_MPX_LOG   256
#define SRV_MPX_BATCH 4
/* A NOPaxos checkpoint serialises the whole state machine and client
 * table (0.25-0.35 ms with 5,000 YCSB records, measured) while the
 * replica's loop serves nothing: the leader takes one every half ring,
 * a follower one about every ring, for its disk (consensus/nop.c,
 * nop_disk.c). With 512 entries, when every replica checkpointed every
 * quarter ring, that was one every 128 requests on all three replicas at
 * once, and YCSB-B's p95 at 32k ops/s was 1.4-3x Multi-Paxos'; 2048
 * entries make it one every 1,024 at the leader (the ring is 4.4 MB of
 * memory; CONS_MSG_MAX was raised to 8 MiB to let a view change carry
 * it). */
#define SRV_NOP_LOG 2048

struct srv_node;

/* Opens the store, restores or starts the core, opens the flows and the
 * metrics endpoint. Errors with a one-line reason in err. */
int srv_node_open(const struct srv_opts *o, struct srv_node **out, char *err, size_t errcap);

/* Runs until srv_node_stop, then drains (SRV_DRAIN_NS at most: pending
 * persists committed, outboxes sent) and returns 0, or a negative code
 * after a fatal storage failure (srv_disk.h failure rule). */
int srv_node_run(struct srv_node *n);

/* Asks the loop to stop. Async-signal-safe. */
void srv_node_stop(struct srv_node *n);

/* Asks the loop to log its protocol state and message counts at the next
 * tick, one info line (flowkv-server does it on SIGUSR1: what a stuck
 * replica is waiting for, without stopping it). Async-signal-safe. */
void srv_node_dump(struct srv_node *n);

/* Commits nothing more, closes flows, the store (cleanly) and frees. */
void srv_node_close(struct srv_node *n);

#endif /* SRV_NODE_H */
