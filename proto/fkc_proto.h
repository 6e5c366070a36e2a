/*
 * fkc_proto.h: the contract between libflowkv and flowkv-server: which
 * flows a replica hosts, and the bytes that travel on them. It sits below
 * both (proto/, STYLE.md point 16): client/ and server/ include it, and
 * neither includes the other; the cores' client-side codecs it names
 * (mpx_encode_request, mpx_decode_reply, nop_decode_reply, nop_quorum_*)
 * are the only part of consensus/ libflowkv links.
 *
 * Every flow is declared by the replica that hosts it (its "home"), so a
 * replica depends on no other process to come up, and a dead replica takes
 * only its own flows with it (DESIGN.md: no single point of failure). For
 * replica i, whose node listens at the cluster file's [node i] address:
 *
 * (Every flow here is in bandwidth mode, DFI section 5.3: what one batch
 * of the sender's event loop or one client burst sends shares segments,
 * flushed at the end of the batch.)
 *
 *   kv.peer.<i>   shuffle, N:1, no declared sources: the
 *                 other replicas join as sources (FLOW_ANY) and send
 *                 protocol messages as flow_msg messages (from = their id).
 *   kv.bcast.<i>  Multi-Paxos only: replicate, 1:N, targets = the other
 *                 replicas in id order, replica i joins as the source: a
 *                 protocol message for every other replica (cons.h,
 *                 CONS_ADDR_PEERS: the leader's accepts and commits, a
 *                 candidate's prepares) is pushed once (DFI Figure 3's
 *                 replicate flow from the leader to the followers). A
 *                 replica it does not reach now gets the message on
 *                 kv.peer.<j> instead (server/srv_net.c).
 *   kv.req.<i>    shuffle, N:1, no declared sources: clients
 *                 join as sources (DFI's N:1 shuffle of requests, paper
 *                 Figure 3) and send flow_msg messages: dst = client id,
 *                 from = the client's target index in kv.reply.<i>, body =
 *                 one fkc_kind byte and the request.
 *   kv.reply.<i>  shuffle, 1:N, source 0 = replica i, no
 *                 declared targets: clients join as targets (elastic
 *                 membership) and replica i pushes each reply to the target
 *                 index its client named (a shuffle keyed by client id).
 *   kv.oum        NOPaxos only: the ordered unreliable multicast (NOPaxos
 *                 section 3) as an ordered replicate flow,
 *                 targets = every replica (index = replica id), clients
 *                 join as sources; the sequencer is a fetch-and-add counter
 *                 on the first live node of the cluster file's sequencers
 *                 list (DFI section 5.4). Requests travel as flow_msg
 *                 messages (struct fkc_oum + an encoded cons op, dst =
 *                 client id) of FKC_OUM_TUPLE-byte fragments, each with
 *                 its own global number: a request is whole at its last
 *                 fragment's number; the numbers of its leading fragments
 *                 are fills (consensus/nop.h). Declared by the
 *                 first replica that finds every replica up; every target
 *                 node stores the declaration afterwards.
 *
 * Message bodies (little-endian, like every cons wire message):
 *   request  = u8 kind, then: FKC_OP: the protocol's client request
 *              (mpx_encode_request); FKC_STATUS: nothing; FKC_SNAP:
 *              struct fkc_snap_req.
 *   reply    = u8 kind, then: FKC_OP: the protocol's reply message
 *              (mpx_decode_reply / nop_decode_reply read it); FKC_STATUS:
 *              struct fkc_status; FKC_SNAP: struct fkc_snap_reply and,
 *              for a READ, the chunk.
 *
 * Exactly-once (cons.h client table): a client id has at most one request
 * outstanding, numbered 1, 2, ...; a pipelining client uses one client id
 * per pipeline slot. Ids are random 64-bit numbers, never 0.
 */
#ifndef FKC_PROTO_H
#define FKC_PROTO_H

#include "cons.h"
#include "cons_core.h" /* enum cons_role, which enum fkc_role mirrors */
#include "cons_wire.h"
#include "nop.h"

#include <stdint.h>

