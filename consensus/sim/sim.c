/* sim.c: the simulated world: events, network, disks, crashes, clients,
 * checks (see sim.h). */
#include "sim.h"

#include "sim_internal.h"

#include "cons_wire.h"
#include "fk_error.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t sim__rnd(struct world *w)
{
    uint64_t z = (w->rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t sim__urange(struct world *w, uint64_t lo, uint64_t hi)
{
    return lo + sim__rnd(w) % (hi - lo + 1);
}

double sim__ufrac(struct world *w)
{
    return (double)(sim__rnd(w) >> 11) / 9007199254740992.0;
}

void sim__fail(struct world *w, const char *fmt, ...)
{
    if (w->failed)
        return;
    w->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(w->res->why, sizeof w->res->why, "t=%" PRIu64 "ms: ", w->now / MS);
    vsnprintf(w->res->why + k, sizeof w->res->why - (size_t)k, fmt, ap);
    va_end(ap);
}

void sim__say(struct world *w, int level, const char *fmt, ...)
{
    if (w->o->verbose < level)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("[%8.3f ms] ", (double)w->now / MS);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* ---- the event heap, ordered by (t, seq) ------------------------------- */

static int ev_less(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void push(struct world *w, struct ev e)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? 2 * w->heap_cap : 1024;
        struct ev *h = realloc(w->heap, cap * sizeof *h);
        if (!h)
            abort(); /* the simulator is a test tool; out of memory ends it */
        w->heap = h;
        w->heap_cap = cap;
    }
    e.seq = w->seq++;
    size_t i = w->heap_n++;
    while (i > 0 && ev_less(&e, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = e;
}

static struct ev pop(struct world *w)
{
    struct ev top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->heap_n)
            break;
        if (c + 1 < w->heap_n && ev_less(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!ev_less(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->heap_n)
        w->heap[i] = last;
    return top;
}

void sim__at(struct world *w, uint64_t dt, uint8_t kind, uint32_t who, uint32_t inc, uint64_t arg,
             struct smsg *m)
{
    push(w,
         (struct ev){.t = w->now + dt, .kind = kind, .who = who, .inc = inc, .arg = arg, .m = m});
}

/* ---- network ----------------------------------------------------------- */

static int cut(const struct world *w, struct cons_addr a, struct cons_addr b)
{
    return w->partitioned && a.kind == CONS_ADDR_REPLICA && b.kind == CONS_ADDR_REPLICA &&
           w->reps[a.id].side != w->reps[b.id].side;
}

int sim__cut(const struct world *w, uint32_t a, uint32_t b)
{
    return cut(w, cons_replica(a), cons_replica(b));
}

static void net_send(struct world *w, struct cons_addr from, struct cons_addr to,
                     const uint8_t *buf, uint32_t len)
{
    w->res->msgs++;
    if (cut(w, from, to) || sim__ufrac(w) < w->drop_p) {
        w->res->dropped++;
        return;
    }
    int copies = sim__ufrac(w) < w->dup_p ? 2 : 1;
    w->res->duplicated += (uint64_t)(copies - 1);
    for (int c = 0; c < copies; c++)
        sim__at(w, sim__urange(w, 50000, w->delay_max), EV_MSG, 0, 0, 0,
                sim__msg(from, to, buf, len));
}

struct smsg *sim__msg(struct cons_addr from, struct cons_addr to, const uint8_t *buf, uint32_t len)
{
    struct smsg *m = malloc(sizeof *m + len);
    if (!m)
        abort(); /* the simulator is a test tool; out of memory ends it */
    m->from = from;
    m->to = to;
    m->len = len;
    memcpy(m->data, buf, len);
    return m;
}

/* ---- replicas: outbox, checks, disk ------------------------------------ */

static struct cons_core_status status_of(const struct world *w, uint32_t i)
{
    struct cons_core_status st;
    w->reps[i].core.ops->status(w->reps[i].core.impl, &st);
    return st;
}

/* The commit point to check; a recovering replica has none yet. */
static uint64_t commit_of(struct world *w, uint32_t i)
{
    struct cons_core_status st = status_of(w, i);
    return st.role == CONS_ROLE_RECOVERING ? 0 : st.commit;
}

/* Safety across replicas: a slot chosen (Multi-Paxos) or committed
 * (NOPaxos) anywhere holds the same operations everywhere, forever. */
static void check_chosen(struct world *w, uint32_t i)
{
    uint64_t commit = commit_of(w, i);
    for (uint64_t idx = w->reps[i].checked + 1; idx <= commit; idx++) {
        uint64_t h;
        int have = w->reps[i].core.ops->committed_hash(w->reps[i].core.impl, idx, &h);
        if (!have)
            continue;
        if (idx >= w->chosen_cap) {
            size_t cap = w->chosen_cap ? w->chosen_cap : 1024;
            while (cap <= idx)
                cap *= 2;
            uint64_t *c = realloc(w->chosen, cap * sizeof *c);
            if (!c)
                abort();
            memset(c + w->chosen_cap, 0, (cap - w->chosen_cap) * sizeof *c);
            w->chosen = c;
            w->chosen_cap = cap;
        }
        if (w->chosen[idx] == 0)
            w->chosen[idx] = h;
        else if (w->chosen[idx] != h)
            sim__fail(w, "safety: replica %u chose a different value for slot %" PRIu64, i, idx);
    }
    if (commit > w->reps[i].checked)
        w->reps[i].checked = commit;
}

static void blob_set(struct blob *b, const uint8_t *buf, uint32_t len, uint64_t index);
static void blob_clear(struct blob *b);

/* Bytes of the simulator's largest state stream. */
#define SIM_SM_IMAGE_MAX                                                                           \
    (CONS_SNAP_BYTES(SIM_CLIENTS_MAX, SIM_KEYS_MAX,                                                \
                     (size_t)SIM_KEYS_MAX * (CONS_KEY_MAX + KV_MEM_VAL_MAX)) +                     \
     CONS_SNAP_RECORD_MAX)

/* The most a core's stash holds here: a NOPaxos leader's undo records,
 * one per slot of its log ring at most. */
#define SIM_STASH_MAX (4u << 20)

/* After a step of a core whose state lives in its machine: if the machine
 * changed, its image joins the queued disk work (the server writes the
 * machine's changes in the batch's transaction). */
static void queue_sm_image(struct world *w, struct rep *r)
{
    if (kv_mem_version(r->kv) == r->sm_version)
        return;
    size_t len;
    struct cons_sm sm = kv_mem_sm(r->kv);
    /* The stream, then the core's stash (which the stream leaves out):
     * u32 stream length first. */
    size_t slen;
    if (cons_sm_save(&sm, w->sm_img + 4, SIM_SM_IMAGE_MAX, &len) < 0 ||
        kv_mem_stash_save(r->kv, w->sm_img + 4 + len, SIM_STASH_MAX, &slen) < 0)
        abort(); /* sized for the simulator's largest state */
    uint32_t l32 = (uint32_t)len;
    memcpy(w->sm_img, &l32, 4);
    blob_set(&r->sm_queued, w->sm_img, (uint32_t)(4 + len + slen), 0);
    r->sm_version = kv_mem_version(r->kv);
}

void sim__take_outbox(struct world *w, uint32_t i, const struct cons_outbox *ob)
{
    struct rep *r = &w->reps[i];
    for (uint32_t k = 0; k < ob->nmsgs; k++) {
        const struct cons_out_msg *m = &ob->msgs[k];
        if (m->to.kind != CONS_ADDR_PEERS) {
            net_send(w, cons_replica(i), m->to, m->buf, m->len);
            continue;
        }
        /* The sender's replicate flow: a copy per replica, each dropped,
         * duplicated or delayed on its own. */
        for (uint32_t j = 0; j < w->n; j++) {
            if (j != i)
                net_send(w, cons_replica(i), cons_replica(j), m->buf, m->len);
        }
    }
    for (uint32_t k = 0; k < ob->npersists; k++) {
        const struct cons_persist *p = &ob->persists[k];
        if (r->pq_n == r->pq_cap) {
            r->pq_cap = r->pq_cap ? 2 * r->pq_cap : 64;
            r->pq = realloc(r->pq, r->pq_cap * sizeof *r->pq);
            if (!r->pq)
                abort();
        }
        struct prec *q = &r->pq[r->pq_n++];
        q->kind = p->kind;
        q->cookie = p->cookie;
        q->index = p->index;
        q->len = p->len;
        q->buf = malloc(p->len ? p->len : 1);
        if (!q->buf)
            abort();
        memcpy(q->buf, p->buf, p->len);
    }
    queue_sm_image(w, r);
    if ((r->pq_n || r->sm_queued.buf) && !r->disk_busy) {
        r->disk_busy = 1;
        sim__at(w, sim__urange(w, 50000, w->disk_max), EV_DISK, i, r->inc, 0, NULL);
    }
}

/* Every input to a core goes through here: step, outbox, invariants. */
static void feed(struct world *w, uint32_t i, const struct cons_input *in)
{
    struct cons_outbox *ob;
    struct cons_core *core = &w->reps[i].core;
    int rc = core->ops->step(core->impl, in, w->now, &ob);
    w->res->steps++;
    if (rc < 0) {
        sim__fail(w, "replica %u: step failed: %s", i, fk_err_name(rc));
        return;
    }
    /* Sealed after every step, before its image is queued for the disk:
     * a crash may come at any moment. */
    if (core->ops->seal && (rc = core->ops->seal(core->impl)) < 0) {
        sim__fail(w, "replica %u: seal failed: %s", i, fk_err_name(rc));
        return;
    }
    sim__take_outbox(w, i, ob);
    core->ops->invariants(core->impl);
    check_chosen(w, i);
}

static void blob_set(struct blob *b, const uint8_t *buf, uint32_t len, uint64_t index)
{
    free(b->buf);
    b->buf = malloc(len ? len : 1);
    if (!b->buf)
        abort();
    memcpy(b->buf, buf, len);
    b->len = len;
    b->index = index;
}

static void blob_clear(struct blob *b)
{
    free(b->buf);
    memset(b, 0, sizeof *b);
}

static void disk_apply(struct rep *r, const struct prec *q)
{
    switch (q->kind) {
    case CONS_PERSIST_META:
        blob_set(&r->meta, q->buf, q->len, 0);
        break;
    case CONS_PERSIST_ENTRY:
        blob_set(&r->ents[q->index % SIM_DISK_SLOTS], q->buf, q->len, q->index);
        break;
    case CONS_PERSIST_SNAPSHOT:
        blob_set(&r->snap, q->buf, q->len, q->index);
        for (int k = 0; k < SIM_DISK_SLOTS; k++) {
            if (r->ents[k].buf && r->ents[k].index <= q->index)
                blob_clear(&r->ents[k]);
        }
        break;
    default:
        abort();
    }
}

static void pq_clear(struct rep *r)
{
    for (size_t k = 0; k < r->pq_n; k++)
        free(r->pq[k].buf);
    r->pq_n = 0;
}

/* The disk finishes everything queued, in order, then says so. */
static void on_disk(struct world *w, uint32_t i)
{
    struct rep *r = &w->reps[i];
    r->disk_busy = 0;
    if (r->sm_queued.buf) {
        blob_clear(&r->sm_disk);
        r->sm_disk = r->sm_queued;
        memset(&r->sm_queued, 0, sizeof r->sm_queued);
    }
    if (!r->pq_n)
        return;
    for (size_t k = 0; k < r->pq_n; k++)
        disk_apply(r, &r->pq[k]);
    struct cons_input in = {.kind = CONS_IN_PERSISTED, .cookie = r->pq[r->pq_n - 1].cookie};
    pq_clear(r);
    feed(w, i, &in);
}

/* ---- crash and restart ---------------------------------------------------- */

/* A small log ring (SIM_LOG_CAP, SIM_NOP_LOG_CAP) so compaction, state
 * transfer and the NOPaxos leader's pause happen often. */
static void rep_config(struct world *w, uint32_t i, struct cons_core_config *c)
{
    memset(c, 0, sizeof *c);
    c->n = w->n;
    c->id = i;
    c->clients_max = SIM_CLIENTS_MAX;
    c->heartbeat_ns = 20 * MS;
    c->election_ns = 100 * MS;
    /* Chunks of a few records (cons_sm_ops.snap_read sends at least
     * one), so every transfer takes many of them. */
    c->xfer_chunk = 48;
    c->xfer_window = 1 + (uint32_t)(w->o->seed % 3);
    /* A history of a few to a few dozen entries: catch-up after compaction
     * goes through it or, past it, through a transfer. */
    c->history_bytes = (size_t)512 << (w->o->seed / 3 % 4);
    /* Room for three to twelve large values in a leader's log (a CAS of
     * two takes 10 KB): leaders wait for compaction to make room. */
    c->big_bytes = (size_t)16384 << (w->o->seed / 12 % 3);
    c->seed = w->o->seed * 1000003u + (uint64_t)i * 7919u + w->reps[i].inc;
    c->bugs = w->o->bugs;
    if (w->o->proto == SIM_NOP) {
        c->log_cap = SIM_NOP_LOG_CAP;
        c->durable = w->o->durable ? 1 : 0;
        return;
    }
    c->log_cap = SIM_LOG_CAP;
    c->members = w->o->reconfig ? 0x7 : 0; /* reconfig: replicas 3 and 4 start as learners */
    c->window = 8;
    c->batch_max = 4;
    c->pending_max = 64;
    c->arena_bytes = 256u << 10;
    c->tick_ns = SIM_TICK_NS;
}

static void wipe_disk(struct rep *r)
{
    blob_clear(&r->meta);
    blob_clear(&r->snap);
    blob_clear(&r->sm_disk);
    for (int k = 0; k < SIM_DISK_SLOTS; k++)
        blob_clear(&r->ents[k]);
}

/* Restores replica i's core from its disk (cons_core.h order: META,
 * SNAPSHOT, entries). Returns 0 or the first error. */
static int restore(struct rep *r)
{
    const struct cons_core_ops *ops = r->core.ops;
    int rc = ops->restore_meta(r->core.impl, r->meta.buf, r->meta.len);
    if (rc == 0 && r->snap.buf)
        rc = ops->restore_snapshot(r->core.impl, r->snap.buf, r->snap.len);
    for (int k = 0; k < SIM_DISK_SLOTS && rc == 0; k++) {
        if (r->ents[k].buf && r->ents[k].index > r->snap.index)
            rc = ops->restore_entry(r->core.impl, r->ents[k].buf, r->ents[k].len);
    }
    return rc;
}

/* Boots replica i: FRESH at time 0, else from its disk (RESTORED) or, with
 * no complete state on disk, EMPTY (recovery). */
static void boot(struct world *w, uint32_t i, enum cons_start_mode mode)
{
    struct rep *r = &w->reps[i];
    struct cons_core_config cfg;
    if (mode == CONS_START_RESTORED && !r->meta.buf)
        mode = CONS_START_EMPTY;
    if (mode == CONS_START_EMPTY)
        wipe_disk(r);
    rep_config(w, i, &cfg);
    r->kv = kv_mem_create(SIM_KEYS_MAX);
    if (!r->kv)
        abort();
    struct cons_sm sm = kv_mem_sm(r->kv);
    if (mode == CONS_START_RESTORED && r->sm_disk.buf) {
        uint32_t l32;
        memcpy(&l32, r->sm_disk.buf, 4);
        if (cons_sm_restore(&sm, r->sm_disk.buf + 4, l32) < 0 ||
            kv_mem_stash_restore(r->kv, r->sm_disk.buf + 4 + l32, r->sm_disk.len - 4 - l32) < 0)
            sim__fail(w, "replica %u: its state machine image does not install", i);
    }
    r->sm_version = kv_mem_version(r->kv);
    if (cons_core_create(&r->core, w->ops, &cfg, sm) < 0)
        abort(); /* out of memory or a bad constant: the run cannot go on */
    if (mode == CONS_START_RESTORED) {
        int rc = restore(r);
        if (rc < 0)
            sim__fail(w, "replica %u: restore failed: %s", i, fk_err_name(rc));
    }
    struct cons_outbox *ob;
    int rc = r->core.ops->start(r->core.impl, mode, w->now, &ob);
    if (rc < 0)
        sim__fail(w, "replica %u: start failed: %s", i, fk_err_name(rc));
    r->up = 1;
    r->checked = 0;
    if (w->o->proto == SIM_NOP && mode != CONS_START_FRESH)
        sim__nop_seq_boot(w, i);
    sim__take_outbox(w, i, ob);
    sim__at(w, sim__urange(w, 1, SIM_TICK_NS), EV_TICK, i, r->inc, 0, NULL);
}

/* Adds an incarnation's transfer counters to the run's. */
static void count_xfers(struct world *w, uint32_t i, int crashed)
{
    struct cons_xfer_stats x = status_of(w, i).xfer;
    struct sim_result *res = w->res;
    res->xfers += x.completed;
    res->xfers_multi += x.multi;
    res->xfer_chunks += x.chunks_in;
    res->xfer_switches += x.switched;
    res->xfer_resent += x.resent;
    res->xfer_recv_crashes += crashed && x.receiving;
    res->xfer_send_crashes += crashed && x.sending;
    res->past_syncs += status_of(w, i).syncs[NOP_SYNC_KIND_PAST];
}

static void crash(struct world *w, uint32_t i)
{
    struct rep *r = &w->reps[i];
    count_xfers(w, i, !w->tearing_down);
    if (w->o->proto == SIM_NOP)
        sim__nop_seq_crash(w, i);
    cons_core_destroy(&r->core);
    kv_mem_destroy(r->kv);
    r->kv = NULL;
    r->up = 0;
    r->disk_busy = 0;
    r->inc++; /* stale ticks, disk completions and messages are ignored */
    pq_clear(r);
    blob_clear(&r->sm_queued);
}

/* Replicas without a whole copy of the data: down, recovering, or still
 * waiting for a state (cons_xfer.h; a replica that lost its disk has its
 * log back once it recovered, but its data only once the transfer is in,
 * and a NOPaxos replica behind its ring waits in any status, a view
 * change included, where no transfer runs). A crash is scheduled only
 * while fewer than f are: a replica whose disk dies while the only other
 * copy of the data is still on its way took f + 1 copies (durable seed
 * 124855577584248: two empty restarts, the second while the first had
 * its log but not yet a state). */
static uint32_t down_count(struct world *w)
{
    uint32_t d = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->reps[i].up && w->reps[i].inc == 0)
            continue; /* reconfig: a learner not started yet */
        if (!w->reps[i].up) {
            d++;
            continue;
        }
        struct cons_core_status st = status_of(w, i);
        d += st.role == CONS_ROLE_RECOVERING || st.xfer.receiving || st.stateless;
    }
    return d;
}

/* ---- faults ----------------------------------------------------------------- */

/* A stop by SIGTERM rather than kill -9: the server hands leadership over
 * first (cons_core_ops.transfer), and what that sends is on the network
 * when the process ends. */
static void stop_gracefully(struct world *w, uint32_t i)
{
    struct rep *r = &w->reps[i];
    struct cons_outbox *ob;
    if (w->o->proto == SIM_NOP)
        sim__nop_seq_handoff(w, i);
    if (r->core.ops->transfer == NULL || r->core.ops->transfer(r->core.impl, w->now, &ob) < 0)
        return;
    w->res->handovers += ob->nmsgs > 0;
    if (ob->nmsgs > 0)
        sim__say(w, 1, "replica %u stops gracefully: it hands leadership over", i);
    sim__take_outbox(w, i, ob);
}

/* Durable NOPaxos: every replica that is up crashes at once (losing the
 * persists its disk had not completed) and restarts from its disk later;
 * replicas already down keep their pending restart. Replicas without a
 * log (restarting or recovering empty) stay at most f: this fault adds
 * none, so f+1 restored replicas can always change view (nop_durable.c). */
static void crash_all(struct world *w)
{
    sim__say(w, 1, "fault: crash every replica (restart with disk)");
    w->res->crash_alls++;
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->reps[i].up)
            continue;
        crash(w, i);
        w->res->crashes++;
        sim__at(w, sim__urange(w, 30 * MS, 600 * MS), EV_RESTART, i, w->reps[i].inc,
                CONS_START_RESTORED, NULL);
    }
}

static int is_leader(struct world *w, uint32_t i)
{
    return w->reps[i].up && status_of(w, i).role == CONS_ROLE_LEADER;
}

static void set_sides(struct world *w, uint32_t a, uint32_t b)
{
    for (uint32_t i = 0; i < w->n; i++)
        w->reps[i].side = i == a || i == b;
    w->partitioned = 1;
    w->res->partitions++;
    sim__say(w, 1, "fault: partition {%u,%u} from the rest", a, b);
}

/* Amnesia in the minority, a compound fault (a switch cuts the leader and
 * one follower off, then that follower's disk dies): the leader L and a
 * follower A are cut off together, so A votes for slots L cannot choose
 * yet; A loses its disk and restarts at once on the majority side, where
 * it recovers; later L is joined by another replica B that never saw those
 * slots. A recovery that forgets A's earlier votes lets L choose with
 * them while the majority moves on without (mpx_recover.c, seed 66913).
 * Steps: 0 cut {L, A}; 1 crash A empty; 2 cut {L, B}. */
static void amnesia_step(struct world *w, uint32_t step)
{
    if (step == 0) {
        uint32_t l = (uint32_t)(sim__rnd(w) % w->n), a;
        for (uint32_t k = 0; k < w->n && !is_leader(w, l); k++)
            l = (l + 1) % w->n;
        if (!is_leader(w, l) || down_count(w) > 0)
            return;
        do
            a = (uint32_t)(sim__rnd(w) % w->n);
        while (a == l);
        w->am_leader = l;
        w->am_victim = a;
        set_sides(w, l, a);
        sim__at(w, sim__urange(w, 5 * MS, 40 * MS), EV_AMNESIA, a, w->reps[a].inc, 1, NULL);
    } else if (step == 1) {
        uint32_t a = w->am_victim;
        if (!w->reps[a].up || down_count(w) >= w->f)
            return;
        sim__say(w, 1, "fault: crash replica %u (restart empty, on the other side)", a);
        crash(w, a);
        w->reps[a].side = 0;
        w->res->crashes++;
        w->res->empty_restarts++;
        w->res->amnesias++;
        sim__at(w, sim__urange(w, 1 * MS, 20 * MS), EV_RESTART, a, w->reps[a].inc, CONS_START_EMPTY,
                NULL);
        sim__at(w, sim__urange(w, 100 * MS, 400 * MS), EV_AMNESIA, a, 0, 2, NULL);
    } else {
        uint32_t b;
        do
            b = (uint32_t)(sim__rnd(w) % w->n);
        while (b == w->am_leader || b == w->am_victim);
        set_sides(w, w->am_leader, b);
    }
}

static void on_fault(struct world *w)
{
    uint64_t dice = sim__rnd(w) % 100;
    if (dice < 30) {
        uint32_t mask;
        do
            mask = (uint32_t)sim__rnd(w) & ((1u << w->n) - 1);
        while (mask == 0 || mask == (1u << w->n) - 1);
        for (uint32_t i = 0; i < w->n; i++)
            w->reps[i].side = mask >> i & 1;
        w->partitioned = 1;
        w->res->partitions++;
        sim__say(w, 1, "fault: partition mask %#x", mask);
    } else if (dice < 40 && w->o->proto == SIM_NOP) {
        /* The sequencer's host: crashed (its replicas find it refused) or
         * cut off alone (silent), so that the failover decision runs. */
        uint32_t h = sim__nop_seq_host(w);
        if (h != SEQCTL_NONE && w->reps[h].up && sim__rnd(w) % 2 == 0 && down_count(w) < w->f) {
            sim__say(w, 1, "fault: crash the sequencer's host, replica %u (restart with disk)", h);
            crash(w, h);
            w->res->crashes++;
            sim__at(w, sim__urange(w, 300 * MS, 2000 * MS), EV_RESTART, h, w->reps[h].inc,
                    CONS_START_RESTORED, NULL);
        } else if (h != SEQCTL_NONE) {
            for (uint32_t i = 0; i < w->n; i++)
                w->reps[i].side = i == h;
            w->partitioned = 1;
            w->res->partitions++;
            sim__say(w, 1, "fault: the sequencer's host, replica %u, cut off alone", h);
        }
    } else if (dice < 50) {
        w->partitioned = 0;
        sim__say(w, 1, "fault: partition healed");
    } else if (dice < 80 && down_count(w) < w->f) {
        uint32_t i = (uint32_t)(sim__rnd(w) % w->n);
        if (w->reps[i].up) {
            int empty = sim__rnd(w) % 100 < 35;
            sim__say(w, 1, "fault: crash replica %u (restart %s)", i,
                     empty ? "empty" : "with disk");
            if (sim__rnd(w) % 3 == 0)
                stop_gracefully(w, i);
            crash(w, i);
            w->res->crashes++;
            w->res->empty_restarts += (uint64_t)empty;
            sim__at(w, sim__urange(w, 30 * MS, 600 * MS), EV_RESTART, i, w->reps[i].inc,
                    empty ? CONS_START_EMPTY : CONS_START_RESTORED, NULL);
        }
    } else if (dice < 88 && w->o->durable && w->o->proto == SIM_NOP) {
        crash_all(w);
    } else if (dice >= 88 && dice < 94 && w->n >= 5) {
        amnesia_step(w, 0);
    }
    if (w->now < w->fault_end)
        sim__at(w, sim__urange(w, 20 * MS, 300 * MS), EV_FAULT, 0, 0, 0, NULL);
}

static void on_heal(struct world *w)
{
    sim__say(w, 1, "heal: network clean, every replica up");
    w->healed = 1;
    w->partitioned = 0;
    w->drop_p = 0;
    w->dup_p = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->reps[i].up) {
            /* reconfig: a learner not started yet joins fresh */
            enum cons_start_mode mode =
                w->reps[i].inc == 0 ? CONS_START_FRESH : CONS_START_RESTORED;
            w->reps[i].inc++;
            boot(w, i, mode);
        }
    }
}

