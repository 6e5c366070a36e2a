/*
 * fab_tcp.c: the tcp backend's node and passive side (the software NIC).
 *
 * One progress thread per node runs a libuv loop. For each accepted
 * connection it parses requests in arrival order and applies them:
 *   WRITE: payload bytes are copied into the region as they arrive, in
 *     increasing address order; the write's last aligned 8-byte word is
 *     stored with release semantics only after everything before it, so a
 *     footer written after a payload is seen only after the payload (DFI
 *     section 5.1).
 *   READ: an aligned 8-byte word is read with an acquire load; other sizes
 *     are copied.
 *   FAA: __atomic_fetch_add on the aligned word.
 *   CALL: the node's control handler runs and its response is sent back.
 * Regions are looked up per chunk under mr_lock, which the loop holds while
 * it processes one socket read; fab_mr_dereg takes the same lock, so after it
 * returns no remote operation touches the memory.
 *
 * Leader/followers: the loop is run by one thread at a time, the progress
 * thread or a thread blocked in fab_node_wait (drive_loop). A waiter that
 * takes the loop sleeps in the kernel on the loop's descriptor and applies
 * what arrives itself, so a consumer is woken once per message, directly by
 * the kernel, as with a plain socket; the progress thread runs the loop
 * whenever no waiter does (control calls, other peers, closes). Handlers
 * (fab_call_fn, fab_close_fn) may therefore run on a waiting thread; they
 * already must not block.
 *
 * Hot receive: when one connection carries nearly all writes (a latency-mode
 * ping-pong), the leading waiter reads that socket with a plain blocking
 * recv instead of epoll_wait plus read: one system call per message, as a
 * raw socket needs (flows-bench latency: libuv's epoll path cost about 4 us
 * of a 26 us round trip). The progress thread then watches the loop's other
 * descriptors and interrupts the recv with a signal when one of them has
 * an event; the waiter serves it with one non-blocking loop iteration
 * (hot_wait below).
 */
#include "fab_tcp.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>

struct tcp_mr {
    struct fab_mr base;
};

enum loop_owner { OWNER_NONE = 0, OWNER_PROGRESS, OWNER_WAITER };
enum hot_state { HOT_IDLE = 0, HOT_IN_RECV, HOT_KICKED };

struct tcp_peer;

struct tcp_node {
    struct fab_node base;
    char host[FAB_ADDR_MAX];
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    uv_timer_t drive_timer; /* bounds a waiter's blocking loop iteration */
    pthread_t thread;
    pthread_mutex_t mr_lock;
    struct tcp_mr *mrs[FAB_MR_MAX]; /* by key % FAB_MR_MAX */
    uint32_t mr_gen;
    uint32_t doorbell; /* futex word, bumped after applied writes */
    uint32_t waiters;
    /* Who runs the loop (leader/followers): the progress thread, or a thread
     * waiting in fab_node_wait, which then reads the sockets itself and is
     * woken by the kernel directly when data arrives, one wake-up per
     * message as with a plain socket instead of two (progress thread, then
     * waiter). Guarded by loop_lock; owner_cv announces releases. */
    pthread_mutex_t loop_lock;
    pthread_cond_t owner_cv;
    int owner;            /* enum loop_owner */
    int wanted;           /* waiters blocked in take_loop */
    uint64_t last_waiter; /* when a waiter last released the loop */
    uint64_t next_peer_id;
    struct tcp_peer *peers; /* loop thread only */
    /* Hot receive (hot_wait). hot_cand and hot_score pick the connection
     * that carries the writes, hotp is the one in hot mode (libuv does not
     * read it); loop holder only. hot_on mirrors hotp != NULL for the
     * progress thread. hot_state, hot_tid and the kick counters are the
     * handshake that interrupts a waiter blocked in the hot recv: kick_seq
     * is advanced by the progress thread, kick_ack by the waiter once it
     * served the loop, both under loop_lock and read atomically. */
    struct tcp_peer *hot_cand, *hotp;
    int hot_score;
    unsigned hot_iter; /* hot receives, for HOT_FLUSH_EVERY */
    int hot_on;
    int hot_state; /* enum hot_state */
    pthread_t hot_tid;
    uint32_t kick_seq, kick_ack;
    /* The progress thread sleeps in poll on the loop's epoll descriptor,
     * whose set does not hold a hot connection: hot_enter wakes it with
     * wake_fd, an eventfd outside the loop that only that thread reads (a
     * uv_async would not do: the waiter running the loop right after
     * could drain it before the sleeper's poll looked). */
    int progress_asleep;
    int wake_fd;
};

/* The write being applied while its payload streams in. */
struct tcp_inwrite {
    uint64_t remaining; /* payload bytes still to come */
    uint64_t dst;       /* next destination address */
    uint32_t rkey;
    uint32_t len;
    uint64_t cookie;
    uint8_t flags;
    int active;
};

struct tcp_peer {
    uv_tcp_t h;
    struct tcp_node *node;
    uint64_t id;
    struct tcp_peer *next, *prev;
    struct tcp_inwrite w;
    struct fab__auth auth; /* the token handshake (fab_auth.c) */
    int failed;            /* remote access error: the connection is closing */
    int hot_fd;            /* the socket, once it was in hot mode */
    int hot_timo;          /* SO_RCVTIMEO set (hot mode) */
    uint8_t in[FAB__TCP_IN_CAP];
    size_t in_len;
    uint8_t *fill, *inflight; /* response buffers: appended to / being written */
    size_t fill_len;
    uv_write_t wreq;
    uint8_t out[2][FAB__TCP_OUT_CAP];
};

const char *fab__tcp_node_host(const fab_node *node)
{
    return ((const struct tcp_node *)node)->host;
}

/* ---- regions ----------------------------------------------------------------- */

