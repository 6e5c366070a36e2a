#!/usr/bin/env bash
# The Soft-RoCE tier: boots the rdma-vm guest (tests/rdma-vm/vm.sh) and runs
# tests/rdma-vm/checks.sh in it: two rxe devices on the two ends of a veth
# wire, with RDMA WRITE, READ and FETCH_AND_ADD and UD multicast between
# them. Each check made inside the guest is reported here as one check; a VM
# that does not boot or gives no result is a failure, never a skip.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
. "$here/../rdma-vm/host-lib.sh"
repo=$(cd "$here/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac

# The UD multicast check needs the probe program (make tests builds it).
probe=$build/tests-aux/rdma_mcast_probe
if [ ! -x "$probe" ]; then
    t_fail "multicast probe built" "$probe is missing (make tests)"
    t_done
fi
rdma_vm_checks "soft-roce" 300 "$repo/tests/rdma-vm/checks.sh" "$probe"
t_done
