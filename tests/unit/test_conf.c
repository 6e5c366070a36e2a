/* Unit tests for common/fk_conf: the cluster description file. */
#include "check.h"
#include "fk_conf.h"
#include "fk_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static struct fk_cluster_conf conf;
static char err[FK_CONF_ERR_MAX];

static const char *good = "; a three-node cluster\n"
                          "[cluster]\n"
                          "protocol = multipaxos\n"
                          "durability = async\n"
                          "token = 0123456789abcdef0123\n"
                          "sequencers = 2, 1\n"
                          "quota = 512KiB\n"
                          "map_size = 2GiB\n"
                          "transfer_chunk = 64KiB\n"
                          "transfer_window = 8\n"
                          "[node 0]\n"
                          "address = 127.0.0.1:7100\n"
                          "data_dir = data/0\n"
                          "[node 1]\n"
                          "address = [::1]:7101\n"
                          "fabric = verbs\n"
                          "rdma_device = rxe0\n"
                          "host = beta\n"
                          "[node 2]\n"
                          "address = localhost:7102 ; inline comment\n"
                          "metrics = 127.0.0.1:9100\n"
                          "data_dir = /abs/2\n";

TEST(conf_parses_every_key)
{
    CHECK_OK(fk_conf_parse(good, "t.conf", "/etc/fk", &conf, err, sizeof err));
    CHECK_EQ_I64(conf.protocol, FK_PROTO_MULTIPAXOS);
    CHECK_EQ_I64(conf.durability, FK_DURABLE_ASYNC);
    CHECK_EQ_STR(conf.token, "0123456789abcdef0123");
    CHECK_EQ_U64(conf.n_nodes, 3);
    CHECK_EQ_U64(conf.n_sequencers, 2);
    CHECK_EQ_U64(conf.sequencers[0], 2);
    CHECK_EQ_U64(conf.sequencers[1], 1);
    CHECK_EQ_U64(conf.quota, 512u << 10);
    CHECK_EQ_U64(conf.map_size, 2ULL << 30);
    CHECK_EQ_U64(conf.transfer_chunk, 64u << 10);
    CHECK_EQ_U64(conf.transfer_window, 8);
    CHECK_EQ_STR(conf.nodes[0].ip, "127.0.0.1");
    CHECK_EQ_U64(conf.nodes[0].port, 7100);
    CHECK_EQ_STR(conf.nodes[0].host, "127.0.0.1");
    CHECK_EQ_STR(conf.nodes[0].data_dir, "/etc/fk/data/0");
    CHECK_EQ_I64(conf.nodes[0].fabric, FK_FABRIC_AUTO);
    CHECK_EQ_STR(conf.nodes[1].ip, "::1");
    CHECK_EQ_U64(conf.nodes[1].port, 7101);
    CHECK_EQ_I64(conf.nodes[1].fabric, FK_FABRIC_VERBS);
    CHECK_EQ_STR(conf.nodes[1].rdma_device, "rxe0");
    CHECK_EQ_STR(conf.nodes[1].host, "beta");
    CHECK_EQ_STR(conf.nodes[2].address, "localhost:7102");
    CHECK_EQ_STR(conf.nodes[2].metrics, "127.0.0.1:9100");
    CHECK_EQ_STR(conf.nodes[2].data_dir, "/abs/2");
}

TEST(conf_defaults)
{
    CHECK_OK(fk_conf_parse("[cluster]\ntoken=aaaaaaaaaaaaaaaa\n[node 0]\naddress=h:1\n", "t", NULL,
                           &conf, err, sizeof err));
    CHECK_EQ_I64(conf.protocol, FK_PROTO_NOPAXOS);
    CHECK_EQ_I64(conf.durability, FK_DURABLE_SYNC);
    CHECK_EQ_U64(conf.n_sequencers, 1);
    CHECK_EQ_U64(conf.sequencers[0], 0);
    CHECK_EQ_STR(conf.nodes[0].metrics, "");
    CHECK_EQ_U64(conf.quota, 0); /* the server's defaults */
    CHECK_EQ_U64(conf.map_size, 0);
    /* Without the key, every node may run the sequencer, the last first:
     * view 0's leader (node 0) is the last resort. */
    CHECK_OK(fk_conf_parse("[cluster]\ntoken=aaaaaaaaaaaaaaaa\n[node 0]\naddress=h:1\n"
                           "[node 1]\naddress=h:2\n[node 2]\naddress=h:3\n",
                           "t", NULL, &conf, err, sizeof err));
    CHECK_EQ_U64(conf.n_sequencers, 3);
    CHECK(conf.sequencers[0] == 2 && conf.sequencers[1] == 1 && conf.sequencers[2] == 0);
}

/* Each bad file must fail with FK_ECONFIG and a message naming the problem. */
static void expect_bad(const char *text, const char *needle)
{
    memset(err, 0, sizeof err);
    CHECK_ERR(fk_conf_parse(text, "bad.conf", NULL, &conf, err, sizeof err), FK_ECONFIG);
    CHECK_MSG(strstr(err, needle) != NULL, "error '%s' does not mention '%s'", err, needle);
}

