/* test_snapfile.c: the backup file (common/fk_snapfile.h): frames come
 * back as written, and a file that lost or changed one byte is refused. */
#include "check.h"
#include "fk_error.h"
#include "fk_snapfile.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

/* Writes three frames (1 byte, 100 KiB, 3 bytes) and returns the info. */
static struct fk_snapfile_info write_file(void)
{
    static uint8_t big[100 << 10];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 31 + 7);
    if (path[0] != '\0')
        unlink(path); /* the previous file of this test: leave none behind */
    strcpy(path, "/tmp/fk_snapfile.XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    struct fk_snapfile_w w;
    struct fk_snapfile_info in = {.replica = 2, .index = 1234, .created_ns = 99, .protocol = 1};
    CHECK_OK(fk_snapfile_begin(&w, fd, &in));
    CHECK_OK(fk_snapfile_add(&w, "a", 1));
    CHECK_OK(fk_snapfile_add(&w, big, sizeof big));
    CHECK_ERR(fk_snapfile_add(&w, big, 0), FK_EINVAL);
    CHECK_ERR(fk_snapfile_add(&w, big, FK_SNAPFILE_FRAME_MAX + 1), FK_EINVAL);
    CHECK_OK(fk_snapfile_add(&w, "xyz", 3));
    CHECK_OK(fk_snapfile_finish(&w, &in));
    CHECK_EQ_U64(in.frames, 3);
    CHECK_EQ_U64(in.bytes, 1 + sizeof big + 3);
    close(fd);
    return in;
}

/* Reads the file whole: the last call's result, frames seen in *n. */
static int read_file(struct fk_snapfile_info *out, int *n, const char **why)
{
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    struct fk_snapfile_r r;
    const uint8_t *buf;
    size_t len;
    *n = 0;
    int rc = fk_snapfile_open(&r, fd, out);
    if (rc == 0) {
        while ((rc = fk_snapfile_next(&r, &buf, &len, out)) == 1)
            (*n)++;
    }
    *why = fk_snapfile_why(&r);
    fk_snapfile_close(&r);
    close(fd);
    return rc;
}

static void patch(off_t at, uint8_t xor)
{
    int fd = open(path, O_RDWR);
    uint8_t b;
    CHECK(pread(fd, &b, 1, at) == 1);
    b ^= xor;
    CHECK(pwrite(fd, &b, 1, at) == 1);
    close(fd);
}

TEST(snapfile_round_trip)
{
    struct fk_snapfile_info w = write_file(), r;
    int n;
    const char *why;
    CHECK_EQ_I64(read_file(&r, &n, &why), 0);
    CHECK_EQ_I64(n, 3);
    CHECK_EQ_U64(r.replica, 2);
    CHECK_EQ_U64(r.index, 1234);
    CHECK_EQ_U64(r.created_ns, 99);
    CHECK_EQ_U64(r.protocol, 1);
    CHECK_EQ_U64(r.frames, 3);
    CHECK_EQ_U64(r.checksum, w.checksum);
    unlink(path);
}

TEST(snapfile_refuses_a_changed_byte)
{
    write_file();
    patch(FK_SNAPFILE_HEADER + 4 + 1 + 4 + 5000, 0x10); /* inside the big frame */
    struct fk_snapfile_info r;
    int n;
    const char *why;
    CHECK_ERR(read_file(&r, &n, &why), FK_EMALFORMED);
    CHECK(strstr(why, "checksum mismatch") != NULL);
    unlink(path);
}

TEST(snapfile_refuses_a_cut_or_foreign_file)
{
    struct fk_snapfile_info r;
    int n;
    const char *why;
    write_file();
    CHECK(truncate(path, FK_SNAPFILE_HEADER + 4 + 1 + 4 + 200) == 0);
    CHECK_ERR(read_file(&r, &n, &why), FK_EMALFORMED);
    CHECK(strstr(why, "cut short") != NULL);
    CHECK(truncate(path, 10) == 0);
    CHECK_ERR(read_file(&r, &n, &why), FK_EMALFORMED);
    write_file();
    patch(0, 0x01);
    CHECK_ERR(read_file(&r, &n, &why), FK_EMALFORMED);
    CHECK(strstr(why, "not a flowkv snapshot") != NULL);
    write_file();
    patch(8, 0x02); /* version 3 */
    CHECK_ERR(read_file(&r, &n, &why), FK_EVERSION);
    /* A frame length over the limit, and bytes after the trailer. */
    write_file();
    patch(FK_SNAPFILE_HEADER + 3, 0x40);
    CHECK_ERR(read_file(&r, &n, &why), FK_EMALFORMED);
    CHECK(strstr(why, "over the 4 MiB limit") != NULL);
    write_file();
    FILE *f = fopen(path, "a");
    fputc('!', f);
    fclose(f);
    CHECK_ERR(read_file(&r, &n, &why), FK_EMALFORMED);
    CHECK(strstr(why, "follow the trailer") != NULL);
    unlink(path);
}

CHECK_MAIN()
