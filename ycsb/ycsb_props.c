/* ycsb_props.c: java.util.Properties syntax and YCSB's command line. */
#include "ycsb_props.h"

#include "fk_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((format(printf, 3, 4))) static void seterr(char *err, size_t errlen, const char *fmt,
                                                         ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void ycsb_props_init(struct ycsb_props *p)
{
    p->n = 0;
}

void ycsb_props_free(struct ycsb_props *p)
{
    for (unsigned i = 0; i < p->n; i++) {
        free(p->item[i].name);
        free(p->item[i].value);
    }
    p->n = 0;
}

static struct ycsb_prop *find(const struct ycsb_props *p, const char *name)
{
    for (unsigned i = 0; i < p->n; i++)
        if (strcmp(p->item[i].name, name) == 0)
            return (struct ycsb_prop *)&p->item[i];
    return NULL;
}

int ycsb_props_set(struct ycsb_props *p, const char *name, const char *value)
{
    if (p == NULL || name == NULL || value == NULL)
        return FK_EINVAL;
    char *v = strdup(value);
    if (v == NULL)
        return -ENOMEM;
    struct ycsb_prop *it = find(p, name);
    if (it != NULL) {
        free(it->value);
        it->value = v;
        return 0;
    }
    if (p->n == YCSB_PROPS_MAX) {
        free(v);
        return FK_EFULL;
    }
    char *k = strdup(name);
    if (k == NULL) {
        free(v);
        return -ENOMEM;
    }
    p->item[p->n].name = k;
    p->item[p->n].value = v;
    p->n++;
    return 0;
}

const char *ycsb_props_get(const struct ycsb_props *p, const char *name)
{
    const struct ycsb_prop *it = find(p, name);
    return it ? it->value : NULL;
}

