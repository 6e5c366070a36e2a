/*
 * srv_opts.h: flowkv-server's settings: the cluster description file
 * (fk_conf.h) plus command-line flags that override it.
 *
 *   flowkv-server -c CLUSTER.conf -i ID [flags]
 *     -c, --config PATH        cluster description (required)
 *     -i, --id N               this replica's node id (required)
 *     -p, --protocol P         nopaxos | multipaxos      (overrides [cluster])
 *     -f, --fabric F           auto | tcp | verbs        (overrides [node N])
 *     -d, --data-dir DIR       LMDB environment directory (overrides [node N])
 *     -D, --durability D       sync | async              (overrides [cluster])
 *     -l, --log-level L        error | warn | info | debug | trace
 *     -m, --metrics ADDR       host:port of the Prometheus endpoint, or "off"
 *     -M, --map-size MIB       LMDB map size in MiB (default: the cluster
 *                              file's map_size, else 1024)
 *     -N, --new-cluster        first start of a new cluster (FRESH, not EMPTY)
 *     -R, --restore FILE       the same, seeded from a backup (srv_backup.h)
 *     -h, --help / -V, --version
 *
 * Precedence: flag > file > built-in default. FLOWKV_FABRIC in the
 * environment overrides the file but not the flag, so tests can force a
 * backend without editing files.
 *
 * Thread safety: call from main() before starting threads (getopt_long
 * keeps global state).
 */
#ifndef SRV_OPTS_H
#define SRV_OPTS_H

#include "fk_version.h"
#include "fk_conf.h"
#include "fk_log.h"

#include <stdio.h>

#define SRV_VERSION FK_VERSION

struct srv_opts {
    struct fk_cluster_conf cluster; /* the file, with overrides applied */
    uint32_t id;                    /* this replica */
    enum fk_log_level log_level;
    uint64_t map_size;   /* bytes: --map-size, else the file's map_size, else 1 GiB */
    uint64_t quota;      /* bytes: the file's quota, else SRV_QUOTA_BYTES */
    int new_cluster;     /* --new-cluster: an empty data directory starts FRESH */
    const char *restore; /* --restore FILE (argv's), else NULL; sets new_cluster */
    int show_help;       /* --help was given: print srv_opts_usage, exit 0 */
    int show_version;    /* --version was given */
};

/* Parses argv and loads the cluster file. Returns 0 (check show_help and
 * show_version first), or FK_EINVAL / FK_ECONFIG / -errno with a one-line
 * explanation in err (e.g. "--id 7: the cluster has 3 nodes (0..2)"). */
int srv_opts_parse(int argc, char **argv, struct srv_opts *o, char *err, size_t errcap);

/* Prints the usage text above. */
void srv_opts_usage(FILE *out, const char *prog);

/* This replica's node entry (after parsing). */
static inline const struct fk_node_conf *srv_opts_self(const struct srv_opts *o)
{
    return &o->cluster.nodes[o->id];
}

#endif /* SRV_OPTS_H */
