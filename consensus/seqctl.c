/* seqctl.c: who hosts the NOPaxos sequencer; see seqctl.h. */
#include "seqctl.h"

#include "fk_assert.h"
#include "fk_error.h"

#include <string.h>

int seqctl_init(struct seqctl *s, const struct seqctl_config *cfg, uint32_t floor)
{
    if (cfg->n < 1 || cfg->n > CONS_REPLICAS_MAX || cfg->id >= cfg->n || cfg->norder < 1 ||
        cfg->norder > cfg->n)
        return FK_EINVAL;
    uint32_t seen = 0;
    for (uint32_t k = 0; k < cfg->norder; k++) {
        if (cfg->order[k] >= cfg->n || (seen >> cfg->order[k] & 1))
            return FK_EINVAL;
        seen |= 1u << cfg->order[k];
    }
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    s->floor = floor;
    return 0;
}

/* Replicas other than this one and `skip` that answered this round. */
static uint32_t answering(const struct seqctl *s, const struct seqctl_round *r, uint32_t skip)
{
    uint32_t live = 0;
    for (uint32_t j = 0; j < s->cfg.n; j++)
        live += j != s->cfg.id && j != skip && r->probe[j] == SEQCTL_ANSWERED;
    return live;
}

/* Whether this replica is the first of the failover order, the dead host
 * aside, that answers (itself counting as answering). */
static int first_live_candidate(const struct seqctl *s, const struct seqctl_round *r)
{
    for (uint32_t k = 0; k < s->cfg.norder; k++) {
        uint32_t id = s->cfg.order[k];
        if (id == r->host)
            continue;
        if (id == s->cfg.id)
            return 1;
        if (r->probe[id] == SEQCTL_ANSWERED)
            return 0; /* an earlier candidate lives: it takes over */
    }
    return 0;
}

uint32_t seqctl_session_after(uint32_t above, uint32_t id)
{
    FK_ASSERT(id < SEQCTL_IDS);
    uint32_t k = above < id + 1 ? 0 : (above - id - 1) / SEQCTL_IDS + 1;
    uint32_t v = k * SEQCTL_IDS + id + 1;
    return v <= SEQCTL_SESSION_MAX ? v : id + 1;
}

uint32_t seqctl_new_session(const struct seqctl *s, uint32_t known)
{
    return seqctl_session_after(known > s->floor ? known : s->floor, s->cfg.id);
}

/* The highest session this round knows of. */
static uint32_t known(const struct seqctl_round *r)
{
    return r->seen > r->session ? r->seen : r->session;
}

static struct seqctl_action on_own(struct seqctl *s, const struct seqctl_round *r)
{
    struct seqctl_action a = {SEQCTL_NOTHING, 0};
    int fix = !(s->cfg.bugs & SEQCTL_BUG_NO_RESTART);
    /* Named, but its process does not run it (restarted): a new one at
     * once; nobody else will, since it answers. */
    if (!r->hosting && fix)
        return (struct seqctl_action){SEQCTL_TAKE_OVER, seqctl_new_session(s, known(r))};
    /* It runs an obsolete session: another replica took over, whose
     * declaration has not come yet (it announces it each round once every
     * replica answers). Only if it does not come within SEQCTL_REFUSED
     * rounds (that host died too) does this one start a new session. */
    if (r->seen > r->session && fix) {
        if (++s->refused >= SEQCTL_REFUSED)
            return (struct seqctl_action){SEQCTL_TAKE_OVER, seqctl_new_session(s, known(r))};
        return a;
    }
    s->refused = 0;
    if (s->announce && answering(s, r, SEQCTL_NONE) == s->cfg.n - 1)
        a = (struct seqctl_action){SEQCTL_ANNOUNCE, r->session};
    return a;
}

struct seqctl_action seqctl_step(struct seqctl *s, const struct seqctl_round *r)
{
    struct seqctl_action nothing = {SEQCTL_NOTHING, 0};
    if (r->host == s->cfg.id)
        return on_own(s, r);
    s->announce = 0;           /* a session elsewhere: this replica no longer hosts the sequencer */
    if (r->host >= s->cfg.n) { /* SEQCTL_NONE: nothing to judge */
        s->misses = s->refused = 0;
        return nothing;
    }
    uint8_t host_probe = r->probe[r->host];
    if (r->seen > r->session && host_probe == SEQCTL_ANSWERED &&
        !(s->cfg.bugs & SEQCTL_BUG_NO_RESTART))
        host_probe = SEQCTL_REFUSED_NOW; /* it runs an obsolete session */
    if (host_probe == SEQCTL_ANSWERED) {
        s->misses = s->refused = 0;
        return nothing;
    }
    /* Cut off itself, it has no evidence against the host; each miss of a
     * run is checked, so that one taken just before a partition heals does
     * not add up with a majority found just after. */
    if (1 + answering(s, r, r->host) < s->cfg.n / 2 + 1) {
        s->misses = s->refused = 0;
        return nothing;
    }
    s->misses++;
    s->refused = host_probe == SEQCTL_REFUSED_NOW ? s->refused + 1 : 0;
    if ((s->refused < SEQCTL_REFUSED && s->misses < SEQCTL_MISSES) || !first_live_candidate(s, r))
        return nothing;
    uint32_t next = seqctl_new_session(s, known(r));
    FK_ASSERT(next >= 1 && next <= SEQCTL_SESSION_MAX);
    return (struct seqctl_action){SEQCTL_TAKE_OVER, next};
}

void seqctl_took_over(struct seqctl *s, uint32_t session, int pending)
{
    FK_ASSERT(session >= 1 && session <= SEQCTL_SESSION_MAX);
    if (session > s->floor)
        s->floor = session;
    s->misses = s->refused = 0;
    s->announce = pending != 0;
}

uint32_t seqctl_successor(const struct seqctl *s, const uint8_t *probe)
{
    for (uint32_t k = 0; k < s->cfg.norder; k++) {
        uint32_t id = s->cfg.order[k];
        if (id != s->cfg.id && probe[id] == SEQCTL_ANSWERED)
            return id;
    }
    return SEQCTL_NONE;
}

void seqctl_announced(struct seqctl *s)
{
    s->announce = 0;
}
