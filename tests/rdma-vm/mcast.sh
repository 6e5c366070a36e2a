#!/usr/bin/env bash
# tests/rdma-vm/mcast.sh: UD multicast from host A (rxe0) to host B (rxe1)
# through rdma_join_multicast, inside the VM. Host B's probe joins GROUP and
# posts receives; then host A's probe joins and sends COUNT datagrams.
#
#   mcast.sh PROBE [GROUP] [COUNT]     PROBE: build/tests-aux/rdma_mcast_probe
#
# Exits 0 when B received all COUNT datagrams in order; otherwise prints
# what the kernel shows (group memberships, counters, kernel log) for
# MULTICAST.md. Last line on success: "COUNT/COUNT datagrams, N packets
# sent by vethA" (the datagrams crossed the wire, not a shortcut).
set -u
probe=${1:?usage: mcast.sh PROBE [GROUP] [COUNT]}
group=${2:-239.7.7.7}
count=${3:-10}
[ "${RDMA_VM:-0}" = 1 ] || { echo "mcast.sh: runs only inside the VM (vm.sh run)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tx_before=$(cat "/sys/class/net/$RDMA_IF_A/statistics/tx_packets")
"$probe" recv "$RDMA_IP_B" "$group" "$count" 20000 >"$tmp/recv" 2>&1 &
rpid=$!
for _ in $(seq 1 100); do
    grep -q '^ready$' "$tmp/recv" && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
done
"$probe" send "$RDMA_IP_A" "$group" "$count" 15000 >"$tmp/send" 2>&1
src=$?
rrc=0
# The receiver's own 20 s deadline bounds this wait.
wait "$rpid" || rrc=$?
tx=$(($(cat "/sys/class/net/$RDMA_IF_A/statistics/tx_packets") - tx_before))
sed 's/^/send| /' "$tmp/send"
sed 's/^/recv| /' "$tmp/recv"
if [ "$src" -ne 0 ] || [ "$rrc" -ne 0 ]; then
    echo "mcast.sh: failed: sender status $src, receiver status $rrc"
    echo "--- /proc/net/igmp"
    cat /proc/net/igmp
    echo "--- ip maddr"
    ip maddr show dev "$RDMA_IF_A"
    ip maddr show dev "$RDMA_IF_B"
    echo "--- counters"
    ip -s link show "$RDMA_IF_A"
    ip -s link show "$RDMA_IF_B"
    grep -E '^(Ip|Udp):' /proc/net/snmp
    grep -E '^IpExt:' /proc/net/netstat
    echo "--- kernel log"
    dmesg | tail -n 15
    exit 1
fi
# Each datagram leaves A as one packet on the wire (plus IGMP reports).
if [ "$tx" -lt "$count" ]; then
    echo "mcast.sh: $RDMA_IF_A sent only $tx packets for $count datagrams"
    exit 1
fi
echo "$count/$count datagrams, $tx packets sent by $RDMA_IF_A"
