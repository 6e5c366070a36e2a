#!/usr/bin/env bash
# The verbs backend on Soft-RoCE: boots the rdma-vm guest
# (tests/rdma-vm/vm.sh) and runs tests/rdma-vm/verbs_suite.sh there: the
# fabric and flows test programs with FLOWKV_FABRIC=verbs on rxe0, then
# across the veth wire between the two hosts the two-process pair test and
# the flows suite's cross-process scenarios (test_flow_shuffle and
# test_flow_replicate, sources on rxe0's 10.77.0.1, targets on rxe1's
# 10.77.0.2), and the work-request counters (fails if no RDMA WRITE, READ or FETCH_AND_ADD was
# posted). Every guest check counts here; a VM that does not boot or gives
# no result is a failure, never a skip.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
repo=$(cd "$here/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac
cache=${RDMA_VM_DIR:-$repo/build/rdma-vm}
out=$cache/runs/verbs-$(date +%Y%m%d-%H%M%S)-$$

for p in test_fab_verbs test_fab_verbs_pair test_fab_ops; do
    if [ ! -x "$build/tests/$p" ]; then
        t_fail "$p built" "$build/tests/$p is missing (make tests)"
        t_done
    fi
done

mkdir -p "$out"
ls -1d "$cache"/runs/verbs-*/ 2>/dev/null | sort | head -n -5 | while read -r d; do rm -rf "$d"; done
start=$(date +%s)
"$repo/tests/rdma-vm/vm.sh" run -t "${RDMA_VERBS_SECS:-420}" -o "$out" \
    "$repo/tests/rdma-vm/verbs_suite.sh" "$build" >"$out/host.log" 2>&1
rc=$?
secs=$(($(date +%s) - start))
if [ ! -s "$out/rc" ]; then
    sed 's/^/# vm| /' "$out/host.log"
    t_fail "VM boots and runs the verbs suite" \
        "no result after ${secs}s (vm.sh status $rc); see $out/console.log"
    t_done
fi
t_ok "VM boots and runs the verbs suite (${secs}s, $(cat "$out/kernel" 2>/dev/null))"

# Replay the guest's checks; show its comments and the counters line.
t_replay "verbs: " "$out/output.log"
n=$T_REPLAYED
[ "$n" -gt 0 ] || t_fail "guest reported its checks" "no ok/not ok lines in $out/output.log"
if [ "$(cat "$out/rc")" != 0 ] && [ "$t__fail" -eq 0 ]; then
    t_fail "guest suite exit status" "verbs_suite.sh exited $(cat "$out/rc") without a failed check"
fi
t_done
