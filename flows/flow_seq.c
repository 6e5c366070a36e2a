/* flow_seq.c: a source's side of the sequencer of ordered replicate flows
 * (DFI section 5.4): finding it, and taking global numbers from it with
 * one fetch-and-add per segment. A leaf: flow_source.c and
 * flow_mcast_send.c take numbers here, flow_node.c asks a node which
 * session it runs (flow_sequencer_probe). */
#include "flow_internal.h"

#include "fk_error.h"
#include "fk_log.h"
#include "fk_time.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

int flow__seq_info(fab_conn *c, const char *name, uint64_t timeout_ns, struct flow__seq_resp *r)
{
    struct flow__msg_hdr h = {.type = FLOW__MSG_SEQ_INFO};
    snprintf(h.name, sizeof(h.name), "%s", name);
    int rc = fab_call(c, &h, sizeof(h), r, sizeof(*r), timeout_ns);
    return rc == (int)sizeof(*r) ? 0 : rc < 0 ? rc : FK_EPROTO;
}

static int seq_connect(flow_source *s)
{
    struct flow__seq_resp r;
    int rc = fab_connect(flow__fab(s->node), s->desc.opts.sequencer, FLOW__CALL_TIMEOUT_NS,
                         &s->seq_conn);
    if (rc == 0)
        rc = flow__seq_info(s->seq_conn, s->desc.name, FLOW__CALL_TIMEOUT_NS, &r);
    if (rc < 0) {
        if (s->seq_conn != NULL)
            fab_conn_close(s->seq_conn);
        s->seq_conn = NULL;
        return rc;
    }
    s->seq_counter = r.counter;
    s->session = r.session;
    return 0;
}

/* Looks for a newer declaration (a moved sequencer) at every node that
 * stores the flow. */
static void seq_rediscover(flow_source *s)
{
    struct flow__desc d;
    for (uint32_t i = 0; i <= s->desc.ntargets; i++) {
        const char *hint = i < s->desc.ntargets ? s->desc.targets[i] : s->desc.home;
        if (hint[0] != '\0' && flow__describe(s->node, s->desc.name, hint, &d) == 0 &&
            flow__desc_newer(&d, &s->desc)) {
            memcpy(s->desc.opts.sequencer, d.opts.sequencer, FAB_ADDR_MAX);
            s->desc.version = d.version;
            s->desc.seq_session = d.seq_session;
            return;
        }
    }
}

/* Takes the next n global sequence numbers (seq .. seq + n - 1) with one
 * fetch-and-add at the sequencer; moves to a new sequencer (new session) if this one is gone.
 * FK_ETIMEDOUT: the sequencer did not answer within the source's timeout;
 * the fetch-and-add stays posted and the next take collects it (its number
 * is ours whenever it comes). FK_EUNREACHABLE: no sequencer answered. */
int flow__seq_take(flow_source *s, uint32_t n, uint64_t *seq)
{
    uint64_t deadline = fk_now_ns() + s->timeout_ns;
    /* A posted fetch-and-add reserved seq_n numbers: its segment may not
     * grow until it is answered (replicate_push seals it first). */
    assert(n >= 1 && (!s->seq_pending || s->seq_n == n));
    for (unsigned backoff = 1;; backoff = backoff < 64 ? backoff * 2 : 64) {
        int rc = s->seq_conn ? 0 : seq_connect(s);
        if (rc == 0 && !s->seq_pending) {
            rc = fab_post_faa(s->seq_conn, s->seq_counter.addr, s->seq_counter.key, n, 0, 0);
            s->seq_pending = rc == 0;
            s->seq_n = n;
            s->seq_since = fk_now_ns();
        }
        while (rc == 0) {
            struct fab_wc wc;
            int got = fab_poll(s->seq_conn, &wc, 1);
            uint64_t now = fk_now_ns();
            if (got == 1) {
                s->seq_pending = 0;
                if (wc.status == 0) {
                    *seq = wc.value;
                    return 0;
                }
                rc = wc.status;
            } else if (got < 0) {
                rc = got;
            } else if (now - s->seq_since >= FLOW__SEQ_STALL_NS) {
                rc = FK_ETIMEDOUT; /* given up: reconnect, maybe elsewhere */
            } else if (now >= deadline) {
                return FK_ETIMEDOUT; /* still posted: the next take waits on */
            } else {
                uint64_t until = s->seq_since + FLOW__SEQ_STALL_NS;
                fab_conn_wait(s->seq_conn, (deadline < until ? deadline : until) - now);
            }
        }
        fk_debug("flows", "flow %s: sequencer %s: %s", s->desc.name, s->desc.opts.sequencer,
                 fk_err_name(rc));
        if (s->seq_conn != NULL)
            fab_conn_close(s->seq_conn);
        s->seq_conn = NULL;
        s->seq_pending = 0;
        if (fk_now_ns() >= deadline)
            return FK_EUNREACHABLE;
        fk_sleep_ns(backoff * FK_NSEC_PER_MSEC);
        seq_rediscover(s);
    }
}
