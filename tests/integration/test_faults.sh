#!/usr/bin/env bash
# test_faults.sh: the fault-injection suite (tests/faults/). For Multi-Paxos
# and NOPaxos, each scenario of tests/faults/scenarios.sh on a fresh
# 3-replica cluster whose replicas and client live in their own network
# namespaces (tests/faults/netns.sh): leader crash, follower crash and
# restart from disk, leader partitioned into a minority, the client cut
# off from the leader alone, packet loss on every host, packet delay on
# every host, sequencer failover, whole-cluster restart. One check per
# scenario and protocol, naming the operations completed, the
# unavailability window and the violations (must be 0); a table of them
# closes the output. Needs root, ip netns, nft and iptables-legacy: without
# them every scenario fails (nothing is skipped).
#
# FX_ONLY=REGEX runs only the PROTO:SCENARIO pairs it matches, e.g.
# FX_ONLY='nopaxos:leader-crash'; the knobs of scenarios.sh apply.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
KV=$B/tests-aux/kv_check
KVH=$B/tests-aux/kv_history
NFQ=$B/tests-aux/nfq_delay
. "$ROOT/tests/faults/netns.sh"
. "$ROOT/tests/faults/scenarios.sh"

FX_RUNID=$$
FX_WORK=$(mktemp -d /tmp/fkfaults.XXXXXX)
FX_KEEP=${TEST_LOG_DIR:-$B/test-logs}/faults
rm -rf "$FX_KEEP"
# bash reports each replica killed here ("line N: PID Killed ...") on its
# stderr, at a moment of its choosing: the shell's own stderr goes to a file,
# shown at the end without those reports.
exec 3>&2 2>"$FX_WORK/shell.err"
cleanup() {
    fx__teardown "$FX_WORK/none" 1 >/dev/null 2>&1
    nsc_down
    grep -v '^[^ ]*: line [0-9]*: *[0-9]* Killed ' "$FX_WORK/shell.err" >&3
    rm -rf "$FX_WORK"
}
trap cleanup EXIT
# run.sh's timeout sends SIGTERM: leave through the EXIT trap.
trap 'exit 143' TERM INT
export FLOWKV_LOG=${FLOWKV_LOG:-info}

missing=""
for tool in ip nft iptables-legacy timeout; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done
for prog in "$SERVER" "$CLI" "$KV" "$KVH" "$NFQ"; do [ -x "$prog" ] || missing="$missing $prog"; done
# Network namespaces and nftables need root. Not root: the scenarios are
# skipped, each counted, and make test's last line says so ("K skipped
# (need root ...)"). (The suite is not run through sudo: its processes
# would be root's, beyond what this user may end by PID.)
noroot=""
[ "$(id -u)" -eq 0 ] || noroot=1
[ -n "$noroot" ] || nsc_reap_stale

start=$SECONDS
for proto in multipaxos nopaxos; do
    for sc in $FX_SCENARIOS; do
        [[ "$proto:$sc" =~ ${FX_ONLY:-.} ]] || continue
        if [ -n "$noroot" ]; then
            t_skip "$proto: $(fx__label "$proto" "$sc")" "need root: network namespaces, nftables"
            continue
        fi
        if [ -n "$missing" ]; then
            t_fail "$proto: $(fx__label "$proto" "$sc")" "cannot run: missing$missing"
            continue
        fi
        fx_run "$proto" "$sc"
    done
done
fx_table
echo "# faults suite: $((SECONDS - start)) s; failed scenarios keep their logs in $FX_KEEP"
t_done
