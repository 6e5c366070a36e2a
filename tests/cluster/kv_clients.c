/*
 * kv_clients: many libflowkv handles in one process, one thread each, for
 * the clients-at-scale tests (tests/integration/test_clients.sh).
 *
 *   kv_clients CONF N TAG
 *
 * Opens N handles (each on its own thread, all on one channel: flowkv.h),
 * and each puts TAG-i = v-TAG-i and reads it back. Then prints
 * "answered N" (or "failed K: <first error>") on stdout and goes on
 * writing and reading its key, every thread, until stdin closes (or the
 * process is killed: the test kills some mid-request), then prints
 * "served M" (operations answered in that phase) and exits 0 when every
 * one was answered correctly. Exit 1 names what failed, 2 on usage.
 * Every wait is bounded by the handles' timeout (5 s an operation).
 * KV_CLIENTS_PAUSE_MS (default 20) is each thread's pause between rounds
 * of the second phase, KV_CLIENTS_TIMEOUT_MS (default 5,000) the handles'
 * timeout: the Soft-RoCE guest, which serves a few hundred operations a
 * second under emulation, paces its 824 threads slower and waits longer.
 */
#include "fk_error.h"
#include "flowkv.h"

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLIENTS_MAX 4096

struct client {
    pthread_t th;
    const char *conf, *tag;
    int index;
    int first;            /* 0, or the first phase's error */
    unsigned long served; /* second phase: operations answered */
    int bad;              /* second phase: an error or a wrong value */
    char err[160];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int started, stop; /* under mu */
static useconds_t pause_us = 20000;
static struct flowkv_opts opts; /* timeout 0: libflowkv's default */

static int put_get(flowkv *kv, const char *key, const char *val, char *err, size_t cap)
{
    char got[64];
    size_t len = 0;
    int rc = flowkv_put(kv, key, strlen(key), val, strlen(val));
    if (rc == 0)
        rc = flowkv_get(kv, key, strlen(key), got, sizeof got, &len);
    if (rc == 0 && (len != strlen(val) || memcmp(got, val, len) != 0))
        rc = FK_EMALFORMED;
    if (rc < 0)
        snprintf(err, cap, "%s: %s", key, fk_strerror(rc));
    return rc;
}

static void *run(void *arg)
{
    struct client *c = arg;
    char key[64], val[64];
    snprintf(key, sizeof key, "%s-%d", c->tag, c->index);
    snprintf(val, sizeof val, "v-%s-%d", c->tag, c->index);
    flowkv *kv = NULL;
    int rc = flowkv_open(c->conf, &opts, &kv, c->err, sizeof c->err);
    if (rc == 0)
        rc = put_get(kv, key, val, c->err, sizeof c->err);
    c->first = rc < 0 ? rc : 0;
    pthread_mutex_lock(&mu);
    started++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    /* Bounded: each round is two operations of at most the handle's
     * timeout, and stop comes when stdin closes (the test's doing). */
    for (unsigned long round = 0; rc == 0 && !c->bad; round++) {
        pthread_mutex_lock(&mu);
        int s = stop;
        pthread_mutex_unlock(&mu);
        if (s)
            break;
        snprintf(val, sizeof val, "v-%s-%d-%lu", c->tag, c->index, round);
        if (put_get(kv, key, val, c->err, sizeof c->err) < 0)
            c->bad = 1;
        else
            c->served += 2;
        usleep(pause_us);
    }
    flowkv_close(kv);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4 || atoi(argv[2]) < 1 || atoi(argv[2]) > CLIENTS_MAX) {
        fprintf(stderr, "usage: kv_clients CONF N TAG (N 1..%d)\n", CLIENTS_MAX);
        return 2;
    }
    int n = atoi(argv[2]);
    const char *pause_ms = getenv("KV_CLIENTS_PAUSE_MS");
    if (pause_ms != NULL && atoi(pause_ms) > 0 && atoi(pause_ms) <= 10000)
        pause_us = (useconds_t)atoi(pause_ms) * 1000;
    const char *timeout_ms = getenv("KV_CLIENTS_TIMEOUT_MS");
    if (timeout_ms != NULL && atoi(timeout_ms) > 0 && atoi(timeout_ms) <= 60000)
        opts.timeout_ns = (uint64_t)atoi(timeout_ms) * 1000000u;
    struct client *cs = calloc((size_t)n, sizeof *cs);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    for (int i = 0; cs != NULL && i < n; i++) {
        cs[i] = (struct client){.conf = argv[1], .tag = argv[3], .index = i};
        if (pthread_create(&cs[i].th, &at, run, &cs[i]) != 0) {
            fprintf(stderr, "kv_clients: thread %d: cannot start\n", i);
            return 1;
        }
    }
    if (cs == NULL)
        return 1;
    pthread_mutex_lock(&mu);
    while (started < n)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    int failed = 0, first = -1;
    for (int i = 0; i < n; i++)
        if (cs[i].first < 0 && failed++ == 0)
            first = i;
    if (failed == 0)
        printf("answered %d\n", n);
    else
        printf("failed %d: %s\n", failed, cs[first].err);
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) /* until stdin closes */
        ;
    pthread_mutex_lock(&mu);
    stop = 1;
    pthread_mutex_unlock(&mu);
    unsigned long served = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(cs[i].th, NULL);
        served += cs[i].served;
        if (cs[i].bad && bad++ == 0)
            fprintf(stderr, "kv_clients: client %d: %s\n", i, cs[i].err);
    }
    printf("served %lu\n", served);
    free(cs);
    return failed == 0 && bad == 0 ? 0 : 1;
}
