/*
 * flow_source.c: the source side of ring-based flows (DFI sections 5.1 to
 * 5.4): staging tuples into segments, writing them into the target's ring
 * with one one-sided write, and learning free space.
 *
 * Free space: the source counts segments it sent; the target publishes how
 * many it consumed. Bandwidth mode pulls that counter with a one-sided read,
 * lazily: a read is issued once half the ring is in flight and waited for
 * only when the ring is full. Latency mode gets it pushed: the target writes
 * its count into this source's registered credit word every quarter ring.
 * Selective signaling: one signaled write per ring wrap (DFI section 5.2),
 * whose completion also bounds the fabric's outstanding work.
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define COOKIE_READ  1u
#define COOKIE_WRITE 2u
#define COOKIE_END   3u

static const char *target_addr(const flow_source *s, int k)
{
    return s->desc.targets[k];
}

/* Target k failed (its node closed the connection, or an operation
 * failed). A joined target's index is returned to the home node, naming
 * the address this source knew there, so that a client that died without
 * leaving does not hold its slot forever (elastic membership: a dead
 * member's slot is reclaimed). Declared targets keep their index: a
 * restarted node opens it again, and a unicast replicate source attaches
 * to it again (replicate_reattach): a replica that recovers must hear the
 * leader's accepts (Multi-Paxos) or the ordered multicast (NOPaxos
 * section 4) again, not only from sources opened after it came back. */
static void drop_member(flow_source *s, int k);

static void target_gone(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    int was_live = st->state == 1;
    st->state = 2;
    if (!was_live || s->desc.targets[k][0] == '\0')
        return;
    if ((uint32_t)k < s->desc.ntargets_declared) {
        if (s->desc.opts.kind == FLOW_REPLICATE && !s->desc.opts.multicast) {
            st->state = 3;
            st->retry_at = fk_now_ns() + FLOW__REPL_REATTACH_NS;
        }
        return;
    }
    /* The member this source attached to: its address and joins (a state
     * 1 target's entry in s->desc is the one it attached to:
     * ensure_target drops the others). */
    struct flow__leave_req req;
    memset(&req, 0, sizeof(req));
    req.h.type = FLOW__MSG_LEAVE_TARGET;
    req.h.arg = (uint32_t)k;
    snprintf(req.h.name, sizeof(req.h.name), "%s", s->desc.name);
    memcpy(req.addr, s->desc.targets[k], FAB_ADDR_MAX);
    req.joins = s->desc.joins[k];
    struct flow__desc d;
    if (flow__call(s->node, s->desc.home, &req, sizeof(req), &d, sizeof(d)) == (int)sizeof(d))
        flow__store_desc(s->node, &d);
    drop_member(s, k);
}

/* Handles completions of target k without blocking. */
static int reap(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    struct fab_wc wc[8];
    int n;
    /* Nothing can complete: skip the system call (errors of unsignaled
     * writes surface with the next signaled one, once per ring wrap). */
    if (st->signaled == 0 && !st->read_pending && !st->held)
        return 0;
    st->held = 0; /* fab_poll sends what the fabric batched (fab.h, FAB_MORE) */
    if (st->read_held) {
        st->read_held = 0;
        st->read_posted = fk_now_ns();
    }
    while ((n = fab_poll(st->conn, wc, 8)) > 0) {
        for (int i = 0; i < n; i++) {
            if (wc[i].status < 0) {
                target_gone(s, k); /* remote error: the target is gone */
                return FK_ECLOSED;
            }
            if (wc[i].cookie == COOKIE_READ) {
                st->read_pending = 0;
                uint64_t v = __atomic_load_n(st->read_buf, __ATOMIC_ACQUIRE);
                if (v > st->consumed)
                    st->consumed = v;
            } else {
                assert(st->signaled > 0);
                st->signaled--;
            }
        }
    }
    if (n < 0) {
        target_gone(s, k);
        return FK_ECLOSED;
    }
    return 0;
}

static uint64_t ctrl_addr(const struct flow__starget *st)
{
    return st->ring.addr; /* consumed counter: first word of the ring */
}

/* Posts the read of the consumed counter; more != 0 lets it ride with the
 * next batch of segments instead of costing a system call of its own. */
static int post_consumed_read(flow_source *s, int k, unsigned more)
{
    struct flow__starget *st = &s->t[k];
    if (st->read_pending)
        return 0;
    int rc = fab_post_read(st->conn, s->mr, st->read_buf, 8, ctrl_addr(st), st->ring.key,
                           COOKIE_READ, more);
    if (rc == 0) {
        st->read_pending = 1;
        st->held |= more != 0;
        st->read_held = more != 0;
        st->read_posted = fk_now_ns();
    }
    return rc;
}

/* Learns the target's consumed count: from the credit word (latency) or the
 * last completed read (bandwidth). */
static void refresh_consumed(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    if (s->desc.opts.mode == FLOW_LATENCY) {
        uint64_t v = fab_load64(&s->credits[k]);
        if (v > st->consumed)
            st->consumed = v;
    }
}

/* Waits until target k's ring has a free segment (a slow consumer stalls
 * the source here, never overwritten: DFI section 5.3). */
