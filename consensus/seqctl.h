/*
 * seqctl.h: who hosts the NOPaxos sequencer, as a pure step function.
 *
 * NOPaxos (section 3) leaves the choice of a new sequencer to a controller
 * that declares the old one failed and installs the next with a larger
 * session number. flowkv has no separate controller: every replica runs
 * this one, and only the replica whose evidence is strong acts. The
 * driver (server/srv_net.c with real probes, the simulator with its
 * network) calls seqctl_step every SEQCTL_PROBE_NS with one round of
 * evidence: where the declaration it knows puts the sequencer (host and
 * session), whether this replica's process runs that sequencer, and a
 * probe of every other replica (a connection with the token handshake;
 * for the host, asking it which session it hosts): answered (the host: and
 * runs the declared session), refused at once (no process listens: kill
 * -9; or the host's process no longer runs that sequencer: it restarted),
 * or silent (timed out: down, cut off, lossy).
 * The step answers what to do:
 *   SEQCTL_TAKE_OVER  start a sequencer here with `session` (larger than
 *                     any this replica knows); call seqctl_took_over once
 *                     it runs
 *   SEQCTL_ANNOUNCE   this replica hosts the sequencer and some replica
 *                     did not hear of it: tell every replica again (all
 *                     answer probes now, so telling blocks no one); call
 *                     seqctl_announced once all heard
 *   SEQCTL_NOTHING
 *
 * The rules, each a lesson from a failure:
 *  - Strong evidence only: the host's probes refused SEQCTL_REFUSED times
 *    in a row (its process is gone: found in about 0.6 s), or unanswered
 *    SEQCTL_MISSES times in a row (host down or cut off: about 1.2 s). On
 *    a lossy network a probe often times out; three timeouts in a row came
 *    every few seconds there, and each failover costs a view change.
 *  - A miss counts only in a round where this replica reaches a majority
 *    of the replicas, itself included, without the host: a replica cut
 *    off in a minority sees everyone as dead, and taking the sequencer
 *    over from there (what the fault suite's leader partition did) moved
 *    the group to a session its clients could not reach once healed.
 *  - Only the first replica of the failover order (the cluster file's
 *    `sequencers`), the dead host aside, that answers takes over, so two
 *    live replicas never both do on the same evidence.
 *  - A declaration whose session is below one the replica's ordered
 *    multicast already delivered is obsolete, however alive its host: the
 *    replicas drop an older session's messages, so its host counts as gone
 *    (the simulator found that too: a host restarted while cut off started
 *    a session the group moved to, then crashed before its declaration
 *    spread, leaving the older sequencer declared and every client stuck).
 *    The host itself waits SEQCTL_REFUSED rounds for the newer declaration
 *    (whoever took over announces it) before it starts a session of its own
 *    (the fault suite: a host cut off and back took over again at once
 *    rather than retire).
 *  - A replica the declaration names that does not run the sequencer (its
 *    process restarted) starts it again at once, with a new session: it
 *    answers its peers' probes, so without this nobody ever would (the
 *    simulator found that: a host restarted while cut off, clients stuck).
 *  - Sessions name sequencers: two sequencers numbering one session would
 *    give two requests one place in the order. So a session belongs to one
 *    replica (session - 1 = k * SEQCTL_IDS + id, as Paxos ballots carry
 *    their proposer), and a new one is above every session this replica
 *    knows: the declaration's and its floor, the highest it ever started
 *    (kept on disk), so two replicas taking over at once, or a restarted
 *    one that cannot learn the declaration, never pick the same.
 *  - A replica that took over while some replica did not hear of it
 *    announces again until every replica heard (a host cut off during the
 *    failover learns it when back, and retires its old sequencer).
 *
 * Thread safety: a seqctl belongs to one thread; no allocation, no clock:
 * time is the caller's rounds.
 */
#ifndef SEQCTL_H
#define SEQCTL_H

#include "cons.h"

#include <stdint.h>