/* ---- clients ------------------------------------------------------------------ */

/* Writes key k ("kNN", 3 bytes) at dst. */
static uint32_t key_bytes(uint32_t k, uint8_t *dst)
{
    char tmp[16];
    assert(k < 100);
    snprintf(tmp, sizeof tmp, "k%02u", k);
    memcpy(dst, tmp, 3);
    return 3;
}

/* Whether token's value is padded to SIM_VAL_MAX: a function of the
 * token, so a CAS expecting a value rebuilds its exact bytes. */
static int token_big(const struct world *w, uint64_t token)
{
    return w->o->proto != SIM_NOP && (token & 7) == 5; /* NOPaxos: NOP_OP_MAX */
}

/* Writes token's value at dst; returns its length. */
static uint32_t put_token(const struct world *w, uint8_t *dst, uint64_t token)
{
    char tmp[17];
    snprintf(tmp, sizeof tmp, "%016" PRIx64, token);
    memcpy(dst, tmp, 16);
    if (!token_big(w, token))
        return 16;
    memset(dst + 16, 'p', SIM_VAL_MAX - 16);
    return SIM_VAL_MAX;
}

static int get_token(const struct world *w, const uint8_t *src, size_t len, uint64_t *token)
{
    char tmp[17];
    if (len != 16 && len != SIM_VAL_MAX)
        return -1;
    memcpy(tmp, src, 16);
    tmp[16] = 0;
    char *end;
    *token = strtoull(tmp, &end, 16);
    if (*end != 0 || len != (token_big(w, *token) ? SIM_VAL_MAX : 16u))
        return -1;
    for (size_t i = 16; i < len; i++) {
        if (src[i] != 'p')
            return -1;
    }
    return 0;
}

