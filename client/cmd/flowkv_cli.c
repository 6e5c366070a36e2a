/* flowkv: the command-line client (libflowkv, client/flowkv.h). */
#include "fk_conf.h"
#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"
#include "fk_version.h"
#include "cli_snap.h"
#include "flowkv.h"

#include <assert.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Exit statuses, distinct so scripts can tell outcomes apart. */
enum {
    EXIT_OK = 0,
    EXIT_NOTFOUND = 1,
    EXIT_USAGE = 2,
    EXIT_ERROR = 3,
    EXIT_UNREACHABLE = 4,
    EXIT_CASFAIL = 5,
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: flowkv [-c CLUSTER.conf] [-t MS] [-w text|json] COMMAND [ARGS]\n"
            "  get KEY               print the value\n"
            "  put KEY [VALUE|-]     set KEY (the value from stdin when absent or -)\n"
            "  del KEY               delete KEY\n"
            "  cas KEY EXPECTED NEW  set KEY to NEW if its value is EXPECTED\n"
            "  scan [START [COUNT [END]]]\n"
            "                        up to COUNT (default 16, at most 10000) pairs from\n"
            "                        START up to END (exclusive), in key order\n"
            "  status                each replica's role, term, commit point, lag, fabric;\n"
            "                        exit 4 when a replica is unreachable or knows no leader\n"
            "  snapshot save FILE [REPLICA]\n"
            "                        a consistent backup of one replica's state (default: a\n"
            "                        follower) into FILE, checksummed; restore it with\n"
            "                        flowkv-server --restore FILE on every replica of a\n"
            "                        new cluster\n"
            "  snapshot status FILE  check FILE whole and print what it holds\n"
            "  member list           the replicas that vote, and the learners (Multi-Paxos)\n"
            "  member add ID | remove ID | replace OLD NEW\n"
            "                        change the replicas that vote; a new one must have\n"
            "                        caught up as a learner (retried until it has, within\n"
            "                        the timeout)\n"
            "options:\n"
            "  -c, --cluster PATH    cluster description (default: $FLOWKV_CLUSTER, else\n"
            "                        ./run/cluster.conf, else /etc/flowkv/cluster.conf)\n"
            "  -t, --timeout MS      per operation, retries included (default\n"
            "                        $FLOWKV_TIMEOUT, else 5000)\n"
            "  -w, --write-out FMT   text (default) or json: get, scan and status as JSON,\n"
            "                        keys and values base64 as etcdctl writes them\n"
            "  -V, --version         print the version\n"
            "exit status: 0 ok, 1 not found, 2 usage, 3 error, 4 unreachable or timed out\n"
            "(status: a replica unreachable or without a leader), 5 compare-and-swap mismatch\n");
}

/* The commands and their argument counts, checked before connecting. */
static const struct command {
    const char *name;
    int min, max;
    const char *args;
} commands[] = {
    {"get", 1, 1, "KEY"},
    {"put", 1, 2, "KEY [VALUE|-]"},
    {"del", 1, 1, "KEY"},
    {"cas", 3, 3, "KEY EXPECTED NEW"},
    {"scan", 0, 3, "[START [COUNT [END]]]"},
    {"status", 0, 0, ""},
    {"snapshot", 2, 3, "save FILE [REPLICA] or status FILE"},
    {"member", 1, 3, "list, add ID, remove ID or replace OLD NEW"},
};

static int json; /* -w json */

/* Writes len bytes as a JSON string of their base64 (RFC 4648). */
static void json_b64(const uint8_t *p, size_t len)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    putchar('"');
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < len)
            v |= p[i + 2];
        putchar(a[v >> 18 & 63]);
        putchar(a[v >> 12 & 63]);
        putchar(i + 1 < len ? a[v >> 6 & 63] : '=');
        putchar(i + 2 < len ? a[v & 63] : '=');
    }
    putchar('"');
}

