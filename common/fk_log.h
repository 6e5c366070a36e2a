/*
 * fk_log.h: leveled logging to stderr.
 *
 * One line per call, written with a single write(2) so lines from several
 * threads or processes sharing stderr never interleave mid-line. Format:
 *   2026-11-22T03:21:45.123456Z W flows: message text
 * (UTC wall time, level letter, component, message). Under journald
 * (JOURNAL_STREAM names the output: a systemd service's stderr) the time
 * is journald's own and each line starts with its syslog priority instead,
 * "<4>W flows: message text" (sd-daemon(3)), so `journalctl -p err` works.
 *
 * The threshold comes from fk_log_set_level() or, at first use, from the
 * FLOWKV_LOG environment variable (error|warn|info|debug|trace; default info).
 *
 * Thread safety: every function may be called from any thread. The level is
 * an atomic; changing it while others log is allowed.
 */
#ifndef FK_LOG_H
#define FK_LOG_H

#include <stdarg.h>

enum fk_log_level {
    FK_LOG_ERROR = 0,
    FK_LOG_WARN = 1,
    FK_LOG_INFO = 2,
    FK_LOG_DEBUG = 3,
    FK_LOG_TRACE = 4,
};

/* Sets the threshold: messages above it are dropped cheaply. */
void fk_log_set_level(enum fk_log_level level);

/* Returns the current threshold (reading FLOWKV_LOG on first call). */
enum fk_log_level fk_log_get_level(void);

/* Parses "error", "warn", "info", "debug" or "trace" (case-insensitive).
 * Returns the level, or FK_EINVAL for anything else. */
int fk_log_parse_level(const char *name);

/* Redirects output to fd (default 2). For tests that capture log lines. */
void fk_log_set_fd(int fd);

/* Emits one line if level is at or below the threshold. component is a short
 * module name ("flows", "mpx"); fmt is printf-style. Lines longer than
 * FK_LOG_LINE_MAX bytes are truncated and end in "...". */
void fk_log(enum fk_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void fk_vlog(enum fk_log_level level, const char *component, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

#define FK_LOG_LINE_MAX 1024

/* Convenience macros; the level check is inlined so disabled levels cost a
 * load and a branch, and the arguments are not evaluated. */
#define FK_LOG__AT(lvl, comp, ...)                                                                 \
    do {                                                                                           \
        if ((lvl) <= fk_log_get_level())                                                           \
            fk_log((lvl), (comp), __VA_ARGS__);                                                    \
    } while (0)
#define fk_error(comp, ...) FK_LOG__AT(FK_LOG_ERROR, comp, __VA_ARGS__)
#define fk_warn(comp, ...)  FK_LOG__AT(FK_LOG_WARN, comp, __VA_ARGS__)
#define fk_info(comp, ...)  FK_LOG__AT(FK_LOG_INFO, comp, __VA_ARGS__)
#define fk_debug(comp, ...) FK_LOG__AT(FK_LOG_DEBUG, comp, __VA_ARGS__)
#define fk_trace(comp, ...) FK_LOG__AT(FK_LOG_TRACE, comp, __VA_ARGS__)

#endif /* FK_LOG_H */