static struct lin_op *hist_add(struct world *w)
{
    if (w->hist_n == w->hist_cap) {
        w->hist_cap = w->hist_cap ? 2 * w->hist_cap : 256;
        w->hist = realloc(w->hist, w->hist_cap * sizeof *w->hist);
        if (!w->hist)
            abort();
    }
    struct lin_op *h = &w->hist[w->hist_n++];
    memset(h, 0, sizeof *h);
    return h;
}

static void client_send(struct world *w, struct client *c)
{
    uint8_t buf[sizeof(struct cons_wire_hdr) + sizeof(struct cons_wire_op) + sizeof c->op_bytes];
    if (w->o->proto == SIM_NOP) {
        sim__nop_client_send(w, c);
        return;
    }
    int len = mpx_encode_request(buf, sizeof buf, &c->op);
    assert(len > 0);
    net_send(w, cons_client(c->id), cons_replica(c->target), buf, (uint32_t)len);
    c->gen++;
    sim__at(w, SIM_RETRY_NS, EV_CLIENT, (uint32_t)(c - w->cl), c->gen, 0, NULL);
}

/* A random operation over a few keys, so operations contend. Values are
 * unique tokens; CAS expects the last value this client saw. */
static void client_next(struct world *w, struct client *c)
{
    struct cons_op *op = &c->op;
    uint32_t k = (uint32_t)(sim__rnd(w) % w->nkeys);
    uint64_t dice = sim__rnd(w) % 100;
    /* key, value, expected one after another in op_bytes (cons_op_init) */
    uint8_t *b = c->op_bytes;
    uint32_t klen = key_bytes(k, b), vlen = 0, elen = 0;
    uint8_t type, limit = 0, flags = 0;
    struct lin_op *h = hist_add(w);
    h->key = k;
    h->call = w->now;
    h->ret = LIN_PENDING;
    h->client = c->id;
    uint64_t tok = (c->id << 32) | ++c->next_val;
    if (dice < 30) {
        type = CONS_OP_GET;
    } else if (dice < 60) {
        type = CONS_OP_PUT;
        vlen = put_token(w, b + klen, tok);
        h->arg = tok;
    } else if (dice < 70) {
        type = CONS_OP_DEL;
    } else if (dice < 90) {
        type = CONS_OP_CAS;
        vlen = put_token(w, b + klen, tok);
        uint64_t exp = c->seen[k] ? c->seen[k] : tok ^ 1;
        elen = put_token(w, b + klen + vlen, exp);
        h->arg = tok;
        h->exp = exp;
    } else {
        type = CONS_OP_SCAN;
        limit = (uint8_t)sim__urange(w, 1, 4);
        h->scan_limit = limit;
        /* Some scans continue AFTER their start key or stop before an end
         * key (cons.h). Chosen from the request number, not the random
         * stream, so every seed keeps the schedule it had before. */
        h->scan_after = (c->req_no + 1) % 3 == 0;
        flags = h->scan_after ? CONS_SCAN_AFTER : 0;
        h->scan_end = LIN_NO_END;
        if ((c->req_no + 1) % 2 == 0) {
            h->scan_end = k + 1 + (uint32_t)((c->req_no + 1) % 4); /* past the last key: no bound */
            elen = key_bytes(h->scan_end, b + klen);
        }
    }
    cons_op_init(op, type, b, klen, b + klen, vlen, b + klen + vlen, elen);
    op->client_id = c->id;
    op->req_no = ++c->req_no;
    op->scan_limit = limit;
    op->scan_flags = flags;
    h->type = op->type;
    c->hist = w->hist_n - 1;
    nop_quorum_reset(&c->q, w->n, c->id, c->req_no);
    c->busy = 1;
    w->res->ops_issued++;
    client_send(w, c);
}

