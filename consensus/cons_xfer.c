/* cons_xfer.c: state transfer in chunks; see cons_xfer.h. */
#include "cons_xfer.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <string.h>

int cons_xfer_init(struct cons_xfer *x, const struct cons_xfer_config *cfg, struct cons_sm sm,
                   struct cons_xfer_io io, uint64_t seed)
{
    memset(x, 0, sizeof *x);
    if (!cfg || cfg->n > CONS_REPLICAS_MAX || cfg->id >= cfg->n || cfg->window == 0 ||
        cfg->window > CONS_XFER_WINDOW_MAX || cfg->chunk == 0 || cfg->retry_ns == 0 ||
        cfg->switch_ns < cfg->retry_ns || !sm.ops || !io.begin || !io.send)
        return FK_EINVAL;
    x->cfg = *cfg;
    x->sm = sm;
    x->io = io;
    /* Nonces only tell this incarnation's transfers apart from each other
     * and from an earlier incarnation's: the seed is fresh per incarnation. */
    x->next_nonce = (seed * 0x9E3779B97F4A7C15ULL) | 1;
    return 0;
}

static void send_close(struct cons_xfer *x, uint32_t p)
{
    if (x->send[p].open)
        x->sm.ops->snap_close(x->sm.impl, p);
    x->send[p].open = 0;
}

void cons_xfer_close_above(struct cons_xfer *x, uint64_t index)
{
    for (uint32_t p = 0; p < x->cfg.n; p++) {
        if (x->send[p].open && x->send[p].index > index)
            send_close(x, p);
    }
}

int cons_xfer_holds(const struct cons_xfer *x, uint64_t serve)
{
    for (uint32_t p = 0; p < x->cfg.n; p++) {
        if (x->send[p].open && x->send[p].index > serve)
            return 1;
    }
    return 0;
}

int cons_xfer_sends(const struct cons_xfer *x, uint64_t serve)
{
    for (uint32_t p = 0; p < x->cfg.n; p++) {
        if (x->send[p].open && x->send[p].index <= serve)
            return 1;
    }
    return 0;
}

void cons_xfer_close(struct cons_xfer *x)
{
    for (uint32_t p = 0; p < x->cfg.n; p++)
        send_close(x, p);
    cons_xfer_stop(x);
}

/* ---- receiver ----------------------------------------------------------- */

static void ask(struct cons_xfer *x, int again, uint64_t now)
{
    struct cons_wbuf w;
    x->io.begin(x->io.ctx, &w, CONS_XFER_REQ);
    cons_w_u64(&w, x->nonce);
    cons_w_u64(&w, x->min_index);
    cons_w_u32(&w, x->next);
    cons_w_u8(&w, (uint8_t)again);
    x->io.send(x->io.ctx, &w, x->from);
    x->asked_ns = now;
}

static int restart(struct cons_xfer *x, uint32_t from, uint64_t now)
{
    int rc = x->sm.ops->install_begin(x->sm.impl);
    if (rc < 0)
        return rc;
    x->active = 1;
    x->from = from;
    x->nonce = x->next_nonce;
    x->next_nonce += 2;
    x->index = 0;
    x->next = 0;
    x->gap = 0;
    x->desc_len = 0;
    x->progress_ns = now;
    ask(x, 1, now);
    return 0;
}

int cons_xfer_start(struct cons_xfer *x, uint32_t from, uint64_t min_index, uint64_t now)
{
    FK_ASSERT(from < x->cfg.n && from != x->cfg.id);
    x->min_index = min_index;
    x->stats.started++;
    return restart(x, from, now);
}

struct cons_xfer_stats cons_xfer_stats(const struct cons_xfer *x)
{
    struct cons_xfer_stats st = x->stats;
    st.receiving = x->active;
    st.from = x->from;
    st.sending = 0;
    for (uint32_t p = 0; p < x->cfg.n; p++)
        st.sending += x->send[p].open;
    return st;
}

const uint8_t *cons_xfer_desc(const struct cons_xfer *x, size_t *len)
{
    *len = x->desc_len;
    return x->desc;
}

void cons_xfer_stop(struct cons_xfer *x)
{
    if (x->active)
        x->sm.ops->install_abort(x->sm.impl);
    x->active = 0;
}

/* Another sender: the next replica after the current one, from the start
 * (a view cannot be resumed elsewhere). */
static int switch_sender(struct cons_xfer *x, uint64_t now)
{
    uint32_t p = x->from;
    do
        p = (p + 1) % x->cfg.n;
    while (p == x->cfg.id);
    x->stats.switched++;
    int rc = restart(x, p, now);
    if (rc < 0)
        x->active = 0;
    return rc;
}

