/* fk_snapfile.c: the backup file; see fk_snapfile.h. */
#include "fk_snapfile.h"

#include "fk_error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

_Static_assert(sizeof(FK_SNAPFILE_MAGIC) - 1 == 8, "the magic is 8 bytes");
_Static_assert(FK_SNAPFILE_HEADER == 8 + 4 + 4 + 8 + 8 + 1 + 15, "header layout");

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads exactly len bytes: 1, 0 at a clean end before any byte, FK_EMALFORMED
 * for a file cut short, -errno. */
static int read_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return got == 0 ? 0 : FK_EMALFORMED;
        got += (size_t)n;
    }
    return 1;
}

/* Writes and hashes. */
static int w_out(struct fk_snapfile_w *w, const void *buf, size_t len)
{
    XXH3_64bits_update(w->xxh, buf, len);
    return write_all(w->fd, buf, len);
}

int fk_snapfile_begin(struct fk_snapfile_w *w, int fd, const struct fk_snapfile_info *info)
{
    if (w == NULL || info == NULL || fd < 0)
        return FK_EINVAL;
    *w = (struct fk_snapfile_w){.fd = fd, .xxh = XXH3_createState()};
    if (w->xxh == NULL)
        return FK_ENOMEM;
    XXH3_64bits_reset(w->xxh);
    uint8_t h[FK_SNAPFILE_HEADER] = {0};
    memcpy(h, FK_SNAPFILE_MAGIC, 8);
    put32(h + 8, FK_SNAPFILE_VERSION);
    put32(h + 12, info->replica);
    put64(h + 16, info->index);
    put64(h + 24, info->created_ns);
    h[32] = info->protocol;
    int rc = w_out(w, h, sizeof h);
    if (rc < 0)
        fk_snapfile_discard(w);
    return rc;
}

int fk_snapfile_add(struct fk_snapfile_w *w, const void *buf, size_t len)
{
    if (w == NULL || w->xxh == NULL || buf == NULL || len == 0 || len > FK_SNAPFILE_FRAME_MAX)
        return FK_EINVAL;
    uint8_t l[4];
    put32(l, (uint32_t)len);
    int rc = w_out(w, l, sizeof l);
    if (rc == 0)
        rc = w_out(w, buf, len);
    if (rc == 0) {
        w->frames++;
        w->bytes += len;
    }
    return rc;
}

int fk_snapfile_finish(struct fk_snapfile_w *w, struct fk_snapfile_info *info)
{
    if (w == NULL || w->xxh == NULL || info == NULL)
        return FK_EINVAL;
    uint8_t t[FK_SNAPFILE_TRAILER];
    put32(t, 0);
    put64(t + 4, w->frames);
    put64(t + 12, w->bytes);
    XXH3_64bits_update(w->xxh, t, 20);
    uint64_t sum = XXH3_64bits_digest(w->xxh);
    put64(t + 20, sum);
    int rc = write_all(w->fd, t, sizeof t);
    info->frames = w->frames;
    info->bytes = w->bytes;
    info->checksum = sum;
    fk_snapfile_discard(w);
    return rc;
}

void fk_snapfile_discard(struct fk_snapfile_w *w)
{
    if (w != NULL && w->xxh != NULL)
        XXH3_freeState(w->xxh);
    if (w != NULL)
        w->xxh = NULL;
}

/* ---- reading ---------------------------------------------------------------- */

static int r_fail(struct fk_snapfile_r *r, int rc, const char *why)
{
    r->why = why;
    return rc;
}

/* Reads len bytes and hashes them; a short file is "cut short". */
static int r_in(struct fk_snapfile_r *r, void *buf, size_t len)
{
    int rc = read_all(r->fd, buf, len);
    if (rc == 0 || rc == FK_EMALFORMED)
        return r_fail(r, FK_EMALFORMED, "the file is cut short");
    if (rc < 0)
        return r_fail(r, rc, "cannot read the file");
    XXH3_64bits_update(r->xxh, buf, len);
    return 0;
}