static int scan_result(struct world *w, struct lin_op *h, const struct cons_reply *rep)
{
    struct cons_rbuf r;
    cons_rbuf_init(&r, rep->data, rep->len);
    h->scan_n = 0;
    while (r.off < r.len && !r.err) {
        uint16_t kl = cons_r_u16(&r);
        const uint8_t *k = cons_r_bytes(&r, kl);
        uint32_t vl = cons_r_u32(&r);
        const uint8_t *v = cons_r_bytes(&r, vl);
        unsigned idx;
        if (r.err || h->scan_n >= h->scan_limit || kl != 3 ||
            sscanf((const char *)k, "k%2u", &idx) != 1 || idx >= w->nkeys ||
            get_token(w, v, vl, &h->scan_vals[h->scan_n]) < 0)
            return -1;
        h->scan_keys[h->scan_n++] = idx;
    }
    /* Room left for another pair of the largest value: else the page may
     * have stopped for bytes, not at the range's end. */
    h->scan_cut = rep->len + 6 + 3 + SIM_VAL_MAX > CONS_SCAN_PAGE;
    return r.err ? -1 : 0;
}

static void on_client_msg(struct world *w, struct client *c, const struct smsg *m)
{
    struct cons_reply rep;
    const uint8_t *data;
    uint32_t hint;
    if (w->o->proto == SIM_NOP) {
        sim__nop_client_msg(w, c, m);
        return;
    }
    if (mpx_decode_reply(m->data, m->len, &rep, &data, &hint) < 0) {
        sim__fail(w, "client %" PRIu64 ": malformed reply", c->id);
        return;
    }
    if (!c->busy || rep.req_no != c->req_no)
        return; /* a late or duplicated reply */
    if (rep.status == FK_ENOTLEADER) {
        c->target = hint < w->n && hint != c->target ? hint : (c->target + 1) % w->n;
        c->gen++; /* cancels the retry timer; resend shortly to the new target */
        sim__at(w, sim__urange(w, 1 * MS, 5 * MS), EV_CLIENT, (uint32_t)(c - w->cl), c->gen, 2,
                NULL);
        return;
    }
    rep.data = (uint8_t *)data; /* read only (sim__client_done) */
    rep.cap = rep.len;
    sim__client_done(w, c, &rep);
}

