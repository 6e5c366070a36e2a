/*
 * cons_xfer.h: state transfer as a stream of chunks, for the protocol
 * cores (DESIGN.md, "Storage and state transfer").
 *
 * A replica that needs the state (a follower behind every log, a replica
 * that lost its disk) RECEIVES it from one other replica, the SENDER, which
 * reads it from a view of its state machine (cons_sm_ops.snap_*) while it
 * keeps serving. Both sides are pure: the core frames the three messages
 * below in its own envelope (cons_xfer_io) and feeds them back here.
 *
 *   REQ   receiver -> sender: u64 nonce, u64 min_index, u32 next, u8 again
 *         "I hold every chunk below `next`; send up to `window` from it";
 *         again = 1 resends from `next` (a chunk was lost).
 *   CHUNK sender -> receiver: u64 nonce, u64 index, u32 seq, u8 last,
 *         u8 dlen, the view's descriptor (dlen bytes), u32 len, the
 *         chunk's records.
 *   NO    sender -> receiver: u64 nonce, u64 index: it cannot serve that
 *         transfer (its state is older than min_index, it does not know
 *         the nonce, or it cannot open a view).
 *
 * Flow control: at most `window` chunks beyond the receiver's `next` are
 * in flight, so the sender holds a view and `window` + 1 cursors per
 * receiver and the receiver one chunk at a time: memory is the window,
 * whatever the data size. The receiver installs chunks in order and drops
 * any other (no reordering buffer); a gap, or `retry_ns` without progress,
 * asks again from `next`. After `switch_ns` without progress, or a NO, it
 * restarts from the start with another sender (a sender that crashed takes
 * its view with it; a view cannot be resumed elsewhere, since a different
 * replica's state is at a different index). The install commits only when
 * the last chunk arrived (cons_sm_ops: the switch is atomic), so a
 * receiver that crashes mid-transfer keeps its old state and simply asks
 * again after its restart.
 *
 * Thread safety: part of a core; one thread.
 */
#ifndef CONS_XFER_H
#define CONS_XFER_H

#include "cons.h"
#include "cons_wire.h"

#include <stdint.h>

#define CONS_XFER_WINDOW_MAX 16

enum cons_xfer_kind { CONS_XFER_REQ = 1, CONS_XFER_CHUNK = 2, CONS_XFER_NO = 3 };

/* The core's side: messages in its envelope. begin starts a message of
 * `kind` in w (in the core's outbox arena), send queues it to replica to.
 * describe (optional) writes what the core knows of the state at `index`
 * that the machine does not hold (Multi-Paxos: the configuration in force
 * there, mpx.h "Reconfiguration") into buf[CONS_XFER_DESC_MAX] and
 * returns its length, or < 0 when it cannot say (a view older than that
 * knowledge): the view is refused (NO). The receiver gets it with the
 * state (cons_xfer_desc). */
#define CONS_XFER_DESC_MAX 32
struct cons_xfer_io {
    void *ctx;
    void (*begin)(void *ctx, struct cons_wbuf *w, uint8_t kind);
    void (*send)(void *ctx, struct cons_wbuf *w, uint32_t to);
    int (*describe)(void *ctx, uint64_t index, uint8_t *buf);
};

struct cons_xfer_config {
    uint32_t n, id;     /* replicas, this one */
    uint32_t chunk;     /* bytes of records a chunk aims at (cons_sm_ops.snap_read's want) */
    uint32_t window;    /* chunks in flight, 1..CONS_XFER_WINDOW_MAX */
    uint64_t retry_ns;  /* no progress this long: ask again */
    uint64_t switch_ns; /* no progress this long: another sender */
};

/* Counters for the campaign summary and the metrics page. */
struct cons_xfer_stats {
    uint64_t started, completed, switched; /* receiver: transfers, done, new sender */
    uint64_t multi;                        /* receiver: completed in more than one chunk */
    uint64_t chunks_in, bytes_in, chunks_out, bytes_out, resent;
    uint32_t receiving, sending; /* now: a transfer in (0/1), views open for others */
    uint32_t from;               /* now: the replica a transfer in fetches from */
};

