/* cli_snap.c: `flowkv snapshot save|status` (cli_snap.h). */
#include "cli_snap.h"

#include "cons.h"
#include "cons_wire.h"
#include "fk_error.h"
#include "fk_snapfile.h"
#include "fk_time.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The CLI's exit statuses (flowkv_cli.c). */
enum { EXIT_OK = 0, EXIT_USAGE = 2, EXIT_ERROR = 3, EXIT_UNREACHABLE = 4 };

/* A follower that answers, else the leader, else replica 0: a backup
 * should not load the replica that orders every request. */
static uint32_t pick_replica(flowkv *kv, uint64_t timeout_ns)
{
    uint32_t n = flowkv_replicas(kv), leader = n;
    for (uint32_t i = 0; i < n; i++) {
        struct flowkv_replica_status st;
        if (flowkv_status(kv, i, &st, timeout_ns) < 0 || !st.reachable)
            continue;
        if (strcmp(st.role, "follower") == 0)
            return i;
        if (strcmp(st.role, "leader") == 0)
            leader = i;
    }
    return leader < n ? leader : 0;
}

static int save(flowkv *kv, const char *path, const char *replica, uint64_t timeout_ns, int json)
{
    uint32_t id;
    if (replica != NULL) {
        char *end;
        long v = strtol(replica, &end, 10);
        if (*end != '\0' || v < 0 || (uint32_t)v >= flowkv_replicas(kv)) {
            fprintf(stderr, "flowkv: snapshot save: replica '%s': the cluster has %u (0..%u)\n",
                    replica, flowkv_replicas(kv), flowkv_replicas(kv) - 1);
            return EXIT_USAGE;
        }
        id = (uint32_t)v;
    } else {
        id = pick_replica(kv, timeout_ns < 2000000000ULL ? timeout_ns : 2000000000ULL);
    }
    char part[4096 + 8];
    if (snprintf(part, sizeof part, "%s.part", path) >= (int)sizeof part) {
        fprintf(stderr, "flowkv: snapshot save: the path is too long\n");
        return EXIT_USAGE;
    }
    int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "flowkv: snapshot save: cannot create %s: %s\n", part, strerror(errno));
        return EXIT_ERROR;
    }
    uint64_t t0 = fk_now_ns();
    struct flowkv_snapshot_info info;
    int rc = flowkv_snapshot_save(kv, id, fd, &info, timeout_ns);
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(part, path) != 0)
        rc = -errno;
    if (rc < 0) {
        unlink(part);
        const char *d = flowkv_error_detail(kv);
        fprintf(stderr, "flowkv: snapshot save from replica %u: %s%s%s%s\n", id, fk_strerror(rc),
                *d ? " (" : "", d, *d ? ")" : "");
        return rc == FK_ETIMEDOUT || rc == FK_EUNREACHABLE ? EXIT_UNREACHABLE : EXIT_ERROR;
    }
    double s = (double)(fk_now_ns() - t0) / 1e9;
    if (json)
        printf("{\"file\":\"%s\",\"replica\":%u,\"protocol\":\"%s\",\"index\":%llu,"
               "\"bytes\":%llu,\"chunks\":%llu,\"checksum\":\"%016llx\",\"seconds\":%.3f}\n",
               path, info.replica, info.protocol, (unsigned long long)info.index,
               (unsigned long long)info.bytes, (unsigned long long)info.chunks,
               (unsigned long long)info.checksum, s);
    else
        printf("saved %s: replica %u (%s), index %llu, %llu bytes in %llu chunks, checksum "
               "%016llx, %.2f s (%.1f MB/s)\n",
               path, info.replica, info.protocol, (unsigned long long)info.index,
               (unsigned long long)info.bytes, (unsigned long long)info.chunks,
               (unsigned long long)info.checksum, s, s > 0 ? (double)info.bytes / s / 1e6 : 0.0);
    return EXIT_OK;
}

/* What a file holds, read through once. */
struct contents {
    uint64_t pairs, sessions, data_bytes, head_index, end_pairs, end_sessions;
    int heads, ends;
    XXH3_state_t *digest; /* over the PAIR records: equal for equal data */
};

