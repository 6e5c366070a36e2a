/* Unit tests for ycsb/ycsb_props: java.util.Properties syntax, -p overrides,
 * flowkv-ycsb's command line and the shipped workload files. */
#include "check.h"
#include "fk_error.h"
#include "ycsb_props.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ycsb_props props;
static char err[YCSB_ERR_MAX];

static int load(const char *text)
{
    ycsb_props_free(&props);
    return ycsb_props_load(&props, text, strlen(text), "t.properties", err, sizeof err);
}

#define CHECK_PROP(name, want) CHECK_EQ_STR(ycsb_props_get(&props, name), want)

TEST(props_separators_and_comments)
{
    CHECK_OK(load("# a comment\n"
                  "! another comment\n"
                  "\n"
                  "   \t\n"
                  "a=1\n"
                  "b:2\n"
                  "c 3\n"
                  "  d  =  4\n"
                  "e\t:\t5\n"
                  "f    = =6\n"
                  "g=\n"
                  "h\n"
                  "i = trailing  \n"
                  "a=override\n"));
    CHECK_PROP("a", "override");
    CHECK_PROP("b", "2");
    CHECK_PROP("c", "3");
    CHECK_PROP("d", "4");
    CHECK_PROP("e", "5");
    CHECK_PROP("f", "=6"); /* only one separator is skipped */
    CHECK_PROP("g", "");
    CHECK_PROP("h", "");
    CHECK_PROP("i", "trailing  "); /* Java keeps trailing blanks */
    CHECK(ycsb_props_get(&props, "# a comment") == NULL);
    CHECK(ycsb_props_get(&props, "missing") == NULL);
    CHECK_EQ_U64(props.n, 9);
}

TEST(props_continuations_and_line_ends)
{
    CHECK_OK(load("long = one, \\\n"
                  "       two, \\\r\n"
                  "       three\r\n"
                  "cr=x\rlf=y\n"
                  "even=a\\\\\n"
                  "next=z\n"
                  "# comment \\\n"
                  "after=comment\n"
                  "hash=#not a comment\n"
                  "eof=tail\\"));
    CHECK_PROP("long", "one, two, three");
    CHECK_PROP("cr", "x");
    CHECK_PROP("lf", "y");
    CHECK_PROP("even", "a\\"); /* two backslashes: one escaped, no continuation */
    CHECK_PROP("next", "z");
    CHECK_PROP("after", "comment"); /* a comment line never continues */
    CHECK_PROP("hash", "#not a comment");
    CHECK_PROP("eof", "tail"); /* Java drops a backslash at the end of input */
}

TEST(props_escapes)
{
    CHECK_OK(load("key\\ with\\ spaces = v\n"
                  "colon\\:key=v2\n"
                  "tab=a\\tb\n"
                  "nl=a\\nb\n"
                  "uni=\\u0041\\u00e9\\u20AC\n"
                  "other=\\q\\=\n"));
    CHECK_PROP("key with spaces", "v");
    CHECK_PROP("colon:key", "v2");
    CHECK_PROP("tab", "a\tb");
    CHECK_PROP("nl", "a\nb");
    CHECK_PROP("uni", "A\xC3\xA9\xE2\x82\xAC"); /* written as UTF-8 */
    CHECK_PROP("other", "q=");
}

TEST(props_malformed_unicode)
{
    CHECK_ERR(load("ok=1\n\nbad=\\u12x4\n"), FK_EMALFORMED);
    CHECK_MSG(strstr(err, "t.properties:3") != NULL, "message: %s", err);
    CHECK(strstr(err, "malformed") != NULL);
    CHECK_PROP("ok", "1"); /* lines before the error are kept */
    CHECK_ERR(load("short=\\u12"), FK_EMALFORMED);
}

