/* sim_nop.c: the NOPaxos side of the simulator's clients: the sequencer
 * and ordered unreliable multicast (NOPaxos section 4), and clients that
 * accept f+1 matching replies including the leader's. The replicas are
 * driven through cons_core.h like Multi-Paxos ones (sim.c). */
#include "sim_internal.h"

#include "cons_wire.h"
#include "fk_error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- sequencers: the server's failover decision on the simulated network ---- */

/* The failover order: replica n-1 first, as the cluster files' default
 * `sequencers = 2, 1, 0`. */
static uint32_t first_host(const struct world *w)
{
    return w->n - 1;
}

/* Whether replica a's process reaches b's (itself included). */
static int reach(const struct world *w, uint32_t a, uint32_t b)
{
    return a == b || (w->reps[b].up && !sim__cut(w, a, b));
}

/* What a node does with a declaration it hears (flows' flow__store_desc):
 * it keeps it when its session is newer than the one it knows, and a
 * sequencer it hosts with an older session retires. */
static void hear(struct world *w, uint32_t j, uint32_t host, uint32_t session)
{
    if (session > w->decl_session[j] || (session == w->decl_session[j] && host == j)) {
        w->decl_host[j] = host;
        w->decl_session[j] = session;
    }
    if (j != host && w->seqs[j].live && w->seqs[j].session < session) {
        w->seqs[j].live = 0;
        sim__say(w, 2, "sequencer of session %u at replica %u retired (session %u at %u)",
                 w->seqs[j].session, j, session, host);
    }
}

/* flow_sequencer_start at replica i: the sequencer runs there and every
 * node i reaches hears of it; returns whether one did not. */
static int start_sequencer(struct world *w, uint32_t i, uint32_t session)
{
    if (!w->seqs[i].live || w->seqs[i].session != session)
        w->seqs[i] = (struct sim_seq){.live = 1, .session = session, .msgnum = 0};
    if (session > w->seq_floor[i])
        w->seq_floor[i] = session; /* the server keeps it on disk */
    w->decl_host[i] = i;
    w->decl_session[i] = session;
    int missed = 0;
    for (uint32_t j = 0; j < w->n; j++) {
        if (j == i)
            continue;
        if (reach(w, i, j))
            hear(w, j, i, session);
        else
            missed = 1;
    }
    return missed;
}

static void seqctl_for(struct world *w, uint32_t i)
{
    struct seqctl_config c = {.n = w->n, .id = i, .norder = w->n, .bugs = w->o->seq_bugs};
    for (uint32_t k = 0; k < w->n; k++)
        c.order[k] = w->n - 1 - k;
    if (seqctl_init(&w->seqctl[i], &c, w->seq_floor[i]) < 0)
        abort();
}

void sim__nop_seq_init(struct world *w)
{
    for (uint32_t i = 0; i < w->n; i++) {
        w->seq_floor[i] = 0; /* no session started yet */
        seqctl_for(w, i);
    }
    uint32_t h = first_host(w), session = seqctl_new_session(&w->seqctl[h], 0);
    start_sequencer(w, h, session);
    seqctl_took_over(&w->seqctl[h], session, 0);
    sim__at(w, SEQCTL_PROBE_NS, EV_SEQCTL, 0, 0, 0, NULL);
}

/* A restarted node (server/srv_net.c, connect_oum): it asks its peers for
 * the declaration; with none to ask it has only its own, which names the
 * first node of the order at session 0. If the declaration names it, it
 * starts the sequencer with a session above the one known and its floor
 * (the highest it ever started, from its disk). */
void sim__nop_seq_boot(struct world *w, uint32_t i)
{
    seqctl_for(w, i);
    w->decl_host[i] = first_host(w);
    w->decl_session[i] = 0;
    for (uint32_t j = 0; j < w->n; j++)
        if (j != i && reach(w, i, j) && w->decl_session[j] > w->decl_session[i]) {
            w->decl_host[i] = w->decl_host[j];
            w->decl_session[i] = w->decl_session[j];
        }
    sim__say(w, 1, "replica %u restarted: the declaration it found names %u, session %u", i,
             w->decl_host[i], w->decl_session[i]);
    if (w->decl_host[i] != i)
        return;
    uint32_t session = seqctl_new_session(&w->seqctl[i], w->decl_session[i]);
    int missed = start_sequencer(w, i, session);
    seqctl_took_over(&w->seqctl[i], session, missed);
    sim__say(w, 1, "replica %u restarted the sequencer it hosted: session %u", i, session);
}