/* Per-replica flow names are these prefixes followed by the replica id. */
#define FKC_FLOW_PEER  "kv.peer."
#define FKC_FLOW_REQ   "kv.req."
#define FKC_FLOW_REPLY "kv.reply."
#define FKC_FLOW_OUM   "kv.oum"
#define FKC_FLOW_BCAST "kv.bcast."

/* Fragment tuple sizes (flow_msg_schema): a small put or get fits one
 * fragment of a request or reply; protocol messages between replicas
 * (batches of operations, snapshots) are cut into larger fragments. */
#define FKC_REQ_TUPLE   512
#define FKC_REPLY_TUPLE 512
#define FKC_PEER_TUPLE  2048

/* Bounds on the flows (STYLE.md point 11). A client process is one
 * source of kv.req (and kv.oum) and one target of kv.reply at each replica
 * (client/flowkv.c, channels); its rings come and go with it. */
#define FKC_CLIENTS_MAX 256 /* client sources per replica (kv.req, kv.oum) */
#define FKC_REPLY_MAX   64  /* client processes per replica: kv.reply's targets, FLOW_TARGETS_MAX */
#define FKC_MSG_MAX     CONS_MSG_MAX
/* Client rings (server/srv_net.c declares them): requests to a segment,
 * and the most segments a client process may ask for (client/flowkv.c
 * sizes its rings by its handles' pipelines). */
#define FKC_REQ_SEG_TUPLES   8
#define FKC_REQ_SEGS_MAX     1024
#define FKC_OUM_SEG_TUPLES   64
#define FKC_OUM_SEGS_MAX     128
#define FKC_REPLY_SEG_TUPLES 8
#define FKC_REPLY_SEGS_MAX   512 /* of 8 fragments: the replies a process waits for */

enum fkc_kind { FKC_OP = 1, FKC_STATUS = 2, FKC_SNAP = 3 };

#define FKC_NO_TARGET 0xffffffffu

/* A kv.oum message (48 bytes of header, then `len` bytes of one cons op,
 * cons_wire_put_op), cut into FKC_OUM_TUPLE-byte fragments by flow_msg
 * with client_id as the fragment's dst. reply_to[i] is the client's
 * target index in kv.reply.<i>, FKC_NO_TARGET when it has none there. */
struct fkc_oum {
    uint64_t client_id;
    uint32_t len;
    uint32_t pad;
    uint32_t reply_to[CONS_REPLICAS_MAX];
    uint32_t pad2;
} __attribute__((packed));
_Static_assert(sizeof(struct fkc_oum) == 48, "oum header is 48 bytes");

/* kv.oum fragments: a small operation (a get, or a put of up to 144 bytes
 * of key and value: YCSB-B's update is 100) is one fragment and one
 * sequence number; the largest op takes
 * ceil(FKC_OUM_MSG_MAX / (FKC_OUM_TUPLE - FLOW_MSG_HDR)) = 10 numbers, its
 * leading fragments NO-OPs in the replicas' logs (nop.h, fills). Tuples
 * are fixed-size (DFI section 3), so the size is what every small request
 * pays: with 512 bytes a YCSB-B burst filled 16-tuple segments and the
 * client waited on one fetch-and-add per 16 requests; 256 bytes halve the
 * bytes and double the requests per segment and per fetch-and-add
 * (NOPaxos' closed-loop YCSB-B throughput about 25% higher). Before that,
 * every request took a tuple as large as the largest op (2,208 bytes). */
#define FKC_OUM_TUPLE   256
#define FKC_OUM_MSG_MAX (sizeof(struct fkc_oum) + NOP_WIRE_OP_MAX) /* nop.h: NOP_OP_MAX */

/* A replica's answer to FKC_STATUS (what `flowkv status` prints). */
enum fkc_role {
    FKC_ROLE_FOLLOWER = 1,
    FKC_ROLE_CANDIDATE = 2,
    FKC_ROLE_LEADER = 3,
    FKC_ROLE_RECOVERING = 4,
    FKC_ROLE_VIEW_CHANGE = 5,
};
/* The server sends the core's role as it is (srv_node.c, fill_status). */
_Static_assert(FKC_ROLE_FOLLOWER == (int)CONS_ROLE_FOLLOWER &&
                   FKC_ROLE_CANDIDATE == (int)CONS_ROLE_CANDIDATE &&
                   FKC_ROLE_LEADER == (int)CONS_ROLE_LEADER &&
                   FKC_ROLE_RECOVERING == (int)CONS_ROLE_RECOVERING &&
                   FKC_ROLE_VIEW_CHANGE == (int)CONS_ROLE_VIEW_CHANGE,
               "enum fkc_role mirrors enum cons_role");