int ycsb_props_merge(struct ycsb_props *dst, const struct ycsb_props *src)
{
    for (unsigned i = 0; i < src->n; i++) {
        int rc = ycsb_props_set(dst, src->item[i].name, src->item[i].value);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- the properties file syntax ------------------------------------------ */

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\f';
}

static int is_eol(char c)
{
    return c == '\n' || c == '\r';
}

struct reader {
    const char *t;
    size_t n, pos;
    size_t start; /* offset of the current logical line, for line numbers */
};

/* Copies the next logical line (continuations joined, still escaped) into
 * buf; Properties.LineReader.readLine. Returns its length, or -1 at the end.
 * buf holds at least r->n bytes, which bounds every logical line. */
static long read_line(struct reader *r, char *buf)
{
    size_t len = 0;
    int skip_ws = 1, new_line = 1, backslash = 0, appended = 0;
    while (r->pos < r->n) {
        char c = r->t[r->pos++];
        if (skip_ws) {
            if (is_blank(c) || (!appended && is_eol(c)))
                continue;
            skip_ws = 0;
            appended = 0;
        }
        if (new_line) {
            new_line = 0;
            r->start = r->pos - 1;
            if (c == '#' || c == '!') {
                while (r->pos < r->n && !is_eol(r->t[r->pos]))
                    r->pos++;
                skip_ws = new_line = 1;
                continue;
            }
        }
        if (!is_eol(c)) {
            buf[len++] = c;
            backslash = c == '\\' ? !backslash : 0;
            continue;
        }
        if (!backslash)
            return (long)len;
        /* An odd number of backslashes: the line continues. */
        len--;
        backslash = 0;
        skip_ws = appended = 1;
        if (c == '\r' && r->pos < r->n && r->t[r->pos] == '\n')
            r->pos++;
    }
    if (len == 0)
        return -1;
    return (long)(backslash ? len - 1 : len); /* Java drops a final backslash */
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Properties.loadConvert: unescapes in[0, n) into out (NUL-terminated; out
 * holds n + 1 bytes: no escape grows, "\uXXXX" is 6 bytes in and at most 3
 * out). Returns 0 or FK_EMALFORMED. */
static int unescape(const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        char c = in[i++];
        if (c != '\\' || i == n) {
            out[o++] = c;
            continue;
        }
        c = in[i++];
        if (c == 'u') {
            unsigned cp = 0;
            for (int k = 0; k < 4; k++) {
                int h = i < n ? hexval(in[i]) : -1;
                if (h < 0)
                    return FK_EMALFORMED;
                cp = cp * 16 + (unsigned)h;
                i++;
            }
            o += put_utf8(out + o, cp);
            continue;
        }
        out[o++] = c == 't' ? '\t' : c == 'r' ? '\r' : c == 'n' ? '\n' : c == 'f' ? '\f' : c;
    }
    out[o] = '\0';
    return 0;
}

static unsigned line_number(const struct reader *r)
{
    unsigned line = 1;
    for (size_t i = 0; i < r->start && i < r->n; i++)
        if (r->t[i] == '\n' || (r->t[i] == '\r' && (i + 1 == r->n || r->t[i + 1] != '\n')))
            line++;
    return line;
}

/* Splits one logical line into key and value and stores them. */
static int store_line(struct ycsb_props *p, const char *line, size_t limit, char *key, char *val)
{
    size_t keylen = 0, vstart = limit;
    int has_sep = 0, backslash = 0;
    for (; keylen < limit; keylen++) {
        char c = line[keylen];
        if ((c == '=' || c == ':') && !backslash) {
            vstart = keylen + 1;
            has_sep = 1;
            break;
        }
        if (is_blank(c) && !backslash) {
            vstart = keylen + 1;
            break;
        }
        backslash = c == '\\' ? !backslash : 0;
    }
    for (; vstart < limit; vstart++) {
        char c = line[vstart];
        if (is_blank(c))
            continue;
        if (!has_sep && (c == '=' || c == ':')) {
            has_sep = 1;
            continue;
        }
        break;
    }
    int rc = unescape(line, keylen, key);
    if (rc == 0)
        rc = unescape(line + vstart, limit - vstart, val);
    if (rc == 0)
        rc = ycsb_props_set(p, key, val);
    return rc;
}

int ycsb_props_load(struct ycsb_props *p, const char *text, size_t len, const char *source,
                    char *err, size_t errlen)
{
    /* One scratch area for the line and its unescaped key and value, each
     * bounded by the text length plus a NUL. */
    size_t cap = len + 1;
    char *buf = malloc(cap * 3);
    if (buf == NULL)
        return -ENOMEM;
    char *key = buf + cap, *val = buf + cap * 2;
    struct reader r = {.t = text, .n = len, .pos = 0, .start = 0};
    int rc = 0;
    long n;
    while ((n = read_line(&r, buf)) >= 0) {
        rc = store_line(p, buf, (size_t)n, key, val);
        if (rc == FK_EMALFORMED) {
            seterr(err, errlen, "%s:%u: malformed \\uxxxx encoding", source, line_number(&r));
            break;
        }
        if (rc < 0) {
            seterr(err, errlen, "%s:%u: cannot store property: %s", source, line_number(&r),
                   fk_strerror(rc));
            break;
        }
    }
    free(buf);
    return rc;
}

int ycsb_props_load_file(struct ycsb_props *p, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        seterr(err, errlen, "Unable to open the properties file %s: %s", path, strerror(e));
        return -e;
    }
    char *text = malloc(YCSB_PROPS_FILE_MAX + 1);
    if (text == NULL) {
        fclose(f);
        return -ENOMEM;
    }
    size_t n = fread(text, 1, YCSB_PROPS_FILE_MAX + 1, f);
    int rc = 0;
    if (ferror(f)) {
        rc = -EIO;
        seterr(err, errlen, "%s: read error", path);
    } else if (n > YCSB_PROPS_FILE_MAX) {
        rc = FK_ETOOBIG;
        seterr(err, errlen, "%s: larger than %u bytes", path, YCSB_PROPS_FILE_MAX);
    } else {
        rc = ycsb_props_load(p, text, n, path, err, errlen);
    }
    free(text);
    fclose(f);
    return rc;
}

int ycsb_props_set_arg(struct ycsb_props *p, const char *arg, char *err, size_t errlen)
{
    const char *eq = strchr(arg, '=');
    if (eq == NULL || eq == arg) {
        seterr(err, errlen,
               "Argument '-p' expected to be in key=value format (e.g., -p "
               "operationcount=99999), got '%s'",
               arg);
        return FK_EINVAL;
    }
    size_t klen = (size_t)(eq - arg);
    char *name = strndup(arg, klen);
    if (name == NULL)
        return -ENOMEM;
    int rc = ycsb_props_set(p, name, eq + 1);
    if (rc < 0)
        seterr(err, errlen, "-p %s: %s", name, fk_strerror(rc));
    free(name);
    return rc;
}

/* ---- command line -------------------------------------------------------- */

/* -threads and -target take Integer.parseInt values; negative makes no
 * sense for either, so it is refused here rather than later. */
static int int_arg(const char *opt, const char *s, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
        seterr(err, errlen, "%s: '%s' is not a non-negative integer", opt, s);
        return FK_EINVAL;
    }
    return 0;
}