static int wait_space(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    uint64_t deadline = 0;
    int bw = s->desc.opts.mode == FLOW_BANDWIDTH;
    /* Bandwidth mode is lazy (DFI section 5.3): while the ring has room by
     * what the source last learned, no system call at all; the read of the
     * consumed counter is posted once half the ring is in flight, riding
     * with the batched segments, and its answer is polled only when the
     * ring looks full. */
    if (bw && st->sent - st->consumed < st->nseg) {
        if (st->sent - st->consumed >= st->nseg / 2)
            post_consumed_read(s, k, FAB_MORE);
        return 0;
    }
    for (;;) {
        int rc = reap(s, k);
        if (rc < 0)
            return rc;
        refresh_consumed(s, k);
        uint64_t inflight = st->sent - st->consumed;
        if (bw && inflight >= st->nseg / 2)
            post_consumed_read(s, k, 0);
        if (inflight < st->nseg) {
            st->full_since = 0;
            return 0;
        }
        uint64_t now = fk_now_ns();
        if (deadline == 0)
            deadline = now + s->timeout_ns;
        /* Since when the ring has looked full, across pushes: a push may
         * wait only a few milliseconds (the server's), less than the
         * stalls below are measured in. */
        if (st->full_since == 0)
            st->full_since = now;
        if (st->read_pending && !st->read_held && now - st->read_posted >= FLOW__READ_DEAD_NS) {
            fk_warn("flows", "flow %s: target %d at %s does not answer: written off", s->desc.name,
                    k, s->desc.targets[k]);
            target_gone(s, k);
            return FK_ECLOSED;
        }
        if (now >= deadline)
            return FK_ETIMEDOUT;
        /* Latency mode learns free space from credits the target writes
         * back (DFI section 5.3). A credit that never comes (the target's
         * credit connection failed: on rxe, a queue pair in error after
         * its retries) must not stall the source for good: after a while
         * it reads the consumed counter itself, as bandwidth mode does. */
        if (!bw && now - st->full_since >= FLOW__CREDIT_STALL_NS && !st->read_pending)
            post_consumed_read(s, k, 0);
        /* Each wait ends by the push's deadline: a server's replies push
         * with a 2 ms timeout (SRV_NET_PUSH_NS), and a full 10 ms wait per
         * reply to a client whose credit read was lost held its loop 10
         * ms a reply. */
        uint64_t wait =
            deadline - now < 10 * FK_NSEC_PER_MSEC ? deadline - now : 10 * FK_NSEC_PER_MSEC;
        if (s->desc.opts.mode == FLOW_BANDWIDTH) {
            fab_conn_wait(st->conn, wait);
            if (!st->read_pending)
                post_consumed_read(s, k, 0);
        } else {
            uint64_t bell = fab_node_doorbell(flow__fab(s->node));
            refresh_consumed(s, k);
            if (st->sent - st->consumed >= st->nseg)
                fab_node_wait(flow__fab(s->node), bell, wait);
        }
    }
}

/* Writes one staged segment (fill tuples, footer fields) to target k. */
static int send_segment(flow_source *s, int k, uint8_t *stage, uint32_t fill, uint64_t seq,
                        uint64_t flags)
{
    struct flow__starget *st = &s->t[k];
    if (st->state != 1)
        return FK_ECLOSED;
    int rc = wait_space(s, k);
    if (rc < 0)
        return rc;
    struct flow__footer *f = (struct flow__footer *)(void *)(stage + s->geom.seg_payload);
    f->seq = seq;
    f->state = FOOT_STATE(fill, s->session, flags);
    uint64_t at = st->ring.addr + FLOW__CTRL_BYTES + (st->sent % st->nseg) * s->geom.seg_stride;
    /* One signaled write per ring wrap, and for end-of-flow (close waits). */
    unsigned sig = (st->sent % st->nseg == st->nseg - 1 || (flags & FOOT_END)) ? FAB_SIGNALED : 0;
    uint64_t cookie = (flags & FOOT_END) ? COOKIE_END : COOKIE_WRITE;
    if (sig && st->signaled >= FAB_CONN_DEPTH / 2) {
        while (st->signaled >= FAB_CONN_DEPTH / 2 && (rc = reap(s, k)) == 0 &&
               st->signaled >= FAB_CONN_DEPTH / 2)
            fab_conn_wait(st->conn, 10 * FK_NSEC_PER_MSEC);
        if (rc < 0)
            return rc;
    }
    uint32_t bytes = fill * s->desc.schema.tuple_size;
    if (fill == s->geom.tuples_per_seg) {
        /* Bandwidth mode: a full segment may wait in the fabric's batch
         * (FAB_MORE) for the next ones, so several segments share one
         * system call; flow_flush, close and any wait for the target send
         * it. The stage stays untouched until the target consumed it, as
         * zero-copy posting requires (fab.h). Ordered flows batch too: a
         * NOPaxos client loading default records sent each full kv.oum
         * segment to each replica in a system call of its own, 37% of its
         * CPU; batched, a third less system time. */
        unsigned more = s->desc.opts.mode == FLOW_BANDWIDTH && !(flags & FOOT_END) ? FAB_MORE : 0;
        rc = fab_post_write(st->conn, st->stage_mr, stage, s->geom.seg_stride, at, st->ring.key,
                            cookie, sig | more);
        st->held |= more != 0;
    } else {
        /* Partial segment: payload, then the footer after it, as one batch. */
        rc = bytes ? fab_post_write(st->conn, st->stage_mr, stage, bytes, at, st->ring.key, cookie,
                                    FAB_MORE)
                   : 0;
        if (rc == 0)
            rc = fab_post_write(st->conn, st->stage_mr, f, FLOW__FOOTER_BYTES,
                                at + s->geom.seg_payload, st->ring.key, cookie, sig);
        if (rc == 0)
            st->held = 0;
    }
    if (rc < 0) {
        target_gone(s, k);
        return rc == FK_EUNREACHABLE || rc == FK_EPOISONED ? FK_ECLOSED : rc;
    }
    if (sig)
        st->signaled++;
    st->sent++;
    return 0;
}