#define SEQCTL_PROBE_NS    (200ULL * 1000000ULL) /* a round */
#define SEQCTL_REFUSED     3
#define SEQCTL_MISSES      6
#define SEQCTL_NONE        UINT32_MAX /* no host known */
#define SEQCTL_SESSION_MAX 65535u /* sessions wrap within 1..65535 (the flows' u16 on the wire) */
#define SEQCTL_IDS         8u     /* session - 1 = k * SEQCTL_IDS + the owner's id */
_Static_assert(CONS_REPLICAS_MAX <= SEQCTL_IDS, "every replica owns sessions");

/* Test-only switches that plant known bugs, so the simulator can prove its
 * checkers fail (0 in production). */
enum seqctl_bug {
    SEQCTL_BUG_NO_RESTART = 1u << 0, /* a named host without its sequencer waits, and an
                                         obsolete declaration counts as alive */
};

enum seqctl_probe { SEQCTL_ANSWERED = 1, SEQCTL_REFUSED_NOW = 2, SEQCTL_SILENT = 3 };
enum seqctl_kind { SEQCTL_NOTHING = 0, SEQCTL_TAKE_OVER = 1, SEQCTL_ANNOUNCE = 2 };

struct seqctl_config {
    uint32_t n, id;                    /* replicas, this one */
    uint32_t order[CONS_REPLICAS_MAX]; /* failover order: replica ids */
    uint32_t norder;                   /* 1..n */
    uint32_t bugs;                     /* enum seqctl_bug */
};

struct seqctl {
    struct seqctl_config cfg;
    uint32_t misses, refused; /* the host's probes in a row */
    uint32_t floor;           /* no session of this replica's is at or below it */
    uint8_t announce;         /* this replica's session is not known everywhere yet */
};

/* One round of evidence. probe[j] for every j != id (probe[id] ignored). */
struct seqctl_round {
    uint32_t host;    /* the replica the declaration names, or SEQCTL_NONE */
    uint32_t session; /* its session */
    uint32_t seen;    /* the highest session this replica's ordered multicast delivered */
    uint8_t hosting;  /* host == id: this replica's process runs that session */
    uint8_t probe[CONS_REPLICAS_MAX];
};

struct seqctl_action {
    uint8_t kind; /* enum seqctl_kind */
    uint32_t session;
};

/* Sets s up: floor is the highest session this replica ever started (kept
 * on disk; 0 for none). FK_EINVAL for a bad config (n, id, an order
 * naming a replica twice or none). */
int seqctl_init(struct seqctl *s, const struct seqctl_config *cfg, uint32_t floor);
/* Whether this round's decision depends on the probes of the replicas
 * other than the host: a driver may leave them unprobed (0) when it does
 * not (the host answered, or this replica hosts it with nothing to
 * announce), and the step answers the same. */
static inline int seqctl_needs_all(const struct seqctl *s, uint32_t host, int host_answered)
{
    return host == s->cfg.id ? s->announce : !host_answered && host != SEQCTL_NONE;
}
/* (host_answered: answered and not obsolete, seen <= the declared session.) */
/* The first session replica id owns above `above` (wrapping past
 * SEQCTL_SESSION_MAX to its first). */
uint32_t seqctl_session_after(uint32_t above, uint32_t id);
/* The session this replica starts now (the first start of the flow, a
 * takeover): its first above `known` (the declaration's and the delivered
 * sessions) and its floor. */
uint32_t seqctl_new_session(const struct seqctl *s, uint32_t known);
/* One round: what to do now (above). */
struct seqctl_action seqctl_step(struct seqctl *s, const struct seqctl_round *r);
/* The driver started a sequencer here with `session` (a takeover, or the
 * first start of the flow); pending: some replica did not hear of it. */
void seqctl_took_over(struct seqctl *s, uint32_t session, int pending);
/* The replica this one, stopping while it hosts the sequencer, hands it
 * to: the first of the failover order, itself aside, whose probe was
 * answered (probe[j] as in a round); SEQCTL_NONE when none answered. The
 * named replica starts a sequencer at once (a named host that runs none),
 * instead of the others waiting for three refused probes. */
uint32_t seqctl_successor(const struct seqctl *s, const uint8_t *probe);
/* Every replica heard of this replica's session. */
void seqctl_announced(struct seqctl *s);

#endif /* SEQCTL_H */
