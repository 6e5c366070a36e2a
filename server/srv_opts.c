/* srv_opts.c: command line and cluster file for flowkv-server. */
#include "srv_opts.h"
#include "cons.h" /* CONS_REPLICAS_MAX */
#include "fk_error.h"
#include "srv_node.h" /* SRV_QUOTA_BYTES, SRV_QUOTA_MAX */

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const struct option srv__longopts[] = {
    {"config", required_argument, NULL, 'c'},    {"id", required_argument, NULL, 'i'},
    {"protocol", required_argument, NULL, 'p'},  {"fabric", required_argument, NULL, 'f'},
    {"data-dir", required_argument, NULL, 'd'},  {"durability", required_argument, NULL, 'D'},
    {"log-level", required_argument, NULL, 'l'}, {"metrics", required_argument, NULL, 'm'},
    {"map-size", required_argument, NULL, 'M'},  {"new-cluster", no_argument, NULL, 'N'},
    {"restore", required_argument, NULL, 'R'},   {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},         {NULL, 0, NULL, 0},
};

void srv_opts_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s -c CLUSTER.conf -i ID [flags]\n"
            "  -c, --config PATH      cluster description file (required)\n"
            "  -i, --id N             this replica's node id (required)\n"
            "  -p, --protocol P       nopaxos | multipaxos (overrides the file)\n"
            "  -f, --fabric F         auto | tcp | verbs (overrides the file)\n"
            "  -d, --data-dir DIR     LMDB directory (overrides the file)\n"
            "  -D, --durability D     sync | async (overrides the file)\n"
            "  -l, --log-level L      error | warn | info | debug | trace (default info)\n"
            "  -m, --metrics ADDR     Prometheus endpoint host:port, or off\n"
            "  -M, --map-size MIB     LMDB map size in MiB (default: the cluster file's\n"
            "                         map_size, else 1024)\n"
            "  -N, --new-cluster      first start of a brand-new cluster: an empty data\n"
            "                         directory is the truth (without it, an empty\n"
            "                         directory recovers its state from the others)\n"
            "  -R, --restore FILE     first start of a new cluster seeded from a backup\n"
            "                         (flowkv snapshot save): the data directory must hold\n"
            "                         no state; start every replica so, from the same FILE\n"
            "  -h, --help             this text\n"
            "  -V, --version          print the version\n"
            "Environment: FLOWKV_FABRIC overrides the file's fabric, FLOWKV_LOG the level.\n",
            prog);
}

/* Flag values are kept as strings until the file is loaded, so that they
 * can override it whatever the order on the command line. */
struct srv__flags {
    const char *config, *id, *protocol, *fabric, *data_dir, *durability, *log_level, *metrics,
        *map_size;
};

static int srv__bad(char *err, size_t cap, int code, const char *what, const char *value,
                    const char *expect)
{
    snprintf(err, cap, "%s '%s': %s", what, value, expect);
    return code;
}

static int srv__parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] == '\0' || s[0] == '-' || *end != '\0' || errno != 0 || v > max)
        return FK_EINVAL;
    *out = v;
    return 0;
}

static int srv__collect(int argc, char **argv, struct srv__flags *f, struct srv_opts *o, char *err,
                        size_t cap)
{
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":c:i:p:f:d:D:l:m:M:NR:hV", srv__longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            f->config = optarg;
            break;
        case 'i':
            f->id = optarg;
            break;
        case 'p':
            f->protocol = optarg;
            break;
        case 'f':
            f->fabric = optarg;
            break;
        case 'd':
            f->data_dir = optarg;
            break;
        case 'D':
            f->durability = optarg;
            break;
        case 'l':
            f->log_level = optarg;
            break;
        case 'm':
            f->metrics = optarg;
            break;
        case 'M':
            f->map_size = optarg;
            break;
        case 'N':
            o->new_cluster = 1;
            break;
        case 'R':
            o->restore = optarg; /* implies --new-cluster: the file is the truth */
            o->new_cluster = 1;
            break;
        case 'h':
            o->show_help = 1;
            break;
        case 'V':
            o->show_version = 1;
            break;
        case ':':
            snprintf(err, cap, "option %s needs a value", argv[optind - 1]);
            return FK_EINVAL;
        default:
            snprintf(err, cap, "unknown option %s (see --help)", argv[optind - 1]);
            return FK_EINVAL;
        }
    }
    if (optind < argc) {
        snprintf(err, cap, "unexpected argument '%s' (see --help)", argv[optind]);
        return FK_EINVAL;
    }
    return 0;
}