static int walk(struct contents *c, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    struct cons_snap_rec r;
    int rc;
    while ((rc = cons_snap_next(buf, len, &off, &r)) == 1) {
        if (r.tag == CONS_SNAP_HEAD) {
            c->heads++;
            c->head_index = r.a;
        } else if (r.tag == CONS_SNAP_SESSION) {
            c->sessions++;
        } else if (r.tag == CONS_SNAP_PAIR) {
            c->pairs++;
            c->data_bytes += r.klen + r.vlen;
            XXH3_64bits_update(c->digest, r.at, r.len);
        } else {
            c->ends++;
            c->end_sessions = r.a;
            c->end_pairs = r.b;
        }
    }
    return rc;
}

static int status(const char *path, int json)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "flowkv: snapshot status: cannot open %s: %s\n", path, strerror(errno));
        return EXIT_ERROR;
    }
    struct fk_snapfile_r r;
    struct fk_snapfile_info fi;
    struct contents c = {.digest = XXH3_createState()};
    const uint8_t *buf;
    size_t len;
    const char *why = "";
    int rc = c.digest == NULL ? FK_ENOMEM : fk_snapfile_open(&r, fd, &fi);
    if (rc == 0) {
        XXH3_64bits_reset(c.digest);
        while ((rc = fk_snapfile_next(&r, &buf, &len, &fi)) == 1)
            if (walk(&c, buf, len) < 0) {
                rc = FK_EMALFORMED;
                why = "a record cut short or of an unknown kind";
                break;
            }
        if (rc < 0 && !*why)
            why = fk_snapfile_why(&r);
        fk_snapfile_close(&r);
    } else {
        why = fk_snapfile_why(&r);
    }
    close(fd);
    if (rc == 0 &&
        (c.heads != 1 || c.ends != 1 || c.end_pairs != c.pairs || c.end_sessions != c.sessions)) {
        rc = FK_EMALFORMED;
        why = "the stream's counts do not match its records";
    }
    uint64_t digest = c.digest ? XXH3_64bits_digest(c.digest) : 0;
    XXH3_freeState(c.digest);
    if (rc < 0) {
        fprintf(stderr, "flowkv: snapshot status: %s: %s\n", path, *why ? why : fk_strerror(rc));
        return EXIT_ERROR;
    }
    const char *proto = fi.protocol == CONS_PROTO_MPX ? "multipaxos" : "nopaxos";
    if (json) {
        printf("{\"file\":\"%s\",\"replica\":%u,\"protocol\":\"%s\",\"index\":%llu,"
               "\"created_ns\":%llu,\"pairs\":%llu,\"sessions\":%llu,\"data_bytes\":%llu,"
               "\"stream_bytes\":%llu,\"checksum\":\"%016llx\",\"pairs_digest\":\"%016llx\"}\n",
               path, fi.replica, proto, (unsigned long long)fi.index,
               (unsigned long long)fi.created_ns, (unsigned long long)c.pairs,
               (unsigned long long)c.sessions, (unsigned long long)c.data_bytes,
               (unsigned long long)fi.bytes, (unsigned long long)fi.checksum,
               (unsigned long long)digest);
        return EXIT_OK;
    }
    char when[64] = "?";
    time_t t = (time_t)(fi.created_ns / 1000000000ULL);
    struct tm tm;
    if (gmtime_r(&t, &tm) != NULL)
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("file          %s\nreplica       %u\nprotocol      %s\nindex         %llu\n"
           "created       %s\npairs         %llu\nsessions      %llu\ndata_bytes    %llu\n"
           "stream_bytes  %llu\nchecksum      %016llx (ok)\npairs_digest  %016llx\n",
           path, fi.replica, proto, (unsigned long long)fi.index, when, (unsigned long long)c.pairs,
           (unsigned long long)c.sessions, (unsigned long long)c.data_bytes,
           (unsigned long long)fi.bytes, (unsigned long long)fi.checksum,
           (unsigned long long)digest);
    return EXIT_OK;
}

int cli_snapshot(flowkv *kv, int argc, char **argv, uint64_t timeout_ns, int json)
{
    if (argc >= 2 && argc <= 3 && strcmp(argv[0], "save") == 0 && kv != NULL)
        return save(kv, argv[1], argc == 3 ? argv[2] : NULL, timeout_ns, json);
    if (argc == 2 && strcmp(argv[0], "status") == 0)
        return status(argv[1], json);
    fprintf(stderr, "flowkv: snapshot takes save FILE [REPLICA] or status FILE\n");
    return EXIT_USAGE;
}