int fk_snapfile_open(struct fk_snapfile_r *r, int fd, struct fk_snapfile_info *info)
{
    if (r == NULL || info == NULL || fd < 0)
        return FK_EINVAL;
    *r = (struct fk_snapfile_r){.fd = fd, .xxh = XXH3_createState(), .why = ""};
    r->buf = malloc(FK_SNAPFILE_FRAME_MAX);
    if (r->xxh == NULL || r->buf == NULL) {
        fk_snapfile_close(r);
        return FK_ENOMEM;
    }
    XXH3_64bits_reset(r->xxh);
    uint8_t h[FK_SNAPFILE_HEADER];
    int rc = r_in(r, h, sizeof h);
    if (rc == 0 && memcmp(h, FK_SNAPFILE_MAGIC, 8) != 0)
        rc = r_fail(r, FK_EMALFORMED, "not a flowkv snapshot (no FLOWKVSN header)");
    if (rc == 0 && get32(h + 8) != FK_SNAPFILE_VERSION)
        rc = r_fail(r, FK_EVERSION, "written by another flowkv version");
    if (rc < 0) {
        const char *why = r->why;
        fk_snapfile_close(r);
        r->why = why;
        return rc;
    }
    *info = (struct fk_snapfile_info){.version = get32(h + 8),
                                      .replica = get32(h + 12),
                                      .index = get64(h + 16),
                                      .created_ns = get64(h + 24),
                                      .protocol = h[32]};
    return 0;
}

/* The trailer after its u32 0: counts and checksum must match. */
static int r_trailer(struct fk_snapfile_r *r, struct fk_snapfile_info *info)
{
    uint8_t t[FK_SNAPFILE_TRAILER - 4];
    int rc = r_in(r, t, 16);
    uint64_t sum = XXH3_64bits_digest(r->xxh);
    if (rc == 0)
        rc =
            read_all(r->fd, t + 16, 8) == 1 ? 0 : r_fail(r, FK_EMALFORMED, "the file is cut short");
    if (rc < 0)
        return rc;
    if (get64(t) != r->frames || get64(t + 8) != r->bytes)
        return r_fail(r, FK_EMALFORMED, "frame counts do not match the trailer");
    if (get64(t + 16) != sum)
        return r_fail(r, FK_EMALFORMED, "checksum mismatch (the file was changed or damaged)");
    uint8_t extra;
    if (read_all(r->fd, &extra, 1) != 0)
        return r_fail(r, FK_EMALFORMED, "bytes follow the trailer");
    info->frames = r->frames;
    info->bytes = r->bytes;
    info->checksum = sum;
    r->done = 1;
    return 0;
}

int fk_snapfile_next(struct fk_snapfile_r *r, const uint8_t **buf, size_t *len,
                     struct fk_snapfile_info *info)
{
    if (r == NULL || r->xxh == NULL || buf == NULL || len == NULL || info == NULL)
        return FK_EINVAL;
    if (r->done)
        return 0;
    uint8_t l[4];
    int rc = r_in(r, l, sizeof l);
    if (rc < 0)
        return rc;
    uint32_t n = get32(l);
    if (n == 0)
        return r_trailer(r, info);
    if (n > FK_SNAPFILE_FRAME_MAX)
        return r_fail(r, FK_EMALFORMED, "a frame over the 4 MiB limit (a damaged file)");
    rc = r_in(r, r->buf, n);
    if (rc < 0)
        return rc;
    r->frames++;
    r->bytes += n;
    *buf = r->buf;
    *len = n;
    return 1;
}

void fk_snapfile_close(struct fk_snapfile_r *r)
{
    if (r == NULL)
        return;
    if (r->xxh != NULL)
        XXH3_freeState(r->xxh);
    free(r->buf);
    r->xxh = NULL;
    r->buf = NULL;
}

const char *fk_snapfile_why(const struct fk_snapfile_r *r)
{
    return r != NULL && r->why != NULL ? r->why : "";
}
