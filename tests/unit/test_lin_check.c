/* Unit tests for the linearizability checker: small histories whose
 * verdict is known by hand, both ways. */
#include "check.h"
#include "fk_error.h"
#include "sim/lin.h"

static struct lin_op op(uint8_t type, uint32_t key, uint64_t arg, int32_t status, uint64_t out,
                        uint64_t call, uint64_t ret)
{
    struct lin_op o;
    memset(&o, 0, sizeof o);
    o.type = type;
    o.key = key;
    o.arg = arg;
    o.status = status;
    o.out = out;
    o.call = call;
    o.ret = ret;
    o.scan_end = LIN_NO_END;
    return o;
}

static int check(const struct lin_op *h, size_t n)
{
    char why[128];
    return lin_check(h, n, 2, 1000000, why, sizeof why);
}

TEST(sequential_ok_and_stale_read_fails)
{
    struct lin_op h[3] = {op(CONS_OP_PUT, 0, 5, 0, 0, 0, 10), op(CONS_OP_GET, 0, 0, 0, 5, 20, 30),
                          op(CONS_OP_GET, 0, 0, FK_ENOTFOUND, 0, 40, 50)};
    CHECK_OK(check(h, 2));
    CHECK_ERR(check(h, 3), FK_EPROTO); /* the put completed before: not found is stale */
}

TEST(concurrent_reads_may_see_either)
{
    /* put(1) then put(2) concurrent with a read of 1 and a read of 2. */
    struct lin_op h[4] = {op(CONS_OP_PUT, 0, 1, 0, 0, 0, 5), op(CONS_OP_PUT, 0, 2, 0, 0, 10, 40),
                          op(CONS_OP_GET, 0, 0, 0, 2, 12, 20), op(CONS_OP_GET, 0, 0, 0, 1, 25, 30)};
    /* The read of 2 ended before the read of 1 began: 2 then 1 is impossible
     * because nobody wrote 1 after 2. */
    CHECK_ERR(check(h, 4), FK_EPROTO);
    h[3].call = 11; /* now both reads overlap: read 1, then put 2, then read 2 */
    CHECK_OK(check(h, 4));
}

TEST(cas_and_delete)
{
    struct lin_op h[4] = {op(CONS_OP_PUT, 1, 7, 0, 0, 0, 1), op(CONS_OP_CAS, 1, 8, 0, 0, 2, 3),
                          op(CONS_OP_DEL, 1, 0, 0, 0, 4, 5), op(CONS_OP_DEL, 1, 0, 0, 0, 6, 7)};
    h[1].exp = 7;
    CHECK_OK(check(h, 3));
    CHECK_ERR(check(h, 4), FK_EPROTO); /* a second delete cannot succeed */
    h[1].exp = 6;
    CHECK_ERR(check(h, 2), FK_EPROTO); /* cas with the wrong expectation succeeded */
    h[1].status = FK_ECASFAIL;
    CHECK_OK(check(h, 2));
}

TEST(scan_projection)
{
    struct lin_op h[3] = {op(CONS_OP_PUT, 0, 3, 0, 0, 0, 1), op(CONS_OP_PUT, 1, 4, 0, 0, 0, 1),
                          op(CONS_OP_SCAN, 0, 0, 0, 0, 5, 6)};
    h[2].scan_limit = 2;
    h[2].scan_n = 2;
    h[2].scan_keys[0] = 0;
    h[2].scan_vals[0] = 3;
    h[2].scan_keys[1] = 1;
    h[2].scan_vals[1] = 4;
    CHECK_OK(check(h, 3));
    h[2].scan_n = 1; /* missed key 1 though it existed and the scan was not full */
    CHECK_ERR(check(h, 3), FK_EPROTO);
    h[2].scan_limit = 1; /* a full scan of one pair says nothing about key 1 */
    CHECK_OK(check(h, 3));
    h[2].scan_limit = 2; /* a short scan that ends before key 1 says nothing of it */
    h[2].scan_end = 1;
    CHECK_OK(check(h, 3));
    h[2].scan_end = LIN_NO_END; /* a short scan AFTER key 0 that missed key 1 */
    h[2].scan_after = 1;
    h[2].scan_n = 0;
    CHECK_ERR(check(h, 3), FK_EPROTO);
    h[2].scan_after = 0; /* a short scan from key 0 that missed both */
    CHECK_ERR(check(h, 3), FK_EPROTO);
    h[0].ret = LIN_PENDING; /* key 0 never written: only key 1's omission is wrong */
    h[2].scan_after = 1;
    CHECK_ERR(check(h, 3), FK_EPROTO);
    h[2].scan_end = 1; /* AFTER 0, before 1: an empty range, nothing to contradict */
    CHECK_OK(check(h, 3));
}

TEST(pending_ops_are_left_out)
{
    struct lin_op h[2] = {op(CONS_OP_PUT, 0, 9, 0, 0, 0, LIN_PENDING),
                          op(CONS_OP_GET, 0, 0, FK_ENOTFOUND, 0, 5, 6)};
    CHECK_OK(check(h, 2));
}

CHECK_MAIN()