static int tcp_mr_reg(fab_node *bn, void *addr, size_t len, fab_mr **out)
{
    struct tcp_node *n = (struct tcp_node *)bn;
    struct tcp_mr *mr = calloc(1, sizeof(*mr));
    if (mr == NULL)
        return FK_ENOMEM;
    pthread_mutex_lock(&n->mr_lock);
    int slot = -1;
    for (int i = 0; i < FAB_MR_MAX; i++) {
        uint32_t idx = (n->mr_gen + (uint32_t)i) % FAB_MR_MAX;
        if (n->mrs[idx] == NULL) {
            slot = (int)idx;
            break;
        }
    }
    if (slot < 0) {
        pthread_mutex_unlock(&n->mr_lock);
        free(mr);
        return FK_ENOMEM;
    }
    /* The key carries a generation above the slot index so a stale key of a
     * deregistered region never matches a new one. */
    n->mr_gen++;
    mr->base.node = bn;
    mr->base.addr = addr;
    mr->base.len = len;
    mr->base.key = (n->mr_gen << 14) | (uint32_t)slot;
    _Static_assert(FAB_MR_MAX == 1 << 14, "key layout assumes 14 index bits");
    n->mrs[slot] = mr;
    pthread_mutex_unlock(&n->mr_lock);
    *out = &mr->base;
    return 0;
}

static void tcp_mr_dereg(fab_mr *bmr)
{
    struct tcp_node *n = (struct tcp_node *)bmr->node;
    pthread_mutex_lock(&n->mr_lock);
    assert(n->mrs[bmr->key % FAB_MR_MAX] == (struct tcp_mr *)bmr);
    n->mrs[bmr->key % FAB_MR_MAX] = NULL;
    pthread_mutex_unlock(&n->mr_lock);
    free(bmr);
}

/* Returns the host pointer for [addr, addr+len) in region rkey, or NULL when
 * the access is outside any registered region. Caller holds mr_lock. */
static uint8_t *mr_check(struct tcp_node *n, uint32_t rkey, uint64_t addr, uint64_t len)
{
    struct tcp_mr *mr = n->mrs[rkey % FAB_MR_MAX];
    if (mr == NULL || mr->base.key != rkey)
        return NULL;
    uint64_t lo = (uint64_t)(uintptr_t)mr->base.addr;
    if (addr < lo || len > mr->base.len || addr - lo > mr->base.len - len)
        return NULL;
    return (uint8_t *)(uintptr_t)addr;
}

/* ---- doorbell and adaptive waiting ---------------------------------------------- */

static long futex(uint32_t *uaddr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, uaddr, op, val, ts, NULL, 0);
}

static uint64_t tcp_doorbell(fab_node *bn)
{
    return __atomic_load_n(&((struct tcp_node *)bn)->doorbell, __ATOMIC_SEQ_CST);
}

static void ring_doorbell(struct tcp_node *n)
{
    __atomic_fetch_add(&n->doorbell, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&n->waiters, __ATOMIC_SEQ_CST) > 0)
        futex(&n->doorbell, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

/* Adaptive waiting (DESIGN.md): about 2 us of pure spinning catches a reply
 * already on its way; then, optionally, a window of sched_yield that hands
 * the core to a runnable thread while still reacting quickly; then the
 * caller blocks in the kernel. The yield window defaults to 0: measured on
 * the 2-core development VM (flows-bench), yielding cost more than it
 * saved, since the thread that produces what we wait for (a progress
 * thread) needs that core; machines with idle cores may set
 * FLOWKV_FAB_YIELD_US. */
#define SPIN_NS          (2 * FK_NSEC_PER_USEC)
#define YIELD_NS_DEFAULT 0
#define YIELD_NS_MAX     (10 * FK_NSEC_PER_MSEC)

/* The yield window; FLOWKV_FAB_YIELD_US overrides it (0 blocks at once),
 * for machines whose core count or scheduler favour another balance. */
static uint64_t yield_ns(void)
{
    static uint64_t cached = UINT64_MAX;
    uint64_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v != UINT64_MAX)
        return v;
    const char *env = getenv("FLOWKV_FAB_YIELD_US");
    v = YIELD_NS_DEFAULT;
    if (env != NULL && *env != '\0') {
        char *end;
        unsigned long long us = strtoull(env, &end, 10);
        if (*end == '\0')
            v = us * FK_NSEC_PER_USEC < YIELD_NS_MAX ? us * FK_NSEC_PER_USEC : YIELD_NS_MAX;
    }
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    return v;
}

int fab__spin_phase(unsigned iter, uint64_t start_ns)
{
    uint64_t spent = fk_now_ns() - start_ns;
    (void)iter;
    if (spent < SPIN_NS) {
        for (int i = 0; i < 16; i++)
            __builtin_ia32_pause();
        return 0;
    }
    if (spent < SPIN_NS + yield_ns()) {
        sched_yield();
        return 0;
    }
    return 1;
}

static int drive_loop(struct tcp_node *n, uint32_t seen, uint64_t deadline);

static int tcp_wait(fab_node *bn, uint64_t seen, uint64_t timeout_ns)
{
    struct tcp_node *n = (struct tcp_node *)bn;
    uint64_t start = fk_now_ns(), deadline = start + timeout_ns;
    /* Spinning pays only while another thread runs the loop and may ring
     * the doorbell; when none does (the usual case once a consumer leads),
     * the spin would just delay the one read that brings the data (perf:
     * fab__spin_phase was 7% of a latency-mode ping-pong). */
    for (unsigned i = 0; __atomic_load_n(&n->owner, __ATOMIC_RELAXED) != OWNER_NONE; i++) {
        if (tcp_doorbell(bn) != (uint32_t)seen)
            return 0;
        if (fab__spin_phase(i, start) || fk_now_ns() >= deadline)
            break;
    }
    for (;;) {
        int rc = drive_loop(n, (uint32_t)seen, deadline);
        if (rc <= 0)
            return rc;
        /* Another waiter leads: it rings the doorbell for us, or wakes us
         * when it stops leading so that we lead. */
        uint64_t now = fk_now_ns();
        if (now >= deadline)
            return FK_ETIMEDOUT;
        uint64_t left = deadline - now;
        struct timespec ts = {(time_t)(left / FK_NSEC_PER_SEC), (long)(left % FK_NSEC_PER_SEC)};
        __atomic_fetch_add(&n->waiters, 1, __ATOMIC_SEQ_CST);
        futex(&n->doorbell, FUTEX_WAIT_PRIVATE, (uint32_t)seen, &ts);
        __atomic_fetch_sub(&n->waiters, 1, __ATOMIC_SEQ_CST);
        if (tcp_doorbell(bn) != (uint32_t)seen)
            return 0;
    }
}

