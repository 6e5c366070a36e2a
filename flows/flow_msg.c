/* flow_msg.c: messages cut into tuples and joined again; see flow_msg.h. */
#include "flow_msg.h"

#include "fk_error.h"
#include "fk_time.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct flow_msg_frag {
    uint64_t dst, id;
    uint32_t len, off, from, chunk;
};
_Static_assert(sizeof(struct flow_msg_frag) == FLOW_MSG_HDR, "fragment header layout");

int flow_msg_schema(struct flow_schema *s, uint32_t tuple_size)
{
    if (tuple_size % 8 != 0 || tuple_size < FLOW_MSG_HDR + 8 || tuple_size > FLOW_TUPLE_MAX)
        return FK_EINVAL;
    struct flow_column cols[] = {
        {"dst", FLOW_UINT64, 0},
        {"id", FLOW_UINT64, 0},
        {"len", FLOW_INT32, 0},
        {"off", FLOW_INT32, 0},
        {"from", FLOW_INT32, 0},
        {"chunk", FLOW_INT32, 0},
        {"data", FLOW_BYTES, tuple_size - FLOW_MSG_HDR},
    };
    int rc = flow_schema_init(s, cols, 7, "dst");
    assert(rc < 0 || s->tuple_size == tuple_size);
    return rc;
}

int flow_msg_tx_init(struct flow_msg_tx *tx, flow_source *src, uint32_t tuple_size)
{
    struct flow_schema s;
    if (tx == NULL || src == NULL || flow_msg_schema(&s, tuple_size) < 0)
        return FK_EINVAL;
    tx->src = src;
    tx->tuple_size = tuple_size;
    tx->next_id = 1;
    tx->frag = calloc(1, tuple_size);
    return tx->frag ? 0 : FK_ENOMEM;
}

void flow_msg_tx_free(struct flow_msg_tx *tx)
{
    free(tx->frag);
    tx->frag = NULL;
}