/* The buffer of target k's current segment; waits for ring space first when
 * a new segment begins, so the buffer is free on both sides. */
static int stage_for(flow_source *s, int k, uint8_t **out)
{
    struct flow__starget *st = &s->t[k];
    if (st->fill == 0) {
        int rc = wait_space(s, k);
        if (rc < 0)
            return rc;
    }
    *out = st->stages + (st->sent % st->nseg) * s->geom.seg_stride;
    return 0;
}

static int alloc_stages(flow_source *s, int k);

/* ---- attach ------------------------------------------------------------------------------- */

/* How long one step of an attach may wait: what is left of the caller's
 * deadline, so that a node that does not answer costs at most that, and
 * at least 1 ms (a step started at the deadline still gets one try). */
static uint64_t attach_wait(uint64_t deadline)
{
    uint64_t now = fk_now_ns(), floor = FK_NSEC_PER_MSEC;
    uint64_t left = deadline > now + floor ? deadline - now : floor;
    return left < FLOW__CALL_TIMEOUT_NS ? left : FLOW__CALL_TIMEOUT_NS;
}

/* Connects to target k and takes a ring slot there, retrying while the
 * target is not open yet (its node answers FK_ENOTFOUND). */
static int attach_one(flow_source *s, int k, uint64_t deadline)
{
    struct flow__starget *st = &s->t[k];
    struct flow__attach_req req;
    struct flow__attach_resp resp = {0};
    memset(&req, 0, sizeof(req));
    req.h.type = FLOW__MSG_ATTACH;
    req.h.arg = (uint32_t)k;
    snprintf(req.h.name, sizeof(req.h.name), "%s", s->desc.name);
    req.slot = s->index;
    req.segments = s->geom.nseg;
    snprintf(req.source_node, sizeof(req.source_node), "%s", flow_node_addr(s->node));
    req.credit = fab_mr_rkey(s->mr);
    req.credit.addr = (uint64_t)(uintptr_t)&s->credits[k];
    req.credit.len = 8;
    if (s->mc != NULL)
        snprintf(req.mcast_ep, sizeof(req.mcast_ep), "%s", flow__mc_source_ep(s));
    fab_node *fab = flow__fab(s->node);
    int rc;
    for (unsigned backoff = 1;; backoff = backoff < 32 ? backoff * 2 : 32) {
        rc = st->conn ? 0 : fab_connect(fab, target_addr(s, k), attach_wait(deadline), &st->conn);
        if (rc == 0)
            rc = fab_call(st->conn, &req, sizeof(req), &resp, sizeof(resp), attach_wait(deadline));
        if (rc == (int)sizeof(resp) && s->mc == NULL &&
            (resp.segments < 2 || resp.segments > s->geom.nseg))
            rc = FK_EPROTO; /* at most what was asked (flow__target_attach) */
        if (rc == (int)sizeof(resp))
            break;
        if (rc >= 0)
            rc = FK_EPROTO;
        if (rc != FK_ENOTFOUND || fk_now_ns() >= deadline) {
            if (st->conn != NULL)
                fab_conn_close(st->conn);
            st->conn = NULL;
            return rc == FK_ENOTFOUND ? FK_ETIMEDOUT : rc;
        }
        fk_sleep_ns(backoff * FK_NSEC_PER_MSEC);
    }
    st->slot = resp.slot;
    st->ring = resp.ring;
    st->nseg = s->mc != NULL ? s->geom.nseg : resp.segments;
    if (s->mc == NULL && alloc_stages(s, k) < 0) {
        fab_conn_close(st->conn);
        st->conn = NULL;
        return FK_ENOMEM;
    }
    memcpy(st->mcast_ep, resp.mcast_ep, FAB_ADDR_MAX);
    st->sent = st->consumed = 0;
    st->fill = 0;
    st->signaled = 0;
    st->read_pending = 0;
    st->read_held = 0;
    st->full_since = 0;
    st->held = 0;
    fab_store64(&s->credits[k], 0);
    st->state = 1;
    return 0;
}

static void detach_one(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    if (st->conn != NULL)
        fab_conn_close(st->conn);
    st->conn = NULL;
    st->state = 2;
}

/* A joined member that left or died: its connection and its stages go
 * (a client that came and went leaves nothing behind at the replica; an
 * attach to the next member at the index allocates them anew). The
 * connection is closed first: no posted write reads the stages after. */