/* The cluster file: -c, else $FLOWKV_CLUSTER, else the first that exists
 * of ./run/cluster.conf (make run's) and /etc/flowkv/cluster.conf (a
 * deployed host's), else ./run/cluster.conf (its error names it). */
static const char *cluster_path(const char *flag)
{
    const char *env = getenv("FLOWKV_CLUSTER");
    if (flag != NULL)
        return flag;
    if (env != NULL && *env != '\0')
        return env;
    if (access("run/cluster.conf", F_OK) != 0 && access("/etc/flowkv/cluster.conf", F_OK) == 0)
        return "/etc/flowkv/cluster.conf";
    return "run/cluster.conf";
}

static int exit_for(int rc)
{
    if (rc == 0)
        return EXIT_OK;
    if (rc == FK_ENOTFOUND)
        return EXIT_NOTFOUND;
    if (rc == FK_ECASFAIL)
        return EXIT_CASFAIL;
    if (rc == FK_ETIMEDOUT || rc == FK_EUNREACHABLE)
        return EXIT_UNREACHABLE;
    return EXIT_ERROR;
}

/* One line on stderr: what failed, why, and the replicas' detail if any. */
static int fail(const flowkv *kv, const char *what, int rc)
{
    const char *detail = flowkv_error_detail(kv);
    if (*detail)
        fprintf(stderr, "flowkv: %s: %s (%s)\n", what, fk_strerror(rc), detail);
    else
        fprintf(stderr, "flowkv: %s: %s\n", what, fk_strerror(rc));
    return exit_for(rc);
}

/* Reads stdin into buf (at most FLOWKV_VAL_MAX bytes; more is an error). */
static int read_stdin(char *buf, size_t *len)
{
    *len = fread(buf, 1, FLOWKV_VAL_MAX + 1, stdin);
    if (ferror(stdin))
        return FK_EINVAL;
    return *len > FLOWKV_VAL_MAX ? FK_EVALSIZE : 0;
}

/* Healthy as etcdctl's endpoint health means it: every replica answers and
 * knows a leader. */
static int cmd_status(flowkv *kv, uint64_t timeout_ns)
{
    if (!json)
        printf("%-3s %-12s %-11s %-7s %-20s %-8s %-10s %-10s %-6s %-10s %-5s %s\n", "id", "role",
               "protocol", "fabric", "term", "leader", "commit", "applied", "lag", "last", "epoch",
               "members");
    uint64_t top = 0;
    struct flowkv_replica_status st[16];
    uint32_t n = flowkv_replicas(kv);
    for (uint32_t i = 0; i < n && i < 16; i++) {
        flowkv_status(kv, i, &st[i], timeout_ns);
        if (st[i].reachable && st[i].commit > top)
            top = st[i].commit;
    }
    int unhealthy = 0;
    if (json)
        printf("{\"replicas\":[");
    for (uint32_t i = 0; i < n && i < 16; i++) {
        int no_leader = st[i].reachable && st[i].leader >= n;
        if (!st[i].reachable || no_leader) {
            fprintf(stderr, "flowkv: status: replica %u %s\n", i,
                    no_leader ? "knows no leader" : "is unreachable");
            unhealthy++;
        }
        if (json) {
            printf("%s{\"id\":%u,\"reachable\":%s", i ? "," : "", i,
                   st[i].reachable ? "true" : "false");
            if (st[i].reachable)
                printf(",\"role\":\"%s\",\"protocol\":\"%s\",\"fabric\":\"%s\",\"term\":%llu,"
                       "\"leader\":%lld,\"commit\":%llu,\"applied\":%llu,\"lag\":%llu,"
                       "\"last\":%llu,\"epoch\":%u,\"members\":%llu",
                       st[i].role, st[i].protocol, st[i].fabric, (unsigned long long)st[i].term,
                       st[i].leader < n ? (long long)st[i].leader : -1LL,
                       (unsigned long long)st[i].commit, (unsigned long long)st[i].applied,
                       (unsigned long long)(top - st[i].commit), (unsigned long long)st[i].last,
                       st[i].epoch, (unsigned long long)st[i].members);
            printf("}");
            continue;
        }
        if (!st[i].reachable) {
            printf("%-3u %s\n", i, "unreachable");
            continue;
        }
        char leader[16] = "-";
        if (st[i].leader < n)
            snprintf(leader, sizeof(leader), "%u", st[i].leader);
        char mem[64];
        fk_conf_ids(st[i].members, mem, sizeof mem);
        printf("%-3u %-12s %-11s %-7s %-20llu %-8s %-10llu %-10llu %-6llu %-10llu %-5u %s\n", i,
               st[i].role, st[i].protocol, st[i].fabric, (unsigned long long)st[i].term, leader,
               (unsigned long long)st[i].commit, (unsigned long long)st[i].applied,
               (unsigned long long)(top - st[i].commit), (unsigned long long)st[i].last,
               st[i].epoch, mem);
    }
    if (json)
        printf("],\"healthy\":%s}\n", unhealthy ? "false" : "true");
    return unhealthy ? EXIT_UNREACHABLE : EXIT_OK;
}

