/* Unit tests for common/fk_log: levels, parsing, line format, truncation. */
#include "check.h"
#include "fk_error.h"
#include "fk_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Logs through a pipe and returns what arrived (static buffer). */
static const char *capture(enum fk_log_level lvl, const char *msg)
{
    static char buf[4096];
    int p[2];
    CHECK(pipe(p) == 0);
    fk_log_set_fd(p[1]);
    fk_log(lvl, "test", "%s", msg);
    close(p[1]);
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    fk_log_set_fd(2);
    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

TEST(log_parse_level)
{
    CHECK_EQ_I64(fk_log_parse_level("error"), FK_LOG_ERROR);
    CHECK_EQ_I64(fk_log_parse_level("WARN"), FK_LOG_WARN);
    CHECK_EQ_I64(fk_log_parse_level("Debug"), FK_LOG_DEBUG);
    CHECK_EQ_I64(fk_log_parse_level("trace"), FK_LOG_TRACE);
    CHECK_ERR(fk_log_parse_level("loud"), FK_EINVAL);
    CHECK_ERR(fk_log_parse_level(NULL), FK_EINVAL);
}

TEST(log_env_sets_default_level)
{
    /* Runs in a fresh child: the level has not been read yet. */
    setenv("FLOWKV_LOG", "debug", 1);
    CHECK_EQ_I64(fk_log_get_level(), FK_LOG_DEBUG);
}

TEST(log_line_format_and_threshold)
{
    fk_log_set_level(FK_LOG_INFO);
    const char *out = capture(FK_LOG_WARN, "disk is slow");
    /* 2026-11-22T03:21:45.123456Z W test: disk is slow\n */
    CHECK_MSG(strlen(out) > 28 && out[4] == '-' && out[10] == 'T' && out[26] == 'Z',
              "bad timestamp in '%s'", out);
    CHECK_MSG(strstr(out, " W test: disk is slow\n") != NULL, "bad line '%s'", out);
    CHECK_EQ_STR(capture(FK_LOG_DEBUG, "hidden"), "");
    fk_log_set_level(FK_LOG_TRACE);
    CHECK(strstr(capture(FK_LOG_TRACE, "shown"), " T test: shown\n") != NULL);
}

/* Under journald (JOURNAL_STREAM names the output stream) a line starts
 * with its syslog priority and carries no timestamp; an output that is
 * not the named stream keeps the plain format. */
TEST(log_journald_priority_prefix)
{
    fk_log_set_level(FK_LOG_DEBUG);
    static char buf[4096];
    int p[2];
    CHECK(pipe(p) == 0);
    struct stat st;
    CHECK(fstat(p[1], &st) == 0);
    char js[64];
    snprintf(js, sizeof js, "%lu:%lu", (unsigned long)st.st_dev, (unsigned long)st.st_ino);
    setenv("JOURNAL_STREAM", js, 1);
    fk_log_set_fd(p[1]);
    fk_log(FK_LOG_ERROR, "disk", "%s", "fsync failed");
    fk_log(FK_LOG_WARN, "net", "%s", "slow peer");
    fk_log(FK_LOG_INFO, "node", "%s", "serving");
    fk_log(FK_LOG_DEBUG, "flows", "%s", "detail");
    close(p[1]);
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    buf[n > 0 ? n : 0] = '\0';
    CHECK_EQ_STR(buf, "<3>E disk: fsync failed\n<4>W net: slow peer\n<6>I node: serving\n"
                      "<7>D flows: detail\n");
    /* Another stream (a redirect): the plain line with its timestamp. */
    const char *out = capture(FK_LOG_WARN, "elsewhere");
    CHECK_MSG(out[0] != '<' && out[26] == 'Z', "journald format on another stream: '%s'", out);
    unsetenv("JOURNAL_STREAM");
}

TEST(log_long_line_is_truncated_with_marker)
{
    fk_log_set_level(FK_LOG_INFO);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const char *out = capture(FK_LOG_ERROR, big);
    size_t len = strlen(out);
    CHECK_EQ_U64(len, FK_LOG_LINE_MAX - 1);
    CHECK_MSG(strcmp(out + len - 4, "...\n") == 0, "no truncation marker at '%s'", out + len - 8);
}

TEST(log_macros_skip_argument_evaluation)
{
    fk_log_set_level(FK_LOG_ERROR);
    int evaluated = 0;
    fk_debug("test", "%d", ++evaluated);
    CHECK_EQ_I64(evaluated, 0);
}

CHECK_MAIN()