void sim__client_done(struct world *w, struct client *c, const struct cons_reply *rep_)
{
    const struct cons_reply rep = *rep_;
    struct lin_op *h = &w->hist[c->hist];
    h->ret = w->now;
    h->status = rep.status;
    int bad = 0;
    if (h->type == CONS_OP_GET && rep.status == 0)
        bad = get_token(w, rep.data, rep.len, &h->out) < 0;
    if (h->type == CONS_OP_SCAN && rep.status == 0)
        bad = scan_result(w, h, &rep) < 0;
    if (bad)
        sim__fail(w, "client %" PRIu64 ": unparsable reply", c->id);
    if (h->type == CONS_OP_GET && rep.status == 0)
        c->seen[h->key] = h->out;
    if ((h->type == CONS_OP_PUT || h->type == CONS_OP_CAS) && rep.status == 0)
        c->seen[h->key] = h->arg;
    sim__say(w, 2,
             "client %" PRIu64 " op %u key %u arg %" PRIx64 " exp %" PRIx64 " -> %d out %" PRIx64
             " (called %.3f ms)",
             c->id, h->type, h->key, h->arg, h->exp, rep.status, h->out, (double)h->call / MS);
    c->busy = 0;
    c->done++;
    w->res->ops_done++;
    c->gen++;
    if (!w->healed && c->done < w->o->ops_per_client)
        sim__at(w, sim__urange(w, 0, 5 * MS), EV_CLIENT, (uint32_t)(c - w->cl), c->gen, 1, NULL);
}