/* ---- responses --------------------------------------------------------------- */

static void on_written(uv_write_t *req, int status);

static void peer_flush(struct tcp_peer *p)
{
    if (p->inflight != NULL || p->fill_len == 0 || uv_is_closing((uv_handle_t *)&p->h))
        return;
    uv_buf_t b = uv_buf_init((char *)p->fill, (unsigned)p->fill_len);
    int n = uv_try_write((uv_stream_t *)&p->h, &b, 1);
    if (n == (int)p->fill_len) {
        p->fill_len = 0;
        return;
    }
    if (n < 0 && n != UV_EAGAIN)
        return; /* the read side sees the error and closes */
    size_t done = n > 0 ? (size_t)n : 0;
    b = uv_buf_init((char *)p->fill + done, (unsigned)(p->fill_len - done));
    p->inflight = p->fill;
    p->fill = p->fill == p->out[0] ? p->out[1] : p->out[0];
    p->fill_len = 0;
    if (uv_write(&p->wreq, (uv_stream_t *)&p->h, &b, 1, on_written) < 0)
        p->inflight = NULL;
}

static void on_written(uv_write_t *req, int status)
{
    struct tcp_peer *p = req->data;
    p->inflight = NULL;
    if (status == 0)
        peer_flush(p);
}

/* Appends one response; returns 0, or FK_EPROTO when the peer exceeded its
 * FAB_CONN_DEPTH budget (the buffer is sized for exactly that). */
static int respond(struct tcp_peer *p, const struct fab__tcp_msg *m, const void *data, size_t len)
{
    if (p->fill_len + sizeof(*m) + len > FAB__TCP_OUT_CAP)
        return FK_EPROTO;
    memcpy(p->fill + p->fill_len, m, sizeof(*m));
    if (len > 0)
        memcpy(p->fill + p->fill_len + sizeof(*m), data, len);
    p->fill_len += sizeof(*m) + len;
    return 0;
}

static void respond_status(struct tcp_peer *p, const struct fab__tcp_msg *req, int status,
                           uint64_t arg)
{
    struct fab__tcp_msg r = {.op = (uint8_t)(req->op | FAB__TCP_RESP),
                             .flags = req->flags,
                             .status = status,
                             .cookie = req->cookie,
                             .arg = arg};
    if (respond(p, &r, NULL, 0) < 0)
        p->failed = 1;
}

/* ---- applying requests ----------------------------------------------------------- */

static void peer_fail(struct tcp_peer *p, const struct fab__tcp_msg *req)
{
    /* As an RC queue pair on a remote access error: report, then go to the
     * error state (close the connection once the response is out). */
    fk_debug("flows", "fabric: remote access error on peer %llu (op %u key %u addr %llx)",
             (unsigned long long)p->id, req->op, req->rkey, (unsigned long long)req->raddr);
    respond_status(p, req, FK_EPROTO, 0);
    p->failed = 1;
}

/* Copies up to avail bytes of the current write's payload; returns bytes
 * consumed (0: wait for more input) or -1 on a remote access error. The
 * write's last word, when aligned, is copied only once all 8 bytes are here,
 * with one release store after everything before it. */
static long write_chunk(struct tcp_peer *p, const uint8_t *src, size_t avail)
{
    struct tcp_inwrite *w = &p->w;
    uint64_t end = w->dst + w->remaining;
    int tail = w->len >= 8 && (end & 7) == 0;
    size_t n = avail < w->remaining ? avail : (size_t)w->remaining;
    if (tail && n < w->remaining && w->remaining - n < 8)
        n = w->remaining > 8 ? (size_t)(w->remaining - 8) : 0;
    if (n == 0)
        return 0;
    uint8_t *dst = mr_check(p->node, w->rkey, w->dst, n);
    if (dst == NULL)
        return -1;
    size_t body = (tail && n == w->remaining) ? n - 8 : n;
    if (body > 0)
        memcpy(dst, src, body);
    if (body < n) {
        uint64_t word;
        memcpy(&word, src + body, 8);
        __atomic_store_n((uint64_t *)(void *)(dst + body), word, __ATOMIC_RELEASE);
    }
    w->dst += n;
    w->remaining -= n;
    return (long)n;
}

static void apply_read(struct tcp_peer *p, const struct fab__tcp_msg *m)
{
    uint8_t *src = mr_check(p->node, m->rkey, m->raddr, m->arg);
    if (src == NULL || m->arg > FAB_READ_MAX) {
        peer_fail(p, m);
        return;
    }
    uint8_t data[FAB_READ_MAX];
    if (m->arg == 8 && (m->raddr & 7) == 0) {
        uint64_t v = __atomic_load_n((uint64_t *)(void *)src, __ATOMIC_ACQUIRE);
        memcpy(data, &v, 8);
    } else {
        memcpy(data, src, m->arg);
    }
    struct fab__tcp_msg r = {.op = FAB_OP_READ | FAB__TCP_RESP,
                             .flags = m->flags,
                             .len = (uint32_t)m->arg,
                             .cookie = m->cookie};
    if (respond(p, &r, data, m->arg) < 0)
        p->failed = 1;
}

static void apply_faa(struct tcp_peer *p, const struct fab__tcp_msg *m)
{
    uint8_t *w = mr_check(p->node, m->rkey, m->raddr, 8);
    if (w == NULL || (m->raddr & 7) != 0) {
        peer_fail(p, m);
        return;
    }
    uint64_t old = __atomic_fetch_add((uint64_t *)(void *)w, m->arg, __ATOMIC_ACQ_REL);
    respond_status(p, m, 0, old);
}

