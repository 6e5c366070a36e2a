/*
 * fk_conf.h: the cluster description file, read by flowkv-server, the
 * flowkv CLI, libflowkv, flowkv-ycsb and the deploy scripts.
 *
 * The file is INI (parsed by Debian's libinih). Example, with every key:
 *
 *   [cluster]
 *   protocol   = nopaxos          ; nopaxos | multipaxos
 *   durability = sync             ; sync: durable in LMDB before acknowledging
 *                                 ; async: acknowledged on replication alone;
 *                                 ; a replica whose machine crashed restarts
 *                                 ; empty and recovers from the others
 *                                 ; (server/kv_store.h, the boot mark)
 *   token      = 3f9c...          ; shared secret, 16..127 printable chars
 *   ; token_file = /etc/flowkv/token   (instead of token; first line is used)
 *   quota      = 1MiB             ; stored data limit, the same on every
 *                                 ; replica (B, KiB, MiB, GiB; the server's
 *                                 ; default and maximum: README, Limits)
 *   map_size   = 1GiB             ; each replica's LMDB map (default: what
 *                                 ; the quota needs, at least 1 GiB;
 *                                 ; flowkv-server --map-size overrides)
 *   flow_memory = 1GiB            ; the flow memory a replica gives its
 *                                 ; clients' request rings (at least 64KiB;
 *                                 ; its own flows come on top): a client
 *                                 ; process that would pass it is refused
 *   transfer_chunk  = 256KiB      ; state transfer chunk (4KiB..1MiB) and
 *   transfer_window = 4           ; chunks in flight (1..16): Multi-Paxos
 *   members = 0, 1, 2             ; Multi-Paxos: the nodes that vote when the
 *                                 ; cluster is new (default: every node,
 *                                 ; then N must be odd); the others are
 *                                 ; learners until `flowkv member` adds
 *                                 ; them (consensus/mpx.h, "Reconfiguration")
 *   epoch = 0                     ; Multi-Paxos: the configuration epoch of
 *                                 ; `members` (0..FK_CONF_EPOCH_MAX, default
 *                                 ; 0): a new cluster starts in it, and
 *                                 ; `flowkv-deploy add|remove|replace`
 *                                 ; writes the new members and epoch here
 *                                 ; after a change; a replica whose own
 *                                 ; configuration is newer says so at start
 *   sequencers = 2, 1, 0          ; node ids that may run the NOPaxos
 *                                 ; sequencer, in failover order (default:
 *                                 ; every node, the last first, so that view
 *                                 ; 0's leader, node 0, does not host it)
 *
 *   [node 0]                      ; ids are 0..N-1, N odd (N = 2f + 1)
 *   address     = 10.0.0.1:7100   ; host:port (or [v6]:port) replicas listen on
 *   host        = alpha           ; ssh destination for deploy (default: address host)
 *   fabric      = auto            ; auto | tcp | verbs
 *   rdma_device = mlx5_0          ; verbs device (default: first found)
 *   data_dir    = /var/lib/flowkv/0
 *   metrics     = 127.0.0.1:9100  ; Prometheus endpoint (default: off)
 *
 * Relative data_dir and token_file paths are taken relative to the
 * directory of the file itself, so a cluster under ./run/ can be moved.
 *
 * Thread safety: the functions are reentrant; a parsed struct is plain data.
 */
#ifndef FK_CONF_H
#define FK_CONF_H

#include <stddef.h>
#include <stdint.h>

#define FK_CONF_MAX_NODES           15 /* 2f + 1 with f = 7; bounds every per-node array */
#define FK_CONF_STR_MAX             256
#define FK_CONF_TOKEN_MIN           16
#define FK_CONF_TOKEN_MAX           127
#define FK_CONF_ERR_MAX             320
#define FK_CONF_FLOW_MEMORY_DEFAULT (1ULL << 30)
#define FK_CONF_FLOW_MEMORY_MIN     (64ULL << 10)
#define FK_CONF_EPOCH_MAX           65534 /* a change must still fit (consensus/mpx.h's epochs) */

