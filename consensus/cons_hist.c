/* cons_hist.c: the history of compacted entries (cons_hist.h). */
#include "cons_hist.h"

#include "fk_error.h"

#include "fk_assert.h"
#include <stdlib.h>
#include <string.h>

int cons_hist_init(struct cons_hist *h, size_t bytes)
{
    memset(h, 0, sizeof *h);
    if (bytes == 0)
        return 0;
    h->cap = bytes;
    h->n = (uint32_t)(bytes / 64 < 16 ? 16 : bytes / 64);
    h->ring = malloc(bytes);
    h->at = calloc(h->n, sizeof *h->at);
    if (!h->ring || !h->at) {
        cons_hist_free(h);
        return FK_ENOMEM;
    }
    return 0;
}

void cons_hist_free(struct cons_hist *h)
{
    free(h->ring);
    free(h->at);
    memset(h, 0, sizeof *h);
}

/* Copies len bytes out of the ring from byte position pos. */
static void ring_read(const struct cons_hist *h, uint64_t pos, uint8_t *p, size_t len)
{
    size_t at = (size_t)(pos % h->cap), first = h->cap - at < len ? h->cap - at : len;
    memcpy(p, h->ring + at, first);
    memcpy(p + first, h->ring, len - first);
}

static void ring_write(struct cons_hist *h, uint64_t pos, const uint8_t *p, size_t len)
{
    size_t at = (size_t)(pos % h->cap), first = h->cap - at < len ? h->cap - at : len;
    memcpy(h->ring + at, p, first);
    memcpy(h->ring, p + first, len - first);
}

void cons_hist_reset(struct cons_hist *h, uint64_t index)
{
    h->lo = h->hi = index;
    h->head = h->tail;
}

static void drop_oldest(struct cons_hist *h)
{
    uint32_t len;
    FK_ASSERT(h->lo < h->hi);
    ring_read(h, h->head, (uint8_t *)&len, 4);
    h->head += 4 + (uint64_t)len;
    h->lo++;
}

void cons_hist_add(struct cons_hist *h, uint64_t index, const void *bytes, uint32_t len)
{
    FK_ASSERT(len >= 1 && index >= 1);
    if (!h->ring)
        return;
    if (index != h->hi + 1)
        cons_hist_reset(h, index - 1);
    if (4 + (size_t)len > h->cap) {
        cons_hist_reset(h, index);
        return;
    }
    while (h->tail - h->head + 4 + len > h->cap || h->hi - h->lo >= h->n)
        drop_oldest(h);
    h->at[index % h->n] = h->tail;
    ring_write(h, h->tail, (const uint8_t *)&len, 4);
    ring_write(h, h->tail + 4, bytes, len);
    h->tail += 4 + (uint64_t)len;
    h->hi = index;
}

int cons_hist_has(const struct cons_hist *h, uint64_t index)
{
    return h->ring && index > h->lo && index <= h->hi;
}

uint32_t cons_hist_get(const struct cons_hist *h, uint64_t index, uint8_t *out, size_t cap)
{
    if (!cons_hist_has(h, index))
        return 0;
    uint64_t pos = h->at[index % h->n];
    uint32_t len;
    ring_read(h, pos, (uint8_t *)&len, 4);
    if (len <= cap)
        ring_read(h, pos + 4, out, len);
    return len;
}
