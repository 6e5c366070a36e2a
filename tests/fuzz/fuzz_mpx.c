/*
 * fuzz_mpx.c: libFuzzer target for the Multi-Paxos replica's message
 * decoders and handlers (every byte a replica receives is untrusted).
 *
 * An input is a script of records applied to a fresh 3-replica-group member
 * (replica 0), so the fuzzer explores states deeper than one message:
 *   [u8 op][u8 type][u8 from][u8 term][u16 len][len bytes]
 *   op % 4 == 0: a message of `type` from `from` with a valid header and the
 *                bytes as body (reaches each type's body decoder)
 *           1: the bytes as a raw message (header decoding)
 *           2: a tick, len milliseconds later
 *           3: a storage completion for every persist issued so far
 * After every step the replica's invariants must hold, and a malformed
 * message must be rejected with FK_EMALFORMED, never a crash.
 */
#include "cons_wire.h"
#include "fk_error.h"
#include "kv.h"
#include "mpx.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint8_t msg[65536];

static struct mpx *make_replica(struct kv_mem **kv)
{
    struct mpx_config c = {
        .n = 3,
        .id = 0,
        .log_cap = 16,
        .window = 4,
        .batch_max = 2,
        .pending_max = 16,
        .clients_max = 16,
        .arena_bytes = 256u << 10,
        .tick_ns = 1000000,
        .heartbeat_ns = 20000000,
        .election_ns = 100000000,
        .seed = 1,
    };
    *kv = kv_mem_create(64);
    c.xfer_chunk = 64;
    c.xfer_window = 2;
    int err = 0;
    struct mpx *r = *kv ? mpx_create(&c, kv_mem_sm(*kv), &err) : NULL;
    if (r == NULL)
        abort();
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kv_mem *kv;
    struct mpx *r = make_replica(&kv);
    struct cons_outbox *out;
    uint64_t now = 1000000, cookie = 0;
    if (mpx_start(r, MPX_START_FRESH, now, &out) < 0)
        abort();
    /* Bounded: each record consumes at least 6 bytes. */
    while (size >= 6) {
        uint8_t op = data[0], type = data[1], from = data[2], term = data[3];
        size_t len = (size_t)data[4] | (size_t)data[5] << 8;
        data += 6;
        size -= 6;
        if (len > size)
            len = size;
        struct cons_input in = {.kind = CONS_IN_MSG};
        if (op % 4 == 0) {
            struct cons_wbuf w;
            cons_wbuf_init(&w, msg, sizeof msg);
            cons_wire_begin(&w, CONS_PROTO_MPX, type % 16, from % 4, term % 8);
            cons_w_bytes(&w, data, len);
            int n = cons_wire_finish(&w);
            in.buf = msg;
            in.len = n > 0 ? (size_t)n : 0;
        } else if (op % 4 == 1) {
            in.buf = data;
            in.len = len;
        } else if (op % 4 == 2) {
            in.kind = CONS_IN_TICK;
            now += (uint64_t)len * 1000000;
        } else {
            in.kind = CONS_IN_PERSISTED;
            in.cookie = cookie;
        }
        in.from = from % 2 ? cons_client(from) : cons_replica(from % 4);
        int rc = mpx_step(r, &in, now, &out);
        if (rc < 0 && rc != FK_EMALFORMED && rc != FK_EINVAL)
            abort(); /* poisoned or worse from untrusted input alone */
        for (uint32_t i = 0; rc == 0 && i < out->npersists; i++)
            if (out->persists[i].cookie > cookie)
                cookie = out->persists[i].cookie;
        mpx_invariants(r);
        data += len;
        size -= len;
    }
    mpx_destroy(r);
    kv_mem_destroy(kv);
    return 0;
}