enum fk_protocol { FK_PROTO_NOPAXOS = 0, FK_PROTO_MULTIPAXOS = 1 };
enum fk_fabric_kind { FK_FABRIC_AUTO = 0, FK_FABRIC_TCP = 1, FK_FABRIC_VERBS = 2 };
enum fk_durability { FK_DURABLE_SYNC = 0, FK_DURABLE_ASYNC = 1 };

struct fk_node_conf {
    uint32_t id;
    char address[FK_CONF_STR_MAX]; /* as written: "host:port" */
    char ip[FK_CONF_STR_MAX];      /* host part, brackets removed */
    uint16_t port;
    char host[FK_CONF_STR_MAX]; /* ssh destination */
    enum fk_fabric_kind fabric;
    char rdma_device[64];           /* "" = first device found */
    char data_dir[FK_CONF_STR_MAX]; /* "" = not configured */
    char metrics[FK_CONF_STR_MAX];  /* "" = metrics off */
};

struct fk_cluster_conf {
    enum fk_protocol protocol;
    enum fk_durability durability;
    char token[FK_CONF_TOKEN_MAX + 1];
    uint32_t n_nodes;
    struct fk_node_conf nodes[FK_CONF_MAX_NODES]; /* indexed by id */
    uint32_t n_sequencers;
    uint32_t sequencers[FK_CONF_MAX_NODES];
    uint64_t members;         /* Multi-Paxos voters (mask of ids) from `epoch` on; 0 = every node */
    uint32_t epoch;           /* Multi-Paxos: the configuration epoch `members` belong to */
    uint64_t quota;           /* bytes; 0 = the server's default */
    uint64_t map_size;        /* bytes; 0 = the server's default */
    uint64_t flow_memory;     /* bytes; FK_CONF_FLOW_MEMORY_DEFAULT unless set */
    uint32_t transfer_chunk;  /* bytes; 0 = the server's default (consensus/cons_core.h) */
    uint32_t transfer_window; /* chunks; 0 = the server's default */
    char dir[FK_CONF_STR_MAX]; /* directory of the file, for relative paths */
};

/* Parses and validates the file at path into *out (fully overwritten).
 * Returns 0, or:
 *   -errno       the file cannot be read (err names the path),
 *   FK_ECONFIG   syntax error, unknown section or key, bad value, missing
 *                required key (cluster.token, node.address), node ids not
 *                0..N-1, an even or zero node count, duplicate addresses, or
 *                a sequencer id that is not a node.
 * On error err (if not NULL) receives one line "path:line: what is wrong"
 * (line omitted for whole-file problems). */
int fk_conf_load(const char *path, struct fk_cluster_conf *out, char *err, size_t errcap);

/* Writes the node ids in mask as "0,1,2" (a list `members` takes) into buf. */
void fk_conf_ids(uint64_t mask, char *buf, size_t cap);

/* Same as fk_conf_load for text in memory; dir resolves relative paths
 * (NULL = current directory), name labels error messages. */
int fk_conf_parse(const char *text, const char *name, const char *dir, struct fk_cluster_conf *out,
                  char *err, size_t errcap);

/* Splits "host:port" or "[v6addr]:port" into ip and port.
 * Returns 0 or FK_EINVAL (no port, port not in 1..65535, empty host,
 * host longer than ipcap - 1). */
int fk_conf_split_address(const char *address, char *ip, size_t ipcap, uint16_t *port);

/* Names for logs and --help: "nopaxos", "tcp", "sync". */
const char *fk_protocol_name(enum fk_protocol p);
const char *fk_fabric_name(enum fk_fabric_kind f);
const char *fk_durability_name(enum fk_durability d);

/* Parses a size: digits, then optionally B, KiB, MiB or GiB (1024-based).
 * Returns 0 and *bytes, or FK_EINVAL (no digits, an unknown unit,
 * overflow). */
int fk_conf_parse_size(const char *s, uint64_t *bytes);

/* Parses those names; returns the enum value or FK_EINVAL. */
int fk_protocol_parse(const char *s);
int fk_fabric_parse(const char *s);
int fk_durability_parse(const char *s);

#endif /* FK_CONF_H */
