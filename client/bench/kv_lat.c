/*
 * kv_lat.c: flowkv-bench-lat, the single-client latency benchmark of the
 * server issue: one synchronous client (libflowkv) puts and gets against a
 * running cluster, and in the same run a raw TCP ping-pong of the same size
 * between this process and a forked echo process on loopback, the floor any
 * replicated round trip stands on, taken twice: with both processes on one
 * CPU ("raw tcp") and on two ("raw tcp x"). The scheduler picks either
 * placement for an unpinned ping-pong, and on a virtual machine they differ
 * by 4x (a wakeup across CPUs is an interprocessor interrupt through the
 * hypervisor), so an unpinned baseline drifts between runs; the ratios use
 * the same-CPU one, the stricter. Then "raw nop", NOPaxos' message pattern
 * over raw TCP between processes that only echo (a round trip to a
 * sequencer, the request to three replicas, done at replica 0's answer and
 * one more): what a NOPaxos put costs on this machine with no protocol,
 * flows or storage work at all.
 *
 *   flowkv-bench-lat -c CLUSTER_FILE [-n OPS] [-r ROUNDS] [-b BYTES] [-l LABEL]
 *
 * ROUNDS rounds (default 5) each time OPS (default 2,000) raw round trips,
 * OPS puts of BYTES-byte values (default 64) and OPS gets of the keys just
 * written, one at a time, so that a drift of the machine during the run
 * touches the baseline and flowkv alike. It prints one row per measurement
 * (median of the round medians, p99 over every sample, microseconds) and
 * a last line
 *   kv-lat: LABEL put_p50_us=.. put_p99_us=.. get_p50_us=.. get_p99_us=..
 *           raw_p50_us=.. raw_p99_us=.. put_ratio=.. get_ratio=..
 *           rawx_p50_us=.. put_ratio_x=..
 *           rawnop_p50_us=.. rawnop_ratio=.. put_vs_rawnop=..
 * where the ratios are medians over the same-CPU raw TCP median
 * (put_ratio_x: over the two-CPU one, "none" with a single CPU to run on;
 * put_vs_rawnop: the put's median over raw nop's). Exit status
 * 0, 1 when an operation failed (its error on stderr), 2 for bad arguments.
 */
#include "fk_error.h"
#include "fk_hist.h"
#include "fk_time.h"
#include "flowkv.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS_MAX 64
#define OPS_MAX    1000000
#define BYTES_MAX  FLOWKV_VAL_MAX

/* M_FLOOR: NOPaxos' message pattern (section 4: a sequencer, then every
 * replica; done at the leader's reply and one more) over raw TCP between
 * processes that only echo, so what a put costs beyond this is flowkv's. */
enum { M_RAW, M_RAWX, M_FLOOR, M_PUT, M_GET, M_COUNT };
static const char *const m_name[M_COUNT] = {"raw tcp", "raw tcp x", "raw nop", "put", "get"};
#define FLOOR_REPLICAS 3

struct bench {
    int ops, rounds, bytes;
    const char *conf, *label;
    struct fk_hist all[M_COUNT];       /* every sample */
    uint64_t med[M_COUNT][ROUNDS_MAX]; /* each round's median */
    uint8_t buf[BYTES_MAX];
    const char *failed_at; /* the measurement that failed, and its index */
    int failed_i;
    cpu_set_t cpus; /* this process's CPUs, given back after each raw run */
    int cpu[2];     /* two of them, or cpu[1] -1 when there is one */
};

static int full_io(int fd, void *p, size_t n, int out)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = out ? send(fd, (char *)p + done, n - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)p + done, n - done, 0);
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

/* The echo side: answers each message of `bytes` with itself until EOF. */
static void echo_main(int lfd, int bytes)
{
    int fd = accept(lfd, NULL, NULL);
    uint8_t b[BYTES_MAX];
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    while (fd >= 0 && full_io(fd, b, (size_t)bytes, 0) == 0 &&
           full_io(fd, b, (size_t)bytes, 1) == 0)
        ;
    _exit(0);
}

