/*
 * flow_ring.c: a target's rings, the leaf the consumers share: a source
 * slot's ring (allocated at attach, charged to the node's memory limit,
 * freed when the slot ends), its segments and footers, the head segment's
 * state and its release (the consumed count a bandwidth-mode source reads,
 * the credit a latency-mode source receives: DFI section 5.3), a slot's
 * end, and consumption in arrival order over the slots (section 5.1).
 * flow_target.c, flow_order.c, flow_mcast_recv.c and flow_combiner.c call
 * into it; it calls none of them (a multicast target resets its per-slot
 * state through the target's slot_reset hook).
 *
 * Threads: as flow_target.c says: the consumer thread, with t->lock for
 * slot transitions.
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

uint8_t *flow__seg(const flow_target *t, uint32_t slot, uint64_t segno)
{
    const struct flow__slot *s = &t->slots[slot];
    return s->ring + FLOW__CTRL_BYTES + (segno % s->nseg) * t->geom.seg_stride;
}

struct flow__footer *flow__footer_of(const flow_target *t, uint8_t *seg)
{
    return (struct flow__footer *)(void *)(seg + t->geom.seg_payload);
}

static uint64_t *consumed_word(const flow_target *t, uint32_t slot)
{
    return (uint64_t *)(void *)t->slots[slot].ring;
}

/* The slot's ring: nseg segments, charged to the node's memory limit
 * (control plane, under t->lock). */
int flow__ring_alloc(flow_target *t, struct flow__slot *s, uint32_t nseg)
{
    uint64_t bytes = (FLOW__CTRL_BYTES + (uint64_t)nseg * t->geom.seg_stride + 63) / 64 * 64;
    int rc = flow__mem_charge(t->node, (int64_t)bytes, t->desc.opts.exempt);
    if (rc < 0)
        return rc;
    s->ring = aligned_alloc(64, bytes);
    if (s->ring != NULL) {
        memset(s->ring, 0, bytes);
        rc = fab_mr_reg(flow__fab(t->node), s->ring, bytes, &s->mr);
    }
    if (s->ring == NULL || rc < 0) {
        free(s->ring);
        s->ring = NULL;
        flow__mem_charge(t->node, -(int64_t)bytes, t->desc.opts.exempt);
        return FK_ENOMEM;
    }
    s->ring_bytes = bytes;
    s->nseg = nseg;
    return 0;
}

/* After fab_mr_dereg no remote write reaches the memory (fab.h). */
void flow__ring_free(flow_target *t, struct flow__slot *s)
{
    if (s->ring == NULL)
        return;
    fab_mr_dereg(s->mr);
    free(s->ring);
    flow__mem_charge(t->node, -(int64_t)s->ring_bytes, t->desc.opts.exempt);
    s->ring = NULL;
    s->mr = NULL;
    s->ring_bytes = 0;
}

/* ---- consumer side --------------------------------------------------------------------- */

/* Latency mode: tells the source how far we consumed once a quarter of the
 * ring is free again (DFI section 5.3: credits refreshed at a threshold). */
static void send_credit(flow_target *t, uint32_t i)
{
    struct flow__slot *s = &t->slots[i];
    uint32_t threshold = s->nseg / 4 ? s->nseg / 4 : 1;
    if (t->desc.opts.mode != FLOW_LATENCY || s->head - s->credit_sent < threshold ||
        s->credit.len == 0)
        return;
    if (s->credit_conn == NULL &&
        fab_connect(flow__fab(t->node), s->source_node, FLOW__CALL_TIMEOUT_NS, &s->credit_conn) < 0)
        return; /* the source is gone; its slot ends through the close notification */
    t->credit_stage[i] = s->head;
    if (fab_post_write(s->credit_conn, t->credit_mr, &t->credit_stage[i], 8, s->credit.addr,
                       s->credit.key, i, 0) == 0)
        s->credit_sent = s->head;
}

/* Releases the head segment of slot i: clear its footer, then publish the
 * consumed count the source reads (bandwidth) or receives (latency). */
void flow__release_head(flow_target *t, uint32_t i)
{
    struct flow__slot *s = &t->slots[i];
    struct flow__footer *f = flow__footer_of(t, flow__seg(t, i, s->head));
    __atomic_store_n(&f->state, 0, __ATOMIC_RELAXED);
    s->head++;
    s->pos = 0;
    fab_store64(consumed_word(t, i), s->head);
    send_credit(t, i);
}

/* A source ended (end-of-flow, or its connection died): a joined source's
 * slot is wiped and freed for the next join; a declared one stays ended. */