void sim__nop_seq_crash(struct world *w, uint32_t i)
{
    w->seqs[i].live = 0;
    w->seq_seen[i] = 0;
}

uint32_t sim__nop_seq_host(const struct world *w)
{
    uint32_t best = SEQCTL_NONE, votes = 0;
    for (uint32_t h = 0; h < w->n; h++) {
        uint32_t v = 0;
        for (uint32_t j = 0; j < w->n; j++)
            v += w->decl_host[j] == h;
        if (v > votes) {
            votes = v;
            best = h;
        }
    }
    return best;
}

/* A probe from i to j: a connection with a handshake, several packets,
 * any of which may be lost; the host is also asked whether it runs the
 * declared session (no: as good as gone). */
static uint8_t probe(struct world *w, uint32_t i, uint32_t j)
{
    if (sim__cut(w, i, j))
        return SEQCTL_SILENT;
    if (!w->reps[j].up)
        return SEQCTL_REFUSED_NOW;
    if (j == w->decl_host[i] && (!w->seqs[j].live || w->seqs[j].session != w->decl_session[i]))
        return SEQCTL_REFUSED_NOW;
    return sim__ufrac(w) < 3 * w->drop_p ? SEQCTL_SILENT : SEQCTL_ANSWERED;
}

/* A host stopped gracefully hands the sequencer to its successor (server/
 * srv_net.c, hand_over_sequencer): its counter goes, and every node it
 * reaches adopts the declaration naming the successor (the same session,
 * a newer version). */
void sim__nop_seq_handoff(struct world *w, uint32_t i)
{
    if (!w->seqs[i].live || w->decl_host[i] != i || w->decl_session[i] != w->seqs[i].session)
        return;
    uint8_t probes[CONS_REPLICAS_MAX] = {0};
    for (uint32_t j = 0; j < w->n; j++)
        if (j != i)
            probes[j] = probe(w, i, j);
    uint32_t to = seqctl_successor(&w->seqctl[i], probes);
    if (to == SEQCTL_NONE)
        return;
    uint32_t session = w->seqs[i].session;
    w->seqs[i].live = 0;
    for (uint32_t j = 0; j < w->n; j++) {
        if (reach(w, i, j) && session >= w->decl_session[j]) {
            w->decl_host[j] = to;
            w->decl_session[j] = session;
        }
    }
    sim__say(w, 1, "replica %u hands the sequencer (session %u) to replica %u", i, session, to);
}

static void round_at(struct world *w, uint32_t i)
{
    /* Seen: what the replica's ordered multicast delivered, and the
     * session of its core's view (a view change carries a newer session to
     * replicas that never received its messages). */
    struct cons_core_status st;
    w->reps[i].core.ops->status(w->reps[i].core.impl, &st);
    uint32_t view_session = (uint32_t)(st.term & 0xffffffffu);
    struct seqctl_round r = {.host = w->decl_host[i],
                             .session = w->decl_session[i],
                             .seen = view_session > w->seq_seen[i] ? view_session : w->seq_seen[i]};
    r.hosting = w->seqs[i].live && w->seqs[i].session == r.session;
    for (uint32_t j = 0; j < w->n; j++)
        if (j != i)
            r.probe[j] = probe(w, i, j);
    struct seqctl_action a = seqctl_step(&w->seqctl[i], &r);
    if (a.kind == SEQCTL_TAKE_OVER) {
        int missed = start_sequencer(w, i, a.session);
        seqctl_took_over(&w->seqctl[i], a.session, missed);
        w->res->failovers++;
        sim__say(w, 1, "replica %u took the sequencer over from %u: session %u", i, r.host,
                 a.session);
    } else if (a.kind == SEQCTL_ANNOUNCE) {
        int missed = start_sequencer(w, i, a.session);
        if (!missed)
            seqctl_announced(&w->seqctl[i]);
        sim__say(w, 1, "replica %u announced session %u%s", i, a.session,
                 missed ? " (not heard everywhere)" : "");
    }
}

