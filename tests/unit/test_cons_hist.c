/* Unit tests for the history of compacted entries (cons_hist.h): it holds
 * the newest entries that fit its bytes and its positions, each read back
 * as written across the ring's wrap; a gap in the indexes or an entry
 * larger than the ring starts it again; reset and a 0-byte history keep
 * nothing; get reports a length without copying when the room is short.
 * A random stream is checked against a model that keeps every entry. */
#include "check.h"
#include "cons_hist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Entry i's bytes: len of them, each (i * 31 + k) & 0xff. */
static void fill(uint8_t *p, uint64_t i, uint32_t len)
{
    for (uint32_t k = 0; k < len; k++)
        p[k] = (uint8_t)(i * 31 + k);
}

static int holds(const struct cons_hist *h, uint64_t i, uint32_t len)
{
    uint8_t got[600], want[600];
    if (cons_hist_get(h, i, got, sizeof got) != len)
        return 0;
    fill(want, i, len);
    return memcmp(got, want, len) == 0;
}

TEST(hist_keeps_the_newest_that_fit_across_the_wrap)
{
    struct cons_hist h;
    CHECK_OK(cons_hist_init(&h, 1000)); /* 15 positions' worth: 1000 / 64 < 16, so 16 */
    uint8_t b[100];
    for (uint64_t i = 1; i <= 50; i++) {
        fill(b, i, 60);
        cons_hist_add(&h, i, b, 60);
        /* 64 bytes an entry with its length: 15 fit 1000 bytes. */
        uint64_t lo = i > 15 ? i - 15 : 0;
        CHECK_EQ_U64(h.lo, lo);
        CHECK_EQ_U64(h.hi, i);
        for (uint64_t j = lo + 1; j <= i; j++)
            CHECK_MSG(holds(&h, j, 60), "entry %lu after adding %lu", (unsigned long)j,
                      (unsigned long)i);
        CHECK(!cons_hist_has(&h, lo));
        CHECK(!cons_hist_has(&h, i + 1));
    }
    /* Small entries: the 16 positions bound it before the bytes do. */
    for (uint64_t i = 51; i <= 80; i++) {
        fill(b, i, 3);
        cons_hist_add(&h, i, b, 3);
    }
    CHECK_EQ_U64(h.hi - h.lo, 16);
    CHECK(holds(&h, 80, 3) && holds(&h, 65, 3) && !cons_hist_has(&h, 64));
    cons_hist_free(&h);
}

TEST(hist_gap_reset_oversize_and_short_room)
{
    struct cons_hist h;
    CHECK_OK(cons_hist_init(&h, 256));
    uint8_t b[600], out[8];
    for (uint64_t i = 1; i <= 3; i++) {
        fill(b, i, 20);
        cons_hist_add(&h, i, b, 20);
    }
    CHECK_EQ_U64(cons_hist_get(&h, 2, out, sizeof out), 20); /* the length, nothing copied */
    fill(b, 7, 20);
    cons_hist_add(&h, 7, b, 20); /* 4..6 never came: it starts again at 7 */
    CHECK(!cons_hist_has(&h, 3) && holds(&h, 7, 20));
    CHECK_EQ_U64(h.lo, 6);
    fill(b, 8, 300);
    cons_hist_add(&h, 8, b, 300); /* larger than the ring: empty after 8 */
    CHECK(!cons_hist_has(&h, 7) && !cons_hist_has(&h, 8));
    fill(b, 9, 20);
    cons_hist_add(&h, 9, b, 20);
    CHECK(holds(&h, 9, 20));
    cons_hist_reset(&h, 100);
    CHECK(!cons_hist_has(&h, 9) && !cons_hist_has(&h, 100) && !cons_hist_has(&h, 101));
    fill(b, 101, 20);
    cons_hist_add(&h, 101, b, 20);
    CHECK(holds(&h, 101, 20));
    cons_hist_free(&h);

    CHECK_OK(cons_hist_init(&h, 0)); /* keeps nothing */
    cons_hist_add(&h, 1, b, 20);
    CHECK(!cons_hist_has(&h, 1));
    CHECK_EQ_U64(cons_hist_get(&h, 1, b, sizeof b), 0);
    cons_hist_free(&h);
}

/* Random lengths against a model: whatever the history claims to hold is
 * exactly what was added, and it always holds the newest entry and as
 * many before it as the bytes allow. */
TEST(hist_random_stream_matches_model)
{
    struct cons_hist h;
    const size_t cap = 4096;
    CHECK_OK(cons_hist_init(&h, cap));
    static uint32_t lens[20001];
    uint8_t b[600];
    srand(7);
    for (uint64_t i = 1; i <= 20000; i++) {
        lens[i] = 1 + (uint32_t)(rand() % 500);
        fill(b, i, lens[i]);
        cons_hist_add(&h, i, b, lens[i]);
        CHECK_EQ_U64(h.hi, i);
        size_t bytes = 0;
        for (uint64_t j = h.lo + 1; j <= i; j++)
            bytes += 4 + lens[j];
        CHECK(bytes <= cap);
        /* The entry before lo would not have fit beside the rest. */
        CHECK(h.lo == 0 || bytes + 4 + lens[h.lo] > cap || h.hi - h.lo >= h.n);
        if (i % 97 == 0)
            for (uint64_t j = h.lo + 1; j <= i; j++)
                CHECK(holds(&h, j, lens[j]));
    }
    cons_hist_free(&h);
}

CHECK_MAIN()
