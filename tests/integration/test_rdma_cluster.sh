#!/usr/bin/env bash
# The service on Soft-RoCE: boots the rdma-vm guest (tests/rdma-vm/vm.sh)
# and runs tests/rdma-vm/cluster.sh there: a 3-replica flowkv cluster of
# each protocol with `fabric = verbs` across the two rxe hosts, driven by
# every CLI command, YCSB-B and the linearizability workload with the
# leader killed and restarted from disk, a wrong token refused, and each
# replica's verbs counters checked. Each check made inside the guest is
# one check here; a VM that does not boot or gives no result is a failure,
# never a skip.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
. "$here/../rdma-vm/host-lib.sh"
repo=$(cd "$here/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac

for p in bin/flowkv-server bin/flowkv bin/flowkv-ycsb tests-aux/kv_check tests-aux/kv_history; do
    if [ ! -x "$build/$p" ]; then
        t_fail "$p built" "$build/$p is missing (make all tests)"
        t_done
    fi
done
# Outside the VM (no RDMA device on these machines; with one, the replica
# must serve on it instead): a replica whose cluster file says verbs
# fails at start and names the reason; one that says auto serves on tcp.
host_checks() {
    local w p out rc
    w=$(mktemp -d /tmp/fkverbs-host.XXXXXX)
    p=$(fk_base_port)
    fk_local_conf "$w/cluster.conf" multipaxos async "$p"
    sed -i 's/^fabric = tcp$/fabric = verbs/' "$w/cluster.conf"
    out=$(timeout 20 "$build/bin/flowkv-server" -c "$w/cluster.conf" -i 0 --new-cluster 2>&1)
    rc=$?
    if ibv_devices 2>/dev/null | awk 'NR > 2' | grep -q .; then
        [ $rc -eq 124 ] && grep -q 'serving (multipaxos, verbs fabric' <<<"$out" &&
            t_ok "this host has an RDMA device: a replica with fabric = verbs serves on it" ||
            t_fail "fabric = verbs on this host's RDMA device" "exit $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
    elif [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'fabric verbs: no RDMA device found' <<<"$out" &&
        grep -q 'cannot listen on .* or open its flows: no usable device' <<<"$out"; then
        t_ok "no RDMA device here: a replica with fabric = verbs fails at start with the reason (exit $rc)"
    else
        t_fail "fabric = verbs without an RDMA device fails at start with the reason" \
            "exit $rc: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
    fi
    sed -i 's/^fabric = verbs$/fabric = auto/' "$w/cluster.conf"
    out=$(timeout 3 "$build/bin/flowkv-server" -c "$w/cluster.conf" -i 0 --new-cluster 2>&1)
    if grep -q 'fabric: auto chose \(tcp\|verbs\) (' <<<"$out" && grep -q 'serving (multipaxos, \(tcp\|verbs\) fabric' <<<"$out"; then
        t_ok "fabric = auto: $(grep -o 'auto chose [a-z]* ([^)]*)' <<<"$out" | head -n 1)"
    else
        t_fail "fabric = auto picks a fabric and says why" "$(tail -n 3 <<<"$out" | tr '\n' ' ')"
    fi
    rm -rf "$w"
}
host_checks
rdma_vm_checks "verbs cluster" "${RDMA_CLUSTER_SECS:-660}" "$repo/tests/rdma-vm/cluster.sh" "$build"
t_done