#define HEAD "[cluster]\ntoken=aaaaaaaaaaaaaaaa\n"

TEST(conf_rejects_bad_files_with_clear_errors)
{
    expect_bad(HEAD "[node 0]\nadress=h:1\n", "bad.conf:4: unknown key 'adress' in [node 0]");
    expect_bad(HEAD "[node 0]\naddress=h\n", "bad.conf:4: address 'h' is not host:port");
    expect_bad(HEAD "[node 0]\naddress=h:70000\n", "port 1..65535");
    expect_bad(HEAD "[node 0]\naddress=h:1\n[node 1]\naddress=h:2\n", "odd number");
    expect_bad(HEAD "[node 0]\naddress=h:1\n[node 2]\naddress=h:2\n", "without holes");
    expect_bad(HEAD "[node 0]\naddress=h:1\n[node 1]\naddress=h:1\n[node 2]\naddress=h:3\n",
               "share address h:1");
    expect_bad(HEAD "[node 0]\nfabric=verbs\n", "[node 0] has no address");
    expect_bad(HEAD "[node 0]\naddress=h:1\nfabric=ib\n", "fabric must be auto, tcp or verbs");
    expect_bad("[cluster]\ntoken=short\n[node 0]\naddress=h:1\n", "token must be 16 to 127");
    expect_bad("[cluster]\nprotocol=raft\n", "protocol must be nopaxos or multipaxos");
    expect_bad("[node 0]\naddress=h:1\n", "needs token");
    expect_bad(HEAD "sequencers=0,5\n[node 0]\naddress=h:1\n", "sequencer 5 is not a node");
    expect_bad(HEAD "[nodes]\nx = 1\n", "unknown section [nodes]");
    expect_bad(HEAD "[node 0]\njust some words\n", "bad.conf:4: syntax error");
    expect_bad("x=1\n", "outside any [section]");
    expect_bad(HEAD "[node 99]\naddress=h:1\n", "node id 99 is not below");
    expect_bad(HEAD "quota=2TB\n[node 0]\naddress=h:1\n",
               "quota must be a size such as 512MiB or 2GiB, not '2TB'");
    expect_bad(HEAD "map_size=0\n[node 0]\naddress=h:1\n", "map_size must be a size");
    expect_bad(HEAD "transfer_chunk=1KiB\n[node 0]\naddress=h:1\n",
               "transfer_chunk must be a size from 4KiB to 1MiB, not '1KiB'");
    expect_bad(HEAD "transfer_window=17\n[node 0]\naddress=h:1\n",
               "transfer_window must be 1..16 chunks, not '17'");
    expect_bad(HEAD "members=0,x\n[node 0]\naddress=h:1\n", "members: '0,x' is not a list");
    expect_bad(HEAD "members=0,3\n[node 0]\naddress=h:1\n[node 1]\naddress=h:2\n"
                    "[node 2]\naddress=h:3\n",
               "members: a member is not a node");
}

/* members (Multi-Paxos, consensus/mpx.h "Reconfiguration"): the voters of a
 * new cluster, the other nodes learners; then the node count may be even. */
TEST(conf_members)
{
    struct fk_cluster_conf c;
    char why[256];
    const char *text = "[cluster]\nprotocol=multipaxos\ntoken=0123456789abcdef\nmembers = 0, 1, 2\n"
                       "[node 0]\naddress=h:1\n[node 1]\naddress=h:2\n[node 2]\naddress=h:3\n"
                       "[node 3]\naddress=h:4\n";
    CHECK_OK(fk_conf_parse(text, "m.conf", ".", &c, why, sizeof why));
    CHECK_EQ_U64(c.n_nodes, 4);
    CHECK_EQ_U64(c.members, 0x7);
    const char *nop = "[cluster]\nprotocol=nopaxos\ntoken=0123456789abcdef\nmembers = 0, 1, 2\n"
                      "[node 0]\naddress=h:1\n[node 1]\naddress=h:2\n[node 2]\naddress=h:3\n";
    CHECK_ERR(fk_conf_parse(nop, "n.conf", ".", &c, why, sizeof why), FK_ECONFIG);
    CHECK(strstr(why, "nopaxos has no membership changes") != NULL);
    /* The members' epoch, as flowkv-deploy writes it after a change. */
    CHECK_EQ_U64(c.epoch, 0);
    const char *ep =
        "[cluster]\nprotocol=multipaxos\ntoken=0123456789abcdef\nmembers = 0, 1, 3\n"
        "epoch = 3\n[node 0]\naddress=h:1\n[node 1]\naddress=h:2\n[node 2]\naddress=h:3\n"
        "[node 3]\naddress=h:4\n";
    CHECK_OK(fk_conf_parse(ep, "e.conf", ".", &c, why, sizeof why));
    CHECK_EQ_U64(c.epoch, 3);
    CHECK_EQ_U64(c.members, 0xb);
    char ids[32];
    fk_conf_ids(c.members, ids, sizeof ids);
    CHECK_EQ_STR(ids, "0,1,3");
    expect_bad(HEAD "epoch=65535\n[node 0]\naddress=h:1\n", "epoch must be 0..65534, not '65535'");
    expect_bad(HEAD "epoch=-1\n[node 0]\naddress=h:1\n", "epoch must be 0..65534, not '-1'");
    const char *nep = "[cluster]\nprotocol=nopaxos\ntoken=0123456789abcdef\nepoch = 1\n"
                      "[node 0]\naddress=h:1\n[node 1]\naddress=h:2\n[node 2]\naddress=h:3\n";
    CHECK_ERR(fk_conf_parse(nep, "n.conf", ".", &c, why, sizeof why), FK_ECONFIG);
    CHECK(strstr(why, "epoch: nopaxos has no membership changes") != NULL);
}