/* what: 0 = the retry timeout fired, 1 = start the next op, 2 = resend. */
static void on_client_timer(struct world *w, struct client *c, uint64_t what)
{
    if (what == 1) {
        client_next(w, c);
        return;
    }
    if (!c->busy)
        return;
    if (what == 0)
        c->target = (c->target + 1) % w->n; /* no answer: try the next replica */
    client_send(w, c);
}

/* ---- the administrator (reconfig) ------------------------------------------- */

#define SIM_ADMIN_ID (SIM_CLIENTS_MAX + 1)

/* The configuration in force at the most advanced replica, as an operator
 * reads it from `flowkv status`. */
static struct cons_config newest_conf(struct world *w)
{
    struct cons_config c = {0, 0};
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->reps[i].up)
            continue;
        struct cons_core_status st = status_of(w, i);
        if (c.members == 0 || st.conf.epoch > c.epoch)
            c = st.conf;
    }
    return c;
}

static void admin_send(struct world *w)
{
    uint8_t buf[sizeof(struct cons_wire_hdr) + sizeof(struct cons_wire_op) + CONS_CONFIG_BYTES];
    int len = mpx_encode_request(buf, sizeof buf, &w->admin.op);
    assert(len > 0);
    net_send(w, cons_client(SIM_ADMIN_ID), cons_replica(w->admin.target), buf, (uint32_t)len);
    w->admin.gen++;
    sim__at(w, SIM_RETRY_NS, EV_ADMIN, 0, w->admin.gen, 0, NULL);
}

/* A change of three to five members: a learner added, a member removed,
 * or one replaced by a learner. */
