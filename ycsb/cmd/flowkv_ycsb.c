/*
 * flowkv_ycsb.c: the flowkv-ycsb program.
 *
 * Without --dry-run it runs the load or run phase against the binding that
 * db names (-db NAME or -p db=NAME; the bindings[] table below) and prints
 * YCSB's report on stdout; exit status 0, 1 when the run failed (the reason
 * on stderr), 2 for a bad command line or an unknown binding.
 *
 * -c PATH names the flowkv cluster file (the property flowkv.cluster; default
 * run/cluster.conf, what deploy/run-local.sh writes), as for the flowkv CLI.
 *
 * With --dry-run it builds the workload exactly as a run would and prints
 * the operation stream, one line per operation, thread by thread, so that a
 * workload file, its overrides and the key names can be checked without a
 * cluster:
 *   <thread> <OP> <key> [scan=<n>] [read=all|<field>] [write=<field>:<bytes>,...]
 * Inserts of the run phase are acknowledged as soon as they are printed, as a
 * binding would after a successful insert.
 */
#include "fk_version.h"
#include "fk_error.h"
#include "ycsb_etcd.h"
#include "ycsb_flowkv.h"
#include "ycsb_props.h"
#include "ycsb_run.h"
#include "ycsb_workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bindings db can name; db defaults to flowkv (ycsb_conf). */
static const struct ycsb_binding *const bindings[] = {&ycsb_flowkv_binding, &ycsb_etcd_grpc_binding,
                                                      &ycsb_etcd_json_binding};

static const struct ycsb_binding *find_binding(const char *db)
{
    for (size_t i = 0; i < sizeof bindings / sizeof bindings[0]; i++)
        if (strcmp(bindings[i]->name, db) == 0)
            return bindings[i];
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: flowkv-ycsb load|run [DB] [options]   (DB as -db)\n"
            "  -P file         load workload properties (several allowed, in order)\n"
            "  -p name=value   set a property (overrides every -P file)\n"
            "  -threads n      client threads (threadcount)\n"
            "  -target n       offered load in operations per second (target)\n"
            "  -s              print a status line every status.interval seconds\n"
            "  -l label        prefix of the status line\n"
            "  -db name        binding (db): flowkv (default), etcd (gRPC) or etcd-json (gateway)\n"
            "  -c path         flowkv cluster file (flowkv.cluster, default run/cluster.conf)\n"
            "  --dry-run       print the operation stream instead of running it\n"
            "  --version       print the version\n");
}

static void print_op(const struct ycsb_conf *c, int32_t tid, const struct ycsb_op *op)
{
    char name[YCSB_NAME_MAX + 24];
    printf("%d %s %s", tid, ycsb_op_name(op->type), op->key);
    if (op->type == YCSB_OP_SCAN)
        printf(" scan=%d", op->scan_len);
    if (op->type == YCSB_OP_READ || op->type == YCSB_OP_SCAN || op->type == YCSB_OP_RMW) {
        if (op->read_field < 0) {
            printf(" read=all");
        } else if (ycsb_field_name(c, op->read_field, name, sizeof name) >= 0) {
            printf(" read=%s", name);
        }
    }
    for (int32_t i = 0; i < op->nwrite; i++) {
        if (ycsb_field_name(c, op->write_first + i, name, sizeof name) < 0)
            continue;
        printf("%s%s:%u", i == 0 ? " write=" : ",", name, op->write_len[i]);
    }
    putchar('\n');
}

static int dry_run(const struct ycsb_conf *conf)
{
    char err[YCSB_ERR_MAX] = "";
    int64_t total = ycsb_conf_total_ops(conf);
    if (total <= 0) {
        fprintf(stderr, "flowkv-ycsb: --dry-run needs a finite operationcount (run) or "
                        "recordcount/insertcount (load)\n");
        return 2;
    }
    static struct ycsb_workload w;
    if (ycsb_workload_init(&w, conf, err, sizeof err) < 0) {
        fprintf(stderr, "flowkv-ycsb: %s\n", err);
        return 2;
    }
    static struct ycsb_thread t;
    static struct ycsb_op op;
    int32_t nthreads = ycsb_conf_threads(conf);
    int status = 0;
    for (int32_t tid = 0; tid < nthreads && status == 0; tid++) {
        ycsb_thread_init(&t, &w, tid);
        int64_t n = ycsb_thread_ops(total, nthreads, tid);
        for (int64_t i = 0; i < n; i++) {
            int rc = conf->dotransactions ? ycsb_next_op(&t, &op) : ycsb_next_load(&t, &op);
            if (rc == 0 && conf->dotransactions && op.type == YCSB_OP_INSERT)
                rc = ycsb_insert_done(&w, &op);
            if (rc < 0) {
                fprintf(stderr, "flowkv-ycsb: operation %lld: %s\n", (long long)i, fk_strerror(rc));
                status = 1;
                break;
            }
            print_op(conf, tid, &op);
        }
    }
    ycsb_workload_destroy(&w);
    return status;
}

