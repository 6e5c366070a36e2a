# shellcheck shell=bash
# tests/rdma-vm/guest-lib.sh: for scripts that run inside the rdma-vm
# guest (vm.sh run). Source it, then call rdma_guest_setup once.
#
# rdma_guest_setup: the guest tweaks every verbs program here needs, made
# here and nowhere else:
#   - The veth MTU is raised to 9000 so rxe's active MTU is 4096 and a UD
#     datagram can carry FAB_DGRAM_MAX bytes (with 1500 it is 1024).
#   - Rules at preference 5 send traffic from a host's address to itself
#     through the local table. guest.sh's preference-10 rules send every
#     lookup with oif vethA across the wire, which for a destination that
#     is the device's own address lands on the other rxe device and is
#     dropped; with these rules rdma_cm resolves the own MAC and rxe loops
#     the packets back (rxe_net.c, the loopback mask). Cross-host traffic
#     is untouched.
rdma_guest_setup() {
    ip link set "$RDMA_IF_A" mtu 9000 && ip link set "$RDMA_IF_B" mtu 9000 &&
        ip rule add pref 5 from "$RDMA_IP_A" to "$RDMA_IP_A" lookup local &&
        ip rule add pref 5 from "$RDMA_IP_B" to "$RDMA_IP_B" lookup local
}
