#!/usr/bin/env bash
# tests/rdma-vm/verbs_suite.sh: the fabric and flows test programs over the
# verbs backend, inside the rdma-vm guest (vm.sh run; see
# tests/integration/test_rdma_verbs.sh). Prints one "ok N - ..." line per
# test of every program (tests/lib.sh format), then the verbs counters.
#
#   verbs_suite.sh BUILD_DIR
#
# What runs where (hosts as in vm.sh: A = rxe0 on vethA 10.77.0.1, B = rxe1
# on vethB 10.77.0.2, both in the guest's root network namespace; rxe
# cannot work in another namespace on this kernel, MULTICAST.md):
#   1. On host A alone (FLOWKV_RDMA_DEVICE=rxe0): test_fab_verbs,
#      test_fab_ops and the test_flow_* programs that create their nodes
#      themselves (api, elastic, msg), with FLOWKV_FABRIC=verbs.
#      They create nodes on the default address, which the verbs backend
#      maps to rxe0's 10.77.0.1; rxe loops same-device traffic back
#      internally.
#   2. Across the wire: test_fab_verbs_pair with one process on A and one
#      on B, then the flows suite's cross-process scenarios (test_flow_shuffle
#      and test_flow_replicate: every ft_run) with their source processes
#      and the declaring node on A (FLOWTEST_SOURCE_HOST) and their target
#      processes on B (FLOWTEST_TARGET_HOST; tests/flows/flowtest.h); the
#      verbs backend picks the device that owns each address. vethA's
#      transmit counter must grow for each (RoCE packets on the wire).
#   3. Every verbs node appends its counters to one file
#      (FLOWKV_FAB_COUNTERS); the totals are printed and the run fails if
#      no RDMA WRITE, READ or FETCH_AND_ADD was posted.
#
# Guest tweaks: rdma_guest_setup (guest-lib.sh): MTU 9000 and the
#   same-host rules; step 2 checks cross-host traffic still crosses the
#   wire.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
build=${1:?usage: verbs_suite.sh BUILD_DIR}
[ "${RDMA_VM:-0}" = 1 ] || { echo "verbs_suite.sh: runs only inside the VM" >&2; exit 2; }
per_prog=${VERBS_PROG_SECS:-150}

. "$here/guest-lib.sh"
if rdma_guest_setup; then
    t_ok "guest setup for verbs (MTU 9000, same-host rules)"
else
    t_fail "guest setup for verbs" "ip link/rule failed"
fi

export FLOWKV_FABRIC=verbs FLOWKV_LOG=${FLOWKV_LOG:-warn}
export FLOWKV_FAB_COUNTERS=$RDMA_OUT/fab-counters.txt
export CHECK_TIMEOUT=${CHECK_TIMEOUT:-90}
rm -f "$FLOWKV_FAB_COUNTERS"
mkdir -p "$RDMA_OUT/logs"

# run_prog LABEL PROG: runs one test program (bounded) and replays each of
# its "ok"/"not ok" lines as a check named "LABEL: PROG: test".
run_prog() {
    local label=$1 prog=$2 name log rc start n=0 line
    name=$(basename "$prog")
    log=$RDMA_OUT/logs/$label-$name.log
    start=$(date +%s)
    timeout --kill-after=5 "$per_prog" "$prog" >"$log" 2>&1
    rc=$?
    while IFS= read -r line; do
        if [[ $line =~ ^ok\ [0-9]+\ -\ (.*)$ ]]; then
            t_ok "$label / $name / ${BASH_REMATCH[1]}"
            n=$((n + 1))
        elif [[ $line =~ ^not\ ok\ [0-9]+\ -\ (.*)$ ]]; then
            t_fail "$label / $name / ${BASH_REMATCH[1]%%: *}" "${BASH_REMATCH[1]#*: }"
            n=$((n + 1))
        fi
    done <"$log"
    echo "# $label: $name exited $rc after $(($(date +%s) - start))s"
    if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then
        t_fail "$label / $name" "exited $rc with no result (see $log)"
        tail -n 20 "$log" | sed 's/^/#   /'
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        t_fail "$label / $name finished" "killed after ${per_prog}s"
    fi
}

# 1. One host (rxe0). The flows programs whose scenarios all go through
# ft_run run across the two hosts instead (step 2).
cross=(test_flow_shuffle test_flow_replicate)
progs=("$build/tests/test_fab_verbs" "$build/tests/test_fab_ops")
for p in "$build"/tests/test_flow_*; do
    [[ -x $p && " ${cross[*]} " != *" ${p##*/} "* ]] && progs+=("$p")
done
for p in "${progs[@]}"; do
    FLOWKV_RDMA_DEVICE=$RDMA_DEV_A run_prog "rxe0" "$p"
done

# 2. Two hosts across the wire.
tx() { cat "/sys/class/net/$RDMA_IF_A/statistics/tx_packets"; }

# across LABEL PROG: runs PROG (already placed on the two hosts by its
# environment) and checks that A sent at least 400 packets on the wire.
across() {
    local label=$1 prog=$2 before sent
    before=$(tx)
    run_prog "$label" "$prog"
    sent=$(($(tx) - before))
    if [ "$sent" -ge 400 ]; then
        t_ok "$label: $(basename "$prog") crossed the veth wire ($sent packets sent by $RDMA_IF_A)"
    else
        t_fail "$label: $(basename "$prog") crossed the veth wire" "$RDMA_IF_A sent only $sent packets"
    fi
}
across "rxe0<->rxe1" "$build/tests/test_fab_verbs_pair"
for p in "${cross[@]}"; do
    FLOWTEST_SOURCE_HOST=$RDMA_IP_A FLOWTEST_TARGET_HOST=$RDMA_IP_B \
        across "rxe0-sources-to-rxe1-targets" "$build/tests/$p"
done

# 3. Counters of every verbs node that was destroyed cleanly.
if [ -s "$FLOWKV_FAB_COUNTERS" ]; then
    totals=$(awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] != "pid" && kv[1] != "addr") s[kv[1]] += kv[2] } }
        END { printf "nodes=%d", NR; for (k in s) printf " %s=%d", k, s[k]; printf "\n" }' \
        "$FLOWKV_FAB_COUNTERS")
else
    totals="nodes=0"
fi
echo "verbs-counters: $totals"
for op in write read faa; do
    v=$(tr ' ' '\n' <<<"$totals" | awk -F= -v k="$op" '$1 == k { print $2 }')
    if [ "${v:-0}" -gt 0 ]; then
        t_ok "RDMA ${op^^} work requests posted ($v)"
    else
        t_fail "RDMA ${op^^} work requests posted" "counter $op is ${v:-0}"
    fi
done
t_done
