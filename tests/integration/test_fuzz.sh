#!/usr/bin/env bash
# A short fuzzing round inside `make test`: builds the libFuzzer targets
# (tests/fuzz) and runs each for FUZZ_SECONDS (default 20 here). `make fuzz`
# runs longer campaigns.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../lib.sh"
if ! make -C "$root" --no-print-directory -s fuzz-build >"$root/build/fuzz-build.log" 2>&1; then
    t_fail "fuzz targets build" "$(tail -n 5 "$root/build/fuzz-build.log" | tr '\n' ' ')"
    t_done
fi
cd "$root" && T_NAME=test_fuzz.sh FUZZ_SECONDS=${FUZZ_SECONDS:-20} exec tests/fuzz/run.sh build/fuzz
