/*
 * flow_target.c: the target side of ring-based flows (shuffle, unicast
 * replicate, combiner): ring hosting, source slots (elastic membership) and
 * consumption in arrival order (DFI sections 5.1 to 5.3).
 *
 * Threads. The owner thread consumes. The fabric's progress thread runs
 * flow__target_attach and flow__target_peer_closed (control plane); they
 * change slot status under t->lock and publish it with release stores, the
 * consumer reads status with acquire loads and takes the lock only to
 * reclaim a slot.
 */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SLOT_ENDED = 3 }; /* a declared source ended: its slot is not reused */

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
static int ring_alloc(flow_target *t, struct flow__slot *s, uint32_t nseg)
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
static void ring_free(flow_target *t, struct flow__slot *s)
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

/* ---- control plane (progress thread) ----------------------------------------------- */

static int pick_slot(flow_target *t, int32_t want)
{
    if (want >= 0) {
        if ((uint32_t)want >= t->desc.nsources)
            return FK_EINVAL;
        uint32_t st = __atomic_load_n(&t->slots[want].status, __ATOMIC_ACQUIRE);
        return st == SLOT_FREE ? want : FK_EBUSY;
    }
    if (want != FLOW_ANY)
        return FK_EINVAL;
    /* Joined sources take slots beyond the declared ones (DESIGN.md:
     * elastic membership; a target pre-sizes max_sources slots). */
    for (uint32_t i = t->desc.nsources; i < t->nslots; i++)
        if (__atomic_load_n(&t->slots[i].status, __ATOMIC_ACQUIRE) == SLOT_FREE)
            return (int)i;
    return FK_EFULL;
}

int flow__target_attach(flow_target *t, uint64_t peer, const struct flow__attach_req *req,
                        struct flow__attach_resp *resp)
{
    pthread_mutex_lock(&t->lock);
    int slot = t->closed ? FK_ECLOSED : pick_slot(t, req->slot);
    /* The source asks for a ring; the target may hold it to less (a
     * client sizing its reply rings: flow_target_join_ring). */
    uint32_t want = req->segments;
    if (t->ring_cap != 0 && (want == 0 || want > t->ring_cap))
        want = t->ring_cap;
    uint32_t nseg = flow__ring_segs(&t->geom, want);
    if (slot >= 0 && !t->desc.opts.multicast) {
        assert(t->slots[slot].ring == NULL); /* freed when its last source ended */
        int rc = ring_alloc(t, &t->slots[slot], nseg);
        if (rc < 0) {
            fk_warn("flows",
                    "flow %s target %d: source from %s refused: limited flow memory %llu of "
                    "%llu bytes",
                    t->desc.name, t->index, req->source_node,
                    (unsigned long long)flow_node_memory_limited(t->node),
                    (unsigned long long)flow_node_mem_limit(t->node));
            slot = rc;
        }
    }
    if (slot >= 0) {
        struct flow__slot *s = &t->slots[slot];
        s->peer_id = peer;
        s->declared = (uint32_t)slot < t->desc.nsources;
        memcpy(s->source_node, req->source_node, FAB_ADDR_MAX);
        s->credit = req->credit;
        memcpy(s->mcast_ep, req->mcast_ep, FAB_ADDR_MAX);
        s->src_id = flow__mc_src_id(s->mcast_ep);
        __atomic_store_n(&s->dead, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&s->status, SLOT_ATTACHED, __ATOMIC_RELEASE);
        memset(resp, 0, sizeof(*resp));
        resp->slot = slot;
        resp->segments = nseg;
        if (s->mr != NULL)
            resp->ring = fab_mr_rkey(s->mr);
        if ((uint32_t)slot >= __atomic_load_n(&t->hi, __ATOMIC_RELAXED))
            __atomic_store_n(&t->hi, (uint32_t)slot + 1, __ATOMIC_RELEASE);
        if (t->mc != NULL)
            snprintf(resp->mcast_ep, FAB_ADDR_MAX, "%s", flow__mc_ep_addr(t));
    }
    pthread_mutex_unlock(&t->lock);
    return slot < 0 ? slot : 0;
}

