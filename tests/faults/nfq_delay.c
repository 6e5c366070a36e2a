/*
 * nfq_delay.c: packet delay for the fault suite, in user space.
 *
 *   nfq_delay QUEUE DELAY_MS JITTER_MS
 *
 * The fault suite asks for "packet loss and delay with tc netem", but this
 * kernel has no sch_netem (CONFIG_NET_SCH_NETEM is not set). It has the
 * iptables NFQUEUE target and nfnetlink_queue, so a host namespace sends
 * its outgoing packets to queue QUEUE (tests/faults/netns.sh, nsc_delay)
 * and this program, started inside that namespace, holds each one for
 * DELAY_MS plus a uniform random 0..JITTER_MS before it lets it go
 * (NF_ACCEPT). Packets leave in arrival order, as netem does without
 * reordering: a release time is never earlier than the one before it.
 *
 * Bounded: at most HOLD_MAX packets are held; one more is let go at once
 * (counted), so a flood cannot grow memory. SIGTERM or SIGINT lets every
 * held packet go and exits 0; the rule is installed with --queue-bypass,
 * so packets pass unqueued when this program is not running.
 */
#define _GNU_SOURCE
/* netinet/in.h before the netfilter headers, which pull in linux/in.h. */
#include <arpa/inet.h>
#include <netinet/in.h>

#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOLD_MAX 65536

struct held {
    uint32_t id;
    uint64_t due; /* CLOCK_MONOTONIC ns */
};

static struct held hold[HOLD_MAX];
static uint32_t head, count;
static uint64_t delay_ns, jitter_ns, last_due, overflow, passed;
static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data)
{
    (void)msg;
    (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == NULL)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (count == HOLD_MAX) {
        overflow++;
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    }
    uint64_t due = now_ns() + delay_ns + (jitter_ns ? next_rand() % (jitter_ns + 1) : 0);
    if (due < last_due)
        due = last_due; /* in order */
    last_due = due;
    hold[(head + count) % HOLD_MAX] = (struct held){id, due};
    count++;
    return 0;
}

/* Lets go every held packet due by `until`. */
static void release(struct nfq_q_handle *qh, uint64_t until)
{
    while (count > 0 && hold[head].due <= until) {
        nfq_set_verdict(qh, hold[head].id, NF_ACCEPT, 0, NULL);
        head = (head + 1) % HOLD_MAX;
        count--;
        passed++;
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: nfq_delay QUEUE DELAY_MS JITTER_MS\n");
        return 2;
    }
    int queue = atoi(argv[1]);
    delay_ns = strtoull(argv[2], NULL, 10) * 1000000ULL;
    jitter_ns = strtoull(argv[3], NULL, 10) * 1000000ULL;
    if (queue < 0 || queue > 65535 || delay_ns > 10000000000ULL || jitter_ns > 10000000000ULL) {
        fprintf(stderr, "nfq_delay: queue 0..65535, delay and jitter at most 10000 ms\n");
        return 2;
    }
    rng ^= (uint64_t)now_ns();
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct nfq_handle *h = nfq_open();
    if (h == NULL) {
        perror("nfq_delay: nfq_open");
        return 1;
    }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL);
    if (qh == NULL || nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
        fprintf(stderr, "nfq_delay: cannot bind queue %d: %s\n", queue, strerror(errno));
        nfq_close(h);
        return 1;
    }
    nfq_set_queue_maxlen(qh, HOLD_MAX);
    int fd = nfq_fd(h);
    printf("nfq_delay: queue %d, %s ms + 0..%s ms\n", queue, argv[2], argv[3]);
    fflush(stdout);
    static char buf[65536] __attribute__((aligned));
    while (!stop) {
        uint64_t now = now_ns();
        release(qh, now);
        int timeout = 100; /* ms: re-checks stop */
        if (count > 0) {
            uint64_t left = hold[head].due > now ? hold[head].due - now : 0;
            timeout = (int)((left + 999999) / 1000000);
        }
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, timeout);
        if (r > 0) {
            for (int k = 0; k < 64; k++) {
                ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
                if (n <= 0)
                    break; /* EAGAIN, or ENOBUFS: the kernel dropped some (as a full queue) */
                nfq_handle_packet(h, buf, (int)n);
            }
        }
    }
    release(qh, UINT64_MAX);
    fprintf(stderr, "nfq_delay: %llu packets delayed, %llu let through when full\n",
            (unsigned long long)passed, (unsigned long long)overflow);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
