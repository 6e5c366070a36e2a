/* fk_conf.c: cluster description parsing (libinih) and validation. */
#include "fk_conf.h"

#include "fk_error.h"

#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct fk__conf_ctx {
    struct fk_cluster_conf *conf;
    uint32_t seen_nodes; /* bit i: [node i] appeared */
    uint32_t node_has_address;
    int have_token;
    int have_sequencers;
    int have_members;
    int have_epoch;
    char msg[FK_CONF_ERR_MAX]; /* first error, without the line prefix */
};
_Static_assert(FK_CONF_MAX_NODES <= 32, "node bitmaps are 32 bits");

static const char *const fk__proto_names[] = {"nopaxos", "multipaxos"};
static const char *const fk__fabric_names[] = {"auto", "tcp", "verbs"};
static const char *const fk__dur_names[] = {"sync", "async"};

static int fk__lookup(const char *s, const char *const *names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    return FK_EINVAL;
}

int fk_protocol_parse(const char *s)
{
    return fk__lookup(s, fk__proto_names, 2);
}
int fk_fabric_parse(const char *s)
{
    return fk__lookup(s, fk__fabric_names, 3);
}
int fk_conf_parse_size(const char *s, uint64_t *bytes)
{
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {{"", 0}, {"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}};
    if (s == NULL || *s < '0' || *s > '9')
        return FK_EINVAL;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - 9) / 10)
            return FK_EINVAL;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        if (strcmp(s, units[i].unit) == 0) {
            if (v > (UINT64_MAX >> units[i].shift))
                return FK_EINVAL;
            *bytes = v << units[i].shift;
            return 0;
        }
    }
    return FK_EINVAL;
}

int fk_durability_parse(const char *s)
{
    return fk__lookup(s, fk__dur_names, 2);
}
const char *fk_protocol_name(enum fk_protocol p)
{
    return (unsigned)p < 2 ? fk__proto_names[p] : "?";
}
const char *fk_fabric_name(enum fk_fabric_kind f)
{
    return (unsigned)f < 3 ? fk__fabric_names[f] : "?";
}
const char *fk_durability_name(enum fk_durability d)
{
    return (unsigned)d < 2 ? fk__dur_names[d] : "?";
}

/* Records the first error; returns 0 so inih reports the line number. */
static int fk__fail(struct fk__conf_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int fk__fail(struct fk__conf_ctx *c, const char *fmt, ...)
{
    if (c->msg[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof c->msg, fmt, ap);
        va_end(ap);
    }
    return 0;
}

int fk_conf_split_address(const char *address, char *ip, size_t ipcap, uint16_t *port)
{
    const char *colon, *host = address;
    size_t hlen;
    if (address == NULL || *address == '\0')
        return FK_EINVAL;
    if (address[0] == '[') {
        const char *close = strchr(address, ']');
        if (close == NULL || close[1] != ':')
            return FK_EINVAL;
        host = address + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(address, ':');
        if (colon == NULL)
            return FK_EINVAL;
        hlen = (size_t)(colon - address);
    }
    if (hlen == 0 || hlen >= ipcap)
        return FK_EINVAL;
    char *end;
    errno = 0;
    unsigned long p = strtoul(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || p == 0 || p > 65535)
        return FK_EINVAL;
    memcpy(ip, host, hlen);
    ip[hlen] = '\0';
    *port = (uint16_t)p;
    return 0;
}

/* Copies value into dst (capacity cap); fails on overflow. */
static int fk__copy(struct fk__conf_ctx *c, char *dst, size_t cap, const char *name,
                    const char *value)
{
    size_t n = strlen(value);
    if (n >= cap)
        return fk__fail(c, "%s is longer than %zu characters", name, cap - 1);
    memcpy(dst, value, n + 1);
    return 1;
}

/* Joins dir and a relative path; absolute paths are kept as they are. */
static int fk__path(struct fk__conf_ctx *c, char *dst, size_t cap, const char *name,
                    const char *value)
{
    if (value[0] == '/' || c->conf->dir[0] == '\0')
        return fk__copy(c, dst, cap, name, value);
    int n = snprintf(dst, cap, "%s/%s", c->conf->dir, value);
    if (n < 0 || (size_t)n >= cap)
        return fk__fail(c, "%s is longer than %zu characters", name, cap - 1);
    return 1;
}

static int fk__set_token(struct fk__conf_ctx *c, const char *tok)
{
    size_t n = strlen(tok);
    if (n < FK_CONF_TOKEN_MIN || n > FK_CONF_TOKEN_MAX)
        return fk__fail(c, "token must be %d to %d characters, got %zu", FK_CONF_TOKEN_MIN,
                        FK_CONF_TOKEN_MAX, n);
    for (size_t i = 0; i < n; i++)
        if (tok[i] <= ' ' || tok[i] > '~')
            return fk__fail(c, "token must be printable ASCII without spaces");
    memcpy(c->conf->token, tok, n + 1);
    c->have_token = 1;
    return 1;
}

static int fk__read_token_file(struct fk__conf_ctx *c, const char *value)
{
    char path[FK_CONF_STR_MAX];
    if (!fk__path(c, path, sizeof path, "token_file", value))
        return 0;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fk__fail(c, "token_file %s: %s", path, strerror(errno));
    char line[FK_CONF_TOKEN_MAX + 3] = "";
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    if (got == NULL)
        return fk__fail(c, "token_file %s is empty", path);
    line[strcspn(line, "\r\n")] = '\0';
    return fk__set_token(c, line);
}

/* A list of node ids ("2, 1, 0") into ids[], at most FK_CONF_MAX_NODES;
 * 1 (fk__fail's convention) or fk__fail's result naming `name`. */
static int fk__parse_ids(struct fk__conf_ctx *c, const char *name, const char *value, uint32_t *ids,
                         uint32_t *n)
{
    const char *p = value;
    *n = 0;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long id = strtoul(p, &end, 10);
        if (end == p || errno != 0 || id >= FK_CONF_MAX_NODES)
            return fk__fail(c, "%s: '%s' is not a list of node ids", name, value);
        if (*n == FK_CONF_MAX_NODES)
            return fk__fail(c, "%s: more than %d entries", name, FK_CONF_MAX_NODES);
        ids[(*n)++] = (uint32_t)id;
        p = end;
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
    }
    if (*n == 0)
        return fk__fail(c, "%s: empty list", name);
    return 1;
}