/* Options that take a value and the property each one sets (NULL: special). */
static const struct {
    const char *opt;
    const char *prop;
} value_opts[] = {
    {"-threads", "threadcount"},
    {"-target", "target"},
    {"-db", "db"},
    {"-l", "label"},
    {"-P", NULL},
    {"-p", NULL},
};

static int is_value_opt(const char *opt)
{
    for (size_t i = 0; i < sizeof value_opts / sizeof value_opts[0]; i++)
        if (strcmp(opt, value_opts[i].opt) == 0)
            return 1;
    return 0;
}

static int value_opt(const char *opt, const char *val, struct ycsb_props *files,
                     struct ycsb_props *cmd, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof value_opts / sizeof value_opts[0]; i++) {
        if (strcmp(opt, value_opts[i].opt) != 0)
            continue;
        if (strcmp(opt, "-P") == 0)
            return ycsb_props_load_file(files, val, err, errlen);
        if (strcmp(opt, "-p") == 0)
            return ycsb_props_set_arg(cmd, val, err, errlen);
        if (strcmp(opt, "-threads") == 0 || strcmp(opt, "-target") == 0) {
            int rc = int_arg(opt, val, err, errlen);
            if (rc < 0)
                return rc;
        }
        return ycsb_props_set(cmd, value_opts[i].prop, val);
    }
    return 1; /* not a value option */
}

static int flag_opt(const char *opt, struct ycsb_props *cmd, struct ycsb_cli *cli)
{
    if (strcmp(opt, "-load") == 0 || strcmp(opt, "load") == 0)
        return ycsb_props_set(cmd, "dotransactions", "false");
    if (strcmp(opt, "-t") == 0 || strcmp(opt, "run") == 0)
        return ycsb_props_set(cmd, "dotransactions", "true");
    if (strcmp(opt, "-s") == 0)
        return ycsb_props_set(cmd, "status", "true");
    if (strcmp(opt, "--dry-run") == 0) {
        cli->dry_run = true;
        return 0;
    }
    if (strcmp(opt, "-h") == 0 || strcmp(opt, "--help") == 0) {
        cli->help = true;
        return 0;
    }
    if (strcmp(opt, "--version") == 0) {
        cli->version = true;
        return 0;
    }
    return 1; /* not a flag */
}

static int parse_args(int argc, char *const argv[], struct ycsb_props *files,
                      struct ycsb_props *cmd, struct ycsb_cli *cli, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        /* "load" and "run" are verbs only in the first position. */
        if (i > 1 && (strcmp(a, "load") == 0 || strcmp(a, "run") == 0)) {
            seterr(err, errlen, "'%s' must come first", a);
            return FK_EINVAL;
        }
        /* YCSB's own `ycsb load DB ...`: a word after the verb names the
         * binding, as -db does. */
        if (i == 2 && a[0] != '-' &&
            (strcmp(argv[1], "load") == 0 || strcmp(argv[1], "run") == 0)) {
            int rc = ycsb_props_set(cmd, "db", a);
            if (rc < 0)
                return rc;
            continue;
        }
        int rc = flag_opt(a, cmd, cli);
        if (rc <= 0) {
            if (rc < 0)
                seterr(err, errlen, "%s: %s", a, fk_strerror(rc));
            if (rc < 0)
                return rc;
            continue;
        }
        if (!is_value_opt(a)) {
            seterr(err, errlen, "Unknown option %s", a);
            return FK_EINVAL;
        }
        if (i + 1 >= argc) {
            seterr(err, errlen, "Missing argument value for %s", a);
            return FK_EINVAL;
        }
        rc = value_opt(a, argv[i + 1], files, cmd, err, errlen);
        if (rc < 0)
            return rc;
        i++;
    }
    return 0;
}

int ycsb_cli_parse(int argc, char *const argv[], struct ycsb_props *props, struct ycsb_cli *cli,
                   char *err, size_t errlen)
{
    struct ycsb_props *files = malloc(sizeof *files), *cmd = malloc(sizeof *cmd);
    int rc = -ENOMEM;
    cli->dry_run = cli->help = cli->version = false;
    if (files != NULL && cmd != NULL) {
        ycsb_props_init(files);
        ycsb_props_init(cmd);
        rc = parse_args(argc, argv, files, cmd, cli, err, errlen);
        if (rc == 0)
            rc = ycsb_props_merge(props, files);
        if (rc == 0)
            rc = ycsb_props_merge(props, cmd);
        ycsb_props_free(files);
        ycsb_props_free(cmd);
    }
    free(files);
    free(cmd);
    return rc;
}
