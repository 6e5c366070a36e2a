/* flowkv-server: one replica of a flowkv cluster (srv_node.h). */
#include "fk_error.h"
#include "fk_log.h"
#include "srv_node.h"
#include "srv_opts.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static struct srv_node *the_node;

/* SIGTERM and SIGINT stop the loop, which drains and closes LMDB cleanly;
 * SIGUSR1 logs the replica's protocol state (srv_node_dump). */
static void on_signal(int sig)
{
    if (the_node == NULL)
        return;
    if (sig == SIGUSR1)
        srv_node_dump(the_node); /* one line of protocol state in the log */
    else
        srv_node_stop(the_node);
}

int main(int argc, char **argv)
{
    struct srv_opts o;
    char err[FK_CONF_ERR_MAX + 64];
    int rc = srv_opts_parse(argc, argv, &o, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "flowkv-server: %s\n", err);
        fprintf(stderr, "try 'flowkv-server --help'\n");
        return 2;
    }
    if (o.show_help) {
        srv_opts_usage(stdout, "flowkv-server");
        return 0;
    }
    if (o.show_version) {
        printf("flowkv-server %s\n", SRV_VERSION);
        return 0;
    }
    fk_log_set_level(o.log_level);
    signal(SIGPIPE, SIG_IGN);
    struct srv_node *n = NULL;
    rc = srv_node_open(&o, &n, err, sizeof(err));
    if (rc < 0) {
        fk_error("server", "replica %u: %s", o.id, err);
        srv_node_close(n);
        return 1;
    }
    the_node = n;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    rc = srv_node_run(n);
    the_node = NULL;
    srv_node_close(n);
    fk_info("server", "replica %u stopped%s", o.id, rc < 0 ? " on an error" : " cleanly");
    return rc < 0 ? 1 : 0;
}
