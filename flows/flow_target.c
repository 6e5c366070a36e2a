/*
 * flow_target.c: the target side of flows: opening, joining and closing a
 * target, source slots joining and leaving (elastic membership, the
 * control plane) and consumption dispatched by kind: arrival order over
 * the rings (flow_ring.c), global order (flow_order.c), datagrams
 * (flow_mcast_recv.c), aggregation (flow_combiner.c). Each of those uses
 * flow_ring.c, the leaf, and none calls back here (DFI sections 5.1 to 5.3).
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
        int rc = flow__ring_alloc(t, &t->slots[slot], nseg);
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
        flow__ring_free(t, &t->slots[i]);
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
 * slot, registered); rings come with attaches (flow__ring_alloc; none for
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