static int fk__parse_sequencers(struct fk__conf_ctx *c, const char *value)
{
    struct fk_cluster_conf *conf = c->conf;
    int rc = fk__parse_ids(c, "sequencers", value, conf->sequencers, &conf->n_sequencers);
    c->have_sequencers = rc == 1;
    return rc;
}

static int fk__parse_members(struct fk__conf_ctx *c, const char *value)
{
    uint32_t ids[FK_CONF_MAX_NODES], n;
    int rc = fk__parse_ids(c, "members", value, ids, &n);
    if (rc != 1)
        return rc;
    c->conf->members = 0;
    for (uint32_t i = 0; i < n; i++)
        c->conf->members |= 1ull << ids[i];
    c->have_members = 1;
    return 1;
}

static int fk__cluster_key(struct fk__conf_ctx *c, const char *name, const char *value)
{
    int v;
    if (strcmp(name, "protocol") == 0) {
        if ((v = fk_protocol_parse(value)) < 0)
            return fk__fail(c, "protocol must be nopaxos or multipaxos, not '%s'", value);
        c->conf->protocol = (enum fk_protocol)v;
        return 1;
    }
    if (strcmp(name, "durability") == 0) {
        if ((v = fk_durability_parse(value)) < 0)
            return fk__fail(c, "durability must be sync or async, not '%s'", value);
        c->conf->durability = (enum fk_durability)v;
        return 1;
    }
    if (strcmp(name, "token") == 0)
        return fk__set_token(c, value);
    if (strcmp(name, "token_file") == 0)
        return fk__read_token_file(c, value);
    if (strcmp(name, "sequencers") == 0)
        return fk__parse_sequencers(c, value);
    if (strcmp(name, "members") == 0)
        return fk__parse_members(c, value);
    if (strcmp(name, "epoch") == 0) {
        char *end;
        errno = 0;
        unsigned long e = strtoul(value, &end, 10);
        if (end == value || *end != '\0' || errno != 0 || e > FK_CONF_EPOCH_MAX)
            return fk__fail(c, "epoch must be 0..%d, not '%s'", FK_CONF_EPOCH_MAX, value);
        c->conf->epoch = (uint32_t)e;
        c->have_epoch = 1;
        return 1;
    }
    if (strcmp(name, "quota") == 0 || strcmp(name, "map_size") == 0) {
        uint64_t b;
        if (fk_conf_parse_size(value, &b) < 0 || b == 0)
            return fk__fail(c, "%s must be a size such as 512MiB or 2GiB, not '%s'", name, value);
        *(name[0] == 'q' ? &c->conf->quota : &c->conf->map_size) = b;
        return 1;
    }
    if (strcmp(name, "flow_memory") == 0) {
        uint64_t b;
        if (fk_conf_parse_size(value, &b) < 0 || b < FK_CONF_FLOW_MEMORY_MIN)
            return fk__fail(c, "flow_memory must be a size of at least 64KiB, not '%s'", value);
        c->conf->flow_memory = b;
        return 1;
    }
    if (strcmp(name, "transfer_chunk") == 0) {
        uint64_t b;
        if (fk_conf_parse_size(value, &b) < 0 || b < (4u << 10) || b > (1u << 20))
            return fk__fail(c, "transfer_chunk must be a size from 4KiB to 1MiB, not '%s'", value);
        c->conf->transfer_chunk = (uint32_t)b;
        return 1;
    }
    if (strcmp(name, "transfer_window") == 0) {
        char *end;
        unsigned long w = strtoul(value, &end, 10);
        if (*end != '\0' || w < 1 || w > 16)
            return fk__fail(c, "transfer_window must be 1..16 chunks, not '%s'", value);
        c->conf->transfer_window = (uint32_t)w;
        return 1;
    }
    return fk__fail(c, "unknown key '%s' in [cluster]", name);
}

