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

/* Stamps the next number and multicasts msg with it; per replica the OUM
 * delivers in stamp order, each message either intact or as a drop
 * notification. */
static void oum_multicast(struct world *w, const uint8_t *msg, int len)
{
    uint8_t drop[64];
    int dlen = nop_encode_oum_drop(drop, sizeof drop, w->session, w->msgnum);
    if (len < 0 || dlen < 0)
        abort();
    struct cons_addr oum = {CONS_ADDR_OUM, 0};
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->reps[i].up)
            continue;
        int lost = sim__ufrac(w) < w->drop_p;
        w->res->oum_drops += (uint64_t)lost;
        uint64_t t = w->now + sim__urange(w, 50000, w->delay_max);
        if (t <= w->oum_last[i])
            t = w->oum_last[i] + 1;
        w->oum_last[i] = t;
        sim__at(w, t - w->now, EV_MSG, 0, 0, 0,
                lost ? sim__msg(oum, cons_replica(i), drop, (uint32_t)dlen)
                     : sim__msg(oum, cons_replica(i), msg, (uint32_t)len));
    }
}

/* The sequencer stamps the request and multicasts it. A request to the
 * sequencer may itself be lost. One in four requests comes as the server's
 * kv.oum delivers a large one: first one or two numbers that carry only
 * fills (nop.h), each lost or delivered on its own. */
void sim__nop_client_send(struct world *w, struct client *c)
{
    static uint8_t req[NOP_WIRE_OP_MAX + 64]; /* one run at a time per process: see sim.h */
    c->gen++;
    sim__at(w, 120 * MS, EV_CLIENT, (uint32_t)(c - w->cl), c->gen, 0, NULL);
    w->res->msgs++;
    if (sim__ufrac(w) < w->drop_p) {
        w->res->dropped++;
        return;
    }
    uint32_t fills = sim__ufrac(w) < 0.25 ? (uint32_t)sim__urange(w, 1, 2) : 0;
    for (uint32_t k = 0; k < fills; k++) {
        uint8_t fill[64];
        ++w->msgnum;
        oum_multicast(w, fill, nop_encode_oum_fill(fill, sizeof fill, w->session, w->msgnum));
        w->res->oum_fills++;
    }
    ++w->msgnum;
    oum_multicast(w, req, nop_encode_oum_request(req, sizeof req, w->session, w->msgnum, &c->op));
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

void sim__nop_failover(struct world *w)
{
    w->session++;
    w->msgnum = 0;
    w->res->failovers++;
    sim__say(w, 1, "fault: sequencer fails over to session %u", w->session);
}