void sim__nop_seq_round(struct world *w)
{
    for (uint32_t i = 0; i < w->n; i++)
        if (w->reps[i].up)
            round_at(w, i);
    sim__at(w, SEQCTL_PROBE_NS, EV_SEQCTL, 0, 0, 0, NULL);
}

/* ---- the ordered unreliable multicast ------------------------------------------- */

/* Stamps the next number of sequencer q (at replica host) and multicasts
 * msg with it; per replica the OUM delivers in stamp order, each message
 * either intact or as a drop notification (a loss, or a replica the
 * host's network does not reach: its target reports the gap). */
static void oum_multicast(struct world *w, uint32_t host, struct sim_seq *q, const uint8_t *msg,
                          int len)
{
    uint8_t drop[64];
    int dlen = nop_encode_oum_drop(drop, sizeof drop, q->session, q->msgnum);
    if (len < 0 || dlen < 0)
        abort();
    struct cons_addr oum = {CONS_ADDR_OUM, 0};
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->reps[i].up)
            continue;
        int cut = sim__cut(w, host, i), lost = cut || sim__ufrac(w) < w->drop_p;
        w->res->oum_drops += (uint64_t)lost;
        if (!cut && q->session > w->seq_seen[i])
            w->seq_seen[i] = q->session; /* a drop notification carries it too */
        uint64_t t = w->now + sim__urange(w, 50000, w->delay_max);
        if (t <= w->oum_last[i])
            t = w->oum_last[i] + 1;
        w->oum_last[i] = t;
        sim__at(w, t - w->now, EV_MSG, 0, 0, 0,
                lost ? sim__msg(oum, cons_replica(i), drop, (uint32_t)dlen)
                     : sim__msg(oum, cons_replica(i), msg, (uint32_t)len));
    }
}

/* A client sends to the sequencer the declaration of some replica names
 * (it asks a node, as a flows source does), which stamps the request and
 * multicasts it; no sequencer of that session at that replica (crashed,
 * retired) loses the request. A request to the sequencer may itself be
 * lost. One in four requests comes as the server's kv.oum delivers a
 * large one: first one or two numbers that carry only fills (nop.h), each
 * lost or delivered on its own. */
void sim__nop_client_send(struct world *w, struct client *c)
{
    static uint8_t req[NOP_WIRE_OP_MAX + 64]; /* one run at a time per process: see sim.h */
    c->gen++;
    sim__at(w, 120 * MS, EV_CLIENT, (uint32_t)(c - w->cl), c->gen, 0, NULL);
    w->res->msgs++;
    uint32_t via = (uint32_t)(sim__rnd(w) % w->n);
    uint32_t h = w->decl_host[via];
    struct sim_seq *q = h < w->n ? &w->seqs[h] : NULL;
    if (sim__ufrac(w) < w->drop_p || !w->reps[via].up || q == NULL || !w->reps[h].up || !q->live ||
        q->session != w->decl_session[via]) {
        w->res->dropped++;
        return;
    }
    uint32_t fills = sim__ufrac(w) < 0.25 ? (uint32_t)sim__urange(w, 1, 2) : 0;
    for (uint32_t k = 0; k < fills; k++) {
        uint8_t fill[64];
        ++q->msgnum;
        oum_multicast(w, h, q, fill, nop_encode_oum_fill(fill, sizeof fill, q->session, q->msgnum));
        w->res->oum_fills++;
    }
    ++q->msgnum;
    oum_multicast(w, h, q, req,
                  nop_encode_oum_request(req, sizeof req, q->session, q->msgnum, &c->op));
}

/* NOPaxos section 5.2.1: f+1 replies for one (view, slot), the leader's
 * among them (nop_quorum_add). */
void sim__nop_client_msg(struct world *w, struct client *c, const struct smsg *m)
{
    const struct cons_reply *result;
    if (!c->busy)
        return;
    int rc = nop_quorum_add(&c->q, (uint32_t)m->from.id, m->data, m->len, &result);
    if (rc < 0)
        sim__fail(w, "client %" PRIu64 ": bad reply from replica %" PRIu64 ": %s", c->id,
                  m->from.id, fk_err_name(rc));
    else if (rc == 1)
        sim__client_done(w, c, result);
}
