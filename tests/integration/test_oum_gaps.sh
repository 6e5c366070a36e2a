#!/usr/bin/env bash
# test_oum_gaps.sh: gap agreement observable in the product (issue 27 item
# 4). A 3-replica NOPaxos cluster on loopback serves kv_history's clients,
# whose kv.oum sources leave out each sequenced segment at each replica
# with probability 5% (FLOWKV_FLOW_DROP_ORDERED, flows/README.md: a lossy
# network dropping ordered multicast messages). The replicas must report
# the gaps (flowkv_oum_gaps_total), the leader must have decided slots by
# gap agreement (flowkv_nop_gap_noops_total, NOPaxos section 5.2.2), no
# operation fails and the history is linearizable. Every wait is bounded;
# the replicas are stopped by PID.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac # the test works in its own directory
# shellcheck disable=SC2034 # SERVER and CLI: for tests/cluster/cluster-lib.sh
SERVER=$B/bin/flowkv-server CLI=$B/bin/flowkv
HIST=$B/tests-aux/kv_history
WORK=$(mktemp -d /tmp/fkgaps.XXXXXX)
declare -A PID
cleanup() {
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
export FLOWKV_LOG=${FLOWKV_LOG:-warn}
. "$ROOT/tests/cluster/cluster-lib.sh"

d=$WORK/c
fk_local_conf "$d/cluster.conf" nopaxos async "$(fk_base_port)"
cd "$d" || exit 1
for i in 0 1 2; do start "$d" "$i" --new-cluster; done
if ! wait_serving "$d"; then
    t_fail "the cluster serves" "$(tail -n 5 "$d"/log*)"
    t_done
fi
before=0
for i in 0 1 2; do before=$((before + $(metric "$d" "$i" flowkv_oum_gaps_total))); done

FLOWKV_FLOW_DROP_ORDERED=0.05 timeout 60 "$HIST" "$d/cluster.conf" run "$d/hist" --clients 4 \
    --keys 8 --seconds 8 --timeout-ms 5000 >"$d/hist.out" 2>&1
rc=$?
failed=$(sed -n 's/.*failed=\([0-9]*\).*/\1/p' "$d/hist.out" | head -n 1)
ops=$(sed -n 's/.*ops=\([0-9]*\).*/\1/p' "$d/hist.out" | head -n 1)
if [ "$rc" = 0 ] && [ "${failed:-x}" = 0 ] && [ "${ops:-0}" -gt 100 ]; then
    t_ok "no operation failed with 5% of ordered segments dropped ($ops answered)"
else
    t_fail "no failed operation with ordered segments dropped" "rc=$rc $(head -c 300 "$d/hist.out")"
fi
t_check "the history with ordered segments dropped is linearizable" "$HIST" check "$d/hist"

gaps=0
per=""
for i in 0 1 2; do
    g=$(metric "$d" "$i" flowkv_oum_gaps_total)
    gaps=$((gaps + g))
    per="$per $i:$g"
done
gaps=$((gaps - before))
leader=$(leader_of "$d")
noops=$(metric "$d" "${leader:-0}" flowkv_nop_gap_noops_total)
if [ "$gaps" -gt 0 ]; then
    t_ok "the replicas reported $gaps gaps in flowkv_oum_gaps_total (per replica:$per)"
else
    t_fail "the replicas reported the gaps" "flowkv_oum_gaps_total:$per"
fi
if [ "${noops:-0}" -gt 0 ]; then
    t_ok "the leader (replica $leader) decided $noops slots by gap agreement (flowkv_nop_gap_noops_total)"
else
    t_fail "the leader decided slots by gap agreement" "leader ${leader:-?}: flowkv_nop_gap_noops_total=${noops:-0}"
fi
for i in 0 1 2; do stop "$d" "$i" TERM >/dev/null; done
t_done