struct fkc_status {
    uint32_t id;       /* replica id */
    uint8_t protocol;  /* enum cons_proto */
    uint8_t role;      /* enum fkc_role */
    uint8_t fabric[6]; /* "tcp", "verbs", NUL padded */
    uint32_t epoch;    /* the configuration's (consensus/mpx.h, "Reconfiguration"; NOPaxos 0) */
    uint64_t term;     /* ballot (Multi-Paxos) or view (NOPaxos: leader_num << 32 | session_num) */
    uint32_t leader;   /* replica believed to lead, or FKC_NO_TARGET */
    uint32_t members;  /* the configuration's voters, a mask of replica ids */
    uint64_t commit;   /* highest committed log index */
    uint64_t applied;  /* highest applied log index */
    uint64_t last;     /* highest log index held */
    uint64_t uptime_ns;
} __attribute__((packed));
_Static_assert(sizeof(struct fkc_status) == 64, "status is 64 bytes");

/* Backup (`flowkv snapshot save`; server/srv_backup.h): the client pulls
 * one replica's state stream (cons.h, "The stream") a chunk per request,
 * from one consistent view of its LMDB state (a read transaction: the
 * replica keeps serving, MVCC), one request in flight, so the replica
 * holds one chunk and the client's ring bounds what is in flight:
 *   OPEN  nonce (the client's, nonzero), min_index -> index: the view's
 *         mark, at least min_index (else FK_EAGAIN: the replica has not
 *         applied that far yet), so that a backup holds every write
 *         acknowledged before it began (the client passes the highest
 *         commit point the replicas report)
 *   READ  nonce, seq (0, 1, ...)          -> chunk seq; `last` at END; the
 *         previous seq again is answered again (a lost reply)
 *   CLOSE nonce                           -> the view is closed
 * A replica keeps one backup view (another client's OPEN is FK_EBUSY
 * until the view was idle FKC_SNAP_IDLE_NS, then it is closed). */
enum fkc_snap_op { FKC_SNAP_OPEN = 1, FKC_SNAP_READ = 2, FKC_SNAP_CLOSE = 3 };

struct fkc_snap_req {
    uint8_t op; /* enum fkc_snap_op */
    uint8_t pad[3];
    uint32_t seq;
    uint64_t nonce;
    uint64_t min_index; /* OPEN */
} __attribute__((packed));
_Static_assert(sizeof(struct fkc_snap_req) == 24, "snapshot request is 24 bytes");

struct fkc_snap_reply {
    int32_t status; /* 0, or FK_EAGAIN (the view is not committed yet: ask
                       again), FK_ECLOSED (no such view: OPEN again), FK_EBUSY,
                       FK_EINVAL, a storage error */
    uint8_t op, last;
    uint8_t protocol; /* enum cons_proto */
    uint8_t pad;
    uint32_t seq;
    uint32_t replica;
    uint64_t nonce;
    uint64_t index;
} __attribute__((packed));
_Static_assert(sizeof(struct fkc_snap_reply) == 32, "snapshot reply header is 32 bytes");

/* A chunk aims at 64 KiB (the replica's loop pushes it at once: at
 * loopback speed about 0.1 ms) and holds at least one record, which may
 * be a pair with a 1 MiB value. */
#define FKC_SNAP_WANT      (64u << 10)
#define FKC_SNAP_CHUNK_MAX (CONS_SNAP_RECORD_MAX + FKC_SNAP_WANT)
#define FKC_SNAP_IDLE_NS   (30ULL * 1000000000ULL)
_Static_assert(sizeof(struct fkc_snap_reply) + FKC_SNAP_CHUNK_MAX <= FKC_MSG_MAX,
               "a chunk fits a reply");

#endif /* FKC_PROTO_H */