static void apply_call(struct tcp_peer *p, const struct fab__tcp_msg *m, const uint8_t *payload)
{
    struct tcp_node *n = p->node;
    uint8_t resp[FAB_MSG_MAX];
    int granted; /* the software NIC checks p->auth on every operation */
    /* The handler may register memory: it runs without mr_lock. */
    pthread_mutex_unlock(&n->mr_lock);
    int rc =
        fab__serve_call(&n->base, &p->auth, p->id, payload, m->len, resp, sizeof(resp), &granted);
    pthread_mutex_lock(&n->mr_lock);
    struct fab__tcp_msg r = {.op = FAB_OP_CALL | FAB__TCP_RESP,
                             .status = rc < 0 ? rc : 0,
                             .len = rc > 0 ? (uint32_t)rc : 0,
                             .cookie = m->cookie};
    if (respond(p, &r, resp, r.len) < 0)
        p->failed = 1;
}

/* Handles one complete header (and, for a call, its payload). Returns bytes
 * consumed, 0 when more input is needed. */
static size_t apply_one(struct tcp_peer *p, const uint8_t *buf, size_t avail, int *wrote)
{
    struct fab__tcp_msg m;
    if (avail < sizeof(m))
        return 0;
    memcpy(&m, buf, sizeof(m));
    if (m.op != FAB_OP_CALL && !fab__auth_ok(&p->node->base, &p->auth)) {
        /* One-sided access before the token proof: a remote access error,
         * as a queue pair without access rights would answer. */
        peer_fail(p, &m);
        return avail;
    }
    switch (m.op) {
    case FAB_OP_WRITE:
        p->w = (struct tcp_inwrite){m.len, m.raddr, m.rkey, m.len, m.cookie, m.flags, 1};
        *wrote = 1;
        return sizeof(m);
    case FAB_OP_READ:
        apply_read(p, &m);
        return sizeof(m);
    case FAB_OP_FAA:
        apply_faa(p, &m);
        *wrote = 1;
        return sizeof(m);
    case FAB_OP_CALL:
        if (m.len > FAB_MSG_MAX) {
            peer_fail(p, &m);
            return avail;
        }
        if (avail < sizeof(m) + m.len)
            return 0;
        apply_call(p, &m, buf + sizeof(m));
        return sizeof(m) + m.len;
    default:
        peer_fail(p, &m);
        return avail;
    }
}

static void finish_write(struct tcp_peer *p)
{
    p->w.active = 0;
    if (p->w.flags & FAB_SIGNALED) {
        struct fab__tcp_msg m = {.op = FAB_OP_WRITE, .flags = p->w.flags, .cookie = p->w.cookie};
        respond_status(p, &m, 0, 0);
    }
}

/* Processes p->in; keeps an incomplete tail for the next read. */
static void process_input(struct tcp_peer *p, int *wrote)
{
    size_t off = 0;
    while (!p->failed) {
        if (p->w.active && p->w.remaining == 0) {
            finish_write(p);
            continue;
        }
        if (off >= p->in_len)
            break;
        size_t used;
        if (p->w.active) {
            long n = write_chunk(p, p->in + off, p->in_len - off);
            if (n < 0) {
                struct fab__tcp_msg m = {.op = FAB_OP_WRITE,
                                         .rkey = p->w.rkey,
                                         .raddr = p->w.dst,
                                         .cookie = p->w.cookie,
                                         .flags = p->w.flags};
                peer_fail(p, &m);
                break;
            }
            used = (size_t)n;
        } else {
            used = apply_one(p, p->in + off, p->in_len - off, wrote);
        }
        if (used == 0)
            break;
        off += used;
    }
    if (off > p->in_len)
        off = p->in_len;
    if (off > 0 && off < p->in_len)
        memmove(p->in, p->in + off, p->in_len - off);
    p->in_len -= off;
}

/* ---- loop callbacks ----------------------------------------------------------- */

/* Forgets p as the hot connection (it closes; its descriptor goes with
 * its handle, so hot mode needs no undoing). */
static void hot_forget(struct tcp_node *n, struct tcp_peer *p)
{
    if (n->hot_cand == p) {
        n->hot_cand = NULL;
        n->hot_score = 0;
    }
    if (n->hotp == p) {
        n->hotp = NULL;
        __atomic_store_n(&n->hot_on, 0, __ATOMIC_SEQ_CST);
    }
}

static void on_peer_closed(uv_handle_t *h)
{
    struct tcp_peer *p = h->data;
    struct tcp_node *n = p->node;
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        n->peers = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    hot_forget(n, p);
    struct fab__handlers hs = fab__handler_enter(&n->base);
    if (hs.close != NULL && !uv_is_closing((uv_handle_t *)&n->stop))
        hs.close(hs.data, p->id);
    fab__handler_exit(&n->base);
    free(p);
}

static void peer_close(struct tcp_peer *p)
{
    hot_forget(p->node, p);
    if (!uv_is_closing((uv_handle_t *)&p->h))
        uv_close((uv_handle_t *)&p->h, on_peer_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct tcp_peer *p = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)p->in + p->in_len, (unsigned)(sizeof(p->in) - p->in_len));
}

/* Hot receive scoring: a write from the candidate counts up (to
 * HOT_SCORE_MAX), one from another connection counts down by HOT_PENALTY
 * and takes over once the score is spent. A waiter reads the candidate's
 * socket directly once the score reaches HOT_ENTER. So a ping-pong whose
 * credits arrive on another connection every quarter ring stays hot, while
 * sources that alternate (N:1) keep the epoll path, where any socket wakes
 * the waiter at once. */
#define HOT_SCORE_MAX 16
#define HOT_ENTER     8
#define HOT_PENALTY   4

