#!/usr/bin/env bash
# tests/rdma-vm/netns-evidence.sh: reproduces why the two Soft-RoCE hosts
# share the root network namespace (MULTICAST.md, "Why no namespaces").
# Run it in the VM:  tests/rdma-vm/vm.sh run tests/rdma-vm/netns-evidence.sh
#
# Builds the layout first planned: namespaces nsA and nsB joined by a veth
# pair, rxe2 on the nsA end and rxe3 on the nsB end, then runs ib_write_lat
# between them and shows the counters. Exits 0 when the evidence was
# gathered (the write test is expected to fail on Debian's 6.1 kernel).
set -u
[ "${RDMA_VM:-0}" = 1 ] || { echo "netns-evidence.sh: runs only inside the VM" >&2; exit 2; }
show() {
    echo "\$ $*"
    "$@" 2>&1
}

show ip netns add nsA
show ip netns add nsB
show ip link add nvA netns nsA type veth peer name nvB netns nsB
show ip -n nsA addr add 10.78.0.1/24 dev nvA
show ip -n nsB addr add 10.78.0.2/24 dev nvB
show ip -n nsA link set nvA up
show ip -n nsB link set nvB up
show ip netns exec nsA rdma link add rxe2 type rxe netdev nvA
show ip netns exec nsB rdma link add rxe3 type rxe netdev nvB
show rdma link
gid=$(for g in /sys/class/infiniband/rxe2/ports/1/gids/*; do
    [ "$(cat "$g")" = 0000:0000:0000:0000:0000:ffff:0a4e:0001 ] && basename "$g"
done)
echo "rxe2 IPv4 GID index: $gid"

echo "\$ ib_write_lat server on rxe3 in nsB, client on rxe2 in nsA (15 s limit)"
ip netns exec nsB timeout 15 stdbuf -oL ib_write_lat -d rxe3 -x "$gid" -n 100 -p 19100 \
    >/tmp/server 2>&1 &
spid=$!
sleep 1.5
ip netns exec nsA timeout 12 stdbuf -oL ib_write_lat -d rxe2 -x "$gid" -n 100 -p 19100 \
    10.78.0.2 >/tmp/client 2>&1
echo "client status $?"
wait "$spid"
echo "server status $?"
echo "--- client (last lines)"
tail -n 4 /tmp/client
echo "--- server (last lines)"
tail -n 4 /tmp/server
echo "--- packets on the namespaced wire: perftest's TCP exchange and ARP only; 100 RDMA WRITEs would add 100 or more"
show ip -n nsA -s link show nvA
echo "--- UDP counters in nsB, then in the root namespace"
ip netns exec nsB grep '^Udp:' /proc/net/snmp
grep '^Udp:' /proc/net/snmp
echo "--- kernel log"
dmesg | grep -iE 'rxe|infiniband' | tail -n 8
exit 0