static void drop_member(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    detach_one(s, k);
    if (st->stages == NULL)
        return;
    uint64_t had = ((uint64_t)st->stage_nseg * s->geom.seg_stride + 63) / 64 * 64;
    fab_mr_dereg(st->stage_mr);
    free(st->stages);
    st->stages = NULL;
    st->stage_mr = NULL;
    st->stage_nseg = 0;
    flow__mem_charge(s->node, -(int64_t)had, s->desc.opts.exempt);
    s->mem_bytes -= had;
}

/* Whether index i names the same member in a and b (address and joins). */
static int same_member(const struct flow__desc *a, const struct flow__desc *b, uint32_t i)
{
    return strcmp(a->targets[i], b->targets[i]) == 0 && a->joins[i] == b->joins[i];
}

/* Makes target k usable: attaches to a target that joined after this source
 * opened (asking the home node for the newest declaration). */
static int ensure_target(flow_source *s, int k)
{
    if (k < 0 || k >= FLOW_TARGETS_MAX)
        return FK_EINVAL;
    if (s->t[k].state == 1)
        return 0;
    uint64_t now = fk_now_ns();
    if (s->t[k].state == 3 && now < s->t[k].retry_at)
        return FK_ECLOSED;
    struct flow__desc d;
    if (flow__describe(s->node, s->desc.name, s->desc.home, &d) < 0)
        return FK_ECLOSED;
    if ((uint32_t)k >= d.ntargets)
        return FK_EINVAL;
    if (d.targets[k][0] == '\0' || (s->t[k].state == 2 && same_member(&d, &s->desc, (uint32_t)k) &&
                                    d.version == s->desc.version && d.epoch == s->desc.epoch))
        return FK_ECLOSED;
    /* Other indices may have new members too (the same node joined
     * again counts as new): what this source holds there belonged to the
     * old ones. Drop it quietly (a LEAVE for the old member would be
     * refused anyway) and attach again when pushed to. */
    for (uint32_t j = s->desc.ntargets_declared; j < d.ntargets && j < FLOW_TARGETS_MAX; j++) {
        if ((int)j == k || same_member(&d, &s->desc, j))
            continue;
        drop_member(s, (int)j);
        s->t[j].state = 0;
        s->t[j].fails = 0;
    }
    if (!same_member(&d, &s->desc, (uint32_t)k)) {
        drop_member(s, k);
        s->t[k].fails = 0; /* a new member: no backoff from the old one */
    }
    s->desc.ntargets = d.ntargets;
    s->desc.version = d.version;
    s->desc.epoch = d.epoch;
    memcpy(s->desc.targets, d.targets, sizeof(d.targets));
    memcpy(s->desc.joins, d.joins, sizeof(d.joins));
    detach_one(s, k);
    uint64_t budget = s->timeout_ns > FLOW__JOIN_ATTACH_NS ? s->timeout_ns : FLOW__JOIN_ATTACH_NS;
    if (attach_one(s, k, now + budget) == 0) {
        s->t[k].fails = 0;
        return 0;
    }
    /* A member that did not answer (a busy machine, a slow handshake) has
     * not departed: writing it off would drop everything pushed to its
     * index for good. It is tried again after a backoff
     * (FLOW__REATTACH_NS doubling), so that pushes stay cheap. */
    fk_debug("flows", "flow %s target %d: attach failed (%u in a row)", s->desc.name, k,
             s->t[k].fails + 1);
    uint32_t sh = s->t[k].fails < FLOW__REATTACH_SHIFT ? s->t[k].fails : FLOW__REATTACH_SHIFT;
    s->t[k].fails++;
    s->t[k].state = 3;
    s->t[k].retry_at = fk_now_ns() + (FLOW__REATTACH_NS << sh);
    return FK_ECLOSED;
}

/* ---- push -------------------------------------------------------------------------------- */

static int route(flow_source *s, const void *tuple)
{
    int n = (int)s->desc.ntargets;
    if (s->route != NULL) {
        int k = s->route(tuple, n, s->route_data);
        return k >= 0 && k < n ? k : FK_EINVAL;
    }
    if (n == 1) /* one target: every key hashes to it (no per-tuple XXH64) */
        return s->t[0].state == 1 ? 0 : FK_ECLOSED;
    const struct flow_schema *sc = &s->desc.schema;
    const uint8_t *key = (const uint8_t *)tuple + sc->cols[sc->key].offset;
    uint64_t h = XXH64(key, sc->cols[sc->key].size, 0);
    int k = (int)(h % (uint64_t)n);
    /* A departed target's keys go to the next live one. */
    for (int i = 0; i < n && s->t[(k + i) % n].state != 1; i++)
        if (i == n - 1)
            return FK_ECLOSED;
    while (s->t[k].state != 1)
        k = (k + 1) % n;
    return k;
}

static int push_one(flow_source *s, int k, const void *tuple)
{
    struct flow__starget *st = &s->t[k];
    uint8_t *stage;
    int rc = stage_for(s, k, &stage);
    if (rc < 0)
        return rc;
    memcpy(stage + (uint64_t)st->fill * s->desc.schema.tuple_size, tuple,
           s->desc.schema.tuple_size);
    if (++st->fill == s->geom.tuples_per_seg) {
        st->fill = 0;
        return send_segment(s, k, stage, s->geom.tuples_per_seg, 0, 0);
    }
    return 0;
}