static int print_pair(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
    unsigned long *n = arg;
    if (json) {
        printf("%s{\"key\":", (*n)++ ? "," : "");
        json_b64(k, kl);
        printf(",\"value\":");
        json_b64(v, vl);
        putchar('}');
        return 0;
    }
    printf("%.*s\t%.*s\n", (int)kl, (const char *)k, (int)vl, (const char *)v);
    return 0;
}

/* Pages through the range (flowkv_scan_range), printing as it goes. */
static int cmd_scan(flowkv *kv, int argc, char **argv)
{
    const char *start = argc > 0 ? argv[0] : "";
    const char *stop = argc > 2 ? argv[2] : "";
    char *end = NULL;
    long count = argc > 1 ? strtol(argv[1], &end, 10) : FLOWKV_SCAN_MAX;
    if (argc > 3 || (end != NULL && *end != '\0') || count < 1 || count > FLOWKV_SCAN_COUNT_MAX) {
        fprintf(stderr, "flowkv: scan [START [COUNT [END]]] with COUNT 1..%d\n",
                FLOWKV_SCAN_COUNT_MAX);
        return EXIT_USAGE;
    }
    unsigned long n = 0;
    if (json)
        printf("{\"kvs\":[");
    int rc = flowkv_scan_range(kv, start, strlen(start), stop, strlen(stop), (uint32_t)count,
                               print_pair, &n);
    if (json) /* whole JSON even when the scan failed part way (the exit status says so) */
        printf("],\"count\":%lu}\n", n);
    return rc < 0 ? fail(kv, "scan", rc) : EXIT_OK;
}

/* `flowkv member ...` (consensus/mpx.h, "Reconfiguration"): the newest
 * configuration any replica reports, then the change from it, retried
 * while the leader answers FK_EAGAIN (a new member still catching up). */
