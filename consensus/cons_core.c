/* cons_core.c: the two cores behind struct cons_core_ops (cons_core.h).
 * Each adapter maps the neutral config and status onto the core's own;
 * nothing here decides anything about a protocol. */
#include "cons_core.h"

#include "fk_error.h"
#include "mpx.h"
#include "nop.h"

#include <inttypes.h>
#include <stdio.h>

_Static_assert(CONS_START_FRESH == (int)MPX_START_FRESH &&
                   CONS_START_RESTORED == (int)MPX_START_RESTORED &&
                   CONS_START_EMPTY == (int)MPX_START_EMPTY &&
                   CONS_START_FRESH == (int)NOP_START_FRESH &&
                   CONS_START_RESTORED == (int)NOP_START_RESTORED &&
                   CONS_START_EMPTY == (int)NOP_START_EMPTY,
               "start modes line up");
_Static_assert(sizeof(((struct cons_core_status *)0)->syncs) ==
                   sizeof(((struct nop_stat *)0)->syncs),
               "NOPaxos sync kinds fit the status");
_Static_assert(CONS_ROLE_FOLLOWER == (int)MPX_FOLLOWER &&
                   CONS_ROLE_CANDIDATE == (int)MPX_CANDIDATE &&
                   CONS_ROLE_LEADER == (int)MPX_LEADER &&
                   CONS_ROLE_RECOVERING == (int)MPX_RECOVERING,
               "Multi-Paxos roles are cons roles");

/* ---- Multi-Paxos ------------------------------------------------------------ */

/* The history a core keeps: cons_core.h's default for 0, none for
 * CONS_HISTORY_NONE. */
static size_t history_of(const struct cons_core_config *cfg)
{
    if (cfg->history_bytes == CONS_HISTORY_NONE)
        return 0;
    return cfg->history_bytes ? cfg->history_bytes : CONS_HISTORY_DEFAULT;
}

static void *mpx_core_create(const struct cons_core_config *cfg, struct cons_sm sm, int *err)
{
    struct mpx_config c = {
        .n = cfg->n,
        .id = cfg->id,
        .log_cap = cfg->log_cap,
        .window = cfg->window,
        .batch_max = cfg->batch_max,
        .pending_max = cfg->pending_max,
        .clients_max = cfg->clients_max,
        .xfer_chunk = cfg->xfer_chunk ? cfg->xfer_chunk : CONS_XFER_CHUNK_DEFAULT,
        .xfer_window = cfg->xfer_window ? cfg->xfer_window : CONS_XFER_WINDOW_DEFAULT,
        .history_bytes = history_of(cfg),
        .big_bytes = cfg->big_bytes,
        .arena_bytes = cfg->arena_bytes,
        .tick_ns = cfg->tick_ns,
        .members = cfg->members,
        .epoch = cfg->epoch,
        .heartbeat_ns = cfg->heartbeat_ns,
        .election_ns = cfg->election_ns,
        .seed = cfg->seed,
        .bugs = cfg->bugs};
    return mpx_create(&c, sm, err);
}

static void mpx_core_destroy(void *core)
{
    mpx_destroy(core);
}

static int mpx_core_meta(void *core, const uint8_t *buf, size_t len)
{
    return mpx_restore_meta(core, buf, len);
}

static int mpx_core_snapshot(void *core, const uint8_t *buf, size_t len)
{
    return mpx_restore_snapshot(core, buf, len);
}

static int mpx_core_entry(void *core, const uint8_t *buf, size_t len)
{
    return mpx_restore_entry(core, buf, len);
}

static int mpx_core_start(void *core, enum cons_start_mode mode, uint64_t now,
                          struct cons_outbox **out)
{
    return mpx_start(core, (enum mpx_start_mode)mode, now, out);
}

static int mpx_core_step(void *core, const struct cons_input *in, uint64_t now,
                         struct cons_outbox **out)
{
    return mpx_step(core, in, now, out);
}

static void mpx_core_status(const void *core, struct cons_core_status *st)
{
    struct mpx_status ms;
    mpx_status(core, &ms);
    *st = (struct cons_core_status){.role = ms.role,
                                    .term = ms.promised,
                                    .leader = ms.leader,
                                    .commit = ms.commit,
                                    .applied = ms.applied,
                                    .last = ms.last,
                                    .dropped = ms.dropped,
                                    .conf = ms.conf,
                                    .xfer = ms.xfer};
}

static int mpx_core_describe(const void *core, char *buf, size_t cap)
{
    struct mpx_status ms;
    mpx_status(core, &ms);
    return snprintf(buf, cap,
                    "role %u ballot %" PRIu64 " leader %u commit %" PRIu64 " applied %" PRIu64
                    " snap %" PRIu64 " last %" PRIu64 " dropped %" PRIu64
                    " epoch %u members %#" PRIx64 " since %" PRIu64,
                    ms.role, ms.promised, ms.leader, ms.commit, ms.applied, ms.snap_index, ms.last,
                    ms.dropped, ms.conf.epoch, ms.conf.members, ms.conf_slot);
}

static int mpx_core_hash(const void *core, uint64_t index, uint64_t *hash)
{
    return mpx_chosen_hash(core, index, hash);
}

static void mpx_core_invariants(const void *core)
{
    mpx_invariants(core);
}

static int mpx_core_transfer(void *core, uint64_t now, struct cons_outbox **out)
{
    return mpx_transfer(core, now, out);
}