/* The fault knob's draw (xorshift64; drop_rng is odd). */
static int drop_draw(flow_source *s)
{
    uint64_t x = s->drop_rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s->drop_rng = x;
    return (double)(x >> 11) / (double)(1ull << 53) < s->drop_p;
}

/* Seals the current replicate segment at every live target, stamped with
 * one global sequence number when the flow is ordered. */
static int replicate_seal(flow_source *s, uint64_t flags)
{
    uint64_t seq = 0;
    int rc = 0;
    assert(!(flags & FOOT_END) || s->rfill == 0 || !s->desc.opts.ordered);
    if (s->desc.opts.ordered && !(flags & FOOT_END))
        rc = flow__seq_take(s, s->rfill > 0 ? s->rfill : 1, &seq);
    if (rc < 0 && !(flags & FOOT_END)) {
        /* No sequence number: nothing was sent. Latency mode: the segment
         * is the tuple being pushed, and the push fails (the caller may
         * push it again). Bandwidth mode: the full segment holds tuples
         * already accepted; it stays staged and the next push or flush
         * seals it first. */
        if (s->desc.opts.mode == FLOW_LATENCY) {
            for (uint32_t k = 0; k < s->desc.ntargets; k++)
                s->t[k].fill = 0;
            s->rfill = 0;
        }
        return rc;
    }
    if (flags & FOOT_END)
        seq = UINT64_MAX; /* end-of-flow takes no sequence number */
    for (uint32_t k = 0; rc == 0 && k < s->desc.ntargets; k++) {
        struct flow__starget *st = &s->t[k];
        if (st->state != 1)
            continue;
        if (s->drop_p > 0 && !(flags & FOOT_END) && drop_draw(s)) {
            st->fill = 0; /* the fault knob: this target never sees those numbers */
            continue;
        }
        uint8_t *stage = st->stages + (st->sent % st->nseg) * s->geom.seg_stride;
        int r = send_segment(s, (int)k, stage, st->fill, seq, flags);
        st->fill = 0;
        if (r < 0 && r != FK_ECLOSED)
            rc = r;
    }
    s->rfill = 0;
    return rc;
}

/* Replicate flows: attaches again, between segments, to the targets that
 * did not answer at open or at the last try, or that went away since
 * (target_gone), each for at most
 * FLOW__REPL_ATTACH_NS and at most once per FLOW__REPL_REATTACH_NS, so
 * that a target that is down costs pushes little. */
static void replicate_reattach(flow_source *s)
{
    if (s->rfill > 0)
        return; /* a member joins at a segment boundary */
    uint64_t now = fk_now_ns();
    for (uint32_t k = 0; k < s->desc.ntargets; k++) {
        struct flow__starget *st = &s->t[k];
        if (st->state != 3 || now < st->retry_at)
            continue;
        uint64_t budget =
            s->timeout_ns < FLOW__REPL_ATTACH_NS ? s->timeout_ns : FLOW__REPL_ATTACH_NS;
        if (st->conn != NULL) { /* the connection to the node's old incarnation */
            fab_conn_close(st->conn);
            st->conn = NULL;
        }
        if (attach_one(s, (int)k, now + budget) < 0)
            st->retry_at = fk_now_ns() + FLOW__REPL_REATTACH_NS;
        now = fk_now_ns();
    }
}

/* A tuple goes to every live target or to none: each live target's fill
 * is the flow's rfill, or 0 for one that joined mid-segment, so that no
 * stage holds more than a segment. (A push that failed at one target,
 * its ring full past the timeout, once left the tuple staged at the
 * targets before it: their fill ran ahead of rfill, and a later push
 * wrote past the end of their stages.) */
static int replicate_push(flow_source *s, const void *tuple)
{
    replicate_reattach(s);
    if (s->rfill == s->geom.tuples_per_seg || (s->seq_pending && s->rfill > 0)) {
        /* A segment whose seal failed (full, or flushed while the
         * sequencer was slow: its numbers are reserved for its count). */
        int rc = replicate_seal(s, 0);
        if (rc < 0)
            return rc;
    }
    /* A new segment needs room at every live target before any copy. */
    uint32_t room = 0;
    for (uint32_t k = 0; k < s->desc.ntargets; k++) {
        uint8_t *stage;
        if (s->t[k].state != 1 || s->t[k].fill != s->rfill)
            continue; /* down, or joined mid-segment: starts with the next one */
        int rc = s->rfill > 0 ? 0 : stage_for(s, (int)k, &stage);
        if (rc == 0)
            room |= 1u << k;
        else if (rc != FK_ECLOSED)
            return rc;
    }
    if (room == 0)
        return FK_ECLOSED;
    for (uint32_t k = 0; k < s->desc.ntargets; k++) {
        struct flow__starget *st = &s->t[k];
        if (!(room >> k & 1) || st->state != 1)
            continue;
        uint8_t *stage = st->stages + (st->sent % st->nseg) * s->geom.seg_stride;
        memcpy(stage + (uint64_t)st->fill * s->desc.schema.tuple_size, tuple,
               s->desc.schema.tuple_size);
        st->fill++;
    }
    if (++s->rfill == s->geom.tuples_per_seg)
        return replicate_seal(s, 0);
    return 0;
}