/* Runs the phase against binding b and prints the report. props stay
 * alive until the threads (and the binding's open) are done with them. */
static int run(const struct ycsb_conf *conf, const struct ycsb_props *props,
               const struct ycsb_binding *b)
{
    char err[YCSB_ERR_MAX] = "";
    struct ycsb_run_result res;
    int rc = ycsb_run(conf, props, b, stderr, &res, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "flowkv-ycsb: %s: %s\n", b->name, err[0] ? err : fk_strerror(rc));
        return 1;
    }
    rc = ycsb_run_report(stdout, conf, &res);
    ycsb_meas_destroy(res.meas);
    if (rc < 0 || fflush(stdout) != 0) {
        fprintf(stderr, "flowkv-ycsb: cannot write the report\n");
        return 1;
    }
    return 0;
}

/* Rewrites "-c PATH" into "-p flowkv.cluster=PATH" (a command-line
 * property, so it overrides -P files like every flag) into args, which has
 * argc + 1 entries; the rewritten values live in cluster (cap bytes).
 * Returns the new argc or -1 when -c has no value or the path is too long. */
static int rewrite_c(int argc, char **argv, char **args, char *cluster, size_t cap)
{
    static const char *const takes_value[] = {"-P", "-p", "-threads", "-target", "-db", "-l"};
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-c") != 0) {
            args[n++] = argv[i];
            for (size_t k = 0; k < sizeof takes_value / sizeof takes_value[0]; k++)
                if (strcmp(argv[i], takes_value[k]) == 0 && i + 1 < argc) {
                    args[n++] = argv[++i]; /* a value, even one spelled "-c" */
                    break;
                }
            continue;
        }
        if (i + 1 >= argc)
            return -1;
        int w = snprintf(cluster, cap, "flowkv.cluster=%s", argv[++i]);
        if (w < 0 || (size_t)w >= cap)
            return -1;
        args[n++] = "-p";
        args[n++] = cluster;
    }
    args[n] = NULL;
    return n;
}

int main(int argc, char **argv)
{
    static struct ycsb_props props;
    static struct ycsb_conf conf;
    static char cluster[4096];
    struct ycsb_cli cli;
    char err[YCSB_ERR_MAX] = "";
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (args == NULL) {
        fprintf(stderr, "flowkv-ycsb: out of memory\n");
        return 1;
    }
    int nargs = rewrite_c(argc, argv, args, cluster, sizeof cluster);
    if (nargs < 0) {
        fprintf(stderr, "flowkv-ycsb: -c needs a cluster file path\n");
        usage(stderr);
        free(args);
        return 2;
    }
    ycsb_props_init(&props);
    int rc = ycsb_cli_parse(nargs, args, &props, &cli, err, sizeof err);
    free(args);
    if (rc == 0 && cli.help) {
        usage(stdout);
        ycsb_props_free(&props);
        return 0;
    }
    if (rc == 0 && cli.version) {
        printf("flowkv-ycsb %s\n", FK_VERSION);
        ycsb_props_free(&props);
        return 0;
    }
    if (rc == 0)
        rc = ycsb_conf_parse(&conf, &props, err, sizeof err);
    if (rc < 0) {
        ycsb_props_free(&props);
        fprintf(stderr, "flowkv-ycsb: %s\n", err);
        usage(stderr);
        return 2;
    }
    if (cli.dry_run) {
        ycsb_props_free(&props);
        return dry_run(&conf);
    }
    const struct ycsb_binding *b = find_binding(conf.db);
    if (b == NULL) {
        fprintf(stderr, "flowkv-ycsb: no binding named '%s' (built: flowkv, etcd, etcd-json)\n",
                conf.db);
        ycsb_props_free(&props);
        return 2;
    }
    int status = run(&conf, &props, b);
    ycsb_props_free(&props);
    return status;
}
