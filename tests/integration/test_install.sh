#!/usr/bin/env bash
# test_install.sh: `make install DESTDIR=... PREFIX=...` lays out what a user
# gets (the programs, libflowkv.a and libflowkv.so.0, flowkv.h and
# fk_error.h, flowkv.pc), and a program built only from the installed files,
# with `pkg-config --cflags --libs flowkv` (the shared library, by its
# soname) and with `--static` and the archive (-l:libflowkv.a), talks to a
# real 3-replica cluster started from the installed flowkv-server. Every process started
# here is stopped by PID; every wait is bounded.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-build}
WORK=$(mktemp -d /tmp/fkinstall.XXXXXX)
DEST=$WORK/dest
PREFIX=/opt/flowkv
declare -a PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

if make -s -C "$ROOT" --no-print-directory BUILD="$B" SAN="${SAN:-}" DESTDIR="$DEST" PREFIX="$PREFIX" install \
    >"$WORK/install.log" 2>&1; then
    t_ok "make install DESTDIR PREFIX"
else
    t_fail "make install DESTDIR PREFIX" "$(tail -n 3 "$WORK/install.log")"
    t_done
fi
missing=""
for f in bin/flowkv-server bin/flowkv bin/flowkv-ycsb lib/libflowkv.a lib/libflowkv.so \
    lib/libflowkv.so.0 include/flowkv/flowkv.h include/flowkv/fk_error.h lib/pkgconfig/flowkv.pc; do
    [ -e "$DEST$PREFIX/$f" ] || missing="$missing $f"
done
[ -z "$missing" ] && t_ok "installed layout under DESTDIR/PREFIX" ||
    t_fail "installed layout" "missing:$missing"

cat >"$WORK/app.c" <<'C'
#include <flowkv.h>
#include <fk_error.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    flowkv *kv;
    char err[256], val[64];
    size_t n;
    int rc = flowkv_open(argv[1], NULL, &kv, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    rc = flowkv_put(kv, "installed", 9, "yes", 3);
    if (rc == 0)
        rc = flowkv_get(kv, "installed", 9, val, sizeof val, &n);
    if (rc == 0 && (n != 3 || memcmp(val, "yes", 3) != 0))
        rc = FK_EPROTO;
    printf("%s %s\n", rc == 0 ? "ok" : fk_strerror(rc), flowkv_version());
    flowkv_close(kv);
    return rc == 0 ? 0 : 1;
}
C
export PKG_CONFIG_PATH=$DEST$PREFIX/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$DEST
san=${SAN:+-fsanitize=$SAN}
# The archive: --static for the private dependencies, -l:libflowkv.a for
# the archive itself (with both installed, -lflowkv finds the shared one).
if cc -std=gnu11 $san -o "$WORK/app" "$WORK/app.c" \
    $(pkg-config --cflags --libs --static flowkv | sed 's/-lflowkv/-l:libflowkv.a/') \
    >"$WORK/cc.log" 2>&1 && ! readelf -d "$WORK/app" | grep -q 'NEEDED.*libflowkv'; then
    t_ok "a program builds from the installed files with pkg-config --static flowkv and the archive"
else
    t_fail "build against the installed library" "$(tail -n 5 "$WORK/cc.log")"
    t_done
fi
# The shared library: linked by its soname, found at run time from the
# installed lib directory.
if cc -std=gnu11 $san -o "$WORK/app-so" "$WORK/app.c" $(pkg-config --cflags --libs flowkv) \
    >"$WORK/cc-so.log" 2>&1 && readelf -d "$WORK/app-so" | grep -q 'NEEDED.*\[libflowkv\.so\.0\]'; then
    t_ok "a program builds with pkg-config --libs flowkv against libflowkv.so.0"
else
    t_fail "build against the installed shared library" "$(tail -n 5 "$WORK/cc-so.log")"
fi

fk_local_conf "$WORK/cluster.conf" multipaxos sync "$(fk_base_port)"
for i in 0 1 2; do
    FLOWKV_LOG=warn "$DEST$PREFIX/bin/flowkv-server" -c "$WORK/cluster.conf" -i $i --new-cluster \
        >"$WORK/log$i" 2>&1 &
    PIDS+=($!)
done
out=""
v=$("$DEST$PREFIX/bin/flowkv" --version | awk '{ print $2 }')
for _ in $(seq 40); do
    out=$(timeout 20 "$WORK/app" "$WORK/cluster.conf" 2>&1) && break
    sleep 0.5
done
[ "$out" = "ok $v" ] && t_ok "the installed library puts and gets on a cluster of installed replicas (flowkv_version $v)" ||
    t_fail "installed library against installed replicas" "$out; $(tail -n 2 "$WORK/log0")"
out=$(LD_LIBRARY_PATH=$DEST$PREFIX/lib timeout 20 "$WORK/app-so" "$WORK/cluster.conf" 2>&1)
[ "$out" = "ok $v" ] && t_ok "the shared library puts and gets there too" ||
    t_fail "the shared library against installed replicas" "$out"
# `make run` installs the build set alone (deploy/deps.sh build): no test
# or benchmark tool; `make deps` (and so `make test`) installs them all.
build_set=$("$ROOT/deploy/deps.sh" --list build)
all_set=$("$ROOT/deploy/deps.sh" --list all)
extra=""
for p in qemu-system-x86 clang etcd-server gnuplot-nox perftest cppcheck; do
    grep -qx "$p" <<<"$build_set" && extra="$extra $p"
    grep -qx "$p" <<<"$all_set" || extra="$extra (all lacks $p)"
done
if [ -z "$extra" ] && grep -qx build-essential <<<"$build_set" && grep -qx liblmdb-dev <<<"$build_set" &&
    make -C "$ROOT" -n run 2>/dev/null | grep -q 'deploy/deps.sh build'; then
    t_ok "make run installs the build packages alone ($(wc -l <<<"$build_set") of $(wc -l <<<"$all_set"))"
else
    t_fail "make run's packages" "build set has:$extra; make -n run: $(make -C "$ROOT" -n run 2>&1 | grep deps.sh)"
fi
t_done