TEST(props_set_arg)
{
    ycsb_props_free(&props);
    CHECK_OK(ycsb_props_set_arg(&props, "recordcount=100", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "a=b=c", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "empty=", err, sizeof err));
    CHECK_OK(ycsb_props_set_arg(&props, "sp= x ", err, sizeof err));
    CHECK_PROP("recordcount", "100");
    CHECK_PROP("a", "b=c");
    CHECK_PROP("empty", "");
    CHECK_PROP("sp", " x ");
    CHECK_ERR(ycsb_props_set_arg(&props, "noequals", err, sizeof err), FK_EINVAL);
    CHECK(strstr(err, "key=value") != NULL);
    CHECK_ERR(ycsb_props_set_arg(&props, "=x", err, sizeof err), FK_EINVAL);
}

TEST(props_capacity_and_merge)
{
    ycsb_props_free(&props);
    char name[32];
    for (int i = 0; i < YCSB_PROPS_MAX; i++) {
        snprintf(name, sizeof name, "p%d", i);
        CHECK_OK(ycsb_props_set(&props, name, "v"));
    }
    CHECK_ERR(ycsb_props_set(&props, "one-too-many", "v"), FK_EFULL);
    CHECK_OK(ycsb_props_set(&props, "p7", "replaced")); /* existing names still work */
    CHECK_PROP("p7", "replaced");
    static struct ycsb_props b;
    ycsb_props_init(&b);
    CHECK_OK(ycsb_props_set(&b, "p1", "from-b"));
    CHECK_OK(ycsb_props_merge(&props, &b));
    CHECK_PROP("p1", "from-b");
    ycsb_props_free(&b);
    CHECK_ERR(ycsb_props_set(&props, NULL, "v"), FK_EINVAL);
}

TEST(props_file_errors)
{
    ycsb_props_free(&props);
    CHECK_ERR(ycsb_props_load_file(&props, "/nonexistent/workload", err, sizeof err), -ENOENT);
    CHECK(strstr(err, "Unable to open the properties file /nonexistent/workload") != NULL);
}

static const char *workload_path(const char *name, char *buf, size_t len)
{
    const char *dir = getenv("YCSB_WORKLOADS");
    snprintf(buf, len, "%s/%s", dir ? dir : "ycsb/workloads", name);
    return buf;
}

/* The shipped files carry YCSB's settings (workloads/ in YCSB's repository). */
TEST(workload_files_as_ycsb)
{
    static const struct {
        const char *file, *name, *value;
    } want[] = {
        {"workloada", "readproportion", "0.5"},
        {"workloada", "updateproportion", "0.5"},
        {"workloada", "requestdistribution", "zipfian"},
        {"workloadb", "readproportion", "0.95"},
        {"workloadb", "updateproportion", "0.05"},
        {"workloadc", "readproportion", "1"},
        {"workloadd", "insertproportion", "0.05"},
        {"workloadd", "requestdistribution", "latest"},
        {"workloade", "scanproportion", "0.95"},
        {"workloade", "maxscanlength", "100"},
        {"workloade", "scanlengthdistribution", "uniform"},
        {"workloadf", "readmodifywriteproportion", "0.5"},
        {"workloadf", "readproportion", "0.5"},
        {"workload_dfi_b", "fieldcount", "1"},
        {"workload_dfi_b", "fieldlength", "64"},
        {"workload_dfi_b", "readproportion", "0.95"},
        {"workload_dfi_b", "requestdistribution", "zipfian"},
    };
    char path[512];
    const char *files[] = {"workloada", "workloadb", "workloadc",     "workloadd",
                           "workloade", "workloadf", "workload_dfi_b"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        ycsb_props_free(&props);
        CHECK_MSG(ycsb_props_load_file(&props, workload_path(files[f], path, sizeof path), err,
                                       sizeof err) == 0,
                  "%s", err);
        CHECK_PROP("recordcount", "1000");
        CHECK_PROP("operationcount", "1000");
        CHECK_PROP("workload", "site.ycsb.workloads.CoreWorkload");
        CHECK_PROP("readallfields", "true");
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            if (strcmp(want[i].file, files[f]) == 0)
                CHECK_EQ_STR(ycsb_props_get(&props, want[i].name), want[i].value);
    }
}