static void admin_next(struct world *w)
{
    struct cons_config c = newest_conf(w);
    uint64_t all = (1ull << w->n) - 1, m = c.members;
    uint32_t nm = (uint32_t)__builtin_popcountll(m), a = w->n, b = w->n;
    for (uint32_t k = 0, s = (uint32_t)(sim__rnd(w) % w->n); k < w->n; k++) {
        uint32_t p = (s + k) % w->n;
        if (!(m >> p & 1) && a == w->n)
            a = p; /* a learner */
        if ((m >> p & 1) && b == w->n)
            b = p; /* a member */
    }
    uint64_t dice = sim__rnd(w) % 100;
    if (m == 0 || b == w->n) {
        sim__at(w, sim__urange(w, 50 * MS, 200 * MS), EV_ADMIN, 0, w->admin.gen, 1, NULL);
        return;
    }
    if (a < w->n && nm < 5 && (nm == 3 || dice < 40))
        m |= 1ull << a;
    else if (nm > 3 && (a == w->n || dice < 70))
        m &= ~(1ull << b);
    else
        m = (m & ~(1ull << b)) | (1ull << a);
    assert((m & ~all) == 0);
    struct cons_config next = {.epoch = c.epoch, .members = m};
    uint8_t v[CONS_CONFIG_BYTES];
    cons_config_put(&next, v);
    cons_op_init(&w->admin.op, CONS_OP_CONFIG, NULL, 0, v, CONS_CONFIG_BYTES, NULL, 0);
    w->admin.op.client_id = SIM_ADMIN_ID;
    if (!w->admin.again)
        w->admin.req_no++; /* FK_EAGAIN: that number was never logged (cons.h) */
    w->admin.op.req_no = w->admin.req_no;
    w->admin.busy = 1;
    sim__say(w, 1, "admin: change epoch %u members %#" PRIx64 " -> %#" PRIx64, c.epoch, c.members,
             m);
    admin_send(w);
}

/* what: 0 = the retry timeout fired, 1 = start the next change, 2 = resend. */
static void on_admin_timer(struct world *w, uint64_t what)
{
    if (what == 1) {
        if (!w->healed && !w->admin.busy)
            admin_next(w);
        return;
    }
    if (!w->admin.busy)
        return;
    if (what == 0)
        w->admin.target = (w->admin.target + 1) % w->n;
    admin_send(w);
}

static void on_admin_msg(struct world *w, const struct smsg *m)
{
    struct cons_reply rep;
    const uint8_t *data;
    uint32_t hint;
    if (mpx_decode_reply(m->data, m->len, &rep, &data, &hint) < 0) {
        sim__fail(w, "admin: malformed reply");
        return;
    }
    if (!w->admin.busy || rep.req_no != w->admin.req_no)
        return;
    if (rep.status == FK_ENOTLEADER) {
        w->admin.target =
            hint < w->n && hint != w->admin.target ? hint : (w->admin.target + 1) % w->n;
        w->admin.gen++;
        sim__at(w, sim__urange(w, 1 * MS, 5 * MS), EV_ADMIN, 0, w->admin.gen, 2, NULL);
        return;
    }
    if (rep.status != 0 && rep.status != FK_EBUSY && rep.status != FK_EAGAIN) {
        sim__fail(w, "admin: a change answered %s", fk_err_name(rep.status));
        return;
    }
    w->res->changes += rep.status == 0;
    w->res->changes_refused += rep.status != 0;
    w->admin.again = rep.status == FK_EAGAIN;
    sim__say(w, 1, "admin: change %s", rep.status == 0 ? "applied" : fk_err_name(rep.status));
    w->admin.busy = 0;
    w->admin.gen++;
    if (!w->healed)
        sim__at(w, sim__urange(w, 30 * MS, 300 * MS), EV_ADMIN, 0, w->admin.gen, 1, NULL);
}

/* ---- the run ------------------------------------------------------------------ */

static void dispatch(struct world *w, struct ev *e)
{
    struct rep *r = &w->reps[e->who];
    switch (e->kind) {
    case EV_MSG: {
        struct smsg *m = e->m;
        if (m->to.kind == CONS_ADDR_CLIENT && m->to.id == SIM_ADMIN_ID) {
            on_admin_msg(w, m);
        } else if (m->to.kind == CONS_ADDR_CLIENT) {
            on_client_msg(w, &w->cl[m->to.id - 1], m);
        } else if (w->reps[m->to.id].up && !cut(w, m->from, m->to)) {
            struct cons_input in = {
                .kind = CONS_IN_MSG, .from = m->from, .buf = m->data, .len = m->len};
            feed(w, (uint32_t)m->to.id, &in);
        }
        free(m);
        break;
    }
    case EV_TICK:
        if (r->up && e->inc == r->inc) {
            struct cons_input in = {.kind = CONS_IN_TICK};
            feed(w, e->who, &in);
            sim__at(w, SIM_TICK_NS, EV_TICK, e->who, r->inc, 0, NULL);
        }
        break;
    case EV_DISK:
        if (r->up && e->inc == r->inc)
            on_disk(w, e->who);
        break;
    case EV_CLIENT:
        if (e->inc == w->cl[e->who].gen)
            on_client_timer(w, &w->cl[e->who], e->arg);
        break;
    case EV_FAULT:
        if (!w->healed)
            on_fault(w);
        break;
    case EV_RESTART:
        if (!r->up && e->inc == r->inc) {
            sim__say(w, 1, "restart replica %u %s", e->who,
                     e->arg == CONS_START_EMPTY   ? "empty"
                     : e->arg == CONS_START_FRESH ? "fresh (a learner)"
                                                  : "with disk");
            boot(w, e->who, (enum cons_start_mode)e->arg);
        }
        break;
    case EV_HEAL:
        on_heal(w);
        break;
    case EV_AMNESIA:
        if (!w->healed)
            amnesia_step(w, (uint32_t)e->arg);
        break;
    case EV_SEQCTL:
        sim__nop_seq_round(w);
        break;
    case EV_ADMIN:
        if (e->inc == w->admin.gen)
            on_admin_timer(w, e->arg);
        break;
    default:
        abort();
    }
}

static int clients_idle(const struct world *w)
{
    for (uint32_t c = 0; c < w->nclients; c++) {
        if (w->cl[c].busy)
            return 0;
    }
    return 1;
}

/* The number of slots replica i applied, if they are all committed (a
 * NOPaxos leader executes ahead of the commit point). */
static int settled_prefix(struct world *w, uint32_t i, uint64_t *applied)
{
    struct cons_core_status st = status_of(w, i);
    *applied = st.applied;
    return st.applied <= st.commit && st.role != CONS_ROLE_RECOVERING &&
           st.role != CONS_ROLE_VIEW_CHANGE;
}

/* Replicas that applied the same prefix must hold the same state. */
static void check_states(struct world *w)
{
    size_t cap = SIM_SM_IMAGE_MAX;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    if (!a || !b)
        abort();
    for (uint32_t i = 0; i < w->n; i++) {
        for (uint32_t j = i + 1; j < w->n; j++) {
            uint64_t ai, aj;
            if (!settled_prefix(w, i, &ai) || !settled_prefix(w, j, &aj) || ai != aj)
                continue;
            struct cons_sm mi = kv_mem_sm(w->reps[i].kv), mj = kv_mem_sm(w->reps[j].kv);
            size_t la, lb;
            /* The whole state (pairs, rows, mark) must agree. */
            if (cons_sm_save(&mi, a, cap, &la) < 0 || cons_sm_save(&mj, b, cap, &lb) < 0 ||
                la != lb || memcmp(a, b, la))
                sim__fail(w, "replicas %u and %u applied %" PRIu64 " slots but differ", i, j, ai);
        }
    }
    free(a);
    free(b);
}

