#!/usr/bin/env bash
# The Soft-RoCE tier: boots the rdma-vm guest (tests/rdma-vm/vm.sh) and runs
# tests/rdma-vm/checks.sh in it: two rxe devices on the two ends of a veth
# wire, with RDMA WRITE, READ and FETCH_AND_ADD between them. Each check
# made inside the guest is reported here as one check; a VM that does not
# boot or gives no result is a failure, never a skip.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
repo=$(cd "$here/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac
cache=${RDMA_VM_DIR:-$repo/build/rdma-vm}
out=$cache/runs/test-$(date +%Y%m%d-%H%M%S)-$$

# The UD multicast check needs the probe program (make tests builds it).
probe=$build/tests-aux/rdma_mcast_probe
if [ ! -x "$probe" ]; then
    t_fail "multicast probe built" "$probe is missing (make tests)"
    t_done
fi

mkdir -p "$out"
# Keep the newest 10 test runs (names sort by time).
ls -1d "$cache"/runs/test-*/ 2>/dev/null | sort | head -n -10 | while read -r d; do rm -rf "$d"; done
start=$(date +%s)
"$repo/tests/rdma-vm/vm.sh" run -t 300 -o "$out" "$repo/tests/rdma-vm/checks.sh" "$probe" \
    >"$out/host.log" 2>&1
rc=$?
secs=$(($(date +%s) - start))
sed 's/^/# vm| /' "$out/host.log" 2>/dev/null

if [ ! -s "$out/rc" ]; then
    t_fail "VM boots and runs the checks" "no result after ${secs}s (vm.sh status $rc); see $out/console.log"
    t_done
fi
t_ok "VM boots and runs the checks (${secs}s, $(cat "$out/kernel" 2>/dev/null))"

# Replay the guest's results line by line.
n=0
while IFS= read -r line; do
    if [[ $line =~ ^ok\ [0-9]+\ -\ (.*)$ ]]; then
        t_ok "${BASH_REMATCH[1]}"
        n=$((n + 1))
    elif [[ $line =~ ^not\ ok\ [0-9]+\ -\ ([^:]*):\ (.*)$ ]]; then
        t_fail "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        n=$((n + 1))
    fi
done <"$out/output.log"
if [ "$n" -eq 0 ]; then
    t_fail "guest reported its checks" "no ok/not ok lines in $out/output.log"
fi
if [ "$(cat "$out/rc")" != 0 ] && [ "$t__fail" -eq 0 ]; then
    t_fail "guest checks exit status" "checks.sh exited with $(cat "$out/rc") without a failed check"
fi
t_done