/* Applies the flags (and FLOWKV_FABRIC) on top of the loaded file. */
static int srv__override(const struct srv__flags *f, struct srv_opts *o, char *err, size_t cap)
{
    struct fk_node_conf *self = &o->cluster.nodes[o->id];
    int v;
    if (f->protocol) {
        if ((v = fk_protocol_parse(f->protocol)) < 0)
            return srv__bad(err, cap, FK_EINVAL, "--protocol", f->protocol,
                            "expected nopaxos or multipaxos");
        o->cluster.protocol = (enum fk_protocol)v;
    }
    if (f->durability) {
        if ((v = fk_durability_parse(f->durability)) < 0)
            return srv__bad(err, cap, FK_EINVAL, "--durability", f->durability,
                            "expected sync or async");
        o->cluster.durability = (enum fk_durability)v;
    }
    const char *env_fabric = getenv("FLOWKV_FABRIC");
    const char *fabric = f->fabric ? f->fabric : (env_fabric && *env_fabric ? env_fabric : NULL);
    if (fabric) {
        if ((v = fk_fabric_parse(fabric)) < 0)
            return srv__bad(err, cap, FK_EINVAL, f->fabric ? "--fabric" : "FLOWKV_FABRIC", fabric,
                            "expected auto, tcp or verbs");
        self->fabric = (enum fk_fabric_kind)v;
    }
    if (f->data_dir && snprintf(self->data_dir, sizeof self->data_dir, "%s", f->data_dir) >=
                           (int)sizeof self->data_dir)
        return srv__bad(err, cap, FK_EINVAL, "--data-dir", f->data_dir, "path too long");
    if (self->data_dir[0] == '\0') {
        snprintf(err, cap, "node %u has no data_dir: set it in [node %u] or pass --data-dir", o->id,
                 o->id);
        return FK_ECONFIG;
    }
    if (f->metrics) {
        char ip[FK_CONF_STR_MAX];
        uint16_t port;
        if (strcmp(f->metrics, "off") == 0)
            self->metrics[0] = '\0';
        else if (fk_conf_split_address(f->metrics, ip, sizeof ip, &port) < 0 ||
                 strlen(f->metrics) >= sizeof self->metrics)
            return srv__bad(err, cap, FK_EINVAL, "--metrics", f->metrics,
                            "expected host:port or off");
        else
            strcpy(self->metrics, f->metrics);
    }
    return 0;
}

/* The quota (the protocol's default, and its most) and the LMDB map for
 * it (--map-size, else the file's, else what the quota needs), once the
 * protocol is known. */
static int srv__limits(struct srv_opts *o, const char *config, uint64_t map_flag, char *err,
                       size_t cap)
{
    uint64_t most = SRV_QUOTA_MAX;
    o->quota = o->cluster.quota ? o->cluster.quota : SRV_QUOTA_BYTES;
    if (o->quota > most) {
        snprintf(err, cap, "%s: quota %llu bytes: a cluster holds at most %llu (README, Limits)",
                 config, (unsigned long long)o->quota, (unsigned long long)most);
        return FK_ECONFIG;
    }
    uint64_t need = SRV_MAP_NEED(o->quota);
    o->map_size = map_flag                 ? map_flag
                  : o->cluster.map_size    ? o->cluster.map_size
                  : need > SRV_MAP_DEFAULT ? need
                                           : SRV_MAP_DEFAULT;
    if (o->map_size < need) {
        snprintf(err, cap,
                 "map size %llu bytes: the quota of %llu needs at least %llu (twice the data: a "
                 "state transfer stages the new state beside the old; and the log)",
                 (unsigned long long)o->map_size, (unsigned long long)o->quota,
                 (unsigned long long)need);
        return FK_ECONFIG;
    }
    return 0;
}

int srv_opts_parse(int argc, char **argv, struct srv_opts *o, char *err, size_t cap)
{
    struct srv__flags f = {0};
    memset(o, 0, sizeof *o);
    err[0] = '\0';
    int rc = srv__collect(argc, argv, &f, o, err, cap);
    if (rc < 0 || o->show_help || o->show_version)
        return rc;
    if (f.config == NULL || f.id == NULL) {
        snprintf(err, cap, "both --config and --id are required (see --help)");
        return FK_EINVAL;
    }
    o->log_level = fk_log_get_level();
    if (f.log_level) {
        if ((rc = fk_log_parse_level(f.log_level)) < 0)
            return srv__bad(err, cap, FK_EINVAL, "--log-level", f.log_level,
                            "expected error, warn, info, debug or trace");
        o->log_level = (enum fk_log_level)rc;
    }
    uint64_t mib = 1024;
    if (f.map_size && (srv__parse_u64(f.map_size, 1 << 20, &mib) < 0 || mib < 1))
        return srv__bad(err, cap, FK_EINVAL, "--map-size", f.map_size,
                        "expected MiB between 1 and 1048576");
    rc = fk_conf_load(f.config, &o->cluster, err, cap);
    if (rc < 0)
        return rc;
    if (o->cluster.n_nodes > CONS_REPLICAS_MAX) {
        snprintf(err, cap, "%s: %u nodes: a replica group has at most %u replicas", f.config,
                 o->cluster.n_nodes, (unsigned)CONS_REPLICAS_MAX);
        return FK_ECONFIG;
    }
    uint64_t id;
    if (srv__parse_u64(f.id, FK_CONF_MAX_NODES, &id) < 0 || id >= o->cluster.n_nodes) {
        snprintf(err, cap, "--id '%s': the cluster has %u nodes (0..%u)", f.id, o->cluster.n_nodes,
                 o->cluster.n_nodes - 1);
        return FK_EINVAL;
    }
    o->id = (uint32_t)id;
    rc = srv__override(&f, o, err, cap);
    return rc < 0 ? rc : srv__limits(o, f.config, f.map_size ? mib << 20 : 0, err, cap);
}