void flow__target_peer_closed(flow_target *t, uint64_t peer)
{
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < flow__slots_hi(t); i++) {
        struct flow__slot *s = &t->slots[i];
        if (s->peer_id == peer && __atomic_load_n(&s->status, __ATOMIC_ACQUIRE) == SLOT_ATTACHED)
            __atomic_store_n(&s->dead, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->lock);
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
    ring_free(t, s);
    if (t->mc != NULL)
        flow__mc_slot_reset(t, i);
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

int flow_consume(flow_target *t, struct flow_item *item, uint64_t timeout_ns)
{
    if (t == NULL || item == NULL)
        return FK_EINVAL;
    if (!FLOW__OWNER_OK(t))
        return FK_EWRONG_THREAD;
    if (t->closed)
        return FK_ECLOSED;
    if (t->desc.opts.kind == FLOW_COMBINER)
        return FK_EINVAL;
    if (t->mc != NULL)
        return flow__mc_next(t, item, fk_now_ns() + timeout_ns);
    /* The clock is read only when there is nothing yet: on a VM a clock read
     * costs as much as consuming several tuples (perf: vdso clock_gettime
     * was 17% of the bandwidth benchmark when read per consume). */
    if (t->order == NULL && t->run_left > 0)
        return flow__ring_next(t, item); /* a tuple is there: no doorbell read */
    uint64_t deadline = 0;
    for (;;) {
        t->bell = fab_node_doorbell(flow__fab(t->node));
        int rc = t->order == NULL ? flow__ring_next(t, item) : flow__order_next(t, item);
        if (rc != FK_EAGAIN)
            return rc;
        if (deadline == 0)
            deadline = fk_now_ns() + timeout_ns;
        if (flow__wait(t, deadline) < 0)
            return FK_ETIMEDOUT;
    }
}

void flow_target_adopt(flow_target *t)
{
    t->owner = pthread_self();
}

int flow_target_index(const flow_target *t)
{
    return t->index;
}

/* ---- open, join, close ------------------------------------------------------------------- */

static void target_free_mem(flow_target *t)
{
    for (uint32_t i = 0; t->slots != NULL && i < t->nslots; i++)
        ring_free(t, &t->slots[i]);
    if (t->credit_mr != NULL)
        fab_mr_dereg(t->credit_mr);
    free(t->credit_stage);
    free(t->slots);
    flow__mem_charge(t->node, -(int64_t)t->mem_bytes, t->desc.opts.exempt);
    t->credit_mr = NULL;
    t->credit_stage = NULL;
    t->slots = NULL;
    t->mem_bytes = 0;
}

/* Allocates the max_sources slots and the credit staging words (8 bytes a
 * slot, registered); rings come with attaches (ring_alloc; none for
 * multicast, whose tuples arrive as datagrams). */
static int target_alloc(flow_target *t)
{
    flow__geom(&t->desc, &t->geom);
    t->nslots = t->desc.opts.max_sources;
    uint64_t credits = ((uint64_t)t->nslots * 8 + 63) / 64 * 64;
    int rc = flow__mem_charge(t->node, (int64_t)credits, t->desc.opts.exempt);
    if (rc < 0)
        return rc;
    t->mem_bytes = credits;
    t->credit_stage = aligned_alloc(64, credits);
    t->slots = calloc(t->nslots, sizeof *t->slots);
    if (t->credit_stage == NULL || t->slots == NULL) {
        target_free_mem(t);
        return FK_ENOMEM;
    }
    memset(t->credit_stage, 0, credits);
    rc = fab_mr_reg(flow__fab(t->node), t->credit_stage, credits, &t->credit_mr);
    if (rc < 0)
        target_free_mem(t);
    return rc;
}

static void target_destroy(flow_target *t)
{
    for (uint32_t i = 0; t->slots != NULL && i < t->nslots; i++)
        if (t->slots[i].credit_conn != NULL)
            fab_conn_close(t->slots[i].credit_conn);
    if (t->order != NULL)
        flow__order_free(t);
    if (t->mc != NULL)
        flow__mc_target_free(t);
    if (t->comb != NULL)
        flow__comb_free(t);
    target_free_mem(t);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static int target_open(flow_node *n, const char *name, int index, uint32_t ring_cap,
                       flow_target **out)
{
    if (n == NULL || name == NULL || out == NULL || index < 0 || index >= FLOW_TARGETS_MAX)
        return FK_EINVAL;
    flow_target *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return FK_ENOMEM;
    int rc = flow__describe(n, name, NULL, &t->desc);
    if (rc == 0 && ((uint32_t)index >= t->desc.ntargets ||
                    strcmp(t->desc.targets[index], flow_node_addr(n)) != 0))
        rc = FK_EINVAL;
    if (rc < 0) {
        free(t);
        return rc;
    }
    t->node = n;
    t->index = index;
    t->ring_cap = ring_cap; /* before it is hosted: no attach sees it unset */
    t->owner = pthread_self();
    t->release_slot = -1;
    pthread_mutex_init(&t->lock, NULL);
    rc = target_alloc(t);
    if (rc == 0 && t->desc.opts.multicast)
        rc = flow__mc_target_init(t);
    else if (rc == 0 && t->desc.opts.ordered)
        rc = flow__order_init(t);
    if (rc == 0 && t->desc.opts.kind == FLOW_COMBINER)
        rc = flow__comb_init(t);
    if (rc == 0)
        rc = flow__host_target(n, t);
    if (rc < 0) {
        target_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int flow_target_open(flow_node *n, const char *name, int index, flow_target **out)
{
    return target_open(n, name, index, 0, out);
}

/* Asks the home for an index (JOIN_TARGET): the declaration in *d and the
 * index it assigned in *index; returns the answer's length or an error. */
static int ask_join(flow_node *n, const char *name, const char *home, struct flow__desc *d,
                    uint32_t *index)
{
    uint8_t req[sizeof(struct flow__msg_hdr) + FAB_ADDR_MAX] = {0};
    struct flow__msg_hdr h = {.type = FLOW__MSG_JOIN_TARGET};
    snprintf(h.name, sizeof(h.name), "%s", name);
    memcpy(req, &h, sizeof(h));
    snprintf((char *)req + sizeof(h), FAB_ADDR_MAX, "%s", flow_node_addr(n));
    uint8_t resp[sizeof(*d) + sizeof(*index)];
    int rc = flow__call(n, home, req, sizeof(req), resp, sizeof(resp));
    if (rc == (int)sizeof(resp)) {
        memcpy(d, resp, sizeof(*d));
        memcpy(index, resp + sizeof(*d), sizeof(*index));
    }
    return rc;
}

/* Gives index back to the home (best effort, bounded): a join that failed
 * after the home assigned it must not hold the slot. The member is named
 * (its address and joins in d): the home keeps a newer member there. */
static void give_back(flow_node *n, const struct flow__desc *d, int index)
{
    struct flow__leave_req req;
    memset(&req, 0, sizeof(req));
    req.h.type = FLOW__MSG_LEAVE_TARGET;
    req.h.arg = (uint32_t)index;
    snprintf(req.h.name, sizeof(req.h.name), "%s", d->name);
    memcpy(req.addr, d->targets[index], FAB_ADDR_MAX);
    req.joins = d->joins[index];
    struct flow__desc r;
    if (flow__call_within(n, d->home, &req, sizeof(req), &r, sizeof(r), FLOW__LEAVE_TIMEOUT_NS) ==
        (int)sizeof(r))
        flow__store_desc(n, &r);
}

/* A full flow: frees the indices of joined members whose node no longer
 * answers (a client killed without leaving; elastic membership reclaims a
 * dead member's slot). Returns how many were freed. */
static int reap_dead_members(flow_node *n, const struct flow__desc *d)
{
    int freed = 0;
    for (uint32_t i = d->ntargets_declared; i < d->ntargets && i < FLOW_TARGETS_MAX; i++) {
        const char *addr = d->targets[i];
        if (addr[0] == '\0' || strcmp(addr, flow_node_addr(n)) == 0 ||
            flow_node_probe(n, addr, FLOW__PROBE_NS) == 0)
            continue;
        give_back(n, d, (int)i);
        freed++;
    }
    return freed;
}

int flow_target_join(flow_node *n, const char *name, flow_target **out)
{
    return flow_target_join_ring(n, name, 0, out);
}

int flow_target_join_ring(flow_node *n, const char *name, uint32_t segments, flow_target **out)
{
    struct flow__desc d;
    if (n == NULL || name == NULL || out == NULL || strlen(name) >= FLOW_NAME_MAX)
        return FK_EINVAL;
    int rc = flow__describe(n, name, NULL, &d);
    if (rc < 0)
        return rc;
    char home[FAB_ADDR_MAX];
    memcpy(home, d.home, sizeof(home));
    uint32_t assigned = 0;
    rc = ask_join(n, name, home, &d, &assigned);
    if (rc == FK_EFULL && flow__describe(n, name, home, &d) == 0 && reap_dead_members(n, &d) > 0)
        rc = ask_join(n, name, home, &d, &assigned);
    if (rc < 0)
        return rc;
    if (rc != (int)(sizeof(d) + sizeof assigned) || assigned >= d.ntargets ||
        assigned >= FLOW_TARGETS_MAX || strcmp(d.targets[assigned], flow_node_addr(n)) != 0)
        return FK_EPROTO;
    int index = (int)assigned;
    /* The home's answer is the newest declaration (same incarnation, a
     * higher version; or a later one): stored here, it is what
     * flow_target_open reads. Nobody else needs it now: a source learns of
     * a joined target from the home when it first pushes there. */
    rc = flow__store_desc(n, &d);
    if (rc == 0)
        rc = target_open(n, name, index, segments, out);
    if (rc == 0)
        (*out)->joined = 1;
    else
        give_back(n, &d, index);
    return rc;
}

void flow_target_close(flow_target *t)
{
    if (t == NULL)
        return;
    flow__unhost_target(t->node, t); /* no attach reaches it after this */
    pthread_mutex_lock(&t->lock);
    t->closed = 1;
    pthread_mutex_unlock(&t->lock);
    if (t->joined) /* free the index at the home node so a later join can reuse it */
        give_back(t->node, &t->desc, t->index);
    target_destroy(t);
}