int flow_msg_send(struct flow_msg_tx *tx, int target, uint64_t dst, uint32_t from, const void *msg,
                  size_t len)
{
    if (msg == NULL || len == 0 || len > UINT32_MAX)
        return FK_EINVAL;
    size_t room = tx->tuple_size - FLOW_MSG_HDR;
    struct flow_msg_frag h = {.dst = dst, .id = tx->next_id++, .len = (uint32_t)len, .from = from};
    /* Bounded: ceil(len / room) fragments. */
    for (size_t off = 0; off < len; off += room) {
        h.off = (uint32_t)off;
        h.chunk = (uint32_t)(len - off < room ? len - off : room);
        memcpy(tx->frag, &h, sizeof h);
        memcpy(tx->frag + FLOW_MSG_HDR, (const uint8_t *)msg + off, h.chunk);
        int rc = target < 0 ? flow_push(tx->src, tx->frag, tx->tuple_size)
                            : flow_push_to(tx->src, target, tx->frag, tx->tuple_size);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Reassembly state of one source slot. */
struct flow_msg_slot {
    uint64_t id, dst;
    uint32_t len, got;
    int active;
    uint8_t *buf; /* max_msg bytes */
};

struct flow_msg_rx {
    flow_target *t;
    uint32_t tuple_size;
    uint32_t nslots;
    size_t max_msg;
    uint64_t dropped;
    struct flow_msg_slot *slots;
    uint8_t *arena; /* nslots * max_msg */
};

struct flow_msg_rx *flow_msg_rx_create(flow_target *t, uint32_t tuple_size, uint32_t max_sources,
                                       size_t max_msg)
{
    struct flow_schema sc;
    if (t == NULL || flow_msg_schema(&sc, tuple_size) < 0 || max_sources == 0 ||
        max_sources > FLOW_SOURCES_MAX || max_msg == 0 || max_msg > UINT32_MAX)
        return NULL;
    struct flow_msg_rx *rx = calloc(1, sizeof *rx);
    if (rx == NULL)
        return NULL;
    rx->t = t;
    rx->tuple_size = tuple_size;
    rx->nslots = max_sources;
    rx->max_msg = max_msg;
    rx->slots = calloc(max_sources, sizeof *rx->slots);
    /* malloc, not calloc: the pages are touched only by messages that use
     * them, so a large max_msg costs address space, not memory. */
    rx->arena = malloc((size_t)max_sources * max_msg);
    if (rx->slots == NULL || rx->arena == NULL) {
        flow_msg_rx_destroy(rx);
        return NULL;
    }
    for (uint32_t i = 0; i < max_sources; i++)
        rx->slots[i].buf = rx->arena + (size_t)i * max_msg;
    return rx;
}

void flow_msg_rx_destroy(struct flow_msg_rx *rx)
{
    if (rx == NULL)
        return;
    free(rx->arena);
    free(rx->slots);
    free(rx);
}

uint64_t flow_msg_dropped(const struct flow_msg_rx *rx)
{
    return rx->dropped;
}

/* Whether h is well formed on its own (the bytes alone decide, so every
 * receiver of the same tuple decides alike). */
static int frag_sane(const struct flow_msg_rx *rx, const struct flow_msg_frag *h)
{
    return h->len <= rx->max_msg && h->off < h->len && h->chunk != 0 &&
           h->chunk <= h->len - h->off && h->chunk <= rx->tuple_size - FLOW_MSG_HDR;
}

/* Takes one fragment. Returns 1 with *m filled when it completes a message,
 * 0 when it was taken and more fragments are needed, -1 when it was
 * dropped (malformed, or part of a torn message). */
static int flow__msg_take(struct flow_msg_rx *rx, const struct flow_item *it, struct flow_msg *m)
{
    const uint8_t *tuple = it->tuple;
    struct flow_msg_frag h;
    memcpy(&h, tuple, sizeof h);
    if (it->source < 0 || (uint32_t)it->source >= rx->nslots || !frag_sane(rx, &h)) {
        rx->dropped++;
        return -1;
    }
    struct flow_msg_slot *s = &rx->slots[it->source];
    if (h.off == 0) {
        if (s->active)
            rx->dropped++; /* the previous message of this slot was torn */
        s->active = 0;
        if (h.chunk == h.len) {
            /* A one-fragment message: hand out the ring's bytes (zero copy,
             * valid until the next consume, as flow_msg_recv promises). */
            *m = (struct flow_msg){tuple + FLOW_MSG_HDR, h.len, h.dst, h.from, it->source};
            return 1;
        }
        *s = (struct flow_msg_slot){
            .id = h.id, .dst = h.dst, .len = h.len, .got = 0, .active = 1, .buf = s->buf};
    } else if (!s->active || h.id != s->id || h.dst != s->dst || h.off != s->got ||
               h.len != s->len) {
        rx->dropped++;
        s->active = 0;
        return -1;
    }
    memcpy(s->buf + h.off, tuple + FLOW_MSG_HDR, h.chunk);
    s->got += h.chunk;
    if (s->got < s->len)
        return 0;
    s->active = 0;
    *m = (struct flow_msg){s->buf, s->len, h.dst, h.from, it->source};
    return 1;
}

int flow_msg_recv(struct flow_msg_rx *rx, struct flow_msg *m, uint64_t timeout_ns)
{
    /* The clock is read only for a wait: a poll (timeout 0) never needs
     * it, and a clock read costs as much as taking a tuple (flow_consume). */
    uint64_t deadline = timeout_ns > 0 ? fk_now_ns() + timeout_ns : 0;
    for (;;) {
        uint64_t left = 0;
        if (deadline != 0) {
            uint64_t now = fk_now_ns();
            left = now < deadline ? deadline - now : 0;
        }
        struct flow_item it;
        int rc = flow_consume(rx->t, &it, left);
        if (rc == FK_EGAP || rc == FK_ESESSION)
            return FK_EPROTO;
        if (rc < 0)
            return rc;
        /* Bounded: each pass consumes one tuple, and flow_consume times
         * out once the deadline has passed and nothing is left. */
        if (flow__msg_take(rx, &it, m) == 1)
            return 0;
    }
}

int flow_msg_recv_ordered(struct flow_msg_rx *rx, struct flow_msg_item *item, uint64_t timeout_ns)
{
    struct flow_item it = {0};
    int rc = flow_consume(rx->t, &it, timeout_ns);
    item->seq = it.seq;
    item->session = it.session;
    if (rc == FK_EGAP) {
        item->kind = FLOW_MSG_LOST;
        return 0;
    }
    if (rc < 0)
        return rc; /* FK_ESESSION (item->session), FK_ETIMEDOUT, FK_EEND, ... */
    if (flow__msg_take(rx, &it, &item->msg) == 1) {
        item->kind = FLOW_MSG_WHOLE;
        return 0;
    }
    /* Not a whole message: a leading fragment, whatever became of its
     * message here, is FRAGMENT at every receiver (its bytes say so); a
     * last fragment that completes nothing here is LOST here only. */
    struct flow_msg_frag h;
    memcpy(&h, it.tuple, sizeof h);
    item->kind = frag_sane(rx, &h) && h.chunk < h.len - h.off ? FLOW_MSG_FRAGMENT : FLOW_MSG_LOST;
    return 0;
}
