/*
 * ycsb_props.h: YCSB's configuration: Java properties files (-P), name=value
 * overrides (-p) and the command line of flowkv-ycsb.
 *
 * The file syntax is java.util.Properties.load's, so YCSB workload files work
 * unchanged:
 *   - natural lines end in \n, \r or \r\n; leading blanks (space, tab, form
 *     feed) are skipped; a line whose first non-blank is '#' or '!' is a
 *     comment; blank lines are ignored;
 *   - a line ending in an odd number of backslashes continues on the next
 *     line, whose leading blanks are skipped (comments cannot continue);
 *   - the key ends at the first unescaped '=', ':' or blank; blanks, then one
 *     optional '=' or ':', then blanks separate it from the value; the value
 *     keeps its trailing blanks (as Java does);
 *   - escapes: \t \n \r \f, \uXXXX (written here as UTF-8), and a backslash
 *     before any other character stands for that character;
 *   - a later definition of a key replaces the earlier one.
 * One difference: Java reads files as ISO-8859-1; we keep bytes as they are,
 * so UTF-8 text passes through unchanged.
 *
 * Memory: a property set is a fixed table of YCSB_PROPS_MAX entries whose
 * names and values are heap strings; it is built once at startup, never on a
 * hot path. Threads: a set belongs to one thread while it is being built and
 * may be read by any thread afterwards.
 */
#ifndef YCSB_PROPS_H
#define YCSB_PROPS_H

#include <stdbool.h>
#include <stddef.h>

#define YCSB_PROPS_MAX      512
#define YCSB_PROPS_FILE_MAX (1u << 20) /* bytes in one -P file */
#define YCSB_ERR_MAX        256        /* enough for every message we write */

struct ycsb_prop {
    char *name;
    char *value;
};

struct ycsb_props {
    unsigned n;
    struct ycsb_prop item[YCSB_PROPS_MAX];
};

/* Empties p (no allocation). */
void ycsb_props_init(struct ycsb_props *p);
/* Frees every string; p is empty afterwards and may be reused. */
void ycsb_props_free(struct ycsb_props *p);

/* Sets name to value (both copied). Returns 0, FK_EINVAL for a NULL
 * argument, FK_EFULL when YCSB_PROPS_MAX names exist, or -ENOMEM. */
int ycsb_props_set(struct ycsb_props *p, const char *name, const char *value);

/* The value of name, or NULL. The string belongs to p and lives until the
 * name is set again or p is freed. */
const char *ycsb_props_get(const struct ycsb_props *p, const char *name);

/* Copies every property of src into dst, replacing dst's values. Returns 0 or
 * an error of ycsb_props_set. */
int ycsb_props_merge(struct ycsb_props *dst, const struct ycsb_props *src);

/* Parses len bytes of properties text (need not be NUL-terminated). source
 * names the text in error messages. Returns 0; FK_EMALFORMED for a bad
 * \uXXXX escape (err says "<source>:<line>: malformed \uxxxx encoding");
 * or an error of ycsb_props_set. On error p keeps the properties before the
 * bad line. err (errlen bytes, may be NULL) receives a message. */
int ycsb_props_load(struct ycsb_props *p, const char *text, size_t len, const char *source,
                    char *err, size_t errlen);

/* Loads a file (at most YCSB_PROPS_FILE_MAX bytes). Returns 0, -errno when it
 * cannot be read ("Unable to open the properties file <path>"), FK_ETOOBIG,
 * or an error of ycsb_props_load. */
int ycsb_props_load_file(struct ycsb_props *p, const char *path, char *err, size_t errlen);

/* Applies one "-p name=value" argument: the name is everything before the
 * first '=', the value everything after (no trimming, as YCSB's Client).
 * Returns 0, FK_EINVAL when there is no '=' or the name is empty, or an
 * error of ycsb_props_set. */
int ycsb_props_set_arg(struct ycsb_props *p, const char *arg, char *err, size_t errlen);

/* ---- command line -------------------------------------------------------- */

struct ycsb_cli {
    bool dry_run; /* --dry-run: print the operation stream, do not connect */
    bool help;    /* -h or --help */
    bool version; /* --version */
};

/* Parses flowkv-ycsb's command line into props, following YCSB's Client:
 *   [load|run [DB]] then any of: -load, -t, -threads N, -target N, -s, -db NAME,
 *   -l LABEL, -P FILE (loaded in order), -p NAME=VALUE, --dry-run, -h.
 * "load" and -load set dotransactions=false, "run" and -t set it to true;
 * -threads, -target, -s, -db, -l set threadcount, target, status=true, db,
 * label. Properties from the command line (-p and the flags) override those
 * of every -P file, whatever their order, as in YCSB. argv[0] is skipped.
 * Returns 0, or FK_EINVAL (unknown option, missing value, -threads or
 * -target not a non-negative int) or a load error, with a message in err. */
int ycsb_cli_parse(int argc, char *const argv[], struct ycsb_props *props, struct ycsb_cli *cli,
                   char *err, size_t errlen);

#endif /* YCSB_PROPS_H */