static int fk__node_key(struct fk__conf_ctx *c, uint32_t id, const char *name, const char *value)
{
    struct fk_node_conf *n = &c->conf->nodes[id];
    if (strcmp(name, "address") == 0) {
        if (fk_conf_split_address(value, n->ip, sizeof n->ip, &n->port) < 0)
            return fk__fail(c, "address '%s' is not host:port with port 1..65535", value);
        c->node_has_address |= 1u << id;
        return fk__copy(c, n->address, sizeof n->address, name, value);
    }
    if (strcmp(name, "host") == 0)
        return fk__copy(c, n->host, sizeof n->host, name, value);
    if (strcmp(name, "fabric") == 0) {
        int v = fk_fabric_parse(value);
        if (v < 0)
            return fk__fail(c, "fabric must be auto, tcp or verbs, not '%s'", value);
        n->fabric = (enum fk_fabric_kind)v;
        return 1;
    }
    if (strcmp(name, "rdma_device") == 0)
        return fk__copy(c, n->rdma_device, sizeof n->rdma_device, name, value);
    if (strcmp(name, "data_dir") == 0)
        return fk__path(c, n->data_dir, sizeof n->data_dir, name, value);
    if (strcmp(name, "metrics") == 0) {
        char ip[FK_CONF_STR_MAX];
        uint16_t port;
        if (fk_conf_split_address(value, ip, sizeof ip, &port) < 0)
            return fk__fail(c, "metrics '%s' is not host:port", value);
        return fk__copy(c, n->metrics, sizeof n->metrics, name, value);
    }
    return fk__fail(c, "unknown key '%s' in [node %u]", name, id);
}

static int fk__handler(void *user, const char *section, const char *name, const char *value)
{
    struct fk__conf_ctx *c = user;
    if (strcmp(section, "cluster") == 0)
        return fk__cluster_key(c, name, value);
    unsigned id;
    int used = 0;
    if (sscanf(section, "node %u%n", &id, &used) == 1 && section[used] == '\0') {
        if (id >= FK_CONF_MAX_NODES)
            return fk__fail(c, "node id %u is not below %d", id, FK_CONF_MAX_NODES);
        c->seen_nodes |= 1u << id;
        c->conf->nodes[id].id = id;
        return fk__node_key(c, id, name, value);
    }
    if (section[0] == '\0')
        return fk__fail(c, "key '%s' outside any [section]", name);
    return fk__fail(c, "unknown section [%s] (expected [cluster] or [node N])", section);
}

/* Whole-file checks after parsing. Each returns 0 or FK_ECONFIG with c->msg
 * set; fk__fail's result (0) is discarded on purpose. */
#define FK__INVALID(c, ...) (fk__fail((c), __VA_ARGS__), FK_ECONFIG)