static int check_push(flow_source *s, const void *tuple, size_t size)
{
    if (s == NULL || tuple == NULL)
        return FK_EINVAL;
    if (!FLOW__OWNER_OK(s))
        return FK_EWRONG_THREAD;
    if (size != s->desc.schema.tuple_size)
        return FK_ESCHEMA;
    return 0;
}

int flow_push(flow_source *s, const void *tuple, size_t size)
{
    int rc = check_push(s, tuple, size);
    if (rc < 0)
        return rc;
    if (s->mc != NULL)
        return flow__mc_push(s, tuple);
    if (s->desc.opts.kind == FLOW_REPLICATE)
        return replicate_push(s, tuple);
    int k = s->desc.opts.kind == FLOW_COMBINER ? 0 : route(s, tuple);
    if (k < 0)
        return k;
    return push_one(s, k, tuple);
}

/* Drops what this source holds for joined members that are gone: ones
 * that left (a client that grew its reply rings left its old index, and
 * nothing pushes there until another member joins it) and ones whose node
 * closed the connection (a client killed while idle: no push fails to
 * tell). Departures come from the node's own copy of the declaration,
 * which at the flow's home (a replica's reply flow) is the one joins and
 * leaves change (a copy no newer than the source's says nothing); a closed
 * connection from polling it (fab_poll: FK_EUNREACHABLE), which reports
 * the member (target_gone). At most every FLOW__SWEEP_NS. */
static void sweep_departed(flow_source *s, uint64_t now)
{
    if (now - s->swept_at < FLOW__SWEEP_NS)
        return;
    s->swept_at = now;
    struct flow__desc d;
    int newer = flow__describe(s->node, s->desc.name, NULL, &d) == 0 && d.epoch == s->desc.epoch &&
                d.version > s->desc.version;
    for (uint32_t j = s->desc.ntargets_declared; j < s->desc.ntargets && j < FLOW_TARGETS_MAX;
         j++) {
        struct flow__starget *st = &s->t[j];
        if (st->stages == NULL && st->conn == NULL)
            continue;
        if (newer && (j >= d.ntargets || !same_member(&d, &s->desc, j))) {
            drop_member(s, (int)j);
            st->state = 0;
            st->fails = 0;
        } else if (st->state == 1) {
            st->held = 1; /* makes reap poll; a closed connection is reported */
            reap(s, (int)j);
        }
    }
}

int flow_source_check(flow_source *s)
{
    if (s == NULL)
        return FK_EINVAL;
    if (!FLOW__OWNER_OK(s))
        return FK_EWRONG_THREAD;
    int rc = 0;
    for (uint32_t k = 0; k < s->desc.ntargets && k < FLOW_TARGETS_MAX; k++) {
        if (s->t[k].state != 1 || fab_conn_check(s->t[k].conn) == 0)
            continue;
        target_gone(s, (int)k); /* as a failed write */
        rc = FK_ECLOSED;
    }
    return rc;
}

void flow_source_sweep(flow_source *s)
{
    if (s == NULL || !FLOW__OWNER_OK(s) || s->desc.opts.kind != FLOW_SHUFFLE)
        return;
    sweep_departed(s, fk_now_ns());
}

int flow_push_to(flow_source *s, int target, const void *tuple, size_t size)
{
    int rc = check_push(s, tuple, size);
    if (rc < 0)
        return rc;
    if (s->desc.opts.kind != FLOW_SHUFFLE)
        return FK_EINVAL;
    rc = ensure_target(s, target);
    if (rc == 0 && (uint32_t)target >= s->desc.ntargets_declared) {
        /* A joined target (a client) may have left and another joined at
         * its index since this source last pushed: a write into the old
         * connection would vanish without an error. After an idle
         * millisecond, poll the connection first: a closed one fails here
         * and the source attaches to the index's new member. */
        struct flow__starget *st = &s->t[target];
        uint64_t now = fk_now_ns();
        sweep_departed(s, now);
        if (st->state != 1)
            rc = ensure_target(s, target);
        if (rc == 0 && now - st->last_push > FK_NSEC_PER_MSEC) {
            st->held = 1; /* makes reap poll */
            if (reap(s, target) < 0)
                rc = ensure_target(s, target);
        }
        st->last_push = now;
    }
    if (rc < 0)
        return rc;
    return push_one(s, target, tuple);
}

void flow_source_set_route(flow_source *s, flow_route_fn fn, void *data)
{
    s->route = fn;
    s->route_data = data;
}

int flow_flush(flow_source *s)
{
    if (s == NULL)
        return FK_EINVAL;
    if (!FLOW__OWNER_OK(s))
        return FK_EWRONG_THREAD;
    if (s->mc != NULL)
        return 0; /* every multicast tuple leaves at once */
    int rc = 0;
    if (s->desc.opts.kind == FLOW_REPLICATE && s->rfill > 0)
        rc = replicate_seal(s, 0);
    for (uint32_t k = 0; k < s->desc.ntargets; k++) {
        struct flow__starget *st = &s->t[k];
        if (st->state == 1 && st->fill == 0 && st->held) {
            int r = reap(s, (int)k); /* sends the full segments the fabric holds */
            if (r < 0 && rc == 0)
                rc = r;
        }
        if (st->state != 1 || st->fill == 0 || s->desc.opts.kind == FLOW_REPLICATE)
            continue;
        uint8_t *stage = st->stages + (st->sent % st->nseg) * s->geom.seg_stride;
        uint32_t fill = st->fill;
        st->fill = 0;
        int r = send_segment(s, (int)k, stage, fill, 0, 0);
        if (r < 0 && rc == 0)
            rc = r;
    }
    return rc;
}