/* Starts the echo process; returns the connected socket or -1. */
static int raw_open(int bytes, pid_t *child)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
        return -1;
    *child = fork();
    if (*child == 0) {
        /* Only its listener: a copy of another echo's socket held here
         * would keep that echo from seeing EOF at the end. */
        for (int other = 3; other < 1024; other++) {
            if (other != lfd)
                close(other);
        }
        echo_main(lfd, bytes);
    }
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (*child < 0 || fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* The floor's sockets: [0] the sequencer, [1..3] the replicas, each an
 * echo process (raw_open). */
struct floor {
    int fd[1 + FLOOR_REPLICAS];
    pid_t pid[1 + FLOOR_REPLICAS];
};

/* One NOPaxos-shaped exchange: a round trip to the sequencer, the request
 * to every replica, then the leader's (replica 0) answer and the first
 * other one; the last answer is read after the clock stops. */
static int floor_once(struct floor *f, uint8_t *buf, size_t bytes, uint64_t *ns)
{
    uint64_t t0 = fk_now_ns();
    if (full_io(f->fd[0], buf, bytes, 1) < 0 || full_io(f->fd[0], buf, bytes, 0) < 0)
        return -1;
    for (int i = 1; i <= FLOOR_REPLICAS; i++) {
        if (full_io(f->fd[i], buf, bytes, 1) < 0)
            return -1;
    }
    if (full_io(f->fd[1], buf, bytes, 0) < 0)
        return -1;
    struct pollfd p[FLOOR_REPLICAS - 1];
    for (int i = 0; i < FLOOR_REPLICAS - 1; i++)
        p[i] = (struct pollfd){.fd = f->fd[i + 2], .events = POLLIN};
    if (poll(p, FLOOR_REPLICAS - 1, 10000) <= 0)
        return -1;
    int first = (p[0].revents & POLLIN) ? 2 : 3;
    if (full_io(f->fd[first], buf, bytes, 0) < 0)
        return -1;
    *ns = fk_now_ns() - t0;
    return full_io(f->fd[first == 2 ? 3 : 2], buf, bytes, 0);
}

static void pin(pid_t pid, int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(pid, sizeof(one), &one);
}

/* OPS raw round trips with this process on cpu[0] and the echo process on
 * echo_cpu; both get every CPU back after. */
static int raw_placed(struct bench *b, int fd, pid_t echo, int echo_cpu, struct fk_hist *h)
{
    int rc = 0;
    pin(0, b->cpu[0]);
    pin(echo, echo_cpu);
    for (int i = 0; i < b->ops; i++) {
        uint64_t t0 = fk_now_ns();
        if (full_io(fd, b->buf, (size_t)b->bytes, 1) < 0 ||
            full_io(fd, b->buf, (size_t)b->bytes, 0) < 0) {
            rc = -1;
            break;
        }
        fk_hist_record(h, fk_now_ns() - t0);
    }
    sched_setaffinity(0, sizeof(b->cpus), &b->cpus);
    sched_setaffinity(echo, sizeof(b->cpus), &b->cpus);
    return rc;
}

/* The first two CPUs this process may run on. */
static void pick_cpus(struct bench *b)
{
    b->cpu[0] = b->cpu[1] = -1;
    if (sched_getaffinity(0, sizeof(b->cpus), &b->cpus) != 0) {
        CPU_ZERO(&b->cpus);
        CPU_SET(0, &b->cpus);
    }
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++) {
        if (CPU_ISSET(c, &b->cpus))
            b->cpu[k++] = c;
    }
}

static void key_of(char *k, size_t cap, int i)
{
    snprintf(k, cap, "lat%08d", i);
}