TEST(conf_sizes)
{
    uint64_t b;
    CHECK_OK(fk_conf_parse_size("17", &b));
    CHECK_EQ_U64(b, 17);
    CHECK_OK(fk_conf_parse_size("3B", &b));
    CHECK_EQ_U64(b, 3);
    CHECK_OK(fk_conf_parse_size("4KiB", &b));
    CHECK_EQ_U64(b, 4096);
    CHECK_OK(fk_conf_parse_size("2GiB", &b));
    CHECK_EQ_U64(b, 2ULL << 30);
    CHECK_ERR(fk_conf_parse_size("", &b), FK_EINVAL);
    CHECK_ERR(fk_conf_parse_size("MiB", &b), FK_EINVAL);
    CHECK_ERR(fk_conf_parse_size("1 MiB", &b), FK_EINVAL);
    CHECK_ERR(fk_conf_parse_size("1mb", &b), FK_EINVAL);
    CHECK_ERR(fk_conf_parse_size("99999999999999999999", &b), FK_EINVAL);
    CHECK_ERR(fk_conf_parse_size("17179869184GiB", &b), FK_EINVAL); /* 2^34 GiB overflows */
}

TEST(conf_load_file_token_file_and_missing_file)
{
    char dir[] = "/tmp/fkconfXXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128], tpath[128];
    snprintf(path, sizeof path, "%s/cluster.conf", dir);
    snprintf(tpath, sizeof tpath, "%s/token", dir);
    FILE *f = fopen(tpath, "w");
    fputs("fedcba9876543210XYZ\n", f);
    fclose(f);
    f = fopen(path, "w");
    fputs("[cluster]\ntoken_file=token\n[node 0]\naddress=127.0.0.1:1\ndata_dir=d0\n", f);
    fclose(f);
    CHECK_OK(fk_conf_load(path, &conf, err, sizeof err));
    CHECK_EQ_STR(conf.token, "fedcba9876543210XYZ");
    char want[160];
    snprintf(want, sizeof want, "%s/d0", dir);
    CHECK_EQ_STR(conf.nodes[0].data_dir, want);
    unlink(tpath);
    CHECK_ERR(fk_conf_load(path, &conf, err, sizeof err), FK_ECONFIG);
    CHECK_MSG(strstr(err, "token_file") != NULL, "error '%s'", err);
    unlink(path);
    rmdir(dir);
    CHECK_ERR(fk_conf_load(path, &conf, err, sizeof err), -ENOENT);
    CHECK_MSG(strstr(err, "No such file") != NULL, "error '%s'", err);
}

TEST(conf_split_address)
{
    char ip[64];
    uint16_t port = 0;
    CHECK_OK(fk_conf_split_address("10.0.0.1:80", ip, sizeof ip, &port));
    CHECK_EQ_STR(ip, "10.0.0.1");
    CHECK_EQ_U64(port, 80);
    CHECK_OK(fk_conf_split_address("[fe80::1]:443", ip, sizeof ip, &port));
    CHECK_EQ_STR(ip, "fe80::1");
    CHECK_ERR(fk_conf_split_address(":80", ip, sizeof ip, &port), FK_EINVAL);
    CHECK_ERR(fk_conf_split_address("h:", ip, sizeof ip, &port), FK_EINVAL);
    CHECK_ERR(fk_conf_split_address("h:0", ip, sizeof ip, &port), FK_EINVAL);
    CHECK_ERR(fk_conf_split_address("h:12x", ip, sizeof ip, &port), FK_EINVAL);
    CHECK_ERR(fk_conf_split_address("[::1]80", ip, sizeof ip, &port), FK_EINVAL);
    CHECK_ERR(fk_conf_split_address("", ip, sizeof ip, &port), FK_EINVAL);
    CHECK_ERR(fk_conf_split_address("abcdefgh:1", ip, 4, &port), FK_EINVAL);
}

TEST(conf_names_round_trip)
{
    for (int i = 0; i < 2; i++)
        CHECK_EQ_I64(fk_protocol_parse(fk_protocol_name(i)), i);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_I64(fk_fabric_parse(fk_fabric_name(i)), i);
    for (int i = 0; i < 2; i++)
        CHECK_EQ_I64(fk_durability_parse(fk_durability_name(i)), i);
    CHECK_ERR(fk_fabric_parse("rdma"), FK_EINVAL);
}

CHECK_MAIN()