/* ---- close and open ------------------------------------------------------------------------ */

/* Sends end-of-flow to every live target and waits until each has applied
 * it (the signaled END write completes), so the target sees every tuple. */
static int send_ends(flow_source *s)
{
    int rc = 0;
    if (s->desc.opts.kind == FLOW_REPLICATE) {
        if (s->desc.opts.ordered && s->rfill > 0) {
            /* The last tuples take their numbers first; end-of-flow takes
             * none. Tuples that got no number are never delivered. */
            rc = replicate_seal(s, 0);
            for (uint32_t k = 0; k < s->desc.ntargets; k++)
                s->t[k].fill = 0;
            s->rfill = 0;
        }
        int r = replicate_seal(s, FOOT_END);
        if (rc == 0)
            rc = r;
    } else {
        for (uint32_t k = 0; k < s->desc.ntargets; k++) {
            uint8_t *stage;
            if (s->t[k].state != 1)
                continue;
            int r = stage_for(s, (int)k, &stage);
            if (r == 0)
                r = send_segment(s, (int)k, stage, 0, UINT64_MAX, FOOT_END);
            if (r < 0 && r != FK_ECLOSED && rc == 0)
                rc = r;
        }
    }
    uint64_t deadline = fk_now_ns() + s->timeout_ns;
    for (uint32_t k = 0; k < s->desc.ntargets; k++) {
        struct flow__starget *st = &s->t[k];
        /* Waits only while reaping left completions owed: the wait returns
         * on new input, and the last completion may be the one just reaped
         * (each close of a source paid a whole 10 ms wait per target). */
        while (st->state == 1 && st->signaled > 0 && reap(s, (int)k) == 0 && st->signaled > 0 &&
               fk_now_ns() < deadline)
            fab_conn_wait(st->conn, 10 * FK_NSEC_PER_MSEC);
    }
    return rc;
}

static void source_free(flow_source *s)
{
    for (int k = 0; k < FLOW_TARGETS_MAX; k++) {
        struct flow__starget *st = &s->t[k];
        if (st->conn != NULL)
            fab_conn_close(st->conn);
        if (st->stage_mr != NULL)
            fab_mr_dereg(st->stage_mr);
        free(st->stages);
    }
    if (s->seq_conn != NULL)
        fab_conn_close(s->seq_conn);
    if (s->mc != NULL)
        flow__mc_source_free(s);
    if (s->mr != NULL)
        fab_mr_dereg(s->mr);
    free(s->mem);
    flow__mem_charge(s->node, -(int64_t)s->mem_bytes, s->desc.opts.exempt);
    free(s);
}

int flow_source_close(flow_source *s)
{
    if (s == NULL)
        return FK_EINVAL;
    if (!FLOW__OWNER_OK(s))
        return FK_EWRONG_THREAD;
    int rc = s->mc != NULL ? flow__mc_close(s) : flow_flush(s);
    if (s->mc == NULL) {
        int r = send_ends(s);
        if (rc == 0)
            rc = r;
    }
    source_free(s);
    return rc == FK_ECLOSED ? 0 : rc;
}

/* Per-target segment buffers: nseg * (segment payload + 16) bytes each. */
static int alloc_stages(flow_source *s, int k)
{
    struct flow__starget *st = &s->t[k];
    if (st->stages != NULL && st->stage_nseg == st->nseg)
        return 0;
    if (st->stages != NULL) { /* the target granted a ring of another size */
        uint64_t had = ((uint64_t)st->stage_nseg * s->geom.seg_stride + 63) / 64 * 64;
        fab_mr_dereg(st->stage_mr);
        free(st->stages);
        st->stages = NULL;
        st->stage_mr = NULL;
        flow__mem_charge(s->node, -(int64_t)had, s->desc.opts.exempt);
        s->mem_bytes -= had;
    }
    uint64_t bytes = ((uint64_t)st->nseg * s->geom.seg_stride + 63) / 64 * 64;
    int rc = flow__mem_charge(s->node, (int64_t)bytes, s->desc.opts.exempt);
    if (rc < 0)
        return rc;
    s->mem_bytes += bytes;
    st->stages = aligned_alloc(64, bytes);
    if (st->stages == NULL)
        return FK_ENOMEM;
    memset(st->stages, 0, bytes);
    st->stage_nseg = st->nseg;
    return fab_mr_reg(flow__fab(s->node), st->stages, bytes, &st->stage_mr);
}

