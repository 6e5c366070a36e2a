#!/usr/bin/env bash
# ThreadSanitizer in every `make test`: builds the test programs with
# -fsanitize=thread in their own tree (build/tsan, as `make tsan` does) and
# runs every unit test program there: the fabric and flows tests run the
# progress thread, waiting threads and several nodes per process on the tcp
# fabric, and the rest would report a race in anything they share. Each
# program must pass with no ThreadSanitizer report; tests/tsan.supp drops
# only reports from inside gRPC and abseil (uninstrumented, and why).
# `make tsan` runs the whole suite, the Soft-RoCE tier included, under the
# same sanitizer.
set -u
. "$(dirname "$0")/../lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
tree=${TSAN_BUILD:-$root/build/tsan}

if ! out=$(make -s -C "$root" --no-print-directory BUILD="$tree" SAN=thread tests 2>&1); then
    t_fail "test programs build with -fsanitize=thread" "$(tail -n 5 <<<"$out" | tr '\n' ' ')"
    t_done
fi
t_ok "test programs build with -fsanitize=thread in $tree"

export TSAN_OPTIONS="suppressions=$root/tests/tsan.supp halt_on_error=1 ${TSAN_OPTIONS:-}"
logs=$tree/test-logs
mkdir -p "$logs"
for prog in "$tree"/tests/test_*; do
    [ -x "$prog" ] || continue
    name=$(basename "$prog")
    timeout --kill-after=10 600 "$prog" >"$logs/$name.log" 2>&1
    rc=$?
    summary=$(grep -E '^# check: .* passed=[0-9]+ failed=0$' "$logs/$name.log" | tail -n 1)
    if [ $rc -eq 0 ] && [ -n "$summary" ] && ! grep -q "ThreadSanitizer" "$logs/$name.log"; then
        t_ok "$name under ThreadSanitizer: ${summary#\# check: }"
    else
        t_fail "$name under ThreadSanitizer" \
            "exit $rc; $(grep -m1 -A3 "WARNING: ThreadSanitizer" "$logs/$name.log" | tr '\n' ' ')$(
                tail -n 2 "$logs/$name.log" | tr '\n' ' ') (log: $logs/$name.log)"
    fi
done
t_done
