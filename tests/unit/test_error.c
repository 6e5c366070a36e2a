/* Unit tests for common/fk_error: the X-macro table and its lookups. */
#include "check.h"
#include "fk_error.h"
#include "flowkv.h"

#include <errno.h>
#include <stdio.h>

TEST(error_codes_are_in_reserved_range)
{
#define X(name, off, msg)                                                                          \
    CHECK_MSG(name < 0 && fk_err_is_flowkv(name), "%s=%d outside the reserved range", #name, name);
    FK_ERRNO_MAP(X)
#undef X
    CHECK(!fk_err_is_flowkv(-EINVAL));
    CHECK(!fk_err_is_flowkv(0));
    CHECK(!fk_err_is_flowkv(FK_ERR_LAST - 1));
}

TEST(error_codes_are_distinct_from_errno)
{
    /* errno values on Linux stay below 4096; ours are far beyond. */
    CHECK(FK_ERR_BASE < -4096);
    CHECK_EQ_I64(FK_EINVAL, FK_ERR_BASE);
}

TEST(error_messages_and_names)
{
    CHECK_EQ_STR(fk_strerror(0), "success");
    CHECK_EQ_STR(fk_strerror(FK_EGAP), "sequence gap");
    CHECK_EQ_STR(fk_err_name(FK_EGAP), "FK_EGAP");
    CHECK_EQ_STR(fk_err_name(FK_EVERSION), "FK_EVERSION");
    CHECK_EQ_STR(fk_err_name(0), "OK");
    CHECK_EQ_STR(fk_err_name(-ECONNREFUSED), "ECONNREFUSED");
    CHECK_EQ_STR(fk_strerror(-ENOENT), "No such file or directory");
    CHECK_EQ_STR(fk_strerror(12345), "unknown error");
    CHECK_EQ_STR(fk_strerror(FK_ERR_LAST - 1), "unknown error");
    CHECK_EQ_STR(fk_err_name(-99999), "E?");
}

TEST(every_code_has_a_message_and_name)
{
    for (int e = FK_ERR_BASE; e >= FK_ERR_LAST; e--) {
        const char *m = fk_strerror(e), *n = fk_err_name(e);
        CHECK_MSG(m && *m && strcmp(m, "unknown error") != 0, "code %d has no message", e);
        CHECK_MSG(n && strncmp(n, "FK_E", 4) == 0, "code %d has no FK_E name", e);
    }
}

/* The size-limit errors name the limits libflowkv enforces (flowkv.h). */
TEST(size_limit_messages_name_the_limits)
{
    char key[32], val[32];
    snprintf(key, sizeof key, " %d bytes", FLOWKV_KEY_MAX);
    snprintf(val, sizeof val, " %d bytes", FLOWKV_VAL_MAX);
    CHECK_MSG(strstr(fk_strerror(FK_EKEYSIZE), key) != NULL, "%s", fk_strerror(FK_EKEYSIZE));
    CHECK_MSG(strstr(fk_strerror(FK_EVALSIZE), val) != NULL, "%s", fk_strerror(FK_EVALSIZE));
}

CHECK_MAIN()