static void hot_note(struct tcp_node *n, struct tcp_peer *p)
{
    if (n->hot_cand == p) {
        if (n->hot_score < HOT_SCORE_MAX)
            n->hot_score++;
        return;
    }
    n->hot_score -= HOT_PENALTY;
    if (n->hot_score <= 0) {
        n->hot_cand = p;
        n->hot_score = 1;
    }
}

/* Applies nread new bytes of p's input (read by libuv or by the hot recv). */
static void peer_input(struct tcp_peer *p, size_t nread)
{
    struct tcp_node *n = p->node;
    p->in_len += nread;
    int wrote = 0;
    pthread_mutex_lock(&n->mr_lock);
    process_input(p, &wrote);
    pthread_mutex_unlock(&n->mr_lock);
    if (wrote || p->w.active) {
        ring_doorbell(n);
        hot_note(n, p);
    }
    peer_flush(p);
    if (p->failed) {
        uv_read_stop((uv_stream_t *)&p->h);
        peer_close(p); /* libuv finishes queued writes before the close callback */
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct tcp_peer *p = s->data;
    (void)buf;
    if (nread < 0) {
        peer_close(p);
        return;
    }
    peer_input(p, (size_t)nread);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct tcp_node *n = server->data;
    if (status < 0)
        return;
    struct tcp_peer *p = calloc(1, sizeof(*p));
    if (p == NULL || uv_tcp_init(&n->loop, &p->h) < 0) {
        free(p);
        return;
    }
    p->h.data = p;
    p->wreq.data = p;
    p->node = n;
    p->id = ++n->next_peer_id;
    p->fill = p->out[0];
    p->next = n->peers;
    if (n->peers != NULL)
        n->peers->prev = p;
    n->peers = p;
    if (uv_accept(server, (uv_stream_t *)&p->h) < 0) {
        peer_close(p);
        return;
    }
    uv_tcp_nodelay(&p->h, 1);
    uv_read_start((uv_stream_t *)&p->h, on_alloc, on_read);
}

static void on_stop(uv_async_t *a)
{
    struct tcp_node *n = a->data;
    for (struct tcp_peer *p = n->peers; p != NULL; p = p->next)
        peer_close(p);
    uv_close((uv_handle_t *)&n->listener, NULL);
    uv_close((uv_handle_t *)&n->stop, NULL);
    uv_close((uv_handle_t *)&n->drive_timer, NULL);
}

/* The progress thread leaves the loop to waiters for this long after a
 * waiter released it, so a consumer that waits again soon (a ping-pong, a
 * drained ring) finds the loop free instead of contending with the progress
 * thread; events that arrive meanwhile with no waiter wait at most this. */
#define PROGRESS_GRACE_NS (1 * FK_NSEC_PER_MSEC)

static void cond_wait_ns(struct tcp_node *n, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / FK_NSEC_PER_SEC);
    ts.tv_nsec = (long)(t % FK_NSEC_PER_SEC);
    pthread_cond_timedwait(&n->owner_cv, &n->loop_lock, &ts);
}

/* ---- hot receive -------------------------------------------------------------------- */

/* The hot recv blocks at most this long (SO_RCVTIMEO), so a waiter notices
 * its deadline; a wait with less time left than this may overrun its
 * timeout by up to this much. */
#define HOT_SLICE_US 1000

/* The signal that interrupts a waiter's hot recv. SIGURG is ignored by
 * default and sent by the kernel only to a socket owner set with F_SETOWN,
 * which nothing here does. It is installed with SA_RESTART, so a blocking
 * call elsewhere restarts; recv on a socket with SO_RCVTIMEO does not
 * restart and returns EINTR, which is the point. The handshake in hot_wait
 * makes sure it is only ever sent to a thread inside that recv. */
#define HOT_SIGNAL SIGURG

static __thread volatile sig_atomic_t hot_kicked;
static pthread_once_t hot_once = PTHREAD_ONCE_INIT;
static int hot_usable; /* the handler is ours and hot receive is enabled */

static void on_hot_signal(int sig)
{
    (void)sig;
    hot_kicked = 1;
}

/* Installs the handler unless the application handles HOT_SIGNAL itself,
 * or FLOWKV_FAB_HOT=0 turns hot receive off (plain epoll path). */
static void hot_install(void)
{
    const char *env = getenv("FLOWKV_FAB_HOT");
    if (env != NULL && strcmp(env, "0") == 0)
        return;
    struct sigaction old, sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_hot_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(HOT_SIGNAL, NULL, &old) < 0 || (old.sa_flags & SA_SIGINFO) ||
        (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN))
        return;
    if (sigaction(HOT_SIGNAL, &sa, NULL) == 0)
        __atomic_store_n(&hot_usable, 1, __ATOMIC_RELEASE);
}

/* Whether this thread can be kicked: the handler is installed and the
 * thread does not block HOT_SIGNAL (checked once per thread). */
static int hot_enabled(void)
{
    static __thread int mask_ok; /* 0 unknown, 1 deliverable, 2 blocked */
    pthread_once(&hot_once, hot_install);
    if (!__atomic_load_n(&hot_usable, __ATOMIC_ACQUIRE))
        return 0;
    if (mask_ok == 0) {
        sigset_t cur;
        mask_ok =
            pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && !sigismember(&cur, HOT_SIGNAL) ? 1 : 2;
    }
    return mask_ok == 1;
}

/* Puts p in hot mode: libuv stops reading it and its socket blocks, with
 * receives bounded by HOT_SLICE_US. Returns 0 or -1 (p stays with libuv). */