/* One round: OPS of each measurement into h[]. 0 or the first error. */
static int one_round(struct bench *b, flowkv *kv, int fd, pid_t echo, struct floor *f,
                     struct fk_hist h[M_COUNT])
{
    char key[32], val[BYTES_MAX];
    size_t vlen;
    if (raw_placed(b, fd, echo, b->cpu[0], &h[M_RAW]) < 0 ||
        (b->cpu[1] >= 0 && raw_placed(b, fd, echo, b->cpu[1], &h[M_RAWX]) < 0))
        return FK_EUNREACHABLE;
    for (int i = 0; i < b->ops; i++) {
        uint64_t ns;
        if (floor_once(f, b->buf, (size_t)b->bytes, &ns) < 0)
            return FK_EUNREACHABLE;
        fk_hist_record(&h[M_FLOOR], ns);
    }
    for (int i = 0; i < b->ops; i++) {
        key_of(key, sizeof(key), i);
        b->buf[0] = (uint8_t)i;
        uint64_t t0 = fk_now_ns();
        int rc = flowkv_put(kv, key, strlen(key), b->buf, (size_t)b->bytes);
        if (rc < 0) {
            b->failed_at = "put";
            b->failed_i = i;
            return rc;
        }
        fk_hist_record(&h[M_PUT], fk_now_ns() - t0);
    }
    for (int i = 0; i < b->ops; i++) {
        key_of(key, sizeof(key), i);
        uint64_t t0 = fk_now_ns();
        int rc = flowkv_get(kv, key, strlen(key), val, sizeof(val), &vlen);
        b->failed_at = "get";
        b->failed_i = i;
        if (rc < 0)
            return rc;
        fk_hist_record(&h[M_GET], fk_now_ns() - t0);
        if (vlen != (size_t)b->bytes || (uint8_t)val[0] != (uint8_t)i)
            return FK_EPROTO; /* a get must see the put before it */
        b->failed_at = NULL;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double median_us(uint64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_u64);
    return (double)v[n / 2] / 1e3;
}

static int parse_args(struct bench *b, int argc, char **argv)
{
    int c;
    while ((c = getopt(argc, argv, "c:n:r:b:l:h")) != -1) {
        switch (c) {
        case 'c':
            b->conf = optarg;
            break;
        case 'n':
            b->ops = atoi(optarg);
            break;
        case 'r':
            b->rounds = atoi(optarg);
            break;
        case 'b':
            b->bytes = atoi(optarg);
            break;
        case 'l':
            b->label = optarg;
            break;
        default:
            return -1;
        }
    }
    if (b->conf == NULL || b->ops < 1 || b->ops > OPS_MAX || b->rounds < 1 ||
        b->rounds > ROUNDS_MAX || b->bytes < 1 || b->bytes > BYTES_MAX)
        return -1;
    return 0;
}

static void report(struct bench *b)
{
    double p50[M_COUNT], p99[M_COUNT];
    int have_x = b->cpu[1] >= 0;
    printf("%-9s %10s %10s %10s %10s %10s\n", "", "p50 us", "p99 us", "p99.9 us", "mean us",
           "vs raw");
    for (int m = 0; m < M_COUNT; m++) {
        p50[m] = median_us(b->med[m], b->rounds);
        p99[m] = (double)fk_hist_percentile(&b->all[m], 99) / 1e3;
    }
    for (int m = 0; m < M_COUNT; m++) {
        if (m == M_RAWX && !have_x) {
            printf("%-9s %10s (one CPU to run on)\n", m_name[m], "none");
            continue;
        }
        printf("%-9s %10.1f %10.1f %10.1f %10.1f %9.2fx\n", m_name[m], p50[m], p99[m],
               (double)fk_hist_percentile(&b->all[m], 99.9) / 1e3, fk_hist_mean(&b->all[m]) / 1e3,
               p50[m] / p50[M_RAW]);
    }
    char x[64] = "rawx_p50_us=none put_ratio_x=none";
    if (have_x)
        snprintf(x, sizeof(x), "rawx_p50_us=%.1f put_ratio_x=%.2f", p50[M_RAWX],
                 p50[M_PUT] / p50[M_RAWX]);
    printf("kv-lat: %s put_p50_us=%.1f put_p99_us=%.1f get_p50_us=%.1f get_p99_us=%.1f "
           "raw_p50_us=%.1f raw_p99_us=%.1f put_ratio=%.2f get_ratio=%.2f %s "
           "rawnop_p50_us=%.1f rawnop_ratio=%.2f put_vs_rawnop=%.2f\n",
           b->label, p50[M_PUT], p99[M_PUT], p50[M_GET], p99[M_GET], p50[M_RAW], p99[M_RAW],
           p50[M_PUT] / p50[M_RAW], p50[M_GET] / p50[M_RAW], x, p50[M_FLOOR],
           p50[M_FLOOR] / p50[M_RAW], p50[M_PUT] / p50[M_FLOOR]);
}

int main(int argc, char **argv)
{
    static struct bench b = {.ops = 2000, .rounds = 5, .bytes = 64, .label = "cluster"};
    if (parse_args(&b, argc, argv) < 0) {
        fprintf(stderr, "usage: flowkv-bench-lat -c CLUSTER_FILE [-n OPS] [-r ROUNDS] "
                        "[-b BYTES] [-l LABEL]\n");
        return 2;
    }
    char err[256];
    flowkv *kv = NULL;
    int rc = flowkv_open(b.conf, NULL, &kv, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "flowkv-bench-lat: %s\n", err);
        return 1;
    }
    pick_cpus(&b);
    pid_t child = -1;
    int fd = raw_open(b.bytes, &child);
    static struct floor f;
    for (int i = 0; i <= FLOOR_REPLICAS; i++) {
        f.pid[i] = -1;
        f.fd[i] = fd < 0 ? -1 : raw_open(b.bytes, &f.pid[i]);
        if (f.fd[i] < 0)
            fd = -1;
    }
    if (fd < 0)
        rc = FK_EUNREACHABLE;
    for (int m = 0; m < M_COUNT; m++)
        fk_hist_init(&b.all[m]);
    for (int r = 0; rc == 0 && r < b.rounds; r++) {
        static struct fk_hist h[M_COUNT];
        for (int m = 0; m < M_COUNT; m++)
            fk_hist_init(&h[m]);
        rc = one_round(&b, kv, fd, child, &f, h);
        for (int m = 0; rc == 0 && m < M_COUNT; m++) {
            b.med[m][r] = fk_hist_percentile(&h[m], 50);
            fk_hist_merge(&b.all[m], &h[m]);
        }
    }
    if (fd >= 0)
        close(fd); /* the echo process sees EOF and exits */
    if (child > 0)
        waitpid(child, NULL, 0);
    for (int i = 0; i <= FLOOR_REPLICAS; i++) {
        if (f.fd[i] >= 0)
            close(f.fd[i]);
        if (f.pid[i] > 0)
            waitpid(f.pid[i], NULL, 0);
    }
    flowkv_close(kv);
    if (rc < 0) {
        fprintf(stderr, "flowkv-bench-lat: %s%s%s #%d\n", fk_strerror(rc),
                b.failed_at ? " at " : "", b.failed_at ? b.failed_at : "", b.failed_i);
        return 1;
    }
    report(&b);
    return 0;
}
