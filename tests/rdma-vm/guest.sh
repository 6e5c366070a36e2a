#!/bin/bash
# tests/rdma-vm/guest.sh: runs inside the guest, chrooted into the host's
# root (see init). Builds the two RoCE "hosts", then runs $flowkv_out/cmd.sh
# (written by vm.sh run) with the RDMA_* environment documented in vm.sh,
# and writes its exit status to $flowkv_out/rc. Its output goes to the
# console and to $flowkv_out/output.log.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LC_ALL=C
# Set by the kernel from its command line (vm.sh boot).
out=${flowkv_out:?} repo=${flowkv_repo:?}

export RDMA_VM=1 RDMA_OUT=$out RDMA_REPO=$repo
export RDMA_IF_A=vethA RDMA_IP_A=10.77.0.1 RDMA_DEV_A=rxe0
export RDMA_IF_B=vethB RDMA_IP_B=10.77.0.2 RDMA_DEV_B=rxe1
RDMA_NET=10.77.0.0/24

# gid_index DEV IP: prints the index of DEV's RoCE v2 GID that carries IPv4
# address IP (::ffff:a.b.c.d), waiting up to 10 s for the kernel to add it.
gid_index() {
    local dev=$1 ip=$2 want g i
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${ip//./ }) # split on dots
    for _ in $(seq 1 100); do
        for g in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
            i=${g##*/}
            if [ "$(cat "$g" 2>/dev/null)" = "$want" ] &&
                [ "$(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ]; then
                echo "$i"
                return 0
            fi
        done
        sleep 0.1
    done
    return 1
}

# step CMD...: runs one setup command; says which one failed.
step() {
    "$@" || { echo "guest: setup step failed: $*"; return 1; }
}

# sysctl_set KEY VALUE
sysctl_set() {
    echo "$2" >"/proc/sys/${1//.//}" || { echo "guest: cannot set $1"; return 1; }
}

# setup: the veth "wire", addresses, policy routing, one rxe per end.
#
# Both ends live in the root network namespace. Kernels 6.1 and 6.12 (all
# Debian ships) route rxe's packets and receive on its UDP port 4791 only in
# init_net (rxe_net.c: ip_route_output_key(&init_net, ...) and one tunnel
# socket made in init_net), so an rxe device on a netdev inside another
# namespace sends nothing (see MULTICAST.md, "Why no namespaces").
#
# Two local addresses would normally reach each other through lo, which rxe
# cannot receive on. The rules below make every lookup that leaves through
# vethA (rxe sets the flow's oif to its netdev; so does the GID resolution)
# or that comes from one end's address to the other use the wire, while
# packets arriving on a veth still meet the local table (moved from
# preference 0 to 100) and are delivered. accept_local lets an end accept a
# packet whose source is the other end's (also local) address.
setup() {
    local a=$RDMA_IF_A b=$RDMA_IF_B
    step ip link set lo up &&
        step ip link add "$a" type veth peer name "$b" &&
        step ip addr add "$RDMA_IP_A/24" dev "$a" &&
        step ip addr add "$RDMA_IP_B/24" dev "$b" &&
        for k in all default "$a" "$b"; do
            sysctl_set "net.ipv4.conf.$k.rp_filter" 0 &&
                sysctl_set "net.ipv4.conf.$k.accept_local" 1 || return 1
        done &&
        step ip link set "$a" up &&
        step ip link set "$b" up &&
        step ip rule add pref 100 lookup local &&
        step ip rule del pref 0 lookup local &&
        step ip rule add pref 10 iif lo oif "$a" lookup 101 &&
        step ip rule add pref 10 iif lo oif "$b" lookup 102 &&
        step ip rule add pref 11 iif lo from "$RDMA_IP_A" to "$RDMA_IP_B" lookup 101 &&
        step ip rule add pref 11 iif lo from "$RDMA_IP_B" to "$RDMA_IP_A" lookup 102 &&
        step ip route add "$RDMA_NET" dev "$a" src "$RDMA_IP_A" table 101 &&
        step ip route add "$RDMA_NET" dev "$b" src "$RDMA_IP_B" table 102 &&
        step rdma link add "$RDMA_DEV_A" type rxe netdev "$a" &&
        step rdma link add "$RDMA_DEV_B" type rxe netdev "$b" &&
        RDMA_GID_A=$(step gid_index "$RDMA_DEV_A" "$RDMA_IP_A") &&
        RDMA_GID_B=$(step gid_index "$RDMA_DEV_B" "$RDMA_IP_B")
}

echo "guest: kernel $(uname -r), $(nproc) cpus"
if ! setup >"$out/setup.log" 2>&1; then
    { cat "$out/setup.log"; echo "guest: setup of the veth wire and rxe devices failed"; } |
        tee "$out/output.log"
    echo 126 >"$out/rc"
    exit 126
fi
export RDMA_GID_A RDMA_GID_B
echo "guest: $RDMA_DEV_A on $RDMA_IF_A $RDMA_IP_A gid $RDMA_GID_A," \
    "$RDMA_DEV_B on $RDMA_IF_B $RDMA_IP_B gid $RDMA_GID_B"

cd "$RDMA_REPO" || exit 126
if [ "${flowkv_shell:-0}" = 1 ]; then
    echo "guest: interactive shell; 'exit' powers the VM off"
    setsid -c bash -i </dev/ttyS0 >/dev/ttyS0 2>&1
    exit 0
fi

# The command is bounded inside the guest too, so a hung command still
# produces output and a status (124) before the host's backstop kills qemu.
# Its output goes straight to the result share (the host sees it as it is
# written), not through a pipe: a process the command leaves behind could
# hold a pipe open and keep us from ever writing rc. Power-off ends such
# leftovers.
timeout --kill-after=5 "${flowkv_timeout:-480}" "$out/cmd.sh" </dev/null >"$out/output.log" 2>&1
rc=$?
cat "$out/output.log"
echo "guest: command exited with status $rc"
echo "$rc" >"$out/rc"
exit 0
