/* Unit tests for server/srv_opts: flags override the cluster file. */
#include "check.h"
#include "fk_error.h"
#include "srv_node.h" /* SRV_MAP_NEED */
#include "srv_opts.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The sentinel of parse()'s variadic list, typed so that it is a pointer. */
#define END ((const char *)NULL)

static char path[64];
static struct srv_opts o;
static char err[512];

static void write_conf(void)
{
    snprintf(path, sizeof path, "/tmp/fkopts.%d.conf", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("[cluster]\ntoken = 0123456789abcdef\nprotocol = nopaxos\n"
          "[node 0]\naddress = 127.0.0.1:7000\ndata_dir = d0\nmetrics = 127.0.0.1:9000\n"
          "[node 1]\naddress = 127.0.0.1:7001\n"
          "[node 2]\naddress = 127.0.0.1:7002\ndata_dir = /abs/d2\nfabric = verbs\n",
          f);
    fclose(f);
}

/* Parses a NULL-terminated argument list. */
static int parse(const char *first, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "flowkv-server";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return srv_opts_parse(argc, argv, &o, err, sizeof err);
}

/* Replaces the cluster file with text. */
static void cluster_file(const char *text)
{
    FILE *q = fopen(path, "w");
    CHECK(q != NULL);
    fputs(text, q);
    fclose(q);
}

TEST(opts_file_values_and_overrides)
{
    write_conf();
    unsetenv("FLOWKV_FABRIC");
    CHECK_OK(parse("-c", path, "-i", "0", END));
    CHECK_EQ_U64(o.id, 0);
    CHECK_EQ_I64(o.cluster.protocol, FK_PROTO_NOPAXOS);
    CHECK_EQ_STR(srv_opts_self(&o)->data_dir, "/tmp/d0");
    CHECK_EQ_STR(srv_opts_self(&o)->metrics, "127.0.0.1:9000");
    CHECK_EQ_U64(o.map_size, SRV_MAP_NEED(2ULL << 30));
    CHECK_OK(parse("--config", path, "--id=2", "--protocol", "multipaxos", "-D", "async", "-f",
                   "tcp", "-m", "off", "-M", "8192", "-l", "debug", END));
    CHECK_EQ_I64(o.cluster.protocol, FK_PROTO_MULTIPAXOS);
    CHECK_EQ_I64(o.cluster.durability, FK_DURABLE_ASYNC);
    CHECK_EQ_I64(srv_opts_self(&o)->fabric, FK_FABRIC_TCP);
    CHECK_EQ_STR(srv_opts_self(&o)->metrics, "");
    CHECK_EQ_U64(o.map_size, 8192ULL << 20);
    CHECK_EQ_U64(o.quota, 2ULL << 30); /* Multi-Paxos's default, as etcd's */
    CHECK_EQ_I64(o.log_level, FK_LOG_DEBUG);
    CHECK_OK(parse("-c", path, "-i", "1", "-d", "/var/x", END));
    CHECK_EQ_STR(srv_opts_self(&o)->data_dir, "/var/x");
    setenv("FLOWKV_FABRIC", "tcp", 1);
    CHECK_OK(parse("-c", path, "-i", "2", END));
    CHECK_EQ_I64(srv_opts_self(&o)->fabric, FK_FABRIC_TCP);
    CHECK_OK(parse("-c", path, "-i", "2", "-f", "auto", END));
    CHECK_EQ_I64(srv_opts_self(&o)->fabric, FK_FABRIC_AUTO);
    /* --restore seeds a new cluster: it implies --new-cluster. */
    CHECK_OK(parse("-c", path, "-i", "0", END));
    CHECK(o.restore == NULL && !o.new_cluster);
    CHECK_OK(parse("-c", path, "-i", "0", "--restore", "/tmp/b.db", END));
    CHECK_EQ_STR(o.restore, "/tmp/b.db");
    CHECK(o.new_cluster);
    unlink(path);
}

TEST(opts_help_and_version)
{
    CHECK_OK(parse("--help", END));
    CHECK(o.show_help);
    CHECK_OK(parse("-V", END));
    CHECK(o.show_version);
}

static void expect(int rc, int code, const char *needle)
{
    CHECK_EQ_I64(rc, code);
    CHECK_MSG(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
}

TEST(opts_errors_are_clear)
{
    write_conf();
    unsetenv("FLOWKV_FABRIC");
    expect(parse("-i", "0", END), FK_EINVAL, "--config and --id are required");
    expect(parse("-c", path, "-i", "3", END), FK_EINVAL, "--id '3': the cluster has 3 nodes");
    expect(parse("-c", path, "-i", "x", END), FK_EINVAL, "--id 'x'");
    expect(parse("-c", path, "-i", "1", END), FK_ECONFIG, "node 1 has no data_dir");
    expect(parse("-c", path, "-i", "0", "-p", "raft", END), FK_EINVAL, "--protocol 'raft'");
    expect(parse("-c", path, "-i", "0", "-m", "nowhere", END), FK_EINVAL, "--metrics");
    expect(parse("-c", path, "-i", "0", "-M", "-5", END), FK_EINVAL, "--map-size '-5'");
    expect(parse("-c", path, "-i", "0", "--bogus", END), FK_EINVAL, "unknown option --bogus");
    expect(parse("-c", path, "-i", END), FK_EINVAL, "needs a value");
    expect(parse("-c", path, "-i", "0", "extra", END), FK_EINVAL, "unexpected argument 'extra'");
    expect(parse("-c", "/nonexistent.conf", "-i", "0", END), -ENOENT, "/nonexistent.conf");
    setenv("FLOWKV_FABRIC", "rdma", 1);
    expect(parse("-c", path, "-i", "0", END), FK_EINVAL, "FLOWKV_FABRIC 'rdma'");
    unsetenv("FLOWKV_FABRIC");
    /* A quota over what a cluster can hold, a map too small for it. */
    cluster_file("[cluster]\ntoken = 0123456789abcdef\nquota = 1025GiB\n"
                 "[node 0]\naddress = 127.0.0.1:7000\ndata_dir = d0\n");
    expect(parse("-c", path, "-i", "0", END), FK_ECONFIG,
           "quota 1100585369600 bytes: a cluster holds at most 1099511627776");
    /* NOPaxos (the default protocol) holds 2 GiB, its default; so does
     * Multi-Paxos; the default map is the room the quota needs. */
    cluster_file("[cluster]\ntoken = 0123456789abcdef\n"
                 "[node 0]\naddress = 127.0.0.1:7000\ndata_dir = d0\n");
    CHECK_OK(parse("-c", path, "-i", "0", END));
    CHECK_EQ_U64(o.quota, 2ULL << 30);
    cluster_file("[cluster]\ntoken = 0123456789abcdef\nprotocol = multipaxos\nquota = 2GiB\n"
                 "[node 0]\naddress = 127.0.0.1:7000\ndata_dir = d0\n");
    CHECK_OK(parse("-c", path, "-i", "0", END));
    CHECK_EQ_U64(o.quota, 2ULL << 30);
    CHECK_EQ_U64(o.map_size, SRV_MAP_NEED(2ULL << 30));
    expect(parse("-c", path, "-i", "0", "-M", "4096", END), FK_ECONFIG,
           "map size 4294967296 bytes: the quota of 2147483648 needs at least");
    /* The file's quota and map size, and --map-size over the file. */
    cluster_file("[cluster]\ntoken = 0123456789abcdef\nquota = 512KiB\nmap_size = 128MiB\n"
                 "[node 0]\naddress = 127.0.0.1:7000\ndata_dir = d0\n");
    CHECK_OK(parse("-c", path, "-i", "0", END));
    CHECK_EQ_U64(o.quota, 512u << 10);
    CHECK_EQ_U64(o.map_size, 128u << 20);
    CHECK_OK(parse("-c", path, "-i", "0", "-M", "256", END));
    CHECK_EQ_U64(o.map_size, 256u << 20);
    expect(parse("-c", path, "-i", "0", "-M", "1", END), FK_ECONFIG, "map size 1048576 bytes");
    /* Nine nodes: a valid cluster file, but more replicas than a group has. */
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("[cluster]\ntoken = 0123456789abcdef\nprotocol = nopaxos\n", f);
    for (int i = 0; i < 9; i++)
        fprintf(f, "[node %d]\naddress = 127.0.0.1:%d\ndata_dir = d%d\n", i, 7000 + i, i);
    fclose(f);
    expect(parse("-c", path, "-i", "0", END), FK_ECONFIG,
           "9 nodes: a replica group has at most 7 replicas");
    unlink(path);
}

CHECK_MAIN()