static int fk__validate_nodes(struct fk__conf_ctx *c)
{
    struct fk_cluster_conf *conf = c->conf;
    uint32_t n = 0;
    while (n < FK_CONF_MAX_NODES && (c->seen_nodes & (1u << n)))
        n++;
    if (n == 0 || c->seen_nodes != (1u << n) - 1)
        return FK__INVALID(c, "nodes must be [node 0] .. [node N-1] without holes");
    if (n % 2 == 0 && !c->have_members)
        return FK__INVALID(c, "%u nodes: a cluster needs an odd number (2f + 1), or `members`", n);
    if (c->have_members && (c->conf->members >> n) != 0)
        return FK__INVALID(c, "members: a member is not a node (nodes 0..%u)", n - 1);
    if (c->have_members && c->conf->protocol == FK_PROTO_NOPAXOS)
        return FK__INVALID(c, "members: nopaxos has no membership changes yet (every node votes)");
    if (c->have_epoch && c->conf->protocol == FK_PROTO_NOPAXOS)
        return FK__INVALID(c, "epoch: nopaxos has no membership changes yet (no epochs)");
    conf->n_nodes = n;
    for (uint32_t i = 0; i < n; i++) {
        struct fk_node_conf *a = &conf->nodes[i];
        if (!(c->node_has_address & (1u << i)))
            return FK__INVALID(c, "[node %u] has no address", i);
        if (a->host[0] == '\0')
            memcpy(a->host, a->ip, sizeof a->host);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(conf->nodes[j].address, a->address) == 0)
                return FK__INVALID(c, "nodes %u and %u share address %s", j, i, a->address);
    }
    return 0;
}

static int fk__validate(struct fk__conf_ctx *c)
{
    struct fk_cluster_conf *conf = c->conf;
    if (!c->have_token)
        return FK__INVALID(c, "[cluster] needs token or token_file");
    int rc = fk__validate_nodes(c);
    if (rc < 0)
        return rc;
    if (!c->have_sequencers) {
        /* Every node, the last first: view 0's leader is node 0, and a
         * sequencer apart from the leader means that one failure never
         * takes both (NOPaxos runs it apart from the replicas, section 3):
         * a leader crash or cut costs a view change, not a view change and
         * a sequencer failover. */
        conf->n_sequencers = conf->n_nodes;
        for (uint32_t i = 0; i < conf->n_nodes; i++)
            conf->sequencers[i] = conf->n_nodes - 1 - i;
    }
    for (uint32_t i = 0; i < conf->n_sequencers; i++)
        if (conf->sequencers[i] >= conf->n_nodes)
            return FK__INVALID(c, "sequencer %u is not a node", conf->sequencers[i]);
    return 0;
}

int fk_conf_parse(const char *text, const char *name, const char *dir, struct fk_cluster_conf *out,
                  char *err, size_t errcap)
{
    struct fk__conf_ctx c;
    memset(&c, 0, sizeof c);
    memset(out, 0, sizeof *out);
    out->flow_memory = FK_CONF_FLOW_MEMORY_DEFAULT;
    c.conf = out;
    if (dir && snprintf(out->dir, sizeof out->dir, "%s", dir) >= (int)sizeof out->dir) {
        if (err)
            snprintf(err, errcap, "%s: directory name too long", name);
        return FK_ECONFIG;
    }
    int line = ini_parse_string(text, fk__handler, &c);
    int rc = 0;
    if (line > 0 && c.msg[0] == '\0')
        fk__fail(&c, "syntax error (expected [section] or key = value)");
    if (line != 0)
        rc = FK_ECONFIG;
    else
        rc = fk__validate(&c);
    if (rc < 0 && err) {
        if (line > 0)
            snprintf(err, errcap, "%s:%d: %s", name, line, c.msg);
        else
            snprintf(err, errcap, "%s: %s", name, c.msg);
    }
    return rc;
}

void fk_conf_ids(uint64_t mask, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < 64 && n + 4 < cap; i++)
        if (mask >> i & 1)
            n += (size_t)snprintf(buf + n, cap - n, "%s%u", n ? "," : "", i);
}

int fk_conf_load(const char *path, struct fk_cluster_conf *out, char *err, size_t errcap)
{
    /* Read the whole file (bounded: a description is small) so that parse
     * errors and the relative-path directory come from one place. */
    enum { FK_CONF_FILE_MAX = 1 << 20 };
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        if (err)
            snprintf(err, errcap, "%s: %s", path, strerror(e));
        return -e;
    }
    char *text = malloc(FK_CONF_FILE_MAX + 1);
    if (text == NULL) {
        fclose(f);
        return FK_ENOMEM;
    }
    size_t n = fread(text, 1, FK_CONF_FILE_MAX + 1, f);
    int rerr = ferror(f);
    fclose(f);
    if (rerr || n > FK_CONF_FILE_MAX) {
        free(text);
        if (err)
            snprintf(err, errcap, "%s: %s", path, rerr ? "read error" : "larger than 1 MiB");
        return rerr ? -EIO : FK_ECONFIG;
    }
    text[n] = '\0';
    char dir[FK_CONF_STR_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path == 0 ? 1 : slash - path), path);
    int rc = fk_conf_parse(text, path, dir, out, err, errcap);
    free(text);
    return rc;
}