static int cmd_member(flowkv *kv, int argc, char **argv, uint64_t timeout_ns)
{
    uint32_t n = flowkv_replicas(kv), epoch = 0, seen = 0;
    uint64_t members = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct flowkv_replica_status st;
        flowkv_status(kv, i, &st, timeout_ns < 2000000000ULL ? timeout_ns : 2000000000ULL);
        if (st.reachable && (!seen || st.epoch > epoch)) {
            epoch = st.epoch;
            members = st.members;
        }
        seen += (uint32_t)st.reachable;
    }
    if (!seen) {
        fprintf(stderr, "flowkv: member: no replica answered\n");
        return EXIT_UNREACHABLE;
    }
    char a[64], b[64];
    if (strcmp(argv[0], "list") == 0 && argc == 1) {
        fk_conf_ids(members, a, sizeof a);
        fk_conf_ids(((1ull << n) - 1) & ~members, b, sizeof b);
        if (json)
            printf("{\"epoch\":%u,\"members\":[%s],\"learners\":[%s]}\n", epoch, a, b);
        else
            printf("epoch %u members %s learners %s\n", epoch, a, *b ? b : "-");
        return EXIT_OK;
    }
    uint64_t next = members;
    char *end;
    unsigned long x = argc >= 2 ? strtoul(argv[1], &end, 10) : n, y = n;
    int ok = argc >= 2 && *end == '\0' && x < n;
    if (ok && strcmp(argv[0], "replace") == 0 && argc == 3) {
        y = strtoul(argv[2], &end, 10);
        ok = *end == '\0' && y < n && (members >> x & 1) && !(members >> y & 1);
        next = (members & ~(1ull << x)) | (1ull << y);
    } else if (ok && strcmp(argv[0], "add") == 0 && argc == 2) {
        ok = !(members >> x & 1);
        next = members | (1ull << x);
    } else if (ok && strcmp(argv[0], "remove") == 0 && argc == 2) {
        ok = (members >> x & 1) && (members & ~(1ull << x)) != 0;
        next = members & ~(1ull << x);
    } else {
        ok = 0;
    }
    if (!ok) {
        fk_conf_ids(members, a, sizeof a);
        fprintf(stderr,
                "flowkv: member: takes add ID (a learner), remove ID (a member, not the last) "
                "or replace OLD NEW, ids 0..%u; the members are %s\n",
                n - 1, a);
        return EXIT_USAGE;
    }
    uint64_t deadline = fk_now_ns() + (timeout_ns > 10000000000ULL ? timeout_ns : 10000000000ULL);
    int rc;
    while ((rc = flowkv_member_change(kv, epoch, next)) == FK_EAGAIN && fk_now_ns() < deadline)
        usleep(100000); /* a new member still catching up, or a change under way */
    if (rc < 0)
        return fail(kv, "member", rc);
    fk_conf_ids(next, a, sizeof a);
    if (json)
        printf("{\"epoch\":%u,\"members\":[%s]}\n", epoch + 1, a);
    else
        printf("epoch %u members %s\n", epoch + 1, a);
    return EXIT_OK;
}

static int run(flowkv *kv, const char *cmd, int argc, char **argv, uint64_t timeout_ns)
{
    static char val[FLOWKV_VAL_MAX + 1];
    size_t vlen = 0;
    int rc;
    if (strcmp(cmd, "status") == 0 && argc == 0)
        return cmd_status(kv, timeout_ns < 2000000000ULL ? timeout_ns : 2000000000ULL);
    if (strcmp(cmd, "scan") == 0)
        return cmd_scan(kv, argc, argv);
    if (strcmp(cmd, "snapshot") == 0)
        return cli_snapshot(kv, argc, argv, timeout_ns, json);
    if (strcmp(cmd, "member") == 0)
        return cmd_member(kv, argc, argv, timeout_ns);
    if (strcmp(cmd, "get") == 0 && argc == 1) {
        rc = flowkv_get(kv, argv[0], strlen(argv[0]), val, sizeof(val), &vlen);
        if (rc < 0)
            return fail(kv, "get", rc);
        if (json) {
            printf("{\"key\":");
            json_b64((const uint8_t *)argv[0], strlen(argv[0]));
            printf(",\"value\":");
            json_b64((const uint8_t *)val, vlen);
            printf("}\n");
            return EXIT_OK;
        }
        fwrite(val, 1, vlen, stdout);
        if (vlen == 0 || val[vlen - 1] != '\n')
            putchar('\n');
        return EXIT_OK;
    }
    if (strcmp(cmd, "put") == 0 && (argc == 1 || argc == 2)) {
        const char *v = argc == 2 ? argv[1] : "-";
        if (strcmp(v, "-") == 0) {
            rc = read_stdin(val, &vlen);
            if (rc < 0)
                return fail(kv, "reading the value from stdin", rc);
            v = val;
        } else {
            vlen = strlen(v);
        }
        rc = flowkv_put(kv, argv[0], strlen(argv[0]), v, vlen);
        return rc < 0 ? fail(kv, "put", rc) : EXIT_OK;
    }
    if (strcmp(cmd, "del") == 0 && argc == 1) {
        rc = flowkv_del(kv, argv[0], strlen(argv[0]));
        return rc < 0 ? fail(kv, "del", rc) : EXIT_OK;
    }
    if (strcmp(cmd, "cas") == 0 && argc == 3) {
        rc = flowkv_cas(kv, argv[0], strlen(argv[0]), argv[1], strlen(argv[1]), argv[2],
                        strlen(argv[2]));
        return rc < 0 ? fail(kv, "cas", rc) : EXIT_OK;
    }
    assert(!"every command is checked before run");
    return EXIT_USAGE;
}

