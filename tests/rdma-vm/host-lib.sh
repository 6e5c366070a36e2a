# shellcheck shell=bash
# tests/rdma-vm/host-lib.sh: for host-side shell tests that run checks in
# the rdma-vm guest. Source it after tests/lib.sh, then:
#
#   rdma_vm_checks LABEL SECS CMD [ARG...]
#
# boots the VM (tests/rdma-vm/vm.sh run -t SECS), runs CMD there, and turns
# every "ok [N] - NAME" / "not ok [N] - NAME: WHY" line CMD printed (the
# format of tests/lib.sh, tests/check.h and tests/run.sh) into t_ok/t_fail
# here, so they count in the `N passed, M failed` summary. Adds one check
# "LABEL: VM boots and runs" first; a VM without a result fails it, never
# skips. A non-zero exit of CMD with no failed line is one more failure.
# The guest output and console stay in $RDMA_VM_LAST_OUT (a directory under
# build/rdma-vm/runs/); every guest line is also printed with "# vm| ".
# CMD must write nothing under the repository (read-only in the guest):
# use $RDMA_OUT or /tmp, e.g. TEST_LOG_DIR=$RDMA_OUT/logs for tests/run.sh.

rdma_vm__here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

rdma_vm_checks() {
    local label=$1 secs=$2 repo cache out rc start n fails_before=$t__fail
    shift 2
    repo=$(cd "$rdma_vm__here/../.." && pwd)
    cache=${RDMA_VM_DIR:-$repo/build/rdma-vm}
    out=$cache/runs/test-$(date +%Y%m%d-%H%M%S)-$$-$RANDOM
    mkdir -p "$out"
    # Keep the newest 10 test runs (names sort by time).
    ls -1d "$cache"/runs/test-*/ 2>/dev/null | sort | head -n -10 |
        while read -r d; do rm -rf "$d"; done
    RDMA_VM_LAST_OUT=$out
    start=$(date +%s)
    "$rdma_vm__here/vm.sh" run -t "$secs" -o "$out" "$@" >"$out/host.log" 2>&1
    rc=$?
    sed 's/^/# vm| /' "$out/host.log"
    if [ ! -s "$out/rc" ]; then
        t_fail "$label: VM boots and runs" \
            "no result after $(($(date +%s) - start))s (vm.sh status $rc); see $out/console.log"
        return 1
    fi
    t_ok "$label: VM boots and runs ($(($(date +%s) - start))s, $(cat "$out/kernel" 2>/dev/null))"
    t_replay "" "$out/output.log" quiet # its other lines are above, as "# vm| ..."
    n=$T_REPLAYED
    if [ "$n" -eq 0 ]; then
        t_fail "$label: guest reported its checks" "no ok/not ok lines in $out/output.log"
    elif [ "$(cat "$out/rc")" != 0 ] && [ "$t__fail" -eq "$fails_before" ]; then
        t_fail "$label: exit status in the VM" "$* exited with $(cat "$out/rc") without a failed check"
    fi
    [ "$t__fail" -eq "$fails_before" ]
}
