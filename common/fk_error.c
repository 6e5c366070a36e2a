/* fk_error.c: message and name tables generated from FK_ERRNO_MAP. */
#include "fk_error.h"

#include <errno.h>
#include <string.h>

static const char *const fk__messages[] = {
#define FK__ERR_MSG(name, off, msg) [off] = msg,
    FK_ERRNO_MAP(FK__ERR_MSG)
#undef FK__ERR_MSG
};

static const char *const fk__names[] = {
#define FK__ERR_NAME(name, off, msg) [off] = #name,
    FK_ERRNO_MAP(FK__ERR_NAME)
#undef FK__ERR_NAME
};

_Static_assert(sizeof(fk__messages) / sizeof(fk__messages[0]) == FK_ERR_BASE - FK_ERR_LAST + 1,
               "FK_ERR_LAST must name the last entry of FK_ERRNO_MAP");

const char *fk_strerror(int err)
{
    if (err == 0)
        return "success";
    if (fk_err_is_flowkv(err))
        return fk__messages[FK_ERR_BASE - err];
    if (err < 0 && err > -4096) {
        /* strerror() is not thread-safe in general, but glibc returns static
         * strings for known errno values; strerrordesc_np is the documented
         * thread-safe accessor (glibc >= 2.32). */
        const char *s = strerrordesc_np(-err);
        return s ? s : "unknown error";
    }
    return "unknown error";
}

const char *fk_err_name(int err)
{
    if (err == 0)
        return "OK";
    if (fk_err_is_flowkv(err))
        return fk__names[FK_ERR_BASE - err];
    if (err < 0 && err > -4096) {
        const char *s = strerrorname_np(-err);
        return s ? s : "E?";
    }
    return "E?";
}