struct cons_xfer_send {
    uint8_t open;
    uint8_t desc_len, desc[CONS_XFER_DESC_MAX]; /* io.describe's, at open */
    uint64_t nonce, index, last_ns;
    uint32_t base, sent,
        end; /* cursor[0] is chunk `base`'s; chunks < sent went; end: last + 1, 0 unknown */
    uint8_t cursor[CONS_XFER_WINDOW_MAX + 1][CONS_SNAP_CURSOR_MAX];
    uint16_t cursor_len[CONS_XFER_WINDOW_MAX + 1];
};

struct cons_xfer {
    struct cons_xfer_config cfg;
    struct cons_sm sm;
    struct cons_xfer_io io;
    struct cons_xfer_stats stats;
    /* Receiver. */
    uint8_t active;
    uint32_t from;
    uint64_t nonce, min_index, index, next_nonce;
    uint32_t next;
    uint8_t gap; /* a chunk past `next` came: ask again once `next` is in */
    uint8_t desc_len, desc[CONS_XFER_DESC_MAX]; /* the sender's descriptor of the view */
    uint64_t progress_ns, asked_ns;
    /* Sender: one view per receiver. */
    struct cons_xfer_send send[CONS_REPLICAS_MAX];
};

/* x's counters, with the gauges filled in. */
struct cons_xfer_stats cons_xfer_stats(const struct cons_xfer *x);

/* Sets x up; sm and io are borrowed for x's life. FK_EINVAL on a bad config. */
int cons_xfer_init(struct cons_xfer *x, const struct cons_xfer_config *cfg, struct cons_sm sm,
                   struct cons_xfer_io io, uint64_t seed);
/* Closes every view (the core is going away or lost its state). */
void cons_xfer_close(struct cons_xfer *x);

/* Receiver: starts (or restarts) fetching a state at index >= min_index
 * from replica `from`; any staged install is discarded. Storage errors
 * from install_begin are returned (the core stops). */
int cons_xfer_start(struct cons_xfer *x, uint32_t from, uint64_t min_index, uint64_t now);
/* Receiver: the descriptor (cons_xfer_io.describe) of the state the last
 * completed transfer installed; *len 0: none. */
const uint8_t *cons_xfer_desc(const struct cons_xfer *x, size_t *len);
/* Receiver: gives up the transfer in progress (the install is aborted). */
void cons_xfer_stop(struct cons_xfer *x);
static inline int cons_xfer_active(const struct cons_xfer *x)
{
    return x->active;
}

/* Feeds a message body of `kind` from replica `from`. Returns 1 when it
 * completed the transfer (the machine now holds the state at *index; the
 * core reloads its client table with cons_sm_load), 0 otherwise, or a
 * storage error (stop the replica). A malformed body is ignored (0).
 * `serve` bounds what a REQ gets: CONS_XFER_SERVE_NONE answers NO (a core
 * that cannot give a consistent state now, e.g. while recovering);
 * otherwise a view whose index is at most `serve` is sent, and one above
 * it is HELD: opened but sent only once a later REQ finds it within the
 * bound (a NOPaxos leader executes ahead of its commit point, so its
 * machine may hold entries a view change could still replace: it serves
 * a view once the view's index is committed, and closes held views when
 * its view changes, cons_xfer_close_above). CONS_XFER_SERVE_ALL serves
 * any view. */
#define CONS_XFER_SERVE_NONE 0
#define CONS_XFER_SERVE_ALL  UINT64_MAX
int cons_xfer_on_msg(struct cons_xfer *x, uint8_t kind, uint32_t from, const uint8_t *body,
                     size_t len, uint64_t serve, uint64_t now, uint64_t *index);
/* Sender: starts sending the held views that are within `serve` now,
 * without waiting for the receiver to ask again (call when the bound
 * moved). */
void cons_xfer_release(struct cons_xfer *x, uint64_t serve);
/* Sender: 1 when a view is open above `serve` (held), resp. open within
 * it (being sent). */
int cons_xfer_holds(const struct cons_xfer *x, uint64_t serve);
int cons_xfer_sends(const struct cons_xfer *x, uint64_t serve);
/* Sender: closes the views whose index is above `index` (held views a
 * view change may have made wrong). */
void cons_xfer_close_above(struct cons_xfer *x, uint64_t index);
/* Timers: asks again, or moves to another sender; closes idle views.
 * Returns 0 or a storage error from restarting the install (stop). */
int cons_xfer_tick(struct cons_xfer *x, uint64_t now);

#endif /* CONS_XFER_H */