static int on_chunk(struct cons_xfer *x, uint32_t from, struct cons_rbuf *r, uint64_t now,
                    uint64_t *index)
{
    uint64_t nonce = cons_r_u64(r), idx = cons_r_u64(r);
    uint32_t seq = cons_r_u32(r);
    uint8_t last = cons_r_u8(r);
    uint8_t dlen = cons_r_u8(r);
    const uint8_t *desc = cons_r_bytes(r, dlen);
    uint32_t len = cons_r_u32(r);
    const uint8_t *bytes = cons_r_bytes(r, len);
    if (cons_r_done(r) < 0 || dlen > CONS_XFER_DESC_MAX || !x->active || from != x->from ||
        nonce != x->nonce)
        return 0;
    if (seq != x->next) {
        /* A gap (a chunk lost or overtaken): ask again from `next`, at most
         * once per retry period, and at once when `next` arrives (a chunk
         * that overtook it was dropped here). A duplicate of an installed
         * chunk: drop. */
        if (seq > x->next) {
            x->gap = 1;
            if (now - x->asked_ns >= x->cfg.retry_ns / 4)
                ask(x, 1, now);
        }
        return 0;
    }
    if (seq == 0 && idx < x->min_index)
        return 0; /* not the state asked for; the sender answers NO instead */
    if (seq > 0 && idx != x->index)
        return 0;
    x->index = idx;
    x->desc_len = dlen;
    if (dlen)
        memcpy(x->desc, desc, dlen);
    int rc = x->sm.ops->install_chunk(x->sm.impl, bytes, len);
    if (rc == FK_EMALFORMED || rc == FK_EFULL) {
        /* Bad bytes from this sender, or a state this machine cannot hold:
         * the staging is gone; try the next sender from the start. */
        return switch_sender(x, now);
    }
    if (rc < 0)
        return rc;
    x->next++;
    x->progress_ns = now;
    x->stats.chunks_in++;
    x->stats.bytes_in += len;
    if (!last) {
        ask(x, x->gap, now); /* the acknowledgement that opens the window */
        x->gap = 0;
        return 0;
    }
    rc = x->sm.ops->install_commit(x->sm.impl);
    if (rc == FK_EMALFORMED)
        return switch_sender(x, now);
    if (rc < 0)
        return rc;
    ask(x, 0, now); /* tells the sender it may close its view */
    x->active = 0;
    x->stats.completed++;
    x->stats.multi += x->next > 1;
    *index = idx;
    return 1;
}

static int on_no(struct cons_xfer *x, uint32_t from, struct cons_rbuf *r, uint64_t now)
{
    uint64_t nonce = cons_r_u64(r);
    cons_r_u64(r);
    if (cons_r_done(r) < 0 || !x->active || from != x->from || nonce != x->nonce)
        return 0;
    return switch_sender(x, now);
}

/* ---- sender ---------------------------------------------------------------- */

static void say_no(struct cons_xfer *x, uint32_t to, uint64_t nonce, uint64_t index)
{
    struct cons_wbuf w;
    x->io.begin(x->io.ctx, &w, CONS_XFER_NO);
    cons_w_u64(&w, nonce);
    cons_w_u64(&w, index);
    x->io.send(x->io.ctx, &w, to);
}

/* Sends chunk seq (its cursor is s->cursor[seq - base]) and records the
 * next chunk's cursor. Returns 0, or < 0 when it could not (storage: the
 * view is closed; the receiver will move on). */
static int send_chunk(struct cons_xfer *x, uint32_t to, uint32_t seq)
{
    struct cons_xfer_send *s = &x->send[to];
    uint32_t k = seq - s->base;
    FK_ASSERT(k < x->cfg.window + 1);
    uint8_t cur[CONS_SNAP_CURSOR_MAX];
    size_t clen = s->cursor_len[k], len = 0;
    memcpy(cur, s->cursor[k], clen);
    struct cons_wbuf w;
    x->io.begin(x->io.ctx, &w, CONS_XFER_CHUNK);
    cons_w_u64(&w, s->nonce);
    cons_w_u64(&w, s->index);
    cons_w_u32(&w, seq);
    size_t last_at = w.len;
    cons_w_u8(&w, 0);
    cons_w_u8(&w, s->desc_len);
    cons_w_bytes(&w, s->desc, s->desc_len);
    size_t len_at = w.len;
    cons_w_u32(&w, 0);
    if (w.err || w.cap - w.len < CONS_SNAP_RECORD_MAX)
        return FK_EFULL; /* the outbox is full this step; the receiver asks again */
    int rc = x->sm.ops->snap_read(x->sm.impl, to, cur, &clen, w.p + w.len, w.cap - w.len,
                                  x->cfg.chunk, &len);
    if (rc < 0) {
        send_close(x, to);
        return rc;
    }
    w.p[last_at] = (uint8_t)rc;
    uint32_t l32 = (uint32_t)len;
    memcpy(w.p + len_at, &l32, 4);
    w.len += len;
    x->io.send(x->io.ctx, &w, to);
    x->stats.chunks_out++;
    x->stats.bytes_out += len;
    if (rc == 1) {
        s->end = seq + 1;
        return 0;
    }
    memcpy(s->cursor[k + 1], cur, clen);
    s->cursor_len[k + 1] = (uint16_t)clen;
    return 0;
}

