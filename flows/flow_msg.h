/*
 * flow_msg.h: variable-length messages over a shuffle flow.
 *
 * DFI moves fixed-size tuples (flow.h). flowkv's protocols exchange
 * messages from a few dozen bytes (a commit notification) to megabytes (a
 * snapshot for a lagging replica). This layer cuts a message into tuples of
 * one schema (flow_msg_schema) and joins them again at the target. It relies
 * on the one ordering DFI guarantees: tuples of one (source, target) pair
 * arrive in push order (a private ring per pair, DFI section 5.1), so a
 * target reassembles each source's fragments in place, one message at a
 * time per source slot.
 *
 * Fragment tuple (FLOW_MSG_HDR = 32 bytes of header, then data):
 *   dst   u64  the key column: a routing key (client id, replica id)
 *   id    u64  the sender's message number (per source, increasing)
 *   len   u32  the whole message's length
 *   off   u32  where this fragment's data starts in the message
 *   from  u32  sender identity chosen by the caller (replica id, ...)
 *   chunk u32  data bytes in this fragment
 *   data  u8[tuple_size - 32]
 *
 * A torn message (a source that died or closed mid-message, and whose slot a
 * new source reuses) is detected by id, dst and off and dropped whole: a receiver
 * never sees a partial message. Fragments that lie (off or chunk out of
 * range, len above the receiver's max_msg) are dropped and counted as
 * malformed; the sender is untrusted.
 *
 * Memory: the receiver allocates max_sources * max_msg bytes of reassembly
 * buffers once, at create (no allocation per message).
 *
 * Threads: a sender uses its flow_source's thread; a receiver its
 * flow_target's thread.
 */
#ifndef FLOW_MSG_H
#define FLOW_MSG_H

#include "flow.h"

#include <stddef.h>
#include <stdint.h>

#define FLOW_MSG_HDR 32

/* Builds the fragment schema for tuples of tuple_size bytes (a multiple of
 * 8, FLOW_MSG_HDR + 8 .. FLOW_TUPLE_MAX). Errors: FK_EINVAL. */
int flow_msg_schema(struct flow_schema *s, uint32_t tuple_size);

/* The sending side: one per flow_source. */
struct flow_msg_tx {
    flow_source *src;
    uint32_t tuple_size;
    uint64_t next_id;
    uint8_t *frag; /* one tuple of staging, allocated at init */
};

/* Errors: FK_EINVAL, FK_ENOMEM. */
int flow_msg_tx_init(struct flow_msg_tx *tx, flow_source *src, uint32_t tuple_size);
void flow_msg_tx_free(struct flow_msg_tx *tx);

/* Sends msg (len bytes, len >= 1) to target index `target` (or by the flow's
 * routing with target < 0, keyed by dst). The bytes are copied before
 * return. Errors: those of flow_push/flow_push_to; a failure midway leaves
 * a torn message that receivers drop. */
int flow_msg_send(struct flow_msg_tx *tx, int target, uint64_t dst, uint32_t from, const void *msg,
                  size_t len);

/* The receiving side: one per flow_target. */
struct flow_msg_rx;

/* Creates a receiver on a flow of flow_msg_schema(tuple_size) tuples, for
 * up to max_sources source slots and messages of at most max_msg bytes.
 * NULL on bad arguments or out of memory. */
struct flow_msg_rx *flow_msg_rx_create(flow_target *t, uint32_t tuple_size, uint32_t max_sources,
                                       size_t max_msg);
void flow_msg_rx_destroy(struct flow_msg_rx *rx);

struct flow_msg {
    const uint8_t *buf; /* valid until the next flow_msg_recv on this receiver */
    size_t len;
    uint64_t dst;
    uint32_t from;
    int source; /* the flow source slot it came from */
};

/* Returns the next complete message: 0 with *m filled, or FK_ETIMEDOUT when
 * none completed within timeout_ns, FK_EEND (every source closed), or
 * another flow_consume error. GAP and session items of ordered flows are
 * not expected here (use flow_msg_recv_ordered) and return FK_EPROTO. */
int flow_msg_recv(struct flow_msg_rx *rx, struct flow_msg *m, uint64_t timeout_ns);

/* Ordered replicate flows (flow.h: every tuple has its own global number,
 * and a consumer like NOPaxos must account for every number, DFI section
 * 5.4): one item per number, in number order.
 *   FLOW_MSG_WHOLE     a message complete with this tuple, its last
 *                      fragment; item->msg as flow_msg_recv fills it.
 *   FLOW_MSG_FRAGMENT  a leading fragment of a message (not its last). Its
 *                      bytes alone decide this, so every receiver of the
 *                      tuple gets FRAGMENT for it; the message is whole (if
 *                      at all) at a later number, its last fragment's.
 *   FLOW_MSG_LOST      a number that never arrived (the flow's gap), or a
 *                      last fragment this receiver could not join to a
 *                      whole message (a fragment before it was lost, or
 *                      bytes that lie). Another receiver may have got the
 *                      message whole at this number: for this receiver
 *                      alone, it is dropped.
 * item->seq and item->session are the tuple's. Returns 0 with *item
 * filled; FK_ESESSION (a new sequencer session began, item->session;
 * numbering restarts); FK_ETIMEDOUT; FK_EEND; another flow_consume error.
 * A message's fragments need not have consecutive numbers (the sequencer
 * numbers segments, and a message may span two), only increasing ones. */
enum flow_msg_kind { FLOW_MSG_WHOLE = 1, FLOW_MSG_FRAGMENT = 2, FLOW_MSG_LOST = 3 };

struct flow_msg_item {
    int kind; /* enum flow_msg_kind */
    uint64_t seq;
    uint32_t session;
    struct flow_msg msg; /* FLOW_MSG_WHOLE only */
};

int flow_msg_recv_ordered(struct flow_msg_rx *rx, struct flow_msg_item *item, uint64_t timeout_ns);

/* Fragments dropped because they were malformed or belonged to a torn
 * message. */
uint64_t flow_msg_dropped(const struct flow_msg_rx *rx);

#endif /* FLOW_MSG_H */