static int source_init(flow_source *s)
{
    flow__geom(&s->desc, &s->geom);
    s->geom.nseg = flow__ring_segs(&s->geom, s->want_segs);
    s->geom.ring_bytes = FLOW__CTRL_BYTES + (uint64_t)s->geom.nseg * s->geom.seg_stride;
    /* credits and read buffers, FLOW_TARGETS_MAX of each, 8 bytes each, in one region. */
    uint64_t bytes = 2 * FLOW_TARGETS_MAX * 8;
    int rc = flow__mem_charge(s->node, (int64_t)bytes, s->desc.opts.exempt);
    if (rc < 0)
        return rc;
    s->mem_bytes = bytes;
    s->mem = aligned_alloc(64, bytes);
    if (s->mem == NULL)
        return FK_ENOMEM;
    memset(s->mem, 0, bytes);
    s->credits = (uint64_t *)(void *)s->mem;
    for (int k = 0; k < FLOW_TARGETS_MAX; k++)
        s->t[k].read_buf = s->credits + FLOW_TARGETS_MAX + k;
    rc = fab_mr_reg(flow__fab(s->node), s->mem, bytes, &s->mr);
    if (rc == 0 && s->desc.opts.multicast)
        rc = flow__mc_source_init(s);
    uint64_t deadline = fk_now_ns() + s->timeout_ns;
    for (uint32_t k = 0; rc == 0 && k < s->desc.ntargets; k++) {
        if (s->desc.targets[k][0] == '\0') {
            s->t[k].state = 2;
            continue;
        }
        rc = attach_one(s, (int)k, deadline);
        /* A replicate flow reaches the targets that answer: a replica
         * group serves with f of its members down (NOPaxos section 4: the
         * multicast is unreliable; the missing member recovers later).
         * A joined member (a client of a service's outbound flow) that
         * does not answer is tried again later too, as after a join
         * (ensure_target): a client that joined and went away in the
         * moment between a replica declaring its reply flow and opening
         * it once failed the replica's start ("peer unreachable"). */
        int joined = k >= s->desc.ntargets_declared;
        if (rc < 0 && rc != FK_ENOMEM && (s->desc.opts.kind == FLOW_REPLICATE || joined)) {
            /* Not written off: a lost SYN alone costs TCP a second, and an
             * ordered flow that never reaches the NOPaxos leader has every
             * request of this source turned into a no-op. Pushes try it
             * again (replicate_reattach); a multicast source does not. */
            s->t[k].state = s->desc.opts.multicast ? 2 : 3;
            s->t[k].retry_at = fk_now_ns() + FLOW__REATTACH_NS;
            rc = 0;
        }
    }
    if (rc == 0 && s->desc.opts.kind == FLOW_REPLICATE) {
        uint32_t live = 0;
        for (uint32_t k = 0; k < s->desc.ntargets; k++)
            live += s->t[k].state == 1;
        if (live == 0)
            rc = FK_EUNREACHABLE;
    }
    return rc;
}

uint64_t flow_source_live(const flow_source *s)
{
    _Static_assert(FLOW_TARGETS_MAX <= 64, "a live mask is 64 bits");
    uint64_t live = 0;
    uint32_t n = s->desc.ntargets;
    assert(n <= FLOW_TARGETS_MAX);
    /* The min bounds the loop by the array for the compiler too (UBSan's
     * -Warray-bounds cannot see the descriptor's invariant). */
    for (uint32_t k = 0; k < n && k < FLOW_TARGETS_MAX; k++)
        live |= (uint64_t)(s->t[k].state == 1) << k;
    return live;
}

void flow_source_adopt(flow_source *s)
{
    s->owner = pthread_self();
}

void flow_source_set_timeout(flow_source *s, uint64_t timeout_ns)
{
    s->timeout_ns = timeout_ns ? timeout_ns : FLOW_BLOCK_TIMEOUT_NS;
}

int flow_source_open(flow_node *n, const char *name, int index, uint64_t timeout_ns,
                     flow_source **out)
{
    return flow_source_open_ring(n, name, index, 0, timeout_ns, out);
}

int flow_source_open_ring(flow_node *n, const char *name, int index, uint32_t segments,
                          uint64_t timeout_ns, flow_source **out)
{
    if (n == NULL || name == NULL || out == NULL || strlen(name) >= FLOW_NAME_MAX ||
        (index < 0 && index != FLOW_ANY))
        return FK_EINVAL;
    flow_source *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return FK_ENOMEM;
    int rc = flow__describe(n, name, NULL, &s->desc);
    if (rc == 0 && index >= 0 && (uint32_t)index >= s->desc.nsources)
        rc = FK_EINVAL;
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->node = n;
    s->index = index;
    s->owner = pthread_self();
    s->timeout_ns = timeout_ns ? timeout_ns : FLOW_BLOCK_TIMEOUT_NS;
    s->session = s->desc.seq_session;
    s->want_segs = segments;
    const char *drop = s->desc.opts.ordered ? getenv("FLOWKV_FLOW_DROP_ORDERED") : NULL;
    if (drop != NULL && *drop != '\0') {
        s->drop_p = strtod(drop, NULL);
        s->drop_rng = (fk_now_ns() ^ (uint64_t)(uintptr_t)s) | 1;
        fk_warn("flows", "%s: fault knob: ordered segments dropped with probability %g", name,
                s->drop_p);
    }
    rc = source_init(s);
    if (rc < 0) {
        source_free(s);
        return rc;
    }
    *out = s;
    return 0;
}