/* ---- command line -------------------------------------------------------- */

static int cli(struct ycsb_cli *c, int argc, char *const argv[])
{
    ycsb_props_free(&props);
    return ycsb_cli_parse(argc, argv, &props, c, err, sizeof err);
}

TEST(cli_options)
{
    char path[] = "/tmp/ycsb_cli_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *text = "recordcount=10\noperationcount=20\nthreadcount=9\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    struct ycsb_cli c;
    /* -p before -P still wins, as YCSB applies the command line last. */
    char *const argv[] = {"flowkv-ycsb", "run",  "-p",       "operationcount=99",
                          "-P",          path,   "-threads", "4",
                          "-target",     "1500", "-s",       "-l",
                          "lbl",         "-db",  "flowkv",   "--dry-run"};
    int rc = cli(&c, (int)(sizeof argv / sizeof argv[0]), argv);
    unlink(path);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(c.dry_run);
    CHECK(!c.help);
    CHECK_PROP("dotransactions", "true");
    CHECK_PROP("recordcount", "10");
    CHECK_PROP("operationcount", "99");
    CHECK_PROP("threadcount", "4"); /* -threads beats the file's threadcount */
    CHECK_PROP("target", "1500");
    CHECK_PROP("status", "true");
    CHECK_PROP("label", "lbl");
    CHECK_PROP("db", "flowkv");
    char *const load[] = {"flowkv-ycsb", "load"};
    CHECK_OK(cli(&c, 2, load));
    CHECK_PROP("dotransactions", "false");
    char *const yload[] = {"flowkv-ycsb", "-load", "-h"};
    CHECK_OK(cli(&c, 3, yload));
    CHECK_PROP("dotransactions", "false");
    CHECK(c.help);
    /* YCSB's `ycsb load DB`: the word after the verb names the binding;
     * --version is a flag. */
    char *const ydb[] = {"flowkv-ycsb", "load", "etcd", "-threads", "2", "--version"};
    CHECK_OK(cli(&c, 6, ydb));
    CHECK_PROP("db", "etcd");
    CHECK_PROP("dotransactions", "false");
    CHECK(c.version);
    char *const rdb[] = {"flowkv-ycsb", "run", "flowkv"};
    CHECK_OK(cli(&c, 3, rdb));
    CHECK_PROP("db", "flowkv");
    CHECK(!c.version);
}

TEST(cli_errors)
{
    struct ycsb_cli c;
    char *const unknown[] = {"flowkv-ycsb", "run", "-x"};
    CHECK_ERR(cli(&c, 3, unknown), FK_EINVAL);
    CHECK(strstr(err, "Unknown option -x") != NULL);
    char *const missing[] = {"flowkv-ycsb", "run", "-threads"};
    CHECK_ERR(cli(&c, 3, missing), FK_EINVAL);
    CHECK(strstr(err, "Missing argument value for -threads") != NULL);
    char *const badint[] = {"flowkv-ycsb", "-threads", "four"};
    CHECK_ERR(cli(&c, 3, badint), FK_EINVAL);
    CHECK(strstr(err, "-threads") != NULL);
    char *const negative[] = {"flowkv-ycsb", "-target", "-5"};
    CHECK_ERR(cli(&c, 3, negative), FK_EINVAL);
    char *const late[] = {"flowkv-ycsb", "-s", "run"};
    CHECK_ERR(cli(&c, 3, late), FK_EINVAL);
    char *const badp[] = {"flowkv-ycsb", "-p", "novalue"};
    CHECK_ERR(cli(&c, 3, badp), FK_EINVAL);
    char *const nofile[] = {"flowkv-ycsb", "-P", "/nonexistent/w"};
    CHECK_ERR(cli(&c, 3, nofile), -ENOENT);
}

CHECK_MAIN()