void flow__end_slot(flow_target *t, uint32_t i)
{
    struct flow__slot *s = &t->slots[i];
    pthread_mutex_lock(&t->lock);
    if (s->credit_conn != NULL)
        fab_conn_close(s->credit_conn);
    s->credit_conn = NULL;
    if (s->declared)
        t->declared_ended++;
    flow__ring_free(t, s);
    if (t->slot_reset != NULL) /* multicast: its per-source state (flow_mcast_recv.c) */
        t->slot_reset(t, i);
    s->head = 0;
    s->pos = 0;
    s->credit_sent = 0;
    t->run_left = 0;
    s->peer_id = 0;
    __atomic_store_n(&s->dead, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&s->status, s->declared ? SLOT_ENDED : SLOT_FREE, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&t->lock);
    fk_debug("flows", "flow %s target %d: source slot %u ended", t->desc.name, t->index, i);
}

/* Whether every source is done: all declared sources ended and no joined
 * source attached. A flow declared with no sources is a service flow that
 * never ends. */
int flow__all_ended(flow_target *t)
{
    if (t->desc.nsources == 0 || t->declared_ended < t->desc.nsources)
        return 0;
    for (uint32_t i = 0; i < flow__slots_hi(t); i++)
        if (__atomic_load_n(&t->slots[i].status, __ATOMIC_ACQUIRE) == SLOT_ATTACHED)
            return 0;
    return 1;
}

/* Inspects slot i's head. Returns 1 with *state when a segment is there,
 * 0 when empty; ends the slot when its source is finished. */
int flow__head_state(flow_target *t, uint32_t i, uint64_t *state)
{
    struct flow__slot *s = &t->slots[i];
    if (__atomic_load_n(&s->status, __ATOMIC_ACQUIRE) != SLOT_ATTACHED)
        return 0;
    uint32_t dead = __atomic_load_n(&s->dead, __ATOMIC_ACQUIRE);
    struct flow__footer *f = flow__footer_of(t, flow__seg(t, i, s->head));
    uint64_t st = fab_load64(&f->state);
    if (st & FOOT_CONSUMABLE) {
        if ((st & FOOT_END) && s->pos >= FOOT_COUNT(st)) {
            flow__end_slot(t, i);
            return 0;
        }
        *state = st;
        return 1;
    }
    if (dead) /* everything it wrote was applied before the close */
        flow__end_slot(t, i);
    return 0;
}

/* Hands out the tuple at slot i's read position in the head segment whose
 * footer state is st, and decides where the next call starts. */
static void take_tuple(flow_target *t, uint32_t i, uint64_t st, struct flow_item *item)
{
    struct flow__slot *s = &t->slots[i];
    uint8_t *seg = flow__seg(t, i, s->head);
    assert(s->pos < FOOT_COUNT(st));
    item->tuple = seg + (uint64_t)s->pos * t->desc.schema.tuple_size;
    item->seq = flow__footer_of(t, seg)->seq;
    item->session = FOOT_SESSION(st);
    item->source = (int)i;
    s->pos++;
    /* Stay on this slot while its segment lasts (batching), then move on
     * so every source is served (fairness). */
    t->run_left = FOOT_COUNT(st) - s->pos;
    t->run_state = st;
    if (s->pos >= FOOT_COUNT(st) && !(st & FOOT_END)) {
        t->release_slot = (int)i;
        t->cursor = i + 1;
    } else {
        t->cursor = i;
    }
}

int flow__ring_next(flow_target *t, struct flow_item *item)
{
    if (t->release_slot >= 0) {
        flow__release_head(t, (uint32_t)t->release_slot);
        t->release_slot = -1;
    }
    /* Within a segment already seen consumable, the next tuple needs no new
     * look at the slot or footer: only this thread ends a slot or clears a
     * footer, so both stay as they were (bandwidth mode: perf showed the
     * per-tuple footer checks at 8% of the consumer's time). */
    if (t->run_left > 0) {
        take_tuple(t, t->cursor, t->run_state, item);
        return 0;
    }
    uint32_t hi = flow__slots_hi(t);
    for (uint32_t k = 0; k < hi; k++) {
        uint32_t i = (t->cursor + k) % hi;
        uint64_t st;
        if (!flow__head_state(t, i, &st))
            continue;
        if (t->slots[i].pos >= FOOT_COUNT(st)) { /* an empty segment (flush of nothing) */
            flow__release_head(t, i);
            continue;
        }
        take_tuple(t, i, st, item);
        return 0;
    }
    return flow__all_ended(t) ? FK_EEND : FK_EAGAIN;
}

/* Waits for remote writes (adaptive: the fabric spins, then blocks) in
 * slices of 10 ms, so a dead source's close notification is noticed. */
int flow__wait(flow_target *t, uint64_t deadline)
{
    uint64_t now = fk_now_ns();
    if (now >= deadline)
        return FK_ETIMEDOUT;
    uint64_t slice = deadline - now;
    if (slice > 10 * FK_NSEC_PER_MSEC)
        slice = 10 * FK_NSEC_PER_MSEC;
    fab_node_wait(flow__fab(t->node), t->bell, slice);
    return 0;
}