/* The command and its argument count, before connecting: an unknown
 * command or a wrong count names itself. */
static int check_command(const char *cmd, int argc)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(cmd, commands[i].name) != 0)
            continue;
        if (argc >= commands[i].min && argc <= commands[i].max)
            return EXIT_OK;
        fprintf(stderr, "flowkv: %s takes %s (%d given)\n", cmd,
                *commands[i].args ? commands[i].args : "no arguments", argc);
        return EXIT_USAGE;
    }
    fprintf(stderr,
            "flowkv: unknown command '%s' (get, put, del, cas, scan, status, snapshot; --help)\n",
            cmd);
    return EXIT_USAGE;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {{"cluster", required_argument, NULL, 'c'},
                                             {"timeout", required_argument, NULL, 't'},
                                             {"write-out", required_argument, NULL, 'w'},
                                             {"version", no_argument, NULL, 'V'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *path = NULL;
    if (getenv("FLOWKV_LOG") == NULL)
        fk_log_set_level(FK_LOG_WARN); /* a command's output is its answer */
    long timeout_ms = 5000;
    const char *env_timeout = getenv("FLOWKV_TIMEOUT");
    if (env_timeout != NULL && *env_timeout != '\0') {
        char *end;
        timeout_ms = strtol(env_timeout, &end, 10);
        if (*end != '\0' || timeout_ms < 1 || timeout_ms > 3600000) {
            fprintf(stderr, "flowkv: FLOWKV_TIMEOUT '%s': 1..3600000 milliseconds\n", env_timeout);
            return EXIT_USAGE;
        }
    }
    int c;
    while ((c = getopt_long(argc, argv, "+c:t:w:Vh", longopts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c':
            path = optarg;
            break;
        case 't':
            timeout_ms = strtol(optarg, &end, 10);
            if (*end != '\0' || timeout_ms < 1 || timeout_ms > 3600000) {
                fprintf(stderr, "flowkv: --timeout '%s': 1..3600000 milliseconds\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'w':
            if (strcmp(optarg, "json") != 0 && strcmp(optarg, "text") != 0) {
                fprintf(stderr, "flowkv: --write-out '%s': text or json\n", optarg);
                return EXIT_USAGE;
            }
            json = strcmp(optarg, "json") == 0;
            break;
        case 'V':
            printf("flowkv %s\n", FK_VERSION);
            return EXIT_OK;
        case 'h':
            usage(stdout);
            return EXIT_OK;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    int bad = check_command(argv[optind], argc - optind - 1);
    if (bad != EXIT_OK)
        return bad;
    if (strcmp(argv[optind], "snapshot") == 0 && strcmp(argv[optind + 1], "save") != 0)
        return cli_snapshot(NULL, argc - optind - 1, argv + optind + 1, 0, json); /* no cluster */
    path = cluster_path(path);
    struct flowkv_opts o = {.timeout_ns = (uint64_t)timeout_ms * 1000000ULL};
    char err[512];
    flowkv *kv;
    int rc = flowkv_open(path, &o, &kv, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "flowkv: %s\n", err);
        return rc == FK_ECONFIG || rc < -4096 ? exit_for(rc) : EXIT_ERROR;
    }
    rc = run(kv, argv[optind], argc - optind - 1, argv + optind + 1, o.timeout_ns);
    flowkv_close(kv);
    return rc;
}
