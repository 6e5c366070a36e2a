#!/usr/bin/env bash
# tests/rdma-vm/checks.sh: the checks tests/integration/test_rdma_vm.sh runs
# inside the VM (vm.sh run). Proves the Soft-RoCE pair works: both devices
# exist and are active, and RDMA WRITE, READ and FETCH_AND_ADD complete
# between rxe0 and rxe1 with the packets crossing the veth wire.
#
#   checks.sh MCAST_PROBE      MCAST_PROBE: the built rdma_mcast_probe
#                              (UD multicast check; see MULTICAST.md)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
probe=${1:?usage: checks.sh MCAST_PROBE}
iters=200

# tx_packets IF: packets IF has sent so far.
tx_packets() {
    cat "/sys/class/net/$1/statistics/tx_packets"
}

# lat_check NAME TOOL ARG...: runs TOOL through pair.sh; passes when both
# sides succeed and the client printed its result row for $iters iterations.
# Under TCG perftest's clock calibration sometimes fails ("Correlation
# coefficient r^2 < 0.9") and the row reads "inf": the operations completed,
# only the conversion to microseconds is missing, so that row still counts.
lat_check() {
    local name=$1 out row
    shift
    if ! out=$("$here/pair.sh" "$@" -n "$iters" 2>&1); then
        echo "$out" | sed 's/^/# /'
        t_fail "$name" "$(tail -n 4 <<<"$out" | tr '\n' ' ')"
        return
    fi
    row=$(grep -m 1 -E "^ *[0-9]+ +$iters +([0-9.]+|inf) " <<<"$out")
    if [ -z "$row" ]; then
        echo "$out" | sed 's/^/# /'
        t_fail "$name" "no result row for $iters iterations in the client's output"
    else
        t_ok "$name ($(awk '{ print "typical " $5 " us" }' <<<"$row"))"
    fi
}

devs=$(ibv_devices 2>&1)
if grep -qw "$RDMA_DEV_A" <<<"$devs" && grep -qw "$RDMA_DEV_B" <<<"$devs"; then
    t_ok "ibv_devices lists $RDMA_DEV_A and $RDMA_DEV_B"
else
    t_fail "ibv_devices lists $RDMA_DEV_A and $RDMA_DEV_B" "got: $(tr '\n' ' ' <<<"$devs")"
fi
for d in "$RDMA_DEV_A" "$RDMA_DEV_B"; do
    info=$(ibv_devinfo -d "$d" 2>&1)
    if grep -q 'state:.*PORT_ACTIVE' <<<"$info" && grep -q 'link_layer:.*Ethernet' <<<"$info"; then
        t_ok "$d port active, link layer Ethernet (RoCE)"
    else
        t_fail "$d port active, link layer Ethernet (RoCE)" "$(tr '\n' ' ' <<<"$info")"
    fi
done

before=$(tx_packets "$RDMA_IF_A")
lat_check "ib_write_lat $RDMA_DEV_A -> $RDMA_DEV_B" ib_write_lat
sent=$(($(tx_packets "$RDMA_IF_A") - before))
# Each RDMA WRITE of the ping-pong leaves A as at least one packet; fewer
# means the traffic took a shortcut (rxe loopback) instead of the wire.
if [ "$sent" -ge "$iters" ]; then
    t_ok "RoCE packets crossed the veth wire ($sent sent by $RDMA_IF_A)"
else
    t_fail "RoCE packets crossed the veth wire" "$RDMA_IF_A sent $sent packets for $iters writes"
fi
lat_check "ib_read_lat $RDMA_DEV_A -> $RDMA_DEV_B" ib_read_lat
lat_check "ib_atomic_lat FETCH_AND_ADD $RDMA_DEV_A -> $RDMA_DEV_B" ib_atomic_lat -A FETCH_AND_ADD

if out=$("$here/mcast.sh" "$probe" 2>&1); then
    t_ok "UD multicast $RDMA_DEV_A -> $RDMA_DEV_B via rdma_join_multicast ($(tail -n 1 <<<"$out"))"
else
    echo "$out"
    t_fail "UD multicast $RDMA_DEV_A -> $RDMA_DEV_B via rdma_join_multicast" \
        "$(grep -m 1 'mcast.sh: ' <<<"$out")"
fi
t_done
