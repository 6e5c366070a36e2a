#!/usr/bin/env bash
# Proves that the harness can fail: a program whose tests fail, crash, abort
# and hang must be reported test by test, counted, and turn the run red.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
build=${BUILD:-build}
prog=$build/tests-aux/check_failing
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$prog" ]; then
    t_fail "selftest program built" "$prog is missing"
    t_done
fi

CHECK_TIMEOUT=1 TEST_LOG_DIR=$tmp "$here/../run.sh" -t 60 "$prog" >"$tmp/out" 2>&1
rc=$?

expect() { # NAME PATTERN
    if grep -qE "$2" "$tmp/out"; then t_ok "$1"; else t_fail "$1" "no line matching '$2'"; fi
}
expect "passing test reported ok" '^ok 1 - passes'
expect "failed CHECK names expression and values" \
    '^not ok 2 - check_fails: .*check_failing.c:[0-9]+: two \+ 2 == 5: 4 != 5'
expect "crash reported with its signal" '^not ok 3 - crashes: (killed by signal 11|exited with status [1-9].*sanitizer)'
expect "abort reported" '^not ok 4 - aborts: killed by signal 6'
expect "hang reported as timeout" '^not ok 5 - hangs: killed by signal 14 .*timed out'
expect "a hang with SIGALRM blocked and a forked child holding the output is ended" \
    '^not ok 6 - hangs_with_a_child: killed by signal 9 .*timed out'
expect "summary counts" '^1 passed, 5 failed$'
if [ "$rc" -ne 0 ]; then t_ok "run.sh exits non-zero"; else t_fail "run.sh exits non-zero" "rc=0"; fi

# A program that dies without a summary counts as a failure too.
printf '#!/bin/sh\necho partial\nexit 3\n' >"$tmp/dies"
chmod +x "$tmp/dies"
TEST_LOG_DIR=$tmp "$here/../run.sh" -t 60 "$tmp/dies" >"$tmp/out2" 2>&1
rc=$?
if grep -q '^0 passed, 1 failed$' "$tmp/out2" && [ "$rc" -ne 0 ]; then
    t_ok "program without summary fails"
else
    t_fail "program without summary fails" "$(tail -n 2 "$tmp/out2" | tr '\n' ' ') rc=$rc"
fi
# A run with no tests at all is a failure.
TEST_LOG_DIR=$tmp "$here/../run.sh" >"$tmp/out3" 2>&1
if [ $? -ne 0 ] && grep -q '^0 passed, 0 failed$' "$tmp/out3"; then
    t_ok "empty run fails"
else
    t_fail "empty run fails" "$(tail -n 1 "$tmp/out3")"
fi
t_done
