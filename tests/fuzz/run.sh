#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR: runs every fuzz target in BUILD_DIR/fuzz for
# FUZZ_SECONDS each (default 60), keeping a corpus per target under
# BUILD_DIR/corpus/NAME (seeded from tests/fuzz/corpus/NAME when present)
# and any crashing input under BUILD_DIR/crashes/. Prints one t_ok/t_fail
# line per target in the tests/lib.sh format and exits non-zero on a crash.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
build=${1:?usage: run.sh BUILD_DIR}
secs=${FUZZ_SECONDS:-60}
mkdir -p "$build/crashes"
progs=$(ls "$build"/fuzz/fuzz_* 2>/dev/null)
if [ -z "$progs" ]; then
    t_fail "fuzz targets built" "no programs in $build/fuzz"
    t_done
fi
for prog in $progs; do
    name=$(basename "$prog")
    corpus="$build/corpus/$name"
    mkdir -p "$corpus"
    seeds="$here/corpus/$name"
    [ -d "$seeds" ] || seeds=""
    log="$build/$name.log"
    # -rss_limit_mb bounds memory; timeout backs up -max_total_time.
    timeout --kill-after=10 $((secs + 60)) "$prog" -max_total_time="$secs" -rss_limit_mb=2048 \
        -timeout=10 -artifact_prefix="$build/crashes/$name-" -print_final_stats=1 \
        "$corpus" $seeds >"$log" 2>&1
    rc=$?
    runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$')
    if [ "$rc" -eq 0 ]; then
        t_ok "$name: ${runs:-?} inputs in ${secs}s, no crash"
    else
        t_fail "$name" "exit $rc; see $log: $(grep -m1 -E 'ERROR|SUMMARY|deadly' "$log")"
    fi
done
t_done
