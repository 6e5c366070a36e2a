#!/usr/bin/env bash
# tests/run.sh: runs test programs and prints one summary for all of them.
#
# Usage: tests/run.sh [-t SECONDS] PROGRAM...
# Each PROGRAM is a test binary built on tests/check.h or a script sourcing
# tests/lib.sh; both print "# check: NAME passed=P failed=F" (a shell test
# that could not run some checks here adds " skipped=S", after a line
# "# skipped: S (WHY)"). A program that
# crashes, times out (default 600 s each), or exits non-zero without
# reporting a failure counts as one failure, so nothing can pass by dying.
# Output of each program goes to the terminal and to $TEST_LOG_DIR/NAME.log.
# The last line is "N passed, M failed", with ", K skipped (WHY: PROGRAMS)"
# when checks were skipped; the exit status is 1 when M > 0 or when N is 0.
set -u

limit=600
if [ "${1:-}" = "-t" ]; then
    limit=$2
    shift 2
fi
logdir=${TEST_LOG_DIR:-build/test-logs}
mkdir -p "$logdir"
# Under ThreadSanitizer (make tsan): tests/tsan.supp, which lists only
# uninstrumented third-party libraries and says why.
if [ "${SAN:-}" = thread ]; then
    TSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/tsan.supp ${TSAN_OPTIONS:-}"
    export TSAN_OPTIONS
fi

# Every replica a test starts checks its protocol core's invariants ten
# times a second (server/srv_node.c), as the simulator checks them after
# every step: a violation aborts the replica and fails its test.
export FLOWKV_CHECK_INVARIANTS=1

total_pass=0
total_fail=0
total_skip=0
skip_why=""
failed_programs=()

for prog in "$@"; do
    name=$(basename "$prog")
    log="$logdir/$name.log"
    echo "== $name"
    start=$(date +%s)
    # --kill-after: a program that ignores SIGTERM is still gone 10 s later.
    timeout --kill-after=10 "$limit" "$prog" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    secs=$(( $(date +%s) - start ))
    line=$(grep -E '^# check: .* passed=[0-9]+ failed=[0-9]+( skipped=[0-9]+)?$' "$log" | tail -n 1)
    s=0
    if [[ $line =~ \ skipped=([0-9]+)$ ]]; then
        s=${BASH_REMATCH[1]}
        line=${line% skipped=*}
        skip_why="$skip_why${skip_why:+; }$(sed -n 's/^# skipped: [0-9]* (\(.*\))$/\1/p' "$log" | tail -n 1): $name"
    fi
    if [ -z "$line" ]; then
        p=0
        f=1
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "not ok - $name: timed out after ${limit}s without a summary"
        else
            echo "not ok - $name: exited with status $rc without a summary"
        fi
    else
        p=$(sed -E 's/.* passed=([0-9]+) failed=([0-9]+)$/\1/' <<<"$line")
        f=$(sed -E 's/.* passed=([0-9]+) failed=([0-9]+)$/\2/' <<<"$line")
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "not ok - $name: exited with status $rc after reporting no failure"
            f=1
        fi
    fi
    echo "== $name: $p passed, $f failed${s:+$([ "$s" -gt 0 ] && echo ", $s skipped")} (${secs}s)"
    total_skip=$((total_skip + s))
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    if [ "$f" -gt 0 ]; then
        failed_programs+=("$name")
    fi
done

if [ "$total_fail" -gt 0 ]; then
    echo "failed programs: ${failed_programs[*]} (logs in $logdir)"
fi
if [ "$total_skip" -gt 0 ]; then
    echo "$total_pass passed, $total_fail failed, $total_skip skipped ($skip_why)"
else
    echo "$total_pass passed, $total_fail failed"
fi
if [ "$total_fail" -gt 0 ] || [ "$total_pass" -eq 0 ]; then
    exit 1
fi
exit 0