static int hot_enter(struct tcp_node *n, struct tcp_peer *p)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&p->h, &fd) < 0)
        return -1;
    if (!p->hot_timo) {
        struct timeval tv = {0, HOT_SLICE_US};
        if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
            return -1;
        p->hot_timo = 1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
        return -1;
    /* The descriptor leaves the epoll set lazily: libuv removes it the
     * next time epoll reports it with no reader (one extra wake-up). */
    uv_read_stop((uv_stream_t *)&p->h);
    p->hot_fd = fd;
    n->hotp = p;
    __atomic_store_n(&n->hot_on, 1, __ATOMIC_SEQ_CST);
    /* The connection is out of the epoll set now, and a waiter leaves it
     * in hot mode when it stops waiting (the next wait takes it up
     * cheaply); the progress thread gives it back to libuv once no waiter
     * leads (progress_main). Should that thread sleep in epoll, no event
     * of this connection would wake it: wake it now, so that it watches
     * the waiter instead (take_loop). Without this, a fetch-and-add sent
     * after the consumer stopped waiting went unanswered until another
     * descriptor had an event (test_fab_verbs_pair, 1 run in 15). */
    if (__atomic_load_n(&n->progress_asleep, __ATOMIC_SEQ_CST)) {
        uint64_t one = 1;
        (void)!write(n->wake_fd, &one, sizeof(one));
    }
    return 0;
}

static void hot_flush(struct tcp_node *n);

/* Gives the hot connection back to libuv (loop holder). */
static void hot_leave(struct tcp_node *n)
{
    struct tcp_peer *p = n->hotp;
    if (p == NULL)
        return;
    n->hotp = NULL;
    __atomic_store_n(&n->hot_on, 0, __ATOMIC_SEQ_CST);
    int fl = fcntl(p->hot_fd, F_GETFL);
    if (fl >= 0)
        fcntl(p->hot_fd, F_SETFL, fl | O_NONBLOCK);
    if (!uv_is_closing((uv_handle_t *)&p->h))
        uv_read_start((uv_stream_t *)&p->h, on_alloc, on_read);
}

/* Whether the leading waiter should read the hot connection now, moving
 * hot mode to the current candidate if it changed. */
static int hot_ready(struct tcp_node *n)
{
    struct tcp_peer *c = n->hot_cand;
    if (c == NULL || n->hot_score < HOT_ENTER || c->failed || uv_is_closing((uv_handle_t *)&c->h) ||
        !hot_enabled()) {
        hot_leave(n);
        return 0;
    }
    if (n->hotp == c)
        return 1;
    hot_leave(n);
    int ok = hot_enter(n, c) == 0;
    hot_flush(n); /* the old hot connection's watcher, started again */
    return ok && n->hotp == c;
}

/* Progress thread, loop_lock held, a waiter leads in hot mode: the waiter
 * reads one socket only, so watch the others (the loop's epoll set, which
 * no longer holds the hot one) and interrupt its recv when one has an
 * event. After a kick, wait until the waiter served the loop, else the
 * still-ready descriptor would make us kick again and again. */