static void on_req(struct cons_xfer *x, uint32_t from, struct cons_rbuf *r, uint64_t serve,
                   uint64_t now)
{
    uint64_t nonce = cons_r_u64(r), min_index = cons_r_u64(r);
    uint32_t next = cons_r_u32(r);
    uint8_t again = cons_r_u8(r);
    if (cons_r_done(r) < 0 || from == x->cfg.id)
        return;
    struct cons_xfer_send *s = &x->send[from];
    if (serve == CONS_XFER_SERVE_NONE) {
        send_close(x, from);
        say_no(x, from, nonce, 0);
        return;
    }
    if (!s->open || s->nonce != nonce) {
        if (next != 0) {
            say_no(x, from, nonce, 0); /* a view this incarnation never had */
            return;
        }
        send_close(x, from);
        uint64_t index;
        if (x->sm.ops->snap_open(x->sm.impl, from, &index) < 0) {
            say_no(x, from, nonce, 0);
            return;
        }
        s->open = 1;
        int dlen = x->io.describe ? x->io.describe(x->io.ctx, index, s->desc) : 0;
        if (index < min_index || dlen < 0 || dlen > CONS_XFER_DESC_MAX) {
            send_close(x, from);
            say_no(x, from, nonce, index);
            return;
        }
        s->desc_len = (uint8_t)dlen;
        s->nonce = nonce;
        s->index = index;
        s->base = s->sent = s->end = 0;
        s->cursor_len[0] = 0;
    }
    s->last_ns = now;
    if (s->index > serve)
        return; /* held: not committed yet; the receiver asks again */
    if (s->end && next >= s->end) {
        send_close(x, from); /* the receiver has it all */
        return;
    }
    if (next < s->base || next > s->sent)
        return; /* older than what it acknowledged before, or ahead of us */
    /* Forget the cursors below `next`: the receiver holds those chunks. */
    uint32_t drop = next - s->base;
    if (drop) {
        memmove(s->cursor[0], s->cursor[drop], (size_t)(s->sent - next + 1) * CONS_SNAP_CURSOR_MAX);
        memmove(s->cursor_len, s->cursor_len + drop,
                (size_t)(s->sent - next + 1) * sizeof(uint16_t));
        s->base = next;
    }
    if (again && s->sent > next) {
        x->stats.resent += s->sent - next;
        s->sent = next;
    }
    while (s->sent < next + x->cfg.window && !(s->end && s->sent >= s->end)) {
        if (send_chunk(x, from, s->sent) < 0)
            return;
        s->sent++;
    }
}

void cons_xfer_release(struct cons_xfer *x, uint64_t serve)
{
    for (uint32_t p = 0; p < x->cfg.n; p++) {
        struct cons_xfer_send *s = &x->send[p];
        if (!s->open || s->index > serve || s->sent != 0 || s->base != 0)
            continue;
        while (s->sent < x->cfg.window && !(s->end && s->sent >= s->end)) {
            if (send_chunk(x, p, s->sent) < 0)
                break;
            s->sent++;
        }
    }
}

int cons_xfer_on_msg(struct cons_xfer *x, uint8_t kind, uint32_t from, const uint8_t *body,
                     size_t len, uint64_t serve, uint64_t now, uint64_t *index)
{
    if (from >= x->cfg.n || from == x->cfg.id)
        return 0;
    struct cons_rbuf r;
    cons_rbuf_init(&r, body, len);
    switch (kind) {
    case CONS_XFER_REQ:
        on_req(x, from, &r, serve, now);
        return 0;
    case CONS_XFER_CHUNK:
        return on_chunk(x, from, &r, now, index);
    case CONS_XFER_NO:
        return on_no(x, from, &r, now);
    default:
        return 0;
    }
}

int cons_xfer_tick(struct cons_xfer *x, uint64_t now)
{
    int rc = 0;
    if (x->active) {
        if (now - x->progress_ns >= x->cfg.switch_ns)
            rc = switch_sender(x, now);
        else if (now - x->asked_ns >= x->cfg.retry_ns)
            ask(x, 1, now);
    }
    for (uint32_t p = 0; p < x->cfg.n; p++) {
        /* A receiver silent this long moved to another sender or died. */
        if (x->send[p].open && now - x->send[p].last_ns >= 4 * x->cfg.switch_ns)
            send_close(x, p);
    }
    return rc;
}
