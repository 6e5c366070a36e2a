/*
 * fk_snapfile.h: the backup file (`flowkv snapshot save FILE`, restored by
 * `flowkv-server --restore FILE`): a replica's state stream (consensus/
 * cons.h, "The stream") as a sequence of frames, with a checksum over the
 * whole file, so a copy that lost or changed one byte is refused before
 * anything is restored from it (etcd's `snapshot save` keeps a SHA-256 at
 * its end for the same reason).
 *
 * Layout (little-endian):
 *   header  48 bytes: u8 magic[8] "FLOWKVSN", u32 version (1), u32 replica
 *           (the one that sent it), u64 index (its mark: every log entry
 *           <= index is in the state), u64 created (Unix time, ns),
 *           u8 protocol (enum cons_proto of the cluster), u8 pad[15]
 *   frames  each u32 len (1..FK_SNAPFILE_FRAME_MAX), then len bytes: one
 *           chunk of the stream, split only between records
 *   trailer u32 0 (no more frames), u64 frames, u64 payload bytes (the
 *           frames' len summed), u64 XXH3-64 of every byte before it
 * The frames carry the stream as the replica read it, HEAD first and END
 * last; this layer checks the framing and the checksum, not the records
 * (cons_snap_next reads them).
 *
 * Ownership: the writer and reader own no file descriptor: the caller
 * opens and closes it. The reader's frames point into its buffer, valid
 * until the next call.
 *
 * Errors: -errno from read/write, FK_EMALFORMED (not a backup file, a
 * frame over the limit, a file cut short: the message names which through
 * fk_snapfile_why), FK_EVERSION (a later version), FK_ENOMEM.
 *
 * Thread safety: a writer or reader belongs to one thread.
 */
#ifndef FK_SNAPFILE_H
#define FK_SNAPFILE_H

#include <stddef.h>
#include <stdint.h>

#define FK_SNAPFILE_MAGIC     "FLOWKVSN"
#define FK_SNAPFILE_VERSION   1
#define FK_SNAPFILE_HEADER    48
#define FK_SNAPFILE_TRAILER   (4 + 8 + 8 + 8)
#define FK_SNAPFILE_FRAME_MAX (4u << 20) /* above the largest record (a 1 MiB value) */

struct fk_snapfile_info {
    uint32_t version, replica;
    uint64_t index, created_ns;
    uint8_t protocol;
    /* Filled by the reader at the end, and by the writer's finish. */
    uint64_t frames, bytes, checksum;
};

struct fk_snapfile_w {
    int fd;
    void *xxh; /* XXH3_state_t */
    uint64_t frames, bytes;
};

/* Starts a file on fd (at its current offset) with info's header fields.
 * Errors: FK_ENOMEM, -errno. On error nothing needs freeing. */
int fk_snapfile_begin(struct fk_snapfile_w *w, int fd, const struct fk_snapfile_info *info);
/* Appends one frame of 1..FK_SNAPFILE_FRAME_MAX bytes (FK_EINVAL else). */
int fk_snapfile_add(struct fk_snapfile_w *w, const void *buf, size_t len);
/* Writes the trailer and frees w; info's frames, bytes and checksum are
 * set. Does not fsync or close fd. */
int fk_snapfile_finish(struct fk_snapfile_w *w, struct fk_snapfile_info *info);
/* Frees w without a trailer (the file is left incomplete). */
void fk_snapfile_discard(struct fk_snapfile_w *w);

struct fk_snapfile_r {
    int fd;
    void *xxh;
    uint8_t *buf; /* FK_SNAPFILE_FRAME_MAX bytes */
    uint64_t frames, bytes;
    int done;
    const char *why; /* what was wrong, for messages */
};

/* Reads and checks the header. Errors as above; on error nothing needs
 * freeing. */
int fk_snapfile_open(struct fk_snapfile_r *r, int fd, struct fk_snapfile_info *info);
/* The next frame: 1 with *buf, *len set; 0 at the end, once the trailer's
 * counts and checksum matched (info's frames, bytes, checksum are set);
 * FK_EMALFORMED when they did not or the file is cut short. */
int fk_snapfile_next(struct fk_snapfile_r *r, const uint8_t **buf, size_t *len,
                     struct fk_snapfile_info *info);
/* Frees r. */
void fk_snapfile_close(struct fk_snapfile_r *r);
/* One phrase on what made the last call fail ("checksum mismatch", ...). */
const char *fk_snapfile_why(const struct fk_snapfile_r *r);

#endif /* FK_SNAPFILE_H */