static void watch_for_waiter(struct tcp_node *n)
{
    uint32_t seq = n->kick_seq;
    if (__atomic_load_n(&n->kick_ack, __ATOMIC_SEQ_CST) != seq) {
        cond_wait_ns(n, HOT_SLICE_US * FK_NSEC_PER_USEC);
        return;
    }
    pthread_mutex_unlock(&n->loop_lock);
    struct pollfd pfd = {uv_backend_fd(&n->loop), POLLIN, 0};
    int ready = poll(&pfd, 1, HOT_SLICE_US / 1000) > 0;
    pthread_mutex_lock(&n->loop_lock);
    if (!ready || n->owner != OWNER_WAITER || !__atomic_load_n(&n->hot_on, __ATOMIC_SEQ_CST))
        return;
    __atomic_store_n(&n->kick_seq, seq + 1, __ATOMIC_SEQ_CST);
    int expect = HOT_IN_RECV;
    if (__atomic_compare_exchange_n(&n->hot_state, &expect, HOT_KICKED, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        pthread_kill(__atomic_load_n(&n->hot_tid, __ATOMIC_RELAXED), HOT_SIGNAL);
}

/* Non-blocking loop iterations for a waiter in hot mode. Two: callbacks of
 * the first (an accepted connection, a write that must wait for room)
 * start watchers that libuv adds to its epoll set only in the next
 * iteration, and until then the progress thread cannot see their events. */
static void hot_flush(struct tcp_node *n)
{
    uv_run(&n->loop, UV_RUN_NOWAIT);
    uv_run(&n->loop, UV_RUN_NOWAIT);
}

/* The waiter's side of a kick (the progress thread saw an event on another
 * descriptor), or force: the hot recv timed out, or HOT_FLUSH_EVERY
 * messages passed, a bound on how long a watcher started by a callback of
 * a flush could go unwatched. */
#define HOT_FLUSH_EVERY 64

static void hot_serve(struct tcp_node *n, int force)
{
    uint32_t seq = __atomic_load_n(&n->kick_seq, __ATOMIC_SEQ_CST);
    int kicked = seq != __atomic_load_n(&n->kick_ack, __ATOMIC_RELAXED);
    if (!kicked && !force)
        return;
    hot_flush(n);
    if (!kicked)
        return;
    pthread_mutex_lock(&n->loop_lock);
    __atomic_store_n(&n->kick_ack, seq, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&n->owner_cv);
    pthread_mutex_unlock(&n->loop_lock);
}

/* One blocking recv on the hot connection (the hot path: one system call
 * per message, where the loop costs epoll_wait and read; DFI's latency mode
 * wants the RDMA NIC's one-event-per-write here). The state word makes the
 * kick safe: the progress thread signals only after moving IN_RECV to
 * KICKED, and a waiter that finds KICKED when it leaves waits for that
 * signal, so none reaches the application. A signal that lands just
 * before the recv starts costs at most one HOT_SLICE_US. */
static void hot_wait(struct tcp_node *n)
{
    struct tcp_peer *p = n->hotp;
    assert(p != NULL && p->in_len < sizeof(p->in));
    __atomic_store_n(&n->hot_tid, pthread_self(), __ATOMIC_RELAXED);
    __atomic_store_n(&n->hot_state, HOT_IN_RECV, __ATOMIC_SEQ_CST);
    ssize_t r = -1;
    int err = EINTR;
    if (__atomic_load_n(&n->kick_seq, __ATOMIC_SEQ_CST) ==
        __atomic_load_n(&n->kick_ack, __ATOMIC_RELAXED)) {
        r = recv(p->hot_fd, p->in + p->in_len, sizeof(p->in) - p->in_len, 0);
        err = errno;
    }
    int expect = HOT_IN_RECV;
    if (!__atomic_compare_exchange_n(&n->hot_state, &expect, HOT_IDLE, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        /* Kicked: the signal is sent right after the state changed; wait
         * for it here (bounded, should the application block it later). */
        uint64_t t0 = fk_now_ns();
        for (unsigned i = 0; !hot_kicked; i++) {
            if (i % 64 != 63)
                continue;
            sched_yield();
            if (fk_now_ns() - t0 > FK_NSEC_PER_SEC) {
                fk_warn("flows", "fabric: hot receive kick not delivered (signal blocked?)");
                break;
            }
        }
        hot_kicked = 0;
        __atomic_store_n(&n->hot_state, HOT_IDLE, __ATOMIC_SEQ_CST);
    }
    int timed_out = r < 0 && (err == EAGAIN || err == EWOULDBLOCK);
    if (r > 0)
        peer_input(p, (size_t)r);
    else if (r == 0 || (!timed_out && err != EINTR))
        peer_close(p); /* end of stream or a socket error, as libuv reports it */
    hot_serve(n, timed_out || ++n->hot_iter % HOT_FLUSH_EVERY == 0);
}

/* Takes the loop for kind. A waiter gets it unless another waiter leads
 * (returns 1); the progress thread waits for waiters and their grace. */
static int take_loop(struct tcp_node *n, int kind)
{
    pthread_mutex_lock(&n->loop_lock);
    for (;;) {
        if (kind == OWNER_WAITER && n->owner == OWNER_WAITER) {
            pthread_mutex_unlock(&n->loop_lock);
            return 1;
        }
        if (kind == OWNER_WAITER && n->owner == OWNER_NONE)
            break;
        if (kind == OWNER_PROGRESS && n->owner == OWNER_NONE) {
            uint64_t since = fk_now_ns() - n->last_waiter;
            if (n->last_waiter == 0 || since >= PROGRESS_GRACE_NS)
                break;
            cond_wait_ns(n, PROGRESS_GRACE_NS - since);
            continue;
        }
        if (kind == OWNER_PROGRESS && n->owner == OWNER_WAITER &&
            __atomic_load_n(&n->hot_on, __ATOMIC_SEQ_CST)) {
            watch_for_waiter(n);
            continue;
        }
        if (kind == OWNER_WAITER)
            n->wanted++;
        cond_wait_ns(n, PROGRESS_GRACE_NS);
        if (kind == OWNER_WAITER)
            n->wanted--;
    }
    __atomic_store_n(&n->owner, kind, __ATOMIC_RELAXED); /* tcp_wait peeks without the lock */
    pthread_mutex_unlock(&n->loop_lock);
    return 0;
}

static void release_loop(struct tcp_node *n)
{
    pthread_mutex_lock(&n->loop_lock);
    assert(n->owner != OWNER_NONE);
    int was_waiter = n->owner == OWNER_WAITER;
    __atomic_store_n(&n->owner, OWNER_NONE, __ATOMIC_RELAXED);
    if (was_waiter)
        n->last_waiter = fk_now_ns();
    if (n->wanted > 0)
        pthread_cond_broadcast(&n->owner_cv);
    pthread_mutex_unlock(&n->loop_lock);
    /* Waiters that found a leader sleep on the doorbell: let one of them
     * lead now (they retry drive_loop when woken). */
    if (was_waiter && __atomic_load_n(&n->waiters, __ATOMIC_SEQ_CST) > 0)
        futex(&n->doorbell, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

/* Waits for the loop's events without owning it, or for hot_enter's wake. */
static void wait_events(struct tcp_node *n, int timeout_ms)
{
    struct pollfd p[2] = {{uv_backend_fd(&n->loop), POLLIN, 0}, {n->wake_fd, POLLIN, 0}};
    if (poll(p, 2, timeout_ms) > 0 && (p[1].revents & POLLIN)) {
        uint64_t v;
        (void)!read(n->wake_fd, &v, sizeof(v));
    }
}

static void on_drive_timer(uv_timer_t *t)
{
    (void)t; /* only ends a blocking loop iteration */
}

/* The waiter as leader: runs the loop until the doorbell moves past seen
 * or the deadline. Returns 0, FK_ETIMEDOUT, or 1 when another waiter leads. */
static int drive_loop(struct tcp_node *n, uint32_t seen, uint64_t deadline)
{
    if (take_loop(n, OWNER_WAITER))
        return 1;
    int rc = FK_ETIMEDOUT;
    for (;;) {
        if (__atomic_load_n(&n->doorbell, __ATOMIC_SEQ_CST) != seen) {
            rc = 0;
            break;
        }
        uint64_t now = fk_now_ns();
        if (now >= deadline)
            break;
        if (hot_ready(n)) {
            hot_wait(n);
            continue;
        }
        /* One blocking loop iteration (one epoll_wait: the kernel wakes us
         * with the data), bounded by a timer in slices of at most 10 ms. */
        uint64_t ms = (deadline - now + FK_NSEC_PER_MSEC - 1) / FK_NSEC_PER_MSEC;
        uint64_t slice = ms < 10 ? ms : 10;
        /* The timer repeats: uv_run(ONCE) updates its clock and runs due
         * timers before it polls, so a one-shot timer that fell due in
         * between (this thread preempted for a slice: common on a 2-CPU
         * VM) fired there and left the poll with no timeout,
         * epoll_wait(-1), until some event came. An idle NOPaxos leader
         * then sent no heartbeat for about 1 s and its followers changed
         * the view (make run, idle, on 2026-11-24). Repeating, it is due
         * again one slice later and bounds that poll. */
        uv_update_time(&n->loop);
        uv_timer_start(&n->drive_timer, on_drive_timer, slice, slice);
        if (n->base.fault.stall_ns) /* fault knob (fab.h): a preempted waiter */
            fk_sleep_ns(n->base.fault.stall_ns);
        uv_run(&n->loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&n->drive_timer);
    release_loop(n);
    return rc;
}

/* The progress thread runs the loop whenever no waiter does; it never
 * holds the loop while it sleeps, so a waiter can take over at once. */
static void *progress_main(void *arg)
{
    struct tcp_node *n = arg;
    for (;;) {
        take_loop(n, OWNER_PROGRESS);
        hot_leave(n); /* no waiter reads the hot connection now */
        int alive = uv_run(&n->loop, UV_RUN_NOWAIT);
        int timeout = uv_backend_timeout(&n->loop);
        release_loop(n);
        if (!alive)
            return NULL; /* stopped: every handle is closed */
        /* Asleep, then hot_on; hot_enter stores hot_on, then reads asleep
         * (all sequentially consistent): either we see hot mode and do
         * not sleep, or hot_enter sees us asleep and wakes us. */
        __atomic_store_n(&n->progress_asleep, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&n->hot_on, __ATOMIC_SEQ_CST))
            wait_events(n, timeout);
        __atomic_store_n(&n->progress_asleep, 0, __ATOMIC_SEQ_CST);
    }
}

/* ---- node ------------------------------------------------------------------------ */

static int bind_listener(struct tcp_node *n, const char *host, uint16_t port)
{
    struct sockaddr_in sa;
    int rc = uv_ip4_addr(host, port, &sa);
    if (rc < 0)
        return FK_EINVAL;
    rc = uv_tcp_bind(&n->listener, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&n->listener, 128, on_connection);
    if (rc < 0)
        return rc;
    /* Accepted sockets inherit the listener's retransmission floor, so
     * that the handshake's round-trip sample already sets their timeout
     * by it (set on the accepted socket alone, it applied from the next
     * sample: a first response lost still waited 200 ms). */
    uv_os_fd_t lfd;
    if (uv_fileno((uv_handle_t *)&n->listener, &lfd) == 0)
        fab__tcp_tune(lfd);
    struct sockaddr_in got;
    int len = sizeof(got);
    uv_tcp_getsockname(&n->listener, (struct sockaddr *)&got, &len);
    snprintf(n->base.addr, sizeof(n->base.addr), "%s:%u", host, ntohs(got.sin_port));
    return 0;
}

static int tcp_node_create(const struct fab_config *cfg, fab_node **out)
{
    struct tcp_node *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return FK_ENOMEM;
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (strlen(host) >= sizeof(n->host)) {
        free(n);
        return FK_EINVAL;
    }
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->base.ops = &fab__tcp_ops;
    fab__node_base_init(&n->base, cfg);
    n->base.has_mcast = fab__udp_probe_mcast(host);
    pthread_mutex_init(&n->mr_lock, NULL);
    pthread_mutex_init(&n->loop_lock, NULL);
    pthread_cond_init(&n->owner_cv, NULL);
    n->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (n->wake_fd < 0) {
        free(n);
        return FK_ENOMEM;
    }
    int rc = uv_loop_init(&n->loop);
    if (rc < 0) {
        close(n->wake_fd);
        free(n);
        return rc;
    }
    uv_tcp_init(&n->loop, &n->listener);
    uv_async_init(&n->loop, &n->stop, on_stop);
    uv_timer_init(&n->loop, &n->drive_timer);
    n->listener.data = n;
    n->stop.data = n;
    rc = bind_listener(n, host, cfg->port);
    if (rc == 0 && pthread_create(&n->thread, NULL, progress_main, n) != 0)
        rc = FK_ENOMEM;
    if (rc < 0) {
        uv_close((uv_handle_t *)&n->listener, NULL);
        uv_close((uv_handle_t *)&n->stop, NULL);
        uv_close((uv_handle_t *)&n->drive_timer, NULL);
        uv_run(&n->loop, UV_RUN_DEFAULT);
        uv_loop_close(&n->loop);
        pthread_mutex_destroy(&n->mr_lock);
        pthread_mutex_destroy(&n->loop_lock);
        pthread_cond_destroy(&n->owner_cv);
        close(n->wake_fd);
        free(n);
        return rc;
    }
    *out = &n->base;
    return 0;
}

static void tcp_node_destroy(fab_node *bn)
{
    struct tcp_node *n = (struct tcp_node *)bn;
    uv_async_send(&n->stop);
    pthread_join(n->thread, NULL);
    int rc = uv_loop_close(&n->loop);
    assert(rc == 0);
    (void)rc;
    for (int i = 0; i < FAB_MR_MAX; i++)
        if (n->mrs[i] != NULL)
            fk_warn("flows", "fabric node %s destroyed with a region still registered",
                    n->base.addr);
    pthread_mutex_destroy(&n->mr_lock);
    pthread_mutex_destroy(&n->loop_lock);
    pthread_cond_destroy(&n->owner_cv);
    close(n->wake_fd);
    free(n);
}

const struct fab__ops fab__tcp_ops = {
    .name = "tcp",
    .node_create = tcp_node_create,
    .node_destroy = tcp_node_destroy,
    .mr_reg = tcp_mr_reg,
    .mr_dereg = tcp_mr_dereg,
    .doorbell = tcp_doorbell,
    .wait = tcp_wait,
    .connect = fab__tcp_connect,
    .conn_close = fab__tcp_conn_close,
    .post = fab__tcp_post,
    .poll = fab__tcp_poll,
    .conn_wait = fab__tcp_conn_wait,
    .conn_check = fab__tcp_conn_check,
    .call = fab__tcp_call,
    .ep_open = fab__udp_open,
    .ep_close = fab__udp_close,
    .ep_send = fab__udp_send,
    .ep_recv = fab__udp_recv,
    .ep_join = fab__udp_join,
    .ep_mcast_send = fab__udp_mcast_send,
};
