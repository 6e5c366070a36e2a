#!/usr/bin/env bash
# test_rolling_restart.sh: `flowkv-deploy restart` (issue 28 item 4)
# restarts a deployed 3-replica cluster one replica at a time, followers
# first and the leader last, each waited for until it serves again, while
# kv_history's clients run: for each protocol, no operation fails (each
# client waits up to 5 s, the library's default, for an answer), the
# history is linearizable, and the longest time no client got an answer
# during the restart is printed (the unavailability figure). Runs through
# the deploy script's local runner (test_deploy.sh); every process is
# stopped by the script's own down, then by PID from its pid files.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=$ROOT/deploy/flowkv-deploy
B=${BUILD:-$ROOT/build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
HIST=$B/tests-aux/kv_history
WORK=$(mktemp -d /tmp/fkrolling.XXXXXX)
histpid=""
cleanup() {
    [ -n "$histpid" ] && kill -KILL "$histpid" 2>/dev/null
    for f in "$WORK"/*/hosts/*/run/flowkv-*.pid; do
        [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
export FLOWKV_LOG=warn

for proto in multipaxos nopaxos; do
    w=$WORK/$proto
    mkdir -p "$w"
    fk_deploy_conf "$w/cluster.conf" "$proto" sync "$(fk_base_port)" rolling-test-token-012345
    dep() { timeout 240 "$D" -c "$w/cluster.conf" --runner local --root "$w/hosts" "$@"; }
    if ! out=$(dep up 2>&1); then
        t_fail "$proto: flowkv-deploy up" "$(tail -n 3 <<<"$out")"
        continue
    fi
    "$HIST" "$w/cluster.conf" run "$w/hist" --clients 4 --keys 8 --seconds 30 --timeout-ms 5000 \
        >"$w/hist.out" 2>&1 &
    histpid=$!
    sleep 2
    t0=$("$HIST" now)
    dep restart >"$w/restart.out" 2>&1
    rc=$?
    t1=$("$HIST" now)
    if [ "$rc" = 0 ] && [ "$(grep -c 'serves again after' "$w/restart.out")" = 3 ] &&
        [ "$(grep 'restarting replica' "$w/restart.out" | tail -n 1 | grep -c 'the leader')" = 1 ]; then
        t_ok "$proto: flowkv-deploy restart, the leader last: $(grep -o 'replica [0-9] serves again after [0-9]* ms' "$w/restart.out" | tr '\n' ',' | sed 's/,$//')"
    else
        t_fail "$proto: flowkv-deploy restart" "rc=$rc $(tail -n 3 "$w/restart.out" | tr '\n' ' ')"
    fi
    wait "$histpid"
    histpid=""
    failed=$(sed -n 's/.*failed=\([0-9]*\).*/\1/p' "$w/hist.out" | head -n 1)
    ops=$(sed -n 's/.*ops=\([0-9]*\).*/\1/p' "$w/hist.out" | head -n 1)
    if [ "${failed:-x}" = 0 ] && [ "${ops:-0}" -gt 0 ]; then
        t_ok "$proto: no operation failed during the rolling restart ($ops answered)"
    else
        t_fail "$proto: no failed operation" "$(head -c 300 "$w/hist.out")"
    fi
    t_check "$proto: the history through the rolling restart is linearizable" "$HIST" check "$w/hist"
    g=$(hist_gap "$w/hist" "$t0" "$t1")
    t_ok "$proto: unavailability during the rolling restart: longest time without an answer ${g} (restart took $(((t1 - t0) / 1000000)) ms)"
    dep down >/dev/null 2>&1
done
t_done