static void setup(struct world *w)
{
    w->ops = w->o->proto == SIM_NOP ? &nop_core_ops : &mpx_core_ops;
    w->n = sim__rnd(w) % 100 < 60 ? 3 : 5;
    if (w->o->reconfig)
        w->n = 5; /* three members, two learners (sim.h) */
    w->f = w->o->reconfig ? 1 : w->n / 2;
    w->nclients = (uint32_t)sim__urange(w, 2, 5);
    w->nkeys = (uint32_t)sim__urange(w, 2, 5);
    w->drop_p = sim__ufrac(w) * 0.10;
    w->dup_p = sim__ufrac(w) * 0.05;
    w->delay_max = sim__urange(w, 1 * MS, 15 * MS);
    w->disk_max = sim__urange(w, 100000, 3 * MS);
    if (w->o->durable) /* slow disks too: acknowledgements wait for them */
        w->disk_max = sim__urange(w, 100000, 25 * MS);
    w->fault_end = w->o->fault_ms ? w->o->fault_ms * MS : SIM_FAULT_NS;
    w->res->n = w->n;
    w->res->clients = w->nclients;
    w->res->drop_p = w->drop_p;
    w->res->dup_p = w->dup_p;
    for (uint32_t i = 0; i < w->n; i++) {
        if (w->o->reconfig && i >= 3) /* a learner, started at some time */
            sim__at(w, sim__urange(w, 0, 1500 * MS), EV_RESTART, i, 0, CONS_START_FRESH, NULL);
        else
            boot(w, i, CONS_START_FRESH);
    }
    if (w->o->reconfig)
        sim__at(w, sim__urange(w, 100 * MS, 500 * MS), EV_ADMIN, 0, 0, 1, NULL);
    if (w->o->proto == SIM_NOP)
        sim__nop_seq_init(w);
    for (uint32_t c = 0; c < w->nclients; c++) {
        w->cl[c].id = c + 1;
        w->cl[c].target = (uint32_t)(sim__rnd(w) % w->n);
        sim__at(w, sim__urange(w, 1 * MS, 50 * MS), EV_CLIENT, c, 0, 1, NULL);
    }
    sim__at(w, sim__urange(w, 50 * MS, 300 * MS), EV_FAULT, 0, 0, 0, NULL);
    sim__at(w, w->fault_end, EV_HEAL, 0, 0, 0, NULL);
}

/* With --verbose, the whole client history, for reading a failure. */
static void dump_history(const struct world *w)
{
    for (size_t i = 0; i < w->hist_n && w->o->verbose; i++) {
        const struct lin_op *h = &w->hist[i];
        printf("  op %zu client %" PRIu64 " type %u key %u arg %" PRIx64 " exp %" PRIx64
               " -> %d out %" PRIx64 " [%.3f, %.3f] ms",
               i, h->client, h->type, h->key, h->arg, h->exp, h->status, h->out,
               (double)h->call / MS, h->ret == LIN_PENDING ? -1.0 : (double)h->ret / MS);
        for (uint8_t k = 0; k < h->scan_n; k++)
            printf(" k%u=%" PRIx64, h->scan_keys[k], h->scan_vals[k]);
        printf("\n");
    }
}

static void finish(struct world *w)
{
    if (!w->failed && !clients_idle(w))
        sim__fail(w, "liveness: operations still pending %" PRIu64 " ms after healing",
                  SIM_LIVE_NS / MS);
    if (!w->failed)
        check_states(w);
    char why[200] = "";
    int rc = lin_check(w->hist, w->hist_n, w->nkeys, 20000000, why, sizeof why);
    if (rc == FK_EPROTO) {
        sim__fail(w, "linearizability: %s", why);
        dump_history(w);
    } else if (rc < 0)
        sim__fail(w, "linearizability check failed to finish: %s %s", fk_err_name(rc), why);
}

/* On a failure with --verbose: where every replica ended up. */
static void dump(struct world *w)
{
    for (uint32_t i = 0; i < w->n && w->o->verbose; i++) {
        struct rep *r = &w->reps[i];
        if (!r->up) {
            printf("  replica %u: down\n", i);
        } else {
            char line[512];
            r->core.ops->describe(r->core.impl, line, sizeof line);
            printf("  replica %u: %s\n", i, line);
        }
    }
}

static void teardown(struct world *w)
{
    w->tearing_down = 1;
    while (w->heap_n) {
        struct ev e = pop(w);
        free(e.m);
    }
    for (uint32_t i = 0; i < w->n; i++) {
        if (w->reps[i].up)
            crash(w, i);
        wipe_disk(&w->reps[i]);
        free(w->reps[i].pq);
    }
    free(w->heap);
    free(w->sm_img);
    free(w->hist);
    free(w->chosen);
}

int sim_run(const struct sim_opts *o, struct sim_result *res)
{
    struct world *w = calloc(1, sizeof *w);
    if (!w)
        return FK_ENOMEM;
    memset(res, 0, sizeof *res);
    w->o = o;
    w->res = res;
    w->rng = o->seed;
    w->sm_img = malloc(4 + SIM_SM_IMAGE_MAX + SIM_STASH_MAX);
    if (!w->sm_img) {
        free(w);
        return FK_ENOMEM;
    }
    setup(w);
    uint64_t settled = 0;
    while (w->heap_n && !w->failed) {
        struct ev e = pop(w);
        w->now = e.t;
        if (w->now > w->fault_end + SIM_LIVE_NS) {
            free(e.m);
            break;
        }
        dispatch(w, &e);
        if (w->healed && clients_idle(w)) {
            if (!settled)
                settled = w->now + SIM_SETTLE_NS; /* let followers learn the commit */
            else if (w->now >= settled)
                break;
        }
    }
    finish(w);
    if (w->failed)
        dump(w);
    res->vtime_ns = w->now;
    res->ok = !w->failed;
    teardown(w);
    free(w);
    return 0;
}