const struct cons_core_ops mpx_core_ops = {
    .proto = CONS_PROTO_MPX,
    .name = "multipaxos",
    .create = mpx_core_create,
    .destroy = mpx_core_destroy,
    .restore_meta = mpx_core_meta,
    .restore_snapshot = mpx_core_snapshot,
    .restore_entry = mpx_core_entry,
    .start = mpx_core_start,
    .step = mpx_core_step,
    .status = mpx_core_status,
    .describe = mpx_core_describe,
    .committed_hash = mpx_core_hash,
    .invariants = mpx_core_invariants,
    .transfer = mpx_core_transfer,
};

/* ---- NOPaxos ------------------------------------------------------------------ */

static void *nop_core_create(const struct cons_core_config *cfg, struct cons_sm sm, int *err)
{
    struct nop_config c = {
        .n = cfg->n,
        .id = cfg->id,
        .log_cap = cfg->log_cap,
        .clients_max = cfg->clients_max,
        .xfer_chunk = cfg->xfer_chunk ? cfg->xfer_chunk : CONS_XFER_CHUNK_DEFAULT,
        .xfer_window = cfg->xfer_window ? cfg->xfer_window : CONS_XFER_WINDOW_DEFAULT,
        .history_bytes = history_of(cfg),
        .arena_bytes = cfg->arena_bytes,
        .heartbeat_ns = cfg->heartbeat_ns,
        .election_ns = cfg->election_ns,
        .seed = cfg->seed,
        .durable = cfg->durable,
        .bugs = cfg->bugs};
    return nop_create(&c, sm, err);
}

static void nop_core_destroy(void *core)
{
    nop_destroy(core);
}

static int nop_core_meta(void *core, const uint8_t *buf, size_t len)
{
    return nop_restore_meta(core, buf, len);
}

static int nop_core_snapshot(void *core, const uint8_t *buf, size_t len)
{
    return nop_restore_snapshot(core, buf, len);
}

static int nop_core_entry(void *core, const uint8_t *buf, size_t len)
{
    return nop_restore_entry(core, buf, len);
}

static int nop_core_start(void *core, enum cons_start_mode mode, uint64_t now,
                          struct cons_outbox **out)
{
    return nop_start(core, (enum nop_start_mode)mode, now, out);
}

static int nop_core_step(void *core, const struct cons_input *in, uint64_t now,
                         struct cons_outbox **out)
{
    return nop_step(core, in, now, out);
}

static void nop_core_status(const void *core, struct cons_core_status *st)
{
    struct nop_stat ns;
    nop_status(core, &ns);
    *st = (struct cons_core_status){.role = ns.status == NOP_RECOVERING   ? CONS_ROLE_RECOVERING
                                            : ns.status == NOP_VIEWCHANGE ? CONS_ROLE_VIEW_CHANGE
                                            : ns.is_leader                ? CONS_ROLE_LEADER
                                                                          : CONS_ROLE_FOLLOWER,
                                    .term = (uint64_t)ns.view.leader_num << 32 | ns.view.session,
                                    .commit = ns.commit,
                                    .applied = ns.executed,
                                    .last = ns.log_len,
                                    .dropped = ns.held_dropped,
                                    .stalls = ns.stalls,
                                    .holds = ns.holds,
                                    .gap_noops = ns.gap_noops,
                                    .stateless = (uint8_t)ns.needs_state,
                                    .xfer = ns.xfer};
    st->leader = ns.leader;
    st->conf.members = (1ull << ns.n) - 1;
    for (int i = 0; i < NOP_SYNC_KINDS; i++)
        st->syncs[i] = ns.syncs[i];
}

static int nop_core_describe(const void *core, char *buf, size_t cap)
{
    return nop_describe(core, buf, cap);
}

static int nop_core_hash(const void *core, uint64_t index, uint64_t *hash)
{
    return nop_committed_hash(core, index, hash);
}

static void nop_core_invariants(const void *core)
{
    nop_invariants(core);
}

static int nop_core_seal(void *core)
{
    return nop_seal(core);
}

static uint64_t nop_core_intake(const void *core, uint32_t *session)
{
    return nop_oum_intake(core, session);
}

static int nop_core_transfer(void *core, uint64_t now, struct cons_outbox **out)
{
    return nop_transfer(core, now, out);
}

const struct cons_core_ops nop_core_ops = {
    .proto = CONS_PROTO_NOP,
    .name = "nopaxos",
    .create = nop_core_create,
    .destroy = nop_core_destroy,
    .restore_meta = nop_core_meta,
    .restore_snapshot = nop_core_snapshot,
    .restore_entry = nop_core_entry,
    .start = nop_core_start,
    .step = nop_core_step,
    .status = nop_core_status,
    .describe = nop_core_describe,
    .committed_hash = nop_core_hash,
    .invariants = nop_core_invariants,
    .seal = nop_core_seal,
    .oum_intake = nop_core_intake,
    .transfer = nop_core_transfer,
};

/* ---- picking and holding a core ------------------------------------------------ */

const struct cons_core_ops *cons_core_ops_of(enum cons_proto proto)
{
    return proto == CONS_PROTO_MPX ? &mpx_core_ops : proto == CONS_PROTO_NOP ? &nop_core_ops : NULL;
}

int cons_core_create(struct cons_core *core, const struct cons_core_ops *ops,
                     const struct cons_core_config *cfg, struct cons_sm sm)
{
    int err = FK_ENOMEM;
    core->ops = ops;
    core->impl = ops->create(cfg, sm, &err);
    return core->impl ? 0 : err;
}

void cons_core_destroy(struct cons_core *core)
{
    if (core->ops && core->impl)
        core->ops->destroy(core->impl);
    core->impl = NULL;
}
