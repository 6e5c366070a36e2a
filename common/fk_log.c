/* fk_log.c: leveled logging, one write(2) per line. */
#include "fk_log.h"

#include "fk_assert.h"
#include "fk_error.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* -1 until the first read, when FLOWKV_LOG decides the threshold. */
static _Atomic int fk__level = -1;
static _Atomic int fk__fd = 2;
/* -1 until the first line: whether fk__fd is journald's stream. */
static _Atomic int fk__journal = -1;

static const char fk__letters[] = {'E', 'W', 'I', 'D', 'T'};
static const char *const fk__names[] = {"error", "warn", "info", "debug", "trace"};
/* syslog priorities (sd-daemon(3), "<N>" prefixes): err, warning, info,
 * debug, debug. */
static const int fk__prio[] = {3, 4, 6, 7, 7};
_Static_assert(sizeof(fk__letters) == FK_LOG_TRACE + 1, "one letter per level");

int fk_log_parse_level(const char *name)
{
    if (name == NULL)
        return FK_EINVAL;
    for (int i = 0; i <= FK_LOG_TRACE; i++)
        if (strcasecmp(name, fk__names[i]) == 0)
            return i;
    return FK_EINVAL;
}

void fk_log_set_level(enum fk_log_level level)
{
    if (level > FK_LOG_TRACE)
        level = FK_LOG_TRACE;
    atomic_store_explicit(&fk__level, (int)level, memory_order_relaxed);
}

enum fk_log_level fk_log_get_level(void)
{
    int lvl = atomic_load_explicit(&fk__level, memory_order_relaxed);
    if (lvl >= 0)
        return (enum fk_log_level)lvl;
    int parsed = fk_log_parse_level(getenv("FLOWKV_LOG"));
    lvl = parsed >= 0 ? parsed : FK_LOG_INFO;
    /* A concurrent first call computes the same value; a concurrent
     * fk_log_set_level wins because we only replace the -1. */
    int expected = -1;
    atomic_compare_exchange_strong(&fk__level, &expected, lvl);
    return (enum fk_log_level)atomic_load_explicit(&fk__level, memory_order_relaxed);
}

void fk_log_set_fd(int fd)
{
    atomic_store_explicit(&fk__fd, fd, memory_order_relaxed);
    atomic_store_explicit(&fk__journal, -1, memory_order_relaxed);
}

/* systemd connects a service's stderr to journald and sets JOURNAL_STREAM
 * to that stream's "device:inode" (systemd.exec(5)); it is journald's only
 * if fd is still that file, not one the process was redirected to. */
static int fk__is_journal(int fd)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long dev, ino;
    struct stat st;
    if (js == NULL || sscanf(js, "%lu:%lu", &dev, &ino) != 2 || fstat(fd, &st) != 0)
        return 0;
    return (unsigned long)st.st_dev == dev && (unsigned long)st.st_ino == ino;
}

void fk_vlog(enum fk_log_level level, const char *component, const char *fmt, va_list ap)
{
    if (level > fk_log_get_level())
        return;
    if (level > FK_LOG_TRACE)
        level = FK_LOG_TRACE;
    char line[FK_LOG_LINE_MAX];
    int fd = atomic_load_explicit(&fk__fd, memory_order_relaxed);
    int journal = atomic_load_explicit(&fk__journal, memory_order_relaxed);
    if (journal < 0) {
        journal = fk__is_journal(fd);
        atomic_store_explicit(&fk__journal, journal, memory_order_relaxed);
    }
    int n;
    if (journal) { /* journald stamps the time and reads the priority */
        n = snprintf(line, sizeof line, "<%d>%c %s: ", fk__prio[level], fk__letters[level],
                     component ? component : "-");
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof line,
                     "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ %c %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000,
                     fk__letters[level], component ? component : "-");
    }
    if (n < 0)
        return;
    size_t len = (size_t)n;
    if (len < sizeof line - 1) {
        int m = vsnprintf(line + len, sizeof line - len, fmt, ap);
        if (m > 0)
            len += (size_t)m;
    }
    if (len >= sizeof line - 1) {
        /* Truncated: mark it so a reader knows the line is incomplete. */
        len = sizeof line - 1;
        line[len - 4] = '.';
        line[len - 3] = '.';
        line[len - 2] = '.';
        len--;
    }
    line[len++] = '\n';
    const char *p = line;
    /* Bounded: at most a few retries on EINTR or short writes. */
    for (int tries = 0; tries < 8 && len > 0; tries++) {
        ssize_t w = write(fd, p, len);
        if (w > 0) {
            p += w;
            len -= (size_t)w;
        }
    }
}

void fk_log(enum fk_log_level level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fk_vlog(level, component, fmt, ap);
    va_end(ap);
}

/* FK_ASSERT's failure (fk_assert.h): logged like any error line, then
 * abort(). */
_Noreturn void fk__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fk_log(FK_LOG_ERROR, "assert", "assertion failed: %s (%s:%d, %s)", expr, file, line, func);
    abort();
}
